//! Dead relays on the simulated network: the parent of a relay that dies adopts its children,
//! which resume from what they hold; only the dead host fails.

use std::time::Duration;

use bulkcast_proto::sim::{LinkSpec, Sim, SimReport, SimSpec};
use bulkcast_proto::tree::Tree;

const MIB: u64 = 1 << 20;

/// Every node but `dead` ends with a byte-exact copy and no failure; each of `dead` is reported
/// failed; no node held more than its hard memory cap.
fn assert_only_dead_failed(r: &SimReport, dead: &[usize], budget: usize) {
    assert!(r.finished, "source did not finish: {:#?}", r.nodes);
    let mut incomplete = r.incomplete();
    incomplete.retain(|i| !dead.contains(i));
    assert_eq!(incomplete, Vec::<usize>::new(), "{:#?}", r.nodes);
    for (i, n) in r.nodes.iter().enumerate().skip(1) {
        if dead.contains(&i) {
            assert!(n.failed.is_some(), "dead node {i} not reported failed");
        } else {
            assert_eq!(n.failed, None, "node {i} reported failed");
        }
        assert!(
            n.peak_buffered <= budget + budget / 2,
            "node {i} held {} bytes, budget {budget}",
            n.peak_buffered
        );
    }
}

/// No node fed more children at once than `fanout` (adoption re-plans, it does not pile up).
fn assert_fanout(r: &SimReport, fanout: usize) {
    for (i, n) in r.nodes.iter().enumerate() {
        assert!(
            n.max_children <= fanout,
            "node {i} fed {} children at once, fan-out {fanout}",
            n.max_children
        );
    }
}

fn spec(tree: Tree, len: u64) -> SimSpec {
    let mut s = SimSpec::new(tree, LinkSpec::wan(2, 200.0), len);
    s.stall_timeout = Duration::from_secs(5);
    s
}

#[test]
fn a_relay_dying_mid_transfer_in_a_tree_of_30_takes_only_itself_down() {
    let len = 8 * MIB + 333;
    // 8 MiB at 200 Mbit/s: about 0.35 s a hop; node 2 dies at about a third, node 5 near the
    // end.
    for (dead, at) in [(2, 120), (5, 300), (1, 20)] {
        let mut s = spec(Tree::kary(30, 2), len);
        s.kills = vec![(dead, Duration::from_millis(at))];
        let budget = s.node.buffer_budget;
        let r = Sim::new(s).run();
        assert_only_dead_failed(&r, &[dead], budget);
        assert_fanout(&r, 2);
        // The dead relay's children resumed: their links did not carry the object twice.
        for c in Tree::kary(30, 2).children(dead) {
            assert!(
                r.link_bytes[c] <= len + len / 10,
                "link into {c} carried {} bytes",
                r.link_bytes[c]
            );
        }
    }
}

#[test]
fn two_relays_on_one_path_dying_take_only_themselves_down() {
    let len = 8 * MIB;
    let tree = Tree::kary(30, 2);
    // Path 0-1-3-7-15: 3 dies, then 1; then the other order; then both at once.
    for kills in [
        vec![(3, 80), (1, 200)],
        vec![(1, 80), (3, 200)],
        vec![(1, 100), (3, 100)],
        vec![(3, 60), (7, 150)],
    ] {
        let mut s = spec(tree.clone(), len);
        s.kills = kills
            .iter()
            .map(|&(n, t)| (n, Duration::from_millis(t)))
            .collect();
        let budget = s.node.buffer_budget;
        let r = Sim::new(s).run();
        let dead: Vec<usize> = kills.iter().map(|k| k.0).collect();
        assert_only_dead_failed(&r, &dead, budget);
        assert_fanout(&r, 2);
    }
}

#[test]
fn a_relay_dying_in_a_chain_leaves_the_rest_complete() {
    let len = 6 * MIB;
    for dead in [1, 3] {
        let mut s = spec(Tree::kary(6, 1), len);
        s.kills = vec![(dead, Duration::from_millis(150))];
        let budget = s.node.buffer_budget;
        let r = Sim::new(s).run();
        assert_only_dead_failed(&r, &[dead], budget);
        assert_fanout(&r, 1);
    }
}

