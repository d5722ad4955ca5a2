//! The measurements of `lab check`: RTT by UDP echo, one TCP stream per congestion control
//! (iperf3), UDP loss with the counters that say where each lost packet went.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{CheckOptions, HostProbeRun, PathCheck, UdpLoss};
use crate::forwarder::setns_path;
use crate::lab::Lab;
use crate::LabError;

/// One representative pair per distinct kind of path.
pub(super) struct Probe {
    pub(super) label: String,
    from: String,
    to: String,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    rtt_cfg_ms: f64,
    rate_mbps: Option<f64>,
    loss: f64,
    /// The forward route's links.
    route: Vec<usize>,
}

pub(super) fn probes(lab: &Lab, max: usize) -> Vec<Probe> {
    let p = lab.layout();
    let mut out: Vec<Probe> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut add = |from: usize, to: usize, src: Ipv4Addr, dst: Ipv4Addr, what: String| {
        let Some(r) = p.route(from, dst) else { return };
        let back_dst = if dst == p.hosts[to].addr {
            p.hosts[from].addr
        } else {
            src
        };
        let Some(back) = p.route(to, back_dst) else {
            return;
        };
        let rtt_ns = r
            .iter()
            .chain(&back)
            .map(|&l| p.links[l].delay_ns)
            .sum::<u64>();
        let rate = r
            .iter()
            .filter_map(|&l| p.links[l].rate_bps)
            .fold(f64::INFINITY, f64::min);
        let rate_mbps = rate.is_finite().then_some(rate / 1e6);
        let loss = 1.0 - r.iter().map(|&l| 1.0 - p.links[l].loss).product::<f64>();
        let key = format!("{rtt_ns}/{rate_mbps:?}/{loss}/{}", p.links[r[1]].jitter_ns);
        if !seen.insert(key) {
            return;
        }
        out.push(Probe {
            label: format!("{} -> {} ({what})", p.hosts[from].name, p.hosts[to].name),
            from: p.hosts[from].name.clone(),
            to: p.hosts[to].name.clone(),
            src,
            dst,
            rtt_cfg_ms: rtt_ns as f64 / 1e6,
            rate_mbps,
            loss,
            route: r,
        });
    };
    let first = |s: usize| p.hosts.iter().position(|h| h.site == s);
    for a in 0..p.sites.len() {
        for b in 0..p.sites.len() {
            if a != b {
                if let (Some(x), Some(y)) = (first(a), first(b)) {
                    add(
                        x,
                        y,
                        p.hosts[x].addr,
                        p.hosts[y].addr,
                        p.links[p.site_links[a][b].expect("resolved")].name.clone(),
                    );
                }
            }
        }
    }
    for c in &p.channels {
        add(c.a, c.b, c.a_addr, c.b_addr, c.name.clone());
    }
    out.truncate(max);
    out
}

