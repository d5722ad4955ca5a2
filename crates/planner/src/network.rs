//! The planner's input: nodes with sites and access capacities, measured RTTs, and optional
//! path and WAN capacities; and the capacity model every rate prediction and the bound share.
//!
//! # Capacity model
//! An overlay edge `i -> j` carrying rate `r` consumes `r` of each of these resources:
//! - `i`'s uplink (the sum over all of `i`'s outgoing overlay edges is limited),
//! - `j`'s downlink,
//! - the path `i -> j` itself (the bandwidth matrix entry, when given),
//! - the WAN link from `i`'s site to `j`'s site, when one is given and the sites differ (shared by
//!   every overlay edge between the two sites, as the clusters of seed 004 share their WAN link).
//!
//! A missing capacity is unlimited. Everything the planner predicts is derived from this model.

use std::collections::HashMap;

use bulkcast_proto::hosts::HostsFile;
use bulkcast_proto::tree::NodeId;

use crate::matrix::{EntryKind, Matrix, MatrixFile};
use crate::PlanError;

/// Nodes (0 = source, 1..=n hosts), their sites and capacities, and the measured matrices.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    names: Vec<String>,
    sites: Vec<Option<String>>,
    uplink: Vec<f64>,
    downlink: Vec<f64>,
    max_fanout: Vec<Option<usize>>,
    rtt: Matrix,
    bandwidth: Option<Matrix>,
    /// Shared WAN capacity by from-site then to-site label (nested so lookups by `&str` do not
    /// allocate: tree algorithms ask for every pair).
    wan: HashMap<String, HashMap<String, f64>>,
}

impl Network {
    /// A network of `rtt.len()` nodes named "0", "1", ... with no sites and no capacities.
    pub fn new(rtt: Matrix) -> Result<Self, PlanError> {
        rtt.validate("rtt_ms", EntryKind::Rtt)?;
        let n = rtt.len();
        if n == 0 {
            return Err(PlanError::NoSuchNode(0));
        }
        Ok(Self {
            names: (0..n).map(|i| i.to_string()).collect(),
            sites: vec![None; n],
            uplink: vec![f64::INFINITY; n],
            downlink: vec![f64::INFINITY; n],
            max_fanout: vec![None; n],
            rtt,
            bandwidth: None,
            wan: HashMap::new(),
        })
    }

