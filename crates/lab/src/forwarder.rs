//! The forwarder's I/O: one TUN device (`wan0`) per host namespace, an epoll loop with a
//! nanosecond timerfd, the [`Emulator`] in between. Runs on one thread pinned to one core.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::emu::{EmuStats, Emulator};
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
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(LabError::sys("eventfd", io::Error::last_os_error()));
        }
        Ok(Arc::new(Control {
            stop: AtomicBool::new(false),
            restart_clock: AtomicBool::new(false),
            // SAFETY: fd is a fresh descriptor we own.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            stats: Mutex::new(EmuStats::default()),
            tid: Mutex::new(0),
        }))
    }

    /// Wakes the loop so it sees a flag at once.
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Switches the calling thread into the network namespace at `path`.
pub fn setns_path(path: &str) -> Result<(), LabError> {
    let f = File::open(path).map_err(|e| LabError::sys(format!("open {path}"), e))?;
    // SAFETY: valid fd; CLONE_NEWNET only affects this thread's network namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(LabError::sys(
            format!("setns {path}"),
            io::Error::last_os_error(),
        ));
    }
    Ok(())
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
        match open_tun() {
            Ok(fd) => out.push(fd),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // SAFETY: valid fd of our original namespace.
    if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(LabError::sys("setns back", io::Error::last_os_error()));
    }
    result.map(|_| out)
}

fn open_tun() -> Result<OwnedFd, LabError> {
    // SAFETY: plain open of a path literal.
    let fd = unsafe {
        libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(LabError::NotPermitted(format!(
            "open /dev/net/tun: {}",
            io::Error::last_os_error()
        )));
    }
    // SAFETY: fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    req.name[..TUN_NAME.len()].copy_from_slice(TUN_NAME.as_bytes());
    // SAFETY: TUNSETIFF reads/writes an ifreq-sized struct we own.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) } < 0 {
        return Err(LabError::sys("TUNSETIFF", io::Error::last_os_error()));
    }
    Ok(fd)
}

/// Pins the calling thread to `cpu`, asks for a small real-time priority (timing must not
/// suffer from compilers on the same core) and a 1 ns timer slack. Failures are reported, not
/// fatal: the lab still works, with worse timing.
pub fn tune_thread(cpu: Option<usize>) -> Vec<String> {
    let mut warnings = Vec::new();
    // SAFETY: plain syscalls on the calling thread with valid arguments.
    unsafe {
        if let Some(cpu) = cpu {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                warnings.push(format!("pin to cpu {cpu}: {}", io::Error::last_os_error()));
            }
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
    // SAFETY: plain syscalls on the calling thread with valid arguments.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64);
        let param = libc::sched_param {
            sched_priority: priority,
        };
        if libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) != 0 {
            return Err(io::Error::last_os_error());
        }
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

/// Hex mask of all CPUs but the forwarder's, for `rps_cpus`.
pub fn rps_mask() -> Option<String> {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let cpu = forwarder_cpu()?;
    let mask: u128 = ((1u128 << n.min(127)) - 1) & !(1u128 << cpu);
    Some(format!("{mask:x}"))
}

fn epoll_add(ep: RawFd, fd: RawFd, token: u64) -> Result<(), LabError> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: valid epoll and target fds, valid event pointer.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
        return Err(LabError::sys("epoll_ctl", io::Error::last_os_error()));
    }
    Ok(())
}

const TOKEN_TIMER: u64 = u64::MAX;
const TOKEN_WAKE: u64 = u64::MAX - 1;
/// Events are handled up to this early, so packets a few microseconds apart share one wake-up.
/// Measured with an 8-hop nc chain at 800 Mbit/s in total: 20 us -> 80% of a core, 100 us ->
/// 62%, same throughput (busy polling instead of sleeping was worse: 95%, and slower).
const EARLY_NS: u64 = 50_000;
/// Packets read from one TUN before looking at the others and at due events.
const READ_BATCH: usize = 64;

/// Runs the forwarding loop until `control.stop` is set.
pub fn run_loop(layout: &Layout, tuns: &[OwnedFd], control: &Control) -> Result<(), LabError> {
    // SAFETY: gettid has no arguments and cannot fail.
    *control.tid.lock().expect("tid lock") = unsafe { libc::gettid() };
    let mut fwd = Forwarder::new(layout, tuns, control)?;
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
            let token = fwd.events[i].u64;
            fwd.handle(token);
        }
    }
    *control.stats.lock().expect("stats lock") = fwd.emu.stats().clone();
    Ok(())
}

/// The forwarding loop's state: the emulator between the TUNs, the epoll set and the timer.
struct Forwarder<'a> {
    emu: Emulator,
    control: &'a Control,
    /// The TUN of host `i` is `fds[i]` (and epoll token `i`).
    fds: Vec<RawFd>,
    ep: OwnedFd,
    tfd: OwnedFd,
    events: Vec<libc::epoll_event>,
    /// The timer's expiry (monotonic ns), 0 when it is not armed.
    armed: u64,
    /// When the loop last woke from epoll, to account how long it stays busy.
    woke_at: u64,
    last_publish: u64,
}

