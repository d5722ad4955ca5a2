//! Per-host identity: an ed25519 key pair per agent and sender (`bulkcast keygen`), and the
//! allow list of public keys a host admits.
//!
//! The same key pair serves the encrypted handshake (its X25519 form is the Noise static key,
//! see `bulkcast_runtime::secure`), so one file per host is all there is to keep. A peer is
//! admitted when its key is on the list; removing a line revokes it at the next connection.
//! Text forms: a key file holds the 32-byte secret seed as 64 hex digits; a public key is
//! 64 hex digits; an allow list has one public key per line, optionally followed by a name,
//! with `#` comments.
//!
//! An allow list is one shared list: its clones (in every copy of a host's keys, in running
//! sessions) see [`AllowList::replace`], so an agent reloads its list without a restart and a
//! removed key is refused from its next connection (and signatures by it from then on).

use std::fmt;
use std::sync::{Arc, RwLock};

use ed25519_dalek::{SigningKey, VerifyingKey};

/// A host's secret key.
#[derive(Clone)]
pub struct HostKey(SigningKey);

impl fmt::Debug for HostKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostKey({})", self.public())
    }
}

/// A host's public key (ed25519).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(VerifyingKey);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(self.0.as_bytes()))
    }
}

/// Why a key or an allow list did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not 64 hex digits.
    #[error("a key is 64 hex digits (32 bytes)")]
    Format,
    /// 64 hex digits, but not a point on the curve.
    #[error("not a valid ed25519 public key")]
    NotAKey,
    /// A line of an allow list.
    #[error("allow list line {line}: {err}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        err: Box<KeyError>,
    },
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Result<[u8; 32], KeyError> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return Err(KeyError::Format);
    }
    let mut b = [0u8; 32];
    for (i, out) in b.iter_mut().enumerate() {
        *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| KeyError::Format)?;
    }
    Ok(b)
}

impl HostKey {
    /// A key from 32 random bytes (the shell draws them from the OS).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self(SigningKey::from_bytes(&seed))
    }

    /// Parses a key file's text (64 hex digits; surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        Ok(Self::from_seed(unhex32(s)?))
    }

    /// The key file's text.
    pub fn to_hex(&self) -> String {
        hex(self.0.as_bytes())
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        use ed25519_dalek::Signer;
        self.0.sign(msg).to_bytes()
    }

    /// The X25519 secret of the same key pair (the Noise static key): ed25519's clamped
    /// scalar, whose public point is [`PublicKey::x25519`].
    pub fn x25519_secret(&self) -> [u8; 32] {
        self.0.to_scalar_bytes()
    }
}

impl PublicKey {
    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, KeyError> {
        let b = unhex32(s)?;
        VerifyingKey::from_bytes(&b)
            .map(Self)
            .map_err(|_| KeyError::NotAKey)
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// The key from its 32 bytes.
    pub fn from_bytes(b: &[u8; 32]) -> Result<Self, KeyError> {
        VerifyingKey::from_bytes(b)
            .map(Self)
            .map_err(|_| KeyError::NotAKey)
    }

    /// True when `sig` is this key's signature of `msg` (strict: no malleable forms).
    pub fn verify(&self, msg: &[u8], sig: &[u8; 64]) -> bool {
        let sig = ed25519_dalek::Signature::from_bytes(sig);
        self.0.verify_strict(msg, &sig).is_ok()
    }

    /// The X25519 (Montgomery) form, as a Noise handshake presents it.
    pub fn x25519(&self) -> [u8; 32] {
        self.0.to_montgomery().to_bytes()
    }
}

/// What a key on an allow list may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Push sessions of its own (its signature makes data acceptable) and relay (the default).
    Push,
    /// Relay others' sessions only: it may connect, but data signed by it is refused.
    Relay,
}

/// One allowed key: the key, its role, its name for logs.
type Allowed = (PublicKey, Role, String);

/// The public keys a host admits, each with its role and an optional name for logs. Clones
/// share the list (see [`AllowList::replace`]).
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    keys: Arc<RwLock<Vec<Allowed>>>,
}

impl PartialEq for AllowList {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.keys, &other.keys) || *self.read() == *other.read()
    }
}

impl Eq for AllowList {}

