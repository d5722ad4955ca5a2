//! The sending side of a spread edge: which connection carries which item.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::{ConnId, Item};

mod weighted;
use weighted::Controller;

/// Pull: a connection is judged at least this fraction as fast as the mean of the others on
/// its path ([`Spreader::add_conn_on`]): half, because TCP flows sharing one bottleneck settle
/// within a factor of two of each other, so a connection slower than that is in a transient.
const SAME_PATH_FLOOR: f64 = 0.5;

/// How items are dealt to connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheduler {
    /// Each connection takes the next item whenever its socket has room and its own in-flight
    /// cap ([`SpreaderConfig::pull_queue_delay`]) allows: self-clocking.
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

/// Settings of a [`Spreader`].
#[derive(Debug, Clone)]
pub struct SpreaderConfig {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The reorder window in items, as agreed with the receiver's [`Joiner`](super::Joiner):
    /// the spreader never hands out an item at or beyond `oldest un-acknowledged + window`.
    pub window: u64,
    /// Pull only: a connection takes a new item only while its bytes in flight are under
    /// `rate * (rtt + pull_queue_delay)` (its rate and round trip as judged against its path,
    /// see [`Spreader::add_conn_on`]), so that a
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

impl Default for SpreaderConfig {
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

impl SpreaderConfig {
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
pub enum SpreaderError {
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
    /// Input offered while [`Spreader::wants_input`] is false.
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
pub struct Spreader {
    config: SpreaderConfig,
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
    /// Unacknowledged items sent a second time (see [`SpreaderConfig::hedge_after`]), and how
    /// many items were.
    hedged: BTreeSet<u64>,
    hedges: u64,
    /// Weighted deal: the connection being dealt to.
    cursor: usize,
    /// Whether `cursor` has had its quantum for this round.
    arrived: bool,
    controller: Controller,
}

impl Spreader {
    /// A spreader with no connections yet.
    pub fn new(config: SpreaderConfig) -> Self {
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
    pub fn handle_input(&mut self, len: u32, now: Instant) -> Result<u64, SpreaderError> {
        if !self.wants_input() {
            return Err(SpreaderError::WindowFull);
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
    ) -> Result<(), SpreaderError> {
        let tau = self.config.rate_tau.as_secs_f64();
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(SpreaderError::UnknownConn(conn))?;
        let pos = c
            .inflight
            .iter()
            .position(|s| s.item.index == index)
            .filter(|_| c.alive)
            .ok_or(SpreaderError::NotInFlight { conn, index })?;
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
    pub fn handle_conn_lost(&mut self, conn: ConnId, now: Instant) -> Result<(), SpreaderError> {
        let c = self
            .conns
            .get_mut(conn)
            .ok_or(SpreaderError::UnknownConn(conn))?;
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
    pub fn config(&self) -> &SpreaderConfig {
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
    /// [`SpreaderConfig::hedge_after`] times its usual time for its oldest frame (its round trip
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
}

/// The shorter of two round trips, either of which may be unknown.
fn shorter(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
