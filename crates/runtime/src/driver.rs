//! The event loop that drives one [`Node`]: it owns the node's sockets, its input or local copy,
//! and its timer, and does nothing the node did not ask for.
//!
//! Reading and writing run in one task per connection. A connection's writer
//! ([`crate::writer`]) takes at most [`WRITE_SLOTS`] payload frames at a time and reports each
//! one written, so a slow socket stops `poll_transmit` for that link (and, through the node's
//! buffer, reading upstream). The
//! parent's reader hands frames over a small bounded channel that is drained only while the
//! node wants input, which back-pressures the parent through TCP.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::node::{Event, Link, Node};
use bulkcast_proto::wire::{self, Chunk, Frame, SessionId};
use tokio::io::AsyncRead;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::edge::{Attachments, EdgeStreams, InEdge, OutEdge};
use crate::input::{InputError, InputEvent};
use crate::predial::PreDialed;
use crate::store::{LocalCopy, StoreEvent};
use crate::transport::{self, Stream, TcpTuning};

pub use crate::writer::WRITE_SLOTS;
use crate::writer::{
    child_socket, recv_opt_unbounded, write_acks, write_conn, Note, Outbox, SocketControl, Written,
};

/// See [`Driver::linger`]: a few round trips of the longest paths, so that the parent, which
/// closes once it has our `Done`, normally closes first.
const LINGER: Duration = Duration::from_secs(2);

/// The share of its declared uplink a relay lets its children's connections use together.
///
/// A relay receives and sends at once. The acknowledgements of what it receives leave through
/// the same uplink as what it sends, and a drop-tail queue there holds them behind up to its
/// whole depth of data (100 ms on a typical access link): its parent then sees a round trip
/// inflated and jittery by that much and slows down, and so does every hop below. Pacing what
/// it sends a little below the uplink keeps that queue empty. The acknowledgements of a
/// full-rate incoming flow need about 2% of the link, and the cap counts payload while the link
/// carries headers too (3.5% more): 0.95 x 1.035 + 0.02 is the whole link. In the lab
/// (`seed000-aws5-8rx`, iperf3 into and out of one relay at once) the incoming flow fell to 20
/// Mbit/s of 100 without a cap and held 94 with it. In the seed-000 chain, 0.96 and 0.97 let
/// the 13 ms hop fall 0.5-0.6 s behind its feed again (0.25 s at 0.95), though the whole chain,
/// 1-2% faster per hop, ended level or 0.1-0.2 s sooner: a deeper queue than the lab's 100 ms
/// would tip that back, so the cap stays where no queue builds.
pub const RELAY_UPLINK_SHARE: f64 = 0.95;

/// Events from the link tasks; `u16` is the connection's number on a spread edge (0 for a
/// plain link).
enum Ev {
    Frame(Link, u16, Frame),
    Closed(Link, u16, String),
    Written(Link, u16, Written),
    /// A spread edge's connection 0 reached the child (before our handshake), with the round
    /// trip its transport measured and which transport it got.
    Dialed(usize, Option<Duration>, transport::Transport),
    Connected(usize, u16, Stream),
    ConnectFailed(usize, u16, String),
}

