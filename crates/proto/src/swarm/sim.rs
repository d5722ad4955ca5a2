//! A multi-cluster network on a simulated clock, for comparing the swarm strategies.
//!
//! The network is the MOB paper's model (its Figure 1): nodes sit in clusters; each node has
//! an access link (uplink and downlink, each a rate); each ordered pair of clusters has a WAN
//! link (a rate, shared by every flow from the one cluster to the other, and a one-way
//! latency). A message from a to b is served, store and forward, by a's uplink, then (between
//! clusters) the WAN link and its latency, then b's downlink; within a cluster by a's uplink,
//! the LAN latency and b's downlink. Each resource serves its queue in arrival order, so flows
//! that share it share its rate in proportion to what they offer. Each connection (a, b) holds
//! at most a window of bytes sent and not yet delivered (what the network driver commits: one
//! piece in its writer, the socket's unsent backlog, the congestion window), which is how a
//! slow path back-pressures its sender, as in [`crate::sim`]. Control frames are not held to
//! the window, as the driver does not hold them.
//!
//! Control frames cross the network encoded and are decoded on arrival, so the wire format is
//! exercised. Pieces are real chunks sealed by the source and verified at every hop when
//! [`SwarmSimSpec::data`] is set (the tests), or stand-ins of the right size passed to
//! [`SwarmNode::handle_verified_piece`] otherwise (the example, which moves 600 MB sixty
//! times). Time jumps from event to event; a seed gives the same run every time.
//!
//! The plan is declarative: a [`Topology`] (with [`Condition`]s for the paper's five WAN
//! scenarios), WAN rate changes at given times, members lost at given times. The session's
//! membership service is the simulator itself: when a node disappears, its connections drop
//! at once and every member is told ([`SwarmNode::handle_member_lost`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{Strategy, SwarmConfig, SwarmEvent, SwarmNode, Transmit};
use crate::auth::{Keys, Secret};
use crate::tree::{NodeId, Tree, SOURCE};
use crate::wire::{self, Chunk, Frame};

/// One megabyte per second, in bytes per second (the paper's unit).
pub const MB_S: f64 = 1e6;

/// The network: clusters, access links, WAN links.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Cluster sizes; nodes are numbered cluster by cluster, node 0 (the source) first.
    pub clusters: Vec<usize>,
    /// Each node's uplink, bytes per second.
    pub access_up: f64,
    /// Each node's downlink, bytes per second.
    pub access_down: f64,
    /// One-way latency within a cluster.
    pub lan_latency: Duration,
    /// `wan[x][y]`: rate from cluster x to cluster y, bytes per second (the diagonal is
    /// unused).
    pub wan: Vec<Vec<f64>>,
    /// One-way latency between clusters.
    pub wan_latency: Duration,
}

/// The "fast links" WAN rates in MB/s between clusters A, B, C, D (both directions alike).
/// The MOB paper gives them only in its Figure 3b, which is not in our copy; these are our
/// numbers of the same kind (3-7 MB/s), chosen so that the widest tree uses the two links
/// that the slow scenarios slow down (A-D and B-C).
pub const FAST_LINKS: [[f64; 4]; 4] = [
    [0.0, 5.6, 3.4, 6.2],
    [5.6, 0.0, 6.8, 4.1],
    [3.4, 6.8, 0.0, 5.0],
    [6.2, 4.1, 5.0, 0.0],
];

/// The lab's seed 004 rates in MB/s (`scenarios/seed004-*.toml`, after the paper's text: the
/// slowest fast link 3 MB/s, MOB's 8.5 MB/s within reach): A-B 4, A-C 3, A-D 3, B-C 4, B-D 3,
/// C-D 4. The source's site egress and cluster D's ingress are both exactly the bound (10 MB/s),
/// so D must keep all three links busy from start to end.
pub const LAB_LINKS: [[f64; 4]; 4] = [
    [0.0, 4.0, 3.0, 3.0],
    [4.0, 0.0, 4.0, 3.0],
    [3.0, 4.0, 0.0, 4.0],
    [3.0, 3.0, 4.0, 0.0],
];

/// The links the "slow links" scenario sets to 0.8 MB/s: A-D and B-C.
pub const SLOW_PAIRS: [(usize, usize); 2] = [(0, 3), (1, 2)];

