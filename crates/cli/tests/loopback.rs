//! Real processes on loopback: agents, senders and ticket receivers, as users run them.
//!
//! One test needs root, `full_disk_is_reported_and_leaves_no_file` (it mounts a small tmpfs).
//! Whether it runs is fixed when the test binary is built (`build.rs` sets
//! `cfg(bulkcast_root_tests)`), since libtest cannot ignore a test at run time:
//! - built as root with `CAP_SYS_ADMIN`, or with `BULKCAST_REQUIRE_ROOT=1` (CI sets it): it runs,
//!   and where the mount is refused after all it fails with the reason, never passes without
//!   running;
//! - built otherwise: it is marked `ignored` with the reason in cargo test's summary, never `ok`.
//!   `-- --ignored` runs it anyway, and it fails where the mount is refused.
//!
//! Every other test here needs no root.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{
    first_line, hash, listen_addrs, make_file, root_test_cannot_run, secret, spawn_agent, Agent,
    Scratch,
};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// An agent on an ephemeral loopback port.
fn agent(dir: &Path, secret: &str) -> Agent {
    agent_on(dir, secret, &["127.0.0.1:0"])
}

/// An agent listening on every address of `listen`; `addr` is the first.
fn agent_on(dir: &Path, secret: &str, listen: &[&str]) -> Agent {
    agent_with(dir, secret, listen, &[])
}

/// [`agent_on`] with further options.
fn agent_with(dir: &Path, secret: &str, listen: &[&str], extra: &[&str]) -> Agent {
    spawn_agent(dir, listen, |c| {
        c.args(extra)
            .env("BULKCAST_SECRET", secret)
            .stderr(Stdio::piped());
    })
}

/// The address an agent says it listens on (the first line of its stdout).
fn listen_addr(agent: &mut Child) -> String {
    listen_addrs(&first_line(agent.stdout.as_mut().unwrap()))[0].clone()
}

fn agents(root: &Path, n: usize, secret: &str) -> Vec<Agent> {
    (0..n)
        .map(|i| agent(&root.join(format!("r{i}")), secret))
        .collect()
}

