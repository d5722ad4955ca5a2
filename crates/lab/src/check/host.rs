//! The host probe: whether the machine under the lab stalled while something was measured,
//! so that a miss caused by the hypervisor is told apart from the emulator's own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
