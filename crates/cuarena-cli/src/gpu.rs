//! `cuarena replay --gpu`: the replay on a CUDA arena with real bytes, and
//! the real baselines (a CUDA memory pool, capped and not, and plain
//! `cuMemAlloc` / `cuMemFree`) in the same process.

#[cfg(not(feature = "cuda"))]
pub(crate) fn run(_args: &crate::args::ReplayArgs) -> crate::Res<()> {
    Err(crate::Failure::NoGpu(
        "--gpu needs cuarena's `cuda` feature (build with default features)".to_owned(),
    ))
}

#[cfg(feature = "cuda")]
pub(crate) use imp::run;

#[cfg(feature = "cuda")]
mod imp {
    use std::time::Duration;

    use cuarena::backend::cuda::CudaBackend;
    use cuarena::{fmt_bytes, ArenaConfig, Error};
    use cuarena_trace::gpu::baselines::{
        find_min_pool_capacity, replay_cu_mem_alloc, replay_pool, PoolOptions,
    };
    use cuarena_trace::gpu::replay::{replay_gpu, CheckSampling, GpuReplayOptions};
    use cuarena_trace::trace::{replay_with, Allocator, Outcome, ReplayOptions, Trace};
    use cuarena_trace::viz::timeline_svg;
    use cuarena_trace::ToolError;

    use crate::args::ReplayArgs;
    use crate::gpu_table::{arena_row, baseline_row, print_gpu_details, print_table, ratio};
    use crate::replay::{
        capacity_bytes, file_name, find_min, load, print_head, result_cell, write_file, write_map,
        Loaded,
    };
    use crate::{Failure, Res};

