//! The feed's relay tree as real processes on loopback: relays given only the source place
//! themselves below it by room and round trip, a relay whose parent dies or stays connected
//! but silent joins again from the source and resumes where it stopped, its subscribers
//! missing nothing, and only hosts `--allow-relay` covers are listed as relays.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;
use common::feed::{
    bin, delivered, events, insert, lines, relay, same_files, serve, status, subscribe,
    wait_status, write_files,
};
use common::Scratch;

#[test]
fn a_relay_joins_below_another_when_the_source_is_full_and_routes_around_its_death() {
    let s = Scratch::new("feed-tree");
    let (src, sq) = (s.0.join("src"), s.0.join("sq"));
    let source = serve(&sq, "127.0.0.1:0", &["--max-relay-children", "1"]);
    let a = relay(&s.0.join("aq"), "127.0.0.1:0", &source.addr, "ANY", &[]);
    let st = wait_status(&a.addr, 20, |st| st["upstream"]["connected"] == true);
    assert_eq!(st["upstream"]["parent"], source.addr.as_str(), "{st}");
    wait_status(&source.addr, 20, |st| {
        st["relay_children"][0] == a.addr.as_str()
    });

    // The source is full: the second relay, also given the source, joins below the first.
    let b = relay(&s.0.join("bq"), "127.0.0.1:0", &source.addr, "ANY", &[]);
    let st = wait_status(&b.addr, 20, |st| st["upstream"]["connected"] == true);
    let up = &st["upstream"];
    assert_eq!(up["parent"], a.addr.as_str(), "{st}");
    assert_eq!(up["source"], source.addr.as_str(), "{st}");
    let ancestry = [source.addr.as_str(), a.addr.as_str()];
    assert_eq!(up["ancestry"], serde_json::json!(ancestry), "{st}");
    assert_eq!(up["joins"], 1, "{st}");
    let measured: Vec<&str> = up["measured"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["addr"].as_str().unwrap())
        .collect();
    assert_eq!(measured, ancestry, "both measured: {st}");
    assert!(
        up["chosen"].as_str().unwrap().contains("source is full"),
        "{st}"
    );
    wait_status(&a.addr, 20, |st| st["relay_children"][0] == b.addr.as_str());
    let st = status(&source.addr);
    assert_eq!(st["relay_children"].as_array().unwrap().len(), 1, "{st}");

    let names: Vec<String> = (0..24).map(|i| format!("p-{i}")).collect();
    let files = write_files(&src, &names, |i| 1000 + i * 7919);
    let sub = subscriber_of(&b.addr, &s.0.join("sub"), names.len());
    wait_status(&b.addr, 20, |st| {
        st["subscribers"].as_array().is_some_and(|a| a.len() == 1)
    });
    for f in &files[..12] {
        insert(&source.addr, "IDS", std::slice::from_ref(f));
    }
    wait_status(&b.addr, 30, |st| st["upstream"]["relayed"] == 12);

    // The first relay dies: the second gives it up, joins the source, resumes after 12.
    let (killed, a_addr) = (Instant::now(), a.addr.clone());
    drop(a);
    for f in &files[12..] {
        insert(&source.addr, "IDS", std::slice::from_ref(f));
    }
    let st = wait_status(&b.addr, 30, |st| {
        st["upstream"]["parent"] == source.addr.as_str() && st["upstream"]["connected"] == true
    });
    let rejoined = killed.elapsed();
    let up = &st["upstream"];
    assert_eq!(up["joins"], 2, "{st}");
    assert_eq!(up["ancestry"], serde_json::json!([source.addr]), "{st}");
    assert_eq!(up["dead"], serde_json::json!([a_addr]), "{st}");
    assert!(
        rejoined < Duration::from_secs(15),
        "rejoined after {rejoined:?}"
    );
    let st = wait_status(&b.addr, 30, |st| st["upstream"]["relayed"] == 24);
    assert_eq!(st["upstream"]["lost"], 0, "{st}");
    assert_eq!(st["products"], 24, "{st}");
    wait_status(&source.addr, 20, |st| {
        st["relay_children"][0] == b.addr.as_str()
    });

    let out = sub.wait_with_output().unwrap();
    let v = lines(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let seqs = delivered(&v);
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "duplicates: {seqs:?} {err}");
    assert_eq!(unique, (1..=24).collect(), "every product: {err}");
    assert!(events(&v, "lost").is_empty(), "nothing lost: {err}");
    same_files(&src, &s.0.join("sub"), &names);
}

