//! Admission and integrity keys.
//!
//! - **Admission**: the handshake (`bulkcast_node::secure`, the Noise framework by `snow`)
//!   proves that both ends hold the session secret (its pre-shared key is [`Keys::psk`]) and,
//!   with host keys ([`crate::identity`]), that each end's key is on the other's allow list.
//!   It also keys the encryption of everything after it, unless both ends chose plaintext
//!   ([`Keys::plaintext`]).
//! - **Integrity**: the source hashes each chunk with BLAKE3 and authenticates `(session,
//!   index, length, hash)` with a MAC under a key derived from the secret. Every node verifies
//!   hash and MAC before it stores, forwards or acknowledges a chunk, so a corrupt or forged
//!   chunk is never written; `End` is authenticated the same way so a cut stream is never
//!   complete.
//!
//! Every session member holds the secret, so members trust each other: an insider could forge
//! chunks (docs/DESIGN.md, threat model). Per-source signatures would close that with a longer
//! tag.

use std::sync::Arc;

use crate::groups::{self, GroupError, Groups};
use crate::identity::{Identity, PublicKey, Role};
use crate::wire::{Chunk, End, Head, SessionId, SourceSig, VERSION};
use bytes::Bytes;

/// The session secret (32 bytes; written as 64 hex digits).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Why a secret was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a secret is 64 hex digits (32 bytes)")]
pub struct BadSecret;

impl Secret {
    /// Wraps 32 random bytes (the shell draws them from the OS).
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Self(b)
    }

    /// Parses 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Self, BadSecret> {
        let s = s.trim();
        if s.len() != 64 {
            return Err(BadSecret);
        }
        let mut b = [0u8; 32];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(s.get(2 * i..2 * i + 2).ok_or(BadSecret)?, 16)
                .map_err(|_| BadSecret)?;
        }
        Ok(Self(b))
    }

    /// The 64-hex-digit form.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Keys derived from the secret, one per purpose, and how this host admits its peers.
#[derive(Clone)]
pub struct Keys {
    handshake: [u8; 32],
    chunk: [u8; 32],
    identity: Option<Arc<Identity>>,
    plaintext: bool,
    require_source: bool,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// Why a handshake or a chunk failed authentication.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// The peer's proof does not match: it does not hold this secret.
    #[error("peer does not hold the session secret (authentication failed: both sides must use the same secret)")]
    WrongSecret,
    /// The peer speaks another protocol version.
    #[error("peer speaks protocol version {0}, this build speaks {VERSION}")]
    Version(u16),
    /// The peer refused us, with its reason.
    #[error("refused by peer: {0}")]
    Refused(String),
    /// The peer's host key is not on this host's allow list (or it presented none).
    #[error("peer's host key {0} is not on this host's allow list")]
    NotAllowed(String),
    /// One end has a host key and allow list and the other has none.
    #[error("{0}")]
    Mode(&'static str),
    /// A handshake message did not verify or decode.
    #[error("handshake failed: {0}")]
    Handshake(String),
    /// The peer sent something other than the expected handshake step.
    #[error("expected {expected} during the handshake, got {got}")]
    Unexpected {
        /// What the state machine waited for.
        expected: &'static str,
        /// What arrived.
        got: &'static str,
    },
}

/// Why a chunk was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChunkError {
    /// Not signed by a source, where this host requires it.
    #[error("chunk {0}: not signed by its source")]
    Unsigned(u64),
    /// Signed by a key that may not push here (a relay-only key, or one not on the list).
    #[error("chunk {0}: signed by {1}, which may not push to this host")]
    NotASource(u64, String),
    /// The source's signature does not match (forged, or altered on the way).
    #[error("chunk {0}: the source's signature does not match")]
    BadSignature(u64),
    /// The bytes do not hash to the announced hash (corruption in transit or on a relay).
    #[error("chunk {0}: content does not match its hash")]
    HashMismatch(u64),
    /// The MAC does not match (forged, or from another session).
    #[error("chunk {0}: authentication tag does not match")]
    BadTag(u64),
    /// The group list of a chunk sent in parts does not fit its hash.
    #[error("chunk {0}: {1}")]
    BadGroups(u64, GroupError),
}

