//! The move kernels on the CUDA backend: plans of every shape the wave rule
//! allows (single blocks, chains, random waves, unaligned offsets, 100,000
//! small blocks, moves ending on the region's last byte), each run with
//! both kernels and checked byte for byte. Plans the backend must refuse
//! or report as faults are in `moves/bad_plans.rs`.

mod bad_plans;

use std::sync::Arc;

use super::{GIB, KIB, MIB};
use cuarena::backend::cuda::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::{CudaBackend, CudaCapacity, CudaOptions};
use cuarena::backend::Backend;
use cuarena::plan::Plan;
use cuarena_testkit::gpu_available;
use cuarena_testkit::test_module;
use cuarena_testkit::{bytes, env_u64, mv, plan_of, Rng};

fn max_block() -> u64 {
    env_u64("CUARENA_GPU_MAX_BLOCK").unwrap_or(4 * GIB)
}

/// The device pattern helpers of `tests/kernels/testing.cu`.
struct Checker {
    _module: Arc<CudaModule>,
    fill: CudaFunction,
    check: CudaFunction,
    stream: Arc<CudaStream>,
    region: u64,
}

impl Checker {
    fn new(backend: &CudaBackend) -> Checker {
        let module = test_module(backend);
        Checker {
            fill: module.load_function("test_fill").expect("test_fill"),
            check: module.load_function("test_check").expect("test_check"),
            _module: module,
            stream: backend.stream().clone(),
            region: backend.region_ptr(),
        }
    }

