//! The subscriber's state machine: products arriving by multicast and by unicast assembled,
//! gaps found and repaired, every product delivered once, latency split.
//!
//! A gap shows three ways: a product's blocks stop short (the sender moved on to a later
//! product, sent an index past it, or went quiet for `repair_delay`) and the missing blocks
//! are asked for as ranges; a sequence number is skipped (a later product or an index shows
//! it) and the whole product is asked for; a product's bytes do not match its hash (a forged
//! or corrupt datagram) and it is asked for whole over the authenticated connection. Requests
//! are repeated after `rerequest` without progress. Multicast that never arrives (no datagram,
//! not even the source's heartbeat, for `fallback_after`) switches the subscriber to unicast.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use super::fec::{product_layout, ProductFec, RepairConfig};
use super::msg::Msg;
use super::product::{Micros, ProductAuth, ProductMeta, Subscription};
use super::ranges::RangeSet;

/// Timers.
#[derive(Debug, Clone, Copy)]
pub struct ReceiverConfig {
    /// Silence on a product's multicast after which its missing blocks are asked for.
    pub repair_delay: Micros,
    /// A request without progress for this long is repeated.
    pub rerequest: Micros,
    /// No multicast at all for this long: fall back to unicast.
    pub fallback_after: Micros,
    /// Least time between acknowledgements.
    pub ack_interval: Micros,
    /// Repair by parity on the group (when the source offers it).
    pub parity: RepairConfig,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        Self {
            repair_delay: 50_000,
            rerequest: 1_000_000,
            fallback_after: 3_000_000,
            ack_interval: 100_000,
            parity: RepairConfig::default(),
        }
    }
}

/// Where a product's latency went, as seed 003 splits it (propagation is inside
/// transmission: one clock per host cannot tell them apart).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Latency {
    /// Creation to the source starting to send it (queueing at the source).
    pub waiting_us: Micros,
    /// Start of sending to the end of the first pass (or delivery, when nothing was missed).
    pub transmission_us: Micros,
    /// The end of the first pass (or the first request, for a product missed whole) to
    /// delivery, when anything had to be repaired.
    pub repair_us: Micros,
    /// Creation to verified delivery.
    pub total_us: Micros,
}

