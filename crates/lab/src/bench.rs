//! The lab runner of `bench/`: runs distribution methods on one scenario and reports, for each,
//! the time until the last receiver finished and the per-receiver rate against the ideal.
//!
//! A method is a set of shell command templates run inside the hosts (see
//! `bench/lab-methods.toml`); adding a bulkcast strategy means adding a `[[method]]` entry.
//!
//! Template variables: `{object}` (path of the object), `{object_dir}`, `{object_name}`,
//! `{size}` (bytes), `{hosts_file}`, `{hosts_list}` (the receivers' agents as `IP:PORT,...`,
//! what a user types without a hosts file), `{port}`, `{src_ip}`, `{first_ip}` (first receiver),
//! `{ip}` (this host), `{next_ip}` (the next receiver in scenario order; for the source: the
//! first receiver), `{out}` (where this receiver must write its copy), `{host}`, `{index}`
//! (receiver number from 1), `{cc}` (congestion control), `{raw}` (a directory of this method's
//! own, kept after the run: a template may write reports there, e.g. `--json > {raw}/source.json`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::lab::Lab;
use crate::scenario::Layout;
use crate::LabError;

/// A file of methods.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodsFile {
    /// The methods, by name.
    #[serde(rename = "method")]
    pub methods: Vec<Method>,
}

/// Which side starts first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// Receivers listen first, then the source starts (chains, push).
    ReceiversFirst,
    /// The source serves first, then receivers fetch (HTTP).
    SourceFirst,
}

/// One distribution method as command templates.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Method {
    /// Name used on the command line and in the table.
    pub name: String,
    /// One line on what it is.
    #[serde(default)]
    pub description: String,
    /// Start order.
    pub order: Order,
    /// Command run in the source host.
    pub source: String,
    /// The source keeps running (a server); it is stopped when the receivers are done.
    #[serde(default)]
    pub source_background: bool,
    /// Command run in each receiver; it finishes when that receiver has its copy.
    pub receiver: String,
    /// Command for the last receiver, when it differs (end of a chain).
    #[serde(default)]
    pub receiver_last: Option<String>,
    /// Only the first receiver takes part (point-to-point methods).
    #[serde(default)]
    pub first_receiver_only: bool,
    /// Compare each receiver's `{out}` with the object.
    #[serde(default = "yes")]
    pub verify: bool,
    /// Milliseconds between starting the first side and the second.
    #[serde(default = "default_start_gap")]
    pub start_gap_ms: u64,
    /// Start receivers from the last to the first (a chain: each one's downstream listens
    /// before it connects).
    #[serde(default)]
    pub reverse_start: bool,
    /// Milliseconds between starting consecutive receivers.
    #[serde(default)]
    pub stagger_ms: u64,
    /// Programs that must be installed.
    #[serde(default)]
    pub needs: Vec<String>,
    /// Once every receiver is done, wait up to this long for the source to exit by itself
    /// before stopping it (so that it can write its report). Not counted in the time.
    #[serde(default)]
    pub wait_source_ms: u64,
}

fn yes() -> bool {
    true
}
fn default_start_gap() -> u64 {
    500
}

/// How to run the benchmark.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The object to distribute.
    pub object: PathBuf,
    /// Where receivers write their copies.
    pub work_dir: PathBuf,
    /// Give up on a method after this long.
    pub timeout: Duration,
    /// Congestion control for `{cc}`.
    pub cc: String,
    /// Methods' `{raw}` directories are `raw_dir/<method>` (kept after the run).
    pub raw_dir: PathBuf,
}

/// Bytes that crossed the WAN into one site during a method's run.
#[derive(Debug, Clone, Serialize)]
pub struct SiteBytes {
    /// Site name.
    pub site: String,
    /// IP bytes that left every WAN link into this site (headers, retransmissions and the
    /// acknowledgements of data the site sent out included).
    pub bytes: u64,
}

