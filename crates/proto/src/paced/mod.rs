//! A paced, selective-repeat byte stream over UDP datagrams (issue 5's WAN hop at 5% loss).
//!
//! TCP spends a lossy long path in recovery: at 100 ms and 5% random loss one bbr flow keeps
//! about 0.6 of a 100 Mbit/s link and eight keep 0.87 (docs/notes/multi-stream-edges.md).
//! quinn 0.11 with its BBR overran the queue there (36% of packets declared lost,
//! docs/notes/paced-transport.md).
//! This transport keeps rate and loss apart: the sender paces at a rate set by the queue
//! delay the path builds ([`rate`]), never by loss, and resends exactly what was lost in new
//! packets (numbered afresh, as QUIC does, so an ACK is never ambiguous). Its ceiling at 5%
//! loss is the link less the loss and the headers: 0.95 x 1448/1500 = 0.917.
//!
//! Sans-IO: a [`Conn`] takes datagrams ([`Conn::handle_datagram`]) and the time
//! ([`Conn::handle_timeout`]), and yields datagrams ([`Conn::poll_transmit`]) and the next
//! time it wants to be called ([`Conn::poll_timeout`]). The byte stream goes in by
//! [`Conn::write`] / [`Conn::finish`] and out by [`Conn::read`]. The tokio shell is
//! `bulkcast_runtime::paced`; [`sim`] runs two connections over a simulated path.
//!
//! # Layout
//! - [`packet`]: the three datagram kinds, DATA, ACK and CLOSE.
//! - [`rate`]: the delay-based pacing rate.
//! - [`ranges`]: range sets for acknowledged, lost and received bytes.
//! - [`sim`]: a path with a rate, a queue, a delay and random loss on a simulated clock.
//!
//! # Protocol
//! Each side sends DATA (packet number, stream offset, FIN flag, bytes) and ACKs what it
//! received: the largest packet number and a bitmap of the 256 below it, the time the ACK was
//! held, and the flow-control limit (stream bytes the receiver will take). A packet is lost
//! when one sent three packets later is acknowledged and it is not, or when nothing is
//! acknowledged for a probe timeout; its bytes go out again in a new packet. The stream ends
//! at FIN; the connection is done when both sides' FINs are acknowledged and read.

pub mod packet;
pub mod ranges;
pub mod rate;
#[cfg(feature = "sim")]
pub use crate::sim::paced as sim;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};

use packet::{Ack, Packet, ACK_BITS, DATA_HEADER_LEN};
pub use packet::{CloseCode, PacketError};
use ranges::RangeSet;
pub use rate::RateControl;

/// Packets acknowledged after a packet that was not: it is lost (QUIC's threshold).
const PACKET_THRESHOLD: u64 = 3;
/// DATA packets received before an ACK is sent at once.
const ACK_EVERY: u32 = 4;
/// Datagrams sent back to back at most once the window or new data lets a sender go again.
const BURST: u32 = 8;
/// Time's worth of datagrams a sender held back only by its pacing may catch up when it is
/// run late. A user-space pacer runs when its process does: tokio's timers tick in whole
/// milliseconds and a busy host runs a process every few. With [`BURST`] datagrams a wake-up
/// at most, a sender run every 2 ms carried half of a 100 Mbit/s path (`paced_sim`). The
/// window still caps what goes.
const CATCH_UP: Duration = Duration::from_millis(5);

/// Settings of a connection; setters reject values that cannot work.
#[derive(Debug, Clone)]
pub struct Config {
    datagram_size: usize,
    recv_window: u64,
    send_buffer: usize,
    initial_rate: f64,
    max_rate: f64,
    idle_timeout: Duration,
    max_ack_delay: Duration,
}

