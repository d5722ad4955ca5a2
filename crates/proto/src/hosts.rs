//! The hosts file: who takes part in a session, where they are, and what their links can carry.
//!
//! One TOML file serves `bulkcast send --to`, the planner (`bulkcast plan --hosts`) and the lab
//! (which writes one for the hosts it emulates), so every field is optional except a host's name
//! and address. Capacities are in Mbit/s as operators quote them.
//!
//! ```toml
//! # The source: optional; describes the sending host for the planner.
//! [source]
//! name = "london-1"
//! site = "london"
//! uplink_mbps = 1000
//!
//! [[host]]
//! name = "fra-1"
//! addr = "10.0.1.2:7400"      # where its agent listens
//! site = "frankfurt"          # cluster label: hosts of one site share a LAN
//! uplink_mbps = 1000          # access link capacity, host -> network
//! downlink_mbps = 1000        # access link capacity, network -> host
//! max_fanout = 4              # at most this many children in a tree
//! paths = ["10.0.2.2:7400"]   # further addresses of the same agent (extra network paths)
//!
//! [[host]]
//! name = "fra-3"
//! ssh = "ops@fra-3:2222"      # no agent runs there: `send` starts a one-shot one over ssh
//! ```
//!
//! A comma-separated list `host:port,host:port` is the short form: each entry becomes a host named
//! after its address, with no site and no capacities.

use serde::{Deserialize, Serialize};

/// A parsed hosts file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    /// The sending host, when the file describes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceSpec>,
    /// The receiving hosts, in the order the file gives them (the order fixed fan-out trees use).
    #[serde(default, rename = "host")]
    pub hosts: Vec<HostSpec>,
}

/// The sending host's description.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Display name; defaults to "source".
    #[serde(default = "default_source_name")]
    pub name: String,
    /// Where the source can be reached by agents (for probing); optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// Site (cluster) label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// Access uplink capacity in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_mbps: Option<f64>,
    /// Access downlink capacity in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downlink_mbps: Option<f64>,
    /// Most children the source may feed directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fanout: Option<usize>,
}

fn default_source_name() -> String {
    "source".into()
}

/// One receiving host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// Unique display name.
    pub name: String,
    /// `host:port` of the host's agent; empty (left out) for an `ssh` host until `send` has
    /// started its agent.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub addr: String,
    /// `[user@]host[:port]`: `send` starts a one-shot agent there over ssh (as `--ssh` does)
    /// instead of going to a running one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// Site (cluster) label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// Access uplink capacity in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink_mbps: Option<f64>,
    /// Access downlink capacity in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downlink_mbps: Option<f64>,
    /// Most children this host may feed in a tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_fanout: Option<usize>,
    /// Further `host:port` addresses of the same agent, one per extra network path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

impl HostSpec {
    /// A host known only by its address, as the short `--to a:1,b:2` form gives it.
    pub fn from_addr(addr: &str) -> Self {
        Self {
            name: addr.to_string(),
            addr: addr.to_string(),
            site: None,
            uplink_mbps: None,
            downlink_mbps: None,
            max_fanout: None,
            paths: Vec::new(),
            ssh: None,
        }
    }
}