/// Measures the round trip of `n` small UDP probes from `src` (in `from_ns`) to an echo in
/// `to_ns`; returns (median, min) in ms.
pub fn measure_rtt(
    from_ns: &str,
    to_ns: &str,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    n: u32,
) -> Result<(f64, f64), LabError> {
    const PORT: u16 = 7399;
    let to_ns = to_ns.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || -> Result<(), LabError> {
        setns_path(&format!("/var/run/netns/{to_ns}"))?;
        let sock = UdpSocket::bind((dst, PORT)).map_err(|e| LabError::sys("bind echo", e))?;
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| LabError::sys("timeout", e))?;
        let _ = ready_tx.send(());
        let mut buf = [0u8; 256];
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((k, from)) = sock.recv_from(&mut buf) {
                let _ = sock.send_to(&buf[..k], from);
            }
        }
        Ok(())
    });
    let from_ns = from_ns.to_string();
    let result = (|| -> Result<(f64, f64), LabError> {
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| LabError::Measure("echo server did not start".into()))?;
        let client = std::thread::spawn(move || -> Result<Vec<f64>, LabError> {
            setns_path(&format!("/var/run/netns/{from_ns}"))?;
            let sock = UdpSocket::bind((src, 0)).map_err(|e| LabError::sys("bind probe", e))?;
            sock.connect(SocketAddr::from((dst, PORT)))
                .map_err(|e| LabError::sys("connect probe", e))?;
            sock.set_read_timeout(Some(Duration::from_millis(1500)))
                .map_err(|e| LabError::sys("timeout", e))?;
            let mut rtts = Vec::new();
            let mut buf = [0u8; 256];
            for seq in 0..n {
                let payload = [seq.to_be_bytes().as_slice(), &[0u8; 60]].concat();
                let t0 = Instant::now();
                sock.send(&payload)
                    .map_err(|e| LabError::sys("send probe", e))?;
                // Wait for this probe's echo; stale echoes of earlier probes are skipped.
                while let Ok(k) = sock.recv(&mut buf) {
                    if k >= 4 && buf[..4] == seq.to_be_bytes() {
                        rtts.push(t0.elapsed().as_secs_f64() * 1e3);
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(rtts)
        });
        let mut rtts = client
            .join()
            .map_err(|_| LabError::Measure("probe thread panicked".into()))??;
        if rtts.len() < (n as usize).div_ceil(2) {
            return Err(LabError::Measure(format!(
                "only {} of {n} RTT probes answered",
                rtts.len()
            )));
        }
        rtts.sort_by(f64::total_cmp);
        Ok((rtts[rtts.len() / 2], rtts[0]))
    })();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    result
}

/// Waits for `child` at most `limit`, killing it after; returns its stdout.
pub fn wait_output(mut child: Child, limit: Duration) -> Result<(bool, String), LabError> {
    let mut stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_string(&mut s);
        }
        s
    });
    let deadline = Instant::now() + limit;
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    Ok((ok, reader.join().unwrap_or_default()))
}

