//! The feed's multicast repair by parity, on the file send's code
//! ([`crate::mcast::layout`], [`crate::mcast::fec`], [`crate::mcast::sender::BlockRepair`]).
//!
//! A multicast product is cut as the file send cuts a file: symbols of the multicast block
//! size (the [`Msg::Data`](super::msg::Msg::Data) datagrams the pusher sends anyway), blocks
//! of `k` symbols. A subscriber that lost symbols of a block says how many it still lacks
//! ([`Msg::Nak`](super::msg::Msg::Nak)); the source multicasts that many *new* symbols of the
//! block past everything already granted ([`Msg::Parity`](super::msg::Msg::Parity)); any `k`
//! distinct symbols rebuild the block. One parity symbol repairs a different loss at every
//! subscriber, so a block costs the group the worst subscriber's loss, not the sum that
//! unicast repairs cost the source's link (LDM7's way, and what held 16 subscribers at 5%
//! loss to 0.48 of the rate).
//!
//! Unicast repair stays where it is the right tool: a product missed whole or asked for as a
//! backlog, a block a subscriber lost most of (its loss far above the group's: parity for it
//! would cost everyone), a block still incomplete after [`RepairConfig::max_rounds`] rounds,
//! and blocks whose symbols could not be held ([`RepairConfig::max_held`]).

use std::collections::{BTreeMap, HashMap, VecDeque};

use bytes::Bytes;

use super::product::Micros;
use super::ranges::RangeSet;
use crate::mcast::fec;
use crate::mcast::layout::{Layout, Slot};
use crate::mcast::msg::Nak;
use crate::mcast::sender::CodedBlock;

/// Default source symbols per block: large blocks make the worst of many receivers' losses
/// close to the mean (`feed_sim`, 16 receivers 0.05-25 ms away, parity per byte at 1% / 5%
/// loss: 0.026 / 0.086 with 256, 0.020 / 0.075 with 1024, 0.019 / 0.073 with 2048). A
/// product is delivered whole, so a block as large as most products costs no latency.
pub const DEFAULT_K: u32 = 1024;
/// Default parity symbols per block before indexes wrap to source symbols again.
pub const DEFAULT_M: u32 = 256;

/// The cut of product of `size` bytes into blocks, the same at the source and every
/// subscriber; `None` when the numbers are unusable (then repair is by unicast).
pub fn product_layout(size: u64, symbol: u32, k: u32, m: u32) -> Option<Layout> {
    let syms = size.div_ceil(u64::from(symbol.max(1))).max(1);
    let k = u64::from(k).min(syms) as u32;
    Layout::new(size, symbol, k, m.min(k.max(1) * 4)).ok()
}

/// Counts a block may send per parity round allowed, repeats included (a budget of
/// `max_rounds` x this for the block), before it goes by unicast: a count that is never
/// answered is not repeated for ever.
const MAX_REPEATS: u32 = 3;

/// A subscriber's repair settings.
#[derive(Debug, Clone, Copy)]
pub struct RepairConfig {
    /// A block's count is repeated after this long while it is incomplete.
    pub renak: Micros,
    /// Parity rounds for a block before its gaps go by unicast.
    pub max_rounds: u32,
    /// A block missing more than this share of its symbols (in 1/1000, plus two symbols)
    /// goes by unicast: a loss far above the group's would make everyone take its parity.
    pub heavy_permille: u32,
    /// Most bytes of incomplete blocks held for decoding; past it, blocks go by unicast.
    pub max_held: u64,
}

impl Default for RepairConfig {
    fn default() -> Self {
        Self {
            renak: 40_000,
            max_rounds: 6,
            heavy_permille: 250,
            max_held: 256 << 20,
        }
    }
}

#[derive(Debug, Default)]
struct Held {
    syms: BTreeMap<u32, Bytes>,
    seen: u32,
    last_nak: Option<Micros>,
    /// Counts answered with symbols and asked again: parity rounds used.
    rounds: u32,
    /// Counts sent, repeats included.
    counts: u32,
    /// Symbols held when the last count went out.
    held_at_count: u32,
    /// Gone to unicast: when its gaps were last asked for.
    unicast: Option<Micros>,
}

