//! A simulated edge of N connections over shared channels, on an event-driven clock.
//!
//! Each channel is a rate limiter (a `tc` class in the paper's testbed) with a one-way latency
//! and optional random extra delay; the connections dealt to a channel share it round-robin,
//! an item at a time, among those with bytes queued. Each connection has a send window (its
//! socket buffers): it takes no new item while that many bytes are sent but not yet arrived.
//! Arrivals on a connection stay in order (TCP), acknowledgements go back after the latency.
//! A [`Spreader`] and a [`Joiner`] run on both ends; the stream is memory to memory (input is
//! always ready, output always drained), as in the paper's tests.
//!
//! Channel rates can change at given times and connections can join or be lost: a lost
//! connection drops what it had queued or in flight and every acknowledgement not yet
//! delivered, so that the spreader must send some items again that the joiner already has.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::multipath::{
    ConnId, ConnStats, ControllerStats, Item, Joiner, Phase, Scheduler, Spreader, SpreaderConfig,
};

/// One channel (a rate-limited path).
#[derive(Debug, Clone, Copy)]
pub struct ChannelSpec {
    /// Rate in bytes per second.
    pub rate: f64,
    /// One-way latency.
    pub latency: Duration,
    /// Each item is delayed by a further uniform random time up to this (order kept per
    /// connection).
    pub jitter: Duration,
}

impl ChannelSpec {
    /// A LAN channel of `mbps` Mbit/s with 0.5 ms one-way latency.
    pub fn mbps(mbps: f64) -> Self {
        Self {
            rate: mbps * 1e6 / 8.0,
            latency: Duration::from_micros(500),
            jitter: Duration::ZERO,
        }
    }
}

/// One connection of the edge.
#[derive(Debug, Clone, Copy)]
pub struct ConnSpec {
    /// The channel it runs over.
    pub channel: usize,
    /// Bytes sent and not yet arrived before its socket is full.
    pub window: u64,
    /// When it joins (zero: from the start).
    pub joins_at: Duration,
    /// When it is lost, if ever.
    pub lost_at: Option<Duration>,
}

/// A declarative simulation plan.
#[derive(Debug, Clone)]
pub struct ForkJoinSpec {
    /// The channels.
    pub channels: Vec<ChannelSpec>,
    /// The connections.
    pub conns: Vec<ConnSpec>,
    /// At time t, channel c runs at this many bytes per second.
    pub rate_changes: Vec<(Duration, usize, f64)>,
    /// The sender's settings.
    pub spreader: SpreaderConfig,
    /// The receiver's reorder window in items.
    pub joiner_window: u64,
    /// Item (chunk) size.
    pub item_len: u32,
    /// A finite stream of this many bytes (the last item may be short); `None`: endless.
    pub bytes: Option<u64>,
    /// The run stops here.
    pub duration: Duration,
    /// Interval of the time series.
    pub sample: Duration,
    /// Seed for the random delays.
    pub seed: u64,
}

impl ForkJoinSpec {
    /// The paper's static set-up: channels of the given rates (Mbit/s, fastest first) and
    /// `conns` connections dealt round-robin to them, fastest channel first; 64 KiB items,
    /// 256 KiB socket windows, a 256-item reorder window, 60 s.
    pub fn paper(channels_mbps: &[f64], conns: usize, scheduler: Scheduler) -> Self {
        let channels: Vec<ChannelSpec> = channels_mbps
            .iter()
            .map(|&m| ChannelSpec::mbps(m))
            .collect();
        let conns = (0..conns)
            .map(|k| ConnSpec {
                channel: k % channels.len(),
                window: 256 << 10,
                joins_at: Duration::ZERO,
                lost_at: None,
            })
            .collect();
        let spreader = SpreaderConfig::with(scheduler);
        Self {
            channels,
            conns,
            rate_changes: Vec::new(),
            joiner_window: spreader.window,
            spreader,
            item_len: 64 << 10,
            bytes: None,
            duration: Duration::from_secs(60),
            sample: Duration::from_secs(1),
            seed: 1,
        }
    }

    /// Channel `channel` alternates between `a` and `b` Mbit/s every `every`, starting at `a`
    /// (the paper's dynamic experiment), until the end of the run.
    pub fn alternate(&mut self, channel: usize, a: f64, b: f64, every: Duration) {
        self.channels[channel].rate = a * 1e6 / 8.0;
        let mut t = every;
        let mut k = 1;
        while t < self.duration {
            let mbps = if k % 2 == 1 { b } else { a };
            self.rate_changes.push((t, channel, mbps * 1e6 / 8.0));
            t += every;
            k += 1;
        }
    }
}

