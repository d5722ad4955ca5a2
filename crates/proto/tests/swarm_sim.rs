//! The swarm strategies on the simulated four-cluster network (MOB paper, section 4.1):
//! delivery, WAN efficiency, losses, adaptation to a slowed tree edge, and hostile input.

use std::time::{Duration, Instant};

use bulkcast_proto::auth::{Keys, Secret};
use bulkcast_proto::swarm::mob::ShareLayout;
use bulkcast_proto::swarm::session::Outcome;
use bulkcast_proto::swarm::sim::{
    self, plan_tree, Condition, SwarmSimReport, SwarmSimSpec, Topology, WanChange,
};
use bulkcast_proto::swarm::{Strategy, SwarmConfig, SwarmError, SwarmMsg, SwarmNode};
use bulkcast_proto::tree::{NodeId, Tree};
use bulkcast_proto::wire::{Frame, WireError};
use bytes::Bytes;

const MIB: u64 = 1 << 20;

fn spec(strategy: Strategy, len: u64, cond: Condition) -> SwarmSimSpec {
    let mut topo = Topology::four_clusters([4; 4], Duration::from_millis(20));
    let changes = cond.apply(&mut topo, 7, Duration::from_secs(600));
    let mut s = SwarmSimSpec::new(topo, strategy, len);
    s.wan_changes = changes;
    s.piece_len = 128 << 10;
    s.time_limit = Duration::from_secs(600);
    s
}

/// The lab's rates ([`sim::LAB_LINKS`]) in its "slow links" condition at 20 ms, clusters of
/// `sizes` members, and the bound of that network for `len` bytes.
fn lab_slow_links(
    sizes: [usize; 4],
    strategy: Strategy,
    len: u64,
    piece_len: u32,
    seed: u64,
) -> (SwarmSimSpec, f64) {
    let mut topo = Topology::four_clusters(sizes, Duration::from_millis(20));
    topo.set_lab_links();
    // A static condition: no schedule, so the horizon is immaterial.
    let changes = Condition::SlowLinks.apply(&mut topo, seed, Duration::ZERO);
    let bound = sim::bound_rate(&topo, &changes, len);
    let mut s = SwarmSimSpec::new(topo, strategy, len);
    s.wan_changes = changes;
    s.piece_len = piece_len;
    s.seed = seed;
    (s, bound)
}

fn assert_all_done(r: &SwarmSimReport, what: &str) {
    assert!(
        r.incomplete().is_empty(),
        "{what}: incomplete {:?}",
        r.incomplete()
    );
    assert!(
        r.all_done,
        "{what}: the completion tree did not report everyone done"
    );
    for (i, ok) in r.verified.iter().enumerate() {
        assert!(
            *ok || r.lost[i],
            "{what}: node {i} does not hold a verified copy"
        );
    }
}

#[test]
fn every_strategy_ends_with_every_node_holding_every_verified_piece() {
    for strategy in Strategy::ALL {
        let mut s = spec(strategy, 6 * MIB + 12_345, Condition::FastLinks);
        s.data = true;
        let r = sim::run(s);
        assert_all_done(&r, strategy.name());
        // Each receiver got its bytes from peers the strategy allows: tree push only from
        // its tree parent.
        if strategy == Strategy::TreePush {
            let tree = plan_tree(&Topology::four_clusters([4; 4], Duration::from_millis(20)));
            for (i, from) in r.received_from.iter().enumerate().skip(1) {
                assert_eq!(
                    from.keys().copied().collect::<Vec<_>>(),
                    vec![tree.parent(i).unwrap()]
                );
            }
        }
        let got: u64 = r
            .received_from
            .iter()
            .map(|m| m.values().sum::<u64>())
            .sum();
        assert!(
            got >= 15 * r.object_len,
            "{}: {got} bytes received",
            strategy.name()
        );
    }
}

#[test]
fn mob_brings_each_piece_into_each_cluster_exactly_once() {
    for cond in [Condition::FastLinks, Condition::Mayhem] {
        let r = sim::run(spec(Strategy::Mob, 8 * MIB, cond));
        assert_all_done(&r, cond.name());
        assert_eq!(r.wan_into[0], 0, "nothing enters the source's cluster");
        for c in 1..4 {
            assert_eq!(
                r.wan_into[c],
                r.object_len,
                "{}: WAN bytes into cluster {c}",
                cond.name()
            );
            assert!(
                r.entries[c].iter().all(|&e| e == 1),
                "{}: a piece entered cluster {c} twice",
                cond.name()
            );
        }
        // The WAN load is spread: with stable links, every cluster pair carried part of it.
        for x in (0..4).filter(|_| cond == Condition::FastLinks) {
            for y in 1..4 {
                if x != y {
                    assert!(
                        r.wan_bytes[x][y] > 0,
                        "{}: link {x}->{y} unused",
                        cond.name()
                    );
                }
            }
        }
    }
    // The BitTorrent baseline, on the same network, brings duplicates in.
    let bt = sim::run(spec(Strategy::Swarm, 8 * MIB, Condition::FastLinks));
    assert!(bt.wan_into[1..].iter().any(|&b| b > bt.object_len));
}