/// Result of one method.
#[derive(Debug, Clone, Serialize)]
pub struct BenchResult {
    /// Method name.
    pub method: String,
    /// Receivers that took part.
    pub receivers: usize,
    /// Seconds from start until the last receiver finished (None: failed or timed out).
    pub last_s: Option<f64>,
    /// Per receiver: seconds until it finished.
    pub per_receiver_s: Vec<Option<f64>>,
    /// All copies verified (None: not checked).
    pub verified: Option<bool>,
    /// Sum of TUN TX drops during the run (non-zero: overloaded, invalid).
    pub tx_dropped: u64,
    /// Forwarder CPU during the run, as a fraction of one core.
    pub forwarder_cpu: Option<f64>,
    /// Forwarder events handled more than 1 ms late during the run.
    pub late_events: u64,
    /// What a real-time probe thread on the hosts' CPU (off the forwarder's) saw during the run
    /// (None: it could not run at real-time priority): whether that CPU stalled, because the
    /// hypervisor did not run the VM or the hosts' kernel work held it.
    pub host: Option<crate::check::HostProbe>,
    /// The probe saw the host stall ([`crate::check::HostProbe::stalled`]): the run measured
    /// the machine as much as the method.
    pub host_stalled: bool,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// Per site: bytes the forwarder carried into it over WAN links during the run.
    pub wan_bytes_in: Vec<SiteBytes>,
}

fn render_template(t: &str, vars: &HashMap<&str, String>) -> String {
    let mut s = t.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(mut fa), Ok(mut fb)) = (std::fs::File::open(a), std::fs::File::open(b)) else {
        return false;
    };
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let na = read_full(&mut fa, &mut ba);
        let nb = read_full(&mut fb, &mut bb);
        if na != nb || ba[..na] != bb[..nb] {
            return false;
        }
        if na == 0 {
            return true;
        }
    }
}

