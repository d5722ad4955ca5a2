//! `dynamic`: seed 002's dynamic experiment, one stream while a channel alternates, with a
//! per-second time series and the re-convergence time after every step.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use bulkcast_lab::streams::{
    capacity_at, capacity_steps, carried_bins, carried_mbps_per_s, pin_off_forwarder,
    reconvergence, SettleRule, BIN_S,
};
use bulkcast_lab::Lab;
use serde_json::{json, Value};

use crate::pipe::{
    channel_setup, conditions, outcome_json, pipe_problem, run_pipe, Channels, PipeRun,
};
use crate::Ctx;

/// Per second: the sender's `--stats` lines (total and per-connection Mbit/s and weights).
#[derive(Default, Clone)]
pub struct StatsSecond {
    total_mbps: f64,
    conns: Vec<(f64, Option<f64>)>,
}

pub fn read_stats(path: &Path, interval_s: f64) -> BTreeMap<usize, StatsSecond> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // (second, edge) -> lines
    let mut acc: BTreeMap<(usize, String), Vec<Value>> = BTreeMap::new();
    for l in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        let Some(t) = v["t_s"].as_f64() else {
            continue;
        };
        let k = (t - interval_s / 2.0).max(0.0).floor() as usize;
        let edge = v["edge"].as_str().unwrap_or("").to_string();
        acc.entry((k, edge)).or_default().push(v);
    }
    let mut out: BTreeMap<usize, StatsSecond> = BTreeMap::new();
    for ((k, _), lines) in acc {
        let n = lines.len() as f64;
        let e = out.entry(k).or_default();
        e.total_mbps += lines
            .iter()
            .filter_map(|v| v["total_mbps"].as_f64())
            .sum::<f64>()
            / n;
        for v in &lines {
            // `conns` before the key was renamed to match the report.
            let conns = v.get("connections").or_else(|| v.get("conns"));
            for (i, c) in conns
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .enumerate()
            {
                if e.conns.len() <= i {
                    e.conns.resize(i + 1, (0.0, None));
                }
                e.conns[i].0 += c["mbps"].as_f64().unwrap_or(0.0) / n;
                if let Some(w) = c["weight"].as_f64() {
                    e.conns[i].1 = Some(e.conns[i].1.unwrap_or(0.0) + w / n);
                }
            }
        }
    }
    out
}

