//! Point-to-point stream benchmarks on a running lab (issue 5: multi-stream edges).
//!
//! [`run_stream`] runs one receiver command and one sender command in two hosts, feeds the
//! sender's stdin with a seeded pseudo-random stream ([`Pattern`]) and reads the receiver's
//! stdout back, checking every byte and timestamping it in 100 ms bins. Meanwhile it samples the
//! forwarder's counters of the links the transfer crosses. The rest of the module is pure
//! analysis of such runs: the nominal capacity of a set of links at a given second of the
//! scenario clock ([`rate_at`], [`capacity_at`]), windowed rates, and re-convergence after a
//! step change ([`reconvergence`]). `crates/lab/examples/streams_bench/` (run by
//! `bench/streams-run`) builds the issue's tables from these pieces.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

use crate::lab::Lab;
use crate::scenario::Layout;
use crate::LabError;

/// Width of the receiver's time bins in seconds.
pub const BIN_S: f64 = 0.1;

/// A seeded pseudo-random byte stream, the same for the writer and the checker: block `i`
/// (1 MiB) comes from a generator seeded with `seed + i`.
pub struct Pattern {
    seed: u64,
    block: u64,
    buf: Vec<u8>,
    pos: usize,
}

const BLOCK: usize = 1 << 20;

impl Pattern {
    /// The stream of `seed` from its first byte.
    pub fn new(seed: u64) -> Self {
        let mut p = Pattern {
            seed,
            block: 0,
            buf: vec![0; BLOCK],
            pos: 0,
        };
        p.refill();
        p
    }

    fn refill(&mut self) {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(self.seed.wrapping_add(self.block));
        rng.fill_bytes(&mut self.buf);
        self.block += 1;
        self.pos = 0;
    }

    /// Fills `out` with the next bytes of the stream.
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            if self.pos == BLOCK {
                self.refill();
            }
            let n = (out.len() - done).min(BLOCK - self.pos);
            out[done..done + n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            self.pos += n;
            done += n;
        }
    }

    /// Compares `data` with the next bytes of the stream (and moves past them).
    pub fn matches(&mut self, data: &[u8]) -> bool {
        let mut done = 0;
        let mut ok = true;
        while done < data.len() {
            if self.pos == BLOCK {
                self.refill();
            }
            let n = (data.len() - done).min(BLOCK - self.pos);
            ok &= data[done..done + n] == self.buf[self.pos..self.pos + n];
            self.pos += n;
            done += n;
        }
        ok
    }
}

/// Nominal rate of link `link` in bit/s at second `t_s` of the scenario clock: its configured
/// rate, then every `[[change]]` due by then, then its `[[alternate]]` cycle (the forwarder's
/// order). `None`: unlimited. Random `[fluctuation]` is not modelled (the nominal rate is
/// returned).
pub fn rate_at(layout: &Layout, link: usize, t_s: f64) -> Option<f64> {
    let t_ns = (t_s.max(0.0) * 1e9) as u64;
    let mut r = layout.links[link].rate_bps;
    for e in &layout.events {
        if e.link == link && e.at_ns <= t_ns {
            if let Some(x) = e.rate_bps {
                r = Some(x);
            }
        }
    }
    for a in &layout.alternates {
        if a.link == link {
            let k = t_ns / a.every_ns;
            r = Some(a.rates_bps[(k % a.rates_bps.len() as u64) as usize]);
        }
    }
    r
}

