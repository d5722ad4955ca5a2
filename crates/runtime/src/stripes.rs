//! Receiving a balanced multi-tree send: every tree's session writes its stripe into one shared
//! local copy, which is moved into place when every stripe is complete.
//!
//! The first stripe session of an object to arrive opens the [`Group`]; the others attach to
//! it through the agent's [`Groups`] registry. A task routes the store's events back to the
//! stripe whose chunk they concern, translating global chunk indices to the stripe's own.
//!
//! The shared copy is resumable like a tree's ([`Store::open_resumable`]): it is keyed by the
//! object, so what a failed balanced send (or a tree send of the same object) left is split
//! into each stripe's part ([`Stripes::split`]) and every tree's session resumes from its own.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};

use bulkcast_proto::chunkmap::ChunkMap;
use bulkcast_proto::manifest::Manifest;
use bulkcast_proto::stripe::Stripes;
use bulkcast_proto::wire::SessionId;
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::store::{LocalCopy, Partials, Resumed, Store, StoreError, StoreEvent, Target};

/// The objects an agent is receiving as stripes, by group id.
#[derive(Clone, Default)]
pub struct Groups(Arc<Mutex<HashMap<SessionId, Slot>>>);

/// One group's place in [`Groups`]: held while the group is opened (verifying a kept copy
/// reads it whole), so the other stripes wait for it without blocking a thread.
type Slot = Arc<tokio::sync::Mutex<Weak<Group>>>;

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Groups(..)")
    }
}

impl Groups {
    /// The group of `id`, opened with `open` (off the event loop: it blocks) if no stripe of
    /// it is being received.
    pub async fn get_or_open(
        &self,
        id: SessionId,
        open: impl FnOnce() -> io::Result<Arc<Group>> + Send + 'static,
    ) -> io::Result<Arc<Group>> {
        let slot = {
            let mut map = self.0.lock().expect("groups lock");
            map.retain(|_, s| {
                Arc::strong_count(s) > 1 || s.try_lock().map_or(true, |g| g.strong_count() > 0)
            });
            map.entry(id).or_default().clone()
        };
        let mut g = slot.lock().await;
        if let Some(g) = g.upgrade() {
            return Ok(g);
        }
        let group = tokio::task::spawn_blocking(open)
            .await
            .map_err(io::Error::other)??;
        *g = Arc::downgrade(&group);
        Ok(group)
    }
}

/// One object received as stripes.
pub struct Group {
    store: Store,
    stripes: Stripes,
    chunk_size: u32,
    /// The object's length.
    total: u64,
    /// An identical copy was in place when the group was opened.
    complete: bool,
    state: Mutex<GroupState>,
}

#[derive(Default)]
struct GroupState {
    /// Per tree: where its store events go, once attached.
    routes: Vec<Option<mpsc::UnboundedSender<StoreEvent>>>,
    /// Per tree: how many sessions attached so far (the current one's number).
    attached: Vec<u64>,
    /// Chunks queued for writing (global index) and the attachment that wrote them: a chunk
    /// an ended session wrote is not reported to the one that took over from it.
    writing: HashMap<u64, u64>,
    /// Per tree: its stripe is complete.
    complete: Vec<bool>,
    /// The copy failed (sent to every stripe, also to those attaching later).
    failed: Option<StoreError>,
    /// The outcome of the move into place.
    finalized: Option<Result<PathBuf, StoreError>>,
    /// Chunks the copy holds, verified and stored (global indices): what it kept from an
    /// earlier copy of the object, and what every stripe stored since.
    held: ChunkMap,
}

