//! The source's side of a swarm session: every piece read and sealed, a set-up connection to
//! every agent, the loop until every agent reported, and the report.

use super::net::{with_queued, Ev, Held, Net};
use super::*;
use bulkcast_proto::swarm::session::{Outcome, SourceSession};
use bulkcast_proto::swarm::PieceHashes;

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
) -> Result<Report, SwarmError> {
    let manifest = input.manifest.clone();
    // A one-file object is served from the file (page cache) once sealed; a tree is held.
    let disk = match input.single_file() {
        Some(p) => Some(Disk::Cached(Arc::new(
            std::fs::File::open(p)
                .map_err(|e| SwarmError::Input(format!("{}: {e}", p.display())))?,
        ))),
        None => None,
    };
    let len = check_size(&manifest, disk.is_some())?;
    let (labels, sites) = cluster_labels(source, hosts);
    let n = hosts.len() + 1;
    if let Some(t) = tree {
        if t.len() != n {
            return Err(SwarmError::SetUp(format!(
                "the tree has {} nodes, the session {n}",
                t.len()
            )));
        }
    }
    let mut open = session_open(source, hosts, tree, &labels, session, cfg, &manifest);
    let held = read_pieces(input, &disk, cfg.chunk_size, &keys, session, len).await?;
    // One signature for every piece: the root of their hashes, with the set-up.
    let hashes = PieceHashes::new(
        held.iter()
            .map(|h| match h {
                Some(Held::Mem(c)) => c.hash,
                Some(Held::Disk { hash, .. }) => *hash,
                None => [0; 32],
            })
            .collect(),
    );
    open.pieces_root = hashes.root();
    open.sig = keys.sign_swarm_open(session, cfg.chunk_size, &manifest, &open.pieces_root);
    {
        let mut st = status.lock().expect("status lock");
        st.started = Instant::now();
        st.total_len = Some(len);
        st.read = len;
    }
    let mut net = Net::new(
        &open,
        0,
        keys.clone(),
        hashes.clone(),
        cfg.tuning.clone(),
        held,
    )?;
    net.disk = disk;
    let mut watch = SourceSession::new(n, cfg.stall_timeout, Instant::now());
    let mut unreachable = Vec::new();
    let dialler = Dialler {
        open: open.clone(),
        hashes: Arc::new(hash_frames(&hashes)),
        keys: keys.clone(),
        tuning: cfg.tuning.clone(),
    };
    for (j, r) in dial_members(&dialler).await? {
        match r {
            Ok(s) => net.add_conn(j, s),
            Err(e) => {
                status.lock().expect("status lock").receivers[j - 1].failed = Some(e.clone());
                watch.handle_lost(j, e);
                unreachable.push(j);
            }
        }
    }
    for j in unreachable {
        net.member_lost(j, Instant::now());
    }
    let pieces = open.manifest.chunks(cfg.chunk_size).unwrap_or(0);
    run(&mut net, &mut watch, &status, pieces, &dialler).await?;
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
    per_peer_bytes(&mut report, &open, &watch, &labels, &sites, len);
    Ok(report)
}

/// The set-up every agent is sent (with its own node id): the session's settings and every
/// member.
fn session_open(
    source: Option<&SourceSpec>,
    hosts: &[HostSpec],
    tree: Option<&Tree>,
    labels: &[u32],
    session: SessionId,
    cfg: &SwarmSendConfig,
    manifest: &Manifest,
) -> SwarmOpen {
    let source_name = source.map_or("source".to_string(), |s| s.name.clone());
    let members: Vec<SwarmMember> = (0..hosts.len() + 1)
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
    SwarmOpen {
        session,
        node: 0,
        chunk_size: cfg.chunk_size,
        stall_timeout_ms: cfg.stall_timeout.as_millis().min(u32::MAX as u128) as u32,
        strategy: cfg.strategy,
        seed: cfg.seed,
        manifest: manifest.clone(),
        members,
        pieces_root: [0; 32],
        sig: None,
    }
}

/// What the source needs to reach a member, at the start or again after its connection
/// dropped: the set-up and the piece list that follows it.
#[derive(Clone)]
struct Dialler {
    open: SwarmOpen,
    hashes: Arc<Vec<Frame>>,
    keys: Keys,
    tuning: TcpTuning,
}

impl Dialler {
    /// Dials member `j`, passes the handshake and sends its set-up and the piece list.
    async fn dial(&self, j: NodeId) -> Result<Stream, String> {
        let mut o = self.open.clone();
        o.node = j as u32;
        let addr = o.members[j].addr.clone();
        let (keys, tuning, hashes) = (&self.keys, &self.tuning, &self.hashes);
        async {
            let s = transport::connect(&addr, tuning).await?;
            let mut s = transport::handshake_connect(s, keys).await?;
            transport::write_frame(&mut s, &Frame::SwarmSetup(SwarmSetup::Open(Box::new(o))))
                .await?;
            for f in hashes.iter() {
                transport::write_frame(&mut s, f).await?;
            }
            Ok::<_, transport::ConnError>(s)
        }
        .await
        .map_err(|e| format!("{addr}: {e}"))
    }
}

