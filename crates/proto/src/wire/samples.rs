//! Byte pin of the wire format: one sample of every [`Frame`] kind (and of every sub-message
//! of the swarm, swarm set-up and multicast frames) is encoded, and a BLAKE3 hash of all the
//! encodings is compared with a constant. Moving or splitting the wire code must leave every
//! byte where it was; a deliberate format change updates the constant (and [`VERSION`]).
//!
//! [`kind_index`] matches every variant without a wildcard, so a new frame kind does not
//! compile here until it is given an index, and the count check then asks for a sample.

use super::*;
use crate::manifest::{Entry, EntryKind, Manifest, Mtime, ObjectKind};
use crate::mcast::msg::{McastOpen, Nak};
use crate::mcast::McastMsg;
use crate::swarm::{Strategy, SwarmMsg};
use bytes::Bytes;

/// The number of variants of [`Frame`]; [`kind_index`] returns `0..KINDS`.
pub(super) const KINDS: usize = 34;

/// BLAKE3 over every sample's encoding (each prefixed by its length) and a manifest's
/// [`object_id`], as wire.rs encoded them at protocol version 10 (from 9 only `Hello`'s
/// version moved).
pub(super) const PIN: &str = "33c2e855cb4eb40d3b1f4cfa2ca6348603ee4d2961e8daf6a7644486fb753083";

pub(super) fn kind_index(f: &Frame) -> usize {
    match f {
        Frame::Hello { .. } => 0,
        Frame::Challenge { .. } => 1,
        Frame::Auth { .. } => 2,
        Frame::Noise { .. } => 3,
        Frame::Refused { .. } => 4,
        Frame::Join { .. } => 5,
        Frame::Open(_) => 6,
        Frame::Chunk(_) => 7,
        Frame::Head(_) => 8,
        Frame::Part(_) => 9,
        Frame::End(_) => 10,
        Frame::Idle => 11,
        Frame::Ack { .. } => 12,
        Frame::Done { .. } => 13,
        Frame::Have { .. } => 14,
        Frame::Failed { .. } => 15,
        Frame::Rejected { .. } => 16,
        Frame::Request { .. } => 17,
        Frame::Ping { .. } => 18,
        Frame::Pong { .. } => 19,
        Frame::Probe { .. } => 20,
        Frame::Dial { .. } => 21,
        Frame::Probed { .. } => 22,
        Frame::BwProbe { .. } => 23,
        Frame::BwResult { .. } => 24,
        Frame::Sink => 25,
        Frame::SinkReport { .. } => 26,
        Frame::Attach { .. } => 27,
        Frame::Spread { .. } => 28,
        Frame::Got { .. } => 29,
        Frame::Swarm(_) => 30,
        Frame::SwarmSetup(_) => 31,
        Frame::Mcast(_) => 32,
        Frame::Error { .. } => 33,
    }
}

pub(super) fn manifest() -> Manifest {
    Manifest {
        name: "data".into(),
        kind: ObjectKind::Dir,
        total_len: Some(10),
        entries: vec![
            Entry {
                path: "a".into(),
                kind: EntryKind::Dir,
                len: 0,
                mode: 0o755,
                mtime: Some(Mtime {
                    secs: -5,
                    nanos: 999_999_999,
                }),
            },
            Entry {
                path: "a/b.bin".into(),
                kind: EntryKind::File,
                len: 10,
                mode: 0o4750,
                mtime: None,
            },
            Entry {
                path: "a/link".into(),
                kind: EntryKind::Symlink("b.bin".into()),
                len: 0,
                mode: 0o777,
                mtime: Some(Mtime {
                    secs: 1_700_000_000,
                    nanos: 1,
                }),
            },
        ],
        mode: 0o750,
        mtime: Some(Mtime { secs: 7, nanos: 0 }),
    }
}

fn sig() -> SourceSig {
    SourceSig {
        key: [8; 32],
        sig: [9; 64],
    }
}

