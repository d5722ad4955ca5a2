//! The event loop that drives one [`Node`]: it owns the node's sockets, its input or local copy,
//! and its timer, and does nothing the node did not ask for.
//!
//! Reading and writing run in one task per link. A link's writer takes at most
//! [`WRITE_SLOTS`] frames at a time and reports each one written, so a slow socket stops
//! `poll_transmit` for that link (and, through the node's buffer, reading upstream). The
//! parent's reader hands frames over a small bounded channel that is drained only while the
//! node wants input, which back-pressures the parent through TCP.

use std::collections::HashMap;
use std::time::Instant;

use bulkcast_proto::auth::Keys;
use bulkcast_proto::node::{Event, Link, Node};
use bulkcast_proto::wire::{self, Chunk, Frame, SessionId};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::input::InputEvent;
use crate::store::{LocalCopy, StoreEvent};
use crate::transport::{self, TcpTuning};

/// Frames queued to one link's writer at once.
pub const WRITE_SLOTS: usize = 2;

enum Ev {
    Frame(Link, Frame),
    Closed(Link, String),
    Written(Link),
    Connected(usize, TcpStream),
    ConnectFailed(usize, String),
}

struct Writer {
    tx: mpsc::Sender<Frame>,
    inflight: usize,
}

/// What a driver is attached to upstream.
pub enum Upstream {
    /// The source's input reader.
    Input(mpsc::Receiver<InputEvent>),
    /// A relay's parent connection (already admitted, `Open` already read).
    Parent(TcpStream),
}

/// Drives one node to the end of its session.
pub struct Driver {
    node: Node,
    keys: Keys,
    tuning: TcpTuning,
    ev_tx: mpsc::Sender<Ev>,
    ev_rx: mpsc::Receiver<Ev>,
    parent_rx: Option<mpsc::Receiver<FromParent>>,
    input_rx: Option<mpsc::Receiver<InputEvent>>,
    store: Option<Box<dyn LocalCopy>>,
    store_rx: Option<mpsc::UnboundedReceiver<StoreEvent>>,
    writers: HashMap<Link, Writer>,
    tasks: HashMap<Link, Vec<JoinHandle<()>>>,
    other_tasks: Vec<JoinHandle<()>>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        for t in self.tasks.values().flatten().chain(&self.other_tasks) {
            t.abort();
        }
    }
}

