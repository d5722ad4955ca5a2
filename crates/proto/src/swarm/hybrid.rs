//! The hybrid's pull side (see the module documentation of [`crate::swarm`] for the design).
//!
//! - The source's deal: each piece leaves the source's cluster once, to whichever other
//!   cluster's target connection has room first; a lost target's pieces are dealt again.
//! - Per-peer delivery rate and round trip, and the request window sized from them.
//! - Piece choice: pieces only this peer can give first, moving requests off slow peers,
//!   endgame.

use std::time::{Duration, Instant};

use super::{bits, Bits, SwarmEvent, SwarmMsg, SwarmNode, Transmit};
use crate::tree::NodeId;
use crate::wire::Frame;

/// The hybrid's view of one peer as a server of its requests: the smallest round trip seen
/// (request to piece) and the rate at which it delivers, from which the request window is
/// sized (BBR-like: twice the rate-delay product, a few pieces at least).
#[derive(Debug, Default)]
pub(crate) struct PeerRate {
    min_rtt: Option<Duration>,
    /// Pieces per second (EWMA, weight 1/2, of samples at least a round trip long).
    rate: Option<f64>,
    since: Option<Instant>,
    n: u32,
    /// Last delivery, or the moment requests resumed after an idle spell.
    last: Option<Instant>,
}

/// A peer is stalled after this many expected piece times without a delivery.
const STALL_PIECES: f64 = 4.0;
/// Pieces asked beyond twice the rate-delay product (split among a cluster's members when
/// they all pull over one WAN link: [`SwarmNode::hybrid_window`]).
const SPARE: usize = 2;
/// Largest request window, pieces.
const MAX_WINDOW: usize = 64;
/// A window holds a second request, queued behind the one being served, when a piece takes at
/// most this long at the peer's rate. With one request the connection idles a round trip
/// after every piece, and where a site's members split a WAN link each one's rate-delay
/// product is a fraction of a piece, so one is what the rate gives (lab, unequal layout, slow
/// links at 100 ms: D's eight members held one request each at B with 20-80 pieces they could
/// ask for, and B->D carried 0.86 of what balanced's pushes got through it). A piece that
/// takes longer (a thin link, big pieces) would wait that long behind the first, where it can
/// no longer be moved to a faster peer.
const SECOND_REQUEST_WITHIN: Duration = Duration::from_secs(1);

impl PeerRate {
    /// A requested piece arrived; `rtt` when it answered our first request for it, `idle`
    /// when nothing else is outstanding at this peer now.
    pub(crate) fn on_delivery(&mut self, now: Instant, rtt: Option<Duration>, idle: bool) {
        if let Some(r) = rtt {
            self.min_rtt = Some(self.min_rtt.map_or(r, |m| m.min(r)));
        }
        self.last = Some(now);
        match self.since {
            None => {
                self.since = Some(now);
                self.n = 0;
            }
            Some(t0) => {
                self.n += 1;
                let el = now.saturating_duration_since(t0);
                let min = self
                    .min_rtt
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_millis(10));
                if el >= min {
                    let sample = self.n as f64 / el.as_secs_f64();
                    self.rate = Some(self.rate.map_or(sample, |r| 0.5 * r + 0.5 * sample));
                    self.since = Some(now);
                    self.n = 0;
                }
            }
        }
        if idle {
            // Nothing else was outstanding, so this piece had the connection to itself for
            // its round trip: the rate the window allowed, not the link's. It may only raise
            // the estimate (a link that sped up while one request at a time went out);
            // without it a window of one would never measure again.
            if let (Some(r), Some(rate)) = (rtt, self.rate) {
                let allowed = 1.0 / r.as_secs_f64().max(1e-3);
                if allowed > rate {
                    self.rate = Some(allowed);
                }
            }
            self.since = None;
        }
    }

    /// The smallest round trip seen (zero before the first).
    pub(crate) fn min_rtt(&self) -> Duration {
        self.min_rtt.unwrap_or(Duration::ZERO)
    }

    /// The measured delivery rate, pieces per second.
    pub(crate) fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// A request goes out to a peer that had none outstanding.
    pub(crate) fn resume(&mut self, now: Instant) {
        self.since = None;
        self.last = Some(now);
    }

    /// How many requests to keep outstanding: twice the rate-delay product and `spare`
    /// pieces more, at least one, or two where a piece takes at most
    /// [`SECOND_REQUEST_WITHIN`].
    pub(crate) fn window(&self, spare: f64) -> usize {
        match (self.rate, self.min_rtt) {
            (Some(r), Some(t)) => {
                let least = if r * SECOND_REQUEST_WITHIN.as_secs_f64() >= 1.0 {
                    2
                } else {
                    1
                };
                ((2.0 * r * t.as_secs_f64() + spare).ceil() as usize).clamp(least, MAX_WINDOW)
            }
            _ => spare.ceil() as usize + 1,
        }
    }

    /// True when requests are outstanding and nothing arrived for several times the
    /// expected time per piece (and at least a few round trips): the link behind it has
    /// slowed down or stalled.
    pub(crate) fn stalled(&self, now: Instant) -> bool {
        let (Some(r), Some(l)) = (self.rate, self.last) else {
            return false;
        };
        let rtt = self.min_rtt.unwrap_or(Duration::ZERO).as_secs_f64();
        now.saturating_duration_since(l).as_secs_f64() > (STALL_PIECES / r).max(3.0 * rtt)
    }

    /// Expected seconds per piece now: the measured rate, or longer while nothing arrives.
    pub(crate) fn piece_time(&self, now: Instant, outstanding: bool) -> Option<f64> {
        let base = 1.0 / self.rate?;
        let stall = match (outstanding, self.last) {
            (true, Some(l)) => now.saturating_duration_since(l).as_secs_f64(),
            _ => 0.0,
        };
        Some(base.max(stall))
    }
}

