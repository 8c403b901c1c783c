//! Tensors across threads: drops on other threads free the blocks; threads
//! filling the arena to the brim while it compacts, every byte checked; and
//! threads "launching" on their tensors under the shared lock at once while
//! another allocates and compacts.

use std::sync::Arc;

use cuarena::backend::{Backend, HostBackend};
use cuarena::{DType, SharedArena};
use cuarena_tensor::{Error, Tensor};

use crate::support::{host_arena, Dense, Rng};
use cuarena_testkit::stress::{finishes, launches_while_compacting, Launches};

/// What the thread tests need of a backend.
pub trait ThreadBackend: Backend + Send + Sync + 'static {}
impl<B: Backend + Send + Sync + 'static> ThreadBackend for B {}

fn send_sync<T: Send + Sync>() {}

#[test]
fn tensors_are_send_and_sync() {
    send_sync::<Tensor<HostBackend>>();
    #[cfg(feature = "cuda")]
    send_sync::<Tensor<cuarena::backend::cuda::CudaBackend>>();
}

#[test]
fn tensor_calls_inside_the_arenas_own_closure_are_errors_not_hangs() {
    let arena = host_arena(1 << 16);
    let t = Tensor::from_slice(&arena, &[1u32, 2, 3], &[3]).expect("t");
    let (inner, t2) = (arena.clone(), t.clone());
    let (read, alloc) = finishes("tensor calls inside `with`", move || {
        inner
            .with(|a| {
                // The closure's arena works; the tensor's calls would wait
                // on this thread's own lock, and say so instead.
                assert_eq!(a.read::<u32>(&t2).expect("read"), [1, 2, 3]);
                let read = t2.to_vec::<u32>();
                let alloc = Tensor::zeros(&inner, DType::U8, &[4]).map(drop);
                drop(t2); // a drop never takes the lock
                (read, alloc)
            })
            .expect("with")
    });
    for r in [read.map(drop), alloc] {
        match r {
            Err(Error::Arena(cuarena::Error::Reentrant { arena: id, .. })) => {
                assert_eq!(id, arena.id());
            }
            other => panic!("expected Reentrant, got {other:?}"),
        }
    }
    assert_eq!(t.to_vec::<u32>().expect("after the closure"), [1, 2, 3]);
}

/// Tensors dropped on other threads: blocks stay while a view lives, go to
/// the reclaim queue without touching the lock, and are freed (`Stats`
/// says so) at the next allocation.
pub fn drops_on_other_threads_free_the_blocks<B: ThreadBackend>(arena: &SharedArena<B>) {
    let base = arena.stats();
    let tensors: Vec<Tensor<B>> = (0..16)
        .map(|i| Tensor::from_slice(arena, &vec![i as u32; 100 + i], &[100 + i]).expect("t"))
        .collect();
    assert_eq!(arena.stats().live_blocks - base.live_blocks, 16);
    let views: Vec<Tensor<B>> = tensors
        .iter()
        .map(|t| t.narrow(0, 1, 50).expect("view"))
        .collect();
    // The bases drop on another thread; the views keep every block alive.
    std::thread::spawn(move || drop(tensors))
        .join()
        .expect("drop thread");
    assert_eq!(
        arena.reclaim().expect("reclaim"),
        0,
        "views hold the storage"
    );
    assert_eq!(views[3].to_vec::<u32>().expect("read"), vec![3; 50]);
    // The views drop on four threads while this one holds the shared lock:
    // a drop never waits for the arena.
    let mut groups: Vec<Vec<Tensor<B>>> = (0..4).map(|_| Vec::new()).collect();
    for (i, v) in views.into_iter().enumerate() {
        groups[i % 4].push(v);
    }
    let dropped = arena.clone();
    finishes("drops under the shared lock", move || {
        dropped
            .with(move |_| {
                let threads: Vec<_> = groups
                    .into_iter()
                    .map(|g| std::thread::spawn(move || drop(g)))
                    .collect();
                for t in threads {
                    t.join().expect("drop thread");
                }
            })
            .expect("with");
    });
    // Queued, not freed yet; the next allocation frees them first.
    assert_eq!(arena.stats().live_blocks - base.live_blocks, 16);
    let one = Tensor::zeros(arena, DType::U8, &[1]).expect("one");
    let st = arena.stats();
    assert_eq!(st.live_blocks - base.live_blocks, 1);
    assert_eq!(st.frees - base.frees, 16);
    std::thread::spawn(move || drop(one)).join().expect("drop");
    assert_eq!(arena.reclaim().expect("reclaim"), 1);
    assert_eq!(arena.stats().live_blocks, base.live_blocks);
}

