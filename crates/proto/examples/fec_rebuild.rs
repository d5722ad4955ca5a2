//! The cost of rebuilding a multicast block with symbols missing: the erasure library's
//! decoder against the receiver's [`fec::Rebuilder`], by how many are missing, 1404-byte
//! symbols (a sealed LAN datagram's). `cargo run --release -p bulkcast-proto --example
//! fec_rebuild`.

use bulkcast_proto::mcast::fec;
use std::time::Instant;
fn main() {
    let s = 1404usize;
    for (k, m) in [(256usize, 64usize), (64, 16)] {
        let src: Vec<u8> = (0..k * s).map(|j| (j * 7 + j / 13) as u8).collect();
        let refs: Vec<&[u8]> = src.chunks_exact(s).collect();
        let par = fec::encode(&refs, m, s).unwrap();
        let n = 200;
        let t = Instant::now();
        for _ in 0..n {
            fec::encode(&refs, m, s).unwrap();
        }
        println!(
            "k={k} m={m}: encode {:.3} ms",
            t.elapsed().as_secs_f64() / n as f64 * 1e3
        );
        let mut r = fec::Rebuilder::default();
        for e in [1usize, 2, 3, 6, 12, 20, 24, 25, 40] {
            if e > m {
                continue;
            }
            let mut present = vec![true; k];
            for t in 0..e {
                present[(t * 37) % k] = false;
            }
            let p: Vec<(usize, &[u8])> = (0..e).map(|j| (j, par[j].as_slice())).collect();
            let have: Vec<(usize, &[u8])> = (0..k)
                .filter(|&i| present[i])
                .map(|i| (i, refs[i]))
                .collect();
            let t = Instant::now();
            for _ in 0..n {
                library_decode(k, m, s, &have, &p);
            }
            let lib = t.elapsed().as_secs_f64() / n as f64;
            let mut b = src.clone();
            let t = Instant::now();
            for _ in 0..n {
                r.rebuild(&mut b, s, &present, m, &p).unwrap();
            }
            let new = t.elapsed().as_secs_f64() / n as f64;
            assert!(b == src);
            println!(
                "  e={e:2}: library decode {:.3} ms, rebuilder {:.3} ms",
                lib * 1e3,
                new * 1e3
            );
        }
    }
}

/// The erasure library's decoder, as receivers used it before the rebuilder.
fn library_decode(k: usize, m: usize, s: usize, have: &[(usize, &[u8])], par: &[(usize, &[u8])]) {
    let mut dec = reed_solomon_simd::ReedSolomonDecoder::new(k, m, s).unwrap();
    for (i, x) in have {
        dec.add_original_shard(*i, x).unwrap();
    }
    for (j, x) in par {
        dec.add_recovery_shard(*j, x).unwrap();
    }
    assert_eq!(
        dec.decode().unwrap().restored_original_iter().count(),
        k - have.len()
    );
}
