//! The clients of a feed server: `feed subscribe` (with reconnection and resume), `feed
//! insert`, `feed status`.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::{Msg, Start};
use bulkcast_proto::feed::product::{ProductAuth, ProductMeta, Subscription};
use bulkcast_proto::feed::receiver::{Latency, Receiver, ReceiverConfig, RxEvent, RxStats};
use bulkcast_proto::feed::seal::DgramReader;
use bulkcast_proto::mcast::seal::GroupKey;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;

use super::backoff::Backoff;
use super::ingest::{insert_from, InsertError};
use super::{now_us, read_msg, write_msg};
use crate::transport::{connect_tcp, handshake_connect, ReadHalf, Stream, TcpTuning, WriteHalf};

/// A subscriber's settings.
pub struct SubscribeConfig {
    /// The server, `HOST:PORT`.
    pub source: String,
    /// Feedtype pattern.
    pub feedtype: String,
    /// Name regex ("" for any).
    pub name: String,
    /// Where products go.
    pub dir: PathBuf,
    /// Where to start; `None`: where the last run stopped (the state file), else now.
    pub start: Option<Start>,
    /// Take multicast when the source offers it.
    pub multicast: bool,
    /// Interface address to join the group on.
    pub iface: Option<Ipv4Addr>,
    /// Session keys (admission, encryption, `--plaintext`: without it, a group in clear is
    /// refused and the products come over the encrypted connection).
    pub keys: Keys,
    /// Product authentication.
    pub auth: Arc<dyn ProductAuth>,
    /// TCP options.
    pub tuning: TcpTuning,
    /// Receiver timers.
    pub rx: ReceiverConfig,
    /// Stop after this many products.
    pub max_products: Option<u64>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Sent right after `Subscribe` on every connection: a relay's [`Msg::Relay`], which
    /// makes it its server's relay child while the connection lasts.
    pub hello: Option<Msg>,
}

/// What happens, as it happens (the CLI prints it and runs `--exec`).
#[derive(Debug)]
pub enum Report<'a> {
    /// Connected and admitted.
    Subscribed {
        /// `multicast` or `unicast`.
        transport: &'static str,
        /// The group, if multicast.
        group: &'a str,
        /// First sequence number of the stream.
        from: u64,
    },
    /// A product is in place, verified.
    Delivered {
        /// What.
        meta: &'a ProductMeta,
        /// Where.
        path: &'a Path,
        /// Latency split.
        latency: Latency,
        /// Bytes that came by repair.
        repaired: u64,
        /// By multicast (with repairs) rather than unicast.
        multicast: bool,
    },
    /// Products gone from the source's queue before they got here.
    Lost {
        /// First.
        from: u64,
        /// Last.
        to: u64,
    },
    /// New bytes of a product arrived (not yet verified): a slow product is still progress
    /// (a relay's [`bulkcast_proto::feed::relay::Stall`]).
    Received {
        /// The product.
        seq: u64,
        /// How many bytes.
        bytes: u64,
    },
    /// Multicast did not arrive; unicast now.
    FellBack,
    /// The source's group goes in clear (it chose `--plaintext`) and this subscriber did
    /// not: it does not join, and takes the products over its encrypted connection.
    RefusedClearGroup {
        /// The group.
        group: &'a str,
    },
    /// Every product below `below` is delivered, passed over or lost (the position a
    /// restart resumes from); said when it moves, after the products' `Delivered`. A relay
    /// queues what it delivered in order on it.
    Settled {
        /// The position.
        below: u64,
    },
    /// The connection ended (or an attempt to connect failed); reconnecting after
    /// `retry_in` ([`Backoff::reconnect`]).
    Disconnected {
        /// Why.
        reason: String,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
}

/// Why a subscription ended in failure.
#[derive(Debug, thiserror::Error)]
pub enum SubError {
    /// The source refused (allow rules, secret).
    #[error("refused by the source: {0}")]
    Refused(String),
    /// A local failure (disk full, unwritable directory).
    #[error("{0}")]
    Local(io::Error),
}

