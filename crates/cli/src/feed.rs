//! `bulkcast feed`: product feeds (serve, insert, subscribe, status).

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::fec::{DEFAULT_K, DEFAULT_M};
use bulkcast_proto::feed::msg::Start;
use bulkcast_proto::feed::product::{AllowRule, HostPattern, ProductAuth, SecretAuth, SignedAuth};
use bulkcast_proto::feed::push::PushConfig;
use bulkcast_proto::feed::queue::QueueLimits;
use bulkcast_proto::feed::receiver::ReceiverConfig;
use bulkcast_proto::feed::relay::PARENT_STALL;
use bulkcast_proto::feed::server::ServerConfig;
use bulkcast_runtime::feed::client::{self, Report, SubError, SubscribeConfig};
use bulkcast_runtime::feed::ingest::Target;
use bulkcast_runtime::feed::metrics::SubscribeMetrics;
use bulkcast_runtime::feed::relay::UpstreamConfig;
use bulkcast_runtime::feed::serve::{self, ServeConfig};
use bulkcast_runtime::feed::DEFAULT_PORT;
use clap::{Args, Subcommand};
use serde_json::json;

use crate::Common;

/// `bulkcast feed ...`.
#[derive(Subcommand)]
pub enum FeedCmd {
    /// Run a feed source: a product queue on disk, subscribers over TCP, optionally an IP
    /// multicast group with unicast repair.
    Serve(ServeArgs),
    /// Queue files as products on the local feed source: the files given, every complete
    /// file that appears in a watched directory (--watch), or framed products on stdin
    /// (--stdin).
    Insert(InsertArgs),
    /// Receive every matching product as a verified file (or run a command per product).
    Subscribe(SubscribeArgs),
    /// Show a source's queue and subscribers (with their lag).
    Status(StatusArgs),
}

