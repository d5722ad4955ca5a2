//! A directory's copy that outlives its session, as a one-file copy does ([`super::partial`]).
//!
//! The tree is written under `.NAME.bulkcast-ID.part` (a directory) next to its final name,
//! `ID` naming the object; its map, `.NAME.bulkcast-ID.map`, has the same records as a file's:
//! one per chunk of the object's bytes, which run through the tree's files in manifest order (a
//! chunk may span several files). A later session of the same object checks every record
//! against the bytes in the tree's files, so each file resumes from what was verified of it.
//!
//! Once the tree is in place, `.NAME.bulkcast.done` records the object's identity and what the
//! top directory and every entry looked like then (inode, length, modification and change
//! times): a later send finds every file identical and moves nothing. Changing, adding or
//! removing anything in the tree moves some change time, and the whole tree is sent again.
//!
//! A tree kept from an earlier session is trusted no further than a fresh one: its paths are
//! checked never to pass through a link (else it is removed and started afresh), and the links
//! of the object are made only at the end, as for a fresh tree ([`finish_tree`]).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bulkcast_proto::chunkmap::ChunkMap;
use bulkcast_proto::manifest::{EntryKind, Manifest, Mtime};
use bulkcast_proto::wire::object_id;

use super::partial::{self, Ledger, Names};
use super::{ctx, describe, set_meta};

/// A resumable tree, opened.
pub(super) enum Opened {
    /// An identical tree is in place: read from it.
    Complete,
    /// The partial tree (created if new) at `tmp`, with its verified chunks and its ledger.
    Partial {
        tmp: PathBuf,
        ledger: Ledger,
        held: ChunkMap,
    },
    /// Another session is writing this object here now: this one writes its own copy.
    Busy,
}

/// Opens the tree of `m` (cut in `chunk_size` chunks) to go to `dest`, resuming what an
/// earlier session left.
pub(super) fn open(dest: &Path, m: &Manifest, chunk_size: u32) -> io::Result<Opened> {
    m.validate()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    let id = object_id(m);
    let names = Names::new(dest, &id);
    if is_done(&names.done, &id, dest, m) {
        return Ok(Opened::Complete);
    }
    let Some(map) = partial::lock_map(&names)? else {
        return Ok(Opened::Busy);
    };
    let tmp = names.part.clone();
    if !reuse(&tmp, m) {
        fresh(&tmp, m)?;
    }
    let (ledger, held) = partial::load_map(
        map,
        names,
        id,
        m,
        chunk_size,
        || fresh(&tmp, m),
        |buf, at| read_at(&tmp, m, buf, at),
    )?;
    Ok(Opened::Partial { tmp, ledger, held })
}

/// Reads the object's bytes at `offset` from the tree at `root` into `buf`.
pub(super) fn read_at(root: &Path, m: &Manifest, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut got = 0;
    for (entry, at, from, len) in m.locate(offset, buf.len() as u64) {
        let f = open_no_follow(&root.join(&m.entries[entry].path))?;
        f.read_exact_at(&mut buf[from as usize..(from + len) as usize], at)?;
        got += len;
    }
    if got != buf.len() as u64 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    Ok(())
}

/// The tree is in place at `dest`: what its done record keeps.
pub(super) fn stamps(dest: &Path, m: &Manifest) -> io::Result<Vec<u8>> {
    let top = fs::symlink_metadata(dest)?;
    if !top.is_dir() {
        return Err(io::Error::other("not a directory"));
    }
    let mut out = partial::stamp_of(&top).to_vec();
    for e in &m.entries {
        let md = fs::symlink_metadata(dest.join(&e.path))?;
        let kind_ok = match e.kind {
            EntryKind::Dir => md.is_dir(),
            EntryKind::File => md.is_file(),
            EntryKind::Symlink(_) => md.is_symlink(),
        };
        if !kind_ok {
            return Err(io::Error::other(format!("{} changed kind", e.path)));
        }
        out.extend_from_slice(&partial::stamp_of(&md));
    }
    Ok(out)
}

/// The tree at `dest` is the object `id`, nothing in it changed since it was put there.
fn is_done(done: &Path, id: &[u8; 32], dest: &Path, m: &Manifest) -> bool {
    partial::read_record(done, id).is_some_and(|r| stamps(dest, m).is_ok_and(|s| s == r))
}

/// A new, empty tree at `tmp` (whatever was there goes).
fn fresh(tmp: &Path, m: &Manifest) -> io::Result<()> {
    match fs::symlink_metadata(tmp) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(tmp)?,
        Ok(_) => fs::remove_file(tmp)?,
        Err(_) => {}
    }
    fs::create_dir(tmp)?;
    create_tree(tmp, m)
}

