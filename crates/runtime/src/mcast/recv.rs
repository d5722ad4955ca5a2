//! The agent's side of a multicast send: join the group, take the file, say when it is in
//! place. Datagrams are taken on a thread of their own (a busy host must not let the socket
//! overflow behind the async runtime); the connection to the source carries the rest.

use std::net::SocketAddrV4;
use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bulkcast_proto::mcast::msg::McastOpen;
use bulkcast_proto::mcast::receiver::{Receiver, ReceiverConfig, RxEvent, RxStats};
use bulkcast_proto::mcast::seal::{GroupCipher, GroupKey};
use bulkcast_proto::mcast::{Layout, McastMsg};
use bulkcast_proto::wire::{self, Frame};
use tokio::sync::mpsc;

use crate::store::{Holding, Partials, ResumableFile};
use crate::transport::{self, Stream};

/// How a multicast session ended here.
#[derive(Debug)]
pub enum Outcome {
    /// The copy is in place.
    Done,
    /// The source went on without this receiver's multicast (it heard nothing): the agent
    /// waits for the session that replaces it.
    Cancelled(String),
}

/// [`serve`] for an agent: into its directory, as one of its sessions.
pub async fn serve_agent(
    stream: Stream,
    open: McastOpen,
    cfg: &crate::agent::AgentConfig,
) -> Result<crate::agent::Served, crate::agent::SessionError> {
    use crate::agent::{Served, SessionError};
    let session = open.session;
    if cfg.stdout {
        return Err(SessionError::Refused(
            "a multicast send cannot go to stdout".into(),
        ));
    }
    tracing::info!(
        "multicast session {session:016x}: receiving {:?} ({} bytes) on {}",
        open.name,
        open.size,
        open.group
    );
    let sealed = !cfg.keys.plaintext();
    match serve(stream, open, &cfg.dir, sealed, cfg.partials).await {
        Ok(Outcome::Done) => Ok(Served::Session(session)),
        Ok(Outcome::Cancelled(why)) => {
            tracing::info!("multicast session {session:016x}: not by multicast here ({why})");
            Ok(Served::Probe)
        }
        Err(e) => Err(SessionError::Aborted(session, e)),
    }
}

/// Runs the session whose `Open` came on `stream`, storing into `dir` (stale partial copies
/// there cleaned by `partials`); `sealed`: this end did not choose `--plaintext`, and refuses
/// a session whose datagrams go in clear.
pub async fn serve(
    mut stream: Stream,
    open: McastOpen,
    dir: &Path,
    sealed: bool,
    partials: Partials,
) -> Result<Outcome, String> {
    let (sock, layout, copy) = match prepare(&stream, &open, dir, sealed, partials) {
        Ok(Prepared::Join(sock, layout, copy)) => (sock, layout, copy),
        Ok(Prepared::Holds { complete, bytes }) => {
            let m = McastMsg::Holds { complete, bytes };
            let _ = transport::write_frame(&mut stream, &Frame::Mcast(m)).await;
            // The tree's session that follows moves only what is missing.
            return Ok(Outcome::Cancelled(match complete {
                true => "an identical copy is in place".into(),
                false => format!("{bytes} bytes of it are held"),
            }));
        }
        Err(reason) => {
            tracing::warn!("multicast session {:016x}: {reason}", open.session);
            let m = McastMsg::Ready {
                joined: false,
                reason: reason.clone(),
            };
            let _ = transport::write_frame(&mut stream, &Frame::Mcast(m)).await;
            // The source sends by the tree instead: not this session's failure.
            return Ok(Outcome::Cancelled(reason));
        }
    };
    let ready = McastMsg::Ready {
        joined: true,
        reason: String::new(),
    };
    if let Err(e) = transport::write_frame(&mut stream, &Frame::Mcast(ready)).await {
        copy.keep();
        return Err(e.to_string());
    }
    let (ctl_tx, ctl_rx) = std_mpsc::channel();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    let renak = Duration::from_millis(u64::from(open.renak_ms.clamp(5, 5_000)));
    let session = open.session;
    let cipher = open.key.as_ref().map(GroupKey::cipher);
    let worker = tokio::task::spawn_blocking(move || {
        receive(sock, layout, session, cipher, renak, copy, ctl_rx, out_tx)
    });
    let (mut rd, mut wr) = stream.into_split();
    let result: Option<Result<(), String>> = loop {
        tokio::select! {
            f = transport::read_frame(&mut rd, wire::MAX_FRAME) => match f {
                Ok(Some(Frame::Mcast(m))) => {
                    if ctl_tx.send(Some(m)).is_err() {
                        break None;
                    }
                }
                Ok(Some(other)) => break Some(Err(format!("unexpected {} frame", other.kind()))),
                Ok(None) | Err(_) => break Some(Err("the source went away".to_string())),
            },
            m = out_rx.recv() => match m {
                Some(m) => {
                    if let Err(e) = transport::write_frame(&mut wr, &Frame::Mcast(m)).await {
                        break Some(Err(format!("writing to the source: {e}")));
                    }
                }
                None => break None,
            },
        }
    };
    // The thread ends on its own (complete, failed, cancelled) or when told to stop.
    let _ = ctl_tx.send(None);
    let (end, stats) = worker.await.map_err(|e| e.to_string())?;
    if stats.refused > 0 {
        tracing::warn!(
            "multicast session {session:016x}: {} datagrams did not open under the group key \
             (altered, forged or from another sender) and were dropped",
            stats.refused
        );
    }
    // Told to stop because the connection failed: that is the reason.
    let outcome = match (end, result) {
        (Err(_), Some(Err(e))) => Err(e),
        (end, _) => end,
    };
    let done = McastMsg::Done {
        ok: matches!(outcome, Ok(Outcome::Done)),
        reason: outcome.as_ref().err().cloned().unwrap_or_default(),
        datagrams: stats.datagrams,
        decoded: stats.decoded,
    };
    if !matches!(outcome, Ok(Outcome::Cancelled(_))) {
        let _ = transport::write_frame(&mut wr, &Frame::Mcast(done)).await;
    }
    outcome
}

