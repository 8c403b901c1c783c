//! The model's rules on small traces built by hand (CSV: no `segments`, so
//! runs start empty).

use super::{AllocatorSettings, Session};
use crate::trace::Trace;

const MIB: u64 = 1 << 20;

/// A CSV trace of `(action, addr, size)` lines on stream 0.
fn csv(lines: &[(&str, u64, u64)]) -> Trace {
    let mut s = String::from("action,addr,size,stream,time_us\n");
    for (i, (a, addr, size)) in lines.iter().enumerate() {
        s.push_str(&format!("{a},{addr},{size},0,{i}\n"));
    }
    Trace::from_bytes(s.as_bytes(), "test").unwrap()
}

fn run(t: &Trace, conf: &str) -> super::SimReport {
    let s = Session::new(t, 0).unwrap();
    s.run(&AllocatorSettings::parse_conf(conf).unwrap())
        .unwrap()
}

#[test]
fn pools_and_segment_sizes() {
    let t = csv(&[
        ("alloc", 1, 40),           // small pool: a 2 MiB segment
        ("alloc", 2, 40),           // split from it
        ("alloc", 3, 5 * MIB),      // large, under 10 MiB: a 20 MiB segment
        ("alloc", 4, 12 * MIB),     // the 15 MiB left of it holds this
        ("alloc", 5, 25 * MIB + 1), // a segment of its own, rounded to 2 MiB
    ]);
    let r = run(&t, "");
    let e = r.segment_events;
    assert_eq!((e.alloc, e.alloc_bytes), (3, (2 + 20 + 26) * MIB));
    assert_eq!(r.reserved_peak_bytes, 48 * MIB);
    // Under roundup_power2_divisions:4 the 12 MiB request rounds to 12 MiB
    // (a step of [8, 16) MiB) and 25 MiB + 1 to 28 MiB.
    let r = run(&t, "roundup_power2_divisions:4");
    assert_eq!(r.segment_events.alloc_bytes, (2 + 20 + 28) * MIB);
}

#[test]
fn freed_blocks_merge_and_are_reused() {
    let t = csv(&[
        ("alloc", 1, 8 * MIB),
        ("alloc", 2, 8 * MIB),
        ("free_requested", 1, 8 * MIB),
        ("free_completed", 1, 8 * MIB),
        ("free_requested", 2, 8 * MIB),
        ("free_completed", 2, 8 * MIB),
        // The whole 20 MiB segment is free again: 18 MiB fit.
        ("alloc", 3, 18 * MIB),
    ]);
    let r = run(&t, "");
    assert_eq!(r.segment_events.alloc, 1);
    // A block given back only at its free_completed: before it, a new
    // segment.
    let t = csv(&[
        ("alloc", 1, 30 * MIB),
        ("free_requested", 1, 30 * MIB),
        ("alloc", 2, 30 * MIB),
        ("free_completed", 1, 30 * MIB),
    ]);
    assert_eq!(run(&t, "").segment_events.alloc, 2);
}

#[test]
fn max_split_size_keeps_large_blocks_whole() {
    let t = csv(&[
        ("alloc", 1, 200 * MIB),
        ("free_requested", 1, 200 * MIB),
        ("free_completed", 1, 200 * MIB),
        ("alloc", 2, 50 * MIB),
    ]);
    // By default the 50 MiB request splits the cached 200 MiB block.
    assert_eq!(run(&t, "").segment_events.alloc, 1);
    // With max_split_size_mb:128 an oversize block serves no smaller
    // request: a new segment.
    let r = run(&t, "max_split_size_mb:128");
    assert_eq!(
        (r.segment_events.alloc, r.segment_events.alloc_bytes),
        (2, 250 * MIB)
    );
}

#[test]
fn expandable_segments_map_pages() {
    let t = csv(&[
        ("alloc", 1, 5 * MIB),
        ("alloc", 2, 30 * MIB),
        ("alloc", 3, 40),
        ("free_requested", 2, 30 * MIB),
        ("free_completed", 2, 30 * MIB),
        ("alloc", 4, 30 * MIB),
    ]);
    let r = run(&t, "expandable_segments:True");
    let e = r.segment_events;
    // 20 MiB pages in the large pool: 5 MiB maps one; 30 MiB grow the
    // 15 MiB left free at its end by one more page; the small pool maps one
    // 2 MiB page; the freed 30 MiB are reused.
    assert_eq!(e.alloc, 0);
    assert_eq!((e.map, e.map_bytes), (3, 42 * MIB));
    assert_eq!(r.reserved_peak_bytes, 42 * MIB);
}

#[test]
fn empty_cache_is_found_and_repeated() {
    // Segments freed with no request after them that needs the memory:
    // `torch.cuda.empty_cache()`.
    let t = csv(&[
        ("alloc", 1, 30 * MIB),
        ("segment_alloc", 100, 30 * MIB),
        ("free_requested", 1, 30 * MIB),
        ("free_completed", 1, 30 * MIB),
        ("segment_free", 100, 30 * MIB),
        ("alloc", 2, 40 * MIB),
        ("segment_alloc", 200, 40 * MIB),
    ]);
    let s = Session::new(&t, 0).unwrap();
    let rec = s.recorded();
    assert_eq!(rec.empty_cache_events, vec![4]);
    assert_eq!(rec.segment_events, s.truth().segment_events);
    assert_eq!(rec.reserved_peak_bytes, 40 * MIB);
    // Under other settings the cache is emptied at the same event.
    let exp = s
        .run(&AllocatorSettings::parse_conf("expandable_segments:True").unwrap())
        .unwrap();
    assert_eq!(exp.empty_cache_events, vec![4]);
    assert_eq!(exp.segment_events.unmap, 1);
}

#[test]
fn at_the_limit_cached_blocks_are_released_and_the_request_retried() {
    // A request of 90 MiB with 60 MiB reserved under a cap: PyTorch
    // releases the cached 30 MiB segment, retries, and records the `oom`;
    // then 40 MiB fit (70 MiB reserved, the peak). Runs are held to that
    // peak: the recording's segment_free is the model's own retry, not an
    // empty_cache() call.
    let t = csv(&[
        ("alloc", 1, 30 * MIB),
        ("segment_alloc", 100, 30 * MIB),
        ("alloc", 2, 30 * MIB),
        ("segment_alloc", 200, 30 * MIB),
        ("free_requested", 1, 30 * MIB),
        ("free_completed", 1, 30 * MIB),
        ("segment_free", 100, 30 * MIB),
        ("oom", 0, 90 * MIB),
        ("alloc", 3, 40 * MIB),
        ("segment_alloc", 300, 40 * MIB),
    ]);
    let s = Session::new(&t, 0).unwrap();
    let rec = s.recorded();
    assert_eq!(s.cap_bytes(), Some(70 * MIB));
    assert!(rec.empty_cache_events.is_empty());
    assert_eq!(rec.segment_events, s.truth().segment_events);
    assert_eq!(rec.ooms.len(), 1);
    assert!(rec.ooms[0].recorded);
    assert_eq!(rec.ooms[0].requested_bytes, 90 * MIB);
    assert_eq!(rec.ooms[0].reserved_bytes, 30 * MIB);
    // With no limit nothing is released and the 90 MiB are served; the
    // 40 MiB then split the cached 90 MiB block.
    assert_eq!(rec.unlimited_peak_bytes, Some(150 * MIB));
}
