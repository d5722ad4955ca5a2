//! The sending side of a session: builds the source node over a tree, runs it, reports.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::manifest::ObjectKind;
use bulkcast_proto::node::{Event, Node, NodeConfig, SessionParams};
use bulkcast_proto::tree::Tree;
use bulkcast_proto::wire::SessionId;

use crate::driver::{Driver, Upstream};
use crate::input::Input;
use crate::report::{ReceiverStatus, Report, Status};
use crate::transport::TcpTuning;

/// Settings of a send.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// Chunk size in bytes.
    pub chunk_size: u32,
    /// Cut off a receiver that makes no progress for this long.
    pub stall_timeout: Duration,
    /// Memory and timers of the source node.
    pub node: NodeConfig,
    /// TCP options; `cc` is also what every relay uses.
    pub tuning: TcpTuning,
    /// A name for the strategy, for the report.
    pub strategy: String,
}

impl Default for SendConfig {
    fn default() -> Self {
        Self {
            chunk_size: 1 << 20,
            stall_timeout: Duration::from_secs(30),
            node: NodeConfig::default(),
            tuning: TcpTuning::default(),
            strategy: "tree".into(),
        }
    }
}

/// Why a send could not start.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The session could not be set up (bad tree, chunk size, manifest).
    #[error("{0}")]
    Setup(#[from] bulkcast_proto::node::NodeError),
    /// The source gave up (input failed).
    #[error("{0}")]
    Aborted(String),
}

/// A shared, live view of the session for progress displays.
pub type SharedStatus = Arc<Mutex<Status>>;

/// Creates the status a send will update.
pub fn new_status(
    hosts: &[HostSpec],
    tree: &Tree,
    chunk_size: u32,
    total_len: Option<u64>,
) -> SharedStatus {
    Arc::new(Mutex::new(Status {
        started: Instant::now(),
        chunk_size,
        total_len,
        read: 0,
        receivers: hosts
            .iter()
            .enumerate()
            .map(|(i, h)| ReceiverStatus {
                name: h.name.clone(),
                addr: h.addr.clone(),
                parent: tree.parent(i + 1).unwrap_or(0),
                chunks: 0,
                done: None,
                failed: None,
            })
            .collect(),
    }))
}

/// Sends `input` to `hosts` along `tree` (node `i` is `hosts[i - 1]`), updating `status`, and
/// returns the report once every receiver finished or failed.
pub async fn send(
    input: Input,
    hosts: &[HostSpec],
    tree: &Tree,
    keys: Keys,
    session: SessionId,
    cfg: &SendConfig,
    status: SharedStatus,
) -> Result<Report, SendError> {
    let manifest = input.manifest.clone();
    let params = SessionParams {
        session,
        chunk_size: cfg.chunk_size,
        stall_timeout: cfg.stall_timeout,
        cc: cfg.tuning.cc.clone(),
        manifest: manifest.clone(),
        stripe: None,
    };
    let names: Vec<(String, String)> = hosts
        .iter()
        .map(|h| (h.name.clone(), h.addr.clone()))
        .collect();
    let node = Node::source(
        params,
        keys.clone(),
        cfg.node.clone(),
        tree,
        &names,
        Instant::now(),
    )?;
    {
        let mut st = status.lock().expect("status lock");
        st.started = Instant::now();
        st.total_len = manifest.total_len;
    }
    let rx = input.spawn(cfg.chunk_size as usize, keys.clone(), session);
    let mut driver = Driver::new(node, keys, cfg.tuning.clone(), Upstream::Input(rx), None);
    let st = status.clone();
    let result = driver
        .run(|ev: &Event| st.lock().expect("status lock").apply(ev))
        .await;
    let end = driver.node().end();
    let mut st = status.lock().expect("status lock");
    if let Some(e) = end {
        st.total_len = Some(e.total_len);
        st.read = e.total_len;
    }
    result.map_err(SendError::Aborted)?;
    let kind = match manifest.kind {
        ObjectKind::File => "file",
        ObjectKind::Dir => "dir",
        ObjectKind::Stream => "stream",
    };
    Ok(Report::build(
        &st,
        session,
        &manifest.name,
        kind,
        &cfg.strategy,
    ))
}
