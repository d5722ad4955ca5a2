//! Connections: TCP set up for long fat pipes, frames read and written over any byte stream.
//!
//! Framing is generic over `AsyncRead`/`AsyncWrite`, so the same code runs over TCP, a QUIC
//! stream or an in-memory pipe. Every read checks the length prefix against the limit before
//! it allocates; every connect and handshake has a deadline.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use bulkcast_proto::auth::{AuthError, Keys};
use bulkcast_proto::wire::{self, Frame, WireError};
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::paced::{PacedListener, PacedStream};
use crate::secure::Sealed;

/// Deadline for a TCP connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline for each handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest frame read before the peer is authenticated: every handshake frame fits (a
/// `Refused` reason is cut to fit), so an unauthenticated peer never makes this side allocate
/// more than this per connection, whatever length it announces.
pub const HANDSHAKE_MAX_FRAME: usize = 1024;

/// What went wrong on a connection.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket-level failure.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not a valid frame.
    #[error("malformed frame: {0}")]
    Wire(#[from] WireError),
    /// Admission failed.
    #[error("{0}")]
    Auth(#[from] AuthError),
    /// A deadline passed.
    #[error("timed out {0}")]
    Timeout(&'static str),
    /// The peer closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// The peer sent a frame that makes no sense here.
    #[error("unexpected {0} frame")]
    Unexpected(&'static str),
}

/// Which transport a connection bulkcast makes uses (a receiver accepts both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// TCP, with the congestion control and buffers of [`TcpTuning`].
    #[default]
    Tcp,
    /// The paced UDP transport ([`crate::paced`]): rate kept under random loss.
    Paced,
    /// TCP on a path whose round trip is under [`AUTO_TCP_BELOW_RTT`] (a LAN, loopback); paced
    /// elsewhere, or TCP where UDP gets no answer within [`AUTO_UDP_TIMEOUT`] (blocked, or a
    /// receiver without it).
    Auto,
}

/// How long `Transport::Auto` waits for an answer over UDP before it uses TCP.
pub const AUTO_UDP_TIMEOUT: Duration = Duration::from_secs(3);

/// `Transport::Auto` keeps a TCP connection whose handshake's round trip (as the kernel measured
/// it) is less than this.
///
/// Why: the paced transport earns its keep where TCP cannot recover a loss quickly, on long
/// round trips; on a LAN or loopback TCP repairs a loss within a millisecond and the kernel's
/// path costs less CPU and memory per byte (1 GiB on loopback: 5.8 s and 73 MB over TCP against
/// 7.5 s and 172 MB paced, issue 28). A handshake slowed by a lost SYN only sends the
/// connection to the paced transport, which holds its rate there too.
pub const AUTO_TCP_BELOW_RTT: Duration = Duration::from_millis(2);

/// Transport options for every connection bulkcast makes or accepts.
#[derive(Debug, Clone, Default)]
pub struct TcpTuning {
    /// TCP or the paced UDP transport, for connections this side makes.
    pub transport: Transport,
    /// Congestion control (`bbr`, `cubic`); empty keeps the system default.
    pub cc: String,
    /// Socket buffer size in bytes; `None` leaves the kernel's autotuning in charge, which is
    /// right unless `net.ipv4.tcp_rmem`/`tcp_wmem` caps are below the path's BDP.
    pub sockbuf: Option<u32>,
}

/// The congestion control to use by default: `auto` where the kernel offers bbr (a tree's
/// edges run bbr until their path shows it is clean, then cubic, see
/// [`bulkcast_proto::cc`]; every other connection runs bbr), else the system default.
pub fn default_cc() -> String {
    let avail = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    if avail.split_whitespace().any(|c| c == "bbr") {
        "auto".into()
    } else {
        String::new()
    }
}

/// Sets the congestion control algorithm of a socket. `auto` sets bbr where the kernel has it
/// (a tree edge's writer then watches it, [`bulkcast_proto::cc`]).
pub fn set_cc(stream: &impl AsFd, cc: &str) -> io::Result<()> {
    if cc.is_empty() {
        return Ok(());
    }
    if cc == "auto" {
        // A relay without bbr keeps the system's control rather than failing the edge.
        return set_cc(stream, "bbr").or(Ok(()));
    }
    let name = std::ffi::OsString::from(cc);
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::TcpCongestion, &name).map_err(
        |e| {
            let e = io::Error::from(e);
            io::Error::new(
                e.kind(),
                format!("congestion control {cc:?} unavailable: {e}"),
            )
        },
    )
}

/// Keeps at most `bytes` of not-yet-sent data in a socket's send buffer (`TCP_NOTSENT_LOWAT`):
/// the socket reports room only when its unsent backlog is below that, so a connection takes
/// new data at the pace its congestion window drains it instead of queueing megabytes. This is
/// what makes "take the next frame when the socket has room" a real measure of a connection's
/// speed on a spread edge.
pub fn set_notsent_lowat(stream: &impl AsFd, bytes: u32) -> io::Result<()> {
    socket2::SockRef::from(stream).set_tcp_notsent_lowat(bytes)
}

/// The kernel's `TCP_INFO` of a connection and how many bytes of it the kernel filled.
/// Raw `getsockopt`: neither nix nor socket2 reads `TCP_INFO`.
fn tcp_info(stream: &impl AsRawFd) -> Option<(libc::tcp_info, usize)> {
    // SAFETY: `tcp_info` is plain data (all zeroes is valid); the kernel writes at most `len`
    // bytes into it and the fd is a valid socket for the duration of the call.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((info, len as usize))
}

/// The connection's smoothed round trip as TCP measured it (`TCP_INFO`); `None` if the kernel
/// does not say.
pub fn rtt(stream: &impl AsRawFd) -> Option<Duration> {
    let (info, _) = tcp_info(stream)?;
    (info.tcpi_rtt > 0).then(|| Duration::from_micros(u64::from(info.tcpi_rtt)))
}

/// The connection's minimum round trip so far as TCP measured it (`TCP_INFO`, Linux 4.10+);
/// `None` if the kernel does not say.
pub fn min_rtt(stream: &impl AsRawFd) -> Option<Duration> {
    let (info, len) = tcp_info(stream)?;
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_min_rtt) + 4;
    (len >= needed && info.tcpi_min_rtt > 0 && info.tcpi_min_rtt < u32::MAX)
        .then(|| Duration::from_micros(u64::from(info.tcpi_min_rtt)))
}

