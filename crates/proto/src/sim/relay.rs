//! An in-memory network on a simulated clock, for tests of every strategy.
//!
//! A [`Sim`] wires one [`Node`] per host by simulated links: each direction of a link is a
//! pipe that serializes frames at its rate, delays them by its latency, holds at most a
//! window of unread bytes (the socket buffers: a receiver that does not read stops its
//! sender, as TCP flow control does), and may corrupt chunk bytes. Frames cross the pipes
//! encoded, so the wire format is exercised too. Time advances from event to event, so a
//! transfer of minutes runs in milliseconds, and the same seed gives the same run.
//!
//! The plan is declarative, in the spirit of s2n-quic's simulation: a [`SimSpec`] says which
//! tree, which links, which faults and when; [`Sim::run`] returns a [`SimReport`] that tests
//! check.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::auth::{Keys, Secret};
use crate::manifest::{Manifest, ObjectKind};
use crate::node::{Event, Link, Named, Node, NodeConfig, SessionParams};
use crate::tree::{NodeId, Tree};
use crate::wire::{self, Frame};

mod faults;

/// One link's behaviour (both directions alike).
#[derive(Debug, Clone, Copy)]
pub struct LinkSpec {
    /// One-way delay.
    pub latency: Duration,
    /// Serialization rate in bytes per second.
    pub rate: f64,
    /// Probability that a chunk crossing the link (downwards) arrives corrupted.
    pub corrupt: f64,
    /// Unread bytes the link holds before its sender blocks (socket buffers).
    pub window: usize,
}

impl LinkSpec {
    /// A LAN hop: 0.1 ms, 1 Gbit/s.
    pub const LAN: LinkSpec = LinkSpec {
        latency: Duration::from_micros(100),
        rate: 125e6,
        corrupt: 0.0,
        window: 4 << 20,
    };

    /// A WAN hop with the given one-way delay and rate in Mbit/s; the window is two
    /// bandwidth-delay products, as TCP autotuning would grow it.
    pub fn wan(one_way_ms: u64, mbps: f64) -> LinkSpec {
        let rate = mbps * 1e6 / 8.0;
        let bdp = rate * 2.0 * one_way_ms as f64 / 1e3;
        LinkSpec {
            latency: Duration::from_millis(one_way_ms),
            rate,
            corrupt: 0.0,
            window: ((2.0 * bdp) as usize).max(256 << 10),
        }
    }
}

/// A declarative simulation plan.
#[derive(Debug, Clone)]
pub struct SimSpec {
    /// The distribution tree (node 0 is the source).
    pub tree: Tree,
    /// `links[i]` joins node `i` to its parent (`links[0]` is unused).
    pub links: Vec<LinkSpec>,
    /// Object length in bytes.
    pub len: u64,
    /// Send it as a stream of unknown length (the manifest carries no length).
    pub stream: bool,
    /// Chunk size.
    pub chunk_size: u32,
    /// Node settings (buffer budget, timeouts).
    pub node: NodeConfig,
    /// Session stall timeout.
    pub stall_timeout: Duration,
    /// Per node, how fast its disk stores (bytes/s); `None` is instant.
    pub store_rate: Vec<Option<f64>>,
    /// Nodes that stop reading and storing at the given time (a hung process).
    pub stalls: Vec<(NodeId, Duration)>,
    /// Stalled nodes that run again at the given time (SIGCONT after SIGSTOP).
    pub unstalls: Vec<(NodeId, Duration)>,
    /// Nodes whose process dies at the given time: every connection of theirs resets.
    pub kills: Vec<(NodeId, Duration)>,
    /// Nodes whose disk fills after this many bytes.
    pub disk_full: Vec<(NodeId, u64)>,
    /// Chunks corrupted on the way into the given node, once each.
    pub corrupt_chunks: Vec<(NodeId, u64)>,
    /// Relays that tamper with every n-th chunk they forward ([`NodeConfig::tamper_every`]).
    pub tamper: Vec<(NodeId, u64)>,
    /// Of those, the ones that corrupt every repair too ([`NodeConfig::tamper_repairs`]).
    pub tamper_repairs: Vec<NodeId>,
    /// Link rate changes: at time t, the link into node i runs at this many bytes/s.
    pub rate_changes: Vec<(Duration, NodeId, f64)>,
    /// The source's input has nothing to give from the first time to the second (a pipe
    /// whose producer pauses).
    pub input_pause: Option<(Duration, Duration)>,
    /// Chunk ranges a node's local copy already holds from an earlier session (it resumes).
    pub held: Vec<(NodeId, Vec<(u64, u64)>)>,
    /// Nodes that already hold an identical copy in place.
    pub complete: Vec<NodeId>,
    /// A node whose copy also has the object's bytes up to this offset from a write that a
    /// crash tore (not listed as held: only whole, verified chunks are).
    pub torn: Vec<(NodeId, u64)>,
    /// Seed for corruption and data.
    pub seed: u64,
    /// The run stops here whatever happened.
    pub time_limit: Duration,
}

