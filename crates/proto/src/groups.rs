//! Verified groups: checking a chunk 16 KiB at a time against its BLAKE3 hash, so that a relay
//! can forward the verified start of a chunk before the rest of it has arrived.
//!
//! A chunk's hash is the root of BLAKE3's own tree over its bytes. The chaining values of that
//! tree's 16 KiB subtrees ("groups") are a short list (2 KiB for a 1 MiB chunk) that the source
//! computes with the hash. A receiver that holds the authenticated hash checks the list against
//! it once ([`Groups::new`]), then each group on its own as it arrives ([`Groups::check`]):
//! nothing unverified is ever passed on, and a corrupt group is caught at the first hop that
//! receives it. This is BLAKE3's verified streaming (the `bao` design, as iroh-blobs uses it
//! through `bao-tree`) with the simplest outboard: every group's chaining value up front, no
//! interior nodes on the wire.
//!
//! Built on `blake3::hazmat`, the BLAKE3 crate's API for exactly this; the tests check every
//! result against `blake3::hash`.
//!
//! Why: a relay forwards a chunk only when it is whole and verified, so each hop adds the time
//! the chunk takes to arrive. During slow start on a long path that is several round trips for
//! the first chunk (0.7 s per hop at 200 ms in the lab), and on a fast path the chunk's
//! serialization time; groups cut both to a group's.

use blake3::hazmat::{self, ChainingValue, HasherExt, Mode};

/// Bytes per group: a power of two of at least BLAKE3's 1 KiB chunk, so that every group is a
/// whole subtree of the chunk's tree.
pub const GROUP: usize = 16 << 10;

/// Why a chunk's group list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// The list does not have one chaining value per group of the chunk's length.
    #[error("{got} group hashes for a chunk of {len} bytes, which has {want}")]
    Count {
        /// Chunk length in bytes.
        len: usize,
        /// Groups that length has.
        want: usize,
        /// Chaining values given.
        got: usize,
    },
    /// The list does not hash to the chunk's hash: it was corrupted or forged.
    #[error("the group hashes do not match the chunk's hash")]
    Mismatch,
}

/// Groups in a chunk of `len` bytes (at least one: an empty chunk is one empty group).
pub fn count(len: usize) -> usize {
    len.div_ceil(GROUP).max(1)
}

/// The chaining value of every group of `data`, a whole chunk (what the source sends with the
/// chunk's hash). A chunk of one group has no interior tree: its list is empty, and the chunk is
/// checked whole against its hash.
pub fn chaining_values(data: &[u8]) -> Vec<ChainingValue> {
    if data.len() <= GROUP {
        return Vec::new();
    }
    data.chunks(GROUP)
        .enumerate()
        .map(|(i, g)| group_cv(i, g))
        .collect()
}

/// The BLAKE3 hash of `data`, a whole chunk, and its groups' chaining values, from one pass
/// over the bytes: the hash is the root of the same tree.
pub fn hash_with_cvs(data: &[u8]) -> ([u8; 32], Vec<ChainingValue>) {
    let cvs = chaining_values(data);
    if cvs.is_empty() {
        return (*blake3::hash(data).as_bytes(), cvs);
    }
    (root(&cvs, data.len() as u64), cvs)
}

/// The root hash of a chunk of `len` bytes (more than one group) from its groups' values.
fn root(cvs: &[ChainingValue], len: u64) -> [u8; 32] {
    let left = hazmat::left_subtree_len(len);
    let split = (left / GROUP as u64) as usize;
    *hazmat::merge_subtrees_root(
        &subtree(&cvs[..split], left),
        &subtree(&cvs[split..], len - left),
        Mode::Hash,
    )
    .as_bytes()
}

fn group_cv(i: usize, group: &[u8]) -> ChainingValue {
    let mut h = blake3::Hasher::new();
    h.set_input_offset((i * GROUP) as u64);
    h.update(group);
    h.finalize_non_root()
}

/// The chaining value of the subtree over groups `cvs` (whose bytes span `len`), BLAKE3's
/// shape: the left subtree holds the largest power-of-two number of 1 KiB chunks that leaves
/// something on the right.
fn subtree(cvs: &[ChainingValue], len: u64) -> ChainingValue {
    if cvs.len() == 1 {
        return cvs[0];
    }
    let left = hazmat::left_subtree_len(len);
    let split = (left / GROUP as u64) as usize;
    hazmat::merge_subtrees_non_root(
        &subtree(&cvs[..split], left),
        &subtree(&cvs[split..], len - left),
        Mode::Hash,
    )
}

