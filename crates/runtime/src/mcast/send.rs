//! The source of a multicast send.
//!
//! 1. A TCP connection (handshake, encryption) to every receiver's agent, an `Open` on it;
//!    each joins the group and says so.
//! 2. Hello datagrams on the group until every receiver has heard one, at most `detect`: a
//!    receiver that did not (no multicast route, a switch or firewall that drops it) is
//!    cancelled and reported, for the caller to send it the file another way.
//! 3. A thread paces the datagrams ([`Sender`]), reading blocks as it goes; block hashes go to
//!    every receiver on its connection, repair requests come back on it, until every
//!    receiver says its copy is in place.

use std::collections::VecDeque;
use std::fs::File;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};

use super::batch::Batch;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use bulkcast_proto::auth::Keys;
use bulkcast_proto::manifest::Manifest;
use bulkcast_proto::mcast::msg::{DgramKind, McastOpen, Nak};
use bulkcast_proto::mcast::probe::censored;
use bulkcast_proto::mcast::seal::{DgramWriter, GroupKey};
use bulkcast_proto::mcast::sender::{
    wire_overhead, CodedBlock, Sender, SenderConfig, SenderStats, Tx, TRAIN_WAIT,
};
use bulkcast_proto::mcast::train::{rate_from, TrainReport};
use bulkcast_proto::mcast::{Layout, McastMsg};
use bulkcast_proto::wire::{self, Frame};
use tokio::sync::mpsc;

use crate::transport::{self, TcpTuning, WriteHalf};

/// Settings of a multicast send.
#[derive(Debug, Clone)]
pub struct McastConfig {
    /// The group, `ADDR:PORT`.
    pub group: SocketAddrV4,
    /// Bits per second on the wire; `None`: measured by the first pass's train
    /// ([`bulkcast_proto::mcast::train`]).
    pub rate_bps: Option<u64>,
    /// Multicast TTL (1: this LAN only).
    pub ttl: u32,
    /// How long receivers have to hear the group before they are sent to another way.
    pub detect: Duration,
    /// Bytes per symbol, symbols per block, most parity per block.
    pub symbol: u32,
    /// Source symbols per block.
    pub k: u32,
    /// Most parity symbols per block.
    pub m: u32,
    /// A receiver silent this long after the source's last datagram fails.
    pub stall_timeout: Duration,
}

/// How one receiver fared.
#[derive(Debug, Clone)]
pub enum RxOutcome {
    /// Its copy is verified and in place.
    Done {
        /// From the start of the data to its report.
        seconds: f64,
        /// Datagrams it took.
        datagrams: u64,
        /// Blocks it rebuilt with parity.
        decoded: u64,
    },
    /// Multicast does not reach it (or it could not join): send it another way.
    NoMulticast(String),
    /// It holds the object already (an identical copy, or part of it): the tree moves only
    /// what it lacks, and its report says how much it held.
    Holds,
    /// It failed.
    Failed(String),
}

/// The result of a multicast send.
#[derive(Debug)]
pub struct McastResult {
    /// Per receiver, in the order given.
    pub outcomes: Vec<RxOutcome>,
    /// The source's counters.
    pub stats: SenderStats,
    /// Seconds from the first connection to the last receiver's end.
    pub seconds: f64,
    /// The rate sent at after set-up, bits per second on the wire.
    pub rate_bps: u64,
    /// How the rate was measured, when it was: the train's reports.
    pub train: Option<TrainOutcome>,
}

/// What the train measured.
#[derive(Debug, Clone)]
pub struct TrainOutcome {
    /// Bits per second the source wrote the train at (its own link's limit).
    pub sent_bps: u64,
    /// Bits per second the train set (the send may have moved on from it, see
    /// [`bulkcast_proto::mcast::probe`]).
    pub rate_bps: Option<u64>,
    /// Per receiver in the order given: the rate its train arrived at and the share lost
    /// (`None`: no report).
    pub receivers: Vec<Option<(u64, f64)>>,
}

