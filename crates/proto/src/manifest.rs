//! What is being sent: a file, a directory tree, or a stream of unknown length.
//!
//! Every object is one byte sequence cut into equal chunks. A directory's sequence is the
//! concatenation of its regular files in manifest order; the manifest says where each file's
//! bytes start, so a chunk can be placed at its offset without waiting for the ones before it
//! (which receiver-driven strategies and repair need).

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

/// One entry of a directory manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path relative to the directory, `/`-separated, no `.`, `..` or empty components.
    pub path: String,
    /// File or directory.
    pub kind: EntryKind,
    /// Length in bytes (0 for directories).
    pub len: u64,
    /// Unix permission bits.
    pub mode: u32,
}

/// Kind of a directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
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

impl Manifest {
    /// Checks everything a receiver relies on before it creates a single file.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if !plain_component(&self.name) {
            return Err(ManifestError::BadName(self.name.clone()));
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
            ObjectKind::Dir => {
                let total = self.total_len.ok_or(ManifestError::Inconsistent(
                    "a directory's length must be known",
                ))?;
                let mut sum = 0u64;
                for e in &self.entries {
                    if e.path.is_empty() || !e.path.split('/').all(plain_component) {
                        return Err(ManifestError::BadPath(e.path.clone()));
                    }
                    sum = sum.saturating_add(e.len);
                }
                if sum != total {
                    return Err(ManifestError::LengthMismatch { sum, total });
                }
                Ok(())
            }
            _ => Ok(()),
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

fn plain_component(s: &str) -> bool {
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

    fn file(path: &str, len: u64) -> Entry {
        Entry {
            path: path.into(),
            kind: EntryKind::File,
            len,
            mode: 0o644,
        }
    }

    fn dir(entries: Vec<Entry>) -> Manifest {
        let total = entries.iter().map(|e| e.len).sum();
        Manifest {
            name: "d".into(),
            kind: ObjectKind::Dir,
            total_len: Some(total),
            entries,
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
    fn locate_splits_ranges_over_files() {
        let m = dir(vec![
            file("a", 5),
            Entry {
                path: "sub".into(),
                kind: EntryKind::Dir,
                len: 0,
                mode: 0o755,
            },
            file("sub/empty", 0),
            file("sub/b", 10),
            file("c", 3),
        ]);
        // bytes 3..16 = a[3..5], b[0..10], c[0..1]
        assert_eq!(
            m.locate(3, 13),
            vec![(0, 3, 0, 2), (3, 0, 2, 10), (4, 0, 12, 1)]
        );
        assert_eq!(m.locate(15, 3), vec![(4, 0, 0, 3)]);
        assert_eq!(chunk_count(0, 4), 0);
        assert_eq!(chunk_count(9, 4), 3);
    }
}
