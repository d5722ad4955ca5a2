//! The source's state machine: the queue, allow rules, every subscriber's unicast stream,
//! repairs, and the multicast pusher.
//!
//! Each subscriber gets, over its own reliable connection, first its backlog (products from
//! its start up to the point where multicast takes over, or everything when it has no
//! multicast), then repairs. The shell calls [`Server::poll_unicast`] for a subscriber when
//! its connection can take more, so a slow subscriber only slows itself.

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::msg::{Msg, Start};
use super::product::{
    allowed, AllowRule, HostPattern, Micros, ProductAuth, ProductMeta, Subscription,
};
use super::push::{PushConfig, PushOut, Pusher};
use super::queue::{ProductQueue, QueueError, QueueLimits};
use crate::mcast::seal::GroupKey;

/// The server's settings.
#[derive(Clone)]
pub struct ServerConfig {
    /// Queue bounds.
    pub limits: QueueLimits,
    /// Who may subscribe to what; empty admits nobody.
    pub allow: Vec<AllowRule>,
    /// Which subscribers are listed as relay children when they announce themselves
    /// ([`Msg::Relay`]): joining relays may choose them as parents. Empty: any subscriber
    /// admitted (`feed serve --allow-relay`, whose default this is).
    pub allow_relay: Vec<HostPattern>,
    /// Multicast, if the LAN carries it.
    pub push: Option<PushConfig>,
    /// Bytes per unicast data message.
    pub unicast_block: u32,
    /// This run's feed id (random per start: stale datagrams of an old run are ignored).
    pub feed_id: u64,
    /// The key the group's datagrams are sealed under, handed to every multicast subscriber
    /// in its `Accepted`; `None`: the group goes in clear (`--plaintext`). Drawn afresh at
    /// every start and never stored ([`super::seal`]: the datagram numbers, its nonces,
    /// start again at 0).
    pub group_key: Option<GroupKey>,
}

/// Why a relayed product was not queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RelayError {
    /// Its tag is not its source's.
    #[error("product {0}: its tag is not the source's; not relayed")]
    BadTag(u64),
    /// The queue refused it.
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// A subscriber's handle.
pub type SubId = u64;

/// What the shell sends next to a subscriber.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UniOut {
    /// A message without product bytes.
    Msg(Msg),
    /// Bytes `offset..offset+len` of product `seq`, as a [`Msg::Data`].
    Block {
        /// Which product.
        seq: u64,
        /// Where.
        offset: u64,
        /// How many.
        len: u32,
    },
}

/// Most repair bytes queued for one subscriber; a receiver asking for more asks again later.
const MAX_REPAIR_BYTES: u64 = 256 << 20;

struct Sub {
    host: IpAddr,
    sub: Subscription,
    multicast: bool,
    /// Next sequence number to consider for the unicast stream.
    cursor: u64,
    /// The unicast stream stops before this (multicast carries the rest).
    until: u64,
    /// The product being streamed: (seq, next offset, size).
    sending: Option<(u64, u64, u64)>,
    ctrl: VecDeque<Msg>,
    repairs: VecDeque<(u64, u64, u32)>,
    repair_bytes: u64,
    wholes: VecDeque<u64>,
    indexed: u64,
    acked: u64,
    sent_bytes: u64,
    repaired_bytes: u64,
}

/// A subscriber in the status.
#[derive(Debug, Serialize)]
pub struct SubStatus {
    /// Its handle.
    pub id: SubId,
    /// Its address.
    pub host: String,
    /// What it asked for.
    pub feedtype: String,
    /// `multicast` or `unicast`.
    pub transport: &'static str,
    /// Newest sequence number it confirmed with nothing missing below.
    pub acked: u64,
    /// Products queued after that.
    pub lag: u64,
    /// Bytes sent to it by unicast (backlog and feed).
    pub unicast_bytes: u64,
    /// Bytes of repairs sent to it.
    pub repair_bytes: u64,
}

