//! Minimum-cost spanning arborescence (Chu-Liu/Edmonds), the pricing step of the balanced
//! multi-tree packing: with per-resource prices, an arborescence's price is the sum of its
//! edges' prices, so the cheapest tree to add is a minimum arborescence.

/// Minimum-cost arborescence rooted at 0 over `n` nodes with edge costs `cost[i * n + j]`
/// for `i -> j` (edges into 0 are ignored). Returns each node's parent (`parent[0] = 0`).
///
/// Tarjan's path-growing form of Chu-Liu/Edmonds with dense in-cost rows instead of heaps, so
/// O(n^2) overall: walk from each node along cheapest in-edges; when the walk closes a cycle,
/// contract it (its in-cost rows merge, each reduced by the member's chosen edge) and continue
/// from the contracted node. Cycles are expanded afterwards by rolling back the union-find.
pub(crate) fn min_arborescence(n: usize, cost: &[f64]) -> Vec<usize> {
    if n <= 1 {
        return vec![0; n];
    }
    const NEW: usize = usize::MAX;
    // Row c (a component's representative): adjusted cost and original target of the cheapest
    // edge from original node u into c.
    let mut inw = vec![f64::INFINITY; n * n];
    let mut tgt = vec![0u32; n * n];
    for v in 1..n {
        for u in 0..n {
            if u != v {
                inw[v * n + u] = cost[u * n + v];
                tgt[v * n + u] = v as u32;
            }
        }
    }
    let mut sub = vec![0.0f64; n];
    let mut members: Vec<Vec<usize>> = (0..n).map(|v| vec![v]).collect();
    let mut uf = RollbackUf::new(n);
    let mut seen = vec![NEW; n];
    seen[0] = 0;
    let mut in_edge = vec![(0usize, 0usize); n];
    let mut cycles: Vec<Contraction> = Vec::new();
    let mut q: Vec<(usize, usize)> = Vec::new();
    let mut path: Vec<usize> = Vec::new();
    let mut row = vec![0.0f64; n];
    let mut row_t = vec![0u32; n];
    for s in 0..n {
        let mut u = s;
        q.clear();
        path.clear();
        while seen[u] == NEW {
            let base = u * n;
            let (mut x, mut w) = (usize::MAX, f64::INFINITY);
            for (k, &c) in inw[base..base + n].iter().enumerate() {
                if c < w {
                    w = c;
                    x = k;
                }
            }
            if x == usize::MAX {
                // Unreachable component (only with infinite costs): hang it off the root.
                x = 0;
                w = 0.0;
                tgt[base] = members[u][0] as u32;
            }
            q.push((x, tgt[base + x] as usize));
            sub[u] = w;
            path.push(u);
            seen[u] = s;
            u = uf.find(x);
            if seen[u] == s {
                // Contract the cycle u -> ... -> path end.
                let time = uf.time();
                let end = q.len();
                row.iter_mut().for_each(|r| *r = f64::INFINITY);
                let mut merged: Vec<usize> = Vec::new();
                loop {
                    let c = path.pop().expect("the cycle is on the path");
                    let cb = c * n;
                    for k in 0..n {
                        let adj = inw[cb + k] - sub[c];
                        if adj < row[k] {
                            row[k] = adj;
                            row_t[k] = tgt[cb + k];
                        }
                    }
                    merged.extend(std::mem::take(&mut members[c]));
                    if !uf.join(u, c) {
                        break;
                    }
                }
                let r = uf.find(u);
                for &m in &merged {
                    row[m] = f64::INFINITY;
                }
                inw[r * n..r * n + n].copy_from_slice(&row);
                tgt[r * n..r * n + n].copy_from_slice(&row_t);
                members[r] = merged;
                sub[r] = 0.0;
                seen[r] = NEW;
                let start = path.len();
                cycles.push((r, time, q[start..end].to_vec()));
                q.truncate(start);
                u = r;
            }
        }
        for &(a, b) in &q {
            in_edge[uf.find(b)] = (a, b);
        }
    }
    for (u, time, comp) in cycles.into_iter().rev() {
        uf.rollback(time);
        let entering = in_edge[u];
        for (a, b) in comp {
            in_edge[uf.find(b)] = (a, b);
        }
        in_edge[uf.find(entering.1)] = entering;
    }
    let mut parent: Vec<usize> = in_edge.iter().map(|e| e.0).collect();
    parent[0] = 0;
    parent
}

/// A contracted cycle: its representative, the union-find time before it, and its edges.
type Contraction = (usize, usize, Vec<(usize, usize)>);

