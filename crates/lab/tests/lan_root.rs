//! Port delay on a site's LAN (seed 003's testbed: netem per receiver on one multipoint VLAN):
//! round trips and IP multicast inside one site see each receiver's own delay. Needs root with
//! `CAP_SYS_ADMIN`, `ip` and `/dev/net/tun`; whether it runs is decided as for `lab_root.rs`
//! (`build.rs`): built to run and unable to, it fails, never passes without running.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use bulkcast_lab::{Lab, LabOptions, Scenario};
use rustix::thread::LinkNameSpaceType;

#[path = "support/root.rs"]
mod root;
use root::root_test_cannot_run;

const GROUP: Ipv4Addr = Ipv4Addr::new(239, 255, 77, 1);
const ECHO_PORT: u16 = 7001;
const GROUP_PORT: u16 = 7002;
const PROBES: usize = 21;

fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Runs `f` on a thread that has moved into network namespace `ns` first (the monotonic clock
/// is the same in every namespace, so timestamps compare across them).
fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        rustix::thread::move_into_link_name_space(file.as_fd(), Some(LinkNameSpaceType::Network))
            .unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
}

fn median_ms(mut v: Vec<u64>) -> f64 {
    assert!(!v.is_empty());
    v.sort_unstable();
    v[v.len() / 2] as f64 / 1e6
}

/// Median UDP round trip in ms from `src_ns` to `addr`, where an echo runs in `dst_ns` (the
/// first probe also resolves ARP: left out).
fn round_trip_ms(src_ns: &str, dst_ns: &str, addr: Ipv4Addr) -> f64 {
    let (ready_tx, ready_rx) = mpsc::channel();
    let echo = in_ns(dst_ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", ECHO_PORT)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..PROBES {
            let Ok((n, from)) = s.recv_from(&mut buf) else {
                return;
            };
            s.send_to(&buf[..n], from).unwrap();
        }
    });
    ready_rx.recv().unwrap();
    let rtts = in_ns(src_ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut rtts = Vec::new();
        let mut buf = [0u8; 64];
        for i in 0..PROBES {
            let t0 = mono_ns();
            s.send_to(
                &(i as u64).to_be_bytes(),
                SocketAddrV4::new(addr, ECHO_PORT),
            )
            .unwrap();
            if s.recv(&mut buf).is_ok() && i > 0 {
                rtts.push(mono_ns() - t0);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        rtts
    })
    .join()
    .unwrap();
    echo.join().unwrap();
    assert!(
        rtts.len() >= PROBES - 3,
        "{addr}: {} of {} echoes came back",
        rtts.len(),
        PROBES - 1
    );
    median_ms(rtts)
}

/// Sends `PROBES` timestamped datagrams to the group from `src_ns`; returns, per receiver
/// namespace, the one-way delays (ns) of the datagrams it received.
fn multicast_delays(src_ns: &str, receivers: &[(String, Ipv4Addr)]) -> Vec<Vec<u64>> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let joins: Vec<_> = receivers
        .iter()
        .map(|(ns, addr)| {
            let (ready, addr) = (ready_tx.clone(), *addr);
            in_ns(ns, move || {
                let s = UdpSocket::bind(("0.0.0.0", GROUP_PORT)).unwrap();
                s.join_multicast_v4(&GROUP, &addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                ready.send(()).unwrap();
                let mut delays = Vec::new();
                let mut buf = [0u8; 64];
                while let Ok(n) = s.recv(&mut buf) {
                    let now = mono_ns();
                    if n == 8 {
                        let sent = u64::from_be_bytes(buf[..8].try_into().unwrap());
                        delays.push(now - sent);
                    }
                }
                delays
            })
        })
        .collect();
    for _ in receivers {
        ready_rx.recv().unwrap();
    }
    in_ns(src_ns, || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        for _ in 0..PROBES {
            s.send_to(
                &mono_ns().to_be_bytes(),
                SocketAddrV4::new(GROUP, GROUP_PORT),
            )
            .unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
    })
    .join()
    .unwrap();
    joins.into_iter().map(|j| j.join().unwrap()).collect()
}

/// One site, a source without delay and receivers at 0, 10 and 25 ms one way, with the kernel
/// (one bridge, htb) and with the forwarder shaping: a round trip from the source to each reads
/// twice its delay, and every datagram the source sends to a multicast group reaches every
/// receiver after about its delay. The lab leaves no namespace behind.
#[cfg_attr(
    not(bulkcast_root_tests),
    ignore = "needs root (network namespaces): run as root, or set BULKCAST_REQUIRE_ROOT=1 to make it fail instead"
)]
#[test]
fn port_delay_applies_to_round_trips_and_multicast_in_a_site() {
    if let Err(e) = bulkcast_lab::preflight() {
        root_test_cannot_run(
            "port_delay_applies_to_round_trips_and_multicast_in_a_site",
            &e.to_string(),
        );
    }
    let delays = [0.0, 10.0, 25.0];
    for shaping in ["kernel", "forwarder"] {
        let mut text = format!(
            "name = \"lan\"\nsource = \"src\"\nshaping = \"{shaping}\"\n[[site]]\nname = \"lan\"\n\
             uplink_mbps = 100\ndownlink_mbps = 100\n[[site.host]]\nname = \"src\"\n"
        );
        for d in delays {
            text.push_str(&format!("[[site.host]]\nname = \"r{d}\"\ndelay_ms = {d}\n"));
        }
        let sc = Scenario::parse(&text).unwrap();
        let name = format!("t-lanlab-{shaping}");
        let lab = Lab::up_with(
            &sc,
            &LabOptions {
                name: Some(name.clone()),
            },
        )
        .unwrap();
        let src_ns = lab.netns("src").unwrap();
        let receivers: Vec<(String, Ipv4Addr)> = delays
            .iter()
            .map(|d| {
                let h = format!("r{d}");
                (lab.netns(&h).unwrap(), lab.addr(&h).unwrap())
            })
            .collect();
        let mut report = String::new();
        let mut failures = Vec::new();
        for (d, (ns, addr)) in delays.iter().zip(&receivers) {
            let rtt = round_trip_ms(&src_ns, ns, *addr);
            report.push_str(&format!("{shaping}: r{d}: round trip {rtt:.2} ms\n"));
            // About 0.1 ms of the bridge and the stacks on top; 1 ms of the timer's slack.
            if (rtt - 2.0 * d).abs() > 1.0 + 0.02 * d {
                failures.push(format!("r{d}: round trip {rtt:.2} ms, want {}", 2.0 * d));
            }
        }
        let got = multicast_delays(&src_ns, &receivers);
        for (d, one_way) in delays.iter().zip(got) {
            let n = one_way.len();
            let med = if n > 0 { median_ms(one_way) } else { f64::NAN };
            report.push_str(&format!(
                "{shaping}: r{d}: multicast {n}/{PROBES} received, one way {med:.2} ms\n"
            ));
            if n != PROBES {
                failures.push(format!("r{d}: {n} of {PROBES} multicast datagrams"));
            }
            if !((med - d).abs() <= 1.0 + 0.02 * d) {
                failures.push(format!("r{d}: multicast one way {med:.2} ms, want {d}"));
            }
        }
        let stats = lab.stats();
        eprint!("{report}");
        eprintln!(
            "{shaping}: port frames {} dropped {}",
            stats.port_frames, stats.port_drops
        );
        lab.down().unwrap();
        let left = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        assert!(!left.contains(&format!("bclab-{name}.")), "{left}");
        assert!(failures.is_empty(), "{}\n{report}", failures.join("\n"));
    }
}
