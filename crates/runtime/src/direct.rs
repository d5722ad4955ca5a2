//! Direct I/O (`O_DIRECT`) for a receiver's one-file copy: writes and the reads that serve
//! stored pieces to swarm peers bypass the page cache.
//!
//! Why: a receiver that writes through the page cache pays for a new cache page per 4 KiB it
//! receives (allocated, zeroed, later written back and freed). Where memory is costly to
//! allocate (a VM that hands freed pages back to its host at once) or the receiver's CPU is the
//! bottleneck (many receivers on few cores), that is most of the receiver's CPU: `dd` of 2 GB
//! on the lab's VM took 3.9 s of kernel time buffered and 0.6 s with `O_DIRECT`, and reading it
//! back cold 3.4 s against 0.4 s. Direct I/O moves whole pages between the device and a
//! reused buffer instead.
//!
//! The cost: the received file is not in the page cache afterwards (a program that reads it at
//! once reads the disk), and every piece is copied once into an aligned buffer. So it is opt-in
//! (`--direct-io`). Transfers that are not page aligned (the object's last piece, pieces of a
//! size that is not a multiple of [`ALIGN`]) go through the page cache as before, and a file
//! system that refuses `O_DIRECT` (tmpfs) gets buffered I/O throughout.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;

use bytes::Bytes;

/// The alignment of offsets, lengths and buffers: the page size, which covers every common
/// logical block size (512 B and 4 KiB).
pub const ALIGN: usize = 4096;

/// How a receiver's copy is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CopyIo {
    /// Through the page cache (the default: the copy is cached for whoever reads it next).
    #[default]
    Buffered,
    /// With `O_DIRECT` where the file system allows it (see the module docs).
    Direct,
}