/// The piece list as `Hashes` frames (at least one, so that an empty list is sent too).
fn hash_frames(hashes: &PieceHashes) -> Vec<Frame> {
    let list = hashes.as_slice();
    (0..list.len().div_ceil(wire::HASHES_PER_FRAME).max(1))
        .map(|k| {
            let at = k * wire::HASHES_PER_FRAME;
            let end = (at + wire::HASHES_PER_FRAME).min(list.len());
            Frame::SwarmSetup(SwarmSetup::Hashes {
                first: at as u64,
                hashes: list[at.min(end)..end].to_vec(),
            })
        })
        .collect()
}

/// Every piece sealed once, then held (a one-file object, served from `disk`: only its hash
/// and tag).
async fn read_pieces(
    input: Input,
    disk: &Option<Disk>,
    chunk_size: u32,
    keys: &Keys,
    session: SessionId,
    len: u64,
) -> Result<Vec<Option<Held>>, SwarmError> {
    let pieces = input.manifest.chunks(chunk_size).unwrap_or(0);
    let mut rx = input.spawn(chunk_size as usize, keys.clone(), session);
    let mut held: Vec<Option<Held>> = Vec::with_capacity(pieces as usize);
    loop {
        match rx.recv().await {
            Some(InputEvent::Data(c, _)) => held.push(Some(match disk {
                Some(_) => Held::on_disk(&c),
                None => Held::Mem(c),
            })),
            Some(InputEvent::End) => break,
            Some(InputEvent::Failed(e)) => return Err(SwarmError::Input(e.to_string())),
            None => return Err(SwarmError::Input("the input reader stopped".into())),
        }
    }
    if held.len() as u64 != pieces {
        return Err(SwarmError::Input(format!(
            "the input changed while it was read ({} chunks, {pieces} expected for {len} bytes)",
            held.len()
        )));
    }
    Ok(held)
}

/// The set-up connections, all dialled at once: per agent, the connection (its `Open` and the
/// piece list sent) or why it could not be made.
async fn dial_members(
    dialler: &Dialler,
) -> Result<Vec<(NodeId, Result<Stream, String>)>, SwarmError> {
    let mut dials = Vec::new();
    for j in 1..dialler.open.members.len() {
        let d = dialler.clone();
        dials.push(tokio::spawn(async move { (j, d.dial(j).await) }));
    }
    let mut out = Vec::with_capacity(dials.len());
    for d in dials {
        out.push(d.await.map_err(|e| SwarmError::Failed(e.to_string()))?);
    }
    Ok(out)
}

/// The source's loop: serves its peers and follows every agent until the session is over
/// (see [`SourceSession::is_over`]); its timers dial again the agents whose connection
/// dropped, and give up on the agents still pending.
async fn run(
    net: &mut Net,
    watch: &mut SourceSession,
    status: &Mutex<Status>,
    pieces: u64,
    dialler: &Dialler,
) -> Result<(), SwarmError> {
    loop {
        if net.node.is_all_done() {
            let why = "every other member had finished before it could be reached again";
            for j in watch.give_up_away(why) {
                failed(watch, status, j);
            }
        }
        if watch.is_over(net.node.is_all_done()) {
            return Ok(());
        }
        let deadline = net.node.poll_timeout();
        tokio::select! {
            Some(ev) = net.ev_rx.recv() => {
                let batch = with_queued(ev, &mut net.ev_rx);
                for ev in batch {
                    from_member(net, watch, status, ev, pieces);
                }
            }
            _ = sleep_until_opt(deadline) => net.node.handle_timeout(Instant::now()),
            _ = sleep_until_opt(watch.poll_timeout()) => {
                let now = Instant::now();
                for j in watch.poll_redial(now) {
                    tracing::info!("swarm {:016x}: dialling node {j} again", net.session);
                    let (d, tx) = (dialler.clone(), net.ev_tx.clone());
                    net.dials.push(tokio::spawn(async move {
                        let _ = tx.send(Ev::Dialled(j, d.dial(j).await)).await;
                    }));
                }
                for j in watch.handle_timeout(now) {
                    failed(watch, status, j);
                }
            }
        }
        net.after_input(Instant::now());
        if let Some(e) = net.fatal.take() {
            return Err(SwarmError::Failed(e));
        }
    }
}

