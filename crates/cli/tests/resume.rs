//! Real processes on loopback: what survives a fault. A receiver killed mid-transfer keeps
//! what it verified, and the next send moves only the rest; an unchanged object moves nothing;
//! `--retry` finishes what a fault left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// The root-test helper in `common` is not used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::resume::{
    agent, files, kill_resume_and_send_unchanged, listed, part_len, part_tree_len, report,
    send_cmd, u, wait_for_part, Way,
};
use common::{hash, make_file, secret, spawn_agent, Agent, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// The flat tree, then a chain for the unchanged object.
const FLAT: Way = Way {
    args: &["--strategy", "flat"],
    unchanged: &["--fanout", "1"],
    to: &listed,
};

#[test]
fn a_killed_receiver_resumes_and_an_unchanged_object_moves_nothing() {
    let s = Scratch::new("resume-kill");
    let src = s.0.join("weights.bin");
    let len = 192 * MIB;
    make_file(&src, len, b"resume");
    let want = hash(&src);
    let (a, b) =
        kill_resume_and_send_unchanged(&src, len, &secret(0x29), |d| part_len(d).is_some(), &FLAT);
    assert_eq!(hash(&a.dir.join("weights.bin")), want);
    assert_eq!(hash(&b.dir.join("weights.bin")), want);
    assert_eq!(
        files(&b.dir),
        vec![".weights.bin.bulkcast.done", "weights.bin"]
    );
}

/// A directory of model shards: `n` files of `each` bytes, a small one, an empty one in a
/// directory of its own, and a link.
fn make_tree(root: &Path, n: u64, each: u64) -> u64 {
    std::fs::create_dir_all(root.join("shards")).unwrap();
    std::fs::create_dir_all(root.join("empty/dir")).unwrap();
    for i in 0..n {
        make_file(&root.join(format!("shards/{i}.bin")), each, &[i as u8]);
    }
    make_file(&root.join("config.json"), 1234, b"config");
    std::fs::write(root.join("empty/dir/none"), b"").unwrap();
    std::os::unix::fs::symlink("shards/0.bin", root.join("latest.bin")).unwrap();
    n * each + 1234
}

/// Every file of the tree `got` has the content of the same file in `want`.
fn same_tree(want: &Path, got: &Path, n: u64) {
    let mut paths: Vec<String> = (0..n).map(|i| format!("shards/{i}.bin")).collect();
    paths.extend(["config.json", "empty/dir/none", "latest.bin"].map(String::from));
    for p in paths {
        assert_eq!(hash(&got.join(&p)), hash(&want.join(&p)), "{}", p);
    }
    assert!(std::fs::symlink_metadata(got.join("latest.bin"))
        .unwrap()
        .is_symlink());
}

#[test]
fn a_killed_receiver_resumes_a_directory_and_an_unchanged_one_moves_nothing() {
    let s = Scratch::new("resume-dir");
    let src = s.0.join("model");
    let n = 6;
    let len = make_tree(&src, n, 32 * MIB);
    let (a, b) = kill_resume_and_send_unchanged(
        &src,
        len,
        &secret(0x33),
        |d| part_tree_len(d).is_some(),
        &FLAT,
    );
    same_tree(&src, &a.dir.join("model"), n);
    same_tree(&src, &b.dir.join("model"), n);
    assert_eq!(files(&b.dir), vec![".model.bulkcast.done", "model"]);
}

#[test]
fn retry_finishes_a_receiver_that_came_back() {
    let s = Scratch::new("resume-retry");
    let src = s.0.join("blob.bin");
    let len = 96 * MIB;
    make_file(&src, len, b"retry");
    let key = secret(0x30);
    let a = agent(&s.0.join("a"), &key);
    let mut b = agent(&s.0.join("b"), &key);
    let b_dir = b.dir.clone();
    // Port of b: a new agent on the same port takes over after the kill.
    let b_addr = b.addr.clone();
    let to = format!("{},{}", a.addr, b.addr);
    let sender = send_cmd(&src, &to, &["--strategy", "flat", "--retry", "3"], &key)
        .spawn()
        .unwrap();
    wait_for_part(&b_dir, len / 4);
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let mut child = Command::new(BIN)
        .args(["agent", "--listen", &b_addr, "--dir"])
        .arg(&b_dir)
        .env("BULKCAST_SECRET", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = sender.wait_with_output().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let r = report(&out);
    assert!(out.status.success(), "{r}");
    assert_eq!(r["receivers"][1]["verified"], true, "{r}");
    assert!(u(&r["receivers"][1]["held_bytes"]) > 0, "{r}");
    assert_eq!(hash(&b_dir.join("blob.bin")), hash(&src));
}

#[test]
fn a_relay_killed_mid_transfer_in_a_chain_of_4_fails_alone() {
    relay_killed_in_a_chain_of_4(false);
}

/// One-shot agents (`agent --once`, as the lab and the ssh launcher run them) stay up when
/// their session aborts with its parent, so that the node adopting them can open it again;
/// each exits, successfully, once its copy is whole.
#[test]
fn one_shot_agents_below_a_killed_relay_wait_to_be_adopted_and_finish() {
    let mut ags = relay_killed_in_a_chain_of_4(true);
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in [0, 2, 3] {
        let status = loop {
            if let Some(st) = ags[i].child.try_wait().unwrap() {
                break st;
            }
            assert!(Instant::now() < deadline, "agent {i} --once did not exit");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "agent {i}: {status}");
    }
}

/// Kills the second host of a chain of 4 a third of the way in: only it fails, the two below
/// it are adopted and resume. Returns the agents (one-shot with `once`).
fn relay_killed_in_a_chain_of_4(once: bool) -> Vec<Agent> {
    let s = Scratch::new(if once { "resume-once" } else { "resume-relay" });
    let src = s.0.join("chain.bin");
    let len = 160 * MIB;
    make_file(&src, len, b"chain");
    let want = hash(&src);
    let key = secret(0x31);
    let mut ags: Vec<Agent> = (0..4)
        .map(|i| {
            spawn_agent(&s.0.join(format!("r{i}")), &["127.0.0.1:0"], |c| {
                c.env("BULKCAST_SECRET", &key);
                if once {
                    c.arg("--once");
                }
            })
        })
        .collect();
    let to = ags
        .iter()
        .map(|a| a.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let sender = send_cmd(&src, &to, &["--fanout", "1"], &key)
        .spawn()
        .unwrap();
    // The second host of the chain dies with a third of its copy written.
    wait_for_part(&ags[1].dir, len / 3);
    ags[1].child.kill().unwrap();
    ags[1].child.wait().unwrap();
    let out = sender.wait_with_output().unwrap();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r}");
    let rx = r["receivers"].as_array().unwrap();
    assert_eq!(rx[1]["verified"], false, "{r}");
    assert!(rx[1]["error"].as_str().is_some(), "{r}");
    for i in [0, 2, 3] {
        assert_eq!(rx[i]["verified"], true, "receiver {i}: {r}");
        assert_eq!(hash(&ags[i].dir.join("chain.bin")), want, "receiver {i}");
    }
    // The two below it were adopted and resumed from what they held.
    for i in [2, 3] {
        let held = u(&rx[i]["held_bytes"]);
        assert!(held > 0, "receiver {i}: {r}");
        assert!(
            u(&rx[i]["received_bytes"]) <= len - held + len / 100,
            "receiver {i}: {r}"
        );
    }
    ags
}

#[test]
fn a_stopped_receiver_is_let_go_and_catches_up_without_holding_the_others() {
    let s = Scratch::new("resume-stop");
    let src = s.0.join("stop.bin");
    let len = 128 * MIB;
    make_file(&src, len, b"stop");
    let key = secret(0x32);
    let ags: Vec<Agent> = (0..3)
        .map(|i| agent(&s.0.join(format!("r{i}")), &key))
        .collect();
    let to = ags
        .iter()
        .map(|a| a.addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let stop_for = Duration::from_secs(8);
    let sender = send_cmd(
        &src,
        &to,
        &["--strategy", "flat", "--budget-mib", "16"],
        &key,
    )
    .spawn()
    .unwrap();
    wait_for_part(&ags[2].dir, len / 8);
    let pid = ags[2].child.id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    std::thread::sleep(stop_for);
    signal("-CONT");
    let out = sender.wait_with_output().unwrap();
    let r = report(&out);
    // Everyone has a copy in the end: the stopped one was let go, then caught up by the
    // automatic retry, resuming from what it held.
    assert!(out.status.success(), "{r}");
    let rx = r["receivers"].as_array().unwrap();
    for (i, a) in ags.iter().enumerate() {
        assert_eq!(rx[i]["verified"], true, "receiver {i}: {r}");
        assert_eq!(hash(&a.dir.join("stop.bin")), hash(&src), "receiver {i}");
    }
    assert!(u(&rx[2]["held_bytes"]) >= len / 8, "{r}");
    // The others did not wait for it.
    for (i, x) in rx.iter().enumerate().take(2) {
        let secs = x["seconds"].as_f64().unwrap();
        assert!(
            secs < stop_for.as_secs_f64(),
            "receiver {i} took {secs} s: {r}"
        );
    }
}
