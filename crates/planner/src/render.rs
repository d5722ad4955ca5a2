//! Plans as text, DOT and SVG. The SVG is drawn here (a layered layout: depth down the page,
//! leaves spread across it, parents centred over their children), so no graphviz is needed.

use std::fmt::Write as _;

use bulkcast_proto::tree::{NodeId, Tree};

use crate::network::Resources;
use crate::plan::human_rate;
use crate::rate::usage;
use crate::{Bound, Network, Plan};

/// Fill colours by site id (cycled).
const PALETTE: [&str; 10] = [
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#d9d9d9", "#bc80bd",
];
/// Edge colours by tree index (cycled).
const TREE_COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

impl Plan {
    /// The plan as an indented tree per tree: each edge with its RTT and predicted rate (the
    /// tree's rate, with the edge's own share limit), then the bound and the fraction.
    pub fn render_text(&self, net: &Network, bound: Option<&Bound>) -> String {
        let res = net.resources();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plan: {} -- predicted {}, {:.2} s to deliver",
            self.algorithm,
            human_rate(self.rate_mbps),
            self.completion_secs
        );
        if let Some(b) = bound {
            let _ = writeln!(
                out,
                "bound: {} ({}), plan reaches {:.1}%",
                human_rate(b.rate_mbps),
                if b.exact { "LP optimum" } else { "upper bound" },
                100.0 * b.fraction(self.rate_mbps)
            );
        }
        let _ = writeln!(out, "why: {}", self.reason);
        for (k, (tree, rate)) in self.trees.iter().enumerate() {
            if self.trees.len() > 1 {
                let _ = writeln!(
                    out,
                    "tree {} of {} at {}",
                    k + 1,
                    self.trees.len(),
                    human_rate(*rate)
                );
            }
            let limits = edge_limits(&res, tree);
            let _ = writeln!(out, "{}", label(net, 0));
            walk(net, tree, 0, "", *rate, &limits, &mut out);
        }
        out
    }

    /// The plan in Graphviz DOT: nodes filled by site, edges labelled with RTT and rate;
    /// in multi-tree plans each tree's edges have their own colour.
    pub fn to_dot(&self, net: &Network) -> String {
        let (site, _) = net.site_ids();
        let mut out =
            String::from("digraph plan {\n  node [shape=box, style=\"rounded,filled\"];\n");
        for v in 0..net.len() {
            let _ = writeln!(
                out,
                "  n{v} [label=\"{}\", fillcolor=\"{}\"];",
                dot_escape(&label(net, v)),
                PALETTE[site[v] % PALETTE.len()]
            );
        }
        for (k, (tree, rate)) in self.trees.iter().enumerate() {
            let colour = TREE_COLOURS[k % TREE_COLOURS.len()];
            let prefix = if self.trees.len() > 1 {
                format!("t{}: ", k + 1)
            } else {
                String::new()
            };
            for (c, p) in tree.parents().iter().enumerate() {
                if let Some(p) = p {
                    let _ = writeln!(
                        out,
                        "  n{p} -> n{c} [label=\"{prefix}{:.1} ms\\n{}\", color=\"{colour}\"];",
                        net.rtt(*p, c),
                        human_rate(*rate)
                    );
                }
            }
        }
        out.push_str("}\n");
        out
    }

    /// The plan as a standalone SVG document, one panel per tree.
    pub fn to_svg(&self, net: &Network) -> String {
        const DX: f64 = 110.0;
        const DY: f64 = 90.0;
        const MARGIN: f64 = 40.0;
        let (site, _) = net.site_ids();
        let layouts: Vec<(Vec<f64>, Vec<usize>)> =
            self.trees.iter().map(|(t, _)| layout(t)).collect();
        let width = layouts
            .iter()
            .map(|(x, _)| x.iter().copied().fold(0.0, f64::max))
            .fold(0.0, f64::max)
            * DX
            + 2.0 * MARGIN
            + DX;
        let heights: Vec<f64> = layouts
            .iter()
            .map(|(_, d)| (*d.iter().max().unwrap_or(&0) as f64 + 1.0) * DY + MARGIN)
            .collect();
        const LEGEND: f64 = 24.0;
        let height: f64 = heights.iter().sum::<f64>() + MARGIN + LEGEND;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
             font-family=\"sans-serif\" font-size=\"11\">"
        );
        let _ = writeln!(out, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
        // Legend: one swatch per site, in site-id order.
        let mut first_of_site: Vec<Option<NodeId>> =
            vec![None; site.iter().max().map_or(0, |m| m + 1)];
        for (v, &s) in site.iter().enumerate() {
            first_of_site[s].get_or_insert(v);
        }
        let mut x = MARGIN;
        for (s, v) in first_of_site.iter().enumerate() {
            let label = v.and_then(|v| net.site(v)).unwrap_or("(no site)");
            let _ = writeln!(
                out,
                "<circle cx=\"{:.0}\" cy=\"{:.0}\" r=\"6\" fill=\"{}\" stroke=\"#333\"/>\
                 <text x=\"{:.0}\" y=\"{:.0}\">{}</text>",
                x + 6.0,
                MARGIN - 4.0,
                PALETTE[s % PALETTE.len()],
                x + 16.0,
                MARGIN,
                xml_escape(label)
            );
            x += 30.0 + 7.0 * label.chars().count() as f64;
        }
        let mut top = MARGIN + LEGEND;
        for (k, ((tree, rate), (xs, depth))) in self.trees.iter().zip(&layouts).enumerate() {
            let pos = |v: NodeId| {
                (
                    MARGIN + DX / 2.0 + xs[v] * DX,
                    top + 20.0 + depth[v] as f64 * DY,
                )
            };
            let _ = writeln!(
                out,
                "<text x=\"{MARGIN}\" y=\"{:.0}\" font-weight=\"bold\">{} tree {} of {}: {}</text>",
                top,
                self.algorithm,
                k + 1,
                self.trees.len(),
                xml_escape(&human_rate(*rate))
            );
            let colour = TREE_COLOURS[k % TREE_COLOURS.len()];
            for (c, p) in tree.parents().iter().enumerate() {
                if let Some(p) = *p {
                    let (x1, y1) = pos(p);
                    let (x2, y2) = pos(c);
                    let _ = writeln!(
                        out,
                        "<line x1=\"{x1:.0}\" y1=\"{y1:.0}\" x2=\"{x2:.0}\" y2=\"{y2:.0}\" \
                         stroke=\"{colour}\" stroke-width=\"1.5\"/>"
                    );
                    let _ = writeln!(
                        out,
                        "<text x=\"{:.0}\" y=\"{:.0}\" fill=\"#444\" text-anchor=\"middle\">{:.1} ms</text>",
                        (x1 + x2) / 2.0 + 4.0,
                        (y1 + y2) / 2.0,
                        net.rtt(p, c)
                    );
                }
            }
            for v in 0..tree.len() {
                let (x, y) = pos(v);
                let _ = writeln!(
                    out,
                    "<circle cx=\"{x:.0}\" cy=\"{y:.0}\" r=\"9\" fill=\"{}\" stroke=\"#333\"/>",
                    PALETTE[site[v] % PALETTE.len()]
                );
                let _ = writeln!(
                    out,
                    "<text x=\"{x:.0}\" y=\"{:.0}\" text-anchor=\"middle\">{}</text>",
                    y + 22.0,
                    xml_escape(net.name(v))
                );
            }
            top += heights[k];
        }
        out.push_str("</svg>\n");
        out
    }
}