/// The server's status (`feed status`).
#[derive(Debug, Serialize)]
pub struct ServerStatus {
    /// Products queued.
    pub products: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Oldest and newest sequence numbers.
    pub first_seq: Option<u64>,
    /// Newest.
    pub last_seq: Option<u64>,
    /// Queue bound in bytes.
    pub max_bytes: u64,
    /// Multicast group, if any.
    pub group: Option<String>,
    /// Datagrams and bytes multicast.
    pub multicast_sent: (u64, u64),
    /// Of those, repair symbols (parity) on the group.
    pub multicast_repair: (u64, u64),
    /// Milliseconds of the group's rate lost to late polls of the pacer (a busy host):
    /// [`super::push::Pusher::late`].
    #[serde(default)]
    pub multicast_late_ms: u64,
    /// The subscribers.
    pub subscribers: Vec<SubStatus>,
    /// Where a relay's products come from (the shell fills it in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<super::relay::UpstreamStatus>,
    /// The relays subscribed here as relays ([`super::tree`]), by the address they gave (the
    /// shell fills it in).
    pub relay_children: Vec<String>,
    /// Relay children taken at most (the shell fills it in).
    pub max_relay_children: u32,
    /// Subscribers that announced themselves as relays and were not listed: no
    /// `--allow-relay` pattern covers their host.
    pub relays_refused: u64,
}

/// The source.
pub struct Server {
    cfg: ServerConfig,
    auth: Arc<dyn ProductAuth>,
    queue: ProductQueue,
    pusher: Option<Pusher>,
    subs: BTreeMap<SubId, Sub>,
    next_id: SubId,
    relays_refused: u64,
}

impl Server {
    /// A server over `queue` (new or restored from disk).
    pub fn new(cfg: ServerConfig, auth: Arc<dyn ProductAuth>, queue: ProductQueue) -> Self {
        let sealed = cfg.group_key.is_some();
        let pusher = cfg
            .push
            .clone()
            .map(|p| Pusher::new(p, queue.next_seq(), sealed));
        Self {
            cfg,
            auth,
            queue,
            pusher,
            subs: BTreeMap::new(),
            next_id: 1,
            relays_refused: 0,
        }
    }

    /// This run's feed id.
    pub fn feed_id(&self) -> u64 {
        self.cfg.feed_id
    }

    /// The queue.
    pub fn queue(&self) -> &ProductQueue {
        &self.queue
    }

    /// Checks a product's size before its bytes are read.
    pub fn check_size(&self, name: &str, size: u64) -> Result<(), QueueError> {
        self.queue.check_size(name, size)
    }

    /// Queues a product whose bytes the shell holds (hash computed): signs it, hands it to
    /// the pusher. Returns its metadata and the sequence numbers evicted.
    pub fn insert(
        &mut self,
        name: &str,
        feedtype: &str,
        size: u64,
        hash: [u8; 32],
        now: Micros,
    ) -> Result<(ProductMeta, Vec<u64>), QueueError> {
        let mut meta = ProductMeta {
            seq: self.queue.next_seq(),
            name: name.to_string(),
            feedtype: feedtype.to_string(),
            created: now,
            size,
            hash,
            tag: Default::default(),
        };
        meta.tag = self.auth.tag(&meta);
        let evicted = self.queue.insert(meta.clone(), now)?;
        self.after_evict(&evicted);
        if let Some(p) = &mut self.pusher {
            if self.subs.values().any(|s| s.multicast) {
                p.push(meta.seq);
            }
        }
        Ok((meta, evicted))
    }

