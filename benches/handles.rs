//! What resolving handles on the device costs, and what keeping the device
//! table current costs a compaction. CUDA events, same run, medians.
//!
//! Run on a machine with a GPU: `cargo bench --bench handles` (or the
//! staged executable with `--bench`). Without a GPU it prints why and
//! exits 0.
//!
//! # Cases (targets in brackets)
//!
//! 1. **Resolve**: c = a + b over three 1 GiB f32 tensors (2^28 elements
//!    each; 3 GiB of traffic per launch), float4 accesses, as
//!    - raw pointers (the blocks' pinned addresses),
//!    - handles resolved through the table (`cuarena_at`), once per thread,
//!    - handles resolved with the checked variant (`cuarena_at_checked`),
//!
//!    each in two launch shapes: a grid-stride loop over a grid of
//!    8 CTAs per SM, and one float4 per thread (a grid as large as the
//!    data, where every one of the 2^26 threads resolves). Variants run
//!    interleaved, `CUARENA_BENCH_REPS` times (default 100) after warm-up;
//!    the median of each is compared with raw pointers of the same shape
//!    [overhead < 2%]. Results are checked on the device.
//! 2. **Table update in a compaction of 100,000 blocks**: 100,000 blocks of
//!    4-64 KiB with holes of 0-64 KiB (freed blocks) in between, packed by
//!    a full compaction (the plan and the final table from the arena's own
//!    planner, on a metadata arena); on a CUDA backend, the plan's moves
//!    alone against the moves followed by the table sync the arena does
//!    (`sync_table` of every slot, since frees dirty them all), and the sync
//!    alone while the stream is busy (its device time) and idle.
//!    Reported: device and host milliseconds and the table's share of the
//!    compaction; plus, for comparison, the same bytes copied from
//!    page-locked memory (what a pinned staging buffer would cost).

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    result, sys, CudaEvent, CudaFunction, CudaModule, CudaStream, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::CudaBackend;
use cuarena::backend::{Backend, MetaBackend, TableEntry};
use cuarena::graph::{self, DeviceHandle, HandleArgs};
use cuarena::plan::{Plan, PlanKind};
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Error, Handle, Result};

use cuarena_testkit::{
    driver_err as drv, gpu_bench_reps, load_kernels, median, Rng, GRAPH_TEST_CU,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn timing_event(stream: &CudaStream) -> Result<CudaEvent> {
    stream
        .context()
        .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("cuEventCreate"))
}

fn function(module: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    module
        .load_function(name)
        .map_err(drv("cuModuleGetFunction"))
}

/// How a variant finds its tensors.
#[derive(Clone, Copy)]
enum Args {
    Raw {
        c: u64,
        a: u64,
        b: u64,
    },
    Handles {
        table: HandleArgs,
        c: DeviceHandle,
        a: DeviceHandle,
        b: DeviceHandle,
    },
}

struct Variant {
    name: &'static str,
    shape: &'static str,
    func: CudaFunction,
    cfg: LaunchConfig,
    args: Args,
    start: CudaEvent,
    end: CudaEvent,
    times: Vec<f64>,
}

impl Variant {
    fn launch(&self, stream: &CudaStream, n4: u64) -> Result<()> {
        let mut b = stream.launch_builder(&self.func);
        match &self.args {
            Args::Raw { c, a, b: bb } => {
                b.arg(c).arg(a).arg(bb).arg(&n4);
            }
            Args::Handles { table, c, a, b: bb } => {
                b.arg(table).arg(c).arg(a).arg(bb).arg(&n4);
            }
        }
        // SAFETY: the bench_add* kernels of crates/cuarena-testkit/kernels/graph_test.cu take
        // (float4*, const float4*, const float4*, u64) or (CuarenaTable,
        // u64, u64, u64, u64), matching the arguments pushed; they read n4
        // float4s of a and b and write n4 of c: three blocks of 2^28 f32,
        // pinned (raw) or resolved through the flushed table (handles).
        unsafe { b.launch(self.cfg) }.map_err(drv("cuLaunchKernel"))?;
        Ok(())
    }
}

