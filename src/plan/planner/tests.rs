//! Unit tests of the planners.

use super::*;

fn blk(key: u64, offset: u64, len: u64) -> LiveBlock {
    LiveBlock::at(key, offset, len, 1)
}
fn pinned(key: u64, offset: u64, len: u64) -> LiveBlock {
    LiveBlock {
        pinned: true,
        ..blk(key, offset, len)
    }
}

/// Applies a plan to a layout and returns the sorted result, checking
/// the plan's validity and that nothing overlaps afterwards.
fn apply(blocks: &[LiveBlock], plan: &Plan, capacity: u64) -> Vec<(u64, u64, u64)> {
    plan.validate_against(blocks, capacity)
        .expect("plan breaks the wave rule");
    let mut out: Vec<(u64, u64, u64)> = blocks.iter().map(|b| (b.offset, b.len, b.key)).collect();
    for m in plan.moves() {
        let e = out
            .iter_mut()
            .find(|e| e.2 == m.key)
            .expect("move of unknown block");
        assert_eq!(e.0, m.src, "move source is not where the block is");
        e.0 = m.dst;
    }
    out.sort_unstable();
    for w in out.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "blocks overlap after plan: {w:?}"
        );
    }
    out
}

#[test]
fn full_slides_everything_down_in_one_wave() {
    let blocks = [blk(1, 100, 50), blk(2, 200, 300), blk(3, 600, 10)];
    let plan = plan_full(&blocks, 1000);
    assert_eq!(plan.waves.len(), 1);
    let out = apply(&blocks, &plan, 1000);
    assert_eq!(out, vec![(0, 50, 1), (50, 300, 2), (350, 10, 3)]);
}

#[test]
fn four_gib_block_sliding_down_by_256_bytes() {
    let g = 4u64 << 30;
    let blocks = [LiveBlock {
        align: 256,
        ..blk(7, 256, g)
    }];
    let plan = plan_full(&blocks, g + 256);
    assert_eq!(plan.move_count(), 1);
    let m = plan.moves().next().copied().expect("one move");
    assert_eq!((m.src, m.dst, m.len), (256, 0, g));
    apply(&blocks, &plan, g + 256);
}

#[test]
fn chain_where_each_destination_covers_the_previous_source() {
    // Adjacent blocks after a small hole: every destination covers the
    // previous block's source; still one wave.
    let blocks: Vec<_> = (0..100).map(|i| blk(i, 16 + i * 1000, 1000)).collect();
    let plan = plan_full(&blocks, 200_000);
    assert_eq!(plan.waves.len(), 1);
    let out = apply(&blocks, &plan, 200_000);
    assert_eq!(out[99].0, 99_000);
}

#[test]
fn holes_between_pins_become_one_region_per_gap() {
    let blocks = [
        blk(1, 10, 10),
        pinned(2, 40, 10),
        blk(3, 60, 10),
        blk(4, 80, 5),
        pinned(5, 90, 10),
    ];
    let plan = plan_full(&blocks, 120);
    let out = apply(&blocks, &plan, 120);
    // Gap [0,40): block 1 at 0 and block 3 moves past the pin into it.
    assert!(out.contains(&(40, 10, 2)) && out.contains(&(90, 10, 5)));
    assert!(out.contains(&(0, 10, 1)));
    let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
    // Free space per gap is one region: count free regions.
    let mut regions = 0;
    let mut cursor = 0;
    for &(o, l) in layout.iter().chain(std::iter::once(&(120, 0))) {
        regions += usize::from(o > cursor);
        cursor = o + l;
    }
    assert!(regions <= 3, "{layout:?}");
}

#[test]
fn all_blocks_pinned_moves_nothing() {
    let blocks = [pinned(1, 10, 10), pinned(2, 40, 10)];
    assert!(plan_full(&blocks, 100).is_empty());
    assert_eq!(
        plan_targeted(&blocks, 100, Request { size: 60, align: 1 }),
        None
    );
    assert_eq!(largest_hole_after_full(&blocks, 100, 1), 50);
}