#[test]
fn the_orphans_of_a_dead_relay_in_a_fan_out_2_tree_are_spread_not_piled_on_the_adopter() {
    // bench/faults' relay-30-fanout2 row: 16 receivers, fan-out 2, node 2 (a child of the
    // source) dies at about 30%. Its children 5 and 6 and their four children all finish, and
    // the source still feeds two children, so its uplink is shared as before.
    let len = 8 * MIB;
    let tree = Tree::kary(16, 2);
    let mut s = spec(tree.clone(), len);
    s.kills = vec![(2, Duration::from_millis(110))];
    let budget = s.node.buffer_budget;
    let r = Sim::new(s).run();
    assert_only_dead_failed(&r, &[2], budget);
    assert_fanout(&r, 2);
    assert_eq!(r.nodes[0].max_children, 2);
    // The orphans resumed: no link into them carried much more than the object once.
    for c in tree.subtree(2).into_iter().filter(|&c| c != 2) {
        assert!(
            r.link_bytes[c] <= len + len / 10,
            "link into {c}: {}",
            r.link_bytes[c]
        );
    }
    // It really died mid-transfer: its children held part of the object then.
    assert!(r.nodes[5].acked_at(Duration::from_millis(100)) > 0);
}

#[test]
fn a_stream_cannot_be_read_again_so_orphans_needing_old_chunks_fail_clearly() {
    // A stream's source keeps only its buffer: the dead relay's children, adopted by it, need
    // chunks it dropped long ago, and fail saying so instead of hanging.
    let mut s = spec(Tree::kary(4, 1), 8 * MIB);
    s.stream = true;
    s.kills = vec![(1, Duration::from_millis(250))];
    let r = Sim::new(s).run();
    assert!(r.finished, "{:#?}", r.nodes);
    assert!(r.nodes[1].failed.is_some());
    let why = r.nodes[2].failed.as_deref().unwrap_or_default();
    assert!(why.contains("cannot read again"), "node 2: {why:?}");
}

#[test]
fn a_child_checking_its_copy_is_not_cut_while_it_says_so() {
    use bulkcast_proto::auth::{Keys, Secret};
    use bulkcast_proto::manifest::{Manifest, ObjectKind};
    use bulkcast_proto::node::{Event, Link, Named, Node, NodeConfig, SessionParams};
    use bulkcast_proto::wire::Frame;
    use std::time::Instant;
    let t0 = Instant::now();
    let params = SessionParams {
        session: 9,
        chunk_size: 65536,
        stall_timeout: Duration::from_secs(5),
        cc: String::new(),
        stripe: None,
        edges: Default::default(),
        manifest: Manifest {
            name: "x".into(),
            kind: ObjectKind::File,
            total_len: Some(1 << 20),
            entries: vec![],
            mode: 0,
            mtime: None,
        },
    };
    let names: Vec<Named> = (1..=2)
        .map(|i| Named {
            name: format!("h{i}"),
            addr: format!("a:{i}"),
            uplink_kbps: 0,
        })
        .collect();
    let keys = Keys::derive(&Secret::from_bytes([3; 32]));
    let mut s = Node::source(
        params,
        keys,
        NodeConfig::default(),
        &Tree::flat(2),
        &names,
        t0,
    )
    .unwrap();
    // Child 0 says it is still busy every 4 s; child 1 says nothing.
    for t in [4, 8, 12] {
        let now = t0 + Duration::from_secs(t);
        s.handle_frame(Link::Child(0), Frame::Idle, now).unwrap();
        s.handle_timeout(now);
    }
    let mut cut = Vec::new();
    while let Some(ev) = s.poll_event() {
        if let Event::NodeFailed { node, reason } = ev {
            cut.push((node, reason));
        }
    }
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert_eq!(cut[0].0, 2);
    assert!(
        cut[0].1.contains("did not answer the session set-up"),
        "{cut:?}"
    );
}

/// bench/faults' sigstop row on the simulated clock: a chain of 16 on 100 Mbit/s links, a
/// buffer budget larger than the object (so no buffer ever fills and the lag rule never
/// fires), node 8 stopped (SIGSTOP) at about 30% for 10 s.
fn sigstop_spec() -> SimSpec {
    let len = 8 * MIB;
    let mut s = SimSpec::new(Tree::kary(16, 1), LinkSpec::wan(1, 100.0), len);
    s.node.buffer_budget = 2 * len as usize;
    s.stall_timeout = Duration::from_secs(30);
    s
}

