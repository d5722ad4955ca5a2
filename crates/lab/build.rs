//! Decides whether this crate's root-only tests are built to run or to be ignored: see
//! `build/root_tests.rs` at the repository's root, which the lab and the CLI share.

include!("../../build/root_tests.rs");
