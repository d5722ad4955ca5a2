//! The local copy: verified chunks written to a temporary name, moved into place only when
//! complete; or written in order to stdout.
//!
//! Writing runs on its own thread (file I/O blocks) fed by a channel; the node keeps a chunk
//! in memory until the thread reports it stored, so memory stays bounded by the node's budget.
//! A receiver never leaves a partial or corrupt file under the final name.
//!
//! A one-file or directory copy opened with [`Store::open_resumable`] (what agents do) outlives
//! a failed session: its verified chunks are kept, keyed by the object, for the next send of
//! the same object (see [`partial`], and `tree` for directories). Other copies (streams,
//! stripes of a balanced send) are removed when their session fails.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;

use crate::direct::{self, CopyIo};
use bulkcast_proto::manifest::{Manifest, Mtime, ObjectKind, MODE_BITS};
use bulkcast_proto::wire::SessionId;
use bytes::Bytes;
use tokio::sync::mpsc;

pub mod partial;
mod resumable;
#[cfg(test)]
mod testing;
mod tree;
pub use partial::{Partials, Resumed};
pub use resumable::{Holding, ResumableFile};
use tree::{create_tree, finish_tree};

/// Where the copy goes.
#[derive(Debug, Clone)]
pub enum Target {
    /// Into this directory, under the object's name (agents).
    Dir(PathBuf),
    /// At exactly this path (`recv --out`).
    Path(PathBuf),
    /// In order to standard output (`recv --stdout`).
    Stdout,
}

/// What the store thread reports.
#[derive(Debug)]
pub enum StoreEvent {
    /// Chunk stored.
    Stored(u64),
    /// The copy failed; the temporary copy is gone.
    Failed(StoreError),
    /// The copy is in place at this path (or flushed to stdout).
    Finalized(Result<PathBuf, StoreError>),
    /// A chunk read back from the copy ([`LocalCopy::load`]).
    Loaded(u64, Result<Bytes, StoreError>),
}

/// Why a copy could not be written, read back or moved into place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A file operation on the copy (`what`: "writing", "syncing", "moving into place", ...).
    #[error("{what} {}: {error}{}", path.display(), hint(error))]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory it was done to.
        path: PathBuf,
        /// What the system said.
        error: Arc<io::Error>,
    },
    /// Writing or flushing standard output (`recv --stdout`).
    #[error("{what} standard output: {error}")]
    Stdout {
        /// What was being done.
        what: &'static str,
        /// What the system said.
        error: Arc<io::Error>,
    },
    /// This copy goes to standard output, or is not there yet: it cannot be read back.
    #[error("this copy cannot be read back")]
    NotReadable,
    /// The copy was already moved into place.
    #[error("finalized twice")]
    FinalizedTwice,
}

impl StoreError {
    /// `error` while doing `what` to `path`.
    pub fn io(error: io::Error, what: &'static str, path: &Path) -> StoreError {
        StoreError::Io {
            what,
            path: path.to_path_buf(),
            error: Arc::new(error),
        }
    }

    /// The disk (or the user's quota) is full: space is needed back more than a resume.
    pub fn is_out_of_space(&self) -> bool {
        let StoreError::Io { error, .. } = self else {
            return false;
        };
        matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
    }
}

enum Cmd {
    Write {
        index: u64,
        offset: u64,
        data: Bytes,
        hash: [u8; 32],
    },
    Finalize,
    Read {
        index: u64,
        offset: u64,
        len: u64,
    },
}

/// Where a driver puts a node's verified chunks: a [`Store`], or one stripe's view of a shared
/// store (balanced multi-tree sends, see [`crate::stripes`]).
pub trait LocalCopy: Send {
    /// Queues a verified chunk (`hash`: its BLAKE3 hash, as verified) for writing; a
    /// [`StoreEvent::Stored`] with the same index follows.
    fn write(&self, index: u64, offset: u64, data: Bytes, hash: [u8; 32]);
    /// Queues the move into place; a [`StoreEvent::Finalized`] follows.
    fn finalize(&self);
    /// Queues reading a chunk back; a [`StoreEvent::Loaded`] follows. False: this copy cannot
    /// be read back (nothing follows).
    fn load(&self, _index: u64, _offset: u64, _len: u64) -> bool {
        false
    }
}

