//! The tokio driver of [`bulkcast_proto::paced`]: a [`PacedStream`] is `AsyncRead` +
//! `AsyncWrite` over one paced UDP connection, so framing, the handshake and the edges run
//! over it as over TCP.
//!
//! Each connection has a driver task that owns its [`Conn`]: it sends what the connection
//! yields, feeds it datagrams and timeouts, and wakes the stream's reader and writer. A
//! client has its own connected socket; a [`PacedListener`] shares one socket among the
//! connections it accepted, demultiplexed by peer address and connection id.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bulkcast_proto::paced::{packet, CloseCode, Config, Conn, ConnError, ConnStats};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, Notify};

/// How long a dropped stream keeps sending what was written before giving up.
const LINGER: Duration = Duration::from_secs(10);
/// Socket buffers: a few ms of a fast path, so a late wake-up does not drop datagrams.
const SOCKET_BUFFER: usize = 4 << 20;
/// Datagrams handled per wake-up before the driver sends again.
const RECV_BATCH: usize = 64;
/// Connections a listener keeps at once.
const MAX_CONNS: usize = 4096;
/// How long a listener ignores a finished connection's stray datagrams.
const CLOSED_MEMORY: Duration = Duration::from_secs(30);

/// A paced UDP connection as a byte stream.
pub struct PacedStream {
    shared: Arc<Shared>,
    peer: SocketAddr,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the driver: the application wrote, read, finished or dropped.
    wake_driver: Notify,
    /// The driver handled something (for `connect`'s wait).
    changed: Notify,
}

struct State {
    conn: Conn,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    /// The stream was dropped: the driver sends what is left, then ends.
    dropped: Option<Instant>,
    /// A socket error ended the connection.
    io_error: Option<io::ErrorKind>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn io_error(e: &ConnError) -> io::Error {
    let kind = match e {
        ConnError::ClosedByPeer(_) => io::ErrorKind::ConnectionReset,
        ConnError::Aborted => io::ErrorKind::ConnectionAborted,
        ConnError::Idle(_) => io::ErrorKind::TimedOut,
        ConnError::Protocol(_) => io::ErrorKind::InvalidData,
    };
    io::Error::new(kind, e.to_string())
}

impl State {
    fn error(&self) -> Option<io::Error> {
        if let Some(k) = self.io_error {
            return Some(io::Error::new(
                k,
                format!("over UDP: {}", io::Error::from(k)),
            ));
        }
        self.conn.error().map(io_error)
    }
}

/// Settings for a connection to or from `peer`: datagrams sized for a 1500-byte path.
pub fn config_for(peer: SocketAddr) -> Config {
    let size = if peer.is_ipv4() { 1472 } else { 1452 };
    Config::default()
        .datagram_size(size)
        .expect("1452 and 1472 are valid datagram sizes")
}

fn set_buffers(s: &UdpSocket) {
    // Failure leaves the default size, which only costs datagrams under load.
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = setsockopt(s, sockopt::SndBuf, &SOCKET_BUFFER);
    let _ = setsockopt(s, sockopt::RcvBuf, &SOCKET_BUFFER);
}

impl PacedStream {
    /// Opens a connection to `addr`; fails when nothing answers within `timeout`.
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<PacedStream> {
        let local: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().expect("valid")
        } else {
            "[::]:0".parse().expect("valid")
        };
        let sock = UdpSocket::bind(local).await?;
        set_buffers(&sock);
        sock.connect(addr).await?;
        let conn = Conn::client(rand::random(), config_for(addr), Instant::now());
        let stream = PacedStream::start(conn, addr);
        tokio::spawn(drive(
            stream.shared.clone(),
            Arc::new(sock),
            addr,
            Incoming::Own,
            None,
        ));
        let shared = stream.shared.clone();
        let wait = async move {
            loop {
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                {
                    let st = shared.lock();
                    if let Some(e) = st.error() {
                        return Err(e);
                    }
                    if st.conn.is_established() {
                        return Ok(());
                    }
                }
                changed.await;
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(())) => Ok(stream),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer from {addr} over UDP within {timeout:?}"),
            )),
        }
    }

    fn start(conn: Conn, peer: SocketAddr) -> PacedStream {
        PacedStream {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    conn,
                    read_waker: None,
                    write_waker: None,
                    dropped: None,
                    io_error: None,
                }),
                wake_driver: Notify::new(),
                changed: Notify::new(),
            }),
            peer,
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The connection's counters (RTT, rate, packets sent and lost).
    pub fn stats(&self) -> ConnStats {
        self.shared.lock().conn.stats()
    }
}

