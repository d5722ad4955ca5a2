//! Port delay: the delay of a host's own LAN port, seed 003's netem per receiver.
//!
//! A host whose scenario gives it a `delay_ms` reaches its site's bridge through two TAP devices
//! instead of a veth: `lan0` in its namespace and `v<i>` in the hub, enslaved to the bridge. The
//! forwarder's thread copies every Ethernet frame between the two after the port's one-way delay,
//! both ways, so everything the host sends or receives on its LAN is delayed: unicast, ARP and
//! IP multicast alike. Rate shaping (htb on `lan0` and `v<i>`) and random loss (nft in the host)
//! stay on the kernel devices around this stage.
//!
//! Why in the forwarder's loop: it already has the epoll set, the nanosecond timer and a core
//! of its own at real-time priority; a second thread would compete with it for the same core.
//! The delay of a port is constant, so each direction is a FIFO whose head is the next frame
//! due: no heap, no sorting, and the frame buffers are recycled (no allocation per frame once
//! the pool holds one delay's worth).

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::thread::LinkNameSpaceType;

use crate::forwarder::{open_tun_device, setns_path};
use crate::scenario::Layout;
use crate::LabError;

/// Name of the host side of a delayed port (the same name a veth port has in the host).
pub const HOST_PORT: &str = "lan0";
/// Frames waiting in one direction of one port at most: 8192 full frames are 1 Gbit/s for about
/// 95 ms. A frame arriving when the queue is full is dropped and counted (`port_drops`).
pub const MAX_QUEUED: usize = 8192;
/// Size of a frame buffer: a full 1500-byte MTU frame with its Ethernet header, and room.
const FRAME_BUF: usize = 2048;
/// Frames read from one device per ready event before looking at the others.
const READ_BATCH: usize = 64;

/// Name of the hub side of host `i`'s port: the same name its veth would have.
pub fn hub_port(i: usize) -> String {
    format!("v{i}")
}

/// One delayed port: the two TAPs and a FIFO per direction of (due time, frame).
struct Port {
    /// `fds[0]`: `lan0` in the host; `fds[1]`: `v<i>` in the hub.
    fds: [OwnedFd; 2],
    delay_ns: u64,
    /// `queues[d]` holds frames read from `fds[d]`, to be written to the other one.
    queues: [VecDeque<(u64, Vec<u8>)>; 2],
}

/// Every delayed port of a lab and the frame buffers they share.
#[derive(Default)]
pub struct DelayStage {
    ports: Vec<Port>,
    pool: Vec<Vec<u8>>,
    /// Frames copied across a port.
    pub frames: u64,
    /// Frames dropped because their direction's queue was full.
    pub drops: u64,
    /// Frames the far device refused: it is down (a host's `lan0` before the lab configures it).
    pub refused: u64,
}

impl DelayStage {
    /// A stage without ports (a lab whose hosts have no port delay).
    pub fn empty() -> Self {
        Self::default()
    }

    /// Number of devices to poll: two per port; device `k` is port `k / 2`, side `k % 2`.
    pub fn devices(&self) -> usize {
        self.ports.len() * 2
    }

    /// Device `k` (see [`DelayStage::devices`]).
    pub fn device(&self, k: usize) -> BorrowedFd<'_> {
        self.ports[k / 2].fds[k % 2].as_fd()
    }

    /// Reads up to a batch of frames from device `k` into its queue, due one delay after `now`.
    pub fn read(&mut self, k: usize, now: u64) {
        let (p, side) = (k / 2, k % 2);
        for _ in 0..READ_BATCH {
            let mut buf = self
                .pool
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(FRAME_BUF));
            buf.clear();
            let port = &mut self.ports[p];
            // Into the buffer's spare capacity: its length becomes what the kernel wrote.
            let r = rustix::io::read(&port.fds[side], rustix::buffer::spare_capacity(&mut buf));
            if !matches!(r, Ok(n) if n > 0) {
                self.pool.push(buf);
                return;
            }
            if port.queues[side].len() >= MAX_QUEUED {
                self.drops += 1;
                self.pool.push(buf);
                continue;
            }
            port.queues[side].push_back((now + port.delay_ns, buf));
        }
    }

    /// Writes every frame due by `until` to the far side of its port.
    pub fn flush(&mut self, until: u64) {
        for port in &mut self.ports {
            for side in 0..2 {
                while port.queues[side]
                    .front()
                    .is_some_and(|(due, _)| *due <= until)
                {
                    let Some((_, buf)) = port.queues[side].pop_front() else {
                        break;
                    };
                    if rustix::io::write(&port.fds[1 - side], &buf) == Ok(buf.len()) {
                        self.frames += 1;
                    } else {
                        self.refused += 1;
                    }
                    self.pool.push(buf);
                }
            }
        }
    }

    /// When the next frame is due (None: nothing queued).
    pub fn next_deadline(&self) -> Option<u64> {
        self.ports
            .iter()
            .flat_map(|p| p.queues.iter())
            .filter_map(|q| q.front().map(|(due, _)| *due))
            .min()
    }
}

