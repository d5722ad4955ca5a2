//! Real processes on loopback: a swarm member's agent killed mid-session and restarted, with host
//! keys. The source dials it again, re-admits it into the running session, and it resumes what
//! it kept (checked against the source's signed piece list, served to its peers): the same send
//! completes, moving to it what it lacked plus at most 1%.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// The root-test helper in `common` is not used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::resume::{mapped_len, report, send_cmd, u, wait_for_map};
use common::run::agent_with;
use common::{hash, make_file, secret, Agent, Scratch};

const MIB: u64 = 1 << 20;
const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");

/// `bulkcast keygen FILE`: the public key it prints.
fn keygen(path: &Path) -> String {
    let out = Command::new(BIN).arg("keygen").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Sends a signal to a process this test started.
fn signal(a: &Agent, sig: &str) {
    let pid = a.child.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

#[test]
fn with_host_keys_a_killed_swarm_member_is_readmitted_and_resumes_in_the_same_send() {
    for strategy in ["mob", "hybrid"] {
        killed_member_rejoins(strategy);
    }
}

fn killed_member_rejoins(strategy: &str) {
    let s = Scratch::new(&format!("swarm-rejoin-{strategy}"));
    let fleet = secret(0x4c);
    let src_key = s.0.join("src.key");
    let src_pub = keygen(&src_key);
    let keys: Vec<(PathBuf, String)> = (0..3)
        .map(|i| {
            let p = s.0.join(format!("a{i}.key"));
            let public = keygen(&p);
            (p, public)
        })
        .collect();
    // The agents take pieces only on the source's word; each other's keys may only relay.
    let mut agent_list = format!("{src_pub} push source\n");
    for (i, (_, public)) in keys.iter().enumerate() {
        agent_list += &format!("{public} relay a{i}\n");
    }
    let agent_allow = s.0.join("agent.allow");
    std::fs::write(&agent_allow, agent_list).unwrap();
    let src_allow = s.0.join("src.allow");
    let listed: Vec<&str> = keys.iter().map(|(_, p)| p.as_str()).collect();
    std::fs::write(&src_allow, listed.join("\n")).unwrap();
    let start = |i: usize, listen: &str| {
        let key = keys[i].0.to_str().unwrap();
        let extra = ["--key", key, "--allow-keys", agent_allow.to_str().unwrap()];
        agent_with(&s.0.join(format!("r{i}")), &fleet, &[listen], &extra)
    };
    let mut agents: Vec<Agent> = (0..3).map(|i| start(i, "127.0.0.1:0")).collect();
    let to: Vec<String> = agents.iter().map(|a| a.addr.clone()).collect();
    let src = s.0.join("weights.bin");
    let len = 192 * MIB + 4321;
    make_file(&src, len, strategy.as_bytes());
    let mut args = vec!["--strategy", strategy, "--stall-timeout", "30"];
    let (k, a) = (src_key.to_str().unwrap(), src_allow.to_str().unwrap());
    args.extend(["--key", k, "--allow-keys", a]);
    if strategy == "hybrid" {
        args.extend(["--fanout", "2"]);
    }
    let sender = send_cmd(&src, &to.join(","), &args, &fleet)
        .spawn()
        .unwrap();

    // Node 2 (agents[1]) is killed a quarter in and restarted on its address. Node 3 is held
    // (SIGSTOP) while it is away, so that the session cannot end before the source tries again
    // 2 s after the drop: on loopback the others would otherwise be done by then. (Node 1 is
    // the hybrid's deal target: held, it would hold everyone.)
    wait_for_map(&agents[1].dir, len / 4);
    signal(&agents[2], "-STOP");
    agents[1].child.kill().unwrap();
    agents[1].child.wait().unwrap();
    let kept = mapped_len(&agents[1].dir, 256 << 10);
    let addr = agents[1].addr.clone();
    agents[1] = start(1, &addr);
    // Re-admitted: its copy grows again (its new instance stores what it lacked).
    let until = Instant::now() + Duration::from_secs(20);
    while mapped_len(&agents[1].dir, 256 << 10) <= kept && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&agents[2], "-CONT");

    let out = sender.wait_with_output().unwrap();
    let r = report(&out);
    assert!(out.status.success(), "{strategy}: {r}");
    let rb = &r["receivers"][1];
    let held = u(&rb["held_bytes"]);
    let moved = u(&rb["received_bytes"]);
    let missing = len - held;
    eprintln!(
        "{strategy} with host keys, member killed at {kept} of {len} bytes and re-admitted: \
         held {held}, missing {missing}, moved {moved}"
    );
    assert!(held >= len / 8, "{strategy}: kept only {held} bytes: {r}");
    // The hybrid's in-site push and pulls deliver some pieces twice, resumed or not (see
    // `swarm_resume_sim`): 0.5-1.4% over in two runs here; MOB keeps to 1%.
    let slack = if strategy == "hybrid" {
        len / 50
    } else {
        len / 100
    };
    assert!(
        moved <= missing + slack,
        "{strategy}: moved {moved} for {missing} missing: {r}"
    );
    let want = hash(&src);
    for (i, a) in agents.iter().enumerate() {
        assert_eq!(r["receivers"][i]["verified"], true, "{strategy}: {r}");
        assert_eq!(
            hash(&a.dir.join("weights.bin")),
            want,
            "{strategy}: agent {i}"
        );
    }

    // The next send of the unchanged object moves nothing to anyone.
    let out = send_cmd(&src, &to.join(","), &args, &fleet)
        .output()
        .unwrap();
    let r = report(&out);
    assert!(out.status.success(), "{strategy}: {r}");
    for rx in r["receivers"].as_array().unwrap() {
        assert_eq!(rx["already_in_place"], true, "{strategy}: {r}");
        assert_eq!(u(&rx["received_bytes"]), 0, "{strategy}: {r}");
    }
}
