//! Running a fleet, tried as its operators do: an agent's live page of the sessions it is
//! part of. Real processes on loopback; no root.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// The root-test helper in `common` is not used here.
#[allow(dead_code, unused_imports)]
mod common;
use common::{first_line, secret, spawn_agent, Agent, Proc, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// An agent on an ephemeral loopback port with its live page: (process, address, page URL).
fn agent_with_page(dir: &Path, secret: &str) -> (Agent, String, String) {
    let mut a = spawn_agent(dir, &["127.0.0.1:0"], |c| {
        c.args(["--web", "127.0.0.1:0"])
            .env("BULKCAST_SECRET", secret);
    });
    let page = first_line(a.child.stdout.as_mut().unwrap());
    let url = page
        .split("live page on ")
        .nth(1)
        .unwrap_or_else(|| panic!("agent said {page:?}"))
        .trim()
        .to_string();
    let addr = a.addr.clone();
    (a, addr, url)
}

/// The page's event stream: one snapshot (JSON) per call.
struct Events(BufReader<std::net::TcpStream>);

impl Events {
    fn open(url: &str) -> Events {
        let host = url.trim_start_matches("http://").trim_end_matches('/');
        let mut c = std::net::TcpStream::connect(host).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(c, "GET /events HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
        Events(BufReader::new(c))
    }

    fn next(&mut self) -> serde_json::Value {
        loop {
            let mut line = String::new();
            assert!(self.0.read_line(&mut line).unwrap() > 0, "stream ended");
            if let Some(d) = line.strip_prefix("data: ") {
                return serde_json::from_str(d).unwrap();
            }
        }
    }

    /// The first snapshot whose sessions pass `ok`, within `limit`.
    fn until(
        &mut self,
        limit: Duration,
        ok: impl Fn(&[serde_json::Value]) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let s = self.next();
            if ok(s["sessions"].as_array().unwrap()) {
                return s;
            }
            assert!(start.elapsed() < limit, "never came: last {s}");
        }
    }
}

/// A `send -` of a stream to `to` (1 MiB every 100 ms until `stop`), and its feeding thread.
fn stream_send(
    to: &str,
    secret: &str,
    stop: Arc<AtomicBool>,
) -> (Proc, std::thread::JoinHandle<u64>) {
    let mut child = Command::new(BIN)
        .args([
            "send", "-", "--name", "live.bin", "--to", to, "--fanout", "1",
        ])
        .args(["--quiet", "--json"])
        .env("BULKCAST_SECRET", secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeding = std::thread::spawn(move || {
        let part = vec![0x44u8; MIB as usize];
        let (start, mut sent) = (Instant::now(), 0);
        while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(120) {
            if stdin.write_all(&part).is_err() {
                break;
            }
            sent += MIB;
            std::thread::sleep(Duration::from_millis(100));
        }
        sent
    });
    (Proc(child), feeding)
}

/// `agent --web`: while a stream moves down a chain of two agents, the relay's page shows
/// the session running with its parent, growing bytes and a rate; after the send, the session
/// is listed as done with every byte of the stream, and a session that failed is in red with
/// its reason.
#[test]
fn agent_page_shows_its_sessions_live_then_their_outcome() {
    let s = Scratch::new("fleet-web");
    let key = secret(81);
    let (_a0, addr0, url0) = agent_with_page(&s.0.join("r0"), &key);
    let (_a1, addr1, _) = agent_with_page(&s.0.join("r1"), &key);
    let stop = Arc::new(AtomicBool::new(false));
    let (mut send, feeding) = stream_send(&format!("{addr0},{addr1}"), &key, stop.clone());
    let mut ev = Events::open(&url0);
    let limit = Duration::from_secs(30);
    let running = |v: &[serde_json::Value]| {
        v.len() == 1 && v[0]["state"] == "running" && v[0]["bytes"].as_u64().unwrap() > 0
    };
    let first = ev.until(limit, |v| {
        running(v) && v[0]["rate_mbps"].as_f64().unwrap() > 0.0
    });
    let s0 = &first["sessions"][0];
    assert_eq!(s0["object"], "live.bin", "{first}");
    assert_eq!(s0["kind"], "tree", "{first}");
    assert!(
        s0["parent"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{first}"
    );
    assert_eq!(first["listen"], addr0.as_str(), "{first}");
    let b0 = s0["bytes"].as_u64().unwrap();
    let later = ev.until(limit, |v| {
        running(v) && v[0]["bytes"].as_u64().unwrap() > b0 + 2 * MIB
    });
    assert_eq!(later["sessions"][0]["session"], s0["session"]);

    #[cfg(bulkcast_chromium)]
    {
        // The page in a browser: the running session's row, with its rate, from the events.
        let dom = chromium_dom(&url0, &s.0.join("profile"));
        assert!(dom.contains("data-state=\"running\""), "{dom}");
        assert!(dom.contains("data-object=\"live.bin\""), "{dom}");
        let rate: f64 = dom
            .split("data-rate=\"")
            .nth(1)
            .and_then(|v| v.split('"').next()?.parse().ok())
            .unwrap_or(0.0);
        assert!(rate > 0.0, "{dom}");
    }

    stop.store(true, Ordering::Relaxed);
    let sent = feeding.join().unwrap();
    let mut out = String::new();
    send.0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["object"]["bytes"], sent);
    let done = ev.until(limit, |v| v.len() == 1 && v[0]["state"] == "done");
    let d = &done["sessions"][0];
    assert_eq!(d["bytes"], sent, "{done}");
    assert!(d["mbps"].as_f64().unwrap() > 0.0, "{done}");
    assert!(d["error"].is_null(), "{done}");

    // A session that fails on this agent (its source is killed mid-stream) is listed as
    // failed, with why, after the one that succeeded.
    let stop = Arc::new(AtomicBool::new(false));
    let (send, feeding) = stream_send(&addr0, &key, stop.clone());
    ev.until(limit, |v| v.len() == 2 && v[1]["state"] == "running");
    drop(send);
    stop.store(true, Ordering::Relaxed);
    feeding.join().unwrap();
    let both = ev.until(Duration::from_secs(60), |v| {
        v.len() == 2 && v[1]["state"] != "running"
    });
    let f = &both["sessions"][1];
    assert_eq!(f["state"], "failed", "{both}");
    assert!(!f["error"].as_str().unwrap().is_empty(), "{both}");
    assert_eq!(both["sessions"][0]["state"], "done", "{both}");
}

/// The DOM of `url` from headless Chromium after 2.5 s of live updates (`?hold=2500` delays
/// the load event, at which `--dump-dom` dumps it). Up to three tries, for a slow first start.
#[cfg(bulkcast_chromium)]
fn chromium_dom(url: &str, profile: &Path) -> String {
    let chromium = option_env!("BULKCAST_CHROMIUM").unwrap_or("chromium");
    let mut dom = String::new();
    for _ in 0..3 {
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(["--dump-dom", &format!("{url}?hold=2500")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{chromium} did not start ({e}): apt-get install chromium"));
        let mut child = Proc(child);
        let start = Instant::now();
        while child.0.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        dom.clear();
        if let Some(mut o) = child.0.stdout.take() {
            let _ = o.read_to_string(&mut dom);
        }
        if dom.contains("class=\"s ") {
            break;
        }
    }
    dom
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

/// Scrapes `url` until `ok` holds (at most `limit`).
fn scrape_until(url: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let t = scrape(url);
        if ok(&t) {
            return t;
        }
        assert!(start.elapsed() < limit, "never came:\n{t}");
        std::thread::sleep(Duration::from_millis(100));
    }
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

/// `--metrics` on `feed serve` and `feed subscribe`: a backlog of two products and three
/// more inserted live reach a subscriber; the source's counters (inserted, sent, queue,
/// subscribers, each one's backlog) and the subscriber's (received, bytes, latency) match
/// what was inserted.
#[test]
fn feed_metrics_count_products_inserted_sent_and_received() {
    let s = Scratch::new("fleet-feed");
    let key = secret(82);
    let mut server = Command::new(BIN)
        .args([
            "feed",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
        ])
        .arg("--dir")
        .arg(s.0.join("q"))
        .env("BULKCAST_SECRET", &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = server.stdout.as_mut().unwrap();
    let line = first_line(out);
    let addr = line
        .split_whitespace()
        .nth(4)
        .unwrap()
        .trim_end_matches(',')
        .to_string();
    let src_url = metrics_url(out);
    let server = Proc(server);
    let sizes = [1000u64, 0, 300_000, 2_000_000, 77];
    let files: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let p = s.0.join(format!("p{i}.bin"));
            std::fs::write(&p, vec![i as u8; *n as usize]).unwrap();
            p
        })
        .collect();
    let insert = |files: &[std::path::PathBuf]| {
        let out = Command::new(BIN)
            .args(["feed", "insert", "--server", &addr, "--feedtype", "TEST"])
            .args(files)
            .env("BULKCAST_SECRET", &key)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    insert(&files[..2]);
    let mut sub = Command::new(BIN)
        .args([
            "feed",
            "subscribe",
            &addr,
            "--feedtype",
            "TEST",
            "--from",
            "1",
        ])
        .args([
            "--unicast",
            "--json",
            "--duration",
            "60",
            "--metrics",
            "127.0.0.1:0",
        ])
        .arg("--dir")
        .arg(s.0.join("sub"))
        .env("BULKCAST_SECRET", &key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sub_url = metrics_url(sub.stderr.as_mut().unwrap());
    let sub = Proc(sub);
    let received = "bulkcast_feed_products_received_total{transport=\"unicast\"}";
    scrape_until(&sub_url, Duration::from_secs(30), |t| {
        metric(t, received) == 2.0
    });
    insert(&files[2..]);
    let t = scrape_until(&sub_url, Duration::from_secs(30), |t| {
        metric(t, received) == 5.0
    });
    let total: u64 = sizes.iter().sum();
    let rx_bytes = "bulkcast_feed_received_bytes_total{transport=\"unicast\"}";
    assert_eq!(metric(&t, rx_bytes), total as f64, "{t}");
    assert_eq!(
        metric(&t, "bulkcast_feed_delivery_latency_seconds_count"),
        5.0,
        "{t}"
    );
    assert_eq!(metric(&t, "bulkcast_feed_products_lost_total"), 0.0, "{t}");

    // The source: every product inserted, queued and sent once; the subscriber's backlog
    // drains to nothing once it confirmed them.
    let t = scrape_until(&src_url, Duration::from_secs(10), |t| {
        t.lines().any(|l| {
            l.starts_with("bulkcast_feed_subscriber_backlog_products{") && l.ends_with(" 0")
        })
    });
    assert_eq!(
        metric(&t, "bulkcast_feed_products_inserted_total"),
        5.0,
        "{t}"
    );
    assert_eq!(
        metric(&t, "bulkcast_feed_inserted_bytes_total"),
        total as f64,
        "{t}"
    );
    assert_eq!(metric(&t, "bulkcast_feed_queue_products"), 5.0, "{t}");
    assert_eq!(metric(&t, "bulkcast_feed_queue_bytes"), total as f64, "{t}");
    let sent = "bulkcast_feed_products_sent_total{transport=\"unicast\"}";
    assert_eq!(metric(&t, sent), 5.0, "{t}");
    let sent_bytes = "bulkcast_feed_sent_bytes_total{transport=\"unicast\"}";
    assert_eq!(metric(&t, sent_bytes), total as f64, "{t}");
    assert_eq!(
        metric(&t, "bulkcast_feed_subscribers{transport=\"unicast\"}"),
        1.0,
        "{t}"
    );
    drop(sub);
    scrape_until(&src_url, Duration::from_secs(10), |t| {
        metric(t, "bulkcast_feed_subscribers{transport=\"unicast\"}") == 0.0
    });
    drop(server);
}

/// `send --ssh` to hosts without the binary: each gets a copy of this one (over the same ssh,
/// into a private directory under the host's `TMPDIR`), runs its one-shot agent from it and
/// receives the file; after the send neither the copies nor the agents are left. With
/// `--ssh-no-copy` the send refuses, naming the host.
#[test]
#[cfg_attr(
    not(bulkcast_sshd),
    ignore = "needs Debian's openssh-server (apt-get install openssh-server), not found when built"
)]
fn ssh_launcher_copies_the_binary_where_missing_and_removes_it_after() {
    #[cfg(bulkcast_sshd)]
    {
        let s = Scratch::new("fleet-ssh");
        let sshd = common::Sshd::start(&s.0, "AcceptEnv TMPDIR\n");
        let remote_tmp = s.0.join("remote-tmp");
        std::fs::create_dir_all(&remote_tmp).unwrap();
        let ssh_args = format!(
            "{} -o SetEnv=TMPDIR={}",
            sshd.ssh_args,
            remote_tmp.display()
        );
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let file = s.0.join("s.bin");
        common::make_file(&file, 2 * MIB + 5, b"fleet-ssh");
        let d = s.0.display();
        let send = |extra: &[&str]| {
            Command::new(BIN)
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
                .args(["--ssh-args", &ssh_args])
                .args(["--ssh-bulkcast", "/nonexistent/bulkcast"])
                .arg("--ssh-dir")
                .arg(format!("{d}/rx-{{host}}"))
                .args(extra)
                .env_remove("BULKCAST_SECRET")
                .output()
                .unwrap()
        };
        let refused = send(&["--ssh-no-copy"]);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert_ne!(refused.status.code(), Some(0));
        assert!(
            err.contains("has no /nonexistent/bulkcast (and --ssh-no-copy)"),
            "{err}"
        );

        let out = send(&[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert_eq!(err.matches("copied this binary").count(), 2, "{err}");
        let want = std::fs::read(&file).unwrap();
        for host in ["127.0.0.1", "127.0.0.2"] {
            let got = std::fs::read(s.0.join(format!("rx-{host}/s.bin"))).unwrap();
            assert!(got == want, "the copy at {host} differs");
        }
        // The copies and the agents run from them are gone.
        let start = Instant::now();
        loop {
            let left: Vec<_> = std::fs::read_dir(&remote_tmp)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            if left.is_empty()
                && common::processes_with(&format!("{}/bulkcast-ssh.", remote_tmp.display())) == 0
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "left behind: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A request's path and body.
type Request = (String, Vec<u8>);

/// A one-thread HTTP sink on loopback: answers every request 200 and keeps (path, body).
struct Sink {
    addr: String,
    got: Arc<std::sync::Mutex<Vec<Request>>>,
}

impl Sink {
    fn start() -> Sink {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut r = BufReader::new(c);
                let mut line = String::new();
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let path = line.split(' ').nth(1).unwrap_or("").to_string();
                let mut len = 0;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                g.lock().unwrap().push((path, body));
                let _ = r.get_mut().write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        });
        Sink { addr, got }
    }

    /// Whether some request to `path` has every one of `needles` in its body.
    fn has(&self, path: &str, needles: &[&str]) -> bool {
        self.got.lock().unwrap().iter().any(|(p, b)| {
            p == path
                && needles
                    .iter()
                    .all(|n| b.windows(n.len()).any(|w| w == n.as_bytes()))
        })
    }
}

/// `--features otel`: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, an agent exports a span per
/// session (with the object's name) and `send` a span for the send, by OTLP/HTTP to
/// `/v1/traces` of the collector (here a sink that keeps what it gets).
#[test]
#[cfg_attr(not(feature = "otel"), ignore = "needs --features otel")]
fn otel_exports_the_spans_of_sessions_and_sends() {
    let s = Scratch::new("fleet-otel");
    let key = secret(83);
    let sink = Sink::start();
    let endpoint = format!("http://{}", sink.addr);
    let agent = spawn_agent(&s.0.join("rx"), &["127.0.0.1:0"], |c| {
        c.env("BULKCAST_SECRET", &key)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "200");
    });
    let addr = agent.addr.clone();
    let file = s.0.join("traced-object.bin");
    std::fs::write(&file, vec![9u8; MIB as usize]).unwrap();
    let out = Command::new(BIN)
        .args(["send", file.to_str().unwrap(), "--to", &addr, "--quiet"])
        .env("BULKCAST_SECRET", &key)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // The send flushed its span before it exited.
    assert!(
        sink.has("/v1/traces", &["send", "traced-object.bin"]),
        "no send span"
    );
    // The agent's session span comes within its batch delay.
    let start = Instant::now();
    while !sink.has("/v1/traces", &["session", "traced-object.bin", "bulkcast"]) {
        assert!(start.elapsed() < Duration::from_secs(20), "no session span");
        std::thread::sleep(Duration::from_millis(100));
    }
}