/// `feed serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Directory of the product queue (kept across restarts).
    #[arg(long)]
    dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value_t = format!("0.0.0.0:{DEFAULT_PORT}"))]
    listen: String,
    /// Queue size bound, MiB: inserting past it evicts the oldest products.
    #[arg(long, default_value_t = 1024)]
    queue_mib: u64,
    /// Queue age bound, seconds.
    #[arg(long, default_value_t = 3600)]
    max_age: u64,
    /// Who may subscribe to what, `HOST=FEEDTYPES` (HOST: *, an address or a CIDR block;
    /// FEEDTYPES like NEXRAD3|IDS or ANY); repeatable. Default: this host only.
    #[arg(long)]
    allow: Vec<String>,
    /// Push products to this IPv4 multicast group (`ADDR:PORT`) for subscribers that can
    /// take it; missing pieces are repaired over their TCP connection.
    #[arg(long)]
    multicast: Option<String>,
    /// Multicast rate, Mbit/s, counting every byte a datagram takes on an Ethernet LAN (its
    /// headers from Ethernet's up): set it a little under the slowest link to the subscribers.
    #[arg(long, default_value_t = 100.0)]
    rate_mbps: f64,
    /// Product bytes per multicast datagram (keep datagrams under the LAN's MTU; the
    /// default fills a 1500-byte Ethernet frame).
    #[arg(long, default_value_t = bulkcast_proto::feed::seal::LAN_BLOCK, value_parser = clap::value_parser!(u32).range(256..=65000))]
    block: u32,
    /// Multicast repair: symbols per block of the parity code (any this many of a block's
    /// symbols rebuild it; the group carries the worst subscriber's loss per block); 0
    /// repairs by unicast from the source only, LDM7's way.
    #[arg(long, default_value_t = DEFAULT_K, value_parser = clap::value_parser!(u32).range(0..=32768))]
    parity_k: u32,
    /// Interface address multicast leaves from.
    #[arg(long)]
    multicast_if: Option<Ipv4Addr>,
    /// Multicast TTL.
    #[arg(long, default_value_t = 1)]
    ttl: u32,
    /// Accept inserts from other hosts holding the secret (default: loopback only).
    #[arg(long)]
    remote_insert: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics: products inserted, removed and sent,
    /// bytes sent by unicast and multicast, the queue's depth, each subscriber's backlog.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Relay: take products from this upstream feed server (`HOST:PORT`: the source, or
    /// another relay) instead of local inserts, keeping the source's sequence numbers and
    /// tags, and serve them to this site (unicast, or --multicast into its LAN). The relay
    /// joins the relay tree below it: it asks it and the relays below it for room, measures
    /// the round trip to each, and subscribes to the nearest (the source itself unless a
    /// relay is under half its round trip); a parent that stays unreachable is left for
    /// another, from the same position.
    #[arg(long, value_name = "HOST:PORT")]
    upstream: Option<String>,
    /// Relay: subscribe to --upstream itself, never below another relay (a chain by hand).
    #[arg(long, requires = "upstream")]
    upstream_fixed: bool,
    /// Relay: the address other relays reach this one at (default: --listen). Its upstream
    /// lists this relay at the IP it connects from, with this port: a subscriber cannot
    /// point joining relays at another host.
    #[arg(long, requires = "upstream", value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Relay children this server takes at most (the source too): joining relays go below
    /// one of them past it. At most 256 (what a server's answer to a joiner lists).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=256))]
    max_relay_children: u32,
    /// Who may be a relay below this server (the source too): a subscriber that announces
    /// itself as a relay is listed for joining relays to choose as their parent only if its
    /// host matches (*, an address or a CIDR block, as in --allow); others are served as
    /// plain subscribers and counted in `feed status` (relays_refused). Repeatable. Default:
    /// any subscriber --allow admits may be a relay.
    #[arg(long, value_name = "PATTERN")]
    allow_relay: Vec<String>,
    /// Relay: leave a parent (not --upstream itself) that sends nothing for this long while
    /// the source has newer products (asked from the source), and join again without it;
    /// multiplied by the relays between this one and the source, so the one nearest the
    /// silent relay leaves first. 0: never.
    #[arg(long, requires = "upstream", default_value_t = PARENT_STALL / 1_000_000, value_name = "SECS")]
    parent_stall_secs: u64,
    /// Relay: feedtypes taken from upstream (NEXRAD3|IDS, NEXRAD*, ANY).
    #[arg(long, requires = "upstream", default_value = "ANY")]
    feedtype: String,
    /// Relay: only products whose name matches this regex.
    #[arg(long, requires = "upstream", default_value = "")]
    name: String,
    /// Relay: where a new relay starts upstream (`123`, `@UNIX_SECONDS`, `-10m`, `now`);
    /// a relay that relayed before resumes after the newest product it queued.
    #[arg(long, requires = "upstream")]
    upstream_from: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// `feed insert`.
#[derive(Args)]
pub struct InsertArgs {
    /// The files.
    #[arg(required_unless_present_any = ["watch", "stdin"])]
    files: Vec<PathBuf>,
    /// Their feedtype.
    #[arg(long)]
    feedtype: String,
    /// Product name (one file only; default: the file's name).
    #[arg(long)]
    name: Option<String>,
    /// The feed source.
    #[arg(long, default_value_t = format!("127.0.0.1:{DEFAULT_PORT}"))]
    server: String,
    #[command(flatten)]
    sources: SourceArgs,
    #[command(flatten)]
    common: Common,
}

