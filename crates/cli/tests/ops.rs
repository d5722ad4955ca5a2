//! Running bulkcast in production, tried as its users do: the README's promises about the
//! report and exit codes, the metrics endpoint, plots of a report. Real processes on loopback;
//! no root.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A scratch directory of this test process, removed on drop (also when an assertion fails).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("bulkcast-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// An agent process, killed on drop.
struct Agent {
    child: Child,
    addr: String,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn secret(b: u8) -> String {
    format!("{b:02x}").repeat(32)
}

/// Reads one line byte by byte, leaving the rest of the stream unread.
fn first_line(r: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while r.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}

/// An agent on an ephemeral loopback port, with further arguments.
fn agent(dir: &Path, secret: &str, extra: &[&str]) -> Agent {
    let mut child = Command::new(BIN)
        .args(["agent", "--listen", "127.0.0.1:0", "--dir"])
        .arg(dir)
        .args(extra)
        .env("BULKCAST_SECRET", secret)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = first_line(child.stdout.as_mut().unwrap());
    let addr = line
        .split(" listening on ")
        .nth(1)
        .and_then(|r| r.split([',', ' ']).next())
        .unwrap_or_else(|| panic!("agent said {line:?}"))
        .to_string();
    Agent { child, addr }
}

fn agents(root: &Path, n: usize, secret: &str) -> Vec<Agent> {
    (0..n)
        .map(|i| agent(&root.join(format!("r{i}")), secret, &[]))
        .collect()
}

fn to_list(agents: &[Agent]) -> String {
    let v: Vec<&str> = agents.iter().map(|a| a.addr.as_str()).collect();
    v.join(",")
}

/// Writes `len` pseudo-random bytes.
fn make_file(path: &Path, len: u64) {
    let mut xof = blake3::Hasher::new()
        .update(path.as_os_str().as_encoded_bytes())
        .finalize_xof();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut buf = vec![0u8; MIB as usize];
    let mut left = len;
    while left > 0 {
        let n = left.min(MIB) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
}

fn send(args: &[&str], secret: &str) -> Output {
    Command::new(BIN)
        .arg("send")
        .args(args)
        .arg("--json")
        .env("BULKCAST_SECRET", secret)
        .env_remove("BULKCAST_LOG")
        .output()
        .unwrap()
}

fn report(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap()
}

/// The text of the README from the heading `title` to the next heading of any level.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text
        .find(title)
        .unwrap_or_else(|| panic!("README has no {title:?}"));
    let body = &text[start + title.len()..];
    let end = body
        .match_indices("\n#")
        .map(|(i, _)| i)
        .next()
        .unwrap_or(body.len());
    &body[..end]
}

/// Every `"key":` in the README's ```json blocks of `text`.
fn json_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for block in text.split("```json").skip(1) {
        let block = block.split("```").next().unwrap();
        for piece in block.split('"').collect::<Vec<_>>().windows(2) {
            if piece[1].trim_start().starts_with(':') && !piece[0].contains(' ') {
                keys.insert(piece[0].to_string());
            }
        }
    }
    keys
}

/// Every key at any depth of a JSON value.
fn keys_of(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.insert(k.clone());
                keys_of(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys_of(v, out)),
        _ => {}
    }
}

/// The exit codes the README lists under "`send` exits with one of these codes", with their
/// text.
fn documented_exit_codes(text: &str) -> Vec<(i32, String)> {
    let list = text
        .split("`send` exits with one of these codes:")
        .nth(1)
        .expect("README lists send's exit codes");
    let mut codes: Vec<(i32, String)> = Vec::new();
    for line in list.lines().skip(1) {
        if let Some(item) = line.strip_prefix("- ") {
            let (n, what) = item.split_once(':').expect("`- N: meaning`");
            codes.push((n.trim().parse().unwrap(), what.to_string()));
        } else if line.starts_with("  ") && !codes.is_empty() {
            codes.last_mut().unwrap().1 += line;
        } else {
            break;
        }
    }
    codes
}

