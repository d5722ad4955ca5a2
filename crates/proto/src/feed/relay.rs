//! A relay's side of its upstream subscription: products its upstream server delivered,
//! put in the relay's own queue under the source's sequence numbers, in order, once.
//!
//! A relay (`feed serve --upstream`) is a subscriber of the server above it and a server to
//! its site. Its queue keeps the source's sequence numbers and tags, so its subscribers check
//! the source's tag and hash and never learn they talk to a relay. Products come from the
//! upstream verified but not always in order (a large one is hashed off the receive loop
//! while smaller ones after it complete); a queue must take them in order, or a subscriber
//! streaming past a late product would never get it. So [`Relay`] holds a delivered product
//! until the upstream subscription has settled everything before it (delivered, passed over
//! by the filter, or lost), then hands it to the queue.

use std::collections::BTreeMap;

use serde::Serialize;

use super::product::{Micros, ProductMeta};
use super::tree::Candidate;

/// What `feed status` shows of a relay's upstream.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UpstreamStatus {
    /// The upstream server it was given (`--upstream`), `HOST:PORT`: the root of its joins.
    pub source: String,
    /// The server it subscribes to now (the source, or a relay it joined below).
    pub parent: String,
    /// The servers above it, the source first, its parent last.
    pub ancestry: Vec<String>,
    /// Why the parent was chosen.
    pub chosen: String,
    /// The servers measured at the last join ([`crate::feed::tree`]).
    pub measured: Vec<Candidate>,
    /// Joins since the start (the first one included): each after a dead parent.
    pub joins: u64,
    /// Parents given up as dead, excluded from joins for a while.
    pub dead: Vec<String>,
    /// What the relay subscribes to.
    pub feedtype: String,
    /// Connected to it now.
    pub connected: bool,
    /// Products relayed (queued here) since this relay started.
    pub relayed: u64,
    /// Their bytes.
    pub relayed_bytes: u64,
    /// Products the upstream no longer held when the relay asked (evicted there first).
    pub lost: u64,
    /// Connections lost since the start.
    pub disconnects: u64,
    /// Every upstream product below this is relayed, passed over or lost.
    pub settled: u64,
    /// The parent's newest product, when last asked.
    pub upstream_last_seq: Option<u64>,
    /// The source's newest product, when last asked (the source itself: a parent that
    /// withholds products could lie about its own newest), for [`Stall`].
    pub source_last_seq: Option<u64>,
    /// Parents left because they sent nothing while the source moved on ([`Stall`]).
    pub stalls: u64,
    /// Products the parent holds past `settled` (its newest minus what is settled here).
    pub lag: Option<u64>,
    /// Creation to queued here of the newest product relayed, milliseconds.
    pub latency_ms: Option<f64>,
    /// Why the last connection ended, or the last product could not be queued.
    pub last_error: Option<String>,
}

/// The relay's state: products held for order, its position, its counters.
#[derive(Debug)]
pub struct Relay<T> {
    held: BTreeMap<u64, (ProductMeta, T)>,
    /// The first sequence number the relay's queue may still take.
    next: u64,
    status: UpstreamStatus,
}

impl<T> Relay<T> {
    /// A relay whose queue takes products from `next_seq` on (its queue's next sequence
    /// number: 1 for a new relay, after the newest relayed for one restarted).
    pub fn new(source: &str, feedtype: &str, next_seq: u64) -> Self {
        Self {
            held: BTreeMap::new(),
            next: next_seq.max(1),
            status: UpstreamStatus {
                source: source.to_string(),
                parent: source.to_string(),
                feedtype: feedtype.to_string(),
                settled: next_seq.max(1),
                ..UpstreamStatus::default()
            },
        }
    }

