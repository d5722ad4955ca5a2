//! Window and pacing rate: what the path carries, blind to random loss.
//!
//! Loss-based control (cubic) collapses on a long path with random loss. BBR ignores loss but
//! paces at the rate the path *delivered*, which random loss shrinks (at 5% it sends 0.95 of
//! the link, and loses 5% of that), and TCP's recovery slows it further. Here:
//! - the path's rate is what an interval (at least one round trip) got acknowledged, over
//!   the interval's span on our clock or on the receiver's if that is longer (ACKs that
//!   waited behind the other direction's data arrive bunched), the largest of the last
//!   [`FILTER_LEN`] intervals;
//! - the window is that rate times (the smallest RTT + a target queue delay of 5% of the RTT,
//!   at least 3 ms + how long the last interval's ACKs waited on the way back, at most one
//!   more target: the queue of another of us sending the other way), times a factor
//!   (`boost`) that rises while the queue stays under half the target (3% a round trip,
//!   doubling each round it stays short, up to [`MAX_BOOST`]) and falls 5% while it is over
//!   twice the target. The
//!   factor is what makes up for random loss (about 1 / (1 - loss)), found from the queue,
//!   not from loss counts, which cannot tell random loss from overflow. Being a window, it
//!   is self-clocked: a rate-only version oscillated, since delay feedback comes a round
//!   trip late. The bottleneck keeps a queue of one to two targets, so it never runs dry (a
//!   few ms of host stall do not empty it) and stays far below a deep queue's limit;
//! - pacing runs at 1.25 times window / RTT, so packets are spread but the window limits;
//! - **startup** grows the window 1.5x per round trip until every queue sample of the last
//!   [`QUEUE_SPAN`] is beyond the target (or the acknowledged rate stops growing by a
//!   quarter for three intervals); the window then becomes what was delivered over the last
//!   [`STARTUP_SPAN`] times (RTT + target);
//! - an interval whose loss is above twice the usual level plus 1% lowers the factor (a
//!   queue too short to show as delay overflowing), and one that loses more than
//!   [`HEAVY_LOSS`] cuts the rate to 0.7x.
//!
//! The queue delay of an interval is its smallest *forward* delay sample less the smallest
//! ever seen: the time the peer received a packet (its clock, stamped in the ACK) less the
//! time it was sent (ours), which is the one-way delay plus a constant offset that the floor
//! cancels. Forward, because a path that carries data both ways (a broadcast between sites
//! does) queues each side's ACKs behind the other side's data: read from the round trip,
//! that queue looks like one's own, so each side yields to the other until one of them
//! starves (one direction at 0.53-0.67 of the link in the lab, docs/benchmarks.md). Without
//! forward samples (none yet) the round trip stands in. The smallest sample of an interval,
//! so a stall of the host (late timers, a descheduled receiver) that delays a few samples
//! does not read as a queue. A floor is the smallest sample, replaced by the smallest of the
//! last [`FLOOR_EXPIRY`] when none of them came near it (which also absorbs clock drift).
//! Delay never takes the factor below 1 (at 1 the window cannot hold a queue beyond two
//! targets), so a floor read too low cannot shrink the window round after round. Known
//! limits: a bottleneck queue shorter than about twice the target overflows before its delay
//! shows (see the `paced_sim` tests); a delay-based sender yields to loss-based TCP sharing
//! its bottleneck; and with random loss on a path loaded both ways each side keeps about
//! 0.89-0.92 of the link in the simulator, where one way keeps 0.94-0.95.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Shortest control interval: shorter paths decide on a few ms of samples.
pub const MIN_INTERVAL: Duration = Duration::from_millis(25);
/// Loss fraction of an interval that counts as congestion.
pub const HEAVY_LOSS: f64 = 0.3;
/// Lowest rate the controller goes to, bytes/s.
pub const MIN_RATE: f64 = 16_000.0;
/// Intervals the carried-rate maximum is taken over.
pub const FILTER_LEN: usize = 6;
/// Startup: ACKs over which the delivery rate is taken on leaving it.
pub const STARTUP_SPAN: Duration = Duration::from_millis(50);
/// Startup: RTT samples that must all show a queue to leave it (a shorter stall of the host
/// does not end startup; a longer one does, and steady state's growth makes up for it).
pub const QUEUE_SPAN: Duration = Duration::from_millis(10);
/// The window factor's first growth step in steady state.
pub const GROWTH_STEP: f64 = 0.03;
/// How long the RTT floor stands without a sample near it.
pub const FLOOR_EXPIRY: Duration = Duration::from_secs(10);
/// The window factor's ceiling: random loss of up to a third needs no more. Higher lets a
/// window that ACKs held up behind the other direction's data left idle grow far past the
/// path and flood it once they come: two streams both ways over a 32 Mbit/s, 100 ms path
/// with 1% loss keep 0.85 of the link each with 2.0 (200+ queue drops), 0.88 with 1.5, 0.89
/// with 1.25 (simulator); but 1.25 drops 12% of packets where the bottleneck's queue is too
/// short to show delay, against 7% with 1.5 or 2.0.
pub const MAX_BOOST: f64 = 1.5;
/// Smallest window, bytes (a few datagrams, so a lost one is found by the ones after it).
pub const MIN_WINDOW: f64 = 8.0 * 1500.0;

