//! The product queue on disk: `DIR/queue/<seq>.dat` (the bytes) and `<seq>.meta` (the
//! metadata, written after the bytes are in place), `DIR/next_seq`, a relay's `DIR/floor`, and
//! `DIR/tmp/` for products being inserted. A crash leaves at worst a data file without
//! metadata, which the next start removes: a product is in the queue whole or not at all.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::product::{Micros, ProductMeta};
use bulkcast_proto::feed::queue::{ProductQueue, QueueLimits};
use bytes::BytesMut;

/// A relay's queue floor, in the queue's directory.
const FLOOR: &str = "floor";

/// A number saved in a file of its own; `None` when missing or unreadable.
fn read_number(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Where a queue lives.
#[derive(Debug, Clone)]
pub struct QueueDir {
    root: PathBuf,
}

impl QueueDir {
    /// Opens (creating) the directory.
    pub fn open(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root.join("queue"))?;
        fs::create_dir_all(root.join("tmp"))?;
        // Leftovers of inserts cut short by a crash.
        for e in fs::read_dir(root.join("tmp"))? {
            let _ = fs::remove_file(e?.path());
        }
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A product's data file.
    pub fn data(&self, seq: u64) -> PathBuf {
        self.root.join("queue").join(format!("{seq:020}.dat"))
    }

    fn meta(&self, seq: u64) -> PathBuf {
        self.root.join("queue").join(format!("{seq:020}.meta"))
    }

    /// A fresh temporary path for an insert.
    pub fn tmp(&self) -> PathBuf {
        self.root
            .join("tmp")
            .join(format!("{:016x}", rand::random::<u64>()))
    }

    /// Reads the queue back: every product whose data and metadata are both whole.
    pub fn restore(&self, limits: QueueLimits) -> io::Result<ProductQueue> {
        let next = read_number(&self.root.join("next_seq")).unwrap_or(1);
        let mut q = ProductQueue::new(limits, next);
        let mut seen = Vec::new();
        for e in fs::read_dir(self.root.join("queue"))? {
            let p = e?.path();
            let Some(stem) = p.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let Ok(seq) = stem.parse::<u64>() else {
                continue;
            };
            if p.extension().is_some_and(|x| x == "meta") {
                match self.read_meta(seq) {
                    Some((meta, queued)) => seen.push((meta, queued)),
                    None => self.remove(seq),
                }
            } else if !self.meta(seq).exists() {
                let _ = fs::remove_file(&p);
            }
        }
        seen.sort_by_key(|(m, _)| m.seq);
        for (meta, queued) in seen {
            q.restore(meta, queued);
        }
        if let Some(floor) = read_number(&self.root.join(FLOOR)) {
            q.restore_floor(floor);
        }
        Ok(q)
    }

    /// Saves a relay's queue floor ([`ProductQueue::floor`]), for [`QueueDir::restore`] to
    /// take back: without it a restart takes everything before the oldest product held as
    /// gone, and the relay's subscribers would be told its filter's gaps there are lost. Only
    /// a relay's queue has gaps, so only a relay saves it. Written aside and renamed, as
    /// `next_seq` is: a crash leaves the old floor or the new one.
    pub fn save_floor(&self, floor: u64) -> io::Result<()> {
        let t = self.tmp();
        fs::write(&t, floor.to_string())?;
        fs::rename(&t, self.root.join(FLOOR))
    }

    fn read_meta(&self, seq: u64) -> Option<(ProductMeta, Micros)> {
        let mut b = Vec::new();
        File::open(self.meta(seq)).ok()?.read_to_end(&mut b).ok()?;
        let Ok(Msg::Product { meta, sent_at }) = Msg::decode(&b) else {
            return None;
        };
        let len = fs::metadata(self.data(seq)).ok()?.len();
        (meta.seq == seq && len == meta.size).then_some((meta, sent_at))
    }

    /// Moves an inserted product's bytes into place and records it.
    pub fn commit(
        &self,
        tmp: &Path,
        meta: &ProductMeta,
        queued: Micros,
        next_seq: u64,
    ) -> io::Result<()> {
        fs::rename(tmp, self.data(meta.seq))?;
        let mut b = BytesMut::new();
        Msg::Product {
            meta: meta.clone(),
            sent_at: queued,
        }
        .encode(&mut b);
        let t = self.tmp();
        fs::write(&t, &b)?;
        fs::rename(&t, self.meta(meta.seq))?;
        let t = self.tmp();
        fs::write(&t, next_seq.to_string())?;
        fs::rename(&t, self.root.join("next_seq"))
    }

    /// Deletes a product's files (evicted).
    pub fn remove(&self, seq: u64) {
        let _ = fs::remove_file(self.meta(seq));
        let _ = fs::remove_file(self.data(seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(seq: u64, size: u64) -> ProductMeta {
        ProductMeta {
            seq,
            name: format!("p{seq}"),
            feedtype: "X".into(),
            created: seq * 10,
            size,
            hash: [seq as u8; 32],
            tag: bytes::Bytes::from_static(&[1; 32]),
        }
    }

    fn limits() -> QueueLimits {
        QueueLimits {
            max_bytes: 1 << 20,
            max_age: u64::MAX,
        }
    }

    #[test]
    fn restores_whole_products_and_drops_what_a_crash_left() {
        let root = std::env::temp_dir().join(format!("bulkcast-feed-disk-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let d = QueueDir::open(&root).unwrap();
        for seq in 1..=3 {
            let t = d.tmp();
            fs::write(&t, vec![7u8; 100]).unwrap();
            d.commit(&t, &meta(seq, 100), seq * 10, seq + 1).unwrap();
        }
        d.remove(1);
        // A crash between the data and its metadata, a truncated data file, an insert cut short.
        fs::write(d.data(9), b"orphan").unwrap();
        fs::write(d.data(3), vec![7u8; 50]).unwrap();
        fs::write(d.tmp(), b"half").unwrap();
        let d = QueueDir::open(&root).unwrap();
        let q = d.restore(limits()).unwrap();
        assert_eq!((q.first_seq(), q.last_seq()), (Some(2), Some(2)));
        assert_eq!(
            q.get(2).map(|e| (e.meta.clone(), e.queued)),
            Some((meta(2, 100), 20))
        );
        assert_eq!(q.next_seq(), 4, "sequence numbers are never reused");
        assert!(!d.data(9).exists() && !d.data(3).exists());
        assert_eq!(fs::read_dir(root.join("tmp")).unwrap().count(), 0);
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_saved_floor_comes_back_with_the_queue() {
        let root = std::env::temp_dir().join(format!("bulkcast-feed-floor-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let d = QueueDir::open(&root).unwrap();
        let t = d.tmp();
        fs::write(&t, vec![7u8; 100]).unwrap();
        // A relay's first product, 5: its filter passed over 1 to 4.
        d.commit(&t, &meta(5, 100), 50, 6).unwrap();
        assert_eq!(d.restore(limits()).unwrap().floor(), 5, "nothing saved");
        d.save_floor(1).unwrap();
        let q = QueueDir::open(&root).unwrap().restore(limits()).unwrap();
        assert_eq!((q.floor(), q.first_seq()), (1, Some(5)));
        assert!(!q.is_gone(4));
        let _ = fs::remove_dir_all(&root);
    }
}
