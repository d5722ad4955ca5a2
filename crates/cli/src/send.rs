//! `bulkcast send`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_node::input::Input;
use bulkcast_node::measure::{self, LeftOut, ProbeCache, ProbeReport};
use bulkcast_node::report::Report;
use bulkcast_node::source::{self, SendConfig};
use bulkcast_node::ticket::{self, Ticket};
use bulkcast_node::{swarm, transport};
use bulkcast_planner::strategy;
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::{HostSpec, HostsFile, SshTarget};
use bulkcast_proto::node::{NodeConfig, CHUNK_SIZE_RANGE};
use bulkcast_proto::swarm::Strategy as SwarmStrategy;
use bulkcast_proto::tree::Tree;
use clap::{Args, ValueEnum};

use crate::edges::EdgeArgs;
use crate::outcome::exit_code;
pub use crate::outcome::print_report;
use crate::{plan, progress, shutdown_signal, Common};

#[derive(Args)]
pub struct SendArgs {
    /// File or directory to send, or `-` for stdin.
    path: PathBuf,
    /// Receivers: `host:port,host:port` or a hosts file (TOML).
    #[arg(
        long,
        required_unless_present_any = ["expect", "hostfile", "ssh"],
        conflicts_with_all = ["expect", "hostfile", "ssh"]
    )]
    to: Option<String>,
    /// Start a one-shot agent on each of these hosts over ssh (`user@host,...`) and send to
    /// them; each is stopped after the send. A host without the binary gets a copy of this
    /// one for the send (same system only); the session secret is a fresh one unless given.
    #[arg(long, value_name = "USER@HOST,...", conflicts_with_all = ["expect", "hostfile"])]
    ssh: Option<String>,
    /// More arguments for every `ssh` of `--ssh` (and of a hosts file's `ssh` hosts), as one
    /// string (`"-p 2222 -i key"`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    ssh_args: String,
    /// The bulkcast binary on the `--ssh` hosts (and a hosts file's `ssh` hosts).
    #[arg(long, default_value = "bulkcast")]
    ssh_bulkcast: String,
    /// Fail on `--ssh` (or `ssh`) hosts without the binary instead of copying this one there.
    #[arg(long)]
    ssh_no_copy: bool,
    /// Where the `--ssh` hosts store the object (relative paths start at the login's home;
    /// `{host}` becomes the host's name).
    #[arg(long, default_value = "bulkcast-incoming")]
    ssh_dir: String,
    /// The session secret of `--ssh` agents (set by `run`).
    #[arg(skip)]
    ssh_secret: Option<Secret>,
    /// The hosts file of `--to`, its `ssh` hosts' addresses filled in (set by `run`).
    #[arg(skip)]
    hosts: Option<HostsFile>,
    /// Receivers from a file of host names, one Slurm host list per line (`node[01-04,07]`,
    /// as `$SLURM_JOB_NODELIST` prints them; `#` comments); each reached at `--port`.
    #[arg(long, value_name = "FILE", conflicts_with = "expect")]
    hostfile: Option<PathBuf>,
    /// The agents' port for `--hostfile` hosts given without one.
    #[arg(long, default_value_t = 7400, requires = "hostfile")]
    port: u16,
    /// Ticket mode: print a ticket and start when this many receivers have joined.
    #[arg(long)]
    expect: Option<usize>,
    /// Ticket mode: address to take joins on.
    #[arg(long, default_value = "0.0.0.0:0")]
    listen: String,
    /// Ticket mode: address to put in the ticket (default: this host's name and the port).
    #[arg(long)]
    advertise: Option<String>,
    /// Ticket mode: seconds to wait for receivers before starting with those that joined.
    #[arg(long, default_value_t = 120)]
    join_timeout: u64,
    /// Name to store the object under at the receivers (required for stdin streams to be named).
    #[arg(long)]
    name: Option<String>,
    /// How to spread the data.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    strategy: Strategy,
    /// Children per node in a fixed tree over the hosts in the given order (1 is a chain).
    /// Without it, `tree` probes the agents and uses the planner's tree.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    fanout: Option<u16>,
    /// Chunk size in KiB (default: chosen from the object size and the tree depth, see
    /// `bulkcast_planner::strategy::chunk_size`).
    #[arg(long)]
    chunk_kib: Option<u32>,
    /// Plan from this matrix file (see `bulkcast plan --save-matrix`) instead of probing.
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// Reuse round trips probed for the same hosts within this many seconds (kept under
    /// `~/.cache/bulkcast/probes`); 0 probes before every send.
    #[arg(long, default_value_t = 600)]
    probe_max_age: u64,
    /// Seconds without progress after which a receiver is cut off (with its subtree).
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
    /// Send again, up to this many times, to the receivers that failed: each retry is a new
    /// session with only those, straight from the source, and moves only what they miss (they
    /// keep what they verified). Files only (not stdin). A receiver let go because it fell
    /// behind gets one retry even without it.
    #[arg(long, default_value_t = 0)]
    retry: u32,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics while the send runs: every receiver's
    /// and edge's bytes and rate, receivers running, done and failed, the source's queue.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// After the report, keep serving the final metrics until they are scraped once, at most
    /// this many seconds.
    #[arg(long, default_value_t = 0, value_name = "SECS", requires = "metrics")]
    metrics_linger: u64,
    /// Serve a live page of the send at http://ADDR/: receivers by site with progress, rate
    /// and ETA, every edge's rate, failures in red, and the report at the end.
    #[arg(long, value_name = "ADDR")]
    web: Option<String>,
    /// No progress display.
    #[arg(long, short)]
    quiet: bool,
    /// Keep setuid, setgid and sticky bits (by default copies get the permission bits only).
    #[arg(long)]
    keep_special_modes: bool,
    /// Follow a directory's symlinks and send what they point at (by default a link inside
    /// the tree is sent as a link and one leading out of it is left out).
    #[arg(long)]
    follow_symlinks: bool,
    #[command(flatten)]
    edges: EdgeArgs,
    #[command(flatten)]
    mcast: crate::send_mcast::McastArgs,
    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Strategy {
    /// For a file (or a directory of at most 2 GiB) spread over two or more sites of the hosts
    /// file: `hybrid` from `AUTO_HYBRID_MIN_BYTES` (2 MiB), `mob` below; `tree` otherwise (see
    /// `bulkcast_planner::strategy::choose`).
    Auto,
    /// The source sends to every receiver itself (the baseline).
    Flat,
    /// Receivers relay down a tree: the planner's (probed), or `--fanout` children per node in
    /// the given host order.
    Tree,
    /// Several trees at once, each carrying a share of the chunks in proportion to its planned
    /// rate, so that together they use every access link (the planner's balanced multi-trees).
    Balanced,
    /// MOB: receivers pull; each site (`site` in the hosts file) pulls each piece over the WAN
    /// once and shares it locally. A file of any size (pieces are served from disk once
    /// stored) or a directory of at most 2 GiB (held in memory).
    Mob,
    /// BitTorrent-style swarm (random peers and pieces, tit-for-tat choking): a baseline,
    /// slower and with duplicate WAN copies. Same size limits as `mob`.
    Swarm,
    /// The source deals each piece out of its site once, sites pull from each other what they
    /// lack, and push runs down the planned tree (or `--fanout`) inside each site. Same size
    /// limits as `mob`.
    Hybrid,
    /// One file by IP multicast on a LAN, lost datagrams repaired with erasure-coded parity;
    /// receivers the group does not reach get it by the tree (see `--mcast-*`).
    Multicast,
}