impl LocalCopy for Store {
    fn write(&self, index: u64, offset: u64, data: Bytes, hash: [u8; 32]) {
        Store::write(self, index, offset, data, hash)
    }
    fn finalize(&self) {
        Store::finalize(self)
    }
    fn load(&self, index: u64, offset: u64, len: u64) -> bool {
        match &self.tx {
            Some(tx) => tx.send(Cmd::Read { index, offset, len }).is_ok(),
            None => false,
        }
    }
}

/// Handle to the store thread. Dropping it before `finalize` removes the temporary copy.
pub struct Store {
    tx: Option<std_mpsc::Sender<Cmd>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// A read-only handle on the temporary file of a one-file copy: what a swarm member serves
    /// its stored pieces from. Stays valid through the rename into place.
    reader: Option<Disk>,
}

/// A one-file copy's file, opened to read stored pieces back (to serve them to peers).
#[derive(Clone)]
pub enum Disk {
    /// Through the page cache: mapped and handed to `sendfile` ([`crate::mapped`]).
    Cached(Arc<File>),
    /// With `O_DIRECT`, into pooled buffers ([`crate::direct`]): the copy was written that way.
    Direct(Arc<direct::Reader>),
}

impl Store {
    /// Prepares the copy (creating the temporary file or tree) and starts the thread.
    pub fn open(
        target: Target,
        manifest: &Manifest,
        session: SessionId,
        io: CopyIo,
        events: mpsc::UnboundedSender<StoreEvent>,
        stored: Option<Arc<AtomicU64>>,
    ) -> io::Result<Store> {
        let sink = Sink::open(&target, manifest, session, io)?;
        Self::start(sink, events, stored)
    }

    /// Like [`Store::open`], for a one-file copy that outlives a failed session: resumes the
    /// partial copy of this object (cut in `chunk_size` chunks) that an earlier session left,
    /// or finds an identical copy in place, and says which. Cleans stale partial copies next
    /// to it by `partials` first. Blocks while it verifies what is there (it reads it all).
    #[allow(clippy::too_many_arguments)]
    pub fn open_resumable(
        target: Target,
        manifest: &Manifest,
        chunk_size: u32,
        session: SessionId,
        io: CopyIo,
        events: mpsc::UnboundedSender<StoreEvent>,
        stored: Option<Arc<AtomicU64>>,
        partials: Partials,
    ) -> io::Result<(Store, Resumed)> {
        let dest = match &target {
            Target::Dir(d) if manifest.kind != ObjectKind::Stream => d.join(&manifest.name),
            Target::Path(p) if manifest.kind != ObjectKind::Stream => p.clone(),
            _ => {
                let s = Self::open(target, manifest, session, io, events, stored)?;
                return Ok((s, Resumed::default()));
            }
        };
        let dir = partial::parent_of(&dest).to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| ctx(e, "creating", &dir))?;
        partials.clean(&dir);
        // Another session of this object may still hold the copy: one that lost its parent and
        // has not noticed yet (its process was stopped, say) lets it go within moments.
        let waited = std::time::Instant::now();
        if manifest.kind == ObjectKind::Dir {
            let opened = loop {
                match tree::open(&dest, manifest, chunk_size)
                    .map_err(|e| ctx(e, "resuming", &dest))?
                {
                    tree::Opened::Busy if waited.elapsed() < BUSY_WAIT => {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    o => break o,
                }
            };
            let (sink, resumed) = match opened {
                tree::Opened::Complete => (
                    Sink::CompleteTree {
                        dest,
                        manifest: manifest.clone(),
                    },
                    Resumed {
                        held: Default::default(),
                        complete: true,
                    },
                ),
                tree::Opened::Partial { tmp, ledger, held } => (
                    Sink::Tree {
                        tmp,
                        dest,
                        manifest: manifest.clone(),
                        open: None,
                        writeback: Writeback::default(),
                        ledger: Some(ledger),
                    },
                    Resumed {
                        held,
                        complete: false,
                    },
                ),
                tree::Opened::Busy => {
                    let s = Self::open(target, manifest, session, io, events, stored)?;
                    return Ok((s, Resumed::default()));
                }
            };
            return Ok((Self::start(sink, events, stored)?, resumed));
        }
        let opened = loop {
            let o = partial::open(&dest, manifest, chunk_size)
                .map_err(|e| ctx(e, "resuming", &dest))?;
            match o {
                partial::Opened::Busy if waited.elapsed() < BUSY_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                o => break o,
            }
        };
        let (sink, resumed) = match opened {
            partial::Opened::Complete(file) => (
                Sink::Complete { dest, file },
                Resumed {
                    held: Default::default(),
                    complete: true,
                },
            ),
            partial::Opened::Partial { file, ledger, held } => {
                let tmp = ledger.names.part.clone();
                let sink = Sink::file(tmp, dest, file, io, manifest, Some(ledger))?;
                (
                    sink,
                    Resumed {
                        held,
                        complete: false,
                    },
                )
            }
            partial::Opened::Busy => {
                tracing::info!(
                    "{}: another session is receiving it; this one does not resume",
                    dest.display()
                );
                let s = Self::open(target, manifest, session, io, events, stored)?;
                return Ok((s, Resumed::default()));
            }
        };
        Ok((Self::start(sink, events, stored)?, resumed))
    }