/// A setting out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl Default for Config {
    fn default() -> Self {
        Config {
            // 1500-byte MTU less IPv4 and UDP headers.
            datagram_size: 1472,
            // 64 MiB: two round trips of a 1 Gbit/s, 250 ms path, so the holes of one
            // round of losses are refilled before the window closes.
            recv_window: 64 << 20,
            send_buffer: 64 << 20,
            // 10 Mbit/s: startup reaches 100 Mbit/s in six round trips.
            initial_rate: 1.25e6,
            max_rate: 1.25e9,
            idle_timeout: Duration::from_secs(10),
            max_ack_delay: Duration::from_millis(2),
        }
    }
}

impl Config {
    /// Largest datagram (UDP payload) to send: 1472 for a 1500-byte IPv4 path, 1452 for IPv6.
    pub fn datagram_size(mut self, n: usize) -> Result<Self, ConfigError> {
        if !(DATA_HEADER_LEN + 64..=65_507).contains(&n) {
            return Err(ConfigError(format!(
                "datagram size {n} is outside {}..=65507",
                DATA_HEADER_LEN + 64
            )));
        }
        self.datagram_size = n;
        Ok(self)
    }

    /// Stream bytes the receiver buffers ahead of the application (flow control).
    pub fn recv_window(mut self, bytes: u64) -> Result<Self, ConfigError> {
        if bytes < 64 * 1024 {
            return Err(ConfigError(format!("receive window {bytes} < 64 KiB")));
        }
        self.recv_window = bytes;
        Ok(self)
    }

    /// Stream bytes the sender holds (written, not yet acknowledged).
    pub fn send_buffer(mut self, bytes: usize) -> Result<Self, ConfigError> {
        if bytes < 64 * 1024 {
            return Err(ConfigError(format!("send buffer {bytes} < 64 KiB")));
        }
        self.send_buffer = bytes;
        Ok(self)
    }

    /// Pacing rate to start at and the ceiling, in bytes/s.
    pub fn rates(mut self, initial: f64, max: f64) -> Result<Self, ConfigError> {
        if !(initial.is_finite() && max.is_finite() && initial >= rate::MIN_RATE && max >= initial)
        {
            return Err(ConfigError(format!(
                "rates {initial}..{max} B/s: need {} <= initial <= max",
                rate::MIN_RATE
            )));
        }
        self.initial_rate = initial;
        self.max_rate = max;
        Ok(self)
    }

    /// Silence after which the connection is given up.
    pub fn idle_timeout(mut self, t: Duration) -> Result<Self, ConfigError> {
        if t < Duration::from_millis(100) {
            return Err(ConfigError(format!("idle timeout {t:?} < 100 ms")));
        }
        self.idle_timeout = t;
        Ok(self)
    }

    fn max_payload(&self) -> usize {
        self.datagram_size - DATA_HEADER_LEN
    }
}

/// Why a connection ended without finishing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// The peer sent CLOSE.
    #[error("closed by peer ({0:?})")]
    ClosedByPeer(CloseCode),
    /// This side aborted.
    #[error("aborted")]
    Aborted,
    /// Nothing heard from the peer for the idle timeout.
    #[error("peer silent for {0:?}")]
    Idle(Duration),
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// Counters of one connection.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConnStats {
    /// DATA packets sent, retransmissions included.
    pub packets_sent: u64,
    /// DATA packets declared lost.
    pub packets_lost: u64,
    /// Stream bytes sent again.
    pub bytes_resent: u64,
    /// Stream bytes acknowledged.
    pub bytes_acked: u64,
    /// Smoothed RTT.
    pub srtt: Option<Duration>,
    /// Current pacing rate, bytes/s.
    pub rate: f64,
}

/// A sent DATA packet awaiting its fate.
#[derive(Debug, Clone)]
struct Sent {
    offset: u64,
    len: u64,
    fin: bool,
    time: Instant,
    size: u64,
}