/// What a receiver does with a session's `Open`.
enum Prepared {
    /// Join: the group's socket, the file's layout, the (empty) copy to write.
    Join(std::net::UdpSocket, Layout, Box<ResumableFile>),
    /// Decline: it holds the object whole or in part (the copy is kept for the tree).
    Holds { complete: bool, bytes: u64 },
}

/// Checks the set-up (a receiver that wants encryption refuses datagrams in clear), opens
/// the copy (declining when it holds any of the object: the tree moves only what is
/// missing, where the group would send it all), and joins the group on the address the
/// source reached us on.
fn prepare(
    stream: &Stream,
    open: &McastOpen,
    dir: &Path,
    sealed: bool,
    partials: Partials,
) -> Result<Prepared, String> {
    refuse_plaintext(open, sealed)?;
    // The checks a tree session makes of the same object (name, mode) before it writes.
    let manifest = open.manifest();
    manifest.validate().map_err(|e| e.to_string())?;
    let layout = Layout::new(open.size, open.symbol, open.k, open.m)?;
    let group: SocketAddrV4 = open
        .group
        .parse()
        .map_err(|_| format!("bad group {:?}", open.group))?;
    let block = u32::try_from(layout.block_bytes()).map_err(|_| "blocks too large")?;
    let copy = match ResumableFile::open(dir, &manifest, block, partials) {
        Ok(Holding::Complete) => {
            return Ok(Prepared::Holds {
                complete: true,
                bytes: open.size,
            })
        }
        Ok(Holding::Busy) => return Err("another session is writing this file here".into()),
        Ok(Holding::Partial(c)) => match c.held_bytes() {
            0 => c,
            bytes => {
                c.keep();
                return Ok(Prepared::Holds {
                    complete: false,
                    bytes,
                });
            }
        },
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let iface = super::v4(stream.local_addr());
    let joined = super::join(group, iface).and_then(|s| {
        s.set_read_timeout(Some(Duration::from_millis(5)))
            .map(|()| s)
    });
    match joined {
        Ok(sock) => Ok(Prepared::Join(sock, layout, copy)),
        Err(e) => {
            copy.keep();
            Err(format!("cannot join multicast group {group}: {e}"))
        }
    }
}

/// A receiver that did not choose `--plaintext` takes only sealed sessions.
fn refuse_plaintext(open: &McastOpen, sealed: bool) -> Result<(), String> {
    match (sealed, &open.key) {
        (true, None) => Err("refusing a multicast session in clear: the source chose \
             --plaintext and this receiver did not (it gets the file over its encrypted \
             connection instead; give --plaintext on both ends to multicast in clear)"
            .into()),
        _ => Ok(()),
    }
}

/// The datagram thread: runs the receiver until the copy is complete, fails, or is cancelled
/// (`None` on `ctl`: stop).
#[allow(clippy::too_many_arguments)]
fn receive(
    sock: std::net::UdpSocket,
    layout: Layout,
    session: u64,
    cipher: Option<GroupCipher>,
    renak: Duration,
    mut copy: Box<ResumableFile>,
    ctl: std_mpsc::Receiver<Option<McastMsg>>,
    out: mpsc::UnboundedSender<McastMsg>,
) -> (Result<Outcome, String>, RxStats) {
    let cfg = ReceiverConfig {
        renak: renak.as_micros() as u64,
        ..ReceiverConfig::default()
    };
    let mut rx = Receiver::new(layout, session, cipher, cfg);
    let epoch = Instant::now();
    let mut buf = vec![0u8; 65_536];
    let mut next_timer = 0;
    let mut sock = Arrivals::new(sock);
    let end = loop {
        let got = sock.recv(&mut buf);
        let now = super::micros(epoch);
        match got {
            // The train is timed by when its datagrams arrived.
            Ok((n, ago, seg)) => {
                for d in buf[..n].chunks_mut(seg.unwrap_or(n).max(1)) {
                    rx.handle_datagram(now.saturating_sub(ago), d);
                }
            }
            // A stopped and continued process (SIGSTOP, a debugger) gets EINTR: read again.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => break Err(format!("multicast socket: {e}")),
        }
        let mut stop = None;
        while let Ok(m) = ctl.try_recv() {
            match m {
                Some(McastMsg::Cancel { reason }) => stop = Some(Ok(Outcome::Cancelled(reason))),
                Some(m) => rx.handle_msg(now, m),
                None => stop = Some(Err("stopped".to_string())),
            }
        }
        if let Some(s) = stop {
            break s;
        }
        if now >= next_timer {
            rx.handle_timeout(now);
            next_timer = rx.poll_timeout().min(now + 2_000);
        }
        while let Some(m) = rx.poll_msg() {
            trace_msg(session, now, &m);
            let _ = out.send(m);
        }
        match events(&mut rx, &mut copy) {
            Some(r) => break r,
            None => continue,
        }
    };
    // What was verified stays for the next session, whichever strategy it uses.
    let end = match end {
        Ok(Outcome::Done) => {
            let t = Instant::now();
            let done = copy.finish();
            tracing::debug!(
                "multicast session {session:016x}: every block verified; the copy was \
                 synced and moved into place in {} ms",
                t.elapsed().as_millis()
            );
            done.map(|_| Outcome::Done).map_err(|e| e.to_string())
        }
        other => {
            copy.keep();
            other
        }
    };
    (end, rx.stats)
}

/// The receiver's side of a session on the debug log, with the session's clock: when the
/// train was timed and what it read, and each request for repairs.
fn trace_msg(session: u64, now: u64, m: &McastMsg) {
    match m {
        McastMsg::Train(t) => tracing::debug!(
            "multicast session {session:016x} at {} ms: train timed, {} datagrams over {} us",
            now / 1000,
            t.received,
            t.span
        ),
        McastMsg::Nak(naks) => tracing::debug!(
            "multicast session {session:016x} at {} ms: asked for repairs of {} blocks",
            now / 1000,
            naks.len()
        ),
        _ => {}
    }
}

/// The group's socket, read with the kernel's arrival time of each datagram
/// (`SO_TIMESTAMPNS`): a receiver on a busy host gets round to its datagrams late and in
/// bursts, and timing the train by when it read them would measure its scheduler, not the
/// network. Each datagram is read on its own (no `UDP_GRO`): a run the kernel coalesced
/// carries one timestamp, its first datagram's, so the train's last run read as arriving
/// early and the rate came out several percent high (83-90 Mbit/s measured through an 80
/// Mbit/s tbf); timing a run's later datagrams apart from its first would allow it again.
struct Arrivals {
    sock: std::net::UdpSocket,
    cmsg: Vec<u8>,
}

impl Arrivals {
    fn new(sock: std::net::UdpSocket) -> Self {
        use nix::sys::socket::{setsockopt, sockopt};
        if let Err(e) = setsockopt(&sock, sockopt::ReceiveTimestampns, &true) {
            tracing::debug!("no receive timestamps ({e}): the train is timed on reading");
        }
        Self {
            sock,
            cmsg: nix::cmsg_space!(nix::sys::time::TimeSpec, i32),
        }
    }

    /// The next datagram (or run of equal datagrams) into `buf`: its length, how many
    /// microseconds ago it arrived (0 without a timestamp), and the size of each datagram in
    /// it when it is a run.
    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<(usize, u64, Option<usize>)> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        use std::os::fd::AsRawFd;
        let mut iov = [std::io::IoSliceMut::new(buf)];
        let fd = self.sock.as_raw_fd();
        let msg = recvmsg::<()>(fd, &mut iov, Some(&mut self.cmsg), MsgFlags::empty())
            .map_err(std::io::Error::from)?;
        let (mut stamp, mut seg) = (None, None);
        for m in msg.cmsgs().into_iter().flatten() {
            match m {
                ControlMessageOwned::ScmTimestampns(ts) => stamp = Some(ts),
                ControlMessageOwned::UdpGroSegments(n) => seg = usize::try_from(n).ok(),
                _ => {}
            }
        }
        let ago = stamp.and_then(|ts| {
            let at = std::time::UNIX_EPOCH
                + Duration::new(u64::try_from(ts.tv_sec()).ok()?, ts.tv_nsec() as u32);
            std::time::SystemTime::now().duration_since(at).ok()
        });
        Ok((msg.bytes, ago.map_or(0, |d| d.as_micros() as u64), seg))
    }
}

/// Does what the receiver asks; `Some` when the session is over.
fn events(rx: &mut Receiver, copy: &mut ResumableFile) -> Option<Result<Outcome, String>> {
    while let Some(ev) = rx.poll_event() {
        match ev {
            RxEvent::Write { offset, data, hash } => {
                if let Err(e) = copy.write(offset, &data, &hash) {
                    return Some(Err(e.to_string()));
                }
            }
            RxEvent::Complete => return Some(Ok(Outcome::Done)),
            RxEvent::Failed(e) => return Some(Err(e)),
        }
    }
    None
}
