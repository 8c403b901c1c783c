//! GPU tests of streams registered with a CUDA arena: kernel arguments
//! taken for a stream (`Arena::kernel_args`), compactions between launches
//! on three streams checked byte for byte against a host model; the same
//! program with views taken for the wrong stream going wrong (so the
//! mechanism is needed); a device fault poisoning the arena; and the
//! device-side range operations matching the host backend.
//!
//! Every test prints `skipped: <reason>` and passes when no GPU is usable.
//! Run them on the GPU machine with `all gpu_streams --test-threads=1`.

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::CudaBackend;
use cuarena::backend::Backend;
use cuarena::plan::Plan;
use cuarena::BackendError;
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Error, Handle, Storage, StreamId};
use cuarena_testkit::gpu_available;
use cuarena_testkit::{load_kernels, mv, plan_of, Rng};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// Kernels of the tests, compiled here. `gen` writes x and the indices from
/// a seed (the "upload"), `gather` computes out[i] = x[idx[i]] * s + i with
/// separately rounded operations (no FMA), so the host model is exact.
const KERNELS: &str = r#"
extern "C" __global__ void gen(float* x, long long* idx, unsigned n, unsigned seed, long long spin) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        x[i] = (float)((i * 2654435761u + seed) & 0xFFFFu);
        idx[i] = (long long)((i * 7u + seed) % n);
    }
}
extern "C" __global__ void gather(float* out, const float* x, const long long* idx, float s,
                                  unsigned n, long long spin) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = __fadd_rn(__fmul_rn(x[idx[i]], s), (float)i);
}
extern "C" __global__ void slow_iota(float* out, unsigned n, float start, long long spin) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = start + (float)i;
}
"#;

struct Kernels {
    _module: Arc<CudaModule>,
    gen: CudaFunction,
    gather: CudaFunction,
    slow_iota: CudaFunction,
}

fn kernels(arena: &Arena<CudaBackend>) -> Kernels {
    let module = load_kernels(arena.backend(), "gpu_streams.rs", KERNELS)
        .unwrap_or_else(|e| panic!("the kernels of gpu_streams.rs: {e}"));
    let f = |name: &str| module.load_function(name).expect(name);
    Kernels {
        gen: f("gen"),
        gather: f("gather"),
        slow_iota: f("slow_iota"),
        _module: module,
    }
}

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).min(1024) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The host model of `gen` then `gather`.
fn model(n: usize, seed: u32, s: f32) -> Vec<f32> {
    let x: Vec<f32> = (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) & 0xFFFF) as f32)
        .collect();
    (0..n as u32)
        .map(|i| {
            let j = (i.wrapping_mul(7).wrapping_add(seed) % n as u32) as usize;
            x[j] * s + i as f32
        })
        .collect()
}