/// Nominal capacity in bit/s of a set of routes (each a list of links, as [`Layout::route`]
/// gives) at second `t_s`: each route is limited by its slowest link, and distinct routes add
/// up (a link shared by several routes is counted once: routes that share a link are limited
/// together by it). `None` when some route is unlimited.
pub fn capacity_at(layout: &Layout, routes: &[Vec<usize>], t_s: f64) -> Option<f64> {
    // Group routes by their bottleneck link, so that routes through the same link (several
    // connections on one channel) count once.
    let mut by_bottleneck: HashMap<usize, f64> = HashMap::new();
    for r in routes {
        let mut best: Option<(usize, f64)> = None;
        for &l in r {
            if let Some(rate) = rate_at(layout, l, t_s) {
                if best.is_none_or(|(_, b)| rate < b) {
                    best = Some((l, rate));
                }
            }
        }
        let (l, rate) = best?;
        by_bottleneck.insert(l, rate);
    }
    Some(by_bottleneck.values().sum())
}

/// The times in `(0, t_end)` at which the capacity of `routes` changes, with the new capacity
/// (bit/s), probing the schedule every 10 ms.
pub fn capacity_steps(layout: &Layout, routes: &[Vec<usize>], t_end: f64) -> Vec<(f64, f64)> {
    let mut steps = Vec::new();
    let mut prev = capacity_at(layout, routes, 0.0);
    let mut i = 1u64;
    loop {
        let t = i as f64 * 0.01;
        if t >= t_end {
            break;
        }
        let c = capacity_at(layout, routes, t);
        if c != prev {
            if let Some(c) = c {
                steps.push(((t * 100.0).round() / 100.0, c));
            }
            prev = c;
        }
        i += 1;
    }
    steps
}

/// Rates in Mbit/s over sliding windows of `window` bins, one per start bin (the last windows,
/// which would run past the end, are left out).
pub fn window_mbps(bins: &[u64], bin_s: f64, window: usize) -> Vec<f64> {
    if window == 0 || bins.len() < window {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(bins.len() - window + 1);
    let mut sum: u64 = bins[..window].iter().sum();
    out.push(sum as f64 * 8.0 / (window as f64 * bin_s) / 1e6);
    for i in window..bins.len() {
        sum = sum + bins[i] - bins[i - window];
        out.push(sum as f64 * 8.0 / (window as f64 * bin_s) / 1e6);
    }
    out
}

/// When a rate counts as settled at a new capacity (see [`reconvergence`]).
#[derive(Debug, Clone, Copy)]
pub struct SettleRule {
    /// Length of the windows the rate is measured over, in seconds.
    pub window_s: f64,
    /// Largest relative distance from the capacity.
    pub tol: f64,
    /// For how long (window starts) the rate must stay within `tol`, in seconds.
    pub hold_s: f64,
}

/// Re-convergence after a step of the capacity to `new_mbps` at `step_s`: the smallest delay
/// `d >= 0` (a multiple of the bin width) such that the rate over every window of
/// `rule.window_s` starting between `step_s + d` and `step_s + d + rule.hold_s` is within
/// `rule.tol` (relative) of `new_mbps`. Only windows that end by `until_s` (the next step, or
/// the end of the data) count; `None` when no such `d` exists (the rate never settled near the
/// new capacity before the next step).
pub fn reconvergence(
    bins: &[u64],
    bin_s: f64,
    step_s: f64,
    until_s: f64,
    new_mbps: f64,
    rule: &SettleRule,
) -> Option<f64> {
    let win = ((rule.window_s / bin_s).round() as usize).max(1);
    let w = window_mbps(bins, bin_s, win);
    let first = (step_s / bin_s).round() as usize;
    // Window starting at bin i ends at i + win.
    let last_start = ((until_s / bin_s).round() as usize).checked_sub(win)?;
    let last_start = last_start.min(w.len().checked_sub(1)?);
    let hold = (rule.hold_s / bin_s).round() as usize;
    let ok = |i: usize| (w[i] - new_mbps).abs() <= rule.tol * new_mbps;
    (first..=last_start)
        .find(|&d| (d..=(d + hold).min(last_start)).all(ok))
        .map(|d| (d - first) as f64 * bin_s)
}

/// The IP bytes that left the watched links (all of them together) per bin of `bin_s` seconds
/// since the sender started, interpolated from the samples.
pub fn carried_bins(samples: &[LinkSample], bin_s: f64) -> Vec<u64> {
    let Some(last) = samples.last() else {
        return Vec::new();
    };
    let total = |s: &LinkSample| s.bytes_out.iter().sum::<u64>() as f64;
    let at = |t: f64| -> f64 {
        let i = samples.partition_point(|s| s.t_s <= t);
        if i == 0 {
            return total(&samples[0]);
        }
        if i == samples.len() {
            return total(&samples[i - 1]);
        }
        let (a, b) = (&samples[i - 1], &samples[i]);
        let f = (t - a.t_s) / (b.t_s - a.t_s).max(1e-9);
        total(a) + f * (total(b) - total(a))
    };
    let n = (last.t_s / bin_s).floor() as usize;
    (0..n)
        .map(|k| (at((k + 1) as f64 * bin_s) - at(k as f64 * bin_s)).max(0.0) as u64)
        .collect()
}

/// What to run for one transfer.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Host that sends.
    pub sender: String,
    /// Host that receives.
    pub receiver: String,
    /// Shell command run in the receiver (prefixed with `exec`); its stdout is the data.
    pub recv_cmd: String,
    /// Shell command run in the sender (prefixed with `exec`).
    pub send_cmd: String,
    /// Feed the sender's stdin with the pattern: at most this many bytes ...
    pub feed_bytes: Option<u64>,
    /// ... and stop feeding after this many seconds (end of input).
    pub feed_max_s: Option<f64>,
    /// Read the receiver's stdout and check it against the pattern.
    pub sink: bool,
    /// Seed of the pattern.
    pub seed: u64,
    /// Port the receiver listens on (the run waits until it does).
    pub port: u16,
    /// Kill both sides after this long.
    pub timeout: Duration,
    /// Restart the scenario clock when the sender starts (time-varying conditions).
    pub restart_clock: bool,
    /// Links whose forwarder counters are sampled (bytes out, current rate).
    pub watch_links: Vec<usize>,
    /// Where the two commands' stderr goes (`<prefix>.send.err`, `<prefix>.recv.err`).
    pub log_prefix: PathBuf,
}

