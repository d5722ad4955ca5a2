//! Compares the swarm strategies on the MOB paper's four-cluster emulation (seed 004,
//! section 4.1): the five WAN conditions × tree push, the BitTorrent-style swarm, MOB and the
//! hybrid, at 20 ms and 100 ms RTT between clusters.
//!
//! ```text
//! cargo run --release -p bulkcast-proto --example swarm_sim [-- --per-cluster N --mb M --piece-kib K --lab [--tcp] --unequal --servers N --shares blocks|interleaved]
//! ```
//!
//! Throughput is the object size over the time until the last receiver finished (the paper's
//! measure); WAN is the piece bytes that entered clusters B, C and D, as multiples of the
//! object size (1.00 is the ideal: each piece enters each cluster once).
//! Each throughput is also printed as a fraction of the condition's bound
//! ([`sim::bound_rate`]: the max-flow broadcast capacity, time-averaged when links change),
//! next to the issue's targets for the hybrid.

use std::time::Duration;

use bulkcast_proto::swarm::mob::ShareLayout;
use bulkcast_proto::swarm::sim::{self, Condition, SwarmSimSpec, Topology, WanChange, MB_S};
use bulkcast_proto::swarm::{Strategy, SwarmConfig};

fn main() {
    let mut sizes = [4usize; 4];
    let mut mb = 600u64;
    let mut piece_kib = 512u32;
    let mut detail: Option<(usize, u64)> = None;
    let mut sweep = false;
    let mut lab = false;
    let mut tcp = false;
    let defaults = SwarmConfig::new(Strategy::Hybrid, 0, 0);
    let mut tune = Tune {
        servers: defaults.hybrid_servers,
        shares: defaults.hybrid_shares,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--sweep" {
            sweep = true;
            continue;
        }
        if a == "--lab" {
            lab = true;
            continue;
        }
        if a == "--tcp" {
            tcp = true;
            continue;
        }
        if a == "--shares" {
            tune.shares = match it.next().map(String::as_str) {
                Some("blocks") => ShareLayout::Blocks,
                Some("interleaved") => ShareLayout::Interleaved,
                _ => {
                    eprintln!("--shares takes blocks or interleaved");
                    std::process::exit(2);
                }
            };
            continue;
        }
        if a == "--unequal" {
            // The lab's unequal layout: the source alone in its site, then 3, 4 and 8 hosts.
            sizes = [1, 3, 4, 8];
            continue;
        }
        let v = it.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), v) {
            ("--per-cluster", Some(v)) => sizes = [v as usize; 4],
            ("--servers", Some(v)) => tune.servers = v as usize,
            ("--mb", Some(v)) => mb = v,
            ("--piece-kib", Some(v)) => piece_kib = v as u32,
            ("--detail", Some(v)) => {
                let rtt = it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(20);
                detail = Some((v as usize, rtt));
            }
            _ => {
                eprintln!(
                    "usage: swarm_sim [--per-cluster N] [--mb M] [--piece-kib K] [--detail CONDITION RTT_MS] [--sweep] [--lab [--tcp]] [--unequal] [--servers N] [--shares blocks|interleaved]"
                );
                std::process::exit(2);
            }
        }
    }
    let len = mb * 1_000_000;
    let rates = match (lab, tcp) {
        (false, false) => Rates::Sim,
        (true, false) => Rates::Lab,
        (true, true) => Rates::LabTcp,
        (false, true) => {
            eprintln!("--tcp scales the lab's rates: it needs --lab");
            std::process::exit(2);
        }
    };
    if sweep {
        show_sweep(sizes, rates, tune);
        return;
    }
    if let Some((c, rtt_ms)) = detail {
        show_detail(
            Condition::ALL[c.min(4)],
            sizes,
            len,
            piece_kib,
            rtt_ms,
            rates,
            tune,
        );
        return;
    }
    println!(
        "clusters of {sizes:?} nodes, {mb} MB from node 0 in cluster A, {piece_kib} KiB pieces, 1 Gbit/s access links"
    );
    println!("{}", rates_line(rates));
    println!("per strategy: throughput in MB/s (object / time until the last node finished), its fraction of the bound,");
    println!("and the WAN bytes into B/C/D as multiples of the object (1.00: each piece enters each cluster once)");
    println!("bound: min over receivers of the max flow from the source (= arborescence packing, Edmonds);");
    println!("changing conditions: the time average of that bound over an ideal transfer");
    println!(
        "targets (issue 6): hybrid >= 0.90 of the bound static, >= 0.80 changing; mob > swarm"
    );
    println!();
    println!(
        "{:>6} {:<11} | {:>5} | {:>25} | {:>25} | {:>25} | {:>25} | target",
        "RTT", "condition", "bound", "tree-push", "swarm", "mob", "hybrid"
    );
    println!("{}", "-".repeat(6 + 1 + 11 + 3 + 5 + 4 * 28 + 9));
    let mut worst = [f64::INFINITY; 2];
    let mut mob_over_swarm = true;
    for rtt_ms in [20u64, 100] {
        for cond in Condition::ALL {
            let mut cells = Vec::new();
            let mut bound = 0.0;
            let mut tps = Vec::new();
            for strategy in Strategy::ALL {
                let (topo, changes) = network(cond, sizes, rtt_ms, rates);
                bound = sim::bound_rate(&topo, &changes, len);
                let mut spec = SwarmSimSpec::new(topo, strategy, len);
                spec.piece_len = piece_kib << 10;
                spec.wan_changes = changes;
                spec.seed = 4;
                tune.apply(&mut spec.config);
                let r = sim::run(spec);
                let wan: Vec<String> = r.wan_multiples()[1..]
                    .iter()
                    .map(|m| format!("{m:.2}"))
                    .collect();
                let tp = r.throughput();
                tps.push(tp);
                cells.push(if r.incomplete().is_empty() {
                    format!("{:5.2} {:.2} {}", tp / MB_S, tp / bound, wan.join("/"))
                } else {
                    format!("incomplete ({})", r.incomplete().len())
                });
            }
            let changing = !matches!(cond, Condition::FastLinks | Condition::SlowLinks);
            let target = if changing { 0.80 } else { 0.90 };
            let hybrid = tps[3] / bound;
            let w = &mut worst[changing as usize];
            *w = w.min(hybrid);
            mob_over_swarm &= tps[2] > tps[1];
            println!(
                "{:>4}ms {:<11} | {:>5.2} | {:>25} | {:>25} | {:>25} | {:>25} | {}",
                rtt_ms,
                cond.name(),
                bound / MB_S,
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                if hybrid >= target {
                    format!(">={target:.2} met")
                } else {
                    format!(">={target:.2} MISSED")
                }
            );
        }
    }
    println!();
    println!(
        "hybrid, worst fraction of the bound: {:.2} static (target 0.90), {:.2} changing (target 0.80); mob > swarm everywhere: {}",
        worst[0], worst[1], mob_over_swarm
    );
}