/// The README's report example and its swarm example name keys the binary really prints, and
/// its list of exit codes is what `send` really returns, case by case: a reader can script
/// against either.
#[test]
fn readme_report_keys_and_exit_codes_match_the_binary() {
    let s = Scratch::new("ops-readme");
    let text = readme();
    let key = secret(71);
    let ags = agents(&s.0.join("rx"), 3, &key);
    let file = s.0.join("w.bin");
    make_file(&file, 3 * MIB + 77);

    // A tree send over striped edges (two connections) prints the report example's keys.
    let out = send(
        &[
            file.to_str().unwrap(),
            "--to",
            &to_list(&ags[..2]),
            "--streams",
            "2",
            "--quiet",
        ],
        &key,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut got = BTreeSet::new();
    keys_of(&report(&out), &mut got);
    let want = json_keys(section(&text, "### The report (`--json`)"));
    assert!(
        want.len() > 20,
        "README report example lost its keys: {want:?}"
    );
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "README report keys not printed: {missing:?}"
    );

    // A mob send over two sites prints the swarm example's keys.
    let hosts = s.0.join("hosts.toml");
    let mut toml = "[source]\nname = \"src\"\nsite = \"a\"\n".to_string();
    for (i, a) in ags.iter().enumerate() {
        let site = ["a", "b", "b"][i];
        toml += &format!(
            "[[host]]\nname = \"h{i}\"\naddr = \"{}\"\nsite = \"{site}\"\n",
            a.addr
        );
    }
    std::fs::write(&hosts, toml).unwrap();
    let out = send(
        &[
            file.to_str().unwrap(),
            "--to",
            hosts.to_str().unwrap(),
            "--strategy",
            "mob",
            "--quiet",
        ],
        &key,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut got = BTreeSet::new();
    keys_of(&report(&out), &mut got);
    let want = json_keys(section(&text, "### Swarming"));
    assert!(want.contains("wan_bytes_in"), "{want:?}");
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "README swarm keys not printed: {missing:?}"
    );

    // Each documented exit code, brought about as the README describes it.
    let codes = documented_exit_codes(&text);
    let numbers: Vec<i32> = codes.iter().map(|c| c.0).collect();
    assert_eq!(numbers, [0, 1, 2, 3], "{codes:?}");
    let meaning = |n: i32| codes.iter().find(|c| c.0 == n).unwrap().1.clone();

    // 1: a receiver that is not there.
    let dead = format!("{},127.0.0.1:1", ags[0].addr);
    let out = send(&[file.to_str().unwrap(), "--to", &dead, "--quiet"], &key);
    assert_eq!(out.status.code(), Some(1), "{}: {out:?}", meaning(1));
    let err = String::from_utf8_lossy(&out.stderr);
    // Said once, in the report, with no raw log line among it; the headline's rate is the
    // verified receiver's, not the failed one's 0.
    assert_eq!(err.matches("Connection refused").count(), 1, "{err}");
    assert!(!err.contains(" WARN ") && !err.contains("ERROR"), "{err}");
    assert!(err.contains("slowest of the 1 verified; 1 failed"), "{err}");
    assert!(!err.contains(" 0.0 Mbit/s per receiver"), "{err}");

    // 2: could not start (no such input) ...
    let out = send(&["/nonexistent/x", "--to", &ags[0].addr], &key);
    assert_eq!(out.status.code(), Some(2), "{}: {out:?}", meaning(2));
    // ... or interrupted: SIGTERM during a stream that never ends.
    assert!(meaning(2).contains("interrupted"), "{}", meaning(2));
    let mut child = Command::new(BIN)
        .args(["send", "-", "--name", "s", "--quiet", "--to", &ags[0].addr])
        .env("BULKCAST_SECRET", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![7u8; MIB as usize]).unwrap();
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let out = wait_output(child, Duration::from_secs(20));
    drop(stdin);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("interrupted"),
        "{out:?}"
    );

    // 3: a directory with an entry that cannot be carried (a socket).
    let dir = s.0.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    make_file(&dir.join("a.bin"), 1000);
    let _sock = std::os::unix::net::UnixListener::bind(dir.join("sock")).unwrap();
    let out = send(
        &[dir.to_str().unwrap(), "--to", &ags[0].addr, "--quiet"],
        &key,
    );
    assert_eq!(out.status.code(), Some(3), "{}: {out:?}", meaning(3));
    assert_eq!(report(&out)["ok"], true);
}

/// Waits for a child at most `limit`, killing it past that.
fn wait_output(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{BIN} did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}