fn resolve_bench(reps: usize) -> Result<()> {
    let n: u64 = 1 << 28; // f32 elements per tensor: 1 GiB each
    let n4 = n / 4;
    let mut arena = Arena::cuda(ArenaConfig::new(3 * GIB + 64 * MIB), 0)?;
    let a = arena.alloc_dtype(DType::F32, n)?;
    let b = arena.alloc_dtype(DType::F32, n)?;
    let c = arena.alloc_dtype(DType::F32, n)?;
    let bad = arena.alloc_dtype(DType::U32, 1)?;
    for h in [a, b, c, bad] {
        arena.pin(h)?;
    }
    // Pinned: the addresses hold until the unpins.
    let base = arena.backend().region_ptr();
    let (pa, pb, pc, pbad) = (
        base + arena.resolve(a)?,
        base + arena.resolve(b)?,
        base + arena.resolve(c)?,
        base + arena.resolve(bad)?,
    );
    let stream = arena.backend().stream().clone();
    let memset = |ptr: u64, value: f32, words: u64| -> Result<()> {
        let words = words as usize;
        // SAFETY: `ptr` is a pinned block of at least `words` u32s, on the
        // arena stream.
        unsafe { sys::cuMemsetD32Async(ptr, value.to_bits(), words, stream.cu_stream()) }
            .result()
            .map_err(drv("cuMemsetD32Async"))
    };
    memset(pa, 1.5, n)?;
    memset(pb, 2.25, n)?;
    memset(pc, 0.0, n)?;
    let backend = arena.backend();
    println!(
        "device {} ({}, {} SMs)",
        backend.device_name(),
        backend.arch(),
        backend.sm_count()
    );
    let module = load_kernels(
        backend,
        "crates/cuarena-testkit/kernels/graph_test.cu",
        GRAPH_TEST_CU,
    )?;
    let sms = backend.sm_count();
    let table = graph::handle_args(&mut arena)?;
    let handles = Args::Handles {
        table,
        c: DeviceHandle::from(c),
        a: DeviceHandle::from(a),
        b: DeviceHandle::from(b),
    };
    let raw = Args::Raw {
        c: pc,
        a: pa,
        b: pb,
    };
    let stride = LaunchConfig {
        grid_dim: (sms * 8, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let one = LaunchConfig {
        grid_dim: (u32::try_from(n4.div_ceil(256)).unwrap_or(u32::MAX), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let specs: [(&'static str, &'static str, &str, LaunchConfig, Args); 6] = [
        ("raw pointers", "grid-stride", "bench_add_raw", stride, raw),
        (
            "handles",
            "grid-stride",
            "bench_add_handles",
            stride,
            handles,
        ),
        (
            "handles, checked",
            "grid-stride",
            "bench_add_checked",
            stride,
            handles,
        ),
        (
            "raw pointers",
            "1 float4/thread",
            "bench_add1_raw",
            one,
            raw,
        ),
        (
            "handles",
            "1 float4/thread",
            "bench_add1_handles",
            one,
            handles,
        ),
        (
            "handles, checked",
            "1 float4/thread",
            "bench_add1_checked",
            one,
            handles,
        ),
    ];
    let mut variants = Vec::new();
    for (name, shape, func, cfg, args) in specs {
        variants.push(Variant {
            name,
            shape,
            func: function(&module, func)?,
            cfg,
            args,
            start: timing_event(&stream)?,
            end: timing_event(&stream)?,
            times: Vec::with_capacity(reps),
        });
    }

    // Correctness first: each variant from a zeroed c.
    let count_ne = function(&module, "bench_count_ne")?;
    for v in &variants {
        memset(pc, 0.0, n)?;
        memset(pbad, 0.0, 1)?;
        v.launch(&stream, n4)?;
        let mut k = stream.launch_builder(&count_ne);
        let want = 3.75f32;
        k.arg(&pc).arg(&n4).arg(&want).arg(&pbad);
        // SAFETY: bench_count_ne(const float4*, u64, float, u32*) reads n4
        // float4s of c and adds to one u32 of `bad`, both pinned blocks.
        unsafe { k.launch(stride) }.map_err(drv("cuLaunchKernel"))?;
        let wrong = arena.read::<u32>(bad)?[0];
        if wrong != 0 {
            return Err(Error::InvalidInput {
                input: "config",
                reason: format!("{} ({}): {wrong} wrong elements", v.name, v.shape),
            });
        }
    }

    // Warm-up, then interleaved timing.
    for _ in 0..3 {
        for v in &variants {
            v.launch(&stream, n4)?;
        }
    }
    for _ in 0..reps {
        for v in &variants {
            v.start.record(&stream).map_err(drv("cuEventRecord"))?;
            v.launch(&stream, n4)?;
            v.end.record(&stream).map_err(drv("cuEventRecord"))?;
        }
        stream.synchronize().map_err(drv("cuStreamSynchronize"))?;
        for v in &mut variants {
            let ms = v
                .start
                .elapsed_ms(&v.end)
                .map_err(drv("cuEventElapsedTime"))?;
            v.times.push(f64::from(ms));
        }
    }

    let traffic = 3.0 * GIB as f64;
    println!();
    println!(
        "resolve: c = a + b, three 1 GiB f32 tensors (3 GiB moved per launch); median of {reps}, interleaved"
    );
    println!(
        "| {:<17} | {:<15} | {:>9} | {:>9} | {:>7} | {:>10} | {:<14} |",
        "variant", "shape", "median ms", "min ms", "GB/s", "vs raw", "target < 2%"
    );
    println!("|{}|", "-".repeat(100));
    let mut raw_ms = 0.0;
    for v in &mut variants {
        let min = v.times.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(&mut v.times);
        let (ratio, verdict) = if matches!(v.args, Args::Raw { .. }) {
            raw_ms = med;
            ("baseline".to_string(), "")
        } else {
            let over = (med / raw_ms - 1.0) * 100.0;
            let ok = if over < 2.0 { "ok" } else { "OVER" };
            (format!("{over:+.2}%"), ok)
        };
        println!(
            "| {:<17} | {:<15} | {:>9.4} | {:>9.4} | {:>7.0} | {:>10} | {:<14} |",
            v.name,
            v.shape,
            med,
            min,
            traffic / (med * 1e-3) / 1e9,
            ratio,
            verdict
        );
    }
    Ok(())
}

/// A metadata backend that keeps the plans it runs and the handle table
/// it is sent (what a device backend would hold).
struct Recorder {
    meta: MetaBackend,
    plans: Vec<Plan>,
    table: Vec<TableEntry>,
}

impl Backend for Recorder {
    type Stream = ();
    fn capacity_bytes(&self) -> u64 {
        self.meta.capacity_bytes()
    }
    fn stores_bytes(&self) -> bool {
        false
    }
    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.meta.write(offset, bytes)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.meta.read(offset, out)
    }
    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        self.meta.copy(src, dst, len)
    }
    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        self.meta.fill(offset, len, pattern)
    }
    fn execute(&mut self, plan: &Plan) -> Result<()> {
        self.plans.push(plan.clone());
        self.meta.execute(plan)
    }
    fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        let end = first + entries.len();
        if self.table.len() < end {
            self.table.resize(end, TableEntry::default());
        }
        self.table[first..end].copy_from_slice(entries);
        Ok(())
    }
}

