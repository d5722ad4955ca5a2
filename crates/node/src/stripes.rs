//! Receiving a balanced multi-tree send: every tree's session writes its stripe into one shared
//! local copy, which is moved into place when every stripe is complete.
//!
//! The first stripe session of an object to arrive opens the [`Group`]; the others attach to
//! it through the agent's [`Groups`] registry. A task routes the store's events back to the
//! stripe whose chunk they concern, translating global chunk indices to the stripe's own.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};

use bulkcast_proto::manifest::Manifest;
use bulkcast_proto::stripe::Stripes;
use bulkcast_proto::wire::SessionId;
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::store::{LocalCopy, Store, StoreEvent, Target};

/// The objects an agent is receiving as stripes, by group id.
#[derive(Clone, Default)]
pub struct Groups(Arc<Mutex<HashMap<SessionId, Weak<Group>>>>);

impl std::fmt::Debug for Groups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Groups(..)")
    }
}

impl Groups {
    /// The group of `id`, opened with `open` if no stripe of it is being received.
    pub fn get_or_open(
        &self,
        id: SessionId,
        open: impl FnOnce() -> io::Result<Arc<Group>>,
    ) -> io::Result<Arc<Group>> {
        let mut map = self.0.lock().expect("groups lock");
        map.retain(|_, g| g.strong_count() > 0);
        if let Some(g) = map.get(&id).and_then(Weak::upgrade) {
            return Ok(g);
        }
        let g = open()?;
        map.insert(id, Arc::downgrade(&g));
        Ok(g)
    }
}

/// One object received as stripes.
pub struct Group {
    store: Store,
    stripes: Stripes,
    chunk_size: u32,
    state: Mutex<GroupState>,
}

#[derive(Default)]
struct GroupState {
    /// Per tree: where its store events go, once attached.
    routes: Vec<Option<mpsc::UnboundedSender<StoreEvent>>>,
    /// Per tree: its stripe is complete.
    complete: Vec<bool>,
    /// The copy failed (sent to every stripe, also to those attaching later).
    failed: Option<String>,
    /// The outcome of the move into place.
    finalized: Option<Result<PathBuf, String>>,
}

impl Group {
    /// Opens the shared copy of `object` and starts routing its events.
    pub fn open(
        target: Target,
        object: &Manifest,
        id: SessionId,
        stripes: Stripes,
        chunk_size: u32,
        copy_io: crate::direct::CopyIo,
        stored: Option<Arc<AtomicU64>>,
    ) -> io::Result<Arc<Group>> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let store = Store::open(target, object, id, copy_io, tx, stored)?;
        let trees = stripes.trees();
        let group = Arc::new(Group {
            store,
            stripes,
            chunk_size,
            state: Mutex::new(GroupState {
                routes: vec![None; trees],
                complete: vec![false; trees],
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

    /// Attaches tree `tree`'s session: its view of the copy and its events.
    pub fn attach(
        self: &Arc<Self>,
        tree: u16,
    ) -> io::Result<(StripeCopy, mpsc::UnboundedReceiver<StoreEvent>)> {
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
        Ok((
            StripeCopy {
                group: self.clone(),
                tree,
            },
            rx,
        ))
    }

    fn route(&self, ev: StoreEvent) {
        let mut st = self.state.lock().expect("group lock");
        match ev {
            StoreEvent::Stored(g) => {
                let t = self.stripes.tree_of(g) as usize;
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
            // Stripes are never read back (`LocalCopy::load` is not offered).
            StoreEvent::Loaded(..) => {}
        }
    }
}

/// One stripe's view of the shared copy: chunk indices are the stripe's own.
pub struct StripeCopy {
    group: Arc<Group>,
    tree: u16,
}

impl LocalCopy for StripeCopy {
    fn write(&self, index: u64, _offset: u64, data: Bytes) {
        let g = self.group.stripes.global(self.tree, index);
        self.group
            .store
            .write(g, g * self.group.chunk_size as u64, data);
    }

    fn finalize(&self) {
        let mut st = self.group.state.lock().expect("group lock");
        st.complete[self.tree as usize] = true;
        if st.complete.iter().all(|&c| c) {
            self.group.store.finalize();
        }
    }
}