/// Startup or steady state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Doubling the window each round trip.
    Startup,
    /// Window from the carried rate.
    Steady,
}

/// The rate and window controller of one connection.
#[derive(Debug, Clone)]
pub struct RateControl {
    phase: Phase,
    max_rate: f64,
    initial_rate: f64,
    /// Round-trip floor, ns: sizes the window and the pacing.
    rtt_floor: Floor,
    /// Forward-delay floor, us in the unwrapped stamp space of `fwd_origin`.
    fwd_floor: Floor,
    /// The first forward sample: later ones are unwrapped relative to it.
    fwd_origin: Option<u32>,
    /// The forward sample of the ACK being handled, taken by the next [`Self::on_ack`].
    fwd_sample: Option<i64>,
    /// The peer's receive stamp of the latest forward sample, and of the last one before
    /// the interval began: the interval's span on the receiver's clock.
    recv_last: Option<u32>,
    recv_start: Option<u32>,
    /// Carried rate of the last intervals, bytes/s.
    carried: VecDeque<f64>,
    /// The window, bytes.
    window: f64,
    /// Steady state: the window's factor over rate x (RTT + target), raised while the queue
    /// stays short and lowered when it is long: it makes up for what random loss takes
    /// from the carried rate (about 1 / (1 - loss)) without trusting loss counts.
    boost: f64,
    /// Steady state: the loss fraction of an ordinary interval (moving average).
    usual_loss: f64,
    /// Steady state: the factor's next growth, doubled each interval the queue stays short.
    step: f64,
    /// Startup: the best carried rate and intervals since it last grew by a quarter.
    best: f64,
    flat: u32,
    // The interval being measured: opened at `start`, closed on the first ACK one interval
    // length later.
    start: Instant,
    /// The smallest queue sample of the interval.
    interval_queue: Option<Duration>,
    /// The last interval's queue delay.
    queue: Duration,
    /// The interval's round trips less their forward queue and the RTT floor, added up,
    /// and how many: how long ACKs waited on the way back (behind the other direction's
    /// data).
    interval_back: (Duration, u32),
    /// The last interval's mean of those, at most the target (kept while an interval has
    /// no sample).
    back: Duration,
    acked: u64,
    lost: u64,
    app_limited: bool,
    acks_seen: bool,
    /// Startup: recent ACKs (time, bytes acknowledged so far, queue sample), the last 50 ms.
    recent: VecDeque<(Instant, u64, Option<Duration>)>,
    acked_total: u64,
}