/// The lab's unequal layout (the source alone in its site, then 3, 4 and 8 members) on its
/// slow links: the 8-member site's only link to the source's site runs at 0.8 MB/s. Its members
/// queue requests at the source before anyone else has pieces; once the other sites have
/// them, MOB moves those still unserved (a confirmed cancel), and each piece still enters each
/// cluster once. Without the moves it reached 0.25 of the bound here, waiting on that link.
#[test]
fn mob_moves_requests_off_a_slow_link_and_still_brings_each_piece_in_once() {
    let (s, bound) = lab_slow_links([1, 3, 4, 8], Strategy::Mob, 32 * MIB, 256 << 10, 4);
    let r = sim::run(s);
    assert_all_done(&r, "mob, unequal, slow links");
    for c in 1..4 {
        assert_eq!(r.wan_into[c], r.object_len, "WAN bytes into cluster {c}");
        assert!(r.entries[c].iter().all(|&e| e == 1), "cluster {c}: twice");
    }
    let f = r.throughput() / bound;
    assert!(f > 0.35, "mob at {f:.3} of the bound");
}

#[test]
fn no_strategy_livelocks_when_a_member_disappears() {
    let topo = Topology::four_clusters([4; 4], Duration::from_millis(20));
    let tree = plan_tree(&topo);
    // An interior node of cluster B's local tree (it has a tree child), lost mid-transfer.
    let lost: NodeId = 5;
    let orphans: Vec<NodeId> = tree
        .subtree(lost)
        .into_iter()
        .filter(|&n| n != lost)
        .collect();
    assert!(!orphans.is_empty());
    for strategy in Strategy::ALL {
        let mut s = spec(strategy, 8 * MIB, Condition::FastLinks);
        s.lost = vec![(Duration::from_millis(700), lost)];
        let t0 = Instant::now();
        let r = sim::run(s);
        assert!(r.lost[lost]);
        assert!(
            r.done_at[lost].is_none(),
            "{}: lost before it finished",
            strategy.name()
        );
        assert!(
            r.elapsed < Duration::from_secs(600),
            "{}: ran to the time limit",
            strategy.name()
        );
        assert!(t0.elapsed() < Duration::from_secs(20));
        if strategy == Strategy::TreePush {
            // Pure push has no way around a lost relay: exactly its subtree is stranded, and
            // the run ends (nothing is left to happen) instead of spinning.
            assert_eq!(r.incomplete(), orphans);
            assert!(!r.all_done);
        } else {
            assert_all_done(&r, strategy.name());
        }
    }
}

/// The tree edge into the cluster that feeds another cluster in the plan, its rate, and the
/// clusters at its ends.
fn busiest_wan_edge(topo: &Topology) -> (usize, usize) {
    let tree = plan_tree(topo);
    let first = topo.first_nodes();
    let cluster = |n: NodeId| first.iter().rposition(|&f| f <= n).unwrap();
    let mut best = None;
    for &f in &first[1..] {
        let p = tree.parent(f).unwrap();
        let below = tree.subtree(f).len();
        if best.is_none_or(|(b, _, _)| below > b) {
            best = Some((below, cluster(p), cluster(f)));
        }
    }
    let (_, x, y) = best.unwrap();
    (x, y)
}

