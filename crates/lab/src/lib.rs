//! bulkcast's lab: an emulated WAN of many hosts on one Linux machine.
//!
//! Each emulated host is a network namespace. Hosts of one site share a LAN (a bridge, IP
//! multicast works there); traffic between sites leaves each host through a TUN device into a
//! user-space forwarder that applies access links, WAN path rates, delay, jitter, loss and
//! drop-tail queues per 1500-byte packet. See `docs/lab.md` for the design, the scenario
//! format and the measured envelope.
//!
//! Library use (tests, benchmarks): [`Lab::up`] returns a guard that tears the lab down on drop.
//! CLI use: [`LabCommand`] and [`run`], run by the `bulkcast-lab` binary (`src/bin/bulkcast-lab.rs`).

pub mod bench;
pub mod check;
mod cli;
pub mod emu;
mod forwarder;
mod kernel;
mod lab;
mod lan;
pub mod mesh;
mod netns;
pub mod scenario;
pub mod streams;

pub use check::{CheckOptions, CheckReport};
pub use cli::{run, LabCommand};
pub use emu::{EmuStats, LinkStats};
pub use lab::{Lab, LabOptions};
pub use scenario::{Layout, Scenario};

/// Errors of the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The scenario file is invalid.
    #[error("scenario: {0}")]
    Scenario(String),
    /// The lab needs root and network namespaces.
    #[error("the lab needs root and network namespaces: {0}")]
    NotPermitted(String),
    /// A system call failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An external command failed.
    #[error("command `{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its error output.
        stderr: String,
    },
    /// A lab of this name is owned by another live process.
    #[error("lab {name:?} is in use by process {pid}")]
    Busy {
        /// Lab name.
        name: String,
        /// Owner pid.
        pid: i32,
    },
    /// No lab of this name is up.
    #[error("no lab named {0:?} is up")]
    NotUp(String),
    /// An unknown host name.
    #[error("no host named {0:?} in the lab")]
    UnknownHost(String),
    /// The forwarder stopped or did not start.
    #[error("forwarder: {0}")]
    Forwarder(String),
    /// A measurement could not be made.
    #[error("measurement: {0}")]
    Measure(String),
}

impl LabError {
    pub(crate) fn sys(what: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Sys {
            what: what.into(),
            source,
        }
    }
}

/// Checks that a lab can run here (root, `ip netns`, `/dev/net/tun`); a root-only test that was
/// built to run fails with the returned reason when it cannot (`crates/lab/tests/lab_root.rs`).
pub fn preflight() -> Result<(), LabError> {
    netns::preflight()
}