#[test]
fn targeted_moves_less_than_full() {
    // Many small blocks with holes; a request of 3 holes' worth.
    let mut blocks = Vec::new();
    for i in 0..100u64 {
        blocks.push(blk(i, i * 200, 100));
    }
    let cap = 20_000;
    let req = Request {
        size: 300,
        align: 1,
    };
    let t = plan_targeted(&blocks, cap, req).expect("targeted plan");
    let f = plan_full(&blocks, cap);
    assert!(
        t.bytes_moved() < f.bytes_moved() / 10,
        "{} vs {}",
        t.bytes_moved(),
        f.bytes_moved()
    );
    let out = apply(&blocks, &t, cap);
    let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
    assert!(largest_aligned_hole(&layout, cap, 1) >= 300);
}

#[test]
fn targeted_respects_pins_and_alignment() {
    let blocks = [
        blk(1, 0, 256),
        pinned(2, 512, 256),
        blk(3, 1024, 256),
        blk(4, 1536, 256),
    ];
    let req = Request {
        size: 1024,
        align: 512,
    };
    let t = plan_targeted(&blocks, 4096, req).expect("plan");
    let out = apply(&blocks, &t, 4096);
    assert!(out.contains(&(512, 256, 2)));
    let layout: Vec<(u64, u64)> = out.iter().map(|e| (e.0, e.1)).collect();
    assert!(largest_aligned_hole(&layout, 4096, 512) >= 1024);
}

#[test]
fn targeted_falls_back_to_none_when_pins_split_space() {
    let blocks = [pinned(1, 100, 100), pinned(2, 300, 100)];
    assert_eq!(
        plan_targeted(
            &blocks,
            500,
            Request {
                size: 150,
                align: 1
            }
        ),
        None
    );
}

#[test]
fn align_up_never_wraps() {
    assert_eq!(align_up(u64::MAX - 5, 1 << 62), None);
    assert_eq!(align_up(3 << 62, 1 << 62), Some(3 << 62));
    assert_eq!(align_up((3 << 62) + 1, 1 << 62), None);
    assert_eq!(align_up(u64::MAX, 1), Some(u64::MAX));
}

#[test]
fn near_two_to_the_64() {
    // A region of 2^64 - 2^20 B: blocks of 2^62 B aligned to 2^62, a
    // request whose alignment cannot be met above the last block.
    let cap = u64::MAX - ((1 << 20) - 1);
    let q = 1u64 << 62;
    let a = |key, offset, len, align| LiveBlock {
        align,
        ..blk(key, offset, len)
    };
    let blocks = [a(1, q, q, q), a(2, 3 * q, q - (1 << 20), q)];
    check_live(&blocks, cap).expect("valid input");
    let full = plan_full(&blocks, cap);
    let out = apply(&blocks, &full, cap);
    assert_eq!(out[0], (0, q, 1));
    for req in [
        Request { size: q, align: q },
        Request {
            size: 2 * q,
            align: q,
        },
        Request {
            size: q + 1,
            align: 1 << 40,
        },
        Request {
            size: (1 << 20) + 1,
            align: 256,
        },
    ] {
        if let Some(p) = plan_targeted(&blocks, cap, req) {
            apply(&blocks, &p, cap);
        }
    }
    // Packed: [0, q) and [q, 2q - 2^20); the aligned hole starts at 2q.
    assert_eq!(largest_hole_after_full(&blocks, cap, q), 2 * q - (1 << 20));
    assert_eq!(
        largest_hole_after_full(&blocks, cap, 1 << 63),
        2 * q - (1 << 20)
    );
    // Bad input is refused by the check, and the planners stay total.
    let bad = [a(1, 0, q, 1), a(2, q - 1, 2, 1)];
    assert!(check_live(&bad, cap).is_err());
    let _ = plan_full(&bad, cap);
    let _ = plan_targeted(&bad, cap, Request { size: 10, align: 1 });
    let wrap = [a(1, u64::MAX - 1, 10, 1)];
    assert!(check_live(&wrap, u64::MAX).is_err());
    let _ = plan_full(&wrap, u64::MAX);
    let _ = largest_hole_after_full(&wrap, u64::MAX, 1 << 63);
}
