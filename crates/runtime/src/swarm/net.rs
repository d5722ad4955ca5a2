//! One member's connections: a reader and a writer task per peer, the pieces it holds, and
//! the [`SwarmNode`] they feed. Shared by the source ([`super::send`]) and the agents
//! ([`super::serve`]).

use super::*;
use crate::writer::{write_conn, Note, Outbox, SocketControl, Written};
use bytes::Bytes;

/// Events from the connection tasks.
pub(super) enum Ev {
    Frame(NodeId, Frame),
    /// A chunk its reader verified.
    Verified(NodeId, Chunk),
    Written(NodeId, Written),
    /// The reader's end: the connection is gone, and with it what the peer had to say.
    Closed(NodeId, String),
    /// The writer's end: the peer stopped reading (it may have finished and closed first); its
    /// reader may still have frames to deliver, the member's report among them.
    WriteFailed(NodeId, String),
    Dialled(NodeId, Result<Stream, String>),
}

pub(super) struct Conn {
    /// Every frame, in order: the node's control frames are what they are either way; pieces
    /// are bounded by [`WRITE_SLOTS`].
    pub(super) out: Outbox,
    pub(super) reader: JoinHandle<()>,
    pub(super) writer: JoinHandle<()>,
}

/// A verified piece a member can serve.
#[derive(Debug, Clone)]
pub(super) enum Held {
    /// In memory: not stored yet, or a piece of a directory.
    Mem(Chunk),
    /// In the member's file ([`Net::disk`]): only what the piece's frame needs besides its
    /// bytes. A piece kept from an earlier session of the object (it resumed) is here too,
    /// with the source's listed hash and a tag for this session, and no signature: peers check
    /// pieces against the source's signed list ([`bulkcast_proto::swarm::PieceHashes`]).
    Disk {
        hash: [u8; 32],
        tag: [u8; 32],
        /// The source's signature, if it made one, served with the piece.
        sig: Option<Box<SourceSig>>,
        len: u32,
    },
}