fn new_stream(arena: &Arena<CudaBackend>) -> Arc<CudaStream> {
    arena
        .backend()
        .stream()
        .context()
        .new_stream()
        .expect("stream")
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn three_streams_with_compactions_between_launches_match_a_host_model() {
    if !gpu_available() {
        return;
    }
    let mut arena = Arena::cuda(ArenaConfig::new(48 * MIB), 0).expect("CUDA arena");
    let k = kernels(&arena);
    let (sa, sb, sc) = (new_stream(&arena), new_stream(&arena), new_stream(&arena));
    let a = arena.register_stream(sa.clone()).expect("A");
    let b = arena.register_stream(sb.clone()).expect("B");
    let c = arena.register_stream(sc.clone()).expect("C");
    assert_eq!((a.index(), b.index(), c.index()), (1, 2, 3));
    assert_eq!(arena.backend().stream_count(), 4);
    let spin = 2_000_000i64; // ~1 ms per launch: the arena stream runs ahead
    let mut rng = Rng::new(0x5EED_1234_ABCD_0001);
    let mut kept: Vec<(Storage, Vec<f32>)> = Vec::new();
    let mut moved = 0u64;
    for iter in 0..40u32 {
        let n = 1024 + (rng.next() % 60_000) as usize;
        let seed = rng.next() as u32;
        let scale = 0.5 + (iter % 7) as f32;
        // Holes below the tensors, so that compactions move them.
        let below: Vec<Storage> = (0..4)
            .map(|_| {
                arena
                    .alloc_storage(64 * KIB + rng.next() % (256 * KIB))
                    .expect("filler")
            })
            .collect();
        let x = arena.alloc_storage_dtype(DType::F32, n as u64).expect("x");
        let idx = arena
            .alloc_storage_dtype(DType::I64, n as u64)
            .expect("idx");
        // `out` is a slice of a larger storage, at an offset of 3 elements.
        let big = arena
            .alloc_storage_dtype(DType::F32, n as u64 + 8)
            .expect("out");
        let out = big.slice(3..3 + n as u64).expect("slice");
        drop(below);

        // Upload on A (a kernel writes x and the indices).
        {
            let mut args = arena.kernel_args(a).expect("args A");
            let mut xv = args.output::<f32>(&x).expect("x view");
            let mut iv = args.output::<i64>(&idx).expect("idx view");
            assert_eq!((xv.len(), iv.len()), (n, n));
            let (nu, mut lb) = (n as u32, sa.launch_builder(&k.gen));
            lb.arg(&mut xv).arg(&mut iv).arg(&nu).arg(&seed).arg(&spin);
            // SAFETY: gen writes n floats of x and n indices of idx.
            unsafe { lb.launch(cfg(n)) }.expect("gen");
        }
        // A compaction while A may still be running: it must wait for A.
        let before = (arena.resolve(x.handle().unwrap()).unwrap(),);
        arena.compact().expect("compact");
        if arena.resolve(x.handle().unwrap()).unwrap() != before.0 {
            moved += 1;
        }
        // The program orders its own streams: B consumes what A produced.
        sb.join(&sa).expect("B after A");
        {
            let mut args = arena.kernel_args(b).expect("args B");
            let xv = args.input::<f32>(&x).expect("x");
            let iv = args.input::<i64>(&idx).expect("idx");
            let mut ov = args.output::<f32>(&out).expect("out");
            assert!(matches!(args.output::<f32>(&x), Err(Error::Overlap { .. })));
            let (nu, mut lb) = (n as u32, sb.launch_builder(&k.gather));
            lb.arg(&mut ov)
                .arg(&xv)
                .arg(&iv)
                .arg(&scale)
                .arg(&nu)
                .arg(&spin);
            // SAFETY: gather reads n indices (< n) and x, writes n of out.
            unsafe { lb.launch(cfg(n)) }.expect("gather");
        }
        // Allocations that trigger targeted compactions while B runs;
        // dropping x and idx frees them only after B is done with them.
        drop((x, idx));
        let free = arena.stats().free_bytes;
        let fill = arena.alloc_storage(free / 2).expect("targeted");
        drop(fill);
        arena.compact().expect("compact");
        // Read back on C.
        sc.join(&sb).expect("C after B");
        let mut back = vec![0f32; n];
        {
            let mut args = arena.kernel_args(c).expect("args C");
            let ov = args.input::<f32>(&out).expect("out");
            sc.memcpy_dtoh(&ov, &mut back).expect("read back");
        }
        sc.synchronize().expect("C");
        let want = model(n, seed, scale);
        assert!(
            back.iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits()),
            "iteration {iter}: stream C read back wrong values"
        );
        // The arena stream's own read waits for B's use of `out` too.
        let again: Vec<f32> = arena.read(&out).expect("read");
        assert_eq!(again, want, "iteration {iter}: arena read");
        kept.push((big, want));
        if kept.len() > 4 {
            kept.remove((rng.next() % 4) as usize);
        }
    }
    // Everything kept survived every later compaction.
    arena.compact().expect("compact");
    for (big, want) in &kept {
        let n = want.len() as u64;
        let got: Vec<f32> = arena.read(big.slice(3..3 + n).unwrap()).unwrap();
        assert_eq!(&got, want);
    }
    println!("compactions moved x in {moved} of 40 iterations");
    assert!(moved > 0, "no compaction moved x");
    arena.synchronize().expect("no fault");
}