    /// Writes the pattern of `seed` over `[lo, hi)` (on the arena stream).
    fn fill(&self, lo: u64, hi: u64, seed: u64) {
        let mut b = self.stream.launch_builder(&self.fill);
        b.arg(&self.region).arg(&lo).arg(&hi).arg(&seed);
        let cfg = LaunchConfig {
            grid_dim: (((hi - lo).div_ceil(256)).clamp(1, 8192) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: test_fill(u8*, u64, u64, u64) writes only [lo, hi), which
        // the callers keep inside the region.
        unsafe { b.launch(cfg) }.expect("test_fill launches");
    }

    /// Mismatching bytes of `[lo, hi)` and the first one, where `segs`
    /// (dst, origin, len) says which bytes came from where.
    fn check(&self, segs: &[(u64, u64, u64)], lo: u64, hi: u64, seed: u64) -> (u64, u64) {
        let mut sorted = segs.to_vec();
        sorted.sort_unstable_by_key(|s| s.0);
        let flat: Vec<u64> = sorted.iter().flat_map(|&(d, o, n)| [d, o, n]).collect();
        let flat = if flat.is_empty() { vec![0u64; 3] } else { flat };
        let segs_dev = self.stream.clone_htod(&flat).expect("segments upload");
        let out = self.stream.clone_htod(&[0u64, u64::MAX]).expect("counters");
        let (bad_ptr, first_ptr) = {
            use cuarena::backend::cuda::cudarc::driver::DevicePtr;
            let (p, _g) = out.device_ptr(&self.stream);
            (p, p + 8)
        };
        let chunk: u64 = 4096;
        let threads = (hi - lo).div_ceil(chunk);
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(128).max(1) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let nsegs = sorted.len() as u32;
        let mut b = self.stream.launch_builder(&self.check);
        b.arg(&self.region)
            .arg(&segs_dev)
            .arg(&nsegs)
            .arg(&lo)
            .arg(&hi)
            .arg(&chunk)
            .arg(&seed)
            .arg(&bad_ptr)
            .arg(&first_ptr);
        // SAFETY: test_check reads [lo, hi) of the region and nsegs segments,
        // and writes the two counters of `out`.
        unsafe { b.launch(cfg) }.expect("test_check launches");
        let got = self.stream.clone_dtoh(&out).expect("counters download");
        (got[0], got[1])
    }
}

/// A backend of `capacity` bytes on device 0 with kernel `options`, and
/// its checker.
fn backend(capacity: u64, options: CudaOptions) -> (CudaBackend, Checker) {
    let b =
        CudaBackend::with_options(0, CudaCapacity::Bytes(capacity), options).expect("CUDA backend");
    let c = Checker::new(&b);
    (b, c)
}

/// Runs `test` with each move kernel: the default (the bulk kernel on
/// Hopper, elsewhere registers; a second shape for chunks of large moves),
/// the register kernel (64 KiB tiles), and the bulk kernel with the fewest
/// stages (2) and the most (16, with 8 KiB tiles so that they fit in
/// shared memory); with a side buffer for small waiting parts (the
/// default), a tiny one and none. Prints which one runs, so that a failure
/// names it.
fn each_kernel(mut test: impl FnMut(CudaOptions)) {
    // Every shape but the default's runs alone (no second shape for large
    // moves), so that every wave of a test takes it.
    let one = CudaOptions::default().with_large_moves(false);
    let reg = one.with_bulk_stages(0).with_vectors_per_thread(16);
    let small = one.with_threads_per_cta(128).with_vectors_per_thread(4);
    for (name, options) in [
        ("default", CudaOptions::default()),
        ("registers", reg),
        // Room for a few deferred parts: the first tiles defer, the rest
        // wait.
        (
            "registers, 4 KiB side buffer",
            reg.with_side_buffer_bytes(4096),
        ),
        (
            "bulk, 2 stages of 64 KiB, no side buffer",
            reg.with_bulk_stages(2).with_side_buffer_bytes(0),
        ),
        ("bulk, 16 stages", small.with_bulk_stages(16)),
    ] {
        println!("move kernel: {name} ({options:?})");
        test(options);
    }
}

/// Runs `plan` (waves in order) on a host copy.
fn host_execute(bytes: &mut [u8], plan: &Plan) {
    for wave in plan.waves() {
        let saved: Vec<Vec<u8>> = wave
            .moves()
            .iter()
            .map(|m| bytes[m.src as usize..(m.src + m.len) as usize].to_vec())
            .collect();
        for (m, s) in wave.moves().iter().zip(saved) {
            bytes[m.dst as usize..(m.dst + m.len) as usize].copy_from_slice(&s);
        }
    }
}

/// Fills a backend with random bytes, runs `plan` there and on a host copy,
/// and compares every byte.
fn check_against_host(backend: &mut CudaBackend, plan: &Plan, seed: u64, what: &str) {
    plan.validate(backend.capacity_bytes())
        .unwrap_or_else(|e| panic!("{what}: test built an invalid plan: {e}"));
    let n = backend.capacity_bytes() as usize;
    let mut host = bytes(seed, n as u64);
    backend.write(0, &host).expect("upload");
    backend.execute(plan).expect("execute");
    host_execute(&mut host, plan);
    let mut got = vec![0u8; n];
    backend.read(0, &mut got).expect("download");
    if let Some(i) = (0..n).find(|&i| got[i] != host[i]) {
        panic!(
            "{what}: byte {i} is {:#04x}, expected {:#04x} ({} bytes differ)",
            got[i],
            host[i],
            (0..n).filter(|&j| got[j] != host[j]).count()
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn single_blocks_slide_down_by_every_step() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let cap_block = max_block();
        let sizes: Vec<u64> = [KIB, 64 * KIB, MIB, 64 * MIB, GIB, 4 * GIB]
            .into_iter()
            .filter(|&s| s <= cap_block)
            .collect();
        let slides = [1u64, 24, 16, 256, 4 * KIB, MIB];
        let largest = sizes.iter().copied().max().unwrap_or(KIB);
        let (mut b, c) = backend(largest + 2 * MIB + 4096, options);
        for &size in &sizes {
            for &slide in &slides {
                // Narrow (1 B, 8 B) slides only on the smaller blocks: they are slow
                // and the larger ones add nothing new.
                if slide % 16 != 0 && size > 64 * MIB {
                    continue;
                }
                let seed = size ^ (slide << 40);
                let src = slide + 512;
                let dst = 512;
                let hi = src + size + 512;
                c.fill(0, hi, seed);
                b.execute(&plan_of(vec![vec![mv(src, dst, size)]]))
                    .expect("execute");
                let (bad, first) = c.check(&[(dst, src, size)], 0, hi, seed);
                assert_eq!(
                    bad, 0,
                    "size {size} slide {slide}: {bad} bad bytes, first at {first}"
                );
            }
        }
        b.synchronize().expect("no kernel error");
    });
}

/// A slide by a small shift takes the side buffer (up to the options'
/// most), a larger one or a disabled buffer none; the bytes are checked by
/// the slide tests above and below.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn small_slides_take_the_side_buffer() {
    if !gpu_available() {
        return;
    }
    let default = CudaOptions::default();
    for (options, shift, used) in [
        (default, 256, true),
        (default, 48 * KIB, false),
        (default.with_side_buffer_bytes(0), 256, false),
    ] {
        let (mut b, _) = backend(64 * MIB, options);
        b.execute(&plan_of(vec![vec![mv(shift, 0, 32 * MIB)]]))
            .expect("execute");
        b.synchronize().expect("no kernel error");
        let bytes = b.side_buffer_bytes();
        println!("{options:?}, slide by {shift}: side buffer {bytes} B");
        assert_eq!(bytes > 0, used, "slide by {shift}, {options:?}");
        assert!(bytes <= options.side_buffer_bytes as usize);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn chains_of_adjacent_blocks_slide_down() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let cap_block = max_block().min(64 * MIB);
        let (mut b, c) = backend(4 * cap_block + 4 * MIB, options);
        let mut rng = Rng::new(11);
        for &(count, max_len, slide) in &[
            (2u64, 100 * KIB, 16u64),
            (50, 64 * KIB, 256),
            (1000, 8 * KIB, 16),
            (200, 200 * KIB, 4 * KIB),
            (8, cap_block / 8, MIB),
            (300, 40 * KIB, 1),
            (300, 40 * KIB, 8),
            // Several chunks: the chain continues across launches.
            (5000, 2 * KIB, 16),
        ] {
            // Adjacent blocks starting at `slide`, all sliding down by `slide`.
            let mut moves = Vec::new();
            let mut off = slide;
            for _ in 0..count {
                let align = if slide % 16 == 0 { 16 } else { 1 };
                let len = (rng.range(1, max_len) / align).max(1) * align;
                moves.push(mv(off, off - slide, len));
                off += len;
            }
            let hi = off + 4096;
            assert!(hi <= b.capacity_bytes(), "test sizes fit");
            let seed = count * 7 + slide;
            c.fill(0, hi, seed);
            let segs: Vec<_> = moves.iter().map(|m| (m.dst, m.src, m.len)).collect();
            b.execute(&plan_of(vec![moves])).expect("execute");
            let (bad, first) = c.check(&segs, 0, hi, seed);
            assert_eq!(
                bad, 0,
                "chain of {count} sliding by {slide}: {bad} bad bytes, first at {first}"
            );
        }
        b.synchronize().expect("no kernel error");
    });
}

