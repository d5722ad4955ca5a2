//! `lab check`: measures what the emulator delivers (RTT, one TCP stream with cubic and bbr,
//! UDP loss, forwarder CPU) and compares it with the scenario.

use std::fmt::Write as _;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::forwarder::setns_path;
use crate::lab::Lab;
use crate::LabError;

/// What to measure and for how long.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Seconds of each TCP measurement (after `omit_s`).
    pub tcp_s: u32,
    /// Seconds of slow start left out of each TCP measurement.
    pub omit_s: u32,
    /// Congestion controls to measure one TCP stream with (empty: no TCP).
    pub ccs: Vec<String>,
    /// UDP packets per loss measurement (0: none).
    pub udp_packets: u32,
    /// RTT probes per path.
    pub probes: u32,
    /// Measure at most this many distinct kinds of path.
    pub max_paths: usize,
    /// Measure a path again (up to this many times) when it missed a target while the forwarder
    /// was stalled by other load (events more than 1 ms late) or the host itself stalled
    /// ([`HostProbe::stalled`]): the lab was disturbed, not wrong. A target counts as met once
    /// one attempt met it ([`PathCheck::met_before`]); a miss in an attempt without stalls
    /// always counts; a path whose every attempt missed while the host stalled is not judged
    /// ([`PathCheck::not_judged`]). Every attempt is reported.
    pub retries: u32,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions {
            tcp_s: 8,
            omit_s: 2,
            ccs: vec!["cubic".into(), "bbr".into()],
            udp_packets: 12_000,
            probes: 30,
            max_paths: 8,
            retries: 1,
        }
    }
}

/// Measurements of one kind of path (one representative host pair).
#[derive(Debug, Clone, Default)]
pub struct PathCheck {
    /// `from -> to (what)`.
    pub label: String,
    /// Configured round trip (propagation) in ms.
    pub rtt_cfg_ms: f64,
    /// Median measured RTT of small probes, ms.
    pub rtt_ms: f64,
    /// Minimum measured RTT, ms.
    pub rtt_min_ms: f64,
    /// Configured bottleneck rate of the pair in Mbit/s (None: unlimited).
    pub rate_mbps: Option<f64>,
    /// One TCP stream: (congestion control, Mbit/s received).
    pub tcp: Vec<(String, f64)>,
    /// Configured loss probability of the pair's forward direction.
    pub loss_cfg: f64,
    /// What became of the UDP packets of the loss measurement.
    pub loss: Option<UdpLoss>,
    /// Forwarder events more than 1 ms late during these measurements (the machine was busy).
    pub late_events: u64,
    /// How many times the path was measured (a missed target during forwarder stalls is
    /// measured again, see [`CheckOptions::retries`]).
    pub attempts: u32,
    /// Targets an earlier attempt of this path met. When this attempt ran while the
    /// forwarder was stalled, missing one of them again is not a failure: the emulator has
    /// shown it meets it, and the stall (other load on the machine) spoilt this measurement.
    pub met_before: Vec<Target>,
    /// What the host probe saw while this attempt measured. None: it could not run at
    /// real-time priority, so it could not tell a host stall from load; none is assumed.
    pub host: Option<HostProbe>,
    /// Earlier attempts of this path during which the host stalled (all earlier attempts
    /// missed, or they would not have been repeated): see [`PathCheck::not_judged`].
    pub host_stalled_before: u32,
}

/// A probe wakeup later than this (ms) is the host's stall, not the guest's scheduling. The
/// probe runs real-time, above the forwarder and off its core, so within the guest only a task
/// finishing a non-preemptible kernel path or softirq work (2 ms budget) delays it, by single
/// milliseconds; [`host_timer_lateness`] read at worst 0.5-8.7 ms on the idle VM. 10 ms is also
/// the round trip of the shortest judged path: a stall that long moves a judged figure.
pub const HOST_LATE_MS: f64 = 10.0;

/// One wakeup this late (ms) makes the attempt host-stalled by itself: half the round trip of
/// the rate target's 100 ms path with nothing forwarded, then released as one burst (on the
/// 200 Mbit/s path 1.25 MB, five times its queue).
pub const HOST_STALL_MS: f64 = 50.0;

/// Late wakeups adding up to this share of the attempt make it host-stalled: not an isolated
/// hiccup but spells recurring through the measurement (200 ms of a 20 s attempt), which
/// spoil the forwarder's per-packet timing throughout.
pub const HOST_STALL_SHARE: f64 = 0.01;

/// What a thread independent of the forwarder saw while an attempt measured: it slept 1 ms in
/// a loop at real-time priority, above the forwarder's and off its core (where the measuring
/// processes run), so neither a busy forwarder nor other load delays it by more than a few ms.
/// Where it woke late by more than [`HOST_LATE_MS`] the guest was not running (the hypervisor
/// took the CPU; this VM does not report steal time), so a late forwarder with a punctual probe
/// is the forwarder's fault. A stall of the forwarder's core alone goes unseen: such a miss
/// stays judged.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct HostProbe {
    /// Seconds the probe ran.
    pub secs: f64,
    /// Its 1 ms sleeps.
    pub wakeups: u64,
    /// Wakeups more than [`HOST_LATE_MS`] late.
    pub late_wakeups: u64,
    /// The lateness of those wakeups added up, ms: time the host did not run the guest.
    pub stalled_ms: f64,
    /// The worst lateness of any wakeup, ms.
    pub max_late_ms: f64,
}

impl HostProbe {
    /// Takes in one wakeup `late_ms` after its 1 ms sleep was due.
    pub fn record(&mut self, late_ms: f64) {
        self.wakeups += 1;
        self.max_late_ms = self.max_late_ms.max(late_ms);
        if late_ms > HOST_LATE_MS {
            self.late_wakeups += 1;
            self.stalled_ms += late_ms;
        }
    }

    /// Whether the host stalled: one wakeup [`HOST_STALL_MS`] late, or late wakeups adding up
    /// to [`HOST_STALL_SHARE`] of the time the probe ran.
    pub fn stalled(&self) -> bool {
        self.late_wakeups > 0
            && (self.max_late_ms >= HOST_STALL_MS
                || self.stalled_ms >= HOST_STALL_SHARE * self.secs * 1e3)
    }
}

impl std::fmt::Display for HostProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "host probe: {} of {} wakeups >{HOST_LATE_MS} ms late, {:.0} ms stalled in {:.1} s, \
             worst {:.1} ms",
            self.late_wakeups, self.wakeups, self.stalled_ms, self.secs, self.max_late_ms
        )
    }
}

/// The host probe of one attempt (or one benchmark run), stopped (and joined) by
/// [`HostProbeRun::finish`] or on drop, so it never outlives what it watches.
pub struct HostProbeRun {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<HostProbe>>>,
}

impl HostProbeRun {
    /// Starts the probe thread.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("host-probe".into())
            .spawn(move || host_probe(&flag))
            .ok();
        HostProbeRun { stop, thread }
    }

    /// Stops the probe; what it saw (None: no real-time priority, or it could not start).
    pub fn finish(mut self) -> Option<HostProbe> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take()?.join().ok().flatten()
    }
}

