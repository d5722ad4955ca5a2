//! Scenario files: sites, hosts, WAN paths, channels and time-varying conditions (TOML).
//!
//! The format is documented with examples in `docs/lab.md`; [`Scenario::parse`] checks it and
//! [`Scenario::plan`] resolves it into the concrete [`Plan`] the forwarder runs.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::LabError;

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
    /// The kernel where the scenario allows it ([`Plan::kernel_shaping`]), else the forwarder.
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
}

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

/// The resolved lab: what the topology builder and the forwarder need, all indices resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Scenario name.
    pub name: String,
    /// RNG seed.
    pub seed: u64,
    /// Site names, index = site id.
    pub sites: Vec<String>,
    /// Hosts in order.
    pub hosts: Vec<PlanHost>,
    /// Every directed emulated link (WAN paths, channels, access links).
    pub links: Vec<PlanLink>,
    /// `site_links[from][to]`: link for WAN traffic between two different sites.
    pub site_links: Vec<Vec<Option<usize>>>,
    /// Channels.
    pub channels: Vec<PlanChannel>,
    /// Scheduled condition changes, sorted by time.
    pub events: Vec<PlanEvent>,
    /// Alternating links.
    pub alternates: Vec<PlanAlternate>,
    /// Fluctuation: period in ns, share range, links affected.
    pub fluctuation: Option<PlanFluctuation>,
    /// Index of the source host.
    pub source: usize,
    /// Agent port for the hosts file.
    pub agent_port: u16,
    /// Ideal per-receiver rate in bit/s (None: unbounded).
    pub ideal_bps: Option<f64>,
    /// Traffic between sites crosses one kernel bridge, shaped by htb and dropped by nft,
    /// instead of the forwarder ([`Shaping`]).
    #[serde(default)]
    pub kernel_shaping: bool,
}

/// One host of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanHost {
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
}

/// One directed link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanLink {
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
pub struct PlanChannel {
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
pub struct PlanEvent {
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
pub struct PlanAlternate {
    /// Link index.
    pub link: usize,
    /// Period in ns.
    pub every_ns: u64,
    /// Rates in bit/s.
    pub rates_bps: Vec<f64>,
}

/// Resolved fluctuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanFluctuation {
    /// Period in ns.
    pub every_ns: u64,
    /// Lowest share.
    pub min_share: f64,
    /// Highest share.
    pub max_share: f64,
    /// Links affected, with their nominal rates in bit/s.
    pub links: Vec<(usize, f64)>,
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

    fn resolve(&self, name: String) -> PlanLink {
        let rate_bps = self.rate_mbps.map(|r| r * 1e6);
        let delay_ns = self.delay_ns();
        PlanLink {
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
        s.plan()?;
        Ok(s)
    }

    /// Reads and parses a scenario file.
    pub fn load(path: &std::path::Path) -> Result<Self, LabError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text)
    }