/// A random valid plan: blocks at `align`-aligned offsets with holes slide
/// down into a packed run (wave 1), some of them then move up into the
/// free space past the run in a scrambled order (wave 2), and the packed
/// blocks below slide down by a few bytes (wave 3).
fn random_plan(rng: &mut Rng, capacity: u64, align: u64, max_len: u64) -> Plan {
    let up = |x: u64| x.div_ceil(align) * align;
    let mut blocks = Vec::new();
    let mut off = up(rng.range(0, 4096));
    while blocks.len() < 400 {
        let len = rng.range(1, max_len);
        if off + len > capacity / 2 {
            break;
        }
        blocks.push((off, len));
        off = up(off
            + len
            + if rng.next() % 3 == 0 {
                0
            } else {
                rng.range(0, max_len)
            });
    }
    // Wave 1: compaction towards offset `base`.
    let first = blocks.first().map_or(0, |b| b.0);
    let base = up(rng.range(0, 64)).min(first);
    let mut wave1 = Vec::new();
    let mut dst = base;
    let mut now = Vec::new();
    for &(src, len) in &blocks {
        if dst != src {
            wave1.push(mv(src, dst, len));
        }
        now.push((dst, len));
        dst = up(dst + len);
    }
    // Wave 2: every third block moves up past everything, in scrambled order.
    let mut wave2 = Vec::new();
    let mut free = up(capacity / 2 + 4096);
    let mut chosen: Vec<usize> = (0..now.len()).filter(|i| i % 3 == 1).collect();
    for i in (1..chosen.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        chosen.swap(i, j);
    }
    let mut dsts = vec![None; now.len()];
    for &i in &chosen {
        dsts[i] = Some(free);
        free = up(free + now[i].1);
    }
    let mut stay = Vec::new();
    for (i, &(src, len)) in now.iter().enumerate() {
        match dsts[i] {
            Some(d) if d + len <= capacity => wave2.push(mv(src, d, len)),
            _ => stay.push((src, len)),
        }
    }
    // Wave 3: the blocks that stayed slide down by `align` steps, packed.
    let mut wave3 = Vec::new();
    if let Some(&(first, _)) = stay.first() {
        let shift = align * rng.range(1, 3);
        if first >= shift {
            let mut d = first - shift;
            for &(src, len) in &stay {
                if d < src {
                    wave3.push(mv(src, d, len));
                    d = up(d + len);
                } else {
                    break;
                }
            }
        }
    }
    plan_of(vec![wave1, wave2, wave3])
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn random_waves_match_a_host_copy_at_every_alignment() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let capacity = 32 * MIB;
        let (mut b, _c) = backend(capacity, options);
        let mut rng = Rng::new(2024);
        for round in 0..24u64 {
            let align = [1u64, 2, 4, 8, 16, 256][(round % 6) as usize];
            let max_len = [3 * KIB, 40 * KIB, 100 * KIB][(round / 6 % 3) as usize];
            let plan = random_plan(&mut rng, capacity, align, max_len);
            check_against_host(
                &mut b,
                &plan,
                round,
                &format!(
                    "round {round} align {align} max_len {max_len} ({} moves)",
                    plan.move_count()
                ),
            );
        }
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn unaligned_offsets_and_lengths_match_a_host_copy() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let capacity = 8 * MIB;
        let (mut b, _c) = backend(capacity, options);
        let mut rng = Rng::new(99);
        for round in 0..40u64 {
            // One move, arbitrary offsets and length, either sliding down over
            // itself or into disjoint space above.
            let len = rng.range(1, 300 * KIB);
            let src = rng.range(0, MIB);
            let dst = if round % 2 == 0 {
                src.saturating_sub(rng.range(1, 5000))
            } else {
                src + len + rng.range(0, 5000)
            };
            check_against_host(
                &mut b,
                &plan_of(vec![vec![mv(src, dst, len)]]),
                round,
                &format!("round {round}"),
            );
        }
    });
}

