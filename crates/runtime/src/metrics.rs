//! Prometheus metrics of a process (`--metrics ADDR` on `agent` and `send`).
//!
//! Two kinds:
//! - [`NodeMetrics`], one per process ([`global`]): what this process received, verified,
//!   rejected and stored, its sessions, its store queue and the retransmissions of its TCP
//!   edges. The receiving side counts them where they happen (the driver's events, the
//!   agent's sessions), with atomic increments, whether or not anyone serves them.
//! - [`SourceMetrics`], one per `send`: every receiver's and every edge's bytes and rate, the
//!   receivers running, done and failed, and the bytes buffered for the slowest receiver,
//!   taken from the source's [`Status`] whenever it is sampled.
//!
//! Whoever serves metrics builds one [`Registry`] (prefix `bulkcast`), lets every part of the
//! process register its own (`global().register(&mut reg)`, a `SourceMetrics::new(&mut reg)`,
//! a feed server's own later), and hands it to [`serve`]. The encoding is the
//! `prometheus-client` crate's (OpenMetrics text, which Prometheus scrapes).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::report::Status;

/// Labels of a family: `(name, value)` pairs.
type Labels = Vec<(String, String)>;

/// What this process did as a receiver and relay.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Chunks that arrived (verified or rejected).
    pub chunks_received: Counter,
    /// Chunks that passed verification and went to the local copy.
    pub chunks_verified: Counter,
    /// Bytes of those chunks.
    pub bytes_verified: Counter,
    /// Chunks that failed verification (each is requested again).
    pub chunks_rejected: Counter,
    /// Rejected chunks of sessions whose copy then completed: each arrived whole later.
    pub chunks_repaired: Counter,
    /// Chunks written to the local copy.
    pub chunks_stored: Counter,
    /// Chunks handed to the local copy and not yet written (the store's queue).
    pub store_queue: Gauge,
    /// Sessions running.
    pub sessions_active: Gauge,
    /// Sessions ended, by outcome (`done`: the copy is in place; `failed`).
    pub sessions_ended: Family<Labels, Counter>,
    /// TCP segments sent on watched tree edges (`TCP_INFO`).
    pub tcp_segments_sent: Counter,
    /// TCP segments retransmitted on watched tree edges (`TCP_INFO`).
    pub tcp_retransmits: Counter,
}

/// This process's [`NodeMetrics`].
pub fn global() -> &'static NodeMetrics {
    static GLOBAL: OnceLock<NodeMetrics> = OnceLock::new();
    GLOBAL.get_or_init(NodeMetrics::default)
}

impl NodeMetrics {
    /// Adds every metric to `reg`.
    pub fn register(&'static self, reg: &mut Registry) {
        reg.register(
            "chunks_received",
            "Chunks that arrived from a parent or peer, verified or rejected",
            self.chunks_received.clone(),
        );
        reg.register(
            "chunks_verified",
            "Chunks that passed verification and went to the local copy",
            self.chunks_verified.clone(),
        );
        reg.register_with_unit(
            "verified",
            "Bytes of chunks that passed verification",
            Unit::Bytes,
            self.bytes_verified.clone(),
        );
        reg.register(
            "chunks_rejected",
            "Chunks that failed verification and were requested again",
            self.chunks_rejected.clone(),
        );
        reg.register(
            "chunks_repaired",
            "Rejected chunks of sessions that then completed (each arrived whole later)",
            self.chunks_repaired.clone(),
        );
        reg.register(
            "chunks_stored",
            "Chunks written to the local copy",
            self.chunks_stored.clone(),
        );
        reg.register(
            "store_queue_chunks",
            "Chunks handed to the local copy and not yet written",
            self.store_queue.clone(),
        );
        reg.register(
            "sessions_active",
            "Sessions running in this process",
            self.sessions_active.clone(),
        );
        reg.register(
            "sessions_ended",
            "Sessions ended, by outcome",
            self.sessions_ended.clone(),
        );
        reg.register(
            "tcp_segments_sent",
            "TCP segments sent on tree edges watched by --cc auto (TCP_INFO)",
            self.tcp_segments_sent.clone(),
        );
        reg.register(
            "tcp_retransmits",
            "TCP segments retransmitted on tree edges watched by --cc auto (TCP_INFO)",
            self.tcp_retransmits.clone(),
        );
    }

    /// A session starts: counted active until the guard is finished or dropped.
    pub fn session_started(&'static self) -> SessionGuard {
        self.sessions_active.inc();
        SessionGuard {
            m: self,
            rejected: 0,
            ended: false,
        }
    }

    /// A chunk arrived verified and goes to the local copy.
    pub fn chunk_verified(&self, bytes: usize) {
        self.chunks_received.inc();
        self.chunks_verified.inc();
        self.bytes_verified.inc_by(bytes as u64);
        self.store_queue.inc();
    }

    /// A chunk was written to the local copy.
    pub fn chunk_stored(&self) {
        self.chunks_stored.inc();
        self.store_queue.dec();
    }

