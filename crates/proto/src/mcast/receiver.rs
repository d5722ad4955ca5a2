//! A receiver of a multicast send: symbols assembled per block, blocks rebuilt from any `k`
//! symbols, checked against their hashes and handed to the shell to write; requests for the
//! symbols still missing once the source has moved past a block.

use std::collections::{BTreeMap, VecDeque};

use super::layout::{Layout, Slot};
use super::msg::{session_tag, DgramHeader, DgramKind, McastMsg, Nak, DGRAM_HEADER};
use super::seal::GroupCipher;
use super::train::TrainMeter;
use super::{fec, Micros};

/// Timers and limits.
#[derive(Debug, Clone, Copy)]
pub struct ReceiverConfig {
    /// A block's request is repeated after this long without it being complete.
    pub renak: Micros,
    /// Most bytes held in incomplete blocks; past it the receiver gives up (it cannot keep
    /// up with the source).
    pub max_held: u64,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            renak: 40_000,
            max_held: 512 << 20,
        }
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RxEvent {
    /// Write these verified bytes at `offset`.
    Write {
        /// Where in the file.
        offset: u64,
        /// The block's bytes.
        data: Vec<u8>,
        /// Their BLAKE3 hash, as verified (the copy's map records it).
        hash: [u8; 32],
    },
    /// Every block is written: the copy is whole.
    Complete,
    /// The receiver gave up.
    Failed(String),
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RxStats {
    /// Datagrams of this session taken.
    pub datagrams: u64,
    /// Datagrams naming this session that did not open under its key (altered, forged,
    /// sealed under another key, or in clear): dropped unread.
    pub refused: u64,
    /// Symbols that were already here.
    pub duplicates: u64,
    /// Blocks rebuilt with parity.
    pub decoded: u64,
    /// Blocks whose hash did not match (asked for again).
    pub corrupt: u64,
    /// Block requests sent.
    pub naks: u64,
}

/// A block being assembled.
#[derive(Debug)]
struct Partial {
    /// The block's source symbols, each in its place (empty until the first one comes): once
    /// rebuilt, the block as written, with no copy.
    data: Vec<u8>,
    /// Which source symbols `data` holds.
    present: Vec<bool>,
    /// Parity symbols, by parity index.
    parity: Vec<Option<Box<[u8]>>>,
    /// Symbols held, source and parity.
    have: u32,
    /// One past the highest symbol index seen (the source's progress through the block).
    seen: u32,
    last_nak: Option<Micros>,
    /// Bytes this block holds: `data`'s and the parity's (counted in [`Receiver::held`]).
    bytes: u64,
}

impl Partial {
    fn new(k: u32, m: u32, seen: u32) -> Self {
        Self {
            data: Vec::new(),
            present: vec![false; k as usize],
            parity: vec![None; m as usize],
            have: 0,
            seen,
            last_nak: None,
            bytes: 0,
        }
    }
}

/// One receiver's state.
#[derive(Debug)]
pub struct Receiver {
    layout: Layout,
    session: u64,
    cipher: Option<GroupCipher>,
    cfg: ReceiverConfig,
    blocks: u32,
    done: Vec<bool>,
    done_count: u32,
    /// Lowest block not done.
    low: u32,
    partial: BTreeMap<u32, Partial>,
    /// Bytes held in incomplete blocks (see [`ReceiverConfig::max_held`]).
    held: u64,
    /// Rebuilds blocks with missing symbols; keeps its work space between blocks.
    rebuilder: fec::Rebuilder,
    hashes: BTreeMap<u32, [u8; 32]>,
    waiting: BTreeMap<u32, Vec<u8>>,
    /// Blocks below this are due: the source has sent a later one (or its end marker).
    reached: u32,
    heard: bool,
    failed: bool,
    /// Times the first symbols of the first pass, for the source's rate.
    train: TrainMeter,
    out: VecDeque<McastMsg>,
    events: VecDeque<RxEvent>,
    /// Counters.
    pub stats: RxStats,
}

impl Receiver {
    /// A receiver of `session`'s file cut as `layout`, whose datagrams are sealed under
    /// `cipher` (`None`: a plaintext session).
    pub fn new(
        layout: Layout,
        session: u64,
        cipher: Option<GroupCipher>,
        cfg: ReceiverConfig,
    ) -> Self {
        let blocks = layout.blocks() as u32;
        let mut r = Self {
            layout,
            session,
            cipher,
            cfg,
            blocks,
            done: vec![false; blocks as usize],
            done_count: 0,
            low: 0,
            partial: BTreeMap::new(),
            held: 0,
            rebuilder: fec::Rebuilder::default(),
            hashes: BTreeMap::new(),
            waiting: BTreeMap::new(),
            reached: 0,
            heard: false,
            failed: false,
            train: TrainMeter::default(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: RxStats::default(),
        };
        if blocks == 0 {
            r.events.push_back(RxEvent::Complete);
        }
        r
    }

    /// True once every block is written.
    pub fn complete(&self) -> bool {
        self.done_count == self.blocks
    }

    /// Bytes of verified blocks.
    pub fn bytes_done(&self) -> u64 {
        u64::from(self.done_count) * self.layout.block_bytes()
    }

    /// A datagram from the group (any content: what is not this session's is ignored, what
    /// does not open under its key is counted and dropped). It is opened in place. `now` is
    /// when it arrived: the train's timing ([`super::train`]) depends on it.
    pub fn handle_datagram(&mut self, now: Micros, d: &mut [u8]) {
        let Some((h, _)) = DgramHeader::read(d) else {
            return;
        };
        if h.session != session_tag(self.session) || self.failed {
            return;
        }
        let body = match &self.cipher {
            Some(c) => match c.open(h.number, DGRAM_HEADER, d) {
                Some(b) => b,
                None => {
                    self.stats.refused += 1;
                    return;
                }
            },
            None => &d[DGRAM_HEADER..],
        };
        if !self.heard {
            self.heard = true;
            self.out.push_back(McastMsg::Heard);
        }
        self.stats.datagrams += 1;
        match h.kind {
            DgramKind::Hello => {}
            DgramKind::End => {
                self.reached = self.blocks;
                let r = self.train.report();
                self.out.extend(r.map(McastMsg::Train));
            }
            DgramKind::Data => {
                self.time_train(now, h.block, h.index);
                self.symbol(h.block, h.index, body);
            }
        }
    }

    /// A first-pass symbol is the train's (repairs, with their higher indexes, are not).
    fn time_train(&mut self, now: Micros, b: u32, index: u32) {
        if b >= self.blocks || index >= self.layout.k_of(b) {
            return;
        }
        let seq = u64::from(b) * u64::from(self.layout.k) + u64::from(index);
        let r = self.train.handle_symbol(now, seq);
        self.out.extend(r.map(McastMsg::Train));
    }

    fn symbol(&mut self, b: u32, index: u32, body: &[u8]) {
        if b >= self.blocks || body.len() != self.layout.symbol as usize {
            return;
        }
        self.reached = self.reached.max(b);
        if self.done[b as usize] || self.waiting.contains_key(&b) {
            self.stats.duplicates += 1;
            return;
        }
        let (k, m) = (self.layout.k_of(b), self.layout.m);
        let s = self.layout.symbol as usize;
        let slot = self.layout.slot(b, index);
        let grow = match (slot, self.partial.get(&b)) {
            (Slot::Source(_), Some(p)) if !p.data.is_empty() => 0,
            (Slot::Source(_), _) => k as u64 * s as u64,
            (Slot::Parity(_), _) => s as u64,
        };
        if self.held + grow > self.cfg.max_held {
            self.fail(format!(
                "more than {} MiB of incomplete blocks held: this receiver cannot keep up",
                self.cfg.max_held >> 20
            ));
            return;
        }
        let p = self
            .partial
            .entry(b)
            .or_insert_with(|| Partial::new(k, m, 0));
        p.seen = p.seen.max(index.saturating_add(1));
        let fresh = match slot {
            Slot::Source(i) => !std::mem::replace(&mut p.present[i as usize], true),
            Slot::Parity(j) => p.parity[j as usize].is_none(),
        };
        if !fresh {
            self.stats.duplicates += 1;
            return;
        }
        match slot {
            Slot::Source(i) => {
                if p.data.is_empty() {
                    p.data = vec![0; k as usize * s];
                }
                let at = i as usize * s;
                p.data[at..at + s].copy_from_slice(body);
            }
            Slot::Parity(j) => p.parity[j as usize] = Some(body.into()),
        }
        p.bytes += grow;
        self.held += grow;
        p.have += 1;
        if p.have >= k {
            self.rebuild(b);
        }
    }

    fn fail(&mut self, why: String) {
        if !self.failed {
            self.failed = true;
            self.events.push_back(RxEvent::Failed(why));
        }
    }

    /// Block `b` has `k` symbols: rebuild it and check it (or hold it for its hash).
    fn rebuild(&mut self, b: u32) {
        let Some(mut p) = self.partial.remove(&b) else {
            return;
        };
        self.held -= p.bytes;
        let (k, m, s) = (
            self.layout.k_of(b) as usize,
            self.layout.m as usize,
            self.layout.symbol as usize,
        );
        if p.data.is_empty() {
            p.data = vec![0; k * s];
        }
        if p.present.iter().any(|x| !x) {
            let par: Vec<(usize, &[u8])> = p
                .parity
                .iter()
                .enumerate()
                .filter_map(|(j, x)| x.as_deref().map(|x| (j, x)))
                .collect();
            if self
                .rebuilder
                .rebuild(&mut p.data, s, &p.present, m, &par)
                .is_err()
            {
                return self.corrupt(b, p.seen);
            }
            self.stats.decoded += 1;
        }
        let mut data = p.data;
        data.truncate(self.layout.block_range(b).1 as usize);
        match self.hashes.get(&b) {
            Some(h) => {
                let h = *h;
                self.check(b, data, &h, p.seen);
            }
            None => {
                self.waiting.insert(b, data);
            }
        }
    }

    fn check(&mut self, b: u32, data: Vec<u8>, hash: &[u8; 32], seen: u32) {
        if blake3::hash(&data).as_bytes() != hash {
            return self.corrupt(b, seen);
        }
        self.hashes.remove(&b);
        self.done[b as usize] = true;
        self.done_count += 1;
        while self.low < self.blocks && self.done[self.low as usize] {
            self.low += 1;
        }
        let offset = self.layout.block_range(b).0;
        self.events.push_back(RxEvent::Write {
            offset,
            data,
            hash: *hash,
        });
        if self.complete() {
            self.events.push_back(RxEvent::Complete);
        }
    }

    /// A block that did not rebuild or match its hash (a forged or corrupt datagram): start
    /// it again, asking for a whole block's worth of new symbols.
    fn corrupt(&mut self, b: u32, seen: u32) {
        self.stats.corrupt += 1;
        let (k, m) = (self.layout.k_of(b), self.layout.m);
        self.partial.insert(b, Partial::new(k, m, seen));
    }

    /// A control message from the source.
    pub fn handle_msg(&mut self, now: Micros, msg: McastMsg) {
        let _ = now;
        match msg {
            McastMsg::Hashes { first, hashes } => {
                for (i, h) in hashes.into_iter().enumerate() {
                    let Some(b) = first.checked_add(i as u32).filter(|b| *b < self.blocks) else {
                        break;
                    };
                    if self.done[b as usize] {
                        continue;
                    }
                    self.hashes.insert(b, h);
                    if let Some(data) = self.waiting.remove(&b) {
                        self.check(b, data, &h, 0);
                    }
                }
            }
            McastMsg::End { .. } => {
                self.reached = self.blocks;
                // A file shorter than a train: its end (held back at the source until the
                // rate is known) must not be what the report waits for.
                let r = self.train.report();
                self.out.extend(r.map(McastMsg::Train));
            }
            _ => {}
        }
    }

    /// Timers: requests for the blocks the source has moved past.
    pub fn handle_timeout(&mut self, now: Micros) {
        if self.failed {
            return;
        }
        let r = self.train.handle_timeout(now);
        self.out.extend(r.map(McastMsg::Train));
        let mut naks = Vec::new();
        let limit = self.reached;
        for b in self.low..limit {
            if self.done[b as usize] || self.waiting.contains_key(&b) {
                continue;
            }
            let (k, m) = (self.layout.k_of(b), self.layout.m);
            // A block never seen at all gets its place now (it holds no symbol yet).
            let p = self
                .partial
                .entry(b)
                .or_insert_with(|| Partial::new(k, m, 0));
            if p.last_nak
                .is_some_and(|t| now.saturating_sub(t) < self.cfg.renak)
            {
                continue;
            }
            p.last_nak = Some(now);
            naks.push(Nak {
                block: b,
                seen: p.seen,
                need: k - p.have.min(k),
            });
            if naks.len() as u32 >= super::msg::MAX_LIST {
                break;
            }
        }
        if !naks.is_empty() {
            self.stats.naks += naks.len() as u64;
            self.out.push_back(McastMsg::Nak(naks));
        }
    }

    /// When [`Receiver::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> Micros {
        let mut t = self.train.poll_timeout();
        for b in self.low..self.reached {
            if self.done[b as usize] || self.waiting.contains_key(&b) {
                continue;
            }
            match self.partial.get(&b).and_then(|p| p.last_nak) {
                Some(n) => t = t.min(n + self.cfg.renak),
                None => return 0,
            }
        }
        t
    }

    /// The next message for the source.
    pub fn poll_msg(&mut self) -> Option<McastMsg> {
        self.out.pop_front()
    }

    /// The next thing for the shell to do.
    pub fn poll_event(&mut self) -> Option<RxEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plaintext datagram of `session` carrying symbol `index` of block `b`.
    fn datagram(session: u64, b: u32, index: u32, body: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; DGRAM_HEADER + body.len()];
        DgramHeader {
            session: session_tag(session),
            kind: DgramKind::Data,
            block: b,
            index,
            number: u64::from(b) << 16 | u64::from(index),
        }
        .write(&mut d);
        d[DGRAM_HEADER..].copy_from_slice(body);
        d
    }

    /// One symbol of each of many blocks holds each block's whole place: a receiver flooded so
    /// (or left far behind) stops at its limit with a clear error, not at the machine's.
    #[test]
    fn a_symbol_of_every_block_counts_whole_blocks_against_the_hold_limit() {
        let layout = Layout::new(64 * 1024 * 8, 16, 64, 8).unwrap(); // blocks of 1 KiB
        let cfg = ReceiverConfig {
            max_held: 10 * 1024,
            ..ReceiverConfig::default()
        };
        let mut r = Receiver::new(layout, 5, None, cfg);
        for b in 0..10 {
            r.handle_datagram(0, &mut datagram(5, b, 3, &[7; 16]));
        }
        assert_eq!(r.poll_event(), None, "ten blocks fit");
        r.handle_datagram(0, &mut datagram(5, 10, 3, &[7; 16]));
        match r.poll_event() {
            Some(RxEvent::Failed(why)) => assert!(why.contains("cannot keep up"), "{why}"),
            e => panic!("{e:?}"),
        }
    }

    /// A block whose source symbols came in any order, some twice, and one rebuilt from
    /// parity, is written whole once its hash is known.
    #[test]
    fn a_block_assembles_in_place_and_is_written_once_its_hash_is_known() {
        let (k, m, s) = (8u32, 2u32, 16usize);
        let layout = Layout::new(u64::from(k) * s as u64 - 5, s as u32, k, m).unwrap();
        let file: Vec<u8> = (0..layout.size).map(|i| (i * 13) as u8).collect();
        let mut padded = file.clone();
        padded.resize(k as usize * s, 0);
        let syms: Vec<&[u8]> = padded.chunks(s).collect();
        let parity = fec::encode(&syms, m as usize, s).unwrap();
        let mut r = Receiver::new(layout, 9, None, ReceiverConfig::default());
        for i in [7, 0, 3, 3, 1, 6, 2, 0, 5] {
            r.handle_datagram(0, &mut datagram(9, 0, i, syms[i as usize]));
        }
        assert_eq!(r.stats.duplicates, 2);
        r.handle_datagram(0, &mut datagram(9, 0, k + 1, &parity[1]));
        assert_eq!(r.stats.decoded, 1);
        assert_eq!(r.poll_event(), None, "no hash yet");
        let hash = *blake3::hash(&file).as_bytes();
        r.handle_msg(
            0,
            McastMsg::Hashes {
                first: 0,
                hashes: vec![hash],
            },
        );
        assert_eq!(
            r.poll_event(),
            Some(RxEvent::Write {
                offset: 0,
                data: file,
                hash
            })
        );
        assert_eq!(r.poll_event(), Some(RxEvent::Complete));
    }
}