/// The last lines of a command's log, for an error message (the whole log stays in the raw
/// directory).
fn log_tail(path: &Path) -> String {
    const LINES: usize = 12;
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
    if lines.len() > LINES {
        format!("(last {LINES} lines of {}) {tail}", path.display())
    } else {
        tail
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    n
}

/// How often the runner samples the forwarder's WAN link counters (its publication period).
const SERIES_STEP: Duration = Duration::from_millis(200);

/// Every WAN link as ("FROM>TO", link index).
fn wan_links(layout: &Layout) -> Vec<(String, usize)> {
    let mut v = Vec::new();
    for (x, row) in layout.site_links.iter().enumerate() {
        for (y, l) in row.iter().enumerate() {
            if let Some(l) = l {
                v.push((format!("{}>{}", layout.sites[x], layout.sites[y]), *l));
            }
        }
    }
    v
}

/// Bytes link `l` carried between the counters `stats0` and `stats`.
fn link_delta(stats: &crate::EmuStats, stats0: &crate::EmuStats, l: usize) -> u64 {
    let b = |s: &crate::EmuStats| s.links.get(l).map_or(0, |x| x.bytes_out);
    b(stats).saturating_sub(b(stats0))
}

/// One row of `wan_links.csv`: the time, then each WAN link's bytes since `stats0`.
fn series_row(
    series: &mut String,
    t: f64,
    wan: &[(String, usize)],
    stats: &crate::EmuStats,
    stats0: &crate::EmuStats,
) {
    series.push_str(&format!("{t:.2}"));
    for &(_, l) in wan {
        series.push_str(&format!(",{}", link_delta(stats, stats0, l)));
    }
    series.push('\n');
}

/// Runs one method on a running lab.
pub fn run_method(
    lab: &Lab,
    m: &Method,
    opts: &BenchOptions,
    port: u16,
) -> Result<BenchResult, LabError> {
    check_needs(m)?;
    // Every method starts cold: no probe results from the method before.
    lab.clear_caches();
    let run = MethodRun::prepare(lab, m, opts, port)?;
    let drops0: u64 = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    let stats0 = lab.stats();
    let (cpu0, late0) = (lab.forwarder_cpu_s(), stats0.late_events);
    let probe = crate::check::HostProbeRun::start();
    let (mut rx, mut source, t0) = run.start()?;
    let mut series = WanSeries::new(lab.layout(), stats0);
    let mut w = run.watch(&mut rx, &mut source, t0, opts.timeout, &mut series);
    let run_s = t0.elapsed().as_secs_f64();
    if !w.source_done && m.wait_source_ms > 0 && w.failed.is_none() {
        wait_exit(&mut source, Duration::from_millis(m.wait_source_ms));
    }
    let forwarder_cpu = match (cpu0, lab.forwarder_cpu_s()) {
        (Some(a), Some(b)) => Some((b - a) / run_s),
        _ => None,
    };
    let host = probe.finish();
    // Counters are published every `SERIES_STEP`: wait for the last ones.
    std::thread::sleep(SERIES_STEP + Duration::from_millis(50));
    let stats1 = lab.stats();
    let late_events = stats1.late_events - late0;
    series.sample(t0.elapsed().as_secs_f64(), &stats1);
    let _ = std::fs::write(run.raw_dir.join("wan_links.csv"), &series.csv);
    let wan_bytes_in = series.bytes_in(lab.layout(), &stats1);
    if w.failed.is_none() && w.done.iter().any(Option::is_none) {
        w.failed = Some(format!("timed out after {} s", opts.timeout.as_secs()));
    }
    // Stop whatever is left (servers, stuck receivers) in every host.
    let _ = source.kill();
    let _ = source.wait();
    for c in &mut rx {
        let _ = c.kill();
        let _ = c.wait();
    }
    lab.kill_processes();
    let verified = (m.verify && w.failed.is_none()).then(|| {
        run.receivers
            .iter()
            .all(|r| same_file(&opts.object, &run.out_dir.join(r)))
    });
    let _ = std::fs::remove_dir_all(&run.out_dir);
    let drops1: u64 = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    let last_s = if w.failed.is_none() {
        w.done.iter().flatten().copied().reduce(f64::max)
    } else {
        None
    };
    Ok(BenchResult {
        method: m.name.clone(),
        receivers: run.receivers.len(),
        last_s,
        per_receiver_s: w.done,
        verified,
        tx_dropped: drops1 - drops0,
        forwarder_cpu,
        late_events,
        host,
        host_stalled: host.is_some_and(|h| h.stalled()),
        error: w.failed,
        wan_bytes_in,
    })
}

/// Fails when a program the method needs is not installed, before anything starts.
fn check_needs(m: &Method) -> Result<(), LabError> {
    for prog in &m.needs {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .stdout(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !found {
            return Err(LabError::Measure(format!(
                "method {}: {prog} is not installed",
                m.name
            )));
        }
    }
    Ok(())
}

/// Waits up to `limit` for `child` to exit by itself.
fn wait_exit(child: &mut Child, limit: Duration) {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Bytes over each WAN link since the start, sampled every `SERIES_STEP` (the forwarder's
/// publication period) on the runner's clock, so that a link that idles shows up; written to
/// the raw directory as `wan_links.csv`, with the final counters as the last row.
struct WanSeries {
    wan: Vec<(String, usize)>,
    stats0: crate::EmuStats,
    csv: String,
}

impl WanSeries {
    fn new(layout: &Layout, stats0: crate::EmuStats) -> Self {
        let wan = wan_links(layout);
        let mut csv = String::from("t_s");
        for (name, _) in &wan {
            csv.push_str(&format!(",{name}"));
        }
        csv.push('\n');
        WanSeries { wan, stats0, csv }
    }

    fn sample(&mut self, t: f64, stats: &crate::EmuStats) {
        series_row(&mut self.csv, t, &self.wan, stats, &self.stats0);
    }

    /// Per site: bytes every WAN link into it carried since the start.
    fn bytes_in(&self, layout: &Layout, stats: &crate::EmuStats) -> Vec<SiteBytes> {
        (0..layout.sites.len())
            .map(|y| SiteBytes {
                site: layout.sites[y].clone(),
                bytes: (0..layout.sites.len())
                    .filter_map(|x| layout.site_links[x][y])
                    .map(|l| link_delta(stats, &self.stats0, l))
                    .sum(),
            })
            .collect()
    }
}

/// How the processes of a run ended, as [`MethodRun::watch`] saw them.
struct Watched {
    /// Per receiver: seconds until it exited.
    done: Vec<Option<f64>>,
    /// The first failure (a process that exited with an error).
    failed: Option<String>,
    /// The source exited (or runs in the background and is not waited for).
    source_done: bool,
}

/// One method's run on a lab: its hosts, directories and template variables.
struct MethodRun<'a> {
    lab: &'a Lab,
    m: &'a Method,
    src: String,
    receivers: Vec<String>,
    /// Where receivers write their copies (removed after the run).
    out_dir: PathBuf,
    /// The method's `{raw}` directory, absolute (kept after the run).
    raw_dir: PathBuf,
    /// Template variables common to every host.
    base: HashMap<&'static str, String>,
}

impl<'a> MethodRun<'a> {
    /// Picks the receivers, makes fresh output and raw directories and the common variables.
    fn prepare(
        lab: &'a Lab,
        m: &'a Method,
        opts: &BenchOptions,
        port: u16,
    ) -> Result<Self, LabError> {
        let src = lab.source().to_string();
        let mut receivers: Vec<String> =
            lab.host_names().into_iter().filter(|h| *h != src).collect();
        if m.first_receiver_only {
            receivers.truncate(1);
        }
        let out_dir = opts.work_dir.join(&m.name);
        let _ = std::fs::remove_dir_all(&out_dir);
        std::fs::create_dir_all(&out_dir)
            .map_err(|e| LabError::sys("create bench output dir", e))?;
        let raw_dir = opts.raw_dir.join(&m.name);
        let _ = std::fs::remove_dir_all(&raw_dir);
        std::fs::create_dir_all(&raw_dir).map_err(|e| LabError::sys("create bench raw dir", e))?;
        // Absolute: a method's commands may change directory before they use `{raw}` (aria2's
        // source does), and a relative `--raw-dir` would then point elsewhere.
        let raw_dir = std::fs::canonicalize(&raw_dir)
            .map_err(|e| LabError::sys("resolve bench raw dir", e))?;
        let mut run = MethodRun {
            lab,
            m,
            src,
            receivers,
            out_dir,
            raw_dir,
            base: HashMap::new(),
        };
        run.base = run.base_vars(opts, port)?;
        Ok(run)
    }

    fn ip(&self, h: &str) -> Result<String, LabError> {
        self.lab.addr(h).map(|a| a.to_string())
    }

    /// The template variables every host's command sees.
    fn base_vars(
        &self,
        opts: &BenchOptions,
        port: u16,
    ) -> Result<HashMap<&'static str, String>, LabError> {
        let size = std::fs::metadata(&opts.object)
            .map_err(|e| LabError::sys("stat object", e))?
            .len();
        let agent_port = self.lab.layout().agent_port;
        let object = &opts.object;
        let mut base: HashMap<&'static str, String> = HashMap::new();
        base.insert("object", object.display().to_string());
        let dir = object.parent().unwrap_or(Path::new("/"));
        base.insert("object_dir", dir.display().to_string());
        let name = object.file_name().map(|n| n.to_string_lossy().into_owned());
        base.insert("object_name", name.unwrap_or_default());
        base.insert("size", size.to_string());
        base.insert("hosts_file", self.lab.hosts_file().display().to_string());
        let list: Result<Vec<String>, LabError> = self
            .receivers
            .iter()
            .map(|r| Ok(format!("{}:{}", self.ip(r)?, agent_port)))
            .collect();
        base.insert("hosts_list", list?.join(","));
        base.insert("port", port.to_string());
        base.insert("src_ip", self.ip(&self.src)?);
        base.insert("first_ip", self.ip(&self.receivers[0])?);
        base.insert("cc", opts.cc.clone());
        base.insert("agent_port", agent_port.to_string());
        base.insert("raw", self.raw_dir.display().to_string());
        Ok(base)
    }

    /// Each command's standard error goes to `{raw}/<host>.stderr`: kept for diagnosis, and a
    /// file never fills up and blocks a long run's logging the way an unread pipe does.
    fn log_path(&self, host: &str) -> PathBuf {
        self.raw_dir.join(format!("{host}.stderr"))
    }

    fn sh(&self, host: &str, cmd: &str) -> Result<Child, LabError> {
        let log = std::fs::File::create(self.log_path(host))
            .map_err(|e| LabError::sys(format!("create the log of {host}"), e))?;
        let mut c = self.lab.command(host, "sh")?;
        c.args(["-c", cmd])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        c.spawn()
            .map_err(|e| LabError::sys(format!("start {cmd:?} in {host}"), e))
    }

    /// Starts both sides in the method's order, the start gap between them; the scenario
    /// clock restarts when the second side starts, which is time zero of the run.
    fn start(&self) -> Result<(Vec<Child>, Child, Instant), LabError> {
        let gap = Duration::from_millis(self.m.start_gap_ms);
        Ok(match self.m.order {
            Order::ReceiversFirst => {
                let rx = self.start_receivers()?;
                std::thread::sleep(gap);
                self.lab.start_clock();
                let t0 = Instant::now();
                (rx, self.start_source()?, t0)
            }
            Order::SourceFirst => {
                let s = self.start_source()?;
                std::thread::sleep(gap);
                self.lab.start_clock();
                let t0 = Instant::now();
                (self.start_receivers()?, s, t0)
            }
        })
    }

    /// Starts every receiver's command (in scenario order, or reversed for a chain); returns
    /// them in scenario order.
    fn start_receivers(&self) -> Result<Vec<Child>, LabError> {
        let (m, receivers) = (self.m, &self.receivers);
        let mut v = Vec::new();
        let mut order: Vec<usize> = (0..receivers.len()).collect();
        if m.reverse_start {
            order.reverse();
        }
        for i in order {
            let r = &receivers[i];
            if !v.is_empty() && m.stagger_ms > 0 {
                std::thread::sleep(Duration::from_millis(m.stagger_ms));
            }
            let mut vars = self.base.clone();
            vars.insert("ip", self.ip(r)?);
            vars.insert("host", r.clone());
            vars.insert("index", (i + 1).to_string());
            vars.insert("out", self.out_dir.join(r).display().to_string());
            let next = receivers.get(i + 1).map(|n| self.ip(n)).transpose()?;
            vars.insert("next_ip", next.unwrap_or_default());
            let t = match (&m.receiver_last, i + 1 == receivers.len()) {
                (Some(last), true) => last,
                _ => &m.receiver,
            };
            v.push((i, self.sh(r, &render_template(t, &vars))?));
        }
        v.sort_by_key(|(i, _)| *i);
        Ok(v.into_iter().map(|(_, c)| c).collect())
    }

    fn start_source(&self) -> Result<Child, LabError> {
        let mut vars = self.base.clone();
        vars.insert("ip", self.ip(&self.src)?);
        vars.insert("host", self.src.clone());
        vars.insert("next_ip", self.ip(&self.receivers[0])?);
        self.sh(&self.src, &render_template(&self.m.source, &vars))
    }

    /// Polls the processes every 10 ms until every receiver is done, one fails, or `timeout`;
    /// samples the WAN links meanwhile.
    fn watch(
        &self,
        rx: &mut [Child],
        source: &mut Child,
        t0: Instant,
        timeout: Duration,
        series: &mut WanSeries,
    ) -> Watched {
        let mut w = Watched {
            done: vec![None; rx.len()],
            failed: None,
            source_done: self.m.source_background,
        };
        let mut next_sample = Duration::ZERO;
        while t0.elapsed() < timeout {
            if t0.elapsed() >= next_sample {
                next_sample += SERIES_STEP;
                series.sample(t0.elapsed().as_secs_f64(), &self.lab.stats());
            }
            for (i, c) in rx.iter_mut().enumerate() {
                if w.done[i].is_none() {
                    if let Ok(Some(st)) = c.try_wait() {
                        w.done[i] = Some(t0.elapsed().as_secs_f64());
                        if !st.success() && w.failed.is_none() {
                            let e = log_tail(&self.log_path(&self.receivers[i]));
                            w.failed = Some(format!("{} exited with {st}: {e}", self.receivers[i]));
                        }
                    }
                }
            }
            if !w.source_done {
                if let Ok(Some(st)) = source.try_wait() {
                    w.source_done = true;
                    if !st.success() && w.failed.is_none() {
                        let e = log_tail(&self.log_path(&self.src));
                        w.failed = Some(format!("source exited with {st}: {e}"));
                    }
                }
            }
            if w.done.iter().all(Option::is_some) || w.failed.is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        w
    }
}

/// The table the bench prints.
pub fn render(lab: &Lab, size: u64, results: &[BenchResult]) -> String {
    let ideal = lab.layout().ideal_bps;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "scenario {} ({} receivers), object {:.1} MiB, ideal per-receiver rate {}",
        lab.layout().name,
        lab.layout().hosts.len() - 1,
        size as f64 / (1u64 << 20) as f64,
        ideal.map_or("unknown".into(), |i| format!("{:.1} Mbit/s", i / 1e6))
    );
    let w = results
        .iter()
        .map(|r| r.method.len())
        .max()
        .unwrap_or(0)
        .max(16);
    let _ = writeln!(
        s,
        "{:<w$} {:>9} {:>10} {:>22} {:>10} {:>9} {:>9}  notes",
        "method",
        "receivers",
        "last (s)",
        "rate/receiver (Mbit/s)",
        "of ideal",
        "verified",
        "fwd cpu"
    );
    for r in results {
        let (last, rate, frac) = match r.last_s {
            Some(t) => {
                let rate = size as f64 * 8.0 / t / 1e6;
                let frac = ideal.map_or("-".into(), |i| format!("{:.3}", rate * 1e6 / i));
                (format!("{t:.2}"), format!("{rate:.1}"), frac)
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        let verified = match r.verified {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let mut notes = r.error.clone().unwrap_or_default();
        if r.tx_dropped > 0 {
            notes.push_str(&format!(
                " INVALID: {} TUN drops (lab overloaded)",
                r.tx_dropped
            ));
        }
        if r.late_events > 0 {
            notes.push_str(&format!(" ({} forwarder events >1 ms late)", r.late_events));
        }
        if let Some(h) = r.host.filter(|h| h.stalled()) {
            notes.push_str(&format!(" HOST STALLED ({h})"));
        }
        let cpu = r
            .forwarder_cpu
            .map_or("-".into(), |c| format!("{:.0}%", c * 100.0));
        let _ = writeln!(
            s,
            "{:<w$} {:>9} {:>10} {:>22} {:>10} {:>9} {:>9}  {}",
            r.method,
            r.receivers,
            last,
            rate,
            frac,
            verified,
            cpu,
            notes.trim()
        );
    }
    let _ = writeln!(
        s,
        "rate/receiver = object size / time until the last receiver finished"
    );
    s
}
