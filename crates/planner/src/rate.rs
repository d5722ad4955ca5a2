//! Predicted rates and completion times of plans under the capacity model of [`crate::network`].
//!
//! A single tree pushes the whole object through every edge, so with rate `r` a node with `k`
//! children sends `k * r` through its uplink, and a WAN link crossed by `m` tree edges carries
//! `m * r`. The tree's rate is the largest `r` every resource can carry:
//! `min over resources of capacity / (tree edges using it)`. Several trees with rates `r_t`
//! (sender-side shaped, as Balanced Multicasting does) load each resource with
//! `sum_t r_t * (edges of tree t using it)`; their rates are feasible when no resource is
//! overloaded, and the plan's rate is `sum_t r_t`.

use bulkcast_proto::tree::{NodeId, Tree};

use crate::network::{Network, ResourceKind, Resources};

/// Relative slack allowed when checking loads against capacities (LP round-off).
pub const LOAD_TOLERANCE: f64 = 1e-6;

/// The rate (Mbit/s) one tree sustains alone; infinite when nothing limits it.
pub fn tree_rate(net: &Network, tree: &Tree) -> f64 {
    let res = net.resources();
    let usage = usage(&res, tree);
    usage
        .iter()
        .zip(&res.caps)
        .filter(|(u, _)| **u > 0)
        .map(|(&u, &c)| c / u as f64)
        .fold(f64::INFINITY, f64::min)
}

/// Describes the resource that limits `tree` (e.g. "uplink of fra-1 shared by 3 children"),
/// or `None` when nothing does.
pub fn tree_bottleneck(net: &Network, tree: &Tree) -> Option<String> {
    let res = net.resources();
    let usage = usage(&res, tree);
    let (r, _) = usage
        .iter()
        .zip(&res.caps)
        .enumerate()
        .filter(|(_, (u, _))| **u > 0)
        .map(|(r, (&u, &c))| (r, c / u as f64))
        .min_by(|a, b| a.1.total_cmp(&b.1))?;
    let u = usage[r];
    Some(match &res.kinds[r] {
        ResourceKind::Uplink(i) => format!("uplink of {} shared by {u} children", net.name(*i)),
        ResourceKind::Downlink(i) => format!("downlink of {}", net.name(*i)),
        ResourceKind::Path(i, j) => format!("path {} -> {}", net.name(*i), net.name(*j)),
        ResourceKind::Wan(a, b) => format!("WAN {a} -> {b} crossed by {u} tree edges"),
    })
}

/// Each resource's load (Mbit/s) when the trees run at their rates.
pub fn loads(net: &Network, trees: &[(Tree, f64)]) -> Vec<f64> {
    let res = net.resources();
    let mut load = vec![0.0; res.len()];
    for (tree, rate) in trees {
        for (l, u) in load.iter_mut().zip(usage(&res, tree)) {
            *l += rate * u as f64;
        }
    }
    load
}

/// True when trees at their rates overload no resource (within [`LOAD_TOLERANCE`]).
pub fn rates_feasible(net: &Network, trees: &[(Tree, f64)]) -> bool {
    let caps = net.resources().caps;
    loads(net, trees)
        .iter()
        .zip(&caps)
        .all(|(l, c)| *l <= c * (1.0 + LOAD_TOLERANCE) + LOAD_TOLERANCE)
}

/// How many tree edges use each resource.
pub(crate) fn usage(res: &Resources, tree: &Tree) -> Vec<u32> {
    let mut usage = vec![0u32; res.len()];
    for (child, parent) in tree.parents().iter().enumerate() {
        if let Some(p) = parent {
            res.for_edge(*p, child, |r| usage[r] += 1);
        }
    }
    usage
}

/// Time-to-deliver model for an object: pipelined, so the object streams at the plan's rate
/// and the last byte additionally waits for the deepest path's start-up latency (one RTT per
/// hop) and store-and-forward of one chunk per hop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective {
    /// Object size in bytes.
    pub size_bytes: u64,
    /// Chunk size in bytes (the relay forwarding unit).
    pub chunk_bytes: u64,
}

impl Default for Objective {
    /// 1 GiB in 1 MiB chunks.
    fn default() -> Self {
        Self {
            size_bytes: 1 << 30,
            chunk_bytes: 1 << 20,
        }
    }
}