pub fn run_dynamic(
    ctx: &mut Ctx,
    scenarios: &[String],
    streams: &[String],
    schedulers: &[String],
    secs: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut summary = String::new();
    for (si, name) in scenarios.iter().enumerate() {
        let (_, sc) = ctx.scenario(name)?;
        let lab = Lab::up(&sc)?;
        pin_off_forwarder();
        let Channels {
            receiver,
            addrs,
            routes: rts,
            watch,
        } = channel_setup(&lab)?;
        let n = streams
            .get(si)
            .or(streams.last())
            .cloned()
            .unwrap_or("auto".into());
        let steps = capacity_steps(lab.layout(), &rts, secs);
        let cap0 = capacity_at(lab.layout(), &rts, 0.0).ok_or("a channel is unlimited")? / 1e6;
        ctx.print(&format!(
            "\nseed 002 dynamic, {}: {} connections, {secs} s of input; capacity {cap0} Mbit/s, \
             then {}\n",
            lab.name(),
            n,
            steps
                .iter()
                .map(|(t, c)| format!("{} at {t} s", c / 1e6))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        ctx.print(&format!(
            "{:<10} {:>8} {:>10} {:>10} {:>10}  {}\n",
            "scheduler",
            "fraction",
            "start-up",
            "reconv max",
            "delivered",
            "re-convergence after each step (s): carried IP rate | delivered (3 s windows)"
        ));
        for sched in schedulers {
            let tag = format!("dynamic-{}-{sched}", lab.name());
            let (o, stats_path) = run_pipe(
                ctx,
                PipeRun {
                    lab: &lab,
                    receiver: &receiver,
                    addrs: &addrs,
                    // Seed 002's experiment: parallel TCP connections.
                    opts: format!("--streams {n} --scheduler {sched} --transport tcp"),
                    bytes: None,
                    max_s: Some(secs),
                    timeout: Duration::from_secs_f64(secs + 120.0),
                    restart_clock: true,
                    watch: watch.clone(),
                    tag: tag.clone(),
                },
            )?;
            let problem = pipe_problem(&o, None);
            let sink = o.sink.clone().unwrap_or_default();
            let t_end = secs.min(o.fed_s.unwrap_or(secs)).floor();
            let per_s = (1.0 / BIN_S).round() as usize;
            let bins_end = ((t_end / BIN_S).round() as usize).min(sink.bins.len());
            let delivered: u64 = sink.bins[..bins_end].iter().sum();
            let cap_integral: f64 = (0..t_end as usize)
                .map(|k| capacity_at(lab.layout(), &rts, k as f64 + 0.5).unwrap_or(0.0))
                .sum();
            let fraction = delivered as f64 * 8.0 / cap_integral;
            // Re-convergence on the IP rate the channels carried (1 s windows: how fast the
            // connections take up the new capacity) and on the rate delivered in order (3 s
            // windows: in-order delivery comes in bursts of chunks held up by the slowest
            // channel).
            let carried_b = carried_bins(&o.links, BIN_S);
            let on_carried = SettleRule {
                window_s: 1.0,
                tol: 0.1,
                hold_s: 2.0,
            };
            let on_delivered = SettleRule {
                window_s: 3.0,
                ..on_carried
            };
            let settle = |bins: &[u64], rule: &SettleRule| -> (Option<f64>, Vec<Option<f64>>) {
                let first = steps.first().map_or(t_end, |s| s.0);
                let startup = reconvergence(bins, BIN_S, 0.0, first, cap0, rule);
                let each = steps
                    .iter()
                    .enumerate()
                    .map(|(i, (t, c))| {
                        let until = steps.get(i + 1).map_or(t_end, |s| s.0);
                        reconvergence(bins, BIN_S, *t, until, c / 1e6, rule)
                    })
                    .collect();
                (startup, each)
            };
            let (startup, reconv) = settle(&carried_b, &on_carried);
            let (startup_d, reconv_d) = settle(&sink.bins, &on_delivered);
            // Time series, one row per second.
            let stats = read_stats(&stats_path, ctx.args.stats_ms as f64 / 1000.0);
            let carried = carried_mbps_per_s(&o.links);
            let max_conns = stats.values().map(|s| s.conns.len()).max().unwrap_or(0);
            let seconds = sink.bins.len().div_ceil(per_s);
            let mut csv = String::from("t_s,capacity_mbps,delivered_mbps,fraction,carried_ip_mbps");
            for (i, &l) in watch.iter().enumerate() {
                let _ = write!(
                    csv,
                    ",ch{i}_{}_ip_mbps",
                    lab.layout().links[l].name.replace(',', "_")
                );
            }
            csv.push_str(",stats_total_mbps");
            for i in 0..max_conns {
                let _ = write!(csv, ",conn{i}_mbps,conn{i}_weight");
            }
            csv.push('\n');
            let mut series = Vec::new();
            for k in 0..seconds {
                let c = capacity_at(lab.layout(), &rts, k as f64 + 0.5).unwrap_or(0.0) / 1e6;
                let d: u64 = sink.bins[k * per_s..((k + 1) * per_s).min(sink.bins.len())]
                    .iter()
                    .sum();
                let d = d as f64 * 8.0 / 1e6;
                let car = carried.get(k).cloned().unwrap_or_default();
                let _ = write!(
                    csv,
                    "{k},{c:.3},{d:.3},{:.4},{:.3}",
                    d / c,
                    car.iter().sum::<f64>()
                );
                for i in 0..watch.len() {
                    let _ = write!(csv, ",{:.3}", car.get(i).copied().unwrap_or(0.0));
                }
                let st = stats.get(&k);
                let _ = write!(
                    csv,
                    ",{}",
                    st.map_or(String::new(), |s| format!("{:.3}", s.total_mbps))
                );
                for i in 0..max_conns {
                    let conn = st.and_then(|s| s.conns.get(i));
                    let _ = write!(
                        csv,
                        ",{},{}",
                        conn.map_or(String::new(), |c| format!("{:.3}", c.0)),
                        conn.and_then(|c| c.1)
                            .map_or(String::new(), |w| format!("{w:.4}"))
                    );
                }
                csv.push('\n');
                series.push(json!({"t_s": k, "capacity_mbps": c, "delivered_mbps": d,
                    "carried_ip_mbps": car, "stats_total_mbps": st.map(|s| s.total_mbps)}));
            }
            let csv_path = ctx.out.join(format!("{tag}.csv"));
            std::fs::write(&csv_path, &csv)?;
            let fmt = |x: &Option<f64>| x.map_or("never".into(), |v| format!("{v:.1}"));
            let worst = |v: &[Option<f64>]| -> String {
                if v.iter().any(Option::is_none) {
                    "never".into()
                } else {
                    fmt(&v.iter().flatten().copied().reduce(f64::max))
                }
            };
            let mut notes = vec![];
            if let Some(p) = &problem {
                notes.push(p.clone());
            }
            let c = conditions(&o);
            if !c.is_empty() {
                notes.push(c);
            }
            ctx.print(&format!(
                "{:<10} {:>8} {:>10} {:>10} {:>10}  {} | {}  {}\n",
                sched,
                format!("{fraction:.3}"),
                fmt(&startup),
                worst(&reconv),
                worst(&reconv_d),
                reconv.iter().map(fmt).collect::<Vec<_>>().join(" "),
                reconv_d.iter().map(fmt).collect::<Vec<_>>().join(" "),
                notes.join("; ")
            ));
            // Mean per phase (between steps), for a quick look at the levels.
            let mut bounds = vec![0.0];
            bounds.extend(steps.iter().map(|s| s.0));
            bounds.push(t_end);
            let phases: Vec<String> = bounds
                .windows(2)
                .map(|w| {
                    let (a, b) = (
                        (w[0] / BIN_S) as usize,
                        ((w[1] / BIN_S) as usize).min(sink.bins.len()),
                    );
                    let d: u64 = sink.bins.get(a..b).map_or(0, |x| x.iter().sum());
                    let c = capacity_at(lab.layout(), &rts, w[0] + 0.5).unwrap_or(0.0) / 1e6;
                    format!("{:.1}/{c}", d as f64 * 8.0 / (w[1] - w[0]) / 1e6)
                })
                .collect();
            ctx.print(&format!(
                "{:<10} per phase, delivered/capacity Mbit/s: {}\n{:<10} time series: {}\n",
                "",
                phases.join(" "),
                "",
                csv_path.display()
            ));
            let _ = writeln!(
                summary,
                "{:<28} {:<9} fraction {fraction:.3}, start-up {}, re-convergence max {} \
                 (carried), {} (delivered)",
                lab.name(),
                sched,
                fmt(&startup),
                worst(&reconv),
                worst(&reconv_d)
            );
            ctx.log(json!({
                "experiment": "dynamic", "scenario": lab.name(), "streams": n,
                "scheduler": sched, "secs": secs, "fraction": fraction,
                "startup_s": startup, "steps": steps.iter().map(|s| json!({"t_s": s.0, "capacity_mbps": s.1 / 1e6})).collect::<Vec<_>>(),
                "reconvergence_s": reconv, "startup_delivered_s": startup_d,
                "reconvergence_delivered_s": reconv_d, "problem": problem,
                "bin_s": BIN_S, "delivered_bins": sink.bins, "carried_ip_bins": carried_b, "csv": csv_path,
                "stats_file": stats_path, "series": series, "outcome": outcome_json(&o),
            }));
            std::thread::sleep(Duration::from_secs(1));
        }
        lab.down()?;
    }
    ctx.print(&format!(
        "\nseed 002 dynamic (fraction: bytes delivered in order during the input's seconds over \
         the integral of the nominal capacity; re-convergence: first time after a step from \
         which, for 2 s, every 1 s window of the IP rate the channels carried (every 3 s window \
         of the rate delivered in order) is within 10% of the new nominal capacity):\n{summary}"
    ));
    Ok(())
}
