//! A relay's join of the relay tree: it asks its source for its relay children (`Peers`),
//! then those for theirs, breadth first and bounded ([`MAX_DEPTH`], [`MAX_CANDIDATES`],
//! [`JOIN_TIME`]), measures the round trip to each, and takes the parent
//! [`bulkcast_proto::feed::tree::choose`] picks.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::tree::{carries, choose, holds, Candidate};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinSet;

use super::relay::UpstreamConfig;
use super::{read_msg, write_msg};
use crate::transport::{connect_tcp, handshake_connect, min_rtt, Stream, TcpTuning};

/// Levels of relays below the source asked.
pub const MAX_DEPTH: usize = 4;
/// Servers measured at most.
pub const MAX_CANDIDATES: usize = 32;
/// A join's whole search; what was measured by then is chosen from.
pub const JOIN_TIME: Duration = Duration::from_secs(3);
/// One server's measurement and answer.
const PROBE_TIME: Duration = Duration::from_secs(2);

/// The outcome of a join.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The parent to subscribe to.
    pub parent: String,
    /// The servers above this relay, the source first, the parent last.
    pub ancestry: Vec<String>,
    /// Why the parent.
    pub why: String,
    /// What was measured.
    pub measured: Vec<Candidate>,
    /// This relay's address as others reach it (what it announces).
    pub me: String,
}

/// What one server said of itself, and the round trip to it.
struct Probe {
    rtt: Duration,
    local: SocketAddr,
    admits: bool,
    max_children: u32,
    ancestry: Vec<String>,
    children: Vec<String>,
    /// What it carries: feedtypes, names.
    carries: (String, String),
    floor: u64,
}

/// Connects to `addr`, asks for its place in the tree and measures the round trip: the
/// smallest of the connect's (SYN to SYN-ACK) and of TCP's own samples over the handshake
/// and the answer (`tcpi_min_rtt`), so a slow handshake (CPU) does not count.
async fn probe(addr: &str, keys: &Keys, tuning: &TcpTuning) -> io::Result<Probe> {
    let t = Instant::now();
    let tcp = connect_tcp(addr, tuning).await.map_err(io::Error::other)?;
    let connect = t.elapsed();
    let local = tcp.local_addr()?;
    let mut stream = handshake_connect(Stream::Tcp(tcp), keys)
        .await
        .map_err(io::Error::other)?;
    write_msg(&mut stream, &Msg::Peers).await?;
    stream.flush().await?;
    let reply = read_msg(&mut stream).await?;
    let sampled = stream.tcp().and_then(min_rtt).unwrap_or(connect);
    match reply {
        Some(Msg::PeersReply {
            admits,
            max_children,
            ancestry,
            children,
            feedtype,
            name,
            floor,
        }) => Ok(Probe {
            rtt: connect.min(sampled),
            local,
            admits,
            max_children,
            ancestry,
            children,
            carries: (feedtype, name),
            floor,
        }),
        Some(Msg::Refused { reason }) => Err(io::Error::other(reason)),
        other => Err(io::Error::other(format!(
            "unexpected answer to Peers: {other:?}"
        ))),
    }
}

/// This relay's address for others: `--advertise`, else the listening address, its IP taken
/// from the connection to the source when it listens on every address (`local`).
fn me(up: &UpstreamConfig, local: Option<SocketAddr>) -> String {
    if let Some(a) = &up.advertise {
        return a.clone();
    }
    match (up.listen, local) {
        (Some(l), Some(loc)) if l.ip().is_unspecified() => SocketAddr::new(loc.ip(), l.port()),
        (Some(l), _) => l,
        (None, Some(loc)) => loc,
        (None, None) => return String::new(),
    }
    .to_string()
}

/// Joins the tree below `up.source`, `dead` excluded, for a subscription resuming `from`
/// (`None`: now, or from a time); with `up.fixed`, below the source alone. A source that
/// does not answer is the parent anyway (its subscription backs off).
pub async fn join(up: &UpstreamConfig, keys: &Keys, dead: &[String], from: Option<u64>) -> Joined {
    let deadline = tokio::time::Instant::now() + JOIN_TIME;
    let src = tokio::time::timeout_at(deadline, probe(&up.source, keys, &up.tuning)).await;
    let src = match src {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return unanswered(up, e.to_string()),
        Err(_) => return unanswered(up, format!("no answer within {JOIN_TIME:?}")),
    };
    let me = me(up, Some(src.local));
    let mut found = vec![candidate(&up.source, true, &src, up, from)];
    if !up.fixed {
        let at = (&me[..], from);
        search(up, keys, dead, at, &src.children, &mut found, deadline).await;
    }
    let pick = match up.fixed {
        true => None,
        false => choose(&me, &found, dead),
    };
    let (i, why) = match pick {
        Some(p) => (p.index, p.why),
        None if up.fixed => (0, "--upstream-fixed".to_string()),
        // Over the limits rather than no feed at all.
        None => (
            0,
            "no server with room: the source, past its limit".to_string(),
        ),
    };
    let parent = found[i].addr.clone();
    let mut ancestry = found[i].ancestry.clone();
    ancestry.push(parent.clone());
    Joined {
        parent,
        ancestry,
        why,
        measured: found,
        me,
    }
}