fn open() -> Open {
    Open {
        session: 42,
        node: 3,
        chunk_size: 1 << 20,
        stall_timeout_ms: 30_000,
        cc: "bbr".into(),
        manifest: manifest(),
        members: vec![
            Member {
                node: 3,
                parent: 1,
                name: "h3".into(),
                addr: "127.0.0.1:7003 10.0.0.3:7003".into(),
                uplink_kbps: 100_000,
            },
            Member {
                node: 4,
                parent: 3,
                name: "h4".into(),
                addr: "127.0.0.1:7004".into(),
                uplink_kbps: 0,
            },
        ],
        stripe: Some(Box::new(StripeInfo {
            group: 9,
            tree: 1,
            pattern: vec![0, 1, 0],
            object: Manifest {
                name: "data".into(),
                kind: ObjectKind::Stream,
                total_len: None,
                entries: vec![],
                mode: 0o644,
                mtime: None,
            },
        })),
        edges: EdgeMode {
            streams: 0,
            scheduler: EdgeScheduler::Weighted,
        },
        sig: Some(Box::new(sig())),
    }
}

fn swarm_open(strategy: Strategy) -> SwarmSetup {
    SwarmSetup::Open(Box::new(SwarmOpen {
        session: 77,
        node: 2,
        chunk_size: 1 << 16,
        stall_timeout_ms: 30_000,
        strategy,
        seed: 0xdead_beef,
        manifest: manifest(),
        members: vec![
            SwarmMember {
                node: 0,
                parent: NO_PARENT,
                cluster: 0,
                name: "source".into(),
                addr: String::new(),
            },
            SwarmMember {
                node: 1,
                parent: 0,
                cluster: 1,
                name: "fra-1".into(),
                addr: "127.0.0.1:7001".into(),
            },
        ],
        pieces_root: [9; 32],
        sig: Some(Box::new(sig())),
    }))
}

