//! From a [`Scenario`] to its [`Layout`]: one method per section of the file.
//!
//! Sections are resolved in the order they depend on each other: sites and their hosts first
//! (they own the access links and the addresses), then WAN paths (they name sites), channels
//! (they name hosts), and last the schedules (they name paths and channels). Errors come in that
//! order too, so a scenario with several mistakes always reports the same one first.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use super::{
    bad, check_nonneg, check_pos, default_queue, valid_name, HostDef, Layout, LayoutAlternate,
    LayoutChannel, LayoutEvent, LayoutFluctuation, LayoutHost, LayoutLink, LinkSpec, Scenario,
    Shaping, SiteSpec, DEFAULT_AGENT_PORT, MAX_PORT_DELAY_MS,
};
use crate::LabError;

/// Addresses are `10.77.<site + 1>.<host + 10>` and channels take `10.77.<200 + N>.0/24`, so
/// the counts must keep those octets apart.
const MAX_SITES: usize = 199;
const MAX_HOSTS_PER_SITE: usize = 240;
const MAX_CHANNELS: usize = 55;

impl Scenario {
    /// Resolves the scenario into a [`Layout`]: hosts with addresses, directed links, schedules.
    pub fn resolve(&self) -> Result<Layout, LabError> {
        if self.sites.is_empty() {
            return Err(bad("a scenario needs at least one [[site]]"));
        }
        if self.sites.len() > MAX_SITES {
            return Err(bad("at most 199 sites"));
        }
        let mut r = Resolver::new(self);
        for (si, site) in self.sites.iter().enumerate() {
            r.site(si, site)?;
        }
        r.paths()?;
        r.channels()?;
        let events = r.events()?;
        let alternates = r.alternates()?;
        let fluctuation = r.fluctuation()?;
        r.finish(events, alternates, fluctuation)
    }
}

/// What is resolved so far, with the name indices the later sections look names up in.
struct Resolver<'a> {
    sc: &'a Scenario,
    site_idx: HashMap<String, usize>,
    host_idx: HashMap<String, usize>,
    chan_idx: HashMap<String, usize>,
    hosts: Vec<LayoutHost>,
    /// Every directed link; the other tables hold indices into it.
    links: Vec<LayoutLink>,
    site_links: Vec<Vec<Option<usize>>>,
    channels: Vec<LayoutChannel>,
}

impl<'a> Resolver<'a> {
    fn new(sc: &'a Scenario) -> Self {
        let ns = sc.sites.len();
        Resolver {
            sc,
            site_idx: HashMap::new(),
            host_idx: HashMap::new(),
            chan_idx: HashMap::new(),
            hosts: Vec::new(),
            links: Vec::new(),
            site_links: vec![vec![None; ns]; ns],
            channels: Vec::new(),
        }
    }

    fn site_of(&self, n: &str) -> Result<usize, LabError> {
        self.site_idx
            .get(n)
            .copied()
            .ok_or_else(|| bad(format!("unknown site {n:?}")))
    }

    fn host_of(&self, n: &str) -> Result<usize, LabError> {
        self.host_idx
            .get(n)
            .copied()
            .ok_or_else(|| bad(format!("unknown host {n:?}")))
    }

