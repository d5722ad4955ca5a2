//! Receiver-driven swarming: MOB, a BitTorrent-style baseline, and a tree+pull hybrid, over
//! the same chunks, verification and wire format as the push tree.
//!
//! One state machine, [`SwarmNode`], runs on every member of a session (the source
//! included); a [`Strategy`] picks the behaviour:
//!
//! - [`Strategy::TreePush`]: the planned tree alone. Every node pushes each piece it holds to
//!   each tree child, lowest index first; nothing is pulled. The baseline that every planned
//!   tree shares: its rate is fixed by the slowest edge, whatever changes later.
//! - [`Strategy::Swarm`]: BitTorrent as the MOB paper implemented it (section 2.5): random
//!   peers from the session's membership (no tracker), `Bitfield`/`Have`, `Interested`,
//!   requests for a random piece the peer has, `R = 5` outstanding per peer, tit-for-tat
//!   choking (the 4 best uploaders to us, or best downloaders from us once complete, are
//!   unchoked every 10 s, plus one optimistic unchoke every 30 s with newcomers three times as
//!   likely).
//! - [`Strategy::Mob`]: MOB (section 3.1), see below.
//! - [`Strategy::Hybrid`]: ours, see below.
//!
//! # MOB
//! 1. Each node connects to five random *local* nodes (same cluster); incoming connections
//!    are always accepted. 2. It connects to five random *global* peers among its rank-matched
//!    candidates ([`mob::Mobs::global_candidates`]; with four clusters there are three).
//! 3. Pieces of the node's *mob share* ([`mob::mob_share`]) are stolen from global peers,
//!    all others from local peers, `R = 5` requests pipelined per peer and always honoured.
//!    `Have(i)` goes to every local peer, and to a global peer only when i is in that peer's
//!    share, so one `Have` and one copy of each piece enter each cluster. The source sends a
//!    `Bitfield` to all its peers. 4. A node holding everything joins the completion phase:
//!    `Complete` travels up a binary tree over all members ([`SwarmMsg::Complete`]), `AllDone`
//!    comes back down, and every node serves until then.
//!
//! One departure: rule 3's requests are always honoured, so a request queued at a peer behind
//! a slow link waits there even once faster peers hold the piece (the paper's small root
//! cluster). A request that waited more than a second (`MOB_MOVE_AFTER`) moves to an idle
//! peer that has the piece, through a confirmed cancel ([`SwarmMsg::Cancelled`]), so that no
//! piece enters a cluster twice.
//!
//! One reading we had to make: taken literally, rule 3 deadlocks the source's own cluster
//! (its members' shares can only come from other clusters, which only get them from it). A
//! piece never has to *enter* the source's cluster, so there every piece is stolen from local
//! peers, and global peers are only served. A lost member's share is redistributed by
//! recomputing ranks over the live members ([`SwarmNode::handle_member_lost`]).
//!
//! # The hybrid
//! What bounds a broadcast here is a cut of WAN links ([`sim::broadcast_bound`]): in the
//! paper's "fast links" the source cluster's egress (A->B + A->C + A->D = 15.2 MB/s), and
//! the links into C carry exactly as much. Reaching it means every piece leaves the source's
//! cluster once, every link out of it and into every other cluster is busy all the time, and
//! every piece enters every cluster once: Balanced Multicasting's several trees, one per link
//! out of the source's cluster, but found by the traffic itself.
//!
//! - **The deal (push out of the source's cluster).** The source holds one *target* in each
//!   other cluster: the cluster's entry in the planned tree (or its first member). Whenever a
//!   target's connection has room, the source pushes it the lowest piece not yet dealt to
//!   anyone, so each piece leaves the source's cluster exactly once and each link gets pieces
//!   at the rate it drains (TCP back-pressure does the balancing; a link that slows down gets
//!   fewer). A target that is lost has its pieces dealt again, to another member of its
//!   cluster. Once everything is dealt the source tells its cluster mates (`Dealt`), and from
//!   then on they serve other clusters' requests too (the endgame: the source's links are
//!   idle then, and the last pieces dealt are still crossing the slowest links).
//! - **Push inside clusters.** Every node pushes every piece it holds down its cluster's part
//!   of the planned tree; a node does not pull from cluster mates what its local tree parent
//!   holds. Tree edges between clusters other than the deal carry no push: a piece that
//!   entered cluster X reaches the others by pull, so the next two rules can route it.
//! - **Pull between clusters (MOB's teamwork).** Each receiver pulls its mob share from its
//!   rank-matched global peers, everything else from cluster mates, with per-peer request
//!   windows sized by measured delivery (`hybrid::PeerRate`, BBR-like: twice the
//!   rate-delay product plus two pieces, at most 64, and at least two where a piece takes
//!   under a second, so that a member's connection never idles a round trip between pieces
//!   when it pulls a small share of a WAN link; a piece that came back with nothing else
//!   outstanding can only raise the rate, so a window of one still sees its link speed up).
//!   The shares are interleaved, not MOB's blocks ([`mob::ShareLayout`]): the deal goes lowest
//!   piece first, so with blocks one member per cluster at a time fetched over each WAN
//!   link, and each hand-over to the next member restarted cold connections and windows
//!   (lab, fast links at 100 ms: the links into the bound's cluster at 0.85-0.89 of their
//!   rate, 0.96 interleaved). The two spare
//!   pieces are then split among the members that pull over the same link, so its request
//!   queue stays as deep as before (simulator: level with blocks, 0.93 of the bound in the
//!   worst static cell). Of what a global peer can give it asks first for what no peer in a
//!   third cluster holds, so pieces several clusters hold stay
//!   free for whichever link has room. One rank-matched member per cluster by default
//!   (`SwarmConfig::hybrid_servers`): with two, the lab's early idle spell on the link out
//!   of the deal's busiest target went away, but the simulator read less on slow links
//!   (0.88 against 0.93 of the bound at 100 ms: more windows queued behind a thin link).
//! - **Complementary order.** Of the receiving clusters that fetch from cluster X, every
//!   second one takes X's pieces newest first, the others oldest first. Two clusters that
//!   fetch what X holds thus take different pieces and can pass them on to each other over
//!   links X is not on (with both oldest first they fetched the same pieces, X's outgoing
//!   links capped both, and the links between them idled: 0.82 of the bound instead of 0.88).
//! - **Moving requests off thin links.** A request window is a few pieces deep at least, so
//!   behind a thin link (6.4 Mbit/s) a queued request may wait many seconds while another
//!   peer that holds the piece idles (a cluster's last pieces, most often). When a peer with
//!   room in its window would deliver a request queued elsewhere in under half the time it
//!   still has to wait there (queue position times that peer's piece time), the request is
//!   moved: `Cancel` goes to the slow peer, and only its `Cancelled` answer, sent when the
//!   request was still unserved, asks the faster one (as MOB's moves), so no second copy is
//!   sent. In the simulator with 1 MiB pieces on the lab's slow links (20 ms, seeds 1-7) this
//!   took C's tail after B and D from 12.8 s to 7.0 s on average.
//! - **One copy per cluster.** A piece enters a cluster only through its share owner's
//!   request, or the deal, which never repeats a piece. A second copy enters only when a
//!   request is taken off a peer that stopped delivering (no delivery for four expected piece
//!   times and three round trips) or doubled in the endgame (every missing piece already
//!   requested): first copy wins, the other request is cancelled. The endgame asks a peer in
//!   another cluster only when it would deliver sooner than the first request (its queue and
//!   a round trip against the first one's wait left); a cluster mate's copy costs no WAN
//!   bytes and is asked freely. 1.00-1.01 copies per cluster in the simulator at 600 MB,
//!   1.00-1.02 at 8 MiB on fast links (1.08 when every piece left was doubled).
//!
//! Why this and not MOB alone: MOB's fixed request windows cannot follow a link that slows
//! down, and its receivers in every cluster steal random pieces of the same share range from
//! the same source-cluster node, so many pieces leave the source's cluster two or three times
//! (1.5 times the object in "fast links"), where the bound allows once. Why not a tree alone:
//! it uses two or three of the nine WAN links, cannot use a link that speeds up, and is stuck
//! behind one that slows down.
//!
//! **What the simulator shows** (example `swarm_sim`, 4 clusters x 4 nodes, 600 MB, 512 KiB
//! pieces, the paper's five conditions at 20 and 100 ms RTT, each throughput also as a
//! fraction of [`sim::bound_rate`]): MOB is ahead of the swarm baseline everywhere (0.54-0.78
//! of the bound against 0.40-0.64) and brings exactly one copy into each cluster. The hybrid
//! is ahead of MOB in every cell, at 0.87-0.94 of the bound in the static conditions and
//! 0.79-0.99 in the changing ones, with 1.01-1.03 copies per cluster. Short of the issue's
//! targets: slow links at 100 ms (0.87 against 0.90) and fast->slow at 100 ms (0.79 against
//! 0.80). When the busiest tree edge drops to 10% half a second in (`tests/swarm_sim.rs`,
//! 24 MiB), the hybrid finishes in 2.7 s against 2.0 s without the slowdown (1.36x; the bound
//! itself moves from 1.66 s to 2.23 s, 1.35x), MOB in 10.1 s and the tree alone in 40.6 s.
//!
//! On the lab's rates ([`sim::LAB_LINKS`], `swarm_sim --lab --mb 600`) piece size matters: a
//! request window is whole pieces, so a thin link's queue is deep with big ones. The hybrid's
//! worst cell reads 0.81 static / 0.84 changing with 1 MiB pieces, 0.91 / 0.90 with 256 KiB
//! (the driver's default for the hybrid at that size). With two requests kept where a piece
//! takes under a second: 0.92 / 0.91 on the 4x4 layout, and on the unequal one (`--unequal`)
//! 0.92 / 0.85 where it read 0.89 / 0.83. At the rates TCP carries in the lab (`--tcp`: 0.95
//! of a link one way, 0.91 both ways) the 4x4 layout reads 0.93 / 0.95 of that lower bound:
//! the lab's shortfall against it is not in this model.
//!
//! Limitations: the deal splits pieces by how fast each link out of the source's cluster
//! drains, not by how fast the receiving clusters can pass them on, so with "slow links" it
//! gives B more than B can pass into {C, D}, and C and D finish after the deal, in the
//! endgame (a deal held back from a cluster that reported a deep backlog of pieces no other
//! cluster held did not help: the simulator's endgame absorbs the backlog, and on the
//! unequal layout it read lower); with slow links several cuts bind at once (into {C, D},
//! into C and into D), and 7-9% of the pieces cross the {C, D} cut twice (simulator, lab), C
//! and D both fetching them from B or the source's cluster (a `Fetching` notice to third
//! clusters and a preference for the faster holder took that from 154 pieces to 59 in the
//! simulator, but C->D then became the bottleneck and the run was slower); a request
//! already queued at a peer that slows down still arrives late; small objects pay start-up
//! and endgame (64 MiB: about 0.84 of the bound on fast links); the
//! bound of a changing condition is the time average of the instantaneous bound, a reference
//! rather than a strict bound (storage lets a schedule beat a per-instant cut: mayhem reaches
//! 0.99 of it); and nothing here has met a real network yet.
//!
//! # Resuming
//! A member whose copy kept verified pieces from an earlier session of the same object starts
//! with them ([`SwarmNode::resume`]): it announces and serves them like pieces it received and
//! fetches only the rest; holding all, it is complete at once. Every member's first frame to a
//! peer is a `Bitfield`, sent even when empty; to a peer that pushes to it (its tree parent,
//! the hybrid's dealing source) it lists every piece held, and nothing is pushed or dealt to a
//! peer before it arrived, so no kept piece is pushed (a round trip at the start). At the
//! hybrid's source, a piece a target kept counts as dealt. Pieces are checked against the
//! source's signed list of piece hashes ([`PieceHashes`], [`SwarmNode::set_piece_hashes`]), so
//! with host keys a kept piece, sealed by the member that kept it, is taken like any other.
//!
//! A member lost mid-session may come back (its agent restarted, and the source reached it
//! again: [`session::SourceSession::poll_redial`]): [`SwarmNode::handle_member_back`] at every
//! member gives it back its share and tree place; it resumes, outside the completion tree, and
//! the source's `AllDone` waits for its `Complete`.
//!
//! # Driving it (sans-IO)
//! Construct one [`SwarmNode`] per member with [`SwarmNode::new`]. Dial every node in
//! [`SwarmNode::connect_to`], accept every member that dials in, and call
//! [`SwarmNode::handle_connected`] for each connection that is up (either side). Then after
//! every input, until nothing moves:
//! 1. for each connected peer whose socket has room, send what
//!    [`SwarmNode::poll_transmit`] returns until `None`: a [`Transmit::Frame`] as it is, a
//!    [`Transmit::Piece`] as the `Chunk` frame of that piece read back from the local store
//!    (chunk, hash and tag as received: the core never holds piece data);
//! 2. frames read from a peer go to [`SwarmNode::handle_frame`] (an `Err` is a protocol
//!    violation: close that connection); a `Chunk` the driver verified itself off the event
//!    loop goes to [`SwarmNode::handle_verified_piece`] instead;
//! 3. act on [`SwarmNode::poll_event`]: store [`SwarmEvent::Piece`]s (and serve them from
//!    memory until stored), dial [`SwarmEvent::Connect`] peers, report
//!    [`SwarmEvent::Complete`], and close the session at [`SwarmEvent::AllDone`];
//! 4. call [`SwarmNode::handle_timeout`] at [`SwarmNode::poll_timeout`];
//! 5. when a connection drops, [`SwarmNode::handle_peer_lost`]; when the session learns
//!    a member is gone for good, [`SwarmNode::handle_member_lost`] on every member.

