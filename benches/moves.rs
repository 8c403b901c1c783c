//! Speed of the CUDA move kernel against `cuMemcpyDtoDAsync`, measured in
//! the same run on the same bytes (CUDA events; warm-up; median of several).
//!
//! Run on a machine with a GPU: `cargo bench --bench moves` (or the staged
//! executable with `--bench`, see `scripts/gpu-suite.sh`). Without a GPU it
//! prints why and exits 0.
//!
//! # Cases (targets in brackets)
//!
//! - **large**: blocks of 1 MiB, 2 MiB, ... 1 GiB, four times over (8 GiB
//!   moved), non-overlapping, one wave; against one `cuMemcpyDtoDAsync` per
//!   block [ratio >= 0.98].
//! - **compact**: 100,000 blocks of 4-64 KiB (multiples of 256 B)
//!   separated by holes of 0-64 KiB, slid down into one packed run (one
//!   wave, every move overlapping its neighbours); against one
//!   `cuMemcpyDtoDAsync` per block [>= 10x faster] and one big copy of the
//!   same total bytes [ratio >= 0.90].
//! - **unaligned**: the same compaction in an arena of 1-byte alignment
//!   (sizes and holes any number of bytes, so most moves' source and
//!   destination differ modulo 16) [ratio >= 0.80 of one big copy].
//! - **slide**: one 4 GiB block sliding down by 256 B; against a
//!   non-overlapping 4 GiB `cuMemcpyDtoDAsync` [ratio >= 0.95].
//!
//! `CUARENA_BENCH_CASES=slide,compact` runs only the cases named (for a
//! profiler); `CUARENA_BENCH_SLIDE=4096` slides by another shift.
//!
//! Times include everything `execute` does on the host (checking the plan,
//! laying out and uploading the descriptors): the start event is recorded
//! before the call. Context creation and NVRTC stay out.
//!
//! Environment: `CUARENA_BENCH_REPS` (default 10), `CUARENA_BENCH_SWEEP=1`
//! also times other kernel shapes (threads x vectors per thread),
//! `CUARENA_BENCH_SHAPES="256x8,128x16c2,256x16b3,256x16s0"` the shapes
//! listed (`cN`: CTAs per SM, `bS`: bulk stages, `sM`: side buffer MiB), `CUARENA_BENCH_PER_BLOCK=0`
//! leaves out the one-memcpy-per-block baseline of the compaction cases.

use cuarena::backend::cuda::cudarc::driver::{sys, CudaStream};
use cuarena::backend::cuda::{CudaBackend, CudaCapacity, CudaOptions};
use cuarena::backend::Backend;
use cuarena::plan::{Move, Plan};
use cuarena::Result;

