//! The sending side of a striped edge: which connection carries which item.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{ConnId, Item};

/// Pull: a connection is judged at least this fraction as fast as the mean of the others on
/// its path ([`Striper::add_conn_on`]): half, because TCP flows sharing one bottleneck settle
/// within a factor of two of each other, so a connection slower than that is in a transient.
const SAME_PATH_FLOOR: f64 = 0.5;

/// How items are dealt to connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Each connection takes the next item whenever its socket has room and its own in-flight
    /// cap ([`StriperConfig::pull_queue_delay`]) allows: self-clocking.
    Pull,
    /// The paper's weighted fork-join: a fixed weighted round-robin deal, re-weighted by the
    /// sojourn-time controller ([`WeightedConfig`]).
    Weighted,
    /// The paper's unweighted fork-join: a fixed round-robin deal with equal blocks, never
    /// re-weighted (eq. 1; the baseline).
    Equal,
}

/// Settings of the paper's weighted fork-join and its controller (section 3).
#[derive(Debug, Clone)]
pub struct WeightedConfig {
    /// `B`, the block dealt per round to a connection of weight 1 (the fastest), in bytes.
    /// Connection `i` gets `B * w_i` per round (eq. 2), carried over as a deficit when that is
    /// less than an item.
    pub block: u64,
    /// `K`: a measurement lasts `max(2, ceil(K / N))` steps (section 3.1: inversely
    /// proportional to `N`, at least 2), a step being `N * B` acknowledged bytes.
    pub steps: u32,
    /// The short wait after a re-weighting before measuring again (steady-state TCP).
    pub settle: Duration,
    /// Re-weight when the mean sojourn time rises by more than this fraction over the rolling
    /// mean of the last three measurements (section 3.2: 0.33).
    pub threshold: f64,
    /// The "alarm" of section 3.1: a clocked re-weighting this long after the last one, if
    /// nothing triggered one. `None` disables it. The paper gives no period; 5 s measured
    /// best of none, 5, 10 and 20 s on the simulated set-ups (it is also what catches rate
    /// rises, which the 33% rule ignores).
    pub alarm: Option<Duration>,
    /// Smallest weight, so that a connection measured very slow still carries some items and
    /// keeps being measured.
    pub min_weight: f64,
}

impl Default for WeightedConfig {
    fn default() -> Self {
        Self {
            block: 512 << 10,
            steps: 8,
            settle: Duration::from_secs(1),
            threshold: 0.33,
            alarm: Some(Duration::from_secs(5)),
            min_weight: 0.02,
        }
    }
}

/// Settings of a [`Striper`].
#[derive(Debug, Clone)]
pub struct StriperConfig {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The reorder window in items, as agreed with the receiver's [`Joiner`](super::Joiner):
    /// the striper never hands out an item at or beyond `oldest un-acknowledged + window`.
    pub window: u64,
    /// Pull only: a connection takes a new item only while its bytes in flight are under
    /// `rate * (rtt + pull_queue_delay)` (its rate and round trip as judged against its path,
    /// see [`Striper::add_conn_on`]), so that a
    /// slow connection does not queue seconds of data in a large socket buffer while the
    /// others wait for it at the join.
    pub pull_queue_delay: Duration,
    /// Pull only: the in-flight cap is never below this many bytes (the cap before any
    /// measurement; it grows from there as the rate estimate grows).
    pub pull_min_inflight: u64,
    /// The weighted scheduler and its controller.
    pub weighted: WeightedConfig,
    /// Time constant of the per-connection rate estimate (busy-time weighted).
    pub rate_tau: Duration,
    /// Pull only: the items of a connection that delivered nothing for this many times its
    /// usual time for a frame (round trip plus the frame at its rate, as judged against its
    /// path) are sent again on the
    /// others, oldest first, where later items have arrived past them: the join waits for
    /// them. Under random loss one of N connections is often in a retransmission timeout
    /// (hundreds of milliseconds, doubling), and without a second copy the whole edge waits
    /// for it once the window fills. 0 turns this off.
    pub hedge_after: f64,
}

impl Default for StriperConfig {
    fn default() -> Self {
        Self {
            scheduler: Scheduler::Pull,
            window: 256,
            pull_queue_delay: Duration::from_millis(50),
            pull_min_inflight: 256 << 10,
            weighted: WeightedConfig::default(),
            rate_tau: Duration::from_millis(500),
            hedge_after: 3.0,
        }
    }
}

impl StriperConfig {
    /// The default settings with this scheduler.
    pub fn with(scheduler: Scheduler) -> Self {
        Self {
            scheduler,
            ..Self::default()
        }
    }
}

/// A mistake of the driver or the peer, reported instead of corrupting the state.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum StripeError {
    /// An acknowledgement for an item not in flight on that connection.
    #[error("item {index} is not in flight on connection {conn}")]
    NotInFlight {
        /// The connection.
        conn: ConnId,
        /// The item.
        index: u64,
    },
    /// No such connection.
    #[error("no connection {0}")]
    UnknownConn(ConnId),
    /// Input offered while [`Striper::wants_input`] is false.
    #[error("input beyond the reorder window or without a live connection")]
    WindowFull,
}

/// One connection's figures, for `--json` reports and time series.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ConnStats {
    /// The connection.
    pub conn: ConnId,
    /// Not lost.
    pub alive: bool,
    /// Bytes acknowledged by the receiver over this connection.
    pub bytes_acked: u64,
    /// Rate estimate in bytes per second of busy time (time with something in flight).
    pub rate: f64,
    /// Its share of the items dealt: the configured weight over the sum of the live
    /// connections' weights (weighted and equal), or its rate over the sum of the live rates
    /// (pull, where the share follows from the rates).
    pub weight: f64,
    /// Bytes handed to it and not yet acknowledged.
    pub inflight_bytes: u64,
    /// Items handed to it and not yet acknowledged.
    pub inflight_items: usize,
    /// Items dealt to it but not yet taken (weighted and equal).
    pub queued_items: usize,
}

