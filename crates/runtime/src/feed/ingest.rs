//! Products from a stream: the insert of one product from any reader, and framed stdin
//! (`feed insert --stdin`), many products through one process as an ingester pipes them.
//!
//! The framing is a text header line, then the bytes:
//!
//! ```text
//! NAME SIZE\n
//! <SIZE bytes>
//! ```
//!
//! NAME may hold spaces (LDM product names do): SIZE is the last space-separated field, in
//! decimal. A shell script frames a file with
//! `printf '%s %d\n' "$name" "$(stat -c %s "$f")"; cat "$f"`.

use std::fmt;
use std::io;

use bulkcast_proto::auth::Keys;
use bulkcast_proto::feed::msg::Msg;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufWriter};

use super::{read_msg, write_msg};
use crate::transport::{connect_tcp, handshake_connect, Stream, TcpTuning};

/// The longest header line taken, its newline included: a stream without a newline this far
/// in is not framed products.
pub const MAX_HEADER: usize = 4096;

/// Bytes per `Data` message of an insert.
const CHUNK: usize = 256 << 10;

/// Why an insert failed.
#[derive(Debug)]
pub enum InsertError {
    /// The source refused the product (too large for its queue, a bad feedtype, not
    /// loopback): trying again does not help.
    Refused(String),
    /// The product's bytes ended before its size.
    Truncated {
        /// Bytes read.
        got: u64,
        /// Bytes announced.
        size: u64,
    },
    /// The source could not be reached or the connection failed (trying later may help), or
    /// the product's reader failed.
    Io(io::Error),
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::Refused(r) => write!(f, "refused by the feed source: {r}"),
            InsertError::Truncated { got, size } => {
                write!(
                    f,
                    "truncated: {got} of {size} bytes before the end of input"
                )
            }
            InsertError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for InsertError {}

impl From<io::Error> for InsertError {
    fn from(e: io::Error) -> Self {
        InsertError::Io(e)
    }
}

/// Inserts one product of `size` bytes read from `data`; returns its sequence number.
///
/// On [`InsertError::Refused`] nothing of `data` was read. If `data` ends early the
/// connection is dropped before the last byte, so the source discards the partial product
/// (it queues a product whole or not at all).
pub async fn insert_from<R: AsyncRead + Unpin>(
    server: &str,
    keys: &Keys,
    tuning: &TcpTuning,
    name: &str,
    feedtype: &str,
    size: u64,
    data: &mut R,
) -> Result<u64, InsertError> {
    let stream = connect_tcp(server, tuning)
        .await
        .map_err(io::Error::other)?;
    let mut stream = handshake_connect(Stream::Tcp(stream), keys)
        .await
        .map_err(io::Error::other)?;
    let insert = Msg::Insert {
        name: name.into(),
        feedtype: feedtype.into(),
        size,
    };
    write_msg(&mut stream, &insert).await?;
    stream.flush().await?;
    match read_msg(&mut stream).await? {
        Some(Msg::Ack { .. }) => {}
        Some(Msg::Refused { reason }) => return Err(InsertError::Refused(reason)),
        other => return Err(unexpected(other)),
    }
    let mut w = BufWriter::with_capacity(1 << 20, &mut stream);
    let mut off = 0u64;
    let mut buf = vec![0u8; CHUNK];
    while off < size {
        let want = ((size - off) as usize).min(buf.len());
        let n = data.read(&mut buf[..want]).await?;
        if n == 0 {
            return Err(InsertError::Truncated { got: off, size });
        }
        let chunk = Msg::Data {
            seq: 0,
            offset: off,
            data: bytes::Bytes::copy_from_slice(&buf[..n]),
        };
        write_msg(&mut w, &chunk).await?;
        off += n as u64;
    }
    w.flush().await?;
    drop(w);
    match read_msg(&mut stream).await? {
        Some(Msg::Inserted { seq }) => Ok(seq),
        Some(Msg::Refused { reason }) => Err(InsertError::Refused(reason)),
        other => Err(unexpected(other)),
    }
}

fn unexpected(m: Option<Msg>) -> InsertError {
    InsertError::Io(io::Error::other(match m {
        None => "the feed source closed the connection".to_string(),
        Some(m) => format!("unexpected answer from the feed source: {m:?}"),
    }))
}

/// One frame's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameHeader {
    /// The product's name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Why a header is not one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// No newline within [`MAX_HEADER`] bytes.
    TooLong,
    /// The input ended inside a header (the bytes seen so far, lossy UTF-8).
    Unterminated(String),
    /// A header line that is not `NAME SIZE`.
    Malformed {
        /// The line (lossy UTF-8, at most 200 characters).
        line: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLong => write!(
                f,
                "no newline in the first {MAX_HEADER} bytes of a header (expected `NAME SIZE\\n`)"
            ),
            FrameError::Unterminated(s) => {
                write!(f, "input ends inside a header {s:?} (no newline)")
            }
            FrameError::Malformed { line, why } => {
                write!(
                    f,
                    "malformed header {line:?}: {why} (expected `NAME SIZE\\n`)"
                )
            }
        }
    }
}

