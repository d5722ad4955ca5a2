//! Admission and integrity keys.
//!
//! - **Admission**: the handshake (`bulkcast_runtime::secure`, the Noise framework by `snow`)
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
//! - **Source signatures** (with host keys): the source also signs each chunk's hash, the
//!   session set-up (session, chunk size, manifest, stripe: what lands on disk and where; see
//!   [`Keys::sign_open`]) and the `End`. A receiver that requires them
//!   ([`Keys::requiring_source`]) takes the set-up and every chunk only when a key allowed to
//!   push here signed it, and the `End` only from the key that signed the set-up
//!   ([`Keys::for_source`]). So a relaying member with the relay role, which holds the secret
//!   and the MAC key, can neither forge data, nor rename or re-list the object, nor cut it
//!   short.
//!
//! In secret mode (no host keys) every member holds every key: members trust each other and an
//! insider could forge chunks (docs/DESIGN.md, threat model).

use std::sync::Arc;

use crate::groups::{self, GroupError, Groups};
use crate::identity::{Identity, PublicKey, Role};
use crate::manifest::Manifest;
use crate::wire::{
    object_id, Chunk, End, Head, Open, SessionId, SourceSig, StripeInfo, SwarmOpen, VERSION,
};
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
    /// The session's source, once its signed set-up was accepted: only its signatures count.
    source: Option<PublicKey>,
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
    /// Its hash is not the one the source listed for it (a swarm's signed piece list).
    #[error("chunk {0}: not the piece the source listed (hash differs)")]
    NotListed(u64),
}

