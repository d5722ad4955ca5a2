//! The feed tests' set-up: `feed serve`, `feed insert`, `feed subscribe` and `feed status` as
//! processes (in a network namespace if given), their JSON lines, and the files they move.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{bin_in, Proc};

/// The feed secret every feed test's processes share.
pub const SECRET: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// The binary with the feed secret set.
pub fn bin() -> Command {
    bin_ns(None)
}

/// [`bin`] inside network namespace `ns` if given.
pub fn bin_ns(ns: Option<&str>) -> Command {
    let mut c = bin_in(ns);
    c.env("BULKCAST_SECRET", SECRET);
    c
}

/// A `feed serve` process, killed on drop, and the address it listens on.
pub struct Server {
    pub proc: Proc,
    pub addr: String,
}

/// `feed serve --listen LISTEN --dir DIR EXTRA...`, once it listens.
pub fn serve(dir: &Path, listen: &str, extra: &[&str]) -> Server {
    serve_in(None, dir, listen, extra)
}

/// [`serve`] inside network namespace `ns` if given.
pub fn serve_in(ns: Option<&str>, dir: &Path, listen: &str, extra: &[&str]) -> Server {
    let child = bin_ns(ns)
        .args(["feed", "serve", "--listen", listen, "--dir"])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Owned at once: killed on drop, also when the first line is not what it should be.
    let mut proc = Proc(child);
    let mut line = String::new();
    BufReader::new(proc.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "bulkcast feed serving on ADDR, queue ..."
    let addr = line
        .split_whitespace()
        .nth(4)
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches(',')
        .to_string();
    Server { proc, addr }
}

/// A relay of `upstream` for feedtypes `feedtype`, from the upstream's first product.
pub fn relay(dir: &Path, listen: &str, upstream: &str, feedtype: &str, extra: &[&str]) -> Server {
    let args = [
        &[
            "--upstream",
            upstream,
            "--feedtype",
            feedtype,
            "--upstream-from",
            "1",
        ][..],
        extra,
    ]
    .concat();
    serve(dir, listen, &args)
}

/// `feed insert` of `files`, which must succeed.
pub fn insert(addr: &str, feedtype: &str, files: &[PathBuf]) -> Output {
    insert_in(None, addr, feedtype, files)
}

/// [`insert`] inside network namespace `ns` if given.
pub fn insert_in(ns: Option<&str>, addr: &str, feedtype: &str, files: &[PathBuf]) -> Output {
    insert_with(ns, addr, feedtype, files, &[] as &[&str])
}

/// [`insert_in`] with further options (keys, `--plaintext`).
pub fn insert_with(
    ns: Option<&str>,
    addr: &str,
    feedtype: &str,
    files: &[PathBuf],
    extra: &[impl AsRef<OsStr>],
) -> Output {
    let out = bin_ns(ns)
        .args(["feed", "insert", "--server", addr, "--feedtype", feedtype])
        .args(files)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "insert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `feed subscribe ADDR --json --dir DIR ARGS...`, its stdout and stderr piped.
pub fn subscribe(addr: &str, dir: &Path, args: &[&str]) -> Child {
    subscribe_in(None, addr, dir, args)
}

/// [`subscribe`] inside network namespace `ns` if given.
pub fn subscribe_in(ns: Option<&str>, addr: &str, dir: &Path, args: &[&str]) -> Child {
    bin_ns(ns)
        .args(["feed", "subscribe", addr, "--json", "--dir"])
        .arg(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The JSON lines of a finished subscriber.
pub fn lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The lines of event `ev`.
pub fn events<'a>(v: &'a [serde_json::Value], ev: &str) -> Vec<&'a serde_json::Value> {
    v.iter().filter(|l| l["event"] == ev).collect()
}

/// The sequence numbers delivered, in order.
pub fn delivered(v: &[serde_json::Value]) -> Vec<u64> {
    events(v, "delivered")
        .iter()
        .map(|l| l["seq"].as_u64().unwrap())
        .collect()
}

/// `feed status --json` of the server at `addr`.
pub fn status(addr: &str) -> serde_json::Value {
    let out = bin()
        .args(["feed", "status", "--json", "--server", addr])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Polls `addr`'s status until `ok` holds (panics after `secs`).
pub fn wait_status(
    addr: &str,
    secs: u64,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = status(addr);
        if ok(&st) {
            return st;
        }
        assert!(Instant::now() < end, "status never got there: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Files `DIR/NAME` of `size(i)` bytes, each different.
pub fn write_files(dir: &Path, names: &[String], size: impl Fn(usize) -> usize) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let p = dir.join(n);
            let data: Vec<u8> = (0..size(i)).map(|j| (j * 31 + i * 7) as u8).collect();
            std::fs::write(&p, data).unwrap();
            p
        })
        .collect()
}

/// Every file `names` of `a` is in `b`, the same.
pub fn same_files(a: &Path, b: &Path, names: &[String]) {
    for n in names {
        let (x, y) = (std::fs::read(a.join(n)).unwrap(), std::fs::read(b.join(n)));
        assert_eq!(Some(&x), y.as_ref().ok(), "{n} differs or is missing");
    }
}

/// A free port on loopback (for a server that restarts on the same address).
pub fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}