    /// One `[[site]]`: its name, default access rates and hosts.
    fn site(&mut self, si: usize, site: &SiteSpec) -> Result<(), LabError> {
        if !valid_name(&site.name) {
            return Err(bad(format!(
                "site name {:?} is not a plain name",
                site.name
            )));
        }
        if self.site_idx.insert(site.name.clone(), si).is_some() {
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
        check_port_delay(&format!("site {}", site.name), site.delay_ms)?;
        check_loss(&format!("site {}", site.name), site.loss)?;
        let defs = host_defs(site)?;
        for (hi, d) in defs.iter().enumerate() {
            self.host(si, hi, d, site)?;
        }
        Ok(())
    }

    /// Host `hi` of site `si`: its address and its two access links.
    fn host(&mut self, si: usize, hi: usize, d: &HostDef, site: &SiteSpec) -> Result<(), LabError> {
        if !valid_name(&d.name) {
            return Err(bad(format!("host name {:?} is not a plain name", d.name)));
        }
        check_pos(&format!("host {}: uplink_mbps", d.name), d.uplink_mbps)?;
        check_pos(&format!("host {}: downlink_mbps", d.name), d.downlink_mbps)?;
        check_port_delay(&format!("host {}", d.name), d.delay_ms)?;
        check_loss(&format!("host {}", d.name), d.loss)?;
        let idx = self.hosts.len();
        if self.host_idx.insert(d.name.clone(), idx).is_some() {
            return Err(bad(format!("host {:?} appears twice", d.name)));
        }
        let up = d.uplink_mbps.or(site.uplink_mbps);
        let down = d.downlink_mbps.or(site.downlink_mbps);
        let delay_ms = d.delay_ms.or(site.delay_ms).unwrap_or(0.0);
        let port_delay_ns = (delay_ms * 1e6).round() as u64;
        let port_loss = d.loss.or(site.loss).unwrap_or(0.0);
        let uplink = self.links.len();
        // Traffic to other sites through the forwarder leaves by the TUN, not the port: its
        // access links carry the port's delay so every packet of the host sees it.
        self.links
            .push(access_link(format!("up:{}", d.name), up, port_delay_ns));
        let mut downlink = access_link(format!("down:{}", d.name), down, port_delay_ns);
        downlink.loss = port_loss;
        self.links.push(downlink);
        self.hosts.push(LayoutHost {
            name: d.name.clone(),
            site: si,
            addr: Ipv4Addr::new(10, 77, si as u8 + 1, hi as u8 + 10),
            uplink,
            downlink: uplink + 1,
            uplink_mbps: up,
            downlink_mbps: down,
            port_delay_ns,
            port_loss,
        });
        Ok(())
    }

    /// WAN paths: the `[[path]]` entries first, then `default_path` for every remaining pair.
    fn paths(&mut self) -> Result<(), LabError> {
        let sc = self.sc;
        for p in &sc.paths {
            let (a, b) = (self.site_of(&p.from)?, self.site_of(&p.to)?);
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
                if self.site_links[x][y].is_some() {
                    return Err(bad(format!(
                        "path {}->{} is given twice",
                        sc.sites[x].name, sc.sites[y].name
                    )));
                }
                self.site_links[x][y] = Some(self.links.len());
                let name = format!("{}->{}", sc.sites[x].name, sc.sites[y].name);
                self.links.push(spec.resolve(name));
            }
        }
        let default = sc.default_path.clone().unwrap_or_default();
        default.validate("default_path")?;
        for (x, row) in self.site_links.iter_mut().enumerate() {
            for (y, cell) in row.iter_mut().enumerate() {
                if x != y && cell.is_none() {
                    *cell = Some(self.links.len());
                    let name = format!("{}->{}", sc.sites[x].name, sc.sites[y].name);
                    self.links.push(default.resolve(name));
                }
            }
        }
        Ok(())
    }

    /// `[[channel]]`s: an address pair of their own and a link each way.
    fn channels(&mut self) -> Result<(), LabError> {
        if self.sc.channels.len() > MAX_CHANNELS {
            return Err(bad("at most 55 channels"));
        }
        for (ci, c) in self.sc.channels.iter().enumerate() {
            let name = c.name.clone().unwrap_or_else(|| format!("ch{}", ci + 1));
            let (a, b) = (self.host_of(&c.from)?, self.host_of(&c.to)?);
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
            if self.chan_idx.insert(name.clone(), ci).is_some() {
                return Err(bad(format!("channel {name:?} appears twice")));
            }
            let a_to_b = self.links.len();
            self.links
                .push(spec.resolve(format!("{name}:{}->{}", c.from, c.to)));
            self.links
                .push(spec.resolve(format!("{name}:{}->{}", c.to, c.from)));
            self.channels.push(LayoutChannel {
                name,
                a,
                b,
                a_addr: Ipv4Addr::new(10, 77, 200 + ci as u8, 1),
                b_addr: Ipv4Addr::new(10, 77, 200 + ci as u8, 2),
                a_to_b,
                b_to_a: a_to_b + 1,
            });
        }
        Ok(())
    }

