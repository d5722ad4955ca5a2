//! Where the orphans of a dead relay go: the adoption policy, as a pure function.
//!
//! The parent of a relay that dies (or is let go) knows the relay's whole subtree. Attaching
//! every orphan to itself would give it more children than the plan gave any node, and its
//! uplink, shared by more children, would slow all of them (in a fan-out 2 tree, a relay dead
//! at 30% made the rest take 1.66 times as long). Instead the adopter takes exactly one orphan,
//! in the dead relay's place, and the others hang below the re-planned subtree, so that:
//!
//! - no node gets more children than the fan-out of the dead relay's subtree (the largest
//!   number of children any node of it had, the dead one included; a chain stays a chain);
//! - every edge among the orphans that can stay, stays (a planner that placed a node near its
//!   parent keeps that choice), and each further child of the dead relay brings its whole
//!   subtree along;
//! - such a subtree hangs from the shallowest node with a free slot (the fewest hops from the
//!   adopter), the one with the largest declared uplink among equals, then the first in plan
//!   order;
//! - nodes whose whole subtree has finished (or failed) are left out: they have nothing more
//!   to take, and one that failed should not relay. A node that finished but has unfinished
//!   nodes below it stays, as a relay (its copy serves them).
//!
//! Every orphan is opened again anyway (its old parent is gone, and a new instance of the
//! session replaces the old one at each node below), so moving a subtree costs no more than
//! keeping it where it was.

use std::collections::{BTreeMap, BTreeSet};

use crate::tree::NodeId;
use crate::wire::Member;

/// The orphans of `members[0]` (a dead relay's subtree, dead first, as its `Child` keeps it)
/// re-planned as one subtree to hang below `adopter`, root first with its parent set to
/// `adopter`. Empty when no node below the dead one is in `unresolved`.
pub fn replan_orphans(
    members: &[Member],
    unresolved: &BTreeSet<NodeId>,
    adopter: u32,
) -> Vec<Member> {
    let Some(dead) = members.first().map(|m| m.node) else {
        return Vec::new();
    };
    let kids = |p: u32| members.iter().filter(move |m| m.parent == p && m.node != p);
    let fanout = members
        .iter()
        .map(|m| kids(m.node).count())
        .max()
        .unwrap_or(0)
        .max(1);
    // Whether a node's subtree (itself included) still has an unresolved node.
    let open = |m: &Member| {
        super::subtree(m, members)
            .iter()
            .any(|x| unresolved.contains(&(x.node as NodeId)))
    };
    let mut out: Vec<Member> = Vec::new();
    let mut depth: BTreeMap<u32, usize> = BTreeMap::new();
    let mut degree: BTreeMap<u32, usize> = BTreeMap::new();
    for top in kids(dead).filter(|m| open(m)) {
        let parent = if out.is_empty() {
            adopter
        } else {
            // Every leaf of what is kept is unresolved, so a free unresolved slot exists.
            out.iter()
                .filter(|m| degree.get(&m.node).copied().unwrap_or(0) < fanout)
                .filter(|m| unresolved.contains(&(m.node as NodeId)))
                .min_by_key(|m| (depth[&m.node], std::cmp::Reverse(m.uplink_kbps)))
                .or_else(|| out.first())
                .map_or(adopter, |m| m.node)
        };
        let base = depth.get(&parent).map_or(0, |d| d + 1);
        *degree.entry(parent).or_default() += 1;
        // The subtree of `top`, minus the parts with nothing left to do, edges kept.
        let sub = super::subtree(top, members);
        for m in sub.iter().filter(|m| open(m)) {
            let mut m = m.clone();
            if m.node == top.node {
                m.parent = parent;
                depth.insert(m.node, base);
            } else {
                let d = depth[&m.parent] + 1;
                depth.insert(m.node, d);
                *degree.entry(m.parent).or_default() += 1;
            }
            out.push(m);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    fn members_of(tree: &Tree, root: usize) -> Vec<Member> {
        // `subtree` order: root first, then breadth first, as `Child::members`.
        let all: Vec<Member> = (1..tree.len())
            .map(|i| Member {
                node: i as u32,
                parent: tree.parent(i).unwrap_or(0) as u32,
                name: format!("n{i}"),
                addr: String::new(),
                uplink_kbps: 0,
            })
            .collect();
        super::super::subtree(&all[root - 1], &all)
    }

    fn children(plan: &[Member], p: u32) -> Vec<u32> {
        plan.iter()
            .filter(|m| m.parent == p)
            .map(|m| m.node)
            .collect()
    }

    #[test]
    fn a_chain_stays_a_chain() {
        let members = members_of(&Tree::kary(6, 1), 2);
        let all = (3..=6).collect();
        let plan = replan_orphans(&members, &all, 1);
        let edges: Vec<(u32, u32)> = plan.iter().map(|m| (m.parent, m.node)).collect();
        assert_eq!(edges, [(1, 3), (3, 4), (4, 5), (5, 6)]);
    }

    #[test]
    fn the_adopter_takes_one_orphan_and_nobody_exceeds_the_fan_out() {
        // kary(16, 2): node 2's subtree is 2, 5, 6, 11, 12, 13, 14.
        let members = members_of(&Tree::kary(16, 2), 2);
        let all: BTreeSet<NodeId> = (1..=16).collect();
        let plan = replan_orphans(&members, &all, 0);
        assert_eq!(plan[0].node, 5);
        assert_eq!(children(&plan, 0), [5]);
        let mut nodes: Vec<u32> = plan.iter().map(|m| m.node).collect();
        nodes.sort();
        assert_eq!(nodes, [5, 6, 11, 12, 13, 14]);
        for m in &plan {
            assert!(children(&plan, m.node).len() <= 2, "{plan:?}");
        }
        // Edges among orphans stay; node 6 brings its children along, below the shallowest
        // free slot (11, the first leaf one hop below 5).
        assert_eq!(children(&plan, 5), [11, 12]);
        assert_eq!(children(&plan, 6), [13, 14]);
        assert_eq!(children(&plan, 11), [6]);
    }

    #[test]
    fn finished_parts_are_left_out_and_a_larger_uplink_wins_a_tie() {
        let mut members = members_of(&Tree::kary(16, 2), 2);
        for m in members.iter_mut() {
            if m.node == 12 {
                m.uplink_kbps = 1_000_000;
            }
        }
        // 5's subtree (5, 11, 12) still needs data; of 6's, only 14.
        let unresolved: BTreeSet<NodeId> = [5, 11, 12, 14].into_iter().collect();
        let plan = replan_orphans(&members, &unresolved, 0);
        let edges: Vec<(u32, u32)> = plan.iter().map(|m| (m.parent, m.node)).collect();
        // 6 has finished but relays to 14; it hangs below 12 (same depth as 11, faster uplink).
        assert_eq!(edges, [(0, 5), (5, 11), (5, 12), (12, 6), (6, 14)]);
        let none = replan_orphans(&members, &BTreeSet::new(), 0);
        assert!(none.is_empty());
    }
}