enum Ctl {
    /// A request from the receiver with this index among those in the group (`u32::MAX`:
    /// none).
    Nak(u32, Nak),
    /// The rate measured from the train, bytes per second on the wire, and whether it is
    /// only a floor ([`bulkcast_proto::mcast::probe::censored`]).
    Rate(u64, bool),
    Stop,
}

enum Up {
    Hashes(u32, Vec<[u8; 32]>),
    /// The train is written: the rate it went out at, bytes per second on the wire.
    TrainSent(u64),
    PassDone(u32),
    Failed(String),
}

/// Rate the source paces at if it measures and no receiver's report could be timed.
const FALLBACK_BPS: u64 = 100_000_000;

/// Sends the file at `path`, described by `manifest` (its identity), to the agents at
/// `addrs`.
pub async fn send(
    path: &Path,
    manifest: &Manifest,
    addrs: &[String],
    keys: &Keys,
    tuning: &TcpTuning,
    cfg: &McastConfig,
) -> std::io::Result<McastResult> {
    let start = Instant::now();
    let file = File::open(path)?;
    let size = file.metadata()?.len();
    if manifest.total_len != Some(size) {
        return Err(std::io::Error::other(format!(
            "{} changed while it was being sent (now {size} bytes)",
            path.display()
        )));
    }
    let layout = Layout::new(size, cfg.symbol, cfg.k, cfg.m)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let session: u64 = rand::random();
    // A key for this session alone, unless this end chose `--plaintext` (a receiver that
    // did not refuses the session and gets the file by the tree, encrypted).
    let key = match keys.plaintext() {
        true => None,
        false => Some(
            GroupKey::generate(&ring::rand::SystemRandom::new())
                .map_err(|_| std::io::Error::other("no random bytes for the group key"))?,
        ),
    };
    let mut writer = DgramWriter::new(session, key.as_ref().map(GroupKey::cipher));
    let open = McastOpen {
        session,
        group: cfg.group.to_string(),
        name: manifest.name.clone(),
        size,
        mode: manifest.mode,
        symbol: cfg.symbol,
        k: cfg.k,
        m: cfg.m,
        renak_ms: 40,
        key,
        mtime: manifest.mtime,
    };
    let n = addrs.len();
    let mut outcomes: Vec<Option<RxOutcome>> = vec![None; n];
    let (up_tx, mut up_rx) = mpsc::unbounded_channel::<(usize, Option<McastMsg>)>();
    let mut writers: Vec<Option<WriteHalf>> = (0..n).map(|_| None).collect();
    let mut iface = None;
    let conns = futures_connect(addrs, keys, tuning, &open).await;
    for (i, c) in conns.into_iter().enumerate() {
        match c {
            Ok(s) => {
                iface = iface.or_else(|| super::v4(s.local_addr()));
                let (mut rd, wr) = s.into_split();
                writers[i] = Some(wr);
                let tx = up_tx.clone();
                tokio::spawn(async move {
                    loop {
                        match transport::read_frame(&mut rd, wire::MAX_FRAME).await {
                            Ok(Some(Frame::Mcast(m))) => {
                                if tx.send((i, Some(m))).is_err() {
                                    return;
                                }
                            }
                            _ => {
                                let _ = tx.send((i, None));
                                return;
                            }
                        }
                    }
                });
            }
            Err(e) => outcomes[i] = Some(RxOutcome::Failed(e)),
        }
    }
    drop(up_tx);
    let sock = super::sender_socket(iface, cfg.ttl)?;
    let group = SocketAddr::V4(cfg.group);
    detect(
        &sock,
        group,
        &mut writer,
        cfg.detect,
        &mut up_rx,
        &mut outcomes,
        &mut writers,
    )
    .await;
    let active: Vec<usize> = (0..n).filter(|&i| outcomes[i].is_none()).collect();
    let mut sent = (SenderStats::default(), 0, None);
    if !active.is_empty() {
        sent = data(
            sock,
            file,
            layout,
            writer,
            cfg,
            &mut up_rx,
            &mut outcomes,
            &mut writers,
        )
        .await;
    }
    Ok(McastResult {
        outcomes: outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| RxOutcome::Failed("no report".into())))
            .collect(),
        stats: sent.0,
        seconds: start.elapsed().as_secs_f64(),
        rate_bps: sent.1,
        train: sent.2,
    })
}