impl Drop for HostProbeRun {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The probe's loop: 1 ms sleeps until `stop`, checked after every sleep.
fn host_probe(stop: &AtomicBool) -> Option<HostProbe> {
    crate::streams::pin_off_forwarder();
    // Above the forwarder's priority: where they share a core (one CPU, `BCLAB_SHARE_CPU`) a
    // busy forwarder must not pass for a host stall.
    crate::forwarder::realtime(crate::forwarder::FORWARDER_PRIORITY + 1).ok()?;
    let start = Instant::now();
    let mut p = HostProbe::default();
    while !stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(1));
        p.record(t0.elapsed().as_secs_f64() * 1e3 - 1.0);
    }
    p.secs = start.elapsed().as_secs_f64();
    Some(p)
}

/// What became of the packets of one UDP loss measurement. iperf3 counts a packet lost when
/// its sequence number never arrived; the counters say where it went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpLoss {
    /// Packets iperf3 sent.
    pub sent: u64,
    /// Packets iperf3's receiver never saw.
    pub lost: u64,
    /// Of those, dropped by the receiving socket because iperf3 did not read in time
    /// (`RcvbufErrors` in the receiver's namespace): the instrument's loss, not the path's,
    /// seen when the host stalls the receiver (CI on 2026-11-23: 0.15-5.5% on a lossless path).
    pub socket_drops: u64,
    /// Dropped by the emulator's random loss on the path's links.
    pub random_drops: u64,
    /// Dropped by the emulator's queues on the path's links (full: a burst after a stall).
    pub queue_drops: u64,
}

impl UdpLoss {
    /// The path's random loss: what was lost, less what the receiving socket and the queues
    /// dropped (queue drops are judged on their own, [`Target::Queue`]).
    pub fn path_loss(&self) -> f64 {
        let other = self.socket_drops + self.queue_drops;
        self.lost.saturating_sub(other) as f64 / self.sent.max(1) as f64
    }
}

/// One fidelity target of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The round trip ([`rtt_ok`]).
    Rtt,
    /// One bbr stream at [`RATE_SHARE`] of the rate, on a path without loss.
    Rate,
    /// The UDP loss ([`loss_ok`]).
    Loss,
    /// No queue drops while the UDP loss probe loads the path to 70%. A forwarder that ran
    /// late releases what arrived meanwhile as one burst, which a real path's queue would
    /// drop too, so a miss while it was stalled is excused even if never met.
    Queue,
    /// On a path with random loss, one bbr stream carries at least [`CONTRAST_FACTOR`] times
    /// what one cubic stream carries, and at least [`CONTRAST_SHARE`] of the rate: loss-based
    /// congestion control collapses there (Mathis: about 1.4 Mbit/s at 1% and 100 ms), a
    /// model-based one does not. The emulator must reproduce that contrast, or bulkcast's
    /// choice of bbr for lossy WAN hops is tuned on a fiction.
    Contrast,
}

/// [`Target::Rate`]: one bbr stream's share of a path's rate, at least.
pub const RATE_SHARE: f64 = 0.9;

/// [`Target::Contrast`]: bbr over cubic on a lossy path, at least (the table's verdict
/// spells this and [`CONTRAST_SHARE`] out).
pub const CONTRAST_FACTOR: f64 = 5.0;

/// [`Target::Contrast`]: bbr's share of a lossy path's rate, at least. Measured here on an
/// idle VM: 0.96-0.98 at 1% loss and 100 ms, 0.46-0.70 at 2% and 250 ms (bbr's start-up
/// takes several of those round trips of the 8 s stream); 0.25 leaves room for both while
/// still failing an emulator that delays or drops in bursts (14% measured while the host
/// stalled for 3.4 s).
pub const CONTRAST_SHARE: f64 = 0.25;

/// [`Target::Contrast`] applies from this round trip on ([`PathCheck::contrast_applies`]).
pub const CONTRAST_MIN_RTT_MS: f64 = 10.0;

impl Target {
    const ALL: [Target; 5] = [
        Target::Rtt,
        Target::Rate,
        Target::Loss,
        Target::Queue,
        Target::Contrast,
    ];
}

impl PathCheck {
    /// Whether [`Target::Contrast`] judges this path rather than [`Target::Rate`]: random loss
    /// on a round trip of at least [`CONTRAST_MIN_RTT_MS`]. Below that, loss-based control
    /// recovers within a fraction of a millisecond and keeps its rate (cubic carried 0.91 of a
    /// 1%-loss LAN link here), so one bbr stream is held to the rate target instead.
    pub fn contrast_applies(&self) -> bool {
        self.loss_cfg > 0.0 && self.rtt_cfg_ms >= CONTRAST_MIN_RTT_MS
    }

    /// What one stream with congestion control `cc` carried, Mbit/s (None: not measured).
    pub fn tcp_mbps(&self, cc: &str) -> Option<f64> {
        self.tcp.iter().find(|(c, _)| c == cc).map(|(_, m)| *m)
    }

    /// The targets this path missed, each with a line saying how.
    pub fn missed(&self) -> Vec<(Target, String)> {
        let mut f = Vec::new();
        let p = self;
        if (10.0..=250.0).contains(&p.rtt_cfg_ms) && !rtt_ok(p.rtt_cfg_ms, p.rtt_ms) {
            f.push((
                Target::Rtt,
                format!(
                    "{}: RTT {:.2} ms, configured {:.2} ms",
                    p.label, p.rtt_ms, p.rtt_cfg_ms
                ),
            ));
        }
        if let (Some(rate), false, Some(m)) = (p.rate_mbps, p.contrast_applies(), p.tcp_mbps("bbr"))
        {
            if !rate_ok(rate, m) {
                f.push((
                    Target::Rate,
                    format!(
                        "{}: bbr {m:.1} Mbit/s < {:.0}% of {rate} Mbit/s",
                        p.label,
                        RATE_SHARE * 100.0
                    ),
                ));
            }
        }
        if let (Some(rate), Some(bbr), Some(cubic)) =
            (p.rate_mbps, p.tcp_mbps("bbr"), p.tcp_mbps("cubic"))
        {
            if p.contrast_applies() && !contrast_ok(rate, cubic, bbr) {
                f.push((
                    Target::Contrast,
                    format!(
                        "{}: at {:.1}% loss bbr {bbr:.1} Mbit/s against cubic {cubic:.1}: not \
                         {CONTRAST_FACTOR}x cubic and {:.0}% of {rate} Mbit/s",
                        p.label,
                        p.loss_cfg * 100.0,
                        CONTRAST_SHARE * 100.0
                    ),
                ));
            }
        }
        if let Some(u) = p.loss {
            let l = u.path_loss();
            if !loss_ok(p.loss_cfg, l) {
                f.push((
                    Target::Loss,
                    format!(
                        "{}: UDP loss {:.3}%, configured {:.3}% (lost {} of {}: emulator \
                         random {}, queue {}, receiving socket {})",
                        p.label,
                        l * 100.0,
                        p.loss_cfg * 100.0,
                        u.lost,
                        u.sent,
                        u.random_drops,
                        u.queue_drops,
                        u.socket_drops
                    ),
                ));
            }
            if u.queue_drops > 0 {
                f.push((
                    Target::Queue,
                    format!(
                        "{}: {} UDP datagrams dropped by the emulator's queues at 70% load",
                        p.label, u.queue_drops
                    ),
                ));
            }
        }
        f
    }

    /// Whether a miss of `t` here is excused: this attempt ran while the forwarder was
    /// stalled and an earlier one met it (see [`PathCheck::met_before`]), or it is
    /// [`Target::Queue`].
    pub fn excused(&self, t: Target) -> bool {
        self.late_events > 0 && (t == Target::Queue || self.met_before.contains(&t))
    }

