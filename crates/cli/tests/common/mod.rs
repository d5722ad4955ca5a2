//! What the integration tests share.

use std::path::PathBuf;

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

#[path = "../../../lab/tests/support/root.rs"]
mod root;
pub use root::root_test_cannot_run;
