//! The multicast pacer of `feed serve`: a thread of its own, sending runs of datagrams.
//!
//! At 100 Mbit/s a datagram falls due every 120 us. As a task on the runtime the pacer sent
//! one per turn: a lock, a read, a seal and a `send_to` whose readiness woke a second worker
//! each time, on a 1 ms timer; on a LAN of 8 receivers sharing the source's CPU that held the
//! group at about half its rate. The thread takes every datagram due at once (up to a run),
//! hands them to the kernel in one call ([`crate::mcast::batch`]) on a blocking socket, and
//! sleeps until the next is due or the server is poked; the pusher's credit
//! (`proto::feed::push`) makes up for a late wake.
//!
//! Parity is coded on a second thread, the *coder*: when a block's first pass ends while the
//! group is losing symbols, the pusher says so ([`PushOut::Block`]'s `code`) and the coder
//! reads and codes the block into the cache the pacer takes parity from. Coded on the
//! pacer's thread when first asked for (as before), a block of 1,024 symbols held the pacer
//! past its burst credit: at 1% loss on a busy 2-core host it lost 114 ms of sending in a
//! 9.4 s run (`feed status`'s `multicast_late_ms`), 1.2% of the rate.

use std::fs::File;
use std::io;
use std::net::{SocketAddrV4, UdpSocket};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bulkcast_proto::feed::fec::ParityCache;
use bulkcast_proto::feed::msg::Msg;
use bulkcast_proto::feed::push::PushOut;
use bulkcast_proto::feed::seal::DgramWriter;
use bulkcast_proto::mcast::layout::Layout;
use bulkcast_proto::mcast::sender::CodedBlock;

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
    let cache = Arc::new(Mutex::new(ParityCache::default()));
    let (to_coder, jobs) = sync_channel(CODER_QUEUE);
    let coder_dir = ctx.dir.clone();
    let coder_cache = cache.clone();
    std::thread::Builder::new()
        .name("feed-coder".into())
        .spawn(move || code(&coder_dir, &coder_cache, &jobs))?;
    let h = std::thread::Builder::new()
        .name("feed-pacer".into())
        .spawn(move || run(weak, Batch::new(sock, group), writer, cache, to_coder))?;
    Ok(h.thread().clone())
}

/// Blocks waiting for the coder; past this, a block is coded when first asked for.
const CODER_QUEUE: usize = 64;

/// A block for the coder: product, cut, block.
type Job = (u64, Layout, u32);

/// The coder's loop: reads and codes each block it is given into `cache` (outside its lock),
/// until the pacer, which holds the jobs' sender, ends.
fn code(dir: &QueueDir, cache: &Mutex<ParityCache>, jobs: &Receiver<Job>) {
    let mut file = None;
    while let Ok((seq, layout, block)) = jobs.recv() {
        if lock(cache).contains(seq, block) {
            continue;
        }
        let (off, len) = layout.block_range(block);
        let coded = read_block(dir, &mut file, seq, off, len as u32).and_then(|data| {
            let mut c = CodedBlock::new(&layout, block, data.to_vec());
            c.code(&layout).map_err(io::Error::other)?;
            Ok(c)
        });
        match coded {
            Ok(c) => lock(cache).insert(seq, block, c),
            // The pacer codes it when asked, or finds it gone as well.
            Err(e) => tracing::debug!("multicast: block {block} of product {seq} not coded: {e}"),
        }
    }
}

fn lock(cache: &Mutex<ParityCache>) -> MutexGuard<'_, ParityCache> {
    // Every update is a single call: a panic elsewhere leaves the cache usable.
    cache.lock().unwrap_or_else(|p| p.into_inner())
}

/// The only writer of the group's datagrams in this process, so every one gets its own
/// number under the run's key.
fn run(
    ctx: Weak<Ctx>,
    mut batch: Batch,
    mut writer: DgramWriter,
    parity: Arc<Mutex<ParityCache>>,
    coder: SyncSender<Job>,
) {
    let mut reader = Reader {
        file: None,
        parity,
        coder,
    };
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
struct Reader {
    /// The last product's file, kept open.
    file: Option<(u64, File)>,
    /// Blocks coded for parity, shared with the coder.
    parity: Arc<Mutex<ParityCache>>,
    /// Blocks to code ahead.
    coder: SyncSender<Job>,
}

impl Reader {
    /// The message for `out`; `None` when its product cannot be read (evicted before it was
    /// opened, a disk error): receivers repair or are told it is gone.
    fn message(&mut self, dir: &QueueDir, out: PushOut) -> Option<Msg> {
        match out {
            PushOut::Msg(m) => Some(m),
            PushOut::Block {
                seq,
                offset,
                len,
                code,
            } => {
                if let Some((layout, block)) = code {
                    // A full queue drops the hint: the block is coded when asked for.
                    let _ = self.coder.try_send((seq, layout, block));
                }
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
                match lock(&self.parity).parity(seq, &layout, block, index, read) {
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
