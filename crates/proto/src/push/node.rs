//! The push-relay state machine: one per node per session, the source included.
//!
//! A [`Node`] has one upstream (the local input at the source, the parent link at a relay)
//! and any number of child links. It never touches a socket, a file or a clock:
//!
//! - inputs: [`Node::handle_frame`], [`Node::handle_input`] / [`Node::handle_input_end`]
//!   (source), [`Node::handle_stored`] / [`Node::handle_store_failed`] /
//!   [`Node::handle_finalized`] (the local copy), [`Node::handle_link_closed`] and
//!   [`Node::handle_timeout`], each with `now`;
//! - outputs: [`Node::poll_transmit`] per link (called when that link can take a frame, which is
//!   how a slow socket back-pressures the node), [`Node::poll_event`], [`Node::wants_input`]
//!   (whether the driver may read more from upstream) and [`Node::poll_timeout`].
//!
//! # Flow control and the slow-receiver policy
//! A node keeps each chunk in memory until every live child has acknowledged it and it is
//! stored locally; it reads upstream only while that buffer is under its byte budget. A slow
//! child therefore slows its parent, and through it the source: the session moves at the pace
//! of its slowest live receiver, with at most one budget of slack per relay. A child whose
//! acknowledgements do not advance for the session's stall timeout while it has chunks
//! outstanding is cut off: it alone is reported failed, its children are adopted by this node
//! (see `node/adopt.rs`: they resume from what they hold), and the rest of the session goes on at full
//! speed. Because a stalled node's ancestors notice only after their own buffers fill, the
//! deepest culprit is always the one cut. A child whose connection closes (its process died) is
//! treated the same way at once. A child that holds the others back (the buffer is full, its
//! acknowledgement is the lowest and has not moved for [`NodeConfig::lag_timeout`], another
//! consumer is ahead) is let go the same way, long before the stall timeout.
//!
//! # Resuming
//! A receiver's first frame is `Have`: what it kept from an earlier session of the same object.
//! Nothing is sent to a child before its `Have`, and then only what it lacks (see `node/held.rs`).
//!
//! # Repair
//! A chunk that fails verification is dropped and requested again from the parent with
//! `Request`, which also serves any later pull strategy. Requests are repeated if unanswered.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::auth::{Keys, SignedError};
use crate::chunkmap::ChunkMap;
use crate::manifest::{Manifest, ManifestError};
use crate::tree::{NodeId, Tree};
use crate::wire::{Chunk, End, Frame, Member, Open, SessionId, SourceSig};

mod adopt;
mod config;
mod cut;
mod held;
mod internals;
mod members;
mod outputs;
mod parts;
pub mod replan;
pub use config::{silent_period, NodeConfig, KEEPALIVE, SILENT_RTTS, UP_KEEPALIVE};
pub use cut::{CUT_AFTER_CORRUPT, MAX_REJECTED_REPORTS};
pub use held::LOAD_AHEAD;
pub use members::Named;
use members::{check_below, check_chunk_size, children_of, new_child, subtree};

/// Session-wide settings chosen by the source.
#[derive(Debug, Clone)]
pub struct SessionParams {
    /// Session identifier.
    pub session: SessionId,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// A child without progress for this long is cut off.
    pub stall_timeout: Duration,
    /// TCP congestion control for every hop (empty: the system default).
    pub cc: String,
    /// What is sent.
    pub manifest: Manifest,
    /// For a tree of a balanced send: the stripe this session carries.
    pub stripe: Option<Box<crate::wire::StripeInfo>>,
    /// How every edge is carried (connections per edge, scheduler).
    pub edges: crate::wire::EdgeMode,
}

/// Smallest and largest chunk sizes accepted.
pub const CHUNK_SIZE_RANGE: std::ops::RangeInclusive<u32> = 4096..=(16 << 20);

/// Which link of a node a frame came from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// Towards the source.
    Parent,
    /// The k-th child, in [`Node::children`] order.
    Child(usize),
}

