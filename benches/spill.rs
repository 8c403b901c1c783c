//! Spilling on the GPU: what oversubscription costs a training loop, and
//! how fast the host tier's copies run.
//!
//! The loop is the `train_mlp` example's own (the `cuarena-mlp` crate,
//! not the example binary): the same model, batches, allocation order and
//! kernels, with `--data-pool` (batches are windows of inputs
//! made up front, so that the host's Gaussian sampling does not hide the
//! device's work) and one evaluation at the end. It is run with an arena
//! that fits (1.05 x the dry run's peak of live bytes, no host tier), then
//! at peak / R for R = 1.0, 1.25, 1.5 and 2.0 with a host tier of 2 x peak.
//! Steps per second are wall time over the loop (median of the runs, made
//! without timing the copies), and every run's final losses are checked:
//! they must be the same at every R.
//!
//! Bandwidth: in one more run per R, the example's backend records a CUDA
//! event before and after every spill (device to host) and restore (host
//! to device) copy on the arena stream; "achieved" is their bytes over the
//! sum of those intervals.
//! In the same process the bench then replays exactly the same sequence of
//! copy sizes with plain `cuMemcpyDtoHAsync` / `cuMemcpyHtoDAsync` between
//! a device buffer and page-locked memory (`cuMemHostAlloc`, flags 0, as the
//! host tier), timed the same way, and times single 64 MiB copies each way
//! (the link's peak). Context creation, NVRTC and the host tier's
//! allocation stay out of the timed loop.
//!
//! Run on a machine with a GPU: `cargo bench --bench spill` (or the staged
//! executable). Without one it prints why and exits 0. Environment:
//! `CUARENA_BENCH_SPILL_STEPS` (default 1000), `CUARENA_BENCH_SPILL_REPS`
//! (default 3).

