//! The runner behind `bench/streams-run` (issue 5, multi-stream edges): point-to-point streams
//! through `bulkcast pipe` (or stand-ins) on lab scenarios, printed as tables.
//!
//! - `static`: seed 002's static experiment. For each channel scenario, connection count and
//!   scheduler, one stream of a fixed size over the channels only (connection i on channel
//!   i mod P); throughput as a fraction of the channels' summed nominal capacity.
//! - `dynamic`: seed 002's dynamic experiment. One stream for `--secs` seconds while a channel
//!   alternates; per-second time series (CSV), mean fraction of capacity, re-convergence time
//!   after every step.
//! - `wan`: one path of 100 Mbit/s, 100 ms RTT, 0/1/5% loss; bulkcast pipe against iperf3.
//!
//! Every byte the receiver writes to stdout is checked against the seeded stream fed to the
//! sender. Rates are receiver-side: bytes delivered in order over the time from the sender's
//! start to the last byte. Tables go to stdout and `OUT/tables.txt`, one JSON line per run to
//! `OUT/runs.jsonl`, time series to `OUT/dynamic-*.csv`, and the senders' `--stats` files and
//! stderr to `OUT/logs/`.

mod dynamic;
mod pipe;
mod static_run;
mod wan;

use std::io::Write as _;
use std::path::PathBuf;

use bulkcast_lab::Scenario;
use clap::{Parser, Subcommand};
use serde_json::Value;

use dynamic::run_dynamic;
use static_run::run_static;
use wan::run_wan;

/// TCP's goodput ceiling on the lab's links: rates count IP bytes (1500-byte packets, 52 bytes
/// of IP and TCP headers with timestamps).
const GOODPUT_CEILING: f64 = 0.965;

#[derive(Parser)]
#[command(
    name = "streams-bench",
    about = "issue 5 benchmarks: multi-stream pipes on lab scenarios"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
    /// The bulkcast binary run in the hosts ({bulkcast} in templates).
    #[arg(long, global = true, default_value = "target/release/bulkcast")]
    bulkcast: PathBuf,
    /// Directory for tables, runs, time series and logs (default:
    /// target/streams-bench/<time>).
    #[arg(long, global = true)]
    out: Option<PathBuf>,
    /// Where scenario names are looked up.
    #[arg(long, global = true, default_value = "scenarios")]
    scenarios_dir: PathBuf,
    /// Replace bulkcast pipe by a stand-in to test the harness: `nc` (one connection on the
    /// first address, no scheduler).
    #[arg(long, global = true)]
    stand_in: Option<String>,
    /// Receiver command template (run with `sh -c exec ...` in the receiving host). Variables:
    /// {bulkcast} {port} {listen_args} {addr0} {addr0_ip}.
    #[arg(long, global = true)]
    recv_template: Option<String>,
    /// Sender command template. Variables: {bulkcast} {port} {addr0} {addr0_ip} {path_args}
    /// {opts} (--streams/--scheduler of the row) {stats_file} {stats_ms}.
    #[arg(long, global = true)]
    send_template: Option<String>,
    /// --stats-interval-ms passed to the sender.
    #[arg(long, global = true, default_value_t = 1000)]
    stats_ms: u64,
    /// First port; each run uses the next one.
    #[arg(long, global = true, default_value_t = 7600)]
    port: u16,
}

#[derive(Subcommand)]
enum Cmd {
    /// Seed 002 static: channel scenarios x connection counts x schedulers.
    Static {
        /// Scenarios (names in scenarios/ or files).
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "seed002-channels-20-10,seed002-channels-30-20-10,seed002-channels-300-200-100"
        )]
        scenarios: Vec<String>,
        /// Connection counts, e.g. `2-9` or `3,5,9` (default: from the number of channels P,
        /// at least 2, to 9; below P some channel carries nothing).
        #[arg(long)]
        counts: Option<String>,
        /// Schedulers (`--scheduler` values).
        #[arg(long, value_delimiter = ',', default_value = "equal,weighted,pull")]
        schedulers: Vec<String>,
        /// Seconds each run should take at the channels' summed nominal rate (sets the size).
        #[arg(long, default_value_t = 15.0)]
        secs: f64,
        /// Runs per cell (the table shows their mean).
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
    /// Seed 002 dynamic: one stream while a channel alternates.
    Dynamic {
        /// Scenarios with an alternating channel.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "seed002-dynamic,seed002-dynamic-100-200-300"
        )]
        scenarios: Vec<String>,
        /// `--streams` per scenario, in the same order (one value: for all). The paper used
        /// 4 (2 per channel) at 10+20|30 and 8 (4 per channel) at 100+200|300.
        #[arg(long, value_delimiter = ',', default_value = "4,8")]
        streams: Vec<String>,
        /// Schedulers.
        #[arg(long, value_delimiter = ',', default_value = "pull,weighted,equal")]
        schedulers: Vec<String>,
        /// Seconds of input (the stream ends after that).
        #[arg(long, default_value_t = 120.0)]
        secs: f64,
    },
    /// WAN hop: bulkcast pipe against iperf3 at 0/1/5% loss.
    Wan {
        /// Loss percentages: scenario wan-100m-100ms-loss<L> each.
        #[arg(long, value_delimiter = ',', default_value = "0,1,5")]
        losses: Vec<String>,
        /// Rows: pipe (default settings), pipe with options appended (`-streamsN`: N
        /// connections, `-chunkK`: K KiB chunks, `-cubic`), iperf3-cubic, iperf3-bbr,
        /// iperf3-p8-cubic, iperf3-p8-bbr.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "pipe,pipe-streams1,pipe-streams8,iperf3-cubic,iperf3-bbr,iperf3-p8-cubic,iperf3-p8-bbr"
        )]
        methods: Vec<String>,
        /// Seconds per run: iperf3 -t, and the pipe's size at the link rate. 30 rather than
        /// 15: the lab's forwarder runs seconds ahead or behind its schedule at times, which
        /// moves a 15-second figure by a few percent.
        #[arg(long, default_value_t = 30.0)]
        secs: f64,
    },
}