#[test]
fn drops_on_other_threads_free_the_blocks_on_the_host() {
    drops_on_other_threads_free_the_blocks(&host_arena(1 << 20));
}

/// Bytes a tensor of `bytes` reserves at the default alignment.
fn reserved(bytes: u64) -> u64 {
    const ALIGN: u64 = 256; // `ArenaConfig`'s default
    bytes.div_ceil(ALIGN) * ALIGN
}

fn pattern(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| rng.next() as u32).collect()
}

/// `threads` threads each keep their share of the arena nearly full
/// (together ~100% of it) with tensors of random shapes, dropping random
/// ones to make room: no allocation may fail, the arena must compact, and
/// every tensor (and a transposed view of it) reads back exactly.
pub fn fragmentation_at_full_fill<B: ThreadBackend>(
    arena: &SharedArena<B>,
    threads: usize,
    iters: usize,
    seed: u64,
) {
    let st0 = arena.stats();
    assert_eq!(st0.live_blocks, 0, "needs an empty arena");
    let cap = st0.capacity_bytes;
    let budget = cap / threads as u64 / 256 * 256;
    let max_bytes = (budget / 16).max(256) as usize;
    let workers: Vec<_> = (0..threads)
        .map(|w| {
            let arena = arena.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed * 1000 + w as u64);
                let mut mine: Vec<(Tensor<B>, Vec<u32>)> = Vec::new();
                let mut used = 0u64;
                let check = |t: &Tensor<B>, want: &[u32], what: &str| {
                    assert!(
                        t.to_vec::<u32>().expect("read") == want,
                        "{what}: bytes differ"
                    );
                };
                for i in 0..iters {
                    let rows = rng.index_range(1, 8);
                    let cols = rng.index_range(1, (max_bytes / 4 / rows).max(1));
                    let need = reserved((rows * cols * 4) as u64);
                    while used + need > budget {
                        let (t, want) = mine.swap_remove(rng.index(mine.len()));
                        check(&t, &want, "before its drop");
                        used -= reserved(t.size_bytes());
                    }
                    let data = pattern(seed ^ ((w as u64) << 32) ^ i as u64, rows * cols);
                    let t = Tensor::from_slice(&arena, &data, &[rows, cols])
                        .unwrap_or_else(|e| panic!("thread {w} alloc {i} at full fill: {e}"));
                    used += need;
                    check(&t, &data, "new");
                    if i % 8 == 0 {
                        let (s, want) = match mine.get(rng.index(mine.len().max(1))) {
                            Some((s, want)) => (s, want),
                            None => (&t, &data),
                        };
                        let d = Dense {
                            shape: s.shape().to_vec(),
                            data: want.to_vec(),
                        };
                        check(
                            &s.transpose(0, 1).expect("t"),
                            &d.transpose(0, 1).data,
                            "view",
                        );
                    }
                    mine.push((t, data));
                }
                for (t, want) in &mine {
                    check(t, want, "survivor");
                }
                mine
            })
        })
        .collect();
    let survivors: Vec<(Tensor<B>, Vec<u32>)> = workers
        .into_iter()
        .flat_map(|w| w.join().expect("worker"))
        .collect();
    let st = arena.stats();
    println!(
        "{threads} threads at full fill: peak {:.1}% of capacity, {} targeted + {} full compactions, {} moves",
        100.0 * st.peak_allocated_bytes as f64 / cap as f64,
        st.targeted_compactions,
        st.full_compactions,
        st.moves
    );
    assert_eq!(st.failed_allocs, 0, "an allocation failed: {st:?}");
    assert!(
        st.targeted_compactions + st.full_compactions > 0,
        "no compaction: weak test {st:?}"
    );
    assert!(
        st.peak_allocated_bytes * 100 >= cap * 95,
        "the arena never got full: {st:?}"
    );
    for (t, want) in &survivors {
        assert!(
            t.to_vec::<u32>().expect("read") == *want,
            "a survivor changed"
        );
    }
    drop(survivors);
    arena.reclaim().expect("reclaim");
    assert_eq!(arena.stats().live_blocks, 0);
}

