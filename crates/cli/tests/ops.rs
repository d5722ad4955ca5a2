//! Running bulkcast in production, tried as its users do: the README's promises about the
//! report and exit codes, the metrics endpoint, plots of a report. Real processes on loopback;
//! no root.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{first_line, secret, spawn_agent, Agent, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// An agent on an ephemeral loopback port, with further arguments.
fn agent(dir: &Path, secret: &str, extra: &[&str]) -> Agent {
    spawn_agent(dir, &["127.0.0.1:0"], |c| {
        c.args(extra).env("BULKCAST_SECRET", secret);
    })
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

/// Writes `len` pseudo-random bytes (seeded by the path).
fn make_file(path: &Path, len: u64) {
    common::make_file(path, len, path.as_os_str().as_encoded_bytes());
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

    // A tree send over spread edges (two connections) prints the report example's keys.
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
            panic!("a child process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// `GET /metrics` from `url` (`http://HOST:PORT/metrics`).
fn scrape(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut c = std::net::TcpStream::connect(host).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(c, "GET /{path} HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The value of the sample `name` (with its labels, as printed) in a scrape; 0 if absent.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// The URL a process printed on a line of `r` containing `metrics on`.
fn metrics_url(r: &mut impl Read) -> String {
    loop {
        let line = first_line(r);
        assert!(!line.is_empty(), "no metrics line");
        if let Some(u) = line.split("metrics on ").nth(1) {
            return u.trim().to_string();
        }
    }
}

/// `--metrics` on agents and on `send`, scraped while a stream moves down a chain and after
/// it ended: the counters move during the transfer and end where the JSON report ends.
#[test]
fn metrics_during_and_after_a_transfer_match_the_report() {
    let s = Scratch::new("ops-metrics");
    let key = secret(72);
    let mut ags: Vec<(Agent, String)> = (0..2)
        .map(|i| {
            let mut a = agent(
                &s.0.join(format!("r{i}")),
                &key,
                &["--metrics", "127.0.0.1:0"],
            );
            let url = metrics_url(a.child.stdout.as_mut().unwrap());
            (a, url)
        })
        .collect();
    let list = format!("{},{}", ags[0].0.addr, ags[1].0.addr);
    let mut child = Command::new(BIN)
        .args([
            "send", "-", "--name", "m.bin", "--to", &list, "--fanout", "1",
        ])
        .args(["--chunk-kib", "64", "--json", "--quiet"])
        .args(["--metrics", "127.0.0.1:0", "--metrics-linger", "30"])
        .env("BULKCAST_SECRET", &key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = metrics_url(child.stderr.as_mut().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let part = vec![0x5au8; 8 * MIB as usize];
    stdin.write_all(&part).unwrap();

    // During: both receivers have part of the stream, not more than was written.
    let second = format!(
        "bulkcast_receiver_bytes_total{{receiver=\"{}\"}}",
        ags[1].0.addr
    );
    let start = Instant::now();
    let during = loop {
        let t = scrape(&url);
        if metric(&t, &second) >= (4 * MIB) as f64 {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no progress:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        metric(&during, "bulkcast_receivers{state=\"running\"}"),
        2.0,
        "{during}"
    );
    let edge = format!(
        "bulkcast_edge_bytes_total{{from=\"{}\",to=\"{}\"}}",
        ags[0].0.addr, ags[1].0.addr
    );
    assert!(metric(&during, &edge) <= (8 * MIB) as f64, "{during}");
    // The input is counted as it is read, and no receiver is ahead of it.
    assert!(
        metric(&during, "bulkcast_source_read_bytes_total") >= metric(&during, &second),
        "{during}"
    );
    let agent_during = scrape(&ags[0].1);
    assert_eq!(
        metric(&agent_during, "bulkcast_sessions_active"),
        1.0,
        "{agent_during}"
    );
    assert!(metric(&agent_during, "bulkcast_verified_bytes_total") > 0.0);

    // The end: the rest of the stream, then the report and the lingering final values.
    stdin.write_all(&part).unwrap();
    stdin.write_all(b"tail").unwrap();
    drop(stdin);
    let mut json = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut line = String::new();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "{json}"
        );
        json += &line;
        if line == "}\n" {
            break;
        }
    }
    let r: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(r["ok"], true, "{r}");
    let total = 16 * MIB + 4;
    assert_eq!(r["object"]["bytes"], total);
    let after = scrape(&url);
    for rx in r["receivers"].as_array().unwrap() {
        let name = rx["name"].as_str().unwrap();
        let sample = format!("bulkcast_receiver_bytes_total{{receiver=\"{name}\"}}");
        assert_eq!(
            metric(&after, &sample),
            rx["bytes"].as_f64().unwrap(),
            "{after}"
        );
    }
    for e in r["edges"].as_array().unwrap() {
        let sample = format!(
            "bulkcast_edge_bytes_total{{from=\"{}\",to=\"{}\"}}",
            e["from"].as_str().unwrap(),
            e["to"].as_str().unwrap()
        );
        assert_eq!(
            metric(&after, &sample),
            e["bytes"].as_f64().unwrap(),
            "{after}"
        );
    }
    assert_eq!(
        metric(&after, "bulkcast_receivers{state=\"done\"}"),
        2.0,
        "{after}"
    );
    assert_eq!(
        metric(&after, "bulkcast_source_read_bytes_total"),
        total as f64
    );
    // The final scrape lets the send exit.
    let status = wait_output(child, Duration::from_secs(20)).status;
    assert_eq!(status.code(), Some(0));

    // Every agent verified and stored every chunk once, in one session that completed.
    let chunks = total.div_ceil(r["chunk_size"].as_u64().unwrap()) as f64;
    for (_, url) in &mut ags {
        let t = scrape(url);
        assert_eq!(
            metric(&t, "bulkcast_verified_bytes_total"),
            total as f64,
            "{t}"
        );
        assert_eq!(metric(&t, "bulkcast_chunks_verified_total"), chunks, "{t}");
        assert_eq!(metric(&t, "bulkcast_chunks_stored_total"), chunks, "{t}");
        assert_eq!(metric(&t, "bulkcast_chunks_rejected_total"), 0.0, "{t}");
        assert_eq!(metric(&t, "bulkcast_store_queue_chunks"), 0.0, "{t}");
        assert_eq!(metric(&t, "bulkcast_sessions_active"), 0.0, "{t}");
        assert_eq!(
            metric(&t, "bulkcast_sessions_ended_total{outcome=\"done\"}"),
            1.0,
            "{t}"
        );
    }
}

/// `bulkcast report FILE --svg OUT` plots a real send: every receiver and every edge of the
/// tree are in the picture, with a line for each in the progress and the rate panels.
#[test]
fn report_plots_every_receiver_and_edge_of_a_real_send() {
    let s = Scratch::new("ops-plot");
    let key = secret(73);
    let ags = agents(&s.0.join("rx"), 3, &key);
    let file = s.0.join("p.bin");
    make_file(&file, 24 * MIB);
    let out = send(
        &[
            file.to_str().unwrap(),
            "--to",
            &to_list(&ags),
            "--fanout",
            "1",
            "--quiet",
        ],
        &key,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let r = report(&out);
    let t = r["timeline"]["t_s"].as_array().unwrap();
    assert!(!t.is_empty(), "{r}");
    // Each series ends at the receiver's full copy.
    for series in r["timeline"]["bytes"].as_array().unwrap() {
        assert_eq!(series.as_array().unwrap().last().unwrap(), 24 * MIB);
    }
    let json = s.0.join("r.json");
    std::fs::write(&json, &out.stdout).unwrap();
    let svg = s.0.join("r.svg");
    let plot = Command::new(BIN)
        .args([
            "report",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(plot.status.success(), "{plot:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    // Three receivers: a progress line and a rate line each.
    assert!(text.matches("<polyline").count() >= 6, "{text}");
    for e in r["edges"].as_array().unwrap() {
        let label = format!(
            "{} → {}",
            e["from"].as_str().unwrap(),
            e["to"].as_str().unwrap()
        );
        assert!(text.contains(&label), "no {label} in the plot");
    }
    // A report without a timeline is refused with the reason.
    std::fs::write(&json, r#"{"receivers": [{"name": "a"}]}"#).unwrap();
    let plot = Command::new(BIN)
        .args([
            "report",
            json.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(plot.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&plot.stderr).contains("no timeline"));
}

/// An agent started from a config file alone receives a send addressed by a Slurm host list
/// (`--hostfile`, `--port`); a setting given twice is refused.
#[test]
fn agent_from_a_config_file_receives_a_send_to_a_slurm_host_list() {
    let s = Scratch::new("ops-config");
    let key = secret(74);
    let secret_file = s.0.join("secret");
    std::fs::write(&secret_file, &key).unwrap();
    let dir = s.0.join("rx");
    let config = s.0.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "listen = [\"127.0.0.1:0\"]\ndir = {:?}\nsecret_file = {:?}\n[limits]\nbudget_mib = 16\n",
            dir, secret_file
        ),
    )
    .unwrap();
    let twice = Command::new(BIN)
        .args([
            "agent",
            "--config",
            config.to_str().unwrap(),
            "--dir",
            "/tmp",
        ])
        .output()
        .unwrap();
    assert_eq!(twice.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&twice.stderr).contains("--dir is given both"));

    let mut child = Command::new(BIN)
        .args(["agent", "--config", config.to_str().unwrap()])
        .env_remove("BULKCAST_SECRET")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = first_line(child.stdout.as_mut().unwrap());
    let port = line
        .split(" listening on 127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split([',', ' ']).next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    let _agent = Agent {
        child,
        addr: format!("127.0.0.1:{port}"),
        paths: Vec::new(),
        // Its directory is in the config file.
        dir: PathBuf::new(),
    };
    let hostfile = s.0.join("nodes");
    std::fs::write(&hostfile, "# the job's nodes\n127.0.0.[1]\n").unwrap();
    let file = s.0.join("h.bin");
    make_file(&file, MIB + 3);
    let out = send(
        &[
            file.to_str().unwrap(),
            "--hostfile",
            hostfile.to_str().unwrap(),
            "--port",
            &port,
            "--quiet",
        ],
        &key,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        std::fs::read(dir.join("h.bin")).unwrap(),
        std::fs::read(&file).unwrap()
    );
}

/// The DOM of `url` with receiver rows in it, from headless Chromium: `--dump-dom` dumps the
/// page at its load event, which `?hold=2500` delays by 2.5 s of live updates (server-sent
/// events). Up to three tries, for a slow first start of a browser profile.
#[cfg(bulkcast_chromium)]
fn chromium_dom(url: &str, profile: &Path) -> String {
    let chromium = option_env!("BULKCAST_CHROMIUM").unwrap_or("chromium");
    let mut dom = String::new();
    for _ in 0..3 {
        let mut c = Command::new(chromium);
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", &format!("{url}?hold=2500")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let child = c
            .spawn()
            .unwrap_or_else(|e| panic!("{chromium} did not start ({e}): apt-get install chromium"));
        dom = String::from_utf8_lossy(&wait_output(child, Duration::from_secs(60)).stdout)
            .into_owned();
        if !rows(&dom, "rate").is_empty() {
            break;
        }
    }
    dom
}

/// `data-NAME="..."` values of the receiver rows in a dumped DOM, by receiver name.
#[cfg(bulkcast_chromium)]
fn rows(dom: &str, attr: &str) -> std::collections::BTreeMap<String, String> {
    dom.split("class=\"rx ")
        .skip(1)
        .filter_map(|row| {
            let get = |k: &str| {
                let v = row.split(&format!("data-{k}=\"")).nth(1)?;
                Some(v.split('"').next()?.to_string())
            };
            Some((get("name")?, get(attr)?))
        })
        .collect()
}

/// `send --web` in a real browser: headless Chromium opens the live page twice while a
/// stream moves down a chain of three agents; the page lists every receiver, with rates that
/// are not zero and that change between the two looks.
#[test]
#[cfg_attr(
    not(bulkcast_chromium),
    ignore = "needs Debian's chromium (apt-get install chromium), not found when built"
)]
fn live_page_in_headless_chromium_shows_every_receiver_and_changing_rates() {
    #[cfg(bulkcast_chromium)]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let s = Scratch::new("ops-web");
        let key = secret(75);
        let ags = agents(&s.0.join("rx"), 3, &key);
        let mut child = Command::new(BIN)
            .args([
                "send",
                "-",
                "--name",
                "live.bin",
                "--to",
                &to_list(&ags),
                "--fanout",
                "1",
            ])
            .args(["--quiet", "--web", "127.0.0.1:0"])
            .env("BULKCAST_SECRET", &key)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = child.stderr.take().unwrap();
        let url = loop {
            let line = first_line(&mut err);
            assert!(!line.is_empty(), "no live page line");
            if let Some(u) = line.split("live page on ").nth(1) {
                break u.trim().to_string();
            }
        };
        // A stream that goes on until both looks are done: 1 MiB every 100 ms.
        let stop = Arc::new(AtomicBool::new(false));
        let mut stdin = child.stdin.take().unwrap();
        let feeding = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let part = vec![0x33u8; MIB as usize];
                let start = Instant::now();
                while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
                    if stdin.write_all(&part).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        std::thread::sleep(Duration::from_secs(1));
        let first = chromium_dom(&url, &s.0.join("profile"));
        let second = chromium_dom(&url, &s.0.join("profile"));
        stop.store(true, Ordering::Relaxed);
        feeding.join().unwrap();
        // The page kept updating from the event stream while it was open (every 500 ms).
        let updates = |dom: &str| -> u32 {
            dom.split("data-updates=\"")
                .nth(1)
                .and_then(|v| v.split('"').next()?.parse().ok())
                .unwrap_or(0)
        };
        assert!(updates(&first) >= 3, "{first}");
        assert!(updates(&second) >= 3, "{second}");
        let (r1, r2) = (rows(&first, "rate"), rows(&second, "rate"));
        let names: Vec<&String> = r1.keys().collect();
        let mut want: Vec<&String> = ags.iter().map(|a| &a.addr).collect();
        want.sort();
        assert_eq!(names, want, "receivers on the page:\n{first}");
        assert_eq!(r2.keys().collect::<Vec<_>>(), want);
        let rate = |m: &std::collections::BTreeMap<String, String>, k: &String| -> f64 {
            m[k].parse().unwrap()
        };
        assert!(names.iter().all(|k| rate(&r1, k) > 0.0), "{r1:?}");
        assert!(
            names.iter().any(|k| rate(&r1, k) != rate(&r2, k)),
            "{r1:?} {r2:?}"
        );
        let (b1, b2) = (rows(&first, "bytes"), rows(&second, "bytes"));
        assert!(names
            .iter()
            .all(|k| b2[*k].parse::<u64>().unwrap() > b1[*k].parse().unwrap()));
        let out = wait_output(child, Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(0));
    }
}

/// `send --ssh`: one-shot agents started over a real sshd (a throwaway one on loopback with a
/// throwaway key) receive the file, and none is left running after the send.
#[test]
#[cfg_attr(
    not(bulkcast_sshd),
    ignore = "needs Debian's openssh-server (apt-get install openssh-server), not found when built"
)]
fn ssh_launcher_starts_one_shot_agents_and_leaves_none_behind() {
    #[cfg(bulkcast_sshd)]
    {
        let s = Scratch::new("ops-ssh");
        let sshd = common::Sshd::start(&s.0, "");
        let user = common::Sshd::user();
        let file = s.0.join("s.bin");
        make_file(&file, 3 * MIB + 9);
        let ssh_args = sshd.ssh_args.as_str();
        let d = s.0.display();
        let out = Command::new(BIN)
            .args([
                "send",
                file.to_str().unwrap(),
                "--fanout",
                "1",
                "--json",
                "--quiet",
            ])
            .arg("--ssh")
            .arg(format!("{user}@127.0.0.1,{user}@127.0.0.2"))
            .args(["--ssh-args", ssh_args, "--ssh-bulkcast", BIN])
            .arg("--ssh-dir")
            .arg(format!("{d}/rx-{{host}}"))
            .env_remove("BULKCAST_SECRET")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let r = report(&out);
        assert_eq!(r["receivers"].as_array().unwrap().len(), 2, "{r}");
        let want = std::fs::read(&file).unwrap();
        for host in ["127.0.0.1", "127.0.0.2"] {
            let got = std::fs::read(s.0.join(format!("rx-{host}/s.bin"))).unwrap();
            assert!(got == want, "the copy at {host} differs");
        }
        common::assert_none_left(&format!("{d}/rx-"));
    }
}

/// A hosts file's `ssh = "user@host:port"` hosts get one-shot agents over a real sshd, as
/// `--ssh` does, next to a running agent named by `addr`; a malformed `ssh` is refused.
#[test]
#[cfg_attr(
    not(bulkcast_sshd),
    ignore = "needs Debian's openssh-server (apt-get install openssh-server), not found when built"
)]
fn hosts_file_ssh_hosts_get_one_shot_agents_beside_running_ones() {
    #[cfg(bulkcast_sshd)]
    {
        let s = Scratch::new("ops-ssh-hosts");
        let sshd = common::Sshd::start(&s.0, "");
        let user = common::Sshd::user();
        let key = secret(0x5e);
        let running = agent(&s.0.join("running"), &key, &[]);
        let file = s.0.join("s.bin");
        make_file(&file, 2 * MIB + 3);
        // The port comes from the hosts file, not from `--ssh-args`.
        let ssh_args = sshd.ssh_args.replacen(&format!("-p {} ", sshd.port), "", 1);
        assert!(!ssh_args.contains("-p "), "{ssh_args}");
        let d = s.0.display();
        let hosts = s.0.join("hosts.toml");
        let send = |text: String| {
            std::fs::write(&hosts, text).unwrap();
            Command::new(BIN)
                .args(["send", file.to_str().unwrap(), "--json", "--quiet", "--to"])
                .arg(&hosts)
                .args(["--ssh-args", &ssh_args, "--ssh-bulkcast", BIN])
                .arg("--ssh-dir")
                .arg(format!("{d}/rx-{{host}}"))
                .env("BULKCAST_SECRET", &key)
                .output()
                .unwrap()
        };
        let out = send(format!(
            "[[host]]\nname = \"running\"\naddr = \"{}\"\n\
             [[host]]\nname = \"one\"\nssh = \"{user}@127.0.0.1:{p}\"\n\
             [[host]]\nname = \"two\"\nssh = \"{user}@127.0.0.2:{p}\"\n",
            running.addr,
            p = sshd.port
        ));
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let r = report(&out);
        let names: BTreeSet<&str> = r["receivers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| x["name"].as_str())
            .collect();
        assert_eq!(names, BTreeSet::from(["one", "running", "two"]), "{r}");
        let want = std::fs::read(&file).unwrap();
        for dir in ["rx-127.0.0.1", "rx-127.0.0.2", "running"] {
            let got = std::fs::read(s.0.join(dir).join("s.bin")).unwrap();
            assert!(got == want, "the copy in {dir} differs");
        }
        common::assert_none_left(&format!("{d}/rx-"));
        // A malformed value is refused before any ssh, naming the host and what is wrong.
        let out = send(format!(
            "[[host]]\nname = \"bad\"\nssh = \"{user}@127.0.0.1:0\"\n"
        ));
        assert_ne!(out.status.code(), Some(0));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("\"bad\"") && err.contains("port"), "{err}");
    }
}
