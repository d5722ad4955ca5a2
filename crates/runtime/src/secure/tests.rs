use super::*;
use bulkcast_proto::auth::Secret;
use bulkcast_proto::identity::{AllowList, HostKey, Identity};
use std::io;
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

/// Both ends of a finished NN handshake, each as snow's transport state and as our cipher:
/// `(initiator's snow, initiator's cipher, responder's snow, responder's cipher)`.
fn snow_pair() -> (
    snow::StatelessTransportState,
    Cipher,
    snow::StatelessTransportState,
    Cipher,
) {
    let k = keys(1);
    let (mut i, mut r) = (
        handshake(MODE_SECRET, &k, true).unwrap(),
        handshake(MODE_SECRET, &k, false).unwrap(),
    );
    let (mut m, mut p) = ([0u8; 512], [0u8; 512]);
    let n = i.write_message(&[], &mut m).unwrap();
    r.read_message(&m[..n], &mut p).unwrap();
    let n = r.write_message(&[], &mut m).unwrap();
    i.read_message(&m[..n], &mut p).unwrap();
    let (ci, cr) = (
        Cipher::from_split(true, i.dangerously_get_raw_split()),
        Cipher::from_split(false, r.dangerously_get_raw_split()),
    );
    (
        i.into_stateless_transport_mode().unwrap(),
        ci,
        r.into_stateless_transport_mode().unwrap(),
        cr,
    )
}

/// Records as snow's transport mode writes them, numbered from `first`.
fn snow_records(t: &snow::StatelessTransportState, first: u64, payloads: &[&[u8]]) -> Vec<u8> {
    let mut raw = Vec::new();
    for (k, payload) in payloads.iter().enumerate() {
        let mut rec = vec![0u8; payload.len() + 16];
        let n = t
            .write_message(first + k as u64, payload, &mut rec)
            .unwrap();
        raw.extend_from_slice(&(n as u16).to_be_bytes());
        raw.extend_from_slice(&rec[..n]);
    }
    raw
}

/// An empty record (which this side never writes, but a peer may) is not the end of the stream.
#[tokio::test]
async fn an_empty_record_is_not_the_end_of_the_stream() {
    let (ti, _, _, cr) = snow_pair();
    let raw = snow_records(&ti, 0, &[b"", b"x"]);
    let mut r = Sealed::new(&raw[..], cr);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"x");
}

/// The wire format is snow's: records snow seals open here, and records sealed here (several
/// to a write) open with snow, in both directions, numbered from 0 in each.
#[tokio::test]
async fn records_are_snows_transport_messages_both_ways() {
    let (ti, ci, tr, cr) = snow_pair();
    // Initiator (snow) to responder (ring).
    let big: Vec<u8> = (0..MAX_RECORD).map(|i| (i % 7) as u8).collect();
    let raw = snow_records(&ti, 0, &[b"one", &big, b"three"]);
    let mut r = Sealed::new(&raw[..], cr);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, [&b"one"[..], &big, b"three"].concat());
    // Initiator (ring) to responder (snow): one write of more than a batch.
    let data: Vec<u8> = (0..(BATCH + 1) * MAX_RECORD + 5)
        .map(|i| (i % 251) as u8)
        .collect();
    let mut raw = Vec::new();
    let mut w = Sealed::new(&mut raw, ci);
    let took = w.write(&data).await.unwrap();
    assert_eq!(took, BATCH * MAX_RECORD, "a write seals at most a batch");
    w.write_all(&data[took..]).await.unwrap();
    w.flush().await.unwrap();
    let (mut at, mut nonce, mut got) = (0, 0u64, Vec::new());
    while at < raw.len() {
        let len = usize::from(u16::from_be_bytes([raw[at], raw[at + 1]]));
        let mut p = vec![0u8; len];
        let n = tr
            .read_message(nonce, &raw[at + 2..at + 2 + len], &mut p)
            .unwrap();
        got.extend_from_slice(&p[..n]);
        at += 2 + len;
        nonce += 1;
    }
    assert_eq!(got, data);
    assert_eq!(nonce, BATCH as u64 + 2);
}

/// Each record opens only under its own number: a replayed, dropped or reordered record ends
/// the stream, and the numbers' last value is never used.
#[tokio::test]
async fn records_open_only_in_order_and_numbers_end() {
    let (ti, _, _, cr) = snow_pair();
    let recs: Vec<Vec<u8>> = (0..3u64)
        .map(|n| snow_records(&ti, n, &[format!("r{n}").as_bytes()]))
        .collect();
    for (name, order) in [
        ("replayed", vec![0, 0]),
        ("dropped", vec![0, 2]),
        ("reordered", vec![1, 0]),
    ] {
        let raw: Vec<u8> = order.iter().flat_map(|&k| recs[k].clone()).collect();
        let mut r = Sealed::new(&raw[..], cr.clone());
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{name}");
        assert_eq!(out, b"r0"[..usize::from(order[0] == 0) * 2], "{name}");
    }
    // The number before the last seals and opens; the last is refused on both sides.
    let (_, ci, _, cr) = snow_pair();
    let mut raw = Vec::new();
    let mut w = Sealed::new(&mut raw, ci);
    w.set_nonces(u64::MAX - 1);
    w.write_all(b"last").await.unwrap();
    let e = w.write_all(b"one too many").await.unwrap_err();
    assert!(e.to_string().contains("exhausted"), "{e}");
    let mut r = Sealed::new(&raw[..], cr);
    r.set_nonces(u64::MAX - 1);
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"last");
}
