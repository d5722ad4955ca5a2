//! bulkcast's overlay planner: from hosts (sites, access capacities, fan-out limits) and
//! measured matrices (RTT, optionally path and WAN capacities) to distribution trees, their
//! predicted rates, and the best rate any overlay could reach. No I/O: callers parse files,
//! probe the network and write the pictures.
//!
//! # Layout
//! - [`matrix`]: [`Matrix`], the TOML matrix file ([`MatrixFile`]) and the matrix printer.
//! - [`network`]: [`Network`], the planner's input, and the capacity model.
//! - [`trees`]: single-tree algorithms: [`mst`], [`dcmst`], [`bottleneck`], [`cluster`].
//! - [`balanced`](mod@balanced): balanced multi-trees by fractional tree packing.
//! - [`bound`](mod@bound): the LP bound on the broadcast rate.
//! - [`rate`]: predicted rates and completion times.
//! - [`plan`](mod@plan): [`Algorithm`], [`plan()`](plan::plan), `auto` and the [`Plan`] they return.
//! - `render`: [`Plan::render_text`], [`Plan::to_dot`], [`Plan::to_svg`].
//! - [`vivaldi`]: which pairs to probe, and coordinates that estimate the rest.
//! - `arbor`: minimum-cost arborescences (the packing's pricing step).
//!
//! Typical use (what `bulkcast plan` does):
//!
//! ```
//! use bulkcast_planner::{bound, plan, Algorithm, MatrixFile, Network, PlanOptions};
//! use bulkcast_proto::hosts::HostsFile;
//!
//! let hosts = HostsFile::parse_toml(r#"
//!     [source]
//!     name = "lon"
//!     uplink_mbps = 1000
//!     [[host]]
//!     name = "fra"
//!     addr = "10.0.0.2:7400"
//!     uplink_mbps = 1000
//!     [[host]]
//!     name = "sgp"
//!     addr = "10.0.0.3:7400"
//! "#).unwrap();
//! let matrices = MatrixFile::parse_toml(r#"
//!     nodes = ["lon", "fra", "sgp"]
//!     rtt_ms = [[0, 13, 173], [13, 0, 174], [173, 174, 0]]
//! "#).unwrap();
//! let net = Network::from_hosts(&hosts, &matrices).unwrap();
//! let best = bound(&net).unwrap();
//! let p = plan(&net, Algorithm::Auto, &PlanOptions::default()).unwrap();
//! assert!(p.rate_mbps <= best.rate_mbps * (1.0 + 1e-6));
//! println!("{}", p.render_text(&net, Some(&best)));
//! let (_dot, _svg) = (p.to_dot(&net), p.to_svg(&net));
//! ```
//!
//! # Model
//! Node 0 is the source, 1..=n the hosts in hosts-file order; every tree is rooted at the
//! source ([`Network::rooted_at`] re-roots). An overlay edge `i -> j` at rate `r` uses `r` of
//! i's uplink, j's downlink, the path `i -> j` (bandwidth matrix) and, between sites, the shared
//! WAN link from i's site to j's site. Unknown capacities are unlimited. A tree at rate `r`
//! loads each resource with `r` times the number of its edges that use it, so its predicted rate
//! is `min over resources of capacity / uses` ([`tree_rate`]); shaped multi-trees add up.
//! Completion time for an object = size / rate + the deepest path's sum of (hop RTT + one chunk
//! at the tree's rate) ([`completion_secs`]).
//!
//! # The bound
//! Let `E` be all overlay edges `i -> j` (`j != 0`) and `R` the finite-capacity resources, with
//! capacity `c_r` and `E_r` the edges using `r`. The LP ([`lp_bound`]):
//!
//! ```text
//! maximise   λ
//! subject to sum_{e in E_r} x_e <= c_r                 for every resource r     (loads)
//!            f^t_e <= x_e                               for every receiver t, e  (sharing)
//!            sum_in f^t(v) - sum_out f^t(v) = [v = t] λ  for every t, v != 0      (flow)
//!            x, f >= 0
//! ```
//!
//! `x_e` is the rate edge `e` carries; `f^t` is a flow of value λ from the source to receiver
//! `t`. Flows to different receivers carry the same bytes, so they share an edge's load (`f^t_e
//! <= x_e`) instead of adding up; only the loads `x` meet the access, path and WAN capacities.
//! Adding the flows (`sum_t f^t_e <= ...`) would model unicast, and capping each flow separately by
//! the uplink would overstate relays.
//!
//! Why it is exact for broadcast: given feasible `x`, every receiver has a cut of at least λ
//! in the graph with capacities `x`, so by Edmonds' branching theorem (fractional form) the
//! graph holds spanning arborescences with weights summing to λ that load each edge at most
//! `x_e`: a set of trees with rates, loading every resource within its capacity. Conversely
//! any such set of trees gives feasible `x` and flows. So the LP optimum equals the best
//! fractional packing of spanning arborescences under the resource capacities, which is the
//! best rate any set of shaped overlay trees can reach (and, for broadcast, network coding
//! cannot do better). Tests check it against that packing computed by enumerating every
//! arborescence of tiny instances. The LP has about n^3 variables; it is solved exactly up to
//! [`LP_MAX_NODES`] nodes, above that [`bound()`](bound::bound) reports the packing's dual
//! bound (marked not exact).
//!
//! # Algorithm notes
//! - [`mst`]: Prim on RTT (mean of both directions), O(n^2). Equal RTTs (common in emulated
//!   labs) go to the wider edge.
//! - [`dcmst`]: Prim that only attaches to nodes with free fan-out and never strands the
//!   rest, then edge-exchange local search under the limits, repeated from randomly perturbed
//!   and Lagrangian-penalised weights (fewer restarts as n grows). Limits come from `max_fanout`
//!   and, given a target rate, `floor(uplink / target)`; [`plan()`](plan::plan) without a
//!   target tries the median uplink over 1..=4 and the cut bound and keeps the best prediction.
//! - [`bottleneck`]: Prim keeping the widest edge into the tree; exactly optimal for the
//!   smallest edge capacity (seed 004's maximum-bottleneck tree). It ignores that children
//!   share an uplink, as the seed notes.
//! - [`cluster`]: one gateway per site, a DCMST between gateways, DCMSTs inside sites.
//! - [`balanced()`](balanced::balanced): Garg-Könemann packing priced by minimum arborescences
//!   (Chu-Liu/Edmonds in Tarjan's path-growing form, O(n^2) on dense costs), seeded with the
//!   single-tree plans, then an LP over the trees found to pick the `max_trees` best (16 by
//!   default) and their shaped rates, a few swaps with the next candidates, and trees under 2%
//!   of the total dropped when that keeps 97% of the rate (they cost latency, not rate).
//! - `auto`: all of the above, the best predicted completion time wins, with the reason.
//! - [`strategy`]: what `auto` means for a send, and the default chunk (piece) sizes.
//! - [`measured`]: from probed round trips to the RTT matrix and the default push's plan.
//! - [`vivaldi`]: above [`PROBE_ALL_MAX`] nodes, probe a random sample and fit coordinates.
//!
//! # Known limitations
//! - Capacities are taken as given: a bandwidth matrix from pairwise probes treats every
//!   path as independent, so paths that share an unknown bottleneck are over-predicted.
//! - Undirected algorithms symmetrise RTT; the bottleneck tree and the bound use directed
//!   capacities.
//! - The DCMST is a heuristic (random tests report its worst ratio to the optimum); the
//!   cluster tree is built on RTT only and ignores WAN capacities when choosing WAN edges.
//! - The bound is exact up to [`LP_MAX_NODES`] nodes; beyond, it is the packing's dual bound
//!   capped by [`cut_bound`], which can be loose for large n (the packing runs fewer rounds).
//! - The bound knows capacities, not `max_fanout`: with fan-out limits it may be unreachable.
//!   Balanced plans keep the limits by dropping packed trees that break them.
//! - A balanced plan with several trees needs sender-side shaping per tree to reach its rate.
//! - Predictions ignore protocol overhead, congestion-control ramp-up and CPU limits.
#![warn(missing_docs)]

mod arbor;
pub mod balanced;
pub mod bound;
mod error;
pub mod matrix;
pub mod measured;
pub mod network;
pub mod plan;
pub mod rate;
mod render;
pub mod strategy;
pub mod trees;
pub mod vivaldi;

pub use balanced::balanced;
pub use bound::{bound, cut_bound, lp_bound, Bound, LP_MAX_NODES};
pub use error::PlanError;
pub use matrix::{Matrix, MatrixFile, WanLink};
pub use network::Network;
pub use plan::{all_plans, plan, Algorithm, Plan, PlanOptions};
pub use rate::{completion_secs, rates_feasible, tree_rate, Objective};
pub use trees::{bottleneck, cluster, dcmst, fanout_limits, mst};
pub use vivaldi::PROBE_ALL_MAX;