/// Predicted seconds until every node has the object when `trees` run at their rates
/// (`rate` = their sum, Mbit/s): `size / rate` plus, for the slowest root-to-leaf path of any
/// tree, the sum over its hops of the hop's RTT and one chunk's transmission at that tree's rate.
pub fn completion_secs(net: &Network, trees: &[(Tree, f64)], obj: Objective) -> f64 {
    let total: f64 = trees.iter().map(|t| t.1).sum();
    let stream = if total.is_finite() && total > 0.0 {
        obj.size_bytes as f64 * 8.0 / (total * 1e6)
    } else if total > 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    let pipeline = trees
        .iter()
        .map(|(tree, rate)| {
            let chunk = if rate.is_finite() && *rate > 0.0 {
                obj.chunk_bytes as f64 * 8.0 / (rate * 1e6)
            } else {
                0.0
            };
            path_latency(net, tree, chunk)
        })
        .fold(0.0, f64::max);
    stream + pipeline
}

/// Longest root-to-node sum of (hop RTT in seconds + `per_hop_secs`).
pub fn path_latency(net: &Network, tree: &Tree, per_hop_secs: f64) -> f64 {
    let mut at = vec![f64::NAN; tree.len()];
    at[0] = 0.0;
    let mut worst: f64 = 0.0;
    for v in 1..tree.len() {
        worst = worst.max(latency_to(net, tree, v, per_hop_secs, &mut at));
    }
    worst
}

fn latency_to(net: &Network, tree: &Tree, v: NodeId, hop: f64, memo: &mut [f64]) -> f64 {
    // Iterative walk up to the nearest memoised ancestor, then fill back down.
    let mut chain = Vec::new();
    let mut at = v;
    while memo[at].is_nan() {
        chain.push(at);
        at = tree.parent(at).unwrap_or(0);
    }
    let mut acc = memo[at];
    for &c in chain.iter().rev() {
        let p = tree.parent(c).unwrap_or(0);
        acc += net.rtt(p, c) / 1000.0 + hop;
        memo[c] = acc;
    }
    memo[v]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;

    #[test]
    fn tree_rate_shares_uplinks_and_wan() {
        // 0 -> {1, 2}, 2 -> 3. Uplink of 0 is 100 (two children: 50 each); 3's downlink 40.
        let mut net = Network::new(Matrix::filled(4, 10.0)).unwrap();
        net.set_uplink(0, Some(100.0)).unwrap();
        let tree = Tree::from_parents(vec![None, Some(0), Some(0), Some(2)]).unwrap();
        assert_eq!(tree_rate(&net, &tree), 50.0);
        net.set_downlink(3, Some(40.0)).unwrap();
        assert_eq!(tree_rate(&net, &tree), 40.0);
        assert_eq!(tree_bottleneck(&net, &tree).unwrap(), "downlink of 3");
        // A WAN link from site a (0, 2) to site b (1, 3) crossed twice: 60 / 2 = 30.
        for (i, s) in ["a", "b", "a", "b"].iter().enumerate() {
            net.set_site(i, Some(s)).unwrap();
        }
        net.set_wan("a", "b", 60.0).unwrap();
        assert_eq!(tree_rate(&net, &tree), 30.0);
        assert!(rates_feasible(&net, &[(tree.clone(), 30.0)]));
        assert!(!rates_feasible(&net, &[(tree.clone(), 31.0)]));
        assert_eq!(loads(&net, &[(tree, 10.0)]), vec![20.0, 10.0, 20.0]);
    }

    #[test]
    fn completion_time_adds_the_deepest_path() {
        let mut rtt = Matrix::filled(3, 100.0);
        rtt.set(1, 2, 50.0);
        let mut net = Network::new(rtt).unwrap();
        net.set_uplink(0, Some(80.0)).unwrap();
        let chain = Tree::kary(2, 1);
        let obj = Objective {
            size_bytes: 10_000_000,
            chunk_bytes: 1_000_000,
        };
        // 80 Mbit at 80 Mbit/s = 1 s; path 0.1 + 0.05 s RTT; 2 hops of a 0.1 s chunk.
        let t = completion_secs(&net, &[(chain.clone(), 80.0)], obj);
        assert!((t - (1.0 + 0.15 + 0.2)).abs() < 1e-9, "{t}");
        assert!((path_latency(&net, &chain, 0.0) - 0.15).abs() < 1e-12);
    }
}
