//! The `bulkcast` command.

mod agent_config;
mod agent_feeds;
mod demo;
mod edges;
mod feed;
mod feed_sources;
mod hostlist;
mod keygen;
mod metrics;
#[cfg(feature = "otel")]
mod otel;
mod outcome;
mod pipe;
mod plan;
mod progress;
mod report;
mod send;
mod send_mcast;
mod ssh;
mod web;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::node::NodeConfig;
use bulkcast_runtime::agent::AgentConfig;
use bulkcast_runtime::direct::CopyIo;
use bulkcast_runtime::store::{Partials, Target};
use bulkcast_runtime::ticket::{self, Ticket};
use bulkcast_runtime::transport::{self, TcpTuning};
use clap::{Args, Parser, Subcommand};

/// Move large data from one source to many hosts, fast, through pipelined relay trees.
#[derive(Parser)]
#[command(version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a local demo: a source and several receivers on loopback, a generated file pushed
    /// through a relay tree, every copy verified.
    Demo(demo::DemoArgs),
    /// Push a file, a directory or stdin (`-`) to agents (`--to`) or to receivers that join with
    /// a ticket (`--expect`).
    Send(Box<send::SendArgs>),
    /// Receive a session by ticket.
    Recv(RecvArgs),
    /// Point-to-point streaming of a pipe over parallel connections and paths:
    /// `tar c dir | bulkcast pipe send HOST:PORT` and `bulkcast pipe recv | tar x`.
    Pipe {
        #[command(subcommand)]
        cmd: pipe::PipeCmd,
    },
    /// Run the receiving daemon on a host.
    Agent(AgentArgs),
    /// Product feeds: a source with a queue (`serve`), `insert`, `subscribe`, `status`.
    Feed {
        #[command(subcommand)]
        cmd: feed::FeedCmd,
    },
    /// Measure the network (or read a matrix) and print the overlay plan, its predicted rate
    /// and the best possible rate; write it as DOT and SVG.
    Plan(plan::PlanArgs),
    /// Plot a finished send from its `--json` report: each receiver's progress, each edge's
    /// rate over time (smoothed) and on average, and for swarms the WAN bytes into each site.
    Report(report::ReportArgs),
    /// Print shell completions for bash, zsh, fish, elvish or powershell on stdout.
    Completions { shell: clap_complete::Shell },
    /// Print the man page (roff) on stdout, or write one per command into `--dir`.
    Man {
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print a new random session secret (64 hex digits) for agents and senders to share.
    Secret,
    /// Make this host's key pair: writes the secret key to FILE (mode 0600, never
    /// overwritten) and prints the public key for the other hosts' allow lists.
    Keygen {
        /// Where to write the secret key.
        file: PathBuf,
    },
}

/// Options shared by every command that takes part in a session.
#[derive(Args, Clone)]
pub struct Common {
    /// File holding the session secret (64 hex digits). Default: $BULKCAST_SECRET.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// This host's key file (`bulkcast keygen`): with --allow-keys, every connection also proves
    /// each end's host key, and only peers on the allow list are admitted.
    #[arg(long, env = "BULKCAST_KEY", requires = "allow_keys")]
    key: Option<PathBuf>,
    /// Allow list: the public keys (one per line, optionally followed by a name) of the hosts
    /// this one talks to. Removing a line revokes that host at its next connection; an agent
    /// rereads the file on SIGHUP (`kill -HUP`), without a restart.
    #[arg(long, env = "BULKCAST_ALLOW_KEYS", requires = "key")]
    allow_keys: Option<PathBuf>,
    /// Agree to run connections unencrypted, for trusted networks: a connection is left in
    /// plaintext only when both of its ends give this. Admission and chunk integrity are
    /// checked either way.
    #[arg(long, env = "BULKCAST_PLAINTEXT")]
    plaintext: bool,
    /// Memory for chunk buffers per session, in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(4..=65536))]
    budget_mib: u64,
    /// TCP congestion control for data this process sends: auto (tree edges start on bbr and
    /// move to cubic once the path shows no random loss, back to bbr if it appears; everything
    /// else runs bbr), bbr, cubic, or system.
    #[arg(long, default_value = "auto")]
    cc: String,
    /// Socket buffer size in bytes (default: kernel autotuning).
    #[arg(long)]
    sockbuf: Option<u32>,
    /// Transport of the connections this process makes: tcp; udp (bulkcast's paced UDP
    /// transport, which keeps its rate under random loss); or auto (tcp where the handshake
    /// takes under 2 ms, a LAN or loopback; udp elsewhere, and tcp where UDP gets no answer
    /// within 3 s). Receivers accept both. Default: auto for `pipe send`, tcp
    /// elsewhere.
    #[arg(long, value_enum)]
    transport: Option<TransportArg>,
}

