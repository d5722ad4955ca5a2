//! Planning-time and estimation benchmark (a plain binary that prints tables):
//!
//! ```text
//! cargo run --release -p bulkcast-planner --example plan_bench [HOSTS] [SEED]
//! ```
//!
//! 1. For HOSTS hosts (default 1000) on a seeded random geometry (8 regions, RTTs from
//!    [`vivaldi::synthetic_rtt`], uplinks 100-1000 Mbit/s, regional WAN capacities), the time
//!    of every algorithm, of the bound, and of `auto`, with each plan's prediction.
//! 2. The exact LP on a four-cluster 4 x 4 instance, at [`LP_MAX_NODES`] nodes and above.
//! 3. Vivaldi on a synthetic 500-host geometry: median relative error on the probed pairs and
//!    on the pairs it estimated.

use std::time::Instant;

use bulkcast_planner::vivaldi::{self, Sample, VivaldiConfig};
use bulkcast_planner::{
    bound, lp_bound, plan, Algorithm, Matrix, Network, PlanOptions, LP_MAX_NODES,
};
use rand::{Rng, SeedableRng};

fn main() {
    let mut args = std::env::args().skip(1);
    let hosts: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);

    println!("== planning {hosts} hosts (seed {seed}) ==");
    let net = random_network(hosts + 1, 8, seed);
    let opts = PlanOptions::default();
    let t0 = Instant::now();
    let b = bound(&net).expect("bound");
    let bound_secs = t0.elapsed().as_secs_f64();
    println!(
        "{:<16} {:>8} {:>12} {:>6} {:>11} {:>9}",
        "algorithm", "time s", "rate Mbit/s", "trees", "1 GiB in s", "of bound"
    );
    for algo in Algorithm::CONCRETE.into_iter().chain([Algorithm::Auto]) {
        let t0 = Instant::now();
        let p = plan(&net, algo, &opts).expect("plan");
        let secs = t0.elapsed().as_secs_f64();
        let name = if algo == Algorithm::Auto {
            format!("auto={}", p.algorithm)
        } else {
            algo.to_string()
        };
        println!(
            "{name:<16} {secs:>8.3} {:>12.1} {:>6} {:>11.2} {:>8.1}%",
            p.rate_mbps,
            p.trees.len(),
            p.completion_secs,
            100.0 * b.fraction(p.rate_mbps)
        );
    }
    let kind = if b.exact {
        "exact LP"
    } else {
        "dual upper bound"
    };
    println!(
        "{:<16} {bound_secs:>8.3} {:>12.1}   ({kind})",
        "bound", b.rate_mbps
    );

    println!("\n== exact LP bound (lp_bound) ==");
    for (label, n, sites) in [
        ("4 clusters x 4", 16, 4),
        ("LP_MAX_NODES", LP_MAX_NODES, 4),
        ("beyond the limit", 24, 4),
    ] {
        let net = random_network(n, sites, seed);
        let t0 = Instant::now();
        let rate = lp_bound(&net).expect("lp");
        println!(
            "{label:<16} {n:>3} nodes: {rate:>8.1} Mbit/s in {:.3} s",
            t0.elapsed().as_secs_f64()
        );
    }

    println!("\n== Vivaldi on a synthetic 500-host geometry ==");
    let n = 500;
    let truth = vivaldi::synthetic_rtt(n, 8, seed);
    for per_node in [8, 16, 32] {
        let probed = vivaldi::probe_pairs(n, per_node, seed);
        let samples: Vec<Sample> = probed
            .iter()
            .map(|&(a, b)| Sample {
                a,
                b,
                rtt_ms: truth.at(a, b),
            })
            .collect();
        let t0 = Instant::now();
        let (_, coords) = vivaldi::complete(n, &samples, VivaldiConfig::default());
        let secs = t0.elapsed().as_secs_f64();
        let unprobed: Vec<Sample> = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .filter(|p| probed.binary_search(p).is_err())
            .map(|(a, b)| Sample {
                a,
                b,
                rtt_ms: truth.at(a, b),
            })
            .collect();
        println!(
            "{per_node:>2} partners/node: {:>6} of {} pairs probed, median rel. error {:.3} on probed, \
             {:.3} on estimated pairs ({:.2} s)",
            probed.len(),
            n * (n - 1) / 2,
            vivaldi::median_relative_error(&coords, &samples),
            vivaldi::median_relative_error(&coords, &unprobed),
            secs
        );
    }
}

/// n nodes in `regions` sites on the synthetic geometry, with random access links and WAN
/// capacities between every pair of sites.
fn random_network(n: usize, regions: usize, seed: u64) -> Network {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let rtt: Matrix = vivaldi::synthetic_rtt(n, regions, seed);
    let mut net = Network::new(rtt).expect("valid RTTs");
    let names: Vec<String> = (0..regions).map(|r| format!("r{r}")).collect();
    for v in 0..n {
        net.set_site(v, Some(&names[v % regions])).expect("node");
        net.set_uplink(v, Some(rng.gen_range(1..=10) as f64 * 100.0))
            .expect("node");
        net.set_downlink(v, Some(1000.0)).expect("node");
    }
    for a in &names {
        for b in &names {
            if a != b {
                net.set_wan(a, b, rng.gen_range(2..=20) as f64 * 100.0)
                    .expect("site");
            }
        }
    }
    net
}
