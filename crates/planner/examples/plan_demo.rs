//! Prints `auto` and `balanced` plans for the seed 004 style four-cluster scenario (with the
//! bound), and writes their DOT and SVG pictures to a directory:
//!
//! ```text
//! cargo run -p bulkcast-planner --example plan_demo [OUT_DIR]
//! ```

use bulkcast_planner::{bound, plan, Algorithm, Matrix, Network, PlanOptions};

fn main() {
    let out_dir = std::env::args().nth(1);
    let net = four_clusters();
    print!("{}", net.render_matrices());
    let b = bound(&net).expect("bound");
    for algo in [Algorithm::Auto, Algorithm::Balanced] {
        let p = plan(&net, algo, &PlanOptions::default()).expect("plan");
        println!("\n{}", p.render_text(&net, Some(&b)));
        if let Some(dir) = &out_dir {
            for (ext, text) in [("dot", p.to_dot(&net)), ("svg", p.to_svg(&net))] {
                let path = format!("{dir}/{}.{ext}", algo.name());
                std::fs::write(&path, text).expect("write picture");
                println!("wrote {path}");
            }
        }
    }
}

/// Four sites of four nodes, 1 Gbit/s access links, 20 ms / 0.1 ms RTT, WAN capacities per
/// site pair (our own values; the seed's figure is not in its text).
fn four_clusters() -> Network {
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
    let mut net = Network::new(rtt).expect("valid RTTs");
    for v in 0..n {
        let name = format!("{}{}", sites[site(v)], v % 4);
        net.set_name(v, &name).expect("node");
        net.set_site(v, Some(sites[site(v)])).expect("node");
        net.set_uplink(v, Some(1000.0)).expect("node");
        net.set_downlink(v, Some(1000.0)).expect("node");
    }
    for (a, b, c) in [
        ("A", "B", 800.0),
        ("A", "C", 400.0),
        ("A", "D", 240.0),
        ("B", "C", 640.0),
        ("B", "D", 320.0),
        ("C", "D", 560.0),
    ] {
        net.set_wan(a, b, c).expect("site");
        net.set_wan(b, a, c).expect("site");
    }
    net
}
