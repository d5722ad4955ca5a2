//! The processes the tests start, killed on drop (also when an assertion fails): any
//! [`Proc`], and a `bulkcast agent` started on loopback (or in a namespace), its addresses read
//! from the first line it prints.

use std::io::Read;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::bin_in;

/// A process killed on drop; it derefs to its [`Child`].
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Deref for Proc {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for Proc {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// A running agent.
pub struct Agent {
    pub child: Child,
    /// The first address it listens on.
    pub addr: String,
    /// Further addresses it listens on.
    #[allow(dead_code)] // only the multipath tests listen on several
    pub paths: Vec<String>,
    /// Where it stores what it receives.
    #[allow(dead_code)] // not every test binary looks at the copies
    pub dir: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `bulkcast agent --dir DIR` listening on every address of `listen`; `setup` adds
/// the test's options and environment, and may send its stderr somewhere (discarded
/// otherwise). Its stdout is piped: the first line gives its addresses.
pub fn spawn_agent(dir: &Path, listen: &[&str], setup: impl FnOnce(&mut Command)) -> Agent {
    spawn_agent_in(None, dir, listen, setup)
}

/// [`spawn_agent`] inside network namespace `ns` if given.
pub fn spawn_agent_in(
    ns: Option<&str>,
    dir: &Path,
    listen: &[&str],
    setup: impl FnOnce(&mut Command),
) -> Agent {
    let mut c = bin_in(ns);
    c.arg("agent")
        .args(listen.iter().flat_map(|l| ["--listen", l]))
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    setup(&mut c);
    let mut child = c.spawn().unwrap();
    let line = first_line(child.stdout.as_mut().unwrap());
    let mut addrs = listen_addrs(&line);
    assert!(!addrs.is_empty(), "no address in the agent's {line:?}");
    let addr = addrs.remove(0);
    Agent {
        child,
        addr,
        paths: addrs,
        dir: dir.to_path_buf(),
    }
}

/// The addresses in "... listening on A, B, storing into ...".
pub fn listen_addrs(line: &str) -> Vec<String> {
    let Some(rest) = line.split(" listening on ").nth(1) else {
        return Vec::new();
    };
    rest.split(", ")
        .take_while(|w| !w.starts_with("storing"))
        .map(str::to_string)
        .collect()
}

/// Reads one line byte by byte, leaving the rest of the stream unread.
pub fn first_line(r: &mut impl Read) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while r.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}
