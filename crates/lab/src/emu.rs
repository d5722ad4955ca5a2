//! The emulator core, free of I/O: packets enter with a timestamp, cross a chain of links
//! (sender's access uplink, WAN path or channel, receiver's access downlink) and leave when due.
//!
//! Each link is a line-rate server with a bounded drop-tail queue, followed by a delay line
//! with optional jitter and random loss. Decisions are made per IP packet (MTU 1500), never per
//! GSO super-packet, so loss and queue behaviour match a real 1500-byte path.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::Ipv4Addr;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::scenario::Layout;

/// Counters of one directed link.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStats {
    /// Link name.
    pub name: String,
    /// Packets offered to the link.
    pub pkts_in: u64,
    /// Packets that left the link.
    pub pkts_out: u64,
    /// IP bytes that left the link.
    pub bytes_out: u64,
    /// Packets dropped because the queue was full.
    pub queue_drops: u64,
    /// Packets dropped by random loss.
    pub loss_drops: u64,
    /// Current rate in bit/s (0: unlimited).
    pub rate_bps: f64,
}

/// Counters of the whole forwarder.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EmuStats {
    /// Packets read from hosts.
    pub pkts_read: u64,
    /// Packets written to hosts.
    pub pkts_written: u64,
    /// Packets with no route (non-IPv4, unknown destination, same-site traffic on the TUN).
    pub unroutable: u64,
    /// Failed writes into a host's TUN.
    pub write_errors: u64,
    /// Largest delay between an event's due time and its processing, in ns.
    pub max_lateness_ns: u64,
    /// Events processed more than 1 ms after their due time.
    pub late_events: u64,
    /// Longest stretch the forwarder loop spent without sleeping, in ns.
    pub max_busy_ns: u64,
    /// Longest time the forwarder woke up after its timer was due, in ns.
    pub max_oversleep_ns: u64,
    /// Frames the port delay stage copied (hosts with a `delay_ms`, `lan.rs`).
    #[serde(default)]
    pub port_frames: u64,
    /// Frames the port delay stage dropped because a queue was full.
    #[serde(default)]
    pub port_drops: u64,
    /// Frames a delayed port's far device refused (down: while the lab sets hosts up).
    #[serde(default)]
    pub port_refused: u64,
    /// Per-link counters.
    pub links: Vec<LinkStats>,
}

struct LinkState {
    rate_bps: Option<f64>,
    busy_until: u64,
    queue_bytes: u64,
    delay_ns: u64,
    jitter_ns: u64,
    loss: f64,
    reorder: bool,
    last_delivery: u64,
    rng: SmallRng,
}

struct InFlight {
    buf: Vec<u8>,
    route: [usize; 3],
    stage: u8,
    dst: usize,
}

#[derive(Clone, Copy)]
struct Route {
    links: [usize; 3],
    dst: usize,
}

/// The emulator: feed it packets with [`Emulator::ingress`], collect deliveries with
/// [`Emulator::advance`], sleep until [`Emulator::next_deadline`].
pub struct Emulator {
    links: Vec<LinkState>,
    nominal: Vec<(Option<f64>, f64)>,
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    seq: u64,
    slots: Vec<Option<InFlight>>,
    free_slots: Vec<usize>,
    pool: Vec<Vec<u8>>,
    routes: HashMap<(usize, u32), Route>,
    epoch: u64,
    events: Vec<crate::scenario::LayoutEvent>,
    next_event: usize,
    alternates: Vec<(crate::scenario::LayoutAlternate, u64)>,
    fluct: Option<(crate::scenario::LayoutFluctuation, u64, SmallRng)>,
    seed: u64,
    stats: EmuStats,
}

const LATE_NS: u64 = 1_000_000;

