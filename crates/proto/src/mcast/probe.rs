//! The rate raised while the group keeps up, when the train could not see the bottleneck.
//!
//! Why: a train measures the bottleneck only when it left the source faster than the
//! bottleneck passes it. A source whose host was busy as it wrote the train (sixteen
//! receivers starting on the same two cores wrote it at 54 Mbit/s on a 100 Mbit/s star)
//! measures its own pace, and a measured rate used to hold for the session (0.58 of the
//! link where 0.85 was there). So when the receivers took the train about as fast as it was
//! written ([`censored`]), the figure is a floor: the source raises its rate a window of
//! blocks at a time while two things hold. The group's loss stays at its floor (a rate above
//! a receiver's link overflows the queue in front of it: the repairs it asks for grow), and
//! the source kept up with its own pace (where the source's own link is the limit its socket
//! blocks, and a rate the host cannot write is no rate). A window that did not keep up ends
//! the raising at the last rate that did. The first window whose loss rose ends it too: the
//! rate steps down until a window is clean again, and stays. It never
//! goes below the train's figure, which the bottleneck was seen to pass: a window that looks
//! lossy by chance (a random drop takes a whole GSO run of datagrams at once, so one block in
//! a window can lose tens) costs at most the raising, never the floor. On a 1%-loss star the
//! rate once fell a tenth a window to 26 Mbit/s before this bound.
//!
//! A window is judged only [`LAG_BLOCKS`] blocks and [`LAG`] after its last block went out,
//! when every receiver has asked for what it lost of it; the next window starts at the next
//! block, at the rate the judgement set, so each window is sent at one rate.

use std::ops::Range;

use super::train::RATE_SHARE;
use super::Micros;

/// Above this share of the rate the train was written at, the receivers' measurement is the
/// source's own pace, not the bottleneck's.
pub const CENSORED: f64 = 0.85;

/// Blocks in a window: 2,048 datagrams, 0.24 s at 100 Mbit/s with the LAN's blocks.
pub const WINDOW_BLOCKS: u32 = 8;

/// Blocks sent after a window before it is judged.
pub const LAG_BLOCKS: u32 = 4;

/// Time after a window before it is judged: receivers on busy hosts ask late.
pub const LAG: Micros = 40_000;

/// Each clean window raises the rate by this factor: from half the link to the link in 4
/// windows (about 1.5 s at 50 Mbit/s). Where the source's link is the limit its socket holds
/// the excess back; past a receiver's link, one window's excess is lost and repaired.
pub const RAISE: f64 = 1.2;

/// A window that lost more than the floor steps the rate down by this factor.
pub const BACK_OFF: f64 = 0.9;

/// A window in which the source wrote less than this share of its rate did not keep up (the
/// pacer itself holds its rate within a fraction of a percent over a window).
pub const KEPT_UP: f64 = 0.98;

/// Loss (repairs per first-pass symbol, the worst receiver's per block) above the lowest a
/// window saw that marks a full queue rather than random loss; the loss must also be twice
/// that lowest.
pub const EXTRA_LOSS: f64 = 0.01;

/// True when a train measured at `measured` bytes per second, written at `sent`, shows the
/// source's pace rather than the bottleneck's (`sent` 0: not known, taken as not).
pub fn censored(measured: u64, sent: u64) -> bool {
    sent > 0 && measured as f64 >= CENSORED * sent as f64
}

/// Why a probe stopped raising the rate: the first window that ended it. Rates in bytes per
/// second on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ProbeEnd {
    /// A window lost more than the lowest a window lost.
    Lossy {
        /// The window's rate.
        rate: u64,
        /// Its loss: repairs per first-pass symbol, the worst receiver's, per 10,000.
        loss: u32,
        /// The lowest window's loss, per 10,000.
        floor: u32,
    },
    /// The source wrote less than the window asked: its host or its own link.
    FellBehind {
        /// The window's rate.
        rate: u64,
        /// What the source wrote.
        wrote: u64,
    },
}

impl std::fmt::Display for ProbeEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mbps = |b: u64| b as f64 * 8.0 / 1e6;
        match *self {
            ProbeEnd::Lossy { rate, loss, floor } => write!(
                f,
                "a window at {:.1} Mbit/s lost {:.2}% (the lowest {:.2}%)",
                mbps(rate),
                f64::from(loss) / 100.0,
                f64::from(floor) / 100.0
            ),
            ProbeEnd::FellBehind { rate, wrote } => write!(
                f,
                "the source wrote {:.1} Mbit/s of {:.1} asked",
                mbps(wrote),
                mbps(rate)
            ),
        }
    }
}

/// The probe's state at a source.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The rate measured by the train: the rate never goes below it for want of keeping up.
    floor_rate: u64,
    /// The window being sent or awaiting judgement.
    window: Option<Window>,
    /// The lowest loss a window showed: the random loss the group sees at any rate.
    floor_loss: Option<f64>,
    /// The rate the source wrote at in the last window judged.
    wrote: Option<u64>,
    /// The highest rate a window was judged clean and kept up at (at first the train's).
    kept: u64,
    /// Why raising stopped (the first window that ended it); `None` while the rate is still
    /// raised.
    ended: Option<ProbeEnd>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    first: u32,
    start: Micros,
    bytes: u64,
    rate: u64,
    /// One past its last block, when that block ended, and the bytes sent by then.
    end: Option<(u32, Micros, u64)>,
}

