//! Line charts: the loss-curve PNG of a run (train and validation loss against the step), and
//! the same charts as SVG for the run report.

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::metrics::Row;

/// Fonts tried in turn; plotters draws text only with a font it was given.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Paints a picture of `size` pixels into the file at `path`: SVG when its extension says so,
/// PNG otherwise. `|area| paint` is expanded once per backend, so `paint` may be generic over it;
/// it returns `anyhow::Result<()>`.
macro_rules! draw_to_file {
    ($path:expr, $size:expr, |$area:ident| $paint:expr) => {{
        let path: &std::path::Path = $path;
        let svg = path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("svg"));
        let drawn: anyhow::Result<()> = if svg {
            let $area = plotters::prelude::SVGBackend::new(path, $size).into_drawing_area();
            $paint.and_then(|()| $area.present().map_err(|e| anyhow::anyhow!("{e}")))
        } else {
            let $area = plotters::prelude::BitMapBackend::new(path, $size).into_drawing_area();
            $paint.and_then(|()| $area.present().map_err(|e| anyhow::anyhow!("{e}")))
        };
        drawn.map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
    }};
}
pub(crate) use draw_to_file;

/// Whether a font for labels is available (registering it on first use).
pub(crate) fn has_font() -> bool {
    register_font()
}

fn register_font() -> bool {
    static ONCE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONCE.get_or_init(|| {
        for path in FONTS {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return true;
                }
            }
        }
        false
    })
}

/// Draws `loss.png`. Returns `Ok(false)` (and draws nothing) when no font is installed
/// (Debian: `fonts-dejavu-core`).
pub fn loss_curve(rows: &[Row], path: &Path, title: &str) -> Result<bool> {
    let train: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r.step as f64, r.train_loss?))).collect();
    let val: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r.step as f64, r.val_loss?))).collect();
    lines(&[("train", train, BLUE, false), ("validation", val, RED, true)], path, title, "step", "loss (nats/token)")
}

/// Line plot of named series `(name, points, colour, mark the points)`; `Ok(false)` when there
/// is nothing to draw or no font.
pub fn lines(
    series: &[(&str, Vec<(f64, f64)>, RGBColor, bool)],
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
) -> Result<bool> {
    draw(series, path, title, x_desc, y_desc, false)
}

/// [`lines`] on log–log axes (base 2 for x, 10 for y; labels in the original units), where
/// linear growth is a straight line of slope 1 and quadratic growth one of slope 2.
pub fn log_lines(
    series: &[(&str, Vec<(f64, f64)>, RGBColor, bool)],
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
) -> Result<bool> {
    let logged: Vec<(&str, Vec<(f64, f64)>, RGBColor, bool)> = series
        .iter()
        .map(|(n, p, c, m)| {
            let p = p.iter().filter(|(x, y)| *x > 0.0 && *y > 0.0).map(|(x, y)| (x.log2(), y.log10())).collect();
            (*n, p, *c, *m)
        })
        .collect();
    draw(&logged, path, title, x_desc, y_desc, true)
}

fn draw(
    series: &[(&str, Vec<(f64, f64)>, RGBColor, bool)],
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    log: bool,
) -> Result<bool> {
    if !register_font() || series.iter().all(|s| s.1.is_empty()) {
        return Ok(false);
    }
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    chart(&root, series, title, x_desc, y_desc, log).map_err(|e| anyhow!("cannot draw {}: {e}", path.display()))?;
    Ok(true)
}

/// [`lines`] as an SVG document of `size` pixels, for a page; `None` when there is nothing to
/// draw or no font.
pub fn lines_svg(
    series: &[(&str, Vec<(f64, f64)>, RGBColor, bool)],
    size: (u32, u32),
    title: &str,
    x_desc: &str,
    y_desc: &str,
) -> Result<Option<String>> {
    if !register_font() || series.iter().all(|s| s.1.is_empty()) {
        return Ok(None);
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        chart(&root, series, title, x_desc, y_desc, false).map_err(|e| anyhow!("cannot draw {title}: {e}"))?;
    }
    Ok(Some(svg))
}

fn chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    series: &[(&str, Vec<(f64, f64)>, RGBColor, bool)],
    title: &str,
    x_desc: &str,
    y_desc: &str,
    log: bool,
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("{e}");
    let all = series.iter().flat_map(|s| s.1.iter());
    let (x0, x1) = all.clone().map(|p| p.0).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = all.map(|p| p.1).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y)));
    let pad = ((hi - lo) * 0.05).max(1e-3 * hi.abs().max(1e-9)).max(f64::MIN_POSITIVE);
    let x0 = if !log && x0 > 0.0 && x0 < 0.2 * x1 { 0.0 } else { x0 };
    let x1 = if x1 > x0 { x1 } else { x0 + 1.0 };
    // a range spanning several decades (the learning rate's warm-up) gets exponent labels
    let wide = !log && (hi.abs().max(lo.abs()) < 1e-2 || hi.abs() >= 1e5);

    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(if wide { 72 } else { 56 })
        .build_cartesian_2d(x0..x1, (lo - pad)..(hi + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| if log { format!("{:.0}", 2f64.powf(*x)) } else { format!("{x:.0}") })
        .y_label_formatter(&|y| {
            if log {
                significant(10f64.powf(*y))
            } else if wide {
                format!("{y:.2e}")
            } else {
                format!("{y:.3}")
            }
        })
        .draw()
        .map_err(|e| err(&e))?;
    for (name, points, colour, marks) in series {
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(if *marks { 2 } else { 1 })))
            .map_err(|e| err(&e))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
        if *marks {
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(|e| err(&e))?;
        }
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw().map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// Three significant digits, no exponent: 31623 → "31600", 0.1234 → "0.123".
fn significant(v: f64) -> String {
    if v <= 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = v.log10().floor() as i32;
    let decimals = (2 - digits).max(0) as usize;
    let rounded = if digits > 2 {
        let unit = 10f64.powi(digits - 2);
        (v / unit).round() * unit
    } else {
        v
    };
    format!("{rounded:.decimals$}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn labels_keep_three_significant_digits() {
        assert_eq!(super::significant(31622.777), "31600");
        assert_eq!(super::significant(316.228), "316");
        assert_eq!(super::significant(31.6228), "31.6");
        assert_eq!(super::significant(0.1234), "0.123");
    }
}