impl Strategy {
    /// The library's name for it.
    fn to_planner(self) -> strategy::Strategy {
        match self {
            Strategy::Auto => strategy::Strategy::Auto,
            Strategy::Flat => strategy::Strategy::Flat,
            Strategy::Tree => strategy::Strategy::Tree,
            Strategy::Multicast => strategy::Strategy::Multicast,
            Strategy::Balanced => strategy::Strategy::Balanced,
            Strategy::Mob => strategy::Strategy::Mob,
            Strategy::Swarm => strategy::Strategy::Swarm,
            Strategy::Hybrid => strategy::Strategy::Hybrid,
        }
    }

    fn from_planner(s: strategy::Strategy) -> Strategy {
        match s {
            strategy::Strategy::Auto => Strategy::Auto,
            strategy::Strategy::Flat => Strategy::Flat,
            strategy::Strategy::Tree => Strategy::Tree,
            strategy::Strategy::Balanced => Strategy::Balanced,
            strategy::Strategy::Mob => Strategy::Mob,
            strategy::Strategy::Swarm => Strategy::Swarm,
            strategy::Strategy::Hybrid => Strategy::Hybrid,
            strategy::Strategy::Multicast => Strategy::Multicast,
        }
    }
}

pub async fn run(a: SendArgs) -> Result<i32> {
    // The span of the whole send (what `--features otel` exports).
    let span = tracing::info_span!("send", path = %a.path.display());
    tracing::Instrument::instrument(run_send(a), span).await
}