pub(crate) mod bits;
mod bt;
mod completion;
use completion::Ack;
mod hashes;
pub use hashes::PieceHashes;
mod hybrid;
pub mod mob;
pub mod msg;
mod peers;
mod pull;
mod receive;
pub mod session;
#[cfg(feature = "sim")]
pub use crate::sim::swarm as sim;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::auth::Keys;
use crate::chunkmap::ChunkMap;
use crate::tree::{NodeId, Tree, SOURCE};
use crate::wire::{Chunk, Frame, SessionId};

use bits::Bits;
pub use mob::Mobs;
pub use msg::SwarmMsg;

// The strategy is named on the wire (`SwarmOpen`), so the wire format defines it; its
// behaviour is here.
pub use crate::wire::Strategy;

impl Strategy {
    /// Every strategy, in the order the reports print them.
    pub const ALL: [Strategy; 4] = [
        Strategy::TreePush,
        Strategy::Swarm,
        Strategy::Mob,
        Strategy::Hybrid,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::TreePush => "tree-push",
            Strategy::Swarm => "swarm",
            Strategy::Mob => "mob",
            Strategy::Hybrid => "hybrid",
        }
    }

    fn pushes(self) -> bool {
        matches!(self, Strategy::TreePush | Strategy::Hybrid)
    }
}

