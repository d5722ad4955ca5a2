//! The source's input: a file, a directory tree or standard input, read on its own thread and
//! cut into chunks.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bulkcast_proto::auth::Keys;
use bulkcast_proto::manifest::{
    link_target, plain_component, Entry, EntryKind, Manifest, Mtime, ObjectKind, MODE_BITS,
};
use bulkcast_proto::stripe::Stripes;
use bulkcast_proto::wire::{Chunk, SessionId};
use bytes::BytesMut;
use tokio::sync::mpsc;

/// What `route` makes of a piece of input: the channel it goes to, the sealed chunk and its
/// group list.
type Routed = (usize, Chunk, Vec<[u8; 32]>);

/// What the input thread produces.
#[derive(Debug)]
pub enum InputEvent {
    /// The next chunk, hashed and authenticated (exactly one chunk long unless it is the last),
    /// and its groups' chaining values (to send it in verified parts).
    Data(Chunk, Vec<[u8; 32]>),
    /// The input ended.
    End,
    /// Reading failed.
    Failed(InputError),
}

/// Why reading the source's input failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InputError {
    /// Opening or reading the input failed.
    #[error("reading the input: {0}")]
    Read(Arc<io::Error>),
    /// Mapping the input file into memory failed.
    #[error("mapping {0}")]
    Map(Arc<io::Error>),
    /// A file of known length ended early: it was cut while being sent.
    #[error("the input shrank while being sent ({now} of {len} bytes)")]
    Shrank {
        /// Bytes it held when this was seen.
        now: u64,
        /// Bytes it held when the send began.
        len: u64,
    },
    /// A file of known length went on past it.
    #[error("the input grew while being sent (more than {len} bytes)")]
    Grew {
        /// Bytes it held when the send began.
        len: u64,
    },
    /// The file's modification time changed while it was sent.
    #[error("the input file was modified while being sent")]
    Modified,
}

impl InputError {
    fn read(e: io::Error) -> InputError {
        InputError::Read(Arc::new(e))
    }
}

/// An input and its manifest, ready to be read.
#[derive(Debug)]
pub struct Input {
    /// What the receivers are told.
    pub manifest: Manifest,
    files: Vec<PathBuf>,
    stdin: bool,
    skipped: Vec<Skipped>,
    /// Bytes handed on so far; grows on the input thread, read by status displays.
    read: Arc<AtomicU64>,
}

/// An entry of a directory that is not sent, and why (the rest of the directory is).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// Its path in the directory (lossy where the name is not UTF-8).
    pub path: String,
    /// Why it is left out.
    pub reason: String,
}

impl Input {
    /// Describes `path` (a file or a directory) or, for `-`, standard input named `name`. A
    /// directory's symlinks are carried as links (see [`link_target`]), never followed.
    pub fn open(path: &Path, name: Option<&str>) -> io::Result<Input> {
        Input::open_with(path, name, false)
    }