impl AsyncRead for PacedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut st = self.shared.lock();
        let n = st.conn.read(buf.initialize_unfilled());
        if n > 0 {
            buf.advance(n);
            drop(st);
            // Reading may open the window: the driver tells the peer.
            self.shared.wake_driver.notify_one();
            return Poll::Ready(Ok(()));
        }
        if st.conn.recv_finished() {
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = st.error() {
            return Poll::Ready(Err(e));
        }
        st.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for PacedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.shared.lock();
        if let Some(e) = st.error() {
            return Poll::Ready(Err(e));
        }
        let n = st.conn.write(buf);
        if n > 0 || buf.is_empty() {
            drop(st);
            self.shared.wake_driver.notify_one();
            return Poll::Ready(Ok(n));
        }
        if st.conn.send_room() > 0 {
            // Room but nothing taken: the stream was finished.
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        st.write_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written bytes are the connection's to deliver, as a TCP socket's buffer is.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shared.lock().conn.finish();
        self.shared.wake_driver.notify_one();
        Poll::Ready(Ok(()))
    }
}

impl Drop for PacedStream {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        // As closing a TCP socket: what was written still goes, then the end of the stream.
        st.conn.finish();
        st.dropped = Some(Instant::now());
        drop(st);
        self.shared.wake_driver.notify_one();
    }
}

/// Where a driver's datagrams come from.
enum Incoming {
    /// Its own connected socket (a client).
    Own,
    /// A listener's demultiplexer.
    Demux(mpsc::Receiver<Bytes>),
}

