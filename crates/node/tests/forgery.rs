//! Issue 32: a member that relays a session holds every key of it but the source's. With host
//! keys, an agent takes only chunks its source signed: a relay's forgery is rejected at the
//! first honest hop, nothing is written, and the culprit is named.

use std::time::Duration;

use bulkcast_node::agent::{self, AgentConfig, SessionError};
use bulkcast_node::transport::{self, Stream};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::identity::{AllowList, HostKey, Identity, Role};
use bulkcast_proto::manifest::{Manifest, ObjectKind};
use bulkcast_proto::wire::{Frame, Member, Open};
use bytes::Bytes;

fn open(session: u64, len: u64) -> Open {
    Open {
        session,
        node: 1,
        chunk_size: 1 << 16,
        stall_timeout_ms: 1000,
        cc: String::new(),
        manifest: Manifest {
            name: "forged.bin".into(),
            kind: ObjectKind::File,
            total_len: Some(len),
            entries: vec![],
            mode: 0o644,
            mtime: None,
        },
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

/// Runs one session from a parent holding `parent_key` that sends `chunk` (sealed by
/// `sealer`) to an agent whose allow list is `allow`; returns the agent's outcome.
async fn push(
    dir: &std::path::Path,
    parent_key: &HostKey,
    allow: &AllowList,
    sealer: &Keys,
    data: &'static [u8],
) -> Result<agent::Served, SessionError> {
    let secret = Secret::from_bytes([0x32; 32]);
    let agent_key = HostKey::from_seed([9; 32]);
    let cfg = AgentConfig {
        dir: dir.to_path_buf(),
        keys: Keys::derive(&secret).with_identity(Identity {
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
    let parent_keys = Keys::derive(&secret).with_identity(Identity {
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
        transport::write_frame(&mut s, &Frame::Open(open(0xf0, data.len() as u64)))
            .await
            .unwrap();
        let c = sealer.seal(0xf0, 0, Bytes::from_static(data));
        transport::write_frame(&mut s, &Frame::Chunk(c))
            .await
            .unwrap();
        let end = sealer.seal_end(0xf0, 1, data.len() as u64);
        transport::write_frame(&mut s, &Frame::End(end))
            .await
            .unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_without_the_source_key_cannot_make_an_agent_accept_a_forged_chunk() {
    let dir = std::env::temp_dir().join(format!("bulkcast-forgery-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let source = HostKey::from_seed([1; 32]);
    let relay = HostKey::from_seed([2; 32]);
    let allow =
        AllowList::with_roles([(source.public(), Role::Push), (relay.public(), Role::Relay)]);
    let secret = Secret::from_bytes([0x32; 32]);
    let as_key = |k: &HostKey| {
        Keys::derive(&secret).with_identity(Identity {
            key: k.clone(),
            allow: AllowList::default(),
        })
    };

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
