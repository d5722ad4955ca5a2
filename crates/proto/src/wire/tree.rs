//! The push tree's frames: session set-up (`Open`, and `Dial` ahead of it), data (`Chunk`, or a
//! chunk in verified parts: `Head` then `Part`s; `End`), `Idle` and repair `Request`s.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{put_opt_sig, put_sig, put_str, Reader};
use super::manifest::put_manifest;
use super::*;
use crate::manifest::Manifest;

/// Session set-up: what is sent, how it is cut, and the part of the tree below the recipient.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    /// Session identifier.
    pub session: SessionId,
    /// The recipient's node id.
    pub node: u32,
    /// Chunk size in bytes (the last chunk may be shorter).
    pub chunk_size: u32,
    /// A child that makes no progress for this long is cut off (milliseconds).
    pub stall_timeout_ms: u32,
    /// TCP congestion control every hop should use (`bbr`, `cubic`; empty: system default).
    pub cc: String,
    /// What is being sent.
    pub manifest: Manifest,
    /// The recipient's subtree: the recipient first, then every descendant.
    pub members: Vec<Member>,
    /// For one tree of a balanced multi-tree send: which stripe of which object this session
    /// carries (see [`crate::stripe`]); `manifest` then describes the stripe alone.
    pub stripe: Option<Box<StripeInfo>>,
    /// How every edge of the session is carried (the source's choice, like `cc`).
    pub edges: EdgeMode,
    /// The source's signature of the session, chunk size, manifest and stripe, with host keys
    /// (see [`crate::auth::Keys::sign_open`]): relays pass it on unchanged.
    pub sig: Option<Box<SourceSig>>,
}

/// The stripe a session of a balanced send carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeInfo {
    /// Identifies the object across the stripe sessions.
    pub group: SessionId,
    /// This session's tree.
    pub tree: u16,
    /// The dealing pattern (tree per position).
    pub pattern: Vec<u16>,
    /// The whole object.
    pub object: Manifest,
}

/// One node of a subtree in an [`Open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub node: u32,
    /// Parent's node id.
    pub parent: u32,
    /// Display name.
    pub name: String,
    /// Agent address (`host:port`); further addresses of the same agent (network paths, for
    /// edges over several connections) follow, separated by spaces.
    pub addr: String,
    /// The member's access uplink in kbit/s as the hosts file declares it; 0: not known. A
    /// relay paces what it sends below it (see `bulkcast_runtime::driver::RELAY_UPLINK_SHARE`).
    pub uplink_kbps: u32,
}

/// One chunk: its position, content hash, authentication tag and bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Chunk index; the chunk starts at `index * chunk_size`.
    pub index: u64,
    /// BLAKE3 hash of `data`.
    pub hash: [u8; 32],
    /// MAC over the session, index, length and hash (see [`crate::auth`]).
    pub tag: [u8; 32],
    /// The source's signature of the same, with host keys (see [`crate::auth`]).
    pub sig: Option<Box<SourceSig>>,
    /// The bytes.
    pub data: Bytes,
}

/// The header of a chunk sent in parts: what [`Chunk`] carries but the bytes, plus the
/// chaining values that let each 16 KiB group be checked on its own ([`crate::groups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Chunk index.
    pub index: u64,
    /// Chunk length in bytes.
    pub len: u32,
    /// BLAKE3 hash of the chunk's bytes.
    pub hash: [u8; 32],
    /// MAC over the session, index, length and hash, as [`Chunk::tag`].
    pub tag: [u8; 32],
    /// The source's signature, as [`Chunk::sig`].
    pub sig: Option<Box<SourceSig>>,
    /// The chaining value of every group ([`crate::groups::chaining_values`]; empty for a chunk
    /// of one group).
    pub cvs: Vec<[u8; 32]>,
}

/// Bytes `offset..offset + data.len()` of the chunk a [`Head`] announced: whole groups, the
/// last one of the chunk possibly shorter. Parts of one chunk arrive in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Chunk index.
    pub index: u64,
    /// Offset in the chunk, a multiple of [`crate::groups::GROUP`].
    pub offset: u32,
    /// The bytes.
    pub data: Bytes,
}

