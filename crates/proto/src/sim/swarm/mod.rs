//! A multi-cluster network on a simulated clock, for comparing the swarm strategies.
//!
//! The network is the MOB paper's model (its Figure 1): nodes sit in clusters; each node has
//! an access link (uplink and downlink, each a rate); each ordered pair of clusters has a WAN
//! link (a rate, shared by every flow from the one cluster to the other, and a one-way
//! latency). A message from a to b is served, store and forward, by a's uplink, then (between
//! clusters) the WAN link and its latency, then b's downlink; within a cluster by a's uplink,
//! the LAN latency and b's downlink. Each resource serves its queue in arrival order, so flows
//! that share it share its rate in proportion to what they offer. Each connection (a, b) holds
//! at most a window of bytes sent and not yet delivered (what the network driver commits: one
//! piece in its writer, the socket's unsent backlog, the congestion window), which is how a
//! slow path back-pressures its sender, as in [`crate::sim`]. Control frames are not held to
//! the window, as the driver does not hold them.
//!
//! Control frames cross the network encoded and are decoded on arrival, so the wire format is
//! exercised. Pieces are real chunks sealed by the source and verified at every hop when
//! [`SwarmSimSpec::data`] is set (the tests), or stand-ins of the right size passed to
//! [`SwarmNode::handle_verified_piece`] otherwise (the example, which moves 600 MB sixty
//! times). Time jumps from event to event; a seed gives the same run every time.
//!
//! The plan is declarative: a [`Topology`] (with [`Condition`]s for the paper's five WAN
//! scenarios), WAN rate changes at given times, members lost at given times. The session's
//! membership service is the simulator itself: when a node disappears, its connections drop
//! at once and every member is told ([`SwarmNode::handle_member_lost`]). A lost member whose
//! agent comes back ([`SwarmSimSpec::back`]) is dialled again by the source's session and
//! re-admitted (faults.rs); with [`SwarmSimSpec::host_keys`] pieces are checked against the
//! source's signed piece list, and a member may forge ([`SwarmSimSpec::forger`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::auth::{Keys, Secret};
use crate::chunkmap::ChunkMap;
use crate::swarm::session::{Outcome, SourceSession};
use crate::swarm::{Strategy, SwarmConfig, SwarmEvent, SwarmNode, Transmit};
use crate::tree::{NodeId, Tree};
use crate::wire::{self, Chunk, Frame};

mod faults;
mod topology;
pub use topology::*;

/// A declarative simulation plan.
#[derive(Debug, Clone)]
pub struct SwarmSimSpec {
    /// The network at the start.
    pub topology: Topology,
    /// Strategy and its settings (`pieces` and `session` are set from the object).
    pub config: SwarmConfig,
    /// Object length in bytes.
    pub object_len: u64,
    /// Piece (chunk) length in bytes.
    pub piece_len: u32,
    /// The planned tree (tree push and the hybrid).
    pub tree: Tree,
    /// WAN rate changes.
    pub wan_changes: Vec<WanChange>,
    /// Members that disappear at the given times.
    pub lost: Vec<(Duration, NodeId)>,
    /// Members that stop at the given times with their connections up: they read, answer
    /// and send nothing more (a hung process).
    pub frozen: Vec<(Duration, NodeId)>,
    /// Run the source's [`SourceSession`] with this stall timeout: the run then ends when
    /// the session does, as the driver's does. Receivers' progress and reports reach it at
    /// once (the set-up connections are not simulated). `None`: no session, the run ends
    /// when the completion tree is done.
    pub stall_timeout: Option<Duration>,
    /// Pieces a member's copy already holds from an earlier session of the same object (it
    /// resumes, [`SwarmNode::resume`]): with [`SwarmSimSpec::data`], sealed again for this
    /// session, as a member re-seals what it reads back.
    pub held: Vec<(NodeId, Vec<(u64, u64)>)>,
    /// Move real sealed bytes and verify them at every hop.
    pub data: bool,
    /// Members of [`SwarmSimSpec::lost`] whose agent is up again at the given time, with what
    /// it had stored: the source's session dials them again ([`SourceSession::poll_redial`])
    /// and re-admits them ([`SwarmNode::handle_member_back`]). Needs a stall timeout.
    pub back: Vec<(Duration, NodeId)>,
    /// With [`SwarmSimSpec::data`]: host keys. The source has a push key and lists the pieces'
    /// hashes ([`crate::swarm::PieceHashes`]), receivers have relay keys, require the source,
    /// and check every piece against the list; a kept piece is sealed by its member's key.
    pub host_keys: bool,
    /// With host keys: this member serves forged pieces (other bytes, sealed and signed with
    /// its own key). Its peers refuse them, drop their connection to it, and fetch elsewhere.
    pub forger: Option<NodeId>,
    /// Seed for the data and the strategy's random choices.
    pub seed: u64,
    /// The run stops here whatever happened.
    pub time_limit: Duration,
}

