//! A multicast send's control messages (`Mcast`, encoded by [`crate::mcast::msg`]).

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::Reader;
use super::*;
use crate::mcast::msg::McastMsg;

/// Encodes an `Mcast` frame.
pub(super) fn encode(m: &McastMsg, b: &mut BytesMut) -> Bytes {
    b.put_u8(T_MCAST);
    m.encode(b);
    Bytes::new()
}

/// Decodes the body of an `Mcast` frame.
pub(super) fn decode(r: &mut Reader) -> Result<Frame, WireError> {
    r.what = "Mcast";
    Ok(Frame::Mcast(McastMsg::decode(&mut r.b)?))
}
