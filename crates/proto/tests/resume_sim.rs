//! Resuming on the simulated network: a receiver that kept verified chunks from an earlier
//! session gets only the rest, one that holds an identical copy gets nothing, and a relay
//! serves its children what it held from its own copy.

use bulkcast_proto::sim::{chunks_of, LinkSpec, Sim, SimReport, SimSpec};
use bulkcast_proto::tree::Tree;

const MIB: u64 = 1 << 20;

fn assert_all_complete(r: &SimReport) {
    assert!(r.finished, "source did not finish: {:#?}", r.nodes);
    assert_eq!(r.incomplete(), Vec::<usize>::new(), "{:#?}", r.nodes);
}

/// Bytes of the chunks of `[0, n)` outside `held`, for an object of `len` bytes.
fn missing_bytes(len: u64, cs: u64, held: &[(u64, u64)]) -> u64 {
    let n = len.div_ceil(cs);
    (0..n)
        .filter(|i| !held.iter().any(|&(s, e)| (s..e).contains(i)))
        .map(|i| cs.min(len - i * cs))
        .sum()
}

#[test]
fn each_link_carries_only_what_the_node_below_lacks() {
    let len = 4 * MIB + 777;
    let cs = 64 << 10;
    // Node 1 (a relay) holds the first half, its child 3 nothing, its child 4 everything;
    // node 2 holds scattered ranges, its child 5 a tail; node 7 holds an identical copy.
    let mut spec = SimSpec::new(Tree::kary(12, 2), LinkSpec::wan(2, 400.0), len);
    let n = chunks_of(len, cs as u32);
    let held: Vec<(usize, Vec<(u64, u64)>)> = vec![
        (1, vec![(0, n / 2)]),
        (2, vec![(3, 9), (20, 21), (40, n - 1)]),
        (4, vec![(0, n)]),
        (5, vec![(n - 10, n)]),
    ];
    spec.held = held.clone();
    spec.complete = vec![7];
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    for i in 1..=12 {
        let h = held
            .iter()
            .find(|x| x.0 == i)
            .map_or(vec![], |x| x.1.clone());
        let want = if i == 7 {
            0
        } else {
            missing_bytes(len, cs, &h)
        };
        assert_eq!(r.link_bytes[i], want, "link into node {i}");
        assert_eq!(r.nodes[i].received, want, "node {i}'s own count");
        let chunks: u64 = h.iter().map(|(s, e)| e - s).sum();
        let expect_held = if i == 7 { n } else { chunks };
        assert_eq!(r.nodes[i].held, Some(expect_held), "node {i}'s Have");
    }
    // Node 1 read back for node 3 the half it held and was never sent; nobody else loaded
    // anything its children already had.
    assert!(r.nodes[1].loads >= n / 2, "{}", r.nodes[1].loads);
    assert_eq!(r.nodes[7].stored, 0, "an identical copy is not rewritten");
}

#[test]
fn a_second_send_of_an_unchanged_object_moves_nothing() {
    let len = 2 * MIB;
    let mut spec = SimSpec::new(Tree::kary(10, 3), LinkSpec::LAN, len);
    spec.complete = (1..=10).collect();
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    assert_eq!(r.link_bytes.iter().sum::<u64>(), 0);
}

/// A receiver crashed after storing chunks `[0, k)` (at a chunk boundary) and, with `torn`,
/// half of chunk `k` whose write never completed, so its copy's map does not list it. The
/// next session moves exactly the rest and the copy ends byte-exact.
fn resume_after_crash(k: u64, torn: bool) {
    let len = MIB + 4321;
    let cs = 16 << 10;
    let mut spec = SimSpec::new(Tree::kary(3, 1), LinkSpec::wan(1, 200.0), len);
    spec.chunk_size = cs as u32;
    spec.held = vec![(2, vec![(0, k)]).clone()];
    spec.held.retain(|h| !h.1.iter().all(|r| r.0 == r.1));
    if torn {
        spec.torn = vec![(2, k * cs + cs / 2)];
    }
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    let want = missing_bytes(len, cs, &[(0, k)]);
    assert_eq!(r.link_bytes[2], want, "k={k} torn={torn}");
    // Node 2's child got everything, half of it read back from node 2's copy.
    assert_eq!(r.link_bytes[3], len, "k={k}");
}

#[test]
fn resume_after_a_crash_at_any_chunk_boundary_and_mid_chunk() {
    let n = chunks_of(MIB + 4321, 16 << 10);
    for k in (0..n).step_by(7).chain([n - 1]) {
        resume_after_crash(k, false);
        resume_after_crash(k, true);
    }
}

