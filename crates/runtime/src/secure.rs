//! The handshake and the encryption of every connection, by the Noise framework (`snow`).
//!
//! After the plaintext `Hello` (magic and version, so a stray client is told apart), the
//! connector picks a pattern by what it holds, and the acceptor refuses a pattern it does not
//! admit:
//!
//! | mode | pattern | proves |
//! | --- | --- | --- |
//! | secret | `Noise_NNpsk0_25519_AESGCM_BLAKE2s` | both ends hold the session secret (the PSK) |
//! | keys | `Noise_XXpsk3_25519_AESGCM_BLAKE2s` | the secret, and each end's host key is on the other's allow list |
//!
//! Both give forward secrecy (ephemeral X25519) and key AES-256-GCM for everything after the
//! handshake ([`Sealed`]): records of at most [`MAX_RECORD`] bytes of plaintext, each a 2-byte
//! length and the ciphertext with its 16-byte tag, numbered implicitly (a reordered, replayed or
//! cut record fails to decrypt and ends the connection). The records are snow's transport
//! messages byte for byte, sealed and opened in place by ring under the handshake's split keys,
//! up to [`BATCH`] to a socket write (`sealed`). Each end says in its handshake payload
//! whether it agrees to run in plaintext (`--plaintext`, for trusted networks); the connection
//! is left unencrypted only when both do. Every handshake message is a small frame
//! ([`crate::transport::HANDSHAKE_MAX_FRAME`]), read before anything larger.

use bulkcast_proto::auth::{AuthError, Keys};
use bulkcast_proto::wire::{Frame, VERSION};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::transport::{self, ConnError};

mod sealed;
pub use sealed::{Cipher, Sealed, BATCH, MAX_RECORD};

/// Admission by the session secret alone.
const MODE_SECRET: u8 = 1;
/// Admission by the secret and allowed host keys.
const MODE_KEYS: u8 = 2;
const PATTERN_SECRET: &str = "Noise_NNpsk0_25519_AESGCM_BLAKE2s";
const PATTERN_KEYS: &str = "Noise_XXpsk3_25519_AESGCM_BLAKE2s";
/// Binds the handshake to this protocol and version.
const PROLOGUE: &[u8] = b"bulkcast 2026-11 noise, protocol version 5";
/// Handshake payload flag: this end agrees to run without encryption.
const FLAG_PLAINTEXT: u8 = 1;

/// What a handshake established.
pub struct Admitted {
    /// The keys of the connection, or `None` when both ends chose plaintext.
    pub cipher: Option<Cipher>,
    /// The peer's host key and its name on the allow list, in key mode.
    pub peer: Option<String>,
}

fn hs_err(e: snow::Error) -> ConnError {
    ConnError::Auth(AuthError::Handshake(e.to_string()))
}

/// The handshake state of `mode` for this side.
fn handshake(mode: u8, keys: &Keys, initiator: bool) -> Result<snow::HandshakeState, ConnError> {
    let pattern = if mode == MODE_KEYS {
        PATTERN_KEYS
    } else {
        PATTERN_SECRET
    };
    let b = snow::Builder::new(pattern.parse().map_err(hs_err)?)
        .prologue(PROLOGUE)
        .map_err(hs_err)?;
    // Kept only for the handshake's set-up (snow keeps its own copy).
    let secret;
    let b = match (mode, keys.identity()) {
        (MODE_KEYS, Some(id)) => {
            secret = id.key.x25519_secret();
            b.local_private_key(&secret)
                .map_err(hs_err)?
                .psk(3, keys.psk())
                .map_err(hs_err)?
        }
        _ => b.psk(0, keys.psk()).map_err(hs_err)?,
    };
    if initiator {
        b.build_initiator().map_err(hs_err)
    } else {
        b.build_responder().map_err(hs_err)
    }
}

fn flags(keys: &Keys) -> [u8; 1] {
    [if keys.plaintext() { FLAG_PLAINTEXT } else { 0 }]
}

