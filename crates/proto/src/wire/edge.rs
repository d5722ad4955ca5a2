//! Edges over several connections (see [`crate::multipath`]): how a session's edges are
//! carried ([`EdgeMode`], announced in `Open`), and the frames of a spread edge (`Attach` a
//! connection, `Spread` frames of the edge's sequence, `Got` back).

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::Reader;
use super::*;

/// How the edges of a session are carried: connections per edge and how frames are dealt to
/// them (see [`crate::multipath`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeMode {
    /// Connections per edge; 0: start with one and add more while that adds throughput.
    pub streams: u16,
    /// Which scheduler deals frames to the connections.
    pub scheduler: EdgeScheduler,
}

impl Default for EdgeMode {
    /// One connection per edge: no spreading.
    fn default() -> Self {
        Self {
            streams: 1,
            scheduler: EdgeScheduler::Pull,
        }
    }
}

impl EdgeMode {
    /// Whether edges are spread over connections (more than one, or automatic).
    pub fn is_striped(&self) -> bool {
        self.streams != 1
    }

    /// What automatic spreading (`streams` 0) comes to for a session whose hops use congestion
    /// control `cc` (`auto`: bbr, cubic once the path shows no random loss, [`crate::cc`]), where
    /// `multipath` says whether some host has more than one address.
    ///
    /// A model-based control (`bbr`) keeps one path full with one connection, under random loss
    /// too, so there every edge is one plain connection: more connections to the same
    /// bottleneck only share its queue, and the child puts their frames back in order. On the
    /// lab's 100 Mbit/s star (2026-11-26, `bench/lab-run star-8`) a chain of 8 finished with
    /// its receivers 0.06 s apart on plain edges and 0.2-0.3 s apart per hop with automatic
    /// spreading, which had added a second connection at the source. Spreading stays where it
    /// pays: loss-based control on long round trips (seed 002), and several paths.
    pub fn for_session(self, cc: &str, multipath: bool) -> EdgeMode {
        if self.streams == 0 && (cc == "bbr" || cc == "auto") && !multipath {
            EdgeMode { streams: 1, ..self }
        } else {
            self
        }
    }
}

/// The multi-stream schedulers (see [`crate::multipath::Scheduler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EdgeScheduler {
    /// Each connection takes the next frame when its socket has room.
    Pull,
    /// Seed 002's weighted fork-join with its re-weighting controller.
    Weighted,
    /// Seed 002's unweighted fork-join (equal blocks).
    Equal,
}

/// Encodes an edge frame's type and body into `b`; returns a chunk's data, if any.
pub(super) fn encode(f: &Frame, b: &mut BytesMut) -> Bytes {
    let mut data = Bytes::new();
    match f {
        Frame::Attach {
            session,
            token,
            conn,
            window,
        } => {
            b.put_u8(T_ATTACH);
            b.put_u64(*session);
            b.put_u64(*token);
            b.put_u16(*conn);
            b.put_u32(*window);
        }
        Frame::Spread { seq, inner } => {
            // The inner frame's type and body follow the sequence number; its data (a
            // chunk's bytes) stays a separate part, so wrapping copies nothing.
            b.put_u8(T_SPREAD);
            b.put_u64(*seq);
            let e = inner.encode();
            b.put_slice(&e.head[4..]);
            data = e.data;
        }
        Frame::Got { seq } => {
            b.put_u8(T_GOT);
            b.put_u64(*seq);
        }
        other => unreachable!("{} is not an edge frame", other.kind()),
    }
    data
}

/// Decodes the body of an edge frame of type `ty`.
pub(super) fn decode(ty: u8, r: &mut Reader) -> Result<Frame, WireError> {
    Ok(match ty {
        T_ATTACH => {
            r.what = "Attach";
            Frame::Attach {
                session: r.u64()?,
                token: r.u64()?,
                conn: r.u16()?,
                window: r.u32()?,
            }
        }
        T_SPREAD => {
            r.what = "Spread";
            let seq = r.u64()?;
            let inner = std::mem::take(&mut r.b);
            if inner.first() == Some(&T_SPREAD) {
                return Err(WireError::BadValue("Spread", "nested"));
            }
            return Ok(Frame::Spread {
                seq,
                inner: Box::new(Frame::decode(inner)?),
            });
        }
        T_GOT => {
            r.what = "Got";
            Frame::Got { seq: r.u64()? }
        }
        other => return Err(WireError::UnknownType(other)),
    })
}
