//! The table `lab check` prints: per path one line per measurement with its verdict, then the
//! forwarder's figures and the summary of what was missed.

use std::fmt::Write as _;

use super::{
    contrast_ok, loss_ok, rate_ok, rtt_ok, CheckReport, PathCheck, Target, UdpLoss,
    CONTRAST_FACTOR, CONTRAST_SHARE, NOT_JUDGED, RATE_SHARE,
};

/// The verdict texts of the TCP targets. They spell out the targets' constants, so the table
/// says what was asked without a look at the code.
struct TcpVerdicts {
    rate_met: String,
    rate_missed: String,
    contrast_met: String,
    contrast_missed: String,
}

impl TcpVerdicts {
    fn new() -> Self {
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        TcpVerdicts {
            rate_met: format!("ok (>= {})", pct(RATE_SHARE)),
            rate_missed: format!("FAIL (< {})", pct(RATE_SHARE)),
            contrast_met: format!(
                "ok (>= {CONTRAST_FACTOR}x cubic, >= {})",
                pct(CONTRAST_SHARE)
            ),
            contrast_missed: format!(
                "FAIL (< {CONTRAST_FACTOR}x cubic or < {})",
                pct(CONTRAST_SHARE)
            ),
        }
    }
}

impl CheckReport {
    /// The table `lab check` prints.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<40} {:<10} {:>16} {:>22}  verdict",
            "path", "what", "configured", "measured"
        );
        let tcp_verdicts = TcpVerdicts::new();
        for p in &self.paths {
            render_rtt(&mut s, p);
            render_tcp(&mut s, p, &tcp_verdicts);
            if let Some(u) = p.loss {
                render_loss(&mut s, p, &u);
            }
            if p.late_events > 0 || p.attempts > 1 || p.host.is_some_and(|h| h.late_wakeups > 0) {
                let _ = writeln!(s, "{:<40} {}", "", p.attempt_line());
            }
        }
        for r in &self.retried {
            for (_, f) in r.missed() {
                let _ = writeln!(s, "measured again after a stall: {f} {}", r.attempt_line());
            }
        }
        self.render_forwarder(&mut s);
        self.render_summary(&mut s);
        s
    }

    /// The forwarder's CPU, drops and lateness, and the ceiling one TCP stream reached.
    fn render_forwarder(&self, s: &mut String) {
        let cpu = self.forwarder_cpu.map_or("unknown".into(), |c| {
            format!("{:.0}% of one core", c * 100.0)
        });
        let _ = writeln!(
            s,
            "forwarder CPU: {cpu} over {:.0} s; TUN TX dropped: {}; events >1 ms late: {} (max {:.2} ms)",
            self.wall_s, self.tx_dropped, self.late_events, self.max_lateness_ms
        );
        // Who shaped decides what the ceiling's bytes are: the two count different headers.
        let shaping = if self.kernel_shaping {
            "the kernel (htb counts Ethernet frames: 1448 of 1514 bytes are TCP payload)"
        } else {
            "the forwarder (it counts IP packets: 1448 of 1500 bytes are TCP payload)"
        };
        if let Some(c) = self.ceiling() {
            let _ = writeln!(
                s,
                "ceiling: one TCP stream carried {:.1}% of its path's rate; links shaped by {shaping}",
                c * 100.0
            );
        }
    }

    /// The closing lines: what was not judged, what failed, or that all targets were met.
    fn render_summary(&self, s: &mut String) {
        let not_judged = self.not_judged();
        for l in &not_judged {
            let _ = writeln!(s, "NOT JUDGED: {l}");
        }
        let f = self.failures();
        if f.is_empty() && not_judged.is_empty() {
            let _ = writeln!(s, "all targets met");
        } else if f.is_empty() {
            let _ = writeln!(
                s,
                "all judged targets met; {} path(s) NOT JUDGED: the host stalled in every attempt",
                not_judged.len()
            );
        } else {
            for l in f {
                let _ = writeln!(s, "FAIL: {l}");
            }
        }
    }
}

/// The path's line: label, configured and measured round trip. The target covers the range
/// issue 3 asked for, 10-250 ms; outside it the figure is shown without a verdict.
fn render_rtt(s: &mut String, p: &PathCheck) {
    let rtt_verdict = if !(10.0..=250.0).contains(&p.rtt_cfg_ms) {
        "(no target)"
    } else {
        p.verdict(Target::Rtt, rtt_ok(p.rtt_cfg_ms, p.rtt_ms), "ok", "FAIL")
    };
    let _ = writeln!(
        s,
        "{:<40} {:<10} {:>13.2} ms {:>13.2} ms (min {:.2})  {rtt_verdict}",
        p.label, "rtt", p.rtt_cfg_ms, p.rtt_ms, p.rtt_min_ms
    );
}

/// One line per congestion control. Only bbr has a target: the rate on a lossless path, the
/// contrast with cubic on a lossy one.
fn render_tcp(s: &mut String, p: &PathCheck, v: &TcpVerdicts) {
    let rate = p
        .rate_mbps
        .map_or("unlimited".to_string(), |r| format!("{r:.1} Mbit/s"));
    for (cc, m) in &p.tcp {
        let (share, verdict) = match p.rate_mbps {
            Some(r) => {
                let cubic = p.tcp_mbps("cubic");
                let verdict = match (cc.as_str(), cubic) {
                    ("bbr", _) if !p.contrast_applies() => {
                        p.verdict(Target::Rate, rate_ok(r, *m), &v.rate_met, &v.rate_missed)
                    }
                    ("bbr", Some(c)) => p.verdict(
                        Target::Contrast,
                        contrast_ok(r, c, *m),
                        &v.contrast_met,
                        &v.contrast_missed,
                    ),
                    _ => "(no target)",
                };
                (format!(" ({:.1}%)", 100.0 * m / r), verdict)
            }
            None => (String::new(), "(no target)"),
        };
        let _ = writeln!(
            s,
            "{:<40} {:<10} {:>16} {:>14.1} Mbit/s{share}  {verdict}",
            "",
            format!("tcp {cc}"),
            rate,
            m
        );
    }
}

/// The UDP loss against the configured one, then where the lost packets went: only the
/// emulator's random drops are the path's loss.
fn render_loss(s: &mut String, p: &PathCheck, u: &UdpLoss) {
    let l = u.path_loss();
    let v = p.verdict(Target::Loss, loss_ok(p.loss_cfg, l), "ok", "FAIL");
    let _ = writeln!(
        s,
        "{:<40} {:<10} {:>14.3} % {:>14.3} % ({} pkts)  {v}",
        "",
        "udp loss",
        p.loss_cfg * 100.0,
        l * 100.0,
        u.sent
    );
    let q = match (u.queue_drops, p.excused(Target::Queue)) {
        (0, _) => "",
        (_, true) => "dropped while the forwarder was stalled",
        (_, false) if p.not_judged() => NOT_JUDGED,
        (_, false) => "FAIL",
    };
    let _ = writeln!(
        s,
        "{:<40} (lost {}: emulator random {}, emulator queue {}, receiving socket {} \
         (not the path's))  {q}",
        "", u.lost, u.random_drops, u.queue_drops, u.socket_drops
    );
}