/// Something the driver must act on or may report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Store these verified bytes at `offset` of the local copy, then call
    /// [`Node::handle_stored`]. Emitted in index order.
    Deliver {
        /// Chunk index.
        index: u64,
        /// Byte offset in the object.
        offset: u64,
        /// The bytes.
        data: Bytes,
        /// Their BLAKE3 hash, verified: the local copy's map records it without hashing the
        /// bytes again.
        hash: [u8; 32],
    },
    /// Every chunk is stored and the end is known: move the copy into place, then call
    /// [`Node::handle_finalized`].
    Complete {
        /// Length of the object.
        total_len: u64,
    },
    /// A node's verified, stored prefix grew (reported at the source for every node).
    Progress {
        /// The node.
        node: NodeId,
        /// Chunks stored.
        upto: u64,
    },
    /// A node has the whole object in place.
    NodeDone {
        /// The node.
        node: NodeId,
        /// Chunk bytes the session moved to it (0 for a copy it already held).
        received: u64,
    },
    /// A node's answer to its `Open` (at the source, for every node): what it already held.
    Held {
        /// The node.
        node: NodeId,
        /// Chunks it held, verified, from an earlier session of the same object.
        chunks: u64,
        /// It held an identical copy in place: nothing moves to it.
        complete: bool,
    },
    /// Read chunk `index` (`len` bytes at `offset`) back from the local copy and hand it to
    /// [`Node::handle_loaded`] (or [`Node::handle_load_failed`]): a child lacks a chunk that
    /// this node held before the session, so its parent never sent it.
    Load {
        /// Chunk index.
        index: u64,
        /// Byte offset in the object.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A node failed and will not finish.
    NodeFailed {
        /// The node.
        node: NodeId,
        /// Why.
        reason: String,
    },
    /// A chunk failed verification and was requested again.
    Corrupt {
        /// Chunk index.
        index: u64,
        /// What was wrong with it.
        reason: String,
    },
    /// At the source: node `node` rejected chunk `index` from its parent `from` (0: the
    /// source), which failed verification: `from` tampered with it, or its link corrupted it.
    Rejected {
        /// The node that rejected it (the first honest hop).
        node: NodeId,
        /// The node that sent it.
        from: NodeId,
        /// Chunk index.
        index: u64,
    },
    /// The driver must close this link: its peer was cut off, or (a child) every node below it
    /// has finished or failed.
    CloseLink(Link),
    /// The driver must connect to child `k` (one adopted from a dead child, see
    /// [`Node::handle_link_closed`]) and send it [`Node::open_for`]`(k)`.
    Connect(usize),
    /// This node cannot go on; the driver closes everything.
    Aborted {
        /// Why.
        reason: String,
    },
}

/// A protocol violation by a peer: the driver closes that link with an `Error` frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeError {
    /// A frame that this link may not carry in this state.
    #[error("unexpected {frame} frame from {link:?}")]
    Unexpected {
        /// The frame's kind.
        frame: &'static str,
        /// Where it came from.
        link: Link,
    },
    /// A child reported about a node outside its subtree.
    #[error("{link:?} reported on node {node}, which is not below it")]
    NotInSubtree {
        /// Where it came from.
        link: Link,
        /// The node it named.
        node: u32,
    },
    /// A chunk or end that contradicts the session's geometry.
    #[error("{0}")]
    Geometry(String),
    /// The `End` frame did not authenticate.
    #[error("end of object failed authentication")]
    BadEnd,
    /// The session set-up is not acceptable.
    #[error("invalid session set-up: {0}")]
    BadOpen(String),
    /// The manifest is not acceptable.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The set-up or the end lacks the source's signature where this host requires it.
    #[error(transparent)]
    Source(#[from] SignedError),
}