    /// Queues a product relayed from an upstream server, under its source's sequence number
    /// and tag (a relay never signs: its subscribers check the source's tag and hash, so it
    /// cannot forge or alter a product). It must come after every product queued (see
    /// [`ProductQueue::insert_at`]). Returns the sequence numbers evicted.
    pub fn relay(&mut self, meta: ProductMeta, now: Micros) -> Result<Vec<u64>, RelayError> {
        if !self.auth.verify(&meta) {
            return Err(RelayError::BadTag(meta.seq));
        }
        let seq = meta.seq;
        let evicted = self.queue.insert_at(meta, now)?;
        self.after_evict(&evicted);
        if let Some(p) = &mut self.pusher {
            if self.subs.values().any(|s| s.multicast) {
                p.push(seq);
            }
        }
        Ok(evicted)
    }

    /// Drops aged products; returns them for the shell to delete.
    pub fn expire(&mut self, now: Micros) -> Vec<u64> {
        let gone = self.queue.expire(now);
        self.after_evict(&gone);
        gone
    }

    fn after_evict(&mut self, evicted: &[u64]) {
        if let (Some(p), Some(first)) = (&mut self.pusher, self.queue.first_seq()) {
            if !evicted.is_empty() {
                p.forget_before(first);
            }
        }
    }

    /// Whether the allow rules admit `host` as a subscriber (of some feedtype).
    pub fn admits(&self, host: IpAddr) -> bool {
        self.cfg.allow.iter().any(|r| r.covers_host(host))
    }

    /// Subscriber `id` announced itself as a relay: whether it may be listed as a relay child
    /// (joining relays may then choose it as their parent). A subscriber this server has,
    /// whose host an `allow_relay` pattern covers (any, with none given); a refusal is
    /// counted. Refused or not, it stays a subscriber.
    pub fn may_relay(&mut self, id: SubId) -> bool {
        let Some(host) = self.subs.get(&id).map(|s| s.host) else {
            return false;
        };
        let rules = &self.cfg.allow_relay;
        let ok = rules.is_empty() || rules.iter().any(|r| r.covers(host));
        self.relays_refused += u64::from(!ok);
        ok
    }

    /// A subscriber asks. Refused (with the reason to send back) when no rule covers its host
    /// or its subscription does not parse; otherwise its handle and the `Accepted` message is
    /// the first thing [`Server::poll_unicast`] returns.
    pub fn subscribe(
        &mut self,
        host: IpAddr,
        feedtype: &str,
        name: &str,
        start: Start,
        multicast: bool,
    ) -> Result<SubId, String> {
        if !self.admits(host) {
            return Err(format!(
                "host {host} is not allowed to subscribe (no allow rule covers it)"
            ));
        }
        let sub = Subscription::parse(feedtype, name).map_err(|e| e.to_string())?;
        let multicast = multicast && self.pusher.is_some();
        let mut cursor = match start {
            Start::Now => self.queue.next_seq(),
            Start::Seq(s) => s.max(1),
            Start::Time(t) => self.queue.seq_from_time(t),
        };
        let mut ctrl = VecDeque::new();
        let until = match (&self.pusher, multicast) {
            (Some(p), true) => p.next_unstarted(self.queue.next_seq()),
            _ => u64::MAX,
        };
        let floor = self.queue.floor();
        if cursor < floor {
            let to = (floor - 1).min(until.saturating_sub(1));
            if cursor <= to {
                ctrl.push_back(Msg::Skip {
                    from: cursor,
                    to,
                    gone: true,
                });
            }
            cursor = floor;
        }
        let push = self.pusher.as_ref().map(|p| p.config().clone());
        ctrl.push_front(Msg::Accepted {
            feed_id: self.cfg.feed_id,
            group: push
                .as_ref()
                .filter(|_| multicast)
                .map_or(String::new(), |p| p.group.clone()),
            block: push.as_ref().map_or(self.cfg.unicast_block, |p| p.block),
            mcast_from: if multicast { until } else { u64::MAX },
            first: cursor,
            key: self.cfg.group_key.clone().filter(|_| multicast),
        });
        if let Some(p) = push.as_ref().filter(|p| multicast && p.layout(1).is_some()) {
            ctrl.insert(1, Msg::Coding { k: p.k, m: p.m });
        }
        let id = self.next_id;
        self.next_id += 1;
        let acked = cursor.saturating_sub(1);
        self.subs.insert(
            id,
            Sub {
                host,
                sub,
                multicast,
                cursor,
                until,
                sending: None,
                ctrl,
                repairs: VecDeque::new(),
                repair_bytes: 0,
                wholes: VecDeque::new(),
                indexed: 0,
                acked,
                sent_bytes: 0,
                repaired_bytes: 0,
            },
        );
        Ok(id)
    }

