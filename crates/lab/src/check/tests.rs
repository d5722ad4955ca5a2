use super::measure::snmp_counter;
use super::*;

/// A 10 ms, 200 Mbit/s path whose RTT probes read 12 ms.
fn slow_rtt(late_events: u64, met_before: Vec<Target>) -> PathCheck {
    PathCheck {
        label: "a -> e".into(),
        rtt_cfg_ms: 10.0,
        rtt_ms: 12.05,
        rtt_min_ms: 10.8,
        rate_mbps: Some(200.0),
        tcp: vec![("bbr".into(), 190.0)],
        loss: Some(UdpLoss {
            sent: 30_000,
            ..Default::default()
        }),
        late_events,
        attempts: 2,
        met_before,
        ..Default::default()
    }
}

#[test]
fn a_miss_is_excused_only_when_stalled_and_met_before() {
    assert_eq!(
        slow_rtt(21_315, vec![Target::Rtt]).failures(),
        Vec::<String>::new()
    );
    // Without a stall the miss is the emulator's.
    assert_eq!(slow_rtt(0, vec![Target::Rtt]).failures().len(), 1);
    // Stalled, but never met: not shown.
    assert_eq!(slow_rtt(21_315, vec![Target::Rate]).failures().len(), 1);
    let r = CheckReport {
        paths: vec![slow_rtt(21_315, vec![Target::Rtt])],
        ..Default::default()
    };
    assert!(r.failures().is_empty());
    assert!(r.render().contains(EXCUSED), "{}", r.render());
}

/// Attempt of the 100 Mbit/s, 100 ms path of `lab_root::fidelity`: bbr carried `bbr`
/// Mbit/s, with `late_events` and what the host probe saw.
fn rate_attempt(bbr: f64, late_events: u64, host: Option<HostProbe>) -> PathCheck {
    PathCheck {
        label: "a -> b (a-b)".into(),
        rtt_cfg_ms: 100.0,
        rtt_ms: 100.6,
        rtt_min_ms: 100.4,
        rate_mbps: Some(100.0),
        tcp: vec![("cubic".into(), 96.0), ("bbr".into(), bbr)],
        loss: Some(UdpLoss {
            sent: 30_000,
            ..Default::default()
        }),
        late_events,
        host,
        ..Default::default()
    }
}

/// The host probe of a 20 s attempt: `late` wakeups adding up to `stalled_ms`.
fn probe(late: u64, stalled_ms: f64, worst_ms: f64) -> Option<HostProbe> {
    Some(HostProbe {
        secs: 20.0,
        wakeups: 18_000,
        late_wakeups: late,
        stalled_ms,
        max_late_ms: worst_ms,
    })
}

/// A host that stalled (340 ms of 20 s in spells over 10 ms, worst 180 ms).
fn stalled() -> Option<HostProbe> {
    probe(14, 340.0, 180.0)
}

/// A punctual host.
fn punctual() -> Option<HostProbe> {
    probe(0, 0.0, 0.9)
}

/// Files `attempts` as [`check`] does with `retries`: the last attempt in `paths`, the
/// earlier ones in `retried`. Panics if `check` would have measured more.
fn judge(attempts: Vec<PathCheck>, retries: u32) -> CheckReport {
    let mut past = Attempts::default();
    let mut report = CheckReport::default();
    let n = attempts.len();
    for (i, mut pc) in attempts.into_iter().enumerate() {
        pc.attempts = i as u32 + 1;
        if past.file(&mut pc, retries) {
            report.retried.push(pc);
        } else {
            assert_eq!(i + 1, n, "attempt {} was the last", i + 1);
            report.paths.push(pc);
            return report;
        }
    }
    panic!("check would measure again after attempt {n}");
}

#[test]
fn the_host_stalls_when_a_wakeup_is_very_late_or_late_ones_add_up() {
    let mut p = HostProbe {
        secs: 20.0,
        ..Default::default()
    };
    assert!(!p.stalled());
    for _ in 0..18_000 {
        p.record(0.08);
    }
    // The guest's own scheduling (up to 10 ms) is not the host's stall.
    for _ in 0..50 {
        p.record(9.9);
    }
    assert_eq!((p.late_wakeups, p.stalled()), (0, false), "{p}");
    // One 49 ms hiccup in 20 s: neither long enough nor 1% of the time.
    p.record(49.0);
    assert_eq!((p.late_wakeups, p.stalled()), (1, false), "{p}");
    // Recurring spells: 49 + 14 x 11 ms = 203 ms, 1% of 20 s.
    for _ in 0..14 {
        p.record(11.0);
    }
    assert!(p.stalled(), "{p}");
    // One wakeup half the rate path's round trip late.
    let mut q = HostProbe {
        secs: 20.0,
        ..Default::default()
    };
    q.record(HOST_STALL_MS);
    assert!(q.stalled(), "{q}");
}

