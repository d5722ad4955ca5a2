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
pub use agent::{first_line, listen_addrs, spawn_agent, Agent};

#[path = "../../../lab/tests/support/root.rs"]
#[allow(dead_code)] // only the binaries with root tests use it
mod root;
#[allow(unused_imports)] // only the binaries with root tests use it
pub use root::root_test_cannot_run;

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