use cuarena_testkit::{
    driver_err, fill_region, gpu_bench_reps, ladder_moves, memcpy_in_region, mv, plan_of,
    EventTimer, Rng,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn one_wave(moves: Vec<Move>) -> Plan {
    plan_of(vec![moves])
}

/// Keeps the arena stream busy for several milliseconds (a memset of 16 GiB).
fn blocker(region_ptr: u64, stream: &CudaStream) -> Result<()> {
    // SAFETY: 16 GiB inside the region (the bench's region holds 17 GiB),
    // on the arena stream.
    unsafe {
        sys::cuMemsetD32Async(
            region_ptr,
            0x1234_5678,
            (16 * GIB / 4) as usize,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(driver_err("cuMemsetD32Async"))
}

struct Row {
    case: String,
    bytes: u64,
    ours_ms: f64,
    base_name: &'static str,
    base_ms: f64,
    target: &'static str,
}

impl Row {
    /// Bandwidth in GB/s counting bytes read plus written.
    fn gbps(bytes: u64, ms: f64) -> f64 {
        2.0 * bytes as f64 / (ms * 1e-3) / 1e9
    }
}

/// `count` blocks of 4-64 KiB separated by holes of 0-64 KiB, slid down
/// into one packed run; sizes and holes are multiples of `unit` (256: the
/// default arena alignment; 1: an arena of 1-byte alignment, where source
/// and destination of most moves differ modulo 16).
fn compaction_moves(count: usize, seed: u64, unit: u64) -> (Vec<Move>, u64, u64) {
    let mut rng = Rng::new(seed);
    let mut moves = Vec::with_capacity(count);
    let (mut src, mut dst) = (0u64, 0u64);
    for _ in 0..count {
        src += rng.range(0, 64 * KIB / unit) * unit; // hole of 0-64 KiB
        let len = rng.range(4 * KIB / unit, 64 * KIB / unit) * unit; // 4-64 KiB
        moves.push(mv(src, dst, len));
        src += len;
        dst += len;
    }
    (moves, dst, src)
}

/// Whether case `name` runs: `CUARENA_BENCH_CASES` is a comma-separated
/// list of `large`, `compact`, `unaligned`, `slide` (default: all), so that
/// a profiler can be pointed at one case.
fn wanted(name: &str) -> bool {
    match std::env::var("CUARENA_BENCH_CASES") {
        Ok(list) if !list.trim().is_empty() => list.split(',').any(|c| c.trim() == name),
        _ => true,
    }
}

/// Whether the compaction cases also time one `cuMemcpyDtoDAsync` per block
/// (100,000 calls a repetition): `CUARENA_BENCH_PER_BLOCK=0` leaves that
/// baseline out (shape sweeps, profilers).
fn per_block_baseline() -> bool {
    std::env::var("CUARENA_BENCH_PER_BLOCK").map_or(true, |v| v.trim() != "0")
}

/// Bytes the slide case slides by: `CUARENA_BENCH_SLIDE` (default 256, the
/// target's case; others for experiments).
fn slide_shift() -> u64 {
    std::env::var("CUARENA_BENCH_SLIDE")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|&s: &u64| (1..=GIB).contains(&s))
        .unwrap_or(256)
}

fn run_cases(backend: &mut CudaBackend, timer: &EventTimer, label: &str) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    if wanted("large") {
        large_case(backend, timer, label, &mut rows)?;
    }
    if wanted("compact") {
        compact_case(backend, timer, label, 256, &mut rows)?;
    }
    if wanted("unaligned") {
        compact_case(backend, timer, label, 1, &mut rows)?;
    }
    if wanted("slide") {
        slide_case(backend, timer, label, &mut rows)?;
    }
    backend.synchronize()?;
    Ok(rows)
}

/// large: 8 GiB of 1 MiB..1 GiB blocks, non-overlapping.
fn large_case(
    backend: &mut CudaBackend,
    timer: &EventTimer,
    label: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let (moves, total) = ladder_moves(8 * GIB);
    let copies: Vec<_> = moves.iter().map(|m| (m.src, m.dst, m.len)).collect();
    let plan = one_wave(moves);
    let ours = timer.median_ms(|| backend.execute(&plan))?;
    let base = timer.median_ms(|| memcpy_in_region(backend, &copies))?;
    rows.push(Row {
        case: format!("{label} large 1M-1G x44"),
        bytes: total,
        ours_ms: ours,
        base_name: "memcpy/block",
        base_ms: base,
        target: ">=0.98",
    });
    Ok(())
}

/// compact-100k: slide 100,000 blocks of 4-64 KiB down into a packed run,
/// sizes and holes multiples of `unit` bytes.
fn compact_case(
    backend: &mut CudaBackend,
    timer: &EventTimer,
    label: &str,
    unit: u64,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let (region, stream) = (backend.region_ptr(), backend.stream().clone());
    let name = if unit == 256 {
        "compact 100k 4-64K".to_string()
    } else {
        format!("compact 100k align {unit}")
    };
    let (moves, live, span) = compaction_moves(100_000, 7, unit);
    let plan = one_wave(moves);
    let ours = timer.median_ms(|| backend.execute(&plan))?;
    // Baselines copy the same blocks to a separate, non-overlapping area.
    let far = span.div_ceil(GIB) * GIB;
    let copies: Vec<_> = plan.waves()[0]
        .moves()
        .iter()
        .map(|m| (m.src, far + m.dst, m.len))
        .collect();
    if per_block_baseline() {
        let per_block = timer.median_ms(|| memcpy_in_region(backend, &copies))?;
        rows.push(Row {
            case: format!("{label} {name}"),
            bytes: live,
            ours_ms: ours,
            base_name: "memcpy/block",
            base_ms: per_block,
            target: "speedup>=10",
        });
    }
    let one_big = timer.median_ms(|| memcpy_in_region(backend, &[(0, far, live)]))?;
    rows.push(Row {
        case: format!("{label} {name}"),
        bytes: live,
        ours_ms: ours,
        base_name: "memcpy 1 big",
        base_ms: one_big,
        target: if unit == 256 { ">=0.90" } else { ">=0.80" },
    });
    let (dev, host) = timer.split_ms(|| blocker(region, &stream), || backend.execute(&plan))?;
    println!(
        "{label} {name}: end-to-end {ours:.3} ms; device alone {dev:.3} ms (uploads, prep, moves); \
         host {host:.3} ms (staging in chunks, overlapped with the device)"
    );
    Ok(())
}

/// slide-4g: a 4 GiB block sliding down by 256 B, against a plain copy.
fn slide_case(
    backend: &mut CudaBackend,
    timer: &EventTimer,
    label: &str,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let (region, stream) = (backend.region_ptr(), backend.stream().clone());
    let shift = slide_shift();
    let plan = one_wave(vec![mv(shift, 0, 4 * GIB)]);
    let ours = timer.median_ms(|| backend.execute(&plan))?;
    let (dev, host) = timer.split_ms(|| blocker(region, &stream), || backend.execute(&plan))?;
    println!(
        "{label} slide 4G: end-to-end {ours:.3} ms; device alone {dev:.3} ms; host {host:.3} ms"
    );
    let plain = timer.median_ms(|| memcpy_in_region(backend, &[(0, 8 * GIB, 4 * GIB)]))?;
    let ours_plain =
        timer.median_ms(|| backend.execute(&one_wave(vec![mv(0, 8 * GIB, 4 * GIB)])))?;
    rows.push(Row {
        case: format!("{label} slide 4G by {shift}B"),
        bytes: 4 * GIB,
        ours_ms: ours,
        base_name: "memcpy 4G",
        base_ms: plain,
        target: ">=0.95",
    });
    rows.push(Row {
        case: format!("{label} copy 4G (no overlap)"),
        bytes: 4 * GIB,
        ours_ms: ours_plain,
        base_name: "memcpy 4G",
        base_ms: plain,
        target: "info",
    });
    Ok(())
}

fn print_rows(rows: &[Row]) {
    println!(
        "| {:<34} | {:>9} | {:>9} | {:>8} | {:<12} | {:>9} | {:>8} | {:>7} | {:<11} |",
        "case", "MiB", "ours ms", "GB/s", "baseline", "base ms", "base GB/s", "ratio", "target"
    );
    println!("|{}|", "-".repeat(134));
    for r in rows {
        let ratio = r.base_ms / r.ours_ms;
        println!(
            "| {:<34} | {:>9.1} | {:>9.3} | {:>8.0} | {:<12} | {:>9.3} | {:>8.0} | {:>7.2} | {:<11} |",
            r.case,
            r.bytes as f64 / MIB as f64,
            r.ours_ms,
            Row::gbps(r.bytes, r.ours_ms),
            r.base_name,
            r.base_ms,
            Row::gbps(r.bytes, r.base_ms),
            ratio,
            r.target
        );
    }
}

/// `TxV[cN][bS][sM]`: threads per CTA, vectors per thread, CTAs per SM,
/// bulk stages, side buffer in MiB (`s0`: every tile waits; the backend
/// validates the values).
fn parse_shape(spec: &str) -> Option<CudaOptions> {
    let (t, rest) = spec.split_once('x')?;
    let end = rest.find(['c', 'b', 's']).unwrap_or(rest.len());
    let mut o = CudaOptions::default()
        .with_large_moves(false)
        .with_threads_per_cta(t.parse().ok()?)
        .with_vectors_per_thread(rest[..end].parse().ok()?);
    let mut tail = &rest[end..];
    while !tail.is_empty() {
        let (tag, num) = tail.split_at(1);
        let end = num.find(['c', 'b', 's']).unwrap_or(num.len());
        let n: u32 = num[..end].parse().ok()?;
        o = match tag {
            "c" => o.with_ctas_per_sm(Some(n)),
            "b" => o.with_bulk_stages(n),
            "s" => o.with_side_buffer_bytes(n.checked_mul(1 << 20)?),
            _ => return None,
        };
        tail = &num[end..];
    }
    Some(o)
}

fn main() -> Result<()> {
    let Some(reps) = gpu_bench_reps("moves", 10) else {
        return Ok(());
    };
    let sweep = std::env::var("CUARENA_BENCH_SWEEP").is_ok_and(|s| s == "1");

    let mut shapes = vec![CudaOptions::default()];
    // `CUARENA_BENCH_SHAPES="256x8,512x8c2,256x16b3"`: other shapes to time
    // (threads x vectors, `cN` CTAs per SM, `bS` bulk stages).
    if let Ok(list) = std::env::var("CUARENA_BENCH_SHAPES") {
        for spec in list.split(',').filter(|s| !s.is_empty()) {
            match parse_shape(spec) {
                Some(o) => shapes.push(o),
                None => println!("CUARENA_BENCH_SHAPES: '{spec}' is not TxV[cN][bS][sM]; skipped"),
            }
        }
    }
    if sweep {
        // (threads, vectors per thread, bulk stages; 0 = register kernel)
        for (t, v, s) in [(256, 16, 0), (128, 16, 6), (256, 8, 6)] {
            shapes.push(
                CudaOptions::default()
                    .with_large_moves(false)
                    .with_threads_per_cta(t)
                    .with_vectors_per_thread(v)
                    .with_bulk_stages(s),
            );
        }
    }
    let capacity = 17 * GIB;
    let mut all = Vec::new();
    for opts in shapes {
        let mut backend = CudaBackend::with_options(0, CudaCapacity::Bytes(capacity), opts)?;
        let ctas = opts
            .ctas_per_sm
            .map(|c| format!("c{c}"))
            .unwrap_or_default();
        let stages = match opts.bulk_stages {
            0 => "r".to_string(),
            s => format!("b{s}"),
        };
        let side = if opts.side_buffer_bytes == CudaOptions::default().side_buffer_bytes {
            String::new()
        } else {
            format!("s{}", opts.side_buffer_bytes >> 20)
        };
        // The shape asked for; the kernels as they run are printed below
        // (the bulk kernel's stages are lowered to what fits, and devices
        // before Hopper run the register kernel).
        let label = format!(
            "{}x{}{ctas}{stages}{side}",
            opts.threads_per_cta, opts.vectors_per_thread
        );
        println!(
            "device {} ({}, {} SMs, peak copy {:.0} GB/s); shape {label}:\n{}",
            backend.device_name(),
            backend.arch(),
            backend.sm_count(),
            backend.copy_bytes_per_ns(),
            backend.describe_kernels()
        );
        fill_region(&backend, 0x5A3C_96E1)?;
        let timer = EventTimer::new(&backend, reps)?;
        all.extend(run_cases(&mut backend, &timer, &label)?);
    }
    println!();
    println!("moves bench: median of {reps} (ratio = baseline time / our time; GB/s counts read + write)");
    print_rows(&all);
    Ok(())
}