impl RateControl {
    /// A controller starting at `rate` bytes/s, never above `max_rate`.
    pub fn new(rate: f64, max_rate: f64, now: Instant) -> Self {
        let max_rate = max_rate.max(MIN_RATE);
        let initial_rate = rate.clamp(MIN_RATE, max_rate);
        RateControl {
            phase: Phase::Startup,
            max_rate,
            initial_rate,
            rtt_floor: Floor::new(now),
            fwd_floor: Floor::new(now),
            fwd_origin: None,
            fwd_sample: None,
            recv_last: None,
            recv_start: None,
            carried: VecDeque::new(),
            // What the initial rate sends in 100 ms, until an RTT is known.
            window: (initial_rate * 0.1).max(MIN_WINDOW),
            boost: 1.0,
            usual_loss: 0.0,
            step: GROWTH_STEP,
            best: 0.0,
            flat: 0,
            start: now,
            interval_queue: None,
            queue: Duration::ZERO,
            interval_back: (Duration::ZERO, 0),
            back: Duration::ZERO,
            acked: 0,
            lost: 0,
            app_limited: false,
            acks_seen: false,
            recent: VecDeque::new(),
            acked_total: 0,
        }
    }

    /// What the path carries, bytes/s (the initial rate until measured).
    pub fn path_rate(&self) -> f64 {
        match self.carried.iter().cloned().reduce(f64::max) {
            Some(c) => c,
            None => self
                .initial_rate
                .min(self.window / self.rtt().as_secs_f64()),
        }
    }

    /// The pacing rate, bytes/s.
    pub fn rate(&self) -> f64 {
        let r = match self.phase {
            // Fast enough that the window, doubling, is what limits.
            Phase::Startup => 2.0 * self.window / self.rtt().as_secs_f64(),
            Phase::Steady => 1.25 * self.window / self.rtt().as_secs_f64(),
        };
        r.clamp(MIN_RATE, self.max_rate)
    }

    /// Bytes that may be in flight.
    pub fn window(&self) -> u64 {
        self.window as u64
    }

    /// Startup or steady.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The window's factor over rate x (RTT + target) (see the module's doc).
    pub fn boost(&self) -> f64 {
        self.boost
    }

    /// The queue delay of the last interval (forward, see the module's doc).
    pub fn queue(&self) -> Duration {
        self.queue
    }

