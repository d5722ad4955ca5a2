//! Swarming on the network: the event loop around one [`SwarmNode`] (MOB, the BitTorrent-style
//! baseline, the tree+pull hybrid), for the source ([`send`]) and for an agent ([`serve`]).
//!
//! # Set-up and connections
//! The source dials every agent, passes the handshake and sends a
//! [`SwarmSetup::Open`]: session, chunk size, strategy, seed, manifest and every member (node
//! id, name, address, cluster label from the hosts file's `site`, tree parent for the
//! strategies that push). That connection stays open: it carries the member's progress
//! (`Ack`), its final [`SwarmSetup::Report`] (or `Failed`), and, when the source and the
//! member are swarm peers, the swarm traffic between them.
//!
//! Every member builds the same [`SwarmNode`]s for every member (same seed), so each knows
//! every member's [`SwarmNode::connect_to`]: two members are peers when either names the
//! other. Between two agents the lower node id dials, passes the handshake and sends
//! [`SwarmSetup::Peer`] (session, its node id); the agent's accept loop hands the connection
//! to the running session through [`SwarmSessions`] (waiting a little when the peer was
//! faster than the source's `Open`). The source never listens: its links are the set-up
//! connections.
//!
//! # The loop
//! One reader and one writer task per connection, as in [`crate::driver`]. Readers verify
//! chunks themselves (off the event loop) and pass them on as verified; the loop writes each
//! piece to the [`Store`] (temporary name, moved into place once every piece is stored),
//! feeds the node, and hands each writer the node's control frames ([`SwarmNode::poll_control`])
//! and at most [`WRITE_SLOTS`] pieces ([`SwarmNode::poll_transmit`]).
//! A piece is served from memory until it is stored, then from the file (mapped, handed to
//! `sendfile`: see [`crate::mapped`]); the source serves a one-file object from its input
//! file the same way. Pieces not yet stored are bounded ([`UNSTORED_BUDGET`]): past it the
//! loop stops reading from peers until the disk catches up. Once the copy is in place the agent
//! reports the bytes it received from each peer; it ends when the completion tree says every
//! member is done, or when the source closes the session. The source ends when every agent
//! reported (or failed) and the completion tree is done.
//!
//! # Limitations
//! - A directory's pieces are held in memory on every member (they straddle its files):
//!   directories above [`MAX_SWARM_BYTES`] are refused with an error (send a tar of it, or use
//!   a tree); streams of unknown length cannot be swarmed. The source reads (hashes) the
//!   whole object before the session starts.
//! - A member is removed from the session ([`SwarmSetup::Lost`] from the source, then
//!   [`SwarmNode::handle_member_lost`] everywhere) only when the source learns it failed: it
//!   could not be reached, it reported a failure, or its set-up connection dropped. A member
//!   that stops moving while its connection stays up holds up its peers until the source's
//!   stall timeout ends the session; a connection between two agents that drops is only a
//!   lost peer (its requests move elsewhere), never retried.
//! - One connection per pair of members; no striping, no extra paths.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::transport::Stream;
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::{HostSpec, SourceSpec};
use bulkcast_proto::manifest::{Manifest, ObjectKind};
use bulkcast_proto::node::CHUNK_SIZE_RANGE;
use bulkcast_proto::swarm::{Strategy, SwarmConfig, SwarmEvent, SwarmNode, Transmit};
use bulkcast_proto::tree::{NodeId, Tree};
use bulkcast_proto::wire::{
    self, Chunk, Frame, SessionId, SourceSig, SwarmMember, SwarmOpen, SwarmSetup, NO_PARENT,
};
use tokio::io::{AsyncRead, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::input::{Input, InputEvent};
use crate::report::{ClusterReport, PeerBytes, Report, Status};
use crate::store::{Disk, Store, StoreEvent, Target};
use crate::transport::{self, TcpTuning};

/// Largest directory a swarm session takes: every member holds its pieces in memory (a file
/// has no limit: its pieces are served from disk).
pub const MAX_SWARM_BYTES: u64 = bulkcast_planner::strategy::MAX_SWARM_BYTES;

/// Pieces queued to one connection's writer at once (control frames are not counted). One:
/// a piece handed to the writer is committed, while a request that waits in the member's own
/// queue can still be cancelled and served by a faster peer (MOB's moves, the hybrid's
/// steals). In the lab (seed 004, fast and slow links, both layouts and round trips, 32 MiB)
/// one slot against two: MOB 0.04 of the bound ahead on average, the hybrid 0.02.
pub const WRITE_SLOTS: usize = 1;

/// Unsent bytes a connection's socket may hold (`TCP_NOTSENT_LOWAT`). Requests, haves and
/// cancels share the connection with the pieces going the same way; the kernel's default
/// backlog (megabytes) would hold them back for seconds on a slow WAN link.
const SOCKET_BACKLOG: u32 = 128 << 10;

/// Bytes of verified pieces an agent holds in memory before they are stored; above it, it reads
/// nothing more from its peers until the store catches up.
pub const UNSTORED_BUDGET: u64 = 32 << 20;

/// Events queued from the connection tasks to the loop (each may be a piece).
const EVENT_SLOTS: usize = 32;

/// How long an agent holds a peer's connection that arrived before the source's `Open`.
const EARLY_PEER_WAIT: Duration = Duration::from_secs(10);

/// How often an agent logs its view of each peer, at debug level
/// (`BULKCAST_LOG=info,bulkcast_node::swarm=debug`).
const PEER_LOG_EVERY: Duration = Duration::from_secs(1);

/// How often an agent tells the source how many pieces it holds.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The swarm sessions running at an agent, so that connections from other members reach
/// theirs.
#[derive(Clone, Default)]
pub struct SwarmSessions(Arc<Mutex<HashMap<SessionId, PeerSender>>>);

/// Where a session takes the connections of its peers.
type PeerSender = mpsc::UnboundedSender<(NodeId, Stream)>;

/// What became of a receiver: the bytes it got per peer, or why it failed.
type Outcome = Option<Result<Vec<(u32, u64)>, String>>;

impl std::fmt::Debug for SwarmSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwarmSessions")
    }
}

