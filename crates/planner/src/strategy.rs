//! What a send does when the user leaves it to bulkcast: the strategy `auto` stands for, and
//! the chunk (piece) size.
//!
//! These are decisions, not I/O: they live here so that tests and programs that embed bulkcast
//! make the same choices as `bulkcast send` without its CLI.

use bulkcast_proto::tree::Tree;

/// How a send spreads the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Chosen from the send's shape by [`choose`].
    Auto,
    /// The source feeds every receiver itself.
    Flat,
    /// Receivers relay down one tree (planned, or a fixed fan-out).
    Tree,
    /// The planner's multi-trees, each carrying a share of the chunks.
    Balanced,
    /// Receiver-driven swarming, each site pulling each piece over the WAN once (MOB).
    Mob,
    /// A BitTorrent-style swarm (the baseline).
    Swarm,
    /// Push down a tree, pull across sites what push will not bring in time.
    Hybrid,
    /// One file by IP multicast on a LAN, lost datagrams repaired with parity; receivers the
    /// group does not reach get it down the tree.
    Multicast,
}

/// Largest object a swarm holds in memory: a directory (its pieces straddle files) or a
/// stream. A single file swarms at any size, its pieces served from disk.
pub const MAX_SWARM_BYTES: u64 = 2 << 30;

/// Smallest object `auto` sends by `hybrid` rather than `mob` across sites. In the lab's size
/// sweep (docs/notes/swarm-size-sweep.md, re-run 2026-11-23 with the hybrid's small pieces,
/// three runs at 512 KiB and 4 MiB; the current sweep is in docs/benchmarks.md) MOB was ahead
/// of the hybrid at 512 KiB in 5 of 6 runs, with one copy per site against the hybrid's
/// 1.4-1.75 (its endgame doubles requests when a few pieces are all there is); from 4 MiB the
/// hybrid was ahead at 20 ms (3 of 3) and level at 100 ms. The push tree was behind both at
/// every size from 32 KiB: a tree connects level by level, a WAN round trip per hop, where a
/// swarm dials every member at once.
pub const AUTO_HYBRID_MIN_BYTES: u64 = 2 << 20;

/// Smallest file `auto` sends by multicast on a LAN. Below it the multicast set-up (joining
/// the group, the check that it reaches every receiver, the rate's train) weighs more than
/// what it saves; above it, every receiver takes the data at the link rate without relaying
/// it, which a TCP chain cannot hold under random loss: on the lab's `star-8` with 1% loss
/// (128 MiB) the chain read 0.72 of the link, multicast 0.83 (docs/notes/line-rate.md).
pub const AUTO_MULTICAST_MIN_BYTES: u64 = 32 << 20;

/// Fewest receivers `auto` multicasts to. One receiver shares nothing: its TCP connection
/// holds the link (bbr under random loss too) without the group's set-up, its rate's train
/// and its pacer. On loopback 1 GiB to one agent took 7.1-7.2 s by multicast and 3.1-3.8 s by
/// the tree (2026-11-28).
pub const AUTO_MULTICAST_MIN_RECEIVERS: usize = 2;

/// What the choice of strategy looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendShape {
    /// The object's length (`None`: a stream of unknown length).
    pub len: Option<u64>,
    /// The object is one regular file (a swarm serves its pieces from disk).
    pub single_file: bool,
    /// Distinct sites among the source and the hosts (from the hosts file).
    pub sites: usize,
    /// Receivers named (0: not known, as with a ticket).
    pub receivers: usize,
    /// Receivers joined with a ticket: they take only their parent's connection.
    pub ticket: bool,
    /// The user fixed the tree's fan-out.
    pub fanout: bool,
    /// Every receiver is on a network the source is attached to (no router between them), so
    /// IP multicast with a TTL of 1 can reach them.
    pub lan: bool,
}

impl SendShape {
    /// One regular file of `len` bytes (`None`: a stream of unknown length) to hosts in `sites`
    /// sites, nothing else said: no ticket, no fixed fan-out, not all on the source's LAN.
    pub fn file(len: Option<u64>, sites: usize) -> SendShape {
        SendShape {
            len,
            single_file: true,
            sites,
            receivers: 0,
            ticket: false,
            fanout: false,
            lan: false,
        }
    }
}