/// `feed insert --watch` and `--stdin`.
#[derive(Args)]
pub struct SourceArgs {
    /// Run until killed, inserting every complete file that appears in DIR once (also
    /// across restarts): dotfiles, *.tmp and *.part are ignored, so write `name.tmp` and
    /// rename it into place, or write in place without pausing longer than --settle.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["files", "name", "stdin"])]
    pub(crate) watch: Option<PathBuf>,
    /// With --watch: seconds without writes after which a file is complete.
    #[arg(long, default_value_t = 1.0, requires = "watch")]
    pub(crate) settle: f64,
    /// With --watch: delete each file once inserted (default: leave it, recorded in the
    /// state file).
    #[arg(long, requires = "watch", conflicts_with = "move_to")]
    pub(crate) remove: bool,
    /// With --watch: move each file into this directory once inserted (same filesystem).
    #[arg(long, value_name = "DIR", requires = "watch")]
    pub(crate) move_to: Option<PathBuf>,
    /// With --watch: the file that remembers what was inserted (default:
    /// DIR/.bulkcast-watch-state).
    #[arg(long, value_name = "FILE", requires = "watch")]
    pub(crate) state: Option<PathBuf>,
    /// Read framed products from stdin until its end: for each, a line `NAME SIZE` then
    /// SIZE bytes (e.g. `printf '%s %d\n' "$n" "$(stat -c %s "$f")"; cat "$f"`).
    #[arg(long, conflicts_with_all = ["files", "name"])]
    pub(crate) stdin: bool,
}

/// `feed subscribe`.
#[derive(Args)]
pub struct SubscribeArgs {
    /// The feed source, `HOST:PORT`.
    source: String,
    /// Feedtypes wanted: NEXRAD3|IDS, NEXRAD*, ANY.
    #[arg(long)]
    feedtype: String,
    /// Only products whose name matches this regex.
    #[arg(long, default_value = "")]
    name: String,
    /// Directory products are written to.
    #[arg(long)]
    dir: PathBuf,
    /// Run `sh -c CMD` per product, the file's path as $1 (and BULKCAST_PRODUCT,
    /// BULKCAST_SEQ, BULKCAST_FEEDTYPE, BULKCAST_NAME in the environment).
    #[arg(long)]
    exec: Option<String>,
    /// Start at a sequence number (`123`), a time (`@UNIX_SECONDS`, or `-10m` ago), or `now`.
    /// Default: where the last run into --dir stopped, else now.
    #[arg(long)]
    from: Option<String>,
    /// Never take multicast.
    #[arg(long)]
    unicast: bool,
    /// Interface address to join the multicast group on.
    #[arg(long)]
    iface: Option<Ipv4Addr>,
    /// Seconds without any multicast datagram before falling back to unicast.
    #[arg(long, default_value_t = 3.0)]
    fallback_after: f64,
    /// JSON lines on stdout: one per product (latency split, transport), loss, fallback.
    #[arg(long)]
    json: bool,
    /// Exit after this many products.
    #[arg(long)]
    max_products: Option<u64>,
    /// Exit after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Serve Prometheus metrics at http://ADDR/metrics: products and bytes received by
    /// transport, repaired bytes, products lost, fall-backs, reconnections, latency.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// `feed status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The feed source.
    #[arg(long, default_value_t = format!("127.0.0.1:{DEFAULT_PORT}"))]
    server: String,
    /// Print the JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: Common,
}

/// Runs a feed command.
pub async fn run(cmd: FeedCmd) -> Result<i32> {
    match cmd {
        FeedCmd::Serve(a) => run_serve(a).await,
        FeedCmd::Insert(a) => run_insert(a).await,
        FeedCmd::Subscribe(a) => run_subscribe(a).await,
        FeedCmd::Status(a) => run_status(a).await,
    }
}

fn auth(c: &Common) -> Result<(Keys, Arc<dyn ProductAuth>)> {
    let secret = c.require_secret()?;
    // With --key/--allow-keys, connections admit only listed keys and products are signed by
    // the source's key (subscribers take them only from a key allowed to push); otherwise the
    // secret's MAC. Connections and the group are encrypted unless --plaintext (both ends).
    let keys = c.keys(&secret)?;
    let auth: Arc<dyn ProductAuth> = match keys.identity() {
        Some(id) => Arc::new(SignedAuth::new(id.clone())),
        None => Arc::new(SecretAuth::new(&secret)),
    };
    Ok((keys, auth))
}

