//! The rate raised while the group keeps up, when the train could not see the bottleneck.
//!
//! Why: a train measures the bottleneck only when it left the source faster than the
//! bottleneck passes it. A source whose host was busy as it wrote the train (sixteen
//! receivers starting on the same two cores wrote it at 54 Mbit/s on a 100 Mbit/s star)
//! measures its own pace, and a measured rate used to hold for the session (0.58 of the
//! link where 0.85 was there). So when the receivers took the train about as fast as it was
//! written ([`censored`]), the figure is a floor: the source raises its rate a window of
//! blocks at a time while two things hold. The receivers' loss stays usual (a rate above a
//! receiver's link overflows the queue in front of it: the repairs it asks for grow), and the
//! source kept up with its own pace (where the source's own link is the limit its socket
//! blocks, and a rate the host cannot write is no rate). [`BEHIND`] windows in a row that did
//! not keep up end the raising a little below what the last wrote (one alone may be a busy
//! moment). The first window whose loss rose ends it too: the rate steps down until a window
//! is clean again, and stays. It never goes below the train's figure, which the bottleneck
//! was seen to pass: a window that looks lossy by chance costs at most the raising, never
//! the floor. On a 1%-loss star the rate once fell a tenth a window to 26 Mbit/s before this
//! bound.
//!
//! Loss is each receiver's over the whole window: the most it asked for of each block at
//! once, summed. What the source granted block by block is no measure: it is the worst of
//! sixteen receivers in every block (5-19% on a 1%-loss star of 16, where each receiver lost
//! 0.4-4.6% of a window), and it counts requests repeated while repairs waited in the
//! source's own queue. The window is lossy when the receivers' mean loss rose (a queue many
//! receivers are behind) or the worst receiver's rose by a margin chance does not reach (a
//! receiver whose link is slower than the rest), each against the median of the windows
//! before it: not their lowest, which chance also sets (a receiver lost nothing of one
//! window, 2% of the next, in one burst).
//!
//! A window is judged only [`LAG_BLOCKS`] blocks and [`LAG`] after its last block went out,
//! when every receiver has asked for what it lost of it; the next window starts at the next
//! block, at the rate the judgement set, so each window is sent at one rate.

use std::collections::VecDeque;
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

/// Windows in a row that fell behind that end the raising.
pub const BEHIND: u32 = 3;

/// A window in which the source wrote less than this share of its rate did not keep up (the
/// pacer itself holds its rate within a fraction of a percent over a window).
pub const KEPT_UP: f64 = 0.98;

/// The receivers' mean loss over a window above the usual (the median of the windows before)
/// that marks a full queue rather than random loss; the loss must also be twice the usual.
pub const EXTRA_LOSS: f64 = 0.01;

/// Windows whose loss sets the usual: a few seconds' worth.
pub const HISTORY: usize = 16;

/// As [`EXTRA_LOSS`], for the worst receiver's: on a 1%-loss star of 16 (a drop takes a whole
/// GSO run) the worst receiver's loss over a window ranged 1-4.6% at any rate. A receiver
/// whose link is 5% slower than the rate loses 5% more.
pub const EXTRA_WORST: f64 = 0.05;

/// What the receivers lost of a window's blocks: repair symbols asked for per first-pass
/// symbol.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WindowLoss {
    /// Repair symbols the source granted per first-pass symbol: block by block the worst
    /// receiver's need, and more where requests were repeated (the repairs' cost, not a
    /// measure of loss).
    pub granted: f64,
    /// Each receiver's over the whole window, in no order (one that asked for nothing lost
    /// nothing).
    pub each: Vec<f64>,
}

impl WindowLoss {
    /// The receivers' mean loss (0 with no receivers): steadier than any one receiver's,
    /// where chance takes a burst at a time.
    pub fn mean(&self) -> f64 {
        self.each.iter().sum::<f64>() / self.each.len().max(1) as f64
    }

    /// The worst receiver's loss over the window.
    pub fn worst(&self) -> f64 {
        self.each.iter().copied().fold(0.0, f64::max)
    }
}

/// One window as judged: what was asked, written and lost, and the rate set after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    /// The window's rate, bytes per second on the wire.
    pub rate: u64,
    /// What the source wrote.
    pub wrote: u64,
    /// What the receivers lost of it.
    pub loss: WindowLoss,
    /// The rate after it.
    pub next: u64,
}