impl Emulator {
    /// Builds the emulator for a layout; the scenario clock starts at `now` (ns).
    pub fn new(layout: &Layout, now: u64) -> Self {
        let links = layout
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| LinkState {
                rate_bps: l.rate_bps,
                busy_until: 0,
                queue_bytes: l.queue_bytes,
                delay_ns: l.delay_ns,
                jitter_ns: l.jitter_ns,
                loss: l.loss,
                reorder: l.reorder,
                last_delivery: 0,
                // One stream per link: a link's loss pattern does not depend on other traffic.
                rng: SmallRng::seed_from_u64(
                    layout.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
            })
            .collect();
        let mut routes = HashMap::new();
        let mut addrs: Vec<Ipv4Addr> = layout.hosts.iter().map(|h| h.addr).collect();
        for c in &layout.channels {
            addrs.extend([c.a_addr, c.b_addr]);
        }
        for a in 0..layout.hosts.len() {
            for &d in &addrs {
                if let Some(r) = layout.route(a, d) {
                    let dst = layout
                        .hosts
                        .iter()
                        .position(|h| h.downlink == r[2])
                        .expect("route ends at a host's downlink");
                    routes.insert(
                        (a, u32::from(d)),
                        Route {
                            links: [r[0], r[1], r[2]],
                            dst,
                        },
                    );
                }
            }
        }
        let stats = EmuStats {
            links: layout
                .links
                .iter()
                .map(|l| LinkStats {
                    name: l.name.clone(),
                    rate_bps: l.rate_bps.unwrap_or(0.0),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut e = Emulator {
            links,
            nominal: layout.links.iter().map(|l| (l.rate_bps, l.loss)).collect(),
            heap: BinaryHeap::new(),
            seq: 0,
            slots: Vec::new(),
            free_slots: Vec::new(),
            pool: Vec::new(),
            routes,
            epoch: now,
            events: layout.events.clone(),
            next_event: 0,
            alternates: layout.alternates.iter().map(|a| (a.clone(), 0)).collect(),
            fluct: None,
            seed: layout.seed,
            stats,
        };
        e.fluct = layout
            .fluctuation
            .clone()
            .map(|f| (f, 0, SmallRng::seed_from_u64(layout.seed)));
        e.start_clock(now);
        e
    }

    /// Restarts the scenario clock at `now`: nominal conditions, schedule from the beginning.
    pub fn start_clock(&mut self, now: u64) {
        self.epoch = now;
        for (i, (r, l)) in self.nominal.iter().enumerate() {
            self.links[i].rate_bps = *r;
            self.links[i].loss = *l;
        }
        self.next_event = 0;
        for a in &mut self.alternates {
            a.1 = 0;
        }
        if let Some(f) = &mut self.fluct {
            f.1 = 0;
            f.2 = SmallRng::seed_from_u64(self.seed);
        }
        self.apply_schedule(now);
    }

    /// A free packet buffer (reuses delivered packets' buffers).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| Vec::with_capacity(2048))
    }

    /// Returns a buffer to the pool.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.pool.len() < 4096 {
            buf.clear();
            self.pool.push(buf);
        }
    }