    /// The table's verdict on target `t`: `ok` when met, [`EXCUSED`], [`NOT_JUDGED`] or
    /// `fail` when not.
    fn verdict<'a>(&self, t: Target, met: bool, ok: &'a str, fail: &'a str) -> &'a str {
        if met {
            ok
        } else if self.excused(t) {
            EXCUSED
        } else if self.not_judged() {
            NOT_JUDGED
        } else {
            fail
        }
    }

    /// The targets this attempt missed that no excuse ([`PathCheck::excused`]) covers.
    fn unexcused(&self) -> Vec<String> {
        self.missed()
            .into_iter()
            .filter(|(t, _)| !self.excused(*t))
            .map(|(_, line)| line)
            .collect()
    }

    /// Whether the host probe saw the host stall during this attempt ([`HostProbe::stalled`]).
    pub fn host_stalled(&self) -> bool {
        self.host.is_some_and(|h| h.stalled())
    }

    /// Whether this path (its last attempt) is not judged: it missed, and the host stalled in
    /// this attempt and in every earlier one. Such misses are the host's, and the emulator had
    /// no fair attempt; one attempt without a host stall, missed or not, makes the path judged.
    pub fn not_judged(&self) -> bool {
        self.host_stalled()
            && self.host_stalled_before + 1 == self.attempts
            && !self.unexcused().is_empty()
    }

    /// The targets this path missed and did not meet in an earlier attempt (none when it is
    /// [not judged](PathCheck::not_judged)).
    pub fn failures(&self) -> Vec<String> {
        if self.not_judged() {
            return Vec::new();
        }
        self.unexcused()
    }

    /// `(attempt N; forwarder and host probe figures)`, the table's line under a path.
    fn attempt_line(&self) -> String {
        let host = match &self.host {
            Some(h) if h.stalled() => format!("{h}: the host stalled"),
            Some(h) => h.to_string(),
            None => "no host probe (no real-time priority)".into(),
        };
        format!(
            "(attempt {}; {} forwarder events >1 ms late while measuring; {host})",
            self.attempts, self.late_events
        )
    }
}

/// The attempts of one path so far, as [`check`] files them.
#[derive(Debug, Default)]
struct Attempts {
    /// Targets some attempt met.
    met: Vec<Target>,
    /// Attempts that missed while the host stalled.
    host_stalled: u32,
}

impl Attempts {
    /// Gives attempt `pc` what the earlier ones showed and takes in its results. True when the
    /// path is to be measured again: it missed a target no excuse covers while the forwarder
    /// ran late or the host stalled, and `retries` are left. Otherwise `pc` is the path's last.
    fn file(&mut self, pc: &mut PathCheck, retries: u32) -> bool {
        pc.met_before = self.met.clone();
        pc.host_stalled_before = self.host_stalled;
        let missed: Vec<Target> = pc.missed().iter().map(|(t, _)| *t).collect();
        for t in Target::ALL {
            if !missed.contains(&t) && !self.met.contains(&t) {
                self.met.push(t);
            }
        }
        let stalled = pc.late_events > 0 || pc.host_stalled();
        let retry = stalled && pc.attempts <= retries && !pc.unexcused().is_empty();
        if retry && pc.host_stalled() {
            self.host_stalled += 1;
        }
        retry
    }
}

/// Everything `lab check` measured.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Per kind of path (the last attempt).
    pub paths: Vec<PathCheck>,
    /// Earlier attempts that missed a target while the forwarder or the host was stalled.
    pub retried: Vec<PathCheck>,
    /// Forwarder CPU as a fraction of one core over the check.
    pub forwarder_cpu: Option<f64>,
    /// Sum of "TX dropped" over all hosts' TUNs.
    pub tx_dropped: u64,
    /// Events handled more than 1 ms late / the largest lateness in ms.
    pub late_events: u64,
    /// Largest lateness in ms.
    pub max_lateness_ms: f64,
    /// Seconds the check took.
    pub wall_s: f64,
    /// The links between sites were shaped by the kernel, not the forwarder.
    pub kernel_shaping: bool,
}

impl CheckReport {
    /// The lab's ceiling: the largest share of its path's rate one TCP stream carried, the
    /// most any method can give one receiver there (None: no rated path measured).
    pub fn ceiling(&self) -> Option<f64> {
        self.paths
            .iter()
            .filter_map(|p| {
                let r = p.rate_mbps?;
                p.tcp.iter().map(|(_, m)| m / r).reduce(f64::max)
            })
            .reduce(f64::max)
    }
}

/// How well this host keeps time for the forwarder, measured without it: a thread tuned as
/// the forwarder's (its CPU, `SCHED_FIFO`, 1 ns timer slack) sleeps 1 ms `samples` times.
/// Returns the fraction of sleeps that overran by more than 1 ms and the worst overrun in ms.
/// The emulator releases packets on such timers, so where they overrun its delays, rates and
/// losses are the host's, not its own. On the project's VM on 2026-11-23, while idle, this
/// read 0.0-0.4% (worst 0.5-8.7 ms); a Python loop of the same sleeps read 0.6-5% at other
/// moments (worst 12-19 ms), when the lab's timing tests failed.
pub fn host_timer_lateness(samples: u32) -> (f64, f64) {
    let cpu = crate::forwarder::forwarder_cpu();
    let t = std::thread::spawn(move || {
        let _ = crate::forwarder::tune_thread(cpu);
        let (mut late, mut worst) = (0u32, 0.0f64);
        for _ in 0..samples {
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            let over = t0.elapsed().as_secs_f64() * 1e3 - 1.0;
            if over > 1.0 {
                late += 1;
            }
            worst = worst.max(over);
        }
        (f64::from(late) / f64::from(samples.max(1)), worst)
    });
    t.join().unwrap_or((1.0, f64::INFINITY))
}

/// How long [`check`] waits before measuring a stalled path again.
const RETRY_PAUSE: Duration = Duration::from_secs(5);

/// The verdict of a target missed while the forwarder was stalled and met in an earlier
/// attempt of the same path.
const EXCUSED: &str = "missed while stalled; met in an earlier attempt";

/// The verdict of a target missed on a path that is [not judged](PathCheck::not_judged).
const NOT_JUDGED: &str = "NOT JUDGED (the host stalled in every attempt)";

/// RTT tolerance of the issue: 1 ms or 2 %, whichever is larger.
pub fn rtt_ok(cfg_ms: f64, measured_ms: f64) -> bool {
    (measured_ms - cfg_ms).abs() <= (0.02 * cfg_ms).max(1.0)
}

/// [`Target::Rate`] on a path of `rate` Mbit/s where one bbr stream carried `bbr` Mbit/s.
pub fn rate_ok(rate: f64, bbr: f64) -> bool {
    bbr >= RATE_SHARE * rate
}

/// [`Target::Contrast`] on a path of `rate` Mbit/s where one cubic stream carried `cubic`
/// and one bbr stream `bbr` Mbit/s.
pub fn contrast_ok(rate: f64, cubic: f64, bbr: f64) -> bool {
    bbr >= CONTRAST_FACTOR * cubic && bbr >= CONTRAST_SHARE * rate
}

/// Loss tolerance: within 15 % (relative) of the configured loss; near zero when none is set.
pub fn loss_ok(cfg: f64, measured: f64) -> bool {
    if cfg == 0.0 {
        measured <= 0.001
    } else {
        (measured - cfg).abs() <= 0.15 * cfg
    }
}

