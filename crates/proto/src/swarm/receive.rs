//! What a member does with what its peers send: a verified piece, and the swarm messages.

use std::time::Instant;

use super::*;

impl SwarmNode {
    /// A verified piece from peer k.
    pub(super) fn on_piece(&mut self, k: usize, i: u64, now: Instant) {
        let from = self.peers[k].id;
        if self.cfg.strategy == Strategy::Hybrid {
            let rtt = match (self.pending_from[i as usize], self.req_at[i as usize]) {
                (Some(q), Some(t)) if q == from => Some(now.saturating_duration_since(t)),
                _ => None,
            };
            let p = &mut self.peers[k];
            if p.requested.contains(&i) {
                let idle = p.requested.len() == 1;
                p.rate.on_delivery(now, rtt, idle);
            }
        }
        {
            let p = &mut self.peers[k];
            p.requested.retain(|&r| r != i);
            p.has.set(i);
            p.down_window += 1;
        }
        if let Some(other) = self.pending_from[i as usize] {
            if other != from {
                if let Some(ko) = self.index[other] {
                    let o = &mut self.peers[ko];
                    o.requested.retain(|&r| r != i);
                    if o.connected {
                        o.ctrl
                            .push_back(Frame::Swarm(SwarmMsg::Cancel { index: i }));
                    }
                }
            }
        }
        self.unpend(i);
        if !self.second.is_empty() {
            let losers: Vec<NodeId> = self
                .second
                .iter()
                .filter(|&&(j, q)| j == i && q != from)
                .map(|&(_, q)| q)
                .collect();
            self.second.retain(|&(j, _)| j != i);
            for q in losers {
                if let Some(kq) = self.index[q] {
                    let o = &mut self.peers[kq];
                    o.requested.retain(|&r| r != i);
                    if o.connected {
                        o.ctrl
                            .push_back(Frame::Swarm(SwarmMsg::Cancel { index: i }));
                    }
                }
            }
        }
        if !self.have.insert(i) {
            self.duplicates += 1;
            return;
        }
        self.have_bits.set(i);
        for j in 0..self.peers.len() {
            if j == k || !self.peers[j].connected {
                continue;
            }
            let w = (i / 64) as usize;
            if self.interest_word(j, w) & (1 << (i % 64)) != 0 && self.peers[j].announced.set(i) {
                self.peers[j]
                    .ctrl
                    .push_back(Frame::Swarm(SwarmMsg::Have { index: i }));
            }
        }
        // The sender knows it.
        self.peers[k].announced.set(i);
        if self.have.len() == self.cfg.pieces && !self.complete {
            self.complete = true;
            self.events.push_back(SwarmEvent::Complete);
            self.try_ack();
        }
    }

    pub(super) fn handle_msg(
        &mut self,
        k: usize,
        m: SwarmMsg,
        now: Instant,
    ) -> Result<(), SwarmError> {
        let pieces = self.cfg.pieces;
        let check = |what: &'static str, i: u64| {
            if i >= pieces {
                Err(SwarmError::OutOfRange(what, i, pieces))
            } else {
                Ok(())
            }
        };
        match m {
            SwarmMsg::Bitfield { pieces: n, .. } if n != pieces => {
                return Err(SwarmError::BadBitfield(n, pieces));
            }
            m @ SwarmMsg::Bitfield { .. } => {
                let first = !std::mem::replace(&mut self.peers[k].heard, true);
                let target = self.targets.contains(&self.peers[k].id);
                for i in m.bitfield_pieces() {
                    self.peer_has(k, i);
                    // At the hybrid's source: a piece a deal target kept from an earlier
                    // session is out of the source's cluster already, and is not dealt.
                    if first && target && !self.exported.get(i) {
                        self.exported.set(i);
                    }
                }
                if first && target {
                    self.check_dealt_all();
                }
            }
            SwarmMsg::Have { index } => {
                check("Have", index)?;
                self.peer_has(k, index);
            }
            SwarmMsg::Cancel { index } => {
                check("Cancel", index)?;
                let p = &mut self.peers[k];
                let queued = p.uploads.len();
                p.uploads.retain(|&i| i != index);
                if p.uploads.len() < queued {
                    // Dropped before it was served: the requester may ask someone else.
                    p.ctrl
                        .push_back(Frame::Swarm(SwarmMsg::Cancelled { index }));
                }
            }
            SwarmMsg::Cancelled { index } => {
                check("Cancelled", index)?;
                self.on_cancelled(k, index, now);
            }
            SwarmMsg::Reject { index } => {
                check("Reject", index)?;
                let id = self.peers[k].id;
                let p = &mut self.peers[k];
                p.has.clear(index);
                p.requested.retain(|&i| i != index);
                self.second.retain(|&(j, q)| !(j == index && q == id));
                if self.pending_from[index as usize] == Some(id) {
                    self.unpend(index);
                }
            }
            SwarmMsg::Choke => {
                let p = &mut self.peers[k];
                p.peer_choking = true;
                let requested = std::mem::take(&mut p.requested);
                for i in requested {
                    self.unpend(i);
                }
            }
            SwarmMsg::Unchoke => self.peers[k].peer_choking = false,
            SwarmMsg::Interested => {
                self.peers[k].peer_interested = true;
                if self.cfg.strategy == Strategy::Swarm {
                    self.bt_on_interested(k, now);
                }
            }
            SwarmMsg::NotInterested => self.peers[k].peer_interested = false,
            SwarmMsg::Complete { node } => {
                self.ack.done.insert(node as NodeId);
                self.try_ack();
            }
            SwarmMsg::AllDone => self.on_all_done(),
            SwarmMsg::Dealt => {
                if self.cfg.strategy == Strategy::Hybrid && !self.dealt_all {
                    self.dealt_all = true;
                    for j in 0..self.peers.len() {
                        if self.peers[j].connected && !self.peers[j].local {
                            self.announce_all(j);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Peer k announced piece i.
    pub(super) fn peer_has(&mut self, k: usize, i: u64) {
        self.peers[k].has.set(i);
    }
}
