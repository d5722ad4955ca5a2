//! Issue 32: a member that relays a session holds every key of it but the source's. With host
//! keys, an agent takes only chunks its source signed: a relay's forgery is rejected at the
//! first honest hop, nothing is written, and the culprit is named.

use std::time::Duration;

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::identity::{AllowList, HostKey, Identity, Role};
use bulkcast_proto::manifest::{Manifest, ObjectKind};
use bulkcast_proto::wire::{End, Frame, Member, Open};
use bulkcast_runtime::agent::{self, AgentConfig, SessionError};
use bulkcast_runtime::transport::{self, Stream};
use bytes::Bytes;

fn manifest(name: &str, kind: ObjectKind, len: u64) -> Manifest {
    Manifest {
        name: name.into(),
        kind,
        total_len: (kind == ObjectKind::File).then_some(len),
        entries: vec![],
        mode: 0o644,
        mtime: None,
    }
}

const SESSION: u64 = 0xf0;
const CHUNK: u32 = 1 << 16;

/// The set-up of [`SESSION`] for `manifest`, signed by `signer` (`None`: unsigned).
fn open(manifest: Manifest, signer: Option<&Keys>) -> Open {
    Open {
        session: SESSION,
        node: 1,
        chunk_size: CHUNK,
        stall_timeout_ms: 1000,
        cc: String::new(),
        sig: signer.and_then(|k| k.sign_open(SESSION, CHUNK, &manifest, None)),
        manifest,
        members: vec![Member {
            node: 1,
            parent: 0,
            name: "agent".into(),
            addr: "127.0.0.1:1".into(),
            uplink_kbps: 0,
        }],
        stripe: None,
        edges: Default::default(),
    }
}

fn secret() -> Secret {
    Secret::from_bytes([0x32; 32])
}

