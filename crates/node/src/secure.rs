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
//! cut record fails to decrypt and ends the connection). Each end says in its handshake payload
//! whether it agrees to run in plaintext (`--plaintext`, for trusted networks); the connection
//! is left unencrypted only when both do. Every handshake message is a small frame
//! ([`crate::transport::HANDSHAKE_MAX_FRAME`]), read before anything larger.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bulkcast_proto::auth::{AuthError, Keys};
use bulkcast_proto::wire::{Frame, VERSION};
use bytes::Bytes;
use snow::StatelessTransportState;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::{self, ConnError};

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

/// The most plaintext bytes in one record (a Noise message is at most 65535 bytes).
pub const MAX_RECORD: usize = 65535 - 16;

/// What a handshake established.
pub struct Admitted {
    /// The keys of the connection, or `None` when both ends chose plaintext.
    pub cipher: Option<Cipher>,
    /// The peer's host key and its name on the allow list, in key mode.
    pub peer: Option<String>,
}

/// The transport keys of one connection, for [`Sealed`].
#[derive(Clone)]
pub struct Cipher(Arc<StatelessTransportState>);

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
    let t = hs.into_stateless_transport_mode().map_err(hs_err)?;
    Ok(Admitted {
        cipher: (!plaintext).then(|| Cipher(Arc::new(t))),
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

/// Receiving state of a sealed stream.
#[derive(Default)]
struct Rx {
    nonce: u64,
    /// Bytes of the record being read (length prefix included).
    raw: Vec<u8>,
    /// Decrypted bytes not yet handed out, from `pos`.
    plain: Vec<u8>,
    pos: usize,
}

/// Sending state of a sealed stream.
#[derive(Default)]
struct Tx {
    nonce: u64,
    /// A sealed record not yet fully written, from `sent`.
    out: Vec<u8>,
    sent: usize,
}

/// A byte stream encrypted and authenticated with a connection's [`Cipher`]: what is written
/// goes out in records, and what is read comes from records that decrypted.
pub struct Sealed<T> {
    io: T,
    cipher: Cipher,
    rx: Rx,
    tx: Tx,
}

impl<T> Sealed<T> {
    /// Wraps `io` with the keys of its handshake.
    pub fn new(io: T, cipher: Cipher) -> Self {
        Self {
            io,
            cipher,
            rx: Rx::default(),
            tx: Tx::default(),
        }
    }

    /// The stream underneath.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Splits into reading and writing sealed halves over `split`'s halves of the stream.
    pub fn split<R, W>(self, split: impl FnOnce(T) -> (R, W)) -> (Sealed<R>, Sealed<W>) {
        let (r, w) = split(self.io);
        let read = Sealed {
            io: r,
            cipher: self.cipher.clone(),
            rx: self.rx,
            tx: Tx::default(),
        };
        let write = Sealed {
            io: w,
            cipher: self.cipher,
            rx: Rx::default(),
            tx: self.tx,
        };
        (read, write)
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl<T: AsyncRead + Unpin> Sealed<T> {
    /// Reads until `raw` holds `want` bytes; false at a clean end of stream before any byte.
    fn poll_fill(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<bool>> {
        while self.rx.raw.len() < want {
            let have = self.rx.raw.len();
            self.rx.raw.resize(want, 0);
            let mut rb = ReadBuf::new(&mut self.rx.raw[have..]);
            let r = Pin::new(&mut self.io).poll_read(cx, &mut rb);
            let n = rb.filled().len();
            self.rx.raw.truncate(have + n);
            ready!(r)?;
            if n == 0 {
                if have == 0 {
                    return Poll::Ready(Ok(false));
                }
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
        }
        Poll::Ready(Ok(true))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sealed<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        // Until a byte is handed out: an empty record must not read as the end of the stream.
        loop {
            if me.rx.pos < me.rx.plain.len() {
                let n = (me.rx.plain.len() - me.rx.pos).min(buf.remaining());
                buf.put_slice(&me.rx.plain[me.rx.pos..me.rx.pos + n]);
                me.rx.pos += n;
                return Poll::Ready(Ok(()));
            }
            if !ready!(me.poll_fill(cx, 2))? {
                return Poll::Ready(Ok(()));
            }
            let len = usize::from(u16::from_be_bytes([me.rx.raw[0], me.rx.raw[1]]));
            if len < 16 {
                return Poll::Ready(Err(bad("sealed record shorter than its tag")));
            }
            if !ready!(me.poll_fill(cx, 2 + len))? {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            let undecryptable =
                |_| bad("a sealed record does not decrypt (tampered or out of order)");
            // Straight into the caller's buffer where the record fits: one copy less.
            if buf.remaining() >= len - 16 {
                let out = buf.initialize_unfilled_to(len - 16);
                let n = me
                    .cipher
                    .0
                    .read_message(me.rx.nonce, &me.rx.raw[2..], out)
                    .map_err(undecryptable)?;
                me.rx.nonce += 1;
                me.rx.raw.clear();
                buf.advance(n);
                if n > 0 {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            me.rx.plain.resize(len, 0);
            let n = me
                .cipher
                .0
                .read_message(me.rx.nonce, &me.rx.raw[2..], &mut me.rx.plain)
                .map_err(undecryptable)?;
            me.rx.nonce += 1;
            me.rx.plain.truncate(n);
            me.rx.pos = 0;
            me.rx.raw.clear();
        }
    }
}

impl<T: AsyncWrite + Unpin> Sealed<T> {
    /// Writes out what is left of the last sealed record.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.tx.sent < self.tx.out.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.tx.out[self.tx.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.tx.sent += n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sealed<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        // One record at a time: the previous one goes out before new bytes are taken.
        ready!(me.poll_drain(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(MAX_RECORD);
        me.tx.out.resize(2 + n + 16, 0);
        let len = me
            .cipher
            .0
            .write_message(me.tx.nonce, &buf[..n], &mut me.tx.out[2..])
            .map_err(|e| io::Error::other(e.to_string()))?;
        me.tx.nonce += 1;
        me.tx.out.truncate(2 + len);
        me.tx.out[..2].copy_from_slice(&(len as u16).to_be_bytes());
        me.tx.sent = 0;
        // The bytes are taken whether or not the socket has room now; the rest goes out at the
        // next write or flush.
        if let Poll::Ready(Err(e)) = me.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_drain(cx))?;
        Pin::new(&mut me.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        ready!(me.poll_drain(cx))?;
        Pin::new(&mut me.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
