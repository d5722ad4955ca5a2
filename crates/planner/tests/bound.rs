//! The LP bound against brute force (fractional packing of every spanning arborescence), and
//! against every plan's prediction; the seed 004 style four-cluster LP's solve time.

mod common;

use std::collections::HashMap;
use std::time::Instant;

use bulkcast_planner::{
    all_plans, bound, lp_bound, rates_feasible, tree_rate, Algorithm, Matrix, Network, PlanOptions,
    LP_MAX_NODES,
};
use bulkcast_proto::tree::Tree;
use microlp::{ComparisonOp, OptimizationDirection, Problem};
use rand::Rng;

/// Resources an edge uses, keyed independently of the crate's own numbering.
fn edge_resources(net: &Network, i: usize, j: usize) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    if let Some(c) = net.uplink(i) {
        out.push((format!("up{i}"), c));
    }
    if let Some(c) = net.downlink(j) {
        out.push((format!("down{j}"), c));
    }
    if let Some(c) = net.path_capacity(i, j) {
        out.push((format!("path{i}-{j}"), c));
    }
    if let Some(c) = net.wan_capacity(i, j) {
        let (a, b) = (net.site(i).unwrap_or(""), net.site(j).unwrap_or(""));
        out.push((format!("wan{a}-{b}"), c));
    }
    out
}

/// How many of the tree's edges use each resource, with the capacities.
fn tree_usage(net: &Network, t: &Tree) -> HashMap<String, (u32, f64)> {
    let mut use_of = HashMap::new();
    for c in 1..t.len() {
        let p = t.parent(c).unwrap();
        for (r, cap) in edge_resources(net, p, c) {
            use_of.entry(r).or_insert((0, cap)).0 += 1;
        }
    }
    use_of
}

