//! `bulkcast report FILE.json --svg OUT`: plots of a finished send from its `--json` report.
//!
//! Panels, after seed 000's figures: every receiver's progress over time; every edge's rate
//! over time, smoothed with a Savitzky-Golay filter as the paper's Figure 4 is; every edge's
//! average rate (the numbers the paper's Figure 3 puts on the tree's edges); for swarms, the
//! WAN bytes that entered each site. Drawn with `plotters`' SVG backend without a font
//! library: text is written as SVG `<text>` and laid out by whoever displays it, so nothing
//! here needs fontconfig or a font file.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use plotters::prelude::*;
use serde_json::Value;

#[derive(Args)]
pub struct ReportArgs {
    /// A report written by `bulkcast send --json`.
    file: PathBuf,
    /// Write the plots to this SVG file.
    #[arg(long, value_name = "OUT")]
    svg: PathBuf,
    /// Half-width of the Savitzky-Golay window for rates, in samples (0: no smoothing).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(0..=50))]
    smooth: u16,
}

/// One receiver's series from the report.
struct Series {
    /// `from → to` for a tree edge, `→ to` for a swarm's receiver (it pulls from many peers).
    edge: String,
    name: String,
    failed: bool,
    /// (seconds, bytes).
    points: Vec<(f64, f64)>,
}

pub fn run(a: ReportArgs) -> Result<i32> {
    let text = std::fs::read_to_string(&a.file)
        .with_context(|| format!("reading {}", a.file.display()))?;
    let r: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON report", a.file.display()))?;
    let series = series(&r)?;
    let svg = render(&r, &series, a.smooth as usize)?;
    std::fs::write(&a.svg, svg).with_context(|| format!("writing {}", a.svg.display()))?;
    eprintln!(
        "{}: {} receivers, {} samples each",
        a.svg.display(),
        series.len(),
        series.first().map_or(0, |s| s.points.len())
    );
    Ok(0)
}