/// The controller's phase (section 3 of the paper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Phase {
    /// Equal blocks, measuring per-connection sojourn times and rates.
    Measure,
    /// Weights just set; waiting for a steady state.
    Settle,
    /// First measurement with the new weights, compared to the equal-block one (3.1).
    Check,
    /// The feedback loop (3.2).
    Track,
    /// No controller (pull, equal).
    Off,
}

/// The controller's state, for reports.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControllerStats {
    /// Current phase.
    pub phase: Phase,
    /// Weightings applied (each ends a measurement).
    pub reweights: u32,
    /// Re-evaluations triggered by the 33% rule.
    pub triggered: u32,
    /// Re-evaluations triggered by the alarm.
    pub alarms: u32,
    /// Times the weighted blocks measured worse and equal blocks were kept (3.1).
    pub reverted: u32,
    /// Mean sojourn time of the last measurement.
    pub mean_sojourn: Option<Duration>,
}

#[derive(Debug)]
struct Sent {
    item: Item,
    dealt_at: Instant,
    sent_at: Instant,
}

#[derive(Debug)]
struct Conn {
    alive: bool,
    /// Dealt, not yet handed out (weighted and equal), with the deal time: the paper's
    /// per-connection buffer.
    dealt: VecDeque<(Item, Instant)>,
    dealt_bytes: u64,
    inflight: VecDeque<Sent>,
    inflight_bytes: u64,
    bytes_acked: u64,
    last_done: Option<Instant>,
    min_rtt: Option<Duration>,
    /// Busy-time weighted moving sums for the rate estimate.
    ewma_bytes: f64,
    ewma_secs: f64,
    /// The network path it runs over (a label from the driver).
    path: usize,
    /// Relative weight, the fastest at 1 (eq. 2).
    weight: f64,
    deficit: f64,
    /// The current measurement: bytes acknowledged, bytes and time of the rate samples,
    /// sojourn times.
    p_bytes: u64,
    p_rate_bytes: u64,
    p_service: f64,
    p_sojourn: f64,
    p_items: u64,
}

impl Conn {
    fn new(path: usize) -> Self {
        Self {
            alive: true,
            path,
            dealt: VecDeque::new(),
            dealt_bytes: 0,
            inflight: VecDeque::new(),
            inflight_bytes: 0,
            bytes_acked: 0,
            last_done: None,
            min_rtt: None,
            ewma_bytes: 0.0,
            ewma_secs: 0.0,
            weight: 1.0,
            deficit: 0.0,
            p_bytes: 0,
            p_rate_bytes: 0,
            p_service: 0.0,
            p_sojourn: 0.0,
            p_items: 0,
        }
    }

    fn rate(&self) -> f64 {
        if self.ewma_secs > 0.0 {
            self.ewma_bytes / self.ewma_secs
        } else {
            0.0
        }
    }

    fn reset_period(&mut self) {
        self.p_bytes = 0;
        self.p_rate_bytes = 0;
        self.p_service = 0.0;
        self.p_sojourn = 0.0;
        self.p_items = 0;
    }
}

#[derive(Debug)]
struct Controller {
    phase: Phase,
    /// When `Settle` ends, and the phase after it.
    settle_until: Option<(Instant, Phase)>,
    /// Mean and standard deviation of the sojourn times with equal blocks.
    equal: Option<(f64, f64)>,
    /// An early re-weighting (3.1) was already made in this cycle.
    early_done: bool,
    /// Mean sojourn times of the last three measurements in `Track`.
    history: VecDeque<f64>,
    last_reweight: Option<Instant>,
    stats: ControllerStats,
}

/// Deals a stream of items to N connections and tracks them until acknowledged.
///
/// Driver loop, per edge:
/// 1. [`add_conn_on`](Self::add_conn_on) for each connection, with its path (more may join
///    later);
/// 2. while [`wants_input`](Self::wants_input), read an item from upstream and give its
///    length to [`handle_input`](Self::handle_input), which numbers it (keep the data
///    until it is acknowledged);
/// 3. for each connection whose socket has room, send what
///    [`poll_assign`](Self::poll_assign) returns, until it returns `None`;
/// 4. on each acknowledgement from the receiver, [`handle_acked`](Self::handle_acked)
///    (the data of items below [`acked_below`](Self::acked_below) may then be freed); when a
///    connection fails, [`handle_conn_lost`](Self::handle_conn_lost): its unacknowledged
///    items go to the other connections;
/// 5. go to 2 after any of these.
#[derive(Debug)]
pub struct Striper {
    config: StriperConfig,
    conns: Vec<Conn>,
    next_index: u64,
    /// The largest item seen (the window's items are taken to be this large).
    max_item: u32,
    /// Oldest unacknowledged item.
    base: u64,
    /// Acknowledged items above `base`.
    acked_ahead: BTreeSet<u64>,
    /// Pull: numbered, not yet handed out.
    pending: VecDeque<(Item, Instant)>,
    /// The bytes of `pending`.
    pending_bytes: u64,
    /// Items of lost connections, handed out again first.
    orphans: BTreeMap<u64, (Item, Instant)>,
    /// Unacknowledged items sent a second time (see [`StriperConfig::hedge_after`]), and how
    /// many items were.
    hedged: BTreeSet<u64>,
    hedges: u64,
    /// Weighted deal: the connection being dealt to.
    cursor: usize,
    /// Whether `cursor` has had its quantum for this round.
    arrived: bool,
    controller: Controller,
}

impl Striper {
    /// A striper with no connections yet.
    pub fn new(config: StriperConfig) -> Self {
        let phase = match config.scheduler {
            Scheduler::Weighted => Phase::Measure,
            Scheduler::Pull | Scheduler::Equal => Phase::Off,
        };
        Self {
            config,
            conns: Vec::new(),
            next_index: 0,
            max_item: 0,
            base: 0,
            acked_ahead: BTreeSet::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            orphans: BTreeMap::new(),
            hedged: BTreeSet::new(),
            hedges: 0,
            cursor: 0,
            arrived: false,
            controller: Controller {
                phase,
                settle_until: None,
                equal: None,
                early_done: false,
                history: VecDeque::new(),
                last_reweight: None,
                stats: ControllerStats {
                    phase,
                    reweights: 0,
                    triggered: 0,
                    alarms: 0,
                    reverted: 0,
                    mean_sojourn: None,
                },
            },
        }
    }

