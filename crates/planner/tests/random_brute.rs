//! Seeded random instances against brute force: the degree-constrained MST (heuristic, so its
//! worst ratio to the optimum is reported) and the bottleneck tree (exact).

mod common;

use bulkcast_planner::{
    bottleneck, dcmst, mst, trees::bottleneck_width, trees::rtt_weight, Network,
};
use rand::Rng;

const INSTANCES: u64 = 1000;

#[test]
fn dcmst_respects_limits_and_is_near_optimal() {
    let mut worst = 1.0f64;
    let mut worst_seed = 0;
    let mut optimal = 0;
    for seed in 0..INSTANCES {
        let mut rng = common::rng(seed);
        let hosts = rng.gen_range(1..=9);
        let n = hosts + 1;
        let rtt = common::random_rtt(&mut rng, n);
        let net = Network::new(rtt.clone()).unwrap();
        // Fan-out limits 0..=3 (0 = leaf), None sometimes; the source at least 1; enough
        // slots overall for a spanning tree.
        let mut lim: Vec<Option<usize>> = (0..n)
            .map(|v| {
                if rng.gen_bool(0.15) {
                    None
                } else {
                    Some(rng.gen_range(usize::from(v == 0)..=3))
                }
            })
            .collect();
        while lim.iter().map(|l| l.unwrap_or(n)).sum::<usize>() < n - 1 {
            let v = rng.gen_range(0..n);
            lim[v] = lim[v].map(|l| l + 1);
        }
        let tree = dcmst(&net, &lim).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        for (v, l) in lim.iter().enumerate() {
            if let Some(l) = *l {
                assert!(
                    tree.children(v).len() <= l,
                    "seed {seed}: node {v} has {} children, limit {l}",
                    tree.children(v).len()
                );
            }
        }
        let got = rtt_weight(&net, &tree);
        let opt = common::brute_dcmst(&rtt, &lim, got)
            .unwrap_or_else(|| panic!("seed {seed}: brute force found nothing <= heuristic"));
        assert!(opt <= got + 1e-9);
        let ratio = got / opt;
        if ratio <= 1.0 + 1e-9 {
            optimal += 1;
        }
        if ratio > worst {
            worst = ratio;
            worst_seed = seed;
        }
    }
    println!(
        "dcmst vs brute force over {INSTANCES} instances (1-9 hosts): worst ratio {worst:.4} \
         (seed {worst_seed}), optimal in {optimal}"
    );
    assert!(worst < 1.15, "worst ratio {worst} at seed {worst_seed}");
}

#[test]
fn bottleneck_tree_is_exactly_optimal() {
    // Instances where the RTT MST is narrower than the optimum: shows they discriminate.
    let mut mst_worse = 0;
    for seed in 0..INSTANCES {
        let mut rng = common::rng(10_000 + seed);
        let hosts = rng.gen_range(1..=9);
        let net = common::random_capacitated(&mut rng, hosts + 1);
        let tree = bottleneck(&net);
        let got = bottleneck_width(&net, &tree);
        let best = common::brute_bottleneck(&|p, c| net.edge_capacity(p, c), net.len());
        assert_eq!(got, best, "seed {seed}");
        if bottleneck_width(&net, &mst(&net)) < best {
            mst_worse += 1;
        }
    }
    println!("bottleneck tree optimal on {INSTANCES} instances; RTT MST narrower on {mst_worse}");
    assert!(mst_worse > INSTANCES / 10, "{mst_worse}");
}

/// At a size brute force cannot check: limits hold, the tree is no lighter than the MST, and
/// no heavier than Prim restricted to the limits alone would be.
#[test]
fn dcmst_at_scale_respects_limits() {
    let mut rng = common::rng(77);
    let n = 300;
    let net = Network::new(common::random_rtt(&mut rng, n)).unwrap();
    let lim: Vec<Option<usize>> = (0..n).map(|_| Some(rng.gen_range(1..=3))).collect();
    let tree = dcmst(&net, &lim).unwrap();
    for (v, l) in lim.iter().enumerate() {
        assert!(tree.children(v).len() <= l.unwrap());
    }
    let (w, w_mst) = (rtt_weight(&net, &tree), rtt_weight(&net, &mst(&net)));
    println!("dcmst on {n} nodes, fan-out 1-3: weight {w} vs unconstrained MST {w_mst}");
    assert!(w >= w_mst && w <= 2.0 * w_mst, "{w} vs {w_mst}");
}
