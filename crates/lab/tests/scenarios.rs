//! Every shipped scenario parses, resolves, and says where its numbers come from.

use std::path::Path;

use bulkcast_lab::Scenario;

#[test]
fn shipped_scenarios_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# "),
            "{}: starts with a comment on its sources",
            path.display()
        );
        let sc = Scenario::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let layout = sc.resolve().unwrap();
        assert!(layout.hosts.len() >= 2, "{}", path.display());
        n += 1;
    }
    assert!(n >= 20, "only {n} scenarios found");
}

#[test]
fn seed000_has_the_papers_rtt_matrix() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/seed000-aws5.toml");
    let layout = Scenario::load(&path).unwrap().resolve().unwrap();
    let site = |n: &str| layout.sites.iter().position(|s| s == n).unwrap();
    let rtt = |a: &str, b: &str| {
        let l = layout.site_links[site(a)][site(b)].unwrap();
        let r = layout.site_links[site(b)][site(a)].unwrap();
        (layout.links[l].delay_ns + layout.links[r].delay_ns) as f64 / 1e6
    };
    assert_eq!(rtt("frankfurt", "london"), 13.0);
    assert_eq!(rtt("singapore", "canada"), 219.0);
    assert_eq!(rtt("oregon", "canada"), 65.0);
    assert_eq!(layout.hosts.len(), 15);
    assert_eq!(layout.hosts[layout.source].name, "london-1");
}
