//! [`Send`]: what `bulkcast send` does, as a builder: the strategy (`auto` chosen from the
//! send's shape), the plan, leaving out receivers that do not admit the source, the session,
//! retries, and the report with its timeline.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bulkcast_planner::strategy::{self, SendShape};
use bulkcast_planner::MatrixFile;
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostsFile;
use bulkcast_proto::node::{NodeConfig, CHUNK_SIZE_RANGE};
use bulkcast_proto::swarm::Strategy as SwarmStrategy;
use bulkcast_proto::wire::{EdgeMode, SessionId};

use crate::edge::StreamsObserver;
use crate::input::Input;
use crate::measure::ProbeCache;
use crate::metrics::SourceMetrics;
use crate::report::{Report, Status, Timeline};
use crate::source::SharedStatus;
use crate::transport::{self, TcpTuning};

/// How a [`Send`] moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Strategy {
    /// Chosen from the send's shape ([`Strategy::resolve`]): a swarm across two or more sites,
    /// the planned tree (or the `fanout` tree) otherwise.
    Auto {
        /// A fixed fan-out for the tree, if the user gave one.
        fanout: Option<usize>,
    },
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

impl Strategy {
    /// The strategy a send of this `shape` runs: `self` unless it is [`Strategy::Auto`],
    /// which [`strategy::choose`] decides.
    pub fn resolve(self, shape: &SendShape) -> Strategy {
        let Strategy::Auto { fanout } = self else {
            return self;
        };
        let shape = SendShape {
            fanout: fanout.is_some(),
            ..*shape
        };
        match strategy::choose(strategy::Strategy::Auto, &shape) {
            strategy::Strategy::Flat => Strategy::Flat,
            strategy::Strategy::Balanced => Strategy::Balanced,
            strategy::Strategy::Mob => Strategy::Mob,
            strategy::Strategy::Swarm => Strategy::Swarm,
            strategy::Strategy::Hybrid => Strategy::Hybrid { fanout },
            // The library does not multicast: its fallback, the tree.
            strategy::Strategy::Tree | strategy::Strategy::Auto | strategy::Strategy::Multicast => {
                fanout.map_or(Strategy::Planned, |fanout| Strategy::Tree { fanout })
            }
        }
    }

    /// The swarm strategy it runs, if it is one.
    pub fn swarm(self) -> Option<SwarmStrategy> {
        match self {
            Strategy::Mob => Some(SwarmStrategy::Mob),
            Strategy::Swarm => Some(SwarmStrategy::Swarm),
            Strategy::Hybrid { .. } => Some(SwarmStrategy::Hybrid),
            _ => None,
        }
    }

    /// Whether it plans over round trips (probed, cached or from a matrix).
    pub fn planned(self) -> bool {
        matches!(
            self,
            Strategy::Planned | Strategy::Balanced | Strategy::Hybrid { fanout: None }
        )
    }

