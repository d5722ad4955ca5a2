//! Any bytes a feed peer sends, on its connection (a frame body) or to the group (a datagram):
//! decoding never panics, every message that decodes encodes back to itself, and a run of
//! datagrams from the group (the input cut at length bytes), with connection messages between
//! them, never panics a subscriber, sealed or in clear.
#![no_main]

use std::sync::Arc;

use bulkcast_proto::auth::Secret;
use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::product::{SecretAuth, Subscription};
use bulkcast_proto::feed::receiver::{Receiver, ReceiverConfig, RxEvent};
use bulkcast_proto::feed::seal::{DgramReader, DgramWriter};
use bulkcast_proto::mcast::seal::GroupKey;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

/// The feed id of the seeds' datagrams (`examples/seeds.rs`).
const FEED: u64 = 11;
/// Their group key, when sealed.
const KEY: [u8; 32] = [3; 32];

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        round_trip(&m);
    }
    for key in [None, Some(GroupKey::from_bytes(KEY))] {
        let cipher = key.as_ref().map(GroupKey::cipher);
        if let Ok(m) = DgramReader::new(FEED, cipher.clone()).read(&mut data.to_vec()) {
            let mut d = Vec::new();
            DgramWriter::new(FEED, cipher.clone()).write(&m, &mut d);
            let back = DgramReader::new(FEED, cipher).read(&mut d);
            assert_eq!(back.expect("a datagram we wrote reads"), m);
        }
        run(key, data);
    }
});

fn round_trip(m: &Msg) {
    let mut out = BytesMut::new();
    m.encode(&mut out);
    assert_eq!(&Msg::decode(&out).expect("a message we encoded decodes"), m);
}

/// Feeds `data` to a multicast subscriber whose group is sealed under `key` (or in clear): a
/// length byte, then that many bytes as a datagram (or, with the top bit set, as a message
/// on its connection), until the input runs out.
fn run(key: Option<GroupKey>, mut data: &[u8]) {
    let auth = Arc::new(SecretAuth::new(&Secret::from_bytes([3; 32])));
    let sub = Subscription::parse("ANY", "").expect("a valid pattern");
    let accepted = Msg::Accepted {
        feed_id: FEED,
        group: "239.255.0.1:7000".into(),
        block: 64,
        mcast_from: 1,
        first: 1,
        key: key.clone(),
    };
    let reader = DgramReader::new(FEED, key.as_ref().map(GroupKey::cipher));
    let Some(mut rx) = Receiver::new(ReceiverConfig::default(), auth, sub, &accepted, 0) else {
        return;
    };
    let mut now = 0;
    while let Some((&n, rest)) = data.split_first() {
        let take = usize::from(n & 0x7f).min(rest.len());
        let (piece, rest) = rest.split_at(take);
        data = rest;
        now += 1_000;
        if n & 0x80 == 0 {
            if let Ok((number, m)) = reader.read_numbered(&mut piece.to_vec()) {
                rx.handle_multicast(now, number, m);
            }
        } else if let Ok(m) = Msg::decode(piece) {
            rx.handle_unicast(now, m);
        }
        rx.handle_timeout(now);
        while rx.poll_msg().is_some() {}
        while let Some(ev) = rx.poll_event() {
            if let RxEvent::Complete(seq) = ev {
                rx.confirm(now, seq, false);
            }
        }
    }
}