impl std::error::Error for FrameError {}

fn shown(line: &[u8]) -> String {
    String::from_utf8_lossy(line).chars().take(200).collect()
}

/// Parses a header line (without its `\n`; a trailing `\r` is dropped).
pub fn parse_header(line: &[u8]) -> Result<FrameHeader, FrameError> {
    let bad = |why| FrameError::Malformed {
        line: shown(line),
        why,
    };
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = std::str::from_utf8(line).map_err(|_| bad("not UTF-8"))?;
    let (name, size) = text.rsplit_once(' ').ok_or(bad("no space before SIZE"))?;
    if name.is_empty() {
        return Err(bad("empty NAME"));
    }
    if name.chars().any(char::is_control) {
        return Err(bad("control character in NAME"));
    }
    if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("SIZE is not a decimal number"));
    }
    let size = size
        .parse()
        .map_err(|_| bad("SIZE does not fit in 64 bits"))?;
    Ok(FrameHeader {
        name: name.to_string(),
        size,
    })
}

/// Reads the next header; `None` at a clean end of input (between frames).
pub async fn read_header<R: AsyncBufRead + Unpin>(
    r: &mut R,
) -> io::Result<Result<Option<FrameHeader>, FrameError>> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_HEADER as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(Ok(None));
    }
    match line.strip_suffix(b"\n") {
        Some(l) => Ok(parse_header(l).map(Some)),
        None if line.len() >= MAX_HEADER => Ok(Err(FrameError::TooLong)),
        None => Ok(Err(FrameError::Unterminated(shown(&line)))),
    }
}

/// Where a product goes: the source, its admission and the products' feedtype.
pub struct Target<'a> {
    /// The feed source, `HOST:PORT`.
    pub server: &'a str,
    /// Admission.
    pub keys: &'a Keys,
    /// TCP options.
    pub tuning: &'a TcpTuning,
    /// The products' feedtype.
    pub feedtype: &'a str,
}

/// What [`insert_framed`] did, product by product.
#[derive(Debug)]
pub enum FramedEvent<'a> {
    /// A product is queued.
    Inserted {
        /// Its sequence number.
        seq: u64,
        /// Its name.
        name: &'a str,
    },
    /// The source refused a product (its bytes were skipped; the next frame follows).
    Refused {
        /// Its name.
        name: &'a str,
        /// The source's reason.
        reason: &'a str,
    },
    /// The source is unreachable; the product is tried again (nothing of it was read yet).
    Retrying {
        /// Its name.
        name: &'a str,
        /// Why.
        error: &'a str,
    },
}

/// Why framed input stopped before its end: the frame (counted from 1), the product it
/// names if its header was read, and why. Products before it are queued.
#[derive(Debug)]
pub struct FramedError {
    /// The frame's number.
    pub frame: u64,
    /// The product, if its header was read.
    pub name: Option<String>,
    /// Why.
    pub error: String,
}

impl fmt::Display for FramedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "frame {} (product {n:?}): {}", self.frame, self.error),
            None => write!(f, "frame {}: {}", self.frame, self.error),
        }
    }
}

impl std::error::Error for FramedError {}