    /// Resolves the scenario into a [`Plan`]: hosts with addresses, directed links, schedules.
    pub fn plan(&self) -> Result<Plan, LabError> {
        if self.sites.is_empty() {
            return Err(bad("a scenario needs at least one [[site]]"));
        }
        if self.sites.len() > 199 {
            return Err(bad("at most 199 sites"));
        }
        let mut site_idx = HashMap::new();
        let mut hosts: Vec<PlanHost> = Vec::new();
        let mut links: Vec<PlanLink> = Vec::new();
        let mut host_idx = HashMap::new();
        for (si, site) in self.sites.iter().enumerate() {
            if !valid_name(&site.name) {
                return Err(bad(format!(
                    "site name {:?} is not a plain name",
                    site.name
                )));
            }
            if site_idx.insert(site.name.clone(), si).is_some() {
                return Err(bad(format!("site {:?} appears twice", site.name)));
            }
            check_pos(
                &format!("site {}: uplink_mbps", site.name),
                site.uplink_mbps,
            )?;
            check_pos(
                &format!("site {}: downlink_mbps", site.name),
                site.downlink_mbps,
            )?;
            let mut defs = site.host_list.clone();
            if let Some(n) = site.hosts {
                if !defs.is_empty() {
                    return Err(bad(format!(
                        "site {}: give hosts = N or [[site.host]], not both",
                        site.name
                    )));
                }
                defs = (1..=n)
                    .map(|i| HostDef {
                        name: format!("{}-{i}", site.name),
                        ..Default::default()
                    })
                    .collect();
            }
            if defs.is_empty() {
                return Err(bad(format!("site {} has no hosts", site.name)));
            }
            if defs.len() > 240 {
                return Err(bad(format!("site {}: at most 240 hosts", site.name)));
            }
            for (hi, d) in defs.iter().enumerate() {
                if !valid_name(&d.name) {
                    return Err(bad(format!("host name {:?} is not a plain name", d.name)));
                }
                check_pos(&format!("host {}: uplink_mbps", d.name), d.uplink_mbps)?;
                check_pos(&format!("host {}: downlink_mbps", d.name), d.downlink_mbps)?;
                let idx = hosts.len();
                if host_idx.insert(d.name.clone(), idx).is_some() {
                    return Err(bad(format!("host {:?} appears twice", d.name)));
                }
                let up = d.uplink_mbps.or(site.uplink_mbps);
                let down = d.downlink_mbps.or(site.downlink_mbps);
                let uplink = links.len();
                links.push(access_link(format!("up:{}", d.name), up));
                links.push(access_link(format!("down:{}", d.name), down));
                hosts.push(PlanHost {
                    name: d.name.clone(),
                    site: si,
                    addr: Ipv4Addr::new(10, 77, si as u8 + 1, hi as u8 + 10),
                    uplink,
                    downlink: uplink + 1,
                    uplink_mbps: up,
                    downlink_mbps: down,
                });
            }
        }
        let ns = self.sites.len();
        let site_of = |n: &str| -> Result<usize, LabError> {
            site_idx
                .get(n)
                .copied()
                .ok_or_else(|| bad(format!("unknown site {n:?}")))
        };
        let host_of = |n: &str| -> Result<usize, LabError> {
            host_idx
                .get(n)
                .copied()
                .ok_or_else(|| bad(format!("unknown host {n:?}")))
        };

        // WAN paths: explicit ones first, then the default for every remaining pair.
        let mut site_links = vec![vec![None; ns]; ns];
        for p in &self.paths {
            let (a, b) = (site_of(&p.from)?, site_of(&p.to)?);
            if a == b {
                return Err(bad(format!(
                    "path {}->{}: both ends are the same site",
                    p.from, p.to
                )));
            }
            let spec = p.link();
            spec.validate(&format!("path {}->{}", p.from, p.to))?;
            let dirs: &[(usize, usize)] = if p.oneway {
                &[(a, b)]
            } else {
                &[(a, b), (b, a)]
            };
            for &(x, y) in dirs {
                if site_links[x][y].is_some() {
                    return Err(bad(format!(
                        "path {}->{} is given twice",
                        self.sites[x].name, self.sites[y].name
                    )));
                }
                site_links[x][y] = Some(links.len());
                links.push(spec.resolve(format!("{}->{}", self.sites[x].name, self.sites[y].name)));
            }
        }
        let default = self.default_path.clone().unwrap_or_default();
        default.validate("default_path")?;
        for (x, row) in site_links.iter_mut().enumerate() {
            for (y, cell) in row.iter_mut().enumerate() {
                if x != y && cell.is_none() {
                    *cell = Some(links.len());
                    links.push(
                        default.resolve(format!("{}->{}", self.sites[x].name, self.sites[y].name)),
                    );
                }
            }
        }

        let mut channels = Vec::new();
        let mut chan_idx = HashMap::new();
        if self.channels.len() > 55 {
            return Err(bad("at most 55 channels"));
        }
        for (ci, c) in self.channels.iter().enumerate() {
            let name = c.name.clone().unwrap_or_else(|| format!("ch{}", ci + 1));
            let (a, b) = (host_of(&c.from)?, host_of(&c.to)?);
            if a == b {
                return Err(bad(format!("channel {name}: both ends are the same host")));
            }
            let spec = LinkSpec {
                rate_mbps: c.rate_mbps,
                delay_ms: c.delay_ms,
                rtt_ms: c.rtt_ms,
                jitter_ms: c.jitter_ms,
                loss: c.loss,
                queue_kb: c.queue_kb,
                reorder: c.reorder,
            };
            spec.validate(&format!("channel {name}"))?;
            if chan_idx.insert(name.clone(), ci).is_some() {
                return Err(bad(format!("channel {name:?} appears twice")));
            }
            let a_to_b = links.len();
            links.push(spec.resolve(format!("{name}:{}->{}", c.from, c.to)));
            links.push(spec.resolve(format!("{name}:{}->{}", c.to, c.from)));
            channels.push(PlanChannel {
                name,
                a,
                b,
                a_addr: Ipv4Addr::new(10, 77, 200 + ci as u8, 1),
                b_addr: Ipv4Addr::new(10, 77, 200 + ci as u8, 2),
                a_to_b,
                b_to_a: a_to_b + 1,
            });
        }

        // Which links a change/alternate addresses.
        let targets = |from: &Option<String>,
                       to: &Option<String>,
                       channel: &Option<String>,
                       oneway: bool,
                       what: &str|
         -> Result<Vec<usize>, LabError> {
            match (from, to, channel) {
                (Some(f), Some(t), None) => {
                    let (a, b) = (site_of(f)?, site_of(t)?);
                    if a == b {
                        return Err(bad(format!("{what}: from and to are the same site")));
                    }
                    let mut v = vec![site_links[a][b].expect("all pairs resolved")];
                    if !oneway {
                        v.push(site_links[b][a].expect("all pairs resolved"));
                    }
                    Ok(v)
                }
                (None, None, Some(c)) => {
                    let ci = *chan_idx
                        .get(c)
                        .ok_or_else(|| bad(format!("{what}: unknown channel {c:?}")))?;
                    let ch: &PlanChannel = &channels[ci];
                    Ok(if oneway {
                        vec![ch.a_to_b]
                    } else {
                        vec![ch.a_to_b, ch.b_to_a]
                    })
                }
                _ => Err(bad(format!("{what}: give from + to (sites) or channel"))),
            }
        };
        let mut events = Vec::new();
        for c in &self.changes {
            check_nonneg("change: at_s", Some(c.at_s))?;
            check_pos("change: rate_mbps", c.rate_mbps)?;
            if let Some(l) = c.loss {
                if !(0.0..1.0).contains(&l) {
                    return Err(bad(format!("change: loss must be in [0, 1), got {l}")));
                }
            }
            if c.rate_mbps.is_none() && c.loss.is_none() {
                return Err(bad("change: give rate_mbps and/or loss"));
            }
            for link in targets(&c.from, &c.to, &c.channel, c.oneway, "change")? {
                events.push(PlanEvent {
                    at_ns: (c.at_s * 1e9) as u64,
                    link,
                    rate_bps: c.rate_mbps.map(|r| r * 1e6),
                    loss: c.loss,
                });
            }
        }
        events.sort_by_key(|e| e.at_ns);
        let mut alternates = Vec::new();
        for a in &self.alternates {
            check_pos("alternate: every_s", Some(a.every_s))?;
            if a.rates_mbps.is_empty() {
                return Err(bad("alternate: rates_mbps is empty"));
            }
            for &r in &a.rates_mbps {
                check_pos("alternate: rates_mbps", Some(r))?;
            }
            for link in targets(&a.from, &a.to, &a.channel, a.oneway, "alternate")? {
                alternates.push(PlanAlternate {
                    link,
                    every_ns: (a.every_s * 1e9) as u64,
                    rates_bps: a.rates_mbps.iter().map(|r| r * 1e6).collect(),
                });
            }
        }
        let fluctuation = match &self.fluctuation {
            None => None,
            Some(f) => {
                check_pos("fluctuation: every_s", Some(f.every_s))?;
                if !(0.0 < f.min_share && f.min_share <= f.max_share && f.max_share <= 1.0) {
                    return Err(bad("fluctuation: need 0 < min_share <= max_share <= 1"));
                }
                let mut ls = Vec::new();
                for row in &site_links {
                    for l in row.iter().flatten() {
                        ls.push(*l);
                    }
                }
                if f.channels {
                    for c in &channels {
                        ls.extend([c.a_to_b, c.b_to_a]);
                    }
                }
                let ls = ls
                    .into_iter()
                    .filter_map(|l| links[l].rate_bps.map(|r| (l, r)))
                    .collect::<Vec<_>>();
                if ls.is_empty() {
                    return Err(bad("fluctuation: no link has a rate to fluctuate"));
                }
                Some(PlanFluctuation {
                    every_ns: (f.every_s * 1e9) as u64,
                    min_share: f.min_share,
                    max_share: f.max_share,
                    links: ls,
                })
            }
        };

        let source = match &self.source {
            Some(s) => host_of(s)?,
            None => 0,
        };
        check_pos("ideal_mbps", self.ideal_mbps)?;
        let ideal_bps = self.ideal_mbps.map(|m| m * 1e6).or_else(|| {
            let mut bound = hosts[source].uplink_mbps.unwrap_or(f64::INFINITY);
            for (i, h) in hosts.iter().enumerate() {
                if i != source {
                    bound = bound.min(h.downlink_mbps.unwrap_or(f64::INFINITY));
                }
            }
            bound.is_finite().then_some(bound * 1e6)
        });
        let mut plan = Plan {
            name: self.name.clone().unwrap_or_else(|| "lab".into()),
            seed: self.seed,
            sites: self.sites.iter().map(|s| s.name.clone()).collect(),
            hosts,
            links,
            site_links,
            channels,
            events,
            alternates,
            fluctuation,
            source,
            agent_port: self.agent_port.unwrap_or(DEFAULT_AGENT_PORT),
            ideal_bps,
            kernel_shaping: false,
        };
        plan.kernel_shaping = match (self.shaping, plan.kernel_obstacle()) {
            (Shaping::Forwarder, _) => false,
            (Shaping::Auto, obstacle) => obstacle.is_none(),
            (Shaping::Kernel, None) => true,
            (Shaping::Kernel, Some(why)) => {
                return Err(bad(format!("shaping = \"kernel\": {why}")));
            }
        };
        Ok(plan)
    }
}

