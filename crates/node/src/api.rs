//! The library API: what `bulkcast send` and `bulkcast agent` do, from a Rust program.
//!
//! - [`Send`]: a builder for a send to agents (hosts, input, strategy, options), run with a
//!   shutdown future; returns the same [`Report`] as `bulkcast send --json`.
//! - [`Agent`]: a receiving agent inside another tokio program: bound, then served until a
//!   shutdown future completes.
//! - [`plan_push`]: the planner over measured round trips, which `send`'s planned strategies
//!   (and the CLI's) use.
//!
//! Two agents and a send in one program, on loopback:
//!
//! ```
//! use bulkcast_node::{Agent, Send, Strategy};
//! use bulkcast_proto::auth::Secret;
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let secret = Secret::from_bytes([7; 32]);
//! let scratch = std::env::temp_dir().join(format!("bulkcast-doc-{}", std::process::id()));
//! let file = scratch.join("weights.bin");
//! std::fs::create_dir_all(&scratch)?;
//! std::fs::write(&file, vec![42u8; 3 << 20])?;
//!
//! // Two agents, each storing into its own directory, served until `stop` fires.
//! let (stop, stopped) = tokio::sync::watch::channel(());
//! let mut addrs = Vec::new();
//! for i in 0..2 {
//!     let agent = Agent::new(scratch.join(format!("rx{i}")), &secret)
//!         .listen("127.0.0.1:0")
//!         .bind()
//!         .await?;
//!     addrs.push(agent.local_addrs()[0].to_string());
//!     let mut stopped = stopped.clone();
//!     tokio::spawn(agent.run(async move { let _ = stopped.changed().await; }));
//! }
//!
//! // A chain: source -> rx0 -> rx1.
//! let report = Send::to_list(&addrs.join(","))?
//!     .secret(&secret)
//!     .file(&file)
//!     .strategy(Strategy::Tree { fanout: 1 })
//!     .run(std::future::pending())
//!     .await?;
//! assert!(report.ok);
//! assert_eq!(std::fs::read(scratch.join("rx1/weights.bin"))?, std::fs::read(&file)?);
//! let _ = stop.send(());
//! # std::fs::remove_dir_all(&scratch)?;
//! # Ok(())
//! # }
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bulkcast_planner::{measured, MatrixFile, Network, Plan};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostsFile;
use bulkcast_proto::node::NodeConfig;
use bulkcast_proto::swarm::Strategy as SwarmStrategy;
use bulkcast_proto::tree::Tree;
use bulkcast_proto::wire::{EdgeMode, SessionId};

use crate::agent::AgentConfig;
use crate::input::Input;
use crate::measure::{self, LeftOut, ProbeCache, ProbeReport};
use crate::report::{Report, Status};
use crate::source::{self, SendConfig};
use crate::transport::{self, Listener, TcpTuning};

/// How a [`Send`] moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Every receiver straight from the source.
    Flat,
    /// A k-ary tree in the order the hosts are given (`fanout: 1` is a chain).
    Tree {
        /// Children per node.
        fanout: usize,
    },
    /// The planner's tree over round trips probed now (as `bulkcast send` without
    /// `--fanout`).
    Planned,
    /// Several planned trees at their rates (needs capacities in the hosts).
    Balanced,
    /// MOB: a swarm of mob shares and rank-matched peers.
    Mob,
    /// The BitTorrent-style swarm.
    Swarm,
    /// The tree pushes, the swarm fills in.
    Hybrid {
        /// The tree's fan-out; `None`: planned.
        fanout: Option<usize>,
    },
}

/// Why a [`Send`] failed before it had a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No keys or secret were given.
    #[error("no session secret or keys given")]
    NoKeys,
    /// No input was given.
    #[error("no input: give .file(path) or .input(input)")]
    NoInput,
    /// The hosts could not be read.
    #[error("hosts: {0}")]
    Hosts(String),
    /// The input could not be opened.
    #[error("input: {0}")]
    Input(#[from] std::io::Error),
    /// Measuring or planning failed.
    #[error("plan: {0}")]
    Plan(String),
    /// The session could not run.
    #[error("{0}")]
    Send(String),
    /// No receiver was left to send to.
    #[error("no receiver admitted the source")]
    NoReceivers,
    /// The shutdown future completed first.
    #[error("interrupted")]
    Interrupted,
}

/// A progress callback.
type Progress = Box<dyn FnMut(&Status) + std::marker::Send>;

