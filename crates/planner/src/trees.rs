//! Single-tree algorithms: MST on RTT, degree-constrained MST, maximum-bottleneck tree, and the
//! two-level cluster-aware tree. All trees are rooted at the source (node 0); use
//! [`Network::rooted_at`] to root elsewhere.

use bulkcast_proto::tree::{NodeId, Tree};

use crate::{Matrix, Network, PlanError};

/// Minimum spanning tree on RTT (Prim, O(n^2)), rooted at the source. RTT is symmetrised as the
/// mean of both directions; ties go to the wider edge, then to the lower node id.
pub fn mst(net: &Network) -> Tree {
    let nodes: Vec<NodeId> = (0..net.len()).collect();
    let lim = vec![usize::MAX; nodes.len()];
    let wm = weights(net);
    let parent = prim_limited(&nodes, &|a, b| wm.at(a, b), &lim);
    to_tree(&nodes, &parent, net.len())
}

/// The RTT-tree edge weight: symmetrised RTT, plus under a microsecond that grows as the
/// edge narrows, so equal RTTs (common in emulated labs) go to the wider edge without changing
/// which RTT totals are optimal.
/// Computed once per tree as a dense matrix: the searches evaluate it many times per pair.
fn weights(net: &Network) -> Matrix {
    let n = net.len();
    let mut m = Matrix::filled(n, 0.0);
    for a in 0..n {
        for b in a + 1..n {
            let cap = net.edge_capacity(a, b).min(net.edge_capacity(b, a));
            let w = net.rtt_sym(a, b) + 1e-4 / (1.0 + cap);
            m.set(a, b, w);
            m.set(b, a, w);
        }
    }
    m
}

/// Maximum-bottleneck (widest) spanning arborescence: maximises the smallest
/// [`Network::edge_capacity`] over the tree's edges, which a Prim variant does exactly (it adds
/// the outside node with the widest edge from the tree, so it never takes an edge narrower than
/// the optimum while one at least as wide leaves the tree). Among equally wide edges it prefers
/// the lower RTT, so with no capacities known it is the RTT MST.
pub fn bottleneck(net: &Network) -> Tree {
    let n = net.len();
    let mut parent: Vec<Option<NodeId>> = vec![None; n];
    let mut in_tree = vec![false; n];
    in_tree[0] = true;
    let mut key: Vec<(f64, f64, NodeId)> = (0..n)
        .map(|v| (net.edge_capacity(0, v), net.rtt(0, v), 0))
        .collect();
    for _ in 1..n {
        let v = (1..n)
            .filter(|&v| !in_tree[v])
            .max_by(|&a, &b| better_wide(key[a], key[b]))
            .expect("an outside node remains");
        in_tree[v] = true;
        parent[v] = Some(key[v].2);
        for u in 1..n {
            if !in_tree[u] {
                let cand = (net.edge_capacity(v, u), net.rtt(v, u), v);
                if better_wide(cand, key[u]) == std::cmp::Ordering::Greater {
                    key[u] = cand;
                }
            }
        }
    }
    Tree::from_parents(parent).expect("Prim spans every node from the root")
}

/// Wider first, then lower RTT, then lower id (as `Greater` = better).
fn better_wide(a: (f64, f64, NodeId), b: (f64, f64, NodeId)) -> std::cmp::Ordering {
    a.0.total_cmp(&b.0)
        .then(b.1.total_cmp(&a.1))
        .then(b.2.cmp(&a.2))
}

/// The smallest [`Network::edge_capacity`] over a tree's edges.
pub fn bottleneck_width(net: &Network, tree: &Tree) -> f64 {
    tree.parents()
        .iter()
        .enumerate()
        .filter_map(|(c, p)| p.map(|p| net.edge_capacity(p, c)))
        .fold(f64::INFINITY, f64::min)
}

