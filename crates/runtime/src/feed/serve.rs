//! `feed serve`: the source on the network.
//!
//! One task per connection. After the session handshake the first message says what the
//! peer is: a subscriber (`Subscribe`), an inserter (`Insert`, loopback only unless
//! allowed), or a status query. One more task paces the multicast group. The sans-IO
//! [`Server`] sits behind a mutex; a watch channel wakes the connections when products arrive
//! or subscribers ask for repairs.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::product::ProductAuth;
use bulkcast_proto::feed::queue::QueueLimits;
use bulkcast_proto::feed::relay::Relay;
use bulkcast_proto::feed::seal::DgramWriter;
use bulkcast_proto::feed::server::{Server, ServerConfig, SubId, UniOut};
use bulkcast_proto::mcast::seal::GroupKey;
use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::disk::QueueDir;
use super::relay::{RelayState, UpstreamConfig};
use super::{now_us, read_msg, write_msg};
use crate::transport::{handshake_accept, Stream};

/// `feed serve`'s settings.
pub struct ServeConfig {
    /// The queue's directory.
    pub dir: std::path::PathBuf,
    /// The core's settings (limits, allow rules, multicast). Its `group_key` is ignored:
    /// [`serve`] draws one at every start, unless `keys` chose plaintext.
    pub server: ServerConfig,
    /// The session keys (admission, encryption, `--plaintext`).
    pub keys: Keys,
    /// How products are authenticated.
    pub auth: Arc<dyn ProductAuth>,
    /// Accept inserts from other hosts than this one.
    pub remote_insert: bool,
    /// Interface address multicast leaves from (`None`: the kernel's choice).
    pub multicast_if: Option<std::net::Ipv4Addr>,
    /// Multicast TTL (1: this LAN only).
    pub multicast_ttl: u32,
    /// A metrics registry to add the queue's and subscribers' metrics to (read from the
    /// server at each scrape); the counters are in [`super::metrics::global`].
    pub registry: Option<Arc<Mutex<prometheus_client::registry::Registry>>>,
    /// Relay: products come from this upstream server instead of local inserts
    /// ([`super::relay`]).
    pub upstream: Option<UpstreamConfig>,
    /// Relay children this server takes at most: joining relays look elsewhere past it
    /// ([`bulkcast_proto::feed::tree`]).
    pub max_relay_children: u32,
}

pub(super) struct Ctx {
    server: Mutex<Server>,
    pub(super) dir: QueueDir,
    /// A relay's upstream side.
    pub(super) relay: Option<Arc<RelayState>>,
    keys: Keys,
    wake: watch::Sender<u64>,
    /// The multicast pacing thread, woken with the connections ([`super::pace`]).
    pacer: OnceLock<std::thread::Thread>,
    remote_insert: bool,
    /// The group's datagrams are sealed: `Accepted` carries the key.
    has_key: bool,
    /// Subscribers that said they are relays ([`Msg::Relay`]): their addresses.
    children: Mutex<BTreeMap<SubId, String>>,
    max_children: u32,
    /// What this server carries, feedtypes and names: a relay's upstream filter, everything
    /// at the source. Told to joining relays.
    carries: (String, String),
}

impl Ctx {
    pub(super) fn lock(&self) -> MutexGuard<'_, Server> {
        // A panic while holding the lock is a bug; the state is still consistent enough to
        // keep serving (every update is a single call).
        self.server.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn children(&self) -> MutexGuard<'_, BTreeMap<SubId, String>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This server's place in the relay tree, for a joining relay at `host`.
    fn peers(&self, host: std::net::IpAddr) -> Msg {
        // One lock, taken and let go before the struct (a guard in a field's expression
        // would live to its end, and a second `lock` there would deadlock).
        let (admits, floor) = {
            let server = self.lock();
            (server.admits(host), server.queue().floor())
        };
        Msg::PeersReply {
            admits,
            max_children: self.max_children,
            ancestry: self
                .relay
                .as_deref()
                .map(|r| super::relay::lock(r).ancestry().to_vec())
                .unwrap_or_default(),
            children: self.children().values().cloned().collect(),
            feedtype: self.carries.0.clone(),
            name: self.carries.1.clone(),
            floor,
        }
    }

    pub(super) fn poke(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
        if let Some(t) = self.pacer.get() {
            t.unpark();
        }
    }
}

