//! One edge over N parallel connections on the simulated clock (issue 5): the join is exact
//! under random delays, lost and joining connections and re-weighting; the paper's controller
//! follows a step change; pull and weighted reach high utilisation on the paper's channel
//! set-ups; and equal dealing collapses to N times the slowest rate, as eq. 1 predicts.

use std::time::Duration;

use bulkcast_proto::multipath::sim::{run, ChannelSpec, ConnSpec, ForkJoinReport, ForkJoinSpec};
use bulkcast_proto::multipath::{Phase, Scheduler};

const ALL: [Scheduler; 3] = [Scheduler::Pull, Scheduler::Weighted, Scheduler::Equal];
const MIB: u64 = 1 << 20;

fn assert_exact(r: &ForkJoinReport, total: u64, what: &str) {
    assert!(r.violations.is_empty(), "{what}: {:?}", r.violations);
    assert_eq!(r.order_errors, 0, "{what}: released out of order");
    assert!(
        r.complete,
        "{what}: released {} of {total} bytes",
        r.released_bytes
    );
    assert_eq!(r.released_bytes, total, "{what}: bytes released");
    assert_eq!(
        r.released_items,
        total.div_ceil(64 << 10),
        "{what}: items released"
    );
}

/// Four connections over four channels of different rates and latencies, each item delayed
/// by up to 30 ms more, a finite stream with a short last item.
fn jittery(scheduler: Scheduler, seed: u64) -> ForkJoinSpec {
    let mut spec = ForkJoinSpec::paper(&[40.0, 25.0, 10.0, 5.0], 4, scheduler);
    for (k, ch) in spec.channels.iter_mut().enumerate() {
        ch.latency = Duration::from_millis(2 + 7 * k as u64);
        ch.jitter = Duration::from_millis(30);
    }
    spec.bytes = Some(24 * MIB + 12345);
    spec.duration = Duration::from_secs(120);
    spec.seed = seed;
    spec
}

#[test]
fn join_is_exact_under_random_per_connection_delays() {
    for scheduler in ALL {
        for seed in 1..=3 {
            let spec = jittery(scheduler, seed);
            let r = run(&spec);
            let what = format!("{scheduler:?} seed {seed}");
            assert_exact(&r, 24 * MIB + 12345, &what);
            // The delays did reorder: the joiner had to hold items back.
            assert!(r.peak_held > 4, "{what}: peak held {}", r.peak_held);
            assert!(r.carried.iter().all(|&c| c > 0), "{what}: {:?}", r.carried);
        }
    }
}

#[test]
fn join_is_exact_when_connections_are_lost_mid_stream() {
    for scheduler in ALL {
        let mut spec = jittery(scheduler, 7);
        // Long enough latencies that acknowledgements are always on their way back.
        spec.channels[0].latency = Duration::from_millis(60);
        spec.channels[2].latency = Duration::from_millis(80);
        spec.conns[0].lost_at = Some(Duration::from_millis(1500));
        spec.conns[2].lost_at = Some(Duration::from_millis(3200));
        let r = run(&spec);
        let what = format!("{scheduler:?}");
        assert_exact(&r, 24 * MIB + 12345, &what);
        // Items whose acknowledgement died with their connection were sent again and the
        // second copy dropped.
        assert!(r.duplicates > 0, "{what}: no second copies");
        // The lost connections carried something before they went, the survivors the rest.
        assert!(r.carried.iter().all(|&c| c > 0), "{what}: {:?}", r.carried);
    }
}

#[test]
fn join_is_exact_when_all_but_one_connection_is_lost_and_another_joins() {
    for scheduler in ALL {
        let mut spec = jittery(scheduler, 11);
        spec.conns[0].lost_at = Some(Duration::from_millis(800));
        spec.conns[1].lost_at = Some(Duration::from_millis(900));
        spec.conns[2].lost_at = Some(Duration::from_millis(1000));
        spec.conns.push(ConnSpec {
            channel: 1,
            window: 256 << 10,
            joins_at: Duration::from_secs(3),
            lost_at: None,
        });
        let r = run(&spec);
        let what = format!("{scheduler:?}");
        assert_exact(&r, 24 * MIB + 12345, &what);
        assert!(
            r.carried[4] > 50,
            "{what}: the late connection carried {:?}",
            r.carried
        );
    }
}

