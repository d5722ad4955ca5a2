//! Any bytes a feed peer sends, on its connection (a frame body) or to the group (a datagram):
//! decoding never panics, and every message that decodes encodes back to itself.
#![no_main]

use bulkcast_proto::feed::msg::Msg;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Msg::decode(data) {
        round_trip(&m);
    }
    if let Ok((id, m)) = Msg::from_datagram(data) {
        let back = Msg::from_datagram(&m.to_datagram(id)).expect("a datagram we made decodes");
        assert_eq!(back, (id, m));
    }
});

fn round_trip(m: &Msg) {
    let mut out = BytesMut::new();
    m.encode(&mut out);
    assert_eq!(&Msg::decode(&out).expect("a message we encoded decodes"), m);
}