/// How a subscription ended.
#[derive(Debug, Default)]
pub struct Summary {
    /// Products delivered.
    pub delivered: u64,
    /// Counters of the last session.
    pub stats: RxStats,
}

const STATE_FILE: &str = ".bulkcast-feed-state";
/// Products smaller than this are hashed in the receive loop (cheaper than a thread hop).
const HASH_INLINE: u64 = 4 << 20;

/// Where hashes computed off the loop come back: (product, its copy matches).
type Hashed = mpsc::UnboundedSender<(u64, io::Result<bool>)>;

/// The resume position saved by an earlier run in `dir`.
pub fn saved_position(dir: &Path) -> Option<u64> {
    fs::read_to_string(dir.join(STATE_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn save_position(dir: &Path, seq: u64) {
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    if fs::write(&tmp, seq.to_string()).is_ok() {
        let _ = fs::rename(&tmp, dir.join(STATE_FILE));
    }
}

/// Subscribes until `max_products` or `duration` (or forever), reconnecting after losing the
/// source (after [`Backoff::reconnect`]'s waits) and resuming where it stopped.
pub async fn subscribe(
    cfg: SubscribeConfig,
    on: impl FnMut(Report<'_>),
) -> Result<Summary, SubError> {
    subscribe_until(cfg, on, std::future::pending()).await
}

/// [`subscribe`], also ending (`Ok`) when `stop` completes (an agent's shutdown, a
/// subscription removed from its config): the position is saved then, so the next run into
/// the same directory delivers nothing twice, and the products still incomplete are removed.
pub async fn subscribe_until(
    cfg: SubscribeConfig,
    mut on: impl FnMut(Report<'_>),
    stop: impl std::future::Future<Output = ()>,
) -> Result<Summary, SubError> {
    tokio::pin!(stop);
    fs::create_dir_all(&cfg.dir).map_err(SubError::Local)?;
    let sub = Subscription::parse(&cfg.feedtype, &cfg.name)
        .map_err(|e| SubError::Local(io::Error::other(e)))?;
    let deadline = cfg.duration.map(|d| Instant::now() + d);
    let mut start = cfg
        .start
        .unwrap_or_else(|| saved_position(&cfg.dir).map_or(Start::Now, Start::Seq));
    let mut summary = Summary::default();
    let mut backoff = Backoff::reconnect();
    let mut delivered = Vec::new();
    loop {
        let mut s = Session {
            cfg: &cfg,
            files: HashMap::new(),
            summary: &mut summary,
            resume: None,
            admitted: None,
            delivered: std::mem::take(&mut delivered),
        };
        let r = tokio::select! {
            r = s.run(sub.clone(), start, deadline, &mut on) => Some(r),
            _ = &mut stop => None,
        };
        let (resume, admitted) = (s.resume, s.admitted);
        delivered = std::mem::take(&mut s.delivered);
        s.discard_all();
        let Some(r) = r else {
            // `resume` is set after every delivery, before the session waits again: it
            // counts every product delivered (nothing delivered yet: the saved one holds).
            if let Some(seq) = resume {
                save_position(&cfg.dir, seq);
            }
            return Ok(summary);
        };
        let reason = match r {
            Ok(()) => return Ok(summary),
            Err(SessionEnd::Fatal(e)) => return Err(e),
            Err(SessionEnd::Lost(reason)) => reason,
        };
        let lived = admitted.map_or(Duration::ZERO, |t| t.elapsed());
        let retry_in = backoff.after(lived, rand::random());
        on(Report::Disconnected { reason, retry_in });
        if let Some(r) = resume {
            start = Start::Seq(r);
        }
        // Never waits past the deadline: a run of 10 s does not linger 30 s in a backoff.
        let wait = deadline.map_or(retry_in, |d| {
            retry_in.min(d.saturating_duration_since(Instant::now()))
        });
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => return Ok(summary),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(summary);
        }
    }
}

enum SessionEnd {
    Fatal(SubError),
    Lost(String),
}

impl From<io::Error> for SessionEnd {
    fn from(e: io::Error) -> Self {
        SessionEnd::Lost(e.to_string())
    }
}

struct Session<'a> {
    cfg: &'a SubscribeConfig,
    files: HashMap<u64, (PathBuf, File, ProductMeta)>,
    summary: &'a mut Summary,
    resume: Option<u64>,
    /// When the source accepted the subscription: how long the connection lived decides the
    /// wait before the next ([`Backoff::after`]).
    admitted: Option<Instant>,
    /// Products delivered past the resume position, handed from session to session: the
    /// source sends them again from that position.
    delivered: Vec<u64>,
}

impl Session<'_> {
    async fn connect(&self, start: Start) -> Result<(Stream, Msg), SessionEnd> {
        let stream = connect_tcp(&self.cfg.source, &self.cfg.tuning)
            .await
            .map_err(|e| SessionEnd::Lost(e.to_string()))?;
        stream.set_nodelay(true)?;
        let mut stream = handshake_connect(Stream::Tcp(stream), &self.cfg.keys)
            .await
            .map_err(|e| SessionEnd::Fatal(SubError::Refused(e.to_string())))?;
        let m = Msg::Subscribe {
            feedtype: self.cfg.feedtype.clone(),
            name: self.cfg.name.clone(),
            start,
            multicast: self.cfg.multicast,
        };
        write_msg(&mut stream, &m).await?;
        if let Some(h) = &self.cfg.hello {
            write_msg(&mut stream, h).await?;
        }
        stream.flush().await?;
        let acc = tokio::time::timeout(Duration::from_secs(10), read_msg(&mut stream))
            .await
            .map_err(|_| SessionEnd::Lost("no answer to the subscription".into()))??;
        match acc {
            Some(a @ Msg::Accepted { .. }) => Ok((stream, a)),
            Some(Msg::Refused { reason }) => Err(SessionEnd::Fatal(SubError::Refused(reason))),
            other => Err(SessionEnd::Lost(format!("unexpected answer {other:?}"))),
        }
    }

    async fn run(
        &mut self,
        sub: Subscription,
        start: Start,
        deadline: Option<Instant>,
        on: &mut impl FnMut(Report<'_>),
    ) -> Result<(), SessionEnd> {
        let (mut stream, acc) = self.connect(start).await?;
        self.admitted = Some(Instant::now());
        let (acc, refused) = refuse_clear_group(acc, !self.cfg.keys.plaintext());
        let Msg::Accepted {
            feed_id,
            group,
            first,
            key,
            ..
        } = &acc
        else {
            unreachable!("checked in connect")
        };
        let first = *first;
        let dgrams = DgramReader::new(*feed_id, key.as_ref().map(GroupKey::cipher));
        if let Some(g) = &refused {
            on(Report::RefusedClearGroup { group: g });
            write_msg(&mut stream, &Msg::Fallback { seq: first }).await?;
            // Out now: an encrypted stream holds a record's end until flushed.
            stream.flush().await?;
        }
        let mut rx = Receiver::new(self.cfg.rx, self.cfg.auth.clone(), sub, &acc, now_us())
            .ok_or_else(|| SessionEnd::Lost("bad answer".into()))?;
        rx.already_delivered(self.delivered.iter().copied());
        let mcast = join_group_or_unicast(group, self.cfg.iface);
        on(Report::Subscribed {
            transport: if rx.multicast() {
                "multicast"
            } else {
                "unicast"
            },
            group,
            from: first,
        });
        let (r, w) = stream.into_split();
        let (reader, msgs) = spawn_msg_reader(r);
        let inputs = Inputs {
            msgs,
            mcast,
            dgrams,
        };
        let result = self
            .receive(&mut rx, BufWriter::new(w), inputs, deadline, on)
            .await;
        reader.abort();
        self.delivered = rx.delivered_past_resume();
        save_position(&self.cfg.dir, rx.resume_seq());
        self.summary.stats = rx.stats;
        result
    }

    /// The receive loop: feeds `rx` what comes in (messages, datagrams, hashes, timeouts),
    /// sends what it answers and acts on its events, until the session ends or is done.
    async fn receive(
        &mut self,
        rx: &mut Receiver,
        mut w: BufWriter<WriteHalf>,
        mut inputs: Inputs,
        deadline: Option<Instant>,
        on: &mut impl FnMut(Report<'_>),
    ) -> Result<(), SessionEnd> {
        if let Some(rtt) = super::round_trip(w.get_ref()) {
            rx.set_rtt(rtt);
        }
        let (hash_tx, mut hashes) = mpsc::unbounded_channel();
        let mut buf = vec![0u8; 65536];
        let mut last_save = Instant::now();
        loop {
            let now = now_us();
            if now >= rx.poll_timeout() {
                rx.handle_timeout(now);
            }
            while let Some(m) = rx.poll_msg() {
                write_msg(&mut w, &m).await?;
            }
            w.flush().await?;
            if let Err(e) = self.events(rx, on, &hash_tx) {
                return Err(SessionEnd::Fatal(SubError::Local(e)));
            }
            if self.resume != Some(rx.resume_seq()) {
                on(Report::Settled {
                    below: rx.resume_seq(),
                });
            }
            self.resume = Some(rx.resume_seq());
            if last_save.elapsed() > Duration::from_millis(500) {
                save_position(&self.cfg.dir, rx.resume_seq());
                last_save = Instant::now();
                if let Some(rtt) = super::round_trip(w.get_ref()) {
                    rx.set_rtt(rtt);
                }
            }
            if self.done(deadline) {
                return Ok(());
            }
            let wait = rx
                .poll_timeout()
                .saturating_sub(now_us())
                .clamp(200, 100_000);
            tokio::select! {
                m = inputs.msgs.recv() => match m {
                    Some(Ok(Some(m))) => rx.handle_unicast(now_us(), m),
                    Some(Ok(None)) | None => return Err(SessionEnd::Lost("the source closed the connection".into())),
                    Some(Err(e)) => return Err(e.into()),
                },
                r = recv_opt(inputs.mcast.as_ref(), &mut buf) => {
                    take_datagrams(rx, &inputs, &mut buf, r);
                }
                Some((seq, ok)) = hashes.recv() => match ok {
                    Ok(ok) => rx.confirm(now_us(), seq, ok),
                    Err(e) => return Err(SessionEnd::Fatal(SubError::Local(e))),
                },
                _ = tokio::time::sleep(Duration::from_micros(wait)) => {}
            }
        }
    }

    /// Enough products, or past the deadline.
    fn done(&self, deadline: Option<Instant>) -> bool {
        self.cfg
            .max_products
            .is_some_and(|n| self.summary.delivered >= n)
            || deadline.is_some_and(|d| Instant::now() >= d)
    }

    fn events(
        &mut self,
        rx: &mut Receiver,
        on: &mut impl FnMut(Report<'_>),
        hashed: &Hashed,
    ) -> io::Result<()> {
        while let Some(ev) = rx.poll_event() {
            match ev {
                RxEvent::Begin(meta) => {
                    let tmp = self
                        .cfg
                        .dir
                        .join(format!(".{}.{}.part", meta.file_name(), meta.seq));
                    let f = File::create(&tmp)?;
                    self.files.insert(meta.seq, (tmp, f, meta));
                }
                RxEvent::Data { seq, offset, data } => {
                    if let Some((_, f, _)) = self.files.get(&seq) {
                        f.write_all_at(&data, offset)?;
                    }
                    let bytes = data.len() as u64;
                    on(Report::Received { seq, bytes });
                }
                RxEvent::Complete(seq) => {
                    let Some((p, _, m)) = self.files.get(&seq) else {
                        rx.confirm(now_us(), seq, false);
                        continue;
                    };
                    if m.size < HASH_INLINE {
                        rx.confirm(now_us(), seq, hash_file(p)? == m.hash);
                        continue;
                    }
                    // A large product is hashed off the receive loop, which goes on taking
                    // datagrams meanwhile (its socket buffer would overflow otherwise).
                    let (p, want, tx) = (p.clone(), m.hash, hashed.clone());
                    tokio::task::spawn_blocking(move || {
                        let _ = tx.send((seq, hash_file(&p).map(|h| h == want)));
                    });
                }
                RxEvent::Delivered {
                    meta,
                    latency,
                    repaired,
                    multicast,
                } => {
                    let Some((tmp, _, _)) = self.files.remove(&meta.seq) else {
                        continue;
                    };
                    let path = self.cfg.dir.join(meta.file_name());
                    fs::rename(&tmp, &path)?;
                    self.summary.delivered += 1;
                    on(Report::Delivered {
                        meta: &meta,
                        path: &path,
                        latency,
                        repaired,
                        multicast,
                    });
                }
                RxEvent::Discard(seq) => {
                    if let Some((p, _, _)) = self.files.remove(&seq) {
                        let _ = fs::remove_file(p);
                    }
                }
                RxEvent::Lost { from, to } => on(Report::Lost { from, to }),
                RxEvent::FellBack => on(Report::FellBack),
            }
        }
        Ok(())
    }

    fn discard_all(&mut self) {
        for (_, (p, _, _)) in self.files.drain() {
            let _ = fs::remove_file(p);
        }
    }
}

/// What a session's receive loop takes in besides timeouts and hashes.
struct Inputs {
    /// The connection's messages, read by [`spawn_msg_reader`].
    msgs: mpsc::Receiver<io::Result<Option<Msg>>>,
    /// The joined group, if any.
    mcast: Option<UdpSocket>,
    /// Opens the group's datagrams.
    dgrams: DgramReader,
}

/// Reads the connection's messages in a task of their own, so that the receive loop can wait
/// on them beside the group's datagrams; the task ends after the first end or error.
fn spawn_msg_reader(
    mut r: ReadHalf,
) -> (
    tokio::task::JoinHandle<()>,
    mpsc::Receiver<io::Result<Option<Msg>>>,
) {
    let (tx, msgs) = mpsc::channel(1024);
    let reader = tokio::spawn(async move {
        loop {
            let m = read_msg(&mut r).await;
            let end = !matches!(m, Ok(Some(_)));
            if tx.send(m).await.is_err() || end {
                break;
            }
        }
    });
    (reader, msgs)
}

/// Joins the group the source offers; `None` (unicast) when there is none or joining fails.
fn join_group_or_unicast(group: &str, iface: Option<Ipv4Addr>) -> Option<UdpSocket> {
    if group.is_empty() {
        return None;
    }
    match join_group(group, iface) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("cannot join multicast group {group}: {e}; falling back to unicast");
            None
        }
    }
}

/// A subscriber that did not choose `--plaintext` refuses a group in clear (the source chose
/// plaintext): the `Accepted` it goes on with has no group, and the group it refused.
fn refuse_clear_group(acc: Msg, sealed: bool) -> (Msg, Option<String>) {
    match acc {
        Msg::Accepted {
            feed_id,
            group,
            block,
            first,
            key: None,
            ..
        } if sealed && !group.is_empty() => (
            Msg::Accepted {
                feed_id,
                group: String::new(),
                block,
                mcast_from: u64::MAX,
                first,
                key: None,
            },
            Some(group),
        ),
        acc => (acc, None),
    }
}

fn hash_file(p: &Path) -> io::Result<[u8; 32]> {
    let mut h = blake3::Hasher::new();
    h.update_reader(BufReader::with_capacity(1 << 20, File::open(p)?))?;
    Ok(*h.finalize().as_bytes())
}

async fn recv_opt(s: Option<&UdpSocket>, buf: &mut [u8]) -> io::Result<usize> {
    match s {
        Some(s) => s.recv(buf).await,
        None => std::future::pending().await,
    }
}

/// Most datagrams taken from the group's socket per turn of the receive loop.
const DATAGRAMS_PER_TURN: usize = 64;

/// Takes the datagram `first` read and those already queued behind it (up to
/// [`DATAGRAMS_PER_TURN`]): one turn of the receive loop (timers, writes, a flush) per batch
/// rather than per datagram, which at 100 Mbit/s is 8,600 turns a second per subscriber.
fn take_datagrams(rx: &mut Receiver, inputs: &Inputs, buf: &mut [u8], first: io::Result<usize>) {
    let mut r = first;
    for taken in 1..=DATAGRAMS_PER_TURN {
        let Ok(n) = r else { return };
        // Another feed's, altered, or in clear on a sealed group: never used.
        if let Ok((number, m)) = inputs.dgrams.read_numbered(&mut buf[..n]) {
            rx.handle_multicast(now_us(), number, m);
        }
        r = match &inputs.mcast {
            Some(s) if taken < DATAGRAMS_PER_TURN => s.try_recv(buf),
            _ => return,
        };
    }
}

/// Joins the group (`ADDR:PORT`) on `iface` (default: the kernel's choice).
fn join_group(group: &str, iface: Option<Ipv4Addr>) -> io::Result<UdpSocket> {
    let g: SocketAddr = group
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("bad group {group:?}")))?;
    let std::net::IpAddr::V4(ip) = g.ip() else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "IPv6 multicast is not supported yet",
        ));
    };
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // Several subscribers on one host share the group's port.
    s.set_reuse_address(true)?;
    s.set_recv_buffer_size(8 << 20)?;
    s.bind(&g.into())?;
    s.join_multicast_v4(&ip, &iface.unwrap_or(Ipv4Addr::UNSPECIFIED))?;
    s.set_nonblocking(true)?;
    UdpSocket::from_std(s.into())
}

