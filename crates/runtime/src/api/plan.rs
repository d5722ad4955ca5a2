//! What a send decides before it moves data: the hosts it goes to (a list or a hosts file),
//! the round trips it plans over (a matrix file, the probe cache, or probed now) and the plan.

use std::path::Path;

use bulkcast_planner::strategy::{self, SendShape};
use bulkcast_planner::{measured, MatrixFile, Network, Plan};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostsFile;

use super::Error;
use crate::input::Input;
use crate::measure::{self, LeftOut, ProbeCache, ProbeReport};
use crate::transport::TcpTuning;

/// The hosts `to` names: a hosts file (TOML; a path ending in `.toml`, or an existing file
/// when `to` has no comma) or a comma-separated list of `host:port` (as `--to`).
pub fn load_hosts(to: &str) -> Result<HostsFile, Error> {
    let p = Path::new(to);
    if p.extension().is_some_and(|e| e == "toml") || (p.is_file() && !to.contains(',')) {
        let text = std::fs::read_to_string(p)
            .map_err(|e| Error::Hosts(format!("reading hosts file {to}: {e}")))?;
        HostsFile::parse_toml(&text).map_err(|e| Error::Hosts(format!("hosts file {to}: {e}")))
    } else {
        HostsFile::parse_list(to).map_err(|e| Error::Hosts(e.to_string()))
    }
}

/// A matrix file (as `bulkcast plan --save-matrix` writes it).
pub fn read_matrix(path: &Path) -> Result<MatrixFile, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Plan(format!("reading {}: {e}", path.display())))?;
    MatrixFile::parse_toml(&text)
        .map_err(|e| Error::Plan(format!("matrix file {}: {e}", path.display())))
}

/// What the choice of strategy looks at for sending `input` to `hosts`; `joined`: the
/// receivers joined with a ticket. `lan` stays false: the library's [`super::Send`] does not
/// multicast (see [`choose_auto`]).
pub fn send_shape(hosts: &HostsFile, input: &Input, joined: bool) -> SendShape {
    SendShape {
        single_file: input.single_file().is_some(),
        ticket: joined,
        ..SendShape::file(input.manifest.total_len, sites(hosts))
    }
}

/// What `auto` chose, and the lines `bulkcast send` prints about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    /// The strategy (never `Auto`).
    pub strategy: strategy::Strategy,
    /// What to tell the user, in order.
    pub notes: Vec<String>,
}

/// `auto`'s choice for sending `input` to `hosts` ([`strategy::choose`]), multicast included
/// where every receiver is on the source's LAN ([`crate::mcast::on_lan`]) unless multicast
/// reached none of these hosts within a day ([`crate::mcast::Unreached`]); `fanout`: the user
/// fixed the tree's fan-out.
pub fn choose_auto(hosts: &HostsFile, input: &Input, joined: bool, fanout: bool) -> AutoChoice {
    let addrs: Vec<String> = hosts.hosts.iter().map(|h| h.addr.clone()).collect();
    let shape = SendShape {
        fanout,
        lan: crate::mcast::on_lan(&addrs),
        receivers: addrs.len(),
        ..send_shape(hosts, input, joined)
    };
    let mut chosen = strategy::choose(strategy::Strategy::Auto, &shape);
    let mut notes = Vec::new();
    let unreached = crate::mcast::Unreached::in_user_cache();
    if chosen == strategy::Strategy::Multicast && unreached.is_some_and(|u| u.recent(&addrs)) {
        notes.push("strategy auto: multicast reached none of these hosts within a day".into());
        chosen = strategy::Strategy::Tree;
    }
    let name = match chosen {
        strategy::Strategy::Multicast => "multicast on this LAN",
        strategy::Strategy::Mob => "mob",
        strategy::Strategy::Swarm => "swarm",
        strategy::Strategy::Hybrid => "hybrid",
        _ => "tree",
    };
    notes.push(auto_note(name, shape.sites, shape.len));
    AutoChoice {
        strategy: chosen,
        notes,
    }
}

/// `strategy auto: NAME (SITES, SIZE)`, as `bulkcast send` says what `auto` chose.
pub fn auto_note(name: &str, sites: usize, len: Option<u64>) -> String {
    format!(
        "strategy auto: {name} ({}, {})",
        match sites {
            0 => "no sites given".to_string(),
            1 => "one site".to_string(),
            n => format!("{n} sites"),
        },
        len.map_or("unknown length".to_string(), |l| format!("{} MiB", l >> 20))
    )
}

/// Distinct sites among the source and the hosts.
pub fn sites(hosts: &HostsFile) -> usize {
    let sites: std::collections::BTreeSet<&str> = hosts
        .hosts
        .iter()
        .filter_map(|h| h.site.as_deref())
        .chain(hosts.source.as_ref().and_then(|s| s.site.as_deref()))
        .collect();
    sites.len()
}

