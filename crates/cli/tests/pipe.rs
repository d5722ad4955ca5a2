//! `bulkcast pipe` on loopback: one stream over parallel connections with every scheduler, over
//! the paced UDP transport, and to nobody.

use std::path::Path;
use std::process::{Command, Stdio};

// Not every helper in `common` is used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::run::{report, BIN};
use common::{first_line, hash, listen_addrs, make_file, secret, Proc, Scratch};

const MIB: u64 = 1 << 20;

/// `pipe recv` on loopback, and what it wrote to stdout.
struct PipeRecv {
    child: Proc,
    addrs: Vec<String>,
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
    PipeRecv {
        child: Proc(child),
        addrs,
    }
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