/// Checks the peer's static key against the allow list; its name on the list if admitted.
fn allowed(hs: &snow::HandshakeState, keys: &Keys) -> Result<String, AuthError> {
    let id = keys.identity().ok_or(AuthError::Mode("no host key"))?;
    let remote = hs.get_remote_static().unwrap_or_default();
    match id.allow.find_x25519(remote) {
        Some((k, name)) if name.is_empty() => Ok(k.to_string()),
        Some((k, name)) => Ok(format!("{name} ({k})")),
        None => Err(AuthError::NotAllowed(
            remote
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
                + " (X25519 form)",
        )),
    }
}

/// Reads one handshake message of `mode`; a `Refused` becomes the peer's reason.
async fn read_msg<S: AsyncRead + Unpin>(s: &mut S, what: &'static str) -> Result<Bytes, ConnError> {
    match transport::expect_small(s, what).await? {
        Frame::Noise { msg, .. } => Ok(msg),
        Frame::Refused { reason } => Err(AuthError::Refused(reason).into()),
        other => Err(AuthError::Unexpected {
            expected: "Noise",
            got: other.kind(),
        }
        .into()),
    }
}

async fn write_msg<S: AsyncWrite + Unpin>(
    s: &mut S,
    mode: u8,
    hs: &mut snow::HandshakeState,
    payload: &[u8],
) -> Result<(), ConnError> {
    let mut buf = [0u8; 512];
    let n = hs.write_message(payload, &mut buf).map_err(hs_err)?;
    let msg = Bytes::copy_from_slice(&buf[..n]);
    transport::write_frame(s, &Frame::Noise { mode, msg }).await?;
    Ok(())
}

fn finish(
    hs: snow::HandshakeState,
    ours: [u8; 1],
    theirs: u8,
    peer: Option<String>,
) -> Result<Admitted, ConnError> {
    let plaintext = ours[0] & theirs & FLAG_PLAINTEXT != 0;
    let mut hs = hs;
    if !hs.is_handshake_finished() {
        return Err(hs_err(snow::Error::State(
            snow::error::StateProblem::HandshakeNotFinished,
        )));
    }
    // The raw keys of Noise's Split() go to ring, which seals records in place
    // ([`sealed`]); what goes on the wire is what snow's transport mode would write.
    let split = hs.dangerously_get_raw_split();
    Ok(Admitted {
        cipher: (!plaintext).then(|| Cipher::from_split(hs.is_initiator(), split)),
        peer,
    })
}

/// The connecting side's handshake (after which the connection is admitted on both sides).
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    keys: &Keys,
) -> Result<Admitted, ConnError> {
    let hello = Frame::Hello {
        version: VERSION,
        nonce: rand::random(),
    };
    transport::write_frame(s, &hello).await?;
    let mode = if keys.identity().is_some() {
        MODE_KEYS
    } else {
        MODE_SECRET
    };
    let mut hs = handshake(mode, keys, true)?;
    let ours = flags(keys);
    let mut payload = [0u8; 512];
    if mode == MODE_SECRET {
        write_msg(s, mode, &mut hs, &ours).await?;
        let msg = read_msg(s, "waiting for the peer's handshake").await?;
        let n = match hs.read_message(&msg, &mut payload) {
            Ok(n) => n,
            Err(_) => return Err(refuse(s, AuthError::WrongSecret).await),
        };
        return finish(hs, ours, payload[..n].first().copied().unwrap_or(0), None);
    }
    write_msg(s, mode, &mut hs, &[]).await?;
    let msg = read_msg(s, "waiting for the peer's handshake").await?;
    let theirs = match hs.read_message(&msg, &mut payload) {
        Ok(n) => payload[..n].first().copied().unwrap_or(0),
        Err(e) => return Err(refuse(s, AuthError::Handshake(e.to_string())).await),
    };
    let peer = match allowed(&hs, keys) {
        Ok(p) => p,
        Err(e) => return Err(refuse(s, e).await),
    };
    write_msg(s, mode, &mut hs, &ours).await?;
    // The acceptor checks the secret and our key last: wait for its word.
    read_msg(s, "waiting for the peer to admit us").await?;
    finish(hs, ours, theirs, Some(peer))
}

