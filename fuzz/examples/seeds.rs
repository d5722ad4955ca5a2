//! Writes the seed corpus (`fuzz/corpus/TARGET/`) from the real encoders, so the fuzzers start
//! from valid inputs of every kind: `cargo run --example seeds` in `fuzz/`.

use std::path::Path;

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::identity::{HostKey, Identity};
use bulkcast_proto::manifest::{Entry, EntryKind, Manifest, ObjectKind};
use bulkcast_proto::paced::packet::{self, CloseCode};
use bulkcast_proto::wire::{Frame, Member, Open, VERSION};
use bytes::Bytes;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// A frame's body, as `Frame::decode` takes it (no length prefix).
fn body(f: &Frame) -> Vec<u8> {
    let e = f.encode();
    let mut v = e.head[4..].to_vec();
    v.extend_from_slice(&e.data);
    v
}

fn open(m: Manifest) -> Open {
    Open {
        session: 7,
        node: 1,
        chunk_size: 1 << 16,
        stall_timeout_ms: 1000,
        cc: "bbr".into(),
        manifest: m,
        members: vec![Member {
            node: 1,
            parent: 0,
            name: "a".into(),
            addr: "127.0.0.1:7400".into(),
            uplink_kbps: 0,
        }],
        stripe: None,
        edges: Default::default(),
        sig: None,
    }
}

fn main() {
    let key = HostKey::from_seed([5; 32]);
    let keys = Keys::derive(&Secret::from_bytes([1; 32])).with_identity(Identity {
        key: key.clone(),
        allow: Default::default(),
    });
    let tree = Manifest {
        name: "dataset".into(),
        kind: ObjectKind::Dir,
        total_len: Some(3),
        entries: vec![
            Entry {
                path: "sub".into(),
                kind: EntryKind::Dir,
                len: 0,
                mode: 0o755,
                mtime: None,
            },
            Entry {
                path: "sub/f".into(),
                kind: EntryKind::File,
                len: 3,
                mode: 0o644,
                mtime: None,
            },
            Entry {
                path: "sub/link".into(),
                kind: EntryKind::Symlink("f".into()),
                len: 0,
                mode: 0o777,
                mtime: None,
            },
        ],
        mode: 0o755,
        mtime: None,
    };
    let file = Manifest {
        name: "f.bin".into(),
        kind: ObjectKind::File,
        total_len: Some(10),
        entries: vec![],
        mode: 0o644,
        mtime: None,
    };
    let frames = [
        Frame::Hello {
            version: VERSION,
            nonce: [1; 16],
        },
        Frame::Noise {
            mode: 1,
            msg: Bytes::from_static(&[9; 48]),
        },
        Frame::Refused {
            reason: "no".into(),
        },
        Frame::Open(open(tree.clone())),
        Frame::Open(Open {
            sig: keys.sign_open(7, 1 << 16, &tree, None),
            ..open(tree.clone())
        }),
        Frame::Chunk(keys.seal(7, 0, Bytes::from_static(b"signed"))),
        Frame::End(keys.seal_end(7, 1, 6)),
        Frame::Dial {
            session: 7,
            addrs: vec!["127.0.0.1:1".into()],
        },
        Frame::Join {
            name: "r".into(),
            listen: "127.0.0.1:2".into(),
        },
    ];
    for (i, f) in frames.iter().enumerate() {
        write("frame", &format!("{i}-{}", f.kind()), &body(f));
    }
    for (name, m) in [("tree", tree), ("file", file)] {
        // The manifest target prepends the Open type itself.
        write("manifest", name, &body(&Frame::Open(open(m)))[1..]);
    }
    let mut d = Vec::new();
    packet::encode_data(&mut d, 3, 1, 0, false, b"payload");
    write("paced_datagram", "data", &d);
    let mut c = Vec::new();
    packet::encode_close(&mut c, 3, CloseCode::Idle);
    write("paced_datagram", "close", &c);
    write(
        "hosts_matrix",
        "hosts.toml",
        b"[source]\nsite = \"a\"\n\n[[host]]\naddr = \"10.0.0.1:7400\"\nname = \"h1\"\nsite = \"b\"\n",
    );
    write("hosts_matrix", "list", b"10.0.0.1:7400,10.0.0.2:7400");
    write(
        "hosts_matrix",
        "matrix.toml",
        b"nodes = [\"s\", \"a\"]\nrtt_ms = [[0, 5], [5, 0]]\nbw_mbps = [[0, 100], [100, 0]]\n",
    );
    write(
        "ticket",
        "ticket",
        format!("bc1/{}/00000000000000ab/127.0.0.1:7400", "ab".repeat(32)).as_bytes(),
    );
    write("agent_config", "key", key.to_hex().as_bytes());
    write(
        "agent_config",
        "allow",
        format!(
            "# fleet\n{} push source\n{} relay r1\n",
            key.public(),
            key.public()
        )
        .as_bytes(),
    );
}
