//! GPU tests of the CUDA backend: overlapping moves of every kind the wave
//! rule allows, checked byte for byte (on the device for large blocks,
//! against a host copy for small ones), bad plans, streams, and the
//! model-based random programs on a CUDA arena.
//!
//! The move-kernel tests and their harness are in `gpu/moves.rs`; this
//! file holds what they share and the tests of the arena on CUDA.
//!
//! Every test prints `skipped: <reason>` and passes when no GPU is usable
//! (CI has none). Run them on the GPU machine with
//! `all gpu --test-threads=1` (see `scripts/gpu-suite.sh`).
//!
//! Environment:
//! - `CUARENA_GPU_MAX_BLOCK`: largest block of the overlap tests in bytes
//!   (default 4 GiB; the sanitizer runs use a few MiB).
//! - `CUARENA_GPU_PROGRAMS`: random arena programs to run (default 4000,
//!   about 40 s on an H100).
//! - `CUARENA_GPU_THREADS`: host threads running them, each with its own
//!   arena and stream (default 4; the sanitizer runs use 1).

mod moves;

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::CudaContext;
use cuarena::backend::cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use cuarena::backend::cuda::CudaBackend;
use cuarena::DType;
use cuarena::StreamId;
use cuarena::{graph, Arena, ArenaConfig, Error, Handle};
use cuarena_testkit::gpu_available;
use cuarena_testkit::{env_u64, gpu_arena, test_kernel, Gate};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ---- the arena on CUDA ------------------------------------------------------

const N: usize = 1 << 18; // f32 elements of the tensor the user kernels write

fn iota(n: usize, start: f32) -> Vec<f32> {
    (0..n).map(|i| start + i as f32).collect()
}