impl Topology {
    /// The MOB paper's emulation (section 4.1): four clusters of the given sizes, 1 Gbit/s
    /// access links, [`FAST_LINKS`], and the given round-trip time between clusters.
    pub fn four_clusters(sizes: [usize; 4], rtt: Duration) -> Self {
        Self {
            clusters: sizes.to_vec(),
            access_up: 125.0 * MB_S,
            access_down: 125.0 * MB_S,
            lan_latency: Duration::from_micros(50),
            wan: FAST_LINKS
                .iter()
                .map(|r| r.iter().map(|x| x * MB_S).collect())
                .collect(),
            wan_latency: rtt / 2,
        }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.clusters.iter().sum()
    }

    /// Each node's cluster index, as the membership labels [`SwarmNode::new`] takes.
    pub fn labels(&self) -> Vec<u32> {
        self.clusters
            .iter()
            .enumerate()
            .flat_map(|(c, &n)| std::iter::repeat_n(c as u32, n))
            .collect()
    }

    /// The first node of each cluster.
    pub fn first_nodes(&self) -> Vec<NodeId> {
        let mut at = 0;
        self.clusters
            .iter()
            .map(|&n| {
                let f = at;
                at += n;
                f
            })
            .collect()
    }

    /// The lab's seed 004 WAN rates ([`LAB_LINKS`]) instead of the simulator's own.
    pub fn set_lab_links(&mut self) {
        self.wan = LAB_LINKS
            .iter()
            .map(|row| row.iter().map(|r| r * MB_S).collect())
            .collect();
    }

    /// Sets the rate of the WAN link x-y in both directions.
    pub fn set_link(&mut self, x: usize, y: usize, rate: f64) {
        self.wan[x][y] = rate;
        self.wan[y][x] = rate;
    }
}

/// A WAN rate change: at `at`, the link from cluster `from` to cluster `to` runs at `rate`
/// bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WanChange {
    /// When.
    pub at: Duration,
    /// Sending cluster.
    pub from: usize,
    /// Receiving cluster.
    pub to: usize,
    /// New rate, bytes per second.
    pub rate: f64,
}

/// The MOB paper's five WAN scenarios (section 4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Every link at its nominal ("fast links") rate throughout.
    FastLinks,
    /// A-D and B-C at 0.8 MB/s throughout.
    SlowLinks,
    /// Fast links for 30 s, then slow links.
    FastToSlow,
    /// Slow links for 30 s, then fast links.
    SlowToFast,
    /// Every 5 s, every link changes at random to 10-100% of its nominal rate (seeded).
    Mayhem,
}

impl Condition {
    /// All five, in the paper's order.
    pub const ALL: [Condition; 5] = [
        Condition::FastLinks,
        Condition::SlowLinks,
        Condition::FastToSlow,
        Condition::SlowToFast,
        Condition::Mayhem,
    ];

    /// The paper's name.
    pub fn name(self) -> &'static str {
        match self {
            Condition::FastLinks => "fast links",
            Condition::SlowLinks => "slow links",
            Condition::FastToSlow => "fast->slow",
            Condition::SlowToFast => "slow->fast",
            Condition::Mayhem => "mayhem",
        }
    }

    /// Sets `topo`'s initial WAN rates for this scenario (from its nominal "fast" rates) and
    /// returns the changes up to `until`.
    pub fn apply(self, topo: &mut Topology, seed: u64, until: Duration) -> Vec<WanChange> {
        let nominal = topo.wan.clone();
        let slow = 0.8 * MB_S;
        let switch = Duration::from_secs(30);
        let both = |at: Duration, x: usize, y: usize, rate: f64| {
            [
                WanChange {
                    at,
                    from: x,
                    to: y,
                    rate,
                },
                WanChange {
                    at,
                    from: y,
                    to: x,
                    rate,
                },
            ]
        };
        match self {
            Condition::FastLinks => Vec::new(),
            Condition::SlowLinks => {
                for &(x, y) in &SLOW_PAIRS {
                    topo.set_link(x, y, slow);
                }
                Vec::new()
            }
            Condition::FastToSlow => SLOW_PAIRS
                .iter()
                .flat_map(|&(x, y)| both(switch, x, y, slow))
                .collect(),
            Condition::SlowToFast => {
                for &(x, y) in &SLOW_PAIRS {
                    topo.set_link(x, y, slow);
                }
                SLOW_PAIRS
                    .iter()
                    .flat_map(|&(x, y)| both(switch, x, y, nominal[x][y]))
                    .collect()
            }
            Condition::Mayhem => {
                let mut rng = SmallRng::seed_from_u64(seed ^ 0x6d61_7968_656d);
                let c = topo.clusters.len();
                let mut out = Vec::new();
                let mut t = Duration::ZERO;
                while t < until {
                    for (x, row) in nominal.iter().enumerate().take(c) {
                        for (y, &nom) in row.iter().enumerate().take(c).skip(x + 1) {
                            let rate = nom * rng.gen_range(0.1..=1.0);
                            if t.is_zero() {
                                topo.set_link(x, y, rate);
                            } else {
                                out.extend(both(t, x, y, rate));
                            }
                        }
                    }
                    t += Duration::from_secs(5);
                }
                out
            }
        }
    }
}

