//! `conductor explore`: plan-exploration sweeps on the simulator, written as CSV and charts.
//!
//! ```text
//! conductor explore --sweep model=turbosparse-mixtral-47b --sweep profile=profiles/oneplus-12.toml \
//!     --sweep memory=7GB,10GB,13GB,16GB,19GB --sweep cache=static,segmented -o out/mixtral
//! conductor explore --paper -o out/paper      # PowerInfer-2's trends beside its numbers
//! ```
//!
//! Every point is one simulation (`conductor_planner::explore`). The folder gets
//! `results.csv` (a row per point), `decode.svg`/`.png` (decode tokens/s against the first
//! varying axis, a line per combination of the others) and `io.svg`/`.png` (MB read per
//! token). `--paper` writes `paper.csv`, `paper-trends.md` and two charts instead.

use super::chart::{self, Chart, Series};
use anyhow::{bail, Context, Result};
use clap::Args;
use conductor::runtime::plan::HardwareProfile;
use conductor_planner::explore::{
    CacheMode, ExploreOptions, Explorer, Memory, Outcome, Point, Sweep, AXES,
};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub struct ExploreArgs {
    /// An axis and its values, `AXIS=V1,V2,…` (repeat for more axes). Axes: model (named
    /// shapes), profile (TOML files), memory (7GB, 512MiB, or 50% of the FFN in memory),
    /// bundling (on/off), cache (static/segmented/lru), pipeline (loads in flight), npu
    /// (on/off: prefill on the NPU), io-threads, bundle-neurons.
    #[arg(long = "sweep")]
    sweep: Vec<String>,
    /// Run PowerInfer-2's experiments (the ablation on Bamboo-7B, the TurboSparse-Mixtral-47B
    /// memory sweep) on the OnePlus 12 profile and tabulate them beside the paper's numbers.
    #[arg(long = "paper", conflicts_with = "sweep")]
    paper: bool,
    /// The phone profile `--paper` uses.
    #[arg(long = "paper-profile", default_value = "profiles/oneplus-12.toml")]
    paper_profile: PathBuf,
    /// Folder for the CSV and the charts (created if missing).
    #[arg(short = 'o', long = "out")]
    out: PathBuf,
    /// Decode tokens measured per point (after `--warm` tokens).
    #[arg(long = "tokens", default_value_t = 4)]
    tokens: u32,
    /// Decode tokens simulated before measuring (the cache starts warm either way).
    #[arg(long = "warm", default_value_t = 2)]
    warm: u32,
    /// Prompt tokens before decode (0: prefill not measured; the npu axis changes only
    /// prefill).
    #[arg(long = "prompt", default_value_t = 0)]
    prompt: u32,
    /// Seed of the synthesized decode steps.
    #[arg(long = "seed", default_value_t = 1)]
    seed: u64,
    /// TrueType font for the charts' text (default: a usual system font; none found: charts
    /// without text).
    #[arg(long = "font")]
    font: Option<PathBuf>,
}

pub fn run(args: ExploreArgs) -> Result<()> {
    if !args.paper && args.sweep.is_empty() {
        bail!(
            "give --sweep AXIS=V1,V2 (axes: {}) or --paper",
            AXES.join(", ")
        );
    }
    let options = ExploreOptions {
        warm_tokens: args.warm,
        measured_tokens: args.tokens.max(1),
        prompt: args.prompt,
        seed: args.seed,
        ..ExploreOptions::default()
    };
    if args.paper {
        return paper(&args, options);
    }
    let sweep = Sweep::parse(&args.sweep).map_err(anyhow::Error::msg)?;
    let profiles = load_profiles(&sweep.profiles)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let points = sweep.points();
    let started = Instant::now();
    let mut explorer = Explorer::new(profiles, options);
    let results = run_points(&mut explorer, &points)?;
    let elapsed = started.elapsed().as_secs_f64();

    let csv = args.out.join("results.csv");
    std::fs::write(&csv, to_csv(&points, &results, &sweep.profiles))
        .with_context(|| format!("writing {}", csv.display()))?;
    let font = chart::load_font(args.font.as_deref());
    let varying: Vec<&str> = AXES
        .iter()
        .copied()
        .filter(|a| sweep.len_of(a) > 1)
        .collect();
    let x_axis = if sweep.len_of("memory") > 1 {
        "memory"
    } else {
        varying.first().copied().unwrap_or("memory")
    };
    for (stem, title, y_label, y) in [
        (
            "decode",
            "Decode speed",
            "decode tokens/s",
            (|o: &Outcome| o.decode_tok_s) as fn(&Outcome) -> f64,
        ),
        ("io", "Storage reads", "MB read per token", |o: &Outcome| {
            o.bytes_per_token / 1e6
        }),
    ] {
        let c = chart_of(
            &sweep, &points, &results, x_axis, &varying, title, y_label, y,
        );
        chart::write(&c, &args.out.join(stem))?;
    }
    print_table(&points, &results, &sweep.profiles, &varying);
    println!(
        "{} points in {elapsed:.1} s; {} and charts (decode, io: .svg, .png) in {}",
        points.len(),
        csv.display(),
        args.out.display()
    );
    if font.is_none() {
        eprintln!("explore: no TrueType font found (give --font): the charts have no text");
    }
    Ok(())
}