    /// Builds the network from a hosts file and a matrix file, matching nodes by name. The
    /// source is named by the hosts file's `[source]` (default "source").
    pub fn from_hosts(hosts: &HostsFile, matrices: &MatrixFile) -> Result<Self, PlanError> {
        let source = hosts.source.clone().unwrap_or_default();
        let source_name = if source.name.is_empty() {
            "source".to_string()
        } else {
            source.name.clone()
        };
        let mut names = vec![source_name];
        names.extend(hosts.hosts.iter().map(|h| h.name.clone()));
        let index: HashMap<&str, usize> = matrices
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_str(), i))
            .collect();
        if matrices.nodes.len() != names.len() {
            let extra = matrices
                .nodes
                .iter()
                .find(|m| !names.contains(m))
                .or_else(|| names.iter().find(|n| !index.contains_key(n.as_str())));
            return Err(PlanError::NodeMismatch(extra.cloned().unwrap_or_default()));
        }
        let mut order = Vec::with_capacity(names.len());
        for name in &names {
            match index.get(name.as_str()) {
                Some(&i) => order.push(i),
                None => return Err(PlanError::NodeMismatch(name.clone())),
            }
        }
        let size = names.len();
        let permute = |m: &Matrix| {
            let mut out = Matrix::filled(size, 0.0);
            for (a, &i) in order.iter().enumerate() {
                for (b, &j) in order.iter().enumerate() {
                    out.set(a, b, m.at(i, j));
                }
            }
            out
        };
        let mut net = Network::new(permute(&matrices.rtt_ms))?;
        net.names = names;
        if let Some(bw) = &matrices.bandwidth_mbps {
            net.set_bandwidth(permute(bw))?;
        }
        let caps = std::iter::once((
            source.site.clone(),
            source.uplink_mbps,
            source.downlink_mbps,
            source.max_fanout,
        ))
        .chain(
            hosts
                .hosts
                .iter()
                .map(|h| (h.site.clone(), h.uplink_mbps, h.downlink_mbps, h.max_fanout)),
        );
        for (i, (site, up, down, fanout)) in caps.enumerate() {
            net.set_site(i, site.as_deref())?;
            net.set_uplink(i, up)?;
            net.set_downlink(i, down)?;
            net.set_max_fanout(i, fanout)?;
        }
        for w in &matrices.wan {
            net.set_wan(&w.from, &w.to, w.mbps)?;
            if w.both_ways {
                net.set_wan(&w.to, &w.from, w.mbps)?;
            }
        }
        Ok(net)
    }

    /// Number of nodes, the source included.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Always false: a network has at least the source.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Node names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Node i's name.
    pub fn name(&self, i: NodeId) -> &str {
        &self.names[i]
    }

    /// Node i's site label.
    pub fn site(&self, i: NodeId) -> Option<&str> {
        self.sites[i].as_deref()
    }

    /// Node i's uplink capacity in Mbit/s (`None` = unlimited).
    pub fn uplink(&self, i: NodeId) -> Option<f64> {
        finite(self.uplink[i])
    }

    /// Node i's downlink capacity in Mbit/s (`None` = unlimited).
    pub fn downlink(&self, i: NodeId) -> Option<f64> {
        finite(self.downlink[i])
    }

    /// Node i's fan-out limit from the hosts file.
    pub fn max_fanout(&self, i: NodeId) -> Option<usize> {
        self.max_fanout[i]
    }

    /// RTT matrix in ms.
    pub fn rtt_matrix(&self) -> &Matrix {
        &self.rtt
    }

    /// Path-capacity matrix in Mbit/s, when known.
    pub fn bandwidth_matrix(&self) -> Option<&Matrix> {
        self.bandwidth.as_ref()
    }

    /// The RTT matrix (and the path capacities, when known) as printable tables.
    pub fn render_matrices(&self) -> String {
        let mut out = self.rtt.render(&self.names, "rtt ms");
        if let Some(bw) = &self.bandwidth {
            out.push('\n');
            out.push_str(&bw.render(&self.names, "Mbit/s"));
        }
        out
    }

    /// RTT from i to j in ms.
    pub fn rtt(&self, i: NodeId, j: NodeId) -> f64 {
        self.rtt.at(i, j)
    }

    /// The undirected edge weight the tree algorithms minimise: the mean of both directions.
    pub fn rtt_sym(&self, i: NodeId, j: NodeId) -> f64 {
        0.5 * (self.rtt.at(i, j) + self.rtt.at(j, i))
    }

    /// Capacity of the path i -> j alone (`None` = unlimited).
    pub fn path_capacity(&self, i: NodeId, j: NodeId) -> Option<f64> {
        self.bandwidth.as_ref().and_then(|m| finite(m.at(i, j)))
    }

    /// Shared WAN capacity from node i's site to node j's site, when both have sites, they
    /// differ, and a capacity is set.
    pub fn wan_capacity(&self, i: NodeId, j: NodeId) -> Option<f64> {
        match (&self.sites[i], &self.sites[j]) {
            (Some(a), Some(b)) if a != b => self.wan.get(a).and_then(|m| m.get(b)).copied(),
            _ => None,
        }
    }

    /// What edge i -> j could carry if it were the only edge: the smallest of i's uplink,
    /// j's downlink, the path and the WAN capacity (infinite when none is known).
    pub fn edge_capacity(&self, i: NodeId, j: NodeId) -> f64 {
        let mut c = self.uplink[i].min(self.downlink[j]);
        if let Some(p) = self.path_capacity(i, j) {
            c = c.min(p);
        }
        if let Some(w) = self.wan_capacity(i, j) {
            c = c.min(w);
        }
        c
    }

    /// True when no capacity at all is known (every rate is then unbounded).
    pub fn is_uncapacitated(&self) -> bool {
        self.uplink
            .iter()
            .chain(&self.downlink)
            .all(|c| c.is_infinite())
            && self.bandwidth.is_none()
            && self.wan.is_empty()
    }

    /// Renames node i.
    pub fn set_name(&mut self, i: NodeId, name: &str) -> Result<(), PlanError> {
        self.check(i)?;
        self.names[i] = name.to_string();
        Ok(())
    }

    /// Sets node i's site label.
    pub fn set_site(&mut self, i: NodeId, site: Option<&str>) -> Result<(), PlanError> {
        self.check(i)?;
        self.sites[i] = site.map(str::to_string);
        Ok(())
    }

    /// Sets node i's uplink capacity in Mbit/s (`None` = unlimited).
    pub fn set_uplink(&mut self, i: NodeId, mbps: Option<f64>) -> Result<(), PlanError> {
        self.check(i)?;
        self.uplink[i] = capacity("uplink_mbps", mbps)?;
        Ok(())
    }

    /// Sets node i's downlink capacity in Mbit/s (`None` = unlimited).
    pub fn set_downlink(&mut self, i: NodeId, mbps: Option<f64>) -> Result<(), PlanError> {
        self.check(i)?;
        self.downlink[i] = capacity("downlink_mbps", mbps)?;
        Ok(())
    }

    /// Sets node i's fan-out limit (`Some(0)` is refused: use a tiny uplink to make a leaf).
    pub fn set_max_fanout(&mut self, i: NodeId, fanout: Option<usize>) -> Result<(), PlanError> {
        self.check(i)?;
        if fanout == Some(0) {
            return Err(PlanError::BadValue {
                what: "max_fanout",
                value: 0.0,
            });
        }
        self.max_fanout[i] = fanout;
        Ok(())
    }

    /// Sets the path-capacity matrix (Mbit/s per directed pair; `inf` = unlimited).
    pub fn set_bandwidth(&mut self, m: Matrix) -> Result<(), PlanError> {
        if m.len() != self.len() {
            return Err(PlanError::Shape {
                what: "bandwidth_mbps",
                expected: self.len(),
                row: m.len(),
                got: m.len(),
            });
        }
        m.validate("bandwidth_mbps", EntryKind::Capacity)?;
        self.bandwidth = Some(m);
        Ok(())
    }

    /// Sets the shared WAN capacity from site `from` to site `to`. Both sites must be the
    /// label of at least one node (so set sites first).
    pub fn set_wan(&mut self, from: &str, to: &str, mbps: f64) -> Result<(), PlanError> {
        for s in [from, to] {
            if !self.sites.iter().any(|x| x.as_deref() == Some(s)) {
                return Err(PlanError::NoSuchSite(s.to_string()));
            }
        }
        let c = capacity("wan mbps", Some(mbps))?;
        self.wan
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string(), c);
        Ok(())
    }

    /// Replaces the RTT matrix (same size).
    pub fn set_rtt(&mut self, m: Matrix) -> Result<(), PlanError> {
        if m.len() != self.len() {
            return Err(PlanError::Shape {
                what: "rtt_ms",
                expected: self.len(),
                row: m.len(),
                got: m.len(),
            });
        }
        m.validate("rtt_ms", EntryKind::Rtt)?;
        self.rtt = m;
        Ok(())
    }

    /// The same network with node `root` swapped into position 0, so that it becomes the
    /// source every algorithm roots its trees at. Returns the network and `perm`, where
    /// `perm[new] = old`.
    pub fn rooted_at(&self, root: NodeId) -> Result<(Network, Vec<NodeId>), PlanError> {
        self.check(root)?;
        let n = self.len();
        let mut perm: Vec<NodeId> = (0..n).collect();
        perm.swap(0, root);
        let permute = |m: &Matrix| {
            let mut out = Matrix::filled(n, 0.0);
            for a in 0..n {
                for b in 0..n {
                    out.set(a, b, m.at(perm[a], perm[b]));
                }
            }
            out
        };
        let pick = |v: &[f64]| perm.iter().map(|&o| v[o]).collect::<Vec<_>>();
        let net = Network {
            names: perm.iter().map(|&o| self.names[o].clone()).collect(),
            sites: perm.iter().map(|&o| self.sites[o].clone()).collect(),
            uplink: pick(&self.uplink),
            downlink: pick(&self.downlink),
            max_fanout: perm.iter().map(|&o| self.max_fanout[o]).collect(),
            rtt: permute(&self.rtt),
            bandwidth: self.bandwidth.as_ref().map(permute),
            wan: self.wan.clone(),
        };
        Ok((net, perm))
    }

    /// Dense site ids: nodes sharing a label share an id; a node without a site gets its own.
    /// Ids are numbered in order of first appearance, so the source's site is 0.
    pub fn site_ids(&self) -> (Vec<usize>, usize) {
        let mut by_label: HashMap<&str, usize> = HashMap::new();
        let mut next = 0;
        let ids = self
            .sites
            .iter()
            .map(|s| {
                let id = match s {
                    Some(label) => *by_label.entry(label.as_str()).or_insert(next),
                    None => next,
                };
                if id == next {
                    next += 1;
                }
                id
            })
            .collect();
        (ids, next)
    }

    pub(crate) fn resources(&self) -> Resources {
        Resources::new(self)
    }

    fn check(&self, i: NodeId) -> Result<(), PlanError> {
        if i < self.len() {
            Ok(())
        } else {
            Err(PlanError::NoSuchNode(i))
        }
    }
}