impl std::fmt::Display for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mbps = |b: u64| b as f64 * 8.0 / 1e6;
        let pc = |x: f64| x * 100.0;
        write!(
            f,
            "window at {:.1} Mbit/s wrote {:.1}: repairs {:.2}%, receivers lost {:.2}% on average, {:.2}% the worst; next {:.1}",
            mbps(self.rate),
            mbps(self.wrote),
            pc(self.loss.granted),
            pc(self.loss.mean()),
            pc(self.loss.worst()),
            mbps(self.next)
        )
    }
}

/// True when a train measured at `measured` bytes per second, written at `sent`, shows the
/// source's pace rather than the bottleneck's (`sent` 0: not known, taken as not).
pub fn censored(measured: u64, sent: u64) -> bool {
    sent > 0 && measured as f64 >= CENSORED * sent as f64
}

/// Why a probe stopped raising the rate: the first window that ended it. Rates in bytes per
/// second on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ProbeEnd {
    /// A window lost more than the windows before it usually did, on average over the
    /// receivers or at the worst.
    Lossy {
        /// The window's rate.
        rate: u64,
        /// The receivers' mean and the worst receiver's loss, per 10,000 first-pass symbols.
        loss: (u32, u32),
        /// The median of each over the windows before, per 10,000.
        usual: (u32, u32),
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
            ProbeEnd::Lossy { rate, loss, usual } => {
                let pc = |x: u32| f64::from(x) / 100.0;
                write!(
                    f,
                    "a window at {:.1} Mbit/s lost {:.2}% on average, {:.2}% at the worst receiver (usually {:.2}%, {:.2}%)",
                    mbps(rate),
                    pc(loss.0),
                    pc(loss.1),
                    pc(usual.0),
                    pc(usual.1)
                )
            }
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
    /// The receivers' mean and the worst receiver's loss in the last [`HISTORY`] windows
    /// judged: the random loss the group sees at any rate.
    history: VecDeque<(f64, f64)>,
    /// The rate the source wrote at in the last window judged.
    wrote: Option<u64>,
    /// Why raising stopped (the first window that ended it); `None` while the rate is still
    /// raised.
    ended: Option<ProbeEnd>,
    /// While raising, the windows in a row that fell behind, each held at the rate of the
    /// first. One that keeps up after it was a busy moment; [`BEHIND`] in a row are the host
    /// or its own link, and by the last the socket's queue is full (it took two windows'
    /// excess on a 100 Mbit/s star), so what the last wrote is what the link took.
    behind: u32,
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
            history: VecDeque::new(),
            wrote: None,
            ended: None,
            behind: 0,
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
    /// at `rate`; `loss` tells what the receivers lost of a range of blocks. Returns the
    /// window judged, if one was, with the new rate.
    pub fn handle_block(
        &mut self,
        now: Micros,
        block: u32,
        sent: u64,
        rate: u64,
        loss: impl Fn(Range<u32>) -> WindowLoss,
    ) -> Option<Judged> {
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
        let loss = loss(w.first..end);
        let next = self.judge(w.rate, wrote, &loss);
        Some(Judged {
            rate: w.rate,
            wrote,
            loss,
            next,
        })
    }

    /// The rate after a window sent at `rate`, written at `wrote`, that lost `loss`.
    fn judge(&mut self, rate: u64, wrote: u64, loss: &WindowLoss) -> u64 {
        let now = (loss.mean(), loss.worst());
        let usual = self.usual();
        if self.history.len() >= HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(now);
        let rose = |x: f64, usual: f64, extra: f64| x > usual + extra && x > 2.0 * usual;
        let lossy = |u: &(f64, f64)| rose(now.0, u.0, EXTRA_LOSS) || rose(now.1, u.1, EXTRA_WORST);
        if let Some(u) = usual.filter(lossy) {
            let bp = |x: f64| (x * 10_000.0).round() as u32;
            self.stop(ProbeEnd::Lossy {
                rate,
                loss: (bp(now.0), bp(now.1)),
                usual: (bp(u.0), bp(u.1)),
            });
            // A link that passes `l` loses 1 - l/rate of a rate past it: what the loss rose by
            // tells how far past it the rate went.
            let excess = (now.0 - u.0).max(now.1 - u.1).clamp(0.0, 1.0);
            let below = rate as f64 * (1.0 - excess) * RATE_SHARE;
            return (below as u64).max(self.floor_rate);
        }
        let behind = (wrote as f64) < KEPT_UP * rate as f64;
        if !self.raising() {
            return rate;
        }
        if !behind {
            self.behind = 0;
            return (rate as f64 * RAISE) as u64;
        }
        self.behind += 1;
        if self.behind < BEHIND {
            // Held: sixteen receivers starting on the source's two cores once held a window
            // to 52.8 Mbit/s of 85.6, where the next wrote 85.6.
            return rate;
        }
        // A little below what the link took (the windows before, and any that passed as kept
        // up while the queue filled, wrote more than that), so the queue drains and repairs
        // do not wait behind it; no more raising.
        self.stop(ProbeEnd::FellBehind { rate, wrote });
        ((wrote as f64 * RATE_SHARE) as u64)
            .min(rate)
            .max(self.floor_rate)
    }

    /// The median (the lower of the middle two) of the receivers' mean and of the worst
    /// receiver's loss over the windows judged before (none before the first). Lossy windows
    /// count too: a few do not move it, and loss that rose for good becomes the usual.
    fn usual(&self) -> Option<(f64, f64)> {
        let median = |f: fn(&(f64, f64)) -> f64| {
            let mut v: Vec<f64> = self.history.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v.get(v.len().saturating_sub(1) / 2).copied()
        };
        Some((median(|h| h.0)?, median(|h| h.1)?))
    }

    /// No more raising; the first reason is kept.
    fn stop(&mut self, why: ProbeEnd) {
        self.ended.get_or_insert(why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window in which each of four receivers lost `x`.
    fn lost(x: f64) -> WindowLoss {
        WindowLoss {
            granted: x,
            each: vec![x; 4],
        }
    }

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
            let loss = |r: Range<u32>| {
                lost(r.clone().map(|b| l[b as usize]).sum::<f64>() / r.len() as f64)
            };
            if let Some(j) = p.handle_block(now, b, sent, rate, loss) {
                rate = j.next;
                rates.push(j.next);
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
        // Past the host's limit it is held two windows, then set below what the host wrote.
        assert_eq!(rates[2..5], [2_073_600; 3], "{rates:?}");
        assert!(rates[5..].iter().all(|&r| r == 1_960_000), "{rates:?}");
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
        // socket's queue filled and passed; at 1.3 it wrote 1.1 and 1.05 as the queue filled
        // up, then the link's 1.0 with the queue full.
        let mut p = Probe::new(900_000);
        assert_eq!(p.judge(900_000, 900_000, &lost(0.0)), 1_080_000);
        assert_eq!(p.judge(1_080_000, 1_070_000, &lost(0.0)), 1_296_000);
        assert_eq!(p.judge(1_296_000, 1_100_000, &lost(0.0)), 1_296_000);
        assert_eq!(p.judge(1_296_000, 1_050_000, &lost(0.0)), 1_296_000);
        assert!(p.raising());
        assert_eq!(p.judge(1_296_000, 1_000_000, &lost(0.0)), 980_000);
        assert!(!p.raising());
        // A later window the host wrote slowly moves it no further.
        assert_eq!(p.judge(980_000, 900_000, &lost(0.0)), 980_000);
        let end = ProbeEnd::FellBehind {
            rate: 1_296_000,
            wrote: 1_000_000,
        };
        assert_eq!(p.ended(), Some(end));
        assert_eq!(end.to_string(), "the source wrote 8.0 Mbit/s of 10.4 asked");
    }

    #[test]
    fn a_window_the_busy_host_wrote_slowly_does_not_end_the_raising() {
        let mut p = Probe::new(1_000_000);
        assert_eq!(p.judge(1_000_000, 1_000_000, &lost(0.0)), 1_200_000);
        assert_eq!(p.judge(1_200_000, 700_000, &lost(0.0)), 1_200_000);
        assert_eq!(p.judge(1_200_000, 1_200_000, &lost(0.0)), 1_440_000);
        assert!(p.raising());
        // Behind once more, then three times in a row: ended.
        assert_eq!(p.judge(1_440_000, 800_000, &lost(0.0)), 1_440_000);
        assert_eq!(p.judge(1_440_000, 1_100_000, &lost(0.0)), 1_440_000);
        assert_eq!(p.judge(1_440_000, 1_000_000, &lost(0.0)), 1_000_000);
        assert!(!p.raising());
    }

    #[test]
    fn the_first_lossy_window_is_the_reason_raising_stopped() {
        let mut p = Probe::new(1_000_000);
        assert_eq!(p.judge(1_000_000, 1_000_000, &lost(0.01)), 1_200_000);
        assert_eq!(p.ended(), None);
        // 2.5 points more than usual: 0.98 of 0.975 of the rate.
        assert_eq!(p.judge(1_200_000, 1_200_000, &lost(0.035)), 1_146_600);
        // Against the lower of 1% and 3.5% before it; never below the train's rate.
        assert_eq!(p.judge(1_146_600, 1_146_600, &lost(0.05)), 1_078_721);
        assert_eq!(p.judge(1_078_721, 1_078_721, &lost(0.2)), 1_000_000);
        let end = ProbeEnd::Lossy {
            rate: 1_200_000,
            loss: (350, 350),
            usual: (100, 100),
        };
        assert_eq!(p.ended(), Some(end));
        assert_eq!(
            end.to_string(),
            "a window at 9.6 Mbit/s lost 3.50% on average, 3.50% at the worst receiver (usually 1.00%, 1.00%)"
        );
    }

    /// Judges `windows` windows from `rate`, the host writing at most `cap`, each receiver's
    /// loss from `each(window, rate)`; returns the rates set.
    fn judge_each(
        p: &mut Probe,
        mut rate: u64,
        windows: usize,
        cap: u64,
        each: impl Fn(usize, u64) -> Vec<f64>,
    ) -> Vec<u64> {
        let mut rates = Vec::new();
        for w in 0..windows {
            let loss = WindowLoss {
                granted: 0.0,
                each: each(w, rate),
            };
            rate = p.judge(rate, rate.min(cap), &loss);
            rates.push(rate);
        }
        rates
    }

    #[test]
    fn chance_bursts_at_one_receiver_or_another_do_not_end_the_raising() {
        // Sixteen receivers lose 1% each, and in every window one of them up to 4.5% more (a
        // drop took a whole GSO run): the rate is raised until the host cannot keep up.
        let mut p = Probe::new(500_000);
        let rates = judge_each(&mut p, 500_000, 12, 2_000_000, |w, _| {
            let mut each = vec![0.01; 16];
            each[w % 16] += 0.005 * (w % 10) as f64;
            each
        });
        assert!(
            matches!(p.ended(), Some(ProbeEnd::FellBehind { .. })),
            "{:?} {rates:?}",
            p.ended()
        );
        // Raised a fifth a window to past the host's 2 MB/s, held two windows, then set below
        // what the host wrote.
        assert!(rates[..8].windows(2).all(|w| w[1] > w[0]), "{rates:?}");
        assert_eq!(rates[8..10], [rates[7]; 2], "{rates:?}");
        assert!(rates[10..].iter().all(|&r| r == 1_960_000), "{rates:?}");
    }

    #[test]
    fn one_receiver_past_its_link_ends_the_raising_near_that_link() {
        // One of sixteen receivers is behind a link that passes 1.5 MB/s: above it the excess
        // is lost there; everyone loses 1% by chance.
        let link = 1_500_000.0;
        let mut p = Probe::new(1_000_000);
        let rates = judge_each(&mut p, 1_000_000, 12, u64::MAX, |_, rate| {
            let mut each = vec![0.01; 16];
            each[5] += (1.0 - link / rate as f64).max(0.0);
            each
        });
        assert!(
            matches!(p.ended(), Some(ProbeEnd::Lossy { .. })),
            "{:?} {rates:?}",
            p.ended()
        );
        let last = *rates.last().unwrap() as f64;
        assert!(
            (0.8 * link..=1.06 * link).contains(&last),
            "settles near the slow link: {rates:?}"
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
        let loss = |_: Range<u32>| lost(0.0);
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
        let j = p.handle_block(end + LAG, b, 0, 1_000, loss);
        assert_eq!(j.map(|j| j.next), Some(1_000));
    }
}
