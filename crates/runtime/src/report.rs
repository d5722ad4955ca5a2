//! What the source knows about every receiver while a session runs, and the report at its end.

use std::time::{Duration, Instant};

use bulkcast_proto::node::Event;
use serde::Serialize;

/// Live state of a session at the source, updated from node events and read by progress
/// displays.
#[derive(Debug, Clone)]
pub struct Status {
    /// When the session started.
    pub started: Instant,
    /// Chunk size.
    pub chunk_size: u32,
    /// Object length, when known (always at the end).
    pub total_len: Option<u64>,
    /// Bytes read from the input so far.
    pub read: u64,
    /// One entry per receiver (node `i` is `receivers[i - 1]`).
    pub receivers: Vec<ReceiverStatus>,
    /// Chunks that failed verification at the first hop after the node that sent them:
    /// (sender, rejecting node) -> chunks (node ids; 0 is the source).
    pub rejected: std::collections::BTreeMap<(usize, usize), u64>,
}

/// One receiver, as the source sees it.
#[derive(Debug, Clone)]
pub struct ReceiverStatus {
    /// Display name.
    pub name: String,
    /// Agent address.
    pub addr: String,
    /// Parent node (0: the source).
    pub parent: usize,
    /// Chunks verified and stored.
    pub chunks: u64,
    /// When its copy was in place.
    pub done: Option<Duration>,
    /// Why it failed.
    pub failed: Option<String>,
    /// Chunks it held before the session (from an earlier one of the same object).
    pub held: u64,
    /// It held an identical copy in place: nothing moved to it.
    pub already: bool,
    /// Chunk bytes the session moved to it, as it reported when done.
    pub received: Option<u64>,
}

impl Status {
    /// Applies a source-side node event.
    pub fn apply(&mut self, ev: &Event) {
        let t = self.started.elapsed();
        match ev {
            Event::Progress { node, upto } => {
                if let Some(r) = self.receivers.get_mut(node.wrapping_sub(1)) {
                    r.chunks = r.chunks.max(*upto);
                }
            }
            Event::NodeDone { node, received } => {
                if let Some(r) = self.receivers.get_mut(node.wrapping_sub(1)) {
                    r.done.get_or_insert(t);
                    r.received = Some(*received);
                }
            }
            Event::Held {
                node,
                chunks,
                complete,
            } => {
                if let Some(r) = self.receivers.get_mut(node.wrapping_sub(1)) {
                    r.held = *chunks;
                    r.already = *complete;
                }
            }
            Event::NodeFailed { node, reason } => {
                if let Some(r) = self.receivers.get_mut(node.wrapping_sub(1)) {
                    r.failed.get_or_insert_with(|| reason.clone());
                }
            }
            // Ids outside the session are dropped (the report names nodes by index).
            Event::Rejected { node, from, .. }
                if *from <= self.receivers.len() && (1..=self.receivers.len()).contains(node) =>
            {
                *self.rejected.entry((*from, *node)).or_default() += 1;
            }
            _ => {}
        }
    }

    /// Bytes a receiver held before the session.
    pub fn held_bytes(&self, r: &ReceiverStatus) -> u64 {
        let b = r.held * self.chunk_size as u64;
        self.total_len.map_or(b, |n| b.min(n))
    }

    /// Bytes a receiver has verified and stored. A stream's length is known only at its end,
    /// but its last chunk may be short before then: no receiver holds more than was read.
    pub fn bytes_of(&self, r: &ReceiverStatus) -> u64 {
        let b = r.chunks * self.chunk_size as u64;
        b.min(self.total_len.unwrap_or(self.read))
    }
}

/// How a multicast send chose its rate.
#[derive(Debug, Clone, Serialize)]
pub struct McastRateReport {
    /// Mbit/s on the wire the data went at.
    pub rate_mbps: f64,
    /// Where the rate came from: `measured`, `--mcast-rate` or the hosts file.
    pub from: String,
    /// Mbit/s the source wrote the train at (measured only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_sent_mbps: Option<f64>,
    /// Mbit/s the train's reports set (measured only); `rate_mbps` differs when the train
    /// arrived as fast as it was written and the rate was raised while the group kept up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_rate_mbps: Option<f64>,
    /// When the rate was raised from the train's: why raising stopped (a window that lost
    /// more than the lowest, or the source that could not write faster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_stopped: Option<String>,
    /// Per receiver in order (measured only): how fast the train arrived, `None` without a
    /// report that could be timed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub train: Vec<Option<TrainSeen>>,
}

/// What one receiver saw of a multicast send's train.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TrainSeen {
    /// Mbit/s on the wire it arrived at.
    pub mbps: f64,
    /// The share of it lost.
    pub loss: f64,
}

