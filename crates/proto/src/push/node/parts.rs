//! Chunks in verified parts: a relay forwards each 16 KiB group as soon as it has checked it,
//! instead of waiting for the whole chunk.
//!
//! A chunk sent in parts is a [`Head`] (the chunk's header and its groups' chaining values,
//! checked once against the authenticated hash) and then [`Part`]s in order. The receiving node
//! keeps the verified prefix of each such chunk in `arriving`; a child whose next chunk is one
//! of them gets the same `Head` and then every part as it is verified (its `cursor`). When the
//! last part arrives the chunk is whole and goes the way a whole chunk goes (local copy,
//! acknowledgements, eviction). A part that fails its check is never forwarded: the chunk is
//! dropped and requested again, as a corrupt whole chunk is, and children part-way through it
//! wait for the repair, which continues their parts where they were.
//!
//! Why: with whole chunks every hop adds a chunk's arrival time, several round trips during
//! slow start on a long path (0.7 s per hop at 200 ms in the lab); with parts it is a group's.
//! Edges spread over several connections carry whole chunks (their frames may be reordered).

use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::{Event, Node, NodeError, Upstream};
use crate::groups::{Groups, GROUP};
use crate::wire::{Chunk, Frame, Head, Part};

/// A chunk arriving in parts: its header and the verified prefix of its bytes.
#[derive(Debug)]
pub(super) struct Arriving {
    head: Head,
    groups: Groups,
    /// Verified parts, in order; together `have` bytes.
    parts: Vec<Bytes>,
    have: usize,
}

impl Arriving {
    /// Verified bytes `from..` (at most `max`), as they arrived: no copy.
    fn slice(&self, from: usize, max: usize) -> Option<Bytes> {
        if from >= self.have {
            return None;
        }
        let mut at = 0;
        for p in &self.parts {
            if from < at + p.len() {
                let s = from - at;
                return Some(p.slice(s..p.len().min(s + max)));
            }
            at += p.len();
        }
        None
    }
}

/// The chunk offset of the first group of `data` (the chunk's bytes from `from`, a group
/// boundary) that does not match its chaining value, if any.
fn first_bad_group(groups: &Groups, from: usize, data: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at < data.len() {
        let g = (from + at) / GROUP;
        let n = groups.range(g).len().min(data.len() - at);
        if !groups.check(g, &data[at..at + n]) {
            return Some(from + at);
        }
        at += n;
    }
    None
}

/// Where a child is in the chunk it is being sent in parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Cursor {
    index: u64,
    offset: usize,
}

impl Node {
    /// A chunk's header from the parent: the chunk follows in parts.
    pub(super) fn handle_head(&mut self, h: Head, now: Instant) -> Result<(), NodeError> {
        self.check_geometry(h.index, h.len as usize)?;
        if self.have.contains(h.index) && !self.refetch.contains(&h.index) {
            return Ok(()); // a duplicate: its parts are ignored too
        }
        if self.arriving.contains_key(&h.index) {
            return Ok(()); // a repair of a chunk under way: its parts fill in what is missing
        }
        let groups = match self.keys.verify_head(self.params.session, &h) {
            Ok(g) => g,
            Err(e) => {
                self.corrupt(h.index, e.to_string(), now);
                return Ok(());
            }
        };
        if !self.admit(h.index, h.len as usize, now) {
            return Ok(());
        }
        self.wake_idle_children(now);
        // Its room is taken now, so that a chunk can always be completed once started.
        self.buffered_bytes += h.len as usize;
        self.peak_buffered = self.peak_buffered.max(self.buffered_bytes);
        self.arriving.insert(
            h.index,
            Arriving {
                head: h,
                groups,
                parts: Vec::new(),
                have: 0,
            },
        );
        Ok(())
    }

    /// Bytes of a chunk announced by a `Head`: checked group by group, and kept (and so
    /// forwarded) only if every group holds; a part with a bad group drops its chunk.
    pub(super) fn handle_part(&mut self, p: Part, now: Instant) -> Result<(), NodeError> {
        let Some(a) = self.arriving.get_mut(&p.index) else {
            return Ok(()); // not taken, or already whole
        };
        let offset = p.offset as usize;
        let len = a.head.len as usize;
        if !offset.is_multiple_of(GROUP) || offset + p.data.len() > len || p.data.is_empty() {
            return Err(NodeError::Geometry(format!(
                "part of chunk {} at {offset} with {} bytes; the chunk has {len}",
                p.index,
                p.data.len()
            )));
        }
        let index = p.index;
        if offset > a.have {
            // Something before it went missing (a parent that changed mid-chunk): fetch it.
            self.take_arriving(index);
            self.request(index, now);
            return Ok(());
        }
        // What is new in it starts at a group boundary: both offsets are multiples of GROUP.
        let data = p.data.slice((a.have - offset).min(p.data.len())..);
        if let Some(at) = first_bad_group(&a.groups, a.have, &data) {
            // Like a corrupt whole chunk: dropped and asked for again (its room freed for
            // what comes meanwhile); children part-way through it wait for the repair.
            self.take_arriving(index);
            self.corrupt(
                index,
                format!("chunk {index}: group at byte {at} does not match its hash"),
                now,
            );
            return Ok(());
        }
        if !data.is_empty() {
            a.have += data.len();
            a.parts.push(data);
        }
        if a.have == len {
            self.complete_arriving(index, now);
        }
        Ok(())
    }