impl Keys {
    /// Derives the keys from the secret.
    pub fn derive(secret: &Secret) -> Self {
        Self {
            handshake: blake3::derive_key("bulkcast 2026-11 handshake v1", &secret.0),
            chunk: blake3::derive_key("bulkcast 2026-11 chunk mac v1", &secret.0),
            identity: None,
            plaintext: false,
            require_source: false,
        }
    }

    /// Accepts only chunks signed by a key with the push role on this host's allow list (see
    /// [`Keys::verify`]); a no-op without host keys. Receivers of a tree session set this, so a
    /// relaying member, which holds every key of the session but not the source's, cannot
    /// forge chunks they accept.
    pub fn requiring_source(self) -> Self {
        Self {
            require_source: self.identity.is_some(),
            ..self
        }
    }

    /// With a host key and an allow list: handshakes then also prove each end's key, and admit
    /// only peers whose key is on the list.
    pub fn with_identity(self, identity: Identity) -> Self {
        Self {
            identity: Some(Arc::new(identity)),
            ..self
        }
    }

    /// Agrees to run connections unencrypted (trusted networks). A connection is plaintext
    /// only when both of its ends agree; admission and chunk integrity are checked either way.
    pub fn with_plaintext(self, plaintext: bool) -> Self {
        Self { plaintext, ..self }
    }

    /// The handshake's pre-shared key (from the secret).
    pub fn psk(&self) -> &[u8; 32] {
        &self.handshake
    }

