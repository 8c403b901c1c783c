//! GPU tests of spilling: the CUDA backend's page-locked host tier.
//!
//! - Model-based random programs (`crate::spill::run_spill_program`) on CUDA
//!   arenas with working sets up to three times the region, every tensor's
//!   bytes checked against the model; each program is then replayed on a
//!   host arena of the same configuration, and both must have made exactly
//!   the same decisions (evictions, restores, compactions, bytes).
//! - Real transfers: a block evicted to the host tier has its device bytes
//!   overwritten by another block, and comes back intact, through the
//!   arena and through a cudarc view; the stats count every copy.
//!
//! Every test prints `skipped: <reason>` and passes when no GPU is usable
//! (CI has none). Environment: `CUARENA_GPU_SPILL_PROGRAMS` (default 400,
//! or `CUARENA_GPU_PROGRAMS` when that is smaller, as under the sanitizers),
//! `CUARENA_GPU_THREADS` (default 8 here: most of the time is the host's,
//! generating and comparing bytes and replaying on the host model).

use cuarena::backend::cuda::cudarc::driver::CudaContext;
use cuarena::backend::{Backend, HostBackend};
use cuarena::StreamId;
use cuarena::{Arena, ArenaConfig, Error, Handle, Stats};
use cuarena_testkit::env_u64;
use cuarena_testkit::gpu_available;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The configuration of program `seed`: region sizes from 64 KiB to 2 MiB,
/// mostly 256 B alignment (some at 1, 4 and 16 B, for unaligned copies),
/// and a host tier of four or six times the region. (Less is not enough for
/// the program's final read-back: bringing a block back needs room in the
/// tier for the blocks it displaces before its own tier space is free.)
fn program_config(seed: u64) -> ArenaConfig {
    let cap = [64 * KIB, 256 * KIB, MIB, 2 * MIB][(seed % 4) as usize];
    let align = [256u64, 256, 1, 4, 16][(seed % 5) as usize];
    let tier = if seed % 3 == 2 { 6 * cap } else { 4 * cap };
    ArenaConfig::new(cap)
        .with_alignment_bytes(align)
        .with_spill_host_bytes(tier)
}

/// The decisions of a run: everything that depends on the arena's policy,
/// nothing that depends on the backend's timing.
fn decisions(s: &Stats) -> [u64; 10] {
    [
        s.evictions,
        s.restores,
        s.bytes_evicted,
        s.bytes_restored,
        s.targeted_compactions,
        s.full_compactions,
        s.moves,
        s.bytes_moved,
        s.failed_allocs,
        s.host_tier_used_bytes,
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn gpu_spill_programs_keep_every_byte_and_match_the_host_model() {
    if !gpu_available() {
        return;
    }
    let programs = env_u64("CUARENA_GPU_SPILL_PROGRAMS")
        .unwrap_or_else(|| env_u64("CUARENA_GPU_PROGRAMS").map_or(400, |p| p.min(400)));
    let threads = env_u64("CUARENA_GPU_THREADS").unwrap_or(8).max(1);
    let steps = 300;
    // Keep the primary context alive between programs.
    let _context = CudaContext::new(0).expect("context");
    let t0 = std::time::Instant::now();
    let totals = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut sum = [0u64; 10];
                    for seed in (t..programs).step_by(threads as usize) {
                        let config = program_config(seed);
                        let mut a = Arena::cuda(config.clone(), 0).expect("CUDA arena with a host tier");
                        let gpu = crate::spill::run_spill_program(&mut a, seed, steps);
                        a.synchronize().expect("no kernel error");
                        let backend = HostBackend::new(config.capacity_bytes)
                            .expect("host backend")
                            .with_seed(seed);
                        let mut h = Arena::with_backend(config.clone(), backend).expect("host arena");
                        let host = crate::spill::run_spill_program(&mut h, seed, steps);
                        assert_eq!(
                            decisions(&gpu),
                            decisions(&host),
                            "program {seed} ({config:?}): the CUDA arena decided differently from the host model"
                        );
                        for (s, d) in sum.iter_mut().zip(decisions(&gpu)) {
                            *s += d;
                        }
                    }
                    sum
                })
            })
            .collect();
        let mut sum = [0u64; 10];
        for w in workers {
            for (s, d) in sum.iter_mut().zip(w.join().expect("a program failed")) {
                *s += d;
            }
        }
        sum
    });
    println!(
        "{programs} spill programs of {steps} steps on CUDA (and on the host model) in {:.1?}: \
         {} evictions ({:.1} MiB), {} restores ({:.1} MiB), {} compactions",
        t0.elapsed(),
        totals[0],
        totals[2] as f64 / MIB as f64,
        totals[1],
        totals[3] as f64 / MIB as f64,
        totals[4] + totals[5],
    );
    assert!(
        totals[0] >= 10 * programs && totals[1] >= 10 * programs,
        "too little spilling to test anything: {} evictions, {} restores",
        totals[0],
        totals[1]
    );
}