fn unanswered(up: &UpstreamConfig, e: String) -> Joined {
    Joined {
        parent: up.source.clone(),
        ancestry: vec![up.source.clone()],
        why: format!("the source did not answer ({e}): subscribing to it, backing off"),
        measured: Vec::new(),
        me: me(up, None),
    }
}

/// What `p` said of server `addr`, for a relay configured as `up` resuming `from`.
fn candidate(
    addr: &str,
    source: bool,
    p: &Probe,
    up: &UpstreamConfig,
    from: Option<u64>,
) -> Candidate {
    Candidate {
        addr: addr.to_string(),
        source,
        rtt_us: p.rtt.as_micros() as u64,
        admits: p.admits,
        children: p.children.len() as u32,
        max_children: p.max_children,
        ancestry: p.ancestry.clone(),
        carries: carries(&p.carries.0, &p.carries.1, &up.feedtype, &up.name),
        holds: holds(p.floor, from),
    }
}

/// Whether a relay child `child` that server `from` listed can be another host's parent: not
/// an unspecified address, and not a loopback one unless `from` is on loopback too (a relay
/// on the source's own host reached it by loopback; to a relay elsewhere that address is
/// itself).
fn reachable(from: &str, child: &str) -> bool {
    let ip = |a: &str| a.parse::<SocketAddr>().ok().map(|s| s.ip());
    match (ip(from), ip(child)) {
        (_, Some(c)) if c.is_unspecified() => false,
        (Some(f), Some(c)) if c.is_loopback() => f.is_loopback(),
        (None, Some(c)) if c.is_loopback() => false,
        _ => true,
    }
}

/// Breadth first below the source, one level at a time, each level's servers measured at
/// once; stops at the bounds, keeping what it measured.
async fn search(
    up: &UpstreamConfig,
    keys: &Keys,
    dead: &[String],
    (me, from): (&str, Option<u64>),
    first: &[String],
    found: &mut Vec<Candidate>,
    deadline: tokio::time::Instant,
) {
    let mut seen: HashSet<String> = HashSet::from([up.source.clone(), me.to_string()]);
    let mut level: VecDeque<String> = VecDeque::new();
    let mut add = |level: &mut VecDeque<String>, from: &str, children: &[String], n: usize| {
        for c in children {
            if n + level.len() < MAX_CANDIDATES
                && reachable(from, c)
                && !dead.contains(c)
                && seen.insert(c.clone())
            {
                level.push_back(c.clone());
            }
        }
    };
    add(&mut level, &up.source, first, found.len());
    for _ in 0..MAX_DEPTH {
        if level.is_empty() {
            return;
        }
        let mut set = JoinSet::new();
        for (i, addr) in level.drain(..).enumerate() {
            let (keys, tuning) = (keys.clone(), up.tuning.clone());
            set.spawn(async move {
                let r = tokio::time::timeout(PROBE_TIME, probe(&addr, &keys, &tuning)).await;
                (i, addr, r)
            });
        }
        let mut answers = Vec::new();
        loop {
            match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(Some(Ok((i, addr, Ok(Ok(p)))))) => answers.push((i, addr, p)),
                Ok(Some(Ok((_, addr, Ok(Err(e)))))) => {
                    tracing::debug!("relay: join: {addr} not measured: {e}");
                }
                Ok(Some(Ok((_, addr, Err(_))))) => {
                    tracing::debug!(
                        "relay: join: {addr} not measured: no answer in {PROBE_TIME:?}"
                    );
                }
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => break,
            }
        }
        // In the order they were listed, not answered: ties stay stable.
        answers.sort_by_key(|a| a.0);
        for (_, addr, p) in &answers {
            found.push(candidate(addr, false, p, up, from));
        }
        for (_, addr, p) in &answers {
            add(&mut level, addr, &p.children, found.len());
        }
        if tokio::time::Instant::now() >= deadline {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_addresses_that_would_be_the_joiner_itself_are_skipped() {
        assert!(reachable("10.0.0.1:7388", "10.0.0.2:7388"));
        assert!(!reachable("10.0.0.1:7388", "0.0.0.0:7388"));
        assert!(!reachable("10.0.0.1:7388", "127.0.0.1:7388"));
        assert!(!reachable("src.example:7388", "127.0.0.1:7388"));
        assert!(reachable("127.0.0.1:7388", "127.0.0.1:7389"));
        assert!(!reachable("[::1]:7388", "[::]:7389"));
        // Names are dialled as given.
        assert!(reachable("10.0.0.1:7388", "relay.example:7388"));
    }
}