/// A child link's state.
#[derive(Debug)]
pub struct Child {
    /// The child's node id.
    pub node: NodeId,
    /// The child's display name.
    pub name: String,
    /// The child's agent address.
    pub addr: String,
    /// The child's subtree, child first (what its `Open` carries).
    members: Vec<Member>,
    /// Next chunk to send in order.
    next: u64,
    /// The child's own acknowledged prefix.
    acked: u64,
    /// Chunks it asked for again.
    requests: VecDeque<u64>,
    end_sent: bool,
    /// Last time its acknowledgements advanced (or it was created).
    last_progress: Instant,
    /// Last time any frame came from it (or it was created).
    last_heard: Instant,
    /// Its connection's round trip as the driver measured it ([`Node::handle_child_rtt`]);
    /// `None` until then. It lengthens the silence it is allowed ([`silent_period`]).
    rtt: Option<Duration>,
    /// Keepalive: a frame went to it since `quiet_since`, the last check (set by
    /// [`Node::poll_transmit`], cleared by [`Node::handle_timeout`]).
    sent: bool,
    quiet_since: Instant,
    /// Nothing went to it for [`KEEPALIVE`]: the next transmit is [`Frame::Idle`].
    keepalive_due: bool,
    alive: bool,
    /// Nodes of its subtree that have neither finished nor failed.
    unresolved: BTreeSet<NodeId>,
    /// What it held before the session, from its `Have` (`None`: not heard yet, and nothing
    /// is sent to it before, so that nothing it holds moves again).
    held: Option<ChunkMap>,
    /// Chunks to read back from the local copy for it (asked for, or loaded and waiting in
    /// `loaded`); at most [`LOAD_AHEAD`] at a time.
    loads: BTreeSet<u64>,
    loaded: BTreeMap<u64, Chunk>,
    /// The chunk it is being sent in parts, and how far (`node/parts.rs`).
    cursor: Option<parts::Cursor>,
    /// Corrupt copies it sent, as the nodes below report them (`node/cut.rs`).
    sent_corrupt: cut::SentCorrupt,
}

impl Child {
    /// Every node of its subtree has finished or failed (or it was cut off): nothing more is
    /// expected over its link, so the link closing is no news.
    pub fn is_resolved(&self) -> bool {
        !self.alive || self.unresolved.is_empty()
    }
}

/// The local copy's lifecycle at a relay.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Local {
    /// Chunks are being stored.
    Storing,
    /// Complete was emitted; waiting for the driver to finalize.
    Finalizing,
    /// In place.
    Done,
    /// Given up (disk full, ...); the node still relays.
    Failed,
}

/// Where a node's chunks come from.
// One per node: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Upstream {
    /// The source reads local input.
    Input { next: u64, len: u64, done: bool },
    /// A relay's parent link.
    Parent {
        last_heard: Instant,
        /// Chunk index -> when it was last requested.
        requested: BTreeMap<u64, Instant>,
        /// Chunks dropped for lack of memory, to be requested once there is room.
        dropped: BTreeSet<u64>,
        /// When to look at `dropped` again if memory does not free up first.
        dropped_retry: Option<Instant>,
        /// Frames waiting to go up: requests, reports, acks (coalesced per node).
        up_requests: VecDeque<u64>,
        up_reports: VecDeque<Frame>,
        up_acks: BTreeMap<u32, u64>,
        local: Local,
        /// Chunks in the local copy (held from an earlier session, or stored in this one):
        /// what can be read back for a child.
        stored: ChunkMap,
        stored_bytes: u64,
        /// The `Have` has gone up (it is the first frame on the link).
        have_sent: bool,
        /// What the `Have` says ([`Node::resume`]).
        resumed: Option<(ChunkMap, bool)>,
        /// Chunk bytes taken from the parent in this session.
        received: u64,
    },
}

/// One node of a push session.
#[derive(Debug)]
pub struct Node {
    id: NodeId,
    params: SessionParams,
    keys: Keys,
    cfg: NodeConfig,
    upstream: Upstream,
    /// Verified chunks received (source: produced).
    have: ChunkMap,
    /// Chunks held in memory for children or the local copy.
    buffer: BTreeMap<u64, Chunk>,
    /// Chunks arriving in parts, with their verified prefixes; their room in the budget is
    /// counted in `buffered_bytes` from their `Head` on.
    arriving: BTreeMap<u64, parts::Arriving>,
    /// The group lists of buffered chunks that have one, to send them on in parts; evicted
    /// with them.
    groups_of: BTreeMap<u64, Vec<[u8; 32]>>,
    buffered_bytes: usize,
    /// Highest `buffered_bytes` seen (for reports and tests).
    peak_buffered: usize,
    /// Next chunk index to hand to the local copy.
    deliver_next: u64,
    end: Option<End>,
    children: Vec<Child>,
    events: VecDeque<Event>,
    /// This node's access uplink in kbit/s from its `Open` or [`Node::set_uplink_kbps`] (0: not
    /// known).
    uplink_kbps: u32,
    /// Chunks being read back from the local copy ([`Event::Load`] emitted, no answer yet).
    loading: BTreeSet<u64>,
    /// Chunks held on disk that could not be read back: fetched from the parent instead.
    refetch: BTreeSet<u64>,
    /// Source: the input can be read again ([`Node::set_rereadable`]).
    reread: bool,
    /// The latest `now` an input brought (for what [`Node::poll_transmit`] starts).
    clock: Instant,
    /// A relay: when a frame last went to its parent, and whether an [`UP_KEEPALIVE`] is due.
    up_last: Instant,
    up_idle_due: bool,
    /// A relay: its parent's node id (0: the source).
    parent_node: u32,
    /// Corrupt copies received and reported (`node/cut.rs`).
    rejections: cut::Rejections,
    /// [`NodeConfig::tamper_every`]: (child link, chunk) already tampered with once.
    tampered: BTreeSet<(usize, u64)>,
    /// The source's signature of the set-up, passed on in every child's `Open`.
    open_sig: Option<Box<SourceSig>>,
}

