//! The sending side of a session: builds the source node over a tree, runs it, reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::manifest::ObjectKind;
use bulkcast_proto::node::{Event, Named, Node, NodeConfig, SessionParams};
use bulkcast_proto::stripe::Stripes;
use bulkcast_proto::tree::Tree;
use bulkcast_proto::wire::{EdgeMode, SessionId, StripeInfo};

use crate::driver::{Driver, Upstream};
use crate::edge::StreamsObserver;
use crate::input::Input;
use crate::report::{ReceiverStatus, Report, Status};
use crate::store::{LocalCopy, StoreError, StoreEvent};
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
    /// Connections per edge and their scheduler, for every edge of the tree.
    pub edges: EdgeMode,
    /// Told about the source's striped edges periodically.
    pub observer: Option<StreamsObserver>,
    /// The source's own declared uplink in Mbit/s (the hosts file's `[source]`): `--streams
    /// auto` adds no connection once its edges carry that much.
    pub uplink_mbps: Option<f64>,
}

impl Default for SendConfig {
    fn default() -> Self {
        Self {
            chunk_size: 1 << 20,
            stall_timeout: Duration::from_secs(30),
            node: NodeConfig::default(),
            tuning: TcpTuning::default(),
            strategy: "tree".into(),
            edges: EdgeMode::default(),
            observer: None,
            uplink_mbps: None,
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
    /// A tree's session ended early: its input failed, or its node gave up.
    #[error("{0}")]
    Driver(#[from] crate::driver::DriverError),
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
        rejected: Default::default(),
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
                held: 0,
                already: false,
                received: None,
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
        edges: cfg.edges,
    };
    let names: Vec<Named> = hosts.iter().map(|h| named(h, true)).collect();
    // Every relay opens its children's connections now, while the first hop is set up.
    let first_addrs: Vec<String> = hosts
        .iter()
        .map(|h| {
            h.addr
                .split_whitespace()
                .next()
                .unwrap_or(&h.addr)
                .to_string()
        })
        .collect();
    crate::predial::send_dials(tree, session, &first_addrs, &keys, &cfg.tuning);
    let mut node = Node::source(
        params,
        keys.clone(),
        cfg.node.clone(),
        tree,
        &names,
        Instant::now(),
    )?;
    node.set_uplink_kbps(kbps(cfg.uplink_mbps));
    // A file can be read again for a receiver adopted after its relay died.
    let reread = input.single_file().and_then(|p| match Reread::open(p) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::debug!("{}: cannot read it again: {e}", p.display());
            None
        }
    });
    node.set_rereadable(reread.is_some());
    {
        let mut st = status.lock().expect("status lock");
        st.started = Instant::now();
        st.total_len = manifest.total_len;
    }
    let read = input.read_counter();
    let rx = input.spawn(cfg.chunk_size as usize, keys.clone(), session);
    let mut driver = Driver::new(node, keys, cfg.tuning.clone(), Upstream::Input(rx), reread);
    observe_streams(&mut driver, cfg);
    let st = status.clone();
    let result = driver
        .run(|ev: &Event| {
            let mut st = st.lock().expect("status lock");
            // Before the event: a receiver's progress never runs ahead of what was read.
            st.read = read.load(Ordering::Relaxed);
            st.apply(ev)
        })
        .await;
    let end = driver.node().end();
    let mut st = status.lock().expect("status lock");
    if let Some(e) = end {
        st.total_len = Some(e.total_len);
        st.read = e.total_len;
    }
    result?;
    let mut report = Report::build(
        &st,
        session,
        &manifest.name,
        kind_name(manifest.kind),
        &cfg.strategy,
    );
    report.add_streams(driver.edge_reports());
    Ok(report)
}

fn observe_streams(driver: &mut Driver, cfg: &SendConfig) {
    if let Some(o) = &cfg.observer {
        let f = o.f.clone();
        driver.report_edges_every(o.every, move |e| f(e));
    }
}

