//! The feed's messages and their encoding: one format for the unicast control/data
//! connection (length-prefixed frames) and for multicast datagrams (one message each, after a
//! header naming the feed and the datagram's number: [`super::seal`]). Every length is
//! checked before use; bad input is an error, never a panic.

use bytes::{BufMut, Bytes, BytesMut};

use super::product::{Micros, ProductMeta, MAX_NAME};
use crate::mcast::msg::Nak;
use crate::mcast::seal::{GroupKey, KEY_BYTES};

/// Largest frame on a unicast connection (a data block plus headers).
pub const MAX_FRAME: usize = (1 << 20) + 4096;

/// Longest server address in the relay tree's messages (`HOST:PORT`), bytes.
pub const MAX_ADDR: usize = 255;
/// Most servers in an ancestry (the chain above a relay), and most relay children listed.
pub const MAX_PEERS: usize = 256;

/// Where a subscriber's stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Only products queued from now on.
    Now,
    /// Every product still queued with this sequence number or later.
    Seq(u64),
    /// Every product still queued created at or after this time.
    Time(Micros),
}

/// One message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// Subscriber to source: what it wants, from where, and whether it can take multicast.
    Subscribe {
        /// Feedtype pattern.
        feedtype: String,
        /// Name regex ("" for any).
        name: String,
        /// Start of the stream.
        start: Start,
        /// The subscriber listens to the source's multicast group.
        multicast: bool,
    },
    /// Source to subscriber: admitted.
    Accepted {
        /// The feed's id (multicast datagrams carry it; it changes at every server start).
        feed_id: u64,
        /// Multicast group `ADDR:PORT` when the subscriber gets multicast, else "".
        group: String,
        /// Multicast block size.
        block: u32,
        /// The first sequence number that multicast carries to this subscriber; earlier
        /// products (the backlog) come over this connection.
        mcast_from: u64,
        /// The first sequence number of this subscriber's stream.
        first: u64,
        /// The key the group's datagrams are sealed under (multicast subscribers only, on
        /// their encrypted connection); `None`: in clear (the source chose `--plaintext`) or
        /// no multicast.
        key: Option<GroupKey>,
    },
    /// Either way: refused or failed, with the reason.
    Refused {
        /// Why.
        reason: String,
    },
    /// A product begins (its blocks follow as [`Msg::Data`]); the source's send time
    /// splits latency into waiting and transmission.
    Product {
        /// What it is.
        meta: ProductMeta,
        /// When the source started sending it.
        sent_at: Micros,
    },
    /// Bytes of a product.
    Data {
        /// Which product.
        seq: u64,
        /// Offset in it.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Source to subscriber: the newest product sent (after each product and when idle), so
    /// a receiver learns that it missed a product even when nothing follows it.
    Index {
        /// Newest sequence number pushed.
        last_seq: u64,
    },
    /// Source to subscriber: these products are not for you (no match, or gone from the
    /// queue before you asked): stop waiting for them.
    Skip {
        /// First skipped.
        from: u64,
        /// Last skipped.
        to: u64,
        /// They had left the queue (a loss the subscriber reports), not merely unwanted.
        gone: bool,
    },
    /// Subscriber to source: send these blocks of a product again (ranges of block indexes).
    Repair {
        /// Which product.
        seq: u64,
        /// `(first block, count)`.
        ranges: Vec<(u32, u32)>,
    },
    /// Subscriber to source: send this whole product over unicast.
    Whole {
        /// Which product.
        seq: u64,
    },
    /// Subscriber to source: send this product's metadata (its start was lost on the group
    /// while its blocks arrive: the blocks need not be sent again).
    Describe {
        /// Which product.
        seq: u64,
    },
    /// Subscriber to source: delivered every wanted product up to here (its lag).
    Ack {
        /// Highest sequence number below which nothing is missing.
        seq: u64,
    },
    /// Subscriber to source: multicast does not arrive here; send everything from `seq` on
    /// over this connection.
    Fallback {
        /// First sequence number to send by unicast.
        seq: u64,
    },
    /// Inserter to source: a product of `size` bytes follows as [`Msg::Data`].
    Insert {
        /// Its name.
        name: String,
        /// Its feedtype.
        feedtype: String,
        /// Its size.
        size: u64,
    },
    /// Source to inserter: queued as `seq`.
    Inserted {
        /// Its sequence number.
        seq: u64,
    },
    /// Ask for the status (subscribers, lag, queue).
    Status,
    /// The status as JSON.
    StatusReply {
        /// JSON text.
        json: String,
    },
    /// Source to a multicast subscriber, after `Accepted`: multicast products are cut into
    /// blocks of `k` symbols (the multicast block size each) and repaired by parity on the
    /// group ([`crate::feed::fec`]). A source that never sends it repairs by unicast only.
    Coding {
        /// Source symbols per block.
        k: u32,
        /// Parity symbols per block before indexes wrap to source symbols again.
        m: u32,
    },
    /// Subscriber to source: how many symbols it still lacks of blocks of product `seq` (a
    /// count per block, not a list: the source sends the worst receiver's count of parity
    /// to the group).
    Nak {
        /// Which product.
        seq: u64,
        /// Per block: one past the highest symbol index seen, symbols still needed.
        blocks: Vec<Nak>,
        /// One past the number of the newest group datagram the subscriber had taken when
        /// it counted (0: none): what the source sent after that is still on its way to it,
        /// however far or slow it is, and is not granted again.
        heard: u64,
    },
    /// A symbol of a product past a block's first pass (on the group): parity, or a source
    /// symbol again once the parity indexes are used up ([`crate::mcast::Layout::slot`]).
    Parity {
        /// Which product.
        seq: u64,
        /// Which block.
        block: u32,
        /// Symbol index in the block (`>= k` of the block).
        index: u32,
        /// The symbol (the multicast block size; a source symbol zero-padded).
        data: Bytes,
    },
    /// Relay to the server it subscribes to, right after `Subscribe` on the same connection:
    /// it is a relay, and other relays reach it at `listen`; it is the server's relay child
    /// for as long as the connection lasts ([`crate::feed::tree`]).
    Relay {
        /// Its address, as its subscribers reach it (`HOST:PORT`).
        listen: String,
    },
    /// Ask a server for its place in the relay tree (first message of a connection).
    Peers,
    /// A server's place in the relay tree.
    PeersReply {
        /// Its allow rules admit the asking host as a subscriber (a relay elsewhere may be
        /// nearer and have room, yet serve its own site only).
        admits: bool,
        /// Relay children it takes at most.
        max_children: u32,
        /// The servers above it, the source first (empty at the source).
        ancestry: Vec<String>,
        /// Its relay children's addresses.
        children: Vec<String>,
        /// The feedtypes it carries (`ANY` at the source) and the names (regex, "" for any):
        /// a relay below it gets only these.
        feedtype: String,
        /// See `feedtype`.
        name: String,
        /// The oldest product it still holds: products below it are gone there.
        floor: u64,
    },
}

