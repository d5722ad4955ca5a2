//! MOB's cluster arithmetic (section 3.1 of the MOB paper): cluster ranks, mob shares and the
//! rank-matched global peer candidates, over the live members of a session.
//!
//! - A cluster's size `s(x)` counts its live members; a node's rank `r(x, n)` is its position
//!   among them in node-id order.
//! - Node n's *mob share* is `floor(r * P / s) <= i < floor((r + 1) * P / s)`: the pieces it
//!   alone in its cluster steals from other clusters ([`ShareLayout::Blocks`]). The hybrid
//!   deals pieces lowest first, so with blocks one member at a time would pull its cluster's
//!   WAN pieces; it takes every `s`-th piece instead ([`ShareLayout::Interleaved`]).
//! - Node n's *global peer candidates* are, for every other cluster y, the member of rank
//!   `r(x, n) mod s(y)`.
//!
//! When a member is lost, ranks and shares are recomputed over the survivors, so the lost
//! node's share is taken over by its cluster (the paper assumes no failures).

use std::ops::Range;

use crate::tree::NodeId;

/// How a cluster's pieces are split among its members' mob shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareLayout {
    /// The paper's: member of rank r takes the r-th of s contiguous ranges.
    Blocks,
    /// Member of rank r takes the pieces i with `i mod s = r`. Where pieces become available
    /// lowest first (the hybrid's deal), every member then has share pieces to pull all the
    /// time: with blocks a single member did, over one connection per WAN link, and at each
    /// hand-over to the next member its idle connections started again from a small window
    /// (lab, fast links at 100 ms: the links into the bound's cluster at 0.85-0.89 of their
    /// rate with blocks, 0.96 interleaved).
    Interleaved,
}

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
        let (start, end) = self.share_mask(n, pieces, ShareLayout::Blocks).blocks;
        start..end
    }

    /// Node n's mob share of `pieces` pieces under `layout`, worked out once and read word by
    /// word ([`ShareMask::word`]; empty when n is not live).
    pub fn share_mask(&self, n: NodeId, pieces: u64, layout: ShareLayout) -> ShareMask {
        let (rank, size) = match self.rank(n) {
            Some(r) => (r, self.members(self.cluster(n)).len()),
            None => (0, 0),
        };
        let blocks = mob_share(rank, size, pieces);
        ShareMask {
            layout,
            rank,
            size,
            pieces,
            blocks: (blocks.start, blocks.end),
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

/// A member's mob share as a bit mask, word by word (see [`Mobs::share_mask`]).
#[derive(Debug, Clone, Copy)]
pub struct ShareMask {
    layout: ShareLayout,
    rank: usize,
    /// Live members of the cluster (0: the member is not live, its share is empty).
    size: usize,
    pieces: u64,
    /// The blocks share, `start..end`.
    blocks: (u64, u64),
}

impl ShareMask {
    /// Word `w` (pieces `64 w .. 64 w + 64`) of the share.
    pub fn word(&self, w: usize) -> u64 {
        match self.layout {
            ShareLayout::Blocks => crate::swarm::bits::range_word(w, self.blocks.0, self.blocks.1),
            ShareLayout::Interleaved => interleaved_word(self.rank, self.size, self.pieces, w),
        }
    }
}

/// Word `w` of the interleaved share of the member of rank `rank` among `size`: pieces
/// `i < pieces` with `i mod size = rank`.
fn interleaved_word(rank: usize, size: usize, pieces: u64, w: usize) -> u64 {
    if size == 0 || rank >= size {
        return 0;
    }
    let (size, start) = (size as u64, w as u64 * 64);
    let end = (start + 64).min(pieces);
    let mut i = start + (rank as u64 + size - start % size) % size;
    let mut word = 0;
    while i < end {
        word |= 1 << (i - start);
        i += size;
    }
    word
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

    #[test]
    fn both_layouts_partition_the_pieces_word_by_word() {
        for size in 1..10usize {
            let labels = vec![3u32; size];
            let m = Mobs::new(&labels, &vec![true; size]);
            for pieces in [0u64, 1, 63, 64, 65, 200, 1000] {
                let words = pieces.div_ceil(64) as usize;
                for layout in [ShareLayout::Blocks, ShareLayout::Interleaved] {
                    for w in 0..words {
                        let all: Vec<u64> = (0..size)
                            .map(|n| m.share_mask(n, pieces, layout).word(w))
                            .collect();
                        // Disjoint, and together exactly the word's pieces.
                        let union = all.iter().fold(0u64, |a, b| {
                            assert_eq!(a & b, 0, "{layout:?} size {size} word {w}");
                            a | b
                        });
                        let want = crate::swarm::bits::range_word(w, 0, pieces);
                        assert_eq!(union, want, "{layout:?} size {size} pieces {pieces}");
                    }
                }
                // Interleaved: piece i belongs to rank i mod size.
                for i in 0..pieces {
                    let n = (i % size as u64) as usize;
                    let mask = m.share_mask(n, pieces, ShareLayout::Interleaved);
                    let word = mask.word((i / 64) as usize);
                    assert_ne!(word & (1 << (i % 64)), 0, "piece {i} size {size}");
                }
            }
        }
        // A member that is not live has no share.
        let m = Mobs::new(&[1, 1, 1], &[true, false, true]);
        assert_eq!(m.share_mask(1, 100, ShareLayout::Interleaved).word(0), 0);
        assert_eq!(
            m.share_mask(2, 100, ShareLayout::Interleaved).word(0) & 0b111,
            0b010
        );
    }
}
