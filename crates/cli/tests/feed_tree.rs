//! The feed's relay tree as real processes on loopback: relays given only the source place
//! themselves below it by room and round trip, and a relay whose parent dies joins again from
//! the source and resumes where it stopped, its subscribers missing nothing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

mod common;
use common::feed::{
    delivered, events, insert, lines, relay, same_files, serve, status, subscribe, wait_status,
    write_files,
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
    let want = names.len().to_string();
    let sub = subscribe(
        &b.addr,
        &s.0.join("sub"),
        &[
            "--feedtype",
            "ANY",
            "--from",
            "1",
            "--unicast",
            "--max-products",
            &want,
            "--duration",
            "90",
        ],
    );
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
