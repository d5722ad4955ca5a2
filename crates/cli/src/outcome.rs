//! What a finished send prints and returns: the headline, the report (text or JSON) and the
//! exit code. Used by `bulkcast send` and `bulkcast demo`.

use anyhow::Result;
use bulkcast_runtime::report::Report;

use crate::progress;

/// 0 when every receiver has all of the object, 1 when some receiver failed, 3 when every
/// receiver has what was sent but the directory had entries that were left out: a script
/// that needs every entry must not take that for a full copy.
pub fn exit_code(r: &Report) -> i32 {
    match (r.ok, r.object.skipped.is_empty()) {
        (false, _) => 1,
        (true, false) => 3,
        (true, true) => 0,
    }
}

pub fn print_report(r: &Report, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    }
    eprintln!("{}", headline(r));
    let failed: Vec<_> = r.receivers.iter().filter(|x| !x.verified).collect();
    if !json {
        for c in &r.clusters {
            eprintln!(
                "  site {:<18} {:>2} receivers{}: {:>12} WAN bytes in ({:.2} copies)",
                c.site,
                c.receivers,
                if c.has_source { " + source" } else { "" },
                c.wan_bytes_in,
                c.copies
            );
        }
    }
    if !failed.is_empty() || !json {
        eprintln!(
            "  {:<24} {:<16} {:>12} {:>8} {:>10}  status",
            "receiver", "parent", "bytes", "seconds", "Mbit/s"
        );
        for x in &r.receivers {
            eprintln!(
                "  {:<24} {:<16} {:>12} {:>8.2} {:>10.1}  {}",
                x.name,
                x.parent,
                x.bytes,
                x.seconds,
                x.rate_mbps,
                if x.verified {
                    "verified".to_string()
                } else {
                    format!("FAILED: {}", x.error.as_deref().unwrap_or("?"))
                }
            );
        }
    }
    for x in &r.rejected {
        eprintln!(
            "  {} sent {} chunk(s) that failed verification at {} (tampered with there, or \
             corrupted on the link): rejected and fetched again",
            x.from, x.chunks, x.by
        );
    }
    for x in &r.object.skipped {
        eprintln!("  not sent: {}: {}", x.path, x.reason);
    }
    if !r.object.skipped.is_empty() {
        eprintln!(
            "{} entries of the directory were left out (listed above); the rest arrived",
            r.object.skipped.len()
        );
    }
    if !failed.is_empty() {
        eprintln!(
            "{} of {} receivers did not get a verified copy",
            failed.len(),
            r.receivers.len()
        );
    }
    Ok(())
}

/// The report's first line. The per-receiver rate is the slowest of the receivers that got
/// a verified copy: a failed receiver's rate says nothing about how fast the data moved, and
/// it is counted on its own.
pub fn headline(r: &Report) -> String {
    let verified: Vec<_> = r.receivers.iter().filter(|x| x.verified).collect();
    let per_receiver = match verified.iter().map(|x| x.rate_mbps).min_by(f64::total_cmp) {
        Some(slowest) if verified.len() == r.receivers.len() => {
            format!("{slowest:.1} Mbit/s per receiver (slowest)")
        }
        Some(slowest) => format!(
            "{slowest:.1} Mbit/s per receiver (slowest of the {} verified; {} failed)",
            verified.len(),
            r.receivers.len() - verified.len()
        ),
        None => "no receiver got a verified copy".to_string(),
    };
    format!(
        "{} {} ({}) to {} receiver{} by {} in {:.2} s: {per_receiver}, {:.1} Mbit/s aggregate",
        r.object.kind,
        r.object.name,
        progress::human_bytes(r.object.bytes),
        r.receivers.len(),
        if r.receivers.len() == 1 { "" } else { "s" },
        r.strategy,
        r.seconds,
        r.aggregate_mbps
    )
}
