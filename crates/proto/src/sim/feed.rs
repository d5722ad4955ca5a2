//! A seeded simulation of one feed source and many subscribers on a LAN: multicast datagrams
//! lost at random, in bursts or in blackouts per receiver, unicast connections that are
//! reliable with a rate and a delay. Time jumps from event to event; the same seed gives the
//! same run. Tests check that every wanted product arrives once, verified.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::auth::Secret;
use crate::feed::fec::ParityCache;
use crate::feed::msg::{Msg, Start};
use crate::feed::product::{Micros, ProductAuth, SecretAuth, Subscription};
use crate::feed::push::PushOut;
use crate::feed::queue::ProductQueue;
use crate::feed::receiver::{Latency, Receiver, ReceiverConfig, RxEvent, RxStats};
use crate::feed::seal::{DgramReader, DgramWriter};
use crate::feed::server::{Server, ServerConfig, SubId, UniOut};
use crate::mcast::seal::GroupKey;

/// How multicast reaches one receiver.
#[derive(Debug, Clone, Default)]
pub struct McastLoss {
    /// Independent loss probability per datagram.
    pub random: f64,
    /// Probability per datagram of entering a loss burst (Gilbert-Elliott: every datagram in
    /// a burst is lost).
    pub burst_start: f64,
    /// Probability per datagram of a burst ending.
    pub burst_end: f64,
    /// Windows in which nothing arrives.
    pub blackouts: Vec<(Micros, Micros)>,
    /// Probability that a data datagram arrives with a byte flipped.
    pub corrupt: f64,
    /// Every product's start is lost (the receiver learns of each product from its blocks).
    pub starts: bool,
}

/// One receiver.
#[derive(Debug, Clone)]
pub struct RxSpec {
    /// Feedtype pattern.
    pub feedtype: String,
    /// When it subscribes.
    pub join_at: Micros,
    /// From where.
    pub start: Start,
    /// Whether it takes multicast.
    pub multicast: bool,
    /// Its multicast loss.
    pub loss: McastLoss,
    /// One-way delay to and from the source.
    pub delay: Micros,
    /// How much later it takes the group's datagrams than they arrive: a busy host whose
    /// socket holds them while its counts still go out at once.
    pub lag: Micros,
    /// Its unicast rate, bytes per second.
    pub unicast_rate: u64,
}

/// A product to insert.
#[derive(Debug, Clone)]
pub struct Insert {
    /// When.
    pub at: Micros,
    /// Feedtype.
    pub feedtype: String,
    /// Size.
    pub size: usize,
}

/// What a receiver got.
#[derive(Debug, Default)]
pub struct RxReport {
    /// Sequence numbers delivered, in delivery order.
    pub delivered: Vec<u64>,
    /// When each was delivered.
    pub delivered_at: Vec<Micros>,
    /// Latencies of the deliveries.
    pub latencies: Vec<Latency>,
    /// Ranges reported gone.
    pub lost: Vec<(u64, u64)>,
    /// Counters.
    pub stats: RxStats,
    /// It fell back to unicast.
    pub fell_back: bool,
    /// Bytes that came by repair.
    pub repaired: u64,
    /// The source refused the subscription, with its reason.
    pub refused: Option<String>,
}

/// A run's outcome.
#[derive(Debug)]
pub struct SimReport {
    /// Per receiver.
    pub rx: Vec<RxReport>,
    /// Product sequence numbers and feedtypes inserted.
    pub inserted: Vec<(u64, String)>,
    /// Inserts refused, with the reason.
    pub refused: Vec<String>,
    /// Datagrams and bytes multicast.
    pub multicast_sent: (u64, u64),
    /// Of those, repair symbols (parity).
    pub multicast_repair: (u64, u64),
    /// Bytes of product data sent by unicast as repairs, over every subscriber.
    pub unicast_repair: u64,
    /// Simulated time at the end.
    pub end: Micros,
}

enum Ev {
    Insert(usize),
    Join(usize),
    Mcast(usize, Bytes),
    Uni(usize, Msg),
    ToServer(usize, Msg),
}

struct RxState {
    spec: RxSpec,
    id: Option<SubId>,
    rx: Option<Receiver>,
    /// Opens the group's datagrams with what `Accepted` said (sealed when it held a key).
    reader: Option<DgramReader>,
    bufs: HashMap<u64, Vec<u8>>,
    hashes: HashMap<u64, [u8; 32]>,
    in_burst: bool,
    uni_free: Micros,
    report: RxReport,
}