impl SimSpec {
    /// Node `i`'s settings: [`SimSpec::node`], with its fault injection.
    pub fn node_config(&self, i: NodeId) -> NodeConfig {
        let mut cfg = self.node.clone();
        if let Some(&(_, n)) = self.tamper.iter().find(|t| t.0 == i) {
            cfg.tamper_every = n;
            cfg.tamper_repairs = self.tamper_repairs.contains(&i);
        }
        cfg
    }

    /// A plan over `tree` with every link `link`, a `len`-byte file, 64 KiB chunks, a 1 MiB
    /// buffer budget, and no faults.
    pub fn new(tree: Tree, link: LinkSpec, len: u64) -> Self {
        let n = tree.len();
        Self {
            links: vec![link; n],
            tree,
            len,
            stream: false,
            chunk_size: 64 << 10,
            node: NodeConfig {
                buffer_budget: 1 << 20,
                ..NodeConfig::default()
            },
            stall_timeout: Duration::from_secs(10),
            store_rate: vec![None; n],
            stalls: Vec::new(),
            unstalls: Vec::new(),
            kills: Vec::new(),
            disk_full: Vec::new(),
            corrupt_chunks: Vec::new(),
            tamper: Vec::new(),
            tamper_repairs: Vec::new(),
            rate_changes: Vec::new(),
            input_pause: None,
            held: Vec::new(),
            complete: Vec::new(),
            torn: Vec::new(),
            seed: 1,
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// What happened to one node.
#[derive(Debug, Clone, Default)]
pub struct NodeReport {
    /// When its copy was in place.
    pub done_at: Option<Duration>,
    /// Why it failed, as the source heard it.
    pub failed: Option<String>,
    /// Why it gave up, as it said itself.
    pub aborted: Option<String>,
    /// Its stored copy equals the source's object.
    pub data_ok: bool,
    /// Bytes it stored.
    pub stored: u64,
    /// Most chunk bytes it held in memory at once.
    pub peak_buffered: usize,
    /// Corrupt chunks it detected.
    pub corrupt_detected: usize,
    /// Its acknowledged prefix (chunks) as the source last heard it.
    pub acked: u64,
    /// Times of the source's progress reports for it: (time, chunks).
    pub progress: Vec<(Duration, u64)>,
    /// Chunks handed to its local copy out of index order (must stay 0: streams to stdout
    /// rely on it).
    pub out_of_order: usize,
    /// Chunks it said it held, as the source heard it.
    pub held: Option<u64>,
    /// Chunk bytes the session moved to it, as its `Done` said.
    pub received: u64,
    /// Chunks read back from its local copy for its children.
    pub loads: u64,
    /// Chunks it stored, in order of storing (what a crash leaves in its copy's map).
    pub stored_chunks: Vec<u64>,
    /// Most child links it fed at once (adoption may add some).
    pub max_children: usize,
    /// Nodes that rejected chunks it sent, one entry a chunk, as the source heard it.
    pub rejected_by: Vec<NodeId>,
    next_deliver: u64,
}

impl NodeReport {
    /// The source's view of this node's progress at time `t`.
    pub fn acked_at(&self, t: Duration) -> u64 {
        self.progress
            .iter()
            .take_while(|p| p.0 <= t)
            .last()
            .map_or(0, |p| p.1)
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// Per node; entry 0 is the source.
    pub nodes: Vec<NodeReport>,
    /// The source finished (every node done or failed).
    pub finished: bool,
    /// Simulated time at the end.
    pub elapsed: Duration,
    /// Chunk bytes that crossed each link downwards (`[i]`: into node i).
    pub link_bytes: Vec<u64>,
    /// Of those, the bytes that went in verified parts (`Part` frames) rather than whole.
    pub part_bytes: Vec<u64>,
}

impl SimReport {
    /// Nodes (receivers) that did not end with a verified, complete copy.
    pub fn incomplete(&self) -> Vec<NodeId> {
        (1..self.nodes.len())
            .filter(|&i| !(self.nodes[i].data_ok && self.nodes[i].done_at.is_some()))
            .collect()
    }
}

/// One direction of a link.
#[derive(Debug)]
struct Pipe {
    spec: LinkSpec,
    busy_until: Instant,
    frames: VecDeque<(Instant, Vec<u8>)>,
    unread: usize,
    closed: bool,
}

impl Pipe {
    fn new(spec: LinkSpec, now: Instant) -> Self {
        Self {
            spec,
            busy_until: now,
            frames: VecDeque::new(),
            unread: 0,
            closed: false,
        }
    }

    fn has_room(&self) -> bool {
        !self.closed && self.unread < self.spec.window
    }

    fn push(&mut self, bytes: Vec<u8>, now: Instant) {
        let start = self.busy_until.max(now);
        self.busy_until = start + Duration::from_secs_f64(bytes.len() as f64 / self.spec.rate);
        self.unread += bytes.len();
        self.frames
            .push_back((self.busy_until + self.spec.latency, bytes));
    }

    fn ready(&self, now: Instant) -> bool {
        self.frames.front().is_some_and(|(t, _)| *t <= now)
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        let (_, b) = self.frames.pop_front()?;
        self.unread -= b.len();
        Some(b)
    }
}

struct SimNode {
    node: Node,
    /// Its parent now (a dead parent's child is adopted by another node).
    parent: Option<NodeId>,
    /// Chunks its copy holds (what a new instance resumes from).
    stored_set: crate::chunkmap::ChunkMap,
    /// Its copy is complete and in place.
    in_place: bool,
    /// Its process died.
    dead: bool,
    /// Child link index -> child node id.
    child_ids: Vec<NodeId>,
    disk: Vec<u8>,
    /// Pending stores: (completion time, chunk index).
    stores: VecDeque<(Instant, u64)>,
    store_busy: Instant,
    stalled: bool,
    ended: bool,
    report: NodeReport,
}

/// The simulator.
pub struct Sim {
    spec: SimSpec,
    start: Instant,
    now: Instant,
    nodes: Vec<SimNode>,
    /// `down[i]`: parent(i) -> i; `up[i]`: i -> parent(i).
    down: Vec<Pipe>,
    up: Vec<Pipe>,
    object: Vec<u8>,
    fed: u64,
    rng: SmallRng,
    link_bytes: Vec<u64>,
    part_bytes: Vec<u64>,
    keys: Keys,
}

impl Sim {
    /// Builds the session: the source and every relay, set up through encoded `Open` frames.
    pub fn new(spec: SimSpec) -> Self {
        let start = Instant::now();
        let n = spec.tree.len();
        let mut rng = SmallRng::seed_from_u64(spec.seed);
        let object: Vec<u8> = (0..spec.len).map(|_| rng.gen()).collect();
        let keys = Keys::derive(&Secret::from_bytes([0x5a; 32]));
        let manifest = Manifest {
            name: "object".into(),
            kind: if spec.stream {
                ObjectKind::Stream
            } else {
                ObjectKind::File
            },
            total_len: (!spec.stream).then_some(spec.len),
            entries: vec![],
            mode: 0,
            mtime: None,
        };
        let params = SessionParams {
            session: 77,
            chunk_size: spec.chunk_size,
            stall_timeout: spec.stall_timeout,
            cc: String::new(),
            manifest,
            stripe: None,
            edges: Default::default(),
        };
        let names: Vec<Named> = (1..n)
            .map(|i| Named {
                name: format!("n{i}"),
                addr: format!("sim:{i}"),
                uplink_kbps: 0,
            })
            .collect();
        let source = Node::source(
            params,
            keys.clone(),
            spec.node_config(0),
            &spec.tree,
            &names,
            start,
        )
        .expect("valid simulation plan");
        let mut source = source;
        // A file can be read again for a child adopted late; a stream cannot.
        source.set_rereadable(!spec.stream);
        let mut slots: Vec<Option<Node>> = (0..n).map(|_| None).collect();
        slots[0] = Some(source);
        let mut queue = VecDeque::from([0usize]);
        while let Some(p) = queue.pop_front() {
            let parent = slots[p].as_ref().expect("created before its children");
            let opens: Vec<_> = (0..parent.children().len())
                .map(|k| (parent.children()[k].node, parent.open_for(k)))
                .collect();
            for (child, open) in opens {
                let wire = Frame::Open(open).encode().to_vec();
                let Ok(Some(Frame::Open(open))) =
                    wire::decode_from(&mut BytesMut::from(&wire[..]), wire::MAX_FRAME)
                else {
                    panic!("Open did not round-trip")
                };
                let node = Node::relay(&open, keys.clone(), spec.node_config(child), start)
                    .expect("relay accepts its Open");
                slots[child] = Some(node);
                queue.push_back(child);
            }
        }
        let nodes = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let mut node = s.expect("every node is in the tree");
                let child_ids = node.children().iter().map(|c| c.node).collect();
                let disk = resume(&mut node, i, &spec, &object, start);
                SimNode {
                    parent: spec.tree.parent(i),
                    stored_set: Default::default(),
                    in_place: spec.complete.contains(&i),
                    dead: false,
                    node,
                    child_ids,
                    disk,
                    stores: VecDeque::new(),
                    store_busy: start,
                    stalled: false,
                    ended: false,
                    report: NodeReport {
                        data_ok: i > 0 && spec.complete.contains(&i),
                        ..NodeReport::default()
                    },
                }
            })
            .collect();
        let down = spec.links.iter().map(|l| Pipe::new(*l, start)).collect();
        let up = spec.links.iter().map(|l| Pipe::new(*l, start)).collect();
        let mut sim = Self {
            link_bytes: vec![0; n],
            part_bytes: vec![0; n],
            spec,
            start,
            now: start,
            nodes,
            down,
            up,
            object,
            fed: 0,
            rng,
            keys,
        };
        for i in 0..n {
            sim.tell_child_rtts(i);
        }
        sim
    }

    /// Tells node `p` its children's round trips, as the driver does when it connects to them.
    fn tell_child_rtts(&mut self, p: NodeId) {
        let sn = &mut self.nodes[p];
        for (k, &c) in sn.child_ids.iter().enumerate() {
            let rtt = self.spec.links[c].latency * 2;
            sn.node.handle_child_rtt(k, rtt);
        }
    }

    /// Runs to the end (the source finished, nothing can happen any more, or the time limit).
    pub fn run(mut self) -> SimReport {
        let limit = self.start + self.spec.time_limit;
        let mut rate_changes = self.spec.rate_changes.clone();
        rate_changes.sort_by_key(|c| c.0);
        let mut rate_changes = VecDeque::from(rate_changes);
        loop {
            while let Some(&(t, i, rate)) = rate_changes.front() {
                if self.start + t > self.now {
                    break;
                }
                self.down[i].spec.rate = rate;
                self.up[i].spec.rate = rate;
                rate_changes.pop_front();
            }
            for &(i, t) in &self.spec.stalls {
                let until = self.spec.unstalls.iter().find(|u| u.0 == i);
                let over = until.is_some_and(|u| self.start + u.1 <= self.now);
                self.nodes[i].stalled = self.start + t <= self.now && !over;
            }
            for (i, t) in self.spec.kills.clone() {
                if self.start + t <= self.now && !self.nodes[i].dead {
                    self.kill(i);
                }
            }
            self.settle();
            if self.nodes[0].node.is_finished() {
                break;
            }
            let next = self
                .next_event()
                .into_iter()
                .chain(rate_changes.front().map(|c| self.start + c.0))
                .chain(
                    self.spec
                        .input_pause
                        .map(|(_, to)| self.start + to)
                        .filter(|t| *t > self.now),
                )
                .chain(
                    self.spec
                        .stalls
                        .iter()
                        .chain(&self.spec.unstalls)
                        .chain(&self.spec.kills)
                        .map(|s| self.start + s.1)
                        .filter(|t| *t > self.now),
                )
                .min();
            match next {
                Some(t) if t <= limit => self.now = t.max(self.now),
                _ => break,
            }
        }
        self.report()
    }

    /// Does everything possible at the current instant.
    fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let mut busy = false;
            for i in 0..self.nodes.len() {
                busy |= self.step(i);
            }
            if !busy {
                return;
            }
        }
        panic!("simulation did not settle (livelock)");
    }

