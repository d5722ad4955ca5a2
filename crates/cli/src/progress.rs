//! Progress displays (stderr, only on a terminal) and formatting helpers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bulkcast_runtime::metrics::SourceMetrics;
use bulkcast_runtime::report::Timeline;
use bulkcast_runtime::source::SharedStatus;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::task::JoinHandle;

/// Draws the sender's progress until aborted: the bar follows the slowest receiver, the message
/// names the slowest and fastest and the aggregate rate.
pub fn sender(status: SharedStatus) -> JoinHandle<()> {
    tokio::spawn(async move {
        let total = status.lock().expect("status").total_len;
        let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        let style = match total {
            Some(_) => {
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ETA {eta} {msg}"
            }
            None => "{spinner} [{elapsed_precise}] {bytes} {msg}",
        };
        bar.set_style(ProgressStyle::with_template(style).expect("template"));
        loop {
            {
                let st = status.lock().expect("status");
                let live: Vec<_> = st.receivers.iter().filter(|r| r.failed.is_none()).collect();
                let slowest = live.iter().min_by_key(|r| r.chunks);
                let fastest = live.iter().max_by_key(|r| r.chunks);
                let secs = st.started.elapsed().as_secs_f64().max(1e-3);
                let agg: u64 = st.receivers.iter().map(|r| st.bytes_of(r)).sum();
                if let (Some(s), Some(f)) = (slowest, fastest) {
                    bar.set_position(st.bytes_of(s));
                    bar.set_message(format!(
                        "{} rx | slowest {} | fastest {} {} | {:.1} Mbit/s aggregate{}",
                        live.len(),
                        s.name,
                        f.name,
                        human_bytes(st.bytes_of(f)),
                        agg as f64 * 8.0 / secs / 1e6,
                        match st.receivers.len() - live.len() {
                            0 => String::new(),
                            n => format!(" | {n} failed"),
                        }
                    ));
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// A receiver's display: bytes verified and stored, and the rate (stderr, terminal only).
pub fn receiver(name: &str, stored: Arc<AtomicU64>) -> ProgressBar {
    let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    b.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bytes} verified {msg}")
            .expect("template"),
    );
    b.set_message(format!("as {name}"));
    let bar = b.clone();
    let name = name.to_string();
    tokio::spawn(async move {
        let start = std::time::Instant::now();
        while !bar.is_finished() {
            let n = stored.load(Ordering::Relaxed);
            bar.set_position(n);
            // Mbit/s, the unit of the sender's report.
            let secs = start.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!(
                "({:.1} Mbit/s) as {name}",
                n as f64 * 8.0 / secs / 1e6
            ));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    b
}

/// Runs `work` under the sender's progress display (none when `quiet`) and clears the display
/// after; meanwhile samples every receiver's progress into the report's timeline. `None` if
/// Ctrl-C or SIGTERM came first (the work is dropped).
pub async fn sending<T>(
    status: SharedStatus,
    quiet: bool,
    metrics: Option<Arc<SourceMetrics>>,
    work: impl std::future::Future<Output = T>,
) -> Option<(T, Timeline)> {
    let display = (!quiet).then(|| sender(status.clone()));
    let mut timeline = Timeline::default();
    tokio::pin!(work);
    let r = loop {
        let tick = tokio::time::sleep(timeline.interval());
        tokio::select! {
            r = &mut work => break Some(r),
            _ = crate::shutdown_signal() => break None,
            _ = tick => sample(&status, &mut timeline, metrics.as_deref()),
        }
    };
    // The end state, so every series ends where the report does.
    sample(&status, &mut timeline, metrics.as_deref());
    if let Some(d) = display {
        d.abort();
        clear();
    }
    r.map(|r| (r, timeline))
}

fn sample(status: &SharedStatus, timeline: &mut Timeline, metrics: Option<&SourceMetrics>) {
    let st = status.lock().expect("status");
    timeline.sample(&st);
    if let Some(m) = metrics {
        m.observe(&st);
    }
}

/// Erases a progress line left by an aborted display.
pub fn clear() {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K");
    }
}

/// 1536 -> "1.5 KiB".
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[u])
    }
}

/// This host's name, for display.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}
