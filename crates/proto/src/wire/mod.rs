//! The wire format: length-prefixed frames, the same on every transport.
//!
//! ```text
//! frame  = len:u32 (big endian, counts type + body) | type:u8 | body
//! ```
//!
//! Integers are big endian; strings are `len:u32 | utf-8`; lists are `count:u32 | items`. A
//! decoder never trusts a length: every one is checked against the bytes actually present and
//! against [`MAX_FRAME`] before anything is allocated, so a malformed or hostile peer gets an
//! error, never a crash or an allocation it chose.
//!
//! Message kinds are grouped by exchange: the handshake (`Hello`, then `Noise` messages, or
//! `Refused`; `Challenge` and `Auth` are protocol version 3's and no longer sent), joining by ticket (`Join`), session set-up (`Open`), data (`Chunk`, or a
//! chunk in verified parts: `Head` then `Part`s; `End`),
//! feedback that flows up a tree (`Ack`, `Done`, `Failed`), pulls (`Request`, used for repair
//! today and by receiver-driven strategies later), network probing for the planner (`Ping`,
//! `Pong`, `Probe`, `Probed`), multi-stream edges (`Attach` a connection to an edge, `Striped`
//! frames of the edge's sequence, `Got` back on the connection that carried one),
//! receiver-driven swarming (`Swarm`, see [`crate::swarm`]; its session set-up, peer
//! connections and reports are `SwarmSetup`) and `Error` for a fatal protocol error.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::manifest::{Entry, EntryKind, Manifest, Mtime, ObjectKind};

/// Largest frame accepted: a chunk of the largest chunk size plus headers, or a manifest.
pub const MAX_FRAME: usize = 16 * 1024 * 1024 + 4096;

/// Length of the frame header (`len` and `type`).
pub const HEADER_LEN: usize = 5;

/// The protocol version spoken; a peer with another version is refused at the handshake.
/// 2: `Open`'s members carry `uplink_kbps`. 3: manifests carry modes and modification times
/// for every object, and symlink entries. 4: a receiver answers `Open` with `Have` (what it
/// already holds, so only the rest moves) and `Done` carries the bytes it received. 5: the
/// Noise handshake (`Noise` frames) and source-signed chunks. 6: chunks may travel in parts
/// (`Head`, `Part`), each checked on arrival, so a relay forwards before the chunk is whole;
/// the source signs `Open`, `SwarmOpen` and `End`; `Rejected` names a hop that sent a bad
/// chunk; relays send `Idle` upwards too.
pub const VERSION: u16 = 6;

/// Magic bytes at the start of every connection's first frame, so a stray client (an HTTP
/// probe, a port scanner) is told apart from a peer with the wrong secret.
pub const MAGIC: [u8; 4] = *b"BCST";

/// A session identifier, chosen at random by the source.
pub type SessionId = u64;