/// Settings of a swarm session (the same on every member).
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// The strategy.
    pub strategy: Strategy,
    /// Session id (chunk tags are bound to it).
    pub session: SessionId,
    /// Number of pieces (chunks) of the object.
    pub pieces: u64,
    /// Outstanding requests per peer (`R`, 5 in the paper); the hybrid sizes its windows by
    /// measured rate instead.
    pub requests_per_peer: usize,
    /// MOB: local peers each node dials (5).
    pub local_peers: usize,
    /// MOB: global peers each node dials among its candidates (5).
    pub global_peers: usize,
    /// Hybrid: members of each other cluster that a receiver dials and asks for its share,
    /// the rank-matched one and its successors ([`mob::Mobs::rank_matched`]); 0 counts as 1.
    pub hybrid_servers: usize,
    /// Hybrid: how each cluster splits the pieces into its members' shares (MOB keeps the
    /// paper's blocks).
    pub hybrid_shares: mob::ShareLayout,
    /// BitTorrent baseline: peers each node dials (what a tracker would hand out).
    pub swarm_peers: usize,
    /// BitTorrent baseline: regular unchoke slots (4).
    pub unchoke_slots: usize,
    /// BitTorrent baseline: rechoke period (10 s).
    pub rechoke_every: Duration,
    /// BitTorrent baseline: optimistic unchoke period (30 s).
    pub optimistic_every: Duration,
    /// Seed for peer and piece choice (each node mixes in its id).
    pub seed: u64,
}