    /// The smallest RTT seen.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.rtt_floor.min.map(|n| Duration::from_nanos(n as u64))
    }

    fn rtt(&self) -> Duration {
        self.min_rtt().unwrap_or(Duration::from_millis(100))
    }

    /// The queue delay the controller aims at: 5% of the path's RTT, at least 3 ms.
    pub fn target(&self) -> Duration {
        (self.rtt() / 20).max(Duration::from_millis(3))
    }

    /// The sender had window and pacing room and nothing to send: the rate was not the limit.
    pub fn on_app_limited(&mut self) {
        self.app_limited = true;
    }

    /// Nothing was acknowledged for a probe timeout: the path may be gone, so only a few
    /// datagrams go out until an ACK says otherwise (the next interval restores the window).
    pub fn on_timeout(&mut self) {
        self.window = MIN_WINDOW;
    }

    /// The ACK about to be handled ([`Self::on_ack`]) acknowledged a packet that the peer
    /// received at `recv` microseconds of its clock and that was sent at `sent` of ours
    /// (both wrapping). Only differences between stamps count.
    pub fn on_forward_delay(&mut self, now: Instant, recv: u32, sent: u32) {
        self.recv_last = Some(recv);
        let stamp = recv.wrapping_sub(sent);
        let origin = *self.fwd_origin.get_or_insert(stamp);
        // Samples lie within 35 minutes of the first (the floor moves with drift), so the
        // signed difference unwraps them.
        let us = i64::from(stamp.wrapping_sub(origin) as i32);
        self.fwd_floor
            .observe(now, us, 2 * self.target().as_micros() as i64);
        self.fwd_sample = Some(us);
    }

    /// An ACK came: `acked` and `lost` bytes newly resolved, an RTT sample if it had one.
    pub fn on_ack(&mut self, now: Instant, acked: u64, lost: u64, rtt: Option<Duration>) {
        if !self.acks_seen {
            // Feedback starts now.
            self.acks_seen = true;
            self.start = now;
        }
        self.acked += acked;
        self.lost += lost;
        self.acked_total += acked;
        let fwd_queue = match (self.fwd_sample.take(), self.fwd_floor.min) {
            (Some(f), Some(m)) => Some(Duration::from_micros((f - m).max(0) as u64)),
            _ => None,
        };
        if let Some(r) = rtt {
            // Less our own queue: a path busy both ways may keep a queue for longer than
            // FLOOR_EXPIRY, and the floor must not rise with it.
            let r = r.saturating_sub(fwd_queue.unwrap_or(Duration::ZERO));
            let band = 2 * self.target().as_nanos() as i64;
            self.rtt_floor.observe(now, r.as_nanos() as i64, band);
        }
        let queue = fwd_queue.or_else(|| rtt.zip(self.min_rtt()).map(|(r, m)| r.saturating_sub(m)));
        if let Some(q) = queue {
            self.interval_queue = Some(self.interval_queue.map_or(q, |m| m.min(q)));
            if let (Some(r), Some(m)) = (rtt, self.min_rtt()) {
                self.interval_back.0 += r.saturating_sub(q).saturating_sub(m);
                self.interval_back.1 += 1;
            }
        }
        if self.phase == Phase::Startup {
            // 1.5x per round trip: the queue signal comes a round trip late, so the window
            // overshoots by the growth of one round (2x would double the path's BDP).
            self.window = (self.window + acked as f64 / 2.0).min(self.max_rate * 4.0);
            self.recent.push_back((now, self.acked_total, queue));
            while self
                .recent
                .front()
                .is_some_and(|f| now.saturating_duration_since(f.0) > STARTUP_SPAN)
            {
                self.recent.pop_front();
            }
            self.check_startup(now);
        }
        if now.saturating_duration_since(self.start) >= self.rtt().max(MIN_INTERVAL) {
            self.end_interval(now);
        }
    }

    /// Leaves startup as soon as every queue sample of the last [`QUEUE_SPAN`] is beyond
    /// the target; the window becomes what the path delivered over [`STARTUP_SPAN`].
    fn check_startup(&mut self, now: Instant) {
        let (Some(min), Some(first)) = (self.min_rtt(), self.recent.front()) else {
            return;
        };
        if now.saturating_duration_since(first.0) < QUEUE_SPAN {
            return;
        }
        let span_min = self
            .recent
            .iter()
            .filter(|r| now.saturating_duration_since(r.0) <= QUEUE_SPAN)
            .filter_map(|r| r.2)
            .min();
        if span_min.is_none_or(|q| q <= self.target()) {
            return;
        }
        let secs = now.saturating_duration_since(first.0).as_secs_f64();
        let delivered = (self.acked_total - first.1) as f64 / secs.max(1e-6);
        self.phase = Phase::Steady;
        self.carried.clear();
        self.carried.push_back(delivered);
        self.window = (delivered * (min + self.target()).as_secs_f64()).max(MIN_WINDOW);
        self.recent.clear();
    }

    fn end_interval(&mut self, now: Instant) {
        // The interval's length on our clock, or on the receiver's if longer: ACKs that
        // waited in a queue behind the other direction's data arrive bunched, and over the
        // ACKs' span alone the path would seem to carry more than it does (BBR takes the
        // longer of the send and ACK spans for the same reason).
        let mut secs = now.saturating_duration_since(self.start).as_secs_f64();
        if let (Some(a), Some(b)) = (self.recv_start, self.recv_last) {
            secs = secs.max(f64::from(b.wrapping_sub(a)) * 1e-6);
        }
        self.recv_start = self.recv_last;
        let resolved = self.acked + self.lost;
        let loss = if resolved > 0 {
            self.lost as f64 / resolved as f64
        } else {
            0.0
        };
        let queue = self.interval_queue.unwrap_or(Duration::ZERO);
        self.queue = queue;
        let target = self.target();
        if let (sum, n @ 1..) = std::mem::take(&mut self.interval_back) {
            self.back = (sum / n).min(target);
        }
        if loss > HEAVY_LOSS {
            let cut = 0.7 * self.path_rate();
            self.carried.clear();
            self.carried.push_back(cut);
            self.phase = Phase::Steady;
            self.boost = 1.0;
        } else if self.acked > 0 {
            let carried = self.acked as f64 / secs.max(1e-6);
            self.carried.push_back(carried);
            if self.carried.len() > FILTER_LEN {
                self.carried.pop_front();
            }
            match self.phase {
                Phase::Startup => {
                    self.usual_loss += (loss - self.usual_loss) / 2.0;
                    if carried > 1.25 * self.best {
                        self.best = carried;
                        self.flat = 0;
                    } else if !self.app_limited && self.acked as f64 >= 0.5 * self.window {
                        // Flat while using the window: the path is full. Intervals that
                        // carried little (the handshake's round trips) say nothing.
                        self.flat += 1;
                    }
                    if queue > target || self.flat >= 3 {
                        self.phase = Phase::Steady;
                    }
                }
                Phase::Steady => {
                    // The growth step starts over unless this interval grows again.
                    let step = std::mem::replace(&mut self.step, GROWTH_STEP);
                    // Loss well above its usual level while the window grew: a queue too
                    // short to show as delay is overflowing.
                    let spike = resolved >= 20 * 1400 && loss > 2.0 * self.usual_loss + 0.01;
                    if spike {
                        self.boost = (self.boost * 0.95).max(0.5);
                    } else if queue > 2 * target {
                        // Not below 1: at 1 the window holds what the path carries for a
                        // round trip plus the target, which cannot build a queue beyond it.
                        // Delay read against too low a floor (a host stall's sample) would
                        // otherwise shrink the window round after round.
                        self.boost = (self.boost * 0.95).max(1.0);
                    } else if queue < target / 2 && !self.app_limited {
                        // Room on the path: grow, faster each interval it stays (3%, 6%,
                        // 12%, ... up to 25%), so a window left small (an early end of
                        // startup, a path that got faster) is back within a few round trips.
                        self.boost = (self.boost * (1.0 + step)).min(MAX_BOOST);
                        self.step = (step * 2.0).min(0.25);
                    }
                    self.usual_loss += (loss - self.usual_loss) / 8.0;
                }
            }
        }
        if self.phase == Phase::Steady {
            // The loop is the RTT, our queue (the target) and, on a path loaded both ways,
            // the queue our ACKs wait in behind the other side's data: up to one more target
            // (what the other side keeps where it is one of us).
            let rtt = (self.rtt() + self.back + target).as_secs_f64();
            self.window = (self.path_rate() * rtt * self.boost).max(MIN_WINDOW);
        }
        self.start = now;
        self.interval_queue = None;
        self.acked = 0;
        self.lost = 0;
        self.app_limited = false;
    }
}

