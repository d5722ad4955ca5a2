//! Balanced multi-trees: one object's chunks dealt to several trees in a fixed pattern.
//!
//! Each tree carries a *stripe*: the chunks whose position in a repeating pattern names that
//! tree. A stripe is sent as a session of its own (its own source node, relays and acks), so
//! the push machinery is unchanged; receivers write every stripe's chunks into one local copy at
//! their global offsets. The pattern gives each tree a share of the chunks proportional to its
//! planned rate (smooth weighted round robin, so shares stay even at every scale), and the
//! source deals chunks in pattern order with a small queue per tree: a tree that falls behind
//! its share holds the dealer back, which keeps every tree at its planned share of the rate.

use crate::chunkmap::ChunkMap;
use crate::manifest::{chunk_count, Manifest, ObjectKind};

/// Longest pattern (shares are rounded to 1/64).
pub const MAX_PATTERN: usize = 64;

/// The dealing pattern: `pattern[p]` is the tree of every chunk `g` with `g % len == p`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripes {
    pattern: Vec<u16>,
}

/// Why a pattern is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StripeError {
    /// Empty, too long, or a tree without a single position.
    #[error("invalid stripe pattern: {0}")]
    Pattern(&'static str),
    /// No rates, or a rate that is not positive and finite.
    #[error("tree rates must be positive")]
    Rates,
}

