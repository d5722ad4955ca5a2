//! Any ticket a user pastes: parsed or refused; one that parses prints back to itself.
#![no_main]

use bulkcast_runtime::ticket::Ticket;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = Ticket::parse(text) {
        assert_eq!(Ticket::parse(&t.to_string()), Ok(t));
    }
});
