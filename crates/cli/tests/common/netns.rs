//! Network namespaces for the root tests, and the binary run inside one.

use std::process::Command;

use super::root_test_cannot_run;

/// A network namespace with its loopback up, deleted on drop.
pub struct Netns(pub String);

impl Netns {
    /// Makes namespace `tag` for this test process; without the rights to, the test `what`
    /// cannot run (ignored, or failed under `BULKCAST_REQUIRE_ROOT=1`).
    pub fn new(tag: &str, what: &str) -> Netns {
        let name = format!("bc-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        let made = Command::new("ip").args(["netns", "add", &name]).status();
        if !made.is_ok_and(|s| s.success()) {
            root_test_cannot_run(what, "cannot create a network namespace");
        }
        let ns = Netns(name);
        assert!(ns.run(&["ip", "link", "set", "lo", "up"]));
        ns
    }

    /// Runs `args` inside the namespace; true if it succeeded.
    pub fn run(&self, args: &[&str]) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// The binary, inside network namespace `ns` if given.
pub fn bin_in(ns: Option<&str>) -> Command {
    let bin = env!("CARGO_BIN_EXE_bulkcast");
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin]);
            c
        }
        None => Command::new(bin),
    }
}