struct World {
    rng: SmallRng,
    auth: Arc<dyn ProductAuth>,
    server: Server,
    store: HashMap<u64, Bytes>,
    heap: BinaryHeap<Reverse<(Micros, u64)>>,
    evs: BTreeMap<u64, Ev>,
    n: u64,
    st: Vec<RxState>,
    inserts: Vec<Insert>,
    inserted: Vec<(u64, String)>,
    refused: Vec<String>,
    parity: ParityCache,
    /// Numbers (and seals, under the config's group key) every datagram.
    writer: DgramWriter,
}

/// Runs a feed: `server` settings, receivers, products; stops at `until` or when every
/// receiver has settled every product inserted (and 1 s more).
pub fn run(
    seed: u64,
    cfg: ServerConfig,
    rxs: Vec<RxSpec>,
    inserts: Vec<Insert>,
    until: Micros,
) -> SimReport {
    let auth: Arc<dyn ProductAuth> = Arc::new(SecretAuth::new(&Secret::from_bytes([3; 32])));
    let writer = DgramWriter::new(cfg.feed_id, cfg.group_key.as_ref().map(GroupKey::cipher));
    let limits = cfg.limits;
    let server = Server::new(cfg, auth.clone(), ProductQueue::new(limits, 1));
    let last_insert = inserts.iter().map(|i| i.at).max().unwrap_or(0);
    let mut w = World {
        rng: SmallRng::seed_from_u64(seed),
        auth,
        server,
        store: HashMap::new(),
        heap: BinaryHeap::new(),
        evs: BTreeMap::new(),
        n: 0,
        st: Vec::new(),
        inserts,
        inserted: Vec::new(),
        refused: Vec::new(),
        parity: ParityCache::default(),
        writer,
    };
    for i in 0..w.inserts.len() {
        w.sched(w.inserts[i].at, Ev::Insert(i));
    }
    for (i, spec) in rxs.into_iter().enumerate() {
        w.sched(spec.join_at, Ev::Join(i));
        w.st.push(RxState {
            spec,
            id: None,
            rx: None,
            reader: None,
            bufs: HashMap::new(),
            hashes: HashMap::new(),
            in_burst: false,
            uni_free: 0,
            report: RxReport::default(),
        });
    }
    let mut now: Micros = 0;
    let mut steps = 0u64;
    let mut quiet_since: Option<Micros> = None;
    loop {
        steps += 1;
        w.pump(now);
        let next = w.next_time(now);
        // Done when every receiver has settled every product inserted (delivered, not
        // wanted, or reported gone); a second more catches late duplicates.
        let last_seq = w.inserted.last().map_or(0, |(s, _)| *s);
        let quiet = now > last_insert
            && w.st.iter().all(|r| {
                r.spec.join_at <= now
                    && (r.report.refused.is_some()
                        || r.rx
                            .as_ref()
                            .is_some_and(|x| x.in_flight() == 0 && x.resume_seq() > last_seq))
            });
        let since = *quiet_since.get_or_insert(now);
        if !quiet {
            quiet_since = None;
        }
        if next >= until || steps > 50_000_000 || (quiet && now - since > 1_000_000) {
            break;
        }
        now = now.max(next);
        while let Some(Reverse((t, k))) = w.heap.peek().copied() {
            if t > now {
                break;
            }
            w.heap.pop();
            if let Some(ev) = w.evs.remove(&k) {
                w.dispatch(now, ev);
            }
        }
        for r in &mut w.st {
            drain_events(r, now);
        }
    }
    for r in &mut w.st {
        if let Some(rx) = &r.rx {
            r.report.stats = rx.stats;
        }
    }
    let status = w.server.status();
    SimReport {
        multicast_sent: status.multicast_sent,
        multicast_repair: status.multicast_repair,
        unicast_repair: status.subscribers.iter().map(|s| s.repair_bytes).sum(),
        rx: w.st.into_iter().map(|r| r.report).collect(),
        inserted: w.inserted,
        refused: w.refused,
        end: now,
    }
}

impl World {
    fn sched(&mut self, t: Micros, e: Ev) {
        self.n += 1;
        self.heap.push(Reverse((t, self.n)));
        self.evs.insert(self.n, e);
    }