    /// A new connection over path 0: with only these, every connection shares one path (see
    /// [`add_conn_on`](Self::add_conn_on)).
    pub fn add_conn(&mut self, now: Instant) -> ConnId {
        self.add_conn_on(0, now)
    }

    /// A new connection over network path `path` (any label: connections with the same label
    /// share a bottleneck); it takes part from now on. Under the weighted scheduler the
    /// weights are measured again from equal blocks.
    pub fn add_conn_on(&mut self, path: usize, now: Instant) -> ConnId {
        self.conns.push(Conn::new(path));
        if self.config.scheduler == Scheduler::Weighted {
            self.restart_measure(now);
        }
        self.fork(now);
        self.conns.len() - 1
    }

    /// Whether the driver may read another item from upstream: the next item is inside the
    /// reorder window and some connection is alive.
    pub fn wants_input(&self) -> bool {
        self.next_index < self.base + self.config.window && self.conns.iter().any(|c| c.alive)
    }

    /// A new item of `len` bytes from upstream; returns its index (items are numbered from 0
    /// in input order).
    pub fn handle_input(&mut self, len: u32, now: Instant) -> Result<u64, StripeError> {
        if !self.wants_input() {
            return Err(StripeError::WindowFull);
        }
        let item = Item {
            index: self.next_index,
            len,
        };
        self.next_index += 1;
        self.max_item = self.max_item.max(len);
        self.pending.push_back((item, now));
        self.pending_bytes += u64::from(len);
        self.fork(now);
        Ok(item.index)
    }

    /// The next item to send on `conn`, whose socket has room; `None` if it has nothing to
    /// take now (its dealt queue is empty, its pull cap is reached, or it is lost).
    pub fn poll_assign(&mut self, conn: ConnId, now: Instant) -> Option<Item> {
        let pull = self.config.scheduler == Scheduler::Pull;
        if pull && !self.pull_may_take(conn) {
            return None;
        }
        let late = if pull {
            self.late_item(conn, now)
        } else {
            None
        };
        if let Some((item, _)) = late {
            self.hedged.insert(item.index);
            self.hedges += 1;
        }
        let c = self.conns.get_mut(conn).filter(|c| c.alive)?;
        let (item, dealt_at) = match late.or_else(|| self.orphans.pop_first().map(|(_, o)| o)) {
            Some(o) => o,
            None if pull => {
                let p = self.pending.pop_front()?;
                self.pending_bytes -= u64::from(p.0.len);
                p
            }
            None => {
                let (item, at) = c.dealt.pop_front()?;
                c.dealt_bytes -= u64::from(item.len);
                (item, at)
            }
        };
        c.inflight.push_back(Sent {
            item,
            dealt_at,
            sent_at: now,
        });
        c.inflight_bytes += u64::from(item.len);
        if !pull {
            self.fork(now);
        }
        Some(item)
    }

    /// The receiver acknowledged item `index`, received by `conn` (a duplicate copy is
    /// acknowledged too).
    pub fn handle_acked(
        &mut self,
        conn: ConnId,
        index: u64,
        now: Instant,
    ) -> Result<(), StripeError> {
        let tau = self.config.rate_tau.as_secs_f64();
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(StripeError::UnknownConn(conn))?;
        let pos = c
            .inflight
            .iter()
            .position(|s| s.item.index == index)
            .filter(|_| c.alive)
            .ok_or(StripeError::NotInFlight { conn, index })?;
        let sent = c.inflight.remove(pos).expect("position is in range");
        let len = u64::from(sent.item.len);
        c.inflight_bytes -= len;
        c.bytes_acked += len;
        // Rate samples: an item that was in flight when the previous acknowledgement came
        // took the time since then (the gap between acknowledgements); over a busy period
        // these add up to the busy time. The first item after an idle spell also took a round
        // trip, which is not the connection's rate: no sample (a connection used one item at
        // a time has no rate until it carries two at once).
        let pipelined = c.last_done.is_some_and(|d| sent.sent_at <= d);
        let service = c
            .last_done
            .map_or(0.0, |d| now.saturating_duration_since(d).as_secs_f64());
        c.last_done = Some(now);
        let rtt = now.saturating_duration_since(sent.sent_at);
        c.min_rtt = shorter(c.min_rtt, Some(rtt));
        if pipelined {
            let decay = if tau > 0.0 {
                (-service / tau).exp()
            } else {
                0.0
            };
            c.ewma_bytes = c.ewma_bytes * decay + len as f64;
            c.ewma_secs = c.ewma_secs * decay + service;
            c.p_rate_bytes += len;
            c.p_service += service;
        }
        c.p_bytes += len;
        c.p_sojourn += now.saturating_duration_since(sent.dealt_at).as_secs_f64();
        c.p_items += 1;
        if index == self.base {
            self.base += 1;
            while self.acked_ahead.remove(&self.base) {
                self.base += 1;
            }
            if !self.hedged.is_empty() {
                self.hedged = self.hedged.split_off(&self.base);
            }
        } else if index > self.base {
            self.acked_ahead.insert(index);
        }
        if self.config.scheduler == Scheduler::Weighted {
            self.control(now);
        }
        Ok(())
    }