    /// Where the upstream subscription resumes after a restart: after the newest product
    /// queued here, or later when the last run's subscription had settled further (products
    /// its filter passed over). `None` for a new relay with no position: the configured start.
    pub fn resume(&self, saved: Option<u64>) -> Option<u64> {
        let queued = (self.next > 1).then_some(self.next);
        match (queued, saved) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The upstream delivered a product, verified, whose bytes the shell keeps as `file`.
    /// Returns `file` back when the product is already queued or held (the shell deletes it).
    pub fn delivered(&mut self, meta: ProductMeta, file: T) -> Option<T> {
        if meta.seq < self.next || self.held.contains_key(&meta.seq) {
            return Some(file);
        }
        self.held.insert(meta.seq, (meta, file));
        None
    }

    /// The upstream subscription settled every product below `below`: the products held
    /// below it, in sequence order, for the shell to queue ([`Relay::queued`] each).
    pub fn settled(&mut self, below: u64) -> Vec<(ProductMeta, T)> {
        self.status.settled = self.status.settled.max(below);
        let later = self.held.split_off(&below);
        let ready = std::mem::replace(&mut self.held, later);
        ready.into_values().collect()
    }

    /// Product `meta` is in the relay's queue (at `now`).
    pub fn queued(&mut self, meta: &ProductMeta, now: Micros) {
        self.next = self.next.max(meta.seq + 1);
        self.status.relayed += 1;
        self.status.relayed_bytes += meta.size;
        self.status.latency_ms = Some(now.saturating_sub(meta.created) as f64 / 1000.0);
    }

    /// A product could not be queued (the reason is shown in the status).
    pub fn failed(&mut self, why: String) {
        self.status.last_error = Some(why);
    }

    /// The upstream no longer held products `from..=to`.
    pub fn lost(&mut self, from: u64, to: u64) {
        self.status.lost += to.saturating_sub(from) + 1;
    }

    /// Connected (`true`) or lost the connection (`false`, with why).
    pub fn connected(&mut self, up: bool, why: Option<String>) {
        if self.status.connected && !up {
            self.status.disconnects += 1;
        }
        self.status.connected = up;
        if why.is_some() {
            self.status.last_error = why;
        }
    }

    /// Joined below `parent` (ancestry: the servers above this relay, the parent last),
    /// chosen `why` among `measured`.
    pub fn joined(
        &mut self,
        parent: &str,
        ancestry: Vec<String>,
        why: String,
        measured: Vec<Candidate>,
    ) {
        self.status.parent = parent.to_string();
        self.status.ancestry = ancestry;
        self.status.chosen = why;
        self.status.measured = measured;
        self.status.joins += 1;
    }

    /// The parents given up as dead, now excluded from joins.
    pub fn set_dead(&mut self, dead: Vec<String>) {
        self.status.dead = dead;
    }

    /// The server subscribed to now.
    pub fn parent(&self) -> &str {
        &self.status.parent
    }

    /// The servers above this relay, the source first.
    pub fn ancestry(&self) -> &[String] {
        &self.status.ancestry
    }

    /// The upstream's newest product, as its status said.
    pub fn upstream_newest(&mut self, last_seq: Option<u64>) {
        self.status.upstream_last_seq = last_seq;
    }

    /// The source's newest product, as its status said (`None`: it did not answer).
    pub fn source_newest(&mut self, last_seq: Option<u64>) {
        self.status.source_last_seq = last_seq;
    }

    /// The source's newest product, when last asked.
    pub fn source_last_seq(&self) -> Option<u64> {
        self.status.source_last_seq
    }

    /// Every upstream product below this is relayed, passed over or lost.
    pub fn settled_below(&self) -> u64 {
        self.status.settled
    }

    /// The parent was left for sending nothing ([`Stall`]).
    pub fn stalled(&mut self) {
        self.status.stalls += 1;
    }

    /// Products held for order.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The status.
    pub fn status(&self) -> UpstreamStatus {
        let mut s = self.status.clone();
        s.lag = s
            .upstream_last_seq
            .map(|n| (n + 1).saturating_sub(s.settled));
        s
    }
}

/// How long a relay waits on a parent that sends nothing while the source moves on before
/// it leaves it ([`Stall`]), per relay between it and the source. Long enough that the
/// status polls (every 5 s) see the source ahead six times, so one slow or lost answer does
/// not decide; and over twice what a parent needs to route around its own dead parent
/// (10 s to give it up, 3 s to join again, then it sends again), so a relay does not
/// abandon a parent that is recovering. Leaving costs a join and a WAN connection to
/// the source, and the parent stays out of joins for 5 minutes: better late than wrongly.
pub const PARENT_STALL: Micros = 30_000_000;

/// Watches a relay's parent for sending nothing while connected: withholding products, or
/// stuck itself (on an upstream that refuses it, or stopped). Dead parents (connections
/// that fail) are the shell's; this one's connection is fine and silent.
///
/// The parent is left when nothing came from it for the stall time (no product settled,
/// no new byte of a product) while the source, asked itself, was known ahead of the
/// relay all along (its newest product at or past the relay's settled position). The
/// source is asked, not the parent: a parent withholding products could also understate
/// its newest. So a parent that is merely slow is kept (its bytes keep coming, even in a
/// product that takes minutes), an idle feed is no stall (the source is not ahead), and
/// a source that does not answer leaves nothing to compare: the parent is kept (it may be
/// the only way to the feed).
#[derive(Debug, Clone)]
pub struct Stall {
    limit: Micros,
    /// Every product below it is settled here.
    settled: u64,
    /// When something last came from the parent (or the watch began).
    heard: Micros,
    /// The source's newest product, when last asked (`None`: no answer).
    source: Option<u64>,
    /// Since when the source has been known ahead with nothing from the parent.
    since: Option<Micros>,
}

/// Why a parent is left ([`Stall::poll_leave`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    /// How long nothing came from it.
    pub silent: Micros,
    /// The source's newest product.
    pub source: u64,
    /// The relay's settled position (every product below it settled).
    pub settled: u64,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent nothing for {:.0} s while the source is at seq {} and we are at {}",
            self.silent as f64 / 1e6,
            self.source,
            self.settled.saturating_sub(1)
        )
    }
}

