//! The receiving daemon: accepts admitted parents, stores what they push, relays to children.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use crate::transport::{Listener, Stream};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::node::{Node, NodeConfig};
use bulkcast_proto::wire::{Frame, Open, SessionId, SwarmSetup};
use tokio::sync::mpsc;

use crate::driver::{Driver, DriverError, Upstream};
use crate::edge::Attachments;
use crate::probe;
use crate::store::{LocalCopy, Store, Target};
use crate::stripes::{Group, Groups};
use crate::transport::{self, ConnError, TcpTuning};
use bulkcast_proto::stripe::Stripes;

/// An agent's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Where received objects go.
    pub dir: PathBuf,
    /// Keys from the shared secret.
    pub keys: Keys,
    /// Memory and timers per session.
    pub node: NodeConfig,
    /// TCP options for connections to children.
    pub tuning: TcpTuning,
    /// Bytes stored so far, for a progress display (ticket receivers).
    pub stored: Option<Arc<AtomicU64>>,
    /// Objects being received as stripes of a balanced send.
    pub groups: Groups,
    /// Sessions waiting for further connections of their parent's spread edge.
    pub attachments: Attachments,
    /// Write every object to stdout instead of `dir` (`pipe recv`).
    pub stdout: bool,
    /// Connections to children opened ahead of sessions at a source's `Dial`.
    pub predialed: crate::predial::PreDialed,
    /// How one-file copies are written (`--direct-io`).
    pub io: crate::direct::CopyIo,
    /// Swarm sessions running here, for their peers' connections.
    pub swarms: crate::swarm::SwarmSessions,
    /// How long and how much of the partial copies of failed sessions are kept to resume
    /// ([`crate::store::partial`]).
    pub partials: crate::store::Partials,
    /// Tree sessions running here (a new `Open` for one of them takes over from it).
    pub running: Running,
    /// The sessions this agent is part of, running and finished, for its live page.
    pub live: crate::live::Sessions,
}

impl AgentConfig {
    /// An agent storing into `dir` with `keys`, everything else as `bulkcast agent` has it
    /// by default (64 MiB of chunk buffers per session, the `--cc auto` congestion control,
    /// buffered writes, partial copies kept a week).
    pub fn new(dir: PathBuf, keys: Keys) -> AgentConfig {
        AgentConfig {
            dir,
            keys,
            node: NodeConfig::default(),
            tuning: TcpTuning {
                cc: transport::default_cc(),
                ..TcpTuning::default()
            },
            stored: None,
            groups: Default::default(),
            attachments: Default::default(),
            stdout: false,
            predialed: Default::default(),
            io: Default::default(),
            swarms: Default::default(),
            partials: Default::default(),
            running: Default::default(),
            live: Default::default(),
        }
    }
}

/// The tree sessions running on an agent. When a relay dies, its parent adopts its children
/// and opens the session on them again: an `Open` for a session that still runs here (its old
/// parent went quiet rather than away, or it kept serving its own children) stops the old
/// instance first, which releases its copy, so the new one resumes from it.
#[derive(Debug, Clone, Default)]
pub struct Running(Arc<std::sync::Mutex<RunningMap>>);

type RunningMap = std::collections::HashMap<SessionId, (u64, Arc<tokio::sync::Notify>)>;

/// One instance's place in [`Running`]; leaves it on drop.
struct Instance {
    running: Running,
    session: SessionId,
    id: u64,
    stop: Arc<tokio::sync::Notify>,
}

