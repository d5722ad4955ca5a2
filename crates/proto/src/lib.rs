//! bulkcast's sans-IO core.
//!
//! Everything here is pure: no sockets, files, threads or clocks. Time comes in as an argument
//! (`now`), bytes come in through `handle_*` calls and go out through `poll_*` calls, so the same
//! logic runs under the tokio shell (`bulkcast-runtime`) and under the in-memory simulator
//! ([`sim`]) that every `cargo test` uses.
//!
//! # Layout
//! - [`wire`]: frames and their encoding; every length checked before use.
//! - [`auth`]: the session secret, the mutual handshake, chunk and end authentication.
//! - [`manifest`]: what is sent (file, directory, stream) and how its bytes map to files.
//! - [`groups`]: checking a chunk 16 KiB at a time against its BLAKE3 hash (verified
//!   streaming), for forwarding at a finer grain than the chunk.
//! - [`push`]: the push-relay tree protocol: [`tree`] (distribution trees, the seam between
//!   planning and moving bytes), [`node`] (the push-relay state machine, one per node per
//!   session), [`chunkmap`] (which chunks a node holds, verified: the store's index) and
//!   [`stripe`] (balanced multi-trees: an object's chunks dealt to several tree sessions).
//! - [`hosts`]: the hosts file shared by `send`, the planner and the lab.
//! - [`sim`] (cargo feature `sim`): the simulators, seeded in-memory networks on a simulated
//!   clock, one per protocol, for the tests, examples and the lab.
//! - [`swarm`]: receiver-driven swarming (MOB, a BitTorrent-style baseline, a tree+pull
//!   hybrid) over the same chunks and wire, with its own cluster/WAN simulator.
//! - [`multipath`]: one edge over N parallel connections: spreading, in-order join, and the
//!   paper's weighted fork-join controller, with its own simulator.
//! - [`feed`]: product feeds (seed 003): a queue, subscriptions, multicast push with unicast
//!   repair.
//! - [`paced`]: a paced, selective-repeat byte stream over UDP for lossy long paths, with
//!   its own path simulator.
#![warn(missing_docs)]

pub mod auth;
pub mod cc;
pub mod feed;
pub mod groups;
pub mod hosts;
pub mod identity;
pub mod manifest;
pub mod mcast;
pub mod multipath;
pub mod paced;
pub mod push;
#[cfg(feature = "sim")]
pub mod sim;
pub mod swarm;
pub mod wire;

// The tree protocol's modules under their old paths, which the other crates use.
pub use push::{chunkmap, node, stripe, tree};