/// Why a session set-up or an `End` did not carry an acceptable source signature.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignedError {
    /// No signature, where this host requires one.
    #[error("{0} not signed by its source")]
    Unsigned(&'static str),
    /// Signed by a key that may not push here (relay-only, or not on the list).
    #[error("{0} signed by {1}, which may not push to this host")]
    NotASource(&'static str, String),
    /// Signed by a key that may push here, but not by this session's source.
    #[error("{0} signed by {1}, not by this session's source")]
    OtherSource(&'static str, String),
    /// The signature does not match what it came with (forged, or altered on the way).
    #[error("{0}: the source's signature does not match")]
    BadSignature(&'static str),
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
            source: None,
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

    /// Accepts, from now on, only `source`'s signature (the key that signed the session's
    /// set-up, as [`Keys::verify_open`] returned it) on the session's `End`: another key allowed
    /// to push here cannot end a session it did not start. (Chunks are taken signed by any key
    /// with the push role: a relay that holds one re-seals what it reads back from its own
    /// earlier copy.)
    pub fn for_source(self, source: PublicKey) -> Self {
        Self {
            source: Some(source),
            ..self
        }
    }

    /// Whether this host takes only data its source signed (see [`Keys::requiring_source`]).
    pub fn requires_source(&self) -> bool {
        self.require_source
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

    /// Verifies a chunk against the hash its source listed for it (a swarm session's piece
    /// list, whose root the source signed: [`Keys::verify_swarm_open`]), then its tag and its
    /// bytes. No per-chunk signature is needed: a piece whose bytes hash to the listed hash is
    /// the source's, whoever sealed it for this session (a member re-seals what it kept).
    pub fn verify_listed(
        &self,
        session: SessionId,
        c: &Chunk,
        listed: &[u8; 32],
    ) -> Result<(), ChunkError> {
        if !ct_eq(&c.hash, listed) {
            return Err(ChunkError::NotListed(c.index));
        }
        if !ct_eq(
            &self.chunk_tag(session, c.index, c.data.len() as u64, &c.hash),
            &c.tag,
        ) {
            return Err(ChunkError::BadTag(c.index));
        }
        if !ct_eq(blake3::hash(&c.data).as_bytes(), &c.hash) {
            return Err(ChunkError::HashMismatch(c.index));
        }
        Ok(())
    }

    /// A chunk of this session, hashed already and listed by its source (a swarm member's kept
    /// piece): its tag, without a signature (see [`Keys::verify_listed`]).
    pub fn seal_listed(
        &self,
        session: SessionId,
        index: u64,
        data: Bytes,
        hash: [u8; 32],
    ) -> Chunk {
        let tag = self.chunk_tag(session, index, data.len() as u64, &hash);
        Chunk {
            index,
            hash,
            tag,
            sig: None,
            data,
        }
    }

    /// The tag of a listed piece of `len` bytes (see [`Keys::seal_listed`]), for a member that
    /// serves it from its file.
    pub fn tag_listed(
        &self,
        session: SessionId,
        index: u64,
        len: u64,
        hash: &[u8; 32],
    ) -> [u8; 32] {
        self.chunk_tag(session, index, len, hash)
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

    /// Checks `sig` over `msg`: a key allowed to push here (with `pinned`, the session's
    /// source, once there is one) made it.
    fn check_signer(
        &self,
        sig: Option<&SourceSig>,
        msg: &[u8],
        pinned: bool,
    ) -> Result<PublicKey, Signer> {
        let (Some(id), Some(sig)) = (&self.identity, sig) else {
            return Err(Signer::Missing);
        };
        let key = PublicKey::from_bytes(&sig.key).map_err(|_| Signer::Bad)?;
        if id.allow.role(&key) != Some(Role::Push) {
            return Err(Signer::NotASource(key.to_string()));
        }
        if pinned && self.source.is_some_and(|s| s != key) {
            return Err(Signer::Other(key.to_string()));
        }
        if !key.verify(msg, &sig.sig) {
            return Err(Signer::Bad);
        }
        Ok(key)
    }

    fn signed_error(what: &'static str, e: Signer) -> SignedError {
        match e {
            Signer::Missing => SignedError::Unsigned(what),
            Signer::NotASource(k) => SignedError::NotASource(what, k),
            Signer::Other(k) => SignedError::OtherSource(what, k),
            Signer::Bad => SignedError::BadSignature(what),
        }
    }

    /// This host's signature, as a source, of a session's set-up (nothing without a host key):
    /// over the session, the chunk size, the manifest and the stripe, which decide what is
    /// written where. (Node ids, the subtree, timeouts and transport tuning differ per hop or
    /// do not touch the data, and are left out.)
    pub fn sign_open(
        &self,
        session: SessionId,
        chunk_size: u32,
        manifest: &Manifest,
        stripe: Option<&StripeInfo>,
    ) -> Option<Box<SourceSig>> {
        let id = self.identity.as_ref()?;
        let msg = open_signed(session, chunk_size, manifest, stripe);
        Some(Box::new(SourceSig {
            key: id.key.public().to_bytes(),
            sig: id.key.sign(&msg),
        }))
    }

    /// Checks an `Open`'s source signature where this host requires one: returns the key
    /// that signed it (pin it with [`Keys::for_source`]), or `None` when none is required.
    pub fn verify_open(&self, open: &Open) -> Result<Option<PublicKey>, SignedError> {
        self.verify_setup(
            open.session,
            open.chunk_size,
            &open.manifest,
            open.stripe.as_deref(),
            open.sig.as_deref(),
        )
    }

    /// [`Keys::verify_open`] from the signed fields and the signature.
    pub fn verify_setup(
        &self,
        session: SessionId,
        chunk_size: u32,
        manifest: &Manifest,
        stripe: Option<&StripeInfo>,
        sig: Option<&SourceSig>,
    ) -> Result<Option<PublicKey>, SignedError> {
        if !self.require_source {
            return Ok(None);
        }
        let msg = open_signed(session, chunk_size, manifest, stripe);
        self.check_signer(sig, &msg, true)
            .map(Some)
            .map_err(|e| Self::signed_error("the session set-up was", e))
    }

    /// This host's signature, as a source, of a swarm session's set-up (nothing without a host
    /// key): the session, the chunk size, the manifest and the root of the pieces' hashes
    /// ([`crate::swarm::PieceHashes::root`]). Members then check every piece against the list,
    /// so one signature covers every piece, whoever serves it.
    pub fn sign_swarm_open(
        &self,
        session: SessionId,
        chunk_size: u32,
        manifest: &Manifest,
        pieces_root: &[u8; 32],
    ) -> Option<Box<SourceSig>> {
        let id = self.identity.as_ref()?;
        let msg = swarm_open_signed(session, chunk_size, manifest, pieces_root);
        Some(Box::new(SourceSig {
            key: id.key.public().to_bytes(),
            sig: id.key.sign(&msg),
        }))
    }

    /// Checks a swarm set-up's source signature where this host requires one (see
    /// [`Keys::sign_swarm_open`]): returns the key that signed it, or `None` when none is
    /// required.
    pub fn verify_swarm_open(&self, open: &SwarmOpen) -> Result<Option<PublicKey>, SignedError> {
        if !self.require_source {
            return Ok(None);
        }
        let msg = swarm_open_signed(
            open.session,
            open.chunk_size,
            &open.manifest,
            &open.pieces_root,
        );
        self.check_signer(open.sig.as_deref(), &msg, true)
            .map(Some)
            .map_err(|e| Self::signed_error("the session set-up was", e))
    }

    /// The authenticated end of an object (signed too, with a host key).
    pub fn seal_end(&self, session: SessionId, chunks: u64, total_len: u64) -> End {
        let sig = self.identity.as_ref().map(|id| SourceSig {
            key: id.key.public().to_bytes(),
            sig: id.key.sign(&end_signed(session, chunks, total_len)),
        });
        End {
            chunks,
            total_len,
            tag: self.end_tag(session, chunks, total_len),
            sig,
        }
    }

    /// True when `end` was made by a holder of the secret for this session.
    pub fn verify_end(&self, session: SessionId, end: &End) -> bool {
        ct_eq(&self.end_tag(session, end.chunks, end.total_len), &end.tag)
    }

    /// Where this host requires it, the source's signature of `end` (after
    /// [`Keys::verify_end`]): a relay cannot end an object early or late.
    pub fn verify_end_source(&self, session: SessionId, end: &End) -> Result<(), SignedError> {
        if !self.require_source {
            return Ok(());
        }
        let msg = end_signed(session, end.chunks, end.total_len);
        self.check_signer(end.sig.as_ref(), &msg, true)
            .map(|_| ())
            .map_err(|e| Self::signed_error("the end of the object was", e))
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

/// Why [`Keys::check_signer`] refused a signature.
enum Signer {
    Missing,
    /// The key, as text (the error names it).
    NotASource(String),
    Other(String),
    Bad,
}

/// What a source signs for a session's set-up: a digest of the fields that decide what is
/// written where.
fn open_signed(
    session: SessionId,
    chunk_size: u32,
    manifest: &Manifest,
    stripe: Option<&StripeInfo>,
) -> [u8; 44] {
    let mut h = blake3::Hasher::new_derive_key("bulkcast 2026-11 signed open v1");
    h.update(&session.to_be_bytes());
    h.update(&chunk_size.to_be_bytes());
    h.update(&object_id(manifest));
    match stripe {
        None => h.update(&[0]),
        Some(st) => {
            h.update(&[1]);
            h.update(&st.group.to_be_bytes());
            h.update(&st.tree.to_be_bytes());
            h.update(&(st.pattern.len() as u64).to_be_bytes());
            for t in &st.pattern {
                h.update(&t.to_be_bytes());
            }
            h.update(&object_id(&st.object))
        }
    };
    let mut m = [0u8; 44];
    m[..4].copy_from_slice(b"open");
    m[4..36].copy_from_slice(h.finalize().as_bytes());
    m[36..].copy_from_slice(b"bcsig v1");
    m
}

/// What a source signs for a swarm session's set-up: a digest of the fields that decide what
/// is written where, and of every piece (the root of their hashes).
fn swarm_open_signed(
    session: SessionId,
    chunk_size: u32,
    manifest: &Manifest,
    pieces_root: &[u8; 32],
) -> [u8; 44] {
    let mut h = blake3::Hasher::new_derive_key("bulkcast 2026-11 signed swarm open v1");
    h.update(&session.to_be_bytes());
    h.update(&chunk_size.to_be_bytes());
    h.update(&object_id(manifest));
    h.update(pieces_root);
    let mut m = [0u8; 44];
    m[..4].copy_from_slice(b"swrm");
    m[4..36].copy_from_slice(h.finalize().as_bytes());
    m[36..].copy_from_slice(b"bcsig v1");
    m
}

/// What a source signs for the end of an object.
fn end_signed(session: SessionId, chunks: u64, total_len: u64) -> [u8; 35] {
    let mut m = [0u8; 35];
    m[..3].copy_from_slice(b"end");
    m[3..11].copy_from_slice(&session.to_be_bytes());
    m[11..19].copy_from_slice(&chunks.to_be_bytes());
    m[19..27].copy_from_slice(&total_len.to_be_bytes());
    m[27..].copy_from_slice(b"bcsig v1");
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

    /// The set-up and the end are the source's too: a relay can neither re-list, rename or
    /// re-cut the object nor end it early, and once a set-up is accepted only its signer counts.
    #[test]
    fn a_relay_cannot_forge_the_set_up_or_the_end() {
        use crate::identity::{AllowList, HostKey};
        use crate::manifest::{Manifest, ObjectKind};
        let (source, relay, other) = (
            HostKey::from_seed([1; 32]),
            HostKey::from_seed([2; 32]),
            HostKey::from_seed([5; 32]),
        );
        let allow = AllowList::with_roles([
            (source.public(), Role::Push),
            (relay.public(), Role::Relay),
            (other.public(), Role::Push),
        ]);
        let with = |k: &HostKey| {
            keys(3).with_identity(Identity {
                key: k.clone(),
                allow: allow.clone(),
            })
        };
        let receiver = with(&HostKey::from_seed([4; 32])).requiring_source();
        let manifest = Manifest {
            name: "data.bin".into(),
            kind: ObjectKind::File,
            total_len: Some(100),
            entries: vec![],
            mode: 0o644,
            mtime: None,
        };
        let open = |sig| Open {
            session: 7,
            node: 1,
            chunk_size: 1 << 16,
            stall_timeout_ms: 1000,
            cc: String::new(),
            manifest: manifest.clone(),
            members: vec![],
            stripe: None,
            edges: Default::default(),
            sig,
        };
        let signed = open(with(&source).sign_open(7, 1 << 16, &manifest, None));
        assert_eq!(receiver.verify_open(&signed), Ok(Some(source.public())));
        // Fields outside the signature (per hop) may change; those inside may not.
        let hop = Open {
            node: 3,
            stall_timeout_ms: 5,
            ..signed.clone()
        };
        assert!(receiver.verify_open(&hop).is_ok());
        let mut renamed = signed.clone();
        renamed.manifest.name = "../evil".into();
        let e = receiver.verify_open(&renamed).unwrap_err();
        assert_eq!(e, SignedError::BadSignature("the session set-up was"));
        let recut = Open {
            chunk_size: 1 << 12,
            ..signed.clone()
        };
        assert!(receiver.verify_open(&recut).is_err());
        assert_eq!(
            receiver.verify_open(&open(None)),
            Err(SignedError::Unsigned("the session set-up was"))
        );
        let by_relay = open(with(&relay).sign_open(7, 1 << 16, &manifest, None));
        assert!(matches!(
            receiver.verify_open(&by_relay),
            Err(SignedError::NotASource(..))
        ));
        // Without the requirement nothing is checked (secret mode).
        assert_eq!(with(&relay).verify_open(&open(None)), Ok(None));

        // The end: signed by the source, checked once pinned to it.
        let pinned = receiver.clone().for_source(source.public());
        let end = with(&source).seal_end(7, 2, 100);
        assert!(pinned.verify_end(7, &end));
        assert_eq!(pinned.verify_end_source(7, &end), Ok(()));
        // A relay's early end: MAC-valid (it holds the secret), not the source's.
        let early = with(&relay).seal_end(7, 1, 50);
        assert!(pinned.verify_end(7, &early));
        assert!(matches!(
            pinned.verify_end_source(7, &early),
            Err(SignedError::NotASource(..))
        ));
        let moved = End {
            sig: end.sig,
            ..keys(3).seal_end(7, 1, 50)
        };
        assert_eq!(
            pinned.verify_end_source(7, &moved),
            Err(SignedError::BadSignature("the end of the object was"))
        );
        assert!(matches!(
            pinned.verify_end_source(7, &keys(3).seal_end(7, 2, 100)),
            Err(SignedError::Unsigned(_))
        ));
        // Another source that may push here cannot end this source's session.
        assert!(matches!(
            pinned.verify_end_source(7, &with(&other).seal_end(7, 2, 100)),
            Err(SignedError::OtherSource(..))
        ));
        // Its chunks pass (a push-role relay re-seals chunks it reads back from disk).
        let theirs = with(&other).seal(7, 0, Bytes::from_static(b"x"));
        assert_eq!(pinned.verify(7, &theirs), Ok(()));
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