/// A layout of `count` blocks of 4-64 KiB with holes of 0-64 KiB (freed
/// blocks) between them, on a metadata arena: the full compaction's plan
/// and the table after it.
fn compaction_case(count: usize, capacity: u64) -> Result<(Plan, Vec<TableEntry>)> {
    let recorder = Recorder {
        meta: MetaBackend::new(capacity),
        plans: Vec::new(),
        table: Vec::new(),
    };
    let mut meta = Arena::with_backend(ArenaConfig::new(capacity), recorder)?;
    let mut rng = Rng::new(7);
    let mut holes: Vec<Handle> = Vec::new();
    for _ in 0..count {
        let hole = rng.range(0, 256) * 256;
        if hole > 0 {
            holes.push(meta.alloc(hole)?);
        }
        meta.alloc(rng.range(16, 256) * 256)?;
    }
    for h in holes {
        meta.free(h)?;
    }
    meta.compact()?;
    let plan = meta
        .backend()
        .plans
        .last()
        .cloned()
        .unwrap_or_else(|| Plan::empty(PlanKind::Full));
    Ok((plan, meta.backend().table.clone()))
}

fn table_bench(reps: usize) -> Result<()> {
    let capacity = 8 * GIB;
    let (plan, table) = compaction_case(100_000, capacity)?;
    let mut backend = CudaBackend::new(0, capacity)?;
    let stream = backend.stream().clone();
    // Non-zero contents (never time on zeros).
    // SAFETY: the whole region, on its own stream.
    unsafe {
        sys::cuMemsetD32Async(
            backend.region_ptr(),
            0x5A3C_96E1,
            (capacity / 4) as usize,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(drv("cuMemsetD32Async"))?;
    // The table buffer is allocated by the first sync (outside timing).
    backend.sync_table(&table, 0)?;
    backend.synchronize()?;
    let table_bytes = std::mem::size_of_val(table.as_slice());
    let table_ptr = backend.table_ptr();

    // The same bytes in page-locked memory, for the comparison.
    // SAFETY: a plain page-locked allocation (flags 0) in the bound context.
    let pinned_raw =
        unsafe { result::malloc_host(table_bytes, 0) }.map_err(drv("cuMemHostAlloc"))?;
    // SAFETY: `pinned_raw` holds `table_bytes` bytes, written here once
    // (before any copy reads them); freed at the end after a sync.
    let pinned: &[u8] = unsafe {
        std::ptr::copy_nonoverlapping(
            table.as_ptr().cast::<u8>(),
            pinned_raw.cast::<u8>(),
            table_bytes,
        );
        std::slice::from_raw_parts(pinned_raw.cast::<u8>(), table_bytes)
    };
    let pinned_copy = |stream: &CudaStream| -> Result<()> {
        // SAFETY: the backend's table holds `table_bytes` (synced above);
        // the source is page-locked and outlives the copy (freed after a
        // stream sync).
        unsafe { result::memcpy_htod_async(table_ptr, pinned, stream.cu_stream()) }
            .map_err(drv("cuMemcpyHtoDAsync"))
    };
    let (e0, e1) = (timing_event(&stream)?, timing_event(&stream)?);
    // (device ms, host ms) of `f`, with the stream busy beforehand or not.
    let time = |backend: &mut CudaBackend,
                busy: bool,
                f: &mut dyn FnMut(&mut CudaBackend) -> Result<()>|
     -> Result<(f64, f64)> {
        if busy {
            // SAFETY: 4 GiB inside the 8 GiB region, on its stream.
            unsafe {
                sys::cuMemsetD32Async(
                    backend.region_ptr(),
                    7,
                    GIB as usize,
                    backend.stream().cu_stream(),
                )
            }
            .result()
            .map_err(drv("cuMemsetD32Async"))?;
        }
        e0.record(&stream).map_err(drv("cuEventRecord"))?;
        let t = std::time::Instant::now();
        f(backend)?;
        let host = t.elapsed().as_secs_f64() * 1e3;
        e1.record(&stream).map_err(drv("cuEventRecord"))?;
        e1.synchronize().map_err(drv("cuEventSynchronize"))?;
        let dev = f64::from(e0.elapsed_ms(&e1).map_err(drv("cuEventElapsedTime"))?);
        Ok((dev, host))
    };
    // (name, stream busy first); run by index below.
    let cases: [(&str, bool); 7] = [
        ("moves alone", false),
        ("moves + table sync (as the arena)", false),
        ("moves + table from pinned memory", false),
        ("table sync alone, stream busy", true),
        ("table sync alone, stream idle", false),
        ("table from pinned, stream busy", true),
        ("table from pinned, stream idle", false),
    ];
    let run = |i: usize, b: &mut CudaBackend| -> Result<()> {
        match i {
            0 => b.execute(&plan),
            1 => {
                b.execute(&plan)?;
                b.sync_table(&table, 0)
            }
            2 => {
                b.execute(&plan)?;
                pinned_copy(b.stream())
            }
            3 | 4 => b.sync_table(&table, 0),
            _ => pinned_copy(b.stream()),
        }
    };
    let mut dev = vec![Vec::new(); cases.len()];
    let mut host = vec![Vec::new(); cases.len()];
    for (i, &(_, busy)) in cases.iter().enumerate() {
        time(&mut backend, busy, &mut |b| run(i, b))?; // warm-up
    }
    for _ in 0..reps {
        for (i, &(_, busy)) in cases.iter().enumerate() {
            let (d, h) = time(&mut backend, busy, &mut |b| run(i, b))?;
            dev[i].push(d);
            host[i].push(h);
        }
    }
    backend.synchronize()?;
    // SAFETY: allocated above with cuMemHostAlloc; the stream is idle.
    let _ = unsafe { result::free_host(pinned_raw) };

    let moves_n = plan.move_count();
    let moved = plan.bytes_moved();
    println!();
    println!(
        "table update in a full compaction: {moves_n} moves of {} blocks (4-64 KiB, holes 0-64 KiB), \
         {:.0} MiB moved in {} wave(s); table of {} slots = {:.2} MiB sent; median of {reps}",
        100_000,
        moved as f64 / MIB as f64,
        plan.waves().len(),
        table.len(),
        table_bytes as f64 / MIB as f64
    );
    println!(
        "| {:<36} | {:>10} | {:>10} |",
        "case", "device ms", "host ms"
    );
    println!("|{}|", "-".repeat(64));
    let mut med = Vec::new();
    for (i, (name, _)) in cases.iter().enumerate() {
        let (d, h) = (median(&mut dev[i]), median(&mut host[i]));
        med.push((d, h));
        println!("| {name:<36} | {d:>10.3} | {h:>10.3} |");
    }
    let (alone, with) = (med[0].0, med[1].0);
    println!(
        "table sync's share of the compaction: +{:.3} ms device ({:+.1}%) over the moves alone; \
         the copy itself {:.3} ms of device time ({:.1} GB/s); host {:.3} ms per compaction \
         (pinned source: +{:.3} ms, host {:.3} ms)",
        with - alone,
        (with / alone - 1.0) * 100.0,
        med[3].0,
        table_bytes as f64 / (med[3].0 * 1e-3) / 1e9,
        med[4].1,
        med[2].0 - alone,
        med[6].1
    );
    Ok(())
}

fn main() -> Result<()> {
    let Some(reps) = gpu_bench_reps("handles", 100) else {
        return Ok(());
    };
    resolve_bench(reps)?;
    table_bench(reps.min(30))?;
    Ok(())
}