/// Makes the tree an earlier session left at `tmp` ready to be written again: what is missing
/// is created, the links a failed finish made are removed, and what the finish made read-only
/// becomes writable again. False: it is not such a tree (or a path in it passes through a
/// link, or an entry is of another kind), and must be started afresh.
fn reuse(tmp: &Path, m: &Manifest) -> bool {
    if !fs::symlink_metadata(tmp).is_ok_and(|md| md.is_dir()) {
        return false;
    }
    let _ = writable(tmp, 0o700);
    m.entries.iter().all(|e| {
        let p = tmp.join(&e.path);
        ancestors_are_dirs(tmp, &e.path)
            && match (&e.kind, fs::symlink_metadata(&p)) {
                (EntryKind::Dir, Ok(md)) => md.is_dir() && writable(&p, 0o700).is_ok(),
                (EntryKind::Dir, Err(_)) => fs::create_dir(&p).is_ok(),
                (EntryKind::File, Ok(md)) => md.is_file() && writable(&p, 0o600).is_ok(),
                (EntryKind::File, Err(_)) => OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .is_ok(),
                (EntryKind::Symlink(_), Ok(md)) => md.is_symlink() && fs::remove_file(&p).is_ok(),
                (EntryKind::Symlink(_), Err(_)) => true,
            }
    })
}

/// Every directory on the way to `path` under `tmp` is one (not a link), created if missing.
fn ancestors_are_dirs(tmp: &Path, path: &str) -> bool {
    let mut at = tmp.to_path_buf();
    let parts: Vec<&str> = path.split('/').collect();
    parts[..parts.len().saturating_sub(1)].iter().all(|c| {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(md) => md.is_dir(),
            Err(_) => fs::create_dir(&at).is_ok(),
        }
    })
}

/// Adds `bits` to the mode of `p` (a file or directory of the tree, not a link).
fn writable(p: &Path, bits: u32) -> io::Result<()> {
    let mode = fs::symlink_metadata(p)?.permissions().mode();
    if mode & bits != bits {
        fs::set_permissions(p, fs::Permissions::from_mode((mode | bits) & 0o7777))?;
    }
    Ok(())
}

/// Creates a validated tree's directories and empty files under `tmp`. Symlinks wait for
/// [`finish_tree`], after every write: nothing is ever written through one.
pub(super) fn create_tree(tmp: &Path, m: &Manifest) -> io::Result<()> {
    for e in &m.entries {
        let p = tmp.join(&e.path);
        if let Some(d) = p.parent() {
            fs::create_dir_all(d).map_err(|er| ctx(er, "creating", d))?;
        }
        match e.kind {
            EntryKind::Dir => fs::create_dir_all(&p).map_err(|er| ctx(er, "creating", &p))?,
            EntryKind::File => {
                // `create_new` (O_EXCL) never follows a link, whatever is there.
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&p)
                    .map_err(|er| ctx(er, "creating", &p))?;
            }
            EntryKind::Symlink(_) => {}
        }
    }
    Ok(())
}

/// Once every byte is written: syncs the files, creates the symlinks, then sets modes and
/// modification times, files first and directories deepest first, the top one last, so no
/// later change inside a directory moves its time again.
pub(super) fn finish_tree(tmp: &Path, m: &Manifest) -> Result<(), super::StoreError> {
    for e in &m.entries {
        let p = tmp.join(&e.path);
        match &e.kind {
            EntryKind::File => {
                let f = open_no_follow(&p).map_err(|er| describe(er, "opening", &p))?;
                f.sync_data().map_err(|er| describe(er, "syncing", &p))?;
                set_meta(&f, e.mode, e.mtime);
            }
            EntryKind::Symlink(target) => {
                std::os::unix::fs::symlink(target, &p)
                    .map_err(|er| describe(er, "creating the symlink", &p))?;
                if let Some(t) = e.mtime {
                    set_link_mtime(&p, t);
                }
            }
            EntryKind::Dir => {}
        }
    }
    // Deepest first: a parent whose mode forbids entering it must not stop its children.
    let mut dirs: Vec<_> = m
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::Dir)
        .collect();
    dirs.sort_by_key(|e| std::cmp::Reverse(e.path.split('/').count()));
    for e in dirs {
        let p = tmp.join(&e.path);
        let f = open_no_follow(&p).map_err(|er| describe(er, "opening", &p))?;
        set_meta(&f, e.mode, e.mtime);
    }
    let f = File::open(tmp).map_err(|er| describe(er, "opening", tmp))?;
    set_meta(&f, m.mode, m.mtime);
    Ok(())
}

/// Opens what must not be a symlink (a file or directory this store created) to read.
pub(super) fn open_no_follow(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(p)
}