    /// `conn` failed: its unacknowledged and dealt items are handed out again, first, to the
    /// other connections (the receiver drops any second copy).
    pub fn handle_conn_lost(&mut self, conn: ConnId, now: Instant) -> Result<(), StripeError> {
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(StripeError::UnknownConn(conn))?;
        if !c.alive {
            return Ok(());
        }
        c.alive = false;
        for s in c.inflight.drain(..) {
            // An item sent twice may have arrived by the other copy already.
            if s.item.index >= self.base && !self.acked_ahead.contains(&s.item.index) {
                self.orphans.insert(s.item.index, (s.item, s.dealt_at));
            }
        }
        for (item, at) in c.dealt.drain(..) {
            self.orphans.insert(item.index, (item, at));
        }
        c.dealt_bytes = 0;
        c.inflight_bytes = 0;
        c.reset_period();
        if self.controller.phase != Phase::Off {
            // The remaining connections keep their relative weights; the fastest may be gone.
            self.normalize_weights();
        }
        self.fork(now);
        Ok(())
    }

    /// Items sent a second time because their first connection was late with them.
    pub fn hedges(&self) -> u64 {
        self.hedges
    }

    /// Every item below this index is acknowledged (its data may be freed).
    pub fn acked_below(&self) -> u64 {
        self.base
    }

    /// Items numbered so far.
    pub fn items_in(&self) -> u64 {
        self.next_index
    }

    /// Whether every item given so far is acknowledged.
    pub fn is_idle(&self) -> bool {
        self.base == self.next_index
    }