fn iperf3_client(
    lab: &Lab,
    p: &Probe,
    port: u16,
    extra: &[String],
    limit: Duration,
) -> Result<serde_json::Value, LabError> {
    let mut server = lab.command(&p.to, "iperf3")?;
    server
        .args([
            "-s",
            "-1",
            "-p",
            &port.to_string(),
            "-B",
            &p.dst.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let server = server
        .spawn()
        .map_err(|e| LabError::sys("start iperf3 (is it installed?)", e))?;
    let result = (|| {
        // The server needs a moment to listen; retry a refused connection for up to 3 s.
        let start = Instant::now();
        loop {
            let mut c = lab.command(&p.from, "iperf3")?;
            c.args([
                "-c",
                &p.dst.to_string(),
                "-p",
                &port.to_string(),
                "-B",
                &p.src.to_string(),
                "-J",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
            let child = c.spawn().map_err(|e| LabError::sys("start iperf3", e))?;
            let (_, out) = wait_output(child, limit)?;
            let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| {
                LabError::Measure(format!("iperf3 output is not JSON ({e}): {}", out.trim()))
            })?;
            match v.get("error").and_then(|e| e.as_str()) {
                Some(err)
                    if err.contains("refused") && start.elapsed() < Duration::from_secs(3) =>
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Some(err) => return Err(LabError::Measure(format!("iperf3: {err}"))),
                None => return Ok(v),
            }
        }
    })();
    let _ = wait_output(server, Duration::from_secs(3));
    result
}

/// One TCP stream with congestion control `cc` for `secs` (after `omit` s): Mbit/s received.
fn measure_tcp(lab: &Lab, p: &Probe, cc: &str, secs: u32, omit: u32) -> Result<f64, LabError> {
    let extra = [
        "-t".into(),
        secs.to_string(),
        "-O".into(),
        omit.to_string(),
        "-C".into(),
        cc.into(),
    ];
    let v = iperf3_client(
        lab,
        p,
        5201,
        &extra,
        Duration::from_secs((secs + omit + 20) as u64),
    )?;
    v.pointer("/end/sum_received/bits_per_second")
        .and_then(|b| b.as_f64())
        .map(|b| b / 1e6)
        .ok_or_else(|| LabError::Measure("iperf3: no sum_received".into()))
}

/// Sends `n` UDP packets at 70% of the bottleneck (at most 100 Mbit/s); says what became of
/// them. The sender is ours, not iperf3's: iperf3 catches up after a stall of its own in one
/// burst at CPU speed (30 ms behind at 100 Mbit/s is 375 KB, more than the 250 KB queue of a
/// 200 Mbit/s, 10 ms path: 338 drops in two runs here on 2026-11-24), while this one keeps
/// at most 2 ms of catch-up. Queues then stay short, so only random loss drops packets.
fn measure_loss(lab: &Lab, p: &Probe, n: u32) -> Result<UdpLoss, LabError> {
    let rate = p.rate_mbps.map_or(100.0, |r| (0.7 * r).min(100.0));
    let links0 = lab.stats().links;
    let (sent, received, socket_drops) = udp_burstless(
        &lab.netns(&p.from)?,
        &lab.netns(&p.to)?,
        p.src,
        p.dst,
        n,
        rate,
        Duration::from_secs_f64(p.rtt_cfg_ms / 1e3),
    )?;
    // Counters are published every 200 ms.
    std::thread::sleep(Duration::from_millis(250));
    let links1 = lab.stats().links;
    let delta = |f: fn(&crate::LinkStats) -> u64| -> u64 {
        p.route
            .iter()
            .filter_map(|&l| Some(f(links1.get(l)?).saturating_sub(f(links0.get(l)?))))
            .sum()
    };
    Ok(UdpLoss {
        sent,
        lost: sent - received,
        socket_drops,
        random_drops: delta(|l| l.loss_drops),
        queue_drops: delta(|l| l.queue_drops),
    })
}

/// Size of a loss probe datagram (UDP payload).
const LOSS_PROBE_LEN: usize = 1200;

/// Paces `n` datagrams of [`LOSS_PROBE_LEN`] bytes at `mbps` from `src` (in `from_ns`) to a
/// counting receiver at `dst` (in `to_ns`). Returns (sent, distinct received, datagrams the
/// receiving socket dropped because it was full).
fn udp_burstless(
    from_ns: &str,
    to_ns: &str,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    n: u32,
    mbps: f64,
    rtt: Duration,
) -> Result<(u64, u64, u64), LabError> {
    const PORT: u16 = 7398;
    let to_ns = to_ns.to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || -> Result<(u64, u64), LabError> {
        setns_path(&format!("/var/run/netns/{to_ns}"))?;
        let sock = UdpSocket::bind((dst, PORT)).map_err(|e| LabError::sys("bind loss sink", e))?;
        // Room for 400 ms at 100 Mbit/s where net.core.rmem_max allows (4 MiB here): the
        // socket is the instrument, a receiver stalled by the host must not drop.
        set_rcvbuf(&sock, 4 << 20);
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .map_err(|e| LabError::sys("timeout", e))?;
        // This thread's namespace, not the process's (/proc/self/net is the main thread's).
        let drops = || snmp_rcvbuf_errors("/proc/thread-self/net/snmp");
        let drops0 = drops()?;
        let _ = ready_tx.send(());
        let mut seen = vec![false; n as usize];
        let mut received = 0u64;
        let mut buf = [0u8; LOSS_PROBE_LEN];
        while !stop2.load(Ordering::Relaxed) {
            if let Ok(k) = sock.recv(&mut buf) {
                if k >= 4 {
                    let seq = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    if let Some(s) = seen.get_mut(seq).filter(|s| !**s) {
                        *s = true;
                        received += 1;
                    }
                }
            }
        }
        Ok((received, drops()?.saturating_sub(drops0)))
    });
    let from_ns = from_ns.to_string();
    let sent = (|| -> Result<u64, LabError> {
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|_| LabError::Measure("loss sink did not start".into()))?;
        let sender = std::thread::spawn(move || -> Result<u64, LabError> {
            setns_path(&format!("/var/run/netns/{from_ns}"))?;
            let sock =
                UdpSocket::bind((src, 0)).map_err(|e| LabError::sys("bind loss probe", e))?;
            sock.connect(SocketAddr::from((dst, PORT)))
                .map_err(|e| LabError::sys("connect loss probe", e))?;
            let gap = Duration::from_secs_f64(LOSS_PROBE_LEN as f64 * 8.0 / (mbps * 1e6));
            let slack = Duration::from_millis(2);
            let mut payload = [0u8; LOSS_PROBE_LEN];
            let mut due = Instant::now();
            let mut sent = 0u64;
            for seq in 0..n {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                } else if now - due > slack {
                    // Fell behind (the host stalled us): forget the debt beyond the slack.
                    due = now - slack;
                }
                payload[..4].copy_from_slice(&seq.to_be_bytes());
                match sock.send(&payload) {
                    Ok(_) => sent += 1,
                    // The TUN's queue is full: not sent, so not lost on the path.
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(e) => return Err(LabError::sys("send loss probe", e)),
                }
                due += gap;
            }
            Ok(sent)
        });
        let sent = sender
            .join()
            .map_err(|_| LabError::Measure("loss probe thread panicked".into()))??;
        // The last datagrams are one way (half the RTT) and any queue away.
        std::thread::sleep(rtt + Duration::from_millis(500));
        Ok(sent)
    })();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let got = receiver
        .join()
        .map_err(|_| LabError::Measure("loss sink thread panicked".into()))?;
    let sent = sent?;
    let (received, socket_drops) = got?;
    if sent == 0 {
        return Err(LabError::Measure(
            "no loss probe datagram could be sent".into(),
        ));
    }
    Ok((sent, received, socket_drops))
}

