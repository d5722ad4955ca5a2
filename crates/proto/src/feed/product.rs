//! Products, their authentication, and who wants which: feedtype patterns, name regexes,
//! subscriptions and allow rules.

use std::net::IpAddr;

use std::sync::Arc;

use bytes::Bytes;

use crate::auth::Secret;
use crate::identity::{Identity, PublicKey, Role};

/// Microseconds since the Unix epoch: every time in the feed core. The shell reads the wall
/// clock; creation times cross hosts, so latencies assume clocks in sync (NTP), as LDM's do.
pub type Micros = u64;

/// Largest product name, feedtype and regex, in bytes (they cross the wire in one frame).
pub const MAX_NAME: usize = 1024;

/// What a product is: everything but its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductMeta {
    /// Position in the source's queue: 1, 2, 3... never reused, even across restarts.
    pub seq: u64,
    /// The product's name (an identifier, LDM's "product id"); the file name at subscribers
    /// is derived from it.
    pub name: String,
    /// Its feedtype (`NEXRAD3`, `NGRID`...): what subscriptions select on.
    pub feedtype: String,
    /// When the product was created (inserted at the source).
    pub created: Micros,
    /// Its size in bytes.
    pub size: u64,
    /// BLAKE3 of its bytes.
    pub hash: [u8; 32],
    /// The source's authentication of all of the above (see [`ProductAuth`]).
    pub tag: Bytes,
}

impl ProductMeta {
    /// The bytes the source authenticates: every field but the tag, unambiguously framed.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(80 + self.name.len() + self.feedtype.len());
        v.extend_from_slice(b"bulkcast feed product v1\0");
        v.extend_from_slice(&self.seq.to_be_bytes());
        v.extend_from_slice(&(self.name.len() as u32).to_be_bytes());
        v.extend_from_slice(self.name.as_bytes());
        v.extend_from_slice(&(self.feedtype.len() as u32).to_be_bytes());
        v.extend_from_slice(self.feedtype.as_bytes());
        v.extend_from_slice(&self.created.to_be_bytes());
        v.extend_from_slice(&self.size.to_be_bytes());
        v.extend_from_slice(&self.hash);
        v
    }

    /// A safe file name for the product: its name with `/` and other unsafe bytes replaced,
    /// so a product can never escape the subscriber's directory.
    pub fn file_name(&self) -> String {
        let mut s: String = self
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+' | '=' | ',') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if s.is_empty() || s.starts_with('.') {
            s.insert(0, '_');
        }
        s.truncate(200);
        s
    }
}

/// How the source authenticates products and subscribers check them.
///
/// This is the seam for per-host keys: today [`SecretAuth`] MACs with a key derived from the
/// shared session secret (every holder could forge); an ed25519 signer implements the same
/// trait with a 64-byte tag and a verifier that holds only the source's public key.
pub trait ProductAuth: Send + Sync {
    /// The tag for `meta` (its `tag` field is ignored).
    fn tag(&self, meta: &ProductMeta) -> Bytes;
    /// True when `meta.tag` was made by the source for exactly these fields.
    fn verify(&self, meta: &ProductMeta) -> bool;
}

/// [`ProductAuth`] by a BLAKE3 keyed MAC under a key derived from the session secret.
#[derive(Clone)]
pub struct SecretAuth {
    key: [u8; 32],
}

impl SecretAuth {
    /// Derives the product key (distinct from the chunk and handshake keys).
    pub fn new(secret: &Secret) -> Self {
        Self {
            key: blake3::derive_key(
                "bulkcast 2026-11 feed product v1",
                secret.to_hex().as_bytes(),
            ),
        }
    }

    fn mac(&self, meta: &ProductMeta) -> [u8; 32] {
        *blake3::keyed_hash(&self.key, &meta.signed_bytes()).as_bytes()
    }
}

impl ProductAuth for SecretAuth {
    fn tag(&self, meta: &ProductMeta) -> Bytes {
        Bytes::copy_from_slice(&self.mac(meta))
    }

