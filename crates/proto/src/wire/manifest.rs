//! The encoding of a [`Manifest`] (in `Open`, `SwarmOpen` and a stripe's whole object), and
//! an object's identity, which hashes it.

use bytes::{BufMut, BytesMut};

use super::codec::{put_str, Reader};
use super::WireError;
use crate::manifest::{Entry, EntryKind, Manifest, Mtime, ObjectKind};

/// An object's identity, for resuming: BLAKE3 over its encoded manifest (name, kind, length,
/// mode, modification time, every entry). Two sends of a file that was not changed in between
/// (same length and modification time, to the nanosecond) share it, so a receiver keeps the
/// verified chunks of one for the other (see `bulkcast_runtime::store`), whatever their chunk sizes.
pub fn object_id(m: &Manifest) -> [u8; 32] {
    let mut b = BytesMut::new();
    b.put_slice(b"bulkcast object v1");
    put_manifest(&mut b, m);
    *blake3::hash(&b).as_bytes()
}

/// ```text
/// manifest = name | kind:u8 (0 file, 1 dir, 2 stream) | has_len:u8 | [len:u64] | mode:u32
///            | mtime | count:u32 | entry*
/// entry    = path | kind:u8 (0 file, 1 dir, 2 symlink) | len:u64 | mode:u32 | mtime
///            | [target, symlinks only]
/// mtime    = 0:u8 | 1:u8 secs:i64 nanos:u32
/// ```
pub(super) fn put_manifest(b: &mut BytesMut, m: &Manifest) {
    put_str(b, &m.name);
    b.put_u8(match m.kind {
        ObjectKind::File => 0,
        ObjectKind::Dir => 1,
        ObjectKind::Stream => 2,
    });
    match m.total_len {
        Some(n) => {
            b.put_u8(1);
            b.put_u64(n);
        }
        None => b.put_u8(0),
    }
    b.put_u32(m.mode);
    put_mtime(b, m.mtime);
    b.put_u32(m.entries.len() as u32);
    for e in &m.entries {
        put_str(b, &e.path);
        b.put_u8(match e.kind {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
            EntryKind::Symlink(_) => 2,
        });
        b.put_u64(e.len);
        b.put_u32(e.mode);
        put_mtime(b, e.mtime);
        if let EntryKind::Symlink(t) = &e.kind {
            put_str(b, t);
        }
    }
}

fn put_mtime(b: &mut BytesMut, t: Option<Mtime>) {
    match t {
        Some(t) => {
            b.put_u8(1);
            b.put_i64(t.secs);
            b.put_u32(t.nanos);
        }
        None => b.put_u8(0),
    }
}

impl Reader {
    pub(super) fn manifest(&mut self) -> Result<Manifest, WireError> {
        let name = self.string()?;
        let kind = match self.u8()? {
            0 => ObjectKind::File,
            1 => ObjectKind::Dir,
            2 => ObjectKind::Stream,
            _ => return Err(WireError::BadValue("Open", "unknown object kind")),
        };
        let total_len = match self.u8()? {
            0 => None,
            1 => Some(self.u64()?),
            _ => return Err(WireError::BadValue("Open", "bad length flag")),
        };
        let mode = self.u32()?;
        let mtime = self.mtime()?;
        let n = self.count(4 + 1 + 8 + 4 + 1)?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let path = self.string()?;
            let kind = self.u8()?;
            let len = self.u64()?;
            let mode = self.u32()?;
            let mtime = self.mtime()?;
            let kind = match kind {
                0 => EntryKind::File,
                1 => EntryKind::Dir,
                2 => EntryKind::Symlink(self.string()?),
                _ => return Err(WireError::BadValue("Open", "unknown entry kind")),
            };
            entries.push(Entry {
                path,
                kind,
                len,
                mode,
                mtime,
            });
        }
        Ok(Manifest {
            name,
            kind,
            total_len,
            entries,
            mode,
            mtime,
        })
    }

    pub(super) fn mtime(&mut self) -> Result<Option<Mtime>, WireError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let secs = self.u64()? as i64;
                let nanos = self.u32()?;
                if nanos >= 1_000_000_000 {
                    return Err(WireError::BadValue(
                        "Open",
                        "mtime nanoseconds past a second",
                    ));
                }
                Ok(Some(Mtime { secs, nanos }))
            }
            _ => Err(WireError::BadValue("Open", "bad mtime flag")),
        }
    }
}
