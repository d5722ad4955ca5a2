//! The push relay on the simulated network: delivery, pipelining, flow control, the
//! slow-receiver policy, repair and local failures.

use std::time::Duration;

use bulkcast_proto::sim::{LinkSpec, Sim, SimSpec};
use bulkcast_proto::tree::Tree;
use rand::{Rng, SeedableRng};

const MIB: u64 = 1 << 20;

fn assert_all_complete(r: &bulkcast_proto::sim::SimReport) {
    assert!(r.finished, "source did not finish: {:#?}", r.nodes);
    assert_eq!(r.incomplete(), Vec::<usize>::new(), "{:#?}", r.nodes);
    for (i, n) in r.nodes.iter().enumerate() {
        assert_eq!(n.out_of_order, 0, "node {i} delivered out of order");
    }
}

#[test]
fn tree_of_30_on_mixed_links_delivers_every_byte_in_order_with_bounded_buffers() {
    let tree = Tree::kary(30, 3);
    let mut spec = SimSpec::new(tree, LinkSpec::LAN, 8 * MIB + 12345);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(30);
    for l in spec.links.iter_mut().skip(1) {
        *l = LinkSpec::wan(rng.gen_range(1..100), rng.gen_range(10.0..1000.0));
    }
    let budget = spec.node.buffer_budget;
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    for (i, n) in r.nodes.iter().enumerate() {
        assert!(
            n.peak_buffered <= budget,
            "node {i} held {} bytes, budget {budget}",
            n.peak_buffered
        );
        if i > 0 {
            assert_eq!(n.stored, 8 * MIB + 12345, "node {i}");
        }
    }
    // Every link carried the object exactly once: no chunk was sent twice.
    for (i, b) in r.link_bytes.iter().enumerate().skip(1) {
        assert_eq!(*b, 8 * MIB + 12345, "link into {i}");
    }
}

#[test]
fn relaying_is_pipelined_not_store_and_forward() {
    // A chain of 6 hops at 100 Mbit/s: store-and-forward would take 6 serialization times.
    let len = 16 * MIB;
    let spec = SimSpec::new(Tree::kary(6, 1), LinkSpec::wan(5, 100.0), len);
    let one_hop = len as f64 * 8.0 / 100e6;
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    let last = r.nodes[6].done_at.unwrap().as_secs_f64();
    assert!(
        last < one_hop * 1.3,
        "last node done at {last:.2}s; one hop takes {one_hop:.2}s"
    );
    // And the first node had data long before the end.
    let first_progress = r.nodes[6].progress.first().unwrap().0.as_secs_f64();
    assert!(first_progress < one_hop / 10.0);
}

#[test]
fn stream_of_unknown_length_arrives_whole() {
    let mut spec = SimSpec::new(Tree::kary(9, 2), LinkSpec::wan(10, 200.0), 3 * MIB + 7);
    spec.stream = true;
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
}

#[test]
fn a_stream_whose_input_pauses_longer_than_the_idle_timeout_still_arrives_whole() {
    // A feed's producer sends a little, then waits minutes for its next product: parents
    // keep their children from taking the silence for a dead parent (`Frame::Idle`).
    let mut spec = SimSpec::new(Tree::kary(7, 2), LinkSpec::wan(40, 100.0), 3 * MIB + 7);
    spec.stream = true;
    let idle = spec.node.idle_timeout;
    spec.input_pause = Some((Duration::from_millis(50), 3 * idle));
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    for (i, n) in r.nodes.iter().enumerate().skip(1) {
        let done = n.done_at.expect("complete");
        assert!(
            done > 3 * idle,
            "node {i} done at {done:?}, before the pause ended"
        );
        let before = n.progress.iter().filter(|p| p.0 < 3 * idle).count();
        assert!(before > 0, "node {i} got nothing before the pause");
    }
}

