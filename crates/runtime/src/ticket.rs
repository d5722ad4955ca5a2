//! Ticket mode: the sender prints a ticket, receivers join with it, the send starts when enough
//! have joined. A ticket carries a secret drawn for its session alone (never the fleet's
//! `BULKCAST_SECRET` or a host key): it admits its holder to that session while the sender
//! gathers receivers, and to nothing else, before or after. It is still shared like a password
//! while the session runs.
//!
//! ```text
//! bc1/<secret: 64 hex>/<session: 16 hex>/<sender host:port>
//! ```
//!
//! A joining receiver listens on an ephemeral port and says where in its `Join`; once the
//! sender has its receivers it plans the tree and every parent connects to its children, as
//! with agents, so the relay path is the same code.

use std::net::SocketAddr;
use std::time::Duration;

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::wire::{Frame, Open, SessionId};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use crate::agent::{self, AgentConfig, SessionError};
use crate::store::Target;
use crate::transport::{self, ConnError, Stream};

/// A parsed ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The session secret.
    pub secret: Secret,
    /// The session id.
    pub session: SessionId,
    /// Where the sender takes joins.
    pub addr: String,
}

/// Why a ticket did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a bulkcast ticket (expected bc1/<secret>/<session>/<host:port>)")]
pub struct BadTicket;

impl Ticket {
    /// Parses the printed form.
    pub fn parse(s: &str) -> Result<Ticket, BadTicket> {
        let mut it = s.trim().splitn(4, '/');
        let (Some("bc1"), Some(secret), Some(session), Some(addr)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(BadTicket);
        };
        Ok(Ticket {
            secret: Secret::from_hex(secret).map_err(|_| BadTicket)?,
            session: u64::from_str_radix(session, 16).map_err(|_| BadTicket)?,
            addr: addr.to_string(),
        })
    }
}

impl std::fmt::Display for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bc1/{}/{:016x}/{}",
            self.secret.to_hex(),
            self.session,
            self.addr
        )
    }
}

/// A send's offer to receivers that join with a ticket (`send --expect`): the listener for
/// their joins, and the ticket to hand them.
pub struct Offer {
    listener: TcpListener,
    keys: Keys,
    ticket: Ticket,
}

impl Offer {
    /// Listens on `listen` for joins to `session`. The ticket names `advertise` (default: the
    /// address bound, or this host's name and the port where that is unspecified) and a key for
    /// this session alone, never a fleet's secret: the ticket is handed around, and must admit
    /// nobody to anything after this session.
    pub async fn listen(
        listen: &str,
        advertise: Option<&str>,
        plaintext: bool,
        tuning: &transport::TcpTuning,
        session: SessionId,
    ) -> std::io::Result<Offer> {
        let secret = Secret::from_bytes(rand::random());
        let keys = Keys::derive(&secret).with_plaintext(plaintext);
        let listener = transport::listen(listen, tuning).await?;
        let local = listener.local_addr()?;
        let addr = match advertise {
            Some(a) => a.to_string(),
            None if !local.ip().is_unspecified() => local.to_string(),
            None => format!("{}:{}", hostname(), local.port()),
        };
        let ticket = Ticket {
            secret,
            session,
            addr,
        };
        Ok(Offer {
            listener,
            keys,
            ticket,
        })
    }

    /// The ticket receivers join with (`bulkcast recv TICKET`).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// Waits (at most `timeout`) for `n` receivers to join: those that did, in the order they
    /// joined, as a send's hosts, and the session's keys. Send to them with
    /// [`crate::Send::ticket_receivers`] and this session id.
    pub async fn gather(
        self,
        n: usize,
        timeout: Duration,
    ) -> (bulkcast_proto::hosts::HostsFile, Keys) {
        let hosts = gather(&self.listener, &self.keys, n, timeout).await;
        let file = bulkcast_proto::hosts::HostsFile {
            source: None,
            hosts,
        };
        (file, self.keys)
    }
}

/// This host's name, for a ticket's address.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Sender side: accepts joins until `expect` receivers joined or `deadline` passed, and returns
/// them in the order they joined. Connections that fail admission are refused and logged.
pub async fn gather(
    listener: &TcpListener,
    keys: &Keys,
    expect: usize,
    deadline: Duration,
) -> Vec<HostSpec> {
    let (tx, mut rx) = mpsc::channel::<HostSpec>(64);
    let end = tokio::time::Instant::now() + deadline;
    let mut joined: Vec<HostSpec> = Vec::new();
    let mut pending = Vec::new();
    let gate = crate::gate::Gate::default();
    while joined.len() < expect {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            Some(h) = rx.recv() => {
                if joined.iter().any(|j| j.addr == h.addr) {
                    continue;
                }
                let mut h = h;
                if joined.iter().any(|j| j.name == h.name) {
                    h.name = format!("{}#{}", h.name, joined.len() + 1);
                }
                tracing::info!("{} joined ({} of {expect})", h.name, joined.len() + 1);
                joined.push(h);
            }
            acc = listener.accept() => {
                let Ok((stream, peer)) = acc else { continue };
                let pass = match gate.enter(peer.ip()) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!("join from {peer} dropped: {e}");
                        continue;
                    }
                };
                let keys = keys.clone();
                let tx = tx.clone();
                let limit = gate.limits().deadline;
                pending.retain(|p: &tokio::task::JoinHandle<()>| !p.is_finished());
                pending.push(tokio::spawn(async move {
                    let mut pass = pass;
                    let joined = tokio::select! {
                        j = tokio::time::timeout(limit, accept_join(stream, peer, &keys)) => j,
                        _ = pass.evicted() => return,
                    };
                    drop(pass);
                    match joined {
                        Ok(Ok(h)) => { let _ = tx.send(h).await; }
                        Ok(Err(e)) => tracing::warn!("join from {peer} refused: {e}"),
                        Err(_) => tracing::warn!("join from {peer} refused: too slow"),
                    }
                }));
            }
        }
    }
    for p in pending {
        p.abort();
    }
    joined
}

