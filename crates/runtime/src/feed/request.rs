//! An agent's subscriptions: the `[[feed]]` tables of its config, LDM's `REQUEST` lines.
//!
//! ```toml
//! [[feed]]
//! source = "feeds.example.org:7388"
//! feedtype = "NEXRAD3|IDS"
//! name = "^KFTG"                   # optional: product names matching this regex
//! dir = "/var/data/nexrad"
//! exec = "ingest \"$1\""           # optional: per product, like LDM's pqact
//! ```
//!
//! Each runs as a task for the agent's lifetime ([`Subscriptions`]): it reconnects after
//! losing the source and resumes from the position saved in its directory, also across agent
//! restarts. A subscription is known by its directory: two writing one directory would
//! overwrite each other's saved position, so [`check`] refuses them.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::Start;
use bulkcast_proto::feed::product::{ProductAuth, ProductMeta, Subscription};
use bulkcast_proto::feed::receiver::ReceiverConfig;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::client::{self, saved_position, Report, SubscribeConfig};
use super::metrics::SubscribeMetrics;
use super::now_us;
use crate::transport::TcpTuning;

/// One `[[feed]]` table: the settings of `feed subscribe`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedLine {
    /// The feed source, `HOST:PORT`.
    pub source: String,
    /// Feedtypes wanted: `NEXRAD3|IDS`, `NEXRAD*`, `ANY`.
    pub feedtype: String,
    /// Only products whose name matches this regex ("" for any).
    #[serde(default)]
    pub name: String,
    /// Where products go (and the saved position).
    pub dir: PathBuf,
    /// `sh -c CMD` per product, its path as `$1` (as `feed subscribe --exec`).
    pub exec: Option<String>,
    /// Where the first run into `dir` starts (`123`, `@UNIX_SECONDS`, `-10m`, `now`); later
    /// runs resume from the saved position whatever this says.
    pub from: Option<String>,
    /// Never take multicast.
    #[serde(default)]
    pub unicast: bool,
    /// Interface address to join the multicast group on.
    pub iface: Option<Ipv4Addr>,
    /// Seconds without a multicast datagram before falling back to unicast (default 3).
    pub fallback_after: Option<f64>,
}

impl FeedLine {
    /// How the agent's log names it.
    pub fn label(&self) -> String {
        format!("{} from {}", self.feedtype, self.source)
    }

    /// Checks one line's values (what a subscription would only find out later).
    pub fn check(&self) -> Result<(), String> {
        let port = self
            .source
            .rsplit_once(':')
            .map(|(h, p)| (h, p.parse::<u16>()));
        if !matches!(port, Some((h, Ok(_))) if !h.is_empty()) {
            return Err(format!("source {:?} is not HOST:PORT", self.source));
        }
        Subscription::parse(&self.feedtype, &self.name).map_err(|e| e.to_string())?;
        if self.dir.as_os_str().is_empty() {
            return Err("dir is empty".into());
        }
        if let Some(f) = &self.from {
            parse_start(f)?;
        }
        if let Some(s) = self.fallback_after {
            if !(s.is_finite() && s > 0.0) {
                return Err(format!("fallback_after must be positive seconds, not {s}"));
            }
        }
        Ok(())
    }
}

/// A line that failed [`check`]: which (its index) and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    /// Index in the list given.
    pub index: usize,
    /// Why.
    pub reason: String,
}

/// Checks every line, and that no two of them share a directory, nor one is in or around the
/// agent's own (`agent_dir`: a pushed object replaces what is there of its name).
pub fn check(lines: &[FeedLine], agent_dir: Option<&Path>) -> Result<(), LineError> {
    let mut seen: BTreeMap<PathBuf, usize> = BTreeMap::new();
    for (index, l) in lines.iter().enumerate() {
        let err = |reason: String| LineError { index, reason };
        l.check().map_err(err)?;
        let dir = normal(&l.dir);
        if let Some(a) = agent_dir.map(normal) {
            if a.starts_with(&dir) || dir.starts_with(&a) {
                return Err(err(format!(
                    "dir {} is in or around the agent's own directory {}, where pushed \
                     objects go (replacing what is there of their name): give the feed a \
                     directory outside it",
                    l.dir.display(),
                    a.display()
                )));
            }
        }
        if let Some(first) = seen.insert(dir, index) {
            return Err(err(format!(
                "dir {} is also the dir of [[feed]] #{}: two subscriptions in one directory \
                 would overwrite each other's saved position",
                l.dir.display(),
                first + 1
            )));
        }
    }
    Ok(())
}

