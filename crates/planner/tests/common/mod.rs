//! Random instances and brute-force references shared by the integration tests.
#![allow(dead_code)]

use bulkcast_planner::{Matrix, Network};
use bulkcast_proto::tree::Tree;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A seeded RNG per instance, so a failure names a reproducible seed.
pub fn rng(seed: u64) -> SmallRng {
    SmallRng::seed_from_u64(seed)
}

/// Symmetric integer RTTs in 1..=100 (ties are likely, which is the point).
pub fn random_rtt(rng: &mut SmallRng, n: usize) -> Matrix {
    let mut m = Matrix::filled(n, 0.0);
    for i in 0..n {
        for j in i + 1..n {
            let v = rng.gen_range(1..=100) as f64;
            m.set(i, j, v);
            m.set(j, i, v);
        }
    }
    m
}

/// A network with random access links (some unknown), a random directed bandwidth matrix
/// (some entries unlimited) and, sometimes, two or three sites with WAN capacities.
pub fn random_capacitated(rng: &mut SmallRng, n: usize) -> Network {
    let mut net = Network::new(random_rtt(rng, n)).unwrap();
    for v in 0..n {
        if rng.gen_bool(0.8) {
            net.set_uplink(v, Some(rng.gen_range(1..=20) as f64 * 10.0))
                .unwrap();
        }
        if rng.gen_bool(0.5) {
            net.set_downlink(v, Some(rng.gen_range(1..=20) as f64 * 10.0))
                .unwrap();
        }
    }
    if rng.gen_bool(0.5) {
        let mut bw = Matrix::filled(n, f64::INFINITY);
        for i in 0..n {
            for j in 0..n {
                if i != j && rng.gen_bool(0.6) {
                    bw.set(i, j, rng.gen_range(1..=30) as f64 * 10.0);
                }
            }
        }
        net.set_bandwidth(bw).unwrap();
    }
    if rng.gen_bool(0.5) {
        let sites = ["a", "b", "c"];
        let k = rng.gen_range(2..=3);
        for v in 0..n {
            net.set_site(v, Some(sites[rng.gen_range(0..k)])).unwrap();
        }
        for a in &sites[..k] {
            for b in &sites[..k] {
                if a != b && rng.gen_bool(0.7) {
                    // Sites may be empty after the draw; set_wan refuses unknown sites.
                    let _ = net.set_wan(a, b, rng.gen_range(1..=30) as f64 * 10.0);
                }
            }
        }
    }
    if net.uplink(0).is_none() && net.is_uncapacitated() {
        net.set_uplink(0, Some(100.0)).unwrap();
    }
    net
}

/// Every spanning arborescence rooted at 0 over n nodes, as parent vectors.
pub fn all_arborescences(n: usize) -> Vec<Tree> {
    let mut out = Vec::new();
    let mut parent = vec![0usize; n];
    fn rec(v: usize, n: usize, parent: &mut Vec<usize>, out: &mut Vec<Tree>) {
        if v == n {
            let p = (0..n).map(|i| (i != 0).then_some(parent[i])).collect();
            if let Ok(t) = Tree::from_parents(p) {
                out.push(t);
            }
            return;
        }
        for p in 0..n {
            if p != v {
                parent[v] = p;
                rec(v + 1, n, parent, out);
            }
        }
    }
    if n == 1 {
        return vec![Tree::from_parents(vec![None]).unwrap()];
    }
    rec(1, n, &mut parent, &mut out);
    out
}

/// Exact minimum-weight spanning tree with fan-out limits (`None` = unlimited), by branch and
/// bound over parent vectors: node v picks a parent, cycles and full parents are pruned, and
/// the partial weight plus each unassigned node's cheapest possible edge must beat the best.
pub fn brute_dcmst(w: &Matrix, lim: &[Option<usize>], start_best: f64) -> Option<f64> {
    let n = w.len();
    let cheapest: Vec<f64> = (0..n)
        .map(|v| {
            (0..n)
                .filter(|&u| u != v)
                .map(|u| w.at(u, v))
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let mut suffix = vec![0.0; n + 1];
    for v in (1..n).rev() {
        suffix[v] = suffix[v + 1] + cheapest[v];
    }
    struct S<'a> {
        w: &'a Matrix,
        lim: &'a [Option<usize>],
        suffix: Vec<f64>,
        parent: Vec<usize>,
        kids: Vec<usize>,
        best: f64,
        found: bool,
    }
    fn rec(s: &mut S, v: usize, acc: f64) {
        let n = s.parent.len();
        if acc + s.suffix[v] >= s.best - 1e-9 {
            return;
        }
        if v == n {
            s.best = acc;
            s.found = true;
            return;
        }
        for p in 0..n {
            if p == v || s.lim[p].is_some_and(|l| s.kids[p] >= l) {
                continue;
            }
            s.parent[v] = p;
            if closes_cycle(&s.parent, v) {
                continue;
            }
            s.kids[p] += 1;
            rec(s, v + 1, acc + s.w.at(p, v));
            s.kids[p] -= 1;
        }
        s.parent[v] = usize::MAX;
    }
    let mut s = S {
        w,
        lim,
        suffix,
        parent: vec![usize::MAX; n],
        kids: vec![0; n],
        best: start_best + 1e-6,
        found: false,
    };
    s.parent[0] = 0;
    rec(&mut s, 1, 0.0);
    s.found.then_some(s.best)
}

/// Exact maximum bottleneck (largest smallest edge width) over all spanning arborescences, by
/// enumerating parent vectors. Branches close cycles or use an edge no wider than the best tree
/// found so far are cut, and the search stops once the edges wider than the best no longer
/// reach every node from the root (no better tree can exist).
pub fn brute_bottleneck(width: &dyn Fn(usize, usize) -> f64, n: usize) -> f64 {
    struct S<'a> {
        width: &'a dyn Fn(usize, usize) -> f64,
        parent: Vec<usize>,
        best: f64,
        done: bool,
    }
    fn spans(width: &dyn Fn(usize, usize) -> f64, n: usize, above: f64) -> bool {
        let mut seen = vec![false; n];
        seen[0] = true;
        let mut stack = vec![0];
        while let Some(u) = stack.pop() {
            for (v, s) in seen.iter_mut().enumerate() {
                if !*s && width(u, v) > above {
                    *s = true;
                    stack.push(v);
                }
            }
        }
        seen.iter().all(|&s| s)
    }
    fn rec(s: &mut S, v: usize, acc: f64) {
        let n = s.parent.len();
        if v == n {
            s.best = acc;
            s.done = !spans(s.width, n, acc);
            return;
        }
        for p in 0..n {
            if s.done {
                return;
            }
            if p == v {
                continue;
            }
            let a = acc.min((s.width)(p, v));
            if a <= s.best {
                continue;
            }
            s.parent[v] = p;
            if !closes_cycle(&s.parent, v) {
                rec(s, v + 1, a);
            }
        }
        s.parent[v] = usize::MAX;
    }
    let mut s = S {
        width,
        parent: vec![usize::MAX; n],
        best: f64::NEG_INFINITY,
        done: false,
    };
    s.parent[0] = 0;
    rec(&mut s, 1, f64::INFINITY);
    s.best
}

/// Whether following assigned parents from v comes back to v (unassigned = usize::MAX).
fn closes_cycle(parent: &[usize], v: usize) -> bool {
    let mut at = parent[v];
    for _ in 0..parent.len() {
        if at == 0 || parent[at] == usize::MAX {
            return false;
        }
        if at == v {
            return true;
        }
        at = parent[at];
    }
    true
}