    /// [`Input::open`]; with `follow`, a directory's symlinks are followed and what they point
    /// at is sent in their place (a link that dangles or leads back into a directory it is in
    /// is left out).
    pub fn open_with(path: &Path, name: Option<&str>, follow: bool) -> io::Result<Input> {
        if path == Path::new("-") {
            let name = name.unwrap_or("stdin").to_string();
            return Ok(Input {
                manifest: Manifest {
                    name,
                    kind: ObjectKind::Stream,
                    total_len: None,
                    entries: vec![],
                    mode: 0,
                    mtime: None,
                },
                files: vec![],
                stdin: true,
                skipped: vec![],
                read: Arc::default(),
            });
        }
        let meta = fs::metadata(path).map_err(|e| with_path(e, path))?;
        let name = match name {
            Some(n) => n.to_string(),
            None => path
                .canonicalize()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: cannot tell the name to send it under; give --name",
                            path.display()
                        ),
                    )
                })?,
        };
        let (mode, mtime) = mode_and_mtime(&meta);
        if meta.is_file() {
            return Ok(Input {
                manifest: Manifest {
                    name,
                    kind: ObjectKind::File,
                    total_len: Some(meta.len()),
                    entries: vec![],
                    mode,
                    mtime,
                },
                files: vec![path.to_path_buf()],
                stdin: false,
                skipped: vec![],
                read: Arc::default(),
            });
        }
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is neither a file nor a directory", path.display()),
            ));
        }
        let mut w = Walk {
            follow,
            ..Walk::default()
        };
        w.dir(path, "", &meta)?;
        let total = w.entries.iter().map(|e| e.len).sum();
        Ok(Input {
            manifest: Manifest {
                name,
                kind: ObjectKind::Dir,
                total_len: Some(total),
                entries: w.entries,
                mode,
                mtime,
            },
            files: w.files,
            stdin: false,
            skipped: w.skipped,
            read: Arc::default(),
        })
    }

    /// The directory's entries that are not sent (each also logged as a warning).
    pub fn skipped(&self) -> &[Skipped] {
        &self.skipped
    }

    /// Bytes of the input handed on so far (as it is read, once spawned).
    pub fn read_counter(&self) -> Arc<AtomicU64> {
        self.read.clone()
    }

    /// The file when the object is one regular file (which can be mapped and sent with
    /// `sendfile`, see [`crate::mapped`]).
    pub fn single_file(&self) -> Option<&Path> {
        (self.manifest.kind == ObjectKind::File && self.files.len() == 1)
            .then(|| self.files[0].as_path())
    }

    /// Starts reading on a thread that also hashes and authenticates each chunk (off the event
    /// loop); chunks arrive on the returned channel (two in flight, so the reader runs ahead of
    /// the network only a little).
    pub fn spawn(
        self,
        chunk_size: usize,
        keys: Keys,
        session: SessionId,
    ) -> mpsc::Receiver<InputEvent> {
        let (tx, rx) = mpsc::channel(2);
        let mut index = 0u64;
        self.run(chunk_size, vec![tx], move |data| {
            let (c, cvs) = keys.seal_in_groups(session, index, data);
            index += 1;
            (0, c, cvs)
        });
        rx
    }

    /// Like [`Input::spawn`], for a balanced send: chunk `g` goes to tree `stripes.tree_of(g)`,
    /// sealed for that tree's session with its index within the stripe. Each tree has a
    /// two-chunk queue and the reader deals in pattern order, so a tree that falls behind its
    /// share holds the reader back: every tree keeps its planned share of the rate.
    pub fn spawn_striped(
        self,
        chunk_size: usize,
        keys: Keys,
        sessions: Vec<SessionId>,
        stripes: Stripes,
    ) -> Vec<mpsc::Receiver<InputEvent>> {
        let (txs, rxs): (Vec<_>, Vec<_>) = sessions.iter().map(|_| mpsc::channel(2)).unzip();
        let mut g = 0u64;
        self.run(chunk_size, txs, move |data| {
            let t = stripes.tree_of(g) as usize;
            let (c, cvs) = keys.seal_in_groups(sessions[t], stripes.local_of(g), data);
            g += 1;
            (t, c, cvs)
        });
        rxs
    }

    /// Reads on a thread; `route` seals each piece and names the channel it goes to.
    fn run(
        self,
        chunk_size: usize,
        txs: Vec<mpsc::Sender<InputEvent>>,
        mut route: impl FnMut(bytes::Bytes) -> Routed + Send + 'static,
    ) {
        let read = self.read.clone();
        let route = move |data: bytes::Bytes| {
            read.fetch_add(data.len() as u64, Ordering::Relaxed);
            route(data)
        };
        std::thread::Builder::new()
            .name("bulkcast-input".into())
            .spawn(move || {
                let expected = self.manifest.total_len;
                if let Some(path) = self.single_file() {
                    let ev = match pump_mapped(path, chunk_size, expected, &txs, route) {
                        Ok(()) => InputEvent::End,
                        Err(e) => InputEvent::Failed(e),
                    };
                    return finish(&txs, ev);
                }
                let r: Box<dyn Read> = if self.stdin {
                    Box::new(io::stdin())
                } else {
                    Box::new(Concat {
                        files: self.files.into_iter(),
                        cur: None,
                    })
                };
                let ev = match pump(r, chunk_size, expected, &txs, route) {
                    Ok(()) => InputEvent::End,
                    Err(e) => InputEvent::Failed(e),
                };
                finish(&txs, ev);
            })
            .expect("spawning the input thread");
    }
}

/// Tells every channel how the input ended.
fn finish(txs: &[mpsc::Sender<InputEvent>], ev: InputEvent) {
    for tx in txs {
        let _ = tx.blocking_send(match &ev {
            InputEvent::End => InputEvent::End,
            InputEvent::Failed(e) => InputEvent::Failed(e.clone()),
            InputEvent::Data(..) => unreachable!("pumps end with End or Failed"),
        });
    }
}