    /// Adds a socket's counters since the last reading (`before` is updated).
    pub fn tcp_counters(&self, before: &mut (u64, u64), now: (u64, u64)) {
        self.tcp_segments_sent
            .inc_by(now.0.saturating_sub(before.0));
        self.tcp_retransmits.inc_by(now.1.saturating_sub(before.1));
        *before = now;
    }
}

/// A running session in [`NodeMetrics`]: ends as failed unless [`SessionGuard::done`].
#[derive(Debug)]
pub struct SessionGuard {
    m: &'static NodeMetrics,
    rejected: u64,
    ended: bool,
}

impl SessionGuard {
    /// A chunk of this session failed verification.
    pub fn rejected(&mut self) {
        self.rejected += 1;
        self.m.chunks_received.inc();
        self.m.chunks_rejected.inc();
    }

    /// The session ended with (`ok`) or without its copy in place.
    pub fn done(mut self, ok: bool) {
        self.end(ok);
    }

    fn end(&mut self, ok: bool) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        self.m.sessions_active.dec();
        let outcome = if ok { "done" } else { "failed" };
        self.m
            .sessions_ended
            .get_or_create(&vec![("outcome".into(), outcome.into())])
            .inc();
        if ok {
            self.m.chunks_repaired.inc_by(self.rejected);
        }
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// A `send`'s view of its receivers and edges, refreshed from its [`Status`].
#[derive(Debug)]
pub struct SourceMetrics {
    /// Bytes each receiver has verified and stored, by `receiver`.
    receiver_bytes: Family<Labels, Counter>,
    /// Bytes over each tree edge (what its child stored), by `from` and `to`.
    edge_bytes: Family<Labels, Counter>,
    /// Each edge's rate over the last second or so, bits per second.
    edge_rate: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Receivers by state: `running`, `done`, `failed`.
    receivers: Family<Labels, Gauge>,
    /// Bytes read from the input.
    read: Counter,
    /// Bytes read but not yet stored by the slowest running receiver (the source's queue).
    buffered: Gauge,
    /// What the counters hold, and the samples the rates are taken over.
    last: Mutex<Last>,
}

#[derive(Debug, Default)]
struct Last {
    read: u64,
    bytes: Vec<u64>,
    /// Per receiver: (time, bytes) a second or so ago, and the newest.
    window: HashMap<usize, (Sample, Sample)>,
}

/// A receiver's bytes at a time.
type Sample = (Instant, u64);

impl SourceMetrics {
    /// Registers a send's metrics in `reg`.
    pub fn new(reg: &mut Registry) -> Arc<SourceMetrics> {
        let m = SourceMetrics {
            receiver_bytes: Family::default(),
            edge_bytes: Family::default(),
            edge_rate: Family::default(),
            receivers: Family::default(),
            read: Counter::default(),
            buffered: Gauge::default(),
            last: Mutex::new(Last::default()),
        };
        reg.register_with_unit(
            "receiver",
            "Bytes each receiver has verified and stored",
            Unit::Bytes,
            m.receiver_bytes.clone(),
        );
        reg.register_with_unit(
            "edge",
            "Bytes carried over each tree edge (what its child stored)",
            Unit::Bytes,
            m.edge_bytes.clone(),
        );
        reg.register(
            "edge_rate_bits_per_second",
            "Each tree edge's rate over about the last second",
            m.edge_rate.clone(),
        );
        reg.register(
            "receivers",
            "Receivers of this send by state",
            m.receivers.clone(),
        );
        reg.register_with_unit(
            "source_read",
            "Bytes read from the input",
            Unit::Bytes,
            m.read.clone(),
        );
        reg.register_with_unit(
            "source_buffered",
            "Bytes read but not yet stored by the slowest running receiver",
            Unit::Bytes,
            m.buffered.clone(),
        );
        Arc::new(m)
    }

    /// Takes the figures of `st` (call it at least every second or so for the rates).
    pub fn observe(&self, st: &Status) {
        const WINDOW: Duration = Duration::from_secs(1);
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.bytes.resize(st.receivers.len(), 0);
        self.read.inc_by(st.read.saturating_sub(last.read));
        last.read = last.read.max(st.read);
        let name = |i: usize| match i {
            0 => "source".to_string(),
            i => st.receivers[i - 1].name.clone(),
        };
        let (mut running, mut done, mut failed) = (0, 0, 0);
        let mut slowest: Option<u64> = None;
        for (i, r) in st.receivers.iter().enumerate() {
            let b = st.bytes_of(r);
            let rx = vec![("receiver".to_string(), r.name.clone())];
            let edge = vec![
                ("from".to_string(), name(r.parent)),
                ("to".into(), r.name.clone()),
            ];
            let delta = b.saturating_sub(last.bytes[i]);
            self.receiver_bytes.get_or_create(&rx).inc_by(delta);
            self.edge_bytes.get_or_create(&edge).inc_by(delta);
            last.bytes[i] = last.bytes[i].max(b);
            // The rate over the older sample of a two-sample window at least a second wide.
            let w = last.window.entry(i).or_insert(((now, b), (now, b)));
            if now.duration_since(w.1 .0) >= WINDOW {
                w.0 = w.1;
                w.1 = (now, b);
            }
            let secs = now.duration_since(w.0 .0).as_secs_f64();
            let rate = if secs > 0.0 && r.done.is_none() && r.failed.is_none() {
                b.saturating_sub(w.0 .1) as f64 * 8.0 / secs
            } else {
                0.0
            };
            self.edge_rate.get_or_create(&edge).set(rate);
            match (&r.failed, r.done) {
                (Some(_), _) => failed += 1,
                (None, Some(_)) => done += 1,
                (None, None) => {
                    running += 1;
                    slowest = Some(slowest.map_or(b, |s| s.min(b)));
                }
            }
        }
        for (state, n) in [("running", running), ("done", done), ("failed", failed)] {
            self.receivers
                .get_or_create(&vec![("state".into(), state.into())])
                .set(n);
        }
        self.buffered
            .set(slowest.map_or(0, |s| st.read.saturating_sub(s)) as i64);
    }
}

/// The text of every metric in `reg`.
pub fn encode(reg: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, reg);
    out
}

