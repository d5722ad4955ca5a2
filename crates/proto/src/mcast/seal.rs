//! Multicast datagrams sealed with AES-256-GCM under a group key (ring's AEAD).
//!
//! A group has no handshake of its own: the source draws a fresh [`GroupKey`] for each
//! session and gives it to every receiver inside the set-up message on that receiver's
//! encrypted, authenticated TCP connection. Each datagram then carries, in its header, a
//! *datagram number* that the source never repeats within the session; the nonce is that
//! number, so no nonce is used twice under one key (one [`DgramWriter`] numbers every
//! datagram of a session, the check of the group before the data included). The header the
//! receiver reads before it decrypts (which session, what kind, where the symbol goes, the
//! number) is the associated data: it is authenticated too, so a datagram cannot be moved to
//! another block, index or kind. The tag follows the body.
//!
//! What this stops: anyone on the LAN without the key reads nothing of the file and cannot
//! make a receiver take a datagram. A receiver holds the key, so it could forge datagrams
//! to the other receivers of the session; they still write a block only once it matches
//! the BLAKE3 hash the source sent on their own connection ([`super::receiver`]).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

use super::msg::{session_tag, DgramHeader, DgramKind, DGRAM_HEADER, MAX_NUMBER};

/// Bytes of a group key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the tag after a sealed datagram's body.
pub const TAG_BYTES: usize = 16;

/// A session's group key: 32 random bytes, drawn by the source for this session alone.
#[derive(Clone, PartialEq, Eq)]
pub struct GroupKey([u8; KEY_BYTES]);

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never in a log.
        f.write_str("GroupKey(..)")
    }
}

impl GroupKey {
    /// A fresh key from `rng` (the shell passes ring's `SystemRandom`).
    pub fn generate(rng: &dyn ring::rand::SecureRandom) -> Result<Self, ring::error::Unspecified> {
        let mut k = [0u8; KEY_BYTES];
        rng.fill(&mut k)?;
        Ok(Self(k))
    }

    /// The key in these bytes (as the set-up message carries it).
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> Self {
        Self(bytes)
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }

    /// The cipher that seals and opens datagrams under it.
    pub fn cipher(&self) -> GroupCipher {
        // Infallible: AES-256-GCM takes exactly KEY_BYTES.
        let key = UnboundKey::new(&AES_256_GCM, &self.0).expect("a 32-byte AES-256 key");
        GroupCipher {
            key: LessSafeKey::new(key),
        }
    }
}

/// Seals and opens the datagrams of one group key.
#[derive(Clone)]
pub struct GroupCipher {
    key: LessSafeKey,
}

impl std::fmt::Debug for GroupCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupCipher(..)")
    }
}

/// The nonce of datagram `number`: four zero bytes and the number.
fn nonce(number: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&number.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

impl GroupCipher {
    /// Seals `buf` (a header of `header` bytes, then the body) in place as datagram
    /// `number`: the body is encrypted, the header authenticated, the tag appended. The
    /// caller never passes a number twice under one key.
    pub fn seal(&self, number: u64, header: usize, buf: &mut Vec<u8>) {
        let (aad, body) = buf.split_at_mut(header);
        // Infallible below ring's per-message limit (64 GiB), far above a datagram.
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(number), Aad::from(&*aad), body)
            .expect("a datagram is far below AES-GCM's message limit");
        buf.extend_from_slice(tag.as_ref());
    }

    /// Opens datagram `number` (`d`: a header of `header` bytes, the sealed body, the tag) in
    /// place: the body, or `None` when it was altered, sealed under another key or number,
    /// or is too short to hold a tag.
    pub fn open<'a>(&self, number: u64, header: usize, d: &'a mut [u8]) -> Option<&'a [u8]> {
        if d.len() < header + TAG_BYTES {
            return None;
        }
        let (aad, body) = d.split_at_mut(header);
        let plain = self
            .key
            .open_in_place(nonce(number), Aad::from(&*aad), body)
            .ok()?;
        Some(plain)
    }
}

/// Writes a session's datagrams, numbering each one, sealed under the group key or (both
/// ends chose `--plaintext`) in clear.
#[derive(Debug)]
pub struct DgramWriter {
    session: u64,
    cipher: Option<GroupCipher>,
    next: u64,
}

impl DgramWriter {
    /// The writer of `session`'s datagrams; `cipher`: `None` for a plaintext session.
    pub fn new(session: u64, cipher: Option<GroupCipher>) -> Self {
        Self {
            session,
            cipher,
            next: 0,
        }
    }

    /// Whether its datagrams are sealed.
    pub fn sealed(&self) -> bool {
        self.cipher.is_some()
    }

    /// Datagrams written so far (the next one's number).
    pub fn written(&self) -> u64 {
        self.next
    }

    /// Bytes a datagram has beyond its body: the header, and the tag when sealed.
    pub fn overhead(&self) -> usize {
        overhead(self.sealed())
    }