impl SwarmConfig {
    /// The paper's settings for `strategy` over `pieces` pieces.
    pub fn new(strategy: Strategy, session: SessionId, pieces: u64) -> Self {
        Self {
            strategy,
            session,
            pieces,
            requests_per_peer: 5,
            local_peers: 5,
            global_peers: 5,
            hybrid_servers: HYBRID_SERVERS,
            hybrid_shares: mob::ShareLayout::Interleaved,
            swarm_peers: 10,
            unchoke_slots: 4,
            rechoke_every: Duration::from_secs(10),
            optimistic_every: Duration::from_secs(30),
            seed: 1,
        }
    }
}

/// Why a swarm node could not be built, or a peer's frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwarmError {
    /// The membership does not contain this node, or is empty.
    #[error("node {0} is not a member of the session")]
    NotAMember(NodeId),
    /// The strategy pushes along a tree and none (or one of another size) was given.
    #[error("strategy {0} needs a tree spanning the members")]
    NoTree(&'static str),
    /// A frame from a node that is not a connected peer.
    #[error("frame from node {0}, which is not a connected peer")]
    UnknownPeer(NodeId),
    /// A piece index beyond the object.
    #[error("{0} for piece {1}, beyond the object's {2} pieces")]
    OutOfRange(&'static str, u64, u64),
    /// A bitfield of the wrong size.
    #[error("bitfield of {0} pieces for an object of {1}")]
    BadBitfield(u64, u64),
    /// A frame that has no place in a swarm session.
    #[error("unexpected {0} frame in a swarm session")]
    Unexpected(&'static str),
}

/// What to send next on a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// A control frame, to send as it is.
    Frame(Frame),
    /// The piece with this index: send its `Chunk` frame from the local store.
    Piece(u64),
}

/// Something the driver must act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwarmEvent {
    /// A piece arrived through [`SwarmNode::handle_frame`] and verified: store it. It is
    /// announced to peers at once, so serve it from memory until it is stored.
    Piece {
        /// The peer it came from.
        from: NodeId,
        /// The verified chunk.
        chunk: Chunk,
    },
    /// A piece failed verification and was dropped; it is requested again.
    Corrupt {
        /// The peer it came from.
        from: NodeId,
        /// Piece index.
        index: u64,
        /// What was wrong.
        error: String,
    },
    /// Open a connection to this member (a completion-tree neighbour after a loss).
    Connect {
        /// The member to dial.
        peer: NodeId,
    },
    /// This node holds every piece.
    Complete,
    /// Every live member holds every piece: the session is over.
    AllDone,
}

/// What this node knows about one connected peer.
#[derive(Debug)]
struct Peer {
    id: NodeId,
    local: bool,
    connected: bool,
    /// Tree child this node pushes to.
    child: bool,
    /// Pieces the peer holds, as far as we know.
    has: Bits,
    /// Pieces we told it we hold.
    announced: Bits,
    /// Pieces pushed (or served) to it.
    pushed: Bits,
    ctrl: VecDeque<Frame>,
    /// Pieces it requested, served in order.
    uploads: VecDeque<u64>,
    /// Our outstanding requests to it.
    requested: Vec<u64>,
    am_choking: bool,
    peer_choking: bool,
    am_interested: bool,
    peer_interested: bool,
    /// Pieces received from it / sent to it since the last rechoke.
    down_window: u64,
    up_window: u64,
    /// Hybrid: measured delivery rate and round trip of our requests to it.
    rate: hybrid::PeerRate,
    /// Its first `Bitfield` arrived: it may have resumed with pieces, so nothing is pushed
    /// or dealt to it before (see [`SwarmNode::resume`]).
    heard: bool,
}