/// One side of a connection.
pub struct Conn {
    id: u32,
    cfg: Config,
    /// The origin of this side's microsecond stamps (ACKs' `recv_us`, and the send times
    /// they are read against).
    epoch: Instant,
    // --- sending: stream bytes snd_base..snd_base + snd_buf.len() are held ---
    snd_buf: BytesMut,
    /// Every byte below is acknowledged.
    snd_base: u64,
    /// The next byte never sent.
    snd_next: u64,
    /// The stream's length, once the application finished it.
    fin: Option<u64>,
    fin_sent: bool,
    fin_acked: bool,
    fin_lost: bool,
    /// Acknowledged bytes at or above `snd_base`.
    acked: RangeSet,
    /// Bytes to send again (lost, not acknowledged since).
    lost: RangeSet,
    next_pn: u64,
    /// Packets `first_pn..next_pn`; `None` once acknowledged or lost.
    sent: VecDeque<Option<Sent>>,
    first_pn: u64,
    /// Wire bytes of packets in `sent` still awaiting their fate.
    inflight: u64,
    peer_max_data: u64,
    srtt: Option<Duration>,
    rttvar: Duration,
    rate: RateControl,
    /// Pacing: when the next datagram may go.
    next_send: Instant,
    /// The last [`Self::poll_transmit`] held a datagram back for its pacing time (not for
    /// the window or for want of data): a late call owes the time since, up to [`CATCH_UP`].
    paced_out: bool,
    last_ack_eliciting: Option<Instant>,
    pto_count: u32,
    /// A client's first packet, so the peer hears of it before it has data.
    open_probe: bool,
    // --- receiving ---
    /// In-order bytes the application has not read.
    ready: VecDeque<Bytes>,
    ready_len: usize,
    /// The next in-order offset.
    rcv_next: u64,
    /// Bytes the application has read.
    rcv_read: u64,
    /// Received bytes at or above `rcv_next`, and the segments holding them.
    rcv_have: RangeSet,
    rcv_ooo: BTreeMap<u64, Bytes>,
    rcv_fin: Option<u64>,
    /// The highest stream offset received.
    rcv_max_end: u64,
    rcv_largest: Option<u64>,
    rcv_largest_at: Instant,
    /// Bit i: packet `rcv_largest - 1 - i` arrived.
    rcv_bits: [u64; 4],
    ack_pending: u32,
    ack_due: Option<Instant>,
    max_data_sent: u64,
    // --- lifecycle ---
    last_recv: Instant,
    last_send: Instant,
    error: Option<ConnError>,
    close_to_send: Option<CloseCode>,
    established: bool,
    stats: ConnStats,
}

impl Conn {
    /// The side that opens the connection: it sends first.
    pub fn client(id: u32, cfg: Config, now: Instant) -> Self {
        let mut c = Conn::new(id, cfg, now);
        c.open_probe = true;
        c
    }

    /// The side that accepted the connection on its first datagram (which the caller passes
    /// to [`Conn::handle_datagram`] next).
    pub fn server(id: u32, cfg: Config, now: Instant) -> Self {
        let mut c = Conn::new(id, cfg, now);
        c.established = true;
        c
    }

    fn new(id: u32, cfg: Config, now: Instant) -> Self {
        let window = cfg.recv_window;
        Conn {
            id,
            epoch: now,
            snd_buf: BytesMut::new(),
            snd_base: 0,
            snd_next: 0,
            fin: None,
            fin_sent: false,
            fin_acked: false,
            fin_lost: false,
            acked: RangeSet::default(),
            lost: RangeSet::default(),
            next_pn: 0,
            sent: VecDeque::new(),
            first_pn: 0,
            inflight: 0,
            // Until the peer's first ACK says more: one window's worth, as ours.
            peer_max_data: window,
            srtt: None,
            rttvar: Duration::ZERO,
            rate: RateControl::new(cfg.initial_rate, cfg.max_rate, now),
            next_send: now,
            paced_out: false,
            last_ack_eliciting: None,
            pto_count: 0,
            open_probe: false,
            ready: VecDeque::new(),
            ready_len: 0,
            rcv_next: 0,
            rcv_read: 0,
            rcv_have: RangeSet::default(),
            rcv_ooo: BTreeMap::new(),
            rcv_fin: None,
            rcv_max_end: 0,
            rcv_largest: None,
            rcv_largest_at: now,
            rcv_bits: [0; 4],
            ack_pending: 0,
            ack_due: None,
            max_data_sent: window,
            last_recv: now,
            last_send: now,
            error: None,
            close_to_send: None,
            established: false,
            stats: ConnStats::default(),
            cfg,
        }
    }

