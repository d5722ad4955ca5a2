//! Kernel shaping: a lab whose links between sites have rates on access links and random loss,
//! nothing else, runs without the forwarder.
//!
//! Every host's veth joins one bridge. A host's uplink is an htb class on its `lan0` egress, its
//! downlink an htb class on the hub side of its veth, each with a drop-tail `bfifo` of the
//! access link's queue; traffic inside the host's own site bypasses both (a LAN is not
//! emulated). Random loss between two sites is an nft rule at the receiving host's prerouting
//! hook, by source subnet. A host sends with its segmentation offloads (cheap on 2 cores), and
//! the hub side of each veth segments what it delivers (`tso`/`gso` off there, and UDP's
//! `tx-udp-segmentation` where the host has a loss rule; `gro` off in the host), so every loss
//! decision is made per packet of at most 1500 bytes, as in the forwarder;
//! the uplink's htb sees the sender's larger segments, which changes no rate.
//!
//! Why: the forwarder moves every packet of the lab through one thread, which caps a star of
//! 8 hosts at 100 Mbit/s near 0.90 of the link rate, and a benchmark cannot then see the last
//! 5%. htb counts Ethernet frames (1514 bytes for 1448 of TCP payload), so one TCP stream tops
//! out at 0.956 of the rate, the figure of the reference harness in `shared/README.md`.

use std::fmt::Write;
use std::process::Command;

use crate::netns::run_cmd;
use crate::scenario::Layout;
use crate::LabError;

/// Class ids of the htb tree on each shaped device.
const SHAPED: &str = "1:10";
const LOCAL: &str = "1:20";
/// Rate of the class that carries a site's own traffic (not emulated).
const LOCAL_RATE: &str = "10gbit";

/// The /24 of site `s` (every host of a site has its address in it).
pub fn site_subnet(layout: &Layout, s: usize) -> Option<String> {
    layout.hosts.iter().find(|h| h.site == s).map(|h| {
        let o = h.addr.octets();
        format!("{}.{}.{}.0/24", o[0], o[1], o[2])
    })
}

/// Shell commands (run under `set -e` inside host `i`'s namespace): offloads off, the uplink's
/// htb on `lan0`, and the random loss of every other site's packets into this host.
pub fn host_script(layout: &Layout, i: usize) -> String {
    let h = &layout.hosts[i];
    let mut sh = String::from("ethtool -K lan0 gro off >/dev/null\n");
    let own = site_subnet(layout, h.site).unwrap_or_default();
    let up = &layout.links[h.uplink];
    if let Some(rate) = up.rate_bps {
        sh.push_str(&htb("lan0", rate, up.queue_bytes, "dst", &own));
    }
    let rules: Vec<String> = lossy_sources(layout, h.site)
        .filter_map(|(s, loss)| {
            let net = site_subnet(layout, s)?;
            let ppm = (loss * 1e6).round() as u64;
            Some(format!(
                "ip saddr {net} numgen random mod 1000000 < {ppm} counter drop"
            ))
        })
        .collect();
    if !rules.is_empty() {
        let _ = writeln!(
            sh,
            "nft -f - <<'EOF'\ntable ip bclab {{\n chain loss {{\n  type filter hook prerouting \
             priority -300; policy accept;\n  {}\n }}\n}}\nEOF",
            rules.join("\n  ")
        );
    }
    sh
}

/// The other sites whose packets into `site` meet random loss, with that loss: the host's loss
/// rules.
fn lossy_sources(layout: &Layout, site: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
    (0..layout.sites.len())
        .filter(move |&s| s != site)
        .map(move |s| (s, layout.site_loss(s, site)))
        .filter(|&(_, loss)| loss > 0.0)
}

/// Shapes every host's downlink on the hub side of its veth, and turns the hub side's offloads
/// off.
pub fn shape_hub(hub_ns: &str, layout: &Layout) -> Result<(), LabError> {
    let mut sh = String::from("set -e\n");
    for (i, h) in layout.hosts.iter().enumerate() {
        let dev = format!("v{i}");
        let _ = writeln!(sh, "ethtool -K {dev} tso off gso off gro off >/dev/null");
        // `gso off` leaves UDP segmentation on: a sender's UDP GSO run (8-32 datagrams) then
        // crossed as one packet and the receiver's loss rule dropped it whole, a burst no
        // wire makes. Only where a loss rule decides: cutting costs the two cores a packet per
        // datagram per receiver. A kernel without the feature has no UDP GSO to cut.
        if lossy_sources(layout, h.site).next().is_some() {
            let _ = writeln!(
                sh,
                "ethtool -K {dev} tx-udp-segmentation off >/dev/null 2>&1 || true"
            );
        }
        let down = &layout.links[h.downlink];
        if let Some(rate) = down.rate_bps {
            let own = site_subnet(layout, h.site).unwrap_or_default();
            sh.push_str(&htb(&dev, rate, down.queue_bytes, "src", &own));
        }
    }
    run_cmd(Command::new("ip").args(["netns", "exec", hub_ns, "sh", "-c", &sh])).map(|_| ())
}

