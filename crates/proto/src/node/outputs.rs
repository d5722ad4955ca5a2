//! The node's timers and outputs: stalled children, a silent parent, repeated requests, and
//! what the driver polls (frames per link, events, the next timeout, whether to read more).

use std::time::Instant;

use super::{Child, Event, Link, Local, Node, Upstream, KEEPALIVE};
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
            Link::Child(k) => {
                if !self.children.get(k)?.alive {
                    return None;
                }
                let f = self.next_for_child(k, self.clock);
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