fn finite(c: f64) -> Option<f64> {
    c.is_finite().then_some(c)
}

fn capacity(what: &'static str, mbps: Option<f64>) -> Result<f64, PlanError> {
    match mbps {
        None => Ok(f64::INFINITY),
        Some(v) if v > 0.0 => Ok(v),
        Some(v) => Err(PlanError::BadValue { what, value: v }),
    }
}

/// The finite-capacity resources of a network, numbered densely, and which of them each
/// overlay edge consumes (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Resources {
    pub caps: Vec<f64>,
    pub kinds: Vec<ResourceKind>,
    n: usize,
    up: Vec<Option<usize>>,
    down: Vec<Option<usize>>,
    pair: Vec<Option<usize>>,
    site: Vec<usize>,
    sites: usize,
    /// Resource id of the WAN link from site a to site b at `a * sites + b`.
    wan: Vec<Option<usize>>,
}

/// What a resource is, for explanations ("bottleneck: uplink of fra-1").
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ResourceKind {
    Uplink(NodeId),
    Downlink(NodeId),
    Path(NodeId, NodeId),
    Wan(String, String),
}

impl Resources {
    fn new(net: &Network) -> Self {
        let n = net.len();
        let mut caps = Vec::new();
        let mut kinds = Vec::new();
        let mut add = |c: f64, k: ResourceKind| -> Option<usize> {
            c.is_finite().then(|| {
                caps.push(c);
                kinds.push(k);
                caps.len() - 1
            })
        };
        let up = (0..n)
            .map(|i| add(net.uplink[i], ResourceKind::Uplink(i)))
            .collect();
        let down = (0..n)
            .map(|i| add(net.downlink[i], ResourceKind::Downlink(i)))
            .collect();
        // Only allocated when path capacities exist (n^2 entries).
        let mut pair = Vec::new();
        if let Some(bw) = &net.bandwidth {
            pair = vec![None; n * n];
            for i in 0..n {
                for j in 0..n {
                    if i != j && j != 0 {
                        pair[i * n + j] = add(bw.at(i, j), ResourceKind::Path(i, j));
                    }
                }
            }
        }
        let (site, sites) = net.site_ids();
        let mut label_id: HashMap<&str, usize> = HashMap::new();
        for (i, s) in net.sites.iter().enumerate() {
            if let Some(s) = s {
                label_id.insert(s.as_str(), site[i]);
            }
        }
        let mut wan_keys: Vec<((&String, &String), &f64)> = net
            .wan
            .iter()
            .flat_map(|(a, m)| m.iter().map(move |(b, c)| ((a, b), c)))
            .collect();
        wan_keys.sort_by(|x, y| x.0.cmp(&y.0));
        let mut wan = vec![None; sites * sites];
        for ((a, b), &c) in wan_keys {
            if let (Some(&x), Some(&y)) = (label_id.get(a.as_str()), label_id.get(b.as_str())) {
                if x != y {
                    wan[x * sites + y] = add(c, ResourceKind::Wan(a.clone(), b.clone()));
                }
            }
        }
        Self {
            caps,
            kinds,
            n,
            up,
            down,
            pair,
            site,
            sites,
            wan,
        }
    }