#[test]
fn hybrid_outruns_tree_push_when_a_tree_edge_drops_to_a_tenth() {
    let len = 24 * MIB;
    let base = spec(Strategy::Hybrid, len, Condition::FastLinks);
    let (x, y) = busiest_wan_edge(&base.topology);
    let nominal = base.topology.wan[x][y];
    let base_topo = base.topology.clone();
    let change = vec![WanChange {
        at: Duration::from_millis(500),
        from: x,
        to: y,
        rate: nominal / 10.0,
    }];
    let slowed = |strategy| {
        let mut s = spec(strategy, len, Condition::FastLinks);
        s.wan_changes = change.clone();
        sim::run(s)
    };
    let hybrid_static = sim::run(base);
    let hybrid = slowed(Strategy::Hybrid);
    let tree = slowed(Strategy::TreePush);
    let mob = slowed(Strategy::Mob);
    assert_all_done(&hybrid, "hybrid");
    assert_all_done(&mob, "mob");
    assert_all_done(&tree, "tree push");
    let (th, tt, ts) = (
        hybrid.last_done().unwrap().as_secs_f64(),
        tree.last_done().unwrap().as_secs_f64(),
        hybrid_static.last_done().unwrap().as_secs_f64(),
    );
    let tm = mob.last_done().unwrap().as_secs_f64();
    eprintln!(
        "edge {x}->{y} at 10%: hybrid {th:.2} s, mob {tm:.2} s, tree push {tt:.2} s; \
         hybrid without the slowdown {ts:.2} s"
    );
    // Far ahead of the same plan pushed alone, and of MOB under the same slowdown (MOB keeps
    // R = 5 requests queued behind the slowed link whatever its rate; the hybrid sizes each
    // peer's window by its measured rate and moves requests off a slow peer).
    assert!(th < 0.4 * tt, "hybrid {th:.2} s vs tree push {tt:.2} s");
    assert!(th < 0.6 * tm, "hybrid {th:.2} s vs mob {tm:.2} s");
    // Within the slowdown's own cost of its time without it: 1.36x today (2.74 s vs 2.01 s),
    // while the bound itself goes from 1.66 s to 2.23 s (1.35x), since the source's cluster
    // loses a third of its WAN egress. (The 1.3x is below what the bound allows.)
    let (bs, bt) = (
        sim::bound_time(&base_topo, &[], len).as_secs_f64(),
        sim::bound_time(&base_topo, &change, len).as_secs_f64(),
    );
    eprintln!("bound: {bs:.2} s without the slowdown, {bt:.2} s with it");
    assert!(bt > bs && th > bt, "the bound is a bound");
    assert!(th < 1.5 * ts, "hybrid {th:.2} s slowed vs {ts:.2} s not");
    // It still brings (almost) one copy per cluster.
    for c in 1..4 {
        assert!(
            hybrid.wan_multiples()[c] < 1.25,
            "cluster {c}: {:?}",
            hybrid.wan_multiples()
        );
    }
}

#[test]
fn mob_beats_the_swarm_baseline_and_a_fixed_tree_when_links_change() {
    let len = 24 * MIB;
    let run = |s| sim::run(spec(s, len, Condition::Mayhem)).throughput();
    let (tree, swarm, mob) = (
        run(Strategy::TreePush),
        run(Strategy::Swarm),
        run(Strategy::Mob),
    );
    eprintln!("mayhem: tree {tree:.0} B/s, swarm {swarm:.0} B/s, mob {mob:.0} B/s");
    assert!(mob > swarm && mob > tree);
}

#[test]
fn hybrid_beats_mob_and_the_swarm_baseline_when_links_change() {
    let len = 24 * MIB;
    let s = spec(Strategy::Hybrid, len, Condition::Mayhem);
    let bound = sim::bound_rate(&s.topology, &s.wan_changes, len);
    let hybrid = sim::run(s);
    assert_all_done(&hybrid, "hybrid");
    let run = |s| sim::run(spec(s, len, Condition::Mayhem)).throughput();
    let (swarm, mob, h) = (
        run(Strategy::Swarm),
        run(Strategy::Mob),
        hybrid.throughput(),
    );
    eprintln!(
        "mayhem, fractions of the bound: swarm {:.2}, mob {:.2}, hybrid {:.2}",
        swarm / bound,
        mob / bound,
        h / bound
    );
    assert!(h < bound, "the bound is a bound");
    assert!(h > 1.1 * mob, "hybrid {h:.0} B/s vs mob {mob:.0} B/s");
    assert!(h > 1.5 * swarm, "hybrid {h:.0} B/s vs swarm {swarm:.0} B/s");
    // Pieces mostly enter each cluster once (a second copy only where it came sooner).
    for c in 1..4 {
        assert!(
            hybrid.wan_multiples()[c] < 1.3,
            "cluster {c}: {:?}",
            hybrid.wan_multiples()
        );
    }
}

