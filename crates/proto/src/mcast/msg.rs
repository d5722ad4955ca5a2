//! Control messages (inside a [`crate::wire::Frame::Mcast`] on the TCP connection from the
//! source to each receiver) and the multicast datagram header.
//!
//! ```text
//! msg    = sub:u8 | body
//! Open   = 0x01 | session:u64 | group | name | size:u64 | mode:u32 | symbol:u32 | k:u32
//!               | m:u32 | renak_ms:u32 | sealed:u8 | key[32] (sealed only) | mtime
//! Ready  = 0x02 | joined:u8 | reason
//! Heard  = 0x03
//! Hashes = 0x04 | first:u32 | count:u32 | hash[32]*
//! Nak    = 0x05 | count:u32 | (block:u32 | seen:u32 | need:u32)*
//! End    = 0x06 | blocks:u32
//! Done   = 0x07 | ok:u8 | reason | datagrams:u64 | decoded:u64
//! Cancel = 0x08 | reason
//! Train  = 0x09 | received:u32 | first:u32 | last:u32 | span:u64
//! Holds  = 0x0a | complete:u8 | bytes:u64
//! mtime  = 0:u8 | 1:u8 secs:i64 nanos:u32
//! string = len:u16 | utf-8
//!
//! datagram = "M3" | session:u32 | kind:u8 (0 data, 1 end, 2 hello) | block:u32
//!            | index:u32 | number:u48 | symbol bytes (data only) | tag[16] (sealed only)
//! ```
//!
//! The header is as short as it can be, because every byte of it is paid in every datagram:
//! 21 bytes (29 before protocol 3) leave 1434 symbol bytes of a sealed 1500-byte frame, 0.947
//! of the wire. `session` is the session id's low 32 bits ([`session_tag`]): it keeps a
//! receiver off another session's datagrams on a shared group, and a stray one that matched
//! would still fail its tag (sealed) or its block's hash (plaintext). 48 bits of datagram
//! number last 8 years at a million datagrams a second, far beyond one send.
//!
//! A sealed session's datagrams are AES-256-GCM under the `Open`'s group key, the header
//! their associated data and `number` their nonce ([`super::seal`]).

use bytes::{Buf, BufMut, Bytes};

use super::seal::{GroupKey, KEY_BYTES};
use super::train::TrainReport;
use crate::manifest::{Manifest, Mtime, ObjectKind};
use crate::wire::WireError;

/// The set-up of a multicast send, source to receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McastOpen {
    /// Session id (every datagram carries it).
    pub session: u64,
    /// The group, `ADDR:PORT`.
    pub group: String,
    /// The file's name at the receiver (one path component).
    pub name: String,
    /// File size.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Bytes per symbol.
    pub symbol: u32,
    /// Source symbols per block.
    pub k: u32,
    /// Most parity symbols per block.
    pub m: u32,
    /// Milliseconds between repeated requests for a block without progress.
    pub renak_ms: u32,
    /// The group key the datagrams are sealed under; `None`: in clear (both ends chose
    /// `--plaintext`).
    pub key: Option<GroupKey>,
    /// The file's modification time: with the name, size and mode, the object's identity
    /// ([`McastOpen::manifest`]).
    pub mtime: Option<Mtime>,
}

impl McastOpen {
    /// The manifest of the file, as the tree would send it: a receiver finds what it holds
    /// of the object by it, whichever strategy wrote that.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            name: self.name.clone(),
            kind: ObjectKind::File,
            total_len: Some(self.size),
            entries: Vec::new(),
            mode: self.mode,
            mtime: self.mtime,
        }
    }
}

/// One block's repair request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nak {
    /// The block.
    pub block: u32,
    /// One past the highest symbol index the receiver has seen of it.
    pub seen: u32,
    /// Symbols it still needs.
    pub need: u32,
}