#[test]
fn a_relay_that_has_everything_outlasts_a_quiet_parent_while_its_slow_child_catches_up() {
    // source -> relay over a fast link, relay -> leaf over a slow one, and a buffer that
    // holds the whole object: the relay has every chunk and the end long before the leaf
    // does. Its parent then has nothing to send for longer than the idle timeout; the relay
    // needs nothing from it, so that silence is no reason to abort (seen in the lab: a 600 MiB
    // balanced send on slow links lost 8 of 15 receivers to "parent silent for 60s").
    let tree = Tree::from_parents(vec![None, Some(0), Some(1)]).unwrap();
    let mut spec = SimSpec::new(tree, LinkSpec::LAN, 8 * MIB);
    spec.node.buffer_budget = 16 * MIB as usize;
    let idle = spec.node.idle_timeout;
    // 8 MiB at 64 kB/s: about two idle timeouts after the relay is complete.
    spec.links[2] = LinkSpec {
        rate: 64_000.0,
        ..LinkSpec::LAN
    };
    spec.stall_timeout = Duration::from_secs(30);
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    let relay = r.nodes[1].done_at.expect("complete");
    let leaf = r.nodes[2].done_at.expect("complete");
    assert!(
        leaf > relay + idle,
        "leaf done at {leaf:?}, relay at {relay:?}: the parent was never quiet for {idle:?}"
    );
}

#[test]
fn empty_object_completes() {
    let r = Sim::new(SimSpec::new(Tree::kary(3, 2), LinkSpec::LAN, 0)).run();
    assert_all_complete(&r);
}

#[test]
fn stalled_leaf_holds_the_session_back_until_let_go_then_the_rest_finish() {
    let mut spec = SimSpec::new(Tree::kary(6, 2), LinkSpec::wan(5, 100.0), 32 * MIB);
    spec.stall_timeout = Duration::from_secs(5);
    spec.stalls = vec![(5, Duration::from_millis(500))];
    let budget_chunks = spec.node.buffer_budget as u64 / spec.chunk_size as u64;
    let r = Sim::new(spec).run();
    assert!(r.finished);
    // Let go once it held the others back for the lag timeout (3 s), before the 5 s stall
    // timeout would have cut it.
    let failed = r.nodes[5].failed.as_deref().unwrap_or_default();
    assert!(failed.starts_with("fell behind"), "node 5: {failed:?}");
    for i in [1, 2, 3, 4, 6] {
        assert!(
            r.nodes[i].data_ok && r.nodes[i].done_at.is_some(),
            "node {i}"
        );
    }
    // Policy: until it is let go, nobody gets further ahead of the stalled node than the
    // buffers of the path between them allow (one budget per relay on the way: source and
    // node 2).
    let stalled_at = r.nodes[5].acked;
    let during = Duration::from_millis(3400);
    for i in [1, 2, 3, 4, 6] {
        let ahead = r.nodes[i].acked_at(during).saturating_sub(stalled_at);
        assert!(
            ahead <= 2 * budget_chunks + 2,
            "node {i} got {ahead} chunks ahead while node 5 was stalled"
        );
    }
    // After it is let go (about 3.5 s) the rest runs at link speed: 32 MiB at 100 Mbit/s is
    // 2.7 s in all.
    let last = (1..=6)
        .filter(|&i| i != 5)
        .map(|i| r.nodes[i].done_at.unwrap())
        .max()
        .unwrap();
    assert!(
        last > Duration::from_secs(3),
        "finished before it was let go: {last:?}"
    );
    assert!(
        last < Duration::from_secs(7),
        "slow after it was let go: {last:?}"
    );
}

#[test]
fn stalled_relay_is_cut_off_alone_and_its_children_adopted() {
    let mut spec = SimSpec::new(Tree::kary(6, 2), LinkSpec::wan(2, 200.0), 8 * MIB);
    spec.stall_timeout = Duration::from_secs(3);
    spec.stalls = vec![(1, Duration::from_millis(100))];
    let r = Sim::new(spec).run();
    assert!(r.finished);
    assert!(r.nodes[1].failed.is_some(), "node 1 should have failed");
    // Its children 3 and 4 were adopted by the source and resumed.
    for i in [2, 3, 4, 5, 6] {
        assert_eq!(r.nodes[i].failed, None, "node {i}");
        assert!(
            r.nodes[i].data_ok && r.nodes[i].done_at.is_some(),
            "node {i}"
        );
    }
}

