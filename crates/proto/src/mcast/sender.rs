//! The source of a multicast send: the first pass over every block, then parity granted on
//! requests, paced at a rate; end markers until every receiver is done.
//!
//! Repairs go before new blocks, so a receiver's incomplete blocks stay few. A request says
//! how many symbols a receiver still needs of a block and how far into the block's symbol
//! indexes it has seen; the source grants that many symbols past everything it already sent
//! or queued for the block, less those that may still be on their way: the ones queued, and
//! the ones sent within `stale` (a request that crossed them in flight). Receivers missing
//! different symbols of a block thus share the same new parity symbols: a block costs the
//! worst receiver's loss, not the sum.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::layout::{Layout, Slot};
use super::msg::Nak;
use super::probe::{Judged, Probe, ProbeEnd, WindowLoss};
use super::train::TRAIN_DATAGRAMS;
use super::{fec, Micros};

/// Pacing and timers.
#[derive(Debug, Clone, Copy)]
pub struct SenderConfig {
    /// Bytes per second on the wire (Ethernet, IP and UDP headers included).
    pub rate: u64,
    /// Period of the end marker once the first pass is over.
    pub end_interval: Micros,
    /// Symbols sent longer ago than this are taken as lost by a request that asks past
    /// them (shorter than the receivers' `renak`).
    pub stale: Micros,
    /// Receivers in the group (a probe weighs each one's loss).
    pub receivers: u32,
    /// Bytes a datagram costs on the wire beyond its symbol ([`wire_overhead`]).
    pub overhead: u64,
}

/// What the shell sends next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tx {
    /// Symbol `index` of block `block` (see [`CodedBlock::symbol`]).
    Data {
        /// Block.
        block: u32,
        /// Symbol index.
        index: u32,
    },
    /// The end marker.
    End,
}

/// Bytes every datagram costs on an Ethernet LAN beyond its UDP payload: the Ethernet header
/// (what a switch port and `tc` count), IPv4 and UDP. The file send and the feed's pusher pace
/// on these.
pub const LAN_HEADERS: u64 = 14 + 20 + 8;

/// Bytes a datagram costs on an Ethernet LAN beyond its symbol: [`LAN_HEADERS`], ours, and
/// the tag when `sealed`.
pub const fn wire_overhead(sealed: bool) -> u64 {
    LAN_HEADERS + super::seal::overhead(sealed) as u64
}
/// Most credit the pacer banks when polled late: a sending thread held up by the scheduler
/// or a full socket buffer catches up on up to this much time at once, so a stall of a few
/// milliseconds costs no rate; never more, so a long stall (or an idle spell before repairs)
/// does not become a burst that overflows a switch or a receiver's socket buffer. 20 ms at
/// 100 Mbit/s is 250 KB, about 170 datagrams.
pub const BURST: Micros = 20_000;
/// Judged windows kept for [`Sender::poll_judged`] when nobody takes them.
pub const JUDGED_KEPT: usize = 64;
/// Longest wait for the rate after a train ([`Sender::send_train`]): a receiver still taking
/// the train by then is slower than 6 Mbit/s, or gone.
pub const TRAIN_WAIT: Micros = 2_000_000;

/// One block's repair state at a source: how many symbols went out past its first pass and
/// how many more are granted. Shared by the file send ([`Sender`]) and the feed's pusher
/// ([`crate::feed::push`]): both grant the worst receiver's need, not the sum.
#[derive(Debug, Clone, Copy)]
pub struct BlockRepair {
    /// Next index to send.
    sent: u32,
    /// Send up to (not including) this index.
    target: u32,
    /// When `sent` last reached `target`.
    caught_up: Micros,
}

impl BlockRepair {
    /// A block of `k` source symbols whose first pass is over.
    pub fn new(k: u32) -> Self {
        Self {
            sent: k,
            target: k,
            caught_up: 0,
        }
    }

    /// A receiver still `need`s symbols of the block (at most `k`) and has seen indexes below
    /// `seen`. Grants that many past everything sent or queued, less those that may still be
    /// on their way: the ones queued, and the ones sent within `stale` (a request that
    /// crossed them in flight). Returns true when symbols are due to go out.
    pub fn grant(&mut self, now: Micros, seen: u32, need: u32, stale: Micros) -> bool {
        let seen = seen.min(self.sent);
        let mut coming = self.target - self.sent;
        let sending = self.target > self.sent;
        if sending || now.saturating_sub(self.caught_up) < stale {
            coming += self.sent - seen;
        }
        if need > coming {
            self.target = self.target.saturating_add(need - coming);
        }
        self.target > self.sent
    }

