//! The encrypted byte stream after a handshake: records sealed and opened in place with
//! ring's AES-256-GCM, under the two keys of Noise's `Split()`.
//!
//! The wire format is what snow's transport mode writes, so either end may use either: each
//! record is a 2-byte big-endian length and the ciphertext with its 16-byte tag; the nonce is
//! 32 zero bits and the record's number (64 bits, big-endian, from 0 in each direction), with
//! empty associated data (the Noise spec's AESGCM). A reordered, replayed, cut or tampered
//! record fails to open and ends the stream; number 2^64 - 1 is never used (Noise reserves it).
//!
//! What it saves against sealing each record through snow: the sender seals up to [`BATCH`]
//! records into one buffer and one socket write, and the receiver reads as many records as
//! the socket holds (up to [`BATCH`]) in one read and opens each where it lies, instead of
//! two reads and a decrypting copy per record.

use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes of an AES-GCM tag.
const TAG: usize = 16;
/// The most plaintext bytes in one record (a Noise message is at most 65535 bytes).
pub const MAX_RECORD: usize = 65535 - TAG;
/// Records sealed into one socket write, and read in one, at most.
pub const BATCH: usize = 4;
/// The bytes of the largest record on the wire.
const MAX_WIRE: usize = 2 + 65535;

/// The transport keys of one connection, for [`Sealed`]: one per direction.
#[derive(Clone)]
pub struct Cipher {
    send: Arc<LessSafeKey>,
    recv: Arc<LessSafeKey>,
}

impl Cipher {
    /// From Noise's `Split()`: the first key seals what the initiator sends, the second what
    /// the responder sends.
    pub(crate) fn from_split(initiator: bool, split: ([u8; 32], [u8; 32])) -> Self {
        let (mut k1, mut k2) = split;
        let key = |k: &[u8; 32]| {
            Arc::new(LessSafeKey::new(
                UnboundKey::new(&AES_256_GCM, k).expect("AES-256 takes a 32-byte key"),
            ))
        };
        let (send, recv) = if initiator {
            (key(&k1), key(&k2))
        } else {
            (key(&k2), key(&k1))
        };
        // ring keeps its own (expanded) copies.
        k1.fill(0);
        k2.fill(0);
        Cipher { send, recv }
    }
}

/// The nonce of record number `n`, as Noise's AESGCM builds it.
fn nonce(n: u64) -> io::Result<Nonce> {
    if n == u64::MAX {
        return Err(io::Error::other("sealed stream: record numbers exhausted"));
    }
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_be_bytes());
    Ok(Nonce::assume_unique_for_key(b))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Receiving state of a sealed stream.
#[derive(Default)]
struct Rx {
    /// Number of the next record to open.
    nonce: u64,
    /// Bytes read from the stream (allocated at the first read): records from `start` to
    /// `end`, and before `start` the opened record that `plain` points into.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Opened bytes not yet handed out.
    plain: Range<usize>,
}

/// Sending state of a sealed stream.
#[derive(Default)]
struct Tx {
    /// Number of the next record to seal.
    nonce: u64,
    /// Sealed records not yet fully written, from `sent`.
    out: Vec<u8>,
    sent: usize,
}

/// A byte stream encrypted and authenticated with a connection's [`Cipher`]: what is written
/// goes out in records, and what is read comes from records that opened.
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

    /// Starts the record numbers at `n` both ways (tests of the numbers' end).
    #[cfg(test)]
    pub(crate) fn set_nonces(&mut self, n: u64) {
        self.rx.nonce = n;
        self.tx.nonce = n;
    }
}

impl Rx {
    /// Opens the record at `start` if it is whole in the buffer: true if it did.
    fn open_next(&mut self, key: &LessSafeKey) -> io::Result<bool> {
        if self.end - self.start < 2 {
            return Ok(false);
        }
        let len = usize::from(u16::from_be_bytes([
            self.buf[self.start],
            self.buf[self.start + 1],
        ]));
        if len < TAG {
            return Err(bad("sealed record shorter than its tag"));
        }
        if self.end - self.start < 2 + len {
            return Ok(false);
        }
        let at = self.start + 2;
        let n = key
            .open_in_place(
                nonce(self.nonce)?,
                Aad::empty(),
                &mut self.buf[at..at + len],
            )
            .map_err(|_| bad("a sealed record does not decrypt (tampered or out of order)"))?
            .len();
        self.nonce += 1;
        self.plain = at..at + n;
        self.start = at + len;
        Ok(true)
    }

    /// Room for at least one more whole record after `end`: moves the unread bytes to the
    /// front when the tail is short (at most a part of one record moves).
    fn make_room(&mut self) {
        if self.buf.is_empty() {
            self.buf = vec![0; BATCH * MAX_WIRE];
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < MAX_WIRE {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Sealed<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        // Until a byte is handed out: an empty record must not read as the end of the stream.
        loop {
            let rx = &mut me.rx;
            if !rx.plain.is_empty() {
                let n = rx.plain.len().min(buf.remaining());
                buf.put_slice(&rx.buf[rx.plain.start..rx.plain.start + n]);
                rx.plain.start += n;
                return Poll::Ready(Ok(()));
            }
            if rx.open_next(&me.cipher.recv)? {
                continue;
            }
            rx.make_room();
            let mut rb = ReadBuf::new(&mut rx.buf[rx.end..]);
            ready!(Pin::new(&mut me.io).poll_read(cx, &mut rb))?;
            let n = rb.filled().len();
            if n == 0 {
                if rx.start == rx.end {
                    return Poll::Ready(Ok(()));
                }
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            rx.end += n;
        }
    }
}

impl<T: AsyncWrite + Unpin> Sealed<T> {
    /// Writes out what is left of the last sealed records.
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

    /// Seals `buf` (at most [`BATCH`] records' worth) into `out`, each record in place.
    fn seal(&mut self, buf: &[u8]) -> io::Result<()> {
        let tx = &mut self.tx;
        tx.out.clear();
        tx.sent = 0;
        for piece in buf.chunks(MAX_RECORD) {
            let n = nonce(tx.nonce)?;
            let at = tx.out.len();
            tx.out
                .extend_from_slice(&((piece.len() + TAG) as u16).to_be_bytes());
            tx.out.extend_from_slice(piece);
            let tag = self
                .cipher
                .send
                .seal_in_place_separate_tag(n, Aad::empty(), &mut tx.out[at + 2..])
                .map_err(|_| io::Error::other("sealing a record failed"))?;
            tx.out.extend_from_slice(tag.as_ref());
            tx.nonce += 1;
        }
        Ok(())
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Sealed<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        // One batch at a time: the previous one goes out before new bytes are taken.
        ready!(me.poll_drain(cx))?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(BATCH * MAX_RECORD);
        me.seal(&buf[..n])?;
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