async fn run_serve(a: ServeArgs) -> Result<i32> {
    let (keys, auth) = auth(&a.common)?;
    let allow = if a.allow.is_empty() {
        vec!["127.0.0.0/8=ANY".to_string(), "::1=ANY".to_string()]
    } else {
        a.allow.clone()
    };
    let allow = allow
        .iter()
        .map(|r| AllowRule::parse(r))
        .collect::<Result<Vec<_>, _>>()?;
    let allow_relay = a
        .allow_relay
        .iter()
        .map(|p| HostPattern::parse(p).with_context(|| format!("--allow-relay {p}")))
        .collect::<Result<Vec<_>>>()?;
    if a.rate_mbps <= 0.0 {
        bail!("--rate-mbps must be positive");
    }
    if a.parity_k > 0 && !a.block.is_multiple_of(2) {
        bail!("--block must be even for repair by parity (or --parity-k 0)");
    }
    let push = a.multicast.as_ref().map(|g| PushConfig {
        group: g.clone(),
        rate: (a.rate_mbps * 1e6 / 8.0) as u64,
        block: a.block,
        index_interval: 200_000,
        k: a.parity_k,
        m: DEFAULT_M,
    });
    let server = ServerConfig {
        limits: QueueLimits {
            max_bytes: a.queue_mib << 20,
            max_age: a.max_age * 1_000_000,
        },
        allow,
        allow_relay,
        push,
        unicast_block: 256 << 10,
        feed_id: rand::random(),
        // Drawn by `serve` at its start (unless --plaintext).
        group_key: None,
    };
    let cfg = ServeConfig {
        dir: a.dir.clone(),
        server,
        keys,
        auth,
        remote_insert: a.remote_insert,
        multicast_if: a.multicast_if,
        multicast_ttl: a.ttl,
        registry: None,
        upstream: match &a.upstream {
            Some(source) => Some(UpstreamConfig {
                source: source.clone(),
                fixed: a.upstream_fixed,
                advertise: a.advertise.clone(),
                listen: None,
                feedtype: a.feedtype.clone(),
                name: a.name.clone(),
                start: a.upstream_from.as_deref().map(parse_from).transpose()?,
                tuning: a.common.tuning()?,
                rx: ReceiverConfig::default(),
                parent_stall: Duration::from_secs(a.parent_stall_secs),
            }),
            None => None,
        },
        max_relay_children: a.max_relay_children,
    };
    let dir = a.dir.display().to_string();
    let group = a.multicast.clone().unwrap_or_else(|| "none".into());
    let relays = a.upstream.as_ref().map_or(String::new(), |u| {
        format!(", relaying {u} ({})", a.feedtype)
    });
    let mut cfg = cfg;
    let endpoint = match &a.metrics {
        Some(addr) => {
            let m = crate::metrics::Endpoint::start(addr).await?;
            bulkcast_runtime::feed::metrics::global()
                .register(&mut m.registry.lock().unwrap_or_else(|e| e.into_inner()));
            cfg.registry = Some(m.registry.clone());
            Some(m)
        }
        None => None,
    };
    let metrics_url = endpoint
        .as_ref()
        .map(|m| format!("http://{}/metrics", m.addr));
    serve::serve(cfg, &a.listen, |addr| {
        // The first line of stdout says where we listen (scripts and tests read it).
        println!("bulkcast feed serving on {addr}, queue {dir}, multicast {group}{relays}");
        if let Some(u) = metrics_url {
            println!("bulkcast feed metrics on {u}");
        }
    })
    .await
    .with_context(|| format!("feed serve on {}", a.listen))?;
    Ok(0)
}