/// The static conditions at 20 ms, 128 MiB in 256 KiB pieces: the hybrid's fraction of the
/// bound, and its WAN copies.
#[test]
fn hybrid_reaches_most_of_the_bound_with_one_copy_per_cluster_on_static_links() {
    let len = 128 * MIB;
    // Slow links: 0.72 since the driver (and so the simulator) commits one piece per
    // connection instead of four (0.81 with two); the lab measured one slot ahead on slow
    // links, and this simulator's slow-links figure is the known weak cell (docs/DESIGN.md).
    for (cond, floor) in [(Condition::FastLinks, 0.86), (Condition::SlowLinks, 0.70)] {
        let mut s = spec(Strategy::Hybrid, len, cond);
        s.piece_len = 256 << 10;
        s.seed = 4;
        let bound = sim::bound_rate(&s.topology, &s.wan_changes, len);
        let r = sim::run(s);
        assert_all_done(&r, cond.name());
        let f = r.throughput() / bound;
        eprintln!(
            "{}: hybrid at {f:.3} of the bound, WAN copies {:?}, out of A {:.3}",
            cond.name(),
            r.wan_multiples(),
            r.wan_bytes[0].iter().sum::<u64>() as f64 / len as f64
        );
        assert!(
            f >= floor && f < 1.0,
            "{}: {f:.3} of the bound",
            cond.name()
        );
        // Each piece is dealt out of the source's cluster once; after the deal its idle links
        // also serve the endgame (11% more on fast links at this size, 2-3% at 600 MB).
        let out_of_source: u64 = r.wan_bytes[0].iter().sum();
        assert!(
            out_of_source as f64 <= 1.2 * len as f64,
            "{}: {out_of_source} bytes out of the source's cluster",
            cond.name()
        );
        // And enters every other cluster about once: never more than twice, in all at most
        // 5% more than the object.
        for c in 1..4 {
            assert!(
                r.entries[c].iter().all(|&e| (1..=2).contains(&e)),
                "{}: a piece entered cluster {c} three times or never",
                cond.name()
            );
            assert!(
                r.wan_multiples()[c] <= 1.05,
                "{}: cluster {c}: {:?}",
                cond.name(),
                r.wan_multiples()
            );
        }
    }
}

/// With `hybrid_servers` above one a receiver asks several members of each other cluster for
/// its share (a lab run showed the deal's target, the busiest member of its cluster, serving
/// the first share slowly). Every piece still enters each cluster through its share owner
/// alone, so copies stay near one, and the share really comes from several members.
#[test]
fn hybrid_with_several_servers_per_cluster_delivers_everything_about_once() {
    let len = 16 * MIB;
    // (receiver, other receiving cluster) pairs in which the receiver got pieces from two or
    // more members of that cluster (node n sits in cluster n / 4; cluster 0 is the source's).
    let spread = |servers: usize| {
        let mut s = spec(Strategy::Hybrid, len, Condition::FastLinks);
        s.data = true;
        s.config.hybrid_servers = servers;
        let r = sim::run(s);
        assert_all_done(&r, &format!("hybrid, {servers} servers per cluster"));
        // At 16 MiB the endgame's second copies weigh more than at 600 MB (1.03-1.06 with
        // three servers, against 1.01-1.03 there in `swarm_sim --lab --servers 4`).
        eprintln!("{servers} servers: WAN copies {:?}", r.wan_multiples());
        for c in 1..4 {
            assert!(
                r.wan_multiples()[c] <= 1.10,
                "{servers} servers: cluster {c}: {:?}",
                r.wan_multiples()
            );
        }
        (4..16)
            .flat_map(|n| (1..4).filter(move |&c| c != n / 4).map(move |c| (n, c)))
            .filter(|&(n, c)| r.received_from[n].keys().filter(|&&m| m / 4 == c).count() >= 2)
            .count()
    };
    let (one, three) = (spread(1), spread(3));
    eprintln!("pairs served by two or more members: {one} with one server, {three} with three");
    assert!(
        three > one,
        "{three} pairs with three servers, {one} with one"
    );
}

/// The endgame asks a peer in another cluster for a second copy only when that peer would
/// deliver it sooner than the first request. On the lab's fast links at 8 MiB (64 KiB
/// pieces, the driver's size for it) the hybrid brought 1.08 copies into each cluster
/// while it doubled every piece left once all were requested; then at most 1.02, and it still
/// finishes well ahead of MOB and the tree. Since the source deals to a target only once it
/// heard what the target holds (a round trip at the start, so that a resumed target is dealt
/// nothing it kept), at most 1.04 (seeds 1-10 at 20 ms: 1.023 on average before, 1.037 after;
/// at 100 ms 1.011 and 1.013).
#[test]
fn hybrid_endgame_brings_a_second_copy_from_afar_only_when_it_is_sooner() {
    let len = 8 * MIB;
    for rtt_ms in [20, 100] {
        let mut tps = Vec::new();
        for strategy in [Strategy::TreePush, Strategy::Mob, Strategy::Hybrid] {
            let mut topo = Topology::four_clusters([4; 4], Duration::from_millis(rtt_ms));
            topo.set_lab_links();
            let mut s = SwarmSimSpec::new(topo, strategy, len);
            s.piece_len = 64 << 10;
            s.seed = 4;
            let r = sim::run(s);
            assert_all_done(&r, strategy.name());
            tps.push(r.throughput());
            if strategy == Strategy::Hybrid {
                let m = r.wan_multiples();
                eprintln!("{rtt_ms} ms: hybrid WAN copies {m:?}");
                assert!(
                    m[1..].iter().all(|&c| c <= 1.04),
                    "{rtt_ms} ms: copies per cluster {m:?}"
                );
            }
        }
        assert!(
            tps[2] > 1.3 * tps[1] && tps[2] > 1.3 * tps[0],
            "{rtt_ms} ms: tree, mob, hybrid {tps:?}"
        );
    }
}