impl SwarmSimSpec {
    /// A plan over `topology` with the strategy's default settings, 256 KiB pieces, the
    /// planned tree of [`plan_tree`], no changes, no losses, stand-in pieces.
    pub fn new(topology: Topology, strategy: Strategy, object_len: u64) -> Self {
        let tree = plan_tree(&topology);
        Self {
            topology,
            config: SwarmConfig::new(strategy, 77, 0),
            object_len,
            piece_len: 256 << 10,
            tree,
            wan_changes: Vec::new(),
            lost: Vec::new(),
            frozen: Vec::new(),
            stall_timeout: None,
            held: Vec::new(),
            data: false,
            back: Vec::new(),
            host_keys: false,
            forger: None,
            seed: 1,
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SwarmSimReport {
    /// The strategy that ran.
    pub strategy: Strategy,
    /// Object length.
    pub object_len: u64,
    /// Per node, when it held every piece (the source: zero).
    pub done_at: Vec<Option<Duration>>,
    /// Per node, whether it was lost during the run.
    pub lost: Vec<bool>,
    /// The completion tree reported every live member done (`AllDone` at its root).
    pub all_done: bool,
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// Per node, piece bytes received from each peer (duplicates included).
    pub received_from: Vec<BTreeMap<NodeId, u64>>,
    /// Piece bytes that entered each cluster over the WAN.
    pub wan_into: Vec<u64>,
    /// `wan_bytes[x][y]`: piece bytes carried from cluster x to cluster y.
    pub wan_bytes: Vec<Vec<u64>>,
    /// `entries[c][i]`: how many times piece i entered cluster c over the WAN.
    pub entries: Vec<Vec<u32>>,
    /// `wan_timeline[x][y][s]`: piece bytes carried from cluster x to cluster y that arrived
    /// during second s of the run (for utilisation over time).
    pub wan_timeline: Vec<Vec<Vec<u64>>>,
    /// Per node: with data, the copy holds every piece, verified, equal to the object;
    /// without, it holds every piece.
    pub verified: Vec<bool>,
    /// Pieces that arrived at a node that already held them.
    pub duplicates: u64,
    /// `arrivals[n][i]`: how many times piece i arrived at node n (a member that resumed
    /// should never be sent a piece it kept).
    pub arrivals: Vec<Vec<u32>>,
    /// Bytes of control frames sent.
    pub control_bytes: u64,
    /// With [`SwarmSimSpec::stall_timeout`]: what the source's session made of each
    /// receiver (index 0, the source, stays `None`); empty without.
    pub outcomes: Vec<Option<Outcome>>,
    /// Pieces refused at verification: (receiver, sender, piece).
    pub refused: Vec<(NodeId, NodeId, u64)>,
    /// Members re-admitted after they were lost, in order.
    pub readmitted: Vec<NodeId>,
    /// With data: every piece any member stored is the object's (complete or not).
    pub intact: bool,
}

impl SwarmSimReport {
    /// Live receivers that did not finish.
    pub fn incomplete(&self) -> Vec<NodeId> {
        (1..self.done_at.len())
            .filter(|&i| !self.lost[i] && self.done_at[i].is_none())
            .collect()
    }

    /// When the last live receiver finished (`None` if one did not).
    pub fn last_done(&self) -> Option<Duration> {
        if !self.incomplete().is_empty() {
            return None;
        }
        (1..self.done_at.len())
            .filter(|&i| !self.lost[i])
            .filter_map(|i| self.done_at[i])
            .max()
    }

    /// Object size over the time until the last live receiver finished, bytes per second
    /// (0 if one did not).
    pub fn throughput(&self) -> f64 {
        self.last_done()
            .map_or(0.0, |t| self.object_len as f64 / t.as_secs_f64().max(1e-9))
    }

    /// WAN bytes into each cluster as multiples of the object size.
    pub fn wan_multiples(&self) -> Vec<f64> {
        self.wan_into
            .iter()
            .map(|&b| b as f64 / self.object_len.max(1) as f64)
            .collect()
    }
}

#[derive(Debug)]
enum Payload {
    Wire(Vec<u8>),
    Piece(u64, Option<Chunk>),
}

#[derive(Debug)]
struct Msg {
    from: NodeId,
    to: NodeId,
    bytes: u64,
    payload: Payload,
    hops: [usize; 3],
    /// Latency after each hop.
    after: [Duration; 3],
    nhops: usize,
    hop: usize,
    /// The incarnations of sender and receiver when it was sent: a member that came back does
    /// not get what its lost instance was sent.
    inc: (u32, u32),
}

#[derive(Debug)]
struct Server {
    rate: f64,
    queue: VecDeque<usize>,
    busy: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Change(usize),
    Loss(usize),
    HopDone(usize),
    Arrive(usize),
    Timer(NodeId),
    Freeze(usize),
    /// The source session's timers (stall, tries to reach a member again).
    Stall,
    /// A lost member's agent is up again (index into `back`).
    Back(usize),
}

struct SimNode {
    node: SwarmNode,
    alive: bool,
    /// Hung: it handles nothing more, its connections stay up.
    frozen: bool,
    timer: Option<Instant>,
    store: Vec<Option<Chunk>>,
    keys: Keys,
    /// How many times it was re-admitted.
    inc: u32,
    /// Lost, and its agent is up again: the source may reach it.
    restarted: bool,
}

/// Runs a plan to the end: the completion tree reports everyone done, nothing can happen any
/// more, or the time limit.
pub fn run(spec: SwarmSimSpec) -> SwarmSimReport {
    Sim::new(spec).run()
}

struct Sim {
    spec: SwarmSimSpec,
    start: Instant,
    now: Instant,
    pieces: u64,
    labels: Vec<u32>,
    nodes: Vec<SimNode>,
    servers: Vec<Server>,
    msgs: Vec<Option<Msg>>,
    free: Vec<usize>,
    heap: BinaryHeap<Reverse<(Instant, u64, Ev)>>,
    seq: u64,
    inflight: HashMap<(NodeId, NodeId), u64>,
    dirty: Vec<bool>,
    dirty_list: Vec<NodeId>,
    object: Vec<u8>,
    report: SwarmSimReport,
    /// The source's session (with [`SwarmSimSpec::stall_timeout`]).
    session: Option<SourceSession>,
    /// When the stall timer is set for.
    stall_at: Option<Instant>,
    /// With host keys: the source's piece list, given to every member.
    hashes: Option<crate::swarm::PieceHashes>,
    /// Connections cut for a forged piece (either order).
    cut: std::collections::HashSet<(NodeId, NodeId)>,
}

impl Sim {
    fn new(mut spec: SwarmSimSpec) -> Self {
        let start = Instant::now();
        let topo = &spec.topology;
        let n = topo.nodes();
        let c = topo.clusters.len();
        let pieces = spec.object_len.div_ceil(spec.piece_len as u64);
        spec.config.pieces = pieces;
        spec.config.seed = spec.seed;
        let labels = topo.labels();
        let mut rng = SmallRng::seed_from_u64(spec.seed);
        let object: Vec<u8> = if spec.data {
            (0..spec.object_len).map(|_| rng.gen()).collect()
        } else {
            Vec::new()
        };
        let hashes = (spec.host_keys && spec.data).then(|| {
            crate::swarm::PieceHashes::new(
                object
                    .chunks(spec.piece_len as usize)
                    .map(|c| *blake3::hash(c).as_bytes())
                    .collect(),
            )
        });
        let nodes = (0..n)
            .map(|i| {
                let keys = faults::keys_of(&spec, n, i);
                let mut node = SwarmNode::new(
                    spec.config.clone(),
                    keys.clone(),
                    &labels,
                    i,
                    Some(&spec.tree),
                    start,
                )
                .expect("valid simulation plan");
                if let Some(h) = &hashes {
                    node.set_piece_hashes(h.clone());
                }
                let held = spec.held.iter().find(|h| h.0 == i).map(|h| {
                    let map = ChunkMap::from_ranges(&h.1, pieces);
                    node.resume(&map);
                    map
                });
                let mut store = vec![None; if spec.data { pieces as usize } else { 0 }];
                if spec.data && (i == 0 || held.is_some()) {
                    for (k, s) in store.iter_mut().enumerate() {
                        if held.as_ref().is_some_and(|h| !h.contains(k as u64)) {
                            continue;
                        }
                        let lo = k * spec.piece_len as usize;
                        let hi = (lo + spec.piece_len as usize).min(object.len());
                        *s = Some(keys.seal(
                            spec.config.session,
                            k as u64,
                            Bytes::copy_from_slice(&object[lo..hi]),
                        ));
                    }
                }
                SimNode {
                    node,
                    alive: true,
                    frozen: false,
                    timer: None,
                    store,
                    keys,
                    inc: 0,
                    restarted: false,
                }
            })
            .collect();
        let servers = servers_of(topo);
        let report = SwarmSimReport::empty(&spec, n, c, pieces);
        let session = spec.stall_timeout.map(|t| SourceSession::new(n, t, start));
        Self {
            spec,
            start,
            now: start,
            pieces,
            labels,
            nodes,
            servers,
            msgs: Vec::new(),
            free: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            inflight: HashMap::new(),
            dirty: vec![false; n],
            dirty_list: Vec::new(),
            object,
            report,
            session,
            stall_at: None,
            hashes,
            cut: Default::default(),
        }
    }

    fn cluster(&self, n: NodeId) -> usize {
        self.labels[n] as usize
    }

    fn at(&mut self, t: Instant, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn mark(&mut self, n: NodeId) {
        if !self.dirty[n] {
            self.dirty[n] = true;
            self.dirty_list.push(n);
        }
    }

    fn run(mut self) -> SwarmSimReport {
        let n = self.nodes.len();
        for i in 0..self.spec.wan_changes.len() {
            let t = self.start + self.spec.wan_changes[i].at;
            self.at(t, Ev::Change(i));
        }
        for i in 0..self.spec.lost.len() {
            let t = self.start + self.spec.lost[i].0;
            self.at(t, Ev::Loss(i));
        }
        for i in 0..self.spec.frozen.len() {
            let t = self.start + self.spec.frozen[i].0;
            self.at(t, Ev::Freeze(i));
        }
        for i in 0..self.spec.back.len() {
            let t = self.start + self.spec.back[i].0;
            self.at(t, Ev::Back(i));
        }
        self.report.done_at[0] = Some(Duration::ZERO);
        for a in 0..n {
            for b in self.nodes[a].node.connect_to().to_vec() {
                self.connect(a, b);
            }
        }
        for a in 0..n {
            self.mark(a);
        }
        self.settle();
        let limit = self.start + self.spec.time_limit;
        while !self.over() {
            let Some(Reverse((t, _, ev))) = self.heap.pop() else {
                break;
            };
            if t > limit {
                self.now = limit;
                break;
            }
            self.now = self.now.max(t);
            self.event(ev);
            self.settle();
            self.set_stall_timer();
        }
        self.finish()
    }

    /// The source's part is over: its session (if it runs one) or the completion tree.
    fn over(&self) -> bool {
        match &self.session {
            Some(s) => s.is_over(self.report.all_done),
            None => self.report.all_done,
        }
    }

    fn set_stall_timer(&mut self) {
        let t = self.session.as_ref().and_then(SourceSession::poll_timeout);
        if let Some(at) = t.filter(|_| t != self.stall_at) {
            self.stall_at = t;
            self.at(at, Ev::Stall);
        }
    }

    fn connect(&mut self, a: NodeId, b: NodeId) {
        if a == b || !self.nodes[a].alive || !self.nodes[b].alive {
            return;
        }
        let now = self.now;
        self.nodes[a].node.handle_connected(b, now);
        self.nodes[b].node.handle_connected(a, now);
        self.mark(a);
        self.mark(b);
    }

    fn window(&self, a: NodeId, b: NodeId) -> u64 {
        let topo = &self.spec.topology;
        let (x, y) = (self.cluster(a), self.cluster(b));
        let (rate, rtt) = if x == y {
            (topo.access_up.min(topo.access_down), 2 * topo.lan_latency)
        } else {
            (topo.wan[x][y], 2 * topo.wan_latency)
        };
        let bdp = (rate * rtt.as_secs_f64()) as u64;
        // As the network driver commits them: one piece queued to the writer, up to 128 KiB
        // unsent in the socket, and the congestion window in flight.
        self.spec.piece_len as u64 + 128 + (128 << 10) + 2 * bdp
    }

    fn event(&mut self, ev: Ev) {
        match ev {
            Ev::Change(i) => {
                let ch = self.spec.wan_changes[i];
                let c = self.spec.topology.clusters.len();
                let n = self.nodes.len();
                self.servers[2 * n + ch.from * c + ch.to].rate = ch.rate.max(1.0);
            }
            Ev::Loss(i) => {
                let (_, k) = self.spec.lost[i];
                if k < self.nodes.len() && self.nodes[k].alive {
                    self.nodes[k].alive = false;
                    self.report.lost[k] = true;
                    let comes_back = self.spec.back.iter().any(|b| b.1 == k);
                    if let Some(s) = &mut self.session {
                        if comes_back {
                            s.handle_dropped(k, "connection lost".into(), self.now);
                        } else {
                            s.handle_lost(k, "lost".into());
                        }
                    }
                    let now = self.now;
                    for j in 0..self.nodes.len() {
                        if self.nodes[j].alive {
                            self.nodes[j].node.handle_member_lost(k, now);
                            self.mark(j);
                        }
                    }
                }
            }
            Ev::HopDone(s) => {
                let Some(m) = self.servers[s].queue.pop_front() else {
                    return;
                };
                self.servers[s].busy = false;
                let (hop, nhops, after) = {
                    let msg = self.msgs[m].as_mut().expect("queued message exists");
                    let hop = msg.hop;
                    msg.hop += 1;
                    (hop, msg.nhops, msg.after[hop])
                };
                let t = self.now + after;
                if hop + 1 == nhops && after.is_zero() {
                    self.deliver(m);
                } else {
                    self.at(t, Ev::Arrive(m));
                }
                self.serve(s);
            }
            Ev::Arrive(m) => {
                let (hop, nhops, server) = {
                    let msg = self.msgs[m].as_ref().expect("message in flight");
                    (msg.hop, msg.nhops, msg.hops[msg.hop.min(2)])
                };
                if hop == nhops {
                    self.deliver(m);
                } else {
                    self.servers[server].queue.push_back(m);
                    self.serve(server);
                }
            }
            Ev::Freeze(i) => {
                let (_, k) = self.spec.frozen[i];
                if let Some(sn) = self.nodes.get_mut(k) {
                    sn.frozen = true;
                }
            }
            Ev::Stall => self.session_timers(),
            Ev::Back(i) => {
                let k = self.spec.back[i].1;
                if let Some(sn) = self.nodes.get_mut(k).filter(|sn| !sn.alive) {
                    sn.restarted = true;
                }
            }
            Ev::Timer(k) => {
                let now = self.now;
                let sn = &mut self.nodes[k];
                if sn.alive && !sn.frozen && sn.timer.is_some_and(|t| t <= now) {
                    sn.timer = None;
                    sn.node.handle_timeout(now);
                    self.mark(k);
                }
            }
        }
    }

    fn serve(&mut self, s: usize) {
        if self.servers[s].busy {
            return;
        }
        let Some(&m) = self.servers[s].queue.front() else {
            return;
        };
        let bytes = self.msgs[m].as_ref().map_or(0, |x| x.bytes);
        self.servers[s].busy = true;
        let t = self.now + Duration::from_secs_f64(bytes as f64 / self.servers[s].rate);
        self.at(t, Ev::HopDone(s));
    }

    fn send(&mut self, a: NodeId, b: NodeId, t: Transmit) {
        let (bytes, payload) = match t {
            Transmit::Frame(f) => {
                let v = f.encode().to_vec();
                self.report.control_bytes += v.len() as u64;
                (v.len() as u64, Payload::Wire(v))
            }
            Transmit::Piece(i) => {
                let len = self.piece_len(i);
                let chunk = if self.spec.data {
                    let c = self.nodes[a].store[i as usize].clone();
                    assert!(
                        c.is_some(),
                        "node {a} asked to send piece {i} it does not store"
                    );
                    if self.spec.forger == Some(a) {
                        c.map(|c| self.forge(a, c))
                    } else {
                        c
                    }
                } else {
                    None
                };
                (
                    (wire::HEADER_LEN + 8 + 64) as u64 + len,
                    Payload::Piece(i, chunk),
                )
            }
        };
        *self.inflight.entry((a, b)).or_insert(0) += bytes;
        let n = self.nodes.len();
        let c = self.spec.topology.clusters.len();
        let (x, y) = (self.cluster(a), self.cluster(b));
        let topo = &self.spec.topology;
        let (hops, after, nhops) = if x == y {
            (
                [a, n + b, 0],
                [topo.lan_latency, Duration::ZERO, Duration::ZERO],
                2,
            )
        } else {
            (
                [a, 2 * n + x * c + y, n + b],
                [Duration::ZERO, topo.wan_latency, Duration::ZERO],
                3,
            )
        };
        let msg = Msg {
            from: a,
            to: b,
            bytes,
            payload,
            hops,
            after,
            nhops,
            hop: 0,
            inc: (self.nodes[a].inc, self.nodes[b].inc),
        };
        let m = match self.free.pop() {
            Some(m) => {
                self.msgs[m] = Some(msg);
                m
            }
            None => {
                self.msgs.push(Some(msg));
                self.msgs.len() - 1
            }
        };
        self.servers[a].queue.push_back(m);
        self.serve(a);
    }

    fn piece_len(&self, i: u64) -> u64 {
        let pl = self.spec.piece_len as u64;
        (self.spec.object_len - i * pl).min(pl)
    }

    fn deliver(&mut self, m: usize) {
        let Some(msg) = self.msgs[m].take() else {
            return;
        };
        self.free.push(m);
        let (a, b) = (msg.from, msg.to);
        if self.nodes[b].frozen {
            // Never read: what it was sent stays in flight, the sender's window full.
            return;
        }
        if let Some(x) = self.inflight.get_mut(&(a, b)) {
            *x = x.saturating_sub(msg.bytes);
        }
        self.mark(a);
        if !self.nodes[a].alive
            || !self.nodes[b].alive
            || msg.inc != (self.nodes[a].inc, self.nodes[b].inc)
            || self.cut.contains(&(a.min(b), a.max(b)))
        {
            return;
        }
        let now = self.now;
        let res = match msg.payload {
            Payload::Wire(v) => {
                let frame = match wire::decode_from(&mut BytesMut::from(&v[..]), wire::MAX_FRAME) {
                    Ok(Some(f)) => f,
                    other => panic!("node {b}: undecodable frame from {a}: {other:?}"),
                };
                self.nodes[b].node.handle_frame(a, frame, now)
            }
            Payload::Piece(i, chunk) => {
                let len = self.piece_len(i);
                if let Some(s) = &mut self.session {
                    s.handle_progress(b, now);
                }
                *self.report.received_from[b].entry(a).or_insert(0) += len;
                self.report.arrivals[b][i as usize] += 1;
                let (x, y) = (self.cluster(a), self.cluster(b));
                if x != y {
                    self.report.wan_into[y] += len;
                    self.report.wan_bytes[x][y] += len;
                    self.report.entries[y][i as usize] += 1;
                    let sec = (now - self.start).as_secs() as usize;
                    let tl = &mut self.report.wan_timeline[x][y];
                    if tl.len() <= sec {
                        tl.resize(sec + 1, 0);
                    }
                    tl[sec] += len;
                }
                match chunk {
                    Some(c) => self.nodes[b].node.handle_frame(a, Frame::Chunk(c), now),
                    None => self.nodes[b].node.handle_verified_piece(a, i, now),
                }
            }
        };
        if let Err(e) = res {
            panic!("node {b}: protocol error from {a}: {e}");
        }
        self.mark(b);
    }

    fn settle(&mut self) {
        let mut rounds = 0u64;
        while let Some(k) = self.dirty_list.pop() {
            self.dirty[k] = false;
            self.pump(k);
            rounds += 1;
            assert!(rounds < 50_000_000, "simulation did not settle (livelock)");
        }
    }

    fn pump(&mut self, k: NodeId) {
        if !self.nodes[k].alive || self.nodes[k].frozen {
            return;
        }
        let now = self.now;
        loop {
            let mut moved = false;
            // Events first: a piece just verified is stored before it can be asked for.
            while let Some(ev) = self.nodes[k].node.poll_event() {
                moved = true;
                self.node_event(k, ev);
            }
            let peers: Vec<NodeId> = self.nodes[k].node.peers().collect();
            for p in peers {
                if !self.nodes[p].alive {
                    continue;
                }
                // As the driver does: control frames go out whether or not the window is full.
                while let Some(f) = self.nodes[k].node.poll_control(p, now) {
                    self.send(k, p, Transmit::Frame(f));
                    moved = true;
                }
                let w = self.window(k, p);
                while self.inflight.get(&(k, p)).copied().unwrap_or(0) < w {
                    let Some(t) = self.nodes[k].node.poll_transmit(p, now) else {
                        break;
                    };
                    self.send(k, p, t);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        let t = self.nodes[k].node.poll_timeout();
        if let Some(t) = t {
            if self.nodes[k].timer.is_none_or(|x| x != t) {
                self.nodes[k].timer = Some(t);
                self.at(t.max(now), Ev::Timer(k));
            }
        } else {
            self.nodes[k].timer = None;
        }
    }

    fn node_event(&mut self, k: NodeId, ev: SwarmEvent) {
        match ev {
            SwarmEvent::Piece { chunk, .. } => {
                let i = chunk.index as usize;
                if let Some(s) = self.nodes[k].store.get_mut(i) {
                    s.get_or_insert(chunk);
                }
            }
            SwarmEvent::Corrupt { from, index, error } => {
                assert!(
                    self.spec.forger == Some(from),
                    "node {k}: piece {index} from {from} failed verification: {error}"
                );
                self.refused(k, from, index);
            }
            SwarmEvent::Connect { peer } => self.connect(k, peer),
            SwarmEvent::Complete => {
                self.report.done_at[k].get_or_insert(self.now - self.start);
                if let Some(s) = &mut self.session {
                    let received = self.report.received_from[k]
                        .iter()
                        .map(|(&p, &b)| (p as u32, b))
                        .collect();
                    s.handle_report(k, received, self.now);
                }
            }
            SwarmEvent::AllDone => {
                let root = (0..self.nodes.len()).find(|&j| self.nodes[j].alive);
                if root == Some(k) {
                    self.report.all_done = true;
                    if let Some(s) = &mut self.session {
                        s.give_up_away("every other member had finished");
                    }
                }
            }
        }
    }

    fn finish(mut self) -> SwarmSimReport {
        self.report.elapsed = self.now - self.start;
        if let Some(s) = &self.session {
            self.report.outcomes = (0..self.nodes.len())
                .map(|j| s.outcome(j).cloned())
                .collect();
        }
        let pl = self.spec.piece_len as usize;
        for (k, sn) in self.nodes.iter().enumerate() {
            self.report.duplicates += sn.node.duplicates();
            let whole = sn.node.have().len() == self.pieces;
            self.report.intact &= sn.store.iter().enumerate().all(|(i, c)| {
                c.as_ref().is_none_or(|c| {
                    let lo = i * pl;
                    c.data[..] == self.object[lo..(lo + pl).min(self.object.len())]
                })
            });
            self.report.verified[k] = whole
                && (!self.spec.data
                    || sn.store.iter().enumerate().all(|(i, c)| {
                        c.as_ref().is_some_and(|c| {
                            let lo = i * pl;
                            let hi = (lo + pl).min(self.object.len());
                            c.data[..] == self.object[lo..hi]
                        })
                    }));
        }
        self.report
    }
}

/// The simulated links: every node's access up, then down, then each cluster pair's WAN.
fn servers_of(topo: &Topology) -> Vec<Server> {
    let (n, c) = (topo.nodes(), topo.clusters.len());
    let mut servers: Vec<Server> = Vec::with_capacity(2 * n + c * c);
    for _ in 0..n {
        servers.push(Server {
            rate: topo.access_up,
            queue: VecDeque::new(),
            busy: false,
        });
    }
    for _ in 0..n {
        servers.push(Server {
            rate: topo.access_down,
            queue: VecDeque::new(),
            busy: false,
        });
    }
    for x in 0..c {
        for y in 0..c {
            servers.push(Server {
                rate: topo.wan[x][y].max(1.0),
                queue: VecDeque::new(),
                busy: false,
            });
        }
    }
    servers
}

impl SwarmSimReport {
    /// Nothing done yet, for `n` nodes in `c` clusters and `pieces` pieces.
    fn empty(spec: &SwarmSimSpec, n: usize, c: usize, pieces: u64) -> Self {
        SwarmSimReport {
            strategy: spec.config.strategy,
            object_len: spec.object_len,
            done_at: vec![None; n],
            lost: vec![false; n],
            all_done: false,
            elapsed: Duration::ZERO,
            received_from: vec![BTreeMap::new(); n],
            wan_into: vec![0; c],
            wan_bytes: vec![vec![0; c]; c],
            entries: vec![vec![0; pieces as usize]; c],
            wan_timeline: vec![vec![Vec::new(); c]; c],
            verified: vec![false; n],
            duplicates: 0,
            arrivals: vec![vec![0; pieces as usize]; n],
            control_bytes: 0,
            outcomes: Vec::new(),
            refused: Vec::new(),
            readmitted: Vec::new(),
            intact: true,
        }
    }
}