    /// A packet read from host `src` at time `now`.
    pub fn ingress(&mut self, now: u64, src: usize, buf: Vec<u8>) {
        self.stats.pkts_read += 1;
        let route = if buf.len() >= 20 && buf[0] >> 4 == 4 {
            let dst = u32::from_be_bytes([buf[16], buf[17], buf[18], buf[19]]);
            self.routes.get(&(src, dst)).copied()
        } else {
            None
        };
        let Some(route) = route else {
            self.stats.unroutable += 1;
            self.recycle(buf);
            return;
        };
        let p = InFlight {
            buf,
            route: route.links,
            stage: 0,
            dst: route.dst,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s] = Some(p);
                s
            }
            None => {
                self.slots.push(Some(p));
                self.slots.len() - 1
            }
        };
        self.step(now, slot);
    }

    /// Moves the packet in `slot`, due at `t`, through as many stages as are due at `t`.
    fn step(&mut self, t: u64, slot: usize) {
        let p = self.slots[slot].as_mut().expect("live slot");
        let stage = p.stage as usize;
        if stage == 3 {
            // Ready for delivery: advance() hands it out.
            self.push(t, slot);
            return;
        }
        let li = p.route[stage];
        let len = p.buf.len() as u64;
        let l = &mut self.links[li];
        let st = &mut self.stats.links[li];
        st.pkts_in += 1;
        let depart = match l.rate_bps {
            None => t,
            Some(rate) => {
                let start = l.busy_until.max(t);
                let backlog = ((start - t) as f64 * rate / 8e9) as u64;
                if backlog + len > l.queue_bytes {
                    st.queue_drops += 1;
                    self.drop_slot(slot);
                    return;
                }
                l.busy_until = start + (len as f64 * 8e9 / rate) as u64;
                l.busy_until
            }
        };
        if l.loss > 0.0 && l.rng.gen::<f64>() < l.loss {
            st.loss_drops += 1;
            self.drop_slot(slot);
            return;
        }
        let mut due = depart + l.delay_ns;
        if l.jitter_ns > 0 {
            let j = l.rng.gen_range(-(l.jitter_ns as i64)..=l.jitter_ns as i64);
            due = (due as i64 + j).max(depart as i64) as u64;
        }
        if !l.reorder {
            due = due.max(l.last_delivery);
            l.last_delivery = due;
        }
        st.pkts_out += 1;
        st.bytes_out += len;
        p.stage += 1;
        self.push(due, slot);
    }

    fn push(&mut self, due: u64, slot: usize) {
        self.seq += 1;
        self.heap.push(Reverse((due, self.seq, slot)));
    }

    fn drop_slot(&mut self, slot: usize) {
        let p = self.slots[slot].take().expect("live slot");
        self.free_slots.push(slot);
        self.recycle(p.buf);
    }

    /// Processes everything due by `now`; `deliver(dst_host, packet)` is called for each packet
    /// that leaves the emulator.
    pub fn advance(&mut self, now: u64, mut deliver: impl FnMut(usize, &[u8]) -> bool) {
        self.apply_schedule(now);
        while let Some(&Reverse((due, _, slot))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            let late = now - due;
            self.stats.max_lateness_ns = self.stats.max_lateness_ns.max(late);
            if late > LATE_NS {
                self.stats.late_events += 1;
            }
            let p = self.slots[slot].as_ref().expect("live slot");
            if p.stage == 3 {
                if deliver(p.dst, &p.buf) {
                    self.stats.pkts_written += 1;
                } else {
                    self.stats.write_errors += 1;
                }
                self.drop_slot(slot);
            } else {
                // Later stages see the packet at its logical arrival time, not at `now`, so
                // processing delays do not accumulate along the chain.
                self.step(due, slot);
            }
        }
    }

    /// Applies scheduled changes, alternations and fluctuation ticks due by `now`.
    fn apply_schedule(&mut self, now: u64) {
        let rel = now.saturating_sub(self.epoch);
        while let Some(e) = self.events.get(self.next_event) {
            if e.at_ns > rel {
                break;
            }
            if let Some(r) = e.rate_bps {
                self.links[e.link].rate_bps = Some(r);
                self.stats.links[e.link].rate_bps = r;
            }
            if let Some(l) = e.loss {
                self.links[e.link].loss = l;
            }
            self.next_event += 1;
        }
        for (a, tick) in &mut self.alternates {
            let k = rel / a.every_ns;
            if k >= *tick {
                let r = a.rates_bps[(k % a.rates_bps.len() as u64) as usize];
                self.links[a.link].rate_bps = Some(r);
                self.stats.links[a.link].rate_bps = r;
                *tick = k + 1;
            }
        }
        if let Some((f, tick, rng)) = &mut self.fluct {
            // Tick 0 is nominal; every later tick draws one share per link, in link order, so
            // the same seed gives the same sequence whatever the traffic.
            let k = rel / f.every_ns;
            while *tick < k {
                *tick += 1;
                for &(l, nominal) in &f.links {
                    let share = rng.gen_range(f.min_share..=f.max_share);
                    self.links[l].rate_bps = Some(nominal * share);
                    self.stats.links[l].rate_bps = nominal * share;
                }
            }
        }
    }

    /// The next time something is due (a packet or a condition change), if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let mut d = self.heap.peek().map(|Reverse((t, _, _))| *t);
        let mut consider = |t: u64| d = Some(d.map_or(t, |x: u64| x.min(t)));
        if let Some(e) = self.events.get(self.next_event) {
            consider(self.epoch + e.at_ns);
        }
        for (a, tick) in &self.alternates {
            consider(self.epoch + tick * a.every_ns);
        }
        if let Some((f, tick, _)) = &self.fluct {
            consider(self.epoch + (tick + 1) * f.every_ns);
        }
        d
    }

    /// Packets currently inside the emulator.
    pub fn in_flight(&self) -> usize {
        self.heap.len()
    }

    /// Counters so far.
    pub fn stats(&self) -> &EmuStats {
        &self.stats
    }

    /// Counters, for the I/O loop's own figures.
    pub fn stats_mut(&mut self) -> &mut EmuStats {
        &mut self.stats
    }

    /// Current rate of a link in bit/s (None: unlimited).
    pub fn link_rate(&self, link: usize) -> Option<f64> {
        self.links[link].rate_bps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    fn packet(dst: Ipv4Addr, len: usize) -> Vec<u8> {
        let mut p = vec![0u8; len];
        p[0] = 0x45;
        p[16..20].copy_from_slice(&dst.octets());
        p
    }

    fn layout(extra: &str) -> Layout {
        let text = format!(
            "[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n[[path]]\nfrom='a'\nto='b'\n{extra}"
        );
        Scenario::parse(&text).unwrap().resolve().unwrap()
    }

    /// Sends `n` packets of `len` bytes from host 0 to host 1, offered every `gap` ns, and
    /// returns the delivery times.
    fn run(layout: &Layout, n: usize, len: usize, gap: u64) -> (Vec<u64>, Emulator) {
        let mut e = Emulator::new(layout, 0);
        let dst = layout.hosts[1].addr;
        let mut out = Vec::new();
        let mut t = 0;
        for i in 0..n {
            t = i as u64 * gap;
            e.advance(t, |_, _| {
                out.push(t);
                true
            });
            e.ingress(t, 0, packet(dst, len));
        }
        while let Some(d) = e.next_deadline() {
            if e.in_flight() == 0 {
                break;
            }
            t = t.max(d);
            e.advance(t, |_, _| {
                out.push(t);
                true
            });
        }
        (out, e)
    }

    #[test]
    fn delay_and_serialization() {
        // 12 Mbit/s: a 1500-byte packet takes 1 ms; one-way delay 10 ms.
        let p = layout("rate_mbps=12\ndelay_ms=10\n");
        let (out, _) = run(&p, 3, 1500, 0);
        assert_eq!(out, vec![11_000_000, 12_000_000, 13_000_000]);
    }

    #[test]
    fn queue_bounds_a_burst() {
        // 64 KiB queue at 12 Mbit/s: a burst of 100 full packets keeps about 44 of them.
        let p = layout("rate_mbps=12\nqueue_kb=64\n");
        let (out, e) = run(&p, 100, 1500, 0);
        let l = p.site_links[0][1].unwrap();
        assert_eq!(out.len() as u64, e.stats().links[l].pkts_out);
        assert_eq!(e.stats().links[l].queue_drops, 100 - out.len() as u64);
        assert!((43..=45).contains(&out.len()), "{}", out.len());
    }

    #[test]
    fn loss_rate_is_per_packet_and_seeded() {
        let p = layout("loss=0.02\n");
        let (out, _) = run(&p, 50_000, 100, 1000);
        let loss = 1.0 - out.len() as f64 / 50_000.0;
        assert!((loss - 0.02).abs() < 0.002, "{loss}");
        let (again, _) = run(&p, 50_000, 100, 1000);
        assert_eq!(out, again, "same seed, same losses");
    }

    #[test]
    fn jitter_does_not_reorder_unless_asked() {
        let p = layout("delay_ms=20\njitter_ms=5\n");
        let (out, _) = run(&p, 2000, 100, 100_000);
        assert!(out.windows(2).all(|w| w[0] <= w[1]));
        let min = out
            .iter()
            .zip(0..)
            .map(|(d, i)| d - i * 100_000)
            .min()
            .unwrap();
        assert!(min >= 15_000_000, "{min}");
    }

    #[test]
    fn access_links_are_shared_and_rates_change_on_schedule() {
        // Host a-1 uplink 12 Mbit/s is the bottleneck; at 1 s the path drops to 1.2 Mbit/s.
        let text = "[[site]]\nname='a'\nhosts=1\nuplink_mbps=12\n[[site]]\nname='b'\nhosts=1\n\
                    [[change]]\nat_s=1\nfrom='a'\nto='b'\nrate_mbps=1.2\n";
        let p = Scenario::parse(text).unwrap().resolve().unwrap();
        let mut e = Emulator::new(&p, 0);
        let dst = p.hosts[1].addr;
        let mut out = Vec::new();
        // Offer 1 packet per ms for 2 s (exactly the uplink rate).
        for i in 0..2000u64 {
            let t = i * 1_000_000;
            e.advance(t, |_, _| {
                out.push(t);
                true
            });
            e.ingress(t, 0, packet(dst, 1500));
        }
        let first = out.iter().filter(|&&t| t < 1_000_000_000).count();
        let second = out.len() - first;
        assert!((990..=1000).contains(&first), "{first}");
        // After the change: 100 packets/s plus what the queue drains.
        assert!(second < 200, "{second}");
        let l = p.site_links[0][1].unwrap();
        assert_eq!(e.link_rate(l), Some(1.2e6));
    }

    #[test]
    fn fluctuation_is_seeded() {
        let text = "seed=7\n[[site]]\nname='a'\nhosts=1\n[[site]]\nname='b'\nhosts=1\n\
                    [default_path]\nrate_mbps=100\n[fluctuation]\nevery_s=5\n";
        let p = Scenario::parse(text).unwrap().resolve().unwrap();
        let rates = |p: &Layout| {
            let mut e = Emulator::new(p, 0);
            (0..5)
                .map(|k| {
                    e.advance(k * 5_000_000_000 + 1, |_, _| true);
                    e.link_rate(p.site_links[0][1].unwrap()).unwrap()
                })
                .collect::<Vec<_>>()
        };
        let a = rates(&p);
        assert_eq!(a[0], 100e6);
        assert!(a[1..].iter().all(|r| (10e6..=100e6).contains(r)));
        assert_ne!(a[1], a[2]);
        assert_eq!(a, rates(&p));
    }
}
