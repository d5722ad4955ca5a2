//! The hybrid's pull side (see the module documentation of [`crate::swarm`] for the design).
//!
//! - The push meter: how fast the tree parent's push brings new pieces, and from it the push
//!   horizon beyond which a receiver pulls. The rate is an exponentially weighted mean
//!   (weight 1/2) of the pieces pushed per [`SwarmConfig::tick`], measured from
//!   [`SwarmConfig::warmup`] after the start; before the first measurement nothing is
//!   pulled. The horizon is `prefix + floor(rate * push_horizon)` (floor: a push that
//!   stalled must not keep the piece at the prefix to itself while its rate decays).
//! - Per-peer delivery rate and round trip, and the request window sized from them.
//! - Piece choice: source-cluster stripes, moving requests off slow peers, endgame.

use std::ops::Range;
use std::time::{Duration, Instant};

use super::{bits, SwarmConfig, SwarmMsg, SwarmNode};
use crate::wire::Frame;

/// Measures the push rate of a hybrid receiver.
#[derive(Debug)]
pub(crate) struct PushMeter {
    tick: Duration,
    horizon: f64,
    next_tick: Instant,
    last_tick: Instant,
    count: u64,
    /// Pieces per second, once measured.
    rate: Option<f64>,
}

impl PushMeter {
    pub(crate) fn new(cfg: &SwarmConfig, now: Instant) -> Self {
        Self {
            tick: cfg.tick.max(Duration::from_millis(1)),
            horizon: cfg.push_horizon.as_secs_f64(),
            next_tick: now + cfg.warmup,
            last_tick: now,
            count: 0,
            rate: None,
        }
    }

    pub(crate) fn next(&self) -> Instant {
        self.next_tick
    }

    /// A piece arrived by push.
    pub(crate) fn count(&mut self, _now: Instant) {
        self.count += 1;
    }

    pub(crate) fn tick(&mut self, now: Instant, _prefix: u64) {
        if now < self.next_tick {
            return;
        }
        let dt = now.saturating_duration_since(self.last_tick).as_secs_f64();
        if dt > 0.0 {
            let inst = self.count as f64 / dt;
            self.rate = Some(match self.rate {
                None => inst,
                Some(r) => 0.5 * r + 0.5 * inst,
            });
        }
        self.count = 0;
        self.last_tick = now;
        self.next_tick = now + self.tick;
    }

    /// True once the push rate is known (pulls start then).
    pub(crate) fn pulling(&self, _now: Instant) -> bool {
        self.rate.is_some()
    }

    /// The first piece index push is not expected to bring within the horizon.
    pub(crate) fn horizon(&self, prefix: u64, pieces: u64) -> u64 {
        match self.rate {
            None => pieces,
            Some(r) => {
                let ahead = (r * self.horizon).floor();
                if ahead >= (pieces - prefix.min(pieces)) as f64 {
                    pieces
                } else {
                    prefix + ahead as u64
                }
            }
        }
    }
}

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