async fn run_send(a: SendArgs) -> Result<i32> {
    check_chunk_kib(a.chunk_kib)?;
    let mut input = Input::open_with(&a.path, a.name.as_deref(), a.follow_symlinks)?;
    if !a.keep_special_modes {
        input.manifest.drop_special_modes();
    }
    let skipped = input.skipped().to_vec();
    let tuning = a.common.tuning()?;
    let a = match &a.hostfile {
        Some(f) => SendArgs {
            to: Some(hostfile_list(f, a.port)?),
            ..a
        },
        None => a,
    };
    // One-shot agents over ssh: kept (and stopped when dropped) until the send is over.
    let (ssh_agents, a) = ssh_agents(a).await?;
    let mut endpoint = match &a.metrics {
        Some(addr) => {
            let m = crate::metrics::Endpoint::start(addr).await?;
            eprintln!("metrics on http://{}/metrics", m.addr);
            Some(m)
        }
        None => None,
    };
    let session: u64 = rand::random();
    let (file, keys) = receivers(&a, &tuning, session).await?;
    let a = SendArgs {
        strategy: auto_strategy(&a, &input, file.source.as_ref(), &file.hosts),
        ..a
    };
    let file_len = file.hosts.len();
    let mut send = Send {
        a: &a,
        file,
        keys: &keys,
        session,
        left_out: Vec::new(),
        given: (0..file_len).collect(),
        metrics: endpoint.as_ref().map(|m| m.source()),
        page: None,
        hop_rtt_ms: None,
    };
    send.check_hosts(&tuning).await?;
    let mut report = match swarm_strategy(a.strategy) {
        Some(strategy) => send.swarm(input, strategy, tuning).await?,
        None if a.strategy == Strategy::Multicast => send.multicast(input, tuning).await?,
        None => send.push(input, tuning).await?,
    };
    report.object.skipped = skipped;
    report.leave_out(
        send.left_out
            .into_iter()
            .map(|(i, h, why)| (i, h.name, h.addr, why)),
    );
    if let Some(m) = endpoint.as_mut() {
        m.mark_final();
    }
    print_report(&report, a.json)?;
    if let Some(p) = send.page.take() {
        p.finish(serde_json::to_string(&report)?, Duration::from_secs(3))
            .await;
    }
    if let Some(m) = endpoint {
        m.linger(Duration::from_secs(a.metrics_linger)).await;
    }
    if let Some(agents) = ssh_agents {
        agents.stop().await;
    }
    Ok(exit_code(&report))
}

/// Starts the one-shot agents of `--ssh`, or of the `ssh` hosts of `--to`'s hosts file, and
/// gives the arguments that send to them.
async fn ssh_agents(a: SendArgs) -> Result<(Option<crate::ssh::Agents>, SendArgs)> {
    let (targets, file) = match (&a.ssh, &a.to) {
        (Some(list), _) => (crate::ssh::parse_list(list)?, None),
        (None, Some(to)) => {
            let file = load_hosts(to)?;
            let targets = file
                .hosts
                .iter()
                .filter_map(|h| h.ssh.as_deref())
                // Checked when the file was read.
                .map(|s| SshTarget::parse(s).map_err(|why| anyhow::anyhow!("ssh = {s:?}: {why}")))
                .collect::<Result<Vec<_>>>()?;
            if targets.is_empty() {
                return Ok((None, a));
            }
            (targets, Some(file))
        }
        (None, None) => return Ok((None, a)),
    };
    // A fresh secret is enough when every agent is one of ours; running agents need theirs.
    let all_ours = file
        .as_ref()
        .is_none_or(|f| f.hosts.iter().all(|h| h.ssh.is_some()));
    let secret = match (a.common.secret()?, all_ours) {
        (Some(s), _) => s,
        (None, true) => Secret::from_bytes(rand::random()),
        (None, false) => a.common.require_secret()?,
    };
    let opts = crate::ssh::SshOptions {
        targets: &targets,
        ssh_args: &a.ssh_args,
        remote_bin: &a.ssh_bulkcast,
        remote_dir: &a.ssh_dir,
        copy: !a.ssh_no_copy,
    };
    let agents = crate::ssh::start(&opts, &secret).await?;
    let (to, hosts) = match file {
        None => (Some(agents.addrs.join(",")), None),
        Some(mut f) => {
            let mut addrs = agents.addrs.iter();
            for h in f.hosts.iter_mut().filter(|h| h.ssh.is_some()) {
                h.addr = addrs.next().context("an agent per ssh host")?.clone();
                // Now an agent like any other (and the file valid with its address).
                h.ssh = None;
            }
            // Checked again with the addresses: an agent may now share one with another host.
            let f = HostsFile::parse_toml(&f.to_toml()).context("hosts with their ssh agents")?;
            (a.to.clone(), Some(f))
        }
    };
    let a = SendArgs {
        to,
        hosts,
        ssh_secret: Some(secret),
        ..a
    };
    Ok((Some(agents), a))
}

