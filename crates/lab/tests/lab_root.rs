//! Lab tests on real namespaces: they need root with `CAP_SYS_ADMIN`, `ip`, `/dev/net/tun` and
//! iperf3. All tests of this binary take one lock, so they run one after another (and each lab
//! also takes its own flock under /run/bclab).
//!
//! Whether they run is fixed when the test binary is built (`build.rs` sets
//! `cfg(bulkcast_root_tests)`), since libtest cannot ignore a test at run time:
//! - built as root with `CAP_SYS_ADMIN`, or with `BULKCAST_REQUIRE_ROOT=1` (CI sets it): they run.
//!   Where the lab cannot run after all (`bulkcast_lab::preflight` fails: not root at run time, no
//!   `/dev/net/tun`, namespaces refused), each fails with the reason; none passes without running.
//! - built otherwise (no root, or root without `CAP_SYS_ADMIN` as in an unprivileged container):
//!   each is marked `ignored` with the reason in cargo test's summary, never `ok`. `-- --ignored`
//!   runs them anyway, and they fail where the lab cannot run.

use std::io::Write as _;
use std::process::Command;
use std::sync::Mutex;

use bulkcast_lab::check::{check, CheckOptions};
use bulkcast_lab::{Lab, LabOptions, Scenario};

static SERIAL: Mutex<()> = Mutex::new(());

/// Fails `test` with the reason when the lab cannot run here (module doc).
fn require_lab(test: &str) {
    if let Err(e) = bulkcast_lab::preflight() {
        root_test_cannot_run(test, &e.to_string());
    }
}

#[path = "support/root.rs"]
mod root;
use root::root_test_cannot_run;

/// Whether this host keeps time well enough to judge the emulator's timing at all (see
/// `check::host_timer_lateness`): at most 1% of 1 ms sleeps more than 1 ms late. Where it does
/// not, a timing test says so and judges nothing; everything else still runs.
fn host_keeps_time(test: &str) -> bool {
    let (late, worst) = bulkcast_lab::check::host_timer_lateness(2000);
    eprintln!(
        "{test}: host timer check: {:.1}% of 1 ms sleeps more than 1 ms late (worst {worst:.2} ms)",
        late * 100.0
    );
    if late > 0.01 {
        eprintln!(
            "NOT JUDGED {test}: this host overruns its timers (the emulator's delays and rates \
             would be the host's)"
        );
        return false;
    }
    true
}

