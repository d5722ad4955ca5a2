//! Cutting a relay whose repairs keep arriving corrupt.
//!
//! A chunk that fails verification is dropped and fetched again from the same parent
//! ([`Node::corrupt`]), and the node that rejected it reports it up (`Rejected`, naming the
//! sender). A relay that corrupts its repairs too (a process that tampers, bad memory on its
//! host) would keep its child fetching the same chunk for ever. So the node above the culprit
//! counts, per receiver and chunk, the corrupt copies the culprit sent; at
//! [`CUT_AFTER_CORRUPT`] it cuts the culprit as it would a dead relay: reported failed with
//! why, its orphans re-planned and adopted (`adopt.rs`, `replan.rs`), and they fetch what they
//! lack from healthy nodes.
//!
//! A receiver reports a chunk's first rejection while under [`MAX_REJECTED_REPORTS`], and every
//! corrupt repair of it (each one a copy after the first), up to one more than
//! [`CUT_AFTER_CORRUPT`], so that the count reaches the node above even past that cap and never
//! floods the path.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Node;
use crate::wire::Frame;

/// A node reports at most this many rejected chunks: enough to name the culprit, never a flood.
pub const MAX_REJECTED_REPORTS: u32 = 64;

/// A relay that sent one receiver this many corrupt copies of the same chunk is cut off.
pub const CUT_AFTER_CORRUPT: u32 = 4;

/// What a receiving node rejected.
#[derive(Debug, Default)]
pub(super) struct Rejections {
    /// `Rejected` reports of first rejections sent up so far.
    reports: u32,
    /// Corrupt copies received, per chunk.
    copies: BTreeMap<u64, u32>,
}

/// At a parent: corrupt copies its child sent, per (receiver, chunk).
pub(super) type SentCorrupt = BTreeMap<(u32, u64), u32>;

impl Node {
    /// A corrupt copy of chunk `index` came: whether its rejection is reported up.
    pub(super) fn count_rejection(&mut self, index: u64) -> bool {
        let r = &mut self.rejections;
        let n = r.copies.entry(index).or_insert(0);
        *n += 1;
        if *n > 1 {
            return *n <= CUT_AFTER_CORRUPT + 1;
        }
        let report = r.reports < MAX_REJECTED_REPORTS;
        r.reports += report as u32;
        report
    }

    /// Child `k`'s subtree reports that `node` rejected chunk `index` from `from`: passed up,
    /// and counted when the child itself sent it; the child is cut off at the limit.
    pub(super) fn handle_rejected(
        &mut self,
        k: usize,
        node: u32,
        from: u32,
        index: u64,
        now: Instant,
    ) {
        self.report(Frame::Rejected { node, from, index });
        let c = &mut self.children[k];
        if from != c.node as u32 {
            return;
        }
        let n = c.sent_corrupt.entry((node, index)).or_insert(0);
        *n += 1;
        if *n >= CUT_AFTER_CORRUPT {
            let reason = format!(
                "{} sent {n} corrupt copies of chunk {index} to node {node}: cut off, the nodes \
                 below it re-attached elsewhere",
                c.name
            );
            self.lose_child(k, reason, now);
        }
    }
}