/// 100,000 blocks of 4-64 KiB slid down into one packed run, in one wave:
/// sizes and holes multiples of 256 B, then of 1 B (the shifting path:
/// most moves' source and destination differ modulo 16).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_hundred_thousand_small_blocks_compact_in_one_wave() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let count = if max_block() < 64 * MIB {
            2_000
        } else {
            100_000
        };
        for unit in [256u64, 1] {
            let mut rng = Rng::new(5 + unit);
            let mut moves = Vec::with_capacity(count);
            let (mut src, mut dst) = (0u64, 0u64);
            for _ in 0..count {
                src += rng.range(0, 64 * KIB / unit) * unit;
                let len = rng.range(4 * KIB / unit, 64 * KIB / unit) * unit;
                moves.push(mv(src, dst, len));
                src += len;
                dst += len;
            }
            let (mut b, c) = backend(src + MIB, options);
            c.fill(0, src, 77);
            let segs: Vec<_> = moves.iter().map(|m| (m.dst, m.src, m.len)).collect();
            b.execute(&plan_of(vec![moves])).expect("execute");
            let (bad, first) = c.check(&segs, 0, src, 77);
            assert_eq!(bad, 0, "unit {unit}: {bad} bad bytes, first at {first}");
            b.synchronize().expect("no kernel error");
        }
    });
}

/// Moves whose source ends on the region's last byte, at every offset
/// modulo 16: the shifting path reads whole aligned vectors and must stay
/// inside the allocation (run under memcheck by the GPU suite).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn unaligned_moves_ending_at_the_region_end_match_a_host_copy() {
    if !gpu_available() {
        return;
    }
    each_kernel(|options| {
        let mut rng = Rng::new(31);
        for round in 0..16u64 {
            let capacity = MIB + rng.range(0, 4095);
            let (mut b, _c) = backend(capacity, options);
            let len = rng.range(1, 200 * KIB);
            let src = capacity - len;
            let dst = if round % 2 == 0 {
                src - rng.range(1, 4 * KIB)
            } else {
                rng.range(0, src - len)
            };
            check_against_host(
                &mut b,
                &plan_of(vec![vec![mv(src, dst, len)]]),
                round,
                &format!("round {round}: capacity {capacity}, {len} B from {src} to {dst}"),
            );
        }
    });
}