/// A source's ed25519 signature (of a chunk, a set-up or an end), and the key that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceSig {
    /// The source's public key.
    pub key: [u8; 32],
    /// The signature.
    pub sig: [u8; 64],
}

/// End of the object, authenticated so that a truncated stream is never taken as complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    /// Number of chunks.
    pub chunks: u64,
    /// Total length in bytes.
    pub total_len: u64,
    /// MAC over the session, chunk count and length.
    pub tag: [u8; 32],
    /// The source's signature of the same, with host keys (see [`crate::auth`]).
    pub sig: Option<SourceSig>,
}

/// Encodes a tree frame's type and body into `b`; returns a chunk's data, if any.
pub(super) fn encode(f: &Frame, b: &mut BytesMut) -> Bytes {
    let mut data = Bytes::new();
    match f {
        Frame::Open(o) => {
            b.put_u8(T_OPEN);
            put_open(b, o);
        }
        Frame::Chunk(c) => {
            b.put_u8(if c.sig.is_some() {
                T_CHUNK_SIGNED
            } else {
                T_CHUNK
            });
            b.put_u64(c.index);
            b.put_slice(&c.hash);
            b.put_slice(&c.tag);
            if let Some(s) = &c.sig {
                b.put_slice(&s.key);
                b.put_slice(&s.sig);
            }
            data = c.data.clone();
        }
        Frame::Head(h) => put_head(b, h),
        Frame::Part(p) => {
            b.put_u8(T_PART);
            b.put_u64(p.index);
            b.put_u32(p.offset);
            data = p.data.clone();
        }
        Frame::End(e) => {
            b.put_u8(if e.sig.is_some() { T_END_SIGNED } else { T_END });
            b.put_u64(e.chunks);
            b.put_u64(e.total_len);
            b.put_slice(&e.tag);
            put_sig(b, e.sig.as_ref());
        }
        Frame::Idle => b.put_u8(T_IDLE),
        Frame::Request { index } => {
            b.put_u8(T_REQUEST);
            b.put_u64(*index);
        }
        Frame::Dial { session, addrs } => {
            b.put_u8(T_DIAL);
            b.put_u64(*session);
            b.put_u32(addrs.len() as u32);
            for a in addrs {
                put_str(b, a);
            }
        }
        other => unreachable!("{} is not a tree frame", other.kind()),
    }
    data
}

/// Decodes the body of a tree frame of type `ty`.
pub(super) fn decode(ty: u8, r: &mut Reader) -> Result<Frame, WireError> {
    Ok(match ty {
        T_OPEN => {
            r.what = "Open";
            Frame::Open(r.open()?)
        }
        T_CHUNK | T_CHUNK_SIGNED => {
            r.what = "Chunk";
            let index = r.u64()?;
            let hash = r.array()?;
            let tag = r.array()?;
            let sig = match ty {
                T_CHUNK_SIGNED => Some(Box::new(SourceSig {
                    key: r.array()?,
                    sig: r.array()?,
                })),
                _ => None,
            };
            let data = std::mem::take(&mut r.b);
            return Ok(Frame::Chunk(Chunk {
                index,
                hash,
                tag,
                sig,
                data,
            }));
        }
        T_HEAD => {
            r.what = "Head";
            Frame::Head(r.head()?)
        }
        T_PART => {
            r.what = "Part";
            let index = r.u64()?;
            let offset = r.u32()?;
            let data = std::mem::take(&mut r.b);
            return Ok(Frame::Part(Part {
                index,
                offset,
                data,
            }));
        }
        T_END | T_END_SIGNED => {
            r.what = "End";
            Frame::End(End {
                chunks: r.u64()?,
                total_len: r.u64()?,
                tag: r.array()?,
                sig: match ty {
                    T_END_SIGNED => Some(r.sig()?),
                    _ => None,
                },
            })
        }
        T_IDLE => Frame::Idle,
        T_REQUEST => {
            r.what = "Request";
            Frame::Request { index: r.u64()? }
        }
        T_DIAL => {
            r.what = "Dial";
            let session = r.u64()?;
            let n = r.count(4)?;
            let mut addrs = Vec::with_capacity(n);
            for _ in 0..n {
                addrs.push(r.string()?);
            }
            Frame::Dial { session, addrs }
        }
        other => return Err(WireError::UnknownType(other)),
    })
}

