//! Distribution trees over a session's nodes.
//!
//! Nodes are numbered as the session numbers them: `0` is the source, `1..=n` are the receiving
//! hosts in hosts-file order. Every strategy that pushes along a tree (flat, fixed fan-out, and
//! the planner's trees) hands the session a [`Tree`]; this type is the one seam between "who
//! feeds whom" and "how bytes move".

use serde::{Deserialize, Serialize};

/// Index of a node in a session: 0 is the source, 1..=n the receivers.
pub type NodeId = usize;

/// The source's node id.
pub const SOURCE: NodeId = 0;

/// A spanning tree rooted at the source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tree {
    /// `parent[i]` is node i's parent; `parent[0]` is `None` (the root).
    parent: Vec<Option<NodeId>>,
}

/// Why a parent vector is not a tree rooted at node 0.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TreeError {
    /// The root has a parent, or there are no nodes.
    #[error("node 0 must be the root and have no parent")]
    BadRoot,
    /// A non-root node has no parent.
    #[error("node {0} has no parent")]
    Orphan(NodeId),
    /// A parent index is out of range.
    #[error("node {0} has parent {1}, which does not exist")]
    NoSuchParent(NodeId, NodeId),
    /// Following parents from a node never reaches the root.
    #[error("node {0} is on a cycle")]
    Cycle(NodeId),
}

impl Tree {
    /// Builds a tree from a parent vector, checking that it spans all nodes from the root.
    pub fn from_parents(parent: Vec<Option<NodeId>>) -> Result<Self, TreeError> {
        if parent.first() != Some(&None) {
            return Err(TreeError::BadRoot);
        }
        let n = parent.len();
        for (i, p) in parent.iter().enumerate().skip(1) {
            match *p {
                None => return Err(TreeError::Orphan(i)),
                Some(p) if p >= n => return Err(TreeError::NoSuchParent(i, p)),
                Some(_) => {}
            }
        }
        for start in 1..n {
            let mut at = start;
            for _ in 0..n {
                match parent[at] {
                    None => break,
                    Some(p) => at = p,
                }
            }
            if at != SOURCE {
                return Err(TreeError::Cycle(start));
            }
        }
        Ok(Self { parent })
    }

    /// The source feeds every receiver itself.
    pub fn flat(receivers: usize) -> Self {
        Self::kary(receivers, receivers.max(1))
    }

    /// A complete k-ary tree over the nodes in order (breadth first): node i's parent is
    /// `(i - 1) / k`. `k = 1` is a chain.
    pub fn kary(receivers: usize, k: usize) -> Self {
        let k = k.max(1);
        let parent = (0..=receivers)
            .map(|i| if i == 0 { None } else { Some((i - 1) / k) })
            .collect();
        Self { parent }
    }

    /// Number of nodes, the source included.
    pub fn len(&self) -> usize {
        self.parent.len()
    }

    /// True when the tree has only the source.
    pub fn is_empty(&self) -> bool {
        self.parent.len() <= 1
    }

    /// Node i's parent (`None` for the source).
    pub fn parent(&self, i: NodeId) -> Option<NodeId> {
        self.parent.get(i).copied().flatten()
    }

    /// The parent vector.
    pub fn parents(&self) -> &[Option<NodeId>] {
        &self.parent
    }

    /// Node i's children in increasing order.
    pub fn children(&self, i: NodeId) -> Vec<NodeId> {
        (0..self.parent.len())
            .filter(|&c| self.parent[c] == Some(i))
            .collect()
    }

    /// Node i's depth (the source is at depth 0).
    pub fn depth(&self, i: NodeId) -> usize {
        let mut d = 0;
        let mut at = i;
        while let Some(p) = self.parent(at) {
            d += 1;
            at = p;
        }
        d
    }

    /// All nodes in node i's subtree, i included.
    pub fn subtree(&self, i: NodeId) -> Vec<NodeId> {
        (0..self.parent.len())
            .filter(|&c| {
                let mut at = c;
                loop {
                    if at == i {
                        return true;
                    }
                    match self.parent(at) {
                        Some(p) => at = p,
                        None => return false,
                    }
                }
            })
            .collect()
    }

    /// Largest number of children of any node.
    pub fn max_fanout(&self) -> usize {
        let mut count = vec![0usize; self.parent.len()];
        for p in self.parent.iter().flatten() {
            count[*p] += 1;
        }
        count.into_iter().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kary_shapes() {
        let chain = Tree::kary(4, 1);
        assert_eq!(chain.children(0), vec![1]);
        assert_eq!(chain.depth(4), 4);
        let flat = Tree::flat(5);
        assert_eq!(flat.children(0), vec![1, 2, 3, 4, 5]);
        let bin = Tree::kary(6, 2);
        assert_eq!(bin.children(1), vec![3, 4]);
        assert_eq!(bin.subtree(1), vec![1, 3, 4]);
        assert_eq!(bin.max_fanout(), 2);
        assert!(Tree::from_parents(bin.parents().to_vec()).is_ok());
    }

    #[test]
    fn rejects_non_trees() {
        assert_eq!(Tree::from_parents(vec![Some(0)]), Err(TreeError::BadRoot));
        assert_eq!(
            Tree::from_parents(vec![None, Some(2), Some(1)]),
            Err(TreeError::Cycle(1))
        );
        assert_eq!(
            Tree::from_parents(vec![None, None]),
            Err(TreeError::Orphan(1))
        );
        assert_eq!(
            Tree::from_parents(vec![None, Some(7)]),
            Err(TreeError::NoSuchParent(1, 7))
        );
    }
}