impl Plan {
    /// Why the kernel cannot emulate this plan (None: it can). The kernel path has rates on
    /// access links and random loss between sites, nothing else: no `tc netem` here, so no
    /// delay or jitter, and no shared WAN bottleneck or schedule.
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

    /// Random loss from site `from` to site `to` (0 inside a site).
    pub fn site_loss(&self, from: usize, to: usize) -> f64 {
        self.site_links
            .get(from)
            .and_then(|row| row.get(to).copied().flatten())
            .map_or(0.0, |i| self.links[i].loss)
    }
}

fn access_link(name: String, mbps: Option<f64>) -> PlanLink {
    let rate_bps = mbps.map(|m| m * 1e6);
    PlanLink {
        name,
        rate_bps,
        delay_ns: 0,
        jitter_ns: 0,
        loss: 0.0,
        // An access link queue holds 100 ms at its rate: a typical CPE/switch buffer, and enough
        // that one TCP flow over a long WAN path is limited by the WAN path's queue, not this one.
        queue_bytes: default_queue(rate_bps, 100_000_000),
        reorder: false,
    }
}

impl Plan {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = Scenario::parse(TWO).unwrap().plan().unwrap();
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
    fn rejects_bad_scenarios() {
        for (text, want) in [
            ("", "at least one"),
            ("[[site]]\nname='a'\n", "no hosts"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='a'\nhosts=1\n", "twice"),
            ("[[site]]\nname='a b'\nhosts=1\n", "plain name"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n[[path]]\nfrom='a'\nto='b'\nloss=1.5\n", "loss"),
            ("[[site]]\nname='a'\nhosts=1\n[[path]]\nfrom='a'\nto='x'\n", "unknown site"),
            ("[[site]]\nname='a'\nhosts=1\ncolour='red'\n", "unknown field"),
            ("[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n[[path]]\nfrom='a'\nto='b'\nrtt_ms=1\ndelay_ms=1\n", "not both"),
        ] {
            let err = Scenario::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