/// Per-node fan-out limits (`None` = unlimited): the hosts file's `max_fanout`, and, when a
/// target rate is given and the node's uplink is known, `floor(uplink / target)` (a node that
/// cannot feed one child at the target rate becomes a leaf). The source keeps at least 1.
pub fn fanout_limits(net: &Network, target_mbps: Option<f64>) -> Vec<Option<usize>> {
    (0..net.len())
        .map(|i| {
            let mut lim = net.max_fanout(i);
            if let (Some(t), Some(up)) = (target_mbps, net.uplink(i)) {
                if t > 0.0 {
                    let by_rate = (up / t + 1e-9).floor() as usize;
                    lim = Some(lim.map_or(by_rate, |l| l.min(by_rate)));
                }
            }
            if i == 0 {
                lim = lim.map(|l| l.max(1));
            }
            lim
        })
        .collect()
}

/// Degree-constrained MST on RTT: node i gets at most `limits[i]` children.
///
/// Heuristic: Prim restricted to parents with free slots, which never strands the remaining
/// nodes (when one slot is left it only adds nodes that can forward), followed by edge-exchange
/// local search (add a non-tree edge, drop the heaviest edge on the cycle it closes whose
/// removal keeps every limit), repeated from Prim on randomly perturbed weights and on
/// Lagrangian-penalised weights (nodes the unconstrained MST over-uses get dearer), keeping the
/// lightest tree. Exchanges consider every pair up to 60 nodes, and each node's 12 nearest
/// neighbours above that; the number of restarts shrinks with n^2.
pub fn dcmst(net: &Network, limits: &[Option<usize>]) -> Result<Tree, PlanError> {
    let nodes: Vec<NodeId> = (0..net.len()).collect();
    let lim: Vec<usize> = (0..net.len())
        .map(|i| limits.get(i).copied().flatten().unwrap_or(usize::MAX))
        .collect();
    let wm = weights(net);
    let parent = dcmst_on(&nodes, &|a, b| wm.at(a, b), &lim)?;
    Ok(to_tree(&nodes, &parent, net.len()))
}

/// DCMST over a subset `nodes` (rooted at `nodes[0]`) with limits per position; returns the
/// parent position of each position (`parent[0] = 0`).
pub(crate) fn dcmst_on(
    nodes: &[NodeId],
    w: &dyn Fn(NodeId, NodeId) -> f64,
    lim: &[usize],
) -> Result<Vec<usize>, PlanError> {
    let m = nodes.len();
    let needed = m.saturating_sub(1);
    let slots = lim
        .iter()
        .fold(0usize, |a, &l| a.saturating_add(l.min(needed)));
    if m > 1 && (slots < needed || lim[0] == 0) {
        return Err(PlanError::FanoutInfeasible { slots, needed });
    }
    let mut parent = prim_limited(nodes, w, lim);
    if lim.iter().all(|&l| l >= needed) {
        return Ok(parent);
    }
    improve(nodes, w, lim, &mut parent);
    // Restarts from Prim on randomly perturbed weights (each polished on the true weights)
    // escape the greedy's worst traps; fewer restarts for big inputs keep it O(n^2)-ish.
    let weight = |p: &[usize]| (1..m).map(|v| w(nodes[p[v]], nodes[v])).sum::<f64>();
    let mut best = weight(&parent);
    let consider = |p: Vec<usize>, best: &mut f64, parent: &mut Vec<usize>| {
        let wp = weight(&p);
        if wp < *best - 1e-12 {
            *best = wp;
            *parent = p;
        }
    };
    // Effort shrinks with m^2 (each run is O(m^2)): 32 restarts for tiny inputs, none at 1000.
    let restarts = (100_000 / (m * m).max(1)).min(32);
    for r in 0..restarts {
        let noisy = |a: NodeId, b: NodeId| w(a, b) * (1.0 + 0.4 * jitter(a.min(b), a.max(b), r));
        let mut p = prim_limited(nodes, &noisy, lim);
        improve(nodes, w, lim, &mut p);
        consider(p, &mut best, &mut parent);
    }
    // Lagrangian guidance: penalise nodes the unconstrained MST over-uses, then build with
    // limits on the penalised weights and polish on the true ones.
    let mut pos = vec![usize::MAX; nodes.iter().max().map_or(0, |&x| x + 1)];
    for (i, &v) in nodes.iter().enumerate() {
        pos[v] = i;
    }
    let cap: Vec<f64> = (0..m)
        .map(|i| if i == 0 { lim[0] } else { lim[i].saturating_add(1) } as f64)
        .collect();
    let unlimited = vec![usize::MAX; m];
    let mut pi = vec![0.0f64; m];
    let iters = (200_000 / (m * m).max(1)).clamp(4, 40);
    let step0 = best / (m as f64 - 1.0).max(1.0);
    for it in 0..iters {
        let penalised = |a: NodeId, b: NodeId| w(a, b) + pi[pos[a]] + pi[pos[b]];
        let free = prim_limited(nodes, &penalised, &unlimited);
        let mut deg = vec![0.0f64; m];
        for v in 1..m {
            deg[v] += 1.0;
            deg[free[v]] += 1.0;
        }
        let mut p = prim_limited(nodes, &penalised, lim);
        improve(nodes, w, lim, &mut p);
        consider(p, &mut best, &mut parent);
        let step = step0 * (1.0 - it as f64 / iters as f64);
        let mut violated = false;
        for i in 0..m {
            violated |= deg[i] > cap[i];
            pi[i] = (pi[i] + step * (deg[i] - cap[i]).min(1.0)).max(0.0);
        }
        if !violated {
            break;
        }
    }
    Ok(parent)
}

