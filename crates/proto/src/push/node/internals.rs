//! The node's internal bookkeeping: holding chunks, delivering them in order, repair
//! requests, completion, reports up the tree and eviction.

use std::time::Instant;

use super::{Event, Local, Node, NodeError, Upstream};
use crate::tree::NodeId;
use crate::wire::{Chunk, End, Frame};

impl Node {
    pub(super) fn hold(&mut self, chunk: Chunk, now: Instant) {
        self.wake_idle_children(now);
        self.buffered_bytes += chunk.data.len();
        self.peak_buffered = self.peak_buffered.max(self.buffered_bytes);
        self.buffer.insert(chunk.index, chunk);
        // Eviction otherwise runs only when an ack arrives. A child that held the whole object
        // (or the rest of it) acked it all at once, before the chunks came in, and acks no more:
        // what it will never take would stay held until the buffer is full, the input stops
        // and the `End` (sealed at the input's end) never reaches anyone below it.
        self.evict();
    }

    /// A child that had everything sent to it acknowledged was not stalled, only idle (the
    /// input paused): its stall clock starts with the first chunk it has to take (whole, or
    /// its first part).
    pub(super) fn wake_idle_children(&mut self, now: Instant) {
        for c in self.children.iter_mut().filter(|c| c.acked >= c.next) {
            c.last_progress = now;
        }
    }

    pub(super) fn deliver_ready(&mut self) {
        let Upstream::Parent { local, .. } = &self.upstream else {
            return;
        };
        match local {
            Local::Storing => {}
            // No local copy any more: what is verified is acknowledged, to keep relaying.
            Local::Failed => return self.ack_self(),
            Local::Finalizing | Local::Done => return,
        }
        loop {
            // Chunks already in the local copy (held from an earlier session) are skipped.
            if let Upstream::Parent { stored, .. } = &self.upstream {
                if stored.contains(self.deliver_next) {
                    self.deliver_next += 1;
                    continue;
                }
            }
            let Some(c) = self.buffer.get(&self.deliver_next) else {
                break;
            };
            self.events.push_back(Event::Deliver {
                index: c.index,
                offset: c.index * self.params.chunk_size as u64,
                data: c.data.clone(),
                hash: c.hash,
            });
            self.deliver_next += 1;
        }
    }

    pub(super) fn request(&mut self, index: u64, now: Instant) {
        if let Upstream::Parent {
            requested,
            up_requests,
            ..
        } = &mut self.upstream
        {
            if requested.insert(index, now).is_none() {
                up_requests.push_back(index);
            }
        }
    }

    /// After `End`, anything below the end that never arrived is requested.
    pub(super) fn request_missing(&mut self, now: Instant) {
        let Some(n) = self.known_chunks() else { return };
        let missing: Vec<u64> = self.have.missing_below(n).collect();
        let Upstream::Parent {
            requested, dropped, ..
        } = &self.upstream
        else {
            return;
        };
        let missing: Vec<u64> = missing
            .into_iter()
            .filter(|i| !requested.contains_key(i) && !dropped.contains(i))
            .take(1024)
            .collect();
        for i in missing {
            self.request(i, now);
        }
    }

    /// Dropped chunks are requested again, lowest first, as memory frees up.
    pub(super) fn request_dropped(&mut self, now: Instant) {
        let cs = self.params.chunk_size as usize;
        let rto = self.cfg.request_timeout;
        loop {
            let Upstream::Parent {
                dropped,
                requested,
                dropped_retry,
                ..
            } = &mut self.upstream
            else {
                return;
            };
            let in_flight = requested.len() * cs;
            if dropped.is_empty() || self.buffered_bytes + in_flight + cs > self.cfg.buffer_budget {
                // Look again later (or when a store frees memory), not in a tight loop.
                *dropped_retry = (!dropped.is_empty()).then(|| now + rto);
                return;
            }
            let Some(i) = dropped.pop_first() else { return };
            self.request(i, now);
        }
    }

    pub(super) fn hard_cap(&self) -> usize {
        self.cfg.buffer_budget + self.cfg.buffer_budget / 2
    }

    pub(super) fn known_chunks(&self) -> Option<u64> {
        self.end
            .map(|e| e.chunks)
            .or_else(|| self.params.manifest.chunks(self.params.chunk_size))
    }