/// Runs one session from a parent holding `parent_key` that sends `frames` to an agent
/// whose allow list is `allow`; returns the agent's outcome.
async fn push_frames(
    dir: &std::path::Path,
    parent_key: &HostKey,
    allow: &AllowList,
    frames: Vec<Frame>,
) -> Result<agent::Served, SessionError> {
    let agent_key = HostKey::from_seed([9; 32]);
    let cfg = AgentConfig {
        dir: dir.to_path_buf(),
        keys: Keys::derive(&secret()).with_identity(Identity {
            key: agent_key.clone(),
            allow: allow.clone(),
        }),
        node: Default::default(),
        tuning: Default::default(),
        stored: None,
        groups: Default::default(),
        attachments: Default::default(),
        predialed: Default::default(),
        swarms: Default::default(),
        stdout: false,
        io: Default::default(),
        partials: Default::default(),
        running: Default::default(),
        live: Default::default(),
    };
    let parent_keys = Keys::derive(&secret()).with_identity(Identity {
        key: parent_key.clone(),
        allow: AllowList::of([agent_key.public()]),
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let parent = async {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut s = transport::handshake_connect(Stream::Tcp(s), &parent_keys)
            .await
            .unwrap();
        for f in &frames {
            if transport::write_frame(&mut s, f).await.is_err() {
                break; // refused early
            }
        }
        // Answer nothing the agent asks again; hold the connection until it gives up.
        let _ = tokio::time::timeout(Duration::from_secs(3), async {
            while let Ok(Some(_)) = transport::read_frame(&mut s, 1 << 20).await {}
        })
        .await;
    };
    let agent = async {
        let (s, _) = l.accept().await.unwrap();
        agent::session(Stream::Tcp(s), &cfg, None).await
    };
    let (_, r) = tokio::join!(parent, agent);
    r
}

/// One chunk of `data` sealed by `sealer`, as a file, in a set-up the source signed.
async fn push(
    dir: &std::path::Path,
    parent_key: &HostKey,
    allow: &AllowList,
    sealer: &Keys,
    data: &'static [u8],
) -> Result<agent::Served, SessionError> {
    let m = manifest("forged.bin", ObjectKind::File, data.len() as u64);
    let frames = vec![
        Frame::Open(open(m, Some(&as_key(&source())))),
        Frame::Chunk(sealer.seal(SESSION, 0, Bytes::from_static(data))),
        Frame::End(sealer.seal_end(SESSION, 1, data.len() as u64)),
    ];
    push_frames(dir, parent_key, allow, frames).await
}

fn source() -> HostKey {
    HostKey::from_seed([1; 32])
}

fn relay() -> HostKey {
    HostKey::from_seed([2; 32])
}

fn allow() -> AllowList {
    AllowList::with_roles([
        (source().public(), Role::Push),
        (relay().public(), Role::Relay),
    ])
}

fn as_key(k: &HostKey) -> Keys {
    Keys::derive(&secret()).with_identity(Identity {
        key: k.clone(),
        allow: AllowList::default(),
    })
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("bulkcast-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_the_source_key_cannot_make_an_agent_accept_a_forged_chunk() {
    let dir = scratch("forgery");
    let (source, relay, allow) = (source(), relay(), allow());
    let secret = secret();

    // The relay is admitted (it may relay), holds the session secret and MAC key, and signs
    // its forgery with its own key: refused, nothing written, the sender named.
    let r = push(&dir, &relay, &allow, &as_key(&relay), b"forged bytes").await;
    let e = r.expect_err("a forged chunk was accepted").to_string();
    assert!(e.contains("may not push"), "{e}");
    assert!(e.contains("127.0.0.1:"), "the culprit is not named: {e}");
    assert!(!dir.join("forged.bin").exists(), "the forgery was written");

    // Unsigned (MAC only, as in secret mode): refused the same way.
    let r = push(
        &dir,
        &relay,
        &allow,
        &Keys::derive(&secret),
        b"forged bytes",
    )
    .await;
    let e = r.expect_err("an unsigned chunk was accepted").to_string();
    assert!(e.contains("not signed by its source"), "{e}");
    assert!(!dir.join("forged.bin").exists());

    // The same relay carrying the source's signed chunk: delivered.
    let r = push(&dir, &relay, &allow, &as_key(&source), b"real bytes").await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        std::fs::read(dir.join("forged.bin")).unwrap(),
        b"real bytes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cannot_forge_the_end_or_the_manifest_and_is_named() {
    let dir = scratch("forged-end");
    let (source, relay, allow) = (source(), relay(), allow());
    let data = Bytes::from_static(b"the first of many chunks");
    let real = manifest("stream.bin", ObjectKind::Stream, 0);
    let chunk = as_key(&source).seal(SESSION, 0, data.clone());
    let with_end = |end: End| {
        vec![
            Frame::Open(open(real.clone(), Some(&as_key(&source)))),
            Frame::Chunk(chunk.clone()),
            Frame::End(end),
        ]
    };
    // A stream cut short by the relay: an `End` it sealed (MAC-valid: it holds the secret)
    // and signed itself, or left unsigned. Refused, the relay named, nothing in place.
    let len = data.len() as u64;
    for (sealer, want) in [
        (as_key(&relay), "may not push"),
        (Keys::derive(&secret()), "not signed by its source"),
    ] {
        let end = sealer.seal_end(SESSION, 1, len);
        let r = push_frames(&dir, &relay, &allow, with_end(end)).await;
        let e = r.expect_err("a forged end was accepted").to_string();
        assert!(e.contains("end of the object"), "{e}");
        assert!(e.contains(want), "{e}");
        assert!(
            e.contains("parent 127.0.0.1:"),
            "the culprit is not named: {e}"
        );
        assert!(
            !dir.join("stream.bin").exists(),
            "a cut stream was put in place"
        );
    }

    // The file list: renamed (and retargeted) by the relay under the source's signature,
    // signed by the relay, or unsigned. Refused before anything is created.
    let clean = scratch("forged-open");
    let renamed = manifest("elsewhere.bin", ObjectKind::File, len);
    let mut moved = open(renamed.clone(), None);
    moved.sig = open(real.clone(), Some(&as_key(&source))).sig;
    for (o, want) in [
        (moved, "signature does not match"),
        (open(renamed.clone(), Some(&as_key(&relay))), "may not push"),
        (open(renamed.clone(), None), "not signed by its source"),
    ] {
        let frames = vec![
            Frame::Open(o),
            Frame::Chunk(chunk.clone()),
            Frame::End(as_key(&source).seal_end(SESSION, 1, len)),
        ];
        let r = push_frames(&clean, &relay, &allow, frames).await;
        let e = r.expect_err("a forged set-up was accepted").to_string();
        assert!(e.contains("session set-up"), "{e}");
        assert!(e.contains(want), "{e}");
        assert!(
            e.contains("sent by 127.0.0.1:"),
            "the culprit is not named: {e}"
        );
        let written = std::fs::read_dir(&clean).unwrap().count();
        assert_eq!(written, 0, "something was written");
    }
    let _ = std::fs::remove_dir_all(&clean);

    // Everything the source's: delivered through the same relay.
    let end = as_key(&source).seal_end(SESSION, 1, len);
    let r = push_frames(&dir, &relay, &allow, with_end(end)).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(std::fs::read(dir.join("stream.bin")).unwrap(), data);
    let _ = std::fs::remove_dir_all(&dir);
}
