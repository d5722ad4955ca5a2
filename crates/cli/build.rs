//! Decides whether this crate's root-only tests are built to run or to be ignored: see
//! `build/root_tests.rs` at the repository's root, which the lab and the CLI share. Likewise
//! for the live page's browser test: `cfg(bulkcast_chromium)` when a `chromium` is installed
//! (Debian's package) or `BULKCAST_REQUIRE_CHROMIUM=1` asks that the test fail without one.
//! Without it the test is `ignored` with the reason; after installing chromium, rebuild with
//! `BULKCAST_REQUIRE_CHROMIUM=1` (or touch this file) so the test is built to run. The same
//! for `cfg(bulkcast_sshd)` (Debian's `openssh-server`, `BULKCAST_REQUIRE_SSHD=1`).

mod root {
    include!("../../build/root_tests.rs");

    pub fn decide() {
        main()
    }
}

const CHROMIUM: &str = "/usr/bin/chromium";
const SSHD: &str = "/usr/sbin/sshd";

fn main() {
    root::decide();
    println!("cargo::rustc-check-cfg=cfg(bulkcast_chromium)");
    println!("cargo::rerun-if-env-changed=BULKCAST_REQUIRE_CHROMIUM");
    if std::env::var("BULKCAST_REQUIRE_CHROMIUM").as_deref() == Ok("1")
        || std::path::Path::new(CHROMIUM).exists()
    {
        println!("cargo::rustc-cfg=bulkcast_chromium");
        println!("cargo::rustc-env=BULKCAST_CHROMIUM={CHROMIUM}");
    }
    // Likewise the `--ssh` launcher's test, which runs a throwaway sshd on loopback.
    println!("cargo::rustc-check-cfg=cfg(bulkcast_sshd)");
    println!("cargo::rerun-if-env-changed=BULKCAST_REQUIRE_SSHD");
    if std::env::var("BULKCAST_REQUIRE_SSHD").as_deref() == Ok("1")
        || std::path::Path::new(SSHD).exists()
    {
        println!("cargo::rustc-cfg=bulkcast_sshd");
        println!("cargo::rustc-env=BULKCAST_SSHD={SSHD}");
    }
}