/// The `--to` list of a `--hostfile`: every host, at `port` unless it names its own.
fn hostfile_list(f: &std::path::Path, port: u16) -> Result<String> {
    let text =
        std::fs::read_to_string(f).with_context(|| format!("reading host file {}", f.display()))?;
    let hosts =
        crate::hostlist::read_file(&text).with_context(|| format!("host file {}", f.display()))?;
    if hosts.is_empty() {
        bail!("host file {} names no host", f.display());
    }
    let with_port: Vec<String> = hosts
        .into_iter()
        .map(|h| {
            if h.contains(':') {
                h
            } else {
                format!("{h}:{port}")
            }
        })
        .collect();
    Ok(with_port.join(","))
}

fn check_chunk_kib(chunk_kib: Option<u32>) -> Result<()> {
    let fits = |k: u32| {
        k.checked_mul(1024)
            .is_some_and(|c| CHUNK_SIZE_RANGE.contains(&c))
    };
    if chunk_kib.is_some_and(|k| !fits(k)) {
        bail!(
            "--chunk-kib must be between {} and {}",
            CHUNK_SIZE_RANGE.start() / 1024,
            CHUNK_SIZE_RANGE.end() / 1024
        );
    }
    Ok(())
}

/// The receivers and the session's keys: from `--to` (a list or a hosts file, the secret from
/// the environment), or the receivers that join with a ticket (`--expect`).
async fn receivers(
    a: &SendArgs,
    tuning: &transport::TcpTuning,
    session: u64,
) -> Result<(HostsFile, Keys)> {
    match (&a.to, a.expect) {
        (Some(to), _) => {
            let secret = match &a.ssh_secret {
                Some(s) => s.clone(),
                None => a.common.require_secret()?,
            };
            let file = match &a.hosts {
                Some(f) => f.clone(),
                None => load_hosts(to)?,
            };
            Ok((file, a.common.keys(&secret)?))
        }
        (None, Some(0)) => bail!("--expect must be at least 1"),
        (None, Some(n)) => ticket_receivers(a, tuning, session, n).await,
        (None, None) => bail!("give --to HOSTS or --expect N"),
    }
}

/// Prints a ticket and waits (up to `--join-timeout`) for `n` receivers to join with it.
async fn ticket_receivers(
    a: &SendArgs,
    tuning: &transport::TcpTuning,
    session: u64,
    n: usize,
) -> Result<(HostsFile, Keys)> {
    // A key for this session alone, never the fleet's secret (BULKCAST_SECRET): the ticket is
    // handed around, and must admit nobody to anything after this session.
    let secret = Secret::from_bytes(rand::random());
    let keys = Keys::derive(&secret).with_plaintext(a.common.plaintext);
    let listener = transport::listen(&a.listen, tuning)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    let port = listener.local_addr()?.port();
    let addr = a.advertise.clone().unwrap_or_else(|| {
        let ip = listener
            .local_addr()
            .map(|l| l.ip())
            .ok()
            .filter(|ip| !ip.is_unspecified());
        match ip {
            Some(ip) => format!("{ip}:{port}"),
            None => format!("{}:{port}", progress::hostname()),
        }
    });
    let t = Ticket {
        secret: secret.clone(),
        session,
        addr,
    };
    // The ticket goes to stdout alone on its line so scripts can capture it.
    println!("{t}");
    eprintln!("waiting for {n} receivers: bulkcast recv {t}");
    let hosts = tokio::select! {
        h = ticket::gather(&listener, &keys, n, Duration::from_secs(a.join_timeout)) => h,
        _ = shutdown_signal() => bail!("interrupted"),
    };
    if hosts.is_empty() {
        bail!("nobody joined within {} s", a.join_timeout);
    }
    if hosts.len() < n {
        eprintln!(
            "warning: only {} of {n} receivers joined; sending to them",
            hosts.len()
        );
    }
    Ok((
        HostsFile {
            source: None,
            hosts,
        },
        keys,
    ))
}

/// One send, its receivers known: what the push and the swarm strategies share.
struct Send<'a> {
    a: &'a SendArgs,
    /// The receivers the send goes to: those given, less `left_out` once they are checked.
    file: HostsFile,
    keys: &'a Keys,
    session: u64,
    /// Receivers that did not admit the source up front, with their place in the list given
    /// and why: they fail alone.
    left_out: Vec<(usize, HostSpec, String)>,
    /// For each receiver in `file`, its place in the list given.
    given: Vec<usize>,
    /// `--metrics`: the send's own.
    metrics: Option<std::sync::Arc<bulkcast_node::metrics::SourceMetrics>>,
    /// `--web`: the live page, once the send has started.
    page: Option<crate::web::Page>,
    /// The longest round trip of a hop of the planned tree, in ms, once planned (it sets the
    /// size of the chunks' verified parts, `strategy::part_bytes`).
    hop_rtt_ms: Option<f64>,
}