/// What a subscriber asks for a product's blocks now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Parity counts (to [`Msg::Nak`](super::msg::Msg::Nak)).
    pub naks: Vec<Nak>,
    /// Byte gaps to repair by unicast.
    pub unicast: Vec<(u64, u64)>,
}

/// One product's blocks at a subscriber: symbols held until a block is whole or rebuilt.
#[derive(Debug)]
pub struct ProductFec {
    layout: Layout,
    blocks: BTreeMap<u32, Held>,
    held: u64,
    /// Rebuilds blocks with missing symbols (its work space made on first use).
    rebuilder: fec::Rebuilder,
    /// Blocks rebuilt with parity.
    pub decoded: u64,
}

impl ProductFec {
    /// A product cut as `layout`.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            blocks: BTreeMap::new(),
            held: 0,
            rebuilder: fec::Rebuilder::default(),
            decoded: 0,
        }
    }

    /// Bytes held.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Block of a byte offset and symbol index in it, when `offset` starts a symbol.
    fn locate(&self, offset: u64) -> Option<(u32, u32)> {
        let s = u64::from(self.layout.symbol);
        if !offset.is_multiple_of(s) {
            return None;
        }
        let bb = self.layout.block_bytes();
        Some(((offset / bb) as u32, ((offset % bb) / s) as u32))
    }

    fn block_done(&self, b: u32, have: &RangeSet) -> bool {
        let (a, n) = self.layout.block_range(b);
        have.uncovered(a, a + n).is_empty()
    }

    /// A source symbol arrived by multicast (its bytes are already in `have`); `room`: it may
    /// be held. Returns restored source symbols `(offset, bytes)` if its block was rebuilt.
    pub fn source(
        &mut self,
        offset: u64,
        data: &Bytes,
        have: &RangeSet,
        room: bool,
    ) -> Vec<(u64, Bytes)> {
        let Some((b, i)) = self.locate(offset) else {
            return Vec::new();
        };
        self.add(b, i, i + 1, data.clone(), have, room)
    }

    /// A symbol past a block's first pass arrived: rebuilds the block when it has `k`.
    pub fn parity(
        &mut self,
        b: u32,
        index: u32,
        data: Bytes,
        have: &RangeSet,
        room: bool,
    ) -> Vec<(u64, Bytes)> {
        if u64::from(b) >= self.layout.blocks() || data.len() != self.layout.symbol as usize {
            return Vec::new();
        }
        let k = self.layout.k_of(b);
        if index < k {
            return Vec::new();
        }
        let at = match self.layout.slot(b, index) {
            Slot::Parity(j) => k + j,
            Slot::Source(i) => i,
        };
        self.add(b, at, index.saturating_add(1), data, have, room)
    }

    fn add(
        &mut self,
        b: u32,
        at: u32,
        seen: u32,
        data: Bytes,
        have: &RangeSet,
        room: bool,
    ) -> Vec<(u64, Bytes)> {
        if self.block_done(b, have) {
            self.drop_block(b);
            return Vec::new();
        }
        let h = self.blocks.entry(b).or_default();
        h.seen = h.seen.max(seen);
        if !room {
            // Could not hold it: this block goes by unicast.
            h.unicast.get_or_insert(0);
            return Vec::new();
        }
        if h.syms.contains_key(&at) {
            return Vec::new();
        }
        self.held += data.len() as u64;
        h.syms.insert(at, data);
        if h.syms.len() as u32 >= self.layout.k_of(b) {
            return self.rebuild(b);
        }
        Vec::new()
    }

    fn drop_block(&mut self, b: u32) {
        if let Some(h) = self.blocks.remove(&b) {
            self.held -= h.syms.values().map(|s| s.len() as u64).sum::<u64>();
        }
    }

    /// `k` symbols of block `b` are here: the missing source symbols, decoded.
    fn rebuild(&mut self, b: u32) -> Vec<(u64, Bytes)> {
        let Some(h) = self.blocks.get(&b) else {
            return Vec::new();
        };
        let (k, m, s) = (
            self.layout.k_of(b) as usize,
            self.layout.m as usize,
            self.layout.symbol as usize,
        );
        let (off, len) = self.layout.block_range(b);
        // The product's last symbol is short on the wire: the code works on it zero-padded.
        let mut block = vec![0u8; k * s];
        let mut present = vec![false; k];
        for (i, d) in h.syms.range(..k as u32) {
            let at = *i as usize * s;
            let n = d.len().min(s);
            block[at..at + n].copy_from_slice(&d[..n]);
            present[*i as usize] = true;
        }
        if present.iter().all(|p| *p) {
            // Whole by its source symbols: nothing to rebuild.
            self.drop_block(b);
            return Vec::new();
        }
        let par: Vec<(usize, &[u8])> = h
            .syms
            .range(k as u32..)
            .map(|(j, d)| (*j as usize - k, d.as_ref()))
            .collect();
        let rebuilt = self.rebuilder.rebuild(&mut block, s, &present, m, &par);
        self.drop_block(b);
        // A forged or corrupt symbol rebuilds wrong bytes: the product's hash catches it
        // and the product is asked for again whole.
        if rebuilt.is_err() {
            return Vec::new();
        }
        self.decoded += 1;
        let block = Bytes::from(block);
        (0..k)
            .filter(|&i| !present[i])
            .filter_map(|i| {
                let at = i as u64 * s as u64;
                let n = (len.saturating_sub(at)).min(s as u64) as usize;
                (n > 0).then(|| (off + at, block.slice(i * s..i * s + n)))
            })
            .collect()
    }

    /// Incomplete blocks the group has passed (it sent their last symbol, or later ones,
    /// by `limit`).
    fn gap_blocks(&self, limit: u64, have: &RangeSet) -> Vec<u32> {
        let bb = self.layout.block_bytes();
        let passed = if limit >= self.layout.size {
            self.layout.blocks()
        } else {
            limit / bb
        };
        let mut out: Vec<u32> = Vec::new();
        for (a, e) in have.missing(limit.min(self.layout.size)) {
            let first = a / bb;
            let last = ((e - 1) / bb).min(passed.saturating_sub(1));
            for b in first..=last {
                if b < passed && out.last() != Some(&(b as u32)) {
                    out.push(b as u32);
                }
            }
            if first >= passed {
                break;
            }
        }
        out
    }

    /// What to ask for the incomplete blocks the group has passed by `limit`: counts for
    /// parity, gaps for unicast (repeated after `again`).
    pub fn plan(
        &mut self,
        now: Micros,
        limit: u64,
        have: &RangeSet,
        cfg: &RepairConfig,
        again: Micros,
    ) -> Plan {
        let mut plan = Plan::default();
        for b in self.gap_blocks(limit, have) {
            self.plan_block(now, b, have, cfg, again, &mut plan);
        }
        plan
    }

    fn plan_block(
        &mut self,
        now: Micros,
        b: u32,
        have: &RangeSet,
        cfg: &RepairConfig,
        again: Micros,
        plan: &mut Plan,
    ) {
        let k = self.layout.k_of(b);
        let h = self.blocks.entry(b).or_default();
        let need = k.saturating_sub(h.syms.len() as u32);
        let heavy = u64::from(need) * 1000 > u64::from(k) * u64::from(cfg.heavy_permille) + 2000;
        let spent = h.rounds >= cfg.max_rounds || h.counts >= cfg.max_rounds * MAX_REPEATS;
        if h.unicast.is_none() && (heavy || spent) {
            h.unicast = Some(0);
        }
        if let Some(t) = h.unicast {
            if t == 0 || now.saturating_sub(t) >= again {
                h.unicast = Some(now.max(1));
                let (a, n) = self.layout.block_range(b);
                plan.unicast.extend(have.uncovered(a, a + n));
            }
            return;
        }
        if h.last_nak
            .is_some_and(|t| now.saturating_sub(t) < cfg.renak)
            || need == 0
        {
            return;
        }
        // A repeat with nothing new since the last count is not a round: the count or its
        // repairs are still on their way (a busy subscriber's socket holds them), and the
        // source grants nothing twice for it. Rounds are counts that got symbols and still
        // fell short.
        let held = h.syms.len() as u32;
        if h.last_nak.is_none() || held > h.held_at_count {
            h.rounds += 1;
        }
        h.last_nak = Some(now);
        h.counts += 1;
        h.held_at_count = held;
        plan.naks.push(Nak {
            block: b,
            seen: h.seen.max(k),
            need,
        });
    }

    /// When [`ProductFec::plan`] will next ask something (0: now).
    pub fn next_at(
        &self,
        limit: u64,
        have: &RangeSet,
        cfg: &RepairConfig,
        again: Micros,
    ) -> Micros {
        let mut t = Micros::MAX;
        for b in self.gap_blocks(limit, have) {
            let at = match self.blocks.get(&b) {
                None => 0,
                Some(h) => match (h.unicast, h.last_nak) {
                    (Some(0), _) => 0,
                    (Some(u), _) => u + again,
                    (None, None) => 0,
                    (None, Some(n)) => n + cfg.renak,
                },
            };
            t = t.min(at);
        }
        t
    }
}

