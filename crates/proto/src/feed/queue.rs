//! The product queue's model: which products the source holds, bounded by size and age.
//!
//! Like LDM's `pq`, the queue is a window over the stream: inserting past the size bound
//! evicts the oldest products, and products older than the age bound go. Unlike `pq` the
//! model holds no bytes (the shell stores each product as a file) and sequence numbers are
//! never reused, so a subscriber's position survives any wrap-around of the window.

use std::collections::BTreeMap;

use super::product::{Micros, ProductMeta};

/// The queue's bounds.
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    /// Sum of the sizes of the products held.
    pub max_bytes: u64,
    /// Products queued longer than this go.
    pub max_age: Micros,
}

/// Why a product was not queued.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// Larger than the whole queue: it could never be held, so it is refused, not truncated.
    #[error("product {name:?} is {size} bytes, larger than the queue ({max} bytes): raise --queue-mib or split it")]
    TooLarge {
        /// Its name.
        name: String,
        /// Its size.
        size: u64,
        /// The queue's size.
        max: u64,
    },
    /// A relayed product at or below the newest one queued (already relayed, or out of
    /// order): taking it would send a subscriber something twice or behind its position.
    #[error("product {seq} is not after the newest queued ({newest}): already relayed")]
    Behind {
        /// Its sequence number.
        seq: u64,
        /// The newest sequence number the queue has taken.
        newest: u64,
    },
}

/// One product in the queue.
#[derive(Debug, Clone)]
pub struct Entry {
    /// What it is.
    pub meta: ProductMeta,
    /// When the queue took it (the age bound counts from here).
    pub queued: Micros,
}

/// The queue's index.
#[derive(Debug, Clone)]
pub struct ProductQueue {
    limits: QueueLimits,
    entries: BTreeMap<u64, Entry>,
    bytes: u64,
    next_seq: u64,
    /// Products below this left the queue (evicted or aged out) or were never restored:
    /// they are gone. Between it and `next_seq`, a relay's queue has gaps (products its
    /// feedtype filter passed over), which are not gone but were never part of this feed.
    floor: u64,
}

impl ProductQueue {
    /// An empty queue whose first product gets `next_seq` (1 for a new queue; the one after
    /// the last used when a queue is reopened).
    pub fn new(limits: QueueLimits, next_seq: u64) -> Self {
        Self {
            limits,
            entries: BTreeMap::new(),
            bytes: 0,
            next_seq: next_seq.max(1),
            floor: next_seq.max(1),
        }
    }

    /// Products below this are gone from the queue (see [`ProductQueue::is_gone`]).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// True when product `seq` was in the queue (or may have been) and is no longer: a
    /// subscriber asking for it lost it. False for a product not yet queued, or a gap in
    /// a relay's queue.
    pub fn is_gone(&self, seq: u64) -> bool {
        seq < self.floor
    }

    /// The sequence number the next product gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Checks that a product of `size` can be queued at all, before its bytes are taken.
    pub fn check_size(&self, name: &str, size: u64) -> Result<(), QueueError> {
        if size > self.limits.max_bytes {
            return Err(QueueError::TooLarge {
                name: name.to_string(),
                size,
                max: self.limits.max_bytes,
            });
        }
        Ok(())
    }

    /// Queues a product; `meta.seq` is set to its sequence number. Returns the sequence
    /// numbers evicted to make room (the shell deletes their files).
    pub fn insert(&mut self, mut meta: ProductMeta, now: Micros) -> Result<Vec<u64>, QueueError> {
        meta.seq = self.next_seq;
        self.insert_at(meta, now)
    }

    /// Queues a product under the sequence number it carries (a relay keeps its source's
    /// numbers, so the source's tag still verifies downstream). It must come after every
    /// product the queue took: numbers may be skipped (the relay's filter passed over
    /// products), never reused or taken out of order, so a subscriber's position stays
    /// exact. Returns the sequence numbers evicted to make room.
    pub fn insert_at(&mut self, meta: ProductMeta, now: Micros) -> Result<Vec<u64>, QueueError> {
        self.check_size(&meta.name, meta.size)?;
        if meta.seq < self.next_seq {
            return Err(QueueError::Behind {
                seq: meta.seq,
                newest: self.next_seq - 1,
            });
        }
        let mut evicted = self.expire(now);
        while self.bytes + meta.size > self.limits.max_bytes {
            match self.pop_oldest() {
                Some(s) => evicted.push(s),
                None => break,
            }
        }
        self.next_seq = meta.seq + 1;
        self.bytes += meta.size;
        self.entries.insert(meta.seq, Entry { meta, queued: now });
        Ok(evicted)
    }