impl Latency {
    /// The split of a product created at `created`, started by the source at `sent_at`, whose
    /// first pass ended here at `pass_end` (if it did: a product taken by unicast has none)
    /// and whose repair was first asked for at `repair_from`, delivered at `now`. Repair is
    /// what came after the pass: a block's loss asked for while later blocks still arrive
    /// overlaps transmission and costs the product nothing past the pass.
    fn split(
        created: Micros,
        sent_at: Micros,
        pass_end: Option<Micros>,
        repair_from: Option<Micros>,
        now: Micros,
    ) -> Self {
        let end_tx = match (pass_end, repair_from) {
            (_, None) => now,
            (Some(e), Some(_)) => e.min(now),
            (None, Some(r)) => r.min(now),
        }
        .max(sent_at);
        Self {
            waiting_us: sent_at.saturating_sub(created),
            transmission_us: end_tx.saturating_sub(sent_at),
            repair_us: if repair_from.is_some() {
                now.saturating_sub(end_tx)
            } else {
                0
            },
            total_us: now.saturating_sub(created),
        }
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RxEvent {
    /// A product starts: open its temporary copy.
    Begin(ProductMeta),
    /// Bytes of it: write them at `offset` (may repeat bytes already written).
    Data {
        /// Which product.
        seq: u64,
        /// Where.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Every byte is here: check the copy against the hash and call [`Receiver::confirm`].
    Complete(u64),
    /// Verified and done: move it into place.
    Delivered {
        /// What it is.
        meta: ProductMeta,
        /// Where its latency went.
        latency: Latency,
        /// Bytes that came by repair.
        repaired: u64,
        /// It came (at least partly) by multicast.
        multicast: bool,
    },
    /// Drop the temporary copy of this product (corrupt, or gone from the source).
    Discard(u64),
    /// Products that left the source's queue before they reached this subscriber.
    Lost {
        /// First.
        from: u64,
        /// Last.
        to: u64,
    },
    /// Multicast did not arrive: the stream now comes by unicast.
    FellBack,
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct RxStats {
    /// Multicast datagrams taken.
    pub datagrams: u64,
    /// Block-range repair requests sent (unicast repair).
    pub repair_requests: u64,
    /// Parity counts sent (repair by parity on the group).
    pub naks: u64,
    /// Blocks rebuilt with parity.
    pub decoded: u64,
    /// Whole-product requests sent.
    pub whole_requests: u64,
    /// Products whose tag did not verify (ignored).
    pub bad_tags: u64,
    /// Products whose bytes did not match their hash (asked for again).
    pub corrupt: u64,
    /// Products reported gone.
    pub lost: u64,
    /// Products delivered.
    pub delivered: u64,
}

struct Partial {
    meta: ProductMeta,
    sent_at: Micros,
    have: RangeSet,
    mcast: bool,
    eop: bool,
    /// End of the furthest bytes the group delivered: before the end of the product, only
    /// gaps below it are losses (the rest is not sent yet).
    high: u64,
    /// Ranges asked for and not yet asked again.
    asked: RangeSet,
    started: Micros,
    last_activity: Micros,
    requested_at: Option<Micros>,
    /// The first repair request (or when the product was noticed missing).
    repair_from: Option<Micros>,
    /// When the group's first pass of it ended here: its last bytes came by multicast, or a
    /// later product (or index) showed the source was past it. Transmission ends here and
    /// repair begins, however early the first request for a lost block went out.
    pass_end: Option<Micros>,
    repaired: u64,
    complete: bool,
    /// Blocks held for repair by parity (multicast products, when the source codes them).
    fec: Option<ProductFec>,
}

/// One subscriber's receiving side.
pub struct Receiver {
    cfg: ReceiverConfig,
    auth: Arc<dyn ProductAuth>,
    sub: Subscription,
    block: u64,
    /// The source's parity coding `(k, m)` ([`Msg::Coding`]), if it repairs by parity.
    coding: Option<(u32, u32)>,
    multicast: bool,
    mcast_from: u64,
    expected: u64,
    partial: BTreeMap<u64, Partial>,
    /// Products asked for whole: (noticed, last asked; 0 = not yet).
    wanted: BTreeMap<u64, (Micros, Micros)>,
    /// Products whose blocks arrive but whose start was lost: only their metadata is asked
    /// for (noticed, last asked; 0 = not yet).
    described: BTreeMap<u64, (Micros, Micros)>,
    /// The group's data and parity of described products, held until their metadata comes
    /// (a round trip away): without them a subscriber far from the source would lose a
    /// round trip's worth of the product with its start, and take it by unicast.
    orphans: BTreeMap<u64, Vec<Msg>>,
    /// Payload bytes in `orphans` (at most [`MAX_ORPHAN_BYTES`]).
    orphan_bytes: u64,
    done_below: u64,
    done: BTreeSet<u64>,
    out: VecDeque<Msg>,
    events: VecDeque<RxEvent>,
    last_mcast: Micros,
    acked: u64,
    last_ack: Micros,
    /// The round trip to the source, as the shell measures it ([`Receiver::set_rtt`]): a
    /// count is not repeated before its repairs could have come back.
    rtt: Micros,
    /// One past the number of the newest group datagram taken (0: none yet); told in counts.
    heard: u64,
    /// Counters.
    pub stats: RxStats,
}

/// Most sequence numbers one message may make the receiver wait for (a bound on what a
/// forged datagram can cost).
const MAX_GAP: u64 = 1 << 20;
/// Most round trip taken from the shell (a bound on how long a lost count waits).
pub const MAX_RTT: Micros = 2_000_000;
/// Most bytes of the group's datagrams held for products whose start was lost (a round trip
/// at 1 Gbit/s and 100 ms is 12.5 MB).
const MAX_ORPHAN_BYTES: u64 = 16 << 20;

impl Receiver {
    /// A receiver after the source's `Accepted` (`group` non-empty: multicast).
    pub fn new(
        cfg: ReceiverConfig,
        auth: Arc<dyn ProductAuth>,
        sub: Subscription,
        accepted: &Msg,
        now: Micros,
    ) -> Option<Self> {
        let Msg::Accepted {
            group,
            block,
            mcast_from,
            first,
            ..
        } = accepted
        else {
            return None;
        };
        let multicast = !group.is_empty();
        Some(Self {
            cfg,
            auth,
            sub,
            block: u64::from((*block).max(1)),
            coding: None,
            multicast,
            mcast_from: *mcast_from,
            expected: *mcast_from,
            partial: BTreeMap::new(),
            wanted: BTreeMap::new(),
            described: BTreeMap::new(),
            orphans: BTreeMap::new(),
            orphan_bytes: 0,
            done_below: (*first).max(1),
            done: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            last_mcast: now,
            acked: first.saturating_sub(1),
            last_ack: 0,
            rtt: 0,
            heard: 0,
            stats: RxStats::default(),
        })
    }

    /// The round trip to the source (the connection's smoothed RTT, measured by the shell):
    /// a parity count is repeated after `renak` plus this, so a subscriber far from the
    /// source does not ask again for symbols still on their way (its repeat would make the
    /// source send them twice, to every subscriber).
    pub fn set_rtt(&mut self, rtt: Micros) {
        self.rtt = rtt.min(MAX_RTT);
    }

    /// The parity settings with the round trip added to the wait before a repeat.
    fn parity(&self) -> RepairConfig {
        RepairConfig {
            renak: self.cfg.parity.renak + self.rtt,
            ..self.cfg.parity
        }
    }

    /// True while the stream comes by multicast.
    pub fn multicast(&self) -> bool {
        self.multicast
    }

    /// Every product below this is delivered or settled (the position to resume from).
    pub fn resume_seq(&self) -> u64 {
        self.done_below
    }

    /// Products delivered past [`Receiver::resume_seq`] (out of order). A subscriber that
    /// reconnects resumes from that position, and the source sends these again: its next
    /// receiver takes them ([`Receiver::already_delivered`]) so they are not delivered twice.
    pub fn delivered_past_resume(&self) -> Vec<u64> {
        self.done.iter().copied().collect()
    }

    /// Products an earlier session of this subscriber delivered
    /// ([`Receiver::delivered_past_resume`]): skipped when they come again.
    pub fn already_delivered(&mut self, seqs: impl IntoIterator<Item = u64>) {
        for seq in seqs {
            self.mark_done(seq);
        }
    }

    /// Products being received or awaited.
    pub fn in_flight(&self) -> usize {
        self.partial.len() + self.wanted.len() + self.described.len()
    }

    fn is_done(&self, seq: u64) -> bool {
        seq < self.done_below || self.done.contains(&seq)
    }

    fn mark_done(&mut self, seq: u64) {
        if seq >= self.done_below {
            self.done.insert(seq);
        }
        while self.done.remove(&self.done_below) {
            self.done_below += 1;
        }
    }

    /// A multicast datagram's message and number (the shell checked the feed id and seal).
    pub fn handle_multicast(&mut self, now: Micros, number: u64, msg: Msg) {
        if !self.multicast {
            return;
        }
        self.heard = self.heard.max(number.saturating_add(1));
        self.stats.datagrams += 1;
        self.last_mcast = now;
        match msg {
            Msg::Product { .. } | Msg::Data { .. } => {
                let seq = match &msg {
                    Msg::Product { meta, .. } => meta.seq,
                    Msg::Data { seq, .. } => *seq,
                    _ => return,
                };
                if seq < self.mcast_from {
                    return;
                }
                self.saw_seq(now, seq, false);
                self.take(now, msg, true);
            }
            Msg::Index { last_seq } => self.saw_seq(now, last_seq, true),
            Msg::Parity {
                seq,
                block,
                index,
                data,
            } => self.take_parity(now, seq, block, index, data),
            _ => {}
        }
    }

    /// Bytes held for decoding, over every product.
    fn fec_held(&self) -> u64 {
        self.partial
            .values()
            .filter_map(|p| p.fec.as_ref())
            .map(ProductFec::held)
            .sum()
    }

    fn take_parity(&mut self, now: Micros, seq: u64, block: u32, index: u32, data: Bytes) {
        let room = self.fec_held() < self.cfg.parity.max_held;
        let Some(p) = self.partial.get_mut(&seq) else {
            let msg = Msg::Parity {
                seq,
                block,
                index,
                data,
            };
            self.hold_orphan(seq, msg);
            return;
        };
        let Some(fec) = p.fec.as_mut().filter(|_| !p.complete) else {
            return;
        };
        p.last_activity = now;
        let restored = fec.parity(block, index, data, &p.have, room);
        self.restored(seq, restored);
    }

    /// Source symbols rebuilt from parity: written like any bytes, counted as repaired.
    fn restored(&mut self, seq: u64, restored: Vec<(u64, Bytes)>) {
        let Some(p) = self.partial.get_mut(&seq) else {
            return;
        };
        if restored.is_empty() {
            return;
        }
        self.stats.decoded += 1;
        for (offset, data) in restored {
            let new = p.have.insert(offset, offset + data.len() as u64);
            p.repaired += new;
            if new > 0 {
                self.events.push_back(RxEvent::Data { seq, offset, data });
            }
        }
        self.check_complete(seq);
    }

    /// A message on the unicast connection.
    pub fn handle_unicast(&mut self, now: Micros, msg: Msg) {
        match msg {
            Msg::Product { .. } | Msg::Data { .. } => self.take(now, msg, false),
            Msg::Index { last_seq } => {
                // Everything wanted up to here was sent before this, in order: the rest of
                // the range was not wanted.
                let to = last_seq.min(self.mcast_from.saturating_sub(1));
                if to >= self.done_below && to - self.done_below < MAX_GAP {
                    for s in self.done_below..=to {
                        if !self.partial.contains_key(&s)
                            && !self.wanted.contains_key(&s)
                            && !self.described.contains_key(&s)
                        {
                            self.mark_done(s);
                        }
                    }
                }
            }
            Msg::Skip { from, to, gone } => self.skip(from, to, gone),
            Msg::Coding { k, m } => self.coding = Some((k, m)),
            _ => {}
        }
    }

    /// The sender reached `seq` (`through`: and finished it): earlier products it left
    /// incomplete are due for repair, sequence numbers never seen are asked for whole.
    fn saw_seq(&mut self, now: Micros, seq: u64, through: bool) {
        let end = if through { seq.saturating_add(1) } else { seq };
        if end > self.expected && end - self.expected <= MAX_GAP {
            for s in self.expected..end {
                if !self.is_done(s)
                    && !self.partial.contains_key(&s)
                    && !self.described.contains_key(&s)
                {
                    self.wanted.entry(s).or_insert((now, 0));
                }
            }
        }
        self.expected = self.expected.max(end);
        for p in self.partial.range_mut(..end).map(|(_, p)| p) {
            p.eop = true;
            if p.mcast {
                p.pass_end.get_or_insert(now);
            }
        }
    }

    fn take(&mut self, now: Micros, msg: Msg, mcast: bool) {
        match msg {
            Msg::Product { meta, sent_at } => {
                let seq = meta.seq;
                if self.is_done(seq) || self.partial.contains_key(&seq) {
                    return;
                }
                if !self.auth.verify(&meta) {
                    self.stats.bad_tags += 1;
                    return;
                }
                if mcast {
                    self.expected = self.expected.max(seq + 1);
                }
                let described = self.described.remove(&seq).is_some();
                if !self.sub.matches(&meta) {
                    self.wanted.remove(&seq);
                    self.drop_orphans(seq);
                    self.mark_done(seq);
                    return;
                }
                let noticed = self.wanted.remove(&seq).map(|w| w.0);
                // A described product goes on arriving by multicast; its gaps are repaired.
                let (mcast, eop) = (mcast || described, described && self.expected > seq + 1);
                self.events.push_back(RxEvent::Begin(meta.clone()));
                let fec = self
                    .coding
                    .filter(|_| mcast)
                    .and_then(|(k, m)| product_layout(meta.size, self.block as u32, k, m))
                    .map(ProductFec::new);
                let p = Partial {
                    meta,
                    sent_at,
                    have: RangeSet::default(),
                    mcast,
                    eop,
                    high: 0,
                    asked: RangeSet::default(),
                    started: now,
                    last_activity: now,
                    requested_at: None,
                    repair_from: noticed,
                    pass_end: eop.then_some(now),
                    repaired: 0,
                    complete: false,
                    fec,
                };
                self.partial.insert(seq, p);
                self.check_complete(seq);
                self.replay_orphans(now, seq);
            }
            Msg::Data { seq, offset, data } => {
                let held = if mcast { self.fec_held() } else { 0 };
                let Some(p) = self.partial.get_mut(&seq) else {
                    // Blocks of a product whose start was lost: its metadata is asked for,
                    // and the blocks are held until it is here.
                    if mcast && !self.is_done(seq) && !self.wanted.contains_key(&seq) {
                        self.described.entry(seq).or_insert((now, 0));
                        self.hold_orphan(seq, Msg::Data { seq, offset, data });
                    }
                    return;
                };
                let end = offset.saturating_add(data.len() as u64);
                if p.complete || end > p.meta.size {
                    return;
                }
                p.last_activity = now;
                if mcast {
                    p.high = p.high.max(end);
                    if end == p.meta.size {
                        p.pass_end.get_or_insert(now);
                    }
                }
                let new = p.have.insert(offset, end);
                if p.repair_from.is_some() && !mcast {
                    p.repaired += new;
                }
                if new > 0 {
                    let restored = match (&mut p.fec, mcast) {
                        (Some(fec), true) => {
                            let room = held < self.cfg.parity.max_held;
                            fec.source(offset, &data, &p.have, room)
                        }
                        _ => Vec::new(),
                    };
                    self.events.push_back(RxEvent::Data { seq, offset, data });
                    self.restored(seq, restored);
                    self.check_complete(seq);
                }
            }
            _ => {}
        }
    }

    /// Holds a datagram of described product `seq` until its metadata comes.
    fn hold_orphan(&mut self, seq: u64, msg: Msg) {
        let len = match &msg {
            Msg::Data { data, .. } | Msg::Parity { data, .. } => data.len() as u64,
            _ => return,
        };
        if !self.described.contains_key(&seq) || self.orphan_bytes + len > MAX_ORPHAN_BYTES {
            return;
        }
        self.orphan_bytes += len;
        self.orphans.entry(seq).or_default().push(msg);
    }

    /// Takes the datagrams held for product `seq` now that it is known.
    fn replay_orphans(&mut self, now: Micros, seq: u64) {
        let Some(held) = self.drop_orphans(seq) else {
            return;
        };
        for m in held {
            match m {
                Msg::Parity {
                    seq,
                    block,
                    index,
                    data,
                } => self.take_parity(now, seq, block, index, data),
                m => self.take(now, m, true),
            }
        }
    }

    fn drop_orphans(&mut self, seq: u64) -> Option<Vec<Msg>> {
        let held = self.orphans.remove(&seq)?;
        for m in &held {
            if let Msg::Data { data, .. } | Msg::Parity { data, .. } = m {
                self.orphan_bytes -= data.len() as u64;
            }
        }
        Some(held)
    }

    fn check_complete(&mut self, seq: u64) {
        if let Some(p) = self.partial.get_mut(&seq) {
            if !p.complete && p.have.len() == p.meta.size {
                p.complete = true;
                p.fec = None;
                self.events.push_back(RxEvent::Complete(seq));
            }
        }
    }

    /// The shell checked product `seq`'s copy against its hash.
    pub fn confirm(&mut self, now: Micros, seq: u64, ok: bool) {
        let Some(p) = self.partial.remove(&seq) else {
            return;
        };
        if !ok {
            self.stats.corrupt += 1;
            self.events.push_back(RxEvent::Discard(seq));
            self.wanted.insert(seq, (p.repair_from.unwrap_or(now), 0));
            return;
        }
        let created = p.meta.created;
        let latency = Latency::split(created, p.sent_at, p.pass_end, p.repair_from, now);
        self.stats.delivered += 1;
        self.mark_done(seq);
        self.events.push_back(RxEvent::Delivered {
            meta: p.meta,
            latency,
            repaired: p.repaired,
            multicast: p.mcast,
        });
    }

    fn skip(&mut self, from: u64, to: u64, gone: bool) {
        if to < from {
            return;
        }
        if gone {
            self.stats.lost += to - from + 1;
            self.events.push_back(RxEvent::Lost { from, to });
        }
        if from <= self.done_below {
            self.done_below = self.done_below.max(to.saturating_add(1));
            self.mark_done(0);
        } else if to - from < MAX_GAP {
            for s in from..=to {
                self.mark_done(s);
            }
        }
        let hit: Vec<u64> = self.partial.range(from..=to).map(|(s, _)| *s).collect();
        for s in hit {
            self.partial.remove(&s);
            self.events.push_back(RxEvent::Discard(s));
        }
        let w: Vec<u64> = self.wanted.range(from..=to).map(|(s, _)| *s).collect();
        for s in w {
            self.wanted.remove(&s);
        }
        let d: Vec<u64> = self.described.range(from..=to).map(|(s, _)| *s).collect();
        for s in d {
            self.described.remove(&s);
            self.drop_orphans(s);
        }
        self.done = self.done.split_off(&self.done_below);
    }

    /// Timers: repairs, whole-product requests, fallback, acknowledgements.
    pub fn handle_timeout(&mut self, now: Micros) {
        if self.multicast && now.saturating_sub(self.last_mcast) >= self.cfg.fallback_after {
            self.multicast = false;
            self.mcast_from = u64::MAX;
            self.out.push_back(Msg::Fallback {
                seq: self.done_below,
            });
            self.events.push_back(RxEvent::FellBack);
        }
        let (delay, again, block) = (self.cfg.repair_delay, self.cfg.rerequest, self.block);
        let parity = self.parity();
        for (seq, p) in self
            .partial
            .iter_mut()
            .filter(|(_, p)| p.mcast && !p.complete)
        {
            if let Some(fec) = &mut p.fec {
                let limit = if p.eop { p.meta.size } else { p.high };
                let plan = fec.plan(now, limit, &p.have, &parity, again);
                if !plan.naks.is_empty() || !plan.unicast.is_empty() {
                    p.repair_from.get_or_insert(now);
                }
                if !plan.naks.is_empty() {
                    self.stats.naks += 1;
                    self.out.push_back(Msg::Nak {
                        seq: *seq,
                        blocks: plan.naks,
                        heard: self.heard,
                    });
                }
                if !plan.unicast.is_empty() {
                    self.stats.repair_requests += 1;
                    let ranges = block_ranges(plan.unicast, block);
                    self.out.push_back(Msg::Repair { seq: *seq, ranges });
                }
                continue;
            }
            if let Some(ranges) = repair_ranges(p, now, delay, again, block) {
                p.requested_at = Some(now);
                p.repair_from.get_or_insert(now);
                self.stats.repair_requests += 1;
                self.out.push_back(Msg::Repair { seq: *seq, ranges });
            }
        }
        for (seq, w) in self.wanted.iter_mut() {
            if w.1 == 0 || now.saturating_sub(w.1) >= again {
                w.1 = now.max(1);
                self.stats.whole_requests += 1;
                self.out.push_back(Msg::Whole { seq: *seq });
            }
        }
        for (seq, w) in self.described.iter_mut() {
            if w.1 == 0 || now.saturating_sub(w.1) >= again {
                w.1 = now.max(1);
                self.out.push_back(Msg::Describe { seq: *seq });
            }
        }
        let settled = self.done_below.saturating_sub(1);
        if settled > self.acked && now.saturating_sub(self.last_ack) >= self.cfg.ack_interval {
            self.acked = settled;
            self.last_ack = now;
            self.out.push_back(Msg::Ack { seq: settled });
        }
    }

    /// When [`Receiver::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> Micros {
        let mut t = u64::MAX;
        if self.multicast {
            t = t.min(self.last_mcast + self.cfg.fallback_after);
        }
        for p in self.partial.values().filter(|p| p.mcast && !p.complete) {
            t = t.min(match &p.fec {
                Some(fec) => {
                    let limit = if p.eop { p.meta.size } else { p.high };
                    fec.next_at(limit, &p.have, &self.parity(), self.cfg.rerequest)
                }
                None => next_repair_at(p, self.cfg.repair_delay, self.cfg.rerequest),
            });
        }
        for w in self.wanted.values().chain(self.described.values()) {
            t = t.min(if w.1 == 0 {
                0
            } else {
                w.1 + self.cfg.rerequest
            });
        }
        if self.done_below.saturating_sub(1) > self.acked {
            t = t.min(self.last_ack + self.cfg.ack_interval);
        }
        t
    }

    /// The next message for the source.
    pub fn poll_msg(&mut self) -> Option<Msg> {
        self.out.pop_front()
    }

    /// The next thing for the shell to do.
    pub fn poll_event(&mut self) -> Option<RxEvent> {
        self.events.pop_front()
    }
}

/// The block ranges to ask for now, if any: gaps not asked for yet, once the sender moved
/// on, the product went quiet, or every `delay` during a long product; every gap again once
/// a request went `again` without progress.
fn repair_ranges(
    p: &mut Partial,
    now: Micros,
    delay: Micros,
    again: Micros,
    block: u64,
) -> Option<Vec<(u32, u32)>> {
    let limit = if p.eop { p.meta.size } else { p.high };
    let quiet = now.saturating_sub(p.last_activity);
    let since = now.saturating_sub(p.requested_at.unwrap_or(p.started));
    if !(p.eop || quiet >= delay || since >= delay) {
        return None;
    }
    let stale = p
        .requested_at
        .is_some_and(|r| now.saturating_sub(r.max(p.last_activity)) >= again);
    if stale {
        p.asked = RangeSet::default();
    }
    let gaps = new_gaps(p, limit);
    if gaps.is_empty() {
        return None;
    }
    for (a, b) in &gaps {
        p.asked.insert(*a, *b);
    }
    Some(block_ranges(gaps, block))
}

/// Byte gaps as `(first block, count)` ranges of `block`-byte blocks.
fn block_ranges(gaps: Vec<(u64, u64)>, block: u64) -> Vec<(u32, u32)> {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for (a, b) in gaps {
        let (first, last) = ((a / block) as u32, ((b - 1) / block) as u32);
        match ranges.last_mut() {
            Some(r) if r.0 + r.1 >= first => r.1 = last + 1 - r.0,
            _ => ranges.push((first, last + 1 - first)),
        }
    }
    ranges.truncate(4096);
    ranges
}

/// When [`repair_ranges`] will next have something for `p` (`u64::MAX`: not before more
/// data arrives).
fn next_repair_at(p: &Partial, delay: Micros, again: Micros) -> Micros {
    let limit = if p.eop { p.meta.size } else { p.high };
    if p.have.missing(limit).is_empty() {
        return u64::MAX;
    }
    let stale_at = p
        .requested_at
        .map_or(u64::MAX, |r| r.max(p.last_activity) + again);
    if new_gaps(p, limit).is_empty() {
        return stale_at;
    }
    let due_at = if p.eop {
        0
    } else {
        (p.last_activity + delay).min(p.requested_at.unwrap_or(p.started) + delay)
    };
    due_at.min(stale_at)
}

/// Gaps below `limit` not asked for yet.
fn new_gaps(p: &Partial, limit: u64) -> Vec<(u64, u64)> {
    p.have
        .missing(limit)
        .into_iter()
        .flat_map(|(a, b)| p.asked.uncovered(a, b))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;
    use crate::feed::product::SecretAuth;

    /// A unicast receiver from sequence number `first`, and the source's auth.
    fn receiver(first: u64) -> (Receiver, SecretAuth) {
        let auth = SecretAuth::new(&Secret::from_bytes([4; 32]));
        let acc = Msg::Accepted {
            feed_id: 1,
            group: String::new(),
            block: 1400,
            mcast_from: u64::MAX,
            first,
            key: None,
        };
        let sub = Subscription::parse("ANY", "").expect("pattern");
        let rx = Receiver::new(
            ReceiverConfig::default(),
            Arc::new(auth.clone()),
            sub,
            &acc,
            0,
        );
        (rx.expect("accepted"), auth)
    }

    /// Sends product `seq` whole over the connection and confirms it: its delivered seqs.
    fn offer(rx: &mut Receiver, auth: &SecretAuth, seq: u64) -> Vec<u64> {
        let mut meta = ProductMeta {
            seq,
            name: format!("p{seq}"),
            feedtype: "X".into(),
            created: 0,
            size: 3,
            hash: [0; 32],
            tag: Bytes::new(),
        };
        meta.tag = auth.tag(&meta);
        rx.handle_unicast(1, Msg::Product { meta, sent_at: 1 });
        let data = Bytes::from_static(b"abc");
        rx.handle_unicast(
            1,
            Msg::Data {
                seq,
                offset: 0,
                data,
            },
        );
        let mut delivered = Vec::new();
        while let Some(e) = rx.poll_event() {
            match e {
                RxEvent::Complete(s) => rx.confirm(2, s, true),
                RxEvent::Delivered { meta, .. } => delivered.push(meta.seq),
                _ => {}
            }
        }
        delivered
    }

    #[test]
    fn repair_is_what_came_after_the_first_pass() {
        // Created at 0, started at 10, a block's loss asked for at 100 while the pass went on
        // to 1,000, delivered at 1,050: 50 us of repair, not 950.
        let l = Latency::split(0, 10, Some(1_000), Some(100), 1_050);
        assert_eq!(
            (l.waiting_us, l.transmission_us, l.repair_us, l.total_us),
            (10, 990, 50, 1_050)
        );
        // Nothing missed: all of it is transmission.
        let l = Latency::split(0, 10, Some(1_000), None, 1_002);
        assert_eq!((l.transmission_us, l.repair_us), (992, 0));
        // Missed whole (noticed at 400, no pass seen here): repair from the notice.
        let l = Latency::split(0, 10, None, Some(400), 900);
        assert_eq!((l.transmission_us, l.repair_us), (390, 500));
    }

    #[test]
    fn a_reconnected_receiver_does_not_deliver_again_what_the_last_one_did_out_of_order() {
        let (mut rx, auth) = receiver(1);
        assert_eq!(offer(&mut rx, &auth, 1), vec![1]);
        // Product 3 before 2 (2 repaired later): the resume position stays at 2.
        assert_eq!(offer(&mut rx, &auth, 3), vec![3]);
        assert_eq!(rx.resume_seq(), 2);
        let past = rx.delivered_past_resume();
        assert_eq!(past, vec![3]);
        // The connection drops; the next session resumes from 2 and the source sends 2, 3.
        let (mut next, _) = receiver(2);
        next.already_delivered(past);
        assert_eq!(offer(&mut next, &auth, 2), vec![2]);
        assert_eq!(
            offer(&mut next, &auth, 3),
            Vec::<u64>::new(),
            "delivered twice"
        );
        assert_eq!(next.resume_seq(), 4);
    }
}
