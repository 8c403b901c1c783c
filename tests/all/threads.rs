//! Eight threads share one `SharedArena<HostBackend>`: they create, clone,
//! slice, write, read, copy, fill and drop storages, pass them to each other
//! through channels (so storages drop on threads other than the one that
//! made them), while another thread allocates and forces compactions. Each
//! worker models the bytes of the storages it holds and checks them on
//! every read; at the end every survivor is checked, and after dropping
//! them all and reclaiming, the arena holds no block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use cuarena::DType;
use cuarena::{ArenaConfig, Error, Handle, SharedArena, Storage, StorageSlice};
use cuarena_testkit::Rng;

const WORKERS: usize = 8;
const STEPS: usize = 3000;
const CAPACITY: u64 = 192 << 10;

/// A storage a worker holds, with its extra owners and the bytes it must
/// have. Typed storages hold `u32`s; untyped ones bytes.
struct Held {
    storage: Storage,
    /// Clones and slices: more owners of the same block.
    owners: Vec<Owner>,
    expected: Vec<u8>,
}

#[allow(dead_code)] // held for their ownership only
enum Owner {
    Clone(Storage),
    Slice(StorageSlice),
}

impl Held {
    fn elem(&self) -> u64 {
        if self.storage.dtype().is_some() {
            4
        } else {
            1
        }
    }
}

/// A random range of `h` in elements: `(start, end)`.
fn range(rng: &mut Rng, h: &Held) -> (u64, u64) {
    let n = h.storage.numel();
    let a = rng.below(n + 1);
    let b = rng.below(n + 1);
    (a.min(b), a.max(b))
}

fn write(arena: &SharedArena, h: &mut Held, s: &StorageSlice, data: &[u8]) {
    if h.elem() == 4 {
        let words: Vec<u32> = data
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        arena.write(s, &words).expect("write_range");
    } else {
        arena.write_bytes(s, data).expect("write_bytes");
    }
    let o = s.offset_bytes() as usize;
    h.expected[o..o + data.len()].copy_from_slice(data);
}

fn check(arena: &SharedArena, h: &Held, s: &StorageSlice, what: &str) {
    let o = s.offset_bytes() as usize;
    let want = &h.expected[o..o + s.len_bytes() as usize];
    let got: Vec<u8> = if h.elem() == 4 {
        arena
            .read::<u32>(s)
            .expect("read_range")
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect()
    } else {
        arena.read_bytes(s).expect("read_bytes")
    };
    assert!(got == want, "{what}: a storage lost its bytes");
}

/// Allocates a storage of random kind and size; `None` when the arena is
/// full (the caller drops something).
fn alloc(arena: &SharedArena, rng: &mut Rng) -> Option<Held> {
    let n = match rng.below(10) {
        0 => 0,
        _ => 1 + rng.below(1024),
    };
    let (r, zeroed) = match rng.below(3) {
        0 => (arena.alloc_storage(n), false),
        1 => (arena.alloc_storage_dtype(DType::U32, n / 4), false),
        _ => (
            arena
                .alloc_storage_dtype(DType::U32, n / 4)
                .and_then(|s| arena.fill(&s, 0u32).map(|()| s)),
            true,
        ),
    };
    let storage = match r {
        Ok(s) => s,
        Err(Error::OutOfMemory { .. }) => return None,
        Err(e) => panic!("alloc: {e}"),
    };
    let len = storage.len_bytes() as usize;
    let mut h = Held {
        storage,
        owners: Vec::new(),
        expected: vec![0; len],
    };
    if !zeroed {
        let data = rng.bytes(len);
        let whole = h.storage.whole();
        write(arena, &mut h, &whole, &data);
    }
    Some(h)
}

type Msg = (Storage, Vec<u8>, Option<Storage>);

