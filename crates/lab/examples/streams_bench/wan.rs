//! `wan`: one path of 100 Mbit/s, 100 ms RTT, 0/1/5% loss; bulkcast pipe against iperf3.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use bulkcast_lab::streams::{
    bottlenecks, pin_off_forwarder, routes, run_stream, StreamSpec, BIN_S,
};
use bulkcast_lab::Lab;
use serde_json::json;

use crate::pipe::{
    carried_mean, conditions, last_json, outcome_json, pipe_problem, run_pipe, PipeRun,
};
use crate::{Ctx, GOODPUT_CEILING};

pub fn run_wan(
    ctx: &mut Ctx,
    losses: &[String],
    methods: &[String],
    secs: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let link_mbps = 100.0;
    // method -> loss -> (Mbit/s, note)
    let mut cells: BTreeMap<(usize, usize), (Option<f64>, String)> = BTreeMap::new();
    // pipe methods: method -> loss -> Mbit/s from the first connection's handshake on, the
    // moment iperf3 starts its clock.
    let mut from_conn: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    // pipe methods: bytes delivered in order during the `secs` seconds after the first
    // connection's handshake, over `secs`: iperf3's measure (a fixed window, no tail).
    let mut window: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for (li, loss) in losses.iter().enumerate() {
        let (_, sc) = ctx.scenario(&format!("wan-100m-100ms-loss{loss}"))?;
        let lab = Lab::up(&sc)?;
        pin_off_forwarder();
        let src = lab.source().to_string();
        let receiver = lab
            .host_names()
            .into_iter()
            .find(|h| *h != src)
            .ok_or("no receiver")?;
        let raddr = lab.addr(&receiver)?;
        let rts = routes(lab.layout(), &src, &[raddr])?;
        let watch = bottlenecks(lab.layout(), &rts);
        for (mi, m) in methods.iter().enumerate() {
            let tag = format!("wan-loss{loss}-{m}");
            let (rate, note, rec) = if let Some(rest) = m.strip_prefix("pipe") {
                // pipe[-streamsN][-chunkK][-cubic][-udp|-tcp]: N connections, K KiB chunks, cubic,
                // a transport (default: pipe's own, auto).
                let opts = rest
                    .split('-')
                    .filter(|t| !t.is_empty())
                    .map(|t| {
                        let num = |p: &str| t.strip_prefix(p).filter(|n| n.parse::<u32>().is_ok());
                        if let Some(n) = num("streams") {
                            Ok(format!("--streams {n}"))
                        } else if let Some(k) = num("chunk") {
                            Ok(format!("--chunk-kib {k}"))
                        } else if t == "cubic" {
                            Ok("--cc cubic".to_string())
                        } else if t == "udp" || t == "tcp" {
                            Ok(format!("--transport {t}"))
                        } else {
                            Err(format!("unknown wan method {m:?}"))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(" ");
                let bytes = (link_mbps * 1e6 / 8.0 * secs) as u64;
                let (o, stats) = run_pipe(
                    ctx,
                    PipeRun {
                        lab: &lab,
                        receiver: &receiver,
                        addrs: &[raddr],
                        opts,
                        bytes: Some(bytes),
                        // Input ends after 4x the expected time (what was accepted by then is
                        // still delivered and counted).
                        max_s: Some(secs * 4.0),
                        timeout: Duration::from_secs_f64(secs * 8.0 + 60.0),
                        restart_clock: false,
                        watch: watch.clone(),
                        tag: tag.clone(),
                    },
                )?;
                let problem = pipe_problem(&o, None);
                let rate = o.e2e_mbps();
                let connected = last_json(&o.send_stdout).and_then(|j| j["connected_s"].as_f64());
                if let (Some(sink), Some(c), None) = (&o.sink, connected, &problem) {
                    if let Some(last) = sink.last_s.filter(|&l| l > c) {
                        from_conn.insert((mi, li), sink.bytes as f64 * 8.0 / (last - c) / 1e6);
                    }
                    if let Some(r) = window_mbps_from(&sink.bins, c, secs) {
                        window.insert((mi, li), r);
                    }
                }
                let mut note = problem.clone().unwrap_or_default();
                if o.fed_bytes < bytes && problem.is_none() {
                    note = format!(
                        "input cut at {} s: {} of {bytes} bytes",
                        secs * 4.0,
                        o.fed_bytes
                    );
                }
                let c = conditions(&o);
                let note = [note, c]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(", ");
                let rec =
                    json!({"problem": problem, "stats_file": stats, "outcome": outcome_json(&o)});
                (if problem.is_none() { rate } else { None }, note, rec)
            } else if let Some(rest) = m.strip_prefix("iperf3-") {
                let (par, cc) = match rest.strip_prefix("p8-") {
                    Some(cc) => (8, cc),
                    None => (1, rest),
                };
                let port = ctx.port();
                let spec = StreamSpec {
                    sender: src.clone(),
                    receiver: receiver.clone(),
                    recv_cmd: format!("iperf3 -s -1 -p {port}"),
                    send_cmd: format!("iperf3 -c {raddr} -p {port} -t {secs} -P {par} -C {cc} -J"),
                    feed_bytes: None,
                    feed_max_s: None,
                    sink: false,
                    seed: 0,
                    port,
                    timeout: Duration::from_secs_f64(secs + 60.0),
                    restart_clock: false,
                    watch_links: watch.clone(),
                    log_prefix: ctx.out.join("logs").join(&tag),
                };
                eprintln!("streams-bench: {tag}: {}", spec.send_cmd);
                let o = run_stream(&lab, &spec)?;
                let j = last_json(&o.send_stdout);
                let rate = j
                    .as_ref()
                    .and_then(|j| j["end"]["sum_received"]["bits_per_second"].as_f64())
                    .map(|b| b / 1e6);
                let mut note = String::new();
                if let Some(e) = j.as_ref().and_then(|j| j["error"].as_str()) {
                    note = format!("iperf3: {e}");
                } else if rate.is_none() {
                    note = format!(
                        "no iperf3 report: {}",
                        o.send_stderr.lines().last().unwrap_or("")
                    );
                }
                let c = conditions(&o);
                let note = [note, c]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(", ");
                let retr = j
                    .as_ref()
                    .and_then(|j| j["end"]["sum_sent"]["retransmits"].as_u64());
                let rec = json!({"iperf3_mbps": rate, "retransmits": retr,
                    "carried_ip_mbps": carried_mean(&o), "outcome": {
                    "send_code": o.send_code, "timed_out": o.timed_out, "tx_dropped": o.tx_dropped,
                    "late_events": o.late_events, "build_running": o.build_running, "load1": o.load1,
                    "send_stderr": o.send_stderr}});
                (rate, note, rec)
            } else {
                return Err(format!("unknown wan method {m:?}").into());
            };
            ctx.log(
                json!({"experiment": "wan", "scenario": lab.name(), "loss_pct": loss,
                "method": m, "mbps": rate, "fraction": rate.map(|r| r / link_mbps),
                "note": note, "run": rec}),
            );
            eprintln!(
                "streams-bench: {tag}: {} Mbit/s {note}",
                rate.map_or("-".into(), |r| format!("{r:.1}"))
            );
            cells.insert((mi, li), (rate, note));
            std::thread::sleep(Duration::from_secs(1));
        }
        lab.down()?;
    }
    let mut t = format!(
        "\nWAN hop: one path of {link_mbps} Mbit/s, 100 ms RTT; Mbit/s (fraction of the link \
         rate; TCP goodput ceiling {GOODPUT_CEILING}); * = best of the column\n{:<26}",
        "method"
    );
    for l in losses {
        let _ = write!(t, " {:>18}", format!("loss {l}%"));
    }
    t.push('\n');
    let best: Vec<Option<f64>> = (0..losses.len())
        .map(|li| {
            (0..methods.len())
                .filter_map(|mi| cells.get(&(mi, li)).and_then(|c| c.0))
                .chain((0..methods.len()).filter_map(|mi| from_conn.get(&(mi, li)).copied()))
                .chain((0..methods.len()).filter_map(|mi| window.get(&(mi, li)).copied()))
                .reduce(f64::max)
        })
        .collect();
    let cell = |r: Option<f64>, li: usize| {
        r.map_or("FAIL".into(), |r| {
            format!(
                "{r:.1} ({:.3}){}",
                r / link_mbps,
                if Some(r) == best[li] { "*" } else { " " }
            )
        })
    };
    let mut notes = String::new();
    for (mi, m) in methods.iter().enumerate() {
        let _ = write!(t, "{m:<26}");
        for (li, loss) in losses.iter().enumerate() {
            let (r, note) = cells
                .get(&(mi, li))
                .cloned()
                .unwrap_or((None, String::new()));
            let _ = write!(t, " {:>18}", cell(r, li));
            if !note.is_empty() {
                let _ = writeln!(notes, "  {m} at {loss}%: {note}");
            }
        }
        t.push('\n');
        if (0..losses.len()).any(|li| from_conn.contains_key(&(mi, li))) {
            let _ = write!(t, "{:<26}", format!("{m}, connected"));
            for li in 0..losses.len() {
                let _ = write!(t, " {:>18}", cell(from_conn.get(&(mi, li)).copied(), li));
            }
            t.push('\n');
        }
        if (0..losses.len()).any(|li| window.contains_key(&(mi, li))) {
            let _ = write!(t, "{:<26}", format!("{m}, first {secs} s"));
            for li in 0..losses.len() {
                let _ = write!(t, " {:>18}", cell(window.get(&(mi, li)).copied(), li));
            }
            t.push('\n');
        }
    }
    t.push_str(
        "pipe: bytes delivered in order / (last byte - sender start), set-up included; \
         'pipe, connected': the same bytes / (last byte - first connection's handshake done), \
         the clock iperf3 uses; 'pipe, first N s': bytes delivered in order in the N s after \
         that handshake, over N s (iperf3's window: a fixed time, no tail); iperf3: its \
         receiver's rate over -t seconds (connection set-up not included)\n",
    );
    t.push_str(&notes);
    ctx.print(&t);
    Ok(())
}

/// Mbit/s delivered in the `secs` seconds from `from_s` (sender clock), from the receiver's
/// [`BIN_S`] bins; `None` unless the bins cover the whole window.
pub fn window_mbps_from(bins: &[u64], from_s: f64, secs: f64) -> Option<f64> {
    let first = (from_s / BIN_S).ceil() as usize;
    let n = (secs / BIN_S).round() as usize;
    let bytes: u64 = bins.get(first..first + n)?.iter().sum();
    Some(bytes as f64 * 8.0 / (n as f64 * BIN_S) / 1e6)
}