impl AllowList {
    /// Parses the text of an allow list: `KEY [push|relay] [NAME]` per line (role `push` when
    /// left out), `#` starts a comment.
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (key, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let key = PublicKey::from_hex(key).map_err(|e| KeyError::Line {
                line: i + 1,
                err: Box::new(e),
            })?;
            let rest = rest.trim();
            let (role, name) = match rest.split_once(char::is_whitespace).unwrap_or((rest, "")) {
                ("push", name) => (Role::Push, name),
                ("relay", name) => (Role::Relay, name),
                _ => (Role::Push, rest),
            };
            keys.push((key, role, name.trim().to_string()));
        }
        Ok(Self::from_vec(keys))
    }

    fn from_vec(keys: Vec<Allowed>) -> Self {
        Self {
            keys: Arc::new(RwLock::new(keys)),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Allowed>> {
        // A panic while the list was being swapped cannot leave it half-written (the swap is
        // one assignment), so a poisoned lock still holds a whole list.
        self.keys.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes this list (and every clone of it) hold `new`'s keys: the next handshake and the
    /// next signature check use them. A key left out is revoked.
    pub fn replace(&self, new: &AllowList) {
        let keys = new.read().clone();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
    }

    /// A list of these keys, each allowed to push.
    pub fn of(keys: impl IntoIterator<Item = PublicKey>) -> Self {
        Self::with_roles(keys.into_iter().map(|k| (k, Role::Push)))
    }

    /// A list of these keys with these roles.
    pub fn with_roles(keys: impl IntoIterator<Item = (PublicKey, Role)>) -> Self {
        Self::from_vec(
            keys.into_iter()
                .map(|(k, r)| (k, r, String::new()))
                .collect(),
        )
    }

    /// The allowed key whose X25519 form is `x`, with its name.
    pub fn find_x25519(&self, x: &[u8]) -> Option<(PublicKey, String)> {
        self.read()
            .iter()
            .find(|(k, _, _)| k.x25519() == x)
            .map(|(k, _, n)| (*k, n.clone()))
    }

    /// The role of `key`, if it is on the list.
    pub fn role(&self, key: &PublicKey) -> Option<Role> {
        self.read()
            .iter()
            .find(|(k, _, _)| k == key)
            .map(|(_, r, _)| *r)
    }

    /// How many keys are allowed.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when no key is allowed.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }
}

/// A host's identity as its handshakes use it: its own key and whom it admits.
#[derive(Debug, Clone)]
pub struct Identity {
    /// This host's key.
    pub key: HostKey,
    /// The keys this host talks to, both ways: who may connect to it (push or relay) and whom
    /// it accepts as the other end of a connection it makes.
    pub allow: AllowList,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_the_x25519_forms_match() {
        let k = HostKey::from_seed([9; 32]);
        let back = HostKey::from_hex(&k.to_hex()).unwrap();
        assert_eq!(back.public(), k.public());
        let p = PublicKey::from_hex(&k.public().to_string()).unwrap();
        assert_eq!(p, k.public());
        // (That `x25519_secret` has `x25519` as its public form is shown by the handshake
        // tests in `bulkcast_runtime::secure`, which admit a peer by it.)
        assert_ne!(k.x25519_secret(), p.x25519());
    }

    #[test]
    fn allow_lists_parse_names_comments_and_name_bad_lines() {
        let a = HostKey::from_seed([1; 32]).public();
        let b = HostKey::from_seed([2; 32]).public();
        let text = format!("# fleet\n{a} relay relay-1\n\n  {b}   # no name\n");
        let l = AllowList::parse(&text).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l.find_x25519(&a.x25519()).unwrap().1, "relay-1");
        assert_eq!(l.find_x25519(&b.x25519()).unwrap().1, "");
        assert_eq!(l.role(&a), Some(Role::Relay));
        assert_eq!(l.role(&b), Some(Role::Push));
        let c = HostKey::from_seed([3; 32]).public();
        assert!(l.find_x25519(&c.x25519()).is_none());
        // Replaced in place: every clone sees the new list; a key left out is gone.
        let held = l.clone();
        l.replace(&AllowList::of([c]));
        assert!(held.find_x25519(&a.x25519()).is_none());
        assert_eq!(held.role(&c), Some(Role::Push));
        assert_eq!(held.len(), 1);
        assert_eq!(
            AllowList::parse(&format!("{a}\nzz")),
            Err(KeyError::Line {
                line: 2,
                err: Box::new(KeyError::Format)
            })
        );
        assert_eq!(HostKey::from_hex("abc").err(), Some(KeyError::Format));
    }
}