    /// The last part of chunk `index` arrived: it is whole and verified.
    fn complete_arriving(&mut self, index: u64, now: Instant) {
        let Some(a) = self.arriving.remove(&index) else {
            return;
        };
        self.buffered_bytes -= a.head.len as usize;
        let data = match a.parts.len() {
            1 => a.parts[0].clone(),
            _ => {
                let mut b = BytesMut::with_capacity(a.have);
                for p in &a.parts {
                    b.extend_from_slice(p);
                }
                b.freeze()
            }
        };
        let h = a.head;
        if !h.cvs.is_empty() {
            self.groups_of.insert(index, h.cvs);
        }
        self.accept(
            Chunk {
                index,
                hash: h.hash,
                tag: h.tag,
                sig: h.sig,
                data,
            },
            now,
        );
    }

    /// A whole chunk for one that was arriving in parts (a repair sent whole): its room is
    /// already taken.
    pub(super) fn take_arriving(&mut self, index: u64) -> bool {
        match self.arriving.remove(&index) {
            Some(a) => {
                self.buffered_bytes -= a.head.len as usize;
                true
            }
            None => false,
        }
    }

    /// A chunk or part failed verification: it goes no further, and is asked for again.
    pub(super) fn corrupt(&mut self, index: u64, reason: String, now: Instant) {
        self.events.push_back(Event::Corrupt { index, reason });
        // The source hears who sent it (`Rejected`), a bounded number of times.
        if self.count_rejection(index) {
            self.report(Frame::Rejected {
                node: self.id as u32,
                from: self.parent_node,
                index,
            });
        }
        // At once, even if it was a repair that came corrupt: waiting for the request's
        // timeout would hold up everything behind it.
        if let Upstream::Parent { requested, .. } = &mut self.upstream {
            requested.remove(&index);
        }
        self.request(index, now);
    }

    /// Whether chunks go to children in parts: over edges of one connection each (a spread
    /// edge may reorder frames), when the node is set to.
    fn sends_parts(&self) -> bool {
        self.cfg.part_bytes > 0 && !self.params.edges.is_striped()
    }

    /// Child `k`'s next frame in order when its next chunk can go in parts: the `Head` (the
    /// child's cursor starts), or `None` to send it whole if it can be.
    pub(super) fn start_parts(&mut self, k: usize, i: u64) -> Option<Frame> {
        if !self.sends_parts() {
            return None;
        }
        let head = match (self.arriving.get(&i), self.buffer.get(&i)) {
            (Some(a), _) => a.head.clone(),
            (None, Some(c)) => {
                let cvs = self.groups_of.get(&i)?.clone();
                Head {
                    index: i,
                    len: c.data.len() as u32,
                    hash: c.hash,
                    tag: c.tag,
                    sig: c.sig.clone(),
                    cvs,
                }
            }
            (None, None) => return None,
        };
        self.children[k].cursor = Some(Cursor {
            index: i,
            offset: 0,
        });
        Some(Frame::Head(head))
    }

    /// The next part for child `k`, whose cursor is set: `None` while the parent has not sent
    /// (and this node verified) more of it.
    pub(super) fn next_part(&mut self, k: usize) -> Option<Frame> {
        let cur = self.children[k].cursor?;
        let max = self.cfg.part_bytes.max(GROUP);
        let (data, len) = match (self.buffer.get(&cur.index), self.arriving.get(&cur.index)) {
            (Some(c), _) => {
                let end = c.data.len().min(cur.offset + max);
                (c.data.slice(cur.offset..end), c.data.len())
            }
            (None, Some(a)) => (a.slice(cur.offset, max)?, a.head.len as usize),
            // Neither whole nor under way: it was lost with the parent, and comes again.
            (None, None) => return None,
        };
        let offset = cur.offset;
        let end = offset + data.len();
        self.children[k].cursor = (end < len).then_some(Cursor {
            index: cur.index,
            offset: end,
        });
        Some(Frame::Part(Part {
            index: cur.index,
            offset: offset as u32,
            data,
        }))
    }

    /// Whether child `k` is in the middle of a chunk sent in parts.
    pub(super) fn mid_chunk(&self, k: usize) -> bool {
        self.children[k].cursor.is_some()
    }

    /// Whether a live child is part-way through chunk `index`.
    pub(super) fn mid_chunk_on(&self, index: u64) -> bool {
        self.children
            .iter()
            .any(|c| c.alive && c.cursor.is_some_and(|cur| cur.index == index))
    }

    /// Forgets the group lists of chunks below `low` (evicted with them).
    pub(super) fn evict_groups(&mut self, low: u64) {
        self.groups_of = self.groups_of.split_off(&low);
    }

    /// Source: keeps the group list of a chunk it produced.
    pub(super) fn keep_groups(&mut self, index: u64, cvs: Vec<[u8; 32]>) {
        if !cvs.is_empty() {
            self.groups_of.insert(index, cvs);
        }
    }
}
