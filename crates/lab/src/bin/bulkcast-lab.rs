//! `bulkcast-lab`: the lab's own binary, so the release `bulkcast` binary carries no root-only
//! network-namespace code. `cargo run --release -p bulkcast-lab -- up scenarios/star-4.toml`.

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "bulkcast-lab",
    version,
    about = "bulkcast's emulated WAN: many hosts in network namespaces on one machine"
)]
struct Args {
    #[command(subcommand)]
    cmd: bulkcast_lab::LabCommand,
}

fn main() {
    let args = Args::parse();
    match bulkcast_lab::run(args.cmd) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("bulkcast-lab: {e}");
            std::process::exit(2);
        }
    }
}
