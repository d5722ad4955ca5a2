//! `bulkcast send`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_node::input::Input;
use bulkcast_node::report::Report;
use bulkcast_node::source::{self, SendConfig};
use bulkcast_node::ticket::{self, Ticket};
use bulkcast_node::{swarm, transport};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostsFile;
use bulkcast_proto::node::CHUNK_SIZE_RANGE;
use bulkcast_proto::swarm::Strategy as SwarmStrategy;
use bulkcast_proto::tree::Tree;
use clap::{Args, ValueEnum};

use crate::edges::EdgeArgs;
use crate::{plan, progress, shutdown_signal, Common};

#[derive(Args)]
pub struct SendArgs {
    /// File or directory to send, or `-` for stdin.
    path: PathBuf,
    /// Receivers: `host:port,host:port` or a hosts file (TOML).
    #[arg(
        long,
        required_unless_present_any = ["expect", "hostfile"],
        conflicts_with_all = ["expect", "hostfile"]
    )]
    to: Option<String>,
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
    /// `auto_chunk_size`; the hybrid uses `hybrid_chunk_size`).
    #[arg(long)]
    chunk_kib: Option<u32>,
    /// Plan from this matrix file (see `bulkcast plan --save-matrix`) instead of probing.
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// Seconds without progress after which a receiver is cut off (with its subtree).
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
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
    common: Common,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Strategy {
    /// For a file (or a directory of at most 2 GiB) spread over two or more sites of the hosts
    /// file: `hybrid` from `AUTO_HYBRID_MIN_BYTES` (2 MiB), `mob` below; `tree` otherwise (see
    /// `auto_strategy`).
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
}