fn signal(p: &Child, sig: &str) {
    let pid = p.id().to_string();
    assert!(Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success());
}

/// A subscriber of `addr` from product 1, unicast, until it has `n` products (90 s at most).
fn subscriber_of(addr: &str, dir: &Path, n: usize) -> Child {
    let n = n.to_string();
    let args = [
        "--feedtype",
        "ANY",
        "--from",
        "1",
        "--unicast",
        "--max-products",
        &n,
    ];
    subscribe(addr, dir, &[&args[..], &["--duration", "90"]].concat())
}

/// Every one of `names` delivered once to the subscriber that wrote into `dir`, none lost.
fn got_each_once(sub: Child, src: &Path, dir: &Path, names: &[String]) {
    let out = sub.wait_with_output().unwrap();
    let v = lines(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    let seqs = delivered(&v);
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "duplicates: {seqs:?} {err}");
    assert_eq!(
        unique,
        (1..=names.len() as u64).collect(),
        "every product: {err}"
    );
    assert!(events(&v, "lost").is_empty(), "nothing lost: {err}");
    same_files(src, dir, names);
}

fn insert_each(addr: &str, files: &[PathBuf]) {
    for f in files {
        insert(addr, "IDS", std::slice::from_ref(f));
    }
}

/// A relay stopped (SIGSTOP) keeps its children's connections open and sends nothing: the
/// connected but silent parent the dead-parent rule never leaves. Its child leaves it once
/// the source, asked itself, has been ahead for the stall time, and misses nothing.
#[test]
fn a_relay_leaves_a_parent_that_stays_connected_but_sends_nothing() {
    const STALL: u64 = 3;
    let s = Scratch::new("feed-tree-stall");
    let (src, sq) = (s.0.join("src"), s.0.join("sq"));
    let source = serve(&sq, "127.0.0.1:0", &["--max-relay-children", "1"]);
    let a = relay(&s.0.join("aq"), "127.0.0.1:0", &source.addr, "ANY", &[]);
    wait_status(&a.addr, 20, |st| st["upstream"]["connected"] == true);
    wait_status(&source.addr, 20, |st| {
        st["relay_children"][0] == a.addr.as_str()
    });
    let stall = STALL.to_string();
    let b_args = ["--parent-stall-secs", stall.as_str()];
    let b = relay(&s.0.join("bq"), "127.0.0.1:0", &source.addr, "ANY", &b_args);
    let st = wait_status(&b.addr, 20, |st| st["upstream"]["connected"] == true);
    assert_eq!(st["upstream"]["parent"], a.addr.as_str(), "{st}");

    let names: Vec<String> = (0..24).map(|i| format!("p-{i}")).collect();
    let files = write_files(&src, &names, |i| 1000 + i * 7919);
    let sub = subscriber_of(&b.addr, &s.0.join("sub"), names.len());
    insert_each(&source.addr, &files[..12]);
    wait_status(&b.addr, 30, |st| st["upstream"]["relayed"] == 12);
    // An idle feed is no stall: the source is not ahead.
    std::thread::sleep(Duration::from_secs(2 * STALL + 1));
    let st = status(&b.addr);
    let up = &st["upstream"];
    assert_eq!(
        (&up["parent"], &up["joins"]),
        (&a.addr.as_str().into(), &1.into()),
        "{st}"
    );
    assert_eq!(up["stalls"], 0, "{st}");
    assert_eq!(up["source_last_seq"], 12, "{st}");

    // A stops: its connections stay open, silent. The source moves on without it.
    signal(&a.proc, "-STOP");
    let stopped = Instant::now();
    insert_each(&source.addr, &files[12..]);
    let st = wait_status(&b.addr, 30, |st| {
        st["upstream"]["parent"] == source.addr.as_str() && st["upstream"]["connected"] == true
    });
    let took = stopped.elapsed();
    let up = &st["upstream"];
    assert_eq!(
        (&up["joins"], &up["stalls"]),
        (&2.into(), &1.into()),
        "{st}"
    );
    assert_eq!(up["dead"], serde_json::json!([a.addr]), "{st}");
    let why = up["last_error"].as_str().unwrap_or("");
    assert!(
        why.contains(&format!("parent {}: sent nothing for", a.addr))
            && why.contains("while the source is at seq")
            && why.ends_with("and we are at 12"),
        "{st}"
    );
    assert!(
        took < Duration::from_secs(STALL + 12),
        "left after {took:?}"
    );
    let st = wait_status(&b.addr, 30, |st| st["upstream"]["relayed"] == 24);
    assert_eq!(st["upstream"]["lost"], 0, "{st}");
    got_each_once(sub, &src, &s.0.join("sub"), &names);
    signal(&a.proc, "-CONT");
}

