//! Namespaces, bridges and veths, built and removed with `ip`; state files under `/run/bclab`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use crate::forwarder::{rps_mask, TUN_NAME};
use crate::kernel;
use crate::scenario::Layout;
use crate::LabError;

/// Every namespace the lab creates starts with this, so cleanup never touches anything else.
pub const NS_PREFIX: &str = "bclab-";
/// Root of the state directories.
pub const STATE_ROOT: &str = "/run/bclab";

/// Namespace of one host: `bclab-<lab>.h.<host>` (lab and host names cannot contain '.').
pub fn host_ns(lab: &str, host: &str) -> String {
    format!("{NS_PREFIX}{lab}.h.{host}")
}

/// Namespace holding the site bridges.
pub fn hub_ns(lab: &str) -> String {
    format!("{NS_PREFIX}{lab}.hub")
}

/// State directory of a lab.
pub fn state_dir(lab: &str) -> PathBuf {
    Path::new(STATE_ROOT).join(lab)
}

/// Runs a command, returning its stdout; a non-zero exit is an error with its stderr.
pub fn run_cmd(cmd: &mut Command) -> Result<String, LabError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::sys(format!("run {cmd:?}"), e))?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<String, LabError> {
    run_cmd(Command::new("ip").args(args))
}

/// Feeds `script` to `ip [-n ns] -batch -`.
fn ip_batch(ns: Option<&str>, script: &str) -> Result<(), LabError> {
    use std::io::Write;
    let mut cmd = Command::new("ip");
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| LabError::sys("run ip -batch", e))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(script.as_bytes())
        .map_err(|e| LabError::sys("write to ip -batch", e))?;
    let out = child
        .wait_with_output()
        .map_err(|e| LabError::sys("wait for ip -batch", e))?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: format!("ip -batch ({})", ns.unwrap_or("root")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Checks that the lab can run here: root, `ip`, `/dev/net/tun`, and namespaces.
pub fn preflight() -> Result<(), LabError> {
    if !rustix::process::geteuid().is_root() {
        return Err(LabError::NotPermitted("not running as root".into()));
    }
    if !Path::new("/dev/net/tun").exists() {
        return Err(LabError::NotPermitted("/dev/net/tun is missing".into()));
    }
    // Root without CAP_SYS_ADMIN (an unprivileged container) cannot create namespaces: try one.
    let probe = format!("{NS_PREFIX}preflight-{}", std::process::id());
    ip(&["netns", "add", &probe])
        .map_err(|e| LabError::NotPermitted(format!("cannot create a network namespace: {e}")))?;
    let _ = ip(&["netns", "del", &probe]);
    Ok(())
}

/// All lab namespaces currently present whose names start with `prefix`.
pub fn list_ns(prefix: &str) -> Result<Vec<String>, LabError> {
    let out = ip(&["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect())
}

/// Kills every process inside namespace `ns` (TERM, then KILL after a grace period).
pub fn kill_ns_processes(ns: &str) {
    let pids = |ns: &str| -> Vec<i32> {
        ip(&["netns", "pids", ns])
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&p: &i32| p > 1 && p != std::process::id() as i32)
            .collect()
    };
    let first = pids(ns);
    if first.is_empty() {
        return;
    }
    for &p in &first {
        // A process that lives in our own lab namespace.
        signal(p, Signal::TERM);
    }
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline && !pids(ns).is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for p in pids(ns) {
        signal(p, Signal::KILL);
    }
}

/// Sends `sig` to process `pid` (never to a group: `pid` <= 0 is ignored); a process that is
/// already gone is no error here, the callers check what they need.
pub fn signal(pid: i32, sig: Signal) {
    if pid > 0 {
        if let Some(p) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(p, sig);
        }
    }
}

/// Removes every namespace of lab `lab` and the processes in them, and its state directory.
pub fn remove_lab(lab: &str) -> Result<(), LabError> {
    let prefix = format!("{NS_PREFIX}{lab}.");
    let mut first_err = None;
    for ns in list_ns(&prefix)? {
        kill_ns_processes(&ns);
        if let Err(e) = ip(&["netns", "del", &ns]) {
            first_err.get_or_insert(e);
        }
    }
    let _ = std::fs::remove_dir_all(state_dir(lab));
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Creates the namespaces, the hub with one bridge per site and the veths (not the TUNs).
pub fn build(lab: &str, layout: &Layout) -> Result<(), LabError> {
    let hub = hub_ns(lab);
    ip(&["netns", "add", &hub])?;
    let mut hub_script = String::from("link set lo up\n");
    for s in 0..layout.sites.len() {
        // Snooping off: without an IGMP querier the bridge floods multicast, so it just works.
        hub_script.push_str(&format!(
            "link add br{s} type bridge mcast_snooping 0\nlink set br{s} up\n"
        ));
    }
    for (i, h) in layout.hosts.iter().enumerate() {
        let ns = host_ns(lab, &h.name);
        ip(&["netns", "add", &ns])?;
        if h.port_delay_ns > 0 {
            // Its port is a TAP pair the forwarder creates (`attach_ports`).
            continue;
        }
        hub_script.push_str(&format!(
            "link add v{i} type veth peer name lan0 netns {ns}\nlink set v{i} master br{} up\n",
            bridge(layout, i)
        ));
    }
    ip_batch(Some(&hub), &hub_script)
}

/// The bridge of host `i`'s port: its site's, or the one bridge of kernel shaping (every host
/// on it, its access links shaped on its port).
fn bridge(layout: &Layout, i: usize) -> usize {
    if layout.kernel_shaping {
        0
    } else {
        layout.hosts[i].site
    }
}

/// Once the forwarder has created the delayed ports' TAPs (`lan.rs`): enslaves their hub sides
/// to the bridges, lengthens their queues, and shapes every port of a kernel-shaped lab.
pub fn attach_ports(lab: &str, layout: &Layout) -> Result<(), LabError> {
    let hub = hub_ns(lab);
    let mut hub_script = String::new();
    for i in layout.delayed_ports() {
        let ns = host_ns(lab, &layout.hosts[i].name);
        // Frames the delay stage has not read yet wait here: a short queue would drop a burst.
        ip(&[
            "-n",
            &ns,
            "link",
            "set",
            crate::lan::HOST_PORT,
            "txqueuelen",
            "10000",
        ])?;
        hub_script.push_str(&format!(
            "link set {} txqueuelen 10000 master br{} up\n",
            crate::lan::hub_port(i),
            bridge(layout, i)
        ));
    }
    if !hub_script.is_empty() {
        ip_batch(Some(&hub), &hub_script)?;
    }
    if layout.kernel_shaping {
        kernel::shape_hub(&hub, layout)?;
    }
    Ok(())
}

/// Configures each host once its TUN exists: addresses, routes, sysctls, RPS.
pub fn configure_hosts(lab: &str, layout: &Layout) -> Result<(), LabError> {
    let rps = rps_mask();
    let mut children = Vec::new();
    for (i, h) in layout.hosts.iter().enumerate() {
        let ns = host_ns(lab, &h.name);
        let mut sh = String::from("set -e\n");
        for (k, v) in [
            ("net.ipv6.conf.all.disable_ipv6", "1"),
            ("net.ipv6.conf.default.disable_ipv6", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.lan0.rp_filter", "0"),
            ("net.ipv4.conf.wan0.rp_filter", "0"),
            // Room for a BDP of 1 Gbit/s x 250 ms in one TCP flow.
            ("net.ipv4.tcp_rmem", "4096 131072 67108864"),
            ("net.ipv4.tcp_wmem", "4096 16384 67108864"),
            // Each measurement starts from a fresh cwnd/ssthresh.
            ("net.ipv4.tcp_no_metrics_save", "1"),
        ] {
            sh.push_str(&format!("echo '{v}' > /proc/sys/{}\n", k.replace('.', "/")));
        }
        if let Some(mask) = &rps {
            // Receive processing of packets the forwarder writes runs on the other cores.
            sh.push_str(&format!(
                "echo {mask} > /sys/class/net/{TUN_NAME}/queues/rx-0/rps_cpus\n"
            ));
        }
        sh.push_str("ip link set lo up\nip link set lan0 up\n");
        sh.push_str(&format!("ip addr add {}/24 dev lan0\n", h.addr));
        // A long txqueuelen: a full TUN queue drops silently (only "TX dropped" shows it).
        sh.push_str(&format!(
            "ip link set {TUN_NAME} mtu 1500 txqueuelen 10000 up\n"
        ));
        let wan = if layout.kernel_shaping {
            sh.push_str(&kernel::host_script(layout, i));
            "lan0"
        } else {
            TUN_NAME
        };
        sh.push_str(&format!(
            "ip route add 10.77.0.0/16 dev {wan} src {}\n",
            h.addr
        ));
        sh.push_str("ip route add 224.0.0.0/4 dev lan0\n");
        sh.push_str(&port_loss_script(h.port_loss));
        for c in &layout.channels {
            let (mine, peer) = if c.a == i {
                (c.a_addr, c.b_addr)
            } else if c.b == i {
                (c.b_addr, c.a_addr)
            } else {
                continue;
            };
            sh.push_str(&format!("ip addr add {mine}/32 dev {TUN_NAME}\n"));
            sh.push_str(&format!(
                "ip route add {peer}/32 dev {TUN_NAME} src {mine}\n"
            ));
        }
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "sh", "-c", &sh])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LabError::sys("run ip netns exec", e))?;
        children.push((ns, child));
        // A few at a time: enough parallelism without a fork storm on 2 cores.
        if children.len() >= 8 {
            wait_all(&mut children)?;
        }
    }
    wait_all(&mut children)
}

