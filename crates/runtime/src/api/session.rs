//! The body of [`Send::run`]: the strategy resolved, receivers checked or probed, the plan,
//! the push or swarm session, and the retries.

use std::time::Duration;

use bulkcast_planner::{strategy, Plan};
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::{HostSpec, HostsFile};
use bulkcast_proto::node::NodeConfig;
use bulkcast_proto::tree::Tree;

use super::send::{Event, Send, SharedTracker, Strategy, Tracker};
use super::{plan_push_with, send_shape, Error, PlannedPush, PushPlanning};
use crate::input::Input;
use crate::measure::{self, LeftOut};
use crate::report::Report;
use crate::source::{self, SendConfig, SharedStatus};
use crate::transport::TcpTuning;

/// The receivers a send goes to, and those it left out.
pub struct Admitted {
    /// The receivers.
    pub file: HostsFile,
    /// For each receiver in `file`, its place in the list given.
    pub given: Vec<usize>,
    /// Left out: place in the list given, the host, why.
    pub left_out: Vec<(usize, HostSpec, String)>,
}

impl Admitted {
    /// Every host of `file`, none left out yet.
    fn all(file: &HostsFile) -> Admitted {
        Admitted {
            file: file.clone(),
            given: (0..file.hosts.len()).collect(),
            left_out: Vec::new(),
        }
    }

    /// Takes `out` (places in `file`) off the receivers; `left(name)` for each.
    fn leave_out(&mut self, mut out: Vec<LeftOut>, mut left: impl FnMut(&str)) {
        out.sort_by_key(|l| l.host);
        for l in out.iter().rev() {
            let h = self.file.hosts.remove(l.host);
            left(&h.name);
            let given = self.given.remove(l.host);
            self.left_out.push((given, h, l.reason.clone()));
        }
    }
}

/// The hosts of `file` that admit the source (within 5 s), and those that do not, with why:
/// what a send checks before it fixes a tree that is not planned over a probe.
pub async fn admitted(file: &HostsFile, keys: &Keys, tuning: &TcpTuning) -> Admitted {
    let out = measure::unadmitted(file, keys, tuning, Duration::from_secs(5)).await;
    let mut rx = Admitted::all(file);
    rx.leave_out(out, |_| {});
    rx
}

impl Send {
    /// Chooses the strategy and the tree (probing if planned), leaves out who does not admit
    /// the source, and runs the session.
    pub(super) async fn session(
        &self,
        input: Input,
        keys: Keys,
        tracker: SharedTracker,
    ) -> Result<Report, Error> {
        let len = input.manifest.total_len;
        let skipped = input.skipped().to_vec();
        let strategy = self
            .strategy
            .resolve(&send_shape(&self.hosts, &input, self.joined));
        if let Strategy::Auto { .. } = self.strategy {
            self.emit(Event::Chose {
                strategy,
                sites: super::sites(&self.hosts),
                len,
            });
        }
        if let (Some(s), true) = (strategy.swarm(), self.joined) {
            return Err(Error::Joined(s.name()));
        }
        let mut rx = Admitted::all(&self.hosts);
        // A planned tree's probe leaves out who does not answer; ticket receivers were
        // admitted when they joined.
        let probes = strategy.planned() && self.matrix.is_none();
        if !self.joined && !probes {
            let out =
                measure::unadmitted(&rx.file, &keys, &self.tuning, Duration::from_secs(5)).await;
            self.leave_out(&mut rx, out)?;
        }
        let plan = match strategy.planned() && !self.joined {
            true => Some(self.plan(&rx.file, &keys, len, strategy).await?),
            false => None,
        };
        let plan = match plan {
            Some(p) => {
                self.leave_out(&mut rx, p.left_out)?;
                rx.file = p.hosts;
                Some((p.plan, p.probe, p.longest_hop_rtt_ms))
            }
            None => None,
        };
        let mut report = match strategy.swarm() {
            Some(_) => {
                let tree = plan.as_ref().map(|p| &p.0);
                self.swarm(input, &rx.file, keys, strategy, tree, &tracker)
                    .await?
            }
            None => {
                let planned = plan.as_ref().map(|p| (&p.0, p.2));
                let (mut r, cfg) = self
                    .push(input, &rx.file, &keys, strategy, planned, &tracker)
                    .await?;
                self.retry_failed(&mut r, &cfg, &rx.file, &keys, &tracker)
                    .await?;
                r
            }
        };
        report.probe = plan.and_then(|p| p.1);
        report.object.skipped = skipped;
        report.leave_out(
            rx.left_out
                .into_iter()
                .map(|(i, h, why)| (i, h.name, h.addr, why)),
        );
        Ok(report)
    }

