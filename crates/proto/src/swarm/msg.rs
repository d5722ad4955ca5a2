//! The swarm's control messages, carried on the wire as `Frame::Swarm` (type `0x50`) with a
//! sub-type byte. Pieces travel as ordinary [`Frame::Chunk`](crate::wire::Frame::Chunk)s
//! (data, BLAKE3 hash, MAC tag), so they are verified exactly as pushed chunks are, and
//! requests are the existing [`Frame::Request`](crate::wire::Frame::Request).
//!
//! ```text
//! swarm    = sub:u8 | body
//! Bitfield = 0x01 | pieces:u64 | bits: ceil(pieces/8) bytes, piece i at bit 7-(i%8) of byte i/8
//! Have     = 0x02 | index:u64
//! Cancel   = 0x03 | index:u64
//! Reject   = 0x04 | index:u64
//! Choke 0x05, Unchoke 0x06, Interested 0x07, NotInterested 0x08: no body
//! Complete = 0x09 | node:u32
//! AllDone  = 0x0a
//! Dealt    = 0x0b
//! Cancelled = 0x0c | index:u64
//! ```
//!
//! Like every decoder in [`crate::wire`], [`SwarmMsg::decode`] never trusts a length: a
//! bitfield's byte count is checked against the bytes present before anything is allocated,
//! and bits beyond `pieces` must be zero.

use bytes::{Buf, BufMut, Bytes};

use crate::chunkmap::ChunkMap;
use crate::wire::WireError;

const S_BITFIELD: u8 = 0x01;
const S_HAVE: u8 = 0x02;
const S_CANCEL: u8 = 0x03;
const S_REJECT: u8 = 0x04;
const S_CHOKE: u8 = 0x05;
const S_UNCHOKE: u8 = 0x06;
const S_INTERESTED: u8 = 0x07;
const S_NOT_INTERESTED: u8 = 0x08;
const S_COMPLETE: u8 = 0x09;
const S_ALL_DONE: u8 = 0x0a;
const S_DEALT: u8 = 0x0b;
const S_CANCELLED: u8 = 0x0c;

const WHAT: &str = "Swarm";

/// One swarm control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwarmMsg {
    /// The sender holds these pieces (in addition to what it announced before). MOB sends it
    /// once, from the source; every strategy sends one when a connection opens to a peer
    /// that should know what the sender already holds.
    Bitfield {
        /// Number of pieces the bitmap covers.
        pieces: u64,
        /// `ceil(pieces / 8)` bytes, most significant bit first (BitTorrent's layout).
        bits: Bytes,
    },
    /// The sender now holds piece `index`.
    Have {
        /// Piece index.
        index: u64,
    },
    /// The sender no longer wants piece `index` it requested (it got it elsewhere, or would
    /// rather ask another peer). A request dropped unserved is answered with `Cancelled`.
    Cancel {
        /// Piece index.
        index: u64,
    },
    /// The sender will not serve the request for piece `index` (it does not hold it); the
    /// requester asks someone else.
    Reject {
        /// Piece index.
        index: u64,
    },
    /// BitTorrent baseline: the sender stops serving the recipient's requests and drops
    /// those queued.
    Choke,
    /// BitTorrent baseline: the sender will serve the recipient's requests.
    Unchoke,
    /// BitTorrent baseline: the sender wants pieces the recipient has.
    Interested,
    /// BitTorrent baseline: the sender wants nothing the recipient has.
    NotInterested,
    /// Completion (MOB's phase 4): every node of `node`'s subtree of the acknowledgement tree
    /// holds every piece. Travels up the binary acknowledgement tree.
    Complete {
        /// Root of the completed subtree (the sender).
        node: u32,
    },
    /// Every member holds every piece: stop serving. Travels down the acknowledgement tree
    /// from the source.
    AllDone,
    /// Hybrid: every piece has left the source's cluster once (the source tells its cluster
    /// mates): from now on they serve other clusters too.
    Dealt,
    /// The answer to a `Cancel` that came before the piece was served: the sender dropped the
    /// request and will not send piece `index`, so the requester may ask someone else without
    /// a second copy arriving.
    Cancelled {
        /// Piece index.
        index: u64,
    },
}