    /// As [`BlockRepair::grant`], when the receiver told which symbols were still on their
    /// way to it: `on_way` of those sent. Grants what it needs past them and those queued.
    pub fn grant_on_way(&mut self, need: u32, on_way: u32) -> bool {
        let coming = (self.target - self.sent).saturating_add(on_way);
        if need > coming {
            self.target = self.target.saturating_add(need - coming);
        }
        self.target > self.sent
    }

    /// The next granted index to send, and whether the grant is then used up.
    pub fn next(&mut self, now: Micros) -> (u32, bool) {
        let index = self.sent;
        self.sent += 1;
        let done = self.sent >= self.target;
        if done {
            self.caught_up = now;
        }
        (index, done)
    }

    /// Symbols granted past the first pass of a block of `k`.
    pub fn granted(&self, k: u32) -> u32 {
        self.target.saturating_sub(k)
    }

    /// When the last grant was used up (0: never).
    pub fn caught_up(&self) -> Micros {
        self.caught_up
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SenderStats {
    /// Symbols of the first pass.
    pub first_pass: u64,
    /// Symbols sent as repairs.
    pub repair: u64,
    /// End markers.
    pub ends: u64,
    /// Requests taken.
    pub naks: u64,
    /// Times a probe ([`Sender::set_rate_floor`]) changed the rate.
    pub rate_changes: u32,
    /// Why the probe stopped raising the rate, once it did.
    pub probe_end: Option<ProbeEnd>,
}

/// The source's state.
#[derive(Debug)]
pub struct Sender {
    layout: Layout,
    cfg: SenderConfig,
    blocks: u32,
    next_send: Micros,
    pass: (u32, u32),
    repairs: BTreeMap<u32, BlockRepair>,
    due: BTreeSet<u32>,
    last_end: Option<Micros>,
    stopped: bool,
    /// First-pass symbols still to go out back to back, as the rate's train.
    unpaced: u32,
    /// After the train, nothing goes out until the rate is set or this time passes.
    hold_until: Option<Micros>,
    /// Raises the rate while the group keeps up, when it was set as a floor.
    probe: Option<Probe>,
    /// Bytes on the wire sent so far (the probe's measure of keeping up).
    sent_bytes: u64,
    /// While a probe runs and the first pass is not over, per block not yet judged: each
    /// asking receiver's first-pass loss (the most it asked for at once); dropped once the
    /// block's window is judged, and all of it when the first pass ends.
    lost: BTreeMap<u32, Vec<(u32, u32)>>,
    /// Windows judged and not yet taken by [`Sender::poll_judged`] (at most [`JUDGED_KEPT`]).
    judged: VecDeque<Judged>,
    /// Counters.
    pub stats: SenderStats,
}

impl Sender {
    /// A sender of a file cut as `layout`.
    pub fn new(layout: Layout, cfg: SenderConfig) -> Self {
        Self {
            layout,
            cfg,
            blocks: layout.blocks() as u32,
            next_send: 0,
            pass: (0, 0),
            repairs: BTreeMap::new(),
            due: BTreeSet::new(),
            last_end: None,
            stopped: false,
            unpaced: 0,
            hold_until: None,
            probe: None,
            sent_bytes: 0,
            lost: BTreeMap::new(),
            judged: VecDeque::new(),
            stats: SenderStats::default(),
        }
    }

    /// True once every block's source symbols went out once.
    pub fn pass_done(&self) -> bool {
        self.pass.0 >= self.blocks
    }

    /// Blocks whose first pass has started (their hashes are due at the receivers).
    pub fn started_blocks(&self) -> u32 {
        (self.pass.0 + u32::from(self.pass.1 > 0)).min(self.blocks)
    }

    /// Sends nothing more (every receiver is done, or the send was given up).
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// Changes the rate (bytes per second on the wire); ends the wait after a train.
    pub fn set_rate(&mut self, rate: u64) {
        self.cfg.rate = rate.max(1);
        // Released at the next poll, which restarts the pacer from then (no credit banked
        // while held).
        self.hold_until = self.hold_until.map(|_| 0);
    }

    /// As [`Sender::set_rate`], for a rate that is a floor: a train that arrived as fast as it
    /// was written ([`super::probe::censored`]). The rate is then raised while the group
    /// keeps up ([`super::probe`]).
    pub fn set_rate_floor(&mut self, rate: u64) {
        self.set_rate(rate);
        self.probe = Some(Probe::new(rate.max(1)));
    }

    /// The rate now, bytes per second on the wire.
    pub fn rate(&self) -> u64 {
        self.cfg.rate
    }

    /// What the send went at, bytes per second on the wire: the rate, or less where a probe
    /// found the source's link (or host) taking less than it.
    pub fn rate_sent(&self) -> u64 {
        let wrote = self.probe.as_ref().and_then(Probe::wrote);
        wrote.map_or(self.cfg.rate, |w| w.min(self.cfg.rate))
    }

    /// The first pass starts with [`TRAIN_DATAGRAMS`] symbols back to back, unpaced (only
    /// the shell's socket holds them back), for the receivers to time. Then the sender waits
    /// for [`Sender::set_rate`], at most [`TRAIN_WAIT`], and goes on at the rate.
    ///
    /// Why wait: a train faster than a receiver's link fills the queue in front of it, and
    /// that receiver reports only once the queue drained. Data sent meanwhile at a guessed
    /// rate would be lost there. On a LAN whose bottleneck is the source's own link the
    /// reports are back a round trip after the train.
    pub fn send_train(&mut self) {
        self.unpaced = TRAIN_DATAGRAMS;
    }

    /// True while train symbols are still to go.
    pub fn training(&self) -> bool {
        self.unpaced > 0
    }

    /// True while the train goes out or the rate is awaited.
    pub fn in_train(&self) -> bool {
        self.unpaced > 0 && !self.pass_done() || self.hold_until.is_some_and(|t| t > 0)
    }

    /// The next datagram, if the pacer allows one now.
    pub fn poll_transmit(&mut self, now: Micros) -> Option<Tx> {
        match self.hold_until {
            Some(t) if now < t => return None,
            Some(_) => {
                self.hold_until = None;
                self.next_send = self.next_send.max(now);
            }
            None => {}
        }
        if self.stopped || now < self.next_send {
            return None;
        }
        let first_pass = self.stats.first_pass;
        let tx = self.next_tx(now)?;
        let bytes = match tx {
            Tx::Data { .. } => u64::from(self.layout.symbol) + self.cfg.overhead,
            Tx::End => self.cfg.overhead,
        };
        self.sent_bytes += bytes;
        if let (Tx::Data { block, index: 0 }, true) = (tx, self.stats.first_pass > first_pass) {
            self.block_started(now, block);
        }
        if self.unpaced > 0 && self.stats.first_pass > first_pass {
            self.unpaced -= 1;
            if self.unpaced == 0 || self.pass_done() {
                self.unpaced = 0;
                self.hold_until = Some(now + TRAIN_WAIT);
            }
            self.next_send = self.next_send.max(now);
            return Some(tx);
        }
        let cost = bytes * 1_000_000 / self.cfg.rate.max(1);
        // Late by more than a burst: the excess credit is dropped.
        self.next_send = self.next_send.max(now.saturating_sub(BURST)) + cost;
        Some(tx)
    }

    /// The first pass started `block`: the probe, if any, judges a window.
    fn block_started(&mut self, now: Micros, block: u32) {
        let Some(p) = self.probe.as_mut() else {
            return;
        };
        let (layout, repairs, lost) = (&self.layout, &self.repairs, &self.lost);
        let receivers = self.cfg.receivers as usize;
        let loss = |blocks: std::ops::Range<u32>| {
            let (mut granted, mut k) = (0u64, 0u64);
            let mut each = vec![0u64; receivers];
            for b in blocks.clone() {
                let kb = layout.k_of(b);
                granted += u64::from(repairs.get(&b).map_or(0, |r| r.granted(kb)));
                k += u64::from(kb);
            }
            for (_, l) in lost.range(blocks) {
                for &(r, need) in l {
                    if let Some(e) = each.get_mut(r as usize) {
                        *e += u64::from(need);
                    }
                }
            }
            let k = k.max(1) as f64;
            WindowLoss {
                granted: granted as f64 / k,
                each: each.into_iter().map(|n| n as f64 / k).collect(),
            }
        };
        if let Some(j) = p.handle_block(now, block, self.sent_bytes, self.cfg.rate, loss) {
            if j.next != self.cfg.rate {
                self.stats.rate_changes += 1;
            }
            self.cfg.rate = j.next.max(1);
            self.stats.probe_end = p.ended();
            // The blocks before `block` are judged or never will be.
            self.lost = self.lost.split_off(&block);
            if self.judged.len() >= JUDGED_KEPT {
                self.judged.pop_front();
            }
            self.judged.push_back(j);
        }
    }

    /// The next window a probe judged, oldest first (for a log).
    pub fn poll_judged(&mut self) -> Option<Judged> {
        self.judged.pop_front()
    }

    fn next_tx(&mut self, now: Micros) -> Option<Tx> {
        if let Some(&block) = self.due.first() {
            let r = self.repairs.get_mut(&block)?;
            let (index, done) = r.next(now);
            if done {
                self.due.remove(&block);
            }
            self.stats.repair += 1;
            return Some(Tx::Data { block, index });
        }
        if !self.pass_done() {
            let (block, index) = self.pass;
            self.pass = if index + 1 >= self.layout.k_of(block) {
                (block + 1, 0)
            } else {
                (block, index + 1)
            };
            self.stats.first_pass += 1;
            return Some(Tx::Data { block, index });
        }
        if self
            .last_end
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.end_interval)
        {
            self.last_end = Some(now);
            self.stats.ends += 1;
            return Some(Tx::End);
        }
        None
    }

    /// Receiver `from`'s request for more symbols of a block (`from` counts the receivers
    /// from 0 to [`SenderConfig::receivers`]; a request from past them is served, not
    /// weighed by a probe).
    pub fn handle_nak(&mut self, now: Micros, from: u32, nak: Nak) {
        let b = nak.block;
        // A block whose first pass is not over is not late yet.
        if b >= self.blocks || (b >= self.pass.0 && !self.pass_done()) {
            return;
        }
        self.stats.naks += 1;
        let k = self.layout.k_of(b);
        let need = nak.need.min(k);
        if self.pass_done() {
            self.lost.clear();
        } else if self.probe.is_some() && from < self.cfg.receivers {
            let l = self.lost.entry(b).or_default();
            match l.iter_mut().find(|(r, _)| *r == from) {
                Some((_, n)) => *n = (*n).max(need),
                None => l.push((from, need)),
            }
        }
        let r = self.repairs.entry(b).or_insert(BlockRepair::new(k));
        if r.grant(now, nak.seen, need, self.cfg.stale) {
            self.due.insert(b);
        }
    }

    /// When [`Sender::poll_transmit`] may next return something.
    pub fn poll_timeout(&self) -> Micros {
        if self.stopped {
            return Micros::MAX;
        }
        if let Some(t) = self.hold_until {
            return t;
        }
        if !self.due.is_empty() || !self.pass_done() {
            return self.next_send;
        }
        let end = self.last_end.map_or(0, |t| t + self.cfg.end_interval);
        self.next_send.max(end)
    }
}

/// One block's bytes, zero-padded to whole symbols, and its parity once some is asked for:
/// what the shell keeps of a recent block to answer [`Tx::Data`].
#[derive(Debug)]
pub struct CodedBlock {
    k: u32,
    data: Vec<u8>,
    parity: Option<Vec<Vec<u8>>>,
}

impl CodedBlock {
    /// Block `block` of `layout` from its bytes (`data`, the block's length).
    pub fn new(layout: &Layout, block: u32, mut data: Vec<u8>) -> Self {
        let k = layout.k_of(block);
        data.resize(k as usize * layout.symbol as usize, 0);
        Self {
            k,
            data,
            parity: None,
        }
    }