/// Segments a TCP connection has sent and retransmitted since it started (`TCP_INFO`), or
/// `None` where the kernel does not say (kernels before 4.2 lack the count of segments sent).
pub fn loss_counters(stream: &impl AsRawFd) -> Option<(u64, u64)> {
    let (info, len) = tcp_info(stream)?;
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_segs_out) + 4;
    (len >= needed).then(|| {
        (
            u64::from(info.tcpi_segs_out),
            u64::from(info.tcpi_total_retrans),
        )
    })
}

/// Where a TCP sender's time went, from the kernel's chronograph (`TCP_INFO`, Linux 4.10+):
/// what an operator needs to tell a slow path from a sender that had nothing to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendTimes {
    /// Time with data in flight (the connection was sending).
    pub busy: Duration,
    /// Part of `busy` during which the receiver's window was the limit.
    pub rwnd_limited: Duration,
    /// Part of `busy` during which the send buffer was the limit.
    pub sndbuf_limited: Duration,
    /// Payload bytes sent, retransmissions included.
    pub bytes_sent: u64,
    /// Payload bytes sent again.
    pub bytes_retrans: u64,
}

/// The connection's [`SendTimes`], or `None` where the kernel does not say.
pub fn send_times(stream: &impl AsRawFd) -> Option<SendTimes> {
    let (info, len) = tcp_info(stream)?;
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_retrans) + 8;
    (len >= needed).then(|| SendTimes {
        busy: Duration::from_micros(info.tcpi_busy_time),
        rwnd_limited: Duration::from_micros(info.tcpi_rwnd_limited),
        sndbuf_limited: Duration::from_micros(info.tcpi_sndbuf_limited),
        bytes_sent: info.tcpi_bytes_sent,
        bytes_retrans: info.tcpi_bytes_retrans,
    })
}

