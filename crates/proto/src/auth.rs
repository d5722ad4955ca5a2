//! Admission and integrity, both keyed by the session secret.
//!
//! - **Admission**: a mutual challenge-response. Each side sends a random nonce and proves it
//!   holds the secret with `BLAKE3-keyed(handshake key, label || nonces)`; the labels differ per
//!   role, so an answer cannot be reflected back. A peer that fails is refused before any
//!   session data moves, in either direction.
//! - **Integrity**: the source hashes each chunk with BLAKE3 and authenticates `(session,
//!   index, length, hash)` with a MAC under a second derived key. Every node verifies hash and
//!   MAC before it stores, forwards or acknowledges a chunk, so a corrupt or forged chunk is
//!   never written; `End` is authenticated the same way so a cut stream is never complete.
//!
//! Every session member holds the secret, so members trust each other: an insider could forge
//! chunks. Per-source signatures would close that and fit here without wire changes beyond a
//! longer tag. Encryption of the payload is a later, separate layer.

use crate::wire::{Chunk, End, Frame, SessionId, VERSION};
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

/// Keys derived from the secret, one per purpose.
#[derive(Clone)]
pub struct Keys {
    handshake: [u8; 32],
    chunk: [u8; 32],
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
    /// The bytes do not hash to the announced hash (corruption in transit or on a relay).
    #[error("chunk {0}: content does not match its hash")]
    HashMismatch(u64),
    /// The MAC does not match (forged, or from another session).
    #[error("chunk {0}: authentication tag does not match")]
    BadTag(u64),
}

impl Keys {
    /// Derives the keys from the secret.
    pub fn derive(secret: &Secret) -> Self {
        Self {
            handshake: blake3::derive_key("bulkcast 2026-11 handshake v1", &secret.0),
            chunk: blake3::derive_key("bulkcast 2026-11 chunk mac v1", &secret.0),
        }
    }

    /// Hashes and authenticates a chunk's bytes (at the source).
    pub fn seal(&self, session: SessionId, index: u64, data: Bytes) -> Chunk {
        let hash = *blake3::hash(&data).as_bytes();
        let tag = self.chunk_tag(session, index, data.len() as u64, &hash);
        Chunk {
            index,
            hash,
            tag,
            data,
        }
    }

    /// Verifies a chunk's hash and tag (at every receiver, before anything else touches it).
    pub fn verify(&self, session: SessionId, c: &Chunk) -> Result<(), ChunkError> {
        let tag = self.chunk_tag(session, c.index, c.data.len() as u64, &c.hash);
        if !ct_eq(&tag, &c.tag) {
            return Err(ChunkError::BadTag(c.index));
        }
        if !ct_eq(blake3::hash(&c.data).as_bytes(), &c.hash) {
            return Err(ChunkError::HashMismatch(c.index));
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

    fn handshake_mac(&self, label: &[u8], connector: &[u8; 16], acceptor: &[u8; 16]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.handshake);
        h.update(label);
        h.update(connector);
        h.update(acceptor);
        *h.finalize().as_bytes()
    }
}

/// Constant-time comparison, so a forger learns nothing from timing.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The connecting side of the handshake, before the acceptor's challenge.
pub struct Connecting {
    keys: Keys,
    nonce: [u8; 16],
}

impl Connecting {
    /// Starts a handshake with a fresh random nonce; returns the `Hello` to send.
    pub fn start(keys: Keys, nonce: [u8; 16]) -> (Self, Frame) {
        let hello = Frame::Hello {
            version: VERSION,
            nonce,
        };
        (Self { keys, nonce }, hello)
    }

    /// Checks the acceptor's challenge; on success returns the `Auth` frame to send, after which
    /// the connection is admitted on both sides.
    pub fn handle(self, frame: Frame) -> Result<Frame, AuthError> {
        match frame {
            Frame::Challenge { nonce, mac } => {
                let expect = self.keys.handshake_mac(b"acceptor", &self.nonce, &nonce);
                if !ct_eq(&expect, &mac) {
                    return Err(AuthError::WrongSecret);
                }
                Ok(Frame::Auth {
                    mac: self.keys.handshake_mac(b"connector", &self.nonce, &nonce),
                })
            }
            Frame::Refused { reason } => Err(AuthError::Refused(reason)),
            other => Err(AuthError::Unexpected {
                expected: "Challenge",
                got: other.kind(),
            }),
        }
    }
}

/// The accepting side, after it answered `Hello` with a challenge.
pub struct Accepting {
    keys: Keys,
    connector: [u8; 16],
    nonce: [u8; 16],
}

impl Accepting {
    /// Answers a connector's `Hello`. On error the caller sends `Refused` with the error text.
    pub fn start(keys: Keys, hello: Frame, nonce: [u8; 16]) -> Result<(Self, Frame), AuthError> {
        match hello {
            Frame::Hello {
                version,
                nonce: connector,
            } => {
                if version != VERSION {
                    return Err(AuthError::Version(version));
                }
                let mac = keys.handshake_mac(b"acceptor", &connector, &nonce);
                Ok((
                    Self {
                        keys,
                        connector,
                        nonce,
                    },
                    Frame::Challenge { nonce, mac },
                ))
            }
            other => Err(AuthError::Unexpected {
                expected: "Hello",
                got: other.kind(),
            }),
        }
    }

    /// Checks the connector's proof; `Ok` admits the connection.
    pub fn handle(self, frame: Frame) -> Result<(), AuthError> {
        match frame {
            Frame::Auth { mac } => {
                let expect = self
                    .keys
                    .handshake_mac(b"connector", &self.connector, &self.nonce);
                if ct_eq(&expect, &mac) {
                    Ok(())
                } else {
                    Err(AuthError::WrongSecret)
                }
            }
            Frame::Refused { reason } => Err(AuthError::Refused(reason)),
            other => Err(AuthError::Unexpected {
                expected: "Auth",
                got: other.kind(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(b: u8) -> Keys {
        Keys::derive(&Secret::from_bytes([b; 32]))
    }

    fn handshake(client: Keys, server: Keys) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (c, hello) = Connecting::start(client, [1; 16]);
        let (s, challenge) = Accepting::start(server, hello, [2; 16]).unwrap();
        match c.handle(challenge) {
            Err(e) => (Err(e), Ok(())),
            Ok(auth) => (Ok(()), s.handle(auth)),
        }
    }

    #[test]
    fn same_secret_admits_both_ways() {
        assert_eq!(handshake(keys(1), keys(1)), (Ok(()), Ok(())));
    }

    #[test]
    fn wrong_secret_is_caught_by_the_connector() {
        assert_eq!(handshake(keys(1), keys(2)).0, Err(AuthError::WrongSecret));
    }

    #[test]
    fn a_connector_without_the_secret_cannot_pass() {
        // The connector replays the acceptor's own MAC (reflection): refused.
        let (_c, hello) = Connecting::start(keys(9), [1; 16]);
        let (s, challenge) = Accepting::start(keys(1), hello, [2; 16]).unwrap();
        let Frame::Challenge { mac, .. } = challenge else {
            panic!()
        };
        assert_eq!(s.handle(Frame::Auth { mac }), Err(AuthError::WrongSecret));
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

    #[test]
    fn secret_hex_round_trip() {
        let s = Secret::from_bytes([0xab; 32]);
        assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        assert_eq!(Secret::from_hex("abc"), Err(BadSecret));
        assert_eq!(Secret::from_hex(&"zz".repeat(32)), Err(BadSecret));
    }
}