/// The end-of-session report (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Session id (hex).
    pub session: String,
    /// What was sent.
    pub object: ObjectReport,
    /// How the tree was built.
    pub strategy: String,
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Largest verified part a chunk travels in, in bytes (0: chunks travel whole).
    pub part_size: usize,
    /// Seconds from start until the last receiver finished or failed.
    pub seconds: f64,
    /// Every receiver has a verified copy in place.
    pub ok: bool,
    /// Object bytes delivered per second to all receivers together, in Mbit/s.
    pub aggregate_mbps: f64,
    /// Per receiver.
    pub receivers: Vec<ReceiverReport>,
    /// Per tree edge.
    pub edges: Vec<EdgeReport>,
    /// Swarm strategies: per cluster.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<ClusterReport>,
    /// A planned tree: how its round trips were measured (probed now or cached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::measure::ProbeReport>,
    /// Every receiver's verified bytes over time, as the source saw them.
    #[serde(skip_serializing_if = "Timeline::is_empty")]
    pub timeline: Timeline,
    /// A multicast send: the rate it sent at and where that came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multicast: Option<McastRateReport>,
    /// Chunks a node sent that failed verification at the next hop: the culprit (or its
    /// link) named.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected: Vec<RejectedReport>,
}

/// Chunks one node sent that the node below it rejected (they failed verification: tampered
/// with at the sender, or corrupted on the link) and fetched again.
#[derive(Debug, Clone, Serialize)]
pub struct RejectedReport {
    /// The node that sent them (`source` for the source).
    pub from: String,
    /// The first honest hop, which rejected them.
    pub by: String,
    /// How many (each node reports at most `MAX_REJECTED_REPORTS`).
    pub chunks: u64,
}

/// Every receiver's verified and stored bytes over time, sampled at the source from the
/// acknowledgements each receiver sends up (every strategy reports them). It is also the time
/// series of every edge, relays' included: a tree edge carries what its child stores, so the
/// edge's rate over time is the slope of its child's series.
///
/// The sampling interval starts at [`Timeline::FIRST_INTERVAL`] and doubles whenever
/// [`Timeline::MAX_SAMPLES`] are held (every other sample is dropped), so a transfer of any
/// length keeps a few hundred samples per receiver.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// Sample times, seconds from the start of the session.
    pub t_s: Vec<f64>,
    /// Per receiver, in the order of `receivers`: bytes at each sample time.
    pub bytes: Vec<Vec<u64>>,
    /// Current sampling interval.
    #[serde(skip)]
    interval: Duration,
}

impl Timeline {
    /// The first sampling interval.
    pub const FIRST_INTERVAL: Duration = Duration::from_millis(100);
    /// Samples held before the interval doubles.
    pub const MAX_SAMPLES: usize = 600;

    /// No samples.
    pub fn is_empty(&self) -> bool {
        self.t_s.is_empty()
    }

    /// How long to wait before the next [`Timeline::sample`].
    pub fn interval(&self) -> Duration {
        self.interval.max(Self::FIRST_INTERVAL)
    }

    /// Records every receiver's bytes now.
    pub fn sample(&mut self, status: &Status) {
        let t = status.started.elapsed().as_secs_f64();
        let n = status.receivers.len();
        if self.bytes.len() != n {
            self.t_s.clear();
            self.bytes = vec![Vec::new(); n];
        }
        self.t_s.push((t * 1000.0).round() / 1000.0);
        for (series, r) in self.bytes.iter_mut().zip(&status.receivers) {
            series.push(status.bytes_of(r));
        }
        if self.t_s.len() >= Self::MAX_SAMPLES {
            // Keep the even samples (the first stays) and sample half as often from now on.
            keep_even(&mut self.t_s);
            self.bytes.iter_mut().for_each(keep_even);
            self.interval = self.interval() * 2;
        }
    }
}

/// The object in a report.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    /// Name at the receivers.
    pub name: String,
    /// `file`, `dir` or `stream`.
    pub kind: String,
    /// Length in bytes.
    pub bytes: u64,
    /// A directory's entries that were not sent, and why (the rest were).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<crate::input::Skipped>,
}

/// One receiver in a report.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiverReport {
    /// Display name.
    pub name: String,
    /// Agent address.
    pub addr: String,
    /// Parent's name.
    pub parent: String,
    /// Bytes verified and stored.
    pub bytes: u64,
    /// Seconds until done (or until the end of the session).
    pub seconds: f64,
    /// `bytes / seconds` in Mbit/s.
    pub rate_mbps: f64,
    /// Has a complete, verified copy in place.
    pub verified: bool,
    /// Bytes it already held, verified, from an earlier session of the same object (only the
    /// rest moved).
    #[serde(skip_serializing_if = "is_zero")]
    pub held_bytes: u64,
    /// It held an identical copy in place already: nothing moved to it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already_in_place: bool,
    /// Chunk bytes the session moved to it (as it counted them; absent if it did not finish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received_bytes: Option<u64>,
    /// What went wrong, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Swarm strategies: the receiver's site (cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// Swarm strategies: bytes of verified pieces received from each peer (duplicates
    /// included).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub received_from: Vec<PeerBytes>,
}