impl Driver {
    /// Sets up the driver: starts connecting to every child right away.
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
            input_rx: None,
            store: None,
            store_rx: None,
            writers: HashMap::new(),
            tasks: HashMap::new(),
            other_tasks: Vec::new(),
        };
        if let Some((s, rx)) = store {
            d.store = Some(s);
            d.store_rx = Some(rx);
        }
        match upstream {
            Upstream::Input(rx) => d.input_rx = Some(rx),
            Upstream::Parent(stream) => {
                let (r, w) = stream.into_split();
                let (tx, rx) = mpsc::channel(2);
                d.parent_rx = Some(rx);
                let session = d.node.params().session;
                let reader = tokio::spawn(read_parent(r, tx, d.keys.clone(), session));
                d.tasks.entry(Link::Parent).or_default().push(reader);
                d.attach_writer(Link::Parent, w);
            }
        }
        for k in 0..d.node.children().len() {
            let addr = d.node.children()[k].addr.clone();
            let open = Frame::Open(d.node.open_for(k));
            let keys = d.keys.clone();
            let mut tuning = d.tuning.clone();
            tuning.cc = d.node.params().cc.clone();
            let tx = d.ev_tx.clone();
            let name = d.node.children()[k].name.clone();
            d.other_tasks.push(tokio::spawn(async move {
                let ev = match connect_child(&addr, &keys, &tuning, &open).await {
                    Ok(s) => Ev::Connected(k, s),
                    Err(e) => Ev::ConnectFailed(
                        k,
                        format!("cannot reach {name} at {addr}: {e}{}", hint(&e)),
                    ),
                };
                let _ = tx.send(ev).await;
            }));
        }
        d
    }

    /// The node, for inspection after the run.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Runs until the node is finished (`Ok`) or gives up (`Err` with the reason). Every other
    /// node-level event is passed to `observe` (progress, completions, failures, corruption).
    pub async fn run(&mut self, mut observe: impl FnMut(&Event)) -> Result<(), String> {
        loop {
            self.pump_writers();
            while let Some(ev) = self.node.poll_event() {
                self.handle_event(ev, &mut observe)?;
            }
            self.pump_writers();
            if self.node.is_finished()
                && self
                    .writers
                    .get(&Link::Parent)
                    .is_none_or(|w| w.inflight == 0)
            {
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
            tokio::select! {
                ev = self.ev_rx.recv() => {
                    let ev = ev.expect("the driver holds a sender");
                    self.handle_io(ev);
                }
                Some(f) = recv_opt(&mut self.parent_rx), if want => {
                    let now = Instant::now();
                    let r = match f {
                        FromParent::Frame(frame) => self.node.handle_frame(Link::Parent, frame, now),
                        FromParent::Verified(c) => self.node.handle_verified_chunk(c, now),
                        FromParent::Closed(reason) => {
                            self.parent_rx = None;
                            self.node.handle_link_closed(Link::Parent, reason, now);
                            Ok(())
                        }
                    };
                    if let Err(e) = r {
                        return Err(format!("parent broke the protocol: {e}"));
                    }
                }
                Some(ie) = recv_opt(&mut self.input_rx), if want => {
                    let now = Instant::now();
                    match ie {
                        InputEvent::Data(c) => {
                            self.node.handle_sealed_input(c, now).map_err(|e| e.to_string())?
                        }
                        InputEvent::End => {
                            self.input_rx = None;
                            self.node.handle_input_end(now);
                        }
                        InputEvent::Failed(e) => return Err(e),
                    }
                }
                Some(se) = recv_opt_unbounded(&mut self.store_rx) => {
                    let now = Instant::now();
                    match se {
                        StoreEvent::Stored(i) => self.node.handle_stored(i, now),
                        StoreEvent::Failed(e) => {
                            tracing::error!("local copy failed: {e}");
                            self.node.handle_store_failed(e, now);
                        }
                        StoreEvent::Finalized(r) => {
                            if let Ok(p) = &r {
                                tracing::info!("complete: {}", p.display());
                            }
                            self.node.handle_finalized(r.map(|_| ()), now);
                        }
                    }
                }
                _ = sleep => self.node.handle_timeout(Instant::now()),
            }
        }
    }

    fn handle_event(&mut self, ev: Event, observe: &mut impl FnMut(&Event)) -> Result<(), String> {
        match ev {
            Event::Deliver {
                index,
                offset,
                data,
            } => {
                if let Some(s) = &self.store {
                    s.write(index, offset, data);
                }
            }
            Event::Complete { .. } => {
                if let Some(s) = &self.store {
                    s.finalize();
                }
            }
            Event::CloseLink(link) => self.drop_link(link),
            Event::Aborted { reason } => return Err(reason),
            other => observe(&other),
        }
        Ok(())
    }

    fn handle_io(&mut self, ev: Ev) {
        let now = Instant::now();
        match ev {
            Ev::Frame(link, f) => {
                if let Err(e) = self.node.handle_frame(link, f, now) {
                    tracing::warn!("{link:?}: {e}");
                    if let Some(w) = self.writers.get(&link) {
                        let _ = w.tx.try_send(Frame::Error {
                            reason: e.to_string(),
                        });
                    }
                    self.node
                        .handle_link_closed(link, format!("protocol error: {e}"), now);
                    self.drop_link(link);
                }
            }
            Ev::Closed(link, reason) => {
                self.drop_link(link);
                self.node.handle_link_closed(link, reason, now);
            }
            Ev::Written(link) => {
                if let Some(w) = self.writers.get_mut(&link) {
                    w.inflight = w.inflight.saturating_sub(1);
                }
            }
            Ev::Connected(k, stream) => {
                let link = Link::Child(k);
                let (r, w) = stream.into_split();
                let tx = self.ev_tx.clone();
                let reader = tokio::spawn(read_child(r, link, tx));
                self.tasks.entry(link).or_default().push(reader);
                self.attach_writer(link, w);
            }
            Ev::ConnectFailed(k, reason) => {
                tracing::warn!("{reason}");
                self.node.handle_link_closed(Link::Child(k), reason, now);
            }
        }
    }

    fn attach_writer<W: AsyncWrite + Unpin + Send + 'static>(&mut self, link: Link, w: W) {
        let (tx, rx) = mpsc::channel(WRITE_SLOTS + 1);
        let ev = self.ev_tx.clone();
        let task = tokio::spawn(write_link(w, rx, link, ev));
        self.tasks.entry(link).or_default().push(task);
        self.writers.insert(link, Writer { tx, inflight: 0 });
    }

    fn pump_writers(&mut self) {
        for (link, w) in self.writers.iter_mut() {
            while w.inflight < WRITE_SLOTS {
                let Some(f) = self.node.poll_transmit(*link) else {
                    break;
                };
                if w.tx.try_send(f).is_err() {
                    break; // the writer is gone; its Closed event is on the way
                }
                w.inflight += 1;
            }
        }
    }

    fn drop_link(&mut self, link: Link) {
        self.writers.remove(&link);
        for t in self.tasks.remove(&link).into_iter().flatten() {
            t.abort();
        }
    }
}