/// Why a hosts file or list was refused.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The TOML did not parse or had unknown fields.
    #[error("hosts file is not valid: {0}")]
    Toml(#[from] toml::de::Error),
    /// No receiving host was given.
    #[error("no receiving hosts given")]
    Empty,
    /// Two hosts share a name.
    #[error("host name {0:?} appears twice")]
    DuplicateName(String),
    /// Two hosts share an address.
    #[error("address {0:?} appears twice")]
    DuplicateAddr(String),
    /// An address is not `host:port`.
    #[error("host {name:?}: address {addr:?} is not host:port")]
    BadAddr {
        /// Host name.
        name: String,
        /// The address as written.
        addr: String,
    },
    /// A host has neither an agent's address nor `ssh`, or both.
    #[error("host {0:?}: give addr (a running agent) or ssh (start one over ssh), one of them")]
    AddrOrSsh(String),
    /// An `ssh` value is not `[user@]host[:port]`.
    #[error("host {name:?}: ssh = {value:?}: {why}")]
    BadSsh {
        /// Host name.
        name: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A capacity or fan-out is zero, negative or not a number.
    #[error("host {name:?}: {field} must be positive, got {value}")]
    BadValue {
        /// Host name.
        name: String,
        /// Field name.
        field: &'static str,
        /// The value as written.
        value: String,
    },
}

impl HostsFile {
    /// Parses and validates a hosts file's text.
    pub fn parse_toml(text: &str) -> Result<Self, HostsError> {
        let file: HostsFile = toml::from_str(text)?;
        file.validate()?;
        Ok(file)
    }

    /// Parses the short form, a comma-separated list of `host:port`.
    pub fn parse_list(list: &str) -> Result<Self, HostsError> {
        let hosts = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(HostSpec::from_addr)
            .collect();
        let file = HostsFile {
            source: None,
            hosts,
        };
        file.validate()?;
        Ok(file)
    }

    /// Serializes back to TOML (the lab writes hosts files this way).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("hosts file always serializes")
    }

    fn validate(&self) -> Result<(), HostsError> {
        if self.hosts.is_empty() {
            return Err(HostsError::Empty);
        }
        let mut names = std::collections::HashSet::new();
        let mut addrs = std::collections::HashSet::new();
        for h in &self.hosts {
            if !names.insert(h.name.as_str()) {
                return Err(HostsError::DuplicateName(h.name.clone()));
            }
            if let Some(v) = &h.ssh {
                SshTarget::parse(v).map_err(|why| HostsError::BadSsh {
                    name: h.name.clone(),
                    value: v.clone(),
                    why,
                })?;
                // Its agent's port is known only once it runs: no address, no extra paths.
                if !h.addr.is_empty() || !h.paths.is_empty() {
                    return Err(HostsError::AddrOrSsh(h.name.clone()));
                }
            } else if h.addr.is_empty() {
                return Err(HostsError::AddrOrSsh(h.name.clone()));
            }
            let addr = Some(&h.addr).filter(|a| !a.is_empty());
            for a in addr.into_iter().chain(&h.paths) {
                if !valid_addr(a) {
                    return Err(HostsError::BadAddr {
                        name: h.name.clone(),
                        addr: a.clone(),
                    });
                }
                if !addrs.insert(a.as_str()) {
                    return Err(HostsError::DuplicateAddr(a.clone()));
                }
            }
            check_caps(&h.name, h.uplink_mbps, h.downlink_mbps, h.max_fanout)?;
        }
        if let Some(s) = &self.source {
            check_caps(&s.name, s.uplink_mbps, s.downlink_mbps, s.max_fanout)?;
        }
        Ok(())
    }
}

/// Where `ssh` logs in: `[user@]host[:port]` (`[v6addr]` in brackets when a port follows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    /// `user@host` or `host`, as `ssh` takes it (brackets removed).
    pub login: String,
    /// The host alone: where its agent is reached (brackets kept for IPv6).
    pub host: String,
    /// `ssh -p`, when given.
    pub port: Option<u16>,
}

impl SshTarget {
    /// Parses `[user@]host[:port]`; the error says what is wrong.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        if s.is_empty() {
            return Err("empty; write user@host or user@host:port");
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("contains white space");
        }
        // ssh would take a leading '-' as an option.
        if s.starts_with('-') {
            return Err("starts with '-'");
        }
        let (user, rest) = match s.rsplit_once('@') {
            Some(("", _)) => return Err("the user before '@' is empty"),
            Some((u, r)) => (Some(u), r),
            None => (None, s),
        };
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').ok_or("a '[' without its ']'")?;
            if !addr.contains(':') {
                return Err("only an IPv6 address goes in brackets");
            }
            match after {
                "" => (addr, None),
                p => (addr, Some(p.strip_prefix(':').ok_or("junk after ']'")?)),
            }
        } else {
            match rest.split_once(':') {
                Some((_, p)) if p.contains(':') => {
                    return Err("an IPv6 address goes in brackets: user@[::1]:22")
                }
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if host.is_empty() {
            return Err("the host is empty");
        }
        if host.starts_with('-') || host.contains(['[', ']', '@', '/']) {
            return Err("the host is not a host name or address");
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n != 0 => Some(n),
                _ => return Err("the port is not a number from 1 to 65535"),
            },
        };
        let v6 = host.contains(':');
        Ok(SshTarget {
            login: match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_string(),
            },
            host: if v6 {
                format!("[{host}]")
            } else {
                host.to_string()
            },
            port,
        })
    }
}

impl std::fmt::Display for SshTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) => write!(f, "{} (port {p})", self.login),
            None => f.write_str(&self.login),
        }
    }
}

fn valid_addr(a: &str) -> bool {
    match a.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0),
        None => false,
    }
}

