//! `bulkcast agent --config FILE`: an agent's settings in TOML, for services (systemd,
//! Kubernetes) that prefer a file to a command line.
//!
//! ```toml
//! listen = ["0.0.0.0:7400"]          # addresses (a host's path addresses too)
//! dir = "/var/lib/bulkcast"          # where received objects go
//! secret_file = "/etc/bulkcast/secret"
//! metrics = "127.0.0.1:9740"         # optional: Prometheus endpoint
//! web = "127.0.0.1:9741"             # optional: live page of its sessions
//! direct_io = false                  # optional
//!
//! [limits]
//! budget_mib = 64                    # memory for chunk buffers per session
//! ```
//!
//! A setting given both in the file and as a flag is an error (which one was meant?);
//! unknown keys are errors too, so a typo does not fall back to a default silently.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// The file's settings.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    pub listen: Option<Vec<String>>,
    pub dir: Option<PathBuf>,
    pub secret_file: Option<PathBuf>,
    pub metrics: Option<String>,
    pub web: Option<String>,
    pub direct_io: Option<bool>,
    #[serde(default)]
    pub limits: Limits,
}

/// `[limits]`.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub budget_mib: Option<u64>,
}

impl AgentFile {
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<AgentFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading agent config {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("agent config {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<AgentFile> {
        let f: AgentFile = toml::from_str(text)?;
        if f.listen.as_ref().is_some_and(|l| l.is_empty()) {
            bail!("`listen` names no address");
        }
        if let Some(b) = f.limits.budget_mib {
            if !(4..=65536).contains(&b) {
                bail!("`limits.budget_mib` must be between 4 and 65536, not {b}");
            }
        }
        Ok(f)
    }

    /// The names of the settings this file gives, as their flags are named.
    pub fn given(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        let mut add = |set: bool, name| {
            if set {
                v.push(name)
            }
        };
        add(self.listen.is_some(), "listen");
        add(self.dir.is_some(), "dir");
        add(self.secret_file.is_some(), "secret_file");
        add(self.metrics.is_some(), "metrics");
        add(self.web.is_some(), "web");
        add(self.direct_io.is_some(), "direct_io");
        add(self.limits.budget_mib.is_some(), "budget_mib");
        v
    }
}

/// Refuses a setting given twice: `flags` are the ids of the flags given on the command line.
pub fn check_conflicts(file: &AgentFile, flags: &[String], path: &Path) -> Result<()> {
    for name in file.given() {
        if flags.iter().any(|f| f == name) {
            bail!(
                "--{} is given both on the command line and in {}: keep one",
                name.replace('_', "-"),
                path.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_config_parses_and_says_what_it_sets() {
        let f = AgentFile::parse(
            r#"
            listen = ["0.0.0.0:7400", "10.2.0.5:7400"]
            dir = "/var/lib/bulkcast"
            secret_file = "/etc/bulkcast/secret"
            metrics = "127.0.0.1:9740"
            web = "127.0.0.1:9741"
            direct_io = true
            [limits]
            budget_mib = 128
            "#,
        )
        .unwrap();
        assert_eq!(f.listen.as_ref().unwrap().len(), 2);
        assert_eq!(f.limits.budget_mib, Some(128));
        assert_eq!(f.given().len(), 7);
        assert_eq!(AgentFile::parse("").unwrap(), AgentFile::default());
    }

    #[test]
    fn the_shipped_example_parses() {
        let f = AgentFile::parse(include_str!("../../../deploy/systemd/agent.toml")).unwrap();
        assert_eq!(f.dir.as_deref(), Some(Path::new("/var/lib/bulkcast")));
        // The unit gives the secret as a flag: the file must not give it too.
        assert_eq!(f.secret_file, None);
    }

    #[test]
    fn typos_bad_values_and_double_settings_are_errors() {
        let e = AgentFile::parse("dirr = \"/x\"").unwrap_err().to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = AgentFile::parse("[limits]\nbudget = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field"), "{e}");
        let e = AgentFile::parse("[limits]\nbudget_mib = 1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("between 4 and 65536"), "{e}");
        assert!(AgentFile::parse("listen = []").is_err());
        assert!(AgentFile::parse("listen = \"0.0.0.0:1\"").is_err());
        let f = AgentFile::parse("dir = \"/x\"").unwrap();
        let p = Path::new("a.toml");
        check_conflicts(&f, &["listen".into()], p).unwrap();
        let e = check_conflicts(&f, &["dir".into()], p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--dir is given both"), "{e}");
    }
}