    /// The plan over `hosts` (from the matrix, the cache or a probe), said in an event.
    async fn plan(
        &self,
        hosts: &HostsFile,
        keys: &Keys,
        len: Option<u64>,
        strategy: Strategy,
    ) -> Result<PlannedPush, Error> {
        let matrix = self.matrix.as_ref().map(|(m, note)| (m, note.clone()));
        let how = PushPlanning {
            keys,
            tuning: &self.tuning,
            cache: self.cache.as_ref(),
            size: len,
            // The planner plans with 1 MiB chunks unless told (the real ones follow the depth).
            chunk: self.chunk_size.unwrap_or(1 << 20),
            balanced: strategy == Strategy::Balanced,
        };
        let p = plan_push_with(hosts, matrix, &how).await?;
        self.emit(Event::Planned {
            note: p.note.clone(),
            algorithm: p.plan.algorithm.to_string(),
            reason: p.plan.reason.clone(),
        });
        Ok(p)
    }

    /// Takes `out` (places in `rx.file`) off the receivers; an error when none is left.
    fn leave_out(&self, rx: &mut Admitted, out: Vec<LeftOut>) -> Result<(), Error> {
        rx.leave_out(out, |name| self.emit(Event::LeftOut { name: name.into() }));
        if rx.file.hosts.is_empty() {
            return Err(Error::NoReceivers);
        }
        Ok(())
    }

    /// The push's trees with their planned rates, and the strategy's name for the report.
    fn trees(
        &self,
        n: usize,
        strategy: Strategy,
        plan: Option<&Plan>,
    ) -> Result<(Vec<(Tree, f64)>, String), Error> {
        Ok(match (strategy, plan) {
            (Strategy::Flat, _) => (vec![(Tree::flat(n), 0.0)], "flat".into()),
            (Strategy::Tree { fanout }, _) => (
                vec![(Tree::kary(n, fanout.max(1)), 0.0)],
                format!("tree (fan-out {fanout})"),
            ),
            // Ticket receivers take only their parent's connection, so they cannot be probed.
            _ if self.joined => (vec![(Tree::kary(n, 1), 0.0)], "tree (chain)".into()),
            (Strategy::Balanced, Some(p)) => (p.trees.clone(), "balanced".into()),
            (_, Some(p)) => (
                vec![(p.tree().clone(), p.rate_mbps)],
                format!("tree (planned: {})", p.algorithm),
            ),
            (_, None) => return Err(Error::Plan("no plan".into())),
        })
    }

    /// A push down one tree, or several with their rates (balanced).
    async fn push(
        &self,
        input: Input,
        hosts: &HostsFile,
        keys: &Keys,
        strategy: Strategy,
        planned: Option<(&Plan, f64)>,
        tracker: &SharedTracker,
    ) -> Result<(Report, SendConfig), Error> {
        let (trees, name) = self.trees(hosts.hosts.len(), strategy, planned.map(|p| p.0))?;
        // The deepest tree sets the chunk size.
        let deepest = trees
            .iter()
            .map(|t| &t.0)
            .max_by_key(|t| (1..t.len()).map(|i| t.depth(i)).max().unwrap_or(0))
            .ok_or_else(|| Error::Plan("no tree".into()))?;
        let len = input.manifest.total_len;
        let chunk_size = self
            .chunk_size
            .unwrap_or_else(|| strategy::push_chunk_size(len, deepest));
        let multipath = hosts.hosts.iter().any(|h| !h.paths.is_empty());
        let cfg = SendConfig {
            edges: self.edges.for_session(&self.tuning.cc, multipath),
            observer: self.observer.clone(),
            chunk_size,
            stall_timeout: self.stall_timeout,
            node: NodeConfig {
                part_bytes: strategy::part_bytes(planned.map(|p| p.1)),
                ..self.node.clone()
            },
            tuning: self.tuning.clone(),
            strategy: name,
            uplink_mbps: hosts.source.as_ref().and_then(|s| s.uplink_mbps),
        };
        let status = source::new_status(&hosts.hosts, deepest, chunk_size, len);
        self.started(&status, hosts, &input, &cfg.strategy, false, true);
        Tracker::follow(tracker, &status, true);
        let keys = keys.clone();
        let r = if trees.len() > 1 {
            source::send_balanced(input, &hosts.hosts, &trees, keys, &cfg, status).await
        } else {
            let tree = &trees[0].0;
            source::send(input, &hosts.hosts, tree, keys, self.session, &cfg, status).await
        };
        let timeline = Tracker::finish(tracker);
        self.emit(Event::Ended);
        let mut report = r?;
        report.timeline = timeline;
        report.part_size = cfg.node.part_bytes;
        Ok((report, cfg))
    }

    /// Says a session starts.
    fn started(
        &self,
        status: &SharedStatus,
        hosts: &HostsFile,
        input: &Input,
        strategy: &str,
        retry: bool,
        keeps_verified: bool,
    ) {
        self.emit(Event::Started {
            status: status.clone(),
            strategy: strategy.into(),
            sites: hosts
                .hosts
                .iter()
                .map(|h| h.site.clone().unwrap_or_default())
                .collect(),
            object: input.manifest.name.clone(),
            retry,
            keeps_verified,
        });
    }