fn put_head(b: &mut BytesMut, h: &Head) {
    b.put_u8(T_HEAD);
    b.put_u64(h.index);
    b.put_u32(h.len);
    b.put_slice(&h.hash);
    b.put_slice(&h.tag);
    match &h.sig {
        Some(s) => {
            b.put_u8(1);
            b.put_slice(&s.key);
            b.put_slice(&s.sig);
        }
        None => b.put_u8(0),
    }
    b.put_u32(h.cvs.len() as u32);
    for cv in &h.cvs {
        b.put_slice(cv);
    }
}

fn put_open(b: &mut BytesMut, o: &Open) {
    b.put_u64(o.session);
    b.put_u32(o.node);
    b.put_u32(o.chunk_size);
    b.put_u32(o.stall_timeout_ms);
    put_str(b, &o.cc);
    put_manifest(b, &o.manifest);
    b.put_u32(o.members.len() as u32);
    for mb in &o.members {
        b.put_u32(mb.node);
        b.put_u32(mb.parent);
        put_str(b, &mb.name);
        put_str(b, &mb.addr);
        b.put_u32(mb.uplink_kbps);
    }
    match &o.stripe {
        None => b.put_u8(0),
        Some(st) => {
            b.put_u8(1);
            b.put_u64(st.group);
            b.put_u16(st.tree);
            b.put_u32(st.pattern.len() as u32);
            for t in &st.pattern {
                b.put_u16(*t);
            }
            put_manifest(b, &st.object);
        }
    }
    b.put_u16(o.edges.streams);
    b.put_u8(match o.edges.scheduler {
        EdgeScheduler::Pull => 0,
        EdgeScheduler::Weighted => 1,
        EdgeScheduler::Equal => 2,
    });
    put_opt_sig(b, o.sig.as_deref());
}

impl Reader {
    fn head(&mut self) -> Result<Head, WireError> {
        let index = self.u64()?;
        let len = self.u32()?;
        let hash = self.array()?;
        let tag = self.array()?;
        let sig = match self.u8()? {
            0 => None,
            _ => Some(Box::new(SourceSig {
                key: self.array()?,
                sig: self.array()?,
            })),
        };
        let n = self.count(32)?;
        let cvs = (0..n).map(|_| self.array()).collect::<Result<_, _>>()?;
        Ok(Head {
            index,
            len,
            hash,
            tag,
            sig,
            cvs,
        })
    }
    fn open(&mut self) -> Result<Open, WireError> {
        let session = self.u64()?;
        let node = self.u32()?;
        let chunk_size = self.u32()?;
        let stall_timeout_ms = self.u32()?;
        let cc = self.string()?;
        let manifest = self.manifest()?;
        let n = self.count(4 + 4 + 4 + 4 + 4)?;
        let mut members = Vec::with_capacity(n);
        for _ in 0..n {
            members.push(Member {
                node: self.u32()?,
                parent: self.u32()?,
                name: self.string()?,
                addr: self.string()?,
                uplink_kbps: self.u32()?,
            });
        }
        let stripe = match self.u8()? {
            0 => None,
            1 => {
                let group = self.u64()?;
                let tree = self.u16()?;
                let n = self.count(2)?;
                let mut pattern = Vec::with_capacity(n);
                for _ in 0..n {
                    pattern.push(self.u16()?);
                }
                Some(Box::new(StripeInfo {
                    group,
                    tree,
                    pattern,
                    object: self.manifest()?,
                }))
            }
            _ => return Err(WireError::BadValue("Open", "bad stripe flag")),
        };
        let edges = EdgeMode {
            streams: self.u16()?,
            scheduler: match self.u8()? {
                0 => EdgeScheduler::Pull,
                1 => EdgeScheduler::Weighted,
                2 => EdgeScheduler::Equal,
                _ => return Err(WireError::BadValue("Open", "unknown edge scheduler")),
            },
        };
        Ok(Open {
            session,
            node,
            chunk_size,
            stall_timeout_ms,
            cc,
            manifest,
            members,
            stripe,
            edges,
            sig: self.opt_sig()?,
        })
    }
}