    /// Restores a product read back from disk (keeps its sequence number).
    pub fn restore(&mut self, meta: ProductMeta, queued: Micros) {
        self.next_seq = self.next_seq.max(meta.seq + 1);
        // What came before the oldest product restored is taken as gone (a relay's gaps
        // there are not told apart from evictions after a restart).
        if self.entries.is_empty() || meta.seq < self.floor {
            self.floor = meta.seq;
        }
        self.bytes += meta.size;
        if let Some(old) = self.entries.insert(meta.seq, Entry { meta, queued }) {
            self.bytes -= old.meta.size;
        }
    }

    /// Takes back the floor a relay's queue saved before it stopped ([`ProductQueue::floor`]
    /// then), once its products are restored: the numbers between it and the oldest product
    /// restored are gaps its filter passed over, not products gone, and without it a
    /// subscriber from before them would be told they are lost. Never raised past what
    /// [`ProductQueue::restore`] found (a product restored is held, whatever was saved).
    pub fn restore_floor(&mut self, saved: u64) {
        self.floor = self.floor.min(saved.max(1));
    }

    /// Drops products past the age bound; returns their sequence numbers.
    pub fn expire(&mut self, now: Micros) -> Vec<u64> {
        let mut gone = Vec::new();
        while let Some(e) = self.entries.values().next() {
            if now.saturating_sub(e.queued) <= self.limits.max_age {
                break;
            }
            if let Some(s) = self.pop_oldest() {
                gone.push(s);
            }
        }
        gone
    }

    fn pop_oldest(&mut self) -> Option<u64> {
        let (seq, e) = self.entries.pop_first()?;
        self.bytes -= e.meta.size;
        self.floor = self.floor.max(seq + 1);
        Some(seq)
    }

    /// The product `seq`, if still held.
    pub fn get(&self, seq: u64) -> Option<&Entry> {
        self.entries.get(&seq)
    }

