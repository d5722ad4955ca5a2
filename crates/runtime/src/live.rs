//! What an agent's sessions are doing, for its live page (`agent --web`): each session it is
//! part of while it runs (object, parent, bytes stored, rate), then the agent's own report of
//! it (bytes, time, average rate, outcome).
//!
//! An agent sees its own part of a send, not the whole tree: the source's report is the
//! source's. The running sessions and the last [`KEPT`] finished ones are kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bulkcast_proto::wire::SessionId;
use serde::Serialize;

/// How many finished sessions an agent keeps on its page.
pub const KEPT: usize = 50;

/// The sessions of an agent. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct Sessions(Arc<Mutex<VecDeque<Entry>>>);

#[derive(Debug)]
struct Entry {
    key: u64,
    info: Started,
    started: Instant,
    started_unix: f64,
    stored: Arc<AtomicU64>,
    ended: Option<(f64, Result<(), String>)>,
}

/// A session as it starts on this agent.
#[derive(Debug, Clone)]
pub struct Started {
    /// The session.
    pub session: SessionId,
    /// `tree`, `stripe` (one tree of a balanced send) or `swarm`.
    pub kind: &'static str,
    /// The object's name.
    pub object: String,
    /// The object's length, when known (not for a stream).
    pub total: Option<u64>,
    /// Who sends to this agent (an address), or "peers" for a swarm.
    pub parent: String,
    /// This agent's node id in the session.
    pub node: u32,
}

/// One session on the page: counts its bytes while it runs, and ends as failed (with "ended
/// without an outcome") unless [`Tracked::end`] says otherwise.
#[derive(Debug)]
pub struct Tracked {
    sessions: Sessions,
    key: u64,
    /// Bytes stored so far, for the store to add to.
    pub stored: Arc<AtomicU64>,
    ended: bool,
}

/// A session as the page shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct View {
    /// The session id, in hex.
    pub session: String,
    /// `tree`, `stripe` or `swarm`.
    pub kind: String,
    /// The object's name.
    pub object: String,
    /// The object's length, when known.
    pub total: Option<u64>,
    /// Who sends to this agent.
    pub parent: String,
    /// This agent's node id.
    pub node: u32,
    /// `running`, `done` or `failed`.
    pub state: String,
    /// Bytes stored in this session.
    pub bytes: u64,
    /// When it started (seconds since the Unix epoch).
    pub started_unix: f64,
    /// Seconds it ran (so far).
    pub seconds: f64,
    /// Average rate so far (or over the whole session), Mbit/s.
    pub mbps: f64,
    /// Why it failed.
    pub error: Option<String>,
}

impl Sessions {
    /// A session starts here; its stored bytes are counted in `counter` (a new one if `None`).
    pub fn start(&self, info: Started, counter: Option<Arc<AtomicU64>>) -> Tracked {
        let stored = counter.unwrap_or_default();
        let key = rand::random();
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.push_back(Entry {
            key,
            info,
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            stored: stored.clone(),
            ended: None,
        });
        Tracked {
            sessions: self.clone(),
            key,
            stored,
            ended: false,
        }
    }

    /// Every session kept, oldest first.
    pub fn views(&self) -> Vec<View> {
        let list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .map(|e| {
                let bytes = e.stored.load(Ordering::Relaxed);
                let seconds = match &e.ended {
                    Some((s, _)) => *s,
                    None => e.started.elapsed().as_secs_f64(),
                };
                let (state, error) = match &e.ended {
                    None => ("running", None),
                    Some((_, Ok(()))) => ("done", None),
                    Some((_, Err(why))) => ("failed", Some(why.clone())),
                };
                View {
                    session: format!("{:016x}", e.info.session),
                    kind: e.info.kind.into(),
                    object: e.info.object.clone(),
                    total: e.info.total,
                    parent: e.info.parent.clone(),
                    node: e.info.node,
                    state: state.into(),
                    bytes,
                    started_unix: e.started_unix,
                    seconds,
                    mbps: if seconds > 0.0 {
                        bytes as f64 * 8.0 / seconds / 1e6
                    } else {
                        0.0
                    },
                    error,
                }
            })
            .collect()
    }

    fn end(&self, key: u64, outcome: Result<(), String>) {
        let mut list = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = list.iter_mut().find(|e| e.key == key && e.ended.is_none()) {
            e.ended = Some((e.started.elapsed().as_secs_f64(), outcome));
        }
        // Forget the oldest finished sessions past KEPT (running ones always stay).
        let mut finished = list.iter().filter(|e| e.ended.is_some()).count();
        while finished > KEPT {
            let Some(i) = list.iter().position(|e| e.ended.is_some()) else {
                break;
            };
            list.remove(i);
            finished -= 1;
        }
    }
}

impl Tracked {
    /// The session ended: its copy is in place (`Ok`) or not, and why.
    pub fn end(mut self, outcome: Result<(), String>) {
        self.ended = true;
        self.sessions.end(self.key, outcome);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.ended {
            self.sessions
                .end(self.key, Err("ended without an outcome".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(session: SessionId) -> Started {
        Started {
            session,
            kind: "tree",
            object: "a.bin".into(),
            total: Some(100),
            parent: "10.0.0.1:7400".into(),
            node: 2,
        }
    }

    #[test]
    fn sessions_run_then_keep_their_outcome_and_drop_counts_as_failed() {
        let s = Sessions::default();
        let a = s.start(started(1), None);
        let b = s.start(started(2), None);
        a.stored.fetch_add(40, Ordering::Relaxed);
        let v = s.views();
        assert_eq!((v[0].state.as_str(), v[0].bytes), ("running", 40));
        assert_eq!(v[0].session, "0000000000000001");
        a.end(Ok(()));
        drop(b);
        let v = s.views();
        assert_eq!(v[0].state, "done");
        assert_eq!(v[1].state, "failed");
        assert_eq!(v[1].error.as_deref(), Some("ended without an outcome"));
        // A finished session's time no longer grows.
        let secs = v[0].seconds;
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(s.views()[0].seconds, secs);
    }

    #[test]
    fn only_the_last_finished_sessions_are_kept_and_running_ones_stay() {
        let s = Sessions::default();
        let running = s.start(started(0), None);
        for i in 1..=(KEPT as u64 + 10) {
            s.start(started(i), None).end(Err("x".into()));
        }
        let v = s.views();
        assert_eq!(v.len(), KEPT + 1);
        assert_eq!(v[0].state, "running");
        assert_eq!(v[1].session, format!("{:016x}", 11));
        running.end(Ok(()));
    }
}
