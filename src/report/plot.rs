//! The drift as a picture: for each arena (or dump file) that differs, how
//! many elements differ by how many ULPs, as bars over power-of-two
//! buckets of the distance (0, 1, 2-3, 4-7, ...) on a log count axis, the
//! differing fraction in the panel's title. SVG through plotters' SVG
//! backend, which writes text as `<text>` and needs no font file.

use super::localize::{ulp_bucket_range, DumpComparison};
use super::Report;
use crate::dtype::Dtype;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Fill of a bar of distances, and of the bar of differences without one.
pub const BAR_FILL: RGBColor = RGBColor(0x3B, 0x6E, 0xA5);
pub const REST_FILL: RGBColor = RGBColor(0xB5, 0x4A, 0x4A);

const PANEL_HEIGHT: u32 = 250;
const HEADING_HEIGHT: u32 = 40;
const SLOT_WIDTH: u32 = 76;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// An expect result written before reports kept ULP histograms.
    #[error("{what}: {differing} differing elements but no ulp_histogram (a report written before foldprint kept one); run the case again to plot it")]
    NoHistogram { what: String, differing: usize },
    #[error("cannot draw the picture: {0}")]
    Draw(String),
}

/// One arena's or file's differences.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// What differs: the case, rank and arena, or the dump file.
    pub what: String,
    pub dtype: Dtype,
    /// Elements compared, and how many of them differ.
    pub len: usize,
    pub differing: usize,
    /// Differing elements per distance bucket (`localize::ulp_bucket`).
    pub histogram: Vec<u64>,
    /// Differing elements with no distance (a NaN, or no element to pair
    /// with), and what to call them on the axis.
    pub rest: u64,
    pub rest_label: &'static str,
}

impl Panel {
    /// `what: N of M elements differ (P%)`.
    pub fn title(&self) -> String {
        format!(
            "{}: {} of {} elements differ ({})",
            self.what,
            self.differing,
            self.len,
            percent(self.differing, self.len)
        )
    }

    /// Bar slots: every bucket up to the last non-empty one, then the rest.
    fn slots(&self) -> usize {
        self.histogram.len() + usize::from(self.rest > 0)
    }

    /// The bars, (slot, count) of each non-empty slot.
    pub fn bars(&self) -> Vec<(usize, u64)> {
        let mut bars: Vec<(usize, u64)> = self
            .histogram
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(k, c)| (k, *c))
            .collect();
        if self.rest > 0 {
            bars.push((self.histogram.len(), self.rest));
        }
        bars
    }

    fn slot_label(&self, k: usize) -> String {
        match k {
            _ if k < self.histogram.len() => bucket_label(k),
            _ if k == self.histogram.len() && self.rest > 0 => self.rest_label.to_string(),
            _ => String::new(),
        }
    }
}

/// A bucket's distances on the axis: `0`, `1`, `2-3`, ... `512-1023`, then
/// `2^10-2^11-1` style past a thousand, where plain numbers stop fitting.
pub fn bucket_label(k: usize) -> String {
    let (lo, hi) = ulp_bucket_range(k);
    match k {
        0 | 1 => lo.to_string(),
        2..=10 => format!("{lo}-{hi}"),
        _ => format!("2^{}-2^{}-1", k - 1, k),
    }
}

/// `part` of `whole` in percent, never rounded to 0 or 100 when it is not.
fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        return "of none".into();
    }
    let p = part as f64 * 100.0 / whole as f64;
    let s = format!("{p:.3}%");
    if part > 0 && s == "0.000%" {
        "<0.001%".into()
    } else if part < whole && s == "100.000%" {
        ">99.999%".into()
    } else {
        s
    }
}

/// A report's cases against their `expect` files: a panel per arena that
/// differs (per rank and arena for a reduce-scatter's per-rank files).
pub fn report_panels(r: &Report) -> Result<Vec<Panel>, PlotError> {
    let mut out = Vec::new();
    for c in &r.cases {
        let dtype = c.params.dtype.unwrap_or_default();
        let ranked = c
            .expect
            .iter()
            .map(|e| (None, e))
            .chain(c.expect_ranks.iter().enumerate().map(|(r, e)| (Some(r), e)));
        for (rank, e) in ranked {
            for a in e.arenas.iter().filter(|a| a.differing > 0) {
                let tensor = c
                    .params
                    .addends
                    .as_ref()
                    .and_then(|p| p.arenas.get(a.index))
                    .map_or(String::new(), |s| format!(" `{}`", s.name));
                let what = format!(
                    "case `{}`{} arena {}{tensor}",
                    c.id,
                    rank.map_or(String::new(), |r| format!(" rank {r}")),
                    a.index
                );
                let counted: u64 = a.ulp_histogram.iter().sum();
                if a.ulp_histogram.is_empty() && a.max_ulp.is_some() {
                    return Err(PlotError::NoHistogram {
                        what,
                        differing: a.differing,
                    });
                }
                out.push(Panel {
                    what,
                    dtype,
                    len: a.len,
                    differing: a.differing,
                    histogram: a.ulp_histogram.clone(),
                    // A checked report counts no more than differ.
                    rest: (a.differing as u64).saturating_sub(counted),
                    rest_label: "NaN",
                });
            }
        }
    }
    Ok(out)
}