    fn step(&mut self, i: NodeId) -> bool {
        let now = self.now;
        let mut busy = false;
        let mut timer_fired = false;
        if self.nodes[i].stalled || self.nodes[i].ended {
            return false;
        }
        // Timers.
        if self.nodes[i].node.poll_timeout().is_some_and(|t| t <= now) {
            self.nodes[i].node.handle_timeout(now);
            timer_fired = true;
            busy = true;
        }
        // Source input.
        if i == 0 {
            let cs = self.spec.chunk_size as u64;
            let paused = self
                .spec
                .input_pause
                .is_some_and(|(from, to)| now >= self.start + from && now < self.start + to);
            while !paused && self.nodes[0].node.wants_input() && self.fed < self.spec.len {
                let end = (self.fed + cs).min(self.spec.len);
                let data = Bytes::copy_from_slice(&self.object[self.fed as usize..end as usize]);
                self.nodes[0].node.handle_input(data, now);
                self.fed = end;
                busy = true;
            }
            if self.fed == self.spec.len && self.nodes[0].node.end().is_none() {
                self.nodes[0].node.handle_input_end(now);
                busy = true;
            }
        }
        // Stores that completed.
        while let Some(&(t, index)) = self.nodes[i].stores.front() {
            if t > now {
                break;
            }
            self.nodes[i].stores.pop_front();
            self.nodes[i].stored_set.insert(index);
            self.nodes[i].node.handle_stored(index, now);
            busy = true;
        }
        // Incoming frames: control from children always, data from the parent when wanted.
        for k in 0..self.nodes[i].child_ids.len() {
            let c = self.nodes[i].child_ids[k];
            if self.nodes[c].parent != Some(i) {
                continue; // adopted by another node while this one was stalled
            }
            while self.up[c].ready(now) {
                let bytes = self.up[c].pop().expect("ready");
                self.deliver(i, Link::Child(k), bytes);
                busy = true;
            }
        }
        if i != 0 {
            while self.down[i].ready(now) && self.nodes[i].node.wants_input() {
                let mut bytes = self.down[i].pop().expect("ready");
                self.maybe_corrupt(i, &mut bytes);
                self.deliver(i, Link::Parent, bytes);
                busy = true;
            }
        }
        // Outgoing frames while the pipes have room.
        if i != 0 {
            while self.up[i].has_room() {
                let Some(f) = self.nodes[i].node.poll_transmit(Link::Parent) else {
                    break;
                };
                self.up[i].push(f.encode().to_vec(), now);
                busy = true;
            }
        }
        for k in 0..self.nodes[i].child_ids.len() {
            let c = self.nodes[i].child_ids[k];
            if self.nodes[c].parent != Some(i) {
                continue;
            }
            while self.down[c].has_room() {
                let Some(f) = self.nodes[i].node.poll_transmit(Link::Child(k)) else {
                    break;
                };
                match &f {
                    Frame::Chunk(ch) => self.link_bytes[c] += ch.data.len() as u64,
                    Frame::Part(p) => {
                        self.link_bytes[c] += p.data.len() as u64;
                        self.part_bytes[c] += p.data.len() as u64;
                    }
                    _ => {}
                }
                self.down[c].push(f.encode().to_vec(), now);
                busy = true;
            }
        }
        // Events.
        while let Some(ev) = self.nodes[i].node.poll_event() {
            busy = true;
            self.handle_event(i, ev);
        }
        let sn = &mut self.nodes[i];
        sn.report.max_children = sn.report.max_children.max(sn.node.live_children());
        // A timer still due after being handled would spin a real driver at full CPU.
        let sn = &self.nodes[i];
        assert!(
            !timer_fired || sn.ended || sn.node.poll_timeout().is_none_or(|t| t > now),
            "node {i}: timer still due after handle_timeout"
        );
        busy
    }