/// Writes `line` to stderr past the test harness's capture (which only takes `eprintln!`), so a
/// verdict that passes without judging is seen in CI's log, not only with `--nocapture`.
fn uncaptured(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn require_iperf3() {
    assert!(
        Command::new("iperf3").arg("--version").output().is_ok(),
        "iperf3 is required for the lab tests (apt-get install -y iperf3)"
    );
}

/// A lab name of this test process: two test runs at once (or this binary and another) each
/// bring up, and clean up, labs of their own.
fn lab_name(tag: &str) -> String {
    format!("t-{tag}-{}", std::process::id())
}

fn netns_list() -> String {
    String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

/// The issue's targets: RTT within 1 ms (or 2%) at 10-250 ms, one bbr stream >= 90% of a
/// 100 Mbit/s, 100 ms path, UDP loss within 15% of the configured rate, no TUN drops; and the
/// cubic/bbr contrast on the lossy paths.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn fidelity() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("fidelity");
    if !host_keeps_time("fidelity") {
        return;
    }
    require_iperf3();
    let sc = Scenario::parse(
        r#"
        name = "fidelity"
        [[site]]
        name = "a"
        hosts = 1
        [[site]]
        name = "b"
        hosts = 1
        [[site]]
        name = "c"
        hosts = 1
        [[site]]
        name = "d"
        hosts = 1
        [[site]]
        name = "e"
        hosts = 1
        [[path]]
        from = "a"
        to = "b"
        rate_mbps = 100
        rtt_ms = 100
        [[path]]
        from = "a"
        to = "c"
        rate_mbps = 100
        rtt_ms = 100
        loss = 0.01
        [[path]]
        from = "a"
        to = "d"
        rate_mbps = 50
        rtt_ms = 250
        loss = 0.02
        [[path]]
        from = "a"
        to = "e"
        rate_mbps = 200
        rtt_ms = 10
        [default_path]
        rtt_ms = 1
    "#,
    )
    .unwrap();
    let name = lab_name("fidelity");
    let lab = Lab::up_with(
        &sc,
        &LabOptions {
            name: Some(name.clone()),
        },
    )
    .unwrap();
    let opts = CheckOptions {
        tcp_s: 6,
        omit_s: 2,
        // 2% over 30000 packets: 600 expected losses, so 15% is about 3.7 standard deviations.
        udp_packets: 30_000,
        max_paths: 4,
        // A path is measured again only when it missed while the forwarder ran late (other
        // load on the machine, or the host): on 2026-11-23 a 2-core VM stalled through four
        // attempts in a row, so up to five more. A path whose every attempt missed while the
        // host itself stalled (check's host probe) is NOT JUDGED instead of failed.
        retries: 5,
        ..Default::default()
    };
    let report = check(&lab, &opts, |m| eprintln!("{m}")).unwrap();
    let table = report.render();
    eprintln!("{table}");
    assert_eq!(report.paths.len(), 4, "{table}");
    for l in report.not_judged() {
        uncaptured(&format!("NOT JUDGED fidelity: {l}"));
    }
    let failures = report.failures();
    assert!(failures.is_empty(), "fidelity targets missed:\n{table}");
    // 1% loss at 100 ms: cubic collapses, bbr keeps far more of the rate. The contrast is one
    // of `check`'s targets (`Target::Contrast`), so it is in `failures` above, measured again
    // when the forwarder or the host stalled, and not judged when the host stalled throughout;
    // here only that the path carried both figures.
    let lossy = &report.paths[1];
    assert!((lossy.loss_cfg - 0.01).abs() < 1e-9, "{table}");
    assert!(
        lossy.tcp_mbps("cubic").is_some() && lossy.tcp_mbps("bbr").is_some(),
        "{table}"
    );
    assert_eq!(report.tx_dropped, 0, "{table}");
    lab.down().unwrap();
    assert!(!netns_list().contains(&format!("bclab-{name}.")));
}

/// The two-way TCP bound's measurement: every WAN path loaded at once, one way out of the
/// source's site and both ways between the others, each direction's goodput read back; the
/// bound over those goodputs sits below the bound over the links' rates by at least TCP's
/// header share.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn tcp_mesh_loads_every_link_as_a_broadcast_does() {
    use bulkcast_lab::mesh::{cluster_topology, tcp_mesh, MeshOptions};
    use bulkcast_proto::swarm::sim::broadcast_bound;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("tcp_mesh_loads_every_link_as_a_broadcast_does");
    require_iperf3();
    let sc = Scenario::parse(
        r#"
        name = "mesh"
        source = "a-1"
        [[site]]
        name = "a"
        hosts = 1
        [[site]]
        name = "b"
        hosts = 2
        [[site]]
        name = "c"
        hosts = 1
        [[path]]
        from = "a"
        to = "b"
        rate_mbps = 20
        rtt_ms = 20
        [[path]]
        from = "a"
        to = "c"
        rate_mbps = 10
        rtt_ms = 20
        [[path]]
        from = "b"
        to = "c"
        rate_mbps = 20
        rtt_ms = 20
    "#,
    )
    .unwrap();
    let name = lab_name("mesh");
    let lab = Lab::up_with(
        &sc,
        &LabOptions {
            name: Some(name.clone()),
        },
    )
    .unwrap();
    let opts = MeshOptions {
        secs: 5,
        omit_s: 1,
        ..Default::default()
    };
    let report = tcp_mesh(&lab, &opts).unwrap();
    let layout = lab.layout().clone();
    lab.down().unwrap();
    assert!(!netns_list().contains(&format!("bclab-{name}.")));
    eprintln!("{report:?}");
    let dirs: Vec<_> = report
        .links
        .iter()
        .map(|l| (l.from.as_str(), l.to.as_str(), l.two_way))
        .collect();
    assert_eq!(
        dirs,
        [
            ("a", "b", false),
            ("a", "c", false),
            ("b", "c", true),
            ("c", "b", true)
        ]
    );
    for l in &report.links {
        let rate = l.rate_mbps.expect("every path has a rate");
        // Payload can never pass 1448/1500 of the IP rate; below half, the mesh measured the
        // machine (or nothing), not TCP.
        let share = l.mbps / rate;
        if report.host_stalled() && share < 0.5 {
            uncaptured(&format!("NOT JUDGED tcp_mesh: the host stalled ({l:?})"));
            continue;
        }
        assert!((0.5..=0.97).contains(&share), "{l:?}");
    }
    let rate = |x: usize, y: usize| {
        layout.site_links[x][y]
            .and_then(|l| layout.links[l].rate_bps)
            .map_or(0.0, |r| r / 8.0)
    };
    let tcp = report.bound(&layout);
    let ip = broadcast_bound(&cluster_topology(&layout, rate).1);
    // The links' bound (paths carry both ways): c takes 10 from a and 20 through b, b takes
    // 20 from a and 10 through c: 30 Mbit/s.
    assert!((ip * 8.0 / 1e6 - 30.0).abs() < 1e-6, "{ip}");
    assert!(tcp > 0.5 * ip && tcp <= 0.97 * ip, "tcp {tcp} ip {ip}");
}