fn pattern(seed: u8, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
        .collect()
}

/// A block evicted to the host tier has its device bytes overwritten by
/// another block and comes back intact; the stats count every copy.
/// `via_view` reads a resident block without the arena's own transfers
/// (a cudarc view on CUDA).
fn evict_overwrite_restore<B: Backend>(
    a: &mut Arena<B>,
    size: u64,
    via_view: impl Fn(&mut Arena<B>, Handle) -> Option<Vec<u8>>,
) {
    let (px, py) = (pattern(7, size), pattern(200, size));
    let x = a.alloc(size).expect("x");
    a.write(x, &px).expect("write x");
    let x_info = a.info(x).expect("info");
    let (x_lo, x_hi) = (x_info.offset, x_info.offset + size);
    assert_eq!(a.stats().evictions, 0);

    // y does not fit beside x: x goes to the host tier.
    let y = a.alloc(size).expect("y (spilling x)");
    let st = a.stats();
    assert_eq!((st.evictions, st.bytes_evicted, st.restores), (1, size, 0));
    assert_eq!(st.host_tier_used_bytes, x_info.reserved_bytes);
    assert!(!a.info(x).expect("info").resident);
    assert_eq!(a.resolve(x), Err(Error::NotResident));
    assert!(via_view(a, x).is_none(), "a view of a spilled block");

    // y takes x's old place and overwrites its device bytes.
    let y_lo = a.info(y).expect("info").offset;
    assert!(
        y_lo < x_hi && x_lo < y_lo + size,
        "y should reuse x's old bytes"
    );
    a.write(y, &py).expect("write y");
    assert!(a.read::<u8>(y).expect("read y") == py);
    assert_eq!(a.stats().evictions, 1, "y was resident: no copy");

    // x comes back: y goes out, and x's bytes can only come from the host.
    a.make_resident(&[x]).expect("x back");
    let st = a.stats();
    assert_eq!(
        (
            st.evictions,
            st.bytes_evicted,
            st.restores,
            st.bytes_restored
        ),
        (2, 2 * size, 1, size)
    );
    assert_eq!(
        st.host_tier_used_bytes,
        a.info(y).expect("info").reserved_bytes
    );
    assert!(a.info(x).expect("info").resident && !a.info(y).expect("info").resident);
    // Without the arena's transfers (a cudarc view on CUDA)...
    if let Some(v) = via_view(a, x) {
        assert!(v == px, "x lost its bytes on the way out and back (view)");
    }
    // ...and through the arena (x back, sending y out, then y back).
    a.make_resident(&[x]).expect("x back");
    assert!(
        a.read::<u8>(x).expect("read x") == px,
        "x lost its bytes on the way out and back"
    );
    a.make_resident(&[y]).expect("y back");
    assert!(a.read::<u8>(y).expect("read y") == py);
    let st = a.stats();
    assert_eq!((st.evictions, st.restores), (3, 2));
    assert_eq!((st.bytes_evicted, st.bytes_restored), (3 * size, 2 * size));
    a.make_resident(&[x]).expect("x back");
    assert!(a.read::<u8>(x).expect("read x") == px);

    // Both at once cannot fit: nothing is lost.
    assert!(matches!(
        a.make_resident(&[x, y]),
        Err(Error::OutOfMemory { .. })
    ));
    a.free(x).expect("free x");
    a.make_resident(&[y]).expect("y");
    assert!(a.read::<u8>(y).expect("read y") == py);
    assert_eq!(a.stats().host_tier_used_bytes, 0);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn gpu_spill_evicted_bytes_leave_the_device_and_come_back_through_the_host_tier() {
    if !gpu_available() {
        return;
    }
    // Odd sizes (not a multiple of the alignment), small and large.
    for (cap, size) in [(8 * MIB, 5 * MIB + 3), (160 * MIB, 96 * MIB + 17)] {
        let config = ArenaConfig::new(cap).with_spill_host_bytes(2 * cap);
        let mut a = Arena::cuda(config, 0).expect("CUDA arena with a host tier");
        evict_overwrite_restore(&mut a, size, |a, h| {
            let stream = a.backend().stream().clone();
            let view = match a
                .kernel_args(StreamId::ARENA)
                .and_then(|mut k| k.input::<u8>(h))
            {
                Ok(v) => v,
                Err(Error::NotResident) => return None,
                Err(e) => panic!("view: {e}"),
            };
            let v = stream.clone_dtoh(&view).expect("copy the view");
            stream.synchronize().expect("sync");
            Some(v)
        });
        a.synchronize().expect("no kernel error");
    }
}

/// The same scenario on the host model (runs in CI, too).
#[test]
fn spill_scenario_of_the_gpu_test_holds_on_the_host_model() {
    let cap = 64 * KIB;
    let mut a = Arena::host(ArenaConfig::new(cap).with_spill_host_bytes(2 * cap)).expect("arena");
    evict_overwrite_restore(&mut a, 40 * KIB + 3, |_, _| None);
}
