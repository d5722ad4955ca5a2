//! The wire format's own tests: round trips, truncations, hostile lengths, garbage.

use bytes::{Bytes, BytesMut};

use super::codec::Reader;
use super::manifest::put_manifest;
use super::samples::{kind_index, manifest, samples, KINDS, PIN};
use super::swarm::S_SETUP_OPEN;
use super::*;
use crate::manifest::{Entry, EntryKind, Manifest, Mtime, ObjectKind};

#[test]
fn automatic_spreading_is_one_plain_connection_with_bbr_on_one_path() {
    let auto = EdgeMode {
        streams: 0,
        scheduler: EdgeScheduler::Pull,
    };
    assert_eq!(auto.for_session("bbr", false).streams, 1);
    // `--cc auto` ends on bbr wherever the path is lossy.
    assert_eq!(auto.for_session("auto", false).streams, 1);
    assert!(!auto.for_session("bbr", false).is_striped());
    // Loss-based control, the system's choice, or several paths keep spreading.
    assert_eq!(auto.for_session("cubic", false).streams, 0);
    assert_eq!(auto.for_session("", false).streams, 0);
    assert_eq!(auto.for_session("bbr", true).streams, 0);
    // A number given by the user is kept.
    let four = EdgeMode { streams: 4, ..auto };
    assert_eq!(four.for_session("bbr", false).streams, 4);
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
            // So is a part's (type, index, offset, then its data).
            if matches!(f, Frame::Part(_)) && cut >= 1 + 8 + 4 {
                continue;
            }
            if let Frame::Spread { inner, .. } = &f {
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
    let inner = Frame::Spread {
        seq: 1,
        inner: Box::new(Frame::Got { seq: 0 }),
    };
    let twice = Frame::Spread {
        seq: 2,
        inner: Box::new(inner),
    };
    let wire = twice.encode().to_vec();
    assert_eq!(
        Frame::decode(Bytes::copy_from_slice(&wire[4..])),
        Err(WireError::BadValue("Spread", "nested"))
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
                T_SPREAD,
                T_SWARM_SETUP,
            ][rng.gen_range(0..8)];
        }
        let _ = Frame::decode(Bytes::from(v));
    }
}

#[test]
fn every_frame_kind_has_a_sample() {
    let mut seen = [false; KINDS];
    for f in samples() {
        seen[kind_index(&f)] = true;
    }
    let missing: Vec<usize> = (0..KINDS).filter(|&i| !seen[i]).collect();
    assert!(missing.is_empty(), "no sample of frame kinds {missing:?}");
}

#[test]
fn every_sample_decodes_to_itself() {
    for f in samples() {
        let wire = f.encode().to_vec();
        let back = Frame::decode(Bytes::copy_from_slice(&wire[4..])).unwrap();
        assert_eq!(back, f, "{}", f.kind());
    }
}

#[test]
fn encodings_are_byte_identical_to_the_pin() {
    let mut h = blake3::Hasher::new();
    for f in samples() {
        let wire = f.encode().to_vec();
        h.update(&(wire.len() as u64).to_be_bytes());
        h.update(&wire);
    }
    // An object's identity (resumption keys on it) hashes the same manifest encoding.
    h.update(&object_id(&manifest()));
    assert_eq!(h.finalize().to_hex().as_str(), PIN);
}
