//! Host key files: `bulkcast keygen` writes one, `--key`/`--allow` load it and the allow list.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use bulkcast_proto::identity::{AllowList, HostKey, Identity};

/// Writes a new key to `path` (mode 0600; an existing file is never overwritten) and returns
/// its public key.
pub fn create(path: &Path) -> Result<String> {
    let key = HostKey::from_seed(rand::random());
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating key file {}", path.display()))?;
    writeln!(f, "{}", key.to_hex())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing key file {}", path.display()))?;
    Ok(key.public().to_string())
}

/// Loads this host's key and its allow list. A key file others can read is refused, as ssh
/// does: whoever reads it can pose as this host.
pub fn load(key: &Path, allow: &Path) -> Result<Identity> {
    let meta =
        std::fs::metadata(key).with_context(|| format!("reading key file {}", key.display()))?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "key file {} is readable by others (mode {:o}): chmod 600 it",
            key.display(),
            mode & 0o777
        );
    }
    let text = std::fs::read_to_string(key)
        .with_context(|| format!("reading key file {}", key.display()))?;
    let key = HostKey::from_hex(&text).with_context(|| format!("key file {}", key.display()))?;
    let allow = load_allow(allow)?;
    Ok(Identity { key, allow })
}

/// Reads an allow list file; one that admits nobody is refused.
pub fn load_allow(path: &Path) -> Result<AllowList> {
    let list = std::fs::read_to_string(path)
        .with_context(|| format!("reading allow list {}", path.display()))?;
    let allow = AllowList::parse(&list).with_context(|| format!("{}", path.display()))?;
    if allow.is_empty() {
        bail!("the allow list admits nobody: add the public keys of the hosts this one talks to");
    }
    Ok(allow)
}

/// Reloads `list` from `path` at every SIGHUP, for as long as the process runs: the agent's
/// next handshakes (and its signature checks) use the new list, so a key taken off the file
/// is refused without a restart. A file that does not parse (or admits nobody) leaves the
/// list as it was, with an error in the log.
pub fn reload_on_hangup(path: PathBuf, list: AllowList) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            match load_allow(&path) {
                Ok(new) => {
                    list.replace(&new);
                    tracing::info!("allow list {} reloaded: {} keys", path.display(), new.len());
                }
                Err(e) => tracing::error!("{e:#}; the previous allow list stays in force"),
            }
        }
    });
    Ok(())
}
