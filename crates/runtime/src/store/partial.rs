//! Partial copies that outlive their session, so that a later send of the same object moves
//! only what is missing.
//!
//! A one-file copy is written to `.NAME.bulkcast-ID.part` next to its final name, where `ID`
//! names the object ([`object_id`]: its manifest), not the session. A later session may cut it
//! in chunks of another size (a different tree): what was verified is re-cut to the new size. Beside it,
//! `.NAME.bulkcast-ID.map` lists the chunks written: a header, then one record per chunk (its
//! index and the BLAKE3 hash of its bytes), appended after the chunk's bytes were written. A
//! crash (SIGKILL, power loss) can leave a record whose bytes never reached the disk, or a torn
//! last record; so nothing in the map is believed: when a copy is opened again every record is
//! checked by hashing the bytes on disk, torn and mismatching ones are dropped, and the map is
//! rewritten with the verified ones only. A torn write is never taken as verified. The one
//! exception is a copy this very process kept when its session failed (`Ledger::keep`) and
//! that nothing has touched since (same inode, length and times of the copy and its map): no
//! crash came between its writes and its records, so a session that opens it again (a subtree
//! re-opened below a dead relay) takes the records as they are instead of hashing the whole
//! copy again, which took a relay of a 1 GiB copy seconds before it could open its children.
//!
//! Once the copy is complete and moved into place, `.NAME.bulkcast.done` records its identity
//! and what the file looked like then (inode, length, modification and change times): a later
//! send of the same object finds an identical copy in place and moves nothing. Any change to the
//! file (its change time moves whatever the user does) makes it a stranger again.
//!
//! Stale partial copies are removed by [`Partials::clean`]: those not touched for
//! [`Partials::max_age`] (default 7 days), then the oldest while together they exceed
//! [`Partials::max_bytes`] (default: no limit). An agent cleans its directory when it starts and
//! whenever a session opens a copy there. A copy in use by a running session (its map is locked)
//! is never removed.

use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bulkcast_proto::chunkmap::ChunkMap;
use bulkcast_proto::manifest::{chunk_count, Manifest};
use bulkcast_proto::wire::object_id;

const MAGIC: &[u8; 8] = b"BCSTMAP1";
const HEADER: usize = 8 + 32 + 4 + 8;
const RECORD: usize = 8 + 32;
const DONE_MAGIC: &[u8; 8] = b"BCSTDON1";

/// How long and how much of stale partial copies an agent keeps.
#[derive(Debug, Clone, Copy)]
pub struct Partials {
    /// A partial copy not written for this long is removed.
    pub max_age: Duration,
    /// Partial copies beyond this many bytes together are removed, oldest first (`None`: no
    /// limit).
    pub max_bytes: Option<u64>,
}

impl Default for Partials {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(7 * 24 * 3600),
            max_bytes: None,
        }
    }
}

/// What a copy held when it was opened.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    /// Verified chunks of the partial copy.
    pub held: ChunkMap,
    /// An identical copy is in place already.
    pub complete: bool,
}

/// The file names of one object's copy next to `dest`.
pub(super) struct Names {
    pub part: PathBuf,
    pub map: PathBuf,
    pub done: PathBuf,
}

impl Names {
    pub fn new(dest: &Path, id: &[u8; 32]) -> Names {
        let dir = parent_of(dest);
        let base = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tag: String = id[..8].iter().map(|b| format!("{b:02x}")).collect();
        Names {
            part: dir.join(format!(".{base}.bulkcast-{tag}.part")),
            map: dir.join(format!(".{base}.bulkcast-{tag}.map")),
            done: dir.join(format!(".{base}.bulkcast.done")),
        }
    }
}

