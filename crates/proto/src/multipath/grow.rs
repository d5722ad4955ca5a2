//! `--streams auto`: how many connections an edge needs, decided from its measured rate.
//!
//! Adding a connection helps where one TCP flow cannot fill the path (loss-based congestion
//! control under random loss, a per-flow limit in the network, several paths) and only costs
//! where it cannot (more queueing, more reordering). So the edge adds connections one at a time
//! and keeps one only if the rate rose. A rate measured while it is still rising (slow start,
//! the new connection's start) says nothing yet: each decision waits for the rate to settle,
//! then compares the settled rate with the one before the last connection was added. A
//! connection that did not help is closed again: on a path one flow already fills, more flows
//! only add queueing and reordering.

use std::time::Duration;

/// [`start_for`]: one connection per this much of the path's round trip.
pub const RTT_PER_START_CONN: Duration = Duration::from_millis(20);

/// [`start_for`]: the most connections an edge starts with.
pub const MAX_START: u16 = 8;

/// A settled rate at this fraction of the edge's ceiling (its rate cap) ends growth: more
/// connections cannot raise it.
pub const CEILING_SHARE: f64 = 0.9;

/// How many connections an edge starts with, from its first connection's round trip `rtt`
/// (`None`: not known) and its number of `paths`: one per [`RTT_PER_START_CONN`] of round trip,
/// between one and [`MAX_START`], and at least one per path.
///
/// Why the round trip decides: a connection's slow start needs about log2(BDP / initial window)
/// round trips to reach the path's rate, and data that arrives at a relay meanwhile is a delay
/// that no later hop of a chain can make up. N connections start with N initial windows, so they
/// get there log2(N) round trips sooner: about 0.5 s on a 162 ms path with eight. On a short hop
/// that saves almost nothing while each added connection costs reordering at the join (measured
/// in the seed-000 lab tree: with four connections on every edge the 13 ms and same-site hops
/// fell 0.1-1.2 s behind their feed where one kept up, and the 87 and 162 ms hops the other way
/// round). Loss points the same way: a flow's rate under random loss falls with its round trip,
/// and on the lab's 100 ms path five to eight connections beat two at 0, 1 and 5% loss.
pub fn start_for(rtt: Option<Duration>, paths: u16) -> u16 {
    let by_rtt = rtt.map_or(1, |r| {
        let n = r.as_secs_f64() / RTT_PER_START_CONN.as_secs_f64();
        (n.ceil() as u16).clamp(1, MAX_START)
    });
    by_rtt.max(paths).max(1)
}

/// What [`Grow::handle_interval`] asks the driver to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Keep measuring.
    Wait,
    /// Open one more connection.
    Add,
    /// Close the connection added last: it did not raise the rate. Growth is over.
    Retire,
    /// Growth is over (the limit is reached).
    Stop,
}

/// The growth state of one edge.
#[derive(Debug, Clone)]
pub struct Grow {
    conns: u16,
    max: u16,
    gain: f64,
    /// The previous interval's rate.
    prev: Option<f64>,
    /// The settled rate before the last connection was added.
    baseline: Option<f64>,
    /// The most the edge may carry (its rate cap), in the unit of the rates.
    ceiling: Option<f64>,
    done: bool,
}

impl Grow {
    /// An edge starting with `conns` connections, growing to at most `max`, keeping a
    /// connection only if the settled rate rose by more than `gain` (0.1 = 10%).
    pub fn new(conns: u16, max: u16, gain: f64) -> Self {
        Self {
            conns,
            max,
            gain,
            prev: None,
            baseline: None,
            ceiling: None,
            done: conns >= max,
        }
    }

    /// The most the edge may carry (a rate cap), in the unit of the rates; `None`: no cap.
    /// Growth stops once the settled rate is near it.
    pub fn set_ceiling(&mut self, ceiling: Option<f64>) {
        self.ceiling = ceiling;
    }

    /// Connections the edge should have now.
    pub fn conns(&self) -> u16 {
        self.conns
    }

