//! Which chunks a node holds, verified: a growable bitmap with a cached contiguous prefix.
//!
//! Push strategies fill it in order; repair and receiver-driven strategies fill it in any
//! order. The prefix is what a node acknowledges (cumulative acks stay small whatever the
//! order), the bitmap is what it can serve to others.

/// A bitmap over chunk indices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkMap {
    words: Vec<u64>,
    count: u64,
    prefix: u64,
}

impl ChunkMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks chunk `i` held; returns false if it already was.
    pub fn insert(&mut self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        if self.words[w] & (1 << b) != 0 {
            return false;
        }
        self.words[w] |= 1 << b;
        self.count += 1;
        while self.contains(self.prefix) {
            self.prefix += 1;
        }
        true
    }

    /// True when chunk `i` is held.
    pub fn contains(&self, i: u64) -> bool {
        self.words
            .get((i / 64) as usize)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Every chunk below this index is held.
    pub fn prefix(&self) -> u64 {
        self.prefix
    }

    /// Number of chunks held.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Held chunks as half-open ranges `[start, end)`, ascending (what a `Have` frame carries).
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (w, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = w as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                match out.last_mut() {
                    Some(r) if r.1 == i => r.1 += 1,
                    _ => out.push((i, i + 1)),
                }
            }
        }
        out
    }

    /// The map holding exactly the chunks of `ranges` that are below `limit` (a peer's claim is
    /// capped at the object's chunk count, so it cannot make the map grow without bound).
    pub fn from_ranges(ranges: &[(u64, u64)], limit: u64) -> Self {
        let mut m = Self::new();
        for &(s, e) in ranges {
            for i in s..e.min(limit) {
                m.insert(i);
            }
        }
        m
    }

    /// Chunks below `n` that are not held, in order.
    pub fn missing_below(&self, n: u64) -> impl Iterator<Item = u64> + '_ {
        (self.prefix..n).filter(|&i| !self.contains(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip_and_are_capped() {
        let mut m = ChunkMap::new();
        for i in [0, 1, 2, 63, 64, 65, 130, 200] {
            m.insert(i);
        }
        let r = m.ranges();
        assert_eq!(r, vec![(0, 3), (63, 66), (130, 131), (200, 201)]);
        assert_eq!(ChunkMap::from_ranges(&r, u64::MAX), m);
        let capped = ChunkMap::from_ranges(&r, 64);
        assert_eq!(capped.ranges(), vec![(0, 3), (63, 64)]);
    }

    #[test]
    fn prefix_follows_out_of_order_inserts() {
        let mut m = ChunkMap::new();
        assert!(m.insert(2));
        assert!(m.insert(130));
        assert_eq!(m.prefix(), 0);
        assert!(m.insert(0));
        assert_eq!(m.prefix(), 1);
        assert!(m.insert(1));
        assert_eq!(m.prefix(), 3);
        assert!(!m.insert(1));
        assert_eq!(m.len(), 4);
        assert_eq!(m.missing_below(6).collect::<Vec<_>>(), vec![3, 4, 5]);
        assert!(m.contains(130) && !m.contains(129) && !m.contains(100_000));
    }
}
