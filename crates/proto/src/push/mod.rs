//! The push-relay tree protocol: a planned tree of nodes, each receiving chunks from its parent,
//! verifying and storing them, and forwarding them to its children.
//!
//! - [`tree`]: distribution trees, the seam between planning and moving bytes.
//! - [`node`]: the push-relay state machine, one per node per session.
//! - [`chunkmap`]: which chunks a node holds, verified (the store's index).
//! - [`stripe`]: balanced multi-trees: an object's chunks dealt to several tree sessions.
//!
//! The crate root re-exports each module under its old name (`bulkcast_proto::node`, ...),
//! so callers are unchanged.

pub mod chunkmap;
pub mod node;
pub mod stripe;
pub mod tree;