/// Where a running send puts its live status, once its tree is fixed.
type Slot = Arc<std::sync::Mutex<Option<source::SharedStatus>>>;

/// A send, built step by step and run with [`Send::run`].
pub struct Send {
    hosts: HostsFile,
    keys: Option<Keys>,
    input: Option<Input>,
    path: Option<(PathBuf, Option<String>)>,
    strategy: Strategy,
    chunk_size: Option<u32>,
    stall_timeout: Duration,
    tuning: TcpTuning,
    node: NodeConfig,
    progress: Option<(Duration, Progress)>,
}

impl Send {
    /// A send to `hosts` (agents' addresses, sites, capacities).
    pub fn to(hosts: HostsFile) -> Send {
        Send {
            hosts,
            keys: None,
            input: None,
            path: None,
            strategy: Strategy::Planned,
            chunk_size: None,
            stall_timeout: Duration::from_secs(30),
            tuning: TcpTuning {
                cc: transport::default_cc(),
                ..TcpTuning::default()
            },
            node: NodeConfig::default(),
            progress: None,
        }
    }

    /// A send to a comma-separated list of `host:port` (as `--to a:7400,b:7400`).
    pub fn to_list(list: &str) -> Result<Send, Error> {
        let hosts = HostsFile::parse_list(list).map_err(|e| Error::Hosts(e.to_string()))?;
        Ok(Send::to(hosts))
    }

    /// The session secret the agents hold (as `BULKCAST_SECRET`).
    pub fn secret(self, secret: &Secret) -> Send {
        self.keys(Keys::derive(secret))
    }

    /// The session's keys (a secret with host keys, `--plaintext` and so on).
    pub fn keys(mut self, keys: Keys) -> Send {
        self.keys = Some(keys);
        self
    }

    /// Sends the file or directory at `path` (opened when the send runs).
    pub fn file(mut self, path: impl Into<PathBuf>) -> Send {
        self.path = Some((path.into(), None));
        self
    }

    /// Sends the file or directory at `path` under another name.
    pub fn file_named(mut self, path: impl Into<PathBuf>, name: &str) -> Send {
        self.path = Some((path.into(), Some(name.into())));
        self
    }

    /// Sends an input opened already (stdin, a file with its manifest adjusted).
    pub fn input(mut self, input: Input) -> Send {
        self.input = Some(input);
        self
    }

    /// How the data moves (default: [`Strategy::Planned`]).
    pub fn strategy(mut self, s: Strategy) -> Send {
        self.strategy = s;
        self
    }

    /// The chunk size in bytes (default: chosen from the size and the tree's depth).
    pub fn chunk_size(mut self, bytes: u32) -> Send {
        self.chunk_size = Some(bytes);
        self
    }

    /// Gives up a receiver that makes no progress for this long (default 30 s).
    pub fn stall_timeout(mut self, d: Duration) -> Send {
        self.stall_timeout = d;
        self
    }

    /// Transport options (default: TCP, the `--cc auto` congestion control).
    pub fn tuning(mut self, t: TcpTuning) -> Send {
        self.tuning = t;
        self
    }

    /// Memory and timers of the source node.
    pub fn node_config(mut self, node: NodeConfig) -> Send {
        self.node = node;
        self
    }

    /// Calls `f` with the live status about every `every` while the send runs.
    pub fn on_progress(
        mut self,
        every: Duration,
        f: impl FnMut(&Status) + std::marker::Send + 'static,
    ) -> Send {
        self.progress = Some((every, Box::new(f)));
        self
    }