    /// A subscriber left.
    pub fn unsubscribe(&mut self, id: SubId) {
        self.subs.remove(&id);
    }

    /// A message from a subscriber.
    pub fn handle_msg(&mut self, id: SubId, msg: Msg, now: Micros) {
        let block = self
            .pusher
            .as_ref()
            .map_or(self.cfg.unicast_block, |p| p.config().block);
        let Some(s) = self.subs.get_mut(&id) else {
            return;
        };
        match msg {
            Msg::Ack { seq } => s.acked = s.acked.max(seq),
            Msg::Whole { seq } if !s.wholes.contains(&seq) && s.wholes.len() < 65536 => {
                s.wholes.push_back(seq);
            }
            Msg::Repair { seq, ranges } => {
                let Some(e) = self.queue.get(seq) else {
                    s.ctrl.push_back(Msg::Skip {
                        from: seq,
                        to: seq,
                        gone: true,
                    });
                    return;
                };
                for (first, n) in ranges {
                    let off = u64::from(first) * u64::from(block);
                    let end = (off + u64::from(n) * u64::from(block)).min(e.meta.size);
                    let mut o = off;
                    while o < end && s.repair_bytes < MAX_REPAIR_BYTES {
                        let len = (end - o).min(u64::from(self.cfg.unicast_block)) as u32;
                        s.repairs.push_back((seq, o, len));
                        s.repair_bytes += u64::from(len);
                        o += u64::from(len);
                    }
                }
            }
            Msg::Nak { seq, blocks, heard } => {
                let (Some(p), true) = (&mut self.pusher, s.multicast) else {
                    return;
                };
                match self.queue.get(seq) {
                    Some(e) => p.handle_nak(now, seq, e.meta.size, &blocks, heard),
                    None => s.ctrl.push_back(Msg::Skip {
                        from: seq,
                        to: seq,
                        gone: true,
                    }),
                }
            }
            Msg::Describe { seq } => {
                let e = self.queue.get(seq);
                let ok = e.is_some_and(|e| {
                    s.sub.matches(&e.meta) && allowed(&self.cfg.allow, s.host, &e.meta.feedtype)
                });
                s.ctrl.push_back(match e.filter(|_| ok) {
                    Some(e) => Msg::Product {
                        meta: e.meta.clone(),
                        sent_at: self
                            .pusher
                            .as_ref()
                            .and_then(|p| p.sent_at(seq))
                            .unwrap_or(0),
                    },
                    // Not held and not gone: a gap in a relay's queue, not part of this feed.
                    None => Msg::Skip {
                        from: seq,
                        to: seq,
                        gone: e.is_none() && self.queue.is_gone(seq),
                    },
                });
            }
            Msg::Fallback { seq } => {
                s.multicast = false;
                s.until = u64::MAX;
                s.cursor = s.cursor.min(seq.max(1));
                s.indexed = 0;
            }
            _ => {}
        }
    }

    /// The shell could not read product `seq` for subscriber `id` (it left the queue while
    /// being sent): the subscriber is told it is gone.
    pub fn abort_product(&mut self, id: SubId, seq: u64) {
        if let Some(s) = self.subs.get_mut(&id) {
            if s.sending.is_some_and(|x| x.0 == seq) {
                s.sending = None;
            }
            s.repairs.retain(|r| r.0 != seq);
            s.ctrl.push_back(Msg::Skip {
                from: seq,
                to: seq,
                gone: true,
            });
        }
    }