/// Opens `path` for direct I/O, or `None` where the file system refuses `O_DIRECT` (`EINVAL`).
pub fn open(path: &Path, write: bool) -> io::Result<Option<File>> {
    match OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A page-aligned buffer: a window into a `Vec` one page longer than the window (no `unsafe`
/// allocation needed).
pub struct Aligned {
    vec: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    /// A buffer of `len` bytes (rounded up to [`ALIGN`]), a pooled one if one is large enough
    /// (its old contents still in it: callers overwrite what they use), else a new zeroed one.
    pub fn new(len: usize) -> Aligned {
        let len = round_up(len);
        let vec = pool()
            .lock()
            .map(|mut p| {
                let i = p.bufs.iter().position(|v| v.len() >= len + ALIGN)?;
                let v = p.bufs.swap_remove(i);
                p.bytes -= v.len();
                Some(v)
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| vec![0u8; len + ALIGN]);
        let start = vec.as_ptr().align_offset(ALIGN);
        Aligned { vec, start, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // Back to the pool, so reads in steady state reuse memory instead of faulting new pages
        // in (the cost this module exists to avoid).
        if let Ok(mut p) = pool().lock() {
            if p.bytes + self.vec.len() <= POOL_BYTES {
                p.bytes += self.vec.len();
                p.bufs.push(std::mem::take(&mut self.vec));
            }
        }
    }
}

/// Bytes of buffers kept for reuse: the pieces a member has in flight to its peers at once
/// (a few windows of 256 KiB pieces), without letting 16 MiB chunks pile up.
const POOL_BYTES: usize = 32 << 20;

/// Freed aligned buffers, for the next [`Aligned::new`].
struct Pool {
    bufs: Vec<Vec<u8>>,
    /// Their lengths added up (at most [`POOL_BYTES`]).
    bytes: usize,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: Mutex<Pool> = Mutex::new(Pool {
        bufs: Vec::new(),
        bytes: 0,
    });
    &POOL
}

fn round_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// A receiver's copy opened for direct writes, with the buffered handle beside it for what is
/// not page aligned.
pub struct Writer {
    direct: File,
    /// Reused for every write (the store thread's only buffer).
    scratch: Aligned,
}

impl Writer {
    /// Opens `path` (already created) for direct writes; `None` where the file system refuses.
    pub fn open(path: &Path) -> io::Result<Option<Writer>> {
        Ok(open(path, true)?.map(|direct| Writer {
            direct,
            scratch: Aligned::new(0),
        }))
    }

    /// Writes the page-aligned part of `data` at `offset` directly and returns how many bytes
    /// that was (from the start of `data`); the caller writes the rest through the page cache.
    /// An unaligned `offset` writes nothing directly.
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<usize> {
        if !offset.is_multiple_of(ALIGN as u64) {
            return Ok(0);
        }
        let n = data.len() / ALIGN * ALIGN;
        if n == 0 {
            return Ok(0);
        }
        if self.scratch.len < n {
            self.scratch = Aligned::new(n);
        }
        let buf = &mut self.scratch.as_mut()[..n];
        buf.copy_from_slice(&data[..n]);
        self.direct.write_all_at(buf, offset)?;
        Ok(n)
    }
}

/// A copy's file opened for reading stored pieces back without the page cache.
pub struct Reader {
    direct: File,
    /// For what direct reads refuse (`EINVAL`: a device with larger blocks).
    buffered: File,
}

impl Reader {
    /// Opens `path` for direct reads; `None` where the file system refuses.
    pub fn open(path: &Path) -> io::Result<Option<Reader>> {
        let Some(direct) = open(path, false)? else {
            return Ok(None);
        };
        Ok(Some(Reader {
            direct,
            buffered: File::open(path)?,
        }))
    }

    /// The `len` bytes at `offset`: the pages around them read into a pooled aligned buffer.
    /// Dirty cached pages in the range (a buffered tail) are written out by the kernel first, so
    /// the bytes are what was written, whichever way.
    pub fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let start = offset - offset % ALIGN as u64;
        let skip = (offset - start) as usize;
        let mut buf = Aligned::new(skip + len);
        let mut got = 0;
        while got < skip + len {
            let r = self
                .direct
                .read_at(&mut buf.as_mut()[got..], start + got as u64);
            match r {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    let mut v = vec![0u8; len];
                    self.buffered.read_exact_at(&mut v, offset)?;
                    return Ok(Bytes::from(v));
                }
                Err(e) => return Err(e),
            }
        }
        if got < skip + len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset} are past the end of the file"),
            ));
        }
        Ok(Bytes::from_owner(buf).slice(skip..skip + len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_whether_new_or_pooled() {
        let a = Aligned::new(5000);
        assert_eq!(a.as_ref().len(), 2 * ALIGN);
        assert_eq!(a.as_ref().as_ptr() as usize % ALIGN, 0);
        drop(a);
        // From the pool (shared with other tests, so not necessarily the same one): still a
        // window of the asked size, aligned.
        let b = Aligned::new(ALIGN);
        assert_eq!(b.as_ref().len(), ALIGN);
        assert_eq!(b.as_ref().as_ptr() as usize % ALIGN, 0);
    }

    #[test]
    fn mixed_direct_and_buffered_writes_read_back_exactly() {
        let path = std::env::temp_dir().join(format!("bulkcast-direct-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        let Some(mut w) = Writer::open(&path).unwrap() else {
            // A temporary directory on tmpfs: nothing direct to test here.
            std::fs::remove_file(&path).unwrap();
            return;
        };
        // Pieces of 3 pages + 100 bytes: every piece after the first starts unaligned.
        let piece = 3 * ALIGN + 100;
        let body: Vec<u8> = (0..4 * piece).map(|i| (i * 7 % 253) as u8).collect();
        let mut direct_bytes = 0;
        for k in [2, 0, 3, 1] {
            let off = (k * piece) as u64;
            let data = &body[k * piece..(k + 1) * piece];
            let n = w.write_at(off, data).unwrap();
            direct_bytes += n;
            f.write_all_at(&data[n..], off + n as u64).unwrap();
        }
        assert_eq!(
            direct_bytes,
            3 * ALIGN,
            "only the aligned first piece goes direct"
        );
        let r = Reader::open(&path)
            .unwrap()
            .expect("direct reads where writes were");
        for k in 0..4 {
            let got = r.read_at((k * piece) as u64, piece).unwrap();
            assert_eq!(&got[..], &body[k * piece..(k + 1) * piece], "piece {k}");
        }
        assert!(
            r.read_at((4 * piece) as u64 - 10, 20).is_err(),
            "past the end"
        );
        std::fs::remove_file(&path).unwrap();
    }
}
