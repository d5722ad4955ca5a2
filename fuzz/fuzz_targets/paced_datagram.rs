//! Any datagram to a paced listener: parsed or refused, never a panic.
#![no_main]

use bulkcast_proto::paced::packet;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let id = packet::conn_id(data);
    if let Ok((conn, _)) = packet::decode(data) {
        assert_eq!(Some(conn), id);
    }
});
