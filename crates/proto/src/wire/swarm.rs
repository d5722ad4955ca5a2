//! Swarm sessions on the network: the swarm's own messages (`Swarm`, encoded by
//! [`crate::swarm::msg`]), and their set-up (`SwarmSetup`): the source's `Open`, the first
//! frame of a connection between two members, a member's report, a member lost.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{put_opt_sig, put_str, Reader};
use super::manifest::put_manifest;
use super::*;
use crate::manifest::Manifest;
use crate::swarm::msg::SwarmMsg;

/// Which distribution strategy a [`crate::swarm::SwarmNode`] runs; the wire carries it in
/// [`SwarmOpen`], so it is defined here and re-exported by [`crate::swarm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Push along the planned tree only (the baseline of every planned tree).
    TreePush,
    /// BitTorrent as in the MOB paper (random pieces, `R` requests, tit-for-tat choking).
    Swarm,
    /// MOB (mob shares, rank-matched global peers, completion tree).
    Mob,
    /// Push along the planned tree, pull what push will not bring in time.
    Hybrid,
}

/// The frames that set up a swarm session over the network (type `0x51`, sub-type byte).
///
/// ```text
/// setup  = sub:u8 | body
/// Open   = 0x01 | session:u64 | node:u32 | chunk_size:u32 | stall_timeout_ms:u32
///               | strategy:u8 (0 tree-push, 1 swarm, 2 mob, 3 hybrid) | seed:u64 | manifest
///               | count:u32 | (node:u32 | parent:u32 | cluster:u32 | name | addr)*
///               | pieces_root:32 | sig
/// Peer   = 0x02 | session:u64 | node:u32
/// Report = 0x03 | node:u32 | count:u32 | (peer:u32 | bytes:u64)*
/// Lost   = 0x04 | node:u32
/// Hashes = 0x05 | first:u64 | count:u32 | hash:32 * count
/// Back   = 0x06 | node:u32
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwarmSetup {
    /// Source to every member, on the source's connection to it: the session and everyone in
    /// it. The connection stays open for the member's [`SwarmSetup::Report`] (and carries
    /// swarm traffic too when the two are swarm peers).
    Open(Box<SwarmOpen>),
    /// The first frame (after the handshake) of a connection a member opens to another:
    /// which session it is for and who is dialling.
    Peer {
        /// Session.
        session: SessionId,
        /// The dialling member's node id.
        node: u32,
    },
    /// Member to source, once its copy is verified and in place: the bytes of verified
    /// pieces received from each peer (duplicates included).
    Report {
        /// The reporting member.
        node: u32,
        /// Per peer: its node id and the piece bytes received from it.
        received: Vec<(u32, u64)>,
    },
    /// Source to every member: member `node` failed or could not be reached, and left the
    /// session for good (its mob share and completion-tree place are redistributed).
    Lost {
        /// The member that left.
        node: u32,
    },
    /// Source to a member, right after the `Open`: the BLAKE3 hashes of pieces `first..`, in
    /// order, until the member holds one per piece; their root is [`SwarmOpen::pieces_root`],
    /// which the source signed with the set-up (see [`crate::swarm::PieceHashes`]).
    Hashes {
        /// Index of the first piece listed.
        first: u64,
        /// One hash per piece (at most [`HASHES_PER_FRAME`]).
        hashes: Vec<[u8; 32]>,
    },
    /// Source to every member: member `node`, lost before, is back in the session (its
    /// connection to the source was made again and it resumed): it counts again for shares
    /// and the completion tree, and its peers connect to it again.
    Back {
        /// The member that came back.
        node: u32,
    },
}

/// Hashes per [`SwarmSetup::Hashes`] frame (1 MiB of them).
pub const HASHES_PER_FRAME: usize = 32_768;

/// A swarm session's set-up (see [`SwarmSetup::Open`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmOpen {
    /// Session identifier (chunk tags are bound to it).
    pub session: SessionId,
    /// The recipient's node id.
    pub node: u32,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// A member that hears nothing for this long gives up (milliseconds).
    pub stall_timeout_ms: u32,
    /// The strategy every member runs.
    pub strategy: Strategy,
    /// Seed for peer and piece choice (the same on every member, so that each can work out
    /// every member's connections).
    pub seed: u64,
    /// What is being sent.
    pub manifest: Manifest,
    /// Every member, in node-id order (node 0 is the source).
    pub members: Vec<SwarmMember>,
    /// The root of the pieces' hashes ([`crate::swarm::PieceHashes::root`]), which follow in
    /// [`SwarmSetup::Hashes`] frames: every member checks every piece, kept or received,
    /// against that list.
    pub pieces_root: [u8; 32],
    /// The source's signature of the session, chunk size, manifest and pieces' root, with host
    /// keys (see [`crate::auth::Keys::sign_swarm_open`]).
    pub sig: Option<Box<SourceSig>>,
}

/// One member of a swarm session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwarmMember {
    /// Node id (its position in the list).
    pub node: u32,
    /// Tree parent for the strategies that push ([`NO_PARENT`] for the source, or everyone
    /// when no tree is used).
    pub parent: u32,
    /// Cluster label (hosts of one `site` share one).
    pub cluster: u32,
    /// Display name.
    pub name: String,
    /// Agent address (`host:port`; empty for the source, which does not listen).
    pub addr: String,
}

/// [`SwarmMember::parent`] of a member without one.
pub const NO_PARENT: u32 = u32::MAX;

pub(super) const S_SETUP_OPEN: u8 = 0x01;
const S_SETUP_PEER: u8 = 0x02;
const S_SETUP_REPORT: u8 = 0x03;
const S_SETUP_LOST: u8 = 0x04;
const S_SETUP_HASHES: u8 = 0x05;
const S_SETUP_BACK: u8 = 0x06;