/// One protocol message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Connector's opening: protocol version and its nonce.
    Hello {
        /// Protocol version of the connector.
        version: u16,
        /// Connector's random nonce.
        nonce: [u8; 16],
    },
    /// Acceptor's answer: its nonce and a MAC proving it holds the secret.
    Challenge {
        /// Acceptor's random nonce.
        nonce: [u8; 16],
        /// `MAC(handshake key, "acceptor", nonces)`.
        mac: [u8; 32],
    },
    /// Connector's proof that it holds the secret.
    Auth {
        /// `MAC(handshake key, "connector", nonces)`.
        mac: [u8; 32],
    },
    /// A message of the Noise handshake (`bulkcast_node::secure`), after `Hello`.
    Noise {
        /// The handshake pattern the connector chose (secret alone, or with host keys).
        mode: u8,
        /// The Noise message.
        msg: Bytes,
    },
    /// The acceptor refuses the connection (wrong secret, wrong version, busy).
    Refused {
        /// Human-readable reason.
        reason: String,
    },
    /// Ticket mode: a receiver asks the source to be included, and says where it listens.
    Join {
        /// The receiver's display name.
        name: String,
        /// `host:port` where the receiver accepts its parent's connection.
        listen: String,
    },
    /// Session set-up sent by a parent to a child.
    Open(Open),
    /// One chunk of the object.
    Chunk(Chunk),
    /// A chunk that follows in [`Frame::Part`]s: its header, and the chaining value of each
    /// of its groups (see [`crate::groups`]), so that every part is verified as it arrives.
    Head(Head),
    /// Bytes of a chunk announced by a [`Frame::Head`].
    Part(Part),
    /// The object ends: sent after the last chunk.
    End(End),
    /// A parent with nothing to send tells its child it is still there (see
    /// [`crate::node::KEEPALIVE`]): a stream's input may pause for longer than the child's
    /// idle timeout, and the child must not take the pause for a dead parent. Upwards, a relay
    /// with children says it runs (see [`crate::node::UP_KEEPALIVE`]).
    Idle,
    /// Node `node` has verified and stored every chunk below `upto`.
    Ack {
        /// Node that made the progress.
        node: u32,
        /// Exclusive end of the node's verified, stored prefix.
        upto: u64,
    },
    /// Node `node` has the whole object in place.
    Done {
        /// Node that finished.
        node: u32,
        /// Chunk bytes it took from its parent in this session (what the session moved to
        /// it; chunks it already held are not counted).
        received: u64,
    },
    /// Node `node`'s first report, right after its `Open`: the verified chunks it already
    /// holds from an earlier session of the same object (its parent sends it only the rest).
    Have {
        /// The node.
        node: u32,
        /// It holds an identical copy in place already: nothing needs to move to it.
        complete: bool,
        /// Held chunks as half-open index ranges `[start, end)`, ascending.
        ranges: Vec<(u64, u64)>,
    },
    /// Node `node` failed and will not finish.
    Failed {
        /// Node that failed.
        node: u32,
        /// What went wrong, for the sender's report.
        reason: String,
    },
    /// Node `node` rejected chunk `index` from its parent `from`: it failed verification
    /// (tampered with, or corrupted on the way). Travels up to the source, which names the
    /// culprit in its report.
    Rejected {
        /// Node that rejected the chunk (the first honest hop).
        node: u32,
        /// Its parent, which sent the chunk.
        from: u32,
        /// Chunk index.
        index: u64,
    },
    /// Ask the peer for chunk `index` (repair, and later receiver-driven pulls).
    Request {
        /// Chunk index.
        index: u64,
    },
    /// Probing: a timestamped echo request, answered by `Pong` with the same nonce.
    Ping {
        /// Echoed back.
        nonce: u64,
    },
    /// Probing: the answer to `Ping`.
    Pong {
        /// The ping's nonce.
        nonce: u64,
    },
    /// Probing: the source asks an agent to measure its round-trip time to each target.
    Probe {
        /// Echoes per target (the median is reported).
        samples: u16,
        /// Deadline for the whole measurement, in milliseconds.
        timeout_ms: u32,
        /// Agent addresses (`host:port`).
        targets: Vec<String>,
    },
    /// Set-up: the source asks a relay to open (connect and pass the handshake with) the
    /// connections to its children in `session` now, before the session's `Open` reaches it
    /// from its parent, so that every hop of a tree is dialled at once rather than one level
    /// after another. Answered by nothing; the relay's driver takes the connections when the
    /// session starts there, or dials afresh if they are not up.
    Dial {
        /// The session the connections are for.
        session: SessionId,
        /// The children's agent addresses (`host:port`).
        addrs: Vec<String>,
    },
    /// Probing: round-trip times in microseconds, one per target of the `Probe`, in order;
    /// [`UNREACHABLE`] where a target could not be measured.
    Probed {
        /// Median RTT per target.
        rtt_us: Vec<u32>,
    },
    /// Bandwidth probing: the source asks an agent to measure what it can send to `target`
    /// for `millis` milliseconds; answered with `BwResult`.
    BwProbe {
        /// Agent address (`host:port`).
        target: String,
        /// How long to send.
        millis: u32,
    },
    /// Bandwidth probing: the measured rate in kbit/s ([`UNREACHABLE`] if it failed).
    BwResult {
        /// Rate the target received, in kbit/s.
        kbps: u32,
    },
    /// Bandwidth probing: raw filler bytes follow until the sender closes its side; the
    /// receiver then answers `SinkReport`.
    Sink,
    /// Bandwidth probing: what the sink received, and over how long.
    SinkReport {
        /// Bytes received after `Sink`.
        bytes: u64,
        /// From the first to the last byte, in microseconds.
        micros: u64,
    },
    /// Multi-stream edges: the first frame of a connection that joins an edge (after the
    /// handshake), and, on the edge's first connection right after `Open`, the announcement
    /// that every later frame to the child comes wrapped in [`Frame::Striped`].
    Attach {
        /// The session the edge belongs to.
        session: SessionId,
        /// Chosen at random by the parent for this edge: tells its connections apart from
        /// another edge's of the same session.
        token: u64,
        /// The connection's number on the edge (0: the first, which carries the control frames
        /// the child sends back).
        conn: u16,
        /// The parent's reorder window in frames: it never sends sequence number `s` before
        /// every frame below `s - window` is acknowledged with `Got`.
        window: u32,
    },
    /// Multi-stream edges: a frame of the parent's in-order sequence, on any connection of the
    /// edge; the child puts the frames back in `seq` order. Never nested.
    Striped {
        /// Position in the edge's sequence, from 0.
        seq: u64,
        /// The frame itself (a chunk, an end, an error...).
        inner: Box<Frame>,
    },
    /// Multi-stream edges: the child took frame `seq`; sent on the connection that carried it
    /// (the parent's per-connection rate and in-flight measures come from these).
    Got {
        /// The sequence number taken.
        seq: u64,
    },
    /// Receiver-driven swarming (MOB, the BitTorrent-style baseline, the hybrid): a control
    /// message with its own sub-type (see [`crate::swarm::msg`]); pieces travel as `Chunk`.
    Swarm(crate::swarm::SwarmMsg),
    /// Swarm sessions on the network: the source's set-up, the first frame of a connection
    /// between two members, a member's final report (see [`SwarmSetup`]).
    SwarmSetup(SwarmSetup),
    /// A multicast send's control message (see [`crate::mcast::msg`]).
    Mcast(crate::mcast::McastMsg),
    /// A fatal error; the sender of this frame closes the connection after it.
    Error {
        /// Human-readable reason.
        reason: String,
    },
}

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

/// The frames that set up a swarm session over the network (type `0x51`, sub-type byte).
///
/// ```text
/// setup  = sub:u8 | body
/// Open   = 0x01 | session:u64 | node:u32 | chunk_size:u32 | stall_timeout_ms:u32
///               | strategy:u8 (0 tree-push, 1 swarm, 2 mob, 3 hybrid) | seed:u64 | manifest
///               | count:u32 | (node:u32 | parent:u32 | cluster:u32 | name | addr)*
/// Peer   = 0x02 | session:u64 | node:u32
/// Report = 0x03 | node:u32 | count:u32 | (peer:u32 | bytes:u64)*
/// Lost   = 0x04 | node:u32
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
}

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
    pub strategy: crate::swarm::Strategy,
    /// Seed for peer and piece choice (the same on every member, so that each can work out
    /// every member's connections).
    pub seed: u64,
    /// What is being sent.
    pub manifest: Manifest,
    /// Every member, in node-id order (node 0 is the source).
    pub members: Vec<SwarmMember>,
    /// The source's signature of the session, chunk size and manifest, with host keys (see
    /// [`crate::auth::Keys::sign_open`]).
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

const S_SETUP_OPEN: u8 = 0x01;
const S_SETUP_PEER: u8 = 0x02;
const S_SETUP_REPORT: u8 = 0x03;
const S_SETUP_LOST: u8 = 0x04;

/// How the edges of a session are carried: connections per edge and how frames are dealt to
/// them (see [`crate::multipath`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeMode {
    /// Connections per edge; 0: start with one and add more while that adds throughput.
    pub streams: u16,
    /// Which scheduler deals frames to the connections.
    pub scheduler: EdgeScheduler,
}

impl Default for EdgeMode {
    /// One connection per edge: no striping.
    fn default() -> Self {
        Self {
            streams: 1,
            scheduler: EdgeScheduler::Pull,
        }
    }
}

impl EdgeMode {
    /// Whether edges are striped over connections (more than one, or automatic).
    pub fn is_striped(&self) -> bool {
        self.streams != 1
    }