    /// What to send subscriber `id` next: control, then repairs, then whole products asked
    /// for, then its stream. `None` when there is nothing for now.
    pub fn poll_unicast(&mut self, id: SubId, now: Micros) -> Option<UniOut> {
        let block = self.cfg.unicast_block;
        let s = self.subs.get_mut(&id)?;
        if let Some(m) = s.ctrl.pop_front() {
            return Some(UniOut::Msg(m));
        }
        if let Some((seq, offset, len)) = s.repairs.pop_front() {
            s.repair_bytes -= u64::from(len);
            s.repaired_bytes += u64::from(len);
            if let (Some(p), true) = (&mut self.pusher, s.multicast) {
                p.charge(now, u64::from(len));
            }
            return Some(UniOut::Block { seq, offset, len });
        }
        if let Some((seq, offset, size)) = s.sending {
            let len = (size - offset).min(u64::from(block));
            s.sending = (offset + len < size).then_some((seq, offset + len, size));
            s.sent_bytes += len;
            return Some(UniOut::Block {
                seq,
                offset,
                len: len as u32,
            });
        }
        if let Some(seq) = s.wholes.pop_front() {
            let e = self.queue.get(seq);
            let ok = e.is_some_and(|e| {
                s.sub.matches(&e.meta) && allowed(&self.cfg.allow, s.host, &e.meta.feedtype)
            });
            let Some(e) = e.filter(|_| ok) else {
                return Some(UniOut::Msg(Msg::Skip {
                    from: seq,
                    to: seq,
                    gone: e.is_none() && self.queue.is_gone(seq),
                }));
            };
            let sent_at = self
                .pusher
                .as_ref()
                .and_then(|p| p.sent_at(seq))
                .unwrap_or(now);
            if e.meta.size > 0 {
                s.sending = Some((seq, 0, e.meta.size));
            }
            return Some(UniOut::Msg(Msg::Product {
                meta: e.meta.clone(),
                sent_at,
            }));
        }
        Self::next_in_stream(s, &self.queue, &self.cfg.allow, now)
    }

    fn next_in_stream(
        s: &mut Sub,
        q: &ProductQueue,
        allow: &[AllowRule],
        now: Micros,
    ) -> Option<UniOut> {
        // Bounded: a long run of unwanted products is passed over a slice at a time.
        for _ in 0..4096 {
            if s.cursor >= s.until {
                break;
            }
            if s.cursor < q.floor() {
                // The queue wrapped past this subscriber: the products it skipped are gone.
                let (from, to) = (s.cursor, (q.floor() - 1).min(s.until - 1));
                s.cursor = to + 1;
                return Some(UniOut::Msg(Msg::Skip {
                    from,
                    to,
                    gone: true,
                }));
            }
            let Some(e) = q.next_from(s.cursor) else {
                break;
            };
            if e.meta.seq >= s.until {
                s.cursor = s.until;
                break;
            }
            s.cursor = e.meta.seq + 1;
            if s.sub.matches(&e.meta) && allowed(allow, s.host, &e.meta.feedtype) {
                if e.meta.size > 0 {
                    s.sending = Some((e.meta.seq, 0, e.meta.size));
                }
                return Some(UniOut::Msg(Msg::Product {
                    meta: e.meta.clone(),
                    sent_at: now,
                }));
            }
        }
        // Everything wanted up to the cursor has been sent: say so, so the subscriber can
        // count products it did not want as done (its lag) without being sent them.
        let upto = s.cursor.min(s.until).min(q.next_seq()).saturating_sub(1);
        if upto > s.indexed {
            s.indexed = upto;
            return Some(UniOut::Msg(Msg::Index { last_seq: upto }));
        }
        None
    }