/// `--transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// TCP with the chosen congestion control.
    Tcp,
    /// The paced UDP transport.
    Udp,
    /// udp, falling back to tcp.
    Auto,
}

impl TransportArg {
    fn transport(self) -> transport::Transport {
        match self {
            TransportArg::Tcp => transport::Transport::Tcp,
            TransportArg::Udp => transport::Transport::Paced,
            TransportArg::Auto => transport::Transport::Auto,
        }
    }
}

impl Common {
    fn secret(&self) -> Result<Option<Secret>> {
        let text = match &self.secret_file {
            Some(p) => std::fs::read_to_string(p)
                .with_context(|| format!("reading secret file {}", p.display()))?,
            None => match std::env::var("BULKCAST_SECRET") {
                Ok(s) => s,
                Err(_) => return Ok(None),
            },
        };
        Ok(Some(
            Secret::from_hex(&text).context("invalid session secret")?,
        ))
    }

    /// The keys of a session under `secret`, with this host's key, allow list and
    /// `--plaintext`.
    fn keys(&self, secret: &Secret) -> Result<Keys> {
        let keys = Keys::derive(secret).with_plaintext(self.plaintext);
        let (Some(key), Some(allow)) = (&self.key, &self.allow_keys) else {
            return Ok(keys);
        };
        let identity = keygen::load(key, allow)?;
        Ok(keys.with_identity(identity))
    }

    fn require_secret(&self) -> Result<Secret> {
        self.secret()?.context(
            "no session secret: set BULKCAST_SECRET or pass --secret-file (make one with `bulkcast secret`)",
        )
    }

    /// The transport options, with `default` where `--transport` was not given.
    fn tuning_or(&self, default: TransportArg) -> Result<TcpTuning> {
        let mut t = self.tuning()?;
        t.transport = self.transport.unwrap_or(default).transport();
        Ok(t)
    }

    fn tuning(&self) -> Result<TcpTuning> {
        let cc = match self.cc.as_str() {
            "auto" => transport::default_cc(),
            "system" => String::new(),
            "bbr" | "cubic" | "reno" => self.cc.clone(),
            other => bail!("unknown congestion control {other:?} (bbr, cubic, reno, system, auto)"),
        };
        Ok(TcpTuning {
            cc,
            sockbuf: self.sockbuf,
            transport: self.transport.unwrap_or(TransportArg::Tcp).transport(),
        })
    }

    /// An agent's settings with these options.
    fn agent_config(
        &self,
        dir: PathBuf,
        secret: &Secret,
        tuning: TcpTuning,
        stdout: bool,
    ) -> Result<AgentConfig> {
        let mut cfg = AgentConfig::new(dir, self.keys(secret)?);
        cfg.node = self.node();
        cfg.tuning = tuning;
        cfg.stdout = stdout;
        Ok(cfg)
    }

    fn node(&self) -> NodeConfig {
        NodeConfig {
            buffer_budget: (self.budget_mib << 20) as usize,
            tamper_every: tamper_every(),
            tamper_repairs: tamper_repairs(),
            ..NodeConfig::default()
        }
    }
}

/// Fault injection for `bench/faults` only: in a build with the `fault-injection` feature,
/// `BULKCAST_FAULT_TAMPER_EVERY=N` makes this process flip a byte of every N-th chunk it
/// relays (the first time), as a relay that tampers would. Release builds without the feature
/// ignore the variable.
#[cfg(feature = "fault-injection")]
fn tamper_every() -> u64 {
    let n = std::env::var("BULKCAST_FAULT_TAMPER_EVERY").ok();
    let n = n.and_then(|v| v.parse().ok()).unwrap_or(0);
    if n > 0 {
        tracing::warn!("fault injection: tampering with every {n}th chunk relayed");
    }
    n
}

#[cfg(not(feature = "fault-injection"))]
fn tamper_every() -> u64 {
    0
}

