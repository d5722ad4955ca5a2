//! One pipe transfer on a lab and what it tells: the commands from templates, why a run does
//! not count, the report as JSON, carried rates, and the channels of a channel scenario.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use bulkcast_lab::streams::{bottlenecks, routes, run_stream, StreamOutcome, StreamSpec};
use bulkcast_lab::Lab;
use serde_json::{json, Value};

use crate::Ctx;

pub fn render(t: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut s = t.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The last JSON object in `s` (a report printed on one line or pretty-printed, possibly after
/// other output).
pub fn last_json(s: &str) -> Option<Value> {
    let mut found = None;
    let mut pos = 0;
    while let Some(i) = s[pos..].find('{') {
        let start = pos + i;
        let mut it = serde_json::Deserializer::from_str(&s[start..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) if v.is_object() => {
                found = Some(v);
                pos = start + it.byte_offset();
            }
            _ => pos = start + 1,
        }
    }
    found
}

/// Mean of the present values.
pub fn mean(v: &[Option<f64>]) -> Option<f64> {
    let x: Vec<f64> = v.iter().flatten().copied().collect();
    (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_the_report() {
        let pretty = "progress\n{\n  \"bytes\": 5,\n  \"conns\": [\n    {\"conn\": 0}\n  ]\n}\n";
        assert_eq!(super::last_json(pretty).unwrap()["bytes"], 5);
        let lines = "{\"a\": 1}\nnoise {\n{\"a\": 2}";
        assert_eq!(super::last_json(lines).unwrap()["a"], 2);
        assert!(super::last_json("none").is_none());
    }
}

/// One pipe transfer over `addrs` (the receiver listens on all of them; connection i goes to
/// address i mod P).
pub struct PipeRun<'a> {
    pub lab: &'a Lab,
    pub receiver: &'a str,
    pub addrs: &'a [Ipv4Addr],
    pub opts: String,
    pub bytes: Option<u64>,
    pub max_s: Option<f64>,
    pub timeout: Duration,
    pub restart_clock: bool,
    pub watch: Vec<usize>,
    pub tag: String,
}

pub fn run_pipe(
    ctx: &mut Ctx,
    r: PipeRun,
) -> Result<(StreamOutcome, PathBuf), Box<dyn std::error::Error>> {
    let port = ctx.port();
    let (recv_t, send_t) = ctx.templates();
    let logs = ctx.out.join("logs");
    let stats_file = logs.join(format!("{}.stats.jsonl", r.tag));
    let _ = std::fs::remove_file(&stats_file);
    let mut vars = BTreeMap::new();
    vars.insert("bulkcast", ctx.args.bulkcast.display().to_string());
    vars.insert("port", port.to_string());
    vars.insert(
        "listen_args",
        r.addrs
            .iter()
            .map(|a| format!("--listen {a}:{port}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    vars.insert("addr0", format!("{}:{port}", r.addrs[0]));
    vars.insert("addr0_ip", r.addrs[0].to_string());
    vars.insert(
        "path_args",
        r.addrs[1..]
            .iter()
            .map(|a| format!("--path {a}:{port}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    vars.insert("opts", r.opts.clone());
    vars.insert("stats_file", stats_file.display().to_string());
    vars.insert("stats_ms", ctx.args.stats_ms.to_string());
    let sender = r.lab.source().to_string();
    let spec = StreamSpec {
        sender,
        receiver: r.receiver.to_string(),
        recv_cmd: render(&recv_t, &vars),
        send_cmd: render(&send_t, &vars),
        feed_bytes: r.bytes,
        feed_max_s: r.max_s,
        sink: true,
        seed: 42,
        port,
        timeout: r.timeout,
        restart_clock: r.restart_clock,
        watch_links: r.watch,
        log_prefix: logs.join(&r.tag),
    };
    eprintln!("streams-bench: {}: {}", r.tag, spec.send_cmd);
    let o = run_stream(r.lab, &spec)?;
    Ok((o, stats_file))
}

/// Why a pipe run does not count, if it does not.
pub fn pipe_problem(o: &StreamOutcome, expect: Option<u64>) -> Option<String> {
    let s = o.sink.as_ref()?;
    if o.timed_out {
        return Some(format!("timed out after {} bytes", s.bytes));
    }
    if !s.verified {
        return Some("received bytes differ from the sent stream".into());
    }
    if let Some(e) = expect {
        if s.bytes != e {
            return Some(format!("received {} of {} bytes", s.bytes, e));
        }
    } else if s.bytes != o.fed_bytes {
        return Some(format!("received {} of {} bytes", s.bytes, o.fed_bytes));
    }
    if o.send_code != Some(0) {
        return Some(format!(
            "sender exited {:?}: {}",
            o.send_code,
            o.send_stderr.lines().last().unwrap_or("")
        ));
    }
    if o.recv_code != Some(0) {
        return Some(format!(
            "receiver exited {:?}: {}",
            o.recv_code,
            o.recv_stderr.lines().last().unwrap_or("")
        ));
    }
    None
}

pub fn conditions(o: &StreamOutcome) -> String {
    let mut n = Vec::new();
    if o.tx_dropped > 0 {
        n.push(format!("INVALID: {} TUN drops", o.tx_dropped));
    }
    if o.late_events > 0 {
        n.push(format!("{} late fwd events", o.late_events));
    }
    if o.build_running {
        n.push("build running".into());
    }
    n.join(", ")
}

pub fn outcome_json(o: &StreamOutcome) -> Value {
    json!({
        "send_code": o.send_code, "recv_code": o.recv_code, "send_s": o.send_s,
        "recv_s": o.recv_s, "timed_out": o.timed_out, "fed_bytes": o.fed_bytes,
        "fed_s": o.fed_s,
        "received_bytes": o.sink.as_ref().map(|s| s.bytes),
        "first_byte_s": o.sink.as_ref().and_then(|s| s.first_s),
        "last_byte_s": o.sink.as_ref().and_then(|s| s.last_s),
        "verified": o.sink.as_ref().map(|s| s.verified),
        "e2e_mbps": o.e2e_mbps(),
        "tx_dropped": o.tx_dropped, "late_events": o.late_events,
        "forwarder_cpu": o.forwarder_cpu, "build_running": o.build_running, "load1": o.load1,
        "send_stderr": o.send_stderr, "recv_stderr": o.recv_stderr,
        "sender_report": last_json(&o.send_stdout),
    })
}

/// Per-link mean carried IP rate (Mbit/s) over the whole run.
pub fn carried_mean(o: &StreamOutcome) -> Vec<f64> {
    match (o.links.first(), o.links.last()) {
        (Some(a), Some(b)) if b.t_s > a.t_s => a
            .bytes_out
            .iter()
            .zip(&b.bytes_out)
            .map(|(x, y)| (y - x) as f64 * 8.0 / (b.t_s - a.t_s) / 1e6)
            .collect(),
        _ => Vec::new(),
    }
}

/// The receiver of a channel scenario, its channel addresses, the routes to them and their
/// bottleneck links.
pub struct Channels {
    pub receiver: String,
    pub addrs: Vec<Ipv4Addr>,
    pub routes: Vec<Vec<usize>>,
    pub watch: Vec<usize>,
}

pub fn channel_setup(lab: &Lab) -> Result<Channels, Box<dyn std::error::Error>> {
    let src = lab.source().to_string();
    let receiver = lab
        .host_names()
        .into_iter()
        .find(|h| *h != src)
        .ok_or("the scenario has no receiver")?;
    let addrs: Vec<Ipv4Addr> = lab
        .channel_addrs(&receiver)?
        .into_iter()
        .map(|(own, _)| own)
        .collect();
    if addrs.is_empty() {
        return Err(format!("{} has no channels", lab.name()).into());
    }
    let routes = routes(lab.layout(), &src, &addrs)?;
    let watch = bottlenecks(lab.layout(), &routes);
    Ok(Channels {
        receiver,
        addrs,
        routes,
        watch,
    })
}