fn load_profiles(paths: &[String]) -> Result<Vec<HardwareProfile>> {
    paths
        .iter()
        .map(|p| {
            HardwareProfile::from_file(Path::new(p))
                .with_context(|| format!("hardware profile {p}"))
        })
        .collect()
}

fn run_points(explorer: &mut Explorer, points: &[Point]) -> Result<Vec<Outcome>> {
    let terminal = std::io::stderr().is_terminal();
    let mut out = Vec::with_capacity(points.len());
    for (i, p) in points.iter().enumerate() {
        let outcome = explorer.run(p).map_err(|e| {
            anyhow::anyhow!("point {} ({} at {}): {e}", i + 1, p.model, p.memory.label())
        })?;
        out.push(outcome);
        let done = i + 1;
        if terminal {
            eprint!("\rexplore: {done}/{} points", points.len());
            if done == points.len() {
                eprintln!();
            }
            let _ = std::io::stderr().flush();
        } else if done * 4 / points.len() != i * 4 / points.len() {
            eprintln!("explore: {done}/{} points", points.len());
        }
    }
    Ok(out)
}

const CSV_HEADER: &str = "model,profile,memory,budget_bytes,cache_bytes,ffn_in_memory,bundling,cache,pipeline,npu,io_threads,bundle_neurons,decode_tok_s,bytes_per_token,miss_rate,compute_busy,storage_busy,prefill_tok_s";

fn to_csv(points: &[Point], results: &[Outcome], profiles: &[String]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for (p, o) in points.iter().zip(results) {
        let quoted = |v: String| {
            if v.contains(',') || v.contains('"') {
                format!("\"{}\"", v.replace('"', "\"\""))
            } else {
                v
            }
        };
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:.4},{},{},{},{},{},{},{:.4},{:.0},{:.5},{:.4},{:.4},{}",
            quoted(p.model.clone()),
            quoted(p.value("profile", profiles)),
            quoted(p.memory.label()),
            o.budget,
            o.cache_bytes,
            o.ffn_in_memory,
            p.value("bundling", profiles),
            p.cache.name(),
            p.pipeline,
            p.value("npu", profiles),
            p.io_threads,
            p.bundle_neurons,
            o.decode_tok_s,
            o.bytes_per_token,
            o.miss_rate,
            o.compute_busy,
            o.storage_busy,
            o.prefill_tok_s.map_or(String::new(), |v| format!("{v:.2}")),
        );
    }
    s
}

/// x: the budget in GB when memory varies, else the first varying axis as categories; a
/// series per combination of the other varying axes.
#[allow(clippy::too_many_arguments)]
fn chart_of<'a>(
    sweep: &Sweep,
    points: &[Point],
    results: &[Outcome],
    x_axis: &'a str,
    varying: &[&str],
    title: &'a str,
    y_label: &'a str,
    y: fn(&Outcome) -> f64,
) -> Chart<'a> {
    let numeric = x_axis == "memory";
    let mut categories: Vec<String> = Vec::new();
    let mut series: Vec<Series> = Vec::new();
    for (p, o) in points.iter().zip(results) {
        let x = if numeric {
            o.budget as f64 / 1e9
        } else {
            let v = p.value(x_axis, &sweep.profiles);
            match categories.iter().position(|c| *c == v) {
                Some(i) => i as f64,
                None => {
                    categories.push(v);
                    (categories.len() - 1) as f64
                }
            }
        };
        let name: Vec<String> = varying
            .iter()
            .filter(|&&a| a != x_axis)
            .map(|a| format!("{a} {}", p.value(a, &sweep.profiles)))
            .collect();
        let name = if name.is_empty() {
            points[0].model.clone()
        } else {
            name.join(", ")
        };
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x, y(o))),
            None => series.push(Series {
                name,
                points: vec![(x, y(o))],
            }),
        }
    }
    Chart {
        title,
        x_label: if numeric {
            "memory budget (GB)"
        } else {
            x_axis
        },
        y_label,
        x_categories: categories,
        series,
    }
}

