//! The wire format's own tests: round trips, truncations, hostile lengths, garbage.

use bytes::{Bytes, BytesMut};

use super::codec::Reader;
use super::manifest::put_manifest;
use super::swarm::S_SETUP_OPEN;
use super::*;
use crate::manifest::{Entry, EntryKind, Manifest, Mtime, ObjectKind};

#[test]
fn automatic_striping_is_one_plain_connection_with_bbr_on_one_path() {
    let auto = EdgeMode {
        streams: 0,
        scheduler: EdgeScheduler::Pull,
    };
    assert_eq!(auto.for_session("bbr", false).streams, 1);
    // `--cc auto` ends on bbr wherever the path is lossy.
    assert_eq!(auto.for_session("auto", false).streams, 1);
    assert!(!auto.for_session("bbr", false).is_striped());
    // Loss-based control, the system's choice, or several paths keep striping.
    assert_eq!(auto.for_session("cubic", false).streams, 0);
    assert_eq!(auto.for_session("", false).streams, 0);
    assert_eq!(auto.for_session("bbr", true).streams, 0);
    // A number given by the user is kept.
    let four = EdgeMode { streams: 4, ..auto };
    assert_eq!(four.for_session("bbr", false).streams, 4);
}

fn samples() -> Vec<Frame> {
    vec![
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
        Frame::Open(Open {
            session: 42,
            node: 3,
            chunk_size: 1 << 20,
            stall_timeout_ms: 30_000,
            cc: "bbr".into(),
            manifest: Manifest {
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
            },
            members: vec![Member {
                node: 3,
                parent: 1,
                name: "h3".into(),
                addr: "127.0.0.1:7003".into(),
                uplink_kbps: 100_000,
            }],
            stripe: Some(Box::new(StripeInfo {
                group: 9,
                tree: 1,
                pattern: vec![0, 1, 0],
                object: Manifest {
                    name: "data".into(),
                    kind: ObjectKind::File,
                    total_len: Some(30),
                    entries: vec![],
                    mode: 0o644,
                    mtime: None,
                },
            })),
            edges: EdgeMode {
                streams: 0,
                scheduler: EdgeScheduler::Weighted,
            },
            sig: Some(Box::new(SourceSig {
                key: [8; 32],
                sig: [9; 64],
            })),
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
            sig: Some(Box::new(SourceSig {
                key: [6; 32],
                sig: [7; 64],
            })),
            data: Bytes::from_static(b"signed chunk"),
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
            sig: Some(SourceSig {
                key: [1; 32],
                sig: [2; 64],
            }),
        }),
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
        Frame::Probed {
            rtt_us: vec![120, UNREACHABLE],
        },
        Frame::Dial {
            session: 9,
            addrs: vec!["a:1".into(), "b:2".into()],
        },
        Frame::BwProbe {
            target: "a:1".into(),
            millis: 500,
        },
        Frame::BwResult { kbps: 95_000 },
        Frame::Sink,
        Frame::Idle,
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
        Frame::Striped {
            seq: 41,
            inner: Box::new(Frame::Chunk(Chunk {
                index: 9,
                hash: [1; 32],
                tag: [2; 32],
                sig: None,
                data: Bytes::from_static(b"striped bytes"),
            })),
        },
        Frame::Striped {
            seq: 42,
            inner: Box::new(Frame::Ack { node: 1, upto: 2 }),
        },
        Frame::Got { seq: 41 },
        Frame::SwarmSetup(SwarmSetup::Open(Box::new(SwarmOpen {
            session: 77,
            node: 2,
            chunk_size: 1 << 16,
            stall_timeout_ms: 30_000,
            strategy: Strategy::Mob,
            seed: 0xdead_beef,
            manifest: Manifest {
                name: "obj".into(),
                kind: ObjectKind::File,
                total_len: Some(1 << 20),
                entries: vec![],
                mode: 0o600,
                mtime: Some(Mtime { secs: 1, nanos: 2 }),
            },
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
            sig: None,
        }))),
        Frame::SwarmSetup(SwarmSetup::Peer {
            session: 77,
            node: 3,
        }),
        Frame::SwarmSetup(SwarmSetup::Report {
            node: 3,
            received: vec![(0, 1 << 20), (4, 65_536)],
        }),
        Frame::SwarmSetup(SwarmSetup::Lost { node: 5 }),
        Frame::Error {
            reason: "bad".into(),
        },
    ]
}