impl Stall {
    /// A watch of a new subscription at `now`, the relay settled below `settled`, with
    /// `relays_above` relays between it and the source (its parent included). The stall
    /// time is `limit` per relay above: when a relay higher up stalls, every relay below
    /// it stalls too, and the one just below it must be the first to leave (then its
    /// subtree follows it to its new parent) rather than the whole subtree scattering to
    /// the source. `limit` 0 never leaves.
    pub fn new(limit: Micros, relays_above: usize, settled: u64, now: Micros) -> Self {
        Self {
            limit: limit.saturating_mul(relays_above.max(1) as u64),
            settled,
            heard: now,
            source: None,
            since: None,
        }
    }

    /// The stall time of this watch.
    pub fn limit(&self) -> Micros {
        self.limit
    }

    /// The subscription settled every product below `below`.
    pub fn handle_settled(&mut self, below: u64, now: Micros) {
        if below > self.settled {
            self.settled = below;
            self.heard(now);
        }
    }

    /// New bytes of a product came from the parent.
    pub fn handle_bytes(&mut self, now: Micros) {
        self.heard(now);
    }

    fn heard(&mut self, now: Micros) {
        self.heard = now;
        // Still behind a source known ahead: the count starts again from here.
        self.since = self.ahead().then_some(now);
    }

    fn ahead(&self) -> bool {
        self.source.is_some_and(|s| s >= self.settled)
    }

    /// The source's newest product, as its status said (`None`: it did not answer, or
    /// holds nothing).
    pub fn handle_source_newest(&mut self, last_seq: Option<u64>, now: Micros) {
        self.source = last_seq;
        match self.ahead() {
            true => {
                self.since.get_or_insert(now);
            }
            false => self.since = None,
        }
    }

