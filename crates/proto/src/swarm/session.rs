//! The source's view of a swarm session: what became of each receiver, the stall timer that
//! gives up on receivers once nothing moved for a while, and the timer that tries again to
//! reach a receiver whose connection dropped.
//!
//! The node's driver feeds it what the set-up connections carry (`Ack` progress, `Report`,
//! `Failed`, a dropped connection) and sleeps until [`SourceSession::poll_timeout`]; the
//! simulator ([`super::sim`]) drives it the same way, so the timers are tested on its clock.
//!
//! A receiver whose connection drops before it reported ([`SourceSession::handle_dropped`]) is
//! not failed at once: its agent may have been restarted. The driver removes it from the swarm
//! (its share goes to the others) and dials it again when [`SourceSession::poll_redial`] says:
//! [`REDIAL_FIRST`] after the drop, then at doubling intervals up to [`REDIAL_MAX`], for at most
//! the stall timeout. On success ([`SourceSession::handle_back`]) it is re-admitted and resumes;
//! once the stall timeout has passed since the drop, its next failed try fails it.

use std::time::{Duration, Instant};

use crate::tree::NodeId;

/// The first try to reach a receiver again, after its connection dropped.
pub const REDIAL_FIRST: Duration = Duration::from_secs(2);

/// The longest wait between two tries (each waits twice the one before, from
/// [`REDIAL_FIRST`]).
pub const REDIAL_MAX: Duration = Duration::from_secs(8);

/// A receiver whose connection dropped, while the source tries to reach it again.
#[derive(Debug, Clone)]
struct Away {
    /// Why its connection dropped.
    reason: String,
    /// When the source gives up on it.
    until: Instant,
    /// The next try; `None` while one is under way.
    next: Option<Instant>,
    /// The wait before the try after the next.
    wait: Duration,
}

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
    away: Vec<Option<Away>>,
}

impl SourceSession {
    /// A session over `members` nodes (the source included) that gives up on the receivers
    /// still pending once none of them moved for `stall`.
    pub fn new(members: usize, stall: Duration, now: Instant) -> Self {
        Self {
            stall,
            last_progress: now,
            outcomes: vec![None; members.max(1)],
            away: vec![None; members.max(1)],
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
        self.away[j] = None;
        true
    }

    /// Receiver `j`'s connection dropped before it reported: the source tries to reach it
    /// again (see [`SourceSession::poll_redial`]) for up to the stall timeout. Returns whether
    /// it is now away (false if it had an outcome or was away already).
    pub fn handle_dropped(&mut self, j: NodeId, reason: String, now: Instant) -> bool {
        if !self.receiver(j) || self.outcomes[j].is_some() || self.away[j].is_some() {
            return false;
        }
        let until = now + self.stall;
        self.away[j] = Some(Away {
            reason,
            until,
            next: Some((now + REDIAL_FIRST).min(until)),
            wait: (REDIAL_FIRST * 2).min(REDIAL_MAX),
        });
        true
    }

    /// Whether receiver `j` is away (dropped, and the source is trying to reach it again).
    pub fn is_away(&self, j: NodeId) -> bool {
        self.away.get(j).is_some_and(Option::is_some)
    }

    /// The receivers to dial again now; each is tried once until the driver reports how it went
    /// ([`SourceSession::handle_back`] or [`SourceSession::handle_redial_failed`]).
    pub fn poll_redial(&mut self, now: Instant) -> Vec<NodeId> {
        let mut due = Vec::new();
        for (j, a) in self.away.iter_mut().enumerate() {
            if let Some(a) = a.as_mut().filter(|a| a.next.is_some_and(|t| t <= now)) {
                a.next = None;
                due.push(j);
            }
        }
        due
    }

    /// Receiver `j` could not be reached again (`why`). Once the stall timeout has passed since
    /// its connection dropped it fails: returns true, and its outcome says why.
    pub fn handle_redial_failed(&mut self, j: NodeId, why: &str, now: Instant) -> bool {
        let Some(a) = self.away.get_mut(j).and_then(Option::as_mut) else {
            return false;
        };
        if now < a.until {
            a.next = Some((now + a.wait).min(a.until));
            a.wait = (a.wait * 2).min(REDIAL_MAX);
            return false;
        }
        let e = format!(
            "{}; not back within {} s ({why})",
            a.reason,
            self.stall.as_secs()
        );
        self.settle(j, Outcome::Failed(e))
    }

    /// Receiver `j` was reached again and re-admitted: it resumes in this session. Returns
    /// whether it was away.
    pub fn handle_back(&mut self, j: NodeId, now: Instant) -> bool {
        if !self.is_away(j) {
            return false;
        }
        self.away[j] = None;
        self.last_progress = now;
        true
    }

    /// Fails every receiver still away (`why`): the session is over for the others, so there
    /// is nothing left to re-admit it into. Returns those failed.
    pub fn give_up_away(&mut self, why: &str) -> Vec<NodeId> {
        let away: Vec<NodeId> = (1..self.away.len()).filter(|&j| self.is_away(j)).collect();
        for &j in &away {
            let reason = self.away[j]
                .as_ref()
                .map_or_else(String::new, |a| a.reason.clone());
            self.settle(j, Outcome::Failed(format!("{reason}; {why}")));
        }
        away
    }

    /// When a timer fires, while a receiver is pending: the stall timer, the next try to reach
    /// a receiver that is away, or the end of its time away.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let away = self
            .away
            .iter()
            .flatten()
            .map(|a| a.next.map_or(a.until, |t| t.min(a.until)))
            .min();
        let stall = self.pending().then(|| self.last_progress + self.stall);
        [stall, away].into_iter().flatten().min()
    }

