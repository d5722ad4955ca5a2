//! One-shot files by IP multicast with erasure-coded repair (`send --strategy multicast`):
//! the shell around [`bulkcast_proto::mcast`].
//!
//! - [`send`]: the source: a TCP connection to every agent for control (set-up, block
//!   hashes, repair requests, completion), a check that the group reaches each receiver, and
//!   a thread that paces the datagrams.
//! - [`recv`]: the agent's side: joins the group, a thread that assembles and writes the
//!   file, the copy renamed into place once every block matched its hash.

pub mod recv;
pub mod send;

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::Instant;

/// Microseconds since `epoch` (the threads' clock for the sans-IO cores).
pub(crate) fn micros(epoch: Instant) -> u64 {
    epoch.elapsed().as_micros() as u64
}

/// A socket that sends to a group from `iface` (the address the receivers were reached
/// from; `None`: the kernel's choice).
pub(crate) fn sender_socket(iface: Option<Ipv4Addr>, ttl: u32) -> io::Result<UdpSocket> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    s.set_multicast_ttl_v4(ttl)?;
    // On: a receiver on the source's own host (and loopback tests) hears the group too.
    s.set_multicast_loop_v4(true)?;
    if let Some(a) = iface {
        s.set_multicast_if_v4(&a)?;
    }
    // Small: the pacer, not a deep socket queue, sets the rate, and the kernel's queue stays
    // a few milliseconds long; a full queue blocks the pacing thread, which catches up on
    // at most a burst of credit once it drains (`proto::mcast::sender::BURST`).
    s.set_send_buffer_size(64 << 10)?;
    s.bind(&SocketAddr::from(([0, 0, 0, 0], 0)).into())?;
    Ok(s.into())
}

/// Joins `group` on `iface` (the address the source reached this host on).
pub(crate) fn join(group: SocketAddrV4, iface: Option<Ipv4Addr>) -> io::Result<UdpSocket> {
    if !group.ip().is_multicast() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a multicast address", group.ip()),
        ));
    }
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    // Several receivers on one host share the group's port.
    s.set_reuse_address(true)?;
    // Deep: a receiver on a busy host must not drop what the network delivered.
    s.set_recv_buffer_size(16 << 20)?;
    s.bind(&SocketAddr::V4(group).into())?;
    s.join_multicast_v4(group.ip(), &iface.unwrap_or(Ipv4Addr::UNSPECIFIED))?;
    Ok(s.into())
}

/// The IPv4 address of a socket address, if it is one (and not unspecified).
pub(crate) fn v4(a: Option<SocketAddr>) -> Option<Ipv4Addr> {
    match a?.ip() {
        std::net::IpAddr::V4(ip) if !ip.is_unspecified() => Some(ip),
        _ => None,
    }
}
