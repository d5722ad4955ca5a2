//! `bulkcast send`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostsFile;
use bulkcast_proto::node::CHUNK_SIZE_RANGE;
use bulkcast_runtime::api::{self, Event, Object};
use bulkcast_runtime::input::Input;
use bulkcast_runtime::measure::ProbeCache;
use bulkcast_runtime::metrics::SourceMetrics;
use bulkcast_runtime::report::Report;
use bulkcast_runtime::ticket::Offer;
use bulkcast_runtime::transport;
use clap::{Args, ValueEnum};

use crate::edges::EdgeArgs;
use crate::outcome::exit_code;
pub use crate::outcome::print_report;
use crate::{progress, shutdown_signal, Common};

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
    #[command(flatten)]
    ssh_opts: crate::ssh::SshArgs,
    /// The session secret of `--ssh` agents (set by `run`).
    #[arg(skip)]
    ssh_secret: Option<Secret>,
    /// The hosts file of `--to` as parsed, its `ssh` hosts' addresses filled in (set by `run`).
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
    /// The command's name for the library's choice.
    fn from_planner(s: bulkcast_planner::strategy::Strategy) -> Strategy {
        use bulkcast_planner::strategy::Strategy as P;
        match s {
            P::Auto => Strategy::Auto,
            P::Flat => Strategy::Flat,
            P::Tree => Strategy::Tree,
            P::Balanced => Strategy::Balanced,
            P::Mob => Strategy::Mob,
            P::Swarm => Strategy::Swarm,
            P::Hybrid => Strategy::Hybrid,
            P::Multicast => Strategy::Multicast,
        }
    }

    /// The library's strategy for this one with `--fanout`'s value (multicast's fallback is
    /// the tree).
    fn to_api(self, fanout: Option<u16>) -> api::Strategy {
        let fanout = fanout.map(usize::from);
        match self {
            Strategy::Auto => api::Strategy::Auto { fanout },
            Strategy::Flat => api::Strategy::Flat,
            Strategy::Tree | Strategy::Multicast => fanout
                .map_or(api::Strategy::Planned, |fanout| api::Strategy::Tree {
                    fanout,
                }),
            Strategy::Balanced => api::Strategy::Balanced,
            Strategy::Mob => api::Strategy::Mob,
            Strategy::Swarm => api::Strategy::Swarm,
            Strategy::Hybrid => api::Strategy::Hybrid { fanout },
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
    let object = Object::new(&a.path)
        .named(a.name.as_deref())
        .follow_symlinks(a.follow_symlinks)
        .keep_special_modes(a.keep_special_modes);
    // Opened before any agent is started over ssh: a missing input costs nothing.
    let input = object.open()?;
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
    let metrics = endpoint.as_ref().map(|m| m.source());
    // `auto` is chosen here, where multicast (the command's) is one of the choices.
    let a = match a.strategy {
        Strategy::Auto => {
            let c = api::choose_auto(&file, &input, a.expect.is_some(), a.fanout.is_some());
            for note in c.notes.iter().filter(|_| !a.quiet) {
                eprintln!("{note}");
            }
            SendArgs {
                strategy: Strategy::from_planner(c.strategy),
                ..a
            }
        }
        _ => a,
    };
    if a.fanout.is_some() && matches!(a.strategy, Strategy::Mob | Strategy::Swarm) && !a.quiet {
        eprintln!(
            "note: --fanout is ignored by --strategy {} (no tree)",
            a.strategy.to_api(None).name()
        );
    }
    let (report, page) = if a.strategy == Strategy::Multicast {
        multicast(&a, object, input, file, keys, tuning, metrics).await?
    } else {
        let send = library_send(&a, object, file, keys, tuning, session, metrics)?;
        drive(send.input(input), &a).await?
    };
    if let Some(m) = endpoint.as_mut() {
        m.mark_final();
    }
    print_report(&report, a.json)?;
    if let Some(p) = page {
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
async fn ssh_agents(a: SendArgs) -> Result<(Option<bulkcast_runtime::ssh::Agents>, SendArgs)> {
    let file = match (&a.ssh, &a.to) {
        (Some(list), _) => {
            let targets = bulkcast_runtime::ssh::parse_list(list)?;
            let secret = crate::ssh::secret(&a.common, true)?;
            let agents = crate::ssh::start(&a.ssh_opts, &targets, &secret).await?;
            let to = Some(agents.addrs.join(","));
            let ssh_secret = Some(secret);
            return Ok((
                Some(agents),
                SendArgs {
                    to,
                    ssh_secret,
                    ..a
                },
            ));
        }
        (None, Some(to)) => api::load_hosts(to)?,
        (None, None) => return Ok((None, a)),
    };
    let targets = bulkcast_runtime::ssh::file_targets(&file)?;
    if targets.is_empty() {
        // Kept, so that the file is read and parsed once.
        let a = SendArgs {
            hosts: Some(file),
            ..a
        };
        return Ok((None, a));
    }
    let all_ours = file.hosts.iter().all(|h| h.ssh.is_some());
    let secret = crate::ssh::secret(&a.common, all_ours)?;
    let (agents, file) = crate::ssh::start_for_file(file, &targets, &a.ssh_opts, &secret).await?;
    let a = SendArgs {
        hosts: Some(file),
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
                None => api::load_hosts(to)?,
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
    let (listen, advertise) = (&a.listen, a.advertise.as_deref());
    let offer = Offer::listen(listen, advertise, a.common.plaintext, tuning, session)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let t = offer.ticket().to_string();
    // The ticket goes to stdout alone on its line so scripts can capture it.
    println!("{t}");
    eprintln!("waiting for {n} receivers: bulkcast recv {t}");
    let (file, keys) = tokio::select! {
        r = offer.gather(n, Duration::from_secs(a.join_timeout)) => r,
        _ = shutdown_signal() => bail!("interrupted"),
    };
    if file.hosts.is_empty() {
        bail!("nobody joined within {} s", a.join_timeout);
    }
    if file.hosts.len() < n {
        eprintln!(
            "warning: only {} of {n} receivers joined; sending to them",
            file.hosts.len()
        );
    }
    Ok((file, keys))
}

/// The library's send for these arguments, to `file`'s receivers.
fn library_send(
    a: &SendArgs,
    object: Object,
    file: HostsFile,
    keys: Keys,
    tuning: transport::TcpTuning,
    session: u64,
    metrics: Option<Arc<SourceMetrics>>,
) -> Result<api::Send> {
    let mut send = api::Send::to(file)
        .keys(keys)
        .object(object)
        .strategy(a.strategy.to_api(a.fanout))
        .stall_timeout(Duration::from_secs(a.stall_timeout.max(1)))
        .tuning(tuning)
        .node_config(a.common.node())
        .edges(a.edges.mode()?)
        .retry(a.retry)
        .ticket_receivers(a.expect.is_some())
        .session_id(session);
    if let Some(k) = a.chunk_kib {
        send = send.chunk_size(k * 1024);
    }
    if let Some(o) = a.edges.observer()? {
        send = send.observer(o);
    }
    if let Some(p) = &a.matrix {
        let m = api::read_matrix(p)?;
        send = send.matrix(m, format!("matrix from {}", p.display()));
    }
    // 0: probe before every send. Without a cache directory: likewise.
    let max_age = Duration::from_secs(a.probe_max_age);
    if let Some(c) = (a.probe_max_age > 0)
        .then(|| ProbeCache::in_user_cache(max_age))
        .flatten()
    {
        send = send.probe_cache(c);
    }
    if let Some(m) = metrics {
        send = send.metrics(m);
    }
    Ok(send)
}

/// Runs `send` until it ends or Ctrl-C, showing what it does: its notes (unless `--quiet`),
/// the progress display of each session, and `--web`'s page (returned, to show the report).
async fn drive(send: api::Send, a: &SendArgs) -> Result<(Report, Option<crate::web::Page>)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (abort_tx, abort_rx) = tokio::sync::oneshot::channel::<()>();
    let send = send.on_event(move |e| {
        let _ = tx.send(e.clone());
    });
    let shutdown = async {
        tokio::select! {
            _ = shutdown_signal() => {}
            Ok(()) = abort_rx => {}
        }
    };
    let (r, shown) = tokio::join!(send.run(shutdown), show(rx, a, abort_tx));
    let (page, keeps_verified) = shown?;
    match r {
        Ok(report) => Ok((report, page)),
        Err(api::Error::Interrupted) if keeps_verified => {
            bail!("interrupted: receivers keep what they verified; send again to resume")
        }
        Err(api::Error::Interrupted) => {
            bail!("interrupted: receivers discard their partial copies")
        }
        Err(api::Error::NoReceivers) => {
            bail!("no receiver admitted the source (see the warnings above)")
        }
        Err(e) => Err(e.into()),
    }
}

/// Shows the send's events until it ends; also says whether its last session keeps what
/// receivers verified. A page that cannot start aborts the send.
async fn show(
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    a: &SendArgs,
    abort: tokio::sync::oneshot::Sender<()>,
) -> Result<(Option<crate::web::Page>, bool)> {
    let (mut page, mut display, mut keeps) = (None, None, true);
    let mut abort = Some(abort);
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Started {
                status,
                strategy,
                sites,
                object,
                retry,
                keeps_verified,
                ..
            } => {
                keeps = keeps_verified;
                if let (Some(addr), false, None) = (&a.web, retry, &page) {
                    let p =
                        crate::web::Page::start(addr, status.clone(), sites, &object, &strategy);
                    match p.await {
                        Ok(p) => {
                            eprintln!("live page on http://{}/", p.addr);
                            page = Some(p);
                        }
                        Err(e) => {
                            if let Some(t) = abort.take() {
                                let _ = t.send(());
                            }
                            return Err(e);
                        }
                    }
                }
                if !a.quiet {
                    display = Some(progress::sender(status));
                }
            }
            Event::Ended => stop(&mut display),
            ev => {
                if let (false, Some(note)) = (a.quiet, ev.note()) {
                    eprintln!("{note}");
                }
            }
        }
    }
    stop(&mut display);
    Ok((page, keeps))
}

/// Ends a progress display, leaving no line behind.
fn stop(display: &mut Option<tokio::task::JoinHandle<()>>) {
    if let Some(d) = display.take() {
        d.abort();
        progress::clear();
    }
}

/// `--strategy multicast` to the receivers that admit the source; those the group does not
/// reach get the file by the library's tree, said on one line.
async fn multicast(
    a: &SendArgs,
    object: Object,
    input: Input,
    file: HostsFile,
    keys: Keys,
    tuning: transport::TcpTuning,
    metrics: Option<Arc<SourceMetrics>>,
) -> Result<(Report, Option<crate::web::Page>)> {
    let rx = api::admitted(&file, &keys, &tuning).await;
    for (_, h, _) in rx.left_out.iter().rev().filter(|_| !a.quiet) {
        eprintln!("warning: leaving {} out (the report says why)", h.name);
    }
    if rx.file.hosts.is_empty() {
        bail!("no receiver admitted the source (see the warnings above)");
    }
    let skipped = input.skipped().to_vec();
    let stall = Duration::from_secs(a.stall_timeout.max(1));
    let (mut report, fallback) = crate::send_mcast::send(
        &a.mcast, &a.path, &input, &rx.file, &keys, &tuning, stall, a.quiet,
    )
    .await?;
    crate::send_mcast::note_fallback(&fallback, &rx.file.hosts, a.quiet);
    let mut page = None;
    if !fallback.is_empty() {
        let hosts = HostsFile {
            source: rx.file.source.clone(),
            hosts: fallback
                .iter()
                .map(|f| rx.file.hosts[f.index()].clone())
                .collect(),
        };
        let send = library_send(a, object, hosts, keys, tuning, rand::random(), metrics)?;
        let (tree, p) = drive(send.input(input), a).await?;
        page = p;
        crate::send_mcast::merge_tree(&mut report, tree, fallback.len());
    }
    report.object.skipped = skipped;
    report.leave_out(
        rx.left_out
            .into_iter()
            .map(|(i, h, why)| (i, h.name, h.addr, why)),
    );
    Ok((report, page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::headline;
    use bulkcast_runtime::report::{ObjectReport, ReceiverReport};

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
