//! A node's local settings and the keepalive periods.

use std::time::Duration;

#[cfg(doc)]
use crate::wire::{Frame, Open};

/// Local settings of a node (session-wide settings arrive in [`Open`]).
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Most bytes of chunk data held in memory.
    pub buffer_budget: usize,
    /// A relay that hears nothing from its parent for this long while it still needs data
    /// gives up.
    pub idle_timeout: Duration,
    /// An unanswered repair request is repeated after this long.
    pub request_timeout: Duration,
    /// A child that holds the others back (this node's buffer is full waiting for its
    /// acknowledgements, which have not moved for this long while another consumer is ahead of
    /// it) is let go from the push: reported failed as fallen behind, its children adopted. It
    /// catches up in a later session (`send --retry`), resuming from what it holds.
    pub lag_timeout: Duration,
    /// Largest part, in bytes, of a chunk sent to a child in verified parts (see
    /// `node/parts.rs`): how far a hop delays what it forwards. 0: whole chunks only.
    pub part_bytes: usize,
    /// A child with nodes below it that has sent nothing at all (not even the [`UP_KEEPALIVE`]
    /// every relay with children sends up) for this long while it had chunks outstanding is
    /// taken for a stopped or hung process: let go like one that fell behind, and its subtree
    /// adopted, so that the nodes below it are not held for the stall timeout. On a long path
    /// the period grows with the child's round trip ([`silent_period`]).
    pub silent_timeout: Duration,
    /// Fault injection for tests and `bench/faults` only (0, the default: off): this node
    /// flips a byte of every n-th chunk the first time it sends it to each child, as a relay that
    /// tampers would; a repair it is asked for goes out intact. An agent sets it only in a
    /// build with the `fault-injection` feature of the `bulkcast` binary.
    pub tamper_every: u64,
    /// Fault injection with [`NodeConfig::tamper_every`]: every copy of such a chunk is
    /// flipped, repairs too, as a relay that keeps corrupting would (the node above it cuts it
    /// off, `node/cut.rs`).
    pub tamper_repairs: bool,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            buffer_budget: 64 << 20,
            idle_timeout: Duration::from_secs(60),
            lag_timeout: Duration::from_secs(3),
            silent_timeout: Duration::from_secs(1),
            tamper_every: 0,
            tamper_repairs: false,
            request_timeout: Duration::from_secs(2),
            part_bytes: crate::groups::GROUP,
        }
    }
}

/// A parent that has sent a child nothing for this long sends it [`Frame::Idle`], so a pause
/// in the source's input (a pipe whose producer waits for its next product) is never taken
/// for a dead parent: at the latest two of these periods pass between frames, well inside
/// the default [`NodeConfig::idle_timeout`] of 60 s.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// A relay with children that has sent its parent nothing for this long sends it
/// [`Frame::Idle`]: a running process is never silent for [`NodeConfig::silent_timeout`], so
/// silence means a stopped or hung one (a relay waiting on a slow child of its own keeps
/// saying so, and its parent leaves it alone: the deepest culprit is the one let go).
pub const UP_KEEPALIVE: Duration = Duration::from_millis(250);

/// Round trips of silence, on top of [`NodeConfig::silent_timeout`], before a child counts as
/// stopped ([`silent_period`]).
pub const SILENT_RTTS: u32 = 8;

/// How long child with round trip `rtt` may send nothing before it counts as stopped. A
/// keepalive that TCP has to retransmit arrives a retransmission timeout late (srtt plus four
/// deviations, more while a queue builds up at the start of a long path), and on a 200 ms path
/// a second of silence is a lost segment, not a stopped process: the period is
/// `base + SILENT_RTTS x rtt` (1 s on a LAN, 2.6 s at 200 ms with the default base).
pub fn silent_period(base: Duration, rtt: Option<Duration>) -> Duration {
    base + rtt.unwrap_or_default() * SILENT_RTTS
}
