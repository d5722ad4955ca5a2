//! Where a feed relay joins the relay tree: the choice of its parent among the servers it
//! found and measured, sans-IO.
//!
//! A relay started with `--upstream SOURCE` asks the source for its relay children, then
//! those for theirs (breadth first, bounded), measures the round trip to each, and attaches
//! below the nearest one with room: a greedy nearest-parent join (a relay stays where it
//! joined until its parent dies; the tree is never re-optimised). The source is kept unless
//! a relay is *clearly* nearer (a round trip under [`CLEARLY_NEARER`] of the source's): a
//! relay at the same distance as the source saves nothing and adds a hop (its queue, its
//! failures), while one at the relay's own site (a LAN round trip against a WAN one) is what
//! the tree is for: one relay per site, the WAN crossed once.

use serde::Serialize;

/// A relay wins over the source only with a round trip under this share of the source's.
pub const CLEARLY_NEARER: f64 = 0.5;

/// A server found while joining, as measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// Its address, as its subscribers reach it (`HOST:PORT`).
    pub addr: String,
    /// The source (the root the relay was given), not a relay.
    pub source: bool,
    /// The smallest round trip measured to it, microseconds.
    pub rtt_us: u64,
    /// Its allow rules admit this relay.
    pub admits: bool,
    /// Relay children it has now.
    pub children: u32,
    /// Relay children it takes at most.
    pub max_children: u32,
    /// The servers above it, the source first.
    pub ancestry: Vec<String>,
    /// It carries every product the joiner wants ([`carries`]).
    pub carries: bool,
    /// It still holds the product the joiner resumes from (its floor is not past it).
    pub holds: bool,
}

impl Candidate {
    /// Whether a relay at `me` may attach below it: it is not `me`, not below `me` (`me` in
    /// its ancestry: a loop), not `dead`, admits it, carries what it wants and still holds
    /// where it resumes, and has room.
    pub fn eligible(&self, me: &str, dead: &[String]) -> bool {
        self.admits
            && self.carries
            && self.holds
            && self.addr != me
            && !self.ancestry.iter().any(|a| a == me)
            && !dead.contains(&self.addr)
            && self.children < self.max_children
    }
}

/// Whether a server relaying `feedtype` / `name` (regex, "" for any) carries every product a
/// relay wanting `want_feedtype` / `want_name` takes: it carries everything (`ANY`, any name),
/// or exactly the same filter. A narrower parent would leave the joiner a subset with no
/// product counted lost, and telling whether one pattern covers another is not worth the risk.
pub fn carries(feedtype: &str, name: &str, want_feedtype: &str, want_name: &str) -> bool {
    (feedtype == "ANY" && name.is_empty()) || (feedtype == want_feedtype && name == want_name)
}

/// Whether a server whose oldest product is `floor` still holds what a relay resuming from
/// `from` needs (`None`: it starts now or from a time, so anything held will do).
pub fn holds(floor: u64, from: Option<u64>) -> bool {
    from.is_none_or(|f| floor <= f)
}

/// The parent chosen, and why (for the status and the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    /// Index of the chosen candidate.
    pub index: usize,
    /// Why it, in words.
    pub why: String,
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

