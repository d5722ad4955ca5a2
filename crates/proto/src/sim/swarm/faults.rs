//! Faults in the swarm simulator: host keys and a forging member, and a lost member whose
//! agent comes back and is re-admitted by the source's session.

use super::*;
use crate::identity::{AllowList, HostKey, Identity, Role};

/// Node `i`'s keys: the session secret, and with host keys its own key (the source's may push,
/// the others only relay); receivers then require the source's say on every piece.
pub(super) fn keys_of(spec: &SwarmSimSpec, n: usize, i: NodeId) -> Keys {
    let keys = Keys::derive(&Secret::from_bytes([0x5a; 32]));
    if !spec.host_keys {
        return keys;
    }
    let key = |j: usize| HostKey::from_seed([j as u8 + 1; 32]);
    let allow = AllowList::with_roles((0..n).map(|j| {
        (
            key(j).public(),
            if j == 0 { Role::Push } else { Role::Relay },
        )
    }));
    let keys = keys.with_identity(Identity { key: key(i), allow });
    if i == 0 {
        keys
    } else {
        keys.requiring_source()
    }
}

impl Sim {
    /// What the forger sends for a piece: other bytes, hashed, tagged and signed by itself (it
    /// holds the secret and its own key, not the source's).
    pub(super) fn forge(&self, a: NodeId, c: Chunk) -> Chunk {
        let mut data = c.data.to_vec();
        if let Some(b) = data.first_mut() {
            *b ^= 0xff;
        }
        self.nodes[a]
            .keys
            .seal(self.spec.config.session, c.index, Bytes::from(data))
    }

    /// Node k refused piece i from `from`: as the driver does, it drops that connection, and
    /// both sides move their requests elsewhere.
    pub(super) fn refused(&mut self, k: NodeId, from: NodeId, i: u64) {
        self.report.refused.push((k, from, i));
        if self.cut.insert((k.min(from), k.max(from))) {
            let now = self.now;
            self.nodes[k].node.handle_peer_lost(from, now);
            self.nodes[from].node.handle_peer_lost(k, now);
            self.mark(from);
        }
    }

    /// The source's session timers: tries to reach members that are away (those whose agent is
    /// up again are re-admitted), then the stall and give-up timers.
    pub(super) fn session_timers(&mut self) {
        let now = self.now;
        let Some(s) = &mut self.session else {
            return;
        };
        let due = s.poll_redial(now);
        for j in due {
            if self.nodes[j].restarted {
                self.readmit(j);
            } else if let Some(s) = &mut self.session {
                s.handle_redial_failed(j, "connection refused", now);
            }
        }
        if let Some(s) = &mut self.session {
            s.handle_timeout(now);
        }
    }

    /// Member j's agent answered the source again: a new instance resumes from what the lost
    /// one stored, learns who is lost or back, and every member takes it back.
    fn readmit(&mut self, j: NodeId) {
        let now = self.now;
        if let Some(s) = &mut self.session {
            s.handle_back(j, now);
        }
        let held = self.nodes[j].node.have().clone();
        let keys = self.nodes[j].keys.clone();
        let mut node = SwarmNode::new(
            self.spec.config.clone(),
            keys.clone(),
            &self.labels,
            j,
            Some(&self.spec.tree),
            now,
        )
        .expect("valid simulation plan");
        if let Some(h) = &self.hashes {
            node.set_piece_hashes(h.clone());
        }
        node.resume(&held);
        let n = self.nodes.len();
        for m in (0..n).filter(|&m| m != j) {
            if !self.nodes[m].alive {
                node.handle_member_lost(m, now);
            } else if self.report.readmitted.contains(&m) {
                node.handle_member_back(m, now);
            }
        }
        node.handle_member_back(j, now);
        // What it stored is kept, sealed again for the session by the member itself.
        let session = self.spec.config.session;
        let sn = &mut self.nodes[j];
        for c in sn.store.iter_mut().flatten() {
            *c = keys.seal(session, c.index, c.data.clone());
        }
        sn.node = node;
        sn.alive = true;
        sn.restarted = false;
        sn.inc += 1;
        sn.timer = None;
        self.inflight.retain(|&(a, b), _| a != j && b != j);
        self.report.lost[j] = false;
        self.report.readmitted.push(j);
        let others: Vec<NodeId> = (0..n).filter(|&m| m != j && self.nodes[m].alive).collect();
        for m in others {
            self.nodes[m].node.handle_member_back(j, now);
            self.mark(m);
        }
        let linked: Vec<NodeId> = (0..n)
            .filter(|&m| m != j && self.nodes[m].alive)
            .filter(|&m| {
                m == 0
                    || self.nodes[m].node.connect_to().contains(&j)
                    || self.nodes[j].node.connect_to().contains(&m)
            })
            .collect();
        for m in linked {
            self.connect(m, j);
        }
    }
}
