//! Seed 002's experiments on the simulated edge: unweighted, weighted (the paper's controller)
//! and pull, as fractions of the channels' summed capacity; then the dynamic experiment.
//!
//! `cargo run --release -p bulkcast-proto --example forkjoin_sim` prints the tables;
//! `... -- --series` prints the dynamic experiment's time series as CSV instead (one row per
//! second and scheduler: throughput, capacity, and each connection's rate and weight).

use std::time::Duration;

use bulkcast_proto::multipath::sim::{run, ForkJoinSpec};
use bulkcast_proto::multipath::Scheduler;

const SCHEDULERS: [(Scheduler, &str); 3] = [
    (Scheduler::Equal, "unweighted"),
    (Scheduler::Weighted, "weighted"),
    (Scheduler::Pull, "pull"),
];

fn main() {
    if std::env::args().any(|a| a == "--series") {
        series();
        return;
    }
    println!("# Static: 60 s memory to memory, connections dealt round-robin to channels");
    println!(
        "{:<16} {:>3} {:>11} {:>9} {:>6}",
        "channels", "N", "unweighted", "weighted", "pull"
    );
    let setups: [(&[f64], &str, std::ops::RangeInclusive<usize>); 4] = [
        (&[20.0, 10.0], "20+10", 2..=8),
        (&[30.0, 20.0, 10.0], "30+20+10", 3..=9),
        (&[200.0, 100.0], "200+100", 2..=8),
        (&[300.0, 200.0, 100.0], "300+200+100", 3..=9),
    ];
    for (channels, name, ns) in setups {
        let mut sums = [0.0; 3];
        let mut count = 0.0;
        for n in ns {
            let f: Vec<f64> = SCHEDULERS
                .iter()
                .map(|&(s, _)| run(&ForkJoinSpec::paper(channels, n, s)).fraction)
                .collect();
            for k in 0..3 {
                sums[k] += f[k];
            }
            count += 1.0;
            println!(
                "{name:<16} {n:>3} {:>11.3} {:>9.3} {:>6.3}",
                f[0], f[1], f[2]
            );
        }
        println!(
            "{:<16} {:>3} {:>11.3} {:>9.3} {:>6.3}",
            format!("{name} mean"),
            "",
            sums[0] / count,
            sums[1] / count,
            sums[2] / count
        );
    }

    println!();
    println!("# Dynamic: one channel alternating every 20 s, 120 s");
    println!(
        "# fraction: of the capacity over the run; held: min/max over the 20-s intervals of the"
    );
    println!(
        "# level held in each interval's later half over its capacity; reconverge: from a step"
    );
    println!("# to the first 2 s averaging 90% of that level (mean/max over steps)");
    println!(
        "{:<22} {:>3} {:<11} {:>8} {:>13} {:>13}",
        "channels", "N", "scheduler", "fraction", "held min/max", "reconverge s"
    );
    let dynamic: [(&[f64], f64, f64, usize, &str); 2] = [
        (&[20.0, 10.0], 20.0, 30.0, 4, "10 + 20|30 Mbit/s"),
        (&[200.0, 100.0], 200.0, 300.0, 8, "100 + 200|300 Mbit/s"),
    ];
    for (channels, a, b, n, name) in dynamic {
        for &(s, sname) in &SCHEDULERS {
            let mut spec = ForkJoinSpec::paper(channels, n, s);
            spec.duration = Duration::from_secs(120);
            spec.sample = Duration::from_millis(500);
            spec.alternate(0, a, b, Duration::from_secs(20));
            let r = run(&spec);
            let times: Vec<f64> = r
                .steps
                .iter()
                .map(|st| st.reconverged_after.map_or(20.0, |d| d.as_secs_f64()))
                .collect();
            let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
            let max = times.iter().cloned().fold(0.0, f64::max);
            let held: Vec<f64> = r.steps.iter().map(|st| st.level / st.capacity).collect();
            let held_min = held.iter().cloned().fold(f64::INFINITY, f64::min);
            let held_max = held.iter().cloned().fold(0.0, f64::max);
            println!(
                "{name:<22} {n:>3} {sname:<11} {:>8.3} {:>6.3}/{:.3} {:>8.1}/{:.1}",
                r.fraction, held_min, held_max, mean, max
            );
        }
    }
}

fn series() {
    println!("scheduler,t_s,throughput_mbps,capacity_mbps,conn,rate_mbps,weight");
    for &(s, sname) in &SCHEDULERS {
        let mut spec = ForkJoinSpec::paper(&[20.0, 10.0], 4, s);
        spec.duration = Duration::from_secs(120);
        spec.alternate(0, 20.0, 30.0, Duration::from_secs(20));
        let r = run(&spec);
        for sample in &r.samples {
            for c in &sample.conns {
                println!(
                    "{sname},{:.0},{:.2},{:.1},{},{:.2},{:.3}",
                    sample.at.as_secs_f64(),
                    sample.throughput * 8e-6,
                    sample.capacity * 8e-6,
                    c.conn,
                    c.rate * 8e-6,
                    c.weight
                );
            }
        }
    }
}
