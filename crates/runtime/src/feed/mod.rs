//! Feeds on the network: the source's server with its queue on disk, subscribers, inserts.
//!
//! - [`disk`]: the product queue on disk (one data file and one metadata file per product),
//!   restored at start so sequence numbers and backlogs survive restarts.
//! - [`serve`]: `feed serve`: the listener, every subscriber's connection, inserts and
//!   status; `pace` (private): the thread that paces the multicast group.
//! - [`client`]: `feed subscribe`, `feed insert`, `feed status`.
//! - [`relay`]: `feed serve --upstream`: a site's relay, fed by a subscription upstream.
//! - [`ingest`], [`watch`]: `feed insert --stdin` framing and `--watch DIR` readiness.
//! - [`metrics`]: a feed source's Prometheus metrics (`feed serve --metrics`).
//! - [`backoff`]: when a subscriber tries a lost connection again.
//! - [`request`]: an agent's subscriptions, the `[[feed]]` lines of its config (LDM's
//!   `REQUEST`).
//!
//! Unicast connections carry length-prefixed [`Msg`] frames after the session handshake,
//! encrypted by it unless both ends chose `--plaintext`; multicast datagrams carry one message
//! each, numbered and sealed under the group key that `feed serve` draws at every start
//! ([`bulkcast_proto::feed::seal`]).

pub mod backoff;
pub mod client;
pub mod disk;
pub mod ingest;
pub mod metrics;
mod pace;
pub mod relay;
pub mod request;
pub mod serve;
pub mod tree;
pub mod watch;

use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use bulkcast_proto::feed::msg::{Msg, MAX_FRAME};
use bulkcast_proto::feed::product::Micros;
use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::transport::WriteHalf;

/// The default port of `feed serve` (LDM's is 388).
pub const DEFAULT_PORT: u16 = 7388;

/// The wall clock in microseconds since the Unix epoch.
pub fn now_us() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as Micros)
}

/// The connection's smoothed round trip in microseconds, as TCP measured it: a subscriber
/// waits a round trip longer for repairs from afar before it counts again
/// ([`bulkcast_proto::feed::receiver::Receiver::set_rtt`]).
pub fn round_trip(w: &WriteHalf) -> Option<Micros> {
    w.tcp()
        .and_then(crate::transport::rtt)
        .map(|d| d.as_micros() as Micros)
}

/// Reads one frame; `None` at a clean end of stream.
pub async fn read_msg<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Msg>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("feed frame of {n} bytes is larger than the limit ({MAX_FRAME})"),
        ));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf).await?;
    Msg::decode(&buf)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes one frame (not flushed).
pub async fn write_msg<W: AsyncWrite + Unpin>(w: &mut W, m: &Msg) -> io::Result<()> {
    let mut b = BytesMut::with_capacity(64);
    b.extend_from_slice(&[0; 4]);
    m.encode(&mut b);
    let n = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&n.to_be_bytes());
    w.write_all(&b).await
}