/// One point of the time series.
#[derive(Debug, Clone)]
pub struct Sample {
    /// End of the interval.
    pub at: Duration,
    /// Bytes released in order per second over the interval.
    pub throughput: f64,
    /// Summed rate of the channels with a live connection, at the end of the interval.
    pub capacity: f64,
    /// The spreader's per-connection figures at the end of the interval.
    pub conns: Vec<ConnStats>,
    /// The controller's phase at the end of the interval.
    pub phase: Phase,
}

/// How the throughput came back after a rate change.
#[derive(Debug, Clone)]
pub struct Step {
    /// When the rate changed.
    pub at: Duration,
    /// Mean throughput over the later half of the interval up to the next change.
    pub level: f64,
    /// Mean capacity over that interval.
    pub capacity: f64,
    /// Time from the change to the start of the first 2 s (or the rest of the interval, if
    /// shorter) whose mean throughput is at least 90% of `level`.
    pub reconverged_after: Option<Duration>,
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct ForkJoinReport {
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// Items released in order.
    pub released_items: u64,
    /// Bytes released in order.
    pub released_bytes: u64,
    /// The finite stream was released entirely.
    pub complete: bool,
    /// Releases whose index or payload was not the next expected (must be 0).
    pub order_errors: u64,
    /// Second copies the joiner dropped.
    pub duplicates: u64,
    /// Most items the joiner held out of order at once.
    pub peak_held: usize,
    /// Items the joiner refused (beyond its window) and acknowledgements the spreader refused
    /// (must be empty).
    pub violations: Vec<String>,
    /// Items each connection carried (copies included).
    pub carried: Vec<u64>,
    /// Released bytes per second.
    pub throughput: f64,
    /// Mean summed capacity of the channels with a live connection, bytes per second.
    pub capacity: f64,
    /// `throughput / capacity`.
    pub fraction: f64,
    /// The time series.
    pub samples: Vec<Sample>,
    /// Re-convergence after each rate change.
    pub steps: Vec<Step>,
    /// The controller's state at the end.
    pub controller: ControllerStats,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Done { ch: usize, conn: usize, item: Item },
    Arrive { conn: usize, item: Item },
    Ack { conn: usize, index: u64 },
    Rate { ch: usize, bits: u64 },
    Join(usize),
    Lost(usize),
    Sample,
}

#[derive(Debug)]
struct SimConn {
    spec: ConnSpec,
    id: Option<ConnId>,
    lost: bool,
    /// Sent, not yet arrived.
    unread: u64,
    /// In the socket, not yet on the channel.
    queue: VecDeque<Item>,
    last_arrival: Instant,
    carried: u64,
}

#[derive(Debug)]
struct SimChannel {
    spec: ChannelSpec,
    busy: bool,
    members: Vec<usize>,
    rr: usize,
}

/// Runs one plan.
pub fn run(spec: &ForkJoinSpec) -> ForkJoinReport {
    Sim::new(spec).run()
}

struct Sim<'a> {
    spec: &'a ForkJoinSpec,
    start: Instant,
    now: Instant,
    events: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    seq: u64,
    rng: SmallRng,
    spreader: Spreader,
    joiner: Joiner<(u64, u32)>,
    conns: Vec<SimConn>,
    channels: Vec<SimChannel>,
    fed: u64,
    released_items: u64,
    released_bytes: u64,
    order_errors: u64,
    peak_held: usize,
    violations: Vec<String>,
    cap_integral: f64,
    last_cap_at: Instant,
    last_sample_bytes: u64,
    samples: Vec<Sample>,
}

impl<'a> Sim<'a> {
    fn new(spec: &'a ForkJoinSpec) -> Self {
        let start = Instant::now();
        let channels = spec
            .channels
            .iter()
            .enumerate()
            .map(|(k, &c)| SimChannel {
                spec: c,
                busy: false,
                members: (0..spec.conns.len())
                    .filter(|&i| spec.conns[i].channel == k)
                    .collect(),
                rr: 0,
            })
            .collect();
        let conns = spec
            .conns
            .iter()
            .map(|&c| SimConn {
                spec: c,
                id: None,
                lost: false,
                unread: 0,
                queue: VecDeque::new(),
                last_arrival: start,
                carried: 0,
            })
            .collect();
        let mut sim = Self {
            spec,
            start,
            now: start,
            events: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(spec.seed),
            spreader: Spreader::new(spec.spreader.clone()),
            joiner: Joiner::new(spec.joiner_window),
            conns,
            channels,
            fed: 0,
            released_items: 0,
            released_bytes: 0,
            order_errors: 0,
            peak_held: 0,
            violations: Vec::new(),
            cap_integral: 0.0,
            last_cap_at: start,
            last_sample_bytes: 0,
            samples: Vec::new(),
        };
        for (i, c) in spec.conns.iter().enumerate() {
            sim.at(c.joins_at, Ev::Join(i));
            if let Some(t) = c.lost_at {
                sim.at(t, Ev::Lost(i));
            }
        }
        for &(t, ch, rate) in &spec.rate_changes {
            sim.at(
                t,
                Ev::Rate {
                    ch,
                    bits: rate.to_bits(),
                },
            );
        }
        sim.at(spec.sample, Ev::Sample);
        sim
    }

