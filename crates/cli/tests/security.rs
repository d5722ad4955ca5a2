//! Hostile peers on loopback: connection floods, oversized frames before authentication,
//! tickets, keys and forged data. Every test runs real processes and needs no root.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bulkcast_proto::wire::{Frame, VERSION};

#[allow(dead_code, unused_imports)]
mod common;
use common::{first_line, hash, make_file, secret, spawn_agent, Agent, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_bulkcast");
const MIB: u64 = 1 << 20;

/// An agent on loopback with `extra` options; its log goes to `log` (a pipe nobody reads
/// would stall it once full). Returns the process and its TCP address.
fn agent(dir: &Path, env: &[(&str, &str)], extra: &[&str], log: &Path) -> (Agent, String) {
    let a = spawn_agent(dir, &["127.0.0.1:0"], |c| {
        c.args(extra)
            .env_remove("BULKCAST_SECRET")
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(log).unwrap());
    });
    let addr = a.addr.clone();
    (a, addr)
}

fn send(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("send")
        .args(args)
        .args(["--json", "--quiet"])
        .env_remove("BULKCAST_SECRET")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Peak resident memory of a process, from /proc.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

/// One hostile connection from `from`: `half_open` connects and says nothing, else it sends a
/// valid `Hello` and then announces a 16 MiB frame and starts sending it, as in issue 32's
/// measurement. Held open until `until`. True if it connected.
async fn hostile(from: std::net::IpAddr, to: SocketAddr, half_open: bool, until: Instant) -> bool {
    use tokio::io::AsyncWriteExt;
    let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
        return false;
    };
    if sock.bind(SocketAddr::new(from, 0)).is_err() {
        return false;
    }
    let Ok(Ok(mut s)) = tokio::time::timeout(Duration::from_secs(5), sock.connect(to)).await else {
        return false;
    };
    let left = || tokio::time::Instant::from_std(until);
    if !half_open {
        let hello = Frame::Hello {
            version: VERSION,
            nonce: [7; 16],
        }
        .encode();
        let _ = s.write_all(&hello.head).await;
        // A frame of 16 MiB announced, then as much of it as the agent takes.
        let mut big = vec![0u8; 1 << 20];
        big[..4].copy_from_slice(&(16u32 << 20).to_be_bytes());
        let _ = tokio::time::timeout_at(left(), async {
            for _ in 0..16 {
                if s.write_all(&big).await.is_err() {
                    break;
                }
            }
        })
        .await;
    }
    tokio::time::sleep_until(left()).await;
    true
}