    fn verify(&self, meta: &ProductMeta) -> bool {
        let want = self.mac(meta);
        meta.tag.len() == 32
            && want
                .iter()
                .zip(meta.tag.iter())
                .fold(0u8, |a, (x, y)| a | (x ^ y))
                == 0
    }
}

/// [`ProductAuth`] by the source's host key (ed25519): the tag is the source's public key and
/// its signature of the product's fields, and a subscriber takes a product only when that key
/// may push to it (its allow list, see [`crate::identity`]). Unlike [`SecretAuth`], a holder of
/// the session secret (a subscriber, a relaying member) cannot forge products.
#[derive(Clone)]
pub struct SignedAuth {
    id: Arc<Identity>,
}

impl SignedAuth {
    /// Signs with `id.key`; accepts products signed by keys `id.allow` lets push.
    pub fn new(id: Identity) -> Self {
        Self { id: Arc::new(id) }
    }
}

impl ProductAuth for SignedAuth {
    fn tag(&self, meta: &ProductMeta) -> Bytes {
        let mut t = Vec::with_capacity(96);
        t.extend_from_slice(&self.id.key.public().to_bytes());
        t.extend_from_slice(&self.id.key.sign(&meta.signed_bytes()));
        Bytes::from(t)
    }

    fn verify(&self, meta: &ProductMeta) -> bool {
        let (Ok(key), Ok(sig)) = (
            <[u8; 32]>::try_from(meta.tag.get(..32).unwrap_or_default()),
            <[u8; 64]>::try_from(meta.tag.get(32..).unwrap_or_default()),
        ) else {
            return false;
        };
        let Ok(key) = PublicKey::from_bytes(&key) else {
            return false;
        };
        self.id.allow.role(&key) == Some(Role::Push) && key.verify(&meta.signed_bytes(), &sig)
    }
}

/// Why a pattern, regex or rule was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatternError {
    /// An empty alternative or a character outside `[A-Za-z0-9_*]`.
    #[error("bad feedtype pattern {0:?}: use names like NEXRAD3, alternatives joined by '|', a trailing '*' for a prefix, or ANY")]
    Feedtype(String),
    /// The name regex does not compile.
    #[error("bad name regex {0:?}: {1}")]
    Regex(String, String),
    /// The host part of an allow rule is not `*`, an address or a CIDR block.
    #[error("bad host pattern {0:?}: use *, an IP address or a CIDR block like 10.0.0.0/8")]
    Host(String),
}

/// A feedtype pattern: `ANY`/`*`, or alternatives joined by `|`, each a feedtype name
/// (case-insensitive) or a prefix ending in `*` (`NEXRAD*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedPattern {
    alts: Vec<(String, bool)>,
    text: String,
}

impl FeedPattern {
    /// Parses a pattern.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let bad = || PatternError::Feedtype(text.to_string());
        if text.len() > MAX_NAME {
            return Err(bad());
        }
        let mut alts = Vec::new();
        for a in text.split('|') {
            let a = a.trim().to_ascii_uppercase();
            let (stem, prefix) = match a.strip_suffix('*') {
                Some(s) => (s.to_string(), true),
                None if a == "ANY" => (String::new(), true),
                None => (a, false),
            };
            let ok = stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !ok || (stem.is_empty() && !prefix) {
                return Err(bad());
            }
            alts.push((stem, prefix));
        }
        Ok(Self {
            alts,
            text: text.to_string(),
        })
    }

    /// True when `feedtype` is selected.
    pub fn matches(&self, feedtype: &str) -> bool {
        let f = feedtype.to_ascii_uppercase();
        self.alts.iter().any(|(stem, prefix)| {
            if *prefix {
                f.starts_with(stem.as_str())
            } else {
                f == *stem
            }
        })
    }

    /// The pattern as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// What a subscriber asks for (LDM's `REQUEST feedtype "regex"`).
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Feedtypes wanted.
    pub feedtype: FeedPattern,
    /// Names wanted (unanchored, as LDM's); `None` for every name.
    pub name: Option<regex::Regex>,
}

