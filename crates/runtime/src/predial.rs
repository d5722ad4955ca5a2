//! Every hop of a tree dialled at once: the source sends each relay a `Dial` frame with its
//! children's addresses as soon as the tree is planned, the relay's agent opens those
//! connections (connect and handshake) into a [`PreDialed`] pool, and the relay's driver takes
//! them when the session's `Open` reaches it from its parent.
//!
//! Why: a relay dials its children only once its own parent's `Open` has arrived, so without
//! this the hops of a tree open one level after another, each a connect and a handshake (about
//! 2.5 round trips) after the one above, and every hop below starts its ramp that much later.
//! With the pool, a relay forwards the `Open` on a connection that is already up.
//!
//! A pooled connection is used only while it is fresh ([`FRESH`]): the child waits for the
//! `Open` for at most the handshake timeout, so an older one may be closed at the other end,
//! and the driver dials afresh instead. Connections nobody took are dropped after [`FRESH`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::tree::Tree;
use bulkcast_proto::wire::{Frame, SessionId};
use tokio::sync::oneshot;

use crate::transport::{self, ConnError, Stream, TcpTuning};

/// The most children one `Dial` may name: a relay dials at most this many at once for a peer
/// (a tree's fan-out is far smaller; a larger list is cut, and the rest are dialled as usual).
pub const MAX_DIAL: usize = 64;

/// How long a pooled connection stays usable: well under the child's wait for the `Open`
/// ([`transport::HANDSHAKE_TIMEOUT`]).
pub const FRESH: Duration = Duration::from_secs(5);

type Dialed = Result<(Stream, Instant), ConnError>;
/// Connections being opened or open, by session and child address.
type Pool = HashMap<(SessionId, String), oneshot::Receiver<Dialed>>;

/// Connections a relay's agent opened ahead of its sessions, by session and child address.
#[derive(Clone, Default)]
pub struct PreDialed {
    inner: Arc<Mutex<Pool>>,
}

impl PreDialed {
    /// Opens a connection to each of `addrs` for `session` in the background.
    pub fn dial(&self, session: SessionId, addrs: Vec<String>, keys: &Keys, tuning: &TcpTuning) {
        for addr in addrs.into_iter().take(MAX_DIAL) {
            let (tx, rx) = oneshot::channel();
            self.lock().insert((session, addr.clone()), rx);
            let (keys, tuning, pool) = (keys.clone(), tuning.clone(), self.clone());
            tokio::spawn(async move {
                let dialed = async {
                    let s = transport::connect(&addr, &tuning).await?;
                    let s = transport::handshake_connect(s, &keys).await?;
                    Ok((s, Instant::now()))
                }
                .await;
                if let Err(e) = &dialed {
                    tracing::debug!("pre-dialling {addr} for session {session:016x}: {e}");
                }
                let _ = tx.send(dialed);
                // Nobody took it: close it rather than keep it for a session that went elsewhere.
                tokio::time::sleep(FRESH).await;
                pool.lock().remove(&(session, addr));
            });
        }
    }

    /// The connection opened for `addr` in `session`, once it is up, if one was asked for and
    /// is still fresh; `None` means dial afresh.
    pub async fn take(&self, session: SessionId, addr: &str) -> Option<Stream> {
        let rx = self.lock().remove(&(session, addr.to_string()))?;
        match tokio::time::timeout(FRESH, rx).await {
            Ok(Ok(Ok((s, at)))) if at.elapsed() < FRESH => Some(s),
            _ => None,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for PreDialed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreDialed({} pending)", self.lock().len())
    }
}

/// The `Dial` frames a source sends for `tree` (node `i` is `addrs[i - 1]`, the first address
/// of each host): one per relay below the source, with its children's addresses.
pub fn dial_frames(tree: &Tree, session: SessionId, addrs: &[String]) -> Vec<(String, Frame)> {
    (1..tree.len())
        .filter(|&i| !tree.children(i).is_empty())
        .filter_map(|i| {
            let children: Option<Vec<String>> = tree
                .children(i)
                .iter()
                .map(|&c| addrs.get(c - 1).cloned())
                .collect();
            Some((
                addrs.get(i - 1)?.clone(),
                Frame::Dial {
                    session,
                    addrs: children?,
                },
            ))
        })
        .collect()
}

/// Sends every relay of `tree` its `Dial` frame, all at once, in the background. A relay that
/// cannot be reached is left to the session itself to report.
pub fn send_dials(
    tree: &Tree,
    session: SessionId,
    addrs: &[String],
    keys: &Keys,
    tuning: &TcpTuning,
) {
    for (relay, frame) in dial_frames(tree, session, addrs) {
        let (keys, tuning) = (keys.clone(), tuning.clone());
        tokio::spawn(async move {
            let sent = async {
                let s = transport::connect(&relay, &tuning).await?;
                let mut s = transport::handshake_connect(s, &keys).await?;
                transport::write_frame(&mut s, &frame).await?;
                // The relay closes once it has read the frame; closing first could reset it.
                let _ = tokio::time::timeout(FRESH, transport::read_frame(&mut s, 1024)).await;
                Ok::<_, ConnError>(())
            }
            .await;
            if let Err(e) = sent {
                tracing::debug!("asking {relay} to pre-dial: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_relay_below_the_source_is_asked_to_dial_its_children() {
        // A chain source -> 1 -> 2 -> 3: relays 1 and 2 dial; the source dials 1 itself.
        let chain = Tree::kary(3, 1);
        let addrs: Vec<String> = ["a:1", "b:1", "c:1"].map(String::from).to_vec();
        let frames = dial_frames(&chain, 7, &addrs);
        let got: Vec<(String, Vec<String>)> = frames
            .into_iter()
            .map(|(to, f)| match f {
                Frame::Dial { session: 7, addrs } => (to, addrs),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("a:1".to_string(), vec!["b:1".to_string()]),
                ("b:1".to_string(), vec!["c:1".to_string()]),
            ]
        );
        // A flat tree has no relays.
        assert!(dial_frames(&Tree::flat(3), 7, &addrs).is_empty());
    }
}