#[test]
fn join_is_exact_while_the_controller_reweights_mid_stream() {
    let mut spec = jittery(Scheduler::Weighted, 5);
    spec.bytes = Some(120 * MIB + 1);
    spec.spreader.weighted.alarm = Some(Duration::from_secs(2));
    spec.spreader.weighted.settle = Duration::from_millis(200);
    spec.rate_changes = vec![
        (Duration::from_secs(2), 0, 2e6),
        (Duration::from_secs(4), 3, 4e6),
        (Duration::from_secs(6), 0, 6e6),
    ];
    let r = run(&spec);
    assert_exact(&r, 120 * MIB + 1, "weighted");
    assert!(
        r.controller.reweights >= 4,
        "only {} re-weightings: {:?}",
        r.controller.reweights,
        r.controller
    );
}

#[test]
fn a_joiner_window_smaller_than_the_senders_is_caught_as_a_violation() {
    let mut spec = jittery(Scheduler::Pull, 3);
    spec.joiner_window = spec.spreader.window / 8;
    spec.bytes = Some(8 * MIB);
    let r = run(&spec);
    assert!(
        r.violations
            .iter()
            .any(|v| v.contains("beyond the reorder window")),
        "{:?}",
        r.violations
    );
}

/// Weight of connection `k` at the sample ending at `at`.
fn weight_at(r: &ForkJoinReport, at: Duration, k: usize) -> f64 {
    let s = r
        .samples
        .iter()
        .find(|s| s.at >= at)
        .expect("sampled that late");
    s.conns[k].weight
}

/// Two connections, one per channel, 30 + 10 Mbit/s; channel 0 steps to `to` Mbit/s at 20 s.
fn step_spec(to: f64) -> ForkJoinSpec {
    let mut spec = ForkJoinSpec::paper(&[30.0, 10.0], 2, Scheduler::Weighted);
    spec.duration = Duration::from_secs(45);
    spec.rate_changes = vec![(Duration::from_secs(20), 0, to * 1e6 / 8.0)];
    spec
}

#[test]
fn weighted_controller_follows_a_step_down_by_its_33_percent_rule() {
    let mut spec = step_spec(5.0);
    spec.spreader.weighted.alarm = None;
    let r = run(&spec);
    // Before: 30:10, so weights 0.75 / 0.25.
    let before = weight_at(&r, Duration::from_secs(19), 0);
    assert!(
        (before - 0.75).abs() < 0.05,
        "weight before the step {before}"
    );
    // After: 5:10, so 0.33 / 0.67, within 10 s of the step, and it stays there.
    for t in [30, 38, 45] {
        let after = weight_at(&r, Duration::from_secs(t), 0);
        assert!(
            (after - 1.0 / 3.0).abs() < 0.05,
            "weight at {t} s: {after} ({:?})",
            r.controller
        );
    }
    assert!(r.controller.triggered >= 1, "{:?}", r.controller);
    assert_eq!(r.controller.alarms, 0);
    assert_eq!(r.controller.phase, Phase::Track);
    // And the throughput came back to most of the new sum (15 Mbit/s).
    let late: f64 = r.samples[35..45].iter().map(|s| s.throughput).sum::<f64>() / 10.0;
    assert!(late > 0.85 * 15e6 / 8.0, "late throughput {late}");
}

#[test]
fn weighted_controller_follows_a_step_up_through_its_alarm() {
    // A rise in rate lowers sojourn times, which the 33% rule ignores (3.2); the clocked
    // re-weighting (the alarm of 3.1) catches it within one alarm period and a measurement.
    let r = run(&step_spec(90.0));
    let before = weight_at(&r, Duration::from_secs(19), 0);
    assert!(
        (before - 0.75).abs() < 0.05,
        "weight before the step {before}"
    );
    // From 12 s after the step, whenever weights are applied (not while the alarm has the
    // controller measuring with equal blocks again), they are 90:10.
    let applied: Vec<f64> = r
        .samples
        .iter()
        .filter(|s| s.at >= Duration::from_secs(32) && s.phase != Phase::Measure)
        .map(|s| s.conns[0].weight)
        .collect();
    assert!(applied.len() >= 5, "{applied:?}");
    for w in &applied {
        assert!(
            (w - 0.9).abs() < 0.05,
            "weights after the step: {applied:?}"
        );
    }
    assert!(r.controller.alarms >= 1, "{:?}", r.controller);
}

/// The paper's static set-ups: channels (Mbit/s), connection counts, simulated seconds.
const SETUPS: [(&[f64], usize, usize, u64); 3] = [
    (&[20.0, 10.0], 2, 8, 60),
    (&[30.0, 20.0, 10.0], 3, 9, 60),
    (&[300.0, 200.0, 100.0], 3, 9, 20),
];