    /// Runs the send until every receiver finished or failed, or `shutdown` completes
    /// ([`Error::Interrupted`]). Receivers that do not admit the source are left out before
    /// the tree is fixed and named in the report, as `bulkcast send` does.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<Report, Error> {
        let keys = self.keys.clone().ok_or(Error::NoKeys)?;
        let input = match (self.input.take(), &self.path) {
            (Some(i), _) => i,
            (None, Some((p, name))) => Input::open(p, name.as_deref())?,
            (None, None) => return Err(Error::NoInput),
        };
        let mut progress = self.progress.take();
        let slot = Slot::default();
        let work = self.session(input, keys, slot.clone());
        tokio::pin!(work);
        tokio::pin!(shutdown);
        let every = progress.as_ref().map_or(Duration::from_secs(3600), |p| p.0);
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                r = &mut work => return r,
                _ = &mut shutdown => return Err(Error::Interrupted),
                _ = tick.tick(), if progress.is_some() => {
                    let st = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if let (Some((_, f)), Some(st)) = (&mut progress, st) {
                        f(&st.lock().unwrap_or_else(|e| e.into_inner()));
                    }
                }
            }
        }
    }

    /// Chooses the tree (probing if planned), leaves out who does not admit the source, and
    /// runs the session.
    async fn session(self, input: Input, keys: Keys, slot: Slot) -> Result<Report, Error> {
        let mut hosts = self.hosts.clone();
        let len = input.manifest.total_len;
        let planned = matches!(
            self.strategy,
            Strategy::Planned | Strategy::Balanced | Strategy::Hybrid { fanout: None }
        );
        let mut left: Vec<(usize, String)> = Vec::new();
        let mut plan = None;
        let mut hop_rtt_ms = None;
        if planned {
            let p = plan_push(
                &hosts,
                &keys,
                &self.tuning,
                None,
                len,
                self.chunk_size.unwrap_or(1 << 20),
                self.strategy == Strategy::Balanced,
            )
            .await?;
            left = p
                .left_out
                .iter()
                .map(|l| (l.host, l.reason.clone()))
                .collect();
            hosts = p.hosts;
            hop_rtt_ms = Some(p.longest_hop_rtt_ms);
            plan = Some((p.plan, p.probe));
        } else {
            let out =
                measure::unadmitted(&hosts, &keys, &self.tuning, Duration::from_secs(5)).await;
            let mut out: Vec<LeftOut> = out;
            out.sort_by_key(|l| std::cmp::Reverse(l.host));
            for l in out {
                hosts.hosts.remove(l.host);
                left.push((l.host, l.reason));
            }
        }
        if hosts.hosts.is_empty() {
            return Err(Error::NoReceivers);
        }
        let given = self.hosts.hosts.clone();
        let mut report = match self.strategy {
            Strategy::Mob | Strategy::Swarm | Strategy::Hybrid { .. } => {
                self.swarm(input, &hosts, keys, plan.as_ref().map(|p| &p.0), &slot)
                    .await?
            }
            _ => {
                let plan = plan.as_ref().map(|p| (&p.0, hop_rtt_ms));
                self.push(input, &hosts, keys, plan, &slot).await?
            }
        };
        report.probe = plan.and_then(|p| p.1);
        report.leave_out(
            left.into_iter()
                .map(|(i, why)| (i, given[i].name.clone(), given[i].addr.clone(), why)),
        );
        Ok(report)
    }

    async fn push(
        &self,
        input: Input,
        hosts: &HostsFile,
        keys: Keys,
        planned: Option<(&Plan, Option<f64>)>,
        slot: &Slot,
    ) -> Result<Report, Error> {
        let n = hosts.hosts.len();
        let (plan, hop_rtt_ms) = planned.map_or((None, None), |(p, h)| (Some(p), h));
        let (trees, name) = match (self.strategy, plan) {
            (Strategy::Flat, _) => (vec![(Tree::flat(n), 0.0)], "flat".to_string()),
            (Strategy::Tree { fanout }, _) => (
                vec![(Tree::kary(n, fanout.max(1)), 0.0)],
                format!("tree (fan-out {fanout})"),
            ),
            (Strategy::Balanced, Some(p)) => (p.trees.clone(), "balanced".into()),
            (_, Some(p)) => (
                vec![(p.tree().clone(), p.rate_mbps)],
                format!("tree (planned: {})", p.algorithm),
            ),
            (_, None) => return Err(Error::Plan("no plan".into())),
        };
        let deepest = trees
            .iter()
            .map(|t| &t.0)
            .max_by_key(|t| (1..t.len()).map(|i| t.depth(i)).max().unwrap_or(0))
            .ok_or_else(|| Error::Plan("no tree".into()))?;
        let chunk_size = self.chunk_size.unwrap_or_else(|| {
            bulkcast_planner::strategy::push_chunk_size(input.manifest.total_len, deepest)
        });
        let cfg = SendConfig {
            chunk_size,
            stall_timeout: self.stall_timeout,
            node: NodeConfig {
                part_bytes: bulkcast_planner::strategy::part_bytes(hop_rtt_ms),
                ..self.node.clone()
            },
            tuning: self.tuning.clone(),
            strategy: name,
            edges: EdgeMode::default(),
            observer: None,
            uplink_mbps: hosts.source.as_ref().and_then(|s| s.uplink_mbps),
        };
        let len = input.manifest.total_len;
        let status = source::new_status(&hosts.hosts, deepest, chunk_size, len);
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(status.clone());
        let session: SessionId = rand::random();
        let r = if trees.len() > 1 {
            source::send_balanced(input, &hosts.hosts, &trees, keys, &cfg, status).await
        } else {
            source::send(
                input,
                &hosts.hosts,
                &trees[0].0,
                keys,
                session,
                &cfg,
                status,
            )
            .await
        };
        let mut report = r.map_err(|e| Error::Send(e.to_string()))?;
        report.part_size = cfg.node.part_bytes;
        Ok(report)
    }

    async fn swarm(
        &self,
        input: Input,
        hosts: &HostsFile,
        keys: Keys,
        plan: Option<&Plan>,
        slot: &Slot,
    ) -> Result<Report, Error> {
        let n = hosts.hosts.len();
        let (strategy, tree) = match self.strategy {
            Strategy::Mob => (SwarmStrategy::Mob, None),
            Strategy::Swarm => (SwarmStrategy::Swarm, None),
            Strategy::Hybrid { fanout: Some(k) } => {
                (SwarmStrategy::Hybrid, Some(Tree::kary(n, k.max(1))))
            }
            _ => (SwarmStrategy::Hybrid, plan.map(|p| p.tree().clone())),
        };
        let flat = Tree::flat(n);
        let len = input.manifest.total_len;
        let planner_strategy = match strategy {
            SwarmStrategy::Mob => bulkcast_planner::strategy::Strategy::Mob,
            SwarmStrategy::Swarm => bulkcast_planner::strategy::Strategy::Swarm,
            _ => bulkcast_planner::strategy::Strategy::Hybrid,
        };
        let chunk_size = self.chunk_size.unwrap_or_else(|| {
            bulkcast_planner::strategy::chunk_size(planner_strategy, len, &flat)
        });
        let cfg = crate::swarm::SwarmSendConfig {
            strategy,
            chunk_size,
            stall_timeout: self.stall_timeout,
            tuning: self.tuning.clone(),
            seed: rand::random(),
        };
        let status = source::new_status(
            &hosts.hosts,
            tree.as_ref().unwrap_or(&flat),
            chunk_size,
            len,
        );
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(status.clone());
        crate::swarm::send(
            input,
            hosts.source.as_ref(),
            &hosts.hosts,
            tree.as_ref(),
            keys,
            rand::random(),
            &cfg,
            status,
        )
        .await
        .map_err(|e| Error::Send(e.to_string()))
    }
}

