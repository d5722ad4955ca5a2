//! What the store's tests share (`partial`'s and `tree`'s): a store opened as a session opens
//! it, and a chunk written and waited for.

use std::path::Path;

use bulkcast_proto::manifest::Manifest;
use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Partials, Resumed, Store, StoreEvent, Target};
use crate::direct::CopyIo;

/// What a store reports.
pub type Events = mpsc::UnboundedReceiver<StoreEvent>;

/// Opens a resumable store of `m` in directory `d`, with chunks of `cs` bytes.
pub fn open(d: &Path, m: &Manifest, cs: u32) -> (Store, Resumed, Events) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (s, r) = Store::open_resumable(
        Target::Dir(d.into()),
        m,
        cs,
        1,
        CopyIo::Buffered,
        tx,
        None,
        Partials::default(),
    )
    .unwrap();
    (s, r, rx)
}

/// Writes chunk `i` of `body` (chunks of `cs` bytes) and waits until the store has it.
pub async fn write(s: &Store, rx: &mut Events, body: &[u8], cs: u32, i: u64) {
    let at = (i * cs as u64) as usize;
    let end = (at + cs as usize).min(body.len());
    s.write_hashed(i, at as u64, Bytes::copy_from_slice(&body[at..end]));
    assert!(matches!(rx.recv().await, Some(StoreEvent::Stored(j)) if j == i));
}