fn walk(
    net: &Network,
    tree: &Tree,
    v: NodeId,
    indent: &str,
    rate: f64,
    limits: &[f64],
    out: &mut String,
) {
    let kids = tree.children(v);
    for (k, &c) in kids.iter().enumerate() {
        let last = k + 1 == kids.len();
        let _ = writeln!(
            out,
            "{indent}{}{}  rtt {:.1} ms, {} (edge share limit {})",
            if last { "└── " } else { "├── " },
            label(net, c),
            net.rtt(v, c),
            human_rate(rate),
            human_rate(limits[c])
        );
        let deeper = format!("{indent}{}", if last { "    " } else { "│   " });
        walk(net, tree, c, &deeper, rate, limits, out);
    }
}

/// For each non-root node c, the most its incoming edge could carry given how the tree
/// shares resources (parent's uplink over its children, WAN over crossing edges, ...).
fn edge_limits(res: &Resources, tree: &Tree) -> Vec<f64> {
    let used = usage(res, tree);
    let mut lim = vec![f64::INFINITY; tree.len()];
    for (c, p) in tree.parents().iter().enumerate() {
        if let Some(p) = *p {
            res.for_edge(p, c, |r| {
                lim[c] = lim[c].min(res.caps[r] / f64::from(used[r]))
            });
        }
    }
    lim
}