    fn start(
        mut sink: Sink,
        events: mpsc::UnboundedSender<StoreEvent>,
        stored: Option<Arc<AtomicU64>>,
    ) -> io::Result<Store> {
        let reader = match &sink {
            Sink::File {
                tmp, direct: None, ..
            } => Some(Disk::Cached(Arc::new(File::open(tmp)?))),
            Sink::File { tmp, .. } => Some(match direct::Reader::open(tmp)? {
                Some(r) => Disk::Direct(Arc::new(r)),
                None => Disk::Cached(Arc::new(File::open(tmp)?)),
            }),
            // An identical copy in place: its pieces are served from it.
            Sink::Complete { file, .. } => Some(Disk::Cached(Arc::new(file.try_clone()?))),
            _ => None,
        };
        let (tx, rx) = std_mpsc::channel::<Cmd>();
        let thread = std::thread::Builder::new()
            .name("bulkcast-store".into())
            .spawn(move || {
                let mut failed = false;
                for cmd in rx {
                    match cmd {
                        Cmd::Write {
                            index,
                            offset,
                            data,
                            hash,
                        } if !failed => match sink.write(offset, &data, &hash) {
                            Ok(()) => {
                                if let Some(c) = &stored {
                                    c.fetch_add(data.len() as u64, Ordering::Relaxed);
                                }
                                let _ = events.send(StoreEvent::Stored(index));
                            }
                            Err(e) => {
                                failed = true;
                                // A full disk needs its space back more than a resume.
                                if e.is_out_of_space() {
                                    sink.forget();
                                }
                                sink.discard();
                                let _ = events.send(StoreEvent::Failed(e));
                            }
                        },
                        Cmd::Write { .. } => {}
                        Cmd::Read { index, offset, len } => {
                            let r = sink.read(offset, len);
                            let _ = events.send(StoreEvent::Loaded(index, r));
                        }
                        Cmd::Finalize if !failed => {
                            let r = sink.finalize();
                            if r.is_err() {
                                sink.discard();
                            }
                            let _ = events.send(StoreEvent::Finalized(r));
                            return;
                        }
                        Cmd::Finalize => return,
                    }
                }
                // The session ended without completing: no partial copy stays behind.
                sink.discard();
            })?;
        Ok(Store {
            tx: Some(tx),
            thread: Some(thread),
            reader,
        })
    }

    /// The copy's file, for reading back stored chunks, when it is one file (not a tree or
    /// standard output), kept or in place already. A chunk is there once its
    /// [`StoreEvent::Stored`] came, or if the copy held it when it was opened.
    pub fn reader(&self) -> Option<Disk> {
        self.reader.clone()
    }

