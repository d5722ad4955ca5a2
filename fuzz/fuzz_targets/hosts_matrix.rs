//! Any hosts file (TOML or a comma list) and any matrix file: parsed or refused with an error.
#![no_main]

use bulkcast_planner::matrix::MatrixFile;
use bulkcast_proto::hosts::HostsFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(h) = HostsFile::parse_toml(text) {
        // What we write back parses again.
        let again = HostsFile::parse_toml(&h.to_toml()).expect("to_toml parses");
        assert_eq!(again.hosts.len(), h.hosts.len());
    }
    let _ = HostsFile::parse_list(text);
    let _ = MatrixFile::parse_toml(text);
});
