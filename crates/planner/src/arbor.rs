//! Minimum-cost spanning arborescence (Chu-Liu/Edmonds), the pricing step of the balanced
//! multi-tree packing: with per-resource prices, an arborescence's price is the sum of its
//! edges' prices, so the cheapest tree to add is a minimum arborescence.

/// Minimum-cost arborescence rooted at 0 over `n` nodes with edge costs `cost[i * n + j]`
/// for `i -> j` (edges into 0 are ignored). Returns each node's parent (`parent[0] = 0`).
/// Dense, O(n^2) per contraction level.
pub(crate) fn min_arborescence(n: usize, cost: &[f64]) -> Vec<usize> {
    if n <= 1 {
        return vec![0; n];
    }
    solve(n, cost.to_vec())
}

fn solve(n: usize, cost: Vec<f64>) -> Vec<usize> {
    // Cheapest incoming edge of every non-root node.
    let mut best_in = vec![0usize; n];
    for v in 1..n {
        let mut b = usize::MAX;
        let mut bc = f64::INFINITY;
        for u in 0..n {
            if u != v && cost[u * n + v] < bc {
                bc = cost[u * n + v];
                b = u;
            }
        }
        best_in[v] = if b == usize::MAX { 0 } else { b };
    }
    let Some(cycle) = find_cycle(n, &best_in) else {
        return best_in;
    };
    // Contract the cycle into one node `c` (the last index of the smaller graph).
    let mut in_cycle = vec![false; n];
    for &v in &cycle {
        in_cycle[v] = true;
    }
    let mut map = vec![usize::MAX; n];
    let mut next = 0;
    for v in 0..n {
        if !in_cycle[v] {
            map[v] = next;
            next += 1;
        }
    }
    let c = next;
    let m = next + 1;
    let mut sub = vec![f64::INFINITY; m * m];
    // For edges into the cycle, which cycle node they enter; for edges out, which cycle node
    // they leave from.
    let mut enter = vec![usize::MAX; m];
    let mut leave = vec![usize::MAX; m];
    for u in 0..n {
        for v in 0..n {
            if u == v || v == 0 {
                continue;
            }
            let w = cost[u * n + v];
            if !w.is_finite() {
                continue;
            }
            match (in_cycle[u], in_cycle[v]) {
                (false, false) => sub[map[u] * m + map[v]] = w,
                (false, true) => {
                    let adj = w - cost[best_in[v] * n + v];
                    let slot = map[u] * m + c;
                    if adj < sub[slot] {
                        sub[slot] = adj;
                        enter[map[u]] = v;
                    }
                }
                (true, false) => {
                    let slot = c * m + map[v];
                    if w < sub[slot] {
                        sub[slot] = w;
                        leave[map[v]] = u;
                    }
                }
                (true, true) => {}
            }
        }
    }
    let sub_parent = solve(m, sub);
    let mut parent = vec![0usize; n];
    let unmap: Vec<usize> = (0..n).filter(|&v| !in_cycle[v]).collect();
    for v in 0..n {
        if in_cycle[v] {
            parent[v] = best_in[v];
        }
    }
    for (sv, &v) in unmap.iter().enumerate().skip(1) {
        let sp = sub_parent[sv];
        parent[v] = if sp == c { leave[sv] } else { unmap[sp] };
    }
    // The edge entering the cycle breaks it at the node it enters.
    let su = sub_parent[c];
    let entry = enter[su];
    parent[entry] = unmap[su];
    parent
}

/// A cycle among non-root nodes of the parent function, if any.
fn find_cycle(n: usize, parent: &[usize]) -> Option<Vec<usize>> {
    let mut state = vec![0u8; n]; // 0 new, 1 on current walk, 2 done
    state[0] = 2;
    for start in 1..n {
        let mut walk = Vec::new();
        let mut v = start;
        while state[v] == 0 {
            state[v] = 1;
            walk.push(v);
            v = parent[v];
        }
        if state[v] == 1 {
            let pos = walk.iter().position(|&x| x == v).unwrap_or(0);
            return Some(walk[pos..].to_vec());
        }
        for w in walk {
            state[w] = 2;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exhaustive minimum over all parent vectors that form an arborescence.
    fn brute(n: usize, cost: &[f64]) -> f64 {
        let mut best = f64::INFINITY;
        let total = (n as u64).pow(n as u32 - 1);
        for code in 0..total {
            let mut parent = vec![0usize; n];
            let mut c = code;
            for p in parent.iter_mut().skip(1) {
                *p = (c % n as u64) as usize;
                c /= n as u64;
            }
            if (1..n).any(|v| parent[v] == v) || find_cycle(n, &parent).is_some() {
                continue;
            }
            let w: f64 = (1..n).map(|v| cost[parent[v] * n + v]).sum();
            best = best.min(w);
        }
        best
    }

    #[test]
    fn matches_brute_force_on_random_digraphs() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..300 {
            let n = rng.gen_range(2..=6);
            let cost: Vec<f64> = (0..n * n).map(|_| rng.gen_range(0..20) as f64).collect();
            let parent = min_arborescence(n, &cost);
            assert!(find_cycle(n, &parent).is_none(), "{parent:?}");
            let w: f64 = (1..n).map(|v| cost[parent[v] * n + v]).sum();
            assert_eq!(w, brute(n, &cost), "{cost:?}");
        }
    }
}
