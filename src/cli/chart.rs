//! Line charts of sweep results as SVG and PNG (plotters).
//!
//! Text needs a TrueType font: `--font`, else the first of the usual system fonts found. With
//! none, the charts are drawn without text (the CSV beside them has every number) and the
//! caller is told.

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One line of a chart: its name and its (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// What a chart shows.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Names of x positions for a categorical axis (x = 0, 1, …); empty: numeric x.
    pub x_categories: Vec<String>,
    pub series: Vec<Series>,
}

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "/Library/Fonts/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Whether a font was registered (once per process: plotters keeps one table).
static FONT: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Registers `explicit`, or the first usual system font found, as plotters' sans-serif.
/// Returns the font used, or `None` (charts then carry no text).
pub fn load_font(explicit: Option<&Path>) -> Option<PathBuf> {
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = match explicit {
            Some(p) => vec![p.to_path_buf()],
            None => FONT_PATHS.iter().map(PathBuf::from).collect(),
        };
        for path in candidates {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            // plotters keeps the font for the whole process: it needs 'static bytes. One font,
            // loaded once (OnceLock), so this leaks a bounded amount.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Some(path);
            }
        }
        None
    })
    .clone()
}

const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Writes `chart` to `stem.svg` and `stem.png`.
pub fn write(chart: &Chart<'_>, stem: &Path) -> Result<()> {
    let text = FONT.get().cloned().flatten().is_some();
    let svg = stem.with_extension("svg");
    draw(
        SVGBackend::new(&svg, (900, 540)).into_drawing_area(),
        chart,
        text,
    )?;
    let png = stem.with_extension("png");
    draw(
        BitMapBackend::new(&png, (900, 540)).into_drawing_area(),
        chart,
        text,
    )?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart<'_>,
    text: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing a chart: {err}");
    root.fill(&WHITE).map_err(e)?;
    let points = chart.series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = ((x1 - x0) * 0.05).max(0.5);
    let (x0, x1) = (x0 - pad, x1 + pad);
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let mut builder = ChartBuilder::on(&root);
    builder.margin(20);
    if text {
        builder
            .caption(chart.title, ("sans-serif", 22))
            .x_label_area_size(45)
            .y_label_area_size(60);
    }
    let mut ctx = builder.build_cartesian_2d(x0..x1, 0.0..y1).map_err(e)?;
    let categories = chart.x_categories.clone();
    let category_of = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            categories.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut mesh = ctx.configure_mesh();
    if text {
        mesh.x_desc(chart.x_label).y_desc(chart.y_label);
        if !chart.x_categories.is_empty() {
            mesh.x_labels(chart.x_categories.len() + 2)
                .x_label_formatter(&category_of);
        }
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(e)?;
    for (i, s) in chart.series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line = ctx
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(e)?;
        if text {
            line.label(s.name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        }
        ctx.draw_series(
            s.points
                .iter()
                .map(|&(x, y)| Circle::new((x, y), 4, colour.filled())),
        )
        .map_err(e)?;
    }
    if text && chart.series.len() > 1 {
        ctx.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}
