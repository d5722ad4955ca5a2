//! `bulkcast plan`, and the measured plan `send --strategy tree` uses by default.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_node::api;
use bulkcast_node::measure::{self, ProbeCache};
use bulkcast_node::probe;
use bulkcast_node::transport::TcpTuning;
use bulkcast_planner::{bound, plan, Algorithm, Matrix, MatrixFile, Network, PlanOptions};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostsFile;
use clap::Args;

use crate::send::load_hosts;
use crate::Common;

#[derive(Args)]
pub struct PlanArgs {
    /// Hosts: a hosts file (TOML) or `host:port,host:port`.
    #[arg(long)]
    hosts: String,
    /// A matrix file (TOML: nodes, rtt_ms, optional bandwidth_mbps and `[[wan]]`) instead of
    /// probing the agents.
    #[arg(long)]
    matrix: Option<PathBuf>,
    /// mst, dcmst, bottleneck, cluster, balanced or auto.
    #[arg(long, default_value = "auto")]
    algo: String,
    /// Object size the completion time is predicted for, in MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Write the plan as OUT.dot and OUT.svg.
    #[arg(long, default_value = "plan")]
    out: PathBuf,
    /// Save the probed matrix here (reusable with --matrix).
    #[arg(long)]
    save_matrix: Option<PathBuf>,
    /// Echoes per probed pair (the median counts).
    #[arg(long, default_value_t = 5)]
    samples: u16,
    /// Also measure the achievable rate of every directed pair (n rounds of --probe-secs in
    /// which every host sends one probe and receives one; the cost is printed first).
    #[arg(long)]
    probe_bandwidth: bool,
    /// Seconds per bandwidth probe round.
    #[arg(long, default_value_t = 1.0)]
    probe_secs: f64,
    #[command(flatten)]
    common: Common,
}

pub async fn run(a: PlanArgs) -> Result<i32> {
    let hosts = load_hosts(&a.hosts)?;
    let matrices = match &a.matrix {
        Some(p) => read_matrix(p)?,
        None => {
            let keys = a.common.keys(&a.common.require_secret()?)?;
            let tuning = a.common.tuning()?;
            let (mut m, note) = measure::probe_now(&hosts, &keys, &tuning, a.samples).await?;
            eprintln!("{note}");
            if a.probe_bandwidth {
                if !(a.probe_secs > 0.0 && a.probe_secs <= 10.0) {
                    bail!("--probe-secs must be in (0, 10]");
                }
                let n = hosts.hosts.len();
                eprintln!(
                    "bandwidth probe: {n} rounds of {:.1} s ({} directed pairs, every host sending and receiving one probe at a time): about {:.0} s",
                    a.probe_secs,
                    n * n,
                    n as f64 * a.probe_secs
                );
                let bw = probe::bandwidth(
                    &hosts.hosts,
                    &keys,
                    &tuning,
                    Duration::from_secs_f64(a.probe_secs),
                )
                .await;
                let mut mx = Matrix::filled(n + 1, f64::INFINITY);
                let mut missing = 0;
                for (i, row) in bw.iter().enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        match v {
                            Some(v) => mx.set(i, j, *v),
                            None if i != j && j != 0 => missing += 1,
                            None => {}
                        }
                    }
                }
                if missing > 0 {
                    eprintln!("warning: {missing} pairs could not be measured (left unlimited)");
                }
                m.bandwidth_mbps = Some(mx);
            }
            m
        }
    };
    if let Some(p) = &a.save_matrix {
        std::fs::write(p, matrices.to_toml())
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let net = Network::from_hosts(&hosts, &matrices)?;
    print!("{}", net.render_matrices());
    let algo: Algorithm = a.algo.parse()?;
    let opts = PlanOptions::default().with_object(a.size_mib << 20, 1 << 20)?;
    let b = bound(&net)?;
    let p = plan(&net, algo, &opts)?;
    println!();
    print!("{}", p.render_text(&net, Some(&b)));
    let dot = a.out.with_extension("dot");
    let svg = a.out.with_extension("svg");
    std::fs::write(&dot, p.to_dot(&net)).with_context(|| format!("writing {}", dot.display()))?;
    std::fs::write(&svg, p.to_svg(&net)).with_context(|| format!("writing {}", svg.display()))?;
    eprintln!("wrote {} and {}", dot.display(), svg.display());
    Ok(0)
}

fn read_matrix(p: &std::path::Path) -> Result<MatrixFile> {
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    MatrixFile::parse_toml(&text).with_context(|| format!("matrix file {}", p.display()))
}

/// The plan for a send: the RTT matrix from `matrix` (a file), the probe cache, or probed now;
/// then the planner's push plan over the hosts that answered the probe
/// ([`bulkcast_node::api::plan_push_with`], which the library's `Send` uses too).
#[allow(clippy::too_many_arguments)]
pub async fn for_send(
    hosts: &HostsFile,
    matrix: Option<&std::path::Path>,
    keys: &Keys,
    tuning: &TcpTuning,
    cache: Option<&ProbeCache>,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<SendPlan> {
    let m = match matrix {
        Some(path) => Some((
            read_matrix(path)?,
            format!("matrix from {}", path.display()),
        )),
        None => None,
    };
    let m = m.as_ref().map(|(m, note)| (m, note.clone()));
    Ok(api::plan_push_with(hosts, m, keys, tuning, cache, size, chunk, balanced).await?)
}

/// What [`for_send`] decided.
pub type SendPlan = api::PlannedPush;
