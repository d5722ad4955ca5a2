//! The source's list of piece hashes, one signature per session for every piece.
//!
//! A swarm member serves pieces to its peers, and with host keys a receiver may take only what
//! the source made. Signing each piece for the session would leave a member that resumed
//! unable to serve (or keep) what an earlier session left it: it cannot sign. So the source
//! hashes the object before the session (it must anyway: any piece may be asked for at any
//! time), sends every member the list of piece hashes after the set-up, and signs the list's
//! root with the set-up ([`crate::auth::Keys::sign_swarm_open`]). A member checks the list
//! against the signed root once, and then every piece against the list
//! ([`crate::auth::Keys::verify_listed`]): a kept piece needs no signature of its own, and a
//! relaying member still cannot forge one (its bytes would not hash to the listed hash).

use std::sync::Arc;

use crate::auth::{ChunkError, Keys};
use crate::wire::{Chunk, SessionId};

/// The BLAKE3 hash of every piece of an object, in order (cheap to clone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PieceHashes(Arc<[[u8; 32]]>);

impl PieceHashes {
    /// The list, piece 0 first.
    pub fn new(hashes: Vec<[u8; 32]>) -> Self {
        Self(hashes.into())
    }

    /// Number of pieces listed.
    pub fn len(&self) -> u64 {
        self.0.len() as u64
    }

    /// Whether the list is empty (an empty object).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Piece `i`'s hash.
    pub fn get(&self, i: u64) -> Option<&[u8; 32]> {
        self.0.get(usize::try_from(i).ok()?)
    }

    /// Every hash, in order.
    pub fn as_slice(&self) -> &[[u8; 32]] {
        &self.0
    }

    /// What the source signs for the whole list: a BLAKE3 digest of its length and every hash.
    pub fn root(&self) -> [u8; 32] {
        let mut h = blake3::Hasher::new_derive_key("bulkcast 2026-11 swarm piece hashes v1");
        h.update(&self.len().to_be_bytes());
        for x in self.0.iter() {
            h.update(x);
        }
        *h.finalize().as_bytes()
    }

    /// Checks chunk `c` of `session` against the list, then its tag and bytes.
    pub fn verify(&self, keys: &Keys, session: SessionId, c: &Chunk) -> Result<(), ChunkError> {
        let listed = self.get(c.index).ok_or(ChunkError::NotListed(c.index))?;
        keys.verify_listed(session, c, listed)
    }
}

impl super::SwarmNode {
    /// Checks every piece from now on against the source's list (whose root the driver checked
    /// against the signed set-up) instead of a per-piece signature.
    pub fn set_piece_hashes(&mut self, hashes: PieceHashes) {
        self.hashes = Some(hashes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;
    use crate::identity::{AllowList, HostKey, Identity, Role};
    use bytes::Bytes;

    /// With host keys a member re-seals a kept piece with its own (relay) key or none: taken,
    /// as long as the bytes are the listed ones; its forgery is not, however sealed.
    #[test]
    fn a_listed_piece_is_taken_from_anyone_and_a_forged_one_from_no_one() {
        let (source, relay) = (HostKey::from_seed([1; 32]), HostKey::from_seed([2; 32]));
        let allow =
            AllowList::with_roles([(source.public(), Role::Push), (relay.public(), Role::Relay)]);
        let with = |k: &HostKey| {
            Keys::derive(&Secret::from_bytes([3; 32])).with_identity(Identity {
                key: k.clone(),
                allow: allow.clone(),
            })
        };
        let receiver = with(&HostKey::from_seed([4; 32])).requiring_source();
        let data = [
            Bytes::from_static(b"piece zero"),
            Bytes::from_static(b"one"),
        ];
        let list = PieceHashes::new(data.iter().map(|d| *blake3::hash(d).as_bytes()).collect());
        // Sealed by the relay for this session (a kept piece): its own signature, no matter.
        let kept = with(&relay).seal(7, 1, data[1].clone());
        assert_eq!(list.verify(&receiver, 7, &kept), Ok(()));
        assert!(receiver.verify(7, &kept).is_err(), "not without the list");
        let bare = with(&relay).seal_listed(7, 0, data[0].clone(), list.as_slice()[0]);
        assert_eq!(list.verify(&receiver, 7, &bare), Ok(()));
        // The relay's forgery: hash, tag and signature redone, not the listed hash.
        let forged = with(&relay).seal(7, 1, Bytes::from_static(b"forged"));
        assert_eq!(
            list.verify(&receiver, 7, &forged),
            Err(ChunkError::NotListed(1))
        );
        // The listed hash claimed over other bytes.
        let mut swapped = kept.clone();
        swapped.data = Bytes::from_static(b"two");
        assert_eq!(
            list.verify(&receiver, 7, &swapped),
            Err(ChunkError::HashMismatch(1))
        );
        // Another session's tag, and a piece beyond the list.
        assert_eq!(list.verify(&receiver, 8, &kept), Err(ChunkError::BadTag(1)));
        let beyond = with(&relay).seal(7, 2, data[1].clone());
        assert_eq!(
            list.verify(&receiver, 7, &beyond),
            Err(ChunkError::NotListed(2))
        );
        // The root covers every hash and the count.
        let mut other = list.as_slice().to_vec();
        other[1][0] ^= 1;
        assert_ne!(PieceHashes::new(other).root(), list.root());
        assert_ne!(
            PieceHashes::new(list.as_slice()[..1].to_vec()).root(),
            list.root()
        );
    }

    /// The root is signed with the set-up: another root, or a relay's signature, is refused.
    #[test]
    fn the_root_is_signed_with_the_swarm_set_up() {
        use crate::manifest::{Manifest, ObjectKind};
        use crate::wire::{Strategy, SwarmOpen};
        let (source, relay) = (HostKey::from_seed([1; 32]), HostKey::from_seed([2; 32]));
        let allow =
            AllowList::with_roles([(source.public(), Role::Push), (relay.public(), Role::Relay)]);
        let with = |k: &HostKey| {
            Keys::derive(&Secret::from_bytes([3; 32])).with_identity(Identity {
                key: k.clone(),
                allow: allow.clone(),
            })
        };
        let receiver = with(&HostKey::from_seed([4; 32])).requiring_source();
        let manifest = Manifest {
            name: "w.bin".into(),
            kind: ObjectKind::File,
            total_len: Some(100),
            entries: vec![],
            mode: 0o644,
            mtime: None,
        };
        let root = PieceHashes::new(vec![[5; 32]]).root();
        let open = |root: [u8; 32], sig| SwarmOpen {
            session: 7,
            node: 1,
            chunk_size: 1 << 16,
            stall_timeout_ms: 1000,
            strategy: Strategy::Mob,
            seed: 1,
            manifest: manifest.clone(),
            members: vec![],
            pieces_root: root,
            sig,
        };
        let sig = with(&source).sign_swarm_open(7, 1 << 16, &manifest, &root);
        assert_eq!(
            receiver.verify_swarm_open(&open(root, sig.clone())),
            Ok(Some(source.public()))
        );
        assert!(receiver.verify_swarm_open(&open([6; 32], sig)).is_err());
        let by_relay = with(&relay).sign_swarm_open(7, 1 << 16, &manifest, &root);
        assert!(receiver.verify_swarm_open(&open(root, by_relay)).is_err());
        assert!(receiver.verify_swarm_open(&open(root, None)).is_err());
    }
}
