//! What is being sent: a file, a directory tree, or a stream of unknown length.
//!
//! Every object is one byte sequence cut into equal chunks. A directory's sequence is the
//! concatenation of its regular files in manifest order; the manifest says where each file's
//! bytes start, so a chunk can be placed at its offset without waiting for the ones before it
//! (which receiver-driven strategies and repair need).
//!
//! A directory's symlinks are carried as links (their target string), only in the form
//! [`link_target`] gives: relative, normalised, and resolving inside the tree. A receiver
//! checks the whole manifest with [`Manifest::validate`] before it creates anything, so no
//! entry lies under a symlink or a file and no link points out of the tree.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What kind of object a session carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// One regular file of known length.
    File,
    /// A directory tree; `entries` lists it.
    Dir,
    /// A stream (a pipe) whose length is known only at its end.
    Stream,
}

/// A modification time: seconds and nanoseconds since the Unix epoch (before it: negative
/// seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mtime {
    /// Whole seconds since the epoch.
    pub secs: i64,
    /// Nanoseconds within the second, below 10^9.
    pub nanos: u32,
}

impl Mtime {
    /// The time as a [`SystemTime`], when it is one this system can represent.
    pub fn to_system(self) -> Option<SystemTime> {
        let nanos = Duration::from_nanos(self.nanos as u64);
        if self.secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_secs(self.secs as u64) + nanos)
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::from_secs(self.secs.unsigned_abs()))?
                .checked_add(nanos)
        }
    }

    /// A [`SystemTime`] as an `Mtime`, when it fits.
    pub fn from_system(t: SystemTime) -> Option<Mtime> {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Some(Mtime {
                secs: i64::try_from(d.as_secs()).ok()?,
                nanos: d.subsec_nanos(),
            }),
            Err(e) => {
                // Before the epoch: floor the seconds so the nanoseconds count forwards.
                let d = e.duration();
                let mut secs = -i64::try_from(d.as_secs()).ok()?;
                let mut nanos = d.subsec_nanos();
                if nanos > 0 {
                    secs = secs.checked_sub(1)?;
                    nanos = 1_000_000_000 - nanos;
                }
                Some(Mtime { secs, nanos })
            }
        }
    }
}

/// One entry of a directory manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the directory, `/`-separated, no `.`, `..` or empty components.
    pub path: String,
    /// File, directory or symlink.
    pub kind: EntryKind,
    /// Length in bytes (0 for directories and symlinks).
    pub len: u64,
    /// Unix permission bits (at most `0o7777`; ignored for symlinks).
    pub mode: u32,
    /// Modification time, when the source could read it.
    pub mtime: Option<Mtime>,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link, with its target in the form [`link_target`] gives.
    Symlink(String),
}

/// The object's description, sent in the session's `Open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The name the receiver stores it under (one path component).
    pub name: String,
    /// File, directory or stream.
    pub kind: ObjectKind,
    /// Total length, when known in advance.
    pub total_len: Option<u64>,
    /// Directory entries (empty for files and streams).
    pub entries: Vec<Entry>,
    /// Permission bits of the file, or of the directory itself (at most `0o7777`; 0 for a
    /// stream, whose copy keeps the receiver's default).
    pub mode: u32,
    /// Modification time of the file or of the directory itself, when known.
    pub mtime: Option<Mtime>,
}

/// Why a manifest is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    /// The name is empty, contains a separator, or is `.`/`..`.
    #[error("object name {0:?} is not a single plain path component")]
    BadName(String),
    /// An entry's path could escape the target directory or is malformed.
    #[error("entry path {0:?} is not a plain relative path")]
    BadPath(String),
    /// Two entries with one path, or an entry under a file or a symlink (where writing it
    /// would follow the link).
    #[error("entry path {0:?} is listed twice or lies under a file or a symlink")]
    Clash(String),
    /// A symlink whose target is absolute, not normalised, or leaves the tree.
    #[error("symlink {path:?} -> {target:?} is refused: {why}")]
    BadLink {
        /// The link's path.
        path: String,
        /// Its target.
        target: String,
        /// What is wrong with the target.
        why: &'static str,
    },
    /// The entries' lengths do not add up to the total.
    #[error("directory entries add up to {sum} bytes but the manifest says {total}")]
    LengthMismatch {
        /// Sum of file lengths.
        sum: u64,
        /// Announced total.
        total: u64,
    },
    /// A file or directory manifest without a length, or a stream with entries.
    #[error("{0}")]
    Inconsistent(&'static str),
}