/// Issue 32: 1,000 half-open handshakes and oversized frames before authentication, from 20
/// addresses, while a real send runs: the send completes and the agent's peak memory stays
/// under [`FLOOD_RSS_BOUND`] (before the fix, 100 such connections took it from 6 MB to 1.65 GB).
#[test]
fn a_flood_before_authentication_neither_stops_a_send_nor_grows_the_agent() {
    const FLOOD_RSS_BOUND: u64 = 64 * MIB;
    let s = Scratch::new("flood");
    let key = secret(0x32);
    let env = [("BULKCAST_SECRET", key.as_str())];
    let (a, addr) = agent(&s.0.join("a"), &env, &[], &s.0.join("agent.log"));
    let pid = a.child.id();
    let base = peak_rss(pid);
    let to: SocketAddr = addr.parse().unwrap();
    let src = s.0.join("f.bin");
    make_file(&src, 16 * MIB, b"flood");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let until = Instant::now() + Duration::from_secs(8);
    let flood = rt.spawn(async move {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..1000u32 {
            let from = std::net::IpAddr::from([127, 0, 0, 2 + (i % 20) as u8]);
            set.spawn(hostile(from, to, i % 2 == 0, until));
            if i % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let mut connected = 0;
        while let Some(c) = set.join_next().await {
            connected += usize::from(c.unwrap_or(false));
        }
        connected
    });
    // The send starts while the flood is under way.
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let out = send(&[src.to_str().unwrap(), "--to", &addr], &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(hash(&s.0.join("a").join("f.bin")), hash(&src));
    let connected = rt.block_on(flood).unwrap();
    assert!(
        connected >= 900,
        "only {connected} hostile connections were made"
    );
    let peak = peak_rss(pid);
    eprintln!(
        "agent peak RSS: {:.1} MiB at start, {:.1} MiB after the flood and a 16 MiB send",
        base as f64 / MIB as f64,
        peak as f64 / MIB as f64
    );
    assert!(peak < FLOOD_RSS_BOUND, "peak RSS {peak} bytes");
}

/// Issue 32: `send --expect` with the fleet's secret exported wrote that secret into the
/// ticket. Now the ticket holds a key for its session alone: it does not contain the fleet's
/// secret, it does not admit to the fleet's agents, and once its session is over nobody takes
/// joins with it.
#[test]
fn a_captured_ticket_holds_no_fleet_secret_and_is_useless_after_its_session() {
    let s = Scratch::new("ticket-key");
    let fleet = secret(0x5a);
    let env = [("BULKCAST_SECRET", fleet.as_str())];
    let (_a, agent_addr) = agent(&s.0.join("agent"), &env, &[], &s.0.join("agent.log"));
    let src = s.0.join("f.bin");
    make_file(&src, 3 * MIB, b"ticket");
    let mut sender = Command::new(BIN)
        .args(["send", src.to_str().unwrap(), "--expect", "1"])
        .args(["--listen", "127.0.0.1:0", "--json", "--quiet"])
        .env("BULKCAST_SECRET", &fleet)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = sender.stdout.take().unwrap();
    let ticket = first_line(&mut out);
    assert!(ticket.starts_with("bc1/"), "{ticket}");
    assert!(
        !ticket.contains(&fleet),
        "the ticket holds the fleet secret"
    );
    let recv = |dest: &str| {
        Command::new(BIN)
            .args(["recv", &ticket, "--quiet", "--wait", "5", "--out"])
            .arg(s.0.join(dest))
            .output()
            .unwrap()
    };
    assert!(recv("one.bin").status.success());
    assert!(sender.wait().unwrap().success());
    assert_eq!(hash(&s.0.join("one.bin")), hash(&src));

    // After the session: the ticket admits nobody.
    let late = recv("late.bin");
    assert!(!late.status.success());
    assert!(!s.0.join("late.bin").exists());
    // Its key pushes nothing to the fleet's agents either.
    let key = ticket.split('/').nth(1).unwrap().to_string();
    let out = send(
        &[src.to_str().unwrap(), "--to", &agent_addr],
        &[("BULKCAST_SECRET", key.as_str())],
    );
    assert!(!out.status.success());
    assert!(!s.0.join("agent").join("f.bin").exists());
}

/// `bulkcast keygen FILE`: the key file (mode 0600) and the public key it prints.
fn keygen(path: &Path) -> String {
    let out = Command::new(BIN).arg("keygen").arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Issue 32: per-host keys. An agent admits only the keys on its allow list: a sender whose
/// key is not on it is refused and nothing is written; a key removed from the list is refused
/// once the agent rereads it (SIGHUP, no restart), and a list that does not parse leaves the
/// old one in force; an agent refuses a sender that has the secret but no key.
#[test]
fn host_keys_admit_the_allowed_refuse_others_and_revocation_holds() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("keys");
    let fleet = secret(0x6b);
    let (src_key, agent_key, stranger_key) = (
        s.0.join("src.key"),
        s.0.join("agent.key"),
        s.0.join("x.key"),
    );
    let src_pub = keygen(&src_key);
    let agent_pub = keygen(&agent_key);
    let stranger_pub = keygen(&stranger_key);
    assert_eq!(
        std::fs::metadata(&src_key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(src_pub.len(), 64);
    // keygen never overwrites a key.
    let again = Command::new(BIN)
        .arg("keygen")
        .arg(&src_key)
        .output()
        .unwrap();
    assert!(!again.status.success());

    let write = |name: &str, lines: &[&str]| {
        let p = s.0.join(name);
        std::fs::write(&p, lines.join("\n")).unwrap();
        p
    };
    let agent_allow = write("agent.allow", &[&format!("{src_pub} source")]);
    // Senders list the agent, so they talk to it; the stranger too.
    let src_allow = write("src.allow", &[&agent_pub]);
    let src = s.0.join("f.bin");
    make_file(&src, 2 * MIB, b"keys");
    let dir = s.0.join("a");
    let start = |allow: &Path| {
        agent(
            &dir,
            &[("BULKCAST_SECRET", fleet.as_str())],
            &[
                "--key",
                agent_key.to_str().unwrap(),
                "--allow-keys",
                allow.to_str().unwrap(),
            ],
            &s.0.join("agent.log"),
        )
    };
    let push = |key: &Path, to: &str| {
        send(
            &[
                src.to_str().unwrap(),
                "--to",
                to,
                "--key",
                key.to_str().unwrap(),
                "--allow-keys",
                src_allow.to_str().unwrap(),
            ],
            &[("BULKCAST_SECRET", fleet.as_str())],
        )
    };
    let (a, addr) = start(&agent_allow);
    // Not on the list: refused, nothing written.
    let out = push(&stranger_key, &addr);
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow list"), "{err}");
    assert!(!dir.join("f.bin").exists(), "a refused sender wrote");
    // The secret alone is not enough either.
    let out = send(
        &[src.to_str().unwrap(), "--to", &addr],
        &[("BULKCAST_SECRET", fleet.as_str())],
    );
    assert!(!out.status.success());
    assert!(!dir.join("f.bin").exists());
    // On the list: delivered.
    let out = push(&src_key, &addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hash(&dir.join("f.bin")), hash(&src));
    std::fs::remove_file(dir.join("f.bin")).unwrap();
    // Revoked without a restart: the source's line removed, the agent told by SIGHUP.
    let hup = |what: &str| {
        let pid = a.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        wait_for_log(&s.0.join("agent.log"), what);
    };
    // A list that does not parse is not taken: the old one stays, the source still admitted.
    write("agent.allow", &["not a key"]);
    hup("the previous allow list stays in force");
    let out = push(&src_key, &addr);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(dir.join("f.bin")).unwrap();
    write("agent.allow", &[&format!("{stranger_pub} someone else")]);
    hup("reloaded: 1 keys");
    let out = push(&src_key, &addr);
    assert!(!out.status.success());
    let err =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("allow list"), "{err}");
    assert!(!dir.join("f.bin").exists(), "a revoked key wrote");
    drop(a);
}

/// Waits (at most 10 s) until `log` contains `what`.
fn wait_for_log(log: &Path, what: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(what) {
            return;
        }
        assert!(Instant::now() < until, "no {what:?} in the log:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A key file that others can read is refused, as ssh does.
#[test]
fn a_key_file_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let s = Scratch::new("keymode");
    let key = s.0.join("k");
    let public = keygen(&key);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let allow = s.0.join("allow");
    std::fs::write(&allow, public).unwrap();
    let out = Command::new(BIN)
        .args(["agent", "--listen", "127.0.0.1:0", "--dir"])
        .arg(s.0.join("d"))
        .arg("--key")
        .arg(&key)
        .arg("--allow-keys")
        .arg(&allow)
        .env("BULKCAST_SECRET", secret(1))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("readable by others"), "{err}");
}

/// Issue 32, swarms: with host keys the agents take the swarm set-up and every piece only
/// with the source's signature, including pieces their peers serve back from disk; agents
/// listed as relays only, so a piece any of them made up would be refused.
#[test]
fn a_swarm_with_host_keys_delivers_source_signed_pieces_from_peers() {
    let s = Scratch::new("swarm-keys");
    let fleet = secret(0x5b);
    let src_key = s.0.join("src.key");
    let src_pub = keygen(&src_key);
    let keys: Vec<(std::path::PathBuf, String)> = (0..3)
        .map(|i| {
            let p = s.0.join(format!("a{i}.key"));
            let public = keygen(&p);
            (p, public)
        })
        .collect();
    let mut agent_list = format!("{src_pub} push source\n");
    for (i, (_, public)) in keys.iter().enumerate() {
        agent_list += &format!("{public} relay a{i}\n");
    }
    let agent_allow = s.0.join("agent.allow");
    std::fs::write(&agent_allow, agent_list).unwrap();
    let src_allow = s.0.join("src.allow");
    let listed: Vec<&str> = keys.iter().map(|(_, p)| p.as_str()).collect();
    std::fs::write(&src_allow, listed.join("\n")).unwrap();
    let agents: Vec<(Agent, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, (key, _))| {
            agent(
                &s.0.join(format!("r{i}")),
                &[("BULKCAST_SECRET", fleet.as_str())],
                &[
                    "--key",
                    key.to_str().unwrap(),
                    "--allow-keys",
                    agent_allow.to_str().unwrap(),
                ],
                &s.0.join(format!("a{i}.log")),
            )
        })
        .collect();
    let to: Vec<&str> = agents.iter().map(|(_, a)| a.as_str()).collect();
    let to = to.join(",");
    let src = s.0.join("obj.bin");
    make_file(&src, 3 * MIB + 777, b"swarm-keys");
    for strategy in ["mob", "swarm"] {
        let out = send(
            &[
                src.to_str().unwrap(),
                "--to",
                &to,
                "--strategy",
                strategy,
                "--chunk-kib",
                "64",
                "--stall-timeout",
                "10",
                "--key",
                src_key.to_str().unwrap(),
                "--allow-keys",
                src_allow.to_str().unwrap(),
            ],
            &[("BULKCAST_SECRET", fleet.as_str())],
        );
        assert!(
            out.status.success(),
            "{strategy}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for i in 0..3 {
            let got = s.0.join(format!("r{i}/obj.bin"));
            assert_eq!(hash(&got), hash(&src), "{strategy}: agent {i}");
            std::fs::remove_file(got).unwrap();
        }
    }
}