#[test]
fn a_stopped_relay_is_let_go_within_the_silent_timeout_and_the_rest_finish_at_full_rate() {
    let base = Sim::new(sigstop_spec()).run();
    assert!(base.incomplete().is_empty(), "{:#?}", base.nodes);
    let last = |r: &SimReport| {
        (1..r.nodes.len())
            .filter(|&i| i != 8)
            .map(|i| r.nodes[i].done_at.expect("done"))
            .max()
            .unwrap()
    };
    let t_base = last(&base);
    let mut s = sigstop_spec();
    let at = t_base * 3 / 10;
    s.stalls = vec![(8, at)];
    s.unstalls = vec![(8, at + Duration::from_secs(10))];
    let silent = s.node.silent_timeout;
    let budget = s.node.buffer_budget;
    let r = Sim::new(s).run();
    assert!(r.finished);
    let why = r.nodes[8].failed.as_deref().unwrap_or_default();
    assert!(
        why.starts_with("fell behind") && why.contains("sent nothing"),
        "node 8: {why:?}"
    );
    let mut incomplete = r.incomplete();
    incomplete.retain(|&i| i != 8);
    assert_eq!(incomplete, Vec::<usize>::new(), "{:#?}", r.nodes);
    for (i, n) in r.nodes.iter().enumerate() {
        assert!(n.peak_buffered <= budget + budget / 2, "node {i}");
        if i != 8 {
            assert_eq!(n.failed, None, "node {i}");
        }
    }
    // Nodes 1-7 never waited; 9-16 lost the silent timeout and a re-open, not the 10 s stop
    // or the 30 s stall timeout.
    let t = last(&r);
    assert!(
        t <= t_base + silent + Duration::from_millis(300),
        "others finished at {t:?}, {t_base:?} without the stop"
    );
    for i in 1..8 {
        assert!(
            r.nodes[i].done_at.unwrap() <= t_base + Duration::from_millis(50),
            "node {i}"
        );
    }
    // The adopted chain is still a chain.
    assert_fanout(&r, 1);
}

/// A chain of 6 on 100 Mbit/s links with `one_way_ms` of latency each; relay 2 stops for
/// `stop` at about 30% of the transfer. Returns who was let go.
fn stop_relay_on_path(one_way_ms: u64, stop: Duration) -> Vec<(usize, String)> {
    let len = 16 * MIB;
    let mut s = SimSpec::new(Tree::kary(6, 1), LinkSpec::wan(one_way_ms, 100.0), len);
    s.node.buffer_budget = 2 * len as usize;
    s.stall_timeout = Duration::from_secs(30);
    let at = Duration::from_millis(400 + 6 * one_way_ms);
    s.stalls = vec![(2, at)];
    s.unstalls = vec![(2, at + stop)];
    let r = Sim::new(s).run();
    assert!(r.finished);
    let failed: Vec<_> = (1..r.nodes.len())
        .filter_map(|i| r.nodes[i].failed.clone().map(|f| (i, f)))
        .collect();
    for i in 1..r.nodes.len() {
        if failed.iter().all(|f| f.0 != i) {
            assert!(r.nodes[i].data_ok, "node {i}: {:#?}", r.nodes[i]);
        }
    }
    failed
}

#[test]
fn the_silence_a_child_is_allowed_grows_with_its_round_trip() {
    let stop = Duration::from_millis(1800);
    // On a LAN 1.8 s of silence is a stopped process: node 2 is let go, its subtree adopted.
    let lan = stop_relay_on_path(1, stop);
    assert_eq!(lan.len(), 1, "{lan:?}");
    assert_eq!(lan[0].0, 2);
    assert!(lan[0].1.contains("sent nothing"), "{lan:?}");
    // At 200 ms the same gap is a retransmitted keepalive (`silent_period`: 1 s + 8 round
    // trips = 2.6 s): nobody is let go and everyone finishes.
    assert_eq!(stop_relay_on_path(100, stop), Vec::new());
    // A stop longer than the period is still caught there.
    let long = stop_relay_on_path(100, Duration::from_secs(5));
    assert_eq!(long.len(), 1, "{long:?}");
    assert_eq!(long[0].0, 2);
}

