//! Measuring the network for the planner: round-trip times between every pair of session
//! hosts, taken by the hosts themselves.
//!
//! The source opens an admitted connection to every agent. On it, the source first measures its
//! own RTT to that agent, then it sends `Probe`, and the agent measures its RTT to every other
//! agent, in parallel, and answers with `Probed`. Every step has a deadline; a pair that cannot
//! be measured is reported as such, never waited on.
//!
//! How a round trip is measured depends on `samples`:
//! - `0` (what `send` uses): the round trip the transport measured while the connection was set
//!   up (TCP's from its SYN and, on the source's connections, the handshake). Nothing more is
//!   exchanged, and an agent measures its peers with a bare TCP connect, which it closes: the
//!   whole probe costs about 4.5 round trips instead of 11 (2.2 s at 200 ms, issue 28).
//! - `n > 0` (`bulkcast plan --samples`): the median of `n` `Ping`/`Pong` echoes on an admitted
//!   connection with `TCP_NODELAY`, so connection set-up and Nagle do not inflate it.

use std::time::{Duration, Instant};

use crate::transport::Stream;
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::wire::{Frame, UNREACHABLE};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::transport::{self, ConnError, TcpTuning};

/// Most echoes one connection may ask for (bounds the work a peer can request).
pub const MAX_SAMPLES: u16 = 64;

/// A measured RTT matrix over the session's nodes (0: the source, `i`: `hosts[i - 1]`).
#[derive(Debug, Clone)]
pub struct RttMatrix {
    /// `rtt_ms[i][j]`: median RTT measured from node i to node j, if it could be measured.
    pub rtt_ms: Vec<Vec<Option<f64>>>,
    /// Why a row could not be measured (agent unreachable, refused, timed out).
    pub errors: Vec<(usize, String)>,
}

/// Measures RTTs from the source to every host, and from each host `i` to the hosts listed in
/// `targets[i]` (indices into `hosts`; all of them for a full matrix, a sample for Vivaldi).
pub async fn matrix(
    hosts: &[HostSpec],
    targets: &[Vec<usize>],
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
    deadline: Duration,
) -> RttMatrix {
    let n = hosts.len() + 1;
    let mut rtt_ms = vec![vec![None; n]; n];
    for (i, row) in rtt_ms.iter_mut().enumerate() {
        row[i] = Some(0.0);
    }
    let tasks: Vec<_> = (0..hosts.len())
        .map(|i| {
            let list: Vec<usize> = targets.get(i).cloned().unwrap_or_default();
            let addrs: Vec<String> = list
                .iter()
                .filter_map(|&j| hosts.get(j))
                .map(|h| h.addr.clone())
                .collect();
            let addr = hosts[i].addr.clone();
            let keys = keys.clone();
            let tuning = tuning.clone();
            let task = tokio::spawn(async move {
                let probe = probe_one(&addr, &keys, &tuning, samples, deadline, addrs);
                tokio::time::timeout(deadline + Duration::from_secs(5), probe)
                    .await
                    .unwrap_or(Err(ConnError::Timeout("probing")))
            });
            (list, task)
        })
        .collect();
    let mut errors = Vec::new();
    for (i, (list, t)) in tasks.into_iter().enumerate() {
        match t.await {
            Ok(Ok((own, row))) => {
                rtt_ms[0][i + 1] = Some(own);
                rtt_ms[i + 1][0] = Some(own);
                for (&j, us) in list.iter().zip(row) {
                    if j != i && us != UNREACHABLE {
                        rtt_ms[i + 1][j + 1] = Some(us as f64 / 1000.0);
                    }
                }
            }
            Ok(Err(e)) => errors.push((i + 1, format!("{}: {e}", hosts[i].name))),
            Err(e) => errors.push((i + 1, format!("{}: {e}", hosts[i].name))),
        }
    }
    RttMatrix { rtt_ms, errors }
}

async fn probe_one(
    addr: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
    deadline: Duration,
    targets: Vec<String>,
) -> Result<(f64, Vec<u32>), ConnError> {
    let s = transport::connect(addr, tuning).await?;
    let mut s = transport::handshake_connect(s, keys).await?;
    let own = measure(&mut s, samples).await?;
    let timeout_ms = deadline.as_millis().min(u32::MAX as u128) as u32;
    transport::write_frame(
        &mut s,
        &Frame::Probe {
            samples,
            timeout_ms,
            targets,
        },
    )
    .await?;
    match tokio::time::timeout(
        deadline + Duration::from_secs(2),
        transport::read_frame(&mut s, bulkcast_proto::wire::MAX_FRAME),
    )
    .await
    {
        Err(_) => Err(ConnError::Timeout("waiting for probe results")),
        Ok(Ok(Some(Frame::Probed { rtt_us }))) => Ok((own.as_secs_f64() * 1e3, rtt_us)),
        Ok(Ok(Some(other))) => Err(ConnError::Unexpected(other.kind())),
        Ok(Ok(None)) => Err(ConnError::Closed),
        Ok(Err(e)) => Err(e),
    }
}

