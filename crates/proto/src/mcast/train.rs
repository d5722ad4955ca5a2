//! The sending rate, measured: the first symbols of the first pass go out back to back as a
//! *train*, and each receiver times how fast they arrived (packet-train dispersion).
//!
//! Why: a multicast source has one rate for every receiver, and no window to find it the way
//! TCP does. Sent faster than the narrowest link to any receiver, the excess is lost at that
//! link's queue and costs repairs; sent slower, the link idles. A user rarely knows the rate
//! (UFTP and udpcast ask for it), and a hosts file's capacities are declared, not measured.
//! The train finds the bottleneck the data itself meets: the source's own uplink (its queue
//! holds the socket back), a switch port, or a receiver's downlink. Its datagrams are real
//! data, so the measurement costs no time; only what a too-fast train loses is repaired.
//!
//! Rate, not available bandwidth: traffic that shares the bottleneck later is not tracked, and
//! the rate holds for the session, unless the train arrived as fast as it was written (then it
//! is a floor, see [`super::probe`]). A little random loss does not bias it: it counts the symbol
//! indexes the train spans, lost ones included (a datagram dropped past the bottleneck took
//! its time there). A train that lost much ran into a queue that overflowed: then only the
//! datagrams that arrived were carried, at the bottleneck's rate, and only they count.

use super::Micros;

/// Datagrams in the train: about 1.5 MB, 0.12 s at 100 Mbit/s and 12 ms at 1 Gbit/s. Long
/// enough that a receiver's timer and scheduling (tens of microseconds) are noise, and that a
/// burst allowance at the bottleneck (an htb bucket, a switch buffer) is a small part of it.
pub const TRAIN_DATAGRAMS: u32 = 1024;

/// A train whose datagrams stopped arriving this long ago is over: its last ones were lost
/// (a queue in front of a slow link drops a burst's tail), and the source waits for the
/// report before it sends more.
pub const QUIET: Micros = 20_000;

/// Fewest train datagrams a receiver must have timed for its report to count.
pub const MIN_TIMED: u32 = 32;

/// Above this share lost, a train is taken to have overflowed a queue on its way.
pub const OVERFLOW_LOSS: f64 = 0.10;

/// The share of the slowest receiver's measured rate the source sends at: a little below the
/// bottleneck, so its queue drains and cross traffic finds room.
pub const RATE_SHARE: f64 = 0.98;

/// What one receiver saw of the train (the `Train` control message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainReport {
    /// Train datagrams received.
    pub received: u32,
    /// Lowest train sequence number received (a symbol's position in the first pass).
    pub first: u32,
    /// Highest train sequence number received.
    pub last: u32,
    /// Microseconds from the arrival of `first` to that of `last`.
    pub span: Micros,
}

impl TrainReport {
    /// The rate at which the train arrived, in bytes per second on the wire (`datagram`
    /// bytes each, headers included); `None` when too little of it was timed.
    pub fn rate(&self, datagram: u64) -> Option<u64> {
        let gaps = u64::from(self.last.checked_sub(self.first)?);
        if self.received < MIN_TIMED || gaps == 0 || self.span == 0 {
            return None;
        }
        let carried = match self.loss() <= OVERFLOW_LOSS {
            true => gaps,
            false => u64::from(self.received - 1),
        };
        Some(carried * datagram * 1_000_000 / self.span)
    }

    /// The share of the train lost on the way (of the span it covered).
    pub fn loss(&self) -> f64 {
        let spanned = f64::from(self.last.saturating_sub(self.first)) + 1.0;
        (1.0 - f64::from(self.received) / spanned).max(0.0)
    }
}

/// The train is timed in this many windows of consecutive symbols, and a receiver reports
/// its fastest window but the first: a host that stalls a moment (the source's, or a busy
/// switch) makes a gap that only slows the windows it falls in, and a queue that lets a
/// burst through faster than its rate (a token bucket's depth) does so at the start.
pub const WINDOWS: u32 = 8;

/// The arrivals of part of the train.
#[derive(Debug, Default, Clone, Copy)]
struct Span {
    first: Option<(u32, Micros)>,
    last: Option<(u32, Micros)>,
    received: u32,
}