#[test]
fn a_node_stopped_itself_does_not_take_its_childrens_unread_keepalives_for_silence() {
    // The source stops for 3 s: when it runs again its timers are long past, and what its
    // relay child sent meanwhile is still unread. Nobody is let go.
    let mut s = sigstop_spec();
    s.tree = Tree::kary(4, 1);
    s.links.truncate(5);
    s.store_rate.truncate(5);
    s.stalls = vec![(0, Duration::from_millis(200))];
    s.unstalls = vec![(0, Duration::from_millis(3200))];
    let r = Sim::new(s).run();
    assert!(r.finished);
    assert!(r.incomplete().is_empty(), "{:#?}", r.nodes);
    for (i, n) in r.nodes.iter().enumerate().skip(1) {
        assert_eq!(n.failed, None, "node {i}");
    }
}

#[test]
fn a_relay_that_tampers_is_caught_at_the_next_hop_and_named_and_everyone_gets_the_object() {
    // Node 2 flips a byte in every 4th chunk it forwards (the first time): its children
    // reject each such chunk, fetch it again, and report who sent it.
    let len = 4 * MIB;
    let tree = Tree::kary(12, 3);
    let mut s = spec(tree.clone(), len);
    s.tamper = vec![(2, 4)];
    let budget = s.node.buffer_budget;
    let chunks = len / s.chunk_size as u64;
    let r = Sim::new(s).run();
    assert_only_dead_failed(&r, &[], budget);
    let kids = tree.children(2);
    assert!(!kids.is_empty());
    for &k in &kids {
        assert_eq!(r.nodes[k].corrupt_detected as u64, chunks / 4, "node {k}");
    }
    let mut by = r.nodes[2].rejected_by.clone();
    by.sort();
    by.dedup();
    assert_eq!(by, kids, "the culprit's children name it");
    for (i, n) in r.nodes.iter().enumerate() {
        if i != 2 {
            assert!(
                n.rejected_by.is_empty(),
                "node {i} named: {:?}",
                n.rejected_by
            );
        }
    }
    // Nobody below the first honest hop saw a bad chunk.
    for i in 1..r.nodes.len() {
        if !kids.contains(&i) {
            assert_eq!(r.nodes[i].corrupt_detected, 0, "node {i}");
        }
    }
}

#[test]
fn a_relay_that_corrupts_every_repair_is_cut_off_and_its_subtree_adopted() {
    // Node 2 flips a byte in every 4th chunk it forwards, and in every repair of it: its
    // children could fetch those chunks for ever. Its parent cuts it off after the 4th corrupt
    // copy of one chunk to one child, and its subtree is re-planned below healthy nodes.
    let len = 4 * MIB;
    let tree = Tree::kary(20, 2);
    let mut s = spec(tree.clone(), len);
    s.tamper = vec![(2, 4)];
    s.tamper_repairs = vec![2];
    let budget = s.node.buffer_budget;
    let r = Sim::new(s).run();
    assert_only_dead_failed(&r, &[2], budget);
    assert_fanout(&r, 2);
    let why = r.nodes[2].failed.as_deref().unwrap();
    assert!(
        why.contains("corrupt copies") && why.contains("cut off"),
        "{why}"
    );
    // Its children saw corrupt copies up to the cut, and few more (those already on the way).
    let seen: Vec<usize> = tree
        .children(2)
        .iter()
        .map(|&k| r.nodes[k].corrupt_detected)
        .collect();
    let cut = bulkcast_proto::node::CUT_AFTER_CORRUPT as usize;
    assert!(seen.iter().any(|&n| n >= cut), "{seen:?}");
    assert!(seen.iter().all(|&n| n <= 4 * cut), "{seen:?}");
    // The rest of the tree never saw one.
    for i in 1..r.nodes.len() {
        if !tree.children(2).contains(&i) {
            assert_eq!(r.nodes[i].corrupt_detected, 0, "node {i}");
        }
    }
}
