//! The multicast pusher: each product once to the group, paced at a configured rate.
//!
//! The pusher only says *what* to send (a product's start, a block's offset and length, an
//! index); the shell reads the bytes from the queue's files, so memory stays flat whatever
//! the product sizes. After each product, and every `index_interval` when idle, it sends an
//! [`Msg::Index`] with the newest sequence number handled: a receiver that missed a product
//! whole, or the tail of one, learns of it without waiting for the next product (LDM7's
//! receivers learn of a lost product only from the next one's BOP).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::fec::product_layout;
use super::msg::Msg;
use super::product::Micros;
use super::queue::ProductQueue;
use crate::mcast::layout::Layout;
use crate::mcast::msg::Nak;
use crate::mcast::sender::BlockRepair;

/// Multicast settings.
#[derive(Debug, Clone)]
pub struct PushConfig {
    /// The group, `ADDR:PORT` (told to subscribers).
    pub group: String,
    /// Sending rate in bytes per second (the datagram bytes, headers included).
    pub rate: u64,
    /// Bytes of product data per datagram.
    pub block: u32,
    /// Heartbeat period when idle.
    pub index_interval: Micros,
    /// Source symbols per block for repair by parity ([`super::fec`]); 0: unicast repair
    /// only (LDM7's way).
    pub k: u32,
    /// Parity symbols per block before indexes wrap to source symbols.
    pub m: u32,
}

impl PushConfig {
    /// How product `seq` of `size` bytes is cut for parity, when the feed repairs by parity.
    pub fn layout(&self, size: u64) -> Option<Layout> {
        if self.k == 0 {
            return None;
        }
        product_layout(size, self.block, self.k, self.m)
    }
}

/// What the shell sends next on the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOut {
    /// A message without product bytes (a product's start, an index).
    Msg(Msg),
    /// Bytes `offset..offset+len` of product `seq`, as a [`Msg::Data`].
    Block {
        /// Which product.
        seq: u64,
        /// Where in it.
        offset: u64,
        /// How many bytes.
        len: u32,
        /// Set when these bytes end a block's first pass while the group has been losing
        /// symbols lately: its parity will likely be asked for, and the shell may code the
        /// block now, away from the pacing (coding 1,024 symbols on the pacer's thread held
        /// it up past its burst: 114 ms of a 16-receiver run at 1% loss, 1.2% of the rate).
        code: Option<(Layout, u32)>,
    },
    /// Symbol `index` (past the block's first pass) of block `block` of product `seq`, as a
    /// [`Msg::Parity`] ([`super::fec::ParityCache`] computes it).
    Symbol {
        /// Which product.
        seq: u64,
        /// How it is cut.
        layout: Layout,
        /// Which block.
        block: u32,
        /// Symbol index.
        index: u32,
    },
}

/// Bytes a datagram costs on an Ethernet LAN beyond its message: the LAN's headers, the
/// feed's datagram header and its tag when the group is sealed (as the file send counts,
/// [`crate::mcast::sender::wire_overhead`]). A `--rate-mbps` of the LAN's rate is then the
/// LAN's rate, not 2% over it (72 bytes were counted here until 2026-11-28, 99 go on the
/// wire sealed) nor 1% under it in clear (the tag was counted there until 2026-11-28).
const fn wire(sealed: bool) -> u64 {
    crate::mcast::sender::LAN_HEADERS + super::seal::overhead(sealed) as u64
}
/// A data or parity message's header in a datagram (its short form).
const MSG_HEADER: u64 = super::msg::DGRAM_MSG_HEADER as u64;
/// Most credit the pacer banks when polled late: the shell's timer (1 ms in tokio) and a
/// busy host hold the pacing task up for milliseconds, and it catches up on up to this much
/// time at once; never more, so an idle spell does not become a burst (as
/// [`crate::mcast::sender::BURST`]).
const BURST: Micros = 20_000;

