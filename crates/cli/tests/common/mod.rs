//! What the integration tests share.

use std::io::Write;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// A scratch directory of this test process, removed on drop (also when an assertion fails).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
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

#[allow(dead_code)] // not every test binary starts agents
mod agent;
#[allow(unused_imports)]
pub use agent::{first_line, listen_addrs, spawn_agent, spawn_agent_in, Agent, Proc};

#[path = "../../../lab/tests/support/root.rs"]
#[allow(dead_code)] // only the binaries with root tests use it
mod root;
#[allow(unused_imports)] // only the binaries with root tests use it
pub use root::root_test_cannot_run;

#[allow(dead_code)] // only the binaries with namespace tests use it
mod netns;

#[allow(dead_code)] // only the multicast tests listen on the group
mod group;
#[allow(unused_imports)]
pub use group::capture_group;

/// The kill-resume-unchanged scenario and its helpers.
#[allow(dead_code)] // only the resume tests use it
pub mod resume;

/// The feed tests' servers, inserts, subscribers and files.
#[allow(dead_code)] // only the feed tests use it
pub mod feed;

/// Agents and sends of the loopback test binaries.
#[allow(dead_code)] // not every test binary sends
pub mod run;
#[allow(unused_imports)]
pub use netns::{bin_in, Netns};

/// Processes whose command line mentions `needle`.
#[allow(dead_code)] // only the ssh launcher's tests count them
pub fn processes_with(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(needle))
        .count()
}

/// Waits (10 s at most) until no process's command line mentions `needle`: the one-shot agents
/// (and their wrappers) a send started over ssh are gone.
#[allow(dead_code)] // only the ssh launcher's tests wait for them
pub fn assert_none_left(needle: &str) {
    let start = std::time::Instant::now();
    while processes_with(needle) > 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "agents left running"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A 32-byte fleet secret in hex, every byte `b`.
#[allow(dead_code)] // not every test binary starts agents
pub fn secret(b: u8) -> String {
    format!("{b:02x}").repeat(32)
}

/// Writes `len` pseudo-random bytes (the same for the same `seed`).
#[allow(dead_code)] // not every test binary makes files
pub fn make_file(path: &Path, len: u64, seed: &[u8]) {
    let mut xof = blake3::Hasher::new().update(seed).finalize_xof();
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

/// The BLAKE3 hash of a file's contents; `None` when it cannot be read.
#[allow(dead_code)] // not every test binary compares copies
pub fn hash(path: &Path) -> Option<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path).ok()?).ok()?;
    Some(h.finalize())
}

/// A throwaway sshd on 127.0.0.1 and 127.0.0.2 (a fresh host key, and a user key for this
/// user in `dir`), killed on drop. `ssh_args` log in to it.
#[allow(dead_code)] // only the ssh launcher's tests run one
pub struct Sshd {
    child: std::process::Child,
    pub port: u16,
    pub ssh_args: String,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(dead_code)]
impl Sshd {
    /// Starts it with its files in `dir`, `extra` lines added to its config. The daemon is the
    /// one `build.rs` found (`BULKCAST_SSHD`).
    pub fn start(dir: &Path, extra: &str) -> Sshd {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let sshd = option_env!("BULKCAST_SSHD").unwrap_or("/usr/sbin/sshd");
        for name in ["host_key", "user_key"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", ""])
                .arg("-f")
                .arg(dir.join(name))
                .status()
                .unwrap();
            assert!(st.success());
        }
        std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.display();
        std::fs::write(
            dir.join("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\n\
                 HostKey {d}/host_key\nPidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\n{extra}"
            ),
        )
        .unwrap();
        let _ = std::fs::create_dir_all("/run/sshd");
        let child = Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd");
        let sshd = Sshd {
            child,
            port,
            ssh_args: format!(
                "-p {port} -i {d}/user_key -o StrictHostKeyChecking=no \
                 -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
            ),
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.2", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "sshd did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        sshd
    }

    /// The user the tests log in to it as (this one).
    pub fn user() -> String {
        std::env::var("USER").unwrap_or_else(|_| "root".into())
    }
}
