//! An agent's side of a swarm session.

use super::net::{with_queued, Ev, Held, Net};
use super::*;
use crate::store::Resumed;
use bulkcast_proto::chunkmap::ChunkMap;

/// An agent's side of a swarm session: `stream` is the source's connection, its `Open`
/// already read. Stores the object into the agent's directory; returns once the copy is in
/// place and the session over, or with why it failed.
pub async fn serve(
    stream: Stream,
    open: SwarmOpen,
    cfg: &crate::agent::AgentConfig,
) -> Result<(), SwarmError> {
    let me = open.node as NodeId;
    if me == 0 || me >= open.members.len() {
        return Err(SwarmError::SetUp(format!(
            "set-up names this agent node {me}"
        )));
    }
    // With host keys: a set-up its source signed, the root of the piece list included; every
    // piece, kept or received from any peer, is then checked against that list.
    let keys = cfg.keys.clone().requiring_source();
    let keys = match keys.verify_swarm_open(&open) {
        Ok(Some(source)) => keys.for_source(source),
        Ok(None) => keys,
        Err(e) => {
            return Err(SwarmError::SetUp(format!(
                "{e} (sent by {})",
                peer_name(&stream)
            )))
        }
    };
    let stall = Duration::from_millis(open.stall_timeout_ms as u64).max(Duration::from_secs(1));
    let mut stream = stream;
    let hashes = read_hashes(&mut stream, &open, stall).await?;
    let (_registered, mut peers_rx) = cfg.swarms.register(open.session);
    // Verifying a kept copy reads it whole: the source hears from us meanwhile.
    let session = open_session(&open, me, cfg, keys, hashes);
    let opened = keep_source_waiting(&mut stream, me, session).await;
    let (mut net, mut store_rx, resumed) = opened?;
    net.add_conn(0, stream);
    // What the copy held, for the source's report, before anything else on its connection.
    net.tell_source(Frame::Have {
        node: me as u32,
        complete: resumed.complete,
        ranges: net.node.have().ranges(),
    });
    // Dial the peers with a higher id (the lower id of each pair dials).
    for j in (me + 1)..open.members.len() {
        if net.linked[j] {
            net.dial(j, open.members[j].addr.clone());
        }
    }
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
            Some((j, s)) = peers_rx.recv() => net.accept_peer(j, s, Instant::now()),
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
        Ok(()) => Err(SwarmError::Failed(net.copy_failed.clone().unwrap_or_else(
            || "the session ended before the copy was complete".into(),
        ))),
        Err(e) => Err(SwarmError::Failed(e)),
    }
}

/// The source's piece list, which follows its `Open` on the set-up connection: one hash per
/// piece, in order, whose root is the one the set-up carries (signed with host keys).
async fn read_hashes(
    stream: &mut Stream,
    open: &SwarmOpen,
    wait: Duration,
) -> Result<PieceHashes, SwarmError> {
    let pieces = open.manifest.chunks(open.chunk_size).unwrap_or(0);
    let bad = |e: String| SwarmError::SetUp(format!("the piece list: {e}"));
    // Nothing is reserved on the sender's word beyond what its frames bring.
    let mut hashes: Vec<[u8; 32]> = Vec::with_capacity(pieces.min(1 << 20) as usize);
    // The source sends at least one frame, so an empty object's (empty) list is read too.
    let mut frames = 0;
    while frames == 0 || (hashes.len() as u64) < pieces {
        let f = tokio::time::timeout(wait, transport::read_frame(stream, wire::MAX_FRAME))
            .await
            .map_err(|_| bad(format!("nothing for {} s", wait.as_secs())))?
            .map_err(|e| bad(e.to_string()))?;
        match f {
            Some(Frame::SwarmSetup(SwarmSetup::Hashes { first, hashes: h }))
                if first == hashes.len() as u64
                    && h.len() as u64 <= pieces - hashes.len() as u64 =>
            {
                frames += 1;
                hashes.extend(h)
            }
            Some(f) => return Err(bad(format!("unexpected {} frame", f.kind()))),
            None => return Err(bad("the source closed the connection".into())),
        }
    }
    let list = PieceHashes::new(hashes);
    if list.root() != open.pieces_root {
        return Err(bad("does not match the set-up's root".into()));
    }
    Ok(list)
}

