//! `bulkcast send` across emulated WANs (the lab): real RTTs and access-link rates. Needs root
//! with `CAP_SYS_ADMIN` and network namespaces.
//!
//! Whether they run is fixed when the test binary is built (`build.rs` sets
//! `cfg(bulkcast_root_tests)`), since libtest cannot ignore a test at run time:
//! - built as root with `CAP_SYS_ADMIN`, or with `BULKCAST_REQUIRE_ROOT=1` (CI sets it): they run.
//!   Where the lab cannot run after all (`bulkcast_lab::preflight` fails: not root at run time, no
//!   `/dev/net/tun`, namespaces refused), each fails with the reason; none passes without running.
//! - built otherwise (no root, or root without `CAP_SYS_ADMIN` as in an unprivileged container):
//!   each is marked `ignored` with the reason in cargo test's summary, never `ok`. `-- --ignored`
//!   runs them anyway, and they fail where the lab cannot run.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bulkcast_lab::{Lab, Scenario};

mod common;
use common::{hash, root_test_cannot_run, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
static SERIAL: Mutex<()> = Mutex::new(());

/// Fails `test` with the reason when the lab cannot run here (module doc).
fn require_lab(test: &str) {
    if let Err(e) = bulkcast_lab::preflight() {
        root_test_cannot_run(test, &e.to_string());
    }
}

struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts an agent in every receiving host, sends `len` bytes from the source with `args`,
/// and checks every copy. Returns the JSON report.
fn send_across(scenario: &str, len: usize, args: &[&str]) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sc = Scenario::load(&root.join("scenarios").join(scenario)).unwrap();
    let lab = Lab::up(&sc).unwrap();
    let scratch = Scratch::new("labtest");
    let work = &scratch.0;
    let secret = "5a".repeat(32);
    let hosts = lab.hosts_spec();
    let mut agents = Agents(Vec::new());
    for h in &hosts.hosts {
        let dir = work.join(&h.name);
        let child = lab
            .command(&h.name, BIN)
            .unwrap()
            .args(["agent", "--once", "--listen", &h.addr, "--dir"])
            .arg(&dir)
            .env("BULKCAST_SECRET", &secret)
            .env("BULKCAST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        agents.0.push(child);
    }
    std::thread::sleep(Duration::from_millis(500));
    let object = work.join("object.bin");
    let mut xof = blake3::Hasher::new().update(b"lab").finalize_xof();
    let mut data = vec![0u8; len];
    xof.fill(&mut data);
    std::fs::write(&object, &data).unwrap();
    let started = Instant::now();
    let out = lab
        .command(lab.source(), BIN)
        .unwrap()
        .arg("send")
        .arg(&object)
        .arg("--to")
        .arg(lab.hosts_file())
        .args(args)
        .args(["--json", "--quiet"])
        .env("BULKCAST_SECRET", &secret)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "send failed after {:?}: {stderr}",
        started.elapsed()
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = hash(&object);
    for h in &hosts.hosts {
        assert_eq!(
            hash(&work.join(&h.name).join("object.bin")),
            want,
            "copy at {}",
            h.name
        );
    }
    let drops = lab.tx_dropped().unwrap();
    assert!(
        drops.iter().all(|d| d.1 == 0),
        "lab overloaded (TUN TX drops): {drops:?}"
    );
    drop(agents);
    drop(lab);
    drop(scratch);
    eprintln!("{scenario} {args:?}: {} s, {stderr}", report["seconds"]);
    report
}

#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn send_across_a_star_of_8() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("send_across_a_star_of_8");
    // The planned tree: probe, plan (capacities known from the lab's hosts file), relay. (The
    // default, `auto`, would swarm here: every host is a site of its own.)
    let r = send_across("star-8.toml", 8 << 20, &["--strategy", "tree"]);
    assert_eq!(r["ok"], true);
    assert_eq!(r["receivers"].as_array().unwrap().len(), 8);
    assert!(
        r["strategy"].as_str().unwrap().starts_with("tree (planned"),
        "{r}"
    );
    // On equal access links the planned tree must not split the source's uplink 8 ways: every
    // receiver gets well over the flat share (100/8 Mbit/s).
    let slowest = r["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["rate_mbps"].as_f64().unwrap())
        .fold(f64::MAX, f64::min);
    assert!(slowest > 40.0, "slowest receiver at {slowest} Mbit/s: {r}");
}

#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn send_across_the_seed_000_regions() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("send_across_the_seed_000_regions");
    // The default, `auto`: five regions and 4 MiB, so the hybrid swarm.
    let r = send_across("seed000-aws5.toml", 4 << 20, &[]);
    assert_eq!(r["ok"], true);
    assert_eq!(r["strategy"], "hybrid", "{r}");
    assert_eq!(r["receivers"].as_array().unwrap().len(), 14);
}

#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn the_labs_matrix_gives_the_planner_the_wan_capacities() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("the_labs_matrix_gives_the_planner_the_wan_capacities");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sc = Scenario::load(&root.join("scenarios/seed004-4x4-fast.toml")).unwrap();
    let lab = Lab::up(&sc).unwrap();
    let scratch = Scratch::new("labplan");
    let out = std::process::Command::new(BIN)
        .args(["plan", "--algo", "balanced", "--size-mib", "64", "--hosts"])
        .arg(lab.hosts_file())
        .arg("--matrix")
        .arg(lab.matrix_file())
        .arg("--out")
        .arg(scratch.0.join("plan"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The scenario's WAN links out of cluster A add up to 32 + 24 + 24 = 80 Mbit/s.
    assert!(text.contains("bound: 80.0 Mbit/s (LP optimum)"), "{text}");
    assert!(
        text.contains("plan: balanced -- predicted 80.0 Mbit/s"),
        "{text}"
    );
}
