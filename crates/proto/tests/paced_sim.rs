//! The paced UDP transport on a simulated path: exactness, rate, flow control, dead peers and
//! hostile datagrams (`bulkcast_proto::paced`).

use std::time::{Duration, Instant};

use bulkcast_proto::paced::packet::{self, Ack};
use bulkcast_proto::paced::sim::{
    Pair, PathProfile, SHORT_QUEUE_200M_10MS, WAN_100M_100MS, WAN_100M_100MS_LOSS5,
};
use bulkcast_proto::paced::{CloseCode, Config, Conn, ConnError};

fn transfer(p: PathProfile, bytes: u64, seed: u64) -> bulkcast_proto::paced::sim::Outcome {
    let mut pair = Pair::new(p, p, Config::default(), seed);
    pair.transfer(bytes, Duration::from_secs(120))
}

#[test]
fn a_lossy_long_path_gets_every_byte_in_order_near_the_link_rate() {
    // 5% loss each way (ACKs too), 100 ms, 100 Mbit/s: issue 5's hop. The ceiling is
    // 0.95 x 1448 / 1500 = 0.917 of the link; startup and the last round trips cost a little.
    for seed in [1, 2, 3] {
        let o = transfer(WAN_100M_100MS_LOSS5, 150_000_000, seed);
        assert!(o.done, "seed {seed}: {o:?}");
        assert_eq!(o.bytes, 150_000_000);
        assert!(
            o.fraction > 0.86,
            "seed {seed}: {:.3} of the link",
            o.fraction
        );
        // Random loss is resent, not mistaken for congestion: the queue stays short and
        // nothing overflows it.
        assert_eq!(o.queue_drops, 0, "{o:?}");
        // Startup and steady state's probing overshoot by at most 0.6 of a bandwidth-delay
        // product (1.25 MB here, the queue's limit).
        assert!(o.max_queue < 750_000, "queue {} bytes", o.max_queue);
        // Loss is found exactly: about 5% of packets, not many more.
        let lost = o.sender.packets_lost as f64 / o.sender.packets_sent as f64;
        assert!((0.04..0.07).contains(&lost), "declared lost {lost:.3}");
    }
}

/// The lab's seed 004 WAN link at its widest: 32 Mbit/s, 100 ms RTT, a queue of one
/// bandwidth-delay product (400 kB, the lab's default), no loss.
const SEED004_32M_100MS: PathProfile = PathProfile {
    rate: 4e6,
    delay: Duration::from_millis(50),
    loss: 0.0,
    queue: 400_000,
};

#[test]
fn a_path_loaded_both_ways_carries_both_streams_at_the_link_rate() {
    // A broadcast between sites loads a link in both directions, and each direction's data
    // queues ahead of the other's ACKs. A controller reading its queue from the round trip
    // sees the other direction's queue as its own and yields to it: read that way, this
    // simulator gave 0.77 of the link at 20 ms, and in the lab one stream of two ran at
    // 0.53-0.67 while the other had 0.96. Read from the forward delay, both keep the link.
    let p20 = PathProfile {
        delay: Duration::from_millis(10),
        queue: 80_000,
        ..SEED004_32M_100MS
    };
    for (name, p) in [("20 ms", p20), ("100 ms", SEED004_32M_100MS)] {
        let mut pair = Pair::new(p, p, Config::default(), 11);
        let [ab, ba] = pair.exchange([60_000_000, 60_000_000], Duration::from_secs(60));
        for (dir, o) in [("a->b", &ab), ("b->a", &ba)] {
            assert!(o.done, "{name} {dir}: {o:?}");
            assert_eq!(o.bytes, 60_000_000, "{name} {dir}");
            // The ceiling is 1448 / 1500 = 0.965 less the other side's ACKs (1.5% of the
            // wire); startup and the last round trips cost a little more.
            assert!(
                o.fraction > 0.92,
                "{name} {dir}: {:.3} of the link",
                o.fraction
            );
        }
        assert!(
            (ab.seconds - ba.seconds).abs() < 0.03 * ab.seconds.max(ba.seconds),
            "{name}: one direction yielded: {:.1} s against {:.1} s",
            ab.seconds,
            ba.seconds
        );
    }
    // With 1% random loss both ways, a known limit (docs/DESIGN.md): the two directions'
    // queues swing against each other (ACKs held behind the other's data leave a window
    // idle, and it grows), so each keeps about 0.85 of the link where one way keeps 0.94.
    // Neither starves.
    let lossy = PathProfile {
        loss: 0.01,
        ..SEED004_32M_100MS
    };
    let mut pair = Pair::new(lossy, lossy, Config::default(), 11);
    let [ab, ba] = pair.exchange([60_000_000, 60_000_000], Duration::from_secs(60));
    for o in [&ab, &ba] {
        assert!(o.done && o.bytes == 60_000_000, "{o:?}");
        assert!(o.fraction > 0.8, "1% loss: {:.3} of the link", o.fraction);
    }
}

#[test]
fn a_clean_path_runs_at_the_link_rate() {
    let o = transfer(WAN_100M_100MS, 150_000_000, 9);
    assert!(o.done, "{o:?}");
    assert!(o.fraction > 0.92, "{:.3}", o.fraction);
    assert_eq!(o.sender.packets_lost, 0, "{o:?}");
}

#[test]
fn a_queue_too_short_to_show_delay_costs_some_drops_not_the_rate() {
    // 50 datagrams of queue (3 ms) on a 10 ms path: the queue fills before its delay reaches
    // the controller's band, so delay cannot tell overflow from random loss. A known limit
    // (docs/transport.md): the stream still arrives whole at near the link rate, and the
    // drops stay below a tenth of the packets instead of growing.
    let o = transfer(SHORT_QUEUE_200M_10MS, 30_000_000, 4);
    assert!(o.done, "{o:?}");
    assert!(o.fraction > 0.85, "{:.3}", o.fraction);
    let drops = o.queue_drops as f64 / o.sender.packets_sent as f64;
    assert!(drops < 0.1, "{} queue drops ({drops:.4})", o.queue_drops);
}