#[test]
fn six_threads_at_full_fill_on_the_host() {
    fragmentation_at_full_fill(&host_arena(4 << 20), 6, 400, 1);
}

/// A "launch" on any backend: under the shared lock, read the tensor's
/// span, walk its elements with its strides, and check that nothing moved
/// meanwhile (the statistics only change under the exclusive lock).
pub fn host_launch<B: Backend>(arena: &SharedArena<B>, _: &(), t: &Tensor<B>, want: &[u32]) {
    arena
        .with(|a| {
            let moves = arena.stats().moves;
            let span = a.read_bytes(t).expect("read");
            let words: Vec<u32> = span
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            let got: Vec<u32> = t.layout().offsets().map(|o| words[o]).collect();
            assert!(got == want, "a launch saw the wrong elements");
            assert_eq!(a.read::<u32>(t).expect("typed read"), words);
            assert_eq!(arena.stats().moves, moves, "a block moved under a launch");
        })
        .expect("with");
}

/// A thread's tensors (views among them) and the elements they must hold.
type Owned<B> = Vec<(Tensor<B>, Vec<u32>)>;

/// Tensors for `threads` threads, with freed gaps between them so that
/// compaction moves them.
fn launch_tensors<B: ThreadBackend>(arena: &SharedArena<B>, threads: usize) -> Vec<Owned<B>> {
    let mut gaps = Vec::new();
    let owned = (0..threads)
        .map(|t| {
            (0..4)
                .map(|k| {
                    gaps.push(Tensor::empty(arena, DType::U8, &[3000]).expect("gap"));
                    let (rows, cols) = (3 + (t + k) % 5, 17 + 13 * k);
                    let d = Dense::iota(&[rows, cols], (t as u32) << 20 | (k as u32) << 16);
                    let base = Tensor::from_slice(arena, &d.data, &[rows, cols]).expect("tensor");
                    match k {
                        0 => (base, d.data),
                        1 => (base.transpose(0, 1).expect("t"), d.transpose(0, 1).data),
                        2 => (
                            base.narrow(1, 3, 9).expect("narrow"),
                            d.narrow(1, 3, 9).data,
                        ),
                        _ => (
                            base.narrow(0, 1, 2).expect("n").transpose(0, 1).expect("t"),
                            d.narrow(0, 1, 2).transpose(0, 1).data,
                        ),
                    }
                })
                .collect()
        })
        .collect();
    drop(gaps);
    owned
}

/// `threads` threads launch on their tensors under the shared lock (all at
/// once: a barrier inside `with` proves it), while another thread
/// allocates tensors, drops some, and compacts; every element checked in
/// every launch and after (the test kit's stress harness). `launch` is the
/// backend's launch, with what `setup` made for its thread (a stream, say).
pub fn concurrent_launches<B: ThreadBackend, S: 'static>(
    arena: &SharedArena<B>,
    threads: usize,
    setup: fn(&SharedArena<B>) -> S,
    launch: fn(&SharedArena<B>, &S, &Tensor<B>, &[u32]),
) {
    let owned = launch_tensors(arena, threads);
    let survivors = launches_while_compacting(
        arena,
        owned,
        Launches {
            setup,
            launch: Arc::new(move |arena, state, (t, want): &(Tensor<B>, Vec<u32>)| {
                launch(arena, state, t, want)
            }),
            alloc: |arena, n| match Tensor::zeros(arena, DType::U8, &[n as usize]) {
                Ok(t) => Some(t),
                Err(Error::Arena(cuarena::Error::OutOfMemory { .. })) => None,
                Err(e) => panic!("compactor: {e}"),
            },
            // 300 launches, and on until 10 compactions ran among them.
            rounds: 300,
            compactions: 10,
        },
    );
    for (t, want) in survivors.iter().flatten() {
        assert!(
            t.to_vec::<u32>().expect("read") == *want,
            "a tensor changed"
        );
    }
}

#[test]
fn eight_threads_launch_while_another_compacts_on_the_host() {
    concurrent_launches(&host_arena(512 << 10), 8, |_| (), host_launch);
}