impl Span {
    fn add(&mut self, s: u32, now: Micros) {
        self.received += 1;
        // Datagrams handed over together (one timestamp for a run) arrived by the end of it:
        // the span starts at the first run's last datagram, not its first.
        let same_run = self.first.is_some_and(|(f, t)| t == now && s > f);
        if same_run || self.first.is_none_or(|(f, _)| s < f) {
            self.first = Some((s, now));
        }
        if self.last.is_none_or(|(l, _)| s > l) {
            self.last = Some((s, now));
        }
    }

    fn report(&self) -> Option<TrainReport> {
        let ((first, t0), (last, t1)) = (self.first?, self.last?);
        Some(TrainReport {
            received: self.received,
            first,
            last,
            span: t1.saturating_sub(t0),
        })
    }
}

/// A receiver's side: times the train as its datagrams arrive.
#[derive(Debug, Default)]
pub struct TrainMeter {
    whole: Span,
    windows: [Span; WINDOWS as usize],
    reported: bool,
}

impl TrainMeter {
    /// A first-pass symbol at position `seq` arrived at `now`. Returns the report once the
    /// train is over (a later symbol arrived), exactly once.
    pub fn handle_symbol(&mut self, now: Micros, seq: u64) -> Option<TrainReport> {
        if self.reported {
            return None;
        }
        match u32::try_from(seq) {
            Ok(s) if s < TRAIN_DATAGRAMS => {
                self.whole.add(s, now);
                self.windows[(s / (TRAIN_DATAGRAMS / WINDOWS)) as usize].add(s, now);
                // The train's last datagram: it is over.
                (s + 1 == TRAIN_DATAGRAMS).then(|| self.report()).flatten()
            }
            _ => self.report(),
        }
    }

    /// The report, once no train datagram arrived for [`QUIET`].
    pub fn handle_timeout(&mut self, now: Micros) -> Option<TrainReport> {
        match self.whole.last {
            Some((_, t)) if now >= t + QUIET => self.report(),
            _ => None,
        }
    }

    /// When [`TrainMeter::handle_timeout`] may report.
    pub fn poll_timeout(&self) -> Micros {
        match (self.reported, self.whole.last) {
            (false, Some((_, t))) => t + QUIET,
            _ => Micros::MAX,
        }
    }

    /// The train is over (the first pass ended, or the file is shorter than a train): the
    /// report, if one is still due and anything arrived: the fastest window but the first
    /// that could be timed, else the whole train.
    pub fn report(&mut self) -> Option<TrainReport> {
        if self.reported {
            return None;
        }
        let whole = self.whole.report()?;
        self.reported = true;
        let fastest = self.windows[1..]
            .iter()
            .filter_map(Span::report)
            .filter_map(|r| Some((r.rate(1_000_000)?, r)))
            .max_by_key(|(rate, _)| *rate)
            .map(|(_, r)| r);
        Some(fastest.unwrap_or(whole))
    }
}

