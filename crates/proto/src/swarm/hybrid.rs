//! The hybrid's push meter: how fast the tree parent's push brings new pieces, and from it
//! the push horizon beyond which a receiver pulls (see the module documentation of
//! [`crate::swarm`] for the design).
//!
//! The rate is an exponentially weighted mean (weight 1/2) of the pieces pushed per
//! [`SwarmConfig::tick`], measured from [`SwarmConfig::warmup`] after the start; before the
//! first measurement nothing is pulled. The horizon is `prefix + rate * push_horizon`.

use std::time::{Duration, Instant};

use super::SwarmConfig;

/// Measures the push rate of a hybrid receiver.
#[derive(Debug)]
pub(crate) struct PushMeter {
    tick: Duration,
    horizon: f64,
    next_tick: Instant,
    last_tick: Instant,
    count: u64,
    /// Pieces per second, once measured.
    rate: Option<f64>,
}

impl PushMeter {
    pub(crate) fn new(cfg: &SwarmConfig, now: Instant) -> Self {
        Self {
            tick: cfg.tick.max(Duration::from_millis(1)),
            horizon: cfg.push_horizon.as_secs_f64(),
            next_tick: now + cfg.warmup,
            last_tick: now,
            count: 0,
            rate: None,
        }
    }

    pub(crate) fn next(&self) -> Instant {
        self.next_tick
    }

    /// A piece arrived by push.
    pub(crate) fn count(&mut self, _now: Instant) {
        self.count += 1;
    }

    pub(crate) fn tick(&mut self, now: Instant, _prefix: u64) {
        if now < self.next_tick {
            return;
        }
        let dt = now.saturating_duration_since(self.last_tick).as_secs_f64();
        if dt > 0.0 {
            let inst = self.count as f64 / dt;
            self.rate = Some(match self.rate {
                None => inst,
                Some(r) => 0.5 * r + 0.5 * inst,
            });
        }
        self.count = 0;
        self.last_tick = now;
        self.next_tick = now + self.tick;
    }

    /// True once the push rate is known (pulls start then).
    pub(crate) fn pulling(&self, _now: Instant) -> bool {
        self.rate.is_some()
    }

    /// The first piece index push is not expected to bring within the horizon.
    pub(crate) fn horizon(&self, prefix: u64, pieces: u64) -> u64 {
        match self.rate {
            None => pieces,
            Some(r) => {
                let ahead = (r * self.horizon).ceil();
                if ahead >= (pieces - prefix.min(pieces)) as f64 {
                    pieces
                } else {
                    prefix + ahead as u64
                }
            }
        }
    }
}