#[cfg(feature = "cuda")]
fn main() {
    use cuarena::backend::cuda::CudaBackend;
    if let Err(reason) = CudaBackend::available() {
        println!("spill bench skipped: {reason}");
        return;
    }
    if let Err(e) = gpu::run() {
        eprintln!("spill bench failed: {e}");
        std::process::exit(1);
    }
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("spill bench skipped: cuarena was built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::error::Error;
    use std::sync::Arc;

    use cuarena::backend::cuda::cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
    use cuarena::fmt_bytes;

    use cuarena_mlp::gpu::{Dir, SpillTiming};
    use cuarena_mlp::{gpu_train, problem, Settings};
    use cuarena_testkit::{env_u64, median};

    type Res<T> = Result<T, Box<dyn Error>>;

    const MIB: usize = 1 << 20;

    /// One configuration's runs.
    struct Row {
        label: String,
        ratio: Option<f64>,
        capacity_over_peak: f64,
        steps_per_s: f64,
        /// Steps per second of the run whose copies were timed.
        timed_steps_per_s: f64,
        evictions: u64,
        restores: u64,
        timing: SpillTiming,
        final_train: f32,
        final_eval: f32,
    }

    /// Page-locked host memory from `cuMemHostAlloc` (flags 0, as the
    /// backend's host tier).
    struct Pinned {
        ptr: *mut u8,
        len: usize,
    }

    impl Pinned {
        fn new(len: usize) -> Res<Self> {
            // SAFETY: a plain page-locked allocation in the bound context.
            let ptr = unsafe { result::malloc_host(len, 0) }?;
            Ok(Self {
                ptr: ptr.cast(),
                len,
            })
        }

        fn as_mut_slice(&mut self) -> &mut [u8] {
            // SAFETY: `len` bytes owned by self; copies that use them are
            // waited for before the slice is used again or freed.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: from cuMemHostAlloc; the stream was synchronised.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }

    /// A device buffer from `cuMemAlloc`.
    struct DeviceBuf {
        ptr: sys::CUdeviceptr,
    }

    impl DeviceBuf {
        fn new(len: usize) -> Res<Self> {
            // SAFETY: a plain allocation in the bound context.
            let ptr = unsafe { result::malloc_sync(len) }?;
            Ok(Self { ptr })
        }
    }

    impl Drop for DeviceBuf {
        fn drop(&mut self) {
            // SAFETY: from cuMemAlloc; the stream was synchronised.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }

    /// Raw copies between a device buffer and page-locked memory, each
    /// timed by its own pair of CUDA events (as the example times spills).
    struct Raw {
        stream: Arc<CudaStream>,
        host: Pinned,
        dev: DeviceBuf,
        start: Vec<CudaEvent>,
        end: Vec<CudaEvent>,
    }

    impl Raw {
        fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Res<Self> {
            let stream = ctx.new_stream()?;
            let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
            let mut start = Vec::new();
            let mut end = Vec::new();
            for _ in 0..1024 {
                start.push(ctx.new_event(flags)?);
                end.push(ctx.new_event(flags)?);
            }
            Ok(Self {
                stream,
                host: Pinned::new(bytes)?,
                dev: DeviceBuf::new(bytes)?,
                start,
                end,
            })
        }

        /// Milliseconds (sum over the copies) of `copies`, each enqueued as
        /// one async copy between events.
        fn replay(&mut self, copies: &[(Dir, u64)]) -> Res<(f64, f64)> {
            let (mut out_ms, mut in_ms) = (0.0, 0.0);
            let cu = self.stream.cu_stream();
            for batch in copies.chunks(self.start.len()) {
                for (i, &(dir, len)) in batch.iter().enumerate() {
                    let len = usize::try_from(len)?.min(self.host.len);
                    self.start[i].record(&self.stream)?;
                    let host = &mut self.host.as_mut_slice()[..len];
                    // SAFETY: both buffers hold at least `len` bytes; the
                    // stream is synchronised (below) before the host buffer
                    // is touched again or freed.
                    unsafe {
                        match dir {
                            Dir::Out => result::memcpy_dtoh_async(host, self.dev.ptr, cu)?,
                            Dir::In => result::memcpy_htod_async(self.dev.ptr, host, cu)?,
                        }
                    }
                    self.end[i].record(&self.stream)?;
                }
                self.stream.synchronize()?;
                for (i, &(dir, _)) in batch.iter().enumerate() {
                    let ms = f64::from(self.start[i].elapsed_ms(&self.end[i])?);
                    match dir {
                        Dir::Out => out_ms += ms,
                        Dir::In => in_ms += ms,
                    }
                }
            }
            Ok((out_ms, in_ms))
        }

        /// Median GB/s of 11 single copies of `bytes` in direction `dir`.
        fn peak(&mut self, dir: Dir, bytes: u64) -> Res<f64> {
            let mut times = Vec::new();
            for _ in 0..11 {
                let (o, i) = self.replay(&[(dir, bytes)])?;
                times.push(o + i);
            }
            Ok(bytes as f64 / (median(&mut times) * 1e6))
        }
    }

    fn gbps(bytes: u64, ms: f64) -> f64 {
        if ms > 0.0 {
            bytes as f64 / (ms * 1e6)
        } else {
            f64::NAN
        }
    }

    pub fn run() -> Res<()> {
        let steps = env_u64("CUARENA_BENCH_SPILL_STEPS")
            .map_or(1000, |n| n as usize)
            .max(10);
        let reps = env_u64("CUARENA_BENCH_SPILL_REPS")
            .map_or(3, |n| n as usize)
            .max(1);
        // Keep the primary context alive between the runs' backends.
        let ctx = CudaContext::new(0)?;
        let device = ctx.name()?;
        let mut base = Settings::gpu();
        base.steps = steps;
        base.every = steps;
        base.data_pool = true;
        let p = problem(&base);

        // Warm-up: NVRTC, module loading, the driver's first copies.
        let mut warm = base.clone();
        (warm.steps, warm.every, warm.oversubscribe) = (50, 50, Some(1.5));
        gpu_train(&warm, &p, false)?;

        let configs: [(&str, Option<f64>); 5] = [
            ("fits (1.05x peak, no tier)", None),
            ("1.0x (peak, tier)", Some(1.0)),
            ("1.25x", Some(1.25)),
            ("1.5x", Some(1.5)),
            ("2.0x", Some(2.0)),
        ];
        let mut rows = Vec::new();
        for (label, ratio) in configs {
            let mut s = base.clone();
            s.oversubscribe = ratio;
            // Throughput without the copy timing's event records...
            s.time_copies = false;
            let mut rates = Vec::new();
            let mut losses = Vec::new();
            for _ in 0..reps {
                let r = gpu_train(&s, &p, false)?;
                let last = r.out.curve.last().ok_or("no evaluation")?;
                rates.push(steps as f64 / r.out.seconds);
                losses.push((last.train.map_or(f32::NAN, |t| t.0), last.eval_loss));
            }
            // ...then one run with every spill and restore copy timed.
            s.time_copies = true;
            let mut r = gpu_train(&s, &p, false)?;
            let st = r.gpu.arena.stats();
            let timing = r.gpu.timing()?;
            let last = r.out.curve.last().ok_or("no evaluation")?;
            let (final_train, final_eval) = (last.train.map_or(f32::NAN, |t| t.0), last.eval_loss);
            if losses.iter().any(|l| {
                l.0.to_bits() != final_train.to_bits() || l.1.to_bits() != final_eval.to_bits()
            }) {
                return Err(
                    format!("{label}: runs of the same seed ended with different losses").into(),
                );
            }
            rows.push(Row {
                label: label.to_string(),
                ratio,
                capacity_over_peak: st.capacity_bytes as f64 / r.peak as f64,
                steps_per_s: median(&mut rates),
                timed_steps_per_s: steps as f64 / r.out.seconds,
                evictions: st.evictions,
                restores: st.restores,
                timing,
                final_train,
                final_eval,
            });
        }

        // Raw copies in the same process: the same size sequences, and the
        // link's peak.
        let largest = rows
            .iter()
            .flat_map(|r| r.timing.copies.iter().map(|c| c.1))
            .max()
            .unwrap_or(0)
            .max(64 * MIB as u64);
        let mut raw = Raw::new(&ctx, usize::try_from(largest)?)?;
        let peak_out = raw.peak(Dir::Out, 64 * MIB as u64)?;
        let peak_in = raw.peak(Dir::In, 64 * MIB as u64)?;

        let fits = rows.first().map_or(f64::NAN, |r| r.steps_per_s);
        println!(
            "spill bench: {device}; train_mlp loop (--data-pool), {steps} steps per run, batches 16..4096, median of {reps} runs"
        );
        println!(
            "raw page-locked copies, 64 MiB: device->host {peak_out:.1} GB/s, host->device {peak_in:.1} GB/s"
        );
        println!();
        println!(
            "| arena | capacity / peak | steps/s | vs fits | steps/s, copies timed | evictions | restores | spilled + restored | copy time | copy time / loop | achieved GB/s | raw same copies GB/s | achieved / raw same | achieved / raw 64 MiB | final train loss | final eval loss |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for r in &rows {
            let t = &r.timing;
            let bytes = t.bytes(Dir::Out) + t.bytes(Dir::In);
            let ms = t.out_ms + t.in_ms;
            let (rep_out, rep_in) = raw.replay(&t.copies)?;
            let achieved = gbps(bytes, ms);
            let same = gbps(bytes, rep_out + rep_in);
            // The link's peak for this mix of directions.
            let peak_mix = gbps(
                bytes,
                t.bytes(Dir::Out) as f64 / (peak_out * 1e6)
                    + t.bytes(Dir::In) as f64 / (peak_in * 1e6),
            );
            let loop_ms = 1e3 * steps as f64 / r.timed_steps_per_s;
            println!(
                "| {} | {:.3} | {:.0} | {:.2} | {:.0} | {} | {} | {} | {:.1} ms | {:.1} % | {:.1} | {:.1} | {:.2} | {:.2} | {:.6} | {:.6} |",
                r.label,
                r.capacity_over_peak,
                r.steps_per_s,
                r.steps_per_s / fits,
                r.timed_steps_per_s,
                r.evictions,
                r.restores,
                fmt_bytes(bytes),
                ms,
                100.0 * ms / loop_ms,
                achieved,
                same,
                achieved / same,
                achieved / peak_mix,
                r.final_train,
                r.final_eval
            );
            if r.ratio.is_none() && bytes > 0 {
                return Err("the run that fits spilled".into());
            }
        }
        let same_losses = rows.windows(2).all(|w| {
            w[0].final_train.to_bits() == w[1].final_train.to_bits()
                && w[0].final_eval.to_bits() == w[1].final_eval.to_bits()
        });
        println!();
        println!(
            "final losses at every oversubscription: {}",
            if same_losses {
                "bit-identical"
            } else {
                "DIFFERENT"
            }
        );
        let sizes: Vec<u64> = rows
            .last()
            .map(|r| r.timing.copies.iter().map(|c| c.1).collect())
            .unwrap_or_default();
        if !sizes.is_empty() {
            let mut sorted = sizes.clone();
            sorted.sort_unstable();
            println!(
                "copy sizes at 2.0x: {} copies, median {}, mean {}, largest {}",
                sorted.len(),
                fmt_bytes(sorted[sorted.len() / 2]),
                fmt_bytes(sorted.iter().sum::<u64>() / sorted.len() as u64),
                fmt_bytes(sorted[sorted.len() - 1])
            );
        }
        if !same_losses {
            return Err("oversubscription changed the losses".into());
        }
        Ok(())
    }
}