/// Why a driver ended its session early.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The parent sent what the protocol does not allow here (a frame out of place, a spread
    /// frame before the edge was announced, a forged chunk or `End`).
    #[error("parent broke the protocol: {0}")]
    Parent(String),
    /// The source's input could not be read, or changed while it was read.
    #[error("{0}")]
    Input(#[from] InputError),
    /// The source's node refused a chunk of its own input.
    #[error("{0}")]
    Node(#[from] bulkcast_proto::node::NodeError),
    /// The node gave up on the session (no receiver left, or no progress for the stall
    /// timeout).
    #[error("{0}")]
    Aborted(String),
}

/// What a driver is attached to upstream.
pub enum Upstream {
    /// The source's input reader.
    Input(mpsc::Receiver<InputEvent>),
    /// A relay's parent connection (already admitted, `Open` already read).
    Parent(Stream),
}

type EdgesFn = dyn FnMut(&[EdgeStreams]) + Send;

/// A periodic report of the spread edges (`--stats`).
struct StatsSink {
    every: Duration,
    next: Instant,
    f: Box<EdgesFn>,
}

/// Drives one node to the end of its session.
pub struct Driver {
    node: Node,
    keys: Keys,
    tuning: TcpTuning,
    ev_tx: mpsc::Sender<Ev>,
    ev_rx: mpsc::Receiver<Ev>,
    parent_rx: Option<mpsc::Receiver<FromParent>>,
    /// For readers of connections that attach to the parent's edge later.
    parent_tx: Option<mpsc::Sender<FromParent>>,
    /// `Got` frames for connection 0 of the parent's edge.
    parent_acks: Option<mpsc::UnboundedSender<Frame>>,
    /// The parent's edge, once it announced itself spread.
    in_edge: Option<InEdge<Parcel>>,
    /// Where this agent's extra connections arrive ([`Driver::accept_attachments`]).
    attachments: Option<Attachments>,
    attach_rx: Option<mpsc::UnboundedReceiver<(u16, Stream)>>,
    input_rx: Option<mpsc::Receiver<InputEvent>>,
    store: Option<Box<dyn LocalCopy>>,
    store_rx: Option<mpsc::UnboundedReceiver<StoreEvent>>,
    writers: HashMap<Link, Outbox>,
    /// Spread edges to children, by child; kept after the link ends, for the report.
    out_edges: HashMap<usize, OutEdge>,
    tasks: HashMap<Link, Vec<JoinHandle<()>>>,
    other_tasks: Vec<JoinHandle<()>>,
    stats: Option<StatsSink>,
    /// A relay with a declared uplink: for each child, the rate cap (bytes/s) of each of its
    /// connections, watched by their writers. The relay's [`Driver::ceiling`] is split evenly
    /// over the children with a live connection, then over each child's connections, so a
    /// child's share does not depend on how many connections it happens to have. `None` for
    /// the source, a leaf, or an unknown uplink.
    rate_cap: Option<HashMap<usize, watch::Sender<u64>>>,
    /// What the node's edges may carry together in bytes/s (a relay: its rate cap,
    /// [`RELAY_UPLINK_SHARE`] of its uplink; the source: its declared uplink); `None` where the
    /// uplink is not known.
    ceiling: Option<u64>,
    /// Per child edge: the transport its connection 0 got (set when it reached the child).
    edge_transport: HashMap<usize, transport::Transport>,
    /// Connections to children opened ahead of the session (agents; see [`crate::predial`]).
    predialed: Option<PreDialed>,
    /// Whether [`Driver::dial_children`] ran.
    dialled: bool,
}

impl Drop for Driver {
    fn drop(&mut self) {
        for t in self.tasks.values().flatten().chain(&self.other_tasks) {
            t.abort();
        }
        if let (Some(a), Some(e)) = (&self.attachments, &self.in_edge) {
            a.unregister(self.node.params().session, e.token);
        }
    }
}

impl Driver {
    /// Sets up the driver; [`Driver::run`] starts by connecting to every child.
    pub fn new(
        node: Node,
        keys: Keys,
        tuning: TcpTuning,
        upstream: Upstream,
        store: Option<(Box<dyn LocalCopy>, mpsc::UnboundedReceiver<StoreEvent>)>,
    ) -> Self {
        let (ev_tx, ev_rx) = mpsc::channel(1024);
        let mut d = Driver {
            node,
            keys,
            tuning,
            ev_tx,
            ev_rx,
            parent_rx: None,
            parent_tx: None,
            parent_acks: None,
            in_edge: None,
            attachments: None,
            attach_rx: None,
            input_rx: None,
            store: None,
            store_rx: None,
            writers: HashMap::new(),
            out_edges: HashMap::new(),
            tasks: HashMap::new(),
            other_tasks: Vec::new(),
            stats: None,
            rate_cap: None,
            ceiling: None,
            edge_transport: HashMap::new(),
            predialed: None,
            dialled: false,
        };
        d.tuning.cc = d.node.params().cc.clone();
        if let Some((s, rx)) = store {
            d.store = Some(s);
            d.store_rx = Some(rx);
        }
        match upstream {
            Upstream::Input(rx) => d.input_rx = Some(rx),
            Upstream::Parent(stream) => {
                let (r, w) = stream.into_split();
                let (tx, rx) = mpsc::channel(4);
                d.parent_rx = Some(rx);
                let session = d.node.params().session;
                let reader = tokio::spawn(read_parent(r, tx.clone(), d.keys.clone(), session, 0));
                d.parent_tx = Some(tx);
                d.tasks.entry(Link::Parent).or_default().push(reader);
                let (ack_tx, ack_rx) = mpsc::unbounded_channel();
                d.parent_acks = Some(ack_tx);
                d.attach_writer(Link::Parent, w, Some(ack_rx), 0);
            }
        }
        let uplink = f64::from(d.node.uplink_kbps()) * 1000.0 / 8.0;
        if uplink > 0.0 && !d.node.children().is_empty() {
            if d.parent_rx.is_some() {
                d.rate_cap = Some(HashMap::new());
                d.ceiling = Some((uplink * RELAY_UPLINK_SHARE) as u64);
            } else {
                d.ceiling = Some(uplink as u64);
            }
        }
        d
    }

    /// Starts connecting to every child (once, when [`Driver::run`] starts, so that options set
    /// after [`Driver::new`] apply to these connections).
    fn dial_children(&mut self) {
        for k in 0..self.node.children().len() {
            self.dial_child(k);
        }
    }

    /// Starts connecting to child `k` (at the start, or when the node adopted it from a dead
    /// child, [`Event::Connect`]).
    fn dial_child(&mut self, k: usize) {
        let now = Instant::now();
        let edges = self.node.params().edges;
        let chunk_size = self.node.params().chunk_size;
        let child = &self.node.children()[k];
        let addrs: Vec<String> = child.addr.split_whitespace().map(String::from).collect();
        let addrs = if addrs.is_empty() {
            vec![child.addr.clone()]
        } else {
            addrs
        };
        if edges.is_striped() {
            let e = OutEdge::new(child.name.clone(), edges, addrs, chunk_size, now);
            self.out_edges.insert(k, e);
            self.connect_edge(k, now);
        } else {
            let open = Frame::Open(self.node.open_for(k));
            self.spawn_connect(k, 0, addrs[0].clone(), vec![open]);
        }
    }

    /// Take the connections to children that a source's `Dial` had this agent open ahead of
    /// the session, where they are up ([`crate::predial`]).
    pub fn use_predialed(&mut self, pool: PreDialed) {
        self.predialed = Some(pool);
    }

    /// Accept further connections of a spread parent edge through `a` (agents).
    pub fn accept_attachments(&mut self, a: Attachments) {
        self.attachments = Some(a);
    }

    /// Call `f` with the spread edges' figures every `every` while the session runs.
    pub fn report_edges_every(
        &mut self,
        every: Duration,
        f: impl FnMut(&[EdgeStreams]) + Send + 'static,
    ) {
        self.stats = Some(StatsSink {
            every,
            next: Instant::now() + every,
            f: Box::new(f),
        });
    }

    /// The spread edges to children, in child order (empty for plain links).
    pub fn edge_reports(&self) -> Vec<EdgeStreams> {
        let mut ks: Vec<_> = self.out_edges.keys().copied().collect();
        ks.sort_unstable();
        ks.iter().map(|k| self.out_edges[k].report()).collect()
    }

    /// Opens the connections edge `k` asks for: the first with `Open`, each with `Attach`.
    fn connect_edge(&mut self, k: usize, now: Instant) {
        let Some(e) = self.out_edges.get_mut(&k) else {
            return;
        };
        let session = self.node.params().session;
        let mut todo = Vec::new();
        for (conn, addr) in e.poll_connect(now) {
            let attach = e.attach_frame(session, conn);
            todo.push((conn, addr, attach));
        }
        for (conn, addr, attach) in todo {
            let first = if conn == 0 {
                vec![Frame::Open(self.node.open_for(k)), attach]
            } else {
                vec![attach]
            };
            self.spawn_connect(k, conn, addr, first);
        }
    }

    fn spawn_connect(&mut self, k: usize, conn: u16, addr: String, first: Vec<Frame>) {
        let keys = self.keys.clone();
        let mut tuning = self.tuning.clone();
        if let Some(t) = self.edge_transport.get(&k) {
            tuning.transport = *t;
        }
        let tx = self.ev_tx.clone();
        let name = self.node.children()[k].name.clone();
        let dialed = (conn == 0 && self.out_edges.contains_key(&k)).then(|| (tx.clone(), k));
        let pool = self.predialed.clone().filter(|_| conn == 0);
        let session = self.node.params().session;
        self.other_tasks.push(tokio::spawn(async move {
            let pre = match pool {
                Some(p) => p.take(session, &addr).await,
                None => None,
            };
            if pre.is_some() {
                tracing::debug!("{name}: using the connection opened ahead of the session");
            }
            let ev = match connect_child(&addr, &keys, &tuning, &first, dialed, pre).await {
                Ok(s) => Ev::Connected(k, conn, s),
                Err(e) => Ev::ConnectFailed(
                    k,
                    conn,
                    format!("cannot reach {name} at {addr}: {e}{}", hint(&e)),
                ),
            };
            let _ = tx.send(ev).await;
        }));
    }

    /// The node, for inspection after the run.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Runs until the node is finished (`Ok`) or gives up (`Err` with the reason). Every other
    /// node-level event is passed to `observe` (progress, completions, failures, corruption).
    pub async fn run(&mut self, mut observe: impl FnMut(&Event)) -> Result<(), DriverError> {
        if !self.dialled {
            self.dialled = true;
            self.dial_children();
        }
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Frames the parent's edge has put back in order go first, while the node wants
            // them (before the node's events, which they may cause, are taken).
            let now = Instant::now();
            while self.node.wants_input() {
                let Some(p) = self.in_edge.as_mut().and_then(InEdge::poll_release) else {
                    break;
                };
                self.deliver_parcel(p, now)?;
            }
            self.pump_writers();
            // Sending can ask for chunks to be read back from the local copy: events again
            // until none is left, so no `Load` waits for an unrelated wake-up.
            loop {
                let mut any = false;
                while let Some(ev) = self.node.poll_event() {
                    any = true;
                    self.handle_event(ev, &mut observe)?;
                }
                self.pump_writers();
                if !any {
                    break;
                }
            }
            if self.node.is_finished()
                && self
                    .writers
                    .get(&Link::Parent)
                    .is_none_or(Outbox::is_drained)
            {
                self.emit_stats(true);
                self.linger().await;
                return Ok(());
            }
            let want = self.node.wants_input();
            let timeout = self.node.poll_timeout();
            let sleep = async {
                match timeout {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let tick = self.stats.is_some() || self.out_edges.values().any(OutEdge::wants_tick);
            tokio::select! {
                ev = self.ev_rx.recv() => {
                    let ev = ev.expect("the driver holds a sender");
                    self.handle_io(ev);
                }
                Some(f) = recv_opt(&mut self.parent_rx), if want => {
                    self.handle_parent(f, Instant::now())?;
                }
                Some((conn, stream)) = recv_opt_unbounded(&mut self.attach_rx) => {
                    self.handle_attached(conn, stream);
                }
                Some(ie) = recv_opt(&mut self.input_rx), if want => {
                    let now = Instant::now();
                    match ie {
                        InputEvent::Data(c, cvs) => {
                            self.node.handle_sealed_input(c, cvs, now)?
                        }
                        InputEvent::End => {
                            self.input_rx = None;
                            self.node.handle_input_end(now);
                        }
                        InputEvent::Failed(e) => return Err(e.into()),
                    }
                }
                Some(se) = recv_opt_unbounded(&mut self.store_rx) => {
                    let now = Instant::now();
                    match se {
                        StoreEvent::Stored(i) => {
                            crate::metrics::global().chunk_stored();
                            self.node.handle_stored(i, now)
                        }
                        StoreEvent::Failed(e) => {
                            tracing::error!("local copy failed: {e}");
                            self.node.handle_store_failed(e.to_string(), now);
                        }
                        StoreEvent::Finalized(r) => {
                            if let Ok(p) = &r {
                                tracing::info!("complete: {}", p.display());
                            }
                            let r = r.map(|_| ()).map_err(|e| e.to_string());
                            self.node.handle_finalized(r, now);
                        }
                        StoreEvent::Loaded(i, Ok(data)) => self.node.handle_loaded(i, data, now),
                        StoreEvent::Loaded(i, Err(e)) => {
                            tracing::warn!("chunk {i}: {e}; fetching it from the parent");
                            self.node.handle_load_failed(i, e.to_string(), now);
                        }
                    }
                }
                _ = ticker.tick(), if tick => {
                    let now = Instant::now();
                    let ks: Vec<usize> = self.out_edges.keys().copied().collect();
                    for k in ks {
                        if self.writers_alive(k) {
                            self.connect_edge(k, now);
                        }
                    }
                    self.emit_stats(false);
                }
                _ = sleep => self.node.handle_timeout(Instant::now()),
            }
        }
    }

    fn emit_stats(&mut self, last: bool) {
        let now = Instant::now();
        let due = self.stats.as_ref().is_some_and(|s| last || now >= s.next);
        if !due || self.out_edges.is_empty() {
            return;
        }
        let reports = self.edge_reports();
        if let Some(s) = &mut self.stats {
            s.next = now + s.every;
            (s.f)(&reports);
        }
    }

    /// Whether child `k`'s edge is still in use (not closed).
    fn writers_alive(&self, k: usize) -> bool {
        self.tasks.contains_key(&Link::Child(k))
            || self.out_edges.get(&k).is_some_and(OutEdge::is_open)
    }

    /// Something from the parent's connections.
    fn handle_parent(&mut self, f: FromParent, now: Instant) -> Result<(), DriverError> {
        let session = self.node.params().session;
        match f {
            FromParent::Item {
                conn: 0,
                seq: None,
                parcel:
                    Parcel::Frame(Frame::Attach {
                        session: s,
                        token,
                        conn: 0,
                        window,
                    }),
            } if self.in_edge.is_none() => {
                if s != session {
                    return Err(DriverError::Parent(format!(
                        "edge of session {s:016x} in session {session:016x}"
                    )));
                }
                let mut e = InEdge::new(token, window);
                if let Some(acks) = &self.parent_acks {
                    e.add_conn(0, acks.clone());
                }
                self.in_edge = Some(e);
                if let Some(a) = &self.attachments {
                    self.attach_rx = Some(a.register(session, token));
                }
                Ok(())
            }
            FromParent::Item {
                conn,
                seq: Some(seq),
                parcel,
            } => {
                let Some(e) = &mut self.in_edge else {
                    return Err(DriverError::Parent("spread frame before Attach".into()));
                };
                e.handle(conn, seq, parcel)
                    .map_err(|e| DriverError::Parent(e.to_string()))
            }
            FromParent::Item {
                conn: 0,
                seq: None,
                parcel,
            } => self.deliver_parcel(parcel, now),
            FromParent::Item { conn, parcel, .. } => {
                let what = match parcel {
                    Parcel::Frame(f) => f.kind(),
                    Parcel::Verified(_) => "Chunk",
                };
                Err(DriverError::Parent(format!(
                    "unsequenced {what} on connection {conn}"
                )))
            }
            FromParent::Closed(0, reason) => {
                self.parent_rx = None;
                self.attach_rx = None;
                self.node.handle_link_closed(Link::Parent, reason, now);
                Ok(())
            }
            FromParent::Closed(conn, reason) => {
                // The parent sends that connection's frames again on the others.
                tracing::debug!("parent's connection {conn} ended: {reason}");
                Ok(())
            }
        }
    }

    /// A frame of the parent's, in order, to the node.
    fn deliver_parcel(&mut self, p: Parcel, now: Instant) -> Result<(), DriverError> {
        let r = match p {
            Parcel::Frame(frame) => self.node.handle_frame(Link::Parent, frame, now),
            Parcel::Verified(c) => self.node.handle_verified_chunk(c, now),
        };
        r.map_err(|e| DriverError::Parent(e.to_string()))
    }

    /// A further connection of the parent's edge arrived through the agent.
    fn handle_attached(&mut self, conn: u16, stream: Stream) {
        let (Some(e), Some(tx)) = (&mut self.in_edge, &self.parent_tx) else {
            return;
        };
        let (r, w) = stream.into_split();
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        e.add_conn(conn, ack_tx);
        let session = self.node.params().session;
        let reader = tokio::spawn(read_parent(r, tx.clone(), self.keys.clone(), session, conn));
        let writer = tokio::spawn(write_acks(w, ack_rx));
        self.tasks
            .entry(Link::Parent)
            .or_default()
            .extend([reader, writer]);
    }

    fn handle_event(
        &mut self,
        ev: Event,
        observe: &mut impl FnMut(&Event),
    ) -> Result<(), DriverError> {
        match ev {
            Event::Deliver {
                index,
                offset,
                data,
                hash,
            } => {
                if let Some(s) = &self.store {
                    crate::metrics::global().chunk_verified(data.len());
                    s.write(index, offset, data, hash);
                }
            }
            Event::Complete { .. } => {
                if let Some(s) = &self.store {
                    s.finalize();
                }
            }
            Event::Load { index, offset, len } => {
                if !self
                    .store
                    .as_ref()
                    .is_some_and(|s| s.load(index, offset, len))
                {
                    let why = "the local copy cannot be read back".to_string();
                    self.node.handle_load_failed(index, why, Instant::now());
                }
            }
            Event::CloseLink(link) => self.drop_link(link),
            Event::Connect(k) => {
                let c = &self.node.children()[k];
                tracing::warn!("adopting {} ({}) from a lost relay", c.name, c.addr);
                self.dial_child(k);
            }
            Event::Aborted { reason } => return Err(DriverError::Aborted(reason)),
            other => observe(&other),
        }
        Ok(())
    }

    fn handle_io(&mut self, ev: Ev) {
        let now = Instant::now();
        match ev {
            Ev::Frame(link, conn, f) => {
                let r = match (link, f) {
                    (Link::Child(k), Frame::Got { seq }) if self.out_edges.contains_key(&k) => {
                        let e = self.out_edges.get_mut(&k).expect("checked");
                        e.handle_got(conn, seq, now).map_err(|e| e.to_string())
                    }
                    (_, f) if conn != 0 => {
                        Err(format!("unexpected {} on connection {conn}", f.kind()))
                    }
                    (_, f) => self
                        .node
                        .handle_frame(link, f, now)
                        .map_err(|e| e.to_string()),
                };
                if let Err(e) = r {
                    tracing::warn!("{link:?}: {e}");
                    if let Some(w) = self.writers.get_mut(&link) {
                        w.send(Frame::Error { reason: e.clone() });
                    }
                    self.node
                        .handle_link_closed(link, format!("protocol error: {e}"), now);
                    self.drop_link(link);
                }
            }
            Ev::Closed(link, conn, reason) => self.conn_lost(link, conn, reason, now),
            Ev::Written(link, conn, done) => {
                if let Link::Child(k) = link {
                    if let Some(e) = self.out_edges.get_mut(&k) {
                        e.handle_written(conn, done);
                        return;
                    }
                }
                if let Some(w) = self.writers.get_mut(&link) {
                    w.handle_written(done);
                }
            }
            Ev::Connected(k, conn, stream) => {
                let link = Link::Child(k);
                if conn > 0 && !self.writers_alive(k) {
                    return; // the edge ended while this connection was being made
                }
                if let Some(rtt) = stream.rtt() {
                    self.node.handle_child_rtt(k, rtt);
                }
                let (r, w) = stream.into_split();
                let tx = self.ev_tx.clone();
                let reader = tokio::spawn(read_child(r, link, conn, tx));
                self.tasks.entry(link).or_default().push(reader);
                if let Some(e) = self.out_edges.get_mut(&k) {
                    if let Some(Err(err)) =
                        w.tcp().map(|t| transport::set_notsent_lowat(t, e.lowat()))
                    {
                        tracing::debug!("TCP_NOTSENT_LOWAT: {err}");
                    }
                    let (outbox, frx) = Outbox::new();
                    let ev = self.ev_tx.clone();
                    let sock = child_socket(&mut self.rate_cap, self.ceiling, &self.tuning, k);
                    let task =
                        tokio::spawn(write_conn(w, frx, None, sock, conn, ev, note(link, conn)));
                    self.tasks.entry(link).or_default().push(task);
                    e.handle_connected(conn, outbox, now);
                } else {
                    self.attach_writer(link, w, None, 0);
                }
            }
            Ev::Dialed(k, rtt, t) => {
                if let Some(rtt) = rtt {
                    self.node.handle_child_rtt(k, rtt);
                }
                if let Some(e) = self.out_edges.get_mut(&k) {
                    // The edge's other connections use what connection 0 got (`auto`: no
                    // second wait for UDP where it went to TCP).
                    self.edge_transport.insert(k, t);
                    e.handle_dialed(rtt, t == transport::Transport::Paced, now);
                    self.connect_edge(k, now);
                }
            }
            Ev::ConnectFailed(k, conn, reason) => {
                self.conn_lost(Link::Child(k), conn, reason, now);
            }
        }
    }

    /// A finished receiver reads and drops what its parent still sends (second copies of
    /// frames it holds already) until the parent closes, for at most [`LINGER`]. Closing with
    /// unread data makes TCP reset the connection, and the reset can reach the parent before
    /// it has read our `Done`, which would then count us as failed.
    async fn linger(&mut self) {
        let Some(rx) = self.parent_rx.as_mut() else {
            return;
        };
        let deadline = tokio::time::sleep(LINGER);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                f = rx.recv() => match f {
                    None | Some(FromParent::Closed(0, _)) => return,
                    Some(_) => {}
                },
                // Keeps the tasks that report to the driver from blocking meanwhile.
                _ = self.ev_rx.recv() => {}
            }
        }
    }

    /// A connection of `link` ended. On a spread edge, a connection other than the first only
    /// hands its frames to the others.
    fn conn_lost(&mut self, link: Link, conn: u16, reason: String, now: Instant) {
        if let Link::Child(k) = link {
            if let Some(e) = self.out_edges.get_mut(&k) {
                if conn > 0 && e.handle_conn_lost(conn, now) {
                    if e.lost_busy {
                        tracing::warn!("{link:?}: connection {conn} lost ({reason}); its frames go to the others");
                    } else {
                        tracing::debug!("{link:?}: idle connection {conn} ended ({reason})");
                    }
                    return;
                }
            }
        }
        if conn == 0 || self.tasks.contains_key(&link) {
            // A link closing after everything it had to carry is the normal end.
            let expected = match link {
                Link::Child(k) => self.node.children().get(k).is_some_and(|c| c.is_resolved()),
                Link::Parent => self.node.local_done(),
            };
            if expected {
                tracing::debug!("{link:?}: {reason}");
            } else {
                tracing::warn!("{link:?}: {reason}");
            }
            self.drop_link(link);
            self.node.handle_link_closed(link, reason, now);
        }
    }

    fn attach_writer(
        &mut self,
        link: Link,
        w: transport::WriteHalf,
        acks: Option<mpsc::UnboundedReceiver<Frame>>,
        conn: u16,
    ) {
        let (outbox, rx) = Outbox::new();
        let ev = self.ev_tx.clone();
        let sock = match link {
            Link::Child(k) => child_socket(&mut self.rate_cap, self.ceiling, &self.tuning, k),
            _ => SocketControl {
                log_times: true,
                ..SocketControl::default()
            },
        };
        let task = tokio::spawn(write_conn(w, rx, acks, sock, conn, ev, note(link, conn)));
        self.tasks.entry(link).or_default().push(task);
        self.writers.insert(link, outbox);
    }

    /// Gives each edge its share of the node's ceiling, and splits a relay's rate cap evenly
    /// over its children with a live connection, then over each one's live connections (a
    /// connection being made counts once it is up).
    fn split_caps(&mut self) {
        if let Some(c) = self.ceiling {
            let share = c / self.node.children().len().max(1) as u64;
            for e in self.out_edges.values_mut() {
                e.set_ceiling(Some(share));
            }
        }
        let (Some(p), Some(total)) = (&self.rate_cap, self.ceiling) else {
            return;
        };
        let live = |k: usize| match self.out_edges.get(&k) {
            Some(e) => e.live_conns(),
            None => usize::from(self.writers.contains_key(&Link::Child(k))),
        };
        let edges = p.keys().filter(|&&k| live(k) > 0).count().max(1) as u64;
        for (&k, tx) in p {
            let per = (total / edges / live(k).max(1) as u64).max(1);
            tx.send_if_modified(|v| {
                let changed = *v != per;
                *v = per;
                changed
            });
        }
    }

    fn pump_writers(&mut self) {
        self.split_caps();
        for (link, w) in self.writers.iter_mut() {
            while w.has_room() {
                let Some(f) = self.node.poll_transmit(*link) else {
                    break;
                };
                if !w.send(f) {
                    break; // the writer is gone; its Closed event is on the way
                }
            }
        }
        let now = Instant::now();
        for (k, e) in self.out_edges.iter_mut() {
            if let Err(err) = e.pump(&mut self.node, Link::Child(*k), now) {
                tracing::error!("edge to child {k}: {err}");
            }
        }
    }

    fn drop_link(&mut self, link: Link) {
        self.writers.remove(&link);
        if let Link::Child(k) = link {
            if let Some(e) = self.out_edges.get_mut(&k) {
                e.close();
            }
        }
        for t in self.tasks.remove(&link).into_iter().flatten() {
            t.abort();
        }
    }
}

