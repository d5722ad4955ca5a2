//! One-shot files by IP multicast with erasure-coded repair (`send --strategy multicast`):
//! the shell around [`bulkcast_proto::mcast`].
//!
//! - [`send`]: the source: a TCP connection to every agent for control (set-up, block
//!   hashes, repair requests, completion), a check that the group reaches each receiver, and
//!   a thread that paces the datagrams.
//! - [`recv`]: the agent's side: joins the group, a thread that assembles and writes the
//!   file, the copy renamed into place once every block matched its hash.

pub(crate) mod batch;
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
    // The pacer, not the socket's queue, sets the rate; the queue only covers the pacing
    // thread's stalls on a busy host (40 ms at 100 Mbit/s; the kernel caps it at
    // `net.core.wmem_max`). At 64 KiB (10 ms) sixteen receivers on the source's two cores
    // held a 98 Mbit/s pace to 0.73-0.75 of the link, at 512 KiB 0.81-0.82. A full queue
    // blocks the pacing thread, which catches up on at most a burst of credit once it
    // drains (`proto::mcast::sender::BURST`).
    s.set_send_buffer_size(512 << 10)?;
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

/// Whether every agent address in `addrs` (`host:port`) is on a network this host is attached
/// to, with no router between: what IP multicast with a TTL of 1 can reach. Loopback counts.
/// An address that does not resolve to IPv4, whose route goes through a gateway, or whose
/// interface is a point-to-point link or cannot multicast (a tunnel, a VPN) does not.
pub fn on_lan(addrs: &[String]) -> bool {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let multicast_link = |iface: &str| {
        let flags = std::fs::read_to_string(format!("/sys/class/net/{iface}/flags"));
        flags.ok().is_some_and(|f| broadcast_multicast(&f))
    };
    !addrs.is_empty()
        && addrs.iter().all(|a| {
            use std::net::ToSocketAddrs;
            let ip = a.to_socket_addrs().ok().and_then(|mut it| {
                it.find_map(|s| match s.ip() {
                    std::net::IpAddr::V4(ip) => Some(ip),
                    std::net::IpAddr::V6(_) => None,
                })
            });
            ip.is_some_and(|ip| {
                ip.is_loopback() || on_link(&routes, ip).is_some_and(|i| multicast_link(&i))
            })
        })
}

/// Whether an interface's flags (`/sys/class/net/IFACE/flags`, hex) say it can multicast and
/// is not a point-to-point link.
fn broadcast_multicast(flags: &str) -> bool {
    const POINTOPOINT: u32 = 0x10;
    const MULTICAST: u32 = 0x1000;
    let f = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap_or(0);
    f & MULTICAST != 0 && f & POINTOPOINT == 0
}

/// The interface of the longest of the IPv4 `routes` (the text of `/proc/net/route`) that
/// matches `ip`, if that route is up and has no gateway.
fn on_link(routes: &str, ip: Ipv4Addr) -> Option<String> {
    const UP: u32 = 0x1;
    const GATEWAY: u32 = 0x2;
    // Fields are hex of the address as the kernel holds it (network order in memory).
    let addr = |h: &str| {
        u32::from_str_radix(h, 16)
            .ok()
            .map(|x| u32::from_be_bytes(x.to_ne_bytes()))
    };
    let ip = u32::from(ip);
    let best = routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (dest, gw, flags, mask) = (
                addr(f.get(1)?)?,
                addr(f.get(2)?)?,
                f.get(3)?,
                addr(f.get(7)?)?,
            );
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let direct = gw == 0 && flags & GATEWAY == 0;
            (flags & UP != 0 && ip & mask == dest).then_some((mask.count_ones(), direct, f[0]))
        })
        .max_by_key(|r| r.0);
    best.and_then(|(_, direct, iface)| direct.then(|| iface.to_string()))
}

