//! `send --ssh user@host,...` (or hosts-file entries with `ssh = "user@host"`): a one-shot
//! agent on each host, started over ssh as bbcp starts its peers, and gone after the send.
//!
//! Each host runs `BULKCAST agent --once --listen 0.0.0.0:0 --dir DIR` through `ssh`, under a
//! small shell wrapper: the session secret comes over ssh's stdin (never on a command line)
//! into a file only the user can read, and the wrapper kills the agent once that stdin ends,
//! which is when the send drops its end or its ssh dies. The agent says on its first line
//! where it listens; the send goes to those agents as to any others.
//!
//! A host without the binary (`--ssh-bulkcast` names it: a path, or a name on its `PATH`)
//! gets a copy of this one, when it runs the same system (`uname -sm`): sent over the same
//! ssh into a fresh private directory (`mktemp -d`), run from there, and removed by the
//! wrapper when the agent ends. `--ssh-no-copy` turns that off.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::Secret;
use bulkcast_proto::hosts::{HostsFile, SshTarget};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// How long a host has to start its agent.
const START: Duration = Duration::from_secs(30);

/// The agents started over ssh; killed (their ssh processes) when dropped.
pub struct Agents {
    children: Vec<Child>,
    /// Each ssh's stdin: closing it ends the remote agent.
    stdins: Vec<tokio::process::ChildStdin>,
    /// `host:port` of each agent, in the order of the targets.
    pub addrs: Vec<String>,
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
    /// Copy this binary to hosts that lack `remote_bin`.
    pub copy: bool,
}

/// How `send` and `plan` start one-shot agents over ssh.
#[derive(clap::Args, Clone)]
pub struct SshArgs {
    /// More arguments for every `ssh` of `--ssh` (and of a hosts file's `ssh` hosts), as one
    /// string (`"-p 2222 -i key"`).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub ssh_args: String,
    /// The bulkcast binary on the `--ssh` hosts (and a hosts file's `ssh` hosts).
    #[arg(long, default_value = "bulkcast")]
    pub ssh_bulkcast: String,
    /// Fail on `--ssh` (or `ssh`) hosts without the binary instead of copying this one there.
    #[arg(long)]
    pub ssh_no_copy: bool,
    /// Where the `--ssh` hosts store the object (relative paths start at the login's home;
    /// `{host}` becomes the host's name).
    #[arg(long, default_value = "bulkcast-incoming")]
    pub ssh_dir: String,
}

impl SshArgs {
    /// The options of a start on `targets`.
    pub fn options<'a>(&'a self, targets: &'a [SshTarget]) -> SshOptions<'a> {
        SshOptions {
            targets,
            ssh_args: &self.ssh_args,
            remote_bin: &self.ssh_bulkcast,
            remote_dir: &self.ssh_dir,
            copy: !self.ssh_no_copy,
        }
    }
}

/// The `ssh = "user@host[:port]"` hosts of a hosts file, in its order.
pub fn file_targets(file: &HostsFile) -> Result<Vec<SshTarget>> {
    file.hosts
        .iter()
        .filter_map(|h| h.ssh.as_deref())
        // Checked when the file was read.
        .map(|s| SshTarget::parse(s).map_err(|why| anyhow::anyhow!("ssh = {s:?}: {why}")))
        .collect()
}

/// The session secret for one-shot agents: the one given, else a fresh one when every agent
/// is one of ours (`all_ours`); running agents need theirs.
pub fn secret(common: &crate::Common, all_ours: bool) -> Result<Secret> {
    Ok(match (common.secret()?, all_ours) {
        (Some(s), _) => s,
        (None, true) => Secret::from_bytes(rand::random()),
        (None, false) => common.require_secret()?,
    })
}

/// Starts a one-shot agent for every `ssh` host of `file` (`targets`, from [`file_targets`])
/// and gives the file with their addresses in place of the `ssh` entries: a hosts file of
/// running agents.
pub async fn start_for_file(
    mut file: HostsFile,
    targets: &[SshTarget],
    args: &SshArgs,
    secret: &Secret,
) -> Result<(Agents, HostsFile)> {
    let agents = start(&args.options(targets), secret).await?;
    let mut addrs = agents.addrs.iter();
    for h in file.hosts.iter_mut().filter(|h| h.ssh.is_some()) {
        h.addr = addrs.next().context("an agent per ssh host")?.clone();
        // Now an agent like any other (and the file valid with its address).
        h.ssh = None;
    }
    // Checked again with the addresses: an agent may now share one with another host.
    let file = HostsFile::parse_toml(&file.to_toml()).context("hosts with their ssh agents")?;
    Ok((agents, file))
}

/// How long probing a host and copying the binary there may take.
const COPY: Duration = Duration::from_secs(120);

