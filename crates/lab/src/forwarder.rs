//! The forwarder's I/O: one TUN device (`wan0`) per host namespace, an epoll loop with a
//! nanosecond timerfd, the [`Emulator`] in between. Runs on one thread pinned to one core.

use std::fs::File;
use std::io;
use std::num::NonZeroU64;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::event::{epoll, EventfdFlags};
use rustix::fs::{Mode, OFlags};
use rustix::thread::{CpuSet, LinkNameSpaceType};
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec,
};

use crate::emu::{EmuStats, Emulator};
use crate::lan::{self, DelayStage};
use crate::scenario::Layout;
use crate::LabError;

/// Name of the TUN device in every host namespace.
pub const TUN_NAME: &str = "wan0";

/// Shared flags between the forwarder thread and its owner.
pub struct Control {
    /// Stop the loop.
    pub stop: AtomicBool,
    /// Restart the scenario clock.
    pub restart_clock: AtomicBool,
    wake: OwnedFd,
    /// Latest counters, published about every 200 ms.
    pub stats: Mutex<EmuStats>,
    /// Kernel thread id of the forwarder thread (for CPU accounting), 0 until it runs.
    pub tid: Mutex<i32>,
}

impl Control {
    pub fn new() -> Result<Arc<Self>, LabError> {
        let wake = rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
            .map_err(|e| LabError::sys("eventfd", e.into()))?;
        Ok(Arc::new(Control {
            stop: AtomicBool::new(false),
            restart_clock: AtomicBool::new(false),
            wake,
            stats: Mutex::new(EmuStats::default()),
            tid: Mutex::new(0),
        }))
    }