/// With `BULKCAST_FAULT_TAMPER_EVERY`: `BULKCAST_FAULT_TAMPER_REPAIRS=1` flips every copy of
/// those chunks, repairs too, as a relay that keeps corrupting would (its parent cuts it off).
#[cfg(feature = "fault-injection")]
fn tamper_repairs() -> bool {
    std::env::var("BULKCAST_FAULT_TAMPER_REPAIRS").is_ok_and(|v| v == "1")
}

#[cfg(not(feature = "fault-injection"))]
fn tamper_repairs() -> bool {
    false
}

#[derive(Args)]
struct AgentArgs {
    /// Settings from a TOML file (listen, dir, secret_file, metrics, direct_io,
    /// `[limits]` budget_mib) and feed subscriptions (`[[feed]]` tables: source, feedtype,
    /// dir, ...; SIGHUP rereads them); a setting may not be given both there and as a flag.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on; repeat it for several (a host's path addresses). Default:
    /// 0.0.0.0:7400.
    #[arg(long)]
    listen: Vec<String>,
    /// Directory where received objects are stored.
    #[arg(long, required_unless_present = "config")]
    dir: Option<PathBuf>,
    /// Flags given on the command line (to refuse a setting given twice with `--config`).
    #[arg(skip)]
    given: Vec<String>,
    /// Exit after the first session: 0 if its copy is complete and verified, 1 if not
    /// (batch jobs, benchmarks).
    #[arg(long)]
    once: bool,
    /// Write received files with O_DIRECT, past the page cache: less CPU per byte on busy
    /// or memory-starved receivers; the copy is then not cached for whoever reads it next.
    #[arg(long)]
    direct_io: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (chunks received, verified, rejected,
    /// repaired and stored; sessions; the store's queue; TCP retransmissions).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Serve a live page at http://ADDR/ of the sessions this agent is part of: each one's
    /// object, parent, progress and rate while it runs, then its outcome (bytes, time,
    /// average rate, or why it failed).
    #[arg(long, value_name = "ADDR")]
    web: Option<String>,
    /// Remove partial copies of failed sessions (kept to resume them) once untouched for this
    /// many hours.
    #[arg(long, default_value_t = 168)]
    keep_partial_hours: u64,
    /// Also remove the oldest partial copies while together they exceed this many GiB
    /// (default: no limit).
    #[arg(long)]
    keep_partial_gib: Option<u64>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct RecvArgs {
    /// The ticket printed by `bulkcast send --expect`.
    ticket: String,
    /// Store the object at this path.
    #[arg(long, conflicts_with = "stdout")]
    out: Option<PathBuf>,
    /// Write the object to stdout, in order, as it is verified.
    #[arg(long)]
    stdout: bool,
    /// Name to show in the sender's report (default: this host's name).
    #[arg(long)]
    name: Option<String>,
    /// Seconds to wait for the sender to start.
    #[arg(long, default_value_t = 600)]
    wait: u64,
    /// No progress display.
    #[arg(long, short)]
    quiet: bool,
    /// Write the file with O_DIRECT, past the page cache (see `agent --direct-io`).
    #[arg(long)]
    direct_io: bool,
    #[command(flatten)]
    common: Common,
}

fn main() {
    tune_allocator();
    let cli = parse_cli();
    init_logging(&cli.cmd);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(async {
        match run(cli).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                2
            }
        }
    });
    // Drop what is still running (an agent's sessions after Ctrl-C) so every unfinished local
    // copy removes its temporary file before we exit.
    rt.shutdown_timeout(Duration::from_secs(5));
    #[cfg(feature = "otel")]
    otel::shutdown();
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Demo(a) => demo::run(a).await,
        Cmd::Send(a) => send::run(*a).await,
        Cmd::Recv(a) => recv(a).await,
        Cmd::Pipe { cmd } => pipe::run(cmd).await,
        Cmd::Agent(a) => run_agent(a).await,
        Cmd::Feed { cmd } => feed::run(cmd).await,
        Cmd::Plan(a) => plan::run(a).await,
        Cmd::Report(a) => report::run(a),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            // Into memory first: `generate` panics where stdout is closed (`| head`).
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "bulkcast", &mut out);
            std::io::Write::write_all(&mut std::io::stdout(), &out)?;
            Ok(0)
        }
        Cmd::Man { dir } => {
            let cmd = <Cli as clap::CommandFactory>::command();
            match dir {
                Some(d) => {
                    std::fs::create_dir_all(&d)?;
                    clap_mangen::generate_to(cmd, &d)
                        .with_context(|| format!("writing man pages into {}", d.display()))?;
                }
                None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
            }
            Ok(0)
        }
        Cmd::Keygen { file } => {
            println!("{}", keygen::create(&file)?);
            Ok(0)
        }
        Cmd::Secret => {
            println!("{}", Secret::from_bytes(rand::random()).to_hex());
            Ok(0)
        }
    }
}