/// A control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McastMsg {
    /// Source to receiver: join the group and take this file.
    Open(Box<McastOpen>),
    /// Receiver to source: joined the group, or could not (and why).
    Ready {
        /// Joined.
        joined: bool,
        /// Why not.
        reason: String,
    },
    /// Receiver to source: a datagram of the group arrived (multicast works here).
    Heard,
    /// Source to receiver: BLAKE3 hashes of blocks `first..first + hashes.len()`.
    Hashes {
        /// First block.
        first: u32,
        /// Their hashes.
        hashes: Vec<[u8; 32]>,
    },
    /// Receiver to source: blocks that need more symbols.
    Nak(Vec<Nak>),
    /// Source to receiver: the first pass is over (`blocks` in all).
    End {
        /// Blocks in the file.
        blocks: u32,
    },
    /// Receiver to source: the copy is in place (or failed, and why).
    Done {
        /// Verified and in place.
        ok: bool,
        /// Why not.
        reason: String,
        /// Datagrams taken.
        datagrams: u64,
        /// Blocks rebuilt with parity.
        decoded: u64,
    },
    /// Source to receiver: the send goes on without this receiver's multicast (it heard
    /// nothing, or the send was stopped).
    Cancel {
        /// Why.
        reason: String,
    },
    /// Receiver to source: how fast the first pass's first symbols arrived.
    Train(TrainReport),
    /// Receiver to source, instead of `Ready`: it holds the object already, whole or in
    /// part; it takes what it lacks by the tree, which moves only that.
    Holds {
        /// An identical copy is in place.
        complete: bool,
        /// Verified bytes of it held.
        bytes: u64,
    },
}

const WHAT: &str = "Mcast";
/// Most entries in one `Nak` or `Hashes`.
pub const MAX_LIST: u32 = 1 << 16;

impl McastMsg {
    /// Appends the message (sub-type and body) to a frame under construction.
    pub fn encode<B: BufMut>(&self, b: &mut B) {
        match self {
            McastMsg::Open(o) => {
                b.put_u8(1);
                b.put_u64(o.session);
                put_str(b, &o.group);
                put_str(b, &o.name);
                b.put_u64(o.size);
                for v in [o.mode, o.symbol, o.k, o.m, o.renak_ms] {
                    b.put_u32(v);
                }
                match &o.key {
                    Some(k) => {
                        b.put_u8(1);
                        b.put_slice(k.bytes());
                    }
                    None => b.put_u8(0),
                }
                match o.mtime {
                    Some(t) => {
                        b.put_u8(1);
                        b.put_i64(t.secs);
                        b.put_u32(t.nanos);
                    }
                    None => b.put_u8(0),
                }
            }
            McastMsg::Ready { joined, reason } => {
                b.put_u8(2);
                b.put_u8(u8::from(*joined));
                put_str(b, reason);
            }
            McastMsg::Heard => b.put_u8(3),
            McastMsg::Hashes { first, hashes } => {
                b.put_u8(4);
                b.put_u32(*first);
                b.put_u32(hashes.len() as u32);
                hashes.iter().for_each(|h| b.put_slice(h));
            }
            McastMsg::Nak(list) => {
                b.put_u8(5);
                b.put_u32(list.len() as u32);
                for n in list {
                    b.put_u32(n.block);
                    b.put_u32(n.seen);
                    b.put_u32(n.need);
                }
            }
            McastMsg::End { blocks } => {
                b.put_u8(6);
                b.put_u32(*blocks);
            }
            McastMsg::Done {
                ok,
                reason,
                datagrams,
                decoded,
            } => {
                b.put_u8(7);
                b.put_u8(u8::from(*ok));
                put_str(b, reason);
                b.put_u64(*datagrams);
                b.put_u64(*decoded);
            }
            McastMsg::Cancel { reason } => {
                b.put_u8(8);
                put_str(b, reason);
            }
            McastMsg::Train(r) => {
                b.put_u8(9);
                b.put_u32(r.received);
                b.put_u32(r.first);
                b.put_u32(r.last);
                b.put_u64(r.span);
            }
            McastMsg::Holds { complete, bytes } => {
                b.put_u8(10);
                b.put_u8(u8::from(*complete));
                b.put_u64(*bytes);
            }
        }
    }