    /// Per-connection figures.
    pub fn stats(&self) -> Vec<ConnStats> {
        let live = |c: &&Conn| c.alive;
        let (wsum, rsum) = self
            .conns
            .iter()
            .filter(live)
            .fold((0.0, 0.0), |(w, r), c| (w + c.weight, r + c.rate()));
        let pull = self.config.scheduler == Scheduler::Pull;
        self.conns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let weight = match (c.alive, pull) {
                    (false, _) => 0.0,
                    (true, true) if rsum > 0.0 => c.rate() / rsum,
                    (true, true) => 0.0,
                    (true, false) => c.weight / wsum,
                };
                ConnStats {
                    conn: i,
                    alive: c.alive,
                    bytes_acked: c.bytes_acked,
                    rate: c.rate(),
                    weight,
                    inflight_bytes: c.inflight_bytes,
                    inflight_items: c.inflight.len(),
                    queued_items: c.dealt.len(),
                }
            })
            .collect()
    }

    /// The controller's state.
    pub fn controller(&self) -> ControllerStats {
        let mut s = self.controller.stats.clone();
        s.phase = self.controller.phase;
        s
    }

    /// The settings.
    pub fn config(&self) -> &StriperConfig {
        &self.config
    }

    /// The rate `conn` is judged by: its own estimate, but at least [`SAME_PATH_FLOOR`] of the
    /// mean of the other measured connections on its path. Connections over one path share
    /// its bottleneck, and TCP shares it out evenly over seconds; one far below its siblings
    /// is in a transient (slow start, a retransmission timeout, or the cold start of a
    /// connection fed one frame at a time), and its own estimate only says how it did then.
    /// Judged by that alone it would get one frame at a time, each of which, on a lossy path,
    /// needs a timeout to complete: a connection judged slow stays slow (seen in the lab: one
    /// of eight connections at 1% loss carried 4 frames in 30 s).
    ///
    /// Likewise its round trip: the path's smallest, since a laggard's own minimum may
    /// include a timeout. Returns (rate in bytes per second, round trip).
    fn judged(&self, conn: ConnId) -> (f64, Duration) {
        let Some(c) = self.conns.get(conn) else {
            return (0.0, Duration::ZERO);
        };
        let (sum, n, rtt) = self
            .conns
            .iter()
            .enumerate()
            .filter(|&(i, o)| i != conn && o.alive && o.path == c.path && o.rate() > 0.0)
            .fold((0.0, 0u32, c.min_rtt), |(s, n, t), (_, o)| {
                (s + o.rate(), n + 1, shorter(t, o.min_rtt))
            });
        let rtt = rtt.unwrap_or_default();
        if n == 0 {
            return (c.rate(), rtt);
        }
        // A connection not measured yet is judged so too: its path is known.
        (c.rate().max(SAME_PATH_FLOOR * sum / f64::from(n)), rtt)
    }

    /// Pull: whether `conn` may take the next item now (judged by [`Self::judged`]).
    ///
    /// Its bytes in flight stay under `rate * (rtt + pull_queue_delay)` (at least
    /// `pull_min_inflight`), so that it does not bury items deep in a socket buffer. And
    /// unless it is the fastest (someone must take each item), it takes the item only if it
    /// would deliver it before the other connections, at their rates, run out of window
    /// waiting for it (blocking estimation) or run out of work (what they carry and every
    /// item not handed out yet): a connection too slow for the window, or for the end of the
    /// stream, is left idle rather than holding up the join. A connection without a rate
    /// estimate yet, and no measured connection on its path, takes two items at a time (two,
    /// so that the second gives a rate sample).
    fn pull_may_take(&self, conn: ConnId) -> bool {
        let Some(c) = self.conns.get(conn).filter(|c| c.alive) else {
            return false;
        };
        let (rate, rtt) = self.judged(conn);
        let cap = (rate * (rtt + self.config.pull_queue_delay).as_secs_f64()) as u64;
        // Two items may always be in flight: the second gives a rate sample, and with items as
        // large as the minimum cap a single one would otherwise never let the rate be measured.
        if c.inflight.len() >= 2 && c.inflight_bytes >= cap.max(self.config.pull_min_inflight) {
            return false;
        }
        let Some(next) = self
            .orphans
            .first_key_value()
            .map(|(_, o)| o.0)
            .or_else(|| self.pending.front().map(|p| p.0))
        else {
            return true;
        };
        if rate <= 0.0 {
            return c.inflight.len() < 2;
        }
        let others = self
            .conns
            .iter()
            .enumerate()
            .filter(|&(i, o)| i != conn && o.alive);
        // The others at their own estimates: a laggard's credit is for itself only.
        let (rate_others, fastest_other, inflight_others, rtt_others) = others.fold(
            (0.0, 0.0f64, 0u64, None::<Duration>),
            |(r, f, b, t), (_, o)| {
                (
                    r + o.rate(),
                    f.max(o.rate()),
                    b + o.inflight_bytes,
                    shorter(t, o.min_rtt),
                )
            },
        );
        if rate_others <= 0.0 {
            return true;
        }
        // The fastest connection always may: someone must, or a small item (an end marker,
        // whose length says nothing about the window's bytes) could stall the edge. (Its own
        // estimate is never above the rate it is judged by.)
        if fastest_other <= rate {
            return true;
        }
        let len = f64::from(next.len);
        let done_in = (c.inflight_bytes as f64 + len) / rate + rtt.as_secs_f64() / 2.0;
        // A slower connection takes the next item only if it delivers it before the others
        // would stall: on the window (the join waits for this item while they fill it; the
        // window's items are as large as the largest seen so far), or for want of anything
        // else to send (what they carry and everything not handed out yet, this item
        // included: at the end of a stream, or when the source is the limit, the slower
        // connection would only make the last byte later).
        let item = len.max(self.max_item as f64);
        let window = (self.base + self.config.window).saturating_sub(next.index) as f64 * item;
        let orphaned: u64 = self.orphans.values().map(|(i, _)| u64::from(i.len)).sum();
        let work = (inflight_others + self.pending_bytes + orphaned) as f64;
        let others_done = work / rate_others + rtt_others.unwrap_or_default().as_secs_f64() / 2.0;
        done_in <= (window / rate_others).min(others_done)
    }

    /// The oldest item the join waits for (unacknowledged while a later one was acknowledged)
    /// on a connection other than `conn` that has stalled, and that was not sent twice
    /// already. A connection has stalled when nothing it carries arrived for
    /// [`StriperConfig::hedge_after`] times its usual time for its oldest frame (its round trip
    /// plus the frame at its rate): a retransmission timeout, not a queue.
    fn late_item(&self, conn: ConnId, now: Instant) -> Option<(Item, Instant)> {
        if self.config.hedge_after <= 0.0 {
            return None;
        }
        let newest_acked = *self.acked_ahead.last()?;
        let mut late: Option<&Sent> = None;
        for (i, c) in self.conns.iter().enumerate() {
            let Some(head) = c.inflight.front() else {
                continue;
            };
            if i == conn || !c.alive {
                continue;
            }
            let (rate, rtt) = self.judged(i);
            if rate <= 0.0 {
                continue;
            }
            let usual = rtt.as_secs_f64() + f64::from(head.item.len) / rate;
            let since = c.last_done.map_or(head.sent_at, |d| d.max(head.sent_at));
            if now.saturating_duration_since(since).as_secs_f64() <= self.config.hedge_after * usual
            {
                continue;
            }
            for s in &c.inflight {
                let index = s.item.index;
                if index < self.base
                    || index >= newest_acked
                    || late.is_some_and(|l| l.item.index < index)
                    || self.hedged.contains(&index)
                    || self.acked_ahead.contains(&index)
                {
                    continue;
                }
                late = Some(s);
            }
        }
        late.map(|s| (s.item, s.dealt_at))
    }

    /// The fork (weighted and equal): deals waiting input, in order, into the connections'
    /// buffers of `B * w_i` bytes. As in the paper, it blocks on the next connection in the
    /// deal order while that one's buffer is still full, however much room the others have:
    /// this is what makes equal blocks run at N times the slowest rate (eq. 1).
    fn fork(&mut self, now: Instant) {
        if self.config.scheduler == Scheduler::Pull || !self.conns.iter().any(|c| c.alive) {
            return;
        }
        let block = self.config.weighted.block as f64;
        while let Some(&(item, _)) = self.pending.front() {
            let t = self.deal_target(item.len);
            let c = &mut self.conns[t];
            let room = (block * c.weight).max(f64::from(item.len)) as u64;
            if !c.dealt.is_empty() && c.dealt_bytes + u64::from(item.len) > room {
                return;
            }
            c.deficit -= f64::from(item.len);
            c.dealt.push_back((item, now));
            c.dealt_bytes += u64::from(item.len);
            self.pending.pop_front();
            self.pending_bytes -= u64::from(item.len);
        }
    }

    /// Deficit round robin over the live connections with quantum `B * w_i`: the fixed,
    /// weighted deal order of the fork. Returns the connection the next item of `len` bytes
    /// goes to without charging it, so asking again gives the same answer.
    fn deal_target(&mut self, len: u32) -> usize {
        let n = self.conns.len();
        let block = self.config.weighted.block.max(1) as f64;
        let len = f64::from(len);
        if !self.arrived {
            let c = &mut self.conns[self.cursor];
            if c.alive {
                c.deficit += block * c.weight;
            }
            self.arrived = true;
        }
        loop {
            let c = &mut self.conns[self.cursor];
            if c.alive && c.deficit >= len {
                return self.cursor;
            }
            self.cursor = (self.cursor + 1) % n;
            let c = &mut self.conns[self.cursor];
            if c.alive {
                c.deficit += block * c.weight;
            }
        }
    }

    fn set_weights(&mut self, weights: impl Fn(&Conn) -> f64) {
        for c in &mut self.conns {
            c.weight = weights(c);
            c.deficit = 0.0;
        }
        // A new round from the first connection.
        self.cursor = 0;
        self.arrived = false;
        self.normalize_weights();
    }

    /// The fastest live connection at weight 1, none under the minimum.
    fn normalize_weights(&mut self) {
        let max = self
            .conns
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.weight)
            .fold(0.0, f64::max);
        let min = self.config.weighted.min_weight;
        for c in &mut self.conns {
            c.weight = if max > 0.0 {
                (c.weight / max).max(min)
            } else {
                1.0
            };
        }
    }

    fn reset_periods(&mut self) {
        for c in &mut self.conns {
            c.reset_period();
        }
    }

    fn restart_measure(&mut self, now: Instant) {
        self.set_weights(|_| 1.0);
        self.reset_periods();
        let ctl = &mut self.controller;
        ctl.phase = Phase::Measure;
        ctl.settle_until = None;
        ctl.early_done = false;
        ctl.history.clear();
        ctl.last_reweight = Some(now);
    }

    /// Eq. 2 from the last measurement: `B_i = B * r_i / r_max`.
    fn reweight(&mut self, rates: &[Option<f64>], now: Instant) {
        self.set_weights(|_| 0.0);
        for (c, r) in self.conns.iter_mut().zip(rates) {
            c.weight = r.unwrap_or(0.0);
        }
        self.normalize_weights();
        self.reset_periods();
        let ctl = &mut self.controller;
        ctl.stats.reweights += 1;
        ctl.last_reweight = Some(now);
    }

    fn settle(&mut self, then: Phase, now: Instant) {
        self.controller.phase = Phase::Settle;
        self.controller.settle_until = Some((now + self.config.weighted.settle, then));
    }

    /// The controller of section 3, run on every acknowledgement.
    fn control(&mut self, now: Instant) {
        let cfg = &self.config.weighted;
        if let Some((until, then)) = self.controller.settle_until {
            if now >= until {
                self.controller.settle_until = None;
                self.controller.phase = then;
                self.reset_periods();
            }
            return;
        }
        if self.controller.phase == Phase::Track {
            if let (Some(alarm), Some(last)) = (cfg.alarm, self.controller.last_reweight) {
                if now >= last + alarm {
                    self.controller.stats.alarms += 1;
                    self.restart_measure(now);
                    return;
                }
            }
        }
        let live = self.conns.iter().filter(|c| c.alive).count() as u64;
        if live == 0 {
            return;
        }
        let steps = u64::from(cfg.steps).div_ceil(live).max(2);
        let period = steps * live * cfg.block.max(1);
        let acked: u64 = self.conns.iter().map(|c| c.p_bytes).sum();
        if acked < period {
            return;
        }
        // The measurement: per-connection rate (bytes per busy second) and mean sojourn time
        // (fork to join: dealt to acknowledged).
        let rates: Vec<Option<f64>> = self
            .conns
            .iter()
            .map(|c| {
                (c.alive && c.p_service > 0.0)
                    .then(|| c.p_rate_bytes as f64 / c.p_service)
                    .or_else(|| (c.alive && c.rate() > 0.0).then(|| c.rate()))
            })
            .collect();
        let sojourns: Vec<f64> = self
            .conns
            .iter()
            .filter(|c| c.alive && c.p_items > 0)
            .map(|c| c.p_sojourn / c.p_items as f64)
            .collect();
        let n = sojourns.len().max(1) as f64;
        let mean = sojourns.iter().sum::<f64>() / n;
        let sd = (sojourns.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
        self.controller.stats.mean_sojourn = Some(Duration::from_secs_f64(mean));
        let threshold = cfg.threshold;
        match self.controller.phase {
            Phase::Measure => {
                self.controller.equal = Some((mean, sd));
                self.reweight(&rates, now);
                self.settle(Phase::Check, now);
            }
            Phase::Check => {
                let (eq_mean, eq_sd) = self.controller.equal.unwrap_or((mean, sd));
                if mean > eq_mean && sd > eq_sd {
                    // Worse on both counts: keep equal blocks.
                    self.controller.stats.reverted += 1;
                    self.set_weights(|_| 1.0);
                    self.reset_periods();
                    self.controller.history = VecDeque::from([eq_mean]);
                    self.controller.phase = Phase::Track;
                } else if mean > eq_mean && !self.controller.early_done {
                    // Only the mean is worse: re-weight early from this measurement.
                    self.controller.early_done = true;
                    self.reweight(&rates, now);
                    self.settle(Phase::Track, now);
                } else {
                    self.reset_periods();
                    self.controller.history = VecDeque::from([mean]);
                    self.controller.phase = Phase::Track;
                }
            }
            Phase::Track => {
                let h = &self.controller.history;
                let reference = if h.is_empty() {
                    mean
                } else {
                    h.iter().sum::<f64>() / h.len() as f64
                };
                if mean > (1.0 + threshold) * reference {
                    self.controller.stats.triggered += 1;
                    self.restart_measure(now);
                } else {
                    let h = &mut self.controller.history;
                    h.push_back(mean);
                    if h.len() > 3 {
                        h.pop_front();
                    }
                    self.reset_periods();
                }
            }
            Phase::Settle | Phase::Off => self.reset_periods(),
        }
    }
}