#[test]
fn corrupt_chunks_are_detected_and_repaired() {
    let mut spec = SimSpec::new(Tree::kary(10, 3), LinkSpec::wan(10, 100.0), 6 * MIB);
    spec.corrupt_chunks = vec![(1, 3), (4, 0), (10, 95), (1, 40)];
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    assert_eq!(r.nodes[1].corrupt_detected, 2);
    assert_eq!(r.nodes[4].corrupt_detected, 1);
    assert_eq!(r.nodes[10].corrupt_detected, 1);
}

#[test]
fn random_corruption_on_every_link_with_a_tight_budget_still_completes() {
    let mut spec = SimSpec::new(Tree::kary(12, 2), LinkSpec::wan(20, 100.0), 8 * MIB);
    for l in spec.links.iter_mut() {
        l.corrupt = 0.02;
    }
    spec.node.buffer_budget = 256 << 10; // 4 chunks: repairs must get through full buffers
    let cap = spec.node.buffer_budget * 3 / 2 + spec.chunk_size as usize;
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    let detected: usize = r.nodes.iter().map(|n| n.corrupt_detected).sum();
    assert!(detected > 10, "only {detected} corruptions injected");
    for (i, n) in r.nodes.iter().enumerate() {
        assert!(n.peak_buffered <= cap, "node {i} held {}", n.peak_buffered);
    }
}

#[test]
fn full_disk_on_a_relay_fails_it_but_its_subtree_still_gets_everything() {
    let mut spec = SimSpec::new(Tree::kary(6, 2), LinkSpec::wan(2, 200.0), 4 * MIB);
    spec.disk_full = vec![(1, MIB)];
    let r = Sim::new(spec).run();
    assert!(r.finished);
    assert_eq!(r.nodes[1].failed.as_deref(), Some("disk full"));
    assert!(!r.nodes[1].data_ok);
    for i in 2..=6 {
        assert!(
            r.nodes[i].data_ok && r.nodes[i].done_at.is_some(),
            "node {i}"
        );
    }
}

#[test]
fn slow_disk_paces_the_session_without_exceeding_the_budget() {
    let mut spec = SimSpec::new(Tree::kary(4, 2), LinkSpec::wan(1, 1000.0), 8 * MIB);
    spec.store_rate[3] = Some(4e6); // 4 MB/s
    let budget = spec.node.buffer_budget;
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    assert!(r.nodes[3].done_at.unwrap() >= Duration::from_secs(2));
    for n in &r.nodes {
        assert!(n.peak_buffered <= budget);
    }
}

mod protocol_errors {
    use std::time::Instant;

    use bulkcast_proto::auth::{Keys, Secret};
    use bulkcast_proto::manifest::{Manifest, ObjectKind};
    use bulkcast_proto::node::{Link, Named, Node, NodeConfig, NodeError, SessionParams};
    use bulkcast_proto::tree::Tree;
    use bulkcast_proto::wire::{Frame, Member};

    fn keys() -> Keys {
        Keys::derive(&Secret::from_bytes([1; 32]))
    }

    fn source() -> Node {
        let params = SessionParams {
            session: 5,
            chunk_size: 65536,
            stall_timeout: std::time::Duration::from_secs(5),
            cc: String::new(),
            stripe: None,
            edges: Default::default(),
            manifest: Manifest {
                name: "x".into(),
                kind: ObjectKind::File,
                total_len: Some(10),
                entries: vec![],
                mode: 0,
                mtime: None,
            },
        };
        let names: Vec<Named> = (1..=4)
            .map(|i| Named {
                name: format!("h{i}"),
                addr: format!("a:{i}"),
                uplink_kbps: 0,
            })
            .collect();
        Node::source(
            params,
            keys(),
            NodeConfig::default(),
            &Tree::kary(4, 2),
            &names,
            Instant::now(),
        )
        .unwrap()
    }

