//! Resuming: what a node already holds from an earlier session of the same object.
//!
//! A receiver answers its `Open` with `Have`: the verified chunks its local copy kept from an
//! earlier session (see [`Node::resume`]), or that it holds an identical copy in place. Its
//! parent then sends it only the rest, and reports the `Have` up to the source. A relay that
//! held chunks before the session never gets them from its own parent, so when one of its
//! children lacks them it reads them back from its local copy ([`Event::Load`]): what moves on
//! every edge is what the node below lacks, and nothing else.
//!
//! Memory: a chunk read back for a child is kept only until it is sent to every child that
//! asked for it, and each child asks for at most [`LOAD_AHEAD`] at a time, so reading back adds
//! at most `LOAD_AHEAD` chunks per child to the node's buffer budget.

use std::time::Instant;

use bytes::Bytes;

use super::{Event, Link, Local, Node, NodeError, Upstream};
use crate::chunkmap::ChunkMap;
use crate::wire::Frame;

/// Chunks read back from the local copy ahead of need, per child.
pub const LOAD_AHEAD: usize = 4;

/// How far past a child's next chunk to look for chunks to read back ahead.
const LOAD_SCAN: u64 = 64;

impl Node {
    /// A relay, before its driver starts: its local copy already holds `held` (verified chunks
    /// from an earlier session of the same object, see `bulkcast_runtime::store`), or, with
    /// `complete`, the whole object in place. Its `Have` says so, its parent sends it only the
    /// rest, and what its children lack of `held` is read back from the copy.
    pub fn resume(&mut self, held: ChunkMap, complete: bool, _now: Instant) {
        let n = self.known_chunks();
        let held = match (complete, n) {
            (true, Some(n)) => ChunkMap::from_ranges(&[(0, n)], n),
            (true, None) => return, // a stream is never complete before its end
            (false, n) => ChunkMap::from_ranges(&held.ranges(), n.unwrap_or(0)),
        };
        let lens: u64 = held
            .ranges()
            .iter()
            .flat_map(|&(s, e)| s..e)
            .map(|i| self.chunk_len(i).unwrap_or(0))
            .sum();
        let Upstream::Parent {
            stored,
            stored_bytes,
            local,
            have_sent,
            resumed,
            up_reports,
            ..
        } = &mut self.upstream
        else {
            return;
        };
        if *have_sent || *local != Local::Storing || held.is_empty() {
            return;
        }
        *stored = held.clone();
        *stored_bytes = lens;
        *resumed = Some((held.clone(), complete));
        if complete {
            *local = Local::Done;
            up_reports.push_back(Frame::Done {
                node: self.id as u32,
                received: 0,
            });
        }
        self.have = held;
        self.ack_self();
        self.deliver_ready();
    }

    /// Chunk bytes this node took from its parent in this session.
    pub fn received_bytes(&self) -> u64 {
        match &self.upstream {
            Upstream::Parent { received, .. } => *received,
            Upstream::Input { .. } => 0,
        }
    }

    /// The `Have` to send up, once, before anything else.
    pub(super) fn take_have(&mut self) -> Option<Frame> {
        let Upstream::Parent {
            have_sent, resumed, ..
        } = &mut self.upstream
        else {
            return None;
        };
        if std::mem::replace(have_sent, true) {
            return None;
        }
        let (ranges, complete) = match resumed {
            Some((m, c)) => (m.ranges(), *c),
            None => (Vec::new(), false),
        };
        Some(Frame::Have {
            node: self.id as u32,
            complete,
            ranges,
        })
    }

    /// A `Have` from child `k`'s subtree: its own tells what not to send it; every one goes on
    /// to the source.
    pub(super) fn handle_have(
        &mut self,
        k: usize,
        node: u32,
        complete: bool,
        ranges: Vec<(u64, u64)>,
        now: Instant,
    ) -> Result<(), NodeError> {
        let limit = self.known_chunks().unwrap_or(0);
        let c = &mut self.children[k];
        if node as usize == c.node {
            if c.held.is_some() {
                return Err(NodeError::Unexpected {
                    frame: "Have",
                    link: Link::Child(k),
                });
            }
            c.held = Some(match complete {
                true => ChunkMap::from_ranges(&[(0, limit)], limit),
                false => ChunkMap::from_ranges(&ranges, limit),
            });
            c.last_progress = now;
        }
        self.report(Frame::Have {
            node,
            complete,
            ranges,
        });
        Ok(())
    }

    /// The driver read chunk `index` back from the local copy.
    pub fn handle_loaded(&mut self, index: u64, data: Bytes, now: Instant) {
        if !self.loading.contains(&index) {
            return;
        }
        if self.chunk_len(index) != Some(data.len() as u64) {
            return self.handle_load_failed(index, "short read".into(), now);
        }
        self.loading.remove(&index);
        let chunk = self.keys.seal(self.params.session, index, data);
        for c in self.children.iter_mut().filter(|c| c.alive) {
            if c.loads.contains(&index) {
                c.loaded.insert(index, chunk.clone());
            }
        }
    }