/// The nft rule of a host's port loss: a random share of every packet arriving on `lan0`
/// (LAN, multicast, and with kernel shaping WAN traffic too), in a table of its own beside
/// kernel shaping's loss between sites. Empty without loss.
fn port_loss_script(loss: f64) -> String {
    if loss <= 0.0 {
        return String::new();
    }
    let ppm = (loss * 1e6).round() as u64;
    format!(
        "nft -f - <<'EOF'\ntable ip bclab_port {{\n chain loss {{\n  type filter hook prerouting \
         priority -301; policy accept;\n  iifname \"lan0\" numgen random mod 1000000 < {ppm} \
         counter drop\n }}\n}}\nEOF\n"
    )
}

/// Port loss is an nft rule: refuses a layout that has one where `nft` is missing.
pub fn preflight_port_loss(layout: &Layout) -> Result<(), LabError> {
    if layout.hosts.iter().all(|h| h.port_loss <= 0.0) {
        return Ok(());
    }
    let found = Command::new("sh")
        .args(["-c", "command -v nft"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        Ok(())
    } else {
        Err(LabError::NotPermitted(
            "a host's loss is an nft rule: install the Debian package nftables".into(),
        ))
    }
}

fn wait_all(children: &mut Vec<(String, std::process::Child)>) -> Result<(), LabError> {
    let mut err = None;
    for (ns, c) in children.drain(..) {
        let out = c.wait_with_output().map_err(|e| LabError::sys("wait", e))?;
        if !out.status.success() && err.is_none() {
            err = Some(LabError::Command {
                cmd: format!("configure {ns}"),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    err.map_or(Ok(()), Err)
}

/// Raises the (machine-wide) receive backlog so RPS queues do not drop bursts from the
/// forwarder; never lowers it.
pub fn tune_global() {
    let p = "/proc/sys/net/core/netdev_max_backlog";
    let cur: u64 = std::fs::read_to_string(p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if cur < 10000 {
        let _ = std::fs::write(p, "10000");
    }
}

/// The "TX dropped" counter of `wan0` in a host namespace: non-zero means the forwarder did not
/// keep up and the run is invalid.
pub fn tx_dropped(ns: &str) -> Result<u64, LabError> {
    let out = run_cmd(Command::new("ip").args([
        "netns",
        "exec",
        ns,
        "cat",
        &format!("/sys/class/net/{TUN_NAME}/statistics/tx_dropped"),
    ]))?;
    out.trim()
        .parse()
        .map_err(|_| LabError::Measure(format!("bad tx_dropped value {out:?} in {ns}")))
}