fn static_run(channels: &[f64], n: usize, secs: u64, scheduler: Scheduler) -> ForkJoinReport {
    let mut spec = ForkJoinSpec::paper(channels, n, scheduler);
    spec.duration = Duration::from_secs(secs);
    let r = run(&spec);
    assert!(r.violations.is_empty() && r.order_errors == 0, "{r:?}");
    r
}

#[test]
fn equal_dealing_runs_at_n_times_the_slowest_connection() {
    for (channels, lo, hi, secs) in SETUPS {
        let sum: f64 = channels.iter().sum();
        for n in lo..=hi {
            // Connections share their channel: the slowest gets its channel's rate over the
            // number of connections dealt to it.
            let slowest = (0..channels.len())
                .map(|c| channels[c] / (0..n).filter(|k| k % channels.len() == c).count() as f64)
                .fold(f64::INFINITY, f64::min);
            let predicted = (n as f64 * slowest).min(sum) / sum;
            let r = static_run(channels, n, secs, Scheduler::Equal);
            assert!(
                (r.fraction - predicted).abs() < 0.03,
                "{channels:?} N={n}: {:.3}, eq. 1 says {predicted:.3}",
                r.fraction
            );
        }
    }
}

#[test]
fn pull_reaches_nine_tenths_of_the_summed_capacity_on_the_paper_setups() {
    for (channels, lo, hi, secs) in SETUPS {
        for n in lo..=hi {
            let r = static_run(channels, n, secs, Scheduler::Pull);
            // Measured: 0.995-1.000 (the target for the default: 0.90).
            assert!(r.fraction >= 0.95, "{channels:?} N={n}: {:.3}", r.fraction);
        }
    }
}

#[test]
fn weighted_controller_beats_equal_dealing_on_the_paper_setups() {
    for (channels, lo, hi, secs) in SETUPS {
        let (mut weighted, mut equal) = (0.0, 0.0);
        for n in lo..=hi {
            let w = static_run(channels, n, secs, Scheduler::Weighted).fraction;
            let e = static_run(channels, n, secs, Scheduler::Equal).fraction;
            // Measured: at least 0.77; the paper's averages are 0.68-0.84.
            assert!(w >= 0.7, "{channels:?} N={n}: weighted {w:.3}");
            weighted += w;
            equal += e;
        }
        let count = (hi - lo + 1) as f64;
        let (weighted, equal) = (weighted / count, equal / count);
        // Measured means: 0.87-0.96 weighted against 0.61-0.75 equal.
        assert!(weighted >= 0.8, "{channels:?}: weighted mean {weighted:.3}");
        assert!(
            weighted > equal + 0.1,
            "{channels:?}: {weighted:.3} vs {equal:.3}"
        );
    }
}

#[test]
fn pull_follows_a_channel_alternating_every_20_s() {
    let mut spec = ForkJoinSpec::paper(&[20.0, 10.0], 4, Scheduler::Pull);
    spec.duration = Duration::from_secs(100);
    spec.alternate(0, 20.0, 30.0, Duration::from_secs(20));
    let r = run(&spec);
    assert!(r.fraction >= 0.95, "fraction {:.3}", r.fraction);
    assert_eq!(r.steps.len(), 4);
    for st in &r.steps {
        assert!(st.level >= 0.95 * st.capacity, "{st:?}");
        let after = st.reconverged_after.expect("re-converged");
        assert!(after <= Duration::from_secs(3), "{st:?}");
    }
}

#[test]
fn a_large_socket_buffer_on_a_slow_connection_does_not_stall_pull() {
    // 8 MiB of socket buffer on a 2 Mbit/s connection is 32 s of data: the pull cap keeps
    // what the connection holds to about its minimum (256 KiB) instead. (A 256 MiB reorder
    // window, so that the blocking estimate alone would let it queue megabytes.)
    let mut spec = ForkJoinSpec::paper(&[100.0, 2.0], 2, Scheduler::Pull);
    spec.duration = Duration::from_secs(20);
    spec.conns[1].window = 8 * MIB;
    spec.spreader.window = 4096;
    spec.joiner_window = 4096;
    let peak = |r: &ForkJoinReport| {
        r.samples
            .iter()
            .map(|s| s.conns[1].inflight_bytes)
            .max()
            .unwrap_or(0)
    };
    let r = run(&spec);
    assert!(r.fraction >= 0.95, "fraction {:.3}", r.fraction);
    assert!(peak(&r) <= (256 + 64) << 10, "peak in flight {}", peak(&r));
    assert!(r.carried[1] > 20, "{:?}", r.carried);
    // Without the cap it queues far more.
    let mut uncapped = spec.clone();
    uncapped.spreader.pull_queue_delay = Duration::from_secs(3600);
    let r = run(&uncapped);
    assert!(peak(&r) > MIB, "uncapped peak in flight {}", peak(&r));
}

