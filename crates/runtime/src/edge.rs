//! Multi-stream edges: one overlay edge carried over several TCP connections, possibly to
//! several addresses (paths) of the child.
//!
//! The parent side ([`OutEdge`]) numbers every frame the node sends to the child, wraps it in
//! `Spread{seq}` and lets a [`Spreader`] deal it to a connection whose socket has room. The
//! child side ([`InEdge`]) puts the frames back in order with a [`Joiner`] and answers
//! `Got{seq}` on the connection that carried each, which is what the spreader measures each
//! connection by. Frames the child sends up (acknowledgements, requests) all use connection 0.
//!
//! Set-up: connection 0 is made like a plain edge (handshake, `Open`), then announces the edge
//! with `Attach{conn: 0, token, window}`. Every further connection passes the handshake and sends
//! `Attach{conn: i, token, window}`; the child's agent hands it to the session through
//! [`Attachments`]. The others are dialled as soon as connection 0 has reached the child, so an
//! `Attach` may arrive before the `Open`: the agent holds it until the session registers.
//! Connections can be added at any time, which is how `--streams auto` grows.
//!
//! Why a parent-side window *and* a larger child-side one: the parent sends nothing at or beyond
//! `oldest unacknowledged + window`; the child acknowledges a frame when it takes it from the
//! socket, but releases frames to the node only while the node wants input. Frames it took and
//! could release but the node has not wanted yet (at most one window: it reads nothing new while
//! it has such frames) sit below the parent's window, so the child accepts up to two windows.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::transport::Stream;
use bulkcast_proto::multipath::grow::{start_for, Decision, Grow};
use bulkcast_proto::multipath::{
    ConnStats, JoinError, Joiner, Scheduler, Spreader, SpreaderConfig, SpreaderError,
};
use bulkcast_proto::node::{Link, Node};
use bulkcast_proto::wire::{EdgeMode, EdgeScheduler, Frame, SessionId};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::writer::{Outbox, Written};

/// Bytes an edge may have in flight beyond its oldest unacknowledged frame: the reorder
/// window. It must cover the summed rate of the connections times the longest round trip
/// (1 Gbit/s × 100 ms = 12.5 MB); it also bounds what the child holds for reordering.
pub const WINDOW_BYTES: u64 = 32 << 20;

/// The most connections `--streams auto` opens per edge.
pub const AUTO_MAX_STREAMS: u16 = 8;

/// How often `--streams auto` compares the edge's rate with the rate before its last added
/// connection. Long enough for a new connection to leave slow start on a 100 ms path.
pub const AUTO_INTERVAL: Duration = Duration::from_millis(1000);

/// An added connection must raise the settled rate by this fraction to be followed by another.
pub const AUTO_GAIN: f64 = 0.10;

/// The reorder window in frames for a chunk size: [`WINDOW_BYTES`] worth, between 16 and 4096.
pub fn window_for(chunk_size: u32) -> u32 {
    (WINDOW_BYTES / u64::from(chunk_size.max(1))).clamp(16, 4096) as u32
}

/// About the bytes a frame takes on the wire (what the spreader measures rates in).
fn frame_len(f: &Frame) -> u32 {
    match f {
        Frame::Chunk(c) => c.data.len() as u32 + 96,
        Frame::Part(p) => p.data.len() as u32 + 20,
        _ => 64,
    }
}

fn scheduler(s: EdgeScheduler) -> Scheduler {
    match s {
        EdgeScheduler::Pull => Scheduler::Pull,
        EdgeScheduler::Weighted => Scheduler::Weighted,
        EdgeScheduler::Equal => Scheduler::Equal,
    }
}

/// One connection of an edge, for reports and time series.
#[derive(Debug, Clone, Serialize)]
pub struct ConnReport {
    /// The connection's number on the edge.
    pub conn: u16,
    /// The child's address it goes to.
    pub addr: String,
    /// Bytes handed to it (frames with their headers, resent ones included).
    pub sent: u64,
    /// Bytes the child acknowledged on it (the last few may be unacknowledged when the
    /// session ends: the child's `Done` can overtake them).
    pub bytes: u64,
    /// Its current rate estimate, Mbit/s of busy time.
    pub mbps: f64,
    /// Its share of the frames (the scheduler's weight, normalised over live connections).
    pub weight: f64,
    /// Frames sent on it and not yet acknowledged.
    pub inflight: usize,
    /// False once it failed (its frames went to the others).
    pub alive: bool,
    /// Seconds from the edge's start until it passed the handshake (none: never did).
    pub opened_s: Option<f64>,
}