/// The planned tree a single-tree planner would build from the rates at the start: between
/// clusters, the widest (maximum-bottleneck) tree from the source's cluster, joining the
/// first nodes of the clusters; within each cluster, a binary tree from its first node.
pub fn plan_tree(topo: &Topology) -> Tree {
    let c = topo.clusters.len();
    let first = topo.first_nodes();
    let mut parent: Vec<Option<NodeId>> = vec![None; topo.nodes()];
    // Prim on bottleneck width.
    let mut in_tree = vec![false; c];
    in_tree[0] = true;
    for _ in 1..c {
        let mut best: Option<(f64, usize, usize)> = None;
        for x in (0..c).filter(|&x| in_tree[x]) {
            for y in (0..c).filter(|&y| !in_tree[y] && topo.clusters[y] > 0) {
                let w = topo.wan[x][y];
                if best.is_none_or(|b| w > b.0) {
                    best = Some((w, x, y));
                }
            }
        }
        let Some((_, x, y)) = best else { break };
        in_tree[y] = true;
        parent[first[y]] = Some(first[x]);
    }
    for (k, &size) in topo.clusters.iter().enumerate() {
        for j in 1..size {
            parent[first[k] + j] = Some(first[k] + (j - 1) / 2);
        }
    }
    parent[0] = None;
    Tree::from_parents(parent).expect("a spanning tree by construction")
}

/// The most that can flow from host `from` to host `to` per second over `topo` (bytes per
/// second): a maximum flow (Edmonds-Karp) in its capacity graph. Each host has an uplink edge
/// into its cluster's egress point and a downlink edge out of its cluster's ingress point;
/// within a cluster, egress feeds ingress without limit (the LAN behind the access links);
/// between clusters, egress x feeds ingress y at `wan[x][y]`.
pub fn max_flow(topo: &Topology, from: NodeId, to: NodeId) -> f64 {
    let n = topo.nodes();
    let c = topo.clusters.len();
    if from >= n || to >= n || from == to {
        return 0.0;
    }
    let labels = topo.labels();
    // Vertices: hosts 0..n, egress n..n+c, ingress n+c..n+2c.
    let v = n + 2 * c;
    let mut cap = vec![vec![0.0f64; v]; v];
    let inf = f64::INFINITY;
    for (h, &l) in labels.iter().enumerate() {
        let x = l as usize;
        cap[h][n + x] += topo.access_up;
        cap[n + c + x][h] += topo.access_down;
    }
    for x in 0..c {
        cap[n + x][n + c + x] = inf;
        for y in (0..c).filter(|&y| y != x) {
            cap[n + x][n + c + y] += topo.wan[x][y].max(0.0);
        }
    }
    let mut total = 0.0;
    loop {
        // Shortest augmenting path by breadth-first search.
        let mut prev = vec![usize::MAX; v];
        prev[from] = from;
        let mut queue = VecDeque::from([from]);
        while let Some(u) = queue.pop_front() {
            if u == to {
                break;
            }
            for w in 0..v {
                if prev[w] == usize::MAX && cap[u][w] > 1e-9 {
                    prev[w] = u;
                    queue.push_back(w);
                }
            }
        }
        if prev[to] == usize::MAX {
            return total;
        }
        let mut push = inf;
        let mut w = to;
        while w != from {
            push = push.min(cap[prev[w]][w]);
            w = prev[w];
        }
        if !push.is_finite() {
            return inf;
        }
        let mut w = to;
        while w != from {
            let u = prev[w];
            cap[u][w] -= push;
            cap[w][u] += push;
            w = u;
        }
        total += push;
    }
}

/// The broadcast capacity of `topo` from the source (node 0), bytes per second: the least,
/// over the receivers, of the maximum flow from the source to it.
///
/// No strategy can beat it: every receiver gets the whole object through some cut of the
/// graph. It is also the right target: hosts store and forward, and within a cluster the
/// access links dwarf the WAN, so each cluster acts as one vertex of a directed graph whose
/// edges are the WAN links, and by Edmonds' branching theorem the spanning arborescences from
/// the source that such a graph packs carry exactly this min-cut rate (a fixed split of the
/// object over a few trees, planned with the rates known in advance). It is the packing / LP
/// bound the issue measures against.
pub fn broadcast_bound(topo: &Topology) -> f64 {
    (1..topo.nodes())
        .map(|b| max_flow(topo, SOURCE, b))
        .fold(f64::INFINITY, f64::min)
}

