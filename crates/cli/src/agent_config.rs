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
//!
//! [[feed]]                           # a subscription, like LDM's REQUEST; repeatable
//! source = "feeds.example.org:7388"
//! feedtype = "NEXRAD3|IDS"
//! dir = "/var/data/nexrad"           # also where its position is saved
//! ```
//!
//! A setting given both in the file and as a flag is an error (which one was meant?);
//! unknown keys are errors too, so a typo does not fall back to a default silently.
//! `[[feed]]` tables take the settings of `feed subscribe`
//! ([`bulkcast_runtime::feed::request::FeedLine`]); a bad one is named by its line.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bulkcast_runtime::feed::request::{self, FeedLine};
use serde::Deserialize;
use toml::Spanned;

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
    /// Subscriptions, with where each is in the file.
    #[serde(default)]
    pub feed: Vec<Spanned<FeedLine>>,
    /// The line each `[[feed]]` starts on (filled in by [`AgentFile::parse`]).
    #[serde(skip)]
    feed_lines: Vec<usize>,
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
        let mut f: AgentFile = toml::from_str(text)?;
        f.feed_lines = f
            .feed
            .iter()
            .map(|l| line_of(text, l.span().start))
            .collect();
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

impl AgentFile {
    /// The `[[feed]]` subscriptions, checked (with the agent's directory `agent_dir`, which
    /// none may share); an error names the line of the table at fault.
    pub fn feeds(&self, agent_dir: &Path) -> Result<Vec<FeedLine>> {
        let lines: Vec<FeedLine> = self.feed.iter().map(|l| l.get_ref().clone()).collect();
        if let Err(e) = request::check(&lines, Some(agent_dir)) {
            let at = self.feed_lines.get(e.index).copied().unwrap_or(0);
            bail!("[[feed]] #{} at line {at}: {}", e.index + 1, e.reason);
        }
        Ok(lines)
    }
}

/// The line (from 1) of byte `at` of `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
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

    const FEEDS: &str = r#"dir = "/var/lib/bulkcast"

[[feed]]
source = "feeds.example.org:7388"
feedtype = "NEXRAD3|IDS"
dir = "/data/nexrad"

[[feed]]
source = "10.1.0.5:7388"
feedtype = "NGRID"
name = "^gfs"
dir = "/data/grids"
exec = "ingest $1"
from = "-1h"
unicast = true
iface = "10.0.0.2"
fallback_after = 5.0
"#;

    fn feed_error(text: &str) -> String {
        match AgentFile::parse(text) {
            Ok(f) => format!("{:#}", f.feeds(Path::new("/var/lib/bulkcast")).unwrap_err()),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn feed_tables_parse_with_every_setting() {
        let f = AgentFile::parse(FEEDS).unwrap();
        let feeds = f.feeds(Path::new("/var/lib/bulkcast")).unwrap();
        assert_eq!(feeds.len(), 2);
        assert_eq!(feeds[0].feedtype, "NEXRAD3|IDS");
        assert_eq!(feeds[0].name, "");
        assert!(!feeds[0].unicast && feeds[0].exec.is_none() && feeds[0].from.is_none());
        let g = &feeds[1];
        assert_eq!(
            (g.source.as_str(), g.name.as_str()),
            ("10.1.0.5:7388", "^gfs")
        );
        assert_eq!(g.dir, Path::new("/data/grids"));
        assert_eq!(g.exec.as_deref(), Some("ingest $1"));
        assert_eq!(g.from.as_deref(), Some("-1h"));
        assert!(g.unicast);
        assert_eq!(g.iface, Some(std::net::Ipv4Addr::new(10, 0, 0, 2)));
        assert_eq!(g.fallback_after, Some(5.0));
        // Feeds are not flags: they never conflict with the command line.
        assert_eq!(f.given(), vec!["dir"]);
        assert!(AgentFile::parse("")
            .unwrap()
            .feeds(Path::new("/x"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_bad_feed_table_is_named_by_its_line() {
        // Values the parser cannot judge: named with the table's number and line.
        let e = feed_error(&FEEDS.replace("\"NGRID\"", "\"NG[RID\""));
        assert!(
            e.contains("[[feed]] #2 at line 8") && e.contains("NG[RID"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("^gfs", "(gfs"));
        assert!(
            e.contains("[[feed]] #2 at line 8") && e.contains("(gfs"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("feeds.example.org:7388", "feeds.example.org"));
        assert!(
            e.contains("[[feed]] #1 at line 3") && e.contains("HOST:PORT"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("-1h", "yesterday"));
        assert!(e.contains("[[feed]] #2") && e.contains("yesterday"), "{e}");
        // Two tables in one directory would overwrite each other's position.
        let e = feed_error(&FEEDS.replace("/data/grids", "/data/nexrad/"));
        assert!(
            e.contains("[[feed]] #2 at line 8") && e.contains("[[feed]] #1"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("/data/grids", "/var/lib/bulkcast"));
        assert!(e.contains("agent's own directory"), "{e}");
        // What the parser sees: unknown keys, missing ones, wrong types, with their line.
        let e = feed_error(&FEEDS.replace("unicast = true", "unicats = true"));
        assert!(
            e.contains("unknown field `unicats`") && e.contains("line 15"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("dir = \"/data/grids\"\n", ""));
        assert!(
            e.contains("missing field `dir`") && e.contains("line 8"),
            "{e}"
        );
        let e = feed_error(&FEEDS.replace("\"10.0.0.2\"", "\"eth0\""));
        assert!(e.contains("line 16"), "{e}");
    }
}