async fn run_insert(a: InsertArgs) -> Result<i32> {
    let (keys, _) = auth(&a.common)?;
    let tuning = a.common.tuning()?;
    let to = Target {
        server: &a.server,
        keys: &keys,
        tuning: &tuning,
        feedtype: &a.feedtype,
    };
    if let Some(dir) = &a.sources.watch {
        return crate::feed_sources::run_watch(&to, dir, &a.sources).await;
    }
    if a.sources.stdin {
        return crate::feed_sources::run_stdin(&to).await;
    }
    if a.name.is_some() && a.files.len() > 1 {
        bail!("--name names one product; give one file");
    }
    let mut failed = 0;
    for f in &a.files {
        let name = match &a.name {
            Some(n) => n.clone(),
            None => f
                .file_name()
                .and_then(|n| n.to_str())
                .context("file name is not UTF-8")?
                .to_string(),
        };
        match client::insert(&a.server, &keys, &tuning, f, &name, &a.feedtype).await {
            Ok(seq) => println!("{seq} {name}"),
            Err(e) => {
                // The error names the file.
                eprintln!("error: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

fn parse_from(s: &str) -> Result<Start> {
    bulkcast_runtime::feed::request::parse_start(s).map_err(|e| anyhow::anyhow!("--{e}"))
}

async fn run_subscribe(a: SubscribeArgs) -> Result<i32> {
    let (keys, auth) = auth(&a.common)?;
    let cfg = SubscribeConfig {
        source: a.source.clone(),
        feedtype: a.feedtype.clone(),
        name: a.name.clone(),
        dir: a.dir.clone(),
        start: a.from.as_deref().map(parse_from).transpose()?,
        multicast: !a.unicast,
        iface: a.iface,
        keys,
        auth,
        tuning: a.common.tuning()?,
        rx: ReceiverConfig {
            fallback_after: (a.fallback_after * 1e6) as u64,
            ..ReceiverConfig::default()
        },
        max_products: a.max_products,
        duration: a.duration.map(Duration::from_secs_f64),
        hello: None,
    };
    let (json, exec) = (a.json, a.exec.clone());
    let mut transport = "unicast";
    let endpoint = match &a.metrics {
        Some(addr) => {
            let m = crate::metrics::Endpoint::start(addr).await?;
            eprintln!(
                "bulkcast feed subscribe metrics on http://{}/metrics",
                m.addr
            );
            Some(m)
        }
        None => None,
    };
    let counted = endpoint
        .as_ref()
        .map(|m| SubscribeMetrics::new(&mut m.registry.lock().unwrap_or_else(|e| e.into_inner())));
    let r = client::subscribe(cfg, |rep| {
        if let Some(m) = &counted {
            m.count(&rep);
        }
        report(json, exec.as_deref(), &mut transport, rep)
    })
    .await;
    match r {
        Ok(s) => {
            if json {
                println!(
                    "{}",
                    json!({"event": "summary", "delivered": s.delivered, "stats": s.stats})
                );
            } else {
                eprintln!("{} products delivered", s.delivered);
            }
            Ok(0)
        }
        Err(SubError::Refused(reason)) => {
            eprintln!("error: refused by the source: {reason}");
            Ok(1)
        }
        Err(e) => Err(e.into()),
    }
}

fn report(json: bool, exec: Option<&str>, transport: &mut &'static str, r: Report<'_>) {
    let line = match r {
        Report::Subscribed {
            transport: t,
            group,
            from,
        } => {
            *transport = t;
            if !json {
                eprintln!("subscribed from {from} by {t} {group}");
            }
            json!({"event": "subscribed", "transport": t, "group": group, "from": from})
        }
        Report::Delivered {
            meta,
            path,
            latency,
            repaired,
            multicast,
        } => {
            if let Some(cmd) = exec {
                bulkcast_runtime::feed::request::run_exec("subscribe", cmd, meta, path);
            }
            if !json {
                println!("{} {}", meta.seq, path.display());
                return;
            }
            let ms = |us: u64| us as f64 / 1000.0;
            json!({"event": "delivered", "seq": meta.seq, "name": meta.name, "feedtype": meta.feedtype,
                "size": meta.size, "created_us": meta.created, "path": path, "transport": if multicast { "multicast" } else { "unicast" },
                "latency_ms": {"waiting": ms(latency.waiting_us), "transmission": ms(latency.transmission_us),
                    "repair": ms(latency.repair_us), "total": ms(latency.total_us)},
                "repaired_bytes": repaired})
        }
        Report::Lost { from, to } => {
            eprintln!(
                "warning: products {from}..={to} left the source's queue before they got here"
            );
            json!({"event": "lost", "from": from, "to": to})
        }
        Report::RefusedClearGroup { group } => {
            eprintln!(
                "warning: refusing the feed's multicast group {group} in clear: the source chose \
                 --plaintext and this subscriber did not; the products come over the encrypted \
                 connection instead (give --plaintext on both ends to multicast in clear)"
            );
            json!({"event": "refused_clear_group", "group": group})
        }
        Report::FellBack => {
            *transport = "unicast";
            eprintln!("warning: no multicast arrives; falling back to unicast");
            json!({"event": "fallback", "transport": "unicast"})
        }
        Report::Settled { .. } | Report::Received { .. } => return,
        Report::Disconnected { reason, retry_in } => {
            eprintln!("warning: lost the source ({reason}); reconnecting in {retry_in:.2?}");
            json!({"event": "disconnected", "reason": reason, "retry_in_ms": retry_in.as_millis() as u64})
        }
    };
    if json {
        println!("{line}");
    }
}

async fn run_status(a: StatusArgs) -> Result<i32> {
    let (keys, _) = auth(&a.common)?;
    let json = client::status(&a.server, &keys, &a.common.tuning()?).await?;
    if a.json {
        println!("{json}");
        return Ok(0);
    }
    let v: serde_json::Value = serde_json::from_str(&json)?;
    println!(
        "queue: {} products, {} of {} bytes, seq {}..{}, multicast {}",
        v["products"], v["bytes"], v["max_bytes"], v["first_seq"], v["last_seq"], v["group"]
    );
    let up = &v["upstream"];
    if !up.is_null() {
        println!(
            "upstream: {} ({}), {}, relayed {} ({} bytes), settled below {}, lag {}, lost {}, \
             disconnects {}, last error {}",
            up["source"].as_str().unwrap_or(""),
            up["feedtype"].as_str().unwrap_or(""),
            if up["connected"] == true {
                "connected"
            } else {
                "not connected"
            },
            up["relayed"],
            up["relayed_bytes"],
            up["settled"],
            up["lag"],
            up["lost"],
            up["disconnects"],
            up["last_error"]
        );
        println!(
            "parent: {} (join {}: {}), above it {}; source at seq {}; dead parents {}, {} left \
             for sending nothing",
            up["parent"].as_str().unwrap_or(""),
            up["joins"],
            up["chosen"].as_str().unwrap_or(""),
            up["ancestry"],
            up["source_last_seq"],
            up["dead"],
            up["stalls"]
        );
        for c in up["measured"].as_array().into_iter().flatten() {
            println!(
                "  measured {:<40} {:>9.2} ms, relay children {}/{}{}",
                c["addr"].as_str().unwrap_or(""),
                c["rtt_us"].as_f64().unwrap_or(0.0) / 1000.0,
                c["children"],
                c["max_children"],
                if c["source"] == true { " (source)" } else { "" }
            );
        }
    }
    let kids = v["relay_children"].as_array().map_or(0, Vec::len);
    if kids > 0 {
        println!(
            "relay children ({kids} of at most {}): {}",
            v["max_relay_children"], v["relay_children"]
        );
    }
    if v["relays_refused"].as_u64().is_some_and(|n| n > 0) {
        println!(
            "relays refused (no --allow-relay pattern covers them): {}",
            v["relays_refused"]
        );
    }
    println!(
        "{:>4} {:<40} {:<16} {:<10} {:>10} {:>8}",
        "id", "host", "feedtype", "transport", "acked", "lag"
    );
    for s in v["subscribers"].as_array().into_iter().flatten() {
        println!(
            "{:>4} {:<40} {:<16} {:<10} {:>10} {:>8}",
            s["id"].to_string(),
            s["host"].as_str().unwrap_or(""),
            s["feedtype"].as_str().unwrap_or(""),
            s["transport"].as_str().unwrap_or(""),
            s["acked"].to_string(),
            s["lag"].to_string()
        );
    }
    Ok(0)
}