/// The bound of a whole plan: the earliest time an object of `object_len` bytes could reach
/// every receiver if each received, at every instant, its maximum flow under the WAN rates
/// of that instant (`changes` applied in time order on top of `topo`).
///
/// With static rates this is `object_len / broadcast_bound(topo)`. With changing rates the
/// rate `object_len / time` is the time average of the instantaneous bound over that ideal
/// transfer. It is a reference rather than a strict bound then: a node may store what a fast
/// link brings early and forward it later over a link that speeds up, which a per-instant cut
/// does not see, so a strategy could in principle exceed it slightly. It ignores latency and
/// per-piece overhead.
pub fn bound_time(topo: &Topology, changes: &[WanChange], object_len: u64) -> Duration {
    let mut topo = topo.clone();
    let mut changes = changes.to_vec();
    changes.sort_by_key(|c| c.at);
    let n = topo.nodes();
    let mut got = vec![0.0f64; n];
    let mut done = vec![false; n];
    done[SOURCE] = true;
    let mut finish = Duration::ZERO;
    let mut t = Duration::ZERO;
    let mut k = 0;
    let need = object_len as f64;
    while done.iter().any(|d| !d) {
        while k < changes.len() && changes[k].at <= t {
            let ch = changes[k];
            topo.wan[ch.from][ch.to] = ch.rate;
            k += 1;
        }
        let next = changes.get(k).map(|c| c.at);
        for b in 0..n {
            if done[b] {
                continue;
            }
            let r = max_flow(&topo, SOURCE, b);
            let dt = next.map_or(f64::INFINITY, |x| (x - t).as_secs_f64());
            if r > 0.0 && got[b] + r * dt >= need {
                done[b] = true;
                finish = finish.max(t + Duration::from_secs_f64((need - got[b]) / r));
            } else if next.is_some() {
                got[b] += r * dt;
            } else {
                // Never: the receiver is cut off for good.
                return Duration::MAX;
            }
        }
        match next {
            Some(x) => t = x,
            None => break,
        }
    }
    finish
}

/// [`bound_time`] as a rate: `object_len` over it, bytes per second.
pub fn bound_rate(topo: &Topology, changes: &[WanChange], object_len: u64) -> f64 {
    let t = bound_time(topo, changes, object_len);
    if t == Duration::MAX {
        0.0
    } else {
        object_len as f64 / t.as_secs_f64().max(1e-12)
    }
}

/// A declarative simulation plan.
#[derive(Debug, Clone)]
pub struct SwarmSimSpec {
    /// The network at the start.
    pub topology: Topology,
    /// Strategy and its settings (`pieces` and `session` are set from the object).
    pub config: SwarmConfig,
    /// Object length in bytes.
    pub object_len: u64,
    /// Piece (chunk) length in bytes.
    pub piece_len: u32,
    /// The planned tree (tree push and the hybrid).
    pub tree: Tree,
    /// WAN rate changes.
    pub wan_changes: Vec<WanChange>,
    /// Members that disappear at the given times.
    pub lost: Vec<(Duration, NodeId)>,
    /// Move real sealed bytes and verify them at every hop.
    pub data: bool,
    /// Seed for the data and the strategy's random choices.
    pub seed: u64,
    /// The run stops here whatever happened.
    pub time_limit: Duration,
}