/// One edge's connections at a moment.
#[derive(Debug, Clone, Serialize)]
pub struct EdgeStreams {
    /// The child's name.
    pub edge: String,
    /// Sum of the live connections' rates, Mbit/s.
    pub total_mbps: f64,
    /// Every connection ever opened on the edge (`connections` in JSON, as in the report).
    #[serde(rename = "connections")]
    pub conns: Vec<ConnReport>,
    /// Frames sent a second time on another connection because the first was late with them
    /// while the join waited.
    pub hedges: u64,
    /// `tcp` or `udp` (the paced transport): what connection 0 got; `None` before it connected.
    pub transport: Option<String>,
}

/// What a [`StreamsObserver`] calls.
pub type StreamsFn = dyn Fn(&[EdgeStreams]) + Send + Sync;

/// An edge's attaching connections, by session and edge token.
type Waiting = HashMap<(SessionId, u64), mpsc::UnboundedSender<(u16, Stream)>>;

/// Receives the spread edges' figures periodically while a session runs (`--stats`, `-v`).
#[derive(Clone)]
pub struct StreamsObserver {
    /// How often.
    pub every: Duration,
    /// Called with every spread edge of the node.
    pub f: Arc<StreamsFn>,
}

impl std::fmt::Debug for StreamsObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamsObserver")
            .field("every", &self.every)
            .finish_non_exhaustive()
    }
}

struct OutConn {
    addr: String,
    /// Which of the child's addresses it goes to: its path, for the spreader.
    path: usize,
    /// The spreader's number for it, once connected.
    id: Option<usize>,
    /// Its writer, once connected; none again once it is lost or retired.
    tx: Option<Outbox>,
    sent: u64,
    /// When it passed the handshake, from the edge's start.
    opened: Option<Duration>,
}

/// `--streams auto`: the growth state and the current measurement interval.
struct AutoStreams {
    grow: Grow,
    /// Start of the current measurement.
    since: Instant,
    bytes_at_since: u64,
    /// Whether the edge had data waiting for the connections during the measurement (a rate
    /// measured while the source had nothing to send says nothing about connections).
    limited: bool,
}

/// The parent side of a spread edge.
pub struct OutEdge {
    name: String,
    spreader: Spreader,
    conns: Vec<OutConn>,
    /// The frames from `base` up, until acknowledged (a lost connection's are sent again).
    frames: VecDeque<Frame>,
    base: u64,
    /// Identifies this edge to the child's agent.
    pub token: u64,
    /// The reorder window in frames, announced in `Attach`.
    pub window: u32,
    addrs: Vec<String>,
    /// What connection 0 got (`tcp`, `udp`), once it reached the child.
    transport: Option<&'static str>,
    target: u16,
    grow: Option<AutoStreams>,
    chunk_size: u32,
    closed: bool,
    /// Whether the last connection lost had frames in flight (worth a warning).
    pub lost_busy: bool,
    /// When the edge was made (connection times are reported from here).
    started: Instant,
    /// [`OutEdge::set_ceiling`], in bytes/s.
    ceiling: Option<f64>,
    /// Whether connection 0 has reached the child ([`OutEdge::handle_dialed`]).
    dialed: bool,
}

