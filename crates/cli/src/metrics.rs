//! `--metrics ADDR`: this process's Prometheus metrics over HTTP.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use bulkcast_runtime::metrics::{self, SourceMetrics};
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;

/// A running metrics endpoint. Every part of the process registers its metrics in
/// [`Endpoint::registry`] (the node's own are there from the start); it serves until dropped.
pub struct Endpoint {
    pub registry: Arc<Mutex<Registry>>,
    pub addr: std::net::SocketAddr,
    scraped: mpsc::UnboundedReceiver<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Endpoint {
    /// Listens on `addr` and serves `/metrics` with the node's metrics registered.
    pub async fn start(addr: &str) -> Result<Endpoint> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics: listening on {addr}"))?;
        let addr = listener.local_addr()?;
        let mut reg = Registry::with_prefix("bulkcast");
        metrics::global().register(&mut reg);
        let registry = Arc::new(Mutex::new(reg));
        let (tx, scraped) = mpsc::unbounded_channel();
        let task = tokio::spawn(metrics::serve(listener, registry.clone(), Some(tx)));
        Ok(Endpoint {
            registry,
            addr,
            scraped,
            task,
        })
    }

    /// Registers a send's metrics.
    pub fn source(&self) -> Arc<SourceMetrics> {
        SourceMetrics::new(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Says that the values are final from now on: scrapes before this one do not end
    /// [`Endpoint::linger`]. Call it before the report is out, so that a scraper that reads the
    /// report and scrapes at once is counted, however the two race.
    pub fn mark_final(&mut self) {
        while self.scraped.try_recv().is_ok() {}
    }

    /// Serves the final values until a scrape after [`Endpoint::mark_final`], or at most
    /// `limit`.
    pub async fn linger(mut self, limit: Duration) {
        if limit.is_zero() {
            return;
        }
        let _ = tokio::time::timeout(limit, self.scraped.recv()).await;
    }
}
