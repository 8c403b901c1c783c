//! Model-based tests: random programs of alloc / aligned alloc / free /
//! write / pin / unpin / compact / alloc-that-forces-compaction / bad input,
//! and of owned storage (typed, untyped, zeroed and empty storages; clones,
//! slices, drops and reclaim; sub-range writes and reads, copies, fills;
//! stream uses and bad stream ids), run against a naive model and checked after every step: no two live
//! blocks overlap, all in bounds and aligned, every live block holds exactly
//! the bytes last written, the stats equal the model's, errors leave the
//! arena unchanged, and an allocation fails only when it truly cannot fit.
//!
//! The same driver runs on every backend; `tests/all/gpu.rs` runs it on CUDA.
//!
//! This file holds the tests and the program runners; the driver is in
//! `model/`: `ops.rs` (the ops and their seeded generators), `driver.rs`
//! (the model, its block steps and the invariant checks) and `storage.rs`
//! (the owned-storage, copy, fill and stream steps).

mod driver;
mod ops;
mod storage;

pub(crate) use driver::Model;
pub(crate) use ops::Op;

use cuarena::backend::Backend;
use cuarena::{Arena, ArenaConfig, CompactionPolicy, Error};
use cuarena_testkit::Rng;
use ops::{gen_huge_op, gen_op};
use proptest::prelude::*;

/// Runs a seeded random program of `steps` ops on `arena`, checking after
/// each step (bytes after every step that moved something). Panics on any
/// mismatch. Used by the GPU suite.
#[allow(dead_code)]
pub(crate) fn run_random_program<B: Backend>(arena: &mut Arena<B>, seed: u64, steps: usize) {
    let cap = arena.config().capacity_bytes;
    run_random_program_on(Model::new(arena, false), seed, steps, cap);
}

fn run_random_program_on<B: Backend>(mut model: Model<'_, B>, seed: u64, steps: usize, cap: u64) {
    let mut rng = Rng::new(seed);
    for step in 0..steps {
        let op = gen_op(&mut rng, cap);
        model.step(&op, step);
    }
    model.finish(steps);
}

/// Metadata arenas of capacities up to `u64::MAX`, with blocks of 2^62 to
/// 2^63 B at alignments up to the maximum: no overlap, every block in
/// bounds and aligned, stats consistent, errors change nothing, and an
/// allocation without pins or raised alignments fails only when it
/// exceeds the free bytes.
#[test]
fn metadata_arenas_near_two_to_the_64() {
    let max_align = cuarena::ArenaConfig::MAX_ALIGN;
    let configs = [
        (u64::MAX, 1),
        (u64::MAX - 255, 256),
        (u64::MAX - (max_align - 1), max_align),
        (3 << 62, 256),
        (1 << 63, 1 << 12),
        ((1 << 63) + (1 << 62) + 4096, 4096),
    ];
    let (mut compactions, mut ooms) = (0, 0);
    for (i, &(cap, align)) in configs.iter().enumerate() {
        for seed in 0..8u64 {
            let config = ArenaConfig::new(cap).with_alignment_bytes(align);
            let mut arena = Arena::metadata(config).expect("arena");
            let failed_before = arena.stats().failed_allocs;
            {
                let mut model = Model::new(&mut arena, false);
                let mut rng = Rng::new(seed * 31 + i as u64);
                for step in 0..300 {
                    let op = gen_huge_op(&mut rng, cap);
                    model.step(&op, step);
                }
            }
            let st = arena.stats();
            compactions += st.targeted_compactions + st.full_compactions;
            ooms += st.failed_allocs - failed_before;
        }
    }
    assert!(
        compactions > 50 && ooms > 50,
        "weak test: {compactions} compactions, {ooms} failed allocs"
    );
}