/// The rate to send at (bytes per second on the wire) from the receivers' reports:
/// [`RATE_SHARE`] of the slowest measured arrival rate; `None` when no report could be timed.
/// (What the source itself wrote the train at is no bound: a stall of its thread slows that
/// figure, not the link.)
pub fn rate_from(reports: &[TrainReport], datagram: u64) -> Option<u64> {
    let slowest = reports.iter().filter_map(|r| r.rate(datagram)).min()?;
    Some(((slowest as f64 * RATE_SHARE) as u64).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_train_is_timed_from_its_first_to_its_last_arrival_and_reported_once() {
        let mut m = TrainMeter::default();
        // One datagram per 100 us; every twentieth lost.
        for s in 0..TRAIN_DATAGRAMS - 1 {
            if s % 20 != 3 {
                assert_eq!(
                    m.handle_symbol(1_000 + u64::from(s) * 100, u64::from(s)),
                    None
                );
            }
        }
        let r = m
            .handle_symbol(1_000 + u64::from(TRAIN_DATAGRAMS) * 100, 5_000)
            .expect("a later symbol ends the train");
        // The windows all read the same: one of them (not the first) is reported.
        let w = TRAIN_DATAGRAMS / WINDOWS;
        assert!(r.first >= w && r.last - r.first >= w - 2, "{r:?}");
        assert_eq!(r.span, u64::from(r.last - r.first) * 100);
        assert!((r.loss() - 0.05).abs() < 0.02, "{}", r.loss());
        // 1500 bytes per 100 us: 15 MB/s, whatever was lost.
        assert_eq!(r.rate(1_500), Some(15_000_000));
        assert_eq!(m.handle_symbol(99_999_999, 6_000), None);
        assert_eq!(m.report(), None);
    }

    #[test]
    fn a_stall_and_a_first_burst_do_not_count() {
        // 100 us a datagram, but the first 40 came at once (a token bucket's depth) and the
        // source stalled for 20 ms before datagram 600.
        let mut m = TrainMeter::default();
        let mut t = 0;
        let mut report = None;
        for s in 0..TRAIN_DATAGRAMS {
            t += match s {
                0..40 => 1,
                600 => 20_000,
                _ => 100,
            };
            report = report.or(m.handle_symbol(t, u64::from(s)));
        }
        let r = report.expect("the last datagram reports");
        assert_eq!(r.rate(1_500), Some(15_000_000), "{r:?}");
    }

    #[test]
    fn datagrams_handed_over_in_runs_are_timed_from_the_end_of_the_first_run() {
        // Runs of 16 datagrams with one timestamp, a run every 1.6 ms (100 us a datagram).
        let mut m = TrainMeter::default();
        for s in 0..TRAIN_DATAGRAMS / 2 {
            m.handle_symbol(u64::from(s / 16) * 1_600, u64::from(s));
        }
        let r = m.report().unwrap();
        assert_eq!(r.rate(1_500), Some(15_000_000), "{r:?}");
    }

    #[test]
    fn a_train_that_overflowed_a_queue_counts_only_what_arrived() {
        // A queue took the first 200 of a burst and then one in four while the burst lasted;
        // they left it one per 100 us.
        let seqs: Vec<u32> = (0..200).chain((200..TRAIN_DATAGRAMS).step_by(4)).collect();
        let mut m = TrainMeter::default();
        for (i, s) in seqs.iter().enumerate() {
            m.handle_symbol(i as u64 * 100, u64::from(*s));
        }
        let r = m.report().unwrap();
        assert!(r.loss() > OVERFLOW_LOSS);
        assert_eq!(
            r.rate(1_500),
            Some(15_000_000),
            "the queue's rate, not 1/(1 - loss) of it"
        );
    }

    #[test]
    fn the_trains_last_datagram_or_the_end_reports_and_too_little_is_no_rate() {
        let mut m = TrainMeter::default();
        let last = u64::from(TRAIN_DATAGRAMS - 1);
        assert!(m.handle_symbol(0, last - 1).is_none());
        let r = m.handle_symbol(50, last).unwrap();
        assert_eq!((r.received, r.span), (2, 50));
        assert_eq!(r.rate(1_500), None, "two datagrams time nothing");
        // Quiet for a while: the rest was lost, report what came.
        let mut m = TrainMeter::default();
        m.handle_symbol(100, 0);
        m.handle_symbol(200, 1);
        assert_eq!(m.poll_timeout(), 200 + QUIET);
        assert_eq!(m.handle_timeout(199 + QUIET), None);
        assert_eq!(m.handle_timeout(200 + QUIET).map(|r| r.span), Some(100));
        assert_eq!(m.poll_timeout(), Micros::MAX);
        // A file shorter than a train: the end reports what came.
        let mut m = TrainMeter::default();
        assert_eq!(m.report(), None, "nothing arrived: nothing to report");
        for s in 0..100 {
            m.handle_symbol(s * 10, s);
        }
        assert_eq!(m.report().unwrap().rate(1_000), Some(100_000_000));
    }

    #[test]
    fn the_slowest_receiver_sets_the_rate() {
        let at = |us_per: u64| TrainReport {
            received: 500,
            first: 0,
            last: 500,
            span: 500 * us_per,
        };
        // 1000-byte datagrams at 100 and 80 us: 10 and 12.5 MB/s.
        let reports = [
            at(80),
            at(100),
            TrainReport {
                received: 3,
                ..at(1)
            },
        ];
        assert_eq!(rate_from(&reports, 1_000), Some(9_800_000));
        assert_eq!(rate_from(&reports[2..], 1_000), None);
    }
}