impl Send<'_> {
    /// Whether the plan's probe will check the receivers (a planned tree without `--matrix`).
    fn probes(&self) -> bool {
        let a = self.a;
        let planned = match a.strategy {
            Strategy::Tree | Strategy::Balanced | Strategy::Hybrid => a.fanout.is_none(),
            _ => false,
        };
        planned && a.matrix.is_none() && a.expect.is_none()
    }

    /// Leaves out, before any tree is fixed, every receiver that does not admit the source
    /// (unreachable, refused, another secret), so that it fails alone and is named. The probe
    /// of a planned tree does this itself; ticket receivers were admitted when they joined.
    async fn check_hosts(&mut self, tuning: &transport::TcpTuning) -> Result<()> {
        if self.a.expect.is_some() || self.probes() {
            return Ok(());
        }
        let keys = self.keys.clone();
        let out = measure::unadmitted(&self.file, &keys, tuning, Duration::from_secs(5)).await;
        self.leave_out(out)
    }

    /// Takes `out` off the receivers; an error when none is left.
    fn leave_out(&mut self, out: Vec<LeftOut>) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let mut hosts = std::mem::take(&mut self.file.hosts);
        let mut out = out;
        out.sort_by_key(|l| l.host);
        for l in out.iter().rev() {
            let h = hosts.remove(l.host);
            // The reason is in the report: a failure is said once.
            if !self.a.quiet {
                eprintln!("warning: leaving {} out (the report says why)", h.name);
            }
            let given = self.given.remove(l.host);
            self.left_out.push((given, h, l.reason.clone()));
        }
        if hosts.is_empty() {
            bail!("no receiver admitted the source (see the warnings above)");
        }
        self.file.hosts = hosts;
        Ok(())
    }

    /// The chunk size the planner plans with (the real one follows the tree's depth).
    fn planned_chunk(&self) -> u32 {
        self.a.chunk_kib.map_or(1 << 20, |k| k * 1024)
    }

    /// A swarm (MOB, the BitTorrent-style baseline, or the hybrid over its tree).
    async fn swarm(
        &mut self,
        input: Input,
        strategy: SwarmStrategy,
        tuning: transport::TcpTuning,
    ) -> Result<Report> {
        let a = self.a;
        if a.expect.is_some() {
            bail!(
                "--strategy {} needs --to (ticket receivers cannot reach each other)",
                strategy.name()
            );
        }
        if a.fanout.is_some() && strategy != SwarmStrategy::Hybrid && !a.quiet {
            eprintln!(
                "note: --fanout is ignored by --strategy {} (no tree)",
                strategy.name()
            );
        }
        let len = input.manifest.total_len;
        let mut probed = None;
        let tree = match (strategy, a.fanout) {
            (SwarmStrategy::Hybrid, Some(k)) => Some(Tree::kary(self.file.hosts.len(), k as usize)),
            (SwarmStrategy::Hybrid, None) => {
                let (p, probe) = self.planned(&tuning, len, false).await?;
                probed = probe;
                Some(p.tree().clone())
            }
            _ => None,
        };
        // Without a tree every receiver hangs off the source, as in a flat tree.
        let flat = Tree::flat(self.file.hosts.len());
        let chunk_size = match a.chunk_kib {
            Some(k) => k * 1024,
            None => strategy::chunk_size(a.strategy.to_planner(), len, &flat),
        };
        let cfg = swarm::SwarmSendConfig {
            strategy,
            chunk_size,
            stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
            tuning,
            seed: rand::random(),
        };
        let hosts = &self.file.hosts;
        let status = source::new_status(hosts, tree.as_ref().unwrap_or(&flat), chunk_size, len);
        self.page = live_page(a, &status, hosts, &input, strategy.name()).await?;
        let work = swarm::send(
            input,
            self.file.source.as_ref(),
            hosts,
            tree.as_ref(),
            self.keys.clone(),
            self.session,
            &cfg,
            status.clone(),
        );
        let Some((result, timeline)) =
            progress::sending(status.clone(), a.quiet, self.metrics.clone(), work).await
        else {
            bail!("interrupted: receivers discard their partial copies");
        };
        let mut report = result.map_err(anyhow::Error::msg)?;
        report.probe = probed;
        report.timeline = timeline;
        Ok(report)
    }

    /// A push down one tree, or several with their rates (balanced).
    async fn push(&mut self, input: Input, tuning: transport::TcpTuning) -> Result<Report> {
        let a = self.a;
        let len = input.manifest.total_len;
        let (trees, strategy, probed) = self.trees(&tuning, len).await?;
        let hosts = &self.file.hosts;
        // The deepest tree sets the chunk size.
        let tree = trees
            .iter()
            .map(|t| &t.0)
            .max_by_key(|t| (1..t.len()).map(|i| t.depth(i)).max().unwrap_or(0))
            .expect("at least one tree")
            .clone();
        let chunk_size = match a.chunk_kib {
            Some(k) => k * 1024,
            None => strategy::push_chunk_size(len, &tree),
        };
        let cfg = SendConfig {
            edges: a
                .edges
                .mode()?
                .for_session(&tuning.cc, hosts.iter().any(|h| !h.paths.is_empty())),
            observer: a.edges.observer()?,
            chunk_size,
            stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
            node: NodeConfig {
                part_bytes: strategy::part_bytes(self.hop_rtt_ms),
                ..a.common.node()
            },
            tuning,
            strategy,
            uplink_mbps: self.file.source.as_ref().and_then(|s| s.uplink_mbps),
        };
        let status = source::new_status(hosts, &tree, chunk_size, len);
        self.page = live_page(a, &status, hosts, &input, &cfg.strategy).await?;
        let keys = self.keys.clone();
        let work = async {
            if trees.len() > 1 {
                source::send_balanced(input, hosts, &trees, keys, &cfg, status.clone()).await
            } else {
                let tree = &trees[0].0;
                source::send(input, hosts, tree, keys, self.session, &cfg, status.clone()).await
            }
        };
        let Some((result, timeline)) =
            progress::sending(status.clone(), a.quiet, self.metrics.clone(), work).await
        else {
            bail!("interrupted: receivers keep what they verified; send again to resume");
        };
        let mut report = result?;
        report.probe = probed;
        report.timeline = timeline;
        report.part_size = cfg.node.part_bytes;
        self.retry_failed(&mut report, &cfg).await?;
        Ok(report)
    }

    /// `--strategy multicast`; the receivers the group does not reach get the file by the
    /// tree, said on one line.
    async fn multicast(&mut self, input: Input, tuning: transport::TcpTuning) -> Result<Report> {
        let a = self.a;
        let stall = Duration::from_secs(a.stall_timeout.max(1));
        let (mut report, fallback) = crate::send_mcast::send(
            &a.mcast, &a.path, &input, &self.file, self.keys, &tuning, stall, a.quiet,
        )
        .await?;
        let addrs: Vec<String> = self.file.hosts.iter().map(|h| h.addr.clone()).collect();
        if let Some(u) = bulkcast_node::mcast::Unreached::in_user_cache() {
            match fallback.len() == addrs.len() {
                true => u.remember(&addrs),
                false => u.forget(&addrs),
            }
        }
        if fallback.is_empty() {
            return Ok(report);
        }
        let names: Vec<String> = fallback
            .iter()
            .map(|(i, e)| format!("{} ({e})", self.file.hosts[*i].name))
            .collect();
        eprintln!(
            "multicast does not reach {} of {} receivers; sending to them by the tree: {}",
            fallback.len(),
            self.file.hosts.len(),
            names.join(", ")
        );
        let (hosts, given) = (self.file.hosts.clone(), self.given.clone());
        self.file.hosts = fallback.iter().map(|(i, _)| hosts[*i].clone()).collect();
        self.given = fallback.iter().map(|(i, _)| given[*i]).collect();
        let tree = self.push(input, tuning).await;
        self.file.hosts = hosts;
        self.given = given;
        crate::send_mcast::merge_tree(&mut report, tree?, fallback.len());
        Ok(report)
    }

    /// `--retry`: sends again to the receivers that failed, each time a new session with only
    /// those hanging off the source, until every one has its copy or the retries are spent; each
    /// one's line in `report` is replaced by its latest. A receiver let go from the push because
    /// it fell behind gets one such session even without `--retry`: it was not broken, only slow.
    async fn retry_failed(&self, report: &mut Report, cfg: &SendConfig) -> Result<()> {
        let (a, hosts) = (self.a, &self.file.hosts);
        for attempt in 1..=a.retry.max(1) {
            let failed: Vec<usize> = (0..report.receivers.len().min(hosts.len()))
                .filter(|&i| {
                    let r = &report.receivers[i];
                    let behind = r
                        .error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("fell behind"));
                    !r.verified && (attempt <= a.retry || behind)
                })
                .collect();
            if failed.is_empty() || a.path.as_os_str() == "-" || a.expect.is_some() {
                return Ok(());
            }
            if !a.quiet {
                let names: Vec<&str> = failed.iter().map(|&i| hosts[i].name.as_str()).collect();
                match attempt <= a.retry {
                    true => eprintln!("retry {attempt}/{}: {}", a.retry, names.join(", ")),
                    false => eprintln!("catching up: {}", names.join(", ")),
                }
            }
            // A moment for a restarting agent to come back.
            tokio::time::sleep(Duration::from_secs(attempt.min(5) as u64)).await;
            let mut input = Input::open_with(&a.path, a.name.as_deref(), a.follow_symlinks)?;
            if !a.keep_special_modes {
                input.manifest.drop_special_modes();
            }
            let sub: Vec<_> = failed.iter().map(|&i| hosts[i].clone()).collect();
            let tree = Tree::flat(sub.len());
            let len = input.manifest.total_len;
            let status = source::new_status(&sub, &tree, cfg.chunk_size, len);
            let keys = self.keys.clone();
            let work = source::send(
                input,
                &sub,
                &tree,
                keys,
                rand::random(),
                cfg,
                status.clone(),
            );
            let Some((result, _)) =
                progress::sending(status, a.quiet, self.metrics.clone(), work).await
            else {
                bail!("interrupted: receivers keep what they verified; send again to resume");
            };
            let again = result?;
            for (j, &i) in failed.iter().enumerate() {
                report.receivers[i] = again.receivers[j].clone();
            }
            report.edges.extend(again.edges);
            report.rejected.extend(again.rejected);
            report.seconds += again.seconds;
            report.ok = report.receivers.iter().all(|r| r.verified);
        }
        Ok(())
    }

    /// The push's trees with their planned rates, the strategy's name for the report, and how
    /// the round trips were measured when the tree was planned.
    async fn trees(
        &mut self,
        tuning: &transport::TcpTuning,
        len: Option<u64>,
    ) -> Result<(Vec<(Tree, f64)>, String, Option<ProbeReport>)> {
        let (a, n) = (self.a, self.file.hosts.len());
        // `n` holds for every tree but the planned ones, whose probe may leave hosts out.
        Ok(match (a.strategy, a.fanout) {
            (Strategy::Flat, _) => (vec![(Tree::flat(n), 0.0)], "flat".into(), None),
            (Strategy::Tree, Some(k)) => (
                vec![(Tree::kary(n, k as usize), 0.0)],
                format!("tree (fan-out {k})"),
                None,
            ),
            // Ticket receivers take only their parent's connection, so they cannot be probed.
            (_, None) if a.expect.is_some() => {
                (vec![(Tree::kary(n, 1), 0.0)], "tree (chain)".into(), None)
            }
            (strategy, _) => {
                let balanced = strategy == Strategy::Balanced;
                let (p, probed) = self.planned(tuning, len, balanced).await?;
                if balanced {
                    (p.trees, "balanced".into(), probed)
                } else {
                    let name = format!("tree (planned: {})", p.algorithm);
                    (vec![(p.tree().clone(), p.rate_mbps)], name, probed)
                }
            }
        })
    }

    /// Probes (or reads `--matrix` or the probe cache) and plans, saying what it did unless
    /// `--quiet`.
    async fn planned(
        &mut self,
        tuning: &transport::TcpTuning,
        size: Option<u64>,
        balanced: bool,
    ) -> Result<(bulkcast_planner::Plan, Option<ProbeReport>)> {
        let a = self.a;
        let cache = match a.probe_max_age {
            0 => None,
            secs => ProbeCache::in_user_cache(Duration::from_secs(secs)),
        };
        let sp = plan::for_send(
            &self.file,
            a.matrix.as_deref(),
            self.keys,
            tuning,
            cache.as_ref(),
            size,
            self.planned_chunk(),
            balanced,
        )
        .await?;
        if !a.quiet {
            eprintln!(
                "{}\nplan: {} ({})",
                sp.note, sp.plan.algorithm, sp.plan.reason
            );
        }
        // The plan spans the hosts that answered the probe: the send goes to those.
        self.leave_out(sp.left_out)?;
        self.hop_rtt_ms = Some(sp.longest_hop_rtt_ms);
        debug_assert_eq!(self.file.hosts.len(), sp.hosts.hosts.len());
        Ok((sp.plan, sp.probe))
    }
}

