//! The weighted deal (the fork) and its controller: blocks of `B * w_i` bytes per connection,
//! the weights re-measured and re-set as the paper's section 3 describes.

use std::collections::VecDeque;
use std::time::Instant;

use super::*;

#[derive(Debug)]
pub(super) struct Controller {
    pub(super) phase: Phase,
    /// When `Settle` ends, and the phase after it.
    pub(super) settle_until: Option<(Instant, Phase)>,
    /// Mean and standard deviation of the sojourn times with equal blocks.
    pub(super) equal: Option<(f64, f64)>,
    /// An early re-weighting (3.1) was already made in this cycle.
    pub(super) early_done: bool,
    /// Mean sojourn times of the last three measurements in `Track`.
    pub(super) history: VecDeque<f64>,
    pub(super) last_reweight: Option<Instant>,
    pub(super) stats: ControllerStats,
}

impl Spreader {
    /// The fork (weighted and equal): deals waiting input, in order, into the connections'
    /// buffers of `B * w_i` bytes. As in the paper, it blocks on the next connection in the
    /// deal order while that one's buffer is still full, however much room the others have:
    /// this is what makes equal blocks run at N times the slowest rate (eq. 1).
    pub(super) fn fork(&mut self, now: Instant) {
        if self.config.scheduler == Scheduler::Pull || !self.conns.iter().any(|c| c.alive) {
            return;
        }
        let block = self.config.weighted.block as f64;
        while let Some(&(item, _)) = self.pending.front() {
            let t = self.deal_target(item.len);
            let c = &mut self.conns[t];
            let room = (block * c.weight).max(f64::from(item.len)) as u64;
            if !c.dealt.is_empty() && c.dealt_bytes + u64::from(item.len) > room {
                return;
            }
            c.deficit -= f64::from(item.len);
            c.dealt.push_back((item, now));
            c.dealt_bytes += u64::from(item.len);
            self.pending.pop_front();
            self.pending_bytes -= u64::from(item.len);
        }
    }

    /// Deficit round robin over the live connections with quantum `B * w_i`: the fixed,
    /// weighted deal order of the fork. Returns the connection the next item of `len` bytes
    /// goes to without charging it, so asking again gives the same answer.
    pub(super) fn deal_target(&mut self, len: u32) -> usize {
        let n = self.conns.len();
        let block = self.config.weighted.block.max(1) as f64;
        let len = f64::from(len);
        if !self.arrived {
            let c = &mut self.conns[self.cursor];
            if c.alive {
                c.deficit += block * c.weight;
            }
            self.arrived = true;
        }
        loop {
            let c = &mut self.conns[self.cursor];
            if c.alive && c.deficit >= len {
                return self.cursor;
            }
            self.cursor = (self.cursor + 1) % n;
            let c = &mut self.conns[self.cursor];
            if c.alive {
                c.deficit += block * c.weight;
            }
        }
    }

    pub(super) fn set_weights(&mut self, weights: impl Fn(&Conn) -> f64) {
        for c in &mut self.conns {
            c.weight = weights(c);
            c.deficit = 0.0;
        }
        // A new round from the first connection.
        self.cursor = 0;
        self.arrived = false;
        self.normalize_weights();
    }

