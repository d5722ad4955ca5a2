//! `bulkcast plan`, and the measured plan `send --strategy tree` uses by default.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_node::probe;
use bulkcast_node::transport::TcpTuning;
use bulkcast_planner::vivaldi::{self, Sample, VivaldiConfig};
use bulkcast_planner::{bound, plan, Algorithm, Matrix, MatrixFile, Network, Plan, PlanOptions};
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
            let keys = Keys::derive(&a.common.require_secret()?);
            let tuning = a.common.tuning()?;
            let (mut m, note) = measure(&hosts, &keys, &tuning, a.samples).await?;
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

/// Probes the agents and returns the RTT matrix (full up to 64 hosts, Vivaldi-completed above)
/// with a line that says what was measured.
pub async fn measure(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
) -> Result<(MatrixFile, String)> {
    let specs = &hosts.hosts;
    let n = specs.len() + 1;
    // Pairs among hosts (node ids shifted by one: node 0 is the source, probed by us).
    let pairs = vivaldi::probe_pairs(n, 8, 1);
    let full = pairs.len() == n * (n - 1) / 2;
    let mut targets = vec![Vec::new(); specs.len()];
    for &(a, b) in &pairs {
        if a > 0 && b > 0 {
            targets[a - 1].push(b - 1);
            if full {
                targets[b - 1].push(a - 1); // both directions, averaged below
            }
        }
    }
    let deadline = Duration::from_secs(5);
    let m = probe::matrix(specs, &targets, keys, tuning, samples, deadline).await;
    if m.errors.len() == specs.len() {
        bail!(
            "no agent could be probed: {}",
            m.errors
                .iter()
                .map(|e| e.1.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let mut samples_v = Vec::new();
    for i in 0..n {
        for j in 0..n {
            if i != j {
                if let Some(v) = m.rtt_ms[i][j] {
                    samples_v.push(Sample {
                        a: i,
                        b: j,
                        rtt_ms: v.max(0.001),
                    });
                }
            }
        }
    }
    let (rtt, note) = if full && m.errors.is_empty() && samples_v.len() == n * (n - 1) {
        // Every directed pair measured: symmetric mean per pair.
        let mut rtt = Matrix::filled(n, 0.0);
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    let (x, y) = (m.rtt_ms[i][j].unwrap_or(0.0), m.rtt_ms[j][i].unwrap_or(0.0));
                    rtt.set(i, j, (x + y) / 2.0);
                }
            }
        }
        (rtt, format!("probed all {} pairs of {} nodes, the source included (median of {samples} echoes each)", n * (n - 1) / 2, n))
    } else {
        let (rtt, coords) = vivaldi::complete(n, &samples_v, VivaldiConfig::default());
        let err = vivaldi::median_relative_error(&coords, &samples_v);
        let mut note = format!(
            "probed {} directed pairs of {} nodes; the rest estimated with Vivaldi coordinates (median relative error on probed pairs {:.1}%)",
            samples_v.len(),
            n,
            err * 100.0
        );
        for (i, e) in &m.errors {
            note += &format!("\nwarning: could not probe node {i}: {e}");
        }
        (rtt, note)
    };
    let source = hosts.source.clone().unwrap_or_default();
    let mut nodes = vec![if source.name.is_empty() {
        "source".to_string()
    } else {
        source.name
    }];
    nodes.extend(specs.iter().map(|h| h.name.clone()));
    Ok((
        MatrixFile {
            nodes,
            rtt_ms: rtt,
            bandwidth_mbps: None,
            wan: Vec::new(),
        },
        note,
    ))
}

/// The plan for a send: probe (or read `matrix`), then plan.
///
/// - `balanced`: the planner's multi-trees; they need capacities in the hosts file or matrix.
/// - Otherwise one tree. With capacities, the planner's single-tree algorithms compete on
///   predicted completion time. Without them every access link is assumed equal, where a chain
///   is the best tree: the degree-constrained MST with fan-out 1 gives a chain that follows
///   short RTTs.
pub async fn for_send(
    hosts: &HostsFile,
    matrix: Option<&std::path::Path>,
    keys: &Keys,
    tuning: &TcpTuning,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<(Plan, String)> {
    let (matrices, note) = match matrix {
        Some(p) => (read_matrix(p)?, format!("matrix from {}", p.display())),
        // Three echoes: probing is paid before every send, and the median of three is enough
        // to order paths that differ by more than jitter.
        None => measure(hosts, keys, tuning, 3).await?,
    };
    let mut net = Network::from_hosts(hosts, &matrices)?;
    // An empty object is planned as one byte: the planner's rates need a size, and for
    // nothing to move the tree's set-up is all that costs.
    let size = size.map_or(1 << 30, |s| s.max(1));
    let opts = PlanOptions::default().with_object(size, chunk as u64)?;
    if balanced {
        if net.is_uncapacitated() {
            bail!("--strategy balanced needs capacities (uplink_mbps/downlink_mbps in the hosts file, or a matrix)");
        }
        return Ok((plan(&net, Algorithm::Balanced, &opts)?, note));
    }
    if net.is_uncapacitated() {
        for i in 0..net.len() {
            if net.max_fanout(i).is_none() {
                net.set_max_fanout(i, Some(1))?;
            }
        }
        let mut p = plan(&net, Algorithm::Dcmst, &opts)?;
        p.reason = "no link capacities given (uplink_mbps in a hosts file, or --matrix): equal access links assumed, so a chain ordered by RTT (DCMST, fan-out 1)".into();
        return Ok((p, note));
    }
    let best = [
        Algorithm::Mst,
        Algorithm::Dcmst,
        Algorithm::Cluster,
        Algorithm::Bottleneck,
    ]
    .into_iter()
    .filter_map(|a| plan(&net, a, &opts).ok())
    .min_by(|x, y| x.completion_secs.total_cmp(&y.completion_secs))
    .context("the planner found no tree")?;
    Ok((best, note))
}