/// Parses the command line, noting which of an agent's flags were given (not defaulted).
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = Cli::command().get_matches();
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Cmd::Agent(a), Some(m)) = (&mut cli.cmd, matches.subcommand_matches("agent")) {
        a.given = m
            .ids()
            .filter(|id| {
                m.value_source(id.as_str()) == Some(clap::parser::ValueSource::CommandLine)
            })
            .map(|id| id.as_str().to_string())
            .collect();
    }
    cli
}

/// An agent's flags with its `--config` file's settings merged in, and its subscriptions.
fn agent_settings(
    mut a: AgentArgs,
) -> Result<(
    AgentArgs,
    PathBuf,
    Vec<bulkcast_runtime::feed::request::FeedLine>,
)> {
    let mut file = None;
    if let Some(path) = a.config.clone() {
        let mut f = agent_config::AgentFile::read(&path)?;
        agent_config::check_conflicts(&f, &a.given, &path)?;
        a.listen = f.listen.take().unwrap_or(a.listen);
        a.dir = f.dir.take().or(a.dir);
        a.common.secret_file = f.secret_file.take().or(a.common.secret_file);
        a.metrics = f.metrics.take().or(a.metrics);
        a.web = f.web.take().or(a.web);
        a.direct_io = f.direct_io.unwrap_or(a.direct_io);
        a.common.budget_mib = f.limits.budget_mib.unwrap_or(a.common.budget_mib);
        file = Some((f, path));
    }
    if a.listen.is_empty() {
        a.listen.push("0.0.0.0:7400".into());
    }
    let dir = a
        .dir
        .clone()
        .context("no --dir, and the config file gives no `dir`")?;
    let feeds = match &file {
        Some((f, path)) => f
            .feeds(&dir)
            .with_context(|| format!("agent config {}", path.display()))?,
        None => Vec::new(),
    };
    Ok((a, dir, feeds))
}

async fn run_agent(a: AgentArgs) -> Result<i32> {
    let (a, dir, feeds) = agent_settings(a)?;
    let secret = a.common.require_secret()?;
    let tuning = a.common.tuning()?;
    // The library's agent, with this command's settings.
    let mut agent =
        bulkcast_runtime::Agent::with_keys(dir.clone(), a.common.keys(&secret)?).once(a.once);
    for l in &a.listen {
        agent = agent.listen(l);
    }
    let cfg = agent.config_mut();
    cfg.node = a.common.node();
    cfg.tuning = tuning.clone();
    cfg.io = copy_io(a.direct_io);
    cfg.partials = Partials {
        max_age: Duration::from_secs(a.keep_partial_hours.saturating_mul(3600)),
        max_bytes: a.keep_partial_gib.map(|g| g.saturating_mul(1 << 30)),
    };
    let freed = cfg.partials.clean(&cfg.dir);
    let keys = cfg.keys.clone();
    // `kill -HUP` reloads the allow list: revoking a key needs no restart.
    if let (Some(path), Some(id)) = (&a.common.allow_keys, cfg.keys.identity()) {
        keygen::reload_on_hangup(path.clone(), id.allow.clone())?;
    }
    let agent = agent.bind().await.with_context(|| {
        format!(
            "listening on {} and creating {}",
            a.listen.join(", "),
            dir.display()
        )
    })?;
    let addrs: Vec<String> = agent.local_addrs().iter().map(|a| a.to_string()).collect();
    let addrs = addrs.join(", ");
    // The first line of stdout says where we listen (scripts and the demo read it).
    println!(
        "bulkcast agent listening on {addrs}, storing into {}",
        dir.display()
    );
    if freed > 0 {
        tracing::info!("removed {freed} bytes of stale partial copies");
    }
    let _metrics = match &a.metrics {
        Some(addr) => {
            let m = metrics::Endpoint::start(addr).await?;
            println!("bulkcast agent metrics on http://{}/metrics", m.addr);
            Some(m)
        }
        None => None,
    };
    let _web = match &a.web {
        Some(addr) => {
            let shown = dir.display().to_string();
            let page = web::AgentPage::start(addr, agent.sessions(), &addrs, &shown).await?;
            println!("bulkcast agent live page on http://{}/", page.addr);
            Some(page)
        }
        None => None,
    };
    let feeds = agent_feeds::start(
        feeds,
        a.config.clone(),
        &dir,
        (&keys, &secret, &tuning),
        _metrics.as_ref(),
    )
    .await?;
    let r = agent.run(shutdown_signal()).await;
    // Each subscription saves its position: the next start resumes there.
    feeds.stop_all().await;
    match r {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            Ok(1)
        }
        _ => Ok(0),
    }
}