    /// Writes one datagram into `buf` (cleared first): the header with the next datagram
    /// number, then `body`, sealed when the session is.
    pub fn write(
        &mut self,
        kind: DgramKind,
        block: u32,
        index: u32,
        body: &[u8],
        buf: &mut Vec<u8>,
    ) {
        let number = self.next;
        // A send of 2^48 datagrams (400 PB) is beyond any; stop rather than repeat a nonce.
        assert!(
            number <= MAX_NUMBER,
            "a session never writes 2^48 datagrams"
        );
        self.next += 1;
        buf.clear();
        buf.resize(DGRAM_HEADER, 0);
        DgramHeader {
            session: session_tag(self.session),
            kind,
            block,
            index,
            number,
        }
        .write(buf);
        buf.extend_from_slice(body);
        if let Some(c) = &self.cipher {
            c.seal(number, DGRAM_HEADER, buf);
        }
    }
}

/// Bytes a datagram has beyond its body: the header, and the tag when `sealed`.
pub const fn overhead(sealed: bool) -> usize {
    DGRAM_HEADER + if sealed { TAG_BYTES } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcast::msg::DgramHeader;
    use std::collections::HashSet;

    fn key(b: u8) -> GroupKey {
        GroupKey::from_bytes([b; KEY_BYTES])
    }

    /// Opens `d` as a receiver does: header first, then the body under `c`.
    fn open(c: &GroupCipher, d: &mut [u8]) -> Option<(DgramHeader, Vec<u8>)> {
        let (h, _) = DgramHeader::read(d)?;
        let body = c.open(h.number, DGRAM_HEADER, d)?;
        Some((h, body.to_vec()))
    }

    #[test]
    fn a_sealed_datagram_hides_its_body_and_opens_under_its_key() {
        let mut w = DgramWriter::new(7, Some(key(1).cipher()));
        let body = b"recognisable payload pattern, twice: recognisable payload pattern";
        let mut d = Vec::new();
        w.write(DgramKind::Data, 3, 9, body, &mut d);
        assert_eq!(d.len(), DGRAM_HEADER + body.len() + TAG_BYTES);
        assert!(
            !d.windows(12).any(|x| x == &body[..12]),
            "the body must not appear in clear"
        );
        let (h, got) = open(&key(1).cipher(), &mut d.clone()).unwrap();
        assert_eq!(
            (h.session, h.kind, h.block, h.index),
            (7, DgramKind::Data, 3, 9)
        );
        assert_eq!(got, body);
        // Plaintext: the body is there as it is, no tag.
        let mut p = DgramWriter::new(7, None);
        p.write(DgramKind::Data, 3, 9, body, &mut d);
        assert_eq!(&d[DGRAM_HEADER..], body);
    }

    #[test]
    fn tampered_wrong_key_and_plaintext_datagrams_are_refused() {
        let c = key(1).cipher();
        let mut w = DgramWriter::new(7, Some(c.clone()));
        let mut d = Vec::new();
        w.write(DgramKind::Data, 0, 4, &[0x55; 64], &mut d);
        assert!(open(&c, &mut d.clone()).is_some());
        // Any bit flipped anywhere, header (associated data), body or tag: refused.
        for i in 0..d.len() {
            let mut t = d.clone();
            t[i] ^= 0x01;
            if DgramHeader::read(&t).is_some() {
                assert!(open(&c, &mut t).is_none(), "byte {i} altered yet opened");
            }
        }
        // The header moved to another block, or to another number (a replay under a
        // fresh number): refused.
        for edit in [13usize, 21] {
            let mut t = d.clone();
            t[edit + 3] ^= 0x80;
            assert!(open(&c, &mut t).is_none());
        }
        // Another session's key.
        assert!(open(&key(2).cipher(), &mut d.clone()).is_none());
        // A plaintext datagram to a sealed receiver, and one cut short of its tag.
        let mut p = DgramWriter::new(7, None);
        let mut q = Vec::new();
        p.write(DgramKind::Data, 0, 4, &[0x55; 64], &mut q);
        assert!(open(&c, &mut q).is_none());
        assert!(open(&c, &mut d[..DGRAM_HEADER + 10].to_vec()).is_none());
    }

    #[test]
    fn nonces_are_unique_across_data_repair_end_and_hello_datagrams() {
        // The datagrams of a session as the source writes them: hellos, the first pass,
        // repairs of a block (parity, then its source symbols again), ends between them.
        let mut w = DgramWriter::new(7, Some(key(1).cipher()));
        let mut d = Vec::new();
        let mut numbers = HashSet::new();
        let mut sent = Vec::new();
        let mut send = |w: &mut DgramWriter, kind, block, index| {
            w.write(kind, block, index, &[0; 8], &mut d);
            let (h, _) = DgramHeader::read(&d).unwrap();
            assert!(numbers.insert(h.number), "number {} twice", h.number);
            sent.push((kind, block, index));
        };
        for _ in 0..5 {
            send(&mut w, DgramKind::Hello, 0, 0);
        }
        for b in 0..4 {
            for i in 0..8 {
                send(&mut w, DgramKind::Data, b, i);
            }
        }
        for _ in 0..3 {
            send(&mut w, DgramKind::End, 4, 0);
            // The same block repaired again and again, past its parity.
            for i in 8..20 {
                send(&mut w, DgramKind::Data, 1, i);
            }
        }
        assert_eq!(numbers.len(), sent.len());
        assert_eq!(w.written(), sent.len() as u64);
        // Hellos and ends repeat their header fields: only the number tells them apart,
        // and it does.
        assert!(sent.iter().filter(|s| s.0 == DgramKind::Hello).count() > 1);
    }
}
