//! One-shot agents over ssh (`send --ssh user@host,...`, and hosts-file entries with
//! `ssh = "user@host"` for `send` and `plan`): an agent on each host, started over ssh as bbcp
//! starts its peers, and gone after the send.
//!
//! Each host runs `BULKCAST agent --once --listen 0.0.0.0:0 --dir DIR` through `ssh`, under a
//! small shell wrapper: the session secret comes over ssh's stdin (never on a command line)
//! into a file only the user can read, and the wrapper kills the agent once that stdin ends,
//! which is when the send drops its end or its ssh dies. The agent says on its first line
//! where it listens; the send goes to those agents as to any others.
//!
//! A host without the binary (`--ssh-bulkcast` names it: a path, or a name on its `PATH`)
//! gets a copy of the local one ([`SshOptions::local_bin`], by default this program), when it
//! runs the same system (`uname -sm`): sent over the same ssh into a fresh private directory
//! (`mktemp -d`), run from there, and removed by the wrapper when the agent ends.
//! `--ssh-no-copy` turns that off.

use std::process::Stdio;
use std::time::Duration;

use bulkcast_proto::auth::Secret;
use bulkcast_proto::hosts::{HostsFile, SshTarget};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Why one-shot agents could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SshError {
    /// The list names no host.
    #[error("--ssh names no host")]
    NoHost,
    /// A target is malformed.
    #[error("--ssh: {target:?}: {why}")]
    Target {
        /// The target as given.
        target: String,
        /// What is wrong.
        why: String,
    },
    /// `ssh` could not be run, or the binary to copy read.
    #[error("--ssh: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A host answered nothing in time.
    #[error("--ssh: {0} did not answer within {COPY:?}")]
    Timeout(String),
    /// A host could not be probed for the binary (ssh failed).
    #[error("--ssh: cannot probe {target} ({status}; see ssh's messages above)")]
    Probe {
        /// The host.
        target: String,
        /// ssh's exit status.
        status: std::process::ExitStatus,
    },
    /// A host lacks the binary and copies are off.
    #[error("--ssh: {target} has no {bin} (and --ssh-no-copy)")]
    NoBinary {
        /// The host.
        target: String,
        /// The binary it lacks.
        bin: String,
    },
    /// A host lacks the binary and runs another system.
    #[error(
        "--ssh: {target} has no {bin} and runs {system:?}, so this binary ({} {}) cannot be \
         copied there: install bulkcast on it",
        std::env::consts::OS,
        std::env::consts::ARCH
    )]
    OtherSystem {
        /// The host.
        target: String,
        /// The binary it lacks.
        bin: String,
        /// Its `uname -sm`.
        system: String,
    },
    /// Copying the binary failed.
    #[error("--ssh: copying the binary to {target} failed ({why})")]
    Copy {
        /// The host.
        target: String,
        /// Why.
        why: String,
    },
    /// The agent did not start, or did not say where it listens.
    #[error("--ssh: no agent started on {target} (see ssh's messages above){said}")]
    NoAgent {
        /// The host.
        target: String,
        /// What it said instead, if anything.
        said: String,
    },
    /// The hosts file with the agents' addresses is not valid (an agent shares an address).
    #[error("hosts with their ssh agents: {0}")]
    Hosts(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SshError {
    let what = what.into();
    move |source| SshError::Io { what, source }
}

/// How long a host has to start its agent.
const START: Duration = Duration::from_secs(30);

/// The agents started over ssh; killed (their ssh processes) when dropped.
pub struct Agents {
    children: Vec<Child>,
    /// Each ssh's stdin: closing it ends the remote agent.
    stdins: Vec<tokio::process::ChildStdin>,
    /// `host:port` of each agent, in the order of the targets.
    pub addrs: Vec<String>,
    /// What was copied where: one line per host that got a copy of the binary.
    pub copies: Vec<String>,
}

/// Options of `--ssh`.
pub struct SshOptions<'a> {
    /// Where to start agents.
    pub targets: &'a [SshTarget],
    /// Extra `ssh` arguments, split at spaces (`-p 2222 -i key`).
    pub ssh_args: &'a str,
    /// The binary on the hosts.
    pub remote_bin: &'a str,
    /// Where the hosts store the object; `{host}` becomes the host's name.
    pub remote_dir: &'a str,
    /// Copy the local binary to hosts that lack `remote_bin`.
    pub copy: bool,
    /// The binary to copy (`None`: this program, which must then be `bulkcast`).
    pub local_bin: Option<&'a std::path::Path>,
}