/// Every receiver's timeline, named by its edge.
fn series(r: &Value) -> Result<Vec<Series>> {
    let receivers = r["receivers"]
        .as_array()
        .context("the report has no receivers")?;
    let t: Vec<f64> = r["timeline"]["t_s"]
        .as_array()
        .map(|v| v.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let bytes = r["timeline"]["bytes"].as_array();
    if t.is_empty() || bytes.is_none_or(|b| b.len() != receivers.len()) {
        bail!("the report has no timeline of its receivers (send it again with this version of bulkcast)");
    }
    let bytes = bytes.expect("checked");
    // In a swarm (the hybrid too) a receiver also pulls from peers: its intake is not one edge.
    let swarm = r["clusters"].as_array().is_some_and(|c| !c.is_empty());
    // Every series starts from nothing at the session's start.
    let start = (t[0] > 0.0).then_some((0.0, 0.0));
    receivers
        .iter()
        .zip(bytes)
        .map(|(rx, b)| {
            let name = rx["name"].as_str().unwrap_or("?").to_string();
            let parent = rx["parent"].as_str().unwrap_or("-");
            let b: Vec<f64> = b
                .as_array()
                .context("timeline bytes")?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            if b.len() != t.len() {
                bail!(
                    "the timeline of {name} has {} samples for {} times",
                    b.len(),
                    t.len()
                );
            }
            Ok(Series {
                edge: match parent {
                    _ if swarm => format!("→ {name}"),
                    "-" | "" => format!("→ {name}"),
                    p => format!("{p} → {name}"),
                },
                failed: rx["verified"] != Value::Bool(true),
                points: start.into_iter().chain(t.iter().copied().zip(b)).collect(),
                name,
            })
        })
        .collect()
}

/// Rates between consecutive samples (Mbit/s at the interval's midpoint), smoothed.
fn rates(points: &[(f64, f64)], half: usize) -> Vec<(f64, f64)> {
    let raw: Vec<(f64, f64)> = points
        .windows(2)
        .filter(|w| w[1].0 > w[0].0)
        .map(|w| {
            (
                (w[0].0 + w[1].0) / 2.0,
                (w[1].1 - w[0].1).max(0.0) * 8.0 / (w[1].0 - w[0].0) / 1e6,
            )
        })
        .collect();
    let ys: Vec<f64> = raw.iter().map(|p| p.1).collect();
    let smooth = savitzky_golay(&ys, half);
    raw.iter()
        .zip(smooth)
        .map(|(p, y)| (p.0, y.max(0.0)))
        .collect()
}

/// Quadratic Savitzky-Golay smoothing over `2 * half + 1` samples (the window narrows at the
/// ends so every sample keeps a centred window). A quadratic passes through unchanged.
pub fn savitzky_golay(y: &[f64], half: usize) -> Vec<f64> {
    (0..y.len())
        .map(|i| {
            let m = half.min(i).min(y.len() - 1 - i) as i64;
            if m == 0 {
                return y[i];
            }
            // Closed form of the quadratic fit's value at the centre.
            let norm = ((2 * m + 1) * (2 * m - 1) * (2 * m + 3)) as f64;
            (-m..=m)
                .map(|j| {
                    let c = (3 * (3 * m * m + 3 * m - 1) - 15 * j * j) as f64 / norm;
                    c * y[(i as i64 + j) as usize]
                })
                .sum()
        })
        .collect()
}

fn render(r: &Value, series: &[Series], half: usize) -> Result<String> {
    let clusters = r["clusters"].as_array().cloned().unwrap_or_default();
    let panels = if clusters.is_empty() { 3 } else { 4 };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1000, 380 * panels)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let areas = root.split_evenly((panels as usize, 1));
        let total = r["object"]["bytes"].as_f64().unwrap_or(0.0).max(1.0);
        let end = series
            .iter()
            .filter_map(|s| s.points.last())
            .map(|p| p.0)
            .fold(0.0f64, f64::max)
            .max(1e-3);
        let title = format!(
            "{} ({}) by {}",
            r["object"]["name"].as_str().unwrap_or("?"),
            crate::progress::human_bytes(total as u64),
            r["strategy"].as_str().unwrap_or("?")
        );
        let progress: Vec<Line> = series
            .iter()
            .map(|s| {
                let pts = s
                    .points
                    .iter()
                    .map(|p| (p.0, 100.0 * p.1 / total))
                    .collect();
                (s.name.clone(), s.failed, pts)
            })
            .collect();
        lines(
            &areas[0],
            &format!("{title}: each receiver's progress"),
            "% of the object",
            (end, 100.0),
            &progress,
        )?;
        let rate: Vec<Line> = series
            .iter()
            .map(|s| (s.edge.clone(), s.failed, rates(&s.points, half)))
            .collect();
        let top = rate
            .iter()
            .flat_map(|s| s.2.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-3);
        lines(
            &areas[1],
            &format!(
                "rate over each edge (Savitzky-Golay, {} samples)",
                2 * half + 1
            ),
            "Mbit/s",
            (end, top * 1.1),
            &rate,
        )?;
        let avg = average_rates(r);
        bars(&areas[2], "average rate per edge", "Mbit/s", &avg)?;
        if !clusters.is_empty() {
            let sites: Vec<(String, f64, bool)> = clusters
                .iter()
                .map(|c| {
                    let label = format!(
                        "{}{}",
                        c["site"].as_str().unwrap_or("?"),
                        if c["has_source"] == true {
                            " (source)"
                        } else {
                            ""
                        }
                    );
                    (label, c["copies"].as_f64().unwrap_or(0.0), false)
                })
                .collect();
            bars(
                &areas[3],
                "WAN bytes into each site, in copies of the object (1.0 is ideal)",
                "copies",
                &sites,
            )?;
        }
        root.present().map_err(plot_err)?;
    }
    Ok(out)
}

/// Each tree edge's average rate, or for swarms (no tree edges) each receiver's intake.
fn average_rates(r: &Value) -> Vec<(String, f64, bool)> {
    r["edges"]
        .as_array()
        .filter(|e| !e.is_empty())
        .map(|edges| {
            edges
                .iter()
                .map(|e| {
                    let label = format!(
                        "{} → {}",
                        e["from"].as_str().unwrap_or("?"),
                        e["to"].as_str().unwrap_or("?")
                    );
                    (label, e["rate_mbps"].as_f64().unwrap_or(0.0), false)
                })
                .collect()
        })
        .unwrap_or_else(|| {
            // Swarms have no tree edges: each receiver's average intake instead.
            r["receivers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|x| {
                    let label = format!("→ {}", x["name"].as_str().unwrap_or("?"));
                    (label, x["rate_mbps"].as_f64().unwrap_or(0.0), false)
                })
                .collect()
        })
}

/// A labelled series of points; `true` when it belongs to a failed receiver.
type Line = (String, bool, Vec<(f64, f64)>);

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn plot_err(e: impl std::fmt::Debug) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e:?}")
}

