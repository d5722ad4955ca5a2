use super::*;

fn spreader(scheduler: Scheduler, window: u64, conns: usize) -> (Spreader, Instant) {
    let now = Instant::now();
    let mut s = Spreader::new(SpreaderConfig {
        window,
        ..SpreaderConfig::with(scheduler)
    });
    for _ in 0..conns {
        s.add_conn(now);
    }
    (s, now)
}

/// Pull: two items per connection, acknowledged 10 and 20 ms later, so that each has a
/// rate (100 kB/s) and may take more. Returns the acknowledged items and the new time.
fn prime(s: &mut Spreader, now: Instant) -> (Vec<u64>, Instant) {
    let n = s.stats().len();
    let items: Vec<(usize, Item)> = (0..n)
        .flat_map(|c| [c, c])
        .map(|c| (c, s.poll_assign(c, now).expect("a first item")))
        .collect();
    for (k, (c, i)) in items.iter().enumerate() {
        let at = now + Duration::from_millis(10 * (1 + k as u64 % 2));
        s.handle_acked(*c, i.index, at).expect("in flight");
    }
    let done = items.iter().map(|(_, i)| i.index).collect();
    (done, now + Duration::from_millis(20))
}

fn fill(s: &mut Spreader, now: Instant) {
    while s.wants_input() {
        s.handle_input(1000, now).expect("wanted");
    }
}

#[test]
fn pull_sends_a_late_oldest_item_again_on_another_connection_once() {
    let ms = Duration::from_millis;
    for late_copy_arrives in [true, false] {
        let (mut s, now) = spreader(Scheduler::Pull, 64, 2);
        fill(&mut s, now);
        // Each connection: 100 kB/s, 10 ms round trip; a 1000-byte item usually takes 20 ms.
        let (_, now) = prime(&mut s, now);
        fill(&mut s, now);
        let stuck = s.poll_assign(0, now).expect("an item");
        assert_eq!(stuck.index, s.acked_below(), "the oldest");
        let mut t = now;
        let mut delivered = vec![stuck.index];
        // Connection 1 delivers the next items while connection 0 holds the oldest.
        for _ in 0..4 {
            let i = s.poll_assign(1, t).expect("an item");
            assert_ne!(i.index, stuck.index, "not late yet at {:?}", t - now);
            t += ms(10);
            s.handle_acked(1, i.index, t).expect("in flight");
            delivered.push(i.index);
        }
        assert_eq!(s.hedges(), 0);
        // At 100 ms it is five times late: connection 1 sends it again, once.
        t = now + ms(100);
        let again = s.poll_assign(1, t).expect("an item");
        assert_eq!(again, stuck);
        assert_eq!(s.hedges(), 1);
        s.handle_acked(1, stuck.index, t + ms(10))
            .expect("in flight");
        assert_eq!(s.acked_below(), stuck.index + 5, "the join moves on");
        if late_copy_arrives {
            // The first copy arrives after all: acknowledged, nothing else changes.
            s.handle_acked(0, stuck.index, t + ms(20))
                .expect("first copy in flight");
        } else {
            // Connection 0 fails with the first copy: it is not handed out a third time.
            s.handle_conn_lost(0, t).expect("known");
        }
        let rest: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, t + ms(30)))
            .map(|i| i.index)
            .collect();
        assert!(!rest.contains(&stuck.index), "{rest:?}");
        delivered.extend(rest);
        delivered.sort();
        assert_eq!(
            delivered,
            (stuck.index..s.items_in()).collect::<Vec<_>>(),
            "each item handed out, the late one twice only"
        );
    }
}

#[test]
fn pull_judges_a_laggard_by_the_others_on_its_path() {
    let ms = Duration::from_millis;
    for same_path in [true, false] {
        let now = Instant::now();
        let mut s = Spreader::new(SpreaderConfig {
            window: 16,
            ..SpreaderConfig::with(Scheduler::Pull)
        });
        for path in 0..3 {
            s.add_conn_on(if same_path { 0 } else { path }, now);
        }
        fill(&mut s, now);
        // Connections 0 and 1 deliver two items each within 20 ms (100 kB/s); connection
        // 2 takes a second per item (a timeout in its first round trips): 1 kB/s.
        for (c, gap) in [(0, ms(10)), (1, ms(10)), (2, ms(1000))] {
            let a = s.poll_assign(c, now).expect("a first item");
            let b = s.poll_assign(c, now).expect("a second item");
            s.handle_acked(c, a.index, now + gap).expect("in flight");
            s.handle_acked(c, b.index, now + 2 * gap)
                .expect("in flight");
        }
        fill(&mut s, now + ms(2000));
        // At its own rate, its next item would take a second, while the others run
        // through the whole window in 80 ms: left idle. On the others' path it is judged
        // at half their rate, and takes it.
        let took = s.poll_assign(2, now + ms(2000)).is_some();
        assert_eq!(took, same_path, "same path: {same_path}");
    }
}