/// Opens the queue, binds `listen`, and serves until the process ends. `ready` gets the bound
/// address once listening.
pub async fn serve(
    cfg: ServeConfig,
    listen: &str,
    ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let dir = QueueDir::open(&cfg.dir)?;
    let queue = dir.restore(cfg.server.limits)?;
    let relay = cfg.upstream.as_ref().map(|u| {
        Arc::new(Mutex::new(Relay::new(
            &u.source,
            &u.feedtype,
            queue.next_seq(),
        )))
    });
    let push = cfg.server.push.clone();
    let mut server_cfg = cfg.server;
    // A key for this run alone: the datagram numbers (the nonces) start at 0 again at every
    // start, so a key must never outlive the process (bulkcast_proto::feed::seal).
    server_cfg.group_key = match cfg.keys.plaintext() {
        true => None,
        false => Some(
            GroupKey::generate(&ring::rand::SystemRandom::new())
                .map_err(|_| io::Error::other("no random bytes for the group key"))?,
        ),
    };
    let writer = DgramWriter::new(
        server_cfg.feed_id,
        server_cfg.group_key.as_ref().map(GroupKey::cipher),
    );
    let has_key = server_cfg.group_key.is_some();
    let mut server = Server::new(server_cfg, cfg.auth.clone(), queue);
    for s in server.expire(now_us()) {
        dir.remove(s);
    }
    let listener = TcpListener::bind(listen).await?;
    ready(listener.local_addr()?);
    let (wake, _) = watch::channel(0);
    let ctx = Arc::new(Ctx {
        server: Mutex::new(server),
        dir,
        relay,
        keys: cfg.keys.clone(),
        wake,
        pacer: OnceLock::new(),
        remote_insert: cfg.remote_insert,
        has_key,
        children: Mutex::new(BTreeMap::new()),
        max_children: cfg.max_relay_children,
        carries: cfg
            .upstream
            .as_ref()
            .map_or(("ANY".into(), String::new()), |u| {
                (u.feedtype.clone(), u.name.clone())
            }),
    });
    if let Some(reg) = &cfg.registry {
        let c = Arc::downgrade(&ctx);
        let status = move || Some(c.upgrade()?.lock().status());
        reg.lock()
            .unwrap_or_else(|p| p.into_inner())
            .register_collector(Box::new(super::metrics::QueueCollector(Box::new(status))));
    }
    if let Some(p) = push {
        let group: SocketAddrV4 = p.group.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "multicast group {:?} is not an IPv4 ADDR:PORT (IPv6 multicast is not supported yet)",
                    p.group
                ),
            )
        })?;
        let sock = crate::mcast::sender_socket(cfg.multicast_if, cfg.multicast_ttl)?;
        let pacer = super::pace::start(&ctx, sock, group, writer)?;
        let _ = ctx.pacer.set(pacer);
    }
    if let Some(mut up) = cfg.upstream {
        up.listen = Some(listener.local_addr()?);
        tokio::spawn(super::relay::run(ctx.clone(), up, cfg.keys, cfg.auth));
    }
    let c = ctx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let gone = c.lock().expire(now_us());
            super::metrics::global().removed("age", gone.len());
            if !gone.is_empty() {
                super::relay::save_floor(&c);
            }
            for s in gone {
                c.dir.remove(s);
            }
        }
    });
    loop {
        let (stream, peer) = listener.accept().await?;
        let c = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(c, stream, peer).await {
                tracing::info!("feed connection from {peer}: {e}");
            }
        });
    }
}

/// Reads `len` bytes at `offset` of a product, keeping the last file open (a product evicted
/// while being sent stays readable through the open handle).
pub(super) fn read_block(
    dir: &QueueDir,
    cache: &mut Option<(u64, File)>,
    seq: u64,
    offset: u64,
    len: u32,
) -> io::Result<Bytes> {
    if cache.as_ref().is_none_or(|c| c.0 != seq) {
        *cache = Some((seq, File::open(dir.data(seq))?));
    }
    let f = &cache.as_ref().expect("just set").1;
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, offset)?;
    Ok(Bytes::from(buf))
}