/// The smallest of a delay's samples: kept unless for [`FLOOR_EXPIRY`] no sample came within
/// `band` of it (more than the queue the window keeps), when the smallest of that time
/// becomes the floor (a route that got longer, a sample read too low, clocks that drift).
#[derive(Debug, Clone)]
struct Floor {
    min: Option<i64>,
    /// When a sample last came within the band, and the smallest sample since.
    seen: Instant,
    recent_min: Option<i64>,
}

impl Floor {
    fn new(now: Instant) -> Self {
        Floor {
            min: None,
            seen: now,
            recent_min: None,
        }
    }

    fn observe(&mut self, now: Instant, x: i64, band: i64) {
        let Some(m) = self.min else {
            self.min = Some(x);
            self.seen = now;
            return;
        };
        if x <= m {
            self.min = Some(x);
        }
        if x <= m + band {
            self.seen = now;
            self.recent_min = None;
            return;
        }
        self.recent_min = Some(self.recent_min.map_or(x, |r| r.min(x)));
        if now.saturating_duration_since(self.seen) > FLOOR_EXPIRY {
            self.min = self.recent_min.take();
            self.seen = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fluid model of one bottleneck: `link` bytes/s, base RTT, a queue, random loss after
    /// it. Returns the controller and (time, queue delay) every ms.
    fn run(link: f64, base: Duration, loss: f64, secs: f64) -> (RateControl, Vec<(f64, f64)>) {
        run_with(link, base, loss, secs, None)
    }

    /// `run`, with one RTT sample `(at s, rtt)` that no packet had (a host stall's).
    fn run_with(
        link: f64,
        base: Duration,
        loss: f64,
        secs: f64,
        bogus: Option<(f64, Duration)>,
    ) -> (RateControl, Vec<(f64, f64)>) {
        let mut bogus = bogus;
        let t0 = Instant::now();
        let mut rc = RateControl::new(1.25e6, 1e12, t0);
        let step = Duration::from_millis(1);
        let dt = step.as_secs_f64();
        let (mut queue, mut inflight) = (0.0f64, 0.0f64);
        let mut series = Vec::new();
        let mut t = Duration::ZERO;
        // What leaves the queue comes back one base RTT later: (acked, lost, rtt) per ms.
        let n = (base.as_millis() as usize).max(1);
        let mut ring = vec![(0.0f64, 0.0f64, Duration::ZERO); n];
        let mut i = 0;
        while t.as_secs_f64() < secs {
            let send = (rc.rate() * dt).min((rc.window() as f64 - inflight).max(0.0));
            queue += send;
            inflight += send;
            let out = queue.min(link * dt);
            queue -= out;
            let qdelay = Duration::from_secs_f64(queue / link);
            let (a, l, r) = ring[i];
            ring[i] = (out * (1.0 - loss), out * loss, base + qdelay);
            i = (i + 1) % n;
            t += step;
            inflight -= a + l;
            if a + l > 0.0 {
                rc.on_ack(t0 + t, a as u64, l as u64, Some(r));
            }
            if let Some((_, rtt)) = bogus.filter(|b| t.as_secs_f64() >= b.0) {
                rc.on_ack(t0 + t, 0, 0, Some(rtt));
                bogus = None;
            }
            series.push((t.as_secs_f64(), queue / link));
            if std::env::var_os("RATE_TRACE").is_some() && t.as_millis().is_multiple_of(100) {
                eprintln!(
                    "{:>6.2} s rate {:>6.1} Mbit/s window {:>8.0} queue {:>5.1} ms {:?}",
                    t.as_secs_f64(),
                    rc.rate() * 8e-6,
                    rc.window(),
                    queue / link * 1e3,
                    rc.phase()
                );
            }
        }
        (rc, series)
    }

    /// Fraction of ms after `from` s with a non-empty queue, and the longest queue in s.
    fn busy_and_max(series: &[(f64, f64)], from: f64) -> (f64, f64) {
        let late: Vec<f64> = series.iter().filter(|s| s.0 > from).map(|s| s.1).collect();
        let busy = late.iter().filter(|q| **q > 0.0).count() as f64 / late.len() as f64;
        (busy, late.iter().cloned().fold(0.0, f64::max))
    }

    #[test]
    fn fills_a_lossy_long_path_with_a_short_queue() {
        let link = 12.5e6; // 100 Mbit/s
        let (rc, series) = run(link, Duration::from_millis(100), 0.05, 20.0);
        assert_eq!(rc.phase(), Phase::Steady);
        // After 3 s the queue never empties (the link stays busy) and stays short.
        let (busy, max_q) = busy_and_max(&series, 3.0);
        assert!(
            busy > 0.99,
            "link idle {:.1}% of the time",
            100.0 * (1.0 - busy)
        );
        assert!(max_q < 0.02, "queue reached {:.1} ms", max_q * 1e3);
        // Random loss did not pull the window below what fills the path.
        let bdp = link * 0.1;
        assert!(rc.window() as f64 > bdp, "window {} < {bdp}", rc.window());
    }

    #[test]
    fn short_paths_and_clean_paths_settle_too() {
        for (base, loss) in [(10, 0.0), (10, 0.01), (250, 0.02)] {
            let link = 25e6;
            let (rc, series) = run(link, Duration::from_millis(base), loss, 20.0);
            let (busy, max_q) = busy_and_max(&series, 5.0);
            assert!(
                busy > 0.99,
                "{base} ms: link idle {:.1}%",
                100.0 * (1.0 - busy)
            );
            assert!(max_q < 0.03, "{base} ms: queue {:.1} ms", max_q * 1e3);
            assert!(
                rc.path_rate() > 0.95 * link,
                "{base} ms: {:.2e}",
                rc.path_rate()
            );
        }
    }

    #[test]
    fn an_rtt_floor_read_too_low_does_not_starve_the_path() {
        let link = 12.5e6;
        let base = Duration::from_millis(100);
        // 4.5 ms low (less than the target): the window holds.
        let (_, series) = run_with(link, base, 0.0, 20.0, Some((3.0, base - base / 22)));
        let (busy, _) = busy_and_max(&series, 5.0);
        assert!(busy > 0.95, "link idle {:.1}%", 100.0 * (1.0 - busy));
        // 20 ms low: the floor is replaced within FLOOR_EXPIRY and the link fills again.
        let (rc, series) = run_with(link, base, 0.0, 30.0, Some((3.0, base * 4 / 5)));
        let (busy, _) = busy_and_max(&series, 16.0);
        assert!(busy > 0.95, "link idle {:.1}%", 100.0 * (1.0 - busy));
        assert!(rc.min_rtt() >= Some(base), "{:?}", rc.min_rtt());
    }

    /// ACKs that wait behind the other direction's data stretch the round trip, not the
    /// forward delay: the queue is read from the latter.
    #[test]
    fn a_queue_on_the_way_back_is_not_ours() {
        let t0 = Instant::now();
        let mut rc = RateControl::new(4e6, 1e12, t0);
        let base = Duration::from_millis(100);
        let mut t = t0;
        let mut sent = 0u32;
        for i in 0..180u32 {
            t += Duration::from_millis(50);
            sent = sent.wrapping_add(50_000);
            // After the first second: 30 ms of our own queue on the way there, 40 ms of
            // someone else's on the way back. The peer's clock is offset (and wraps).
            let (fwd, back) = if i < 20 { (0, 0) } else { (30, 40) };
            let recv = sent
                .wrapping_add(50_000 + fwd * 1000)
                .wrapping_add(u32::MAX - 7);
            rc.on_forward_delay(t, recv, sent);
            let rtt = base + Duration::from_millis(u64::from(fwd + back));
            rc.on_ack(t, 200_000, 0, Some(rtt));
        }
        // Read from the round trip, this would be a 70 ms queue.
        assert_eq!(rc.queue(), Duration::from_millis(30));
        assert_eq!(rc.min_rtt(), Some(base));
    }

    #[test]
    fn heavy_loss_is_congestion() {
        let t0 = Instant::now();
        let mut rc = RateControl::new(10e6, 1e12, t0);
        let rtt = Some(Duration::from_millis(50));
        let mut t = t0;
        for _ in 0..10 {
            t += Duration::from_millis(50);
            rc.on_ack(t, 200_000, 150_000, rtt);
        }
        assert_eq!(rc.phase(), Phase::Steady);
        assert!(rc.path_rate() < 8e6 * 0.7f64.powi(5), "{}", rc.path_rate());
    }
}
