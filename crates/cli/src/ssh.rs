//! `--ssh-*`: the options of the one-shot agents `send` and `plan` start over ssh
//! ([`bulkcast_runtime::ssh`] starts them).

use anyhow::Result;
use bulkcast_proto::auth::Secret;
use bulkcast_proto::hosts::{HostsFile, SshTarget};
use bulkcast_runtime::ssh::{self, Agents, SshOptions};

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
            local_bin: None,
        }
    }
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

/// Starts the agents of `targets` and says where the binary was copied.
pub async fn start(args: &SshArgs, targets: &[SshTarget], secret: &Secret) -> Result<Agents> {
    let agents = ssh::start(&args.options(targets), secret).await?;
    for line in &agents.copies {
        eprintln!("{line}");
    }
    Ok(agents)
}

/// Starts the agents of `file`'s `ssh` hosts (`targets`) and gives the file with their
/// addresses; says where the binary was copied.
pub async fn start_for_file(
    file: HostsFile,
    targets: &[SshTarget],
    args: &SshArgs,
    secret: &Secret,
) -> Result<(Agents, HostsFile)> {
    let (agents, file) = ssh::start_for_file(file, &args.options(targets), secret).await?;
    for line in &agents.copies {
        eprintln!("{line}");
    }
    Ok((agents, file))
}