#[test]
fn every_frame_round_trips() {
    for f in samples() {
        let wire = f.encode().to_vec();
        let mut buf = BytesMut::from(&wire[..]);
        let back = decode_from(&mut buf, MAX_FRAME).unwrap().unwrap();
        assert_eq!(back, f);
        assert!(buf.is_empty());
    }
}

#[test]
fn partial_input_waits_for_more() {
    let wire = samples()[5].encode().to_vec();
    for cut in 0..wire.len() {
        let mut buf = BytesMut::from(&wire[..cut]);
        assert_eq!(decode_from(&mut buf, MAX_FRAME), Ok(None), "cut at {cut}");
    }
}

#[test]
fn every_truncation_of_a_body_is_an_error_not_a_panic() {
    for f in samples() {
        let wire = f.encode().to_vec();
        let body = &wire[4..];
        for cut in 0..body.len() {
            let res = Frame::decode(Bytes::copy_from_slice(&body[..cut]));
            // A chunk's data is open-ended, so a cut inside it is a shorter chunk.
            if matches!(f, Frame::Chunk(_)) && cut >= 1 + 8 + 64 {
                continue;
            }
            if let Frame::Striped { inner, .. } = &f {
                if matches!(**inner, Frame::Chunk(_)) && cut >= 1 + 8 + 1 + 8 + 64 {
                    continue;
                }
            }
            assert!(res.is_err(), "{} cut at {cut} decoded", f.kind());
        }
    }
}

#[test]
fn striped_frames_do_not_nest() {
    let inner = Frame::Striped {
        seq: 1,
        inner: Box::new(Frame::Got { seq: 0 }),
    };
    let twice = Frame::Striped {
        seq: 2,
        inner: Box::new(inner),
    };
    let wire = twice.encode().to_vec();
    assert_eq!(
        Frame::decode(Bytes::copy_from_slice(&wire[4..])),
        Err(WireError::BadValue("Striped", "nested"))
    );
}

#[test]
fn hostile_lengths_are_refused() {
    let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
    assert!(matches!(
        decode_from(&mut buf, MAX_FRAME),
        Err(WireError::TooLarge { .. })
    ));
    let mut buf = BytesMut::from(&[0u8, 0, 0, 0][..]);
    assert_eq!(decode_from(&mut buf, MAX_FRAME), Err(WireError::Empty));
    // An Open whose entry count claims 2^32-1 entries in a few bytes.
    let mut body = vec![T_OPEN];
    body.extend_from_slice(&[0; 8 + 4 + 4 + 4]);
    body.extend_from_slice(&0u32.to_be_bytes()); // empty cc
    body.extend_from_slice(&0u32.to_be_bytes()); // empty name
    body.extend_from_slice(&[0, 0]);
    body.extend_from_slice(&[0, 0, 0, 0, 0]); // mode, no mtime
    body.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        Frame::decode(Bytes::from(body)),
        Err(WireError::Truncated("Open"))
    );
    // A swarm set-up whose member count claims 2^32-1 members in a few bytes.
    let mut body = vec![T_SWARM_SETUP, S_SETUP_OPEN];
    body.extend_from_slice(&[0; 8 + 4 + 4 + 4]);
    body.push(2); // mob
    body.extend_from_slice(&[0; 8]);
    body.extend_from_slice(&0u32.to_be_bytes()); // empty name
    body.extend_from_slice(&[0, 0]); // file, no length
    body.extend_from_slice(&[0, 0, 0, 0, 0]); // mode, no mtime
    body.extend_from_slice(&0u32.to_be_bytes()); // no entries
    body.extend_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        Frame::decode(Bytes::from(body)),
        Err(WireError::Truncated("SwarmSetup"))
    );
    for bad in [&[T_SWARM_SETUP, 0x09][..], &[T_SWARM_SETUP][..]] {
        assert!(Frame::decode(Bytes::copy_from_slice(bad)).is_err());
    }
    let mut body = Frame::SwarmSetup(SwarmSetup::Peer {
        session: 1,
        node: 1,
    })
    .encode()
    .to_vec()[4..]
        .to_vec();
    body.push(0);
    assert_eq!(
        Frame::decode(Bytes::from(body)),
        Err(WireError::Trailing("SwarmSetup", 1))
    );
    assert_eq!(
        Frame::decode(Bytes::from_static(&[0x66])),
        Err(WireError::UnknownType(0x66))
    );
    assert_eq!(
        Frame::decode(Bytes::from_static(b"\x01GET / HTTP/1.1")),
        Err(WireError::BadMagic)
    );
}

