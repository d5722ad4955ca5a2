//! Stand-alone `lab` CLI for developing the lab without the `bulkcast` binary:
//! `cargo run -p bulkcast-lab --example lab -- up scenarios/star-4.toml`.

use clap::Parser;

#[derive(Parser)]
#[command(name = "lab", about = "bulkcast's emulated WAN")]
struct Args {
    #[command(subcommand)]
    cmd: bulkcast_lab::LabCommand,
}

fn main() {
    let args = Args::parse();
    match bulkcast_lab::run(args.cmd) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("lab: {e}");
            std::process::exit(2);
        }
    }
}