/// One condition in detail, for MOB and the hybrid: bytes carried per WAN link (multiples of
/// the object), each link's utilisation (fraction of its rate) per second bucket, and when
/// each receiver finished.
#[allow(clippy::needless_range_loop)]
fn show_detail(
    cond: Condition,
    sizes: [usize; 4],
    len: u64,
    piece_kib: u32,
    rtt_ms: u64,
    rates: Rates,
    tune: Tune,
) {
    for strategy in [Strategy::Mob, Strategy::Hybrid] {
        let (topo, changes) = network(cond, sizes, rtt_ms, rates);
        let bound = sim::bound_rate(&topo, &changes, len);
        let rates = topo.wan.clone();
        let mut spec = SwarmSimSpec::new(topo, strategy, len);
        spec.piece_len = piece_kib << 10;
        spec.wan_changes = changes;
        spec.seed = 4;
        tune.apply(&mut spec.config);
        let r = sim::run(spec);
        let tp = r.throughput();
        println!(
            "{} {} {rtt_ms} ms: {:.2} MB/s, {:.2} of the bound {:.2}",
            strategy.name(),
            cond.name(),
            tp / MB_S,
            tp / bound,
            bound / MB_S
        );
        let c = rates.len();
        println!("bytes carried x->y as multiples of the object (initial rate MB/s):");
        for x in 0..c {
            let row: Vec<String> = (0..c)
                .map(|y| {
                    if x == y {
                        "       -      ".to_string()
                    } else {
                        format!(
                            "{:5.2} ({:4.1})  ",
                            r.wan_bytes[x][y] as f64 / len as f64,
                            rates[x][y] / MB_S
                        )
                    }
                })
                .collect();
            println!("  {}: {}", (b'A' + x as u8) as char, row.join(""));
        }
        let secs = r.elapsed.as_secs() as usize + 1;
        let step = secs.div_ceil(20).max(1);
        println!("utilisation per {step} s (fraction of the initial rate):");
        for x in 0..c {
            for y in (0..c).filter(|&y| y != x) {
                let tl = &r.wan_timeline[x][y];
                let cells: Vec<String> = (0..secs)
                    .step_by(step)
                    .map(|s| {
                        let b: u64 = (s..(s + step).min(secs))
                            .map(|k| tl.get(k).copied().unwrap_or(0))
                            .sum();
                        format!("{:4.2}", b as f64 / (step as f64 * rates[x][y]))
                    })
                    .collect();
                println!(
                    "  {}->{}: {}",
                    (b'A' + x as u8) as char,
                    (b'A' + y as u8) as char,
                    cells.join(" ")
                );
            }
        }
        let done: Vec<String> = r
            .done_at
            .iter()
            .map(|d| d.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64())))
            .collect();
        println!("done at (s): {}", done.join(" "));
        println!();
    }
}