/// Hands each chunk of one regular file on as its own read-only mapping of the page cache
/// ([`crate::mapped`]): no copy into a buffer before the chunk is hashed, none into the socket
/// after. A mapping lives only as long as its chunk is held (by the send window), so resident
/// memory stays bounded as with buffers.
///
/// A file that shrinks under a mapping raises SIGBUS when the missing page is touched; the
/// handler installed here turns that into a clear message and exit status 1 (the receivers
/// keep their verified chunks and can resume), and the size is checked before each chunk so the
/// usual case of a file rewritten between chunks gets the ordinary error.
fn pump_mapped(
    path: &Path,
    cs: usize,
    expected: Option<u64>,
    txs: &[mpsc::Sender<InputEvent>],
    mut route: impl FnMut(bytes::Bytes) -> Routed,
) -> Result<(), InputError> {
    let f = File::open(path).map_err(|e| InputError::read(with_path(e, path)))?;
    let f = std::sync::Arc::new(f);
    let len = expected.unwrap_or(0);
    let stamp = |f: &File| -> Result<(u64, Option<std::time::SystemTime>), InputError> {
        let m = f.metadata().map_err(InputError::read)?;
        Ok((m.len(), m.modified().ok()))
    };
    let (_, mtime) = stamp(&f)?;
    install_sigbus_message();
    let mut dead = vec![false; txs.len()];
    let mut off = 0u64;
    // The current window of the file ([`crate::mapped::WINDOW`], whole chunks) and where it
    // starts; chunks are slices of it.
    let mut window: Option<(u64, bytes::Bytes)> = None;
    let per_window = (crate::mapped::WINDOW / cs).max(1) as u64 * cs as u64;
    loop {
        // Checked before every chunk and at the end: a file rewritten while it is sent fails
        // with this error instead of with chunks that fail verification.
        let (now, m) = stamp(&f)?;
        if now < len {
            return Err(InputError::Shrank { now, len });
        }
        if now > len {
            return Err(InputError::Grew { len });
        }
        if m != mtime {
            return Err(InputError::Modified);
        }
        if off == len {
            return Ok(());
        }
        let n = (len - off).min(cs as u64) as usize;
        let in_window = window
            .as_ref()
            .is_some_and(|(at, w)| off + n as u64 <= at + w.len() as u64);
        if !in_window {
            let wlen = (len - off).min(per_window) as usize;
            // SAFETY: what the file does to the mapping meanwhile is the SIGBUS case above, or
            // changed bytes that fail their hash at every receiver (and the check above on the
            // next chunk); wrong bytes never pass as good. `off` is a multiple of the chunk
            // size, a power of two of at least a page.
            let w = unsafe { crate::mapped::chunk(&f, off, wlen, true) }
                .map_err(|e| InputError::Map(Arc::new(with_path(e, path))))?;
            window = Some((off, w));
        }
        let (at, w) = window.as_ref().expect("mapped above");
        let start = (off - at) as usize;
        let data = w.slice(start..start + n);
        off += n as u64;
        let (t, chunk, cvs) = route(data);
        if hand_on(txs, &mut dead, t, chunk, cvs) {
            return Ok(());
        }
    }
}

/// Sends `chunk` to tree `t` unless its session ended (every receiver below it failed: the
/// others still get their stripes whole); true once every session has ended.
fn hand_on(
    txs: &[mpsc::Sender<InputEvent>],
    dead: &mut [bool],
    t: usize,
    chunk: Chunk,
    cvs: Vec<[u8; 32]>,
) -> bool {
    if !dead[t] && txs[t].blocking_send(InputEvent::Data(chunk, cvs)).is_err() {
        dead[t] = true;
    }
    dead.iter().all(|&d| d)
}

