//! The agent's side of a multicast send: join the group, take the file, say when it is in
//! place. Datagrams are taken on a thread of their own (a busy host must not let the socket
//! overflow behind the async runtime); the connection to the source carries the rest.

use std::fs::File;
use std::net::SocketAddrV4;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bulkcast_proto::mcast::msg::McastOpen;
use bulkcast_proto::mcast::receiver::{Receiver, ReceiverConfig, RxEvent, RxStats};
use bulkcast_proto::mcast::seal::{GroupCipher, GroupKey};
use bulkcast_proto::mcast::{Layout, McastMsg};
use bulkcast_proto::wire::{self, Frame};
use tokio::sync::mpsc;

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
    match serve(stream, open, &cfg.dir, !cfg.keys.plaintext()).await {
        Ok(Outcome::Done) => Ok(Served::Session(session)),
        Ok(Outcome::Cancelled(why)) => {
            tracing::info!("multicast session {session:016x}: not by multicast here ({why})");
            Ok(Served::Probe)
        }
        Err(e) => Err(SessionError::Aborted(session, e)),
    }
}

/// Runs the session whose `Open` came on `stream`, storing into `dir`; `sealed`: this end
/// did not choose `--plaintext`, and refuses a session whose datagrams go in clear.
pub async fn serve(
    mut stream: Stream,
    open: McastOpen,
    dir: &Path,
    sealed: bool,
) -> Result<Outcome, String> {
    let prepared = prepare(&stream, &open, dir, sealed);
    let (sock, layout, part, file) = match prepared {
        Ok(p) => p,
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
    transport::write_frame(&mut stream, &Frame::Mcast(ready))
        .await
        .map_err(|e| e.to_string())?;
    let (ctl_tx, ctl_rx) = std_mpsc::channel();
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    let renak = Duration::from_millis(u64::from(open.renak_ms.clamp(5, 5_000)));
    let session = open.session;
    let cipher = open.key.as_ref().map(GroupKey::cipher);
    let worker = tokio::task::spawn_blocking(move || {
        receive(sock, layout, session, cipher, renak, &file, ctl_rx, out_tx)
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
    let end = match (end, result) {
        (Err(_), Some(Err(e))) => Err(e),
        (end, _) => end,
    };
    let outcome = end.and_then(|o| match o {
        Outcome::Done => finish(&part, dir, &open).map(|()| Outcome::Done),
        c => Ok(c),
    });
    if !matches!(outcome, Ok(Outcome::Done)) {
        let _ = std::fs::remove_file(&part);
    }
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

type Prepared = (std::net::UdpSocket, Layout, PathBuf, File);

/// Checks the set-up (a receiver that wants encryption refuses datagrams in clear), joins
/// the group on the address the source reached us on, and opens the partial copy.
fn prepare(
    stream: &Stream,
    open: &McastOpen,
    dir: &Path,
    sealed: bool,
) -> Result<Prepared, String> {
    refuse_plaintext(open, sealed)?;
    let name = &open.name;
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(format!("bad file name {name:?}"));
    }
    let layout = Layout::new(open.size, open.symbol, open.k, open.m)?;
    let group: SocketAddrV4 = open
        .group
        .parse()
        .map_err(|_| format!("bad group {:?}", open.group))?;
    let iface = super::v4(stream.local_addr());
    let sock = super::join(group, iface)
        .map_err(|e| format!("cannot join multicast group {group}: {e}"))?;
    sock.set_read_timeout(Some(Duration::from_millis(5)))
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let part = dir.join(format!(".{name}.mcast-{:016x}", open.session));
    let file = File::create(&part)
        .and_then(|f| f.set_len(open.size).map(|()| f))
        .map_err(|e| format!("{}: {e}", part.display()))?;
    Ok((sock, layout, part, file))
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

/// Moves the verified copy into place with its mode.
fn finish(part: &Path, dir: &Path, open: &McastOpen) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::Permissions::from_mode(open.mode & 0o777);
    std::fs::set_permissions(part, mode).map_err(|e| e.to_string())?;
    let dest = dir.join(&open.name);
    std::fs::rename(part, &dest).map_err(|e| format!("{}: {e}", dest.display()))
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
    file: &File,
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
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
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
            let _ = out.send(m);
        }
        match events(&mut rx, file) {
            Some(r) => break r,
            None => continue,
        }
    };
    (end, rx.stats)
}

/// The group's socket, read with the kernel's arrival time of each datagram
/// (`SO_TIMESTAMPNS`): a receiver on a busy host gets round to its datagrams late and in
/// bursts, and timing the train by when it read them would measure its scheduler, not the
/// network. Where the kernel can, it hands over several datagrams of one sender in one read
/// (`UDP_GRO`, the source sends in GSO batches): one system call, not one per datagram.
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
        let _ = setsockopt(&sock, sockopt::UdpGroSegment, &true);
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
fn events(rx: &mut Receiver, file: &File) -> Option<Result<Outcome, String>> {
    while let Some(ev) = rx.poll_event() {
        match ev {
            RxEvent::Write { offset, data } => {
                if let Err(e) = file.write_all_at(&data, offset) {
                    return Some(Err(format!("writing the copy: {e}")));
                }
            }
            RxEvent::Complete => return Some(Ok(Outcome::Done)),
            RxEvent::Failed(e) => return Some(Err(e)),
        }
    }
    None
}