/// One peer as seen by [`SwarmNode::peer_stats`].
#[derive(Debug, Clone, PartialEq)]
pub struct PeerStats {
    /// The peer.
    pub peer: NodeId,
    /// Whether it is in this node's cluster.
    pub local: bool,
    /// Our requests to it not yet answered.
    pub outstanding: usize,
    /// How many requests the hybrid keeps outstanding at it (its rate-sized window).
    pub window: usize,
    /// Its measured delivery rate of our requests, pieces per second (hybrid only).
    pub pieces_per_sec: Option<f64>,
    /// The smallest request-to-piece time seen from it (zero before the first).
    pub min_rtt: Duration,
    /// Pieces it holds that we lack, have not requested, and may ask it for.
    pub askable: u64,
    /// Its requests queued here, not yet handed to the connection.
    pub queued_for_it: usize,
    /// Requests are outstanding and nothing arrived for several expected piece times.
    pub stalled: bool,
}

/// MOB: a request waiting longer than this at one peer moves to an idle peer that has the
/// piece (see [`SwarmNode::mob_move`]). Several round trips and piece times on any link the
/// lab or the paper has; a queue behind a slow link takes ten times as long.
const MOB_MOVE_AFTER: Duration = Duration::from_secs(1);

/// Hybrid: how many members of each other cluster a receiver asks for its share. More than
/// one spreads a cluster's WAN uploads over its members (the deal's target is the busiest
/// of them) and runs several connections over each WAN link; each piece still enters a
/// cluster through its share owner's request alone.
const HYBRID_SERVERS: usize = 1;

/// One member's swarm state machine (see the module documentation).
#[derive(Debug)]
pub struct SwarmNode {
    cfg: SwarmConfig,
    keys: Keys,
    me: NodeId,
    labels: Vec<u32>,
    alive: Vec<bool>,
    /// Members that were lost and came back ([`SwarmNode::handle_member_back`]): outside the
    /// completion tree, they report to the source, which waits for them before `AllDone`.
    returned: Vec<bool>,
    mobs: Mobs,
    source_cluster: usize,
    tree_parent: Option<NodeId>,
    tree_children: Vec<NodeId>,
    /// The planned tree's parent and children, restored when a lost member comes back.
    planned: (Option<NodeId>, Vec<NodeId>),
    /// The source's signed list of piece hashes: every piece is checked against it, so pieces
    /// need no signature of their own ([`PieceHashes`]).
    hashes: Option<PieceHashes>,
    /// Hybrid, at the source: the node of each other cluster it deals pieces to.
    targets: Vec<NodeId>,
    peers: Vec<Peer>,
    index: Vec<Option<usize>>,
    have: ChunkMap,
    have_bits: Bits,
    pending: Bits,
    pending_from: Vec<Option<NodeId>>,
    /// When the request of `pending_from` was sent.
    req_at: Vec<Option<Instant>>,
    /// MOB: a `Cancel` is out for piece i at its peer, to ask this one instead once the peer
    /// answers `Cancelled` (see [`SwarmNode::mob_move`]).
    moving_to: Vec<Option<NodeId>>,
    /// Per member: how many entries of `moving_to` name it (kept with `moving_to`, so that a
    /// peer's window need not scan every piece on every top-up).
    moving_in: Vec<u32>,
    /// Hybrid, at the source: pieces dealt out of the source's cluster.
    exported: Bits,
    /// Hybrid, in the source's cluster: every piece was dealt once (its members then serve
    /// requests from other clusters too).
    dealt_all: bool,
    /// Hybrid endgame: second requests, (piece, peer).
    second: Vec<(u64, NodeId)>,
    connect_to: Vec<NodeId>,
    rng: SmallRng,
    events: VecDeque<SwarmEvent>,
    complete: bool,
    ack: Ack,
    duplicates: u64,
    bt: bt::Choker,
}

