//! `bulkcast pipe send` / `bulkcast pipe recv`: one stream from one host to another, over
//! parallel connections and paths, in order and verified.
//!
//! It is a session with one receiver: the same frames, verification and flow control as
//! `send`, with the receiver writing to stdout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::node::CHUNK_SIZE_RANGE;
use bulkcast_proto::tree::Tree;
use bulkcast_runtime::agent;
use bulkcast_runtime::input::Input;
use bulkcast_runtime::source::{self, SendConfig};
use clap::{Args, Subcommand};

use crate::edges::EdgeArgs;
use crate::{listen_all, progress, shutdown_signal, Common, TransportArg};

#[derive(Subcommand)]
pub enum PipeCmd {
    /// Stream stdin to a `pipe recv` (or an agent) at ADDR.
    Send(PipeSendArgs),
    /// Receive one stream and write it to stdout, in order, as it is verified.
    Recv(PipeRecvArgs),
}

#[derive(Args)]
pub struct PipeSendArgs {
    /// The receiver's address (`host:port`).
    addr: String,
    /// A further address of the same receiver (another network path); repeat for more.
    /// Connection i goes to address i mod P of [ADDR, --path...].
    #[arg(long = "path")]
    paths: Vec<String>,
    /// Name of the stream (what an agent stores it as).
    #[arg(long, default_value = "pipe")]
    name: String,
    /// Chunk size in KiB.
    #[arg(long, default_value_t = 256)]
    chunk_kib: u32,
    /// Seconds without progress after which the receiver is given up.
    #[arg(long, default_value_t = 30)]
    stall_timeout: u64,
    /// Print the report (bytes, time, rate, every connection) as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress display.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    edges: EdgeArgs,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct PipeRecvArgs {
    /// Address to listen on; repeat it for several (this host's path addresses).
    #[arg(long, default_value = "0.0.0.0:7400")]
    listen: Vec<String>,
    #[command(flatten)]
    common: Common,
}

pub async fn run(cmd: PipeCmd) -> Result<i32> {
    match cmd {
        PipeCmd::Send(a) => send(a).await,
        PipeCmd::Recv(a) => recv(a).await,
    }
}

async fn send(a: PipeSendArgs) -> Result<i32> {
    let chunk_size = a
        .chunk_kib
        .checked_mul(1024)
        .filter(|c| CHUNK_SIZE_RANGE.contains(c))
        .with_context(|| {
            format!(
                "--chunk-kib must be between {} and {}",
                CHUNK_SIZE_RANGE.start() / 1024,
                CHUNK_SIZE_RANGE.end() / 1024
            )
        })?;
    let secret = a.common.require_secret()?;
    let tuning = a.common.tuning_or(TransportArg::Auto)?;
    let mode = a.edges.mode()?;
    let input = Input::open(std::path::Path::new("-"), Some(&a.name))?;
    let host = HostSpec {
        paths: a.paths.clone(),
        ..HostSpec::from_addr(&a.addr)
    };
    let hosts = vec![host];
    let tree = Tree::flat(1);
    let cfg = SendConfig {
        chunk_size,
        stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
        node: a.common.node(),
        tuning,
        strategy: "pipe".into(),
        edges: mode,
        observer: a.edges.observer()?,
        uplink_mbps: None,
    };
    let status = source::new_status(&hosts, &tree, chunk_size, None);
    let session: u64 = rand::random();
    let work = source::send(
        input,
        &hosts,
        &tree,
        a.common.keys(&secret)?,
        session,
        &cfg,
        status.clone(),
    );
    let Some((result, _)) = progress::sending(status.clone(), a.quiet, None, work).await else {
        bail!("interrupted");
    };
    let report = result?;
    let rx = &report.receivers[0];
    let edge = report.edges.first();
    let conns = edge.map(|e| e.connections.clone()).unwrap_or_default();
    let hedges = edge.map_or(0, |e| e.hedges);
    if a.json {
        let out = serde_json::json!({
            "bytes": report.object.bytes,
            "seconds": report.seconds,
            "mbps": rx.rate_mbps,
            "verified": rx.verified,
            "streams": conns.len().max(1),
            // When the first connection passed the handshake: what set-up cost before data.
            "connected_s": conns.first().and_then(|c| c.opened_s),
            "scheduler": format!("{:?}", mode.scheduler).to_lowercase(),
            "transport": edge.and_then(|e| e.transport.clone()),
            "hedges": hedges,
            "connections": conns,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if !a.quiet || !rx.verified {
        eprintln!(
            "{} in {:.2} s: {:.1} Mbit/s over {} connection{}{}",
            progress::human_bytes(report.object.bytes),
            report.seconds,
            rx.rate_mbps,
            conns.len().max(1),
            if conns.len() > 1 { "s" } else { "" },
            match &rx.error {
                Some(e) => format!("; FAILED: {e}"),
                None => String::new(),
            }
        );
    }
    Ok(if report.ok { 0 } else { 1 })
}

async fn recv(a: PipeRecvArgs) -> Result<i32> {
    let secret = a.common.require_secret()?;
    let tuning = a.common.tuning()?;
    let (listeners, addrs) = listen_all(&a.listen, &tuning).await?;
    // stdout is the stream: where we listen goes to stderr, first line (scripts read it).
    eprintln!("bulkcast pipe listening on {addrs}");
    let cfg = Arc::new(
        a.common
            .agent_config(PathBuf::from("."), &secret, tuning, true)?,
    );
    match agent::serve(listeners, cfg, true, shutdown_signal()).await {
        Some(Ok(_)) => Ok(0),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            Ok(1)
        }
        None => {
            eprintln!("interrupted");
            Ok(130)
        }
    }
}