    pub fn len(&self) -> usize {
        self.caps.len()
    }

    /// Calls `f(resource)` for every resource edge i -> j consumes.
    pub fn for_edge(&self, i: NodeId, j: NodeId, mut f: impl FnMut(usize)) {
        if let Some(r) = self.up[i] {
            f(r);
        }
        if let Some(r) = self.down[j] {
            f(r);
        }
        if let Some(Some(r)) = self.pair.get(i * self.n + j) {
            f(*r);
        }
        if let Some(r) = self.wan[self.site[i] * self.sites + self.site[j]] {
            f(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts() -> HostsFile {
        HostsFile::parse_toml(
            r#"
            [source]
            name = "s"
            site = "A"
            uplink_mbps = 100
            [[host]]
            name = "h1"
            addr = "x:1"
            site = "B"
            downlink_mbps = 50
            [[host]]
            name = "h2"
            addr = "y:1"
            site = "B"
            max_fanout = 2
            "#,
        )
        .unwrap()
    }

    #[test]
    fn builds_from_hosts_in_hosts_order() {
        // The matrix lists the nodes in another order; the network follows the hosts file.
        let m = MatrixFile::parse_toml(
            r#"
            nodes = ["h2", "s", "h1"]
            rtt_ms = [[0, 30, 1], [30, 0, 20], [1, 20, 0]]
            [[wan]]
            from = "A"
            to = "B"
            mbps = 80
            "#,
        )
        .unwrap();
        let net = Network::from_hosts(&hosts(), &m).unwrap();
        assert_eq!(net.names(), ["s", "h1", "h2"]);
        assert_eq!(net.rtt(0, 1), 20.0);
        assert_eq!(net.rtt(0, 2), 30.0);
        assert_eq!(net.rtt(1, 2), 1.0);
        assert_eq!(net.uplink(0), Some(100.0));
        assert_eq!(net.max_fanout(2), Some(2));
        assert_eq!(net.wan_capacity(0, 1), Some(80.0));
        assert_eq!(net.wan_capacity(1, 0), None);
        assert_eq!(net.wan_capacity(1, 2), None);
        assert_eq!(net.edge_capacity(0, 1), 50.0);
        assert_eq!(net.edge_capacity(0, 2), 80.0);
        assert_eq!(net.site_ids(), (vec![0, 1, 1], 2));
        assert_eq!(net.resources().len(), 3);
    }

    #[test]
    fn rejects_mismatched_names_and_bad_values() {
        let m = MatrixFile::parse_toml("nodes=['s','h1','zz']\nrtt_ms=[[0,1,1],[1,0,1],[1,1,0]]")
            .unwrap();
        assert_eq!(
            Network::from_hosts(&hosts(), &m),
            Err(PlanError::NodeMismatch("h2".into()))
        );
        let mut net = Network::new(Matrix::filled(3, 1.0)).unwrap();
        assert!(net.set_uplink(1, Some(0.0)).is_err());
        assert!(net.set_downlink(1, Some(f64::NAN)).is_err());
        assert!(net.set_uplink(3, Some(1.0)).is_err());
        assert!(net.set_max_fanout(1, Some(0)).is_err());
        assert!(net.set_wan("a", "b", 1.0).is_err());
        assert!(net.set_bandwidth(Matrix::filled(2, 1.0)).is_err());
        assert!(net.set_bandwidth(Matrix::filled(3, -1.0)).is_err());
        assert!(net.set_uplink(1, Some(10.0)).is_ok());
        assert!(!net.is_uncapacitated());
    }

    #[test]
    fn rooted_at_swaps_the_root_in() {
        let mut rtt = Matrix::filled(3, 0.0);
        rtt.set(0, 2, 7.0);
        rtt.set(2, 0, 7.0);
        let mut net = Network::new(rtt).unwrap();
        net.set_uplink(2, Some(5.0)).unwrap();
        let (r, perm) = net.rooted_at(2).unwrap();
        assert_eq!(perm, vec![2, 1, 0]);
        assert_eq!(r.name(0), "2");
        assert_eq!(r.uplink(0), Some(5.0));
        assert_eq!(r.rtt(0, 2), 7.0);
    }
}