async fn accept_join(s: TcpStream, peer: SocketAddr, keys: &Keys) -> Result<HostSpec, ConnError> {
    let mut s = transport::handshake_accept(Stream::Tcp(s), keys).await?;
    match transport::expect_frame(&mut s, "waiting for Join").await? {
        Frame::Join { name, listen } => {
            // The receiver may listen on a wildcard address; use the address it joined from.
            let listen = match listen.parse::<SocketAddr>() {
                Ok(a) if a.ip().is_unspecified() => {
                    SocketAddr::new(peer.ip(), a.port()).to_string()
                }
                _ => listen,
            };
            let mut h = HostSpec::from_addr(&listen);
            if !name.is_empty() {
                h.name = name;
            }
            Ok(h)
        }
        other => Err(ConnError::Unexpected(other.kind())),
    }
}

/// Receiver side: joins the session of `ticket` and receives it into `target`. Waits at most
/// `wait` for the sender to start.
pub async fn join(
    ticket: &Ticket,
    name: &str,
    target: Target,
    cfg: &AgentConfig,
    wait: Duration,
) -> Result<agent::Served, SessionError> {
    // The ticket's control connection is TCP: its local address is where we listen.
    let s = transport::connect_tcp(&ticket.addr, &cfg.tuning).await?;
    // Listen where the sender can reach us: on the address our connection to it came from.
    let local = s.local_addr().map_err(ConnError::Io)?;
    let s = Stream::Tcp(s);
    let listener = transport::listen(&SocketAddr::new(local.ip(), 0).to_string(), &cfg.tuning)
        .await
        .map_err(ConnError::Io)?;
    let listen = listener.local_addr().map_err(ConnError::Io)?.to_string();
    let mut s = transport::handshake_connect(s, &cfg.keys).await?;
    transport::write_frame(
        &mut s,
        &Frame::Join {
            name: name.to_string(),
            listen,
        },
    )
    .await
    .map_err(ConnError::Io)?;
    tracing::info!(
        "joined session {:016x}; waiting for the sender to start",
        ticket.session
    );
    // The sender's connections come to this listener: the edge's first carries `Open`, the
    // others `Attach`, in any order (the sender dials them at once). Each is read up to its
    // first frame; the first `Open` is the session, `Attach`es wait in `attachments` until
    // the session registers its edge.
    let (open_tx, mut open_rx) = mpsc::channel::<(Stream, Open)>(1);
    let routing = {
        let cfg = cfg.clone();
        tokio::spawn(async move {
            while let Ok((s, peer)) = listener.accept().await {
                let cfg = cfg.clone();
                let open_tx = open_tx.clone();
                tokio::spawn(async move {
                    if let Err(e) = route(s, &cfg, open_tx).await {
                        tracing::warn!("connection from {peer}: {e}");
                    }
                });
            }
        })
    };
    let first = tokio::time::timeout(wait, open_rx.recv()).await;
    drop(s);
    let r = match first {
        Ok(Some((stream, open))) => {
            // Only one session per ticket: later `Open`s find the channel closed, and one that
            // is already queued is refused here.
            open_rx.close();
            while let Ok((mut other, _)) = open_rx.try_recv() {
                refuse(&mut other).await;
            }
            agent::serve_open(stream, open, cfg, Some((ticket.session, target))).await
        }
        Ok(None) | Err(_) => {
            Err(ConnError::Timeout("waiting for the sender to start the session").into())
        }
    };
    routing.abort();
    r
}

const SESSION_TAKEN: &str = "this receiver's session has started already";

/// Tells the sender of a second `Open` why it is refused.
async fn refuse(s: &mut Stream) {
    let reason = SESSION_TAKEN.to_string();
    let _ = transport::write_frame(s, &Frame::Error { reason }).await;
}

