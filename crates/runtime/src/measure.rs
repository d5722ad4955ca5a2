//! The measured RTT matrix a planned send uses: probed ([`crate::probe`]) or taken from a cache
//! of recent probes of the same host set.
//!
//! Why a cache: probing costs a handful of round trips before the first byte moves (0.6 s at
//! 50 ms, 2.2 s at 200 ms, issue 28), and a fleet that is pushed to again and again keeps its
//! round trips. A matrix measured for the same hosts (names and addresses, in any order) within
//! [`ProbeCache::max_age`] is used as is, and the report says so with its age. The cache holds
//! round trips only; capacities come from the hosts file at every send.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use bulkcast_planner::{measured, MatrixFile};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::HostsFile;
use serde::Serialize;

use crate::probe;
use crate::transport::TcpTuning;

/// Where recent probe results are kept, and for how long they count.
#[derive(Debug, Clone)]
pub struct ProbeCache {
    /// One file per host set, named by the set's hash.
    pub dir: PathBuf,
    /// Older results are probed again.
    pub max_age: Duration,
}

/// bulkcast's folder in the user's cache: `$XDG_CACHE_HOME/bulkcast` (or `~/.cache/bulkcast`);
/// `None` where neither variable is set.
pub fn user_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("bulkcast"))
}

/// How long a probed matrix is reused by default.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(600);

impl ProbeCache {
    /// `$XDG_CACHE_HOME/bulkcast/probes` (or `~/.cache/bulkcast/probes`) with `max_age`; `None`
    /// where neither variable is set.
    pub fn in_user_cache(max_age: Duration) -> Option<ProbeCache> {
        Some(ProbeCache {
            dir: user_cache_dir()?.join("probes"),
            max_age,
        })
    }

    fn path(&self, hosts: &HostsFile, samples: u16) -> PathBuf {
        let mut set: Vec<String> = hosts
            .hosts
            .iter()
            .map(|h| format!("{}={}", h.name, h.addr))
            .collect();
        set.sort();
        let mut key = blake3::Hasher::new();
        key.update(format!("samples={samples}\n").as_bytes());
        for line in &set {
            key.update(line.as_bytes()).update(b"\n");
        }
        let hex = key.finalize().to_hex();
        self.dir.join(format!("{}.toml", &hex[..32]))
    }

    /// A matrix probed for `hosts` no longer than `max_age` ago, with its age.
    fn load(&self, hosts: &HostsFile, samples: u16) -> Option<(MatrixFile, Duration)> {
        let path = self.path(hosts, samples);
        let age = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())?;
        if age > self.max_age {
            return None;
        }
        let m = MatrixFile::parse_toml(&std::fs::read_to_string(&path).ok()?).ok()?;
        // Names must match the hosts as given now (the key covers them; this guards a
        // hand-edited file).
        let names_match = m.nodes.len() == hosts.hosts.len() + 1
            && hosts.hosts.iter().all(|h| m.nodes.contains(&h.name));
        names_match.then_some((m, age))
    }

    /// Keeps `m` for `hosts`. A cache that cannot be written only costs the next send a probe.
    fn store(&self, hosts: &HostsFile, samples: u16, m: &MatrixFile) {
        let path = self.path(hosts, samples);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::write(&tmp, m.to_toml()))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!("probe cache {}: {e}", path.display());
        }
    }
}

/// A host the source could not admit before the send (unreachable, refused, wrong secret): it
/// is left out of the tree, so that it fails alone, and named with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// Index into the hosts given.
    pub host: usize,
    /// What went wrong.
    pub reason: String,
}

/// The round trips of a planned send, over the hosts that answered.
#[derive(Debug, Clone)]
pub struct Measured {
    /// The RTT matrix over the source and the hosts not in `left_out`, in their given order.
    pub matrix: MatrixFile,
    /// How it was obtained.
    pub report: ProbeReport,
    /// Hosts that could not be probed.
    pub left_out: Vec<LeftOut>,
}