impl Probe {
    /// A probe from a train-measured `rate` (bytes per second on the wire).
    pub fn new(rate: u64) -> Self {
        Self {
            floor_rate: rate,
            window: None,
            floor_loss: None,
            wrote: None,
            kept: rate,
            ended: None,
        }
    }

    /// True while the rate may still be raised.
    pub fn raising(&self) -> bool {
        self.ended.is_none()
    }

    /// Why raising stopped, once it did.
    pub fn ended(&self) -> Option<ProbeEnd> {
        self.ended
    }

    /// The rate (bytes per second on the wire) the source wrote at in the last window judged:
    /// what the send went at, where the rate is above what the source's link takes.
    pub fn wrote(&self) -> Option<u64> {
        self.wrote
    }

    /// The first pass started `block` at `now`, with `sent` bytes written in all and the rate
    /// at `rate`; `loss` gives the repairs per first-pass symbol granted for a range of
    /// blocks. Returns the new rate when a window was judged.
    pub fn handle_block(
        &mut self,
        now: Micros,
        block: u32,
        sent: u64,
        rate: u64,
        loss: impl Fn(Range<u32>) -> f64,
    ) -> Option<u64> {
        let Some(w) = self.window.as_mut() else {
            self.window = Some(Window {
                first: block,
                start: now,
                bytes: sent,
                rate,
                end: None,
            });
            return None;
        };
        let Some((end, at, bytes)) = w.end else {
            if block >= w.first + WINDOW_BLOCKS {
                w.end = Some((block, now, sent));
            }
            return None;
        };
        if block < end + LAG_BLOCKS || now < at + LAG {
            return None;
        }
        let w = *w;
        self.window = None;
        let elapsed = at.saturating_sub(w.start).max(1);
        let wrote = (bytes - w.bytes).saturating_mul(1_000_000) / elapsed;
        self.wrote = Some(wrote);
        Some(self.judge(w.rate, wrote, loss(w.first..end)))
    }

    /// The rate after a window sent at `rate`, written at `wrote`, that lost `loss`.
    fn judge(&mut self, rate: u64, wrote: u64, loss: f64) -> u64 {
        let floor = self.floor_loss.map_or(loss, |f| f.min(loss));
        self.floor_loss = Some(floor);
        if loss > floor + EXTRA_LOSS && loss > 2.0 * floor {
            let bp = |x: f64| (x * 10_000.0).round() as u32;
            self.stop(ProbeEnd::Lossy {
                rate,
                loss: bp(loss),
                floor: bp(floor),
            });
            return ((rate as f64 * BACK_OFF) as u64).max(self.floor_rate);
        }
        if !self.raising() {
            return rate;
        }
        if (wrote as f64) < KEPT_UP * rate as f64 {
            // The host or its own link held the source back: back to the last rate it kept
            // up with, or a little below what it wrote if that is less (a window whose socket
            // queue was empty at its start wrote up to the queue's size more than the link
            // took, and passed as kept up), so the queue drains and repairs do not wait
            // behind it; no more raising.
            self.stop(ProbeEnd::FellBehind { rate, wrote });
            let below = (wrote as f64 * RATE_SHARE) as u64;
            return self.kept.min(below).max(self.floor_rate);
        }
        self.kept = rate;
        (rate as f64 * RAISE) as u64
    }