/// Installs (once) a SIGBUS handler that says what a bus error means here and exits 1.
pub(crate) fn install_sigbus_message() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn on_sigbus(_: libc::c_int) {
        const MSG: &[u8] = b"bulkcast: error: a file shrank while mapped (SIGBUS): the input \
file, or a copy being served to peers, was truncated by another program; the receivers keep \
what they verified: send it again to resume\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe. Kept on libc (and below): the
        // handler and its installation are unsafe in nix too.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(1);
        }
    }
    ONCE.call_once(|| {
        // SAFETY: a plain handler that only calls async-signal-safe functions.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

fn pump(
    mut r: Box<dyn Read>,
    cs: usize,
    expected: Option<u64>,
    txs: &[mpsc::Sender<InputEvent>],
    mut route: impl FnMut(bytes::Bytes) -> Routed,
) -> Result<(), InputError> {
    let mut total = 0u64;
    let mut dead = vec![false; txs.len()];
    loop {
        let mut buf = BytesMut::zeroed(cs);
        let mut filled = 0;
        while filled < cs {
            match r.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(InputError::read(e)),
            }
        }
        total += filled as u64;
        if let Some(n) = expected {
            if total > n {
                return Err(InputError::Grew { len: n });
            }
        }
        if filled > 0 {
            buf.truncate(filled);
            let (t, chunk, cvs) = route(buf.freeze());
            // A tree whose session ended (every receiver below it failed) is skipped; the
            // others still get their stripes whole.
            if hand_on(txs, &mut dead, t, chunk, cvs) {
                return Ok(()); // every session ended first
            }
        }
        if filled < cs {
            if let Some(n) = expected {
                if total != n {
                    return Err(InputError::Shrank { now: total, len: n });
                }
            }
            return Ok(());
        }
    }
}

/// Files read one after another as one stream.
struct Concat {
    files: std::vec::IntoIter<PathBuf>,
    cur: Option<(PathBuf, File)>,
}

impl Read for Concat {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.cur.is_none() {
                match self.files.next() {
                    None => return Ok(0),
                    Some(p) => {
                        let f = File::open(&p).map_err(|e| with_path(e, &p))?;
                        self.cur = Some((p, f));
                    }
                }
            }
            let (p, f) = self.cur.as_mut().expect("set above");
            match f.read(buf) {
                Ok(0) => self.cur = None,
                Ok(n) => return Ok(n),
                Err(e) => return Err(with_path(e, p)),
            }
        }
    }
}

/// A directory walk: the manifest's entries, the files whose bytes make the object, and what
/// is left out. Symlinks are never followed.
#[derive(Default)]
struct Walk {
    entries: Vec<Entry>,
    files: Vec<PathBuf>,
    skipped: Vec<Skipped>,
    /// Follow symlinks (`send --follow-symlinks`).
    follow: bool,
    /// Device and inode of the directories being walked, outermost first: a followed link to
    /// one of them would loop.
    open_dirs: Vec<(u64, u64)>,
}

impl Walk {
    fn dir(&mut self, dir: &Path, prefix: &str, meta: &fs::Metadata) -> io::Result<()> {
        self.open_dirs.push((meta.dev(), meta.ino()));
        let r = self.list(dir, prefix);
        self.open_dirs.pop();
        r
    }

    fn list(&mut self, dir: &Path, prefix: &str) -> io::Result<()> {
        let mut list: Vec<_> = fs::read_dir(dir)
            .map_err(|e| with_path(e, dir))?
            .collect::<Result<_, _>>()
            .map_err(|e| with_path(e, dir))?;
        list.sort_by_key(|e| e.file_name());
        for e in list {
            let join = |name: &str| match prefix {
                "" => name.to_string(),
                _ => format!("{prefix}/{name}"),
            };
            // Manifest paths are UTF-8 strings and plain components; a name that is not
            // cannot be stored as it is, so it is left out and reported, not renamed.
            let name = match e.file_name().into_string() {
                Ok(n) if plain_component(&n) => n,
                Ok(n) => {
                    self.skip(join(&n), "the name holds a backslash".into());
                    continue;
                }
                Err(n) => {
                    self.skip(join(&n.to_string_lossy()), "the name is not UTF-8".into());
                    continue;
                }
            };
            let rel = join(&name);
            let path = e.path();
            let mut meta = fs::symlink_metadata(&path).map_err(|er| with_path(er, &path))?;
            if self.follow && meta.file_type().is_symlink() {
                meta = match self.followed(&path) {
                    Ok(m) => m,
                    Err(why) => {
                        self.skip(rel, why);
                        continue;
                    }
                };
            }
            self.entry(path, rel, &meta)?;
        }
        Ok(())
    }

