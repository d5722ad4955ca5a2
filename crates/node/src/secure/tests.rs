use super::*;
use bulkcast_proto::auth::Secret;
use bulkcast_proto::identity::{AllowList, HostKey, Identity};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn keys(b: u8) -> Keys {
    Keys::derive(&Secret::from_bytes([b; 32]))
}

fn host(seed: u8) -> HostKey {
    HostKey::from_seed([seed; 32])
}

fn with_id(k: Keys, me: &HostKey, allow: &[&HostKey]) -> Keys {
    k.with_identity(Identity {
        key: me.clone(),
        allow: AllowList::of(allow.iter().map(|h| h.public())),
    })
}

async fn pair(c: &Keys, a: &Keys) -> (Result<Admitted, ConnError>, Result<Admitted, ConnError>) {
    let (mut x, mut y) = tokio::io::duplex(1 << 16);
    let r = tokio::join!(connect(&mut x, c), accept(&mut y, a));
    r
}

fn reason(r: &Result<Admitted, ConnError>) -> String {
    match r {
        Ok(_) => "admitted".into(),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn same_secret_admits_and_encrypts_both_ways() {
    let (c, a) = pair(&keys(1), &keys(1)).await;
    let (c, a) = (c.unwrap(), a.unwrap());
    assert!(c.cipher.is_some() && a.cipher.is_some());
    assert!(c.peer.is_none());
}

#[tokio::test]
async fn wrong_secret_is_refused_on_both_sides() {
    let (c, a) = pair(&keys(1), &keys(2)).await;
    assert!(
        matches!(a, Err(ConnError::Auth(AuthError::WrongSecret))),
        "{}",
        reason(&a)
    );
    // The connector learns why from the acceptor.
    assert!(reason(&c).contains("secret"), "{}", reason(&c));
}

#[tokio::test]
async fn plaintext_only_when_both_ends_agree() {
    let (c, a) = pair(&keys(1).with_plaintext(true), &keys(1)).await;
    assert!(c.unwrap().cipher.is_some() && a.unwrap().cipher.is_some());
    let (c, a) = pair(&keys(1), &keys(1).with_plaintext(true)).await;
    assert!(c.unwrap().cipher.is_some() && a.unwrap().cipher.is_some());
    let (c, a) = pair(&keys(1).with_plaintext(true), &keys(1).with_plaintext(true)).await;
    assert!(c.unwrap().cipher.is_none() && a.unwrap().cipher.is_none());
}

#[tokio::test]
async fn host_keys_admit_allowed_peers_and_name_them() {
    let (src, agent) = (host(1), host(2));
    let c = with_id(keys(1), &src, &[&agent]);
    let a = with_id(keys(1), &agent, &[&src]);
    let (rc, ra) = pair(&c, &a).await;
    assert_eq!(rc.unwrap().peer, Some(agent.public().to_string()));
    assert_eq!(ra.unwrap().peer, Some(src.public().to_string()));
}

#[tokio::test]
async fn a_key_not_on_the_list_is_refused_and_removal_revokes() {
    let (src, agent, other) = (host(1), host(2), host(3));
    // The agent lists only `other`: the source is refused.
    let c = with_id(keys(1), &src, &[&agent]);
    let a = with_id(keys(1), &agent, &[&other]);
    let (rc, ra) = pair(&c, &a).await;
    assert!(
        matches!(ra, Err(ConnError::Auth(AuthError::NotAllowed(_)))),
        "{}",
        reason(&ra)
    );
    assert!(reason(&rc).contains("allow list"), "{}", reason(&rc));
    // The source does not list the agent: it refuses to talk to it.
    let c = with_id(keys(1), &src, &[&other]);
    let a = with_id(keys(1), &agent, &[&src]);
    let (rc, _) = pair(&c, &a).await;
    assert!(
        matches!(rc, Err(ConnError::Auth(AuthError::NotAllowed(_)))),
        "{}",
        reason(&rc)
    );
    // An allowed key without the secret is refused too.
    let c = with_id(keys(9), &src, &[&agent]);
    let a = with_id(keys(1), &agent, &[&src]);
    let (_, ra) = pair(&c, &a).await;
    assert!(
        matches!(ra, Err(ConnError::Auth(AuthError::WrongSecret))),
        "{}",
        reason(&ra)
    );
}

#[tokio::test]
async fn an_agent_with_keys_refuses_a_peer_with_the_secret_alone() {
    let a = with_id(keys(1), &host(2), &[&host(1)]);
    let (rc, ra) = pair(&keys(1), &a).await;
    assert!(matches!(ra, Err(ConnError::Auth(AuthError::Mode(_)))));
    assert!(reason(&rc).contains("host key"), "{}", reason(&rc));
}

/// Sealed streams carry bytes of any length both ways; a flipped bit ends the stream.
#[tokio::test]
async fn sealed_streams_round_trip_and_reject_tampering() {
    let (c, a) = pair(&keys(1), &keys(1)).await;
    let (c, a) = (c.unwrap().cipher.unwrap(), a.unwrap().cipher.unwrap());
    let (x, y) = tokio::io::duplex(1 << 20);
    let (mut x, mut y) = (Sealed::new(x, c), Sealed::new(y, a));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let d2 = data.clone();
    let w = tokio::spawn(async move {
        x.write_all(&d2).await.unwrap();
        x.flush().await.unwrap();
        x.shutdown().await.unwrap();
        x
    });
    let mut got = Vec::new();
    y.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, data);
    let mut x = w.await.unwrap();
    // The other way.
    y.write_all(b"back").await.unwrap();
    y.flush().await.unwrap();
    let mut b = [0u8; 4];
    x.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"back");

    // A record with a flipped bit does not decrypt.
    let (c, a) = pair(&keys(1), &keys(1)).await;
    let (c, a) = (c.unwrap().cipher.unwrap(), a.unwrap().cipher.unwrap());
    let mut raw = Vec::new();
    let mut w = Sealed::new(&mut raw, c);
    w.write_all(b"payload").await.unwrap();
    w.flush().await.unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 1;
    let mut r = Sealed::new(&raw[..], a);
    let mut out = Vec::new();
    let e = r.read_to_end(&mut out).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(out.is_empty());
}