impl SwarmSimSpec {
    /// A plan over `topology` with the strategy's default settings, 256 KiB pieces, the
    /// planned tree of [`plan_tree`], no changes, no losses, stand-in pieces.
    pub fn new(topology: Topology, strategy: Strategy, object_len: u64) -> Self {
        let tree = plan_tree(&topology);
        Self {
            topology,
            config: SwarmConfig::new(strategy, 77, 0),
            object_len,
            piece_len: 256 << 10,
            tree,
            wan_changes: Vec::new(),
            lost: Vec::new(),
            data: false,
            seed: 1,
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SwarmSimReport {
    /// The strategy that ran.
    pub strategy: Strategy,
    /// Object length.
    pub object_len: u64,
    /// Per node, when it held every piece (the source: zero).
    pub done_at: Vec<Option<Duration>>,
    /// Per node, whether it was lost during the run.
    pub lost: Vec<bool>,
    /// The completion tree reported every live member done (`AllDone` at its root).
    pub all_done: bool,
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// Per node, piece bytes received from each peer (duplicates included).
    pub received_from: Vec<BTreeMap<NodeId, u64>>,
    /// Piece bytes that entered each cluster over the WAN.
    pub wan_into: Vec<u64>,
    /// `wan_bytes[x][y]`: piece bytes carried from cluster x to cluster y.
    pub wan_bytes: Vec<Vec<u64>>,
    /// `entries[c][i]`: how many times piece i entered cluster c over the WAN.
    pub entries: Vec<Vec<u32>>,
    /// `wan_timeline[x][y][s]`: piece bytes carried from cluster x to cluster y that arrived
    /// during second s of the run (for utilisation over time).
    pub wan_timeline: Vec<Vec<Vec<u64>>>,
    /// Per node: with data, the copy holds every piece, verified, equal to the object;
    /// without, it holds every piece.
    pub verified: Vec<bool>,
    /// Pieces that arrived at a node that already held them.
    pub duplicates: u64,
    /// Bytes of control frames sent.
    pub control_bytes: u64,
}

impl SwarmSimReport {
    /// Live receivers that did not finish.
    pub fn incomplete(&self) -> Vec<NodeId> {
        (1..self.done_at.len())
            .filter(|&i| !self.lost[i] && self.done_at[i].is_none())
            .collect()
    }

    /// When the last live receiver finished (`None` if one did not).
    pub fn last_done(&self) -> Option<Duration> {
        if !self.incomplete().is_empty() {
            return None;
        }
        (1..self.done_at.len())
            .filter(|&i| !self.lost[i])
            .filter_map(|i| self.done_at[i])
            .max()
    }

    /// Object size over the time until the last live receiver finished, bytes per second
    /// (0 if one did not).
    pub fn throughput(&self) -> f64 {
        self.last_done()
            .map_or(0.0, |t| self.object_len as f64 / t.as_secs_f64().max(1e-9))
    }

    /// WAN bytes into each cluster as multiples of the object size.
    pub fn wan_multiples(&self) -> Vec<f64> {
        self.wan_into
            .iter()
            .map(|&b| b as f64 / self.object_len.max(1) as f64)
            .collect()
    }
}

#[derive(Debug)]
enum Payload {
    Wire(Vec<u8>),
    Piece(u64, Option<Chunk>),
}

#[derive(Debug)]
struct Msg {
    from: NodeId,
    to: NodeId,
    bytes: u64,
    payload: Payload,
    hops: [usize; 3],
    /// Latency after each hop.
    after: [Duration; 3],
    nhops: usize,
    hop: usize,
}

#[derive(Debug)]
struct Server {
    rate: f64,
    queue: VecDeque<usize>,
    busy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Change(usize),
    Loss(usize),
    HopDone(usize),
    Arrive(usize),
    Timer(NodeId),
}

struct SimNode {
    node: SwarmNode,
    alive: bool,
    timer: Option<Instant>,
    store: Vec<Option<Chunk>>,
}

/// Runs a plan to the end: the completion tree reports everyone done, nothing can happen any
/// more, or the time limit.
pub fn run(spec: SwarmSimSpec) -> SwarmSimReport {
    Sim::new(spec).run()
}

struct Sim {
    spec: SwarmSimSpec,
    start: Instant,
    now: Instant,
    pieces: u64,
    labels: Vec<u32>,
    nodes: Vec<SimNode>,
    servers: Vec<Server>,
    msgs: Vec<Option<Msg>>,
    free: Vec<usize>,
    heap: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    seq: u64,
    inflight: HashMap<(NodeId, NodeId), u64>,
    dirty: Vec<bool>,
    dirty_list: Vec<NodeId>,
    object: Vec<u8>,
    report: SwarmSimReport,
}

impl Sim {
    fn new(mut spec: SwarmSimSpec) -> Self {
        let start = Instant::now();
        let topo = &spec.topology;
        let n = topo.nodes();
        let c = topo.clusters.len();
        let pieces = spec.object_len.div_ceil(spec.piece_len as u64);
        spec.config.pieces = pieces;
        spec.config.seed = spec.seed;
        let labels = topo.labels();
        let keys = Keys::derive(&Secret::from_bytes([0x5a; 32]));
        let mut rng = SmallRng::seed_from_u64(spec.seed);
        let object: Vec<u8> = if spec.data {
            (0..spec.object_len).map(|_| rng.gen()).collect()
        } else {
            Vec::new()
        };
        let nodes = (0..n)
            .map(|i| {
                let node = SwarmNode::new(
                    spec.config.clone(),
                    keys.clone(),
                    &labels,
                    i,
                    Some(&spec.tree),
                    start,
                )
                .expect("valid simulation plan");
                let mut store = vec![None; if spec.data { pieces as usize } else { 0 }];
                if i == 0 && spec.data {
                    for (k, s) in store.iter_mut().enumerate() {
                        let lo = k * spec.piece_len as usize;
                        let hi = (lo + spec.piece_len as usize).min(object.len());
                        *s = Some(keys.seal(
                            spec.config.session,
                            k as u64,
                            Bytes::copy_from_slice(&object[lo..hi]),
                        ));
                    }
                }
                SimNode {
                    node,
                    alive: true,
                    timer: None,
                    store,
                }
            })
            .collect();
        let mut servers: Vec<Server> = Vec::with_capacity(2 * n + c * c);
        for _ in 0..n {
            servers.push(Server {
                rate: topo.access_up,
                queue: VecDeque::new(),
                busy: false,
            });
        }
        for _ in 0..n {
            servers.push(Server {
                rate: topo.access_down,
                queue: VecDeque::new(),
                busy: false,
            });
        }
        for x in 0..c {
            for y in 0..c {
                servers.push(Server {
                    rate: topo.wan[x][y].max(1.0),
                    queue: VecDeque::new(),
                    busy: false,
                });
            }
        }
        let report = SwarmSimReport {
            strategy: spec.config.strategy,
            object_len: spec.object_len,
            done_at: vec![None; n],
            lost: vec![false; n],
            all_done: false,
            elapsed: Duration::ZERO,
            received_from: vec![BTreeMap::new(); n],
            wan_into: vec![0; c],
            wan_bytes: vec![vec![0; c]; c],
            entries: vec![vec![0; pieces as usize]; c],
            wan_timeline: vec![vec![Vec::new(); c]; c],
            verified: vec![false; n],
            duplicates: 0,
            control_bytes: 0,
        };
        Self {
            spec,
            start,
            now: start,
            pieces,
            labels,
            nodes,
            servers,
            msgs: Vec::new(),
            free: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            inflight: HashMap::new(),
            dirty: vec![false; n],
            dirty_list: Vec::new(),
            object,
            report,
        }
    }

    fn cluster(&self, n: NodeId) -> usize {
        self.labels[n] as usize
    }

    fn at(&mut self, t: Instant, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn mark(&mut self, n: NodeId) {
        if !self.dirty[n] {
            self.dirty[n] = true;
            self.dirty_list.push(n);
        }
    }

    fn run(mut self) -> SwarmSimReport {
        let n = self.nodes.len();
        for i in 0..self.spec.wan_changes.len() {
            let t = self.start + self.spec.wan_changes[i].at;
            self.at(t, Ev::Change(i));
        }
        for i in 0..self.spec.lost.len() {
            let t = self.start + self.spec.lost[i].0;
            self.at(t, Ev::Loss(i));
        }
        self.report.done_at[0] = Some(Duration::ZERO);
        for a in 0..n {
            for b in self.nodes[a].node.connect_to().to_vec() {
                self.connect(a, b);
            }
        }
        for a in 0..n {
            self.mark(a);
        }
        self.settle();
        let limit = self.start + self.spec.time_limit;
        while !self.report.all_done {
            let Some(Reverse((t, _, ev))) = self.heap.pop() else {
                break;
            };
            if t > limit {
                self.now = limit;
                break;
            }
            self.now = self.now.max(t);
            self.event(ev);
            self.settle();
        }
        self.finish()
    }

    fn connect(&mut self, a: NodeId, b: NodeId) {
        if a == b || !self.nodes[a].alive || !self.nodes[b].alive {
            return;
        }
        let now = self.now;
        self.nodes[a].node.handle_connected(b, now);
        self.nodes[b].node.handle_connected(a, now);
        self.mark(a);
        self.mark(b);
    }

    fn window(&self, a: NodeId, b: NodeId) -> u64 {
        let topo = &self.spec.topology;
        let (x, y) = (self.cluster(a), self.cluster(b));
        let (rate, rtt) = if x == y {
            (topo.access_up.min(topo.access_down), 2 * topo.lan_latency)
        } else {
            (topo.wan[x][y], 2 * topo.wan_latency)
        };
        let bdp = (rate * rtt.as_secs_f64()) as u64;
        // As the network driver commits them: one piece queued to the writer, up to 128 KiB
        // unsent in the socket, and the congestion window in flight.
        self.spec.piece_len as u64 + 128 + (128 << 10) + 2 * bdp
    }

    fn event(&mut self, ev: Ev) {
        match ev {
            Ev::Change(i) => {
                let ch = self.spec.wan_changes[i];
                let c = self.spec.topology.clusters.len();
                let n = self.nodes.len();
                self.servers[2 * n + ch.from * c + ch.to].rate = ch.rate.max(1.0);
            }
            Ev::Loss(i) => {
                let (_, k) = self.spec.lost[i];
                if k < self.nodes.len() && self.nodes[k].alive {
                    self.nodes[k].alive = false;
                    self.report.lost[k] = true;
                    let now = self.now;
                    for j in 0..self.nodes.len() {
                        if self.nodes[j].alive {
                            self.nodes[j].node.handle_member_lost(k, now);
                            self.mark(j);
                        }
                    }
                }
            }
            Ev::HopDone(s) => {
                let Some(m) = self.servers[s].queue.pop_front() else {
                    return;
                };
                self.servers[s].busy = false;
                let (hop, nhops, after) = {
                    let msg = self.msgs[m].as_mut().expect("queued message exists");
                    let hop = msg.hop;
                    msg.hop += 1;
                    (hop, msg.nhops, msg.after[hop])
                };
                let t = self.now + after;
                if hop + 1 == nhops && after.is_zero() {
                    self.deliver(m);
                } else {
                    self.at(t, Ev::Arrive(m));
                }
                self.serve(s);
            }
            Ev::Arrive(m) => {
                let (hop, nhops, server) = {
                    let msg = self.msgs[m].as_ref().expect("message in flight");
                    (msg.hop, msg.nhops, msg.hops[msg.hop.min(2)])
                };
                if hop == nhops {
                    self.deliver(m);
                } else {
                    self.servers[server].queue.push_back(m);
                    self.serve(server);
                }
            }
            Ev::Timer(k) => {
                let now = self.now;
                let sn = &mut self.nodes[k];
                if sn.alive && sn.timer.is_some_and(|t| t <= now) {
                    sn.timer = None;
                    sn.node.handle_timeout(now);
                    self.mark(k);
                }
            }
        }
    }

    fn serve(&mut self, s: usize) {
        if self.servers[s].busy {
            return;
        }
        let Some(&m) = self.servers[s].queue.front() else {
            return;
        };
        let bytes = self.msgs[m].as_ref().map_or(0, |x| x.bytes);
        self.servers[s].busy = true;
        let t = self.now + Duration::from_secs_f64(bytes as f64 / self.servers[s].rate);
        self.at(t, Ev::HopDone(s));
    }

    fn send(&mut self, a: NodeId, b: NodeId, t: Transmit) {
        let (bytes, payload) = match t {
            Transmit::Frame(f) => {
                let v = f.encode().to_vec();
                self.report.control_bytes += v.len() as u64;
                (v.len() as u64, Payload::Wire(v))
            }
            Transmit::Piece(i) => {
                let len = self.piece_len(i);
                let chunk = if self.spec.data {
                    let c = self.nodes[a].store[i as usize].clone();
                    assert!(
                        c.is_some(),
                        "node {a} asked to send piece {i} it does not store"
                    );
                    c
                } else {
                    None
                };
                (
                    (wire::HEADER_LEN + 8 + 64) as u64 + len,
                    Payload::Piece(i, chunk),
                )
            }
        };
        *self.inflight.entry((a, b)).or_insert(0) += bytes;
        let n = self.nodes.len();
        let c = self.spec.topology.clusters.len();
        let (x, y) = (self.cluster(a), self.cluster(b));
        let topo = &self.spec.topology;
        let (hops, after, nhops) = if x == y {
            (
                [a, n + b, 0],
                [topo.lan_latency, Duration::ZERO, Duration::ZERO],
                2,
            )
        } else {
            (
                [a, 2 * n + x * c + y, n + b],
                [Duration::ZERO, topo.wan_latency, Duration::ZERO],
                3,
            )
        };
        let msg = Msg {
            from: a,
            to: b,
            bytes,
            payload,
            hops,
            after,
            nhops,
            hop: 0,
        };
        let m = match self.free.pop() {
            Some(m) => {
                self.msgs[m] = Some(msg);
                m
            }
            None => {
                self.msgs.push(Some(msg));
                self.msgs.len() - 1
            }
        };
        self.servers[a].queue.push_back(m);
        self.serve(a);
    }

    fn piece_len(&self, i: u64) -> u64 {
        let pl = self.spec.piece_len as u64;
        (self.spec.object_len - i * pl).min(pl)
    }

    fn deliver(&mut self, m: usize) {
        let Some(msg) = self.msgs[m].take() else {
            return;
        };
        self.free.push(m);
        let (a, b) = (msg.from, msg.to);
        if let Some(x) = self.inflight.get_mut(&(a, b)) {
            *x = x.saturating_sub(msg.bytes);
        }
        self.mark(a);
        if !self.nodes[a].alive || !self.nodes[b].alive {
            return;
        }
        let now = self.now;
        let res = match msg.payload {
            Payload::Wire(v) => {
                let frame = match wire::decode_from(&mut BytesMut::from(&v[..]), wire::MAX_FRAME) {
                    Ok(Some(f)) => f,
                    other => panic!("node {b}: undecodable frame from {a}: {other:?}"),
                };
                self.nodes[b].node.handle_frame(a, frame, now)
            }
            Payload::Piece(i, chunk) => {
                let len = self.piece_len(i);
                *self.report.received_from[b].entry(a).or_insert(0) += len;
                let (x, y) = (self.cluster(a), self.cluster(b));
                if x != y {
                    self.report.wan_into[y] += len;
                    self.report.wan_bytes[x][y] += len;
                    self.report.entries[y][i as usize] += 1;
                    let sec = (now - self.start).as_secs() as usize;
                    let tl = &mut self.report.wan_timeline[x][y];
                    if tl.len() <= sec {
                        tl.resize(sec + 1, 0);
                    }
                    tl[sec] += len;
                }
                match chunk {
                    Some(c) => self.nodes[b].node.handle_frame(a, Frame::Chunk(c), now),
                    None => self.nodes[b].node.handle_verified_piece(a, i, now),
                }
            }
        };
        if let Err(e) = res {
            panic!("node {b}: protocol error from {a}: {e}");
        }
        self.mark(b);
    }

    fn settle(&mut self) {
        let mut rounds = 0u64;
        while let Some(k) = self.dirty_list.pop() {
            self.dirty[k] = false;
            self.pump(k);
            rounds += 1;
            assert!(rounds < 50_000_000, "simulation did not settle (livelock)");
        }
    }

    fn pump(&mut self, k: NodeId) {
        if !self.nodes[k].alive {
            return;
        }
        let now = self.now;
        loop {
            let mut moved = false;
            // Events first: a piece just verified is stored before it can be asked for.
            while let Some(ev) = self.nodes[k].node.poll_event() {
                moved = true;
                self.node_event(k, ev);
            }
            let peers: Vec<NodeId> = self.nodes[k].node.peers().collect();
            for p in peers {
                if !self.nodes[p].alive {
                    continue;
                }
                // As the driver does: control frames go out whether or not the window is full.
                while let Some(f) = self.nodes[k].node.poll_control(p, now) {
                    self.send(k, p, Transmit::Frame(f));
                    moved = true;
                }
                let w = self.window(k, p);
                while self.inflight.get(&(k, p)).copied().unwrap_or(0) < w {
                    let Some(t) = self.nodes[k].node.poll_transmit(p, now) else {
                        break;
                    };
                    self.send(k, p, t);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        let t = self.nodes[k].node.poll_timeout();
        if let Some(t) = t {
            if self.nodes[k].timer.is_none_or(|x| x != t) {
                self.nodes[k].timer = Some(t);
                self.at(t.max(now), Ev::Timer(k));
            }
        } else {
            self.nodes[k].timer = None;
        }
    }

    fn node_event(&mut self, k: NodeId, ev: SwarmEvent) {
        match ev {
            SwarmEvent::Piece { chunk, .. } => {
                let i = chunk.index as usize;
                if let Some(s) = self.nodes[k].store.get_mut(i) {
                    s.get_or_insert(chunk);
                }
            }
            SwarmEvent::Corrupt { from, index, error } => {
                panic!("node {k}: piece {index} from {from} failed verification: {error}")
            }
            SwarmEvent::Connect { peer } => self.connect(k, peer),
            SwarmEvent::Complete => {
                self.report.done_at[k].get_or_insert(self.now - self.start);
            }
            SwarmEvent::AllDone => {
                let root = (0..self.nodes.len()).find(|&j| self.nodes[j].alive);
                if root == Some(k) {
                    self.report.all_done = true;
                }
            }
        }
    }

    fn finish(mut self) -> SwarmSimReport {
        self.report.elapsed = self.now - self.start;
        let pl = self.spec.piece_len as usize;
        for (k, sn) in self.nodes.iter().enumerate() {
            self.report.duplicates += sn.node.duplicates();
            let whole = sn.node.have().len() == self.pieces;
            self.report.verified[k] = whole
                && (!self.spec.data
                    || sn.store.iter().enumerate().all(|(i, c)| {
                        c.as_ref().is_some_and(|c| {
                            let lo = i * pl;
                            let hi = (lo + pl).min(self.object.len());
                            c.data[..] == self.object[lo..hi]
                        })
                    }));
        }
        self.report
    }
}