#[test]
fn pull_judges_a_new_connection_by_the_measured_ones_on_its_path() {
    for same_path in [true, false] {
        let (mut s, now) = spreader(Scheduler::Pull, 64, 2);
        fill(&mut s, now);
        let (_, now) = prime(&mut s, now);
        let new = s.add_conn_on(if same_path { 0 } else { 1 }, now);
        fill(&mut s, now);
        // Unmeasured: two items, for a rate sample; but on a path whose connections
        // deliver 100 kB/s it is judged at half that from the start.
        let took = std::iter::from_fn(|| s.poll_assign(new, now)).count();
        if same_path {
            assert!(took > 2, "took {took}");
        } else {
            assert_eq!(took, 2);
        }
    }
}

#[test]
fn pull_measures_a_rate_when_one_item_fills_the_minimum_cap() {
    // Items as large as `pull_min_inflight`: one alone would reach the cap, and a
    // connection that only ever has one item in flight never gets a rate sample.
    let (mut s, t0) = spreader(Scheduler::Pull, 64, 1);
    for _ in 0..4 {
        s.handle_input((256 << 10) + 96, t0).unwrap();
    }
    let first = s.poll_assign(0, t0).expect("first item");
    let second = s.poll_assign(0, t0).expect("a second item in flight");
    s.handle_acked(0, first.index, t0 + Duration::from_millis(5))
        .unwrap();
    s.handle_acked(0, second.index, t0 + Duration::from_millis(7))
        .unwrap();
    assert!(s.stats()[0].rate > 0.0, "{:?}", s.stats()[0]);
}

#[test]
fn a_small_item_after_large_ones_is_taken_by_some_connection() {
    // Two measured connections, one ten times faster, then a window of large items and a
    // small one last (an end marker). Judged by its own length, the window ahead of the
    // small item is a few hundred bytes, which no connection could deliver within; the
    // fastest must take it anyway, or the edge stalls.
    let (mut s, t0) = spreader(Scheduler::Pull, 8, 2);
    for _ in 0..4 {
        s.handle_input(256 << 10, t0).expect("wanted");
    }
    let a = [s.poll_assign(0, t0).unwrap(), s.poll_assign(0, t0).unwrap()];
    let b = [s.poll_assign(1, t0).unwrap(), s.poll_assign(1, t0).unwrap()];
    for (k, i) in a.iter().enumerate() {
        s.handle_acked(0, i.index, t0 + Duration::from_millis(20 * (k as u64 + 1)))
            .unwrap();
    }
    for (k, i) in b.iter().enumerate() {
        s.handle_acked(1, i.index, t0 + Duration::from_millis(2 * (k as u64 + 1)))
            .unwrap();
    }
    let now = t0 + Duration::from_millis(50);
    while s.items_in() < s.acked_below() + 7 {
        s.handle_input(256 << 10, now).unwrap();
    }
    let small = s.handle_input(64, now).unwrap();
    assert!(!s.wants_input(), "the window is full");
    let mut sent = Vec::new();
    for _ in 0..16 {
        for c in 0..2 {
            if let Some(i) = s.poll_assign(c, now) {
                sent.push((c, i.index));
            }
        }
    }
    // Acknowledge all but the small one, then it must go.
    for &(c, i) in &sent {
        s.handle_acked(c, i, now + Duration::from_millis(60))
            .unwrap();
    }
    let later = now + Duration::from_millis(60);
    let took: Vec<_> = (0..2)
        .filter_map(|c| s.poll_assign(c, later).map(|i| (c, i.index)))
        .chain(sent.iter().copied())
        .filter(|&(_, i)| i == small)
        .collect();
    assert_eq!(took.len(), 1, "the small item went out once: {took:?}");
}

#[test]
fn input_stops_at_the_window_past_the_oldest_unacknowledged_item() {
    let (mut s, now) = spreader(Scheduler::Pull, 4, 2);
    fill(&mut s, now);
    assert_eq!(s.items_in(), 4);
    assert_eq!(s.handle_input(1000, now), Err(SpreaderError::WindowFull));
    let a = s.poll_assign(0, now).expect("item 0");
    let b = s.poll_assign(1, now).expect("item 1");
    assert_eq!((a.index, b.index), (0, 1));
    // Acknowledging item 1 does not move the window; item 0 does, past both.
    s.handle_acked(1, 1, now).expect("in flight");
    assert!(!s.wants_input());
    s.handle_acked(0, 0, now).expect("in flight");
    assert_eq!(s.acked_below(), 2);
    fill(&mut s, now);
    assert_eq!(s.items_in(), 6);
}