    /// A swarm (MOB, the BitTorrent-style baseline, or the hybrid over its tree).
    async fn swarm(
        &self,
        input: Input,
        hosts: &HostsFile,
        keys: Keys,
        strategy: Strategy,
        plan: Option<&Plan>,
        tracker: &SharedTracker,
    ) -> Result<Report, Error> {
        let n = hosts.hosts.len();
        let tree = match strategy {
            Strategy::Hybrid { fanout: Some(k) } => Some(Tree::kary(n, k.max(1))),
            Strategy::Hybrid { fanout: None } => plan.map(|p| p.tree().clone()),
            _ => None,
        };
        let swarm = strategy
            .swarm()
            .ok_or_else(|| Error::Plan("not a swarm".into()))?;
        // Without a tree every receiver hangs off the source, as in a flat tree.
        let flat = Tree::flat(n);
        let len = input.manifest.total_len;
        let chunk_size = self
            .chunk_size
            .unwrap_or_else(|| strategy::chunk_size(strategy.planner(), len, &flat));
        let cfg = crate::swarm::SwarmSendConfig {
            strategy: swarm,
            chunk_size,
            stall_timeout: self.stall_timeout,
            tuning: self.tuning.clone(),
            seed: rand::random(),
        };
        let status = source::new_status(
            &hosts.hosts,
            tree.as_ref().unwrap_or(&flat),
            chunk_size,
            len,
        );
        self.started(&status, hosts, &input, swarm.name(), false, false);
        Tracker::follow(tracker, &status, true);
        let r = crate::swarm::send(
            input,
            hosts.source.as_ref(),
            &hosts.hosts,
            tree.as_ref(),
            keys,
            self.session,
            &cfg,
            status,
        )
        .await;
        let timeline = Tracker::finish(tracker);
        self.emit(Event::Ended);
        let mut report = r?;
        report.timeline = timeline;
        Ok(report)
    }

    /// Sends again to the receivers that failed, each time a new session with only those
    /// hanging off the source, until every one has its copy or the retries are spent; each
    /// one's line in `report` is replaced by its latest. A receiver let go from the push
    /// because it fell behind gets one such session even without retries: it was not broken,
    /// only slow.
    async fn retry_failed(
        &self,
        report: &mut Report,
        cfg: &SendConfig,
        hosts: &HostsFile,
        keys: &Keys,
        tracker: &SharedTracker,
    ) -> Result<(), Error> {
        let Some(object) = self.object.as_ref().filter(|o| o.reopens() && !self.joined) else {
            return Ok(());
        };
        let hosts = &hosts.hosts;
        let chunk_size = cfg.chunk_size;
        for attempt in 1..=self.retries.max(1) {
            let failed = failed(report, hosts.len(), attempt <= self.retries);
            if failed.is_empty() {
                return Ok(());
            }
            self.emit(Event::Retry {
                attempt,
                retries: self.retries,
                names: failed.iter().map(|&i| hosts[i].name.clone()).collect(),
            });
            // A moment for a restarting agent to come back.
            tokio::time::sleep(Duration::from_secs(attempt.min(5) as u64)).await;
            let input = object.open()?;
            let sub = HostsFile {
                source: None,
                hosts: failed.iter().map(|&i| hosts[i].clone()).collect(),
            };
            let tree = Tree::flat(sub.hosts.len());
            let len = input.manifest.total_len;
            let status = source::new_status(&sub.hosts, &tree, chunk_size, len);
            self.started(&status, &sub, &input, &cfg.strategy, true, true);
            Tracker::follow(tracker, &status, false);
            let keys = keys.clone();
            let again =
                source::send(input, &sub.hosts, &tree, keys, rand::random(), cfg, status).await;
            Tracker::finish(tracker);
            self.emit(Event::Ended);
            let again = again?;
            for (j, &i) in failed.iter().enumerate() {
                report.receivers[i] = again.receivers[j].clone();
            }
            report.edges.extend(again.edges);
            report.rejected.extend(again.rejected);
            report.seconds += again.seconds;
            report.ok = report.receivers.iter().all(|r| r.verified);
        }
        Ok(())
    }
}

/// The receivers of `report` (the first `n`) to send to again: every one that failed when
/// `retrying`, else those let go because they fell behind.
fn failed(report: &Report, n: usize, retrying: bool) -> Vec<usize> {
    (0..report.receivers.len().min(n))
        .filter(|&i| {
            let r = &report.receivers[i];
            let behind = r
                .error
                .as_deref()
                .is_some_and(|e| e.starts_with("fell behind"));
            !r.verified && (retrying || behind)
        })
        .collect()
}
