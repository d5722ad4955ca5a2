//! A relay's upstream: `feed serve --upstream` subscribes to the server above it (by unicast
//! over the encrypted connection, [`super::client::subscribe`]) and queues each verified
//! product under its source's sequence number and tag, in order, once
//! ([`bulkcast_proto::feed::relay::Relay`]). Its own subscribers (unicast, or multicast with
//! parity repair on its LAN) are served from that queue as from any source: repairs and
//! backlogs never cross the WAN again.
//!
//! Products arrive in `DIR/upstream/` (with the subscription's position, which a restart
//! resumes from, with the queue's next sequence number) and are moved into `DIR/tmp/` at
//! once, then into the queue when everything before them is settled. The queue's floor is
//! saved in `DIR/floor` whenever it moves ([`super::disk::QueueDir::save_floor`]), so a
//! restart still tells the filter's gaps from products gone.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::{Msg, Start};
use bulkcast_proto::feed::product::{ProductAuth, ProductMeta};
use bulkcast_proto::feed::receiver::ReceiverConfig;
use bulkcast_proto::feed::relay::{Relay, Stall};

use super::backoff::Backoff;
use super::client::{self, Report, SubError, SubscribeConfig};
use super::now_us;
use super::serve::Ctx;
use super::tree::Joined;
use crate::transport::TcpTuning;
use tokio::sync::Notify;

/// Where a relay's products come from.
#[derive(Clone)]
pub struct UpstreamConfig {
    /// The upstream server it is given (the source, or a relay nearer it), `HOST:PORT`: the
    /// root of its joins ([`super::tree`]).
    pub source: String,
    /// Subscribe to `source` itself, never joining below another relay (a chain by hand).
    pub fixed: bool,
    /// This relay's address as other relays reach it (`None`: its listening address, with
    /// the IP of its connection to the source if it listens on every address).
    pub advertise: Option<String>,
    /// Where this server listens (`serve` fills it in).
    pub listen: Option<std::net::SocketAddr>,
    /// Feedtypes relayed.
    pub feedtype: String,
    /// Names relayed (regex; "" for any).
    pub name: String,
    /// Where a new relay starts (a restarted one resumes where it stopped); `None`: now.
    pub start: Option<Start>,
    /// TCP options of the upstream connection.
    pub tuning: TcpTuning,
    /// Timers of the upstream subscription.
    pub rx: ReceiverConfig,
    /// A parent (not the source, not `fixed`) that sends nothing for this long per relay
    /// above this one while the source is ahead is left ([`Stall`]); zero: never.
    pub parent_stall: Duration,
}

/// The relay's state, beside the server's.
pub(super) type RelayState = Mutex<Relay<PathBuf>>;

pub(super) fn lock(r: &RelayState) -> MutexGuard<'_, Relay<PathBuf>> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// How often the upstream's newest sequence number is read (for the lag in the status), and
/// the source's when it is not the parent ([`Stall`]); more often under a short stall time,
/// so that it sees the source ahead a few times first.
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// A status that takes longer counts as no answer: a parent stopped in its tracks still
/// completes TCP's handshake (the kernel's backlog), never ours.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);
/// Waits between attempts after the upstream refused or a local failure: 1 s doubling to
/// 60 s (a refusal is a configuration to fix, not a blip), again from 1 s after a
/// subscription that ran a minute.
const REFUSED_BACKOFF: Backoff = Backoff::new(
    Duration::from_secs(1),
    Duration::from_secs(60),
    Duration::from_secs(60),
);
/// Directory under the queue's where the upstream subscription writes.
const STAGING: &str = "upstream";

/// The staging directory of a relay whose queue is at `root`.
pub(super) fn staging(root: &Path) -> PathBuf {
    root.join(STAGING)
}

/// A parent that failed this many attempts in a row ([`Backoff::reconnect`]'s waits: about
/// a second when it refuses connections) is taken for dead, as is one that has failed
/// every attempt for [`DEAD_AFTER_TIME`] (a host that does not answer at all).
const DEAD_AFTER_ATTEMPTS: u32 = 3;
/// See [`DEAD_AFTER_ATTEMPTS`].
const DEAD_AFTER_TIME: Duration = Duration::from_secs(10);
/// How long a dead parent stays out of joins.
const DEAD_FOR: Duration = Duration::from_secs(300);

