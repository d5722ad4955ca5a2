//! The [`Lab`] guard: brings a scenario up, runs commands in its hosts, tears it down on drop.

use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkcast_proto::hosts::{HostSpec, HostsFile, SourceSpec};

use crate::emu::EmuStats;
use crate::forwarder::{self, Control};
use crate::netns;
use crate::scenario::{Layout, Scenario};
use crate::LabError;

/// How to bring a lab up.
#[derive(Debug, Clone, Default)]
pub struct LabOptions {
    /// Lab name (namespaces are `bclab-<name>.*`); default: the scenario's name or `lab`.
    pub name: Option<String>,
}

enum Forwarder {
    Thread {
        control: Arc<Control>,
        join: Option<std::thread::JoinHandle<Result<(), LabError>>>,
    },
    Daemon {
        pid: i32,
    },
}

/// A running lab. Dropping an owned lab tears it down (namespaces, devices, processes).
pub struct Lab {
    name: String,
    layout: Layout,
    dir: PathBuf,
    forwarder: Forwarder,
    owned: bool,
    down: bool,
}

fn valid_lab_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 40
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn pid_alive(pid: i32) -> bool {
    // Signal 0 only checks existence.
    pid > 0
        && rustix::process::Pid::from_raw(pid)
            .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Holds an exclusive flock on `/run/bclab/<lab>.lock` while a lab is built or removed.
struct SetupLock(#[allow(dead_code)] std::fs::File);

impl SetupLock {
    fn take(lab: &str) -> Result<Self, LabError> {
        std::fs::create_dir_all(netns::STATE_ROOT)
            .map_err(|e| LabError::sys("create /run/bclab", e))?;
        let path = Path::new(netns::STATE_ROOT).join(format!("{lab}.lock"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| LabError::sys(format!("open {}", path.display()), e))?;
        // Released when the file closes.
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| LabError::sys("flock", e.into()))?;
        Ok(SetupLock(f))
    }
}

/// Removes a stale lab (crashed owner) of this name; refuses when the owner still lives.
fn clear_stale(lab: &str) -> Result<(), LabError> {
    let dir = netns::state_dir(lab);
    if let Ok(s) = std::fs::read_to_string(dir.join("owner")) {
        if let Ok(pid) = s.trim().parse::<i32>() {
            if pid_alive(pid) {
                return Err(LabError::Busy {
                    name: lab.into(),
                    pid,
                });
            }
        }
    }
    let stale = netns::list_ns(&format!("{}{lab}.", netns::NS_PREFIX))?;
    if !stale.is_empty() || dir.exists() {
        eprintln!(
            "lab: removing stale lab {lab:?} ({} namespaces)",
            stale.len()
        );
        netns::remove_lab(lab)?;
    }
    Ok(())
}

impl Lab {
    /// Brings a scenario up with the forwarder on a thread of this process.
    pub fn up(scenario: &Scenario) -> Result<Lab, LabError> {
        Self::up_with(scenario, &LabOptions::default())
    }

    /// Like [`Lab::up`] with options.
    pub fn up_with(scenario: &Scenario, opts: &LabOptions) -> Result<Lab, LabError> {
        Self::start(scenario, opts, None)
    }

    /// Brings a scenario up with the forwarder in a detached process: `exe forwarder_args...
    /// <state dir>` (the hidden forwarder subcommand); the lab outlives this process until
    /// `lab down`.
    pub fn up_detached(
        scenario: &Scenario,
        opts: &LabOptions,
        exe: &Path,
        forwarder_args: &[String],
    ) -> Result<Lab, LabError> {
        let mut lab = Self::start(scenario, opts, Some((exe, forwarder_args)))?;
        lab.owned = false;
        Ok(lab)
    }

    fn start(
        scenario: &Scenario,
        opts: &LabOptions,
        daemon: Option<(&Path, &[String])>,
    ) -> Result<Lab, LabError> {
        let layout = scenario.resolve()?;
        let name = opts.name.clone().unwrap_or_else(|| layout.name.clone());
        if !valid_lab_name(&name) {
            return Err(LabError::Scenario(format!(
                "lab name {name:?}: use at most 40 letters, digits, '-' or '_'"
            )));
        }
        netns::preflight()?;
        if layout.kernel_shaping {
            crate::kernel::preflight(&layout)?;
        }
        netns::preflight_port_loss(&layout)?;
        let _lock = SetupLock::take(&name)?;
        clear_stale(&name)?;
        let dir = netns::state_dir(&name);
        std::fs::create_dir_all(&dir)
            .map_err(|e| LabError::sys(format!("create {}", dir.display()), e))?;
        let write = |file: &str, text: &str| {
            std::fs::write(dir.join(file), text)
                .map_err(|e| LabError::sys(format!("write {file}"), e))
        };
        write("owner", &std::process::id().to_string())?;
        let layout_json = serde_json::to_string_pretty(&layout).expect("layout serializes");
        write("layout.json", &layout_json)?;
        let namespaces: Vec<String> = layout
            .hosts
            .iter()
            .map(|h| netns::host_ns(&name, &h.name))
            .collect();
        let built = (|| -> Result<Forwarder, LabError> {
            netns::tune_global();
            netns::build(&name, &layout)?;
            let fwd = match daemon {
                None => {
                    let control = Control::new()?;
                    let join = forwarder::spawn_thread(
                        layout.clone(),
                        netns::hub_ns(&name),
                        namespaces.clone(),
                        control.clone(),
                    )?;
                    Forwarder::Thread {
                        control,
                        join: Some(join),
                    }
                }
                Some((exe, args)) => {
                    let pid = spawn_daemon(exe, args, &dir)?;
                    write("owner", &pid.to_string())?;
                    Forwarder::Daemon { pid }
                }
            };
            Ok(fwd)
        })();
        let forwarder = match built {
            Ok(f) => f,
            Err(e) => {
                let _ = netns::remove_lab(&name);
                return Err(e);
            }
        };
        let lab = Lab {
            name,
            layout,
            dir: dir.clone(),
            forwarder,
            owned: true,
            down: false,
        };
        // From here on, Drop cleans up on error. The delayed ports' TAPs exist once the
        // forwarder runs: bridge and shape them before the hosts use them.
        netns::attach_ports(&lab.name, &lab.layout)?;
        netns::configure_hosts(&lab.name, &lab.layout)?;
        write("hosts.toml", &lab.hosts_spec().to_toml())?;
        write("matrix.toml", &lab.matrix_toml())?;
        Ok(lab)
    }

    /// Attaches to a lab brought up earlier (by `lab up`); dropping it leaves the lab running.
    pub fn attach(name: &str) -> Result<Lab, LabError> {
        let dir = netns::state_dir(name);
        let layout_text = std::fs::read_to_string(dir.join("layout.json"))
            .map_err(|_| LabError::NotUp(name.into()))?;
        let layout: Layout = serde_json::from_str(&layout_text)
            .map_err(|e| LabError::Forwarder(format!("bad layout.json: {e}")))?;
        let pid = std::fs::read_to_string(dir.join("owner"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if !pid_alive(pid) {
            return Err(LabError::NotUp(format!(
                "{name} (its forwarder is gone; run `lab down`)"
            )));
        }
        Ok(Lab {
            name: name.into(),
            layout,
            dir,
            forwarder: Forwarder::Daemon { pid },
            owned: false,
            down: false,
        })
    }

    /// Removes a lab by name, whatever state it is in (also a stale one).
    pub fn remove(name: &str) -> Result<(), LabError> {
        netns::preflight()?;
        let _lock = SetupLock::take(name)?;
        let dir = netns::state_dir(name);
        if let Some(pid) = std::fs::read_to_string(dir.join("owner"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            if pid != std::process::id() as i32 && is_forwarder(pid) {
                stop_pid(pid);
            }
        }
        netns::remove_lab(name)
    }

    /// Lab name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The resolved scenario.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Host names in scenario order.
    pub fn host_names(&self) -> Vec<String> {
        self.layout.hosts.iter().map(|h| h.name.clone()).collect()
    }

    /// Name of the source host.
    pub fn source(&self) -> &str {
        &self.layout.hosts[self.layout.source].name
    }

    /// A host's main address.
    pub fn addr(&self, host: &str) -> Result<Ipv4Addr, LabError> {
        Ok(self.layout.hosts[self.index(host)?].addr)
    }

    /// Addresses of the channels at `host`, in channel order: (own address, peer address).
    pub fn channel_addrs(&self, host: &str) -> Result<Vec<(Ipv4Addr, Ipv4Addr)>, LabError> {
        let i = self.index(host)?;
        Ok(self
            .layout
            .channels
            .iter()
            .filter_map(|c| {
                if c.a == i {
                    Some((c.a_addr, c.b_addr))
                } else if c.b == i {
                    Some((c.b_addr, c.a_addr))
                } else {
                    None
                }
            })
            .collect())
    }

    fn index(&self, host: &str) -> Result<usize, LabError> {
        self.layout
            .host(host)
            .ok_or_else(|| LabError::UnknownHost(host.into()))
    }

    /// The namespace of a host (for `ip netns exec`).
    pub fn netns(&self, host: &str) -> Result<String, LabError> {
        self.index(host)?;
        Ok(netns::host_ns(&self.name, host))
    }

    /// The hosts file of this lab: the source as `[source]`, every other host as `[[host]]`
    /// with its site, access rates and channel addresses as extra paths.
    pub fn hosts_spec(&self) -> HostsFile {
        let p = &self.layout;
        let port = p.agent_port;
        let src = &p.hosts[p.source];
        let hosts = p
            .hosts
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != p.source)
            .map(|(i, h)| HostSpec {
                name: h.name.clone(),
                addr: format!("{}:{port}", h.addr),
                ssh: None,
                site: Some(p.sites[h.site].clone()),
                uplink_mbps: h.uplink_mbps,
                downlink_mbps: h.downlink_mbps,
                max_fanout: None,
                paths: p
                    .channels
                    .iter()
                    .filter_map(|c| {
                        if c.a == i {
                            Some(c.a_addr)
                        } else if c.b == i {
                            Some(c.b_addr)
                        } else {
                            None
                        }
                    })
                    .map(|a| format!("{a}:{port}"))
                    .collect(),
            })
            .collect();
        HostsFile {
            source: Some(SourceSpec {
                name: src.name.clone(),
                addr: Some(format!("{}:{port}", src.addr)),
                site: Some(p.sites[src.site].clone()),
                uplink_mbps: src.uplink_mbps,
                downlink_mbps: src.downlink_mbps,
                max_fanout: None,
            }),
            hosts,
        }
    }

    /// Path of the hosts file written for this lab.
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.join("hosts.toml")
    }

    /// Path of the planner's matrix file written for this lab (see [`Lab::matrix_toml`]).
    pub fn matrix_file(&self) -> PathBuf {
        self.dir.join("matrix.toml")
    }

    /// The scenario as the planner sees it (`bulkcast plan --matrix`, `send --matrix`): nominal
    /// RTTs between all hosts and the WAN link capacities between sites, which the hosts file
    /// cannot carry. Time-varying conditions are not in it: it describes the nominal network.
    pub fn matrix_toml(&self) -> String {
        use std::fmt::Write as _;
        let p = &self.layout;
        // One way from host i to host j: i's uplink, the WAN path, j's downlink (the LAN inside a
        // site is about 0.1 ms, plus the delays of both ports).
        let one_way_ms = |i: usize, j: usize| -> f64 {
            let (a, b) = (&p.hosts[i], &p.hosts[j]);
            if a.site == b.site {
                return 0.05 + (a.port_delay_ns + b.port_delay_ns) as f64 / 1e6;
            }
            let wan = p.site_links[a.site][b.site].map_or(0, |l| p.links[l].delay_ns);
            (p.links[a.uplink].delay_ns + wan + p.links[b.downlink].delay_ns) as f64 / 1e6
        };
        let order: Vec<usize> = std::iter::once(p.source)
            .chain((0..p.hosts.len()).filter(|&i| i != p.source))
            .collect();
        let mut out = format!(
            "# Planner matrix of lab {:?}: nominal RTTs and WAN capacities (no time-varying conditions).\n",
            p.name
        );
        let names: Vec<String> = order
            .iter()
            .map(|&i| format!("{:?}", p.hosts[i].name))
            .collect();
        let _ = writeln!(out, "nodes = [{}]", names.join(", "));
        out.push_str("rtt_ms = [\n");
        for &i in &order {
            let row: Vec<String> = order
                .iter()
                .map(|&j| {
                    let v = if i == j {
                        0.0
                    } else {
                        one_way_ms(i, j) + one_way_ms(j, i)
                    };
                    format!("{v:.3}")
                })
                .collect();
            let _ = writeln!(out, "  [{}],", row.join(", "));
        }
        out.push_str("]\n");
        for (a, row) in p.site_links.iter().enumerate() {
            for (b, link) in row.iter().enumerate() {
                if let Some(rate) = link.and_then(|l| p.links[l].rate_bps) {
                    let _ = write!(
                        out,
                        "\n[[wan]]\nfrom = {:?}\nto = {:?}\nmbps = {}\n",
                        p.sites[a],
                        p.sites[b],
                        rate / 1e6
                    );
                }
            }
        }
        out
    }

    /// A command that runs `program` inside `host`'s namespace.
    /// Forgets what the hosts cached (bulkcast's probe results): the next method run on this
    /// lab starts as cold as the first.
    pub fn clear_caches(&self) {
        let _ = std::fs::remove_dir_all(self.dir.join("cache"));
    }

    pub fn command(&self, host: &str, program: &str) -> Result<Command, LabError> {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(host)?, program]);
        c.env("BULKCAST_LAB", &self.name)
            .env("BULKCAST_LAB_HOSTS", self.hosts_file())
            .env("BULKCAST_LAB_MATRIX", self.matrix_file())
            // Each emulated host is a machine of its own: its caches (bulkcast's probe cache)
            // live and die with the lab, so one scenario never reads another's round trips.
            .env("XDG_CACHE_HOME", self.dir.join("cache").join(host));
        // With kernel shaping the forwarder is idle: the hosts get every core.
        if !self.layout.kernel_shaping && std::env::var_os("BCLAB_SHARE_CPU").is_none() {
            if let Some(cpu) = forwarder::forwarder_cpu() {
                // Keep the hosts' processes off the forwarder's core: this kernel does not
                // preempt a process inside a long syscall, which delays the forwarder's wake-ups.
                // The set is built here: only async-signal-safe calls may run after fork.
                let set = forwarder::cpus_except(cpu);
                // SAFETY: sched_setaffinity is one system call (async-signal-safe, no
                // allocation) and only affects the child.
                unsafe {
                    c.pre_exec(move || {
                        let _ = rustix::thread::sched_setaffinity(None, &set);
                        Ok(())
                    });
                }
            }
        }
        Ok(c)
    }

    /// Runs `argv` in `host` and waits for it (output captured).
    pub fn exec(&self, host: &str, argv: &[&str]) -> Result<Output, LabError> {
        let (prog, rest) = argv
            .split_first()
            .ok_or_else(|| LabError::Measure("empty command".into()))?;
        let mut c = self.command(host, prog)?;
        c.args(rest).stdin(Stdio::null());
        c.output()
            .map_err(|e| LabError::sys(format!("run {prog} in {host}"), e))
    }

    /// Starts `argv` in `host` without waiting. Processes still running at teardown are killed.
    pub fn spawn(&self, host: &str, argv: &[&str]) -> Result<Child, LabError> {
        let (prog, rest) = argv
            .split_first()
            .ok_or_else(|| LabError::Measure("empty command".into()))?;
        let mut c = self.command(host, prog)?;
        c.args(rest).stdin(Stdio::null());
        c.spawn()
            .map_err(|e| LabError::sys(format!("spawn {prog} in {host}"), e))
    }

    /// Restarts the scenario clock (time-varying conditions count from here).
    pub fn start_clock(&self) {
        match &self.forwarder {
            Forwarder::Thread { control, .. } => {
                control.restart_clock.store(true, Ordering::Relaxed);
                control.wake();
            }
            // Only a detached forwarder takes SIGUSR1 (for any other owner it would be fatal).
            Forwarder::Daemon { pid } if is_forwarder(*pid) => {
                netns::signal(*pid, rustix::process::Signal::USR1);
            }
            Forwarder::Daemon { .. } => {}
        }
    }

    /// The forwarder's counters (daemon: as of its last publication, at most 1 s old).
    pub fn stats(&self) -> EmuStats {
        match &self.forwarder {
            Forwarder::Thread { control, .. } => control.stats.lock().expect("stats lock").clone(),
            Forwarder::Daemon { .. } => std::fs::read_to_string(self.dir.join("stats.json"))
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default(),
        }
    }

    /// CPU seconds the forwarder thread has used so far.
    pub fn forwarder_cpu_s(&self) -> Option<f64> {
        let path = match &self.forwarder {
            Forwarder::Thread { control, .. } => {
                let tid = *control.tid.lock().expect("tid lock");
                format!("/proc/self/task/{tid}/stat")
            }
            Forwarder::Daemon { pid } => format!("/proc/{pid}/stat"),
        };
        let s = std::fs::read_to_string(path).ok()?;
        // Fields after the ")" of the command name: utime and stime are the 12th and 13th.
        let rest = s.rsplit_once(')')?.1;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
        let hz = rustix::param::clock_ticks_per_second() as f64;
        Some(ticks / hz)
    }

    /// "TX dropped" of every host's TUN: packets the kernel dropped because the forwarder did not
    /// read fast enough. Any non-zero entry means the run was overloaded and is invalid.
    pub fn tx_dropped(&self) -> Result<Vec<(String, u64)>, LabError> {
        self.layout
            .hosts
            .iter()
            .map(|h| {
                Ok((
                    h.name.clone(),
                    netns::tx_dropped(&netns::host_ns(&self.name, &h.name))?,
                ))
            })
            .collect()
    }

    /// Kills every process running inside the lab's hosts (the lab itself stays up).
    pub fn kill_processes(&self) {
        for h in &self.layout.hosts {
            netns::kill_ns_processes(&netns::host_ns(&self.name, &h.name));
        }
    }

    /// Tears the lab down now, reporting errors (Drop does the same, silently).
    pub fn down(mut self) -> Result<(), LabError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        if self.down {
            return Ok(());
        }
        self.down = true;
        let mut fwd_err = None;
        match &mut self.forwarder {
            Forwarder::Thread { control, join } => {
                control.stop.store(true, Ordering::Relaxed);
                control.wake();
                if let Some(j) = join.take() {
                    match j.join() {
                        Ok(Err(e)) => fwd_err = Some(e),
                        Err(_) => {
                            fwd_err = Some(LabError::Forwarder("forwarder thread panicked".into()))
                        }
                        Ok(Ok(())) => {}
                    }
                }
            }
            Forwarder::Daemon { pid } => stop_pid(*pid),
        }
        let _lock = SetupLock::take(&self.name)?;
        netns::remove_lab(&self.name)?;
        fwd_err.map_or(Ok(()), Err)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = self.teardown() {
                eprintln!("lab: teardown of {:?}: {e}", self.name);
            }
        }
    }
}