    /// Bytes of the block itself (padded to whole symbols).
    pub fn data_bytes(&self) -> usize {
        self.data.len()
    }

    /// The bytes of symbol `index` (parity computed on first use).
    pub fn symbol(
        &mut self,
        layout: &Layout,
        block: u32,
        index: u32,
    ) -> Result<&[u8], fec::FecError> {
        let s = layout.symbol as usize;
        match layout.slot(block, index) {
            Slot::Source(i) => Ok(&self.data[i as usize * s..(i as usize + 1) * s]),
            Slot::Parity(j) => {
                self.code(layout)?;
                let p = self.parity.as_ref().map(|p| p[j as usize].as_slice());
                Ok(p.unwrap_or_default())
            }
        }
    }

    /// Computes the block's parity unless it has it: the costly part of [`Self::symbol`],
    /// which a shell may do ahead, on a thread of its own.
    pub fn code(&mut self, layout: &Layout) -> Result<(), fec::FecError> {
        if self.parity.is_none() {
            let s = layout.symbol as usize;
            let src: Vec<&[u8]> = self.data.chunks(s).take(self.k as usize).collect();
            self.parity = Some(fec::encode(&src, layout.m as usize, s)?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(size: u64) -> Sender {
        let l = Layout::new(size, 4, 4, 4).unwrap();
        Sender::new(
            l,
            SenderConfig {
                rate: 1_000_000,
                end_interval: 1_000,
                stale: 500,
                receivers: 2,
                overhead: 63,
            },
        )
    }

    fn drain(s: &mut Sender, now: Micros) -> Vec<Tx> {
        std::iter::from_fn(|| s.poll_transmit(now)).collect()
    }

    #[test]
    fn repairs_are_shared_and_in_flight_ones_not_granted_twice() {
        let mut s = sender(32);
        let now = 10_000_000;
        let first = drain(&mut s, now);
        assert_eq!(first.len(), 9, "two blocks of four and an end: {first:?}");
        assert!(s.pass_done());
        // Two receivers lost two and one symbols of block 0: two parity symbols serve both.
        s.handle_nak(
            now,
            0,
            Nak {
                block: 0,
                seen: 4,
                need: 2,
            },
        );
        s.handle_nak(
            now,
            1,
            Nak {
                block: 0,
                seen: 4,
                need: 1,
            },
        );
        let r = drain(&mut s, now);
        assert_eq!(
            r,
            vec![
                Tx::Data { block: 0, index: 4 },
                Tx::Data { block: 0, index: 5 }
            ]
        );
        // A request that crossed them in flight gets nothing more...
        s.handle_nak(
            now + 100,
            0,
            Nak {
                block: 0,
                seen: 4,
                need: 2,
            },
        );
        assert!(drain(&mut s, now + 100).is_empty());
        // ...but once they are stale, they were lost: two new ones.
        s.handle_nak(
            now + 1_000,
            0,
            Nak {
                block: 0,
                seen: 4,
                need: 2,
            },
        );
        // (Repairs go first; the end marker is due again too.)
        let r = drain(&mut s, now + 1_000);
        let want = vec![
            Tx::Data { block: 0, index: 6 },
            Tx::Data { block: 0, index: 7 },
            Tx::End,
        ];
        assert_eq!(r, want);
        // Past the parity, source symbols again.
        assert_eq!(
            Layout::new(32, 4, 4, 4).unwrap().slot(0, 8),
            Slot::Source(0)
        );
        // Requests for blocks out of range are ignored.
        s.handle_nak(
            now + 2_000,
            0,
            Nak {
                block: 9,
                seen: 0,
                need: 4,
            },
        );
        assert_eq!(drain(&mut s, now + 2_000), vec![Tx::End]);
    }

    #[test]
    fn paces_at_the_rate() {
        let mut s = sender(4000);
        let mut now = 0;
        let mut n = 0;
        while now < 1_000_000 {
            while s.poll_transmit(now).is_some() {
                n += 1;
            }
            now = s.poll_timeout().max(now + 1);
        }
        // 1 MB/s at 4 + 63 bytes a datagram: about 14,900 in a second (the file is 1,000).
        assert_eq!(s.stats.first_pass, 1000);
        assert!(n >= 1000 && s.stats.ends > 0, "{n}");
        let mut s = sender(400_000);
        let mut now = 0;
        while now < 100_000 {
            while s.poll_transmit(now).is_some() {}
            now = s.poll_timeout().max(now + 1);
        }
        let sent = s.stats.first_pass;
        assert!((1_400..=1_560).contains(&sent), "{sent} in 0.1 s");
    }

    #[test]
    fn a_late_pacer_catches_up_at_most_a_burst() {
        // 1 MB/s, 4 + 63 bytes a datagram: 67 us each; a file far longer than the test.
        let mut s = sender(4_000_000);
        let per = |us: Micros| us / 67;
        let mut now = 0;
        // Steady: one datagram per 67 us.
        while now < 10_000 {
            while s.poll_transmit(now).is_some() {}
            now = s.poll_timeout().max(now + 1);
        }
        let steady = s.stats.first_pass;
        assert!((149..=151).contains(&steady), "{steady} in 10 ms");
        // A 5 ms stall (scheduler, full socket buffer) is caught up whole: no rate lost.
        now += 5_000;
        let caught = drain(&mut s, now).len() as u64;
        assert!(
            (per(5_000)..=per(5_000) + 2).contains(&caught),
            "{caught} after 5 ms"
        );
        // A 500 ms stall: a burst's worth at once, not 500 ms's.
        now += 500_000;
        let burst = drain(&mut s, now).len() as u64;
        assert!(
            (per(BURST) - 1..=per(BURST) + 2).contains(&burst),
            "{burst} after 500 ms (a burst is {})",
            per(BURST)
        );
        // Then the rate again, not another burst: 1 ms later, 1 ms's worth.
        let next = drain(&mut s, now + 1_000).len() as u64;
        assert!((per(1_000) - 1..=per(1_000) + 1).contains(&next), "{next}");
        // Polled in 1 ms batches for a second, the rate holds (timer granularity costs none).
        let before = s.stats.first_pass;
        let t0 = now + 1_000;
        let mut t = t0;
        while t < t0 + 1_000_000 {
            t += 1_000;
            while s.poll_transmit(t).is_some() {}
        }
        let sent = s.stats.first_pass - before;
        assert!(
            (14_900..=14_950).contains(&sent),
            "{sent} in 1 s of 1 ms batches"
        );
    }

    #[test]
    fn the_train_goes_out_back_to_back_then_the_rate_holds() {
        // 1 MB/s, 4 + 63 bytes a datagram: 67 us each once paced.
        let mut s = sender(40_000);
        s.send_train();
        assert!(s.in_train());
        let now = 5_000;
        let burst = drain(&mut s, now);
        assert_eq!(burst.len() as u32, TRAIN_DATAGRAMS, "all at once");
        // Then it waits for the rate.
        assert!(s.in_train());
        assert!(drain(&mut s, now + 10_000).is_empty());
        assert_eq!(s.poll_timeout(), now + TRAIN_WAIT);
        s.set_rate(1_000_000);
        assert!(!s.in_train());
        let t = now + 10_000;
        assert_eq!(drain(&mut s, t).len(), 1, "at the rate from now");
        assert_eq!(drain(&mut s, t + 670).len(), 10);
        // Without an answer, it goes on at the old rate after the wait.
        let mut s = sender(40_000);
        s.send_train();
        drain(&mut s, 0);
        assert!(drain(&mut s, TRAIN_WAIT - 1).is_empty());
        assert_eq!(drain(&mut s, TRAIN_WAIT).len(), 1);
        // A train longer than the file ends with the pass: the end marker waits too.
        let mut s = sender(40);
        s.send_train();
        assert_eq!(drain(&mut s, 0).len(), 10, "ten symbols");
        s.set_rate(1_000_000);
        assert_eq!(drain(&mut s, 1), vec![Tx::End]);
    }

    #[test]
    fn coded_blocks_give_padded_source_and_parity() {
        let l = Layout::new(10, 4, 4, 4).unwrap();
        let mut c = CodedBlock::new(&l, 0, (1..=10).collect());
        assert_eq!(c.symbol(&l, 0, 2).unwrap(), &[9, 10, 0, 0]);
        let p = c.symbol(&l, 0, 3).unwrap().to_vec();
        assert_eq!(p.len(), 4);
        let src = [[1u8, 2, 3, 4], [5, 6, 7, 8], [9, 10, 0, 0]];
        let refs: Vec<&[u8]> = src.iter().map(|s| &s[..]).collect();
        assert_eq!(p, fec::encode(&refs, 4, 4).unwrap()[0]);
    }
}
