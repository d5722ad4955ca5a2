//! Plans: the algorithms behind one entry point, their predictions, and `auto`.

use std::fmt;
use std::str::FromStr;

use bulkcast_proto::tree::Tree;

use crate::rate::{completion_secs, tree_bottleneck, tree_rate, Objective};
use crate::trees::{bottleneck, cluster, dcmst, fanout_limits, mst};
use crate::{balanced, Network, PlanError};

/// Which planner to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Minimum spanning tree on RTT.
    Mst,
    /// Degree-constrained MST on RTT.
    Dcmst,
    /// Maximum-bottleneck tree on capacities.
    Bottleneck,
    /// Two-level cluster-aware tree.
    Cluster,
    /// Balanced multi-trees.
    Balanced,
    /// The concrete algorithm with the best predicted completion time.
    Auto,
}

impl Algorithm {
    /// The concrete algorithms, in the order `auto` prefers them on ties.
    pub const CONCRETE: [Algorithm; 5] = [
        Algorithm::Mst,
        Algorithm::Dcmst,
        Algorithm::Cluster,
        Algorithm::Bottleneck,
        Algorithm::Balanced,
    ];

    /// The name the CLI uses.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Mst => "mst",
            Algorithm::Dcmst => "dcmst",
            Algorithm::Bottleneck => "bottleneck",
            Algorithm::Cluster => "cluster",
            Algorithm::Balanced => "balanced",
            Algorithm::Auto => "auto",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = PlanError;

    fn from_str(s: &str) -> Result<Self, PlanError> {
        [Algorithm::Auto]
            .into_iter()
            .chain(Algorithm::CONCRETE)
            .find(|a| a.name() == s)
            .ok_or_else(|| PlanError::UnknownAlgorithm(s.to_string()))
    }
}

/// Knobs for [`plan`].
#[derive(Debug, Clone, PartialEq)]
pub struct PlanOptions {
    /// Rate each child should get, used to derive fan-out limits from uplinks (dcmst, cluster).
    /// `None`: try the hosts file's limits alone, the median uplink divided by 1..=4, and the
    /// simple cut bound ([`crate::cut_bound`]), and keep the tree with the best predicted
    /// completion time.
    pub target_rate_mbps: Option<f64>,
    /// Most trees a balanced plan may use (each needs its own shaped stream).
    pub max_trees: usize,
    /// What "best" means: time to deliver this object.
    pub objective: Objective,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            target_rate_mbps: None,
            max_trees: 16,
            objective: Objective::default(),
        }
    }
}

impl PlanOptions {
    /// Sets the target rate, refusing zero, negative and NaN.
    pub fn with_target_rate(mut self, mbps: f64) -> Result<Self, PlanError> {
        if mbps.is_nan() || mbps <= 0.0 {
            return Err(PlanError::BadValue {
                what: "target rate",
                value: mbps,
            });
        }
        self.target_rate_mbps = Some(mbps);
        Ok(self)
    }

    /// Sets the most trees a balanced plan may use, refusing zero.
    pub fn with_max_trees(mut self, max_trees: usize) -> Result<Self, PlanError> {
        if max_trees == 0 {
            return Err(PlanError::BadValue {
                what: "max trees",
                value: 0.0,
            });
        }
        self.max_trees = max_trees;
        Ok(self)
    }

    /// Sets the object and chunk sizes, refusing zero.
    pub fn with_object(mut self, size_bytes: u64, chunk_bytes: u64) -> Result<Self, PlanError> {
        for (what, v) in [("object size", size_bytes), ("chunk size", chunk_bytes)] {
            if v == 0 {
                return Err(PlanError::BadValue { what, value: 0.0 });
            }
        }
        self.objective = Objective {
            size_bytes,
            chunk_bytes,
        };
        Ok(self)
    }
}

/// A plan: one tree, or several with their shaped rates.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The concrete algorithm that made it (never `Auto`).
    pub algorithm: Algorithm,
    /// The trees with their rates in Mbit/s, fastest first; one entry for single-tree plans.
    pub trees: Vec<(Tree, f64)>,
    /// Predicted broadcast rate in Mbit/s (sum of the trees' rates; infinite if unlimited).
    pub rate_mbps: f64,
    /// Predicted seconds to deliver [`PlanOptions::objective`].
    pub completion_secs: f64,
    /// Why this plan: what limits it, and for `auto` why it won.
    pub reason: String,
}