/// Host sets that IP multicast did not reach at all, remembered for a day so that `auto`
/// sends them down the tree at once instead of waiting each time for the group to be heard
/// (a LAN whose switches or hypervisor drop multicast, as many cloud networks do).
#[derive(Debug, Clone)]
pub struct Unreached {
    /// One empty file per host set, named by the set's hash; its age is the memory's.
    pub dir: std::path::PathBuf,
    /// Older memories are tried again.
    pub max_age: std::time::Duration,
}

impl Unreached {
    /// `$XDG_CACHE_HOME/bulkcast/mcast-unreached` (or under `~/.cache`), one day; `None` where
    /// neither variable is set.
    pub fn in_user_cache() -> Option<Unreached> {
        Some(Unreached {
            dir: crate::measure::user_cache_dir()?.join("mcast-unreached"),
            max_age: std::time::Duration::from_secs(24 * 3600),
        })
    }

    fn path(&self, addrs: &[String]) -> std::path::PathBuf {
        let mut set: Vec<&str> = addrs.iter().map(String::as_str).collect();
        set.sort_unstable();
        let key = blake3::hash(set.join("\n").as_bytes()).to_hex();
        self.dir.join(&key[..32])
    }

    /// Multicast reached none of `addrs` within [`Unreached::max_age`].
    pub fn recent(&self, addrs: &[String]) -> bool {
        std::fs::metadata(self.path(addrs))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age <= self.max_age)
    }

    /// Remembers that multicast reached none of `addrs` (a cache that cannot be written only
    /// costs the next send the wait).
    pub fn remember(&self, addrs: &[String]) {
        let p = self.path(addrs);
        if let Err(e) = std::fs::create_dir_all(&self.dir).and_then(|()| std::fs::write(&p, b"")) {
            tracing::debug!("{}: {e}", p.display());
        }
    }

    /// Forgets it (multicast reached them after all).
    pub fn forget(&self, addrs: &[String]) {
        let _ = std::fs::remove_file(self.path(addrs));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_route_says_whether_a_host_is_on_a_link() {
        // A default route via 10.0.0.1 on eth0, 10.0.0.0/24 on eth0, 10.9.0.0/16 on br0.
        let routes =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
br0\t0000090A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
        let at = |s: &str| on_link(routes, s.parse().unwrap());
        assert_eq!(at("10.0.0.7").as_deref(), Some("eth0"));
        assert_eq!(at("10.9.200.3").as_deref(), Some("br0"));
        assert_eq!(at("10.0.1.7"), None, "through the default gateway");
        assert_eq!(at("192.168.1.1"), None);
        assert_eq!(on_link("", "10.0.0.7".parse().unwrap()), None, "no routes");
        // An Ethernet or a bridge (UP, BROADCAST, MULTICAST) multicasts; a tunnel (UP,
        // POINTOPOINT, NOARP, MULTICAST) and a device without MULTICAST do not.
        assert!(broadcast_multicast("0x1003\n"));
        assert!(!broadcast_multicast("0x1091"));
        assert!(!broadcast_multicast("0x3"));
        assert!(on_lan(&[
            "127.0.0.1:7000".to_string(),
            "localhost:1".to_string()
        ]));
        assert!(!on_lan(&[]));
        assert!(!on_lan(&["[::1]:7000".to_string()]), "IPv4 only");
    }

    #[test]
    fn an_unreached_host_set_is_remembered_in_any_order_until_it_is_old() {
        let dir = std::env::temp_dir().join(format!("bulkcast-unreached-{}", std::process::id()));
        let mut u = Unreached {
            dir: dir.clone(),
            max_age: std::time::Duration::from_secs(60),
        };
        let (a, b) = ("10.0.0.1:7000".to_string(), "10.0.0.2:7000".to_string());
        assert!(!u.recent(&[a.clone(), b.clone()]));
        u.remember(&[a.clone(), b.clone()]);
        assert!(
            u.recent(&[b.clone(), a.clone()]),
            "the same set in another order"
        );
        assert!(!u.recent(std::slice::from_ref(&a)), "another set");
        u.max_age = std::time::Duration::ZERO;
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(!u.recent(&[a.clone(), b.clone()]), "too old");
        u.forget(&[a, b]);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(dir);
    }
}