impl Subscription {
    /// Parses a feedtype pattern and an optional name regex (empty means none).
    pub fn parse(feedtype: &str, name: &str) -> Result<Self, PatternError> {
        let name = if name.is_empty() {
            None
        } else {
            if name.len() > MAX_NAME {
                return Err(PatternError::Regex(name.into(), "too long".into()));
            }
            Some(
                regex::RegexBuilder::new(name)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| PatternError::Regex(name.into(), e.to_string()))?,
            )
        };
        Ok(Self {
            feedtype: FeedPattern::parse(feedtype)?,
            name,
        })
    }

    /// True when the product is wanted.
    pub fn matches(&self, meta: &ProductMeta) -> bool {
        self.feedtype.matches(&meta.feedtype)
            && self.name.as_ref().is_none_or(|r| r.is_match(&meta.name))
    }

    /// The name regex as given ("" for none).
    pub fn name_str(&self) -> &str {
        self.name.as_ref().map_or("", |r| r.as_str())
    }
}

/// Which hosts may subscribe to what (LDM's `ALLOW`): host pattern and feedtype pattern.
#[derive(Debug, Clone)]
pub struct AllowRule {
    host: HostPattern,
    feedtype: FeedPattern,
}

/// Which hosts a rule covers: `*`, an address or a CIDR block (the host part of an
/// [`AllowRule`], and `feed serve --allow-relay`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Every host.
    Any,
    /// The hosts whose first bits (the second field) are those of the address.
    Net(IpAddr, u8),
}

impl HostPattern {
    /// Parses `*`, an address or a CIDR block.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let bad = || PatternError::Host(text.to_string());
        let h = text.trim();
        if h == "*" {
            return Ok(Self::Any);
        }
        let (a, bits) = match h.split_once('/') {
            Some((a, b)) => (a, Some(b.parse::<u8>().map_err(|_| bad())?)),
            None => (h, None),
        };
        let ip: IpAddr = a.parse().map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(bad());
        }
        Ok(Self::Net(ip, bits))
    }

    /// True when `host` falls under the pattern (an IPv4-mapped IPv6 address as IPv4).
    pub fn covers(&self, host: IpAddr) -> bool {
        match *self {
            Self::Any => true,
            Self::Net(net, bits) => prefix_eq(net, canonical(host), bits),
        }
    }
}

impl AllowRule {
    /// Parses `HOST=FEEDTYPE-PATTERN`, HOST being `*`, an address or a CIDR block.
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let (host, ft) = text
            .split_once('=')
            .ok_or_else(|| PatternError::Host(text.to_string()))?;
        Ok(Self {
            host: HostPattern::parse(host)?,
            feedtype: FeedPattern::parse(ft)?,
        })
    }

    /// True when `host` falls under the rule.
    pub fn covers_host(&self, host: IpAddr) -> bool {
        self.host.covers(host)
    }

    /// True when the rule lets `host` have products of `feedtype`.
    pub fn allows(&self, host: IpAddr, feedtype: &str) -> bool {
        self.covers_host(host) && self.feedtype.matches(feedtype)
    }
}

