//! Property tests: what bulkcast encodes or prints, it decodes or parses back to the same
//! value; and no input, however cut, makes a decoder panic. (The fuzz targets in `fuzz/` run
//! the same decoders on unstructured input for much longer.)

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::identity::{AllowList, HostKey, Identity, PublicKey, Role};
use bulkcast_proto::wire::{self, Chunk, Frame, Head, Part, SourceSig, MAX_FRAME, VERSION};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

fn frame() -> impl Strategy<Value = Frame> {
    let name = "[ -~]{0,40}";
    prop_oneof![
        any::<[u8; 16]>().prop_map(|nonce| Frame::Hello {
            version: VERSION,
            nonce
        }),
        (any::<u8>(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(mode, msg)| {
            Frame::Noise {
                mode,
                msg: Bytes::from(msg),
            }
        }),
        name.prop_map(|reason| Frame::Refused { reason }),
        (name, name).prop_map(|(name, listen)| Frame::Join { name, listen }),
        (
            any::<u64>(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            prop::option::of((any::<[u8; 32]>(), prop::collection::vec(any::<u8>(), 64))),
            prop::collection::vec(any::<u8>(), 0..2000),
        )
            .prop_map(|(index, hash, tag, sig, data)| Frame::Chunk(Chunk {
                index,
                hash,
                tag,
                sig: sig.map(|(key, s)| {
                    Box::new(SourceSig {
                        key,
                        sig: s.try_into().unwrap(),
                    })
                }),
                data: Bytes::from(data),
            })),
        (
            (
                any::<u64>(),
                any::<u32>(),
                any::<[u8; 32]>(),
                any::<[u8; 32]>()
            ),
            prop::option::of((any::<[u8; 32]>(), prop::collection::vec(any::<u8>(), 64))),
            prop::collection::vec(any::<[u8; 32]>(), 0..70),
        )
            .prop_map(|((index, len, hash, tag), sig, cvs)| Frame::Head(Head {
                index,
                len,
                hash,
                tag,
                sig: sig.map(|(key, s)| {
                    Box::new(SourceSig {
                        key,
                        sig: s.try_into().unwrap(),
                    })
                }),
                cvs,
            })),
        (
            any::<u64>(),
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..2000)
        )
            .prop_map(|(index, offset, data)| Frame::Part(Part {
                index,
                offset,
                data: Bytes::from(data),
            })),
        (any::<u32>(), any::<u64>()).prop_map(|(node, upto)| Frame::Ack { node, upto }),
        any::<u64>().prop_map(|index| Frame::Request { index }),
        (any::<u64>(), prop::collection::vec(name, 0..5))
            .prop_map(|(session, addrs)| Frame::Dial { session, addrs }),
    ]
}

fn wire_bytes(f: &Frame) -> BytesMut {
    let e = f.encode();
    let mut b = BytesMut::from(&e.head[..]);
    b.extend_from_slice(&e.data);
    b
}

proptest! {
    #[test]
    fn frames_round_trip(f in frame()) {
        let mut b = wire_bytes(&f);
        let back = wire::decode_from(&mut b, MAX_FRAME).unwrap().unwrap();
        prop_assert_eq!(back, f);
        prop_assert!(b.is_empty());
    }

    #[test]
    fn a_frame_cut_anywhere_is_incomplete_never_a_panic(f in frame(), cut in any::<prop::sample::Index>()) {
        let b = wire_bytes(&f);
        let at = cut.index(b.len());
        let mut part = BytesMut::from(&b[..at]);
        prop_assert_eq!(wire::decode_from(&mut part, MAX_FRAME), Ok(None));
    }

    #[test]
    fn a_frame_with_bytes_flipped_decodes_or_errs(f in frame(), at in any::<prop::sample::Index>(), x in 1u8..) {
        let mut b = wire_bytes(&f);
        let i = at.index(b.len());
        b[i] ^= x;
        let _ = wire::decode_from(&mut b, MAX_FRAME);
    }

    #[test]
    fn secrets_and_keys_print_and_parse_back(seed in any::<[u8; 32]>()) {
        let s = Secret::from_bytes(seed);
        prop_assert_eq!(Secret::from_hex(&s.to_hex()).unwrap(), s);
        let k = HostKey::from_seed(seed);
        prop_assert_eq!(HostKey::from_hex(&k.to_hex()).unwrap().public(), k.public());
        prop_assert_eq!(PublicKey::from_hex(&k.public().to_string()).unwrap(), k.public());
    }

    #[test]
    fn allow_lists_parse_back_with_roles_and_names(
        entries in prop::collection::vec((any::<[u8; 32]>(), any::<bool>(), "[a-z0-9-]{0,12}"), 1..8)
    ) {
        let mut text = String::from("# a fleet\n");
        for (seed, relay, name) in &entries {
            let role = if *relay { "relay" } else { "push" };
            text += &format!("{} {role} {name}  # comment\n\n", HostKey::from_seed(*seed).public());
        }
        let l = AllowList::parse(&text).unwrap();
        prop_assert_eq!(l.len(), entries.len());
        for (seed, _, _) in &entries {
            let p = HostKey::from_seed(*seed).public();
            // With a key listed twice, the first line decides.
            let first = entries.iter().find(|(s, _, _)| HostKey::from_seed(*s).public() == p).unwrap();
            let want = if first.1 { Role::Relay } else { Role::Push };
            prop_assert_eq!(l.role(&p), Some(want));
        }
    }

    #[test]
    fn signed_chunks_verify_after_the_wire(seed in any::<[u8; 32]>(), data in prop::collection::vec(any::<u8>(), 1..4096), session in any::<u64>(), index in any::<u64>()) {
        let key = HostKey::from_seed(seed);
        let base = Keys::derive(&Secret::from_bytes([7; 32]));
        let source = base.clone().with_identity(Identity { key: key.clone(), allow: AllowList::default() });
        let receiver = base.with_identity(Identity { key: HostKey::from_seed([0; 32]), allow: AllowList::of([key.public()]) }).requiring_source();
        let c = source.seal(session, index, Bytes::from(data));
        let mut b = wire_bytes(&Frame::Chunk(c));
        let Some(Frame::Chunk(back)) = wire::decode_from(&mut b, MAX_FRAME).unwrap() else {
            panic!("not a chunk");
        };
        prop_assert_eq!(receiver.verify(session, &back), Ok(()));
    }
}
