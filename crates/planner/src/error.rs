//! Why the planner refused its input or could not produce a plan.

use bulkcast_proto::tree::NodeId;

/// Errors from building a network description or planning over it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    /// A matrix file did not parse as TOML or had unknown fields.
    #[error("matrix file is not valid: {0}")]
    Toml(String),
    /// A matrix is not square, or its size does not match the node list.
    #[error("{what}: expected {expected} x {expected}, row {row} has {got} entries")]
    Shape {
        /// Which matrix.
        what: &'static str,
        /// Expected side length.
        expected: usize,
        /// First offending row (or the row count when rows are missing).
        row: usize,
        /// Entries found.
        got: usize,
    },
    /// A matrix entry is negative, NaN, or (for capacities) zero.
    #[error("{what}[{from}][{to}] = {value} is not allowed ({rule})")]
    BadEntry {
        /// Which matrix.
        what: &'static str,
        /// Row (sender).
        from: usize,
        /// Column (receiver).
        to: usize,
        /// The value as given.
        value: f64,
        /// What the value must be.
        rule: &'static str,
    },
    /// A capacity, rate or size is zero, negative or not a number.
    #[error("{what} must be positive and not NaN, got {value}")]
    BadValue {
        /// What was being set.
        what: &'static str,
        /// The value as given.
        value: f64,
    },
    /// A node index is out of range.
    #[error("node {0} does not exist")]
    NoSuchNode(NodeId),
    /// A node named in the hosts file is missing from the matrix file, or the other way round.
    #[error("node {0:?} is in one of the hosts file and the matrix file but not in the other")]
    NodeMismatch(String),
    /// A name appears twice in the matrix file's node list.
    #[error("node {0:?} appears twice in the matrix file")]
    DuplicateNode(String),
    /// A WAN capacity names a site no node belongs to.
    #[error("WAN link names site {0:?}, which no node belongs to")]
    NoSuchSite(String),
    /// Fan-out limits leave too few slots to span every node.
    #[error("fan-out limits allow {slots} tree edges but {needed} are needed")]
    FanoutInfeasible {
        /// Sum of the fan-out limits.
        slots: usize,
        /// Edges a spanning tree needs (nodes - 1).
        needed: usize,
    },
    /// The LP solver failed (numerical trouble); the message is the solver's.
    #[error("LP solver failed: {0}")]
    Solver(String),
    /// The plan asked for needs access-link capacities, and none were given.
    #[error("{0}")]
    NeedsCapacities(&'static str),
    /// No algorithm produced a tree for this network.
    #[error("the planner found no tree")]
    NoTree,
    /// The algorithm name is not one of the known ones.
    #[error(
        "unknown algorithm {0:?} (expected mst, dcmst, bottleneck, cluster, balanced or auto)"
    )]
    UnknownAlgorithm(String),
}
