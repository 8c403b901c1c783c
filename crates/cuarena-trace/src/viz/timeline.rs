//! Memory over a replay: live bytes, free bytes and the largest free hole
//! against event index, with the capacity, compactions and other
//! allocators' reserved bytes.

use std::fmt::Write as _;

use super::{
    c, esc, fmt_bytes, fmt_tick, nice_step, svg_close, svg_open, ticks, unit_for, x_tick, Timeline,
};

const WIDTH: u32 = 1440;
const HEIGHT: u32 = 560;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 380.0; // room for the legend
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// Buckets along x; each keeps its min and max, so at most twice this many
/// points per line, and no peak is lost.
const BUCKETS: u64 = 1500;

const LIVE: &str = "#1f77b4";
const FREE: &str = "#2ca02c";
const HOLE: &str = "#ff7f0e";
const CAPACITY: &str = "#d62728";
const TARGETED: &str = "#9467bd";
const FULL: &str = "#7b0a0a";
const BASELINES: [&str; 5] = ["#7f7f7f", "#8c564b", "#e377c2", "#17becf", "#bcbd22"];

/// Keeps, per bucket of x, the points with the smallest and largest y, in x
/// order. Points must be sorted by x.
fn downsample(points: &[(u64, u64)], x0: u64, x1: u64) -> Vec<(u64, u64)> {
    let span = u128::from(x1.saturating_sub(x0)) + 1;
    if points.len() as u64 <= 2 * BUCKETS {
        return points.to_vec();
    }
    let bucket_of = |x: u64| (u128::from(x.saturating_sub(x0)) * u128::from(BUCKETS) / span) as u64;
    let mut out = Vec::with_capacity(2 * BUCKETS as usize + 2);
    let mut i = 0;
    while i < points.len() {
        let b = bucket_of(points[i].0);
        let (mut lo, mut hi) = (i, i);
        let mut j = i;
        while j < points.len() && bucket_of(points[j].0) == b {
            if points[j].1 < points[lo].1 {
                lo = j;
            }
            if points[j].1 > points[hi].1 {
                hi = j;
            }
            j += 1;
        }
        let (a, z) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        out.push(points[a]);
        if z != a {
            out.push(points[z]);
        }
        i = j;
    }
    out
}

