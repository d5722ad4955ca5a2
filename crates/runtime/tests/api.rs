//! The library API as a Rust program uses it: agents and sends in one runtime on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bulkcast_proto::auth::Secret;
use bulkcast_runtime::api::Error;
use bulkcast_runtime::{Agent, Send, Strategy};

/// A scratch directory, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("bulkcast-api-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` agents serving until the returned sender is dropped: their addresses and sessions.
async fn agents(
    s: &Scratch,
    n: usize,
    secret: &Secret,
) -> (
    Vec<String>,
    Vec<bulkcast_runtime::live::Sessions>,
    tokio::sync::watch::Sender<()>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(());
    let (mut addrs, mut sessions) = (Vec::new(), Vec::new());
    for i in 0..n {
        let a = Agent::new(s.0.join(format!("rx{i}")), secret)
            .listen("127.0.0.1:0")
            .bind()
            .await
            .unwrap();
        addrs.push(a.local_addrs()[0].to_string());
        sessions.push(a.sessions());
        let mut stopped = stopped.clone();
        tokio::spawn(a.run(async move {
            let _ = stopped.changed().await;
        }));
    }
    (addrs, sessions, stop)
}

fn data(s: &Scratch, len: usize) -> std::path::PathBuf {
    let p = s.0.join("data.bin");
    std::fs::write(
        &p,
        (0..len).map(|i| (i * 13 % 251) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_and_a_mob_swarm_deliver_verified_copies_and_report_progress() {
    let s = Scratch::new("strategies");
    let secret = Secret::from_bytes([3; 32]);
    let (to, sessions, _stop) = agents(&s, 3, &secret).await;
    let file = data(&s, (5 << 20) + 17);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let report = Send::to_list(&to.join(","))
        .unwrap()
        .secret(&secret)
        .file(&file)
        .strategy(Strategy::Tree { fanout: 1 })
        .chunk_size(256 << 10)
        .on_progress(Duration::from_millis(20), move |st| {
            assert_eq!(st.receivers.len(), 3);
            c.fetch_add(1, Ordering::Relaxed);
        })
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(report.strategy, "tree (fan-out 1)");
    assert!(calls.load(Ordering::Relaxed) > 0);
    let want = std::fs::read(&file).unwrap();
    for i in 0..3 {
        assert!(std::fs::read(s.0.join(format!("rx{i}/data.bin"))).unwrap() == want);
    }
    // Every agent saw its session end done. The source's report may come first: a receiver
    // says it is done as soon as its copy is in place, and its session ends after that, when
    // its connections close.
    for live in &sessions {
        let start = std::time::Instant::now();
        let v = loop {
            let v = live.views();
            if v.iter().all(|x| x.state != "running") || start.elapsed() > Duration::from_secs(10) {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].state, "done", "{v:?}");
    }

    // The same hosts by MOB, under another name.
    let report = Send::to_list(&to.join(","))
        .unwrap()
        .secret(&secret)
        .file_named(&file, "again.bin")
        .strategy(Strategy::Mob)
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(report.ok, "{report:?}");
    for i in 0..3 {
        assert!(std::fs::read(s.0.join(format!("rx{i}/again.bin"))).unwrap() == want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_send_names_the_host_that_is_not_there_and_bad_builds_are_refused() {
    let s = Scratch::new("planned");
    let secret = Secret::from_bytes([4; 32]);
    let (mut to, _, _stop) = agents(&s, 2, &secret).await;
    // A port nobody listens on.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_addr = gone.local_addr().unwrap().to_string();
    drop(gone);
    to.insert(1, gone_addr.clone());
    let file = data(&s, 1 << 20);
    let report = Send::to_list(&to.join(","))
        .unwrap()
        .secret(&secret)
        .file(&file)
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(!report.ok);
    assert_eq!(report.receivers.len(), 3);
    let r = &report.receivers[1];
    assert_eq!(r.addr, gone_addr);
    assert!(!r.verified && r.error.is_some(), "{r:?}");
    assert!(report.receivers[0].verified && report.receivers[2].verified);
    assert!(
        report.strategy.starts_with("tree (planned"),
        "{}",
        report.strategy
    );

    // No secret; no input; a shutdown first.
    let e = Send::to_list(&to[0])
        .unwrap()
        .file(&file)
        .run(std::future::pending())
        .await;
    assert!(matches!(e, Err(Error::NoKeys)), "{e:?}");
    let e = Send::to_list(&to[0])
        .unwrap()
        .secret(&secret)
        .run(std::future::pending())
        .await;
    assert!(matches!(e, Err(Error::NoInput)), "{e:?}");
    let e = Send::to_list(&to[0])
        .unwrap()
        .secret(&secret)
        .file(&file)
        .run(async {})
        .await;
    assert!(matches!(e, Err(Error::Interrupted)), "{e:?}");
}

/// What `bulkcast send FILE --to HOSTS` does, with no CLI code: `auto` chooses the strategy
/// from the hosts' sites and the size, the plan is probed (then taken from the probe cache),
/// the report carries its timeline and probe, metrics follow the send, and the events say
/// what was decided, in the words `bulkcast send` prints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_plans_probes_caches_and_says_what_it_decided_as_the_cli_does() {
    use bulkcast_runtime::api::{Event, Object};
    use bulkcast_runtime::measure::ProbeCache;
    let s = Scratch::new("auto");
    let secret = Secret::from_bytes([5; 32]);
    let (to, _, _stop) = agents(&s, 3, &secret).await;
    let file = data(&s, (3 << 20) + 5);
    let events = Arc::new(std::sync::Mutex::new(Vec::<Event>::new()));
    let mut reg = prometheus_client::registry::Registry::default();
    let metrics = bulkcast_runtime::metrics::SourceMetrics::new(&mut reg);
    let cache = || ProbeCache {
        dir: s.0.join("probes"),
        max_age: Duration::from_secs(600),
    };
    let send = |to: &str| {
        let ev = events.clone();
        Send::to_hosts(to)
            .unwrap()
            .secret(&secret)
            .object(Object::new(&file).named(Some("auto.bin")))
            .strategy(Strategy::Auto { fanout: None })
            .probe_cache(cache())
            .retry(1)
            .metrics(metrics.clone())
            .on_event(move |e| ev.lock().unwrap().push(e.clone()))
    };
    // One site (none given): the planned tree.
    let report = send(&to.join(","))
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(report.ok, "{report:?}");
    assert!(
        report.strategy.starts_with("tree (planned"),
        "{}",
        report.strategy
    );
    assert!(!report.timeline.is_empty());
    assert_eq!(report.timeline.bytes.len(), 3);
    let probe = report.probe.as_ref().expect("probed");
    assert!(
        !probe.cached && probe.note.contains("probed all 6 pairs of 4 nodes"),
        "{probe:?}"
    );
    let notes: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(Event::note)
        .collect();
    assert_eq!(
        notes[0], "strategy auto: tree (no sites given, 3 MiB)",
        "{notes:?}"
    );
    assert!(notes[1].contains("\nplan: "), "{notes:?}");
    let started = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, Event::Started { .. }))
        .count();
    assert_eq!(started, 1);
    assert!(matches!(events.lock().unwrap().last(), Some(Event::Ended)));
    let text = bulkcast_runtime::metrics::encode(&reg);
    assert!(text.contains("receivers{state=\"done\"} 3"), "{text}");
    let want = std::fs::read(&file).unwrap();
    for i in 0..3 {
        assert!(std::fs::read(s.0.join(format!("rx{i}/auto.bin"))).unwrap() == want);
    }

    // Again: the round trips probed just now are reused.
    let report = send(&to.join(","))
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(
        report.ok && report.probe.as_ref().is_some_and(|p| p.cached),
        "{report:?}"
    );

    // The same hosts in two sites (a hosts file): a swarm over the planned tree.
    events.lock().unwrap().clear();
    let hosts = s.0.join("hosts.toml");
    let mut toml = String::new();
    for (i, a) in to.iter().enumerate() {
        let site = if i == 0 { "east" } else { "west" };
        toml += &format!("[[host]]\nname = \"h{i}\"\naddr = \"{a}\"\nsite = \"{site}\"\n");
    }
    std::fs::write(&hosts, toml).unwrap();
    let report = send(hosts.to_str().unwrap())
        .run(std::future::pending())
        .await
        .unwrap();
    assert!(report.ok, "{report:?}");
    assert_eq!(report.strategy, "hybrid");
    assert!(report.probe.is_some(), "{report:?}");
    let notes: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(Event::note)
        .collect();
    assert_eq!(
        notes[0], "strategy auto: hybrid (2 sites, 3 MiB)",
        "{notes:?}"
    );

    // Ticket receivers cannot swarm; a chunk size out of range is refused.
    let e = send(&to.join(","))
        .strategy(Strategy::Mob)
        .ticket_receivers(true)
        .run(std::future::pending())
        .await;
    assert!(matches!(e, Err(Error::Joined("mob"))), "{e:?}");
    let e = send(&to.join(","))
        .chunk_size(7)
        .run(std::future::pending())
        .await;
    assert!(matches!(e, Err(Error::ChunkSize(7))), "{e:?}");
}
