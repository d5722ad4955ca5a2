//! A link's writer task: frames out to a connection, the socket's rate cap and congestion
//! control changed while it runs, and a word at its end on where the connection's time went.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bulkcast_proto::node::Link;
use bulkcast_proto::wire::Frame;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch};

use super::Ev;
use crate::transport::{self, TcpTuning};

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

/// Writes a link's frames, reporting each one written; `acks` (`Got` frames of a spread
/// parent edge) go first and are not reported.
pub(super) async fn write_link(
    w: transport::WriteHalf,
    mut rx: mpsc::Receiver<Frame>,
    mut acks: Option<mpsc::UnboundedReceiver<Frame>>,
    sock: SocketControl,
    link: Link,
    conn: u16,
    ev: mpsc::Sender<Ev>,
) {
    let SocketControl {
        mut rate_cap,
        adapt,
    } = sock;
    // The socket, to change its rate cap while a write is under way (a frame can take
    // seconds on a slow connection). It stays open while this task holds `w`.
    // A paced connection has no kernel pacing to cap (a known limit: uplink caps apply to
    // TCP edges only).
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
    let _times = fd.map(|fd| SendTimesLog {
        fd,
        peer: w.get_ref().tcp().and_then(|t| t.peer_addr().ok()),
        conn,
        started: Instant::now(),
    });
    loop {
        let (f, report) = tokio::select! {
            biased;
            Some(a) = recv_opt_unbounded(&mut acks) => (a, false),
            f = rx.recv() => match f {
                Some(f) => (f, true),
                None => break,
            },
        };
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
        // A reported frame is flushed before it is reported when nothing else of the node's
        // waits (the driver may end the session once its last frame is reported written);
        // acknowledgements are flushed when no more follow.
        let idle = rx.is_empty() && (report || acks.as_ref().is_none_or(|a| a.is_empty()));
        if r.is_ok() && idle {
            r = w.flush().await;
        }
        if let Err(e) = r {
            let _ = ev
                .send(Ev::Closed(link, conn, format!("writing: {e}")))
                .await;
            return;
        }
        if report && ev.send(Ev::Written(link, conn)).await.is_err() {
            return;
        }
        if let Some(c) = &mut cc {
            c.check();
        }
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
}

/// Says, when a link's writer ends, where its connection's time went (`info`), so that a slow
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
        // SAFETY: dropped before the writer that owns the socket (see `write_link`).
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

/// What a link's writer controls on its socket besides writing.
pub(super) struct SocketControl {
    /// The rate cap, changed while the session runs (a capped relay's children).
    pub(super) rate_cap: Option<watch::Receiver<u64>>,
    /// Run bbr until the path shows it is clean, then cubic ([`CcWatch`]).
    pub(super) adapt: bool,
}

/// A tree edge's connection under `--cc auto`: bbr until its path shows it is clean, then
/// cubic, and bbr again if random loss appears ([`bulkcast_proto::cc`]).
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
pub(super) fn child_socket(
    rate_cap: &mut Option<HashMap<usize, watch::Sender<u64>>>,
    ceiling: Option<u64>,
    tuning: &TcpTuning,
    k: usize,
) -> SocketControl {
    SocketControl {
        rate_cap: cap_for(rate_cap, ceiling, k),
        adapt: tuning.cc == "auto",
    }
}

/// For a new writer to child `k` of a capped relay ([`Driver::rate_cap`]): where its connection's cap
/// comes from (the whole `ceiling` until the next [`Driver::split_caps`] splits it).
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
pub(super) async fn write_acks<W: AsyncWrite + Unpin>(
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

pub(super) async fn recv_opt_unbounded<T>(
    rx: &mut Option<mpsc::UnboundedReceiver<T>>,
) -> Option<T> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}
