//! Vivaldi network coordinates (Dabek et al., SIGCOMM 2004; the variant Serf and Consul use:
//! Euclidean coordinates plus a non-negative "height" for the access link), run centrally over
//! a sample of measured RTTs to estimate the pairs that were not probed.
//!
//! Probing all pairs costs O(n^2). Up to [`PROBE_ALL_MAX`] nodes the prober measures them all;
//! above, [`probe_pairs`] picks a random sample of about `per_node` partners per node, [`fit`]
//! places the nodes, and [`complete`] fills the matrix: measured pairs keep their
//! measurement, the rest get the coordinate distance. [`median_relative_error`] reports how well
//! the coordinates fit the probed pairs.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::matrix::Matrix;

/// Up to this many nodes, every pair is probed.
pub const PROBE_ALL_MAX: usize = 64;

/// Euclidean dimensions of a coordinate (plus the height).
const DIMS: usize = 3;

/// Vivaldi's tuning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VivaldiConfig {
    /// Passes over the samples.
    pub rounds: usize,
    /// Coordinate adaptation constant (c_c).
    pub cc: f64,
    /// Error adaptation constant (c_e).
    pub ce: f64,
    /// Seed for the initial jitter and the sample order.
    pub seed: u64,
}

impl Default for VivaldiConfig {
    fn default() -> Self {
        Self {
            rounds: 60,
            cc: 0.25,
            ce: 0.25,
            seed: 1,
        }
    }
}

/// One measured RTT (ms) between two nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// One end.
    pub a: usize,
    /// The other end.
    pub b: usize,
    /// Measured RTT in ms (> 0; non-positive samples are ignored).
    pub rtt_ms: f64,
}

/// Fitted coordinates of n nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Coordinates {
    pos: Vec<[f64; DIMS]>,
    height: Vec<f64>,
    error: Vec<f64>,
}

impl Coordinates {
    /// Estimated RTT between a and b in ms.
    pub fn rtt(&self, a: usize, b: usize) -> f64 {
        if a == b {
            return 0.0;
        }
        euclid(&self.pos[a], &self.pos[b]) + self.height[a] + self.height[b]
    }

    /// Node a's own error estimate (Vivaldi's local error, 0 = confident).
    pub fn local_error(&self, a: usize) -> f64 {
        self.error[a]
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.pos.len()
    }

    /// True when there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.pos.is_empty()
    }
}

/// Which unordered pairs (a < b) to probe among n nodes: all of them up to [`PROBE_ALL_MAX`],
/// otherwise about `per_node` random partners per node (each node appears in at least
/// `per_node` pairs), deterministic for a seed.
pub fn probe_pairs(n: usize, per_node: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    if n <= PROBE_ALL_MAX || per_node + 1 >= n {
        for a in 0..n {
            for b in a + 1..n {
                pairs.push((a, b));
            }
        }
        return pairs;
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let others: Vec<usize> = (0..n).collect();
    for a in 0..n {
        for &b in others.choose_multiple(&mut rng, per_node + 1) {
            if b != a {
                pairs.push((a.min(b), a.max(b)));
            }
        }
    }
    pairs.sort_unstable();
    pairs.dedup();
    pairs
}

/// Places n nodes so that coordinate distances match the samples.
pub fn fit(n: usize, samples: &[Sample], cfg: VivaldiConfig) -> Coordinates {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(cfg.seed);
    let mut c = Coordinates {
        pos: (0..n)
            .map(|_| std::array::from_fn(|_| rng.gen_range(-1.0..1.0)))
            .collect(),
        height: vec![0.1; n],
        error: vec![1.0; n],
    };
    let mut order: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.a != s.b && s.a < n && s.b < n && s.rtt_ms > 0.0 && s.rtt_ms.is_finite())
        .collect();
    for round in 0..cfg.rounds {
        order.shuffle(&mut rng);
        // Larger steps early help escape a bad start; Vivaldi's own step decays with error.
        let boost = if round < cfg.rounds / 4 { 2.0 } else { 1.0 };
        for s in &order {
            update(&mut c, s.a, s.b, s.rtt_ms, cfg, boost, &mut rng);
            update(&mut c, s.b, s.a, s.rtt_ms, cfg, boost, &mut rng);
        }
    }
    c
}

/// Node i moves in response to its measurement to j.
fn update(
    c: &mut Coordinates,
    i: usize,
    j: usize,
    rtt: f64,
    cfg: VivaldiConfig,
    boost: f64,
    rng: &mut rand::rngs::SmallRng,
) {
    let dist = c.rtt(i, j);
    let w = c.error[i] / (c.error[i] + c.error[j]).max(1e-9);
    let rel = (dist - rtt).abs() / rtt;
    c.error[i] = (rel * cfg.ce * w + c.error[i] * (1.0 - cfg.ce * w)).clamp(1e-3, 1.5);
    let delta = (cfg.cc * w * boost).min(0.9);
    // Unit vector from j to i in (coordinates, height); random when they coincide.
    let mut diff: [f64; DIMS] = std::array::from_fn(|k| c.pos[i][k] - c.pos[j][k]);
    let mut norm = euclid(&c.pos[i], &c.pos[j]);
    if norm < 1e-9 {
        diff = std::array::from_fn(|_| rng.gen_range(-1.0..1.0));
        norm = diff.iter().map(|d| d * d).sum::<f64>().sqrt().max(1e-9);
    }
    let hsum = c.height[i] + c.height[j];
    let total = norm + hsum;
    let force = delta * (rtt - dist);
    for (p, d) in c.pos[i].iter_mut().zip(diff) {
        *p += force * d / total;
    }
    c.height[i] = (c.height[i] + force * hsum / total).max(0.01);
}