fn worker(
    id: usize,
    seed: u64,
    arena: SharedArena,
    tx: mpsc::Sender<Msg>,
    rx: mpsc::Receiver<Msg>,
) -> Vec<Held> {
    let mut rng = Rng::new(seed);
    let mut held: Vec<Held> = Vec::new();
    let take = |held: &mut Vec<Held>, rx: &mpsc::Receiver<Msg>| {
        while let Ok((storage, expected, drop_me)) = rx.try_recv() {
            // A clone sent only to be dropped here, on this thread.
            drop(drop_me);
            held.push(Held {
                storage,
                owners: Vec::new(),
                expected,
            });
        }
    };
    for step in 0..STEPS {
        let what = format!("worker {id} step {step}");
        take(&mut held, &rx);
        let n = held.len() as u64;
        match rng.below(20) {
            0..=3 => match alloc(&arena, &mut rng) {
                Some(h) => held.push(h),
                None if !held.is_empty() => {
                    held.swap_remove(0);
                }
                None => {}
            },
            4 if n > 0 => {
                let i = rng.below(n) as usize;
                let c = held[i].storage.clone();
                held[i].owners.push(Owner::Clone(c));
            }
            5..=7 if n > 0 => {
                // Write a slice (kept as an owner half the time).
                let i = rng.below(n) as usize;
                let (a, b) = range(&mut rng, &held[i]);
                let s = held[i].storage.slice(a..b).expect("slice");
                let data = rng.bytes(s.len_bytes() as usize);
                write(&arena, &mut held[i], &s, &data);
                if rng.below(2) == 0 {
                    held[i].owners.push(Owner::Slice(s));
                }
            }
            8..=10 if n > 0 => {
                let i = rng.below(n) as usize;
                let (a, b) = range(&mut rng, &held[i]);
                let s = held[i].storage.slice(a..b).expect("slice");
                check(&arena, &held[i], &s, &what);
            }
            11 if n > 0 => {
                // Copy between two storages, or within one without overlap.
                let i = rng.below(n) as usize;
                let j = rng.below(n) as usize;
                let (ei, ej) = (held[i].elem(), held[j].elem());
                let e = ei.max(ej);
                let max = held[i].storage.len_bytes().min(held[j].storage.len_bytes()) / e;
                let len = rng.below(max + 1);
                let si = rng.below(held[i].storage.len_bytes() / e - len + 1) * e;
                let dj = rng.below(held[j].storage.len_bytes() / e - len + 1) * e;
                if i == j && si < dj + len * e && dj < si + len * e && len > 0 {
                    continue;
                }
                let src = held[i]
                    .storage
                    .slice(si / ei..(si + len * e) / ei)
                    .expect("src");
                let dst = held[j]
                    .storage
                    .slice(dj / ej..(dj + len * e) / ej)
                    .expect("dst");
                arena.copy(&src, &dst).expect("copy");
                let bytes = held[i].expected[si as usize..(si + len * e) as usize].to_vec();
                held[j].expected[dj as usize..(dj + len * e) as usize].copy_from_slice(&bytes);
            }
            12 if n > 0 => {
                let i = rng.below(n) as usize;
                let (a, b) = range(&mut rng, &held[i]);
                let s = held[i].storage.slice(a..b).expect("slice");
                let o = s.offset_bytes() as usize;
                let bytes: Vec<u8> = if held[i].elem() == 4 {
                    let v = rng.next() as u32;
                    arena.fill(&s, v).expect("fill");
                    (0..s.numel()).flat_map(|_| v.to_le_bytes()).collect()
                } else {
                    let v = rng.next() as u8;
                    arena.fill(&s, v).expect("fill");
                    vec![v; s.len_bytes() as usize]
                };
                held[i].expected[o..o + bytes.len()].copy_from_slice(&bytes);
            }
            13 if n > 0 => {
                // Give a storage away: the next worker owns it now.
                let h = held.swap_remove(rng.below(n) as usize);
                let _ = tx.send((h.storage, h.expected, None));
                // `h.owners` (clones, slices) drop here, on this thread.
            }
            14 if n > 0 => {
                // Send a clone to be dropped by the next worker; keep it here.
                let i = rng.below(n) as usize;
                let c = held[i].storage.clone();
                let empty = arena.alloc_storage(0).expect("empty storage");
                let _ = tx.send((empty, Vec::new(), Some(c)));
            }
            15 if n > 0 => {
                let i = rng.below(n) as usize;
                if held[i].owners.is_empty() {
                    held.swap_remove(i);
                } else {
                    let k = rng.below(held[i].owners.len() as u64) as usize;
                    held[i].owners.swap_remove(k);
                }
            }
            16 if n > 4 => {
                held.swap_remove(rng.below(n) as usize);
            }
            17 => {
                arena.reclaim().expect("reclaim");
            }
            _ if n > 0 => {
                let i = rng.below(n) as usize;
                let s = held[i].storage.whole();
                check(&arena, &held[i], &s, &what);
            }
            _ => {}
        }
        if held.len() > 12 {
            held.swap_remove(0);
        }
    }
    // Hang up, then take what is still coming until every sender has.
    drop(tx);
    while let Ok((storage, expected, drop_me)) = rx.recv() {
        drop(drop_me);
        held.push(Held {
            storage,
            owners: Vec::new(),
            expected,
        });
    }
    for h in &held {
        check(
            &arena,
            h,
            &h.storage.whole(),
            &format!("worker {id} at the end"),
        );
    }
    held
}

