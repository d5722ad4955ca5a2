//! Datagrams to a group with few system calls.
//!
//! With UDP GSO (a `UDP_SEGMENT` control message) one `sendmsg` carries a run of up to
//! [`Batch::MAX`] datagrams of one size (the last may be shorter), which the kernel cuts
//! apart; without it (an old kernel, a device that refuses) one call each. Per-datagram calls
//! were what a busy source ran out of CPU on: at 100 Mbit/s they are 8,600 a second, and a
//! pacing thread that misses its deadlines loses rate.

use std::io::{self, IoSlice};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrIn};

/// A run of datagrams on its way to the group.
pub(crate) struct Batch {
    sock: UdpSocket,
    group: SocketAddrV4,
    /// The run, back to back.
    buf: Vec<u8>,
    /// Size of every datagram of the run but the last; set by its first.
    seg: usize,
    /// Datagrams in the run.
    count: usize,
    /// The run ends with a shorter datagram: nothing more may join it.
    closed: bool,
    /// GSO still works on this socket (cleared at its first refusal).
    gso: bool,
}

impl Batch {
    /// Most datagrams in one call (the kernel takes up to 64).
    pub(crate) const MAX: usize = 32;
    /// Most bytes in one call (a UDP datagram's limit, before the kernel cuts it).
    const MAX_BYTES: usize = 65_000;

    /// Sends on `sock` (blocking: a full socket queue holds the pacing thread back) to `group`.
    pub(crate) fn new(sock: UdpSocket, group: SocketAddrV4) -> Self {
        Self {
            sock,
            group,
            buf: Vec::with_capacity(Self::MAX_BYTES),
            seg: 0,
            count: 0,
            closed: false,
            gso: true,
        }
    }

    /// Queues datagram `d`, sending the run first when `d` cannot join it and after when it
    /// is full. An error is the send's, for a run that went (partly) unsent.
    pub(crate) fn push(&mut self, d: &[u8]) -> io::Result<()> {
        let joins = self.count == 0
            || (!self.closed && d.len() <= self.seg && self.buf.len() + d.len() <= Self::MAX_BYTES);
        let before = if joins { Ok(()) } else { self.flush() };
        if self.count == 0 {
            self.seg = d.len();
        }
        self.closed = d.len() < self.seg;
        self.buf.extend_from_slice(d);
        self.count += 1;
        let after = if self.count >= Self::MAX {
            self.flush()
        } else {
            Ok(())
        };
        before.and(after)
    }

    /// Sends the run.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let r = self.send();
        self.buf.clear();
        self.count = 0;
        self.closed = false;
        r
    }

    fn send(&mut self) -> io::Result<()> {
        if self.count > 1 && self.gso {
            match self.send_gso() {
                Ok(()) => return Ok(()),
                // Refused by this kernel or device: one datagram per call from now on.
                Err(Errno::EIO | Errno::EINVAL | Errno::EOPNOTSUPP | Errno::ENOPROTOOPT) => {
                    tracing::debug!("multicast: UDP GSO refused; one datagram per call");
                    self.gso = false;
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut first = Ok(());
        for d in self.buf.chunks(self.seg) {
            if let Err(e) = self.sock.send_to(d, self.group) {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn send_gso(&self) -> nix::Result<()> {
        // A segment over 64 KiB never joins a run of more than one (MAX_BYTES).
        let seg = u16::try_from(self.seg).map_err(|_| Errno::EINVAL)?;
        let iov = [IoSlice::new(&self.buf)];
        let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
        let to = SockaddrIn::from(self.group);
        sendmsg(
            self.sock.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&to),
        )
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::time::Duration;

    /// A batch to a socket on loopback, and that socket (unicast: the cutting is the same).
    fn pair() -> (Batch, UdpSocket) {
        let rx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        rx.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let to = match rx.local_addr().expect("addr") {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => unreachable!("bound on IPv4"),
        };
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
        (Batch::new(tx, to), rx)
    }

    fn received(rx: &UdpSocket, n: usize) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 65_536];
        (0..n)
            .map(|_| {
                let len = rx.recv(&mut buf).expect("a datagram");
                buf[..len].to_vec()
            })
            .collect()
    }

    #[test]
    fn runs_of_mixed_sizes_arrive_as_the_datagrams_pushed() {
        let (mut b, rx) = pair();
        // Full blocks, a product's short last block, a message, more blocks: each datagram
        // arrives whole and in order, whatever runs they were cut into.
        let sizes = [1457usize, 1457, 1457, 900, 1457, 1457, 64, 1300, 1300, 1300];
        let sent: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        for d in &sent {
            b.push(d).expect("push");
        }
        b.flush().expect("flush");
        assert_eq!(received(&rx, sent.len()), sent);
    }

    #[test]
    fn a_full_run_goes_at_once() {
        let (mut b, rx) = pair();
        let sent: Vec<Vec<u8>> = (0..Batch::MAX + 3).map(|i| vec![i as u8; 1200]).collect();
        for d in &sent[..Batch::MAX] {
            b.push(d).expect("push");
        }
        // Nothing flushed by hand: the run of MAX went by itself.
        assert_eq!(received(&rx, Batch::MAX), sent[..Batch::MAX]);
        for d in &sent[Batch::MAX..] {
            b.push(d).expect("push");
        }
        b.flush().expect("flush");
        assert_eq!(received(&rx, 3), sent[Batch::MAX..]);
    }
}