impl OutEdge {
    /// An edge to `name` at `addrs` (main address first, then extra paths) carried as `mode`
    /// says, with frames of about `chunk_size` bytes. No connection yet.
    pub fn new(
        name: String,
        mode: EdgeMode,
        addrs: Vec<String>,
        chunk_size: u32,
        now: Instant,
    ) -> Self {
        let window = window_for(chunk_size);
        // Each connection's socket keeps at most `lowat` unsent bytes, so "its writer has
        // room" already follows its congestion window, as TCP's own self-clocking. The
        // spreader's in-flight cap (made for sockets with deep buffers) would only hold a
        // connection below its window while the rate estimate catches up with slow start, so it
        // is set out of the way; the window and the blocking estimate still keep a connection
        // too slow for the join from stalling it.
        let config = SpreaderConfig {
            window: u64::from(window),
            pull_queue_delay: Duration::from_secs(10),
            pull_min_inflight: 4 * u64::from(chunk_size),
            // A rate estimate that follows a connection's slow start within a few round
            // trips; the in-flight cap is derived from it.
            rate_tau: Duration::from_millis(150),
            ..SpreaderConfig::with(scheduler(mode.scheduler))
        };
        let paths = addrs.len().max(1) as u16;
        let (target, grow) = match mode.streams {
            // Connection 0 first; once its round trip is known, as many as `start_for` says
            // (see `handle_dialed`), then more while they add throughput.
            0 => {
                let start = paths.min(AUTO_MAX_STREAMS);
                let grow = AutoStreams {
                    grow: Grow::new(start, AUTO_MAX_STREAMS.max(start), AUTO_GAIN),
                    since: now,
                    bytes_at_since: 0,
                    limited: false,
                };
                (start, Some(grow))
            }
            n => (n, None),
        };
        Self {
            name,
            spreader: Spreader::new(config),
            conns: Vec::new(),
            frames: VecDeque::new(),
            base: 0,
            token: rand::random(),
            window,
            addrs,
            target,
            grow,
            chunk_size,
            closed: false,
            lost_busy: false,
            started: now,
            ceiling: None,
            dialed: false,
            transport: None,
        }
    }

    /// The unsent backlog each connection's socket may hold (`TCP_NOTSENT_LOWAT`): one frame.
    pub fn lowat(&self) -> u32 {
        self.chunk_size.max(64 << 10)
    }

    /// The `Attach` frame that introduces connection `conn`.
    pub fn attach_frame(&self, session: SessionId, conn: u16) -> Frame {
        Frame::Attach {
            session,
            token: self.token,
            conn,
            window: self.window,
        }
    }

    /// Connections to open now: their numbers and addresses (round-robin over the paths);
    /// connection 0 alone until it has reached the child ([`OutEdge::handle_dialed`]). Each is
    /// counted as opening from here on.
    pub fn poll_connect(&mut self, now: Instant) -> Vec<(u16, String)> {
        if self.closed {
            return Vec::new();
        }
        self.check_growth(now);
        let mut out = Vec::new();
        // The others once connection 0 has reached the child (its round trip sets how many,
        // and the address works), while it still passes the handshake and sends `Open`: the
        // child holds an `Attach` that comes first until its session registers the edge.
        while (self.conns.len() as u16) < self.target && (self.conns.is_empty() || self.dialed) {
            let n = self.conns.len() as u16;
            let path = n as usize % self.addrs.len();
            let addr = self.addrs[path].clone();
            self.conns.push(OutConn {
                addr: addr.clone(),
                path,
                id: None,
                tx: None,
                sent: 0,
                opened: None,
            });
            out.push((n, addr));
        }
        out
    }

    /// Connection 0 reached the child; `rtt` is its round trip as the transport measured it,
    /// which decides how many connections `--streams auto` starts with ([`start_for`]). Over
    /// the paced transport (`paced`), `auto` stays at that one connection: it keeps its rate
    /// under loss without help, and more would only reorder. The others are opened from here on.
    pub fn handle_dialed(&mut self, rtt: Option<Duration>, paced: bool, now: Instant) {
        if self.dialed {
            return;
        }
        self.dialed = true;
        self.transport = Some(if paced { "udp" } else { "tcp" });
        if paced && self.grow.take().is_some() {
            self.target = 1;
            tracing::debug!("edge to {}: one paced connection", self.name);
            return;
        }
        let acked = self.acked_bytes();
        if let Some(a) = &mut self.grow {
            // Measurements start now, not at the edge's creation (connecting is no interval).
            a.since = now;
            a.bytes_at_since = acked;
            a.limited = false;
            let paths = self.addrs.len().max(1) as u16;
            let start = start_for(rtt, paths).min(AUTO_MAX_STREAMS);
            a.grow = Grow::new(start, AUTO_MAX_STREAMS.max(start), AUTO_GAIN);
            a.grow.set_ceiling(self.ceiling);
            self.target = start;
            tracing::debug!(
                "edge to {}: round trip {:?}; starting with {start} connections",
                self.name,
                rtt
            );
        }
    }

