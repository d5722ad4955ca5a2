//! What TCP itself carries over a lab's WAN links when they are loaded as a broadcast loads
//! them: the yardstick that `lab_tcp_bound` puts beside the links' configured rates.
//!
//! A broadcast's bound ([`bulkcast_proto::swarm::sim::broadcast_bound`]) counts the links'
//! IP bytes and assumes each direction of a link carries its full rate whatever the other
//! direction does. TCP gets neither: a full-size segment carries 1448 of its 1500 bytes, and
//! when both directions of a link carry data, each direction's acknowledgements queue behind
//! the other's data (lab, one 32 Mbit/s link, iperf3 for 25 s: 30.8 Mbit/s one way; two ways
//! at once 29.2 / 29.3 at 20 ms and 29.0 / 25.2 at 100 ms). Reaching a seed 004 bound takes
//! every receiving cluster forwarding to every other one, so the links between receiving
//! clusters carry data both ways. [`tcp_mesh`] loads every WAN path at once the same way:
//! out of the source's site one way (nothing has to flow into it), between two receiving
//! sites both ways, one iperf3 stream per direction, and reports what each direction
//! received.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use bulkcast_proto::swarm::sim::{broadcast_bound, Topology};

use crate::check::{wait_output, HostProbe, HostProbeRun};
use crate::lab::Lab;
use crate::scenario::{Layout, LayoutHost};
use crate::LabError;

/// Stands for "unlimited" (bytes per second): far above any lab link.
pub const UNLIMITED: f64 = 1e13;

/// The layout as the simulator's cluster graph: each site a cluster, the source's site first
/// (its node 0 is the source); `wan(x, y)` gives the rate from site x to site y in bytes per
/// second (layout indices; it is asked only where a path exists, the others are 0). Access
/// links: the simulator has one rate for all hosts, the smallest (the seed 004 scenarios set
/// none). Returns the sites in the simulator's order, and the topology.
pub fn cluster_topology(
    layout: &Layout,
    wan: impl Fn(usize, usize) -> f64,
) -> (Vec<usize>, Topology) {
    let src_site = layout.hosts[layout.source].site;
    let order: Vec<usize> = std::iter::once(src_site)
        .chain((0..layout.sites.len()).filter(|&s| s != src_site))
        .collect();
    let clusters = order
        .iter()
        .map(|&s| layout.hosts.iter().filter(|h| h.site == s).count())
        .collect();
    let access = |pick: fn(&LayoutHost) -> usize| {
        layout
            .hosts
            .iter()
            .filter_map(|h| layout.links[pick(h)].rate_bps)
            .map(|r| r / 8.0)
            .fold(UNLIMITED, f64::min)
    };
    let wan = order
        .iter()
        .map(|&x| {
            order
                .iter()
                .map(|&y| match layout.site_links[x][y] {
                    Some(_) if x != y => wan(x, y),
                    _ => 0.0,
                })
                .collect()
        })
        .collect();
    let topo = Topology {
        clusters,
        access_up: access(|h| h.uplink),
        access_down: access(|h| h.downlink),
        lan_latency: Duration::ZERO,
        wan,
        wan_latency: Duration::ZERO,
    };
    (order, topo)
}

/// How long to measure, and with which congestion control.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// Seconds measured (after `omit_s`).
    pub secs: u32,
    /// Seconds of slow start left out.
    pub omit_s: u32,
    /// Congestion control of every stream.
    pub cc: String,
    /// First TCP port; each flow takes the next one.
    pub base_port: u16,
}

impl Default for MeshOptions {
    fn default() -> Self {
        MeshOptions {
            secs: 20,
            omit_s: 3,
            cc: "bbr".into(),
            base_port: 5301,
        }
    }
}

/// One iperf3 run between two sites: a stream from `from` to `to`, and with `two_way` one
/// more from `to` to `from` at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshFlow {
    /// Site indices in the layout.
    pub from_site: usize,
    pub to_site: usize,
    /// Host names (client, server).
    pub from_host: String,
    pub to_host: String,
    pub two_way: bool,
}

/// What one direction of a WAN path received.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DirectedGoodput {
    pub from: String,
    pub to: String,
    /// Payload Mbit/s received (iperf3's `sum_received`).
    pub mbps: f64,
    /// The path's configured rate now (IP bytes), Mbit/s.
    pub rate_mbps: Option<f64>,
    /// Whether the reverse direction carried a stream at the same time.
    pub two_way: bool,
}

/// The mesh measurement of a running lab.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MeshReport {
    pub links: Vec<DirectedGoodput>,
    /// Forwarder events more than 1 ms late during the measurement.
    pub late_events: u64,
    /// The host's own timer probe over the measurement.
    pub host: Option<HostProbe>,
}

impl MeshReport {
    /// Whether the machine stalled during the measurement (the figures measured it too).
    pub fn host_stalled(&self) -> bool {
        self.host.as_ref().is_some_and(HostProbe::stalled)
    }

