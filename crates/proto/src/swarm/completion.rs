//! The completion phase (MOB's phase 4, used by every strategy): `Complete` travels up a
//! binary tree over the live members, `AllDone` comes back down.

use std::collections::BTreeSet;

use super::*;

/// Completion-tree state (MOB's phase 4, used by every strategy).
#[derive(Debug, Default)]
pub(super) struct Ack {
    pub(super) parent: Option<NodeId>,
    pub(super) children: Vec<NodeId>,
    /// Members that reported their subtree complete.
    pub(super) done: BTreeSet<NodeId>,
    pub(super) sent: bool,
    pub(super) all_done: bool,
}

impl SwarmNode {
    /// The binary completion tree over the live members in node-id order. A member that came
    /// back is outside it (the tree of the others does not change under them): it reports
    /// straight to the source.
    pub(super) fn layout_ack(&mut self) {
        if self.returned[self.me] {
            self.ack.parent = Some(SOURCE);
            self.ack.children.clear();
            return;
        }
        let live: Vec<NodeId> = (0..self.alive.len())
            .filter(|&m| self.alive[m] && !self.returned[m])
            .collect();
        let Some(pos) = live.iter().position(|&m| m == self.me) else {
            return;
        };
        self.ack.parent = (pos > 0).then(|| live[(pos - 1) / 2]);
        self.ack.children = [2 * pos + 1, 2 * pos + 2]
            .iter()
            .filter_map(|&c| live.get(c).copied())
            .collect();
    }

    /// Sends `Complete` up (or, at the root, `AllDone` down) once this node and its
    /// completion subtree are done.
    pub(super) fn try_ack(&mut self) {
        if !self.complete || self.ack.sent || self.ack.all_done {
            return;
        }
        if !self.ack.children.iter().all(|c| self.ack.done.contains(c)) {
            return;
        }
        // The root waits for the members that came back too.
        if self.ack.parent.is_none() && self.returned_pending().is_some() {
            return;
        }
        self.ack.sent = true;
        match self.ack.parent {
            None => self.on_all_done(),
            Some(parent) => {
                let node = self.me as u32;
                self.send_ctrl(parent, Frame::Swarm(SwarmMsg::Complete { node }));
            }
        }
    }

    pub(super) fn on_all_done(&mut self) {
        if self.ack.all_done {
            return;
        }
        self.ack.all_done = true;
        self.events.push_back(SwarmEvent::AllDone);
        let mut to = self.ack.children.clone();
        if self.ack.parent.is_none() {
            to.extend((0..self.alive.len()).filter(|&m| self.alive[m] && self.returned[m]));
        }
        for c in to {
            self.send_ctrl(c, Frame::Swarm(SwarmMsg::AllDone));
        }
    }

    /// A live member that came back and has not reported complete yet.
    fn returned_pending(&self) -> Option<NodeId> {
        (0..self.alive.len())
            .find(|&m| self.alive[m] && self.returned[m] && !self.ack.done.contains(&m))
    }
}