impl SwarmMsg {
    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            SwarmMsg::Bitfield { .. } => "Bitfield",
            SwarmMsg::Have { .. } => "Have",
            SwarmMsg::Cancel { .. } => "Cancel",
            SwarmMsg::Reject { .. } => "Reject",
            SwarmMsg::Choke => "Choke",
            SwarmMsg::Unchoke => "Unchoke",
            SwarmMsg::Interested => "Interested",
            SwarmMsg::NotInterested => "NotInterested",
            SwarmMsg::Complete { .. } => "Complete",
            SwarmMsg::AllDone => "AllDone",
            SwarmMsg::Dealt => "Dealt",
            SwarmMsg::Cancelled { .. } => "Cancelled",
        }
    }

    /// A bitfield of the pieces below `pieces` that `f` says are held.
    pub fn bitfield(pieces: u64, f: impl Fn(u64) -> bool) -> SwarmMsg {
        let mut bits = vec![0u8; pieces.div_ceil(8) as usize];
        for i in 0..pieces {
            if f(i) {
                bits[(i / 8) as usize] |= 0x80 >> (i % 8);
            }
        }
        SwarmMsg::Bitfield {
            pieces,
            bits: Bytes::from(bits),
        }
    }

    /// A bitfield of the pieces a [`ChunkMap`] holds, below `pieces`.
    pub fn bitfield_of(map: &ChunkMap, pieces: u64) -> SwarmMsg {
        Self::bitfield(pieces, |i| map.contains(i))
    }

    /// For a `Bitfield`, the pieces it holds in increasing order (empty for other messages).
    pub fn bitfield_pieces(&self) -> Vec<u64> {
        match self {
            SwarmMsg::Bitfield { pieces, bits } => (0..*pieces)
                .filter(|&i| {
                    bits.get((i / 8) as usize)
                        .is_some_and(|b| b & (0x80 >> (i % 8)) != 0)
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Appends the message (sub-type and body) to a frame under construction.
    pub fn encode<B: BufMut>(&self, b: &mut B) {
        match self {
            SwarmMsg::Bitfield { pieces, bits } => {
                b.put_u8(S_BITFIELD);
                b.put_u64(*pieces);
                b.put_slice(bits);
            }
            SwarmMsg::Have { index } => {
                b.put_u8(S_HAVE);
                b.put_u64(*index);
            }
            SwarmMsg::Cancel { index } => {
                b.put_u8(S_CANCEL);
                b.put_u64(*index);
            }
            SwarmMsg::Reject { index } => {
                b.put_u8(S_REJECT);
                b.put_u64(*index);
            }
            SwarmMsg::Choke => b.put_u8(S_CHOKE),
            SwarmMsg::Unchoke => b.put_u8(S_UNCHOKE),
            SwarmMsg::Interested => b.put_u8(S_INTERESTED),
            SwarmMsg::NotInterested => b.put_u8(S_NOT_INTERESTED),
            SwarmMsg::Complete { node } => {
                b.put_u8(S_COMPLETE);
                b.put_u32(*node);
            }
            SwarmMsg::AllDone => b.put_u8(S_ALL_DONE),
            SwarmMsg::Dealt => b.put_u8(S_DEALT),
            SwarmMsg::Cancelled { index } => {
                b.put_u8(S_CANCELLED);
                b.put_u64(*index);
            }
        }
    }

    /// Decodes a message from the rest of a frame body, consuming what it reads; the caller
    /// checks that nothing trails.
    pub fn decode(b: &mut Bytes) -> Result<SwarmMsg, WireError> {
        fn need(b: &Bytes, n: usize) -> Result<(), WireError> {
            if b.remaining() < n {
                Err(WireError::Truncated(WHAT))
            } else {
                Ok(())
            }
        }
        need(b, 1)?;
        let sub = b.get_u8();
        let index = |b: &mut Bytes| -> Result<u64, WireError> {
            need(b, 8)?;
            Ok(b.get_u64())
        };
        Ok(match sub {
            S_BITFIELD => {
                need(b, 8)?;
                let pieces = b.get_u64();
                let n = pieces.div_ceil(8);
                if n > b.remaining() as u64 {
                    return Err(WireError::Truncated(WHAT));
                }
                let bits = b.split_to(n as usize);
                if !pieces.is_multiple_of(8) {
                    let last = bits[bits.len() - 1];
                    if last & (0xff >> (pieces % 8)) != 0 {
                        return Err(WireError::BadValue(
                            WHAT,
                            "bitfield bits beyond the last piece",
                        ));
                    }
                }
                SwarmMsg::Bitfield { pieces, bits }
            }
            S_HAVE => SwarmMsg::Have { index: index(b)? },
            S_CANCEL => SwarmMsg::Cancel { index: index(b)? },
            S_REJECT => SwarmMsg::Reject { index: index(b)? },
            S_CHOKE => SwarmMsg::Choke,
            S_UNCHOKE => SwarmMsg::Unchoke,
            S_INTERESTED => SwarmMsg::Interested,
            S_NOT_INTERESTED => SwarmMsg::NotInterested,
            S_COMPLETE => {
                need(b, 4)?;
                SwarmMsg::Complete { node: b.get_u32() }
            }
            S_ALL_DONE => SwarmMsg::AllDone,
            S_DEALT => SwarmMsg::Dealt,
            S_CANCELLED => SwarmMsg::Cancelled { index: index(b)? },
            _ => return Err(WireError::BadValue(WHAT, "unknown swarm message")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{decode_from, Frame, MAX_FRAME};
    use bytes::BytesMut;

    fn samples() -> Vec<SwarmMsg> {
        vec![
            SwarmMsg::bitfield(13, |i| i % 3 == 0),
            SwarmMsg::bitfield(16, |_| true),
            SwarmMsg::bitfield(0, |_| true),
            SwarmMsg::Have { index: 7 },
            SwarmMsg::Cancel { index: 8 },
            SwarmMsg::Reject { index: 9 },
            SwarmMsg::Choke,
            SwarmMsg::Unchoke,
            SwarmMsg::Interested,
            SwarmMsg::NotInterested,
            SwarmMsg::Complete { node: 12 },
            SwarmMsg::AllDone,
            SwarmMsg::Dealt,
            SwarmMsg::Cancelled { index: 10 },
        ]
    }

    #[test]
    fn every_swarm_message_round_trips_as_a_frame() {
        for m in samples() {
            let f = Frame::Swarm(m.clone());
            let wire = f.encode().to_vec();
            let back = decode_from(&mut BytesMut::from(&wire[..]), MAX_FRAME)
                .unwrap()
                .unwrap();
            assert_eq!(back, f, "{}", m.kind());
        }
        let bf = SwarmMsg::bitfield(13, |i| i % 3 == 0);
        assert_eq!(bf.bitfield_pieces(), vec![0, 3, 6, 9, 12]);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for m in samples() {
            let wire = Frame::Swarm(m.clone()).encode().to_vec();
            let body = &wire[4..];
            for cut in 0..body.len() {
                let res = Frame::decode(Bytes::copy_from_slice(&body[..cut]));
                assert!(res.is_err(), "{} cut at {cut} decoded", m.kind());
            }
        }
    }
}