/// Caps the rate at which a socket sends (`SO_MAX_PACING_RATE`, bytes per second; `u64::MAX`:
/// no cap). Setting it also turns on the kernel's pacing for congestion controls that do not
/// pace by themselves (cubic), so the cap holds packet by packet, not on average.
pub fn set_max_pacing_rate(stream: &impl AsRawFd, bytes_per_sec: u64) -> io::Result<()> {
    // The kernel takes 32 bits here; all ones means no cap.
    let v: u32 = bytes_per_sec.try_into().unwrap_or(u32::MAX);
    setsockopt_u32(stream, libc::SOL_SOCKET, libc::SO_MAX_PACING_RATE, v)
}

/// Sets a socket option whose value is a 32-bit integer. Raw `setsockopt`: its one use,
/// `SO_MAX_PACING_RATE`, has no wrapper in nix or socket2.
fn setsockopt_u32(stream: &impl AsRawFd, level: i32, name: i32, v: u32) -> io::Result<()> {
    // SAFETY: the fd is a valid socket for the duration of the call; `v` outlives it, and the
    // kernel reads `size_of::<u32>()` bytes (an `int` for these options).
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            (&v as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Connects with a deadline and the tuning applied, over the tuning's transport.
pub async fn connect(addr: &str, tuning: &TcpTuning) -> Result<Stream, ConnError> {
    match tuning.transport {
        Transport::Tcp => connect_tcp(addr, tuning).await.map(Stream::Tcp),
        Transport::Paced => {
            let a = resolve(addr).await?;
            match PacedStream::connect(a, CONNECT_TIMEOUT).await {
                Ok(s) => Ok(Stream::Paced(s)),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    Err(ConnError::Timeout("connecting over UDP (is UDP blocked?)"))
                }
                Err(e) => Err(ConnError::Io(e)),
            }
        }
        Transport::Auto => connect_auto(addr, tuning, AUTO_TCP_BELOW_RTT).await,
    }
}

/// `Transport::Auto`: TCP when its handshake takes under `tcp_below`, else paced (TCP when UDP
/// gets no answer).
async fn connect_auto(
    addr: &str,
    tuning: &TcpTuning,
    tcp_below: Duration,
) -> Result<Stream, ConnError> {
    let started = std::time::Instant::now();
    if let Ok(s) = connect_tcp(addr, tuning).await {
        // The kernel's round trip of the handshake (its SYN and SYN-ACK), not the time the
        // connect took here, which a busy host's scheduler inflates.
        let rtt = rtt(&s).unwrap_or_else(|| started.elapsed());
        if rtt < tcp_below {
            return Ok(Stream::Tcp(s));
        }
        // A long round trip: the paced transport instead (the receiver takes the connection,
        // closed before its `Hello`, for a probe).
    }
    let a = resolve(addr).await?;
    match PacedStream::connect(a, AUTO_UDP_TIMEOUT).await {
        Ok(s) => Ok(Stream::Paced(s)),
        Err(e) => {
            tracing::info!("{addr}: no paced connection over UDP ({e}); using TCP");
            connect_tcp(addr, tuning).await.map(Stream::Tcp)
        }
    }
}

/// The first address `addr` resolves to, within the connect deadline.
async fn resolve(addr: &str) -> Result<SocketAddr, ConnError> {
    tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(addr))
        .await
        .map_err(|_| ConnError::Timeout("resolving the address"))??
        .next()
        .ok_or_else(|| {
            ConnError::Io(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{addr} resolves to nothing"),
            ))
        })
}

/// Connects over TCP with a deadline and the tuning applied.
pub async fn connect_tcp(addr: &str, tuning: &TcpTuning) -> Result<TcpStream, ConnError> {
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host(addr))
            .await
            .map_err(|_| ConnError::Timeout("resolving the address"))??
            .collect();
    let mut last = io::Error::new(
        io::ErrorKind::NotFound,
        format!("{addr} resolves to nothing"),
    );
    for a in addrs {
        let socket = || -> io::Result<TcpSocket> {
            let sock = if a.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if let Some(n) = tuning.sockbuf {
                sock.set_send_buffer_size(n)?;
                sock.set_recv_buffer_size(n)?;
            }
            Ok(sock)
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, connect_staggered(socket, a)).await {
            Ok(Ok(s)) => {
                s.set_nodelay(true)?;
                set_cc(&s, &tuning.cc)?;
                return Ok(s);
            }
            Ok(Err(e)) => last = e,
            Err(_) => return Err(ConnError::Timeout("connecting")),
        }
    }
    Err(ConnError::Io(last))
}