fn to_list(agents: &[Agent]) -> String {
    agents
        .iter()
        .map(|a| a.addr.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn send(args: &[&str], secret: &str, stdin: Option<&Path>) -> Output {
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

fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The report of a send that succeeded, every receiver included.
fn report_ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(out);
    assert_eq!(r["ok"], true, "{r}");
    r
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn file_of_256_mib_to_8_agents_flat_and_tree() {
    let s = Scratch::new("big");
    let src = s.0.join("weights.bin");
    make_file(&src, 256 * MIB, b"big");
    let want = hash(&src).unwrap();
    let key = secret(1);
    for (strategy, extra) in [("flat", vec![]), ("tree", vec!["--fanout", "2"])] {
        let root = s.0.join(strategy);
        let ags = agents(&root, 8, &key);
        let list = to_list(&ags);
        let mut args = vec![src.to_str().unwrap(), "--to", &list, "--strategy", strategy];
        args.extend(extra);
        let out = send(&args, &key, None);
        let r = report(&out);
        assert!(
            out.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(r["ok"], true);
        assert_eq!(r["object"]["bytes"], 256 * MIB);
        assert_eq!(r["receivers"].as_array().unwrap().len(), 8);
        for a in &ags {
            assert_eq!(
                hash(&a.dir.join("weights.bin")),
                Some(want),
                "{strategy}: copy at {}",
                a.addr
            );
            let mut left = leftovers(&a.dir);
            left.sort();
            // The copy and the record that lets a later send of it move nothing.
            assert_eq!(
                left,
                vec![".weights.bin.bulkcast.done", "weights.bin"],
                "temporary files left"
            );
        }
        if strategy == "tree" {
            // Fan-out 2: two receivers hang off the source, the rest off receivers.
            let from_source = r["edges"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["from"] == "source")
                .count();
            assert_eq!(from_source, 2);
        }
    }
}

#[test]
fn stdin_stream_of_unknown_size_through_a_tree_of_8() {
    let s = Scratch::new("stream");
    let src = s.0.join("input");
    make_file(&src, 40 * MIB + 12_345, b"stream");
    let key = secret(2);
    let ags = agents(&s.0, 8, &key);
    let list = to_list(&ags);
    let out = send(
        &[
            "-",
            "--name",
            "feed.bin",
            "--to",
            &list,
            "--fanout",
            "3",
            "--chunk-kib",
            "256",
        ],
        &key,
        Some(&src),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    assert_eq!(r["object"]["kind"], "stream");
    assert_eq!(r["object"]["bytes"], 40 * MIB + 12_345);
    let want = hash(&src);
    for a in &ags {
        assert_eq!(hash(&a.dir.join("feed.bin")), want);
    }
}

#[test]
fn directory_keeps_its_tree() {
    let s = Scratch::new("dir");
    let src = s.0.join("dataset");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::create_dir_all(src.join("empty")).unwrap();
    make_file(&src.join("a/b/one.bin"), 3 * MIB + 1, b"1");
    make_file(&src.join("a/two.bin"), 10, b"2");
    make_file(&src.join("zero.bin"), 0, b"3");
    make_file(&src.join("three.bin"), 2 * MIB, b"4");
    let key = secret(3);
    let ags = agents(&s.0.join("rx"), 3, &key);
    // Receivers given by a hosts file: the report uses its names.
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::from("[source]\nname = \"origin\"\n");
    for (i, a) in ags.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"site-{i}\"\naddr = \"{}\"\nsite = \"lab\"\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            hosts.to_str().unwrap(),
            "--chunk-kib",
            "64",
            "--fanout",
            "1",
        ],
        &key,
        None,
    );
    let r = report(&out);
    assert_eq!(r["object"]["kind"], "dir");
    assert_eq!(r["receivers"][2]["name"], "site-2");
    assert_eq!(r["receivers"][2]["parent"], "site-1");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for a in &ags {
        for f in ["a/b/one.bin", "a/two.bin", "zero.bin", "three.bin"] {
            assert_eq!(
                hash(&a.dir.join("dataset").join(f)),
                hash(&src.join(f)),
                "{f}"
            );
        }
        assert!(a.dir.join("dataset/empty").is_dir());
    }
}

#[test]
fn ticket_mode_with_file_and_stdout_receivers() {
    let s = Scratch::new("ticket");
    let src = s.0.join("image.img");
    make_file(&src, 12 * MIB + 77, b"ticket");
    let mut sender = Command::new(BIN)
        .args([
            "send",
            src.to_str().unwrap(),
            "--expect",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--json",
            "--quiet",
            "--fanout",
            "2",
            // Four connections per edge: the three after the first are dialled while the first
            // is still in its handshake, so a receiver can see an `Attach` before the `Open`.
            "--streams",
            "4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = sender.stdout.take().unwrap();
    let ticket = first_line(&mut out);
    assert!(ticket.starts_with("bc1/"), "{ticket}");

    // A receiver with a forged ticket (wrong secret) is refused and never counted.
    let forged = format!(
        "bc1/{}/{}",
        secret(9),
        ticket.splitn(3, '/').nth(2).unwrap()
    );
    let bad = Command::new(BIN)
        .args(["recv", &forged, "--quiet", "--wait", "5", "--out"])
        .arg(s.0.join("bad"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("secret"), "{err}");
    assert!(!s.0.join("bad").exists());

    let recv = |args: Vec<String>, stdout: Stdio| {
        Command::new(BIN)
            .arg("recv")
            .arg(&ticket)
            .args(args)
            .arg("--quiet")
            .stdout(stdout)
            .spawn()
            .unwrap()
    };
    let r1 = recv(
        vec!["--out".into(), s.0.join("one.img").display().to_string()],
        Stdio::null(),
    );
    let r2 = recv(
        vec!["--out".into(), s.0.join("two.img").display().to_string()],
        Stdio::null(),
    );
    let piped = std::fs::File::create(s.0.join("three.img")).unwrap();
    let r3 = recv(vec!["--stdout".into()], Stdio::from(piped));
    for mut r in [r1, r2, r3] {
        assert!(r.wait().unwrap().success());
    }
    let mut json = String::new();
    out.read_to_string(&mut json).unwrap();
    assert!(sender.wait().unwrap().success());
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["ok"], true);
    assert_eq!(r["receivers"].as_array().unwrap().len(), 3);
    for f in ["one.img", "two.img", "three.img"] {
        assert_eq!(hash(&s.0.join(f)), hash(&src), "{f}");
    }
}

#[test]
fn wrong_secret_is_refused_and_gets_no_data() {
    let s = Scratch::new("secret");
    let src = s.0.join("f.bin");
    make_file(&src, MIB, b"s");
    let good = agent(&s.0.join("good"), &secret(4));
    let other = agent(&s.0.join("other"), &secret(5));
    let list = format!("{},{}", good.addr, other.addr);
    let out = send(
        &[src.to_str().unwrap(), "--to", &list, "--strategy", "flat"],
        &secret(4),
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    let rx = r["receivers"].as_array().unwrap();
    assert_eq!(rx[0]["verified"], true);
    assert_eq!(rx[1]["verified"], false);
    let e = rx[1]["error"].as_str().unwrap();
    assert!(e.contains("secret"), "{e}");
    assert!(
        leftovers(&other.dir).is_empty(),
        "the refused agent stored something"
    );
    assert_eq!(hash(&good.dir.join("f.bin")), hash(&src));
}

#[test]
fn garbage_and_truncated_frames_are_errors_not_crashes() {
    let s = Scratch::new("garbage");
    let key = secret(6);
    let mut a = agent(&s.0.join("a"), &key);
    let mut probes: Vec<&[u8]> = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0, 0, 0, 40, 1, b'B', b'C'],
    ];
    let long = [0xffu8; 4096];
    probes.push(&long);
    for p in probes {
        let mut c = TcpStream::connect(&a.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        c.write_all(p).unwrap();
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = c.read_to_end(&mut sink); // the agent answers or closes; it must not hang
    }
    // Still serving.
    let src = s.0.join("f.bin");
    make_file(&src, 2 * MIB, b"g");
    let out = send(&[src.to_str().unwrap(), "--to", &a.addr], &key, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hash(&a.dir.join("f.bin")), hash(&src));
    assert!(a.child.try_wait().unwrap().is_none(), "agent exited");
    let _ = a.child.kill();
    let _ = a.child.wait();
    let mut log = String::new();
    a.child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    // The HTTP probe and the 0xff flood are named for what they are; the cut frame is truncated.
    assert_eq!(
        log.matches("does not speak the bulkcast protocol").count(),
        2,
        "{log}"
    );
    assert!(log.contains("truncated"), "{log}");
}

/// Needs root to mount a small tmpfs: marked ignored unless built to run (module doc), and fails
/// with the reason where the mount is refused.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (mounts a tmpfs): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn full_disk_is_reported_and_leaves_no_file() {
    let s = Scratch::new("full");
    let small = s.0.join("small");
    std::fs::create_dir_all(&small).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&small)
        .output()
        .expect("run mount");
    if !mount.status.success() {
        let said = String::from_utf8_lossy(&mount.stderr);
        root_test_cannot_run(
            "full_disk_is_reported_and_leaves_no_file",
            &format!(
                "mounting a tmpfs needs root with CAP_SYS_ADMIN, and mount failed: {}",
                said.trim().trim_end_matches('.')
            ),
        );
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(small.clone());
    let src = s.0.join("big.bin");
    make_file(&src, 24 * MIB, b"full");
    let key = secret(7);
    // The full receiver relays to a healthy one: that one must still get everything.
    let full = agent(&small.join("dir"), &key);
    let ok = agent(&s.0.join("ok"), &key);
    let list = format!("{},{}", full.addr, ok.addr);
    let started = Instant::now();
    let out = send(
        &[src.to_str().unwrap(), "--to", &list, "--fanout", "1"],
        &key,
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    let r = report(&out);
    let rx = r["receivers"].as_array().unwrap();
    let e = rx[0]["error"].as_str().unwrap();
    assert!(e.contains("disk full") || e.contains("No space"), "{e}");
    assert_eq!(rx[1]["verified"], true, "{r}");
    assert!(
        leftovers(&full.dir).is_empty(),
        "left behind: {:?}",
        leftovers(&full.dir)
    );
    assert_eq!(hash(&ok.dir.join("big.bin")), hash(&src));
}

#[test]
fn plan_probes_agents_and_send_uses_the_planned_tree() {
    let s = Scratch::new("plan");
    let key = secret(8);
    let ags = agents(&s.0, 4, &key);
    let list = to_list(&ags);
    let out = Command::new(BIN)
        .args(["plan", "--hosts", &list, "--out"])
        .arg(s.0.join("p"))
        .arg("--save-matrix")
        .arg(s.0.join("m.toml"))
        .env("BULKCAST_SECRET", &key)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("probed all 10 pairs of 5 nodes"), "{err}");
    assert!(text.contains("rtt ms") && text.contains("bound:"), "{text}");
    assert!(std::fs::read_to_string(s.0.join("p.dot"))
        .unwrap()
        .starts_with("digraph"));
    assert!(std::fs::read_to_string(s.0.join("p.svg"))
        .unwrap()
        .contains("<svg"));

    // send --strategy tree without --fanout: probe, plan (a chain, as no capacities are known).
    let src = s.0.join("f.bin");
    make_file(&src, 3 * MIB, b"plan");
    let out = send(&[src.to_str().unwrap(), "--to", &list], &key, None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    assert_eq!(r["strategy"], "tree (planned: dcmst)");
    assert_eq!(r["probe"]["cached"], false, "{r}");
    // A send takes the round trips TCP measured while connecting: no echoes to wait for.
    let note = r["probe"]["note"].as_str().unwrap();
    assert!(
        note.contains("probed all 10 pairs") && note.contains("round trip of each connect"),
        "{note}"
    );
    assert!(r["probe"]["seconds"].as_f64().unwrap() > 0.0, "{r}");
    let from_source = r["edges"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["from"] == "source")
        .count();
    assert_eq!(
        from_source, 1,
        "a chain has one edge out of the source: {r}"
    );
    for a in &ags {
        assert_eq!(hash(&a.dir.join("f.bin")), hash(&src));
    }
    // Sent again to the same hosts: the round trips just probed are reused.
    let out = send(
        &[src.to_str().unwrap(), "--to", &list, "--name", "h.bin"],
        &key,
        None,
    );
    let r = report_ok(&out);
    assert_eq!(r["probe"]["cached"], true, "{r}");
    assert_eq!(r["probe"]["seconds"], 0.0, "{r}");
    assert_eq!(r["strategy"], "tree (planned: dcmst)");
    // ... unless told not to.
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &list,
            "--name",
            "i.bin",
            "--probe-max-age",
            "0",
        ],
        &key,
        None,
    );
    assert_eq!(report_ok(&out)["probe"]["cached"], false);
    // The saved matrix replaces probing.
    let m = s.0.join("m.toml");
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &list,
            "--matrix",
            m.to_str().unwrap(),
            "--name",
            "g.bin",
        ],
        &key,
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    assert_eq!(r["strategy"], "tree (planned: dcmst)");
    assert_eq!(r["part_size"], 0, "loopback hops take chunks whole: {r}");
    assert_eq!(hash(&ags[3].dir.join("g.bin")), hash(&src));
    // Hops of 20 ms: chunks travel in verified 16 KiB parts, forwarded by every relay as
    // they arrive, and every copy is whole.
    let mut far: toml::Value = toml::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    for row in far["rtt_ms"].as_array_mut().unwrap() {
        for v in row.as_array_mut().unwrap() {
            if v.as_float() != Some(0.0) {
                *v = toml::Value::Float(20.0);
            }
        }
    }
    let m = s.0.join("far.toml");
    std::fs::write(&m, toml::to_string(&far).unwrap()).unwrap();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &list,
            "--matrix",
            m.to_str().unwrap(),
            "--name",
            "parts.bin",
        ],
        &key,
        None,
    );
    let r = report_ok(&out);
    assert_eq!(r["part_size"], 16384, "{r}");
    for a in &ags {
        assert_eq!(hash(&a.dir.join("parts.bin")), hash(&src));
    }
}