#[test]
fn channel_spec_mbps_is_bytes_per_second() {
    assert_eq!(ChannelSpec::mbps(8.0).rate, 1e6);
}

#[test]
fn pull_does_not_let_a_connection_too_slow_for_the_window_stall_the_join() {
    // A 1 Mbit/s connection needs half a second per 64 KiB item, longer than the 1 Gbit/s
    // one takes to run through the whole 16 MiB window: after its two probe items it is left
    // idle instead of holding up the join (the probe costs about a second: 0.95 over 20 s).
    let mut spec = ForkJoinSpec::paper(&[1000.0, 1.0], 2, Scheduler::Pull);
    spec.duration = Duration::from_secs(20);
    let r = run(&spec);
    assert!(r.fraction >= 0.93, "fraction {:.3}", r.fraction);
    assert!(r.carried[1] <= 3, "{:?}", r.carried);
    // At 10 Mbit/s it is useful and used.
    let mut spec = ForkJoinSpec::paper(&[1000.0, 10.0], 2, Scheduler::Pull);
    spec.duration = Duration::from_secs(10);
    let r = run(&spec);
    assert!(r.fraction >= 0.97, "fraction {:.3}", r.fraction);
    assert!(r.carried[1] >= 150, "{:?}", r.carried);
}

#[test]
fn join_is_exact_on_random_edges() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(2002);
    let mut duplicates = 0;
    for case in 0..40 {
        let scheduler = ALL[case % 3];
        let channels: Vec<f64> = (0..rng.gen_range(1..=3))
            .map(|_| rng.gen_range(2.0..200.0))
            .collect();
        let n = rng.gen_range(1..=6);
        let mut spec = ForkJoinSpec::paper(&channels, n, scheduler);
        for ch in &mut spec.channels {
            ch.latency = Duration::from_micros(rng.gen_range(100..40_000));
            ch.jitter = Duration::from_micros(rng.gen_range(0..20_000));
        }
        let total = rng.gen_range(1..(8 * MIB));
        // Lose any connection but the last at a random time within the transfer, and add one
        // late now and then.
        let rate = spec.channels.iter().map(|c| c.rate).sum::<f64>();
        let span = Duration::from_secs_f64(total as f64 / rate);
        for c in spec.conns.iter_mut().take(n - 1) {
            if rng.gen_bool(0.5) {
                c.lost_at = Some(span.mul_f64(rng.gen_range(0.0..1.0)));
            }
        }
        if rng.gen_bool(0.3) {
            spec.conns.push(ConnSpec {
                channel: 0,
                window: 256 << 10,
                joins_at: span.mul_f64(rng.gen_range(0.0..1.0)),
                lost_at: None,
            });
        }
        let window = rng.gen_range(4..300);
        spec.spreader.window = window;
        spec.joiner_window = window;
        spec.item_len = rng.gen_range(1000..100_000);
        spec.spreader.weighted.block = rng.gen_range(10_000..1_000_000);
        spec.bytes = Some(total);
        spec.duration = Duration::from_secs(600);
        spec.seed = case as u64;
        let r = run(&spec);
        let what = format!("case {case}: {spec:?}");
        assert!(r.violations.is_empty(), "{what}: {:?}", r.violations);
        assert_eq!(r.order_errors, 0, "{what}");
        assert!(r.complete, "{what}: {} of {total}", r.released_bytes);
        assert_eq!(r.released_bytes, total, "{what}");
        assert_eq!(
            r.released_items,
            total.div_ceil(u64::from(spec.item_len)),
            "{what}"
        );
        duplicates += r.duplicates;
    }
    // Losses did cut acknowledgements off, and the second copies were dropped.
    assert!(duplicates > 10, "{duplicates} duplicates");
}

#[test]
fn pull_uses_a_long_path_beside_a_short_one_when_the_window_covers_it() {
    // Two paths: 1 Gbit/s at 0.5 ms and 100 Mbit/s at 50 ms one way, 4 MiB socket buffers,
    // a 64 MiB reorder window (more than the sum of the rates times the long round trip).
    let mut spec = ForkJoinSpec::paper(&[1000.0, 100.0], 2, Scheduler::Pull);
    spec.channels[1].latency = Duration::from_millis(50);
    for c in &mut spec.conns {
        c.window = 4 * MIB;
    }
    spec.spreader.window = 1024;
    spec.joiner_window = 1024;
    spec.duration = Duration::from_secs(8);
    let r = run(&spec);
    assert!(r.fraction >= 0.95, "fraction {:.3}", r.fraction);
    let share = r.carried[1] as f64 / (r.carried[0] + r.carried[1]) as f64;
    assert!(share > 0.07, "long path carried {share:.3}");
}