/// Permission bits a manifest may carry (with setuid, setgid and sticky).
pub const MODE_BITS: u32 = 0o7777;

impl Manifest {
    /// Checks everything a receiver relies on before it creates a single file.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if !plain_component(&self.name) {
            return Err(ManifestError::BadName(self.name.clone()));
        }
        if self.mode & !MODE_BITS != 0 {
            return Err(ManifestError::Inconsistent("mode has bits beyond 0o7777"));
        }
        match self.kind {
            ObjectKind::Stream if !self.entries.is_empty() => {
                Err(ManifestError::Inconsistent("a stream has no entries"))
            }
            ObjectKind::File if !self.entries.is_empty() => {
                Err(ManifestError::Inconsistent("a file has no entries"))
            }
            ObjectKind::File if self.total_len.is_none() => {
                Err(ManifestError::Inconsistent("a file's length must be known"))
            }
            ObjectKind::Dir => self.validate_tree(),
            _ => Ok(()),
        }
    }

    fn validate_tree(&self) -> Result<(), ManifestError> {
        let total = self.total_len.ok_or(ManifestError::Inconsistent(
            "a directory's length must be known",
        ))?;
        let mut sum = 0u64;
        for e in &self.entries {
            if e.path.is_empty() || !e.path.split('/').all(plain_component) {
                return Err(ManifestError::BadPath(e.path.clone()));
            }
            if e.mode & !MODE_BITS != 0 {
                return Err(ManifestError::Inconsistent("mode has bits beyond 0o7777"));
            }
            match &e.kind {
                EntryKind::File => sum = sum.saturating_add(e.len),
                _ if e.len != 0 => {
                    return Err(ManifestError::Inconsistent(
                        "a directory or symlink entry has a length",
                    ))
                }
                EntryKind::Dir => {}
                EntryKind::Symlink(t) => check_link(&e.path, t)?,
            }
        }
        if sum != total {
            return Err(ManifestError::LengthMismatch { sum, total });
        }
        self.check_no_clash()
    }

    /// No two entries share a path and none lies under a file or a symlink: sorted by
    /// components, an entry's descendants come right after it, so comparing neighbours finds
    /// the first offender in `O(n log n)` whatever the paths' depth.
    fn check_no_clash(&self) -> Result<(), ManifestError> {
        let mut order: Vec<&Entry> = self.entries.iter().collect();
        order.sort_by(|a, b| a.path.split('/').cmp(b.path.split('/')));
        for w in order.windows(2) {
            let (prev, cur) = (w[0], w[1]);
            let under = prev.kind != EntryKind::Dir
                && cur.path.len() > prev.path.len()
                && cur.path.starts_with(prev.path.as_str())
                && cur.path.as_bytes()[prev.path.len()] == b'/';
            if prev.path == cur.path || under {
                return Err(ManifestError::Clash(cur.path.clone()));
            }
        }
        Ok(())
    }

    /// Clears setuid, setgid and sticky from every mode (what a send does unless asked to
    /// keep them).
    pub fn drop_special_modes(&mut self) {
        self.mode &= 0o777;
        for e in &mut self.entries {
            e.mode &= 0o777;
        }
    }

    /// Number of chunks, when the length is known.
    pub fn chunks(&self, chunk_size: u32) -> Option<u64> {
        self.total_len.map(|n| chunk_count(n, chunk_size))
    }

    /// Where the object's bytes `[offset, offset + len)` live: `(entry index, offset in that
    /// file, offset in the range, length)` for each regular file the range touches.
    pub fn locate(&self, offset: u64, len: u64) -> Vec<(usize, u64, u64, u64)> {
        let mut out = Vec::new();
        let end = offset + len;
        let mut start_of_entry = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            if e.kind != EntryKind::File {
                continue;
            }
            let entry_end = start_of_entry + e.len;
            let lo = offset.max(start_of_entry);
            let hi = end.min(entry_end);
            if lo < hi {
                out.push((i, lo - start_of_entry, lo - offset, hi - lo));
            }
            if entry_end >= end {
                break;
            }
            start_of_entry = entry_end;
        }
        out
    }
}