    /// Connection `conn` passed the handshake; frames for it go to `tx`.
    pub(crate) fn handle_connected(&mut self, conn: u16, tx: Outbox, now: Instant) {
        let path = self.conns.get(conn as usize).map_or(0, |c| c.path);
        let id = self.spreader.add_conn_on(path, now);
        if let Some(c) = self.conns.get_mut(conn as usize) {
            c.id = Some(id);
            c.tx = Some(tx);
            c.opened = Some(now.saturating_duration_since(self.started));
        }
    }

    /// Connection `conn` could not be opened or failed: its frames go to the others. Returns
    /// false when no connection is left or opening (the edge is lost).
    pub fn handle_conn_lost(&mut self, conn: u16, now: Instant) -> bool {
        self.lost_busy = self
            .conns
            .get(conn as usize)
            .and_then(|c| c.id)
            .and_then(|id| self.spreader.stats().get(id).map(|s| s.inflight_items > 0))
            .unwrap_or(false);
        if let Some(c) = self.conns.get_mut(conn as usize) {
            c.tx = None;
            if let Some(id) = c.id {
                let _ = self.spreader.handle_conn_lost(id, now);
            }
            // A failed connection is not replaced by auto growth: it was counted.
            c.id = c.id.or(Some(usize::MAX));
        }
        self.conns.iter().any(|c| c.tx.is_some() || c.id.is_none())
    }

    /// Frames were written to connection `conn`'s socket.
    pub(crate) fn handle_written(&mut self, conn: u16, done: Written) {
        if let Some(tx) = self
            .conns
            .get_mut(conn as usize)
            .and_then(|c| c.tx.as_mut())
        {
            tx.handle_written(done);
        }
    }

    /// The child took frame `seq` from connection `conn`.
    pub fn handle_got(&mut self, conn: u16, seq: u64, now: Instant) -> Result<(), SpreaderError> {
        let c = self
            .conns
            .get(conn as usize)
            .ok_or(SpreaderError::UnknownConn(conn as usize))?;
        let Some(id) = c.id.filter(|&id| id != usize::MAX) else {
            return Err(SpreaderError::UnknownConn(conn as usize));
        };
        if c.tx.is_none() {
            // A connection lost or retired: its frames were handed to the others, and what it
            // still delivers is a second copy the child drops.
            return Ok(());
        }
        self.spreader.handle_acked(id, seq, now)?;
        let below = self.spreader.acked_below();
        while self.base < below {
            self.frames.pop_front();
            self.base += 1;
        }
        Ok(())
    }

