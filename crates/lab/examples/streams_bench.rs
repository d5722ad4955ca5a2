//! The runner behind `bench/streams-run` (issue 5, multi-stream edges): point-to-point streams
//! through `bulkcast pipe` (or stand-ins) on lab scenarios, printed as tables.
//!
//! - `static`: seed 002's static experiment. For each channel scenario, connection count and
//!   scheduler, one stream of a fixed size over the channels only (connection i on channel
//!   i mod P); throughput as a fraction of the channels' summed nominal capacity.
//! - `dynamic`: seed 002's dynamic experiment. One stream for `--secs` seconds while a channel
//!   alternates; per-second time series (CSV), mean fraction of capacity, re-convergence time
//!   after every step.
//! - `wan`: one path of 100 Mbit/s, 100 ms RTT, 0/1/5% loss; bulkcast pipe against iperf3.
//!
//! Every byte the receiver writes to stdout is checked against the seeded stream fed to the
//! sender. Rates are receiver-side: bytes delivered in order over the time from the sender's
//! start to the last byte. Tables go to stdout and `OUT/tables.txt`, one JSON line per run to
//! `OUT/runs.jsonl`, time series to `OUT/dynamic-*.csv`, and the senders' `--stats` files and
//! stderr to `OUT/logs/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bulkcast_lab::streams::{
    bottlenecks, capacity_at, capacity_steps, carried_bins, carried_mbps_per_s, pin_off_forwarder,
    reconvergence, routes, run_stream, SettleRule, StreamOutcome, StreamSpec, BIN_S,
};
use bulkcast_lab::{Lab, Scenario};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};

/// TCP's goodput ceiling on the lab's links: rates count IP bytes (1500-byte packets, 52 bytes
/// of IP and TCP headers with timestamps).
const GOODPUT_CEILING: f64 = 0.965;

#[derive(Parser)]
#[command(
    name = "streams-bench",
    about = "issue 5 benchmarks: multi-stream pipes on lab scenarios"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// The bulkcast binary run in the hosts ({bulkcast} in templates).
    #[arg(long, global = true, default_value = "target/release/bulkcast")]
    bulkcast: PathBuf,
    /// Directory for tables, runs, time series and logs (default:
    /// target/streams-bench/<time>).
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// Where scenario names are looked up.
    #[arg(long, global = true, default_value = "scenarios")]
    scenarios_dir: PathBuf,
    /// Replace bulkcast pipe by a stand-in to test the harness: `nc` (one connection on the
    /// first address, no scheduler).
    #[arg(long, global = true)]
    stand_in: Option<String>,
    /// Receiver command template (run with `sh -c exec ...` in the receiving host). Variables:
    /// {bulkcast} {port} {listen_args} {addr0} {addr0_ip}.
    #[arg(long, global = true)]
    recv_template: Option<String>,
    /// Sender command template. Variables: {bulkcast} {port} {addr0} {addr0_ip} {path_args}
    /// {opts} (--streams/--scheduler of the row) {stats_file} {stats_ms}.
    #[arg(long, global = true)]
    send_template: Option<String>,
    /// --stats-interval-ms passed to the sender.
    #[arg(long, global = true, default_value_t = 1000)]
    stats_ms: u64,
    /// First port; each run uses the next one.
    #[arg(long, global = true, default_value_t = 7600)]
    port: u16,
}