impl<'a> Forwarder<'a> {
    /// Creates the epoll set (every TUN, the timer, the owner's wake-up eventfd) and the
    /// emulator, whose scenario clock starts now.
    fn new(layout: &Layout, tuns: &[OwnedFd], control: &'a Control) -> Result<Self, LabError> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(LabError::sys("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: fresh fd.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: plain syscall; the returned fd is owned below.
        let tfd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if tfd < 0 {
            return Err(LabError::sys("timerfd_create", io::Error::last_os_error()));
        }
        // SAFETY: fresh fd.
        let tfd = unsafe { OwnedFd::from_raw_fd(tfd) };
        for (i, t) in tuns.iter().enumerate() {
            epoll_add(ep.as_raw_fd(), t.as_raw_fd(), i as u64)?;
        }
        epoll_add(ep.as_raw_fd(), tfd.as_raw_fd(), TOKEN_TIMER)?;
        epoll_add(ep.as_raw_fd(), control.wake.as_raw_fd(), TOKEN_WAKE)?;
        Ok(Forwarder {
            emu: Emulator::new(layout, mono_ns()),
            control,
            fds: tuns.iter().map(|t| t.as_raw_fd()).collect(),
            ep,
            tfd,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; 64],
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
            // SAFETY: writes a valid buffer to a TUN fd we own.
            let n = unsafe { libc::write(fds[dst], pkt.as_ptr().cast(), pkt.len()) };
            n == pkt.len() as isize
        });
        if now - self.last_publish > 200_000_000 {
            self.last_publish = now;
            *self.control.stats.lock().expect("stats lock") = self.emu.stats().clone();
        }
        // Sleep until the next due event, but at most 100 ms so flags are seen.
        let deadline = self
            .emu
            .next_deadline()
            .unwrap_or(u64::MAX)
            .min(now + 100_000_000);
        (deadline > mono_ns() + EARLY_NS).then_some(deadline)
    }

    /// Makes the timer fire by `deadline`.
    fn arm(&mut self, deadline: u64) {
        // Re-arming a timer costs a VM exit here (a third of the forwarder's CPU when done per
        // packet): keep an earlier timer armed and let it fire, re-arm only to wake sooner.
        if self.armed != 0 && deadline >= self.armed {
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (deadline / 1_000_000_000) as libc::time_t,
                tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: valid timerfd and spec.
        unsafe {
            libc::timerfd_settime(
                self.tfd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
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
        // SAFETY: valid epoll fd and event buffer.
        let n = unsafe {
            libc::epoll_wait(
                self.ep.as_raw_fd(),
                self.events.as_mut_ptr(),
                self.events.len() as i32,
                100,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(LabError::sys("epoll_wait", e));
        }
        self.woke_at = mono_ns();
        if self.armed != 0 && self.woke_at > self.armed + 1_000_000 {
            let over = self.woke_at - self.armed;
            if over > self.emu.stats().max_oversleep_ns {
                self.emu.stats_mut().max_oversleep_ns = over;
            }
        }
        Ok(Some(n as usize))
    }

    /// One ready event: the timer fired, the owner woke us, or a host's TUN has packets.
    fn handle(&mut self, token: u64) {
        let mut scratch = [0u8; 8];
        match token {
            TOKEN_TIMER => {
                // SAFETY: drains the timerfd counter into a local buffer.
                unsafe { libc::read(self.tfd.as_raw_fd(), scratch.as_mut_ptr().cast(), 8) };
                self.armed = 0;
            }
            TOKEN_WAKE => {
                // SAFETY: drains the eventfd counter.
                unsafe {
                    libc::read(
                        self.control.wake.as_raw_fd(),
                        scratch.as_mut_ptr().cast(),
                        8,
                    )
                };
            }
            host => self.read_tun(host as usize),
        }
    }

    /// Takes up to [`READ_BATCH`] packets from one host's TUN into the emulator.
    fn read_tun(&mut self, host: usize) {
        for _ in 0..READ_BATCH {
            let mut buf = self.emu.buffer();
            buf.clear();
            // SAFETY: reads at most capacity bytes into the vector's spare capacity; only the
            // bytes the kernel wrote are exposed below.
            let r = unsafe { libc::read(self.fds[host], buf.as_mut_ptr().cast(), buf.capacity()) };
            if r <= 0 {
                self.emu.recycle(buf);
                break;
            }
            // SAFETY: the kernel initialised r <= capacity bytes.
            unsafe { buf.set_len(r as usize) };
            self.emu.ingress(mono_ns(), host, buf);
        }
    }
}

/// Starts the forwarder on its own thread: creates the TUNs (in the caller's process), pins the
/// thread and runs the loop. Returns once the TUNs exist.
pub fn spawn_thread(
    layout: Layout,
    namespaces: Vec<String>,
    control: Arc<Control>,
) -> Result<std::thread::JoinHandle<Result<(), LabError>>, LabError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("lab-forwarder".into())
        .spawn(move || {
            let tuns = match open_tuns(&namespaces) {
                Ok(t) => t,
                Err(e) => {
                    let msg = e.to_string();
                    let _ = tx.send(Err(e));
                    return Err(LabError::Forwarder(msg));
                }
            };
            let warnings = tune_thread(forwarder_cpu());
            let _ = tx.send(Ok(warnings));
            run_loop(&layout, &tuns, &control)
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
