//! `bulkcast plan` (a send's own plan is the library's: `bulkcast_runtime::api::plan_push`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_planner::{bound, plan, Algorithm, Matrix, Network, PlanOptions};
use bulkcast_proto::auth::Secret;
use bulkcast_proto::hosts::HostsFile;
use bulkcast_runtime::api;
use bulkcast_runtime::measure;
use bulkcast_runtime::probe;
use clap::Args;

use crate::Common;

#[derive(Args)]
pub struct PlanArgs {
    /// Hosts: a hosts file (TOML) or `host:port,host:port`. A hosts file's
    /// `ssh = "user@host[:port]"` hosts get one-shot agents over ssh for the probe, as `send`
    /// starts them (see `--ssh-*`), stopped after it.
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
    ssh: crate::ssh::SshArgs,
    #[command(flatten)]
    common: Common,
}

pub async fn run(a: PlanArgs) -> Result<i32> {
    let mut hosts = api::load_hosts(&a.hosts)?;
    let matrices = match &a.matrix {
        Some(p) => api::read_matrix(p)?,
        None => {
            // The `ssh` hosts' one-shot agents live until the probes are done.
            let (agents, secret) = ssh_agents(&a, &mut hosts).await?;
            let keys = a.common.keys(&secret)?;
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
            if let Some(agents) = agents {
                agents.stop().await;
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

/// Starts one-shot agents for the `ssh` hosts of `hosts` (putting their addresses in), and
/// gives the session secret to probe with.
async fn ssh_agents(
    a: &PlanArgs,
    hosts: &mut HostsFile,
) -> Result<(Option<bulkcast_runtime::ssh::Agents>, Secret)> {
    let targets = bulkcast_runtime::ssh::file_targets(hosts)?;
    if targets.is_empty() {
        return Ok((None, a.common.require_secret()?));
    }
    let all_ours = hosts.hosts.iter().all(|h| h.ssh.is_some());
    let secret = crate::ssh::secret(&a.common, all_ours)?;
    let (agents, file) =
        crate::ssh::start_for_file(hosts.clone(), &targets, &a.ssh, &secret).await?;
    *hosts = file;
    Ok((Some(agents), secret))
}