/// How the writer of connection `conn` of `link` reports to the driver.
fn note(link: Link, conn: u16) -> impl Fn(Note) -> Ev {
    move |n| match n {
        Note::Written(w) => Ev::Written(link, conn, w),
        Note::Failed(e) => Ev::Closed(link, conn, e),
    }
}

async fn connect_child(
    addr: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    first: &[Frame],
    dialed: Option<(mpsc::Sender<Ev>, usize)>,
    predialed: Option<Stream>,
) -> Result<Stream, transport::ConnError> {
    let started = Instant::now();
    let fresh = predialed.is_none();
    let mut s = match predialed {
        // Opened with the agent's own tuning: the session's congestion control applies.
        Some(s) => {
            if let Some(t) = s.tcp() {
                transport::set_cc(t, &tuning.cc)?;
            }
            s
        }
        None => transport::connect(addr, tuning).await?,
    };
    if let Some((tx, k)) = dialed {
        // Without a sample from the kernel (a retransmitted SYN, no timestamps), the connect's
        // own duration: at least a round trip.
        let rtt = s.rtt().or_else(|| Some(started.elapsed()));
        let _ = tx.send(Ev::Dialed(k, rtt, s.transport())).await;
    }
    if fresh {
        s = transport::handshake_connect(s, keys).await?;
    }
    for f in first {
        transport::write_frame(&mut s, f).await?;
    }
    Ok(s)
}

