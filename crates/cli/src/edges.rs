//! Options for multi-stream edges, shared by `send` and `pipe send`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bulkcast_proto::wire::{EdgeMode, EdgeScheduler};
use bulkcast_runtime::edge::{EdgeStreams, StreamsObserver};
use clap::{Args, ValueEnum};

/// How every edge is carried.
#[derive(Args, Clone)]
pub struct EdgeArgs {
    /// Parallel connections per edge: a number (1-64), or `auto`. With `--cc bbr` (the default
    /// where the kernel has it) and one address per host, `auto` is one connection per edge: bbr
    /// keeps a path full alone, under loss too. Otherwise, over TCP, `auto` is one per 20 ms of
    /// round trip to start, 1-8 and at least one per path, then one more at a time while the
    /// last one added raised the edge's rate by 10%, up to 8. Over `--transport udp` it is one
    /// (a paced connection keeps its rate under loss by itself; give a number to spread an edge
    /// over several paths).
    #[arg(long, default_value = "auto")]
    streams: String,
    /// How frames are dealt to the connections of an edge.
    #[arg(long, value_enum, default_value_t = SchedulerArg::Pull)]
    scheduler: SchedulerArg,
    /// Append the connections' rates and weights of every spread edge of the source to this
    /// file as JSON lines (a time series to plot).
    #[arg(long)]
    stats: Option<PathBuf>,
    /// Interval of `--stats` and `-v` lines, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(50..))]
    stats_interval_ms: u64,
    /// Print the connections' rates and weights on stderr at every interval.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SchedulerArg {
    /// Each connection takes the next frame when its socket has room (self-clocking; the
    /// default, measured best).
    Pull,
    /// Seed 002's weighted fork-join with its sojourn-time controller (the reference).
    Weighted,
    /// Seed 002's unweighted fork-join, equal blocks (the baseline).
    Equal,
}

impl EdgeArgs {
    /// The mode every edge of the session uses.
    pub fn mode(&self) -> Result<EdgeMode> {
        let streams = match self.streams.as_str() {
            // The edge decides once connection 0 is up: grows over TCP, stays at one paced
            // connection.
            "auto" => 0,
            n => match n.parse::<u16>() {
                Ok(k @ 1..=64) => k,
                _ => bail!("--streams must be auto or a number from 1 to 64, not {n:?}"),
            },
        };
        Ok(EdgeMode {
            streams,
            scheduler: match self.scheduler {
                SchedulerArg::Pull => EdgeScheduler::Pull,
                SchedulerArg::Weighted => EdgeScheduler::Weighted,
                SchedulerArg::Equal => EdgeScheduler::Equal,
            },
        })
    }

    /// What `--stats` and `-v` ask for, if anything.
    pub fn observer(&self) -> Result<Option<StreamsObserver>> {
        if self.stats.is_none() && !self.verbose {
            return Ok(None);
        }
        let file = match &self.stats {
            Some(p) => Some(Mutex::new(std::io::BufWriter::new(
                std::fs::File::create(p)
                    .with_context(|| format!("creating stats file {}", p.display()))?,
            ))),
            None => None,
        };
        let verbose = self.verbose;
        let start = Instant::now();
        let f = move |edges: &[EdgeStreams]| {
            let t = start.elapsed().as_secs_f64();
            for e in edges {
                if let Some(file) = &file {
                    let mut line = serde_json::json!({ "t_s": (t * 1000.0).round() / 1000.0 });
                    if let (Some(obj), Ok(serde_json::Value::Object(more))) =
                        (line.as_object_mut(), serde_json::to_value(e))
                    {
                        obj.extend(more);
                    }
                    let mut w = file.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = writeln!(w, "{line}").and_then(|_| w.flush());
                }
                if verbose {
                    eprintln!("{}", describe(t, e));
                }
            }
        };
        Ok(Some(StreamsObserver {
            every: Duration::from_millis(self.stats_interval_ms),
            f: Arc::new(f),
        }))
    }
}

/// One line per edge: its total and each live connection's rate and weight.
pub fn describe(t: f64, e: &EdgeStreams) -> String {
    let conns: Vec<String> = e
        .conns
        .iter()
        .filter(|c| c.alive)
        .map(|c| {
            format!(
                "#{} {:.1} Mbit/s w {:.2} ({} in flight)",
                c.conn, c.mbps, c.weight, c.inflight
            )
        })
        .collect();
    format!(
        "[{t:7.1} s] edge to {}: {:.1} Mbit/s over {} connections: {}",
        e.edge,
        e.total_mbps,
        conns.len(),
        conns.join(", ")
    )
}
