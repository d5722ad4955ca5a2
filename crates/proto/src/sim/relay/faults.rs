//! Processes dying in the simulation, and the new sessions the survivors open to route
//! around them (see `crate::node::adopt`).

use super::{Pipe, Sim};
use crate::chunkmap::ChunkMap;
use crate::node::{Link, Node};
use crate::tree::NodeId;
use crate::wire::Open;

impl Sim {
    /// Node `i`'s process dies: every connection of its resets.
    pub(super) fn kill(&mut self, i: NodeId) {
        let now = self.now;
        let sn = &mut self.nodes[i];
        sn.dead = true;
        sn.ended = true;
        let children = sn.child_ids.clone();
        let parent = sn.parent;
        for p in [&mut self.down[i], &mut self.up[i]] {
            p.closed = true;
            p.frames.clear();
            p.unread = 0;
        }
        if let Some(p) = parent {
            if let Some(k) = self.nodes[p].child_ids.iter().position(|&c| c == i) {
                let reason = format!("n{i}: connection reset by peer");
                self.nodes[p]
                    .node
                    .handle_link_closed(Link::Child(k), reason, now);
            }
        }
        for c in children {
            if self.nodes[c].parent != Some(i) {
                continue; // adopted elsewhere already
            }
            for p in [&mut self.down[c], &mut self.up[c]] {
                p.closed = true;
                p.frames.clear();
                p.unread = 0;
            }
            let reason = "parent: connection reset by peer".to_string();
            self.nodes[c]
                .node
                .handle_link_closed(Link::Parent, reason, now);
        }
    }

    /// Node `p` adopted its child link `k`: it dials that node and opens the session there.
    pub(super) fn adopt(&mut self, p: NodeId, k: usize) {
        let now = self.now;
        let g = self.nodes[p].node.children()[k].node;
        let open = self.nodes[p].node.open_for(k);
        debug_assert_eq!(self.nodes[p].child_ids.len(), k);
        self.nodes[p].child_ids.push(g);
        if self.nodes[g].dead {
            let reason = format!("cannot reach n{g}: connection refused");
            self.nodes[p]
                .node
                .handle_link_closed(Link::Child(k), reason, now);
            return;
        }
        self.tell_child_rtts(p);
        self.instantiate(p, g, &open);
    }

    /// A new instance of node `g`'s session from `open` (sent by `p`): it replaces the old one,
    /// resumes from what `g`'s copy holds, and opens the session below it the same way.
    fn instantiate(&mut self, p: NodeId, g: NodeId, open: &Open) {
        let now = self.now;
        let mut node = Node::relay(open, self.keys.clone(), self.spec.node_config(g), now)
            .expect("relay accepts its Open");
        let sn = &mut self.nodes[g];
        let held: ChunkMap = sn.stored_set.clone();
        node.resume(held, sn.in_place, now);
        sn.report.peak_buffered = sn.report.peak_buffered.max(sn.node.peak_buffered());
        sn.child_ids = node.children().iter().map(|c| c.node).collect();
        sn.node = node;
        sn.parent = Some(p);
        sn.ended = false;
        sn.stores.clear();
        self.tell_child_rtts(g);
        self.down[g] = Pipe::new(self.spec.links[g], now);
        self.up[g] = Pipe::new(self.spec.links[g], now);
        let opens: Vec<(NodeId, Open)> = (0..self.nodes[g].child_ids.len())
            .map(|k| (self.nodes[g].child_ids[k], self.nodes[g].node.open_for(k)))
            .collect();
        for (c, o) in opens {
            if self.nodes[c].dead {
                let k = self.nodes[g].child_ids.iter().position(|&x| x == c);
                let reason = format!("cannot reach n{c}: connection refused");
                if let Some(k) = k {
                    self.nodes[g]
                        .node
                        .handle_link_closed(Link::Child(k), reason, now);
                }
            } else {
                self.instantiate(g, c, &o);
            }
        }
    }
}