    pub(super) fn check_end(&self, e: &End) -> Result<(), NodeError> {
        let cs = self.params.chunk_size as u64;
        let expect = crate::manifest::chunk_count(e.total_len, self.params.chunk_size);
        if e.chunks != expect {
            return Err(NodeError::Geometry(format!(
                "end says {} chunks for {} bytes at {cs} bytes a chunk",
                e.chunks, e.total_len
            )));
        }
        if let Some(n) = self.params.manifest.total_len {
            if n != e.total_len {
                return Err(NodeError::Geometry(format!(
                    "end says {} bytes, the manifest {n}",
                    e.total_len
                )));
            }
        }
        if let Some((&last, _)) = self.buffer.last_key_value() {
            if last >= e.chunks {
                return Err(NodeError::Geometry("chunks past the end".into()));
            }
        }
        Ok(())
    }

    pub(super) fn maybe_complete(&mut self) {
        let Some(end) = self.end else { return };
        let Upstream::Parent {
            local,
            stored,
            stored_bytes,
            up_reports,
            ..
        } = &mut self.upstream
        else {
            return;
        };
        if *local != Local::Storing || stored.prefix() < end.chunks {
            return;
        }
        if *stored_bytes != end.total_len {
            *local = Local::Failed;
            up_reports.push_back(Frame::Failed {
                node: self.id as u32,
                reason: format!(
                    "stored {stored_bytes} bytes but the object has {}",
                    end.total_len
                ),
            });
            return;
        }
        *local = Local::Finalizing;
        self.events.push_back(Event::Complete {
            total_len: end.total_len,
        });
    }

    /// Queues this node's own acknowledgement. Once its copy has failed it acknowledges what it
    /// verified, so it keeps relaying without holding its parent back.
    pub(super) fn ack_self(&mut self) {
        let verified = self.have.prefix();
        if let Upstream::Parent {
            up_acks,
            stored,
            local,
            ..
        } = &mut self.upstream
        {
            let upto = if *local == Local::Failed {
                verified
            } else {
                stored.prefix()
            };
            up_acks.insert(self.id as u32, upto);
        }
    }

    /// Passes a report from below towards the source, or surfaces it at the source.
    pub(super) fn report(&mut self, frame: Frame) {
        match &mut self.upstream {
            Upstream::Parent {
                up_acks,
                up_reports,
                ..
            } => match frame {
                Frame::Ack { node, upto } => {
                    let e = up_acks.entry(node).or_insert(0);
                    *e = (*e).max(upto);
                }
                other => up_reports.push_back(other),
            },
            Upstream::Input { .. } => self.events.push_back(match frame {
                Frame::Ack { node, upto } => Event::Progress {
                    node: node as NodeId,
                    upto,
                },
                Frame::Done { node, received } => Event::NodeDone {
                    node: node as NodeId,
                    received,
                },
                Frame::Have {
                    node,
                    complete,
                    ranges,
                } => Event::Held {
                    node: node as NodeId,
                    chunks: ranges.iter().map(|(s, e)| e - s).sum(),
                    complete,
                },
                Frame::Failed { node, reason } => Event::NodeFailed {
                    node: node as NodeId,
                    reason,
                },
                Frame::Rejected { node, from, index } => Event::Rejected {
                    node: node as NodeId,
                    from: from as NodeId,
                    index,
                },
                _ => return,
            }),
        }
    }

    /// Drops chunks that every live consumer has.
    pub(super) fn evict(&mut self) {
        let mut low = self
            .children
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.acked)
            .min()
            .unwrap_or(u64::MAX);
        if let Upstream::Parent { local, stored, .. } = &self.upstream {
            if matches!(local, Local::Storing | Local::Finalizing) {
                low = low.min(stored.prefix());
            }
        }
        while let Some(entry) = self.buffer.first_entry() {
            if *entry.key() >= low {
                break;
            }
            self.buffered_bytes -= entry.get().data.len();
            entry.remove();
        }
        self.evict_groups(low);
    }

    pub(super) fn any_consumer(&self) -> bool {
        self.children.iter().any(|c| c.alive)
    }

    /// True while this relay still needs something from its parent.
    pub(super) fn needs_parent(&self) -> bool {
        match self.end {
            None => true,
            Some(e) => self.have.prefix() < e.chunks,
        }
    }

    /// A relay whose own copy is resolved and that has everything its children need can
    /// outlive its parent.
    pub(super) fn local_resolved_and_fed(&self) -> bool {
        let fed = self.end.is_some_and(|e| self.have.prefix() >= e.chunks);
        match &self.upstream {
            Upstream::Parent { local, .. } => {
                fed && matches!(local, Local::Done | Local::Failed | Local::Finalizing)
            }
            Upstream::Input { .. } => true,
        }
    }
}