fn check_caps(
    name: &str,
    up: Option<f64>,
    down: Option<f64>,
    fanout: Option<usize>,
) -> Result<(), HostsError> {
    for (field, v) in [("uplink_mbps", up), ("downlink_mbps", down)] {
        if let Some(v) = v {
            if !(v.is_finite() && v > 0.0) {
                return Err(HostsError::BadValue {
                    name: name.into(),
                    field,
                    value: v.to_string(),
                });
            }
        }
    }
    if fanout == Some(0) {
        return Err(HostsError::BadValue {
            name: name.into(),
            field: "max_fanout",
            value: "0".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_file_round_trips() {
        let text = r#"
            [source]
            name = "lon-1"
            site = "london"
            uplink_mbps = 1000

            [[host]]
            name = "fra-1"
            addr = "10.0.1.2:7400"
            site = "frankfurt"
            uplink_mbps = 100
            downlink_mbps = 200
            max_fanout = 3
            paths = ["10.0.2.2:7400"]

            [[host]]
            name = "fra-2"
            addr = "10.0.1.3:7400"
        "#;
        let f = HostsFile::parse_toml(text).unwrap();
        assert_eq!(f.hosts.len(), 2);
        assert_eq!(f.hosts[0].max_fanout, Some(3));
        assert_eq!(f.source.as_ref().unwrap().site.as_deref(), Some("london"));
        assert_eq!(HostsFile::parse_toml(&f.to_toml()).unwrap(), f);
    }

    #[test]
    fn short_list() {
        let f = HostsFile::parse_list("127.0.0.1:7001, 127.0.0.1:7002").unwrap();
        assert_eq!(f.hosts[1].name, "127.0.0.1:7002");
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(HostsFile::parse_list(""), Err(HostsError::Empty)));
        assert!(matches!(
            HostsFile::parse_list("a:1,a:1"),
            Err(HostsError::DuplicateName(_))
        ));
        assert!(matches!(
            HostsFile::parse_list("nohostport"),
            Err(HostsError::BadAddr { .. })
        ));
        let t = "[[host]]\nname='a'\naddr='x:1'\nuplink_mbps=0\n";
        assert!(matches!(
            HostsFile::parse_toml(t),
            Err(HostsError::BadValue { .. })
        ));
        let t = "[[host]]\nname='a'\n";
        assert!(matches!(
            HostsFile::parse_toml(t),
            Err(HostsError::AddrOrSsh(_))
        ));
        let t = "[[host]]\nname='a'\naddr='x:1'\nssh='u@x'\n";
        assert!(matches!(
            HostsFile::parse_toml(t),
            Err(HostsError::AddrOrSsh(_))
        ));
        let t = "[[host]]\nname='a'\naddr='x:1'\ncolour='red'\n";
        assert!(matches!(HostsFile::parse_toml(t), Err(HostsError::Toml(_))));
    }

    #[test]
    fn ssh_hosts_mix_with_running_agents() {
        let text = r#"
            [[host]]
            name = "a"
            addr = "10.0.0.1:7400"
            [[host]]
            name = "b"
            ssh = "ops@b.example:2222"
            [[host]]
            name = "c"
            ssh = "c.example"
        "#;
        let f = HostsFile::parse_toml(text).unwrap();
        assert_eq!(f.hosts[1].ssh.as_deref(), Some("ops@b.example:2222"));
        assert!(f.hosts[1].addr.is_empty());
        assert_eq!(HostsFile::parse_toml(&f.to_toml()).unwrap(), f);
    }

    #[test]
    fn ssh_targets_parse_or_say_why_not() {
        let t = |login: &str, host: &str, port| SshTarget {
            login: login.into(),
            host: host.into(),
            port,
        };
        for (s, want) in [
            ("ops@h", t("ops@h", "h", None)),
            ("ops@h:2222", t("ops@h", "h", Some(2222))),
            ("h", t("h", "h", None)),
            ("10.0.0.2:22", t("10.0.0.2", "10.0.0.2", Some(22))),
            ("me@[::1]:2200", t("me@::1", "[::1]", Some(2200))),
            ("me@[fe80::2]", t("me@fe80::2", "[fe80::2]", None)),
            ("a@b@h", t("a@b@h", "h", None)),
        ] {
            assert_eq!(SshTarget::parse(s), Ok(want), "{s}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("ops@", "host is empty"),
            ("@h", "user"),
            ("ops@:22", "host is empty"),
            ("ops@h:", "port"),
            ("ops@h:0", "port"),
            ("ops@h:70000", "port"),
            ("ops@h:ssh", "port"),
            ("ops@::1", "brackets"),
            ("ops@[::1", "']'"),
            ("ops@[h]:22", "IPv6"),
            ("ops@[::1]22", "junk"),
            ("ops@h x", "white space"),
            ("-oProxyCommand=x", "'-'"),
            ("ops@-h", "host name"),
            ("ops@h/x", "host name"),
        ] {
            let e = SshTarget::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let t = "[[host]]\nname='b'\nssh='ops@b:x'\n";
        let e = HostsFile::parse_toml(t).unwrap_err().to_string();
        assert!(
            e.contains("\"b\"") && e.contains("ops@b:x") && e.contains("port"),
            "{e}"
        );
    }
}
