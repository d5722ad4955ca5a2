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
    /// `host:port` of the host's agent.
    pub addr: String,
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
            for a in std::iter::once(&h.addr).chain(&h.paths) {
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
        let t = "[[host]]\nname='a'\naddr='x:1'\ncolour='red'\n";
        assert!(matches!(HostsFile::parse_toml(t), Err(HostsError::Toml(_))));
    }
}