#[test]
fn a_path_the_host_stalled_in_every_attempt_is_not_judged() {
    // CI of 2026-11-2x: six attempts, bbr 80.9/73.0/80.8/43.9/72.3/87.4 Mbit/s with
    // 8,300-18,202 forwarder events late, here with the host probe stalled in each.
    let runs = [(80.9, 8_300), (73.0, 12_000), (80.8, 18_202)];
    let more = [(43.9, 15_000), (72.3, 9_000), (87.4, 10_000)];
    let attempts: Vec<PathCheck> = runs
        .iter()
        .chain(&more)
        .map(|&(m, late)| rate_attempt(m, late, stalled()))
        .collect();
    let r = judge(attempts, 5);
    assert_eq!(
        r.retried.len(),
        5,
        "host-stalled misses are measured again first"
    );
    let last = &r.paths[0];
    assert!(last.not_judged());
    assert!(r.failures().is_empty(), "{:?}", r.failures());
    let table = r.render();
    assert_eq!(r.not_judged().len(), 1, "{table}");
    assert!(r.not_judged()[0].contains("bbr 87.4"), "{table}");
    assert!(table.contains("NOT JUDGED: a -> b"), "{table}");
    assert!(table.contains(NOT_JUDGED), "{table}");
    assert!(table.contains("1 path(s) NOT JUDGED"), "{table}");
    // One attempt allowed: it was every attempt.
    assert!(judge(vec![rate_attempt(80.9, 0, stalled())], 0).paths[0].not_judged());
}

#[test]
fn a_late_forwarder_with_a_punctual_host_still_fails() {
    let attempts = (0..6)
        .map(|_| rate_attempt(80.0, 12_000, punctual()))
        .collect();
    let r = judge(attempts, 5);
    assert_eq!(r.retried.len(), 5);
    assert!(!r.paths[0].not_judged());
    assert_eq!(r.failures().len(), 1, "{}", r.render());
    assert!(r.not_judged().is_empty());
    assert!(
        r.render().contains("FAIL: a -> b (a-b): bbr 80.0"),
        "{}",
        r.render()
    );
    // Without a probe (no real-time priority) no host stall is assumed.
    let r = judge(vec![rate_attempt(80.0, 12_000, None)], 0);
    assert_eq!(r.failures().len(), 1, "{}", r.render());
    // Nor without late events: a miss with a punctual forwarder is not measured again.
    let r = judge(vec![rate_attempt(80.0, 0, punctual())], 5);
    assert_eq!(r.failures().len(), 1, "{}", r.render());
}

#[test]
fn one_attempt_without_a_host_stall_makes_the_path_judged() {
    // The first attempt missed with only the forwarder late, the others with the host
    // stalled: the emulator had one fair attempt and missed.
    let mut attempts = vec![rate_attempt(80.0, 9_000, punctual())];
    attempts.extend((0..5).map(|_| rate_attempt(80.0, 9_000, stalled())));
    let r = judge(attempts, 5);
    assert!(r.paths[0].host_stalled() && !r.paths[0].not_judged());
    assert_eq!(r.failures().len(), 1, "{}", r.render());
    // Host stalls, then a last attempt without one that misses again: fails.
    let mut attempts: Vec<PathCheck> = (0..5)
        .map(|_| rate_attempt(80.0, 9_000, stalled()))
        .collect();
    attempts.push(rate_attempt(85.0, 9_000, punctual()));
    let r = judge(attempts, 5);
    assert_eq!(r.failures().len(), 1, "{}", r.render());
    // ... or that meets: passes, judged.
    let mut attempts = vec![rate_attempt(70.0, 9_000, stalled())];
    attempts.push(rate_attempt(95.0, 9_000, punctual()));
    let r = judge(attempts, 5);
    assert!(r.failures().is_empty() && r.not_judged().is_empty());
    assert!(r.render().contains("all targets met"), "{}", r.render());
    // A host-stalled miss without forwarder late events is measured again too.
    let r = judge(
        vec![
            rate_attempt(70.0, 0, stalled()),
            rate_attempt(95.0, 0, punctual()),
        ],
        1,
    );
    assert_eq!((r.retried.len(), r.failures().len()), (1, 0));
}

/// Attempt of the 100 Mbit/s, 100 ms, 1% loss path of `lab_root::fidelity`.
fn lossy_attempt(cubic: f64, bbr: f64, late_events: u64, host: Option<HostProbe>) -> PathCheck {
    PathCheck {
        label: "a -> c (a-c)".into(),
        loss_cfg: 0.01,
        tcp: vec![("cubic".into(), cubic), ("bbr".into(), bbr)],
        loss: Some(UdpLoss {
            sent: 30_000,
            lost: 290,
            random_drops: 290,
            ..Default::default()
        }),
        ..rate_attempt(bbr, late_events, host)
    }
}

