//! A fixed-size bitset over piece indices with word-level access, for the masks piece
//! selection combines (what a peer has, what this node lacks, what is pending, what a
//! strategy allows from that peer) a word at a time.

use rand::Rng;

/// A fixed-size bitset over `0..len`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Bits {
    w: Vec<u64>,
    len: u64,
}

impl Bits {
    /// All clear.
    pub(crate) fn new(len: u64) -> Self {
        Self {
            w: vec![0; len.div_ceil(64) as usize],
            len,
        }
    }

    /// All set.
    pub(crate) fn full(len: u64) -> Self {
        let mut b = Self::new(len);
        for i in 0..b.w.len() {
            b.w[i] = range_word(i, 0, len);
        }
        b
    }

    pub(crate) fn words(&self) -> usize {
        self.w.len()
    }

    pub(crate) fn word(&self, i: usize) -> u64 {
        self.w.get(i).copied().unwrap_or(0)
    }

    pub(crate) fn or_word(&mut self, i: usize, v: u64) {
        if let Some(w) = self.w.get_mut(i) {
            *w |= v & range_word(i, 0, self.len);
        }
    }

    /// Sets bit `i`; returns false if it was set or is out of range.
    pub(crate) fn set(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        let was = self.w[w] & (1 << b) != 0;
        self.w[w] |= 1 << b;
        !was
    }

    pub(crate) fn clear(&mut self, i: u64) {
        if i < self.len {
            self.w[(i / 64) as usize] &= !(1 << (i % 64));
        }
    }

    pub(crate) fn get(&self, i: u64) -> bool {
        i < self.len && word_bit(&self.w, i)
    }

    pub(crate) fn count(&self) -> u64 {
        self.w.iter().map(|w| w.count_ones() as u64).sum()
    }

    /// Set bits in increasing order.
    pub(crate) fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        ones_of(self.w.len(), |k| self.w[k])
    }
}

/// The set bits of the mask `f(word)` over `words` words, in increasing order.
pub(crate) fn ones_of(words: usize, f: impl Fn(usize) -> u64) -> impl Iterator<Item = u64> {
    (0..words).flat_map(move |k| {
        let mut w = f(k);
        std::iter::from_fn(move || {
            if w == 0 {
                return None;
            }
            let b = w.trailing_zeros() as u64;
            w &= w - 1;
            Some(k as u64 * 64 + b)
        })
    })
}

/// Whether bit i is set in `words` (64 bits a word, lowest first); i must be in range.
pub(crate) fn word_bit(words: &[u64], i: u64) -> bool {
    words[(i / 64) as usize] & (1 << (i % 64)) != 0
}

/// The bits of word `k` that fall in `lo..hi`.
pub(crate) fn range_word(k: usize, lo: u64, hi: u64) -> u64 {
    let start = k as u64 * 64;
    let end = start + 64;
    let lo = lo.max(start);
    let hi = hi.min(end);
    if lo >= hi {
        return 0;
    }
    let n = hi - lo;
    let ones = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    ones << (lo - start)
}

/// A random set bit of the mask `f(word)` over `words` words: a random word is the start of a
/// wrapping scan and a random bit of the first non-empty word is taken (close to uniform when
/// the candidates are spread, and never more than one pass).
pub(crate) fn pick_random<R: Rng>(
    words: usize,
    rng: &mut R,
    f: impl Fn(usize) -> u64,
) -> Option<u64> {
    if words == 0 {
        return None;
    }
    let start = rng.gen_range(0..words);
    for k in 0..words {
        let w = (start + k) % words;
        let m = f(w);
        if m != 0 {
            let n = m.count_ones();
            let mut pick = rng.gen_range(0..n);
            let mut m = m;
            loop {
                let b = m.trailing_zeros();
                if pick == 0 {
                    return Some(w as u64 * 64 + b as u64);
                }
                pick -= 1;
                m &= m - 1;
            }
        }
    }
    None
}

/// The lowest set bit of the mask `f(word)`.
pub(crate) fn pick_lowest(words: usize, f: impl Fn(usize) -> u64) -> Option<u64> {
    (0..words).find_map(|w| {
        let m = f(w);
        (m != 0).then(|| w as u64 * 64 + m.trailing_zeros() as u64)
    })
}

/// The highest set bit of the mask `f(word)`.
pub(crate) fn pick_highest(words: usize, f: impl Fn(usize) -> u64) -> Option<u64> {
    (0..words).rev().find_map(|w| {
        let m = f(w);
        (m != 0).then(|| w as u64 * 64 + 63 - m.leading_zeros() as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn masks_and_picks() {
        let mut b = Bits::new(130);
        assert!(b.set(0) && b.set(129) && !b.set(129) && !b.set(130));
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 129]);
        assert_eq!(Bits::full(130).count(), 130);
        assert_eq!(range_word(0, 3, 5), 0b11000);
        assert_eq!(range_word(1, 0, 200), u64::MAX);
        assert_eq!(range_word(2, 0, 130), 0b11);
        assert_eq!(pick_lowest(b.words(), |k| b.word(k)), Some(0));
        assert_eq!(pick_highest(b.words(), |k| b.word(k)), Some(129));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        for _ in 0..50 {
            let p = pick_random(b.words(), &mut rng, |k| b.word(k)).unwrap();
            assert!(p == 0 || p == 129);
        }
        b.clear(0);
        b.clear(129);
        assert_eq!(pick_random(b.words(), &mut rng, |k| b.word(k)), None);
    }
}
