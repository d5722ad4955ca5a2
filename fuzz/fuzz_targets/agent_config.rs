//! An agent's security configuration files: its key file and its allow list, and a session
//! secret. Parsed or refused; what parses prints back to the same key.
#![no_main]

use bulkcast_proto::auth::Secret;
use bulkcast_proto::identity::{AllowList, HostKey, PublicKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(k) = HostKey::from_hex(text) {
        assert_eq!(HostKey::from_hex(&k.to_hex()).unwrap().public(), k.public());
    }
    if let Ok(p) = PublicKey::from_hex(text) {
        assert_eq!(PublicKey::from_hex(&p.to_string()), Ok(p));
    }
    if let Ok(s) = Secret::from_hex(text) {
        assert_eq!(Secret::from_hex(&s.to_hex()), Ok(s));
    }
    if let Ok(list) = AllowList::parse(text) {
        assert!(list.len() <= text.lines().count());
    }
});