    fn data(&self, seq: u64, offset: u64, len: u32) -> Option<Msg> {
        let d = self.store.get(&seq)?;
        let (a, b) = (offset as usize, offset as usize + len as usize);
        Some(Msg::Data {
            seq,
            offset,
            data: d.slice(a..b),
        })
    }

    /// Unicast pumps (while each link is free), multicast pacing, receivers' timers.
    fn pump(&mut self, now: Micros) {
        for i in 0..self.st.len() {
            let Some(id) = self.st[i].id else { continue };
            while self.st[i].uni_free <= now {
                let Some(out) = self.server.poll_unicast(id, now) else {
                    break;
                };
                let msg = match out {
                    UniOut::Msg(m) => m,
                    UniOut::Block { seq, offset, len } => match self.data(seq, offset, len) {
                        Some(m) => m,
                        None => {
                            self.server.abort_product(id, seq);
                            continue;
                        }
                    },
                };
                let r = &mut self.st[i];
                let cost = msg_len(&msg) * 1_000_000 / r.spec.unicast_rate.max(1);
                r.uni_free = r.uni_free.max(now) + cost;
                let at = r.uni_free + r.spec.delay;
                self.sched(at, Ev::Uni(i, msg));
            }
            let mut out = Vec::new();
            if let Some(rx) = &mut self.st[i].rx {
                rx.handle_timeout(now);
                while let Some(m) = rx.poll_msg() {
                    out.push(m);
                }
            }
            let delay = self.st[i].spec.delay;
            for m in out {
                self.sched(now + delay, Ev::ToServer(i, m));
            }
        }
        while let Some(out) = self.server.poll_multicast(now) {
            let msg = match out {
                PushOut::Msg(m) => m,
                PushOut::Block {
                    seq, offset, len, ..
                } => match self.data(seq, offset, len) {
                    Some(m) => m,
                    None => {
                        self.writer.skip();
                        continue;
                    }
                },
                PushOut::Symbol {
                    seq,
                    layout,
                    block,
                    index,
                } => {
                    let Some(d) = self.store.get(&seq) else {
                        self.writer.skip();
                        continue;
                    };
                    let read =
                        |off: u64, len: u64| -> Result<Vec<u8>, crate::mcast::fec::FecError> {
                            Ok(d[off as usize..(off + len) as usize].to_vec())
                        };
                    match self.parity.parity(seq, &layout, block, index, read) {
                        Ok(m) => m,
                        Err(_) => {
                            self.writer.skip();
                            continue;
                        }
                    }
                }
            };
            let mut d = Vec::new();
            self.writer.write(&msg, &mut d);
            let dgram = Bytes::from(d);
            let start = matches!(msg, Msg::Product { .. });
            for i in 0..self.st.len() {
                if start && self.st[i].spec.loss.starts {
                    continue;
                }
                if let Some(d) = deliver_mcast(&mut self.rng, &mut self.st[i], now, &dgram) {
                    let at = now + self.st[i].spec.delay + self.st[i].spec.lag;
                    self.sched(at, Ev::Mcast(i, d));
                }
            }
        }
    }

    fn next_time(&self, now: Micros) -> Micros {
        let mut next = self.heap.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        if let Some(t) = self.server.multicast_timeout() {
            next = next.min(t);
        }
        for r in &self.st {
            if r.id.is_some() && r.uni_free > now {
                next = next.min(r.uni_free);
            }
            if let Some(rx) = &r.rx {
                next = next.min(rx.poll_timeout());
            }
        }
        next
    }