/// An IPv4-mapped IPv6 address as IPv4, so `10.0.0.0/8` covers `::ffff:10.1.2.3`.
fn canonical(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

fn prefix_eq(net: IpAddr, a: IpAddr, bits: u8) -> bool {
    let (n, x, width) = match (net, a) {
        (IpAddr::V4(n), IpAddr::V4(x)) => (u32::from(n) as u128, u32::from(x) as u128, 32),
        (IpAddr::V6(n), IpAddr::V6(x)) => (u128::from(n), u128::from(x), 128),
        _ => return false,
    };
    if bits == 0 {
        return true;
    }
    let shift = width - u32::from(bits);
    (n >> shift) == (x >> shift)
}

/// True when some rule lets `host` have `feedtype` (no rules: nobody).
pub fn allowed(rules: &[AllowRule], host: IpAddr, feedtype: &str) -> bool {
    rules.iter().any(|r| r.allows(host, feedtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_select_feedtypes() {
        let p = FeedPattern::parse("NEXRAD*|ids").unwrap();
        assert!(p.matches("NEXRAD3") && p.matches("IDS") && !p.matches("NGRID"));
        assert!(FeedPattern::parse("ANY").unwrap().matches("X"));
        assert!(FeedPattern::parse("A||B").is_err());
        assert!(FeedPattern::parse("A B").is_err());
    }

    #[test]
    fn allow_rules_match_host_and_feedtype() {
        let r = AllowRule::parse("10.0.0.0/8=NGRID").unwrap();
        assert!(r.allows("10.2.3.4".parse().unwrap(), "NGRID"));
        assert!(r.allows("::ffff:10.2.3.4".parse().unwrap(), "ngrid"));
        assert!(!r.allows("11.2.3.4".parse().unwrap(), "NGRID"));
        assert!(!r.allows("10.2.3.4".parse().unwrap(), "IDS"));
        assert!(AllowRule::parse("10.0.0.0/33=ANY").is_err());
        assert!(AllowRule::parse("nohost").is_err());
        let h = HostPattern::parse("127.0.0.0/8").unwrap();
        assert!(h.covers("127.0.0.1".parse().unwrap()));
        assert!(h.covers("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!h.covers("10.0.0.1".parse().unwrap()));
        assert_eq!(HostPattern::parse(" * "), Ok(HostPattern::Any));
        assert!(HostPattern::parse("::1/129").is_err());
        assert!(
            HostPattern::parse("relay.example").is_err(),
            "addresses, not names"
        );
    }

    #[test]
    fn file_names_never_escape() {
        let mut m = ProductMeta {
            seq: 1,
            name: "../../etc/passwd".into(),
            feedtype: "X".into(),
            created: 0,
            size: 0,
            hash: [0; 32],
            tag: Bytes::new(),
        };
        assert_eq!(m.file_name(), "_.._.._etc_passwd");
        m.name = String::new();
        assert_eq!(m.file_name(), "_");
    }

    #[test]
    fn tags_cover_every_field() {
        let auth = SecretAuth::new(&Secret::from_bytes([7; 32]));
        let mut m = ProductMeta {
            seq: 3,
            name: "a".into(),
            feedtype: "X".into(),
            created: 5,
            size: 9,
            hash: [1; 32],
            tag: Bytes::new(),
        };
        m.tag = auth.tag(&m);
        assert!(auth.verify(&m));
        m.seq = 4;
        assert!(!auth.verify(&m));
        let other = SecretAuth::new(&Secret::from_bytes([8; 32]));
        m.seq = 3;
        assert!(!other.verify(&m));
    }

    /// With host keys a product is the source's: a subscriber or relay holding the secret (or
    /// a key that may only relay) cannot make one the others accept.
    #[test]
    fn signed_products_verify_only_from_a_source_allowed_to_push() {
        use crate::identity::{AllowList, HostKey};
        let (source, relay) = (HostKey::from_seed([1; 32]), HostKey::from_seed([2; 32]));
        let allow =
            AllowList::with_roles([(source.public(), Role::Push), (relay.public(), Role::Relay)]);
        let by = |k: &HostKey| {
            SignedAuth::new(Identity {
                key: k.clone(),
                allow: allow.clone(),
            })
        };
        let subscriber = by(&HostKey::from_seed([3; 32]));
        let mut m = ProductMeta {
            seq: 3,
            name: "a".into(),
            feedtype: "X".into(),
            created: 5,
            size: 9,
            hash: [1; 32],
            tag: Bytes::new(),
        };
        m.tag = by(&source).tag(&m);
        assert_eq!(m.tag.len(), 96);
        assert!(subscriber.verify(&m));
        let mut altered = m.clone();
        altered.name = "b".into();
        assert!(!subscriber.verify(&altered));
        let mut relayed = m.clone();
        relayed.tag = by(&relay).tag(&m);
        assert!(
            !subscriber.verify(&relayed),
            "a relay-only key signed a product"
        );
        relayed.tag = SecretAuth::new(&Secret::from_bytes([7; 32])).tag(&m);
        assert!(!subscriber.verify(&relayed), "a MAC passed for a signature");
        relayed.tag = m.tag.slice(..95);
        assert!(!subscriber.verify(&relayed));
        // Revoked: the source taken off the subscriber's list.
        allow.replace(&AllowList::of([relay.public()]));
        assert!(!subscriber.verify(&m));
    }
}