impl Plan {
    /// The first (fastest) tree; the one to use where only one tree can be used.
    pub fn tree(&self) -> &Tree {
        &self.trees[0].0
    }
}

/// Runs one algorithm (or `auto`) on the network, rooted at the source.
pub fn plan(net: &Network, algo: Algorithm, opts: &PlanOptions) -> Result<Plan, PlanError> {
    match algo {
        Algorithm::Auto => auto(net, opts),
        Algorithm::Mst => Ok(single(net, Algorithm::Mst, mst(net), opts)),
        Algorithm::Bottleneck => Ok(single(net, Algorithm::Bottleneck, bottleneck(net), opts)),
        Algorithm::Dcmst | Algorithm::Cluster => {
            let mut best: Option<Plan> = None;
            for (target, limits) in limit_choices(net, opts) {
                let tree = if algo == Algorithm::Dcmst {
                    match dcmst(net, &limits) {
                        Ok(t) => t,
                        Err(_) => continue,
                    }
                } else {
                    cluster(net, &limits)
                };
                let mut p = single(net, algo, tree, opts);
                if let Some(t) = target {
                    p.reason = format!("fan-out from a {t:.1} Mbit/s target; {}", p.reason);
                }
                let better = match &best {
                    Some(b) => p.completion_secs < b.completion_secs,
                    None => true,
                };
                if better {
                    best = Some(p);
                }
            }
            match best {
                Some(p) => Ok(p),
                None => dcmst(net, &fanout_limits(net, None)).map(|t| single(net, algo, t, opts)),
            }
        }
        Algorithm::Balanced => {
            let singles = single_plans(net, opts)?;
            balanced_plan(net, opts, &singles)
        }
    }
}

/// Every concrete algorithm's plan, in [`Algorithm::CONCRETE`] order.
pub fn all_plans(net: &Network, opts: &PlanOptions) -> Result<Vec<Plan>, PlanError> {
    let mut plans = single_plans(net, opts)?;
    let b = balanced_plan(net, opts, &plans)?;
    plans.push(b);
    Ok(plans)
}

/// The single-tree plans (every concrete algorithm but balanced).
fn single_plans(net: &Network, opts: &PlanOptions) -> Result<Vec<Plan>, PlanError> {
    Algorithm::CONCRETE
        .iter()
        .filter(|&&a| a != Algorithm::Balanced)
        .map(|&a| plan(net, a, opts))
        .collect()
}

/// Balanced multi-trees, seeded with the single-tree plans' trees.
fn balanced_plan(net: &Network, opts: &PlanOptions, singles: &[Plan]) -> Result<Plan, PlanError> {
    let seeds: Vec<Tree> = singles.iter().map(|p| p.tree().clone()).collect();
    let trees = balanced::balanced(net, &seeds, opts.max_trees)?;
    let rate: f64 = trees.iter().map(|t| t.1).sum();
    let secs = completion_secs(net, &trees, opts.objective);
    Ok(Plan {
        algorithm: Algorithm::Balanced,
        reason: format!("{} trees with shaped rates", trees.len()),
        trees,
        rate_mbps: rate,
        completion_secs: secs,
    })
}

fn auto(net: &Network, opts: &PlanOptions) -> Result<Plan, PlanError> {
    let mut plans = all_plans(net, opts)?;
    // Stable sort: ties keep the simpler algorithm first.
    plans.sort_by(|a, b| a.completion_secs.total_cmp(&b.completion_secs));
    let mut it = plans.into_iter();
    let mut best = it.next().ok_or(PlanError::NoSuchNode(0))?;
    let runner = it.next();
    let size = human_bytes(opts.objective.size_bytes);
    let mut why = format!(
        "auto chose {}: {} in {:.2} s at {}",
        best.algorithm,
        size,
        best.completion_secs,
        human_rate(best.rate_mbps)
    );
    if let Some(r) = runner {
        why.push_str(&format!(
            "; next best {} needs {:.2} s at {}",
            r.algorithm,
            r.completion_secs,
            human_rate(r.rate_mbps)
        ));
    }
    why.push_str(&format!(" ({})", best.reason));
    best.reason = why;
    Ok(best)
}

fn single(net: &Network, algo: Algorithm, tree: Tree, opts: &PlanOptions) -> Plan {
    let rate = tree_rate(net, &tree);
    let reason = match tree_bottleneck(net, &tree) {
        Some(b) => format!("limited by {b}"),
        None => "no capacity known: rate unlimited, only latency counts".to_string(),
    };
    let trees = vec![(tree, rate)];
    let secs = completion_secs(net, &trees, opts.objective);
    Plan {
        algorithm: algo,
        trees,
        rate_mbps: rate,
        completion_secs: secs,
        reason,
    }
}