/// The accepting side's handshake. A peer that fails is told why and never gets session data.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    keys: &Keys,
) -> Result<Admitted, ConnError> {
    match transport::expect_small(s, "waiting for Hello").await {
        Ok(Frame::Hello { version, .. }) if version == VERSION => {}
        Ok(Frame::Hello { version, .. }) => {
            return Err(refuse(s, AuthError::Version(version)).await)
        }
        Ok(other) => {
            let e = AuthError::Unexpected {
                expected: "Hello",
                got: other.kind(),
            };
            return Err(refuse(s, e).await);
        }
        // A first frame that claims to be large is some other protocol (an HTTP probe, a port
        // scanner), which deserves that name rather than a size complaint.
        Err(ConnError::Wire(
            bulkcast_proto::wire::WireError::TooLarge { .. }
            | bulkcast_proto::wire::WireError::UnknownType(_),
        )) => return Err(ConnError::Wire(bulkcast_proto::wire::WireError::BadMagic)),
        Err(e) => return Err(e),
    }
    let (mode, msg) = match transport::expect_small(s, "waiting for the handshake").await? {
        Frame::Noise { mode, msg } => (mode, msg),
        other => {
            let e = AuthError::Unexpected {
                expected: "Noise",
                got: other.kind(),
            };
            return Err(refuse(s, e).await);
        }
    };
    let refusal = match (mode, keys.identity().is_some()) {
        (MODE_SECRET, true) => Some(
            "this host admits only peers with an allowed host key (bulkcast keygen; --key and --allow-keys)",
        ),
        (MODE_KEYS, false) => Some(
            "this host has no host key: it admits by the session secret alone (give it --key and --allow-keys, or drop --key here)",
        ),
        (MODE_SECRET | MODE_KEYS, _) => None,
        _ => Some("unknown handshake mode"),
    };
    if let Some(why) = refusal {
        return Err(refuse(s, AuthError::Mode(why)).await);
    }
    let mut hs = handshake(mode, keys, false)?;
    let ours = flags(keys);
    let mut payload = [0u8; 512];
    let first = hs.read_message(&msg, &mut payload);
    if mode == MODE_SECRET {
        let theirs = match first {
            Ok(n) => payload[..n].first().copied().unwrap_or(0),
            Err(_) => return Err(refuse(s, AuthError::WrongSecret).await),
        };
        write_msg(s, mode, &mut hs, &ours).await?;
        return finish(hs, ours, theirs, None);
    }
    if let Err(e) = first {
        return Err(refuse(s, AuthError::Handshake(e.to_string())).await);
    }
    write_msg(s, mode, &mut hs, &ours).await?;
    let msg = read_msg(s, "waiting for the peer's proof").await?;
    let theirs = match hs.read_message(&msg, &mut payload) {
        Ok(n) => payload[..n].first().copied().unwrap_or(0),
        Err(_) => return Err(refuse(s, AuthError::WrongSecret).await),
    };
    let peer = match allowed(&hs, keys) {
        Ok(p) => p,
        Err(e) => return Err(refuse(s, e).await),
    };
    let admitted = Frame::Noise {
        mode,
        msg: Bytes::new(),
    };
    transport::write_frame(s, &admitted).await?;
    finish(hs, ours, theirs, Some(peer))
}

/// Tells the peer why the handshake failed (so its log is as clear as ours) and returns the
/// error for our side.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(s: &mut S, e: AuthError) -> ConnError {
    let mut reason = e.to_string();
    // Kept within what the peer reads before authentication.
    while reason.len() > transport::HANDSHAKE_MAX_FRAME / 2 {
        reason.pop();
    }
    let _ = transport::write_frame(s, &Frame::Refused { reason }).await;
    e.into()
}

#[cfg(test)]
mod tests;