/// Connects to every agent at once and sends the `Open`.
async fn futures_connect(
    addrs: &[String],
    keys: &Keys,
    tuning: &TcpTuning,
    open: &McastOpen,
) -> Vec<Result<transport::Stream, String>> {
    let tasks: Vec<_> = addrs
        .iter()
        .map(|a| {
            let (a, keys, tuning) = (a.clone(), keys.clone(), tuning.clone());
            let has_key = open.key.is_some();
            let open = Frame::Mcast(McastMsg::Open(Box::new(open.clone())));
            tokio::spawn(async move {
                let s = transport::connect(&a, &tuning)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut s = transport::handshake_connect(s, &keys)
                    .await
                    .map_err(|e| e.to_string())?;
                // Never the group key in clear (the handshake encrypts every connection of
                // a source that did not choose plaintext: this holds).
                if has_key && !s.is_sealed() {
                    return Err(
                        "refusing to send the group key on an unencrypted connection".into(),
                    );
                }
                transport::write_frame(&mut s, &open)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(s)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(e.to_string())));
    }
    out
}

async fn tell(w: &mut Option<WriteHalf>, m: McastMsg) -> bool {
    match w {
        Some(w) => transport::write_frame(w, &Frame::Mcast(m)).await.is_ok(),
        None => false,
    }
}

/// Hello datagrams until every receiver that joined has heard one, at most `wait`.
async fn detect(
    sock: &UdpSocket,
    group: SocketAddr,
    writer: &mut DgramWriter,
    wait: Duration,
    up: &mut mpsc::UnboundedReceiver<(usize, Option<McastMsg>)>,
    outcomes: &mut [Option<RxOutcome>],
    writers: &mut [Option<WriteHalf>],
) {
    let n = outcomes.len();
    let mut joined = vec![false; n];
    let mut heard = vec![false; n];
    let deadline = Instant::now() + wait + Duration::from_secs(5);
    let mut hello_until = None;
    let mut buf = Vec::new();
    loop {
        let waiting = (0..n).any(|i| outcomes[i].is_none() && !heard[i]);
        if !waiting
            || Instant::now() >= deadline
            || hello_until.is_some_and(|t| Instant::now() >= t)
        {
            break;
        }
        // Hellos start once every receiver has joined (or failed to), so none is missed.
        if hello_until.is_none() && (0..n).all(|i| outcomes[i].is_some() || joined[i]) {
            hello_until = Some(Instant::now() + wait);
        }
        if hello_until.is_some() {
            // Each one numbered (and sealed) anew: a nonce is never used twice.
            writer.write(DgramKind::Hello, 0, 0, &[], &mut buf);
            let _ = sock.send_to(&buf, group);
        }
        match tokio::time::timeout(Duration::from_millis(10), up.recv()).await {
            Ok(Some((i, Some(McastMsg::Ready { joined: ok, reason })))) => {
                joined[i] = ok;
                if !ok {
                    outcomes[i] = Some(RxOutcome::NoMulticast(reason));
                }
            }
            Ok(Some((i, Some(McastMsg::Heard)))) => heard[i] = true,
            Ok(Some((i, Some(McastMsg::Holds { .. })))) => {
                outcomes[i] = Some(RxOutcome::Holds);
                writers[i] = None;
            }
            // A receiver that could not join closes after saying so: that stands.
            Ok(Some((i, None))) if outcomes[i].is_none() => {
                outcomes[i] = Some(RxOutcome::Failed("the connection closed".into()));
            }
            Ok(None) => break,
            _ => {}
        }
    }
    for i in 0..n {
        if outcomes[i].is_none() && !heard[i] {
            let why = match joined[i] {
                true => format!(
                    "heard nothing from the group within {:.1} s",
                    wait.as_secs_f64()
                ),
                false => "did not join the group".to_string(),
            };
            tell(
                &mut writers[i],
                McastMsg::Cancel {
                    reason: why.clone(),
                },
            )
            .await;
            outcomes[i] = Some(RxOutcome::NoMulticast(why));
        }
    }
}

/// The data: a pacing thread, hashes and ends out, repair requests in, until every active
/// receiver is done or failed.
#[allow(clippy::too_many_arguments)]
async fn data(
    sock: UdpSocket,
    file: File,
    layout: Layout,
    writer: DgramWriter,
    cfg: &McastConfig,
    up: &mut mpsc::UnboundedReceiver<(usize, Option<McastMsg>)>,
    outcomes: &mut [Option<RxOutcome>],
    writers: &mut [Option<WriteHalf>],
) -> (SenderStats, u64, Option<TrainOutcome>) {
    let start = Instant::now();
    let (ctl_tx, ctl_rx) = std_mpsc::channel();
    let (hash_tx, mut hash_rx) = mpsc::unbounded_channel();
    // The probe weighs the receivers in the group (those that did not join, or hold the
    // object, ask for nothing and would dilute the mean), numbered from 0.
    let mut in_group = 0u32;
    let member: Vec<Option<u32>> = outcomes
        .iter()
        .map(|o| {
            o.is_none().then(|| {
                in_group += 1;
                in_group - 1
            })
        })
        .collect();
    let scfg = SenderConfig {
        rate: cfg.rate_bps.unwrap_or(FALLBACK_BPS) / 8,
        end_interval: 20_000,
        stale: 20_000,
        receivers: in_group,
        overhead: wire_overhead(writer.sealed()),
    };
    let measure = cfg.rate_bps.is_none();
    let wire = u64::from(layout.symbol) + scfg.overhead;
    let group = cfg.group;
    let worker = tokio::task::spawn_blocking(move || {
        pace(
            sock, group, file, layout, writer, scfg, measure, ctl_rx, hash_tx,
        )
    });
    let active = |o: &[Option<RxOutcome>]| o.iter().any(Option::is_none);
    let mut last_heard = Instant::now();
    let mut pass_over: Option<Instant> = None;
    let mut train = measure.then(|| Train::new(outcomes.len()));
    let mut rate = scfg.rate * 8;
    while active(outcomes) {
        if let Some(r) = train.as_mut().and_then(|t| t.rate(outcomes, wire)) {
            rate = r * 8;
            let floor = train.as_ref().is_some_and(|t| t.censored(r));
            let _ = ctl_tx.send(Ctl::Rate(r, floor));
        }
        let tick = tokio::time::sleep(Duration::from_millis(200));
        tokio::select! {
            m = up.recv() => match m {
                Some((i, Some(McastMsg::Train(r)))) => {
                    if let Some(t) = train.as_mut() {
                        t.reports[i] = Some(r);
                    }
                }
                Some((i, Some(McastMsg::Nak(list)))) => {
                    last_heard = Instant::now();
                    let from = member.get(i).copied().flatten().unwrap_or(u32::MAX);
                    for k in list {
                        let _ = ctl_tx.send(Ctl::Nak(from, k));
                    }
                }
                Some((i, Some(McastMsg::Done { ok, reason, datagrams, decoded }))) => {
                    last_heard = Instant::now();
                    outcomes[i] = Some(match ok {
                        true => RxOutcome::Done {
                            seconds: start.elapsed().as_secs_f64(),
                            datagrams,
                            decoded,
                        },
                        false => RxOutcome::Failed(reason),
                    });
                    writers[i] = None;
                }
                Some((i, None)) if outcomes[i].is_none() => {
                    outcomes[i] = Some(RxOutcome::Failed("the connection closed".into()));
                }
                Some(_) => {}
                None => break,
            },
            h = hash_rx.recv() => {
                let msg = match h {
                    Some(Up::Hashes(first, hashes)) => McastMsg::Hashes { first, hashes },
                    Some(Up::TrainSent(bps)) => {
                        if let Some(t) = train.as_mut() {
                            t.sent = Some((bps, Instant::now()));
                        }
                        continue;
                    }
                    Some(Up::PassDone(blocks)) => {
                        pass_over = Some(Instant::now());
                        McastMsg::End { blocks }
                    }
                    other => {
                        let e = match other {
                            Some(Up::Failed(e)) => e,
                            _ => "the sending thread ended".to_string(),
                        };
                        for o in outcomes.iter_mut().filter(|o| o.is_none()) {
                            *o = Some(RxOutcome::Failed(e.clone()));
                        }
                        break;
                    }
                };
                for i in 0..writers.len() {
                    if outcomes[i].is_none() && !tell(&mut writers[i], msg.clone()).await {
                        outcomes[i] = Some(RxOutcome::Failed("the connection closed".into()));
                    }
                }
            },
            _ = tick => {}
        }
        // After the pass, receivers that neither ask nor finish for a while are stuck.
        if pass_over.is_some_and(|_| last_heard.elapsed() > cfg.stall_timeout) {
            for o in outcomes.iter_mut().filter(|o| o.is_none()) {
                *o = Some(RxOutcome::Failed("no progress (stalled)".into()));
            }
        }
    }
    stop(&ctl_tx, writers).await;
    let (stats, last) = worker.await.unwrap_or_default();
    // A probe moved the rate on from the train's: the rate it ended at.
    if stats.rate_changes > 0 {
        rate = last;
    }
    if let Some(why) = stats.probe_end {
        tracing::info!(
            "multicast rate: raising stopped at {} Mbit/s: {why}",
            rate / 1_000_000
        );
    }
    (stats, rate, train.map(|t| t.outcome(wire)))
}

/// Stops the pacing thread and tells every receiver still connected that the send is over.
async fn stop(ctl_tx: &std_mpsc::Sender<Ctl>, writers: &mut [Option<WriteHalf>]) {
    let _ = ctl_tx.send(Ctl::Stop);
    for w in writers.iter_mut() {
        let over = McastMsg::Cancel {
            reason: "the send is over".into(),
        };
        tell(w, over).await;
    }
}

/// The source's side of the train: the receivers' reports, until the rate is set.
struct Train {
    /// When the train was written, and the rate it went out at (bytes per second).
    sent: Option<(u64, Instant)>,
    reports: Vec<Option<TrainReport>>,
    done: bool,
    /// The rate set from the reports, bytes per second.
    set: Option<u64>,
}

impl Train {
    fn new(n: usize) -> Self {
        Self {
            sent: None,
            reports: vec![None; n],
            done: false,
            set: None,
        }
    }

    /// The rate (bytes per second), once: when every receiver still in the send reported,
    /// or from those that did when the sender's wait is nearly over.
    fn rate(&mut self, outcomes: &[Option<RxOutcome>], wire: u64) -> Option<u64> {
        let (_, at) = self.sent?;
        let all = (0..outcomes.len()).all(|i| outcomes[i].is_some() || self.reports[i].is_some());
        let late = at.elapsed() >= Duration::from_micros(TRAIN_WAIT) / 2;
        if self.done || !(all || late) {
            return None;
        }
        self.done = true;
        let reports: Vec<TrainReport> = self.reports.iter().flatten().copied().collect();
        let r = rate_from(&reports, wire);
        self.set = r;
        match r {
            Some(r) => tracing::info!(
                "multicast rate: {:.1} Mbit/s measured ({} of {} receivers timed the train)",
                r as f64 * 8e-6,
                reports.len(),
                outcomes.len()
            ),
            None => tracing::warn!(
                "multicast rate: no receiver timed the train; sending at {} Mbit/s",
                FALLBACK_BPS / 1_000_000
            ),
        }
        r
    }

    /// True when the receivers took the train about as fast as it was written: the rate
    /// `r` is then the source's pace, a floor to raise from.
    fn censored(&self, r: u64) -> bool {
        let floor = self.sent.is_some_and(|(sent, _)| censored(r, sent));
        if floor {
            tracing::info!("multicast rate: the train arrived as fast as it was written; raising the rate while the group keeps up");
        }
        floor
    }

    fn outcome(&self, wire: u64) -> TrainOutcome {
        TrainOutcome {
            sent_bps: self.sent.map_or(0, |s| s.0 * 8),
            rate_bps: self.set.map(|r| r * 8),
            receivers: self
                .reports
                .iter()
                .map(|r| r.and_then(|r| Some((r.rate(wire)? * 8, r.loss()))))
                .collect(),
        }
    }
}

/// The pacing thread: runs the [`Sender`], reading (and hashing) each block as its first
/// pass starts and keeping the last few for repairs.
#[allow(clippy::too_many_arguments)]
fn pace(
    sock: UdpSocket,
    group: SocketAddrV4,
    file: File,
    layout: Layout,
    mut writer: DgramWriter,
    cfg: SenderConfig,
    measure: bool,
    ctl: std_mpsc::Receiver<Ctl>,
    up: mpsc::UnboundedSender<Up>,
) -> (SenderStats, u64) {
    let epoch = Instant::now();
    let mut s = Sender::new(layout, cfg);
    // When the train's first datagram went out, and whether its end was told.
    let (mut train_t0, mut train_told) = (None, !measure);
    if measure {
        s.send_train();
    }
    let mut cache: VecDeque<(u32, CodedBlock)> = VecDeque::new();
    let mut hashed = 0u32;
    let mut buf = Vec::with_capacity(writer.overhead() + layout.symbol as usize);
    let mut told_end = false;
    let mut batch = Batch::new(sock, group);
    loop {
        let now = super::micros(epoch);
        let tx = s.poll_transmit(now);
        while let Some(j) = s.poll_judged() {
            tracing::debug!("multicast probe: {j}");
        }
        if !matches!(tx, Some(Tx::Data { .. })) {
            sent(batch.flush());
            if !train_told {
                let wire = u64::from(layout.symbol) + cfg.overhead;
                train_written(&s, &mut train_t0, &mut train_told, wire, &up);
            }
        }
        match tx {
            Some(Tx::Data { block, index }) => {
                // Each block is hashed when its first pass starts (its first read).
                let fresh = |data: &[u8]| {
                    if block == hashed {
                        hashed += 1;
                        let _ = up.send(Up::Hashes(block, vec![*blake3::hash(data).as_bytes()]));
                    }
                };
                let c = match coded(&mut cache, &file, &layout, block, fresh) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = up.send(Up::Failed(format!("reading the file: {e}")));
                        return finished(&s);
                    }
                };
                match c.symbol(&layout, block, index) {
                    Ok(sym) => writer.write(DgramKind::Data, block, index, sym, &mut buf),
                    Err(e) => {
                        let _ = up.send(Up::Failed(e.to_string()));
                        return finished(&s);
                    }
                }
                sent(batch.push(&buf));
                if !train_told {
                    // The train goes out a datagram at a time: the receivers time each one.
                    sent(batch.flush());
                    train_t0.get_or_insert_with(Instant::now);
                }
            }
            Some(Tx::End) => {
                let blocks = layout.blocks() as u32;
                writer.write(DgramKind::End, blocks, 0, &[], &mut buf);
                sent(batch.push(&buf).and(batch.flush()));
            }
            None => {
                if s.pass_done() && !told_end {
                    told_end = true;
                    let _ = up.send(Up::PassDone(layout.blocks() as u32));
                }
                // At least a batch: the pacer's credit sends what fell due meanwhile, so the
                // thread wakes a thousand times a second, not once a datagram.
                let wait = s.poll_timeout().saturating_sub(now).clamp(BATCH, 5_000);
                match ctl.recv_timeout(Duration::from_micros(wait)) {
                    Ok(Ctl::Nak(i, n)) => s.handle_nak(super::micros(epoch), i, n),
                    Ok(Ctl::Rate(r, floor)) => set_rate(&mut s, r, floor),
                    Ok(Ctl::Stop) | Err(std_mpsc::RecvTimeoutError::Disconnected) => {
                        return finished(&s)
                    }
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                }
            }
        }
        while let Ok(c) = ctl.try_recv() {
            match c {
                Ctl::Nak(i, n) => s.handle_nak(super::micros(epoch), i, n),
                Ctl::Rate(r, floor) => set_rate(&mut s, r, floor),
                Ctl::Stop => return finished(&s),
            }
        }
    }
}