/// Asks for a receive buffer of `bytes` (the kernel caps it at net.core.rmem_max).
fn set_rcvbuf(sock: &UdpSocket, bytes: usize) {
    // Best effort: the drops of a smaller buffer are counted apart (RcvbufErrors).
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(sock, bytes);
}

/// UDP datagrams dropped by full receive buffers, from an snmp file of /proc.
fn snmp_rcvbuf_errors(path: &str) -> Result<u64, LabError> {
    let text = std::fs::read_to_string(path).map_err(|e| LabError::sys("read snmp counters", e))?;
    snmp_counter(&text, "Udp:", "RcvbufErrors")
        .ok_or_else(|| LabError::Measure(format!("no Udp RcvbufErrors in {path}")))
}

/// A counter of /proc/net/snmp: the line after the header line of `proto` holds the values.
pub(super) fn snmp_counter(snmp: &str, proto: &str, name: &str) -> Option<u64> {
    let mut lines = snmp.lines().filter(|l| l.starts_with(proto));
    let header = lines.next()?;
    let values = lines.next()?;
    let i = header.split_whitespace().position(|h| h == name)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

pub(super) fn measure_path(
    lab: &Lab,
    p: &Probe,
    opts: &CheckOptions,
    attempt: u32,
) -> Result<PathCheck, LabError> {
    let late0 = lab.stats().late_events;
    // Watches the host over the same window as `late0 .. late_events`; stopped on every exit.
    let probe = HostProbeRun::start();
    let (rtt, rtt_min) = measure_rtt(
        &lab.netns(&p.from)?,
        &lab.netns(&p.to)?,
        p.src,
        p.dst,
        opts.probes,
    )?;
    let mut pc = PathCheck {
        label: p.label.clone(),
        rtt_cfg_ms: p.rtt_cfg_ms,
        rtt_ms: rtt,
        rtt_min_ms: rtt_min,
        rate_mbps: p.rate_mbps,
        loss_cfg: p.loss,
        attempts: attempt,
        ..Default::default()
    };
    for cc in &opts.ccs {
        pc.tcp.push((
            cc.clone(),
            measure_tcp(lab, p, cc, opts.tcp_s, opts.omit_s)?,
        ));
    }
    if opts.udp_packets > 0 {
        pc.loss = Some(measure_loss(lab, p, opts.udp_packets)?);
    } else {
        // Counters are published every 200 ms.
        std::thread::sleep(Duration::from_millis(250));
    }
    pc.late_events = lab.stats().late_events - late0;
    pc.host = probe.finish();
    Ok(pc)
}
