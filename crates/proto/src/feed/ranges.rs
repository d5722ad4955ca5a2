//! A set of byte ranges: which parts of a product have arrived.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent half-open ranges `start..end`.
#[derive(Debug, Clone, Default)]
pub struct RangeSet {
    r: BTreeMap<u64, u64>,
    total: u64,
}

impl RangeSet {
    /// Adds `start..end`; returns how many bytes were new.
    pub fn insert(&mut self, mut start: u64, mut end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let before = self.total;
        // Merge with a range that starts before and reaches `start`.
        if let Some((&s, &e)) = self.r.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.r.remove(&s);
                self.total -= e - s;
            }
        }
        // Swallow ranges that start inside the new one.
        while let Some((&s, &e)) = self.r.range(start..=end).next() {
            self.r.remove(&s);
            self.total -= e - s;
            end = end.max(e);
        }
        self.r.insert(start, end);
        self.total += end - start;
        self.total - before
    }

    /// Bytes covered.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// True when nothing is covered.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The parts of `a..b` not covered.
    pub fn uncovered(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = a;
        let from = self.r.range(..=a).next_back().map_or(a, |(s, _)| *s);
        for (&s, &e) in self.r.range(from..b) {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
            if at >= b {
                break;
            }
        }
        if at < b {
            out.push((at, b));
        }
        out
    }

    /// The gaps in `0..size`.
    pub fn missing(&self, size: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = 0;
        for (&s, &e) in &self.r {
            if s >= size {
                break;
            }
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < size {
            out.push((at, size));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_and_reports_gaps() {
        let mut r = RangeSet::default();
        assert_eq!(r.insert(10, 20), 10);
        assert_eq!(r.insert(30, 40), 10);
        assert_eq!(r.insert(15, 35), 10);
        assert_eq!(r.missing(50), vec![(0, 10), (40, 50)]);
        assert_eq!(r.missing(25), vec![(0, 10)]);
        assert_eq!(r.missing(12), vec![(0, 10)]);
        assert_eq!(r.uncovered(5, 45), vec![(5, 10), (40, 45)]);
        assert_eq!(r.uncovered(12, 18), vec![]);
        assert_eq!(r.insert(0, 50), 20);
        assert!(r.missing(50).is_empty());
        assert_eq!(r.len(), 50);
    }
}
