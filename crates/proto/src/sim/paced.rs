//! Two [`Conn`]s over a simulated path on a simulated clock: a line-rate link with a
//! drop-tail queue, a one-way delay and random loss after the queue, one per direction (the
//! lab's emulator model, `bulkcast-lab`'s `emu`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::paced::{Config, Conn, ConnStats};

/// One direction of a path.
#[derive(Debug, Clone, Copy)]
pub struct PathProfile {
    /// Line rate, bytes/s.
    pub rate: f64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Probability that a datagram is lost after the queue.
    pub loss: f64,
    /// Queue limit, bytes.
    pub queue: u64,
}

/// Issue 5's WAN hop: 100 Mbit/s, 100 ms RTT, 5% random loss, a queue of one
/// bandwidth-delay product (1.25 MB), as `scenarios/wan-100m-100ms-loss5.toml`.
pub const WAN_100M_100MS_LOSS5: PathProfile = PathProfile {
    rate: 12.5e6,
    delay: Duration::from_millis(50),
    loss: 0.05,
    queue: 1_250_000,
};

/// The same hop without loss.
pub const WAN_100M_100MS: PathProfile = PathProfile {
    loss: 0.0,
    ..WAN_100M_100MS_LOSS5
};

/// A short path with a queue of only 50 datagrams (about 3 ms at 200 Mbit/s), where a
/// sender that overshoots overflows it at once.
pub const SHORT_QUEUE_200M_10MS: PathProfile = PathProfile {
    rate: 25e6,
    delay: Duration::from_millis(5),
    loss: 0.0,
    queue: 50 * 1500,
};

/// Datagrams on one direction of the path.
struct Link {
    p: PathProfile,
    busy_until: Instant,
    arriving: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>>,
    seq: u64,
    rng: SmallRng,
    queue_drops: u64,
    random_drops: u64,
    max_queue: u64,
    /// Tests may drop everything (a dead path) from this time on.
    dead_from: Option<Instant>,
}

impl Link {
    fn new(p: PathProfile, seed: u64, now: Instant) -> Self {
        Link {
            p,
            busy_until: now,
            arriving: BinaryHeap::new(),
            seq: 0,
            rng: SmallRng::seed_from_u64(seed),
            queue_drops: 0,
            random_drops: 0,
            max_queue: 0,
            dead_from: None,
        }
    }

    fn send(&mut self, now: Instant, d: Vec<u8>) {
        if self.dead_from.is_some_and(|t| now >= t) {
            return;
        }
        // IP and UDP headers count on the wire.
        let wire = d.len() as u64 + 28;
        let backlog =
            (self.busy_until.saturating_duration_since(now).as_secs_f64() * self.p.rate) as u64;
        if backlog + wire > self.p.queue {
            self.queue_drops += 1;
            return;
        }
        self.max_queue = self.max_queue.max(backlog + wire);
        let start = self.busy_until.max(now);
        self.busy_until = start + Duration::from_secs_f64(wire as f64 / self.p.rate);
        if self.p.loss > 0.0 && self.rng.gen::<f64>() < self.p.loss {
            self.random_drops += 1;
            return;
        }
        self.seq += 1;
        self.arriving
            .push(Reverse((self.busy_until + self.p.delay, self.seq, d)));
    }

    fn next_arrival(&self) -> Option<Instant> {
        self.arriving.peek().map(|Reverse((t, _, _))| *t)
    }

    fn pop_due(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.next_arrival()? <= now {
            self.arriving.pop().map(|Reverse((_, _, d))| d)
        } else {
            None
        }
    }
}

/// What a simulated transfer did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Bytes the receiver read, all checked against the pattern written.
    pub bytes: u64,
    /// Simulated time from the first datagram until the receiver read the last byte.
    pub seconds: f64,
    /// Simulated time when both sides were done or had failed.
    pub ended: f64,
    /// Whether both sides finished (FINs sent, acknowledged and read).
    pub done: bool,
    /// The error a side ended with, if any.
    pub error: Option<String>,
    /// The sender's counters.
    pub sender: ConnStats,
    /// Datagrams the queue dropped, sender to receiver.
    pub queue_drops: u64,
    /// Datagrams random loss dropped, sender to receiver.
    pub random_drops: u64,
    /// Longest queue seen, bytes.
    pub max_queue: u64,
    /// Goodput as a fraction of the link rate.
    pub fraction: f64,
}

/// The byte at stream offset `i` of a test stream.
pub fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