/// Reading a block larger than host memory is an error, not an abort.
#[test]
fn reading_a_block_larger_than_memory_is_an_error() {
    let mut arena = Arena::metadata(ArenaConfig::new(1 << 62)).expect("arena");
    let h = arena.alloc(1 << 61).expect("alloc");
    let before = arena.blocks();
    assert!(matches!(
        arena.read::<u8>(h),
        Err(Error::HostMemory { requested_bytes, .. }) if requested_bytes == 1 << 61
    ));
    assert!(matches!(
        arena.read::<u64>(h),
        Err(Error::HostMemory { .. })
    ));
    assert_eq!(arena.blocks(), before);
    // The host backend refuses a region it cannot allocate, the same way.
    assert!(matches!(
        Arena::host(ArenaConfig::new(1 << 62)),
        Err(Error::HostMemory { .. })
    ));
    assert!(matches!(
        Arena::host(ArenaConfig::new(4096).with_spill_host_bytes(1 << 62)),
        Err(Error::HostMemory { .. })
    ));
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (1u64..16_384, prop_oneof![4 => Just(0u8), 1 => 9u8..13]).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        5 => (1u8..=255).prop_map(|frac| Op::AllocFree { frac }),
        30 => any::<usize>().prop_map(|idx| Op::Free { idx }),
        8 => (any::<usize>(), any::<u8>()).prop_map(|(idx, seed)| Op::Write { idx, seed }),
        4 => any::<usize>().prop_map(|idx| Op::Pin { idx }),
        5 => any::<usize>().prop_map(|idx| Op::Unpin { idx }),
        3 => Just(Op::Compact),
        1 => Just(Op::ZeroAlloc),
        1 => Just(Op::BadAlign),
        1 => Just(Op::TooLarge),
        2 => Just(Op::DoubleFree),
        1 => Just(Op::ForeignHandle),
        1 => any::<usize>().prop_map(|idx| Op::WrongLengthRead { idx }),
        8 => (any::<u8>(), prop_oneof![1 => Just(0u64), 7 => 1u64..1024]).prop_map(|(kind, len)| Op::AllocStorage { kind, len }),
        2 => any::<usize>().prop_map(|idx| Op::CloneStorage { idx }),
        3 => (any::<usize>(), any::<u64>(), any::<u64>()).prop_map(|(idx, a, b)| Op::SliceStorage { idx, a, b }),
        7 => (any::<usize>(), any::<usize>()).prop_map(|(idx, which)| Op::DropOwner { idx, which }),
        1 => Just(Op::Reclaim),
        4 => (any::<usize>(), any::<u64>(), any::<u64>(), any::<u8>()).prop_map(|(idx, a, b, seed)| Op::WriteRange { idx, a, b, seed }),
        4 => (any::<usize>(), any::<u64>(), any::<u64>()).prop_map(|(idx, a, b)| Op::ReadRange { idx, a, b }),
        4 => (any::<usize>(), prop_oneof![Just(None), any::<usize>().prop_map(Some)], any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>())
            .prop_map(|(src, dst, len, at, to, extra)| Op::CopyRange { src, dst: dst.unwrap_or(src), len, at, to, extra }),
        4 => (any::<usize>(), any::<u64>(), any::<u64>(), any::<u8>(), any::<u8>()).prop_map(|(idx, a, b, width, seed)| Op::FillRange { idx, a, b, width, seed }),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(idx, stream)| Op::RecordStream { idx, stream }),
        1 => any::<u8>().prop_map(|stream| Op::WaitOnArena { stream }),
    ]
}

fn cases() -> u32 {
    std::env::var("CUARENA_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Hundreds of programs of hundreds of steps on the strict host backend.
    #[test]
    fn host_programs_match_the_model(ops in prop::collection::vec(op_strategy(), 1..300), seed in any::<u64>(), align_log2 in 0u32..9) {
        let align = 1u64 << align_log2; // arena alignments from 1 B to 256 B
        let cap = 256 * 1024;
        let backend = cuarena::backend::HostBackend::new(cap).expect("backend").with_seed(seed);
        let mut arena = Arena::with_backend(ArenaConfig::new(cap).with_alignment_bytes(align), backend).expect("arena");
        let streams = [arena.register_stream(()).expect("stream"), arena.register_stream(()).expect("stream")];
        let mut model = Model::new(&mut arena, true).with_streams(&streams);
        for (step, op) in ops.iter().enumerate() {
            model.step(op, step);
        }
        model.finish(ops.len());
    }
}

#[test]
fn seeded_programs_on_the_host_backend() {
    let (mut targeted, mut full) = (0, 0);
    for seed in 0..50 {
        // Both compacting policies: `Auto` defers naive's moves, the
        // default plans its own within its bound.
        let policy = if seed % 2 == 0 {
            CompactionPolicy::Auto
        } else {
            CompactionPolicy::Bounded
        };
        let config = ArenaConfig::new(1 << 20).with_compaction(policy);
        let mut arena = Arena::host(config).expect("arena");
        let streams = [arena.register_stream(()).expect("stream")];
        let model = Model::new(&mut arena, true).with_streams(&streams);
        run_random_program_on(model, seed, 400, 1 << 20);
        targeted += arena.stats().targeted_compactions;
        full += arena.stats().full_compactions;
    }
    // The programs must exercise both planners, or they prove little.
    assert!(
        targeted > 20 && full > 20,
        "targeted {targeted}, full {full}"
    );
}

#[test]
fn seeded_programs_on_the_metadata_backend() {
    for seed in 0..50 {
        let mut arena = Arena::metadata(ArenaConfig::new(1 << 20)).expect("arena");
        run_random_program(&mut arena, seed, 400);
    }
}

/// Many small blocks and frequent requests for a share of the free bytes:
/// programs where the compaction pacer's rules (a full compaction when a
/// targeted one would cost as much, or when planning outruns its budget)
/// fire, checked against the model at every step. With no pins and
/// the default alignment, the model asserts the guarantee: an allocation
/// whose rounded size is at most the free bytes succeeds.
fn small_block_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (1u64..1024).prop_map(|size| Op::Alloc { size, align_log2: 0 }),
        10 => (1u64..4096).prop_map(|size| Op::Alloc { size, align_log2: 0 }),
        12 => (128u8..=255).prop_map(|frac| Op::AllocFree { frac }),
        38 => any::<usize>().prop_map(|idx| Op::Free { idx }),
    ]
}