impl CheckReport {
    /// A line per path that is [not judged](PathCheck::not_judged): what it missed, and what
    /// the host probe saw in its last attempt.
    pub fn not_judged(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|p| p.not_judged())
            .map(|p| {
                let probe = p.host.map(|h| h.to_string()).unwrap_or_default();
                format!(
                    "{}: the host stalled in every attempt ({} of {}; last: {probe}, {} \
                     forwarder events >1 ms late); missed: {}",
                    p.label,
                    p.host_stalled_before + 1,
                    p.attempts,
                    p.late_events,
                    p.unexcused().join("; ")
                )
            })
            .collect()
    }

    /// Lines describing every target that was missed (empty: all met or not judged).
    pub fn failures(&self) -> Vec<String> {
        let mut f: Vec<String> = self.paths.iter().flat_map(PathCheck::failures).collect();
        if self.tx_dropped > 0 {
            f.push(format!(
                "TUN TX dropped = {} (forwarder overloaded: run invalid)",
                self.tx_dropped
            ));
        }
        f
    }

    /// The table `lab check` prints.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<40} {:<10} {:>16} {:>22}  verdict",
            "path", "what", "configured", "measured"
        );
        // The verdicts spell out the targets' constants.
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        let (rate_met, rate_missed) = (
            format!("ok (>= {})", pct(RATE_SHARE)),
            format!("FAIL (< {})", pct(RATE_SHARE)),
        );
        let (contrast_met, contrast_missed) = (
            format!(
                "ok (>= {CONTRAST_FACTOR}x cubic, >= {})",
                pct(CONTRAST_SHARE)
            ),
            format!(
                "FAIL (< {CONTRAST_FACTOR}x cubic or < {})",
                pct(CONTRAST_SHARE)
            ),
        );
        for p in &self.paths {
            let rtt_verdict = if !(10.0..=250.0).contains(&p.rtt_cfg_ms) {
                "(no target)"
            } else {
                p.verdict(Target::Rtt, rtt_ok(p.rtt_cfg_ms, p.rtt_ms), "ok", "FAIL")
            };
            let _ = writeln!(
                s,
                "{:<40} {:<10} {:>13.2} ms {:>13.2} ms (min {:.2})  {rtt_verdict}",
                p.label, "rtt", p.rtt_cfg_ms, p.rtt_ms, p.rtt_min_ms
            );
            let rate = p
                .rate_mbps
                .map_or("unlimited".to_string(), |r| format!("{r:.1} Mbit/s"));
            for (cc, m) in &p.tcp {
                let (share, verdict) = match p.rate_mbps {
                    Some(r) => {
                        let cubic = p.tcp_mbps("cubic");
                        let v = match (cc.as_str(), cubic) {
                            ("bbr", _) if !p.contrast_applies() => {
                                p.verdict(Target::Rate, rate_ok(r, *m), &rate_met, &rate_missed)
                            }
                            ("bbr", Some(c)) => p.verdict(
                                Target::Contrast,
                                contrast_ok(r, c, *m),
                                &contrast_met,
                                &contrast_missed,
                            ),
                            _ => "(no target)",
                        };
                        (format!(" ({:.1}%)", 100.0 * m / r), v)
                    }
                    None => (String::new(), "(no target)"),
                };
                let _ = writeln!(
                    s,
                    "{:<40} {:<10} {:>16} {:>14.1} Mbit/s{share}  {verdict}",
                    "",
                    format!("tcp {cc}"),
                    rate,
                    m
                );
            }
            if let Some(u) = p.loss {
                let l = u.path_loss();
                let v = p.verdict(Target::Loss, loss_ok(p.loss_cfg, l), "ok", "FAIL");
                let _ = writeln!(
                    s,
                    "{:<40} {:<10} {:>14.3} % {:>14.3} % ({} pkts)  {v}",
                    "",
                    "udp loss",
                    p.loss_cfg * 100.0,
                    l * 100.0,
                    u.sent
                );
                let q = match (u.queue_drops, p.excused(Target::Queue)) {
                    (0, _) => "",
                    (_, true) => "dropped while the forwarder was stalled",
                    (_, false) if p.not_judged() => NOT_JUDGED,
                    (_, false) => "FAIL",
                };
                let _ = writeln!(
                    s,
                    "{:<40} (lost {}: emulator random {}, emulator queue {}, receiving socket {} \
                     (not the path's))  {q}",
                    "", u.lost, u.random_drops, u.queue_drops, u.socket_drops
                );
            }
            if p.late_events > 0 || p.attempts > 1 || p.host.is_some_and(|h| h.late_wakeups > 0) {
                let _ = writeln!(s, "{:<40} {}", "", p.attempt_line());
            }
        }
        for r in &self.retried {
            for (_, f) in r.missed() {
                let _ = writeln!(s, "measured again after a stall: {f} {}", r.attempt_line());
            }
        }
        let cpu = self.forwarder_cpu.map_or("unknown".into(), |c| {
            format!("{:.0}% of one core", c * 100.0)
        });
        let _ = writeln!(
            s,
            "forwarder CPU: {cpu} over {:.0} s; TUN TX dropped: {}; events >1 ms late: {} (max {:.2} ms)",
            self.wall_s, self.tx_dropped, self.late_events, self.max_lateness_ms
        );
        let shaping = if self.kernel_shaping {
            "the kernel (htb counts Ethernet frames: 1448 of 1514 bytes are TCP payload)"
        } else {
            "the forwarder (it counts IP packets: 1448 of 1500 bytes are TCP payload)"
        };
        if let Some(c) = self.ceiling() {
            let _ = writeln!(
                s,
                "ceiling: one TCP stream carried {:.1}% of its path's rate; links shaped by {shaping}",
                c * 100.0
            );
        }
        let not_judged = self.not_judged();
        for l in &not_judged {
            let _ = writeln!(s, "NOT JUDGED: {l}");
        }
        let f = self.failures();
        if f.is_empty() && not_judged.is_empty() {
            let _ = writeln!(s, "all targets met");
        } else if f.is_empty() {
            let _ = writeln!(
                s,
                "all judged targets met; {} path(s) NOT JUDGED: the host stalled in every attempt",
                not_judged.len()
            );
        } else {
            for l in f {
                let _ = writeln!(s, "FAIL: {l}");
            }
        }
        s
    }
}

/// One representative pair per distinct kind of path.
struct Probe {
    label: String,
    from: String,
    to: String,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    rtt_cfg_ms: f64,
    rate_mbps: Option<f64>,
    loss: f64,
    /// The forward route's links.
    route: Vec<usize>,
}