fn is_forwarder(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            c.split(|&b| b == 0)
                .any(|a| a == crate::cli::FORWARDER_CMD.as_bytes())
        })
        .unwrap_or(false)
}

fn stop_pid(pid: i32) {
    // Our own forwarder daemon (checked by the callers).
    netns::signal(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(3);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if pid_alive(pid) {
        netns::signal(pid, rustix::process::Signal::KILL);
    }
}

/// Starts the detached forwarder process and waits until it has created the TUNs.
fn spawn_daemon(exe: &Path, args: &[String], dir: &Path) -> Result<i32, LabError> {
    let log = std::fs::File::create(dir.join("forwarder.log"))
        .map_err(|e| LabError::sys("create forwarder.log", e))?;
    let log2 = log.try_clone().map_err(|e| LabError::sys("dup log", e))?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the terminal's Ctrl-C.
    unsafe {
        cmd.pre_exec(|| {
            let _ = rustix::process::setsid();
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| LabError::sys(format!("start {}", exe.display()), e))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if dir.join("ready").exists() {
            return Ok(child.id() as i32);
        }
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(dir.join("forwarder.log")).unwrap_or_default();
            return Err(LabError::Forwarder(format!(
                "exited with {st}: {}",
                log.trim()
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(LabError::Forwarder(
                "did not become ready within 20 s".into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Body of the detached forwarder process (the hidden CLI subcommand).
pub fn daemon_main(dir: &Path) -> Result<(), LabError> {
    static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static RESTART: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    extern "C" fn on_stop(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }
    extern "C" fn on_usr1(_: libc::c_int) {
        RESTART.store(true, Ordering::Relaxed);
    }
    // SAFETY: the handlers only store to atomics (async-signal-safe). Kept on libc: rustix
    // installs no signal handlers outside its unstable runtime module.
    unsafe {
        libc::signal(libc::SIGTERM, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, on_stop as *const () as libc::sighandler_t);
        libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t);
    }
    let text = std::fs::read_to_string(dir.join("layout.json"))
        .map_err(|e| LabError::sys("read layout.json", e))?;
    let layout: Layout = serde_json::from_str(&text)
        .map_err(|e| LabError::Forwarder(format!("bad layout.json: {e}")))?;
    let lab = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| LabError::Forwarder("bad state dir".into()))?
        .to_string();
    let namespaces: Vec<String> = layout
        .hosts
        .iter()
        .map(|h| netns::host_ns(&lab, &h.name))
        .collect();
    let control = Control::new()?;
    let tuns = forwarder::open_tuns(&namespaces)?;
    let ports = crate::lan::open_ports(&netns::hub_ns(&lab), &namespaces, &layout)?;
    // A helper thread turns signal flags into control flags and publishes the counters.
    let c2 = control.clone();
    let dir2 = dir.to_path_buf();
    std::thread::spawn(move || {
        let mut last = Instant::now();
        loop {
            if STOP.load(Ordering::Relaxed) {
                c2.stop.store(true, Ordering::Relaxed);
                c2.wake();
                return;
            }
            if RESTART.swap(false, Ordering::Relaxed) {
                c2.restart_clock.store(true, Ordering::Relaxed);
                c2.wake();
            }
            if last.elapsed() > Duration::from_secs(1) {
                last = Instant::now();
                let s = serde_json::to_string(&*c2.stats.lock().expect("stats lock"))
                    .expect("stats serialize");
                let tmp = dir2.join("stats.json.tmp");
                if std::fs::File::create(&tmp)
                    .and_then(|mut f| f.write_all(s.as_bytes()))
                    .is_ok()
                {
                    let _ = std::fs::rename(&tmp, dir2.join("stats.json"));
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    // Pin only after the helper thread exists, so it does not inherit the pinning.
    for w in forwarder::tune_thread(forwarder::forwarder_cpu()) {
        eprintln!("lab forwarder: {w} (timing may suffer)");
    }
    std::fs::write(dir.join("ready"), "").map_err(|e| LabError::sys("write ready", e))?;
    forwarder::run_loop(&layout, &tuns, ports, &control)
}