/// The directory a copy at `dest` lives in.
pub(super) fn parent_of(dest: &Path) -> &Path {
    dest.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A resumable copy, opened.
pub(super) enum Opened {
    /// An identical copy is in place: read from it.
    Complete(File),
    /// The partial copy (created if new) with its verified chunks and its ledger.
    Partial {
        file: File,
        ledger: Ledger,
        held: ChunkMap,
    },
    /// Another session is writing this object here now: this one writes its own copy.
    Busy,
}

/// The map of a partial copy, locked for the session writing it.
pub(super) struct Ledger {
    /// Open (and locked, `flock`) for the whole session.
    map: Flock<File>,
    /// Where the next record goes.
    end: u64,
    chunk_size: u64,
    pub names: Names,
    pub id: [u8; 32],
}

impl Ledger {
    /// Records that the chunk at `offset` was written with bytes whose BLAKE3 hash is `hash`
    /// (verified by the caller: hashing every chunk again here cost a receiver a second hash
    /// of every byte).
    pub fn record(&mut self, offset: u64, hash: &[u8; 32]) -> io::Result<()> {
        let mut r = [0u8; RECORD];
        r[..8].copy_from_slice(&(offset / self.chunk_size).to_le_bytes());
        r[8..].copy_from_slice(hash);
        self.map.write_all_at(&r, self.end)?;
        self.end += RECORD as u64;
        Ok(())
    }

    /// The session failed and its copy stays for the next one: remember what the copy and its
    /// map look like now, so that this process, opening them again untouched, can take the
    /// records without hashing the copy ([`load_map`]). Only for one-file copies: a directory's
    /// stamp does not change when a file inside it does.
    pub fn keep(self) {
        if let Some(stamps) = kept_stamps(&self.names) {
            kept().insert(self.names.map.clone(), stamps);
        }
    }

    /// The copy is in place at `dest`: remember it as identical, forget the map.
    pub fn finish(self, dest: &Path) {
        self.finish_with(|done, id| write_done(done, id, dest));
    }

    /// The copy is in place: `done` writes the record that says so, then the map goes.
    pub fn finish_with(self, done: impl FnOnce(&Path, &[u8; 32]) -> io::Result<()>) {
        if let Err(e) = done(&self.names.done, &self.id) {
            tracing::debug!("{}: {e}", self.names.done.display());
        }
        let _ = fs::remove_file(&self.names.map);
    }
}

/// Opens the copy of `m` (cut in `chunk_size` chunks) to go to `dest`, resuming what is there
/// (written by a session that may have cut it in chunks of another size).
pub(super) fn open(dest: &Path, m: &Manifest, chunk_size: u32) -> io::Result<Opened> {
    let id = object_id(m);
    let names = Names::new(dest, &id);
    if is_done(&names.done, &id, dest) {
        return Ok(Opened::Complete(File::open(dest)?));
    }
    let Some(map) = lock_map(&names)? else {
        return Ok(Opened::Busy);
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&names.part)?;
    let (ledger, held) = load_map(
        map,
        names,
        id,
        m,
        chunk_size,
        || file.set_len(0),
        |buf, at| file.read_exact_at(buf, at),
    )?;
    Ok(Opened::Partial { file, ledger, held })
}

/// Opens and locks (`flock`) the map of a partial copy; `None`: another session holds it.
pub(super) fn lock_map(names: &Names) -> io::Result<Option<Flock<File>>> {
    let map = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&names.map)?;
    // Held until the session drops the ledger (`Flock` unlocks, then closes).
    Ok(Flock::lock(map, FlockArg::LockExclusiveNonblock).ok())
}

/// The stamps of a partial copy and its map, as [`Ledger::keep`] left them.
type Kept = HashMap<PathBuf, [u8; 96]>;

/// Copies this process kept at the end of a failed session, by map path.
fn kept() -> std::sync::MutexGuard<'static, Kept> {
    static KEPT: LazyLock<Mutex<Kept>> = LazyLock::new(Mutex::default);
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

fn kept_stamps(names: &Names) -> Option<[u8; 96]> {
    let part = fs::symlink_metadata(&names.part)
        .ok()
        .filter(|m| m.is_file())?;
    let map = fs::symlink_metadata(&names.map).ok()?;
    let mut s = [0u8; 96];
    s[..48].copy_from_slice(&stamp_of(&part));
    s[48..].copy_from_slice(&stamp_of(&map));
    Some(s)
}

/// True when this process kept the copy at `names` and nothing touched it since (the entry
/// is used up: a copy is taken on trust once per keep).
fn untouched_since_kept(names: &Names) -> bool {
    let Some(was) = kept().remove(&names.map) else {
        return false;
    };
    kept_stamps(names) == Some(was)
}

