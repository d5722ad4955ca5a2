//! Real processes on loopback: agents, senders and ticket receivers, as users run them: files
//! and streams by tree, tickets, refused and malformed peers, plans and probes, spread and paced
//! edges, hosts left out. Directories are in `directories.rs`, the swarm strategies in
//! `strategies.rs`, `bulkcast pipe` in `pipe.rs`.
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
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// Not every helper in `common` is used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::run::{
    agent, agent_on, agents, leftovers, listen_addr, report, report_ok, send, to_list, BIN,
};
use common::{first_line, hash, make_file, root_test_cannot_run, secret, Agent, Scratch};

const MIB: u64 = 1 << 20;

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
    // The saved matrix replaces probing. Its round trips are what the probe measured, which
    // on a loaded machine can pass the 2 ms where hops go in parts: read as a quiet loopback's.
    let m = s.0.join("m.toml");
    let mut near: toml::Value = toml::from_str(&std::fs::read_to_string(&m).unwrap()).unwrap();
    for row in near["rtt_ms"].as_array_mut().unwrap() {
        for v in row.as_array_mut().unwrap() {
            if v.as_float() != Some(0.0) {
                *v = toml::Value::Float(0.1);
            }
        }
    }
    std::fs::write(&m, toml::to_string(&near).unwrap()).unwrap();
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
        // The copy and the record that says it is whole (a later send of it moves nothing).
        let mut left = leftovers(&a.dir);
        left.sort();
        assert_eq!(left, vec![".model.bin.bulkcast.done", "model.bin"]);
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
