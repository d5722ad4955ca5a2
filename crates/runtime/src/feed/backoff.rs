//! When to try a lost connection again: a bounded exponential backoff with jitter.
//!
//! A subscriber (a relay's upstream subscription among them) that loses its server tries
//! again soon, since most losses are a blip; then less and less often, so that a server that
//! is down or restarting is not hammered by every subscriber of a site once a second; and at
//! random points within each wait, so that subscribers that lost one server at the same
//! moment do not all come back in step. A connection that lived long enough starts the
//! sequence again: the next loss is a new event, not the same outage.

use std::time::Duration;

/// The backoff's state: the next wait before jitter.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    reset_after: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits of `first`, doubling up to `max`; a connection that lived longer than
    /// `reset_after` starts again at `first`.
    pub const fn new(first: Duration, max: Duration, reset_after: Duration) -> Self {
        Self {
            first,
            max,
            reset_after,
            next: first,
        }
    }

    /// A subscriber's reconnections: 0.25 s doubling to 30 s, again from 0.25 s after a
    /// connection that lived over 10 s.
    pub const fn reconnect() -> Self {
        Self::new(
            Duration::from_millis(250),
            Duration::from_secs(30),
            Duration::from_secs(10),
        )
    }

    /// The connection ended after it `lived` (zero: the attempt itself failed); returns how
    /// long to wait before the next attempt. `jitter` (a uniform draw in [0, 1)) takes up to
    /// half of the wait off: a wait is never shorter than half the schedule's, so the
    /// sequence still grows.
    pub fn after(&mut self, lived: Duration, jitter: f64) -> Duration {
        if lived > self.reset_after {
            self.next = self.first;
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(v: &[f64]) -> Vec<Duration> {
        v.iter().map(|&s| Duration::from_secs_f64(s)).collect()
    }

    #[test]
    fn waits_double_to_the_bound_and_start_again_after_a_long_connection() {
        let mut b = Backoff::reconnect();
        let failed: Vec<_> = (0..10).map(|_| b.after(Duration::ZERO, 0.0)).collect();
        let want = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0];
        assert_eq!(failed, secs(&want));
        // Connections of 10 s and less are the same outage: the waits go on growing.
        assert_eq!(b.after(Duration::from_secs(10), 0.0), secs(&[30.0])[0]);
        assert_eq!(b.after(Duration::from_secs(11), 0.0), secs(&[0.25])[0]);
        assert_eq!(b.after(Duration::from_secs(3), 0.0), secs(&[0.5])[0]);
    }

    #[test]
    fn jitter_takes_at_most_half_of_a_wait() {
        let mut b = Backoff::reconnect();
        let w = [0.5, 0.999, 2.0, -1.0].map(|j| b.after(Duration::ZERO, j));
        assert_eq!(
            w[0],
            Duration::from_millis(187) + Duration::from_micros(500)
        );
        assert!(w[1] > Duration::from_millis(250) && w[1] < Duration::from_millis(251));
        assert_eq!(
            w[2],
            Duration::from_millis(500),
            "a draw past 1 is taken as 1"
        );
        assert_eq!(w[3], Duration::from_secs(2), "a draw below 0 is taken as 0");
    }
}
