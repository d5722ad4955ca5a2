//! The simulators, in one place and behind the cargo feature `sim` (which the crate's tests,
//! examples and the lab enable): seeded, in-memory networks on a simulated clock that drive
//! the sans-IO state machines exactly as the tokio shell does.
//!
//! - [`relay`]: the push-relay tree ([`crate::push`]) over in-memory links, with faults; its
//!   items are re-exported here (`bulkcast_proto::sim::Sim`, ...).
//! - [`swarm`]: the swarm strategies on a cluster/WAN topology, and the broadcast bound.
//! - [`multipath`]: one edge over several rate-limited channels (seed 002's experiments).
//! - [`paced`]: the paced UDP stream over a lossy, long path.
//! - [`feed`]: product feeds: multicast push with unicast repair.
//!
//! Each protocol module re-exports its simulator under its old path (`swarm::sim`,
//! `multipath::sim`, `paced::sim`, `feed::sim`).

pub mod feed;
pub mod multipath;
pub mod paced;
pub mod relay;
pub mod swarm;

pub use relay::*;