/// A sender and a receiver joined by a path.
pub struct Pair {
    /// The side writing the stream.
    pub sender: Conn,
    /// The side reading it.
    pub receiver: Conn,
    fwd: Link,
    back: Link,
    /// Simulated now.
    pub now: Instant,
    start: Instant,
    /// The receiver reads at most this many bytes per simulated ms (None: all at once).
    pub reader_limit: Option<usize>,
    /// The sender's host runs it only this often (None: whenever a datagram or a timer is
    /// due), as a busy host or a timer wheel does: datagrams for it wait meanwhile.
    pub sender_tick: Option<Duration>,
    /// When the sender runs next, with `sender_tick`.
    sender_wakes: Instant,
}

impl Pair {
    /// A pair over `fwd` (sender to receiver) and `back`, with seeded loss.
    pub fn new(fwd: PathProfile, back: PathProfile, cfg: Config, seed: u64) -> Self {
        let now = Instant::now();
        Pair {
            sender: Conn::client(7, cfg.clone(), now),
            receiver: Conn::server(7, cfg, now),
            fwd: Link::new(fwd, seed, now),
            back: Link::new(back, seed ^ 0x5eed, now),
            now,
            start: now,
            reader_limit: None,
            sender_tick: None,
            sender_wakes: now,
        }
    }

    /// From `after` on, the forward path delivers nothing.
    pub fn kill_path_after(&mut self, after: Duration) {
        self.fwd.dead_from = Some(self.start + after);
        self.back.dead_from = Some(self.start + after);
    }

    /// Sends `total` pattern bytes one way; runs until both sides are done or failed, or
    /// `limit` of simulated time passed.
    pub fn transfer(&mut self, total: u64, limit: Duration) -> Outcome {
        let [fwd, _] = self.exchange([total, 0], limit);
        fwd
    }

    /// Sends `totals[0]` pattern bytes from the sender to the receiver and `totals[1]` back
    /// at the same time, each side's data sharing its link with the other's ACKs, as on a
    /// path that carries a broadcast both ways. Returns the outcome of each direction.
    pub fn exchange(&mut self, totals: [u64; 2], limit: Duration) -> [Outcome; 2] {
        // The side that opened the connection ends its stream once written; the other, once
        // it has also read its peer's (so a one-way transfer's receiver answers with an
        // empty stream at the end, as an application that only reads does).
        let mut dirs = [
            Flow::new(totals[0], false, self.now),
            Flow::new(totals[1], true, self.now),
        ];
        let mut chunk = vec![0u8; 64 * 1024];
        let mut rbuf = vec![0u8; 64 * 1024];
        let mut dgram = Vec::with_capacity(2048);
        let mut last_tick = self.now;
        let mut budget = 0usize;
        let trace = std::env::var_os("PACED_TRACE").is_some();
        let mut next_trace = self.now;
        while self.now - self.start < limit {
            if trace && self.now >= next_trace {
                next_trace += Duration::from_millis(200);
                for (name, c, link, d) in [
                    ("fwd", &self.sender, &self.fwd, &dirs[0]),
                    ("back", &self.receiver, &self.back, &dirs[1]),
                ] {
                    let rc = c.controller();
                    eprintln!(
                        "{:>7.2} s {name:>4} read {:>6.1} MB rate {:>6.1} Mbit/s window {:>8} \
                         (x{:.2}) inflight {:>8} queue {:>7} ({:?}) sent {} lost {} {:?}",
                        (self.now - self.start).as_secs_f64(),
                        d.read as f64 / 1e6,
                        rc.rate() * 8e-6,
                        rc.window(),
                        rc.boost(),
                        c.inflight(),
                        (link
                            .busy_until
                            .saturating_duration_since(self.now)
                            .as_secs_f64()
                            * link.p.rate) as u64,
                        rc.queue(),
                        c.stats().packets_sent,
                        c.stats().packets_lost,
                        rc.phase(),
                    );
                }
            }
            // Application: write what fits, read what is ready.
            dirs[0].write(&mut self.sender, &mut chunk);
            dirs[1].write(&mut self.receiver, &mut chunk);
            if let Some(per_ms) = self.reader_limit {
                let ms = (self.now - last_tick).as_millis() as usize;
                if ms > 0 {
                    budget = (budget + ms * per_ms).min(per_ms * 1000);
                    last_tick = self.now;
                }
            }
            let read_budget = self.reader_limit.map(|_| &mut budget);
            dirs[0].read(&mut self.receiver, &mut rbuf, read_budget, self.now);
            dirs[1].read(&mut self.sender, &mut rbuf, None, self.now);
            let over = |c: &Conn| c.is_done() || c.error().is_some();
            if over(&self.sender) && over(&self.receiver) {
                break;
            }
            // Network.
            let sender_runs = self.now >= self.sender_wakes;
            while sender_runs && self.sender.poll_transmit(self.now, &mut dgram) {
                self.fwd.send(self.now, dgram.clone());
            }
            while self.receiver.poll_transmit(self.now, &mut dgram) {
                self.back.send(self.now, dgram.clone());
            }
            let mut moved = false;
            while let Some(d) = self.fwd.pop_due(self.now) {
                let _ = self.receiver.handle_datagram(self.now, &d);
                moved = true;
            }
            while let Some(d) = sender_runs.then(|| self.back.pop_due(self.now)).flatten() {
                let _ = self.sender.handle_datagram(self.now, &d);
                moved = true;
            }
            if moved {
                continue;
            }
            for (c, runs) in [(&mut self.sender, sender_runs), (&mut self.receiver, true)] {
                if runs && c.poll_timeout().is_some_and(|t| t <= self.now) {
                    c.handle_timeout(self.now);
                }
            }
            if let Some(tick) = self.sender_tick.filter(|_| sender_runs) {
                self.sender_wakes = self.now + tick;
            }
            let sender_next = [self.sender.poll_timeout(), self.back.next_arrival()]
                .into_iter()
                .flatten()
                .min()
                .map(|t| t.max(self.sender_wakes));
            let mut next = [
                sender_next,
                self.receiver.poll_timeout(),
                self.fwd.next_arrival(),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.now + Duration::from_millis(1));
            if self.reader_limit.is_some() && self.receiver.readable() > 0 {
                next = next.min(self.now + Duration::from_millis(1));
            }
            // Timers fire on the next simulated microsecond at the earliest.
            self.now = next.max(self.now + Duration::from_micros(1));
        }
        let error = self
            .sender
            .error()
            .or(self.receiver.error())
            .map(|e| e.to_string());
        let done = self.sender.is_done() && self.receiver.is_done();
        let [a, b] = dirs;
        [
            a.outcome(&self.sender, &self.fwd, self.start, self.now, done, &error),
            b.outcome(
                &self.receiver,
                &self.back,
                self.start,
                self.now,
                done,
                &error,
            ),
        ]
    }
}