pub(super) fn samples() -> Vec<Frame> {
    let mut v = vec![
        Frame::Hello {
            version: VERSION,
            nonce: [7; 16],
        },
        Frame::Challenge {
            nonce: [1; 16],
            mac: [2; 32],
        },
        Frame::Auth { mac: [3; 32] },
        Frame::Noise {
            mode: 2,
            msg: Bytes::from_static(b"noise message"),
        },
        Frame::Refused {
            reason: "wrong secret".into(),
        },
        Frame::Join {
            name: "gpu-7".into(),
            listen: "127.0.0.1:9".into(),
        },
        Frame::Open(open()),
        Frame::Open(Open {
            stripe: None,
            sig: None,
            edges: EdgeMode::default(),
            ..open()
        }),
        Frame::Chunk(Chunk {
            index: 9,
            hash: [4; 32],
            tag: [5; 32],
            sig: None,
            data: Bytes::from_static(b"hello chunk"),
        }),
        Frame::Chunk(Chunk {
            index: 10,
            hash: [4; 32],
            tag: [5; 32],
            sig: Some(Box::new(sig())),
            data: Bytes::from_static(b"signed chunk"),
        }),
        Frame::Head(Head {
            index: 11,
            len: 40_000,
            hash: [1; 32],
            tag: [2; 32],
            sig: None,
            cvs: vec![[3; 32], [4; 32], [5; 32]],
        }),
        Frame::Head(Head {
            index: 12,
            len: 100,
            hash: [1; 32],
            tag: [2; 32],
            sig: Some(Box::new(sig())),
            cvs: vec![],
        }),
        Frame::Part(Part {
            index: 11,
            offset: 16_384,
            data: Bytes::from_static(b"part bytes"),
        }),
        Frame::End(End {
            chunks: 3,
            total_len: 2_000_000,
            tag: [6; 32],
            sig: None,
        }),
        Frame::End(End {
            chunks: 3,
            total_len: 2_000_000,
            tag: [6; 32],
            sig: Some(sig()),
        }),
        Frame::Idle,
        Frame::Ack { node: 4, upto: 17 },
        Frame::Done {
            node: 4,
            received: 5,
        },
        Frame::Have {
            node: 4,
            complete: false,
            ranges: vec![(0, 3), (7, 9)],
        },
        Frame::Have {
            node: 5,
            complete: true,
            ranges: vec![],
        },
        Frame::Failed {
            node: 5,
            reason: "disk full".into(),
        },
        Frame::Rejected {
            node: 5,
            from: 2,
            index: 9,
        },
        Frame::Request { index: 11 },
        Frame::Ping { nonce: 3 },
        Frame::Pong { nonce: 3 },
        Frame::Probe {
            samples: 5,
            timeout_ms: 2000,
            targets: vec!["a:1".into(), "b:2".into()],
        },
        Frame::Dial {
            session: 9,
            addrs: vec!["a:1".into(), "b:2".into()],
        },
        Frame::Probed {
            rtt_us: vec![120, UNREACHABLE],
        },
        Frame::BwProbe {
            target: "a:1".into(),
            millis: 500,
        },
        Frame::BwResult { kbps: 95_000 },
        Frame::Sink,
        Frame::SinkReport {
            bytes: 1 << 20,
            micros: 1000,
        },
        Frame::Attach {
            session: 7,
            token: 0xfeed,
            conn: 3,
            window: 256,
        },
        Frame::Spread {
            seq: 41,
            inner: Box::new(Frame::Chunk(Chunk {
                index: 9,
                hash: [1; 32],
                tag: [2; 32],
                sig: None,
                data: Bytes::from_static(b"striped bytes"),
            })),
        },
        Frame::Spread {
            seq: 42,
            inner: Box::new(Frame::Ack { node: 1, upto: 2 }),
        },
        Frame::Got { seq: 41 },
    ];
    v.extend(
        [
            SwarmMsg::bitfield(11, |i| i % 3 == 0),
            SwarmMsg::Have { index: 5 },
            SwarmMsg::Cancel { index: 6 },
            SwarmMsg::Reject { index: 7 },
            SwarmMsg::Choke,
            SwarmMsg::Unchoke,
            SwarmMsg::Interested,
            SwarmMsg::NotInterested,
            SwarmMsg::Complete { node: 4 },
            SwarmMsg::AllDone,
            SwarmMsg::Dealt,
            SwarmMsg::Cancelled { index: 8 },
        ]
        .into_iter()
        .map(Frame::Swarm),
    );
    v.extend(
        [
            swarm_open(Strategy::TreePush),
            swarm_open(Strategy::Swarm),
            swarm_open(Strategy::Mob),
            swarm_open(Strategy::Hybrid),
            SwarmSetup::Peer {
                session: 77,
                node: 3,
            },
            SwarmSetup::Report {
                node: 3,
                received: vec![(0, 1 << 20), (4, 65_536)],
            },
            SwarmSetup::Lost { node: 5 },
            SwarmSetup::Hashes {
                first: 4,
                hashes: vec![[1; 32], [2; 32]],
            },
            SwarmSetup::Back { node: 5 },
        ]
        .into_iter()
        .map(Frame::SwarmSetup),
    );
    v.extend(
        [
            McastMsg::Open(Box::new(McastOpen {
                session: 5,
                group: "239.1.2.3:5000".into(),
                name: "file.bin".into(),
                size: 123_456,
                mode: 0o644,
                symbol: 1400,
                k: 64,
                m: 16,
                renak_ms: 50,
                key: Some(crate::mcast::seal::GroupKey::from_bytes([0x5a; 32])),
                mtime: Some(crate::manifest::Mtime {
                    secs: 1_700_000_000,
                    nanos: 5,
                }),
            })),
            McastMsg::Holds {
                complete: true,
                bytes: 123_456,
            },
            McastMsg::Ready {
                joined: true,
                reason: String::new(),
            },
            McastMsg::Heard,
            McastMsg::Hashes {
                first: 2,
                hashes: vec![[1; 32], [2; 32]],
            },
            McastMsg::Nak(vec![Nak {
                block: 1,
                seen: 2,
                need: 3,
            }]),
            McastMsg::End { blocks: 9 },
            McastMsg::Done {
                ok: false,
                reason: "disk".into(),
                datagrams: 1000,
                decoded: 990,
            },
            McastMsg::Cancel {
                reason: "stop".into(),
            },
        ]
        .into_iter()
        .map(Frame::Mcast),
    );
    v.push(Frame::Error {
        reason: "bad".into(),
    });
    v
}