/// The program of `kernel_args_order_a_second_stream`, with the view taken
/// for the arena stream (`view_mut`) but launched on another stream: the
/// use is not recorded, so the compaction moves the block before the
/// kernel writes it. Returns how many elements the download got wrong.
fn slow_write_then_compact(use_kernel_args: bool) -> usize {
    let mut arena = Arena::cuda(ArenaConfig::new(64 * MIB), 0).expect("CUDA arena");
    let k = kernels(&arena);
    let other = new_stream(&arena);
    let s = arena.register_stream(other.clone()).expect("register");
    let n = 1usize << 18;
    let low = arena.alloc(MIB).expect("low");
    // Fillers below the large-block size (1/32 of the arena), so that they
    // sit below z and freeing them leaves a hole z moves into.
    let fillers: Vec<_> = (0..8).map(|_| arena.alloc(MIB).expect("filler")).collect();
    let z = arena.alloc_dtype(DType::F32, n as u64).expect("z");
    arena.write(z, &vec![-1.0f32; n]).expect("upload");
    for f in fillers {
        arena.free(f).expect("free");
    }
    let spin = 200_000_000i64; // ~100 ms before the kernel writes
    let (nu, start) = (n as u32, 5.0f32);
    // Few blocks, so the spinning kernel leaves the GPU's multiprocessors
    // to the compaction's move kernel (a full grid would hold them all, and
    // the moves would wait for it by accident, not by the arena's doing).
    let slow = LaunchConfig {
        grid_dim: (4, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    if use_kernel_args {
        let mut args = arena.kernel_args(s).expect("args");
        let mut out = args.output::<f32>(&z).expect("view");
        let mut b = other.launch_builder(&k.slow_iota);
        b.arg(&mut out).arg(&nu).arg(&start).arg(&spin);
        // SAFETY: slow_iota writes n floats of the viewed block.
        unsafe { b.launch(slow) }.expect("launch");
    } else {
        // The hazard: a view for the arena stream, launched elsewhere.
        other
            .join(arena.backend().stream())
            .expect("after the upload");
        let mut out = arena
            .kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.output::<f32>(z))
            .expect("view");
        let mut b = other.launch_builder(&k.slow_iota);
        b.arg(&mut out).arg(&nu).arg(&start).arg(&spin);
        // SAFETY: as above; what goes wrong is ordering, inside the region.
        unsafe { b.launch(slow) }.expect("launch");
    }
    let before = arena.info(z).expect("info").offset;
    arena.compact().expect("compact");
    assert!(arena.info(z).expect("info").offset < before, "z moved");
    let got = arena.read::<f32>(z).expect("download");
    other.synchronize().expect("other stream");
    arena.free(low).expect("free");
    let want: Vec<f32> = (0..n).map(|i| start + i as f32).collect();
    got.iter().zip(&want).filter(|(g, w)| g != w).count()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn kernel_args_order_a_second_stream_and_views_for_the_wrong_stream_go_wrong() {
    if !gpu_available() {
        return;
    }
    assert_eq!(slow_write_then_compact(true), 0, "kernel_args keeps order");
    let wrong = slow_write_then_compact(false);
    println!("views for the arena stream used on another stream: {wrong} wrong elements");
    assert!(
        wrong > 0,
        "without recorded uses the compaction moves z before the kernel writes it"
    );
}

/// One wave breaking rule 3: move 0 writes over the source of move 1.
fn bad_plan() -> Plan {
    plan_of(vec![vec![
        mv(0, 150 * KIB, 100 * KIB),
        mv(200 * KIB, 400 * KIB, 100 * KIB),
    ]])
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_device_fault_poisons_the_arena() {
    if !gpu_available() {
        return;
    }
    let mut b = CudaBackend::new(0, 4 * MIB).expect("backend");
    // Rule 3 broken: move 0 writes over the source of move 1.
    let bad = bad_plan();
    b.execute(&bad).expect("host checks pass");
    assert!(matches!(
        b.synchronize(),
        Err(Error::Backend(BackendError::DeviceFault { .. }))
    ));
    let mut arena = Arena::with_backend(ArenaConfig::new(4 * MIB), b).expect("arena");
    let h = arena.alloc(1024).expect("alloc before anyone looked");
    match arena.write(h, &[0u8; 1024]) {
        Err(Error::Backend(BackendError::DeviceFault { .. })) => {}
        other => panic!("expected the fault, got {other:?}"),
    }
    let reason = match arena.alloc(1) {
        Err(Error::Poisoned { reason }) => reason,
        other => panic!("expected Poisoned, got {other:?}"),
    };
    assert!(reason.contains("device fault"), "{reason}");
    let poisoned = |r: Result<(), Error>| match r {
        Err(Error::Poisoned { reason: r }) => assert_eq!(r, reason),
        other => panic!("expected Poisoned, got {other:?}"),
    };
    poisoned(arena.alloc(16).map(drop));
    poisoned(arena.write(h, &[0u8; 1024]));
    poisoned(arena.read::<u8>(h).map(drop));
    poisoned(arena.synchronize());
    poisoned(arena.compact().map(drop));
    poisoned(arena.kernel_args(StreamId::ARENA).map(drop));
    poisoned(
        arena
            .kernel_args(StreamId::ARENA)
            .and_then(|mut k| k.input::<u8>(h))
            .map(drop),
    );
    poisoned(arena.fill(h, 7u8));
    poisoned(arena.alloc_storage(64).map(drop));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn a_fault_found_by_synchronize_poisons_the_arena() {
    if !gpu_available() {
        return;
    }
    let mut b = CudaBackend::new(0, 4 * MIB).expect("backend");
    let bad = bad_plan();
    b.execute(&bad).expect("host checks pass");
    let mut arena = Arena::with_backend(ArenaConfig::new(4 * MIB), b).expect("arena");
    assert!(matches!(
        arena.synchronize(),
        Err(Error::Backend(BackendError::DeviceFault { .. }))
    ));
    assert!(matches!(arena.synchronize(), Err(Error::Poisoned { .. })));
    assert!(matches!(arena.alloc(16), Err(Error::Poisoned { .. })));
}

/// A program of range operations; returns every block's bytes after each
/// step, so two backends can be compared.
fn range_program<B: Backend>(arena: &mut Arena<B>) -> Vec<Vec<u8>> {
    let mut snaps = Vec::new();
    let raw = arena.alloc_storage(4096 + 48).expect("raw");
    let zeros = arena.alloc_storage_dtype(DType::U32, 1000).expect("zeroed");
    arena.fill(&zeros, 0u32).expect("zeros");
    let f = arena.alloc_storage_dtype(DType::F32, 777).expect("f32s");
    let filler = arena.alloc(256 * KIB).expect("filler");
    let dst = arena.alloc_storage(4096 + 48).expect("dst");
    arena.free(filler).expect("free");
    let snap = |arena: &mut Arena<B>| {
        let mut all = Vec::new();
        for s in [&raw, &dst] {
            all.extend(arena.read::<u8>(s).expect("read"));
        }
        all.extend(bytemuck::cast_slice(
            &arena.read::<u32>(&zeros).expect("read"),
        ));
        all.extend(bytemuck::cast_slice(&arena.read::<f32>(&f).expect("read")));
        all
    };
    let bytes: Vec<u8> = (0..4096 + 48).map(|i| (i * 31 % 251) as u8).collect();
    arena.write(&raw, &bytes).expect("write");
    arena.write(&dst, &[0x55u8; 4096 + 48]).expect("write dst");
    arena
        .write(raw.slice(5..12).unwrap(), &[9u8; 7])
        .expect("write a slice");
    let fv: Vec<f32> = (0..777).map(|i| i as f32 * 0.25).collect();
    arena.write(&f, &fv).expect("write f32s");
    arena
        .write(f.slice(100..110).unwrap(), &[1.5f32; 10])
        .expect("write a f32 slice");
    snaps.push(snap(arena));
    // Fills of every pattern width at aligned offsets; at an offset not
    // a multiple of the pattern's width, `Misaligned` and nothing written.
    arena
        .fill(raw.slice(0..64).unwrap(), 0xABu8)
        .expect("fill 1");
    for (at, len, width) in [(65u64, 30u64, 2u64), (203, 40, 8), (1301, 32, 8)] {
        let r = if width == 2 {
            arena.fill(raw.slice(at..at + len).unwrap(), 0x1234u16)
        } else {
            arena.fill(raw.slice(at..at + len).unwrap(), 0x0102_0304_0506_0708u64)
        };
        assert!(
            matches!(r, Err(cuarena::Error::Misaligned { .. })),
            "fill of width {width} at {at}: {r:?}"
        );
    }
    arena
        .fill(raw.slice(66..66 + 30).unwrap(), 0x1234u16)
        .expect("fill 2");
    arena
        .fill(raw.slice(128..128 + 64).unwrap(), 0xDEAD_BEEFu32)
        .expect("fill 4");
    arena
        .fill(raw.slice(200..200 + 40).unwrap(), 0x0102_0304_0506_0708u64)
        .expect("fill 8 at 200");
    let p8 = u64::from_le_bytes(std::array::from_fn(|i| i as u8 * 3 + 1));
    arena
        .fill(raw.slice(256..256 + 1024).unwrap(), p8)
        .expect("fill 8");
    arena
        .fill(raw.slice(1304..1304 + 32).unwrap(), p8)
        .expect("fill 8 at 1304");
    arena
        .fill(zeros.slice(10..20).unwrap(), 0xFFFF_0000u32)
        .expect("fill u32s");
    arena
        .fill(f.slice(700..777).unwrap(), -2.0f32)
        .expect("fill f32s");
    arena
        .fill(f.slice(0..4).unwrap().as_dtype(DType::U8).unwrap(), 0x7Fu8)
        .expect("fill bytes");
    snaps.push(snap(arena));
    // Copies between storages and within one.
    arena.copy(&raw, &dst).expect("copy all");
    arena
        .copy(raw.slice(0..100).unwrap(), raw.slice(3000..3100).unwrap())
        .expect("copy within");
    arena
        .copy(
            dst.slice(7..7 + 333).unwrap(),
            raw.slice(1000..1333).unwrap(),
        )
        .expect("copy odd");
    snaps.push(snap(arena));
    arena.compact().expect("compact");
    snaps.push(snap(arena));
    // Checks agree too.
    assert!(matches!(
        arena.copy(raw.slice(0..100).unwrap(), raw.slice(50..150).unwrap()),
        Err(Error::Overlap { .. })
    ));
    assert!(matches!(
        arena.fill(raw.slice(0..3).unwrap(), 1u16),
        Err(Error::Misaligned { .. })
    ));
    let empty = arena.alloc_storage(0).expect("empty");
    assert!(arena.read::<u8>(&empty).expect("empty read").is_empty());
    arena.fill(&empty, 3u8).expect("empty fill");
    snaps
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn device_range_operations_match_the_host_backend() {
    if !gpu_available() {
        return;
    }
    let config = ArenaConfig::new(4 * MIB);
    let mut host = Arena::host(config.clone()).expect("host arena");
    let mut gpu = Arena::cuda(config, 0).expect("CUDA arena");
    let want = range_program(&mut host);
    let got = range_program(&mut gpu);
    assert_eq!(want.len(), got.len());
    for (step, (w, g)) in want.iter().zip(&got).enumerate() {
        let bad = w.iter().zip(g).position(|(a, b)| a != b);
        assert_eq!(bad, None, "step {step}: first differing byte");
        assert_eq!(w.len(), g.len());
    }
    gpu.synchronize().expect("no fault");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn kernel_args_check_types_ranges_and_residency() {
    if !gpu_available() {
        return;
    }
    let mut arena = Arena::cuda(ArenaConfig::new(4 * MIB), 0).expect("CUDA arena");
    let other = new_stream(&arena);
    let s = arena.register_stream(other).expect("register");
    assert!(matches!(
        arena.kernel_args(StreamId::ARENA).map(|a| a.stream_id()),
        Ok(StreamId::ARENA)
    ));
    let f = arena.alloc_storage_dtype(DType::F32, 100).expect("f32s");
    let i = arena.alloc_storage_dtype(DType::I64, 10).expect("i64s");
    let empty = arena.alloc_storage(0).expect("empty");
    let h: Handle = arena.alloc(1000).expect("bytes");
    {
        let mut args = arena.kernel_args(s).expect("args");
        assert!(matches!(
            args.input::<u32>(&f),
            Err(Error::TypeMismatch { .. })
        ));
        let a = args.input::<f32>(&f.slice(10..20).unwrap()).expect("slice");
        let b = args.input::<f32>(&f).expect("overlapping inputs are fine");
        assert_eq!(a.device_address(), b.device_address() + 40);
        assert_eq!(a.len(), 10);
        assert!(matches!(
            args.output::<f32>(&f.slice(15..16).unwrap()),
            Err(Error::Overlap { .. })
        ));
        let o = args.output::<i64>(&i).expect("i64 output");
        assert!(matches!(args.input::<i64>(&i), Err(Error::Overlap { .. })));
        let e = args.output::<u8>(&empty).expect("empty output");
        assert!(e.is_empty());
        assert_eq!(o.len(), 10);
        assert!(matches!(
            args.input::<u64>(&h),
            Ok(v) if v.len() == 125
        ));
    }
    // An id this arena never gave out (another arena's).
    let mut host = Arena::host(ArenaConfig::new(MIB)).expect("host");
    let mut foreign = StreamId::ARENA;
    for _ in 0..5 {
        foreign = host.register_stream(()).expect("id");
    }
    assert!(matches!(
        arena.kernel_args(foreign),
        Err(Error::Foreign { kind: "stream", .. })
    ));
    assert!(arena.backend().stream_of(foreign).is_none());
    arena.synchronize().expect("no fault");
}
