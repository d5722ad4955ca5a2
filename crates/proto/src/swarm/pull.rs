//! Which piece a member asks of which peer: the request window per peer, MOB's moves of a
//! request stuck behind a slow link, and the hybrid's endgame second requests.

use std::time::Instant;

use super::*;

impl SwarmNode {
    pub(super) fn unpend(&mut self, i: u64) {
        self.pending.clear(i);
        self.pending_from[i as usize] = None;
        self.req_at[i as usize] = None;
        if let Some(t) = self.moving_to[i as usize].take() {
            self.moving_in[t] -= 1;
        }
    }

    /// Asks peer k for piece i, which is now pending there.
    pub(super) fn pend(&mut self, k: usize, i: u64, now: Instant) {
        self.pending.set(i);
        self.pending_from[i as usize] = Some(self.peers[k].id);
        self.req_at[i as usize] = Some(now);
        self.send_request(k, i, now);
    }

    /// Which pieces we may request from peer k, as one mask word per 64 pieces.
    pub(super) fn allowed_words(&self, k: usize) -> Vec<u64> {
        let p = &self.peers[k];
        let words = self.have_bits.words();
        let in_source_cluster = self.my_cluster() == self.source_cluster;
        let share = self.share_mask(self.me);
        let word = |w: usize| match self.cfg.strategy {
            Strategy::TreePush => 0,
            Strategy::Swarm => u64::MAX,
            Strategy::Mob => match (p.local, in_source_cluster) {
                (true, true) => u64::MAX,
                (false, true) => 0,
                (true, false) => !share.word(w),
                (false, false) => share.word(w),
            },
            Strategy::Hybrid => {
                if p.local {
                    // What the local tree parent holds it pushes: not pulled.
                    match self.tree_parent.and_then(|t| self.index[t]) {
                        Some(kp) if self.peers[kp].local && self.peers[kp].connected => {
                            !self.peers[kp].has.word(w)
                        }
                        _ => u64::MAX,
                    }
                } else if in_source_cluster {
                    0
                } else {
                    share.word(w)
                }
            }
        };
        (0..words).map(word).collect()
    }

    /// Keeps `R` requests outstanding to peer k.
    pub(super) fn top_up(&mut self, k: usize, now: Instant) {
        if self.cfg.strategy == Strategy::Swarm {
            self.bt_update_interest(k);
            if self.peers[k].peer_choking {
                return;
            }
        }
        if self.complete || self.cfg.strategy == Strategy::TreePush {
            return;
        }
        if self.cfg.strategy == Strategy::Hybrid {
            self.hybrid_top_up(k, now);
            return;
        }
        if self.peers[k].requested.len() >= self.cfg.requests_per_peer {
            return;
        }
        let allowed = self.allowed_words(k);
        while self.peers[k].requested.len() < self.cfg.requests_per_peer {
            let (have, pending, has) = (&self.have_bits, &self.pending, &self.peers[k].has);
            let pick = bits::pick_random(have.words(), &mut self.rng, |w| {
                has.word(w) & !have.word(w) & !pending.word(w) & allowed[w]
            });
            let Some(i) = pick.or_else(|| self.endgame_pick(k, &allowed, now)) else {
                break;
            };
            if self.pending.get(i) {
                // A second request (hybrid endgame); the first stays with its peer.
                self.second.push((i, self.peers[k].id));
                let p = &mut self.peers[k];
                p.requested.push(i);
                p.ctrl.push_back(Frame::Request { index: i });
                continue;
            }
            self.pend(k, i, now);
        }
        if self.cfg.strategy == Strategy::Mob
            && self.peers[k].requested.len() < self.cfg.requests_per_peer
        {
            self.mob_move(k, &allowed, now);
        }
    }

    /// MOB, peer k is idle and has nothing new to give: the oldest request that has waited
    /// at another peer for more than [`MOB_MOVE_AFTER`] and that k could serve is moved to k.
    /// Not at once (the piece may be on the wire already, and MOB brings each piece into each
    /// cluster once): a `Cancel` goes out, and only its `Cancelled` answer, sent when the
    /// request was dropped unserved, sends the request to k. Without this a site whose only
    /// route to the source's site is slow waits for every request queued there long after its
    /// other peers got the pieces (the MOB paper's small root cluster).
    pub(super) fn mob_move(&mut self, k: usize, allowed: &[u64], now: Instant) {
        if !self.peers[k].requested.is_empty() {
            return;
        }
        let pk = &self.peers[k];
        let mut best: Option<(Instant, u64, usize)> = None;
        for (j, q) in self.peers.iter().enumerate() {
            if j == k {
                continue;
            }
            for &i in &q.requested {
                let Some(at) = self.req_at[i as usize] else {
                    continue;
                };
                let movable = self.pending_from[i as usize] == Some(q.id)
                    && self.moving_to[i as usize].is_none()
                    && pk.has.get(i)
                    && bits::word_bit(allowed, i)
                    && now.saturating_duration_since(at) > MOB_MOVE_AFTER;
                if movable && best.is_none_or(|(b, _, _)| at < b) {
                    best = Some((at, i, j));
                }
            }
        }
        let Some((_, i, j)) = best else {
            return;
        };
        self.start_move(j, i, self.peers[k].id);
    }