    fn dispatch(&mut self, now: Micros, ev: Ev) {
        match ev {
            Ev::Insert(i) => self.insert(now, i),
            Ev::Join(i) => {
                let s = &self.st[i].spec;
                let host = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
                match self
                    .server
                    .subscribe(host, &s.feedtype, "", s.start, s.multicast)
                {
                    Ok(id) => self.st[i].id = Some(id),
                    Err(e) => self.st[i].report.refused = Some(e),
                }
            }
            Ev::Mcast(i, d) => {
                let r = &mut self.st[i];
                if let (Some(rx), Some(reader)) = (&mut r.rx, &r.reader) {
                    if let Ok((number, m)) = reader.read_numbered(&mut d.to_vec()) {
                        rx.handle_multicast(now, number, m);
                    }
                }
            }
            Ev::Uni(i, m) => {
                let r = &mut self.st[i];
                if let Msg::Accepted { feed_id, key, .. } = &m {
                    let cipher = key.as_ref().map(GroupKey::cipher);
                    r.reader = Some(DgramReader::new(*feed_id, cipher));
                    let sub = Subscription::parse(&r.spec.feedtype, "").expect("valid pattern");
                    let cfg = ReceiverConfig::default();
                    r.rx = Receiver::new(cfg, self.auth.clone(), sub, &m, now);
                    if let Some(rx) = &mut r.rx {
                        rx.set_rtt(2 * r.spec.delay);
                    }
                } else if let Some(rx) = &mut r.rx {
                    rx.handle_unicast(now, m);
                }
            }
            Ev::ToServer(i, m) => {
                if let Some(id) = self.st[i].id {
                    self.server.handle_msg(id, m, now);
                }
            }
        }
    }

    fn insert(&mut self, now: Micros, i: usize) {
        let ins = &self.inserts[i];
        let mut data = vec![0u8; ins.size];
        self.rng.fill(&mut data[..]);
        let hash = *blake3::hash(&data).as_bytes();
        let (ft, size) = (ins.feedtype.clone(), ins.size as u64);
        match self.server.insert(&format!("p{i}"), &ft, size, hash, now) {
            Ok((meta, evicted)) => {
                for s in evicted {
                    self.store.remove(&s);
                }
                self.inserted.push((meta.seq, meta.feedtype.clone()));
                self.store.insert(meta.seq, Bytes::from(data));
            }
            Err(e) => self.refused.push(e.to_string()),
        }
    }
}

fn msg_len(m: &Msg) -> u64 {
    match m {
        Msg::Data { data, .. } => data.len() as u64 + 32,
        _ => 96,
    }
}

/// Whether (and how) a datagram reaches receiver `r`.
fn deliver_mcast(rng: &mut SmallRng, r: &mut RxState, now: Micros, d: &Bytes) -> Option<Bytes> {
    if r.rx.as_ref().is_none_or(|x| !x.multicast()) {
        return None;
    }
    let l = &r.spec.loss;
    if l.blackouts.iter().any(|(a, b)| (*a..*b).contains(&now)) {
        return None;
    }
    if r.in_burst {
        r.in_burst = !rng.gen_bool(l.burst_end.clamp(0.0, 1.0));
    } else if l.burst_start > 0.0 && rng.gen_bool(l.burst_start.clamp(0.0, 1.0)) {
        r.in_burst = true;
    }
    if r.in_burst || (l.random > 0.0 && rng.gen_bool(l.random.clamp(0.0, 1.0))) {
        return None;
    }
    if l.corrupt > 0.0 && d.len() > 60 && rng.gen_bool(l.corrupt.clamp(0.0, 1.0)) {
        let mut b = BytesMut::from(&d[..]);
        let last = b.len() - 1;
        b[last] ^= 0x40;
        return Some(b.freeze());
    }
    Some(d.clone())
}

fn drain_events(r: &mut RxState, now: Micros) {
    let Some(rx) = &mut r.rx else { return };
    while let Some(ev) = rx.poll_event() {
        match ev {
            RxEvent::Begin(m) => {
                r.bufs.insert(m.seq, vec![0; m.size as usize]);
                r.hashes.insert(m.seq, m.hash);
            }
            RxEvent::Data { seq, offset, data } => {
                if let Some(b) = r.bufs.get_mut(&seq) {
                    b[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                }
            }
            RxEvent::Complete(seq) => {
                let ok = match (r.bufs.get(&seq), r.hashes.get(&seq)) {
                    (Some(b), Some(h)) => blake3::hash(b).as_bytes() == h,
                    _ => false,
                };
                rx.confirm(now, seq, ok);
            }
            RxEvent::Delivered {
                meta,
                latency,
                repaired,
                ..
            } => {
                r.bufs.remove(&meta.seq);
                r.report.delivered.push(meta.seq);
                r.report.delivered_at.push(now);
                r.report.latencies.push(latency);
                r.report.repaired += repaired;
            }
            RxEvent::Discard(seq) => {
                r.bufs.remove(&seq);
            }
            RxEvent::Lost { from, to } => r.report.lost.push((from, to)),
            RxEvent::FellBack => r.report.fell_back = true,
        }
    }
}