impl Node {
    /// The source of a session over `tree`. `names[i]` names node `i + 1`.
    pub fn source(
        params: SessionParams,
        keys: Keys,
        cfg: NodeConfig,
        tree: &Tree,
        names: &[Named],
        now: Instant,
    ) -> Result<Self, NodeError> {
        params.manifest.validate()?;
        check_chunk_size(params.chunk_size)?;
        if names.len() + 1 != tree.len() {
            return Err(NodeError::BadOpen(format!(
                "tree has {} receivers but {} hosts were named",
                tree.len() - 1,
                names.len()
            )));
        }
        let all: Vec<Member> = (1..tree.len())
            .map(|i| Member {
                node: i as u32,
                parent: tree.parent(i).unwrap_or(0) as u32,
                name: names[i - 1].name.clone(),
                addr: names[i - 1].addr.clone(),
                uplink_kbps: names[i - 1].uplink_kbps,
            })
            .collect();
        let mut node = Self::new(
            0,
            params,
            keys,
            cfg,
            Upstream::Input {
                next: 0,
                len: 0,
                done: false,
            },
            now,
        );
        node.children = children_of(0, &all, now);
        node.open_sig = node.keys.sign_open(
            node.params.session,
            node.params.chunk_size,
            &node.params.manifest,
            node.params.stripe.as_deref(),
        );
        Ok(node)
    }

    /// A relay (every receiver is one, with or without children) set up by its parent's `Open`.
    /// Where `keys` require the source's signatures, the `Open` must carry one, and from then
    /// on only that source's signatures count ([`Keys::for_source`]).
    pub fn relay(
        open: &Open,
        keys: Keys,
        cfg: NodeConfig,
        now: Instant,
    ) -> Result<Self, NodeError> {
        let keys = match keys.verify_open(open)? {
            Some(source) => keys.for_source(source),
            None => keys,
        };
        open.manifest.validate()?;
        check_chunk_size(open.chunk_size)?;
        let me = open.node;
        match open.members.first() {
            Some(m) if m.node == me && me != 0 => {}
            _ => {
                return Err(NodeError::BadOpen(
                    "first member must be the recipient".into(),
                ))
            }
        }
        let ids: BTreeSet<u32> = open.members.iter().map(|m| m.node).collect();
        if ids.len() != open.members.len() {
            return Err(NodeError::BadOpen("a node appears twice".into()));
        }
        for m in &open.members[1..] {
            if !ids.contains(&m.parent) {
                return Err(NodeError::BadOpen(format!(
                    "node {} has parent {} outside the subtree",
                    m.node, m.parent
                )));
            }
        }
        let params = SessionParams {
            session: open.session,
            chunk_size: open.chunk_size,
            stall_timeout: Duration::from_millis(open.stall_timeout_ms as u64),
            cc: open.cc.clone(),
            manifest: open.manifest.clone(),
            stripe: open.stripe.clone(),
            edges: open.edges,
        };
        let mut node = Self::new(
            me as NodeId,
            params,
            keys,
            cfg,
            Upstream::Parent {
                last_heard: now,
                requested: BTreeMap::new(),
                dropped: BTreeSet::new(),
                dropped_retry: None,
                up_requests: VecDeque::new(),
                up_reports: VecDeque::new(),
                up_acks: BTreeMap::new(),
                local: Local::Storing,
                stored: ChunkMap::new(),
                stored_bytes: 0,
                have_sent: false,
                resumed: None,
                received: 0,
            },
            now,
        );
        node.children = children_of(me, &open.members[1..], now);
        node.uplink_kbps = open.members[0].uplink_kbps;
        node.parent_node = open.members[0].parent;
        node.open_sig = open.sig.clone();
        // Reject a subtree with nodes not reachable from the recipient (a cycle in the Open).
        let reachable: usize = node.children.iter().map(|c| c.members.len()).sum();
        if reachable + 1 != open.members.len() {
            return Err(NodeError::BadOpen(
                "subtree is not a tree below the recipient".into(),
            ));
        }
        Ok(node)
    }

