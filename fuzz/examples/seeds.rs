//! Writes the seed corpus (`fuzz/corpus/TARGET/`) from the real encoders, so the fuzzers start
//! from valid inputs of every kind: `cargo run --example seeds` in `fuzz/`.

use std::path::Path;

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::groups;
use bulkcast_proto::identity::{HostKey, Identity};
use bulkcast_proto::manifest::{Entry, EntryKind, Manifest, ObjectKind};
use bulkcast_proto::paced::packet::{self, CloseCode};
use bulkcast_proto::wire::{Frame, Head, Member, Open, Part, VERSION};
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
    // A chunk of two and a half groups, as a relay sends it in parts.
    let parted = Bytes::from(
        (0..5 * groups::GROUP / 2)
            .map(|i| i as u8)
            .collect::<Vec<_>>(),
    );
    let (c, cvs) = keys.seal_in_groups(7, 1, parted.clone());
    let head = Head {
        index: 1,
        len: c.data.len() as u32,
        hash: c.hash,
        tag: c.tag,
        sig: c.sig,
        cvs,
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
        // Protocol 6: a chunk in verified parts, announced by its head (three groups).
        Frame::Head(head.clone()),
        Frame::Part(Part {
            index: 1,
            offset: 0,
            data: parted.slice(..groups::GROUP),
        }),
        Frame::Part(Part {
            index: 1,
            offset: groups::GROUP as u32,
            data: parted.slice(groups::GROUP..),
        }),
        Frame::Head(Head {
            sig: None,
            cvs: vec![],
            ..head
        }),
        Frame::Idle,
        Frame::Ack { node: 2, upto: 3 },
        Frame::Done {
            node: 2,
            received: 1 << 20,
        },
        Frame::Have {
            node: 2,
            complete: false,
            ranges: vec![(0, 2), (5, 9)],
        },
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
    paced_seeds();
    mcast_seeds();
    feed_seeds();
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

/// Datagram sequences for the paced target, each datagram behind its 2-byte length (see
/// `fuzz_targets/paced_datagram.rs`), on connection 3: in order, out of order with a gap and a
/// duplicate, ACKs of what the target's side sent, and a close.
fn paced_seeds() {
    fn seq(dgrams: &[Vec<u8>]) -> Vec<u8> {
        let mut v = Vec::new();
        for d in dgrams {
            v.extend_from_slice(&(d.len() as u16).to_be_bytes());
            v.extend_from_slice(d);
        }
        v
    }
    let data = |pn: u64, offset: u64, fin: bool, payload: &[u8]| {
        let mut d = Vec::new();
        packet::encode_data(&mut d, 3, pn, offset, fin, payload);
        d
    };
    let ack = |largest: u64, bits: u8, max_data: u64| {
        let mut d = Vec::new();
        let mut b = [0u8; packet::ACK_BITS as usize / 8];
        b[0] = bits;
        packet::encode_ack(
            &mut d,
            3,
            &packet::Ack {
                largest,
                delay_us: 100,
                recv_us: 5000,
                max_data,
                bits: b,
            },
        );
        d
    };
    let mut close = Vec::new();
    packet::encode_close(&mut close, 3, CloseCode::Idle);
    // Single datagrams, as a listener sees them first.
    write("paced_datagram", "data", &data(1, 0, false, b"payload"));
    write("paced_datagram", "close", &close);
    write("paced_datagram", "ack", &ack(4, 0b1011, 1 << 20));
    write(
        "paced_datagram",
        "seq-in-order",
        &seq(&[
            data(0, 0, false, b"hello "),
            data(1, 6, false, b"world"),
            data(2, 11, true, b"!"),
            ack(1, 1, 1 << 20),
        ]),
    );
    write(
        "paced_datagram",
        "seq-gap-dup",
        &seq(&[
            data(0, 0, false, b"aaaa"),
            data(2, 8, false, b"cccc"),
            data(3, 8, false, b"cccc"),
            data(4, 4, true, b"bbbb"),
            ack(0, 0, 64),
            ack(3, 0b101, 1 << 16),
        ]),
    );
    write(
        "paced_datagram",
        "seq-acks-close",
        &seq(&[
            ack(0, 0, 1 << 20),
            ack(2, 0b11, 1 << 20),
            ack(9, 0xff, 1 << 30),
            data(0, 0, true, b""),
            close,
        ]),
    );
}

/// Control messages, and datagram runs as `fuzz_targets/mcast.rs` cuts them (a length byte in
/// 12-byte units, the top bit for a control message), sealed and in clear.
fn mcast_seeds() {
    use bulkcast_proto::mcast::msg::DgramKind;
    use bulkcast_proto::mcast::seal::{DgramWriter, GroupKey};
    use bulkcast_proto::mcast::McastMsg;
    let msgs = [
        McastMsg::Hashes {
            first: 0,
            hashes: vec![[7; 32]; 2],
        },
        McastMsg::End { blocks: 5 },
        McastMsg::Cancel {
            reason: "stopped".into(),
        },
        McastMsg::Heard,
    ];
    for (i, m) in msgs.iter().enumerate() {
        let mut b = bytes::BytesMut::new();
        m.encode(&mut b);
        write("mcast", &format!("msg-{i}"), &b);
    }
    for (name, key) in [
        ("clear", None),
        ("sealed", Some(GroupKey::from_bytes([3; 32]))),
    ] {
        let mut w = DgramWriter::new(7, key.map(|k| k.cipher()));
        let mut run = Vec::new();
        let mut buf = Vec::new();
        for (kind, block, index) in [
            (DgramKind::Hello, 0, 0),
            (DgramKind::Data, 0, 0),
            (DgramKind::Data, 0, 1),
            (DgramKind::Data, 0, 9),
            (DgramKind::End, 5, 0),
        ] {
            w.write(kind, block, index, &[0x5a; 64], &mut buf);
            // Padded to the target's 12-byte units.
            buf.resize(buf.len().div_ceil(12) * 12, 0);
            run.push((buf.len() / 12) as u8);
            run.extend_from_slice(&buf);
        }
        write("mcast", &format!("datagrams-{name}"), &run);
    }
}

/// Feed messages, as bodies and as datagrams; and datagram runs as `fuzz_targets/feed_msg.rs`
/// cuts them (a length byte, the top bit for a connection message), sealed and in clear.
fn feed_seeds() {
    use bulkcast_proto::feed::msg::{Msg, Start};
    use bulkcast_proto::feed::product::ProductMeta;
    use bulkcast_proto::feed::seal::DgramWriter;
    use bulkcast_proto::mcast::seal::GroupKey;
    let msgs = [
        Msg::Subscribe {
            feedtype: "NEXRAD3".into(),
            name: "".into(),
            start: Start::Seq(3),
            multicast: true,
        },
        Msg::Data {
            seq: 4,
            offset: 0,
            data: Bytes::from_static(b"product bytes"),
        },
        Msg::Index { last_seq: 9 },
        Msg::Skip {
            from: 1,
            to: 2,
            gone: true,
        },
        Msg::Repair {
            seq: 4,
            ranges: vec![(0, 2), (5, 1)],
        },
        Msg::Ack { seq: 3 },
    ];
    let key = GroupKey::from_bytes([3; 32]);
    for (i, m) in msgs.iter().enumerate() {
        let mut b = bytes::BytesMut::new();
        m.encode(&mut b);
        write("feed_msg", &format!("msg-{i}"), &b);
        let mut d = Vec::new();
        DgramWriter::new(11, None).write(m, &mut d);
        write("feed_msg", &format!("dgram-{i}"), &d);
        DgramWriter::new(11, Some(key.cipher())).write(m, &mut d);
        write("feed_msg", &format!("sealed-{i}"), &d);
    }
    // A product of 100 bytes in 64-byte blocks: its start, its blocks, the index after it.
    let product = [
        Msg::Product {
            meta: ProductMeta {
                seq: 1,
                name: "p".into(),
                feedtype: "IDS".into(),
                created: 1,
                size: 100,
                hash: [0; 32],
                tag: Bytes::new(),
            },
            sent_at: 1,
        },
        Msg::Data {
            seq: 1,
            offset: 0,
            data: Bytes::from_static(&[0x5a; 64]),
        },
        Msg::Data {
            seq: 1,
            offset: 64,
            data: Bytes::from_static(&[0x5a; 36]),
        },
        Msg::Index { last_seq: 1 },
    ];
    for (name, cipher) in [("clear", None), ("sealed", Some(key.cipher()))] {
        let mut w = DgramWriter::new(11, cipher);
        let (mut run, mut d) = (Vec::new(), Vec::new());
        for m in &product {
            w.write(m, &mut d);
            run.push(d.len() as u8);
            run.extend_from_slice(&d);
        }
        write("feed_msg", &format!("datagrams-{name}"), &run);
    }
}
