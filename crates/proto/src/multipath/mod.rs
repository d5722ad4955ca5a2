//! One overlay edge carried over N parallel connections: the sender stripes, the receiver
//! joins in order (issue 5).
//!
//! TODO: design notes.

mod joiner;
pub mod sim;
mod striper;

pub use joiner::{Accepted, JoinError, Joiner};
pub use striper::{
    ConnStats, ControllerStats, Phase, Scheduler, StripeError, Striper, StriperConfig,
    WeightedConfig,
};

/// A connection of an edge, as numbered by [`Striper::add_conn`] (0, 1, ...).
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
