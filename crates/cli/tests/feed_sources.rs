//! `bulkcast feed insert --watch DIR` and `--stdin` as real processes on loopback: files
//! that appear by rename and by slow writes in place arrive once, whole, also across a
//! restart of the watcher; framed stdin of 1,000 products with a bad tail.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::feed::{bin, events, lines, serve, status, subscribe};
use common::{Proc, Scratch};

/// A unicast subscriber from the start of the queue, until `n` products.
fn subscribe_n(addr: &str, dir: &Path, feedtype: &str, n: usize) -> Child {
    let n = n.to_string();
    let args = ["--unicast", "--from", "1", "--feedtype", feedtype];
    let until = ["--duration", "120", "--max-products", &n];
    subscribe(addr, dir, &[&args[..], &until[..]].concat())
}

/// Product names delivered, with how often.
fn delivered(out: &Output) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for v in events(&lines(out), "delivered") {
        *m.entry(v["name"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    m
}

fn queued(addr: &str) -> u64 {
    status(addr)["products"].as_u64().unwrap()
}

fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j * 131 + i * 17 + j / 251) as u8)
        .collect()
}

/// A watcher with the default settle time (1 s), its stderr into `log`.
fn watcher(addr: &str, dir: &Path, log: &Path, extra: &[&str]) -> Proc {
    Proc(
        bin()
            .args([
                "feed",
                "insert",
                "--server",
                addr,
                "--feedtype",
                "WX",
                "--watch",
            ])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Writes `data` in place in 8 chunks 150 ms apart (each pause far shorter than the settle
/// time, the whole write longer).
fn slow_write(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    for c in data.chunks(data.len().div_ceil(8)) {
        f.write_all(c).unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
}

#[test]
fn a_watched_directory_inserts_each_complete_file_once_across_restarts() {
    let s = Scratch::new("feed-watch");
    let (inbox, got) = (s.0.join("in"), s.0.join("got"));
    std::fs::create_dir_all(&inbox).unwrap();
    let server = serve(&s.0.join("q"), "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    let mut want: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    // There before the watcher starts.
    want.insert("early".into(), content(0, 70_000));
    std::fs::write(inbox.join("early"), &want["early"]).unwrap();
    let log = s.0.join("watch.log");
    let w = watcher(&addr, &inbox, &log, &[]);
    // Renamed into place after a write to a temporary name (which is never inserted).
    for i in 1..=20 {
        let name = format!("renamed {i}");
        want.insert(name.clone(), content(i, 1 + i * 9_973));
        let tmp = inbox.join(format!("{name}.tmp"));
        std::fs::write(&tmp, &want[&name]).unwrap();
        std::fs::rename(&tmp, inbox.join(&name)).unwrap();
    }
    // Written in place, slowly, three at a time; never ready before they are whole.
    let slow: Vec<_> = (21..24)
        .map(|i| {
            let name = format!("slow-{i}");
            let data = content(i, 400_000);
            want.insert(name.clone(), data.clone());
            let path = inbox.join(name);
            std::thread::spawn(move || slow_write(&path, &data))
        })
        .collect();
    std::fs::write(inbox.join(".hidden"), b"not a product").unwrap();
    std::fs::write(inbox.join("half.part"), b"not a product").unwrap();
    std::fs::create_dir(inbox.join("subdir")).unwrap();
    for t in slow {
        t.join().unwrap();
    }
    // Everything arrives; then the watcher restarts (killed hard) with --remove.
    let n = want.len();
    let first = subscribe_n(&addr, &got, "WX", n)
        .wait_with_output()
        .unwrap();
    let d = delivered(&first);
    assert_eq!(
        d.keys().cloned().collect::<Vec<_>>(),
        want.keys().cloned().collect::<Vec<_>>()
    );
    drop(w);
    let w = watcher(&addr, &inbox, &log, &["--remove"]);
    want.insert("after restart".into(), content(99, 5_000));
    std::fs::write(inbox.join("x.tmp"), &want["after restart"]).unwrap();
    std::fs::rename(inbox.join("x.tmp"), inbox.join("after restart")).unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while inbox.join("after restart").exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !inbox.join("after restart").exists(),
        "--remove deletes it once inserted"
    );
    // Two settle times more: nothing else is inserted (nothing twice).
    std::thread::sleep(Duration::from_millis(2500));
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(queued(&addr) as usize, want.len(), "{log}");
    assert!(
        inbox.join("early").exists(),
        "inserted before --remove: left alone"
    );
    let all = subscribe_n(&addr, &s.0.join("all"), "WX", want.len())
        .wait_with_output()
        .unwrap();
    let d = delivered(&all);
    assert!(d.values().all(|&c| c == 1), "{d:?}");
    assert_eq!(d.len(), want.len(), "{d:?}");
    for (name, data) in &want {
        let file = s.0.join("all").join(name.replace(' ', "_"));
        let file = if file.exists() {
            file
        } else {
            s.0.join("all").join(name)
        };
        assert_eq!(
            std::fs::read(&file).ok().as_ref(),
            Some(data),
            "{name}: whole, once"
        );
    }
    drop(w);
}

#[test]
fn a_missing_watched_directory_is_a_clear_error() {
    let s = Scratch::new("feed-watch-missing");
    let out = bin()
        .args(["feed", "insert", "--feedtype", "WX", "--watch"])
        .arg(s.0.join("nope"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("watched directory") && err.contains("nope"),
        "{err}"
    );
}

fn frame(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    out.extend_from_slice(format!("{name} {}\n", data.len()).as_bytes());
    out.extend_from_slice(data);
}

fn insert_stdin(addr: &str, input: &[u8]) -> Output {
    let mut c = bin()
        .args([
            "feed",
            "insert",
            "--stdin",
            "--feedtype",
            "IDS",
            "--server",
            addr,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = c.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = c.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

#[test]
fn framed_stdin_inserts_a_thousand_products_and_names_the_bad_tail() {
    let s = Scratch::new("feed-stdin");
    let server = serve(&s.0.join("q"), "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    let n = 1000;
    let mut input = Vec::new();
    for i in 0..n {
        frame(&mut input, &format!("p{i:04}"), &content(i, i * 37 % 3000));
    }
    // A truncated tail: the header says 100 bytes, 10 follow.
    input.extend_from_slice(b"bad tail 100\n0123456789");
    let out = insert_stdin(&addr, &input);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("frame 1001 (product \"bad tail\")") && err.contains("truncated: 10 of 100"),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), n);
    let sub = subscribe_n(&addr, &s.0.join("got"), "IDS", n)
        .wait_with_output()
        .unwrap();
    let d = delivered(&sub);
    assert_eq!(d.len(), n);
    assert!(d.values().all(|&c| c == 1));
    for i in 0..n {
        let got = std::fs::read(s.0.join("got").join(format!("p{i:04}"))).unwrap();
        assert_eq!(got, content(i, i * 37 % 3000), "p{i:04}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        queued(&addr) as usize,
        n,
        "the partial product is not queued"
    );
}

#[test]
fn framed_stdin_skips_a_refused_product_and_stops_at_a_malformed_header() {
    let s = Scratch::new("feed-stdin-bad");
    let server = serve(&s.0.join("q"), "127.0.0.1:0", &["--queue-mib", "1"]);
    let addr = server.addr.clone();
    let mut input = Vec::new();
    frame(&mut input, "ok1", b"abc");
    frame(&mut input, "big", &vec![7u8; 2 << 20]);
    frame(&mut input, "ok2", b"def");
    input.extend_from_slice(b"no-size-here\nok3 3\nghi");
    let out = insert_stdin(&addr, &input);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1 ok1\n2 ok2\n",
        "{err}"
    );
    assert!(
        err.contains("\"big\"") && err.contains("larger than the queue"),
        "{err}"
    );
    assert!(
        err.contains("frame 4") && err.contains("malformed header"),
        "{err}"
    );
    let names: BTreeSet<String> = delivered(
        &subscribe_n(&addr, &s.0.join("got"), "IDS", 2)
            .wait_with_output()
            .unwrap(),
    )
    .into_keys()
    .collect();
    assert_eq!(
        names,
        BTreeSet::from(["ok1".to_string(), "ok2".to_string()])
    );
}