/// A chain 0 -> 1 -> 2 -> 3 whose relay 1 holds the whole object in place, with what the
/// nodes below it hold: every node ends with a byte-exact copy and the source finishes,
/// within a bounded simulated time (a missing `End` would otherwise stall until the limit).
fn complete_relay_in_chain(complete: Vec<usize>, held: Vec<(usize, Vec<(u64, u64)>)>) {
    let len = 4 * MIB + 777;
    let mut spec = SimSpec::new(Tree::kary(3, 1), LinkSpec::wan(2, 400.0), len);
    spec.complete = complete.clone();
    spec.held = held.clone();
    spec.time_limit = std::time::Duration::from_secs(60);
    let r = Sim::new(spec).run();
    assert_all_complete(&r);
    let cs = 64 << 10;
    for i in 1..=3 {
        let h = held
            .iter()
            .find(|x| x.0 == i)
            .map_or(vec![], |x| x.1.clone());
        let want = if complete.contains(&i) {
            0
        } else {
            missing_bytes(len, cs, &h)
        };
        assert_eq!(r.link_bytes[i], want, "link into node {i}");
    }
}

#[test]
fn a_relay_that_holds_the_whole_object_still_ends_its_children() {
    complete_relay_in_chain(vec![1], vec![]);
}

#[test]
fn a_complete_relay_ends_a_child_that_holds_part_of_the_object() {
    let n = chunks_of(4 * MIB + 777, 64 << 10);
    complete_relay_in_chain(vec![1], vec![(2, vec![(0, n / 3), (n / 2, n - 2)])]);
    complete_relay_in_chain(vec![1], vec![(2, vec![(0, n)])]);
}

#[test]
fn a_complete_leaf_or_complete_relays_in_a_row_finish() {
    complete_relay_in_chain(vec![3], vec![]);
    complete_relay_in_chain(vec![1, 2], vec![]);
    complete_relay_in_chain(vec![2], vec![(1, vec![(5, 9)])]);
}

/// A balanced send: each tree carries a stripe of the object as a session of its own. A
/// receiver whose copy of the object holds `held` resumes every tree's session from its part
/// of it ([`Stripes::split`]), so the trees together move exactly what the copy lacks, whether
/// the receiver is a relay in one tree and a leaf in another; the other receiver, complete,
/// gets nothing in either.
#[test]
fn balanced_trees_together_move_only_what_the_copy_lacks() {
    use bulkcast_proto::chunkmap::ChunkMap;
    use bulkcast_proto::manifest::{Manifest, ObjectKind};
    use bulkcast_proto::stripe::Stripes;
    let len = 4 * MIB + 777;
    let cs = 64u64 << 10;
    let n = chunks_of(len, cs as u32);
    let object = Manifest {
        name: "model.bin".into(),
        kind: ObjectKind::File,
        total_len: Some(len),
        entries: vec![],
        mode: 0o644,
        mtime: None,
    };
    let stripes = Stripes::from_rates(&[300.0, 100.0]).unwrap();
    for held in [
        ChunkMap::from_ranges(&[(0, n / 3), (n / 2, n / 2 + 5)], n),
        ChunkMap::from_ranges(&[(n - 1, n)], n),
        ChunkMap::from_ranges(&[(0, n)], n),
        ChunkMap::new(),
    ] {
        let parts = stripes.split(&held);
        let mut moved = 0;
        for t in 0..2u16 {
            let stripe = stripes.stripe_manifest(t, &object, cs as u32).unwrap();
            let slen = stripe.total_len.unwrap();
            // Tree 0: source -> resumed -> complete; tree 1: source -> complete -> resumed.
            let (resumed, complete) = if t == 0 { (1, 2) } else { (2, 1) };
            let mut spec = SimSpec::new(Tree::kary(2, 1), LinkSpec::wan(2, 400.0), slen);
            spec.held = vec![(resumed, parts[t as usize].ranges())];
            spec.held.retain(|h| !h.1.is_empty());
            spec.complete = vec![complete];
            let r = Sim::new(spec).run();
            assert_all_complete(&r);
            let want = missing_bytes(slen, cs, &parts[t as usize].ranges());
            assert_eq!(r.nodes[resumed].received, want, "tree {t}");
            assert_eq!(r.nodes[complete].received, 0, "tree {t}");
            moved += r.nodes[resumed].received;
        }
        assert_eq!(moved, missing_bytes(len, cs, &held.ranges()), "{held:?}");
    }
}