impl Group {
    /// Opens the shared copy of `object` (resuming what an earlier copy of it kept, see
    /// [`Store::open_resumable`]) and starts routing its events. Blocks while it verifies a
    /// kept copy; call it inside a runtime (its blocking threads included).
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        target: Target,
        object: &Manifest,
        id: SessionId,
        stripes: Stripes,
        chunk_size: u32,
        copy_io: crate::direct::CopyIo,
        stored: Option<Arc<AtomicU64>>,
        partials: Partials,
    ) -> io::Result<Arc<Group>> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (store, resumed) = Store::open_resumable(
            target, object, chunk_size, id, copy_io, tx, stored, partials,
        )?;
        let trees = stripes.trees();
        let group = Arc::new(Group {
            store,
            stripes,
            chunk_size,
            total: object.total_len.unwrap_or(0),
            complete: resumed.complete,
            state: Mutex::new(GroupState {
                routes: vec![None; trees],
                attached: vec![0; trees],
                complete: vec![false; trees],
                held: resumed.held,
                ..GroupState::default()
            }),
        });
        let weak = Arc::downgrade(&group);
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                let Some(g) = weak.upgrade() else { return };
                g.route(ev);
            }
        });
        Ok(group)
    }

    /// Attaches tree `tree`'s session: its view of the copy, its events, and what the copy
    /// holds of its stripe. A tree's session that ended (its parent died) lets another attach:
    /// the one that adopts this node resumes from what the first stored.
    pub fn attach(
        self: &Arc<Self>,
        tree: u16,
    ) -> io::Result<(StripeCopy, mpsc::UnboundedReceiver<StoreEvent>, Resumed)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.state.lock().expect("group lock");
        let slot = st.routes.get_mut(tree as usize).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no tree {tree} in this object"),
            )
        })?;
        if slot.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("tree {tree} of this object is already being received"),
            ));
        }
        if let Some(e) = &st.failed {
            let _ = tx.send(StoreEvent::Failed(e.clone()));
        }
        st.routes[tree as usize] = Some(tx);
        st.attached[tree as usize] += 1;
        let number = st.attached[tree as usize];
        let held = match self.complete {
            true => Default::default(),
            false => self.stripes.split(&st.held).swap_remove(tree as usize),
        };
        let resumed = Resumed {
            held,
            complete: self.complete,
        };
        Ok((
            StripeCopy {
                group: self.clone(),
                tree,
                number,
            },
            rx,
            resumed,
        ))
    }

    fn route(&self, ev: StoreEvent) {
        let mut st = self.state.lock().expect("group lock");
        match ev {
            StoreEvent::Stored(g) => {
                st.held.insert(g);
                let t = self.stripes.tree_of(g) as usize;
                let by = st.writing.remove(&g);
                if by != st.attached.get(t).copied() {
                    return;
                }
                if let Some(Some(tx)) = st.routes.get(t) {
                    let _ = tx.send(StoreEvent::Stored(self.stripes.local_of(g)));
                }
            }
            StoreEvent::Failed(e) => {
                st.failed = Some(e.clone());
                for tx in st.routes.iter().flatten() {
                    let _ = tx.send(StoreEvent::Failed(e.clone()));
                }
            }
            StoreEvent::Finalized(r) => {
                st.finalized = Some(r.clone());
                for tx in st.routes.iter().flatten() {
                    let _ = tx.send(StoreEvent::Finalized(r.clone()));
                }
            }
            // Read back for a stripe's children: what the copy held before the session.
            StoreEvent::Loaded(g, r) => {
                let t = self.stripes.tree_of(g) as usize;
                if let Some(Some(tx)) = st.routes.get(t) {
                    let _ = tx.send(StoreEvent::Loaded(self.stripes.local_of(g), r));
                }
            }
        }
    }
}

/// One stripe's view of the shared copy: chunk indices are the stripe's own.
pub struct StripeCopy {
    group: Arc<Group>,
    tree: u16,
    /// Which of the tree's attachments this is.
    number: u64,
}

impl Drop for StripeCopy {
    /// The tree's session is over: another may attach (a new parent opens it again here).
    fn drop(&mut self) {
        let mut st = self.group.state.lock().expect("group lock");
        let current = st.attached.get(self.tree as usize) == Some(&self.number);
        if let Some(r) = st.routes.get_mut(self.tree as usize).filter(|_| current) {
            *r = None;
        }
    }
}

