//! A seeded simulation of one multicast source and many receivers on a LAN: every datagram
//! goes to every receiver after `delay` unless that receiver's loss model drops it; control
//! messages arrive after `delay` without loss (TCP). Time is simulated; tests check
//! byte-exact delivery and count what the repairs cost.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::msg::{DgramKind, McastMsg};
use super::probe::ProbeEnd;
use super::receiver::{Receiver, ReceiverConfig, RxEvent};
use super::seal::{DgramWriter, GroupKey};
use super::sender::{wire_overhead, CodedBlock, Sender, SenderConfig, Tx};
use super::train::{rate_from, TrainReport};
use super::{Layout, Micros};

/// The simulated sessions seal their datagrams, as a real one does by default.
const OVERHEAD: u64 = wire_overhead(true);

/// The group key of the simulated session.
fn key() -> GroupKey {
    GroupKey::from_bytes([0x42; 32])
}

/// Decides whether receiver `r` loses the `n`th datagram.
type Loss = Box<dyn FnMut(usize, u64) -> bool>;

enum Ev {
    Dgram(usize, Vec<u8>),
    ToRx(usize, McastMsg),
    ToTx(usize, McastMsg),
}

struct Sim {
    layout: Layout,
    file: Vec<u8>,
    delay: Micros,
    sender: Sender,
    writer: DgramWriter,
    rx: Vec<Receiver>,
    copies: Vec<Vec<u8>>,
    done: Vec<Option<Micros>>,
    queue: BinaryHeap<Reverse<(Micros, u64)>>,
    events: HashMap<u64, Ev>,
    seq: u64,
    cache: HashMap<u32, CodedBlock>,
    hashed: u32,
    datagrams: u64,
    /// Per receiver, a downlink that is the bottleneck: bytes per second and the longest
    /// queue in time (a datagram that would wait longer is dropped); `None`: no bottleneck.
    links: Vec<Option<(u64, Micros)>>,
    /// When each receiver's downlink is next free.
    free: Vec<Micros>,
    /// The source measures its rate ([`Sim::with_train`]): the receivers' train reports,
    /// and the rate it set from them.
    train: bool,
    reports: Vec<TrainReport>,
    measured: Option<u64>,
}

struct Outcome {
    /// When the last receiver was done.
    finish: Micros,
    /// Data datagrams sent per source symbol.
    cost: f64,
}

impl Sim {
    fn new(size: usize, layout: (u32, u32, u32), n: usize, rate: u64, seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let file: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
        let layout = Layout::new(size as u64, layout.0, layout.1, layout.2).unwrap();
        let cfg = SenderConfig {
            rate,
            end_interval: 20_000,
            stale: 15_000,
            receivers: n as u32,
            overhead: OVERHEAD,
        };
        let rcfg = ReceiverConfig {
            renak: 40_000,
            max_held: 64 << 20,
        };
        Self {
            layout,
            delay: 200,
            sender: Sender::new(layout, cfg),
            writer: DgramWriter::new(9, Some(key().cipher())),
            rx: (0..n)
                .map(|_| Receiver::new(layout, 9, Some(key().cipher()), rcfg))
                .collect(),
            copies: vec![vec![0; size]; n],
            done: vec![None; n],
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            seq: 0,
            cache: HashMap::new(),
            hashed: 0,
            datagrams: 0,
            links: vec![None; n],
            free: vec![0; n],
            train: false,
            reports: Vec::new(),
            measured: None,
            file,
        }
    }

    /// The source starts with a train and sets its rate from the reports.
    fn with_train(mut self) -> Self {
        self.train = true;
        self.sender.send_train();
        self
    }

