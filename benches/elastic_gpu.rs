//! The elastic arena on the GPU: what mapping and unmapping cost, whether
//! growth waits for queued work, and the move kernel on mapped memory.
//! One run, one device, a table at the end.
//!
//! Run on a machine with a GPU: `cargo bench --bench elastic_gpu` (or the
//! staged executable with `--bench`, see `scripts/gpu-suite.sh`). Without
//! a GPU it prints why and exits 0.
//!
//! # Cases (targets in brackets)
//!
//! - **map / unmap**: `CUARENA_BENCH_MAP_GIB` GiB (default 8) mapped
//!   through the CUDA backend's mapping layer in chunks of 2 MiB, 32 MiB,
//!   256 MiB and 1 GiB (`Backend::map_to` per chunk: `cuMemCreate`,
//!   `cuMemMap`, `cuMemSetAccess`), then unmapped (`Backend::unmap_to(0)`
//!   and `synchronize`, which waits for the streams and releases every
//!   chunk: `cuMemUnmap`, `cuMemRelease`); host time of each, median of
//!   the repetitions, per GiB and per chunk. The time of one `synchronize`
//!   with nothing to release is printed beside them (it is inside the
//!   unmap figure).
//! - **growth behind queued work**: an elastic arena (no capacity, no
//!   automatic trim) allocates blocks of 1-64 MiB up to 8 GiB live, freeing
//!   about one in four on the way, while a gate kernel holds its stream:
//!   host time (median, 90th percentile, largest) of the allocations that
//!   mapped chunks and moved nothing (and per chunk mapped), of those that
//!   mapped and compacted too, and of the others; and whether the gate was
//!   still closed when the last allocation returned [it must be: growth
//!   never waits for queued work].
//! - **moves on mapped memory**: the moves bench's large case (blocks of
//!   1 MiB to 1 GiB, four times over, 8 GiB, non-overlapping, one wave) and
//!   one 4 GiB block, our kernel against `cuMemcpyDtoDAsync` on the same
//!   bytes, in a 17 GiB region mapped in 2 MiB chunks (the finest an
//!   elastic arena maps), one mapped in 256 MiB chunks, and a fixed region
//!   (`cuMemAlloc`) for comparison [ratio >= 0.98 on mapped memory].
//!
//! Environment: `CUARENA_BENCH_REPS` (default 5), `CUARENA_BENCH_MAP_GIB`.

use std::time::{Duration, Instant};

use cuarena::backend::cuda::{CudaBackend, CudaOptions};
use cuarena::backend::Backend;
use cuarena::{Arena, ArenaConfig, Handle, Result};
use cuarena_testkit::{
    env_u64, fill_region, gpu_bench_reps, ladder_moves, median, memcpy_in_region, mv, plan_of,
    EventTimer, Gate, Rng,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The value at fraction `q` of `x` (sorted in place; nearest rank).
fn quantile(x: &mut [f64], q: f64) -> f64 {
    x.sort_by(f64::total_cmp);
    let i = ((x.len() as f64 * q).ceil() as usize).clamp(1, x.len().max(1)) - 1;
    x.get(i).copied().unwrap_or(f64::NAN)
}

// ---- map / unmap -------------------------------------------------------------

struct MapRow {
    chunk: u64,
    chunks: u64,
    map_ms: f64,
    unmap_ms: f64,
}

/// Maps `total` bytes in chunks of `chunk` and unmaps them, `reps` times
/// on the same reserved range; median host times.
fn map_unmap(b: &mut CudaBackend, total: u64, chunk: u64, reps: usize) -> Result<MapRow> {
    let (mut map, mut unmap) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        let mut end = 0;
        while end < total {
            end = (end + chunk).min(total);
            b.map_to(end)?;
        }
        map.push(ms(t.elapsed()));
        let t = Instant::now();
        b.unmap_to(0)?;
        b.synchronize()?;
        unmap.push(ms(t.elapsed()));
        assert_eq!(b.mapped_chunks(), (0, 0), "everything released");
    }
    Ok(MapRow {
        chunk,
        chunks: total.div_ceil(chunk),
        map_ms: median(&mut map),
        unmap_ms: median(&mut unmap),
    })
}

/// The map rows, one idle synchronize's time, the bytes mapped, and the
/// device's name.
fn map_rows(reps: usize) -> Result<(Vec<MapRow>, f64, u64, String)> {
    let total = env_u64("CUARENA_BENCH_MAP_GIB").unwrap_or(8).max(1) * GIB;
    let mut b = CudaBackend::elastic(0, Some(total), CudaOptions::default())?;
    let g = b.granularity_bytes();
    // One synchronize with nothing to release: part of every unmap figure.
    let mut idle = Vec::new();
    for _ in 0..reps.max(5) {
        let t = Instant::now();
        b.synchronize()?;
        idle.push(ms(t.elapsed()));
    }
    let mut rows = Vec::new();
    for chunk in [2 * MIB, 32 * MIB, 256 * MIB, GIB] {
        let chunk = chunk.next_multiple_of(g);
        rows.push(map_unmap(&mut b, total, chunk, reps)?);
    }
    Ok((rows, median(&mut idle), total, b.device_name().to_string()))
}

