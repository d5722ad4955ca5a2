//! A member's peers: whom it dials first, the state it keeps per peer, and which of its
//! pieces each peer hears of.

use std::time::Instant;

use rand::seq::SliceRandom;

use super::*;

impl SwarmNode {
    pub(super) fn ensure_peer(&mut self, id: NodeId) -> usize {
        if let Some(k) = self.index[id] {
            return k;
        }
        let k = self.peers.len();
        let peer = self.new_peer(id);
        self.peers.push(peer);
        self.index[id] = Some(k);
        k
    }

    /// What this node knows of `id` before they talk.
    fn new_peer(&self, id: NodeId) -> Peer {
        let p = self.cfg.pieces;
        Peer {
            id,
            local: self.mobs.cluster(id) == self.mobs.cluster(self.me),
            connected: false,
            child: self.tree_children.contains(&id),
            has: if id == SOURCE && self.cfg.strategy != Strategy::Hybrid {
                Bits::full(p)
            } else {
                Bits::new(p)
            },
            announced: Bits::new(p),
            pushed: Bits::new(p),
            ctrl: VecDeque::new(),
            uploads: VecDeque::new(),
            requested: Vec::new(),
            am_choking: false,
            peer_choking: false,
            am_interested: false,
            peer_interested: false,
            down_window: 0,
            up_window: 0,
            rate: hybrid::PeerRate::default(),
            heard: false,
        }
    }

    /// `node`, lost before, is back in the session: the source reached it again and it resumed
    /// from its copy (a restarted agent). It counts again for mob ranks and shares and takes
    /// back its place in the planned tree; what this node knew of it is forgotten (the new
    /// instance announces what it holds when connected). It stays outside the completion tree,
    /// so the others' tree does not change under them: it reports to the source, which waits
    /// for it before `AllDone`. At `node` itself (told it
    /// came back) this places it under the source. Ignored once the session is all done.
    pub fn handle_member_back(&mut self, node: NodeId, now: Instant) {
        if node >= self.alive.len() || self.ack.all_done {
            return;
        }
        if node == self.me {
            if self.me != SOURCE && !self.returned[node] {
                self.returned[node] = true;
                self.layout_ack();
                self.ack.sent = false;
                self.try_ack();
            }
            return;
        }
        if self.alive[node] {
            return;
        }
        self.handle_peer_lost(node, now);
        self.alive[node] = true;
        self.returned[node] = true;
        self.ack.done.remove(&node);
        self.mobs = Mobs::new(&self.labels, &self.alive);
        if self.planned.0 == Some(node) {
            self.tree_parent = Some(node);
        }
        if self.planned.1.contains(&node) && !self.tree_children.contains(&node) {
            self.tree_children.push(node);
        }
        if let Some(k) = self.index[node] {
            self.peers[k] = self.new_peer(node);
        }
        self.layout_ack();
        for k in 0..self.peers.len() {
            if self.peers[k].connected && !self.peers[k].local {
                self.announce_all(k);
            }
        }
    }

    /// Whether `peer` should hear that we hold piece i.
    pub(super) fn interest_word(&self, k: usize, w: usize) -> u64 {
        let p = &self.peers[k];
        match self.cfg.strategy {
            Strategy::TreePush => 0,
            Strategy::Swarm => u64::MAX,
            Strategy::Hybrid if !p.local && self.my_cluster() == self.source_cluster => {
                // Out of the source's cluster pieces are dealt; the source serves requests
                // only once it dealt everything (the endgame, or a piece lost with its
                // target), and its cluster mates never.
                if self.dealt_all {
                    self.share_mask(p.id).word(w)
                } else {
                    0
                }
            }
            Strategy::Mob | Strategy::Hybrid => {
                if p.local {
                    u64::MAX
                } else {
                    self.share_mask(p.id).word(w)
                }
            }
        }
    }

    /// The first `Bitfield` to peer k once connected, sent even when empty: a peer that pushes
    /// to us (our tree parent, or the source dealing) waits for it and hears of every piece we
    /// hold, so that it pushes none we kept from an earlier session; others hear what they
    /// should know of, as later.
    pub(super) fn greet(&mut self, k: usize) {
        let id = self.peers[k].id;
        let pushes_here = self.cfg.strategy.pushes()
            && (self.tree_parent == Some(id)
                || self.cfg.strategy == Strategy::Hybrid && id == SOURCE);
        let pieces = self.cfg.pieces;
        let mut new = Bits::new(pieces);
        for w in 0..self.have_bits.words() {
            let mask = if pushes_here {
                u64::MAX
            } else {
                self.interest_word(k, w)
            };
            new.or_word(w, self.have_bits.word(w) & mask);
        }
        let p = &mut self.peers[k];
        for w in 0..new.words() {
            p.announced.or_word(w, new.word(w));
        }
        p.ctrl
            .push_back(Frame::Swarm(SwarmMsg::bitfield(pieces, |i| new.get(i))));
    }

    /// Tells peer k every piece we hold that it should know of and has not heard of.
    pub(super) fn announce_all(&mut self, k: usize) {
        let pieces = self.cfg.pieces;
        let mut new = Bits::new(pieces);
        for w in 0..self.have_bits.words() {
            let m = self.have_bits.word(w)
                & self.interest_word(k, w)
                & !self.peers[k].announced.word(w);
            new.or_word(w, m);
        }
        if new.count() == 0 {
            return;
        }
        let p = &mut self.peers[k];
        for w in 0..new.words() {
            p.announced.or_word(w, new.word(w));
        }
        p.ctrl
            .push_back(Frame::Swarm(SwarmMsg::bitfield(pieces, |i| new.get(i))));
    }

    /// Picks the initial peers to dial.
    pub(super) fn choose_peers(&mut self) -> Vec<NodeId> {
        let n = self.alive.len();
        let me = self.me;
        let mut out: Vec<NodeId> = Vec::new();
        let my_cluster = self.my_cluster();
        let locals: Vec<NodeId> = self
            .mobs
            .members(my_cluster)
            .iter()
            .copied()
            .filter(|&m| m != me)
            .collect();
        match self.cfg.strategy {
            Strategy::TreePush => {}
            Strategy::Swarm => {
                let mut all: Vec<NodeId> = (0..n).filter(|&m| m != me).collect();
                all.shuffle(&mut self.rng);
                out.extend(all.into_iter().take(self.cfg.swarm_peers));
            }
            Strategy::Mob | Strategy::Hybrid => {
                let mut l = locals.clone();
                l.shuffle(&mut self.rng);
                out.extend(l.into_iter().take(self.cfg.local_peers));
                if self.cfg.strategy == Strategy::Mob {
                    let mut g = self.mobs.global_candidates(me);
                    g.shuffle(&mut self.rng);
                    out.extend(g.into_iter().take(self.cfg.global_peers));
                } else {
                    // At least one: a receiver with no server abroad could never get its share.
                    let servers = self.cfg.hybrid_servers.max(1);
                    out.extend(self.mobs.rank_matched(me, servers));
                }
                out.extend(self.targets.iter().copied());
            }
        }
        out.extend(self.tree_parent);
        out.extend(self.ack.parent);
        let mut seen = vec![false; n];
        out.retain(|&m| m != me && !std::mem::replace(&mut seen[m], true));
        out
    }

    /// Queues a control frame to a member, asking the driver to connect if need be.
    pub(super) fn send_ctrl(&mut self, to: NodeId, f: Frame) {
        let k = self.ensure_peer(to);
        if !self.peers[k].connected {
            self.events.push_back(SwarmEvent::Connect { peer: to });
        }
        self.peers[k].ctrl.push_back(f);
    }
}