    fn entry(&mut self, path: PathBuf, rel: String, meta: &fs::Metadata) -> io::Result<()> {
        let (mode, mtime) = mode_and_mtime(meta);
        let kind = match kind_of(&path, &rel, meta)? {
            Ok(kind) => kind,
            Err(why) => {
                self.skip(rel, why);
                return Ok(());
            }
        };
        let (is_dir, is_file) = (kind == EntryKind::Dir, kind == EntryKind::File);
        let len = if is_file { meta.len() } else { 0 };
        self.entries.push(Entry {
            path: rel.clone(),
            kind,
            len,
            mode,
            mtime,
        });
        if is_dir {
            self.dir(&path, &rel, meta)?;
        } else if is_file {
            self.files.push(path);
        }
        Ok(())
    }

    /// What a followed symlink points at, or why it is left out.
    fn followed(&self, path: &Path) -> Result<fs::Metadata, String> {
        let target = fs::read_link(path).map_or_else(|_| "?".into(), |t| t.display().to_string());
        let meta = fs::metadata(path).map_err(|e| format!("symlink to {target}: {e}"))?;
        if meta.is_dir() && self.open_dirs.contains(&(meta.dev(), meta.ino())) {
            return Err(format!(
                "symlink to {target}: leads back into a directory it is in (a loop)"
            ));
        }
        Ok(meta)
    }

    fn skip(&mut self, path: String, reason: String) {
        tracing::warn!("not sending {path}: {reason}");
        self.skipped.push(Skipped { path, reason });
    }
}

/// What an entry is sent as, or why it is left out: a symlink is carried as a link, in the form
/// [`link_target`] gives, or not at all (never followed).
fn kind_of(path: &Path, rel: &str, meta: &fs::Metadata) -> io::Result<Result<EntryKind, String>> {
    if meta.is_dir() {
        return Ok(Ok(EntryKind::Dir));
    }
    if meta.is_file() {
        return Ok(Ok(EntryKind::File));
    }
    if !meta.file_type().is_symlink() {
        return Ok(Err("not a regular file, directory or symlink".into()));
    }
    let target = fs::read_link(path).map_err(|er| with_path(er, path))?;
    let carried = match target.to_str() {
        Some(t) => link_target(rel, t),
        None => Err("the target is not UTF-8"),
    };
    Ok(carried
        .map(EntryKind::Symlink)
        .map_err(|why| format!("symlink to {}: {why}", target.display())))
}

/// What a manifest keeps of an entry's metadata: the permission bits with setuid, setgid and
/// sticky (a send drops those unless asked, [`Manifest::drop_special_modes`]), and the
/// modification time.
fn mode_and_mtime(meta: &fs::Metadata) -> (u32, Option<Mtime>) {
    let mode = meta.permissions().mode() & MODE_BITS;
    (mode, meta.modified().ok().and_then(Mtime::from_system))
}