// ---- growth behind queued work -----------------------------------------------

struct Growth {
    /// Allocations that mapped chunks and moved nothing: their host times
    /// and the chunks they mapped.
    grow_us: Vec<f64>,
    chunks: usize,
    /// Allocations that mapped chunks and compacted too (the rule's third
    /// case), and those that did neither.
    grow_compact_us: Vec<f64>,
    other_us: Vec<f64>,
    compactions: u64,
    gate_closed: bool,
    live: u64,
    mapped: u64,
}

fn growth_behind_gate() -> Result<Growth> {
    let mut a = Arena::cuda(ArenaConfig::elastic().with_trim_window_us(0), 0)?;
    // The first allocation and a synchronize: the arena's own one-time
    // work (the handle table's device copy) out of the way.
    let first = a.alloc(MIB)?;
    a.synchronize()?;
    let gate = Gate::hold(a.backend())?;
    let mut rng = Rng::new(34);
    let (mut grow_us, mut grow_compact_us, mut other_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut chunks = 0;
    let compactions = |a: &Arena<CudaBackend>| {
        let st = a.stats();
        st.targeted_compactions + st.full_compactions
    };
    let mut live: Vec<Handle> = vec![first];
    while a.stats().allocated_bytes < 8 * GIB {
        if live.len() > 1 && rng.below(4) == 0 {
            let h = live.swap_remove(rng.index(live.len()));
            a.free(h)?;
        }
        let size = rng.range(1, 64) * MIB;
        let (before, moved) = (a.backend().mapped_chunks().0, compactions(&a));
        let t = Instant::now();
        live.push(a.alloc(size)?);
        let us = t.elapsed().as_secs_f64() * 1e6;
        let after = a.backend().mapped_chunks().0;
        if after > before && compactions(&a) > moved {
            grow_compact_us.push(us);
        } else if after > before {
            grow_us.push(us);
            chunks += after - before;
        } else {
            other_us.push(us);
        }
    }
    let gate_closed = gate.closed()?;
    gate.open();
    a.synchronize()?;
    drop(gate);
    let st = a.stats();
    Ok(Growth {
        chunks,
        grow_us,
        grow_compact_us,
        other_us,
        compactions: compactions(&a),
        gate_closed,
        live: st.allocated_bytes,
        mapped: st.capacity_bytes,
    })
}

// ---- moves on mapped memory --------------------------------------------------

const REGION: u64 = 17 * GIB;

struct MoveRow {
    region: String,
    case: &'static str,
    bytes: u64,
    ours_ms: f64,
    base_ms: f64,
    target: &'static str,
}

fn move_rows(b: &mut CudaBackend, region: &str, reps: usize) -> Result<Vec<MoveRow>> {
    fill_region(b, 0x5A3C_96E1)?;
    let timer = EventTimer::new(b, reps)?;
    let (moves, total) = ladder_moves(8 * GIB);
    let copies: Vec<_> = moves.iter().map(|m| (m.src, m.dst, m.len)).collect();
    let plan = plan_of(vec![moves]);
    let ours = timer.median_ms(|| b.execute(&plan))?;
    let base = timer.median_ms(|| memcpy_in_region(b, &copies))?;
    let one = plan_of(vec![vec![mv(0, 8 * GIB, 4 * GIB)]]);
    let ours_one = timer.median_ms(|| b.execute(&one))?;
    let base_one = timer.median_ms(|| memcpy_in_region(b, &[(0, 8 * GIB, 4 * GIB)]))?;
    b.synchronize()?;
    let target = if region.starts_with("fixed") {
        "info"
    } else {
        ">=0.98"
    };
    Ok(vec![
        MoveRow {
            region: region.to_string(),
            case: "large 1M-1G x44",
            bytes: total,
            ours_ms: ours,
            base_ms: base,
            target,
        },
        MoveRow {
            region: region.to_string(),
            case: "one 4G block",
            bytes: 4 * GIB,
            ours_ms: ours_one,
            base_ms: base_one,
            target,
        },
    ])
}

fn moves_on_mapped(reps: usize) -> Result<Vec<MoveRow>> {
    let mut rows = Vec::new();
    for chunk in [2 * MIB, 256 * MIB] {
        let mut b = CudaBackend::elastic(0, Some(REGION), CudaOptions::default())?;
        let chunk = chunk.next_multiple_of(b.granularity_bytes());
        let t = Instant::now();
        let mut end = 0;
        while end < REGION {
            end = (end + chunk).min(REGION);
            b.map_to(end)?;
        }
        println!(
            "mapped {} GiB in {} chunks of {} MiB in {:.1} ms",
            REGION / GIB,
            REGION.div_ceil(chunk),
            chunk / MIB,
            ms(t.elapsed())
        );
        let label = format!("mapped, {} MiB chunks", chunk / MIB);
        rows.extend(move_rows(&mut b, &label, reps)?);
    }
    let mut b = CudaBackend::new(0, REGION)?;
    rows.extend(move_rows(&mut b, "fixed (cuMemAlloc)", reps)?);
    Ok(rows)
}

// ---- the table ---------------------------------------------------------------

fn gbps(bytes: u64, ms: f64) -> f64 {
    2.0 * bytes as f64 / (ms * 1e-3) / 1e9
}

fn main() -> Result<()> {
    let Some(reps) = gpu_bench_reps("elastic_gpu", 5) else {
        return Ok(());
    };
    let (maps, idle_ms, total, name) = map_rows(reps)?;
    println!("device {name}; median of {reps}");
    let growth = growth_behind_gate()?;
    let moves = moves_on_mapped(reps)?;

    println!();
    println!("elastic_gpu bench on {name}: median of {reps}");
    println!();
    println!(
        "map and unmap {} GiB through the backend (host time; unmap includes one synchronize, {:.3} ms with nothing to release)",
        total / GIB,
        idle_ms
    );
    println!("| chunk | chunks | map ms/GiB | map us/chunk | unmap ms/GiB | unmap us/chunk |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    let gib = total as f64 / GIB as f64;
    for r in &maps {
        println!(
            "| {} MiB | {} | {:.3} | {:.1} | {:.3} | {:.1} |",
            r.chunk / MIB,
            r.chunks,
            r.map_ms / gib,
            r.map_ms * 1e3 / r.chunks as f64,
            r.unmap_ms / gib,
            r.unmap_ms * 1e3 / r.chunks as f64
        );
    }
    println!();
    let Growth {
        chunks,
        mut grow_us,
        mut grow_compact_us,
        mut other_us,
        compactions,
        gate_closed,
        live,
        mapped,
    } = growth;
    println!(
        "growth behind a closed gate: {} allocations up to {:.2} GiB live, {:.2} GiB mapped, {compactions} compactions",
        grow_us.len() + grow_compact_us.len() + other_us.len(),
        live as f64 / GIB as f64,
        mapped as f64 / GIB as f64
    );
    let per_chunk = grow_us.iter().sum::<f64>() / chunks.max(1) as f64;
    println!(
        "| allocations | count | host us: median | p90 | max | chunks mapped | host us per chunk |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    let row = |what: &str, us: &mut Vec<f64>, tail: String| {
        let n = us.len();
        let (m, p90, max) = (quantile(us, 0.5), quantile(us, 0.9), quantile(us, 1.0));
        println!("| {what} | {n} | {m:.1} | {p90:.1} | {max:.1} | {tail} |");
    };
    let tail = format!("{chunks} | {per_chunk:.1}");
    row("mapped chunks, moved nothing", &mut grow_us, tail);
    row(
        "mapped chunks and compacted",
        &mut grow_compact_us,
        " |".into(),
    );
    row("neither", &mut other_us, " |".into());
    println!(
        "queued work still waiting behind the gate when the last allocation returned [must]: {}",
        if gate_closed {
            "yes"
        } else {
            "NO: an allocation waited"
        }
    );
    println!();
    println!("moves: our kernel against cuMemcpyDtoDAsync on the same bytes (ratio = memcpy time / ours; GB/s counts read + write)");
    println!("| region | case | MiB | ours ms | GB/s | memcpy ms | GB/s | ratio | target |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for r in &moves {
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.0} | {:.3} | {:.0} | {:.3} | {} |",
            r.region,
            r.case,
            r.bytes as f64 / MIB as f64,
            r.ours_ms,
            gbps(r.bytes, r.ours_ms),
            r.base_ms,
            gbps(r.bytes, r.base_ms),
            r.base_ms / r.ours_ms,
            r.target
        );
    }
    let missed: Vec<String> = moves
        .iter()
        .filter(|r| r.target == ">=0.98" && r.base_ms / r.ours_ms < 0.98)
        .map(|r| format!("{} {}", r.region, r.case))
        .collect();
    if !gate_closed {
        println!("MISSED: an allocation that mapped chunks waited for queued work");
    }
    if !missed.is_empty() {
        println!("MISSED: ratio below 0.98 on {}", missed.join("; "));
    }
    Ok(())
}