/// When further attempts at a connect start while none has been answered, after the first.
///
/// A lost SYN or SYN-ACK is sent again only after the kernel's initial timeout of 1 s (then 3 s
/// more), which on a path with 1% random loss holds a hop's set-up for a second in a few
/// percent of connections, and a tree makes dozens. A second SYN sent meanwhile usually gets
/// through: the first attempt answered wins, the others are dropped (a round trip longer than
/// the first stagger costs the agent a connection that closes before its `Hello`).
const CONNECT_STAGGER: [Duration; 2] = [Duration::from_millis(250), Duration::from_millis(750)];

/// Connects to `a` with sockets from `socket`, starting another attempt at each
/// [`CONNECT_STAGGER`] while none has succeeded; the first to connect wins. An attempt that
/// fails (refused, unreachable) ends the whole connect: the others would fail the same way.
async fn connect_staggered(
    socket: impl Fn() -> io::Result<TcpSocket>,
    a: SocketAddr,
) -> io::Result<TcpStream> {
    let start = tokio::time::Instant::now();
    let mut attempts = tokio::task::JoinSet::new();
    attempts.spawn(socket()?.connect(a));
    let mut later = CONNECT_STAGGER.iter().map(|d| start + *d);
    let mut next = later.next();
    loop {
        tokio::select! {
            done = attempts.join_next() => match done {
                Some(Ok(result)) => return result,
                Some(Err(e)) => return Err(io::Error::other(e)),
                None => return Err(io::Error::other("no connect attempt under way")),
            },
            _ = tokio::time::sleep_until(next.unwrap_or(start)), if next.is_some() => {
                attempts.spawn(socket()?.connect(a));
                next = later.next();
            }
        }
    }
}

/// Binds a listener with the tuning applied (accepted sockets inherit it).
pub async fn listen(addr: &str, tuning: &TcpTuning) -> io::Result<TcpListener> {
    let a: SocketAddr = match tokio::net::lookup_host(addr).await?.next() {
        Some(a) => a,
        None => {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{addr} resolves to nothing"),
            ))
        }
    };
    let sock = if a.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    if let Some(n) = tuning.sockbuf {
        sock.set_send_buffer_size(n)?;
        sock.set_recv_buffer_size(n)?;
    }
    sock.bind(a)?;
    sock.listen(1024)
}

/// A connection over either transport.
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// The paced UDP transport.
    Paced(PacedStream),
    /// Either, encrypted after its handshake ([`crate::secure`]).
    Sealed(Box<Sealed<Stream>>),
}

/// The reading half of a [`Stream`].
pub enum ReadHalf {
    /// TCP.
    Tcp(tokio::net::tcp::OwnedReadHalf),
    /// The paced UDP transport.
    Paced(tokio::io::ReadHalf<PacedStream>),
    /// Encrypted.
    Sealed(Box<Sealed<ReadHalf>>),
}

/// The writing half of a [`Stream`].
pub enum WriteHalf {
    /// TCP.
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    /// The paced UDP transport.
    Paced(tokio::io::WriteHalf<PacedStream>),
    /// Encrypted.
    Sealed(Box<Sealed<WriteHalf>>),
}

