//! The feed's multicast datagrams: numbered, and sealed with AES-256-GCM under the group key
//! ([`crate::mcast::seal`], the file send's cipher) unless both ends chose `--plaintext`.
//!
//! ```text
//! datagram: "F3" | feed:u32 | number:u48 | message (sealed) | tag[16] (sealed only)
//! ```
//!
//! Every byte here is paid in every datagram, so the header is short (12 bytes, 20 before
//! protocol 3) and data and parity go in their short forms ([`Msg::encode_dgram`]): a sealed
//! datagram of 1430 product bytes fills a 1500-byte frame, 0.945 of the wire (0.934 before).
//! `feed` is the feed id's low 32 bits ([`feed_tag`]): it keeps a subscriber off another
//! run's datagrams, and a stray one that matched would still fail its tag (sealed) or its
//! product's hash (plaintext). 48 bits of number last 8 years at a million datagrams a
//! second; the numbering starts again with every start of the server (and a new key).
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

use super::msg::{Msg, MsgError, DGRAM_MSG_HEADER};
use crate::mcast::msg::LAN_PAYLOAD;
use crate::mcast::seal::{GroupCipher, TAG_BYTES};

/// Magic at the start of every feed datagram (3: the short header; 2 was numbered and sealed
/// unless plaintext, with a 20-byte header).
pub const DGRAM_MAGIC: [u8; 2] = *b"F3";
/// Bytes of a datagram's header (magic, feed tag, number).
pub const DGRAM_HEADER: usize = 12;
/// Product bytes per datagram that fill a sealed 1500-byte Ethernet frame with the header,
/// the short form of data or parity and the tag (1430; even, as the parity code needs):
/// `feed serve --block`'s default.
pub const LAN_BLOCK: u32 =
    ((LAN_PAYLOAD - DGRAM_HEADER - DGRAM_MSG_HEADER - TAG_BYTES) & !1) as u32;
/// Datagram numbers a server may use: they travel in 48 bits.
pub const MAX_NUMBER: u64 = (1 << 48) - 1;

/// What a datagram carries of feed id `feed_id`: its low 32 bits.
pub const fn feed_tag(feed_id: u64) -> u32 {
    feed_id as u32
}

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
        // 2^48 datagrams is beyond a server's run (8 years at a million a second, 1,000 at a
        // 100 Mbit/s LAN's rate); should it come, stop rather than repeat a nonce.
        assert!(
            number <= MAX_NUMBER,
            "a feed server never writes 2^48 datagrams in one run"
        );
        self.next = number + 1;
        buf.clear();
        buf.put_slice(&DGRAM_MAGIC);
        buf.put_u32(feed_tag(self.feed_id));
        buf.put_slice(&number.to_be_bytes()[2..]);
        self.scratch.clear();
        msg.encode_dgram(&mut self.scratch);
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
        if d.len() < DGRAM_HEADER || d[..2] != DGRAM_MAGIC {
            return Err(MsgError::BadMagic);
        }
        let tag = u32::from_be_bytes([d[2], d[3], d[4], d[5]]);
        if tag != feed_tag(self.feed_id) {
            return Err(MsgError::OtherFeed(u64::from(tag)));
        }
        let mut n = [0u8; 8];
        n[2..].copy_from_slice(&d[6..12]);
        let number = u64::from_be_bytes(n);
        let msg = match &self.cipher {
            None => Msg::decode_dgram(&d[DGRAM_HEADER..]),
            Some(c) => {
                Msg::decode_dgram(c.open(number, DGRAM_HEADER, d).ok_or(MsgError::Unsealed)?)
            }
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
        assert_eq!(d.len(), overhead(true) + DGRAM_MSG_HEADER + body.len());
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
    fn data_and_parity_fill_a_frame_in_their_short_forms_and_any_value_still_travels() {
        let full = Bytes::from(vec![7u8; LAN_BLOCK as usize]);
        let parity = |seq, index| Msg::Parity {
            seq,
            block: 70_000,
            index,
            data: full.clone(),
        };
        let data = |seq, offset| Msg::Data {
            seq,
            offset,
            data: full.clone(),
        };
        let mut w = DgramWriter::new(5, cipher(3));
        let r = DgramReader::new(5, cipher(3));
        let mut d = Vec::new();
        for m in [data(1 << 40, (1 << 47) + 3), parity(9, 65_535)] {
            w.write(&m, &mut d);
            // The largest datagram fits a 1500-byte frame's UDP payload, with 1 byte to spare.
            assert_eq!(d.len(), LAN_PAYLOAD - 1, "{m:?}");
            assert_eq!(r.read(&mut d.clone()), Ok(m));
        }
        // Values past the short forms go in the long ones: longer, never cut.
        for m in [
            data(1 << 48, 0),
            data(1, 1 << 50),
            parity(1 << 49, 1),
            parity(2, 1 << 16),
        ] {
            w.write(&m, &mut d);
            assert!(d.len() > LAN_PAYLOAD, "{m:?}");
            assert_eq!(r.read(&mut d.clone()), Ok(m));
        }
        // Every other message as on a connection.
        let idx = Msg::Index { last_seq: 1 << 60 };
        w.write(&idx, &mut d);
        assert_eq!(r.read(&mut d), Ok(idx));
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
                .read(&mut b"BCF2\0\0\0\0\0\0\0\x09\0\0\0\0\0\0\0\0\x06".to_vec()),
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