/// The source's recently coded blocks: parity is computed once per block and served to
/// every round from here (the shell and the simulator read the block's bytes).
#[derive(Debug)]
pub struct ParityCache {
    /// The blocks by product and block number.
    blocks: HashMap<(u64, u32), CodedBlock>,
    /// Their keys, oldest first: the order they leave in.
    order: VecDeque<(u64, u32)>,
    /// Bytes the blocks hold, as of their insertion (parity computed later is not counted:
    /// at most `m` symbols more a block).
    held: usize,
    /// The most bytes `held` may reach before the oldest blocks leave.
    cap: usize,
}

/// Bytes of blocks kept coded, their parity aside (k = 1024 symbols of 1400 bytes: 1.4 MB a
/// block, and up to `m` parity symbols more once computed).
const CACHED_BYTES: usize = 48 << 20;

impl Default for ParityCache {
    fn default() -> Self {
        Self::with_capacity(CACHED_BYTES)
    }
}

impl ParityCache {
    /// Whether block `block` of product `seq` is kept.
    pub fn contains(&self, seq: u64, block: u32) -> bool {
        self.blocks.contains_key(&(seq, block))
    }

    /// Keeps block `block` of product `seq`, coded elsewhere (ahead of its counts, off the
    /// pacer's thread: [`super::push::PushOut::Block`]'s `code`); the oldest blocks leave
    /// to make room. A block already kept stays as it is.
    pub fn insert(&mut self, seq: u64, block: u32, coded: CodedBlock) {
        let key = (seq, block);
        if self.blocks.contains_key(&key) {
            return;
        }
        while self.held + coded.data_bytes() > self.cap {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(c) = self.blocks.remove(&old) {
                self.held -= c.data_bytes();
            }
        }
        self.held += coded.data_bytes();
        self.order.push_back(key);
        self.blocks.insert(key, coded);
    }