/// The round trip of an admitted connection: the transport's own estimate for `samples == 0`
/// (one echo where it has none), else the median of `samples` echoes.
async fn measure(s: &mut Stream, samples: u16) -> Result<Duration, ConnError> {
    match (samples, s.rtt()) {
        (0, Some(rtt)) => Ok(rtt),
        _ => echo(s, samples).await,
    }
}

/// Median RTT of `samples` echoes on an admitted connection.
pub async fn echo<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    samples: u16,
) -> Result<Duration, ConnError> {
    let mut rtts = Vec::with_capacity(samples as usize);
    for nonce in 0..samples.clamp(1, MAX_SAMPLES) as u64 {
        let t = Instant::now();
        transport::write_frame(s, &Frame::Ping { nonce }).await?;
        match transport::expect_frame(s, "waiting for Pong").await? {
            Frame::Pong { nonce: n } if n == nonce => rtts.push(t.elapsed()),
            other => return Err(ConnError::Unexpected(other.kind())),
        }
    }
    Ok(median(&mut rtts))
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Agent side: answers echoes until the peer stops (at most [`MAX_SAMPLES`], each within the
/// handshake deadline).
pub async fn serve_echo(
    s: &mut Stream,
    first: u64,
    keys: &Keys,
    tuning: &TcpTuning,
) -> Result<(), ConnError> {
    transport::write_frame(s, &Frame::Pong { nonce: first }).await?;
    for _ in 1..MAX_SAMPLES {
        let next = tokio::time::timeout(
            transport::HANDSHAKE_TIMEOUT,
            transport::read_frame(s, bulkcast_proto::wire::MAX_FRAME),
        )
        .await
        .map_err(|_| ConnError::Timeout("waiting for the next probe"))??;
        match next {
            None => return Ok(()),
            Some(Frame::Ping { nonce }) => {
                transport::write_frame(s, &Frame::Pong { nonce }).await?
            }
            Some(Frame::Probe {
                samples,
                timeout_ms,
                targets,
            }) => {
                return serve_probe(s, samples, timeout_ms, targets, keys, tuning).await;
            }
            Some(other) => return Err(ConnError::Unexpected(other.kind())),
        }
    }
    Ok(())
}

/// Agent side: measures the RTT to every target in parallel and answers `Probed`.
pub async fn serve_probe(
    s: &mut Stream,
    samples: u16,
    timeout_ms: u32,
    targets: Vec<String>,
    keys: &Keys,
    tuning: &TcpTuning,
) -> Result<(), ConnError> {
    let me = s.local_addr();
    let deadline = Duration::from_millis(timeout_ms.min(120_000) as u64);
    let tasks: Vec<_> = targets
        .into_iter()
        .take(4096)
        .map(|t| {
            let keys = keys.clone();
            let tuning = tuning.clone();
            let is_me = me.is_some_and(|m| t == m.to_string());
            tokio::spawn(async move {
                if is_me {
                    return Some(0u32);
                }
                let r = tokio::time::timeout(deadline, async {
                    let c = transport::connect(&t, &tuning).await?;
                    if samples == 0 {
                        // The connect's own round trip; the peer takes the connection, closed
                        // before its `Hello`, for what it is.
                        if let Some(rtt) = c.rtt() {
                            return Ok(rtt);
                        }
                    }
                    let mut c = transport::handshake_connect(c, &keys).await?;
                    echo(&mut c, samples).await
                })
                .await;
                match r {
                    Ok(Ok(d)) => Some(d.as_micros().min(UNREACHABLE as u128 - 1) as u32),
                    _ => None,
                }
            })
        })
        .collect();
    let mut rtt_us = Vec::with_capacity(tasks.len());
    for t in tasks {
        rtt_us.push(t.await.ok().flatten().unwrap_or(UNREACHABLE));
    }
    transport::write_frame(s, &Frame::Probed { rtt_us }).await?;
    Ok(())
}

/// Filler written per call while probing bandwidth.
const FILL: usize = 256 << 10;

/// Most seconds a bandwidth probe may last (bounds what a peer can ask for).
pub const MAX_BW_PROBE: Duration = Duration::from_secs(10);

/// Sends filler to the agent at `target` for `dur` and returns the rate it received, in
/// Mbit/s (measured by the receiver, from its first byte to its last).
pub async fn send_filler(
    target: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    dur: Duration,
) -> Result<f64, ConnError> {
    use tokio::io::AsyncWriteExt;
    let dur = dur.min(MAX_BW_PROBE);
    let s = transport::connect(target, tuning).await?;
    let mut s = transport::handshake_connect(s, keys).await?;
    transport::write_frame(&mut s, &Frame::Sink).await?;
    let buf = vec![0x5au8; FILL];
    let end = tokio::time::Instant::now() + dur;
    while tokio::time::Instant::now() < end {
        match tokio::time::timeout_at(end, s.write_all(&buf)).await {
            Ok(r) => r?,
            Err(_) => break,
        }
    }
    s.shutdown().await?;
    match tokio::time::timeout(
        dur + transport::HANDSHAKE_TIMEOUT,
        transport::read_frame(&mut s, 64),
    )
    .await
    {
        Err(_) => Err(ConnError::Timeout("waiting for the sink's report")),
        Ok(Ok(Some(Frame::SinkReport { bytes, micros }))) if micros > 0 => {
            Ok(bytes as f64 * 8.0 / micros as f64)
        }
        Ok(Ok(Some(other))) => Err(ConnError::Unexpected(other.kind())),
        Ok(Ok(None)) => Err(ConnError::Closed),
        Ok(Err(e)) => Err(e),
    }
}

/// Agent side of a bandwidth probe: counts filler until the sender closes (at most
/// [`MAX_BW_PROBE`] plus a margin), then reports.
pub async fn serve_sink(s: &mut Stream) -> Result<(), ConnError> {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; FILL];
    let (mut bytes, mut first, mut last) = (0u64, None, Instant::now());
    let deadline = tokio::time::Instant::now() + MAX_BW_PROBE + Duration::from_secs(5);
    loop {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .map_err(|_| ConnError::Timeout("bandwidth probe longer than allowed"))??;
        if n == 0 {
            break;
        }
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        bytes += n as u64;
    }
    let micros = first.map_or(0, |f| last.duration_since(f).as_micros() as u64);
    transport::write_frame(s, &Frame::SinkReport { bytes, micros }).await?;
    Ok(())
}

/// Agent side: the source asked for a bandwidth probe to `target`.
pub async fn serve_bw_probe(
    s: &mut Stream,
    target: &str,
    millis: u32,
    keys: &Keys,
    tuning: &TcpTuning,
) -> Result<(), ConnError> {
    let dur = Duration::from_millis(millis as u64);
    let kbps = match send_filler(target, keys, tuning, dur).await {
        Ok(mbps) => (mbps * 1000.0).min(UNREACHABLE as f64 - 1.0) as u32,
        Err(e) => {
            tracing::warn!("bandwidth probe to {target}: {e}");
            UNREACHABLE
        }
    };
    transport::write_frame(s, &Frame::BwResult { kbps }).await?;
    Ok(())
}

/// Measures the achievable rate from every node (the source included) to every host, in
/// Mbit/s: `n` rounds of `dur`, where in round k node i sends to node (i + k) mod (n + 1), so
/// every host sends one probe and receives one probe at a time.
pub async fn bandwidth(
    hosts: &[HostSpec],
    keys: &Keys,
    tuning: &TcpTuning,
    dur: Duration,
) -> Vec<Vec<Option<f64>>> {
    let n = hosts.len() + 1;
    let mut out = vec![vec![None; n]; n];
    for k in 1..n {
        let tasks: Vec<_> = (0..n)
            .filter_map(|i| {
                let j = (i + k) % n;
                (j != 0).then_some((i, j))
            })
            .map(|(i, j)| {
                let target = hosts[j - 1].addr.clone();
                let from = (i > 0).then(|| hosts[i - 1].addr.clone());
                let (keys, tuning) = (keys.clone(), tuning.clone());
                tokio::spawn(async move {
                    let r = match from {
                        None => send_filler(&target, &keys, &tuning, dur).await.ok(),
                        Some(agent) => ask_bw(&agent, &target, &keys, &tuning, dur)
                            .await
                            .ok()
                            .flatten(),
                    };
                    (i, j, r)
                })
            })
            .collect();
        for t in tasks {
            if let Ok((i, j, r)) = t.await {
                out[i][j] = r;
            }
        }
    }
    out
}

async fn ask_bw(
    agent: &str,
    target: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    dur: Duration,
) -> Result<Option<f64>, ConnError> {
    let s = transport::connect(agent, tuning).await?;
    let mut s = transport::handshake_connect(s, keys).await?;
    let millis = dur.as_millis().min(u32::MAX as u128) as u32;
    transport::write_frame(
        &mut s,
        &Frame::BwProbe {
            target: target.to_string(),
            millis,
        },
    )
    .await?;
    match tokio::time::timeout(
        dur + Duration::from_secs(15),
        transport::read_frame(&mut s, 64),
    )
    .await
    {
        Err(_) => Err(ConnError::Timeout("waiting for a bandwidth result")),
        Ok(Ok(Some(Frame::BwResult { kbps }))) => {
            Ok((kbps != UNREACHABLE).then(|| kbps as f64 / 1000.0))
        }
        Ok(Ok(Some(other))) => Err(ConnError::Unexpected(other.kind())),
        Ok(Ok(None)) => Err(ConnError::Closed),
        Ok(Err(e)) => Err(e),
    }
}