/// Listens on every address given; also returns the bound addresses, comma-separated.
pub async fn listen_all(
    addrs: &[String],
    tuning: &TcpTuning,
) -> Result<(Vec<transport::Listener>, String)> {
    let mut out = Vec::new();
    let mut bound = Vec::new();
    for a in addrs {
        // TCP and the paced UDP transport on the same port: senders pick with --transport.
        let ls = transport::listen_both(a, tuning)
            .await
            .with_context(|| format!("listening on {a}"))?;
        bound.push(ls[0].local_addr()?.to_string());
        out.extend(ls);
    }
    Ok((out, bound.join(", ")))
}
async fn recv(a: RecvArgs) -> Result<i32> {
    let t = Ticket::parse(&a.ticket)?;
    let target = match (&a.out, a.stdout) {
        (_, true) => Target::Stdout,
        (Some(p), false) => Target::Path(p.clone()),
        (None, false) => Target::Dir(std::env::current_dir()?),
    };
    let stored = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // The ticket's one-session key; host keys are for fleets, not tickets.
    let keys = Keys::derive(&t.secret).with_plaintext(a.common.plaintext);
    let mut cfg = AgentConfig::new(PathBuf::from("."), keys);
    cfg.node = a.common.node();
    cfg.tuning = a.common.tuning()?;
    cfg.stored = Some(stored.clone());
    cfg.io = copy_io(a.direct_io);
    let name = a.name.clone().unwrap_or_else(progress::hostname);
    let bar = (!a.quiet).then(|| progress::receiver(&name, stored));
    let r = tokio::select! {
        r = ticket::join(&t, &name, target, &cfg, Duration::from_secs(a.wait)) => r,
        _ = shutdown_signal() => bail!("interrupted"),
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match r {
        Ok(_) => {
            if !a.quiet {
                eprintln!("received and verified");
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(1)
        }
    }
}

/// The log on stderr. An agent is a daemon: its log is its output (`info`, with times). The
/// other commands print their own account (a `send`'s report names every receiver's failure),
/// so by default their log is off and a failure is said once, in that account, not again as a
/// raw log line in the middle of it; `plan` keeps its warnings. `BULKCAST_LOG`
/// (an `EnvFilter`, e.g. `warn` or `info,bulkcast_runtime::swarm=debug`) overrides the default.
fn init_logging(cmd: &Cmd) {
    let (default_level, daemon) = match cmd {
        Cmd::Agent(_) => ("info", true),
        Cmd::Plan(_) => ("warn", false),
        _ => ("off", false),
    };
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_env("BULKCAST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = if daemon {
        fmt.boxed()
    } else {
        // A command's own output has no timestamps; neither do the log lines among it.
        fmt.without_time().with_target(false).boxed()
    };
    let registry = tracing_subscriber::registry().with(fmt.with_filter(filter));
    // Spans go to OpenTelemetry at `info` and above whatever the log shows.
    #[cfg(feature = "otel")]
    let registry = registry
        .with(otel::layer().map(|l| l.with_filter(tracing_subscriber::filter::LevelFilter::INFO)));
    registry.init();
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// How `--direct-io` asks for the copy to be written.
fn copy_io(direct: bool) -> CopyIo {
    if direct {
        CopyIo::Direct
    } else {
        CopyIo::Buffered
    }
}

/// Chunks are megabyte-sized and short-lived. glibc would serve each from a fresh `mmap` (and
/// fault in and zero every page) then unmap it on free; keeping them on the heap lets freed
/// chunk memory be reused at once. Memory stays bounded by the per-session buffer budget.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator thresholds; called before any other thread exists.
    // Kept on libc: mallopt is glibc's, not a system call, so neither nix nor rustix wraps it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20);
    }
}