    /// The next multicast datagram, if the pacer allows.
    pub fn poll_multicast(&mut self, now: Micros) -> Option<PushOut> {
        if !self.subs.values().any(|s| s.multicast) {
            return None;
        }
        self.pusher.as_mut()?.poll(now, &self.queue)
    }

    /// When [`Server::poll_multicast`] may next have something.
    pub fn multicast_timeout(&self) -> Option<Micros> {
        self.pusher.as_ref().map(|p| p.poll_timeout())
    }

    /// The status.
    pub fn status(&self) -> ServerStatus {
        let (products, bytes) = self.queue.len_bytes();
        let last = self.queue.last_seq().unwrap_or(0);
        ServerStatus {
            products,
            bytes,
            first_seq: self.queue.first_seq(),
            last_seq: self.queue.last_seq(),
            max_bytes: self.queue.limits().max_bytes,
            group: self.cfg.push.as_ref().map(|p| p.group.clone()),
            multicast_sent: self.pusher.as_ref().map_or((0, 0), |p| p.sent),
            multicast_repair: self.pusher.as_ref().map_or((0, 0), |p| p.repair),
            multicast_late_ms: self.pusher.as_ref().map_or(0, |p| p.late / 1000),
            subscribers: self
                .subs
                .iter()
                .map(|(id, s)| SubStatus {
                    id: *id,
                    host: s.host.to_string(),
                    feedtype: s.sub.feedtype.as_str().to_string(),
                    transport: if s.multicast { "multicast" } else { "unicast" },
                    acked: s.acked,
                    lag: last.saturating_sub(s.acked),
                    unicast_bytes: s.sent_bytes,
                    repair_bytes: s.repaired_bytes,
                })
                .collect(),
            upstream: None,
            relay_children: Vec::new(),
            max_relay_children: 0,
            relays_refused: self.relays_refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;
    use crate::feed::product::SecretAuth;

    fn server(allow_relay: &[&str]) -> Server {
        let limits = QueueLimits {
            max_bytes: 1 << 20,
            max_age: u64::MAX,
        };
        let cfg = ServerConfig {
            limits,
            allow: vec![AllowRule::parse("*=ANY").unwrap()],
            allow_relay: allow_relay
                .iter()
                .map(|p| HostPattern::parse(p).unwrap())
                .collect(),
            push: None,
            unicast_block: 1 << 16,
            feed_id: 1,
            group_key: None,
        };
        let auth = Arc::new(SecretAuth::new(&Secret::from_bytes([5; 32])));
        Server::new(cfg, auth, ProductQueue::new(limits, 1))
    }

    fn sub(s: &mut Server, host: &str) -> SubId {
        let host = host.parse().unwrap();
        s.subscribe(host, "ANY", "", Start::Now, false).unwrap()
    }

    #[test]
    fn only_hosts_allowed_to_relay_are_listed_and_the_others_are_counted() {
        // No --allow-relay: any subscriber admitted may relay (the behaviour before it).
        let mut open = server(&[]);
        let id = sub(&mut open, "203.0.113.7");
        assert!(open.may_relay(id));
        assert!(!open.may_relay(99), "not a subscriber");
        assert_eq!(open.status().relays_refused, 0);

        let mut s = server(&["10.1.0.0/16", "192.0.2.5"]);
        let (site, one, other) = (
            sub(&mut s, "10.1.2.3"),
            sub(&mut s, "::ffff:192.0.2.5"),
            sub(&mut s, "10.2.0.1"),
        );
        assert!(s.may_relay(site) && s.may_relay(one));
        assert!(!s.may_relay(other));
        assert!(!s.may_relay(other), "asked again");
        let st = s.status();
        assert_eq!(st.relays_refused, 2);
        // Refused as a relay, it is still a subscriber with its products.
        assert_eq!(st.subscribers.len(), 3);
        assert!(s.poll_unicast(other, 1).is_some(), "its Accepted");
    }
}