/// Smallest request window, pieces.
const MIN_WINDOW: usize = 2;
/// Largest request window, pieces.
const MAX_WINDOW: usize = 64;

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
            self.since = None;
        }
    }

    /// A request goes out to a peer that had none outstanding.
    pub(crate) fn resume(&mut self, now: Instant) {
        self.since = None;
        self.last = Some(now);
    }

    /// How many requests to keep outstanding.
    pub(crate) fn window(&self) -> usize {
        match (self.rate, self.min_rtt) {
            (Some(r), Some(t)) => {
                ((2.0 * r * t.as_secs_f64()).ceil() as usize + MIN_WINDOW).min(MAX_WINDOW)
            }
            _ => MIN_WINDOW + 1,
        }
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
        let window = self.peers[k].rate.window();
        if self.peers[k].requested.len() >= window {
            return;
        }
        let words = self.have_bits.words();
        let mut allowed: Vec<u64> = (0..words).map(|w| self.allowed_word(k, w)).collect();
        let my_cluster = self.my_cluster();
        let src = self.source_cluster;
        let pk = &self.peers[k];
        let from_source_cluster = !pk.local && my_cluster != src && self.mobs.cluster(pk.id) == src;
        let stripes = if from_source_cluster {
            // What another cluster's peer already holds is fetched there: the source
            // cluster's egress carries each piece out once.
            for q in self
                .peers
                .iter()
                .filter(|q| q.connected && !q.local && self.mobs.cluster(q.id) != src)
            {
                for (w, a) in allowed.iter_mut().enumerate() {
                    *a &= !q.has.word(w);
                }
            }
            Some(self.stripes())
        } else {
            None
        };
        while self.peers[k].requested.len() < window {
            let (have, pending, has) = (&self.have_bits, &self.pending, &self.peers[k].has);
            let cand = |w: usize| has.word(w) & !have.word(w) & !pending.word(w) & allowed[w];
            let pick = match &stripes {
                Some(st) => stripe_pick(words, st, cand),
                None => bits::pick_random(words, &mut self.rng, cand),
            };
            if let Some(i) = pick {
                self.pending.set(i);
                self.pending_from[i as usize] = Some(self.peers[k].id);
                self.req_at[i as usize] = Some(now);
                self.send_request(k, i, now);
                continue;
            }
            if let Some(i) = self.steal_pick(k, &allowed, now) {
                continue_steal(self, k, i, now);
                continue;
            }
            if let Some(i) = self.endgame_pick(k, &allowed) {
                self.second.push((i, self.peers[k].id));
                self.send_request(k, i, now);
                continue;
            }
            break;
        }
    }

    fn send_request(&mut self, k: usize, i: u64, now: Instant) {
        let p = &mut self.peers[k];
        if p.requested.is_empty() {
            p.rate.resume(now);
        }
        p.requested.push(i);
        p.ctrl.push_back(Frame::Request { index: i });
    }

    /// This node's share split into one stripe per receiving cluster, its own first: from
    /// the source's cluster it fetches its own stripe lowest first, then helps with the
    /// next clusters' stripes from their far ends, so that clusters fetching from the
    /// source's cluster at different rates meet with little overlap.
    fn stripes(&self) -> Vec<Range<u64>> {
        let share = self.mobs.share(self.me, self.cfg.pieces);
        let receiving: Vec<usize> = (0..self.mobs.clusters())
            .filter(|&c| c != self.source_cluster && !self.mobs.members(c).is_empty())
            .collect();
        let m = receiving.len().max(1) as u64;
        let j = receiving
            .iter()
            .position(|&c| c == self.my_cluster())
            .unwrap_or(0) as u64;
        let len = share.end - share.start;
        (0..m)
            .map(|d| {
                let s = (j + d) % m;
                share.start + s * len / m..share.start + (s + 1) * len / m
            })
            .collect()
    }

    /// A piece whose request waits at a slower peer and that peer k, with room in its
    /// window, would deliver clearly sooner: it is moved to k (cancelled at the slow peer).
    fn steal_pick(&self, k: usize, allowed: &[u64], now: Instant) -> Option<u64> {
        let pk = &self.peers[k];
        let mine = pk.rate.piece_time(now, !pk.requested.is_empty())?;
        let my_eta = (pk.requested.len() + 1) as f64 * mine;
        let mut best: Option<(f64, u64)> = None;
        for (j, q) in self.peers.iter().enumerate() {
            if j == k || q.requested.is_empty() {
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
                    && pk.has.get(i)
                    && allowed[(i / 64) as usize] & (1 << (i % 64)) != 0
                    && !self.second.iter().any(|&(s, _)| s == i)
            });
            if let Some(i) = cand {
                best = Some((eta, i));
            }
        }
        best.map(|(_, i)| i)
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
    node.pending_from[i as usize] = Some(node.peers[k].id);
    node.req_at[i as usize] = Some(now);
    node.send_request(k, i, now);
}

/// Own stripe lowest first, then the others from their top.
fn stripe_pick(words: usize, stripes: &[Range<u64>], cand: impl Fn(usize) -> u64) -> Option<u64> {
    let (own, rest) = stripes.split_first()?;
    bits::pick_lowest(words, |w| cand(w) & bits::range_word(w, own.start, own.end)).or_else(|| {
        rest.iter().find_map(|s| {
            bits::pick_highest(words, |w| cand(w) & bits::range_word(w, s.start, s.end))
        })
    })
}