#[test]
fn agent_once_exits_with_the_outcome_of_its_session() {
    let s = Scratch::new("once");
    let key = secret(10);
    let dir = s.0.join("a");
    let mut child = Command::new(BIN)
        .args(["agent", "--once", "--listen", "127.0.0.1:0", "--dir"])
        .arg(&dir)
        .env("BULKCAST_SECRET", &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = listen_addr(&mut child);
    // A probe is not a session: the agent stays up through `plan`.
    let plan = Command::new(BIN)
        .args(["plan", "--hosts", &addr, "--out"])
        .arg(s.0.join("p"))
        .env("BULKCAST_SECRET", &key)
        .output()
        .unwrap();
    assert!(plan.status.success());
    assert!(child.try_wait().unwrap().is_none());
    let src = s.0.join("f.bin");
    make_file(&src, MIB + 3, b"once");
    assert!(send(&[src.to_str().unwrap(), "--to", &addr], &key, None)
        .status
        .success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "agent --once did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    assert_eq!(hash(&dir.join("f.bin")), hash(&src));
}

#[test]
fn balanced_send_over_two_trees_assembles_one_copy() {
    let s = Scratch::new("balanced");
    let key = secret(11);
    let ags = agents(&s.0, 2, &key);
    // Two receivers whose uplinks are half the source's: one tree reaches 50 Mbit/s, two trees
    // (source -> a -> b and source -> b -> a) reach 100 together.
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::from("[source]\nname = \"src\"\nuplink_mbps = 100\n");
    for (i, a) in ags.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{}\"\nuplink_mbps = 50\ndownlink_mbps = 100\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let src = s.0.join("model.bin");
    make_file(&src, 5 * MIB + 4321, b"balanced");
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            hosts.to_str().unwrap(),
            "--strategy",
            "balanced",
            "--chunk-kib",
            "64",
        ],
        &key,
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    let strategy = r["strategy"].as_str().unwrap();
    assert!(strategy.starts_with("balanced (2 trees"), "{strategy}");
    assert_eq!(r["object"]["bytes"], 5 * MIB + 4321);
    for a in &ags {
        assert_eq!(hash(&a.dir.join("model.bin")), hash(&src));
        assert_eq!(leftovers(&a.dir), vec!["model.bin".to_string()]);
    }
    for x in r["receivers"].as_array().unwrap() {
        assert_eq!(x["bytes"], 5 * MIB + 4321, "{r}");
    }
}

#[test]
fn bandwidth_probe_measures_every_directed_pair() {
    let s = Scratch::new("bw");
    let key = secret(12);
    let ags = agents(&s.0, 3, &key);
    let out = Command::new(BIN)
        .args([
            "plan",
            "--hosts",
            &to_list(&ags),
            "--probe-bandwidth",
            "--probe-secs",
            "0.3",
            "--out",
        ])
        .arg(s.0.join("p"))
        .arg("--save-matrix")
        .arg(s.0.join("m.toml"))
        .env("BULKCAST_SECRET", &key)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("bandwidth probe: 3 rounds of 0.3 s"), "{err}");
    assert!(!err.contains("could not be measured"), "{err}");
    let m = std::fs::read_to_string(s.0.join("m.toml")).unwrap();
    let bw = m
        .split("bandwidth_mbps")
        .nth(1)
        .unwrap_or_else(|| panic!("no bandwidth in {m}"));
    // Every measured pair on loopback carries far more than 100 Mbit/s.
    let rates: Vec<f64> = bw
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|t| t.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .collect();
    assert!(rates.len() >= 9, "{bw}");
    assert!(rates.iter().all(|r| *r > 100.0), "{rates:?}");
}

