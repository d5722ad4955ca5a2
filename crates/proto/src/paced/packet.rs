//! Datagram formats. Every datagram: magic (2 bytes), kind (1), connection id (4), then the
//! kind's fields, all big-endian. Lengths are checked before any field is read.

use bytes::{Buf, BufMut};

/// First two bytes of every datagram; a new value for each change of the formats, so that
/// peers of two builds ignore each other's datagrams (a connect times out, and `--transport
/// auto` uses TCP) instead of misreading them. 0xBC75: ACKs without `recv_us`.
pub const MAGIC: u16 = 0xBC76;
/// Bytes before a kind's fields.
pub const COMMON_LEN: usize = 7;
/// Bytes of a DATA header (common, packet number, offset, flags).
pub const DATA_HEADER_LEN: usize = COMMON_LEN + 8 + 8 + 1;
/// Packet numbers an ACK's bitmap covers below its largest.
pub const ACK_BITS: u64 = 256;
/// Bytes of an ACK.
pub const ACK_LEN: usize = COMMON_LEN + 8 + 4 + 4 + 8 + (ACK_BITS as usize / 8);
/// Bytes of a CLOSE.
pub const CLOSE_LEN: usize = COMMON_LEN + 1;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_CLOSE: u8 = 3;
const FLAG_FIN: u8 = 1;

/// A datagram that is not one of ours, or is cut short.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than its kind needs.
    #[error("datagram of {0} bytes is too short")]
    Short(usize),
    /// Does not start with [`MAGIC`].
    #[error("not a bulkcast datagram")]
    Magic,
    /// A kind this version does not know.
    #[error("unknown datagram kind {0}")]
    Kind(u8),
}

/// Why a connection was closed, as sent in CLOSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseCode {
    /// The application gave up on the connection.
    Aborted,
    /// The peer broke the protocol.
    Protocol,
    /// Nothing was heard for the idle timeout.
    Idle,
    /// A code this version does not know.
    Other(u8),
}

impl CloseCode {
    fn to_u8(self) -> u8 {
        match self {
            CloseCode::Aborted => 0,
            CloseCode::Protocol => 1,
            CloseCode::Idle => 2,
            CloseCode::Other(c) => c,
        }
    }

    fn from_u8(c: u8) -> Self {
        match c {
            0 => CloseCode::Aborted,
            1 => CloseCode::Protocol,
            2 => CloseCode::Idle,
            c => CloseCode::Other(c),
        }
    }
}

/// One parsed datagram; `payload` borrows the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Stream bytes `offset..offset + payload.len()`; `fin`: the stream ends after them.
    Data {
        /// Packet number: new for every datagram sent, retransmissions included.
        pn: u64,
        /// Stream offset of the first payload byte.
        offset: u64,
        /// The sender's stream ends at `offset + payload.len()`.
        fin: bool,
        /// The bytes.
        payload: &'a [u8],
    },
    /// Which DATA packets arrived.
    Ack(Ack),
    /// The connection is over.
    Close(CloseCode),
}

/// Acknowledgement of DATA packets: `largest` and the [`ACK_BITS`] packet numbers below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Largest packet number received.
    pub largest: u64,
    /// Microseconds between receiving `largest` and sending this ACK.
    pub delay_us: u32,
    /// When `largest` arrived, in microseconds of the receiver's own clock (wrapping; its
    /// origin is the receiver's). Against the time the sender sent it, this is the forward
    /// delay plus a constant: what the sender reads its own queue from, blind to the queue
    /// its ACKs wait in on the way back (see [`super::rate`]).
    pub recv_us: u32,
    /// The receiver accepts stream bytes below this offset (flow control).
    pub max_data: u64,
    /// Bit `i` (LSB first within bytes): packet `largest - 1 - i` arrived.
    pub bits: [u8; ACK_BITS as usize / 8],
}

impl Ack {
    /// Whether packet `pn` is acknowledged by this ACK.
    pub fn covers(&self, pn: u64) -> bool {
        if pn == self.largest {
            return true;
        }
        if pn > self.largest || self.largest - pn > ACK_BITS {
            return false;
        }
        let i = (self.largest - 1 - pn) as usize;
        self.bits[i / 8] & (1 << (i % 8)) != 0
    }
}