    fn at(&mut self, t: Micros, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq)));
        self.events.insert(self.seq, ev);
    }

    fn datagram(&mut self, tx: Tx) -> Vec<u8> {
        let (kind, block, index) = match tx {
            Tx::Data { block, index } => (DgramKind::Data, block, index),
            Tx::End => (DgramKind::End, self.layout.blocks() as u32, 0),
        };
        let mut d = Vec::new();
        let mut body: &[u8] = &[];
        if kind == DgramKind::Data {
            let (l, file) = (self.layout, &self.file);
            let c = self.cache.entry(block).or_insert_with(|| {
                let (off, len) = l.block_range(block);
                CodedBlock::new(&l, block, file[off as usize..(off + len) as usize].to_vec())
            });
            body = c.symbol(&l, block, index).unwrap();
        }
        self.writer.write(kind, block, index, body, &mut d);
        d
    }

    /// Runs until every receiver is done or `limit`; `loss` decides drops.
    fn run(&mut self, mut loss: Loss, limit: Micros) -> Outcome {
        let mut now: Micros = 0;
        let n = self.rx.len();
        let mut end_told = false;
        while now < limit && self.done.iter().any(Option::is_none) {
            while let Some(tx) = self.sender.poll_transmit(now) {
                let d = self.datagram(tx);
                if matches!(tx, Tx::Data { .. }) {
                    self.datagrams += 1;
                }
                for r in 0..n {
                    if let Some(t) = self.downlink(r, now, d.len()) {
                        if !loss(r, self.datagrams) {
                            self.at(t + self.delay, Ev::Dgram(r, d.clone()));
                        }
                    }
                }
            }
            self.control(now, &mut end_told);
            while let Some(&Reverse((t, id))) = self.queue.peek() {
                if t > now {
                    break;
                }
                self.queue.pop();
                match self.events.remove(&id) {
                    Some(Ev::Dgram(r, mut d)) => self.rx[r].handle_datagram(now, &mut d),
                    Some(Ev::ToRx(r, m)) => self.rx[r].handle_msg(now, m),
                    Some(Ev::ToTx(r, McastMsg::Nak(list))) => list
                        .into_iter()
                        .for_each(|k| self.sender.handle_nak(now, r as u32, k)),
                    Some(Ev::ToTx(_, McastMsg::Train(r))) => self.train_report(r),
                    _ => {}
                }
            }
            self.receivers(now);
            if self.done.iter().all(Option::is_some) {
                self.sender.stop();
            }
            let mut next = self.sender.poll_timeout();
            for r in &self.rx {
                next = next.min(r.poll_timeout());
            }
            if let Some(Reverse((t, _))) = self.queue.peek() {
                next = next.min(*t);
            }
            now = next.max(now + 1);
        }
        Outcome {
            finish: self
                .done
                .iter()
                .map(|d| d.unwrap_or(Micros::MAX))
                .max()
                .unwrap_or(0),
            cost: self.datagrams as f64 / self.sender.stats.first_pass.max(1) as f64,
        }
    }

    /// When a datagram of `len` bytes sent at `now` leaves receiver `r`'s downlink, or
    /// `None` if its queue is full.
    fn downlink(&mut self, r: usize, now: Micros, len: usize) -> Option<Micros> {
        let Some((rate, queue)) = self.links[r] else {
            return Some(now);
        };
        let start = self.free[r].max(now);
        if start - now > queue {
            return None;
        }
        let wire = len as u64 - super::seal::overhead(true) as u64 + OVERHEAD;
        self.free[r] = start + wire * 1_000_000 / rate;
        Some(self.free[r])
    }

    /// The source's side of the train: once every receiver reported, the rate.
    fn train_report(&mut self, r: TrainReport) {
        if !self.train {
            return;
        }
        self.reports.push(r);
        if self.reports.len() == self.rx.len() {
            let wire = u64::from(self.layout.symbol) + OVERHEAD;
            self.measured = rate_from(&self.reports, wire);
            if let Some(rate) = self.measured {
                self.sender.set_rate(rate);
            }
        }
    }

    /// Hashes of the blocks started and the end of the pass, to every receiver by "TCP".
    fn control(&mut self, now: Micros, end_told: &mut bool) {
        let started = self.sender.started_blocks();
        if started > self.hashed {
            let hashes: Vec<[u8; 32]> = (self.hashed..started)
                .map(|b| {
                    let (off, len) = self.layout.block_range(b);
                    *blake3::hash(&self.file[off as usize..(off + len) as usize]).as_bytes()
                })
                .collect();
            for r in 0..self.rx.len() {
                let m = McastMsg::Hashes {
                    first: self.hashed,
                    hashes: hashes.clone(),
                };
                self.at(now + self.delay, Ev::ToRx(r, m));
            }
            self.hashed = started;
        }
        if self.sender.pass_done() && !*end_told {
            *end_told = true;
            let blocks = self.layout.blocks() as u32;
            for r in 0..self.rx.len() {
                self.at(now + self.delay, Ev::ToRx(r, McastMsg::End { blocks }));
            }
        }
    }

    fn receivers(&mut self, now: Micros) {
        for r in 0..self.rx.len() {
            self.rx[r].handle_timeout(now);
            while let Some(m) = self.rx[r].poll_msg() {
                self.at(now + self.delay, Ev::ToTx(r, m));
            }
            while let Some(ev) = self.rx[r].poll_event() {
                match ev {
                    RxEvent::Write { offset, data, hash } => {
                        assert_eq!(blake3::hash(&data).as_bytes(), &hash, "a block's hash");
                        let o = offset as usize;
                        self.copies[r][o..o + data.len()].copy_from_slice(&data);
                    }
                    RxEvent::Complete => self.done[r] = Some(now),
                    RxEvent::Failed(e) => panic!("receiver {r} failed: {e}"),
                }
            }
        }
    }

    fn assert_exact(&self) {
        for (r, c) in self.copies.iter().enumerate() {
            assert!(c == &self.file, "receiver {r}'s copy differs");
            assert!(self.rx[r].complete());
        }
    }
}

