//! Any `Open` a parent sends: a manifest that passes validation names only paths inside the
//! receiver's directory (relative, no `..`, no empty or absolute component, links that stay
//! inside), whatever the counts, lengths and names claim.
#![no_main]

use bulkcast_proto::manifest::EntryKind;
use bulkcast_proto::wire::Frame;
use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;

/// The `Open` frame type (see `wire.rs`).
const T_OPEN: u8 = 0x10;

fn inside(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

fuzz_target!(|data: &[u8]| {
    let mut body = BytesMut::with_capacity(data.len() + 1);
    body.put_u8(T_OPEN);
    body.put_slice(data);
    let Ok(Frame::Open(open)) = Frame::decode(body.freeze()) else {
        return;
    };
    let m = &open.manifest;
    if m.validate().is_err() {
        return;
    }
    assert!(inside(&m.name), "name {:?}", m.name);
    for e in &m.entries {
        assert!(inside(&e.path), "path {:?}", e.path);
        if let EntryKind::Symlink(target) = &e.kind {
            // A link's target, resolved from its directory, stays inside the tree.
            assert!(!target.starts_with('/'), "absolute link {target:?}");
            let mut depth = e.path.split('/').count() as i64 - 1;
            for c in target.split('/') {
                match c {
                    ".." => depth -= 1,
                    "" | "." => {}
                    _ => depth += 1,
                }
                assert!(
                    depth >= 0,
                    "link {:?} -> {target:?} leaves the tree",
                    e.path
                );
            }
        }
    }
});
