//! One tenant of the two-tenant experiment (`scripts/two-tenants.sh` runs
//! the pair and its PyTorch twin, `scripts/two_tenants.py`).
//!
//! `cargo build --release --example two_tenants`; `--help` says what it
//! does. Without a CUDA GPU it prints why and exits with status 0.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cuarena::backend::cuda::CudaBackend;
use cuarena::{fmt_bytes, Arena, ArenaConfig, DType, Error, Storage};

const HELP: &str = "\
two_tenants: one tenant of the two-tenant experiment (scripts/two-tenants.sh)

usage: two_tenants --name NAME --mode elastic|fixed --peak-bytes N --turns DIR
                   [--phases 3] [--rounds 4] [--hold-ms 1500] [--seed 0]

Creates a cuarena arena on GPU 0: elastic (nothing mapped until needed) or
fixed (--peak-bytes mapped at creation), then writes DIR/ready.NAME. For each
phase i it waits for DIR/go.NAME.i, allocates u32 tensors of varied sizes
(1 MiB to 1 GiB, the same sizes as the PyTorch tenant) up to --peak-bytes,
fills them, frees about a third and refills to the peak --rounds times,
keeps filling every tensor until --hold-ms has passed, checks the ends of
every tensor, frees everything, trims (elastic: gives every mapped chunk
back) and writes DIR/done.NAME.i. A failure writes DIR/failed.NAME.

exit status: 0 when every phase completed (or no GPU: skipped), 1 on a
failure, 2 on a bad command line";

/// What the command line asks for.
struct Args {
    name: String,
    elastic: bool,
    peak_bytes: u64,
    turns: PathBuf,
    phases: u32,
    rounds: u32,
    hold: Duration,
    seed: u64,
}