    /// What automatic striping (`streams` 0) comes to for a session whose hops use congestion
    /// control `cc` (`auto`: bbr, cubic once the path shows no random loss, [`crate::cc`]), where
    /// `multipath` says whether some host has more than one address.
    ///
    /// A model-based control (`bbr`) keeps one path full with one connection, under random loss
    /// too, so there every edge is one plain connection: more connections to the same
    /// bottleneck only share its queue, and the child puts their frames back in order. On the
    /// lab's 100 Mbit/s star (2026-11-26, `bench/lab-run star-8`) a chain of 8 finished with
    /// its receivers 0.06 s apart on plain edges and 0.2-0.3 s apart per hop with automatic
    /// striping, which had added a second connection at the source. Striping stays where it
    /// pays: loss-based control on long round trips (seed 002), and several paths.
    pub fn for_session(self, cc: &str, multipath: bool) -> EdgeMode {
        if self.streams == 0 && (cc == "bbr" || cc == "auto") && !multipath {
            EdgeMode { streams: 1, ..self }
        } else {
            self
        }
    }
}

/// The multi-stream schedulers (see [`crate::multipath::Scheduler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeScheduler {
    /// Each connection takes the next frame when its socket has room.
    Pull,
    /// Seed 002's weighted fork-join with its re-weighting controller.
    Weighted,
    /// Seed 002's unweighted fork-join (equal blocks).
    Equal,
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
    /// relay paces what it sends below it (see `bulkcast_node::driver::RELAY_UPLINK_SHARE`).
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

/// Why bytes did not decode into a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The length prefix is larger than [`MAX_FRAME`] (or than the receiver's own limit).
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// Limit in force.
        max: usize,
    },
    /// The length prefix is zero (no type byte).
    #[error("empty frame")]
    Empty,
    /// Unknown message type.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// The body is shorter than its fields say.
    #[error("truncated {0} frame")]
    Truncated(&'static str),
    /// The body is longer than its fields say.
    #[error("{0} frame has {1} trailing bytes")]
    Trailing(&'static str, usize),
    /// A string is not UTF-8.
    #[error("{0} frame holds a string that is not UTF-8")]
    BadUtf8(&'static str),
    /// A field has a value outside its domain.
    #[error("{0} frame: {1}")]
    BadValue(&'static str, &'static str),
    /// The first frame does not start with the protocol magic.
    #[error("peer does not speak the bulkcast protocol (bad magic)")]
    BadMagic,
}

const T_HELLO: u8 = 0x01;
const T_CHALLENGE: u8 = 0x02;
const T_AUTH: u8 = 0x03;
const T_REFUSED: u8 = 0x04;
const T_NOISE: u8 = 0x06;
const T_JOIN: u8 = 0x05;
const T_OPEN: u8 = 0x10;
const T_CHUNK: u8 = 0x11;
const T_END: u8 = 0x12;
const T_ATTACH: u8 = 0x13;
const T_STRIPED: u8 = 0x14;
const T_IDLE: u8 = 0x15;
const T_CHUNK_SIGNED: u8 = 0x16;
const T_HEAD: u8 = 0x17;
const T_PART: u8 = 0x18;
const T_END_SIGNED: u8 = 0x19;
const T_ACK: u8 = 0x20;
const T_DONE: u8 = 0x21;
const T_FAILED: u8 = 0x22;
const T_GOT: u8 = 0x23;
const T_HAVE: u8 = 0x24;
const T_REJECTED: u8 = 0x25;
const T_REQUEST: u8 = 0x30;
const T_PING: u8 = 0x40;
const T_PONG: u8 = 0x41;
const T_PROBE: u8 = 0x42;
const T_PROBED: u8 = 0x43;
const T_BWPROBE: u8 = 0x44;
const T_BWRESULT: u8 = 0x45;
const T_SINK: u8 = 0x46;
const T_SINKREPORT: u8 = 0x47;
const T_DIAL: u8 = 0x48;
const T_SWARM: u8 = 0x50;
const T_SWARM_SETUP: u8 = 0x51;
const T_MCAST: u8 = 0x52;
const T_ERROR: u8 = 0x7f;

/// An RTT that could not be measured, in a `Probed` frame.
pub const UNREACHABLE: u32 = u32::MAX;

/// A frame ready to write: a small head (header and fixed fields) and, for chunks, the data
/// itself, so the bytes of a chunk are never copied on the way out.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Header and every field but a chunk's data.
    pub head: Bytes,
    /// A chunk's data; empty for other frames.
    pub data: Bytes,
}

impl Encoded {
    /// Total bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.data.len()
    }

    /// True for a zero-length frame (never produced by [`Frame::encode`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Both parts in one buffer (tests and the simulator).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.head);
        v.extend_from_slice(&self.data);
        v
    }
}

