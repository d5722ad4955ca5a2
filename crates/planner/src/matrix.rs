//! Square matrices of pairwise measurements, and the matrix file that carries them.
//!
//! The matrix file is TOML. Rows and columns follow `nodes`, which names every node of the
//! session (the source and the hosts, matched by name against the hosts file, any order):
//!
//! ```toml
//! nodes = ["london", "frankfurt", "oregon"]
//! # Round-trip times in ms (required). Row = from, column = to; the diagonal is ignored.
//! rtt_ms = [[0, 13, 141], [13, 0, 100], [141, 100, 0]]
//! # Achievable bandwidth of each overlay path in Mbit/s (optional), row = sender.
//! # `inf` means "not limited by the path"; the diagonal is ignored.
//! bandwidth_mbps = [[0, 900, 300], [900, 0, inf], [300, inf, 0]]
//!
//! # Shared WAN capacity from one site to another in Mbit/s (optional, repeatable): every
//! # overlay edge from a host of `from` to a host of `to` shares it.
//! [[wan]]
//! from = "london"
//! to = "frankfurt"
//! mbps = 2000
//! both_ways = true   # also the same capacity from `to` to `from` (default false)
//! ```

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

use crate::PlanError;

/// A dense square matrix of `f64`, indexed by node ids.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    n: usize,
    data: Vec<f64>,
}

impl Matrix {
    /// An `n` x `n` matrix with every entry `fill`.
    pub fn filled(n: usize, fill: f64) -> Self {
        Self {
            n,
            data: vec![fill; n * n],
        }
    }

    /// Builds a matrix from rows, checking that it is square.
    pub fn from_rows(what: &'static str, rows: &[Vec<f64>]) -> Result<Self, PlanError> {
        let n = rows.len();
        let mut data = Vec::with_capacity(n * n);
        for (row, r) in rows.iter().enumerate() {
            if r.len() != n {
                return Err(PlanError::Shape {
                    what,
                    expected: n,
                    row,
                    got: r.len(),
                });
            }
            data.extend_from_slice(r);
        }
        Ok(Self { n, data })
    }

    /// Side length.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True for the 0 x 0 matrix.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Entry (i, j).
    pub fn at(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.n + j]
    }

    /// Sets entry (i, j).
    pub fn set(&mut self, i: usize, j: usize, v: f64) {
        self.data[i * self.n + j] = v;
    }

    /// The rows as vectors (for serialising).
    pub fn rows(&self) -> Vec<Vec<f64>> {
        self.data
            .chunks(self.n.max(1))
            .map(<[f64]>::to_vec)
            .collect()
    }

    /// Checks the off-diagonal entries: RTTs must be finite and >= 0; capacities > 0
    /// (`inf` allowed, meaning unlimited).
    pub(crate) fn validate(&self, what: &'static str, kind: EntryKind) -> Result<(), PlanError> {
        for i in 0..self.n {
            for j in 0..self.n {
                let v = self.at(i, j);
                let (ok, rule) = match kind {
                    EntryKind::Rtt => (v.is_finite() && v >= 0.0, "finite and >= 0"),
                    EntryKind::Capacity => (v > 0.0, "> 0, or inf for unlimited"),
                };
                if i != j && !ok {
                    return Err(PlanError::BadEntry {
                        what,
                        from: i,
                        to: j,
                        value: v,
                        rule,
                    });
                }
            }
        }
        Ok(())
    }

    /// Renders the matrix as an aligned table with `names` as row and column headers.
    /// Names longer than 12 characters are shortened; infinite entries print as `inf`.
    pub fn render(&self, names: &[String], unit: &str) -> String {
        let short = |s: &str| -> String { s.chars().take(12).collect() };
        let mut out = String::new();
        let _ = write!(out, "{:>12}", unit);
        for j in 0..self.n {
            let name = names.get(j).map(String::as_str).unwrap_or("?");
            let _ = write!(out, " {:>12}", short(name));
        }
        out.push('\n');
        for i in 0..self.n {
            let name = names.get(i).map(String::as_str).unwrap_or("?");
            let _ = write!(out, "{:>12}", short(name));
            for j in 0..self.n {
                let v = self.at(i, j);
                if i == j {
                    let _ = write!(out, " {:>12}", "-");
                } else if v.is_infinite() {
                    let _ = write!(out, " {:>12}", "inf");
                } else {
                    let _ = write!(out, " {:>12.1}", v);
                }
            }
            out.push('\n');
        }
        out
    }
}

/// How matrix entries are checked.
#[derive(Debug, Clone, Copy)]
pub(crate) enum EntryKind {
    Rtt,
    Capacity,
}

/// One shared WAN capacity between two sites.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanLink {
    /// Sending site.
    pub from: String,
    /// Receiving site.
    pub to: String,
    /// Capacity in Mbit/s shared by every overlay edge from `from` to `to`.
    pub mbps: f64,
    /// Whether `to` -> `from` has the same capacity.
    #[serde(default)]
    pub both_ways: bool,
}