/// Bytes a receiver got from one peer (swarm strategies).
#[derive(Debug, Clone, Serialize)]
pub struct PeerBytes {
    /// The peer's name.
    pub peer: String,
    /// Bytes of verified pieces received from it.
    pub bytes: u64,
}

/// One cluster (site) of a swarm send.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// The site label.
    pub site: String,
    /// Receivers in it.
    pub receivers: usize,
    /// The source is in it.
    pub has_source: bool,
    /// Piece bytes its receivers got from members of other clusters (ideal: the object size
    /// once for a cluster without the source, 0 for the source's).
    pub wan_bytes_in: u64,
    /// `wan_bytes_in` in object sizes.
    pub copies: f64,
}

/// One edge of the tree in a report.
#[derive(Debug, Clone, Serialize)]
pub struct EdgeReport {
    /// Parent's name.
    pub from: String,
    /// Child's name.
    pub to: String,
    /// Bytes carried (each edge carries the object once).
    pub bytes: u64,
    /// Seconds the edge was busy (until the child finished).
    pub seconds: f64,
    /// `bytes / seconds` in Mbit/s.
    pub rate_mbps: f64,
    /// The edge's connections, where it is spread over several (the source's own edges).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<crate::edge::ConnReport>,
    /// Frames of a spread edge sent again on another connection because the first was late.
    #[serde(skip_serializing_if = "is_zero")]
    pub hedges: u64,
    /// `tcp` or `udp` (the paced transport), where the edge is the source's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// Keeps the elements at even positions.
fn keep_even<T>(v: &mut Vec<T>) {
    let mut i = 0;
    v.retain(|_| {
        i += 1;
        i % 2 == 1
    });
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Report {
    /// Adds receivers that were left out before the send (`(place in the list given, name,
    /// addr, why)`) where they were in that list: they have no copy, so the report is not `ok`.
    pub fn leave_out(&mut self, out: impl IntoIterator<Item = (usize, String, String, String)>) {
        let mut out: Vec<_> = out.into_iter().collect();
        out.sort_by_key(|o| o.0);
        for (given, name, addr, why) in out {
            self.ok = false;
            let at = given.min(self.receivers.len());
            // The timeline's series follow `receivers`: a left-out one never moved.
            if !self.timeline.is_empty() {
                let zeros = vec![0; self.timeline.t_s.len()];
                let at = at.min(self.timeline.bytes.len());
                self.timeline.bytes.insert(at, zeros);
            }
            self.receivers.insert(
                at,
                ReceiverReport {
                    name,
                    addr,
                    parent: "-".into(),
                    bytes: 0,
                    seconds: 0.0,
                    rate_mbps: 0.0,
                    verified: false,
                    held_bytes: 0,
                    already_in_place: false,
                    received_bytes: None,
                    error: Some(format!("left out before the send: {why}")),
                    site: None,
                    received_from: Vec::new(),
                },
            );
        }
    }
}

impl Report {
    /// Builds the report from the final status.
    pub fn build(status: &Status, session: u64, name: &str, kind: &str, strategy: &str) -> Report {
        let end = status.started.elapsed();
        let name_of = |i: usize| {
            if i == 0 {
                "source".to_string()
            } else {
                status.receivers[i - 1].name.clone()
            }
        };
        let receivers: Vec<ReceiverReport> = status
            .receivers
            .iter()
            .map(|r| {
                let secs = r.done.unwrap_or(end).as_secs_f64();
                let bytes = status.bytes_of(r);
                ReceiverReport {
                    name: r.name.clone(),
                    addr: r.addr.clone(),
                    parent: name_of(r.parent),
                    bytes,
                    seconds: secs,
                    rate_mbps: mbps(bytes, secs),
                    verified: r.done.is_some() && r.failed.is_none(),
                    held_bytes: status.held_bytes(r),
                    already_in_place: r.already,
                    received_bytes: r.received,
                    error: r
                        .failed
                        .clone()
                        .or_else(|| r.done.is_none().then(|| "did not finish".to_string())),
                    site: None,
                    received_from: Vec::new(),
                }
            })
            .collect();
        let edges = receivers
            .iter()
            .map(|r| EdgeReport {
                from: r.parent.clone(),
                to: r.name.clone(),
                bytes: r.bytes,
                seconds: r.seconds,
                rate_mbps: r.rate_mbps,
                connections: Vec::new(),
                hedges: 0,
                transport: None,
            })
            .collect();
        let seconds = status
            .receivers
            .iter()
            .map(|r| r.done.unwrap_or(end))
            .max()
            .unwrap_or(end)
            .as_secs_f64();
        let total = status.total_len.unwrap_or(status.read);
        let delivered: u64 = receivers.iter().map(|r| r.bytes).sum();
        Report {
            session: format!("{session:016x}"),
            object: ObjectReport {
                name: name.into(),
                kind: kind.into(),
                bytes: total,
                skipped: Vec::new(),
            },
            strategy: strategy.into(),
            chunk_size: status.chunk_size,
            part_size: 0,
            seconds,
            ok: receivers.iter().all(|r| r.verified),
            aggregate_mbps: mbps(delivered, seconds),
            receivers,
            edges,
            clusters: Vec::new(),
            probe: None,
            timeline: Timeline::default(),
            multicast: None,
            rejected: status
                .rejected
                .iter()
                .map(|(&(from, by), &chunks)| RejectedReport {
                    from: name_of(from),
                    by: name_of(by),
                    chunks,
                })
                .collect(),
        }
    }
}

impl Report {
    /// Adds the connections of the source's spread edges to their edges.
    pub fn add_streams(&mut self, streams: Vec<crate::edge::EdgeStreams>) {
        for s in streams {
            if let Some(e) = self
                .edges
                .iter_mut()
                .find(|e| e.from == "source" && e.to == s.edge)
            {
                e.connections = s.conns;
                e.hedges = s.hedges;
                e.transport = s.transport;
            }
        }
    }
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(n: usize) -> Status {
        Status {
            started: Instant::now(),
            chunk_size: 1000,
            total_len: Some(1 << 40),
            read: 0,
            rejected: Default::default(),
            receivers: (0..n)
                .map(|i| ReceiverStatus {
                    name: format!("r{i}"),
                    addr: String::new(),
                    parent: 0,
                    chunks: 0,
                    done: None,
                    failed: None,
                    held: 0,
                    already: false,
                    received: None,
                })
                .collect(),
        }
    }

    #[test]
    fn rejected_chunks_name_the_sender_and_the_node_that_caught_them() {
        let mut st = status(3);
        // Node 1 (r0) tampers: node 2 (r1) rejects two of its chunks; a link from the source
        // corrupts one on its way to node 1; a report about a node that does not exist is
        // dropped.
        for (node, from) in [(2, 1), (2, 1), (1, 0), (3, 9), (9, 1)] {
            st.apply(&Event::Rejected {
                node,
                from,
                index: 7,
            });
        }
        let r = Report::build(&st, 1, "x", "file", "tree");
        let got: Vec<(&str, &str, u64)> = r
            .rejected
            .iter()
            .map(|x| (x.from.as_str(), x.by.as_str(), x.chunks))
            .collect();
        assert_eq!(got, [("source", "r0", 1), ("r0", "r1", 2)]);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["rejected"][1]["from"], "r0");
    }

    #[test]
    fn a_stream_receiver_never_counts_more_than_was_read() {
        // A stream of 3 chunks and 4 bytes: its length is unknown until the source ends,
        // but the short last chunk may already be stored.
        let mut st = status(1);
        st.total_len = None;
        st.read = 3004;
        st.receivers[0].chunks = 4;
        assert_eq!(st.bytes_of(&st.receivers[0]), 3004);
        st.receivers[0].chunks = 2;
        assert_eq!(st.bytes_of(&st.receivers[0]), 2000);
        st.total_len = Some(3004);
        st.receivers[0].chunks = 4;
        assert_eq!(st.bytes_of(&st.receivers[0]), 3004);
    }

    #[test]
    fn timeline_stays_bounded_and_keeps_its_first_and_ordered_samples() {
        let mut st = status(2);
        let mut tl = Timeline::default();
        for k in 0..(3 * Timeline::MAX_SAMPLES as u64) {
            st.receivers[0].chunks = k;
            st.receivers[1].chunks = 2 * k;
            tl.sample(&st);
        }
        assert!(tl.t_s.len() < Timeline::MAX_SAMPLES);
        assert!(tl.t_s.len() >= Timeline::MAX_SAMPLES / 4);
        assert_eq!(tl.bytes.len(), 2);
        assert!(tl.bytes.iter().all(|s| s.len() == tl.t_s.len()));
        assert_eq!(tl.bytes[0][0], 0);
        // Samples are still in order, and receiver 1 is always twice receiver 0.
        assert!(tl.bytes[0].windows(2).all(|w| w[0] < w[1]));
        assert!(tl.bytes[0]
            .iter()
            .zip(&tl.bytes[1])
            .all(|(a, b)| 2 * a == *b));
        // Halved at 600, 900, 1200, 1500 and 1800 samples.
        assert_eq!(tl.interval(), Timeline::FIRST_INTERVAL * 32);
    }
}