/// One sample of the watched links.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkSample {
    /// Seconds since the sender started.
    pub t_s: f64,
    /// Per watched link: IP bytes that left it so far.
    pub bytes_out: Vec<u64>,
    /// Per watched link: its current rate in bit/s (0: unlimited).
    pub rate_bps: Vec<f64>,
}

/// What the receiver's stdout carried.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SinkReport {
    /// Bytes received.
    pub bytes: u64,
    /// Seconds since the sender started at the first and the last byte.
    pub first_s: Option<f64>,
    /// See `first_s`.
    pub last_s: Option<f64>,
    /// Every byte matched the pattern.
    pub verified: bool,
    /// Bytes per [`BIN_S`] bin since the sender started.
    pub bins: Vec<u64>,
}

/// The outcome of [`run_stream`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StreamOutcome {
    /// Exit code of the sender (None: killed or not finished).
    pub send_code: Option<i32>,
    /// Exit code of the receiver.
    pub recv_code: Option<i32>,
    /// Seconds until the sender exited.
    pub send_s: Option<f64>,
    /// Seconds until the receiver exited.
    pub recv_s: Option<f64>,
    /// The run hit its timeout and both sides were killed.
    pub timed_out: bool,
    /// The sender's stdout (a JSON report, for instance).
    pub send_stdout: String,
    /// Last lines of the sender's and the receiver's stderr.
    pub send_stderr: String,
    /// See `send_stderr`.
    pub recv_stderr: String,
    /// Bytes written into the sender's stdin.
    pub fed_bytes: u64,
    /// Seconds until feeding ended (end of input).
    pub fed_s: Option<f64>,
    /// The receiver's stdout, when read.
    pub sink: Option<SinkReport>,
    /// Forwarder counters of the watched links, every 100 ms.
    pub links: Vec<LinkSample>,
    /// TUN drops during the run (non-zero: the lab was overloaded, the run is invalid).
    pub tx_dropped: u64,
    /// Forwarder events handled more than 1 ms late during the run.
    pub late_events: u64,
    /// Forwarder CPU during the run, as a fraction of one core.
    pub forwarder_cpu: Option<f64>,
    /// A compiler (rustc) was running at some sample during the run.
    pub build_running: bool,
    /// Load average (1 min) at the end of the run.
    pub load1: Option<f64>,
}

