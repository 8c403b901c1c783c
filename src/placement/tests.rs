//! Unit and model-based tests of [`FreeIndex`].

use std::collections::{BTreeMap, HashMap};

use super::*;
use cuarena_testkit::Rng;

/// `alloc` as `(allocation, offset)`.
fn alloc(index: &mut FreeIndex, size: u64, align: u64) -> Option<(Allocation, u64)> {
    index.alloc(size, align).map(|a| {
        let o = a.offset();
        (a, o)
    })
}

fn free(index: &mut FreeIndex, a: Allocation) {
    index.free(a).expect("free of a live allocation");
}

fn check(index: &FreeIndex) {
    if let Err(e) = index.check_invariants() {
        panic!("invariant broken: {e}\n{index:?}");
    }
}

fn free_list(index: &FreeIndex) -> Vec<(u64, u64)> {
    index
        .regions()
        .filter(|r| r.slot.is_none())
        .map(|r| (r.offset, r.size))
        .collect()
}

fn pad(offset: u64, align: u64) -> u64 {
    offset.wrapping_neg() & (align - 1)
}

#[test]
fn new_and_empty() {
    let index = FreeIndex::new(1000);
    check(&index);
    assert_eq!(index.capacity(), 1000);
    assert_eq!(
        index.regions().collect::<Vec<_>>(),
        [Region {
            offset: 0,
            size: 1000,
            slot: None
        }]
    );
    assert_eq!(
        index.report(),
        StorageReport {
            free_bytes: 1000,
            largest_free_bytes: 1000,
            free_regions: 1,
            used_blocks: 0
        }
    );

    let mut zero = FreeIndex::new(0);
    check(&zero);
    assert_eq!(zero.regions().count(), 0);
    assert_eq!(alloc(&mut zero, 1, 1), None);
    assert_eq!(zero.largest_free(), 0);
    assert!(format!("{zero:?}").contains("FreeIndex"));
}

#[test]
fn alloc_free_coalesce() {
    let mut index = FreeIndex::new(1000);
    let (a, oa) = alloc(&mut index, 100, 1).unwrap();
    let (b, ob) = alloc(&mut index, 200, 1).unwrap();
    let (c, oc) = alloc(&mut index, 300, 1).unwrap();
    check(&index);
    // One free region, so blocks are carved from its front in order.
    assert_eq!((oa, ob, oc), (0, 100, 300));
    assert_eq!((a.size(), b.size(), c.size()), (100, 200, 300));
    assert_eq!(c.offset(), 300);
    assert_eq!(index.free_bytes(), 400);
    assert_eq!(alloc(&mut index, 401, 1), None);

    free(&mut index, b);
    check(&index);
    assert_eq!(free_list(&index), [(100, 200), (600, 400)]);
    free(&mut index, a); // merges with the hole after it
    check(&index);
    assert_eq!(free_list(&index), [(0, 300), (600, 400)]);
    free(&mut index, c); // merges on both sides
    check(&index);
    assert_eq!(free_list(&index), [(0, 1000)]);
    assert_eq!(index.report().used_blocks, 0);

    // Fill exactly, then nothing fits.
    let (d, od) = alloc(&mut index, 1000, 1).unwrap();
    assert_eq!(od, 0);
    assert_eq!(alloc(&mut index, 1, 1), None);
    assert_eq!(
        index.report(),
        StorageReport {
            used_blocks: 1,
            ..Default::default()
        }
    );
    free(&mut index, d);
    check(&index);
}

#[test]
fn fill_and_drain() {
    // Filling a fresh index carves every block off the front of the one big
    // region (the in-place path); draining in a scrambled order merges back.
    let mut index = FreeIndex::new(1 << 30);
    let mut rng = Rng::new(7);
    let mut blocks = Vec::new();
    let mut end = 0;
    for _ in 0..2000 {
        let size = 256 * (1 + rng.below(16));
        let (id, offset) = alloc(&mut index, size, 256).unwrap();
        assert_eq!(offset, end);
        end += size;
        blocks.push(id);
    }
    check(&index);
    assert_eq!(free_list(&index), [(end, (1 << 30) - end)]);
    for i in (1..blocks.len()).rev() {
        blocks.swap(i, rng.below(i as u64 + 1) as usize);
    }
    for (k, id) in blocks.into_iter().enumerate() {
        free(&mut index, id);
        if k % 97 == 0 {
            check(&index);
        }
    }
    check(&index);
    assert_eq!(free_list(&index), [(0, 1 << 30)]);
}