/// The small-message result of seed 004, in the simulator: throughput of push (tree), MOB and
/// the hybrid over object sizes from 32 KiB to 128 MiB, static conditions, 20 and 100 ms.
/// Pieces are sized as `bulkcast send` sizes chunks (about 1/300 of the object, a power of two
/// between 64 KiB and 1 MiB), so a small object is a few pieces.
fn show_sweep(sizes: [usize; 4], rates: Rates, tune: Tune) {
    println!(
        "clusters of {sizes:?} nodes; MB/s (object / time until the last node finished); winner"
    );
    println!("{}", rates_line(rates));
    println!(
        "{:>6} {:<11} {:>9} | {:>7} {:>7} {:>7} | winner | hybrid's WAN copies B/C/D",
        "RTT", "condition", "size", "tree", "mob", "hybrid"
    );
    for rtt_ms in [20u64, 100] {
        for cond in [Condition::FastLinks, Condition::SlowLinks] {
            for kib in [32u64, 128, 512, 2048, 8192, 32768, 131072] {
                let len = kib << 10;
                let piece = ((len / 300).clamp(64 << 10, 1 << 20)).next_power_of_two() as u32;
                let mut tps = Vec::new();
                let mut copies = String::new();
                for strategy in [Strategy::TreePush, Strategy::Mob, Strategy::Hybrid] {
                    let (topo, changes) = network(cond, sizes, rtt_ms, rates);
                    let mut spec = SwarmSimSpec::new(topo, strategy, len);
                    spec.piece_len = piece.min(len as u32);
                    spec.wan_changes = changes;
                    spec.seed = 4;
                    tune.apply(&mut spec.config);
                    let r = sim::run(spec);
                    if strategy == Strategy::Hybrid {
                        copies = r.wan_multiples()[1..]
                            .iter()
                            .map(|m| format!("{m:.2}"))
                            .collect::<Vec<_>>()
                            .join("/");
                    }
                    tps.push(if r.incomplete().is_empty() {
                        r.throughput() / MB_S
                    } else {
                        0.0
                    });
                }
                let best = (0..3)
                    .max_by(|&a, &b| tps[a].total_cmp(&tps[b]))
                    .expect("three");
                println!(
                    "{:>4}ms {:<11} {:>6} KiB | {:>7.2} {:>7.2} {:>7.2} | {:<6} | {}",
                    rtt_ms,
                    cond.name(),
                    kib,
                    tps[0],
                    tps[1],
                    tps[2],
                    ["tree", "mob", "hybrid"][best],
                    copies
                );
            }
        }
    }
}

/// Which WAN rates a run uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rates {
    /// The simulator's own (`sim::FAST_LINKS`).
    Sim,
    /// The lab's seed 004 scenarios (`--lab`).
    Lab,
    /// The lab's, as TCP carries them when every WAN path is loaded at once (`--lab --tcp`):
    /// what the lab measured with iperf3 (`lab_tcp_bound`, 2026-11-24), 0.95 of the rate one
    /// way out of the source's cluster and 0.91 between the others, which carry data both ways
    /// and so each other's acks behind it.
    LabTcp,
}

/// TCP's share of a WAN link out of the source's cluster, and between two receiving
/// clusters ([`Rates::LabTcp`]).
const TCP_ONE_WAY: f64 = 0.95;
const TCP_TWO_WAY: f64 = 0.91;

/// The four-cluster network of a condition at `rtt_ms`, and its schedule of changes.
fn network(
    cond: Condition,
    sizes: [usize; 4],
    rtt_ms: u64,
    rates: Rates,
) -> (Topology, Vec<WanChange>) {
    let mut topo = Topology::four_clusters(sizes, Duration::from_millis(rtt_ms));
    if rates != Rates::Sim {
        topo.set_lab_links();
    }
    let mut changes = cond.apply(&mut topo, 4, Duration::from_secs(3600));
    if rates == Rates::LabTcp {
        // Cluster 0 holds the source.
        let share = |from: usize| if from == 0 { TCP_ONE_WAY } else { TCP_TWO_WAY };
        for (x, row) in topo.wan.iter_mut().enumerate() {
            for r in row.iter_mut() {
                *r *= share(x);
            }
        }
        for c in &mut changes {
            c.rate *= share(c.from);
        }
    }
    (topo, changes)
}

/// Which WAN rates a run uses, for the header.
fn rates_line(rates: Rates) -> &'static str {
    match rates {
        Rates::Sim => "WAN rates: the simulator's own (sim::FAST_LINKS)",
        Rates::Lab => "WAN rates: the lab's seed 004 scenarios (--lab, sim::LAB_LINKS)",
        Rates::LabTcp => "WAN rates: the lab's seed 004 scenarios as TCP carries them (--lab --tcp: x0.95 out of the source's cluster, x0.91 between the others)",
    }
}

/// The hybrid's settings under test (`--servers`, `--shares`).
#[derive(Clone, Copy)]
struct Tune {
    servers: usize,
    shares: ShareLayout,
}

impl Tune {
    fn apply(&self, c: &mut SwarmConfig) {
        c.hybrid_servers = self.servers;
        c.hybrid_shares = self.shares;
    }
}