/// A frame from the parent, verified if it is a chunk.
enum Parcel {
    Frame(Frame),
    Verified(Chunk),
}

/// What a reader of the parent's connections hands over.
enum FromParent {
    /// A frame from connection `conn`, with its sequence number if it came `Spread`.
    Item {
        conn: u16,
        seq: Option<u64>,
        parcel: Parcel,
    },
    /// Why connection `conn` ended.
    Closed(u16, String),
}

async fn read_parent<R: AsyncRead + Unpin>(
    mut r: R,
    tx: mpsc::Sender<FromParent>,
    keys: Keys,
    session: SessionId,
    conn: u16,
) {
    loop {
        let item = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            Ok(Some(f)) => {
                let (seq, f) = match f {
                    Frame::Spread { seq, inner } => (Some(seq), *inner),
                    f => (None, f),
                };
                let parcel = match f {
                    // Hash here, on the thread that just read the bytes, while they are in
                    // cache; a chunk that fails goes to the node unverified, which rejects and
                    // re-requests it.
                    Frame::Chunk(c) => match keys.verify(session, &c) {
                        Ok(()) => Parcel::Verified(c),
                        Err(_) => Parcel::Frame(Frame::Chunk(c)),
                    },
                    f => Parcel::Frame(f),
                };
                FromParent::Item { conn, seq, parcel }
            }
            Ok(None) => FromParent::Closed(conn, "parent closed the connection".to_string()),
            Err(e) => FromParent::Closed(conn, format!("reading from parent: {e}")),
        };
        let last = matches!(item, FromParent::Closed(..));
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}

async fn read_child<R: AsyncRead + Unpin>(mut r: R, link: Link, conn: u16, tx: mpsc::Sender<Ev>) {
    loop {
        let ev = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            Ok(Some(f)) => Ev::Frame(link, conn, f),
            Ok(None) => Ev::Closed(link, conn, "connection closed".into()),
            Err(e) => Ev::Closed(link, conn, e.to_string()),
        };
        let last = matches!(ev, Ev::Closed(..));
        if tx.send(ev).await.is_err() || last {
            return;
        }
    }
}

async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// What to do about a failed connection to a child.
fn hint(e: &transport::ConnError) -> &'static str {
    match e {
        transport::ConnError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            " (is `bulkcast agent` running there, on that port?)"
        }
        transport::ConnError::Timeout(_) => " (host down, or a firewall drops the port?)",
        _ => "",
    }
}