/// The parent of a relay at `me` among `found` (in the order found: ties go to the earlier,
/// which breadth first is the one nearer the source), `dead` excluded. `None`: no candidate
/// is eligible ([`Candidate::eligible`]).
pub fn choose(me: &str, found: &[Candidate], dead: &[String]) -> Option<Pick> {
    let ok = |c: &Candidate| c.eligible(me, dead);
    let src = found.iter().position(|c| c.source && ok(c));
    // `min_by_key` keeps the first of equal keys: ties are stable.
    let relay = found
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.source && ok(c))
        .min_by_key(|(_, c)| c.rtt_us);
    match (src, relay) {
        (Some(s), Some((r, rc)))
            if (rc.rtt_us as f64) < found[s].rtt_us as f64 * CLEARLY_NEARER =>
        {
            Some(Pick {
                index: r,
                why: format!(
                    "relay {} at {} is under half the source's {}",
                    rc.addr,
                    ms(rc.rtt_us),
                    ms(found[s].rtt_us)
                ),
            })
        }
        (Some(s), r) => Some(Pick {
            index: s,
            why: match r {
                Some((_, rc)) => format!(
                    "the source at {}: the nearest relay with room, {} at {}, is not under half",
                    ms(found[s].rtt_us),
                    rc.addr,
                    ms(rc.rtt_us)
                ),
                None => format!("the source at {}: no relay with room", ms(found[s].rtt_us)),
            },
        }),
        (None, Some((r, rc))) => Some(Pick {
            index: r,
            why: format!(
                "the nearest relay with room, at {} (the source is full, dead or unmeasured)",
                ms(rc.rtt_us)
            ),
        }),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(addr: &str, source: bool, rtt_us: u64, children: u32, ancestry: &[&str]) -> Candidate {
        Candidate {
            addr: addr.into(),
            source,
            rtt_us,
            admits: true,
            children,
            max_children: 2,
            ancestry: ancestry.iter().map(|s| s.to_string()).collect(),
            carries: true,
            holds: true,
        }
    }

    fn pick(me: &str, found: &[Candidate], dead: &[&str]) -> Option<String> {
        let dead: Vec<String> = dead.iter().map(|s| s.to_string()).collect();
        choose(me, found, &dead).map(|p| found[p.index].addr.clone())
    }

    #[test]
    fn the_nearest_relay_wins_when_clearly_nearer_than_the_source() {
        let found = [
            c("src", true, 40_000, 1, &[]),
            c("a", false, 30_000, 0, &["src"]),
            c("b", false, 1_000, 0, &["src", "a"]),
            c("d", false, 2_000, 0, &["src"]),
        ];
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("b"));
        let p = choose("me", &found, &[]).unwrap();
        assert!(p.why.contains("under half"), "{}", p.why);
    }

    #[test]
    fn the_source_is_kept_unless_a_relay_is_clearly_nearer() {
        // 20 ms is exactly half of 40 ms: not under it.
        let found = [
            c("src", true, 40_000, 0, &[]),
            c("a", false, 20_000, 0, &["src"]),
        ];
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("src"));
        let found = [
            c("src", true, 40_000, 0, &[]),
            c("a", false, 19_999, 0, &["src"]),
        ];
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("a"));
        assert_eq!(
            pick("me", &[c("src", true, 5, 0, &[])], &[]).as_deref(),
            Some("src"),
            "alone"
        );
    }

    #[test]
    fn a_full_parent_is_skipped() {
        let found = [
            c("src", true, 1_000, 2, &[]),
            c("a", false, 900, 2, &["src"]),
            c("b", false, 5_000, 1, &["src", "a"]),
        ];
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("b"));
        let p = choose("me", &found, &[]).unwrap();
        assert!(p.why.contains("source is full"), "{}", p.why);
        let full = [c("src", true, 1_000, 2, &[]), c("a", false, 9, 2, &["src"])];
        assert_eq!(pick("me", &full, &[]), None, "no room anywhere");
    }

    #[test]
    fn its_own_subtree_itself_and_dead_servers_are_excluded() {
        let found = [
            c("src", true, 40_000, 2, &[]),
            c("me", false, 10, 0, &["src"]),
            c("child", false, 100, 0, &["src", "me"]),
            c("grandchild", false, 200, 0, &["src", "me", "child"]),
            c("dead", false, 300, 0, &["src"]),
            c("far", false, 9_000, 1, &["src", "dead"]),
        ];
        assert_eq!(pick("me", &found, &["dead"]).as_deref(), Some("far"));
        assert_eq!(pick("me", &found, &["dead", "far"]), None);
        // The source dead too: nothing left, whatever its round trip.
        let src_dead = [c("src", true, 1, 0, &[])];
        assert_eq!(pick("me", &src_dead, &["src"]), None);
    }

    #[test]
    fn a_relay_whose_allow_rules_refuse_this_one_is_skipped() {
        let mut found = vec![
            c("src", true, 40_000, 0, &[]),
            c("other-site", false, 1_000, 0, &["src"]),
        ];
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("other-site"));
        found[1].admits = false;
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("src"));
    }

    #[test]
    fn a_relay_that_lacks_products_the_joiner_wants_is_skipped() {
        // Carries: everything, or exactly the same filter; never a narrower one.
        assert!(carries("ANY", "", "NEXRAD3", "^KTLX"));
        assert!(carries("NEXRAD3", "^KTLX", "NEXRAD3", "^KTLX"));
        assert!(!carries("NEXRAD3", "", "ANY", ""));
        assert!(!carries("ANY", "^KTLX", "ANY", ""));
        assert!(
            !carries("NEXRAD3", "", "NEXRAD3", "^KTLX"),
            "not proven to cover"
        );
        // Holds: its floor is not past where the joiner resumes.
        assert!(holds(100, Some(100)) && holds(100, None));
        assert!(!holds(101, Some(100)));
        let mut found = vec![
            c("src", true, 40_000, 0, &[]),
            c("narrow", false, 1_000, 0, &["src"]),
            c("evicted", false, 1_000, 0, &["src"]),
        ];
        found[1].carries = false;
        found[2].holds = false;
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("src"));
        found[2].holds = true;
        assert_eq!(pick("me", &found, &[]).as_deref(), Some("evicted"));
    }

    #[test]
    fn ties_go_to_the_first_found() {
        let found = [
            c("src", true, 40_000, 2, &[]),
            c("a", false, 1_000, 0, &["src"]),
            c("b", false, 1_000, 0, &["src"]),
            c("c", false, 1_000, 0, &["src", "a"]),
        ];
        for _ in 0..3 {
            assert_eq!(pick("me", &found, &[]).as_deref(), Some("a"));
        }
        let mut rev = found.clone();
        rev[1..].reverse();
        assert_eq!(pick("me", &rev, &[]).as_deref(), Some("c"));
    }
}
