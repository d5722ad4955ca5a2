//! Any bytes on the multicast side: a control message from the source's connection decodes
//! without panicking and encodes back to itself; a run of datagrams from the group (the input
//! cut at length bytes), with control messages between them, never panics a receiver, sealed
//! or in clear.
#![no_main]

use bulkcast_proto::mcast::receiver::{Receiver, ReceiverConfig};
use bulkcast_proto::mcast::seal::GroupKey;
use bulkcast_proto::mcast::{Layout, McastMsg};
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = McastMsg::decode(&mut Bytes::copy_from_slice(data)) {
        let mut out = BytesMut::new();
        m.encode(&mut out);
        let back = McastMsg::decode(&mut out.freeze()).expect("a message we encoded decodes");
        assert_eq!(back, m);
    }
    let Ok(layout) = Layout::new(40_000, 64, 8, 4) else {
        return;
    };
    let cfg = ReceiverConfig {
        max_held: 16 << 10,
        ..ReceiverConfig::default()
    };
    let clear = Receiver::new(layout.clone(), 7, None, cfg.clone());
    let sealed = Receiver::new(layout, 7, Some(GroupKey::from_bytes([3; 32]).cipher()), cfg);
    for mut r in [clear, sealed] {
        feed(&mut r, data);
    }
});

/// Feeds `data` to `r`: a length byte, then that many bytes as a datagram (or, with the top
/// bit set, as a control message), until the input runs out.
fn feed(r: &mut Receiver, mut data: &[u8]) {
    let mut now = 0;
    while let Some((&n, rest)) = data.split_first() {
        let len = usize::from(n & 0x7f) * 12;
        let take = len.min(rest.len());
        let (piece, rest) = rest.split_at(take);
        data = rest;
        now += 1_000;
        if n & 0x80 == 0 {
            r.handle_datagram(now, &mut piece.to_vec());
        } else if let Ok(m) = McastMsg::decode(&mut Bytes::copy_from_slice(piece)) {
            r.handle_msg(now, m);
        }
        r.handle_timeout(now);
        while r.poll_msg().is_some() {}
        while r.poll_event().is_some() {}
    }
}