/// A line per series; failed ones in red, dashed.
fn lines(
    area: &Area,
    caption: &str,
    y_desc: &str,
    (x_max, y_max): (f64, f64),
    series: &[Line],
) -> Result<()> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()
        .map_err(plot_err)?;
    for (i, (label, failed, pts)) in series.iter().enumerate() {
        let color = if *failed {
            RED.to_rgba()
        } else {
            // Palette99 starts with a red: that is for failures.
            Palette99::pick(i + 1).to_rgba()
        };
        let label = if *failed {
            format!("{label} (FAILED)")
        } else {
            label.clone()
        };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(plot_err)?;
    Ok(())
}

/// Horizontal bars, one per item, with its value written at its end.
fn bars(area: &Area, caption: &str, x_desc: &str, items: &[(String, f64, bool)]) -> Result<()> {
    let top = items.iter().map(|i| i.1).fold(0.0f64, f64::max).max(1e-3) * 1.15;
    let n = items.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(220)
        .build_cartesian_2d(0.0..top, -0.5..(n as f64 - 0.5))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_desc)
        .y_labels(n)
        .y_label_formatter(&|y| {
            let i = y.round();
            match items.get(i as usize) {
                Some(item) if (y - i).abs() < 1e-6 && i >= 0.0 => item.0.clone(),
                _ => String::new(),
            }
        })
        .draw()
        .map_err(plot_err)?;
    chart
        .draw_series(items.iter().enumerate().map(|(i, item)| {
            let y = i as f64;
            Rectangle::new(
                [(0.0, y - 0.35), (item.1, y + 0.35)],
                Palette99::pick(i + 1).filled(),
            )
        }))
        .map_err(plot_err)?;
    chart
        .draw_series(items.iter().enumerate().map(|(i, item)| {
            Text::new(
                format!("{:.2}", item.1),
                (item.1, i as f64),
                ("sans-serif", 13).into_font(),
            )
        }))
        .map_err(plot_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savitzky_golay_keeps_a_quadratic_and_damps_noise() {
        let q: Vec<f64> = (0..30)
            .map(|i| 0.5 * (i * i) as f64 - 3.0 * i as f64 + 7.0)
            .collect();
        let s = savitzky_golay(&q, 3);
        for (a, b) in q.iter().zip(&s) {
            assert!((a - b).abs() < 1e-9, "{a} {b}");
        }
        let noisy: Vec<f64> = (0..200)
            .map(|i| 100.0 + if i % 2 == 0 { 10.0 } else { -10.0 })
            .collect();
        let s = savitzky_golay(&noisy, 3);
        let spread = |v: &[f64]| {
            v[10..190]
                .iter()
                .map(|x| (x - 100.0).abs())
                .fold(0.0, f64::max)
        };
        // Alternating noise of 10 leaves 10 * 5 / 21 after a 7-sample window.
        assert!((spread(&s) - 50.0 / 21.0).abs() < 1e-9, "{}", spread(&s));
        assert_eq!(savitzky_golay(&noisy, 0), noisy);
    }

    #[test]
    fn plots_name_every_receiver_edge_and_site_and_mark_failures() {
        let r = serde_json::json!({
            "object": { "name": "w.bin", "kind": "file", "bytes": 4000000 },
            "strategy": "hybrid",
            "receivers": [
                { "name": "fra-1", "parent": "source", "verified": true, "rate_mbps": 80.0 },
                { "name": "nyc-1", "parent": "-", "verified": false, "rate_mbps": 0.0 }
            ],
            "edges": [],
            "clusters": [
                { "site": "lon", "has_source": true, "copies": 0.0 },
                { "site": "fra", "has_source": false, "copies": 1.0 }
            ],
            "timeline": { "t_s": [0.1, 0.2, 0.3, 0.4],
                          "bytes": [[0, 1000000, 3000000, 4000000], [0, 0, 10, 10]] }
        });
        let s = series(&r).unwrap();
        assert_eq!(s[0].edge, "→ fra-1", "a swarm's intake is not one edge");
        assert_eq!(s[1].edge, "→ nyc-1");
        let svg = render(&r, &s, 3).unwrap();
        for want in [
            "<svg",
            "fra-1",
            "nyc-1 (FAILED)",
            "→ fra-1",
            "fra",
            "copies",
        ] {
            assert!(svg.contains(want), "no {want:?}");
        }
        // Three line panels' worth of series plus four bars.
        assert!(svg.matches("<polyline").count() >= 4, "{svg}");
        let bad = serde_json::json!({ "receivers": [{ "name": "a" }] });
        let e = series(&bad).err().unwrap().to_string();
        assert!(e.contains("no timeline"), "{e}");
    }
}