/// Preflight of kernel shaping: the tools it runs.
pub fn preflight(layout: &Layout) -> Result<(), LabError> {
    let lossy = (0..layout.sites.len())
        .any(|a| (0..layout.sites.len()).any(|b| a != b && layout.site_loss(a, b) > 0.0));
    let mut need = vec![("tc", "iproute2"), ("ethtool", "ethtool")];
    if lossy {
        need.push(("nft", "nftables"));
    }
    for (tool, package) in need {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(LabError::NotPermitted(format!(
                "kernel shaping runs {tool}: install the Debian package {package}, or set \
                 shaping = \"forwarder\" in the scenario"
            )));
        }
    }
    Ok(())
}

/// An htb tree on `dev`: traffic whose `dir` address (src or dst) is in `own` (the site's
/// LAN) passes unshaped, everything else crosses one class at `rate_bps` with a drop-tail queue
/// of `queue_bytes`.
fn htb(dev: &str, rate_bps: f64, queue_bytes: u64, dir: &str, own: &str) -> String {
    let rate = rate_bps.round() as u64;
    let mut s = String::new();
    let _ = writeln!(s, "tc qdisc add dev {dev} root handle 1: htb default 10");
    let _ = writeln!(
        s,
        "tc class add dev {dev} parent 1: classid {SHAPED} htb rate {rate}bit ceil {rate}bit"
    );
    let _ = writeln!(
        s,
        "tc qdisc add dev {dev} parent {SHAPED} handle 10: bfifo limit {queue_bytes}"
    );
    if !own.is_empty() {
        let _ = writeln!(
            s,
            "tc class add dev {dev} parent 1: classid {LOCAL} htb rate {LOCAL_RATE}"
        );
        let _ = writeln!(
            s,
            "tc filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip {dir} {own} \
             flowid {LOCAL}"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use crate::scenario::Scenario;

    const STAR: &str = r#"
name = "k"
[[site]]
name = "s0"
uplink_mbps = 100
downlink_mbps = 100
[[site.host]]
name = "src"
[[site]]
name = "s1"
uplink_mbps = 100
downlink_mbps = 100
[[site.host]]
name = "rx"
[default_path]
loss = 0.01
"#;

    #[test]
    fn a_star_without_delay_is_shaped_by_the_kernel() {
        let layout = Scenario::parse(STAR).unwrap().resolve().unwrap();
        assert!(layout.kernel_shaping);
        let sh = super::host_script(&layout, 1);
        assert!(sh.contains("htb rate 100000000bit"), "{sh}");
        assert!(sh.contains("match ip dst 10.77.2.0/24"), "{sh}");
        // 1% of the source site's packets into rx, none of its own site's.
        assert!(
            sh.contains("ip saddr 10.77.1.0/24 numgen random mod 1000000 < 10000 counter drop"),
            "{sh}"
        );
        assert!(!sh.contains("ip saddr 10.77.2.0/24"), "{sh}");
    }

    #[test]
    fn delay_keeps_the_forwarder_and_kernel_refuses_it() {
        let with_delay = format!("{STAR}rtt_ms = 50\n");
        let layout = Scenario::parse(&with_delay).unwrap().resolve().unwrap();
        assert!(!layout.kernel_shaping);
        let forced = with_delay.replace("name = \"k\"", "name = \"k\"\nshaping = \"kernel\"");
        // The scenario is resolved as it is parsed, so the error comes from parse.
        let err = Scenario::parse(&forced).unwrap_err();
        assert!(err.to_string().contains("delay"), "{err}");
        let off = STAR.replace("name = \"k\"", "name = \"k\"\nshaping = \"forwarder\"");
        assert!(
            !Scenario::parse(&off)
                .unwrap()
                .resolve()
                .unwrap()
                .kernel_shaping
        );
    }
}
