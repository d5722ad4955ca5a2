//! Scenario files: sites, hosts, WAN paths, channels and time-varying conditions (TOML).
//!
//! The format is documented with examples in `docs/lab.md`; [`Scenario::parse`] checks it and
//! [`Scenario::resolve`] (in `resolve.rs`) turns it into the concrete [`Layout`] the forwarder
//! runs (`layout.rs`).

use serde::{Deserialize, Serialize};

use crate::LabError;

mod layout;
mod resolve;

pub use layout::{
    Layout, LayoutAlternate, LayoutChannel, LayoutEvent, LayoutFluctuation, LayoutHost, LayoutLink,
};

/// Port written into the hosts file for every host's agent unless the scenario says otherwise.
pub const DEFAULT_AGENT_PORT: u16 = 7400;
/// Default MTU of the emulated links: loss and queue decisions are made per packet of this size.
pub const MTU: usize = 1500;

/// A parsed scenario file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (used for the lab name when none is given).
    #[serde(default)]
    pub name: Option<String>,
    /// Free text: where the numbers come from.
    #[serde(default)]
    pub description: Option<String>,
    /// Seed for loss, jitter and fluctuation: same seed, same sequence of decisions.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Name of the sending host (written as `[source]` in the hosts file); default: the first host.
    #[serde(default)]
    pub source: Option<String>,
    /// Port of each host's agent in the hosts file.
    #[serde(default)]
    pub agent_port: Option<u16>,
    /// The ideal per-receiver rate in Mbit/s, when it is known better than the default bound
    /// (min of the source's uplink and the receivers' downlinks).
    #[serde(default)]
    pub ideal_mbps: Option<f64>,
    /// Sites (clusters); hosts of one site share a LAN bridge.
    #[serde(default, rename = "site")]
    pub sites: Vec<SiteSpec>,
    /// Parameters of every site pair not listed in `path`.
    #[serde(default)]
    pub default_path: Option<LinkSpec>,
    /// WAN paths between sites.
    #[serde(default, rename = "path")]
    pub paths: Vec<PathSpec>,
    /// Extra address pairs between two hosts, each with its own link.
    #[serde(default, rename = "channel")]
    pub channels: Vec<ChannelSpec>,
    /// Step changes at a given second.
    #[serde(default, rename = "change")]
    pub changes: Vec<ChangeSpec>,
    /// Links that cycle through a list of rates.
    #[serde(default, rename = "alternate")]
    pub alternates: Vec<AlternateSpec>,
    /// Seeded random fluctuation of every WAN path.
    #[serde(default)]
    pub fluctuation: Option<FluctuationSpec>,
    /// Who emulates the links between sites (default: [`Shaping::Auto`]).
    #[serde(default)]
    pub shaping: Shaping,
}

/// Who emulates the links between sites.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shaping {
    /// The kernel where the scenario allows it ([`Layout::kernel_shaping`]), else the forwarder.
    #[default]
    Auto,
    /// The user-space forwarder (delay, jitter, changes over time; one thread for every packet).
    Forwarder,
    /// The kernel: htb on every access link and nft random drop per pair of sites. Only for
    /// scenarios without delay, jitter, WAN rates, channels or changes over time; the kernel
    /// carries a star at line rate where the forwarder's one thread caps it near 0.90.
    Kernel,
}

fn default_seed() -> u64 {
    1
}

/// A site: a LAN of hosts behind their access links.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteSpec {
    /// Site name (hosts are named `<site>-<n>` when given by count).
    pub name: String,
    /// Number of hosts named `<site>-1..=<site>-N`.
    #[serde(default)]
    pub hosts: Option<usize>,
    /// Hosts listed by name, with optional own access rates.
    #[serde(default, rename = "host")]
    pub host_list: Vec<HostDef>,
    /// Default access uplink of this site's hosts in Mbit/s (absent: unlimited).
    #[serde(default)]
    pub uplink_mbps: Option<f64>,
    /// Default access downlink of this site's hosts in Mbit/s (absent: unlimited).
    #[serde(default)]
    pub downlink_mbps: Option<f64>,
    /// Default one-way delay in ms of this site's hosts' ports, each direction (absent: none).
    #[serde(default)]
    pub delay_ms: Option<f64>,
    /// Default random loss of what this site's hosts receive (absent: none).
    #[serde(default)]
    pub loss: Option<f64>,
}