/// What [`plan_push`] decided.
pub struct PlannedPush {
    /// The plan, over `hosts`.
    pub plan: Plan,
    /// The longest round trip of a hop of the plan, in ms (what sets the part size,
    /// [`bulkcast_planner::strategy::part_bytes`]).
    pub longest_hop_rtt_ms: f64,
    /// The hosts the plan spans: those given, less `left_out`.
    pub hosts: HostsFile,
    /// How the round trips were measured (`None`: from a matrix given).
    pub probe: Option<ProbeReport>,
    /// Hosts that did not answer the probe, with why.
    pub left_out: Vec<LeftOut>,
    /// What was done, for the user.
    pub note: String,
}

/// How [`plan_push`] and [`plan_push_with`] measure round trips, and what they plan for.
#[derive(Clone, Copy)]
pub struct PushPlanning<'a> {
    /// The keys the probe's connections pass the handshake with.
    pub keys: &'a Keys,
    /// The probe's connections' tuning.
    pub tuning: &'a TcpTuning,
    /// Round trips measured before, by host set ([`ProbeCache`]); none: probe now.
    pub cache: Option<&'a ProbeCache>,
    /// The object's length, for the plan's rates (`None`: a stream).
    pub size: Option<u64>,
    /// The chunk size the plan's rates assume.
    pub chunk: u32,
    /// Several trees at once (a balanced plan) rather than one.
    pub balanced: bool,
}

/// The planner's push plan for `hosts` ([`measured::push_plan`]): over the round trips from
/// `matrix` when given, else from the cache or probed now (hosts that do not answer are left
/// out).
pub async fn plan_push_with(
    hosts: &HostsFile,
    matrix: Option<(&MatrixFile, String)>,
    how: &PushPlanning<'_>,
) -> Result<PlannedPush, Error> {
    let plan_err = |e: bulkcast_planner::PlanError| Error::Plan(e.to_string());
    let PushPlanning {
        keys,
        tuning,
        cache,
        size,
        chunk,
        balanced,
    } = *how;
    if let Some((m, note)) = matrix {
        let net = Network::from_hosts(hosts, m).map_err(plan_err)?;
        let plan = measured::push_plan(net.clone(), size, chunk, balanced).map_err(plan_err)?;
        return Ok(PlannedPush {
            longest_hop_rtt_ms: longest_hop(&net, &plan),
            plan,
            hosts: hosts.clone(),
            note,
            probe: None,
            left_out: Vec::new(),
        });
    }
    // The round trips TCP measures while connecting: probing is paid before the send, and
    // they order paths that differ by more than jitter (`bulkcast plan --samples` echoes).
    let m = measure::rtt_matrix(hosts, keys, tuning, 0, cache)
        .await
        .map_err(|e| Error::Plan(e.to_string()))?;
    let answered = HostsFile {
        source: hosts.source.clone(),
        hosts: (0..hosts.hosts.len())
            .filter(|&i| !m.left_out.iter().any(|l| l.host == i))
            .map(|i| hosts.hosts[i].clone())
            .collect(),
    };
    let net = Network::from_hosts(&answered, &m.matrix).map_err(plan_err)?;
    let plan = measured::push_plan(net.clone(), size, chunk, balanced).map_err(plan_err)?;
    Ok(PlannedPush {
        longest_hop_rtt_ms: longest_hop(&net, &plan),
        plan,
        hosts: answered,
        note: m.report.note.clone(),
        probe: Some(m.report),
        left_out: m.left_out,
    })
}

/// The longest round trip of a hop of any of the plan's trees, in ms.
fn longest_hop(net: &Network, plan: &Plan) -> f64 {
    plan.trees
        .iter()
        .map(|(t, _)| measured::longest_hop_rtt_ms(net, t))
        .fold(0.0, f64::max)
}

/// [`plan_push_with`] over round trips from the cache or probed now.
pub async fn plan_push(hosts: &HostsFile, how: &PushPlanning<'_>) -> Result<PlannedPush, Error> {
    plan_push_with(hosts, None, how).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_come_from_a_list_or_a_file_and_bad_ones_name_the_file() {
        let h = load_hosts("127.0.0.1:7400,127.0.0.2:7400").unwrap();
        assert_eq!(h.hosts.len(), 2);
        assert_eq!(sites(&h), 0);
        let dir = std::env::temp_dir().join(format!("bulkcast-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("hosts.toml");
        std::fs::write(
            &f,
            "[[host]]\nname = \"a\"\naddr = \"127.0.0.1:1\"\nsite = \"x\"\n\
             [[host]]\nname = \"b\"\naddr = \"127.0.0.1:2\"\nsite = \"y\"\n",
        )
        .unwrap();
        let h = load_hosts(f.to_str().unwrap()).unwrap();
        assert_eq!(h.hosts[1].name, "b");
        assert_eq!(sites(&h), 2);
        std::fs::write(&f, "[[host]]\nname = \"a\"\n").unwrap();
        let e = load_hosts(f.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("hosts.toml"), "{e}");
        let e = load_hosts(dir.join("none.toml").to_str().unwrap()).unwrap_err();
        assert!(e.to_string().contains("reading hosts file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
