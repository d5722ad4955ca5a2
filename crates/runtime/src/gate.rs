//! Admission limits: how many connections may be in their handshake at once, in all and per
//! source address, and for how long.
//!
//! Why: before a peer has proved who it is, everything it makes this side hold is a gift to
//! whoever can open a TCP connection. The handshake itself reads only small frames
//! ([`crate::transport::HANDSHAKE_MAX_FRAME`]), so a connection costs a task and a socket until
//! it passes or its deadline ends it; these limits bound how many such connections exist, so a
//! flood of half-open handshakes costs the agent a fixed amount of memory and file descriptors.
//!
//! When all places are taken, a new connection takes the place of the oldest handshake under
//! way (which is closed) rather than being turned away: a peer that completes its handshake
//! in a round trip is never the oldest for long, so a flood spread over many addresses delays
//! it at most, while half-open connections that just sit are the first to go. One address past
//! its own limit is turned away: it only crowds out itself.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The limits an accepting side applies before a peer is authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Handshakes under way at once, from all sources (a new one past this closes the oldest).
    pub total: usize,
    /// Handshakes under way at once from one source address.
    pub per_source: usize,
    /// How long a whole handshake may take, from accept to the peer's proof.
    pub deadline: Duration,
}

impl Default for Limits {
    /// 256 in all, 64 per source (a relay pre-dials up to [`crate::predial::MAX_DIAL`]
    /// children and a spread edge opens several connections, all from one address), 10 s.
    fn default() -> Self {
        Self {
            total: 256,
            per_source: 64,
            deadline: crate::transport::HANDSHAKE_TIMEOUT,
        }
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
    /// Handshakes under way, oldest first, with the means to close each.
    queue: BTreeMap<u64, (IpAddr, tokio::sync::oneshot::Sender<()>)>,
    next: u64,
}

impl Counts {
    fn leave(&mut self, source: IpAddr) {
        self.total -= 1;
        if let Some(n) = self.by_source.get_mut(&source) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

/// Counts handshakes under way; [`Gate::enter`] refuses one past the limits.
#[derive(Clone, Default)]
pub struct Gate {
    limits: Limits,
    counts: Arc<Mutex<Counts>>,
}

/// A handshake's place at the gate, given back when dropped (the handshake ended, either way).
pub struct Pass {
    id: u64,
    source: IpAddr,
    counts: Arc<Mutex<Counts>>,
    evicted: tokio::sync::oneshot::Receiver<()>,
}

impl Pass {
    /// Completes when a newer connection took this one's place: the handshake is to end.
    pub async fn evicted(&mut self) {
        // A dropped sender (the gate is gone) ends nothing.
        if (&mut self.evicted).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Why a connection was turned away at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// Too many handshakes under way in all, none of them evictable (a zero limit).
    #[error("too many handshakes under way ({0})")]
    Total(usize),
    /// Too many handshakes under way from this address.
    #[error("too many handshakes under way from {0} ({1})")]
    Source(IpAddr, usize),
}

impl Gate {
    /// A gate with these limits.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            counts: Default::default(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Takes a place for a handshake from `source`, the oldest one's where all are taken, or
    /// says why there is none (this address has all of its own).
    pub fn enter(&self, source: IpAddr) -> Result<Pass, Full> {
        let mut c = self.lock();
        if c.by_source.get(&source).copied().unwrap_or(0) >= self.limits.per_source {
            return Err(Full::Source(source, self.limits.per_source));
        }
        if c.total >= self.limits.total {
            let Some((_, (old, close))) = c.queue.pop_first() else {
                return Err(Full::Total(self.limits.total));
            };
            c.leave(old);
            let _ = close.send(());
        }
        *c.by_source.entry(source).or_default() += 1;
        c.total += 1;
        let id = c.next;
        c.next += 1;
        let (tx, evicted) = tokio::sync::oneshot::channel();
        c.queue.insert(id, (source, tx));
        Ok(Pass {
            id,
            source,
            counts: self.counts.clone(),
            evicted,
        })
    }

    /// Handshakes under way now.
    pub fn pending(&self) -> usize {
        self.lock().total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        // An evicted pass was counted out when it was evicted.
        if c.queue.remove(&self.id).is_some() {
            c.leave(self.source);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn limits_per_source_and_the_oldest_makes_room() {
        let g = Gate::new(Limits {
            total: 3,
            per_source: 2,
            deadline: Duration::from_secs(1),
        });
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let mut p1 = g.enter(a).unwrap();
        let p2 = g.enter(a).unwrap();
        assert_eq!(g.enter(a).err(), Some(Full::Source(a, 2)));
        let _p3 = g.enter(b).unwrap();
        // Full: the newcomer takes the oldest's place, which is told to end.
        let _p4 = g.enter(c).unwrap();
        assert_eq!(g.pending(), 3);
        tokio::time::timeout(Duration::from_secs(1), p1.evicted())
            .await
            .expect("the oldest is evicted");
        drop(p1);
        assert_eq!(g.pending(), 3, "an evicted pass is not counted out twice");
        // `a` has one place again.
        let _p5 = g.enter(a).unwrap();
        drop(p2);
        drop(_p5);
        assert_eq!(g.pending(), 2);
    }
}
