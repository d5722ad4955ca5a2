//! bulkcast's tokio shell: the thin layer that gives the sans-IO core ([`bulkcast_proto`])
//! sockets, files, threads and a clock.
//!
//! # Layout
//! - [`transport`]: TCP set up for long fat pipes (congestion control, buffers), framing over
//!   any `AsyncRead`/`AsyncWrite`, the handshake with deadlines.
//! - [`paced`]: the paced UDP transport's driver: `AsyncRead`/`AsyncWrite` streams, a listener.
//! - [`driver`]: the event loop around one [`bulkcast_proto::node::Node`].
//! - [`edge`]: an edge over several connections (and paths): spreading, join, `--streams auto`.
//! - [`feed`]: product feeds: `feed serve` with its queue on disk, subscribers, inserts.
//! - [`input`]: the source's file, directory or stdin reader.
//! - [`mapped`]: a file's chunks as page-cache mappings, sent with `sendfile(2)`.
//! - [`probe`]: RTT measurement between all session hosts, for the planner.
//! - [`measure`]: the RTT matrix a planned send uses, probed or from a cache of recent probes.
//! - [`stripes`]: receiving a balanced multi-tree send into one shared copy.
//! - [`store`]: a receiver's local copy (temporary name, moved into place when verified).
//! - [`direct`]: `O_DIRECT` writes and reads of that copy, past the page cache (opt-in).
//! - [`source`]: a send from start to report.
//! - [`swarm`]: swarm sessions (MOB, BitTorrent-style, hybrid) on the network.
//! - [`agent`]: the receiving daemon.
//! - [`live`]: an agent's sessions as they run and end, for its live page.
//! - [`ticket`]: ad-hoc sessions that receivers join with a ticket.
//! - [`ssh`]: one-shot agents started over ssh for a send or a plan.
//! - [`report`]: live status and the final report.
//! - [`api`]: the library API: [`Send`] and [`Agent`] builders (see its example).
#![warn(missing_docs)]

pub mod agent;
pub mod api;
pub mod direct;
pub mod driver;
pub mod edge;
pub mod feed;
pub mod gate;
pub mod input;
pub mod live;
pub mod mapped;
pub mod mcast;
pub mod measure;
pub mod metrics;
pub mod paced;
pub mod predial;
pub mod probe;
pub mod report;
pub mod secure;
pub mod source;
pub mod ssh;
pub mod store;
pub mod stripes;
pub mod swarm;
pub mod ticket;
pub mod transport;
pub mod writer;

pub use api::{Agent, Send, Strategy};