    fn at(&mut self, t: Duration, ev: Ev) {
        let t = self.start + t;
        self.push(t, ev);
    }

    fn push(&mut self, t: Instant, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, ev)));
    }

    fn run(mut self) -> ForkJoinReport {
        let end = self.start + self.spec.duration;
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t > end {
                break;
            }
            self.advance(t);
            self.handle(ev);
            // Everything due at this instant first (connections that join together deal
            // together).
            while let Some(Reverse((t2, _, ev))) = self.events.peek().copied() {
                if t2 != t {
                    break;
                }
                self.events.pop();
                self.handle(ev);
            }
            self.pump();
            if self.finished() {
                break;
            }
        }
        if !self.finished() {
            self.advance(end);
        }
        self.report()
    }

    fn finished(&self) -> bool {
        self.spec.bytes.is_some_and(|b| self.released_bytes >= b)
    }

    fn capacity(&self) -> f64 {
        self.channels
            .iter()
            .filter(|ch| {
                ch.members
                    .iter()
                    .any(|&i| self.conns[i].id.is_some() && !self.conns[i].lost)
            })
            .map(|ch| ch.spec.rate)
            .sum()
    }

    fn advance(&mut self, t: Instant) {
        let dt = t.saturating_duration_since(self.last_cap_at).as_secs_f64();
        self.cap_integral += self.capacity() * dt;
        self.last_cap_at = t;
        self.now = t;
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now;
        match ev {
            Ev::Done { ch, conn, item } => {
                self.channels[ch].busy = false;
                let c = &mut self.conns[conn];
                if !c.lost {
                    let spec = self.channels[ch].spec;
                    let jitter = if spec.jitter > Duration::ZERO {
                        self.rng.gen_range(Duration::ZERO..=spec.jitter)
                    } else {
                        Duration::ZERO
                    };
                    let arrive = (now + spec.latency + jitter).max(c.last_arrival);
                    c.last_arrival = arrive;
                    self.push(arrive, Ev::Arrive { conn, item });
                }
            }
            Ev::Arrive { conn, item } => {
                let c = &mut self.conns[conn];
                if c.lost {
                    return;
                }
                c.unread -= u64::from(item.len);
                let accepted = self.joiner.handle_item(item.index, (item.index, item.len));
                self.peak_held = self.peak_held.max(self.joiner.held());
                match accepted {
                    Ok(_) => {
                        let lat = self.channels[c.spec.channel].spec.latency;
                        self.push(
                            now + lat,
                            Ev::Ack {
                                conn,
                                index: item.index,
                            },
                        );
                    }
                    Err(e) => self.violations.push(format!("joiner: {e}")),
                }
            }
            Ev::Ack { conn, index } => {
                let c = &self.conns[conn];
                if c.lost {
                    return;
                }
                let id = c.id.expect("acks only on joined connections");
                if let Err(e) = self.spreader.handle_acked(id, index, now) {
                    self.violations.push(format!("spreader: {e}"));
                }
            }
            Ev::Rate { ch, bits } => self.channels[ch].spec.rate = f64::from_bits(bits),
            Ev::Join(conn) => {
                let id = self
                    .spreader
                    .add_conn_on(self.conns[conn].spec.channel, now);
                self.conns[conn].id = Some(id);
            }
            Ev::Lost(conn) => {
                let c = &mut self.conns[conn];
                c.lost = true;
                c.queue.clear();
                if let Some(id) = c.id {
                    self.spreader
                        .handle_conn_lost(id, now)
                        .expect("a joined connection");
                }
            }
            Ev::Sample => {
                let dt = self.spec.sample.as_secs_f64();
                let bytes = self.released_bytes - self.last_sample_bytes;
                self.last_sample_bytes = self.released_bytes;
                self.samples.push(Sample {
                    at: now - self.start,
                    throughput: bytes as f64 / dt,
                    capacity: self.capacity(),
                    conns: self.spreader.stats(),
                    phase: self.spreader.controller().phase,
                });
                self.push(now + self.spec.sample, Ev::Sample);
            }
        }
    }

    /// Everything that can happen at this instant: input, sends, channel starts, releases.
    fn pump(&mut self) {
        let now = self.now;
        let len = u64::from(self.spec.item_len.max(1));
        while self.spreader.wants_input() {
            let l = match self.spec.bytes {
                Some(total) if self.fed >= total => break,
                Some(total) => len.min(total - self.fed),
                None => len,
            };
            if self.spreader.handle_input(l as u32, now).is_err() {
                break;
            }
            self.fed += l;
        }
        // Taking an item on one connection may fork more to another: until nothing moves.
        let mut moved = true;
        while moved {
            moved = false;
            for i in 0..self.conns.len() {
                let c = &mut self.conns[i];
                let Some(id) = c.id.filter(|_| !c.lost) else {
                    continue;
                };
                while c.unread < c.spec.window {
                    let Some(item) = self.spreader.poll_assign(id, now) else {
                        break;
                    };
                    c.unread += u64::from(item.len);
                    c.carried += 1;
                    c.queue.push_back(item);
                    moved = true;
                }
            }
        }
        for ch in 0..self.channels.len() {
            self.start_channel(ch);
        }
        while let Some((index, (tag, l))) = self.joiner.poll_release() {
            if index != self.released_items || tag != index {
                self.order_errors += 1;
            }
            self.released_items += 1;
            self.released_bytes += u64::from(l);
        }
    }

    fn start_channel(&mut self, ch: usize) {
        let n = self.channels[ch].members.len();
        if self.channels[ch].busy || n == 0 {
            return;
        }
        for k in 0..n {
            let slot = (self.channels[ch].rr + k) % n;
            let conn = self.channels[ch].members[slot];
            if let Some(item) = self.conns[conn].queue.pop_front() {
                let chan = &mut self.channels[ch];
                chan.rr = slot + 1;
                chan.busy = true;
                let t = self.now + Duration::from_secs_f64(f64::from(item.len) / chan.spec.rate);
                self.push(t, Ev::Done { ch, conn, item });
                return;
            }
        }
    }

    fn report(self) -> ForkJoinReport {
        let elapsed = self.now - self.start;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let throughput = self.released_bytes as f64 / secs;
        let capacity = self.cap_integral / secs;
        let steps = steps(
            &self.samples,
            &self.spec.rate_changes,
            self.spec.duration,
            self.spec.sample,
        );
        ForkJoinReport {
            elapsed,
            released_items: self.released_items,
            released_bytes: self.released_bytes,
            complete: self.finished(),
            order_errors: self.order_errors,
            duplicates: self.joiner.duplicates(),
            peak_held: self.peak_held,
            violations: self.violations,
            carried: self.conns.iter().map(|c| c.carried).collect(),
            throughput,
            capacity,
            fraction: if capacity > 0.0 {
                throughput / capacity
            } else {
                0.0
            },
            samples: self.samples,
            steps,
            controller: self.spreader.controller(),
        }
    }
}

