//! `send --web ADDR`: one live page of the send, served from the binary (no build step, no
//! CDN): receivers grouped by site with progress, rate and ETA, every edge's rate, failures
//! in red, and the final report at the end. Updates go out as server-sent events.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bulkcast_runtime::live::Sessions;
use bulkcast_runtime::metrics::request_path;
use bulkcast_runtime::source::SharedStatus;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

const PAGE: &str = include_str!("web/index.html");
/// `agent --web`'s page.
const AGENT_PAGE: &str = include_str!("web/agent.html");
/// How often the page is updated.
const EVERY: Duration = Duration::from_millis(500);

/// What the page shows, shared with the send.
pub struct Live {
    status: SharedStatus,
    /// Each receiver's site ("" for none), in the order of the status.
    sites: Vec<String>,
    object: String,
    strategy: String,
    /// The final report, once there is one.
    report: Mutex<Option<String>>,
    /// Pages that were sent the final report.
    delivered: tokio::sync::watch::Sender<usize>,
}

/// What a page server shows: a send, or an agent's sessions.
enum Shown {
    Send(Arc<Live>, Arc<std::sync::atomic::AtomicUsize>),
    Agent(Arc<AgentLive>),
}

/// An agent's page: where it is, and its sessions.
struct AgentLive {
    host: String,
    listen: String,
    dir: String,
    sessions: Sessions,
}

/// `agent --web`'s page server; stops when dropped.
pub struct AgentPage {
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for AgentPage {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl AgentPage {
    /// Serves the page of an agent's `sessions` on `addr`; `listen` and `dir` are shown.
    pub async fn start(addr: &str, sessions: Sessions, listen: &str, dir: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("--web: listening on {addr}"))?;
        let shown = Arc::new(Shown::Agent(Arc::new(AgentLive {
            host: crate::progress::hostname(),
            listen: listen.into(),
            dir: dir.into(),
            sessions,
        })));
        Ok(AgentPage {
            addr: listener.local_addr()?,
            task: tokio::spawn(serve(listener, shown)),
        })
    }
}

/// A running page server; stops when dropped.
pub struct Page {
    live: Arc<Live>,
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
    clients: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Page {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Page {
    /// Serves the page of `status` on `addr`.
    pub async fn start(
        addr: &str,
        status: SharedStatus,
        sites: Vec<String>,
        object: &str,
        strategy: &str,
    ) -> Result<Page> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("--web: listening on {addr}"))?;
        let live = Arc::new(Live {
            status,
            sites,
            object: object.into(),
            strategy: strategy.into(),
            report: Mutex::new(None),
            delivered: tokio::sync::watch::channel(0).0,
        });
        let clients = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        Ok(Page {
            addr: listener.local_addr()?,
            task: tokio::spawn(serve(
                listener,
                Arc::new(Shown::Send(live.clone(), clients.clone())),
            )),
            live,
            clients,
        })
    }

    /// The send is over: pages show `report`. Waits (at most `limit`) until every open page
    /// has it.
    pub async fn finish(self, report: String, limit: Duration) {
        *self.live.report.lock().expect("report") = Some(report);
        let mut rx = self.live.delivered.subscribe();
        let clients = self.clients.clone();
        let all = async move {
            while *rx.borrow_and_update() < clients.load(std::sync::atomic::Ordering::SeqCst) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
    }
}

async fn serve(listener: TcpListener, shown: Arc<Shown>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let shown = shown.clone();
        tokio::spawn(async move {
            let _ = answer(conn, &shown).await;
        });
    }
}

async fn answer(mut conn: TcpStream, shown: &Shown) -> std::io::Result<()> {
    let Ok(Some(target)) =
        tokio::time::timeout(Duration::from_secs(5), request_path(&mut conn)).await
    else {
        return Ok(());
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    // `?hold=MS` (at most 10 s): the page's load event waits that long, on an image the
    // server answers late, so a headless browser that dumps the page at load (`chromium
    // --dump-dom`) shows it after MS of live updates.
    let hold = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("hold="))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|ms| ms.min(10_000));
    let head = |status: &str, kind: &str| {
        format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n")
    };
    match path {
        "/" | "/index.html" => {
            conn.write_all(head("200 OK", "text/html; charset=utf-8").as_bytes())
                .await?;
            let page = match shown {
                Shown::Send(..) => PAGE,
                Shown::Agent(_) => AGENT_PAGE,
            };
            let page = match hold {
                Some(ms) => page.replace(
                    "</body>",
                    &format!("<img hidden alt=\"\" src=\"/hold?hold={ms}\">\n</body>"),
                ),
                None => page.to_string(),
            };
            conn.write_all(page.as_bytes()).await?;
        }
        "/hold" => {
            tokio::time::sleep(Duration::from_millis(hold.unwrap_or(0))).await;
            conn.write_all(head("204 No Content", "text/plain").as_bytes())
                .await?;
        }
        "/events" => {
            conn.write_all(head("200 OK", "text/event-stream").as_bytes())
                .await?;
            match shown {
                Shown::Send(live, clients) => {
                    clients.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let r = events(&mut conn, live).await;
                    clients.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    live.delivered.send_modify(|_| {});
                    r?;
                }
                Shown::Agent(a) => agent_events(&mut conn, a).await?,
            }
        }
        _ => {
            conn.write_all(head("404 Not Found", "text/plain").as_bytes())
                .await?;
        }
    }
    conn.shutdown().await
}