    /// No more raising; the first reason is kept.
    fn stop(&mut self, why: ProbeEnd) {
        self.ended.get_or_insert(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `blocks` blocks at the probe's rates, each `us` microseconds at the rate the
    /// probe set divided into `bytes_per_block`, with loss from `loss_at(rate)`; returns the
    /// rates it set.
    fn run(
        p: &mut Probe,
        mut rate: u64,
        blocks: u32,
        bytes_per_block: u64,
        cap: u64,
        loss_at: impl Fn(u64) -> f64,
    ) -> Vec<u64> {
        let (mut now, mut sent, mut rates) = (0, 0, Vec::new());
        let mut losses: Vec<f64> = Vec::new();
        for b in 0..blocks {
            let l = &losses;
            let loss =
                |r: Range<u32>| r.clone().map(|b| l[b as usize]).sum::<f64>() / r.len() as f64;
            if let Some(r) = p.handle_block(now, b, sent, rate, loss) {
                rate = r;
                rates.push(r);
            }
            losses.push(loss_at(rate));
            // The host writes at most `cap`.
            now += bytes_per_block * 1_000_000 / rate.min(cap);
            sent += bytes_per_block;
        }
        rates
    }

    #[test]
    fn a_censored_train_is_told_by_what_arrived_against_what_was_written() {
        assert!(censored(6_500_000, 6_750_000));
        assert!(!censored(6_500_000, 12_000_000));
        assert!(!censored(6_500_000, 0));
    }

    #[test]
    fn a_clean_group_has_its_rate_raised_until_the_host_cannot_keep_up_then_held_below() {
        // 1.2 MB/s measured, the host writes at most 2 MB/s, 1% random loss at any rate.
        let mut p = Probe::new(1_200_000);
        let rates = run(&mut p, 1_200_000, 200, 400_000, 2_000_000, |_| 0.01);
        assert!(rates.len() > 5, "{rates:?}");
        assert!(rates[..3].windows(2).all(|w| w[1] > w[0]), "{rates:?}");
        // Past the host's limit it goes back to the last rate it kept up with, and stays.
        assert_eq!(rates[2], 2_073_600, "{rates:?}");
        assert!(rates[3..].iter().all(|&r| r == 1_728_000), "{rates:?}");
        assert!(!p.raising());
    }

    #[test]
    fn a_rate_past_a_receivers_link_loses_and_is_stepped_down_below_it() {
        // The link passes 1.5 MB/s: above that the excess is lost.
        let link = 1_500_000.0;
        let loss_at = |r: u64| 0.01 + (1.0 - link / r as f64).max(0.0);
        let mut p = Probe::new(1_000_000);
        let rates = run(&mut p, 1_000_000, 300, 400_000, u64::MAX, loss_at);
        assert!(!p.raising(), "{rates:?}");
        let last = *rates.last().unwrap();
        assert!(
            (1_200_000..=1_500_000).contains(&last),
            "settles below the link: {rates:?}"
        );
        assert!(rates.iter().all(|&r| r < 2_000_000), "{rates:?}");
    }

    #[test]
    fn a_rate_that_passed_as_kept_up_while_a_queue_filled_is_brought_below_the_link() {
        // The train read 0.9 of a 1 MB/s link; the next window, at 1.08, wrote 1.07 while the
        // socket's queue filled and passed; at 1.3 it wrote the link's 1.0.
        let mut p = Probe::new(900_000);
        assert_eq!(p.judge(900_000, 900_000, 0.0), 1_080_000);
        assert_eq!(p.judge(1_080_000, 1_070_000, 0.0), 1_296_000);
        assert_eq!(p.judge(1_296_000, 1_000_000, 0.0), 980_000);
        assert!(!p.raising());
        assert_eq!(p.judge(980_000, 980_000, 0.0), 980_000);
        let end = ProbeEnd::FellBehind {
            rate: 1_296_000,
            wrote: 1_000_000,
        };
        assert_eq!(p.ended(), Some(end));
        assert_eq!(end.to_string(), "the source wrote 8.0 Mbit/s of 10.4 asked");
    }

    #[test]
    fn the_first_lossy_window_is_the_reason_raising_stopped() {
        let mut p = Probe::new(1_000_000);
        assert_eq!(p.judge(1_000_000, 1_000_000, 0.01), 1_200_000);
        assert_eq!(p.ended(), None);
        assert_eq!(p.judge(1_200_000, 1_200_000, 0.035), 1_080_000);
        assert_eq!(p.judge(1_080_000, 1_080_000, 0.05), 1_000_000);
        let end = ProbeEnd::Lossy {
            rate: 1_200_000,
            loss: 350,
            floor: 100,
        };
        assert_eq!(p.ended(), Some(end));
        assert_eq!(
            end.to_string(),
            "a window at 9.6 Mbit/s lost 3.50% (the lowest 1.00%)"
        );
    }

    #[test]
    fn lossy_windows_never_take_the_rate_below_the_trains() {
        // Every other window loses 20% by chance: raising stops, the train's rate holds.
        let mut p = Probe::new(1_000_000);
        let lossy = std::cell::Cell::new(0u32);
        let rates = run(&mut p, 1_000_000, 300, 400_000, u64::MAX, |_| {
            lossy.set(lossy.get() + 1);
            match lossy.get() / 12 % 2 {
                0 => 0.01,
                _ => 0.2,
            }
        });
        assert!(!p.raising(), "{rates:?}");
        assert!(rates.iter().all(|&r| r >= 1_000_000), "{rates:?}");
    }

    #[test]
    fn a_window_is_judged_only_once_its_requests_are_in() {
        let mut p = Probe::new(1_000);
        let loss = |_: Range<u32>| 0.0;
        for b in 0..WINDOW_BLOCKS + LAG_BLOCKS {
            assert_eq!(
                p.handle_block(u64::from(b) * 100_000, b, 0, 1_000, loss),
                None
            );
        }
        // Enough blocks, but too soon after the window's end.
        let end = u64::from(WINDOW_BLOCKS) * 100_000;
        let b = WINDOW_BLOCKS + LAG_BLOCKS;
        assert_eq!(p.handle_block(end + LAG - 1, b, 0, 1_000, loss), None);
        // Nothing was written in it: it did not keep up, and the train's rate holds.
        assert_eq!(p.handle_block(end + LAG, b, 0, 1_000, loss), Some(1_000));
    }
}
