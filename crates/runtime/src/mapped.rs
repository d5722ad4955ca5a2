//! Chunks of a regular file held as read-only mappings of the page cache, and the lookup that
//! lets a TCP writer send such a chunk with `sendfile(2)` instead of copying it.
//!
//! Why: on a fast path the source's CPU goes to three passes over every byte (read into a
//! buffer, hash, copy into the socket) and, in a flat send, the last one once per receiver. A
//! mapped chunk is hashed where it lies in the page cache and handed to the socket by reference,
//! so the source touches each byte once (to hash it) however many receivers it feeds.
//!
//! The chunk stays an ordinary [`Bytes`] for the rest of the stack (the core, the spreader, the
//! retransmit window); only the writer asks [`file_range`] whether the bytes it is about to write
//! lie in a mapping.
//!
//! The source maps its file a window of many chunks at a time ([`WINDOW`]) and slices the chunks
//! out of it: a mapping per chunk cost a `mmap`, a `munmap` and a TLB shootdown each, which at
//! 64 KiB chunks was most of the source's system time (2.3 CPU-s per GiB on loopback against
//! 0.95 with 1 MiB chunks).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

/// One mapped chunk: the mapping and where it came from. Registered while it lives.
struct MappedChunk {
    map: memmap2::Mmap,
}

impl AsRef<[u8]> for MappedChunk {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for MappedChunk {
    fn drop(&mut self) {
        // Unregistered before the mapping goes, so an address reused by a later mapping is
        // never looked up as this one.
        registry()
            .lock()
            .expect("mapped registry")
            .remove(&(self.map.as_ptr() as usize));
    }
}

/// Where a mapped chunk's bytes live in their file.
struct Origin {
    file: Arc<File>,
    offset: u64,
    len: usize,
}

/// Live mappings by their first byte's address.
fn registry() -> &'static Mutex<BTreeMap<usize, Origin>> {
    static R: OnceLock<Mutex<BTreeMap<usize, Origin>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Bytes the source maps at once: many chunks, so that mapping costs little per chunk, and few
/// enough that a window's pages are not held long after they are sent.
pub const WINDOW: usize = 8 << 20;

/// Maps `len` bytes of `file` at `offset` (a multiple of the page size); `populate` faults
/// the pages in up front (for bytes about to be read here, e.g. hashed), otherwise the mapping
/// costs nothing until touched (for bytes only handed to `sendfile`).
///
/// # Safety
/// The caller must accept what a mapping of a file that others may change means: a page
/// truncated away raises SIGBUS when touched, and bytes written by others meanwhile show
/// through (the chunk is hashed from the mapping, so changed bytes fail verification at the
/// receivers rather than pass as good).
pub unsafe fn chunk(
    file: &Arc<File>,
    offset: u64,
    len: usize,
    populate: bool,
) -> io::Result<Bytes> {
    let mut opts = memmap2::MmapOptions::new();
    opts.offset(offset).len(len);
    if populate {
        opts.populate();
    }
    // SAFETY: see the function's contract; the mapping is read-only.
    let map = unsafe { opts.map(&**file)? };
    registry().lock().expect("mapped registry").insert(
        map.as_ptr() as usize,
        Origin {
            file: file.clone(),
            offset,
            len,
        },
    );
    Ok(Bytes::from_owner(MappedChunk { map }))
}

/// The file and offset of `data` when it lies within a mapping made by [`chunk`] (alive, which
/// holding `data` guarantees: a slice keeps its whole mapping).
pub fn file_range(data: &Bytes) -> Option<(Arc<File>, u64)> {
    if data.is_empty() {
        return None;
    }
    let at = data.as_ptr() as usize;
    let r = registry().lock().expect("mapped registry");
    let (&start, o) = r.range(..=at).next_back()?;
    (at + data.len() <= start + o.len).then(|| (o.file.clone(), o.offset + (at - start) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_mapped_chunk_is_found_whole_and_forgotten_when_dropped() {
        let dir = std::env::temp_dir().join(format!("bulkcast-mapped-{}", std::process::id()));
        let mut f = File::create(&dir).unwrap();
        let page = 4096;
        let body: Vec<u8> = (0..3 * page).map(|i| (i % 251) as u8).collect();
        f.write_all(&body).unwrap();
        let file = Arc::new(File::open(&dir).unwrap());
        // SAFETY: nobody else touches the file.
        let c = unsafe { chunk(&file, page as u64, 2 * page, true) }.unwrap();
        assert_eq!(&c[..], &body[page..]);
        let (_, off) = file_range(&c).expect("a whole mapped chunk");
        assert_eq!(off, page as u64);
        // A slice of it is found at its own offset (the source slices chunks out of windows);
        // a copy of it is not the file's.
        let (_, off) = file_range(&c.slice(100..200)).expect("a slice of a mapping");
        assert_eq!(off, page as u64 + 100);
        assert!(file_range(&Bytes::copy_from_slice(&c)).is_none());
        let addr = c.as_ptr() as usize;
        drop(c);
        assert!(!registry().lock().unwrap().contains_key(&addr));
        std::fs::remove_file(&dir).unwrap();
    }
}
