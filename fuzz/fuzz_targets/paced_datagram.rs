//! Any datagrams to a paced listener: parsed or refused, never a panic, and a connection fed a
//! sequence of them (DATA in any order, ACKs of packets it never sent, flow-control limits
//! that shrink, a CLOSE) never panics either, whatever it is told.
//!
//! Input: the whole input as one datagram, and then a sequence of datagrams, each behind its
//! 2-byte big-endian length, fed to a connection (id 3, as the seeds) that also has bytes of
//! its own to send, so ACKs reach its loss detection and pacing.
#![no_main]

use std::time::{Duration, Instant};

use bulkcast_proto::paced::{packet, Config, Conn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let id = packet::conn_id(data);
    if let Ok((conn, _)) = packet::decode(data) {
        assert_eq!(Some(conn), id);
    }
    let mut now = Instant::now();
    let mut c = Conn::client(3, Config::default(), now);
    c.write(&[0x5a; 20_000]);
    c.finish();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (d, r) = rest[2..].split_at(n);
        rest = r;
        let _ = c.handle_datagram(now, d);
        // Let it send and time out between datagrams, as the shell does.
        for _ in 0..4 {
            out.clear();
            if !c.poll_transmit(now, &mut out) {
                break;
            }
            assert!(packet::decode(&out).is_ok(), "it sends what it parses");
        }
        while c.read(&mut buf) > 0 {}
        now += Duration::from_millis(3);
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
    }
    let _ = (c.stats(), c.is_done(), c.error());
});
