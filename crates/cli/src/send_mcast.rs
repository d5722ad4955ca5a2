//! `bulkcast send --strategy multicast`: one file by IP multicast with erasure-coded repair
//! on a LAN ([`bulkcast_runtime::mcast`]); receivers the group does not reach get it by the tree.

use std::net::SocketAddrV4;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::hosts::{HostSpec, HostsFile};
use bulkcast_proto::mcast::msg::lan_symbol;
use bulkcast_runtime::input::Input;
use bulkcast_runtime::mcast::send::{self as mcast, McastConfig, RxOutcome};
use bulkcast_runtime::report::{McastRateReport, ObjectReport, ReceiverReport, Report, TrainSeen};
use bulkcast_runtime::transport::TcpTuning;
use clap::Args;

/// The multicast strategy's options.
#[derive(Args, Debug, Clone)]
pub struct McastArgs {
    /// `--strategy multicast`: the group, `ADDR:PORT` (an administratively scoped 239.x
    /// address by default).
    #[arg(long, default_value = "239.255.66.1:7391")]
    mcast_group: SocketAddrV4,
    /// `--strategy multicast`: sending rate in Mbit/s on the wire (default: 0.98 of the
    /// slowest of the source's uplink and the receivers' downlinks in the hosts file, else
    /// measured: the first 1024 datagrams go out back to back and the receivers time them).
    #[arg(long, value_name = "MBIT")]
    mcast_rate: Option<f64>,
    /// `--strategy multicast`: TTL of the datagrams (1: this LAN only).
    #[arg(long, default_value_t = 1)]
    mcast_ttl: u32,
    /// `--strategy multicast`: milliseconds receivers have to hear the group before they
    /// are sent the file by the tree instead.
    #[arg(long, default_value_t = 1000)]
    mcast_detect_ms: u64,
}

/// Rate in Mbit/s: the flag, else 0.98 of the slowest link the hosts file gives, else
/// `None`: measured.
fn rate_mbps(a: &McastArgs, file: &HostsFile) -> (Option<f64>, &'static str) {
    if let Some(r) = a.mcast_rate {
        return (Some(r), "--mcast-rate");
    }
    let links = file
        .source
        .as_ref()
        .and_then(|s| s.uplink_mbps)
        .into_iter()
        .chain(file.hosts.iter().filter_map(|h| h.downlink_mbps));
    match links.min_by(f64::total_cmp) {
        Some(l) => (Some(0.98 * l), "0.98 of the slowest link in the hosts file"),
        None => (None, "measured"),
    }
}

/// The multicast part of a send: every receiver's report line in `file`'s order, and the
/// receivers (by index) that take the file by the tree instead: those multicast did not
/// reach, and those that hold the object already, whole or in part.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    a: &McastArgs,
    path: &std::path::Path,
    input: &Input,
    file: &HostsFile,
    keys: &bulkcast_proto::auth::Keys,
    tuning: &TcpTuning,
    stall: Duration,
    quiet: bool,
) -> Result<(Report, Vec<Fallback>)> {
    if input.single_file().is_none() {
        bail!("--strategy multicast sends one regular file (not a directory or stdin)");
    }
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    let (rate, why) = rate_mbps(a, file);
    if rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        bail!("--mcast-rate must be positive");
    }
    let cfg = McastConfig {
        group: a.mcast_group,
        rate_bps: rate.map(|r| (r * 1e6) as u64),
        ttl: a.mcast_ttl,
        detect: Duration::from_millis(a.mcast_detect_ms),
        symbol: lan_symbol(!keys.plaintext()),
        // Parity for a quarter of a block: past 25% loss a block's repairs are its own
        // symbols again. Coding cost grows with k + m, and the source codes inline.
        k: 256,
        m: 64,
        stall_timeout: stall,
    };
    if !quiet {
        match rate {
            Some(r) => eprintln!(
                "multicast: group {} at {r:.1} Mbit/s ({why})",
                a.mcast_group
            ),
            None => eprintln!(
                "multicast: group {}, rate measured by the receivers",
                a.mcast_group
            ),
        }
    }
    let addrs: Vec<String> = file.hosts.iter().map(|h| h.addr.clone()).collect();
    let name = &input.manifest.name;
    let r = mcast::send(path, &input.manifest, &addrs, keys, tuning, &cfg)
        .await
        .context("multicast send")?;
    let bytes = meta.len();
    let mut fallback = Vec::new();
    let receivers = file
        .hosts
        .iter()
        .zip(&r.outcomes)
        .enumerate()
        .map(|(i, (h, o))| {
            match o {
                RxOutcome::NoMulticast(e) => fallback.push(Fallback::Unreached(i, e.clone())),
                RxOutcome::Holds => fallback.push(Fallback::Holds(i)),
                _ => {}
            }
            receiver_line(h, o, bytes)
        })
        .collect::<Vec<_>>();
    let s = r.stats;
    let measured = match (&r.train, s.rate_changes) {
        (None, _) => "",
        (Some(_), 0) => " measured",
        (Some(_), _) => " raised from the train's while the group kept up",
    };
    let strategy = match s.first_pass {
        0 => "multicast (nothing sent)".to_string(),
        _ => format!(
            "multicast ({:.0} Mbit/s{measured}, {} repair datagrams for {} sent)",
            r.rate_bps as f64 / 1e6,
            s.repair,
            s.first_pass
        ),
    };
    let slowest = receivers
        .iter()
        .filter(|x| x.verified)
        .map(|x| x.seconds)
        .fold(0.0, f64::max);
    let report = Report {
        session: String::new(),
        object: ObjectReport {
            name: name.clone(),
            kind: "file".into(),
            bytes,
            skipped: Vec::new(),
        },
        strategy,
        chunk_size: cfg.symbol,
        part_size: 0,
        seconds: r.seconds,
        ok: receivers.iter().all(|x| x.verified),
        aggregate_mbps: if slowest > 0.0 {
            receivers.iter().filter(|x| x.verified).count() as f64 * bytes as f64 * 8.0
                / slowest
                / 1e6
        } else {
            0.0
        },
        receivers,
        edges: Vec::new(),
        clusters: Vec::new(),
        rejected: Vec::new(),
        probe: None,
        timeline: Default::default(),
        multicast: Some(rate_report(&r, why)),
    };
    Ok((report, fallback))
}