    /// Wakes the loop so it sees a flag at once.
    pub fn wake(&self) {
        // Cannot fail but by overflowing the counter, which still wakes the loop.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

/// The monotonic clock in ns: the clock of the emulator and of the forwarder's timer.
pub fn mono_ns() -> u64 {
    let ts = rustix::time::clock_gettime(ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Switches the calling thread into the network namespace at `path`.
pub fn setns_path(path: &str) -> Result<(), LabError> {
    let f = File::open(path).map_err(|e| LabError::sys(format!("open {path}"), e))?;
    // Only this thread's network namespace changes.
    rustix::thread::move_into_link_name_space(f.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| LabError::sys(format!("setns {path}"), e.into()))
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates `wan0` (IFF_TUN | IFF_NO_PI, non-persistent: it vanishes with the fd) in each
/// namespace. Must run on a thread that may change namespace; returns to the original one.
pub fn open_tuns(namespaces: &[String]) -> Result<Vec<OwnedFd>, LabError> {
    let home = File::open("/proc/thread-self/ns/net")
        .map_err(|e| LabError::sys("open own network namespace", e))?;
    let mut out = Vec::new();
    let mut result = Ok(());
    for ns in namespaces {
        if let Err(e) = setns_path(&format!("/var/run/netns/{ns}")) {
            result = Err(e);
            break;
        }
        match open_tun_device(TUN_NAME, false) {
            Ok(fd) => out.push(fd),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    rustix::thread::move_into_link_name_space(home.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| LabError::sys("setns back", e.into()))?;
    result.map(|_| out)
}

/// Opens a non-persistent TUN (`tap` false: IP packets) or TAP (`tap` true: Ethernet frames)
/// device named `name` in the calling thread's namespace, non-blocking, without packet info.
pub fn open_tun_device(name: &str, tap: bool) -> Result<OwnedFd, LabError> {
    let flags = OFlags::RDWR | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = rustix::fs::open("/dev/net/tun", flags, Mode::empty()).map_err(|e| {
        LabError::NotPermitted(format!("open /dev/net/tun: {}", io::Error::from(e)))
    })?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (if tap { libc::IFF_TAP } else { libc::IFF_TUN } | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    // Device names are ours (`wan0`, `lan0`, `v<i>`), all shorter than IFNAMSIZ.
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads/writes an ifreq-sized struct we own. Kept on libc: rustix has
    // no TUN call, and its generic `ioctl` is as unsafe as this one.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) } < 0 {
        return Err(LabError::sys(
            format!("TUNSETIFF {name}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(fd)
}

/// Pins the calling thread to `cpu`, asks for a small real-time priority (timing must not
/// suffer from compilers on the same core) and a 1 ns timer slack. Failures are reported, not
/// fatal: the lab still works, with worse timing.
pub fn tune_thread(cpu: Option<usize>) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(cpu) = cpu {
        let mut set = CpuSet::new();
        set.set(cpu);
        if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
            warnings.push(format!("pin to cpu {cpu}: {}", io::Error::from(e)));
        }
    }
    if let Err(e) = realtime(FORWARDER_PRIORITY) {
        warnings.push(format!("SCHED_FIFO: {e}"));
    }
    warnings
}

/// The forwarder's real-time priority (`SCHED_FIFO`).
pub const FORWARDER_PRIORITY: i32 = 10;

/// Makes the calling thread real-time (`SCHED_FIFO` at `priority`) with a 1 ns timer slack, so
/// its sleeps end on time. The slack is set even where the priority is refused.
pub fn realtime(priority: i32) -> io::Result<()> {
    let _ = rustix::thread::set_current_timer_slack(NonZeroU64::new(1));
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a plain syscall on the calling thread with a valid parameter. Kept on libc:
    // rustix does not wrap sched_setscheduler.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU the forwarder is pinned to: the last one, so RPS can steer receive work to the rest.
pub fn forwarder_cpu() -> Option<usize> {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (n >= 2).then_some(n - 1)
}

/// Every CPU of this machine but `cpu` (the forwarder's): where the hosts' processes and the
/// measuring threads run, so they do not delay the forwarder's wake-ups.
pub fn cpus_except(cpu: usize) -> CpuSet {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut set = CpuSet::new();
    for i in (0..n.min(CpuSet::MAX_CPU)).filter(|&i| i != cpu) {
        set.set(i);
    }
    set
}

/// Hex mask of all CPUs but the forwarder's, for `rps_cpus`.
pub fn rps_mask() -> Option<String> {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = forwarder_cpu()?;
    let mask: u128 = ((1u128 << n.min(127)) - 1) & !(1u128 << cpu);
    Some(format!("{mask:x}"))
}

fn epoll_add(ep: &OwnedFd, fd: BorrowedFd<'_>, token: u64) -> Result<(), LabError> {
    let data = epoll::EventData::new_u64(token);
    epoll::add(ep, fd, data, epoll::EventFlags::IN)
        .map_err(|e| LabError::sys("epoll_ctl", e.into()))
}

const TOKEN_TIMER: u64 = u64::MAX;
const TOKEN_WAKE: u64 = u64::MAX - 1;
/// Device `k` of the delay stage is epoll token `TOKEN_PORTS + k` (TUNs take `0..hosts`).
const TOKEN_PORTS: u64 = 1 << 32;
/// Events are handled up to this early, so packets a few microseconds apart share one wake-up.
/// Measured with an 8-hop nc chain at 800 Mbit/s in total: 20 us -> 80% of a core, 100 us ->
/// 62%, same throughput (busy polling instead of sleeping was worse: 95%, and slower).
const EARLY_NS: u64 = 50_000;
/// Packets read from one TUN before looking at the others and at due events.
const READ_BATCH: usize = 64;
/// Ready events taken from one epoll wait.
const EVENTS: usize = 64;

/// Runs the forwarding loop until `control.stop` is set.
pub fn run_loop(
    layout: &Layout,
    tuns: &[OwnedFd],
    ports: DelayStage,
    control: &Control,
) -> Result<(), LabError> {
    *control.tid.lock().expect("tid lock") = rustix::thread::gettid().as_raw_nonzero().get();
    let mut fwd = Forwarder::new(layout, tuns, ports, control)?;
    while !control.stop.load(Ordering::Relaxed) {
        if control.restart_clock.swap(false, Ordering::Relaxed) {
            fwd.emu.start_clock(mono_ns());
        }
        let Some(deadline) = fwd.due() else {
            continue;
        };
        fwd.arm(deadline);
        let Some(n) = fwd.wait()? else {
            continue;
        };
        for i in 0..n {
            let token = fwd.events[i].data.u64();
            fwd.handle(token);
        }
    }
    fwd.publish();
    Ok(())
}

/// The forwarding loop's state: the emulator between the TUNs, the epoll set and the timer.
struct Forwarder<'a> {
    emu: Emulator,
    /// The port delays of hosts that have one (`lan.rs`).
    ports: DelayStage,
    control: &'a Control,
    /// The TUN of host `i` is `fds[i]` (and epoll token `i`).
    fds: Vec<BorrowedFd<'a>>,
    ep: OwnedFd,
    tfd: OwnedFd,
    /// Ready events of the last wait (at most [`EVENTS`]).
    events: Vec<epoll::Event>,
    /// The timer's expiry (monotonic ns), 0 when it is not armed.
    armed: u64,
    /// When the loop last woke from epoll, to account how long it stays busy.
    woke_at: u64,
    last_publish: u64,
}

impl<'a> Forwarder<'a> {
    /// Creates the epoll set (every TUN, the timer, the owner's wake-up eventfd) and the
    /// emulator, whose scenario clock starts now.
    fn new(
        layout: &Layout,
        tuns: &'a [OwnedFd],
        ports: DelayStage,
        control: &'a Control,
    ) -> Result<Self, LabError> {
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| LabError::sys("epoll_create1", e.into()))?;
        let tfd = rustix::time::timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .map_err(|e| LabError::sys("timerfd_create", e.into()))?;
        for (i, t) in tuns.iter().enumerate() {
            epoll_add(&ep, t.as_fd(), i as u64)?;
        }
        for k in 0..ports.devices() {
            epoll_add(&ep, ports.device(k), TOKEN_PORTS + k as u64)?;
        }
        epoll_add(&ep, tfd.as_fd(), TOKEN_TIMER)?;
        epoll_add(&ep, control.wake.as_fd(), TOKEN_WAKE)?;
        Ok(Forwarder {
            emu: Emulator::new(layout, mono_ns()),
            ports,
            control,
            fds: tuns.iter().map(|t| t.as_fd()).collect(),
            ep,
            tfd,
            events: Vec::with_capacity(EVENTS),
            armed: 0,
            woke_at: mono_ns(),
            last_publish: 0,
        })
    }

    /// Sends what is due (up to [`EARLY_NS`] ahead), publishes the counters every 200 ms, and
    /// returns when to wake next; None when that is within [`EARLY_NS`] already.
    fn due(&mut self) -> Option<u64> {
        let now = mono_ns();
        let fds = &self.fds;
        self.emu.advance(now + EARLY_NS, |dst, pkt| {
            rustix::io::write(fds[dst], pkt) == Ok(pkt.len())
        });
        self.ports.flush(now + EARLY_NS);
        if now - self.last_publish > 200_000_000 {
            self.last_publish = now;
            self.publish();
        }
        // Sleep until the next due event, but at most 100 ms so flags are seen.
        let deadline = self
            .emu
            .next_deadline()
            .into_iter()
            .chain(self.ports.next_deadline())
            .min()
            .unwrap_or(u64::MAX)
            .min(now + 100_000_000);
        (deadline > mono_ns() + EARLY_NS).then_some(deadline)
    }

    /// Publishes the counters, the delay stage's with the emulator's, for the lab's owner.
    fn publish(&mut self) {
        let stats = self.emu.stats_mut();
        stats.port_frames = self.ports.frames;
        stats.port_drops = self.ports.drops;
        stats.port_refused = self.ports.refused;
        *self.control.stats.lock().expect("stats lock") = self.emu.stats().clone();
    }

    /// Makes the timer fire by `deadline`.
    fn arm(&mut self, deadline: u64) {
        // Re-arming a timer costs a VM exit here (a third of the forwarder's CPU when done per
        // packet): keep an earlier timer armed and let it fire, re-arm only to wake sooner.
        if self.armed != 0 && deadline >= self.armed {
            return;
        }
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: (deadline / 1_000_000_000) as _,
                tv_nsec: (deadline % 1_000_000_000) as _,
            },
        };
        // Cannot fail on our own timerfd with a valid time; the 100 ms epoll timeout is the
        // fallback anyway.
        let _ = rustix::time::timerfd_settime(&self.tfd, TimerfdTimerFlags::ABSTIME, &spec);
        self.armed = deadline;
    }

    /// Sleeps in epoll (at most 100 ms); returns how many events are ready (None: interrupted
    /// by a signal). Records the longest busy spell and the worst oversleep past the timer.
    fn wait(&mut self) -> Result<Option<usize>, LabError> {
        let slept_at = mono_ns();
        let busy = slept_at - self.woke_at;
        if busy > self.emu.stats().max_busy_ns {
            self.emu.stats_mut().max_busy_ns = busy;
        }
        self.events.clear();
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let events = rustix::buffer::spare_capacity(&mut self.events);
        let n = match epoll::wait(&self.ep, events, Some(&timeout)) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => return Ok(None),
            Err(e) => return Err(LabError::sys("epoll_wait", e.into())),
        };
        self.woke_at = mono_ns();
        if self.armed != 0 && self.woke_at > self.armed + 1_000_000 {
            let over = self.woke_at - self.armed;
            if over > self.emu.stats().max_oversleep_ns {
                self.emu.stats_mut().max_oversleep_ns = over;
            }
        }
        Ok(Some(n))
    }

    /// One ready event: the timer fired, the owner woke us, a host's TUN has packets or a
    /// delayed port has frames.
    fn handle(&mut self, token: u64) {
        let mut scratch = [0u8; 8];
        match token {
            // Reading the counters re-arms them; an empty one (EAGAIN) is as good.
            TOKEN_TIMER => {
                let _ = rustix::io::read(&self.tfd, &mut scratch);
                self.armed = 0;
            }
            TOKEN_WAKE => {
                let _ = rustix::io::read(&self.control.wake, &mut scratch);
            }
            k if k >= TOKEN_PORTS => self.ports.read((k - TOKEN_PORTS) as usize, mono_ns()),
            host => self.read_tun(host as usize),
        }
    }

    /// Takes up to [`READ_BATCH`] packets from one host's TUN into the emulator.
    fn read_tun(&mut self, host: usize) {
        for _ in 0..READ_BATCH {
            let mut buf = self.emu.buffer();
            buf.clear();
            // Into the buffer's spare capacity: its length becomes what the kernel wrote.
            let r = rustix::io::read(self.fds[host], rustix::buffer::spare_capacity(&mut buf));
            if !matches!(r, Ok(n) if n > 0) {
                self.emu.recycle(buf);
                break;
            }
            self.emu.ingress(mono_ns(), host, buf);
        }
    }
}

/// Starts the forwarder on its own thread: creates the TUNs and the delayed ports' TAPs (in the
/// caller's process), pins the thread and runs the loop. Returns once the devices exist.
pub fn spawn_thread(
    layout: Layout,
    hub: String,
    namespaces: Vec<String>,
    control: Arc<Control>,
) -> Result<std::thread::JoinHandle<Result<(), LabError>>, LabError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("lab-forwarder".into())
        .spawn(move || {
            let opened = open_tuns(&namespaces)
                .and_then(|t| Ok((t, lan::open_ports(&hub, &namespaces, &layout)?)));
            let (tuns, ports) = match opened {
                Ok(t) => t,
                Err(e) => {
                    let msg = e.to_string();
                    let _ = tx.send(Err(e));
                    return Err(LabError::Forwarder(msg));
                }
            };
            let warnings = tune_thread(forwarder_cpu());
            let _ = tx.send(Ok(warnings));
            run_loop(&layout, &tuns, ports, &control)
        })
        .map_err(|e| LabError::sys("spawn forwarder thread", e))?;
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(Ok(warnings)) => {
            for w in warnings {
                eprintln!("lab: forwarder: {w} (timing may suffer)");
            }
            Ok(handle)
        }
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => Err(LabError::Forwarder("did not start within 20 s".into())),
    }
}