/// Up, LAN and WAN reachability, hosts file, channels, exec, teardown on drop, and removal of a
/// stale lab left by a crash.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn lifecycle_and_stale_cleanup() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("lifecycle_and_stale_cleanup");
    let name = &lab_name("life");
    // A crashed lab: a namespace and a state dir whose owner is gone.
    let _ = Lab::remove(name);
    let ghost = format!("bclab-{name}.h.ghost");
    assert!(Command::new("ip")
        .args(["netns", "add", &ghost])
        .status()
        .unwrap()
        .success());
    std::fs::create_dir_all(format!("/run/bclab/{name}")).unwrap();
    std::fs::write(format!("/run/bclab/{name}/owner"), "999999999").unwrap();

    let sc = Scenario::parse(
        r#"
        [[site]]
        name = "x"
        hosts = 2
        uplink_mbps = 50
        [[site]]
        name = "y"
        hosts = 1
        [[path]]
        from = "x"
        to = "y"
        rtt_ms = 20
        [[channel]]
        name = "fast"
        from = "x-1"
        to = "y-1"
        rate_mbps = 30
        rtt_ms = 40
    "#,
    )
    .unwrap();
    let lab = Lab::up_with(
        &sc,
        &LabOptions {
            name: Some(name.clone()),
        },
    )
    .unwrap();
    let list = netns_list();
    assert!(
        !list.contains(&ghost),
        "stale namespace was not removed: {list}"
    );
    for h in ["x-1", "x-2", "y-1"] {
        assert!(list.contains(&format!("bclab-{name}.h.{h}")), "{list}");
    }
    // The hosts file parses and describes the lab.
    let hosts = bulkcast_proto::hosts::HostsFile::parse_toml(
        &std::fs::read_to_string(lab.hosts_file()).unwrap(),
    )
    .unwrap();
    assert_eq!(hosts.source.as_ref().unwrap().name, "x-1");
    assert_eq!(hosts.hosts.len(), 2);
    let y1 = hosts.hosts.iter().find(|h| h.name == "y-1").unwrap();
    assert_eq!(y1.paths.len(), 1, "channel address listed as an extra path");
    assert_eq!(hosts.hosts[0].uplink_mbps, Some(50.0));
    // Which way packets go (precision is the fidelity test's job; this test only needs the
    // three routes told apart, also on a busy machine): same site over the LAN (no added
    // delay), across sites over the WAN (20 ms), and the
    // channel (40 ms).
    let ns = |h: &str| lab.netns(h).unwrap();
    let (lan, _) = bulkcast_lab::check::measure_rtt(
        &ns("x-1"),
        &ns("x-2"),
        lab.addr("x-1").unwrap(),
        lab.addr("x-2").unwrap(),
        10,
    )
    .unwrap();
    assert!(lan < 5.0, "LAN RTT {lan} ms");
    let (wan, _) = bulkcast_lab::check::measure_rtt(
        &ns("x-2"),
        &ns("y-1"),
        lab.addr("x-2").unwrap(),
        lab.addr("y-1").unwrap(),
        10,
    )
    .unwrap();
    assert!((20.0..25.0).contains(&wan), "WAN RTT {wan} ms");
    let (mine, peer) = lab.channel_addrs("x-1").unwrap()[0];
    let (ch, _) = bulkcast_lab::check::measure_rtt(&ns("x-1"), &ns("y-1"), mine, peer, 10).unwrap();
    assert!((40.0..45.0).contains(&ch), "channel RTT {ch} ms");
    // exec runs inside the host's namespace.
    let out = lab
        .exec("y-1", &["ip", "-o", "-4", "addr", "show", "dev", "lan0"])
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(&lab.addr("y-1").unwrap().to_string()));
    // A process left running in a host is killed at teardown.
    let mut sleeper = lab.spawn("x-2", &["sleep", "600"]).unwrap();
    assert!(lab.tx_dropped().unwrap().iter().all(|(_, d)| *d == 0));
    drop(lab);
    assert!(
        !netns_list().contains(&format!("bclab-{name}.")),
        "namespaces left after drop"
    );
    assert!(!std::path::Path::new(&format!("/run/bclab/{name}")).exists());
    let st = sleeper.wait().unwrap();
    assert!(!st.success(), "the sleeper was killed");
}

