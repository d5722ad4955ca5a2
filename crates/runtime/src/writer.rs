//! One connection's writer task, shared by the tree's event loop ([`crate::driver`], its spread
//! edges in [`crate::edge`]) and the swarm's ([`crate::swarm`]): frames out to the connection in
//! the order they were handed over, each payload frame reported written, the socket's rate cap
//! and congestion control changed while it runs, and a word at its end on where the
//! connection's time went.
//!
//! A loop hands a connection's frames to its `Outbox`, which counts what is still unwritten.
//! At most [`WRITE_SLOTS`] *payload* frames (the object's bytes: a `Chunk`, a `Part`, or either
//! inside `Spread`) wait in a writer at once; control frames do not wait for a slot. That one
//! bound serves both loops: a slow socket stops the tree's `poll_transmit` for that connection
//! (and, through the node's buffer, reading upstream), and a swarm member's requests wait in
//! its own queue, where a cancel can still find them unserved, rather than in its socket
//! (docs/DESIGN.md, "Moving requests").

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bulkcast_proto::wire::Frame;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch};

use crate::transport::{self, TcpTuning};

/// Payload frames queued to one connection's writer at once (control frames are not counted).
///
/// One is what the swarm needs: a piece handed to the writer is committed, while a request that
/// waits in the member's own queue can still be cancelled and served by a faster peer (MOB's
/// moves, the hybrid's steals). In the lab (seed 004, fast and slow links, both layouts and
/// round trips, 32 MiB) one slot against two: MOB 0.04 of the bound ahead on average, the
/// hybrid 0.02. The tree runs as fast with one payload frame as it did with two frames of any
/// kind (`bench/loopback.sh --quick`, see the commit that made this one constant): the socket's
/// own buffer, not this queue, keeps a connection busy while the loop hands over the next frame.
pub const WRITE_SLOTS: usize = 1;

/// Whether `f` carries the object's bytes (and so takes one of a writer's [`WRITE_SLOTS`]).
pub fn is_payload(f: &Frame) -> bool {
    match f {
        Frame::Chunk(_) | Frame::Part(_) => true,
        Frame::Spread { inner, .. } => is_payload(inner),
        _ => false,
    }
}

/// What a writer reports: frames written since its last report (at a payload frame, and when
/// its queue runs empty), or why it stopped.
#[derive(Debug)]
pub(crate) enum Note {
    Written(Written),
    Failed(String),
}

/// Frames a writer wrote since its last report.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Written {
    /// Every frame handed over through its [`Outbox`] (acknowledgements on the side not counted).
    pub(crate) frames: usize,
    /// Of those, payload frames ([`is_payload`]).
    pub(crate) payload: usize,
}

/// The loop's side of one connection's writer: where its frames go, and how many of them the
/// writer has not reported written yet.
#[derive(Debug)]
pub(crate) struct Outbox {
    tx: mpsc::UnboundedSender<Frame>,
    unwritten: usize,
    payload: usize,
}

impl Outbox {
    /// An outbox and the receiver its writer task ([`write_conn`]) reads.
    pub(crate) fn new() -> (Outbox, mpsc::UnboundedReceiver<Frame>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let o = Outbox {
            tx,
            unwritten: 0,
            payload: 0,
        };
        (o, rx)
    }

    /// Whether the writer takes another payload frame ([`WRITE_SLOTS`]).
    pub(crate) fn has_room(&self) -> bool {
        self.payload < WRITE_SLOTS
    }

    /// Whether every frame handed over was written.
    pub(crate) fn is_drained(&self) -> bool {
        self.unwritten == 0
    }

    /// Hands `f` to the writer; false when the writer is gone (its failure is on the way).
    pub(crate) fn send(&mut self, f: Frame) -> bool {
        let payload = is_payload(&f);
        if self.tx.send(f).is_err() {
            return false;
        }
        self.unwritten += 1;
        self.payload += usize::from(payload);
        true
    }

    /// The writer reported `w`.
    pub(crate) fn handle_written(&mut self, w: Written) {
        self.unwritten = self.unwritten.saturating_sub(w.frames);
        self.payload = self.payload.saturating_sub(w.payload);
    }
}

/// The buffer in front of a connection's writer. An encrypted stream seals what the buffer
/// hands it, up to a batch of records per socket write: a buffer of a batch lets small frames
/// share those writes.
fn write_buffer(w: &transport::WriteHalf) -> usize {
    if matches!(w, transport::WriteHalf::Sealed(_)) {
        crate::secure::BATCH * crate::secure::MAX_RECORD
    } else {
        64 << 10
    }
}

