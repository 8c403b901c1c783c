//! Memory maps: the region as a horizontal bar, live blocks coloured by
//! address, pinned blocks hatched with a red outline, free space light.

use std::fmt::Write as _;

use super::{
    c, esc, fmt_bytes, fmt_tick, nice_step, svg_close, svg_open, ticks, unit_for, x_tick, MemoryMap,
};

const WIDTH: u32 = 1200;
const LEFT: f64 = 20.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 16.0;
/// Vertical space per map: title, bar, tick labels.
const ROW: f64 = 96.0;
const BAR_Y: f64 = 24.0;
const BAR_H: f64 = 36.0;
/// Narrowest rectangle drawn, so tiny blocks stay visible.
const MIN_W: f64 = 0.4;

/// Free regions `(start, end)` of one map, in address order.
fn holes_of(m: &MemoryMap) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = m
        .blocks
        .iter()
        .filter_map(|&(o, l, _)| {
            let start = o.min(m.capacity_bytes);
            let end = o.saturating_add(l).min(m.capacity_bytes);
            (end > start).then_some((start, end))
        })
        .collect();
    spans.sort_unstable();
    let mut holes = Vec::new();
    let mut cursor = 0u64;
    for (s, e) in spans {
        if s > cursor {
            holes.push((cursor, s));
        }
        cursor = cursor.max(e);
    }
    if m.capacity_bytes > cursor {
        holes.push((cursor, m.capacity_bytes));
    }
    holes
}

/// Live, free, holes and largest hole of one map, from its blocks (clamped
/// to the region; overlaps counted once).
fn summarize(m: &MemoryMap) -> (u64, u64, usize, u64) {
    let holes = holes_of(m);
    let free = holes.iter().map(|h| h.1 - h.0).sum::<u64>();
    let largest = holes.iter().map(|h| h.1 - h.0).max().unwrap_or(0);
    (m.capacity_bytes - free, free, holes.len(), largest)
}

/// Draws one bar per map, stacked (for example "before" and "after" a
/// compaction). Blocks are coloured by offset (hue runs across the region,
/// neighbours alternate in lightness), pinned blocks are hatched with a red
/// outline, free space is light grey with a mark above each hole.
/// Each bar has a title with live/free bytes, the number of holes and the
/// largest one, and tick labels in GiB (MiB or KiB for small regions).
pub fn memory_map_svg(maps: &[MemoryMap]) -> String {
    let height = (TOP + ROW * maps.len().max(1) as f64 + 24.0).ceil() as u32;
    let bar_w = f64::from(WIDTH) - LEFT - RIGHT;
    let mut out = String::new();
    svg_open(&mut out, WIDTH, height);
    let _ = writeln!(
        out,
        r##"<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-width="2" stroke-opacity="0.45"/></pattern></defs>"##
    );
    for (i, m) in maps.iter().enumerate() {
        let y0 = TOP + ROW * i as f64;
        let cap = m.capacity_bytes.max(1) as f64;
        let px = |b: u64| LEFT + (b.min(m.capacity_bytes) as f64 / cap) * bar_w;
        let (live, free, holes, largest) = summarize(m);
        let pinned = m.blocks.iter().filter(|b| b.2).count();
        let _ = writeln!(out, "<g>");
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" font-weight="bold">{}</text><text x="{}" y="{}" text-anchor="end" fill="#333">{} blocks ({} pinned), live {}, free {} in {} hole(s), largest hole {}</text>"##,
            c(LEFT),
            c(y0 + 14.0),
            esc(&m.title),
            c(LEFT + bar_w),
            c(y0 + 14.0),
            m.blocks.len(),
            pinned,
            fmt_bytes(live),
            fmt_bytes(free),
            holes,
            fmt_bytes(largest)
        );
        let by = y0 + BAR_Y;
        let _ = writeln!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#eeeeee\" stroke=\"#999\"/>",
            c(LEFT),
            c(by),
            c(bar_w),
            c(BAR_H)
        );
        // Unpinned first, pinned on top so their outline is never covered.
        // Neighbours alternate in lightness so adjacent blocks stay apart.
        let mut order: Vec<usize> = (0..m.blocks.len()).collect();
        order.sort_unstable_by_key(|&i| m.blocks[i].0);
        for want_pinned in [false, true] {
            for (rank, &i) in order.iter().enumerate() {
                let (o, l, p) = m.blocks[i];
                if p != want_pinned || o >= m.capacity_bytes || l == 0 {
                    continue;
                }
                let x = px(o);
                let w = (px(o.saturating_add(l)) - x).max(MIN_W);
                let hue = (o as f64 / cap * 280.0).clamp(0.0, 360.0);
                let light = if rank % 2 == 0 { 52 } else { 64 };
                let _ = write!(
                    out,
                    r#"<rect x="{}" y="{}" width="{}" height="{}" fill="hsl({:.0},65%,{light}%)"/>"#,
                    c(x),
                    c(by),
                    c(w),
                    c(BAR_H),
                    hue
                );
                if p {
                    let _ = write!(
                        out,
                        "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"url(#hatch)\" stroke=\"#d00\" stroke-width=\"1.5\"/>",
                        c(x),
                        c(by),
                        c(w),
                        c(BAR_H)
                    );
                }
                out.push('\n');
            }
        }
        // A mark above every hole: at GiB scale a hole of a few MiB is
        // thinner than a pixel.
        let _ = write!(out, "<g fill=\"#555\">");
        for (hs, he) in holes_of(m) {
            let x = (px(hs) + px(he)) / 2.0;
            let _ = write!(
                out,
                r#"<path d="M{} {} l3 -5 l-6 0 z"/>"#,
                c(x),
                c(by - 1.0)
            );
        }
        let _ = writeln!(out, "</g>");
        // Ticks.
        let unit = unit_for(m.capacity_bytes);
        let cap_units = m.capacity_bytes as f64 / unit.bytes;
        let step = nice_step(cap_units, 10.0);
        let _ = writeln!(
            out,
            "<g text-anchor=\"middle\" fill=\"#333\" font-size=\"11\">"
        );
        for v in ticks(cap_units, step) {
            let x = px((v * unit.bytes) as u64);
            x_tick(&mut out, x, by + BAR_H, 17.0, &fmt_tick(v, step));
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">offset ({})</text>"#,
            c(LEFT + bar_w),
            c(by + BAR_H + 31.0),
            unit.name
        );
        let _ = writeln!(out, "</g>");
        let _ = writeln!(out, "</g>");
    }
    svg_close(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_holes_and_clamps() {
        let m = MemoryMap {
            title: "t".into(),
            capacity_bytes: 100,
            blocks: vec![
                (10, 10, false),
                (15, 10, true),
                (90, 50, false),
                (200, 1, false),
            ],
        };
        // Live: 10..25 and 90..100; holes: 0..10, 25..90.
        assert_eq!(summarize(&m), (25, 75, 2, 65));
        let empty = MemoryMap::default();
        assert_eq!(summarize(&empty), (0, 0, 0, 0));
        let s = memory_map_svg(&[m, empty]);
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(!s.contains("NaN"));
        assert!(memory_map_svg(&[]).starts_with("<svg"));
    }
}