impl SwarmNode {
    /// Hybrid pulls at peer k: keep its rate-sized window full (see the module documentation
    /// of [`crate::swarm`]).
    pub(crate) fn hybrid_top_up(&mut self, k: usize, now: Instant) {
        let window = self.hybrid_window(k);
        let me = self.peers[k].id;
        // Requests on their way here from a slower peer count against the window.
        let mut moving_in = self.moving_in[me] as usize;
        if self.peers[k].requested.len() + moving_in >= window {
            return;
        }
        let words = self.have_bits.words();
        // Every way to ask k (a new piece, a steal, a move, a second request) is for a piece k
        // holds and we lack: none, nothing to do (the common case, worth skipping the masks).
        let (have, has) = (&self.have_bits, &self.peers[k].has);
        if (0..words).all(|w| has.word(w) & !have.word(w) == 0) {
            return;
        }
        let allowed = self.allowed_words(k);
        let src = self.source_cluster;
        let pk = &self.peers[k];
        // What peers in the other clusters can give (pieces only this peer's cluster has are
        // asked first, so that those several clusters hold stay free for whichever has room).
        let mut others = Bits::new(self.cfg.pieces);
        if !pk.local {
            let kc = self.mobs.cluster(pk.id);
            for q in self
                .peers
                .iter()
                .filter(|q| q.connected && !q.local)
                .filter(|q| self.mobs.cluster(q.id) != src && self.mobs.cluster(q.id) != kc)
            {
                for w in 0..words {
                    others.or_word(w, q.has.word(w));
                }
            }
        }
        let high_first = !pk.local && self.high_first(self.mobs.cluster(pk.id));
        let pick_in = |f: &dyn Fn(usize) -> u64| {
            if high_first {
                bits::pick_highest(words, f)
            } else {
                bits::pick_lowest(words, f)
            }
        };
        while self.peers[k].requested.len() + moving_in < window {
            let (have, pending, has) = (&self.have_bits, &self.pending, &self.peers[k].has);
            let cand = |w: usize| has.word(w) & !have.word(w) & !pending.word(w) & allowed[w];
            let pick = pick_in(&|w| cand(w) & !others.word(w)).or_else(|| pick_in(&cand));
            if let Some(i) = pick {
                self.pend(k, i, now);
                continue;
            }
            if let Some(i) = self.steal_pick(k, &allowed, now) {
                continue_steal(self, k, i, now);
                continue;
            }
            if let Some((j, i)) = self.move_pick(k, moving_in, &allowed, now) {
                self.start_move(j, i, me);
                moving_in += 1;
                continue;
            }
            if let Some(i) = self.endgame_pick(k, &allowed, now) {
                self.second.push((i, self.peers[k].id));
                self.send_request(k, i, now);
                continue;
            }
            break;
        }
    }

    /// Peer k's request window. With interleaved shares every member of this cluster pulls over
    /// the same WAN link at once, so the spare pieces beyond the rate-delay product are split
    /// among them: the link's queue of requests stays as deep as when one member at a time
    /// pulled, which matters behind a thin link.
    pub(crate) fn hybrid_window(&self, k: usize) -> usize {
        let p = &self.peers[k];
        let members = self.mobs.members(self.my_cluster()).len().max(1);
        let spare = match self.share_layout() {
            super::mob::ShareLayout::Interleaved if !p.local => SPARE as f64 / members as f64,
            _ => SPARE as f64,
        };
        p.rate.window(spare)
    }