/// A snapshot every [`EVERY`] until the report, which ends the stream.
async fn events(conn: &mut TcpStream, live: &Live) -> std::io::Result<()> {
    let mut rates = Rates::default();
    loop {
        let report = live.report.lock().expect("report").clone();
        let snap = snapshot(live, &mut rates);
        conn.write_all(format!("data: {snap}\n\n").as_bytes())
            .await?;
        if let Some(r) = report {
            let one_line: Value = serde_json::from_str(&r).unwrap_or(Value::Null);
            conn.write_all(format!("event: report\ndata: {one_line}\n\n").as_bytes())
                .await?;
            conn.flush().await?;
            live.delivered.send_modify(|n| *n += 1);
            return Ok(());
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// An agent's sessions every [`EVERY`], for as long as the page is open (an agent runs on):
/// the running ones with their current rate, the finished ones with their outcome.
async fn agent_events(conn: &mut TcpStream, a: &AgentLive) -> std::io::Result<()> {
    let mut rates = Rates::default();
    loop {
        let now = Instant::now();
        let mut kept = std::collections::HashSet::new();
        let sessions: Vec<Value> = a
            .sessions
            .views()
            .into_iter()
            .map(|v| {
                let key = format!("{}@{}", v.session, v.started_unix);
                kept.insert(key.clone());
                let rate = if v.state == "running" {
                    let start = now - Duration::from_secs_f64(v.seconds);
                    rates.update(key, v.bytes, start)
                } else {
                    0.0
                };
                let mut j = json!(v);
                j["rate_mbps"] = json!(rate);
                j
            })
            .collect();
        // Forget the rates of sessions no longer kept.
        rates.0.retain(|k, _| kept.contains(k));
        let snap = json!({
            "host": a.host, "listen": a.listen, "dir": a.dir, "sessions": sessions,
        });
        conn.write_all(format!("data: {snap}\n\n").as_bytes())
            .await?;
        tokio::time::sleep(EVERY).await;
    }
}

/// Per receiver (or session): (time, bytes) of the last snapshot, and the rate then.
struct Rates<K = usize>(HashMap<K, (Instant, u64, f64)>);

impl<K> Default for Rates<K> {
    fn default() -> Self {
        Rates(HashMap::new())
    }
}

impl<K: std::hash::Hash + Eq> Rates<K> {
    /// The rate since the last call (the first: since `start`), in Mbit/s, a little smoothed.
    fn update(&mut self, i: K, bytes: u64, start: Instant) -> f64 {
        let now = Instant::now();
        let e = self.0.entry(i).or_insert((start, 0, 0.0));
        if e.2 == 0.0 && e.1 == 0 {
            // The first rate is the average so far, not half of it.
            let secs = now.duration_since(e.0).as_secs_f64();
            if secs > 0.0 {
                e.2 = bytes as f64 * 8.0 / secs / 1e6;
                *e = (now, bytes, e.2);
                return e.2;
            }
        }
        let secs = now.duration_since(e.0).as_secs_f64();
        if secs >= 0.2 {
            let fresh = bytes.saturating_sub(e.1) as f64 * 8.0 / secs / 1e6;
            *e = (now, bytes, 0.5 * e.2 + 0.5 * fresh);
        }
        e.2
    }
}

fn snapshot(live: &Live, rates: &mut Rates) -> Value {
    let st = live.status.lock().expect("status");
    let name = |i: usize| match i {
        0 => "source".to_string(),
        i => st.receivers[i - 1].name.clone(),
    };
    let elapsed = st.started.elapsed().as_secs_f64();
    let mut receivers = Vec::new();
    let mut edges = Vec::new();
    let (mut done, mut failed, mut sum) = (0, 0, 0u64);
    for (i, r) in st.receivers.iter().enumerate() {
        let bytes = st.bytes_of(r);
        sum += bytes;
        let state = match (&r.failed, r.done) {
            (Some(_), _) => "failed",
            (None, Some(_)) => "done",
            _ => "running",
        };
        done += usize::from(state == "done");
        failed += usize::from(state == "failed");
        let rate = if state == "running" {
            rates.update(i, bytes, st.started)
        } else {
            0.0
        };
        let eta = st
            .total_len
            .filter(|_| rate > 0.0)
            .map(|t| t.saturating_sub(bytes) as f64 * 8.0 / (rate * 1e6));
        receivers.push(json!({
            "name": r.name, "site": live.sites.get(i).cloned().unwrap_or_default(),
            "parent": name(r.parent), "bytes": bytes, "rate_mbps": rate, "eta_s": eta,
            "state": state, "error": r.failed,
        }));
        edges.push(json!({
            "from": name(r.parent), "to": r.name, "rate_mbps": rate,
            "failed": state == "failed",
        }));
    }
    json!({
        "object": live.object, "strategy": live.strategy, "total": st.total_len,
        "elapsed_s": elapsed, "done": done, "failed": failed,
        "aggregate_mbps": sum as f64 * 8.0 / elapsed.max(1e-3) / 1e6,
        "receivers": receivers, "edges": edges,
    })
}