    pub(crate) fn run(args: &ReplayArgs) -> Res<()> {
        if let Err(reason) = CudaBackend::available() {
            return Err(Failure::NoGpu(format!(
                "--gpu needs a CUDA GPU and this machine has none usable: {reason}"
            )));
        }
        let loaded = load(args)?;
        let verdict = crate::verdict::compute(&loaded, args.align, args.policy)?;
        print_head(&loaded, &verdict, args)?;
        let Loaded {
            trace,
            device,
            ops,
            peak,
            ..
        } = loaded;
        let align = args.align;
        let capacity = match args.capacity {
            Some(c) => capacity_bytes(c, peak, align)?,
            None => {
                let m = find_min(&ops, align, Allocator::Bounded, peak).map_err(|e| {
                    Failure::Arena(format!("the arena completes the trace at no capacity: {e}"))
                })?;
                outln!(
                "  smallest capacity the metadata search finds: {} ({:.4} x peak live, {} trials)",
                fmt_bytes(m.capacity_bytes),
                m.ratio(),
                m.trials
            )?;
                m.capacity_bytes
            }
        };
        let config = ArenaConfig::new(capacity).with_alignment_bytes(align);
        let trace_wall = trace_wall_time(&trace, device);
        outln!(
            "  trace wall time {:.3} s (last minus first time_us of device {device})",
            trace_wall.as_secs_f64()
        )?;

        // The metadata replay: the timeline, and the decisions the GPU
        // replay must repeat.
        let meta = replay_with(
            &ops,
            &config,
            &ReplayOptions::default()
                .with_allocator(args.policy)
                .with_timeline_points(2000),
        )?;

        outln!()?;
        outln!("cuarena on the GPU at {} ...", fmt_bytes(capacity))?;
        let options = GpuReplayOptions::default()
            .with_ordinal(args.gpu_ordinal)
            .with_sampling(if args.check_all {
                CheckSampling::ALL
            } else {
                CheckSampling::default()
            })
            .with_warmup_passes(args.gpu_warmup)
            .with_corrupt_block(args.gpu_corrupt)
            .with_allocator(args.policy);
        outln!("  GPU arena policy: {}", args.policy.label())?;
        let gpu = replay_gpu(&ops, &config, &options);
        let mut rows = Vec::new();
        match &gpu {
            Ok(g) => {
                print_gpu_details(g)?;
                let same = g.warmup.iter().chain([&g.timed]).all(|p| {
                    p.compaction.targeted_compactions == meta.compaction.targeted_compactions
                        && p.compaction.full_compactions == meta.compaction.full_compactions
                        && p.compaction.bytes_moved == meta.compaction.bytes_moved
                        && p.ops_run == meta.ops_run
                        && p.peak_live_bytes == meta.peak_live_bytes
                });
                outln!(
                    "  every pass made the metadata replay's decisions (compactions, bytes moved, \
                 ops run, peak): {}",
                    if same { "yes" } else { "NO" }
                )?;
                rows.push(arena_row(g, capacity, peak, trace_wall));
            }
            Err(e) => outln!("  GPU replay error: {e}")?,
        }
        // The elastic replay's verdict joins the fixed arena's in the exit
        // status.
        let mut elastic_verdict: Res<()> = Ok(());
        if args.elastic {
            // The elastic arena with real bytes: no capacity, its automatic
            // trim on the wall clock (the replay runs faster than the trace).
            outln!()?;
            outln!("cuarena elastic on the GPU (no capacity) ...")?;
            let elastic = ArenaConfig::elastic().with_alignment_bytes(align);
            match replay_gpu(&ops, &elastic, &options) {
                Ok(g) => {
                    print_gpu_details(&g)?;
                    let mut row = arena_row(&g, g.timed.peak_mapped_bytes, peak, trace_wall);
                    row.allocator = "cuarena elastic on the GPU (peak mapped)".to_owned();
                    rows.push(row);
                    elastic_verdict = elastic_outcome(&g.outcome);
                }
                Err(e) => {
                    outln!("  GPU elastic replay error: {e}")?;
                    elastic_verdict = Err(Failure::Arena(format!("GPU elastic replay: {e}")));
                }
            }
        }
        if let Some(id) = args.gpu_corrupt {
            outln!()?;
            print_table(&rows)?;
            let g = gpu.map_err(|e| Failure::Arena(format!("GPU replay: {e}")))?;
            return match &g.outcome {
                Outcome::Failed { event, error, .. } => {
                    outln!(
                        "self-test passed: block {id} was overwritten on purpose, and the replay \
                     failed at event {event}: {error}"
                    )?;
                    Ok(())
                }
                Outcome::Completed => Err(Failure::Arena(format!(
                    "self-test FAILED: block {id} was overwritten but every check passed"
                ))),
            };
        }

        // The pool at the arena's capacity, and its own smallest.
        let ordinal = args.gpu_ordinal;
        if !args.gpu_baselines {
            outln!()?;
            print_table(&rows)?;
            let g = gpu.map_err(|e| Failure::Arena(format!("GPU replay: {e}")))?;
            return gpu_outcome(&g.outcome, capacity).and(elastic_verdict);
        }
        outln!()?;
        outln!("CUDA pool at the arena's capacity ...")?;
        match replay_pool(
            &ops,
            &PoolOptions::default()
                .with_ordinal(ordinal)
                .with_max_size_bytes(capacity)
                .with_record_reserved(false),
        ) {
            Ok(r) => rows.push(baseline_row(
                "CUDA pool, capped at the arena's capacity",
                &r,
                r.capacity_bytes,
                peak,
            )),
            Err(e) => outln!("  error: {e}")?,
        }
        outln!("CUDA pool: smallest capacity that completes (to 0.1% of peak live) ...")?;
        let mut pool_min = None;
        match find_min_pool_capacity(&ops, ordinal, peak, peak / 1000) {
            Ok(m) => {
                for t in &m.trials {
                    outln!(
                        "  {:>12} ({:.4}): {}",
                        fmt_bytes(t.capacity_bytes),
                        t.capacity_bytes as f64 / peak.max(1) as f64,
                        t.failed_event
                            .map_or("completed".to_owned(), |e| format!("failed at event {e}"))
                    )?;
                }
                rows.push(baseline_row(
                    "CUDA pool, smallest capacity that completes",
                    &m.report,
                    Some(m.capacity_bytes),
                    peak,
                ));
                pool_min = Some(m.capacity_bytes);
            }
            Err(e) => outln!("  error: {e}")?,
        }
        outln!("CUDA pool, uncapped ...")?;
        match replay_pool(
            &ops,
            &PoolOptions::default()
                .with_ordinal(ordinal)
                .with_max_size_bytes(0)
                .with_record_reserved(false),
        ) {
            Ok(r) => {
                let mut row = baseline_row("CUDA pool, uncapped", &r, None, peak);
                if let Some(high) = r.peak_reserved_bytes {
                    row.capacity = format!("uncapped, reserved peak {}", fmt_bytes(high));
                    row.cap_over_peak = ratio(high, peak);
                }
                rows.push(row);
            }
            Err(e) => outln!("  error: {e}")?,
        }
        outln!("cuMemAlloc / cuMemFree ...")?;
        match replay_cu_mem_alloc(&ops, ordinal) {
            Ok(r) => rows.push(baseline_row(
                "cuMemAlloc / cuMemFree per tensor",
                &r,
                None,
                peak,
            )),
            Err(e) => outln!("  error: {e}")?,
        }

        outln!()?;
        let device_name = match &gpu {
            Ok(g) => g.device_name.clone(),
            Err(_) => "the GPU".to_owned(),
        };
        outln!(
            "{} on {device_name} (peak live {}, trace wall time {:.3} s):",
            file_name(&args.trace),
            fmt_bytes(peak),
            trace_wall.as_secs_f64()
        )?;
        print_table(&rows)?;

        if args.svg.is_some() || args.map.is_some() {
            if let Some(mut timeline) = meta.timeline.clone() {
                let reserved = trace.reserved_series(device);
                if !reserved.is_empty() {
                    timeline
                        .baselines
                        .push(("PyTorch caching allocator, reserved".to_owned(), reserved));
                }
                if args.svg.is_some() {
                    match replay_pool(
                        &ops,
                        &PoolOptions::default()
                            .with_ordinal(ordinal)
                            .with_max_size_bytes(0)
                            .with_record_reserved(true),
                    ) {
                        Ok(r) if !r.reserved.is_empty() => timeline
                            .baselines
                            .push(("CUDA pool (uncapped), reserved".to_owned(), r.reserved)),
                        Ok(_) => {}
                        Err(e) => outln!("CUDA pool reserved series: error: {e}")?,
                    }
                }
                if let (Some(cap), Some(&first), Some(&last)) =
                    (pool_min, ops.event_index.first(), ops.event_index.last())
                {
                    timeline.baselines.push((
                        "CUDA pool, smallest completing cap".to_owned(),
                        vec![(first, cap), (last, cap)],
                    ));
                }
                timeline.title = format!(
                "{} - cuarena at {} ({:.4} x peak live), {} on {device_name} with pattern checks",
                file_name(&args.trace),
                fmt_bytes(capacity),
                capacity as f64 / peak.max(1) as f64,
                match &gpu {
                    Ok(g) => result_cell(&g.outcome),
                    Err(_) => "error".to_owned(),
                },
            );
                if let Some(path) = &args.svg {
                    write_file(path, &timeline_svg(&timeline))?;
                }
                if let Some(path) = &args.map {
                    write_map(path, &ops, align, capacity, args.policy, &timeline)?;
                }
            }
        }

        let g = gpu.map_err(|e| Failure::Arena(format!("GPU replay: {e}")))?;
        gpu_outcome(&g.outcome, capacity).and(elastic_verdict)
    }