    /// The links a `[[change]]` or `[[alternate]]` addresses: a site pair's path (both
    /// directions unless `oneway`) or a channel's links.
    fn targets(
        &self,
        from: &Option<String>,
        to: &Option<String>,
        channel: &Option<String>,
        oneway: bool,
        what: &str,
    ) -> Result<Vec<usize>, LabError> {
        match (from, to, channel) {
            (Some(f), Some(t), None) => {
                let (a, b) = (self.site_of(f)?, self.site_of(t)?);
                if a == b {
                    return Err(bad(format!("{what}: from and to are the same site")));
                }
                let mut v = vec![self.site_links[a][b].expect("all pairs resolved")];
                if !oneway {
                    v.push(self.site_links[b][a].expect("all pairs resolved"));
                }
                Ok(v)
            }
            (None, None, Some(c)) => {
                let ci = *self
                    .chan_idx
                    .get(c)
                    .ok_or_else(|| bad(format!("{what}: unknown channel {c:?}")))?;
                let ch = &self.channels[ci];
                Ok(if oneway {
                    vec![ch.a_to_b]
                } else {
                    vec![ch.a_to_b, ch.b_to_a]
                })
            }
            _ => Err(bad(format!("{what}: give from + to (sites) or channel"))),
        }
    }

    /// `[[change]]`s, one event per link they address, sorted by time.
    fn events(&self) -> Result<Vec<LayoutEvent>, LabError> {
        let mut events = Vec::new();
        for c in &self.sc.changes {
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
            for link in self.targets(&c.from, &c.to, &c.channel, c.oneway, "change")? {
                events.push(LayoutEvent {
                    at_ns: (c.at_s * 1e9) as u64,
                    link,
                    rate_bps: c.rate_mbps.map(|r| r * 1e6),
                    loss: c.loss,
                });
            }
        }
        events.sort_by_key(|e| e.at_ns);
        Ok(events)
    }

    /// `[[alternate]]`s, one per link they address.
    fn alternates(&self) -> Result<Vec<LayoutAlternate>, LabError> {
        let mut alternates = Vec::new();
        for a in &self.sc.alternates {
            check_pos("alternate: every_s", Some(a.every_s))?;
            if a.rates_mbps.is_empty() {
                return Err(bad("alternate: rates_mbps is empty"));
            }
            for &r in &a.rates_mbps {
                check_pos("alternate: rates_mbps", Some(r))?;
            }
            for link in self.targets(&a.from, &a.to, &a.channel, a.oneway, "alternate")? {
                alternates.push(LayoutAlternate {
                    link,
                    every_ns: (a.every_s * 1e9) as u64,
                    rates_bps: a.rates_mbps.iter().map(|r| r * 1e6).collect(),
                });
            }
        }
        Ok(alternates)
    }

    /// `[fluctuation]`: every WAN path (and channel, if asked) that has a rate to vary.
    fn fluctuation(&self) -> Result<Option<LayoutFluctuation>, LabError> {
        let Some(f) = &self.sc.fluctuation else {
            return Ok(None);
        };
        check_pos("fluctuation: every_s", Some(f.every_s))?;
        if !(0.0 < f.min_share && f.min_share <= f.max_share && f.max_share <= 1.0) {
            return Err(bad("fluctuation: need 0 < min_share <= max_share <= 1"));
        }
        let mut ls: Vec<usize> = self
            .site_links
            .iter()
            .flatten()
            .flatten()
            .copied()
            .collect();
        if f.channels {
            for c in &self.channels {
                ls.extend([c.a_to_b, c.b_to_a]);
            }
        }
        let ls = ls
            .into_iter()
            .filter_map(|l| self.links[l].rate_bps.map(|r| (l, r)))
            .collect::<Vec<_>>();
        if ls.is_empty() {
            return Err(bad("fluctuation: no link has a rate to fluctuate"));
        }
        Ok(Some(LayoutFluctuation {
            every_ns: (f.every_s * 1e9) as u64,
            min_share: f.min_share,
            max_share: f.max_share,
            links: ls,
        }))
    }