/// Builds an index whose only free space is `holes` (sorted, disjoint, not
/// adjacent, inside `[0, capacity)`).
fn with_holes(capacity: u64, holes: &[(u64, u64)]) -> FreeIndex {
    let mut used = Vec::new();
    let mut cursor = 0;
    for &(o, s) in holes {
        if o > cursor {
            used.push((cursor, o - cursor));
        }
        cursor = o + s;
    }
    if capacity > cursor {
        used.push((cursor, capacity - cursor));
    }
    let mut index = FreeIndex::new(capacity);
    let mut ids = Vec::new();
    index.rebuild(&used, &mut ids).expect("valid layout");
    check(&index);
    assert_eq!(free_list(&index), holes);
    index
}

#[test]
fn exact_fit_alone_in_its_class() {
    // 1000 is not a class boundary, so its class also holds smaller sizes and
    // the good-fit search (classes that surely fit) skips it.
    assert_ne!(bins::bin_round_down(1000), bins::bin_round_up(1000));
    let mut index = with_holes(10_000, &[(256, 1000)]);
    assert_eq!(index.largest_free(), 1000);
    let (node, offset) = alloc(&mut index, 1000, 1).unwrap();
    assert_eq!((offset, node.size()), (256, 1000));
    assert_eq!(index.free_bytes(), 0);
    check(&index);

    // One byte short: exact failure.
    let mut index = with_holes(10_000, &[(256, 999)]);
    assert_eq!(alloc(&mut index, 1000, 1), None);
    // With a smaller same-class region listed first, the scan goes on.
    let mut index = with_holes(10_000, &[(256, 999), (2000, 1000), (4000, 990)]);
    assert_eq!(alloc(&mut index, 1000, 1).map(|(_, o)| o), Some(2000));
    check(&index);
}

#[test]
fn alignment() {
    // Free space starts at 768, an odd multiple of 256.
    let mut index = with_holes(3 * 4096, &[(768, 3 * 4096 - 768)]);
    let (node, offset) = alloc(&mut index, 256, 4096).unwrap();
    assert_eq!(offset, 4096);
    assert_eq!(node.offset(), 4096);
    check(&index);
    // The padding stays free and the tail too.
    assert_eq!(
        free_list(&index),
        [(768, 4096 - 768), (4096 + 256, 2 * 4096 - 256)]
    );
    // Every 256-multiple offset can take 256-aligned blocks without padding.
    let (_, o) = alloc(&mut index, 256, 256).unwrap();
    assert_eq!(o % 256, 0);
    check(&index);

    // A hole that fits only with all its padding used: size + align - 1 does
    // not fit, so only the exact scan finds it.
    let mut index = with_holes(3 * 4096, &[(768, 4096 + 256 - 768)]);
    let (_, offset) = alloc(&mut index, 256, 4096).unwrap();
    assert_eq!(offset, 4096);
    assert_eq!(free_list(&index), [(768, 4096 - 768)]);
    check(&index);
    // One byte short.
    let mut index = with_holes(3 * 4096, &[(768, 4096 + 255 - 768)]);
    assert_eq!(alloc(&mut index, 256, 4096), None);

    // The head of the good-fit class is misaligned but a larger class fits.
    let mut index = with_holes(1 << 20, &[(768, 600), (8192, 64 * 1024)]);
    let (_, offset) = alloc(&mut index, 512, 4096).unwrap();
    assert_eq!(offset, 8192);
    check(&index);

    // Huge alignments.
    let mut index = FreeIndex::new(u64::MAX);
    let (_, o1) = alloc(&mut index, 1, 1).unwrap();
    let (_, o2) = alloc(&mut index, 1, 1 << 63).unwrap();
    assert_eq!((o1, o2), (0, 1 << 63));
    assert_eq!(alloc(&mut index, 1 << 63, 1 << 63), None);
    check(&index);
}