fn with_path(e: io::Error, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkcast_proto::auth::Secret;
    use std::io::Write;

    fn keys() -> Keys {
        Keys::derive(&Secret::from_bytes([7; 32]))
    }

    fn temp_file(tag: &str, len: usize) -> (PathBuf, Vec<u8>) {
        let p = std::env::temp_dir().join(format!("bulkcast-input-{tag}-{}", std::process::id()));
        let body: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&p, &body).unwrap();
        (p, body)
    }

    fn drain(rx: &mut mpsc::Receiver<InputEvent>) -> (Vec<Chunk>, InputEvent) {
        let mut chunks = Vec::new();
        loop {
            match rx
                .blocking_recv()
                .expect("the input ends with End or Failed")
            {
                InputEvent::Data(c, _) => chunks.push(c),
                ev => return (chunks, ev),
            }
        }
    }

    #[test]
    fn a_mapped_file_arrives_whole_in_sealed_chunks() {
        let cs = 8192;
        let (p, body) = temp_file("whole", 5 * cs + 123);
        let input = Input::open(&p, None).unwrap();
        let mut rx = input.spawn(cs, keys(), 9);
        let (chunks, end) = drain(&mut rx);
        assert!(matches!(end, InputEvent::End), "{end:?}");
        assert_eq!(chunks.len(), 6);
        let joined: Vec<u8> = chunks.iter().flat_map(|c| c.data.iter().copied()).collect();
        assert_eq!(joined, body);
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(c.index, i as u64);
            keys().verify(9, c).expect("sealed for the session");
        }
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_walk_carries_in_tree_links_and_reports_what_it_leaves_out() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::symlink;
        let d = std::env::temp_dir().join(format!("bulkcast-input-walk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(d.join("sub/empty")).unwrap();
        fs::write(d.join("sub/f"), b"12345").unwrap();
        symlink("f", d.join("sub/in")).unwrap();
        symlink("../sub/./f", d.join("sub/up")).unwrap();
        symlink("../../etc", d.join("sub/out")).unwrap();
        symlink("/etc/passwd", d.join("abs")).unwrap();
        fs::write(d.join(std::ffi::OsStr::from_bytes(b"bad\xff")), b"x").unwrap();
        fs::write(d.join("back\\slash"), b"x").unwrap();
        let input = Input::open(&d, Some("d")).unwrap();
        let m = &input.manifest;
        assert_eq!(m.validate(), Ok(()));
        let got: Vec<(&str, &EntryKind)> = m
            .entries
            .iter()
            .map(|e| (e.path.as_str(), &e.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                ("sub", &EntryKind::Dir),
                ("sub/empty", &EntryKind::Dir),
                ("sub/f", &EntryKind::File),
                ("sub/in", &EntryKind::Symlink("f".into())),
                ("sub/up", &EntryKind::Symlink("../sub/f".into())),
            ]
        );
        assert_eq!(m.total_len, Some(5));
        let skipped: Vec<&str> = input.skipped().iter().map(|s| s.path.as_str()).collect();
        assert_eq!(skipped, ["abs", "back\\slash", "bad\u{fffd}", "sub/out"]);
        assert!(input.skipped()[0].reason.contains("absolute"));
        assert!(input.skipped()[3].reason.contains("leaves the tree"));
        assert!(m.mtime.is_some() && m.entries.iter().all(|e| e.mtime.is_some()));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn following_links_sends_what_they_point_at_and_stops_at_loops() {
        use std::os::unix::fs::symlink;
        let base =
            std::env::temp_dir().join(format!("bulkcast-input-follow-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let d = base.join("d");
        fs::create_dir_all(d.join("sub")).unwrap();
        fs::create_dir_all(base.join("elsewhere")).unwrap();
        fs::write(base.join("elsewhere/w"), b"1234").unwrap();
        fs::write(d.join("sub/f"), b"12345").unwrap();
        symlink("../../elsewhere", d.join("sub/out")).unwrap();
        symlink("f", d.join("sub/in")).unwrap();
        symlink("..", d.join("sub/loop")).unwrap();
        symlink("nowhere", d.join("dangling")).unwrap();
        let input = Input::open_with(&d, None, true).unwrap();
        let m = &input.manifest;
        assert_eq!(m.validate(), Ok(()));
        let got: Vec<(&str, &EntryKind, u64)> = m
            .entries
            .iter()
            .map(|e| (e.path.as_str(), &e.kind, e.len))
            .collect();
        assert_eq!(
            got,
            vec![
                ("sub", &EntryKind::Dir, 0),
                ("sub/f", &EntryKind::File, 5),
                ("sub/in", &EntryKind::File, 5),
                ("sub/out", &EntryKind::Dir, 0),
                ("sub/out/w", &EntryKind::File, 4),
            ]
        );
        assert_eq!(input.files.len(), 3);
        let skipped: Vec<&str> = input.skipped().iter().map(|s| s.path.as_str()).collect();
        assert_eq!(skipped, ["dangling", "sub/loop"]);
        assert!(input.skipped()[1].reason.contains("loop"));
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_file_that_grows_while_sent_fails_clearly() {
        let cs = 4096;
        let (p, _) = temp_file("grows", 64 * cs);
        let input = Input::open(&p, None).unwrap();
        let mut rx = input.spawn(cs, keys(), 1);
        // The reader stops two chunks ahead; change the file while it waits.
        let first = rx.blocking_recv();
        assert!(matches!(first, Some(InputEvent::Data(..))));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"more")
            .unwrap();
        let (chunks, end) = drain(&mut rx);
        assert!(chunks.len() < 63, "the change was noticed late");
        match end {
            // The size or, caught between the two updates of the write, the time.
            InputEvent::Failed(InputError::Grew { .. } | InputError::Modified) => {}
            other => panic!("expected a failure, got {other:?}"),
        }
        std::fs::remove_file(&p).unwrap();
    }
}