    /// Whether this node takes cluster x's pieces newest first: of the receiving clusters
    /// that fetch from x, every second one does, so that two clusters fetching what x holds
    /// take different pieces and can pass them on to each other (over links x is not on).
    fn high_first(&self, x: usize) -> bool {
        let me = self.my_cluster();
        let rank = (0..self.mobs.clusters())
            .filter(|&c| c != x && c != self.source_cluster && !self.mobs.members(c).is_empty())
            .position(|c| c == me);
        x != self.source_cluster && rank.is_some_and(|r| r % 2 == 1)
    }

    /// The source deals the next piece not yet out of its cluster to target peer k.
    pub(crate) fn deal(&mut self, k: usize) -> Option<Transmit> {
        let (exported, p) = (&self.exported, &self.peers[k]);
        let i = bits::pick_lowest(exported.words(), |w| !exported.word(w) & !p.has.word(w))
            .filter(|&i| i < self.cfg.pieces)?;
        self.exported.set(i);
        let p = &mut self.peers[k];
        p.pushed.set(i);
        p.up_window += 1;
        self.check_dealt_all();
        Some(Transmit::Piece(i))
    }

    /// Once every piece is out of the source's cluster (dealt, or held by a target already),
    /// the source's cluster mates are told and other clusters may ask the source.
    pub(crate) fn check_dealt_all(&mut self) {
        if self.dealt_all || self.exported.count() != self.cfg.pieces {
            return;
        }
        self.dealt_all = true;
        for j in 0..self.peers.len() {
            if !self.peers[j].connected {
                continue;
            }
            if self.peers[j].local {
                self.peers[j].ctrl.push_back(Frame::Swarm(SwarmMsg::Dealt));
            } else {
                self.announce_all(j);
            }
        }
    }

    /// Target `lost` is gone: what was dealt to it is dealt again, to another live member of
    /// its cluster.
    pub(crate) fn retarget(&mut self, lost: NodeId) {
        let Some(at) = self.targets.iter().position(|&t| t == lost) else {
            return;
        };
        if let Some(k) = self.index[lost] {
            let pushed = std::mem::replace(&mut self.peers[k].pushed, Bits::new(self.cfg.pieces));
            for i in pushed.ones() {
                self.exported.clear(i);
            }
            self.dealt_all = false;
        }
        let c = self.mobs.cluster(lost);
        let next = self
            .mobs
            .members(c)
            .iter()
            .copied()
            .find(|&m| m != lost && self.alive[m]);
        match next {
            Some(m) => {
                self.targets[at] = m;
                let k = self.ensure_peer(m);
                if !self.peers[k].connected {
                    self.events.push_back(SwarmEvent::Connect { peer: m });
                }
            }
            None => {
                self.targets.remove(at);
            }
        }
    }

    pub(crate) fn send_request(&mut self, k: usize, i: u64, now: Instant) {
        let p = &mut self.peers[k];
        if p.requested.is_empty() {
            p.rate.resume(now);
        }
        p.requested.push(i);
        p.ctrl.push_back(Frame::Request { index: i });
    }