    /// Decodes a message from the rest of a frame body, consuming what it reads.
    pub fn decode(b: &mut Bytes) -> Result<McastMsg, WireError> {
        Ok(match get_u8(b)? {
            1 => {
                let session = get_u64(b)?;
                let group = get_str(b)?;
                let name = get_str(b)?;
                let size = get_u64(b)?;
                let mut v = [0u32; 5];
                for x in &mut v {
                    *x = get_u32(b)?;
                }
                let key = match get_u8(b)? {
                    0 => None,
                    1 => {
                        need(b, KEY_BYTES)?;
                        let mut k = [0u8; KEY_BYTES];
                        b.copy_to_slice(&mut k);
                        Some(GroupKey::from_bytes(k))
                    }
                    _ => return Err(WireError::BadValue(WHAT, "bad group key flag")),
                };
                let mtime = match get_u8(b)? {
                    0 => None,
                    1 => {
                        let secs = get_u64(b)? as i64;
                        let nanos = get_u32(b)?;
                        if nanos >= 1_000_000_000 {
                            return Err(WireError::BadValue(WHAT, "mtime nanoseconds"));
                        }
                        Some(Mtime { secs, nanos })
                    }
                    _ => return Err(WireError::BadValue(WHAT, "bad mtime flag")),
                };
                McastMsg::Open(Box::new(McastOpen {
                    session,
                    group,
                    name,
                    size,
                    mode: v[0],
                    symbol: v[1],
                    k: v[2],
                    m: v[3],
                    renak_ms: v[4],
                    key,
                    mtime,
                }))
            }
            2 => McastMsg::Ready {
                joined: get_u8(b)? != 0,
                reason: get_str(b)?,
            },
            3 => McastMsg::Heard,
            4 => {
                let first = get_u32(b)?;
                let n = count(b, 32)?;
                let mut hashes = Vec::with_capacity(n);
                for _ in 0..n {
                    let mut h = [0u8; 32];
                    b.copy_to_slice(&mut h);
                    hashes.push(h);
                }
                McastMsg::Hashes { first, hashes }
            }
            5 => {
                let n = count(b, 12)?;
                let list = (0..n)
                    .map(|_| Nak {
                        block: b.get_u32(),
                        seen: b.get_u32(),
                        need: b.get_u32(),
                    })
                    .collect();
                McastMsg::Nak(list)
            }
            6 => McastMsg::End {
                blocks: get_u32(b)?,
            },
            7 => McastMsg::Done {
                ok: get_u8(b)? != 0,
                reason: get_str(b)?,
                datagrams: get_u64(b)?,
                decoded: get_u64(b)?,
            },
            8 => McastMsg::Cancel {
                reason: get_str(b)?,
            },
            9 => McastMsg::Train(TrainReport {
                received: get_u32(b)?,
                first: get_u32(b)?,
                last: get_u32(b)?,
                span: get_u64(b)?,
            }),
            10 => McastMsg::Holds {
                complete: get_u8(b)? != 0,
                bytes: get_u64(b)?,
            },
            _ => return Err(WireError::BadValue(WHAT, "unknown multicast message")),
        })
    }
}

/// A list's length, checked against the limit and the bytes left (`each` bytes an entry).
fn count(b: &mut Bytes, each: usize) -> Result<usize, WireError> {
    let n = get_u32(b)?;
    if n > MAX_LIST {
        return Err(WireError::BadValue(WHAT, "list too long"));
    }
    let n = n as usize;
    if b.remaining() < n * each {
        return Err(WireError::Truncated(WHAT));
    }
    Ok(n)
}

fn need(b: &Bytes, n: usize) -> Result<(), WireError> {
    if b.remaining() < n {
        Err(WireError::Truncated(WHAT))
    } else {
        Ok(())
    }
}

fn get_u8(b: &mut Bytes) -> Result<u8, WireError> {
    need(b, 1)?;
    Ok(b.get_u8())
}

fn get_u32(b: &mut Bytes) -> Result<u32, WireError> {
    need(b, 4)?;
    Ok(b.get_u32())
}

fn get_u64(b: &mut Bytes) -> Result<u64, WireError> {
    need(b, 8)?;
    Ok(b.get_u64())
}

fn put_str<B: BufMut>(b: &mut B, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.put_u16(s.len() as u16);
    b.put_slice(s);
}