pub async fn run(a: SendArgs) -> Result<i32> {
    if let Some(k) = a.chunk_kib {
        if !k
            .checked_mul(1024)
            .is_some_and(|c| CHUNK_SIZE_RANGE.contains(&c))
        {
            bail!(
                "--chunk-kib must be between {} and {}",
                CHUNK_SIZE_RANGE.start() / 1024,
                CHUNK_SIZE_RANGE.end() / 1024
            );
        }
    }
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
    let endpoint = match &a.metrics {
        Some(addr) => {
            let m = crate::metrics::Endpoint::start(addr).await?;
            eprintln!("metrics on http://{}/metrics", m.addr);
            Some(m)
        }
        None => None,
    };
    let source_metrics = endpoint.as_ref().map(|m| m.source());
    let session: u64 = rand::random();
    let mut source_spec = None;
    let (hosts, secret) = match (&a.to, a.expect) {
        (Some(to), _) => {
            let file = load_hosts(to)?;
            source_spec = file.source;
            (file.hosts, a.common.require_secret()?)
        }
        (None, Some(n)) => {
            if n == 0 {
                bail!("--expect must be at least 1");
            }
            let secret = a
                .common
                .secret()?
                .unwrap_or_else(|| Secret::from_bytes(rand::random()));
            let keys = Keys::derive(&secret);
            let listener = transport::listen(&a.listen, &tuning)
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
            (hosts, secret)
        }
        (None, None) => bail!("give --to HOSTS or --expect N"),
    };
    let n = hosts.len();
    let a = SendArgs {
        strategy: auto_strategy(&a, &input, source_spec.as_ref(), &hosts),
        ..a
    };
    let planned_chunk = a.chunk_kib.map_or(1 << 20, |k| k * 1024);
    let file = HostsFile {
        source: source_spec.clone(),
        hosts: hosts.clone(),
    };
    // One tree, or several with their rates (balanced).
    if let Some(strategy) = swarm_strategy(a.strategy) {
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
        let tree = match (strategy, a.fanout) {
            (SwarmStrategy::Hybrid, Some(k)) => Some(Tree::kary(n, k as usize)),
            (SwarmStrategy::Hybrid, None) => {
                let p = planned(
                    &a,
                    &file,
                    &secret,
                    &tuning,
                    input.manifest.total_len,
                    planned_chunk,
                    false,
                )
                .await?;
                Some(p.tree().clone())
            }
            _ => None,
        };
        let chunk_size = match a.chunk_kib {
            Some(k) => k * 1024,
            // The hybrid's windows follow each peer's rate, so it can use small pieces;
            // MOB and the swarm baseline keep `R` requests per peer, which small pieces
            // would starve at long round trips.
            None if strategy == SwarmStrategy::Hybrid => {
                hybrid_chunk_size(input.manifest.total_len)
            }
            None => auto_chunk_size(input.manifest.total_len, &Tree::flat(n)),
        };
        let cfg = swarm::SwarmSendConfig {
            strategy,
            chunk_size,
            stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
            tuning,
            seed: rand::random(),
        };
        // Without a tree every receiver hangs off the source, as in a flat tree.
        let flat = Tree::flat(n);
        let status = source::new_status(
            &hosts,
            tree.as_ref().unwrap_or(&flat),
            chunk_size,
            input.manifest.total_len,
        );
        let page = live_page(&a, &status, &hosts, &input, strategy.name()).await?;
        let work = swarm::send(
            input,
            source_spec.as_ref(),
            &hosts,
            tree.as_ref(),
            Keys::derive(&secret),
            session,
            &cfg,
            status.clone(),
        );
        let Some((result, timeline)) =
            progress::sending(status.clone(), a.quiet, source_metrics.clone(), work).await
        else {
            bail!("interrupted: receivers discard their partial copies");
        };
        let mut report = result.map_err(anyhow::Error::msg)?;
        report.object.skipped = skipped;
        report.timeline = timeline;
        print_report(&report, a.json)?;
        finish_page(page, &report).await?;
        if let Some(m) = endpoint {
            m.linger(Duration::from_secs(a.metrics_linger)).await;
        }
        return Ok(exit_code(&report));
    }
    let (trees, strategy): (Vec<(Tree, f64)>, String) = match (a.strategy, a.fanout) {
        (Strategy::Flat, _) => (vec![(Tree::flat(n), 0.0)], "flat".to_string()),
        (Strategy::Tree, Some(k)) => (
            vec![(Tree::kary(n, k as usize), 0.0)],
            format!("tree (fan-out {k})"),
        ),
        // Ticket receivers take only their parent's connection, so they cannot be probed.
        (_, None) if a.expect.is_some() => {
            (vec![(Tree::kary(n, 1), 0.0)], "tree (chain)".to_string())
        }
        (strategy, _) => {
            let balanced = strategy == Strategy::Balanced;
            let p = planned(
                &a,
                &file,
                &secret,
                &tuning,
                input.manifest.total_len,
                planned_chunk,
                balanced,
            )
            .await?;
            if balanced {
                (p.trees, "balanced".to_string())
            } else {
                (
                    vec![(p.tree().clone(), p.rate_mbps)],
                    format!("tree (planned: {})", p.algorithm),
                )
            }
        }
    };
    // The deepest tree sets the chunk size.
    let tree = trees
        .iter()
        .map(|t| &t.0)
        .max_by_key(|t| (1..t.len()).map(|i| t.depth(i)).max().unwrap_or(0))
        .expect("at least one tree")
        .clone();
    let chunk_size = match a.chunk_kib {
        Some(k) => k * 1024,
        None => auto_chunk_size(input.manifest.total_len, &tree),
    };
    let cfg = SendConfig {
        edges: a
            .edges
            .mode()?
            .for_session(&tuning.cc, hosts.iter().any(|h| !h.paths.is_empty())),
        observer: a.edges.observer()?,
        chunk_size,
        stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
        node: a.common.node(),
        tuning,
        strategy,
        uplink_mbps: source_spec.as_ref().and_then(|s| s.uplink_mbps),
    };
    let status = source::new_status(&hosts, &tree, chunk_size, input.manifest.total_len);
    let page = live_page(&a, &status, &hosts, &input, &cfg.strategy).await?;
    let work = async {
        if trees.len() > 1 {
            source::send_balanced(
                input,
                &hosts,
                &trees,
                Keys::derive(&secret),
                &cfg,
                status.clone(),
            )
            .await
        } else {
            source::send(
                input,
                &hosts,
                &trees[0].0,
                Keys::derive(&secret),
                session,
                &cfg,
                status.clone(),
            )
            .await
        }
    };
    let Some((result, timeline)) =
        progress::sending(status.clone(), a.quiet, source_metrics.clone(), work).await
    else {
        bail!("interrupted: receivers discard their partial copies");
    };
    let mut report = result?;
    report.object.skipped = skipped;
    report.timeline = timeline;
    print_report(&report, a.json)?;
    finish_page(page, &report).await?;
    if let Some(m) = endpoint {
        m.linger(Duration::from_secs(a.metrics_linger)).await;
    }
    Ok(exit_code(&report))
}

