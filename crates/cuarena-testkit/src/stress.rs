//! The multi-thread stress harness: threads launching on their tensors
//! under a [`SharedArena`]'s shared lock while another thread allocates,
//! drops and compacts, with a watchdog that turns a deadlock into a
//! failure. The core's shared-arena tests and the tensor crate's thread
//! tests run their own tensors and launches through it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use cuarena::backend::Backend;
use cuarena::SharedArena;

/// Runs `f` on a thread of its own and returns what it returns; panics
/// naming `what` when it has not finished within 60 s (a deadlock, not a
/// hang of the test run).
pub fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what}: did not finish (deadlocked?)"))
}

/// Compactions the arena has run, targeted and full.
pub fn compactions<B: Backend>(arena: &SharedArena<B>) -> u64 {
    let st = arena.stats();
    st.targeted_compactions + st.full_compactions
}

/// A launch: on the arena, with the thread's state, on one tensor.
pub type Launch<B, S, T> = Arc<dyn Fn(&SharedArena<B>, &S, &T) + Send + Sync>;

/// What [`launches_while_compacting`] runs: how each launcher thread
/// prepares (`setup`: a stream, say) and launches on one of its tensors
/// (`launch`: use its bytes under the shared lock, check them), and how
/// the compactor allocates (`alloc`: a tensor of that many bytes, `None`
/// when the arena is out of memory; any other error panics).
pub struct Launches<B: Backend, T, S, D> {
    /// Per launcher thread, once.
    pub setup: fn(&SharedArena<B>) -> S,
    /// One launch on one of the thread's tensors.
    pub launch: Launch<B, S, T>,
    /// The compactor's allocation of a block of about that many bytes.
    pub alloc: fn(&SharedArena<B>, u64) -> Option<D>,
    /// Launches per thread at least.
    pub rounds: usize,
    /// And on until the compactor has run this many compactions since the
    /// launches began.
    pub compactions: u64,
}

/// One launcher thread per entry of `owned`, each launching round-robin on
/// its tensors, while a compactor thread allocates blocks of 512 B to
/// 12 KiB, drops some to leave holes, and compacts every fourth round
/// (under the exclusive lock). First, proof that the lock is shared: all
/// launcher threads inside `with` at once (a barrier there; an exclusive
/// lock would leave it waiting). Panics ("weak test") unless blocks moved
/// and compactions ran while the launches did. Returns every thread's
/// tensors, for the caller to check their bytes.
pub fn launches_while_compacting<B, T, S, D>(
    arena: &SharedArena<B>,
    owned: Vec<Vec<T>>,
    run: Launches<B, T, S, D>,
) -> Vec<Vec<T>>
where
    B: Backend + Send + Sync + 'static,
    T: Send + 'static,
    S: 'static,
    D: Send + 'static,
{
    let threads = owned.len();
    let barrier = Arc::new(Barrier::new(threads));
    let together: Vec<_> = (0..threads)
        .map(|_| {
            let (arena, barrier) = (arena.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || arena.with(|_| barrier.wait()).map(drop))
        })
        .collect();
    finishes("all threads inside `with` at once", move || {
        for t in together {
            t.join().expect("thread").expect("with");
        }
    });
    let before = arena.stats();
    let compactions_before = compactions(arena);
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = {
        let (arena, stop, alloc) = (arena.clone(), Arc::clone(&stop), run.alloc);
        std::thread::spawn(move || {
            let mut mine = Vec::new();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) || k < 100 {
                k += 1;
                match alloc(&arena, 512 + (k * 7919) % (12 << 10)) {
                    Some(d) => mine.push(d),
                    None => mine.clear(),
                }
                if mine.len() > 5 {
                    mine.remove((k % 5) as usize); // holes
                }
                if k % 4 == 0 {
                    arena
                        .with_mut(|a| a.compact().map(drop))
                        .expect("lock")
                        .expect("compact");
                }
                std::thread::yield_now();
            }
        })
    };
    let launchers: Vec<_> = owned
        .into_iter()
        .map(|mine| {
            let arena = arena.clone();
            let (setup, launch) = (run.setup, Arc::clone(&run.launch));
            let (rounds, wanted) = (run.rounds, run.compactions);
            std::thread::spawn(move || {
                let state = setup(&arena);
                let mut round = 0;
                while round < rounds || compactions(&arena) - compactions_before < wanted {
                    launch(&arena, &state, &mine[round % mine.len()]);
                    round += 1;
                }
                mine
            })
        })
        .collect();
    let survivors = launchers
        .into_iter()
        .map(|l| l.join().expect("launcher"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    compactor.join().expect("compactor");
    let st = arena.stats();
    assert!(
        st.moves > before.moves && compactions(arena) > compactions_before,
        "weak test: nothing moved {st:?}"
    );
    survivors
}
