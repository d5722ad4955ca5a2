//! `static`: seed 002's static experiment, channel scenarios x connection counts x schedulers.

use std::fmt::Write as _;
use std::time::Duration;

use bulkcast_lab::streams::{capacity_at, pin_off_forwarder};
use bulkcast_lab::Lab;
use serde_json::json;

use crate::pipe::{
    carried_mean, channel_setup, conditions, mean, outcome_json, pipe_problem, run_pipe, Channels,
    PipeRun,
};
use crate::{Ctx, GOODPUT_CEILING};

fn parse_counts(s: &str) -> Result<Vec<usize>, String> {
    let mut v = Vec::new();
    for part in s.split(',') {
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (
                a.trim().parse().map_err(|_| format!("bad count {a:?}"))?,
                b.trim().parse().map_err(|_| format!("bad count {b:?}"))?,
            );
            v.extend(a..=b);
        } else {
            v.push(
                part.trim()
                    .parse()
                    .map_err(|_| format!("bad count {part:?}"))?,
            );
        }
    }
    Ok(v)
}

pub fn run_static(
    ctx: &mut Ctx,
    scenarios: &[String],
    counts: Option<&str>,
    schedulers: &[String],
    secs: f64,
    repeat: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut summary = String::new();
    for name in scenarios {
        let (_, sc) = ctx.scenario(name)?;
        let lab = Lab::up(&sc)?;
        pin_off_forwarder();
        let Channels {
            receiver,
            addrs,
            routes: rts,
            watch,
        } = channel_setup(&lab)?;
        let cap = capacity_at(lab.layout(), &rts, 0.0).ok_or("a channel is unlimited")? / 1e6;
        let chans: Vec<String> = watch
            .iter()
            .map(|&l| format!("{}", lab.layout().links[l].rate_bps.unwrap_or(0.0) / 1e6))
            .collect();
        let counts = match counts {
            Some(c) => parse_counts(c)?,
            None => (addrs.len().max(2)..=9).collect(),
        };
        let bytes = (cap * 1e6 / 8.0 * secs) as u64;
        let mut t = String::new();
        let _ = writeln!(
            t,
            "\nseed 002 static, {}: channels {} = {cap} Mbit/s nominal; {:.0} MB per run; \
             fraction of the nominal sum (TCP goodput ceiling {GOODPUT_CEILING}), receiver-side, \
             set-up included",
            lab.name(),
            chans.join("+"),
            bytes as f64 / 1e6
        );
        let _ = write!(t, "{:>6}", "conns");
        for s in schedulers {
            let _ = write!(t, " {s:>10}");
        }
        let _ = writeln!(t, "  notes");
        ctx.print(&t);
        let mut cols: Vec<Vec<Option<f64>>> = vec![Vec::new(); schedulers.len()];
        for &n in &counts {
            let mut line = format!("{n:>6}");
            let mut notes = Vec::new();
            for (si, sched) in schedulers.iter().enumerate() {
                let mut fr = Vec::new();
                for rep in 0..repeat {
                    let tag = format!("static-{}-n{n}-{sched}-r{rep}", lab.name());
                    let (o, stats) = run_pipe(
                        ctx,
                        PipeRun {
                            lab: &lab,
                            receiver: &receiver,
                            addrs: &addrs,
                            // Seed 002's experiment: parallel TCP connections.
                            opts: format!("--streams {n} --scheduler {sched} --transport tcp"),
                            bytes: Some(bytes),
                            max_s: None,
                            timeout: Duration::from_secs_f64((secs * 8.0).max(90.0)),
                            restart_clock: false,
                            watch: watch.clone(),
                            tag: tag.clone(),
                        },
                    )?;
                    let problem = pipe_problem(&o, Some(bytes));
                    let f = o.e2e_mbps().map(|r| r / cap);
                    let c = conditions(&o);
                    if let Some(p) = &problem {
                        notes.push(format!("{sched}: {p}"));
                    }
                    if !c.is_empty() {
                        notes.push(format!("{sched}: {c}"));
                    }
                    ctx.log(json!({
                        "experiment": "static", "scenario": lab.name(), "conns": n,
                        "scheduler": sched, "repeat": rep, "bytes": bytes,
                        "capacity_mbps": cap, "fraction": f, "problem": problem,
                        "channel_carried_ip_mbps": carried_mean(&o),
                        "stats_file": stats, "outcome": outcome_json(&o),
                    }));
                    fr.push(if problem.is_none() { f } else { None });
                    std::thread::sleep(Duration::from_millis(500));
                }
                let m = mean(&fr);
                cols[si].push(m);
                let _ = write!(
                    line,
                    " {:>10}",
                    m.map_or("FAIL".into(), |x| format!("{x:.3}"))
                );
            }
            let _ = writeln!(line, "  {}", notes.join("; "));
            ctx.print(&line);
        }
        ctx.print(&mean_and_min_rows(&cols));
        let _ = write!(summary, "{:<24}", lab.name());
        for (s, c) in schedulers.iter().zip(&cols) {
            let _ = write!(
                summary,
                " {s}={}",
                mean(c).map_or("-".into(), |x| format!("{x:.3}"))
            );
        }
        summary.push('\n');
        lab.down()?;
    }
    ctx.print(&format!(
        "\nseed 002 static, mean fraction per scheduler:\n{summary}"
    ));
    Ok(())
}

/// The table's last two rows: each scheduler's mean and minimum fraction over the counts.
fn mean_and_min_rows(cols: &[Vec<Option<f64>>]) -> String {
    let mut line = format!("{:>6}", "mean");
    let mut mins = format!("{:>6}", "min");
    for c in cols {
        let _ = write!(
            line,
            " {:>10}",
            mean(c).map_or("-".into(), |x| format!("{x:.3}"))
        );
        let mn = c.iter().flatten().copied().reduce(f64::min);
        let _ = write!(
            mins,
            " {:>10}",
            mn.map_or("-".into(), |x| format!("{x:.3}"))
        );
    }
    format!("{line}\n{mins}\n")
}
