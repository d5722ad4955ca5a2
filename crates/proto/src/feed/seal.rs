//! The feed's multicast datagrams: numbered, and sealed with AES-256-GCM under the group key
//! ([`crate::mcast::seal`], the file send's cipher) unless both ends chose `--plaintext`.
//!
//! ```text
//! datagram: "BCF2" | feed_id:u64 | number:u64 | message (sealed) | tag[16] (sealed only)
//! ```
//!
//! The source draws a group key at every start of `feed serve` and hands it to each multicast
//! subscriber in its `Accepted`, on the subscriber's encrypted connection. The header is the
//! associated data (a datagram cannot be moved to another feed or number); the number is the
//! nonce. One [`DgramWriter`] numbers every datagram of a server's life (data, parity,
//! product starts, indexes alike) from 0, and the key lives only in that process's memory:
//! a restarted server cannot continue the numbering, so it draws a new key, and no nonce is
//! ever used twice under one key. (A persisted key would need a persisted counter that never
//! goes back, crash included; a fresh key per start needs nothing.)
//!
//! What it stops: anyone on the LAN without the key reads no product and cannot make a
//! subscriber take a datagram. A subscriber holds the key, so it could forge datagrams to the
//! others; they still deliver a product only once it matches the hash and tag of its
//! metadata ([`super::product::ProductAuth`]).

use bytes::{BufMut, BytesMut};

use super::msg::{Msg, MsgError};
use crate::mcast::seal::{GroupCipher, TAG_BYTES};

/// Magic at the start of every feed datagram (2: numbered, sealed unless plaintext).
pub const DGRAM_MAGIC: [u8; 4] = *b"BCF2";
/// Bytes of a datagram's header (magic, feed id, number).
pub const DGRAM_HEADER: usize = 20;

/// Bytes a datagram has beyond its message: the header, and the tag when `sealed`.
pub const fn overhead(sealed: bool) -> usize {
    DGRAM_HEADER + if sealed { TAG_BYTES } else { 0 }
}

/// Writes a server's datagrams, numbering each one, sealed under the group key or (both ends
/// chose `--plaintext`) in clear.
pub struct DgramWriter {
    feed_id: u64,
    cipher: Option<GroupCipher>,
    next: u64,
    /// The message being written, before it goes after the header.
    scratch: BytesMut,
}

impl std::fmt::Debug for DgramWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the scratch buffer: it holds the last message in clear.
        f.debug_struct("DgramWriter")
            .field("feed_id", &self.feed_id)
            .field("sealed", &self.sealed())
            .field("next", &self.next)
            .finish()
    }
}