/// What [`plan_push`] decided.
pub struct PlannedPush {
    /// The plan, over `hosts`.
    pub plan: Plan,
    /// The longest round trip of a hop of the plan, in ms (what sets the part size,
    /// [`bulkcast_planner::strategy::part_bytes`]).
    pub longest_hop_rtt_ms: f64,
    /// The hosts the plan spans: those given, less `left_out`.
    pub hosts: HostsFile,
    /// How the round trips were measured (`None`: from a matrix given).
    pub probe: Option<ProbeReport>,
    /// Hosts that did not answer the probe, with why.
    pub left_out: Vec<LeftOut>,
    /// What was done, for the user.
    pub note: String,
}

/// The planner's push plan for `hosts` ([`measured::push_plan`]): over the round trips from
/// `matrix` when given, else from `cache` or probed now (hosts that do not answer are left
/// out); `size` and `chunk` for the rates, `balanced` for several trees.
#[allow(clippy::too_many_arguments)]
pub async fn plan_push_with(
    hosts: &HostsFile,
    matrix: Option<(&MatrixFile, String)>,
    keys: &Keys,
    tuning: &TcpTuning,
    cache: Option<&ProbeCache>,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<PlannedPush, Error> {
    let plan_err = |e: bulkcast_planner::PlanError| Error::Plan(e.to_string());
    if let Some((m, note)) = matrix {
        let net = Network::from_hosts(hosts, m).map_err(plan_err)?;
        let plan = measured::push_plan(net.clone(), size, chunk, balanced).map_err(plan_err)?;
        return Ok(PlannedPush {
            longest_hop_rtt_ms: longest_hop(&net, &plan),
            plan,
            hosts: hosts.clone(),
            note,
            probe: None,
            left_out: Vec::new(),
        });
    }
    // The round trips TCP measures while connecting: probing is paid before the send, and
    // they order paths that differ by more than jitter (`bulkcast plan --samples` echoes).
    let m = measure::rtt_matrix(hosts, keys, tuning, 0, cache)
        .await
        .map_err(|e| Error::Plan(e.to_string()))?;
    let answered = HostsFile {
        source: hosts.source.clone(),
        hosts: (0..hosts.hosts.len())
            .filter(|&i| !m.left_out.iter().any(|l| l.host == i))
            .map(|i| hosts.hosts[i].clone())
            .collect(),
    };
    let net = Network::from_hosts(&answered, &m.matrix).map_err(plan_err)?;
    let plan = measured::push_plan(net.clone(), size, chunk, balanced).map_err(plan_err)?;
    Ok(PlannedPush {
        longest_hop_rtt_ms: longest_hop(&net, &plan),
        plan,
        hosts: answered,
        note: m.report.note.clone(),
        probe: Some(m.report),
        left_out: m.left_out,
    })
}

/// The longest round trip of a hop of any of the plan's trees, in ms.
fn longest_hop(net: &Network, plan: &Plan) -> f64 {
    plan.trees
        .iter()
        .map(|(t, _)| measured::longest_hop_rtt_ms(net, t))
        .fold(0.0, f64::max)
}

/// [`plan_push_with`] over round trips from `cache` or probed now.
pub async fn plan_push(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    cache: Option<&ProbeCache>,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<PlannedPush, Error> {
    plan_push_with(hosts, None, keys, tuning, cache, size, chunk, balanced).await
}

/// A receiving agent in this program, configured step by step, then [`Agent::bind`]ed.
pub struct Agent {
    cfg: AgentConfig,
    listen: Vec<String>,
    once: bool,
}

/// An [`Agent`] listening, ready to [`BoundAgent::run`].
pub struct BoundAgent {
    cfg: Arc<AgentConfig>,
    listeners: Vec<Listener>,
    addrs: Vec<SocketAddr>,
    once: bool,
}

impl Agent {
    /// An agent storing into `dir`, admitting those who hold `secret`.
    pub fn new(dir: impl Into<PathBuf>, secret: &Secret) -> Agent {
        Agent::with_keys(dir, Keys::derive(secret))
    }

    /// An agent storing into `dir` with these keys (host keys, plaintext).
    pub fn with_keys(dir: impl Into<PathBuf>, keys: Keys) -> Agent {
        Agent {
            cfg: AgentConfig::new(dir.into(), keys),
            listen: Vec::new(),
            once: false,
        }
    }

    /// An address to listen on (TCP and the paced UDP transport); repeatable. Default:
    /// `0.0.0.0:7400`.
    pub fn listen(mut self, addr: &str) -> Agent {
        self.listen.push(addr.into());
        self
    }

    /// Ends after the first object received (or session failed), as `agent --once`.
    pub fn once(mut self, once: bool) -> Agent {
        self.once = once;
        self
    }

    /// The full settings, for what the builder does not name.
    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.cfg
    }

    /// Creates the directory and listens.
    pub async fn bind(self) -> std::io::Result<BoundAgent> {
        std::fs::create_dir_all(&self.cfg.dir)?;
        let listen = if self.listen.is_empty() {
            vec!["0.0.0.0:7400".to_string()]
        } else {
            self.listen
        };
        let (mut listeners, mut addrs) = (Vec::new(), Vec::new());
        for a in &listen {
            let ls = transport::listen_both(a, &self.cfg.tuning).await?;
            addrs.push(ls[0].local_addr()?);
            listeners.extend(ls);
        }
        Ok(BoundAgent {
            cfg: Arc::new(self.cfg),
            listeners,
            addrs,
            once: self.once,
        })
    }
}

impl BoundAgent {
    /// Where it listens (one per address given; TCP and UDP share each port).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The sessions it is part of, running and finished (as `agent --web` shows them).
    pub fn sessions(&self) -> crate::live::Sessions {
        self.cfg.live.clone()
    }

    /// Serves until `shutdown` completes (`None`), or with [`Agent::once`] until the first
    /// object is received or a session fails (that outcome).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Option<Result<SessionId, crate::agent::SessionError>> {
        crate::agent::serve(self.listeners, self.cfg, self.once, shutdown).await
    }
}