    /// The driver could not read chunk `index` back: it is fetched from the parent instead.
    pub fn handle_load_failed(&mut self, index: u64, reason: String, now: Instant) {
        self.loading.remove(&index);
        self.refetch.insert(index);
        for c in &mut self.children {
            c.loads.remove(&index);
        }
        self.events.push_back(Event::Corrupt {
            index,
            reason: format!("reading it back from the local copy: {reason}"),
        });
        self.request(index, now);
    }

    /// Length of chunk `index`, when the object's length is known.
    pub(super) fn chunk_len(&self, index: u64) -> Option<u64> {
        let total = self
            .end
            .map(|e| e.total_len)
            .or(self.params.manifest.total_len)?;
        let cs = self.params.chunk_size as u64;
        let off = index.checked_mul(cs)?;
        (off < total).then(|| cs.min(total - off))
    }

    /// Chunk `i` can be read back from the local copy (or, at a source, from its input).
    fn on_disk(&self, i: u64) -> bool {
        match &self.upstream {
            Upstream::Parent { stored, local, .. } => {
                *local != Local::Failed && stored.contains(i) && !self.refetch.contains(&i)
            }
            Upstream::Input { .. } => self.reread && self.have.contains(i),
        }
    }

    /// What goes to child `k` next: a chunk it asked for again, the next in order that it does
    /// not hold, or the end. Chunks only on disk are read back first ([`Event::Load`]).
    pub(super) fn next_for_child(&mut self, k: usize, now: Instant) -> Option<Frame> {
        let mut want = Vec::new();
        let f = self.next_frame(k, &mut want);
        if f.is_none() {
            // A chunk it needs that this node had but keeps nowhere now (after an adoption).
            let next = self.children[k].next;
            let gone = self.children[k].held.is_some()
                && self.have.contains(next)
                && !self.buffer.contains_key(&next)
                && !self.on_disk(next)
                && !self.refetch.contains(&next);
            if gone {
                self.chunk_gone(k, next, now);
            }
        }
        for i in want {
            if self.loading.insert(i) {
                let len = self.chunk_len(i).unwrap_or(0);
                self.events.push_back(Event::Load {
                    index: i,
                    offset: i * self.params.chunk_size as u64,
                    len,
                });
            }
        }
        f
    }

    fn next_frame(&mut self, k: usize, want: &mut Vec<u64>) -> Option<Frame> {
        self.children[k].held.as_ref()?;
        while let Some(&i) = self.children[k].requests.front() {
            if let Some(f) = self.take_for(k, i) {
                self.children[k].requests.pop_front();
                return Some(f);
            }
            if self.on_disk(i) {
                if self.children[k].loads.insert(i) {
                    want.push(i);
                }
                break; // wait for it, meanwhile the stream goes on
            }
            if self.refetch.contains(&i) || self.arriving.contains_key(&i) {
                break; // coming from the parent
            }
            self.children[k].requests.pop_front();
        }
        if self.mid_chunk(k) {
            // The rest of a chunk going in parts comes first; nothing else until it is whole.
            return self.next_part(k);
        }
        let c = &mut self.children[k];
        let held = c.held.as_ref().expect("checked above");
        while held.contains(c.next) {
            c.next += 1;
        }
        let next = c.next;
        if let Some(f) = self.start_parts(k, next).or_else(|| self.take_for(k, next)) {
            self.children[k].next += 1;
            return Some(f);
        }
        if self.on_disk(next) {
            self.load_ahead(k, next, want);
            return None;
        }
        let c = &mut self.children[k];
        match self.end {
            Some(e) if c.next == e.chunks && !c.end_sent => {
                c.end_sent = true;
                Some(Frame::End(e))
            }
            _ => None,
        }
    }

    /// Chunk `i` for child `k` from memory: the buffer, or what was read back for it.
    fn take_for(&mut self, k: usize, i: u64) -> Option<Frame> {
        if let Some(chunk) = self.buffer.get(&i) {
            return Some(Frame::Chunk(chunk.clone()));
        }
        let c = &mut self.children[k];
        let chunk = c.loaded.remove(&i)?;
        c.loads.remove(&i);
        Some(Frame::Chunk(chunk))
    }

    /// Asks for chunk `from` and the next few that child `k` lacks and only the disk has.
    fn load_ahead(&mut self, k: usize, from: u64, want: &mut Vec<u64>) {
        let n = self.known_chunks().unwrap_or(0);
        for i in from..n.min(from + LOAD_SCAN) {
            let c = &self.children[k];
            if c.loads.len() >= LOAD_AHEAD && i != from {
                break;
            }
            let lacks = !c.held.as_ref().is_some_and(|h| h.contains(i));
            if lacks && !self.buffer.contains_key(&i) && self.on_disk(i) {
                if self.children[k].loads.insert(i) {
                    want.push(i);
                }
            } else if i == from {
                return;
            }
        }
    }
}