/// Subscribes upstream for as long as the process runs, queuing what arrives. Each round
/// joins the relay tree ([`super::tree::join`]) and subscribes to the parent it chose. A lost
/// connection is taken up again by the subscription itself, from where it stopped, after
/// [`Backoff::reconnect`]'s waits; a parent other than the source that stays unreachable
/// ([`DEAD_AFTER_ATTEMPTS`]), refuses, or sends nothing while the source moves on
/// ([`Stall`]) is left for a new join without it, resumed at the same position; the
/// source's refusal or a local failure is retried here, after [`REFUSED_BACKOFF`]'s.
pub(super) async fn run(ctx: Arc<Ctx>, up: UpstreamConfig, keys: Keys, auth: Arc<dyn ProductAuth>) {
    let Some(relay) = ctx.relay.clone() else {
        return;
    };
    let dir = staging(ctx.dir.root());
    tokio::spawn(poll_upstream_status(
        relay.clone(),
        up.clone(),
        keys.clone(),
    ));
    // A new relay's floor is its queue's first sequence number, below the products its
    // filter passes over before the first it takes: saved now, before any of them.
    save_floor(&ctx);
    let mut backoff = REFUSED_BACKOFF;
    let mut dead: Vec<(String, Instant)> = Vec::new();
    loop {
        clean_staging(&dir);
        dead.retain(|(_, t)| t.elapsed() < DEAD_FOR);
        let dead_now: Vec<String> = dead.iter().map(|(a, _)| a.clone()).collect();
        let saved = client::saved_position(&dir);
        // Where the subscription resumes: the parent must still hold it.
        let from = lock(&relay).resume(saved).or(match up.start {
            Some(Start::Seq(s)) => Some(s),
            _ => None,
        });
        let j = super::tree::join(&up, &keys, &dead_now, from).await;
        let start = {
            let mut r = lock(&relay);
            r.joined(
                &j.parent,
                j.ancestry.clone(),
                j.why.clone(),
                j.measured.clone(),
            );
            r.set_dead(dead_now);
            r.resume(saved)
        }
        .map(Start::Seq)
        .or(up.start)
        .unwrap_or(Start::Now);
        tracing::info!(
            "relay: joined below {} as {} ({}), {} servers measured; subscribing ({}) from \
             {start:?}",
            j.parent,
            j.me,
            j.why,
            j.measured.len(),
            up.feedtype
        );
        let watch_parent = !up.fixed && j.parent != up.source;
        let began = Instant::now();
        let settled = lock(&relay).settled_below();
        let sub = Sub {
            up: &up,
            joined: &j,
            keys: &keys,
            auth: &auth,
            watch_parent,
            // The ancestry is the source, the relays above, the parent last.
            stall: (watch_parent && !up.parent_stall.is_zero()).then(|| {
                let limit = up.parent_stall.as_micros() as u64;
                Stall::new(limit, j.ancestry.len().saturating_sub(1), settled, 0)
            }),
        };
        let (why, leave) = match subscribe_to(&ctx, &relay, sub, start).await {
            Ok(Some(why)) => (why, true),
            Ok(None) => ("the subscription ended".to_string(), false),
            Err(e @ SubError::Refused(_)) => (e.to_string(), true),
            Err(e) => (e.to_string(), false),
        };
        if watch_parent && leave {
            tracing::warn!(
                "relay: parent {}: {why}; joining again from {} without it",
                j.parent,
                up.source
            );
            lock(&relay).connected(false, Some(format!("parent {}: {why}", j.parent)));
            dead.push((j.parent.clone(), Instant::now()));
            continue;
        }
        let wait = backoff.after(began.elapsed(), rand::random());
        tracing::warn!(
            "relay: upstream {}: {why}; trying again in {wait:.2?}",
            j.parent
        );
        lock(&relay).connected(false, Some(why));
        tokio::time::sleep(wait).await;
    }
}

/// One subscription to a parent.
struct Sub<'a> {
    up: &'a UpstreamConfig,
    joined: &'a Joined,
    keys: &'a Keys,
    auth: &'a Arc<dyn ProductAuth>,
    /// Give the parent up when it stays unreachable (not the source: it is waited for).
    watch_parent: bool,
    /// Give the parent up when it sends nothing while the source moves on (watched only).
    stall: Option<Stall>,
}

/// The subscription to the parent, from `start`.
fn parent_config(ctx: &Ctx, sub: &Sub<'_>, start: Start) -> SubscribeConfig {
    let up = sub.up;
    SubscribeConfig {
        source: sub.joined.parent.clone(),
        feedtype: up.feedtype.clone(),
        name: up.name.clone(),
        dir: staging(ctx.dir.root()),
        start: Some(start),
        // The WAN leg is unicast: multicast, if any, is this relay's own LAN.
        multicast: false,
        iface: None,
        keys: sub.keys.clone(),
        auth: sub.auth.clone(),
        tuning: up.tuning.clone(),
        rx: up.rx,
        max_products: None,
        duration: None,
        hello: (!sub.joined.me.is_empty()).then(|| Msg::Relay {
            listen: sub.joined.me.clone(),
        }),
    }
}

