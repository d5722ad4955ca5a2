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

/// How long a probed matrix is reused by default.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(600);

impl ProbeCache {
    /// `$XDG_CACHE_HOME/bulkcast/probes` (or `~/.cache/bulkcast/probes`) with `max_age`; `None`
    /// where neither variable is set.
    pub fn in_user_cache(max_age: Duration) -> Option<ProbeCache> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        Some(ProbeCache {
            dir: base.join("bulkcast").join("probes"),
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
/// host set, otherwise probed (the median of `samples` echoes per pair) and cached.
pub async fn rtt_matrix(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
    cache: Option<&ProbeCache>,
) -> Result<(MatrixFile, ProbeReport), MeasureError> {
    if let Some((m, age)) = cache.and_then(|c| c.load(hosts, samples)) {
        let report = ProbeReport {
            cached: true,
            age_s: age.as_secs_f64(),
            seconds: 0.0,
            note: format!(
                "round trips probed {:.0} s ago (cached; --probe-max-age 0 probes again)",
                age.as_secs_f64()
            ),
        };
        return Ok((m, report));
    }
    let started = Instant::now();
    let (m, note) = probe_now(hosts, keys, tuning, samples).await?;
    if let Some(c) = cache {
        if !note.contains("warning") {
            c.store(hosts, samples, &m);
        }
    }
    let report = ProbeReport {
        cached: false,
        age_s: 0.0,
        seconds: started.elapsed().as_secs_f64(),
        note,
    };
    Ok((m, report))
}

/// Probes the agents now: every pair up to [`bulkcast_planner::PROBE_ALL_MAX`] nodes, a sample
/// completed with Vivaldi coordinates above.
pub async fn probe_now(
    hosts: &HostsFile,
    keys: &Keys,
    tuning: &TcpTuning,
    samples: u16,
) -> Result<(MatrixFile, String), MeasureError> {
    let specs = &hosts.hosts;
    let targets = measured::probe_targets(specs.len());
    let deadline = Duration::from_secs(5);
    let m = probe::matrix(specs, &targets, keys, tuning, samples, deadline).await;
    if m.errors.len() == specs.len() {
        let why: Vec<&str> = m.errors.iter().map(|e| e.1.as_str()).collect();
        return Err(MeasureError::NoAgent(why.join("; ")));
    }
    let source = hosts.source.clone().unwrap_or_default();
    let mut nodes = vec![if source.name.is_empty() {
        "source".to_string()
    } else {
        source.name
    }];
    nodes.extend(specs.iter().map(|h| h.name.clone()));
    let (file, mut note) = measured::rtt_matrix(nodes, &m.rtt_ms, samples)?;
    for (i, e) in &m.errors {
        note += &format!("\nwarning: could not probe node {i}: {e}");
    }
    Ok((file, note))
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