/// A parsed matrix file (see the module docs for the format).
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixFile {
    /// Node names; row/column order of the matrices.
    pub nodes: Vec<String>,
    /// RTT in ms.
    pub rtt_ms: Matrix,
    /// Path capacities in Mbit/s, when known.
    pub bandwidth_mbps: Option<Matrix>,
    /// Shared WAN capacities between sites.
    pub wan: Vec<WanLink>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatrixFile {
    nodes: Vec<String>,
    rtt_ms: Vec<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bandwidth_mbps: Option<Vec<Vec<f64>>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    wan: Vec<WanLink>,
}

impl MatrixFile {
    /// Parses and validates a matrix file's text.
    pub fn parse_toml(text: &str) -> Result<Self, PlanError> {
        let raw: RawMatrixFile =
            toml::from_str(text).map_err(|e| PlanError::Toml(e.to_string()))?;
        let mut seen = std::collections::HashSet::new();
        for name in &raw.nodes {
            if !seen.insert(name.as_str()) {
                return Err(PlanError::DuplicateNode(name.clone()));
            }
        }
        let n = raw.nodes.len();
        let rtt = square("rtt_ms", n, &raw.rtt_ms)?;
        rtt.validate("rtt_ms", EntryKind::Rtt)?;
        let bandwidth = match &raw.bandwidth_mbps {
            Some(rows) => {
                let m = square("bandwidth_mbps", n, rows)?;
                m.validate("bandwidth_mbps", EntryKind::Capacity)?;
                Some(m)
            }
            None => None,
        };
        for w in &raw.wan {
            if w.mbps.is_nan() || w.mbps <= 0.0 {
                return Err(PlanError::BadValue {
                    what: "wan mbps",
                    value: w.mbps,
                });
            }
        }
        Ok(Self {
            nodes: raw.nodes,
            rtt_ms: rtt,
            bandwidth_mbps: bandwidth,
            wan: raw.wan,
        })
    }

    /// Serialises to the TOML format [`MatrixFile::parse_toml`] reads.
    pub fn to_toml(&self) -> String {
        let raw = RawMatrixFile {
            nodes: self.nodes.clone(),
            rtt_ms: self.rtt_ms.rows(),
            bandwidth_mbps: self.bandwidth_mbps.as_ref().map(Matrix::rows),
            wan: self.wan.clone(),
        };
        toml::to_string(&raw).unwrap_or_default()
    }

    /// The matrices as printable tables.
    pub fn render(&self) -> String {
        let mut out = self.rtt_ms.render(&self.nodes, "rtt ms");
        if let Some(bw) = &self.bandwidth_mbps {
            out.push('\n');
            out.push_str(&bw.render(&self.nodes, "Mbit/s"));
        }
        for w in &self.wan {
            let arrow = if w.both_ways { "<->" } else { "->" };
            let _ = writeln!(out, "wan {} {} {}: {} Mbit/s", w.from, arrow, w.to, w.mbps);
        }
        out
    }
}

fn square(what: &'static str, n: usize, rows: &[Vec<f64>]) -> Result<Matrix, PlanError> {
    if rows.len() != n {
        return Err(PlanError::Shape {
            what,
            expected: n,
            row: rows.len(),
            got: rows.len(),
        });
    }
    Matrix::from_rows(what, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
        nodes = ["a", "b", "c"]
        rtt_ms = [[0, 10, 20.5], [10, 0, 5], [20.5, 5, 0]]
        bandwidth_mbps = [[0, 100, inf], [100, 0, 50], [inf, 50, 0]]
        [[wan]]
        from = "x"
        to = "y"
        mbps = 300
        both_ways = true
    "#;

    #[test]
    fn parses_and_round_trips() {
        let f = MatrixFile::parse_toml(GOOD).unwrap();
        assert_eq!(f.rtt_ms.at(0, 2), 20.5);
        assert!(f.bandwidth_mbps.as_ref().unwrap().at(0, 2).is_infinite());
        assert_eq!(f.wan[0].mbps, 300.0);
        assert_eq!(MatrixFile::parse_toml(&f.to_toml()).unwrap(), f);
        let text = f.render();
        assert!(text.contains("inf") && text.contains("20.5") && text.contains("x <-> y"));
    }

    #[test]
    fn rejects_bad_files() {
        let e = MatrixFile::parse_toml("nodes=['a','b']\nrtt_ms=[[0,1]]").unwrap_err();
        assert!(matches!(e, PlanError::Shape { .. }), "{e}");
        let e = MatrixFile::parse_toml("nodes=['a','b']\nrtt_ms=[[0,1],[-1,0]]").unwrap_err();
        assert!(
            matches!(e, PlanError::BadEntry { from: 1, to: 0, .. }),
            "{e}"
        );
        let e = MatrixFile::parse_toml("nodes=['a','b']\nrtt_ms=[[0,1],[nan,0]]").unwrap_err();
        assert!(matches!(e, PlanError::BadEntry { .. }), "{e}");
        let t = "nodes=['a','b']\nrtt_ms=[[0,1],[1,0]]\nbandwidth_mbps=[[0,0],[1,0]]";
        assert!(matches!(
            MatrixFile::parse_toml(t),
            Err(PlanError::BadEntry { from: 0, to: 1, .. })
        ));
        let t = "nodes=['a','a']\nrtt_ms=[[0,1],[1,0]]";
        assert!(matches!(
            MatrixFile::parse_toml(t),
            Err(PlanError::DuplicateNode(_))
        ));
        assert!(matches!(
            MatrixFile::parse_toml("nodes=['a']\nrtt=[[0]]"),
            Err(PlanError::Toml(_))
        ));
        let t = "nodes=['a']\nrtt_ms=[[0]]\n[[wan]]\nfrom='x'\nto='y'\nmbps=0";
        assert!(matches!(
            MatrixFile::parse_toml(t),
            Err(PlanError::BadValue { .. })
        ));
    }
}