impl Held {
    pub(super) fn on_disk(c: &Chunk) -> Held {
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
pub(super) fn piece(
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
    let data = read_back(disk, chunk_size, i, len)?;
    Ok(Some(Chunk {
        index: i,
        hash,
        tag,
        sig,
        data,
    }))
}

/// Piece `i`'s bytes from the member's file.
pub(super) fn read_back(
    disk: &Option<Disk>,
    chunk_size: u32,
    i: u64,
    len: usize,
) -> Result<Bytes, String> {
    let at = i * chunk_size as u64;
    match disk.as_ref().ok_or("a stored piece without a file")? {
        // SAFETY: the file is ours (the source's input, checked while it was read, or our own
        // copy); a truncation by another program is the SIGBUS case `input` reports.
        Disk::Cached(file) => unsafe { crate::mapped::chunk(file, at, len, false) },
        // On the event loop: one piece's direct read (about 0.2 ms for 256 KiB on the lab's
        // disk), where a mapping defers the page-cache read to the writer's `sendfile`.
        Disk::Direct(file) => file.read_at(at, len),
    }
    .map_err(|e| format!("reading piece {i} back: {e}"))
}

/// One member's connections, pieces and node.
pub(super) struct Net {
    pub(super) node: SwarmNode,
    pub(super) me: NodeId,
    pub(super) session: SessionId,
    pub(super) keys: Keys,
    /// The source's list of piece hashes, every piece checked against it.
    pub(super) hashes: PieceHashes,
    pub(super) tuning: TcpTuning,
    pub(super) members: Vec<SwarmMember>,
    pub(super) chunk_size: u32,
    /// Swarm peers of this member (either names the other in `connect_to`).
    pub(super) linked: Vec<bool>,
    /// Peers the node was told about (connection up).
    pub(super) connected: Vec<bool>,
    /// Verified pieces, to serve them: in memory until stored, then (with `disk`) read back.
    pub(super) held: Vec<Option<Held>>,
    /// The file the pieces are served from once stored (the source's input, an agent's copy);
    /// none for a directory, whose pieces stay in memory.
    pub(super) disk: Option<Disk>,
    /// Bytes of pieces handed to the store and not yet stored.
    pub(super) unstored: u64,
    pub(super) conns: HashMap<NodeId, Conn>,
    pub(super) ev_tx: mpsc::Sender<Ev>,
    pub(super) ev_rx: mpsc::Receiver<Ev>,
    /// Bytes of verified pieces received per peer.
    pub(super) received: Vec<u64>,
    pub(super) store: Option<Store>,
    pub(super) stored: u64,
    pub(super) finalize_sent: bool,
    pub(super) finalized: bool,
    pub(super) reported: bool,
    pub(super) copy_failed: Option<String>,
    /// The source closed the set-up connection.
    pub(super) source_gone: bool,
    pub(super) fatal: Option<String>,
    pub(super) dials: Vec<JoinHandle<()>>,
    /// Connections from members that are not (yet) back in the session here: held until the
    /// source says they are ([`SwarmSetup::Back`]).
    pub(super) early: Vec<(NodeId, Stream)>,
}

impl Net {
    pub(super) fn new(
        open: &SwarmOpen,
        me: NodeId,
        keys: Keys,
        hashes: PieceHashes,
        tuning: TcpTuning,
        held: Vec<Option<Held>>,
    ) -> Result<Net, SwarmError> {
        let n = open.members.len();
        if open
            .members
            .iter()
            .enumerate()
            .any(|(i, m)| m.node as usize != i)
        {
            return Err(SwarmError::SetUp(
                "members out of order in the set-up".into(),
            ));
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
            Some(
                Tree::from_parents(parents)
                    .map_err(|e| SwarmError::SetUp(format!("bad tree in the set-up: {e}")))?,
            )
        };
        let pieces = open.manifest.chunks(open.chunk_size).unwrap_or(0);
        let mut cfg = SwarmConfig::new(open.strategy, open.session, pieces);
        cfg.seed = open.seed;
        let now = Instant::now();
        let mut node = SwarmNode::new(cfg.clone(), keys.clone(), &labels, me, tree.as_ref(), now)
            .map_err(|e| SwarmError::SetUp(e.to_string()))?;
        if hashes.len() != pieces {
            return Err(SwarmError::SetUp(format!(
                "{} piece hashes for {pieces} pieces",
                hashes.len()
            )));
        }
        node.set_piece_hashes(hashes.clone());
        // Every member's initial connections, worked out as each member works them out.
        let mut linked = vec![false; n];
        for &j in node.connect_to() {
            linked[j] = true;
        }
        for j in (0..n).filter(|&j| j != me) {
            let other = SwarmNode::new(cfg.clone(), keys.clone(), &labels, j, tree.as_ref(), now)
                .map_err(|e| SwarmError::SetUp(e.to_string()))?;
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
            hashes,
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
            early: Vec::new(),
        })
    }

    /// Starts the reader and writer of the connection to `j`; the source's connections (and an
    /// agent's connection to the source) become swarm links here when the two are peers.
    pub(super) fn add_conn(&mut self, j: NodeId, stream: Stream) {
        if let Some(t) = stream.tcp() {
            if let Err(e) = transport::set_notsent_lowat(t, SOCKET_BACKLOG) {
                tracing::debug!("TCP_NOTSENT_LOWAT: {e}");
            }
        }
        let (r, w) = stream.into_split();
        let (out, rx) = Outbox::new();
        let reader = tokio::spawn(read_conn(
            r,
            j,
            (self.keys.clone(), self.hashes.clone()),
            self.session,
            self.ev_tx.clone(),
        ));
        let note = move |n| match n {
            Note::Written(w) => Ev::Written(j, w),
            // The peer stopped reading (it may have finished and closed first).
            Note::Failed(e) => Ev::WriteFailed(j, e),
        };
        let sock = SocketControl::default();
        let writer = tokio::spawn(write_conn(w, rx, None, sock, 0, self.ev_tx.clone(), note));
        self.conns.insert(
            j,
            Conn {
                out,
                reader,
                writer,
            },
        );
        if (j == 0 || self.me == 0) && self.linked[j] {
            self.link(j, Instant::now());
        }
    }

    pub(super) fn link(&mut self, j: NodeId, now: Instant) {
        self.linked[j] = true;
        self.connected[j] = true;
        self.node.handle_connected(j, now);
    }

    pub(super) fn dial(&mut self, j: NodeId, addr: String) {
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

    pub(super) fn tell_source(&mut self, f: Frame) {
        if let Some(c) = self.conns.get_mut(&0) {
            c.out.send(f);
        }
    }

    /// Done at an agent: copy in place and reported, and the session over.
    pub(super) fn finished(&self) -> bool {
        let over = self.node.is_all_done() || self.source_gone;
        let copy_done = (self.finalized && self.reported) || self.copy_failed.is_some();
        over && (copy_done || self.source_gone) && self.drained()
    }

    /// One debug line per connected peer: what arrived from it since the last call
    /// (`logged` holds the counts then) and the node's view of it.
    pub(super) fn log_peers(&self, logged: &mut [u64], now: Instant) {
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
    pub(super) fn drained(&self) -> bool {
        self.conns.values().all(|c| c.out.has_room())
    }

    pub(super) fn handle(&mut self, ev: Ev, now: Instant) {
        match ev {
            Ev::Written(j, done) => {
                if let Some(c) = self.conns.get_mut(&j) {
                    c.out.handle_written(done);
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
                Frame::SwarmSetup(SwarmSetup::Back { node })
                    if j == 0 && self.me != 0 && (node as usize) < self.members.len() =>
                {
                    self.member_back(node as NodeId, now);
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
    pub(super) fn keep(&mut self, c: Chunk) {
        let i = c.index as usize;
        if self.held[i].is_some() {
            return;
        }
        if let Some(s) = &self.store {
            crate::metrics::global().chunk_verified(c.data.len());
            s.write(
                c.index,
                c.index * self.chunk_size as u64,
                c.data.clone(),
                c.hash,
            );
            self.unstored += c.data.len() as u64;
        }
        self.held[i] = Some(Held::Mem(c));
    }

    pub(super) fn handle_store(&mut self, ev: StoreEvent) {
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
                self.copy_failed = Some(e.to_string());
                self.tell_source(Frame::Failed {
                    node: self.me as u32,
                    reason: e.to_string(),
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
                self.copy_failed = Some(e.to_string());
                self.tell_source(Frame::Failed {
                    node: self.me as u32,
                    reason: e.to_string(),
                });
            }
        }
    }

    /// Member `j` left the session for good: the node redistributes its share and its place
    /// in the completion tree; the source tells every other member.
    pub(super) fn member_lost(&mut self, j: NodeId, now: Instant) {
        if j == self.me {
            return;
        }
        if let Some(c) = self.conns.remove(&j) {
            c.reader.abort();
        }
        self.connected[j] = false;
        self.node.handle_member_lost(j, now);
        if self.me == 0 {
            for c in self.conns.values_mut() {
                c.out
                    .send(Frame::SwarmSetup(SwarmSetup::Lost { node: j as u32 }));
            }
        }
    }

    /// Member `j`, lost before, is back (the source reached it again): the node takes it
    /// back; the lower id of a linked pair dials it again, a connection it made already is
    /// taken. At the member itself (told it is back) its set-up connection becomes a swarm link
    /// if it was not: it reports to the source.
    pub(super) fn member_back(&mut self, j: NodeId, now: Instant) {
        self.node.handle_member_back(j, now);
        if j == self.me {
            if !self.connected[0] && self.conns.contains_key(&0) {
                self.link(0, now);
            }
            return;
        }
        if let Some(at) = self.early.iter().position(|e| e.0 == j) {
            let (_, s) = self.early.swap_remove(at);
            self.add_conn(j, s);
            self.link(j, now);
        } else if self.linked[j] && self.me != 0 && self.me < j && !self.conns.contains_key(&j) {
            let addr = self.members[j].addr.clone();
            self.dial(j, addr);
        }
    }

    /// A member's connection to this one (its `Peer` frame read): taken if the member is in
    /// the session here, held if it is not yet back (its connection may come before the
    /// source's word), refused otherwise.
    pub(super) fn accept_peer(&mut self, j: NodeId, s: Stream, now: Instant) {
        if j == 0 || j >= self.members.len() || j == self.me || self.conns.contains_key(&j) {
            tracing::warn!(
                "swarm session {:016x}: refused a connection claiming node {j}",
                self.session
            );
        } else if !self.node.is_alive(j) {
            self.early.retain(|e| e.0 != j);
            self.early.push((j, s));
        } else {
            self.add_conn(j, s);
            self.link(j, now);
        }
    }

    pub(super) fn drop_conn(&mut self, j: NodeId, why: &str, now: Instant) {
        tracing::warn!("swarm {:016x}: dropping node {j}: {why}", self.session);
        if let Some(mut c) = self.conns.remove(&j) {
            c.reader.abort();
            c.out.send(Frame::Error { reason: why.into() });
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
    pub(super) fn after_input(&mut self, now: Instant) {
        while let Some(ev) = self.node.poll_event() {
            match ev {
                SwarmEvent::Piece { from, chunk } => {
                    self.received[from] += chunk.data.len() as u64;
                    self.keep(chunk);
                }
                SwarmEvent::Corrupt { from, index, error } => {
                    tracing::warn!(
                        "swarm {:016x}: piece {index} from node {from} ({}) rejected ({error})",
                        self.session,
                        self.members[from].name
                    );
                    // Connections are authenticated and encrypted: a bad piece was made so.
                    let why = format!("it sent piece {index} that does not verify ({error})");
                    self.drop_conn(from, &why, now);
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
                c.out.send(f);
            }
            while c.out.has_room() {
                let f = match self.node.poll_transmit(j, now) {
                    Some(Transmit::Frame(f)) => {
                        c.out.send(f);
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
                if !c.out.send(f) {
                    break;
                }
            }
            if let Some(e) = missing {
                self.fatal = Some(e);
            }
        }
    }

    /// Ends every connection once its writer has sent what it holds.
    pub(super) async fn close(&mut self) {
        for d in self.dials.drain(..) {
            d.abort();
        }
        let conns: Vec<Conn> = self.conns.drain().map(|(_, c)| c).collect();
        let mut writers = Vec::new();
        for c in conns {
            c.reader.abort();
            drop(c.out);
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

pub(super) async fn read_conn<R: AsyncRead + Unpin>(
    mut r: R,
    j: NodeId,
    (keys, hashes): (Keys, PieceHashes),
    session: SessionId,
    tx: mpsc::Sender<Ev>,
) {
    loop {
        let ev = match transport::read_frame(&mut r, wire::MAX_FRAME).await {
            Ok(Some(Frame::Chunk(c))) => match hashes.verify(&keys, session, &c) {
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

/// `first` and up to 63 more events already queued behind it, taken in one go.
pub(super) fn with_queued(first: Ev, rx: &mut mpsc::Receiver<Ev>) -> Vec<Ev> {
    let mut batch = vec![first];
    while batch.len() < 64 {
        match rx.try_recv() {
            Ok(e) => batch.push(e),
            Err(_) => break,
        }
    }
    batch
}