/// One connection from the sender to a ticket receiver: admitted, then its first frame decides.
async fn route(
    s: TcpStream,
    cfg: &AgentConfig,
    open_tx: mpsc::Sender<(Stream, Open)>,
) -> Result<(), SessionError> {
    let mut s = transport::handshake_accept(Stream::Tcp(s), &cfg.keys).await?;
    match transport::expect_frame(&mut s, "waiting for the session set-up").await? {
        Frame::Open(o) => match open_tx.send((s, o)).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError((mut s, _))) => {
                refuse(&mut s).await;
                Err(SessionError::Refused(SESSION_TAKEN.into()))
            }
        },
        Frame::Attach {
            session,
            token,
            conn,
            ..
        } => cfg
            .attachments
            .deliver(session, token, conn, s)
            .await
            .map_err(|e| SessionError::Refused(e.to_string())),
        // The source asks relays to open their children's connections early; a ticket
        // receiver serves one session and dials its children when that session's `Open`
        // arrives, so the request has nothing to speed up.
        Frame::Dial { .. } => Ok(()),
        other => Err(ConnError::Unexpected(other.kind()).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bulkcast_proto::manifest::{Manifest, ObjectKind};

    #[tokio::test]
    async fn an_offer_advertises_where_it_listens_with_a_fresh_secret() {
        let tuning = transport::TcpTuning::default();
        let o = Offer::listen("127.0.0.1:0", None, false, &tuning, 7)
            .await
            .unwrap();
        let port = o.listener.local_addr().unwrap().port();
        assert_eq!(o.ticket().addr, format!("127.0.0.1:{port}"));
        assert_eq!(o.ticket().session, 7);
        // The printed ticket parses back to the same.
        assert_eq!(&Ticket::parse(&o.ticket().to_string()).unwrap(), o.ticket());
        let other = Offer::listen("0.0.0.0:0", Some("gw:9"), false, &tuning, 7)
            .await
            .unwrap();
        assert_eq!(other.ticket().addr, "gw:9");
        assert_ne!(other.ticket().secret, o.ticket().secret);
        let any = Offer::listen("0.0.0.0:0", None, false, &tuning, 7)
            .await
            .unwrap();
        assert!(any.ticket().addr.starts_with(&format!("{}:", hostname())));
        // Nobody joins: no hosts.
        let (file, _) = o.gather(2, Duration::from_millis(50)).await;
        assert!(file.hosts.is_empty());
    }

    /// The sender dials a spread edge's connections at once, so an `Attach` can reach a
    /// ticket receiver before the `Open`: the receiver must still take the `Open` as its
    /// session (here one it refuses, which names the `Open`'s fault).
    #[tokio::test]
    async fn an_attach_before_the_open_does_not_take_the_session() {
        let secret = Secret::from_bytes([3; 32]);
        let keys = Keys::derive(&secret);
        let sender = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ticket = Ticket {
            secret,
            session: 0x5e55,
            addr: sender.local_addr().unwrap().to_string(),
        };
        let cfg = AgentConfig {
            dir: std::env::temp_dir(),
            keys: keys.clone(),
            node: Default::default(),
            tuning: Default::default(),
            stored: None,
            groups: Default::default(),
            attachments: Default::default(),
            predialed: Default::default(),
            stdout: false,
            swarms: Default::default(),
            partials: Default::default(),
            running: Default::default(),
            live: Default::default(),
            io: Default::default(),
        };
        let fake_sender = async {
            let (j, _) = sender.accept().await.unwrap();
            let mut j = transport::handshake_accept(Stream::Tcp(j), &keys)
                .await
                .unwrap();
            let Frame::Join { listen, .. } = transport::expect_frame(&mut j, "join").await.unwrap()
            else {
                panic!("expected Join");
            };
            let dial = || async {
                let c = TcpStream::connect(&listen).await.unwrap();
                transport::handshake_connect(Stream::Tcp(c), &keys)
                    .await
                    .unwrap()
            };
            let mut a = dial().await;
            let attach = Frame::Attach {
                session: 0x5e55,
                token: 1,
                conn: 1,
                window: 16,
            };
            transport::write_frame(&mut a, &attach).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut o = dial().await;
            let open = Frame::Open(Open {
                session: 0x5e55,
                node: 1,
                chunk_size: 1 << 16,
                stall_timeout_ms: 1000,
                cc: String::new(),
                manifest: Manifest {
                    name: "x".into(),
                    kind: ObjectKind::File,
                    total_len: Some(1),
                    entries: vec![],
                    mode: 0,
                    mtime: None,
                },
                members: vec![],
                stripe: None,
                edges: Default::default(),
                sig: None,
            });
            transport::write_frame(&mut o, &open).await.unwrap();
            (j, a, o)
        };
        let target = Target::Dir(std::env::temp_dir());
        let (r, _conns) = tokio::join!(
            join(&ticket, "r", target, &cfg, Duration::from_secs(5)),
            fake_sender
        );
        match r {
            Err(SessionError::Refused(e)) => assert!(e.contains("recipient"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ticket_round_trip_and_rejects() {
        let t = Ticket {
            secret: Secret::from_bytes([7; 32]),
            session: 0xabc,
            addr: "127.0.0.1:9000".into(),
        };
        assert_eq!(Ticket::parse(&t.to_string()).unwrap(), t);
        assert_eq!(Ticket::parse("bc1/xyz/1/a:1"), Err(BadTicket));
        assert_eq!(Ticket::parse("hello"), Err(BadTicket));
    }
}