/// A message that could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MsgError {
    /// Ends before its fields do.
    #[error("feed message truncated")]
    Truncated,
    /// Unknown type byte.
    #[error("unknown feed message type {0}")]
    UnknownType(u8),
    /// A string or list longer than allowed, or not UTF-8.
    #[error("feed message field too long or malformed")]
    BadField,
    /// Not a bulkcast feed datagram (or one of an older format).
    #[error("not a bulkcast feed datagram")]
    BadMagic,
    /// A datagram of another feed (another server, or an earlier run of this one).
    #[error("datagram of another feed ({0:016x})")]
    OtherFeed(u64),
    /// A datagram that did not open under the group key: altered, sealed under another key,
    /// or in clear while the feed is sealed.
    #[error("feed datagram did not open under the group key")]
    Unsealed,
}

fn put_start(out: &mut BytesMut, start: &Start) {
    let (k, v) = match start {
        Start::Now => (0, 0),
        Start::Seq(s) => (1, *s),
        Start::Time(t) => (2, *t),
    };
    out.put_u8(k);
    out.put_u64(v);
}

/// The group key, or a 0 flag: the group goes in clear.
fn put_key(out: &mut BytesMut, key: Option<&GroupKey>) {
    match key {
        Some(k) => {
            out.put_u8(1);
            out.put_slice(k.bytes());
        }
        None => out.put_u8(0),
    }
}