/// Parses a datagram; returns its connection id and contents.
pub fn decode(d: &[u8]) -> Result<(u32, Packet<'_>), PacketError> {
    if d.len() < COMMON_LEN {
        return Err(PacketError::Short(d.len()));
    }
    let mut b = d;
    if b.get_u16() != MAGIC {
        return Err(PacketError::Magic);
    }
    let kind = b.get_u8();
    let conn = b.get_u32();
    let p = match kind {
        KIND_DATA => {
            if d.len() < DATA_HEADER_LEN {
                return Err(PacketError::Short(d.len()));
            }
            let pn = b.get_u64();
            let offset = b.get_u64();
            let fin = b.get_u8() & FLAG_FIN != 0;
            Packet::Data {
                pn,
                offset,
                fin,
                payload: b,
            }
        }
        KIND_ACK => {
            if d.len() < ACK_LEN {
                return Err(PacketError::Short(d.len()));
            }
            let largest = b.get_u64();
            let delay_us = b.get_u32();
            let recv_us = b.get_u32();
            let max_data = b.get_u64();
            let mut bits = [0u8; ACK_BITS as usize / 8];
            b.copy_to_slice(&mut bits);
            Packet::Ack(Ack {
                largest,
                delay_us,
                recv_us,
                max_data,
                bits,
            })
        }
        KIND_CLOSE => {
            if d.len() < CLOSE_LEN {
                return Err(PacketError::Short(d.len()));
            }
            Packet::Close(CloseCode::from_u8(b.get_u8()))
        }
        k => return Err(PacketError::Kind(k)),
    };
    Ok((conn, p))
}

/// The connection id of a datagram, if it is one of ours (what a listener demultiplexes on).
pub fn conn_id(d: &[u8]) -> Option<u32> {
    (d.len() >= COMMON_LEN && d[..2] == MAGIC.to_be_bytes())
        .then(|| u32::from_be_bytes([d[3], d[4], d[5], d[6]]))
}

fn common(out: &mut Vec<u8>, kind: u8, conn: u32) {
    out.put_u16(MAGIC);
    out.put_u8(kind);
    out.put_u32(conn);
}

/// Appends a DATA datagram to `out`.
pub fn encode_data(out: &mut Vec<u8>, conn: u32, pn: u64, offset: u64, fin: bool, payload: &[u8]) {
    common(out, KIND_DATA, conn);
    out.put_u64(pn);
    out.put_u64(offset);
    out.put_u8(if fin { FLAG_FIN } else { 0 });
    out.extend_from_slice(payload);
}

/// Appends an ACK datagram to `out`.
pub fn encode_ack(out: &mut Vec<u8>, conn: u32, ack: &Ack) {
    common(out, KIND_ACK, conn);
    out.put_u64(ack.largest);
    out.put_u32(ack.delay_us);
    out.put_u32(ack.recv_us);
    out.put_u64(ack.max_data);
    out.extend_from_slice(&ack.bits);
}

/// Appends a CLOSE datagram to `out`.
pub fn encode_close(out: &mut Vec<u8>, conn: u32, code: CloseCode) {
    common(out, KIND_CLOSE, conn);
    out.put_u8(code.to_u8());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_what_is_cut_short() {
        let mut d = Vec::new();
        encode_data(&mut d, 9, 42, 1 << 40, true, b"hello");
        assert_eq!(d.len(), DATA_HEADER_LEN + 5);
        assert_eq!(conn_id(&d), Some(9));
        assert_eq!(
            decode(&d),
            Ok((
                9,
                Packet::Data {
                    pn: 42,
                    offset: 1 << 40,
                    fin: true,
                    payload: b"hello"
                }
            ))
        );
        let mut ack = Ack {
            largest: 1000,
            delay_us: 7,
            recv_us: u32::MAX - 3,
            max_data: 5,
            bits: [0; 32],
        };
        ack.bits[0] = 0b101; // 999 and 997
        ack.bits[31] = 0x80; // 1000 - 256 = 744
        let mut a = Vec::new();
        encode_ack(&mut a, 9, &ack);
        assert_eq!(a.len(), ACK_LEN);
        let Ok((9, Packet::Ack(back))) = decode(&a) else {
            panic!("{:?}", decode(&a))
        };
        assert_eq!(back, ack);
        let covered: Vec<u64> = (0..1100).filter(|&p| back.covers(p)).collect();
        assert_eq!(covered, vec![744, 997, 999, 1000]);
        for n in 0..DATA_HEADER_LEN {
            assert!(decode(&d[..n]).is_err(), "{n}");
        }
        for n in 0..ACK_LEN {
            assert!(decode(&a[..n]).is_err(), "{n}");
        }
        d[0] ^= 1;
        assert_eq!(decode(&d), Err(PacketError::Magic));
        assert_eq!(conn_id(&d), None);
        let mut k = Vec::new();
        common(&mut k, 77, 1);
        assert_eq!(decode(&k), Err(PacketError::Kind(77)));
    }
}
