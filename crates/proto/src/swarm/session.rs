//! The source's view of a swarm session: what became of each receiver, and the stall timer
//! that gives up on receivers once nothing moved for a while.
//!
//! The node's driver feeds it what the set-up connections carry (`Ack` progress, `Report`,
//! `Failed`, a dropped connection) and sleeps until [`SourceSession::poll_timeout`]; the
//! simulator ([`super::sim`]) drives it the same way, so the timer is tested on its clock.

use std::time::{Duration, Instant};

use crate::tree::NodeId;

/// What became of a receiver, as the source learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its copy is in place: the bytes it received from each peer (node id, bytes).
    Reported(Vec<(u32, u64)>),
    /// Why it failed (or was given up).
    Failed(String),
}

/// The source's follow-up of every receiver (node ids `1..members`; node 0 is the source).
#[derive(Debug, Clone)]
pub struct SourceSession {
    stall: Duration,
    /// When a receiver last moved (progress, a report, a failure), or the start.
    last_progress: Instant,
    outcomes: Vec<Option<Outcome>>,
}

impl SourceSession {
    /// A session over `members` nodes (the source included) that gives up on the receivers
    /// still pending once none of them moved for `stall`.
    pub fn new(members: usize, stall: Duration, now: Instant) -> Self {
        Self {
            stall,
            last_progress: now,
            outcomes: vec![None; members.max(1)],
        }
    }

    fn receiver(&self, j: NodeId) -> bool {
        j != 0 && j < self.outcomes.len()
    }

    /// Receiver `j` holds more pieces (its periodic `Ack`).
    pub fn handle_progress(&mut self, j: NodeId, now: Instant) {
        if self.receiver(j) {
            self.last_progress = now;
        }
    }

    /// Receiver `j` reported its copy in place. Returns whether this was its outcome (not
    /// already known).
    pub fn handle_report(&mut self, j: NodeId, received: Vec<(u32, u64)>, now: Instant) -> bool {
        if !self.receiver(j) {
            return false;
        }
        self.last_progress = now;
        self.settle(j, Outcome::Reported(received))
    }

    /// Receiver `j` reported a failure. Returns whether this was its outcome: the caller then
    /// removes it from the swarm.
    pub fn handle_failed(&mut self, j: NodeId, reason: String, now: Instant) -> bool {
        if !self.receiver(j) {
            return false;
        }
        self.last_progress = now;
        self.settle(j, Outcome::Failed(reason))
    }

    /// Receiver `j` could not be reached or its connection dropped before it reported: a
    /// failure that is not progress. Returns whether this was its outcome.
    pub fn handle_lost(&mut self, j: NodeId, reason: String) -> bool {
        self.receiver(j) && self.settle(j, Outcome::Failed(reason))
    }

    fn settle(&mut self, j: NodeId, o: Outcome) -> bool {
        if self.outcomes[j].is_some() {
            return false;
        }
        self.outcomes[j] = Some(o);
        true
    }

    /// When the stall timer fires, while a receiver is pending.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending().then(|| self.last_progress + self.stall)
    }

    /// Gives up on every pending receiver once nothing moved for the stall timeout; returns
    /// those given up (their outcome says why).
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<NodeId> {
        if !self.pending() || now < self.last_progress + self.stall {
            return Vec::new();
        }
        let why = format!("no progress for {} s", self.stall.as_secs());
        let given_up: Vec<NodeId> = (1..self.outcomes.len())
            .filter(|&j| self.outcomes[j].is_none())
            .collect();
        for &j in &given_up {
            self.outcomes[j] = Some(Outcome::Failed(why.clone()));
        }
        given_up
    }

    /// Whether a receiver has no outcome yet.
    pub fn pending(&self) -> bool {
        self.outcomes.iter().skip(1).any(Option::is_none)
    }

    /// Whether the source's part is over: every receiver reported or failed, and either the
    /// completion tree is done (`all_done`) or a receiver failed (the tree may never close).
    pub fn is_over(&self, all_done: bool) -> bool {
        let failed = self
            .outcomes
            .iter()
            .any(|o| matches!(o, Some(Outcome::Failed(_))));
        !self.pending() && (all_done || failed)
    }

    /// Receiver `j`'s outcome, once known.
    pub fn outcome(&self, j: NodeId) -> Option<&Outcome> {
        self.outcomes.get(j).and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_defers_the_stall_and_a_pending_receiver_is_given_up_after_it() {
        let t0 = Instant::now();
        let s10 = Duration::from_secs(10);
        let mut s = SourceSession::new(3, s10, t0);
        assert_eq!(s.poll_timeout(), Some(t0 + s10));
        s.handle_progress(1, t0 + Duration::from_secs(4));
        assert!(s.handle_timeout(t0 + s10).is_empty());
        assert!(s.handle_report(1, vec![(0, 5)], t0 + Duration::from_secs(6)));
        // A repeated report changes no outcome, but the member is still talking.
        assert!(!s.handle_report(1, vec![], t0 + Duration::from_secs(7)));
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(17)));
        assert!(!s.is_over(true));
        assert!(s.handle_timeout(t0 + Duration::from_secs(16)).is_empty());
        assert_eq!(s.handle_timeout(t0 + Duration::from_secs(17)), vec![2]);
        assert_eq!(
            s.outcome(2),
            Some(&Outcome::Failed("no progress for 10 s".into()))
        );
        assert_eq!(s.outcome(1), Some(&Outcome::Reported(vec![(0, 5)])));
        assert!(s.is_over(false));
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn a_lost_receiver_is_no_progress_and_the_session_waits_for_the_tree_otherwise() {
        let t0 = Instant::now();
        let mut s = SourceSession::new(3, Duration::from_secs(5), t0);
        assert!(s.handle_lost(2, "connection lost".into()));
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(5)));
        // Its late failure report is no new outcome, but it is a sign of life.
        assert!(!s.handle_failed(2, "late".into(), t0 + Duration::from_secs(1)));
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_secs(6)));
        assert!(!s.handle_lost(0, "the source".into()));
        assert!(!s.handle_lost(9, "no such node".into()));
        let mut ok = SourceSession::new(2, Duration::from_secs(5), t0);
        ok.handle_report(1, vec![], t0);
        assert!(
            !ok.is_over(false),
            "every receiver reported: waits for the tree"
        );
        assert!(ok.is_over(true));
    }
}