impl StreamOutcome {
    /// Receiver-side rate in Mbit/s: bytes received over the time from the sender's start to
    /// the last byte (connection set-up and start-up included).
    pub fn e2e_mbps(&self) -> Option<f64> {
        let s = self.sink.as_ref()?;
        Some(s.bytes as f64 * 8.0 / s.last_s? / 1e6)
    }
}

/// Pins the calling thread off the forwarder's CPU, as [`Lab::command`] does for processes in
/// the hosts (unless `BCLAB_SHARE_CPU` is set).
pub fn pin_off_forwarder() {
    if std::env::var_os("BCLAB_SHARE_CPU").is_some() {
        return;
    }
    let Some(cpu) = crate::forwarder::forwarder_cpu() else {
        return;
    };
    // Best effort, as for the hosts' processes: unpinned, the thread still works.
    let _ = rustix::thread::sched_setaffinity(None, &crate::forwarder::cpus_except(cpu));
}

/// Is a compiler running on this machine (it competes with the lab for the CPUs)?
pub fn build_running() -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.filter_map(|e| e.ok()).any(|e| {
        std::fs::read_to_string(e.path().join("comm"))
            .map(|c| matches!(c.trim(), "rustc" | "cc1" | "cc1plus" | "ld" | "lld"))
            .unwrap_or(false)
    })
}

