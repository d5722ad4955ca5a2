//! A node's view of the tree: its children's subtrees, from the members an `Open` lists.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use super::{Child, Link, NodeError, CHUNK_SIZE_RANGE};
use crate::tree::NodeId;
use crate::wire::Member;

pub(super) fn check_chunk_size(cs: u32) -> Result<(), NodeError> {
    if CHUNK_SIZE_RANGE.contains(&cs) {
        Ok(())
    } else {
        Err(NodeError::BadOpen(format!(
            "chunk size {cs} outside {CHUNK_SIZE_RANGE:?}"
        )))
    }
}

pub(super) fn check_below(child: &Child, node: u32, link: Link) -> Result<(), NodeError> {
    if child.members.iter().any(|m| m.node == node) {
        Ok(())
    } else {
        Err(NodeError::NotInSubtree { link, node })
    }
}

/// The children of `me` among `members`, each with its own subtree (child first).
pub(super) fn children_of(me: u32, members: &[Member], now: Instant) -> Vec<Child> {
    members
        .iter()
        .filter(|m| m.parent == me && m.node != me)
        .map(|m| new_child(m, subtree(m, members), now))
        .collect()
}

/// `m` and every node below it among `members`, `m` first.
pub(super) fn subtree(m: &Member, members: &[Member]) -> Vec<Member> {
    let mut sub = vec![m.clone()];
    let mut i = 0;
    while i < sub.len() {
        let p = sub[i].node;
        sub.extend(
            members
                .iter()
                .filter(|x| x.parent == p && x.node != p)
                .cloned(),
        );
        i += 1;
        if sub.len() > members.len() {
            break; // a cycle; rejected by the caller's count check
        }
    }
    sub
}

/// A child link to `m`, whose subtree is `sub`.
/// A receiver as the source names it in [`super::Node::source`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// Display name.
    pub name: String,
    /// Agent address(es), as [`Member::addr`].
    pub addr: String,
    /// Access uplink in kbit/s (0: not known), as [`Member::uplink_kbps`].
    pub uplink_kbps: u32,
}

pub(super) fn new_child(m: &Member, sub: Vec<Member>, now: Instant) -> Child {
    Child {
        node: m.node as NodeId,
        name: m.name.clone(),
        addr: m.addr.clone(),
        unresolved: sub.iter().map(|x| x.node as NodeId).collect(),
        members: sub,
        next: 0,
        acked: 0,
        requests: VecDeque::new(),
        end_sent: false,
        last_progress: now,
        last_heard: now,
        rtt: None,
        sent: false,
        quiet_since: now,
        keepalive_due: false,
        alive: true,
        held: None,
        loads: BTreeSet::new(),
        loaded: BTreeMap::new(),
        cursor: None,
        sent_corrupt: Default::default(),
    }
}
