//! The agent's subscriptions (`[[feed]]` in its config, LDM's `REQUEST` lines): started with
//! the agent, changed on SIGHUP, stopped (positions saved) when it ends. The work is the
//! library's ([`bulkcast_runtime::feed::request`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::feed::product::{ProductAuth, SecretAuth, SignedAuth};
use bulkcast_runtime::feed::metrics::SubscribeMetrics;
use bulkcast_runtime::feed::request::{FeedContext, FeedLine, Subscriptions};
use bulkcast_runtime::transport::TcpTuning;

use crate::agent_config::AgentFile;

/// Starts `lines`; with a config file, a SIGHUP rereads its `[[feed]]` tables and starts the
/// added ones, stops the removed ones and restarts the changed ones.
pub async fn start(
    lines: Vec<FeedLine>,
    config: Option<PathBuf>,
    agent_dir: &Path,
    (keys, secret, tuning): (&Keys, &Secret, &TcpTuning),
    metrics: Option<&crate::metrics::Endpoint>,
) -> Result<Arc<Subscriptions>> {
    // The agent's own keys: the allow list its SIGHUP reloads is the one these check.
    let auth: Arc<dyn ProductAuth> = match keys.identity() {
        Some(id) => Arc::new(SignedAuth::new(id.clone())),
        None => Arc::new(SecretAuth::new(secret)),
    };
    let metrics = metrics.map(|m| {
        Arc::new(SubscribeMetrics::new(
            &mut m.registry.lock().unwrap_or_else(|e| e.into_inner()),
        ))
    });
    let subs = Arc::new(Subscriptions::new(FeedContext {
        keys: keys.clone(),
        auth,
        tuning: tuning.clone(),
        metrics,
    }));
    let n = lines.len();
    subs.apply(lines).await;
    if n > 0 {
        tracing::info!("{n} feed subscriptions started");
    }
    if let Some(path) = config {
        reload_on_hangup(path, agent_dir.to_path_buf(), subs.clone())?;
    }
    Ok(subs)
}

fn reload_on_hangup(path: PathBuf, agent_dir: PathBuf, subs: Arc<Subscriptions>) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            let lines = AgentFile::read(&path).and_then(|f| f.feeds(&agent_dir));
            match lines {
                Ok(lines) => {
                    let a = subs.apply(lines).await;
                    tracing::info!(
                        "feeds of {} reloaded: {} started, {} stopped, {} unchanged",
                        path.display(),
                        a.started,
                        a.stopped,
                        a.kept
                    );
                }
                Err(e) => tracing::error!("{e:#}; the running feeds stay as they are"),
            }
        }
    });
    Ok(())
}