fn random_loss(p: f64, seed: u64) -> Loss {
    let mut rng = SmallRng::seed_from_u64(seed);
    Box::new(move |_, _| rng.gen_bool(p))
}

/// Loss at `p` in runs of `run` datagrams (a drop that takes a whole GSO run), each
/// receiver's on its own.
fn burst_loss(p: f64, run: u32, seed: u64) -> Loss {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut left: HashMap<usize, u32> = HashMap::new();
    Box::new(move |r, _| {
        let l = left.entry(r).or_default();
        if *l > 0 {
            *l -= 1;
            return true;
        }
        if rng.gen_bool(p / f64::from(run)) {
            *l = run - 1;
            return true;
        }
        false
    })
}

/// 4 MiB in 64-byte symbols, blocks of 256 with up to 256 parity: the LAN's shape, small.
const SHAPE: (u32, u32, u32) = (64, 256, 256);
const SIZE: usize = (4 << 20) + 1234;
/// 1 MB/s on the wire: 14,200 datagrams a second.
const RATE: u64 = 1_000_000;

#[test]
fn every_receiver_gets_an_exact_copy_at_0_1_and_5_percent_loss() {
    for (p, n, max_cost) in [(0.0, 4, 1.0), (0.01, 16, 1.05), (0.05, 16, 1.15)] {
        let mut sim = Sim::new(SIZE, SHAPE, n, RATE, 1);
        let out = sim.run(random_loss(p, 7), 600_000_000);
        sim.assert_exact();
        // The first pass alone, at the rate: the floor.
        let floor = sim.sender.stats.first_pass * (64 + OVERHEAD) * 1_000_000 / RATE;
        let eff = floor as f64 / out.finish as f64;
        assert!(
            out.cost <= max_cost,
            "{p} loss, {n} receivers: {:.3} datagrams per symbol",
            out.cost
        );
        // Targets of issue 31 (the LAN's 0.85 at 5%, 0.92 at 1%) as the share of the time
        // the first pass alone would take.
        let want = if p > 0.02 { 0.86 } else { 0.93 };
        assert!(eff >= want, "{p} loss, {n} receivers: {eff:.3} of the rate");
        if p > 0.0 {
            assert!(sim.rx.iter().all(|r| r.stats.decoded > 0));
        }
    }
}

#[test]
fn a_receiver_that_misses_whole_blocks_catches_up() {
    let mut sim = Sim::new(SIZE, SHAPE, 3, RATE, 2);
    // Receiver 1 loses datagrams 5,000-6,999 (eight blocks whole), receiver 2 every tenth.
    let out = sim.run(
        Box::new(|r, n| (r == 1 && (5_000..7_000).contains(&n)) || (r == 2 && n % 10 == 0)),
        600_000_000,
    );
    sim.assert_exact();
    // Within a fifth of the time the first pass alone takes at the rate (about 10 s).
    let floor = sim.sender.stats.first_pass * (64 + OVERHEAD) * 1_000_000 / RATE;
    assert!(
        out.finish < floor * 6 / 5,
        "finished at {} us, the first pass alone takes {floor} us",
        out.finish
    );
    assert!(sim.rx[1].stats.naks > 0);
}

#[test]
fn a_forged_symbol_is_refused_or_caught_by_the_block_hash() {
    let mut sim = Sim::new(1 << 20, SHAPE, 3, RATE, 3);
    // An outsider's datagram for block 3 at receiver 0 (no key: in clear, and one sealed
    // under another key), before anything else: neither opens, nothing is taken from it.
    let mut d = Vec::new();
    DgramWriter::new(9, None).write(DgramKind::Data, 3, 5, &[7; 64], &mut d);
    sim.at(0, Ev::Dgram(0, d.clone()));
    let other = GroupKey::from_bytes([1; 32]).cipher();
    DgramWriter::new(9, Some(other)).write(DgramKind::Data, 3, 5, &[7; 64], &mut d);
    sim.at(0, Ev::Dgram(0, d.clone()));
    // An insider (it holds the group key) forges one for block 3 at receiver 1: it opens,
    // but its block does not match the hash the source sent on the receiver's own
    // connection, and is asked for again.
    let mut insider = DgramWriter::new(9, Some(key().cipher()));
    insider.write(DgramKind::Data, 3, 5, &[7; 64], &mut d);
    sim.at(0, Ev::Dgram(1, d));
    sim.run(random_loss(0.0, 1), 600_000_000);
    sim.assert_exact();
    assert_eq!(sim.rx[0].stats.refused, 2);
    assert_eq!(sim.rx[0].stats.corrupt, 0);
    assert_eq!(sim.rx[1].stats.refused, 0);
    assert_eq!(sim.rx[1].stats.corrupt, 1);
    assert_eq!((sim.rx[2].stats.refused, sim.rx[2].stats.corrupt), (0, 0));
}

