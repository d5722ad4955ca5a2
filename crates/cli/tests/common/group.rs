//! A third party on the LAN: a listener joined to a multicast group on loopback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Every datagram starting with `magic` on `group`, as a listener joined to it on loopback
/// hears them, until `stop`.
pub fn capture_group(
    group: &str,
    magic: &'static [u8],
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    use socket2::{Domain, Socket, Type};
    let g: std::net::SocketAddrV4 = group.parse().unwrap();
    let s = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
    // The receivers under test bind the same group and port.
    s.set_reuse_address(true).unwrap();
    s.set_recv_buffer_size(32 << 20).unwrap();
    s.bind(&std::net::SocketAddr::V4(g).into()).unwrap();
    s.join_multicast_v4(g.ip(), &std::net::Ipv4Addr::LOCALHOST)
        .unwrap();
    let sock: std::net::UdpSocket = s.into();
    sock.set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .unwrap();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 65_536];
        while !stop.load(Ordering::Relaxed) {
            if let Ok(n) = sock.recv(&mut buf) {
                if buf[..n].starts_with(magic) {
                    got.push(buf[..n].to_vec());
                }
            }
        }
        got
    })
}