    /// The oldest sequence number held.
    pub fn first_seq(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// The newest sequence number held.
    pub fn last_seq(&self) -> Option<u64> {
        self.entries.keys().next_back().copied()
    }

    /// The first product at or after `seq`.
    pub fn next_from(&self, seq: u64) -> Option<&Entry> {
        self.entries.range(seq..).next().map(|(_, e)| e)
    }

    /// The sequence number of the first product created at or after `t` (`next_seq` if none).
    pub fn seq_from_time(&self, t: Micros) -> u64 {
        self.entries
            .values()
            .find(|e| e.meta.created >= t)
            .map_or(self.next_seq, |e| e.meta.seq)
    }

    /// Products held and their bytes.
    pub fn len_bytes(&self) -> (usize, u64) {
        (self.entries.len(), self.bytes)
    }

    /// The bounds.
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn meta(name: &str, size: u64, created: Micros) -> ProductMeta {
        ProductMeta {
            seq: 0,
            name: name.into(),
            feedtype: "X".into(),
            created,
            size,
            hash: [0; 32],
            tag: Bytes::new(),
        }
    }

    #[test]
    fn wraps_around_by_size_and_keeps_sequence_numbers() {
        let mut q = ProductQueue::new(
            QueueLimits {
                max_bytes: 100,
                max_age: u64::MAX,
            },
            1,
        );
        for i in 0..10 {
            let ev = q.insert(meta(&format!("p{i}"), 30, i), i).unwrap();
            assert_eq!(ev.len(), usize::from(i >= 3), "insert {i}: {ev:?}");
        }
        assert_eq!((q.first_seq(), q.last_seq()), (Some(8), Some(10)));
        assert_eq!(q.len_bytes(), (3, 90));
        assert_eq!(q.next_from(2).map(|e| e.meta.seq), Some(8));
    }

    #[test]
    fn ages_out_and_refuses_what_cannot_fit() {
        let mut q = ProductQueue::new(
            QueueLimits {
                max_bytes: 100,
                max_age: 10,
            },
            5,
        );
        q.insert(meta("a", 1, 0), 0).unwrap();
        q.insert(meta("b", 1, 5), 5).unwrap();
        assert_eq!(q.expire(12), vec![5]);
        assert_eq!(q.seq_from_time(3), 6);
        let e = q.insert(meta("huge", 101, 0), 12).unwrap_err();
        assert!(e.to_string().contains("larger than the queue"), "{e}");
        assert_eq!(q.len_bytes(), (1, 1), "a refused product changes nothing");
    }

    fn at(seq: u64, size: u64) -> ProductMeta {
        ProductMeta {
            seq,
            ..meta(&format!("p{seq}"), size, seq)
        }
    }

    #[test]
    fn a_relay_keeps_its_sources_numbers_with_gaps_and_never_goes_back() {
        let mut q = ProductQueue::new(
            QueueLimits {
                max_bytes: 100,
                max_age: u64::MAX,
            },
            1,
        );
        // A relay started while its source was at 500, whose filter passed over 502.
        assert!(q.insert_at(at(500, 40), 0).unwrap().is_empty());
        assert!(q.insert_at(at(501, 40), 1).unwrap().is_empty());
        assert_eq!(q.insert_at(at(503, 40), 2).unwrap(), vec![500]);
        assert_eq!(q.next_seq(), 504);
        assert_eq!(q.next_from(502).map(|e| e.meta.seq), Some(503));
        // Evicted is gone; a gap and what came before the relay's first product are not.
        assert!(q.is_gone(500) && !q.is_gone(501) && !q.is_gone(502));
        assert_eq!(q.floor(), 501);
        // Already relayed, or behind the newest: refused, and nothing changes.
        for seq in [503, 502, 1] {
            let e = q.insert_at(at(seq, 1), 3).unwrap_err();
            assert_eq!(e, QueueError::Behind { seq, newest: 503 });
        }
        assert_eq!(q.len_bytes(), (2, 80));
        // A local insert continues after the newest.
        q.insert(meta("local", 1, 4), 4).unwrap();
        assert_eq!(q.last_seq(), Some(504));
    }

    #[test]
    fn what_came_before_a_restored_queue_is_gone() {
        let lim = QueueLimits {
            max_bytes: 100,
            max_age: u64::MAX,
        };
        let mut q = ProductQueue::new(lim, 10);
        assert_eq!(
            q.floor(),
            10,
            "an empty reopened queue lost everything before it"
        );
        q.restore(at(7, 1), 0);
        q.restore(at(9, 1), 0);
        assert_eq!((q.floor(), q.next_seq()), (7, 10));
        assert!(q.is_gone(6) && !q.is_gone(8));
    }

    /// A relay's queue: its filter passed over 1 and 2 and later 5, it evicted 3 and 4, then
    /// stopped. Restored with its saved floor, it tells the gaps from the products gone.
    #[test]
    fn a_restored_relay_queue_keeps_its_gaps_with_its_saved_floor() {
        let lim = QueueLimits {
            max_bytes: 100,
            max_age: u64::MAX,
        };
        let mut q = ProductQueue::new(lim, 1);
        q.insert_at(at(3, 40), 0).unwrap();
        q.insert_at(at(4, 50), 0).unwrap();
        assert_eq!(q.insert_at(at(6, 60), 0).unwrap(), vec![3, 4]);
        let saved = q.floor();
        assert_eq!(saved, 5, "evicted 3 and 4 are gone; the gap 5 is not");
        let restore = |floor: Option<u64>| {
            let mut r = ProductQueue::new(lim, q.next_seq());
            r.restore(at(6, 60), 0);
            if let Some(f) = floor {
                r.restore_floor(f);
            }
            r
        };
        let without = restore(None);
        assert!(without.is_gone(5), "without the floor the gap looks lost");
        let r = restore(Some(saved));
        assert_eq!(r.floor(), 5);
        assert!(r.is_gone(4) && !r.is_gone(5) && !r.is_gone(6));
        // A new relay's queue whose first product came after gaps: none of them is lost.
        let mut first = ProductQueue::new(lim, 7);
        first.restore(at(3, 1), 0);
        first.restore_floor(1);
        assert!(!first.is_gone(1) && !first.is_gone(2));
        // A floor saved above a product restored (its removal cut short) keeps the product.
        let mut high = ProductQueue::new(lim, 7);
        high.restore(at(3, 1), 0);
        high.restore_floor(5);
        assert_eq!(high.floor(), 3);
    }
}