fn label(net: &Network, v: NodeId) -> String {
    match net.site(v) {
        Some(s) => format!("{} [{s}]", net.name(v)),
        None => net.name(v).to_string(),
    }
}

/// x (in slots) and depth of every node: leaves take consecutive slots in DFS order, parents
/// sit midway between their first and last child.
fn layout(tree: &Tree) -> (Vec<f64>, Vec<usize>) {
    let n = tree.len();
    let mut kids: Vec<Vec<NodeId>> = vec![Vec::new(); n];
    for (c, p) in tree.parents().iter().enumerate() {
        if let Some(p) = p {
            kids[*p].push(c);
        }
    }
    let mut x = vec![0.0; n];
    let mut depth = vec![0usize; n];
    let mut next = 0.0;
    // Iterative post-order so deep chains do not overflow the stack.
    let mut stack = vec![(0usize, false)];
    while let Some((v, done)) = stack.pop() {
        if done {
            x[v] = match (kids[v].first(), kids[v].last()) {
                (Some(&a), Some(&b)) => (x[a] + x[b]) / 2.0,
                _ => {
                    next += 1.0;
                    next - 1.0
                }
            };
            continue;
        }
        stack.push((v, true));
        for &c in kids[v].iter().rev() {
            depth[c] = depth[v] + 1;
            stack.push((c, false));
        }
    }
    (x, depth)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::Matrix;
    use crate::{plan, Algorithm, PlanOptions};

    fn sample() -> Network {
        let mut m = Matrix::filled(4, 20.0);
        m.set(0, 1, 5.0);
        m.set(1, 0, 5.0);
        let mut net = Network::new(m).unwrap();
        for (v, s) in ["a", "a", "b", "b"].iter().enumerate() {
            net.set_site(v, Some(s)).unwrap();
            net.set_uplink(v, Some(100.0)).unwrap();
        }
        net.set_name(3, "x<&\"y").unwrap();
        net
    }

    #[test]
    fn text_dot_and_svg_show_every_edge() {
        let net = sample();
        let p = plan(&net, Algorithm::Mst, &PlanOptions::default()).unwrap();
        let b = crate::bound(&net).unwrap();
        let text = p.render_text(&net, Some(&b));
        assert!(text.contains("rtt 5.0 ms"), "{text}");
        assert!(text.contains("LP optimum"), "{text}");
        assert_eq!(text.matches("── ").count(), 3, "{text}");
        let dot = p.to_dot(&net);
        assert_eq!(dot.matches(" -> ").count(), 3);
        assert!(dot.contains("x<&\\\"y"), "{dot}");
        assert!(dot.contains(PALETTE[1]));
        let svg = p.to_svg(&net);
        assert_eq!(svg.matches("<line").count(), 3);
        // Four nodes plus one legend swatch per site.
        assert_eq!(svg.matches("<circle").count(), 4 + 2);
        assert!(svg.contains(">b</text>"));
        assert!(svg.contains("x&lt;&amp;&quot;y"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn layout_centres_parents() {
        let t = Tree::kary(3, 3);
        let (x, d) = layout(&t);
        assert_eq!(x, vec![1.0, 0.0, 1.0, 2.0]);
        assert_eq!(d, vec![0, 1, 1, 1]);
    }
}