fn probes(lab: &Lab, max: usize) -> Vec<Probe> {
    let p = lab.layout();
    let mut out: Vec<Probe> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut add = |from: usize, to: usize, src: Ipv4Addr, dst: Ipv4Addr, what: String| {
        let Some(r) = p.route(from, dst) else { return };
        let back_dst = if dst == p.hosts[to].addr {
            p.hosts[from].addr
        } else {
            src
        };
        let Some(back) = p.route(to, back_dst) else {
            return;
        };
        let rtt_ns = r
            .iter()
            .chain(&back)
            .map(|&l| p.links[l].delay_ns)
            .sum::<u64>();
        let rate = r
            .iter()
            .filter_map(|&l| p.links[l].rate_bps)
            .fold(f64::INFINITY, f64::min);
        let rate_mbps = rate.is_finite().then_some(rate / 1e6);
        let loss = 1.0 - r.iter().map(|&l| 1.0 - p.links[l].loss).product::<f64>();
        let key = format!("{rtt_ns}/{rate_mbps:?}/{loss}/{}", p.links[r[1]].jitter_ns);
        if !seen.insert(key) {
            return;
        }
        out.push(Probe {
            label: format!("{} -> {} ({what})", p.hosts[from].name, p.hosts[to].name),
            from: p.hosts[from].name.clone(),
            to: p.hosts[to].name.clone(),
            src,
            dst,
            rtt_cfg_ms: rtt_ns as f64 / 1e6,
            rate_mbps,
            loss,
            route: r,
        });
    };
    let first = |s: usize| p.hosts.iter().position(|h| h.site == s);
    for a in 0..p.sites.len() {
        for b in 0..p.sites.len() {
            if a != b {
                if let (Some(x), Some(y)) = (first(a), first(b)) {
                    add(
                        x,
                        y,
                        p.hosts[x].addr,
                        p.hosts[y].addr,
                        p.links[p.site_links[a][b].expect("resolved")].name.clone(),
                    );
                }
            }
        }
    }
    for c in &p.channels {
        add(c.a, c.b, c.a_addr, c.b_addr, c.name.clone());
    }
    out.truncate(max);
    out
}

/// Measures the round trip of `n` small UDP probes from `src` (in `from_ns`) to an echo in
/// `to_ns`; returns (median, min) in ms.
pub fn measure_rtt(
    from_ns: &str,
    to_ns: &str,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    n: u32,
) -> Result<(f64, f64), LabError> {
    const PORT: u16 = 7399;
    let to_ns = to_ns.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || -> Result<(), LabError> {
        setns_path(&format!("/var/run/netns/{to_ns}"))?;
        let sock = UdpSocket::bind((dst, PORT)).map_err(|e| LabError::sys("bind echo", e))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| LabError::sys("timeout", e))?;
        let _ = ready_tx.send(());
        let mut buf = [0u8; 256];
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((k, from)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(&buf[..k], from);
            }
        }
        Ok(())
    });
    let from_ns = from_ns.to_string();
    let result = (|| -> Result<(f64, f64), LabError> {
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| LabError::Measure("echo server did not start".into()))?;
        let client = std::thread::spawn(move || -> Result<Vec<f64>, LabError> {
            setns_path(&format!("/var/run/netns/{from_ns}"))?;
            let sock = UdpSocket::bind((src, 0)).map_err(|e| LabError::sys("bind probe", e))?;
            sock.connect(SocketAddr::from((dst, PORT)))
                .map_err(|e| LabError::sys("connect probe", e))?;
            sock.set_read_timeout(Some(Duration::from_millis(1500)))
                .map_err(|e| LabError::sys("timeout", e))?;
            let mut rtts = Vec::new();
            let mut buf = [0u8; 256];
            for seq in 0..n {
                let payload = [seq.to_be_bytes().as_slice(), &[0u8; 60]].concat();
                let t0 = Instant::now();
                sock.send(&payload)
                    .map_err(|e| LabError::sys("send probe", e))?;
                // Wait for this probe's echo; stale echoes of earlier probes are skipped.
                while let Ok(k) = sock.recv(&mut buf) {
                    if k >= 4 && buf[..4] == seq.to_be_bytes() {
                        rtts.push(t0.elapsed().as_secs_f64() * 1e3);
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(rtts)
        });
        let mut rtts = client
            .join()
            .map_err(|_| LabError::Measure("probe thread panicked".into()))??;
        if rtts.len() < (n as usize).div_ceil(2) {
            return Err(LabError::Measure(format!(
                "only {} of {n} RTT probes answered",
                rtts.len()
            )));
        }
        rtts.sort_by(f64::total_cmp);
        Ok((rtts[rtts.len() / 2], rtts[0]))
    })();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    result
}

/// Waits for `child` at most `limit`, killing it after; returns its stdout.
pub fn wait_output(mut child: Child, limit: Duration) -> Result<(bool, String), LabError> {
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + limit;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    Ok((ok, reader.join().unwrap_or_default()))
}

fn iperf3_client(
    lab: &Lab,
    p: &Probe,
    port: u16,
    extra: &[String],
    limit: Duration,
) -> Result<serde_json::Value, LabError> {
    let mut server = lab.command(&p.to, "iperf3")?;
    server
        .args([
            "-s",
            "-1",
            "-p",
            &port.to_string(),
            "-B",
            &p.dst.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let server = server
        .spawn()
        .map_err(|e| LabError::sys("start iperf3 (is it installed?)", e))?;
    let result = (|| {
        // The server needs a moment to listen; retry a refused connection for up to 3 s.
        let start = Instant::now();
        loop {
            let mut c = lab.command(&p.from, "iperf3")?;
            c.args([
                "-c",
                &p.dst.to_string(),
                "-p",
                &port.to_string(),
                "-B",
                &p.src.to_string(),
                "-J",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
            let child = c.spawn().map_err(|e| LabError::sys("start iperf3", e))?;
            let (_, out) = wait_output(child, limit)?;
            let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| {
                LabError::Measure(format!("iperf3 output is not JSON ({e}): {}", out.trim()))
            })?;
            match v.get("error").and_then(|e| e.as_str()) {
                Some(err)
                    if err.contains("refused") && start.elapsed() < Duration::from_secs(3) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Some(err) => return Err(LabError::Measure(format!("iperf3: {err}"))),
                None => return Ok(v),
            }
        }
    })();
    let _ = wait_output(server, Duration::from_secs(3));
    result
}

/// One TCP stream with congestion control `cc` for `secs` (after `omit` s): Mbit/s received.
fn measure_tcp(lab: &Lab, p: &Probe, cc: &str, secs: u32, omit: u32) -> Result<f64, LabError> {
    let extra = [
        "-t".into(),
        secs.to_string(),
        "-O".into(),
        omit.to_string(),
        "-C".into(),
        cc.into(),
    ];
    let v = iperf3_client(
        lab,
        p,
        5201,
        &extra,
        Duration::from_secs((secs + omit + 20) as u64),
    )?;
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .map(|b| b / 1e6)
        .ok_or_else(|| LabError::Measure("iperf3: no sum_received".into()))
}

/// Sends `n` UDP packets at 70% of the bottleneck (at most 100 Mbit/s); says what became of
/// them. The sender is ours, not iperf3's: iperf3 catches up after a stall of its own in one
/// burst at CPU speed (30 ms behind at 100 Mbit/s is 375 KB, more than the 250 KB queue of a
/// 200 Mbit/s, 10 ms path: 338 drops in two runs here on 2026-11-24), while this one keeps
/// at most 2 ms of catch-up. Queues then stay short, so only random loss drops packets.
fn measure_loss(lab: &Lab, p: &Probe, n: u32) -> Result<UdpLoss, LabError> {
    let rate = p.rate_mbps.map_or(100.0, |r| (0.7 * r).min(100.0));
    let links0 = lab.stats().links;
    let (sent, received, socket_drops) = udp_burstless(
        &lab.netns(&p.from)?,
        &lab.netns(&p.to)?,
        p.src,
        p.dst,
        n,
        rate,
        Duration::from_secs_f64(p.rtt_cfg_ms / 1e3),
    )?;
    // Counters are published every 200 ms.
    std::thread::sleep(Duration::from_millis(250));
    let links1 = lab.stats().links;
    let delta = |f: fn(&crate::LinkStats) -> u64| -> u64 {
        p.route
            .iter()
            .filter_map(|&l| Some(f(links1.get(l)?).saturating_sub(f(links0.get(l)?))))
            .sum()
    };
    Ok(UdpLoss {
        sent,
        lost: sent - received,
        socket_drops,
        random_drops: delta(|l| l.loss_drops),
        queue_drops: delta(|l| l.queue_drops),
    })
}

/// Size of a loss probe datagram (UDP payload).
const LOSS_PROBE_LEN: usize = 1200;

/// Paces `n` datagrams of [`LOSS_PROBE_LEN`] bytes at `mbps` from `src` (in `from_ns`) to a
/// counting receiver at `dst` (in `to_ns`). Returns (sent, distinct received, datagrams the
/// receiving socket dropped because it was full).
fn udp_burstless(
    from_ns: &str,
    to_ns: &str,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    n: u32,
    mbps: f64,
    rtt: Duration,
) -> Result<(u64, u64, u64), LabError> {
    const PORT: u16 = 7398;
    let to_ns = to_ns.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || -> Result<(u64, u64), LabError> {
        setns_path(&format!("/var/run/netns/{to_ns}"))?;
        let sock = UdpSocket::bind((dst, PORT)).map_err(|e| LabError::sys("bind loss sink", e))?;
        // Room for 400 ms at 100 Mbit/s where net.core.rmem_max allows (4 MiB here): the
        // socket is the instrument, a receiver stalled by the host must not drop.
        set_rcvbuf(&sock, 4 << 20);
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| LabError::sys("timeout", e))?;
        // This thread's namespace, not the process's (/proc/self/net is the main thread's).
        let drops = || snmp_rcvbuf_errors("/proc/thread-self/net/snmp");
        let drops0 = drops()?;
        let _ = ready_tx.send(());
        let mut seen = vec![false; n as usize];
        let mut received = 0u64;
        let mut buf = [0u8; LOSS_PROBE_LEN];
        while !stop2.load(Ordering::Relaxed) {
            if let Ok(k) = sock.recv(&mut buf) {
                if k >= 4 {
                    let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    if let Some(s) = seen.get_mut(seq).filter(|s| !**s) {
                        *s = true;
                        received += 1;
                    }
                }
            }
        }
        Ok((received, drops()?.saturating_sub(drops0)))
    });
    let from_ns = from_ns.to_string();
    let sent = (|| -> Result<u64, LabError> {
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| LabError::Measure("loss sink did not start".into()))?;
        let sender = std::thread::spawn(move || -> Result<u64, LabError> {
            setns_path(&format!("/var/run/netns/{from_ns}"))?;
            let sock =
                UdpSocket::bind((src, 0)).map_err(|e| LabError::sys("bind loss probe", e))?;
            sock.connect(SocketAddr::from((dst, PORT)))
                .map_err(|e| LabError::sys("connect loss probe", e))?;
            let gap = Duration::from_secs_f64(LOSS_PROBE_LEN as f64 * 8.0 / (mbps * 1e6));
            let slack = Duration::from_millis(2);
            let mut payload = [0u8; LOSS_PROBE_LEN];
            let mut due = Instant::now();
            let mut sent = 0u64;
            for seq in 0..n {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                } else if now - due > slack {
                    // Fell behind (the host stalled us): forget the debt beyond the slack.
                    due = now - slack;
                }
                payload[..4].copy_from_slice(&seq.to_be_bytes());
                match sock.send(&payload) {
                    Ok(_) => sent += 1,
                    // The TUN's queue is full: not sent, so not lost on the path.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(e) => return Err(LabError::sys("send loss probe", e)),
                }
                due += gap;
            }
            Ok(sent)
        });
        let sent = sender
            .join()
            .map_err(|_| LabError::Measure("loss probe thread panicked".into()))??;
        // The last datagrams are one way (half the RTT) and any queue away.
        std::thread::sleep(rtt + Duration::from_millis(500));
        Ok(sent)
    })();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = receiver
        .join()
        .map_err(|_| LabError::Measure("loss sink thread panicked".into()))?;
    let sent = sent?;
    let (received, socket_drops) = got?;
    if sent == 0 {
        return Err(LabError::Measure(
            "no loss probe datagram could be sent".into(),
        ));
    }
    Ok((sent, received, socket_drops))
}