/// Deterministic pseudo-random number in [-1, 1) for (a, b, round) (splitmix64).
fn jitter(a: usize, b: usize, round: usize) -> f64 {
    let mut z = (a as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((b as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add((round as u64 + 1).wrapping_mul(0x94D0_49BB_1331_11EB));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Prim with fan-out limits; see [`dcmst`]. Keys whose parent filled up are recomputed lazily
/// when they come up as the minimum.
fn prim_limited(nodes: &[NodeId], w: &dyn Fn(NodeId, NodeId) -> f64, lim: &[usize]) -> Vec<usize> {
    let m = nodes.len();
    let mut parent = vec![0usize; m];
    let mut in_tree = vec![false; m];
    let mut kids = vec![0usize; m];
    in_tree[0] = true;
    let mut slots: usize = lim[0].min(m);
    let mut key: Vec<(f64, usize)> = (0..m).map(|v| (w(nodes[0], nodes[v]), 0)).collect();
    for added in 1..m {
        let remaining = m - added;
        let need_forwarder = slots == 1 && remaining > 1;
        let v = loop {
            let best = (1..m)
                .filter(|&v| !in_tree[v] && (!need_forwarder || lim[v] > 0))
                .min_by(|&a, &b| key[a].0.total_cmp(&key[b].0).then(a.cmp(&b)));
            let Some(v) = best else {
                unreachable!("fan-out feasibility was checked")
            };
            let p = key[v].1;
            if kids[p] < lim[p] {
                break v;
            }
            key[v] = (0..m)
                .filter(|&u| in_tree[u] && kids[u] < lim[u])
                .map(|u| (w(nodes[u], nodes[v]), u))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
                .unwrap_or((f64::INFINITY, 0));
        };
        let p = key[v].1;
        in_tree[v] = true;
        parent[v] = p;
        kids[p] += 1;
        slots = slots - 1 + lim[v].min(m);
        if lim[v] > 0 {
            for u in 1..m {
                if !in_tree[u] {
                    let c = w(nodes[v], nodes[u]);
                    if c < key[u].0 {
                        key[u] = (c, v);
                    }
                }
            }
        }
    }
    parent
}

/// Edge-exchange local search keeping fan-out limits (in undirected terms: the root's degree
/// <= its limit, any other node's degree <= limit + 1).
fn improve(
    nodes: &[NodeId],
    w: &dyn Fn(NodeId, NodeId) -> f64,
    lim: &[usize],
    parent: &mut [usize],
) {
    let m = nodes.len();
    let cap: Vec<usize> = (0..m)
        .map(|i| {
            if i == 0 {
                lim[0]
            } else {
                lim[i].saturating_add(1)
            }
        })
        .collect();
    let mut deg = vec![0usize; m];
    for v in 1..m {
        deg[v] += 1;
        deg[parent[v]] += 1;
    }
    let cands = candidate_pairs(nodes, w);
    let mut mark = vec![usize::MAX; m];
    let mut stamp = 0usize;
    for _pass in 0..50 {
        let mut improved = false;
        for &(a, b) in &cands {
            if parent[a] == b || parent[b] == a {
                continue;
            }
            let wab = w(nodes[a], nodes[b]);
            // Path a -> lca and b -> lca, as lists of child endpoints of tree edges.
            stamp += 1;
            let mut x = a;
            mark[x] = stamp;
            while x != 0 {
                x = parent[x];
                mark[x] = stamp;
            }
            let mut b_side = Vec::new();
            let mut y = b;
            while mark[y] != stamp {
                b_side.push(y);
                y = parent[y];
            }
            let lca = y;
            let mut a_side = Vec::new();
            let mut x = a;
            while x != lca {
                a_side.push(x);
                x = parent[x];
            }
            // Best removable edge (c, parent[c]) on the cycle.
            let mut best: Option<(f64, usize, bool)> = None;
            for (&c, on_a) in a_side
                .iter()
                .map(|c| (c, true))
                .chain(b_side.iter().map(|c| (c, false)))
            {
                let we = w(nodes[c], nodes[parent[c]]);
                if we <= wab + 1e-12 || best.is_some_and(|(bw, _, _)| bw >= we) {
                    continue;
                }
                let p = parent[c];
                let d = |v: usize| {
                    deg[v] + usize::from(v == a) + usize::from(v == b)
                        - usize::from(v == c)
                        - usize::from(v == p)
                };
                if [a, b, c, p].iter().all(|&v| d(v) <= cap[v]) {
                    best = Some((we, c, on_a));
                }
            }
            let Some((_, c, on_a)) = best else { continue };
            // Drop (c, parent[c]); the side containing c hangs from the other endpoint.
            let (inner, outer) = if on_a { (a, b) } else { (b, a) };
            deg[parent[c]] -= 1;
            deg[c] -= 1;
            deg[a] += 1;
            deg[b] += 1;
            let mut prev = outer;
            let mut at = inner;
            loop {
                let next = parent[at];
                parent[at] = prev;
                if at == c {
                    break;
                }
                prev = at;
                at = next;
            }
            improved = true;
        }
        if !improved {
            break;
        }
    }
}

/// Pairs the local search tries: all pairs for small inputs, nearest neighbours otherwise.
fn candidate_pairs(nodes: &[NodeId], w: &dyn Fn(NodeId, NodeId) -> f64) -> Vec<(usize, usize)> {
    let m = nodes.len();
    let mut pairs = Vec::new();
    if m <= 60 {
        for a in 0..m {
            for b in a + 1..m {
                pairs.push((a, b));
            }
        }
    } else {
        const K: usize = 12;
        for a in 0..m {
            let mut near: Vec<(f64, usize)> = (0..m)
                .filter(|&b| b != a)
                .map(|b| (w(nodes[a], nodes[b]), b))
                .collect();
            let k = K.min(near.len() - 1);
            near.select_nth_unstable_by(k, |x, y| x.0.total_cmp(&y.0));
            pairs.extend(near.iter().take(K).map(|&(_, b)| (a.min(b), a.max(b))));
        }
        pairs.sort_unstable();
        pairs.dedup();
    }
    pairs.sort_by(|x, y| w(nodes[x.0], nodes[x.1]).total_cmp(&w(nodes[y.0], nodes[y.1])));
    pairs
}

/// Two-level cluster-aware tree (as MagPIe and MPICH-G2 do): one gateway per site (the source
/// for its own site; elsewhere the member with the largest uplink, ties to the lowest mean RTT
/// to other sites), a degree-constrained MST on RTT between the gateways, and inside every site
/// a degree-constrained MST rooted at its gateway. Limits as for [`dcmst`]; a gateway keeps one
/// slot for its own site. Where the limits leave no two-level tree it returns the plain
/// [`dcmst`] (and the [`mst`] when the limits are infeasible altogether).
pub fn cluster(net: &Network, limits: &[Option<usize>]) -> Tree {
    let n = net.len();
    let (site, count) = net.site_ids();
    let mut members: Vec<Vec<NodeId>> = vec![Vec::new(); count];
    for v in 0..n {
        members[site[v]].push(v);
    }
    let lim = |v: NodeId| limits.get(v).copied().flatten().unwrap_or(usize::MAX);
    let gateways: Vec<NodeId> = members
        .iter()
        .map(|ms| {
            if ms.contains(&0) {
                return 0;
            }
            let outside_rtt = |v: NodeId| -> f64 {
                (0..n)
                    .filter(|&u| site[u] != site[v])
                    .map(|u| net.rtt_sym(v, u))
                    .sum()
            };
            let up = |v: NodeId| net.uplink(v).unwrap_or(f64::INFINITY);
            *ms.iter()
                .max_by(|&&a, &&b| {
                    up(a)
                        .total_cmp(&up(b))
                        .then(outside_rtt(b).total_cmp(&outside_rtt(a)))
                        .then(b.cmp(&a))
                })
                .expect("sites have members")
        })
        .collect();
    let mut parent: Vec<Option<NodeId>> = vec![None; n];
    let wan_lim: Vec<usize> = gateways
        .iter()
        .zip(&members)
        .map(|(&g, ms)| lim(g).saturating_sub(usize::from(ms.len() > 1)))
        .collect();
    let wm = weights(net);
    let w = |a: NodeId, b: NodeId| wm.at(a, b);
    let Ok(wan) = dcmst_on(&gateways, &w, &wan_lim) else {
        return flat_fallback(net, limits);
    };
    let mut wan_kids = vec![0usize; n];
    for (pos, &g) in gateways.iter().enumerate().skip(1) {
        let p = gateways[wan[pos]];
        parent[g] = Some(p);
        wan_kids[p] += 1;
    }
    for (s, ms) in members.iter().enumerate() {
        let g = gateways[s];
        let mut order = vec![g];
        order.extend(ms.iter().copied().filter(|&v| v != g));
        let l: Vec<usize> = order
            .iter()
            .map(|&v| lim(v).saturating_sub(wan_kids[v]))
            .collect();
        let Ok(inner) = dcmst_on(&order, &w, &l) else {
            return flat_fallback(net, limits);
        };
        for (pos, &v) in order.iter().enumerate().skip(1) {
            parent[v] = Some(order[inner[pos]]);
        }
    }
    Tree::from_parents(parent).expect("gateway tree plus site trees span every node")
}

/// When the limits leave no two-level tree (gateways without free fan-out, a site of leaves),
/// the one-level DCMST; and the MST when even that is infeasible.
fn flat_fallback(net: &Network, limits: &[Option<usize>]) -> Tree {
    dcmst(net, limits).unwrap_or_else(|_| mst(net))
}

fn to_tree(nodes: &[NodeId], parent_pos: &[usize], n: usize) -> Tree {
    let mut parent = vec![None; n];
    for (pos, &v) in nodes.iter().enumerate().skip(1) {
        parent[v] = Some(nodes[parent_pos[pos]]);
    }
    Tree::from_parents(parent).expect("Prim spans every node from the root")
}

/// Sum of symmetrised RTTs over a tree's edges.
pub fn rtt_weight(net: &Network, tree: &Tree) -> f64 {
    tree.parents()
        .iter()
        .enumerate()
        .filter_map(|(c, p)| p.map(|p| net.rtt_sym(p, c)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;

    fn line(n: usize) -> Network {
        // Nodes on a line at positions 0..n: MST is the chain.
        let mut m = Matrix::filled(n, 0.0);
        for i in 0..n {
            for j in 0..n {
                m.set(i, j, (i as f64 - j as f64).abs());
            }
        }
        Network::new(m).unwrap()
    }

    #[test]
    fn mst_of_a_line_is_the_chain() {
        let t = mst(&line(5));
        assert_eq!(t, Tree::kary(4, 1));
        assert_eq!(rtt_weight(&line(5), &t), 4.0);
    }

    #[test]
    fn dcmst_respects_limits_and_rejects_infeasible() {
        // Star-shaped costs: node 0 is close to everyone; with fan-out 2 it cannot be a star.
        let n = 7;
        let mut m = Matrix::filled(n, 10.0);
        for v in 1..n {
            m.set(0, v, 1.0);
            m.set(v, 0, 1.0);
        }
        let net = Network::new(m).unwrap();
        let lim = vec![Some(2); n];
        let t = dcmst(&net, &lim).unwrap();
        assert!(t.max_fanout() <= 2);
        assert_eq!(rtt_weight(&net, &t), 2.0 + 4.0 * 10.0);
        let tight = vec![
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(1),
            Some(0),
        ];
        let chain = dcmst(&net, &tight).unwrap();
        assert_eq!(chain.max_fanout(), 1);
        assert!(chain.children(6).is_empty());
        let starved = vec![Some(1); 2]
            .into_iter()
            .chain(vec![Some(0); 5])
            .collect::<Vec<_>>();
        assert_eq!(
            dcmst(&net, &starved),
            Err(PlanError::FanoutInfeasible {
                slots: 2,
                needed: 6
            })
        );
    }

    #[test]
    fn fanout_limits_from_uplink_and_target() {
        let mut net = line(3);
        net.set_uplink(0, Some(50.0)).unwrap();
        net.set_uplink(1, Some(300.0)).unwrap();
        net.set_max_fanout(2, Some(2)).unwrap();
        assert_eq!(fanout_limits(&net, None), vec![None, None, Some(2)]);
        assert_eq!(
            fanout_limits(&net, Some(100.0)),
            vec![Some(1), Some(3), Some(2)]
        );
    }

    #[test]
    fn bottleneck_prefers_wide_edges() {
        let mut net = line(3);
        let mut bw = Matrix::filled(3, 100.0);
        bw.set(0, 2, 5.0);
        bw.set(1, 2, 1.0);
        net.set_bandwidth(bw).unwrap();
        let t = bottleneck(&net);
        assert_eq!(t.parent(2), Some(0));
        assert_eq!(bottleneck_width(&net, &t), 5.0);
    }

    #[test]
    fn cluster_tree_crosses_each_site_once() {
        // Two sites of three; the WAN is 50 ms, the LAN 1 ms.
        let n = 6;
        let mut m = Matrix::filled(n, 50.0);
        let site = |v: usize| v / 3;
        for i in 0..n {
            for j in 0..n {
                if site(i) == site(j) {
                    m.set(i, j, 1.0);
                }
            }
        }
        let mut net = Network::new(m).unwrap();
        for v in 0..n {
            net.set_site(v, Some(["a", "b"][site(v)])).unwrap();
        }
        net.set_uplink(4, Some(1000.0)).unwrap();
        for v in [0, 1, 2, 3, 5] {
            net.set_uplink(v, Some(100.0)).unwrap();
        }
        let t = cluster(&net, &fanout_limits(&net, None));
        let crossing: Vec<_> = (1..n)
            .filter(|&v| site(t.parent(v).unwrap()) != site(v))
            .collect();
        assert_eq!(
            crossing,
            vec![4],
            "only the gateway with the big uplink enters site b"
        );
    }
}
