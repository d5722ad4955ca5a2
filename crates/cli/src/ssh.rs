//! `send --ssh user@host,...`: a one-shot agent on each host, started over ssh as bbcp starts
//! its peers, and gone after the send.
//!
//! Each host runs `BULKCAST agent --once --listen 0.0.0.0:0 --dir DIR` through `ssh`, under a
//! small shell wrapper: the session secret comes over ssh's stdin (never on a command line)
//! into a file only the user can read, and the wrapper kills the agent once that stdin ends,
//! which is when the send drops its end or its ssh dies. The agent says on its first line
//! where it listens; the send goes to those agents as to any others. The binary must be on
//! the host already (`--ssh-bulkcast` names it); copying it there is not done yet.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::Secret;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// How long a host has to start its agent.
const START: Duration = Duration::from_secs(30);

/// The agents started over ssh; killed (their ssh processes) when dropped.
pub struct Agents {
    children: Vec<Child>,
    /// Each ssh's stdin: closing it ends the remote agent.
    stdins: Vec<tokio::process::ChildStdin>,
    /// `host:port` of each agent, for `--to`.
    pub to: String,
}

/// Options of `--ssh`.
pub struct SshOptions<'a> {
    /// `user@host` targets.
    pub targets: &'a str,
    /// Extra `ssh` arguments, split at spaces (`-p 2222 -i key`).
    pub ssh_args: &'a str,
    /// The binary on the hosts.
    pub remote_bin: &'a str,
    /// Where the hosts store the object; `{host}` becomes the host's name.
    pub remote_dir: &'a str,
}

/// Starts an agent on every target and waits (at most [`START`]) until each listens.
pub async fn start(o: &SshOptions<'_>, secret: &Secret) -> Result<Agents> {
    let mut agents = Agents {
        children: Vec::new(),
        stdins: Vec::new(),
        to: String::new(),
    };
    let mut addrs = Vec::new();
    for target in o
        .targets
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let host = target.rsplit('@').next().unwrap_or(target);
        if host.is_empty() || host.contains(char::is_whitespace) {
            bail!("--ssh: {target:?} is not user@host");
        }
        let remote = format!(
            "umask 077; f=$(mktemp) || exit 2; head -n 1 > \"$f\"; \
             BULKCAST_LOG=error {} agent --once --listen 0.0.0.0:0 --dir {} --secret-file \"$f\" & p=$!; \
             {{ cat > /dev/null; kill $p 2> /dev/null; }} <&0 & \
             wait $p; rc=$?; rm -f \"$f\"; exit $rc",
            shell_quote(o.remote_bin),
            shell_quote(&o.remote_dir.replace("{host}", host))
        );
        let mut child = Command::new("ssh")
            .args(["-o", "BatchMode=yes"])
            .args(o.ssh_args.split_whitespace())
            .arg(target)
            .arg(remote)
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
        addrs.push(format!("{host}:{}", port.trim()));
    }
    if addrs.is_empty() {
        bail!("--ssh names no host");
    }
    agents.to = addrs.join(",");
    Ok(agents)
}

/// `s` as one word for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_keeps_a_path_one_word() {
        assert_eq!(shell_quote("/opt/bulk cast"), "'/opt/bulk cast'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
