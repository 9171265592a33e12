//! `make bench-plots` (and the end of `make bench-cluster`): draws the curves of issue 9 from
//! the cluster benches' JSON results in `bench/results/`, as SVG files in `docs/performance/`:
//!
//! - `fanout_time.svg`: policy created → N workloads carry the terms, ballast and both floors
//!   (one `kubectl apply --server-side`, one client with 8 in flight), against N;
//! - `fanout_writes.svg`: template writes against N (the goal: exactly N);
//! - `rss.svg`: the manager's resident memory (peak, after the fan-out, before the policy)
//!   against N, with the goals (48 MiB at 5000, 128 MiB at 20000);
//! - `hook_latency.svg`: P5, hook Job complete → Deployment unpaused, as the share of hooks done
//!   within a time (log scale), ballast beside the floor, with the 200 ms goal.
//!
//! For each N, the newest `cluster_spread` run that measured it; for P5, the newest
//! `cluster_rollout` run. No cluster: it only reads files.

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use serde_json::Value;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

const WIDTH: u32 = 720;
const HEIGHT: u32 = 420;
const BALLAST: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const FLOOR: RGBColor = RGBColor(0x7f, 0x7f, 0x7f);
const STRICT_FLOOR: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const GOAL: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The results of `bench`, oldest first (the file names carry the UTC start time).
fn results(dir: &Path, bench: &str) -> Result<Vec<(String, Value)>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{bench}-")) && n.ends_with(".json"))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p)?;
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            Ok((name, serde_json::from_str(&text)?))
        })
        .collect()
}

/// One size of a `cluster_spread` run, as the plots need it.
#[derive(Clone, Debug)]
struct Size {
    n: f64,
    ballast_secs: f64,
    floor_secs: f64,
    parallel_floor_secs: f64,
    template_writes: f64,
    peak_rss_mib: f64,
    rss_mib: f64,
    idle_rss_mib: f64,
    run: String,
}

/// For each N, the newest run's numbers.
fn sizes(runs: &[(String, Value)]) -> BTreeMap<u64, Size> {
    let mut out = BTreeMap::new();
    for (run, doc) in runs {
        for s in doc["sizes"].as_array().into_iter().flatten() {
            let f = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
            let Some(n) = s["n"].as_u64() else { continue };
            out.insert(
                n,
                Size {
                    n: n as f64,
                    ballast_secs: f("ballast_secs"),
                    floor_secs: f("floor_secs"),
                    parallel_floor_secs: f("parallel_floor_secs"),
                    template_writes: f("ballast_template_writes"),
                    peak_rss_mib: f("peak_rss_mib"),
                    rss_mib: f("rss_mib"),
                    idle_rss_mib: f("idle_rss_mib"),
                    run: run.clone(),
                },
            );
        }
    }
    out
}