/// A step change on the scenario clock shows in a real transfer: one bbr stream gets the first
/// rate before the change and the second after it.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn step_change_applies_on_time() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("step_change_applies_on_time");
    if !host_keeps_time("step_change_applies_on_time") {
        return;
    }
    require_iperf3();
    let sc = Scenario::parse(
        r#"
        [[site]]
        name = "p"
        hosts = 1
        [[site]]
        name = "q"
        hosts = 1
        [[path]]
        from = "p"
        to = "q"
        rate_mbps = 50
        rtt_ms = 10
        [[change]]
        at_s = 3
        from = "p"
        to = "q"
        rate_mbps = 10
    "#,
    )
    .unwrap();
    // Each attempt brings a new lab up: the step is at 3 s of its scenario clock.
    let up = || {
        Lab::up_with(
            &sc,
            &LabOptions {
                name: Some(lab_name("step")),
            },
        )
        .unwrap()
    };
    let mut lab = up();
    // One bbr stream for 6 s from the clock's start, per-second Mbit/s.
    let measure = |lab: &Lab| -> Vec<f64> {
        let mut server = lab
            .command("q-1", "iperf3")
            .unwrap()
            .args(["-s", "-1", "-p", "5301"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        lab.start_clock();
        let out = lab
            .exec(
                "p-1",
                &[
                    "iperf3",
                    "-c",
                    &lab.addr("q-1").unwrap().to_string(),
                    "-p",
                    "5301",
                    "-t",
                    "6",
                    "-C",
                    "bbr",
                    "-J",
                ],
            )
            .unwrap();
        let _ = server.wait();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["intervals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap() / 1e6)
            .collect()
    };
    // Before the change the path is not yet at 10 Mbit/s: some second of the first three well
    // above it, the second and third not above the nominal 50 (how close to 50 is the fidelity
    // test's job; a host that stalls the forwarder halves a second here and there, seen on
    // 2026-11-23). The first second may read above 50: iperf3's sender counts what it wrote,
    // its socket buffer and the path's queue filling too (55.4-56.1 in three runs on a fresh
    // VM, 2026-11-29). Seconds 4-6: 10 Mbit/s (the sender-side figure lags by what the queue
    // holds, so look well after the change).
    let on_time = |m: &[f64]| {
        let before = m[..3].iter().copied().fold(0.0, f64::max);
        let settled = m[1..3].iter().copied().fold(0.0, f64::max);
        before > 25.0 && settled < 55.0 && m[4] < 13.0 && m[5] < 13.0
    };
    let mut mbps = measure(&lab);
    // Measured again (on a fresh clock) only when it missed while the forwarder was stalled
    // (other load, or the host: seen on 2026-11-23, 25 Mbit/s in the second second).
    for _ in 0..2 {
        let late = lab.stats().late_events;
        if on_time(&mbps) || late == 0 {
            break;
        }
        eprintln!("missed while the forwarder was stalled ({late} events >1 ms late): {mbps:?}");
        drop(lab);
        std::thread::sleep(std::time::Duration::from_secs(5));
        lab = up();
        mbps = measure(&lab);
    }
    assert!(on_time(&mbps), "{mbps:?}");
    assert_eq!(
        lab.tx_dropped()
            .unwrap()
            .iter()
            .map(|(_, d)| d)
            .sum::<u64>(),
        0
    );
}

/// `lab run` (the CLI path): the command sees the lab's hosts file, its exit code comes back,
/// and the lab is gone afterwards.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn cli_run_passes_exit_code_and_cleans_up() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_lab("cli_run_passes_exit_code_and_cleans_up");
    let dir = std::env::temp_dir().join(format!("bclab-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.toml");
    let name = lab_name("cli");
    std::fs::write(
        &path,
        format!("name = \"{name}\"\n[[site]]\nname = \"m\"\nhosts = 2\n"),
    )
    .unwrap();
    let code = bulkcast_lab::run(bulkcast_lab::LabCommand::Run {
        scenario: path.clone(),
        name: None,
        host: None,
        command: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "grep -q 'name = \"m-2\"' \"$BULKCAST_LAB_HOSTS\" && ip netns list | grep -qF bclab-{name}.h.m-1 && exit 7"
            ),
        ],
    })
    .unwrap();
    assert_eq!(code, 7);
    assert!(!netns_list().contains(&format!("bclab-{name}.")));
    let code = bulkcast_lab::run(bulkcast_lab::LabCommand::Run {
        scenario: path,
        name: None,
        host: Some("m-2".into()),
        command: vec![
            "sh".into(),
            "-c".into(),
            "ip -o addr show dev lan0 | grep -q 10.77.1.11".into(),
        ],
    })
    .unwrap();
    assert_eq!(code, 0, "the command ran inside m-2");
    let _ = std::fs::remove_dir_all(&dir);
}
