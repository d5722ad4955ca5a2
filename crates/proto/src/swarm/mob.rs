//! MOB's cluster arithmetic (section 3.1 of the MOB paper): cluster ranks, mob shares and the
//! rank-matched global peer candidates, over the live members of a session.
//!
//! - A cluster's size `s(x)` counts its live members; a node's rank `r(x, n)` is its position
//!   among them in node-id order.
//! - Node n's *mob share* is `floor(r * P / s) <= i < floor((r + 1) * P / s)`: the pieces it
//!   alone in its cluster steals from other clusters.
//! - Node n's *global peer candidates* are, for every other cluster y, the member of rank
//!   `r(x, n) mod s(y)`.
//!
//! When a member is lost, ranks and shares are recomputed over the survivors, so the lost
//! node's share is taken over by its cluster (the paper assumes no failures).

use std::ops::Range;

use crate::tree::NodeId;

/// The mob layout of a session: who is in which cluster, ranks and shares.
#[derive(Debug, Clone)]
pub struct Mobs {
    /// Cluster index (0..clusters) of each node.
    cluster: Vec<usize>,
    /// Live members of each cluster in node-id order.
    members: Vec<Vec<NodeId>>,
    /// Rank of each live node in its cluster.
    rank: Vec<Option<usize>>,
}

impl Mobs {
    /// The layout for nodes `0..labels.len()` with cluster labels `labels` (any values; nodes
    /// with equal labels share a cluster) of which those with `alive[i]` take part.
    pub fn new(labels: &[u32], alive: &[bool]) -> Self {
        let mut distinct: Vec<u32> = labels.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let cluster: Vec<usize> = labels
            .iter()
            .map(|l| distinct.binary_search(l).unwrap_or(0))
            .collect();
        let mut members = vec![Vec::new(); distinct.len()];
        let mut rank = vec![None; labels.len()];
        for (n, &c) in cluster.iter().enumerate() {
            if alive.get(n).copied().unwrap_or(false) {
                rank[n] = Some(members[c].len());
                members[c].push(n);
            }
        }
        Self {
            cluster,
            members,
            rank,
        }
    }

    /// Number of clusters.
    pub fn clusters(&self) -> usize {
        self.members.len()
    }

    /// Node n's cluster index.
    pub fn cluster(&self, n: NodeId) -> usize {
        self.cluster.get(n).copied().unwrap_or(0)
    }

    /// Live members of cluster `c`, in rank order.
    pub fn members(&self, c: usize) -> &[NodeId] {
        self.members.get(c).map_or(&[], |v| v.as_slice())
    }

    /// Node n's rank in its cluster (`None` when it is not live).
    pub fn rank(&self, n: NodeId) -> Option<usize> {
        self.rank.get(n).copied().flatten()
    }

    /// Node n's mob share of `pieces` pieces (empty when it is not live).
    pub fn share(&self, n: NodeId, pieces: u64) -> Range<u64> {
        match self.rank(n) {
            Some(r) => mob_share(r, self.members(self.cluster(n)).len(), pieces),
            None => 0..0,
        }
    }

    /// Node n's global peer candidates: per other cluster, the live member of rank
    /// `r(x, n) mod s(y)`.
    pub fn global_candidates(&self, n: NodeId) -> Vec<NodeId> {
        self.rank_matched(n, 1)
    }

    /// Per other cluster y, up to `per_cluster` live members of y, from rank `r(x, n) mod
    /// s(y)` on (wrapping): the rank-matched candidate first, then its successors, so that
    /// the members of x that ask y for their shares spread over y's members.
    pub fn rank_matched(&self, n: NodeId, per_cluster: usize) -> Vec<NodeId> {
        let Some(r) = self.rank(n) else {
            return Vec::new();
        };
        let x = self.cluster(n);
        let mut out = Vec::new();
        for y in (0..self.clusters()).filter(|&y| y != x) {
            let m = &self.members[y];
            out.extend((0..per_cluster.min(m.len())).map(|j| m[(r + j) % m.len()]));
        }
        out
    }
}

/// The mob share of the member of rank `rank` in a cluster of `size` live members:
/// `floor(rank * P / size) .. floor((rank + 1) * P / size)`.
pub fn mob_share(rank: usize, size: usize, pieces: u64) -> Range<u64> {
    if size == 0 || rank >= size {
        return 0..0;
    }
    let at = |r: usize| (r as u128 * pieces as u128 / size as u128) as u64;
    at(rank)..at(rank + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_partition_the_pieces_and_peers_match_ranks() {
        for size in 1..20 {
            let mut next = 0;
            for r in 0..size {
                let s = mob_share(r, size, 1000);
                assert_eq!(s.start, next);
                next = s.end;
            }
            assert_eq!(next, 1000);
        }
        // Clusters of 4, 2 and 3 nodes.
        let labels = [7, 7, 7, 7, 1, 1, 9, 9, 9];
        let mut alive = vec![true; 9];
        let m = Mobs::new(&labels, &alive);
        assert_eq!(m.rank(3), Some(3));
        // 3 mod 2 = 1 in {4,5}; 3 mod 3 = 0 in {6,7,8}.
        assert_eq!(m.global_candidates(3), vec![5, 6]);
        // Two per cluster from the rank-matched one on, wrapping; never more than a cluster has.
        assert_eq!(m.rank_matched(3, 2), vec![5, 4, 6, 7]);
        assert_eq!(m.rank_matched(3, 9), vec![5, 4, 6, 7, 8]);
        assert_eq!(m.share(1, 100), 25..50);
        alive[1] = false;
        let m = Mobs::new(&labels, &alive);
        assert_eq!(m.rank(2), Some(1));
        assert_eq!(m.share(2, 99), 33..66);
        assert_eq!(m.share(1, 99), 0..0);
    }
}