/// Reads a locked map, keeps the chunks whose bytes (`read` at an offset of the object) hash
/// as recorded, re-cut to `chunk_size`, and rewrites the map with those only. A map of another
/// object or a torn header: `reset` empties the copy and nothing is held.
pub(super) fn load_map(
    mut map: Flock<File>,
    names: Names,
    id: [u8; 32],
    m: &Manifest,
    chunk_size: u32,
    reset: impl FnOnce() -> io::Result<()>,
    read: impl Fn(&mut [u8], u64) -> io::Result<()>,
) -> io::Result<(Ledger, ChunkMap)> {
    let total = m.total_len.unwrap_or(0);
    let mut header = Vec::with_capacity(HEADER);
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&id);
    header.extend_from_slice(&chunk_size.to_le_bytes());
    header.extend_from_slice(&total.to_le_bytes());
    let mut old = Vec::new();
    map.read_to_end(&mut old)?;
    let old_cs = old.get(40..44).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("4 bytes")) as u64
    });
    let same = old.len() >= HEADER
        && old[..40] == header[..40]
        && old[44..HEADER] == header[44..HEADER]
        && old_cs > 0;
    let trusted = same && untouched_since_kept(&names);
    let good = if !same {
        reset()?;
        Vec::new()
    } else if trusted {
        believe(&old[HEADER..], old_cs, total)
    } else {
        verify(&read, &old[HEADER..], old_cs, total)
    };
    // The map is rewritten with what was verified only (a torn last record is gone too); at
    // the same chunk size the verified records are the new map, else the chunks are re-cut
    // and hashed again.
    let mut fresh = header;
    let held = if old_cs == chunk_size as u64 {
        for r in &good {
            fresh.extend_from_slice(r);
        }
        held_of(&good)
    } else {
        let held = recut(&held_of(&good), old_cs, chunk_size as u64, total);
        for (s, e) in held.ranges() {
            for i in s..e {
                let len = chunk_len(i, chunk_size as u64, total);
                let mut buf = vec![0u8; len as usize];
                read(&mut buf, i * chunk_size as u64)?;
                fresh.extend_from_slice(&i.to_le_bytes());
                fresh.extend_from_slice(blake3::hash(&buf).as_bytes());
            }
        }
        held
    };
    map.set_len(0)?;
    map.write_all_at(&fresh, 0)?;
    let ledger = Ledger {
        map,
        end: fresh.len() as u64,
        chunk_size: chunk_size as u64,
        names,
        id,
    };
    Ok((ledger, held))
}

/// The map's `records` whose bytes (`read` at an offset) hash as recorded, each chunk once.
fn verify(
    read: &impl Fn(&mut [u8], u64) -> io::Result<()>,
    records: &[u8],
    cs: u64,
    total: u64,
) -> Vec<[u8; RECORD]> {
    let mut buf = Vec::new();
    unique_records(records, cs, total, |i, hash| {
        buf.resize(chunk_len(i, cs, total) as usize, 0);
        read(&mut buf, i * cs).is_ok() && blake3::hash(&buf).as_bytes() == hash
    })
}

/// The map's `records` as they are, each chunk once: for a copy nothing touched since this
/// process wrote it ([`Ledger::keep`]).
fn believe(records: &[u8], cs: u64, total: u64) -> Vec<[u8; RECORD]> {
    unique_records(records, cs, total, |_, _| true)
}

/// The whole records of `records` for chunks of the object that `good` accepts, the first
/// accepted record of each chunk only.
fn unique_records(
    records: &[u8],
    cs: u64,
    total: u64,
    mut good: impl FnMut(u64, &[u8]) -> bool,
) -> Vec<[u8; RECORD]> {
    let n = chunk_count(total, cs as u32);
    let mut seen = ChunkMap::new();
    let mut out = Vec::new();
    for r in records.chunks_exact(RECORD) {
        let i = u64::from_le_bytes(r[..8].try_into().expect("8 bytes"));
        if i >= n || seen.contains(i) || !good(i, &r[8..]) {
            continue;
        }
        seen.insert(i);
        out.push(r.try_into().expect("a whole record"));
    }
    out
}

fn held_of(records: &[[u8; RECORD]]) -> ChunkMap {
    let mut held = ChunkMap::new();
    for r in records {
        held.insert(u64::from_le_bytes(r[..8].try_into().expect("8 bytes")));
    }
    held
}