/// The `ssh = "user@host[:port]"` hosts of a hosts file, in its order.
pub fn file_targets(file: &HostsFile) -> Result<Vec<SshTarget>, SshError> {
    file.hosts
        .iter()
        .filter_map(|h| h.ssh.as_deref())
        // Checked when the file was read.
        .map(|s| {
            SshTarget::parse(s).map_err(|why| SshError::Target {
                target: s.into(),
                why: why.to_string(),
            })
        })
        .collect()
}

/// Starts a one-shot agent for every `ssh` host of `file` (`targets`, from [`file_targets`])
/// and gives the file with their addresses in place of the `ssh` entries: a hosts file of
/// running agents.
pub async fn start_for_file(
    mut file: HostsFile,
    o: &SshOptions<'_>,
    secret: &Secret,
) -> Result<(Agents, HostsFile), SshError> {
    let agents = start(o, secret).await?;
    // One agent per target, in order; `o.targets` are the file's.
    let mut addrs = agents.addrs.iter();
    for h in file.hosts.iter_mut().filter(|h| h.ssh.is_some()) {
        if let Some(a) = addrs.next() {
            h.addr = a.clone();
            // Now an agent like any other (and the file valid with its address).
            h.ssh = None;
        }
    }
    // Checked again with the addresses: an agent may now share one with another host.
    let file =
        HostsFile::parse_toml(&file.to_toml()).map_err(|e| SshError::Hosts(e.to_string()))?;
    Ok((agents, file))
}

/// How long probing a host and copying the binary there may take.
const COPY: Duration = Duration::from_secs(120);

