//! Real processes on loopback: resume with the strategies other than one tree. A balanced send
//! (several trees, each its own session) and the swarm strategies keep what a killed receiver
//! verified, move only the rest the next time, and nothing for an unchanged object.

use std::path::Path;

// The root-test helper in `common` is not used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::resume::{files, kill_resume_and_send_unchanged, part_len, Way};
use common::{hash, make_file, secret, Scratch};

const MIB: u64 = 1 << 20;

/// A hosts file for two agents whose uplinks are half the source's, so that the balanced plan
/// takes two trees (source -> a -> b and source -> b -> a); returns its path.
fn balanced_hosts(path: &Path, a: &str, b: &str) -> String {
    let mut toml = String::from("[source]\nname = \"src\"\nuplink_mbps = 100\n");
    for (i, addr) in [a, b].iter().enumerate() {
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{addr}\"\nuplink_mbps = 50\ndownlink_mbps = 100\n"
        );
    }
    std::fs::write(path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn balanced_resumes_a_killed_receiver_and_moves_nothing_unchanged() {
    let s = Scratch::new("resume-balanced");
    let src = s.0.join("weights.bin");
    let len = 96 * MIB;
    make_file(&src, len, b"balanced");
    let want = hash(&src);
    let hosts = s.0.join("hosts.toml");
    let to = |a: &str, b: &str| balanced_hosts(&hosts, a, b);
    let way = Way {
        args: &["--strategy", "balanced"],
        unchanged: &["--strategy", "balanced"],
        to: &to,
    };
    let (a, b) =
        kill_resume_and_send_unchanged(&src, len, &secret(0x34), |d| part_len(d).is_some(), &way);
    for d in [&a.dir, &b.dir] {
        assert_eq!(hash(&d.join("weights.bin")), want);
        assert_eq!(files(d), vec![".weights.bin.bulkcast.done", "weights.bin"]);
    }
}

/// A swarm strategy (`args`) on two agents: the killed one resumes, serving what it kept.
fn swarm_resumes(tag: &str, key: u8, args: &[&str]) {
    let s = Scratch::new(tag);
    let src = s.0.join("weights.bin");
    let len = 64 * MIB + 12345;
    make_file(&src, len, tag.as_bytes());
    let want = hash(&src);
    let way = Way {
        args,
        unchanged: args,
        to: &common::resume::listed,
    };
    let (a, b) =
        kill_resume_and_send_unchanged(&src, len, &secret(key), |d| part_len(d).is_some(), &way);
    for d in [&a.dir, &b.dir] {
        assert_eq!(hash(&d.join("weights.bin")), want);
        assert_eq!(files(d), vec![".weights.bin.bulkcast.done", "weights.bin"]);
    }
}

#[test]
fn mob_resumes_a_killed_receiver_and_moves_nothing_unchanged() {
    swarm_resumes("resume-mob", 0x35, &["--strategy", "mob"]);
}

#[test]
fn swarm_resumes_a_killed_receiver_and_moves_nothing_unchanged() {
    swarm_resumes("resume-swarm", 0x36, &["--strategy", "swarm"]);
}

#[test]
fn hybrid_resumes_a_killed_receiver_and_moves_nothing_unchanged() {
    swarm_resumes(
        "resume-hybrid",
        0x37,
        &["--strategy", "hybrid", "--fanout", "2"],
    );
}

/// A directory swarms from memory: what a killed member kept of it is read back into memory
/// when it resumes, and served from there.
#[test]
fn mob_resumes_a_directory() {
    let s = Scratch::new("resume-mobdir");
    let src = s.0.join("shards");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let n = 4;
    for i in 0..n {
        make_file(&src.join(format!("sub/{i}.bin")), 12 * MIB, &[i as u8]);
    }
    make_file(&src.join("config.json"), 777, b"config");
    let len = n * 12 * MIB + 777;
    let way = Way {
        args: &["--strategy", "mob"],
        unchanged: &["--strategy", "mob"],
        to: &common::resume::listed,
    };
    let kept = |d: &Path| common::resume::part_tree_len(d).is_some();
    let (a, b) = kill_resume_and_send_unchanged(&src, len, &secret(0x38), kept, &way);
    for d in [&a.dir, &b.dir] {
        for i in 0..n {
            let p = format!("shards/sub/{i}.bin");
            assert_eq!(hash(&d.join(&p)), hash(&s.0.join(&p)), "{p}");
        }
        assert_eq!(files(d), vec![".shards.bulkcast.done", "shards"]);
    }
}

/// What a resumed member kept is served to its peers (read back and sealed for the new
/// session): a fresh member beside it takes pieces from it, verified, and ends byte-exact.
#[test]
fn a_resumed_mob_member_serves_what_it_kept_to_a_new_one() {
    use common::resume::{agent, report, send_cmd, u, wait_for_map};
    let s = Scratch::new("resume-mobserve");
    let src = s.0.join("weights.bin");
    let len = 64 * MIB + 4321;
    make_file(&src, len, b"serve");
    let key = secret(0x39);
    let mob = ["--strategy", "mob"];
    let mut b = agent(&s.0.join("b"), &key);
    let sender = send_cmd(&src, &b.addr, &mob, &key).spawn().unwrap();
    wait_for_map(&b.dir, len / 3);
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let _ = sender.wait_with_output().unwrap();
    let b = agent(&b.dir, &key);
    let c = agent(&s.0.join("c"), &key);
    let to = format!("{},{}", b.addr, c.addr);
    let out = send_cmd(&src, &to, &mob, &key).output().unwrap();
    let r = report(&out);
    assert!(out.status.success(), "{r}");
    assert!(u(&r["receivers"][0]["held_bytes"]) >= len / 4, "{r}");
    let from_b: u64 = r["receivers"][1]["received_from"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["peer"] == r["receivers"][0]["name"])
        .map(|p| u(&p["bytes"]))
        .sum();
    assert!(
        from_b > 0,
        "the new member took nothing from the resumed one: {r}"
    );
    let want = hash(&src);
    assert_eq!(hash(&b.dir.join("weights.bin")), want);
    assert_eq!(hash(&c.dir.join("weights.bin")), want);
}