    /// A cache that keeps at most `cap` bytes of blocks (their parity aside).
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            blocks: HashMap::new(),
            order: VecDeque::new(),
            held: 0,
            cap,
        }
    }

    /// Symbol `index` of block `block` of product `seq` (cut as `layout`) as the group's
    /// [`Msg::Parity`](super::msg::Msg::Parity), reading the block's bytes with
    /// `read(offset, len)` on a miss.
    pub fn parity<E: std::fmt::Display>(
        &mut self,
        seq: u64,
        layout: &Layout,
        block: u32,
        index: u32,
        read: impl FnOnce(u64, u64) -> Result<Vec<u8>, E>,
    ) -> Result<super::msg::Msg, String> {
        let key = (seq, block);
        if !self.blocks.contains_key(&key) {
            let (off, len) = layout.block_range(block);
            let data = read(off, len).map_err(|e| e.to_string())?;
            self.insert(seq, block, CodedBlock::new(layout, block, data));
        }
        let Some(c) = self.blocks.get_mut(&key) else {
            return Err(format!("block {block} of product {seq} left the cache"));
        };
        let sym = c.symbol(layout, block, index).map_err(|e| e.to_string())?;
        Ok(super::msg::Msg::Parity {
            seq,
            block,
            index,
            data: Bytes::copy_from_slice(sym),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product of 10 symbols of 4 bytes and a short last one (42 bytes), blocks of 4.
    fn product() -> (Layout, Vec<u8>) {
        let l = product_layout(42, 4, 4, 4).unwrap();
        (l, (0..42u8).collect())
    }

    fn sym(d: &[u8], l: &Layout, b: u32, i: u32) -> Bytes {
        let mut c = CodedBlock::new(
            l,
            b,
            d[l.block_range(b).0 as usize..][..l.block_range(b).1 as usize].to_vec(),
        );
        Bytes::copy_from_slice(c.symbol(l, b, i).unwrap())
    }

    #[test]
    fn the_parity_cache_reads_a_block_once_and_lets_the_oldest_go_by_bytes() {
        let (l, d) = product();
        // Room for two blocks of 16 bytes (the third of this product is 10).
        let mut cache = ParityCache::with_capacity(32);
        let mut reads = Vec::new();
        let ask = |cache: &mut ParityCache, seq: u64, b: u32, reads: &mut Vec<(u64, u32)>| {
            let m = cache
                .parity(seq, &l, b, 4, |off, len| {
                    reads.push((seq, b));
                    Ok::<_, String>(d[off as usize..][..len as usize].to_vec())
                })
                .unwrap();
            match m {
                super::super::msg::Msg::Parity { data, .. } => data,
                other => panic!("{other:?}"),
            }
        };
        let first = ask(&mut cache, 7, 0, &mut reads);
        assert_eq!(
            first,
            sym(&d, &l, 0, 4),
            "the same parity as the block coded alone"
        );
        ask(&mut cache, 7, 0, &mut reads);
        ask(&mut cache, 7, 1, &mut reads);
        assert_eq!(reads, [(7, 0), (7, 1)], "a block is read once while held");
        // A third block goes over the bytes: the oldest (7, 0) leaves, (7, 1) stays.
        ask(&mut cache, 8, 0, &mut reads);
        ask(&mut cache, 7, 1, &mut reads);
        assert_eq!(reads.len(), 3);
        ask(&mut cache, 7, 0, &mut reads);
        assert_eq!(reads, [(7, 0), (7, 1), (8, 0), (7, 0)]);
    }

    #[test]
    fn a_block_coded_ahead_is_served_without_a_read_and_the_same() {
        let (l, d) = product();
        let mut cache = ParityCache::with_capacity(32);
        let block =
            |b: u32| d[l.block_range(b).0 as usize..][..l.block_range(b).1 as usize].to_vec();
        let mut ahead = CodedBlock::new(&l, 1, block(1));
        ahead.code(&l).unwrap();
        cache.insert(7, 1, ahead);
        assert!(cache.contains(7, 1) && !cache.contains(7, 0));
        // Inserted again (the pacer coded it meanwhile): kept once.
        cache.insert(7, 1, CodedBlock::new(&l, 1, block(1)));
        let m = cache
            .parity(7, &l, 1, 5, |_, _| {
                Err::<Vec<u8>, _>("no read: it is coded")
            })
            .unwrap();
        let super::super::msg::Msg::Parity { data, .. } = m else {
            panic!("{m:?}")
        };
        assert_eq!(data, sym(&d, &l, 1, 5));
        // Two more blocks of 16 bytes go over the 32: the oldest leaves.
        cache.insert(7, 0, CodedBlock::new(&l, 0, block(0)));
        cache.insert(8, 0, CodedBlock::new(&l, 0, block(0)));
        assert!(!cache.contains(7, 1) && cache.contains(7, 0) && cache.contains(8, 0));
    }

    #[test]
    fn parity_rebuilds_lost_symbols_including_a_short_last_one() {
        let (l, d) = product();
        assert_eq!((l.blocks(), l.k_of(2)), (3, 3));
        let mut f = ProductFec::new(l);
        let mut have = RangeSet::default();
        let cfg = RepairConfig::default();
        // Block 2 (bytes 32..42): symbols 0 and 2 (the short one, 2 bytes) lost.
        have.insert(36, 40);
        assert!(f
            .source(36, &Bytes::copy_from_slice(&d[36..40]), &have, true)
            .is_empty());
        // Blocks 0 and 1 passed with nothing held: everything lacking is heavy, so unicast;
        // block 2 is not passed yet.
        let p = f.plan(0, 40, &have, &cfg, 1_000_000);
        assert!(
            p.naks.is_empty() && p.unicast == vec![(0, 16), (16, 32)],
            "{p:?}"
        );
        let mut f = ProductFec::new(l);
        f.source(36, &Bytes::copy_from_slice(&d[36..40]), &have, true);
        have.insert(0, 32);
        let plan = f.plan(50_000, 42, &have, &cfg, 1_000_000);
        assert_eq!(
            plan.naks,
            vec![Nak {
                block: 2,
                seen: 3,
                need: 2
            }]
        );
        assert!(f.next_at(42, &have, &cfg, 1_000_000) == 90_000);
        assert!(f.parity(2, 3, sym(&d, &l, 2, 3), &have, true).is_empty());
        let got = f.parity(2, 5, sym(&d, &l, 2, 5), &have, true);
        assert_eq!(
            got,
            vec![
                (32, Bytes::copy_from_slice(&d[32..36])),
                (40, Bytes::copy_from_slice(&d[40..42]))
            ]
        );
        assert_eq!((f.decoded, f.held()), (1, 0));
    }

    #[test]
    fn heavy_loss_and_too_many_rounds_go_by_unicast() {
        let l = product_layout(4 * 64, 4, 64, 64).unwrap();
        let mut f = ProductFec::new(l);
        let cfg = RepairConfig {
            max_rounds: 2,
            ..RepairConfig::default()
        };
        let d = vec![7u8; 4];
        let mut have = RangeSet::default();
        // 40 of 64 symbols here: 24 lacking is above a quarter and two: unicast.
        for i in 0..40u64 {
            have.insert(i * 4, i * 4 + 4);
            f.source(i * 4, &Bytes::copy_from_slice(&d), &have, true);
        }
        let p = f.plan(0, 256, &have, &cfg, 1_000_000);
        assert!(p.naks.is_empty());
        assert_eq!(p.unicast, vec![(160, 256)]);
        // Asked again only after `again`.
        assert_eq!(f.plan(10, 256, &have, &cfg, 1_000_000), Plan::default());
        assert_eq!(
            f.plan(1_000_010, 256, &have, &cfg, 1_000_000).unicast.len(),
            1
        );

        // 60 of 64: parity. A count answered with symbols that still fall short is a round:
        // two rounds, then unicast.
        let whole = vec![7u8; 256];
        let sixty = || {
            let mut f = ProductFec::new(l);
            let mut have = RangeSet::default();
            for i in 0..60u64 {
                have.insert(i * 4, i * 4 + 4);
                f.source(i * 4, &Bytes::copy_from_slice(&d), &have, true);
            }
            (f, have)
        };
        let (mut f, have) = sixty();
        let round = |f: &mut ProductFec, t| f.plan(t, 256, &have, &cfg, 1_000_000);
        assert_eq!(round(&mut f, 0).naks.len(), 1);
        assert_eq!(round(&mut f, 10), Plan::default(), "renak not due");
        f.parity(0, 64, sym(&whole, &l, 0, 64), &have, true);
        assert_eq!(round(&mut f, 40_000).naks.len(), 1);
        f.parity(0, 65, sym(&whole, &l, 0, 65), &have, true);
        let p = round(&mut f, 80_000);
        assert!(p.naks.is_empty() && p.unicast == vec![(240, 256)], "{p:?}");

        // Counts that bring nothing (the repairs still in a busy socket, or the count lost)
        // are repeats, not rounds: three per round allowed, then unicast all the same.
        let (mut f, have) = sixty();
        let round = |f: &mut ProductFec, t| f.plan(t, 256, &have, &cfg, 1_000_000);
        for n in 0..6 {
            assert_eq!(round(&mut f, n * 40_000).naks.len(), 1, "count {n}");
        }
        let p = round(&mut f, 6 * 40_000);
        assert!(p.naks.is_empty() && p.unicast == vec![(240, 256)], "{p:?}");
    }
}