    /// The fastest live connection at weight 1, none under the minimum.
    pub(super) fn normalize_weights(&mut self) {
        let max = self
            .conns
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.weight)
            .fold(0.0, f64::max);
        let min = self.config.weighted.min_weight;
        for c in &mut self.conns {
            c.weight = if max > 0.0 {
                (c.weight / max).max(min)
            } else {
                1.0
            };
        }
    }

    pub(super) fn reset_periods(&mut self) {
        for c in &mut self.conns {
            c.reset_period();
        }
    }

    pub(super) fn restart_measure(&mut self, now: Instant) {
        self.set_weights(|_| 1.0);
        self.reset_periods();
        let ctl = &mut self.controller;
        ctl.phase = Phase::Measure;
        ctl.settle_until = None;
        ctl.early_done = false;
        ctl.history.clear();
        ctl.last_reweight = Some(now);
    }

    /// Eq. 2 from the last measurement: `B_i = B * r_i / r_max`.
    pub(super) fn reweight(&mut self, rates: &[Option<f64>], now: Instant) {
        self.set_weights(|_| 0.0);
        for (c, r) in self.conns.iter_mut().zip(rates) {
            c.weight = r.unwrap_or(0.0);
        }
        self.normalize_weights();
        self.reset_periods();
        let ctl = &mut self.controller;
        ctl.stats.reweights += 1;
        ctl.last_reweight = Some(now);
    }

    pub(super) fn settle(&mut self, then: Phase, now: Instant) {
        self.controller.phase = Phase::Settle;
        self.controller.settle_until = Some((now + self.config.weighted.settle, then));
    }

    /// The controller of section 3, run on every acknowledgement.
    pub(super) fn control(&mut self, now: Instant) {
        let cfg = &self.config.weighted;
        if let Some((until, then)) = self.controller.settle_until {
            if now >= until {
                self.controller.settle_until = None;
                self.controller.phase = then;
                self.reset_periods();
            }
            return;
        }
        if self.controller.phase == Phase::Track {
            if let (Some(alarm), Some(last)) = (cfg.alarm, self.controller.last_reweight) {
                if now >= last + alarm {
                    self.controller.stats.alarms += 1;
                    self.restart_measure(now);
                    return;
                }
            }
        }
        let live = self.conns.iter().filter(|c| c.alive).count() as u64;
        if live == 0 {
            return;
        }
        let steps = u64::from(cfg.steps).div_ceil(live).max(2);
        let period = steps * live * cfg.block.max(1);
        let acked: u64 = self.conns.iter().map(|c| c.p_bytes).sum();
        if acked < period {
            return;
        }
        // The measurement: per-connection rate (bytes per busy second) and mean sojourn time
        // (fork to join: dealt to acknowledged).
        let rates: Vec<Option<f64>> = self
            .conns
            .iter()
            .map(|c| {
                (c.alive && c.p_service > 0.0)
                    .then(|| c.p_rate_bytes as f64 / c.p_service)
                    .or_else(|| (c.alive && c.rate() > 0.0).then(|| c.rate()))
            })
            .collect();
        let sojourns: Vec<f64> = self
            .conns
            .iter()
            .filter(|c| c.alive && c.p_items > 0)
            .map(|c| c.p_sojourn / c.p_items as f64)
            .collect();
        let n = sojourns.len().max(1) as f64;
        let mean = sojourns.iter().sum::<f64>() / n;
        let sd = (sojourns.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
        self.controller.stats.mean_sojourn = Some(Duration::from_secs_f64(mean));
        let threshold = cfg.threshold;
        match self.controller.phase {
            Phase::Measure => {
                self.controller.equal = Some((mean, sd));
                self.reweight(&rates, now);
                self.settle(Phase::Check, now);
            }
            Phase::Check => {
                let (eq_mean, eq_sd) = self.controller.equal.unwrap_or((mean, sd));
                if mean > eq_mean && sd > eq_sd {
                    // Worse on both counts: keep equal blocks.
                    self.controller.stats.reverted += 1;
                    self.set_weights(|_| 1.0);
                    self.reset_periods();
                    self.controller.history = VecDeque::from([eq_mean]);
                    self.controller.phase = Phase::Track;
                } else if mean > eq_mean && !self.controller.early_done {
                    // Only the mean is worse: re-weight early from this measurement.
                    self.controller.early_done = true;
                    self.reweight(&rates, now);
                    self.settle(Phase::Track, now);
                } else {
                    self.reset_periods();
                    self.controller.history = VecDeque::from([mean]);
                    self.controller.phase = Phase::Track;
                }
            }
            Phase::Track => {
                let h = &self.controller.history;
                let reference = if h.is_empty() {
                    mean
                } else {
                    h.iter().sum::<f64>() / h.len() as f64
                };
                if mean > (1.0 + threshold) * reference {
                    self.controller.stats.triggered += 1;
                    self.restart_measure(now);
                } else {
                    let h = &mut self.controller.history;
                    h.push_back(mean);
                    if h.len() > 3 {
                        h.pop_front();
                    }
                    self.reset_periods();
                }
            }
            Phase::Settle | Phase::Off => self.reset_periods(),
        }
    }
}
