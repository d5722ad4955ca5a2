//! The simulated network: clusters, access and WAN links, the paper's WAN conditions, and
//! the bounds a run is measured against (max-flow broadcast rate, the planned tree).

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::tree::{NodeId, Tree, SOURCE};

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

    /// Each node's cluster index, as the membership labels [`crate::swarm::SwarmNode::new`] takes.
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
