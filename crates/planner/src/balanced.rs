//! Balanced multi-trees: several spanning trees with individual rates that together overload
//! no access link, path or WAN link (Balanced Multicasting, seed 004 section 2.4).
//!
//! The trees come from fractional packing (Garg-Könemann): every resource has a price that
//! grows exponentially with its use; each round adds the cheapest tree under those prices (a
//! minimum arborescence, since a tree's price is the sum of its edges' prices) at the rate its
//! tightest resource allows. The prices also give a dual upper bound on the best rate (price
//! of the capacities / price of the cheapest tree). The trees found, plus the single-tree
//! plans as seeds, then go through a small LP for their best rates; the `max_trees` best are
//! kept and re-rated by the same LP, so the rates are feasible by construction.

use std::collections::HashMap;

use bulkcast_proto::tree::Tree;

use crate::arbor::min_arborescence;
use crate::bound::best_rates;
use crate::rate::usage;
use crate::{Network, PlanError};

/// How long the packing runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PackingLimits {
    /// Garg-Könemann accuracy parameter (smaller is closer to optimal and slower).
    pub epsilon: f64,
    /// Most pricing rounds.
    pub max_rounds: usize,
}

impl PackingLimits {
    /// Rounds scaled so a run costs about the same for any size (each round is O(n^2)).
    pub fn for_size(nodes: usize) -> Self {
        let per_round = (nodes * nodes).max(1);
        Self {
            epsilon: 0.1,
            max_rounds: (200_000_000 / per_round).clamp(100, 5000),
        }
    }
}

/// Result of the packing: distinct trees with the total rate the rounds gave them, and the
/// best dual upper bound seen.
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    pub trees: Vec<(Tree, f64)>,
    pub upper: f64,
}

/// Balanced multi-trees with at most `max_trees` trees (>= 1); `seeds` are candidate trees to
/// consider besides those the packing finds. Returns `(tree, rate Mbit/s)` pairs, the best
/// first; with no capacities known, the first seed (or the RTT MST) at an infinite rate.
/// Every tree respects the hosts file's `max_fanout` (packed trees that do not are dropped).
pub fn balanced(
    net: &Network,
    seeds: &[Tree],
    max_trees: usize,
) -> Result<Vec<(Tree, f64)>, PlanError> {
    balanced_with(net, seeds, max_trees, PackingLimits::for_size(net.len()))
}

/// [`balanced`] with explicit packing limits.
pub fn balanced_with(
    net: &Network,
    seeds: &[Tree],
    max_trees: usize,
    limits: PackingLimits,
) -> Result<Vec<(Tree, f64)>, PlanError> {
    let max_trees = max_trees.max(1);
    if net.is_uncapacitated() {
        let t = seeds
            .first()
            .cloned()
            .unwrap_or_else(|| crate::trees::mst(net));
        return Ok(vec![(t, f64::INFINITY)]);
    }
    let res = net.resources();
    let packing = pack(net, seeds, limits);
    // Keep the most promising candidates for the LP (seeds first, then by packed rate).
    let mut cands: Vec<(Tree, f64)> = seeds.iter().map(|t| (t.clone(), f64::INFINITY)).collect();
    let mut found = packing.trees;
    // Ties broken by the parent vector so the plan does not depend on hash order.
    found.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| a.0.parents().cmp(b.0.parents()))
    });
    // The rating LP has one column per candidate and a row per resource; fewer candidates
    // for big networks keep it quick.
    let keep = (40_000 / net.len()).clamp(30, 400);
    cands.extend(found.into_iter().take(keep));
    dedup(&mut cands);
    // The hosts file's fan-out limits hold per tree; packed trees that break them are dropped.
    cands.retain(|(t, _)| respects_fanout(net, t));
    let rate_of = |trees: &[Tree]| -> Result<Vec<f64>, PlanError> {
        let u: Vec<Vec<u32>> = trees.iter().map(|t| usage(&res, t)).collect();
        best_rates(&res.caps, &u)
    };
    let trees: Vec<Tree> = cands.into_iter().map(|c| c.0).collect();
    let rates = rate_of(&trees)?;
    let mut order: Vec<usize> = (0..trees.len()).filter(|&i| rates[i] > 0.0).collect();
    order.sort_by(|&a, &b| rates[b].total_cmp(&rates[a]));
    if order.is_empty() {
        let limits = crate::trees::fanout_limits(net, None);
        let t = crate::trees::dcmst(net, &limits).unwrap_or_else(|_| crate::trees::mst(net));
        let r = crate::rate::tree_rate(net, &t);
        return Ok(vec![(t, r)]);
    }
    // The LP's largest max_trees trees, re-rated alone; then swaps: the next candidates in
    // turn replace the slowest kept tree while that raises the total.
    let split = order.len().min(max_trees);
    let mut kept: Vec<Tree> = order[..split].iter().map(|&i| trees[i].clone()).collect();
    let mut kept_rates = rate_of(&kept)?;
    let swaps = if net.len() <= 200 { 30 } else { 8 };
    for &i in order[split..].iter().take(swaps) {
        let slowest = (0..kept.len())
            .min_by(|&a, &b| kept_rates[a].total_cmp(&kept_rates[b]))
            .unwrap_or(0);
        let mut trial = kept.clone();
        trial[slowest] = trees[i].clone();
        let trial_rates = rate_of(&trial)?;
        if trial_rates.iter().sum::<f64>() > kept_rates.iter().sum::<f64>() * (1.0 + 1e-9) {
            kept = trial;
            kept_rates = trial_rates;
        }
    }
    let mut out: Vec<(Tree, f64)> = kept.into_iter().zip(kept_rates).collect();
    // Trees under 2% of the total add their slow per-hop chunk time to the completion time for
    // little rate: drop them when the others, re-rated, keep at least 97% of the total.
    let total: f64 = out.iter().map(|t| t.1).sum();
    if out.iter().any(|t| t.1 < 0.02 * total) {
        let big: Vec<Tree> = out
            .iter()
            .filter(|t| t.1 >= 0.02 * total)
            .map(|t| t.0.clone())
            .collect();
        let big_rates = rate_of(&big)?;
        if big_rates.iter().sum::<f64>() >= 0.97 * total {
            out = big.into_iter().zip(big_rates).collect();
        }
    }
    out.retain(|t| t.1 > 1e-9);
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    if out.is_empty() {
        let t = crate::trees::mst(net);
        let r = crate::rate::tree_rate(net, &t);
        out.push((t, r));
    }
    Ok(out)
}

