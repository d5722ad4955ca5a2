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
//! `Pong`, `Probe`, `Probed`), multi-stream edges (`Attach` a connection to an edge, `Spread`
//! frames of the edge's sequence, `Got` back on the connection that carried one),
//! receiver-driven swarming (`Swarm`, see [`crate::swarm`]; its session set-up, peer
//! connections and reports are `SwarmSetup`), multicast control (`Mcast`) and `Error` for a
//! fatal protocol error.
//!
//! This module holds the frame type, the type codes and the dispatch; each exchange encodes
//! and decodes its own messages in its submodule (`handshake`, `tree`, `report`, `edge`,
//! `probe`, `swarm`, `mcast`), over the shared field codecs (`codec`, `manifest`). The swarm
//! and multicast messages are encoded by [`crate::swarm::msg`] and [`crate::mcast::msg`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

mod codec;
mod edge;
mod handshake;
mod manifest;
mod mcast;
mod probe;
mod report;
#[cfg(test)]
mod samples;
mod swarm;
#[cfg(test)]
mod tests;
mod tree;

use codec::Reader;
pub use edge::{EdgeMode, EdgeScheduler};
pub use manifest::object_id;
pub use probe::UNREACHABLE;
pub use swarm::{Strategy, SwarmMember, SwarmOpen, SwarmSetup, HASHES_PER_FRAME, NO_PARENT};
pub use tree::{Chunk, End, Head, Member, Open, Part, SourceSig, StripeInfo};

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
/// chunk; relays send `Idle` upwards too. 7: multicast datagrams are numbered and sealed
/// under a group key that the multicast `Open` carries; a swarm's set-up carries the root of
/// the pieces' hashes (signed) and the hashes follow it (`Hashes`); `Back` re-admits a lost
/// member. 8: the multicast `Open` carries the file's mtime (with its name, size and mode,
/// the object's identity) and a receiver that holds the object answers `Holds`. 9: feed
/// connections are encrypted like every other, the feed's `Accepted` carries the group key,
/// and feed datagrams are numbered and sealed (`BCF2`, [`crate::feed::seal`]). 10: shorter
/// datagram headers on both groups, 8 bytes less on a file's (`M3`), 16 less on a feed's data
/// and parity (`F3`, short forms of `Data` and `Parity`).
pub const VERSION: u16 = 10;

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
    /// A message of the Noise handshake (`bulkcast_runtime::secure`), after `Hello`.
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
    /// that every later frame to the child comes wrapped in [`Frame::Spread`].
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
    Spread {
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
    Swarm(crate::swarm::msg::SwarmMsg),
    /// Swarm sessions on the network: the source's set-up, the first frame of a connection
    /// between two members, a member's final report (see [`SwarmSetup`]).
    SwarmSetup(SwarmSetup),
    /// A multicast send's control message (see [`crate::mcast::msg`]).
    Mcast(crate::mcast::msg::McastMsg),
    /// A fatal error; the sender of this frame closes the connection after it.
    Error {
        /// Human-readable reason.
        reason: String,
    },
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
const T_SPREAD: u8 = 0x14;
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
            Frame::Spread { .. } => "Spread",
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
        let data = match self {
            Frame::Hello { .. }
            | Frame::Challenge { .. }
            | Frame::Auth { .. }
            | Frame::Refused { .. }
            | Frame::Noise { .. }
            | Frame::Join { .. } => handshake::encode(self, &mut b),
            Frame::Open(_)
            | Frame::Chunk(_)
            | Frame::Head(_)
            | Frame::Part(_)
            | Frame::End(_)
            | Frame::Idle
            | Frame::Request { .. }
            | Frame::Dial { .. } => tree::encode(self, &mut b),
            Frame::Ack { .. }
            | Frame::Done { .. }
            | Frame::Have { .. }
            | Frame::Failed { .. }
            | Frame::Rejected { .. } => report::encode(self, &mut b),
            Frame::Attach { .. } | Frame::Spread { .. } | Frame::Got { .. } => {
                edge::encode(self, &mut b)
            }
            Frame::Ping { .. }
            | Frame::Pong { .. }
            | Frame::Probe { .. }
            | Frame::Probed { .. }
            | Frame::BwProbe { .. }
            | Frame::BwResult { .. }
            | Frame::Sink
            | Frame::SinkReport { .. } => probe::encode(self, &mut b),
            Frame::Swarm(m) => swarm::encode_msg(m, &mut b),
            Frame::SwarmSetup(s) => swarm::encode_setup(s, &mut b),
            Frame::Mcast(m) => mcast::encode(m, &mut b),
            Frame::Error { reason } => {
                b.put_u8(T_ERROR);
                codec::put_str(&mut b, reason);
                Bytes::new()
            }
        };
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
            T_HELLO | T_CHALLENGE | T_AUTH | T_REFUSED | T_NOISE | T_JOIN => {
                handshake::decode(ty, &mut r)?
            }
            T_OPEN | T_CHUNK | T_CHUNK_SIGNED | T_HEAD | T_PART | T_END | T_END_SIGNED | T_IDLE
            | T_REQUEST | T_DIAL => tree::decode(ty, &mut r)?,
            T_ACK | T_DONE | T_HAVE | T_FAILED | T_REJECTED => report::decode(ty, &mut r)?,
            T_ATTACH | T_SPREAD | T_GOT => edge::decode(ty, &mut r)?,
            T_PING | T_PONG | T_PROBE | T_PROBED | T_BWPROBE | T_BWRESULT | T_SINK
            | T_SINKREPORT => probe::decode(ty, &mut r)?,
            T_SWARM => swarm::decode_msg(&mut r)?,
            T_SWARM_SETUP => swarm::decode_setup(&mut r)?,
            T_MCAST => mcast::decode(&mut r)?,
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