#[test]
fn a_slow_reader_holds_the_sender_at_its_window() {
    // The receiver reads 1 MB/s through a 1 MiB window on a 100 Mbit/s path: the sender must
    // stop at the window (data beyond it would be a protocol violation and end the test).
    let cfg = Config::default().recv_window(1 << 20).unwrap();
    let mut pair = Pair::new(WAN_100M_100MS, WAN_100M_100MS, cfg, 5);
    pair.reader_limit = Some(1_000);
    let o = pair.transfer(5_000_000, Duration::from_secs(60));
    assert!(o.done, "{o:?}");
    assert!(o.seconds > 4.5 && o.seconds < 6.5, "{} s", o.seconds);
}

#[test]
fn an_empty_stream_finishes() {
    let o = transfer(WAN_100M_100MS_LOSS5, 0, 6);
    assert!(o.done, "{o:?}");
    assert_eq!(o.bytes, 0);
}

#[test]
fn a_path_that_dies_ends_both_sides_within_the_idle_timeout() {
    let cfg = Config::default()
        .idle_timeout(Duration::from_secs(3))
        .unwrap();
    let mut pair = Pair::new(WAN_100M_100MS, WAN_100M_100MS, cfg, 7);
    pair.kill_path_after(Duration::from_secs(1));
    let o = pair.transfer(1_000_000_000, Duration::from_secs(30));
    assert!(!o.done, "{o:?}");
    for c in [&pair.sender, &pair.receiver] {
        assert!(
            matches!(c.error(), Some(ConnError::Idle(_))),
            "{:?}",
            c.error()
        );
    }
    // Given up 3 s after the path died (at 1 s), not at the test's 30 s limit.
    assert!(o.ended > 3.9 && o.ended < 4.5, "{}", o.ended);
    assert!(o.bytes > 0 && o.bytes < 20_000_000, "{}", o.bytes);
}

#[test]
fn hostile_datagrams_are_refused_without_harm() {
    let now = Instant::now();
    let mut c = Conn::server(1, Config::default(), now);
    // Not ours, cut short, unknown kind: errors, nothing changes.
    assert!(c.handle_datagram(now, b"GET / HTTP/1.1").is_err());
    assert!(c
        .handle_datagram(now, &[0xBC, 0x75, 1, 0, 0, 0, 1, 0])
        .is_err());
    assert!(c
        .handle_datagram(now, &[0xBC, 0x75, 9, 0, 0, 0, 1])
        .is_err());
    assert!(c.error().is_none());
    // Another connection's datagram is ignored.
    let mut d = Vec::new();
    packet::encode_data(&mut d, 2, 0, 0, false, b"other");
    c.handle_datagram(now, &d).unwrap();
    assert_eq!(c.readable(), 0);
    // Data beyond the receive window is a violation: the connection closes and says why.
    d.clear();
    packet::encode_data(&mut d, 1, 0, 1 << 40, false, b"far");
    c.handle_datagram(now, &d).unwrap();
    assert!(
        matches!(c.error(), Some(ConnError::Protocol(_))),
        "{:?}",
        c.error()
    );
    let mut out = Vec::new();
    assert!(c.poll_transmit(now, &mut out));
    assert_eq!(
        packet::decode(&out).unwrap().1,
        packet::Packet::Close(CloseCode::Protocol)
    );

    // An ACK of a packet never sent is a violation too.
    let mut s = Conn::client(3, Config::default(), now);
    let mut a = Vec::new();
    packet::encode_ack(
        &mut a,
        3,
        &Ack {
            largest: 1000,
            delay_us: 0,
            recv_us: 0,
            max_data: 1 << 20,
            bits: [0xff; 32],
        },
    );
    s.handle_datagram(now, &a).unwrap();
    assert!(
        matches!(s.error(), Some(ConnError::Protocol(_))),
        "{:?}",
        s.error()
    );

    // A FIN that moves the stream's end is a violation.
    let mut r = Conn::server(4, Config::default(), now);
    d.clear();
    packet::encode_data(&mut d, 4, 0, 0, true, b"abc");
    r.handle_datagram(now, &d).unwrap();
    d.clear();
    packet::encode_data(&mut d, 4, 1, 0, true, b"abcdef");
    r.handle_datagram(now, &d).unwrap();
    assert!(
        matches!(r.error(), Some(ConnError::Protocol(_))),
        "{:?}",
        r.error()
    );
}

#[test]
fn a_sender_its_host_runs_only_every_few_milliseconds_keeps_the_link_rate() {
    // A relay of a chain shares two cores with the rest of the chain: its pacer sends when
    // the host runs it, every few milliseconds, not at each datagram's time. With at most
    // eight datagrams of catch-up a wake-up this path carried 0.51 of the link at a 2 ms
    // tick and 0.26 at 4 ms (0.916 run at once); in the lab a chain of four paced hops held
    // 75-92 Mbit/s of 100 while each window had room.
    for tick in [2, 4] {
        let mut pair = Pair::new(WAN_100M_100MS, WAN_100M_100MS, Config::default(), 5);
        pair.sender_tick = Some(Duration::from_millis(tick));
        let o = pair.transfer(100_000_000, Duration::from_secs(60));
        assert!(o.done, "tick {tick} ms: {o:?}");
        assert_eq!(o.bytes, 100_000_000);
        assert!(
            o.fraction > 0.9,
            "tick {tick} ms: {:.3} of the link",
            o.fraction
        );
    }
}