/// Union-find with rollback (union by size, no path compression).
struct RollbackUf {
    e: Vec<isize>,
    st: Vec<(usize, isize)>,
}

impl RollbackUf {
    fn new(n: usize) -> Self {
        Self {
            e: vec![-1; n],
            st: Vec::new(),
        }
    }

    fn find(&self, mut x: usize) -> usize {
        while self.e[x] >= 0 {
            x = self.e[x] as usize;
        }
        x
    }

    fn time(&self) -> usize {
        self.st.len()
    }

    fn rollback(&mut self, t: usize) {
        while self.st.len() > t {
            let (i, v) = self.st.pop().expect("non-empty");
            self.e[i] = v;
        }
    }

    fn join(&mut self, a: usize, b: usize) -> bool {
        let (mut a, mut b) = (self.find(a), self.find(b));
        if a == b {
            return false;
        }
        if self.e[a] > self.e[b] {
            std::mem::swap(&mut a, &mut b);
        }
        self.st.push((a, self.e[a]));
        self.st.push((b, self.e[b]));
        self.e[a] += self.e[b];
        self.e[b] = a as isize;
        true
    }
}

/// Every cycle among non-root nodes of the parent function.
#[cfg(test)]
fn find_cycles(n: usize, parent: &[usize]) -> Vec<Vec<usize>> {
    let mut state = vec![0u8; n]; // 0 new, 1 on current walk, 2 done
    state[0] = 2;
    let mut cycles = Vec::new();
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
            cycles.push(walk[pos..].to_vec());
        }
        for w in walk {
            state[w] = 2;
        }
    }
    cycles
}

/// A cycle among non-root nodes of the parent function, if any.
#[cfg(test)]
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

    /// The contraction-per-level formulation, as a second reference for bigger inputs.
    fn solve(n: usize, cost: Vec<f64>) -> Vec<usize> {
        // Cheapest incoming edge of every non-root node.
        let mut best_in = vec![0usize; n];
        for (v, b) in best_in.iter_mut().enumerate().skip(1) {
            let mut bc = f64::INFINITY;
            for u in 0..n {
                if u != v && cost[u * n + v] < bc {
                    bc = cost[u * n + v];
                    *b = u;
                }
            }
        }
        let cycles = find_cycles(n, &best_in);
        if cycles.is_empty() {
            return best_in;
        }
        // Contract every cycle at once: component ids, cycles numbered after the plain nodes.
        let mut comp = vec![usize::MAX; n];
        let mut in_cycle = vec![false; n];
        for c in &cycles {
            for &v in c {
                in_cycle[v] = true;
            }
        }
        let mut m = 0;
        for v in 0..n {
            if !in_cycle[v] {
                comp[v] = m;
                m += 1;
            }
        }
        for c in &cycles {
            for &v in c {
                comp[v] = m;
            }
            m += 1;
        }
        // Edge costs between components, entering a cycle at v discounted by v's cycle edge, and
        // which original edge each component edge stands for.
        let mut sub = vec![f64::INFINITY; m * m];
        let mut orig = vec![(0u32, 0u32); m * m];
        for u in 0..n {
            for v in 1..n {
                let (cu, cv) = (comp[u], comp[v]);
                let w = cost[u * n + v];
                if cu == cv || !w.is_finite() {
                    continue;
                }
                let adj = if in_cycle[v] {
                    w - cost[best_in[v] * n + v]
                } else {
                    w
                };
                let slot = cu * m + cv;
                if adj < sub[slot] {
                    sub[slot] = adj;
                    orig[slot] = (u as u32, v as u32);
                }
            }
        }
        let sub_parent = solve(m, sub);
        // Cycle nodes keep their cycle edge except where the chosen edge enters the cycle.
        let mut parent = best_in;
        for (c, &pc) in sub_parent.iter().enumerate().skip(1) {
            let (u, v) = orig[pc * m + c];
            parent[v as usize] = u as usize;
        }
        parent
    }

    #[test]
    fn matches_level_contraction_on_bigger_digraphs() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        for _ in 0..100 {
            let n = rng.gen_range(2..=40);
            // Few distinct costs (many ties) and site-like structure make long cycle chains.
            let cost: Vec<f64> = (0..n * n).map(|_| rng.gen_range(0..5) as f64).collect();
            let p = min_arborescence(n, &cost);
            let q = solve(n, cost.clone());
            assert!(find_cycle(n, &p).is_none(), "{p:?}");
            let w = |p: &[usize]| (1..n).map(|v| cost[p[v] * n + v]).sum::<f64>();
            assert_eq!(w(&p), w(&q));
        }
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
