//! bulkcast's sans-IO core.
//!
//! Everything here is pure: no sockets, files, threads or clocks. Time comes in as an argument
//! (`now`), bytes come in through `handle_*` calls and go out through `poll_*` calls, so the same
//! logic runs under the tokio shell (`bulkcast-node`) and under the in-memory simulator
//! ([`sim`]) that every `cargo test` uses.
//!
//! # Layout
//! - [`hosts`]: the hosts file shared by `send`, the planner and the lab.
//! - [`tree`]: distribution trees over session nodes, the seam between planning and moving bytes.
#![warn(missing_docs)]

pub mod hosts;
pub mod tree;