/// The strategy to run: `requested` unless it is [`Strategy::Auto`], which means a swarm where
/// swarming pays (an object of known, non-zero length, a file or a directory of at most
/// [`MAX_SWARM_BYTES`], hosts in two or more sites, receivers that can reach each other: not
/// ticket mode, no fixed fan-out): `hybrid` from [`AUTO_HYBRID_MIN_BYTES`], `mob` below;
/// multicast for one file of at least [`AUTO_MULTICAST_MIN_BYTES`] to at least
/// [`AUTO_MULTICAST_MIN_RECEIVERS`] receivers on the source's LAN (one site, not ticket mode,
/// no fixed fan-out); the tree otherwise.
pub fn choose(requested: Strategy, shape: &SendShape) -> Strategy {
    if requested != Strategy::Auto {
        return requested;
    }
    let free = !shape.ticket && !shape.fanout;
    let fits = |l: u64| l > 0 && (shape.single_file || l <= MAX_SWARM_BYTES);
    let swarm = free && shape.sites >= 2 && shape.len.is_some_and(fits);
    let multicast = free
        && shape.lan
        && shape.single_file
        && shape.sites <= 1
        && shape.receivers >= AUTO_MULTICAST_MIN_RECEIVERS
        && shape.len.is_some_and(|l| l >= AUTO_MULTICAST_MIN_BYTES);
    match shape.len {
        Some(l) if swarm && l >= AUTO_HYBRID_MIN_BYTES => Strategy::Hybrid,
        _ if swarm => Strategy::Mob,
        _ if multicast => Strategy::Multicast,
        _ => Strategy::Tree,
    }
}

/// The default chunk size of a push down `tree`. Every relay forwards a chunk only once it is
/// whole and verified, so each hop adds one chunk's serialization time: a tree of depth d costs
/// about `d * chunk / size` of the transfer time. The largest power of two that keeps that
/// under 1%, between 64 KiB (per-chunk costs) and 1 MiB; streams of unknown size get 256 KiB.
pub fn push_chunk_size(len: Option<u64>, tree: &Tree) -> u32 {
    const MIN: u64 = 64 << 10;
    const MAX: u64 = 1 << 20;
    let Some(len) = len else { return 256 << 10 };
    let depth = (1..tree.len())
        .map(|i| tree.depth(i))
        .max()
        .unwrap_or(1)
        .max(1) as u64;
    floor_pow2((len / 100 / depth).clamp(MIN, MAX))
}

/// The default piece size of the hybrid. Pulls work in whole pieces: a request window is a few
/// pieces deep at least, so a cluster's last pieces queued behind a thin WAN link wait about
/// `window * piece / link rate` (three 1 MiB pieces are 4 s at 6.4 Mbit/s). In the seed 004
/// simulation (`swarm_sim --lab`, 600 MB, slow links) the hybrid reads 0.87 of the bound with
/// 1 MiB pieces, 0.90 with 512 KiB and 0.93 with 256 KiB. So: about a thousandth of the
/// object, a power of two between 64 KiB (per-piece costs) and 256 KiB; 256 KiB when the size
/// is unknown.
pub fn hybrid_chunk_size(len: Option<u64>) -> u32 {
    const MIN: u64 = 64 << 10;
    const MAX: u64 = 256 << 10;
    floor_pow2(len.map_or(MAX, |l| (l / 1000).clamp(MIN, MAX)))
}

/// The round trip from which a hop counts as long: chunks then travel in verified parts.
pub const PARTS_FROM_RTT_MS: f64 = 2.0;

/// How big the verified parts of a push's chunks are (`NodeConfig::part_bytes`; 0: whole
/// chunks), given the longest round trip of a tree hop, where it was measured.
///
/// On a long hop a relay that waits for a whole chunk waits several round trips while TCP
/// ramps up (0.7 s per hop at 200 ms in the lab), so parts of one 16 KiB group go there. On a
/// LAN or loopback a chunk arrives in milliseconds, while each part costs a frame and often a
/// system call: on loopback 16 KiB parts took 2.1-3.6 CPU-s per GiB against 1.4-1.6 whole
/// (`bench/loopback.sh`, two runs each). Where nothing was measured: whole chunks.
pub fn part_bytes(longest_hop_rtt_ms: Option<f64>) -> usize {
    match longest_hop_rtt_ms {
        Some(rtt) if rtt >= PARTS_FROM_RTT_MS => bulkcast_proto::groups::GROUP,
        _ => 0,
    }
}

/// The default piece size of `strategy` for an object of `len` bytes sent over `tree` (the
/// swarms without a tree pass a flat one).
pub fn chunk_size(strategy: Strategy, len: Option<u64>, tree: &Tree) -> u32 {
    match strategy {
        // The hybrid's windows follow each peer's rate, so it can use small pieces; MOB and the
        // swarm baseline keep a fixed number of requests per peer, which small pieces would
        // starve at long round trips.
        Strategy::Hybrid => hybrid_chunk_size(len),
        _ => push_chunk_size(len, tree),
    }
}