/// The swarm strategy behind a `--strategy` value, if it is one.
fn swarm_strategy(s: Strategy) -> Option<SwarmStrategy> {
    match s {
        Strategy::Mob => Some(SwarmStrategy::Mob),
        Strategy::Swarm => Some(SwarmStrategy::Swarm),
        Strategy::Hybrid => Some(SwarmStrategy::Hybrid),
        Strategy::Auto
        | Strategy::Flat
        | Strategy::Tree
        | Strategy::Balanced
        | Strategy::Multicast => None,
    }
}

/// What `--strategy auto` means for this send ([`strategy::choose`]), said unless `--quiet`.
fn auto_strategy(
    a: &SendArgs,
    input: &Input,
    source: Option<&bulkcast_proto::hosts::SourceSpec>,
    hosts: &[bulkcast_proto::hosts::HostSpec],
) -> Strategy {
    if a.strategy != Strategy::Auto {
        return a.strategy;
    }
    let sites: std::collections::BTreeSet<&str> = hosts
        .iter()
        .filter_map(|h| h.site.as_deref())
        .chain(source.and_then(|s| s.site.as_deref()))
        .collect();
    let addrs: Vec<String> = hosts.iter().map(|h| h.addr.clone()).collect();
    let shape = strategy::SendShape {
        len: input.manifest.total_len,
        single_file: input.single_file().is_some(),
        sites: sites.len(),
        ticket: a.expect.is_some(),
        fanout: a.fanout.is_some(),
        lan: bulkcast_node::mcast::on_lan(&addrs),
    };
    let mut chosen = Strategy::from_planner(strategy::choose(strategy::Strategy::Auto, &shape));
    let unreached = bulkcast_node::mcast::Unreached::in_user_cache();
    if chosen == Strategy::Multicast && unreached.is_some_and(|u| u.recent(&addrs)) {
        if !a.quiet {
            eprintln!("strategy auto: multicast reached none of these hosts within a day");
        }
        chosen = Strategy::Tree;
    }
    if !a.quiet {
        let name = match chosen {
            Strategy::Multicast => "multicast on this LAN",
            c => swarm_strategy(c).map_or("tree", SwarmStrategy::name),
        };
        eprintln!(
            "strategy auto: {} ({}, {})",
            name,
            match sites.len() {
                0 => "no sites given".to_string(),
                1 => "one site".to_string(),
                n => format!("{n} sites"),
            },
            shape
                .len
                .map_or("unknown length".to_string(), |l| format!("{} MiB", l >> 20))
        );
    }
    chosen
}