/// The pusher's state.
#[derive(Debug)]
pub struct Pusher {
    cfg: PushConfig,
    /// What a datagram costs on the LAN beyond its message ([`wire`]): set at the start.
    wire: u64,
    pending: VecDeque<u64>,
    current: Option<(u64, u64, u64)>,
    next_send: Micros,
    last_handled: u64,
    index_due: bool,
    last_index: Micros,
    sent_at: BTreeMap<u64, Micros>,
    /// Blocks granted parity: (product, block).
    repairs: BTreeMap<(u64, u32), Repair>,
    /// Blocks with granted symbols still to send, and their products' cut.
    due: BTreeSet<(u64, u32)>,
    layouts: BTreeMap<u64, Layout>,
    /// Datagrams and bytes sent.
    pub sent: (u64, u64),
    /// Of those, repair symbols (datagrams, bytes).
    pub repair: (u64, u64),
    /// Counts taken.
    pub naks: u64,
    /// Sending time lost to late polls: how far past its burst credit (20 ms) the pacer was
    /// polled while the first pass or granted repairs were waiting (a busy host's rate, lost
    /// for good).
    pub late: Micros,
    /// Whether something was waiting to go after the last datagram (what makes a late poll
    /// lost time rather than an idle spell).
    backlogged: bool,
    /// Datagrams chosen so far: the next one's number. The shell writes each one chosen
    /// under its number, or skips that number ([`crate::feed::seal::DgramWriter::skip`]).
    numbered: u64,
    /// The last block of the product whose pass ended last, until the group goes idle (then
    /// it gets parity ahead of the counts, [`Pusher::ahead`]) or the next product starts.
    tail: Option<(u64, u32, Layout)>,
}

/// A block's repair: its grants, and the numbers its symbols went out under.
#[derive(Debug)]
struct Repair {
    grants: BlockRepair,
    /// Granted ahead of any count ([`Pusher::ahead`]): not a measure of the group's loss.
    ahead: bool,
    /// Numbers of the block's repair datagrams, oldest first (at most the symbols granted).
    numbers: Vec<u64>,
}

/// Most blocks with repair state at once (a bound on what forged counts can hold).
const MAX_REPAIRS: usize = 1 << 16;
/// Most repair numbers kept per block (a bound on what forged counts can make it hold).
const MAX_NUMBERS: usize = 1024;
/// A block's repair state is kept this long after its last grant went out.
const FORGET_AFTER: Micros = 5_000_000;
/// Blocks the group's recent loss is read over ([`Pusher::recent_worst_loss`]).
const RECENT_BLOCKS: usize = 8;
/// How old a product's counts may be to tell the group's loss now.
const RECENT: Micros = 10_000_000;