/// Writes a connection's frames in order and reports them ([`Note::Written`]): after each
/// payload frame, and when no more wait. `acks` (`Got` frames of a spread parent edge) go first
/// and are not reported. The frames still queued are written when the loop is gone (a swarm
/// member closing); a failure ends the task with [`Note::Failed`]. `conn` names the connection
/// in the log.
pub(crate) async fn write_conn<E>(
    w: transport::WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Frame>,
    mut acks: Option<mpsc::UnboundedReceiver<Frame>>,
    sock: SocketControl,
    conn: u16,
    ev: mpsc::Sender<E>,
    note: impl Fn(Note) -> E,
) {
    let SocketControl {
        mut rate_cap,
        adapt,
        log_times,
    } = sock;
    // The socket, to change its rate cap while a write is under way (a frame can take
    // seconds on a slow connection). It stays open while this task holds `w`.
    // A paced connection has no kernel pacing to cap (a known limit: uplink caps apply to
    // TCP connections only).
    let fd = w.tcp().map(|t| t.as_raw_fd());
    let apply_cap = |rate: u64| {
        let Some(fd) = fd else { return };
        // SAFETY: `fd` is `w`'s socket, which this task owns for as long as it calls this.
        let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        if let Err(e) = transport::set_max_pacing_rate(&sock, rate) {
            tracing::debug!("SO_MAX_PACING_RATE: {e}");
        }
    };
    if let Some(p) = &mut rate_cap {
        apply_cap(*p.borrow_and_update());
    }
    let mut cc = fd.filter(|_| adapt).map(CcWatch::new);
    let mut w = BufWriter::with_capacity(write_buffer(&w), w);
    // Declared after `w`, so dropped (and logged) before the socket closes, also when the
    // session aborts this task.
    let _times = fd.filter(|_| log_times).map(|fd| SendTimesLog {
        fd,
        peer: w.get_ref().tcp().and_then(|t| t.peer_addr().ok()),
        conn,
        started: Instant::now(),
    });
    let mut done = Written::default();
    loop {
        let (f, counted) = tokio::select! {
            biased;
            Some(a) = recv_opt_unbounded(&mut acks) => (a, false),
            f = rx.recv() => match f {
                Some(f) => (f, true),
                None => break,
            },
        };
        let payload = is_payload(&f);
        let mut r = {
            let write = transport::write_frame_tcp(&mut w, &f);
            tokio::pin!(write);
            loop {
                tokio::select! {
                    r = &mut write => break r,
                    rate = next_cap(&mut rate_cap) => apply_cap(rate),
                }
            }
        };
        // A counted frame is flushed before it is reported when nothing else of the loop's
        // waits (the tree's loop may end the session once its last frame is reported
        // written); acknowledgements are flushed when no more follow.
        let idle = rx.is_empty() && (counted || acks.as_ref().is_none_or(|a| a.is_empty()));
        if r.is_ok() && idle {
            r = w.flush().await;
        }
        if let Err(e) = r {
            let _ = ev.send(note(Note::Failed(format!("writing: {e}")))).await;
            return;
        }
        if counted {
            done.frames += 1;
            done.payload += usize::from(payload);
        }
        if done.frames > 0 && (payload || rx.is_empty()) {
            // The loop may be gone (a swarm member closing): what is queued is still written.
            let _ = ev
                .send(note(Note::Written(std::mem::take(&mut done))))
                .await;
        }
        if let Some(c) = &mut cc {
            c.check();
        }
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
}

/// Says, when a connection's writer ends, where its connection's time went (`info`), so that a slow
/// edge shows whether the path (busy, retransmitting), the receiver's window, or this sender
/// (idle: it had nothing to send) held it back.
struct SendTimesLog {
    /// The writer's socket, open for as long as this lives.
    fd: std::os::fd::RawFd,
    peer: Option<std::net::SocketAddr>,
    conn: u16,
    started: Instant,
}

impl Drop for SendTimesLog {
    fn drop(&mut self) {
        // SAFETY: dropped before the writer that owns the socket (see `write_conn`).
        let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        log_send_times(sock, self.peer, self.conn, self.started);
    }
}

fn log_send_times(
    sock: std::os::fd::BorrowedFd<'_>,
    peer: Option<std::net::SocketAddr>,
    conn: u16,
    started: Instant,
) {
    let Some(t) = transport::send_times(&sock) else {
        return;
    };
    if t.bytes_sent < 1 << 20 {
        return; // a control connection or a stub: nothing to say
    }
    let life = started.elapsed().as_secs_f64();
    let idle = (life - t.busy.as_secs_f64()).max(0.0);
    tracing::info!(
        "to {} (connection {conn}): {:.1} MB in {life:.1} s, sending {:.1} s (receive window {:.1} s, \
         send buffer {:.1} s), idle {idle:.1} s, {:.2}% sent again",
        peer.map_or_else(|| "?".to_string(), |p| p.to_string()),
        t.bytes_sent as f64 / 1e6,
        t.busy.as_secs_f64(),
        t.rwnd_limited.as_secs_f64(),
        t.sndbuf_limited.as_secs_f64(),
        100.0 * t.bytes_retrans as f64 / t.bytes_sent as f64,
    );
}

/// What a connection's writer controls on its socket besides writing.
#[derive(Default)]
pub(crate) struct SocketControl {
    /// The rate cap, changed while the session runs (a capped relay's children).
    pub(crate) rate_cap: Option<watch::Receiver<u64>>,
    /// Run bbr until the path shows it is clean, then cubic ([`CcWatch`]).
    pub(crate) adapt: bool,
    /// Log where the connection's time went when the writer ends ([`SendTimesLog`]).
    pub(crate) log_times: bool,
}

/// A tree edge's connection under `--cc auto`: bbr until its path shows it is clean, then
/// cubic (not on a long path), and bbr again if random loss appears ([`bulkcast_proto::cc`]).
struct CcWatch {
    fd: std::os::fd::RawFd,
    watch: bulkcast_proto::cc::Watch,
    next: Instant,
    /// The counters as last added to the process's metrics.
    counted: (u64, u64),
}

impl CcWatch {
    /// How often the kernel's counters are read.
    const EVERY: Duration = Duration::from_millis(250);

    /// Watches the socket `fd`, which `auto` put on bbr (or left on the system's control
    /// where the kernel has no bbr).
    fn new(fd: std::os::fd::RawFd) -> Self {
        Self {
            fd,
            watch: bulkcast_proto::cc::Watch::new(),
            next: Instant::now() + Self::EVERY,
            counted: (0, 0),
        }
    }

    /// Reads the counters if it is time, and moves the socket where the watch says.
    fn check(&mut self) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + Self::EVERY;
        // SAFETY: `fd` is the writer's socket, open while the writer holds it (and with it us).
        let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        let Some((segs, retrans)) = transport::loss_counters(&sock) else {
            return;
        };
        crate::metrics::global().tcp_counters(&mut self.counted, (segs, retrans));
        if let Some(rtt) = transport::min_rtt(&sock) {
            self.watch.handle_min_rtt(rtt);
        }
        if let Some(c) = self.watch.handle_counters(segs, retrans) {
            match transport::set_cc(&sock, c.name()) {
                Ok(()) => tracing::debug!(
                    "{retrans} of {segs} segments retransmitted: moving to {}",
                    c.name()
                ),
                Err(e) => tracing::debug!("switching to {}: {e}", c.name()),
            }
        }
    }
}

