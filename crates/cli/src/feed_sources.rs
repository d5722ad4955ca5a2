//! `bulkcast feed insert --watch DIR` and `--stdin`: the product sources of an ingester
//! (the logic is in `bulkcast_runtime::feed::{watch, ingest}`).

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use bulkcast_runtime::feed::ingest::{insert_framed, FramedEvent, Target};
use bulkcast_runtime::feed::watch::{self, After, WatchConfig, WatchEvent, STATE_FILE};

use crate::feed::SourceArgs;

/// Watches `dir` until it fails; prints `SEQ NAME` per product inserted.
pub async fn run_watch(to: &Target<'_>, dir: &Path, a: &SourceArgs) -> Result<i32> {
    if !(a.settle.is_finite() && a.settle >= 0.0) {
        bail!("--settle must be a number of seconds >= 0");
    }
    let settle = Duration::from_secs_f64(a.settle);
    let after = match (&a.move_to, a.remove) {
        (Some(to), _) => After::MoveTo(to.clone()),
        (None, true) => After::Remove,
        (None, false) => After::Leave,
    };
    let cfg = WatchConfig {
        dir: dir.to_path_buf(),
        settle,
        // Scans often enough that a file waits little past its settle time.
        poll: (settle / 4).clamp(Duration::from_millis(50), Duration::from_millis(500)),
        after,
        state: a.state.clone().unwrap_or_else(|| dir.join(STATE_FILE)),
    };
    eprintln!(
        "bulkcast feed watching {} for {} products to {}",
        dir.display(),
        to.feedtype,
        to.server
    );
    watch::watch(to, &cfg, |e| match e {
        WatchEvent::Inserted { seq, name, .. } => println!("{seq} {name}"),
        WatchEvent::Skipped { name, error } => {
            eprintln!(
                "error: {}: {error} (not inserted until it changes)",
                dir.join(name).display()
            )
        }
        WatchEvent::SourceDown { error } => {
            eprintln!("warning: feed source {}: {error}; trying again", to.server)
        }
        WatchEvent::Warning { error } => eprintln!("warning: {error}"),
    })
    .await?;
    Ok(0)
}

/// Inserts the framed products on stdin; prints `SEQ NAME` per product inserted. Exit 1 if
/// any product was refused or the input stopped at a bad frame.
pub async fn run_stdin(to: &Target<'_>) -> Result<i32> {
    // A duplicate of fd 0 read on tokio's blocking pool (works for pipes, files and ttys).
    let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
    let stdin = tokio::fs::File::from_std(std::fs::File::from(fd));
    let mut input = tokio::io::BufReader::with_capacity(1 << 20, stdin);
    let mut refused = 0u64;
    let r = insert_framed(to, &mut input, |e| match e {
        FramedEvent::Inserted { seq, name } => println!("{seq} {name}"),
        FramedEvent::Refused { name, reason } => {
            refused += 1;
            eprintln!("error: product {name:?}: refused by the feed source: {reason}");
        }
        FramedEvent::Retrying { name, error } => {
            eprintln!(
                "warning: product {name:?}: feed source {}: {error}; trying again",
                to.server
            )
        }
    })
    .await;
    match r {
        Ok(n) => {
            eprintln!("{n} products inserted from stdin");
            Ok(if refused > 0 { 1 } else { 0 })
        }
        Err(e) => {
            eprintln!("error: stdin: {e}");
            Ok(1)
        }
    }
}