/// The sender's counters and the rate it went at last (bits per second on the wire).
fn finished(s: &Sender) -> (SenderStats, u64) {
    (s.stats, s.rate_sent() * 8)
}

/// The train's rate `r` to the sender: a `floor` it raises while the group keeps up.
fn set_rate(s: &mut Sender, r: u64, floor: bool) {
    match floor {
        true => s.set_rate_floor(r),
        false => s.set_rate(r),
    }
}

/// Times the train as it is written (`t0`: when its first datagram was out; `wire`: bytes a
/// datagram costs on the wire): once the last
/// one is, tells the rate it went out at (the source's own link, when that is the bottleneck,
/// held the socket back). `told` is then set.
fn train_written(
    s: &Sender,
    t0: &mut Option<Instant>,
    told: &mut bool,
    wire: u64,
    up: &mpsc::UnboundedSender<Up>,
) {
    let Some(t0) = *t0 else { return };
    if *told || s.training() {
        return;
    }
    *told = true;
    let gaps = s.stats.first_pass.saturating_sub(1).max(1);
    let bytes = gaps * wire;
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    let _ = up.send(Up::TrainSent((bytes as f64 / secs) as u64));
}

/// A send's error: the receivers repair what it lost, and a lasting one shows as their
/// stall.
fn sent(r: std::io::Result<()>) {
    if let Err(e) = r {
        tracing::debug!("multicast send: {e}");
    }
}

/// Microseconds the pacing thread sleeps at least between batches of datagrams.
const BATCH: u64 = 1_000;

/// Blocks kept for repairs (about 23 MiB at 256 symbols of 1426 bytes).
const CACHED_BLOCKS: usize = 64;

/// Block `b`, coded, from the cache or read from the file (`fresh` sees the bytes read).
fn coded<'a>(
    cache: &'a mut VecDeque<(u32, CodedBlock)>,
    file: &File,
    layout: &Layout,
    b: u32,
    mut fresh: impl FnMut(&[u8]),
) -> std::io::Result<&'a mut CodedBlock> {
    let pos = match cache.iter().position(|(x, _)| *x == b) {
        Some(p) => p,
        None => {
            let (off, len) = layout.block_range(b);
            let mut data = vec![0u8; len as usize];
            file.read_exact_at(&mut data, off)?;
            fresh(&data);
            if cache.len() >= CACHED_BLOCKS {
                cache.pop_front();
            }
            cache.push_back((b, CodedBlock::new(layout, b, data)));
            cache.len() - 1
        }
    };
    Ok(&mut cache[pos].1)
}