    #[test]
    fn a_child_cannot_report_for_nodes_outside_its_subtree() {
        let mut s = source();
        // Child 0 is node 1 with subtree {1, 3, 4}; node 2 is not below it.
        let e = s.handle_frame(
            Link::Child(0),
            Frame::Done {
                node: 2,
                received: 0,
            },
            Instant::now(),
        );
        assert_eq!(
            e,
            Err(NodeError::NotInSubtree {
                link: Link::Child(0),
                node: 2
            })
        );
        assert!(s
            .handle_frame(
                Link::Child(0),
                Frame::Ack { node: 3, upto: 0 },
                Instant::now()
            )
            .is_ok());
        // Data never flows up.
        let chunk = keys().seal(5, 0, bytes::Bytes::from_static(b"0123456789"));
        assert!(s
            .handle_frame(Link::Child(0), Frame::Chunk(chunk), Instant::now())
            .is_err());
    }

    #[test]
    fn a_child_link_closes_once_its_whole_subtree_has_finished() {
        use bulkcast_proto::node::Event;
        let mut s = source();
        let closes = |s: &mut Node| {
            std::iter::from_fn(|| s.poll_event())
                .filter(|e| matches!(e, Event::CloseLink(_)))
                .count()
        };
        let done = |node| Frame::Done { node, received: 0 };
        // Child 0 is node 1 with subtree {1, 3, 4}: open while 4 has not finished.
        s.handle_frame(Link::Child(0), done(1), Instant::now())
            .unwrap();
        s.handle_frame(Link::Child(0), done(3), Instant::now())
            .unwrap();
        assert_eq!(closes(&mut s), 0);
        let failed = Frame::Failed {
            node: 4,
            reason: "disk full".into(),
        };
        s.handle_frame(Link::Child(0), failed, Instant::now())
            .unwrap();
        let mut evs = Vec::new();
        while let Some(e) = s.poll_event() {
            evs.push(e);
        }
        assert!(
            evs.iter()
                .any(|e| matches!(e, Event::CloseLink(Link::Child(0)))),
            "{evs:?}"
        );
        // Said once; the other child's link stays.
        s.handle_frame(Link::Child(0), done(4), Instant::now())
            .unwrap();
        s.handle_frame(Link::Child(1), done(2), Instant::now())
            .unwrap();
        assert_eq!(closes(&mut s), 1, "node 2 is a leaf: its link closes too");
        assert!(s.children().iter().all(|c| c.is_resolved()));
    }

    #[test]
    fn an_open_with_a_cycle_or_a_foreign_first_member_is_refused() {
        let mut open = source().open_for(0);
        assert!(Node::relay(&open, keys(), NodeConfig::default(), Instant::now()).is_ok());
        // 3 and 4 point at each other: not reachable from the recipient.
        open.members[1].parent = 4;
        open.members[2].parent = 3;
        assert!(matches!(
            Node::relay(&open, keys(), NodeConfig::default(), Instant::now()),
            Err(NodeError::BadOpen(_))
        ));
        let mut open = source().open_for(0);
        open.members.insert(
            0,
            Member {
                node: 9,
                parent: 0,
                name: "x".into(),
                addr: "x:1".into(),
                uplink_kbps: 0,
            },
        );
        assert!(Node::relay(&open, keys(), NodeConfig::default(), Instant::now()).is_err());
        let mut open = source().open_for(0);
        open.manifest.name = "../escape".into();
        assert!(matches!(
            Node::relay(&open, keys(), NodeConfig::default(), Instant::now()),
            Err(NodeError::Manifest(_))
        ));
    }