/// Subscribes to the parent until the subscription fails for good or, when watched, the
/// parent stays unreachable or silent (`Ok(Some(why))`: the position is saved, for the next
/// parent).
async fn subscribe_to(
    ctx: &Ctx,
    relay: &RelayState,
    sub: Sub<'_>,
    start: Start,
) -> Result<Option<String>, SubError> {
    let cfg = parent_config(ctx, &sub, start);
    // Failed attempts in a row, and since when.
    let (mut failed, mut since) = (0u32, None::<Instant>);
    let gave_up = Notify::new();
    let mut gave = false;
    let parent = &sub.joined.parent;
    // The stall watch's clock: this subscription's.
    let began = Instant::now();
    let now = || began.elapsed().as_micros() as u64;
    let stall = Mutex::new(sub.stall);
    let stall_lock = || stall.lock().unwrap_or_else(|p| p.into_inner());
    let mut stalled = None;
    let on = |rep: Report<'_>| {
        match &rep {
            Report::Settled { below } => {
                if let Some(w) = stall_lock().as_mut() {
                    w.handle_settled(*below, now());
                }
            }
            Report::Received { .. } => {
                if let Some(w) = stall_lock().as_mut() {
                    w.handle_bytes(now());
                }
            }
            Report::Subscribed { .. } => (failed, since) = (0, None),
            Report::Disconnected { .. } => {
                failed += 1;
                let first = *since.get_or_insert_with(Instant::now);
                let dead = failed >= DEAD_AFTER_ATTEMPTS || first.elapsed() >= DEAD_AFTER_TIME;
                if sub.watch_parent && dead {
                    gave = true;
                    gave_up.notify_one();
                }
            }
            _ => {}
        }
        on_report(ctx, relay, parent, rep);
    };
    let stop = async {
        tokio::select! {
            _ = gave_up.notified() => {}
            why = watch_stall(&stall, relay, now) => stalled = Some(why),
        }
    };
    client::subscribe_until(cfg, on, stop).await?;
    if let Some(why) = stalled {
        lock(relay).stalled();
        return Ok(Some(why));
    }
    Ok(gave.then(|| "unreachable".to_string()))
}

/// Completes when the stall watch says the parent is to be left (why), fed the source's
/// newest product as [`poll_upstream_status`] last read it, ten times per stall time (at
/// most every second); never without a watch.
async fn watch_stall(
    stall: &Mutex<Option<Stall>>,
    relay: &RelayState,
    now: impl Fn() -> u64,
) -> String {
    let lock_stall = || stall.lock().unwrap_or_else(|p| p.into_inner());
    let Some(limit) = lock_stall().as_ref().map(Stall::limit) else {
        return std::future::pending().await;
    };
    let tick =
        Duration::from_micros(limit / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(tick).await;
        let source = lock(relay).source_last_seq();
        if let Some(w) = lock_stall().as_mut() {
            w.handle_source_newest(source, now());
            if let Some(s) = w.poll_leave(now()) {
                return s.to_string();
            }
        }
    }
}

/// Deletes products of an earlier run that were delivered but not queued (they come again:
/// the subscription resumes before them); keeps the subscription's position.
fn clean_staging(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let state = p
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(".bulkcast-feed-state"));
        if p.is_file() && !state {
            let _ = fs::remove_file(&p);
        }
    }
}

fn on_report(ctx: &Ctx, relay: &RelayState, source: &str, rep: Report<'_>) {
    match rep {
        Report::Subscribed { from, .. } => {
            tracing::info!("relay: subscribed upstream from {from}");
            lock(relay).connected(true, None);
        }
        Report::Delivered { meta, path, .. } => {
            // Out of the way at once: the next product of the same name lands on this path.
            let tmp = ctx.dir.tmp();
            if let Err(e) = fs::rename(path, &tmp) {
                let why = format!("product {} not relayed: {e}", meta.seq);
                tracing::error!("relay: {why}");
                lock(relay).failed(why);
                return;
            }
            if let Some(dup) = lock(relay).delivered(meta.clone(), tmp) {
                let _ = fs::remove_file(dup);
            }
        }
        Report::Settled { below } => {
            let ready = lock(relay).settled(below);
            for (meta, tmp) in ready {
                queue(ctx, relay, meta, &tmp);
            }
        }
        Report::Lost { from, to } => {
            tracing::warn!(
                "relay: upstream products {from}..={to} left the upstream's queue before they \
                 were relayed"
            );
            lock(relay).lost(from, to);
        }
        Report::Disconnected { reason, retry_in } => {
            // Once per attempt, at info: an upstream down for an hour says so every 30 s.
            tracing::info!("relay: upstream {source}: {reason}; trying again in {retry_in:.2?}");
            lock(relay).connected(false, Some(reason));
        }
        Report::FellBack | Report::RefusedClearGroup { .. } | Report::Received { .. } => {}
    }
}