    /// Its short name: `flat`, `tree`, `balanced`, `mob`, `swarm`, `hybrid` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Auto { .. } => "auto",
            Strategy::Flat => "flat",
            Strategy::Tree { .. } | Strategy::Planned => "tree",
            Strategy::Balanced => "balanced",
            Strategy::Mob => "mob",
            Strategy::Swarm => "swarm",
            Strategy::Hybrid { .. } => "hybrid",
        }
    }

    /// The planner's name for it (which sets the default chunk size).
    pub(super) fn planner(self) -> strategy::Strategy {
        match self {
            Strategy::Auto { .. } => strategy::Strategy::Auto,
            Strategy::Flat => strategy::Strategy::Flat,
            Strategy::Tree { .. } | Strategy::Planned => strategy::Strategy::Tree,
            Strategy::Balanced => strategy::Strategy::Balanced,
            Strategy::Mob => strategy::Strategy::Mob,
            Strategy::Swarm => strategy::Strategy::Swarm,
            Strategy::Hybrid { .. } => strategy::Strategy::Hybrid,
        }
    }
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
    /// A chunk size outside [`CHUNK_SIZE_RANGE`].
    #[error("chunk size {0} is not between {min} and {max} bytes", min = CHUNK_SIZE_RANGE.start(), max = CHUNK_SIZE_RANGE.end())]
    ChunkSize(u32),
    /// A swarm strategy asked for receivers joined with a ticket, who reach only their parent.
    #[error("--strategy {0} needs --to (ticket receivers cannot reach each other)")]
    Joined(&'static str),
    /// Measuring or planning failed.
    #[error("plan: {0}")]
    Plan(String),
    /// A push session could not run.
    #[error(transparent)]
    Push(#[from] crate::source::SendError),
    /// A swarm session could not run.
    #[error(transparent)]
    Swarm(#[from] crate::swarm::SwarmError),
    /// No receiver was left to send to.
    #[error("no receiver admitted the source")]
    NoReceivers,
    /// The shutdown future completed first.
    #[error("interrupted")]
    Interrupted,
}

/// What a send reads: a file, a directory or stdin (`-`), opened when the send runs and again
/// for each retry.
#[derive(Debug, Clone)]
pub struct Object {
    path: PathBuf,
    name: Option<String>,
    follow_symlinks: bool,
    keep_special_modes: bool,
}

impl Object {
    /// The file or directory at `path` (`-`: stdin), under its own name; a directory's
    /// symlinks sent as links; permission bits only (no setuid, setgid or sticky bits).
    pub fn new(path: impl Into<PathBuf>) -> Object {
        Object {
            path: path.into(),
            name: None,
            follow_symlinks: false,
            keep_special_modes: false,
        }
    }

    /// The name to store it under at the receivers (`None`: its own).
    pub fn named(mut self, name: Option<&str>) -> Object {
        self.name = name.map(str::to_string);
        self
    }

    /// Follow a directory's symlinks and send what they point at.
    pub fn follow_symlinks(mut self, on: bool) -> Object {
        self.follow_symlinks = on;
        self
    }

    /// Keep setuid, setgid and sticky bits.
    pub fn keep_special_modes(mut self, on: bool) -> Object {
        self.keep_special_modes = on;
        self
    }

    /// Opens it.
    pub fn open(&self) -> std::io::Result<Input> {
        let mut input = Input::open_with(&self.path, self.name.as_deref(), self.follow_symlinks)?;
        if !self.keep_special_modes {
            input.manifest.drop_special_modes();
        }
        Ok(input)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it can be read again (not stdin).
    pub(super) fn reopens(&self) -> bool {
        self.path != Path::new("-")
    }
}

/// What a running send tells its [`Send::on_event`] callback.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// [`Strategy::Auto`] chose `strategy` for `sites` sites and an object of `len` bytes.
    Chose {
        /// What it chose.
        strategy: Strategy,
        /// Distinct sites in the hosts.
        sites: usize,
        /// The object's length, if known.
        len: Option<u64>,
    },
    /// The round trips were measured (`note`) and the planner chose `algorithm`.
    Planned {
        /// How the round trips were measured.
        note: String,
        /// The planner's algorithm.
        algorithm: String,
        /// Why.
        reason: String,
    },
    /// A receiver did not admit the source (or answer the probe) and is left out; the report
    /// says why.
    LeftOut {
        /// Its name.
        name: String,
    },
    /// A session starts; `status` follows it until [`Event::Ended`].
    Started {
        /// The session's live status.
        status: SharedStatus,
        /// The strategy's name, as the report gives it.
        strategy: String,
        /// Each receiver's site ("" for none), in the order of the status.
        sites: Vec<String>,
        /// The object's name.
        object: String,
        /// A retry's session (after the first).
        retry: bool,
        /// Whether receivers keep what they verified when the send is interrupted (a push;
        /// a swarm's receivers discard their partial copies).
        keeps_verified: bool,
    },
    /// The session that last started is over.
    Ended,
    /// The receivers `names` failed and are sent to again (`attempt` of `retries`; past them,
    /// one catch-up for receivers let go because they fell behind).
    Retry {
        /// This attempt, from 1.
        attempt: u32,
        /// Retries asked for.
        retries: u32,
        /// The receivers sent to again.
        names: Vec<String>,
    },
}

impl Event {
    /// The line `bulkcast send` prints for it (unless `--quiet`), if any.
    pub fn note(&self) -> Option<String> {
        Some(match self {
            Event::Chose {
                strategy,
                sites,
                len,
            } => {
                let name = strategy.swarm().map_or("tree", |s| s.name());
                super::auto_note(name, *sites, *len)
            }
            Event::Planned {
                note,
                algorithm,
                reason,
            } => format!("{note}\nplan: {algorithm} ({reason})"),
            Event::LeftOut { name } => {
                format!("warning: leaving {name} out (the report says why)")
            }
            Event::Retry {
                attempt,
                retries,
                names,
            } if attempt <= retries => format!("retry {attempt}/{retries}: {}", names.join(", ")),
            Event::Retry { names, .. } => format!("catching up: {}", names.join(", ")),
            Event::Started { .. } | Event::Ended => return None,
        })
    }
}

/// A progress callback.
type Progress = Box<dyn FnMut(&Status) + std::marker::Send>;

/// An event callback.
pub(super) type OnEvent = Arc<dyn Fn(&Event) + std::marker::Send + Sync>;

/// The running session's status, sampled into the report's timeline and the metrics.
#[derive(Default)]
pub(super) struct Tracker {
    status: Option<SharedStatus>,
    /// Sample into `timeline` (the first session only; retries have their own reports).
    record: bool,
    timeline: Timeline,
    metrics: Option<Arc<SourceMetrics>>,
}

pub(super) type SharedTracker = Arc<Mutex<Tracker>>;

impl Tracker {
    /// Follows `status` from now on; `record`: into the timeline.
    pub(super) fn follow(t: &SharedTracker, status: &SharedStatus, record: bool) {
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        t.status = Some(status.clone());
        t.record = record;
    }

    /// Samples the status now.
    pub(super) fn sample(t: &SharedTracker) {
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        let Tracker {
            status,
            record,
            timeline,
            metrics,
        } = &mut *t;
        let Some(status) = status else { return };
        let st = status.lock().unwrap_or_else(|e| e.into_inner());
        if *record {
            timeline.sample(&st);
        }
        if let Some(m) = metrics {
            m.observe(&st);
        }
    }

    /// The end state sampled, and the timeline so far (no more recording).
    pub(super) fn finish(t: &SharedTracker) -> Timeline {
        Tracker::sample(t);
        let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
        t.record = false;
        std::mem::take(&mut t.timeline)
    }

    fn interval(t: &SharedTracker) -> Duration {
        t.lock()
            .unwrap_or_else(|e| e.into_inner())
            .timeline
            .interval()
    }

    fn status(t: &SharedTracker) -> Option<SharedStatus> {
        t.lock().unwrap_or_else(|e| e.into_inner()).status.clone()
    }
}

/// A send, built step by step and run with [`Send::run`].
pub struct Send {
    pub(super) hosts: HostsFile,
    pub(super) keys: Option<Keys>,
    pub(super) input: Option<Input>,
    pub(super) object: Option<Object>,
    pub(super) strategy: Strategy,
    pub(super) chunk_size: Option<u32>,
    pub(super) stall_timeout: Duration,
    pub(super) tuning: TcpTuning,
    pub(super) node: NodeConfig,
    pub(super) edges: EdgeMode,
    pub(super) observer: Option<StreamsObserver>,
    pub(super) matrix: Option<(MatrixFile, String)>,
    pub(super) cache: Option<ProbeCache>,
    pub(super) retries: u32,
    pub(super) joined: bool,
    pub(super) session: SessionId,
    pub(super) metrics: Option<Arc<SourceMetrics>>,
    pub(super) on_event: Option<OnEvent>,
    progress: Option<(Duration, Progress)>,
}

impl Send {
    /// A send to `hosts` (agents' addresses, sites, capacities).
    pub fn to(hosts: HostsFile) -> Send {
        Send {
            hosts,
            keys: None,
            input: None,
            object: None,
            strategy: Strategy::Planned,
            chunk_size: None,
            stall_timeout: Duration::from_secs(30),
            tuning: TcpTuning {
                cc: transport::default_cc(),
                ..TcpTuning::default()
            },
            node: NodeConfig::default(),
            edges: EdgeMode::default(),
            observer: None,
            matrix: None,
            cache: None,
            retries: 0,
            joined: false,
            session: rand::random(),
            metrics: None,
            on_event: None,
            progress: None,
        }
    }

    /// A send to a comma-separated list of `host:port` (as `--to a:7400,b:7400`).
    pub fn to_list(list: &str) -> Result<Send, Error> {
        let hosts = HostsFile::parse_list(list).map_err(|e| Error::Hosts(e.to_string()))?;
        Ok(Send::to(hosts))
    }

    /// A send to a hosts file or a comma-separated list, as `--to` takes it
    /// ([`super::load_hosts`]).
    pub fn to_hosts(to: &str) -> Result<Send, Error> {
        Ok(Send::to(super::load_hosts(to)?))
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
    pub fn file(self, path: impl Into<PathBuf>) -> Send {
        self.object(Object::new(path))
    }

    /// Sends the file or directory at `path` under another name.
    pub fn file_named(self, path: impl Into<PathBuf>, name: &str) -> Send {
        self.object(Object::new(path).named(Some(name)))
    }

    /// Sends `object` (opened when the send runs unless [`Send::input`] gives it open, and
    /// again for each retry).
    pub fn object(mut self, object: Object) -> Send {
        self.object = Some(object);
        self
    }

    /// Sends an input opened already (stdin, a file with its manifest adjusted); with an
    /// [`Send::object`] too, this is its first opening.
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

    /// Connections per edge and their scheduler (`streams: 0`, the default, is `auto`: one
    /// connection under BBR on a single path, striping otherwise).
    pub fn edges(mut self, mode: EdgeMode) -> Send {
        self.edges = mode;
        self
    }

    /// Receives the spread edges' figures while a push runs (`--stats`, `-v`).
    pub fn observer(mut self, o: StreamsObserver) -> Send {
        self.observer = Some(o);
        self
    }

    /// Plans over this matrix instead of probing; `note` says where it came from.
    pub fn matrix(mut self, m: MatrixFile, note: impl Into<String>) -> Send {
        self.matrix = Some((m, note.into()));
        self
    }

    /// Reuses round trips probed recently for the same hosts (and keeps those probed now).
    pub fn probe_cache(mut self, cache: ProbeCache) -> Send {
        self.cache = Some(cache);
        self
    }

    /// Sends again, up to `n` times, to the receivers that failed a push: each retry a new
    /// session with only those, straight from the source, moving only what they miss. A
    /// receiver let go because it fell behind gets one retry even with `n = 0`. Needs an
    /// [`Send::object`] that is not stdin.
    pub fn retry(mut self, n: u32) -> Send {
        self.retries = n;
        self
    }

    /// The receivers joined with a ticket: they take only their parent's connection, so they
    /// are neither probed nor checked, planned trees become a chain, and swarms are refused.
    pub fn ticket_receivers(mut self, joined: bool) -> Send {
        self.joined = joined;
        self
    }

    /// The session id (default: random); a ticket's receivers joined one.
    pub fn session_id(mut self, id: SessionId) -> Send {
        self.session = id;
        self
    }

    /// Updates `m` from the live status while the send runs.
    pub fn metrics(mut self, m: Arc<SourceMetrics>) -> Send {
        self.metrics = Some(m);
        self
    }

    /// Calls `f` with what the send decides and when each session starts and ends.
    pub fn on_event(mut self, f: impl Fn(&Event) + std::marker::Send + Sync + 'static) -> Send {
        self.on_event = Some(Arc::new(f));
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

    pub(super) fn emit(&self, ev: Event) {
        if let Some(f) = &self.on_event {
            f(&ev);
        }
    }

    /// Runs the send until every receiver finished or failed, or `shutdown` completes
    /// ([`Error::Interrupted`]). Receivers that do not admit the source are left out before
    /// the tree is fixed and named in the report, as `bulkcast send` does.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<Report, Error> {
        let keys = self.keys.clone().ok_or(Error::NoKeys)?;
        if let Some(c) = self.chunk_size.filter(|c| !CHUNK_SIZE_RANGE.contains(c)) {
            return Err(Error::ChunkSize(c));
        }
        let input = match (self.input.take(), &self.object) {
            (Some(i), _) => i,
            (None, Some(o)) => o.open()?,
            (None, None) => return Err(Error::NoInput),
        };
        let mut progress = self.progress.take();
        let tracker = Arc::new(Mutex::new(Tracker {
            metrics: self.metrics.clone(),
            ..Tracker::default()
        }));
        let work = self.session(input, keys, tracker.clone());
        tokio::pin!(work);
        tokio::pin!(shutdown);
        let every = progress.as_ref().map_or(Duration::from_secs(3600), |p| p.0);
        let mut tick = tokio::time::interval(every);
        let mut next_sample = tokio::time::Instant::now() + Tracker::interval(&tracker);
        loop {
            tokio::select! {
                r = &mut work => return r,
                _ = &mut shutdown => return Err(Error::Interrupted),
                _ = tokio::time::sleep_until(next_sample) => {
                    Tracker::sample(&tracker);
                    next_sample = tokio::time::Instant::now() + Tracker::interval(&tracker);
                }
                _ = tick.tick(), if progress.is_some() => {
                    if let (Some((_, f)), Some(st)) = (&mut progress, Tracker::status(&tracker)) {
                        f(&st.lock().unwrap_or_else(|e| e.into_inner()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(len: u64, sites: usize) -> SendShape {
        SendShape::file(Some(len), sites)
    }

    #[test]
    fn auto_resolves_to_a_swarm_across_sites_and_a_tree_otherwise() {
        let auto = Strategy::Auto { fanout: None };
        assert_eq!(
            auto.resolve(&shape(64 << 20, 2)),
            Strategy::Hybrid { fanout: None }
        );
        assert_eq!(auto.resolve(&shape(1 << 20, 3)), Strategy::Mob);
        assert_eq!(auto.resolve(&shape(64 << 20, 1)), Strategy::Planned);
        // A fixed fan-out keeps the tree, and is that tree's.
        let fixed = Strategy::Auto { fanout: Some(2) };
        assert_eq!(
            fixed.resolve(&shape(64 << 20, 2)),
            Strategy::Tree { fanout: 2 }
        );
        // Ticket receivers cannot reach each other: no swarm.
        let joined = SendShape {
            ticket: true,
            ..shape(64 << 20, 2)
        };
        assert_eq!(auto.resolve(&joined), Strategy::Planned);
        // What is not auto stays.
        assert_eq!(Strategy::Flat.resolve(&shape(1, 5)), Strategy::Flat);
        assert!(Strategy::Hybrid { fanout: None }.planned());
        assert!(!Strategy::Hybrid { fanout: Some(3) }.planned());
        assert_eq!(Strategy::Planned.planner(), strategy::Strategy::Tree);
    }

    #[test]
    fn events_say_what_the_cli_prints() {
        let chose = Event::Chose {
            strategy: Strategy::Hybrid { fanout: None },
            sites: 2,
            len: Some(64 << 20),
        };
        assert_eq!(
            chose.note().unwrap(),
            "strategy auto: hybrid (2 sites, 64 MiB)"
        );
        let chose = Event::Chose {
            strategy: Strategy::Planned,
            sites: 0,
            len: None,
        };
        assert_eq!(
            chose.note().unwrap(),
            "strategy auto: tree (no sites given, unknown length)"
        );
        let retry = |attempt| Event::Retry {
            attempt,
            retries: 2,
            names: vec!["a".into(), "b".into()],
        };
        assert_eq!(retry(2).note().unwrap(), "retry 2/2: a, b");
        assert_eq!(retry(3).note().unwrap(), "catching up: a, b");
        assert!(Event::Ended.note().is_none());
    }

    #[test]
    fn objects_reopen_unless_stdin_and_drop_special_modes_by_default() {
        assert!(!Object::new("-").reopens());
        let dir = std::env::temp_dir().join(format!("bulkcast-object-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("f");
        std::fs::write(&f, b"abc").unwrap();
        let o = Object::new(&f).named(Some("g"));
        assert!(o.reopens());
        let input = o.open().unwrap();
        assert_eq!(input.manifest.name, "g");
        assert_eq!(input.manifest.total_len, Some(3));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
