//! How a file is cut: symbols of `symbol` bytes (the last one zero-padded), blocks of `k`
//! symbols (the last one may have fewer), each with up to `m` parity symbols.
//!
//! A symbol's *index* within its block: `0..k_b` are the file's symbols, `k_b..k_b + m`
//! parity; an index past those names source symbol `(index - k_b - m) % k_b` again, so a
//! receiver that loses more than the code can repair still gets every symbol in the end.

/// The cut of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// File size in bytes.
    pub size: u64,
    /// Bytes per symbol (even: the code works on 16-bit words).
    pub symbol: u32,
    /// Source symbols per block.
    pub k: u32,
    /// Most parity symbols per block.
    pub m: u32,
}

/// Where a symbol index of a block points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Source symbol `i` of the block.
    Source(u32),
    /// Parity symbol `j` of the block.
    Parity(u32),
}

/// Largest block (`k`) and parity count the code supports together.
pub const MAX_SYMBOLS: u32 = 32_768;

impl Layout {
    /// A layout, or why the numbers are unusable.
    pub fn new(size: u64, symbol: u32, k: u32, m: u32) -> Result<Self, &'static str> {
        if symbol == 0 || !symbol.is_multiple_of(2) || symbol > 65_000 {
            return Err("symbol size must be even and between 2 and 65000");
        }
        if k == 0 || m == 0 || k > MAX_SYMBOLS || m > MAX_SYMBOLS {
            return Err("block and parity counts must be between 1 and 32768");
        }
        if !reed_solomon_simd::ReedSolomonEncoder::supports(k as usize, m as usize) {
            return Err("unsupported block / parity counts");
        }
        let l = Self { size, symbol, k, m };
        if l.blocks() > u64::from(u32::MAX) {
            return Err("file too large for this symbol size");
        }
        Ok(l)
    }

    /// Bytes per block (all but maybe the last).
    pub fn block_bytes(&self) -> u64 {
        u64::from(self.symbol) * u64::from(self.k)
    }

    /// Number of blocks (0 for an empty file).
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block_bytes())
    }

    /// The byte range `(offset, len)` of block `b` in the file.
    pub fn block_range(&self, b: u32) -> (u64, u64) {
        let off = u64::from(b) * self.block_bytes();
        (off, self.block_bytes().min(self.size.saturating_sub(off)))
    }

    /// Source symbols in block `b`.
    pub fn k_of(&self, b: u32) -> u32 {
        self.block_range(b).1.div_ceil(u64::from(self.symbol)) as u32
    }

    /// What symbol index `index` of block `b` is.
    pub fn slot(&self, b: u32, index: u32) -> Slot {
        let k = self.k_of(b).max(1);
        if index < k {
            Slot::Source(index)
        } else if index - k < self.m {
            Slot::Parity(index - k)
        } else {
            Slot::Source((index - k - self.m) % k)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_blocks_and_wraps_indexes() {
        let l = Layout::new(10 * 4 + 6, 4, 3, 2).unwrap();
        assert_eq!(l.blocks(), 4);
        assert_eq!(l.block_range(3), (36, 10));
        assert_eq!(l.k_of(3), 3);
        let l = Layout::new(12 * 3 + 1, 4, 3, 2).unwrap();
        assert_eq!(l.blocks(), 4);
        assert_eq!(l.k_of(3), 1);
        assert_eq!(l.slot(0, 2), Slot::Source(2));
        assert_eq!(l.slot(0, 4), Slot::Parity(1));
        assert_eq!(l.slot(0, 5), Slot::Source(0));
        assert_eq!(l.slot(0, 9), Slot::Source(1));
        assert_eq!(l.slot(3, 1), Slot::Parity(0));
        assert_eq!(l.slot(3, 3), Slot::Source(0));
        assert!(Layout::new(1, 3, 3, 2).is_err());
        assert!(Layout::new(1, 4, 0, 2).is_err());
        assert_eq!(Layout::new(0, 4, 3, 2).unwrap().blocks(), 0);
    }
}