fn decode_manifest(b: BytesMut) -> Result<Manifest, WireError> {
    Reader {
        b: b.freeze(),
        what: "Open",
    }
    .manifest()
}

#[test]
fn manifest_entries_decode_strictly() {
    let link = |target: &str| Manifest {
        name: "d".into(),
        kind: ObjectKind::Dir,
        total_len: Some(0),
        entries: vec![Entry {
            path: "sub/l".into(),
            kind: EntryKind::Symlink(target.into()),
            len: 0,
            mode: 0o777,
            mtime: Some(Mtime { secs: 1, nanos: 2 }),
        }],
        mode: 0o755,
        mtime: None,
    };
    let m = link("../x");
    let mut b = BytesMut::new();
    put_manifest(&mut b, &m);
    let good = b.clone();
    assert_eq!(decode_manifest(b), Ok(m));
    // An escaping target decodes (the decoder is syntax) and validation refuses it.
    let mut b = BytesMut::new();
    put_manifest(&mut b, &link("../../x"));
    assert!(decode_manifest(b).unwrap().validate().is_err());
    // The entry's kind byte, then its mtime's nanoseconds, made impossible. Layout:
    // name(4+1) kind(1) len(1+8) mode(4) mtime(1) count(4) | path(4+5) kind ...
    let kind_at = 5 + 1 + 9 + 4 + 1 + 4 + 9;
    let mut b = good.clone();
    b[kind_at] = 3;
    assert_eq!(
        decode_manifest(b),
        Err(WireError::BadValue("Open", "unknown entry kind"))
    );
    let nanos_at = kind_at + 1 + 8 + 4 + 1 + 8;
    let mut b = good.clone();
    b[nanos_at..nanos_at + 4].copy_from_slice(&1_000_000_000u32.to_be_bytes());
    assert!(matches!(decode_manifest(b), Err(WireError::BadValue(..))));
    let mut b = good.clone();
    b[nanos_at - 9] = 2; // the mtime flag
    assert!(matches!(decode_manifest(b), Err(WireError::BadValue(..))));
    // A symlink's target cut short.
    let cut = good.len() - 1;
    assert!(decode_manifest(good.clone().split_to(cut)).is_err());
}

#[test]
fn random_garbage_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    for _ in 0..20_000 {
        let n = rng.gen_range(0..64);
        let mut v: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        if !v.is_empty() && rng.gen_bool(0.7) {
            v[0] = [
                T_HELLO,
                T_NOISE,
                T_OPEN,
                T_CHUNK,
                T_FAILED,
                T_JOIN,
                T_STRIPED,
                T_SWARM_SETUP,
            ][rng.gen_range(0..8)];
        }
        let _ = Frame::decode(Bytes::from(v));
    }
}
