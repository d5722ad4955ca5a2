//! One overlay edge carried over N parallel connections (issue 5): the sender stripes a stream
//! of items (chunks) over the connections, the receiver joins them back in order.
//!
//! Sans-IO like the rest of the crate: no sockets, no clock. The bytes of an item stay with
//! the driver; this module sees an [`Item`] (index and length) and decides which connection
//! carries it, when, and when the receiver may release it.
//!
//! # The pieces
//! - [`Spreader`] (sender): numbers the items of the input, deals them to connections, tracks
//!   them until acknowledged, reassigns those of a lost connection, measures each connection
//!   ([`ConnStats`]: bytes, rate, weight, in flight) and runs the paper's controller.
//! - [`Joiner`] (receiver): takes items from any connection in any order, drops second
//!   copies, refuses items beyond its reorder window ([`JoinError`], a protocol violation)
//!   and releases the rest strictly in order, each once.
//! - [`grow`]: `--streams auto`, one more connection at a time while the settled rate rises.
//! - [`sim`]: N connections over shared rate-limited channels on an event-driven clock, with
//!   rate steps, random delays, lost and joining connections; it reports throughput as a
//!   fraction of the channels' summed rate, a time series and re-convergence after steps.
//!
//! # Driving it
//! Sender, per edge: [`Spreader::new`], then [`Spreader::add_conn_on`] per connection (with its
//! path). Then, after every event, until nothing moves:
//! 1. while [`Spreader::wants_input`], read an item and pass its length to
//!    [`Spreader::handle_input`], which returns its index (keep the bytes: they may have to be
//!    sent again);
//! 2. for each connection whose socket has room, send what [`Spreader::poll_assign`] returns
//!    until `None` (this is `handle_writable` and `poll_assign` in one call: the driver only
//!    asks when the socket can take an item);
//! 3. for each acknowledgement `(index)` read back from connection `c`,
//!    [`Spreader::handle_acked`]; free the bytes of items below [`Spreader::acked_below`];
//! 4. when a connection fails, [`Spreader::handle_conn_lost`]: its unacknowledged items are
//!    handed out again, first, to the others;
//! 5. for `--json` and `-v`: [`Spreader::stats`] and [`Spreader::controller`].
//!
//! Receiver: one [`Joiner`] per edge with the same window. For each item read from
//! connection `c`: [`Joiner::handle_item`] (an `Err` closes the edge), acknowledge its index
//! on `c` whatever it returned (a duplicate must be acknowledged too, or the sender's copy
//! stays in flight), then write out what [`Joiner::poll_release`] returns.
//!
//! On the wire this needs the item index on every chunk (the chunk frame has it) and one small
//! acknowledgement frame (an index) going back on the connection the item came by.
//!
//! # The schedulers
//! **Weighted fork-join** ([`Scheduler::Weighted`], the paper's reference). The fork deals the
//! items in a fixed weighted round-robin order (deficit round robin with quantum `B * w_i`)
//! into a buffer of `B * w_i` bytes per connection, and blocks on the next connection in that
//! order while its buffer is full, whatever room the others have; each connection sends from
//! its buffer when its socket has room. With equal weights ([`Scheduler::Equal`]) this
//! reproduces eq. 1 exactly (N times the slowest connection; see the tests); with
//! `w_i = r_i / r_max` (eq. 2) it approaches the sum (eq. 4). The controller of section 3:
//! 1. measure with equal blocks: per connection, the rate `r_i` (bytes per second of busy
//!    time: the gaps between acknowledgements of items that were already in flight when the
//!    previous one came) and the mean sojourn time (from dealt into its buffer, the
//!    fork, to acknowledged, the join), over `max(2, ceil(K / N))` steps of `N * B`
//!    acknowledged bytes (3.1);
//! 2. weight by eq. 2, wait [`WeightedConfig::settle`], measure again and compare with the
//!    equal-block measurement (3.1): mean and standard deviation both worse, keep equal
//!    blocks; only the mean worse, one early re-weighting; otherwise enter the loop;
//! 3. the loop (3.2): after each measurement, if the mean sojourn time exceeds the rolling
//!    mean of the previous three by more than 33%, re-evaluate (back to 1); decreases are
//!    ignored. The alarm (3.1) re-evaluates every [`WeightedConfig::alarm`] anyway.
//!
//! Interpretations (the paper leaves them open): the `t_i` of eq. 2 are taken as `B_i / r_i`
//! with `r_i` measured as above (section 2 defines them so), and the sensor's "sojourn
//! times" as fork-to-join times of the items; a "step" is `N * B` acknowledged bytes; a
//! re-evaluation measures with equal blocks again, as the first phase does; "the last three
//! values" are the three measurements before the current one; the alarm period (5 s) and
//! `B` (512 KiB) are ours, the paper gives none.
//!
//! **Pull** ([`Scheduler::Pull`], the proposed default). Each connection takes the oldest
//! item not yet sent whenever its socket has room, so each runs at its own pace and the
//! split follows the rates item by item, with no measurement phase, no fixed deal order to
//! block on and nothing to re-converge beyond the rate estimates. Two guards keep one slow
//! connection from stalling the join: its bytes in flight stay under
//! `rate * (min_rtt + 50 ms)` (so a large socket buffer does not hide seconds of data), and
//! it takes an item only if, at its rate, it would deliver it before the others, at theirs,
//! use up the reorder window (a connection too slow for the window is left idle).
//!
//! Both are bounded by the same reorder window: the spreader takes no input at or beyond
//! `oldest unacknowledged + window`, so the joiner never holds more than `window` items.
//!
//! # Where we differ from the paper
//! - The paper's join window is its buffers; ours is an explicit reorder window, the same for
//!   all schedulers, and the receiver checks it.
//! - Items are acknowledged by the receiver, so a lost connection's items are sent again on
//!   the others (the paper has no connection loss) and connections can be added mid-stream.
//! - Rates are measured per busy second, not per wall-clock second, so a connection starved by
//!   the fork is not mistaken for a slow one.
//!
//! # Simulated figures
//! `cargo run --release -p bulkcast-proto --example forkjoin_sim` prints the paper's static
//! and dynamic experiments. Means over 2-9 connections: pull 0.995-1.000 of the summed
//! capacity on every set-up, the weighted controller 0.87-0.98, unweighted 0.61-0.75 (eq. 1);
//! the paper measured 0.68-0.84 weighted. With one channel alternating every 20 s (10 +
//! 20|30 and 100 + 200|300 Mbit/s): pull 0.998 and 1.000, weighted 0.84 and 0.95 (the paper:
//! about 0.87 at best). The simulator has no TCP dynamics (slow start,
//! loss, cwnd sawtooth), so these are upper bounds for the lab bench, not substitutes.
//!
//! # Limitations
//! - The reorder window must cover the sum of the rates times the longest round trip plus a
//!   little queueing (with 64 KiB chunks: 256 items for LAN paths, about 1024 for a Gbit/s
//!   path beside a 100 ms one); pull leaves a connection idle that cannot deliver within the
//!   window, which is safe but wastes it.
//! - A connection that pull leaves idle as too slow is not probed again; if its rate rises it
//!   stays unused until it is lost or re-added. A new connection's first two items are a
//!   probe that can hold the join for their transfer time on that connection.
//! - Rates are estimated from acknowledgements, so they lag by a round trip and need the
//!   receiver to acknowledge every item. A connection used now and then (one item, idle,
//!   another just before the previous acknowledgement) is under-estimated: its gaps include
//!   idle time (no app-limited marking as in BBR's delivery rate).
//! - Connections sharing a bottleneck see each other's traffic as a rate change; neither
//!   scheduler models the sharing.

pub mod grow;
mod joiner;
#[cfg(feature = "sim")]
pub use crate::sim::multipath as sim;
mod spreader;

pub use joiner::{Accepted, JoinError, Joiner};
pub use spreader::{
    ConnStats, ControllerStats, Phase, Scheduler, Spreader, SpreaderConfig, SpreaderError,
    WeightedConfig,
};

/// A connection of an edge, as numbered by [`Spreader::add_conn`] (0, 1, ...).
pub type ConnId = usize;

/// An item of the stream: its index (from 0, in input order) and length. The bytes stay with
/// the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Item {
    /// Position in the stream.
    pub index: u64,
    /// Length in bytes.
    pub len: u32,
}
