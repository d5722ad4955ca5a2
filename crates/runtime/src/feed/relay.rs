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
use bulkcast_proto::feed::msg::Start;
use bulkcast_proto::feed::product::{ProductAuth, ProductMeta};
use bulkcast_proto::feed::receiver::ReceiverConfig;
use bulkcast_proto::feed::relay::Relay;

use super::backoff::Backoff;
use super::client::{self, Report, SubscribeConfig};
use super::now_us;
use super::serve::Ctx;
use crate::transport::TcpTuning;

/// Where a relay's products come from.
#[derive(Clone)]
pub struct UpstreamConfig {
    /// The upstream server (the source, or a relay nearer it), `HOST:PORT`.
    pub source: String,
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
}

/// The relay's state, beside the server's.
pub(super) type RelayState = Mutex<Relay<PathBuf>>;

pub(super) fn lock(r: &RelayState) -> MutexGuard<'_, Relay<PathBuf>> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// How often the upstream's newest sequence number is read (for the lag in the status).
const STATUS_EVERY: Duration = Duration::from_secs(5);
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

/// Subscribes upstream for as long as the process runs, queuing what arrives. A lost
/// connection is taken up again by the subscription itself, from where it stopped, after
/// [`Backoff::reconnect`]'s waits; a refusal or a local failure is retried here, after
/// [`REFUSED_BACKOFF`]'s.
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
    loop {
        clean_staging(&dir);
        let saved = client::saved_position(&dir);
        let start = lock(&relay)
            .resume(saved)
            .map(Start::Seq)
            .or(up.start)
            .unwrap_or(Start::Now);
        tracing::info!(
            "relay: subscribing to {} ({}) from {start:?}",
            up.source,
            up.feedtype
        );
        let cfg = SubscribeConfig {
            source: up.source.clone(),
            feedtype: up.feedtype.clone(),
            name: up.name.clone(),
            dir: dir.clone(),
            start: Some(start),
            // The WAN leg is unicast: multicast, if any, is this relay's own LAN.
            multicast: false,
            iface: None,
            keys: keys.clone(),
            auth: auth.clone(),
            tuning: up.tuning.clone(),
            rx: up.rx,
            max_products: None,
            duration: None,
        };
        let began = Instant::now();
        let r = client::subscribe(cfg, |rep| on_report(&ctx, &relay, &up.source, rep)).await;
        let why = match r {
            Ok(_) => "the subscription ended".to_string(),
            Err(e) => e.to_string(),
        };
        let wait = backoff.after(began.elapsed(), rand::random());
        tracing::warn!(
            "relay: upstream {}: {why}; trying again in {wait:.2?}",
            up.source
        );
        lock(&relay).connected(false, Some(why));
        tokio::time::sleep(wait).await;
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
        Report::FellBack | Report::RefusedClearGroup { .. } => {}
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

/// Reads the upstream's newest sequence number now and then, for the lag in the status.
async fn poll_upstream_status(relay: Arc<RelayState>, up: UpstreamConfig, keys: Keys) {
    loop {
        let newest = match client::status(&up.source, &keys, &up.tuning).await {
            Ok(json) => serde_json::from_str::<serde_json::Value>(&json)
                .ok()
                .and_then(|v| v["last_seq"].as_u64()),
            Err(e) => {
                tracing::debug!("relay: upstream status: {e}");
                None
            }
        };
        lock(&relay).upstream_newest(newest);
        tokio::time::sleep(STATUS_EVERY).await;
    }
}
