//! The broadcast bound of a static lab scenario over what TCP carries on its links, measured:
//! `bench/swarm-run --tcp-bound` puts it beside the bound of the links' rates.
//!
//! The lab is brought up and every WAN path loaded at once as a broadcast loads it
//! ([`bulkcast_lab::mesh::tcp_mesh`]: one way out of the source's site, both ways between the
//! receiving sites, iperf3 with the given congestion control). Each direction's payload
//! goodput becomes that link's rate in the cluster graph (links into the source's site: 0,
//! nothing has to flow there), and the bound is `sim::broadcast_bound` of that graph
//! ([`bulkcast_lab::mesh::MeshReport::bound`]), in payload bytes, so it compares directly with
//! object size / time. A method can beat it slightly: a link whose reverse direction it leaves
//! idle carries more than two-way TCP did. Prints one JSON object.

use std::path::PathBuf;

use bulkcast_lab::mesh::{tcp_mesh, MeshOptions};
use bulkcast_lab::{Lab, Scenario};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "lab-tcp-bound",
    about = "broadcast bound of a static lab scenario over measured TCP goodput"
)]
struct Args {
    /// Scenario file (static: its rates do not change).
    scenario: PathBuf,
    /// Seconds measured.
    #[arg(long, default_value_t = 20)]
    secs: u32,
    /// Seconds of slow start left out.
    #[arg(long, default_value_t = 3)]
    omit: u32,
    /// Congestion control of every stream.
    #[arg(long, default_value = "bbr")]
    cc: String,
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(&a) {
        eprintln!("lab-tcp-bound: {e}");
        std::process::exit(2);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let sc = Scenario::load(&a.scenario)?;
    let lab = Lab::up(&sc)?;
    let opts = MeshOptions {
        secs: a.secs,
        omit_s: a.omit,
        cc: a.cc.clone(),
        ..MeshOptions::default()
    };
    let report = tcp_mesh(&lab, &opts);
    let layout = lab.layout().clone();
    lab.down()?;
    let report = report?;
    let bound = report.bound(&layout) * 8.0 / 1e6;
    let doc = serde_json::json!({
        "scenario": layout.name,
        "cc": a.cc,
        "secs": a.secs,
        "tcp_bound_mbps": (bound * 1000.0).round() / 1000.0,
        "links": report.links,
        "late_events": report.late_events,
        "host": report.host,
        "host_stalled": report.host_stalled(),
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
