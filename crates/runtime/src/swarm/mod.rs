//! Swarming on the network: the event loop around one [`SwarmNode`] (MOB, the BitTorrent-style
//! baseline, the tree+pull hybrid), for the source ([`send`]) and for an agent ([`serve`]).
//!
//! # Set-up and connections
//! The source dials every agent, passes the handshake and sends a
//! [`SwarmSetup::Open`]: session, chunk size, strategy, seed, manifest and every member (node
//! id, name, address, cluster label from the hosts file's `site`, tree parent for the
//! strategies that push). That connection stays open: it carries the member's progress
//! (`Ack`), its final [`SwarmSetup::Report`] (or `Failed`), and, when the source and the
//! member are swarm peers, the swarm traffic between them.
//!
//! Every member builds the same [`SwarmNode`]s for every member (same seed), so each knows
//! every member's [`SwarmNode::connect_to`]: two members are peers when either names the
//! other. Between two agents the lower node id dials, passes the handshake and sends
//! [`SwarmSetup::Peer`] (session, its node id); the agent's accept loop hands the connection
//! to the running session through [`SwarmSessions`] (waiting a little when the peer was
//! faster than the source's `Open`). The source never listens: its links are the set-up
//! connections.
//!
//! # The loop
//! One reader and one writer task per connection, the writer shared with [`crate::driver`]
//! ([`crate::writer`]). Readers verify
//! chunks themselves (off the event loop) and pass them on as verified; the loop writes each
//! piece to the [`Store`] (temporary name, moved into place once every piece is stored),
//! feeds the node, and hands each writer the node's control frames ([`SwarmNode::poll_control`])
//! and at most [`WRITE_SLOTS`] pieces ([`SwarmNode::poll_transmit`]).
//! A piece is served from memory until it is stored, then from the file (mapped, handed to
//! `sendfile`: see [`crate::mapped`]); the source serves a one-file object from its input
//! file the same way. Pieces not yet stored are bounded ([`UNSTORED_BUDGET`]): past it the
//! loop stops reading from peers until the disk catches up. Once the copy is in place the agent
//! reports the bytes it received from each peer; it ends when the completion tree says every
//! member is done, or when the source closes the session. The source ends when every agent
//! reported (or failed) and the completion tree is done.
//!
//! # Limitations
//! - A directory's pieces are held in memory on every member (they straddle its files):
//!   directories above [`MAX_SWARM_BYTES`] are refused with an error (send a tar of it, or use
//!   a tree); streams of unknown length cannot be swarmed. The source reads (hashes) the
//!   whole object before the session starts.
//! - A member is removed from the session ([`SwarmSetup::Lost`] from the source, then
//!   [`SwarmNode::handle_member_lost`] everywhere) only when the source learns it failed: it
//!   could not be reached, it reported a failure, or its set-up connection dropped. In the
//!   last case the source dials it again (see [`SourceSession::poll_redial`]) and, if its
//!   agent answers, re-admits it ([`SwarmSetup::Back`]): it resumes from its copy. A member
//!   that stops moving while its connection stays up holds up its peers until the source's
//!   stall timeout ends the session; a connection between two agents that drops is only a
//!   lost peer (its requests move elsewhere), never retried.
//!
//! [`SourceSession::poll_redial`]: bulkcast_proto::swarm::session::SourceSession::poll_redial
//! - One connection per pair of members; no spreading, no extra paths.

mod agent;
mod net;
mod source;

pub use agent::serve;
pub use source::send;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::transport::Stream;
use bulkcast_proto::auth::Keys;
use bulkcast_proto::hosts::{HostSpec, SourceSpec};
use bulkcast_proto::manifest::{Manifest, ObjectKind};
use bulkcast_proto::node::CHUNK_SIZE_RANGE;
use bulkcast_proto::swarm::{PieceHashes, Strategy, SwarmConfig, SwarmEvent, SwarmNode, Transmit};
use bulkcast_proto::tree::{NodeId, Tree};
use bulkcast_proto::wire::{
    self, Chunk, Frame, SessionId, SourceSig, SwarmMember, SwarmOpen, SwarmSetup, NO_PARENT,
};
use tokio::io::AsyncRead;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::input::{Input, InputEvent};
use crate::report::{ClusterReport, PeerBytes, Report, Status};
use crate::store::{Disk, Store, StoreEvent, Target};
use crate::transport::{self, TcpTuning};

/// Largest directory a swarm session takes: every member holds its pieces in memory (a file
/// has no limit: its pieces are served from disk).
pub const MAX_SWARM_BYTES: u64 = bulkcast_planner::strategy::MAX_SWARM_BYTES;

pub use crate::writer::WRITE_SLOTS;

/// Unsent bytes a connection's socket may hold (`TCP_NOTSENT_LOWAT`). Requests, haves and
/// cancels share the connection with the pieces going the same way; the kernel's default
/// backlog (megabytes) would hold them back for seconds on a slow WAN link.
const SOCKET_BACKLOG: u32 = 128 << 10;

/// Bytes of verified pieces an agent holds in memory before they are stored; above it, it reads
/// nothing more from its peers until the store catches up.
pub const UNSTORED_BUDGET: u64 = 32 << 20;

/// Events queued from the connection tasks to the loop (each may be a piece).
const EVENT_SLOTS: usize = 32;

/// How long an agent holds a peer's connection that arrived before the source's `Open`.
const EARLY_PEER_WAIT: Duration = Duration::from_secs(10);

/// How often an agent logs its view of each peer, at debug level
/// (`BULKCAST_LOG=info,bulkcast_runtime::swarm=debug`).
const PEER_LOG_EVERY: Duration = Duration::from_secs(1);