/// `v` (at least 1) rounded down to a power of two, as a chunk size.
fn floor_pow2(v: u64) -> u32 {
    (1u64 << (63 - v.max(1).leading_zeros())) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_swarms_across_sites_and_pushes_otherwise() {
        let auto = |s: &SendShape| choose(Strategy::Auto, s);
        assert_eq!(auto(&SendShape::file(Some(1 << 30), 2)), Strategy::Hybrid);
        assert_eq!(auto(&SendShape::file(Some(1 << 20), 2)), Strategy::Mob);
        assert_eq!(
            auto(&SendShape::file(Some(1 << 30), 1)),
            Strategy::Tree,
            "one site"
        );
        assert_eq!(auto(&SendShape::file(None, 3)), Strategy::Tree, "a stream");
        assert_eq!(
            auto(&SendShape::file(Some(0), 3)),
            Strategy::Tree,
            "nothing to pull"
        );
        let dir = SendShape {
            single_file: false,
            ..SendShape::file(Some(MAX_SWARM_BYTES + 1), 2)
        };
        assert_eq!(auto(&dir), Strategy::Tree, "a directory too big to hold");
        let ticket = SendShape {
            ticket: true,
            ..SendShape::file(Some(1 << 30), 2)
        };
        assert_eq!(auto(&ticket), Strategy::Tree);
        let fixed = SendShape {
            fanout: true,
            ..SendShape::file(Some(1 << 30), 2)
        };
        assert_eq!(auto(&fixed), Strategy::Tree);
        // One big file to a LAN: multicast; not a small one, a directory, a ticket, a fixed
        // fan-out, one receiver, or hosts beyond a router.
        let lan = |len| SendShape {
            lan: true,
            receivers: 8,
            ..SendShape::file(Some(len), 1)
        };
        assert_eq!(
            auto(&SendShape {
                receivers: AUTO_MULTICAST_MIN_RECEIVERS,
                ..lan(1 << 30)
            }),
            Strategy::Multicast
        );
        assert_eq!(auto(&lan(1 << 30)), Strategy::Multicast);
        assert_eq!(auto(&lan(AUTO_MULTICAST_MIN_BYTES - 1)), Strategy::Tree);
        let not = [
            SendShape {
                single_file: false,
                ..lan(1 << 30)
            },
            SendShape {
                ticket: true,
                ..lan(1 << 30)
            },
            SendShape {
                fanout: true,
                ..lan(1 << 30)
            },
            SendShape {
                receivers: 1,
                ..lan(1 << 30)
            },
            SendShape::file(Some(1 << 30), 1),
        ];
        assert!(not.iter().all(|s| auto(s) == Strategy::Tree));
        // A strategy the user named is kept.
        assert_eq!(
            choose(Strategy::Flat, &SendShape::file(Some(1 << 30), 2)),
            Strategy::Flat
        );
    }

    #[test]
    fn push_chunks_keep_the_depth_under_a_percent_of_the_transfer() {
        let chain = Tree::kary(16, 1);
        // 128 MiB over depth 16: 128 MiB / 100 / 16 = 84 KiB, down to 64 KiB.
        assert_eq!(push_chunk_size(Some(128 << 20), &chain), 64 << 10);
        assert_eq!(push_chunk_size(Some(8 << 30), &Tree::flat(4)), 1 << 20);
        assert_eq!(push_chunk_size(Some(1 << 10), &chain), 64 << 10);
        assert_eq!(push_chunk_size(None, &chain), 256 << 10);
        assert_eq!(part_bytes(Some(50.0)), 16 << 10);
        assert_eq!(part_bytes(Some(0.3)), 0);
        assert_eq!(part_bytes(None), 0);
    }

    #[test]
    fn hybrid_pieces_are_a_thousandth_of_the_object_between_64_and_256_kib() {
        assert_eq!(hybrid_chunk_size(Some(600 << 20)), 256 << 10);
        assert_eq!(hybrid_chunk_size(Some(128 << 20)), 128 << 10);
        assert_eq!(hybrid_chunk_size(Some(32 << 20)), 64 << 10);
        assert_eq!(hybrid_chunk_size(Some(32 << 10)), 64 << 10);
        assert_eq!(hybrid_chunk_size(None), 256 << 10);
        let flat = Tree::flat(3);
        assert_eq!(
            chunk_size(Strategy::Hybrid, Some(600 << 20), &flat),
            256 << 10
        );
        assert_eq!(chunk_size(Strategy::Mob, Some(8 << 30), &flat), 1 << 20);
    }
}