    /// Whether to leave the parent now, and why.
    pub fn poll_leave(&self, now: Micros) -> Option<Stalled> {
        let since = self.since?;
        if self.limit == 0 || now.saturating_sub(since) < self.limit {
            return None;
        }
        Some(Stalled {
            silent: now.saturating_sub(self.heard),
            source: self.source?,
            settled: self.settled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seq: u64) -> ProductMeta {
        ProductMeta {
            seq,
            name: format!("p{seq}"),
            feedtype: "X".into(),
            created: 1_000,
            size: 10,
            hash: [0; 32],
            tag: bytes::Bytes::new(),
        }
    }

    /// Delivers `seq`s in the given order, settling after each as the upstream's receiver
    /// would (`settle[i]` after the i-th), and returns the order products reach the queue.
    fn run(r: &mut Relay<u64>, steps: &[(u64, u64)]) -> Vec<u64> {
        let mut out = Vec::new();
        for &(seq, settle) in steps {
            assert_eq!(r.delivered(meta(seq), seq), None, "{seq} is new");
            for (m, file) in r.settled(settle) {
                assert_eq!(m.seq, file);
                r.queued(&m, 2_000);
                out.push(m.seq);
            }
        }
        out
    }

    #[test]
    fn products_reach_the_queue_in_order_whatever_order_they_complete_in() {
        let mut r = Relay::new("up:1", "ANY", 1);
        // 2 is large and hashed off the loop: 3 and 5 complete first (4 was filtered out).
        let order = run(&mut r, &[(1, 2), (3, 2), (5, 2), (2, 6)]);
        assert_eq!(order, vec![1, 2, 3, 5]);
        assert_eq!(r.held(), 0);
        let s = r.status();
        assert_eq!((s.relayed, s.relayed_bytes, s.settled), (4, 40, 6));
        assert_eq!(s.latency_ms, Some(1.0));
    }

    #[test]
    fn nothing_twice_across_a_reconnect_or_a_restart() {
        let mut r = Relay::new("up:1", "ANY", 1);
        assert_eq!(r.resume(None), None, "a new relay starts where it is told");
        assert_eq!(run(&mut r, &[(7, 8), (8, 9)]), vec![7, 8]);
        // The upstream sends 8 again (the subscription resumed from an older position).
        assert_eq!(r.delivered(meta(8), 80), Some(80));
        assert_eq!(r.delivered(meta(9), 9), None);
        assert_eq!(r.delivered(meta(9), 90), Some(90), "held already");
        // A restart: the queue's next sequence number, or the subscription's if further.
        let r2: Relay<u64> = Relay::new("up:1", "ANY", 9);
        assert_eq!(r2.resume(None), Some(9));
        assert_eq!(r2.resume(Some(12)), Some(12));
        assert_eq!(r2.resume(Some(3)), Some(9));
    }

    /// A source and a relay's server: the relay keeps the source's numbers and tags, skips
    /// gaps without calling them lost, and refuses what its source did not sign.
    #[test]
    fn a_relays_server_keeps_the_source_tags_and_tells_gaps_from_losses() {
        use super::super::msg::{Msg, Start};
        use super::super::product::{AllowRule, ProductAuth, SecretAuth};
        use super::super::queue::{ProductQueue, QueueError, QueueLimits};
        use super::super::server::{RelayError, Server, ServerConfig, UniOut};
        use crate::auth::Secret;
        use std::sync::Arc;

        let auth: Arc<dyn ProductAuth> = Arc::new(SecretAuth::new(&Secret::from_bytes([5; 32])));
        let limits = QueueLimits {
            max_bytes: 1 << 20,
            max_age: u64::MAX,
        };
        let cfg = ServerConfig {
            limits,
            allow: vec![AllowRule::parse("*=ANY").unwrap()],
            allow_relay: Vec::new(),
            push: None,
            unicast_block: 1 << 16,
            feed_id: 1,
            group_key: None,
        };
        let mut src = Server::new(cfg.clone(), auth.clone(), ProductQueue::new(limits, 1));
        let mut metas = Vec::new();
        for ft in ["IDS", "NEXRAD3", "IDS"] {
            metas.push(src.insert("p", ft, 10, [1; 32], 5).unwrap().0);
        }
        let mut relay = Server::new(cfg, auth, ProductQueue::new(limits, 1));
        let mut forged = metas[0].clone();
        forged.name = "q".into();
        assert_eq!(relay.relay(forged, 6), Err(RelayError::BadTag(1)));
        relay.relay(metas[0].clone(), 6).unwrap();
        relay.relay(metas[2].clone(), 6).unwrap();
        assert_eq!(
            relay.relay(metas[0].clone(), 6),
            Err(RelayError::Queue(QueueError::Behind { seq: 1, newest: 3 }))
        );
        let ip = "127.0.0.1".parse().unwrap();
        let id = relay
            .subscribe(ip, "ANY", "", Start::Seq(1), false)
            .unwrap();
        let mut got = Vec::new();
        while let Some(out) = relay.poll_unicast(id, 7) {
            got.push(out);
        }
        let products: Vec<_> = got
            .iter()
            .filter_map(|o| match o {
                UniOut::Msg(Msg::Product { meta, .. }) => Some(meta.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            products,
            vec![metas[0].clone(), metas[2].clone()],
            "the source's, as signed"
        );
        assert!(
            !got.iter()
                .any(|o| matches!(o, UniOut::Msg(Msg::Skip { .. }))),
            "a gap is no loss: {got:?}"
        );
        assert!(got.contains(&UniOut::Msg(Msg::Index { last_seq: 3 })));
        // A multicast subscriber that saw 1 and 3 asks about 2: not held, not gone.
        relay.handle_msg(id, Msg::Describe { seq: 2 }, 8);
        assert_eq!(
            relay.poll_unicast(id, 8),
            Some(UniOut::Msg(Msg::Skip {
                from: 2,
                to: 2,
                gone: false
            }))
        );
    }

    #[test]
    fn status_shows_lag_losses_and_disconnects() {
        let mut r: Relay<u64> = Relay::new("up:1", "NEXRAD*", 1);
        r.connected(true, None);
        r.lost(1, 4);
        r.settled(5);
        r.upstream_newest(Some(9));
        r.connected(false, Some("reset".into()));
        let s = r.status();
        assert_eq!((s.lost, s.lag, s.disconnects), (4, Some(5), 1));
        assert!(!s.connected);
        assert_eq!(s.last_error.as_deref(), Some("reset"));
    }
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    const S: Micros = 1_000_000;

    #[test]
    fn a_silent_parent_is_left_once_the_source_was_ahead_for_the_stall_time() {
        let mut w = Stall::new(30 * S, 1, 13, 0);
        w.handle_source_newest(Some(12), S);
        assert_eq!(w.poll_leave(100 * S), None, "idle: the source is not ahead");
        w.handle_source_newest(Some(24), 40 * S);
        assert_eq!(w.poll_leave(69 * S), None);
        let left = w.poll_leave(70 * S).expect("30 s behind a source ahead");
        assert_eq!(
            left,
            Stalled {
                silent: 70 * S,
                source: 24,
                settled: 13
            }
        );
        assert_eq!(
            left.to_string(),
            "sent nothing for 70 s while the source is at seq 24 and we are at 12"
        );
    }

    #[test]
    fn a_slow_parent_is_kept_while_anything_comes() {
        let mut w = Stall::new(30 * S, 1, 1, 0);
        w.handle_source_newest(Some(100), 0);
        // One large product: no product settles for minutes, its bytes keep coming.
        for t in 1..=300 {
            w.handle_bytes(t * S);
            w.handle_source_newest(Some(100 + t), t * S);
            assert_eq!(w.poll_leave(t * S + S / 2), None, "at {t} s");
        }
        w.handle_settled(2, 301 * S);
        assert_eq!(w.poll_leave(330 * S), None);
        // Then nothing: 30 s after the last thing heard.
        assert!(w.poll_leave(331 * S).is_some());
        // A settled position that does not move is nothing heard.
        let mut w = Stall::new(30 * S, 1, 5, 0);
        w.handle_source_newest(Some(9), 0);
        w.handle_settled(5, 20 * S);
        w.handle_settled(3, 25 * S);
        assert!(w.poll_leave(30 * S).is_some());
    }

    #[test]
    fn no_answer_from_the_source_is_no_stall() {
        let mut w = Stall::new(30 * S, 1, 1, 0);
        w.handle_source_newest(Some(50), 0);
        w.handle_source_newest(None, 20 * S);
        assert_eq!(w.poll_leave(60 * S), None);
        // Back: the count starts when it is seen ahead again.
        w.handle_source_newest(Some(50), 60 * S);
        assert_eq!(w.poll_leave(89 * S), None);
        assert!(w.poll_leave(90 * S).is_some());
        // Caught up (the parent delivered up to the source's newest): not ahead.
        w.handle_settled(51, 91 * S);
        assert_eq!(w.poll_leave(200 * S), None);
    }

    #[test]
    fn deeper_relays_wait_longer_and_zero_never_leaves() {
        let mut deep = Stall::new(30 * S, 3, 1, 0);
        assert_eq!(deep.limit(), 90 * S);
        deep.handle_source_newest(Some(7), 0);
        assert_eq!(deep.poll_leave(89 * S), None);
        assert!(deep.poll_leave(90 * S).is_some());
        let mut off = Stall::new(0, 1, 1, 0);
        off.handle_source_newest(Some(7), 0);
        assert_eq!(off.poll_leave(u64::MAX), None);
        assert_eq!(Stall::new(30 * S, 0, 1, 0).limit(), 30 * S, "at least one");
    }
}