    fn deliver(&mut self, i: NodeId, link: Link, bytes: Vec<u8>) {
        let mut buf = BytesMut::from(&bytes[..]);
        let frame = match wire::decode_from(&mut buf, wire::MAX_FRAME) {
            Ok(Some(f)) => f,
            other => panic!("node {i}: undecodable frame {other:?}"),
        };
        if let Err(e) = self.nodes[i].node.handle_frame(link, frame, self.now) {
            panic!("node {i}: protocol error from {link:?}: {e}");
        }
    }

    fn maybe_corrupt(&mut self, i: NodeId, bytes: &mut [u8]) {
        // Where the data starts: chunk frames have 4 len + 1 type + 8 index + 64 hash and tag
        // before it; parts of a chunk sent in parts 4 + 1 + 8 index + 4 offset.
        let data_at = match bytes.get(4) {
            Some(0x11) => 4 + 1 + 8 + 64,
            Some(0x18) => 4 + 1 + 8 + 4,
            _ => return,
        };
        if bytes.len() <= data_at {
            return;
        }
        let index = u64::from_be_bytes(bytes[5..13].try_into().expect("8 bytes"));
        let scripted = self
            .spec
            .corrupt_chunks
            .iter()
            .position(|&(n, c)| n == i && c == index);
        // `corrupt` is per chunk: a part carries its share of that chance.
        let share = (bytes.len() - data_at) as f64 / self.spec.chunk_size as f64;
        let p = (self.spec.links[i].corrupt * share).min(1.0);
        let random = p > 0.0 && self.rng.gen_bool(p);
        if let Some(p) = scripted {
            self.spec.corrupt_chunks.remove(p);
        } else if !random {
            return;
        }
        let at = self.rng.gen_range(data_at..bytes.len());
        bytes[at] ^= 0x40;
    }

