//! Resuming in the swarm strategies, on the simulated four-cluster network: a member that kept
//! verified pieces from an earlier session gets only the rest and serves what it kept to the
//! others; one that holds an identical copy gets nothing; an unchanged object moves nothing.

use std::time::Duration;

use bulkcast_proto::swarm::sim::{self, Condition, SwarmSimReport, SwarmSimSpec, Topology};
use bulkcast_proto::swarm::Strategy;

const MIB: u64 = 1 << 20;

fn spec(strategy: Strategy, len: u64) -> SwarmSimSpec {
    let mut topo = Topology::four_clusters([4; 4], Duration::from_millis(20));
    let changes = Condition::FastLinks.apply(&mut topo, 7, Duration::from_secs(600));
    let mut s = SwarmSimSpec::new(topo, strategy, len);
    s.wan_changes = changes;
    s.piece_len = 128 << 10;
    s.time_limit = Duration::from_secs(600);
    s.data = true;
    s
}

fn received(r: &SwarmSimReport, node: usize) -> u64 {
    r.received_from[node].values().sum()
}

fn assert_all_verified(r: &SwarmSimReport, what: &str) {
    assert!(r.incomplete().is_empty(), "{what}: {:?}", r.incomplete());
    assert!(r.all_done, "{what}: the completion tree did not finish");
    assert!(r.verified.iter().all(|&v| v), "{what}: {:?}", r.verified);
}

/// Bytes of the pieces of `[0, n)` outside `held`.
fn missing(len: u64, piece: u64, held: &[(u64, u64)]) -> u64 {
    (0..len.div_ceil(piece))
        .filter(|i| !held.iter().any(|&(s, e)| (s..e).contains(i)))
        .map(|i| piece.min(len - i * piece))
        .sum()
}

#[test]
fn a_resumed_member_gets_only_what_it_lacks_and_a_complete_one_nothing() {
    let len = 12 * MIB + 4321;
    let piece = 128u64 << 10;
    let n = len.div_ceil(piece);
    // Node 5 (cluster 1) kept the first 40% and a few scattered pieces; node 10 (cluster 2)
    // a tail; node 3 (the source's cluster) an identical copy.
    let held5 = vec![(0, n * 2 / 5), (n / 2, n / 2 + 3), (n - 7, n - 5)];
    let held10 = vec![(n / 3, n)];
    for strategy in Strategy::ALL {
        let mut s = spec(strategy, len);
        s.held = vec![(5, held5.clone()), (10, held10.clone()), (3, vec![(0, n)])];
        let r = sim::run(s);
        let what = strategy.name();
        assert_all_verified(&r, what);
        for (node, held) in [(5, &held5), (10, &held10)] {
            // Not one piece it kept came again.
            for (i, &k) in r.arrivals[node].iter().enumerate() {
                let kept = held.iter().any(|&(s, e)| (s..e).contains(&(i as u64)));
                assert!(
                    !kept || k == 0,
                    "{what}: node {node} was sent kept piece {i}"
                );
            }
            let lacks = missing(len, piece, held);
            let got = received(&r, node);
            // What it lacked came, at most a piece or 1% more (a piece doubled in the endgame).
            // The hybrid pushes down its cluster's tree and pulls from cluster mates too, so
            // a member there gets some pieces twice, resumed or not: not bounded here.
            let bound = match strategy {
                Strategy::Hybrid => lacks * 2,
                _ => lacks + piece.max(len / 100),
            };
            assert!(
                got >= lacks && got <= bound,
                "{what}: node {node} received {got} for {lacks} missing"
            );
        }
        assert_eq!(received(&r, 3), 0, "{what}: the complete member");
        assert_eq!(r.done_at[3], Some(Duration::ZERO), "{what}");
    }
}

#[test]
fn an_unchanged_object_moves_nothing_with_every_strategy() {
    let len = 4 * MIB + 1;
    let n = len.div_ceil(128 << 10);
    for strategy in Strategy::ALL {
        let mut s = spec(strategy, len);
        s.held = (1..16).map(|i| (i, vec![(0, n)])).collect();
        let r = sim::run(s);
        let what = strategy.name();
        assert_all_verified(&r, what);
        assert_eq!(r.wan_into.iter().sum::<u64>(), 0, "{what}");
        for i in 1..16 {
            assert_eq!(received(&r, i), 0, "{what}: node {i}");
        }
    }
}

/// A member holding everything but one piece, at either end of the object: it still gets that
/// piece (once), whichever strategy, and serves the rest.
#[test]
fn a_member_missing_one_piece_gets_exactly_it() {
    let len = 3 * MIB + 777;
    let piece = 128u64 << 10;
    let n = len.div_ceil(piece);
    for strategy in Strategy::ALL {
        for held in [
            vec![(1, n)],
            vec![(0, n - 1)],
            vec![(0, n / 2), (n / 2 + 1, n)],
        ] {
            let mut s = spec(strategy, len);
            s.held = vec![(6, held.clone())];
            let r = sim::run(s);
            let what = format!("{} {held:?}", strategy.name());
            assert_all_verified(&r, &what);
            assert_eq!(received(&r, 6), missing(len, piece, &held), "{what}");
        }
    }
}