struct Ctx {
    args: Args,
    out: PathBuf,
    next_port: u16,
    runs: std::fs::File,
    tables: std::fs::File,
}

impl Ctx {
    fn port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p >= 65000 { self.args.port } else { p + 1 };
        p
    }

    fn print(&mut self, s: &str) {
        print!("{s}");
        let _ = std::io::stdout().flush();
        let _ = self.tables.write_all(s.as_bytes());
    }

    fn log(&mut self, v: Value) {
        let _ = writeln!(self.runs, "{v}");
    }

    fn scenario(&self, name: &str) -> Result<(PathBuf, Scenario), Box<dyn std::error::Error>> {
        let path = if name.contains('/') || name.ends_with(".toml") {
            PathBuf::from(name)
        } else {
            self.args.scenarios_dir.join(format!("{name}.toml"))
        };
        let sc = Scenario::load(&path)?;
        Ok((path, sc))
    }

    fn templates(&self) -> (String, String) {
        let (r, s) = match self.args.stand_in.as_deref() {
            Some("nc") => ("nc -l {port}", "nc -N {addr0_ip} {port}"),
            _ => (
                "{bulkcast} pipe recv {listen_args}",
                "{bulkcast} pipe send {addr0} {path_args} {opts} --quiet --json --stats {stats_file} --stats-interval-ms {stats_ms}",
            ),
        };
        (
            self.args.recv_template.clone().unwrap_or(r.into()),
            self.args.send_template.clone().unwrap_or(s.into()),
        )
    }
}

fn main() {
    let a = Args::parse();
    let out = a.out.clone().unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        PathBuf::from(format!("target/streams-bench/{t}"))
    });
    let r = (|| -> Result<(), Box<dyn std::error::Error>> {
        std::fs::create_dir_all(out.join("logs"))?;
        let out = std::fs::canonicalize(&out)?;
        let open = |f: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out.join(f))
        };
        let mut ctx = Ctx {
            next_port: a.port,
            runs: open("runs.jsonl")?,
            tables: open("tables.txt")?,
            out: out.clone(),
            args: a,
        };
        if ctx.args.stand_in.is_none() && ctx.args.recv_template.is_none() {
            let b = &ctx.args.bulkcast;
            let ok = std::process::Command::new(b)
                .args(["pipe", "--help"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if !ok {
                return Err(format!(
                    "{} has no `pipe` subcommand (yet): build the multi-stream CLI, or test the \
                     harness with --stand-in nc",
                    b.display()
                )
                .into());
            }
            ctx.args.bulkcast = std::fs::canonicalize(b)?;
        }
        eprintln!("streams-bench: results in {}", out.display());
        match std::mem::replace(
            &mut ctx.args.cmd,
            Cmd::Wan {
                losses: vec![],
                methods: vec![],
                secs: 0.0,
            },
        ) {
            Cmd::Static {
                scenarios,
                counts,
                schedulers,
                secs,
                repeat,
            } => run_static(
                &mut ctx,
                &scenarios,
                counts.as_deref(),
                &schedulers,
                secs,
                repeat.max(1),
            ),
            Cmd::Dynamic {
                scenarios,
                streams,
                schedulers,
                secs,
            } => run_dynamic(&mut ctx, &scenarios, &streams, &schedulers, secs),
            Cmd::Wan {
                losses,
                methods,
                secs,
            } => run_wan(&mut ctx, &losses, &methods, secs),
        }
    })();
    if let Err(e) = r {
        eprintln!("streams-bench: {e}");
        std::process::exit(2);
    }
}