#[test]
fn huge_sizes() {
    let mut index = FreeIndex::new(u64::MAX);
    assert_eq!(index.largest_free(), u64::MAX);
    let (a, _) = alloc(&mut index, u64::MAX - 10, 1).unwrap();
    assert_eq!(alloc(&mut index, 11, 1), None);
    let (b, ob) = alloc(&mut index, 10, 1).unwrap();
    assert_eq!(ob, u64::MAX - 10);
    assert_eq!(index.free_bytes(), 0);
    check(&index);
    free(&mut index, a);
    free(&mut index, b);
    check(&index);
    assert_eq!(alloc(&mut index, u64::MAX, 1).map(|(_, o)| o), Some(0));
    assert_eq!(
        FreeIndex::new(5 << 40)
            .alloc(3 << 40, 1 << 40)
            .map(|a| a.offset()),
        Some(0)
    );
}

#[test]
fn rebuild_layout_and_reuse() {
    let mut index = FreeIndex::new(10_000);
    for _ in 0..50 {
        let _ = alloc(&mut index, 100, 1).unwrap();
    }
    let used = [(0, 10), (10, 20), (100, 50), (9_000, 1_000)];
    let mut ids = Vec::new();
    index.rebuild(&used, &mut ids).expect("valid layout");
    check(&index);
    assert_eq!(ids.len(), 4);
    for (id, &(o, s)) in ids.iter().zip(&used) {
        assert_eq!((id.offset(), id.size()), (o, s));
    }
    let regions: Vec<_> = index.regions().collect();
    assert_eq!(
        regions,
        [
            Region {
                offset: 0,
                size: 10,
                slot: Some(ids[0].slot())
            },
            Region {
                offset: 10,
                size: 20,
                slot: Some(ids[1].slot())
            },
            Region {
                offset: 30,
                size: 70,
                slot: None
            },
            Region {
                offset: 100,
                size: 50,
                slot: Some(ids[2].slot())
            },
            Region {
                offset: 150,
                size: 8_850,
                slot: None
            },
            Region {
                offset: 9_000,
                size: 1_000,
                slot: Some(ids[3].slot())
            },
        ]
    );
    assert_eq!(index.report().free_bytes, 70 + 8_850);

    // Warm: a second rebuild of the same size allocates nothing new.
    let slots = index.nodes.capacity();
    let out_cap = ids.capacity();
    index.rebuild(&used, &mut ids).expect("valid layout");
    assert_eq!((index.nodes.capacity(), ids.capacity()), (slots, out_cap));
    index.rebuild(&[], &mut ids).expect("valid layout");
    assert!(ids.is_empty());
    assert_eq!(free_list(&index), [(0, 10_000)]);
    check(&index);
    index
        .rebuild(&[(0, 10_000)], &mut ids)
        .expect("valid layout");
    assert_eq!(index.free_bytes(), 0);
    check(&index);
}

/// Free ranges as a `BTreeMap` (offset -> size) and used blocks by id.
#[derive(Default)]
struct Model {
    capacity: u64,
    free: BTreeMap<u64, u64>,
    used: HashMap<u32, (u64, u64)>,
}

impl Model {
    fn new(capacity: u64) -> Self {
        let mut m = Model {
            capacity,
            ..Model::default()
        };
        if capacity > 0 {
            m.free.insert(0, capacity);
        }
        m
    }

    fn fits(&self, size: u64, align: u64) -> bool {
        self.free
            .iter()
            .any(|(&o, &s)| s >= pad(o, align) && s - pad(o, align) >= size)
    }

    /// Whether `offset` lies in the free region that ends the space.
    fn in_top(&self, offset: u64) -> bool {
        self.free
            .range(..=offset)
            .next_back()
            .is_some_and(|(&o, &s)| o + s == self.capacity && offset < o + s)
    }

    fn fits_below_top(&self, size: u64, align: u64) -> bool {
        self.free.iter().any(|(&o, &s)| {
            o + s < self.capacity && s >= pad(o, align) && s - pad(o, align) >= size
        })
    }

    fn take(&mut self, offset: u64, size: u64) {
        let (&o, &s) = self
            .free
            .range(..=offset)
            .next_back()
            .expect("alloc outside free space");
        assert!(
            offset + size <= o + s,
            "alloc [{offset}, +{size}) overruns free [{o}, +{s})"
        );
        self.free.remove(&o);
        if offset > o {
            self.free.insert(o, offset - o);
        }
        if o + s > offset + size {
            self.free.insert(offset + size, o + s - offset - size);
        }
    }