impl SwarmNode {
    /// A member's state machine. `clusters[i]` is node i's cluster label (nodes are numbered
    /// `0..clusters.len()`, node 0 is the source and starts with every piece); `tree` is the
    /// planned tree over the same nodes, needed by [`Strategy::TreePush`] and
    /// [`Strategy::Hybrid`].
    pub fn new(
        cfg: SwarmConfig,
        keys: Keys,
        clusters: &[u32],
        me: NodeId,
        tree: Option<&Tree>,
        now: Instant,
    ) -> Result<Self, SwarmError> {
        let n = clusters.len();
        if me >= n {
            return Err(SwarmError::NotAMember(me));
        }
        let (tree_parent, tree_children) = match tree {
            Some(t) if t.len() == n => (t.parent(me), t.children(me)),
            _ if cfg.strategy.pushes() => return Err(SwarmError::NoTree(cfg.strategy.name())),
            _ => (None, Vec::new()),
        };
        let alive = vec![true; n];
        let mobs = Mobs::new(clusters, &alive);
        let my_cluster = mobs.cluster(me);
        // The hybrid's source deals to each other cluster's WAN entry in the planned tree (its
        // first member whose parent is outside it), or its first member.
        let targets = match tree {
            Some(t) if t.len() == n && me == SOURCE && cfg.strategy == Strategy::Hybrid => (0
                ..mobs.clusters())
                .filter(|&c| c != my_cluster)
                .filter_map(|c| {
                    let m = mobs.members(c);
                    m.iter()
                        .copied()
                        .find(|&x| t.parent(x).is_some_and(|p| mobs.cluster(p) != c))
                        .or(m.first().copied())
                })
                .collect(),
            _ => Vec::new(),
        };
        let p = cfg.pieces;
        let mut have = ChunkMap::new();
        let mut have_bits = Bits::new(p);
        if me == SOURCE {
            for i in 0..p {
                have.insert(i);
            }
            have_bits = Bits::full(p);
        }
        let rng =
            SmallRng::seed_from_u64(cfg.seed ^ (me as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut node = Self {
            source_cluster: mobs.cluster(SOURCE),
            bt: bt::Choker::new(&cfg, now),
            cfg,
            keys,
            me,
            labels: clusters.to_vec(),
            alive,
            returned: vec![false; n],
            mobs,
            planned: (tree_parent, tree_children.clone()),
            hashes: None,
            tree_parent,
            tree_children,
            targets,
            peers: Vec::new(),
            index: vec![None; n],
            have,
            have_bits,
            pending: Bits::new(p),
            pending_from: vec![None; p as usize],
            req_at: vec![None; p as usize],
            moving_to: vec![None; p as usize],
            moving_in: vec![0; n],
            exported: Bits::new(p),
            dealt_all: false,
            second: Vec::new(),
            connect_to: Vec::new(),
            rng,
            events: VecDeque::new(),
            complete: false,
            ack: Ack::default(),
            duplicates: 0,
        };
        node.complete = node.have.len() == p;
        node.layout_ack();
        node.connect_to = node.choose_peers();
        if node.complete {
            node.events.push_back(SwarmEvent::Complete);
            node.try_ack();
        }
        Ok(node)
    }

    /// A receiver, before any connection: its local copy already holds `held` (verified
    /// pieces kept from an earlier session of the same object). It announces them like pieces
    /// it received (its first `Bitfield` to a peer that pushes to it lists them all, so nothing
    /// held is pushed again), serves them, and fetches only the rest; holding every piece, it is
    /// complete at once. Pieces outside the object are ignored; so is a call at the source or
    /// once connected.
    pub fn resume(&mut self, held: &ChunkMap) {
        if self.me == SOURCE || self.peers.iter().any(|p| p.connected) {
            return;
        }
        for (s, e) in held.ranges() {
            for i in s..e.min(self.cfg.pieces) {
                if self.have.insert(i) {
                    self.have_bits.set(i);
                }
            }
        }
        if self.have.len() == self.cfg.pieces && !self.complete {
            self.complete = true;
            self.events.push_back(SwarmEvent::Complete);
            self.try_ack();
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// The strategy it runs.
    pub fn strategy(&self) -> Strategy {
        self.cfg.strategy
    }

    /// The members this node dials at the start (phases 1 and 2 for MOB; the tree parent
    /// and completion-tree parent for every strategy).
    pub fn connect_to(&self) -> &[NodeId] {
        &self.connect_to
    }

    /// The pieces held, verified.
    pub fn have(&self) -> &ChunkMap {
        &self.have
    }

    /// True once every piece is held.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// True once the completion tree reported every live member complete.
    pub fn is_all_done(&self) -> bool {
        self.ack.all_done
    }

    /// Whether `node` is in the session: not lost, or lost and back.
    pub fn is_alive(&self, node: NodeId) -> bool {
        self.alive.get(node).copied().unwrap_or(false)
    }

    /// Whether `node` was lost and came back ([`SwarmNode::handle_member_back`]).
    pub fn is_returned(&self, node: NodeId) -> bool {
        self.returned.get(node).copied().unwrap_or(false)
    }

    /// Pieces that arrived a second time.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Connected peers, in the order they connected.
    pub fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.peers.iter().filter(|p| p.connected).map(|p| p.id)
    }

    /// What this node's requests to each connected peer look like now, for progress
    /// reports and diagnosis (a link that idles because the peer has nothing we may ask it
    /// for reads differently from one whose request window is full).
    pub fn peer_stats(&self, now: Instant) -> Vec<PeerStats> {
        let words = self.have_bits.words();
        (0..self.peers.len())
            .filter(|&k| self.peers[k].connected)
            .map(|k| {
                let p = &self.peers[k];
                let allowed = self.allowed_words(k);
                let askable = (0..words)
                    .map(|w| {
                        let m = p.has.word(w)
                            & !self.have_bits.word(w)
                            & !self.pending.word(w)
                            & allowed[w];
                        u64::from(m.count_ones())
                    })
                    .sum();
                PeerStats {
                    peer: p.id,
                    local: p.local,
                    outstanding: p.requested.len(),
                    window: self.hybrid_window(k),
                    pieces_per_sec: p.rate.rate(),
                    min_rtt: p.rate.min_rtt(),
                    askable,
                    queued_for_it: p.uploads.len(),
                    stalled: p.rate.stalled(now),
                }
            })
            .collect()
    }

    /// Node n's share mask, word by word: the pieces n fetches from other clusters and serves
    /// to theirs (MOB: the paper's contiguous blocks; the hybrid: interleaved, see
    /// [`mob::ShareLayout`]). The share is worked out once, here, not per word.
    fn share_mask(&self, n: NodeId) -> mob::ShareMask {
        self.mobs
            .share_mask(n, self.cfg.pieces, self.share_layout())
    }

    /// How this session's clusters split their shares: the hybrid's setting, MOB's blocks.
    fn share_layout(&self) -> mob::ShareLayout {
        match self.cfg.strategy {
            Strategy::Hybrid => self.cfg.hybrid_shares,
            _ => mob::ShareLayout::Blocks,
        }
    }

    /// A connection to `peer` is up (dialled by either side).
    pub fn handle_connected(&mut self, peer: NodeId, _now: Instant) {
        if peer == self.me || peer >= self.alive.len() || !self.alive[peer] {
            return;
        }
        let k = self.ensure_peer(peer);
        if self.peers[k].connected {
            return;
        }
        let bt = self.cfg.strategy == Strategy::Swarm;
        let p = &mut self.peers[k];
        p.connected = true;
        p.heard = false;
        p.am_choking = bt;
        p.peer_choking = bt;
        p.am_interested = false;
        p.peer_interested = false;
        self.greet(k);
    }

    /// The connection to `peer` dropped: its requests go to other peers.
    pub fn handle_peer_lost(&mut self, peer: NodeId, now: Instant) {
        let Some(k) = self.index.get(peer).copied().flatten() else {
            return;
        };
        let p = &mut self.peers[k];
        if !p.connected {
            return;
        }
        p.connected = false;
        p.uploads.clear();
        p.ctrl.clear();
        let requested = std::mem::take(&mut p.requested);
        self.second.retain(|&(_, q)| q != peer);
        for i in requested {
            if self.pending_from[i as usize] == Some(peer) {
                self.unpend(i);
            }
        }
        if self.targets.contains(&peer) {
            self.retarget(peer);
        }
        if self.cfg.strategy == Strategy::Swarm {
            self.rechoke(now, false);
        }
    }

    /// `node` left the session for good (the session tells every member): its connection is
    /// dropped, mob ranks and shares, and the completion tree, are recomputed over the live
    /// members, and global peers learn the pieces of their new shares.
    pub fn handle_member_lost(&mut self, node: NodeId, now: Instant) {
        if node >= self.alive.len() || !self.alive[node] || node == self.me {
            return;
        }
        self.handle_peer_lost(node, now);
        self.alive[node] = false;
        self.mobs = Mobs::new(&self.labels, &self.alive);
        if self.tree_parent == Some(node) {
            self.tree_parent = None;
        }
        self.tree_children.retain(|&c| c != node);
        self.layout_ack();
        if self.ack.sent {
            self.ack.sent = false;
        }
        self.try_ack();
        for k in 0..self.peers.len() {
            if self.peers[k].connected && !self.peers[k].local {
                self.announce_all(k);
            }
        }
    }

    /// A frame from `peer`.
    pub fn handle_frame(
        &mut self,
        peer: NodeId,
        frame: Frame,
        now: Instant,
    ) -> Result<(), SwarmError> {
        let Some(k) = self
            .index
            .get(peer)
            .copied()
            .flatten()
            .filter(|&k| self.peers[k].connected)
        else {
            return Err(SwarmError::UnknownPeer(peer));
        };
        let p_count = self.cfg.pieces;
        let check = |what: &'static str, i: u64| {
            if i >= p_count {
                Err(SwarmError::OutOfRange(what, i, p_count))
            } else {
                Ok(())
            }
        };
        match frame {
            Frame::Chunk(c) => {
                check("Chunk", c.index)?;
                let verified = match &self.hashes {
                    Some(h) => h.verify(&self.keys, self.cfg.session, &c),
                    None => self.keys.verify(self.cfg.session, &c),
                };
                match verified {
                    Ok(()) => {
                        let index = c.index;
                        self.events.push_back(SwarmEvent::Piece {
                            from: peer,
                            chunk: c,
                        });
                        self.on_piece(k, index, now);
                    }
                    Err(error) => {
                        let index = c.index;
                        self.peers[k].requested.retain(|&i| i != index);
                        if self.pending_from[index as usize] == Some(peer) {
                            self.unpend(index);
                        }
                        self.events.push_back(SwarmEvent::Corrupt {
                            from: peer,
                            index,
                            error: error.to_string(),
                        });
                    }
                }
            }
            Frame::Request { index } => {
                check("Request", index)?;
                let bt = self.cfg.strategy == Strategy::Swarm;
                let p = &mut self.peers[k];
                if !self.have.contains(index) {
                    p.ctrl.push_back(Frame::Swarm(SwarmMsg::Reject { index }));
                } else if !(p.uploads.contains(&index) || bt && p.am_choking)
                    && p.uploads.len() < 1024
                {
                    p.uploads.push_back(index);
                }
            }
            Frame::Swarm(m) => self.handle_msg(k, m, now)?,
            Frame::Error { .. } => self.handle_peer_lost(peer, now),
            other => return Err(SwarmError::Unexpected(other.kind())),
        }
        Ok(())
    }

    /// A piece from `peer` that the driver verified itself (and stored, or holds in memory).
    pub fn handle_verified_piece(
        &mut self,
        peer: NodeId,
        index: u64,
        now: Instant,
    ) -> Result<(), SwarmError> {
        let Some(k) = self
            .index
            .get(peer)
            .copied()
            .flatten()
            .filter(|&k| self.peers[k].connected)
        else {
            return Err(SwarmError::UnknownPeer(peer));
        };
        if index >= self.cfg.pieces {
            return Err(SwarmError::OutOfRange("Chunk", index, self.cfg.pieces));
        }
        self.on_piece(k, index, now);
        Ok(())
    }

    /// The next thing to send to `peer`, when its connection can take it.
    pub fn poll_transmit(&mut self, peer: NodeId, now: Instant) -> Option<Transmit> {
        let k = self.index.get(peer).copied().flatten()?;
        if !self.peers[k].connected {
            return None;
        }
        self.top_up(k, now);
        let hybrid = self.cfg.strategy == Strategy::Hybrid;
        // Pushes wait for the peer's first announcement: what it held before the session.
        let heard = self.peers[k].heard;
        let deal = hybrid && heard && self.targets.contains(&peer);
        let push = heard
            && self.peers[k].child
            && self.cfg.strategy.pushes()
            // The hybrid's push stays inside clusters; out of the source's, it deals.
            && (!hybrid || self.peers[k].local);
        let p = &mut self.peers[k];
        if let Some(f) = p.ctrl.pop_front() {
            return Some(Transmit::Frame(f));
        }
        if let Some(i) = p.uploads.pop_front() {
            p.has.set(i);
            p.pushed.set(i);
            p.up_window += 1;
            return Some(Transmit::Piece(i));
        }
        if deal && !self.dealt_all {
            return self.deal(k);
        }
        if push && hybrid {
            // Within a cluster the hybrid pushes everything it holds down the local tree.
            let (have, has, pushed) = (&self.have_bits, &p.has, &p.pushed);
            let i = bits::pick_lowest(have.words(), |w| {
                have.word(w) & !has.word(w) & !pushed.word(w)
            })?;
            p.pushed.set(i);
            p.up_window += 1;
            return Some(Transmit::Piece(i));
        }
        if push {
            // Tree push alone: the front-to-back stream of the contiguous prefix.
            let (have, has, pushed) = (&self.have_bits, &p.has, &p.pushed);
            let prefix = self.have.prefix();
            let i = bits::pick_lowest(have.words(), |w| {
                have.word(w) & !has.word(w) & !pushed.word(w) & bits::range_word(w, 0, prefix)
            })?;
            p.pushed.set(i);
            p.up_window += 1;
            return Some(Transmit::Piece(i));
        }
        None
    }

    /// The next control frame for `peer` (request, have, cancel, ...), never a piece: a
    /// driver that holds pieces back (a full writer) still sends these. A driver that uses
    /// only [`SwarmNode::poll_transmit`] gets the same frames from it.
    pub fn poll_control(&mut self, peer: NodeId, now: Instant) -> Option<Frame> {
        let k = self.index.get(peer).copied().flatten()?;
        if !self.peers[k].connected {
            return None;
        }
        if self.peers[k].ctrl.is_empty() {
            self.top_up(k, now);
        }
        self.peers[k].ctrl.pop_front()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<SwarmEvent> {
        self.events.pop_front()
    }

    /// When [`SwarmNode::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.ack.all_done {
            return None;
        }
        let mut t = None;
        if self.cfg.strategy == Strategy::Swarm {
            t = Some(self.bt.next());
        }
        t
    }

    /// Timers: rechoking (BitTorrent baseline) and push measurement (hybrid).
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.ack.all_done {
            return;
        }
        if self.cfg.strategy == Strategy::Swarm {
            self.bt_timeout(now);
        }
    }

    fn my_cluster(&self) -> usize {
        self.mobs.cluster(self.me)
    }
}