/// Runs one connection until it is done, fails, or its dropped stream's data is delivered.
/// `closed` tells a listener the connection is gone.
async fn drive(
    shared: Arc<Shared>,
    sock: Arc<UdpSocket>,
    peer: SocketAddr,
    mut incoming: Incoming,
    closed: Option<(mpsc::UnboundedSender<(SocketAddr, u32)>, u32)>,
) {
    let mut out = Vec::with_capacity(2048);
    let mut stash: Option<Vec<u8>> = None;
    let mut rbuf = vec![0u8; 65_536];
    let connected = matches!(incoming, Incoming::Own);
    let mut next_log = Instant::now();
    loop {
        let now = Instant::now();
        if now >= next_log && tracing::enabled!(tracing::Level::DEBUG) {
            next_log = now + Duration::from_secs(1);
            log_stats(&shared, peer);
        }
        let deadline = match send_due(&shared, &sock, &mut stash, &mut out, peer, connected, now) {
            Due::Done => break,
            Due::Idle => None,
            Due::Next(t) => Some(t),
        };
        let Some(deadline) = deadline else {
            shared.wake_driver.notified().await;
            continue;
        };
        let sleep = async {
            match deadline {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = recv_one(&sock, &mut incoming, &mut rbuf) => match r {
                Ok(Some(d)) => {
                    let mut st = shared.lock();
                    handle(&mut st.conn, Instant::now(), &d);
                    // More may be waiting: take a batch before sending again. Each datagram
                    // is stamped when it is read: one stamp for a batch read across a stall
                    // made RTT samples milliseconds too short, and the floor with them.
                    for _ in 0..RECV_BATCH {
                        match try_recv_one(&sock, &mut incoming, &mut rbuf) {
                            Some(d) => handle(&mut st.conn, Instant::now(), &d),
                            None => break,
                        }
                    }
                }
                Ok(None) => {
                    // The listener is gone.
                    shared.lock().io_error = Some(io::ErrorKind::NotConnected);
                }
                Err(k) => shared.lock().io_error = Some(k),
            },
            _ = sleep => shared.lock().conn.handle_timeout(Instant::now()),
            _ = shared.wake_driver.notified() => {}
            r = sock.writable(), if stash.is_some() => {
                if let Err(e) = r {
                    shared.lock().io_error = Some(e.kind());
                }
            }
        }
    }
    let mut st = shared.lock();
    for w in [st.read_waker.take(), st.write_waker.take()]
        .into_iter()
        .flatten()
    {
        w.wake();
    }
    drop(st);
    shared.changed.notify_waiters();
    if let Some((tx, id)) = closed {
        let _ = tx.send((peer, id));
    }
}

/// One debug line on the connection's rate controller and counters.
fn log_stats(shared: &Shared, peer: SocketAddr) {
    let st = shared.lock();
    let (c, rc) = (st.conn.stats(), st.conn.controller());
    tracing::debug!(
        "paced {peer}: rate {:.1} Mbit/s window {} (path {:.1} Mbit/s x{:.2}) inflight {} \
             srtt {:?} min {:?} queue {:?} {:?}; sent {} lost {} resent {} B acked {} B",
        rc.rate() * 8e-6,
        rc.window(),
        rc.path_rate() * 8e-6,
        rc.boost(),
        st.conn.inflight(),
        c.srtt,
        rc.min_rtt(),
        rc.queue(),
        rc.phase(),
        c.packets_sent,
        c.packets_lost,
        c.bytes_resent,
        c.bytes_acked
    );
}

/// What the driver waits for after [`send_due`].
enum Due {
    /// The connection is over.
    Done,
    /// Nothing until the application acts (the stream dropped).
    Idle,
    /// The connection's next timer, if any.
    Next(Option<Instant>),
}

/// Sends what is due (the stash of a full socket buffer first) and wakes the application's
/// reader and writer where they can move.
fn send_due(
    shared: &Shared,
    sock: &UdpSocket,
    stash: &mut Option<Vec<u8>>,
    out: &mut Vec<u8>,
    peer: SocketAddr,
    connected: bool,
    now: Instant,
) -> Due {
    let mut st = shared.lock();
    // Send what is due, the stash of a full socket buffer first.
    let mut blocked = false;
    if let Some(d) = stash.take() {
        match send(sock, &d, peer, connected) {
            Ok(true) => {}
            Ok(false) => {
                *stash = Some(d);
                blocked = true;
            }
            Err(k) => st.io_error = Some(k),
        }
    }
    while !blocked && st.io_error.is_none() && st.conn.poll_transmit(now, out) {
        match send(sock, out, peer, connected) {
            Ok(true) => {}
            Ok(false) => {
                *stash = Some(out.clone());
                blocked = true;
            }
            Err(k) => st.io_error = Some(k),
        }
    }
    let failed = st.io_error.is_some() || st.conn.error().is_some();
    if st.conn.readable() > 0 || st.conn.recv_finished() || failed {
        if let Some(w) = st.read_waker.take() {
            w.wake();
        }
    }
    if st.conn.send_room() > 0 || failed {
        if let Some(w) = st.write_waker.take() {
            w.wake();
        }
    }
    shared.changed.notify_waiters();
    if let Some(t) = st.dropped {
        if !failed && !st.conn.is_done() && (st.conn.send_finished() || now > t + LINGER) {
            // Nobody reads any more: tell the peer to stop, once.
            st.conn.close(CloseCode::Aborted);
            if st.conn.poll_transmit(now, out) {
                let _ = send(sock, out, peer, connected);
            }
        }
        if failed || st.conn.is_done() || st.conn.error().is_some() {
            return Due::Done;
        }
        Due::Next(st.conn.poll_timeout())
    } else if failed {
        // Wait for the stream to be dropped, answering nothing.
        Due::Idle
    } else {
        Due::Next(st.conn.poll_timeout())
    }
}

fn handle(conn: &mut Conn, now: Instant, d: &[u8]) {
    if let Err(e) = conn.handle_datagram(now, d) {
        tracing::debug!("paced: ignored a datagram: {e}");
    }
}

/// Sends one datagram: `Ok(false)` when the socket buffer is full.
fn send(
    sock: &UdpSocket,
    d: &[u8],
    peer: SocketAddr,
    connected: bool,
) -> Result<bool, io::ErrorKind> {
    let r = if connected {
        sock.try_send(d)
    } else {
        sock.try_send_to(d, peer)
    };
    match r {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
        // An ICMP error of an earlier datagram: the peer is not listening.
        Err(e) => Err(e.kind()),
    }
}

async fn recv_one(
    sock: &UdpSocket,
    incoming: &mut Incoming,
    buf: &mut [u8],
) -> Result<Option<Bytes>, io::ErrorKind> {
    match incoming {
        Incoming::Own => match sock.recv(buf).await {
            Ok(n) => Ok(Some(Bytes::copy_from_slice(&buf[..n]))),
            Err(e) => Err(e.kind()),
        },
        Incoming::Demux(rx) => Ok(rx.recv().await),
    }
}

fn try_recv_one(sock: &UdpSocket, incoming: &mut Incoming, buf: &mut [u8]) -> Option<Bytes> {
    match incoming {
        Incoming::Own => sock
            .try_recv(buf)
            .ok()
            .map(|n| Bytes::copy_from_slice(&buf[..n])),
        Incoming::Demux(rx) => rx.try_recv().ok(),
    }
}

/// Accepts paced connections on one UDP socket.
pub struct PacedListener {
    rx: mpsc::Receiver<(PacedStream, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl PacedListener {
    /// Listens on `addr` (UDP).
    pub async fn bind(addr: SocketAddr) -> io::Result<PacedListener> {
        let sock = UdpSocket::bind(addr).await?;
        set_buffers(&sock);
        let local = sock.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(demux(Arc::new(sock), tx));
        Ok(PacedListener { rx, local, task })
    }

    /// The next connection and its peer.
    pub async fn accept(&mut self) -> io::Result<(PacedStream, SocketAddr)> {
        self.rx
            .recv()
            .await
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "paced listener stopped"))
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for PacedListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads the listener's socket: datagrams of known connections go to their drivers, the
/// opening datagram of a new one (DATA at stream offset 0) starts a connection.
async fn demux(sock: Arc<UdpSocket>, accept: mpsc::Sender<(PacedStream, SocketAddr)>) {
    let mut conns: HashMap<(SocketAddr, u32), mpsc::Sender<Bytes>> = HashMap::new();
    let mut closed_at: HashMap<(SocketAddr, u32), Instant> = HashMap::new();
    let (closed_tx, mut closed_rx) = mpsc::unbounded_channel();
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                // ICMP errors for one peer surface here; they are that peer's driver's
                // business (its idle timeout), not the listener's.
                Err(e) => {
                    tracing::debug!("paced listener: {e}");
                    continue;
                }
            },
            Some(key) = closed_rx.recv() => {
                conns.remove(&key);
                let now = Instant::now();
                closed_at.retain(|_, t| now.duration_since(*t) < CLOSED_MEMORY);
                closed_at.insert(key, now);
                continue;
            }
        };
        let d = &buf[..n];
        let Some(id) = packet::conn_id(d) else {
            continue;
        };
        let key = (from, id);
        if let Some(tx) = conns.get(&key) {
            // A full queue drops the datagram: the connection recovers it as a loss.
            let _ = tx.try_send(Bytes::copy_from_slice(d));
            continue;
        }
        let opening = matches!(
            packet::decode(d),
            Ok((_, packet::Packet::Data { offset: 0, .. }))
        );
        if !opening || closed_at.contains_key(&key) || conns.len() >= MAX_CONNS {
            continue;
        }
        let conn = Conn::server(id, config_for(from), Instant::now());
        let stream = PacedStream::start(conn, from);
        let (tx, rx) = mpsc::channel(1024);
        let _ = tx.try_send(Bytes::copy_from_slice(d));
        conns.insert(key, tx);
        tokio::spawn(drive(
            stream.shared.clone(),
            sock.clone(),
            from,
            Incoming::Demux(rx),
            Some((closed_tx.clone(), id)),
        ));
        if accept.try_send((stream, from)).is_err() {
            // Nobody accepts (or too many wait): the stream is dropped and its driver ends.
            tracing::debug!("paced listener: dropped a connection from {from}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn streams_both_ways_over_loopback_and_ends_cleanly() {
        let mut l = PacedListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = l.local_addr();
        let data: Vec<u8> = (0..20_000_000u32)
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let expect = data.clone();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            s.write_all(b"thanks").await.unwrap();
            s.shutdown().await.unwrap();
            // Keep the stream until the client has read the answer.
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
            got
        });
        let mut c = PacedStream::connect(addr, Duration::from_secs(5))
            .await
            .unwrap();
        c.write_all(&data).await.unwrap();
        c.shutdown().await.unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"thanks");
        drop(c);
        let got = tokio::time::timeout(Duration::from_secs(30), server)
            .await
            .unwrap()
            .unwrap();
        assert!(
            got == expect,
            "{} bytes arrived of {}",
            got.len(),
            expect.len()
        );
    }

    #[tokio::test]
    async fn nobody_listening_is_a_clear_error() {
        // A port just freed: nothing listens there.
        let port = {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap()
        };
        let t0 = Instant::now();
        let e = PacedStream::connect(port, Duration::from_secs(3))
            .await
            .err()
            .expect("nothing listens");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        assert!(t0.elapsed() < Duration::from_secs(4));
    }
}