/// Nothing larger than a handshake frame is read before the peer is admitted.
#[tokio::test]
async fn a_large_frame_in_the_handshake_is_refused_unread() {
    let (mut x, mut y) = tokio::io::duplex(1 << 16);
    let hello = Frame::Hello {
        version: VERSION,
        nonce: [0; 16],
    };
    transport::write_frame(&mut x, &hello).await.unwrap();
    x.write_all(&(16u32 << 20).to_be_bytes()).await.unwrap();
    let r = accept(&mut y, &keys(1)).await;
    assert!(
        matches!(
            r,
            Err(ConnError::Wire(
                bulkcast_proto::wire::WireError::TooLarge { max, .. }
            )) if max == transport::HANDSHAKE_MAX_FRAME
        ),
        "{}",
        reason(&r)
    );
}

/// An empty record (which this side never writes, but a peer may) is not the end of the stream.
#[tokio::test]
async fn an_empty_record_is_not_the_end_of_the_stream() {
    let (c, a) = pair(&keys(1), &keys(1)).await;
    let (c, a) = (c.unwrap().cipher.unwrap(), a.unwrap().cipher.unwrap());
    let mut raw = Vec::new();
    for (nonce, payload) in [(0u64, &b""[..]), (1, b"x")] {
        let mut rec = vec![0u8; payload.len() + 16];
        let n = c.0.write_message(nonce, payload, &mut rec).unwrap();
        raw.extend_from_slice(&(n as u16).to_be_bytes());
        raw.extend_from_slice(&rec[..n]);
    }
    let mut r = Sealed::new(&raw[..], a);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"x");
}
