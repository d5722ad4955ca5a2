//! Any bytes from a peer, as a frame stream: decoding never panics, never allocates past the
//! announced (and limited) length, and every frame that decodes encodes back to itself.
#![no_main]

use bulkcast_proto::wire::{self, Frame, MAX_FRAME};
use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // One body, as `transport::read_frame` hands it over.
    if let Ok(f) = Frame::decode(Bytes::copy_from_slice(data)) {
        round_trip(&f);
    }
    // A stream of frames, as a connection delivers them.
    let mut buf = BytesMut::from(data);
    while let Ok(Some(f)) = wire::decode_from(&mut buf, MAX_FRAME) {
        round_trip(&f);
    }
});

fn round_trip(f: &Frame) {
    let e = f.encode();
    let mut whole = BytesMut::from(&e.head[..]);
    whole.extend_from_slice(&e.data);
    let back = wire::decode_from(&mut whole, MAX_FRAME)
        .expect("a frame we encoded decodes")
        .expect("whole");
    assert_eq!(&back, f);
}