async fn connection(ctx: Arc<Ctx>, stream: TcpStream, peer: SocketAddr) -> io::Result<()> {
    stream.set_nodelay(true)?;
    // Encrypted unless both ends chose --plaintext, as every other connection.
    let mut stream = handshake_accept(Stream::Tcp(stream), &ctx.keys)
        .await
        .map_err(io::Error::other)?;
    let first = tokio::time::timeout(Duration::from_secs(10), read_msg(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no request after the handshake"))??;
    match first {
        Some(Msg::Subscribe {
            feedtype,
            name,
            start,
            multicast,
        }) => {
            let r = ctx
                .lock()
                .subscribe(peer.ip(), &feedtype, &name, start, multicast);
            // Never the group key in clear: a server with a key did not choose plaintext, so
            // the handshake encrypted the connection; this holds.
            let r = r.and_then(|id| match ctx.has_key && !stream.is_sealed() {
                true => {
                    ctx.lock().unsubscribe(id);
                    Err("refusing to send the group key on an unencrypted connection".into())
                }
                false => Ok(id),
            });
            match r {
                Ok(id) => {
                    tracing::info!("subscriber {id} from {peer}: {feedtype} {name:?} {start:?}");
                    let r = subscriber(&ctx, stream, id, peer.ip()).await;
                    ctx.lock().unsubscribe(id);
                    if let Some(child) = ctx.children().remove(&id) {
                        tracing::info!("relay child {child} (subscriber {id}) left");
                    }
                    r
                }
                Err(reason) => {
                    tracing::warn!("refused subscriber {peer}: {reason}");
                    refuse(stream, reason).await
                }
            }
        }
        Some(Msg::Insert {
            name,
            feedtype,
            size,
        }) => insert(&ctx, stream, peer, name, feedtype, size).await,
        Some(Msg::Peers) => {
            write_msg(&mut stream, &ctx.peers(peer.ip())).await?;
            stream.flush().await
        }
        Some(Msg::Status) => {
            let mut status = ctx.lock().status();
            status.upstream = ctx.relay.as_deref().map(|r| super::relay::lock(r).status());
            status.relay_children = ctx.children().values().cloned().collect();
            status.max_relay_children = ctx.max_children;
            let json = serde_json::to_string(&status).unwrap_or_default();
            write_msg(&mut stream, &Msg::StatusReply { json }).await?;
            stream.flush().await
        }
        other => refuse(stream, format!("unexpected first message {other:?}")).await,
    }
}

async fn refuse(mut stream: Stream, reason: String) -> io::Result<()> {
    write_msg(&mut stream, &Msg::Refused { reason }).await?;
    stream.flush().await?;
    stream.shutdown().await
}

async fn subscriber(
    ctx: &Arc<Ctx>,
    stream: Stream,
    id: SubId,
    peer: std::net::IpAddr,
) -> io::Result<()> {
    let (mut r, w) = stream.into_split();
    let mut w = BufWriter::with_capacity(256 << 10, w);
    let mut wake = ctx.wake.subscribe();
    let c = ctx.clone();
    let mut reader = tokio::spawn(async move {
        while let Some(m) = read_msg(&mut r).await? {
            if let Msg::Relay { listen } = m {
                relay_child(&c, id, peer, &listen);
                continue;
            }
            c.lock().handle_msg(id, m, now_us());
            c.poke();
        }
        io::Result::Ok(())
    });
    let mut cache = None;
    loop {
        let out = ctx.lock().poll_unicast(id, now_us());
        let msg = match out {
            Some(UniOut::Msg(m)) => m,
            Some(UniOut::Block { seq, offset, len }) => {
                match read_block(&ctx.dir, &mut cache, seq, offset, len) {
                    Ok(data) => Msg::Data { seq, offset, data },
                    Err(_) => {
                        ctx.lock().abort_product(id, seq);
                        continue;
                    }
                }
            }
            None => {
                w.flush().await?;
                tokio::select! {
                    _ = wake.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    r = &mut reader => return r.map_err(io::Error::other)?,
                }
                continue;
            }
        };
        write_msg(&mut w, &msg).await?;
        count_sent(&msg, "unicast");
    }
}

/// Most relay children listed: past it a server lists no more (a joining relay finds
/// enough candidates, and a peer cannot grow the list without bound).
const MAX_LISTED_CHILDREN: usize = 1024;

/// Subscriber `id`, connected from `peer`, said it is a relay reachable at `listen`. Only the
/// port is taken from it: the relay is listed at the address it connected from, so a peer
/// cannot point joining relays at another host (or at their own loopback, or `0.0.0.0`). A
/// host no `--allow-relay` pattern covers is not listed (it stays a subscriber).
fn relay_child(ctx: &Ctx, id: SubId, peer: std::net::IpAddr, listen: &str) {
    if !ctx.lock().may_relay(id) {
        tracing::warn!(
            "subscriber {id} from {peer} announced itself as a relay ({listen:?}): no \
             --allow-relay pattern covers {peer}; not listed, served as a subscriber"
        );
        return;
    }
    let Some(port) = listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .filter(|p| *p != 0)
    else {
        tracing::warn!("relay child (subscriber {id}) announced {listen:?}: no port, not listed");
        return;
    };
    let listen = SocketAddr::new(peer, port).to_string();
    let mut children = ctx.children();
    // The same relay again, its old connection not yet timed out: listed once.
    children.retain(|k, v| *k == id || *v != listen);
    if children.len() >= MAX_LISTED_CHILDREN && !children.contains_key(&id) {
        return;
    }
    let n = children.len() + usize::from(!children.contains_key(&id));
    if n > ctx.max_children as usize {
        // A relay given this server with --upstream-fixed, or two that joined at once.
        tracing::warn!(
            "relay child {listen} (subscriber {id}) is past --max-relay-children {}",
            ctx.max_children
        );
    }
    tracing::info!("relay child {listen} (subscriber {id}) joined: {n} relay children");
    children.insert(id, listen);
}

/// Counts a product's start or bytes sent in [`super::metrics::global`].
pub(super) fn count_sent(msg: &Msg, transport: &str) {
    match msg {
        Msg::Product { .. } => super::metrics::global().product_sent(transport),
        Msg::Data { data, .. } => super::metrics::global().sent(transport, data.len()),
        Msg::Parity { data, .. } => super::metrics::global().sent("parity", data.len()),
        _ => {}
    }
}

async fn insert(
    ctx: &Arc<Ctx>,
    mut stream: Stream,
    peer: SocketAddr,
    name: String,
    feedtype: String,
    size: u64,
) -> io::Result<()> {
    if let Some(r) = &ctx.relay {
        // Its sequence numbers are its source's: a local product would take one of them.
        let up = super::relay::lock(r).status().source;
        return refuse(
            stream,
            format!("this server relays {up}: insert products at the source"),
        )
        .await;
    }
    if !ctx.remote_insert && !peer.ip().is_loopback() {
        return refuse(
            stream,
            format!(
                "inserts come from this host only ({peer} is not loopback; see --remote-insert)"
            ),
        )
        .await;
    }
    let checked = ctx.lock().check_size(&name, size);
    if let Err(e) = checked {
        return refuse(stream, e.to_string()).await;
    }
    if let Err(e) = bulkcast_proto::feed::product::FeedPattern::parse(&feedtype) {
        return refuse(stream, e.to_string()).await;
    }
    write_msg(&mut stream, &Msg::Ack { seq: 0 }).await?;
    stream.flush().await?;
    let tmp = ctx.dir.tmp();
    let result = receive_insert(ctx, &mut stream, &tmp, &name, &feedtype, size).await;
    let reply = match result {
        Ok(seq) => Msg::Inserted { seq },
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Msg::Refused {
                reason: e.to_string(),
            }
        }
    };
    write_msg(&mut stream, &reply).await?;
    stream.flush().await
}

async fn receive_insert(
    ctx: &Arc<Ctx>,
    stream: &mut Stream,
    tmp: &std::path::Path,
    name: &str,
    feedtype: &str,
    size: u64,
) -> io::Result<u64> {
    let file = File::create(tmp)?;
    let mut hasher = blake3::Hasher::new();
    let mut got = 0u64;
    while got < size {
        let m = tokio::time::timeout(Duration::from_secs(30), read_msg(stream))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "insert stalled"))??;
        let Some(Msg::Data { offset, data, .. }) = m else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "insert cut short",
            ));
        };
        if offset != got || got + data.len() as u64 > size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "insert data out of order or too long",
            ));
        }
        file.write_all_at(&data, offset)?;
        hasher.update(&data);
        got += data.len() as u64;
    }
    let now = now_us();
    let mut s = ctx.lock();
    let (meta, evicted) = s
        .insert(name, feedtype, size, *hasher.finalize().as_bytes(), now)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    ctx.dir.commit(tmp, &meta, now, s.queue().next_seq())?;
    drop(s);
    let m = super::metrics::global();
    m.inserted.inc();
    m.inserted_bytes.inc_by(meta.size);
    m.removed("size", evicted.len());
    for seq in evicted {
        ctx.dir.remove(seq);
    }
    ctx.poke();
    tracing::debug!(
        "queued {} as {} ({} bytes, {})",
        meta.name,
        meta.seq,
        meta.size,
        meta.feedtype
    );
    Ok(meta.seq)
}

/// Default queue bounds: 1 GiB, one hour.
pub fn default_limits() -> QueueLimits {
    QueueLimits {
        max_bytes: 1 << 30,
        max_age: 3_600_000_000,
    }
}