impl Msg {
    /// Encodes the message body (no length prefix).
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Msg::Subscribe {
                feedtype,
                name,
                start,
                multicast,
            } => {
                out.put_u8(1);
                put_str(out, feedtype);
                put_str(out, name);
                put_start(out, start);
                out.put_u8(u8::from(*multicast));
            }
            Msg::Accepted {
                feed_id,
                group,
                block,
                mcast_from,
                first,
                key,
            } => {
                out.put_u8(2);
                out.put_u64(*feed_id);
                put_str(out, group);
                out.put_u32(*block);
                out.put_u64(*mcast_from);
                out.put_u64(*first);
                put_key(out, key.as_ref());
            }
            Msg::Refused { reason } => {
                out.put_u8(3);
                put_str(out, reason);
            }
            Msg::Product { meta, sent_at } => {
                out.put_u8(4);
                put_meta(out, meta);
                out.put_u64(*sent_at);
            }
            Msg::Data { seq, offset, data } => {
                out.put_u8(5);
                out.put_u64(*seq);
                out.put_u64(*offset);
                out.put_u32(data.len() as u32);
                out.put_slice(data);
            }
            Msg::Index { last_seq } => {
                out.put_u8(6);
                out.put_u64(*last_seq);
            }
            Msg::Skip { from, to, gone } => {
                out.put_u8(7);
                out.put_u64(*from);
                out.put_u64(*to);
                out.put_u8(u8::from(*gone));
            }
            Msg::Repair { seq, ranges } => {
                out.put_u8(8);
                out.put_u64(*seq);
                out.put_u32(ranges.len() as u32);
                for (a, n) in ranges {
                    out.put_u32(*a);
                    out.put_u32(*n);
                }
            }
            Msg::Whole { seq } => put_seq(out, 9, *seq),
            Msg::Ack { seq } => put_seq(out, 10, *seq),
            Msg::Fallback { seq } => put_seq(out, 11, *seq),
            Msg::Insert {
                name,
                feedtype,
                size,
            } => {
                out.put_u8(12);
                put_str(out, name);
                put_str(out, feedtype);
                out.put_u64(*size);
            }
            Msg::Inserted { seq } => put_seq(out, 13, *seq),
            Msg::Status => out.put_u8(14),
            Msg::Describe { seq } => put_seq(out, 16, *seq),
            Msg::StatusReply { json } => {
                out.put_u8(15);
                out.put_u32(json.len() as u32);
                out.put_slice(json.as_bytes());
            }
            Msg::Coding { k, m } => {
                out.put_u8(17);
                out.put_u32(*k);
                out.put_u32(*m);
            }
            Msg::Nak { seq, blocks, heard } => put_nak(out, *seq, *heard, blocks),
            Msg::Parity {
                seq,
                block,
                index,
                data,
            } => put_parity(out, (*seq, *block, *index), data),
            Msg::Relay { listen } => {
                out.put_u8(20);
                put_str(out, listen);
            }
            Msg::Peers => out.put_u8(21),
            Msg::PeersReply {
                admits,
                max_children,
                ancestry,
                children,
                feedtype,
                name,
                floor,
            } => {
                out.put_u8(22);
                out.put_u8(u8::from(*admits));
                out.put_u32(*max_children);
                put_addrs(out, ancestry);
                put_addrs(out, children);
                put_str(out, feedtype);
                put_str(out, name);
                out.put_u64(*floor);
            }
        }
    }

    /// Decodes a message body.
    pub fn decode(b: &[u8]) -> Result<Msg, MsgError> {
        let mut r = Reader(b);
        let t = r.u8()?;
        let m = match t {
            1 => Msg::Subscribe {
                feedtype: r.str()?,
                name: r.str()?,
                start: match (r.u8()?, r.u64()?) {
                    (0, _) => Start::Now,
                    (1, s) => Start::Seq(s),
                    (2, t) => Start::Time(t),
                    _ => return Err(MsgError::BadField),
                },
                multicast: r.u8()? != 0,
            },
            2 => Msg::Accepted {
                feed_id: r.u64()?,
                group: r.str()?,
                block: r.u32()?,
                mcast_from: r.u64()?,
                first: r.u64()?,
                key: match r.u8()? {
                    0 => None,
                    1 => {
                        let mut k = [0u8; KEY_BYTES];
                        k.copy_from_slice(r.take(KEY_BYTES)?);
                        Some(GroupKey::from_bytes(k))
                    }
                    _ => return Err(MsgError::BadField),
                },
            },
            3 => Msg::Refused { reason: r.str()? },
            4 => Msg::Product {
                meta: r.meta()?,
                sent_at: r.u64()?,
            },
            5 => {
                let (seq, offset, n) = (r.u64()?, r.u64()?, r.u32()? as usize);
                Msg::Data {
                    seq,
                    offset,
                    data: Bytes::copy_from_slice(r.take(n)?),
                }
            }
            6 => Msg::Index { last_seq: r.u64()? },
            7 => Msg::Skip {
                from: r.u64()?,
                to: r.u64()?,
                gone: r.u8()? != 0,
            },
            8 => {
                let seq = r.u64()?;
                let n = r.u32()? as usize;
                if n > 65536 {
                    return Err(MsgError::BadField);
                }
                let mut ranges = Vec::with_capacity(n);
                for _ in 0..n {
                    ranges.push((r.u32()?, r.u32()?));
                }
                Msg::Repair { seq, ranges }
            }
            9 => Msg::Whole { seq: r.u64()? },
            10 => Msg::Ack { seq: r.u64()? },
            11 => Msg::Fallback { seq: r.u64()? },
            12 => Msg::Insert {
                name: r.str()?,
                feedtype: r.str()?,
                size: r.u64()?,
            },
            13 => Msg::Inserted { seq: r.u64()? },
            14 => Msg::Status,
            15 => {
                let n = r.u32()? as usize;
                let s = std::str::from_utf8(r.take(n)?).map_err(|_| MsgError::BadField)?;
                Msg::StatusReply {
                    json: s.to_string(),
                }
            }
            16 => Msg::Describe { seq: r.u64()? },
            17 => Msg::Coding {
                k: r.u32()?,
                m: r.u32()?,
            },
            18 => {
                let seq = r.u64()?;
                let heard = r.u64()?;
                let n = r.u32()? as usize;
                if n > 65536 {
                    return Err(MsgError::BadField);
                }
                let mut blocks = Vec::with_capacity(n);
                for _ in 0..n {
                    let (block, seen, need) = (r.u32()?, r.u32()?, r.u32()?);
                    blocks.push(Nak { block, seen, need });
                }
                Msg::Nak { seq, blocks, heard }
            }
            19 => {
                let (seq, block, index, n) = (r.u64()?, r.u32()?, r.u32()?, r.u32()? as usize);
                Msg::Parity {
                    seq,
                    block,
                    index,
                    data: Bytes::copy_from_slice(r.take(n)?),
                }
            }
            20 => Msg::Relay { listen: r.addr()? },
            21 => Msg::Peers,
            22 => Msg::PeersReply {
                admits: r.u8()? != 0,
                max_children: r.u32()?,
                ancestry: r.addrs()?,
                children: r.addrs()?,
                feedtype: r.str()?,
                name: r.str()?,
                floor: r.u64()?,
            },
            t => return Err(MsgError::UnknownType(t)),
        };
        Ok(m)
    }
}