#[test]
fn an_empty_file_completes_at_once() {
    let mut sim = Sim::new(0, SHAPE, 2, RATE, 4);
    let out = sim.run(random_loss(0.5, 1), 1_000_000);
    sim.assert_exact();
    assert_eq!(out.finish, 0);
}

#[test]
fn the_train_finds_the_slowest_downlink_and_the_send_keeps_to_it() {
    // The source could send 50 times faster than the receivers' downlinks (2 MB/s, one at
    // 1 MB/s, each with a 30 ms queue): the unpaced train overflows them, and what arrives
    // shows each link's rate. 1% random loss past the links on top.
    let mut sim = Sim::new(SIZE, SHAPE, 4, 50 * RATE, 5).with_train();
    sim.links = vec![
        Some((2 * RATE, 30_000)),
        Some((RATE, 30_000)),
        Some((2 * RATE, 30_000)),
        Some((2 * RATE, 30_000)),
    ];
    let out = sim.run(random_loss(0.01, 3), 600_000_000);
    sim.assert_exact();
    let m = sim.measured.expect("every receiver reported the train") as f64;
    let want = 0.98 * RATE as f64;
    assert!(
        (m / want - 1.0).abs() < 0.03,
        "measured {m} B/s, want {want}"
    );
    // After the train the source keeps below the slowest link: the repairs are the train's
    // overflow and the random loss, not a rate that keeps overflowing.
    assert!(out.cost < 1.15, "{:.3} datagrams per symbol", out.cost);
    let floor = SIZE as f64 * (64 + OVERHEAD) as f64 / 64.0 / RATE as f64 * 1e6;
    let eff = floor / out.finish as f64;
    assert!(eff >= 0.85, "{eff:.3} of the slowest link");
}

#[test]
fn a_rate_measured_too_low_is_raised_to_the_slowest_downlink_and_kept_below_it() {
    // The train read half the slowest link (a busy source wrote it slowly): the rate is a
    // floor, raised while the group keeps up. Two downlinks at 1 MB/s, two at 2 MB/s, each
    // with a 30 ms queue, and 1% random loss past them.
    let mut sim = Sim::new(SIZE, SHAPE, 4, RATE / 2, 6);
    sim.sender.set_rate_floor(RATE / 2);
    sim.links = vec![
        Some((2 * RATE, 30_000)),
        Some((RATE, 30_000)),
        Some((RATE, 30_000)),
        Some((2 * RATE, 30_000)),
    ];
    let out = sim.run(random_loss(0.01, 4), 600_000_000);
    sim.assert_exact();
    let rate = sim.sender.rate() as f64 / RATE as f64;
    assert!(
        (0.8..=1.0).contains(&rate),
        "ends at {rate:.3} of the slowest link"
    );
    assert!(sim.sender.stats.rate_changes >= 5);
    // Past the 1 MB/s links the excess was lost: that, not the source, ended the raising.
    assert!(
        matches!(sim.sender.stats.probe_end, Some(ProbeEnd::Lossy { .. })),
        "{:?}",
        sim.sender.stats.probe_end
    );
    // Held at the floor the send would take twice the first pass at the link's rate.
    let floor = SIZE as f64 * (64 + OVERHEAD) as f64 / 64.0 / RATE as f64 * 1e6;
    let eff = floor / out.finish as f64;
    assert!(eff >= 0.75, "{eff:.3} of the slowest link");
    assert!(out.cost < 1.2, "{:.3} datagrams per symbol", out.cost);
}

#[test]
fn bursts_of_chance_loss_at_sixteen_receivers_do_not_hold_the_rate_below_their_links() {
    // Sixteen receivers behind 1 MB/s links (30 ms queues), each losing 1% in runs of 40
    // datagrams: block by block the worst of them loses tens, a window's worst a few percent.
    // The train read half the links: raised to them, and stepped back below them.
    let mut sim = Sim::new(SIZE, SHAPE, 16, RATE / 2, 8);
    sim.sender.set_rate_floor(RATE / 2);
    sim.links = vec![Some((RATE, 30_000)); 16];
    let out = sim.run(burst_loss(0.01, 40, 5), 600_000_000);
    sim.assert_exact();
    let rate = sim.sender.rate() as f64 / RATE as f64;
    assert!(
        (0.85..=1.0).contains(&rate),
        "ends at {rate:.3} of the links ({:?})",
        sim.sender.stats.probe_end
    );
    let floor = SIZE as f64 * (64 + OVERHEAD) as f64 / 64.0 / RATE as f64 * 1e6;
    let eff = floor / out.finish as f64;
    assert!(eff >= 0.75, "{eff:.3} of the links");
}
