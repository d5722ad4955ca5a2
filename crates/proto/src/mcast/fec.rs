//! The erasure code: Reed-Solomon over GF(2^16) (`reed-solomon-simd`, O(n log n)); any `k`
//! of a block's `k + m` symbols rebuild its `k` source symbols.

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

/// A coding failure (sizes or counts the code cannot take: a bug or a forged datagram).
#[derive(Debug, thiserror::Error)]
#[error("erasure code: {0}")]
pub struct FecError(String);

fn err(e: reed_solomon_simd::Error) -> FecError {
    FecError(e.to_string())
}

/// The `m` parity symbols of a block whose source symbols are `source` (all `symbol` bytes).
pub fn encode(source: &[&[u8]], m: usize, symbol: usize) -> Result<Vec<Vec<u8>>, FecError> {
    let k = source.len();
    if k == 1 {
        // One source symbol: every parity symbol is a copy (the code needs k >= 1 anyway,
        // but a copy is what it would compute).
        return Ok(vec![source[0].to_vec(); m]);
    }
    let mut enc = ReedSolomonEncoder::new(k, m, symbol).map_err(err)?;
    for s in source {
        enc.add_original_shard(s).map_err(err)?;
    }
    let r = enc.encode().map_err(err)?;
    Ok(r.recovery_iter().map(<[u8]>::to_vec).collect())
}

/// The missing source symbols of a block of `k` from the ones present (`source`, by index)
/// and parity symbols (`parity`, by parity index), at least `k` in all.
pub fn decode(
    k: usize,
    m: usize,
    symbol: usize,
    source: &[(usize, &[u8])],
    parity: &[(usize, &[u8])],
) -> Result<Vec<(usize, Vec<u8>)>, FecError> {
    if k == 1 {
        return match (source.first(), parity.first()) {
            (Some(_), _) => Ok(Vec::new()),
            (None, Some((_, p))) => Ok(vec![(0, p.to_vec())]),
            (None, None) => Err(FecError("no symbol of a one-symbol block".into())),
        };
    }
    let mut dec = ReedSolomonDecoder::new(k, m, symbol).map_err(err)?;
    for (i, s) in source {
        dec.add_original_shard(*i, s).map_err(err)?;
    }
    for (j, p) in parity {
        dec.add_recovery_shard(*j, p).map_err(err)?;
    }
    let r = dec.decode().map_err(err)?;
    Ok(r.restored_original_iter()
        .map(|(i, s)| (i, s.to_vec()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_k_of_k_plus_m_rebuild_the_block() {
        let (k, m, sym) = (8usize, 4usize, 16usize);
        let src: Vec<Vec<u8>> = (0..k)
            .map(|i| (0..sym).map(|j| (i * 31 + j * 7) as u8).collect())
            .collect();
        let refs: Vec<&[u8]> = src.iter().map(Vec::as_slice).collect();
        let par = encode(&refs, m, sym).unwrap();
        assert_eq!(par.len(), m);
        // Lose source 1, 3, 6 and 7; keep parity 0, 2, 3 and one more.
        let have: Vec<(usize, &[u8])> = [0, 2, 4, 5]
            .iter()
            .map(|&i| (i, src[i].as_slice()))
            .collect();
        let p: Vec<(usize, &[u8])> = [0, 1, 2, 3]
            .iter()
            .map(|&j| (j, par[j].as_slice()))
            .collect();
        let mut got = decode(k, m, sym, &have, &p).unwrap();
        got.sort();
        let idx: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(idx, vec![1, 3, 6, 7]);
        for (i, s) in got {
            assert_eq!(s, src[i]);
        }
        // One short: an error, not a wrong block.
        assert!(decode(k, m, sym, &have, &p[..3]).is_err());
    }

    #[test]
    fn one_symbol_blocks_are_copies() {
        let s = vec![5u8; 6];
        let par = encode(&[&s], 3, 6).unwrap();
        assert_eq!(par, vec![s.clone(); 3]);
        assert_eq!(decode(1, 3, 6, &[], &[(2, &par[2])]).unwrap(), vec![(0, s)]);
    }
}