/// One host given by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostDef {
    /// Host name (letters, digits, `-`, `_`; at most 40 characters).
    pub name: String,
    /// Access uplink in Mbit/s (overrides the site's).
    #[serde(default)]
    pub uplink_mbps: Option<f64>,
    /// Access downlink in Mbit/s (overrides the site's).
    #[serde(default)]
    pub downlink_mbps: Option<f64>,
    /// One-way delay in ms of the host's port, in each direction, for everything it sends and
    /// receives, its own LAN and multicast included (overrides the site's; the seed-003
    /// testbed's netem delay per receiver). A round trip between two hosts crosses both ports
    /// twice.
    #[serde(default)]
    pub delay_ms: Option<f64>,
    /// Random loss, 0..1, of every packet the host receives, its own LAN and multicast included
    /// (overrides the site's; the seed-003 testbed's iptables drop per receiver).
    #[serde(default)]
    pub loss: Option<f64>,
}

/// Longest port delay a scenario may give: a port holds what arrives in one delay in memory.
pub const MAX_PORT_DELAY_MS: f64 = 1000.0;

/// Parameters of one emulated link direction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Line rate in Mbit/s of IP bytes (absent: unlimited).
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    /// One-way delay in ms.
    #[serde(default)]
    pub delay_ms: Option<f64>,
    /// Round-trip time in ms (sets each direction's one-way delay to half of it).
    #[serde(default)]
    pub rtt_ms: Option<f64>,
    /// Jitter in ms: each packet's delay varies uniformly within +- jitter.
    #[serde(default)]
    pub jitter_ms: Option<f64>,
    /// Random loss probability per packet, 0..1.
    #[serde(default)]
    pub loss: Option<f64>,
    /// Drop-tail queue limit in KiB (default: one bandwidth-delay product, at least 64 packets).
    #[serde(default)]
    pub queue_kb: Option<f64>,
    /// Let jitter reorder packets (default: a packet never overtakes an earlier one).
    #[serde(default)]
    pub reorder: Option<bool>,
}

/// A WAN path between two sites: both directions get the same parameters unless `oneway`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathSpec {
    /// Source site.
    pub from: String,
    /// Destination site.
    pub to: String,
    /// Only the direction from -> to.
    #[serde(default)]
    pub oneway: bool,
    /// Rate in Mbit/s.
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    /// One-way delay in ms.
    #[serde(default)]
    pub delay_ms: Option<f64>,
    /// Round-trip time in ms.
    #[serde(default)]
    pub rtt_ms: Option<f64>,
    /// Jitter in ms.
    #[serde(default)]
    pub jitter_ms: Option<f64>,
    /// Loss probability.
    #[serde(default)]
    pub loss: Option<f64>,
    /// Queue limit in KiB.
    #[serde(default)]
    pub queue_kb: Option<f64>,
    /// Allow reordering by jitter.
    #[serde(default)]
    pub reorder: Option<bool>,
}

impl PathSpec {
    fn link(&self) -> LinkSpec {
        LinkSpec {
            rate_mbps: self.rate_mbps,
            delay_ms: self.delay_ms,
            rtt_ms: self.rtt_ms,
            jitter_ms: self.jitter_ms,
            loss: self.loss,
            queue_kb: self.queue_kb,
            reorder: self.reorder,
        }
    }
}

/// A channel: an extra address pair between two hosts with its own link in each direction.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelSpec {
    /// Channel name (for changes and reports); default `ch<N>`.
    #[serde(default)]
    pub name: Option<String>,
    /// Host at the first end.
    pub from: String,
    /// Host at the second end.
    pub to: String,
    /// Rate in Mbit/s.
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    /// One-way delay in ms.
    #[serde(default)]
    pub delay_ms: Option<f64>,
    /// Round-trip time in ms.
    #[serde(default)]
    pub rtt_ms: Option<f64>,
    /// Jitter in ms.
    #[serde(default)]
    pub jitter_ms: Option<f64>,
    /// Loss probability.
    #[serde(default)]
    pub loss: Option<f64>,
    /// Queue limit in KiB.
    #[serde(default)]
    pub queue_kb: Option<f64>,
    /// Allow reordering by jitter.
    #[serde(default)]
    pub reorder: Option<bool>,
}

/// What a change applies to: a site pair (both directions unless `oneway`) or a channel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeSpec {
    /// Second (after the scenario clock starts) at which the change takes effect.
    pub at_s: f64,
    /// Source site of the path.
    #[serde(default)]
    pub from: Option<String>,
    /// Destination site of the path.
    #[serde(default)]
    pub to: Option<String>,
    /// Channel name instead of a path.
    #[serde(default)]
    pub channel: Option<String>,
    /// Only the direction from -> to.
    #[serde(default)]
    pub oneway: bool,
    /// New rate in Mbit/s.
    #[serde(default)]
    pub rate_mbps: Option<f64>,
    /// New loss probability.
    #[serde(default)]
    pub loss: Option<f64>,
}