fn parse() -> Result<Option<Args>, String> {
    let mut name = None;
    let mut mode = None;
    let mut peak_bytes = None;
    let mut turns = None;
    let (mut phases, mut rounds, mut hold_ms, mut seed) = (3u32, 4u32, 1500u64, 0u64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--name" => name = Some(value),
            "--mode" => mode = Some(value),
            "--peak-bytes" => peak_bytes = Some(num(&value)?),
            "--turns" => turns = Some(PathBuf::from(value)),
            "--phases" => phases = num(&value)? as u32,
            "--rounds" => rounds = num(&value)? as u32,
            "--hold-ms" => hold_ms = num(&value)?,
            "--seed" => seed = num(&value)?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    let elastic = match mode.as_deref() {
        Some("elastic") => true,
        Some("fixed") => false,
        _ => return Err("--mode elastic or --mode fixed is required".into()),
    };
    Ok(Some(Args {
        name: name.ok_or("--name is required")?,
        elastic,
        peak_bytes: peak_bytes.ok_or("--peak-bytes is required")?,
        turns: turns.ok_or("--turns is required")?,
        phases,
        rounds,
        hold: Duration::from_millis(hold_ms),
        seed,
    }))
}

/// splitmix64: the same sequence as `scripts/two_tenants.py`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A tensor's bytes: half small (1–64 MiB), half large (64 MiB–1 GiB),
    /// not a whole number of MiB, a multiple of 4 (u32 elements).
    fn tensor_bytes(&mut self) -> u64 {
        let r = self.next();
        let mib = if r & 1 == 1 {
            1 + (r >> 1) % 64
        } else {
            64 + (r >> 1) % 961
        };
        (mib << 20) - ((r >> 40) % 4096) * 4
    }
}

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Waits for `path` (polled every 2 ms) for at most 10 minutes.
fn wait_for(path: &Path) -> Result<(), String> {
    let t0 = Instant::now();
    while !path.exists() {
        if t0.elapsed() > Duration::from_secs(600) {
            return Err(format!("no turn: {} never appeared", path.display()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn touch(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("two_tenants: cannot write {}: {e}", path.display());
    }
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("two_tenants: {e} (see --help)");
            return ExitCode::from(2);
        }
    };
    if let Err(reason) = CudaBackend::available() {
        println!("two_tenants: skipped: no CUDA GPU ({reason})");
        return ExitCode::SUCCESS;
    }
    let mode = if args.elastic { "elastic" } else { "fixed" };
    let config = if args.elastic {
        ArenaConfig::elastic()
    } else {
        ArenaConfig::new(args.peak_bytes.next_multiple_of(2 << 20))
    };
    let t0 = Instant::now();
    let mut arena = match Arena::cuda(config, 0) {
        Ok(a) => a,
        Err(e) => {
            let line = format!(
                "FAILED create {mode} arena: {e} (out of memory: {})",
                e.is_out_of_memory()
            );
            println!("{} {line}", args.name);
            touch(&args.turns.join(format!("failed.{}", args.name)), &line);
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{} pid {}: {mode} arena on {} in {:.2} s, {} mapped",
        args.name,
        std::process::id(),
        arena.backend().device_name(),
        t0.elapsed().as_secs_f64(),
        fmt_bytes(arena.stats().capacity_bytes)
    );
    touch(
        &args.turns.join(format!("ready.{}", args.name)),
        &std::process::id().to_string(),
    );
    let mut done = 0;
    for phase in 0..args.phases {
        let go = args.turns.join(format!("go.{}.{phase}", args.name));
        let r = wait_for(&go).and_then(|()| match run_phase(&mut arena, &args, phase) {
            Ok(0) => Ok(()),
            Ok(bad) => Err(format!("{bad} words of live tensors lost their pattern")),
            Err(e) => Err(format!("{e} (out of memory: {})", e.is_out_of_memory())),
        });
        if let Err(e) = r {
            let line = format!("FAILED phase {phase}: {e}");
            println!("{} {line}", args.name);
            touch(&args.turns.join(format!("failed.{}", args.name)), &line);
            break;
        }
        done += 1;
        touch(&args.turns.join(format!("done.{}.{phase}", args.name)), "");
    }
    let s = arena.stats();
    println!(
        "RESULT tenant={} mode={mode} phases={done}/{} peak_mapped_bytes={} peak_live_bytes={} \
         bytes_moved={} compactions={} trims={}",
        args.name,
        args.phases,
        if args.elastic {
            s.peak_mapped_bytes
        } else {
            s.capacity_bytes
        },
        s.peak_allocated_bytes,
        s.bytes_moved,
        s.full_compactions + s.targeted_compactions,
        s.trims
    );
    if done == args.phases {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One phase: fill to the peak, churn, hold, check, free, trim. Returns
/// the words of live tensors that did not hold their pattern.
fn run_phase(arena: &mut Arena<CudaBackend>, args: &Args, phase: u32) -> Result<usize, Error> {
    let started = Instant::now();
    println!("EVENT t={:.3} {} phase {phase} start", unix_s(), args.name);
    let mut rng = Rng(args.seed ^ (u64::from(phase) << 32));
    let mut live: Vec<(Storage, u32)> = Vec::new();
    let mut next_id = 1u32;
    let mut refill = |arena: &mut Arena<CudaBackend>, live: &mut Vec<(Storage, u32)>| {
        let mut held: u64 = live.iter().map(|(s, _)| s.len_bytes()).sum();
        loop {
            let bytes = rng.tensor_bytes();
            if held + bytes > args.peak_bytes {
                return Ok::<(), Error>(());
            }
            let s = arena.alloc_storage_dtype(DType::U32, bytes / 4)?;
            let pattern = 0x5EED_0000 ^ next_id;
            arena.fill(&s, pattern)?;
            live.push((s, pattern));
            next_id += 1;
            held += bytes;
        }
    };
    refill(arena, &mut live)?;
    let mut churn = Rng(args.seed ^ 0xC4 ^ u64::from(phase));
    for _ in 0..args.rounds {
        live.retain(|_| churn.next() % 3 != 0);
        arena.reclaim()?;
        refill(arena, &mut live)?;
        arena.synchronize()?;
    }
    let peak = arena.stats();
    let mut passes = 0;
    while started.elapsed() < args.hold || passes == 0 {
        for (s, pattern) in &live {
            arena.fill(s, *pattern)?;
        }
        arena.synchronize()?;
        passes += 1;
    }
    // The first and last 256 elements of every tensor hold its pattern
    // (compactions moved some of them).
    let mut bad = 0;
    for (s, pattern) in &live {
        let n = s.numel();
        for range in [0..n.min(256), n.saturating_sub(256)..n] {
            let got = arena.read::<u32>(s.slice(range)?)?;
            bad += got.iter().filter(|&&v| v != *pattern).count();
        }
    }
    let tensors = live.len();
    live.clear();
    arena.reclaim()?;
    let before_trim = arena.stats().capacity_bytes;
    let given_back = arena.trim()?;
    arena.synchronize()?;
    let after = arena.stats();
    println!(
        "{} phase {phase}: {tensors} tensors, {} live at the end, {} mapped at the peak, \
         {passes} fill passes, {} moved so far, {bad} wrong words; trim gave back {} \
         ({} mapped before, {} after) in {:.2} s",
        args.name,
        fmt_bytes(peak.allocated_bytes),
        fmt_bytes(peak.capacity_bytes),
        fmt_bytes(after.bytes_moved),
        fmt_bytes(given_back),
        fmt_bytes(before_trim),
        fmt_bytes(after.capacity_bytes),
        started.elapsed().as_secs_f64()
    );
    println!("EVENT t={:.3} {} phase {phase} end", unix_s(), args.name);
    Ok(bad)
}