    #[test]
    fn a_forged_end_is_a_protocol_error() {
        let open = source().open_for(0);
        let mut relay = Node::relay(&open, keys(), NodeConfig::default(), Instant::now()).unwrap();
        let mut end = keys().seal_end(5, 1, 10);
        end.total_len = 9;
        assert_eq!(
            relay.handle_frame(Link::Parent, Frame::End(end), Instant::now()),
            Err(NodeError::BadEnd)
        );
        // A chunk from another secret is rejected as corrupt and requested again, never delivered.
        let other = Keys::derive(&Secret::from_bytes([2; 32]));
        let forged = other.seal(5, 0, bytes::Bytes::from_static(b"0123456789"));
        relay
            .handle_frame(Link::Parent, Frame::Chunk(forged), Instant::now())
            .unwrap();
        assert!(matches!(
            relay.poll_event(),
            Some(bulkcast_proto::node::Event::Corrupt { index: 0, .. })
        ));
        assert_eq!(relay.poll_event(), None);
        // Its first frame up says what it held before (nothing here).
        assert!(matches!(
            relay.poll_transmit(Link::Parent),
            Some(Frame::Have { node: 1, complete: false, ref ranges }) if ranges.is_empty()
        ));
        assert_eq!(
            relay.poll_transmit(Link::Parent),
            Some(Frame::Request { index: 0 })
        );
    }
}

#[test]
fn chunks_travel_in_verified_parts_and_each_hop_adds_a_part_not_a_chunk() {
    // A chain of 8 at 100 Mbit/s with 1 MiB chunks: forwarding whole chunks, every hop waits
    // for a chunk (84 ms); in 16 KiB parts, for a part (1.3 ms).
    let run = |part_bytes: usize| {
        let mut spec = SimSpec::new(Tree::kary(8, 1), LinkSpec::wan(1, 100.0), 32 * MIB);
        spec.chunk_size = 1 << 20;
        spec.node.buffer_budget = 16 << 20;
        spec.node.part_bytes = part_bytes;
        let r = Sim::new(spec).run();
        assert_all_complete(&r);
        let done = |i: usize| r.nodes[i].done_at.unwrap().as_secs_f64();
        (done(8) - done(1), r)
    };
    let (whole, r) = run(0);
    assert!(r.part_bytes.iter().all(|&b| b == 0));
    let (parts, r) = run(16 << 10);
    for i in 1..=8 {
        assert_eq!(
            r.part_bytes[i],
            32 * MIB,
            "link into {i} carried whole chunks"
        );
        assert_eq!(
            r.link_bytes[i],
            32 * MIB,
            "link into {i} carried something twice"
        );
    }
    assert!(
        whole > 7.0 * 0.08,
        "whole chunks: last node {whole:.3}s after the first"
    );
    assert!(
        parts < 7.0 * 0.005,
        "parts: last node {parts:.3}s after the first"
    );
}

#[test]
fn a_corrupt_part_is_caught_at_the_hop_that_receives_it_and_never_forwarded() {
    // Chain 0 -> 1 -> 2 -> 3 and a branch 1 -> 4; chunk 5 is corrupted on its way into node 1
    // (one byte of one of its parts), chunk 9 on its way into node 2.
    let tree = Tree::from_parents(vec![None, Some(0), Some(1), Some(2), Some(1)]).unwrap();
    let mut spec = SimSpec::new(tree, LinkSpec::wan(2, 100.0), 4 * MIB);
    spec.corrupt_chunks = vec![(1, 5), (2, 9)];
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    assert!(r.part_bytes[1] > 0, "chunks were not sent in parts");
    let detected: Vec<usize> = r.nodes.iter().map(|n| n.corrupt_detected).collect();
    assert_eq!(detected, vec![0, 1, 1, 0, 0], "where corruption was caught");
    for (i, n) in r.nodes.iter().enumerate().skip(1) {
        assert!(n.data_ok, "node {i} holds wrong bytes");
    }
    // Only the repaired chunk crossed a link twice, and only the link it was corrupted on.
    assert_eq!(r.link_bytes[3], 4 * MIB);
    assert_eq!(r.link_bytes[4], 4 * MIB);
}
