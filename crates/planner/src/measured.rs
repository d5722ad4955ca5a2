//! From measured round trips to the plan a send uses: which pairs to probe, the RTT matrix the
//! probes give (Vivaldi-completed where pairs were left out or failed), and the tree the
//! default push runs.
//!
//! This is the policy `bulkcast send` and `bulkcast plan` share; it lives here, with no I/O,
//! so that tests and other programs reach it without the CLI. The probing itself (sockets,
//! deadlines) is `bulkcast_runtime::probe`.

use crate::vivaldi::{self, Sample, VivaldiConfig};
use crate::{plan, Algorithm, Matrix, MatrixFile, Network, Plan, PlanError, PlanOptions};
use bulkcast_proto::tree::Tree;

/// Which pairs of hosts to probe for a send to `hosts` receivers: `targets[i]` lists the hosts
/// (indices into the host list) that host `i` measures; the source measures every host itself.
/// Up to [`vivaldi::PROBE_ALL_MAX`] nodes every pair is measured both ways (and averaged);
/// above, a sample per node, and Vivaldi estimates the rest.
pub fn probe_targets(hosts: usize) -> Vec<Vec<usize>> {
    let n = hosts + 1;
    // Node ids are shifted by one: node 0 is the source, which the probe's caller measures.
    let pairs = vivaldi::probe_pairs(n, 8, 1);
    let full = pairs.len() == n * (n - 1) / 2;
    let mut targets = vec![Vec::new(); hosts];
    for &(a, b) in &pairs {
        if a > 0 && b > 0 {
            targets[a - 1].push(b - 1);
            if full {
                targets[b - 1].push(a - 1);
            }
        }
    }
    targets
}

/// The RTT matrix over `nodes` (the source first) from measured round trips: `rtt_ms[i][j]` as
/// measured from node `i` to node `j`, `None` where it could not be. Returns the matrix and a
/// line saying how it was made (every pair, or Vivaldi with its error on the probed pairs).
pub fn rtt_matrix(
    nodes: Vec<String>,
    rtt_ms: &[Vec<Option<f64>>],
    samples: u16,
) -> Result<(MatrixFile, String), PlanError> {
    let n = nodes.len();
    if rtt_ms.len() != n {
        return Err(PlanError::Shape {
            what: "measured rtt_ms",
            expected: n,
            row: rtt_ms.len(),
            got: 0,
        });
    }
    if let Some((row, r)) = rtt_ms.iter().enumerate().find(|(_, r)| r.len() != n) {
        return Err(PlanError::Shape {
            what: "measured rtt_ms",
            expected: n,
            row,
            got: r.len(),
        });
    }
    let probed: Vec<Sample> = (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|&(i, j)| i != j)
        .filter_map(|(i, j)| {
            rtt_ms[i][j].map(|v| Sample {
                a: i,
                b: j,
                rtt_ms: v.max(0.001),
            })
        })
        .collect();
    let (rtt, note) = if probed.len() == n * (n - 1) {
        // Every directed pair measured: the mean of the two directions.
        let mut rtt = Matrix::filled(n, 0.0);
        for (i, row) in rtt_ms.iter().enumerate() {
            for (j, x) in row.iter().enumerate().filter(|&(j, _)| j != i) {
                let (x, y) = (x.unwrap_or(0.0), rtt_ms[j][i].unwrap_or(0.0));
                rtt.set(i, j, (x + y) / 2.0);
            }
        }
        let pairs = n * (n - 1) / 2;
        let how = match samples {
            0 => "the round trip of each connect".to_string(),
            n => format!("median of {n} echoes each"),
        };
        let note = format!("probed all {pairs} pairs of {n} nodes, the source included ({how})");
        (rtt, note)
    } else {
        let (rtt, coords) = vivaldi::complete(n, &probed, VivaldiConfig::default());
        let err = vivaldi::median_relative_error(&coords, &probed);
        let note = format!(
            "probed {} directed pairs of {n} nodes; the rest estimated with Vivaldi coordinates (median relative error on probed pairs {:.1}%)",
            probed.len(),
            err * 100.0
        );
        (rtt, note)
    };
    let file = MatrixFile {
        nodes,
        rtt_ms: rtt,
        bandwidth_mbps: None,
        wan: Vec::new(),
    };
    Ok((file, note))
}

/// The longest round trip in ms of a hop of `tree` over `net` (0 for a tree of one node).
pub fn longest_hop_rtt_ms(net: &Network, tree: &Tree) -> f64 {
    (1..tree.len())
        .filter_map(|i| tree.parent(i).map(|p| net.rtt(p, i)))
        .fold(0.0, f64::max)
}