impl DgramWriter {
    /// The writer of feed `feed_id`'s datagrams; `cipher`: `None` for a plaintext feed. One
    /// per group key: the numbers start again at 0.
    pub fn new(feed_id: u64, cipher: Option<GroupCipher>) -> Self {
        Self {
            feed_id,
            cipher,
            next: 0,
            scratch: BytesMut::with_capacity(2048),
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

    /// Passes over the next number without a datagram: the pusher counts every datagram it
    /// chose (`proto::feed::push`), and one the shell could not make (its product unreadable)
    /// keeps its number, so the two counts stay the same.
    pub fn skip(&mut self) {
        self.next = self.next.saturating_add(1);
    }

    /// Writes `msg` as the next datagram into `buf` (cleared first).
    pub fn write(&mut self, msg: &Msg, buf: &mut Vec<u8>) {
        let number = self.next;
        // 2^64 datagrams is beyond any server's life (580,000 years at a million a second);
        // should it come, stop rather than repeat a nonce.
        self.next = number
            .checked_add(1)
            .expect("a feed server never writes 2^64 datagrams");
        buf.clear();
        buf.put_slice(&DGRAM_MAGIC);
        buf.put_u64(self.feed_id);
        buf.put_u64(number);
        self.scratch.clear();
        msg.encode(&mut self.scratch);
        buf.extend_from_slice(&self.scratch);
        if let Some(c) = &self.cipher {
            c.seal(number, DGRAM_HEADER, buf);
        }
    }
}

/// Reads the datagrams of one feed: sealed under its group key, or in clear when the
/// subscriber took a plaintext feed.
#[derive(Debug)]
pub struct DgramReader {
    feed_id: u64,
    cipher: Option<GroupCipher>,
}

impl DgramReader {
    /// The reader of feed `feed_id`; `cipher`: `None` for a plaintext feed.
    pub fn new(feed_id: u64, cipher: Option<GroupCipher>) -> Self {
        Self { feed_id, cipher }
    }

    /// Opens (in place) and decodes datagram `d`. Another feed's datagram (an earlier run of
    /// the server), one in clear to a sealed reader, or one altered or sealed under another
    /// key is an error.
    pub fn read(&self, d: &mut [u8]) -> Result<Msg, MsgError> {
        self.read_numbered(d).map(|(_, m)| m)
    }

    /// As [`DgramReader::read`], with the datagram's number (what a subscriber has heard up
    /// to, told in its counts: [`Msg::Nak`]'s `heard`).
    pub fn read_numbered(&self, d: &mut [u8]) -> Result<(u64, Msg), MsgError> {
        if d.len() < DGRAM_HEADER || d[..4] != DGRAM_MAGIC {
            return Err(MsgError::BadMagic);
        }
        let id = u64::from_be_bytes(d[4..12].try_into().map_err(|_| MsgError::Truncated)?);
        if id != self.feed_id {
            return Err(MsgError::OtherFeed(id));
        }
        let number = u64::from_be_bytes(d[12..20].try_into().map_err(|_| MsgError::Truncated)?);
        let msg = match &self.cipher {
            None => Msg::decode(&d[DGRAM_HEADER..]),
            Some(c) => Msg::decode(c.open(number, DGRAM_HEADER, d).ok_or(MsgError::Unsealed)?),
        }?;
        Ok((number, msg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcast::seal::{GroupKey, KEY_BYTES};
    use bytes::Bytes;
    use std::collections::HashSet;

    fn cipher(b: u8) -> Option<GroupCipher> {
        Some(GroupKey::from_bytes([b; KEY_BYTES]).cipher())
    }

    fn data(body: &'static [u8]) -> Msg {
        Msg::Data {
            seq: 3,
            offset: 1400,
            data: Bytes::from_static(body),
        }
    }

    #[test]
    fn a_sealed_datagram_hides_its_message_and_opens_under_its_key_only() {
        let body = b"recognisable product bytes, recognisable product bytes";
        let mut w = DgramWriter::new(9, cipher(1));
        let mut d = Vec::new();
        w.write(&data(body), &mut d);
        assert!(!d.windows(16).any(|x| x == &body[..16]), "in clear");
        assert_eq!(d.len(), overhead(true) + 21 + body.len());
        let ok = DgramReader::new(9, cipher(1)).read(&mut d.clone());
        assert_eq!(ok, Ok(data(body)));
        // Another key, another feed, a plaintext reader: refused.
        let r = DgramReader::new(9, cipher(2)).read(&mut d.clone());
        assert_eq!(r, Err(MsgError::Unsealed));
        let r = DgramReader::new(8, cipher(1)).read(&mut d.clone());
        assert_eq!(r, Err(MsgError::OtherFeed(9)));
        assert!(DgramReader::new(9, None).read(&mut d.clone()).is_err());
        // Any bit flipped (header included: the associated data), or cut short: refused.
        for i in 0..d.len() {
            let mut t = d.clone();
            t[i] ^= 0x01;
            assert!(DgramReader::new(9, cipher(1)).read(&mut t).is_err(), "{i}");
        }
        for cut in 0..d.len() {
            let r = DgramReader::new(9, cipher(1)).read(&mut d[..cut].to_vec());
            assert!(r.is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn plaintext_datagrams_are_in_clear_and_refused_by_a_sealed_reader() {
        let body = b"plain product bytes";
        let mut w = DgramWriter::new(9, None);
        let mut d = Vec::new();
        w.write(&data(body), &mut d);
        assert!(d.windows(body.len()).any(|x| x == body));
        assert_eq!(
            DgramReader::new(9, None).read(&mut d.clone()),
            Ok(data(body))
        );
        let r = DgramReader::new(9, cipher(1)).read(&mut d.clone());
        assert_eq!(r, Err(MsgError::Unsealed));
        assert_eq!(
            DgramReader::new(9, None)
                .read(&mut b"BCF1\0\0\0\0\0\0\0\x09\0\0\0\0\0\0\0\0\x06".to_vec()),
            Err(MsgError::BadMagic)
        );
    }

    #[test]
    fn every_datagram_of_a_writer_has_its_own_number() {
        // The same message again and again (an index while idle, a repaired symbol): only the
        // number tells them apart, and it does; so does the ciphertext.
        let mut w = DgramWriter::new(9, cipher(1));
        let (mut numbers, mut bodies) = (HashSet::new(), HashSet::new());
        let mut d = Vec::new();
        for i in 0..500u64 {
            let m = match i % 3 {
                0 => Msg::Index { last_seq: 4 },
                1 => data(b"same"),
                _ => Msg::Parity {
                    seq: 3,
                    block: 0,
                    index: 300,
                    data: Bytes::from_static(b"pp"),
                },
            };
            w.write(&m, &mut d);
            assert!(numbers.insert(d[12..20].to_vec()));
            assert!(bodies.insert(d[DGRAM_HEADER..].to_vec()));
        }
        assert_eq!(w.written(), 500);
    }
}