/// A comma-separated list or a hosts file.
pub fn load_hosts(to: &str) -> Result<HostsFile> {
    let p = std::path::Path::new(to);
    if p.extension().is_some_and(|e| e == "toml") || (p.is_file() && !to.contains(',')) {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading hosts file {to}"))?;
        Ok(HostsFile::parse_toml(&text).with_context(|| format!("hosts file {to}"))?)
    } else {
        Ok(HostsFile::parse_list(to)?)
    }
}

/// Starts `--web`'s page, if asked for.
async fn live_page(
    a: &SendArgs,
    status: &source::SharedStatus,
    hosts: &[HostSpec],
    input: &Input,
    strategy: &str,
) -> Result<Option<crate::web::Page>> {
    let Some(addr) = &a.web else { return Ok(None) };
    let sites = hosts
        .iter()
        .map(|h| h.site.clone().unwrap_or_default())
        .collect();
    let page = crate::web::Page::start(addr, status.clone(), sites, &input.manifest.name, strategy)
        .await?;
    eprintln!("live page on http://{}/", page.addr);
    Ok(Some(page))
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::headline;
    use bulkcast_node::report::{ObjectReport, ReceiverReport};

    fn rx(name: &str, rate: f64, verified: bool) -> ReceiverReport {
        ReceiverReport {
            name: name.into(),
            addr: String::new(),
            parent: "source".into(),
            bytes: 0,
            seconds: 1.0,
            rate_mbps: rate,
            verified,
            held_bytes: 0,
            already_in_place: false,
            received_bytes: None,
            error: (!verified).then(|| "unreachable".into()),
            site: None,
            received_from: Vec::new(),
        }
    }

    fn report(receivers: Vec<ReceiverReport>) -> Report {
        Report {
            session: "0".into(),
            object: ObjectReport {
                name: "x".into(),
                kind: "file".into(),
                bytes: 1 << 20,
                skipped: Vec::new(),
            },
            strategy: "flat".into(),
            chunk_size: 1 << 16,
            part_size: 0,
            seconds: 1.0,
            ok: receivers.iter().all(|r| r.verified),
            aggregate_mbps: 1.0,
            receivers,
            edges: Vec::new(),
            clusters: Vec::new(),
            probe: None,
            timeline: Default::default(),
            multicast: None,
            rejected: Vec::new(),
        }
    }

    #[test]
    fn headline_rate_leaves_failed_receivers_out() {
        let h = headline(&report(vec![rx("a", 800.0, true), rx("b", 0.0, false)]));
        assert!(
            h.contains("800.0 Mbit/s per receiver (slowest of the 1 verified; 1 failed)"),
            "{h}"
        );
        let h = headline(&report(vec![rx("a", 800.0, true), rx("b", 700.0, true)]));
        assert!(h.contains("700.0 Mbit/s per receiver (slowest),"), "{h}");
        let h = headline(&report(vec![rx("a", 0.0, false)]));
        assert!(h.contains("to 1 receiver by"), "{h}");
        assert!(h.contains("no receiver got a verified copy"), "{h}");
    }
}