    /// The connection id (on every datagram).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Whether anything has been heard from the peer.
    pub fn is_established(&self) -> bool {
        self.established
    }

    /// Why the connection ended, if it did without finishing.
    pub fn error(&self) -> Option<&ConnError> {
        self.error.as_ref()
    }

    /// Both directions finished: ours acknowledged, the peer's read to the end.
    pub fn is_done(&self) -> bool {
        self.fin_acked && self.recv_finished()
    }

    /// Counters and the current rate.
    pub fn stats(&self) -> ConnStats {
        ConnStats {
            srtt: self.srtt,
            rate: self.rate.rate(),
            ..self.stats.clone()
        }
    }

    /// The rate and window controller.
    pub fn controller(&self) -> &RateControl {
        &self.rate
    }

    /// Wire bytes sent and not yet acknowledged or declared lost.
    pub fn inflight(&self) -> u64 {
        self.inflight
    }

    // ---------------------------------------------------------------- application side

    /// Takes as much of `data` as the send buffer has room for; returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        if self.fin.is_some() || self.error.is_some() {
            return 0;
        }
        let n = data.len().min(self.send_room());
        self.snd_buf.extend_from_slice(&data[..n]);
        n
    }

    /// Room in the send buffer.
    pub fn send_room(&self) -> usize {
        self.cfg.send_buffer.saturating_sub(self.snd_buf.len())
    }

    /// No more bytes will be written; the stream ends after those written.
    pub fn finish(&mut self) {
        if self.fin.is_none() {
            self.fin = Some(self.snd_base + self.snd_buf.len() as u64);
        }
    }

    /// Whether every written byte and the end of the stream are acknowledged.
    pub fn send_finished(&self) -> bool {
        self.fin_acked
    }

    /// Copies in-order bytes into `buf`; returns how many (0: none ready).
    pub fn read(&mut self, buf: &mut [u8]) -> usize {
        let mut n = 0;
        while n < buf.len() {
            let Some(front) = self.ready.front_mut() else {
                break;
            };
            let k = front.len().min(buf.len() - n);
            buf[n..n + k].copy_from_slice(&front[..k]);
            front.advance(k);
            if front.is_empty() {
                self.ready.pop_front();
            }
            n += k;
        }
        self.ready_len -= n;
        self.rcv_read += n as u64;
        // Open the window again once a quarter of it was read, so the sender does not wait.
        if self.rcv_read + self.cfg.recv_window >= self.max_data_sent + self.cfg.recv_window / 4 {
            self.ack_due = Some(self.ack_due.unwrap_or(self.last_recv));
        }
        n
    }

    /// Bytes ready to read.
    pub fn readable(&self) -> usize {
        self.ready_len
    }

    /// The peer's stream ended and all of it was read.
    pub fn recv_finished(&self) -> bool {
        self.rcv_fin == Some(self.rcv_read)
    }

    /// Gives up: a CLOSE goes to the peer, everything unsent is dropped.
    pub fn close(&mut self, code: CloseCode) {
        if self.error.is_none() {
            self.error = Some(ConnError::Aborted);
            self.close_to_send = Some(code);
        }
    }

    // ---------------------------------------------------------------- network side

    /// One datagram from the peer. Datagrams of another connection or not ours at all are
    /// an `Err` and change nothing; a protocol violation closes the connection.
    pub fn handle_datagram(&mut self, now: Instant, d: &[u8]) -> Result<(), PacketError> {
        let (id, p) = packet::decode(d)?;
        if id != self.id || self.error.is_some() {
            return Ok(());
        }
        self.last_recv = now;
        self.established = true;
        match p {
            Packet::Data {
                pn,
                offset,
                fin,
                payload,
            } => self.on_data(now, pn, offset, fin, payload),
            Packet::Ack(ack) => self.on_ack(now, &ack),
            Packet::Close(code) => self.error = Some(ConnError::ClosedByPeer(code)),
        }
        Ok(())
    }

    fn violation(&mut self, what: String) {
        self.error = Some(ConnError::Protocol(what));
        self.close_to_send = Some(CloseCode::Protocol);
    }

    fn on_data(&mut self, now: Instant, pn: u64, offset: u64, fin: bool, payload: &[u8]) {
        let end = offset.saturating_add(payload.len() as u64);
        if end > self.rcv_read + self.cfg.recv_window {
            return self.violation(format!(
                "data up to {end} beyond the window ({})",
                self.rcv_read + self.cfg.recv_window
            ));
        }
        if fin {
            match self.rcv_fin {
                Some(f) if f != end => {
                    return self.violation(format!("stream end moved from {f} to {end}"))
                }
                _ if end < self.rcv_max_end => {
                    return self.violation(format!("stream end {end} below received data"))
                }
                _ => self.rcv_fin = Some(end),
            }
        }
        if self.rcv_fin.is_some_and(|f| end > f) {
            return self.violation(format!("data up to {end} past the stream end"));
        }
        self.rcv_max_end = self.rcv_max_end.max(end);
        self.record_pn(now, pn);
        // Reassembly.
        if end > self.rcv_next && !self.rcv_have.contains(offset.max(self.rcv_next)..end) {
            let skip = self.rcv_next.saturating_sub(offset) as usize;
            let start = offset + skip as u64;
            let seg = Bytes::copy_from_slice(&payload[skip..]);
            let keep = self.rcv_ooo.get(&start).is_none_or(|b| b.len() < seg.len());
            if keep {
                self.rcv_ooo.insert(start, seg);
            }
            self.rcv_have.insert(start..end);
            while let Some(entry) = self.rcv_ooo.first_entry() {
                let o = *entry.key();
                if o > self.rcv_next {
                    break;
                }
                let mut b = entry.remove();
                let e = o + b.len() as u64;
                if e <= self.rcv_next {
                    continue;
                }
                b.advance((self.rcv_next - o) as usize);
                self.rcv_next = e;
                self.ready_len += b.len();
                self.ready.push_back(b);
            }
            self.rcv_have.remove_below(self.rcv_next);
        }
    }

    fn record_pn(&mut self, now: Instant, pn: u64) {
        self.ack_pending += 1;
        match self.rcv_largest {
            None => {
                self.rcv_largest = Some(pn);
                self.rcv_largest_at = now;
                // Everything below the first packet is unknown: nothing to set.
            }
            Some(l) if pn > l => {
                let gap = pn > l + 1;
                shift_in(&mut self.rcv_bits, pn - l);
                self.rcv_largest = Some(pn);
                self.rcv_largest_at = now;
                if gap {
                    // A hole: tell the sender now rather than after ACK_EVERY.
                    self.ack_due = Some(now);
                }
            }
            Some(l) if pn < l && l - pn <= ACK_BITS => {
                let i = (l - 1 - pn) as usize;
                self.rcv_bits[i / 64] |= 1 << (i % 64);
                // A retransmission or a reordered packet filled a hole: say so soon.
                self.ack_due = Some(now);
            }
            _ => {}
        }
        if self.ack_pending >= ACK_EVERY {
            self.ack_due = Some(now);
        } else if self.ack_due.is_none() {
            self.ack_due = Some(now + self.cfg.max_ack_delay);
        }
    }

    fn on_ack(&mut self, now: Instant, ack: &Ack) {
        if ack.largest == u64::MAX {
            // Nothing received yet: a keepalive or a window update.
            self.peer_max_data = self.peer_max_data.max(ack.max_data);
            return;
        }
        if ack.largest >= self.next_pn {
            return self.violation(format!(
                "ack of packet {} never sent (next {})",
                ack.largest, self.next_pn
            ));
        }
        self.peer_max_data = self.peer_max_data.max(ack.max_data);
        let (mut acked, mut lost, mut rtt, mut largest_sent) = (0u64, 0u64, None, None);
        let last = ack.largest.min(self.next_pn - 1);
        if last >= self.first_pn {
            for pn in self.first_pn..=last {
                let idx = (pn - self.first_pn) as usize;
                let Some(s) = self.sent[idx].take() else {
                    continue;
                };
                if ack.covers(pn) {
                    if pn == ack.largest {
                        let delay = Duration::from_micros(ack.delay_us.into());
                        let r = now.saturating_duration_since(s.time);
                        rtt = Some(if r > delay + Duration::from_micros(100) {
                            r - delay
                        } else {
                            r
                        });
                        largest_sent = Some(self.stamp(s.time));
                    }
                    acked += s.len;
                    self.on_acked(&s);
                } else if pn + PACKET_THRESHOLD <= ack.largest {
                    lost += s.len.max(1);
                    self.on_lost(&s);
                } else {
                    self.sent[idx] = Some(s);
                }
            }
        }
        while let Some(None) = self.sent.front() {
            self.sent.pop_front();
            self.first_pn += 1;
        }
        if let Some(r) = rtt {
            self.update_rtt(r);
        }
        if acked > 0 || lost > 0 {
            self.pto_count = 0;
        }
        if let Some(sent) = largest_sent {
            self.rate.on_forward_delay(now, ack.recv_us, sent);
        }
        self.rate.on_ack(now, acked, lost, rtt);
    }

    /// `t` in microseconds since this side's epoch, wrapping as the wire's stamps do.
    fn stamp(&self, t: Instant) -> u32 {
        t.saturating_duration_since(self.epoch).as_micros() as u64 as u32
    }

    fn on_acked(&mut self, s: &Sent) {
        self.inflight -= s.size;
        self.stats.bytes_acked += s.len;
        if s.len > 0 {
            self.acked.insert(s.offset..s.offset + s.len);
        }
        if s.fin {
            self.fin_acked = true;
            self.fin_lost = false;
        }
        if let Some(r) = self.acked.first().filter(|r| r.start <= self.snd_base) {
            let n = (r.end - self.snd_base) as usize;
            self.snd_buf.advance(n);
            self.snd_base = r.end;
            self.acked.remove_below(self.snd_base);
            self.lost.remove_below(self.snd_base);
        }
    }

    fn on_lost(&mut self, s: &Sent) {
        self.inflight -= s.size;
        self.stats.packets_lost += 1;
        if s.len > 0 {
            self.lost.insert(s.offset..s.offset + s.len);
        }
        if s.fin && !self.fin_acked {
            self.fin_lost = true;
        }
        if s.len == 0 && !s.fin && !self.established {
            self.open_probe = true;
        }
    }

    fn update_rtt(&mut self, r: Duration) {
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2;
            }
            Some(s) => {
                let d = s.abs_diff(r);
                self.rttvar = (self.rttvar * 3 + d) / 4;
                self.srtt = Some((s * 7 + r) / 8);
            }
        }
    }

    fn pto(&self) -> Duration {
        let base = match self.srtt {
            Some(s) => s + (self.rttvar * 4).max(Duration::from_millis(1)) + self.cfg.max_ack_delay,
            None => Duration::from_millis(500),
        };
        base * (1u32 << self.pto_count.min(10))
    }

    /// The next datagram to send, appended to `out` (cleared first); `false` when there is
    /// nothing to send now (see [`Conn::poll_timeout`]).
    pub fn poll_transmit(&mut self, now: Instant, out: &mut Vec<u8>) -> bool {
        out.clear();
        if let Some(code) = self.close_to_send.take() {
            packet::encode_close(out, self.id, code);
            return true;
        }
        if self.error.is_some() {
            return false;
        }
        if self.ack_due.is_some_and(|t| t <= now) {
            self.send_ack(now, out);
            return true;
        }
        if self.next_send > now {
            self.paced_out = true;
            return false;
        }
        let cap = self.inflight_cap();
        if self.inflight + self.cfg.datagram_size as u64 > cap {
            self.paced_out = false;
            return false;
        }
        let Some((offset, len, fin)) = self.next_data() else {
            self.rate.on_app_limited();
            self.paced_out = false;
            return false;
        };
        let start = (offset - self.snd_base) as usize;
        let pn = self.next_pn;
        self.next_pn += 1;
        packet::encode_data(
            out,
            self.id,
            pn,
            offset,
            fin,
            &self.snd_buf[start..start + len as usize],
        );
        let size = out.len() as u64;
        self.sent.push_back(Some(Sent {
            offset,
            len,
            fin,
            time: now,
            size,
        }));
        self.inflight += size;
        self.stats.packets_sent += 1;
        self.last_ack_eliciting = Some(now);
        self.last_send = now;
        // Pacing: the next datagram's time, with a bounded catch-up. Only a sender that was
        // waiting for its pacing time is owed more than a burst: one the window or the
        // application held is not, or a burst of ACKs would release a flood.
        let gap = Duration::from_secs_f64(size as f64 / self.rate.rate());
        let owed = if self.paced_out {
            (gap * BURST).max(CATCH_UP)
        } else {
            gap * BURST
        };
        let floor = now.checked_sub(owed).unwrap_or(now);
        self.next_send = self.next_send.max(floor) + gap;
        true
    }

    /// Bytes that may be in flight: the controller's window.
    fn inflight_cap(&self) -> u64 {
        self.rate.window()
    }

    /// What the next DATA packet carries: (offset, length, fin).
    fn next_data(&mut self) -> Option<(u64, u64, bool)> {
        let max = self.cfg.max_payload() as u64;
        // Lost bytes first, skipping any acknowledged since.
        while let Some(r) = self.lost.pop_front(max) {
            let r = r.start.max(self.snd_base)..r.end;
            if r.is_empty() || self.acked.contains(r.clone()) {
                continue;
            }
            // Send the first unacknowledged stretch of `r`; put the rest back.
            let mut end = r.start + 1;
            while end < r.end && !self.acked.contains(end..end + 1) {
                end += 1;
            }
            if end < r.end {
                self.lost.insert(end..r.end);
            }
            self.stats.bytes_resent += end - r.start;
            let fin = self.fin == Some(end);
            if fin {
                self.fin_lost = false;
            }
            return Some((r.start, end - r.start, fin));
        }
        let buffered = self.snd_base + self.snd_buf.len() as u64;
        let limit = buffered.min(self.peer_max_data);
        if self.snd_next < limit {
            let len = (limit - self.snd_next).min(max);
            let offset = self.snd_next;
            self.snd_next += len;
            let fin = self.fin == Some(self.snd_next);
            self.fin_sent |= fin;
            self.open_probe = false;
            return Some((offset, len, fin));
        }
        if let Some(f) = self.fin {
            if self.snd_next == f && (!self.fin_sent || self.fin_lost) {
                self.fin_sent = true;
                self.fin_lost = false;
                self.open_probe = false;
                return Some((f, 0, true));
            }
        }
        if self.open_probe {
            self.open_probe = false;
            return Some((self.snd_next, 0, false));
        }
        None
    }

    fn send_ack(&mut self, now: Instant, out: &mut Vec<u8>) {
        let max_data = self.rcv_read + self.cfg.recv_window;
        let (largest, delay_us, recv_us) = match self.rcv_largest {
            Some(l) => (
                l,
                now.saturating_duration_since(self.rcv_largest_at)
                    .as_micros()
                    .min(u32::MAX as u128) as u32,
                self.stamp(self.rcv_largest_at),
            ),
            None => (u64::MAX, 0, 0),
        };
        let mut bits = [0u8; ACK_BITS as usize / 8];
        for (w, word) in self.rcv_bits.iter().enumerate() {
            bits[w * 8..w * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        packet::encode_ack(
            out,
            self.id,
            &Ack {
                largest,
                delay_us,
                recv_us,
                max_data,
                bits,
            },
        );
        self.max_data_sent = max_data;
        self.ack_pending = 0;
        self.ack_due = None;
        self.last_send = now;
    }

    /// When [`Conn::handle_timeout`] (or [`Conn::poll_transmit`]) has work; `None`: only a
    /// datagram or the application can bring any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.error.is_some() {
            return None;
        }
        let mut t = self.last_recv + self.cfg.idle_timeout;
        // Keepalive: say something a few times per idle timeout.
        t = t.min(self.last_send + self.cfg.idle_timeout / 4);
        if let Some(a) = self.ack_due {
            t = t.min(a);
        }
        if self.inflight > 0 {
            if let Some(s) = self.last_ack_eliciting {
                t = t.min(s + self.pto());
            }
        }
        // Pacing matters only with window to send into; else an ACK is what frees the way.
        if self.has_data_to_send()
            && self.inflight + self.cfg.datagram_size as u64 <= self.inflight_cap()
        {
            t = t.min(self.next_send);
        }
        Some(t)
    }

    fn has_data_to_send(&self) -> bool {
        let buffered = self.snd_base + self.snd_buf.len() as u64;
        !self.lost.is_empty()
            || self.snd_next < buffered.min(self.peer_max_data)
            || self.fin_lost
            || (self.fin == Some(self.snd_next) && !self.fin_sent)
            || self.open_probe
    }

    /// Time passed: declares the peer gone, fires the probe timeout, schedules keepalives.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.error.is_some() {
            return;
        }
        if now >= self.last_recv + self.cfg.idle_timeout {
            self.error = Some(ConnError::Idle(self.cfg.idle_timeout));
            return;
        }
        if self.inflight > 0 {
            if let Some(s) = self.last_ack_eliciting {
                if now >= s + self.pto() {
                    // Nothing acknowledged for a probe timeout: everything in flight is
                    // presumed lost and goes out again.
                    let lost: Vec<Sent> = self.sent.iter_mut().filter_map(Option::take).collect();
                    for p in &lost {
                        self.on_lost(p);
                    }
                    self.pto_count += 1;
                    self.rate.on_timeout();
                    self.last_ack_eliciting = Some(now);
                    self.next_send = now;
                }
            }
        }
        if now >= self.last_send + self.cfg.idle_timeout / 4 && self.ack_due.is_none() {
            self.ack_due = Some(now);
        }
    }
}