    /// Queues a verified chunk for writing, with its BLAKE3 `hash` as verified (recorded in a
    /// resumable copy's map).
    pub fn write(&self, index: u64, offset: u64, data: Bytes, hash: [u8; 32]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Cmd::Write {
                index,
                offset,
                data,
                hash,
            });
        }
    }

    /// [`Store::write`] with the hash computed here (tests).
    #[cfg(test)]
    pub(crate) fn write_hashed(&self, index: u64, offset: u64, data: Bytes) {
        let hash = *blake3::hash(&data).as_bytes();
        self.write(index, offset, data, hash)
    }

    /// Queues the move into place (after every write).
    pub fn finalize(&self) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Cmd::Finalize);
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The blocking side.
enum Sink {
    File {
        tmp: PathBuf,
        dest: PathBuf,
        file: File,
        /// With [`CopyIo::Direct`] where the file system allows it: the page-aligned part of
        /// every write goes through here; `None` after it refused one.
        direct: Option<direct::Writer>,
        /// Write-back of what went through the page cache, started as the copy is written.
        writeback: Writeback,
        /// The file's mode and modification time, set once its content is in place (`None`
        /// for a stream, whose copy keeps the receiver's defaults).
        meta: Option<(u32, Option<Mtime>)>,
        /// A resumable copy's map: what is written is recorded there, and the copy is kept
        /// when the session fails.
        ledger: Option<partial::Ledger>,
    },
    Tree {
        tmp: PathBuf,
        dest: PathBuf,
        manifest: Manifest,
        /// The most recently written file, kept open (writes are mostly sequential).
        open: Option<(usize, File)>,
        /// Write-back of the open file, started as it is written (a file is started once
        /// more when the next one opens), so the syncs at the end wait for little.
        writeback: Writeback,
        /// A resumable tree's map ([`tree`]), as for a file.
        ledger: Option<partial::Ledger>,
    },
    Stdout(io::Stdout),
    /// An identical copy was in place before the session: only read from.
    Complete {
        dest: PathBuf,
        file: File,
    },
    /// An identical tree was in place before the session: only read from.
    CompleteTree {
        dest: PathBuf,
        manifest: Manifest,
    },
    Done,
}