impl Running {
    /// Registers an instance of `session`, stopping the one running (waits up to 5 s for it
    /// to end).
    async fn take_over(&self, session: SessionId) -> Instance {
        let id = rand::random();
        let stop = Arc::new(tokio::sync::Notify::new());
        let old = {
            let mut m = self.0.lock().expect("running lock");
            m.insert(session, (id, stop.clone())).map(|o| o.1)
        };
        if let Some(old) = old {
            tracing::info!("session {session:016x}: opened again here; stopping the old one");
            old.notify_one();
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            while Arc::strong_count(&old) > 1 && Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
        Instance {
            running: self.clone(),
            session,
            id,
            stop,
        }
    }
}

impl Running {
    /// Whether an instance of `session` runs here now.
    fn contains(&self, session: SessionId) -> bool {
        self.0.lock().expect("running lock").contains_key(&session)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let mut m = self.running.0.lock().expect("running lock");
        if m.get(&self.session).is_some_and(|e| e.0 == self.id) {
            m.remove(&self.session);
        }
    }
}

/// How long an agent run with `once` waits, after its session aborted, for the session to be
/// opened here again (a node that loses its parent is adopted by another, which opens the
/// session again within a few round trips of noticing; at 200 ms, about 3 s).
const ONCE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Sleeps until `at`, or forever without it.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Serves until `shutdown` completes, or with `once` until the first object is received
/// (every tree session of a balanced send) or a session fails, returning that outcome. Each admitted connection runs its session on its own task; a bad peer is
/// logged and dropped without affecting the others.
pub async fn serve(
    listeners: Vec<Listener>,
    cfg: Arc<AgentConfig>,
    once: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Option<Result<SessionId, SessionError>> {
    tokio::pin!(shutdown);
    // One accept loop per address (an agent may listen on its main and its path addresses).
    let (acc_tx, mut acc_rx) = mpsc::channel::<std::io::Result<(Stream, std::net::SocketAddr)>>(16);
    let accepting: Vec<_> = listeners
        .into_iter()
        .map(|mut l| {
            let tx = acc_tx.clone();
            tokio::spawn(async move {
                loop {
                    let r = l.accept().await;
                    let failed = r.is_err();
                    if tx.send(r).await.is_err() {
                        return;
                    }
                    if failed {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect();
    struct AbortAll(Vec<tokio::task::JoinHandle<()>>);
    impl Drop for AbortAll {
        fn drop(&mut self) {
            self.0.iter().for_each(|t| t.abort());
        }
    }
    let _accepting = AbortAll(accepting);
    // Outcomes: an object id and how many sessions make it up (one, or one per tree).
    let (done_tx, mut done_rx) =
        tokio::sync::mpsc::channel::<Result<(SessionId, usize), SessionError>>(16);
    let mut finished: std::collections::HashMap<SessionId, usize> = Default::default();
    let gate = crate::gate::Gate::default();
    // With `once`: a failed session and when to give up waiting for it to be opened again.
    let mut failed: Option<(SessionError, tokio::time::Instant)> = None;
    loop {
        let wake = failed.as_ref().map(|f| f.1);
        tokio::select! {
            _ = &mut shutdown => return None,
            _ = sleep_until_opt(wake), if wake.is_some() => {
                let Some((e, _)) = failed.take() else { continue };
                match e.session().filter(|&id| cfg.running.contains(id)) {
                    // Opened again and still running: its outcome decides.
                    Some(_) => failed = Some((e, tokio::time::Instant::now() + ONCE_GRACE)),
                    None => return Some(Err(e)),
                }
            }
            Some(r) = done_rx.recv(), if once => match r {
                // The instance that took over reports for the session.
                Err(SessionError::Superseded(_)) => {}
                // An orphan of a lost relay is opened again by the node that adopts it.
                Err(e @ SessionError::Aborted(..)) => {
                    failed = Some((e, tokio::time::Instant::now() + ONCE_GRACE));
                }
                Err(e) => return Some(Err(e)),
                Ok((id, parts)) => {
                    let n = finished.entry(id).or_default();
                    *n += 1;
                    if *n >= parts {
                        return Some(Ok(id));
                    }
                }
            },
            Some(acc) = acc_rx.recv() => match acc {
                Ok((stream, peer)) => {
                    // Past the limits the connection is closed at once: it holds nothing.
                    let pass = match gate.enter(peer.ip()) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::debug!("connection from {peer} dropped: {e}");
                            drop(stream);
                            continue;
                        }
                    };
                    let cfg = cfg.clone();
                    let done = done_tx.clone();
                    let deadline = gate.limits().deadline;
                    tokio::spawn(async move {
                        if let Some(outcome) = connection(stream, peer, &cfg, pass, deadline).await {
                            let _ = done.send(outcome).await;
                        }
                    });
                }
                Err(e) => tracing::warn!("accept failed: {e}"),
            }
        }
    }
}

/// One accepted connection, admitted and served: the outcome of the session it carried, or
/// `None` where it was not a session (a probe, a further connection of an edge, a refused or
/// abandoned connect).
async fn connection(
    stream: Stream,
    peer: std::net::SocketAddr,
    cfg: &AgentConfig,
    pass: crate::gate::Pass,
    deadline: std::time::Duration,
) -> Option<Result<(SessionId, usize), SessionError>> {
    let outcome = match admit(stream, cfg, pass, deadline).await {
        Ok(stream) => session_admitted(stream, cfg, None).await,
        Err(e) => Err(e),
    };
    Some(match outcome {
        Ok(Served::Probe) => {
            tracing::debug!("probe from {peer} answered");
            return None;
        }
        Ok(Served::Attached) => return None,
        Ok(Served::Session(s)) => {
            tracing::info!("session {s:016x} from {peer}: done");
            Ok((s, 1))
        }
        Ok(Served::Stripe { group, trees }) => Ok((group, trees)),
        // A connect's spare attempt, dropped when another won.
        Err(SessionError::Conn(ConnError::Closed)) => {
            tracing::debug!("connection from {peer} closed before a frame");
            return None;
        }
        // Admission and set-up failures are not sessions.
        Err(e @ (SessionError::Conn(_) | SessionError::Refused(_))) => {
            tracing::warn!("connection from {peer}: {e}");
            return None;
        }
        Err(e @ SessionError::Superseded(_)) => {
            tracing::info!("connection from {peer}: {e}");
            Err(e)
        }
        Err(e) => {
            tracing::warn!("connection from {peer}: {e}");
            Err(e)
        }
    })
}

/// What an incoming connection was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// A session, received (and relayed) to the end.
    Session(SessionId),
    /// One tree's session of a balanced send, received to the end; the object is complete
    /// when all `trees` sessions of `group` are.
    Stripe {
        /// The object's group id.
        group: SessionId,
        /// How many tree sessions the object has.
        trees: usize,
    },
    /// A probe from a planning source, answered.
    Probe,
    /// A further connection of a running session's spread edge, handed to that session.
    Attached,
}

/// Why an incoming session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Admission or framing failed before the session began.
    #[error("{0}")]
    Conn(#[from] ConnError),
    /// The set-up was refused.
    #[error("refused session set-up: {0}")]
    Refused(String),
    /// The session started but this node gave up.
    #[error("session {0:016x} aborted: {1}")]
    Aborted(SessionId, String),
    /// A new parent opened the session here again (it adopted this node): the new instance
    /// carries on from this one's copy, so this is not a failure of the session.
    #[error("session {0:016x}: opened again here by a new parent")]
    Superseded(SessionId),
    /// The session ran to its end (children served) but this node's own copy failed.
    #[error("session {0:016x}: the local copy failed (see the log for why)")]
    CopyFailed(SessionId),
}

impl SessionError {
    /// The session it is about, where one had begun.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            SessionError::Aborted(s, _) | SessionError::Superseded(s) => Some(*s),
            SessionError::CopyFailed(s) => Some(*s),
            SessionError::Conn(_) | SessionError::Refused(_) => None,
        }
    }
}

/// Runs one incoming session on an accepted connection: admission, `Open`, then relaying and
/// storing into `target` (default: the agent's directory). `expect` restricts it to one session
/// id (ticket receivers).
pub async fn session(
    stream: Stream,
    cfg: &AgentConfig,
    expect: Option<(SessionId, Target)>,
) -> Result<Served, SessionError> {
    let stream = transport::handshake_accept(stream, &cfg.keys).await?;
    session_admitted(stream, cfg, expect).await
}

/// The handshake of an accepted connection, within `deadline` from accept, holding its place
/// at the gate until it ends.
async fn admit(
    stream: Stream,
    cfg: &AgentConfig,
    mut pass: crate::gate::Pass,
    deadline: std::time::Duration,
) -> Result<Stream, SessionError> {
    let r = tokio::select! {
        r = tokio::time::timeout(deadline, transport::handshake_accept(stream, &cfg.keys)) => r,
        _ = pass.evicted() => return Err(ConnError::Timeout("in the handshake (evicted)").into()),
    };
    drop(pass);
    match r {
        Err(_) => Err(ConnError::Timeout("in the handshake").into()),
        Ok(Err(e)) => Err(e.into()),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// [`session`] after the handshake.
async fn session_admitted(
    mut stream: Stream,
    cfg: &AgentConfig,
    expect: Option<(SessionId, Target)>,
) -> Result<Served, SessionError> {
    let open = match transport::expect_frame(&mut stream, "waiting for the session set-up").await? {
        Frame::Open(o) => o,
        // Probing for the planner: echoes, then possibly a request to measure others.
        Frame::Ping { nonce } if expect.is_none() => {
            probe::serve_echo(&mut stream, nonce, &cfg.keys, &cfg.tuning).await?;
            return Ok(Served::Probe);
        }
        Frame::Probe {
            samples,
            timeout_ms,
            targets,
        } if expect.is_none() => {
            probe::serve_probe(
                &mut stream,
                samples,
                timeout_ms,
                targets,
                &cfg.keys,
                &cfg.tuning,
            )
            .await?;
            return Ok(Served::Probe);
        }
        Frame::Dial { session, addrs } if expect.is_none() => {
            tracing::debug!("session {session:016x}: pre-dialling {addrs:?}");
            cfg.predialed.dial(session, addrs, &cfg.keys, &cfg.tuning);
            return Ok(Served::Probe);
        }
        Frame::Sink if expect.is_none() => {
            probe::serve_sink(&mut stream).await?;
            return Ok(Served::Probe);
        }
        // A further connection of a spread edge: it belongs to a session already running.
        Frame::Attach {
            session,
            token,
            conn,
            ..
        } => {
            cfg.attachments
                .deliver(session, token, conn, stream)
                .await
                .map_err(|e| SessionError::Refused(e.to_string()))?;
            return Ok(Served::Attached);
        }
        // Swarm sessions: the source's set-up, or another member's connection.
        Frame::SwarmSetup(SwarmSetup::Open(open)) if expect.is_none() && !cfg.stdout => {
            let session = open.session;
            tracing::info!(
                "swarm session {session:016x}: receiving {:?} by {} as node {}",
                open.manifest.name,
                open.strategy.name(),
                open.node
            );
            let counted = crate::metrics::global().session_started();
            let started = crate::live::Started {
                session,
                kind: "swarm",
                object: open.manifest.name.clone(),
                total: open.manifest.total_len,
                parent: "peers".into(),
                node: open.node,
            };
            let span = session_span(&started);
            let (cfg, tracked) = tracked(cfg, started);
            let r = tracing::Instrument::instrument(crate::swarm::serve(stream, *open, &cfg), span)
                .await
                .map_err(|e| e.to_string());
            tracked.end(r.clone());
            r.map_err(|e| SessionError::Aborted(session, e))?;
            counted.done(true);
            return Ok(Served::Session(session));
        }
        // A multicast send: the file comes on the group; a cancelled one is not a session.
        Frame::Mcast(bulkcast_proto::mcast::McastMsg::Open(open)) if expect.is_none() => {
            return crate::mcast::recv::serve_agent(stream, *open, cfg).await;
        }
        Frame::SwarmSetup(SwarmSetup::Peer { session, node }) if expect.is_none() => {
            cfg.swarms
                .deliver(session, node, stream)
                .await
                .map_err(|e| SessionError::Refused(e.to_string()))?;
            return Ok(Served::Attached);
        }
        Frame::BwProbe { target, millis } if expect.is_none() => {
            probe::serve_bw_probe(&mut stream, &target, millis, &cfg.keys, &cfg.tuning).await?;
            return Ok(Served::Probe);
        }
        other => return Err(ConnError::Unexpected(other.kind()).into()),
    };
    serve_open(stream, open, cfg, expect).await
}

/// Runs a session whose `Open` has been read from `stream` (after the handshake): checks it
/// against `expect` (ticket receivers), then relays and stores as [`session`] does. The
/// session shows in [`AgentConfig::live`] while it runs, then with its outcome.
pub async fn serve_open(
    stream: Stream,
    open: Open,
    cfg: &AgentConfig,
    expect: Option<(SessionId, Target)>,
) -> Result<Served, SessionError> {
    let started = crate::live::Started {
        session: open.session,
        kind: if open.stripe.is_some() {
            "stripe"
        } else {
            "tree"
        },
        object: open.manifest.name.clone(),
        total: open.manifest.total_len,
        parent: parent_of(&stream),
        node: open.node,
    };
    let span = session_span(&started);
    let (cfg, tracked) = tracked(cfg, started);
    let r =
        tracing::Instrument::instrument(relay_and_store(stream, open, &cfg, expect), span).await;
    tracked.end(r.as_ref().map(|_| ()).map_err(|e| e.to_string()));
    r
}

/// Registers a session in `cfg.live`; the settings it runs with count its stored bytes there
/// (into the ticket receiver's own counter where there is one).
fn tracked(
    cfg: &AgentConfig,
    started: crate::live::Started,
) -> (AgentConfig, crate::live::Tracked) {
    let tracked = cfg.live.start(started, cfg.stored.clone());
    let mut cfg = cfg.clone();
    cfg.stored = Some(tracked.stored.clone());
    (cfg, tracked)
}

/// The span of a session on this agent (what `--features otel` exports).
fn session_span(s: &crate::live::Started) -> tracing::Span {
    tracing::info_span!(
        "session",
        session = %format!("{:016x}", s.session),
        kind = s.kind,
        object = %s.object,
        parent = %s.parent,
        node = s.node,
    )
}

/// The address of whoever is at the other end of `stream`, for messages.
fn parent_of(stream: &Stream) -> String {
    stream
        .tcp()
        .and_then(|t| t.peer_addr().ok())
        .map_or_else(|| "the parent".to_string(), |a| a.to_string())
}

/// [`serve_open`] once the session is registered.
async fn relay_and_store(
    mut stream: Stream,
    open: Open,
    cfg: &AgentConfig,
    expect: Option<(SessionId, Target)>,
) -> Result<Served, SessionError> {
    let target = session_target(&mut stream, &open, cfg, &expect).await?;
    // With host keys, only a set-up, chunks and an end its source signed: a relay can forge
    // none of them (the node checks the `Open` and binds its keys to that source).
    let keys = cfg.keys.clone().requiring_source();
    let parent = parent_of(&stream);
    let mut node = match Node::relay(&open, keys.clone(), cfg.node.clone(), Instant::now()) {
        Ok(n) => n,
        Err(e) => {
            let _ = transport::write_frame(
                &mut stream,
                &Frame::Error {
                    reason: e.to_string(),
                },
            )
            .await;
            return Err(SessionError::Refused(format!("{e} (sent by {parent})")));
        }
    };
    let keys = node.keys().clone();
    // Dropped after the driver (declared before it), so the copy is released first.
    let instance = cfg.running.take_over(open.session).await;
    // Verifying a partial copy reads it whole, which can outlast the parent's patience for our
    // `Have`: `Idle` tells it we are still here.
    let copy = keep_parent_waiting(&mut stream, open.session, local_copy(&open, target, cfg)).await;
    let store = match copy {
        Ok((copy, rx, resumed)) => {
            log_resumed(&open, &resumed);
            node.resume(resumed.held, resumed.complete, Instant::now());
            (copy, rx)
        }
        Err(e) => {
            // The node still relays to its children; it reports its own copy as failed.
            tracing::error!("cannot store session {:016x}: {e}", open.session);
            return run_without_copy(stream, node, cfg, e.to_string()).await;
        }
    };
    let session = open.session;
    let stripe = open.stripe.as_ref().map(|st| {
        (
            st.group,
            Stripes::from_pattern(st.pattern.clone()).map_or(1, |s| s.trees()),
        )
    });
    tracing::info!(
        "session {session:016x}: receiving {:?} as node {}",
        open.manifest.name,
        open.node
    );
    let mut driver = Driver::new(
        node,
        keys,
        cfg.tuning.clone(),
        Upstream::Parent(stream),
        Some(store),
    );
    driver.accept_attachments(cfg.attachments.clone());
    driver.use_predialed(cfg.predialed.clone());
    let mut counted = crate::metrics::global().session_started();
    let stop = instance.stop.clone();
    // The first chunk refused, with who sent it: the first honest hop names the culprit.
    let mut culprit = None;
    let run = driver.run(|ev| {
        if let bulkcast_proto::node::Event::Corrupt { index, reason } = ev {
            counted.rejected();
            tracing::warn!(
                "session {session:016x}: chunk {index} from {parent} rejected ({reason}); requested again"
            );
            culprit.get_or_insert_with(|| format!("{parent} sent a bad chunk: {reason}"));
        }
    });
    let r = tokio::select! {
        r = run => r,
        _ = stop.notified() => return Err(SessionError::Superseded(session)),
    };
    r.map_err(|e| match &culprit {
        Some(c) => SessionError::Aborted(session, format!("{e} ({c})")),
        // A forged `End` (or any other breach) came over the parent's link: name it.
        None if matches!(e, DriverError::Parent(_)) => {
            SessionError::Aborted(session, format!("{e} (parent {parent})"))
        }
        None => SessionError::Aborted(session, e.to_string()),
    })?;
    counted.done(driver.node().local_done());
    if !driver.node().local_done() {
        return Err(SessionError::CopyFailed(session));
    }
    Ok(match &stripe {
        Some((group, trees)) => Served::Stripe {
            group: *group,
            trees: *trees,
        },
        None => Served::Session(session),
    })
}

/// Where a session's copy goes: the ticket's target for a ticket receiver (refusing another
/// session), else the agent's directory or standard output.
async fn session_target(
    stream: &mut Stream,
    open: &Open,
    cfg: &AgentConfig,
    expect: &Option<(SessionId, Target)>,
) -> Result<Target, SessionError> {
    Ok(match expect {
        Some((id, _)) if *id != open.session => {
            let reason = format!(
                "this receiver joined session {id:016x}, not {:016x}",
                open.session
            );
            let _ = transport::write_frame(
                stream,
                &Frame::Error {
                    reason: reason.clone(),
                },
            )
            .await;
            return Err(SessionError::Refused(reason));
        }
        Some((_, t)) => t.clone(),
        None if cfg.stdout => Target::Stdout,
        None => Target::Dir(cfg.dir.clone()),
    })
}

/// Runs `work` (verifying a partial copy reads it whole, which can outlast the parent's
/// patience for our `Have`), telling the parent every 5 s with `Idle` that we are still here.
async fn keep_parent_waiting<F: std::future::Future>(
    stream: &mut Stream,
    session: SessionId,
    work: F,
) -> F::Output {
    tokio::pin!(work);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.tick().await;
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = tick.tick() => {
                if let Err(e) = transport::write_frame(stream, &Frame::Idle).await {
                    tracing::debug!("session {session:016x}: parent gone while resuming: {e}");
                }
            }
        }
    }
}

/// Logs what an earlier copy of the object left to resume from.
fn log_resumed(open: &Open, resumed: &crate::store::Resumed) {
    if resumed.complete {
        tracing::info!(
            "session {:016x}: an identical {:?} is in place already",
            open.session,
            open.manifest.name
        );
    } else if !resumed.held.is_empty() {
        tracing::info!(
            "session {:016x}: resuming {:?} with {} verified chunks",
            open.session,
            open.manifest.name,
            resumed.held.len()
        );
    }
}

/// The local copy a session writes into (its own store, resumed where an earlier session of
/// the same object left one, or its stripe of a shared one) and what it held already.
async fn local_copy(
    open: &Open,
    target: Target,
    cfg: &AgentConfig,
) -> std::io::Result<(
    Box<dyn LocalCopy>,
    mpsc::UnboundedReceiver<crate::store::StoreEvent>,
    crate::store::Resumed,
)> {
    let Some(st) = &open.stripe else {
        let (tx, rx) = mpsc::unbounded_channel();
        let (manifest, cs, session) = (open.manifest.clone(), open.chunk_size, open.session);
        let (io, stored, partials) = (cfg.io, cfg.stored.clone(), cfg.partials);
        // Verifying a partial copy reads it whole: off the event loop.
        let (store, resumed) = tokio::task::spawn_blocking(move || {
            Store::open_resumable(target, &manifest, cs, session, io, tx, stored, partials)
        })
        .await
        .map_err(std::io::Error::other)??;
        return Ok((Box::new(store), rx, resumed));
    };
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let stripes = Stripes::from_pattern(st.pattern.clone()).map_err(|e| bad(e.to_string()))?;
    st.object.validate().map_err(|e| bad(e.to_string()))?;
    // The stripe's own manifest must be the one the pattern implies for this object.
    if stripes
        .stripe_manifest(st.tree, &st.object, open.chunk_size)
        .as_ref()
        != Some(&open.manifest)
    {
        return Err(bad("stripe does not match its object".into()));
    }
    let (object, group_id, cs) = (st.object.clone(), st.group, open.chunk_size);
    let (io, stored, partials) = (cfg.io, cfg.stored.clone(), cfg.partials);
    let group = cfg
        .groups
        .get_or_open(group_id, move || {
            Group::open(target, &object, group_id, stripes, cs, io, stored, partials)
        })
        .await?;
    let (copy, rx, resumed) = group.attach(st.tree)?;
    Ok((Box::new(copy), rx, resumed))
}

async fn run_without_copy(
    stream: Stream,
    mut node: Node,
    cfg: &AgentConfig,
    reason: String,
) -> Result<Served, SessionError> {
    let session = node.params().session;
    node.handle_store_failed(reason, Instant::now());
    let keys = node.keys().clone();
    let mut driver = Driver::new(
        node,
        keys,
        cfg.tuning.clone(),
        Upstream::Parent(stream),
        None,
    );
    driver.accept_attachments(cfg.attachments.clone());
    driver.use_predialed(cfg.predialed.clone());
    driver
        .run(|_| {})
        .await
        .map_err(|e| SessionError::Aborted(session, e.to_string()))?;
    Err(SessionError::CopyFailed(session))
}