fn print_table(points: &[Point], results: &[Outcome], profiles: &[String], varying: &[&str]) {
    let head: Vec<&str> = if varying.is_empty() {
        vec!["model"]
    } else {
        varying.to_vec()
    };
    println!(
        "{}  {:>9} {:>7} {:>9} {:>8} {:>8} {:>8}",
        head.iter()
            .map(|a| format!("{a:>14}"))
            .collect::<Vec<_>>()
            .join(" "),
        "budget GB",
        "tok/s",
        "MB/token",
        "misses",
        "compute",
        "storage"
    );
    for (p, o) in points.iter().zip(results) {
        println!(
            "{}  {:>9.2} {:>7.2} {:>9.1} {:>7.1}% {:>7.0}% {:>7.0}%",
            head.iter()
                .map(|a| format!("{:>14}", p.value(a, profiles)))
                .collect::<Vec<_>>()
                .join(" "),
            o.budget as f64 / 1e9,
            o.decode_tok_s,
            o.bytes_per_token / 1e6,
            100.0 * o.miss_rate,
            100.0 * o.compute_busy,
            100.0 * o.storage_busy
        );
    }
}

/// A row of the paper table: what runs, and the paper's figure.
struct PaperRow {
    experiment: &'static str,
    step: &'static str,
    paper_tok_s: f64,
    point: Point,
}

fn paper_rows() -> Vec<PaperRow> {
    let base = Point {
        model: "bamboo-7b".into(),
        profile: 0,
        memory: Memory::FfnShare(0.5),
        bundled: false,
        cache: CacheMode::Static,
        pipeline: 1,
        npu: false,
        io_threads: 1,
        bundle_neurons: 1,
    };
    let bundle = Point {
        bundled: true,
        ..base.clone()
    };
    let cache = Point {
        cache: CacheMode::Segmented,
        ..bundle.clone()
    };
    let pipeline = Point {
        pipeline: 32,
        ..cache.clone()
    };
    let npu = Point {
        npu: true,
        ..pipeline.clone()
    };
    let mixtral_base = npu.clone();
    let mixtral = |memory: Memory| Point {
        model: "turbosparse-mixtral-47b".into(),
        memory,
        ..mixtral_base.clone()
    };
    let ablation = "ablation, Bamboo-7B, 50% of the FFN offloaded";
    let sweep = "TurboSparse-Mixtral-47B, memory";
    vec![
        PaperRow {
            experiment: ablation,
            step: "CPU baseline",
            paper_tok_s: 0.40,
            point: base,
        },
        PaperRow {
            experiment: ablation,
            step: "+ bundling",
            paper_tok_s: 1.09,
            point: bundle,
        },
        PaperRow {
            experiment: ablation,
            step: "+ cache",
            paper_tok_s: 4.18,
            point: cache,
        },
        PaperRow {
            experiment: ablation,
            step: "+ pipeline",
            paper_tok_s: 9.60,
            point: pipeline,
        },
        PaperRow {
            experiment: ablation,
            step: "+ NPU",
            paper_tok_s: 11.07,
            point: npu,
        },
        PaperRow {
            experiment: sweep,
            step: "7 GB",
            paper_tok_s: 2.13,
            point: mixtral(Memory::Bytes(7_000_000_000)),
        },
        PaperRow {
            experiment: sweep,
            step: "50% of the FFN offloaded",
            paper_tok_s: 9.96,
            point: mixtral(Memory::FfnShare(0.5)),
        },
        PaperRow {
            experiment: sweep,
            step: "19 GB",
            paper_tok_s: 11.68,
            point: mixtral(Memory::Bytes(19_000_000_000)),
        },
    ]
}