/// Checks the set-up (everything the store relies on, before a file is created), then opens
/// the store (resuming what an earlier session of the object kept, see
/// [`Store::open_resumable`]) and the member's connections state, its node resumed from it.
/// A kept piece counts only if its bytes hash to the source's listed hash (a copy in place is
/// taken on its done record); it is served with that hash and a tag for this session.
async fn open_session(
    open: &SwarmOpen,
    me: NodeId,
    cfg: &crate::agent::AgentConfig,
    keys: Keys,
    hashes: PieceHashes,
) -> Result<(Net, mpsc::UnboundedReceiver<StoreEvent>, Resumed), SwarmError> {
    open.manifest
        .validate()
        .map_err(|e| SwarmError::SetUp(format!("bad manifest: {e}")))?;
    if !CHUNK_SIZE_RANGE.contains(&open.chunk_size) {
        return Err(SwarmError::SetUp(format!(
            "chunk size {} outside {CHUNK_SIZE_RANGE:?}",
            open.chunk_size
        )));
    }
    // Agents store into a directory: a one-file object has a file to serve pieces from.
    let len = check_size(&open.manifest, open.manifest.kind == ObjectKind::File)?;
    let pieces = open.manifest.chunks(open.chunk_size).unwrap_or(0);
    let (store_tx, mut store_rx) = mpsc::unbounded_channel();
    let (dir, manifest, cs, session) = (
        cfg.dir.clone(),
        open.manifest.clone(),
        open.chunk_size,
        open.session,
    );
    let (io, stored, partials) = (cfg.io, cfg.stored.clone(), cfg.partials);
    // Verifying a kept copy reads it whole: off the event loop.
    let (store, resumed) = tokio::task::spawn_blocking(move || {
        Store::open_resumable(
            Target::Dir(dir),
            &manifest,
            cs,
            session,
            io,
            store_tx,
            stored,
            partials,
        )
    })
    .await
    .map_err(|e| SwarmError::Store(e.to_string()))?
    .map_err(|e| SwarmError::Store(e.to_string()))?;
    let mut held_map = match resumed.complete {
        true => ChunkMap::from_ranges(&[(0, pieces)], pieces),
        false => ChunkMap::from_ranges(&resumed.held.ranges(), pieces),
    };
    let mut net = Net::new(
        open,
        me,
        keys,
        hashes,
        cfg.tuning.clone(),
        vec![None; pieces as usize],
    )?;
    net.disk = store.reader();
    if net.disk.is_some() {
        crate::input::install_sigbus_message();
        if !resumed.complete {
            held_map = listed_only(&net, held_map, len).await?;
        }
    }
    let piece_len = |i: u64| (cs as u64).min(len - i * cs as u64);
    let mut kept = Vec::new();
    for (s, e) in held_map.ranges() {
        for i in s..e {
            let held = match net.disk {
                Some(_) => Some(kept_on_disk(&net, i, piece_len(i))),
                // A directory's pieces are held in memory: read back what it kept.
                None => read_kept(&store, &mut store_rx, &net, i, piece_len(i)).await?,
            };
            if held.is_some() {
                kept.push((i, i + 1));
            }
            net.held[i as usize] = held;
        }
    }
    let held_map = ChunkMap::from_ranges(&kept, pieces);
    net.stored = held_map.len();
    net.node.resume(&held_map);
    net.store = Some(store);
    Ok((net, store_rx, resumed))
}

/// A kept piece `i` of `len` bytes in the member's file: served with the source's listed hash
/// and a tag for this session.
fn kept_on_disk(net: &Net, i: u64, len: u64) -> Held {
    let hash = net.hashes.get(i).copied().unwrap_or_default();
    Held::Disk {
        hash,
        tag: net.keys.tag_listed(net.session, i, len, &hash),
        sig: None,
        len: len as u32,
    }
}

/// The pieces of `held` (kept in the member's file) whose bytes hash to the source's listed
/// hash; the others are fetched again (the copy was made from another object of the same
/// identity). Reads the kept part back, off the event loop.
async fn listed_only(net: &Net, held: ChunkMap, len: u64) -> Result<ChunkMap, SwarmError> {
    let (disk, cs, hashes) = (net.disk.clone(), net.chunk_size, net.hashes.clone());
    let pieces = hashes.len();
    tokio::task::spawn_blocking(move || {
        let mut ok = Vec::new();
        for (s, e) in held.ranges() {
            for i in s..e {
                let n = (cs as u64).min(len - i * cs as u64) as usize;
                let data = super::net::read_back(&disk, cs, i, n).map_err(SwarmError::Store)?;
                if Some(blake3::hash(&data).as_bytes()) == hashes.get(i) {
                    ok.push((i, i + 1));
                } else {
                    tracing::warn!("swarm: kept piece {i} is not the source's: fetching it again");
                }
            }
        }
        Ok(ChunkMap::from_ranges(&ok, pieces))
    })
    .await
    .map_err(|e| SwarmError::Store(e.to_string()))?
}

/// Piece `i` (`len` bytes) of a kept copy, read back through the store and sealed for this
/// session; `None` if it is not the piece the source listed.
async fn read_kept(
    store: &Store,
    rx: &mut mpsc::UnboundedReceiver<StoreEvent>,
    net: &Net,
    i: u64,
    len: u64,
) -> Result<Option<Held>, SwarmError> {
    use crate::store::LocalCopy;
    if !store.load(i, i * net.chunk_size as u64, len) {
        return Err(SwarmError::Store(
            "the kept copy cannot be read back".into(),
        ));
    }
    match rx.recv().await {
        Some(StoreEvent::Loaded(j, Ok(data))) if j == i => {
            let hash = *blake3::hash(&data).as_bytes();
            Ok((net.hashes.get(i) == Some(&hash))
                .then(|| Held::Mem(net.keys.seal_listed(net.session, i, data, hash))))
        }
        Some(StoreEvent::Loaded(_, Err(e))) => Err(SwarmError::Store(e.to_string())),
        _ => Err(SwarmError::Store(format!(
            "reading piece {i} of the kept copy back"
        ))),
    }
}

/// Runs `work`, telling the source every 5 s that this member is still here (a progress of
/// nothing), so that verifying a large kept copy does not outlast its stall timeout.
async fn keep_source_waiting<F: std::future::Future>(
    stream: &mut Stream,
    me: NodeId,
    work: F,
) -> F::Output {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = tick.tick() => {
                let alive = Frame::Ack { node: me as u32, upto: 0 };
                if let Err(e) = transport::write_frame(stream, &alive).await {
                    tracing::debug!("swarm: the source is gone while resuming: {e}");
                }
            }
        }
    }
}

/// The peer at the other end of `s`, for messages that name a culprit.
fn peer_name(s: &Stream) -> String {
    s.tcp()
        .and_then(|t| t.peer_addr().ok())
        .map_or_else(|| "the source's connection".to_string(), |a| a.to_string())
}
