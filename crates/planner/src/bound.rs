//! The best achievable broadcast rate: an LP over one flow per receiver sharing edge loads.
//!
//! See the crate docs ("The bound") for the formulation and why it is exact.

use microlp::{ComparisonOp, OptimizationDirection, Problem};

use crate::balanced::{pack, PackingLimits};
use crate::{Network, PlanError};

/// Largest network (nodes, source included) for which [`bound`] solves the exact LP; the LP
/// has about n^3 variables (20 nodes: about 1.5 s, 24 nodes: about 8 s in release builds).
/// Above it [`bound`] reports the packing's dual bound.
pub const LP_MAX_NODES: usize = 20;

/// An upper bound on the broadcast rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// Mbit/s; infinite when no capacity is known.
    pub rate_mbps: f64,
    /// True when `rate_mbps` is the LP optimum, false when it is only an upper bound on it.
    pub exact: bool,
}

impl Bound {
    /// `rate / bound`, in [0, 1] for any plan's prediction (1 when both are infinite).
    pub fn fraction(&self, rate_mbps: f64) -> f64 {
        if self.rate_mbps.is_infinite() {
            if rate_mbps.is_infinite() {
                1.0
            } else {
                0.0
            }
        } else {
            rate_mbps / self.rate_mbps
        }
    }
}

/// The bound: the exact LP for up to [`LP_MAX_NODES`] nodes, otherwise the smaller of the
/// tree packing's dual bound and the simple cut bounds (source uplink, smallest downlink,
/// total uplink / receivers).
pub fn bound(net: &Network) -> Result<Bound, PlanError> {
    if net.is_uncapacitated() {
        return Ok(Bound {
            rate_mbps: f64::INFINITY,
            exact: true,
        });
    }
    if net.len() <= LP_MAX_NODES {
        return Ok(Bound {
            rate_mbps: lp_bound(net)?,
            exact: true,
        });
    }
    let packing = pack(net, &[], PackingLimits::for_size(net.len()));
    Ok(Bound {
        rate_mbps: packing.upper.min(cut_bound(net)),
        exact: false,
    })
}

/// Simple cut bounds: the source must upload the stream once, every receiver must download it,
/// and the n receivers' copies must all be uploaded by someone.
pub fn cut_bound(net: &Network) -> f64 {
    let n = net.len();
    let up0 = net.uplink(0).unwrap_or(f64::INFINITY);
    let down = (1..n)
        .map(|v| net.downlink(v).unwrap_or(f64::INFINITY))
        .fold(f64::INFINITY, f64::min);
    let total_up: f64 = (0..n).map(|v| net.uplink(v).unwrap_or(f64::INFINITY)).sum();
    let share = if n > 1 {
        total_up / (n - 1) as f64
    } else {
        f64::INFINITY
    };
    up0.min(down).min(share)
}