/// Serves `GET /metrics` from `reg` on `listener` until dropped. `scraped` is told of every
/// scrape answered (a `send` waits for one after its end, see `--metrics-linger`). Each request
/// is read within 5 s and at most 8 KiB: a client that does less is dropped.
pub async fn serve(
    listener: TcpListener,
    reg: Arc<Mutex<Registry>>,
    scraped: Option<tokio::sync::mpsc::UnboundedSender<()>>,
) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let reg = reg.clone();
        let scraped = scraped.clone();
        tokio::spawn(async move {
            let Ok(Some(path)) =
                tokio::time::timeout(Duration::from_secs(5), request_path(&mut conn)).await
            else {
                return;
            };
            let (status, body) = match path.split('?').next().unwrap_or("") {
                "/metrics" => {
                    let text = encode(&reg.lock().unwrap_or_else(|e| e.into_inner()));
                    ("200 OK", text)
                }
                _ => ("404 Not Found", "try /metrics\n".to_string()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let ok = conn.write_all(head.as_bytes()).await.is_ok()
                && conn.write_all(body.as_bytes()).await.is_ok();
            let _ = conn.shutdown().await;
            if let (true, "200 OK", Some(s)) = (ok, status, scraped) {
                let _ = s.send(());
            }
        });
    }
}

/// The target (path and query) of a `GET` request, once its head has arrived (at most 8 KiB;
/// `None` for anything else). Bound it in time where it is called.
pub async fn request_path(conn: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() + n > 8192 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = std::str::from_utf8(&buf).ok()?.lines().next()?.to_string();
    let mut words = line.split(' ');
    (words.next()? == "GET").then_some(())?;
    Some(words.next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::ReceiverStatus;

    #[test]
    fn source_metrics_follow_the_status_and_never_count_twice() {
        let mut reg = Registry::with_prefix("bulkcast");
        let m = SourceMetrics::new(&mut reg);
        let rx = |name: &str, parent, chunks| ReceiverStatus {
            name: name.into(),
            addr: String::new(),
            parent,
            chunks,
            done: None,
            failed: None,
            held: 0,
            already: false,
            received: None,
        };
        let mut st = Status {
            started: Instant::now(),
            chunk_size: 1000,
            total_len: Some(10_000),
            read: 6000,
            receivers: vec![rx("a", 0, 5), rx("b", 1, 2)],
            rejected: Default::default(),
        };
        m.observe(&st);
        m.observe(&st);
        st.receivers[1].failed = Some("gone".into());
        st.receivers[0].chunks = 6;
        m.observe(&st);
        let text = encode(&reg);
        for line in [
            "bulkcast_receiver_bytes_total{receiver=\"a\"} 6000",
            "bulkcast_edge_bytes_total{from=\"a\",to=\"b\"} 2000",
            "bulkcast_edge_bytes_total{from=\"source\",to=\"a\"} 6000",
            "bulkcast_receivers{state=\"failed\"} 1",
            "bulkcast_receivers{state=\"running\"} 1",
            "bulkcast_source_read_bytes_total 6000",
            "bulkcast_source_buffered_bytes 0",
        ] {
            assert!(text.contains(line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn a_session_guard_ends_once_and_counts_repairs_only_when_done() {
        let m: &'static NodeMetrics = Box::leak(Box::default());
        let mut reg = Registry::with_prefix("bulkcast");
        m.register(&mut reg);
        let mut g = m.session_started();
        g.rejected();
        assert_eq!(m.sessions_active.get(), 1);
        g.done(true);
        let mut g = m.session_started();
        g.rejected();
        drop(g);
        assert_eq!(m.sessions_active.get(), 0);
        assert_eq!(m.chunks_rejected.get(), 2);
        assert_eq!(m.chunks_repaired.get(), 1);
        let text = encode(&reg);
        assert!(
            text.contains("bulkcast_sessions_ended_total{outcome=\"done\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("bulkcast_sessions_ended_total{outcome=\"failed\"} 1"),
            "{text}"
        );
    }
}
