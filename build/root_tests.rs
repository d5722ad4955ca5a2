// Decides whether this crate's root-only tests are built to run or to be ignored.
//
// Sets `cfg(bulkcast_root_tests)` when the build runs as root with `CAP_SYS_ADMIN` (what network
// namespaces and mounts need), or when `BULKCAST_REQUIRE_ROOT=1` asks that a root-only test that
// cannot run fail instead. Without the cfg those tests carry `#[ignore = "needs root ..."]`, so
// `cargo test` lists them as `ignored`, never as passed. `BULKCAST_ROOT_TESTS_WHY` names the
// reason for the failure message of a test that was built to run and cannot.
//
// Shared by `crates/lab/build.rs` and `crates/cli/build.rs` (both `include!` it).

use std::env;
use std::fs;

/// `CAP_SYS_ADMIN`'s bit in the capability sets of `/proc/self/status`.
const CAP_SYS_ADMIN: u32 = 21;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(bulkcast_root_tests)");
    println!("cargo::rerun-if-env-changed=BULKCAST_REQUIRE_ROOT");
    // Cargo re-runs a build script only on what it names. `sudo` and `su` set USER, so a build as
    // root after one as a user (or the other way round) decides again; otherwise it is kept.
    println!("cargo::rerun-if-env-changed=USER");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../../build/root_tests.rs");
    let why = if env::var("BULKCAST_REQUIRE_ROOT").as_deref() == Ok("1") {
        Some("BULKCAST_REQUIRE_ROOT=1 was set when it was built")
    } else if root_with_sys_admin() {
        Some("it was built as root with CAP_SYS_ADMIN")
    } else {
        None
    };
    if let Some(why) = why {
        println!("cargo::rustc-cfg=bulkcast_root_tests");
        println!("cargo::rustc-env=BULKCAST_ROOT_TESTS_WHY={why}");
    }
}

/// Whether this process's effective uid is 0 and its effective capabilities hold
/// `CAP_SYS_ADMIN` (root in an unprivileged container lacks it), from `/proc/self/status`.
fn root_with_sys_admin() -> bool {
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    // "Uid:" lists the real, effective, saved and file-system uids.
    let euid_is_0 = field("Uid:").get(1) == Some(&"0");
    let sys_admin = field("CapEff:")
        .first()
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0);
    euid_is_0 && sys_admin
}