impl Stream {
    /// Splits into halves that can be used by two tasks.
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), WriteHalf::Tcp(w))
            }
            Stream::Paced(s) => {
                let (r, w) = tokio::io::split(s);
                (ReadHalf::Paced(r), WriteHalf::Paced(w))
            }
            Stream::Sealed(s) => {
                let (r, w) = s.split(Stream::into_split);
                (
                    ReadHalf::Sealed(Box::new(r)),
                    WriteHalf::Sealed(Box::new(w)),
                )
            }
        }
    }

    /// The smoothed round trip the transport measured, if it has one.
    pub fn rtt(&self) -> Option<Duration> {
        match self {
            Stream::Tcp(s) => rtt(s),
            Stream::Paced(s) => s.stats().srtt,
            Stream::Sealed(s) => s.get_ref().rtt(),
        }
    }

    /// Which transport this is.
    pub fn transport(&self) -> Transport {
        match self {
            Stream::Tcp(_) => Transport::Tcp,
            Stream::Paced(_) => Transport::Paced,
            Stream::Sealed(s) => s.get_ref().transport(),
        }
    }

    /// This side's address (TCP; `None` for the paced transport, whose sockets are shared).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Stream::Tcp(s) => s.local_addr().ok(),
            Stream::Paced(_) => None,
            Stream::Sealed(s) => s.get_ref().local_addr(),
        }
    }

    /// The TCP socket underneath, encrypted or not, for socket options.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            Stream::Paced(_) => None,
            Stream::Sealed(s) => s.get_ref().tcp(),
        }
    }

    /// True when the connection is encrypted.
    pub fn is_sealed(&self) -> bool {
        matches!(self, Stream::Sealed(_))
    }
}

impl WriteHalf {
    /// The TCP socket, encrypted or not, for socket options; `None` for the paced transport
    /// (it paces itself and keeps no kernel send buffer to bound).
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            WriteHalf::Tcp(w) => Some(w.as_ref()),
            WriteHalf::Paced(_) => None,
            WriteHalf::Sealed(w) => w.get_ref().tcp(),
        }
    }
}

macro_rules! delegate_read {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &mut tokio::io::ReadBuf<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
                    Self::Paced(s) => std::pin::Pin::new(s).poll_read(cx, buf),
                    Self::Sealed(s) => std::pin::Pin::new(&mut **s).poll_read(cx, buf),
                }
            }
        }
    };
}

macro_rules! delegate_write {
    ($t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<io::Result<usize>> {
                match self.get_mut() {
                    Self::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
                    Self::Paced(s) => std::pin::Pin::new(s).poll_write(cx, buf),
                    Self::Sealed(s) => std::pin::Pin::new(&mut **s).poll_write(cx, buf),
                }
            }

            fn poll_flush(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
                    Self::Paced(s) => std::pin::Pin::new(s).poll_flush(cx),
                    Self::Sealed(s) => std::pin::Pin::new(&mut **s).poll_flush(cx),
                }
            }

            fn poll_shutdown(
                self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                match self.get_mut() {
                    Self::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
                    Self::Paced(s) => std::pin::Pin::new(s).poll_shutdown(cx),
                    Self::Sealed(s) => std::pin::Pin::new(&mut **s).poll_shutdown(cx),
                }
            }
        }
    };
}

delegate_read!(Stream);
delegate_read!(ReadHalf);
delegate_write!(Stream);
delegate_write!(WriteHalf);

/// A listening socket of either transport.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// The paced UDP transport.
    Paced(PacedListener),
}

impl Listener {
    /// The next connection and its peer.
    pub async fn accept(&mut self) -> io::Result<(Stream, SocketAddr)> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| (Stream::Tcp(s), a)),
            Listener::Paced(l) => l.accept().await.map(|(s, a)| (Stream::Paced(s), a)),
        }
    }

    /// The address listened on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Paced(l) => Ok(l.local_addr()),
        }
    }
}

/// Listens on `addr` over TCP and the paced transport, on the same port (an `addr` with
/// port 0 gets one port free for both).
pub async fn listen_both(addr: &str, tuning: &TcpTuning) -> io::Result<[Listener; 2]> {
    let mut last = None;
    for _ in 0..8 {
        let tcp = listen(addr, tuning).await?;
        let a = tcp.local_addr()?;
        match PacedListener::bind(a).await {
            Ok(p) => return Ok([Listener::Tcp(tcp), Listener::Paced(p)]),
            // Port 0 gave a TCP port whose UDP twin is taken: try another.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && addr.ends_with(":0") => {
                last = Some(e)
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("listening on {a} over UDP (paced transport): {e}"),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| io::ErrorKind::AddrInUse.into()))
}

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Frame>, ConnError> {
    let mut header = [0u8; 4];
    match r.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = wire::body_len(header, max)?;
    // Read straight into uninitialised capacity: no zeroing pass over every chunk.
    let mut body = BytesMut::with_capacity(len);
    while body.len() < len {
        let want = (len - body.len()) as u64;
        if (&mut *r).take(want).read_buf(&mut body).await? == 0 {
            return Err(ConnError::Wire(WireError::Truncated("incoming")));
        }
    }
    Ok(Some(Frame::decode(body.freeze())?))
}

