//! A one-file copy written by its receiver itself rather than through the store's thread:
//! the multicast receiver, whose blocks arrive on a thread of its own. It is the same copy
//! the store keeps for a tree session (same names, map and done record, keyed by the
//! object), so what either strategy verified, the other resumes.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bulkcast_proto::chunkmap::ChunkMap;
use bulkcast_proto::manifest::{Manifest, ObjectKind};

use super::partial::{self, Ledger, Partials};
use super::{ctx, describe, set_meta, StoreError, Writeback};

/// What a receiver holds of a one-file object when it opens its copy.
pub enum Holding {
    /// An identical copy is in place: nothing to move.
    Complete,
    /// The copy to write, with the chunks an earlier session verified (maybe none).
    Partial(Box<ResumableFile>),
    /// Another session is writing this object here now.
    Busy,
}

/// A partial one-file copy and its map, locked for the session that writes it.
pub struct ResumableFile {
    file: File,
    ledger: Ledger,
    held: ChunkMap,
    chunk_size: u64,
    dest: PathBuf,
    manifest: Manifest,
    /// Started as the copy is written, so that `finish` syncs only the last stretch.
    writeback: Writeback,
}

impl ResumableFile {
    /// Opens the copy of the file `m` in `dir`, cut in chunks of `chunk_size` bytes, after
    /// cleaning stale partial copies there by `partials`. Blocks while it verifies what an
    /// earlier session left (it reads it).
    pub fn open(
        dir: &Path,
        m: &Manifest,
        chunk_size: u32,
        partials: Partials,
    ) -> io::Result<Holding> {
        if m.kind != ObjectKind::File || chunk_size == 0 {
            return Err(io::Error::other("a resumable file copy is of one file"));
        }
        fs::create_dir_all(dir).map_err(|e| ctx(e, "creating", dir))?;
        partials.clean(dir);
        let dest = dir.join(&m.name);
        let (file, ledger, held) = match partial::open(&dest, m, chunk_size)? {
            partial::Opened::Complete(_) => return Ok(Holding::Complete),
            partial::Opened::Busy => return Ok(Holding::Busy),
            partial::Opened::Partial { file, ledger, held } => (file, ledger, held),
        };
        Ok(Holding::Partial(Box::new(ResumableFile {
            file,
            ledger,
            held,
            chunk_size: u64::from(chunk_size),
            dest,
            manifest: m.clone(),
            writeback: Writeback::default(),
        })))
    }

    /// Verified bytes held.
    pub fn held_bytes(&self) -> u64 {
        let total = self.manifest.total_len.unwrap_or(0);
        let cs = self.chunk_size;
        self.held
            .ranges()
            .into_iter()
            .map(|(s, e)| (e * cs).min(total).saturating_sub(s * cs))
            .sum()
    }

    /// Writes the verified chunk at `offset` (a multiple of the chunk size) and records it
    /// with its `hash` (BLAKE3, which the caller verified).
    pub fn write(&mut self, offset: u64, data: &[u8], hash: &[u8; 32]) -> Result<(), StoreError> {
        let part = &self.ledger.names.part;
        self.file
            .write_all_at(data, offset)
            .map_err(|e| describe(e, "writing", part))?;
        self.writeback.wrote(&self.file, data.len() as u64);
        self.ledger
            .record(offset, hash)
            .map_err(|e| describe(e, "recording", &self.ledger.names.map))
    }

    /// The copy is whole: synced, given its mode and time, moved into place, remembered as
    /// identical. A copy that cannot be moved stays for the next session.
    pub fn finish(self) -> Result<PathBuf, StoreError> {
        let part = self.ledger.names.part.clone();
        self.file
            .sync_data()
            .map_err(|e| describe(e, "syncing", &part))?;
        set_meta(&self.file, self.manifest.mode, self.manifest.mtime);
        drop(self.file);
        fs::rename(&part, &self.dest).map_err(|e| describe(e, "moving into place", &self.dest))?;
        self.ledger.finish(&self.dest);
        Ok(self.dest)
    }

    /// The session failed: the copy and its map stay for the next one.
    pub fn keep(self) {
        drop(self.file);
        self.ledger.keep();
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing;
    use super::*;

    fn file_manifest(len: u64) -> Manifest {
        Manifest {
            name: "f.bin".into(),
            kind: ObjectKind::File,
            total_len: Some(len),
            entries: Vec::new(),
            mode: 0o640,
            mtime: Some(bulkcast_proto::manifest::Mtime {
                secs: 1_700_000_000,
                nanos: 0,
            }),
        }
    }

    fn partial(h: Holding) -> ResumableFile {
        match h {
            Holding::Partial(c) => *c,
            Holding::Complete => panic!("complete"),
            Holding::Busy => panic!("busy"),
        }
    }

    /// Chunks of 5 written here, kept, and found again by a session that cuts the object in
    /// chunks of 3 (as a tree would after a multicast of blocks); whole, it is in place with
    /// its mode and time, and the next open finds it complete.
    #[tokio::test]
    async fn kept_chunks_are_resumed_by_either_kind_of_session_and_a_whole_copy_is_complete() {
        let d = std::env::temp_dir().join(format!("bulkcast-resumable-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let body = b"0123456789abcdefghij-";
        let m = file_manifest(body.len() as u64);
        let mut c = partial(ResumableFile::open(&d, &m, 5, Partials::default()).unwrap());
        assert_eq!(c.held_bytes(), 0);
        assert!(matches!(
            ResumableFile::open(&d, &m, 5, Partials::default()).unwrap(),
            Holding::Busy
        ));
        for at in [0, 5, 15] {
            let piece = &body[at as usize..at as usize + 5];
            c.write(at, piece, blake3::hash(piece).as_bytes()).unwrap();
        }
        c.keep();
        // A tree session of the same object resumes it: bytes 0..10 and 15..20 hold chunks
        // 0-2 and 5 of 3 bytes (9..12 and 18..21 are not wholly inside).
        let (store, resumed, _rx) = testing::open(&d, &m, 3);
        assert_eq!(resumed.held.ranges(), vec![(0, 3), (5, 6)]);
        drop(store);
        let mut c = partial(ResumableFile::open(&d, &m, 5, Partials::default()).unwrap());
        // Cut back to 5 bytes: of 0..9 and 15..18, chunk 0 is whole.
        assert_eq!(c.held_bytes(), 5);
        for at in (5..body.len()).step_by(5) {
            let piece = &body[at..(at + 5).min(body.len())];
            c.write(at as u64, piece, blake3::hash(piece).as_bytes())
                .unwrap();
        }
        let dest = c.finish().unwrap();
        assert_eq!(fs::read(&dest).unwrap(), body);
        let md = fs::metadata(&dest).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(md.permissions().mode() & 0o777, 0o640);
        assert_eq!(
            md.modified().unwrap(),
            m.mtime.unwrap().to_system().unwrap()
        );
        assert!(matches!(
            ResumableFile::open(&d, &m, 5, Partials::default()).unwrap(),
            Holding::Complete
        ));
        let _ = fs::remove_dir_all(&d);
    }
}