fn respects_fanout(net: &Network, t: &Tree) -> bool {
    let mut kids = vec![0usize; t.len()];
    for p in t.parents().iter().flatten() {
        kids[*p] += 1;
    }
    kids.iter()
        .enumerate()
        .all(|(v, &k)| net.max_fanout(v).is_none_or(|l| k <= l))
}

fn dedup(trees: &mut Vec<(Tree, f64)>) {
    let mut seen = std::collections::HashSet::new();
    trees.retain(|t| seen.insert(t.0.parents().to_vec()));
}

/// Garg-Könemann fractional packing of spanning arborescences under the resource capacities.
pub(crate) fn pack(net: &Network, seeds: &[Tree], limits: PackingLimits) -> Packing {
    let n = net.len();
    let res = net.resources();
    let m = res.len();
    if m == 0 || n <= 1 {
        return Packing {
            trees: seeds.iter().map(|t| (t.clone(), f64::INFINITY)).collect(),
            upper: f64::INFINITY,
        };
    }
    let eps = limits.epsilon.clamp(1e-3, 0.5);
    let delta = (1.0 + eps) / ((1.0 + eps) * m as f64).powf(1.0 / eps);
    let mut price: Vec<f64> = res.caps.iter().map(|c| delta / c).collect();
    // Resource ids of every edge, computed once.
    // An edge uses at most four resources (uplink, downlink, path, WAN); NONE pads.
    const NONE: u32 = u32::MAX;
    let mut edge_res: Vec<[u32; 4]> = vec![[NONE; 4]; n * n];
    for i in 0..n {
        for j in 1..n {
            if i != j {
                let mut k = 0;
                res.for_edge(i, j, |r| {
                    edge_res[i * n + j][k] = r as u32;
                    k += 1;
                });
            }
        }
    }
    let mut cost = vec![0.0; n * n];
    let mut found: HashMap<Vec<usize>, f64> = HashMap::new();
    let mut upper = f64::INFINITY;
    for _ in 0..limits.max_rounds {
        for (c, rs) in cost.iter_mut().zip(&edge_res) {
            *c = rs
                .iter()
                .filter(|&&r| r != NONE)
                .map(|&r| price[r as usize])
                .sum();
        }
        for v in 0..n {
            cost[v * n + v] = f64::INFINITY;
            cost[v * n] = f64::INFINITY;
        }
        let parent = min_arborescence(n, &cost);
        let mut use_count = vec![0u32; m];
        let mut alpha = 0.0;
        for v in 1..n {
            alpha += cost[parent[v] * n + v];
            for &r in edge_res[parent[v] * n + v].iter().filter(|&&r| r != NONE) {
                use_count[r as usize] += 1;
            }
        }
        let d: f64 = price.iter().zip(&res.caps).map(|(p, c)| p * c).sum();
        if alpha > 0.0 {
            upper = upper.min(d / alpha);
        }
        if d >= 1.0 {
            break;
        }
        let y = use_count
            .iter()
            .zip(&res.caps)
            .filter(|(u, _)| **u > 0)
            .map(|(&u, &c)| c / f64::from(u))
            .fold(f64::INFINITY, f64::min);
        if !y.is_finite() {
            // A tree that uses no finite resource: the rate is unbounded.
            upper = f64::INFINITY;
            break;
        }
        for (r, &u) in use_count.iter().enumerate() {
            if u > 0 {
                price[r] *= 1.0 + eps * y * f64::from(u) / res.caps[r];
            }
        }
        *found.entry(parent).or_insert(0.0) += y;
    }
    let trees = found
        .into_iter()
        .filter_map(|(p, y)| {
            let parents = (0..n).map(|v| (v != 0).then_some(p[v])).collect();
            Tree::from_parents(parents).ok().map(|t| (t, y))
        })
        .collect();
    Packing { trees, upper }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;
    use crate::rate::rates_feasible;

    #[test]
    fn two_trees_beat_one_when_relays_have_small_uplinks() {
        // Same instance as the bound's unit test: the optimum 60 needs three trees.
        let mut net = Network::new(Matrix::filled(3, 1.0)).unwrap();
        net.set_uplink(0, Some(100.0)).unwrap();
        net.set_uplink(1, Some(10.0)).unwrap();
        net.set_uplink(2, Some(10.0)).unwrap();
        let trees = balanced(&net, &[], 8).unwrap();
        let total: f64 = trees.iter().map(|t| t.1).sum();
        assert!((total - 60.0).abs() < 1e-6, "{trees:?}");
        assert!(rates_feasible(&net, &trees));
        let single = balanced(&net, &[], 1).unwrap();
        assert_eq!(single.len(), 1);
        assert!(single[0].1 <= 50.0 + 1e-9);
        let packing = pack(&net, &[], PackingLimits::for_size(3));
        assert!(
            packing.upper >= 60.0 - 1e-6 && packing.upper < 70.0,
            "{}",
            packing.upper
        );
    }
}