/// The chunks of size `cs` wholly inside the chunks of size `old_cs` in `held`.
fn recut(held: &ChunkMap, old_cs: u64, cs: u64, total: u64) -> ChunkMap {
    if old_cs == cs {
        return held.clone();
    }
    let mut out = ChunkMap::new();
    for (s, e) in held.ranges() {
        let (from, to) = (s * old_cs, (e * old_cs).min(total));
        for j in from.div_ceil(cs)..chunk_count(total, cs as u32) {
            let end = ((j + 1) * cs).min(total);
            if end > to {
                break;
            }
            out.insert(j);
        }
    }
    out
}

fn chunk_len(i: u64, cs: u64, total: u64) -> u64 {
    cs.min(total.saturating_sub(i * cs))
}

/// What the done record says about the file in place.
fn stamp(dest: &Path) -> io::Result<[u8; 48]> {
    let md = fs::symlink_metadata(dest)?;
    if !md.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(stamp_of(&md))
}

/// What a done record keeps of one file, directory or link: any change to it (its content,
/// mode, time, or for a directory its entries) moves its change time.
pub(super) fn stamp_of(md: &fs::Metadata) -> [u8; 48] {
    let mut s = [0u8; 48];
    s[..8].copy_from_slice(&md.ino().to_le_bytes());
    s[8..16].copy_from_slice(&md.len().to_le_bytes());
    s[16..24].copy_from_slice(&md.mtime().to_le_bytes());
    s[24..32].copy_from_slice(&md.mtime_nsec().to_le_bytes());
    s[32..40].copy_from_slice(&md.ctime().to_le_bytes());
    s[40..48].copy_from_slice(&md.ctime_nsec().to_le_bytes());
    s
}

fn write_done(done: &Path, id: &[u8; 32], dest: &Path) -> io::Result<()> {
    write_record(done, id, &stamp(dest)?)
}

/// Writes a done record: the object's identity and the `stamps` of its copy in place.
pub(super) fn write_record(done: &Path, id: &[u8; 32], stamps: &[u8]) -> io::Result<()> {
    let mut rec = Vec::with_capacity(8 + 32 + stamps.len());
    rec.extend_from_slice(DONE_MAGIC);
    rec.extend_from_slice(id);
    rec.extend_from_slice(stamps);
    let tmp = done.with_extension("done.new");
    fs::write(&tmp, &rec)?;
    fs::rename(&tmp, done)
}

/// The stamps a done record keeps for the object `id` (`None`: no record of it).
pub(super) fn read_record(done: &Path, id: &[u8; 32]) -> Option<Vec<u8>> {
    let rec = fs::read(done).ok()?;
    (rec.len() >= 8 + 32 && &rec[..8] == DONE_MAGIC && &rec[8..40] == id)
        .then(|| rec[40..].to_vec())
}

/// The copy at `dest` is the object `id`, untouched since it was put there.
fn is_done(done: &Path, id: &[u8; 32], dest: &Path) -> bool {
    read_record(done, id).is_some_and(|r| stamp(dest).is_ok_and(|s| s[..] == r[..]))
}

impl Partials {
    /// Removes the stale partial copies in `dir` (see the module documentation); returns how
    /// many bytes it freed.
    pub fn clean(&self, dir: &Path) -> u64 {
        let Ok(rd) = fs::read_dir(dir) else { return 0 };
        let now = SystemTime::now();
        let mut parts: Vec<(SystemTime, u64, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with('.') && name.contains(".bulkcast-");
                if !ours || !name.ends_with(".part") {
                    return None;
                }
                let md = fs::symlink_metadata(e.path()).ok()?;
                // A directory's partial copy (a tree) counts with every file in it.
                let len = match md.is_dir() {
                    true => tree_len(&e.path()),
                    false => md.is_file().then_some(md.len())?,
                };
                // Its map is written with every chunk: a tree's own time moves only when
                // entries are made at its top.
                let map = fs::metadata(e.path().with_extension("map")).and_then(|m| m.modified());
                let at = md.modified().unwrap_or(now).max(map.unwrap_or(UNIX_EPOCH));
                Some((at, len, e.path()))
            })
            .collect();
        parts.sort();
        let mut total: u64 = parts.iter().map(|p| p.1).sum();
        let mut freed = 0;
        for (at, len, part) in parts {
            let old = now.duration_since(at).unwrap_or_default() >= self.max_age;
            let over = self.max_bytes.is_some_and(|m| total > m);
            if (old || over) && remove_unlocked(&part) {
                tracing::info!("removed stale partial copy {}", part.display());
                total -= len;
                freed += len;
            }
        }
        freed
    }
}

