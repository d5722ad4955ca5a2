//! The broadcast bound of a lab scenario, over its schedule: `bench/swarm-run` divides measured
//! rates by it.
//!
//! The scenario's WAN rates are replayed through the lab's own emulator core (scheduled
//! changes, alternations and seeded fluctuation exactly as the forwarder applies them, with no
//! traffic), and the clusters and WAN links become a `bulkcast_proto::swarm::sim::Topology`:
//! each site is a cluster, each directed WAN path a link; access links are taken as they are
//! (absent: unlimited). The bound is `sim::broadcast_bound` (per receiver the maximum flow from
//! the source, the least over receivers: the LP / tree-packing bound of a cluster graph) and,
//! over the schedule, `sim::bound_time` for the given object size (each receiver at every
//! instant at its maximum flow under that instant's rates). Rates count IP bytes, as the lab's
//! links do. Prints one JSON object.

use std::path::PathBuf;
use std::time::Duration;

use bulkcast_lab::emu::Emulator;
use bulkcast_lab::mesh::{cluster_topology, UNLIMITED};
use bulkcast_lab::Scenario;
use bulkcast_proto::swarm::sim::{bound_time, broadcast_bound, WanChange};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "lab-bound",
    about = "broadcast bound of a lab scenario over its schedule"
)]
struct Args {
    /// Scenario file.
    scenario: PathBuf,
    /// Object size in bytes.
    #[arg(long)]
    size: u64,
    /// Replay the schedule up to this many seconds.
    #[arg(long, default_value_t = 3600)]
    horizon_s: u64,
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("lab-bound: {e}");
        std::process::exit(2);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let layout = Scenario::load(&a.scenario)?.resolve()?;
    let mut emu = Emulator::new(&layout, 0);
    // Site x -> site y now, bytes per second.
    let link = |emu: &Emulator, x: usize, y: usize| {
        layout.site_links[x][y].map_or(0.0, |l| emu.link_rate(l).map_or(UNLIMITED, |r| r / 8.0))
    };
    let rates = |emu: &Emulator| cluster_topology(&layout, |x, y| link(emu, x, y)).1.wan;
    let (order, topo) = cluster_topology(&layout, |x, y| link(&emu, x, y));
    let wan0 = topo.wan.clone();
    // Replay the schedule: every deadline with no packets in flight is a condition change.
    let horizon = a.horizon_s * 1_000_000_000;
    let mut changes = Vec::new();
    let mut schedule = vec![(0.0, wan0.clone())];
    let mut prev = wan0;
    while let Some(t) = emu.next_deadline() {
        if t > horizon {
            break;
        }
        emu.advance(t, |_, _| true);
        let now = rates(&emu);
        if now != prev {
            for (x, row) in now.iter().enumerate() {
                for (y, &r) in row.iter().enumerate() {
                    if x != y && r != prev[x][y] {
                        changes.push(WanChange {
                            at: Duration::from_nanos(t),
                            from: x,
                            to: y,
                            rate: r,
                        });
                    }
                }
            }
            schedule.push((t as f64 / 1e9, now.clone()));
            prev = now;
        }
    }
    let mbps = |bytes_per_s: f64| bytes_per_s * 8.0 / 1e6;
    let initial = broadcast_bound(&topo);
    let t = bound_time(&topo, &changes, a.size);
    let (time_s, rate) = if t == Duration::MAX {
        (None, 0.0)
    } else {
        (
            Some(t.as_secs_f64()),
            a.size as f64 / t.as_secs_f64().max(1e-12),
        )
    };
    // Each period's own bound, up to the bound time (what the schedule looked like).
    let until = time_s.unwrap_or(a.horizon_s as f64);
    let periods: Vec<_> = schedule
        .iter()
        .take_while(|(at, _)| *at <= until)
        .map(|(at, wan)| {
            let mut tp = topo.clone();
            tp.wan = wan.clone();
            let mut links = serde_json::Map::new();
            for (i, &x) in order.iter().enumerate() {
                for (j, &y) in order.iter().enumerate() {
                    if x != y && layout.site_links[x][y].is_some() {
                        links.insert(
                            format!("{}->{}", layout.sites[x], layout.sites[y]),
                            serde_json::json!(round(mbps(wan[i][j]))),
                        );
                    }
                }
            }
            serde_json::json!({
                "at_s": at,
                "bound_mbps": round(mbps(broadcast_bound(&tp))),
                "wan_mbps": links,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "scenario": layout.name,
        "clusters": order.iter().zip(&topo.clusters).map(|(&s, &n)| serde_json::json!({"site": layout.sites[s], "hosts": n})).collect::<Vec<_>>(),
        "size": a.size,
        "static": schedule.len() == 1,
        "initial_bound_mbps": round(mbps(initial)),
        "bound_time_s": time_s,
        "bound_mbps": round(mbps(rate)),
        "periods": periods,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