/// One direction of an exchange: what its sender wrote and its receiver read.
struct Flow {
    total: u64,
    /// End the stream only after the peer's was read to the end.
    finish_after_peer: bool,
    written: u64,
    read: u64,
    last_read_at: Instant,
    /// The first stream offset whose byte differs from the pattern.
    corrupt: Option<u64>,
}

impl Flow {
    fn new(total: u64, finish_after_peer: bool, now: Instant) -> Self {
        Flow {
            total,
            finish_after_peer,
            written: 0,
            read: 0,
            last_read_at: now,
            corrupt: None,
        }
    }

    /// Writes pattern bytes into `c` while it takes them; finishes the stream at the end.
    fn write(&mut self, c: &mut Conn, chunk: &mut [u8]) {
        while self.written < self.total {
            let n = (self.total - self.written).min(chunk.len() as u64) as usize;
            for (k, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern(self.written + k as u64);
            }
            let w = c.write(&chunk[..n]);
            self.written += w as u64;
            if w < n {
                break;
            }
        }
        if self.written == self.total && (!self.finish_after_peer || c.recv_finished()) {
            c.finish();
        }
    }

    /// Reads what `c` has ready (at most `budget` bytes if given), checking the pattern.
    fn read(
        &mut self,
        c: &mut Conn,
        rbuf: &mut [u8],
        mut budget: Option<&mut usize>,
        now: Instant,
    ) {
        loop {
            let room = match &budget {
                Some(b) => (**b).min(rbuf.len()),
                None => rbuf.len(),
            };
            let n = c.read(&mut rbuf[..room]);
            if n == 0 {
                break;
            }
            if let Some(b) = budget.as_deref_mut() {
                *b -= n;
            }
            for (k, b) in rbuf[..n].iter().enumerate() {
                if *b != pattern(self.read + k as u64) && self.corrupt.is_none() {
                    self.corrupt = Some(self.read + k as u64);
                }
            }
            self.read += n as u64;
            self.last_read_at = now;
        }
    }

    fn outcome(
        self,
        sender: &Conn,
        link: &Link,
        start: Instant,
        now: Instant,
        done: bool,
        error: &Option<String>,
    ) -> Outcome {
        let seconds = (self.last_read_at - start).as_secs_f64();
        Outcome {
            bytes: self.read,
            seconds,
            ended: (now - start).as_secs_f64(),
            done: done && self.corrupt.is_none(),
            error: error.clone().or(self
                .corrupt
                .map(|at| format!("byte {at} differs from what was written"))),
            sender: sender.stats(),
            queue_drops: link.queue_drops,
            random_drops: link.random_drops,
            max_queue: link.max_queue,
            fraction: self.read as f64 / seconds.max(1e-9) / link.p.rate,
        }
    }
}