impl Frame {
    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Frame::Hello { .. } => "Hello",
            Frame::Challenge { .. } => "Challenge",
            Frame::Auth { .. } => "Auth",
            Frame::Refused { .. } => "Refused",
            Frame::Noise { .. } => "Noise",
            Frame::Join { .. } => "Join",
            Frame::Open(_) => "Open",
            Frame::Chunk(_) => "Chunk",
            Frame::Head(_) => "Head",
            Frame::Part(_) => "Part",
            Frame::End(_) => "End",
            Frame::Ack { .. } => "Ack",
            Frame::Done { .. } => "Done",
            Frame::Have { .. } => "Have",
            Frame::Failed { .. } => "Failed",
            Frame::Rejected { .. } => "Rejected",
            Frame::Request { .. } => "Request",
            Frame::Ping { .. } => "Ping",
            Frame::Pong { .. } => "Pong",
            Frame::Probe { .. } => "Probe",
            Frame::Probed { .. } => "Probed",
            Frame::Dial { .. } => "Dial",
            Frame::BwProbe { .. } => "BwProbe",
            Frame::BwResult { .. } => "BwResult",
            Frame::Sink => "Sink",
            Frame::Idle => "Idle",
            Frame::SinkReport { .. } => "SinkReport",
            Frame::Attach { .. } => "Attach",
            Frame::Striped { .. } => "Striped",
            Frame::Got { .. } => "Got",
            Frame::Swarm(_) => "Swarm",
            Frame::Mcast(_) => "Mcast",
            Frame::SwarmSetup(_) => "SwarmSetup",
            Frame::Error { .. } => "Error",
        }
    }

    /// Encodes the frame.
    pub fn encode(&self) -> Encoded {
        let mut b = BytesMut::with_capacity(64);
        b.put_u32(0); // length, patched below
        let mut data = Bytes::new();
        match self {
            Frame::Hello { version, nonce } => {
                b.put_u8(T_HELLO);
                b.put_slice(&MAGIC);
                b.put_u16(*version);
                b.put_slice(nonce);
            }
            Frame::Challenge { nonce, mac } => {
                b.put_u8(T_CHALLENGE);
                b.put_slice(nonce);
                b.put_slice(mac);
            }
            Frame::Auth { mac } => {
                b.put_u8(T_AUTH);
                b.put_slice(mac);
            }
            Frame::Refused { reason } => {
                b.put_u8(T_REFUSED);
                put_str(&mut b, reason);
            }
            Frame::Noise { mode, msg } => {
                b.put_u8(T_NOISE);
                b.put_u8(*mode);
                // A Noise message is at most 65535 bytes.
                b.put_u16(msg.len().min(usize::from(u16::MAX)) as u16);
                b.put_slice(&msg[..msg.len().min(usize::from(u16::MAX))]);
            }
            Frame::Join { name, listen } => {
                b.put_u8(T_JOIN);
                put_str(&mut b, name);
                put_str(&mut b, listen);
            }
            Frame::Open(o) => {
                b.put_u8(T_OPEN);
                put_open(&mut b, o);
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
            Frame::Head(h) => put_head(&mut b, h),
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
                put_sig(&mut b, e.sig.as_ref());
            }
            Frame::Ack { node, upto } => {
                b.put_u8(T_ACK);
                b.put_u32(*node);
                b.put_u64(*upto);
            }
            Frame::Done { node, received } => {
                b.put_u8(T_DONE);
                b.put_u32(*node);
                b.put_u64(*received);
            }
            Frame::Have {
                node,
                complete,
                ranges,
            } => {
                b.put_u8(T_HAVE);
                b.put_u32(*node);
                b.put_u8(u8::from(*complete));
                b.put_u32(ranges.len() as u32);
                for (s, e) in ranges {
                    b.put_u64(*s);
                    b.put_u64(*e);
                }
            }
            Frame::Failed { node, reason } => {
                b.put_u8(T_FAILED);
                b.put_u32(*node);
                put_str(&mut b, reason);
            }
            Frame::Rejected { node, from, index } => {
                b.put_u8(T_REJECTED);
                b.put_u32(*node);
                b.put_u32(*from);
                b.put_u64(*index);
            }
            Frame::Request { index } => {
                b.put_u8(T_REQUEST);
                b.put_u64(*index);
            }
            Frame::Ping { nonce } => {
                b.put_u8(T_PING);
                b.put_u64(*nonce);
            }
            Frame::Pong { nonce } => {
                b.put_u8(T_PONG);
                b.put_u64(*nonce);
            }
            Frame::Probe {
                samples,
                timeout_ms,
                targets,
            } => {
                b.put_u8(T_PROBE);
                b.put_u16(*samples);
                b.put_u32(*timeout_ms);
                b.put_u32(targets.len() as u32);
                for t in targets {
                    put_str(&mut b, t);
                }
            }
            Frame::Dial { session, addrs } => {
                b.put_u8(T_DIAL);
                b.put_u64(*session);
                b.put_u32(addrs.len() as u32);
                for a in addrs {
                    put_str(&mut b, a);
                }
            }
            Frame::Probed { rtt_us } => {
                b.put_u8(T_PROBED);
                b.put_u32(rtt_us.len() as u32);
                for r in rtt_us {
                    b.put_u32(*r);
                }
            }
            Frame::BwProbe { target, millis } => {
                b.put_u8(T_BWPROBE);
                put_str(&mut b, target);
                b.put_u32(*millis);
            }
            Frame::BwResult { kbps } => {
                b.put_u8(T_BWRESULT);
                b.put_u32(*kbps);
            }
            Frame::Sink => b.put_u8(T_SINK),
            Frame::Idle => b.put_u8(T_IDLE),
            Frame::SinkReport { bytes, micros } => {
                b.put_u8(T_SINKREPORT);
                b.put_u64(*bytes);
                b.put_u64(*micros);
            }
            Frame::Attach {
                session,
                token,
                conn,
                window,
            } => {
                b.put_u8(T_ATTACH);
                b.put_u64(*session);
                b.put_u64(*token);
                b.put_u16(*conn);
                b.put_u32(*window);
            }
            Frame::Striped { seq, inner } => {
                // The inner frame's type and body follow the sequence number; its data (a
                // chunk's bytes) stays a separate part, so wrapping copies nothing.
                b.put_u8(T_STRIPED);
                b.put_u64(*seq);
                let e = inner.encode();
                b.put_slice(&e.head[4..]);
                data = e.data;
            }
            Frame::Got { seq } => {
                b.put_u8(T_GOT);
                b.put_u64(*seq);
            }
            Frame::Swarm(m) => {
                b.put_u8(T_SWARM);
                m.encode(&mut b);
            }
            Frame::Mcast(m) => {
                b.put_u8(T_MCAST);
                m.encode(&mut b);
            }
            Frame::SwarmSetup(s) => {
                b.put_u8(T_SWARM_SETUP);
                put_swarm_setup(&mut b, s);
            }
            Frame::Error { reason } => {
                b.put_u8(T_ERROR);
                put_str(&mut b, reason);
            }
        }
        let len = (b.len() - 4 + data.len()) as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        Encoded {
            head: b.freeze(),
            data,
        }
    }

    /// Decodes one frame's type and body (the bytes after the length prefix).
    pub fn decode(mut body: Bytes) -> Result<Frame, WireError> {
        if body.is_empty() {
            return Err(WireError::Empty);
        }
        let ty = body.get_u8();
        let mut r = Reader { b: body, what: "" };
        let frame = match ty {
            T_HELLO => {
                r.what = "Hello";
                if r.array::<4>()? != MAGIC {
                    return Err(WireError::BadMagic);
                }
                Frame::Hello {
                    version: r.u16()?,
                    nonce: r.array()?,
                }
            }
            T_CHALLENGE => {
                r.what = "Challenge";
                Frame::Challenge {
                    nonce: r.array()?,
                    mac: r.array()?,
                }
            }
            T_AUTH => {
                r.what = "Auth";
                Frame::Auth { mac: r.array()? }
            }
            T_REFUSED => {
                r.what = "Refused";
                Frame::Refused {
                    reason: r.string()?,
                }
            }
            T_NOISE => {
                r.what = "Noise";
                let mode = r.u8()?;
                let n = usize::from(r.u16()?);
                r.need(n)?;
                Frame::Noise {
                    mode,
                    msg: r.b.split_to(n),
                }
            }
            T_JOIN => {
                r.what = "Join";
                Frame::Join {
                    name: r.string()?,
                    listen: r.string()?,
                }
            }
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
            T_ACK => {
                r.what = "Ack";
                Frame::Ack {
                    node: r.u32()?,
                    upto: r.u64()?,
                }
            }
            T_DONE => {
                r.what = "Done";
                Frame::Done {
                    node: r.u32()?,
                    received: r.u64()?,
                }
            }
            T_HAVE => {
                r.what = "Have";
                let node = r.u32()?;
                let complete = r.u8()? != 0;
                let n = r.count(16)?;
                let mut ranges = Vec::with_capacity(n);
                let mut last = 0;
                for _ in 0..n {
                    let (s, e) = (r.u64()?, r.u64()?);
                    if s < last || e <= s {
                        return Err(WireError::BadValue("Have", "ranges not ascending"));
                    }
                    last = e;
                    ranges.push((s, e));
                }
                Frame::Have {
                    node,
                    complete,
                    ranges,
                }
            }
            T_FAILED => {
                r.what = "Failed";
                Frame::Failed {
                    node: r.u32()?,
                    reason: r.string()?,
                }
            }
            T_REJECTED => {
                r.what = "Rejected";
                Frame::Rejected {
                    node: r.u32()?,
                    from: r.u32()?,
                    index: r.u64()?,
                }
            }
            T_REQUEST => {
                r.what = "Request";
                Frame::Request { index: r.u64()? }
            }
            T_PING => {
                r.what = "Ping";
                Frame::Ping { nonce: r.u64()? }
            }
            T_PONG => {
                r.what = "Pong";
                Frame::Pong { nonce: r.u64()? }
            }
            T_PROBE => {
                r.what = "Probe";
                let samples = r.u16()?;
                let timeout_ms = r.u32()?;
                let n = r.count(4)?;
                let mut targets = Vec::with_capacity(n);
                for _ in 0..n {
                    targets.push(r.string()?);
                }
                Frame::Probe {
                    samples,
                    timeout_ms,
                    targets,
                }
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
            T_PROBED => {
                r.what = "Probed";
                let n = r.count(4)?;
                let mut rtt_us = Vec::with_capacity(n);
                for _ in 0..n {
                    rtt_us.push(r.u32()?);
                }
                Frame::Probed { rtt_us }
            }
            T_BWPROBE => {
                r.what = "BwProbe";
                Frame::BwProbe {
                    target: r.string()?,
                    millis: r.u32()?,
                }
            }
            T_BWRESULT => {
                r.what = "BwResult";
                Frame::BwResult { kbps: r.u32()? }
            }
            T_SINK => Frame::Sink,
            T_IDLE => Frame::Idle,
            T_SINKREPORT => {
                r.what = "SinkReport";
                Frame::SinkReport {
                    bytes: r.u64()?,
                    micros: r.u64()?,
                }
            }
            T_ATTACH => {
                r.what = "Attach";
                Frame::Attach {
                    session: r.u64()?,
                    token: r.u64()?,
                    conn: r.u16()?,
                    window: r.u32()?,
                }
            }
            T_STRIPED => {
                r.what = "Striped";
                let seq = r.u64()?;
                let inner = std::mem::take(&mut r.b);
                if inner.first() == Some(&T_STRIPED) {
                    return Err(WireError::BadValue("Striped", "nested"));
                }
                return Ok(Frame::Striped {
                    seq,
                    inner: Box::new(Frame::decode(inner)?),
                });
            }
            T_GOT => {
                r.what = "Got";
                Frame::Got { seq: r.u64()? }
            }
            T_SWARM => {
                r.what = "Swarm";
                Frame::Swarm(crate::swarm::SwarmMsg::decode(&mut r.b)?)
            }
            T_MCAST => {
                r.what = "Mcast";
                Frame::Mcast(crate::mcast::McastMsg::decode(&mut r.b)?)
            }
            T_SWARM_SETUP => {
                r.what = "SwarmSetup";
                Frame::SwarmSetup(r.swarm_setup()?)
            }
            T_ERROR => {
                r.what = "Error";
                Frame::Error {
                    reason: r.string()?,
                }
            }
            other => return Err(WireError::UnknownType(other)),
        };
        if !r.b.is_empty() {
            return Err(WireError::Trailing(r.what, r.b.len()));
        }
        Ok(frame)
    }
}