/// The short form of [`Msg::Data`] in a datagram: product and offset in 48 bits each, the
/// length the datagram's.
const DATA_DGRAM: u8 = 40;
/// The short form of [`Msg::Parity`] in a datagram: product in 48 bits, block, index in 16
/// (a block has at most 65,536 symbols, [`crate::mcast::layout::MAX_SYMBOLS`] of each kind).
const PARITY_DGRAM: u8 = 41;
/// Largest value the short forms carry.
const MAX_U48: u64 = (1 << 48) - 1;
/// Bytes of the short forms' headers: every datagram of product bytes pays them
/// ([`super::push`] counts them).
pub const DGRAM_MSG_HEADER: usize = 13;

impl Msg {
    /// Encodes the message for a multicast datagram: data and parity in their short forms
    /// (13 bytes before the bytes, against 21 on a connection, where frames need the length),
    /// every other message, and a value the short form cannot hold, as on a connection.
    pub fn encode_dgram(&self, out: &mut BytesMut) {
        match self {
            Msg::Data { seq, offset, data } if *seq <= MAX_U48 && *offset <= MAX_U48 => {
                out.put_u8(DATA_DGRAM);
                out.put_slice(&seq.to_be_bytes()[2..]);
                out.put_slice(&offset.to_be_bytes()[2..]);
                out.put_slice(data);
            }
            Msg::Parity {
                seq,
                block,
                index,
                data,
            } if *seq <= MAX_U48 && *index <= u32::from(u16::MAX) => {
                out.put_u8(PARITY_DGRAM);
                out.put_slice(&seq.to_be_bytes()[2..]);
                out.put_u32(*block);
                out.put_u16(*index as u16);
                out.put_slice(data);
            }
            m => m.encode(out),
        }
    }