    /// Gives up on every pending receiver once nothing moved for the stall timeout, and on a
    /// receiver away for that long with no try under way; returns those given up (their outcome
    /// says why). Receivers due for another try are left to [`SourceSession::poll_redial`].
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<NodeId> {
        let mut given_up: Vec<NodeId> = (1..self.away.len())
            .filter(|&j| {
                self.away[j]
                    .as_ref()
                    .is_some_and(|a| a.next.is_some() && now >= a.until)
            })
            .collect();
        for &j in &given_up {
            self.handle_redial_failed(j, "no answer", now);
        }
        if !self.pending() || now < self.last_progress + self.stall {
            return given_up;
        }
        let why = format!("no progress for {} s", self.stall.as_secs());
        let stalled: Vec<NodeId> = (1..self.outcomes.len())
            .filter(|&j| self.outcomes[j].is_none())
            .collect();
        for &j in &stalled {
            self.settle(j, Outcome::Failed(why.clone()));
        }
        given_up.extend(stalled);
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
    fn a_dropped_receiver_is_tried_again_with_backoff_until_the_stall_timeout() {
        let t0 = Instant::now();
        let s = |x: u64| t0 + Duration::from_secs(x);
        let mut w = SourceSession::new(3, Duration::from_secs(20), t0);
        assert!(w.handle_dropped(1, "connection lost: reset".into(), t0));
        assert!(!w.handle_dropped(1, "again".into(), t0), "away already");
        assert!(w.is_away(1));
        assert_eq!(w.poll_timeout(), Some(s(2)));
        assert!(w.poll_redial(s(1)).is_empty());
        assert_eq!(w.poll_redial(s(2)), vec![1]);
        // One try at a time: nothing more is due while it is under way.
        assert!(w.poll_redial(s(3)).is_empty());
        assert!(!w.handle_redial_failed(1, "refused", s(2)));
        assert_eq!(w.poll_redial(s(5)), Vec::<NodeId>::new());
        assert_eq!(w.poll_redial(s(6)), vec![1], "4 s after the first try");
        assert!(!w.handle_redial_failed(1, "refused", s(6)));
        assert_eq!(w.poll_redial(s(14)), vec![1], "then 8 s");
        assert!(!w.handle_redial_failed(1, "refused", s(14)));
        assert_eq!(
            w.poll_redial(s(20)),
            vec![1],
            "at most 8 s, and once at the deadline"
        );
        assert!(w.handle_redial_failed(1, "refused", s(20)));
        match w.outcome(1) {
            Some(Outcome::Failed(e)) => {
                assert!(
                    e.contains("connection lost: reset") && e.contains("not back within 20 s"),
                    "{e}"
                )
            }
            o => panic!("{o:?}"),
        }
        assert!(!w.is_away(1));

        // Reached again: back in the session, progress for the stall timer.
        assert!(w.handle_dropped(2, "connection lost".into(), s(21)));
        assert_eq!(w.poll_redial(s(23)), vec![2]);
        assert!(w.handle_back(2, s(23)));
        assert!(!w.is_away(2) && w.outcome(2).is_none());
        assert_eq!(w.poll_timeout(), Some(s(43)));
        assert!(w.handle_report(2, vec![], s(30)));
        assert!(w.is_over(false), "one failed, one reported");
    }

    #[test]
    fn receivers_away_are_failed_when_the_others_are_done() {
        let t0 = Instant::now();
        let mut w = SourceSession::new(3, Duration::from_secs(30), t0);
        w.handle_report(1, vec![], t0);
        assert!(w.handle_dropped(2, "connection lost".into(), t0));
        assert!(!w.is_over(true), "waits for it");
        assert_eq!(w.give_up_away("the others finished"), vec![2]);
        assert_eq!(
            w.outcome(2),
            Some(&Outcome::Failed(
                "connection lost; the others finished".into()
            ))
        );
        assert!(w.is_over(true));
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
