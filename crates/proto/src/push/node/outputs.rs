//! The node's timers and outputs: stalled children, a silent parent, repeated requests, and
//! what the driver polls (frames per link, events, the next timeout, whether to read more).

use std::time::Instant;

use super::{silent_period, Child, Event, Link, Local, Node, Upstream, KEEPALIVE};
use crate::wire::Frame;

impl Node {
    /// Timers: stalled children, a silent parent, unanswered repair requests.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.clock = now;
        let stall = self.params.stall_timeout;
        let stalled: Vec<usize> = (0..self.children.len())
            .filter(|&k| {
                let c = &self.children[k];
                c.alive
                    && (c.acked < c.next || c.held.is_none())
                    && now.duration_since(c.last_progress) >= stall
            })
            .collect();
        for k in stalled {
            let c = &self.children[k];
            let reason = match c.held {
                None => format!(
                    "stalled: {} did not answer the session set-up for {stall:.0?}",
                    c.name
                ),
                Some(_) => format!(
                    "stalled: {} made no progress for {:.0?} (at chunk {})",
                    c.name, stall, c.acked
                ),
            };
            self.lose_child(k, reason, now);
        }
        for k in self.silent_children(now) {
            let c = &self.children[k];
            let reason = format!(
                "fell behind: {} sent nothing for {:.0?} (at chunk {}) while nodes below it \
                 waited; let go from the push, send again to catch up",
                c.name,
                now.duration_since(c.last_heard),
                c.acked
            );
            self.lose_child(k, reason, now);
        }
        if self.up_keepalive_at().is_some_and(|t| now >= t) {
            self.up_idle_due = true;
            self.up_last = now;
        }
        let lag = self.cfg.lag_timeout;
        for k in self.holding_back() {
            let c = &self.children[k];
            if now.duration_since(c.last_progress) >= lag {
                let reason = format!(
                    "fell behind: {} held the others back for {lag:.0?} (at chunk {}); \
                     let go from the push, send again to catch up",
                    c.name, c.acked
                );
                self.lose_child(k, reason, now);
            }
        }
        for c in self.children.iter_mut().filter(|c| c.alive && !c.end_sent) {
            if c.sent {
                c.sent = false;
                c.quiet_since = now;
            } else if now.duration_since(c.quiet_since) >= KEEPALIVE {
                c.keepalive_due = true;
                c.quiet_since = now;
            }
        }
        let wants = self.wants_input();
        let needs = self.needs_parent();
        let idle = self.cfg.idle_timeout;
        let rto = self.cfg.request_timeout;
        let mut abort = None;
        if let Upstream::Parent {
            last_heard,
            requested,
            up_requests,
            ..
        } = &mut self.upstream
        {
            if !wants || !needs {
                // Silence is our own doing while we are not reading (a full buffer), and no
                // loss once we hold every chunk and the end: a relay waiting for a slow
                // subtree hears nothing more from a parent that has sent it everything.
                *last_heard = now;
            } else if now.duration_since(*last_heard) >= idle {
                abort = Some(format!("parent silent for {idle:.0?}"));
            }
            for (i, at) in requested.iter_mut() {
                if now.duration_since(*at) >= rto {
                    *at = now;
                    up_requests.push_back(*i);
                }
            }
        }
        self.request_dropped(now);
        if let Some(reason) = abort {
            self.events.push_back(Event::Aborted { reason });
        }
    }

    /// Children that hold the others back now: this node cannot take another chunk, the
    /// child's acknowledgement is the lowest and short of what it was sent, and another child
    /// (or this relay's own copy) is ahead of it, so letting it go lets the rest move on.
    fn holding_back(&self) -> Vec<usize> {
        let cs = self.params.chunk_size as usize;
        if self.buffered_bytes + cs <= self.cfg.buffer_budget {
            return Vec::new();
        }
        let live = || self.children.iter().filter(|c| c.alive && c.held.is_some());
        let Some(low) = live().map(|c| c.acked).min() else {
            return Vec::new();
        };
        let own = match &self.upstream {
            Upstream::Parent { stored, local, .. } if *local == Local::Storing => stored.prefix(),
            _ => 0,
        };
        if live().all(|c| c.acked == low) && own <= low {
            return Vec::new();
        }
        (0..self.children.len())
            .filter(|&k| {
                let c = &self.children[k];
                c.alive && c.held.is_some() && c.acked == low && c.acked < c.next
            })
            .collect()
    }

    /// Children with nodes below them still waiting that sent nothing at all for
    /// [`NodeConfig::silent_timeout`] while they had chunks outstanding: a stopped process
    /// (a running relay sends [`super::UP_KEEPALIVE`]s), holding back every node below it.
    ///
    /// Only a timer that fires about when it was set counts: one that fires much later means
    /// this process was not running itself (stopped, starved of CPU), and what its children
    /// sent meanwhile may still be unread, so they get a fresh period instead.
    fn silent_children(&mut self, now: Instant) -> Vec<usize> {
        let grace = self.cfg.silent_timeout / 2;
        let mut silent = Vec::new();
        for k in 0..self.children.len() {
            match self.silent_since(k) {
                // Late by more than `grace` past its deadline: this process was not running.
                Some(t) if now >= t + grace => self.children[k].last_heard = now,
                Some(t) if now >= t => silent.push(k),
                _ => {}
            }
        }
        silent
    }

    /// When child `k` counts as silent if nothing comes from it first (`None`: it cannot).
    fn silent_since(&self, k: usize) -> Option<Instant> {
        let c = &self.children[k];
        let below_waits = c.unresolved.iter().any(|&n| n != c.node);
        (c.alive && c.held.is_some() && c.acked < c.next && below_waits)
            .then(|| c.last_heard + silent_period(self.cfg.silent_timeout, c.rtt))
    }

    /// A relay with children: when its next [`super::UP_KEEPALIVE`] is due (`None`: none is).
    fn up_keepalive_at(&self) -> Option<Instant> {
        let Upstream::Parent { have_sent, .. } = &self.upstream else {
            return None;
        };
        (*have_sent && !self.up_idle_due && self.any_consumer())
            .then(|| self.up_last + super::UP_KEEPALIVE)
    }

    // ----- outputs ------------------------------------------------------------------------

    /// Whether the driver may read more from upstream (input at the source, the parent link
    /// at a relay).
    pub fn wants_input(&self) -> bool {
        let room = self.buffered_bytes + self.params.chunk_size as usize <= self.cfg.buffer_budget;
        match &self.upstream {
            Upstream::Input { done, .. } => !done && room && self.any_consumer(),
            // A missing chunk may sit behind new ones: keep reading (dropping what does not
            // fit, see `handle_chunk`) until it arrives, or the buffer could never drain. The
            // parts of a chunk under way fill room already taken for them.
            Upstream::Parent { requested, .. } => {
                room || !requested.is_empty() || !self.arriving.is_empty()
            }
        }
    }

    /// The next frame for `link`, if any. The driver calls this whenever the link can take
    /// one more frame; returning `None` means nothing is ready for it now.
    pub fn poll_transmit(&mut self, link: Link) -> Option<Frame> {
        match link {
            Link::Parent => {
                let f = self.next_for_parent();
                if f.is_some() {
                    self.up_last = self.clock;
                    self.up_idle_due = false;
                    return f;
                }
                std::mem::take(&mut self.up_idle_due).then(|| {
                    self.up_last = self.clock;
                    Frame::Idle
                })
            }
            Link::Child(k) => {
                if !self.children.get(k)?.alive {
                    return None;
                }
                let f = self
                    .next_for_child(k, self.clock)
                    .map(|f| self.tamper(k, f));
                let c = &mut self.children[k];
                if f.is_some() {
                    c.sent = true;
                    c.keepalive_due = false;
                    return f;
                }
                if std::mem::take(&mut c.keepalive_due) {
                    c.sent = true;
                    return Some(Frame::Idle);
                }
                None
            }
        }
    }

    /// [`super::NodeConfig::tamper_every`]: flips a byte of every n-th chunk sent to child `k`
    /// the first time, or every time with [`super::NodeConfig::tamper_repairs`] (fault
    /// injection for tests; off by default).
    fn tamper(&mut self, k: usize, f: Frame) -> Frame {
        let (n, again) = (self.cfg.tamper_every, self.cfg.tamper_repairs);
        let mut hit =
            |index: u64| n > 0 && index % n == n - 1 && (self.tampered.insert((k, index)) || again);
        // A chunk sent whole, or its first part when it goes in parts.
        match f {
            Frame::Chunk(mut c) if hit(c.index) => {
                c.data = flip(&c.data);
                Frame::Chunk(c)
            }
            Frame::Part(mut p) if p.offset == 0 && hit(p.index) => {
                p.data = flip(&p.data);
                Frame::Part(p)
            }
            f => f,
        }
    }

    /// The next frame for the parent link, keepalives aside.
    fn next_for_parent(&mut self) -> Option<Frame> {
        if let Some(have) = self.take_have() {
            return Some(have);
        }
        let Upstream::Parent {
            up_requests,
            up_reports,
            up_acks,
            ..
        } = &mut self.upstream
        else {
            return None;
        };
        if let Some(index) = up_requests.pop_front() {
            return Some(Frame::Request { index });
        }
        // Acks before reports, so a node's final ack precedes its Done.
        if let Some((node, upto)) = up_acks.pop_first() {
            return Some(Frame::Ack { node, upto });
        }
        up_reports.pop_front()
    }

    /// The next event for the driver.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When [`Node::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let stall = self.params.stall_timeout;
        let mut t = self
            .children
            .iter()
            .filter(|c| c.alive && (c.acked < c.next || c.held.is_none()))
            .map(|c| c.last_progress + stall)
            .chain(
                self.children
                    .iter()
                    .filter(|c| c.alive && !c.end_sent && !c.keepalive_due)
                    .map(|c| c.quiet_since + KEEPALIVE),
            )
            .chain(
                self.holding_back()
                    .into_iter()
                    .map(|k| self.children[k].last_progress + self.cfg.lag_timeout),
            )
            .chain((0..self.children.len()).filter_map(|k| self.silent_since(k)))
            .chain(self.up_keepalive_at())
            .min();
        if let Upstream::Parent {
            last_heard,
            requested,
            dropped_retry,
            ..
        } = &self.upstream
        {
            let mut at = *last_heard + self.cfg.idle_timeout;
            if let Some(r) = requested.values().min() {
                at = at.min(*r + self.cfg.request_timeout);
            }
            if let Some(r) = dropped_retry {
                at = at.min(*r);
            }
            t = Some(t.map_or(at, |t| t.min(at)));
        }
        t
    }

    /// Child links still in use: neither cut off nor with every node below them resolved.
    pub fn live_children(&self) -> usize {
        self.children.iter().filter(|c| !c.is_resolved()).count()
    }

    /// For a relay: whether its own copy is complete and in place.
    pub fn local_done(&self) -> bool {
        matches!(
            self.upstream,
            Upstream::Parent {
                local: Local::Done,
                ..
            }
        )
    }

    /// True when this node has nothing more to do: its own copy is resolved, every child's
    /// subtree is resolved, and nothing is left to send upstream.
    pub fn is_finished(&self) -> bool {
        let children_done = self.children.iter().all(Child::is_resolved);
        let self_done = match &self.upstream {
            Upstream::Input { done, .. } => *done || !self.any_consumer(),
            Upstream::Parent {
                local,
                up_reports,
                up_acks,
                up_requests,
                have_sent,
                ..
            } => {
                *have_sent
                    && matches!(local, Local::Done | Local::Failed)
                    && up_reports.is_empty()
                    && up_acks.is_empty()
                    && up_requests.is_empty()
            }
        };
        self_done && children_done
    }
}

/// A copy of `data` with one bit of its middle byte flipped.
fn flip(data: &bytes::Bytes) -> bytes::Bytes {
    let mut v = data.to_vec();
    if let Some(b) = v.get_mut(data.len() / 2) {
        *b ^= 0x01;
    }
    v.into()
}