    fn give(&mut self, mut offset: u64, mut size: u64) {
        if let Some((&o, &s)) = self.free.range(..offset).next_back() {
            assert!(o + s <= offset);
            if o + s == offset {
                self.free.remove(&o);
                offset = o;
                size += s;
            }
        }
        if let Some(&s) = self.free.get(&(offset + size)) {
            self.free.remove(&(offset + size));
            size += s;
        }
        self.free.insert(offset, size);
    }
}

fn compare(index: &FreeIndex, model: &Model) {
    check(index);
    let free: Vec<(u64, u64)> = model.free.iter().map(|(&o, &s)| (o, s)).collect();
    assert_eq!(free_list(index), free);
    let mut used: Vec<(u64, u64, u32)> =
        model.used.iter().map(|(&id, &(o, s))| (o, s, id)).collect();
    used.sort_unstable();
    let regions: Vec<(u64, u64, u32)> = index
        .regions()
        .filter_map(|r| Some((r.offset, r.size, r.slot?)))
        .collect();
    assert_eq!(regions, used);
    assert_eq!(
        index.largest_free(),
        model.free.values().copied().max().unwrap_or(0)
    );
}

fn random_request(rng: &mut Rng, model: &Model, capacity: u64) -> (u64, u64) {
    let size = match rng.below(10) {
        0..=2 => 1 + rng.below(300),
        3..=5 => 256 * (1 + rng.below(64)),
        6 => 1 + rng.below(capacity / 4),
        // Exactly the size of some free region (exact-fit path).
        7 | 8 if !model.free.is_empty() => {
            let k = rng.below(model.free.len() as u64) as usize;
            let s = *model.free.values().nth(k).unwrap();
            s - rng.below(2).min(s - 1)
        }
        _ => 1 + rng.below(5000),
    };
    let align = match rng.below(8) {
        0..=2 => 1,
        3..=4 => 256,
        _ => 1 << rng.below(14),
    };
    (size, align)
}

fn run_model(seed: u64, capacity: u64, ops: usize, fit: Fit) {
    let mut rng = Rng::new(seed);
    let mut index = FreeIndex::new(capacity).with_fit(fit);
    let mut model = Model::new(capacity);
    let mut live: Vec<Allocation> = Vec::new();
    let mut ids = Vec::new();
    let (mut hits, mut misses) = (0, 0);
    for step in 0..ops {
        match rng.below(100) {
            0..=54 => {
                let (size, align) = random_request(&mut rng, &model, capacity);
                let expect = model.fits(size, align);
                match alloc(&mut index, size, align) {
                    Some((a, offset)) => {
                        assert!(
                            expect,
                            "step {step}: alloc({size}, {align}) succeeded but nothing fits"
                        );
                        assert_eq!(offset % align, 0);
                        assert_eq!((a.offset(), a.size()), (offset, size));
                        if fit == Fit::Best && model.in_top(offset) {
                            assert!(
                                !model.fits_below_top(size, align),
                                "step {step}: took the top with a region below that fits"
                            );
                        }
                        model.take(offset, size);
                        assert!(
                            model.used.insert(a.slot(), (offset, size)).is_none(),
                            "slot {} reused while live",
                            a.slot()
                        );
                        live.push(a);
                        hits += 1;
                    }
                    None => {
                        assert!(
                            !expect,
                            "step {step}: alloc({size}, {align}) failed but a region fits"
                        );
                        misses += 1;
                    }
                }
            }
            55..=97 if !live.is_empty() => {
                let a = live.swap_remove(rng.below(live.len() as u64) as usize);
                let (o, s) = model.used.remove(&a.slot()).unwrap();
                free(&mut index, a);
                model.give(o, s);
            }
            _ => {
                // Rebuild from the current layout, as after a compaction that
                // moved nothing; ids are renamed.
                let mut layout: Vec<(u64, u64, u32)> =
                    model.used.iter().map(|(&id, &(o, s))| (o, s, id)).collect();
                layout.sort_unstable();
                let used: Vec<(u64, u64)> = layout.iter().map(|&(o, s, _)| (o, s)).collect();
                index.rebuild(&used, &mut ids).expect("valid layout");
                model.used = ids.iter().zip(&used).map(|(a, &r)| (a.slot(), r)).collect();
                live = std::mem::take(&mut ids);
            }
        }
        compare(&index, &model);
    }
    assert!(
        hits > ops / 10 && misses > 0,
        "weak test: {hits} hits, {misses} misses"
    );
}