    /// Decodes a datagram's message: the short forms of [`Msg::encode_dgram`], or any message
    /// as on a connection.
    pub fn decode_dgram(b: &[u8]) -> Result<Msg, MsgError> {
        let mut r = Reader(b);
        match r.u8()? {
            DATA_DGRAM => {
                let (seq, offset) = (r.u48()?, r.u48()?);
                Ok(Msg::Data {
                    seq,
                    offset,
                    data: Bytes::copy_from_slice(r.0),
                })
            }
            PARITY_DGRAM => {
                let (seq, block) = (r.u48()?, r.u32()?);
                let index = u32::from(u16::from_be_bytes([r.u8()?, r.u8()?]));
                Ok(Msg::Parity {
                    seq,
                    block,
                    index,
                    data: Bytes::copy_from_slice(r.0),
                })
            }
            _ => Msg::decode(b),
        }
    }
}

fn put_seq(out: &mut BytesMut, t: u8, seq: u64) {
    out.put_u8(t);
    out.put_u64(seq);
}

/// [`Msg::Nak`]'s body.
fn put_nak(out: &mut BytesMut, seq: u64, heard: u64, blocks: &[Nak]) {
    out.put_u8(18);
    out.put_u64(seq);
    out.put_u64(heard);
    out.put_u32(blocks.len() as u32);
    for n in blocks {
        out.put_u32(n.block);
        out.put_u32(n.seen);
        out.put_u32(n.need);
    }
}

