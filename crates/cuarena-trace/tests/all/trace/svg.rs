//! The SVG pictures: the timeline and the memory map.

use cuarena_trace::viz::{memory_map_svg, timeline_svg, MemoryMap, Sample, Timeline};

/// Open and close counts of an element agree.
fn balanced(svg: &str, tag: &str) -> bool {
    let open = svg.matches(&format!("<{tag} ")).count() + svg.matches(&format!("<{tag}>")).count();
    open == svg.matches(&format!("</{tag}>")).count()
}

fn well_formed_ish(svg: &str) {
    assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    for tag in ["svg", "g", "text", "defs", "pattern"] {
        assert!(balanced(svg, tag), "unbalanced <{tag}>");
    }
    assert_eq!(svg.matches('<').count(), svg.matches('>').count());
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
}

#[test]
fn timeline_svg_has_lines_and_labels() {
    const GIB: u64 = 1 << 30;
    let samples: Vec<Sample> = (0..20_000u64)
        .map(|i| {
            let live = (i % 1000) * GIB / 100;
            Sample {
                event: i,
                live_bytes: live,
                free_bytes: 12 * GIB - live,
                largest_free_bytes: (12 * GIB - live) / 2,
            }
        })
        .collect();
    let t = Timeline {
        capacity_bytes: 12 * GIB,
        samples,
        compactions: vec![(500, false, GIB), (900, true, 3 * GIB)],
        baselines: vec![(
            "PyTorch <reserved>".into(),
            vec![(0, GIB), (10_000, 15 * GIB)],
        )],
        title: "resnet & friends".into(),
    };
    let svg = timeline_svg(&t);
    well_formed_ish(&svg);
    for label in [
        "event index",
        "memory (GiB)",
        "resnet &amp; friends",
        "PyTorch &lt;reserved&gt;",
        "capacity 12.00 GiB",
        "largest free hole",
        "1 targeted compactions",
        "1 full compactions",
    ] {
        assert!(svg.contains(label), "missing {label}");
    }
    // Downsampled: no line has more than a few thousand points.
    for line in svg.lines().filter(|l| l.starts_with("<polyline")) {
        assert!(line.matches(',').count() <= 3_100);
    }
}

#[test]
fn memory_map_svg_has_bars_and_labels() {
    const MIB: u64 = 1 << 20;
    let before = MemoryMap {
        title: "before".into(),
        capacity_bytes: 2048 * MIB,
        blocks: vec![
            (0, 100 * MIB, false),
            (300 * MIB, 50 * MIB, true),
            (1000 * MIB, MIB, false),
        ],
    };
    let after = MemoryMap {
        title: "after".into(),
        capacity_bytes: 2048 * MIB,
        blocks: vec![
            (0, 100 * MIB, false),
            (300 * MIB, 50 * MIB, true),
            (100 * MIB, MIB, false),
        ],
    };
    let svg = memory_map_svg(&[before, after]);
    well_formed_ish(&svg);
    for label in [
        "before",
        "after",
        "offset (GiB)",
        "1 pinned",
        "url(#hatch)",
        "3 hole(s)",
    ] {
        assert!(svg.contains(label), "missing {label}");
    }
    let small = memory_map_svg(&[MemoryMap {
        title: "small".into(),
        capacity_bytes: 64 * MIB,
        blocks: vec![],
    }]);
    well_formed_ish(&small);
    assert!(small.contains("offset (MiB)"));
}