/// The targets of `--ssh`'s comma-separated list.
pub fn parse_list(list: &str) -> Result<Vec<SshTarget>> {
    let targets = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| SshTarget::parse(t).map_err(|why| anyhow::anyhow!("--ssh: {t:?}: {why}")))
        .collect::<Result<Vec<_>>>()?;
    if targets.is_empty() {
        bail!("--ssh names no host");
    }
    Ok(targets)
}

/// Starts an agent on every target and waits (at most [`START`]) until each listens.
pub async fn start(o: &SshOptions<'_>, secret: &Secret) -> Result<Agents> {
    let mut agents = Agents {
        children: Vec::new(),
        stdins: Vec::new(),
        addrs: Vec::new(),
    };
    for t in o.targets {
        let (target, host) = (t, t.host.as_str());
        // The binary to run there, and a directory to remove after (a copy's).
        let (bin, copied) = match binary_on(target, o).await? {
            Some(bin) => (bin, String::new()),
            None => {
                let dir = copy_binary(target, o).await?;
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
            .context("--ssh: starting ssh")?;
        let mut stdin = child.stdin.take().context("ssh stdin")?;
        stdin
            .write_all(format!("{}\n", secret.to_hex()).as_bytes())
            .await?;
        agents.stdins.push(stdin);
        let stdout = child.stdout.take().context("ssh stdout")?;
        agents.children.push(child);
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        match tokio::time::timeout(START, reader.read_line(&mut line)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => bail!("--ssh: no agent started on {target} (see ssh's messages above)"),
        }
        let port = line
            .split(" listening on ")
            .nth(1)
            .and_then(|r| r.split([',', ' ']).next())
            .and_then(|a| a.rsplit(':').next())
            .with_context(|| format!("--ssh: {target} said {line:?}"))?;
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
async fn binary_on(target: &SshTarget, o: &SshOptions<'_>) -> Result<Option<String>> {
    let bin = shell_quote(o.remote_bin);
    let probe = format!(
        "if [ -x {bin} ] || command -v {bin} > /dev/null 2>&1; then echo have; else echo missing; fi; uname -sm"
    );
    let mut cmd = ssh(o, target, &probe);
    cmd.stdin(Stdio::null()).stderr(Stdio::inherit());
    let out = tokio::time::timeout(COPY, cmd.output())
        .await
        .with_context(|| format!("--ssh: {target} did not answer within {COPY:?}"))?
        .context("--ssh: starting ssh")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    match (out.status.success(), lines.next(), lines.next()) {
        (true, Some("have"), _) => Ok(Some(o.remote_bin.to_string())),
        (true, Some("missing"), Some(system)) => {
            if !o.copy {
                bail!(
                    "--ssh: {target} has no {} (and --ssh-no-copy)",
                    o.remote_bin
                );
            }
            if !same_system(system) {
                bail!(
                    "--ssh: {target} has no {} and runs {system:?}, so this binary ({} {}) \
                     cannot be copied there: install bulkcast on it",
                    o.remote_bin,
                    std::env::consts::OS,
                    std::env::consts::ARCH
                );
            }
            Ok(None)
        }
        _ => bail!(
            "--ssh: cannot probe {target} ({}; see ssh's messages above)",
            out.status
        ),
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

/// Copies this binary to a fresh private directory on `target` (over ssh's stdin) and returns
/// the directory.
async fn copy_binary(target: &SshTarget, o: &SshOptions<'_>) -> Result<String> {
    let me = std::env::current_exe().context("--ssh: finding this binary to copy")?;
    let data = tokio::fs::read(&me)
        .await
        .with_context(|| format!("--ssh: reading {}", me.display()))?;
    let put = "umask 077; d=$(mktemp -d \"${TMPDIR:-/tmp}/bulkcast-ssh.XXXXXX\") || exit 2; \
               if cat > \"$d/bulkcast\" && chmod 700 \"$d/bulkcast\"; then echo \"$d\"; else rm -rf \"$d\"; exit 2; fi";
    let mut child = ssh(o, target, put)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("--ssh: starting ssh")?;
    let mut stdin = child.stdin.take().context("ssh stdin")?;
    let copy = async {
        stdin.write_all(&data).await?;
        drop(stdin);
        child.wait_with_output().await
    };
    let out = tokio::time::timeout(COPY, copy)
        .await
        .with_context(|| format!("--ssh: copying the binary to {target} took over {COPY:?}"))?
        .with_context(|| format!("--ssh: copying the binary to {target}"))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || !dir.starts_with('/') {
        bail!(
            "--ssh: copying the binary to {target} failed ({})",
            out.status
        );
    }
    eprintln!(
        "--ssh: {target} has no {}: copied this binary ({} bytes) to {dir}, removed after",
        o.remote_bin,
        data.len()
    );
    Ok(dir)
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