/// What the writer of a connection to child `k` controls on its socket: its rate cap
/// ([`cap_for`]), and under `--cc auto` its congestion control (it starts on bbr and is
/// watched, [`CcWatch`]).
pub(crate) fn child_socket(
    rate_cap: &mut Option<HashMap<usize, watch::Sender<u64>>>,
    ceiling: Option<u64>,
    tuning: &TcpTuning,
    k: usize,
) -> SocketControl {
    SocketControl {
        rate_cap: cap_for(rate_cap, ceiling, k),
        adapt: tuning.cc == "auto",
        log_times: true,
    }
}

/// For a new writer to child `k` of a capped relay ([`crate::driver::Driver`]'s rate cap): where its connection's cap
/// comes from (the whole `ceiling` until the next `Driver::split_caps` splits it).
fn cap_for(
    rate_cap: &mut Option<HashMap<usize, watch::Sender<u64>>>,
    ceiling: Option<u64>,
    k: usize,
) -> Option<watch::Receiver<u64>> {
    let total = ceiling?;
    let tx = rate_cap.as_mut()?.entry(k);
    Some(tx.or_insert_with(|| watch::Sender::new(total)).subscribe())
}

/// The next rate cap a writer should apply; never ready without a cap to watch (or once its
/// driver is gone).
async fn next_cap(rate_cap: &mut Option<watch::Receiver<u64>>) -> u64 {
    if let Some(p) = rate_cap {
        if p.changed().await.is_ok() {
            return *p.borrow_and_update();
        }
        *rate_cap = None;
    }
    std::future::pending().await
}

/// Writes the `Got` frames of a further connection of the parent's edge.
pub(crate) async fn write_acks<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::UnboundedReceiver<Frame>,
) {
    let mut w = BufWriter::with_capacity(4 << 10, w);
    while let Some(f) = rx.recv().await {
        let mut r = transport::write_frame(&mut w, &f).await;
        if r.is_ok() && rx.is_empty() {
            r = w.flush().await;
        }
        if r.is_err() {
            return;
        }
    }
}

pub(crate) async fn recv_opt_unbounded<T>(
    rx: &mut Option<mpsc::UnboundedReceiver<T>>,
) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}