    /// The broadcast bound of `layout` (the lab this was measured on) over the measured
    /// goodputs, payload bytes per second: each measured direction is its link's rate, every
    /// other link (into the source's site) carries nothing; access links keep their
    /// configured rates (none in the seed 004 scenarios).
    pub fn bound(&self, layout: &Layout) -> f64 {
        let goodput = |x: usize, y: usize| {
            self.links
                .iter()
                .find(|l| l.from == layout.sites[x] && l.to == layout.sites[y])
                .map_or(0.0, |l| l.mbps * 1e6 / 8.0)
        };
        broadcast_bound(&cluster_topology(layout, goodput).1)
    }
}

/// The flows that load every WAN path of the layout as a broadcast from `source_site` does:
/// one-way out of the source's site, two-way between the others (each unordered pair once).
/// Each site spreads its flows over its hosts: the k-th other site talks to host k mod n.
pub fn mesh_flows(
    site_hosts: &[Vec<String>],
    has_path: impl Fn(usize, usize) -> bool,
    source_site: usize,
) -> Vec<MeshFlow> {
    let sites = site_hosts.len();
    let host = |x: usize, y: usize| -> Option<String> {
        let k = (0..sites).filter(|&s| s != x).position(|s| s == y)?;
        let h = &site_hosts[x];
        (!h.is_empty()).then(|| h[k % h.len()].clone())
    };
    let mut out = Vec::new();
    for x in 0..sites {
        for y in 0..sites {
            if x == y || y == source_site || !has_path(x, y) {
                continue;
            }
            let two_way = x != source_site && has_path(y, x);
            if two_way && y < x {
                continue; // the pair's flow was listed from y
            }
            if let (Some(from_host), Some(to_host)) = (host(x, y), host(y, x)) {
                out.push(MeshFlow {
                    from_site: x,
                    to_site: y,
                    from_host,
                    to_host,
                    two_way,
                });
            }
        }
    }
    out
}

/// Both directions' payload Mbit/s from an iperf3 `-J` report (the reverse one only with
/// `--bidir`).
pub fn iperf3_goodput(v: &serde_json::Value) -> Result<(f64, Option<f64>), LabError> {
    if let Some(err) = v.get("error").and_then(|e| e.as_str()) {
        return Err(LabError::Measure(format!("iperf3: {err}")));
    }
    let mbps = |key: &str| {
        v.pointer(&format!("/end/{key}/bits_per_second"))
            .and_then(|b| b.as_f64())
            .map(|b| b / 1e6)
    };
    let fwd =
        mbps("sum_received").ok_or_else(|| LabError::Measure("iperf3: no sum_received".into()))?;
    Ok((fwd, mbps("sum_received_bidir_reverse")))
}