/// Reads a frame header and returns the body length, checked against `max`.
pub fn body_len(header: [u8; 4], max: usize) -> Result<usize, WireError> {
    let len = u32::from_be_bytes(header) as usize;
    if len == 0 {
        return Err(WireError::Empty);
    }
    if len > max {
        return Err(WireError::TooLarge { len, max });
    }
    Ok(len)
}

/// Incremental decoder over a byte buffer, for transports that deliver arbitrary slices (the
/// simulator, fuzzing). Returns `Ok(None)` until a whole frame is buffered.
pub fn decode_from(buf: &mut BytesMut, max: usize) -> Result<Option<Frame>, WireError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = body_len([buf[0], buf[1], buf[2], buf[3]], max)?;
    if buf.len() < 4 + len {
        return Ok(None);
    }
    buf.advance(4);
    Frame::decode(buf.split_to(len).freeze()).map(Some)
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u32(s.len() as u32);
    b.put_slice(s.as_bytes());
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

fn put_sig(b: &mut BytesMut, sig: Option<&SourceSig>) {
    if let Some(s) = sig {
        b.put_slice(&s.key);
        b.put_slice(&s.sig);
    }
}

/// `has_sig:u8 | [key:32 | sig:64]`
fn put_opt_sig(b: &mut BytesMut, sig: Option<&SourceSig>) {
    b.put_u8(sig.is_some() as u8);
    put_sig(b, sig);
}

fn strategy_code(s: crate::swarm::Strategy) -> u8 {
    use crate::swarm::Strategy;
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
    }
}

/// An object's identity, for resuming: BLAKE3 over its encoded manifest (name, kind, length,
/// mode, modification time, every entry). Two sends of a file that was not changed in between
/// (same length and modification time, to the nanosecond) share it, so a receiver keeps the
/// verified chunks of one for the other (see `bulkcast_node::store`), whatever their chunk sizes.
pub fn object_id(m: &Manifest) -> [u8; 32] {
    let mut b = BytesMut::new();
    b.put_slice(b"bulkcast object v1");
    put_manifest(&mut b, m);
    *blake3::hash(&b).as_bytes()
}

