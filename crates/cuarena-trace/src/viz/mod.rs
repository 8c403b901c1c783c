//! Pictures of an arena as self-contained SVG strings (no dependency, no
//! browser): a timeline of memory over a trace replay, and memory maps of
//! the region (for example before and after a compaction).
//!
//! Both functions are pure: plain data in, a string out. Every number is
//! clamped so that any input (empty, out of range, overlapping) yields a
//! valid picture rather than a panic or a `NaN` coordinate.

mod map;
mod timeline;

pub use map::memory_map_svg;
pub use timeline::timeline_svg;

use std::fmt::Write as _;

/// One point of a [`Timeline`], taken after an event of a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Index of the trace event just replayed.
    pub event: u64,
    /// Bytes reserved by live blocks.
    pub live_bytes: u64,
    /// Free bytes (capacity minus live).
    pub free_bytes: u64,
    /// Largest contiguous free region.
    pub largest_free_bytes: u64,
}

/// The data of [`timeline_svg`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// The arena's capacity (drawn as a horizontal line).
    pub capacity_bytes: u64,
    /// Samples in event order.
    pub samples: Vec<Sample>,
    /// Compactions as `(event, full, bytes moved)`; `full` is false for a
    /// targeted compaction.
    pub compactions: Vec<(u64, bool, u64)>,
    /// Other allocators' reserved bytes as `(label, [(event, bytes)])`,
    /// each series a step function in event order.
    pub baselines: Vec<(String, Vec<(u64, u64)>)>,
    /// Title line.
    pub title: String,
}

/// One bar of [`memory_map_svg`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryMap {
    /// Label above the bar.
    pub title: String,
    /// Bytes of the region.
    pub capacity_bytes: u64,
    /// Live blocks as `(offset, len, pinned)`, in any order.
    pub blocks: Vec<(u64, u64, bool)>,
}

/// Escapes text for SVG content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A byte unit for axis labels, chosen so the largest value reads well.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Unit {
    pub name: &'static str,
    pub bytes: f64,
}

pub(crate) fn unit_for(max_bytes: u64) -> Unit {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if max_bytes >= GIB {
        Unit {
            name: "GiB",
            bytes: GIB as f64,
        }
    } else if max_bytes >= MIB {
        Unit {
            name: "MiB",
            bytes: MIB as f64,
        }
    } else {
        Unit {
            name: "KiB",
            bytes: 1024.0,
        }
    }
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) that divides
/// `range` into about `target` intervals.
pub(crate) fn nice_step(range: f64, target: f64) -> f64 {
    if !(range.is_finite() && range > 0.0 && target > 0.0) {
        return 1.0;
    }
    let raw = range / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let m = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Tick values `0, step, 2 step, ... <= max` (at most 64).
pub(crate) fn ticks(max: f64, step: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut v = 0.0;
    while v <= max * (1.0 + 1e-9) && out.len() < 64 {
        out.push(v);
        v += step;
    }
    out
}

/// Formats a tick value with as many decimals as the step needs.
pub(crate) fn fmt_tick(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    };
    format!("{v:.decimals$}")
}

/// A coordinate for SVG output: finite, one decimal.
pub(crate) fn c(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "0".to_owned()
    }
}

/// Opens an SVG document of `w` x `h` pixels with a white background.
pub(crate) fn svg_open(out: &mut String, w: u32, h: u32) {
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>"#
    );
}

/// A tick under an x axis at height `y`: a 5 px line at `x`, and `label`
/// `label_dy` below the axis.
pub(crate) fn x_tick(out: &mut String, x: f64, y: f64, label_dy: f64, label: &str) {
    let _ = writeln!(
        out,
        "<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333\"/><text x=\"{0}\" y=\"{3}\">{4}</text>",
        c(x),
        c(y),
        c(y + 5.0),
        c(y + label_dy),
        label
    );
}

/// Closes the document [`svg_open`] began.
pub(crate) fn svg_close(mut out: String) -> String {
    out.push_str("</svg>\n");
    out
}

/// Human-readable bytes for labels.
pub(crate) fn fmt_bytes(b: u64) -> String {
    cuarena::fmt_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_are_total() {
        assert_eq!(esc("a<b>&\"'\u{1}"), "a&lt;b&gt;&amp;&quot;&apos; ");
        assert_eq!(nice_step(10.0, 5.0), 2.0);
        assert_eq!(nice_step(0.0, 5.0), 1.0);
        assert_eq!(nice_step(f64::NAN, 5.0), 1.0);
        assert_eq!(ticks(1.0, 0.25).len(), 5);
        assert_eq!(fmt_tick(0.5, 0.5), "0.5");
        assert_eq!(fmt_tick(20.0, 5.0), "20");
        assert_eq!(c(f64::INFINITY), "0");
        assert_eq!(unit_for(3 << 30).name, "GiB");
        assert_eq!(unit_for(3 << 20).name, "MiB");
        assert_eq!(unit_for(3).name, "KiB");
    }
}
