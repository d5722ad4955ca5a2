//! The lab runner behind `bench/lab-run`: brings a scenario up, runs each named method from a
//! methods file on it and prints one table.

use std::path::PathBuf;
use std::time::Duration;

use bulkcast_lab::bench::{render, run_method, BenchOptions, MethodsFile};
use bulkcast_lab::{Lab, Scenario};
use clap::Parser;
use rand::{RngCore, SeedableRng};

#[derive(Parser)]
#[command(
    name = "lab-bench",
    about = "run distribution methods on a lab scenario"
)]
struct Args {
    /// Scenario file.
    scenario: PathBuf,
    /// Methods file (TOML, `[[method]]` entries).
    #[arg(long, default_value = "bench/lab-methods.toml")]
    methods_file: PathBuf,
    /// Methods to run, comma-separated (default: all in the file).
    #[arg(long, value_delimiter = ',')]
    methods: Vec<String>,
    /// Object size, e.g. 64M, 1G, 500K.
    #[arg(long, default_value = "64M")]
    size: String,
    /// Give up on a method after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Congestion control passed to methods as {cc}.
    #[arg(long, default_value = "cubic")]
    cc: String,
    /// Work directory (object and copies).
    #[arg(long, default_value = "/tmp/bclab-bench")]
    work_dir: PathBuf,
    /// Where methods' `{raw}` directories go (default: WORK_DIR/raw).
    #[arg(long)]
    raw_dir: Option<PathBuf>,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mult)
}

fn main() {
    let a = Args::parse();
    if let Err(e) = run(a) {
        eprintln!("lab-bench: {e}");
        std::process::exit(2);
    }
}

fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let size = parse_size(&a.size).ok_or("bad --size")?;
    let file: MethodsFile = toml::from_str(&std::fs::read_to_string(&a.methods_file)?)?;
    let methods: Vec<_> = if a.methods.is_empty() {
        file.methods.clone()
    } else {
        a.methods
            .iter()
            .map(|n| {
                file.methods
                    .iter()
                    .find(|m| &m.name == n)
                    .cloned()
                    .ok_or(format!("no method {n:?}"))
            })
            .collect::<Result<_, _>>()?
    };
    std::fs::create_dir_all(&a.work_dir)?;
    // Absolute, as the runner makes `{raw}`: a method's commands may change directory.
    let work_dir = std::fs::canonicalize(&a.work_dir)?;
    // The lab first: it refuses a second bench of the same scenario (`LabError::Busy`)
    // before anything here touches the work directory that bench may be sending from.
    let sc = Scenario::load(&a.scenario)?;
    let lab = Lab::up(&sc)?;
    // This bench's own object (another scenario's bench may share the work directory: a
    // common file would be rewritten under its source, or removed before its last method).
    let object = RemovedOnDrop(work_dir.join(format!("object-{}.bin", std::process::id())));
    // Random bytes (seeded): nothing compresses, every run distributes the same object.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(42);
    let mut data = vec![0u8; size as usize];
    rng.fill_bytes(&mut data);
    std::fs::write(&object.0, &data)?;
    drop(data);
    let opts = BenchOptions {
        object: object.0.clone(),
        work_dir: work_dir.join("out"),
        timeout: Duration::from_secs(a.timeout),
        cc: a.cc.clone(),
        raw_dir: a.raw_dir.clone().unwrap_or_else(|| work_dir.join("raw")),
    };
    let mut results = Vec::new();
    for (i, m) in methods.iter().enumerate() {
        eprintln!("lab-bench: {} ...", m.name);
        match run_method(&lab, m, &opts, 7500 + i as u16) {
            Ok(r) => results.push(r),
            Err(e) => eprintln!("lab-bench: {}: {e}", m.name),
        }
        // Let queues drain before the next method.
        std::thread::sleep(Duration::from_secs(1));
    }
    print!("{}", render(&lab, size, &results));
    if let Some(path) = &a.json {
        let layout = lab.layout();
        let hosts: Vec<_> = layout
            .hosts
            .iter()
            .map(|h| serde_json::json!({"name": h.name, "site": layout.sites[h.site]}))
            .collect();
        let doc = serde_json::json!({
            "scenario": layout.name,
            "size": size,
            "source": layout.hosts[layout.source].name,
            "sites": layout.sites,
            "hosts": hosts,
            "ideal_bps": layout.ideal_bps,
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    drop(object);
    lab.down()?;
    Ok(())
}

/// A file removed when the run ends, however it ends (an error half-way through left a copy
/// of the object, up to gigabytes, in the work directory).
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