/// ```text
/// manifest = name | kind:u8 (0 file, 1 dir, 2 stream) | has_len:u8 | [len:u64] | mode:u32
///            | mtime | count:u32 | entry*
/// entry    = path | kind:u8 (0 file, 1 dir, 2 symlink) | len:u64 | mode:u32 | mtime
///            | [target, symlinks only]
/// mtime    = 0:u8 | 1:u8 secs:i64 nanos:u32
/// ```
fn put_manifest(b: &mut BytesMut, m: &Manifest) {
    put_str(b, &m.name);
    b.put_u8(match m.kind {
        ObjectKind::File => 0,
        ObjectKind::Dir => 1,
        ObjectKind::Stream => 2,
    });
    match m.total_len {
        Some(n) => {
            b.put_u8(1);
            b.put_u64(n);
        }
        None => b.put_u8(0),
    }
    b.put_u32(m.mode);
    put_mtime(b, m.mtime);
    b.put_u32(m.entries.len() as u32);
    for e in &m.entries {
        put_str(b, &e.path);
        b.put_u8(match e.kind {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
            EntryKind::Symlink(_) => 2,
        });
        b.put_u64(e.len);
        b.put_u32(e.mode);
        put_mtime(b, e.mtime);
        if let EntryKind::Symlink(t) = &e.kind {
            put_str(b, t);
        }
    }
}

fn put_mtime(b: &mut BytesMut, t: Option<Mtime>) {
    match t {
        Some(t) => {
            b.put_u8(1);
            b.put_i64(t.secs);
            b.put_u32(t.nanos);
        }
        None => b.put_u8(0),
    }
}

/// A bounds-checked cursor over a frame body.
struct Reader {
    b: Bytes,
    what: &'static str,
}