/// Puts a relayed product in the queue (its file and metadata, as an insert does) and wakes
/// the subscribers.
fn queue(ctx: &Ctx, relay: &RelayState, meta: ProductMeta, tmp: &Path) {
    let now = now_us();
    let mut s = ctx.lock();
    let evicted = match s.relay(meta.clone(), now) {
        Ok(ev) => ev,
        Err(e) => {
            drop(s);
            let _ = fs::remove_file(tmp);
            tracing::error!("relay: {e}");
            lock(relay).failed(e.to_string());
            return;
        }
    };
    let committed = ctx.dir.commit(tmp, &meta, now, s.queue().next_seq());
    drop(s);
    if !evicted.is_empty() {
        // Before the evicted files go: a crash between leaves them restored, not a gap.
        save_floor(ctx);
    }
    if let Err(e) = committed {
        // In the queue's index without its file: subscribers are told it is gone.
        let why = format!("product {} not stored: {e}", meta.seq);
        tracing::error!("relay: {why}");
        lock(relay).failed(why);
    }
    let m = super::metrics::global();
    m.removed("size", evicted.len());
    for seq in evicted {
        ctx.dir.remove(seq);
    }
    lock(relay).queued(&meta, now);
    ctx.poke();
    tracing::debug!(
        "relayed {} as {} ({} bytes)",
        meta.name,
        meta.seq,
        meta.size
    );
}

/// Saves the queue's floor if this server is a relay (only a relay's queue has gaps below
/// its oldest product: [`super::disk::QueueDir::save_floor`]). Called when the floor may have
/// moved (an eviction, products aged out), before the files of the products gone are deleted.
pub(super) fn save_floor(ctx: &Ctx) {
    if ctx.relay.is_none() {
        return;
    }
    let floor = ctx.lock().queue().floor();
    if let Err(e) = ctx.dir.save_floor(floor) {
        // Not fatal: a restart would report this floor's gaps as lost, nothing worse.
        tracing::warn!("relay: cannot save the queue's floor {floor}: {e}");
    }
}

/// Reads the parent's newest sequence number now and then, for the lag in the status, and
/// the source's (the same when the source is the parent), for the [`Stall`] watch: from the
/// source itself, as a parent that withholds products could understate its own newest.
async fn poll_upstream_status(relay: Arc<RelayState>, up: UpstreamConfig, keys: Keys) {
    let every = match up.parent_stall.is_zero() {
        true => STATUS_EVERY,
        false => STATUS_EVERY.min(up.parent_stall / 3),
    };
    let every = every.max(Duration::from_millis(200));
    let wait = STATUS_TIMEOUT.min(every);
    loop {
        let parent = lock(&relay).parent().to_string();
        let own = parent != up.source;
        let (p, s) = tokio::join!(last_seq(&parent, &keys, &up, wait), async {
            match own {
                true => last_seq(&up.source, &keys, &up, wait).await,
                false => None,
            }
        });
        {
            let mut r = lock(&relay);
            r.upstream_newest(p);
            r.source_newest(if own { s } else { p });
        }
        tokio::time::sleep(every).await;
    }
}

/// `addr`'s newest sequence number, as its status says within `wait` (`None`: no answer).
async fn last_seq(addr: &str, keys: &Keys, up: &UpstreamConfig, wait: Duration) -> Option<u64> {
    match tokio::time::timeout(wait, client::status(addr, keys, &up.tuning)).await {
        Ok(Ok(json)) => serde_json::from_str::<serde_json::Value>(&json)
            .ok()
            .and_then(|v| v["last_seq"].as_u64()),
        Ok(Err(e)) => {
            tracing::debug!("relay: status of {addr}: {e}");
            None
        }
        Err(_) => {
            tracing::debug!("relay: status of {addr}: no answer within {wait:?}");
            None
        }
    }
}