/// With large pieces a request window of a few pieces is many seconds deep on a thin WAN
/// link: on the lab's slow links cluster C's last pieces sat queued behind B->C (6.4 Mbit/s,
/// 1.3 s per 1 MiB piece) long after D, whose link into C is five times faster, held them
/// all. Such requests are now moved (through a confirmed cancel, so never a second copy) to
/// a peer that would deliver them much sooner. Over seeds 1-7 C's tail after B and D went
/// from 12.8 s on average (8.2-17.1) to 7.0 s, and the throughput from 0.78 of the bound
/// to 0.83 (pieces under way on B->C cannot be moved: the rest of the tail).
#[test]
fn hybrid_moves_pieces_queued_behind_a_thin_link_to_a_faster_peer_that_holds_them() {
    let (mut tails, mut fractions) = (Vec::new(), Vec::new());
    for seed in 1..=7 {
        let (s, bound) = lab_slow_links([4; 4], Strategy::Hybrid, 600 * MIB, 1 << 20, seed);
        let r = sim::run(s);
        assert_all_done(&r, "hybrid, slow links, 1 MiB pieces");
        let cluster_done = |c: usize| {
            (4 * c..4 * c + 4)
                .filter_map(|n| r.done_at[n])
                .max()
                .expect("every node done")
                .as_secs_f64()
        };
        let (b, c, d) = (cluster_done(1), cluster_done(2), cluster_done(3));
        for x in 1..4 {
            assert!(
                r.wan_multiples()[x] <= 1.03,
                "seed {seed}: cluster {x}: {:?}",
                r.wan_multiples()
            );
        }
        tails.push(c - b.max(d));
        fractions.push(r.throughput() / bound);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!("C's tail after B and D: {tails:.1?} s; of the bound: {fractions:.3?}");
    assert!(mean(&tails) < 10.0, "C's tail: {tails:.1?} s");
    assert!(mean(&fractions) > 0.80, "of the bound: {fractions:.3?}");
}

/// The lab's unequal layout (1, 3, 4 and 8 members) on its slow links at 20 ms, 600 MB in
/// the driver's 256 KiB pieces. Each of the 8-member site's members pulls an eighth of a WAN
/// link, a fraction of a piece per round trip, so its rate asked for one request at a time, and
/// its connection idled a round trip after every piece: 0.89 of the bound. With a second
/// request queued wherever a piece takes under a second: 0.94.
#[test]
fn hybrid_keeps_each_members_share_of_a_wan_link_busy() {
    let (s, bound) = lab_slow_links([1, 3, 4, 8], Strategy::Hybrid, 600_000_000, 256 << 10, 4);
    let r = sim::run(s);
    assert_all_done(&r, "hybrid, unequal layout, slow links");
    let f = r.throughput() / bound;
    eprintln!("unequal layout, slow links: hybrid at {f:.3} of the bound");
    assert!(f >= 0.92, "{f:.3} of the bound");
}

#[test]
fn hybrid_deals_again_what_a_lost_target_held() {
    // The source deals to cluster B's tree entry (node 4); it disappears mid-transfer.
    let len = 16 * MIB;
    let mut s = spec(Strategy::Hybrid, len, Condition::FastLinks);
    s.lost = vec![(Duration::from_millis(600), 4)];
    let r = sim::run(s);
    assert!(r.lost[4]);
    assert_all_done(&r, "hybrid, target lost");
    assert!(r.elapsed < Duration::from_secs(60));
}

#[test]
fn broadcast_bound_is_the_min_cut_of_a_hand_computed_topology() {
    // Three clusters of one node: A (the source), B, C. A->B 4, A->C 1, B->C 2, C->B 0.5
    // (B->A and C->A 9, useless to a broadcast from A), access links 100.
    let topo = Topology {
        clusters: vec![1, 1, 1],
        access_up: 100.0,
        access_down: 100.0,
        lan_latency: Duration::ZERO,
        wan: vec![
            vec![0.0, 4.0, 1.0],
            vec![9.0, 0.0, 2.0],
            vec![9.0, 0.5, 0.0],
        ],
        wan_latency: Duration::ZERO,
    };
    // To B: 4 direct + 0.5 via C; to C: 1 direct + 2 via B.
    assert!((sim::max_flow(&topo, 0, 1) - 4.5).abs() < 1e-9);
    assert!((sim::max_flow(&topo, 0, 2) - 3.0).abs() < 1e-9);
    assert!((sim::broadcast_bound(&topo) - 3.0).abs() < 1e-9);
    // Two arborescences carry it (Edmonds): A->B->C at 2, A->C plus A->B at 1.
    // A slow source uplink caps everything.
    let mut slow = topo.clone();
    slow.access_up = 2.5;
    assert!((sim::broadcast_bound(&slow) - 2.5).abs() < 1e-9);
    // A second node in B adds nothing across the WAN, but is reached by the LAN.
    let mut two = topo.clone();
    two.clusters = vec![1, 2, 1];
    assert!((sim::max_flow(&two, 0, 2) - 4.5).abs() < 1e-9);
    assert!((sim::broadcast_bound(&two) - 3.0).abs() < 1e-9);
    // Time-varying: 30 bytes at 3/s while A->C and B->C are cut to nothing for the first
    // 5 s, then back: C gets nothing for 5 s, then 3/s for 10 s; B is done sooner.
    let change = |at: u64, from: usize, to: usize, rate: f64| WanChange {
        at: Duration::from_secs(at),
        from,
        to,
        rate,
    };
    let mut cut = topo.clone();
    cut.wan[0][2] = 0.0;
    cut.wan[1][2] = 0.0;
    let t = sim::bound_time(&cut, &[change(5, 0, 2, 1.0), change(5, 1, 2, 2.0)], 30);
    assert!((t.as_secs_f64() - 15.0).abs() < 1e-6, "{t:?}");
    assert!((sim::bound_rate(&topo, &[], 30) - 3.0).abs() < 1e-9);
}

#[test]
fn malformed_swarm_messages_are_errors() {
    let decode = |body: &[u8]| Frame::decode(Bytes::copy_from_slice(body));
    // A bitfield that claims 2^64-1 pieces in a few bytes.
    let mut b = vec![0x50, 0x01];
    b.extend_from_slice(&u64::MAX.to_be_bytes());
    b.extend_from_slice(&[0xff; 4]);
    assert_eq!(decode(&b), Err(WireError::Truncated("Swarm")));
    // Bits set beyond the last piece.
    let mut b = vec![0x50, 0x01];
    b.extend_from_slice(&3u64.to_be_bytes());
    b.push(0b1111_0000);
    assert!(matches!(decode(&b), Err(WireError::BadValue("Swarm", _))));
    // Unknown sub-type, missing sub-type, trailing bytes, truncated index.
    assert!(matches!(
        decode(&[0x50, 0x77]),
        Err(WireError::BadValue("Swarm", _))
    ));
    assert_eq!(decode(&[0x50]), Err(WireError::Truncated("Swarm")));
    assert!(matches!(
        decode(&[0x50, 0x05, 0]),
        Err(WireError::Trailing("Swarm", 1))
    ));
    assert_eq!(
        decode(&[0x50, 0x02, 0, 0, 0]),
        Err(WireError::Truncated("Swarm"))
    );
    // Every truncation of every message is an error.
    for m in [
        SwarmMsg::bitfield(20, |i| i % 2 == 0),
        SwarmMsg::Have { index: 3 },
        SwarmMsg::Complete { node: 9 },
        SwarmMsg::Cancelled { index: 4 },
    ] {
        let wire = Frame::Swarm(m.clone()).encode().to_vec();
        for cut in 0..wire.len() - 4 {
            assert!(
                decode(&wire[4..4 + cut]).is_err(),
                "{} cut at {cut}",
                m.kind()
            );
        }
    }
    // Random garbage after the type byte never panics.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
    for _ in 0..20_000 {
        let n = rng.gen_range(0..40);
        let mut v: Vec<u8> = vec![0x50];
        v.extend((0..n).map(|_| rng.gen::<u8>()));
        if v.len() > 1 && rng.gen_bool(0.5) {
            v[1] = rng.gen_range(0..14);
        }
        let _ = decode(&v);
    }

    // Well-formed frames with values a node must refuse.
    let keys = Keys::derive(&Secret::from_bytes([1; 32]));
    let now = Instant::now();
    let labels = [0, 0, 1, 1];
    let mut node = SwarmNode::new(
        SwarmConfig::new(Strategy::Mob, 5, 10),
        keys.clone(),
        &labels,
        2,
        None,
        now,
    )
    .unwrap();
    let have = Frame::Swarm(SwarmMsg::Have { index: 1 });
    assert_eq!(
        node.handle_frame(3, have.clone(), now),
        Err(SwarmError::UnknownPeer(3))
    );
    node.handle_connected(3, now);
    assert_eq!(node.handle_frame(3, have, now), Ok(()));
    assert!(matches!(
        node.handle_frame(3, Frame::Swarm(SwarmMsg::Have { index: 10 }), now),
        Err(SwarmError::OutOfRange(..))
    ));
    assert!(matches!(
        node.handle_frame(3, Frame::Request { index: 99 }, now),
        Err(SwarmError::OutOfRange(..))
    ));
    // A cancel confirmation for a piece never requested changes nothing; one beyond the
    // object is an error.
    let cancelled = |index| Frame::Swarm(SwarmMsg::Cancelled { index });
    assert_eq!(node.handle_frame(3, cancelled(2), now), Ok(()));
    assert!(matches!(
        node.handle_frame(3, cancelled(10), now),
        Err(SwarmError::OutOfRange(..))
    ));
    assert_eq!(
        node.handle_frame(3, Frame::Swarm(SwarmMsg::bitfield(11, |_| true)), now),
        Err(SwarmError::BadBitfield(11, 10))
    );
    assert!(matches!(
        node.handle_frame(3, Frame::Ping { nonce: 1 }, now),
        Err(SwarmError::Unexpected(_))
    ));
    // A forged chunk is dropped and reported, never stored.
    let mut c = keys.seal(5, 1, Bytes::from_static(b"piece"));
    c.data = Bytes::from_static(b"forge");
    node.handle_frame(3, Frame::Chunk(c), now).unwrap();
    assert!(matches!(
        node.poll_event(),
        Some(bulkcast_proto::swarm::SwarmEvent::Corrupt { index: 1, .. })
    ));
    assert!(!node.have().contains(1));
    // Tree strategies need a tree.
    assert!(matches!(
        SwarmNode::new(
            SwarmConfig::new(Strategy::Hybrid, 5, 10),
            keys,
            &labels,
            2,
            None,
            now
        ),
        Err(SwarmError::NoTree(_))
    ));
}

#[test]
fn peer_stats_tell_a_full_window_from_a_peer_with_nothing_to_give() {
    // MOB, two clusters of two: node 2 (cluster 1, rank 0) steals its share, pieces 0..10
    // of 20, from the source; its cluster mate 3 holds nothing yet.
    let keys = Keys::derive(&Secret::from_bytes([2; 32]));
    let now = Instant::now();
    let labels = [0, 0, 1, 1];
    let mut node = SwarmNode::new(
        SwarmConfig::new(Strategy::Mob, 5, 20),
        keys,
        &labels,
        2,
        None,
        now,
    )
    .unwrap();
    node.handle_connected(0, now);
    node.handle_connected(3, now);
    let all = Frame::Swarm(SwarmMsg::bitfield(20, |_| true));
    node.handle_frame(0, all, now).unwrap();
    let requests = std::iter::from_fn(|| node.poll_control(0, now))
        .filter(|f| matches!(f, Frame::Request { .. }))
        .count();
    assert_eq!(requests, 5, "R = 5 requests pipelined");
    let stats = node.peer_stats(now);
    let of = |n: NodeId| {
        stats
            .iter()
            .find(|s| s.peer == n)
            .expect("a connected peer")
    };
    let (source, mate) = (of(0), of(3));
    assert!(!source.local && mate.local);
    // The window is full and five more of its share wait: not a peer that ran dry.
    assert_eq!((source.outstanding, source.askable), (5, 5));
    assert_eq!((mate.outstanding, mate.askable), (0, 0));
    assert!(!source.stalled);
    assert_eq!(stats.len(), 2);
}

#[test]
fn hybrid_members_share_the_dealt_pieces_interleaved_so_each_fetches_from_the_start() {
    // Clusters: {0 (source), 1}, {2}, {3, 4, 5, 6}. Node 5 has rank 2 of 4 in its cluster;
    // node 2 holds the first 8 of 400 pieces, the first the deal sends out.
    let keys = Keys::derive(&Secret::from_bytes([3; 32]));
    let now = Instant::now();
    let labels = [0, 0, 1, 2, 2, 2, 2];
    // The planned tree: the source feeds 1 and each cluster's entry; 3 feeds its mates.
    let parents = vec![None, Some(0), Some(0), Some(0), Some(3), Some(3), Some(3)];
    let tree = Tree::from_parents(parents).unwrap();
    let asked = |shares: ShareLayout| {
        let mut cfg = SwarmConfig::new(Strategy::Hybrid, 6, 400);
        cfg.hybrid_shares = shares;
        let mut node = SwarmNode::new(cfg, keys.clone(), &labels, 5, Some(&tree), now).unwrap();
        node.handle_connected(2, now);
        let first = Frame::Swarm(SwarmMsg::bitfield(400, |i| i < 8));
        node.handle_frame(2, first, now).unwrap();
        std::iter::from_fn(|| node.poll_control(2, now))
            .filter_map(|f| match f {
                Frame::Request { index, .. } => Some(index),
                _ => None,
            })
            .collect::<Vec<u64>>()
    };
    // Interleaved: its share is every fourth piece from 2 on, so it asks for 2 and 6 at once.
    assert_eq!(asked(ShareLayout::Interleaved), vec![2, 6]);
    // Blocks (MOB's): its share is pieces 200..300, so it has nothing to fetch until the deal
    // gets there, half-way through.
    assert_eq!(asked(ShareLayout::Blocks), Vec::<u64>::new());
}

/// The source's session timer on the simulated clock: a member that hangs with its
/// connections up (it reads and sends nothing) is given up once nothing moved for the stall
/// timeout, and the session ends then.
#[test]
fn the_source_session_gives_up_on_a_hung_member_after_the_stall_timeout() {
    let hung: NodeId = 6;
    let stall = Duration::from_secs(5);
    let mut s = spec(Strategy::Mob, 8 * MIB, Condition::FastLinks);
    s.time_limit = Duration::from_secs(120);
    s.frozen = vec![(Duration::from_millis(300), hung)];
    // Without the session nothing gives up on it: the run only stops when nothing is left to
    // happen (a driver would wait for ever).
    let without = sim::run(s.clone());
    assert!(!without.all_done);
    assert!(without.incomplete().contains(&hung));
    assert!(without.outcomes.is_empty());
    s.stall_timeout = Some(stall);
    let r = sim::run(s);
    let no_progress = Outcome::Failed("no progress for 5 s".into());
    assert_eq!(r.outcomes[hung], Some(no_progress.clone()));
    assert!(r.done_at[hung].is_none());
    // Every other member reported, or was given up with it when it too stopped moving.
    let mut last_move = Duration::ZERO;
    for j in (1..r.outcomes.len()).filter(|&j| j != hung) {
        match (&r.outcomes[j], r.done_at[j]) {
            (Some(Outcome::Reported(got)), Some(t)) => {
                assert!(got.iter().map(|&(_, b)| b).sum::<u64>() >= r.object_len);
                last_move = last_move.max(t);
            }
            (o, None) => assert_eq!(o.as_ref(), Some(&no_progress), "node {j}"),
            (o, t) => panic!("node {j}: {o:?} done at {t:?}"),
        }
    }
    assert!(r.elapsed >= last_move + stall, "{:?}", r.elapsed);
    assert!(r.elapsed < Duration::from_secs(60), "{:?}", r.elapsed);
}

/// Nothing stalls: the session ends with the completion tree, every receiver's report in,
/// at the same simulated time as a run without it.
#[test]
fn the_source_session_ends_with_the_tree_when_every_member_reports() {
    for strategy in Strategy::ALL {
        let s = spec(strategy, 6 * MIB, Condition::FastLinks);
        let plain = sim::run(s.clone());
        let mut with = s;
        with.stall_timeout = Some(Duration::from_secs(5));
        let r = sim::run(with);
        assert_all_done(&r, strategy.name());
        assert_eq!(r.elapsed, plain.elapsed, "{}", strategy.name());
        assert!(r.outcomes[0].is_none());
        for (j, o) in r.outcomes.iter().enumerate().skip(1) {
            assert!(
                matches!(o, Some(Outcome::Reported(_))),
                "{}: node {j}: {o:?}",
                strategy.name()
            );
        }
    }
}

/// Pure push cannot route around a lost relay: with the session, its stranded subtree is
/// given up after the stall timeout (the driver's end), not left for the run to run dry.
#[test]
fn the_source_session_gives_up_a_lost_relays_stranded_subtree() {
    let topo = Topology::four_clusters([4; 4], Duration::from_millis(20));
    let tree = plan_tree(&topo);
    let lost: NodeId = 5;
    let mut s = spec(Strategy::TreePush, 8 * MIB, Condition::FastLinks);
    s.lost = vec![(Duration::from_millis(700), lost)];
    s.stall_timeout = Some(Duration::from_secs(5));
    let r = sim::run(s);
    assert_eq!(r.outcomes[lost], Some(Outcome::Failed("lost".into())));
    for n in tree.subtree(lost).into_iter().filter(|&n| n != lost) {
        assert_eq!(
            r.outcomes[n],
            Some(Outcome::Failed("no progress for 5 s".into())),
            "node {n}"
        );
    }
    let last = (1..r.done_at.len()).filter_map(|j| r.done_at[j]).max();
    assert_eq!(r.elapsed, last.unwrap() + Duration::from_secs(5));
}