    /// A piece whose request waits at a slower peer and that peer k, with room in its
    /// window, would deliver clearly sooner: it is moved to k (cancelled at the slow peer).
    fn steal_pick(&self, k: usize, allowed: &[u64], now: Instant) -> Option<u64> {
        let pk = &self.peers[k];
        let mine = pk.rate.piece_time(now, !pk.requested.is_empty())?;
        let my_eta = (pk.requested.len() + 1) as f64 * mine;
        let mut best: Option<(f64, u64)> = None;
        for (j, q) in self.peers.iter().enumerate() {
            // Only from a peer that stopped delivering: moving a request that is merely
            // queued at a slower peer brings a second copy when the first was on the wire.
            if j == k || q.requested.is_empty() || !q.rate.stalled(now) {
                continue;
            }
            let Some(t) = q.rate.piece_time(now, true) else {
                continue;
            };
            let eta = q.requested.len() as f64 * t;
            if eta <= 2.0 * my_eta || best.is_some_and(|(b, _)| eta <= b) {
                continue;
            }
            // The last queued first: it waits longest and is least likely under way.
            let cand = q.requested.iter().rev().copied().find(|&i| {
                self.pending_from[i as usize] == Some(q.id)
                    && self.moving_to[i as usize].is_none()
                    && pk.has.get(i)
                    && bits::word_bit(allowed, i)
                    && !self.second.iter().any(|&(s, _)| s == i)
            });
            if let Some(i) = cand {
                best = Some((eta, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// A request queued at a slower peer that peer k, with room in its window, would deliver
    /// much sooner (a link that is slow but not stalled, e.g. a cluster's last pieces queued
    /// behind a thin WAN link while another cluster that holds them idles). It is not taken
    /// at once but through [`SwarmNode::start_move`], so no second copy is ever sent. Returns
    /// the slow peer and the piece.
    fn move_pick(
        &self,
        k: usize,
        moving_in: usize,
        allowed: &[u64],
        now: Instant,
    ) -> Option<(usize, u64)> {
        let pk = &self.peers[k];
        let mine = pk.rate.piece_time(now, !pk.requested.is_empty())?;
        let my_rtt = pk.rate.min_rtt().as_secs_f64();
        // Asking k takes a round trip to cancel and one to request.
        let my_eta = (pk.requested.len() + moving_in + 1) as f64 * mine + 2.0 * my_rtt;
        let mut best: Option<(f64, usize, u64)> = None;
        for (j, q) in self.peers.iter().enumerate() {
            if j == k || q.requested.len() < 2 {
                continue;
            }
            let Some(t) = q.rate.piece_time(now, true) else {
                continue;
            };
            // Position in q's queue, from the back: the last queued waits longest and is the
            // least likely to be under way; the one at the head is left alone.
            for (pos, &i) in q.requested.iter().enumerate().skip(1).rev() {
                let eta = (pos + 1) as f64 * t;
                if eta <= 2.0 * my_eta || best.is_some_and(|(b, _, _)| eta <= b) {
                    break;
                }
                let movable = self.pending_from[i as usize] == Some(q.id)
                    && self.moving_to[i as usize].is_none()
                    && pk.has.get(i)
                    && bits::word_bit(allowed, i)
                    && !self.second.iter().any(|&(s, _)| s == i);
                if movable {
                    best = Some((eta, j, i));
                    break;
                }
            }
        }
        best.map(|(_, j, i)| (j, i))
    }
}

/// Moves the request for piece i from its peer to peer k.
fn continue_steal(node: &mut SwarmNode, k: usize, i: u64, now: Instant) {
    if let Some(j) = node.pending_from[i as usize].and_then(|q| node.index[q]) {
        let q = &mut node.peers[j];
        q.requested.retain(|&r| r != i);
        if q.connected {
            q.ctrl
                .push_back(Frame::Swarm(SwarmMsg::Cancel { index: i }));
        }
    }
    node.pend(k, i, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that delivers a piece every `every` with two requests out, whose smallest
    /// round trip was `rtt`.
    fn measured(every: Duration, rtt: Duration) -> PeerRate {
        let mut r = PeerRate::default();
        let t0 = Instant::now();
        r.resume(t0);
        for n in 1..=20u32 {
            r.on_delivery(t0 + every * n, Some(rtt), false);
        }
        r
    }

    #[test]
    fn window_is_twice_the_rate_delay_product_and_the_spare() {
        // 20 pieces/s over 100 ms: 2 x 2 pieces, and 0.5 spare.
        let r = measured(Duration::from_millis(50), Duration::from_millis(100));
        assert!((r.rate().unwrap() - 20.0).abs() < 0.5, "{:?}", r.rate());
        assert_eq!(r.window(0.5), 5);
        assert_eq!(r.window(2.0), 6);
    }

    /// One of eight members pulling over a shared WAN link: 1.2 pieces/s, 165 ms at best.
    /// Its rate-delay product is a fifth of a piece, so the rate alone asks for one request,
    /// and the connection would idle a round trip after every piece: it keeps two.
    #[test]
    fn a_share_of_a_link_keeps_a_second_request_queued() {
        let r = measured(Duration::from_millis(830), Duration::from_millis(165));
        assert!(2.0 * r.rate().unwrap() * 0.165 + 0.25 < 1.0);
        assert_eq!(r.window(0.25), 2);
    }

    /// Where a piece takes longer than a second (a thin link, big pieces), a second request
    /// would wait that long behind the first, too long to be moved: one.
    #[test]
    fn a_slow_peer_gets_one_request_at_a_time() {
        let r = measured(Duration::from_millis(2500), Duration::from_millis(300));
        assert_eq!(r.window(0.25), 1);
    }

    /// With one request out a delivery is not a rate sample, but one that came back sooner
    /// than the rate says shows the link sped up: the window opens again.
    #[test]
    fn a_window_of_one_still_sees_its_link_speed_up() {
        let mut r = measured(Duration::from_millis(2500), Duration::from_millis(300));
        let t = Instant::now() + Duration::from_secs(60);
        // As slow as measured: nothing changes.
        r.on_delivery(t, Some(Duration::from_millis(2600)), true);
        assert!((r.rate().unwrap() - 0.4).abs() < 0.05, "{:?}", r.rate());
        assert_eq!(r.window(0.25), 1);
        // The link sped up: the piece came back in 300 ms.
        r.on_delivery(
            t + Duration::from_secs(1),
            Some(Duration::from_millis(300)),
            true,
        );
        assert!(r.rate().unwrap() > 3.0, "{:?}", r.rate());
        assert!(r.window(0.25) >= 2);
    }
}