#[derive(Subcommand)]
enum Cmd {
    /// Seed 002 static: channel scenarios x connection counts x schedulers.
    Static {
        /// Scenarios (names in scenarios/ or files).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "seed002-channels-20-10,seed002-channels-30-20-10,seed002-channels-300-200-100"
        )]
        scenarios: Vec<String>,
        /// Connection counts, e.g. `2-9` or `3,5,9` (default: from the number of channels P,
        /// at least 2, to 9; below P some channel carries nothing).
        #[arg(long)]
        counts: Option<String>,
        /// Schedulers (`--scheduler` values).
        #[arg(long, value_delimiter = ',', default_value = "equal,weighted,pull")]
        schedulers: Vec<String>,
        /// Seconds each run should take at the channels' summed nominal rate (sets the size).
        #[arg(long, default_value_t = 15.0)]
        secs: f64,
        /// Runs per cell (the table shows their mean).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Seed 002 dynamic: one stream while a channel alternates.
    Dynamic {
        /// Scenarios with an alternating channel.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "seed002-dynamic,seed002-dynamic-100-200-300"
        )]
        scenarios: Vec<String>,
        /// `--streams` per scenario, in the same order (one value: for all). The paper used
        /// 4 (2 per channel) at 10+20|30 and 8 (4 per channel) at 100+200|300.
        #[arg(long, value_delimiter = ',', default_value = "4,8")]
        streams: Vec<String>,
        /// Schedulers.
        #[arg(long, value_delimiter = ',', default_value = "pull,weighted,equal")]
        schedulers: Vec<String>,
        /// Seconds of input (the stream ends after that).
        #[arg(long, default_value_t = 120.0)]
        secs: f64,
    },
    /// WAN hop: bulkcast pipe against iperf3 at 0/1/5% loss.
    Wan {
        /// Loss percentages: scenario wan-100m-100ms-loss<L> each.
        #[arg(long, value_delimiter = ',', default_value = "0,1,5")]
        losses: Vec<String>,
        /// Rows: pipe (default settings), pipe with options appended (`-streamsN`: N
        /// connections, `-chunkK`: K KiB chunks, `-cubic`), iperf3-cubic, iperf3-bbr,
        /// iperf3-p8-cubic, iperf3-p8-bbr.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "pipe,pipe-streams1,pipe-streams8,iperf3-cubic,iperf3-bbr,iperf3-p8-cubic,iperf3-p8-bbr"
        )]
        methods: Vec<String>,
        /// Seconds per run: iperf3 -t, and the pipe's size at the link rate. 30 rather than
        /// 15: the lab's forwarder runs seconds ahead or behind its schedule at times, which
        /// moves a 15-second figure by a few percent.
        #[arg(long, default_value_t = 30.0)]
        secs: f64,
    },
}

struct Ctx {
    args: Args,
    out: PathBuf,
    next_port: u16,
    runs: std::fs::File,
    tables: std::fs::File,
}

impl Ctx {
    fn port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p >= 65000 { self.args.port } else { p + 1 };
        p
    }

    fn print(&mut self, s: &str) {
        print!("{s}");
        let _ = std::io::stdout().flush();
        let _ = self.tables.write_all(s.as_bytes());
    }

    fn log(&mut self, v: Value) {
        let _ = writeln!(self.runs, "{v}");
    }

    fn scenario(&self, name: &str) -> Result<(PathBuf, Scenario), Box<dyn std::error::Error>> {
        let path = if name.contains('/') || name.ends_with(".toml") {
            PathBuf::from(name)
        } else {
            self.args.scenarios_dir.join(format!("{name}.toml"))
        };
        let sc = Scenario::load(&path)?;
        Ok((path, sc))
    }

    fn templates(&self) -> (String, String) {
        let (r, s) = match self.args.stand_in.as_deref() {
            Some("nc") => ("nc -l {port}", "nc -N {addr0_ip} {port}"),
            _ => (
                "{bulkcast} pipe recv {listen_args}",
                "{bulkcast} pipe send {addr0} {path_args} {opts} --quiet --json --stats {stats_file} --stats-interval-ms {stats_ms}",
            ),
        };
        (
            self.args.recv_template.clone().unwrap_or(r.into()),
            self.args.send_template.clone().unwrap_or(s.into()),
        )
    }
}