/// How the matrix of a send was obtained, for its report.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// Taken from the cache rather than probed now.
    pub cached: bool,
    /// Age of the cached matrix in seconds (0 when probed now).
    pub age_s: f64,
    /// Seconds this send spent probing.
    pub seconds: f64,
    /// What was measured (every pair, or a sample completed with Vivaldi), and warnings.
    pub note: String,
}

/// Why no matrix could be made.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// No agent answered the probe.
    #[error("no agent could be probed: {0}")]
    NoAgent(String),
    /// The measurements did not make a matrix.
    #[error(transparent)]
    Plan(#[from] bulkcast_planner::PlanError),
}

/// The RTT matrix over the source and `hosts`: from `cache` when it holds a recent one for this
/// host set, otherwise probed (see [`crate::probe`] for `samples`) and cached when every host
/// answered. Hosts that did not answer are left out of the matrix and listed.
pub async fn rtt_matrix(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
    cache: Option<&ProbeCache>,
) -> Result<Measured, MeasureError> {
    if let Some((matrix, age)) = cache.and_then(|c| c.load(hosts, samples)) {
        let report = ProbeReport {
            cached: true,
            age_s: age.as_secs_f64(),
            seconds: 0.0,
            note: format!(
                "round trips probed {:.0} s ago (cached; --probe-max-age 0 probes again)",
                age.as_secs_f64()
            ),
        };
        return Ok(Measured {
            matrix,
            report,
            left_out: Vec::new(),
        });
    }
    let started = Instant::now();
    let (matrix, note, left_out) = probe_answering(hosts, keys, tuning, samples).await?;
    if let Some(c) = cache.filter(|_| left_out.is_empty()) {
        c.store(hosts, samples, &matrix);
    }
    let report = ProbeReport {
        cached: false,
        age_s: 0.0,
        seconds: started.elapsed().as_secs_f64(),
        note,
    };
    Ok(Measured {
        matrix,
        report,
        left_out,
    })
}

/// Probes the agents now; the matrix covers the source and the hosts that answered, the rest
/// are listed with why.
async fn probe_answering(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
) -> Result<(MatrixFile, String, Vec<LeftOut>), MeasureError> {
    let m = probed(hosts, keys, tuning, samples).await?;
    let left_out: Vec<LeftOut> = m
        .errors
        .iter()
        .map(|(node, reason)| LeftOut {
            host: node - 1,
            reason: reason.clone(),
        })
        .collect();
    // Node ids: 0 the source, i + 1 host i; keep the source and the hosts that answered.
    let keep: Vec<usize> = (0..=hosts.hosts.len())
        .filter(|&i| i == 0 || !left_out.iter().any(|l| l.host + 1 == i))
        .collect();
    let rtt: Vec<Vec<Option<f64>>> = keep
        .iter()
        .map(|&i| keep.iter().map(|&j| m.rtt_ms[i][j]).collect())
        .collect();
    let names = node_names(hosts);
    let nodes = keep.iter().map(|&i| names[i].clone()).collect();
    let (file, note) = measured::rtt_matrix(nodes, &rtt, samples)?;
    Ok((file, note, left_out))
}