/// Maps data to pixels.
struct Frame {
    x0: u64,
    x1: u64,
    y_max: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Frame {
    fn x(&self, e: u64) -> f64 {
        let span = (self.x1 - self.x0).max(1) as f64;
        LEFT + (e.clamp(self.x0, self.x1) - self.x0) as f64 / span * self.plot_w
    }
    fn y(&self, bytes: u64) -> f64 {
        let v = (bytes as f64 / self.y_max).clamp(0.0, 1.0);
        TOP + self.plot_h * (1.0 - v)
    }
}

fn polyline(out: &mut String, f: &Frame, pts: &[(u64, u64)], color: &str, dash: Option<&str>) {
    if pts.is_empty() {
        return;
    }
    let mut d = String::with_capacity(pts.len() * 14);
    for (x, y) in pts {
        let _ = write!(d, "{},{} ", c(f.x(*x)), c(f.y(*y)));
    }
    let dash = dash
        .map(|d| format!(r#" stroke-dasharray="{d}""#))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        r#"<polyline fill="none" stroke="{color}" stroke-width="1.3"{dash} points="{}"/>"#,
        d.trim_end()
    );
}

/// Turns a step series into corner points so it draws as steps, extended
/// to `x_end`.
fn steps(pts: &[(u64, u64)], x_end: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(pts.len() * 2 + 1);
    for (i, &(x, y)) in pts.iter().enumerate() {
        if i > 0 {
            out.push((x, pts[i - 1].1));
        }
        out.push((x, y));
    }
    if let Some(&(x, y)) = pts.last() {
        if x < x_end {
            out.push((x_end, y));
        }
    }
    out
}

/// Draws a [`Timeline`] as an SVG document.
///
/// Lines: live bytes (blue), free bytes (green), largest free hole
/// (orange), each baseline's reserved bytes (dashed, as steps); capacity
/// as a red dashed horizontal line; compactions as triangles on the top
/// edge with a faint dotted line down the plot (small purple: targeted,
/// large dark red: full). Axes: event index and
/// bytes in GiB (MiB or KiB for small arenas). Each line is downsampled to
/// at most 3,000 points, keeping each bucket's minimum and maximum.
pub fn timeline_svg(t: &Timeline) -> String {
    let plot_w = f64::from(WIDTH) - LEFT - RIGHT;
    let plot_h = f64::from(HEIGHT) - TOP - BOTTOM;

    let mut x0 = u64::MAX;
    let mut x1 = 0u64;
    let mut y_top = t.capacity_bytes;
    let mut see = |x: u64, y: u64| {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y_top = y_top.max(y);
    };
    for s in &t.samples {
        see(
            s.event,
            s.live_bytes.max(s.free_bytes).max(s.largest_free_bytes),
        );
    }
    for (e, _, _) in &t.compactions {
        see(*e, 0);
    }
    for (_, series) in &t.baselines {
        for (e, b) in series {
            see(*e, *b);
        }
    }
    if x0 > x1 {
        (x0, x1) = (0, 1);
    }
    if x1 == x0 {
        x1 = x0.saturating_add(1);
    }
    let unit = unit_for(y_top);
    let top_units = (y_top as f64 / unit.bytes).max(1e-9) * 1.05;
    let y_step = nice_step(top_units, 6.0);
    let y_max_units = (top_units / y_step).ceil() * y_step;
    let f = Frame {
        x0,
        x1,
        y_max: (y_max_units * unit.bytes).max(1.0),
        plot_w,
        plot_h,
    };

    let mut out = String::new();
    svg_open(&mut out, WIDTH, HEIGHT);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="28" font-size="16" font-weight="bold">{}</text>"#,
        LEFT,
        esc(&t.title)
    );

    // Axes and grid.
    let _ = writeln!(out, "<g stroke=\"#ccc\" stroke-width=\"0.6\">");
    let yt = ticks(y_max_units, y_step);
    for v in &yt {
        let y = f.y((v * unit.bytes) as u64);
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}"/>"#,
            c(LEFT),
            c(y),
            c(LEFT + plot_w),
            c(y)
        );
    }
    let _ = writeln!(out, "</g>");
    let _ = writeln!(out, "<g text-anchor=\"end\" fill=\"#333\">");
    for v in &yt {
        let y = f.y((v * unit.bytes) as u64);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}">{}</text>"#,
            c(LEFT - 6.0),
            c(y + 4.0),
            fmt_tick(*v, y_step)
        );
    }
    let _ = writeln!(out, "</g>");
    let x_step = nice_step((x1 - x0) as f64, 8.0).max(1.0);
    let _ = writeln!(out, "<g text-anchor=\"middle\" fill=\"#333\">");
    let first = ((x0 as f64 / x_step).ceil() * x_step) as u64;
    let mut xv = first;
    for _ in 0..64 {
        if xv > x1 {
            break;
        }
        let x = f.x(xv);
        x_tick(&mut out, x, TOP + plot_h, 18.0, &xv.to_string());
        xv = xv.saturating_add(x_step as u64);
    }
    let _ = writeln!(out, "</g>");
    let _ = writeln!(
        out,
        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>",
        c(LEFT),
        c(TOP),
        c(plot_w),
        c(plot_h)
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">event index</text>"#,
        c(LEFT + plot_w / 2.0),
        c(f64::from(HEIGHT) - 18.0)
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">memory ({1})</text>"#,
        c(TOP + plot_h / 2.0),
        unit.name
    );

    // Lines.
    for (i, (_, series)) in t.baselines.iter().enumerate() {
        let mut s = series.clone();
        s.sort_by_key(|p| p.0);
        let pts = downsample(&steps(&s, x1), x0, x1);
        polyline(
            &mut out,
            &f,
            &pts,
            BASELINES[i % BASELINES.len()],
            Some("6 3"),
        );
    }
    let pick = |g: fn(&super::Sample) -> u64| -> Vec<(u64, u64)> {
        let pts: Vec<(u64, u64)> = t.samples.iter().map(|s| (s.event, g(s))).collect();
        downsample(&pts, x0, x1)
    };
    polyline(&mut out, &f, &pick(|s| s.free_bytes), FREE, None);
    polyline(&mut out, &f, &pick(|s| s.largest_free_bytes), HOLE, None);
    polyline(&mut out, &f, &pick(|s| s.live_bytes), LIVE, None);
    if t.capacity_bytes > 0 {
        let y = f.y(t.capacity_bytes);
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{CAPACITY}" stroke-width="1.5" stroke-dasharray="8 4"/>"#,
            c(LEFT),
            c(y),
            c(LEFT + plot_w),
            c(y)
        );
    }

    // Compactions: a triangle on the top edge and a faint line through the
    // plot, one per pixel column and kind (thousands would otherwise hide
    // the lines, so the faint line is dropped past 200).
    let mut sorted: Vec<&(u64, bool, u64)> = t.compactions.iter().collect();
    sorted.sort_by_key(|p| p.0);
    let mut marks: Vec<(f64, bool)> = Vec::new();
    for (e, full, _) in sorted {
        let x = f.x(*e).round();
        if !marks.iter().rev().take(4).any(|m| m.0 == x && m.1 == *full) {
            marks.push((x, *full));
        }
    }
    let _ = writeln!(out, "<g stroke-width=\"1\">");
    for &(x, full) in &marks {
        let color = if full { FULL } else { TARGETED };
        if marks.len() <= 200 {
            let _ = writeln!(
                out,
                r#"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="{color}" stroke-opacity="0.35" stroke-dasharray="2 3"/>"#,
                c(x),
                c(TOP),
                c(TOP + plot_h)
            );
        }
        let h = if full { 10.0 } else { 7.0 };
        let _ = writeln!(
            out,
            r#"<path d="M{} {} l{} {} l{} 0 z" fill="{color}"/>"#,
            c(x - h / 2.0),
            c(TOP - h),
            c(h / 2.0),
            c(h),
            c(h / 2.0)
        );
    }
    let _ = writeln!(out, "</g>");

    // Legend.
    let lx = LEFT + plot_w + 16.0;
    let mut ly = TOP + 8.0;
    let mut entry = |out: &mut String, color: &str, dash: &str, label: &str| {
        let _ = writeln!(
            out,
            r#"<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            c(lx),
            c(ly),
            c(lx + 24.0),
            c(ly),
            c(lx + 30.0),
            c(ly + 4.0),
            esc(label)
        );
        ly += 20.0;
    };
    let peak = t.samples.iter().map(|s| s.live_bytes).max().unwrap_or(0);
    let _ = writeln!(out, "<g>");
    entry(
        &mut out,
        LIVE,
        "",
        &format!("live (peak {})", fmt_bytes(peak)),
    );
    entry(&mut out, FREE, "", "free");
    entry(&mut out, HOLE, "", "largest free hole");
    entry(
        &mut out,
        CAPACITY,
        r#" stroke-dasharray="8 4""#,
        &format!("capacity {}", fmt_bytes(t.capacity_bytes)),
    );
    for (i, (label, series)) in t.baselines.iter().enumerate() {
        let peak = series.iter().map(|p| p.1).max().unwrap_or(0);
        entry(
            &mut out,
            BASELINES[i % BASELINES.len()],
            r#" stroke-dasharray="6 3""#,
            &format!("{label} (max {})", fmt_bytes(peak)),
        );
    }
    for (color, kind, full) in [(TARGETED, "targeted", false), (FULL, "full", true)] {
        let (n, moved) = t
            .compactions
            .iter()
            .filter(|c| c.1 == full)
            .fold((0, 0u64), |(n, b), c| (n + 1, b.saturating_add(c.2)));
        entry(
            &mut out,
            color,
            r#" stroke-dasharray="2 3""#,
            &format!("{n} {kind} compactions, {} moved", fmt_bytes(moved)),
        );
    }
    let _ = writeln!(out, "</g>");
    svg_close(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::viz::Sample;

    #[test]
    fn downsample_keeps_extremes_and_bounds_points() {
        let pts: Vec<(u64, u64)> = (0..100_000u64).map(|i| (i, i % 977)).collect();
        let mut spiky = pts.clone();
        spiky[54_321].1 = 1_000_000;
        let d = downsample(&spiky, 0, 99_999);
        assert!(d.len() <= 2 * BUCKETS as usize);
        assert!(d.contains(&(54_321, 1_000_000)));
        assert!(d.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn degenerate_timelines_draw() {
        for t in [
            Timeline::default(),
            Timeline {
                capacity_bytes: u64::MAX,
                samples: vec![Sample {
                    event: u64::MAX,
                    live_bytes: u64::MAX,
                    free_bytes: 0,
                    largest_free_bytes: 0,
                }],
                compactions: vec![(u64::MAX, true, u64::MAX), (0, false, u64::MAX)],
                baselines: vec![("b<&>".into(), vec![(5, 1), (1, 9)])],
                title: String::new(),
            },
        ] {
            let s = timeline_svg(&t);
            assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
            assert!(!s.contains("NaN") && !s.contains("inf"));
        }
    }
}