/// Reads one frame, treating end of stream as an error, within a deadline.
pub async fn expect_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    what: &'static str,
) -> Result<Frame, ConnError> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_frame(r, wire::MAX_FRAME)).await {
        Err(_) => Err(ConnError::Timeout(what)),
        Ok(Ok(None)) => Err(ConnError::Closed),
        Ok(Ok(Some(f))) => Ok(f),
        Ok(Err(e)) => Err(e),
    }
}

/// Reads one handshake frame: at most [`HANDSHAKE_MAX_FRAME`] bytes, within the step's deadline.
pub(crate) async fn expect_small<R: AsyncRead + Unpin>(
    r: &mut R,
    what: &'static str,
) -> Result<Frame, ConnError> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, read_frame(r, HANDSHAKE_MAX_FRAME)).await {
        Err(_) => Err(ConnError::Timeout(what)),
        Ok(Ok(None)) => Err(ConnError::Closed),
        Ok(Ok(Some(f))) => Ok(f),
        Ok(Err(e)) => Err(e),
    }
}

/// Writes one frame (without copying a chunk's data) and flushes it (an encrypted stream
/// may hold the end of its last record until then).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, f: &Frame) -> io::Result<()> {
    write_encoded(w, &f.encode()).await?;
    w.flush().await
}

async fn write_encoded<W: AsyncWrite + Unpin>(w: &mut W, e: &wire::Encoded) -> io::Result<()> {
    w.write_all(&e.head).await?;
    if !e.data.is_empty() {
        w.write_all(&e.data).await?;
    }
    Ok(())
}