impl SwarmSessions {
    /// Hands a member's connection (its `Peer` frame already read) to session `session`,
    /// waiting up to 10 s for that session to start here.
    pub async fn deliver(
        &self,
        session: SessionId,
        node: u32,
        stream: Stream,
    ) -> Result<(), String> {
        let until = Instant::now() + EARLY_PEER_WAIT;
        let mut stream = Some(stream);
        loop {
            {
                let map = self.0.lock().expect("swarm sessions lock");
                if let Some(tx) = map.get(&session) {
                    let s = stream.take().expect("delivered once");
                    return tx
                        .send((node as NodeId, s))
                        .map_err(|_| format!("swarm session {session:016x} has ended"));
                }
            }
            if Instant::now() >= until {
                return Err(format!("no swarm session {session:016x} here"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn register(
        &self,
        session: SessionId,
    ) -> (Registered, mpsc::UnboundedReceiver<(NodeId, Stream)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0
            .lock()
            .expect("swarm sessions lock")
            .insert(session, tx);
        (
            Registered {
                sessions: self.clone(),
                session,
            },
            rx,
        )
    }
}

/// Removes a session from [`SwarmSessions`] when it ends.
struct Registered {
    sessions: SwarmSessions,
    session: SessionId,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.sessions
            .0
            .lock()
            .expect("swarm sessions lock")
            .remove(&self.session);
    }
}

/// Settings of a swarm send.
#[derive(Debug, Clone)]
pub struct SwarmSendConfig {
    /// The strategy every member runs.
    pub strategy: Strategy,
    /// Chunk (piece) size in bytes.
    pub chunk_size: u32,
    /// A member that makes no progress for this long is given up.
    pub stall_timeout: Duration,
    /// TCP options.
    pub tuning: TcpTuning,
    /// Seed for peer and piece choice.
    pub seed: u64,
}

/// The cluster labels of the source and the hosts: one per distinct `site` (the source's
/// first); hosts without a site share one, a source without one is alone in its own.
pub fn cluster_labels(source: Option<&SourceSpec>, hosts: &[HostSpec]) -> (Vec<u32>, Vec<String>) {
    let mut names: Vec<String> = Vec::new();
    let mut label = |site: String| -> u32 {
        match names.iter().position(|n| *n == site) {
            Some(i) => i as u32,
            None => {
                names.push(site);
                (names.len() - 1) as u32
            }
        }
    };
    let mut labels = vec![label(
        source
            .and_then(|s| s.site.clone())
            .unwrap_or_else(|| "(source)".into()),
    )];
    for h in hosts {
        labels.push(label(h.site.clone().unwrap_or_else(|| "(no site)".into())));
    }
    (labels, names)
}

/// Sends `input` to `hosts` (node `i` is `hosts[i - 1]`) by `cfg.strategy`; `tree` (over the
/// source and the hosts) is needed by the strategies that push. Returns the report once every
/// receiver finished or failed.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    input: Input,
    source: Option<&SourceSpec>,
    hosts: &[HostSpec],
    tree: Option<&Tree>,
    keys: Keys,
    session: SessionId,
    cfg: &SwarmSendConfig,
    status: Arc<Mutex<Status>>,
) -> Result<Report, String> {
    let manifest = input.manifest.clone();
    // A one-file object is served from the file (page cache) once sealed; a tree is held.
    let disk = match input.single_file() {
        Some(p) => Some(Disk::Cached(Arc::new(
            std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?,
        ))),
        None => None,
    };
    let len = check_size(&manifest, disk.is_some())?;
    let (labels, sites) = cluster_labels(source, hosts);
    let n = hosts.len() + 1;
    if let Some(t) = tree {
        if t.len() != n {
            return Err(format!("the tree has {} nodes, the session {n}", t.len()));
        }
    }
    let source_name = source.map_or("source".to_string(), |s| s.name.clone());
    let members: Vec<SwarmMember> = (0..n)
        .map(|i| SwarmMember {
            node: i as u32,
            parent: tree
                .and_then(|t| t.parent(i))
                .map_or(NO_PARENT, |p| p as u32),
            cluster: labels[i],
            name: if i == 0 {
                source_name.clone()
            } else {
                hosts[i - 1].name.clone()
            },
            addr: if i == 0 {
                String::new()
            } else {
                hosts[i - 1].addr.clone()
            },
        })
        .collect();
    let open = SwarmOpen {
        session,
        node: 0,
        chunk_size: cfg.chunk_size,
        stall_timeout_ms: cfg.stall_timeout.as_millis().min(u32::MAX as u128) as u32,
        strategy: cfg.strategy,
        seed: cfg.seed,
        manifest: manifest.clone(),
        members,
        sig: keys.sign_open(session, cfg.chunk_size, &manifest, None),
    };
    // Every piece sealed once, then held (a one-file object: only its hash and tag).
    let pieces = manifest.chunks(cfg.chunk_size).unwrap_or(0);
    let mut rx = input.spawn(cfg.chunk_size as usize, keys.clone(), session);
    let mut held: Vec<Option<Held>> = Vec::with_capacity(pieces as usize);
    loop {
        match rx.recv().await {
            Some(InputEvent::Data(c, _)) => held.push(Some(match disk {
                Some(_) => Held::on_disk(&c),
                None => Held::Mem(c),
            })),
            Some(InputEvent::End) => break,
            Some(InputEvent::Failed(e)) => return Err(format!("reading the input: {e}")),
            None => return Err("the input reader stopped".into()),
        }
    }
    if held.len() as u64 != pieces {
        return Err(format!(
            "the input changed while it was read ({} chunks, {pieces} expected for {len} bytes)",
            held.len()
        ));
    }
    {
        let mut st = status.lock().expect("status lock");
        st.started = Instant::now();
        st.total_len = Some(len);
        st.read = len;
    }
    let mut net = Net::new(&open, 0, keys.clone(), cfg.tuning.clone(), held)?;
    net.disk = disk;
    // Set-up connections, all at once.
    let mut dials = Vec::new();
    for j in 1..n {
        let mut o = open.clone();
        o.node = j as u32;
        let addr = hosts[j - 1].addr.clone();
        let (keys, tuning) = (keys.clone(), cfg.tuning.clone());
        dials.push(tokio::spawn(async move {
            let r = async {
                let s = transport::connect(&addr, &tuning).await?;
                let mut s = transport::handshake_connect(s, &keys).await?;
                transport::write_frame(&mut s, &Frame::SwarmSetup(SwarmSetup::Open(Box::new(o))))
                    .await?;
                Ok::<_, transport::ConnError>(s)
            }
            .await;
            (j, r.map_err(|e| format!("{addr}: {e}")))
        }));
    }
    let mut reports: Vec<Outcome> = vec![None; n];
    for d in dials {
        let (j, r) = d.await.map_err(|e| e.to_string())?;
        match r {
            Ok(s) => net.add_conn(j, s),
            Err(e) => {
                status.lock().expect("status lock").receivers[j - 1].failed = Some(e.clone());
                reports[j] = Some(Err(e));
            }
        }
    }
    let unreachable: Vec<NodeId> = (1..n).filter(|&j| reports[j].is_some()).collect();
    for j in unreachable {
        net.member_lost(j, Instant::now());
    }
    let stall = cfg.stall_timeout;
    let mut last_progress = Instant::now();
    let mut timer = tokio::time::interval(Duration::from_millis(100));
    loop {
        let pending = (1..n).any(|j| reports[j].is_none());
        let failed = (1..n).any(|j| matches!(reports[j], Some(Err(_))));
        if !pending && (net.node.is_all_done() || failed) {
            break;
        }
        if last_progress.elapsed() > stall {
            for (j, r) in reports.iter_mut().enumerate().skip(1) {
                if r.is_none() {
                    let e = format!("no progress for {} s", stall.as_secs());
                    status.lock().expect("status lock").receivers[j - 1].failed = Some(e.clone());
                    *r = Some(Err(e));
                }
            }
            break;
        }
        let deadline = net.node.poll_timeout();
        tokio::select! {
            Some(ev) = net.ev_rx.recv() => {
                let batch = with_queued(ev, &mut net.ev_rx);
                for ev in batch {
                    let now = Instant::now();
                    match ev {
                        Ev::Frame(j, Frame::Ack { node, upto }) if node as usize == j => {
                            last_progress = now;
                            let mut st = status.lock().expect("status lock");
                            let r = &mut st.receivers[j - 1];
                            r.chunks = r.chunks.max(upto);
                        }
                        Ev::Frame(j, Frame::SwarmSetup(SwarmSetup::Report { node, received }))
                            if node as usize == j =>
                        {
                            last_progress = now;
                            let mut st = status.lock().expect("status lock");
                            let t = st.started.elapsed();
                            let r = &mut st.receivers[j - 1];
                            r.chunks = pieces;
                            r.done.get_or_insert(t);
                            reports[j].get_or_insert(Ok(received));
                        }
                        Ev::Frame(j, Frame::Failed { node, reason }) if node as usize == j => {
                            last_progress = now;
                            status.lock().expect("status lock").receivers[j - 1].failed =
                                Some(reason.clone());
                            if reports[j].is_none() {
                                reports[j] = Some(Err(reason));
                                net.member_lost(j, now);
                            }
                        }
                        Ev::Closed(j, reason) if reports[j].is_none() => {
                            net.handle(Ev::Closed(j, reason.clone()), now);
                            let e = format!("connection lost: {reason}");
                            status.lock().expect("status lock").receivers[j - 1].failed =
                                Some(e.clone());
                            reports[j] = Some(Err(e));
                            net.member_lost(j, now);
                        }
                        ev => net.handle(ev, now),
                    }
                }
            }
            _ = sleep_until_opt(deadline) => net.node.handle_timeout(Instant::now()),
            _ = timer.tick() => {}
        }
        net.after_input(Instant::now());
        if let Some(e) = net.fatal.take() {
            return Err(e);
        }
    }
    net.close().await;
    let st = status.lock().expect("status lock");
    let mut report = Report::build(
        &st,
        session,
        &manifest.name,
        kind_name(manifest.kind),
        cfg.strategy.name(),
    );
    // Tree edges say little here (pieces come from any peer): per-peer bytes replace them.
    report.edges.clear();
    if tree.is_none() {
        for r in &mut report.receivers {
            r.parent = "-".into();
        }
    }
    // Bytes received per peer, and WAN bytes into each cluster.
    let name_of = |i: usize| open.members[i].name.clone();
    let mut wan = vec![0u64; sites.len()];
    for (j, r) in reports.iter().enumerate().skip(1) {
        let rr = &mut report.receivers[j - 1];
        rr.site = Some(sites[labels[j] as usize].clone());
        if let Some(Ok(received)) = r {
            for &(peer, bytes) in received {
                let p = peer as usize;
                if p < n && labels[p] != labels[j] {
                    wan[labels[j] as usize] += bytes;
                }
                rr.received_from.push(PeerBytes {
                    peer: if p < n {
                        name_of(p)
                    } else {
                        format!("node {p}")
                    },
                    bytes,
                });
            }
        }
    }
    report.clusters = sites
        .iter()
        .enumerate()
        .map(|(c, site)| ClusterReport {
            site: site.clone(),
            receivers: (1..n).filter(|&j| labels[j] as usize == c).count(),
            has_source: labels[0] as usize == c,
            wan_bytes_in: wan[c],
            copies: if len > 0 {
                wan[c] as f64 / len as f64
            } else {
                0.0
            },
        })
        .collect();
    Ok(report)
}

/// The peer at the other end of `s`, for messages that name a culprit.
fn peer_name(s: &Stream) -> String {
    s.tcp()
        .and_then(|t| t.peer_addr().ok())
        .map_or_else(|| "the source's connection".to_string(), |a| a.to_string())
}

/// The object's length, when a swarm can take it: of known length, and within
/// [`MAX_SWARM_BYTES`] unless it is one file (`from_disk`: pieces served from the file, not
/// held in memory).
fn check_size(manifest: &Manifest, from_disk: bool) -> Result<u64, String> {
    let Some(len) = manifest.total_len else {
        return Err(
            "the swarm strategies need an input of known length (not a stream): use tree or flat"
                .into(),
        );
    };
    if len > MAX_SWARM_BYTES && !from_disk {
        return Err(format!(
            "the swarm strategies hold a directory in memory on every member and take at most \
             {} MiB of it; this one is {} MiB: send it as one file (e.g. a tar), or use tree or \
             balanced",
            MAX_SWARM_BYTES >> 20,
            len >> 20
        ));
    }
    Ok(len)
}

fn kind_name(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::File => "file",
        ObjectKind::Dir => "dir",
        ObjectKind::Stream => "stream",
    }
}

/// An agent's side of a swarm session: `stream` is the source's connection, its `Open`
/// already read. Stores the object into the agent's directory; returns once the copy is in
/// place and the session over, or with why it failed.
pub async fn serve(
    stream: Stream,
    open: SwarmOpen,
    cfg: &crate::agent::AgentConfig,
) -> Result<(), String> {
    let me = open.node as NodeId;
    if me == 0 || me >= open.members.len() {
        return Err(format!("set-up names this agent node {me}"));
    }
    // Everything the store relies on is checked before a file is created.
    open.manifest
        .validate()
        .map_err(|e| format!("bad manifest: {e}"))?;
    if !CHUNK_SIZE_RANGE.contains(&open.chunk_size) {
        return Err(format!(
            "chunk size {} outside {CHUNK_SIZE_RANGE:?}",
            open.chunk_size
        ));
    }
    // Agents store into a directory: a one-file object has a file to serve pieces from.
    check_size(&open.manifest, open.manifest.kind == ObjectKind::File)?;
    // With host keys: a set-up its source signed, and then only pieces that source signed,
    // whichever peer serves them (from memory or from its disk).
    let keys = cfg.keys.clone().requiring_source();
    let keys = match keys.verify_setup(
        open.session,
        open.chunk_size,
        &open.manifest,
        None,
        open.sig.as_deref(),
    ) {
        Ok(Some(source)) => keys.for_source(source),
        Ok(None) => keys,
        Err(e) => return Err(format!("{e} (sent by {})", peer_name(&stream))),
    };
    let (_registered, mut peers_rx) = cfg.swarms.register(open.session);
    let pieces = open.manifest.chunks(open.chunk_size).unwrap_or(0);
    let (store_tx, mut store_rx) = mpsc::unbounded_channel();
    let store = Store::open(
        Target::Dir(cfg.dir.clone()),
        &open.manifest,
        open.session,
        cfg.io,
        store_tx,
        cfg.stored.clone(),
    )
    .map_err(|e| format!("cannot store the object: {e}"))?;
    let mut net = Net::new(
        &open,
        me,
        keys,
        cfg.tuning.clone(),
        vec![None; pieces as usize],
    )?;
    net.disk = store.reader();
    if net.disk.is_some() {
        crate::input::install_sigbus_message();
    }
    net.store = Some(store);
    net.add_conn(0, stream);
    // Dial the peers with a higher id (the lower id of each pair dials).
    for j in (me + 1)..open.members.len() {
        if net.linked[j] {
            net.dial(j, open.members[j].addr.clone());
        }
    }
    let stall = Duration::from_millis(open.stall_timeout_ms as u64).max(Duration::from_secs(1));
    let mut last_heard = Instant::now();
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    let mut sent_upto = u64::MAX;
    let mut peer_log = tokio::time::interval(PEER_LOG_EVERY);
    let mut logged = net.received.clone();
    let outcome = loop {
        if net.finished() {
            break Ok(());
        }
        if let Some(e) = net.fatal.take() {
            break Err(e);
        }
        // Once the copy is in place, only the source decides that the session is over.
        if last_heard.elapsed() > stall && !net.finalized {
            break Err(format!("nothing heard for {} s", stall.as_secs()));
        }
        let deadline = net.node.poll_timeout();
        tokio::select! {
            // A disk slower than the network: the readers wait (and TCP holds the peers back)
            // until the store catches up, so memory stays bounded.
            Some(ev) = net.ev_rx.recv(), if net.unstored < UNSTORED_BUDGET => {
                let batch = with_queued(ev, &mut net.ev_rx);
                for ev in batch {
                    if matches!(ev, Ev::Frame(..) | Ev::Verified(..)) {
                        last_heard = Instant::now();
                    }
                    net.handle(ev, Instant::now());
                }
            }
            Some((j, s)) = peers_rx.recv() => {
                if j == 0 || j >= net.members.len() || j == me || net.conns.contains_key(&j) {
                    tracing::warn!("swarm session {:016x}: refused a connection claiming node {j}", open.session);
                } else {
                    net.add_conn(j, s);
                    net.link(j, Instant::now());
                }
            }
            Some(ev) = store_rx.recv() => net.handle_store(ev),
            _ = sleep_until_opt(deadline) => net.node.handle_timeout(Instant::now()),
            _ = progress.tick() => {
                let upto = net.node.have().len();
                if upto != sent_upto && !net.reported {
                    sent_upto = upto;
                    net.tell_source(Frame::Ack { node: me as u32, upto });
                }
            }
            _ = peer_log.tick(), if tracing::enabled!(tracing::Level::DEBUG) => {
                net.log_peers(&mut logged, Instant::now());
            }
        }
        net.after_input(Instant::now());
    };
    let ok = outcome.is_ok() && net.finalized;
    if let Err(e) = &outcome {
        net.tell_source(Frame::Failed {
            node: me as u32,
            reason: e.clone(),
        });
        net.after_input(Instant::now());
    }
    net.close().await;
    match outcome {
        Ok(()) if ok => Ok(()),
        Ok(()) => Err(net
            .copy_failed
            .clone()
            .unwrap_or_else(|| "the session ended before the copy was complete".into())),
        Err(e) => Err(e),
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

/// Events from the connection tasks.
enum Ev {
    Frame(NodeId, Frame),
    /// A chunk its reader verified.
    Verified(NodeId, Chunk),
    Written(NodeId),
    /// The reader's end: the connection is gone, and with it what the peer had to say.
    Closed(NodeId, String),
    /// The writer's end: the peer stopped reading (it may have finished and closed first); its
    /// reader may still have frames to deliver, the member's report among them.
    WriteFailed(NodeId, String),
    Dialled(NodeId, Result<Stream, String>),
}

struct Conn {
    /// Every frame, in order: not bounded here (the node's control frames are what they are
    /// either way); pieces are, by `inflight`.
    tx: mpsc::UnboundedSender<Frame>,
    /// Pieces handed to the writer and not yet written.
    inflight: usize,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

/// A verified piece a member can serve.
#[derive(Debug, Clone)]
enum Held {
    /// In memory: not stored yet, or a piece of a directory.
    Mem(Chunk),
    /// In the member's file ([`Net::disk`]): only what the piece's frame needs besides its
    /// bytes.
    Disk {
        hash: [u8; 32],
        tag: [u8; 32],
        /// The source's signature, served with the piece: peers take no piece without it.
        sig: Option<Box<SourceSig>>,
        len: u32,
    },
}

impl Held {
    fn on_disk(c: &Chunk) -> Held {
        Held::Disk {
            hash: c.hash,
            tag: c.tag,
            sig: c.sig.clone(),
            len: c.data.len() as u32,
        }
    }
}

/// Piece `i` to send: from memory, or from `disk`: mapped (handed to `sendfile` by the writer,
/// never copied here), or read past the page cache where the copy was written that way.
fn piece(
    held: &[Option<Held>],
    disk: &Option<Disk>,
    chunk_size: u32,
    i: u64,
) -> Result<Option<Chunk>, String> {
    let Some(h) = held.get(i as usize).and_then(|h| h.as_ref()) else {
        return Ok(None);
    };
    let (hash, tag, sig, len) = match h {
        Held::Mem(c) => return Ok(Some(c.clone())),
        Held::Disk {
            hash,
            tag,
            sig,
            len,
        } => (*hash, *tag, sig.clone(), *len as usize),
    };
    let at = i * chunk_size as u64;
    let data = match disk.as_ref().ok_or("a stored piece without a file")? {
        // SAFETY: the file is ours (the source's input, checked while it was read, or our own
        // copy); a truncation by another program is the SIGBUS case `input` reports.
        Disk::Cached(file) => unsafe { crate::mapped::chunk(file, at, len, false) },
        // On the event loop: one piece's direct read (about 0.2 ms for 256 KiB on the lab's
        // disk), where a mapping defers the page-cache read to the writer's `sendfile`.
        Disk::Direct(file) => file.read_at(at, len),
    }
    .map_err(|e| format!("reading piece {i} back: {e}"))?;
    Ok(Some(Chunk {
        index: i,
        hash,
        tag,
        sig,
        data,
    }))
}

/// One member's connections, pieces and node.
struct Net {
    node: SwarmNode,
    me: NodeId,
    session: SessionId,
    keys: Keys,
    tuning: TcpTuning,
    members: Vec<SwarmMember>,
    chunk_size: u32,
    /// Swarm peers of this member (either names the other in `connect_to`).
    linked: Vec<bool>,
    /// Peers the node was told about (connection up).
    connected: Vec<bool>,
    /// Verified pieces, to serve them: in memory until stored, then (with `disk`) read back.
    held: Vec<Option<Held>>,
    /// The file the pieces are served from once stored (the source's input, an agent's copy);
    /// none for a directory, whose pieces stay in memory.
    disk: Option<Disk>,
    /// Bytes of pieces handed to the store and not yet stored.
    unstored: u64,
    conns: HashMap<NodeId, Conn>,
    ev_tx: mpsc::Sender<Ev>,
    ev_rx: mpsc::Receiver<Ev>,
    /// Bytes of verified pieces received per peer.
    received: Vec<u64>,
    store: Option<Store>,
    stored: u64,
    finalize_sent: bool,
    finalized: bool,
    reported: bool,
    copy_failed: Option<String>,
    /// The source closed the set-up connection.
    source_gone: bool,
    fatal: Option<String>,
    dials: Vec<JoinHandle<()>>,
}

impl Net {
    fn new(
        open: &SwarmOpen,
        me: NodeId,
        keys: Keys,
        tuning: TcpTuning,
        held: Vec<Option<Held>>,
    ) -> Result<Net, String> {
        let n = open.members.len();
        if open
            .members
            .iter()
            .enumerate()
            .any(|(i, m)| m.node as usize != i)
        {
            return Err("members out of order in the set-up".into());
        }
        let labels: Vec<u32> = open.members.iter().map(|m| m.cluster).collect();
        let tree = if open.members.iter().all(|m| m.parent == NO_PARENT) {
            None
        } else {
            let parents = open
                .members
                .iter()
                .map(|m| (m.parent != NO_PARENT).then_some(m.parent as NodeId))
                .collect();
            Some(Tree::from_parents(parents).map_err(|e| format!("bad tree in the set-up: {e}"))?)
        };
        let pieces = open.manifest.chunks(open.chunk_size).unwrap_or(0);
        let mut cfg = SwarmConfig::new(open.strategy, open.session, pieces);
        cfg.seed = open.seed;
        let now = Instant::now();
        let node = SwarmNode::new(cfg.clone(), keys.clone(), &labels, me, tree.as_ref(), now)
            .map_err(|e| e.to_string())?;
        // Every member's initial connections, worked out as each member works them out.
        let mut linked = vec![false; n];
        for &j in node.connect_to() {
            linked[j] = true;
        }
        for j in (0..n).filter(|&j| j != me) {
            let other = SwarmNode::new(cfg.clone(), keys.clone(), &labels, j, tree.as_ref(), now)
                .map_err(|e| e.to_string())?;
            if other.connect_to().contains(&me) {
                linked[j] = true;
            }
        }
        let (ev_tx, ev_rx) = mpsc::channel(EVENT_SLOTS);
        Ok(Net {
            node,
            me,
            session: open.session,
            keys,
            tuning,
            members: open.members.clone(),
            chunk_size: open.chunk_size,
            linked,
            connected: vec![false; n],
            held,
            disk: None,
            unstored: 0,
            conns: HashMap::new(),
            ev_tx,
            ev_rx,
            received: vec![0; n],
            store: None,
            stored: 0,
            finalize_sent: false,
            finalized: false,
            reported: false,
            copy_failed: None,
            source_gone: false,
            fatal: None,
            dials: Vec::new(),
        })
    }

    /// Starts the reader and writer of the connection to `j`; the source's connections (and an
    /// agent's connection to the source) become swarm links here when the two are peers.
    fn add_conn(&mut self, j: NodeId, stream: Stream) {
        if let Some(t) = stream.tcp() {
            if let Err(e) = transport::set_notsent_lowat(t, SOCKET_BACKLOG) {
                tracing::debug!("TCP_NOTSENT_LOWAT: {e}");
            }
        }
        let (r, w) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_conn(
            r,
            j,
            self.keys.clone(),
            self.session,
            self.ev_tx.clone(),
        ));
        let writer = tokio::spawn(write_conn(w, rx, j, self.ev_tx.clone()));
        self.conns.insert(
            j,
            Conn {
                tx,
                inflight: 0,
                reader,
                writer,
            },
        );
        if (j == 0 || self.me == 0) && self.linked[j] {
            self.link(j, Instant::now());
        }
    }

    fn link(&mut self, j: NodeId, now: Instant) {
        self.linked[j] = true;
        self.connected[j] = true;
        self.node.handle_connected(j, now);
    }

    fn dial(&mut self, j: NodeId, addr: String) {
        let (keys, tuning, tx) = (self.keys.clone(), self.tuning.clone(), self.ev_tx.clone());
        let hello = Frame::SwarmSetup(SwarmSetup::Peer {
            session: self.session,
            node: self.me as u32,
        });
        self.dials.push(tokio::spawn(async move {
            let r = async {
                let s = transport::connect(&addr, &tuning).await?;
                let mut s = transport::handshake_connect(s, &keys).await?;
                transport::write_frame(&mut s, &hello).await?;
                Ok::<_, transport::ConnError>(s)
            }
            .await
            .map_err(|e| format!("{addr}: {e}"));
            let _ = tx.send(Ev::Dialled(j, r)).await;
        }));
    }

    fn tell_source(&mut self, f: Frame) {
        if let Some(c) = self.conns.get(&0) {
            let _ = c.tx.send(f);
        }
    }

    /// Done at an agent: copy in place and reported, and the session over.
    fn finished(&self) -> bool {
        let over = self.node.is_all_done() || self.source_gone;
        let copy_done = (self.finalized && self.reported) || self.copy_failed.is_some();
        over && (copy_done || self.source_gone) && self.drained()
    }

    /// One debug line per connected peer: what arrived from it since the last call
    /// (`logged` holds the counts then) and the node's view of it.
    fn log_peers(&self, logged: &mut [u64], now: Instant) {
        let held = self.node.have().len();
        for st in self.node.peer_stats(now) {
            let j = st.peer;
            let got = self.received[j] - logged[j];
            logged[j] = self.received[j];
            tracing::debug!(
                "swarm {:016x} peers: node {j}{} got {:.2} MB, outstanding {}/{}, rate {:.1} pieces/s, min rtt {} ms, askable {}, queued for it {}, stalled {}, held {held}",
                self.session,
                if st.local { " (local)" } else { "" },
                got as f64 / 1e6,
                st.outstanding,
                st.window,
                st.pieces_per_sec.unwrap_or(0.0),
                st.min_rtt.as_millis(),
                st.askable,
                st.queued_for_it,
                st.stalled,
            );
        }
    }

    /// Nothing left to send: every writer has room, so the node had nothing more to give.
    fn drained(&self) -> bool {
        self.conns.values().all(|c| c.inflight < WRITE_SLOTS)
    }

    fn handle(&mut self, ev: Ev, now: Instant) {
        match ev {
            Ev::Written(j) => {
                if let Some(c) = self.conns.get_mut(&j) {
                    c.inflight = c.inflight.saturating_sub(1);
                }
            }
            Ev::Closed(j, reason) | Ev::WriteFailed(j, reason) => {
                if self.conns.remove(&j).is_some() {
                    tracing::debug!(
                        "swarm {:016x}: connection to node {j} closed: {reason}",
                        self.session
                    );
                }
                if self.connected[j] {
                    self.connected[j] = false;
                    self.node.handle_peer_lost(j, now);
                }
                if j == 0 && self.me != 0 {
                    self.source_gone = true;
                }
            }
            Ev::Dialled(j, Ok(s)) => {
                if self.conns.contains_key(&j) {
                    return;
                }
                self.add_conn(j, s);
                self.link(j, now);
            }
            Ev::Dialled(j, Err(e)) => {
                tracing::warn!("swarm {:016x}: cannot reach peer {j}: {e}", self.session);
            }
            Ev::Verified(j, c) => {
                if !self.connected[j] {
                    return self.drop_conn(j, "a piece from a node that is not a peer", now);
                }
                let index = c.index;
                if index >= self.held.len() as u64 {
                    return self.drop_conn(j, "a piece beyond the object", now);
                }
                self.received[j] += c.data.len() as u64;
                self.keep(c);
                if let Err(e) = self.node.handle_verified_piece(j, index, now) {
                    self.drop_conn(j, &e.to_string(), now);
                }
            }
            Ev::Frame(j, f) => match f {
                Frame::Error { reason } if j == 0 && self.me != 0 => {
                    self.fatal = Some(format!("the source ended the session: {reason}"));
                }
                Frame::SwarmSetup(SwarmSetup::Lost { node })
                    if j == 0 && self.me != 0 && (node as usize) < self.members.len() =>
                {
                    self.member_lost(node as NodeId, now);
                }
                f if self.connected[j] => {
                    if let Err(e) = self.node.handle_frame(j, f, now) {
                        self.drop_conn(j, &e.to_string(), now);
                    }
                }
                f => {
                    let what = format!("unexpected {} frame", f.kind());
                    self.drop_conn(j, &what, now);
                }
            },
        }
    }

    /// A verified piece: held in memory (to serve it) and written to the store once.
    fn keep(&mut self, c: Chunk) {
        let i = c.index as usize;
        if self.held[i].is_some() {
            return;
        }
        if let Some(s) = &self.store {
            crate::metrics::global().chunk_verified(c.data.len());
            s.write(c.index, c.index * self.chunk_size as u64, c.data.clone());
            self.unstored += c.data.len() as u64;
        }
        self.held[i] = Some(Held::Mem(c));
    }

    fn handle_store(&mut self, ev: StoreEvent) {
        match ev {
            StoreEvent::Stored(i) => {
                crate::metrics::global().chunk_stored();
                self.stored += 1;
                if let Some(slot) = self.held.get_mut(i as usize) {
                    if let Some(Held::Mem(c)) = slot {
                        self.unstored = self.unstored.saturating_sub(c.data.len() as u64);
                        // On disk now: served from there, the memory goes.
                        if self.disk.is_some() {
                            *slot = Some(Held::on_disk(c));
                        }
                    }
                }
            }
            // Swarm members read back through their own `Disk` handle, not the store thread.
            StoreEvent::Loaded(..) => {}
            StoreEvent::Failed(e) => {
                tracing::error!("swarm {:016x}: storing failed: {e}", self.session);
                self.copy_failed = Some(e.clone());
                self.tell_source(Frame::Failed {
                    node: self.me as u32,
                    reason: e,
                });
            }
            StoreEvent::Finalized(Ok(path)) => {
                tracing::info!("swarm {:016x}: {} in place", self.session, path.display());
                self.finalized = true;
                let received = (0..self.received.len())
                    .filter(|&j| self.received[j] > 0)
                    .map(|j| (j as u32, self.received[j]))
                    .collect();
                self.tell_source(Frame::SwarmSetup(SwarmSetup::Report {
                    node: self.me as u32,
                    received,
                }));
                self.reported = true;
            }
            StoreEvent::Finalized(Err(e)) => {
                self.copy_failed = Some(e.clone());
                self.tell_source(Frame::Failed {
                    node: self.me as u32,
                    reason: e,
                });
            }
        }
    }

    /// Member `j` left the session for good: the node redistributes its share and its place
    /// in the completion tree; the source tells every other member.
    fn member_lost(&mut self, j: NodeId, now: Instant) {
        if j == self.me {
            return;
        }
        if let Some(c) = self.conns.remove(&j) {
            c.reader.abort();
        }
        self.connected[j] = false;
        self.node.handle_member_lost(j, now);
        if self.me == 0 {
            for c in self.conns.values() {
                let _ =
                    c.tx.send(Frame::SwarmSetup(SwarmSetup::Lost { node: j as u32 }));
            }
        }
    }

    fn drop_conn(&mut self, j: NodeId, why: &str, now: Instant) {
        tracing::warn!("swarm {:016x}: dropping node {j}: {why}", self.session);
        if let Some(c) = self.conns.remove(&j) {
            c.reader.abort();
            let _ = c.tx.send(Frame::Error { reason: why.into() });
        }
        if self.connected[j] {
            self.connected[j] = false;
            self.node.handle_peer_lost(j, now);
        }
        if j == 0 && self.me != 0 {
            self.source_gone = true;
            self.fatal = Some(format!("the source's connection: {why}"));
        }
    }

    /// Acts on the node's events, then fills every writer.
    fn after_input(&mut self, now: Instant) {
        while let Some(ev) = self.node.poll_event() {
            match ev {
                SwarmEvent::Piece { from, chunk } => {
                    self.received[from] += chunk.data.len() as u64;
                    self.keep(chunk);
                }
                SwarmEvent::Corrupt { from, index, error } => {
                    tracing::warn!(
                        "swarm {:016x}: piece {index} from node {from} rejected ({error})",
                        self.session
                    );
                }
                SwarmEvent::Connect { peer } => {
                    // The lower id of a pair dials (the higher one's node asks too).
                    if peer > self.me && self.me != 0 && !self.conns.contains_key(&peer) {
                        let addr = self.members[peer].addr.clone();
                        self.dial(peer, addr);
                    }
                }
                SwarmEvent::Complete | SwarmEvent::AllDone => {}
            }
        }
        if self.me != 0
            && self.store.is_some()
            && !self.finalize_sent
            && self.stored == self.held.len() as u64
            && self.node.is_complete()
        {
            self.finalize_sent = true;
            if let Some(s) = &self.store {
                s.finalize();
            }
        }
        let ids: Vec<NodeId> = self.conns.keys().copied().collect();
        for j in ids {
            if !self.connected[j] {
                continue;
            }
            let mut missing = None;
            let c = self.conns.get_mut(&j).expect("listed");
            // Control frames whether or not a piece may go: requests and haves do not wait
            // for a slot.
            while let Some(f) = self.node.poll_control(j, now) {
                let _ = c.tx.send(f);
            }
            while c.inflight < WRITE_SLOTS {
                let f = match self.node.poll_transmit(j, now) {
                    Some(Transmit::Frame(f)) => {
                        let _ = c.tx.send(f);
                        continue;
                    }
                    Some(Transmit::Piece(i)) => {
                        match piece(&self.held, &self.disk, self.chunk_size, i) {
                            Ok(Some(c)) => Frame::Chunk(c),
                            Ok(None) => {
                                missing = Some(format!(
                                    "the node asked to send piece {i}, which is not held"
                                ));
                                break;
                            }
                            Err(e) => {
                                missing = Some(e);
                                break;
                            }
                        }
                    }
                    None => break,
                };
                if c.tx.send(f).is_err() {
                    break;
                }
                c.inflight += 1;
            }
            if let Some(e) = missing {
                self.fatal = Some(e);
            }
        }
    }

    /// Ends every connection once its writer has sent what it holds.
    async fn close(&mut self) {
        for d in self.dials.drain(..) {
            d.abort();
        }
        let conns: Vec<Conn> = self.conns.drain().map(|(_, c)| c).collect();
        let mut writers = Vec::new();
        for c in conns {
            c.reader.abort();
            drop(c.tx);
            writers.push(c.writer);
        }
        self.ev_rx.close();
        for w in writers {
            let _ = tokio::time::timeout(Duration::from_secs(5), w).await;
        }
        // Dropping the store without finalize removes a partial copy.
        drop(self.store.take());
    }
}

async fn read_conn<R: AsyncRead + Unpin>(
    mut r: R,
    j: NodeId,
    keys: Keys,
    session: SessionId,
    tx: mpsc::Sender<Ev>,
) {
    loop {
        let ev = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            Ok(Some(Frame::Chunk(c))) => match keys.verify(session, &c) {
                Ok(()) => Ev::Verified(j, c),
                // The node verifies it again, and reports it corrupt.
                Err(_) => Ev::Frame(j, Frame::Chunk(c)),
            },
            Ok(Some(f)) => Ev::Frame(j, f),
            Ok(None) => Ev::Closed(j, "closed".into()),
            Err(e) => Ev::Closed(j, e.to_string()),
        };
        let end = matches!(ev, Ev::Closed(..));
        if tx.send(ev).await.is_err() || end {
            return;
        }
    }
}

/// Writes the frames in order; reports each piece written (see [`WRITE_SLOTS`]).
async fn write_conn(
    w: transport::WriteHalf,
    mut rx: mpsc::UnboundedReceiver<Frame>,
    j: NodeId,
    ev: mpsc::Sender<Ev>,
) {
    let mut w = BufWriter::with_capacity(64 << 10, w);
    while let Some(f) = rx.recv().await {
        let mut r = transport::write_frame_tcp(&mut w, &f).await;
        if r.is_ok() && rx.is_empty() {
            r = w.flush().await;
        }
        if let Err(e) = r {
            let _ = ev.send(Ev::WriteFailed(j, format!("writing: {e}"))).await;
            return;
        }
        // The loop may be gone (closing): the remaining frames are still written.
        if matches!(f, Frame::Chunk(_)) {
            let _ = ev.send(Ev::Written(j)).await;
        }
    }
    let _ = w.flush().await;
    let _ = w.shutdown().await;
}

/// `first` and up to 63 more events already queued behind it, taken in one go.
fn with_queued(first: Ev, rx: &mut mpsc::Receiver<Ev>) -> Vec<Ev> {
    let mut batch = vec![first];
    while batch.len() < 64 {
        match rx.try_recv() {
            Ok(e) => batch.push(e),
            Err(_) => break,
        }
    }
    batch
}