/// Shifts the received-bitmap up by `k` packet numbers: the old largest becomes bit `k - 1`.
fn shift_in(bits: &mut [u64; 4], k: u64) {
    if k > ACK_BITS {
        *bits = [0; 4];
        return;
    }
    // As one 256-bit number, shifted left by k, then bit k-1 set.
    let mut v = [0u64; 4];
    let (words, rem) = ((k / 64) as usize, (k % 64) as u32);
    for i in (0..4).rev() {
        if i < words {
            continue;
        }
        let src = i - words;
        let mut x = bits[src] << rem;
        if rem > 0 && src > 0 {
            x |= bits[src - 1] >> (64 - rem);
        }
        v[i] = x;
    }
    let b = (k - 1) as usize;
    if b < 256 {
        v[b / 64] |= 1 << (b % 64);
    }
    *bits = v;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_received_bitmap_shifts_like_a_256_bit_number() {
        let mut b = [0u64; 4];
        shift_in(&mut b, 1); // largest 0 -> 1: bit 0 = packet 0
        assert_eq!(b, [1, 0, 0, 0]);
        shift_in(&mut b, 64); // largest 1 -> 65: packet 1 at bit 63, packet 0 at bit 64
        assert_eq!(b, [1 << 63, 1, 0, 0]);
        shift_in(&mut b, 130); // largest 195: 65 at bit 129, 1 at bit 193, 0 at bit 194
        assert_eq!(b, [0, 0, 1 << 1, 1 << 1 | 1 << 2]);
        let mut c = [u64::MAX; 4];
        shift_in(&mut c, 300);
        assert_eq!(c, [0; 4]);
    }
}
