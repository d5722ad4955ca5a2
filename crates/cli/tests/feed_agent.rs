//! An agent's subscriptions (`[[feed]]` in `agent --config`, LDM's `REQUEST` lines) as real
//! processes on loopback: each gets exactly its products, resumes across an agent restart with
//! nothing twice and nothing missed, follows its config on SIGHUP, and a bad line stops the
//! agent at its start with the line named.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::feed::{bin, insert, serve};
use common::{Proc, Scratch};

/// Inserts one product named `name` of `feedtype`; returns its sequence number.
fn insert_one(addr: &str, src: &Path, name: &str, feedtype: &str) -> u64 {
    let p = src.join(name);
    let data: Vec<u8> = (0..(name.len() * 997)).map(|j| (j * 31) as u8).collect();
    std::fs::write(&p, data).unwrap();
    let out = insert(addr, feedtype, &[p]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no sequence number in {text:?}"))
}

/// A running agent and its log (stderr), collected as it comes.
struct AgentProc {
    proc: Proc,
    log: Arc<Mutex<Vec<String>>>,
}

fn agent(config: &Path) -> AgentProc {
    let mut child = bin()
        .args(["agent", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .env("BULKCAST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening on"), "{line:?}");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (err, l) = (child.stderr.take().unwrap(), log.clone());
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    AgentProc {
        proc: Proc(child),
        log,
    }
}

impl AgentProc {
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(self.proc.0.id() as i32, sig) }, 0);
    }

    /// SIGTERM; waits for a clean exit; returns its log.
    fn stop(mut self) -> Vec<String> {
        self.signal(libc::SIGTERM);
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.proc.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "agent did not stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "agent exit {status}");
        // The reader thread sees the end of stderr shortly after the exit.
        std::thread::sleep(Duration::from_millis(200));
        self.log.lock().unwrap().clone()
    }

    fn log_has(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }
}