/// Runs every flow of [`mesh_flows`] at once for `opts.secs` and reports each direction.
pub fn tcp_mesh(lab: &Lab, opts: &MeshOptions) -> Result<MeshReport, LabError> {
    let layout = lab.layout();
    let site_hosts: Vec<Vec<String>> = (0..layout.sites.len())
        .map(|s| {
            layout
                .hosts
                .iter()
                .filter(|h| h.site == s)
                .map(|h| h.name.clone())
                .collect()
        })
        .collect();
    let source_site = layout.hosts[layout.source].site;
    let flows = mesh_flows(
        &site_hosts,
        |x, y| layout.site_links[x][y].is_some(),
        source_site,
    );
    if flows.is_empty() {
        return Err(LabError::Measure("no WAN path to measure".into()));
    }
    let late0 = lab.stats().late_events;
    let probe = HostProbeRun::start();
    let limit = Duration::from_secs((opts.secs + opts.omit_s + 20) as u64);
    // Servers first (each serves one test), then every client at once.
    let mut servers: Vec<Child> = Vec::new();
    let result = (|| {
        for (i, f) in flows.iter().enumerate() {
            let port = opts.base_port + i as u16;
            let mut s = lab.command(&f.to_host, "iperf3")?;
            s.args(["-s", "-1", "-p", &port.to_string()])
                .args(["-B", &lab.addr(&f.to_host)?.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            servers.push(
                s.spawn()
                    .map_err(|e| LabError::sys("start iperf3 (is it installed?)", e))?,
            );
        }
        wait_listening(lab, &flows, opts.base_port)?;
        let mut clients = Vec::new();
        for (i, f) in flows.iter().enumerate() {
            let port = opts.base_port + i as u16;
            let mut c = lab.command(&f.from_host, "iperf3")?;
            c.args(["-c", &lab.addr(&f.to_host)?.to_string()])
                .args(["-p", &port.to_string()])
                .args(["-B", &lab.addr(&f.from_host)?.to_string()])
                .args(["-t", &opts.secs.to_string(), "-O", &opts.omit_s.to_string()])
                .args(["-C", &opts.cc, "-J"])
                .args(f.two_way.then_some("--bidir"))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            clients.push(c.spawn().map_err(|e| LabError::sys("start iperf3", e))?);
        }
        // The configured rate of site x -> site y, Mbit/s.
        let rate = |x: usize, y: usize| {
            layout.site_links[x][y].and_then(|l| layout.links[l].rate_bps.map(|r| r / 1e6))
        };
        let mut links = Vec::new();
        for (f, c) in flows.iter().zip(clients) {
            let (_, out) = wait_output(c, limit)?;
            let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| {
                LabError::Measure(format!(
                    "iperf3 {} -> {}: output is not JSON ({e})",
                    f.from_host, f.to_host
                ))
            })?;
            let (fwd, rev) = iperf3_goodput(&v)?;
            links.push(DirectedGoodput {
                from: layout.sites[f.from_site].clone(),
                to: layout.sites[f.to_site].clone(),
                mbps: fwd,
                rate_mbps: rate(f.from_site, f.to_site),
                two_way: f.two_way,
            });
            if f.two_way {
                let rev = rev.ok_or_else(|| {
                    LabError::Measure("iperf3 --bidir: no sum_received_bidir_reverse".into())
                })?;
                links.push(DirectedGoodput {
                    from: layout.sites[f.to_site].clone(),
                    to: layout.sites[f.from_site].clone(),
                    mbps: rev,
                    rate_mbps: rate(f.to_site, f.from_site),
                    two_way: true,
                });
            }
        }
        Ok(links)
    })();
    for s in servers {
        let _ = wait_output(s, Duration::from_secs(3));
    }
    let host = probe.finish();
    Ok(MeshReport {
        links: result?,
        late_events: lab.stats().late_events - late0,
        host,
    })
}

/// Waits (at most 3 s) until every flow's server listens on its port.
fn wait_listening(lab: &Lab, flows: &[MeshFlow], base_port: u16) -> Result<(), LabError> {
    let deadline = Instant::now() + Duration::from_secs(3);
    for (i, f) in flows.iter().enumerate() {
        let port = format!(":{}", base_port + i as u16);
        loop {
            let out = lab.exec(&f.to_host, &["ss", "-Htln"])?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.split_whitespace().any(|w| w.ends_with(&port)) {
                break;
            }
            if Instant::now() > deadline {
                return Err(LabError::Measure(format!(
                    "iperf3 server on {} port {} did not start",
                    f.to_host,
                    base_port + i as u16
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(sizes: &[usize]) -> Vec<Vec<String>> {
        sizes
            .iter()
            .enumerate()
            .map(|(s, &n)| {
                (1..=n)
                    .map(|i| format!("{}-{i}", (b'A' + s as u8) as char))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_source_site_sends_one_way_the_others_both_ways_each_pair_once() {
        let f = mesh_flows(&hosts(&[4, 4, 4, 4]), |_, _| true, 0);
        let pairs: Vec<_> = f
            .iter()
            .map(|f| (f.from_site, f.to_site, f.two_way))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (0, 1, false),
                (0, 2, false),
                (0, 3, false),
                (1, 2, true),
                (1, 3, true),
                (2, 3, true)
            ]
        );
        // Every site spreads its flows over its hosts.
        let from_a: Vec<_> = f
            .iter()
            .filter(|f| f.from_site == 0)
            .map(|f| &f.from_host)
            .collect();
        assert_eq!(from_a, ["A-1", "A-2", "A-3"]);
        let b_c = &f[3];
        assert_eq!(
            (b_c.from_host.as_str(), b_c.to_host.as_str()),
            ("B-2", "C-2")
        );
    }

    #[test]
    fn a_missing_reverse_path_makes_the_flow_one_way_and_small_sites_reuse_hosts() {
        // C -> B has no path: B -> C is measured one way; A has one host for three flows.
        let f = mesh_flows(&hosts(&[1, 2, 3]), |x, y| !(x == 2 && y == 1), 0);
        let pairs: Vec<_> = f
            .iter()
            .map(|f| (f.from_site, f.to_site, f.two_way, f.from_host.as_str()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (0, 1, false, "A-1"),
                (0, 2, false, "A-1"),
                (1, 2, false, "B-2")
            ]
        );
    }

    #[test]
    fn goodput_is_read_from_both_directions_and_errors_are_reported() {
        let v = serde_json::json!({"end": {
            "sum_received": {"bits_per_second": 29.2e6},
            "sum_received_bidir_reverse": {"bits_per_second": 25.2e6}}});
        assert_eq!(iperf3_goodput(&v).unwrap(), (29.2, Some(25.2)));
        let one = serde_json::json!({"end": {"sum_received": {"bits_per_second": 30.8e6}}});
        assert_eq!(iperf3_goodput(&one).unwrap(), (30.8, None));
        let err = serde_json::json!({"error": "unable to connect to server"});
        let e = iperf3_goodput(&err).unwrap_err().to_string();
        assert!(e.contains("unable to connect"), "{e}");
        assert!(iperf3_goodput(&serde_json::json!({})).is_err());
    }
}
