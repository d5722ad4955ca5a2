//! Routing around a dead relay: its parent adopts its children.
//!
//! Every node knows its whole subtree with addresses (its `Open` carries it), so when the link
//! to a child closes (reset, end of stream, a protocol error) or the child is cut off for a
//! stall, the node knows its grandchildren. The default policy: only the dead child is reported
//! failed; one of its children takes its place as a child of this node ([`Event::Connect`]: the
//! driver dials it and sends it a new `Open` for the same session), with the other orphans
//! re-planned below it so that no node gets more children than the plan's fan-out (the policy
//! is `node/replan.rs`). The adopted node resumes from what its copy holds (its `Have`), so
//! only missing chunks move, and its own subtree is set up again below it the same way.
//!
//! What the adopted subtree lacks below what this node still keeps in memory comes from its
//! local copy (a relay, [`Event::Load`]), from the input read again (a source whose input is a
//! file, see [`Node::set_rereadable`]), or, at a relay whose copy cannot serve it, from its own
//! parent again. A source that cannot read its input again (a stream) fails the adopted child
//! that needs a chunk it no longer has. Memory stays bounded as before: the buffer keeps its
//! budget (the adopted child's acknowledgements hold it like any other's) and each child reads
//! back at most [`super::LOAD_AHEAD`] chunks ahead.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{new_child, Event, Link, Node, NodeId, Upstream};
use crate::wire::Frame;

impl Node {
    /// Source only: its input can be read again at any offset (a file), so chunks it no longer
    /// holds in memory can still go to a child adopted late ([`Event::Load`]).
    pub fn set_rereadable(&mut self, yes: bool) {
        self.reread = yes;
    }

    /// Child `k` is gone: it alone is reported failed; its children are adopted.
    pub(super) fn lose_child(&mut self, k: usize, reason: String, now: Instant) {
        let c = &mut self.children[k];
        if !c.alive {
            return;
        }
        c.alive = false;
        c.requests.clear();
        c.loads.clear();
        c.loaded.clear();
        let dead = c.node as u32;
        let unresolved = std::mem::take(&mut c.unresolved);
        let members = std::mem::take(&mut c.members);
        self.events.push_back(Event::CloseLink(Link::Child(k)));
        if unresolved.contains(&(dead as NodeId)) {
            self.report(Frame::Failed { node: dead, reason });
        }
        // One new child in the dead one's place, its orphans re-planned below it
        // (`replan.rs`), so this node's uplink is shared as before.
        let plan = super::replan::replan_orphans(&members, &unresolved, self.id as u32);
        if let Some(root) = plan.first() {
            let open: BTreeSet<NodeId> = plan
                .iter()
                .map(|x| x.node as NodeId)
                .filter(|n| unresolved.contains(n))
                .collect();
            let mut child = new_child(root, plan.clone(), now);
            child.unresolved = open;
            self.children.push(child);
            self.events
                .push_back(Event::Connect(self.children.len() - 1));
        }
        self.evict();
    }

    /// Child `k` needs chunk `i`, which this node verified once but holds neither in memory nor
    /// readable on disk: a relay asks its parent again; a source gives the child up.
    pub(super) fn chunk_gone(&mut self, k: usize, i: u64, now: Instant) {
        match self.upstream {
            Upstream::Parent { .. } => {
                if self.refetch.insert(i) {
                    self.request(i, now);
                }
            }
            Upstream::Input { .. } => {
                let name = self.children[k].name.clone();
                let reason = format!(
                    "{name} needs chunk {i}, which the source no longer holds and cannot read again"
                );
                self.lose_child(k, reason, now);
            }
        }
    }
}