/// A link that takes the rates in `rates_mbps` in turn, each for `every_s` seconds, forever.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlternateSpec {
    /// Source site of the path.
    #[serde(default)]
    pub from: Option<String>,
    /// Destination site of the path.
    #[serde(default)]
    pub to: Option<String>,
    /// Channel name instead of a path.
    #[serde(default)]
    pub channel: Option<String>,
    /// Only the direction from -> to.
    #[serde(default)]
    pub oneway: bool,
    /// Period of each rate in seconds.
    pub every_s: f64,
    /// Rates in Mbit/s, cycled.
    pub rates_mbps: Vec<f64>,
}

/// Every `every_s` seconds each WAN path (each direction independently) takes a random share in
/// `[min_share, max_share]` of its nominal rate, drawn from the scenario seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FluctuationSpec {
    /// Period in seconds.
    pub every_s: f64,
    /// Lowest share of the nominal rate.
    #[serde(default = "default_min_share")]
    pub min_share: f64,
    /// Highest share of the nominal rate.
    #[serde(default = "default_max_share")]
    pub max_share: f64,
    /// Also fluctuate channels.
    #[serde(default)]
    pub channels: bool,
}

fn default_min_share() -> f64 {
    0.1
}
fn default_max_share() -> f64 {
    1.0
}

fn bad(msg: impl Into<String>) -> LabError {
    LabError::Scenario(msg.into())
}

fn check_pos(what: &str, v: Option<f64>) -> Result<(), LabError> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => {
            Err(bad(format!("{what} must be positive, got {x}")))
        }
        _ => Ok(()),
    }
}