/// Number of chunks of `chunk_size` that hold `len` bytes (an empty object has none).
pub fn chunk_count(len: u64, chunk_size: u32) -> u64 {
    len.div_ceil(chunk_size as u64)
}

/// The form in which a symlink at `path` (in a tree) pointing at `target` is carried, or why
/// it is not carried.
///
/// Carried: a relative target whose `..` components all come first and climb at most to the
/// tree's root from the link's directory, followed by plain names; `.` and empty components
/// are dropped (a target naming the link's own directory becomes `.`). A `..` after a name is
/// refused: were that name itself a link, the `..` would climb from wherever it points, which
/// no lexical check can tell (`x -> .` makes `x/..` the tree's parent). With every `..` first,
/// each step of resolving a carried link stays in the tree.
pub fn link_target(path: &str, target: &str) -> Result<String, &'static str> {
    if target.is_empty() {
        return Err("the target is empty");
    }
    if target.starts_with('/') {
        return Err("the target is absolute");
    }
    let depth = path.split('/').count().saturating_sub(1);
    let mut ups = 0;
    let mut names = Vec::new();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." if names.is_empty() => ups += 1,
            ".." => return Err("a `..` after a name could climb out through another link"),
            c if plain_component(c) => names.push(c),
            _ => return Err("a component holds a backslash or NUL"),
        }
    }
    if ups > depth {
        return Err("the target leaves the tree");
    }
    let mut parts = vec![".."; ups];
    parts.extend(names);
    Ok(if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    })
}

/// A received link must already be in the form [`link_target`] gives.
fn check_link(path: &str, target: &str) -> Result<(), ManifestError> {
    let bad = |why| ManifestError::BadLink {
        path: path.to_string(),
        target: target.to_string(),
        why,
    };
    match link_target(path, target) {
        Ok(t) if t == target => Ok(()),
        Ok(_) => Err(bad("the target is not in normal form")),
        Err(why) => Err(bad(why)),
    }
}

