//! The resolved scenario: hosts with addresses, directed links and schedules, all indices
//! resolved, as the topology builder and the forwarder take it.
//!
//! Called a *layout*, not a plan: in bulkcast a plan is the planner's overlay (who relays to
//! whom); a layout is the emulated network that overlay runs on.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// The resolved lab: what the topology builder and the forwarder need, all indices resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// Scenario name.
    pub name: String,
    /// RNG seed.
    pub seed: u64,
    /// Site names, index = site id.
    pub sites: Vec<String>,
    /// Hosts in order.
    pub hosts: Vec<LayoutHost>,
    /// Every directed emulated link (WAN paths, channels, access links).
    pub links: Vec<LayoutLink>,
    /// `site_links[from][to]`: link for WAN traffic between two different sites.
    pub site_links: Vec<Vec<Option<usize>>>,
    /// Channels.
    pub channels: Vec<LayoutChannel>,
    /// Scheduled condition changes, sorted by time.
    pub events: Vec<LayoutEvent>,
    /// Alternating links.
    pub alternates: Vec<LayoutAlternate>,
    /// Fluctuation: period in ns, share range, links affected.
    pub fluctuation: Option<LayoutFluctuation>,
    /// Index of the source host.
    pub source: usize,
    /// Agent port for the hosts file.
    pub agent_port: u16,
    /// Ideal per-receiver rate in bit/s (None: unbounded).
    pub ideal_bps: Option<f64>,
    /// Traffic between sites crosses one kernel bridge, shaped by htb and dropped by nft,
    /// instead of the forwarder ([`Shaping`](super::Shaping)).
    #[serde(default)]
    pub kernel_shaping: bool,
}

/// One host of the layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutHost {
    /// Host name.
    pub name: String,
    /// Site index.
    pub site: usize,
    /// Main address (on the LAN, reachable from everywhere).
    pub addr: Ipv4Addr,
    /// Access uplink link index.
    pub uplink: usize,
    /// Access downlink link index.
    pub downlink: usize,
    /// Nominal uplink rate in Mbit/s (for the hosts file).
    pub uplink_mbps: Option<f64>,
    /// Nominal downlink rate in Mbit/s.
    pub downlink_mbps: Option<f64>,
    /// One-way delay of the host's port in ns, each direction (0: none). A host with a port
    /// delay reaches its LAN through a pair of TAP devices and the forwarder's delay stage
    /// (`lan.rs`) instead of a veth; its access links carry the same delay for WAN traffic.
    #[serde(default)]
    pub port_delay_ns: u64,
    /// Random loss of every packet the host receives (nft on its `lan0`; its access downlink
    /// carries the same loss for WAN traffic through the forwarder).
    #[serde(default)]
    pub port_loss: f64,
}

/// One directed link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutLink {
    /// Display name, e.g. `oregon->london`, `ch1:a->b`, `up:a-1`.
    pub name: String,
    /// Rate in bit/s (None: unlimited).
    pub rate_bps: Option<f64>,
    /// One-way delay in ns.
    pub delay_ns: u64,
    /// Jitter in ns.
    pub jitter_ns: u64,
    /// Loss probability.
    pub loss: f64,
    /// Queue limit in bytes.
    pub queue_bytes: u64,
    /// Allow reordering.
    pub reorder: bool,
}

/// One channel: addresses of both ends and its two directed links.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutChannel {
    /// Channel name.
    pub name: String,
    /// Host at end A.
    pub a: usize,
    /// Host at end B.
    pub b: usize,
    /// A's address on this channel.
    pub a_addr: Ipv4Addr,
    /// B's address on this channel.
    pub b_addr: Ipv4Addr,
    /// Link A -> B.
    pub a_to_b: usize,
    /// Link B -> A.
    pub b_to_a: usize,
}

/// A change of one link at a time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutEvent {
    /// Time in ns after the clock start.
    pub at_ns: u64,
    /// Link index.
    pub link: usize,
    /// New rate in bit/s.
    pub rate_bps: Option<f64>,
    /// New loss.
    pub loss: Option<f64>,
}

/// A link cycling through rates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutAlternate {
    /// Link index.
    pub link: usize,
    /// Period in ns.
    pub every_ns: u64,
    /// Rates in bit/s.
    pub rates_bps: Vec<f64>,
}

/// Resolved fluctuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutFluctuation {
    /// Period in ns.
    pub every_ns: u64,
    /// Lowest share.
    pub min_share: f64,
    /// Highest share.
    pub max_share: f64,
    /// Links affected, with their nominal rates in bit/s.
    pub links: Vec<(usize, f64)>,
}

impl Layout {
    /// Why the kernel cannot emulate this layout (None: it can). The kernel path has rates on
    /// access links and random loss between sites, nothing else: no `tc netem` here, so no
    /// delay or jitter between sites, and no shared WAN bottleneck or schedule. Hosts' port
    /// delays are no obstacle: the forwarder's delay stage (`lan.rs`) applies them either way.
    pub fn kernel_obstacle(&self) -> Option<String> {
        if !self.channels.is_empty() {
            return Some("channels need the forwarder".into());
        }
        if !self.events.is_empty() || !self.alternates.is_empty() || self.fluctuation.is_some() {
            return Some("conditions that change over time need the forwarder".into());
        }
        for l in self
            .site_links
            .iter()
            .flatten()
            .flatten()
            .map(|&i| &self.links[i])
        {
            if l.delay_ns > 0 || l.jitter_ns > 0 {
                return Some(format!("path {} has delay or jitter", l.name));
            }
            if l.rate_bps.is_some() {
                return Some(format!("path {} has a rate of its own", l.name));
            }
        }
        None
    }

    /// Indices of the hosts whose port has a delay (they sit behind the delay stage).
    pub fn delayed_ports(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&i| self.hosts[i].port_delay_ns > 0)
            .collect()
    }

    /// Random loss from site `from` to site `to` (0 inside a site).
    pub fn site_loss(&self, from: usize, to: usize) -> f64 {
        self.site_links
            .get(from)
            .and_then(|row| row.get(to).copied().flatten())
            .map_or(0.0, |i| self.links[i].loss)
    }
}

impl Layout {
    /// Index of a host by name.
    pub fn host(&self, name: &str) -> Option<usize> {
        self.hosts.iter().position(|h| h.name == name)
    }

    /// Links a packet from host `a` to destination address `dst` crosses, in order, or `None`
    /// when the pair talks over the site LAN (or the address is unknown).
    pub fn route(&self, a: usize, dst: Ipv4Addr) -> Option<Vec<usize>> {
        for c in &self.channels {
            if c.a == a && c.b_addr == dst {
                return Some(vec![
                    self.hosts[a].uplink,
                    c.a_to_b,
                    self.hosts[c.b].downlink,
                ]);
            }
            if c.b == a && c.a_addr == dst {
                return Some(vec![
                    self.hosts[a].uplink,
                    c.b_to_a,
                    self.hosts[c.a].downlink,
                ]);
            }
        }
        let b = self.hosts.iter().position(|h| h.addr == dst)?;
        let (sa, sb) = (self.hosts[a].site, self.hosts[b].site);
        if sa == sb {
            return None;
        }
        Some(vec![
            self.hosts[a].uplink,
            self.site_links[sa][sb]?,
            self.hosts[b].downlink,
        ])
    }
}