impl Sink {
    fn open(target: &Target, m: &Manifest, session: SessionId, io: CopyIo) -> io::Result<Sink> {
        let dest = match target {
            Target::Stdout => return Ok(Sink::Stdout(io::stdout())),
            Target::Dir(d) => d.join(&m.name),
            Target::Path(p) => p.clone(),
        };
        let parent = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(|e| ctx(e, "creating", parent))?;
        let base = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| m.name.clone());
        let tmp = parent.join(format!(".{base}.bulkcast-{session:016x}.part"));
        match m.kind {
            ObjectKind::File | ObjectKind::Stream => {
                let file = OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .read(true)
                    .write(true)
                    .open(&tmp)
                    .map_err(|e| ctx(e, "creating", &tmp))?;
                Sink::file(tmp, dest, file, io, m, None)
            }
            ObjectKind::Dir => {
                // Checked here too, whoever checked before: the paths below are trusted to
                // stay under `tmp` and never to pass through a symlink.
                m.validate()
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let _ = fs::remove_dir_all(&tmp);
                fs::create_dir_all(&tmp).map_err(|e| ctx(e, "creating", &tmp))?;
                create_tree(&tmp, m)?;
                Ok(Sink::Tree {
                    tmp,
                    dest,
                    manifest: m.clone(),
                    open: None,
                    writeback: Writeback::default(),
                    ledger: None,
                })
            }
        }
    }

    fn file(
        tmp: PathBuf,
        dest: PathBuf,
        file: File,
        io: CopyIo,
        m: &Manifest,
        ledger: Option<partial::Ledger>,
    ) -> io::Result<Sink> {
        let direct = match io {
            CopyIo::Direct => direct::Writer::open(&tmp).map_err(|e| ctx(e, "opening", &tmp))?,
            CopyIo::Buffered => None,
        };
        Ok(Sink::File {
            tmp,
            dest,
            file,
            direct,
            writeback: Writeback::default(),
            meta: (m.kind == ObjectKind::File).then_some((m.mode, m.mtime)),
            ledger,
        })
    }

    /// Reads `len` bytes at `offset` back from a one-file copy.
    fn read(&self, offset: u64, len: u64) -> Result<Bytes, StoreError> {
        let (file, path) = match self {
            Sink::File { file, tmp, .. } => (file, tmp),
            Sink::Complete { file, dest } => (file, dest),
            Sink::Tree { tmp, manifest, .. }
            | Sink::CompleteTree {
                dest: tmp,
                manifest,
            } => {
                let mut buf = vec![0u8; len as usize];
                tree::read_at(tmp, manifest, &mut buf, offset)
                    .map_err(|e| describe(e, "reading back", tmp))?;
                return Ok(Bytes::from(buf));
            }
            _ => return Err(StoreError::NotReadable),
        };
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset)
            .map_err(|e| describe(e, "reading back", path))?;
        Ok(Bytes::from(buf))
    }

    fn write(&mut self, offset: u64, data: &[u8], hash: &[u8; 32]) -> Result<(), StoreError> {
        debug_assert_eq!(
            blake3::hash(data).as_bytes(),
            hash,
            "a chunk's hash as verified"
        );
        match self {
            Sink::File {
                tmp,
                file,
                direct,
                writeback,
                ledger,
                ..
            } => {
                let r = Self::write_file(tmp, file, direct, writeback, offset, data);
                // Recorded only once written: the map never lists bytes not handed to the file
                // (and a crash before they reach the disk is caught by the hash on resuming).
                if let (Ok(()), Some(l)) = (&r, ledger) {
                    l.record(offset, hash)
                        .map_err(|e| describe(e, "recording the chunk in", tmp))?;
                }
                r
            }
            Sink::Tree { .. }
            | Sink::Stdout(_)
            | Sink::Complete { .. }
            | Sink::CompleteTree { .. }
            | Sink::Done => self.write_other(offset, data, hash),
        }
    }

    fn write_file(
        tmp: &Path,
        file: &File,
        direct: &mut Option<direct::Writer>,
        writeback: &mut Writeback,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StoreError> {
        let n = match direct.as_mut().map(|w| w.write_at(offset, data)) {
            None => 0,
            Some(Ok(n)) => n,
            // A device whose blocks are larger than a page: the page cache from now on.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                *direct = None;
                0
            }
            Some(Err(e)) => return Err(describe(e, "writing", tmp)),
        };
        if n == data.len() {
            return Ok(());
        }
        file.write_all_at(&data[n..], offset + n as u64)
            .map_err(|e| describe(e, "writing", tmp))?;
        writeback.wrote(file, (data.len() - n) as u64);
        Ok(())
    }

    fn write_other(&mut self, offset: u64, data: &[u8], hash: &[u8; 32]) -> Result<(), StoreError> {
        match self {
            Sink::Tree {
                tmp,
                manifest,
                open,
                writeback,
                ledger,
                ..
            } => {
                for (entry, at, from, len) in manifest.locate(offset, data.len() as u64) {
                    let path = tmp.join(&manifest.entries[entry].path);
                    if open.as_ref().map(|o| o.0) != Some(entry) {
                        if let Some((_, done)) = open.take() {
                            start_writeback(&done);
                        }
                        let f = OpenOptions::new()
                            .write(true)
                            .custom_flags(libc::O_NOFOLLOW)
                            .open(&path)
                            .map_err(|e| describe(e, "opening", &path))?;
                        *open = Some((entry, f));
                    }
                    let f = &open.as_ref().expect("just opened").1;
                    f.write_all_at(&data[from as usize..(from + len) as usize], at)
                        .map_err(|e| describe(e, "writing", &path))?;
                    writeback.wrote(f, len);
                }
                if let Some(l) = ledger {
                    l.record(offset, hash)
                        .map_err(|e| describe(e, "recording the chunk in", tmp))?;
                }
                Ok(())
            }
            Sink::Stdout(out) => out.lock().write_all(data).map_err(|e| StoreError::Stdout {
                what: "writing",
                error: Arc::new(e),
            }),
            Sink::File { .. } | Sink::Complete { .. } | Sink::CompleteTree { .. } | Sink::Done => {
                Ok(())
            }
        }
    }

    fn finalize(&mut self) -> Result<PathBuf, StoreError> {
        match std::mem::replace(self, Sink::Done) {
            Sink::File {
                tmp,
                dest,
                file,
                meta,
                ledger,
                ..
            } => {
                let fail = |e, what| {
                    // A resumable copy stays for the next session; others go.
                    if ledger.is_none() {
                        let _ = fs::remove_file(&tmp);
                    }
                    describe(e, what, &dest)
                };
                file.sync_data().map_err(|e| describe(e, "syncing", &tmp))?;
                if let Some((mode, mtime)) = meta {
                    set_meta(&file, mode, mtime);
                }
                drop(file);
                fs::rename(&tmp, &dest).map_err(|e| fail(e, "moving into place"))?;
                if let Some(l) = ledger {
                    l.finish(&dest);
                }
                Ok(dest)
            }
            Sink::Tree {
                tmp,
                dest,
                manifest,
                open,
                ledger,
                ..
            } => {
                drop(open);
                finish_tree(&tmp, &manifest)?;
                if dest.is_dir() {
                    // A previous copy is replaced whole, as a re-sent file would be.
                    fs::remove_dir_all(&dest).map_err(|e| describe(e, "replacing", &dest))?;
                }
                fs::rename(&tmp, &dest).map_err(|e| {
                    // A resumable tree stays for the next session; others go.
                    if ledger.is_none() {
                        let _ = fs::remove_dir_all(&tmp);
                    }
                    describe(e, "moving into place", &dest)
                })?;
                if let Some(l) = ledger {
                    l.finish_with(|done, id| {
                        partial::write_record(done, id, &tree::stamps(&dest, &manifest)?)
                    });
                }
                Ok(dest)
            }
            Sink::Stdout(out) => {
                out.lock().flush().map_err(|e| StoreError::Stdout {
                    what: "flushing",
                    error: Arc::new(e),
                })?;
                Ok(PathBuf::from("-"))
            }
            Sink::Complete { dest, .. } | Sink::CompleteTree { dest, .. } => Ok(dest),
            Sink::Done => Err(StoreError::FinalizedTwice),
        }
    }

    /// Makes a resumable copy an ordinary one: [`Sink::discard`] removes it.
    fn forget(&mut self) {
        if let Sink::File { ledger, .. } | Sink::Tree { ledger, .. } = self {
            if let Some(l) = ledger.take() {
                let _ = fs::remove_file(&l.names.map);
            }
        }
    }

    /// Removes the temporary copy, unless it is resumable: that one stays, with what it
    /// verified, for the next session of the same object.
    fn discard(&mut self) {
        match std::mem::replace(self, Sink::Done) {
            Sink::File {
                tmp, ledger: None, ..
            } => {
                let _ = fs::remove_file(tmp);
            }
            Sink::File {
                tmp,
                ledger: Some(l),
                ..
            } => {
                tracing::info!("keeping the partial copy {} to resume", tmp.display());
                l.keep();
            }
            Sink::Tree {
                tmp, ledger: None, ..
            } => {
                let _ = fs::remove_dir_all(tmp);
            }
            Sink::Tree { tmp, .. } => {
                tracing::info!("keeping the partial tree {} to resume", tmp.display());
            }
            Sink::Stdout(_) | Sink::Complete { .. } | Sink::CompleteTree { .. } | Sink::Done => {}
        }
    }
}