/// A chunk's groups, their list checked against the chunk's hash.
#[derive(Debug, Clone)]
pub struct Groups {
    len: usize,
    cvs: Vec<ChainingValue>,
    hash: [u8; 32],
}

impl Groups {
    /// Checks `cvs` (from [`chaining_values`]) against `hash`, the chunk's authenticated BLAKE3
    /// hash, for a chunk of `len` bytes.
    pub fn new(hash: [u8; 32], len: usize, cvs: Vec<ChainingValue>) -> Result<Groups, GroupError> {
        let want = if len <= GROUP { 0 } else { count(len) };
        if cvs.len() != want {
            return Err(GroupError::Count {
                len,
                want,
                got: cvs.len(),
            });
        }
        if want > 0 && root(&cvs, len as u64) != hash {
            return Err(GroupError::Mismatch);
        }
        Ok(Groups { len, cvs, hash })
    }

    /// Groups in the chunk.
    pub fn count(&self) -> usize {
        count(self.len)
    }

    /// Byte range of group `i` within the chunk.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = (i * GROUP).min(self.len);
        start..(start + GROUP).min(self.len)
    }

    /// Whether `bytes` are group `i` of the chunk. A chunk of one group is checked whole
    /// against its hash.
    pub fn check(&self, i: usize, bytes: &[u8]) -> bool {
        if bytes.len() != self.range(i).len() {
            return false;
        }
        match self.cvs.get(i) {
            Some(cv) => group_cv(i, bytes) == *cv,
            None => self.cvs.is_empty() && i == 0 && blake3::hash(bytes).as_bytes() == &self.hash,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        blake3::Hasher::new()
            .update(&len.to_le_bytes())
            .finalize_xof()
            .fill(&mut v);
        v
    }

    #[test]
    fn every_group_of_every_length_verifies_against_the_plain_hash() {
        // Powers of two, one byte either side, and odd lengths spanning 1..70 groups.
        let mut lens = vec![0, 1, 1023, 1024, GROUP - 1, GROUP, GROUP + 1, 3 * GROUP + 7];
        for k in 15..=20 {
            lens.extend([(1 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        lens.push(70 * GROUP - 3);
        for len in lens {
            let d = data(len);
            let hash = *blake3::hash(&d).as_bytes();
            assert_eq!(hash_with_cvs(&d), (hash, chaining_values(&d)), "len {len}");
            let g = Groups::new(hash, len, chaining_values(&d))
                .unwrap_or_else(|e| panic!("len {len}: {e}"));
            for i in 0..g.count() {
                assert!(g.check(i, &d[g.range(i)]), "len {len} group {i}");
            }
        }
    }

    #[test]
    fn a_corrupt_group_or_list_is_caught() {
        let len = 5 * GROUP + 100;
        let d = data(len);
        let hash = *blake3::hash(&d).as_bytes();
        let cvs = chaining_values(&d);
        let g = Groups::new(hash, len, cvs.clone()).unwrap();
        // One flipped bit in group 2 fails group 2 only.
        let mut bad = d.clone();
        bad[2 * GROUP + 17] ^= 1;
        for i in 0..g.count() {
            assert_eq!(g.check(i, &bad[g.range(i)]), i != 2, "group {i}");
        }
        // A group checked at the wrong place, or cut short, fails.
        assert!(!g.check(1, &d[g.range(0)]));
        assert!(!g.check(5, &d[g.range(5)][..50]));
        // A forged list, or one for another length, is refused before any group is checked.
        let mut forged = cvs.clone();
        forged[3][0] ^= 1;
        assert_eq!(
            Groups::new(hash, len, forged).unwrap_err(),
            GroupError::Mismatch
        );
        assert!(matches!(
            Groups::new(hash, len, cvs[..5].to_vec()),
            Err(GroupError::Count {
                want: 6,
                got: 5,
                ..
            })
        ));
        // A chunk of one group has no list and is checked whole.
        let small = data(GROUP);
        let g = Groups::new(*blake3::hash(&small).as_bytes(), GROUP, Vec::new()).unwrap();
        assert!(g.check(0, &small));
        assert!(!g.check(0, &small[1..]));
    }
}