    /// Moves frames from the node into the spreader while the window allows, and from the
    /// spreader to every connection whose writer has room.
    pub fn pump(&mut self, node: &mut Node, link: Link, now: Instant) -> Result<(), SpreaderError> {
        if self.closed {
            return Ok(());
        }
        loop {
            let mut moved = false;
            while self.spreader.wants_input() {
                let Some(f) = node.poll_transmit(link) else {
                    break;
                };
                let len = frame_len(&f);
                self.spreader.handle_input(len, now)?;
                self.frames.push_back(f);
                moved = true;
            }
            for c in self.conns.iter_mut() {
                let (Some(id), Some(tx)) = (c.id, &mut c.tx) else {
                    continue;
                };
                while tx.has_room() {
                    let Some(item) = self.spreader.poll_assign(id, now) else {
                        break;
                    };
                    let Some(f) = self.frames.get((item.index - self.base) as usize) else {
                        break;
                    };
                    let spread = Frame::Spread {
                        seq: item.index,
                        inner: Box::new(f.clone()),
                    };
                    if !tx.send(spread) {
                        // The writer is gone; its failure event is on the way and will hand
                        // this item to another connection.
                        break;
                    }
                    c.sent += u64::from(item.len);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        if self
            .grow
            .as_ref()
            .is_some_and(|a| !a.grow.is_done() && !a.limited)
        {
            // Data waiting that no connection could take: the connections are the limit.
            let limited =
                !self.spreader.wants_input() || self.frames.len() as u64 > self.in_flight_items();
            if let Some(a) = &mut self.grow {
                a.limited = limited;
            }
        }
        Ok(())
    }

    fn in_flight_items(&self) -> u64 {
        self.spreader
            .stats()
            .iter()
            .map(|s| s.inflight_items as u64)
            .sum()
    }

    fn acked_bytes(&self) -> u64 {
        self.spreader.stats().iter().map(|s| s.bytes_acked).sum()
    }

    /// `--streams auto`: at the end of each measurement interval, let [`Grow`] decide.
    fn check_growth(&mut self, now: Instant) {
        let acked = self.acked_bytes();
        let opened = self.conns.len() as u16;
        let Some(a) = &mut self.grow else { return };
        if a.grow.is_done() || opened < self.target || now < a.since + AUTO_INTERVAL {
            return;
        }
        let secs = now.duration_since(a.since).as_secs_f64();
        let rate = (acked - a.bytes_at_since) as f64 / secs;
        let limited = std::mem::take(&mut a.limited);
        a.since = now;
        a.bytes_at_since = acked;
        match a.grow.handle_interval(rate, limited) {
            Decision::Add => {
                self.target = a.grow.conns();
                tracing::debug!(
                    "edge to {}: settled at {:.1} Mbit/s; opening connection {}",
                    self.name,
                    rate * 8e-6,
                    self.target
                );
            }
            Decision::Retire => {
                tracing::debug!(
                    "edge to {}: {:.1} Mbit/s, no better with connection {}; closing it",
                    self.name,
                    rate * 8e-6,
                    opened
                );
                self.retire(opened - 1, now);
            }
            Decision::Stop => tracing::debug!(
                "edge to {}: {:.1} Mbit/s with {} connections; no more",
                self.name,
                rate * 8e-6,
                self.target
            ),
            Decision::Wait => {}
        }
    }

    /// Closes connection `conn` on purpose: its frames go to the others, its socket is shut
    /// once its writer has sent what it holds.
    fn retire(&mut self, conn: u16, now: Instant) {
        if let Some(c) = self.conns.get_mut(conn as usize) {
            c.tx = None;
            if let Some(id) = c.id {
                let _ = self.spreader.handle_conn_lost(id, now);
            }
        }
    }

    /// The link ended: no more frames or connections.
    pub fn close(&mut self) {
        self.closed = true;
        for c in &mut self.conns {
            c.tx = None;
        }
    }

    /// The most this edge may carry in bytes/s (its share of a relay's rate cap; `None`: no
    /// cap). `--streams auto` stops adding connections near it.
    pub fn set_ceiling(&mut self, bytes_per_sec: Option<u64>) {
        let c = bytes_per_sec.map(|b| b as f64);
        if self.ceiling != c {
            self.ceiling = c;
            if let Some(a) = &mut self.grow {
                a.grow.set_ceiling(c);
            }
        }
    }

    /// Connections up and not lost or retired.
    pub fn live_conns(&self) -> usize {
        self.conns
            .iter()
            .filter(|c| c.id.is_some() && c.tx.is_some())
            .count()
    }

    /// Whether the link is still in use.
    pub fn is_open(&self) -> bool {
        !self.closed
    }

    /// Whether the edge wants a timer (auto growth still deciding).
    pub fn wants_tick(&self) -> bool {
        self.grow.as_ref().is_some_and(|a| !a.grow.is_done())
    }

    /// The edge's connections now.
    pub fn report(&self) -> EdgeStreams {
        let stats: Vec<ConnStats> = self.spreader.stats();
        let conns: Vec<ConnReport> = self
            .conns
            .iter()
            .enumerate()
            .map(|(n, c)| {
                let s = c.id.and_then(|id| stats.get(id));
                ConnReport {
                    conn: n as u16,
                    addr: c.addr.clone(),
                    sent: c.sent,
                    bytes: s.map_or(0, |s| s.bytes_acked),
                    mbps: s.map_or(0.0, |s| s.rate * 8e-6),
                    weight: s.map_or(0.0, |s| s.weight),
                    inflight: s.map_or(0, |s| s.inflight_items),
                    alive: s.is_some_and(|s| s.alive) && c.tx.is_some(),
                    opened_s: c.opened.map(|d| d.as_secs_f64()),
                }
            })
            .collect();
        EdgeStreams {
            edge: self.name.clone(),
            total_mbps: conns.iter().filter(|c| c.alive).map(|c| c.mbps).sum(),
            conns,
            hedges: self.spreader.hedges(),
            transport: self.transport.map(String::from),
        }
    }
}

/// The child side of a spread edge: the join, and the `Got` answers.
pub struct InEdge<T> {
    /// The edge's token (connections attaching must carry it).
    pub token: u64,
    joiner: Joiner<T>,
    /// Per connection: where its `Got` frames go.
    acks: HashMap<u16, mpsc::UnboundedSender<Frame>>,
}

impl<T> InEdge<T> {
    /// A join for an edge whose parent announced `window`.
    pub fn new(token: u64, window: u32) -> Self {
        // Two windows (see the module doc) and the few frames in the readers' queue.
        Self {
            token,
            joiner: Joiner::new(2 * u64::from(window) + 16),
            acks: HashMap::new(),
        }
    }

    /// Connection `conn`'s `Got` frames go to `tx`.
    pub fn add_conn(&mut self, conn: u16, tx: mpsc::UnboundedSender<Frame>) {
        self.acks.insert(conn, tx);
    }

    /// Frame `seq` arrived on `conn`: hold it for the join and answer `Got` on that connection.
    pub fn handle(&mut self, conn: u16, seq: u64, item: T) -> Result<(), JoinError> {
        self.joiner.handle_item(seq, item)?;
        if let Some(tx) = self.acks.get(&conn) {
            let _ = tx.send(Frame::Got { seq });
        }
        Ok(())
    }

    /// The next frame in order, if it is here.
    pub fn poll_release(&mut self) -> Option<T> {
        self.joiner.poll_release().map(|(_, t)| t)
    }

    /// Whether a frame can be released now.
    pub fn has_ready(&self) -> bool {
        self.joiner.has_ready()
    }
}

/// Where an agent's sessions wait for the extra connections of their spread edges.
#[derive(Clone, Default, Debug)]
pub struct Attachments {
    inner: Arc<Mutex<Waiting>>,
}

/// How long an attaching connection waits for its session to announce the edge.
const ATTACH_WAIT: Duration = Duration::from_secs(10);

impl Attachments {
    /// Registers edge `token` of `session`: attaching connections arrive on the receiver.
    pub fn register(
        &self,
        session: SessionId,
        token: u64,
    ) -> mpsc::UnboundedReceiver<(u16, Stream)> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().insert((session, token), tx);
        rx
    }

    /// Removes the registration (the session ended).
    pub fn unregister(&self, session: SessionId, token: u64) {
        self.lock().remove(&(session, token));
    }

    /// Hands an admitted connection that sent `Attach` to its session, waiting a little for
    /// the session to register (connection 0's announcement may still be on its way).
    pub async fn deliver(
        &self,
        session: SessionId,
        token: u64,
        conn: u16,
        stream: Stream,
    ) -> Result<(), AttachError> {
        let deadline = Instant::now() + ATTACH_WAIT;
        let mut stream = Some(stream);
        loop {
            if let Some(tx) = self.lock().get(&(session, token)) {
                let s = stream.take().expect("sent once");
                return tx.send((conn, s)).map_err(|_| AttachError::Ended(session));
            }
            if Instant::now() >= deadline {
                return Err(AttachError::NoSession(session, conn));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a further connection of a spread edge found no session to join.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No session with that edge registered here in time (connection number given).
    #[error("no session {0:016x} with that edge here (connection {1})")]
    NoSession(SessionId, u16),
    /// The session has ended.
    #[error("session {0:016x} has ended")]
    Ended(SessionId),
}