fn render(t: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut s = t.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The last JSON object in `s` (a report printed on one line or pretty-printed, possibly after
/// other output).
fn last_json(s: &str) -> Option<Value> {
    let mut found = None;
    let mut pos = 0;
    while let Some(i) = s[pos..].find('{') {
        let start = pos + i;
        let mut it = serde_json::Deserializer::from_str(&s[start..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) if v.is_object() => {
                found = Some(v);
                pos = start + it.byte_offset();
            }
            _ => pos = start + 1,
        }
    }
    found
}

/// Mean of the present values.
fn mean(v: &[Option<f64>]) -> Option<f64> {
    let x: Vec<f64> = v.iter().flatten().copied().collect();
    (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_the_report() {
        let pretty = "progress\n{\n  \"bytes\": 5,\n  \"conns\": [\n    {\"conn\": 0}\n  ]\n}\n";
        assert_eq!(super::last_json(pretty).unwrap()["bytes"], 5);
        let lines = "{\"a\": 1}\nnoise {\n{\"a\": 2}";
        assert_eq!(super::last_json(lines).unwrap()["a"], 2);
        assert!(super::last_json("none").is_none());
    }
}

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

/// One pipe transfer over `addrs` (the receiver listens on all of them; connection i goes to
/// address i mod P).
struct PipeRun<'a> {
    lab: &'a Lab,
    receiver: &'a str,
    addrs: &'a [Ipv4Addr],
    opts: String,
    bytes: Option<u64>,
    max_s: Option<f64>,
    timeout: Duration,
    restart_clock: bool,
    watch: Vec<usize>,
    tag: String,
}

fn run_pipe(
    ctx: &mut Ctx,
    r: PipeRun,
) -> Result<(StreamOutcome, PathBuf), Box<dyn std::error::Error>> {
    let port = ctx.port();
    let (recv_t, send_t) = ctx.templates();
    let logs = ctx.out.join("logs");
    let stats_file = logs.join(format!("{}.stats.jsonl", r.tag));
    let _ = std::fs::remove_file(&stats_file);
    let mut vars = BTreeMap::new();
    vars.insert("bulkcast", ctx.args.bulkcast.display().to_string());
    vars.insert("port", port.to_string());
    vars.insert(
        "listen_args",
        r.addrs
            .iter()
            .map(|a| format!("--listen {a}:{port}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    vars.insert("addr0", format!("{}:{port}", r.addrs[0]));
    vars.insert("addr0_ip", r.addrs[0].to_string());
    vars.insert(
        "path_args",
        r.addrs[1..]
            .iter()
            .map(|a| format!("--path {a}:{port}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    vars.insert("opts", r.opts.clone());
    vars.insert("stats_file", stats_file.display().to_string());
    vars.insert("stats_ms", ctx.args.stats_ms.to_string());
    let sender = r.lab.source().to_string();
    let spec = StreamSpec {
        sender,
        receiver: r.receiver.to_string(),
        recv_cmd: render(&recv_t, &vars),
        send_cmd: render(&send_t, &vars),
        feed_bytes: r.bytes,
        feed_max_s: r.max_s,
        sink: true,
        seed: 42,
        port,
        timeout: r.timeout,
        restart_clock: r.restart_clock,
        watch_links: r.watch,
        log_prefix: logs.join(&r.tag),
    };
    eprintln!("streams-bench: {}: {}", r.tag, spec.send_cmd);
    let o = run_stream(r.lab, &spec)?;
    Ok((o, stats_file))
}

/// Why a pipe run does not count, if it does not.
fn pipe_problem(o: &StreamOutcome, expect: Option<u64>) -> Option<String> {
    let s = o.sink.as_ref()?;
    if o.timed_out {
        return Some(format!("timed out after {} bytes", s.bytes));
    }
    if !s.verified {
        return Some("received bytes differ from the sent stream".into());
    }
    if let Some(e) = expect {
        if s.bytes != e {
            return Some(format!("received {} of {} bytes", s.bytes, e));
        }
    } else if s.bytes != o.fed_bytes {
        return Some(format!("received {} of {} bytes", s.bytes, o.fed_bytes));
    }
    if o.send_code != Some(0) {
        return Some(format!(
            "sender exited {:?}: {}",
            o.send_code,
            o.send_stderr.lines().last().unwrap_or("")
        ));
    }
    if o.recv_code != Some(0) {
        return Some(format!(
            "receiver exited {:?}: {}",
            o.recv_code,
            o.recv_stderr.lines().last().unwrap_or("")
        ));
    }
    None
}

fn conditions(o: &StreamOutcome) -> String {
    let mut n = Vec::new();
    if o.tx_dropped > 0 {
        n.push(format!("INVALID: {} TUN drops", o.tx_dropped));
    }
    if o.late_events > 0 {
        n.push(format!("{} late fwd events", o.late_events));
    }
    if o.build_running {
        n.push("build running".into());
    }
    n.join(", ")
}

fn outcome_json(o: &StreamOutcome) -> Value {
    json!({
        "send_code": o.send_code, "recv_code": o.recv_code, "send_s": o.send_s,
        "recv_s": o.recv_s, "timed_out": o.timed_out, "fed_bytes": o.fed_bytes,
        "fed_s": o.fed_s,
        "received_bytes": o.sink.as_ref().map(|s| s.bytes),
        "first_byte_s": o.sink.as_ref().and_then(|s| s.first_s),
        "last_byte_s": o.sink.as_ref().and_then(|s| s.last_s),
        "verified": o.sink.as_ref().map(|s| s.verified),
        "e2e_mbps": o.e2e_mbps(),
        "tx_dropped": o.tx_dropped, "late_events": o.late_events,
        "forwarder_cpu": o.forwarder_cpu, "build_running": o.build_running, "load1": o.load1,
        "send_stderr": o.send_stderr, "recv_stderr": o.recv_stderr,
        "sender_report": last_json(&o.send_stdout),
    })
}

/// Per-link mean carried IP rate (Mbit/s) over the whole run.
fn carried_mean(o: &StreamOutcome) -> Vec<f64> {
    match (o.links.first(), o.links.last()) {
        (Some(a), Some(b)) if b.t_s > a.t_s => a
            .bytes_out
            .iter()
            .zip(&b.bytes_out)
            .map(|(x, y)| (y - x) as f64 * 8.0 / (b.t_s - a.t_s) / 1e6)
            .collect(),
        _ => Vec::new(),
    }
}

/// The receiver of a channel scenario, its channel addresses, the routes to them and their
/// bottleneck links.
struct Channels {
    receiver: String,
    addrs: Vec<Ipv4Addr>,
    routes: Vec<Vec<usize>>,
    watch: Vec<usize>,
}

fn channel_setup(lab: &Lab) -> Result<Channels, Box<dyn std::error::Error>> {
    let src = lab.source().to_string();
    let receiver = lab
        .host_names()
        .into_iter()
        .find(|h| *h != src)
        .ok_or("the scenario has no receiver")?;
    let addrs: Vec<Ipv4Addr> = lab
        .channel_addrs(&receiver)?
        .into_iter()
        .map(|(own, _)| own)
        .collect();
    if addrs.is_empty() {
        return Err(format!("{} has no channels", lab.name()).into());
    }
    let routes = routes(lab.layout(), &src, &addrs)?;
    let watch = bottlenecks(lab.layout(), &routes);
    Ok(Channels {
        receiver,
        addrs,
        routes,
        watch,
    })
}

fn run_static(
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
        let mut line = format!("{:>6}", "mean");
        let mut mins = format!("{:>6}", "min");
        for c in &cols {
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
        ctx.print(&format!("{line}\n{mins}\n"));
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

/// Per second: the sender's `--stats` lines (total and per-connection Mbit/s and weights).
#[derive(Default, Clone)]
struct StatsSecond {
    total_mbps: f64,
    conns: Vec<(f64, Option<f64>)>,
}

fn read_stats(path: &Path, interval_s: f64) -> BTreeMap<usize, StatsSecond> {
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

fn run_dynamic(
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

fn run_wan(
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
fn window_mbps_from(bins: &[u64], from_s: f64, secs: f64) -> Option<f64> {
    let first = (from_s / BIN_S).ceil() as usize;
    let n = (secs / BIN_S).round() as usize;
    let bytes: u64 = bins.get(first..first + n)?.iter().sum();
    Some(bytes as f64 * 8.0 / (n as f64 * BIN_S) / 1e6)
}

fn main() {
    let a = Args::parse();
    let out = a.out.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("target/streams-bench/{t}"))
    });
    let r = (|| -> Result<(), Box<dyn std::error::Error>> {
        std::fs::create_dir_all(out.join("logs"))?;
        let out = std::fs::canonicalize(&out)?;
        let open = |f: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out.join(f))
        };
        let mut ctx = Ctx {
            next_port: a.port,
            runs: open("runs.jsonl")?,
            tables: open("tables.txt")?,
            out: out.clone(),
            args: a,
        };
        if ctx.args.stand_in.is_none() && ctx.args.recv_template.is_none() {
            let b = &ctx.args.bulkcast;
            let ok = std::process::Command::new(b)
                .args(["pipe", "--help"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                return Err(format!(
                    "{} has no `pipe` subcommand (yet): build the multi-stream CLI, or test the \
                     harness with --stand-in nc",
                    b.display()
                )
                .into());
            }
            ctx.args.bulkcast = std::fs::canonicalize(b)?;
        }
        eprintln!("streams-bench: results in {}", out.display());
        match std::mem::replace(
            &mut ctx.args.cmd,
            Cmd::Wan {
                losses: vec![],
                methods: vec![],
                secs: 0.0,
            },
        ) {
            Cmd::Static {
                scenarios,
                counts,
                schedulers,
                secs,
                repeat,
            } => run_static(
                &mut ctx,
                &scenarios,
                counts.as_deref(),
                &schedulers,
                secs,
                repeat.max(1),
            ),
            Cmd::Dynamic {
                scenarios,
                streams,
                schedulers,
                secs,
            } => run_dynamic(&mut ctx, &scenarios, &streams, &schedulers, secs),
            Cmd::Wan {
                losses,
                methods,
                secs,
            } => run_wan(&mut ctx, &losses, &methods, secs),
        }
    })();
    if let Err(e) = r {
        eprintln!("streams-bench: {e}");
        std::process::exit(2);
    }
}