/// Every host that does not admit the source (unreachable, refused, another secret), tried in
/// parallel: a connection and the handshake each, within `deadline`.
pub async fn unadmitted(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    deadline: Duration,
) -> Vec<LeftOut> {
    let tries: Vec<_> = hosts
        .hosts
        .iter()
        .map(|h| {
            let (addr, keys, tuning) = (h.addr.clone(), keys.clone(), tuning.clone());
            tokio::spawn(async move {
                let admit = async {
                    let s = crate::transport::connect(&addr, &tuning).await?;
                    crate::transport::handshake_connect(s, &keys)
                        .await
                        .map(drop)
                };
                tokio::time::timeout(deadline, admit).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for (host, t) in tries.into_iter().enumerate() {
        let why = match t.await {
            Ok(Ok(Ok(()))) => continue,
            Ok(Ok(Err(e))) => e.to_string(),
            Ok(Err(_)) => format!("no answer within {deadline:?}"),
            Err(e) => e.to_string(),
        };
        let h = &hosts.hosts[host];
        out.push(LeftOut {
            host,
            reason: format!("{} at {}: {why}", h.name, h.addr),
        });
    }
    out
}

/// Probes the agents now: every pair up to [`bulkcast_planner::PROBE_ALL_MAX`] nodes, a sample
/// completed with Vivaldi coordinates above.
pub async fn probe_now(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
) -> Result<(MatrixFile, String), MeasureError> {
    let m = probed(hosts, keys, tuning, samples).await?;
    let (file, mut note) = measured::rtt_matrix(node_names(hosts), &m.rtt_ms, samples)?;
    for (i, e) in &m.errors {
        note += &format!("\nwarning: could not probe node {i}: {e}");
    }
    Ok((file, note))
}

/// The probe's raw measurements; an error when no host answered at all.
async fn probed(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
) -> Result<probe::RttMatrix, MeasureError> {
    let specs = &hosts.hosts;
    let targets = measured::probe_targets(specs.len());
    let deadline = Duration::from_secs(5);
    let m = probe::matrix(specs, &targets, keys, tuning, samples, deadline).await;
    if m.errors.len() == specs.len() {
        let why: Vec<&str> = m.errors.iter().map(|e| e.1.as_str()).collect();
        return Err(MeasureError::NoAgent(why.join("; ")));
    }
    Ok(m)
}

/// The matrix's node names: the source (named in the hosts file, else "source"), then the hosts.
fn node_names(hosts: &HostsFile) -> Vec<String> {
    let source = hosts.source.clone().unwrap_or_default();
    let mut nodes = vec![if source.name.is_empty() {
        "source".to_string()
    } else {
        source.name
    }];
    nodes.extend(hosts.hosts.iter().map(|h| h.name.clone()));
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkcast_planner::Matrix;
    use bulkcast_proto::hosts::HostSpec;

    fn hosts(addrs: &[&str]) -> HostsFile {
        HostsFile {
            hosts: addrs.iter().map(|a| HostSpec::from_addr(a)).collect(),
            ..HostsFile::default()
        }
    }

    fn matrix(h: &HostsFile) -> MatrixFile {
        let n = h.hosts.len() + 1;
        let mut nodes = vec!["source".to_string()];
        nodes.extend(h.hosts.iter().map(|x| x.name.clone()));
        let mut rtt = Matrix::filled(n, 0.0);
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                rtt.set(i, j, 1.0 + (i + j) as f64);
            }
        }
        MatrixFile {
            nodes,
            rtt_ms: rtt,
            bandwidth_mbps: None,
            wan: Vec::new(),
        }
    }

    #[test]
    fn a_cached_matrix_serves_the_same_host_set_in_any_order_until_it_ages() {
        let dir = std::env::temp_dir().join(format!("bulkcast-probe-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut cache = ProbeCache {
            dir: dir.clone(),
            max_age: Duration::from_secs(60),
        };
        let a = hosts(&["10.0.0.1:7400", "10.0.0.2:7400"]);
        assert!(cache.load(&a, 3).is_none(), "empty cache");
        let m = matrix(&a);
        cache.store(&a, 3, &m);
        let (got, age) = cache.load(&a, 3).expect("just stored");
        assert_eq!(got, m);
        assert!(age < Duration::from_secs(60));
        // The same hosts in another order: the same set.
        let b = hosts(&["10.0.0.2:7400", "10.0.0.1:7400"]);
        assert!(cache.load(&b, 3).is_some());
        // Another host set, or another sample count: not served.
        assert!(cache.load(&hosts(&["10.0.0.1:7400"]), 3).is_none());
        assert!(cache.load(&a, 5).is_none());
        // Aged out.
        cache.max_age = Duration::ZERO;
        std::thread::sleep(Duration::from_millis(20));
        assert!(cache.load(&a, 3).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