#[test]
fn above_64_hosts_plan_probes_a_sample_and_estimates_the_rest() {
    let s = Scratch::new("vivaldi");
    let key = secret(13);
    let ags = agents(&s.0, 70, &key);
    let out = Command::new(BIN)
        .args(["plan", "--hosts", &to_list(&ags), "--samples", "2", "--out"])
        .arg(s.0.join("p"))
        .env("BULKCAST_SECRET", &key)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // 71 nodes: far fewer than the 2485 pairs are probed; the rest come from coordinates.
    let probed: usize = err
        .split("probed ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(probed > 70 && probed < 71 * 70 / 2, "{err}");
    assert!(
        err.contains("estimated with Vivaldi coordinates (median relative error on probed pairs"),
        "{err}"
    );
    assert!(!err.contains("could not probe"), "{err}");
    eprintln!("{err}");
}

/// `pipe recv` on loopback, and what it wrote to stdout.
struct PipeRecv {
    child: Child,
    addrs: Vec<String>,
}

impl Drop for PipeRecv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pipe_recv(secret: &str, listen: &[&str], out: &Path) -> PipeRecv {
    let mut child = Command::new(BIN)
        .args(["pipe", "recv"])
        .args(listen.iter().flat_map(|l| ["--listen", l]))
        .env("BULKCAST_SECRET", secret)
        .stdout(std::fs::File::create(out).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addrs = listen_addrs(&first_line(child.stderr.as_mut().unwrap()));
    PipeRecv { child, addrs }
}

/// `pipe send ADDR --json -q ARGS` with `input` on stdin.
fn pipe_send(secret: &str, addr: &str, args: &[&str], input: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["pipe", "send", addr, "--json", "-q"])
        .args(args)
        .env("BULKCAST_SECRET", secret)
        .stdin(std::fs::File::open(input).unwrap())
        .output()
        .unwrap()
}

#[test]
fn pipe_over_parallel_connections_with_every_scheduler_arrives_in_order() {
    let s = Scratch::new("pipe");
    let src = s.0.join("input");
    make_file(&src, 24 * MIB + 4321, b"pipe");
    let want = hash(&src);
    let key = secret(9);
    for scheduler in ["pull", "weighted", "equal"] {
        let got = s.0.join(format!("out-{scheduler}"));
        let mut rx = pipe_recv(&key, &["127.0.0.1:0"], &got);
        let out = pipe_send(
            &key,
            &rx.addrs[0],
            &[
                "--streams",
                "4",
                "--scheduler",
                scheduler,
                "--chunk-kib",
                "64",
            ],
            &src,
        );
        assert!(
            out.status.success(),
            "{scheduler}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let status = rx.child.wait().unwrap();
        assert!(status.success(), "{scheduler}: pipe recv failed");
        assert_eq!(hash(&got), want, "{scheduler}: stream differs");
        let r = report(&out);
        assert_eq!(r["verified"], true);
        assert_eq!(r["bytes"], 24 * MIB + 4321);
        assert_eq!(r["scheduler"], scheduler);
        // `pipe send`'s default transport is auto: TCP where the round trip is that short.
        assert_eq!(r["transport"], "tcp", "{r}");
        let conns = r["connections"].as_array().unwrap();
        assert_eq!(conns.len(), 4, "{scheduler}: {r}");
        // Every connection carried part of the stream, and together all of it.
        let sent: Vec<u64> = conns.iter().map(|c| c["sent"].as_u64().unwrap()).collect();
        assert!(
            sent.iter().all(|&b| b > 0),
            "{scheduler}: idle connection: {sent:?}"
        );
        assert!(
            sent.iter().sum::<u64>() >= 24 * MIB + 4321,
            "{scheduler}: {sent:?}"
        );
    }
}

#[test]
fn pipe_over_the_paced_udp_transport_arrives_whole_and_says_so() {
    let s = Scratch::new("pipe-udp");
    let src = s.0.join("input");
    make_file(&src, 24 * MIB + 777, b"udp");
    let key = secret(11);
    let got = s.0.join("out");
    let mut rx = pipe_recv(&key, &["127.0.0.1:0"], &got);
    let out = pipe_send(&key, &rx.addrs[0], &["--transport", "udp"], &src);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(rx.child.wait().unwrap().success(), "pipe recv failed");
    assert_eq!(hash(&got), hash(&src), "stream differs");
    let r = report(&out);
    assert_eq!(r["verified"], true);
    assert_eq!(r["transport"], "udp", "{r}");
    assert_eq!(r["bytes"], 24 * MIB + 777);
}

#[test]
fn pipe_over_udp_to_nobody_fails_clearly() {
    // A port with nothing behind it: a clear error naming UDP, within the connect deadline.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = Command::new(BIN)
        .args([
            "pipe",
            "send",
            &port.to_string(),
            "--transport",
            "udp",
            "-q",
        ])
        .args(["--stall-timeout", "5"])
        .env("BULKCAST_SECRET", secret(12))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused") || err.contains("UDP"), "{err}");
}

#[test]
fn striped_tree_edges_use_every_path_of_a_host() {
    let s = Scratch::new("paths");
    let src = s.0.join("input.bin");
    make_file(&src, 32 * MIB, b"paths");
    let key = secret(10);
    // Each agent listens on two loopback addresses: its main one and an extra path.
    let ags: Vec<Agent> = (0..3)
        .map(|i| {
            agent_on(
                &s.0.join(format!("r{i}")),
                &key,
                &["127.0.0.1:0", "127.0.0.2:0"],
            )
        })
        .collect();
    let mut hosts = String::new();
    for (i, a) in ags.iter().enumerate() {
        hosts += &format!(
            "[[host]]\nname = \"r{i}\"\naddr = \"{}\"\npaths = [\"{}\"]\n",
            a.addr, a.paths[0]
        );
    }
    let file = s.0.join("hosts.toml");
    std::fs::write(&file, hosts).unwrap();
    let stats = s.0.join("stats.jsonl");
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            file.to_str().unwrap(),
            "--fanout",
            "1",
            "--streams",
            "4",
            "--stats",
            stats.to_str().unwrap(),
            "--stats-interval-ms",
            "100",
        ],
        &key,
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = hash(&src);
    for a in &ags {
        assert_eq!(hash(&a.dir.join("input.bin")), want);
    }
    // The source's edge to r0: four connections, dealt round-robin to both addresses, each
    // carrying data.
    let r = report(&out);
    let edge = r["edges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["to"] == "r0")
        .unwrap();
    let conns = edge["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 4, "{edge}");
    for (i, c) in conns.iter().enumerate() {
        let addr = if i % 2 == 0 {
            &ags[0].addr
        } else {
            &ags[0].paths[0]
        };
        assert_eq!(c["addr"], addr.as_str());
        assert!(c["bytes"].as_u64().unwrap() > 0, "{edge}");
    }
    // The time series has the edge's connections, one JSON object per line.
    let lines = std::fs::read_to_string(&stats).unwrap();
    let last: serde_json::Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
    assert_eq!(last["edge"], "r0");
    assert_eq!(last["connections"].as_array().unwrap().len(), 4);
    assert!(last["t_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn a_relay_paces_what_it_sends_below_its_declared_uplink() {
    let s = Scratch::new("pace");
    let src = s.0.join("input.bin");
    make_file(&src, 12 * MIB, b"pace");
    let key = secret(11);
    let ags = agents(&s.0, 2, &key);
    // A chain source -> r0 -> r1; r0 declares a 40 Mbit/s uplink, so it sends r1 at most
    // 0.95 * 5 MB/s (about 2.6 s for 12 MiB), while the source, on loopback, is not held back.
    let file = s.0.join("hosts.toml");
    std::fs::write(
        &file,
        format!(
            "[[host]]\nname = \"r0\"\naddr = \"{}\"\nuplink_mbps = 40\n\
             [[host]]\nname = \"r1\"\naddr = \"{}\"\n",
            ags[0].addr, ags[1].addr
        ),
    )
    .unwrap();
    let want = hash(&src);
    for streams in ["1", "3"] {
        // Each send must move the object again (an identical copy in place is skipped).
        for a in &ags {
            let _ = std::fs::remove_file(a.dir.join("input.bin"));
        }
        let out = send(
            &[
                src.to_str().unwrap(),
                "--to",
                file.to_str().unwrap(),
                "--fanout",
                "1",
                "--streams",
                streams,
            ],
            &key,
            None,
        );
        let r = report_ok(&out);
        for a in &ags {
            assert_eq!(hash(&a.dir.join("input.bin")), want);
        }
        let secs = |name: &str| {
            r["receivers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|x| x["name"] == name)
                .unwrap()["seconds"]
                .as_f64()
                .unwrap()
        };
        // 12 MiB at 4.75 MB/s is 2.65 s, over any number of connections (and not much more:
        // the cap is not split over connections that carry nothing).
        assert!(secs("r1") > 2.4, "--streams {streams}: {r}");
        assert!(secs("r1") < 6.0, "--streams {streams}: {r}");
        assert!(secs("r0") < secs("r1") - 1.0, "--streams {streams}: {r}");
    }
}

/// A hosts file putting agents (by address) into sites: the source is in `source_site`,
/// host i in `sites[i]`.
fn sited_hosts(path: &Path, addrs: &[&str], source_site: &str, sites: &[&str]) {
    let mut toml = format!("[source]\nname = \"src\"\nsite = \"{source_site}\"\n");
    for (i, a) in addrs.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{a}\"\nsite = \"{}\"\n",
            sites[i]
        );
    }
    std::fs::write(path, toml).unwrap();
}

/// Sends `len` bytes to 6 agents (started with `agent_extra`) in 3 sites (the source's site
/// holds 2 of them) by a swarm strategy; checks every copy and returns the report.
fn swarm_send(
    tag: &str,
    strategy: &str,
    len: u64,
    extra: &[&str],
    agent_extra: &[&str],
) -> serde_json::Value {
    let s = Scratch::new(tag);
    let key = secret(21);
    let ags: Vec<Agent> = (0..6)
        .map(|i| {
            agent_with(
                &s.0.join(format!("r{i}")),
                &key,
                &["127.0.0.1:0"],
                agent_extra,
            )
        })
        .collect();
    let hosts = s.0.join("hosts.toml");
    let addrs: Vec<&str> = ags.iter().map(|a| a.addr.as_str()).collect();
    sited_hosts(
        &hosts,
        &addrs,
        "lon",
        &["lon", "lon", "fra", "fra", "nyc", "nyc"],
    );
    let src = s.0.join("obj.bin");
    make_file(&src, len, tag.as_bytes());
    let mut args = vec![
        src.to_str().unwrap(),
        "--to",
        hosts.to_str().unwrap(),
        "--strategy",
        strategy,
        "--chunk-kib",
        "64",
        "--stall-timeout",
        "10",
    ];
    args.extend(extra);
    let started = Instant::now();
    let out = send(&args, &key, None);
    assert!(
        out.status.success(),
        "{strategy}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{strategy} took {:?}",
        started.elapsed()
    );
    let r = report(&out);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["strategy"], strategy);
    assert_eq!(r["object"]["bytes"], len);
    let want = hash(&src);
    for a in &ags {
        assert_eq!(
            hash(&a.dir.join("obj.bin")),
            want,
            "{strategy}: copy at {}",
            a.addr
        );
        assert_eq!(
            leftovers(&a.dir),
            vec!["obj.bin".to_string()],
            "temporary files left"
        );
    }
    let receivers = r["receivers"].as_array().unwrap();
    assert_eq!(receivers.len(), 6);
    for x in receivers {
        assert_eq!(x["bytes"], len, "{r}");
        assert_eq!(x["verified"], true);
        assert!(x["seconds"].as_f64().unwrap() > 0.0);
        // Every byte of the copy came from some peer, at least once.
        let from: u64 = x["received_from"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["bytes"].as_u64().unwrap())
            .sum();
        assert!(from >= len, "{strategy}: {x}");
    }
    let clusters = r["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 3, "{r}");
    for c in clusters {
        let wan = c["wan_bytes_in"].as_u64().unwrap();
        if c["has_source"] == true {
            assert_eq!(c["site"], "lon");
        } else {
            // Each piece enters every other cluster at least once.
            assert!(wan >= len, "{strategy}: {c}");
        }
    }
    r
}

#[test]
fn mob_delivers_to_three_sites_and_each_piece_enters_a_site_once() {
    let len = 6 * MIB + 12345;
    let r = swarm_send("mob", "mob", len, &[], &[]);
    for c in r["clusters"].as_array().unwrap() {
        let wan = c["wan_bytes_in"].as_u64().unwrap();
        if c["has_source"] == true {
            // Nothing needs to enter the source's site.
            assert_eq!(wan, 0, "{c}");
        } else {
            // The MOB invariant: the object crosses the WAN into each site exactly once.
            assert_eq!(wan, len, "{c}");
        }
    }
}

#[test]
fn swarm_baseline_delivers_to_three_sites() {
    swarm_send("bt", "swarm", 3 * MIB + 777, &[], &[]);
}

#[test]
fn hybrid_over_a_fixed_and_the_planned_tree_delivers_to_three_sites() {
    let r = swarm_send("hybrid", "hybrid", 6 * MIB + 1, &["--fanout", "2"], &[]);
    // Fan-out 2: two receivers hang off the source.
    let from_source = r["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["parent"] == "source")
        .count();
    assert_eq!(from_source, 2, "{r}");
    // Without --fanout the source probes the agents and uses the planner's tree.
    let r = swarm_send("hybridplan", "hybrid", 2 * MIB + 3, &[], &[]);
    let parents: Vec<&str> = r["receivers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["parent"].as_str().unwrap())
        .collect();
    assert!(parents.contains(&"source"), "{r}");
    assert!(!parents.contains(&"-"), "{r}");
}

#[test]
fn hybrid_to_agents_writing_with_direct_io_delivers_whole_copies() {
    // 64 KiB pieces, an unaligned last one: members serve stored pieces read back with
    // O_DIRECT (or, on a file system without it, through the page cache), checked by hash.
    swarm_send(
        "hybriddirect",
        "hybrid",
        8 * MIB + 4097,
        &["--fanout", "2"],
        &["--direct-io"],
    );
}

#[test]
fn swarm_strategies_refuse_a_stream_and_a_directory_above_the_memory_limit() {
    let s = Scratch::new("swarmstream");
    let key = secret(22);
    let ags = agents(&s.0, 2, &key);
    let list = to_list(&ags);
    let src = s.0.join("in.bin");
    make_file(&src, 1000, b"s");
    let out = send(&["-", "--to", &list, "--strategy", "mob"], &key, Some(&src));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("known length"), "{err}");
    // A directory is held in memory: above the limit it is refused (a sparse file: nothing
    // is read).
    let dir = s.0.join("big");
    std::fs::create_dir(&dir).unwrap();
    std::fs::File::create(dir.join("big.bin"))
        .unwrap()
        .set_len((2 << 30) + 1)
        .unwrap();
    let started = Instant::now();
    let out = send(
        &[dir.to_str().unwrap(), "--to", &list, "--strategy", "swarm"],
        &key,
        None,
    );
    assert!(!out.status.success());
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at most 2048 MiB"), "{err}");
    for a in &ags {
        assert!(leftovers(&a.dir).is_empty());
    }
}

/// Peak resident memory of a process, from /proc.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

#[test]
fn swarm_members_serve_a_file_from_disk_not_from_memory() {
    let s = Scratch::new("swarmdisk");
    let key = secret(24);
    let ags = agents(&s.0, 3, &key);
    let src = s.0.join("obj.bin");
    let len = 160 * MIB;
    make_file(&src, len, b"disk");
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &to_list(&ags),
            "--strategy",
            "mob",
        ],
        &key,
        None,
    );
    report_ok(&out);
    for a in &ags {
        assert_eq!(hash(&a.dir.join("obj.bin")), hash(&src));
        // Every piece was served to the others, yet no member ever held the object: pieces
        // live in memory only until stored, then go out of the file with sendfile.
        let peak = peak_rss(a.child.id());
        assert!(peak < len / 2, "agent peaked at {} MiB", peak >> 20);
    }
}

#[test]
fn mob_with_an_unreachable_member_delivers_to_the_others_and_reports_it() {
    let s = Scratch::new("moblost");
    let key = secret(23);
    let ags = agents(&s.0, 5, &key);
    // An address nobody listens on any more.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let mut addrs: Vec<&str> = ags.iter().map(|a| a.addr.as_str()).collect();
    addrs.insert(3, &dead);
    let hosts = s.0.join("hosts.toml");
    sited_hosts(
        &hosts,
        &addrs,
        "lon",
        &["lon", "lon", "fra", "fra", "nyc", "nyc"],
    );
    let src = s.0.join("obj.bin");
    let len = 2 * MIB + 99;
    make_file(&src, len, b"lost");
    let started = Instant::now();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            hosts.to_str().unwrap(),
            "--strategy",
            "mob",
            "--chunk-kib",
            "64",
        ],
        &key,
        None,
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(1));
    let r = report(&out);
    assert_eq!(r["ok"], false);
    for (i, x) in r["receivers"].as_array().unwrap().iter().enumerate() {
        assert_eq!(x["verified"], i != 3, "{x}");
    }
    for a in &ags {
        assert_eq!(
            hash(&a.dir.join("obj.bin")),
            hash(&src),
            "copy at {}",
            a.addr
        );
    }
}

/// `AUTO_HYBRID_MIN_BYTES` in crates/planner/src/strategy.rs.
const AUTO_HYBRID_MIN: u64 = 2 * MIB;

#[test]
fn auto_strategy_swarms_across_sites_by_size_and_pushes_within_one() {
    let s = Scratch::new("auto");
    let key = secret(25);
    let ags = agents(&s.0, 4, &key);
    let addrs: Vec<&str> = ags.iter().map(|a| a.addr.as_str()).collect();
    let sited = s.0.join("hosts.toml");
    sited_hosts(&sited, &addrs, "lon", &["lon", "fra", "fra", "nyc"]);
    let plain = to_list(&ags);
    let cases = [
        (sited.as_path(), MIB, "mob"),
        (sited.as_path(), AUTO_HYBRID_MIN, "hybrid"),
        (Path::new(&plain), AUTO_HYBRID_MIN, "tree"),
    ];
    for (i, (to, len, want)) in cases.into_iter().enumerate() {
        let src = s.0.join(format!("obj{i}.bin"));
        make_file(&src, len, b"auto");
        let out = send(
            &[src.to_str().unwrap(), "--to", to.to_str().unwrap()],
            &key,
            None,
        );
        let r = report_ok(&out);
        let strategy = r["strategy"].as_str().unwrap();
        assert!(
            strategy.starts_with(want),
            "{len} bytes to {}: {strategy}",
            to.display()
        );
        for a in &ags {
            assert_eq!(hash(&a.dir.join(format!("obj{i}.bin"))), hash(&src));
        }
    }
}

/// Sets a file's or a directory's modification time (seconds since the epoch).
fn set_mtime(path: &Path, secs: u64) {
    let t = std::time::UNIX_EPOCH + Duration::from_secs(secs);
    std::fs::File::open(path).unwrap().set_modified(t).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn mtime_of(path: &Path) -> std::time::SystemTime {
    std::fs::symlink_metadata(path).unwrap().modified().unwrap()
}

/// A directory with everything a tree can hold: empty files and directories, links in and out
/// of the tree, modes with and without setuid, set times and a name that is not UTF-8.
fn odd_tree(src: &Path) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::{symlink, PermissionsExt};
    let chmod = |p: &str, m: u32| {
        std::fs::set_permissions(src.join(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    std::fs::create_dir_all(src.join("sub/empty/emptier")).unwrap();
    make_file(&src.join("data.bin"), 300_000, b"odd");
    make_file(&src.join("empty.bin"), 0, b"");
    make_file(&src.join("x750.bin"), 10, b"750");
    make_file(&src.join("suid.bin"), 10, b"suid");
    make_file(
        &src.join(std::ffi::OsStr::from_bytes(b"not-utf8-\xff.bin")),
        10,
        b"x",
    );
    chmod("x750.bin", 0o750);
    chmod("suid.bin", 0o4755);
    chmod("sub", 0o750);
    symlink("data.bin", src.join("link")).unwrap();
    symlink("../data.bin", src.join("sub/up")).unwrap();
    symlink("../../outside", src.join("sub/escape")).unwrap();
    symlink("/etc/passwd", src.join("abs")).unwrap();
    set_mtime(&src.join("data.bin"), 1_000_000_000);
    set_mtime(&src.join("sub/empty"), 1_100_000_000);
    set_mtime(&src.join("sub"), 1_200_000_000);
}

/// What arrives of [`odd_tree`] at `got` (`suid`: the setuid bit was asked to be kept).
fn check_odd_tree(src: &Path, got: &Path, suid: bool) {
    assert_eq!(hash(&got.join("data.bin")), hash(&src.join("data.bin")));
    assert_eq!(std::fs::read(got.join("empty.bin")).unwrap(), b"");
    assert!(got.join("sub/empty/emptier").is_dir());
    assert_eq!(
        std::fs::read_link(got.join("link")).unwrap(),
        Path::new("data.bin")
    );
    assert_eq!(
        std::fs::read_link(got.join("sub/up")).unwrap(),
        Path::new("../data.bin")
    );
    assert_eq!(hash(&got.join("sub/up")), hash(&src.join("data.bin")));
    for left_out in ["sub/escape", "abs"] {
        assert!(
            std::fs::symlink_metadata(got.join(left_out)).is_err(),
            "{left_out}"
        );
    }
    let names: Vec<String> = leftovers(got);
    assert!(
        !names.iter().any(|n| n.starts_with("not-utf8")),
        "{names:?}"
    );
    assert_eq!(mode_of(&got.join("x750.bin")), 0o750);
    assert_eq!(
        mode_of(&got.join("suid.bin")),
        if suid { 0o4755 } else { 0o755 }
    );
    assert_eq!(mode_of(&got.join("sub")), 0o750);
    for p in ["data.bin", "sub/empty", "sub", "link", ""] {
        assert_eq!(mtime_of(&got.join(p)), mtime_of(&src.join(p)), "{p:?}");
    }
}

#[test]
fn directory_arrives_as_it_left_and_reports_what_it_left_out() {
    let s = Scratch::new("odd");
    let src = s.0.join("odd");
    odd_tree(&src);
    set_mtime(&src, 1_300_000_000);
    let key = secret(26);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let list = to_list(&ags);
    for (strategy, keep) in [("auto", false), ("mob", true)] {
        let mut args = vec![src.to_str().unwrap(), "--to", &list, "--strategy", strategy];
        if keep {
            args.push("--keep-special-modes");
        }
        let out = send(&args, &key, None);
        let err = String::from_utf8_lossy(&out.stderr);
        // Delivered, but not whole: neither success nor a failed receiver.
        assert_eq!(out.status.code(), Some(3), "{strategy}: {err}");
        assert!(
            err.contains("3 entries of the directory were left out"),
            "{err}"
        );
        let r = report(&out);
        assert_eq!(r["ok"], true, "{r}");
        let skipped: Vec<&str> = r["object"]["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["path"].as_str().unwrap())
            .collect();
        assert_eq!(
            skipped,
            ["abs", "not-utf8-\u{fffd}.bin", "sub/escape"],
            "{r}"
        );
        for a in &ags {
            check_odd_tree(&src, &a.dir.join("odd"), keep);
            // Nothing beside the copy and the record that lets a later send of it move
            // nothing: no temporary tree, nothing a link led out to.
            let mut left = leftovers(&a.dir);
            left.sort();
            assert_eq!(left, vec![".odd.bulkcast.done", "odd"]);
        }
    }
}

#[test]
fn empty_file_and_empty_directory_with_every_strategy() {
    let s = Scratch::new("empty");
    let key = secret(27);
    let ags = agents(&s.0.join("rx"), 3, &key);
    let list = to_list(&ags);
    // Capacities, which balanced needs and which make auto and tree plan.
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::new();
    for (i, a) in ags.iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{}\"\nuplink_mbps = 1000\ndownlink_mbps = 1000\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let file = s.0.join("nothing.bin");
    make_file(&file, 0, b"");
    let dir = s.0.join("nothing");
    std::fs::create_dir_all(dir.join("inside/deeper")).unwrap();
    let cases = [
        ("auto", list.as_str()),
        ("auto", hosts.to_str().unwrap()),
        ("tree", list.as_str()),
        ("flat", list.as_str()),
        ("balanced", hosts.to_str().unwrap()),
        ("mob", list.as_str()),
        ("swarm", list.as_str()),
        ("hybrid", list.as_str()),
    ];
    for (strategy, to) in cases {
        for obj in [&file, &dir] {
            for a in &ags {
                let _ = std::fs::remove_dir_all(a.dir.join("nothing"));
                let _ = std::fs::remove_file(a.dir.join("nothing.bin"));
            }
            let out = send(
                &[obj.to_str().unwrap(), "--to", to, "--strategy", strategy],
                &key,
                None,
            );
            let r = report_ok(&out);
            assert_eq!(r["object"]["bytes"], 0, "{strategy}: {r}");
            for a in &ags {
                if obj == &file {
                    let got = a.dir.join("nothing.bin");
                    assert_eq!(std::fs::read(&got).unwrap(), b"", "{strategy}");
                } else {
                    let got = a.dir.join("nothing/inside/deeper");
                    assert!(got.is_dir(), "{strategy}: {}", got.display());
                }
            }
        }
    }
}

#[test]
fn a_single_file_keeps_its_mode_and_time_as_a_directory_would() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("filemode");
    let key = secret(28);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let src = s.0.join("tool");
    make_file(&src, 100_000, b"tool");
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o4750)).unwrap();
    set_mtime(&src, 1_234_567_890);
    for strategy in ["tree", "hybrid"] {
        let out = send(
            &[
                src.to_str().unwrap(),
                "--to",
                &to_list(&ags),
                "--strategy",
                strategy,
            ],
            &key,
            None,
        );
        report_ok(&out);
        for a in &ags {
            let got = a.dir.join("tool");
            assert_eq!(hash(&got), hash(&src));
            // The permission bits; setuid only when asked (--keep-special-modes).
            assert_eq!(mode_of(&got), 0o750, "{strategy}");
            assert_eq!(mtime_of(&got), mtime_of(&src), "{strategy}");
        }
    }
}

#[test]
fn follow_symlinks_sends_what_links_point_at() {
    use std::os::unix::fs::symlink;
    let s = Scratch::new("follow");
    let key = secret(29);
    let ags = agents(&s.0.join("rx"), 2, &key);
    let src = s.0.join("snap");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(s.0.join("blobs")).unwrap();
    make_file(&s.0.join("blobs/w.bin"), 200_000, b"w");
    symlink("../blobs/w.bin", src.join("model.bin")).unwrap();
    symlink("../blobs", src.join("all")).unwrap();
    symlink("nowhere", src.join("dangling")).unwrap();
    let out = send(
        &[
            src.to_str().unwrap(),
            "--to",
            &to_list(&ags),
            "--follow-symlinks",
        ],
        &key,
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(report(&out)["object"]["skipped"][0]["path"], "dangling");
    for a in &ags {
        let got = a.dir.join("snap");
        for p in ["model.bin", "all/w.bin"] {
            assert!(
                std::fs::symlink_metadata(got.join(p)).unwrap().is_file(),
                "{p}"
            );
            assert_eq!(hash(&got.join(p)), hash(&s.0.join("blobs/w.bin")), "{p}");
        }
        assert!(std::fs::symlink_metadata(got.join("all")).unwrap().is_dir());
    }
}

#[test]
fn a_host_that_does_not_admit_the_source_is_left_out_and_fails_alone() {
    let s = Scratch::new("leftout");
    let key = secret(31);
    let mut ags = agents(&s.0, 4, &key);
    // The third agent holds another secret, and a fifth address has nobody listening.
    ags[2] = agent(&s.0.join("wrong"), &secret(32));
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let list = format!("{},{dead}", to_list(&ags));
    let src = s.0.join("f.bin");
    make_file(&src, 2 * MIB, b"leftout");
    // The planned tree (its probe checks every host) and a fixed chain (checked up front).
    for (name, extra) in [("a.bin", vec![]), ("b.bin", vec!["--fanout", "1"])] {
        let mut args = vec![src.to_str().unwrap(), "--to", &list, "--name", name];
        args.extend(extra.iter().copied());
        let out = send(&args, &key, None);
        assert_eq!(out.status.code(), Some(1), "{name}: some receivers failed");
        let r = report(&out);
        let failed: Vec<&str> = r["receivers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["verified"] != true)
            .map(|x| x["addr"].as_str().unwrap())
            .collect();
        let mut want = vec![ags[2].addr.as_str(), dead.as_str()];
        want.sort();
        let mut got = failed.clone();
        got.sort();
        assert_eq!(got, want, "{name}: only the two bad hosts fail: {r}");
        for x in r["receivers"].as_array().unwrap() {
            if x["verified"] != true {
                let why = x["error"].as_str().unwrap();
                assert!(why.starts_with("left out before the send"), "{why}");
            }
        }
        for i in [0, 1, 3] {
            assert_eq!(
                hash(&ags[i].dir.join(name)),
                hash(&src),
                "{name}: agent {i}"
            );
        }
        assert!(!ags[2].dir.join(name).exists());
    }
}