/// Writes one frame to a TCP connection behind a buffer: a chunk that is a mapped range of the
/// source's file ([`crate::mapped`]) goes with `sendfile(2)`, from the page cache straight into
/// the socket; everything else as [`write_frame`].
pub async fn write_frame_tcp(w: &mut tokio::io::BufWriter<WriteHalf>, f: &Frame) -> io::Result<()> {
    let e = f.encode();
    // sendfile only where the bytes go out as they are: never on an encrypted stream.
    let (Some((file, offset)), true) = (
        crate::mapped::file_range(&e.data),
        matches!(w.get_ref(), WriteHalf::Tcp(_)),
    ) else {
        return write_encoded(w, &e).await;
    };
    w.write_all(&e.head).await?;
    w.flush().await?;
    let tcp: &TcpStream = w.get_ref().tcp().expect("checked above");
    let mut sent = 0usize;
    while sent < e.data.len() {
        let r = tcp
            .async_io(tokio::io::Interest::WRITABLE, || {
                let mut off = (offset + sent as u64) as i64;
                nix::sys::sendfile::sendfile(tcp, &*file, Some(&mut off), e.data.len() - sent)
                    .map_err(io::Error::from)
            })
            .await;
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            // A file system without sendfile support: copy from the mapping instead.
            Err(err) if sent == 0 && err.raw_os_error() == Some(libc::EINVAL) => {
                return w.write_all(&e.data).await;
            }
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// The connecting side's handshake ([`crate::secure`]): returns the connection, encrypted
/// unless both ends chose plaintext.
pub async fn handshake_connect(mut s: Stream, keys: &Keys) -> Result<Stream, ConnError> {
    let admitted = crate::secure::connect(&mut s, keys).await?;
    Ok(seal(s, admitted))
}

/// The accepting side's handshake. A peer that fails is told why and never gets session data.
pub async fn handshake_accept(mut s: Stream, keys: &Keys) -> Result<Stream, ConnError> {
    let admitted = crate::secure::accept(&mut s, keys).await?;
    if let Some(peer) = &admitted.peer {
        tracing::debug!("admitted host key {peer}");
    }
    Ok(seal(s, admitted))
}

fn seal(s: Stream, admitted: crate::secure::Admitted) -> Stream {
    match admitted.cipher {
        Some(c) => Stream::Sealed(Box::new(Sealed::new(s, c))),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn auto_uses_tcp_on_short_paths_and_udp_where_it_answers_on_long_ones() {
        let tuning = TcpTuning {
            transport: Transport::Auto,
            ..TcpTuning::default()
        };
        // Both listening on loopback, a round trip far under a millisecond: TCP.
        let mut both = listen_both("127.0.0.1:0", &tuning).await.unwrap();
        let addr = both[0].local_addr().unwrap().to_string();
        let (c, _) = tokio::join!(connect(&addr, &tuning), both[0].accept());
        assert_eq!(c.unwrap().transport(), Transport::Tcp);
        // The same where every handshake counts as a long round trip: paced.
        let long = Duration::ZERO;
        let (c, _) = tokio::join!(connect_auto(&addr, &tuning, long), both[1].accept());
        assert_eq!(c.unwrap().transport(), Transport::Paced);
        // TCP only, UDP refused (ICMP port unreachable): TCP at once.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let t0 = std::time::Instant::now();
        let c = connect_auto(&addr, &tuning, long).await.unwrap();
        assert_eq!(c.transport(), Transport::Tcp);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        // TCP only, UDP silently dropped (a socket that never answers): TCP after the wait.
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        let _silent = std::net::UdpSocket::bind(a).unwrap();
        let t0 = std::time::Instant::now();
        let c = connect_auto(&a.to_string(), &tuning, long).await.unwrap();
        assert_eq!(c.transport(), Transport::Tcp);
        assert!(t0.elapsed() >= AUTO_UDP_TIMEOUT, "{:?}", t0.elapsed());
        // Explicit UDP to the silent one: a clear error, no fallback.
        let udp = TcpTuning {
            transport: Transport::Paced,
            ..TcpTuning::default()
        };
        let l2 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let refused = connect(&l2.local_addr().unwrap().to_string(), &udp).await;
        assert!(refused.is_err());
    }

    #[tokio::test]
    async fn round_trip_and_pacing_cap_on_a_real_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (c, s) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (c, _s) = (c.unwrap(), s.unwrap());
        // Loopback: a round trip is known, and short.
        let rtt = rtt(&c).expect("TCP_INFO has a round trip");
        assert!(rtt < Duration::from_secs(1), "{rtt:?}");
        // And a minimum one (what `--cc auto` keeps long paths on bbr by), short: a LAN's.
        let min = min_rtt(&c).expect("TCP_INFO has a minimum round trip");
        assert!(min < bulkcast_proto::cc::LONG_PATH, "{min:?}");
        // The cap reads back as set; above 32 bits it means no cap.
        let read = |c: &TcpStream| {
            let mut v: u32 = 0;
            let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
            // SAFETY: valid socket fd; `v` and `len` outlive the call. (No wrapper reads
            // SO_MAX_PACING_RATE back, as none sets it.)
            let rc = unsafe {
                libc::getsockopt(
                    c.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_MAX_PACING_RATE,
                    (&mut v as *mut u32).cast(),
                    &mut len,
                )
            };
            assert_eq!(rc, 0);
            v
        };
        set_max_pacing_rate(&c, 1_250_000).unwrap();
        assert_eq!(read(&c), 1_250_000);
        set_max_pacing_rate(&c, u64::MAX).unwrap();
        assert_eq!(read(&c), u32::MAX);
    }

    #[tokio::test]
    async fn garbage_and_truncation_are_errors() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        a.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        drop(a);
        let r = read_frame(&mut b, wire::MAX_FRAME).await;
        assert!(
            matches!(r, Err(ConnError::Wire(WireError::TooLarge { .. }))),
            "{r:?}"
        );

        let (mut a, mut b) = tokio::io::duplex(4096);
        a.write_all(&[0, 0, 0, 50, 0x11, 1, 2]).await.unwrap();
        drop(a);
        let r = read_frame(&mut b, wire::MAX_FRAME).await;
        assert!(
            matches!(r, Err(ConnError::Wire(WireError::Truncated(_)))),
            "{r:?}"
        );
    }
}