fn get_str(b: &mut Bytes) -> Result<String, WireError> {
    need(b, 2)?;
    let n = b.get_u16() as usize;
    need(b, n)?;
    String::from_utf8(b.split_to(n).to_vec())
        .map_err(|_| WireError::BadValue(WHAT, "string not UTF-8"))
}

/// Magic at the start of every datagram (3: the short header).
pub const DGRAM_MAGIC: [u8; 2] = *b"M3";
/// Bytes of a datagram's header.
pub const DGRAM_HEADER: usize = 21;
/// Datagram numbers a session may use: they travel in 48 bits.
pub const MAX_NUMBER: u64 = (1 << 48) - 1;

/// What a datagram carries of session id `session`: its low 32 bits.
pub const fn session_tag(session: u64) -> u32 {
    session as u32
}
/// Bytes of UDP payload in a 1500-byte Ethernet frame.
pub const LAN_PAYLOAD: usize = 1472;

/// Symbol bytes that fill a 1500-byte Ethernet frame with the header and, when `sealed`, the
/// tag; even (the erasure code works on pairs of bytes).
pub const fn lan_symbol(sealed: bool) -> u32 {
    ((LAN_PAYLOAD - super::seal::overhead(sealed)) & !1) as u32
}

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DgramKind {
    /// A symbol of a block.
    Data,
    /// The first pass is over (`block`: blocks in all).
    End,
    /// A probe before the data: multicast reaches this receiver.
    Hello,
}

/// A datagram's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DgramHeader {
    /// Session: the id's low 32 bits ([`session_tag`]).
    pub session: u32,
    /// What it carries.
    pub kind: DgramKind,
    /// Block (or block count for `End`).
    pub block: u32,
    /// Symbol index in the block.
    pub index: u32,
    /// The datagram's number in its session, never repeated: the nonce of a sealed one. At
    /// most [`MAX_NUMBER`].
    pub number: u64,
}

impl DgramHeader {
    /// Writes the header into the first [`DGRAM_HEADER`] bytes of `out`.
    pub fn write(&self, out: &mut [u8]) {
        debug_assert!(self.number <= MAX_NUMBER);
        out[..2].copy_from_slice(&DGRAM_MAGIC);
        out[2..6].copy_from_slice(&self.session.to_be_bytes());
        out[6] = match self.kind {
            DgramKind::Data => 0,
            DgramKind::End => 1,
            DgramKind::Hello => 2,
        };
        out[7..11].copy_from_slice(&self.block.to_be_bytes());
        out[11..15].copy_from_slice(&self.index.to_be_bytes());
        out[15..21].copy_from_slice(&self.number.to_be_bytes()[2..]);
    }