#[test]
fn random_ops_match_reference_model() {
    for fit in [Fit::Good, Fit::Best] {
        run_model(1, 1 << 20, 4000, fit);
        run_model(2, 1_000_003, 4000, fit);
        run_model(3, 64 * 1024, 3000, fit);
        run_model(4, 5_000_000_000, 2000, fit);
    }
}

#[test]
fn foreign_and_stale_allocations_are_refused() {
    let mut a = FreeIndex::new(1000);
    let mut b = FreeIndex::new(1000);
    let x = a.alloc(100, 1).expect("fits");
    let y = b.alloc(100, 1).expect("fits");
    // Same offset, same slot, another index: refused, `b` unchanged.
    assert_eq!((x.offset(), x.slot()), (y.offset(), y.slot()));
    let before = b.report();
    assert_eq!(
        b.free(x),
        Err(PlacementError::ForeignAllocation { offset: 0 })
    );
    assert_eq!(b.report(), before);
    check(&b);
    // An allocation made before a rebuild is void after it.
    let mut out = Vec::new();
    b.rebuild(&[(0, 100)], &mut out).expect("valid layout");
    let before = b.report();
    assert!(matches!(
        b.free(y),
        Err(PlacementError::ForeignAllocation { .. })
    ));
    assert_eq!(b.report(), before);
    check(&b);
    let fresh = out.pop().expect("one block");
    assert_eq!(b.free(fresh), Ok(()));
    assert_eq!(free_list(&b), [(0, 1000)]);
}

#[test]
fn invalid_rebuild_layouts_change_nothing() {
    let mut index = FreeIndex::new(u64::MAX);
    let keep = index.alloc(1 << 62, 1 << 62).expect("fits");
    let before: Vec<Region> = index.regions().collect();
    let mut out = Vec::new();
    let near = u64::MAX - 10;
    for bad in [
        &[(0, 10), (5, 10)][..],           // overlap
        &[(10, 10), (0, 5)][..],           // not ascending
        &[(0, 0)][..],                     // empty
        &[(near, 11)][..],                 // end == 2^64: past the capacity
        &[(near, u64::MAX)][..],           // end overflows u64
        &[(0, 1), (near, 20), (1, 1)][..], // overflow, then wrap back
    ] {
        assert!(
            matches!(
                index.rebuild(bad, &mut out),
                Err(PlacementError::InvalidLayout { .. })
            ),
            "{bad:?}"
        );
        assert_eq!(index.regions().collect::<Vec<_>>(), before);
        assert!(out.is_empty());
    }
    index.free(keep).expect("still valid: nothing was rebuilt");
    check(&index);
    let mut small = FreeIndex::new(100);
    assert!(small.rebuild(&[(50, 51)], &mut out).is_err());
    assert!(small.rebuild(&[(50, 50)], &mut out).is_ok());
    check(&small);
}

/// `alloc_high` takes the region `alloc` would, carved from its top, and
/// fails exactly when `alloc` does: random requests against one index of
/// each kind, checked against each other and the invariants.
#[test]
fn alloc_high_carves_the_top_and_fails_exactly() {
    let mut index = FreeIndex::new(1 << 20);
    let a = index.alloc_high(4096, 256).expect("fits");
    assert_eq!(a.offset(), (1 << 20) - 4096);
    let b = index.alloc(4096, 256).expect("fits");
    assert_eq!(b.offset(), 0);
    check(&index);

    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut high, mut live) = (FreeIndex::new(1 << 22), Vec::new());
    for step in 0..20_000 {
        if rnd() % 3 == 0 && !live.is_empty() {
            let i = (rnd() as usize) % live.len();
            high.free(live.swap_remove(i)).expect("free");
        } else {
            let size = 1 + rnd() % (1 << 16);
            let align = 1 << (rnd() % 12);
            // Whether any free region holds it (what exact failure means).
            let mut probe = high.clone();
            let fits = probe.alloc(size, align).is_some();
            match high.alloc_high(size, align) {
                Some(a) => {
                    assert!(fits, "step {step}");
                    assert_eq!(a.offset() % align, 0);
                    live.push(a);
                }
                None => assert!(!fits, "step {step}: {size} B at {align} failed"),
            }
        }
        if step % 1000 == 0 {
            check(&high);
        }
    }
    check(&high);
}