/// Solves the broadcast LP exactly (microlp's simplex). Infinite when nothing limits the rate.
pub fn lp_bound(net: &Network) -> Result<f64, PlanError> {
    let n = net.len();
    if n <= 1 {
        return Ok(f64::INFINITY);
    }
    let res = net.resources();
    if res.len() == 0 {
        return Ok(f64::INFINITY);
    }
    // Measure rates in units of a simple upper bound on the answer (else the largest
    // capacity): λ is then at most about 1 and the solver's absolute tolerance is relative.
    let cut = cut_bound(net);
    let scale = if cut.is_finite() {
        cut
    } else {
        res.caps.iter().copied().fold(0.0, f64::max)
    };
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let lambda = lp.add_var(1.0, (0.0, f64::INFINITY));
    let edges: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (1..n).filter(move |&j| j != i).map(move |j| (i, j)))
        .collect();
    let x: Vec<_> = edges
        .iter()
        .map(|_| lp.add_var(0.0, (0.0, f64::INFINITY)))
        .collect();
    let mut on_res: Vec<Vec<usize>> = vec![Vec::new(); res.len()];
    for (e, &(i, j)) in edges.iter().enumerate() {
        res.for_edge(i, j, |r| on_res[r].push(e));
    }
    for (r, es) in on_res.iter().enumerate() {
        if !es.is_empty() {
            let terms: Vec<_> = es.iter().map(|&e| (x[e], 1.0)).collect();
            lp.add_constraint(terms.as_slice(), ComparisonOp::Le, res.caps[r] / scale);
        }
    }
    for t in 1..n {
        // Flow of commodity t on every edge not leaving t; f <= x on each.
        let mut inflow: Vec<Vec<(microlp::Variable, f64)>> = vec![Vec::new(); n];
        for (e, &(i, j)) in edges.iter().enumerate() {
            if i == t {
                continue;
            }
            let f = lp.add_var(0.0, (0.0, f64::INFINITY));
            lp.add_constraint([(f, 1.0), (x[e], -1.0)].as_slice(), ComparisonOp::Le, 0.0);
            inflow[j].push((f, 1.0));
            if i != 0 {
                inflow[i].push((f, -1.0));
            }
        }
        for (v, mut terms) in inflow.into_iter().enumerate().skip(1) {
            if v == t {
                terms.push((lambda, -1.0));
            }
            lp.add_constraint(terms.as_slice(), ComparisonOp::Eq, 0.0);
        }
    }
    let outcome = match lp.solve() {
        Ok(o) => o,
        // Some tree uses no finite resource: nothing limits the rate.
        Err(microlp::Error::Unbounded) => return Ok(f64::INFINITY),
        Err(e) => return Err(PlanError::Solver(e.to_string())),
    };
    let solution = outcome
        .solution()
        .ok_or_else(|| PlanError::Solver("interrupted before a solution".into()))?;
    Ok(solution.objective() * scale)
}

/// Solves `max sum y_t` subject to `sum_t usage[t][r] * y_t <= caps[r]`, `y >= 0`: the best
/// rates for a fixed set of trees. Returns the rates.
pub(crate) fn best_rates(caps: &[f64], usage: &[Vec<u32>]) -> Result<Vec<f64>, PlanError> {
    if usage.is_empty() {
        return Ok(Vec::new());
    }
    let scale = caps.iter().copied().fold(0.0, f64::max).max(1e-12);
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let y: Vec<_> = usage
        .iter()
        .map(|_| lp.add_var(1.0, (0.0, f64::INFINITY)))
        .collect();
    for (r, &c) in caps.iter().enumerate() {
        let terms: Vec<_> = usage
            .iter()
            .enumerate()
            .filter(|(_, u)| u[r] > 0)
            .map(|(t, u)| (y[t], f64::from(u[r])))
            .collect();
        if !terms.is_empty() {
            lp.add_constraint(terms.as_slice(), ComparisonOp::Le, c / scale);
        }
    }
    let outcome = lp.solve().map_err(|e| PlanError::Solver(e.to_string()))?;
    let solution = outcome
        .solution()
        .ok_or_else(|| PlanError::Solver("interrupted before a solution".into()))?;
    Ok(y.iter()
        .map(|&v| (solution.var_value(v) * scale).max(0.0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;

    #[test]
    fn two_receivers_share_the_source_uplink_or_relay() {
        // Source uplink 100, receivers' uplinks 100: the chain 0->1->2 reaches 100; the bound
        // is 100 (the source's uplink).
        let mut net = Network::new(Matrix::filled(3, 1.0)).unwrap();
        for v in 0..3 {
            net.set_uplink(v, Some(100.0)).unwrap();
        }
        assert!((lp_bound(&net).unwrap() - 100.0).abs() < 1e-6);
        // Receivers cannot upload much: 0 must feed both, total upload 100 + 2*10 for two copies.
        net.set_uplink(1, Some(10.0)).unwrap();
        net.set_uplink(2, Some(10.0)).unwrap();
        assert!((lp_bound(&net).unwrap() - 60.0).abs() < 1e-6);
        assert!((cut_bound(&net) - 60.0).abs() < 1e-9);
    }

    #[test]
    fn uncapacitated_is_infinite() {
        let net = Network::new(Matrix::filled(3, 1.0)).unwrap();
        assert!(bound(&net).unwrap().rate_mbps.is_infinite());
        assert_eq!(bound(&net).unwrap().fraction(f64::INFINITY), 1.0);
    }
}
