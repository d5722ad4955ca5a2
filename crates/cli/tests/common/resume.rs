//! What the resume tests share: sends with a JSON report, partial copies on disk, and the
//! kill-resume-unchanged scenario every strategy goes through.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{spawn_agent, Agent};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");

/// An agent on an ephemeral loopback port.
pub fn agent(dir: &Path, secret: &str) -> Agent {
    spawn_agent(dir, &["127.0.0.1:0"], |c| {
        c.env("BULKCAST_SECRET", secret);
    })
}

pub fn send_cmd(src: &Path, to: &str, extra: &[&str], secret: &str) -> Command {
    let mut c = Command::new(BIN);
    c.arg("send")
        .arg(src)
        .args(["--to", to, "--json", "--quiet", "--chunk-kib", "256"])
        .args(extra)
        .env("BULKCAST_SECRET", secret)
        // Probe caches of tests stay out of the user's home.
        .env(
            "XDG_CACHE_HOME",
            std::env::temp_dir().join("bulkcast-it-cache"),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

pub fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The size of the partial copy in `dir`, if there is one.
pub fn part_len(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        n.ends_with(".part")
            .then(|| e.metadata().ok())
            .flatten()
            .map(|m| m.len())
    })
}

/// The bytes of the files under `dir` (links not followed).
pub fn tree_len(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_dir() => tree_len(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// The size of the partial tree (a directory's copy) in `dir`, if there is one.
pub fn part_tree_len(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        (n.ends_with(".part") && e.path().is_dir()).then(|| tree_len(&e.path()))
    })
}

/// Waits until `dir`'s partial copy holds at least `len` bytes (or panics after 60 s).
pub fn wait_for_part(dir: &Path, len: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while part_len(dir)
        .unwrap_or(0)
        .max(part_tree_len(dir).unwrap_or(0))
        < len
    {
        assert!(Instant::now() < deadline, "no partial copy of {len} bytes");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Bytes of the chunks (of `chunk` bytes) the partial copy in `dir` recorded as written: its
/// map's records. Unlike the file's length, this counts what a swarm wrote at random offsets.
pub fn mapped_len(dir: &Path, chunk: u64) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".map"))
        .filter_map(|e| e.metadata().ok())
        // A header of 52 bytes, then 40 per chunk.
        .map(|m| m.len().saturating_sub(52) / 40 * chunk)
        .max()
        .unwrap_or(0)
}

/// Waits until the partial copy in `dir` recorded at least `len` bytes (or panics after 60 s).
pub fn wait_for_map(dir: &Path, len: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while mapped_len(dir, 256 << 10) < len {
        assert!(Instant::now() < deadline, "no partial copy of {len} bytes");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

pub fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// How a scenario sends: the arguments of the send that is cut and of the one that resumes,
/// those of the send of the unchanged object, and the `--to` for two agents' addresses (a
/// list, or a hosts file written for them).
pub struct Way<'a> {
    pub args: &'a [&'a str],
    pub unchanged: &'a [&'a str],
    pub to: &'a dyn Fn(&str, &str) -> String,
}

/// The two agents' addresses as a list.
pub fn listed(a: &str, b: &str) -> String {
    format!("{a},{b}")
}

/// Sends `src` (`len` bytes) to two agents and kills the second a quarter in: the send fails
/// for it alone and `kept` finds its partial copy. Restarted, it resumes, moving at most what it
/// lacked plus 1%, while the first, whole already, moves nothing; a third send of the
/// unchanged object moves no payload to either. Returns the two agents.
pub fn kill_resume_and_send_unchanged(
    src: &Path,
    len: u64,
    key: &str,
    kept: impl Fn(&Path) -> bool,
    way: &Way,
) -> (Agent, Agent) {
    let root = src.parent().unwrap();
    let a = agent(&root.join("a"), key);
    let mut b = agent(&root.join("b"), key);
    let to = (way.to)(&a.addr, &b.addr);
    let sender = send_cmd(src, &to, way.args, key).spawn().unwrap();
    wait_for_map(&b.dir, len / 4);
    b.child.kill().unwrap(); // SIGKILL, mid-transfer
    b.child.wait().unwrap();
    let out = sender.wait_with_output().unwrap();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r}");
    assert_eq!(r["receivers"][0]["verified"], true, "{r}");
    assert_eq!(r["receivers"][1]["verified"], false, "{r}");
    assert!(kept(&b.dir), "the partial copy is gone");

    // Restarted, it resumes: the send moves only what it lacks, plus at most 1%.
    b = agent(&b.dir, key);
    let to = (way.to)(&a.addr, &b.addr);
    let out = send_cmd(src, &to, way.args, key).output().unwrap();
    let r = report(&out);
    assert!(out.status.success(), "{r}");
    let rb = &r["receivers"][1];
    let held = u(&rb["held_bytes"]);
    assert!(held >= len / 8, "kept only {held} bytes: {r}");
    let missing = len - held;
    eprintln!(
        "{}: held {held}, missing {missing}, moved {} ({} bytes)",
        way.args.join(" "),
        rb["received_bytes"],
        len
    );
    assert!(
        u(&rb["received_bytes"]) <= missing + len / 100,
        "moved {} for {missing} missing: {r}",
        rb["received_bytes"]
    );
    // The first receiver had it all already.
    assert_eq!(r["receivers"][0]["already_in_place"], true, "{r}");
    assert_eq!(u(&r["receivers"][0]["received_bytes"]), 0, "{r}");

    // Unchanged: no payload moves at all, and the report says why.
    let out = send_cmd(src, &to, way.unchanged, key).output().unwrap();
    let r = report(&out);
    assert!(out.status.success(), "{r}");
    for rx in r["receivers"].as_array().unwrap() {
        assert_eq!(rx["already_in_place"], true, "{r}");
        assert_eq!(u(&rx["received_bytes"]), 0, "{r}");
    }
    (a, b)
}