/// A name a receiver can store as one path component (what a tree's names must be).
pub fn plain_component(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && !s.contains('/')
        && !s.contains('\\')
        && !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind, len: u64) -> Entry {
        Entry {
            path: path.into(),
            kind,
            len,
            mode: 0o644,
            mtime: None,
        }
    }

    fn file(path: &str, len: u64) -> Entry {
        entry(path, EntryKind::File, len)
    }

    fn link(path: &str, target: &str) -> Entry {
        entry(path, EntryKind::Symlink(target.into()), 0)
    }

    fn dir(entries: Vec<Entry>) -> Manifest {
        let total = entries.iter().map(|e| e.len).sum();
        Manifest {
            name: "d".into(),
            kind: ObjectKind::Dir,
            total_len: Some(total),
            entries,
            mode: 0o755,
            mtime: None,
        }
    }

    #[test]
    fn rejects_escaping_paths_and_names() {
        for bad in ["../x", "a/../../x", "/etc/passwd", "a//b", "", "a/./b"] {
            assert!(
                dir(vec![file(bad, 1)]).validate().is_err(),
                "{bad:?} accepted"
            );
        }
        let mut m = dir(vec![file("ok/fine.txt", 1)]);
        assert!(m.validate().is_ok());
        m.name = "..".into();
        assert_eq!(m.validate(), Err(ManifestError::BadName("..".into())));
        let mut m = dir(vec![file("a", 3)]);
        m.total_len = Some(4);
        assert!(matches!(
            m.validate(),
            Err(ManifestError::LengthMismatch { .. })
        ));
    }

    #[test]
    fn empty_files_and_directories_are_valid() {
        let m = dir(vec![
            entry("e", EntryKind::Dir, 0),
            entry("e/deeper", EntryKind::Dir, 0),
            file("zero", 0),
        ]);
        assert_eq!(m.validate(), Ok(()));
        assert_eq!(m.chunks(4096), Some(0));
        assert!(m.locate(0, 0).is_empty());
        assert_eq!(dir(vec![]).validate(), Ok(()));
    }

    #[test]
    fn links_are_carried_relative_normalised_and_inside_the_tree() {
        let ok = [
            ("l", "x", "x"),
            ("l", "./x//y/", "x/y"),
            ("l", ".", "."),
            ("a/l", "..", ".."),
            ("a/b/l", "../../blobs/f", "../../blobs/f"),
            ("a/l", "./../c", "../c"),
        ];
        for (path, target, carried) in ok {
            assert_eq!(
                link_target(path, target).as_deref(),
                Ok(carried),
                "{target}"
            );
        }
        for (path, target) in [
            ("l", "/etc/passwd"),
            ("l", ".."),
            ("a/l", "../../x"),
            ("l", "x/.."),
            ("a/l", "x/../../y"),
            ("l", ""),
            ("l", "a\\b"),
        ] {
            assert!(link_target(path, target).is_err(), "{path} -> {target}");
        }
    }

    #[test]
    fn hostile_links_and_clashes_are_refused() {
        let bad_link = |path: &str, target: &str| {
            let r = dir(vec![link(path, target)]).validate();
            assert!(
                matches!(r, Err(ManifestError::BadLink { .. })),
                "{path} -> {target}: {r:?}"
            );
        };
        bad_link("l", "/etc");
        bad_link("l", "../..");
        bad_link("a/l", "../../x");
        bad_link("l", "x/./y"); // in-tree, but not in the form a source sends
        bad_link("l", "u/../..");
        // Writing a/x would follow the link a (to wherever it points).
        let clash = |entries: Vec<Entry>, at: &str| {
            assert_eq!(
                dir(entries).validate(),
                Err(ManifestError::Clash(at.into()))
            );
        };
        clash(vec![link("a", "b"), file("a/x", 1)], "a/x");
        clash(vec![file("a/x", 1), link("a", "b")], "a/x");
        // Siblings that sort between a link and its "descendants" byte-wise.
        clash(
            vec![
                link("a", "b"),
                file("a-b", 1),
                file("a.c", 1),
                file("a/x/y", 1),
            ],
            "a/x/y",
        );
        clash(vec![file("f", 1), file("f/g", 1)], "f/g");
        clash(vec![file("f", 1), link("f", "g")], "f");
        clash(
            vec![entry("d", EntryKind::Dir, 0), entry("d", EntryKind::Dir, 0)],
            "d",
        );
        assert_eq!(
            dir(vec![
                entry("d", EntryKind::Dir, 0),
                link("d/l", ".."),
                file("d/f", 1)
            ])
            .validate(),
            Ok(())
        );
    }

    #[test]
    fn modes_and_lengths_are_checked() {
        let mut m = dir(vec![file("f", 1)]);
        m.entries[0].mode = 0o10644;
        assert!(m.validate().is_err());
        let mut m = dir(vec![entry("d", EntryKind::Dir, 0)]);
        m.entries[0].len = 5;
        m.total_len = Some(5);
        assert!(matches!(m.validate(), Err(ManifestError::Inconsistent(_))));
        let mut m = dir(vec![file("f", 1)]);
        m.mode = 0o4755;
        m.entries[0].mode = 0o6751;
        m.drop_special_modes();
        assert_eq!((m.mode, m.entries[0].mode), (0o755, 0o751));
    }

    #[test]
    fn mtimes_convert_both_ways_around_the_epoch() {
        for (secs, nanos) in [
            (0, 0),
            (1_700_000_000, 123_456_789),
            (-1, 999_999_999),
            (-86_400, 5),
        ] {
            let m = Mtime { secs, nanos };
            assert_eq!(Mtime::from_system(m.to_system().unwrap()), Some(m));
        }
        assert_eq!(
            Mtime::from_system(UNIX_EPOCH - Duration::from_millis(1500)),
            Some(Mtime {
                secs: -2,
                nanos: 500_000_000
            })
        );
    }

    #[test]
    fn locate_splits_ranges_over_files() {
        let m = dir(vec![
            file("a", 5),
            entry("sub", EntryKind::Dir, 0),
            file("sub/empty", 0),
            link("sub/l", "b"),
            file("sub/b", 10),
            file("c", 3),
        ]);
        // bytes 3..16 = a[3..5], b[0..10], c[0..1]
        assert_eq!(
            m.locate(3, 13),
            vec![(0, 3, 0, 2), (4, 0, 2, 10), (5, 0, 12, 1)]
        );
        assert_eq!(m.locate(15, 3), vec![(5, 0, 0, 3)]);
        assert_eq!(chunk_count(0, 4), 0);
        assert_eq!(chunk_count(9, 4), 3);
    }
}