/// The tree (or trees) a push to `net` runs, for an object of `size` bytes (`None`: a stream)
/// in chunks of `chunk` bytes.
///
/// - `balanced`: the planner's multi-trees; they need capacities.
/// - Otherwise one tree. With capacities, the single-tree algorithms compete on predicted
///   completion time. Without them every access link is taken as equal, where a chain is the
///   best tree (every uplink carries the data once): the degree-constrained MST with fan-out 1,
///   a chain that follows short round trips.
pub fn push_plan(
    mut net: Network,
    size: Option<u64>,
    chunk: u32,
    balanced: bool,
) -> Result<Plan, PlanError> {
    // An empty object is planned as one byte: the rates need a size, and for nothing to move
    // the tree's set-up is all that costs.
    let size = size.map_or(1 << 30, |s| s.max(1));
    let opts = PlanOptions::default().with_object(size, chunk as u64)?;
    if balanced {
        if net.is_uncapacitated() {
            return Err(PlanError::NeedsCapacities(
                "--strategy balanced needs capacities (uplink_mbps/downlink_mbps in the hosts file, or a matrix)",
            ));
        }
        return plan(&net, Algorithm::Balanced, &opts);
    }
    if net.is_uncapacitated() {
        for i in 0..net.len() {
            if net.max_fanout(i).is_none() {
                net.set_max_fanout(i, Some(1))?;
            }
        }
        let mut p = plan(&net, Algorithm::Dcmst, &opts)?;
        p.reason = "no capacities given: equal access links assumed, so a chain ordered by RTT (DCMST, fan-out 1)".into();
        return Ok(p);
    }
    [
        Algorithm::Mst,
        Algorithm::Dcmst,
        Algorithm::Cluster,
        Algorithm::Bottleneck,
    ]
    .into_iter()
    .filter_map(|a| plan(&net, a, &opts).ok())
    .min_by(|x, y| x.completion_secs.total_cmp(&y.completion_secs))
    .ok_or(PlanError::NoTree)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn small_sends_probe_every_pair_both_ways() {
        let t = probe_targets(4);
        for (i, row) in t.iter().enumerate() {
            let mut row = row.clone();
            row.sort();
            let want: Vec<usize> = (0..4).filter(|&j| j != i).collect();
            assert_eq!(row, want, "host {i}");
        }
    }

    #[test]
    fn every_pair_measured_gives_the_mean_of_both_directions() {
        let m = vec![
            vec![Some(0.0), Some(10.0), Some(20.0)],
            vec![Some(12.0), Some(0.0), Some(4.0)],
            vec![Some(22.0), Some(6.0), Some(0.0)],
        ];
        let (f, note) = rtt_matrix(names(3), &m, 3).unwrap();
        assert_eq!(f.rtt_ms.at(0, 1), 11.0);
        assert_eq!(f.rtt_ms.at(2, 1), 5.0);
        assert!(note.starts_with("probed all 3 pairs"), "{note}");
    }

    #[test]
    fn a_missing_pair_is_estimated_and_said_so() {
        let m = vec![
            vec![Some(0.0), Some(10.0), Some(20.0)],
            vec![Some(10.0), Some(0.0), None],
            vec![Some(20.0), None, Some(0.0)],
        ];
        let (f, note) = rtt_matrix(names(3), &m, 3).unwrap();
        assert!(note.contains("Vivaldi"), "{note}");
        assert!(f.rtt_ms.at(1, 2) > 0.0);
        assert!(rtt_matrix(names(2), &m, 3).is_err(), "shape checked");
    }

    #[test]
    fn without_capacities_the_push_is_a_chain_by_round_trip() {
        // Source 0; hosts 1..3 on a line: 0-1 near, 1-2 near, 2-3 near.
        let pos = [0.0, 1.0, 2.0, 3.0];
        let rows: Vec<Vec<f64>> = pos
            .iter()
            .map(|a: &f64| pos.iter().map(|b| (a - b).abs() * 10.0).collect())
            .collect();
        let net = Network::new(Matrix::from_rows("rtt_ms", &rows).unwrap()).unwrap();
        let p = push_plan(net.clone(), Some(1 << 20), 1 << 16, false).unwrap();
        assert_eq!(p.tree().parents(), &[None, Some(0), Some(1), Some(2)]);
        assert!(matches!(
            push_plan(net, None, 1 << 16, true),
            Err(PlanError::NeedsCapacities(_))
        ));
    }
}