/// The targets of `--ssh`'s comma-separated list.
pub fn parse_list(list: &str) -> Result<Vec<SshTarget>, SshError> {
    let targets = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            SshTarget::parse(t).map_err(|why| SshError::Target {
                target: t.into(),
                why: why.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() {
        return Err(SshError::NoHost);
    }
    Ok(targets)
}

/// Starts an agent on every target and waits (at most 30 s, `START`) until each listens.
pub async fn start(o: &SshOptions<'_>, secret: &Secret) -> Result<Agents, SshError> {
    let mut agents = Agents {
        children: Vec::new(),
        stdins: Vec::new(),
        addrs: Vec::new(),
        copies: Vec::new(),
    };
    for t in o.targets {
        let (target, host) = (t, t.host.as_str());
        // The binary to run there, and a directory to remove after (a copy's).
        let (bin, copied) = match binary_on(target, o).await? {
            Some(bin) => (bin, String::new()),
            None => {
                let (dir, bytes) = copy_binary(target, o).await?;
                agents.copies.push(format!(
                    "--ssh: {target} has no {}: copied this binary ({bytes} bytes) to {dir}, removed after",
                    o.remote_bin
                ));
                (format!("{dir}/bulkcast"), dir)
            }
        };
        let cleanup = if copied.is_empty() {
            String::new()
        } else {
            format!("rm -rf {};", shell_quote(&copied))
        };
        let remote = format!(
            "umask 077; f=$(mktemp) || exit 2; head -n 1 > \"$f\"; \
             BULKCAST_LOG=error {} agent --once --listen 0.0.0.0:0 --dir {} --secret-file \"$f\" & p=$!; \
             {{ cat > /dev/null; kill $p 2> /dev/null; }} <&0 & \
             wait $p; rc=$?; rm -f \"$f\"; {cleanup} exit $rc",
            shell_quote(&bin),
            shell_quote(&o.remote_dir.replace("{host}", host))
        );
        let mut child = ssh(o, target, &remote)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(io("starting ssh"))?;
        let no_agent = |said: String| SshError::NoAgent {
            target: target.to_string(),
            said,
        };
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(no_agent(String::new()));
        };
        stdin
            .write_all(format!("{}\n", secret.to_hex()).as_bytes())
            .await
            .map_err(io(format!("passing the secret to {target}")))?;
        agents.stdins.push(stdin);
        agents.children.push(child);
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        match tokio::time::timeout(START, reader.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err(no_agent(String::new())),
        }
        let port = line
            .split(" listening on ")
            .nth(1)
            .and_then(|r| r.split([',', ' ']).next())
            .and_then(|a| a.rsplit(':').next())
            .ok_or_else(|| no_agent(format!(": it said {line:?}")))?;
        agents.addrs.push(format!("{host}:{}", port.trim()));
    }
    Ok(agents)
}

impl Agents {
    /// Ends the agents: closes each ssh's stdin, which stops its agent and lets the wrapper
    /// remove what it left (a copied binary), then waits (at most 10 s in all) for the ssh
    /// processes to exit; those left are killed on drop.
    pub async fn stop(mut self) {
        self.stdins.clear();
        let all = async {
            for c in &mut self.children {
                let _ = c.wait().await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), all).await;
    }
}

/// `ssh` to `target` running `remote`, with the user's `--ssh-args`.
fn ssh(o: &SshOptions<'_>, target: &SshTarget, remote: &str) -> Command {
    let mut c = Command::new("ssh");
    c.args(["-o", "BatchMode=yes"]);
    // Before `--ssh-args`: ssh takes the first `-p`, so the target's own port wins.
    if let Some(p) = target.port {
        c.arg("-p").arg(p.to_string());
    }
    c.args(o.ssh_args.split_whitespace())
        .arg(&target.login)
        .arg(remote)
        .kill_on_drop(true);
    c
}

/// The binary to run on `target`: `remote_bin` if it is there, `None` if it is not and a copy
/// of this one can run there (refused with why when it cannot, or copies are off).
async fn binary_on(target: &SshTarget, o: &SshOptions<'_>) -> Result<Option<String>, SshError> {
    let bin = shell_quote(o.remote_bin);
    let probe = format!(
        "if [ -x {bin} ] || command -v {bin} > /dev/null 2>&1; then echo have; else echo missing; fi; uname -sm"
    );
    let mut cmd = ssh(o, target, &probe);
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    let out = tokio::time::timeout(COPY, cmd.output())
        .await
        .map_err(|_| SshError::Timeout(target.to_string()))?
        .map_err(io("starting ssh"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let (target, bin) = (target.to_string(), o.remote_bin.to_string());
    match (out.status.success(), lines.next(), lines.next()) {
        (true, Some("have"), _) => Ok(Some(bin)),
        (true, Some("missing"), _) if !o.copy => Err(SshError::NoBinary { target, bin }),
        (true, Some("missing"), Some(system)) if !same_system(system) => {
            Err(SshError::OtherSystem {
                target,
                bin,
                system: system.into(),
            })
        }
        (true, Some("missing"), Some(_)) => Ok(None),
        _ => Err(SshError::Probe {
            target,
            status: out.status,
        }),
    }
}

/// Whether `uname -sm`'s answer is this binary's system.
fn same_system(uname: &str) -> bool {
    let mut w = uname.split_whitespace();
    let (Some(os), Some(machine)) = (w.next(), w.next()) else {
        return false;
    };
    os.eq_ignore_ascii_case(std::env::consts::OS) && machine == std::env::consts::ARCH
}

/// Copies the local binary to a fresh private directory on `target` (over ssh's stdin) and
/// returns the directory and the bytes copied.
async fn copy_binary(target: &SshTarget, o: &SshOptions<'_>) -> Result<(String, usize), SshError> {
    let me = match o.local_bin {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe().map_err(io("finding this binary to copy"))?,
    };
    let data = tokio::fs::read(&me)
        .await
        .map_err(io(format!("reading {}", me.display())))?;
    let put = "umask 077; d=$(mktemp -d \"${TMPDIR:-/tmp}/bulkcast-ssh.XXXXXX\") || exit 2; \
               if cat > \"$d/bulkcast\" && chmod 700 \"$d/bulkcast\"; then echo \"$d\"; else rm -rf \"$d\"; exit 2; fi";
    let mut child = ssh(o, target, put)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(io("starting ssh"))?;
    let failed = |why: String| SshError::Copy {
        target: target.to_string(),
        why,
    };
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| failed("no stdin".into()))?;
    let copy = async {
        stdin.write_all(&data).await?;
        drop(stdin);
        child.wait_with_output().await
    };
    let out = tokio::time::timeout(COPY, copy)
        .await
        .map_err(|_| failed(format!("took over {COPY:?}")))?
        .map_err(|e| failed(e.to_string()))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !dir.starts_with('/') {
        return Err(failed(out.status.to_string()));
    }
    Ok((dir, data.len()))
}

/// `s` as one word for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_system_takes_a_copy() {
        let me = format!("{} {}", std::env::consts::OS, std::env::consts::ARCH);
        assert!(same_system(&me));
        let os = std::env::consts::OS.to_uppercase();
        assert!(same_system(&format!("{os} {}", std::env::consts::ARCH)));
        assert!(!same_system("Darwin arm64x"));
        assert!(!same_system(""));
    }

    #[test]
    fn quoting_keeps_a_path_one_word() {
        assert_eq!(shell_quote("/opt/bulk cast"), "'/opt/bulk cast'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