/// With `--allow-relay`, a relay whose host no pattern covers is served its products but not
/// listed: a second relay does not find it, and `feed status` counts it.
#[test]
fn only_hosts_allow_relay_covers_are_listed_as_relay_children() {
    let s = Scratch::new("feed-tree-allow-relay");
    let src = s.0.join("src");
    let names: Vec<String> = (0..3).map(|i| format!("q-{i}")).collect();
    let files = write_files(&src, &names, |i| 500 + i * 101);
    // Loopback is not in 10.0.0.0/8.
    let closed = serve(
        &s.0.join("cq"),
        "127.0.0.1:0",
        &["--allow-relay", "10.0.0.0/8"],
    );
    let r1 = relay(&s.0.join("r1"), "127.0.0.1:0", &closed.addr, "ANY", &[]);
    wait_status(&r1.addr, 20, |st| st["upstream"]["connected"] == true);
    insert_each(&closed.addr, &files);
    wait_status(&r1.addr, 30, |st| st["upstream"]["relayed"] == 3);
    let st = wait_status(&closed.addr, 20, |st| st["relays_refused"] == 1);
    assert_eq!(st["relay_children"], serde_json::json!([]), "{st}");
    assert_eq!(st["subscribers"].as_array().unwrap().len(), 1, "{st}");
    // A second relay asks the source for its relay children: none listed, only it measured.
    let r2 = relay(&s.0.join("r2"), "127.0.0.1:0", &closed.addr, "ANY", &[]);
    let st = wait_status(&r2.addr, 20, |st| st["upstream"]["relayed"] == 3);
    let up = &st["upstream"];
    assert_eq!(up["parent"], closed.addr.as_str(), "{st}");
    assert_eq!(up["measured"].as_array().unwrap().len(), 1, "{st}");
    wait_status(&closed.addr, 20, |st| st["relays_refused"] == 2);

    // Covered by a pattern: listed.
    let open_args = ["--allow-relay", "10.0.0.0/8", "--allow-relay", "127.0.0.1"];
    let open = serve(&s.0.join("oq"), "127.0.0.1:0", &open_args);
    let r3 = relay(&s.0.join("r3"), "127.0.0.1:0", &open.addr, "ANY", &[]);
    let st = wait_status(&open.addr, 20, |st| {
        st["relay_children"][0] == r3.addr.as_str()
    });
    assert_eq!(st["relays_refused"], 0, "{st}");

    // A joiner reads at most 256 children: more would read as room.
    let out = bin()
        .args(["feed", "serve", "--max-relay-children", "257", "--dir"])
        .arg(s.0.join("x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("0..=256"), "{err}");
    let out = bin()
        .args(["feed", "serve", "--allow-relay", "relay.example", "--dir"])
        .arg(s.0.join("x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allow-relay"),
        "{err}"
    );
}