async fn connect_child(
    addr: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    open: &Frame,
) -> Result<TcpStream, transport::ConnError> {
    let mut s = transport::connect(addr, tuning).await?;
    transport::handshake_connect(&mut s, keys).await?;
    transport::write_frame(&mut s, open).await?;
    Ok(s)
}

/// What the parent's reader hands over: a frame, a chunk it verified, or why the link ended.
enum FromParent {
    Frame(Frame),
    Verified(Chunk),
    Closed(String),
}

async fn read_parent<R: AsyncRead + Unpin>(
    mut r: R,
    tx: mpsc::Sender<FromParent>,
    keys: Keys,
    session: SessionId,
) {
    loop {
        let item = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            // Hash here, on the thread that just read the bytes, while they are in cache; a
            // chunk that fails goes to the node unverified, which rejects and re-requests it.
            Ok(Some(Frame::Chunk(c))) => match keys.verify(session, &c) {
                Ok(()) => FromParent::Verified(c),
                Err(_) => FromParent::Frame(Frame::Chunk(c)),
            },
            Ok(Some(f)) => FromParent::Frame(f),
            Ok(None) => FromParent::Closed("parent closed the connection".to_string()),
            Err(e) => FromParent::Closed(format!("reading from parent: {e}")),
        };
        let last = matches!(item, FromParent::Closed(_));
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}

async fn read_child<R: AsyncRead + Unpin>(mut r: R, link: Link, tx: mpsc::Sender<Ev>) {
    loop {
        let ev = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            Ok(Some(f)) => Ev::Frame(link, f),
            Ok(None) => Ev::Closed(link, "connection closed".into()),
            Err(e) => Ev::Closed(link, e.to_string()),
        };
        let last = matches!(ev, Ev::Closed(..));
        if tx.send(ev).await.is_err() || last {
            return;
        }
    }
}

async fn write_link<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::Receiver<Frame>,
    link: Link,
    ev: mpsc::Sender<Ev>,
) {
    let mut w = BufWriter::with_capacity(64 << 10, w);
    while let Some(f) = rx.recv().await {
        let mut r = transport::write_frame(&mut w, &f).await;
        if r.is_ok() && rx.is_empty() {
            r = w.flush().await;
        }
        if let Err(e) = r {
            let _ = ev.send(Ev::Closed(link, format!("writing: {e}"))).await;
            return;
        }
        if ev.send(Ev::Written(link)).await.is_err() {
            return;
        }
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
}

async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn recv_opt_unbounded<T>(rx: &mut Option<mpsc::UnboundedReceiver<T>>) -> Option<T> {
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