    /// This host's key and allow list, if it has them.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_deref()
    }

    /// Whether this side agrees to plaintext connections.
    pub fn plaintext(&self) -> bool {
        self.plaintext
    }

    /// Hashes and authenticates a chunk's bytes (at the source).
    pub fn seal(&self, session: SessionId, index: u64, data: Bytes) -> Chunk {
        let hash = *blake3::hash(&data).as_bytes();
        self.seal_hashed(session, index, data, hash)
    }

    /// As [`Keys::seal`], and the chaining values of the chunk's groups, for sending it in
    /// parts ([`crate::groups`]); the hash comes from them, so the bytes are hashed once.
    pub fn seal_in_groups(
        &self,
        session: SessionId,
        index: u64,
        data: Bytes,
    ) -> (Chunk, Vec<[u8; 32]>) {
        let (hash, cvs) = groups::hash_with_cvs(&data);
        (self.seal_hashed(session, index, data, hash), cvs)
    }

    fn seal_hashed(&self, session: SessionId, index: u64, data: Bytes, hash: [u8; 32]) -> Chunk {
        let tag = self.chunk_tag(session, index, data.len() as u64, &hash);
        // With a host key the source also signs: receivers that require it accept no chunk
        // a member made up.
        let sig = self.identity.as_ref().map(|id| {
            Box::new(SourceSig {
                key: id.key.public().to_bytes(),
                sig: id
                    .key
                    .sign(&signed(session, index, data.len() as u64, &hash)),
            })
        });
        Chunk {
            index,
            hash,
            tag,
            sig,
            data,
        }
    }

    /// Verifies a chunk's hash and tag (at every receiver, before anything else touches it).
    pub fn verify(&self, session: SessionId, c: &Chunk) -> Result<(), ChunkError> {
        self.verify_header(
            session,
            c.index,
            c.data.len() as u64,
            &c.hash,
            &c.tag,
            &c.sig,
        )?;
        if !ct_eq(blake3::hash(&c.data).as_bytes(), &c.hash) {
            return Err(ChunkError::HashMismatch(c.index));
        }
        Ok(())
    }

    /// Verifies the header of a chunk sent in parts, and its group list against its hash: what
    /// then checks each part as it arrives.
    pub fn verify_head(&self, session: SessionId, h: &Head) -> Result<Groups, ChunkError> {
        self.verify_header(session, h.index, u64::from(h.len), &h.hash, &h.tag, &h.sig)?;
        Groups::new(h.hash, h.len as usize, h.cvs.clone())
            .map_err(|e| ChunkError::BadGroups(h.index, e))
    }

    /// The tag, and the source's signature where this host requires one, over a chunk's
    /// announced index, length and hash.
    fn verify_header(
        &self,
        session: SessionId,
        index: u64,
        len: u64,
        hash: &[u8; 32],
        tag: &[u8; 32],
        sig: &Option<Box<SourceSig>>,
    ) -> Result<(), ChunkError> {
        if !ct_eq(&self.chunk_tag(session, index, len, hash), tag) {
            return Err(ChunkError::BadTag(index));
        }
        if self.require_source {
            self.verify_source(session, index, len, hash, sig)?;
        }
        Ok(())
    }

    /// The signature of a source allowed to push here, over the chunk's announced hash (which
    /// [`Keys::verify`] then checks against the bytes).
    fn verify_source(
        &self,
        session: SessionId,
        index: u64,
        len: u64,
        hash: &[u8; 32],
        sig: &Option<Box<SourceSig>>,
    ) -> Result<(), ChunkError> {
        let (Some(id), Some(sig)) = (&self.identity, sig) else {
            return Err(ChunkError::Unsigned(index));
        };
        let key = PublicKey::from_bytes(&sig.key).map_err(|_| ChunkError::BadSignature(index))?;
        if id.allow.role(&key) != Some(Role::Push) {
            return Err(ChunkError::NotASource(index, key.to_string()));
        }
        if !key.verify(&signed(session, index, len, hash), &sig.sig) {
            return Err(ChunkError::BadSignature(index));
        }
        Ok(())
    }

    /// The authenticated end of an object.
    pub fn seal_end(&self, session: SessionId, chunks: u64, total_len: u64) -> End {
        End {
            chunks,
            total_len,
            tag: self.end_tag(session, chunks, total_len),
        }
    }

    /// True when `end` was made by a holder of the secret for this session.
    pub fn verify_end(&self, session: SessionId, end: &End) -> bool {
        ct_eq(&self.end_tag(session, end.chunks, end.total_len), &end.tag)
    }

    fn chunk_tag(&self, session: SessionId, index: u64, len: u64, hash: &[u8; 32]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.chunk);
        h.update(b"chunk");
        h.update(&session.to_be_bytes());
        h.update(&index.to_be_bytes());
        h.update(&len.to_be_bytes());
        h.update(hash);
        *h.finalize().as_bytes()
    }

    fn end_tag(&self, session: SessionId, chunks: u64, total_len: u64) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.chunk);
        h.update(b"end");
        h.update(&session.to_be_bytes());
        h.update(&chunks.to_be_bytes());
        h.update(&total_len.to_be_bytes());
        *h.finalize().as_bytes()
    }
}

/// What a source signs for a chunk.
fn signed(session: SessionId, index: u64, len: u64, hash: &[u8; 32]) -> [u8; 69] {
    let mut m = [0u8; 69];
    m[..5].copy_from_slice(b"chunk");
    m[5..13].copy_from_slice(&session.to_be_bytes());
    m[13..21].copy_from_slice(&index.to_be_bytes());
    m[21..29].copy_from_slice(&len.to_be_bytes());
    m[29..61].copy_from_slice(hash);
    m[61..69].copy_from_slice(b"bcsig v1");
    m
}