/// Re-convergence after each distinct rate-change time.
fn steps(
    samples: &[Sample],
    changes: &[(Duration, usize, f64)],
    end: Duration,
    sample: Duration,
) -> Vec<Step> {
    let span = (Duration::from_secs(2).as_secs_f64() / sample.as_secs_f64().max(1e-9)).ceil();
    let span = (span as usize).max(1);
    let mut times: Vec<Duration> = changes.iter().map(|c| c.0).collect();
    times.sort();
    times.dedup();
    let mut out = Vec::new();
    for (k, &at) in times.iter().enumerate() {
        let until = times.get(k + 1).copied().unwrap_or(end);
        let inside: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.at > at && s.at <= until)
            .collect();
        if inside.is_empty() {
            continue;
        }
        let half = at + (until - at) / 2;
        let later: Vec<&&Sample> = inside.iter().filter(|s| s.at > half).collect();
        let level = later.iter().map(|s| s.throughput).sum::<f64>() / later.len().max(1) as f64;
        let capacity = inside.iter().map(|s| s.capacity).sum::<f64>() / inside.len() as f64;
        let reconverged_after = (0..inside.len())
            .find(|&k| {
                let run = &inside[k..(k + span).min(inside.len())];
                run.iter().map(|s| s.throughput).sum::<f64>() / run.len() as f64 >= 0.9 * level
            })
            .map(|k| inside[k].at.saturating_sub(sample).saturating_sub(at));
        out.push(Step {
            at,
            level,
            capacity,
            reconverged_after,
        });
    }
    out
}