/// A named line: its legend, colour and points.
type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// A line chart of `series` against N, with goals marked as crosses.
fn chart_vs_n(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
    goals: &[(&str, Vec<(f64, f64)>)],
) -> Result<()> {
    let points = || {
        series
            .iter()
            .flat_map(|s| s.2.iter())
            .chain(goals.iter().flat_map(|g| g.1.iter()))
    };
    let x_max = points().map(|p| p.0).fold(0.0, f64::max) * 1.05;
    let y_max = points().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max.max(1.0), 0.0..y_max.max(1.0))?;
    chart
        .configure_mesh()
        .x_desc("N (workloads)")
        .y_desc(y_label)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (name, color, pts) in series {
        let color = *color;
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    for (name, pts) in goals {
        chart
            .draw_series(pts.iter().map(|p| Cross::new(*p, 6, GOAL.stroke_width(2))))?
            .label(*name)
            .legend(|(x, y)| Cross::new((x + 9, y), 5, GOAL.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}

/// The share of `v` at or below each value, as points of a step curve.
fn cdf(v: &[f64]) -> Vec<(f64, f64)> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| *x > 0.0).collect();
    s.sort_by(f64::total_cmp);
    let n = s.len() as f64;
    s.iter()
        .enumerate()
        .map(|(i, x)| (*x, (i + 1) as f64 / n))
        .collect()
}

fn hook_latency(path: &Path, run: &str, doc: &Value) -> Result<()> {
    let ms = |k: &str| -> Vec<f64> {
        doc["measured"][k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect()
    };
    let (ballast, floor) = (ms("hook_ballast_ms"), ms("hook_floor_ms"));
    if ballast.is_empty() || floor.is_empty() {
        bail!("{run} has no hook latencies");
    }
    let max = ballast.iter().chain(&floor).copied().fold(1.0, f64::max) * 1.5;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "P5: hook Job complete → Deployment unpaused ({} hooks)",
                ballast.len()
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d((1.0..max).log_scale(), 0.0..1.02)?;
    chart
        .configure_mesh()
        .x_desc("ms (log scale)")
        .y_desc("share of hooks done")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (name, color, v) in [
        ("ballast", BALLAST, &ballast),
        ("floor: one watch delivery + one PATCH", FLOOR, &floor),
    ] {
        chart
            .draw_series(LineSeries::new(cdf(v), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_series(LineSeries::new(
            vec![(200.0, 0.0), (200.0, 1.0)],
            GOAL.stroke_width(1),
        ))?
        .label("goal: p99 ≤ 200 ms")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], GOAL.stroke_width(1)));
    chart.draw_series(LineSeries::new(
        vec![(1.0, 0.99), (max, 0.99)],
        GOAL.mix(0.4).stroke_width(1),
    ))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    root.present()?;
    Ok(())
}

fn main() -> Result<()> {
    let dir = root().join("bench/results");
    let out = root().join("docs/performance");
    std::fs::create_dir_all(&out)?;
    let spread = sizes(&results(&dir, "cluster_spread")?);
    if spread.is_empty() {
        bail!(
            "no cluster_spread results in {}: run `make bench-cluster`",
            dir.display()
        );
    }
    let pts = |f: fn(&Size) -> f64| -> Vec<(f64, f64)> {
        spread
            .values()
            .map(|s| (s.n, f(s)))
            .filter(|p| p.1.is_finite())
            .collect()
    };
    chart_vs_n(
        &out.join("fanout_time.svg"),
        "P1: policy created → all N carry the terms",
        "seconds",
        &[
            ("ballast", BALLAST, pts(|s| s.ballast_secs)),
            (
                "floor: one kubectl apply --server-side",
                FLOOR,
                pts(|s| s.floor_secs),
            ),
            (
                "floor: one client, 8 in flight",
                STRICT_FLOOR,
                pts(|s| s.parallel_floor_secs),
            ),
        ],
        &[],
    )?;
    chart_vs_n(
        &out.join("fanout_writes.svg"),
        "P1: template writes",
        "writes",
        &[
            ("ballast", BALLAST, pts(|s| s.template_writes)),
            ("floor (= N)", FLOOR, pts(|s| s.n)),
        ],
        &[],
    )?;
    chart_vs_n(
        &out.join("rss.svg"),
        "P4: the manager's resident memory",
        "MiB",
        &[
            ("peak", BALLAST, pts(|s| s.peak_rss_mib)),
            ("after the fan-out", STRICT_FLOOR, pts(|s| s.rss_mib)),
            ("before the policy", FLOOR, pts(|s| s.idle_rss_mib)),
        ],
        &[("goal", vec![(5000.0, 48.0), (20000.0, 128.0)])],
    )?;
    for s in spread.values() {
        println!("N={}: from {}", s.n, s.run);
    }
    let rollout = results(&dir, "cluster_rollout")?;
    let (run, doc) = rollout
        .last()
        .context("no cluster_rollout results: run `make bench-cluster`")?;
    hook_latency(&out.join("hook_latency.svg"), run, doc)?;
    println!("P5: from {run}");
    println!("Plots: {}", out.display());
    Ok(())
}