/// A full RTT matrix: measured pairs keep their sample (the mean of repeats), the others get
/// the coordinate estimate.
pub fn complete(n: usize, samples: &[Sample], cfg: VivaldiConfig) -> (Matrix, Coordinates) {
    let coords = fit(n, samples, cfg);
    let mut m = Matrix::filled(n, 0.0);
    for a in 0..n {
        for b in 0..n {
            if a != b {
                m.set(a, b, coords.rtt(a, b));
            }
        }
    }
    let mut sum = Matrix::filled(n, 0.0);
    let mut count = Matrix::filled(n, 0.0);
    for s in samples {
        if s.a != s.b && s.a < n && s.b < n && s.rtt_ms > 0.0 && s.rtt_ms.is_finite() {
            for (x, y) in [(s.a, s.b), (s.b, s.a)] {
                sum.set(x, y, sum.at(x, y) + s.rtt_ms);
                count.set(x, y, count.at(x, y) + 1.0);
            }
        }
    }
    for a in 0..n {
        for b in 0..n {
            if count.at(a, b) > 0.0 {
                m.set(a, b, sum.at(a, b) / count.at(a, b));
            }
        }
    }
    (m, coords)
}

/// Median over the samples of |estimate - measured| / measured.
pub fn median_relative_error(coords: &Coordinates, samples: &[Sample]) -> f64 {
    let mut errs: Vec<f64> = samples
        .iter()
        .filter(|s| s.a < coords.len() && s.b < coords.len() && s.rtt_ms > 0.0)
        .map(|s| (coords.rtt(s.a, s.b) - s.rtt_ms).abs() / s.rtt_ms)
        .collect();
    if errs.is_empty() {
        return f64::NAN;
    }
    errs.sort_by(f64::total_cmp);
    errs[errs.len() / 2]
}

/// A synthetic geometry for tests and benchmarks: `n` hosts in `regions` clusters on a plane
/// (region centres up to 150 ms apart, hosts spread 5 ms around them) with 0.5-5 ms access
/// delays, +-5% noise, and routing detours (one pair in ten 0-50% longer, which no metric
/// space reproduces). Returns the full RTT matrix.
pub fn synthetic_rtt(n: usize, regions: usize, seed: u64) -> Matrix {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let centres: Vec<[f64; 2]> = (0..regions.max(1))
        .map(|_| [rng.gen_range(0.0..150.0), rng.gen_range(0.0..150.0)])
        .collect();
    let hosts: Vec<([f64; 2], f64)> = (0..n)
        .map(|i| {
            let c = centres[i % centres.len()];
            (
                [
                    c[0] + rng.gen_range(-5.0..5.0),
                    c[1] + rng.gen_range(-5.0..5.0),
                ],
                rng.gen_range(0.5..5.0),
            )
        })
        .collect();
    let mut m = Matrix::filled(n, 0.0);
    for a in 0..n {
        for b in a + 1..n {
            let d = ((hosts[a].0[0] - hosts[b].0[0]).powi(2)
                + (hosts[a].0[1] - hosts[b].0[1]).powi(2))
            .sqrt();
            let detour = if rng.gen_bool(0.1) {
                rng.gen_range(1.0..1.5)
            } else {
                1.0
            };
            let rtt = (d + hosts[a].1 + hosts[b].1) * rng.gen_range(0.95..1.05) * detour;
            m.set(a, b, rtt);
            m.set(b, a, rtt);
        }
    }
    m
}

fn euclid(a: &[f64; DIMS], b: &[f64; DIMS]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f64>()
        .sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_all_pairs_for_small_sessions_and_a_sample_above() {
        assert_eq!(
            probe_pairs(4, 2, 1),
            vec![(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
        );
        let p = probe_pairs(200, 16, 1);
        assert!(p.len() < 200 * 199 / 2 / 4, "{}", p.len());
        for v in 0..200 {
            assert!(p.iter().filter(|&&(a, b)| a == v || b == v).count() >= 16);
        }
        assert!(p.iter().all(|&(a, b)| a < b && b < 200));
    }

    #[test]
    fn estimates_unprobed_pairs_of_a_synthetic_geometry() {
        let n = 150;
        let truth = synthetic_rtt(n, 5, 3);
        let probed = probe_pairs(n, 16, 4);
        let samples: Vec<Sample> = probed
            .iter()
            .map(|&(a, b)| Sample {
                a,
                b,
                rtt_ms: truth.at(a, b),
            })
            .collect();
        let (m, coords) = complete(n, &samples, VivaldiConfig::default());
        let on_probed = median_relative_error(&coords, &samples);
        let unprobed: Vec<Sample> = (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .filter(|p| probed.binary_search(p).is_err())
            .map(|(a, b)| Sample {
                a,
                b,
                rtt_ms: truth.at(a, b),
            })
            .collect();
        let held_out = median_relative_error(&coords, &unprobed);
        assert!(on_probed < 0.15, "median error on probed pairs {on_probed}");
        assert!(held_out < 0.2, "median error on unprobed pairs {held_out}");
        let (a, b) = probed[0];
        assert_eq!(
            m.at(a, b),
            truth.at(a, b),
            "measured pairs keep their measurement"
        );
    }
}