/// Allocates blocks of random sizes (holes everywhere, allocations that
/// need a targeted compaction) and runs full compactions, until told to stop.
fn compactor(arena: SharedArena, stop: Arc<AtomicBool>, seed: u64) -> usize {
    let mut rng = Rng::new(seed);
    let mut mine: Vec<Handle> = Vec::new();
    let mut rounds = 0;
    while !stop.load(Ordering::Relaxed) || rounds < 200 {
        rounds += 1;
        let pick = rng.below(6);
        let size = 1 + rng.below(6 << 10);
        let victim = rng.below(mine.len().max(1) as u64) as usize;
        arena
            .with_mut(|a| {
                match pick {
                    0 | 1 => match a.alloc(size) {
                        Ok(h) => mine.push(h),
                        Err(Error::OutOfMemory { .. }) => {}
                        Err(e) => panic!("compactor alloc: {e}"),
                    },
                    2 => {
                        // As much as the free bytes allow: rarely a hole that big.
                        let free = a.stats().free_bytes;
                        if free > 1024 {
                            match a.alloc(free / 2) {
                                Ok(h) => a.free(h).expect("free"),
                                Err(Error::OutOfMemory { .. }) => {}
                                Err(e) => panic!("compactor alloc: {e}"),
                            }
                        }
                    }
                    3 | 4 if !mine.is_empty() => {
                        a.free(mine.swap_remove(victim)).expect("free");
                    }
                    _ => {
                        a.compact().expect("compact");
                    }
                }
                if mine.len() > 6 {
                    a.free(mine.swap_remove(0)).expect("free");
                }
            })
            .expect("lock");
        std::thread::yield_now();
    }
    arena
        .with_mut(|a| {
            for h in mine {
                a.free(h).expect("free");
            }
        })
        .expect("lock");
    rounds
}

#[test]
fn eight_threads_share_an_arena_and_every_byte_survives_compaction() {
    let (mut targeted, mut full, mut moves) = (0, 0, 0);
    for round in 0..4u64 {
        let st = run(round);
        targeted += st.targeted_compactions;
        full += st.full_compactions;
        moves += st.moves;
    }
    // Thread timing decides how many; over four runs there are always some
    // (the compactor alone runs at least 200 rounds, a sixth of them full
    // compactions).
    assert!(
        targeted + full > 0 && moves > 0,
        "weak test: {targeted} targeted, {full} full compactions, {moves} moves"
    );
}

/// One run: seeds `round * 100 + thread`. Returns the stats before the
/// survivors are dropped.
fn run(round: u64) -> cuarena::Stats {
    let arena = SharedArena::new(cuarena::Arena::host(ArenaConfig::new(CAPACITY)).expect("arena"));
    let stop = Arc::new(AtomicBool::new(false));
    let comp = {
        let (arena, stop) = (arena.clone(), Arc::clone(&stop));
        std::thread::spawn(move || compactor(arena, stop, round * 100 + 99))
    };
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..WORKERS).map(|_| mpsc::channel::<Msg>()).unzip();
    let mut rxs: Vec<Option<mpsc::Receiver<Msg>>> = rxs.into_iter().map(Some).collect();
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let tx = txs[(id + 1) % WORKERS].clone();
            let rx = rxs[id].take().expect("receiver");
            let arena = arena.clone();
            std::thread::spawn(move || worker(id, round * 100 + id as u64, arena, tx, rx))
        })
        .collect();
    drop(txs);
    let survivors: Vec<Vec<Held>> = workers
        .into_iter()
        .map(|w| w.join().expect("worker panicked"))
        .collect();
    stop.store(true, Ordering::Relaxed);
    let rounds = comp.join().expect("compactor panicked");
    assert!(rounds >= 200);
    // Every survivor, checked once more on this thread after everything.
    let mut live = 0;
    for h in survivors.iter().flatten() {
        check(&arena, h, &h.storage.whole(), "survivor");
        live += usize::from(h.storage.handle().is_some());
    }
    let stats = arena.stats();
    drop(survivors);
    arena.reclaim().expect("reclaim");
    let st = arena.stats();
    assert_eq!(st.live_blocks, 0, "{live} survivors: blocks leaked");
    assert_eq!(st.requested_bytes, 0);
    assert_eq!(arena.with(|a| a.stats().pending_reclaim).expect("lock"), 0);
    stats
}
