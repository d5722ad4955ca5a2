//! Which congestion control a TCP connection of a tree runs under `--cc auto` (the default): the
//! loss-based one (cubic) until the path shows random loss, then the model-based one (bbr) for
//! the rest of the connection.
//!
//! Why not bbr throughout: on a path without random loss bbr gives away about 2% of the link
//! to its round-trip probes (it drains its queue to 4 packets for 200 ms whenever its minimum
//! round trip is 10 s old), and a chain pays that on every hop: in the lab (2026-11-26,
//! `bench/lab-run star-8`, 128 MiB, 8 receivers) a chain read 0.920-0.921 with bbr and
//! 0.935-0.937 with cubic; at 50 ms RTT 0.849 against 0.865. Why not cubic throughout: under
//! random loss it takes each loss for congestion and halves its window, which at 1% loss
//! holds a 50 ms path to a few Mbit/s, where bbr keeps its rate.
//!
//! The sign of random loss: retransmissions above [`SWITCH_AT`] of the segments sent, counted
//! from the connection's start and at least [`MIN_RETRANS`] of them. cubic's own losses when
//! it fills a drop-tail queue are a few packets every few seconds, far below that; 1% random
//! loss crosses it within the first second or two.

/// Retransmitted segments over sent segments at which a connection switches to bbr.
pub const SWITCH_AT: f64 = 0.004;

/// Retransmissions a connection must have made before it may switch: a burst at the end of
/// slow start on a short transfer is not a sign of a lossy path.
pub const MIN_RETRANS: u64 = 12;

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

/// What the `--cc` of a session asks every hop to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The system's default, untouched.
    System,
    /// One control throughout.
    Fixed(Control),
    /// Cubic until the path shows random loss, then bbr ([`Watch`]).
    Auto,
}

impl Choice {
    /// Reads the session's `cc` as the wire carries it (`""`, `cubic`, `bbr`, `auto`; any other
    /// name is passed to the kernel as it is, as `Fixed` cannot name it: `None`).
    pub fn parse(cc: &str) -> Option<Choice> {
        match cc {
            "" => Some(Choice::System),
            "cubic" => Some(Choice::Fixed(Control::Cubic)),
            "bbr" => Some(Choice::Fixed(Control::Bbr)),
            "auto" => Some(Choice::Auto),
            _ => None,
        }
    }

    /// The control a new connection starts with (`None`: leave the system's).
    pub fn initial(self) -> Option<Control> {
        match self {
            Choice::System => None,
            Choice::Fixed(c) => Some(c),
            Choice::Auto => Some(Control::Cubic),
        }
    }
}

/// Watches one connection under [`Choice::Auto`] and says when to switch.
#[derive(Debug, Clone, Default)]
pub struct Watch {
    switched: bool,
}

impl Watch {
    /// A connection that started with cubic.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the kernel's counters of the connection since its start (segments sent,
    /// segments retransmitted) and returns the control to switch to, once.
    pub fn handle_counters(&mut self, segs_out: u64, retrans: u64) -> Option<Control> {
        if self.switched || retrans < MIN_RETRANS {
            return None;
        }
        if retrans as f64 >= SWITCH_AT * segs_out.max(1) as f64 {
            self.switched = true;
            return Some(Control::Bbr);
        }
        None
    }

    /// Whether the connection switched to bbr.
    pub fn switched(&self) -> bool {
        self.switched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_loss_switches_to_bbr_once() {
        let mut w = Watch::new();
        // 1% of 2,000 segments: a lossy path.
        assert_eq!(w.handle_counters(2_000, 20), Some(Control::Bbr));
        assert!(w.switched());
        assert_eq!(w.handle_counters(4_000, 40), None);
    }

    #[test]
    fn a_queue_overflow_now_and_then_keeps_cubic() {
        let mut w = Watch::new();
        // A few packets lost each time cubic fills the queue: 0.05% of 100,000 segments.
        assert_eq!(w.handle_counters(100_000, 50), None);
        // Too few retransmissions to judge, whatever the share.
        assert_eq!(w.handle_counters(100, 5), None);
        assert!(!w.switched());
    }

    #[test]
    fn the_wire_names_parse() {
        assert_eq!(Choice::parse("auto"), Some(Choice::Auto));
        assert_eq!(
            Choice::parse("auto").and_then(Choice::initial),
            Some(Control::Cubic)
        );
        assert_eq!(Choice::parse(""), Some(Choice::System));
        assert_eq!(Choice::parse("bbr"), Some(Choice::Fixed(Control::Bbr)));
        assert_eq!(Choice::parse("reno"), None);
    }
}
