//! Which congestion control a TCP connection of a tree runs under `--cc auto` (the default):
//! the model-based one (bbr) until the path has shown it is clean, then the loss-based one
//! (cubic), and bbr again if random loss appears.
//!
//! Why not bbr throughout: on a path without random loss bbr gives away about 2% of the link
//! to its round-trip probes (it drains its queue to 4 packets for 200 ms whenever its minimum
//! round trip is 10 s old), and a chain pays that on every hop: in the lab (2026-11-26,
//! `star-8`, 128 MiB, 8 receivers) a chain read 0.920-0.921 with bbr and 0.935-0.937 with
//! cubic; at 50 ms RTT 0.849 against 0.865. Why not cubic throughout: under random loss it takes
//! each loss for congestion and halves its window, which at 1% loss holds a 50 ms path to a few
//! Mbit/s, where bbr keeps its rate. Why bbr first: a first version started on cubic and moved
//! to bbr at the first signs of loss, and the first hop of a 50 ms, 1%-loss star read 0.73 of
//! the link against 0.90 for one bbr stream: cubic's collapse in the first second cost more
//! than bbr's probes cost on a clean path.
//!
//! Long paths stay on bbr: a hop whose minimum round trip is [`LONG_PATH`] or more never moves
//! to cubic. Cubic fills the drop-tail queue of the relay's uplink (100 ms on a typical access
//! link), and the acknowledgements of the hop above leave through that queue: the hop above
//! sees its round trip grow by up to the queue's depth and every hop below inherits the lag.
//! On the lab's `star-4-rtt50` (a chain of 4, 256 MiB, three pairs in the same runs,
//! 2026-11-27) bbr throughout read 0.861 / 0.866 / 0.870 against 0.844 / 0.864 / 0.860 with
//! the move to cubic (the single pair of 2026-11-26 above read the other way, within the
//! runs' noise); on a LAN the move still wins bbr's 2% back.
//!
//! Clean: at least [`CLEAN_SEGS`] segments sent with at most [`CLEAN_AT`] of them sent again
//! (cubic's own losses when it fills a drop-tail queue are a few packets every few seconds).
//! Lossy, once on cubic: [`LOSSY_AT`] of the segments of a window of at least [`WINDOW_SEGS`],
//! and at least [`MIN_RETRANS`] of them.

/// Segments a connection sends on bbr before it may be judged clean (about 3 s at 100 Mbit/s).
pub const CLEAN_SEGS: u64 = 25_000;

/// Retransmitted over sent segments at or below which a path is clean.
pub const CLEAN_AT: f64 = 0.001;

/// Retransmitted over sent segments (in a window on cubic) at which a path is lossy.
pub const LOSSY_AT: f64 = 0.004;

/// Segments of each window in which a connection on cubic is judged.
pub const WINDOW_SEGS: u64 = 2_000;

/// Retransmissions in a window before the path may be judged lossy.
pub const MIN_RETRANS: u64 = 12;

/// The minimum round trip from which a path counts as long and stays on bbr.
pub const LONG_PATH: std::time::Duration = std::time::Duration::from_millis(10);

/// A congestion control the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Loss-based (`cubic`).
    Cubic,
    /// Model-based (`bbr`).
    Bbr,
}

impl Control {
    /// The kernel's name for it (`TCP_CONGESTION`).
    pub fn name(self) -> &'static str {
        match self {
            Control::Cubic => "cubic",
            Control::Bbr => "bbr",
        }
    }
}

/// Watches one connection under `--cc auto` and says when to move.
#[derive(Debug, Clone)]
pub struct Watch {
    now: Control,
    /// The counters when the current window on cubic began.
    since: (u64, u64),
    /// Random loss showed on cubic: the connection stays on bbr.
    lossy: bool,
    /// The path's minimum round trip is [`LONG_PATH`] or more: the connection stays on bbr.
    long: bool,
}

