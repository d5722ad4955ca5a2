//! Feedback that flows up a tree: progress (`Ack`), what a node already holds (`Have`), its
//! end (`Done`, `Failed`), and a rejected chunk (`Rejected`).

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{put_str, Reader};
use super::*;

/// Encodes a report frame's type and body into `b`; returns a chunk's data, if any.
pub(super) fn encode(f: &Frame, b: &mut BytesMut) -> Bytes {
    match f {
        Frame::Ack { node, upto } => {
            b.put_u8(T_ACK);
            b.put_u32(*node);
            b.put_u64(*upto);
        }
        Frame::Done { node, received } => {
            b.put_u8(T_DONE);
            b.put_u32(*node);
            b.put_u64(*received);
        }
        Frame::Have {
            node,
            complete,
            ranges,
        } => {
            b.put_u8(T_HAVE);
            b.put_u32(*node);
            b.put_u8(u8::from(*complete));
            b.put_u32(ranges.len() as u32);
            for (s, e) in ranges {
                b.put_u64(*s);
                b.put_u64(*e);
            }
        }
        Frame::Failed { node, reason } => {
            b.put_u8(T_FAILED);
            b.put_u32(*node);
            put_str(b, reason);
        }
        Frame::Rejected { node, from, index } => {
            b.put_u8(T_REJECTED);
            b.put_u32(*node);
            b.put_u32(*from);
            b.put_u64(*index);
        }
        other => unreachable!("{} is not a report frame", other.kind()),
    }
    Bytes::new()
}

/// Decodes the body of a report frame of type `ty`.
pub(super) fn decode(ty: u8, r: &mut Reader) -> Result<Frame, WireError> {
    Ok(match ty {
        T_ACK => {
            r.what = "Ack";
            Frame::Ack {
                node: r.u32()?,
                upto: r.u64()?,
            }
        }
        T_DONE => {
            r.what = "Done";
            Frame::Done {
                node: r.u32()?,
                received: r.u64()?,
            }
        }
        T_HAVE => {
            r.what = "Have";
            let node = r.u32()?;
            let complete = r.u8()? != 0;
            let n = r.count(16)?;
            let mut ranges = Vec::with_capacity(n);
            let mut last = 0;
            for _ in 0..n {
                let (s, e) = (r.u64()?, r.u64()?);
                if s < last || e <= s {
                    return Err(WireError::BadValue("Have", "ranges not ascending"));
                }
                last = e;
                ranges.push((s, e));
            }
            Frame::Have {
                node,
                complete,
                ranges,
            }
        }
        T_FAILED => {
            r.what = "Failed";
            Frame::Failed {
                node: r.u32()?,
                reason: r.string()?,
            }
        }
        T_REJECTED => {
            r.what = "Rejected";
            Frame::Rejected {
                node: r.u32()?,
                from: r.u32()?,
                index: r.u64()?,
            }
        }
        other => return Err(WireError::UnknownType(other)),
    })
}