fn check_nonneg(what: &str, v: Option<f64>) -> Result<(), LabError> {
    match v {
        Some(x) if !(x.is_finite() && x >= 0.0) => {
            Err(bad(format!("{what} must be zero or positive, got {x}")))
        }
        _ => Ok(()),
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 40
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl LinkSpec {
    fn validate(&self, what: &str) -> Result<(), LabError> {
        check_pos(&format!("{what}: rate_mbps"), self.rate_mbps)?;
        check_nonneg(&format!("{what}: delay_ms"), self.delay_ms)?;
        check_nonneg(&format!("{what}: rtt_ms"), self.rtt_ms)?;
        check_nonneg(&format!("{what}: jitter_ms"), self.jitter_ms)?;
        check_pos(&format!("{what}: queue_kb"), self.queue_kb)?;
        if self.delay_ms.is_some() && self.rtt_ms.is_some() {
            return Err(bad(format!("{what}: give delay_ms or rtt_ms, not both")));
        }
        if let Some(l) = self.loss {
            if !(0.0..1.0).contains(&l) {
                return Err(bad(format!("{what}: loss must be in [0, 1), got {l}")));
            }
        }
        Ok(())
    }

    fn delay_ns(&self) -> u64 {
        let ms = self
            .delay_ms
            .or(self.rtt_ms.map(|r| r / 2.0))
            .unwrap_or(0.0);
        (ms * 1e6).round() as u64
    }

    fn resolve(&self, name: String) -> LayoutLink {
        let rate_bps = self.rate_mbps.map(|r| r * 1e6);
        let delay_ns = self.delay_ns();
        LayoutLink {
            name,
            rate_bps,
            delay_ns,
            jitter_ns: (self.jitter_ms.unwrap_or(0.0) * 1e6).round() as u64,
            loss: self.loss.unwrap_or(0.0),
            queue_bytes: match self.queue_kb {
                Some(kb) => (kb * 1024.0) as u64,
                // One BDP of the round trip (both directions assumed alike).
                None => default_queue(rate_bps, 2 * delay_ns),
            },
            reorder: self.reorder.unwrap_or(false),
        }
    }
}

/// Default drop-tail limit: one bandwidth-delay product, never below 64 full packets so a
/// zero-delay link still absorbs a TCP burst.
pub fn default_queue(rate_bps: Option<f64>, rtt_ns: u64) -> u64 {
    let floor = 64 * MTU as u64;
    match rate_bps {
        Some(r) => ((r / 8.0 * rtt_ns as f64 / 1e9) as u64).max(floor),
        None => floor,
    }
}

impl Scenario {
    /// Parses and validates a scenario's TOML text.
    pub fn parse(text: &str) -> Result<Self, LabError> {
        let s: Scenario = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        s.resolve()?;
        Ok(s)
    }

    /// Reads and parses a scenario file.
    pub fn load(path: &std::path::Path) -> Result<Self, LabError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const TWO: &str = r#"
        name = "two"
        [[site]]
        name = "a"
        hosts = 2
        uplink_mbps = 100
        downlink_mbps = 200
        [[site]]
        name = "b"
        [[site.host]]
        name = "bee"
        downlink_mbps = 50
        [[path]]
        from = "a"
        to = "b"
        rtt_ms = 100
        rate_mbps = 10
        loss = 0.01
        [[channel]]
        from = "a-1"
        to = "bee"
        rate_mbps = 20
        [[change]]
        at_s = 30
        from = "a"
        to = "b"
        rate_mbps = 5
        [[alternate]]
        channel = "ch1"
        oneway = true
        every_s = 20
        rates_mbps = [20, 30]
    "#;

    #[test]
    fn resolves_hosts_links_and_schedules() {
        let p = Scenario::parse(TWO).unwrap().resolve().unwrap();
        assert_eq!(p.hosts.len(), 3);
        assert_eq!(p.hosts[1].name, "a-2");
        assert_eq!(p.hosts[1].addr, Ipv4Addr::new(10, 77, 1, 11));
        assert_eq!(p.hosts[2].addr, Ipv4Addr::new(10, 77, 2, 10));
        assert_eq!(p.hosts[2].downlink_mbps, Some(50.0));
        let ab = p.site_links[0][1].unwrap();
        assert_eq!(p.links[ab].delay_ns, 50_000_000);
        assert_eq!(p.links[ab].rate_bps, Some(10e6));
        // One BDP: 10 Mbit/s * 100 ms = 125000 bytes (above the 64-packet floor of 96000).
        assert_eq!(p.links[ab].queue_bytes, 125_000);
        assert_eq!(p.events.len(), 2);
        assert_eq!(p.alternates.len(), 1);
        assert_eq!(p.alternates[0].link, p.channels[0].a_to_b);
        // Same site: LAN, no emulated route.
        assert_eq!(p.route(0, p.hosts[1].addr), None);
        let r = p.route(0, p.hosts[2].addr).unwrap();
        assert_eq!(r, vec![p.hosts[0].uplink, ab, p.hosts[2].downlink]);
        let r = p.route(2, p.channels[0].a_addr).unwrap();
        assert_eq!(r[1], p.channels[0].b_to_a);
        // The ideal: min(source uplink 100, downlinks 200, 50).
        assert_eq!(p.ideal_bps, Some(50e6));
    }

    #[test]
    fn port_delay_is_per_host_and_keeps_kernel_shaping() {
        let text = r#"
            [[site]]
            name = "lan"
            delay_ms = 10
            uplink_mbps = 100
            [[site.host]]
            name = "src"
            delay_ms = 0
            [[site.host]]
            name = "near"
            [[site.host]]
            name = "far"
            delay_ms = 25
            loss = 0.05
            [[site]]
            name = "b"
            hosts = 1
            [default_path]
            loss = 0.01
        "#;
        let p = Scenario::parse(text).unwrap().resolve().unwrap();
        let delays: Vec<u64> = p.hosts.iter().map(|h| h.port_delay_ns).collect();
        assert_eq!(delays, [0, 10_000_000, 25_000_000, 0]);
        assert_eq!(p.delayed_ports(), [1, 2]);
        // WAN traffic through the forwarder meets the same delay on the access links.
        assert_eq!(p.links[p.hosts[2].uplink].delay_ns, 25_000_000);
        assert_eq!(p.links[p.hosts[2].downlink].delay_ns, 25_000_000);
        // Its loss too, on what it receives only.
        assert_eq!(p.hosts[2].port_loss, 0.05);
        assert_eq!(p.links[p.hosts[2].downlink].loss, 0.05);
        assert_eq!(p.links[p.hosts[2].uplink].loss, 0.0);
        assert_eq!(p.hosts[1].port_loss, 0.0);
        // The delay stage is not the kernel's business: still kernel-shaped.
        assert!(p.kernel_shaping);
    }

    #[test]
    fn rejects_bad_scenarios() {
        for (text, want) in [
            ("", "at least one"),
            ("[[site]]\nname='a'\n", "no hosts"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='a'\nhosts=1\n", "twice"),
            ("[[site]]\nname='a b'\nhosts=1\n", "plain name"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n[[path]]\nfrom='a'\nto='b'\nloss=1.5\n", "loss"),
            ("[[site]]\nname='a'\nhosts=1\n[[path]]\nfrom='a'\nto='x'\n", "unknown site"),
            ("[[site]]\nname='a'\nhosts=1\ncolour='red'\n", "unknown field"),
            ("[[site]]\nname='a'\nhosts=1\ndelay_ms=-1\n", "site a: delay_ms must be zero or positive"),
            ("[[site]]\nname='a'\n[[site.host]]\nname='h'\ndelay_ms=1500\n", "host h: delay_ms 1500 is above"),
            ("[[site]]\nname='a'\n[[site.host]]\nname='h'\nloss=1\n", "host h: loss must be in [0, 1)"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n[[path]]\nfrom='a'\nto='b'\nrtt_ms=1\ndelay_ms=1\n", "not both"),
        ] {
            let err = Scenario::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
