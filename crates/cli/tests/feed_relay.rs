//! `bulkcast feed serve --upstream` as real processes on loopback: a source, a site's relay
//! and its subscribers (unicast and multicast); the relay killed and restarted mid-feed; a
//! relay that alters products is caught by its subscribers; products the source evicted
//! while the relay was down are reported lost.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::feed::{
    delivered, events, free_port, insert, lines, relay, same_files, serve, subscribe, wait_status,
    write_files, Server,
};
use common::Scratch;

/// One batch of the feed: `n` products of each of IDS (small), NGRID (mid-size, one large)
/// and NEXRAD3 (which the relay does not take), interleaved as one insert each.
fn batch(src: &Path, tag: &str, n: usize) -> (Vec<(String, &'static str)>, Vec<String>) {
    let mut all = Vec::new();
    for i in 0..n {
        for ft in ["IDS", "NGRID", "NEXRAD3"] {
            all.push((format!("{tag}-{ft}-{i}"), ft));
        }
    }
    let names: Vec<String> = all.iter().map(|(n, _)| n.clone()).collect();
    write_files(src, &names, |i| match all[i].1 {
        "IDS" => 1 + (i * 97) % 4000,
        // The first mid-size product of a batch is large: hashed off the relay's receive
        // loop, so smaller ones after it complete first and the relay must keep the order.
        "NGRID" if i == 1 => 6 << 20,
        "NGRID" => 100_000 + i * 1000,
        _ => 2000,
    });
    let relayed = all
        .iter()
        .filter(|(_, ft)| *ft != "NEXRAD3")
        .map(|(n, _)| n.clone())
        .collect();
    (all, relayed)
}

fn insert_batch(addr: &str, src: &Path, all: &[(String, &'static str)]) {
    for (name, ft) in all {
        insert(addr, ft, &[src.join(name)]);
    }
}

#[test]
fn a_relay_feeds_its_site_every_product_once_through_its_restart() {
    let s = Scratch::new("feed-relay");
    let (src, sq, rq) = (s.0.join("src"), s.0.join("sq"), s.0.join("rq"));
    let source = serve(&sq, "127.0.0.1:0", &[]);
    let raddr = free_port();
    let mcast = [
        "--multicast",
        "239.255.71.31:17931",
        "--multicast-if",
        "127.0.0.1",
    ];
    let r = relay(&rq, &raddr, &source.addr, "IDS|NGRID", &mcast);
    let (b1, r1) = batch(&src, "a", 6);
    let (b2, r2) = batch(&src, "b", 6);
    let (b3, r3) = batch(&src, "c", 6);
    let want = r1.len() + r2.len() + r3.len();
    let max = want.to_string();
    let args = [
        "--feedtype",
        "ANY",
        "--max-products",
        &max,
        "--duration",
        "120",
    ];
    let uni = subscribe(
        &raddr,
        &s.0.join("uni"),
        &[&args[..], &["--unicast"]].concat(),
    );
    let multi = subscribe(
        &raddr,
        &s.0.join("multi"),
        &[&args[..], &["--iface", "127.0.0.1"]].concat(),
    );
    wait_status(&raddr, 20, |st| {
        st["subscribers"].as_array().is_some_and(|a| a.len() == 2)
    });
    insert_batch(&source.addr, &src, &b1);
    let st = wait_status(&raddr, 60, |st| st["upstream"]["relayed"] == r1.len());
    assert_eq!(st["upstream"]["source"], source.addr.as_str(), "{st}");
    assert_eq!(st["upstream"]["connected"], true, "{st}");
    assert_eq!(
        st["products"],
        r1.len(),
        "the relay's queue holds what it relayed"
    );
    // Killed while the next batch flows; the rest is inserted while it is down.
    let feeder = {
        let (addr, src, b2) = (source.addr.clone(), src.clone(), b2.clone());
        std::thread::spawn(move || insert_batch(&addr, &src, &b2))
    };
    std::thread::sleep(Duration::from_millis(300));
    drop(r);
    feeder.join().unwrap();
    insert_batch(&source.addr, &src, &b3);
    let _r = relay(&rq, &raddr, &source.addr, "IDS|NGRID", &mcast);
    let all_relayed: Vec<String> = [r1, r2, r3].concat();
    for (child, dir, transport) in [(uni, "uni", "unicast"), (multi, "multi", "multicast")] {
        let out = child.wait_with_output().unwrap();
        let v = lines(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        let seqs = delivered(&v);
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!(unique.len(), seqs.len(), "{dir}: duplicates: {err}");
        assert_eq!(seqs.len(), want, "{dir}: {err}");
        assert!(
            events(&v, "lost").is_empty(),
            "{dir}: nothing is lost: {err}"
        );
        assert!(
            !events(&v, "disconnected").is_empty(),
            "{dir} saw the restart"
        );
        // The source's numbers: NEXRAD3 products leave gaps, every third one.
        assert!(unique.iter().all(|s| s % 3 != 0), "{dir}: {unique:?}");
        same_files(&src, &s.0.join(dir), &all_relayed);
        for n in names_of(&[b1.clone(), b2.clone(), b3.clone()].concat(), "NEXRAD3") {
            assert!(
                !s.0.join(dir).join(&n).exists(),
                "{dir}: {n} was not relayed"
            );
        }
        let sub = events(&v, "subscribed");
        assert_eq!(sub[0]["transport"], transport, "{dir}: {sub:?}");
    }
    let st = wait_status(&raddr, 20, |st| st["upstream"]["lag"] == 0);
    assert_eq!(st["upstream"]["lost"], 0, "{st}");
    // A late subscriber's backlog from a sequence number, against the relay's queue.
    let out = subscribe(
        &raddr,
        &s.0.join("late"),
        &[
            "--feedtype",
            "IDS",
            "--from",
            "1",
            "--max-products",
            "18",
            "--duration",
            "30",
        ],
    )
    .wait_with_output()
    .unwrap();
    let v = lines(&out);
    assert_eq!(
        delivered(&v).len(),
        18,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(events(&v, "lost").is_empty(), "{v:?}");
}

fn names_of(all: &[(String, &'static str)], ft: &str) -> Vec<String> {
    all.iter()
        .filter(|(_, f)| *f == ft)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Replaces the first occurrence of `from` in `path` by `to` (same length).
fn alter(path: &Path, from: &[u8], to: &[u8]) {
    let mut b = std::fs::read(path).unwrap();
    let at = b
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{from:?} not in {}", path.display()));
    b[at..at + to.len()].copy_from_slice(to);
    std::fs::write(path, b).unwrap();
}

fn queue_file(q: &Path, seq: u64, ext: &str) -> PathBuf {
    q.join("queue").join(format!("{seq:020}.{ext}"))
}

#[test]
fn a_relay_that_alters_a_product_is_caught_by_its_subscribers() {
    let s = Scratch::new("feed-relay-tamper");
    let (src, sq, rq) = (s.0.join("src"), s.0.join("sq"), s.0.join("rq"));
    let names: Vec<String> = (1..=4).map(|i| format!("grid-{i}")).collect();
    let files = write_files(&src, &names, |i| 10_000 * (i + 1));
    let source = serve(&sq, "127.0.0.1:0", &[]);
    let raddr = free_port();
    let r = relay(&rq, &raddr, &source.addr, "ANY", &[]);
    insert(&source.addr, "NGRID", &files);
    wait_status(&raddr, 30, |st| st["upstream"]["relayed"] == 4);
    drop(r);
    // The relay turns bad: one product's bytes, another's name (its metadata).
    let dat = queue_file(&rq, 2, "dat");
    let mut b = std::fs::read(&dat).unwrap();
    b[100] ^= 0xff;
    std::fs::write(&dat, b).unwrap();
    alter(&queue_file(&rq, 3, "meta"), b"grid-3", b"grid-X");
    let _r = serve(&rq, &raddr, &[]);
    let out = subscribe(
        &raddr,
        &s.0.join("sub"),
        &["--feedtype", "ANY", "--from", "1", "--duration", "6"],
    )
    .wait_with_output()
    .unwrap();
    let v = lines(&out);
    assert_eq!(delivered(&v), vec![1, 4], "{v:?}");
    let sum = events(&v, "summary");
    let stats = &sum[0]["stats"];
    assert!(
        stats["corrupt"].as_u64() >= Some(1),
        "altered bytes fail the hash: {stats}"
    );
    assert!(
        stats["bad_tags"].as_u64() >= Some(1),
        "an altered name fails the tag: {stats}"
    );
    for n in ["grid-2", "grid-3", "grid-X"] {
        assert!(!s.0.join("sub").join(n).exists(), "{n} was delivered");
    }
    same_files(
        &src,
        &s.0.join("sub"),
        &[names[0].clone(), names[3].clone()],
    );
}

#[test]
fn products_the_source_evicted_while_the_relay_was_down_are_reported_lost() {
    let s = Scratch::new("feed-relay-lost");
    let (src, sq, rq) = (s.0.join("src"), s.0.join("sq"), s.0.join("rq"));
    let names: Vec<String> = (1..=5).map(|i| format!("big-{i}")).collect();
    let files = write_files(&src, &names, |_| 400_000);
    let source = serve(&sq, "127.0.0.1:0", &["--queue-mib", "1"]);
    let raddr = free_port();
    let r = relay(&rq, &raddr, &source.addr, "ANY", &[]);
    insert(&source.addr, "NGRID", &files[..1]);
    wait_status(&raddr, 30, |st| st["upstream"]["relayed"] == 1);
    drop(r);
    // Four more into a 1 MiB queue: 2 and 3 are evicted before the relay is back.
    insert(&source.addr, "NGRID", &files[1..]);
    let _r = relay(&rq, &raddr, &source.addr, "ANY", &[]);
    let st = wait_status(&raddr, 30, |st| st["upstream"]["relayed"] == 2);
    assert_eq!(st["upstream"]["lost"], 2, "{st}");
    assert_eq!(st["first_seq"], 1, "{st}");
    assert_eq!(st["last_seq"], 5, "{st}");
    assert_eq!(st["products"], 3, "1, then 4 and 5 once each: {st}");
}

/// Stops `r` and starts the relay again on its queue; then a subscriber from 1 of everything
/// the relay holds: what it delivered and the ranges it was told are lost.
fn restart_and_read(
    r: Server,
    s: &Scratch,
    source: &str,
    tag: &str,
) -> (Server, Vec<u64>, Vec<(u64, u64)>) {
    let raddr = r.addr.clone();
    drop(r);
    let r = relay(
        &s.0.join("rq"),
        &raddr,
        source,
        "IDS",
        &["--queue-mib", "1"],
    );
    let out = subscribe(
        &raddr,
        &s.0.join(tag),
        &["--feedtype", "ANY", "--from", "1", "--duration", "4"],
    )
    .wait_with_output()
    .unwrap();
    let v = lines(&out);
    let lost = events(&v, "lost")
        .iter()
        .map(|l| (l["from"].as_u64().unwrap(), l["to"].as_u64().unwrap()))
        .collect();
    (r, delivered(&v), lost)
}

/// The relay's filter passes over products before its first (and later between two it
/// evicted and the next): after a restart its subscribers still hear of gaps, not losses.
#[test]
fn a_restarted_relay_does_not_report_what_its_filter_passed_over_as_lost() {
    let s = Scratch::new("feed-relay-floor");
    let (src, sq, rq) = (s.0.join("src"), s.0.join("sq"), s.0.join("rq"));
    let names: Vec<String> = (1..=5).map(|i| format!("p-{i}")).collect();
    // 1 and 4 are NEXRAD3 (not relayed); 3 and 5 fill most of the relay's 1 MiB queue.
    let files = write_files(&src, &names, |i| [100, 100, 600_000, 100, 600_000][i]);
    let source = serve(&sq, "127.0.0.1:0", &[]);
    let raddr = free_port();
    let r = relay(&rq, &raddr, &source.addr, "IDS", &["--queue-mib", "1"]);
    insert(&source.addr, "NEXRAD3", &files[..1]);
    insert(&source.addr, "IDS", &files[1..2]);
    wait_status(&raddr, 30, |st| st["upstream"]["relayed"] == 1);
    let (r, got, lost) = restart_and_read(r, &s, &source.addr, "first");
    assert_eq!(got, vec![2], "{lost:?}");
    assert_eq!(lost, vec![], "1 was passed over, not lost");
    // 3 in, 4 passed over, 5 evicts 2 and 3: gone below 4, a gap at 4.
    insert(&source.addr, "IDS", &files[2..3]);
    insert(&source.addr, "NEXRAD3", &files[3..4]);
    insert(&source.addr, "IDS", &files[4..5]);
    wait_status(&raddr, 30, |st| st["upstream"]["relayed"] == 2);
    let (_r, got, lost) = restart_and_read(r, &s, &source.addr, "second");
    assert_eq!(got, vec![5], "{lost:?}");
    assert_eq!(
        lost,
        vec![(1, 3)],
        "evicted 2 and 3 (and what came before) are lost, 4 is not"
    );
}