fn launch_cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).min(1024) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// An arena whose tensor `x` (N f32s) sits above freed space, so that a
/// compaction moves it; returns the arena, `x` and a live block below it
/// (`None` where no GPU is usable, see [`gpu_arena`]).
fn arena_with_a_movable_tensor() -> Option<(Arena<CudaBackend>, Handle, Handle)> {
    let mut a = gpu_arena(ArenaConfig::new(64 * MIB))?;
    let low = a.alloc(MIB).expect("low");
    let fillers: Vec<Handle> = (0..8).map(|_| a.alloc(MIB).expect("filler")).collect();
    let x = a.alloc_dtype(DType::F32, N as u64).expect("x");
    for h in fillers {
        a.free(h).expect("free filler");
    }
    Some((a, x, low))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_kernel_on_the_arena_stream_then_a_compaction_keeps_the_tensor() {
    let Some((mut a, x, _low)) = arena_with_a_movable_tensor() else {
        return;
    };
    let f = test_kernel(a.backend(), "test_iota_f32");
    // Take the stream first: the view borrows the arena mutably.
    let stream = a.backend().stream().clone();
    {
        let mut out = a
            .kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.output::<f32>(x))
            .expect("view");
        assert_eq!(out.len(), N);
        let (n, start) = (N as u32, 7.0f32);
        let mut b = stream.launch_builder(&f);
        b.arg(&mut out).arg(&n).arg(&start);
        // SAFETY: test_iota_f32(float*, u32, float) writes n floats of `out`.
        unsafe { b.launch(launch_cfg(N)) }.expect("launch");
    }
    let before = a.info(x).expect("info").offset;
    a.compact().expect("compact");
    let after = a.info(x).expect("info").offset;
    assert!(
        after < before,
        "the compaction moved x ({before} -> {after})"
    );
    assert_eq!(a.read::<f32>(x).expect("download"), iota(N, 7.0));
    // A read-only view of the moved tensor sees the same bytes.
    let stream = a.backend().stream().clone();
    let v = a
        .kernel_args(StreamId::ARENA)
        .and_then(|mut k| k.input::<f32>(x))
        .expect("view");
    assert_eq!(v.len(), N);
    let back = stream.clone_dtoh(&v).expect("copy");
    assert_eq!(back, iota(N, 7.0));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn work_on_a_second_stream_is_joined_before_the_compaction() {
    let Some((mut a, x, _low)) = arena_with_a_movable_tensor() else {
        return;
    };
    let slow = test_kernel(a.backend(), "test_slow_iota_f32");
    let other = a.backend().stream().context().new_stream().expect("stream");
    let s = a.register_stream(other.clone()).expect("register");
    assert_eq!(a.register_stream(other.clone()).expect("again"), s);
    assert!(Arc::ptr_eq(
        a.backend().stream_of(s).expect("registered"),
        &other
    ));
    // A raw pointer: only the recorded use orders it.
    a.pin(x).expect("pin");
    let ptr = a.backend().region_ptr() + a.resolve(x).expect("pinned offset");
    a.wait_on_arena(s).expect("join the arena's work");
    let (n, start, spin) = (N as u32, 3.0f32, 20_000_000i64); // ~10 ms
    let mut b = other.launch_builder(&slow);
    b.arg(&ptr).arg(&n).arg(&start).arg(&spin);
    // SAFETY: the kernel writes n floats at `ptr`, the pinned block x,
    // which stays put until the unpin below; its use is recorded.
    unsafe { b.launch(launch_cfg(N)) }.expect("launch");
    a.record_stream(x, s).expect("record");
    a.unpin(x).expect("unpin");
    let before = a.info(x).expect("info").offset;
    a.compact().expect("compact");
    assert!(a.info(x).expect("info").offset < before, "x moved");
    assert_eq!(a.read::<f32>(x).expect("download"), iota(N, 3.0));

    // Kernel arguments for the other stream record the use themselves.
    let y = a.alloc_dtype(DType::F32, N as u64).expect("y");
    // Fillers below the large-block size (1/32 of the arena), so that they
    // sit below z and freeing them leaves a hole z moves into.
    let fillers: Vec<Handle> = (0..4).map(|_| a.alloc(MIB).expect("filler")).collect();
    let z = a.alloc_dtype(DType::F32, N as u64).expect("z");
    for f in fillers {
        a.free(f).expect("free");
    }
    {
        let mut args = a.kernel_args(s).expect("args");
        let mut out = args.output::<f32>(&z).expect("view");
        let mut b = other.launch_builder(&slow);
        let start = 5.0f32;
        b.arg(&mut out).arg(&n).arg(&start).arg(&spin);
        // SAFETY: as above, into the viewed block.
        unsafe { b.launch(launch_cfg(N)) }.expect("launch");
    }
    let before = a.info(z).expect("info").offset;
    a.compact().expect("compact");
    assert!(a.info(z).expect("info").offset < before, "z moved");
    assert_eq!(a.read::<f32>(z).expect("download"), iota(N, 5.0));
    a.free(y).expect("free y");
}

/// A compacting call never waits for work queued before it: with the
/// arena stream held by a gate kernel, four compactions in a row (more
/// than the staging buffers of one plan in flight, the first larger than
/// the scratch sized at creation, so it grows) return while the gate is
/// still closed; then every byte is where the table says.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn compactions_behind_queued_work_return_without_waiting() {
    // 16 MiB: scratch sized at creation for plans of 4096 moves.
    let Some(mut a) = gpu_arena(ArenaConfig::new(16 * MIB)) else {
        return;
    };
    let n = 12_000usize;
    let blocks: Vec<Handle> = (0..n).map(|_| a.alloc(512).expect("block")).collect();
    let words = |i: usize| -> Vec<u32> { (0..128).map(|k| (i * 1000 + k) as u32).collect() };
    for (i, &h) in blocks.iter().enumerate() {
        a.write::<u32>(h, &words(i)).expect("upload");
    }
    a.synchronize().expect("sync");
    let stats0 = a.backend().host_stats();

    let gate = Gate::hold(a.backend()).expect("gate");
    let t0 = std::time::Instant::now();
    let mut live: Vec<(usize, Handle)> = blocks.into_iter().enumerate().collect();
    let mut moves = Vec::new();
    for _ in 0..4 {
        // Free every other live block, then compact: 6000, 3000, 1500 and
        // 750 moves.
        let mut keep = Vec::new();
        for (k, (i, h)) in live.into_iter().enumerate() {
            if k % 2 == 0 {
                a.free(h).expect("free");
            } else {
                keep.push((i, h));
            }
        }
        live = keep;
        moves.push(a.compact().expect("compact").moves);
    }
    let host = t0.elapsed();
    let still_queued = gate.closed().expect("query");
    let stats = a.backend().host_stats();
    gate.open();
    a.synchronize().expect("no kernel error");
    drop(gate);
    println!(
        "4 compactions ({moves:?} moves) behind a closed gate in {host:.1?} of host time; \
         {} staging buffers ({} bytes), {} device buffers grown",
        stats.staging_buffers, stats.staging_bytes, stats.buffers_grown
    );
    assert!(
        still_queued,
        "a compaction waited for the work queued before it ({host:?} on the host)"
    );
    assert_eq!(
        stats.blocked_calls, stats0.blocked_calls,
        "blocked on the device"
    );
    assert!(
        moves[0] > 4096,
        "the first plan outgrew the scratch sized at creation"
    );
    assert!(
        stats.buffers_grown > stats0.buffers_grown,
        "and grew it in stream order"
    );
    assert!(
        stats.device_scratch_bytes > stats0.device_scratch_bytes,
        "the scratch grown (and the handle table made) are counted: {} then {} bytes",
        stats0.device_scratch_bytes,
        stats.device_scratch_bytes
    );
    for (i, h) in live {
        assert_eq!(a.read::<u32>(h).expect("download"), words(i), "block {i}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn kernels_resolve_handles_through_the_device_table() {
    let Some((mut a, x, low)) = arena_with_a_movable_tensor() else {
        return;
    };
    a.compact().expect("compact");
    let args = graph::handle_args(&mut a).expect("table");
    let (table, slots) = (args.table, args.slots);
    assert_ne!(table, 0);
    let f = test_kernel(a.backend(), "test_iota_by_handle");
    let base = a.backend().region_ptr();
    let stream = a.backend().stream().clone();
    let flag = stream.clone_htod(&[0i32]).expect("flag");
    let (n, start, bits) = (N as u32, 11.0f32, x.to_bits());
    let mut b = stream.launch_builder(&f);
    b.arg(&base)
        .arg(&table)
        .arg(&slots)
        .arg(&bits)
        .arg(&n)
        .arg(&start)
        .arg(&flag);
    // SAFETY: the kernel resolves x through the table and writes n floats
    // into it, or sets the flag.
    unsafe { b.launch(launch_cfg(N)) }.expect("launch");
    assert_eq!(a.read::<f32>(x).expect("download"), iota(N, 11.0));
    assert_eq!(stream.clone_dtoh(&flag).expect("flag"), vec![0]);
    // A freed handle is refused by the checked resolve.
    a.free(low).expect("free");
    let table = graph::handle_args(&mut a).expect("table").table;
    let stale = low.to_bits();
    let n1 = 1u32;
    let mut b = stream.launch_builder(&f);
    b.arg(&base)
        .arg(&table)
        .arg(&slots)
        .arg(&stale)
        .arg(&n1)
        .arg(&start)
        .arg(&flag);
    // SAFETY: as above; the stale handle must not resolve.
    unsafe { b.launch(launch_cfg(1)) }.expect("launch");
    assert_eq!(stream.clone_dtoh(&flag).expect("flag"), vec![1]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn views_check_types_lengths_and_aliasing() {
    let Some(mut a) = gpu_arena(ArenaConfig::new(4 * MIB)) else {
        return;
    };
    let f = a.alloc_dtype(DType::F32, 100).expect("f32s");
    let g = a.alloc_dtype(DType::F32, 100).expect("f32s");
    let odd = a.alloc(10).expect("bytes");
    assert!(matches!(
        a.kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.input::<u32>(f)),
        Err(Error::TypeMismatch { .. })
    ));
    assert!(matches!(
        a.kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.input::<f32>(odd)),
        Err(Error::Misaligned { .. })
    ));
    assert_eq!(
        a.kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.input::<u8>(odd))
            .expect("bytes view")
            .len(),
        10
    );
    assert_eq!(
        a.kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.input::<u16>(odd))
            .expect("u16 view")
            .len(),
        5
    );
    {
        let mut args = a.kernel_args(StreamId::ARENA).expect("args");
        let _v = args.output::<f32>(f).expect("first output");
        assert!(matches!(args.output::<f32>(f), Err(Error::Overlap { .. })));
    }
    {
        let mut args = a.kernel_args(StreamId::ARENA).expect("args");
        let _i = args.input::<f32>(f).expect("input");
        assert!(matches!(args.output::<f32>(f), Err(Error::Overlap { .. })));
    }
    {
        let mut args = a.kernel_args(StreamId::ARENA).expect("args");
        let i0 = args.input::<f32>(f).expect("input");
        let _i1 = args.input::<f32>(f).expect("inputs may repeat");
        let o = args.output::<f32>(g).expect("output");
        assert_eq!((i0.len(), o.len()), (100, 100));
    }
    {
        let mut args = a.kernel_args(StreamId::ARENA).expect("args");
        let v = args.output::<f32>(f).expect("first");
        let w = args.output::<f32>(g).expect("second");
        assert_ne!(v.device_address(), w.device_address());
    }
    a.write(f, &iota(100, 1.0)).expect("upload");
    assert!(matches!(
        a.write(f, &iota(99, 1.0)),
        Err(Error::LengthMismatch { .. })
    ));
    assert_eq!(a.read::<f32>(f).expect("download"), iota(100, 1.0));
    a.synchronize().expect("no kernel error");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn spilling_to_page_locked_memory_keeps_every_byte() {
    if !gpu_available() {
        return;
    }
    let (mut evictions, mut restores) = (0, 0);
    for seed in 0..6 {
        let cap = 256 * KIB;
        let config = ArenaConfig::new(cap).with_spill_host_bytes(4 * cap);
        let mut a = Arena::cuda(config, 0).expect("CUDA arena with a host tier");
        let st = crate::spill::run_spill_program(&mut a, seed, 200);
        evictions += st.evictions;
        restores += st.restores;
    }
    assert!(
        evictions > 10 && restores > 10,
        "evictions {evictions}, restores {restores}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn random_arena_programs_keep_every_byte_on_cuda() {
    if !gpu_available() {
        return;
    }
    let programs = env_u64("CUARENA_GPU_PROGRAMS").unwrap_or(4000);
    let threads = env_u64("CUARENA_GPU_THREADS").unwrap_or(4).max(1);
    // Keep the primary context alive between programs.
    let _context = CudaContext::new(0).expect("context");
    let t0 = std::time::Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            scope.spawn(move || {
                for seed in (t..programs).step_by(threads as usize) {
                    // Mostly the default 256 B alignment; some programs at 1,
                    // 4 and 16 B exercise the kernel's narrow paths.
                    let align = [256u64, 256, 1, 4, 16][(seed % 5) as usize];
                    let config = ArenaConfig::new(MIB).with_alignment_bytes(align);
                    let mut a = Arena::cuda(config, 0).expect("CUDA arena");
                    crate::model::run_random_program(&mut a, seed, 400);
                    a.synchronize().expect("no kernel error");
                }
            });
        }
    });
    println!(
        "{programs} random programs of 400 steps on CUDA in {:.1?}",
        t0.elapsed()
    );
}