/// A program that fills a small-granule arena with thousands of blocks,
/// frees every other one, then mixes requests with `ops`.
fn run_policy_program<B: Backend>(arena: &mut Arena<B>, ops: &[Op]) -> cuarena::Stats {
    let cap = arena.config().capacity_bytes;
    let granule = arena.config().alignment_bytes;
    let mut model = Model::new(arena, false);
    let mut step = 0;
    // Fill to about 90 % with one-granule blocks, then free every other.
    let n = (cap / granule) as usize * 9 / 10;
    for _ in 0..n {
        model.step(
            &Op::Alloc {
                size: granule,
                align_log2: 0,
            },
            step,
        );
        step += 1;
    }
    for i in 0..n / 2 {
        model.step(&Op::Free { idx: i }, step);
        step += 1;
    }
    for op in ops {
        model.step(op, step);
        step += 1;
    }
    model.verify_bytes(step);
    model.arena.stats()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: (cases() / if cfg!(debug_assertions) { 100 } else { 20 }).max(2), ..ProptestConfig::default() })]

    #[test]
    fn policy_never_fails_an_allocation_the_free_bytes_allow(
        ops in prop::collection::vec(small_block_strategy(), 100..1500),
        seed in any::<u64>(),
    ) {
        let cap = 1 << 20;
        let backend = cuarena::backend::HostBackend::new(cap).expect("backend").with_seed(seed);
        let mut arena = Arena::with_backend(ArenaConfig::new(cap).with_alignment_bytes(256), backend).expect("arena");
        run_policy_program(&mut arena, &ops);
    }
}

/// The same on metadata arenas with many more blocks (more than
/// `policy::SMALL_PLAN` live, so that plans are charged), long enough that
/// the targeted policy's planning budget runs out (so its full compactions
/// run).
#[test]
fn seeded_policy_programs_on_the_metadata_backend() {
    let mut full = 0;
    // Fewer seeds unoptimised: the model checks every block at every step.
    let seeds: u64 = if cfg!(debug_assertions) { 1 } else { 2 };
    for seed in 0..seeds {
        let config = ArenaConfig::new(4 << 20)
            .with_alignment_bytes(256)
            .with_compaction(CompactionPolicy::Bounded);
        let mut arena = Arena::metadata(config).expect("arena");
        let mut rng = Rng::new(seed);
        let mut next = || rng.next();
        let ops: Vec<Op> = (0..4000)
            .map(|_| match next() % 100 {
                0..=39 => Op::Alloc {
                    size: 1 + next() % 1024,
                    align_log2: 0,
                },
                40..=59 => Op::AllocFree {
                    frac: (128 + next() % 128) as u8,
                },
                _ => Op::Free {
                    idx: next() as usize,
                },
            })
            .collect();
        let st = run_policy_program(&mut arena, &ops);
        full += st.policy.budget_compactions;
    }
    assert!(full > 0, "the planning budget never ran out");
}
