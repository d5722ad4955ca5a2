//! Feeds: a continuous stream of products from one source to many subscribers (seed 003,
//! LDM7), sans-IO.
//!
//! - [`product`]: product metadata and its authentication, feedtype patterns, subscriptions,
//!   allow rules.
//! - [`queue`]: the source's product queue, bounded by size and age.
//! - [`fec`]: repair by parity on the group (the file send's code), unicast where it fits.
//! - [`msg`]: messages and their encoding (unicast frames, multicast datagrams).
//! - [`seal`]: multicast datagrams numbered and sealed under the group key.
//! - [`server`]: the source: subscribers' backlogs and streams, repairs, multicast pacing.
//! - [`push`]: the multicast pusher.
//! - [`relay`]: a relay's upstream side: relayed products queued in order, once.
//! - [`tree`]: where a relay joins the relay tree (its parent, by round trip).
//! - [`receiver`]: a subscriber: assembly, gap detection, repair requests, delivery once.
//! - [`ranges`]: byte-range sets.
//! - [`sim`]: a seeded simulation of one source and many receivers on a lossy LAN.

pub mod fec;
pub mod msg;
pub mod product;
pub mod push;
pub mod queue;
pub mod ranges;
pub mod receiver;
pub mod relay;
pub mod seal;
pub mod server;
pub mod tree;
#[cfg(feature = "sim")]
pub use crate::sim::feed as sim;