/// The shorter of two round trips, either of which may be unknown.
fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn striper(scheduler: Scheduler, window: u64, conns: usize) -> (Striper, Instant) {
        let now = Instant::now();
        let mut s = Striper::new(StriperConfig {
            window,
            ..StriperConfig::with(scheduler)
        });
        for _ in 0..conns {
            s.add_conn(now);
        }
        (s, now)
    }

    /// Pull: two items per connection, acknowledged 10 and 20 ms later, so that each has a
    /// rate (100 kB/s) and may take more. Returns the acknowledged items and the new time.
    fn prime(s: &mut Striper, now: Instant) -> (Vec<u64>, Instant) {
        let n = s.stats().len();
        let items: Vec<(usize, Item)> = (0..n)
            .flat_map(|c| [c, c])
            .map(|c| (c, s.poll_assign(c, now).expect("a first item")))
            .collect();
        for (k, (c, i)) in items.iter().enumerate() {
            let at = now + Duration::from_millis(10 * (1 + k as u64 % 2));
            s.handle_acked(*c, i.index, at).expect("in flight");
        }
        let done = items.iter().map(|(_, i)| i.index).collect();
        (done, now + Duration::from_millis(20))
    }

    fn fill(s: &mut Striper, now: Instant) {
        while s.wants_input() {
            s.handle_input(1000, now).expect("wanted");
        }
    }

    #[test]
    fn pull_sends_a_late_oldest_item_again_on_another_connection_once() {
        let ms = Duration::from_millis;
        for late_copy_arrives in [true, false] {
            let (mut s, now) = striper(Scheduler::Pull, 64, 2);
            fill(&mut s, now);
            // Each connection: 100 kB/s, 10 ms round trip; a 1000-byte item usually takes 20 ms.
            let (_, now) = prime(&mut s, now);
            fill(&mut s, now);
            let stuck = s.poll_assign(0, now).expect("an item");
            assert_eq!(stuck.index, s.acked_below(), "the oldest");
            let mut t = now;
            let mut delivered = vec![stuck.index];
            // Connection 1 delivers the next items while connection 0 holds the oldest.
            for _ in 0..4 {
                let i = s.poll_assign(1, t).expect("an item");
                assert_ne!(i.index, stuck.index, "not late yet at {:?}", t - now);
                t += ms(10);
                s.handle_acked(1, i.index, t).expect("in flight");
                delivered.push(i.index);
            }
            assert_eq!(s.hedges(), 0);
            // At 100 ms it is five times late: connection 1 sends it again, once.
            t = now + ms(100);
            let again = s.poll_assign(1, t).expect("an item");
            assert_eq!(again, stuck);
            assert_eq!(s.hedges(), 1);
            s.handle_acked(1, stuck.index, t + ms(10))
                .expect("in flight");
            assert_eq!(s.acked_below(), stuck.index + 5, "the join moves on");
            if late_copy_arrives {
                // The first copy arrives after all: acknowledged, nothing else changes.
                s.handle_acked(0, stuck.index, t + ms(20))
                    .expect("first copy in flight");
            } else {
                // Connection 0 fails with the first copy: it is not handed out a third time.
                s.handle_conn_lost(0, t).expect("known");
            }
            let rest: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, t + ms(30)))
                .map(|i| i.index)
                .collect();
            assert!(!rest.contains(&stuck.index), "{rest:?}");
            delivered.extend(rest);
            delivered.sort();
            assert_eq!(
                delivered,
                (stuck.index..s.items_in()).collect::<Vec<_>>(),
                "each item handed out, the late one twice only"
            );
        }
    }

    #[test]
    fn pull_judges_a_laggard_by_the_others_on_its_path() {
        let ms = Duration::from_millis;
        for same_path in [true, false] {
            let now = Instant::now();
            let mut s = Striper::new(StriperConfig {
                window: 16,
                ..StriperConfig::with(Scheduler::Pull)
            });
            for path in 0..3 {
                s.add_conn_on(if same_path { 0 } else { path }, now);
            }
            fill(&mut s, now);
            // Connections 0 and 1 deliver two items each within 20 ms (100 kB/s); connection
            // 2 takes a second per item (a timeout in its first round trips): 1 kB/s.
            for (c, gap) in [(0, ms(10)), (1, ms(10)), (2, ms(1000))] {
                let a = s.poll_assign(c, now).expect("a first item");
                let b = s.poll_assign(c, now).expect("a second item");
                s.handle_acked(c, a.index, now + gap).expect("in flight");
                s.handle_acked(c, b.index, now + 2 * gap)
                    .expect("in flight");
            }
            fill(&mut s, now + ms(2000));
            // At its own rate, its next item would take a second, while the others run
            // through the whole window in 80 ms: left idle. On the others' path it is judged
            // at half their rate, and takes it.
            let took = s.poll_assign(2, now + ms(2000)).is_some();
            assert_eq!(took, same_path, "same path: {same_path}");
        }
    }

    #[test]
    fn pull_judges_a_new_connection_by_the_measured_ones_on_its_path() {
        for same_path in [true, false] {
            let (mut s, now) = striper(Scheduler::Pull, 64, 2);
            fill(&mut s, now);
            let (_, now) = prime(&mut s, now);
            let new = s.add_conn_on(if same_path { 0 } else { 1 }, now);
            fill(&mut s, now);
            // Unmeasured: two items, for a rate sample; but on a path whose connections
            // deliver 100 kB/s it is judged at half that from the start.
            let took = std::iter::from_fn(|| s.poll_assign(new, now)).count();
            if same_path {
                assert!(took > 2, "took {took}");
            } else {
                assert_eq!(took, 2);
            }
        }
    }

    #[test]
    fn pull_measures_a_rate_when_one_item_fills_the_minimum_cap() {
        // Items as large as `pull_min_inflight`: one alone would reach the cap, and a
        // connection that only ever has one item in flight never gets a rate sample.
        let (mut s, t0) = striper(Scheduler::Pull, 64, 1);
        for _ in 0..4 {
            s.handle_input((256 << 10) + 96, t0).unwrap();
        }
        let first = s.poll_assign(0, t0).expect("first item");
        let second = s.poll_assign(0, t0).expect("a second item in flight");
        s.handle_acked(0, first.index, t0 + Duration::from_millis(5))
            .unwrap();
        s.handle_acked(0, second.index, t0 + Duration::from_millis(7))
            .unwrap();
        assert!(s.stats()[0].rate > 0.0, "{:?}", s.stats()[0]);
    }

    #[test]
    fn a_small_item_after_large_ones_is_taken_by_some_connection() {
        // Two measured connections, one ten times faster, then a window of large items and a
        // small one last (an end marker). Judged by its own length, the window ahead of the
        // small item is a few hundred bytes, which no connection could deliver within; the
        // fastest must take it anyway, or the edge stalls.
        let (mut s, t0) = striper(Scheduler::Pull, 8, 2);
        for _ in 0..4 {
            s.handle_input(256 << 10, t0).expect("wanted");
        }
        let a = [s.poll_assign(0, t0).unwrap(), s.poll_assign(0, t0).unwrap()];
        let b = [s.poll_assign(1, t0).unwrap(), s.poll_assign(1, t0).unwrap()];
        for (k, i) in a.iter().enumerate() {
            s.handle_acked(0, i.index, t0 + Duration::from_millis(20 * (k as u64 + 1)))
                .unwrap();
        }
        for (k, i) in b.iter().enumerate() {
            s.handle_acked(1, i.index, t0 + Duration::from_millis(2 * (k as u64 + 1)))
                .unwrap();
        }
        let now = t0 + Duration::from_millis(50);
        while s.items_in() < s.acked_below() + 7 {
            s.handle_input(256 << 10, now).unwrap();
        }
        let small = s.handle_input(64, now).unwrap();
        assert!(!s.wants_input(), "the window is full");
        let mut sent = Vec::new();
        for _ in 0..16 {
            for c in 0..2 {
                if let Some(i) = s.poll_assign(c, now) {
                    sent.push((c, i.index));
                }
            }
        }
        // Acknowledge all but the small one, then it must go.
        for &(c, i) in &sent {
            s.handle_acked(c, i, now + Duration::from_millis(60))
                .unwrap();
        }
        let later = now + Duration::from_millis(60);
        let took: Vec<_> = (0..2)
            .filter_map(|c| s.poll_assign(c, later).map(|i| (c, i.index)))
            .chain(sent.iter().copied())
            .filter(|&(_, i)| i == small)
            .collect();
        assert_eq!(took.len(), 1, "the small item went out once: {took:?}");
    }

    #[test]
    fn input_stops_at_the_window_past_the_oldest_unacknowledged_item() {
        let (mut s, now) = striper(Scheduler::Pull, 4, 2);
        fill(&mut s, now);
        assert_eq!(s.items_in(), 4);
        assert_eq!(s.handle_input(1000, now), Err(StripeError::WindowFull));
        let a = s.poll_assign(0, now).expect("item 0");
        let b = s.poll_assign(1, now).expect("item 1");
        assert_eq!((a.index, b.index), (0, 1));
        // Acknowledging item 1 does not move the window; item 0 does, past both.
        s.handle_acked(1, 1, now).expect("in flight");
        assert!(!s.wants_input());
        s.handle_acked(0, 0, now).expect("in flight");
        assert_eq!(s.acked_below(), 2);
        fill(&mut s, now);
        assert_eq!(s.items_in(), 6);
    }

    #[test]
    fn acknowledgements_must_match_what_is_in_flight() {
        let (mut s, now) = striper(Scheduler::Pull, 8, 2);
        fill(&mut s, now);
        let a = s.poll_assign(0, now).expect("item");
        assert_eq!(
            s.handle_acked(1, a.index, now),
            Err(StripeError::NotInFlight { conn: 1, index: 0 })
        );
        assert_eq!(s.handle_acked(7, 0, now), Err(StripeError::UnknownConn(7)));
        s.handle_acked(0, a.index, now).expect("in flight");
        assert!(
            s.handle_acked(0, a.index, now).is_err(),
            "acknowledged twice"
        );
    }

    #[test]
    fn a_lost_connection_hands_its_items_to_the_others_oldest_first() {
        for scheduler in [Scheduler::Pull, Scheduler::Weighted, Scheduler::Equal] {
            let (mut s, now) = striper(scheduler, 64, 2);
            fill(&mut s, now);
            let (mut done, now) = if scheduler == Scheduler::Pull {
                prime(&mut s, now)
            } else {
                (Vec::new(), now)
            };
            fill(&mut s, now);
            let mut on0 = Vec::new();
            while let Some(i) = s.poll_assign(0, now) {
                on0.push(i.index);
                if on0.len() == 5 {
                    break;
                }
            }
            assert!(!on0.is_empty(), "{scheduler:?}");
            s.handle_acked(0, on0[0], now).expect("in flight");
            s.handle_conn_lost(0, now).expect("known");
            assert_eq!(s.poll_assign(0, now), None, "{scheduler:?}: lost");
            // Connection 1 now gets connection 0's unacknowledged items first, in order.
            let again: Vec<u64> = (1..on0.len())
                .map(|_| s.poll_assign(1, now).expect("reassigned").index)
                .collect();
            assert_eq!(again, on0[1..].to_vec(), "{scheduler:?}");
            // Then everything else, each index once.
            let mut rest: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, now))
                .map(|i| i.index)
                .collect();
            rest.extend(on0);
            rest.append(&mut done);
            rest.sort();
            assert_eq!(rest, (0..s.items_in()).collect::<Vec<_>>(), "{scheduler:?}");
        }
    }

    #[test]
    fn equal_dealing_is_round_robin_in_blocks_and_blocks_on_a_full_buffer() {
        let (mut s, now) = striper(Scheduler::Equal, 1000, 2);
        // 512 KiB blocks of 64 KiB items: 8 items per connection per round.
        for _ in 0..40 {
            s.handle_input(64 << 10, now).expect("wanted");
        }
        let st = s.stats();
        // The fork filled one buffer each and waits for connection 0 to take from its own.
        assert_eq!((st[0].queued_items, st[1].queued_items), (8, 8));
        let on1: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, now))
            .map(|i| i.index)
            .collect();
        assert_eq!(on1, (8..16).collect::<Vec<_>>());
        let on0: Vec<u64> = std::iter::from_fn(|| s.poll_assign(0, now))
            .map(|i| i.index)
            .take(9)
            .collect();
        assert_eq!(on0, (0..8).chain(16..17).collect::<Vec<_>>());
    }

    #[test]
    fn pull_caps_what_a_connection_has_in_flight() {
        let (mut s, now) = striper(Scheduler::Pull, 1000, 1);
        fill(&mut s, now);
        // Without a rate estimate: two items at a time.
        assert!(s.poll_assign(0, now).is_some());
        assert!(s.poll_assign(0, now).is_some());
        assert!(s.poll_assign(0, now).is_none());
        // The first acknowledgement after idle gives no rate, the second does: 100 kB/s.
        s.handle_acked(0, 0, now + Duration::from_millis(20))
            .expect("in flight");
        assert_eq!(s.stats()[0].rate, 0.0);
        let now = now + Duration::from_millis(30);
        s.handle_acked(0, 1, now).expect("in flight");
        assert!(
            (s.stats()[0].rate - 1e5).abs() < 1.0,
            "{}",
            s.stats()[0].rate
        );
        fill(&mut s, now);
        let cap = s.config().pull_min_inflight;
        let taken = std::iter::from_fn(|| s.poll_assign(0, now)).count() as u64;
        assert_eq!(taken, cap.div_ceil(1000));
        let st = &s.stats()[0];
        assert_eq!(st.inflight_bytes, taken * 1000);
    }
}