/// The fan-out limit sets dcmst and cluster try.
fn limit_choices(net: &Network, opts: &PlanOptions) -> Vec<(Option<f64>, Vec<Option<usize>>)> {
    if let Some(t) = opts.target_rate_mbps {
        return vec![(Some(t), fanout_limits(net, Some(t)))];
    }
    let mut ups: Vec<f64> = (0..net.len()).filter_map(|v| net.uplink(v)).collect();
    let mut out = vec![(None, fanout_limits(net, None))];
    if ups.is_empty() {
        return out;
    }
    ups.sort_by(f64::total_cmp);
    let median = ups[ups.len() / 2];
    let mut targets: Vec<f64> = (1..=4).map(|k| median / k as f64).collect();
    // Aim straight at the simple cut bound too: a tree where every node feeds only as many
    // children as its uplink carries at that rate.
    let cut = crate::bound::cut_bound(net);
    if cut.is_finite() && targets.iter().all(|t| (t - cut).abs() > 1e-9 * cut) {
        targets.push(cut);
    }
    for t in targets {
        out.push((Some(t), fanout_limits(net, Some(t))));
    }
    out
}

/// "12.3 Mbit/s", "1.25 Gbit/s" or "unlimited".
pub fn human_rate(mbps: f64) -> String {
    if mbps.is_infinite() {
        "unlimited rate".into()
    } else if mbps >= 1000.0 {
        format!("{:.2} Gbit/s", mbps / 1000.0)
    } else {
        format!("{mbps:.1} Mbit/s")
    }
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;

    #[test]
    fn algorithm_names_round_trip() {
        for a in Algorithm::CONCRETE.into_iter().chain([Algorithm::Auto]) {
            assert_eq!(a.name().parse::<Algorithm>().unwrap(), a);
        }
        assert!(matches!(
            "fastest".parse::<Algorithm>(),
            Err(PlanError::UnknownAlgorithm(_))
        ));
        assert!(PlanOptions::default().with_target_rate(0.0).is_err());
        assert!(PlanOptions::default().with_object(0, 1).is_err());
        assert!(PlanOptions::default().with_max_trees(0).is_err());
        assert_eq!(
            PlanOptions::default().with_max_trees(3).unwrap().max_trees,
            3
        );
    }

    #[test]
    fn degenerate_networks_plan_without_panicking() {
        // The source alone, and the source with one host and capacities.
        let alone = Network::new(Matrix::filled(1, 0.0)).unwrap();
        for p in all_plans(&alone, &PlanOptions::default()).unwrap() {
            assert_eq!(p.tree().len(), 1);
            assert!(p.rate_mbps.is_infinite());
        }
        let mut two = Network::new(Matrix::filled(2, 3.0)).unwrap();
        two.set_uplink(0, Some(10.0)).unwrap();
        let p = plan(&two, Algorithm::Auto, &PlanOptions::default()).unwrap();
        assert_eq!(p.tree().parent(1), Some(0));
        assert!((p.rate_mbps - 10.0).abs() < 1e-9);
    }

    #[test]
    fn auto_prefers_relaying_when_the_source_uplink_is_small() {
        // Source uplink 100, four receivers with 1000 each, the source nearest to everyone:
        // the MST is a star (25 Mbit/s); relaying through receivers reaches 100.
        let mut rtt = Matrix::filled(5, 10.0);
        for v in 1..5 {
            rtt.set(0, v, 5.0);
            rtt.set(v, 0, 5.0);
        }
        let mut net = Network::new(rtt).unwrap();
        net.set_uplink(0, Some(100.0)).unwrap();
        for v in 1..5 {
            net.set_uplink(v, Some(1000.0)).unwrap();
        }
        let opts = PlanOptions::default();
        let star = plan(&net, Algorithm::Mst, &opts).unwrap();
        assert!((star.rate_mbps - 25.0).abs() < 1e-9);
        let p = plan(&net, Algorithm::Auto, &opts).unwrap();
        assert!((p.rate_mbps - 100.0).abs() < 1e-6, "{p:?}");
        assert!(p.reason.starts_with("auto chose"), "{}", p.reason);
        assert!(p.completion_secs < star.completion_secs);
    }
}