/// The rate the send went at, and what the train measured.
fn rate_report(r: &mcast::McastResult, why: &str) -> McastRateReport {
    McastRateReport {
        rate_mbps: r.rate_bps as f64 / 1e6,
        from: why.to_string(),
        train_sent_mbps: r.train.as_ref().map(|t| t.sent_bps as f64 / 1e6),
        train_rate_mbps: r
            .train
            .as_ref()
            .and_then(|t| t.rate_bps)
            .map(|b| b as f64 / 1e6),
        probe_stopped: r.stats.probe_end.map(|e| e.to_string()),
        train: r.train.as_ref().map_or(Vec::new(), |t| {
            t.receivers
                .iter()
                .map(|x| {
                    x.map(|(bps, loss)| TrainSeen {
                        mbps: bps as f64 / 1e6,
                        loss,
                    })
                })
                .collect()
        }),
    }
}

/// A receiver that takes the file by the tree instead, by index.
#[derive(Debug, Clone)]
pub enum Fallback {
    /// The group did not reach it (why).
    Unreached(usize, String),
    /// It holds the object whole or in part: the tree moves only what it lacks.
    Holds(usize),
}

impl Fallback {
    /// The receiver's index.
    pub fn index(&self) -> usize {
        match self {
            Fallback::Unreached(i, _) | Fallback::Holds(i) => *i,
        }
    }
}

/// Says who takes the file by the tree instead and why, and remembers for `auto` a host set
/// the group reached none of (a receiver that holds the object says nothing about the group
/// either way).
pub fn note_fallback(fallback: &[Fallback], hosts: &[HostSpec], quiet: bool) {
    let addrs: Vec<String> = hosts.iter().map(|h| h.addr.clone()).collect();
    let unreached: Vec<String> = fallback
        .iter()
        .filter_map(|f| match f {
            Fallback::Unreached(i, e) => Some(format!("{} ({e})", hosts[*i].name)),
            Fallback::Holds(_) => None,
        })
        .collect();
    let holds = fallback.len() - unreached.len();
    if let Some(u) = bulkcast_runtime::mcast::Unreached::in_user_cache() {
        if unreached.len() == addrs.len() {
            u.remember(&addrs);
        } else if holds < addrs.len() {
            u.forget(&addrs);
        }
    }
    if !unreached.is_empty() {
        eprintln!(
            "multicast does not reach {} of {} receivers; sending to them by the tree: {}",
            unreached.len(),
            hosts.len(),
            unreached.join(", ")
        );
    }
    if holds > 0 && !quiet {
        eprintln!(
            "{holds} of {} receivers hold the object, whole or in part: the tree moves only \
             what they lack",
            hosts.len()
        );
    }
}

/// Receiver `h`'s report line, for `bytes` multicast with outcome `o`.
fn receiver_line(h: &HostSpec, o: &RxOutcome, bytes: u64) -> ReceiverReport {
    let (verified, seconds, error) = match o {
        RxOutcome::Done { seconds, .. } => (true, *seconds, None),
        RxOutcome::NoMulticast(e) => (false, 0.0, Some(format!("no multicast: {e}"))),
        RxOutcome::Holds => (false, 0.0, Some("holds the object: by the tree".into())),
        RxOutcome::Failed(e) => (false, 0.0, Some(e.clone())),
    };
    ReceiverReport {
        name: h.name.clone(),
        addr: h.addr.clone(),
        parent: "source (multicast)".into(),
        bytes: if verified { bytes } else { 0 },
        seconds,
        rate_mbps: if seconds > 0.0 {
            bytes as f64 * 8.0 / seconds / 1e6
        } else {
            0.0
        },
        verified,
        held_bytes: 0,
        already_in_place: false,
        received_bytes: verified.then_some(bytes),
        error,
        site: h.site.clone(),
        received_from: Vec::new(),
    }
}

/// Puts the tree's report lines for the receivers multicast missed into `report`.
pub fn merge_tree(report: &mut Report, tree: Report, fell_back: usize) {
    for r in tree.receivers {
        if let Some(x) = report.receivers.iter_mut().find(|x| x.addr == r.addr) {
            *x = r;
        }
    }
    report.strategy = format!("{}; {fell_back} by {}", report.strategy, tree.strategy);
    report.seconds += tree.seconds;
    report.edges = tree.edges;
    report.ok = report.receivers.iter().all(|r| r.verified);
}
