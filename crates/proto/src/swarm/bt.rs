//! The BitTorrent-style baseline's choking, as the MOB paper implemented it (section 2.5).
//!
//! Every [`SwarmConfig::rechoke_every`] (10 s) a node unchokes the
//! [`SwarmConfig::unchoke_slots`] (4) interested peers that gave it the most pieces since the
//! last round (once complete: those it gave the most to), and chokes the rest but one: the
//! *optimistic* unchoke, redrawn at random every [`SwarmConfig::optimistic_every`] (30 s)
//! among the choked interested peers, a peer that holds nothing weighing three times as much.
//! A peer that becomes interested while a regular slot is free is unchoked at once (the
//! original client rechokes on such changes too), so the swarm does not wait 10 s to start.
//! A choked peer's queued requests are dropped, and the requester forgets them on `Choke`.

use std::time::Instant;

use rand::Rng;

use super::{bits, Strategy, SwarmConfig, SwarmMsg, SwarmNode};
use crate::wire::Frame;

/// Choking timers and the optimistic unchoke.
#[derive(Debug)]
pub(crate) struct Choker {
    next_rechoke: Instant,
    next_optimistic: Instant,
    optimistic: Option<usize>,
}

impl Choker {
    pub(crate) fn new(cfg: &SwarmConfig, now: Instant) -> Self {
        Self {
            next_rechoke: now + cfg.rechoke_every,
            next_optimistic: now,
            optimistic: None,
        }
    }

    pub(crate) fn next(&self) -> Instant {
        self.next_rechoke.min(self.next_optimistic)
    }
}

impl SwarmNode {
    pub(crate) fn bt_timeout(&mut self, now: Instant) {
        let mut redraw = false;
        if now >= self.bt.next_optimistic {
            while self.bt.next_optimistic <= now {
                self.bt.next_optimistic += self.cfg.optimistic_every;
            }
            redraw = true;
        }
        if now >= self.bt.next_rechoke || redraw {
            while self.bt.next_rechoke <= now {
                self.bt.next_rechoke += self.cfg.rechoke_every;
            }
            self.rechoke(now, redraw);
        }
    }

    /// Peer k became interested: unchoke it now if a regular slot is free.
    pub(crate) fn bt_on_interested(&mut self, k: usize, _now: Instant) {
        let regular = self
            .peers
            .iter()
            .enumerate()
            .filter(|(j, p)| p.connected && !p.am_choking && Some(*j) != self.bt.optimistic)
            .count();
        if self.peers[k].am_choking && regular < self.cfg.unchoke_slots {
            self.set_choke(k, false);
        }
    }

    /// Sends `Interested`/`NotInterested` to peer k when that changed.
    pub(crate) fn bt_update_interest(&mut self, k: usize) {
        let p = &self.peers[k];
        let want = !self.complete
            && bits::pick_lowest(self.have_bits.words(), |w| {
                p.has.word(w) & !self.have_bits.word(w)
            })
            .is_some();
        if want != p.am_interested {
            let p = &mut self.peers[k];
            p.am_interested = want;
            p.ctrl.push_back(Frame::Swarm(if want {
                SwarmMsg::Interested
            } else {
                SwarmMsg::NotInterested
            }));
        }
    }

    /// Tit-for-tat: the best `unchoke_slots` interested peers stay unchoked, plus the
    /// optimistic one (redrawn when `redraw`).
    pub(crate) fn rechoke(&mut self, _now: Instant, redraw: bool) {
        if self.cfg.strategy != Strategy::Swarm {
            return;
        }
        let complete = self.complete;
        let mut cands: Vec<usize> = (0..self.peers.len())
            .filter(|&k| self.peers[k].connected && self.peers[k].peer_interested)
            .collect();
        // Random order first, so that ties are broken at random.
        for i in (1..cands.len()).rev() {
            let j = self.rng.gen_range(0..=i);
            cands.swap(i, j);
        }
        let score = |p: &super::Peer| if complete { p.up_window } else { p.down_window };
        cands.sort_by_key(|&k| std::cmp::Reverse(score(&self.peers[k])));
        let regular: Vec<usize> = cands.iter().copied().take(self.cfg.unchoke_slots).collect();
        if redraw || self.bt.optimistic.is_some_and(|o| !self.peers[o].connected) {
            let rest: Vec<usize> = cands
                .iter()
                .copied()
                .filter(|k| !regular.contains(k))
                .collect();
            let weights: Vec<u32> = rest
                .iter()
                .map(|&k| if self.peers[k].has.count() == 0 { 3 } else { 1 })
                .collect();
            let total: u32 = weights.iter().sum();
            self.bt.optimistic = None;
            if total > 0 {
                let mut x = self.rng.gen_range(0..total);
                for (j, &wgt) in weights.iter().enumerate() {
                    if x < wgt {
                        self.bt.optimistic = Some(rest[j]);
                        break;
                    }
                    x -= wgt;
                }
            }
        }
        for k in 0..self.peers.len() {
            if !self.peers[k].connected {
                continue;
            }
            let unchoke = regular.contains(&k) || self.bt.optimistic == Some(k);
            self.set_choke(k, !unchoke);
            self.peers[k].down_window = 0;
            self.peers[k].up_window = 0;
        }
    }

    fn set_choke(&mut self, k: usize, choke: bool) {
        let p = &mut self.peers[k];
        if p.am_choking == choke {
            return;
        }
        p.am_choking = choke;
        if choke {
            p.uploads.clear();
            p.ctrl.push_back(Frame::Swarm(SwarmMsg::Choke));
        } else {
            p.ctrl.push_back(Frame::Swarm(SwarmMsg::Unchoke));
        }
    }
}