/// Inserts one file as a product; returns its sequence number.
///
/// The insert is [`insert_from`] with the file as its reader. Every error names `path` (the
/// file cannot be opened, it shrank while read, the source refused it or was unreachable), so
/// that a caller inserting many files can print it as it is.
pub async fn insert(
    server: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    path: &Path,
    name: &str,
    feedtype: &str,
) -> io::Result<u64> {
    let named = |kind, what: &dyn std::fmt::Display| {
        io::Error::new(kind, format!("{}: {what}", path.display()))
    };
    let opened = |e: io::Error| named(e.kind(), &e);
    let mut file = tokio::fs::File::open(path).await.map_err(opened)?;
    let size = file.metadata().await.map_err(opened)?.len();
    insert_from(server, keys, tuning, name, feedtype, size, &mut file)
        .await
        .map_err(|e| {
            let kind = match &e {
                InsertError::Io(io) => io.kind(),
                InsertError::Refused(_) | InsertError::Truncated { .. } => io::ErrorKind::Other,
            };
            named(kind, &e)
        })
}

/// The server's status as JSON.
pub async fn status(server: &str, keys: &Keys, tuning: &TcpTuning) -> io::Result<String> {
    let stream = connect_tcp(server, tuning)
        .await
        .map_err(io::Error::other)?;
    let mut stream = handshake_connect(Stream::Tcp(stream), keys)
        .await
        .map_err(io::Error::other)?;
    write_msg(&mut stream, &Msg::Status).await?;
    stream.flush().await?;
    match read_msg(&mut stream).await? {
        Some(Msg::StatusReply { json }) => Ok(json),
        Some(Msg::Refused { reason }) => Err(io::Error::other(reason)),
        other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
    }
}