/// Sets a file's or directory's mode and modification time through its descriptor. Best
/// effort, as `cp -p` without root: a file system that keeps neither still gets the content.
pub(super) fn set_meta(f: &File, mode: u32, mtime: Option<Mtime>) {
    if let Some(t) = mtime.and_then(Mtime::to_system) {
        let _ = f.set_modified(t);
    }
    let _ = f.set_permissions(fs::Permissions::from_mode(mode & MODE_BITS));
}

/// Start write-back of dirty pages every this many bytes, so the `fsync` before the copy is
/// moved into place waits for little more than the last stretch (eight receivers of a 128
/// MiB multicast on one VM spent 0.67 s in that `fsync` when nothing had been written back).
const WRITEBACK_EVERY: u64 = 8 << 20;

/// Bytes written to a file through the page cache since its write-back was last started.
#[derive(Debug, Default)]
pub(crate) struct Writeback {
    unflushed: u64,
}

impl Writeback {
    /// `n` more bytes went to `file`: every [`WRITEBACK_EVERY`], start writing them out.
    pub(crate) fn wrote(&mut self, file: &File, n: u64) {
        self.unflushed += n;
        if self.unflushed >= WRITEBACK_EVERY {
            self.unflushed = 0;
            start_writeback(file);
        }
    }
}

/// Asks the kernel to start writing the file's dirty pages out, without waiting for it.
fn start_writeback(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd; offset 0 and length 0 mean the whole file; the call only schedules
    // write-back and its failure is harmless (the final fsync still syncs everything). Kept on
    // libc: nix does not wrap sync_file_range.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// How long a session waits for another one of the same object to release its copy before it
/// writes a copy of its own ([`Store::open_resumable`]).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

const DISK_FULL: &str = " (disk full: free space on the receiver and send again)";
const QUOTA: &str = " (quota exceeded)";

pub(super) fn ctx(e: io::Error, what: &'static str, p: &Path) -> io::Error {
    io::Error::new(e.kind(), describe(e, what, p))
}

pub(super) fn describe(e: io::Error, what: &'static str, p: &Path) -> StoreError {
    StoreError::io(e, what, p)
}

/// What to do about `e`, said after it.
fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => DISK_FULL,
        Some(libc::EDQUOT) => QUOTA,
        Some(libc::EACCES) | Some(libc::EPERM) => " (permission denied: check the agent's --dir)",
        _ => "",
    }
}

#[cfg(test)]
mod tests;