/// Starts `--web`'s page, if asked for.
async fn live_page(
    a: &SendArgs,
    status: &source::SharedStatus,
    hosts: &[bulkcast_proto::hosts::HostSpec],
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

/// Shows the report on the live page and gives open pages a moment to get it.
async fn finish_page(page: Option<crate::web::Page>, report: &Report) -> Result<()> {
    if let Some(p) = page {
        p.finish(serde_json::to_string(report)?, Duration::from_secs(3))
            .await;
    }
    Ok(())
}

/// 0 when every receiver has all of the object, 1 when some receiver failed, 3 when every
/// receiver has what was sent but the directory had entries that were left out: a script
/// that needs every entry must not take that for a full copy.
fn exit_code(r: &Report) -> i32 {
    match (r.ok, r.object.skipped.is_empty()) {
        (false, _) => 1,
        (true, false) => 3,
        (true, true) => 0,
    }
}

/// Probes (or reads `--matrix`) and plans, saying what it did unless `--quiet`.
async fn planned(
    a: &SendArgs,
    file: &HostsFile,
    secret: &Secret,
    tuning: &transport::TcpTuning,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<bulkcast_planner::Plan> {
    let (p, note) = plan::for_send(
        file,
        a.matrix.as_deref(),
        &Keys::derive(secret),
        tuning,
        size,
        chunk,
        balanced,
    )
    .await?;
    if !a.quiet {
        eprintln!("{note}\nplan: {} ({})", p.algorithm, p.reason);
    }
    Ok(p)
}

/// The swarm strategy behind a `--strategy` value, if it is one.
fn swarm_strategy(s: Strategy) -> Option<SwarmStrategy> {
    match s {
        Strategy::Mob => Some(SwarmStrategy::Mob),
        Strategy::Swarm => Some(SwarmStrategy::Swarm),
        Strategy::Hybrid => Some(SwarmStrategy::Hybrid),
        Strategy::Auto | Strategy::Flat | Strategy::Tree | Strategy::Balanced => None,
    }
}

/// Smallest object `--strategy auto` sends by `hybrid` rather than `mob` across sites. In the
/// lab's size sweep (docs/notes/swarm-size-sweep.md, re-run 2026-11-23 with the hybrid's small
/// pieces, three runs at 512 KiB and 4 MiB; the current sweep is in docs/benchmarks.md) MOB
/// was ahead of the hybrid at 512 KiB in 5 of 6 runs, with one copy per site against the
/// hybrid's 1.4-1.75 (its endgame doubles requests when a few pieces are all there is); from
/// 4 MiB the hybrid was ahead at 20 ms (3 of 3) and level at 100 ms. The push tree was behind
/// both at every size from 32 KiB: a tree connects level by level, a WAN round trip per hop,
/// where a swarm dials every member at once.
pub const AUTO_HYBRID_MIN_BYTES: u64 = 2 << 20;

/// What `--strategy auto` means for this send: a swarm where swarming pays (an object of known,
/// non-zero length, a file or a small enough directory, hosts in two or more sites, receivers
/// that can reach each other: not ticket mode, no `--fanout`): `hybrid` from
/// [`AUTO_HYBRID_MIN_BYTES`], `mob` below; `tree` otherwise. Any other strategy is kept.
fn auto_strategy(
    a: &SendArgs,
    input: &Input,
    source: Option<&bulkcast_proto::hosts::SourceSpec>,
    hosts: &[bulkcast_proto::hosts::HostSpec],
) -> Strategy {
    if a.strategy != Strategy::Auto {
        return a.strategy;
    }
    let m = &input.manifest;
    let sites: std::collections::BTreeSet<&str> = hosts
        .iter()
        .filter_map(|h| h.site.as_deref())
        .chain(source.and_then(|s| s.site.as_deref()))
        .collect();
    let swarm = a.expect.is_none()
        && a.fanout.is_none()
        && sites.len() >= 2
        && m.total_len.is_some_and(|l| {
            l > 0 && (input.single_file().is_some() || l <= swarm::MAX_SWARM_BYTES)
        });
    let chosen = match m.total_len {
        Some(l) if swarm && l >= AUTO_HYBRID_MIN_BYTES => Strategy::Hybrid,
        _ if swarm => Strategy::Mob,
        _ => Strategy::Tree,
    };
    if !a.quiet {
        eprintln!(
            "strategy auto: {} ({}, {})",
            swarm_strategy(chosen).map_or("tree", SwarmStrategy::name),
            match sites.len() {
                0 => "no sites given".to_string(),
                1 => "one site".to_string(),
                n => format!("{n} sites"),
            },
            m.total_len
                .map_or("unknown length".to_string(), |l| format!("{} MiB", l >> 20))
        );
    }
    chosen
}

/// The default chunk size. Every relay forwards a chunk only once it is whole and verified, so
/// each hop adds one chunk's serialization time: a tree of depth d costs about
/// `d * chunk / size` of the transfer time. Pick the largest power of two that keeps that under
/// 1%, between 64 KiB (per-chunk costs) and 1 MiB; streams of unknown size get 256 KiB.
pub fn auto_chunk_size(len: Option<u64>, tree: &Tree) -> u32 {
    const MIN: u64 = 64 << 10;
    const MAX: u64 = 1 << 20;
    let Some(len) = len else { return 256 << 10 };
    let depth = (1..tree.len())
        .map(|i| tree.depth(i))
        .max()
        .unwrap_or(1)
        .max(1) as u64;
    let target = (len / 100 / depth).clamp(MIN, MAX);
    // Round down to a power of two.
    (1u64 << (63 - target.leading_zeros())) as u32
}

/// The default chunk (piece) size of the hybrid. Pulls work in whole pieces: a
/// request window is a few pieces deep at least, so a cluster's last pieces queued behind a
/// thin WAN link wait about `window * piece / link rate` (three 1 MiB pieces are 4 s at
/// 6.4 Mbit/s). In the seed 004 simulation (`swarm_sim --lab`, 600 MB, slow links) the hybrid
/// reads 0.87 of the bound with 1 MiB pieces, 0.90 with 512 KiB and 0.93 with 256 KiB.
/// So: about a thousandth of the object, a power of two between 64 KiB (per-piece costs) and
/// 256 KiB; 256 KiB when the size is unknown.
pub fn hybrid_chunk_size(len: Option<u64>) -> u32 {
    const MIN: u64 = 64 << 10;
    const MAX: u64 = 256 << 10;
    let target = len.map_or(MAX, |l| (l / 1000).clamp(MIN, MAX));
    (1u64 << (63 - target.leading_zeros())) as u32
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

pub fn print_report(r: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    }
    eprintln!("{}", headline(r));
    let failed: Vec<_> = r.receivers.iter().filter(|x| !x.verified).collect();
    if !json {
        for c in &r.clusters {
            eprintln!(
                "  site {:<18} {:>2} receivers{}: {:>12} WAN bytes in ({:.2} copies)",
                c.site,
                c.receivers,
                if c.has_source { " + source" } else { "" },
                c.wan_bytes_in,
                c.copies
            );
        }
    }
    if !failed.is_empty() || !json {
        eprintln!(
            "  {:<24} {:<16} {:>12} {:>8} {:>10}  status",
            "receiver", "parent", "bytes", "seconds", "Mbit/s"
        );
        for x in &r.receivers {
            eprintln!(
                "  {:<24} {:<16} {:>12} {:>8.2} {:>10.1}  {}",
                x.name,
                x.parent,
                x.bytes,
                x.seconds,
                x.rate_mbps,
                if x.verified {
                    "verified".to_string()
                } else {
                    format!("FAILED: {}", x.error.as_deref().unwrap_or("?"))
                }
            );
        }
    }
    for x in &r.object.skipped {
        eprintln!("  not sent: {}: {}", x.path, x.reason);
    }
    if !r.object.skipped.is_empty() {
        eprintln!(
            "{} entries of the directory were left out (listed above); the rest arrived",
            r.object.skipped.len()
        );
    }
    if !failed.is_empty() {
        eprintln!(
            "{} of {} receivers did not get a verified copy",
            failed.len(),
            r.receivers.len()
        );
    }
    Ok(())
}

/// The report's first line. The per-receiver rate is the slowest of the receivers that got
/// a verified copy: a failed receiver's rate says nothing about how fast the data moved, and
/// it is counted on its own.
pub fn headline(r: &Report) -> String {
    let verified: Vec<_> = r.receivers.iter().filter(|x| x.verified).collect();
    let per_receiver = match verified.iter().map(|x| x.rate_mbps).min_by(f64::total_cmp) {
        Some(slowest) if verified.len() == r.receivers.len() => {
            format!("{slowest:.1} Mbit/s per receiver (slowest)")
        }
        Some(slowest) => format!(
            "{slowest:.1} Mbit/s per receiver (slowest of the {} verified; {} failed)",
            verified.len(),
            r.receivers.len() - verified.len()
        ),
        None => "no receiver got a verified copy".to_string(),
    };
    format!(
        "{} {} ({}) to {} receiver{} by {} in {:.2} s: {per_receiver}, {:.1} Mbit/s aggregate",
        r.object.kind,
        r.object.name,
        progress::human_bytes(r.object.bytes),
        r.receivers.len(),
        if r.receivers.len() == 1 { "" } else { "s" },
        r.strategy,
        r.seconds,
        r.aggregate_mbps
    )
}

#[cfg(test)]
mod tests {
    use super::*;
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
            seconds: 1.0,
            ok: receivers.iter().all(|r| r.verified),
            aggregate_mbps: 1.0,
            receivers,
            edges: Vec::new(),
            clusters: Vec::new(),
            timeline: Default::default(),
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

    #[test]
    fn hybrid_pieces_are_a_thousandth_of_the_object_between_64_and_256_kib() {
        assert_eq!(hybrid_chunk_size(Some(600 << 20)), 256 << 10);
        assert_eq!(hybrid_chunk_size(Some(128 << 20)), 128 << 10);
        assert_eq!(hybrid_chunk_size(Some(32 << 20)), 64 << 10);
        assert_eq!(hybrid_chunk_size(Some(32 << 10)), 64 << 10);
        assert_eq!(hybrid_chunk_size(None), 256 << 10);
    }
}