impl LocalCopy for StripeCopy {
    fn write(&self, index: u64, _offset: u64, data: Bytes, hash: [u8; 32]) {
        let g = self.group.stripes.global(self.tree, index);
        let mut st = self.group.state.lock().expect("group lock");
        st.writing.insert(g, self.number);
        drop(st);
        self.group
            .store
            .write(g, g * self.group.chunk_size as u64, data, hash);
    }

    fn load(&self, index: u64, _offset: u64, len: u64) -> bool {
        let g = self.group.stripes.global(self.tree, index);
        let cs = self.group.chunk_size as u64;
        // The stripe's chunk lengths are the object's: only the object's last chunk is short.
        let len = len.min(self.group.total.saturating_sub(g * cs));
        self.group.store.load(g, g * cs, len)
    }

    fn finalize(&self) {
        let mut st = self.group.state.lock().expect("group lock");
        st.complete[self.tree as usize] = true;
        if st.complete.iter().all(|&c| c) {
            self.group.store.finalize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::direct::CopyIo;
    use bulkcast_proto::manifest::ObjectKind;
    use std::os::unix::fs::FileExt;

    const CS: u32 = 4096;

    #[tokio::test]
    async fn stripes_resume_from_what_the_copy_verified_never_a_torn_chunk() {
        let d = std::env::temp_dir().join(format!("bulkcast-stripes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let body: Vec<u8> = (0..6 * CS as usize + 100)
            .map(|i| (i % 251) as u8)
            .collect();
        let m = Manifest {
            name: "obj".into(),
            kind: ObjectKind::File,
            total_len: Some(body.len() as u64),
            entries: vec![],
            mode: 0o644,
            mtime: None,
        };
        let open = || {
            let stripes = Stripes::from_rates(&[1.0, 1.0]).unwrap();
            let target = Target::Dir(d.clone());
            let (io, p) = (CopyIo::Buffered, Partials::default());
            Group::open(target, &m, 7, stripes, CS, io, None, p).unwrap()
        };
        // An earlier balanced send stored chunks 0-3 (global) and died.
        let g = open();
        let (c0, mut rx0, r0) = g.attach(0).unwrap();
        let (c1, mut rx1, _) = g.attach(1).unwrap();
        assert!(r0.held.is_empty() && !r0.complete);
        for gi in 0..4u64 {
            let at = (gi * CS as u64) as usize;
            let data = Bytes::copy_from_slice(&body[at..at + CS as usize]);
            let (copy, rx) = match gi % 2 {
                0 => (&c0, &mut rx0),
                _ => (&c1, &mut rx1),
            };
            let hash = *blake3::hash(&data).as_bytes();
            copy.write(gi / 2, 0, data, hash);
            assert!(matches!(rx.recv().await, Some(StoreEvent::Stored(j)) if j == gi / 2));
        }
        drop((c0, c1, g));
        // Chunk 2's bytes were torn by the crash: the map lists it, the disk does not hold it.
        let part = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .unwrap()
            .path();
        let f = std::fs::OpenOptions::new().write(true).open(part).unwrap();
        f.write_all_at(&[0u8; 100], 2 * CS as u64 + 50).unwrap();
        // The next send: each tree resumes from its part of what verified (global 0, 1, 3).
        let g = open();
        let (c0, _rx0, r0) = g.attach(0).unwrap();
        let (c1, mut rx1, r1) = g.attach(1).unwrap();
        assert_eq!(r0.held.ranges(), vec![(0, 1)]);
        assert_eq!(r1.held.ranges(), vec![(0, 2)]);
        // A relay reads back through its stripe: tree 1's chunk 1 is global chunk 3.
        assert!(c1.load(1, 0, CS as u64));
        let Some(StoreEvent::Loaded(1, Ok(got))) = rx1.recv().await else {
            panic!("no read-back")
        };
        assert_eq!(&got[..], &body[3 * CS as usize..4 * CS as usize]);
        // Another session of a tree may attach once the first let go.
        assert!(g.attach(0).is_err());
        drop(c0);
        assert!(g.attach(0).is_ok());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