/// Creates the two TAPs of every delayed port (non-persistent: they vanish with the stage, so
/// with the forwarder). Must run on a thread that may change namespace; returns to the original
/// one. The caller enslaves the hub sides to their bridges ([`crate::netns::attach_ports`]).
pub fn open_ports(
    hub_ns: &str,
    host_namespaces: &[String],
    layout: &Layout,
) -> Result<DelayStage, LabError> {
    let delayed = layout.delayed_ports();
    if delayed.is_empty() {
        return Ok(DelayStage::empty());
    }
    let home = File::open("/proc/thread-self/ns/net")
        .map_err(|e| LabError::sys("open own network namespace", e))?;
    let opened = (|| -> Result<Vec<Port>, LabError> {
        let mut ports = Vec::new();
        for &i in &delayed {
            setns_path(&format!("/var/run/netns/{}", host_namespaces[i]))?;
            let host = open_tun_device(HOST_PORT, true)?;
            setns_path(&format!("/var/run/netns/{hub_ns}"))?;
            let hub = open_tun_device(&hub_port(i), true)?;
            ports.push(Port {
                fds: [host, hub],
                delay_ns: layout.hosts[i].port_delay_ns,
                queues: [VecDeque::new(), VecDeque::new()],
            });
        }
        Ok(ports)
    })();
    rustix::thread::move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| LabError::sys("setns back", e.into()))?;
    Ok(DelayStage {
        ports: opened?,
        ..DelayStage::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

    /// A stage with one port whose two devices are datagram socket pairs (a frame per
    /// datagram, like a TAP); returns the far ends: the host's and the bridge's.
    fn stage(delay_ns: u64) -> (DelayStage, OwnedFd, OwnedFd) {
        let pair = || {
            socketpair(
                AddressFamily::UNIX,
                SocketType::DGRAM,
                SocketFlags::NONBLOCK,
                None,
            )
            .unwrap()
        };
        let (host_dev, host) = pair();
        let (hub_dev, hub) = pair();
        let port = Port {
            fds: [host_dev, hub_dev],
            delay_ns,
            queues: [VecDeque::new(), VecDeque::new()],
        };
        let s = DelayStage {
            ports: vec![port],
            ..DelayStage::default()
        };
        (s, host, hub)
    }

    fn recv(fd: &OwnedFd) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; FRAME_BUF];
        let n = rustix::io::read(fd, &mut buf).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    #[test]
    fn frames_cross_after_the_delay_in_order_both_ways() {
        let (mut s, host, hub) = stage(10_000);
        for f in [&b"one"[..], b"two"] {
            rustix::io::write(&host, f).unwrap();
        }
        rustix::io::write(&hub, b"back").unwrap();
        s.read(0, 1_000);
        s.read(1, 2_000);
        assert_eq!(s.next_deadline(), Some(11_000));
        s.flush(10_999);
        assert_eq!(recv(&hub), None, "nothing before its delay");
        s.flush(11_000);
        assert_eq!(recv(&hub).as_deref(), Some(&b"one"[..]));
        assert_eq!(recv(&hub).as_deref(), Some(&b"two"[..]));
        assert_eq!(recv(&host), None);
        assert_eq!(s.next_deadline(), Some(12_000));
        s.flush(12_000);
        assert_eq!(recv(&host).as_deref(), Some(&b"back"[..]));
        assert_eq!((s.frames, s.drops, s.refused), (3, 0, 0));
        assert_eq!(s.next_deadline(), None);
        // Buffers come back to the pool (the three frames' and the one each empty read ended
        // with): the next frames need no allocation.
        assert_eq!(s.pool.len(), 4);
        rustix::io::write(&host, b"again").unwrap();
        s.read(0, 20_000);
        s.flush(u64::MAX);
        assert_eq!(recv(&hub).as_deref(), Some(&b"again"[..]));
        assert_eq!(s.pool.len(), 4);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let (mut s, host, _hub) = stage(1_000_000);
        // A socket pair holds fewer datagrams than the queue: fill it in rounds.
        let mut sent = 0;
        while sent < MAX_QUEUED + 10 {
            while rustix::io::write(&host, &[7u8; 60]).is_ok() {
                sent += 1;
            }
            s.read(0, 0);
        }
        for _ in 0..1000 {
            s.read(0, 0);
        }
        assert_eq!(s.ports[0].queues[0].len(), MAX_QUEUED);
        assert_eq!(s.drops as usize, sent - MAX_QUEUED);
        assert_eq!(s.next_deadline(), Some(1_000_000));
    }
}