/// How often an agent tells the source how many pieces it holds.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The swarm sessions running at an agent, so that connections from other members reach
/// theirs.
#[derive(Clone, Default)]
pub struct SwarmSessions(Arc<Mutex<HashMap<SessionId, PeerSender>>>);

/// Where a session takes the connections of its peers.
type PeerSender = mpsc::UnboundedSender<(NodeId, Stream)>;

impl std::fmt::Debug for SwarmSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SwarmSessions")
    }
}

impl SwarmSessions {
    /// Hands a member's connection (its `Peer` frame already read) to session `session`,
    /// waiting up to 10 s for that session to start here.
    pub async fn deliver(
        &self,
        session: SessionId,
        node: u32,
        stream: Stream,
    ) -> Result<(), SwarmError> {
        let until = Instant::now() + EARLY_PEER_WAIT;
        let mut stream = Some(stream);
        loop {
            {
                let map = self.0.lock().expect("swarm sessions lock");
                if let Some(tx) = map.get(&session) {
                    let s = stream.take().expect("delivered once");
                    return tx
                        .send((node as NodeId, s))
                        .map_err(|_| SwarmError::Ended(session));
                }
            }
            if Instant::now() >= until {
                return Err(SwarmError::NoSession(session));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn register(
        &self,
        session: SessionId,
    ) -> (Registered, mpsc::UnboundedReceiver<(NodeId, Stream)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0
            .lock()
            .expect("swarm sessions lock")
            .insert(session, tx.clone());
        (
            Registered {
                sessions: self.clone(),
                session,
                tx,
            },
            rx,
        )
    }
}

/// Removes a session from [`SwarmSessions`] when it ends, unless a newer instance of it (the
/// member re-admitted by the source after its connection dropped) took its place.
struct Registered {
    sessions: SwarmSessions,
    session: SessionId,
    tx: PeerSender,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut map = self.sessions.0.lock().expect("swarm sessions lock");
        if map
            .get(&self.session)
            .is_some_and(|t| t.same_channel(&self.tx))
        {
            map.remove(&self.session);
        }
    }
}

/// Settings of a swarm send.
#[derive(Debug, Clone)]
pub struct SwarmSendConfig {
    /// The strategy every member runs.
    pub strategy: Strategy,
    /// Chunk (piece) size in bytes.
    pub chunk_size: u32,
    /// A member that makes no progress for this long is given up.
    pub stall_timeout: Duration,
    /// TCP options.
    pub tuning: TcpTuning,
    /// Seed for peer and piece choice.
    pub seed: u64,
}

/// The cluster labels of the source and the hosts: one per distinct `site` (the source's
/// first); hosts without a site share one, a source without one is alone in its own.
pub fn cluster_labels(source: Option<&SourceSpec>, hosts: &[HostSpec]) -> (Vec<u32>, Vec<String>) {
    let mut names: Vec<String> = Vec::new();
    let mut label = |site: String| -> u32 {
        match names.iter().position(|n| *n == site) {
            Some(i) => i as u32,
            None => {
                names.push(site);
                (names.len() - 1) as u32
            }
        }
    };
    let mut labels = vec![label(
        source
            .and_then(|s| s.site.clone())
            .unwrap_or_else(|| "(source)".into()),
    )];
    for h in hosts {
        labels.push(label(h.site.clone().unwrap_or_else(|| "(no site)".into())));
    }
    (labels, names)
}

/// The object's length, when a swarm can take it: of known length, and within
/// [`MAX_SWARM_BYTES`] unless it is one file (`from_disk`: pieces served from the file, not
/// held in memory).
fn check_size(manifest: &Manifest, from_disk: bool) -> Result<u64, SwarmError> {
    let Some(len) = manifest.total_len else {
        return Err(SwarmError::UnknownLength);
    };
    if len > MAX_SWARM_BYTES && !from_disk {
        return Err(SwarmError::TooLarge(len));
    }
    Ok(len)
}

/// Why a swarm session failed, at the source or at an agent.
#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    /// A stream: the swarm strategies need the object's length before they start.
    #[error("the swarm strategies need an input of known length (not a stream): use tree or flat")]
    UnknownLength,
    /// A directory of this many bytes, above [`MAX_SWARM_BYTES`] (every member would hold it
    /// in memory).
    #[error(
        "the swarm strategies hold a directory in memory on every member and take at most \
         {} MiB of it; this one is {} MiB: send it as one file (e.g. a tar), or use tree or \
         balanced",
        MAX_SWARM_BYTES >> 20,
        .0 >> 20
    )]
    TooLarge(u64),
    /// The source could not read its input, or the input changed while it was read.
    #[error("{0}")]
    Input(String),
    /// The set-up does not hold together (tree, members, manifest, chunk size, node id).
    #[error("{0}")]
    SetUp(String),
    /// An agent could not create its copy.
    #[error("cannot store the object: {0}")]
    Store(String),
    /// The session ran and this member failed: the source or a peer broke the protocol or
    /// ended the session, nothing was heard for the stall timeout, or the copy failed.
    #[error("{0}")]
    Failed(String),
    /// A member's connection named a session that did not start here in time.
    #[error("no swarm session {0:016x} here")]
    NoSession(SessionId),
    /// A member's connection named a session that has ended here.
    #[error("swarm session {0:016x} has ended")]
    Ended(SessionId),
}

fn kind_name(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::File => "file",
        ObjectKind::Dir => "dir",
        ObjectKind::Stream => "stream",
    }
}

async fn sleep_until_opt(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}