    /// Starts moving our request for piece i from peer j to member `to`: a `Cancel` goes to
    /// j, and only its `Cancelled` answer (the request dropped unserved) asks `to`
    /// ([`SwarmNode::on_cancelled`]), so the piece is never sent twice.
    pub(crate) fn start_move(&mut self, j: usize, i: u64, to: NodeId) {
        if let Some(t) = self.moving_to[i as usize].replace(to) {
            self.moving_in[t] -= 1;
        }
        self.moving_in[to] += 1;
        self.peers[j]
            .ctrl
            .push_back(Frame::Swarm(SwarmMsg::Cancel { index: i }));
    }

    /// Peer k dropped our request for piece i unserved: if we were moving it, ask the peer we
    /// chose; otherwise it is free for whoever has it.
    pub(super) fn on_cancelled(&mut self, k: usize, i: u64, now: Instant) {
        let id = self.peers[k].id;
        self.peers[k].requested.retain(|&r| r != i);
        if self.pending_from[i as usize] != Some(id) {
            return;
        }
        let to = self.moving_to[i as usize];
        self.unpend(i);
        let target = to.and_then(|t| self.index[t]).filter(|&t| {
            let p = &self.peers[t];
            p.connected && p.has.get(i) && !self.have.contains(i)
        });
        if let Some(t) = target {
            self.pend(t, i, now);
        }
    }

    /// Hybrid endgame: once every missing piece is requested (or left to push), a piece
    /// pending at another peer may be requested from this one too; the first copy to arrive
    /// wins and the other request is cancelled. This is the one place the hybrid may bring a
    /// second copy into a cluster, so from a peer in another cluster it does so only when
    /// waiting for the first request is slower ([`Self::endgame_from_afar`]); a
    /// cluster mate's copy costs no WAN bytes and is asked at random.
    pub(super) fn endgame_pick(&mut self, k: usize, allowed: &[u64], now: Instant) -> Option<u64> {
        if self.cfg.strategy != Strategy::Hybrid {
            return None;
        }
        let missing = self.cfg.pieces - self.have.len();
        if missing > self.pending.count() + self.cfg.requests_per_peer as u64 {
            return None;
        }
        let me = self.peers[k].id;
        let mut seconded = Bits::new(self.cfg.pieces);
        for &(i, _) in &self.second {
            seconded.set(i);
        }
        for &i in &self.peers[k].requested {
            seconded.set(i);
        }
        let (have, pending, has) = (&self.have_bits, &self.pending, &self.peers[k].has);
        let cand = |w: usize| {
            has.word(w) & !have.word(w) & pending.word(w) & !seconded.word(w) & allowed[w]
        };
        if !self.peers[k].local {
            return self.endgame_from_afar(k, &cand, now);
        }
        let i = bits::pick_random(have.words(), &mut self.rng, cand)?;
        (self.pending_from[i as usize] != Some(me)).then_some(i)
    }

    /// The endgame's second request at peer k in another cluster: of the candidate pieces
    /// (`cand`'s bits), the one whose first request has the longest expected wait left, if k
    /// would deliver it sooner (its queue times its piece time, and a round trip). That is
    /// the rule, a second copy into a cluster only when it is the way to finish
    /// sooner; in the simulator's size sweep (`swarm_sim --lab --sweep`) it took the copies per
    /// cluster from 1.06-1.34 to 1.00-1.22 at 2 MiB and from 1.02-1.05 to 1.00-1.03 at 128 MiB,
    /// finishing sooner in 10 of the 16 cells from 2 MiB up and later in 3 (a margin of 2, as
    /// for moves, was slower on slow links). The wait left at the first peer is its queue position times its piece
    /// time (which grows while it delivers nothing); before it delivered twice (no rate yet)
    /// it is the time the request has waited beyond k's estimate. A peer k that delivered only
    /// once is taken to need two round trips; one that never delivered is not asked: a
    /// second copy on a guess is what brought 1.1-2 copies into each cluster for objects of a
    /// few pieces.
    pub(super) fn endgame_from_afar(
        &self,
        k: usize,
        cand: &dyn Fn(usize) -> u64,
        now: Instant,
    ) -> Option<u64> {
        let pk = &self.peers[k];
        let rtt = pk.rate.min_rtt().as_secs_f64();
        let my_eta = match pk.rate.piece_time(now, !pk.requested.is_empty()) {
            Some(t) => (pk.requested.len() + 1) as f64 * t + rtt,
            // Delivered once: about a round trip and the piece, taken as a second round trip.
            None if rtt > 0.0 => 2.0 * rtt,
            None => return None,
        };
        let mut best: Option<(f64, u64)> = None;
        for i in bits::ones_of(self.have_bits.words(), cand) {
            let Some(j) = self.pending_from[i as usize].and_then(|q| self.index[q]) else {
                continue;
            };
            let q = &self.peers[j];
            let Some(pos) = q.requested.iter().position(|&r| r == i) else {
                continue;
            };
            let left = match q.rate.piece_time(now, true) {
                Some(t) => (pos + 1) as f64 * t,
                None => self.req_at[i as usize].map_or(0.0, |t| {
                    now.saturating_duration_since(t).as_secs_f64() - my_eta
                }),
            };
            if left > my_eta && best.is_none_or(|(b, _)| left > b) {
                best = Some((left, i));
            }
        }
        best.map(|(_, i)| i)
    }
}
