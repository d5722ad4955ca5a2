//! bulkcast inside another program: three agents and a send in one tokio runtime, on
//! loopback. The file (argument 1, else a generated 8 MiB one) goes where `bulkcast send FILE
//! --to A,B,C` sends it, with no CLI code: `auto` chooses the strategy (here the planned tree:
//! one site), the round trips are probed (or reused from the probe cache), receivers that fail
//! get one retry; the decisions print as `bulkcast send` prints them, and the report as
//! `bulkcast send --json` prints it.
//!
//! ```sh
//! cargo run -p bulkcast-runtime --example embed -- [FILE]
//! ```

use std::time::Duration;

use bulkcast_proto::auth::Secret;
use bulkcast_runtime::api::{Event, Object};
use bulkcast_runtime::measure::ProbeCache;
use bulkcast_runtime::{Agent, Send, Strategy};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = Secret::from_bytes(rand::random());
    let scratch = std::env::temp_dir().join(format!("bulkcast-embed-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let file = match std::env::args_os().nth(1) {
        Some(f) => f.into(),
        None => {
            let f = scratch.join("data.bin");
            std::fs::write(
                &f,
                (0..8u32 << 20).map(|i| (i * 7) as u8).collect::<Vec<_>>(),
            )?;
            f
        }
    };

    // The agents run until `stop` is sent.
    let (stop, stopped) = tokio::sync::watch::channel(());
    let mut to = Vec::new();
    for i in 0..3 {
        let agent = Agent::new(scratch.join(format!("agent{i}")), &secret)
            .listen("127.0.0.1:0")
            .bind()
            .await?;
        to.push(agent.local_addrs()[0].to_string());
        let mut stopped = stopped.clone();
        tokio::spawn(agent.run(async move {
            let _ = stopped.changed().await;
        }));
    }

    let mut send = Send::to_hosts(&to.join(","))?
        .secret(&secret)
        .object(Object::new(&file))
        .strategy(Strategy::Auto { fanout: None })
        .retry(1)
        .on_event(|e: &Event| {
            if let Some(note) = e.note() {
                eprintln!("{note}");
            }
        });
    if let Some(cache) = ProbeCache::in_user_cache(Duration::from_secs(600)) {
        send = send.probe_cache(cache);
    }
    let report = send
        .on_progress(Duration::from_millis(200), |st| {
            let done = st.receivers.iter().filter(|r| r.done.is_some()).count();
            eprintln!("{done}/{} receivers done", st.receivers.len());
        })
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let _ = stop.send(());
    std::fs::remove_dir_all(&scratch)?;
    Ok(())
}