    /// Reads a header and the bytes after it (a sealed session's are the sealed body and
    /// the tag); `None` for anything that is not one of ours.
    pub fn read(d: &[u8]) -> Option<(DgramHeader, &[u8])> {
        if d.len() < DGRAM_HEADER || d[..2] != DGRAM_MAGIC {
            return None;
        }
        let kind = match d[6] {
            0 => DgramKind::Data,
            1 => DgramKind::End,
            2 => DgramKind::Hello,
            _ => return None,
        };
        let u32_at = |i: usize| u32::from_be_bytes([d[i], d[i + 1], d[i + 2], d[i + 3]]);
        let mut number = [0u8; 8];
        number[2..].copy_from_slice(&d[15..21]);
        Some((
            DgramHeader {
                session: u32_at(2),
                kind,
                block: u32_at(7),
                index: u32_at(11),
                number: u64::from_be_bytes(number),
            },
            &d[DGRAM_HEADER..],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn round(m: McastMsg) {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        let mut bytes = b.freeze();
        assert_eq!(McastMsg::decode(&mut bytes).unwrap(), m);
        assert!(bytes.is_empty());
    }

    #[test]
    fn messages_round_trip_and_bad_input_is_an_error() {
        round(McastMsg::Open(Box::new(McastOpen {
            session: 7,
            group: "239.1.2.3:7390".into(),
            name: "f.bin".into(),
            size: 1 << 33,
            mode: 0o644,
            symbol: 1450,
            k: 256,
            m: 256,
            renak_ms: 30,
            key: None,
            mtime: None,
        })));
        round(McastMsg::Open(Box::new(McastOpen {
            session: 8,
            group: "239.1.2.3:7390".into(),
            name: "g.bin".into(),
            size: 5,
            mode: 0o600,
            symbol: 1426,
            k: 4,
            m: 2,
            renak_ms: 30,
            key: Some(GroupKey::from_bytes([9; KEY_BYTES])),
            mtime: Some(Mtime {
                secs: -3,
                nanos: 999_999_999,
            }),
        })));
        // A key flag without its key, and a flag that is neither: errors.
        let mut b = BytesMut::new();
        McastMsg::Open(Box::new(McastOpen {
            session: 8,
            group: "g".into(),
            name: "n".into(),
            size: 5,
            mode: 0,
            symbol: 2,
            k: 1,
            m: 1,
            renak_ms: 1,
            key: Some(GroupKey::from_bytes([9; KEY_BYTES])),
            mtime: None,
        }))
        .encode(&mut b);
        let full = b.freeze();
        let mut cut = full.slice(..full.len() - 1);
        assert!(McastMsg::decode(&mut cut).is_err());
        // The mtime flag that is neither.
        let mut bad = full.to_vec();
        *bad.last_mut().unwrap() = 2;
        assert!(McastMsg::decode(&mut Bytes::from(bad)).is_err());
        let mut bad = full.slice(..full.len() - KEY_BYTES - 1).to_vec();
        *bad.last_mut().unwrap() = 2;
        assert!(McastMsg::decode(&mut Bytes::from(bad)).is_err());
        round(McastMsg::Ready {
            joined: false,
            reason: "no route".into(),
        });
        round(McastMsg::Heard);
        round(McastMsg::Hashes {
            first: 3,
            hashes: vec![[1; 32], [2; 32]],
        });
        round(McastMsg::Nak(vec![Nak {
            block: 1,
            seen: 300,
            need: 4,
        }]));
        round(McastMsg::End { blocks: 9 });
        round(McastMsg::Done {
            ok: true,
            reason: String::new(),
            datagrams: 5,
            decoded: 2,
        });
        round(McastMsg::Cancel { reason: "x".into() });
        round(McastMsg::Holds {
            complete: false,
            bytes: 1 << 40,
        });
        round(McastMsg::Train(TrainReport {
            received: 1000,
            first: 2,
            last: 1023,
            span: 123_456,
        }));
        // A list longer than its bytes, and an unknown type: errors.
        let mut b = Bytes::from_static(&[5, 0, 0, 0, 9, 0, 0]);
        assert!(McastMsg::decode(&mut b).is_err());
        let mut b = Bytes::from_static(&[99]);
        assert!(McastMsg::decode(&mut b).is_err());
        let mut b = Bytes::from_static(&[]);
        assert!(McastMsg::decode(&mut b).is_err());
    }

    #[test]
    fn datagram_headers_round_trip() {
        let h = DgramHeader {
            session: session_tag(0x1122_3344_00ab_cdef),
            kind: DgramKind::Data,
            block: 5,
            index: 300,
            number: 0x0304_0506_0708,
        };
        let mut d = vec![0u8; DGRAM_HEADER + 3];
        h.write(&mut d);
        d[DGRAM_HEADER..].copy_from_slice(b"xyz");
        let (r, body) = DgramHeader::read(&d).unwrap();
        assert_eq!((r, body), (h, &b"xyz"[..]));
        assert!(DgramHeader::read(&d[..10]).is_none());
        d[0] = b'X';
        assert!(DgramHeader::read(&d).is_none());
        assert_eq!(r.session, 0x00ab_cdef);
        // A sealed frame: 1434 symbol bytes of 1514 on an Ethernet wire (1426 with the old
        // 29-byte header).
        assert_eq!(lan_symbol(true), 1434);
        assert_eq!(lan_symbol(false) as usize + DGRAM_HEADER, 1471);
        assert_eq!(lan_symbol(true) as usize + DGRAM_HEADER + 16, 1471);
    }
}
