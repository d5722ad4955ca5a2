//! The multicast pacer of `feed serve`: a thread of its own, sending runs of datagrams.
//!
//! At 100 Mbit/s a datagram falls due every 120 us. As a task on the runtime the pacer sent
//! one per turn: a lock, a read, a seal and a `send_to` whose readiness woke a second worker
//! each time, on a 1 ms timer; on a LAN of 8 receivers sharing the source's CPU that held the
//! group at about half its rate. The thread takes every datagram due at once (up to a run),
//! hands them to the kernel in one call ([`crate::mcast::batch`]) on a blocking socket, and
//! sleeps until the next is due or the server is poked; the pusher's credit
//! (`proto::feed::push`) makes up for a late wake.

use std::fs::File;
use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bulkcast_proto::feed::fec::ParityCache;
use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::push::PushOut;
use bulkcast_proto::feed::seal::DgramWriter;

use super::disk::QueueDir;
use super::now_us;
use super::serve::{count_sent, read_block, Ctx};
use crate::mcast::batch::Batch;

/// Least sleep between runs (us): credit covers the time, and the thread wakes at most a
/// thousand times a second rather than once a datagram.
const LEAST_WAIT: u64 = 1_000;
/// Longest sleep when nothing is due: the pusher's heartbeat is slower.
const MOST_WAIT: u64 = 200_000;

/// Starts the pacing thread; it ends once the server (`ctx`) is gone.
pub(super) fn start(
    ctx: &Arc<Ctx>,
    sock: UdpSocket,
    group: SocketAddrV4,
    writer: DgramWriter,
) -> io::Result<std::thread::Thread> {
    let weak = Arc::downgrade(ctx);
    let h = std::thread::Builder::new()
        .name("feed-pacer".into())
        .spawn(move || run(weak, Batch::new(sock, group), writer))?;
    Ok(h.thread().clone())
}

/// The only writer of the group's datagrams in this process, so every one gets its own
/// number under the run's key.
fn run(ctx: Weak<Ctx>, mut batch: Batch, mut writer: DgramWriter) {
    let mut reader = Reader::default();
    let mut dgram = Vec::with_capacity(2048);
    let mut failing = false;
    while let Some(ctx) = ctx.upgrade() {
        let now = now_us();
        let (due, next) = {
            let mut s = ctx.lock();
            let due: Vec<PushOut> = std::iter::from_fn(|| s.poll_multicast(now))
                .take(Batch::MAX)
                .collect();
            (due, s.multicast_timeout())
        };
        let more = due.len() == Batch::MAX;
        let mut result = Ok(());
        for out in due {
            let Some(msg) = reader.message(&ctx.dir, out) else {
                // Its number goes unused: the pusher counted it.
                writer.skip();
                continue;
            };
            writer.write(&msg, &mut dgram);
            result = result.and(batch.push(&dgram));
            count_sent(&msg, "multicast");
        }
        result = result.and(batch.flush());
        drop(ctx);
        report(&mut failing, result);
        if !more {
            let wait = next.map_or(MOST_WAIT, |t| t.saturating_sub(now));
            std::thread::park_timeout(Duration::from_micros(wait.clamp(LEAST_WAIT, MOST_WAIT)));
        }
    }
}

/// Logs a failing send once (receivers repair what it lost; a lasting failure, such as no
/// route to the group, shows as their stall), and slows the thread while it lasts.
fn report(failing: &mut bool, result: io::Result<()>) {
    match result {
        Ok(()) if *failing => {
            tracing::info!("multicast: sending again");
            *failing = false;
        }
        Ok(()) => {}
        Err(e) => {
            if !*failing {
                tracing::warn!("multicast: {e}");
            }
            *failing = true;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Reads what the pusher chose from the queue on disk.
#[derive(Default)]
struct Reader {
    /// The last product's file, kept open.
    file: Option<(u64, File)>,
    parity: ParityCache,
}

impl Reader {
    /// The message for `out`; `None` when its product cannot be read (evicted before it was
    /// opened, a disk error): receivers repair or are told it is gone.
    fn message(&mut self, dir: &QueueDir, out: PushOut) -> Option<Msg> {
        match out {
            PushOut::Msg(m) => Some(m),
            PushOut::Block { seq, offset, len } => {
                match read_block(dir, &mut self.file, seq, offset, len) {
                    Ok(data) => Some(Msg::Data { seq, offset, data }),
                    Err(e) => {
                        tracing::debug!("multicast: product {seq} unreadable ({e})");
                        None
                    }
                }
            }
            PushOut::Symbol {
                seq,
                layout,
                block,
                index,
            } => {
                let file = &mut self.file;
                let read = |off: u64, len: u64| {
                    read_block(dir, file, seq, off, len as u32).map(|b| b.to_vec())
                };
                match self.parity.parity(seq, &layout, block, index, read) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::debug!("multicast: no parity of product {seq} ({e})");
                        None
                    }
                }
            }
        }
    }
}
