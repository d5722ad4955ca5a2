//! `bulkcast demo`: the whole system on one machine, no root, no other host.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::tree::Tree;
use bulkcast_runtime::input::Input;
use bulkcast_runtime::source::{self, SendConfig};
use bulkcast_runtime::transport::{self, TcpTuning};
use clap::Args;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::progress;

#[derive(Args)]
pub struct DemoArgs {
    /// Receivers to start.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u16).range(1..=64))]
    receivers: u16,
    /// Size of the generated file in MiB.
    #[arg(long, default_value_t = 64)]
    size_mib: u64,
    /// Children per node in the relay tree.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    fanout: u16,
    /// Keep the working directory.
    #[arg(long)]
    keep: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Agent processes that are killed when dropped.
struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.start_kill();
        }
    }
}

pub async fn run(a: DemoArgs) -> Result<i32> {
    let work = std::env::temp_dir().join(format!("bulkcast-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(work.join("source"))?;
    let result = demo(&a, &work).await;
    if a.keep {
        eprintln!("working directory kept: {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

async fn demo(a: &DemoArgs, work: &Path) -> Result<i32> {
    let file = work.join("source/demo.bin");
    eprintln!(
        "generating {} MiB of test data in {}",
        a.size_mib,
        file.display()
    );
    let expect = generate(&file, a.size_mib << 20)?;
    let secret = Secret::from_bytes(rand::random());
    let exe = std::env::current_exe().context("locating the bulkcast binary")?;
    let mut agents = Agents(Vec::new());
    let mut hosts = Vec::new();
    for i in 1..=a.receivers {
        let dir = work.join(format!("receiver-{i}"));
        let mut child = Command::new(&exe)
            .args(["agent", "--listen", "127.0.0.1:0", "--dir"])
            .arg(&dir)
            .env("BULKCAST_SECRET", secret.to_hex())
            .env("BULKCAST_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting an agent")?;
        let out = child.stdout.take().context("agent stdout")?;
        agents.0.push(child);
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            BufReader::new(out).read_line(&mut line),
        )
        .await
        .context("agent did not start within 10 s")??;
        let addr = line
            .split_whitespace()
            .nth(4)
            .map(|s| s.trim_end_matches(','))
            .context("agent did not say where it listens")?
            .to_string();
        let mut h = HostSpec::from_addr(&addr);
        h.name = format!("receiver-{i}");
        hosts.push((h, dir));
    }
    let specs: Vec<HostSpec> = hosts.iter().map(|h| h.0.clone()).collect();
    let tree = Tree::kary(specs.len(), a.fanout as usize);
    eprintln!(
        "{} agents on loopback; relay tree with fan-out {}:",
        specs.len(),
        a.fanout
    );
    print_tree(&tree, &specs, 0, 1);
    let cfg = SendConfig {
        tuning: TcpTuning {
            cc: transport::default_cc(),
            ..TcpTuning::default()
        },
        strategy: format!("tree (fan-out {})", a.fanout),
        ..SendConfig::default()
    };
    let input = Input::open(&file, None)?;
    let status = source::new_status(&specs, &tree, cfg.chunk_size, input.manifest.total_len);
    let display = progress::sender(status.clone());
    let report = source::send(
        input,
        &specs,
        &tree,
        Keys::derive(&secret),
        rand::random(),
        &cfg,
        status,
    )
    .await;
    display.abort();
    progress::clear();
    let report = report?;
    crate::send::print_report(&report, a.json)?;
    // Independent check: hash every copy on disk against the source.
    let mut all = report.ok;
    for (h, dir) in &hosts {
        let got = hash_file(&dir.join("demo.bin"));
        let ok = got.as_ref().is_ok_and(|g| *g == expect);
        all &= ok;
        eprintln!(
            "  {:<12} {}",
            h.name,
            match got {
                Ok(_) if ok => "copy on disk matches the source (BLAKE3)".to_string(),
                Ok(_) => "COPY DIFFERS FROM THE SOURCE".to_string(),
                Err(e) => format!("no copy: {e}"),
            }
        );
    }
    drop(agents);
    if !all {
        bail!("demo failed: not every receiver has a verified copy");
    }
    eprintln!("demo ok: {} receivers, every copy verified", hosts.len());
    Ok(0)
}

fn print_tree(tree: &Tree, hosts: &[HostSpec], node: usize, depth: usize) {
    for c in tree.children(node) {
        eprintln!("{}{}", "  ".repeat(depth), hosts[c - 1].name);
        print_tree(tree, hosts, c, depth + 1);
    }
}

/// Writes `len` pseudo-random bytes (BLAKE3 output stream) and returns their hash.
fn generate(path: &PathBuf, len: u64) -> Result<blake3::Hash> {
    use std::io::Write;
    let mut xof = blake3::Hasher::new()
        .update(b"bulkcast demo")
        .finalize_xof();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        f.write_all(&buf[..n])?;
        h.update(&buf[..n]);
        left -= n as u64;
    }
    f.flush()?;
    Ok(h.finalize())
}

fn hash_file(p: &Path) -> std::io::Result<blake3::Hash> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(p)?)?;
    Ok(h.finalize())
}