/// `dir` with `.` and `..` resolved (lexically, and through the file system where it exists),
/// so `/a/b` and `/a/./b/` are one directory.
fn normal(dir: &Path) -> PathBuf {
    if let Ok(p) = dir.canonicalize() {
        return p;
    }
    let mut out = PathBuf::new();
    for c in dir.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// Parses where a subscription starts: a sequence number (`123`), a time (`@UNIX_SECONDS`,
/// or `-10m` ago: `s`, `m`, `h`), or `now`.
pub fn parse_start(s: &str) -> Result<Start, String> {
    let now = now_us();
    if s == "now" {
        return Ok(Start::Now);
    }
    if let Some(t) = s.strip_prefix('@') {
        let secs: f64 = t
            .parse()
            .map_err(|_| format!("from {s:?}: @UNIX_SECONDS"))?;
        return Ok(Start::Time((secs * 1e6) as u64));
    }
    if let Some(d) = s.strip_prefix('-') {
        let (num, unit) = d.split_at(
            d.find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(d.len()),
        );
        let n: f64 = num.parse().map_err(|_| format!("from {s:?}: -N[s|m|h]"))?;
        let mult = match unit {
            "" | "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("from {s:?}: unknown unit {unit:?} (s, m, h)")),
        };
        return Ok(Start::Time(now.saturating_sub((n * mult * 1e6) as u64)));
    }
    s.parse()
        .map(Start::Seq)
        .map_err(|_| format!("from {s:?} is not a sequence number, @UNIX_SECONDS, -10m or now"))
}

/// What an agent's subscriptions share.
#[derive(Clone)]
pub struct FeedContext {
    /// Session keys (as `feed subscribe` takes them from the agent's secret and host keys).
    pub keys: Keys,
    /// Product authentication.
    pub auth: Arc<dyn ProductAuth>,
    /// TCP options.
    pub tuning: TcpTuning,
    /// The agent's feed metrics, one set for all its subscriptions.
    pub metrics: Option<Arc<SubscribeMetrics>>,
}

/// How long a subscription the source refused (or that failed here: a full disk) waits
/// before it tries again; lost connections are retried at once by the client.
const RETRY: Duration = Duration::from_secs(30);

/// How long stopping waits for a subscription to save its position.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// An agent's running subscriptions, by directory.
pub struct Subscriptions {
    ctx: FeedContext,
    running: tokio::sync::Mutex<BTreeMap<PathBuf, Running>>,
}

struct Running {
    line: FeedLine,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Running {
    /// Stops it; returns once its position is saved (or after [`STOP_WAIT`]).
    async fn stop(self) {
        self.stop.notify_one();
        let label = self.line.label();
        if tokio::time::timeout(STOP_WAIT, self.task).await.is_err() {
            tracing::warn!("feed {label}: did not stop within {STOP_WAIT:?}");
        }
    }
}

/// What [`Subscriptions::apply`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Subscriptions started (new, or changed).
    pub started: usize,
    /// Subscriptions stopped (removed, or changed).
    pub stopped: usize,
    /// Subscriptions left running as they were.
    pub kept: usize,
}

impl Subscriptions {
    /// None running yet.
    pub fn new(ctx: FeedContext) -> Subscriptions {
        Subscriptions {
            ctx,
            running: Default::default(),
        }
    }

    /// Makes `lines` (checked by [`check`]) the running set: starts those not running,
    /// stops those no longer listed, and restarts those whose settings changed (the new one
    /// starts once the old one has saved its position).
    pub async fn apply(&self, lines: Vec<FeedLine>) -> Applied {
        let mut running = self.running.lock().await;
        let mut wanted: BTreeMap<PathBuf, FeedLine> =
            lines.into_iter().map(|l| (normal(&l.dir), l)).collect();
        let mut applied = Applied::default();
        let dirs: Vec<PathBuf> = running.keys().cloned().collect();
        for dir in dirs {
            if wanted.get(&dir) == running.get(&dir).map(|r| &r.line) {
                wanted.remove(&dir);
                applied.kept += 1;
                continue;
            }
            if let Some(r) = running.remove(&dir) {
                tracing::info!(
                    "feed {}: stopping ({})",
                    r.line.label(),
                    r.line.dir.display()
                );
                r.stop().await;
                applied.stopped += 1;
            }
        }
        for (dir, line) in wanted {
            let stop = Arc::new(Notify::new());
            let task = tokio::spawn(keep_subscribed(
                line.clone(),
                self.ctx.clone(),
                stop.clone(),
            ));
            running.insert(dir, Running { line, stop, task });
            applied.started += 1;
        }
        applied
    }

    /// Stops every subscription, each saving its position.
    pub async fn stop_all(&self) {
        let all = std::mem::take(&mut *self.running.lock().await);
        for r in all.into_values() {
            r.stop().await;
        }
    }

    /// The directories of the subscriptions running.
    pub async fn dirs(&self) -> Vec<PathBuf> {
        let running = self.running.lock().await;
        running.values().map(|r| r.line.dir.clone()).collect()
    }
}

/// One subscription for as long as it is wanted: the client reconnects by itself; a refusal
/// or a local failure is logged and tried again after [`RETRY`].
async fn keep_subscribed(line: FeedLine, ctx: FeedContext, stop: Arc<Notify>) {
    let label = line.label();
    loop {
        // The saved position wins over `from`: that is what resumes across restarts.
        let start = match saved_position(&line.dir) {
            Some(_) => None,
            None => line.from.as_deref().and_then(|f| parse_start(f).ok()),
        };
        tracing::info!(
            "feed {label}: subscribing into {} from {}",
            line.dir.display(),
            match (&start, saved_position(&line.dir)) {
                (_, Some(seq)) => format!("product {seq} (where it stopped)"),
                (Some(_), None) => format!("{:?}", line.from.as_deref().unwrap_or("")),
                (None, None) => "now".into(),
            }
        );
        let cfg = SubscribeConfig {
            source: line.source.clone(),
            feedtype: line.feedtype.clone(),
            name: line.name.clone(),
            dir: line.dir.clone(),
            start,
            multicast: !line.unicast,
            iface: line.iface,
            keys: ctx.keys.clone(),
            auth: ctx.auth.clone(),
            tuning: ctx.tuning.clone(),
            rx: ReceiverConfig {
                fallback_after: (line.fallback_after.unwrap_or(3.0) * 1e6) as u64,
                ..ReceiverConfig::default()
            },
            max_products: None,
            duration: None,
            hello: None,
        };
        let metrics = ctx.metrics.as_deref();
        let exec = line.exec.as_deref();
        let r = client::subscribe_until(
            cfg,
            |rep| log_report(&label, exec, metrics, rep),
            stop.notified(),
        )
        .await;
        match r {
            Ok(s) => {
                tracing::info!("feed {label}: stopped, {} products delivered", s.delivered);
                return;
            }
            Err(e) => tracing::error!("feed {label}: {e}; trying again in {RETRY:?}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = stop.notified() => return,
        }
    }
}

/// The agent's log line (and metrics, and `exec`) for what a subscription reports.
fn log_report(label: &str, exec: Option<&str>, metrics: Option<&SubscribeMetrics>, r: Report<'_>) {
    if let Some(m) = metrics {
        m.count(&r);
    }
    match r {
        Report::Subscribed {
            transport,
            group,
            from,
        } => tracing::info!("feed {label}: subscribed from product {from} by {transport} {group}"),
        Report::Delivered {
            meta,
            path,
            latency,
            repaired,
            multicast,
        } => {
            tracing::info!(
                "feed {label}: product {} {} ({}, {} bytes) by {}, {:.1} ms after creation, {} bytes repaired",
                meta.seq,
                path.display(),
                meta.feedtype,
                meta.size,
                if multicast { "multicast" } else { "unicast" },
                latency.total_us as f64 / 1000.0,
                repaired
            );
            if let Some(cmd) = exec {
                run_exec(label, cmd, meta, path);
            }
        }
        Report::Lost { from, to } => tracing::warn!(
            "feed {label}: products {from}..={to} left the source's queue before they got here"
        ),
        Report::RefusedClearGroup { group } => tracing::warn!(
            "feed {label}: refusing the multicast group {group} in clear (the source chose \
             --plaintext, this agent did not); products come over the encrypted connection"
        ),
        Report::FellBack => {
            tracing::warn!("feed {label}: no multicast arrives; falling back to unicast")
        }
        Report::Disconnected { reason, retry_in } => {
            tracing::warn!(
                "feed {label}: lost the source ({reason}); reconnecting in {retry_in:.2?}"
            )
        }
        // The position is saved by the subscriber itself.
        Report::Settled { .. } | Report::Received { .. } => {}
    }
}

/// Runs `sh -c CMD` for a product (its path as `$1`, its fields in the environment), as
/// `feed subscribe --exec` does; a failure is logged, never stops the subscription.
pub fn run_exec(label: &str, cmd: &str, meta: &ProductMeta, path: &Path) {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .arg("bulkcast-feed")
        .arg(path)
        .env("BULKCAST_PRODUCT", path)
        .env("BULKCAST_SEQ", meta.seq.to_string())
        .env("BULKCAST_FEEDTYPE", &meta.feedtype)
        .env("BULKCAST_NAME", &meta.name)
        .stdin(std::process::Stdio::null())
        .spawn();
    let (label, seq) = (label.to_string(), meta.seq);
    match child {
        Ok(mut c) => {
            tokio::spawn(async move {
                match c.wait().await {
                    Ok(s) if !s.success() => {
                        tracing::warn!("feed {label}: exec for product {seq}: {s}")
                    }
                    Err(e) => tracing::warn!("feed {label}: exec for product {seq}: {e}"),
                    _ => {}
                }
            });
        }
        Err(e) => tracing::warn!("feed {label}: exec for product {seq}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(dir: &str) -> FeedLine {
        FeedLine {
            source: "feeds.example.org:7388".into(),
            feedtype: "NEXRAD3|IDS".into(),
            name: String::new(),
            dir: dir.into(),
            exec: None,
            from: None,
            unicast: false,
            iface: None,
            fallback_after: None,
        }
    }

    #[test]
    fn a_good_list_passes_and_bad_values_are_named() {
        let good = vec![line("/data/a"), line("/data/b")];
        check(&good, Some(Path::new("/var/lib/bulkcast"))).unwrap();
        let bad = |f: &dyn Fn(&mut FeedLine)| {
            let mut l = line("/data/c");
            f(&mut l);
            let e = check(&[line("/data/a"), l], None).unwrap_err();
            assert_eq!(e.index, 1);
            e.reason
        };
        assert!(bad(&|l| l.feedtype = "NEX[".into()).contains("NEX["));
        assert!(bad(&|l| l.name = "(".into()).contains('('));
        assert!(bad(&|l| l.source = "host".into()).contains("HOST:PORT"));
        assert!(bad(&|l| l.source = ":7388".into()).contains("HOST:PORT"));
        assert!(bad(&|l| l.from = Some("yesterday".into())).contains("yesterday"));
        assert!(bad(&|l| l.fallback_after = Some(0.0)).contains("fallback_after"));
        assert!(bad(&|l| l.dir = PathBuf::new()).contains("dir"));
    }

    #[test]
    fn two_lines_or_the_agent_in_one_directory_are_refused() {
        let e = check(
            &[line("/data/a"), line("/data/b"), line("/data/./a/")],
            None,
        )
        .unwrap_err();
        assert_eq!(e.index, 2);
        assert!(e.reason.contains("[[feed]] #1"), "{}", e.reason);
        for inside in ["/data/x/../a", "/data/a/feeds", "/data"] {
            let e = check(&[line(inside)], Some(Path::new("/data/a"))).unwrap_err();
            assert!(e.reason.contains("agent's own directory"), "{}", e.reason);
        }
        check(&[line("/data/ab")], Some(Path::new("/data/a"))).unwrap();
    }

    #[test]
    fn starts_parse() {
        assert_eq!(parse_start("now"), Ok(Start::Now));
        assert_eq!(parse_start("42"), Ok(Start::Seq(42)));
        assert_eq!(parse_start("@1.5"), Ok(Start::Time(1_500_000)));
        let Ok(Start::Time(t)) = parse_start("-10m") else {
            panic!("-10m")
        };
        assert!(now_us() - t >= 600_000_000);
        assert!(parse_start("-3d").is_err());
        assert!(parse_start("x").is_err());
    }
}