/// One event at the source: an agent's progress, report or failure goes to `watch` (and the
/// status), anything else to the swarm.
fn from_member(
    net: &mut Net,
    watch: &mut SourceSession,
    status: &Mutex<Status>,
    ev: Ev,
    pieces: u64,
) {
    let now = Instant::now();
    match ev {
        Ev::Frame(j, Frame::Ack { node, upto }) if node as usize == j => {
            watch.handle_progress(j, now);
            let mut st = status.lock().expect("status lock");
            let r = &mut st.receivers[j - 1];
            r.chunks = r.chunks.max(upto);
        }
        // What the member's copy held before the session (it resumed, or is in place).
        Ev::Frame(
            j,
            Frame::Have {
                node,
                complete,
                ranges,
            },
        ) if node as usize == j => {
            watch.handle_progress(j, now);
            let held = bulkcast_proto::chunkmap::ChunkMap::from_ranges(&ranges, pieces);
            let mut st = status.lock().expect("status lock");
            let r = &mut st.receivers[j - 1];
            r.held = if complete { pieces } else { held.len() };
            r.already = complete;
            r.chunks = r.chunks.max(r.held);
        }
        Ev::Frame(j, Frame::SwarmSetup(SwarmSetup::Report { node, received }))
            if node as usize == j =>
        {
            let moved = received.iter().map(|&(_, b)| b).sum();
            watch.handle_report(j, received, now);
            let mut st = status.lock().expect("status lock");
            let t = st.started.elapsed();
            let r = &mut st.receivers[j - 1];
            r.chunks = pieces;
            r.done.get_or_insert(t);
            r.received = Some(moved);
        }
        Ev::Frame(j, Frame::Failed { node, reason }) if node as usize == j => {
            status.lock().expect("status lock").receivers[j - 1].failed = Some(reason.clone());
            if watch.handle_failed(j, reason, now) {
                net.member_lost(j, now);
            }
        }
        Ev::Closed(j, reason) if j != 0 && watch.outcome(j).is_none() && !watch.is_away(j) => {
            // The old connection's writer could only report on the new one's behalf later.
            if let Some(c) = net.conns.get(&j) {
                c.writer.abort();
            }
            net.handle(Ev::Closed(j, reason.clone()), now);
            let e = format!("connection lost: {reason}");
            tracing::warn!(
                "swarm {:016x}: node {j}: {e}; trying to reach it again",
                net.session
            );
            watch.handle_dropped(j, e, now);
            net.member_lost(j, now);
        }
        Ev::Dialled(j, r) => readmit(net, watch, status, j, r, now),
        ev => net.handle(ev, now),
    }
}

/// Receiver `j`'s outcome is a failure: the status shows it.
fn failed(watch: &SourceSession, status: &Mutex<Status>, j: NodeId) {
    if let Some(Outcome::Failed(e)) = watch.outcome(j) {
        status.lock().expect("status lock").receivers[j - 1].failed = Some(e.clone());
    }
}

/// The source dialled receiver `j` again, after its connection dropped: on success it is back
/// in the session. Every other member is told (`Back`); the receiver, on its new set-up
/// connection, hears first who was lost or came back meanwhile, then that it is back itself,
/// and resumes from its copy.
fn readmit(
    net: &mut Net,
    watch: &mut SourceSession,
    status: &Mutex<Status>,
    j: NodeId,
    r: Result<Stream, String>,
    now: Instant,
) {
    let s = match r {
        Err(e) => {
            if watch.handle_redial_failed(j, &e, now) {
                failed(watch, status, j);
            }
            return;
        }
        // Given up meanwhile, or nothing left to re-admit it into: dropping the connection
        // ends its instance.
        Ok(_) if !watch.is_away(j) || net.node.is_all_done() => return,
        Ok(s) => s,
    };
    tracing::info!("swarm {:016x}: node {j} is back", net.session);
    watch.handle_back(j, now);
    let back = Frame::SwarmSetup(SwarmSetup::Back { node: j as u32 });
    for c in net.conns.values_mut() {
        c.out.send(back.clone());
    }
    net.node.handle_member_back(j, now);
    net.add_conn(j, s);
    let n = net.members.len();
    let mut first: Vec<Frame> = (1..n)
        .filter(|&m| m != j && !net.node.is_alive(m))
        .map(|m| Frame::SwarmSetup(SwarmSetup::Lost { node: m as u32 }))
        .collect();
    first.extend(
        (1..n)
            .filter(|&m| m != j && net.node.is_alive(m) && net.node.is_returned(m))
            .map(|m| Frame::SwarmSetup(SwarmSetup::Back { node: m as u32 })),
    );
    first.push(back);
    if let Some(c) = net.conns.get_mut(&j) {
        for f in first {
            c.out.send(f);
        }
    }
    // It reports to the source, which is its peer now whatever the strategy chose.
    if !net.connected[j] {
        net.link(j, now);
    }
}

/// Bytes each receiver got from each peer, and the WAN bytes into each cluster.
fn per_peer_bytes(
    report: &mut Report,
    open: &SwarmOpen,
    watch: &SourceSession,
    labels: &[u32],
    sites: &[String],
    len: u64,
) {
    let n = open.members.len();
    let name_of = |i: usize| open.members[i].name.clone();
    let mut wan = vec![0u64; sites.len()];
    for j in 1..n {
        let rr = &mut report.receivers[j - 1];
        rr.site = Some(sites[labels[j] as usize].clone());
        if let Some(Outcome::Reported(received)) = watch.outcome(j) {
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
}
