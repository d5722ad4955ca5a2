//! `bulkcast feed` as real processes on loopback: subscribe, backlog across a restart, allow
//! rules, 10,000 small products, multicast on loopback.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command};

mod common;
use common::feed::{
    delivered, free_port, insert, insert_in, insert_with, lines, same_files, serve, serve_in,
    status, subscribe, subscribe_in, write_files, SECRET,
};
use common::{capture_group, root_test_cannot_run, Netns, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");

#[test]
fn subscribers_get_verified_files_and_the_backlog_survives_a_restart() {
    let s = Scratch::new("feed-restart");
    let (q, src, live, late) = (
        s.0.join("q"),
        s.0.join("src"),
        s.0.join("live"),
        s.0.join("late"),
    );
    let names: Vec<String> = (0..4).map(|i| format!("grid-{i}.bin")).collect();
    let files = write_files(&src, &names, |i| [0, 1, 300_000, 5_000_000][i]);
    let addr = free_port();
    let server = serve(&q, &addr, &[]);
    // A live subscriber, through the restart: products 1-2 before, 3-4 after.
    let sub = subscribe(
        &addr,
        &live,
        &[
            "--feedtype",
            "NGRID",
            "--unicast",
            "--max-products",
            "4",
            "--duration",
            "60",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    insert(&server.addr, "NGRID", &files[..2]);
    drop(server);
    let server = serve(&q, &addr, &[]);
    let out = insert(&server.addr, "NGRID", &files[2..]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().next().unwrap(),
        "3 grid-2.bin",
        "numbering goes on"
    );
    let out = sub.wait_with_output().unwrap();
    let v = lines(&out);
    assert_eq!(delivered(&v), vec![1, 2, 3, 4], "{v:?}");
    assert!(
        v.iter().any(|l| l["event"] == "disconnected"),
        "it saw the restart"
    );
    same_files(&src, &live, &names);
    // A late subscriber asks for the backlog from the start: everything, once.
    let out = subscribe(
        &addr,
        &late,
        &[
            "--feedtype",
            "ANY",
            "--from",
            "1",
            "--max-products",
            "4",
            "--duration",
            "30",
        ],
    )
    .wait_with_output()
    .unwrap();
    let v = lines(&out);
    assert_eq!(delivered(&v), vec![1, 2, 3, 4]);
    same_files(&src, &late, &names);
    let d = v.iter().find(|l| l["event"] == "delivered").unwrap();
    for k in ["waiting", "transmission", "repair", "total"] {
        assert!(d["latency_ms"][k].is_number(), "{d}");
    }
    // Restarted without --from, it resumes after what it has (nothing new: times out empty).
    let out = subscribe(&addr, &late, &["--feedtype", "ANY", "--duration", "1.5"])
        .wait_with_output()
        .unwrap();
    assert!(delivered(&lines(&out)).is_empty());
}

#[test]
fn allow_rules_refuse_and_filter_subscribers() {
    let s = Scratch::new("feed-allow");
    let src = s.0.join("src");
    let names: Vec<String> = vec!["a".into(), "b".into()];
    let files = write_files(&src, &names, |_| 1000);
    // Nobody on loopback may subscribe.
    let closed = serve(
        &s.0.join("q1"),
        "127.0.0.1:0",
        &["--allow", "10.0.0.0/8=ANY"],
    );
    insert(&closed.addr, "IDS", &files);
    let out = subscribe(
        &closed.addr,
        &s.0.join("r1"),
        &["--feedtype", "ANY", "--from", "1", "--duration", "5"],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not allowed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<_> = std::fs::read_dir(s.0.join("r1"))
        .map(|d| d.count())
        .into_iter()
        .collect();
    assert!(
        got.is_empty() || got == [0],
        "a refused subscriber got files"
    );
    // Loopback may have IDS only: the HDS product never reaches it.
    let open = serve(
        &s.0.join("q2"),
        "127.0.0.1:0",
        &["--allow", "127.0.0.1=IDS"],
    );
    insert(&open.addr, "HDS", &files[..1]);
    insert(&open.addr, "IDS", &files[1..]);
    let out = subscribe(
        &open.addr,
        &s.0.join("r2"),
        &["--feedtype", "ANY", "--from", "1", "--duration", "3"],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(delivered(&lines(&out)), vec![2]);
    assert!(!s.0.join("r2/a").exists() && s.0.join("r2/b").exists());
    // A wrong secret is refused before anything moves.
    let out = Command::new(BIN)
        .args([
            "feed",
            "subscribe",
            &open.addr,
            "--feedtype",
            "ANY",
            "--from",
            "1",
            "--duration",
            "5",
            "--dir",
        ])
        .arg(s.0.join("r3"))
        .env("BULKCAST_SECRET", "11".repeat(32))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!s.0.join("r3/b").exists());
}

#[test]
fn a_product_larger_than_the_queue_is_refused_clearly() {
    let s = Scratch::new("feed-large");
    let server = serve(&s.0.join("q"), "127.0.0.1:0", &["--queue-mib", "1"]);
    let files = write_files(&s.0.join("src"), &["big".into()], |_| (1 << 20) + 1);
    let out = Command::new(BIN)
        .args([
            "feed",
            "insert",
            "--server",
            &server.addr,
            "--feedtype",
            "X",
        ])
        .args(&files)
        .env("BULKCAST_SECRET", SECRET)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("larger than the queue"));
}

#[test]
fn ten_thousand_small_products_arrive_once_by_unicast_and_multicast() {
    let s = Scratch::new("feed-10k");
    let n = 10_000;
    let names: Vec<String> = (0..n).map(|i| format!("p{i:05}")).collect();
    let files = write_files(&s.0.join("src"), &names, |i| 1 + (i * 37) % 3000);
    let server = serve(
        &s.0.join("q"),
        "127.0.0.1:0",
        &[
            "--multicast",
            "239.255.71.9:17911",
            "--multicast-if",
            "127.0.0.1",
        ],
    );
    let max = n.to_string();
    let args = [
        "--feedtype",
        "IDS",
        "--max-products",
        &max,
        "--duration",
        "300",
    ];
    let uni = subscribe(
        &server.addr,
        &s.0.join("uni"),
        &[&args[..], &["--unicast"]].concat(),
    );
    let multi = subscribe(
        &server.addr,
        &s.0.join("multi"),
        &[&args[..], &["--iface", "127.0.0.1"]].concat(),
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    for chunk in files.chunks(2500) {
        insert(&server.addr, "IDS", chunk);
    }
    for (child, dir) in [(uni, "uni"), (multi, "multi")] {
        let out = child.wait_with_output().unwrap();
        let v = lines(&out);
        let seqs = delivered(&v);
        let unique: BTreeSet<u64> = seqs.iter().copied().collect();
        assert_eq!(unique.len(), seqs.len(), "{dir}: duplicates");
        assert_eq!(
            unique,
            (1..=n as u64).collect(),
            "{dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        same_files(&s.0.join("src"), &s.0.join(dir), &names);
        let sub = v.iter().find(|l| l["event"] == "subscribed").unwrap();
        assert_eq!(sub["transport"], dir_transport(dir), "{sub}");
    }
    assert_eq!(status(&server.addr)["products"], n);
}

fn dir_transport(dir: &str) -> &'static str {
    if dir == "uni" {
        "unicast"
    } else {
        "multicast"
    }
}

/// A network namespace with only `lo`, deleted on drop.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces, netem): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn multicast_repairs_real_loss_and_falls_back_where_it_cannot_go() {
    let s = Scratch::new("feed-netns");
    let ns = Netns::new("mc", "feed multicast in a namespace");
    // 3% of the group's datagrams lost on arrival, as seed 003's testbed injected loss.
    let lossy = [
        "iptables",
        "-A",
        "INPUT",
        "-d",
        "239.255.72.0/24",
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        "0.03",
        "-j",
        "DROP",
    ];
    if !ns.run(&lossy) {
        root_test_cannot_run(
            "feed multicast in a namespace",
            "iptables' statistic match is not available",
        );
    }
    let names: Vec<String> = (0..40).map(|i| format!("radar-{i}")).collect();
    let files = write_files(&s.0.join("src"), &names, |i| 1000 + i * 5000);
    let n = Some(ns.0.as_str());
    let server = serve_in(
        n,
        &s.0.join("q"),
        "127.0.0.1:0",
        &[
            "--multicast",
            "239.255.72.1:17921",
            "--multicast-if",
            "127.0.0.1",
            "--rate-mbps",
            "50",
        ],
    );
    let args = [
        "--feedtype",
        "NEXRAD3",
        "--iface",
        "127.0.0.1",
        "--max-products",
        "40",
        "--duration",
        "120",
    ];
    let subs: Vec<Child> = (0..2)
        .map(|i| subscribe_in(n, &server.addr, &s.0.join(format!("m{i}")), &args))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    insert_in(n, &server.addr, "NEXRAD3", &files);
    for (i, c) in subs.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let v = lines(&out);
        // Each product once, whole; under loss a later product can complete before an
        // earlier one that waits for its repair, so the order is not checked.
        let mut got = delivered(&v);
        got.sort_unstable();
        assert_eq!(
            got,
            (1..=40).collect::<Vec<u64>>(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        same_files(&s.0.join("src"), &s.0.join(format!("m{i}")), &names);
        assert!(
            v.iter()
                .any(|l| l["transport"] == "multicast" && l["repaired_bytes"].as_u64() > Some(0)),
            "some product was repaired"
        );
        // Repaired by parity on the group (blocks rebuilt), not only by unicast.
        assert!(
            v.iter()
                .any(|l| l["event"] == "summary" && l["stats"]["decoded"].as_u64() > Some(0)),
            "no block was rebuilt from parity: {:?}",
            v.last()
        );
        assert!(!v.iter().any(|l| l["event"] == "fallback"));
    }
    drop(server);
    // Without --multicast-if the namespace has no route for the group: nothing is sent, and
    // the subscriber falls back to unicast on its own.
    let server = serve_in(
        n,
        &s.0.join("q2"),
        "127.0.0.1:0",
        &["--multicast", "239.255.72.2:17922"],
    );
    let sub = subscribe_in(
        n,
        &server.addr,
        &s.0.join("fb"),
        &[
            "--feedtype",
            "ANY",
            "--fallback-after",
            "1",
            "--max-products",
            "40",
            "--duration",
            "60",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    insert_in(n, &server.addr, "NEXRAD3", &files);
    let out = sub.wait_with_output().unwrap();
    let v = lines(&out);
    assert!(v.iter().any(|l| l["event"] == "fallback"), "{v:?}");
    assert_eq!(delivered(&v).len(), 40);
    same_files(&s.0.join("src"), &s.0.join("fb"), &names);
}

fn keygen(path: &Path) -> String {
    let out = Command::new(BIN).arg("keygen").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Issue 32: with host keys a feed admits only the keys on its allow list, and its products
/// are signed by its key (subscribers check them against theirs).
#[test]
fn host_keys_admit_feed_subscribers_by_key() {
    let s = Scratch::new("feed-keys");
    let key = |n: &str| {
        let p = s.0.join(format!("{n}.key"));
        (keygen(&p), p)
    };
    let ((srv_pub, srv_key), (sub_pub, sub_key), (_, stranger_key)) =
        (key("srv"), key("sub"), key("stranger"));
    let list = |name: &str, text: String| {
        let p = s.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // The server admits the subscriber (which also inserts); both clients list the server.
    let srv_allow = list("srv.allow", format!("{sub_pub} sub\n"));
    let to_srv = list("clients.allow", format!("{srv_pub} feed\n"));
    let id = |k: &Path, a: &Path| {
        vec![
            "--key".to_string(),
            k.to_str().unwrap().to_string(),
            "--allow-keys".to_string(),
            a.to_str().unwrap().to_string(),
        ]
    };
    let srv_id = id(&srv_key, &srv_allow);
    let srv_args: Vec<&str> = srv_id.iter().map(String::as_str).collect();
    let server = serve(&s.0.join("q"), "127.0.0.1:0", &srv_args);
    let names: Vec<String> = vec!["a".into()];
    let files = write_files(&s.0.join("src"), &names, |_| 3000);
    let sub_id = id(&sub_key, &to_srv);
    insert_with(None, &server.addr, "IDS", &files, &sub_id);
    let sub = |k: &Path, dir: &str| {
        let mut args = vec!["--feedtype", "ANY", "--from", "1", "--duration", "3"];
        let ident = id(k, &to_srv);
        args.extend(ident.iter().map(String::as_str));
        subscribe(&server.addr, &s.0.join(dir), &args)
            .wait_with_output()
            .unwrap()
    };
    // On the list: the signed product arrives intact.
    let out = sub(&sub_key, "r1");
    assert_eq!(
        delivered(&lines(&out)),
        vec![1],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    same_files(&s.0.join("src"), &s.0.join("r1"), &names);
    // Not on the list: refused before anything moves.
    let out = sub(&stranger_key, "r2");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow list"), "{err}");
    assert!(!s.0.join("r2/a").exists());
}

/// A relay between subscribers and the server that keeps every byte either way, as a third
/// party on the path sees the connections.
struct Tap {
    addr: String,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Tap {
    fn start(upstream: &str) -> Tap {
        use std::sync::{Arc, Mutex};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (up, s) = (upstream.to_string(), seen.clone());
        // Ends with the test process (the listener is never closed before).
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let Ok(u) = std::net::TcpStream::connect(&up) else {
                    continue;
                };
                let pipe = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        while let Ok(n @ 1..) = std::io::Read::read(&mut from, &mut buf) {
                            s.lock().unwrap().extend_from_slice(&buf[..n]);
                            if std::io::Write::write_all(&mut to, &buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Write);
                    });
                };
                pipe(c.try_clone().unwrap(), u.try_clone().unwrap());
                pipe(u, c);
            }
        });
        Tap { addr, seen }
    }

    fn bytes(&self) -> Vec<u8> {
        self.seen.lock().unwrap().clone()
    }
}

/// One subscriber's run: its JSON lines (`rest`: those read already) and its stderr.
fn finish_subscriber(
    mut child: Child,
    mut out: BufReader<std::process::ChildStdout>,
    mut rest: String,
) -> (Vec<serde_json::Value>, String) {
    use std::io::Read;
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    let v = rest
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (v, err)
}

/// What a third party sees of one product going to a multicast and a unicast subscriber:
/// the group's datagrams and both connections' bytes. Each subscriber's lines and stderr.
struct Seen {
    group: Vec<Vec<u8>>,
    conns: Vec<u8>,
    subs: Vec<(Vec<serde_json::Value>, String)>,
}

fn feed_seen(
    s: &Scratch,
    product: &Path,
    serve_extra: &[&str],
    sub_extra: &[&str],
    tag: &str,
) -> Seen {
    use std::sync::{atomic::AtomicBool, Arc};
    let group = format!("239.255.72.{}:{}", 40, 21_000 + std::process::id() % 20_000);
    let mut args = vec!["--multicast", &group, "--multicast-if", "127.0.0.1"];
    args.extend(serve_extra);
    let server = serve(&s.0.join(format!("{tag}-q")), "127.0.0.1:0", &args);
    let tap = Tap::start(&server.addr);
    let stop = Arc::new(AtomicBool::new(false));
    let cap = capture_group(
        &group,
        &bulkcast_proto::feed::seal::DGRAM_MAGIC,
        stop.clone(),
    );
    let mut subs = Vec::new();
    for mode in ["--iface", "--unicast"] {
        let mut a = vec![
            "--feedtype",
            "IDS",
            "--max-products",
            "1",
            "--duration",
            "30",
        ];
        a.extend(if mode == "--unicast" {
            vec![mode]
        } else {
            vec![mode, "127.0.0.1"]
        });
        a.extend(sub_extra);
        let mut child = subscribe(&tap.addr, &s.0.join(format!("{tag}{mode}")), &a);
        let mut out = BufReader::new(child.stdout.take().unwrap());
        // Subscribed before the product is queued: it goes by the group, not the backlog.
        let mut lines = String::new();
        while !lines.contains("\"subscribed\"") {
            assert!(out.read_line(&mut lines).unwrap() > 0, "{tag}: {lines}");
        }
        subs.push((child, out, lines));
    }
    insert_with(
        None,
        &server.addr,
        "IDS",
        &[product.to_path_buf()],
        sub_extra,
    );
    let subs: Vec<_> = subs
        .into_iter()
        .map(|(c, o, l)| finish_subscriber(c, o, l))
        .collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let group = cap.join().unwrap();
    for (mode, (v, err)) in ["--iface", "--unicast"].iter().zip(&subs) {
        assert_eq!(delivered(v), vec![1], "{tag} {mode}: {err}");
        let got = std::fs::read(s.0.join(format!("{tag}{mode}")).join("obj.bin")).unwrap();
        assert!(
            got == std::fs::read(product).unwrap(),
            "{tag} {mode}: wrong bytes"
        );
    }
    Seen {
        group,
        conns: tap.bytes(),
        subs,
    }
}

/// The group's datagrams and the subscribers' connections are encrypted by default: a
/// listener on the group and a relay on the connections see none of a product's bytes.
/// With `--plaintext` on both ends they go in clear (so the check can fail). A server alone
/// in plaintext: the subscriber refuses its group, says why, and takes the product over its
/// encrypted connection; a subscriber alone in plaintext takes the sealed group.
#[test]
fn feed_datagrams_and_connections_are_encrypted_unless_both_ends_choose_plaintext() {
    let s = Scratch::new("feed-seal");
    let pattern = b"<<bulkcast feed: a recognisable product pattern 0123456789>>";
    let product = s.0.join("obj.bin");
    let body: Vec<u8> = pattern.iter().copied().cycle().take(600_000).collect();
    std::fs::write(&product, &body).unwrap();
    let shows = |d: &[u8]| d.windows(pattern.len()).any(|w| w == pattern);
    let by = |v: &[serde_json::Value]| {
        v.iter()
            .find(|l| l["event"] == "delivered")
            .map(|l| l["transport"].clone())
            .unwrap()
    };
    // Default: sealed. The product is ~430 data datagrams; the listener must have heard
    // them go by, and the unicast subscriber's connection carried the product.
    let seen = feed_seen(&s, &product, &[], &[], "sealed");
    assert!(
        seen.group.len() >= 200,
        "only {} datagrams seen",
        seen.group.len()
    );
    assert!(
        !seen.group.iter().any(|d| shows(d)),
        "the group carried the product in clear"
    );
    assert!(
        seen.conns.len() > body.len(),
        "{} bytes relayed",
        seen.conns.len()
    );
    assert!(
        !shows(&seen.conns),
        "a connection carried the product in clear"
    );
    assert_eq!(by(&seen.subs[0].0), "multicast");
    // Both ends plaintext: the product is on the wire, on the group and on the connection.
    let seen = feed_seen(&s, &product, &["--plaintext"], &["--plaintext"], "plain");
    assert!(
        seen.group.iter().any(|d| shows(d)),
        "{} datagrams, none in clear",
        seen.group.len()
    );
    assert!(shows(&seen.conns), "no connection in clear");
    assert_eq!(by(&seen.subs[0].0), "multicast");
    // The server alone: the multicast subscriber refuses the clear group, says why, and the
    // product comes over its encrypted connection.
    let seen = feed_seen(&s, &product, &["--plaintext"], &[], "mixed");
    let (v, err) = &seen.subs[0];
    assert!(err.contains("refusing the feed's multicast group"), "{err}");
    assert!(
        v.iter().any(|l| l["event"] == "refused_clear_group"),
        "{v:?}"
    );
    assert_eq!(by(v), "unicast");
    assert!(
        !shows(&seen.conns),
        "a connection carried the product in clear"
    );
    assert!(
        !seen.group.iter().any(|d| shows(d)),
        "refused, yet the group carried it in clear"
    );
    // The subscribers alone: the server seals the group and the connections anyway.
    let seen = feed_seen(&s, &product, &[], &["--plaintext"], "subplain");
    assert_eq!(by(&seen.subs[0].0), "multicast");
    assert!(!seen.group.iter().any(|d| shows(d)) && !shows(&seen.conns));
}