/// A host's addresses as a tree member carries them: the main one, then its extra paths.
/// How the source names receiver `h` to the tree: its addresses (main first, then the extra
/// paths) and, with `uplink`, its declared uplink, so that it paces what it relays below it.
fn named(h: &HostSpec, uplink: bool) -> Named {
    Named {
        name: h.name.clone(),
        addr: std::iter::once(h.addr.as_str())
            .chain(h.paths.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        uplink_kbps: if uplink { kbps(h.uplink_mbps) } else { 0 },
    }
}

/// A declared rate in Mbit/s as the wire carries it: kbit/s, 0 for none.
fn kbps(mbps: Option<f64>) -> u32 {
    mbps.map_or(0, |m| {
        (m * 1000.0).round().clamp(1.0, u32::MAX as f64) as u32
    })
}

/// Sends `input` over several trees at once (a balanced plan): `trees` with their planned rates
/// in Mbit/s. Each tree carries a stripe of the chunks in proportion to its rate, as a session
/// of its own; receivers assemble one copy. Needs an input of known length.
pub async fn send_balanced(
    input: Input,
    hosts: &[HostSpec],
    trees: &[(Tree, f64)],
    keys: Keys,
    cfg: &SendConfig,
    status: SharedStatus,
) -> Result<Report, SendError> {
    let object = input.manifest.clone();
    if object.total_len.is_none() {
        return Err(SendError::Aborted(
            "a balanced send needs an input of known length (not a stream)".into(),
        ));
    }
    let rates: Vec<f64> = trees.iter().map(|t| t.1.min(1e9)).collect();
    let stripes = Stripes::from_rates(&rates)
        .map_err(|e| SendError::Aborted(format!("planned rates: {e}")))?;
    let group: SessionId = rand::random();
    let sessions: Vec<SessionId> = trees.iter().map(|_| rand::random()).collect();
    // No uplink pacing: a relay's trees share its uplink in the planned proportions, which
    // one tree's session does not know.
    let names: Vec<Named> = hosts.iter().map(|h| named(h, false)).collect();
    // The memory budget is shared by the trees' source nodes.
    let node_cfg = NodeConfig {
        buffer_budget: (cfg.node.buffer_budget / trees.len()).max(4 * cfg.chunk_size as usize),
        ..cfg.node.clone()
    };
    let now = Instant::now();
    let mut nodes = Vec::new();
    for (t, (tree, _)) in trees.iter().enumerate() {
        let stripe = StripeInfo {
            group,
            tree: t as u16,
            pattern: stripes.pattern().to_vec(),
            object: object.clone(),
        };
        let params = stripe_params(&stripes, stripe, sessions[t], cfg);
        let node = Node::source(params, keys.clone(), node_cfg.clone(), tree, &names, now)?;
        nodes.push(node);
    }
    status.lock().expect("status lock").started = Instant::now();
    let read = input.read_counter();
    let file = input.single_file().map(|p| p.to_path_buf());
    let rxs = input.spawn_striped(
        cfg.chunk_size as usize,
        keys.clone(),
        sessions,
        stripes.clone(),
    );
    // One driver per tree, each with its own status; a task merges them for the display.
    let mut per_tree = Vec::new();
    let mut tasks = Vec::new();
    for (t, ((mut node, rx), (tree, _))) in nodes.into_iter().zip(rxs).zip(trees).enumerate() {
        let st = new_status(hosts, tree, cfg.chunk_size, object.total_len);
        per_tree.push(st.clone());
        // What a receiver adopted after its relay died lacks below the tree's buffer is read
        // from the file again, at the stripe's chunks' places in it.
        let (stripes, cs) = (stripes.clone(), cfg.chunk_size as u64);
        let reread = file.as_deref().and_then(|p| {
            Reread::open_at(p, move |j, _| stripes.global(t as u16, j) * cs)
                .inspect_err(|e| tracing::debug!("{}: cannot read it again: {e}", p.display()))
                .ok()
        });
        node.set_rereadable(reread.is_some());
        let mut driver = Driver::new(
            node,
            keys.clone(),
            cfg.tuning.clone(),
            Upstream::Input(rx),
            reread,
        );
        observe_streams(&mut driver, cfg);
        tasks.push(tokio::spawn(async move {
            driver
                .run(|ev: &Event| st.lock().expect("status lock").apply(ev))
                .await
        }));
    }
    let merge = {
        let (per_tree, status, read) = (per_tree.clone(), status.clone(), read.clone());
        tokio::spawn(async move {
            loop {
                merge_status(&per_tree, &status, &read);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let mut first_error = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(SendError::Driver(e));
            }
            Err(e) => {
                first_error.get_or_insert(SendError::Aborted(e.to_string()));
            }
        }
    }
    merge.abort();
    merge_status(&per_tree, &status, &read);
    if let Some(e) = first_error {
        return Err(e);
    }
    let st = status.lock().expect("status lock");
    let rates: Vec<String> = trees.iter().map(|t| format!("{:.0}", t.1)).collect();
    Ok(Report::build(
        &st,
        group,
        &object.name,
        kind_name(object.kind),
        &format!(
            "balanced ({} trees at {} Mbit/s)",
            trees.len(),
            rates.join("+")
        ),
    ))
}

/// The session of tree `stripe.tree` of a balanced send: its stripe of the object, with a
/// manifest of that stripe's length (the object's length is known: [`send_balanced`] checked).
fn stripe_params(
    stripes: &Stripes,
    stripe: StripeInfo,
    session: SessionId,
    cfg: &SendConfig,
) -> SessionParams {
    let manifest = stripes
        .stripe_manifest(stripe.tree, &stripe.object, cfg.chunk_size)
        .expect("length known");
    SessionParams {
        session,
        chunk_size: cfg.chunk_size,
        stall_timeout: cfg.stall_timeout,
        cc: cfg.tuning.cc.clone(),
        manifest,
        stripe: Some(Box::new(stripe)),
        edges: cfg.edges,
    }
}

/// A receiver's progress over all trees: chunks (and chunks held before, and bytes received)
/// add up, it is done when every tree is, and it failed if any tree failed it. Parents are
/// those of the first (fastest) tree.
fn merge_status(per_tree: &[SharedStatus], into: &SharedStatus, read: &AtomicU64) {
    // Read first: no tree's progress then runs ahead of it.
    let read = read.load(Ordering::Relaxed);
    let parts: Vec<Status> = per_tree
        .iter()
        .map(|s| s.lock().expect("status lock").clone())
        .collect();
    let mut out = into.lock().expect("status lock");
    out.read = out.read.max(read);
    for (i, r) in out.receivers.iter_mut().enumerate() {
        r.chunks = parts.iter().map(|p| p.receivers[i].chunks).sum();
        r.done = parts
            .iter()
            .map(|p| p.receivers[i].done)
            .collect::<Option<Vec<_>>>()
            .and_then(|d| d.into_iter().max());
        r.failed = parts.iter().find_map(|p| p.receivers[i].failed.clone());
        // What it held before the session: its part of every stripe; in place only if every
        // tree found it so.
        r.held = parts.iter().map(|p| p.receivers[i].held).sum();
        r.already = parts.iter().all(|p| p.receivers[i].already);
        r.received = parts
            .iter()
            .map(|p| p.receivers[i].received)
            .sum::<Option<u64>>();
        if let Some(p) = parts.first() {
            r.parent = p.receivers[i].parent;
        }
    }
}

fn kind_name(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::File => "file",
        ObjectKind::Dir => "dir",
        ObjectKind::Stream => "stream",
    }
}

/// The source's input file, read again at any offset ([`LocalCopy::load`] only): what a
/// receiver adopted after its relay died lacks below what the source still holds in memory.
struct Reread {
    tx: std::sync::mpsc::Sender<(u64, u64, u64)>,
}

impl Reread {
    #[allow(clippy::type_complexity)]
    fn open(
        path: &std::path::Path,
    ) -> std::io::Result<(
        Box<dyn LocalCopy>,
        tokio::sync::mpsc::UnboundedReceiver<StoreEvent>,
    )> {
        Self::open_at(path, |_, offset| offset)
    }

    /// As [`Reread::open`], with `at` turning a chunk's index and offset in the session into
    /// its offset in the file (a stripe of a balanced send is a subset of the file's chunks).
    #[allow(clippy::type_complexity)]
    fn open_at(
        path: &std::path::Path,
        at: impl Fn(u64, u64) -> u64 + Send + 'static,
    ) -> std::io::Result<(
        Box<dyn LocalCopy>,
        tokio::sync::mpsc::UnboundedReceiver<StoreEvent>,
    )> {
        use std::os::unix::fs::FileExt;
        let file = std::fs::File::open(path)?;
        let path = path.to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel::<(u64, u64, u64)>();
        let (ev_tx, ev_rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("bulkcast-reread".into())
            .spawn(move || {
                for (index, offset, len) in rx {
                    let mut buf = vec![0u8; len as usize];
                    let r = file
                        .read_exact_at(&mut buf, at(index, offset))
                        .map(|()| bytes::Bytes::from(buf))
                        .map_err(|e| StoreError::io(e, "reading again", &path));
                    if ev_tx.send(StoreEvent::Loaded(index, r)).is_err() {
                        return;
                    }
                }
            })?;
        Ok((Box::new(Reread { tx }), ev_rx))
    }
}

impl LocalCopy for Reread {
    fn write(&self, _: u64, _: u64, _: bytes::Bytes, _: [u8; 32]) {}
    fn finalize(&self) {}
    fn load(&self, index: u64, offset: u64, len: u64) -> bool {
        self.tx.send((index, offset, len)).is_ok()
    }
}
