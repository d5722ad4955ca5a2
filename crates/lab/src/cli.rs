//! The `bulkcast-lab` subcommands.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::check::{check, CheckOptions};
use crate::lab::{daemon_main, Lab, LabOptions};
use crate::scenario::Scenario;
use crate::LabError;

/// Name of the hidden subcommand the detached forwarder runs as.
pub const FORWARDER_CMD: &str = "__forwarder";

/// `lab` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Bring a scenario up and leave it running (until `lab down`).
    Up {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Lab name (default: the scenario's name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Bring a scenario up, run a command, tear the lab down; exits with the command's status.
    ///
    /// The command runs in the root namespace with BULKCAST_LAB (lab name) and
    /// BULKCAST_LAB_HOSTS (hosts file) and BULKCAST_LAB_MATRIX (planner matrix) set, or inside
    /// one host with --host.
    Run {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Lab name (default: the scenario's name).
        #[arg(long)]
        name: Option<String>,
        /// Run the command inside this host.
        #[arg(long)]
        host: Option<String>,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command inside a host of a running lab.
    Exec {
        /// Lab name (default: the only lab that is up).
        #[arg(long)]
        name: Option<String>,
        /// Host name.
        host: String,
        /// The command and its arguments (after `--`).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Tear a lab down (also a stale one left by a crash).
    Down {
        /// Lab name (default: the only lab that is up).
        #[arg(long)]
        name: Option<String>,
    },
    /// Bring a scenario up, measure configured vs delivered RTT, TCP throughput, UDP loss and
    /// forwarder CPU for every kind of path, print the table, tear down. Exit 1 on a missed target.
    Check {
        /// Scenario file (TOML).
        scenario: PathBuf,
        /// Lab name (default: the scenario's name).
        #[arg(long)]
        name: Option<String>,
        /// Seconds per TCP measurement.
        #[arg(long, default_value_t = 8)]
        tcp_secs: u32,
        /// UDP packets per loss measurement.
        #[arg(long, default_value_t = 12_000)]
        udp_packets: u32,
        /// At most this many distinct kinds of path.
        #[arg(long, default_value_t = 8)]
        max_paths: usize,
        /// Congestion controls, comma-separated.
        #[arg(long, default_value = "cubic,bbr", value_delimiter = ',')]
        cc: Vec<String>,
    },
    /// Internal: the detached forwarder process of `lab up`.
    #[command(name = "__forwarder", hide = true)]
    Forwarder {
        /// State directory of the lab.
        state_dir: PathBuf,
    },
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Catch Ctrl-C / SIGTERM so the lab is torn down before exiting (handlers reset on exec,
/// so commands started later get the default behaviour).
fn catch_interrupts() {
    // SAFETY: the handler only stores to an atomic. Kept on libc: rustix installs no signal
    // handlers outside its unstable runtime module.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_interrupt as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_interrupt as *const () as libc::sighandler_t,
        );
    }
}

fn interrupted() -> Result<(), LabError> {
    if INTERRUPTED.load(Ordering::Relaxed) {
        Err(LabError::Forwarder("interrupted".into()))
    } else {
        Ok(())
    }
}

fn default_name(name: Option<String>) -> Result<String, LabError> {
    if let Some(n) = name {
        return Ok(n);
    }
    let labs: Vec<String> = std::fs::read_dir(crate::netns::STATE_ROOT)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    match labs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(LabError::NotUp("(none)".into())),
        _ => Err(LabError::Scenario(format!(
            "several labs are up ({}); pick one with --name",
            labs.join(", ")
        ))),
    }
}

/// A child's exit status as a shell reports it (128 + signal when killed).
fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Runs a `lab` subcommand; returns the process exit code.
pub fn run(cmd: LabCommand) -> Result<i32, LabError> {
    match cmd {
        LabCommand::Up { scenario, name } => up(&scenario, name),
        LabCommand::Run {
            scenario,
            name,
            host,
            command,
        } => run_in_lab(&scenario, name, host.as_deref(), &command),
        LabCommand::Exec {
            name,
            host,
            command,
        } => {
            let lab = Lab::attach(&default_name(name)?)?;
            let mut c = lab.command(&host, &command[0])?;
            let st = c
                .args(&command[1..])
                .stdin(Stdio::inherit())
                .status()
                .map_err(|e| LabError::sys(format!("run {}", command[0]), e))?;
            Ok(exit_code(st))
        }
        LabCommand::Down { name } => {
            let name = default_name(name)?;
            Lab::remove(&name)?;
            println!("lab {name:?} is down");
            Ok(0)
        }
        LabCommand::Check {
            scenario,
            name,
            tcp_secs,
            udp_packets,
            max_paths,
            cc,
        } => {
            let opts = CheckOptions {
                tcp_s: tcp_secs,
                udp_packets,
                max_paths,
                ccs: cc,
                ..Default::default()
            };
            check_lab(&scenario, name, &opts)
        }
        LabCommand::Forwarder { state_dir } => {
            daemon_main(&state_dir)?;
            Ok(0)
        }
    }
}

/// `lab up`: brings the lab up with its forwarder in a detached process, prints the hosts.
fn up(scenario: &Path, name: Option<String>) -> Result<i32, LabError> {
    let sc = Scenario::load(scenario)?;
    let exe = std::env::current_exe().map_err(|e| LabError::sys("current_exe", e))?;
    // Re-exec ourselves with the same leading arguments (none for `bulkcast-lab`), then the
    // hidden subcommand.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pos = args.iter().position(|a| a == "up").unwrap_or(0);
    let mut fwd_args: Vec<String> = args[..pos].to_vec();
    fwd_args.push(FORWARDER_CMD.into());
    let lab = Lab::up_detached(&sc, &LabOptions { name }, &exe, &fwd_args)?;
    println!(
        "lab {:?} is up: {} hosts",
        lab.name(),
        lab.layout().hosts.len()
    );
    for h in &lab.layout().hosts {
        println!(
            "  {:<20} {:<16} site {}",
            h.name,
            h.addr,
            lab.layout().sites[h.site]
        );
    }
    println!("hosts file: {}", lab.hosts_file().display());
    Ok(0)
}

/// `lab run`: brings a lab up, runs one command (in a host, or outside with the lab's
/// variables), takes the lab down; the command's exit code is the result.
fn run_in_lab(
    scenario: &Path,
    name: Option<String>,
    host: Option<&str>,
    command: &[String],
) -> Result<i32, LabError> {
    catch_interrupts();
    let sc = Scenario::load(scenario)?;
    let lab = Lab::up_with(&sc, &LabOptions { name })?;
    let mut c = match host {
        Some(h) => lab.command(h, &command[0])?,
        None => {
            let mut c = std::process::Command::new(&command[0]);
            c.env("BULKCAST_LAB", lab.name())
                .env("BULKCAST_LAB_HOSTS", lab.hosts_file())
                .env("BULKCAST_LAB_MATRIX", lab.matrix_file());
            c
        }
    };
    c.args(&command[1..]);
    lab.start_clock();
    let mut child = c
        .spawn()
        .map_err(|e| LabError::sys(format!("run {}", command[0]), e))?;
    let status = wait_interruptible(&mut child)?;
    let dropped: u64 = lab.tx_dropped()?.iter().map(|(_, d)| d).sum();
    if dropped > 0 {
        eprintln!("lab: WARNING: {dropped} packets dropped at TUN queues: the lab was overloaded, results are invalid");
    }
    let port_drops = lab.stats().port_drops;
    if port_drops > 0 {
        eprintln!("lab: WARNING: {port_drops} frames dropped by full port delay queues: results are invalid");
    }
    lab.down()?;
    Ok(status)
}

/// Waits for `child`; on Ctrl-C stops it (after 2 s of grace) and returns 130, so the caller
/// still takes the lab down.
fn wait_interruptible(child: &mut std::process::Child) -> Result<i32, LabError> {
    loop {
        if let Some(st) = child.try_wait().map_err(|e| LabError::sys("wait", e))? {
            return Ok(exit_code(st));
        }
        if INTERRUPTED.load(Ordering::Relaxed) {
            // The terminal sent the command SIGINT too; give it a moment, then stop it.
            let t = Instant::now();
            while child.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(2)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            return Ok(130);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `lab check`: brings a lab up, measures it, prints the table; exit code 1 when a target
/// was missed.
fn check_lab(scenario: &Path, name: Option<String>, opts: &CheckOptions) -> Result<i32, LabError> {
    catch_interrupts();
    let sc = Scenario::load(scenario)?;
    let lab = Lab::up_with(&sc, &LabOptions { name })?;
    interrupted()?;
    let report = check(&lab, opts, |m| {
        eprintln!("lab check: {m}");
    })?;
    print!("{}", report.render());
    lab.down()?;
    Ok(if report.failures().is_empty() { 0 } else { 1 })
}