#[test]
fn a_stalled_connection_has_its_frames_sent_again_instead_of_stalling_the_join() {
    // Four 50 Mbit/s channels with 20 ms each way, one connection each; channel 0 carries
    // 1 kB/s from 4 s to 7 s (a retransmission timeout, as seen above TCP). The 16 MiB
    // reorder window is two thirds of a second of the edge's rate, so without second copies
    // the join stops for most of the stall.
    let mut spec = ForkJoinSpec::paper(&[50.0; 4], 4, Scheduler::Pull);
    for ch in &mut spec.channels {
        ch.latency = Duration::from_millis(20);
    }
    spec.bytes = Some(300 * MIB);
    spec.duration = Duration::from_secs(30);
    spec.rate_changes = vec![
        (Duration::from_secs(4), 0, 1000.0),
        (Duration::from_secs(7), 0, 50e6 / 8.0),
    ];
    let during = |r: &ForkJoinReport| {
        let s: Vec<f64> = r
            .samples
            .iter()
            .filter(|s| s.at > Duration::from_secs(5) && s.at <= Duration::from_secs(7))
            .map(|s| s.throughput)
            .collect();
        s.iter().sum::<f64>() / s.len().max(1) as f64
    };
    let three = 3.0 * 50e6 / 8.0;
    let r = run(&spec);
    assert_exact(&r, 300 * MIB, "hedged");
    assert!(
        during(&r) >= 0.8 * three,
        "with second copies: {:.1} Mbit/s during the stall",
        during(&r) * 8e-6
    );
    // The frames the stalled connection held were sent again, and only those: it holds a
    // few (its 256 KiB socket window is four 64 KiB items).
    let copies = r.carried.iter().sum::<u64>() - r.released_items;
    assert!((1..=8).contains(&copies), "{copies} second copies");
    let mut off = spec.clone();
    off.spreader.hedge_after = 0.0;
    // (The frame in service when the channel slowed takes a minute at its rate: without a
    // second copy the stream does not even finish within the run.)
    let r = run(&off);
    assert!(
        r.violations.is_empty() && r.order_errors == 0,
        "{:?}",
        r.violations
    );
    assert!(!r.complete);
    assert!(
        during(&r) <= 0.3 * three,
        "without: {:.1} Mbit/s during the stall",
        during(&r) * 8e-6
    );
}

#[test]
fn a_finite_stream_is_not_held_up_at_its_end_by_the_slow_connections() {
    // The lab's static runs: a stream of eight seconds at the channels' summed rate, the
    // edge's own settings (256 KiB frames, a 32 MiB window, up to four frames in flight per
    // connection, a socket holding two). A slow connection at the end of the stream could
    // still be holding seconds of frames after the fast ones ran dry; it takes a frame only
    // when it delivers it before the others would have run out of work.
    for channels in [&[20.0, 10.0][..], &[30.0, 20.0, 10.0]] {
        let sum: f64 = channels.iter().sum();
        for n in channels.len()..=9 {
            let mut spec = ForkJoinSpec::paper(channels, n, Scheduler::Pull);
            let frame = 256u32 << 10;
            spec.item_len = frame;
            spec.spreader.window = 128;
            spec.joiner_window = 128;
            spec.spreader.pull_queue_delay = Duration::from_secs(10);
            spec.spreader.pull_min_inflight = 4 * u64::from(frame);
            spec.spreader.rate_tau = Duration::from_millis(150);
            for c in &mut spec.conns {
                c.window = 2 * u64::from(frame);
            }
            let total = (sum * 1e6 / 8.0 * 8.0) as u64;
            spec.bytes = Some(total);
            let r = run(&spec);
            let what = format!("{channels:?} with {n} connections");
            assert!(r.complete && r.violations.is_empty(), "{what}");
            let ideal = total as f64 / (sum * 1e6 / 8.0);
            let fraction = ideal / r.elapsed.as_secs_f64();
            // Without the rule: 0.93-0.95 with six connections or more.
            assert!(fraction >= 0.97, "{what}: {fraction:.3} of the ideal time");
        }
    }
}