    fn handle_event(&mut self, i: NodeId, ev: Event) {
        let now = self.now;
        let t = now - self.start;
        match ev {
            Event::Deliver {
                index,
                offset,
                data,
                hash,
            } => {
                // The hash handed with a delivery is what the local copy's map records.
                assert_eq!(
                    blake3::hash(&data).as_bytes(),
                    &hash,
                    "chunk {index}'s hash"
                );
                let sn = &mut self.nodes[i];
                if index != sn.report.next_deliver {
                    sn.report.out_of_order += 1;
                }
                sn.report.next_deliver = index + 1;
                let end = offset as usize + data.len();
                let full = self
                    .spec
                    .disk_full
                    .iter()
                    .find(|d| d.0 == i)
                    .is_some_and(|d| end as u64 > d.1);
                if full {
                    if sn.report.failed.is_none() {
                        sn.node.handle_store_failed("disk full".into(), now);
                    }
                    return;
                }
                if sn.disk.len() < end {
                    sn.disk.resize(end, 0);
                }
                sn.disk[offset as usize..end].copy_from_slice(&data);
                sn.report.stored += data.len() as u64;
                let dur = self.spec.store_rate[i].map_or(Duration::ZERO, |r| {
                    Duration::from_secs_f64(data.len() as f64 / r)
                });
                sn.store_busy = sn.store_busy.max(now) + dur;
                let index = offset / self.spec.chunk_size as u64;
                sn.stores.push_back((sn.store_busy, index));
                sn.report.stored_chunks.push(index);
            }
            Event::Complete { total_len } => {
                let sn = &mut self.nodes[i];
                sn.report.data_ok = total_len == self.spec.len && sn.disk == self.object;
                sn.in_place = sn.report.data_ok;
                sn.node.handle_finalized(Ok(()), now);
            }
            Event::Progress { node, upto } => {
                let r = &mut self.nodes[node].report;
                r.acked = upto;
                r.progress.push((t, upto));
            }
            Event::NodeDone { node, received } => {
                let r = &mut self.nodes[node].report;
                r.done_at = Some(t);
                r.received = received;
            }
            Event::Held { node, chunks, .. } => self.nodes[node].report.held = Some(chunks),
            Event::Load { index, offset, len } => {
                let sn = &mut self.nodes[i];
                sn.report.loads += 1;
                let (a, b) = (offset as usize, (offset + len) as usize);
                let disk = if i == 0 { &self.object } else { &sn.disk };
                match disk.get(a..b) {
                    Some(d) => sn.node.handle_loaded(index, Bytes::copy_from_slice(d), now),
                    None => sn
                        .node
                        .handle_load_failed(index, "past the end".into(), now),
                }
            }
            Event::NodeFailed { node, reason } => {
                self.nodes[node].report.failed.get_or_insert(reason);
            }
            Event::Corrupt { .. } => self.nodes[i].report.corrupt_detected += 1,
            Event::Rejected { node, from, .. } => self.nodes[from].report.rejected_by.push(node),
            Event::CloseLink(Link::Child(k)) => {
                let c = self.nodes[i].child_ids[k];
                self.down[c].closed = true;
                self.up[c].closed = true;
                self.down[c].frames.clear();
                self.up[c].frames.clear();
                self.nodes[c].node.handle_link_closed(
                    Link::Parent,
                    "cut off by parent".into(),
                    now,
                );
            }
            Event::CloseLink(Link::Parent) => {}
            Event::Connect(k) => self.adopt(i, k),
            Event::Aborted { reason } => {
                let sn = &mut self.nodes[i];
                sn.report.aborted.get_or_insert(reason);
                sn.ended = true;
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        let mut t: Option<Instant> = None;
        let mut consider = |x: Instant| t = Some(t.map_or(x, |t: Instant| t.min(x)));
        for (i, sn) in self.nodes.iter().enumerate() {
            if sn.stalled || sn.ended {
                continue;
            }
            if let Some(x) = sn.node.poll_timeout() {
                consider(x);
            }
            if let Some(&(x, _)) = sn.stores.front() {
                consider(x);
            }
            for &c in sn
                .child_ids
                .iter()
                .filter(|&&c| self.nodes[c].parent == Some(i))
            {
                if let Some(&(x, _)) = self.up[c].frames.front() {
                    consider(x);
                }
            }
            if i != 0 && sn.node.wants_input() {
                if let Some(&(x, _)) = self.down[i].frames.front() {
                    consider(x);
                }
            }
        }
        // A timer already due was handled by `settle`; one that stays due would spin, so step
        // past it.
        t.map(|x| x.max(self.now + Duration::from_micros(100)))
    }

    fn report(self) -> SimReport {
        let finished = self.nodes[0].node.is_finished();
        let elapsed = self.now - self.start;
        let nodes = self
            .nodes
            .into_iter()
            .map(|sn| {
                let mut r = sn.report;
                r.peak_buffered = r.peak_buffered.max(sn.node.peak_buffered());
                r
            })
            .collect();
        SimReport {
            nodes,
            finished,
            elapsed,
            link_bytes: self.link_bytes,
            part_bytes: self.part_bytes,
        }
    }
}

/// A report on chunk counts, for assertions on progress.
pub fn chunks_of(len: u64, chunk_size: u32) -> u64 {
    crate::manifest::chunk_count(len, chunk_size)
}

/// Sets node `i` up with what `spec` says its local copy already holds; returns that copy.
fn resume(node: &mut Node, i: NodeId, spec: &SimSpec, object: &[u8], now: Instant) -> Vec<u8> {
    let cs = spec.chunk_size as u64;
    let complete = spec.complete.contains(&i);
    let ranges: Vec<(u64, u64)> = spec
        .held
        .iter()
        .filter(|h| h.0 == i)
        .flat_map(|h| h.1.iter().copied())
        .collect();
    let torn = spec.torn.iter().find(|t| t.0 == i).map(|t| t.1 as usize);
    if i == 0 || (!complete && ranges.is_empty() && torn.is_none()) {
        return Vec::new();
    }
    let mut disk = vec![0u8; object.len()];
    if let Some(t) = torn {
        // The torn chunk's first half is there, its second half is garbage.
        let t = t.min(object.len());
        let from = t - t % spec.chunk_size as usize;
        disk[from..t].copy_from_slice(&object[from..t]);
        disk[t..].fill(0xee);
    }
    let held =
        crate::chunkmap::ChunkMap::from_ranges(&ranges, chunks_of(spec.len, spec.chunk_size));
    for (s, e) in held.ranges() {
        let (a, b) = ((s * cs) as usize, ((e * cs) as usize).min(object.len()));
        disk[a..b].copy_from_slice(&object[a..b]);
    }
    if complete {
        disk.copy_from_slice(object);
    }
    node.resume(held, complete, now);
    disk
}