impl Pusher {
    /// A pusher whose first product will be `next_seq`; its datagrams carry a tag when
    /// `sealed` (the group has a key), which the pacer counts.
    pub fn new(cfg: PushConfig, next_seq: u64, sealed: bool) -> Self {
        Self {
            cfg,
            wire: wire(sealed),
            pending: VecDeque::new(),
            current: None,
            next_send: 0,
            last_handled: next_seq.saturating_sub(1),
            index_due: false,
            last_index: 0,
            sent_at: BTreeMap::new(),
            repairs: BTreeMap::new(),
            due: BTreeSet::new(),
            layouts: BTreeMap::new(),
            sent: (0, 0),
            repair: (0, 0),
            naks: 0,
            late: 0,
            backlogged: false,
            numbered: 0,
            tail: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &PushConfig {
        &self.cfg
    }

    /// Queues a product for the group.
    pub fn push(&mut self, seq: u64) {
        self.pending.push_back(seq);
    }

    /// The first sequence number not yet started on the group: a subscriber joining now gets
    /// everything before it by unicast.
    pub fn next_unstarted(&self, queue_next: u64) -> u64 {
        self.pending.front().copied().unwrap_or(queue_next)
    }

    /// When the group carried product `seq`'s start (for its latency split).
    pub fn sent_at(&self, seq: u64) -> Option<Micros> {
        self.sent_at.get(&seq).copied()
    }

    /// Forgets send times of products no longer queued.
    pub fn forget_before(&mut self, seq: u64) {
        self.sent_at = self.sent_at.split_off(&seq);
        self.repairs = self.repairs.split_off(&(seq, 0));
        self.due = self.due.split_off(&(seq, 0));
        self.layouts = self.layouts.split_off(&seq);
        if self.tail.is_some_and(|(s, ..)| s < seq) {
            self.tail = None;
        }
    }

    /// True when nothing is queued or in progress.
    pub fn idle(&self) -> bool {
        self.pending.is_empty()
            && self.current.is_none()
            && self.due.is_empty()
            && self.tail.is_none()
    }

    /// True when block `b` of product `seq` (cut as `l`) has had its first pass.
    fn passed(&self, seq: u64, l: &Layout, b: u32) -> bool {
        if !self.sent_at.contains_key(&seq) {
            return false;
        }
        match self.current {
            Some((cur, offset, _)) if cur == seq => {
                let (a, n) = l.block_range(b);
                offset >= a + n
            }
            _ => true,
        }
    }

    /// A subscriber's counts of symbols it lacks of blocks of product `seq` (`size` bytes),
    /// written when it had `heard` the group's datagrams below that number: each block gets
    /// what the worst subscriber lacks past what is on its way to it, the symbols granted
    /// and not yet sent and those sent under a number it had not heard yet. That is exact
    /// however far or busy the subscriber is: a count from afar, or from one whose socket
    /// still holds the repairs, does not bring them again (with a time window instead, the
    /// group carried the far and the slow subscribers' losses two and three times).
    pub fn handle_nak(&mut self, now: Micros, seq: u64, size: u64, naks: &[Nak], heard: u64) {
        let Some(l) = self.cfg.layout(size) else {
            return;
        };
        self.naks += 1;
        for n in naks {
            let b = n.block;
            if u64::from(b) >= l.blocks() || !self.passed(seq, &l, b) {
                continue;
            }
            if self.repairs.len() >= MAX_REPAIRS && !self.repairs.contains_key(&(seq, b)) {
                // Forget blocks whose repairs ended a while ago (their receivers went on to
                // unicast or are done); a count past the bound waits for that.
                let due = &self.due;
                self.repairs.retain(|key, r| {
                    due.contains(key) || now.saturating_sub(r.grants.caught_up()) < FORGET_AFTER
                });
                if self.repairs.len() >= MAX_REPAIRS {
                    continue;
                }
            }
            let k = l.k_of(b);
            let r = self.repairs.entry((seq, b)).or_insert_with(|| Repair {
                grants: BlockRepair::new(k),
                ahead: false,
                numbers: Vec::new(),
            });
            let on_way = r.numbers.iter().rev().take_while(|&&x| x >= heard).count();
            if r.grants.grant_on_way(n.need.min(k), on_way as u32) {
                self.due.insert((seq, b));
                self.layouts.insert(seq, l);
            }
        }
    }

    /// The next datagram, if the pacer allows one now.
    pub fn poll(&mut self, now: Micros, q: &ProductQueue) -> Option<PushOut> {
        if now < self.next_send {
            return None;
        }
        let out = self.next_out(now, q)?;
        let bytes = match &out {
            PushOut::Block { len, .. } => u64::from(*len) + MSG_HEADER,
            PushOut::Symbol { .. } => u64::from(self.cfg.block) + MSG_HEADER,
            PushOut::Msg(_) => 64,
        } + self.wire;
        if let PushOut::Symbol { seq, block, .. } = out {
            self.repair.0 += 1;
            self.repair.1 += bytes;
            if let Some(r) = self.repairs.get_mut(&(seq, block)) {
                if r.numbers.len() >= MAX_NUMBERS {
                    // The oldest are long heard by every subscriber still counting.
                    r.numbers.drain(..MAX_NUMBERS / 2);
                }
                r.numbers.push(self.numbered);
            }
        }
        self.numbered += 1;
        self.sent.0 += 1;
        self.sent.1 += bytes;
        let cost = bytes * 1_000_000 / self.cfg.rate.max(1);
        if self.backlogged {
            self.late += now.saturating_sub(BURST).saturating_sub(self.next_send);
        }
        self.next_send = self.next_send.max(now.saturating_sub(BURST)) + cost;
        self.backlogged =
            !self.pending.is_empty() || self.current.is_some() || !self.due.is_empty();
        Some(out)
    }

    fn next_out(&mut self, now: Micros, q: &ProductQueue) -> Option<PushOut> {
        // Repairs go before new blocks: a block's subscribers wait on them, and they are what
        // keeps the incomplete blocks (held in memory for decoding) few.
        while let Some(&(seq, block)) = self.due.first() {
            let (Some(r), Some(layout)) =
                (self.repairs.get_mut(&(seq, block)), self.layouts.get(&seq))
            else {
                self.due.remove(&(seq, block));
                continue;
            };
            let (index, done) = r.grants.next(now);
            if done {
                self.due.remove(&(seq, block));
            }
            return Some(PushOut::Symbol {
                seq,
                layout: *layout,
                block,
                index,
            });
        }
        if let Some((seq, offset, size)) = self.current {
            let len = (size - offset).min(u64::from(self.cfg.block));
            if offset + len >= size {
                self.current = None;
                self.last_handled = seq;
                self.index_due = true;
                self.tail = self
                    .cfg
                    .layout(size)
                    .map(|l| (seq, l.blocks().saturating_sub(1) as u32, l));
            } else {
                self.current = Some((seq, offset + len, size));
            }
            let code = self.code_ahead(now, size, offset + len);
            return Some(PushOut::Block {
                seq,
                offset,
                len: len as u32,
                code,
            });
        }
        while let Some(seq) = self.pending.pop_front() {
            // A product that left the queue before its turn is skipped; receivers that want
            // it learn from the index and are told it is gone.
            let Some(e) = q.get(seq) else {
                self.last_handled = seq;
                continue;
            };
            self.tail = None;
            self.sent_at.insert(seq, now);
            if e.meta.size == 0 {
                self.last_handled = seq;
                self.index_due = true;
            } else {
                self.current = Some((seq, 0, e.meta.size));
            }
            return Some(PushOut::Msg(Msg::Product {
                meta: e.meta.clone(),
                sent_at: now,
            }));
        }
        if self.index_due || now.saturating_sub(self.last_index) >= self.cfg.index_interval {
            self.index_due = false;
            self.last_index = now;
            return Some(PushOut::Msg(Msg::Index {
                last_seq: self.last_handled,
            }));
        }
        if self.ahead(now) {
            return self.next_out(now, q);
        }
        None
    }

    /// The group has nothing to send: grants the last product's last block, before any count
    /// for it, the parity its worst subscriber lacked of recent blocks. Its counts could come
    /// only a round trip after the index that ends the product, and the rate would go unused
    /// meanwhile; the symbols are numbered like any repair, so a count that did not hear them
    /// brings nothing again. Returns true when symbols are due.
    fn ahead(&mut self, now: Micros) -> bool {
        let Some((seq, b, l)) = self.tail.take() else {
            return false;
        };
        // A product evicted meanwhile has nothing to read; a block with counts has its grant.
        if !self.sent_at.contains_key(&seq)
            || self.repairs.contains_key(&(seq, b))
            || self.repairs.len() >= MAX_REPAIRS
        {
            return false;
        }
        let k = l.k_of(b);
        // Rounded down: a block too small to expect a loss in gets none ahead (rounding up
        // would send every small product a symbol whatever the loss).
        let extra = (f64::from(k) * self.recent_worst_loss(now)).floor() as u32;
        if extra == 0 {
            return false;
        }
        let mut grants = BlockRepair::new(k);
        grants.grant_on_way(extra.min(k), 0);
        self.repairs.insert(
            (seq, b),
            Repair {
                grants,
                ahead: true,
                numbers: Vec::new(),
            },
        );
        self.due.insert((seq, b));
        self.layouts.insert(seq, l);
        true
    }

    /// The block that ends at `end` of a product of `size` bytes, and its cut, when the
    /// group has lost symbols lately ([`PushOut::Block`]'s `code`).
    fn code_ahead(&self, now: Micros, size: u64, end: u64) -> Option<(Layout, u32)> {
        let l = self.cfg.layout(size)?;
        let bb = l.block_bytes();
        let ends = end == size || end.is_multiple_of(bb);
        (ends && self.recent_worst_loss(now) > 0.0).then(|| (l, ((end - 1) / bb) as u32))
    }

    /// The worst subscriber's loss on the group lately: the parity granted on counts per
    /// source symbol, over the last [`RECENT_BLOCKS`] blocks that were counted, within
    /// [`RECENT`] (0 before any count, and after a quiet spell).
    fn recent_worst_loss(&self, now: Micros) -> f64 {
        let (mut granted, mut k) = (0u64, 0u64);
        let counted = self.repairs.iter().rev().filter(|(_, r)| !r.ahead);
        for ((seq, b), r) in counted.take(RECENT_BLOCKS) {
            let recent = self
                .sent_at
                .get(seq)
                .is_some_and(|&t| now.saturating_sub(t) < RECENT);
            if let (true, Some(l)) = (recent, self.layouts.get(seq)) {
                let kb = l.k_of(*b);
                granted += u64::from(r.grants.granted(kb));
                k += u64::from(kb);
            }
        }
        if k == 0 {
            0.0
        } else {
            granted as f64 / k as f64
        }
    }

    /// Counts `bytes` sent to the LAN another way (unicast repairs share the source's link):
    /// the group waits for them, so multicast and repairs together keep to the rate.
    pub fn charge(&mut self, now: Micros, bytes: u64) {
        let cost = (bytes + self.wire) * 1_000_000 / self.cfg.rate.max(1);
        self.next_send = self.next_send.max(now.saturating_sub(BURST)) + cost;
    }

    /// When [`Pusher::poll`] may next return something.
    pub fn poll_timeout(&self) -> Micros {
        if self.idle() && !self.index_due {
            self.next_send
                .max(self.last_index + self.cfg.index_interval)
        } else {
            self.next_send
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feed::product::ProductMeta;
    use crate::feed::queue::QueueLimits;

    /// A queue holding one product `name` of `size` bytes, and its sequence number.
    fn queue_of(name: &str, size: u64) -> (ProductQueue, u64) {
        let mut q = ProductQueue::new(
            QueueLimits {
                max_bytes: u64::MAX,
                max_age: u64::MAX,
            },
            1,
        );
        let meta = ProductMeta {
            seq: 0,
            name: name.into(),
            feedtype: "X".into(),
            created: 0,
            size,
            hash: [0; 32],
            tag: bytes::Bytes::new(),
        };
        let seq = q.insert(meta, 0).map(|_| q.last_seq()).unwrap().unwrap();
        (q, seq)
    }

    /// 1 MB/s, blocks of 917 bytes (1,000 with a sealed datagram's overhead), no parity.
    fn one_mb_per_s() -> PushConfig {
        PushConfig {
            group: "239.1.1.1:1".into(),
            rate: 1_000_000,
            block: 917,
            index_interval: 1_000_000,
            k: 0,
            m: 0,
        }
    }

    #[test]
    fn a_late_pusher_catches_up_at_most_a_burst() {
        let (q, seq) = queue_of("big", 1 << 30);
        // 1 MB/s: the product's start costs 134 us, a block of 917 + 83 bytes 1 ms.
        let mut p = Pusher::new(one_mb_per_s(), seq, true);
        p.push(seq);
        let mut drain = |now| std::iter::from_fn(|| p.poll(now, &q)).count();
        assert_eq!(drain(0), 1, "the product's start");
        assert_eq!(drain(134), 1, "a block");
        assert_eq!(drain(1_000), 0, "paced");
        // 5 ms late: caught up whole.
        assert_eq!(drain(6_134), 6);
        // A second late: 20 ms's worth (and the one due now), not a second's.
        assert_eq!(drain(1_006_134), 21);
        assert_eq!(drain(1_006_634), 0, "then the rate again");
        assert_eq!(drain(1_007_134), 1);
        // What the second late poll lost (the first, within the burst, lost nothing): from
        // the block due at 7,134 us to a burst before the poll.
        assert_eq!(p.late, 1_006_134 - 20_000 - 7_134);
    }

    #[test]
    fn in_clear_the_pacer_counts_no_tag() {
        let (q, seq) = queue_of("big", 1 << 30);
        // 1 MB/s, no tag (16 bytes less than sealed): the start costs 118 us, a block of
        // 917 + 67 bytes 984 us.
        let mut p = Pusher::new(one_mb_per_s(), seq, false);
        p.push(seq);
        assert!(p.poll(0, &q).is_some(), "the product's start");
        assert!(p.poll(117, &q).is_none());
        assert!(p.poll(118, &q).is_some(), "a block");
        assert!(p.poll(1_101, &q).is_none());
        assert!(p.poll(1_102, &q).is_some(), "the next block");
    }

    #[test]
    fn parity_ahead_goes_out_at_the_rate_after_the_index_not_a_heartbeat_later() {
        let (q, seq) = queue_of("p", 80);
        // Two blocks of 4 symbols of 10 bytes, 100 KB/s: about a millisecond a datagram.
        let cfg = PushConfig {
            group: "239.1.1.1:1".into(),
            rate: 100_000,
            block: 10,
            index_interval: 1_000_000,
            k: 4,
            m: 4,
        };
        let mut p = Pusher::new(cfg, seq, true);
        p.push(seq);
        let (mut now, mut outs, mut counted) = (0, Vec::new(), false);
        while now < 500_000 {
            match p.poll(now, &q) {
                Some(o) => outs.push((now, o)),
                None => now = p.poll_timeout().max(now + 1),
            }
            // Block 0 passed: a subscriber lacked 2 of its 4 symbols.
            let passed = outs
                .iter()
                .any(|(_, o)| matches!(o, PushOut::Block { offset: 40, .. }));
            if passed && !counted {
                let nak = Nak {
                    block: 0,
                    seen: 4,
                    need: 2,
                };
                p.handle_nak(now, seq, 80, &[nak], p.numbered);
                counted = true;
            }
        }
        let at_index = outs
            .iter()
            .find(|(_, o)| matches!(o, PushOut::Msg(Msg::Index { .. })))
            .map(|(t, _)| *t)
            .expect("the index");
        let ahead: Vec<_> = outs
            .iter()
            .filter_map(|(t, o)| match o {
                PushOut::Symbol {
                    block: 1, index, ..
                } => Some((*t, *index)),
                _ => None,
            })
            .collect();
        // Block 1 gets half its symbols (the loss of block 0), each a datagram's time apart.
        assert_eq!(ahead.iter().map(|a| a.1).collect::<Vec<_>>(), vec![4, 5]);
        assert!(ahead[0].0 - at_index < 5_000, "{ahead:?} after {at_index}");
        // The shell is told to code a block ahead once the group has lost symbols: not block
        // 0 (no count yet), block 1 at its last bytes, no datagram in between.
        let code: Vec<_> = outs
            .iter()
            .filter_map(|(_, o)| match o {
                PushOut::Block { offset, code, .. } => Some((*offset, code.map(|c| c.1))),
                _ => None,
            })
            .collect();
        let want = [0, 10, 20, 30, 40, 50, 60, 70].map(|o| (o, (o == 70).then_some(1)));
        assert_eq!(code, want);
    }

    #[test]
    fn counts_from_many_subscribers_share_one_grant() {
        let (q, seq) = queue_of("p", 100 * 10);
        // Blocks of 4 symbols of 10 bytes: 25 blocks.
        let cfg = PushConfig {
            group: "239.1.1.1:1".into(),
            rate: 1_000_000_000,
            block: 10,
            index_interval: 1_000_000,
            k: 4,
            m: 4,
        };
        let mut p = Pusher::new(cfg, seq, true);
        p.push(seq);
        let now = 1_000;
        // The start and the first 5 blocks' symbols, then counts arrive.
        let first: Vec<_> = (0..21).filter_map(|_| p.poll(now, &q)).collect();
        assert_eq!(first.len(), 21);
        let nak = |block, need| Nak {
            block,
            seen: 4,
            need,
        };
        // Block 9 is not sent yet: its count is early and ignored.
        // Datagrams 0-20 went out; the subscribers heard them all.
        p.handle_nak(now, seq, 1000, &[nak(1, 2), nak(9, 1)], 21);
        p.handle_nak(now, seq, 1000, &[nak(1, 1), nak(2, 3)], 21);
        p.handle_nak(now, seq, 1000, &[nak(1, 2)], 21);
        let sym = |o: Option<PushOut>| match o {
            Some(PushOut::Symbol { block, index, .. }) => Some((block, index)),
            _ => None,
        };
        let repairs: Vec<_> = (0..5).map(|_| sym(p.poll(now, &q))).collect();
        // Two for block 1 (the worst of 2, 1, 2), three for block 2, before new data.
        assert_eq!(
            repairs,
            vec![
                Some((1, 4)),
                Some((1, 5)),
                Some((2, 4)),
                Some((2, 5)),
                Some((2, 6))
            ]
        );
        assert_eq!(sym(p.poll(now, &q)), None, "then the product goes on");
        assert_eq!(p.repair.0, 5);
        // Block 1's repairs went as datagrams 21 and 22. A count written before it heard
        // them gets nothing more, however late it comes (a far or a busy subscriber); nor
        // one that heard 21 and waits for 22.
        p.handle_nak(now + 100, seq, 1000, &[nak(1, 1)], 21);
        assert_eq!(sym(p.poll(now + 100, &q)), None);
        p.handle_nak(now + 500_000, seq, 1000, &[nak(1, 2)], 21);
        assert_eq!(sym(p.poll(now + 500_000, &q)), None);
        p.handle_nak(now + 500_000, seq, 1000, &[nak(1, 1)], 22);
        assert_eq!(sym(p.poll(now + 500_000, &q)), None);
        // One that heard both and still lacks a symbol lost it: one more, at once.
        p.handle_nak(now + 500_000, seq, 1000, &[nak(1, 1)], 23);
        assert_eq!(sym(p.poll(now + 500_000, &q)), Some((1, 6)));

        // The rest of the product, its index, then (nothing else to send) the last block's
        // parity ahead of its counts: the worst loss of recent blocks, 6 of 8 symbols
        // (blocks 1 and 2), of its 4: 3 symbols.
        let rest: Vec<_> = std::iter::from_fn(|| p.poll(now + 500_000, &q)).collect();
        let n = rest.len();
        assert!(matches!(
            rest[n - 4],
            PushOut::Msg(Msg::Index { last_seq }) if last_seq == seq
        ));
        let ahead: Vec<_> = rest[n - 3..].iter().cloned().map(Some).map(sym).collect();
        assert_eq!(ahead, vec![Some((24, 4)), Some((24, 5)), Some((24, 6))]);
        // A count that did not hear them gets nothing again; one that did and still lacks
        // a symbol gets one.
        let heard_all = p.numbered;
        p.handle_nak(now + 600_000, seq, 1000, &[nak(24, 3)], heard_all - 3);
        assert_eq!(sym(p.poll(now + 600_000, &q)), None);
        p.handle_nak(now + 600_000, seq, 1000, &[nak(24, 1)], heard_all);
        assert_eq!(sym(p.poll(now + 600_000, &q)), Some((24, 7)));
        assert_eq!(p.poll(now + 600_000, &q), None, "once");
    }
}
