//! The store's tests: copies, resumes, failures.

use super::*;
use bulkcast_proto::manifest::{Entry, EntryKind};

fn manifest_dir() -> Manifest {
    Manifest {
        name: "tree".into(),
        kind: ObjectKind::Dir,
        total_len: Some(7),
        entries: vec![
            Entry {
                path: "a".into(),
                kind: EntryKind::Dir,
                len: 0,
                mode: 0o755,
                mtime: None,
            },
            Entry {
                path: "a/x".into(),
                kind: EntryKind::File,
                len: 3,
                mode: 0o600,
                mtime: None,
            },
            Entry {
                path: "y".into(),
                kind: EntryKind::File,
                len: 4,
                mode: 0o644,
                mtime: None,
            },
        ],
        mode: 0o755,
        mtime: None,
    }
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("bulkcast-store-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn tree_is_written_across_files_and_moved_into_place() {
    let d = tmpdir("tree");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let s = Store::open(
        Target::Dir(d.clone()),
        &manifest_dir(),
        1,
        CopyIo::Buffered,
        tx,
        None,
    )
    .unwrap();
    s.write_hashed(0, 0, Bytes::from_static(b"abcdefg"));
    s.finalize();
    assert!(matches!(rx.recv().await, Some(StoreEvent::Stored(0))));
    let Some(StoreEvent::Finalized(Ok(p))) = rx.recv().await else {
        panic!()
    };
    assert_eq!(p, d.join("tree"));
    assert_eq!(fs::read(d.join("tree/a/x")).unwrap(), b"abc");
    assert_eq!(fs::read(d.join("tree/y")).unwrap(), b"defg");
    assert_eq!(
        fs::read_dir(&d).unwrap().count(),
        1,
        "temporary copy left behind"
    );
    fs::remove_dir_all(d).unwrap();
}

fn at(secs: i64) -> Option<Mtime> {
    Some(Mtime { secs, nanos: 250 })
}

fn entry(path: &str, kind: EntryKind, len: u64, mode: u32, mtime: i64) -> Entry {
    Entry {
        path: path.into(),
        kind,
        len,
        mode,
        mtime: at(mtime),
    }
}

async fn store_tree(d: &Path, m: &Manifest, data: &'static [u8]) -> PathBuf {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let s = Store::open(Target::Dir(d.into()), m, 5, CopyIo::Buffered, tx, None).unwrap();
    if !data.is_empty() {
        s.write_hashed(0, 0, Bytes::from_static(data));
        assert!(matches!(rx.recv().await, Some(StoreEvent::Stored(0))));
    }
    s.finalize();
    let Some(StoreEvent::Finalized(Ok(p))) = rx.recv().await else {
        panic!()
    };
    p
}

fn mtime_of(p: &Path) -> Option<Mtime> {
    Mtime::from_system(fs::symlink_metadata(p).unwrap().modified().unwrap())
}

#[tokio::test]
async fn a_tree_keeps_links_empty_entries_modes_and_times() {
    let d = tmpdir("meta");
    let m = Manifest {
        name: "t".into(),
        kind: ObjectKind::Dir,
        total_len: Some(3),
        entries: vec![
            entry("a", EntryKind::Dir, 0, 0o750, 1_000),
            entry("a/x", EntryKind::File, 3, 0o4750, 2_000),
            entry("a/l", EntryKind::Symlink("x".into()), 0, 0o777, 3_000),
            entry("e", EntryKind::Dir, 0, 0o700, 4_000),
            entry("e/f", EntryKind::Dir, 0, 0o755, 5_000),
            entry("z", EntryKind::File, 0, 0o600, 6_000),
        ],
        mode: 0o705,
        mtime: at(7_000),
    };
    let p = store_tree(&d, &m, b"abc").await;
    assert_eq!(fs::read_link(p.join("a/l")).unwrap(), Path::new("x"));
    assert_eq!(fs::read(p.join("a/l")).unwrap(), b"abc");
    assert!(p.join("e/f").is_dir());
    assert_eq!(fs::read(p.join("z")).unwrap(), b"");
    for (path, mode, t) in [
        ("a", 0o750, 1_000),
        ("a/x", 0o4750, 2_000),
        ("a/l", 0, 3_000),
        ("e", 0o700, 4_000),
        ("e/f", 0o755, 5_000),
        ("z", 0o600, 6_000),
        ("", 0o705, 7_000),
    ] {
        let meta = fs::symlink_metadata(p.join(path)).unwrap();
        if mode != 0 {
            assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path}");
        }
        assert_eq!(mtime_of(&p.join(path)), at(t), "{path}");
    }
    fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn a_tree_refuses_paths_through_links_and_creates_nothing() {
    let d = tmpdir("through");
    let outside = tmpdir("through-outside");
    let target = format!("../../{}", outside.file_name().unwrap().to_str().unwrap());
    for entries in [
        // A link the next entry would be written through.
        vec![
            entry("a", EntryKind::Symlink(".".into()), 0, 0o777, 1),
            entry("a/x", EntryKind::File, 1, 0o644, 1),
        ],
        // A link out of the tree.
        vec![entry("l", EntryKind::Symlink(target.clone()), 0, 0o777, 1)],
        vec![entry("l", EntryKind::Symlink("/etc".into()), 0, 0o777, 1)],
    ] {
        let total = entries.iter().map(|e| e.len).sum();
        let m = Manifest {
            name: "t".into(),
            kind: ObjectKind::Dir,
            total_len: Some(total),
            entries,
            mode: 0o755,
            mtime: None,
        };
        let (tx, _rx) = mpsc::unbounded_channel();
        let r = Store::open(Target::Dir(d.clone()), &m, 6, CopyIo::Buffered, tx, None);
        assert!(r.is_err(), "{m:?}");
        assert_eq!(leftovers(&d), 0);
    }
    assert_eq!(leftovers(&outside), 0);
    fs::remove_dir_all(d).unwrap();
    fs::remove_dir_all(outside).unwrap();
}

fn leftovers(d: &Path) -> usize {
    fs::read_dir(d).unwrap().count()
}

#[tokio::test]
async fn a_file_keeps_its_mode_and_time() {
    let d = tmpdir("filemeta");
    let m = Manifest {
        name: "f".into(),
        kind: ObjectKind::File,
        total_len: Some(3),
        entries: vec![],
        mode: 0o751,
        mtime: at(123_456),
    };
    let p = store_tree(&d, &m, b"xyz").await;
    let meta = fs::metadata(&p).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o751);
    assert_eq!(mtime_of(&p), at(123_456));
    fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn a_direct_copy_reads_back_and_lands_whole() {
    let d = tmpdir("direct");
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Four pieces of 64 KiB and an unaligned last one.
    let piece = 64 << 10;
    let body: Vec<u8> = (0..4 * piece + 777).map(|i| (i * 31 % 251) as u8).collect();
    let m = Manifest {
        name: "f".into(),
        kind: ObjectKind::File,
        total_len: Some(body.len() as u64),
        entries: vec![],
        mode: 0o640,
        mtime: None,
    };
    let s = Store::open(Target::Dir(d.clone()), &m, 3, CopyIo::Direct, tx, None).unwrap();
    let disk = s.reader().expect("a one-file copy has a file");
    for i in [4u64, 1, 0, 3, 2] {
        let at = i as usize * piece;
        let end = (at + piece).min(body.len());
        s.write_hashed(i, at as u64, Bytes::copy_from_slice(&body[at..end]));
        assert!(matches!(rx.recv().await, Some(StoreEvent::Stored(j)) if j == i));
    }
    let read = |at: usize, len: usize| match &disk {
        Disk::Direct(r) => r.read_at(at as u64, len).unwrap(),
        // A temporary directory on a file system without O_DIRECT (tmpfs).
        Disk::Cached(f) => {
            let mut v = vec![0; len];
            f.read_exact_at(&mut v, at as u64).unwrap();
            Bytes::from(v)
        }
    };
    assert_eq!(&read(piece, piece)[..], &body[piece..2 * piece]);
    assert_eq!(&read(4 * piece, 777)[..], &body[4 * piece..]);
    s.finalize();
    let Some(StoreEvent::Finalized(Ok(p))) = rx.recv().await else {
        panic!()
    };
    assert_eq!(fs::read(&p).unwrap(), body);
    assert_eq!(fs::read_dir(&d).unwrap().count(), 1, "temporary copy left");
    fs::remove_dir_all(d).unwrap();
}

#[tokio::test]
async fn an_unfinished_copy_leaves_nothing_behind() {
    let d = tmpdir("drop");
    let (tx, _rx) = mpsc::unbounded_channel();
    let m = Manifest {
        name: "f".into(),
        kind: ObjectKind::File,
        total_len: Some(3),
        entries: vec![],
        mode: 0o640,
        mtime: None,
    };
    let s = Store::open(Target::Dir(d.clone()), &m, 2, CopyIo::Direct, tx, None).unwrap();
    s.write_hashed(0, 0, Bytes::from_static(b"ab"));
    drop(s);
    assert_eq!(fs::read_dir(&d).unwrap().count(), 0);
    fs::remove_dir_all(d).unwrap();
}
