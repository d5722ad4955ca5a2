//! A set of disjoint half-open `u64` ranges: which stream bytes are acknowledged, lost, held.

use std::collections::BTreeMap;
use std::ops::Range;

/// Disjoint, non-adjacent half-open ranges, kept merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end; no two ranges touch.
    map: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// Adds `r`, merging with what it touches.
    pub fn insert(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        // A range starting at or before `start` that reaches it.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        // Ranges starting inside [start, end].
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    /// Removes `r` from the set.
    pub fn remove(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        if let Some((&s, &e)) = self.map.range(..r.start).next_back() {
            if e > r.start {
                self.map.insert(s, r.start);
                if e > r.end {
                    self.map.insert(r.end, e);
                    return;
                }
            }
        }
        while let Some((&s, &e)) = self.map.range(r.start..r.end).next() {
            self.map.remove(&s);
            if e > r.end {
                self.map.insert(r.end, e);
                break;
            }
        }
    }

    /// Whether every byte of `r` is in the set.
    pub fn contains(&self, r: Range<u64>) -> bool {
        r.is_empty()
            || self
                .map
                .range(..=r.start)
                .next_back()
                .is_some_and(|(_, &e)| e >= r.end)
    }

    /// The first range, if any.
    pub fn first(&self) -> Option<Range<u64>> {
        self.map.iter().next().map(|(&s, &e)| s..e)
    }

    /// Removes and returns up to `max` bytes from the start of the first range.
    pub fn pop_front(&mut self, max: u64) -> Option<Range<u64>> {
        let r = self.first()?;
        let end = r.end.min(r.start + max.max(1));
        self.remove(r.start..end);
        Some(r.start..end)
    }

    /// Drops everything below `offset`.
    pub fn remove_below(&mut self, offset: u64) {
        self.remove(0..offset);
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Number of disjoint ranges.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Total bytes covered.
    pub fn bytes(&self) -> u64 {
        self.map.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reference model: a bitmap over 0..200.
    fn model(set: &RangeSet) -> Vec<bool> {
        (0..200u64).map(|i| set.contains(i..i + 1)).collect()
    }

    #[test]
    fn matches_a_bitmap_under_random_inserts_and_removes() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut set = RangeSet::default();
        let mut bits = vec![false; 200];
        for _ in 0..5000 {
            let a = rng.gen_range(0..200u64);
            let b = rng.gen_range(a..=200u64.min(a + 30));
            if rng.gen_bool(0.6) {
                set.insert(a..b);
                bits[a as usize..b as usize].fill(true);
            } else {
                set.remove(a..b);
                bits[a as usize..b as usize].fill(false);
            }
            assert_eq!(model(&set), bits);
            // Kept merged: no two ranges touch.
            let v: Vec<_> = set.map.iter().collect();
            assert!(v.windows(2).all(|w| w[0].1 < w[1].0), "{v:?}");
            assert_eq!(set.bytes(), bits.iter().filter(|b| **b).count() as u64);
        }
    }

    #[test]
    fn pop_front_takes_from_the_lowest_range() {
        let mut s = RangeSet::default();
        s.insert(10..20);
        s.insert(30..31);
        assert_eq!(s.pop_front(4), Some(10..14));
        assert_eq!(s.pop_front(100), Some(14..20));
        assert_eq!(s.pop_front(100), Some(30..31));
        assert_eq!(s.pop_front(100), None);
    }
}