/// Two dump directories: a panel per file that differs.
pub fn dump_panels(cmp: &DumpComparison) -> Vec<Panel> {
    cmp.differing
        .iter()
        .map(|f| {
            let counted: u64 = f.histogram.iter().sum();
            let rest_label = if f.dtypes.is_some() {
                "other dtype"
            } else if f.lens.0 != f.lens.1 {
                "NaN or unpaired"
            } else {
                "NaN"
            };
            Panel {
                what: f.name.clone(),
                dtype: f.dtype,
                len: f.lens.0.max(f.lens.1),
                differing: f.differing,
                histogram: f.histogram.clone(),
                rest: (f.differing as u64).saturating_sub(counted),
                rest_label,
            }
        })
        .collect()
}

/// The picture: `heading` on top, then one panel per entry of `panels`,
/// or one that says there is no difference.
pub fn svg(heading: &str, panels: &[Panel]) -> Result<String, PlotError> {
    let slots = panels.iter().map(Panel::slots).max().unwrap_or(0) as u32;
    let width = (160 + slots * SLOT_WIDTH).max(760);
    let height = HEADING_HEIGHT + PANEL_HEIGHT * (panels.len().max(1) as u32);
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        let body = root
            .titled(heading, ("sans-serif", 22).into_font())
            .map_err(draw)?;
        if panels.is_empty() {
            body.draw(&Text::new(
                "no differences: every element compared is equal bit for bit",
                ((width / 2) as i32, (PANEL_HEIGHT / 2) as i32),
                TextStyle::from(("sans-serif", 18).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Center)),
            ))
            .map_err(draw)?;
        } else {
            let areas = body.split_evenly((panels.len(), 1));
            for (p, area) in panels.iter().zip(&areas) {
                draw_panel(p, area)?;
            }
        }
        root.present().map_err(draw)?;
    }
    Ok(text)
}

fn draw<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

fn draw_panel(
    p: &Panel,
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
) -> Result<(), PlotError> {
    let slots = p.slots() as u32;
    let top = p.bars().iter().map(|b| b.1).max().unwrap_or(1) as f64;
    // From half an element, so that a bar of one has a height; room above
    // the tallest bar for its count.
    let mut chart = ChartBuilder::on(area)
        .caption(p.title(), ("sans-serif", 17))
        .margin(10)
        .x_label_area_size(42)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (0u32..slots).into_segmented(),
            (0.5f64..top * 4.0).log_scale(),
        )
        .map_err(draw)?;
    let dtype = p.dtype;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize + 1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(k) => p.slot_label(*k as usize),
            _ => String::new(),
        })
        // Powers of ten only: the count axis is logarithmic.
        .y_label_formatter(&|v| {
            let e = v.log10().round();
            if (v - 10f64.powf(e)).abs() < 1e-6 * v {
                format!("{v:.0}")
            } else {
                String::new()
            }
        })
        .x_desc(format!("ULP distance, in {dtype} steps"))
        .y_desc("elements (log scale)")
        .draw()
        .map_err(draw)?;
    let bars = p.bars();
    chart
        .draw_series(bars.iter().map(|&(k, c)| {
            let fill = if k < p.histogram.len() {
                BAR_FILL
            } else {
                REST_FILL
            };
            let k = k as u32;
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(k), 0.5),
                    (SegmentValue::Exact(k + 1), c as f64),
                ],
                fill.filled(),
            );
            r.set_margin(0, 0, 8, 8);
            r
        }))
        .map_err(draw)?;
    chart
        .draw_series(bars.iter().map(|&(k, c)| {
            Text::new(
                c.to_string(),
                (SegmentValue::CenterOf(k as u32), c as f64),
                TextStyle::from(("sans-serif", 13).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(draw)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_labels_name_powers_of_two() {
        let labels: Vec<String> = (0..5).map(bucket_label).collect();
        assert_eq!(labels, ["0", "1", "2-3", "4-7", "8-15"]);
        assert_eq!(bucket_label(10), "512-1023");
        assert_eq!(bucket_label(11), "2^10-2^11-1");
    }

    #[test]
    fn a_fraction_is_never_rounded_to_none_or_all() {
        assert_eq!(percent(1, 4), "25.000%");
        assert_eq!(percent(1, 10_000_000), "<0.001%");
        assert_eq!(percent(9_999_999, 10_000_000), ">99.999%");
        assert_eq!(percent(0, 5), "0.000%");
        assert_eq!(percent(5, 5), "100.000%");
    }
}