/// Encodes a `Swarm` frame.
pub(super) fn encode_msg(m: &SwarmMsg, b: &mut BytesMut) -> Bytes {
    b.put_u8(T_SWARM);
    m.encode(b);
    Bytes::new()
}

/// Encodes a `SwarmSetup` frame.
pub(super) fn encode_setup(s: &SwarmSetup, b: &mut BytesMut) -> Bytes {
    b.put_u8(T_SWARM_SETUP);
    put_swarm_setup(b, s);
    Bytes::new()
}

/// Decodes the body of a `Swarm` frame.
pub(super) fn decode_msg(r: &mut Reader) -> Result<Frame, WireError> {
    r.what = "Swarm";
    Ok(Frame::Swarm(SwarmMsg::decode(&mut r.b)?))
}

/// Decodes the body of a `SwarmSetup` frame.
pub(super) fn decode_setup(r: &mut Reader) -> Result<Frame, WireError> {
    r.what = "SwarmSetup";
    Ok(Frame::SwarmSetup(r.swarm_setup()?))
}

fn strategy_code(s: Strategy) -> u8 {
    match s {
        Strategy::TreePush => 0,
        Strategy::Swarm => 1,
        Strategy::Mob => 2,
        Strategy::Hybrid => 3,
    }
}

fn put_swarm_setup(b: &mut BytesMut, s: &SwarmSetup) {
    match s {
        SwarmSetup::Open(o) => {
            b.put_u8(S_SETUP_OPEN);
            b.put_u64(o.session);
            b.put_u32(o.node);
            b.put_u32(o.chunk_size);
            b.put_u32(o.stall_timeout_ms);
            b.put_u8(strategy_code(o.strategy));
            b.put_u64(o.seed);
            put_manifest(b, &o.manifest);
            b.put_u32(o.members.len() as u32);
            for m in &o.members {
                b.put_u32(m.node);
                b.put_u32(m.parent);
                b.put_u32(m.cluster);
                put_str(b, &m.name);
                put_str(b, &m.addr);
            }
            b.put_slice(&o.pieces_root);
            put_opt_sig(b, o.sig.as_deref());
        }
        SwarmSetup::Peer { session, node } => {
            b.put_u8(S_SETUP_PEER);
            b.put_u64(*session);
            b.put_u32(*node);
        }
        SwarmSetup::Report { node, received } => {
            b.put_u8(S_SETUP_REPORT);
            b.put_u32(*node);
            b.put_u32(received.len() as u32);
            for (peer, bytes) in received {
                b.put_u32(*peer);
                b.put_u64(*bytes);
            }
        }
        SwarmSetup::Lost { node } => {
            b.put_u8(S_SETUP_LOST);
            b.put_u32(*node);
        }
        SwarmSetup::Hashes { first, hashes } => {
            b.put_u8(S_SETUP_HASHES);
            b.put_u64(*first);
            b.put_u32(hashes.len() as u32);
            for h in hashes {
                b.put_slice(h);
            }
        }
        SwarmSetup::Back { node } => {
            b.put_u8(S_SETUP_BACK);
            b.put_u32(*node);
        }
    }
}

impl Reader {
    fn swarm_setup(&mut self) -> Result<SwarmSetup, WireError> {
        Ok(match self.u8()? {
            S_SETUP_OPEN => {
                let session = self.u64()?;
                let node = self.u32()?;
                let chunk_size = self.u32()?;
                let stall_timeout_ms = self.u32()?;
                let strategy = match self.u8()? {
                    0 => Strategy::TreePush,
                    1 => Strategy::Swarm,
                    2 => Strategy::Mob,
                    3 => Strategy::Hybrid,
                    _ => return Err(WireError::BadValue(self.what, "unknown strategy")),
                };
                let seed = self.u64()?;
                let manifest = self.manifest()?;
                let n = self.count(4 + 4 + 4 + 4 + 4)?;
                let mut members = Vec::with_capacity(n);
                for _ in 0..n {
                    members.push(SwarmMember {
                        node: self.u32()?,
                        parent: self.u32()?,
                        cluster: self.u32()?,
                        name: self.string()?,
                        addr: self.string()?,
                    });
                }
                SwarmSetup::Open(Box::new(SwarmOpen {
                    session,
                    node,
                    chunk_size,
                    stall_timeout_ms,
                    strategy,
                    seed,
                    manifest,
                    members,
                    pieces_root: self.array()?,
                    sig: self.opt_sig()?,
                }))
            }
            S_SETUP_PEER => SwarmSetup::Peer {
                session: self.u64()?,
                node: self.u32()?,
            },
            S_SETUP_REPORT => {
                let node = self.u32()?;
                let n = self.count(4 + 8)?;
                let mut received = Vec::with_capacity(n);
                for _ in 0..n {
                    received.push((self.u32()?, self.u64()?));
                }
                SwarmSetup::Report { node, received }
            }
            S_SETUP_LOST => SwarmSetup::Lost { node: self.u32()? },
            S_SETUP_HASHES => {
                let first = self.u64()?;
                let n = self.count(32)?;
                if n > HASHES_PER_FRAME {
                    return Err(WireError::BadValue(
                        self.what,
                        "too many hashes in one frame",
                    ));
                }
                let mut hashes = Vec::with_capacity(n);
                for _ in 0..n {
                    hashes.push(self.array()?);
                }
                SwarmSetup::Hashes { first, hashes }
            }
            S_SETUP_BACK => SwarmSetup::Back { node: self.u32()? },
            _ => return Err(WireError::BadValue(self.what, "unknown sub-type")),
        })
    }
}