    /// Whether growth is over.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The end of a measurement interval: the edge's rate over it (any unit), and whether the
    /// connections were the limit (data waited for them). An interval in which the source or
    /// the receiver set the rate_cap is ignored.
    pub fn handle_interval(&mut self, rate: f64, limited: bool) -> Decision {
        if self.done {
            return Decision::Stop;
        }
        if !limited {
            self.prev = None;
            return Decision::Wait;
        }
        let rising = self.prev.is_none_or(|p| rate > p * (1.0 + self.gain));
        self.prev = Some(rate);
        if rising {
            return Decision::Wait;
        }
        let helped = self.baseline.is_none_or(|b| rate > b * (1.0 + self.gain));
        self.done = true;
        let capped = self.ceiling.is_some_and(|c| rate >= c * CEILING_SHARE);
        if capped && helped {
            return Decision::Stop;
        }
        if !helped {
            self.conns -= 1;
            Decision::Retire
        } else if self.conns < self.max {
            self.done = false;
            self.baseline = Some(rate);
            self.conns += 1;
            // The next decision waits for the new connection's rate to settle.
            self.prev = None;
            Decision::Add
        } else {
            Decision::Stop
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_round_trip_starts_with_more_connections() {
        let ms = |m| Some(Duration::from_millis(m));
        assert_eq!(start_for(None, 1), 1);
        assert_eq!(start_for(ms(0), 1), 1);
        assert_eq!(start_for(ms(13), 1), 1);
        assert_eq!(start_for(ms(21), 1), 2);
        assert_eq!(start_for(ms(65), 1), 4);
        assert_eq!(start_for(ms(100), 1), 5);
        assert_eq!(start_for(ms(162), 1), 8);
        assert_eq!(start_for(ms(300), 1), MAX_START);
        // At least one per path.
        assert_eq!(start_for(ms(13), 3), 3);
        assert_eq!(start_for(ms(300), 9), 9);
    }

    #[test]
    fn growth_stops_at_the_ceiling() {
        // Settled at 95 of a ceiling of 100: no connection is tried.
        let mut g = Grow::new(1, 8, 0.1);
        g.set_ceiling(Some(100.0));
        assert_eq!(g.handle_interval(95.0, true), Decision::Wait);
        assert_eq!(g.handle_interval(95.0, true), Decision::Stop);
        assert_eq!(g.conns(), 1);
        // Settled well below it: growth goes on.
        let mut g = Grow::new(1, 8, 0.1);
        g.set_ceiling(Some(100.0));
        assert_eq!(g.handle_interval(50.0, true), Decision::Wait);
        assert_eq!(g.handle_interval(50.0, true), Decision::Add);
        // An added connection that did not help is still retired near the ceiling.
        assert_eq!(g.handle_interval(92.0, true), Decision::Wait);
        assert_eq!(g.handle_interval(52.0, true), Decision::Retire);
    }

    /// Runs a model edge whose settled rate with n connections is `settled(n)`, reached after
    /// two intervals of ramp (half, then three quarters of it).
    fn run(settled: impl Fn(u16) -> f64, max: u16) -> u16 {
        let mut g = Grow::new(1, max, 0.1);
        let mut step = 0;
        for _ in 0..100 {
            let target = settled(g.conns());
            let rate = match step {
                0 => target * 0.5,
                1 => target * 0.75,
                _ => target,
            };
            step += 1;
            match g.handle_interval(rate, true) {
                Decision::Add => step = 0,
                Decision::Stop | Decision::Retire => return g.conns(),
                Decision::Wait => {}
            }
        }
        panic!("never decided");
    }

    #[test]
    fn grows_while_each_connection_adds_and_stops_after_the_first_that_does_not() {
        // A loss-limited path: each flow gets 10, the path holds 45. The fifth connection
        // still adds 12.5%; the sixth adds nothing and is closed again.
        assert_eq!(run(|n| (10.0 * f64::from(n)).min(45.0), 8), 5);
        // A path one flow fills: the second connection is tried and closed again.
        assert_eq!(run(|_| 100.0, 8), 1);
        // A second connection that makes things worse is closed too.
        assert_eq!(run(|n| if n == 1 { 100.0 } else { 70.0 }, 8), 1);
        // Every connection helps: the limit holds.
        assert_eq!(run(|n| 10.0 * f64::from(n), 6), 6);
    }

    #[test]
    fn a_rising_rate_is_not_judged_and_an_unlimited_interval_is_ignored() {
        let mut g = Grow::new(1, 8, 0.1);
        assert_eq!(g.handle_interval(10.0, true), Decision::Wait);
        assert_eq!(
            g.handle_interval(20.0, true),
            Decision::Wait,
            "still rising"
        );
        assert_eq!(
            g.handle_interval(50.0, false),
            Decision::Wait,
            "source-limited"
        );
        assert_eq!(
            g.handle_interval(21.0, true),
            Decision::Wait,
            "first after a gap"
        );
        assert_eq!(
            g.handle_interval(21.0, true),
            Decision::Add,
            "settled: try one more"
        );
        assert_eq!(g.conns(), 2);
        assert_eq!(g.handle_interval(22.0, true), Decision::Wait);
        assert_eq!(g.handle_interval(22.0, true), Decision::Retire, "no gain");
        assert_eq!(g.conns(), 1);
        assert!(g.is_done());
        assert_eq!(g.handle_interval(99.0, true), Decision::Stop);
    }
}
