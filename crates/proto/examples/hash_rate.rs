//! BLAKE3 on one core, as bulkcast hashes chunks: prints seconds of CPU per GiB.
//!
//! `bench/loopback.sh` uses it to put the cost of verification beside iperf3's cost of moving
//! the same bytes (every byte is hashed twice: at the source, and at each receiver).
//!
//! `cargo run --release -p bulkcast-proto --example hash_rate [CHUNK_KIB]`

use std::time::Instant;

fn main() {
    let chunk = std::env::args()
        .nth(1)
        .and_then(|a| a.parse::<usize>().ok())
        .unwrap_or(1024)
        << 10;
    // 256 MiB: far beyond the caches, as chunks on their way through are.
    let buf: Vec<u8> = (0..256usize << 20).map(|i| (i * 131 % 251) as u8).collect();
    let passes = 4;
    let start = Instant::now();
    let mut acc = 0u8; // keeps the hashes from being optimised away
    for _ in 0..passes {
        for c in buf.chunks(chunk) {
            acc = acc.wrapping_add(blake3::hash(c).as_bytes()[0]);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let gib = (passes * buf.len()) as f64 / (1u64 << 30) as f64;
    println!("{:.4}", secs / gib);
    eprintln!(
        "blake3, {} KiB chunks, one core: {:.2} GB/s (checksum {acc})",
        chunk >> 10,
        gib * 1.073741824 / secs
    );
}