#[test]
fn a_lossy_path_must_show_the_cubic_bbr_contrast() {
    // Usual figures on an idle VM: met, and no rate target on a lossy path.
    let r = judge(vec![lossy_attempt(1.4, 96.0, 0, punctual())], 5);
    assert!(r.failures().is_empty(), "{}", r.render());
    assert!(
        r.render().contains("ok (>= 5x cubic, >= 25%)"),
        "{}",
        r.render()
    );
    // CI of 2026-11-24 (the last session's red run): bbr 14.3 against cubic 1.4 while the
    // host stalled 3.4 s; the contrast test outside `check` failed without a second attempt.
    // Now it is a target: measured again, and passes when a later attempt meets it.
    let r = judge(
        vec![
            lossy_attempt(1.4, 14.3, 11_879, stalled()),
            lossy_attempt(1.3, 95.0, 9_000, punctual()),
        ],
        5,
    );
    assert_eq!(
        (r.retried.len(), r.failures().len()),
        (1, 0),
        "{}",
        r.render()
    );
    // Stalled in every attempt: not judged; with a fair attempt that misses: fails.
    let r = judge(vec![lossy_attempt(1.4, 14.3, 11_879, stalled()); 2], 1);
    assert!(r.paths[0].not_judged() && r.failures().is_empty());
    let r = judge(vec![lossy_attempt(1.4, 14.3, 0, punctual())], 5);
    assert_eq!(r.failures().len(), 1, "{}", r.render());
    assert!(r.failures()[0].contains("bbr 14.3"), "{:?}", r.failures());
    // An emulator whose loss hits bbr as hard as cubic fails the ratio, whatever the share.
    assert!(!contrast_ok(100.0, 20.0, 90.0) && contrast_ok(100.0, 1.4, 25.0));
    assert!(!contrast_ok(50.0, 0.3, 12.0), "under 25% of 50 Mbit/s");
}

#[test]
fn the_host_probe_stops_with_its_attempt() {
    let run = HostProbeRun::start();
    std::thread::sleep(Duration::from_millis(30));
    let t = Instant::now();
    let p = run.finish();
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    // None where this test may not use SCHED_FIFO.
    if let Some(p) = p {
        assert!(p.wakeups > 0 && p.secs < 1.0, "{p}");
    }
    // Dropped without `finish` (an attempt that failed): stopped and joined too.
    drop(HostProbeRun::start());
}

#[test]
fn the_receiving_sockets_drops_are_not_the_paths_loss() {
    let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors \
                OutDatagrams RcvbufErrors SndbufErrors\nUdp: 29510 0 470 1 470 0\n\
                UdpLite: InDatagrams RcvbufErrors\nUdpLite: 0 9\n";
    assert_eq!(snmp_counter(snmp, "Udp:", "RcvbufErrors"), Some(470));
    assert_eq!(snmp_counter(snmp, "Udp:", "InDatagrams"), Some(29510));
    assert_eq!(snmp_counter(snmp, "Udp:", "Nonesuch"), None);
    assert_eq!(
        snmp_counter("Udp: RcvbufErrors\n", "Udp:", "RcvbufErrors"),
        None
    );

    // A lossless path whose receiver was stalled: 470 of 30000 dropped at its socket.
    let mut p = slow_rtt(0, vec![]);
    p.rtt_ms = 10.1;
    p.tcp = vec![("bbr".into(), 195.0)];
    let stalled = UdpLoss {
        sent: 30_000,
        lost: 470,
        socket_drops: 470,
        ..Default::default()
    };
    p.loss = Some(stalled);
    assert_eq!(stalled.path_loss(), 0.0);
    assert!(p.failures().is_empty(), "{:?}", p.failures());
    // Lost in the emulator's queues: not random loss, but a miss of its own...
    p.loss = Some(UdpLoss {
        socket_drops: 0,
        queue_drops: 470,
        ..stalled
    });
    let missed: Vec<Target> = p.missed().into_iter().map(|(t, _)| t).collect();
    assert_eq!(missed, vec![Target::Queue]);
    assert_eq!(p.failures().len(), 1, "{:?}", p.failures());
    let r = CheckReport {
        paths: vec![p.clone()],
        ..Default::default()
    };
    assert!(r.render().contains("emulator queue 470"), "{}", r.render());
    // ... excused when the forwarder ran late (it released a stall's arrivals at once).
    p.late_events = 900;
    assert!(p.failures().is_empty(), "{:?}", p.failures());
    // Lost without a counter to explain it: the path's random loss is off.
    p.loss = Some(UdpLoss {
        queue_drops: 0,
        ..stalled
    });
    p.loss.as_mut().unwrap().socket_drops = 0;
    assert_eq!(p.failures().len(), 1, "{:?}", p.failures());
}