impl Reader {
    fn need(&self, n: usize) -> Result<(), WireError> {
        if self.b.remaining() < n {
            Err(WireError::Truncated(self.what))
        } else {
            Ok(())
        }
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        self.need(1)?;
        Ok(self.b.get_u8())
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        self.need(2)?;
        Ok(self.b.get_u16())
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        self.need(4)?;
        Ok(self.b.get_u32())
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        self.need(8)?;
        Ok(self.b.get_u64())
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        self.need(N)?;
        let mut a = [0u8; N];
        self.b.copy_to_slice(&mut a);
        Ok(a)
    }
    fn string(&mut self) -> Result<String, WireError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        let bytes = self.b.split_to(n);
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::BadUtf8(self.what))
    }
    /// A list count, checked against the bytes left so a forged count cannot drive allocation.
    fn count(&mut self, min_item: usize) -> Result<usize, WireError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_item) > self.b.remaining() {
            return Err(WireError::Truncated(self.what));
        }
        Ok(n)
    }
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

    fn sig(&mut self) -> Result<SourceSig, WireError> {
        Ok(SourceSig {
            key: self.array()?,
            sig: self.array()?,
        })
    }

    fn opt_sig(&mut self) -> Result<Option<Box<SourceSig>>, WireError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(Box::new(self.sig()?))),
            _ => Err(WireError::BadValue(self.what, "bad signature flag")),
        }
    }

    fn swarm_setup(&mut self) -> Result<SwarmSetup, WireError> {
        use crate::swarm::Strategy;
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
            _ => return Err(WireError::BadValue(self.what, "unknown sub-type")),
        })
    }

    fn manifest(&mut self) -> Result<Manifest, WireError> {
        let name = self.string()?;
        let kind = match self.u8()? {
            0 => ObjectKind::File,
            1 => ObjectKind::Dir,
            2 => ObjectKind::Stream,
            _ => return Err(WireError::BadValue("Open", "unknown object kind")),
        };
        let total_len = match self.u8()? {
            0 => None,
            1 => Some(self.u64()?),
            _ => return Err(WireError::BadValue("Open", "bad length flag")),
        };
        let mode = self.u32()?;
        let mtime = self.mtime()?;
        let n = self.count(4 + 1 + 8 + 4 + 1)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let path = self.string()?;
            let kind = self.u8()?;
            let len = self.u64()?;
            let mode = self.u32()?;
            let mtime = self.mtime()?;
            let kind = match kind {
                0 => EntryKind::File,
                1 => EntryKind::Dir,
                2 => EntryKind::Symlink(self.string()?),
                _ => return Err(WireError::BadValue("Open", "unknown entry kind")),
            };
            entries.push(Entry {
                path,
                kind,
                len,
                mode,
                mtime,
            });
        }
        Ok(Manifest {
            name,
            kind,
            total_len,
            entries,
            mode,
            mtime,
        })
    }

    fn mtime(&mut self) -> Result<Option<Mtime>, WireError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let secs = self.u64()? as i64;
                let nanos = self.u32()?;
                if nanos >= 1_000_000_000 {
                    return Err(WireError::BadValue(
                        "Open",
                        "mtime nanoseconds past a second",
                    ));
                }
                Ok(Some(Mtime { secs, nanos }))
            }
            _ => Err(WireError::BadValue("Open", "bad mtime flag")),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn automatic_striping_is_one_plain_connection_with_bbr_on_one_path() {
        let auto = EdgeMode {
            streams: 0,
            scheduler: EdgeScheduler::Pull,
        };
        assert_eq!(auto.for_session("bbr", false).streams, 1);
        // `--cc auto` ends on bbr wherever the path is lossy.
        assert_eq!(auto.for_session("auto", false).streams, 1);
        assert!(!auto.for_session("bbr", false).is_striped());
        // Loss-based control, the system's choice, or several paths keep striping.
        assert_eq!(auto.for_session("cubic", false).streams, 0);
        assert_eq!(auto.for_session("", false).streams, 0);
        assert_eq!(auto.for_session("bbr", true).streams, 0);
        // A number given by the user is kept.
        let four = EdgeMode { streams: 4, ..auto };
        assert_eq!(four.for_session("bbr", false).streams, 4);
    }
    use super::*;

    fn samples() -> Vec<Frame> {
        vec![
            Frame::Hello {
                version: VERSION,
                nonce: [7; 16],
            },
            Frame::Challenge {
                nonce: [1; 16],
                mac: [2; 32],
            },
            Frame::Auth { mac: [3; 32] },
            Frame::Noise {
                mode: 2,
                msg: Bytes::from_static(b"noise message"),
            },
            Frame::Refused {
                reason: "wrong secret".into(),
            },
            Frame::Join {
                name: "gpu-7".into(),
                listen: "127.0.0.1:9".into(),
            },
            Frame::Open(Open {
                session: 42,
                node: 3,
                chunk_size: 1 << 20,
                stall_timeout_ms: 30_000,
                cc: "bbr".into(),
                manifest: Manifest {
                    name: "data".into(),
                    kind: ObjectKind::Dir,
                    total_len: Some(10),
                    entries: vec![
                        Entry {
                            path: "a".into(),
                            kind: EntryKind::Dir,
                            len: 0,
                            mode: 0o755,
                            mtime: Some(Mtime {
                                secs: -5,
                                nanos: 999_999_999,
                            }),
                        },
                        Entry {
                            path: "a/b.bin".into(),
                            kind: EntryKind::File,
                            len: 10,
                            mode: 0o4750,
                            mtime: None,
                        },
                        Entry {
                            path: "a/link".into(),
                            kind: EntryKind::Symlink("b.bin".into()),
                            len: 0,
                            mode: 0o777,
                            mtime: Some(Mtime {
                                secs: 1_700_000_000,
                                nanos: 1,
                            }),
                        },
                    ],
                    mode: 0o750,
                    mtime: Some(Mtime { secs: 7, nanos: 0 }),
                },
                members: vec![Member {
                    node: 3,
                    parent: 1,
                    name: "h3".into(),
                    addr: "127.0.0.1:7003".into(),
                    uplink_kbps: 100_000,
                }],
                stripe: Some(Box::new(StripeInfo {
                    group: 9,
                    tree: 1,
                    pattern: vec![0, 1, 0],
                    object: Manifest {
                        name: "data".into(),
                        kind: ObjectKind::File,
                        total_len: Some(30),
                        entries: vec![],
                        mode: 0o644,
                        mtime: None,
                    },
                })),
                edges: EdgeMode {
                    streams: 0,
                    scheduler: EdgeScheduler::Weighted,
                },
                sig: Some(Box::new(SourceSig {
                    key: [8; 32],
                    sig: [9; 64],
                })),
            }),
            Frame::Chunk(Chunk {
                index: 9,
                hash: [4; 32],
                tag: [5; 32],
                sig: None,
                data: Bytes::from_static(b"hello chunk"),
            }),
            Frame::Chunk(Chunk {
                index: 10,
                hash: [4; 32],
                tag: [5; 32],
                sig: Some(Box::new(SourceSig {
                    key: [6; 32],
                    sig: [7; 64],
                })),
                data: Bytes::from_static(b"signed chunk"),
            }),
            Frame::End(End {
                chunks: 3,
                total_len: 2_000_000,
                tag: [6; 32],
                sig: None,
            }),
            Frame::End(End {
                chunks: 3,
                total_len: 2_000_000,
                tag: [6; 32],
                sig: Some(SourceSig {
                    key: [1; 32],
                    sig: [2; 64],
                }),
            }),
            Frame::Ack { node: 4, upto: 17 },
            Frame::Done {
                node: 4,
                received: 5,
            },
            Frame::Have {
                node: 4,
                complete: false,
                ranges: vec![(0, 3), (7, 9)],
            },
            Frame::Failed {
                node: 5,
                reason: "disk full".into(),
            },
            Frame::Rejected {
                node: 5,
                from: 2,
                index: 9,
            },
            Frame::Request { index: 11 },
            Frame::Ping { nonce: 3 },
            Frame::Pong { nonce: 3 },
            Frame::Probe {
                samples: 5,
                timeout_ms: 2000,
                targets: vec!["a:1".into(), "b:2".into()],
            },
            Frame::Probed {
                rtt_us: vec![120, UNREACHABLE],
            },
            Frame::Dial {
                session: 9,
                addrs: vec!["a:1".into(), "b:2".into()],
            },
            Frame::BwProbe {
                target: "a:1".into(),
                millis: 500,
            },
            Frame::BwResult { kbps: 95_000 },
            Frame::Sink,
            Frame::Idle,
            Frame::SinkReport {
                bytes: 1 << 20,
                micros: 1000,
            },
            Frame::Attach {
                session: 7,
                token: 0xfeed,
                conn: 3,
                window: 256,
            },
            Frame::Striped {
                seq: 41,
                inner: Box::new(Frame::Chunk(Chunk {
                    index: 9,
                    hash: [1; 32],
                    tag: [2; 32],
                    sig: None,
                    data: Bytes::from_static(b"striped bytes"),
                })),
            },
            Frame::Striped {
                seq: 42,
                inner: Box::new(Frame::Ack { node: 1, upto: 2 }),
            },
            Frame::Got { seq: 41 },
            Frame::SwarmSetup(SwarmSetup::Open(Box::new(SwarmOpen {
                session: 77,
                node: 2,
                chunk_size: 1 << 16,
                stall_timeout_ms: 30_000,
                strategy: crate::swarm::Strategy::Mob,
                seed: 0xdead_beef,
                manifest: Manifest {
                    name: "obj".into(),
                    kind: ObjectKind::File,
                    total_len: Some(1 << 20),
                    entries: vec![],
                    mode: 0o600,
                    mtime: Some(Mtime { secs: 1, nanos: 2 }),
                },
                members: vec![
                    SwarmMember {
                        node: 0,
                        parent: NO_PARENT,
                        cluster: 0,
                        name: "source".into(),
                        addr: String::new(),
                    },
                    SwarmMember {
                        node: 1,
                        parent: 0,
                        cluster: 1,
                        name: "fra-1".into(),
                        addr: "127.0.0.1:7001".into(),
                    },
                ],
                sig: None,
            }))),
            Frame::SwarmSetup(SwarmSetup::Peer {
                session: 77,
                node: 3,
            }),
            Frame::SwarmSetup(SwarmSetup::Report {
                node: 3,
                received: vec![(0, 1 << 20), (4, 65_536)],
            }),
            Frame::SwarmSetup(SwarmSetup::Lost { node: 5 }),
            Frame::Error {
                reason: "bad".into(),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in samples() {
            let wire = f.encode().to_vec();
            let mut buf = BytesMut::from(&wire[..]);
            let back = decode_from(&mut buf, MAX_FRAME).unwrap().unwrap();
            assert_eq!(back, f);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn partial_input_waits_for_more() {
        let wire = samples()[5].encode().to_vec();
        for cut in 0..wire.len() {
            let mut buf = BytesMut::from(&wire[..cut]);
            assert_eq!(decode_from(&mut buf, MAX_FRAME), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn every_truncation_of_a_body_is_an_error_not_a_panic() {
        for f in samples() {
            let wire = f.encode().to_vec();
            let body = &wire[4..];
            for cut in 0..body.len() {
                let res = Frame::decode(Bytes::copy_from_slice(&body[..cut]));
                // A chunk's data is open-ended, so a cut inside it is a shorter chunk.
                if matches!(f, Frame::Chunk(_)) && cut >= 1 + 8 + 64 {
                    continue;
                }
                if let Frame::Striped { inner, .. } = &f {
                    if matches!(**inner, Frame::Chunk(_)) && cut >= 1 + 8 + 1 + 8 + 64 {
                        continue;
                    }
                }
                assert!(res.is_err(), "{} cut at {cut} decoded", f.kind());
            }
        }
    }

    #[test]
    fn striped_frames_do_not_nest() {
        let inner = Frame::Striped {
            seq: 1,
            inner: Box::new(Frame::Got { seq: 0 }),
        };
        let twice = Frame::Striped {
            seq: 2,
            inner: Box::new(inner),
        };
        let wire = twice.encode().to_vec();
        assert_eq!(
            Frame::decode(Bytes::copy_from_slice(&wire[4..])),
            Err(WireError::BadValue("Striped", "nested"))
        );
    }

    #[test]
    fn hostile_lengths_are_refused() {
        let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
        assert!(matches!(
            decode_from(&mut buf, MAX_FRAME),
            Err(WireError::TooLarge { .. })
        ));
        let mut buf = BytesMut::from(&[0u8, 0, 0, 0][..]);
        assert_eq!(decode_from(&mut buf, MAX_FRAME), Err(WireError::Empty));
        // An Open whose entry count claims 2^32-1 entries in a few bytes.
        let mut body = vec![T_OPEN];
        body.extend_from_slice(&[0; 8 + 4 + 4 + 4]);
        body.extend_from_slice(&0u32.to_be_bytes()); // empty cc
        body.extend_from_slice(&0u32.to_be_bytes()); // empty name
        body.extend_from_slice(&[0, 0]);
        body.extend_from_slice(&[0, 0, 0, 0, 0]); // mode, no mtime
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            Frame::decode(Bytes::from(body)),
            Err(WireError::Truncated("Open"))
        );
        // A swarm set-up whose member count claims 2^32-1 members in a few bytes.
        let mut body = vec![T_SWARM_SETUP, S_SETUP_OPEN];
        body.extend_from_slice(&[0; 8 + 4 + 4 + 4]);
        body.push(2); // mob
        body.extend_from_slice(&[0; 8]);
        body.extend_from_slice(&0u32.to_be_bytes()); // empty name
        body.extend_from_slice(&[0, 0]); // file, no length
        body.extend_from_slice(&[0, 0, 0, 0, 0]); // mode, no mtime
        body.extend_from_slice(&0u32.to_be_bytes()); // no entries
        body.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            Frame::decode(Bytes::from(body)),
            Err(WireError::Truncated("SwarmSetup"))
        );
        for bad in [&[T_SWARM_SETUP, 0x09][..], &[T_SWARM_SETUP][..]] {
            assert!(Frame::decode(Bytes::copy_from_slice(bad)).is_err());
        }
        let mut body = Frame::SwarmSetup(SwarmSetup::Peer {
            session: 1,
            node: 1,
        })
        .encode()
        .to_vec()[4..]
            .to_vec();
        body.push(0);
        assert_eq!(
            Frame::decode(Bytes::from(body)),
            Err(WireError::Trailing("SwarmSetup", 1))
        );
        assert_eq!(
            Frame::decode(Bytes::from_static(&[0x66])),
            Err(WireError::UnknownType(0x66))
        );
        assert_eq!(
            Frame::decode(Bytes::from_static(b"\x01GET / HTTP/1.1")),
            Err(WireError::BadMagic)
        );
    }

    fn decode_manifest(b: BytesMut) -> Result<Manifest, WireError> {
        Reader {
            b: b.freeze(),
            what: "Open",
        }
        .manifest()
    }

    #[test]
    fn manifest_entries_decode_strictly() {
        let link = |target: &str| Manifest {
            name: "d".into(),
            kind: ObjectKind::Dir,
            total_len: Some(0),
            entries: vec![Entry {
                path: "sub/l".into(),
                kind: EntryKind::Symlink(target.into()),
                len: 0,
                mode: 0o777,
                mtime: Some(Mtime { secs: 1, nanos: 2 }),
            }],
            mode: 0o755,
            mtime: None,
        };
        let m = link("../x");
        let mut b = BytesMut::new();
        put_manifest(&mut b, &m);
        let good = b.clone();
        assert_eq!(decode_manifest(b), Ok(m));
        // An escaping target decodes (the decoder is syntax) and validation refuses it.
        let mut b = BytesMut::new();
        put_manifest(&mut b, &link("../../x"));
        assert!(decode_manifest(b).unwrap().validate().is_err());
        // The entry's kind byte, then its mtime's nanoseconds, made impossible. Layout:
        // name(4+1) kind(1) len(1+8) mode(4) mtime(1) count(4) | path(4+5) kind ...
        let kind_at = 5 + 1 + 9 + 4 + 1 + 4 + 9;
        let mut b = good.clone();
        b[kind_at] = 3;
        assert_eq!(
            decode_manifest(b),
            Err(WireError::BadValue("Open", "unknown entry kind"))
        );
        let nanos_at = kind_at + 1 + 8 + 4 + 1 + 8;
        let mut b = good.clone();
        b[nanos_at..nanos_at + 4].copy_from_slice(&1_000_000_000u32.to_be_bytes());
        assert!(matches!(decode_manifest(b), Err(WireError::BadValue(..))));
        let mut b = good.clone();
        b[nanos_at - 9] = 2; // the mtime flag
        assert!(matches!(decode_manifest(b), Err(WireError::BadValue(..))));
        // A symlink's target cut short.
        let cut = good.len() - 1;
        assert!(decode_manifest(good.clone().split_to(cut)).is_err());
    }

    #[test]
    fn random_garbage_never_panics() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for _ in 0..20_000 {
            let n = rng.gen_range(0..64);
            let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
            if !v.is_empty() && rng.gen_bool(0.7) {
                v[0] = [
                    T_HELLO,
                    T_NOISE,
                    T_OPEN,
                    T_CHUNK,
                    T_FAILED,
                    T_JOIN,
                    T_STRIPED,
                    T_SWARM_SETUP,
                ][rng.gen_range(0..8)];
            }
            let _ = Frame::decode(Bytes::from(v));
        }
    }
}
