//! Probing real agents on loopback: every pair measured, a dead host reported, not waited on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::hosts::HostSpec;
use bulkcast_proto::node::NodeConfig;
use bulkcast_runtime::agent::{self, AgentConfig};
use bulkcast_runtime::probe;
use bulkcast_runtime::transport::{self, TcpTuning};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_of_three_agents_and_one_dead_host() {
    let keys = Keys::derive(&Secret::from_bytes([3; 32]));
    let tuning = TcpTuning::default();
    let mut hosts = Vec::new();
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    for _ in 0..3 {
        let l = transport::listen("127.0.0.1:0", &tuning).await.unwrap();
        hosts.push(HostSpec::from_addr(&l.local_addr().unwrap().to_string()));
        let cfg = Arc::new(AgentConfig {
            dir: std::env::temp_dir(),
            keys: keys.clone(),
            node: NodeConfig::default(),
            tuning: tuning.clone(),
            stored: None,
            groups: Default::default(),
            attachments: Default::default(),
            predialed: Default::default(),
            swarms: Default::default(),
            partials: Default::default(),
            running: Default::default(),
            live: Default::default(),
            stdout: false,
            io: Default::default(),
        });
        let mut stop = stop_tx.subscribe();
        tokio::spawn(agent::serve(
            vec![transport::Listener::Tcp(l)],
            cfg,
            false,
            async move {
                let _ = stop.recv().await;
            },
        ));
    }
    // A host nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    hosts.push(HostSpec::from_addr(&dead_addr));

    let t = Instant::now();
    let all: Vec<Vec<usize>> = (0..hosts.len())
        .map(|_| (0..hosts.len()).collect())
        .collect();
    let m = probe::matrix(&hosts, &all, &keys, &tuning, 5, Duration::from_secs(3)).await;
    assert!(t.elapsed() < Duration::from_secs(10));
    for i in 0..=3 {
        for j in 0..=3 {
            let v =
                m.rtt_ms[i][j].unwrap_or_else(|| panic!("{i}->{j} not measured: {:?}", m.errors));
            assert!((0.0..50.0).contains(&v), "{i}->{j}: {v} ms");
        }
    }
    // The dead host: its own row is missing and named in the errors; others cannot reach it.
    assert!(m.rtt_ms[4][1].is_none() && m.rtt_ms[0][4].is_none() && m.rtt_ms[1][4].is_none());
    assert_eq!(m.errors.len(), 1);
    assert_eq!(m.errors[0].0, 4);

    // An agent with another secret never answers a probe.
    let other = Keys::derive(&Secret::from_bytes([4; 32]));
    let m = probe::matrix(
        &hosts[..1],
        &[vec![0]],
        &other,
        &tuning,
        3,
        Duration::from_secs(2),
    )
    .await;
    assert!(m.rtt_ms[0][1].is_none());
    assert!(m.errors[0].1.contains("secret"), "{:?}", m.errors);
    let _ = stop_tx.send(());
}
