//! Running the `bulkcast` binary on loopback for the tests: agents on ephemeral ports, and
//! `bulkcast send` with its JSON report.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use super::{first_line, listen_addrs, spawn_agent, Agent};

pub const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");

/// An agent on an ephemeral loopback port.
pub fn agent(dir: &Path, secret: &str) -> Agent {
    agent_on(dir, secret, &["127.0.0.1:0"])
}

/// An agent listening on every address of `listen`; `addr` is the first.
pub fn agent_on(dir: &Path, secret: &str, listen: &[&str]) -> Agent {
    agent_with(dir, secret, listen, &[])
}

/// [`agent_on`] with further options.
pub fn agent_with(dir: &Path, secret: &str, listen: &[&str], extra: &[&str]) -> Agent {
    spawn_agent(dir, listen, |c| {
        c.args(extra)
            .env("BULKCAST_SECRET", secret)
            .stderr(Stdio::piped());
    })
}

/// The address an agent says it listens on (the first line of its stdout).
pub fn listen_addr(agent: &mut Child) -> String {
    listen_addrs(&first_line(agent.stdout.as_mut().unwrap()))[0].clone()
}

pub fn agents(root: &Path, n: usize, secret: &str) -> Vec<Agent> {
    (0..n)
        .map(|i| agent(&root.join(format!("r{i}")), secret))
        .collect()
}

pub fn to_list(agents: &[Agent]) -> String {
    agents
        .iter()
        .map(|a| a.addr.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

pub fn send(args: &[&str], secret: &str, stdin: Option<&Path>) -> Output {
    let mut c = Command::new(BIN);
    c.arg("send")
        .args(args)
        .args(["--json", "--quiet"])
        .env("BULKCAST_SECRET", secret)
        // Probe caches of tests stay out of the user's home (keyed by the agents' random ports).
        .env(
            "XDG_CACHE_HOME",
            std::env::temp_dir().join("bulkcast-it-cache"),
        );
    if let Some(p) = stdin {
        c.stdin(std::fs::File::open(p).unwrap());
    }
    c.output().unwrap()
}

pub fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The report of a send that succeeded, every receiver included.
pub fn report_ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(out);
    assert_eq!(r["ok"], true, "{r}");
    r
}

pub fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