/// How long a product waits for an unreachable source before framed input gives up.
pub const RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// Inserts every framed product of `input` (see the module's doc) in order, one connection
/// each. Returns the number queued; stops at the first frame that cannot be read whole
/// (malformed header, truncated bytes) or a source that stays unreachable for [`RETRY_FOR`].
/// A product the source refuses is reported and skipped.
pub async fn insert_framed<R: AsyncBufRead + Unpin>(
    to: &Target<'_>,
    input: &mut R,
    mut report: impl FnMut(FramedEvent<'_>),
) -> Result<u64, FramedError> {
    let mut queued = 0;
    for frame in 1.. {
        let stop = |name: Option<&str>, error: String| FramedError {
            frame,
            name: name.map(str::to_string),
            error,
        };
        let h = match read_header(input).await {
            Ok(Ok(Some(h))) => h,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => return Err(stop(None, e.to_string())),
            Err(e) => return Err(stop(None, format!("reading input: {e}"))),
        };
        let name = h.name.as_str();
        match insert_one(to, &h, input, &mut report).await {
            Ok(seq) => {
                queued += 1;
                report(FramedEvent::Inserted { seq, name });
            }
            Err(InsertError::Refused(reason)) => {
                report(FramedEvent::Refused {
                    name,
                    reason: &reason,
                });
                let skipped =
                    tokio::io::copy(&mut (&mut *input).take(h.size), &mut tokio::io::sink())
                        .await
                        .map_err(|e| stop(Some(name), format!("reading input: {e}")))?;
                if skipped < h.size {
                    let e = InsertError::Truncated {
                        got: skipped,
                        size: h.size,
                    };
                    return Err(stop(Some(name), e.to_string()));
                }
            }
            Err(e) => return Err(stop(Some(name), e.to_string())),
        }
    }
    Ok(queued)
}

/// One framed product, tried again while the source is unreachable and none of its bytes
/// were read.
async fn insert_one<R: AsyncBufRead + Unpin>(
    to: &Target<'_>,
    h: &FrameHeader,
    input: &mut R,
    report: &mut impl FnMut(FramedEvent<'_>),
) -> Result<u64, InsertError> {
    let give_up = std::time::Instant::now() + RETRY_FOR;
    loop {
        let mut data = (&mut *input).take(h.size);
        let r = insert_from(
            to.server,
            to.keys,
            to.tuning,
            &h.name,
            to.feedtype,
            h.size,
            &mut data,
        )
        .await;
        match r {
            Err(InsertError::Io(e))
                if data.limit() == h.size && std::time::Instant::now() < give_up =>
            {
                let error = e.to_string();
                report(FramedEvent::Retrying {
                    name: &h.name,
                    error: &error,
                });
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(s: &str) -> Result<FrameHeader, FrameError> {
        parse_header(s.as_bytes())
    }

    #[test]
    fn headers_parse_with_spaces_in_names() {
        let h = header("SDUS53 KARX 271200 /pNCRARX 1234").unwrap();
        assert_eq!(h.name, "SDUS53 KARX 271200 /pNCRARX");
        assert_eq!(h.size, 1234);
        assert_eq!(header("a 0\r").unwrap().size, 0);
        assert_eq!(header("a 18446744073709551615").unwrap().size, u64::MAX);
    }

    #[test]
    fn hostile_headers_are_refused_with_reasons() {
        for (line, why) in [
            ("a 18446744073709551616", "SIZE does not fit in 64 bits"),
            (
                "a 99999999999999999999999999",
                "SIZE does not fit in 64 bits",
            ),
            ("a -1", "SIZE is not a decimal number"),
            ("a +1", "SIZE is not a decimal number"),
            ("a 1e9", "SIZE is not a decimal number"),
            ("a ", "SIZE is not a decimal number"),
            ("a 12 ", "SIZE is not a decimal number"),
            ("nospace", "no space before SIZE"),
            ("", "no space before SIZE"),
            (" 12", "empty NAME"),
            ("a\tb 12", "control character in NAME"),
        ] {
            match header(line) {
                Err(FrameError::Malformed { why: w, .. }) => assert_eq!(w, why, "{line:?}"),
                other => panic!("{line:?}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_header(b"\xff\xfe 12"),
            Err(FrameError::Malformed {
                why: "not UTF-8",
                ..
            })
        ));
    }

    async fn headers(input: &[u8]) -> Vec<Result<Option<FrameHeader>, FrameError>> {
        let mut r = tokio::io::BufReader::new(input);
        let mut out = Vec::new();
        loop {
            let h = read_header(&mut r).await.unwrap();
            let stop = !matches!(h, Ok(Some(_)));
            if let Ok(Some(ref f)) = h {
                let mut skip = vec![0; f.size as usize];
                r.read_exact(&mut skip).await.unwrap();
            }
            out.push(h);
            if stop {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn a_stream_of_frames_ends_cleanly_or_says_why() {
        let ok = |n: &str, s| {
            Ok(Some(FrameHeader {
                name: n.into(),
                size: s,
            }))
        };
        let v = headers(b"a 3\nxyzb c 0\n").await;
        assert_eq!(v, vec![ok("a", 3), ok("b c", 0), Ok(None)]);
        // Missing newline at the end of input.
        let v = headers(b"a 1\nxb 12").await;
        assert_eq!(v[1], Err(FrameError::Unterminated("b 12".into())));
        // A binary blob without newlines: refused after MAX_HEADER bytes, not read whole.
        let blob = vec![b'x'; 1 << 20];
        assert_eq!(headers(&blob).await, vec![Err(FrameError::TooLong)]);
        // The longest header that fits is taken.
        let mut long = vec![b'n'; MAX_HEADER - 3];
        long.extend_from_slice(b" 0\n");
        assert_eq!(headers(&long).await.len(), 2);
        let mut longer = vec![b'n'; MAX_HEADER - 2];
        longer.extend_from_slice(b" 0\n");
        assert_eq!(headers(&longer).await, vec![Err(FrameError::TooLong)]);
    }
}