    /// Exit status 1 unless the elastic replay completed with every check
    /// right.
    fn elastic_outcome(outcome: &Outcome) -> Res<()> {
        match outcome {
            Outcome::Completed => Ok(()),
            Outcome::Failed { event, error, .. } => Err(Failure::Arena(format!(
                "GPU ELASTIC REPLAY FAILED at event {event}: {error}"
            ))),
        }
    }

    /// Exit status 1 unless the GPU replay completed with every check right.
    fn gpu_outcome(outcome: &Outcome, capacity: u64) -> Res<()> {
        match outcome {
            Outcome::Completed => Ok(()),
            Outcome::Failed {
                error: ToolError::Arena(Error::OutOfMemory { .. } | Error::TooLarge { .. }),
                event,
                ..
            } => Err(Failure::Arena(format!(
                "the arena ran out of memory on the GPU at event {event} at {} (no data error)",
                fmt_bytes(capacity)
            ))),
            Outcome::Failed { event, error, .. } => Err(Failure::Arena(format!(
                "GPU REPLAY FAILED at event {event}: {error}"
            ))),
        }
    }

    /// Last minus first `time_us` of the trace's events on `device`.
    fn trace_wall_time(trace: &Trace, device: u32) -> Duration {
        let mut it = trace.events.iter().filter(|e| e.device == device);
        let first = it.next().map(|e| e.time_us);
        let last = it.next_back().map(|e| e.time_us).or(first);
        match (first, last) {
            (Some(a), Some(b)) if b > a => Duration::from_micros((b - a) as u64),
            _ => Duration::ZERO,
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_failed_elastic_replay_fails_the_command() {
            assert!(elastic_outcome(&Outcome::Completed).is_ok());
            let failed = Outcome::Failed {
                op: 3,
                event: 7,
                error: ToolError::DataMismatch {
                    what: "the tensors checked".to_owned(),
                    mismatched_words: 2,
                },
            };
            let Err(Failure::Arena(m)) = elastic_outcome(&failed) else {
                panic!("a failed elastic replay must fail the command");
            };
            assert!(m.contains("ELASTIC") && m.contains("event 7"), "{m}");
        }
    }
}