    /// The source, the ideal rate and who shapes: the top-level keys that need the rest.
    fn finish(
        self,
        events: Vec<LayoutEvent>,
        alternates: Vec<LayoutAlternate>,
        fluctuation: Option<LayoutFluctuation>,
    ) -> Result<Layout, LabError> {
        let sc = self.sc;
        let source = match &sc.source {
            Some(s) => self.host_of(s)?,
            None => 0,
        };
        check_pos("ideal_mbps", sc.ideal_mbps)?;
        let ideal_bps = sc
            .ideal_mbps
            .map(|m| m * 1e6)
            .or_else(|| access_bound(&self.hosts, source));
        let mut layout = Layout {
            name: sc.name.clone().unwrap_or_else(|| "lab".into()),
            seed: sc.seed,
            sites: sc.sites.iter().map(|s| s.name.clone()).collect(),
            hosts: self.hosts,
            links: self.links,
            site_links: self.site_links,
            channels: self.channels,
            events,
            alternates,
            fluctuation,
            source,
            agent_port: sc.agent_port.unwrap_or(DEFAULT_AGENT_PORT),
            ideal_bps,
            kernel_shaping: false,
        };
        layout.kernel_shaping = match (sc.shaping, layout.kernel_obstacle()) {
            (Shaping::Forwarder, _) => false,
            (Shaping::Auto, obstacle) => obstacle.is_none(),
            (Shaping::Kernel, None) => true,
            (Shaping::Kernel, Some(why)) => {
                return Err(bad(format!("shaping = \"kernel\": {why}")));
            }
        };
        Ok(layout)
    }
}

/// A site's hosts as listed, or `<site>-1..=<site>-N` when given by count.
fn host_defs(site: &SiteSpec) -> Result<Vec<HostDef>, LabError> {
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
    if defs.len() > MAX_HOSTS_PER_SITE {
        return Err(bad(format!("site {}: at most 240 hosts", site.name)));
    }
    Ok(defs)
}

/// The default ideal per-receiver rate in bit/s: the least of the source's uplink and the
/// receivers' downlinks (None: all unlimited).
fn access_bound(hosts: &[LayoutHost], source: usize) -> Option<f64> {
    let mut bound = hosts[source].uplink_mbps.unwrap_or(f64::INFINITY);
    for (i, h) in hosts.iter().enumerate() {
        if i != source {
            bound = bound.min(h.downlink_mbps.unwrap_or(f64::INFINITY));
        }
    }
    bound.is_finite().then_some(bound * 1e6)
}

/// A port delay: zero or positive, at most [`MAX_PORT_DELAY_MS`].
/// A port loss: in [0, 1).
fn check_loss(what: &str, loss: Option<f64>) -> Result<(), LabError> {
    match loss {
        Some(l) if !(0.0..1.0).contains(&l) => {
            Err(bad(format!("{what}: loss must be in [0, 1), got {l}")))
        }
        _ => Ok(()),
    }
}

fn check_port_delay(what: &str, delay_ms: Option<f64>) -> Result<(), LabError> {
    check_nonneg(&format!("{what}: delay_ms"), delay_ms)?;
    match delay_ms {
        Some(d) if d > MAX_PORT_DELAY_MS => Err(bad(format!(
            "{what}: delay_ms {d} is above the port delay's limit of {MAX_PORT_DELAY_MS} ms"
        ))),
        _ => Ok(()),
    }
}

fn access_link(name: String, mbps: Option<f64>, delay_ns: u64) -> LayoutLink {
    let rate_bps = mbps.map(|m| m * 1e6);
    LayoutLink {
        name,
        rate_bps,
        delay_ns,
        jitter_ns: 0,
        loss: 0.0,
        // An access link queue holds 100 ms at its rate: a typical CPE/switch buffer, and enough
        // that one TCP flow over a long WAN path is limited by the WAN path's queue, not this one.
        queue_bytes: default_queue(rate_bps, 100_000_000),
        reorder: false,
    }
}