#[test]
fn acknowledgements_must_match_what_is_in_flight() {
    let (mut s, now) = spreader(Scheduler::Pull, 8, 2);
    fill(&mut s, now);
    let a = s.poll_assign(0, now).expect("item");
    assert_eq!(
        s.handle_acked(1, a.index, now),
        Err(SpreaderError::NotInFlight { conn: 1, index: 0 })
    );
    assert_eq!(
        s.handle_acked(7, 0, now),
        Err(SpreaderError::UnknownConn(7))
    );
    s.handle_acked(0, a.index, now).expect("in flight");
    assert!(
        s.handle_acked(0, a.index, now).is_err(),
        "acknowledged twice"
    );
}

#[test]
fn a_lost_connection_hands_its_items_to_the_others_oldest_first() {
    for scheduler in [Scheduler::Pull, Scheduler::Weighted, Scheduler::Equal] {
        let (mut s, now) = spreader(scheduler, 64, 2);
        fill(&mut s, now);
        let (mut done, now) = if scheduler == Scheduler::Pull {
            prime(&mut s, now)
        } else {
            (Vec::new(), now)
        };
        fill(&mut s, now);
        let mut on0 = Vec::new();
        while let Some(i) = s.poll_assign(0, now) {
            on0.push(i.index);
            if on0.len() == 5 {
                break;
            }
        }
        assert!(!on0.is_empty(), "{scheduler:?}");
        s.handle_acked(0, on0[0], now).expect("in flight");
        s.handle_conn_lost(0, now).expect("known");
        assert_eq!(s.poll_assign(0, now), None, "{scheduler:?}: lost");
        // Connection 1 now gets connection 0's unacknowledged items first, in order.
        let again: Vec<u64> = (1..on0.len())
            .map(|_| s.poll_assign(1, now).expect("reassigned").index)
            .collect();
        assert_eq!(again, on0[1..].to_vec(), "{scheduler:?}");
        // Then everything else, each index once.
        let mut rest: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, now))
            .map(|i| i.index)
            .collect();
        rest.extend(on0);
        rest.append(&mut done);
        rest.sort();
        assert_eq!(rest, (0..s.items_in()).collect::<Vec<_>>(), "{scheduler:?}");
    }
}

#[test]
fn equal_dealing_is_round_robin_in_blocks_and_blocks_on_a_full_buffer() {
    let (mut s, now) = spreader(Scheduler::Equal, 1000, 2);
    // 512 KiB blocks of 64 KiB items: 8 items per connection per round.
    for _ in 0..40 {
        s.handle_input(64 << 10, now).expect("wanted");
    }
    let st = s.stats();
    // The fork filled one buffer each and waits for connection 0 to take from its own.
    assert_eq!((st[0].queued_items, st[1].queued_items), (8, 8));
    let on1: Vec<u64> = std::iter::from_fn(|| s.poll_assign(1, now))
        .map(|i| i.index)
        .collect();
    assert_eq!(on1, (8..16).collect::<Vec<_>>());
    let on0: Vec<u64> = std::iter::from_fn(|| s.poll_assign(0, now))
        .map(|i| i.index)
        .take(9)
        .collect();
    assert_eq!(on0, (0..8).chain(16..17).collect::<Vec<_>>());
}

#[test]
fn pull_caps_what_a_connection_has_in_flight() {
    let (mut s, now) = spreader(Scheduler::Pull, 1000, 1);
    fill(&mut s, now);
    // Without a rate estimate: two items at a time.
    assert!(s.poll_assign(0, now).is_some());
    assert!(s.poll_assign(0, now).is_some());
    assert!(s.poll_assign(0, now).is_none());
    // The first acknowledgement after idle gives no rate, the second does: 100 kB/s.
    s.handle_acked(0, 0, now + Duration::from_millis(20))
        .expect("in flight");
    assert_eq!(s.stats()[0].rate, 0.0);
    let now = now + Duration::from_millis(30);
    s.handle_acked(0, 1, now).expect("in flight");
    assert!(
        (s.stats()[0].rate - 1e5).abs() < 1.0,
        "{}",
        s.stats()[0].rate
    );
    fill(&mut s, now);
    let cap = s.config().pull_min_inflight;
    let taken = std::iter::from_fn(|| s.poll_assign(0, now)).count() as u64;
    assert_eq!(taken, cap.div_ceil(1000));
    let st = &s.stats()[0];
    assert_eq!(st.inflight_bytes, taken * 1000);
}