/// Removes a partial copy and its map unless a session holds the map's lock.
fn remove_unlocked(part: &Path) -> bool {
    let map = part.with_extension("map");
    if let Ok(f) = File::open(&map) {
        let Ok(_locked) = Flock::lock(f, FlockArg::LockExclusiveNonblock) else {
            return false;
        };
        let _ = fs::remove_file(&map);
    }
    match fs::symlink_metadata(part) {
        Ok(md) if md.is_dir() => fs::remove_dir_all(part).is_ok(),
        _ => fs::remove_file(part).is_ok(),
    }
}

/// The bytes of the regular files under `dir` (links not followed).
fn tree_len(dir: &Path) -> u64 {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match fs::symlink_metadata(e.path()) {
            Ok(md) if md.is_dir() => tree_len(&e.path()),
            Ok(md) if md.is_file() => md.len(),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{self, Events};
    use crate::store::{LocalCopy, Store, StoreEvent};
    use bulkcast_proto::manifest::ObjectKind;
    use std::io::Write;

    const CS: u32 = 4096;

    fn manifest(len: u64) -> Manifest {
        Manifest {
            name: "obj".into(),
            kind: ObjectKind::File,
            total_len: Some(len),
            entries: vec![],
            mode: 0o644,
            mtime: None,
        }
    }

    fn body(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("bulkcast-partial-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn open(d: &Path, m: &Manifest) -> (Store, Resumed, Events) {
        testing::open(d, m, CS)
    }

    async fn write(s: &Store, rx: &mut Events, b: &[u8], i: u64) {
        testing::write(s, rx, b, CS, i).await
    }

    #[tokio::test]
    async fn a_failed_copy_is_kept_resumed_then_found_complete() {
        let d = tmpdir("resume");
        let b = body(5 * CS as usize + 100);
        let m = manifest(b.len() as u64);
        let (s, r, mut rx) = open(&d, &m);
        assert!(r.held.is_empty() && !r.complete);
        for i in [0, 1, 3] {
            write(&s, &mut rx, &b, i).await;
        }
        drop(s); // the session failed
        let (s, r, mut rx) = open(&d, &m);
        assert_eq!(r.held.ranges(), vec![(0, 2), (3, 4)]);
        // What it held reads back as written.
        assert!(LocalCopy::load(&s, 3, 3 * CS as u64, CS as u64));
        let Some(StoreEvent::Loaded(3, Ok(got))) = rx.recv().await else {
            panic!()
        };
        assert_eq!(&got[..], &b[3 * CS as usize..4 * CS as usize]);
        for i in [2, 4, 5] {
            write(&s, &mut rx, &b, i).await;
        }
        s.finalize();
        assert!(matches!(
            rx.recv().await,
            Some(StoreEvent::Finalized(Ok(_)))
        ));
        drop(s);
        assert_eq!(fs::read(d.join("obj")).unwrap(), b);
        // Only the copy and its done record are left.
        let mut left: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec![".obj.bulkcast.done", "obj"]);
        let (_s, r, _rx) = open(&d, &m);
        assert!(r.complete);
        drop(_s);
        // Touched by anyone: a stranger again.
        fs::OpenOptions::new()
            .append(true)
            .open(d.join("obj"))
            .unwrap()
            .write_all(b"x")
            .unwrap();
        let (_s, r, _rx) = open(&d, &m);
        assert!(!r.complete && r.held.is_empty());
        drop(_s);
        // Another object (its file changed at the source) does not take the old chunks.
        let mut other = m.clone();
        other.mtime = Some(bulkcast_proto::manifest::Mtime { secs: 5, nanos: 0 });
        let (_s, r, _rx) = open(&d, &other);
        assert!(!r.complete && r.held.is_empty());
        drop(_s);
        fs::remove_dir_all(d).unwrap();
    }

    #[tokio::test]
    async fn a_copy_this_process_kept_is_taken_untouched_once_without_hashing() {
        let d = tmpdir("kept");
        let b = body(4 * CS as usize);
        let m = manifest(b.len() as u64);
        let (s, _, mut rx) = open(&d, &m);
        for i in [0, 1, 3] {
            write(&s, &mut rx, &b, i).await;
        }
        drop(s); // the session failed: the copy is kept
        let id = object_id(&m);
        let reopen = || {
            let names = Names::new(&d.join("obj"), &id);
            let part = File::open(&names.part).unwrap();
            let map = lock_map(&names).unwrap().unwrap();
            let reads = std::cell::Cell::new(0);
            let (ledger, held) = load_map(
                map,
                names,
                id,
                &m,
                CS,
                || Ok(()),
                |buf, at| {
                    reads.set(reads.get() + 1);
                    part.read_exact_at(buf, at)
                },
            )
            .unwrap();
            drop(ledger); // not kept: the next open checks again
            (held.ranges(), reads.get())
        };
        // Taken as recorded, not read back.
        assert_eq!(reopen(), (vec![(0, 2), (3, 4)], 0));
        // Once: after that every record is checked against the bytes again.
        assert_eq!(reopen(), (vec![(0, 2), (3, 4)], 3));
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn chunks_verified_at_one_size_are_recut_to_another() {
        let held = ChunkMap::from_ranges(&[(0, 2), (3, 6)], 6);
        let total = 5 * 4096 + 100;
        // Doubled: only a new chunk wholly inside verified old ones counts.
        assert_eq!(
            recut(&held, 4096, 8192, total).ranges(),
            vec![(0, 1), (2, 3)]
        );
        // Halved: every piece of a verified chunk.
        let big = ChunkMap::from_ranges(&[(1, 2)], 3);
        assert_eq!(recut(&big, 8192, 4096, total).ranges(), vec![(2, 4)]);
    }

    #[tokio::test]
    async fn torn_writes_and_torn_records_are_never_taken_as_verified() {
        let d = tmpdir("torn");
        let b = body(4 * CS as usize);
        let m = manifest(b.len() as u64);
        let (s, _, mut rx) = open(&d, &m);
        for i in 0..4 {
            write(&s, &mut rx, &b, i).await;
        }
        drop(s);
        let names = Names::new(&d.join("obj"), &object_id(&m));
        // A crash: the process that kept the copy is gone, and with it its word for the copy.
        kept().remove(&names.map);
        // Chunk 1's bytes only half reached the disk (a crash mid-write); the map's last record
        // is cut short.
        let part = OpenOptions::new().write(true).open(&names.part).unwrap();
        part.write_all_at(&vec![0u8; CS as usize / 2], CS as u64 + CS as u64 / 2)
            .unwrap();
        let len = fs::metadata(&names.map).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&names.map)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let (s, r, _rx) = open(&d, &m);
        assert_eq!(r.held.ranges(), vec![(0, 1), (2, 3)]);
        drop(s);
        // The rewritten map holds exactly the verified records.
        assert_eq!(
            fs::metadata(&names.map).unwrap().len(),
            (HEADER + 2 * RECORD) as u64
        );
        fs::remove_dir_all(d).unwrap();
    }

    #[tokio::test]
    async fn stale_copies_go_by_age_and_size_but_never_one_in_use() {
        let d = tmpdir("clean");
        let b = body(2 * CS as usize);
        let (s, _, mut rx) = open(&d, &manifest(b.len() as u64));
        write(&s, &mut rx, &b, 0).await;
        let stale = d.join(".old.bulkcast-00000000000000aa.part");
        fs::write(&stale, vec![1u8; 10_000]).unwrap();
        fs::write(stale.with_extension("map"), b"x").unwrap();
        let keep_all = Partials {
            max_age: Duration::from_secs(3600),
            max_bytes: None,
        };
        assert_eq!(keep_all.clean(&d), 0);
        let by_size = Partials {
            max_age: Duration::from_secs(3600),
            max_bytes: Some(1),
        };
        // Over the size limit: the stale one goes, the one in use stays.
        assert_eq!(by_size.clean(&d), 10_000);
        assert!(!stale.exists() && !stale.with_extension("map").exists());
        let by_age = Partials {
            max_age: Duration::ZERO,
            max_bytes: None,
        };
        assert_eq!(by_age.clean(&d), 0, "the copy in use was removed");
        drop(s);
        assert_eq!(by_age.clean(&d), CS as u64);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
        fs::remove_dir_all(d).unwrap();
    }
}
