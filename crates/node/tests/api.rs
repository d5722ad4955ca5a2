//! The library API as a Rust program uses it: agents and sends in one runtime on loopback.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bulkcast_node::api::Error;
use bulkcast_node::{Agent, Send, Strategy};
use bulkcast_proto::auth::Secret;

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
    Vec<bulkcast_node::live::Sessions>,
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