/// max sum y_T over all spanning arborescences T, with every resource's load within capacity.
fn brute_packing(net: &Network) -> (f64, f64) {
    let trees = common::all_arborescences(net.len());
    let usages: Vec<_> = trees.iter().map(|t| tree_usage(net, t)).collect();
    let best_single = usages
        .iter()
        .map(|u| {
            u.values()
                .map(|&(k, c)| c / f64::from(k))
                .fold(f64::INFINITY, f64::min)
        })
        .fold(0.0, f64::max);
    let mut caps: HashMap<String, f64> = HashMap::new();
    for u in &usages {
        for (r, &(_, c)) in u {
            caps.insert(r.clone(), c);
        }
    }
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let y: Vec<_> = trees
        .iter()
        .map(|_| lp.add_var(1.0, (0.0, f64::INFINITY)))
        .collect();
    for (r, &c) in &caps {
        let terms: Vec<_> = usages
            .iter()
            .zip(&y)
            .filter_map(|(u, &v)| u.get(r).map(|&(k, _)| (v, f64::from(k))))
            .collect();
        lp.add_constraint(terms.as_slice(), ComparisonOp::Le, c);
    }
    match lp.solve() {
        Ok(o) => (o.into_solution().unwrap().objective(), best_single),
        Err(microlp::Error::Unbounded) => (f64::INFINITY, best_single),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn lp_bound_equals_fractional_arborescence_packing() {
    let mut multi_beats_single = 0;
    for seed in 0..300 {
        let mut rng = common::rng(20_000 + seed);
        let n = rng.gen_range(2..=5);
        let net = common::random_capacitated(&mut rng, n);
        let lp = lp_bound(&net).unwrap();
        let (packing, single) = brute_packing(&net);
        assert!(
            lp == packing || (lp - packing).abs() <= 1e-6 * packing.max(1.0),
            "seed {seed}: LP {lp} vs packing {packing}"
        );
        assert!(single <= lp + 1e-6, "seed {seed}");
        if single < lp - 1e-6 {
            multi_beats_single += 1;
        }
        // The crate's single-tree prediction agrees with the independent resource count.
        for t in common::all_arborescences(n).iter().take(50) {
            let u = tree_usage(&net, t);
            let expect = u
                .values()
                .map(|&(k, c)| c / f64::from(k))
                .fold(f64::INFINITY, f64::min);
            assert_eq!(tree_rate(&net, t), expect, "seed {seed}: {t:?}");
        }
    }
    println!("LP = packing on 300 instances; several trees beat the best single tree on {multi_beats_single}");
    assert!(multi_beats_single > 10);
}

#[test]
fn no_plan_exceeds_the_bound() {
    let opts = PlanOptions::default();
    let mut worst_balanced = 1.0f64;
    let mut with_limits = 0;
    for seed in 0..150 {
        let mut rng = common::rng(30_000 + seed);
        let n = rng.gen_range(2..=12);
        let mut net = common::random_capacitated(&mut rng, n);
        // A third of the instances also get hosts-file fan-out limits.
        let limited = seed % 3 == 0;
        if limited {
            with_limits += 1;
            for v in 0..n {
                if rng.gen_bool(0.5) {
                    net.set_max_fanout(v, Some(rng.gen_range(1..=3))).unwrap();
                }
            }
        }
        let b = bound(&net).unwrap();
        assert!(b.exact);
        for p in all_plans(&net, &opts).unwrap() {
            assert!(
                p.rate_mbps <= b.rate_mbps * (1.0 + 1e-6),
                "seed {seed}: {} predicts {} > bound {}",
                p.algorithm,
                p.rate_mbps,
                b.rate_mbps
            );
            assert!(
                rates_feasible(&net, &p.trees),
                "seed {seed}: {}",
                p.algorithm
            );
            let keeps_limits = matches!(
                p.algorithm,
                Algorithm::Dcmst | Algorithm::Cluster | Algorithm::Balanced
            );
            for (t, _) in p.trees.iter().filter(|_| keeps_limits) {
                for v in 0..n {
                    if let Some(l) = net.max_fanout(v) {
                        assert!(t.children(v).len() <= l, "seed {seed}: {}", p.algorithm);
                    }
                }
            }
            // The bound knows capacities, not fan-out limits, so only unlimited instances
            // measure how close the packing gets.
            if p.algorithm == Algorithm::Balanced && !limited {
                worst_balanced = worst_balanced.min(b.fraction(p.rate_mbps));
            }
        }
    }
    println!(
        "150 instances ({with_limits} with fan-out limits): no plan above the bound; balanced \
         multi-trees reach at least {worst_balanced:.4} of it without limits"
    );
    assert!(worst_balanced > 0.9, "{worst_balanced}");
}

/// Seed 004 section 4.1 style: four clusters A-D, here 4 nodes each (the source in A), 1 Gbit/s
/// access links, 0.1 ms inside and 20 ms between clusters, and WAN capacities per cluster pair
/// (the paper's figure values are not in our text, so these are our own). `slow` sets A-D and
/// B-C to 6.4 Mbit/s (0.8 MB/s, the "slow links" scenario).
pub fn four_clusters(slow: bool) -> Network {
    let sites = ["A", "B", "C", "D"];
    let n = 16;
    let site = |v: usize| v / 4;
    let mut rtt = Matrix::filled(n, 0.0);
    for a in 0..n {
        for b in 0..n {
            if a != b {
                rtt.set(a, b, if site(a) == site(b) { 0.1 } else { 20.0 });
            }
        }
    }
    let mut net = Network::new(rtt).unwrap();
    for v in 0..n {
        net.set_name(v, &format!("{}{}", sites[site(v)], v % 4))
            .unwrap();
        net.set_site(v, Some(sites[site(v)])).unwrap();
        net.set_uplink(v, Some(1000.0)).unwrap();
        net.set_downlink(v, Some(1000.0)).unwrap();
    }
    let wan = [
        ("A", "B", 800.0),
        ("A", "C", 400.0),
        ("A", "D", 240.0),
        ("B", "C", 640.0),
        ("B", "D", 320.0),
        ("C", "D", 560.0),
    ];
    for (a, b, c) in wan {
        let c = if slow && matches!((a, b), ("A", "D") | ("B", "C")) {
            6.4
        } else {
            c
        };
        net.set_wan(a, b, c).unwrap();
        net.set_wan(b, a, c).unwrap();
    }
    net
}

#[test]
fn four_cluster_lp_solves_in_seconds() {
    for slow in [false, true] {
        let net = four_clusters(slow);
        assert!(net.len() <= LP_MAX_NODES);
        let t0 = Instant::now();
        let b = bound(&net).unwrap();
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "four clusters x 4 ({}): LP bound {:.1} Mbit/s in {:.3} s",
            if slow { "slow links" } else { "fast links" },
            b.rate_mbps,
            secs
        );
        assert!(b.exact);
        // Data for B, C, D crosses the WAN out of A (800 + 400 + 240 on fast links), and D
        // can receive from A, B, C at most 240 + 320 + 560.
        assert!(b.rate_mbps <= 1000.0 + 1e-6);
        assert!(secs < 30.0, "LP took {secs} s");
        for p in all_plans(&net, &PlanOptions::default()).unwrap() {
            println!(
                "  {:>10}: {:8.1} Mbit/s = {:5.1}% of bound, {} tree(s)",
                p.algorithm.name(),
                p.rate_mbps,
                100.0 * b.fraction(p.rate_mbps),
                p.trees.len()
            );
            assert!(p.rate_mbps <= b.rate_mbps * (1.0 + 1e-6));
            if p.algorithm == Algorithm::Balanced {
                assert!(b.fraction(p.rate_mbps) > 0.95);
            }
        }
    }
}

/// Above LP_MAX_NODES the bound is the packing's dual bound (capped by cut bounds): still an
/// upper bound, so still above every plan.
#[test]
fn dual_bound_stays_above_every_plan() {
    for seed in 0..6 {
        let mut rng = common::rng(40_000 + seed);
        let n = rng.gen_range(LP_MAX_NODES + 1..=LP_MAX_NODES + 15);
        // Uplinks and WAN links only, so the smallest downlink does not decide it trivially.
        let mut net = Network::new(common::random_rtt(&mut rng, n)).unwrap();
        let sites = ["a", "b", "c"];
        for v in 0..n {
            net.set_uplink(v, Some(rng.gen_range(1..=10) as f64 * 100.0))
                .unwrap();
            net.set_site(v, Some(sites[v % 3])).unwrap();
        }
        for a in sites {
            for b in sites {
                if a != b {
                    net.set_wan(a, b, rng.gen_range(2..=20) as f64 * 100.0)
                        .unwrap();
                }
            }
        }
        let b = bound(&net).unwrap();
        assert!(!b.exact);
        let plans = all_plans(&net, &PlanOptions::default()).unwrap();
        let best = plans.iter().map(|p| p.rate_mbps).fold(0.0, f64::max);
        println!(
            "{n} nodes: dual bound {:.1}, best plan {best:.1} ({:.1}%)",
            b.rate_mbps,
            100.0 * b.fraction(best)
        );
        for p in plans {
            assert!(
                p.rate_mbps <= b.rate_mbps * (1.0 + 1e-6),
                "seed {seed}: {} predicts {} > bound {}",
                p.algorithm,
                p.rate_mbps,
                b.rate_mbps
            );
        }
    }
}
