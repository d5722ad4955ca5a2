//! The handshake: `Hello`, then `Noise` messages (or `Refused`); `Challenge` and `Auth` are
//! protocol version 3's and no longer sent; `Join` asks a source by ticket to be included.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{put_str, Reader};
use super::*;

/// Encodes a handshake frame's type and body into `b`; returns a chunk's data, if any.
pub(super) fn encode(f: &Frame, b: &mut BytesMut) -> Bytes {
    match f {
        Frame::Hello { version, nonce } => {
            b.put_u8(T_HELLO);
            b.put_slice(&MAGIC);
            b.put_u16(*version);
            b.put_slice(nonce);
        }
        Frame::Challenge { nonce, mac } => {
            b.put_u8(T_CHALLENGE);
            b.put_slice(nonce);
            b.put_slice(mac);
        }
        Frame::Auth { mac } => {
            b.put_u8(T_AUTH);
            b.put_slice(mac);
        }
        Frame::Refused { reason } => {
            b.put_u8(T_REFUSED);
            put_str(b, reason);
        }
        Frame::Noise { mode, msg } => {
            b.put_u8(T_NOISE);
            b.put_u8(*mode);
            // A Noise message is at most 65535 bytes.
            b.put_u16(msg.len().min(usize::from(u16::MAX)) as u16);
            b.put_slice(&msg[..msg.len().min(usize::from(u16::MAX))]);
        }
        Frame::Join { name, listen } => {
            b.put_u8(T_JOIN);
            put_str(b, name);
            put_str(b, listen);
        }
        other => unreachable!("{} is not a handshake frame", other.kind()),
    }
    Bytes::new()
}

/// Decodes the body of a handshake frame of type `ty`.
pub(super) fn decode(ty: u8, r: &mut Reader) -> Result<Frame, WireError> {
    Ok(match ty {
        T_HELLO => {
            r.what = "Hello";
            if r.array::<4>()? != MAGIC {
                return Err(WireError::BadMagic);
            }
            Frame::Hello {
                version: r.u16()?,
                nonce: r.array()?,
            }
        }
        T_CHALLENGE => {
            r.what = "Challenge";
            Frame::Challenge {
                nonce: r.array()?,
                mac: r.array()?,
            }
        }
        T_AUTH => {
            r.what = "Auth";
            Frame::Auth { mac: r.array()? }
        }
        T_REFUSED => {
            r.what = "Refused";
            Frame::Refused {
                reason: r.string()?,
            }
        }
        T_NOISE => {
            r.what = "Noise";
            let mode = r.u8()?;
            let n = usize::from(r.u16()?);
            r.need(n)?;
            Frame::Noise {
                mode,
                msg: r.b.split_to(n),
            }
        }
        T_JOIN => {
            r.what = "Join";
            Frame::Join {
                name: r.string()?,
                listen: r.string()?,
            }
        }
        other => return Err(WireError::UnknownType(other)),
    })
}