/// The 1-minute load average.
pub fn load1() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits until something listens on TCP `port` in `host` (at most `limit`).
pub fn wait_listening(lab: &Lab, host: &str, port: u16, limit: Duration) -> bool {
    let t = Instant::now();
    let pat = format!(":{port} ");
    while t.elapsed() < limit {
        if let Ok(o) = lab.exec(host, &["ss", "-Htln"]) {
            if String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.contains(&pat))
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn tail(path: &Path, lines: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = s.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Runs one transfer on a running lab (see [`StreamSpec`]). Processes left in the two hosts
/// are killed at the end.
pub fn run_stream(lab: &Lab, spec: &StreamSpec) -> Result<StreamOutcome, LabError> {
    let (recv_err_path, recv_err) = err_file(spec, "recv")?;
    let (send_err_path, send_err) = err_file(spec, "send")?;
    let mut recv = start_receiver(lab, spec, recv_err, &recv_err_path)?;
    let drops0: u64 = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    let (cpu0, late0) = (lab.forwarder_cpu_s(), lab.stats().late_events);
    let mut sc = lab.command(&spec.sender, "sh")?;
    sc.args(["-c", &format!("exec {}", spec.send_cmd)])
        .stdin(if spec.feed_bytes.is_some() || spec.feed_max_s.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(send_err);
    if spec.restart_clock {
        lab.start_clock();
    }
    let t0 = Instant::now();
    let mut send = sc
        .spawn()
        .map_err(|e| LabError::sys(format!("start {:?}", spec.send_cmd), e))?;

    // Three threads move the data, so that the loop below only watches: the feeder writes the
    // pattern into the sender, the sink checks the receiver's output, a reader keeps the
    // sender's stdout (its report) from filling its pipe.
    let feeder = send.stdin.take().map(|stdin| {
        let (limit, max_s, seed) = (spec.feed_bytes, spec.feed_max_s, spec.seed);
        std::thread::spawn(move || feed(stdin, seed, limit, max_s, t0))
    });
    let sink = recv.stdout.take().map(|out| {
        let seed = spec.seed;
        std::thread::spawn(move || check_sink(out, seed, t0))
    });
    let stdout_reader = send.stdout.take().map(|mut o| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = o.read_to_string(&mut s);
            s
        })
    });

    let mut out = watch(lab, spec, t0, &mut send, &mut recv);
    let run_s = t0.elapsed().as_secs_f64();
    out.forwarder_cpu = match (cpu0, lab.forwarder_cpu_s()) {
        (Some(a), Some(b)) => Some((b - a) / run_s),
        _ => None,
    };
    if let Some(f) = feeder {
        let (sent, s) = f.join().unwrap_or((0, 0.0));
        out.fed_bytes = sent;
        out.fed_s = Some(s);
    }
    out.sink = sink.map(|s| s.join().unwrap_or_default());
    out.send_stdout = stdout_reader
        .map(|r| r.join().unwrap_or_default())
        .unwrap_or_default();
    lab.kill_processes();
    // Counters are published every 200 ms: wait for the last ones.
    std::thread::sleep(Duration::from_millis(250));
    out.late_events = lab.stats().late_events - late0;
    let drops1: u64 = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    out.tx_dropped = drops1 - drops0;
    out.send_stderr = tail(&send_err_path, 5);
    out.recv_stderr = tail(&recv_err_path, 5);
    out.build_running |= build_running();
    out.load1 = load1();
    Ok(out)
}

/// The file one side's stderr goes to, `<log_prefix>.<side>.err`.
fn err_file(spec: &StreamSpec, side: &str) -> Result<(PathBuf, File), LabError> {
    let p = PathBuf::from(format!("{}.{side}.err", spec.log_prefix.display()));
    let f = File::create(&p).map_err(|e| LabError::sys(format!("create {}", p.display()), e))?;
    Ok((p, f))
}

/// Starts the receiver and waits until it listens, so the sender never meets a closed port.
fn start_receiver(
    lab: &Lab,
    spec: &StreamSpec,
    err: File,
    err_path: &Path,
) -> Result<Child, LabError> {
    let mut rc = lab.command(&spec.receiver, "sh")?;
    rc.args(["-c", &format!("exec {}", spec.recv_cmd)])
        .stdin(Stdio::null())
        .stdout(if spec.sink {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(err);
    let mut recv = rc
        .spawn()
        .map_err(|e| LabError::sys(format!("start {:?}", spec.recv_cmd), e))?;
    if !wait_listening(lab, &spec.receiver, spec.port, Duration::from_secs(10)) {
        let _ = recv.kill();
        let _ = recv.wait();
        return Err(LabError::Measure(format!(
            "the receiver does not listen on port {} ({:?}): {}",
            spec.port,
            spec.recv_cmd,
            tail(err_path, 5)
        )));
    }
    Ok(recv)
}

/// The feeder: the pattern into the sender's stdin until `limit` bytes or `max_s` seconds;
/// closing stdin then ends the sender's input. Returns the bytes written and when it stopped.
fn feed(
    mut stdin: ChildStdin,
    seed: u64,
    limit: Option<u64>,
    max_s: Option<f64>,
    t0: Instant,
) -> (u64, f64) {
    pin_off_forwarder();
    let mut p = Pattern::new(seed);
    let mut buf = vec![0u8; 256 << 10];
    let mut sent = 0u64;
    loop {
        let n = limit.map_or(buf.len() as u64, |l| (l - sent).min(buf.len() as u64));
        if n == 0 || max_s.is_some_and(|m| t0.elapsed().as_secs_f64() >= m) {
            break;
        }
        p.fill(&mut buf[..n as usize]);
        if stdin.write_all(&buf[..n as usize]).is_err() {
            break;
        }
        sent += n;
    }
    drop(stdin);
    (sent, t0.elapsed().as_secs_f64())
}

/// The sink: the receiver's stdout, checked against the pattern and counted in [`BIN_S`] bins.
fn check_sink(mut out: ChildStdout, seed: u64, t0: Instant) -> SinkReport {
    pin_off_forwarder();
    let mut p = Pattern::new(seed);
    let mut buf = vec![0u8; 256 << 10];
    let mut r = SinkReport {
        verified: true,
        ..Default::default()
    };
    loop {
        let n = match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let t = t0.elapsed().as_secs_f64();
        r.first_s.get_or_insert(t);
        r.last_s = Some(t);
        r.bytes += n as u64;
        if r.verified && !p.matches(&buf[..n]) {
            r.verified = false;
        }
        let bin = (t / BIN_S) as usize;
        if r.bins.len() <= bin {
            r.bins.resize(bin + 1, 0);
        }
        r.bins[bin] += n as u64;
    }
    r
}

/// Polls both sides every 20 ms until both exit, the timeout, or a failed receiver the sender
/// outlives by 5 s; samples the watched links every 100 ms meanwhile.
fn watch(
    lab: &Lab,
    spec: &StreamSpec,
    t0: Instant,
    send: &mut Child,
    recv: &mut Child,
) -> StreamOutcome {
    let mut out = StreamOutcome::default();
    let mut last_sample = None::<Instant>;
    let mut children: [(&mut Child, bool); 2] = [(send, true), (recv, true)];
    loop {
        for (i, (c, running)) in children.iter_mut().enumerate() {
            if *running {
                if let Ok(Some(st)) = c.try_wait() {
                    *running = false;
                    let t = Some(t0.elapsed().as_secs_f64());
                    if i == 0 {
                        out.send_code = Some(code(st));
                        out.send_s = t;
                    } else {
                        out.recv_code = Some(code(st));
                        out.recv_s = t;
                    }
                }
            }
        }
        if last_sample.is_none_or(|s| s.elapsed() >= Duration::from_millis(100)) {
            last_sample = Some(Instant::now());
            out.links.push(sample_links(lab, &spec.watch_links, t0));
            // Checked once a second: a compiler on the machine explains a slow run.
            if out.links.len() % 10 == 1 && !out.build_running {
                out.build_running = build_running();
            }
        }
        if children.iter().all(|(_, r)| !r) {
            break;
        }
        // A receiver that fails while the sender waits: give the sender a few seconds.
        let recv_failed = out.recv_code.is_some_and(|c| c != 0)
            && out
                .recv_s
                .is_some_and(|s| t0.elapsed().as_secs_f64() > s + 5.0);
        if t0.elapsed() >= spec.timeout || recv_failed {
            out.timed_out = !recv_failed;
            for (c, running) in children.iter_mut() {
                if *running {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    out
}

/// The forwarder's current counters of `links`.
fn sample_links(lab: &Lab, links: &[usize], t0: Instant) -> LinkSample {
    let st = lab.stats();
    LinkSample {
        t_s: t0.elapsed().as_secs_f64(),
        bytes_out: links
            .iter()
            .map(|&l| st.links.get(l).map_or(0, |s| s.bytes_out))
            .collect(),
        rate_bps: links
            .iter()
            .map(|&l| st.links.get(l).map_or(0.0, |s| s.rate_bps))
            .collect(),
    }
}

/// The links from `sender` to each address in `addrs` (its routes; see [`Layout::route`]).
pub fn routes(
    layout: &Layout,
    sender: &str,
    addrs: &[Ipv4Addr],
) -> Result<Vec<Vec<usize>>, LabError> {
    let s = layout
        .host(sender)
        .ok_or_else(|| LabError::UnknownHost(sender.into()))?;
    addrs
        .iter()
        .map(|a| {
            layout
                .route(s, *a)
                .ok_or_else(|| LabError::Measure(format!("no emulated route from {sender} to {a}")))
        })
        .collect()
}

/// Each route's bottleneck link (the slowest at its nominal rate), in route order.
pub fn bottlenecks(layout: &Layout, routes: &[Vec<usize>]) -> Vec<usize> {
    routes
        .iter()
        .filter_map(|r| {
            r.iter()
                .copied()
                .filter(|&l| layout.links[l].rate_bps.is_some())
                .min_by(|&a, &b| {
                    layout.links[a]
                        .rate_bps
                        .partial_cmp(&layout.links[b].rate_bps)
                        .unwrap_or(std::cmp::Ordering::Equal)
                })
        })
        .collect()
}

/// Per second `k` (from 0): the IP rate in Mbit/s that left each watched link during
/// `[k, k+1)`, from the samples (interpolated between the samples around each boundary).
pub fn carried_mbps_per_s(samples: &[LinkSample]) -> Vec<Vec<f64>> {
    let Some(last) = samples.last() else {
        return Vec::new();
    };
    let n_links = last.bytes_out.len();
    let at = |t: f64, l: usize| -> f64 {
        // Linear interpolation of the cumulative counter at time t.
        let i = samples.partition_point(|s| s.t_s <= t);
        if i == 0 {
            return samples[0].bytes_out[l] as f64;
        }
        if i == samples.len() {
            return samples[i - 1].bytes_out[l] as f64;
        }
        let (a, b) = (&samples[i - 1], &samples[i]);
        let f = (t - a.t_s) / (b.t_s - a.t_s).max(1e-9);
        a.bytes_out[l] as f64 + f * (b.bytes_out[l] as f64 - a.bytes_out[l] as f64)
    };
    (0..last.t_s.floor() as usize)
        .map(|k| {
            (0..n_links)
                .map(|l| (at(k as f64 + 1.0, l) - at(k as f64, l)) * 8.0 / 1e6)
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;

    #[test]
    fn pattern_checks_across_any_boundaries() {
        let mut w = Pattern::new(7);
        let mut data = vec![0u8; 3 * BLOCK + 12345];
        w.fill(&mut data[..1000]);
        w.fill(&mut data[1000..]);
        let mut r = Pattern::new(7);
        for chunk in data.chunks(77_777) {
            assert!(r.matches(chunk));
        }
        let mut r = Pattern::new(7);
        data[BLOCK + 5] ^= 1;
        assert!(!data.chunks(4096).all(|c| r.matches(c)));
        assert_ne!(Pattern::new(8).buf[..64], Pattern::new(7).buf[..64]);
    }

    const DYN: &str = r#"
        name = "dyn"
        [[site]]
        name = "l"
        [[site.host]]
        name = "s"
        [[site]]
        name = "r"
        [[site.host]]
        name = "d"
        [[path]]
        from = "l"
        to = "r"
        rate_mbps = 100
        rtt_ms = 1
        [[channel]]
        name = "c10"
        from = "s"
        to = "d"
        rate_mbps = 10
        [[channel]]
        name = "cx"
        from = "s"
        to = "d"
        rate_mbps = 20
        [[alternate]]
        channel = "cx"
        every_s = 20
        rates_mbps = [20, 30]
        [[change]]
        at_s = 50
        channel = "c10"
        rate_mbps = 5
    "#;

    #[test]
    fn capacity_follows_the_schedule() {
        let layout = Scenario::parse(DYN).unwrap().resolve().unwrap();
        let d = layout.host("d").unwrap();
        let addrs: Vec<Ipv4Addr> = layout
            .channels
            .iter()
            .map(|c| if c.b == d { c.b_addr } else { c.a_addr })
            .collect();
        // Two connections on each channel: each channel counts once.
        let all: Vec<Ipv4Addr> = addrs.iter().chain(addrs.iter()).copied().collect();
        let r = routes(&layout, "s", &all).unwrap();
        let mbps = |t: f64| capacity_at(&layout, &r, t).unwrap() / 1e6;
        assert_eq!(mbps(0.0), 30.0);
        assert_eq!(mbps(19.9), 30.0);
        assert_eq!(mbps(20.0), 40.0);
        assert_eq!(mbps(45.0), 30.0);
        assert_eq!(mbps(55.0), 25.0);
        assert_eq!(mbps(61.0), 35.0);
        let steps = capacity_steps(&layout, &r, 70.0);
        assert_eq!(
            steps,
            vec![(20.0, 40e6), (40.0, 30e6), (50.0, 25e6), (60.0, 35e6)]
        );
        let b = bottlenecks(&layout, &r);
        assert_eq!(b[0], layout.channels[0].a_to_b);
        assert_eq!(b[1], layout.channels[1].a_to_b);
        // The main path: 100 Mbit/s.
        let main = routes(&layout, "s", &[layout.hosts[d].addr]).unwrap();
        assert_eq!(capacity_at(&layout, &main, 3.0), Some(100e6));
    }

    #[test]
    fn windows_and_reconvergence() {
        // 10 bins per second: 3 s at 30 Mbit/s, then a step to 40 at 3 s reached after 1.5 s.
        let per_bin = |mbps: f64| (mbps * 1e6 / 8.0 * BIN_S) as u64;
        let mut bins = vec![per_bin(30.0); 30];
        bins.extend(vec![per_bin(30.0); 15]);
        bins.extend(vec![per_bin(40.0); 45]);
        let w = window_mbps(&bins, BIN_S, 10);
        assert_eq!(w.len(), bins.len() - 9);
        assert!((w[0] - 30.0).abs() < 0.01);
        // Within 10% of 40 (36..44): a window starting at bin 41 holds 4 bins of 30 and 6 of 40
        // = 36 Mbit/s; so d = 41 - 30 = 1.1 s.
        let rule = SettleRule {
            window_s: 1.0,
            tol: 0.1,
            hold_s: 2.0,
        };
        let d = reconvergence(&bins, BIN_S, 3.0, 9.0, 40.0, &rule).unwrap();
        assert!((d - 1.1).abs() < 1e-9, "{d}");
        // Never reaching 60: None.
        assert_eq!(reconvergence(&bins, BIN_S, 3.0, 9.0, 60.0, &rule), None);
        // Already there: 0.
        assert_eq!(
            reconvergence(
                &bins,
                BIN_S,
                0.0,
                3.0,
                30.0,
                &SettleRule {
                    hold_s: 1.0,
                    ..rule
                }
            ),
            Some(0.0)
        );
    }

    #[test]
    fn carried_rate_per_second() {
        let s = |t: f64, b: u64| LinkSample {
            t_s: t,
            bytes_out: vec![b],
            rate_bps: vec![0.0],
        };
        // 1.25 MB per second = 10 Mbit/s.
        let samples: Vec<LinkSample> = (0..=30)
            .map(|i| s(i as f64 * 0.1, i as u64 * 125_000))
            .collect();
        let v = carried_mbps_per_s(&samples);
        assert_eq!(v.len(), 3);
        for x in v {
            assert!((x[0] - 10.0).abs() < 1e-6);
        }
        let b = carried_bins(&samples, BIN_S);
        assert_eq!(b.len(), 30);
        assert!(b.iter().all(|&x| x.abs_diff(125_000) <= 1), "{b:?}");
        // A 3 s window over alternating bins smooths them.
        let bursty: Vec<u64> = (0..60).map(|i| if i % 10 < 5 { 2 } else { 0 }).collect();
        let rule = SettleRule {
            window_s: 1.0,
            tol: 0.1,
            hold_s: 2.0,
        };
        let mbps = 10.0 * 8.0 / 1e6; // 1 byte per bin on average
        assert_eq!(
            reconvergence(&bursty, BIN_S, 0.0, 6.0, mbps, &rule),
            Some(0.0)
        );
    }
}