/// [`Msg::Parity`]'s body: product, block and symbol index, then the symbol.
fn put_parity(out: &mut BytesMut, (seq, block, index): (u64, u32, u32), data: &[u8]) {
    out.put_u8(19);
    out.put_u64(seq);
    out.put_u32(block);
    out.put_u32(index);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

fn put_str(out: &mut BytesMut, s: &str) {
    // Longer strings never reach here: every producer checks MAX_NAME; truncating keeps the
    // frame decodable should one slip through.
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.put_u16(b.len() as u16);
    out.put_slice(b);
}

/// A list of addresses: a count, then each (at most [`MAX_PEERS`] of [`MAX_ADDR`] bytes:
/// longer lists are cut, as their producers never make them).
fn put_addrs(out: &mut BytesMut, addrs: &[String]) {
    let n = addrs.len().min(MAX_PEERS);
    out.put_u16(n as u16);
    for a in &addrs[..n] {
        let mut end = a.len().min(MAX_ADDR);
        while !a.is_char_boundary(end) {
            end -= 1;
        }
        put_str(out, &a[..end]);
    }
}

fn put_meta(out: &mut BytesMut, m: &ProductMeta) {
    out.put_u64(m.seq);
    put_str(out, &m.name);
    put_str(out, &m.feedtype);
    out.put_u64(m.created);
    out.put_u64(m.size);
    out.put_slice(&m.hash);
    out.put_u8(m.tag.len() as u8);
    out.put_slice(&m.tag[..m.tag.len().min(255)]);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgError> {
        if self.0.len() < n {
            return Err(MsgError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, MsgError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, MsgError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u48(&mut self) -> Result<u64, MsgError> {
        let mut a = [0u8; 8];
        a[2..].copy_from_slice(self.take(6)?);
        Ok(u64::from_be_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, MsgError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    fn str(&mut self) -> Result<String, MsgError> {
        let b = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
        let s = self.take(n)?;
        String::from_utf8(s.to_vec()).map_err(|_| MsgError::BadField)
    }
    /// A server address: non-empty, at most [`MAX_ADDR`] bytes.
    fn addr(&mut self) -> Result<String, MsgError> {
        let s = self.str()?;
        if s.is_empty() || s.len() > MAX_ADDR {
            return Err(MsgError::BadField);
        }
        Ok(s)
    }
    fn addrs(&mut self) -> Result<Vec<String>, MsgError> {
        let b = self.take(2)?;
        let n = usize::from(u16::from_be_bytes([b[0], b[1]]));
        if n > MAX_PEERS {
            return Err(MsgError::BadField);
        }
        (0..n).map(|_| self.addr()).collect()
    }
    fn meta(&mut self) -> Result<ProductMeta, MsgError> {
        let seq = self.u64()?;
        let name = self.str()?;
        let feedtype = self.str()?;
        if name.len() > MAX_NAME || feedtype.len() > MAX_NAME {
            return Err(MsgError::BadField);
        }
        let created = self.u64()?;
        let size = self.u64()?;
        let mut hash = [0u8; 32];
        hash.copy_from_slice(self.take(32)?);
        let n = usize::from(self.u8()?);
        let tag = Bytes::copy_from_slice(self.take(n)?);
        Ok(ProductMeta {
            seq,
            name,
            feedtype,
            created,
            size,
            hash,
            tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::seal::{DgramReader, DgramWriter};
    use super::*;

    #[test]
    fn every_message_round_trips_and_truncation_is_an_error() {
        let meta = ProductMeta {
            seq: 9,
            name: "n".into(),
            feedtype: "NGRID".into(),
            created: 1,
            size: 2,
            hash: [3; 32],
            tag: Bytes::from_static(&[4; 32]),
        };
        let msgs = vec![
            Msg::Subscribe {
                feedtype: "A|B".into(),
                name: "x.*".into(),
                start: Start::Time(5),
                multicast: true,
            },
            Msg::Accepted {
                feed_id: 1,
                group: "239.1.1.1:7000".into(),
                block: 1400,
                mcast_from: 7,
                first: 3,
                key: None,
            },
            Msg::Accepted {
                feed_id: 1,
                group: "239.1.1.1:7000".into(),
                block: 1400,
                mcast_from: 7,
                first: 3,
                key: Some(GroupKey::from_bytes([5; KEY_BYTES])),
            },
            Msg::Refused {
                reason: "no".into(),
            },
            Msg::Product { meta, sent_at: 8 },
            Msg::Data {
                seq: 1,
                offset: 2,
                data: Bytes::from_static(b"abc"),
            },
            Msg::Index { last_seq: 4 },
            Msg::Skip {
                from: 1,
                to: 2,
                gone: true,
            },
            Msg::Repair {
                seq: 3,
                ranges: vec![(0, 2), (5, 1)],
            },
            Msg::Whole { seq: 1 },
            Msg::Describe { seq: 2 },
            Msg::Ack { seq: 1 },
            Msg::Fallback { seq: 1 },
            Msg::Insert {
                name: "a".into(),
                feedtype: "B".into(),
                size: 3,
            },
            Msg::Inserted { seq: 3 },
            Msg::Status,
            Msg::StatusReply { json: "{}".into() },
            Msg::Coding { k: 256, m: 256 },
            Msg::Nak {
                seq: 4,
                blocks: vec![
                    Nak {
                        block: 0,
                        seen: 256,
                        need: 3,
                    },
                    Nak {
                        block: 7,
                        seen: 260,
                        need: 1,
                    },
                ],
                heard: 90_000,
            },
            Msg::Parity {
                seq: 4,
                block: 1,
                index: 258,
                data: Bytes::from_static(b"pq"),
            },
            Msg::Relay {
                listen: "10.0.0.2:5301".into(),
            },
            Msg::Peers,
            Msg::PeersReply {
                admits: true,
                max_children: 8,
                ancestry: vec![],
                children: vec!["a:1".into(), "b:2".into()],
                feedtype: "NEXRAD3|IDS".into(),
                name: "^KTLX".into(),
                floor: 1234,
            },
        ];
        let key = Some(GroupKey::from_bytes([6; KEY_BYTES]));
        for m in msgs {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            assert_eq!(Msg::decode(&b), Ok(m.clone()));
            for cut in 0..b.len() {
                assert!(Msg::decode(&b[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            // As a datagram, in clear and sealed.
            for k in [None, key.clone()] {
                let cipher = k.as_ref().map(GroupKey::cipher);
                let mut d = Vec::new();
                DgramWriter::new(77, cipher.clone()).write(&m, &mut d);
                let got = DgramReader::new(77, cipher).read(&mut d);
                assert_eq!(got, Ok(m.clone()));
            }
        }
        assert_eq!(
            DgramReader::new(77, None).read(&mut b"XXXX0000000000000000\x01".to_vec()),
            Err(MsgError::BadMagic)
        );
        assert_eq!(Msg::decode(&[99]), Err(MsgError::UnknownType(99)));
        // A key flag other than 0 or 1.
        let mut b = BytesMut::new();
        Msg::Accepted {
            feed_id: 1,
            group: String::new(),
            block: 1,
            mcast_from: 1,
            first: 1,
            key: None,
        }
        .encode(&mut b);
        let last = b.len() - 1;
        b[last] = 2;
        assert_eq!(Msg::decode(&b), Err(MsgError::BadField));
    }

    /// The relay tree's messages from a hostile peer: every bound is checked, nothing panics.
    #[test]
    fn malformed_relay_tree_messages_are_errors_not_panics() {
        let enc = |m: &Msg| {
            let mut b = BytesMut::new();
            m.encode(&mut b);
            b.to_vec()
        };
        // An empty address, an address too long, a list too long, a count past the end.
        let empty = vec![20, 0, 0];
        assert_eq!(Msg::decode(&empty), Err(MsgError::BadField));
        assert!(Msg::decode(&[22, 1, 0, 0, 0, 0]).is_err());
        let mut long = vec![20, 1, 0];
        long.extend(std::iter::repeat_n(b'a', 256));
        assert_eq!(Msg::decode(&long), Err(MsgError::BadField));
        let many = [22, 1, 0, 0, 0, 8, 0, 0, 1, 1];
        assert_eq!(Msg::decode(&many), Err(MsgError::BadField));
        let past_end = [22, 1, 0, 0, 0, 8, 0, 0, 0, 200, 0, 1, b'a'];
        assert_eq!(Msg::decode(&past_end), Err(MsgError::Truncated));
        let bad_utf8 = [20, 0, 2, 0xff, 0xfe];
        assert_eq!(Msg::decode(&bad_utf8), Err(MsgError::BadField));
        // What a producer cannot send is cut, never an undecodable frame.
        let huge = Msg::PeersReply {
            admits: false,
            max_children: 1,
            ancestry: vec!["\u{e9}".repeat(200); 2],
            children: vec!["x:1".into(); 300],
            feedtype: "ANY".into(),
            name: String::new(),
            floor: 1,
        };
        match Msg::decode(&enc(&huge)) {
            Ok(Msg::PeersReply {
                ancestry, children, ..
            }) => {
                assert!(ancestry.iter().all(|a| a.len() <= MAX_ADDR), "{ancestry:?}");
                assert_eq!(children.len(), MAX_PEERS);
            }
            other => panic!("{other:?}"),
        }
        // Every byte flipped, every length: an error or a message, never a panic.
        let good = enc(&Msg::PeersReply {
            admits: true,
            max_children: 8,
            ancestry: vec!["s:1".into()],
            children: vec!["a:1".into(), "b:2".into()],
            feedtype: "ANY".into(),
            name: String::new(),
            floor: 7,
        });
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let mut b = good.clone();
            let i = (rng as usize) % b.len();
            b[i] = (rng >> 32) as u8;
            b.truncate(1 + (rng >> 40) as usize % b.len());
            let _ = Msg::decode(&b);
        }
    }
}