impl Default for Watch {
    fn default() -> Self {
        Self::new()
    }
}

impl Watch {
    /// A connection that started on bbr.
    pub fn new() -> Self {
        Self {
            now: Control::Bbr,
            since: (0, 0),
            lossy: false,
            long: false,
        }
    }

    /// Takes the path's minimum round trip so far (the kernel's `tcpi_min_rtt`): from
    /// [`LONG_PATH`] the connection stays on bbr for good. A connection already moved to cubic
    /// stays there until loss shows (a minimum round trip only grows when a route changes).
    pub fn handle_min_rtt(&mut self, min_rtt: std::time::Duration) {
        if min_rtt >= LONG_PATH {
            self.long = true;
        }
    }

    /// The control the connection runs.
    pub fn control(&self) -> Control {
        self.now
    }

    /// Takes the kernel's counters of the connection since its start (segments sent,
    /// segments retransmitted) and returns the control to move to, if any.
    pub fn handle_counters(&mut self, segs_out: u64, retrans: u64) -> Option<Control> {
        match self.now {
            Control::Bbr => {
                let clean = !self.lossy
                    && !self.long
                    && segs_out >= CLEAN_SEGS
                    && retrans as f64 <= CLEAN_AT * segs_out as f64;
                if !clean {
                    return None;
                }
                self.now = Control::Cubic;
                self.since = (segs_out, retrans);
            }
            Control::Cubic => {
                let segs = segs_out.saturating_sub(self.since.0);
                if segs < WINDOW_SEGS {
                    return None;
                }
                let lost = retrans.saturating_sub(self.since.1);
                self.since = (segs_out, retrans);
                if lost < MIN_RETRANS || (lost as f64) < LOSSY_AT * segs as f64 {
                    return None;
                }
                self.now = Control::Bbr;
                self.lossy = true;
            }
        }
        Some(self.now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_path_moves_to_cubic_and_random_loss_back_to_bbr() {
        let mut w = Watch::new();
        assert_eq!(w.handle_counters(10_000, 0), None, "too early to judge");
        // 0.04% over 30,000 segments: clean.
        assert_eq!(w.handle_counters(30_000, 12), Some(Control::Cubic));
        // A queue overflow now and then keeps cubic: 5 of 100,000 segments.
        assert_eq!(w.handle_counters(130_000, 17), None);
        // 1% random loss appears: 20 of the next 2,000, back to bbr.
        assert_eq!(w.handle_counters(131_000, 27), None, "half a window");
        assert_eq!(w.handle_counters(132_000, 37), Some(Control::Bbr));
        assert_eq!(w.handle_counters(500_000, 300), None);
        assert_eq!(w.control(), Control::Bbr);
    }

    #[test]
    fn a_long_path_stays_on_bbr_however_clean() {
        let mut w = Watch::new();
        w.handle_min_rtt(std::time::Duration::from_millis(2));
        assert_eq!(w.handle_counters(10_000, 0), None);
        // Short so far: a clean path would move. Then the round trip shows 50 ms.
        w.handle_min_rtt(std::time::Duration::from_millis(50));
        assert_eq!(w.handle_counters(30_000, 0), None, "long path: stays");
        assert_eq!(w.handle_counters(3_000_000, 10), None);
        assert_eq!(w.control(), Control::Bbr);
        // Just under the threshold: a LAN-like path still moves to cubic.
        let mut w = Watch::new();
        w.handle_min_rtt(LONG_PATH - std::time::Duration::from_micros(1));
        assert_eq!(w.handle_counters(30_000, 0), Some(Control::Cubic));
    }

    #[test]
    fn a_lossy_path_stays_on_bbr() {
        let mut w = Watch::new();
        // 1% of 30,000 segments.
        assert_eq!(w.handle_counters(30_000, 300), None);
        assert_eq!(w.handle_counters(300_000, 3_000), None);
        assert_eq!(w.control(), Control::Bbr);
    }
}