/// Constant-time comparison, so a forger learns nothing from timing.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> Keys {
        Keys::derive(&Secret::from_bytes([b; 32]))
    }

    #[test]
    fn chunks_verify_and_tampering_is_caught() {
        let k = keys(3);
        let c = k.seal(7, 5, Bytes::from_static(b"payload"));
        assert_eq!(k.verify(7, &c), Ok(()));
        let mut bad = c.clone();
        bad.data = Bytes::from_static(b"paYload");
        assert_eq!(k.verify(7, &bad), Err(ChunkError::HashMismatch(5)));
        let mut moved = c.clone();
        moved.index = 6;
        assert_eq!(k.verify(7, &moved), Err(ChunkError::BadTag(6)));
        assert_eq!(k.verify(8, &c), Err(ChunkError::BadTag(5)));
        assert_eq!(keys(4).verify(7, &c), Err(ChunkError::BadTag(5)));
        let end = k.seal_end(7, 3, 100);
        assert!(k.verify_end(7, &end));
        assert!(!k.verify_end(
            7,
            &End {
                total_len: 99,
                ..end
            }
        ));
    }

    /// A member holds every key of the session but the source's: with host keys, a receiver
    /// takes no chunk it sealed, signed or not.
    #[test]
    fn a_relay_without_the_source_key_cannot_forge_chunks() {
        use crate::identity::{AllowList, HostKey};
        let (source, relay) = (HostKey::from_seed([1; 32]), HostKey::from_seed([2; 32]));
        let allow =
            AllowList::with_roles([(source.public(), Role::Push), (relay.public(), Role::Relay)]);
        let with = |k: &HostKey| {
            keys(3).with_identity(Identity {
                key: k.clone(),
                allow: allow.clone(),
            })
        };
        let receiver = with(&HostKey::from_seed([4; 32])).requiring_source();
        let data = Bytes::from_static(b"payload");
        let good = with(&source).seal(7, 0, data.clone());
        assert_eq!(receiver.verify(7, &good), Ok(()));
        // The relay's own signature: not a source here.
        let forged = with(&relay).seal(7, 0, Bytes::from_static(b"forgery"));
        assert!(matches!(
            receiver.verify(7, &forged),
            Err(ChunkError::NotASource(0, _))
        ));
        // MAC-valid but unsigned.
        let unsigned = keys(3).seal(7, 0, Bytes::from_static(b"forgery"));
        assert_eq!(receiver.verify(7, &unsigned), Err(ChunkError::Unsigned(0)));
        // The source's signature moved onto other bytes (hash and MAC redone by the relay).
        let mut moved = keys(3).seal(7, 0, Bytes::from_static(b"forgery"));
        moved.sig = good.sig.clone();
        assert_eq!(receiver.verify(7, &moved), Err(ChunkError::BadSignature(0)));
        // Another session's chunk.
        assert_eq!(receiver.verify(8, &good), Err(ChunkError::BadTag(0)));
        // Without the requirement (secret mode) a MAC is enough, as before.
        assert_eq!(with(&relay).verify(7, &unsigned), Ok(()));
    }

    #[test]
    fn secret_hex_round_trip() {
        let s = Secret::from_bytes([0xab; 32]);
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(Secret::from_hex("abc"), Err(BadSecret));
        assert_eq!(Secret::from_hex(&"zz".repeat(32)), Err(BadSecret));
    }

    #[test]
    fn a_head_with_a_forged_group_list_or_tag_is_refused() {
        let k = keys(3);
        let data = Bytes::from(vec![7u8; 100_000]);
        let (c, cvs) = k.seal_in_groups(7, 2, data);
        let head = Head {
            index: 2,
            len: c.data.len() as u32,
            hash: c.hash,
            tag: c.tag,
            sig: None,
            cvs,
        };
        let g = k.verify_head(7, &head).expect("an honest head verifies");
        assert!(g.check(0, &c.data[g.range(0)]));
        let mut forged = head.clone();
        forged.cvs[1][0] ^= 1;
        assert!(matches!(
            k.verify_head(7, &forged),
            Err(ChunkError::BadGroups(2, _))
        ));
        let mut retagged = head;
        retagged.len -= 1;
        assert!(matches!(
            k.verify_head(7, &retagged),
            Err(ChunkError::BadTag(2))
        ));
    }
}