/// A symlink's own modification time (`utimensat` with `AT_SYMLINK_NOFOLLOW`).
fn set_link_mtime(p: &Path, t: Mtime) {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let mtime = TimeSpec::new(t.secs as _, t.nanos as _);
    // A failure leaves the link's own time, which only the mtime check of a later resume reads.
    let _ = utimensat(
        nix::fcntl::AT_FDCWD,
        p,
        &TimeSpec::UTIME_OMIT,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{self, Events};
    use crate::store::{LocalCopy, Resumed, Store, StoreEvent};
    use bulkcast_proto::manifest::{Entry, ObjectKind};

    const CS: u32 = 4;

    fn entry(path: &str, kind: EntryKind, len: u64, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            kind,
            len,
            mode,
            mtime: None,
        }
    }

    /// 3 + 0 + 6 + 5 bytes in three files, a link and an empty directory: chunks of 4 bytes
    /// span files.
    fn manifest() -> Manifest {
        Manifest {
            name: "t".into(),
            kind: ObjectKind::Dir,
            total_len: Some(14),
            entries: vec![
                entry("a", EntryKind::Dir, 0, 0o555),
                entry("a/x", EntryKind::File, 3, 0o444),
                entry("a/e", EntryKind::File, 0, 0o644),
                entry("a/l", EntryKind::Symlink("x".into()), 0, 0o777),
                entry("b", EntryKind::Dir, 0, 0o755),
                entry("y", EntryKind::File, 6, 0o600),
                entry("z", EntryKind::File, 5, 0o644),
            ],
            mode: 0o755,
            mtime: None,
        }
    }

    const BODY: &[u8; 14] = b"abcdefghijklmn";

    fn open(d: &Path, m: &Manifest) -> (Store, Resumed, Events) {
        testing::open(d, m, CS)
    }

    async fn write(s: &Store, rx: &mut Events, i: u64) {
        testing::write(s, rx, BODY, CS, i).await
    }

    async fn finish(s: &Store, rx: &mut Events) {
        s.finalize();
        assert!(matches!(
            rx.recv().await,
            Some(StoreEvent::Finalized(Ok(_)))
        ));
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bulkcast-tree-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[tokio::test]
    async fn a_failed_tree_is_kept_resumed_then_found_complete() {
        let d = tmpdir("resume");
        let m = manifest();
        let (s, r, mut rx) = open(&d, &m);
        assert!(r.held.is_empty() && !r.complete);
        // Chunk 1 spans a/x and y; chunk 3 is y's end and z.
        for i in [1, 3] {
            write(&s, &mut rx, i).await;
        }
        drop(s); // the session failed
        assert_eq!(names(&d).len(), 2, "{:?}", names(&d)); // the tree and its map
        let (s, r, mut rx) = open(&d, &m);
        assert_eq!(r.held.ranges(), vec![(1, 2), (3, 4)]);
        // A resumed relay serves what it held from the tree.
        assert!(LocalCopy::load(&s, 1, 4, 4));
        let Some(StoreEvent::Loaded(1, Ok(got))) = rx.recv().await else {
            panic!()
        };
        assert_eq!(&got[..], b"efgh");
        for i in [0, 2] {
            write(&s, &mut rx, i).await;
        }
        finish(&s, &mut rx).await;
        drop(s);
        let t = d.join("t");
        let whole: Vec<u8> = ["a/x", "y", "z"]
            .iter()
            .flat_map(|p| fs::read(t.join(p)).unwrap())
            .collect();
        assert_eq!(&whole[..], BODY);
        assert_eq!(fs::read_link(t.join("a/l")).unwrap(), Path::new("x"));
        assert_eq!(names(&d), vec![".t.bulkcast.done", "t"]);
        // Sent again: identical, only read from.
        let (s, r, mut rx) = open(&d, &m);
        assert!(r.complete && r.held.is_empty());
        assert!(LocalCopy::load(&s, 3, 12, 2));
        assert!(matches!(rx.recv().await, Some(StoreEvent::Loaded(3, Ok(b))) if &b[..] == b"mn"));
        finish(&s, &mut rx).await;
        drop(s);
        // One file changed by anyone: a stranger again, the tree moves again.
        let z = t.join("z");
        fs::write(&z, b"MN").unwrap();
        let (s, r, _rx) = open(&d, &m);
        assert!(!r.complete && r.held.is_empty());
        drop(s);
        fs::set_permissions(t.join("a"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::remove_dir_all(d).unwrap();
    }

    #[tokio::test]
    async fn a_kept_tree_with_a_link_in_its_paths_is_started_afresh() {
        let d = tmpdir("link");
        let outside = tmpdir("link-outside");
        let m = manifest();
        let (s, _, mut rx) = open(&d, &m);
        write(&s, &mut rx, 0).await;
        drop(s);
        let part = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|x| x == "part"))
            .unwrap();
        // Someone swapped a directory of the kept tree for a link out of it.
        fs::remove_dir_all(part.join("a")).unwrap();
        std::os::unix::fs::symlink(&outside, part.join("a")).unwrap();
        let (s, r, _rx) = open(&d, &m);
        assert!(r.held.is_empty());
        assert!(fs::symlink_metadata(part.join("a")).unwrap().is_dir());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        drop(s);
        fs::remove_dir_all(d).unwrap();
        fs::remove_dir_all(outside).unwrap();
    }
}
