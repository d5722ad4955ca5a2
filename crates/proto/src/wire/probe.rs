//! Network probing for the planner: round trips (`Ping`, `Pong`, and `Probe` answered by
//! `Probed`) and bandwidth (`BwProbe` answered by `BwResult`; `Sink` and `SinkReport` between
//! the agents that measure).

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{put_str, Reader};
use super::*;

/// An RTT that could not be measured, in a `Probed` frame.
pub const UNREACHABLE: u32 = u32::MAX;

/// Encodes a probe frame's type and body into `b`; returns a chunk's data, if any.
pub(super) fn encode(f: &Frame, b: &mut BytesMut) -> Bytes {
    match f {
        Frame::Ping { nonce } => {
            b.put_u8(T_PING);
            b.put_u64(*nonce);
        }
        Frame::Pong { nonce } => {
            b.put_u8(T_PONG);
            b.put_u64(*nonce);
        }
        Frame::Probe {
            samples,
            timeout_ms,
            targets,
        } => {
            b.put_u8(T_PROBE);
            b.put_u16(*samples);
            b.put_u32(*timeout_ms);
            b.put_u32(targets.len() as u32);
            for t in targets {
                put_str(b, t);
            }
        }
        Frame::Probed { rtt_us } => {
            b.put_u8(T_PROBED);
            b.put_u32(rtt_us.len() as u32);
            for r in rtt_us {
                b.put_u32(*r);
            }
        }
        Frame::BwProbe { target, millis } => {
            b.put_u8(T_BWPROBE);
            put_str(b, target);
            b.put_u32(*millis);
        }
        Frame::BwResult { kbps } => {
            b.put_u8(T_BWRESULT);
            b.put_u32(*kbps);
        }
        Frame::Sink => b.put_u8(T_SINK),
        Frame::SinkReport { bytes, micros } => {
            b.put_u8(T_SINKREPORT);
            b.put_u64(*bytes);
            b.put_u64(*micros);
        }
        other => unreachable!("{} is not a probe frame", other.kind()),
    }
    Bytes::new()
}

/// Decodes the body of a probe frame of type `ty`.
pub(super) fn decode(ty: u8, r: &mut Reader) -> Result<Frame, WireError> {
    Ok(match ty {
        T_PING => {
            r.what = "Ping";
            Frame::Ping { nonce: r.u64()? }
        }
        T_PONG => {
            r.what = "Pong";
            Frame::Pong { nonce: r.u64()? }
        }
        T_PROBE => {
            r.what = "Probe";
            let samples = r.u16()?;
            let timeout_ms = r.u32()?;
            let n = r.count(4)?;
            let mut targets = Vec::with_capacity(n);
            for _ in 0..n {
                targets.push(r.string()?);
            }
            Frame::Probe {
                samples,
                timeout_ms,
                targets,
            }
        }
        T_PROBED => {
            r.what = "Probed";
            let n = r.count(4)?;
            let mut rtt_us = Vec::with_capacity(n);
            for _ in 0..n {
                rtt_us.push(r.u32()?);
            }
            Frame::Probed { rtt_us }
        }
        T_BWPROBE => {
            r.what = "BwProbe";
            Frame::BwProbe {
                target: r.string()?,
                millis: r.u32()?,
            }
        }
        T_BWRESULT => {
            r.what = "BwResult";
            Frame::BwResult { kbps: r.u32()? }
        }
        T_SINK => Frame::Sink,
        T_SINKREPORT => {
            r.what = "SinkReport";
            Frame::SinkReport {
                bytes: r.u64()?,
                micros: r.u64()?,
            }
        }
        other => return Err(WireError::UnknownType(other)),
    })
}