fn paper(args: &ExploreArgs, options: ExploreOptions) -> Result<()> {
    let profile_name = args.paper_profile.display().to_string();
    let profiles = load_profiles(std::slice::from_ref(&profile_name))?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let rows = paper_rows();
    let points: Vec<Point> = rows.iter().map(|r| r.point.clone()).collect();
    let started = Instant::now();
    let mut explorer = Explorer::new(profiles, options.clone());
    let results = run_points(&mut explorer, &points)?;
    let elapsed = started.elapsed().as_secs_f64();
    std::fs::write(
        args.out.join("paper.csv"),
        to_csv(&points, &results, std::slice::from_ref(&profile_name)),
    )?;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "PowerInfer-2's numbers (OnePlus 12) beside Conductor's simulator on `{profile_name}`, \
         decode tokens/s ({} measured tokens after {} warm-up, warm cache, seed {}).\n",
        options.measured_tokens, options.warm_tokens, options.seed
    );
    let _ = writeln!(
        md,
        "| experiment | step | paper tok/s | simulated tok/s | simulated / paper | paper gain | simulated gain | MB read/token | misses | compute busy | storage busy |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut prev: Option<(&str, f64, f64)> = None;
    for (r, o) in rows.iter().zip(&results) {
        let (pg, sg) = match prev {
            Some((e, p, s)) if e == r.experiment => (
                format!("{:.2}×", r.paper_tok_s / p),
                format!("{:.2}×", o.decode_tok_s / s.max(1e-9)),
            ),
            _ => ("".into(), "".into()),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {} | {} | {:.1} | {:.1}% | {:.0}% | {:.0}% |",
            r.experiment,
            r.step,
            r.paper_tok_s,
            o.decode_tok_s,
            o.decode_tok_s / r.paper_tok_s,
            pg,
            sg,
            o.bytes_per_token / 1e6,
            100.0 * o.miss_rate,
            100.0 * o.compute_busy,
            100.0 * o.storage_busy,
        );
        prev = Some((r.experiment, r.paper_tok_s, o.decode_tok_s));
    }
    std::fs::write(args.out.join("paper-trends.md"), &md)?;
    print!("{md}");

    let font = chart::load_font(args.font.as_deref());
    let ablation: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].point.model == "bamboo-7b")
        .collect();
    let series = |name: &str,
                  f: &dyn Fn(usize) -> f64,
                  idx: &[usize],
                  x: &dyn Fn(usize, usize) -> f64| Series {
        name: name.into(),
        points: idx
            .iter()
            .enumerate()
            .map(|(k, &i)| (x(k, i), f(i)))
            .collect(),
    };
    // The paper's figures and the simulator's, for the rows `idx`, at x positions `x`.
    let paper_and_simulator = |idx: &[usize], x: &dyn Fn(usize, usize) -> f64| {
        vec![
            series("paper", &|i| rows[i].paper_tok_s, idx, x),
            series("Conductor simulator", &|i| results[i].decode_tok_s, idx, x),
        ]
    };
    let categorical = |k: usize, _| k as f64;
    chart::write(
        &Chart {
            title: "Ablation, Bamboo-7B, 50% offloaded (OnePlus 12)",
            x_label: "features added",
            y_label: "decode tokens/s",
            x_categories: ablation.iter().map(|&i| rows[i].step.to_string()).collect(),
            series: paper_and_simulator(&ablation, &categorical),
        },
        &args.out.join("paper-ablation"),
    )?;
    let mixtral: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].point.model != "bamboo-7b")
        .collect();
    let gb = |_, i: usize| results[i].budget as f64 / 1e9;
    chart::write(
        &Chart {
            title: "TurboSparse-Mixtral-47B decode by memory (OnePlus 12)",
            x_label: "memory budget (GB)",
            y_label: "decode tokens/s",
            x_categories: Vec::new(),
            series: paper_and_simulator(&mixtral, &gb),
        },
        &args.out.join("paper-mixtral"),
    )?;
    println!(
        "{} points in {elapsed:.1} s; paper.csv, paper-trends.md and charts in {}",
        points.len(),
        args.out.display()
    );
    if font.is_none() {
        eprintln!("explore: no TrueType font found (give --font): the charts have no text");
    }
    Ok(())
}