/// Asks for a receive buffer of `bytes` (the kernel caps it at net.core.rmem_max).
fn set_rcvbuf(sock: &UdpSocket, bytes: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid socket fd and a c_int option value of the given size.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&bytes as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// UDP datagrams dropped by full receive buffers, from an snmp file of /proc.
fn snmp_rcvbuf_errors(path: &str) -> Result<u64, LabError> {
    let text = std::fs::read_to_string(path).map_err(|e| LabError::sys("read snmp counters", e))?;
    snmp_counter(&text, "Udp:", "RcvbufErrors")
        .ok_or_else(|| LabError::Measure(format!("no Udp RcvbufErrors in {path}")))
}

/// A counter of /proc/net/snmp: the line after the header line of `proto` holds the values.
fn snmp_counter(snmp: &str, proto: &str, name: &str) -> Option<u64> {
    let mut lines = snmp.lines().filter(|l| l.starts_with(proto));
    let header = lines.next()?;
    let values = lines.next()?;
    let i = header.split_whitespace().position(|h| h == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

fn measure_path(
    lab: &Lab,
    p: &Probe,
    opts: &CheckOptions,
    attempt: u32,
) -> Result<PathCheck, LabError> {
    let late0 = lab.stats().late_events;
    // Watches the host over the same window as `late0 .. late_events`; stopped on every exit.
    let probe = HostProbeRun::start();
    let (rtt, rtt_min) = measure_rtt(
        &lab.netns(&p.from)?,
        &lab.netns(&p.to)?,
        p.src,
        p.dst,
        opts.probes,
    )?;
    let mut pc = PathCheck {
        label: p.label.clone(),
        rtt_cfg_ms: p.rtt_cfg_ms,
        rtt_ms: rtt,
        rtt_min_ms: rtt_min,
        rate_mbps: p.rate_mbps,
        loss_cfg: p.loss,
        attempts: attempt,
        ..Default::default()
    };
    for cc in &opts.ccs {
        pc.tcp.push((
            cc.clone(),
            measure_tcp(lab, p, cc, opts.tcp_s, opts.omit_s)?,
        ));
    }
    if opts.udp_packets > 0 {
        pc.loss = Some(measure_loss(lab, p, opts.udp_packets)?);
    } else {
        // Counters are published every 200 ms.
        std::thread::sleep(Duration::from_millis(250));
    }
    pc.late_events = lab.stats().late_events - late0;
    pc.host = probe.finish();
    Ok(pc)
}

/// Measures every kind of path of a running lab.
pub fn check(
    lab: &Lab,
    opts: &CheckOptions,
    mut progress: impl FnMut(&str),
) -> Result<CheckReport, LabError> {
    let t0 = Instant::now();
    let cpu0 = lab.forwarder_cpu_s();
    let stats0 = lab.stats();
    let mut report = CheckReport::default();
    for p in probes(lab, opts.max_paths) {
        let mut attempt = 0;
        let mut past = Attempts::default();
        loop {
            attempt += 1;
            progress(&format!("measuring {} (attempt {attempt})", p.label));
            let mut pc = measure_path(lab, &p, opts, attempt)?;
            if past.file(&mut pc, opts.retries) {
                for f in pc.unexcused() {
                    progress(&format!("missed while stalled {}: {f}", pc.attempt_line()));
                }
                report.retried.push(pc);
                // Stalls come in spells (other load, the host): let one pass.
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            report.paths.push(pc);
            break;
        }
    }
    report.wall_s = t0.elapsed().as_secs_f64();
    if let (Some(a), Some(b)) = (cpu0, lab.forwarder_cpu_s()) {
        report.forwarder_cpu = Some((b - a) / report.wall_s);
    }
    report.tx_dropped = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    report.kernel_shaping = lab.layout().kernel_shaping;
    let s = lab.stats();
    report.late_events = s.late_events - stats0.late_events;
    report.max_lateness_ms = s.max_lateness_ns as f64 / 1e6;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 10 ms, 200 Mbit/s path whose RTT probes read 12 ms.
    fn slow_rtt(late_events: u64, met_before: Vec<Target>) -> PathCheck {
        PathCheck {
            label: "a -> e".into(),
            rtt_cfg_ms: 10.0,
            rtt_ms: 12.05,
            rtt_min_ms: 10.8,
            rate_mbps: Some(200.0),
            tcp: vec![("bbr".into(), 190.0)],
            loss: Some(UdpLoss {
                sent: 30_000,
                ..Default::default()
            }),
            late_events,
            attempts: 2,
            met_before,
            ..Default::default()
        }
    }

    #[test]
    fn a_miss_is_excused_only_when_stalled_and_met_before() {
        assert_eq!(
            slow_rtt(21_315, vec![Target::Rtt]).failures(),
            Vec::<String>::new()
        );
        // Without a stall the miss is the emulator's.
        assert_eq!(slow_rtt(0, vec![Target::Rtt]).failures().len(), 1);
        // Stalled, but never met: not shown.
        assert_eq!(slow_rtt(21_315, vec![Target::Rate]).failures().len(), 1);
        let r = CheckReport {
            paths: vec![slow_rtt(21_315, vec![Target::Rtt])],
            ..Default::default()
        };
        assert!(r.failures().is_empty());
        assert!(r.render().contains(EXCUSED), "{}", r.render());
    }

    /// Attempt of the 100 Mbit/s, 100 ms path of `lab_root::fidelity`: bbr carried `bbr`
    /// Mbit/s, with `late_events` and what the host probe saw.
    fn rate_attempt(bbr: f64, late_events: u64, host: Option<HostProbe>) -> PathCheck {
        PathCheck {
            label: "a -> b (a-b)".into(),
            rtt_cfg_ms: 100.0,
            rtt_ms: 100.6,
            rtt_min_ms: 100.4,
            rate_mbps: Some(100.0),
            tcp: vec![("cubic".into(), 96.0), ("bbr".into(), bbr)],
            loss: Some(UdpLoss {
                sent: 30_000,
                ..Default::default()
            }),
            late_events,
            host,
            ..Default::default()
        }
    }

    /// The host probe of a 20 s attempt: `late` wakeups adding up to `stalled_ms`.
    fn probe(late: u64, stalled_ms: f64, worst_ms: f64) -> Option<HostProbe> {
        Some(HostProbe {
            secs: 20.0,
            wakeups: 18_000,
            late_wakeups: late,
            stalled_ms,
            max_late_ms: worst_ms,
        })
    }

    /// A host that stalled (340 ms of 20 s in spells over 10 ms, worst 180 ms).
    fn stalled() -> Option<HostProbe> {
        probe(14, 340.0, 180.0)
    }

    /// A punctual host.
    fn punctual() -> Option<HostProbe> {
        probe(0, 0.0, 0.9)
    }

    /// Files `attempts` as [`check`] does with `retries`: the last attempt in `paths`, the
    /// earlier ones in `retried`. Panics if `check` would have measured more.
    fn judge(attempts: Vec<PathCheck>, retries: u32) -> CheckReport {
        let mut past = Attempts::default();
        let mut report = CheckReport::default();
        let n = attempts.len();
        for (i, mut pc) in attempts.into_iter().enumerate() {
            pc.attempts = i as u32 + 1;
            if past.file(&mut pc, retries) {
                report.retried.push(pc);
            } else {
                assert_eq!(i + 1, n, "attempt {} was the last", i + 1);
                report.paths.push(pc);
                return report;
            }
        }
        panic!("check would measure again after attempt {n}");
    }

    #[test]
    fn the_host_stalls_when_a_wakeup_is_very_late_or_late_ones_add_up() {
        let mut p = HostProbe {
            secs: 20.0,
            ..Default::default()
        };
        assert!(!p.stalled());
        for _ in 0..18_000 {
            p.record(0.08);
        }
        // The guest's own scheduling (up to 10 ms) is not the host's stall.
        for _ in 0..50 {
            p.record(9.9);
        }
        assert_eq!((p.late_wakeups, p.stalled()), (0, false), "{p}");
        // One 49 ms hiccup in 20 s: neither long enough nor 1% of the time.
        p.record(49.0);
        assert_eq!((p.late_wakeups, p.stalled()), (1, false), "{p}");
        // Recurring spells: 49 + 14 x 11 ms = 203 ms, 1% of 20 s.
        for _ in 0..14 {
            p.record(11.0);
        }
        assert!(p.stalled(), "{p}");
        // One wakeup half the rate path's round trip late.
        let mut q = HostProbe {
            secs: 20.0,
            ..Default::default()
        };
        q.record(HOST_STALL_MS);
        assert!(q.stalled(), "{q}");
    }

    #[test]
    fn a_path_the_host_stalled_in_every_attempt_is_not_judged() {
        // CI of 2026-11-2x: six attempts, bbr 80.9/73.0/80.8/43.9/72.3/87.4 Mbit/s with
        // 8,300-18,202 forwarder events late, here with the host probe stalled in each.
        let runs = [(80.9, 8_300), (73.0, 12_000), (80.8, 18_202)];
        let more = [(43.9, 15_000), (72.3, 9_000), (87.4, 10_000)];
        let attempts: Vec<PathCheck> = runs
            .iter()
            .chain(&more)
            .map(|&(m, late)| rate_attempt(m, late, stalled()))
            .collect();
        let r = judge(attempts, 5);
        assert_eq!(
            r.retried.len(),
            5,
            "host-stalled misses are measured again first"
        );
        let last = &r.paths[0];
        assert!(last.not_judged());
        assert!(r.failures().is_empty(), "{:?}", r.failures());
        let table = r.render();
        assert_eq!(r.not_judged().len(), 1, "{table}");
        assert!(r.not_judged()[0].contains("bbr 87.4"), "{table}");
        assert!(table.contains("NOT JUDGED: a -> b"), "{table}");
        assert!(table.contains(NOT_JUDGED), "{table}");
        assert!(table.contains("1 path(s) NOT JUDGED"), "{table}");
        // One attempt allowed: it was every attempt.
        assert!(judge(vec![rate_attempt(80.9, 0, stalled())], 0).paths[0].not_judged());
    }

    #[test]
    fn a_late_forwarder_with_a_punctual_host_still_fails() {
        let attempts = (0..6)
            .map(|_| rate_attempt(80.0, 12_000, punctual()))
            .collect();
        let r = judge(attempts, 5);
        assert_eq!(r.retried.len(), 5);
        assert!(!r.paths[0].not_judged());
        assert_eq!(r.failures().len(), 1, "{}", r.render());
        assert!(r.not_judged().is_empty());
        assert!(
            r.render().contains("FAIL: a -> b (a-b): bbr 80.0"),
            "{}",
            r.render()
        );
        // Without a probe (no real-time priority) no host stall is assumed.
        let r = judge(vec![rate_attempt(80.0, 12_000, None)], 0);
        assert_eq!(r.failures().len(), 1, "{}", r.render());
        // Nor without late events: a miss with a punctual forwarder is not measured again.
        let r = judge(vec![rate_attempt(80.0, 0, punctual())], 5);
        assert_eq!(r.failures().len(), 1, "{}", r.render());
    }

    #[test]
    fn one_attempt_without_a_host_stall_makes_the_path_judged() {
        // The first attempt missed with only the forwarder late, the others with the host
        // stalled: the emulator had one fair attempt and missed.
        let mut attempts = vec![rate_attempt(80.0, 9_000, punctual())];
        attempts.extend((0..5).map(|_| rate_attempt(80.0, 9_000, stalled())));
        let r = judge(attempts, 5);
        assert!(r.paths[0].host_stalled() && !r.paths[0].not_judged());
        assert_eq!(r.failures().len(), 1, "{}", r.render());
        // Host stalls, then a last attempt without one that misses again: fails.
        let mut attempts: Vec<PathCheck> = (0..5)
            .map(|_| rate_attempt(80.0, 9_000, stalled()))
            .collect();
        attempts.push(rate_attempt(85.0, 9_000, punctual()));
        let r = judge(attempts, 5);
        assert_eq!(r.failures().len(), 1, "{}", r.render());
        // ... or that meets: passes, judged.
        let mut attempts = vec![rate_attempt(70.0, 9_000, stalled())];
        attempts.push(rate_attempt(95.0, 9_000, punctual()));
        let r = judge(attempts, 5);
        assert!(r.failures().is_empty() && r.not_judged().is_empty());
        assert!(r.render().contains("all targets met"), "{}", r.render());
        // A host-stalled miss without forwarder late events is measured again too.
        let r = judge(
            vec![
                rate_attempt(70.0, 0, stalled()),
                rate_attempt(95.0, 0, punctual()),
            ],
            1,
        );
        assert_eq!((r.retried.len(), r.failures().len()), (1, 0));
    }

    /// Attempt of the 100 Mbit/s, 100 ms, 1% loss path of `lab_root::fidelity`.
    fn lossy_attempt(cubic: f64, bbr: f64, late_events: u64, host: Option<HostProbe>) -> PathCheck {
        PathCheck {
            label: "a -> c (a-c)".into(),
            loss_cfg: 0.01,
            tcp: vec![("cubic".into(), cubic), ("bbr".into(), bbr)],
            loss: Some(UdpLoss {
                sent: 30_000,
                lost: 290,
                random_drops: 290,
                ..Default::default()
            }),
            ..rate_attempt(bbr, late_events, host)
        }
    }

    #[test]
    fn a_lossy_path_must_show_the_cubic_bbr_contrast() {
        // Usual figures on an idle VM: met, and no rate target on a lossy path.
        let r = judge(vec![lossy_attempt(1.4, 96.0, 0, punctual())], 5);
        assert!(r.failures().is_empty(), "{}", r.render());
        assert!(
            r.render().contains("ok (>= 5x cubic, >= 25%)"),
            "{}",
            r.render()
        );
        // CI of 2026-11-24 (the last session's red run): bbr 14.3 against cubic 1.4 while the
        // host stalled 3.4 s; the contrast test outside `check` failed without a second attempt.
        // Now it is a target: measured again, and passes when a later attempt meets it.
        let r = judge(
            vec![
                lossy_attempt(1.4, 14.3, 11_879, stalled()),
                lossy_attempt(1.3, 95.0, 9_000, punctual()),
            ],
            5,
        );
        assert_eq!(
            (r.retried.len(), r.failures().len()),
            (1, 0),
            "{}",
            r.render()
        );
        // Stalled in every attempt: not judged; with a fair attempt that misses: fails.
        let r = judge(vec![lossy_attempt(1.4, 14.3, 11_879, stalled()); 2], 1);
        assert!(r.paths[0].not_judged() && r.failures().is_empty());
        let r = judge(vec![lossy_attempt(1.4, 14.3, 0, punctual())], 5);
        assert_eq!(r.failures().len(), 1, "{}", r.render());
        assert!(r.failures()[0].contains("bbr 14.3"), "{:?}", r.failures());
        // An emulator whose loss hits bbr as hard as cubic fails the ratio, whatever the share.
        assert!(!contrast_ok(100.0, 20.0, 90.0) && contrast_ok(100.0, 1.4, 25.0));
        assert!(!contrast_ok(50.0, 0.3, 12.0), "under 25% of 50 Mbit/s");
    }

    #[test]
    fn the_host_probe_stops_with_its_attempt() {
        let run = HostProbeRun::start();
        std::thread::sleep(Duration::from_millis(30));
        let t = Instant::now();
        let p = run.finish();
        assert!(
            t.elapsed() < Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        // None where this test may not use SCHED_FIFO.
        if let Some(p) = p {
            assert!(p.wakeups > 0 && p.secs < 1.0, "{p}");
        }
        // Dropped without `finish` (an attempt that failed): stopped and joined too.
        drop(HostProbeRun::start());
    }

    #[test]
    fn the_receiving_sockets_drops_are_not_the_paths_loss() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors \
                    OutDatagrams RcvbufErrors SndbufErrors\nUdp: 29510 0 470 1 470 0\n\
                    UdpLite: InDatagrams RcvbufErrors\nUdpLite: 0 9\n";
        assert_eq!(snmp_counter(snmp, "Udp:", "RcvbufErrors"), Some(470));
        assert_eq!(snmp_counter(snmp, "Udp:", "InDatagrams"), Some(29510));
        assert_eq!(snmp_counter(snmp, "Udp:", "Nonesuch"), None);
        assert_eq!(
            snmp_counter("Udp: RcvbufErrors\n", "Udp:", "RcvbufErrors"),
            None
        );

        // A lossless path whose receiver was stalled: 470 of 30000 dropped at its socket.
        let mut p = slow_rtt(0, vec![]);
        p.rtt_ms = 10.1;
        p.tcp = vec![("bbr".into(), 195.0)];
        let stalled = UdpLoss {
            sent: 30_000,
            lost: 470,
            socket_drops: 470,
            ..Default::default()
        };
        p.loss = Some(stalled);
        assert_eq!(stalled.path_loss(), 0.0);
        assert!(p.failures().is_empty(), "{:?}", p.failures());
        // Lost in the emulator's queues: not random loss, but a miss of its own...
        p.loss = Some(UdpLoss {
            socket_drops: 0,
            queue_drops: 470,
            ..stalled
        });
        let missed: Vec<Target> = p.missed().into_iter().map(|(t, _)| t).collect();
        assert_eq!(missed, vec![Target::Queue]);
        assert_eq!(p.failures().len(), 1, "{:?}", p.failures());
        let r = CheckReport {
            paths: vec![p.clone()],
            ..Default::default()
        };
        assert!(r.render().contains("emulator queue 470"), "{}", r.render());
        // ... excused when the forwarder ran late (it released a stall's arrivals at once).
        p.late_events = 900;
        assert!(p.failures().is_empty(), "{:?}", p.failures());
        // Lost without a counter to explain it: the path's random loss is off.
        p.loss = Some(UdpLoss {
            queue_drops: 0,
            ..stalled
        });
        p.loss.as_mut().unwrap().socket_drops = 0;
        assert_eq!(p.failures().len(), 1, "{:?}", p.failures());
    }
}