    fn new(
        id: NodeId,
        params: SessionParams,
        keys: Keys,
        cfg: NodeConfig,
        up: Upstream,
        now: Instant,
    ) -> Self {
        Self {
            id,
            params,
            keys,
            cfg,
            upstream: up,
            have: ChunkMap::new(),
            buffer: BTreeMap::new(),
            arriving: BTreeMap::new(),
            groups_of: BTreeMap::new(),
            buffered_bytes: 0,
            peak_buffered: 0,
            deliver_next: 0,
            end: None,
            children: Vec::new(),
            events: VecDeque::new(),
            uplink_kbps: 0,
            loading: BTreeSet::new(),
            refetch: BTreeSet::new(),
            reread: false,
            clock: now,
            up_last: now,
            up_idle_due: false,
            parent_node: 0,
            rejections: Default::default(),
            tampered: BTreeSet::new(),
            open_sig: None,
        }
    }

    /// This node's access uplink in kbit/s (a relay: from its `Open`; the source: from
    /// [`Node::set_uplink_kbps`]); 0 where not known.
    pub fn uplink_kbps(&self) -> u32 {
        self.uplink_kbps
    }

    /// Declares the source's own uplink (kbit/s; 0: not known); a relay's comes in its `Open`.
    pub fn set_uplink_kbps(&mut self, kbps: u32) {
        self.uplink_kbps = kbps;
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Session settings.
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// The child links, in link order.
    pub fn children(&self) -> &[Child] {
        &self.children
    }

    /// The `Open` to send to child `k` once connected.
    pub fn open_for(&self, k: usize) -> Open {
        let c = &self.children[k];
        Open {
            session: self.params.session,
            node: c.node as u32,
            chunk_size: self.params.chunk_size,
            stall_timeout_ms: self.params.stall_timeout.as_millis().min(u32::MAX as u128) as u32,
            cc: self.params.cc.clone(),
            manifest: self.params.manifest.clone(),
            members: c.members.clone(),
            stripe: self.params.stripe.clone(),
            edges: self.params.edges,
            sig: self.open_sig.clone(),
        }
    }

    /// The keys this node verifies with: after a signed `Open`, bound to its source (a driver
    /// that verifies chunks itself uses these).
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Chunks verified so far.
    pub fn have(&self) -> &ChunkMap {
        &self.have
    }

    /// The end of the object, once known.
    pub fn end(&self) -> Option<End> {
        self.end
    }

    /// Highest number of chunk bytes held in memory at once.
    pub fn peak_buffered(&self) -> usize {
        self.peak_buffered
    }

    /// Chunk bytes held in memory now.
    pub fn buffered(&self) -> usize {
        self.buffered_bytes
    }

    // ----- inputs -------------------------------------------------------------------------

    /// Source only: the next piece of input, at most one chunk long (exactly one chunk unless
    /// it is the last). Hashes and authenticates it here.
    pub fn handle_input(&mut self, data: Bytes, now: Instant) {
        let Upstream::Input { next, .. } = &self.upstream else {
            return;
        };
        let (chunk, cvs) = self.keys.seal_in_groups(self.params.session, *next, data);
        self.handle_sealed_input(chunk, cvs, now)
            .expect("a chunk sealed here has the next index and a valid size");
    }

    /// Source only: the next chunk, already sealed with [`Keys::seal_in_groups`] (so a driver
    /// can hash on its reading thread, off the event loop), and its group list (empty if it
    /// was sealed whole with [`Keys::seal`]: it then goes to children whole). It must carry
    /// the next index.
    pub fn handle_sealed_input(
        &mut self,
        chunk: Chunk,
        cvs: Vec<[u8; 32]>,
        now: Instant,
    ) -> Result<(), NodeError> {
        self.clock = now;
        let cs = self.params.chunk_size as usize;
        let Upstream::Input { next, len, done } = &mut self.upstream else {
            return Err(NodeError::Geometry("input given to a relay".into()));
        };
        if *done || chunk.index != *next || chunk.data.len() > cs || chunk.data.is_empty() {
            return Err(NodeError::Geometry(format!(
                "input chunk {} of {} bytes; expected chunk {} of at most {cs} bytes",
                chunk.index,
                chunk.data.len(),
                next
            )));
        }
        *next += 1;
        *len += chunk.data.len() as u64;
        self.have.insert(chunk.index);
        self.keep_groups(chunk.index, cvs);
        self.hold(chunk, now);
        Ok(())
    }

    /// Source only: the input ended.
    pub fn handle_input_end(&mut self, _now: Instant) {
        if let Upstream::Input { next, len, done } = &mut self.upstream {
            *done = true;
            self.end = Some(self.keys.seal_end(self.params.session, *next, *len));
        }
    }

    /// A frame arrived on `link`. An error is a protocol violation by that peer: the driver
    /// sends it an `Error` frame and closes the link (a child's subtree is then failed via
    /// [`Node::handle_link_closed`]).
    pub fn handle_frame(
        &mut self,
        link: Link,
        frame: Frame,
        now: Instant,
    ) -> Result<(), NodeError> {
        self.clock = now;
        match link {
            Link::Parent => self.handle_parent_frame(frame, now),
            Link::Child(k) => self.handle_child_frame(k, frame, now),
        }
    }

    fn handle_parent_frame(&mut self, frame: Frame, now: Instant) -> Result<(), NodeError> {
        let Upstream::Parent { last_heard, .. } = &mut self.upstream else {
            return Err(NodeError::Unexpected {
                frame: frame.kind(),
                link: Link::Parent,
            });
        };
        *last_heard = now;
        match frame {
            Frame::Chunk(c) => self.handle_chunk(c, false, now),
            Frame::Head(h) => self.handle_head(h, now),
            Frame::Part(p) => self.handle_part(p, now),
            Frame::End(e) => {
                if !self.keys.verify_end(self.params.session, &e) {
                    return Err(NodeError::BadEnd);
                }
                self.keys.verify_end_source(self.params.session, &e)?;
                self.check_end(&e)?;
                self.end = Some(e);
                self.request_missing(now);
                self.maybe_complete();
                Ok(())
            }
            Frame::Error { reason } => {
                self.events.push_back(Event::Aborted {
                    reason: format!("parent reported an error: {reason}"),
                });
                Ok(())
            }
            // Only `last_heard`, above, had to change.
            Frame::Idle => Ok(()),
            other => Err(NodeError::Unexpected {
                frame: other.kind(),
                link: Link::Parent,
            }),
        }
    }

    /// A chunk from the parent that the driver has already checked with [`Keys::verify`] (it
    /// hashes on the thread that read the bytes, while they are still in cache). Anything the
    /// driver has not verified goes through [`Node::handle_frame`].
    pub fn handle_verified_chunk(&mut self, c: Chunk, now: Instant) -> Result<(), NodeError> {
        self.clock = now;
        let Upstream::Parent { last_heard, .. } = &mut self.upstream else {
            return Err(NodeError::Unexpected {
                frame: "Chunk",
                link: Link::Parent,
            });
        };
        *last_heard = now;
        self.handle_chunk(c, true, now)
    }

    fn handle_chunk(&mut self, c: Chunk, verified: bool, now: Instant) -> Result<(), NodeError> {
        self.check_geometry(c.index, c.data.len())?;
        if self.have.contains(c.index) && !self.refetch.contains(&c.index) {
            return Ok(()); // a duplicate (a repair that crossed the original)
        }
        if let Err(e) = match verified {
            true => Ok(()),
            false => self.keys.verify(self.params.session, &c),
        } {
            self.corrupt(c.index, e.to_string(), now);
            return Ok(());
        }
        if self.take_arriving(c.index) || self.admit(c.index, c.data.len(), now) {
            self.accept(c, now);
        }
        Ok(())
    }

    /// A chunk (or a chunk's head) of `len` bytes at `index` fits the session's geometry.
    fn check_geometry(&self, index: u64, len: usize) -> Result<(), NodeError> {
        let cs = self.params.chunk_size as usize;
        if len > cs || len == 0 {
            return Err(NodeError::Geometry(format!(
                "chunk {index} has {len} bytes; chunk size is {cs}"
            )));
        }
        match self.known_chunks() {
            Some(n) if index >= n => Err(NodeError::Geometry(format!(
                "chunk {index} is past the end ({n} chunks)"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether a verified chunk of `len` bytes at `index` is taken into memory now; if not,
    /// it is pulled again once there is room.
    fn admit(&mut self, index: u64, len: usize, now: Instant) -> bool {
        let over_budget = self.buffered_bytes + len > self.cfg.buffer_budget;
        let over_cap = self.buffered_bytes + len > self.hard_cap();
        // A chunk a child is part-way through (its parts stopped when this node dropped a
        // corrupt one) is taken whatever the budget: that child gets nothing else until it
        // is whole. At most one such chunk per child.
        let lowest = index == self.have.prefix() || self.mid_chunk_on(index);
        let Upstream::Parent {
            requested,
            dropped,
            dropped_retry,
            ..
        } = &mut self.upstream
        else {
            unreachable!("chunks come only from a parent")
        };
        let was_requested = requested.remove(&index).is_some();
        // Memory: new chunks fit in the budget; repairs may use the half above it; the lowest
        // missing chunk is always taken, since it is what lets the buffer drain. Anything else
        // is dropped and pulled again once there is room, so the peak is the hard cap plus one
        // chunk whatever the peers do.
        let take = !over_budget || (was_requested && (!over_cap || lowest));
        if take {
            dropped.remove(&index);
        } else if was_requested {
            requested.insert(index, now);
        } else {
            dropped.insert(index);
            dropped_retry.get_or_insert(now + self.cfg.request_timeout);
        }
        take
    }

    /// A verified chunk, taken: held for the children and the local copy.
    fn accept(&mut self, c: Chunk, now: Instant) {
        self.refetch.remove(&c.index);
        if let Upstream::Parent {
            received,
            requested,
            ..
        } = &mut self.upstream
        {
            requested.remove(&c.index);
            *received += c.data.len() as u64;
        }
        self.have.insert(c.index);
        self.hold(c, now);
        self.deliver_ready();
    }

    fn handle_child_frame(
        &mut self,
        k: usize,
        frame: Frame,
        now: Instant,
    ) -> Result<(), NodeError> {
        let link = Link::Child(k);
        let child = self.children.get_mut(k).ok_or(NodeError::Unexpected {
            frame: frame.kind(),
            link,
        })?;
        if !child.alive {
            return Ok(()); // already cut off; late frames are ignored
        }
        child.last_heard = now;
        match frame {
            Frame::Ack { node, upto } => {
                check_below(child, node, link)?;
                if node as NodeId == child.node && upto > child.acked {
                    // What it held before counts as sent: its ack may cover those chunks.
                    if let Some(h) = &child.held {
                        while h.contains(child.next) {
                            child.next += 1;
                        }
                    }
                    child.acked = upto.min(child.next);
                    child.last_progress = now;
                    self.evict();
                }
                self.report(Frame::Ack { node, upto });
            }
            Frame::Done { node, received } => {
                check_below(child, node, link)?;
                self.resolve_below(k, node as NodeId);
                self.report(Frame::Done { node, received });
            }
            Frame::Failed { node, reason } => {
                check_below(child, node, link)?;
                self.resolve_below(k, node as NodeId);
                self.report(Frame::Failed { node, reason });
            }
            Frame::Rejected { node, from, index } => {
                check_below(child, node, link)?;
                self.handle_rejected(k, node, from, index, now);
            }
            Frame::Have {
                node,
                complete,
                ranges,
            } => {
                check_below(child, node, link)?;
                self.handle_have(k, node, complete, ranges, now)?;
            }
            // Still checking what it holds before its `Have`: alive.
            Frame::Idle if child.held.is_none() => child.last_progress = now,
            // A relay's keepalive (`UP_KEEPALIVE`): `last_heard`, above, is all it changes.
            Frame::Idle => {}
            Frame::Request { index } => {
                if !child.requests.contains(&index) && child.requests.len() < 1024 {
                    child.requests.push_back(index);
                }
            }
            Frame::Error { reason } => {
                let name = child.name.clone();
                self.lose_child(k, format!("{name} reported an error: {reason}"), now);
            }
            other => {
                return Err(NodeError::Unexpected {
                    frame: other.kind(),
                    link,
                })
            }
        }
        Ok(())
    }

    /// Node `node` of child `k`'s subtree has finished or failed. Once the last one has, the
    /// link to `k` carries nothing more and is closed at once: a finished receiver waits for
    /// its parent to close before it ends (`Driver::linger`), and a chain whose links closed
    /// only when the source ended kept its last receiver a round trip of the whole chain
    /// after its copy was in place (0.24 s on the lab's `star-4-rtt50`, a chain of 4).
    fn resolve_below(&mut self, k: usize, node: NodeId) {
        let c = &mut self.children[k];
        if c.unresolved.remove(&node) && c.unresolved.is_empty() {
            self.events.push_back(Event::CloseLink(Link::Child(k)));
        }
    }

    /// The driver stored chunk `index` of the local copy.
    pub fn handle_stored(&mut self, index: u64, now: Instant) {
        self.clock = now;
        let len = self.buffer.get(&index).map_or(0, |c| c.data.len() as u64);
        let Upstream::Parent {
            stored,
            stored_bytes,
            local,
            ..
        } = &mut self.upstream
        else {
            return;
        };
        if *local != Local::Storing || !stored.insert(index) {
            return;
        }
        *stored_bytes += len;
        self.ack_self();
        self.evict();
        self.request_dropped(now);
        self.maybe_complete();
    }

    /// The driver could not store the local copy (disk full, permission, ...). The node keeps
    /// relaying to its children; the source is told this node failed.
    pub fn handle_store_failed(&mut self, reason: String, _now: Instant) {
        if let Upstream::Parent { local, .. } = &mut self.upstream {
            if matches!(local, Local::Storing | Local::Finalizing) {
                *local = Local::Failed;
                self.report(Frame::Failed {
                    node: self.id as u32,
                    reason,
                });
                self.ack_self();
                self.evict();
            }
        }
    }

    /// The driver moved the complete copy into place (or failed to).
    pub fn handle_finalized(&mut self, result: Result<(), String>, _now: Instant) {
        let Upstream::Parent { local, .. } = &mut self.upstream else {
            return;
        };
        if *local != Local::Finalizing {
            return;
        }
        let frame = match result {
            Ok(()) => {
                *local = Local::Done;
                Frame::Done {
                    node: self.id as u32,
                    received: self.received_bytes(),
                }
            }
            Err(reason) => {
                *local = Local::Failed;
                Frame::Failed {
                    node: self.id as u32,
                    reason,
                }
            }
        };
        self.report(frame);
    }

    /// The driver measured child `k`'s round trip (its connection's handshake, or TCP's
    /// smoothed estimate): a child on a long path is allowed a longer silence before it counts
    /// as stopped ([`silent_period`]). The longest report wins, so a fast second connection of
    /// a spread edge does not shorten it.
    pub fn handle_child_rtt(&mut self, k: usize, rtt: Duration) {
        if let Some(c) = self.children.get_mut(k) {
            c.rtt = Some(c.rtt.map_or(rtt, |r| r.max(rtt)));
        }
    }

    /// A link closed (reset, EOF, timeout, or a protocol error the driver acted on).
    pub fn handle_link_closed(&mut self, link: Link, reason: String, now: Instant) {
        match link {
            Link::Child(k) => {
                if self.children.get(k).is_some_and(|c| c.alive) {
                    self.lose_child(k, reason, now);
                }
            }
            Link::Parent => {
                if !self.is_finished() && !self.local_resolved_and_fed() {
                    self.events.push_back(Event::Aborted {
                        reason: format!("lost the parent: {reason}"),
                    });
                }
            }
        }
    }
}