/// The products of `dir` (hidden files, the position and partial products, left out).
fn files(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (30 s at most) until `dir` holds `want`, then checks each is `src`'s file.
fn wait_for(dir: &Path, src: &Path, want: &BTreeSet<String>) {
    let start = Instant::now();
    while files(dir) != *want && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(files(dir), *want, "{}", dir.display());
    for n in want {
        assert_eq!(
            std::fs::read(src.join(n)).unwrap(),
            std::fs::read(dir.join(n)).unwrap(),
            "{n} differs"
        );
    }
}

/// The sequence numbers the log says `label` delivered, in order.
fn delivered(log: &[String], label: &str) -> Vec<u64> {
    let tag = format!("feed {label}: product ");
    log.iter()
        .filter_map(|l| l.split_once(&tag))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .collect()
}

fn names(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn config(path: &Path, agent_dir: &Path, feeds: &[String]) {
    let mut text = format!("dir = {:?}\n", agent_dir);
    for f in feeds {
        text.push_str("\n[[feed]]\n");
        text.push_str(f);
    }
    std::fs::write(path, text).unwrap();
}

fn feed(source: &str, feedtype: &str, dir: &Path, extra: &str) -> String {
    format!("source = {source:?}\nfeedtype = {feedtype:?}\ndir = {dir:?}\n{extra}")
}

#[test]
fn agent_feeds_get_their_products_and_resume_across_a_restart() {
    let s = Scratch::new("feed-agent");
    let (q, src, radar, text, cfg) = (
        s.0.join("q"),
        s.0.join("src"),
        s.0.join("radar"),
        s.0.join("text"),
        s.0.join("agent.toml"),
    );
    std::fs::create_dir_all(&src).unwrap();
    let server = serve(&q, "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    let execlog = s.0.join("exec.log");
    config(
        &cfg,
        &s.0.join("agent"),
        &[
            feed(
                &addr,
                "NEXRAD3",
                &radar,
                &format!(
                    "from = \"1\"\nexec = \"echo $BULKCAST_SEQ >> {}\"\n",
                    execlog.display()
                ),
            ),
            // A name regex too: IDS products named `warn-*` are not wanted.
            feed(
                &addr,
                "IDS|NGRID",
                &text,
                "from = \"1\"\nname = \"^(bulletin|grid)\"\nunicast = true\n",
            ),
        ],
    );
    // Some products before the agent starts (`from = "1"` takes them), some after.
    let mut seqs: BTreeMap<String, u64> = BTreeMap::new();
    let mut put = |name: &str, ft: &str| {
        seqs.insert(name.to_string(), insert_one(&addr, &src, name, ft));
    };
    put("radar-1", "NEXRAD3");
    put("bulletin-1", "IDS");
    put("other-1", "HDS");
    let a = agent(&cfg);
    put("grid-1", "NGRID");
    put("warn-1", "IDS");
    put("radar-2", "NEXRAD3");
    wait_for(&radar, &src, &names(&["radar-1", "radar-2"]));
    wait_for(&text, &src, &names(&["bulletin-1", "grid-1"]));
    assert!(a.log_has(&format!("feed NEXRAD3 from {addr}: subscribed")));
    let first = a.stop();
    // While it is down, then after it is back.
    put("radar-3", "NEXRAD3");
    put("bulletin-2", "IDS");
    let a = agent(&cfg);
    put("radar-4", "NEXRAD3");
    put("grid-2", "NGRID");
    put("warn-2", "IDS");
    let (all_radar, all_text) = (
        names(&["radar-1", "radar-2", "radar-3", "radar-4"]),
        names(&["bulletin-1", "bulletin-2", "grid-1", "grid-2"]),
    );
    wait_for(&radar, &src, &all_radar);
    wait_for(&text, &src, &all_text);
    assert!(
        a.log_has("(where it stopped)"),
        "the second run resumes from the saved position"
    );
    let second = a.stop();
    // Nothing twice, nothing missed, across the restart: the log's deliveries per feed are
    // exactly the products wanted, each once; so are the exec's runs.
    for (label, want) in [
        (format!("NEXRAD3 from {addr}"), &all_radar),
        (format!("IDS|NGRID from {addr}"), &all_text),
    ] {
        let mut got = delivered(&first, &label);
        let again = delivered(&second, &label);
        assert!(!again.is_empty(), "{label}: nothing after the restart");
        got.extend(again);
        let mut want: Vec<u64> = want.iter().map(|n| seqs[n]).collect();
        want.sort();
        let mut sorted = got.clone();
        sorted.sort();
        assert_eq!(sorted, want, "{label}: delivered {got:?}");
    }
    let mut ran: Vec<u64> = std::fs::read_to_string(&execlog)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    ran.sort();
    let mut want: Vec<u64> = all_radar.iter().map(|n| seqs[n]).collect();
    want.sort();
    assert_eq!(ran, want, "exec ran once per product");
}

#[test]
fn sighup_starts_added_feeds_and_stops_removed_ones() {
    let s = Scratch::new("feed-agent-hup");
    let (q, src, a_dir, b_dir, cfg) = (
        s.0.join("q"),
        s.0.join("src"),
        s.0.join("a"),
        s.0.join("b"),
        s.0.join("agent.toml"),
    );
    std::fs::create_dir_all(&src).unwrap();
    let server = serve(&q, "127.0.0.1:0", &[]);
    let addr = server.addr.clone();
    let agent_dir = s.0.join("agent");
    config(
        &cfg,
        &agent_dir,
        &[feed(&addr, "NEXRAD3", &a_dir, "from = \"1\"\n")],
    );
    let a = agent(&cfg);
    insert_one(&addr, &src, "r-1", "NEXRAD3");
    wait_for(&a_dir, &src, &names(&["r-1"]));
    // Swap the feed for another: SIGHUP stops the first and starts the second.
    config(
        &cfg,
        &agent_dir,
        &[feed(&addr, "NGRID", &b_dir, "from = \"1\"\n")],
    );
    a.signal(libc::SIGHUP);
    let start = Instant::now();
    while !a.log_has("1 started, 1 stopped, 0 unchanged") {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no reload logged"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    insert_one(&addr, &src, "r-2", "NEXRAD3");
    insert_one(&addr, &src, "g-1", "NGRID");
    wait_for(&b_dir, &src, &names(&["g-1"]));
    // A bad config on SIGHUP leaves the running feeds as they are.
    std::fs::write(&cfg, "[[feed]]\nsource = \"x:1\"\n").unwrap();
    a.signal(libc::SIGHUP);
    let start = Instant::now();
    while !a.log_has("the running feeds stay as they are") {
        assert!(start.elapsed() < Duration::from_secs(20), "no error logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    insert_one(&addr, &src, "g-2", "NGRID");
    wait_for(&b_dir, &src, &names(&["g-1", "g-2"]));
    a.stop();
    // The removed feed took nothing after its removal.
    assert_eq!(files(&a_dir), names(&["r-1"]));
}

#[test]
fn a_bad_feed_line_stops_the_agent_at_its_start_naming_the_line() {
    let s = Scratch::new("feed-agent-bad");
    let cfg = s.0.join("agent.toml");
    let run = |text: String| {
        std::fs::write(&cfg, text).unwrap();
        let out = bin()
            .args(["agent", "--listen", "127.0.0.1:0", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(!out.status.success(), "the agent started");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let dir = s.0.join("agent");
    let good = feed("127.0.0.1:7388", "NEXRAD3", &s.0.join("a"), "");
    let e = run(format!(
        "dir = {dir:?}\n\n[[feed]]\n{good}\n[[feed]]\n{}",
        feed(
            "127.0.0.1:7388",
            "NGRID",
            &s.0.join("b"),
            "unicats = true\n"
        )
    ));
    assert!(
        e.contains("unknown field `unicats`") && e.contains("line 12"),
        "{e}"
    );
    let e = run(format!(
        "dir = {dir:?}\n\n[[feed]]\n{good}\n[[feed]]\n{}",
        feed("127.0.0.1:7388", "NEX[RAD", &s.0.join("b"), "")
    ));
    assert!(
        e.contains("[[feed]] #2 at line 8") && e.contains("NEX[RAD"),
        "{e}"
    );
    let e = run(format!(
        "dir = {dir:?}\n\n[[feed]]\n{good}\n[[feed]]\n{good}"
    ));
    assert!(
        e.contains("[[feed]] #2 at line 8") && e.contains("saved position"),
        "{e}"
    );
}