impl Stripes {
    /// A pattern whose shares follow `rates` (one entry per tree), rounded to 1/64, every tree
    /// getting at least one position.
    pub fn from_rates(rates: &[f64]) -> Result<Stripes, StripeError> {
        if rates.is_empty()
            || rates.len() > MAX_PATTERN
            || rates.iter().any(|r| !(r.is_finite() && *r > 0.0))
        {
            return Err(StripeError::Rates);
        }
        let total: f64 = rates.iter().sum();
        let mut weights: Vec<i64> = rates
            .iter()
            .map(|r| ((r / total * MAX_PATTERN as f64).round() as i64).max(1))
            .collect();
        // Rounding up the small shares may overflow the pattern: take it from the largest.
        while weights.iter().sum::<i64>() > MAX_PATTERN as i64 {
            let i = (0..weights.len())
                .max_by_key(|&i| weights[i])
                .expect("non-empty");
            weights[i] -= 1;
        }
        let sum: i64 = weights.iter().sum();
        // Smooth weighted round robin: the shares are spread evenly through the pattern.
        let mut current = vec![0i64; weights.len()];
        let mut pattern = Vec::with_capacity(sum as usize);
        for _ in 0..sum {
            for (c, w) in current.iter_mut().zip(&weights) {
                *c += w;
            }
            let (best, _) = current
                .iter()
                .enumerate()
                .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))
                .expect("at least one tree");
            current[best] -= sum;
            pattern.push(best as u16);
        }
        Stripes::from_pattern(pattern)
    }

    /// Checks a pattern received from a peer.
    pub fn from_pattern(pattern: Vec<u16>) -> Result<Stripes, StripeError> {
        if pattern.is_empty() || pattern.len() > MAX_PATTERN {
            return Err(StripeError::Pattern("empty or longer than 64"));
        }
        let trees = pattern.iter().copied().max().unwrap_or(0) as usize + 1;
        if (0..trees).any(|t| !pattern.contains(&(t as u16))) {
            return Err(StripeError::Pattern("a tree has no position"));
        }
        Ok(Stripes { pattern })
    }

    /// The pattern.
    pub fn pattern(&self) -> &[u16] {
        &self.pattern
    }

    /// Number of trees.
    pub fn trees(&self) -> usize {
        self.pattern.iter().copied().max().unwrap_or(0) as usize + 1
    }

    /// The tree of global chunk `g`.
    pub fn tree_of(&self, g: u64) -> u16 {
        self.pattern[(g % self.pattern.len() as u64) as usize]
    }

    /// The position of global chunk `g` within its tree's stripe.
    pub fn local_of(&self, g: u64) -> u64 {
        let len = self.pattern.len() as u64;
        let t = self.tree_of(g);
        let per_round = self.share(t) as u64;
        let before = self.pattern[..(g % len) as usize]
            .iter()
            .filter(|&&x| x == t)
            .count() as u64;
        (g / len) * per_round + before
    }

    /// The global index of the `j`-th chunk of tree `t`.
    pub fn global(&self, t: u16, j: u64) -> u64 {
        let per_round = self.share(t) as u64;
        let (round, k) = (j / per_round, j % per_round);
        let pos = self
            .pattern
            .iter()
            .enumerate()
            .filter(|(_, &x)| x == t)
            .nth(k as usize)
            .map(|(p, _)| p)
            .expect("k < share");
        round * self.pattern.len() as u64 + pos as u64
    }

    /// How many of an object's `chunks` tree `t` carries.
    pub fn count(&self, t: u16, chunks: u64) -> u64 {
        let len = self.pattern.len() as u64;
        let full = (chunks / len) * self.share(t) as u64;
        let rest = self.pattern[..(chunks % len) as usize]
            .iter()
            .filter(|&&x| x == t)
            .count() as u64;
        full + rest
    }

    /// The manifest tree `t`'s session carries: a file of that stripe's length (the last chunk
    /// of the object may be short, and belongs to one stripe).
    pub fn stripe_manifest(&self, t: u16, object: &Manifest, chunk_size: u32) -> Option<Manifest> {
        let total = object.total_len?;
        let chunks = chunk_count(total, chunk_size);
        let n = self.count(t, chunks);
        let cs = chunk_size as u64;
        let mut len = n * cs;
        if chunks > 0 && self.tree_of(chunks - 1) == t {
            len -= chunks * cs - total;
        }
        Some(Manifest {
            name: object.name.clone(),
            kind: ObjectKind::File,
            total_len: Some(len),
            entries: Vec::new(),
            mode: 0,
            mtime: None,
        })
    }

    /// What a receiver holds of each tree's stripe (indices local to the stripe) when its copy
    /// of the object holds `held` (global indices): each tree's session resumes from its part.
    pub fn split(&self, held: &ChunkMap) -> Vec<ChunkMap> {
        let mut out = vec![ChunkMap::new(); self.trees()];
        for (s, e) in held.ranges() {
            for g in s..e {
                out[self.tree_of(g) as usize].insert(self.local_of(g));
            }
        }
        out
    }

    fn share(&self, t: u16) -> usize {
        self.pattern.iter().filter(|&&x| x == t).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_rates_and_spread_evenly() {
        let s = Stripes::from_rates(&[300.0, 100.0]).unwrap();
        assert_eq!(s.trees(), 2);
        assert_eq!(s.count(0, 64), 48);
        assert_eq!(s.count(1, 64), 16);
        // Even spread: tree 1 never waits more than 4 positions.
        let ones: Vec<usize> = (0..64)
            .filter(|&g| s.tree_of(g) == 1)
            .map(|g| g as usize)
            .collect();
        assert!(ones.windows(2).all(|w| w[1] - w[0] <= 4), "{ones:?}");
        // A tiny tree still gets a position.
        let s = Stripes::from_rates(&[1000.0, 1.0]).unwrap();
        assert_eq!(s.count(1, 64), 1);
        assert!(Stripes::from_rates(&[]).is_err());
        assert!(Stripes::from_rates(&[1.0, 0.0]).is_err());
        assert!(Stripes::from_pattern(vec![0, 2]).is_err());
    }

    #[test]
    fn global_and_local_indices_are_a_bijection() {
        for rates in [
            &[1.0][..],
            &[2.0, 1.0],
            &[5.0, 3.0, 1.0],
            &[1.0, 1.0, 1.0, 1.0],
        ] {
            let s = Stripes::from_rates(rates).unwrap();
            let chunks = 1000u64;
            let mut seen = vec![false; chunks as usize];
            for t in 0..s.trees() as u16 {
                for j in 0..s.count(t, chunks) {
                    let g = s.global(t, j);
                    assert!(g < chunks && !seen[g as usize]);
                    seen[g as usize] = true;
                    assert_eq!(s.tree_of(g), t);
                    assert_eq!(s.local_of(g), j);
                }
            }
            assert!(seen.iter().all(|&x| x), "{rates:?}");
        }
    }

    #[test]
    fn what_a_copy_holds_splits_into_each_stripe_and_back() {
        let s = Stripes::from_rates(&[3.0, 2.0, 1.0]).unwrap();
        let chunks = 500u64;
        let held = ChunkMap::from_ranges(&[(0, 7), (64, 130), (333, 334), (490, 500)], chunks);
        let parts = s.split(&held);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts.iter().map(ChunkMap::len).sum::<u64>(), held.len());
        for (t, part) in parts.iter().enumerate() {
            for j in 0..s.count(t as u16, chunks) {
                assert_eq!(part.contains(j), held.contains(s.global(t as u16, j)));
            }
        }
        assert!(s.split(&ChunkMap::new()).iter().all(ChunkMap::is_empty));
    }

    #[test]
    fn stripe_lengths_add_up_to_the_object() {
        let s = Stripes::from_rates(&[3.0, 2.0, 1.0]).unwrap();
        for total in [0u64, 1, 4096, 4097, 1 << 20, (1 << 20) + 123] {
            let m = Manifest {
                name: "x".into(),
                kind: ObjectKind::File,
                total_len: Some(total),
                entries: vec![],
                mode: 0,
                mtime: None,
            };
            let sum: u64 = (0..3)
                .map(|t| s.stripe_manifest(t, &m, 4096).unwrap().total_len.unwrap())
                .sum();
            assert_eq!(sum, total);
        }
    }
}
