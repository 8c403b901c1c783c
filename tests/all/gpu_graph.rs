//! GPU tests of device-side handle resolution and CUDA graphs
//! (`cuarena::graph`): a graph of several kernels that read
//! and write arena tensors through handles is captured once, replayed,
//! and replayed again after compactions (full and targeted) that move
//! those tensors, with unrelated allocations, frees and uploads between
//! replays; every replay is checked against a host computation. The same
//! kernels captured with raw addresses give wrong results after one
//! compaction (the contrast). Also: a replay refuses to run after the
//! table's device buffer moved, and brings spilled handles back.
//!
//! Every test prints `skipped: <reason>` and passes when no GPU is usable.
//! Run them on the GPU machine with `all gpu_graph --test-threads=1`.

use std::sync::Arc;

use cuarena::backend::cuda::cudarc::driver::{
    CudaFunction, CudaModule, LaunchConfig, PushKernelArg,
};
use cuarena::backend::cuda::CudaBackend;
use cuarena::graph::{self, ArenaGraph};
use cuarena::DType;
use cuarena::{Arena, ArenaConfig, Error, Handle};
use cuarena_testkit::gpu_arena;
use cuarena_testkit::{load_kernels, GRAPH_TEST_CU};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Elements of each tensor of the graph (256 KiB of f32).
const N: usize = 1 << 16;

/// The kernels of `crates/cuarena-testkit/kernels/graph_test.cu`.
pub(crate) struct Kernels {
    _module: Arc<CudaModule>,
    raw_add: CudaFunction,
    raw_mul: CudaFunction,
    raw_accumulate: CudaFunction,
    h_add: CudaFunction,
    h_mul: CudaFunction,
    h_accumulate: CudaFunction,
}

impl Kernels {
    fn load(arena: &Arena<CudaBackend>) -> Kernels {
        let module = load_kernels(
            arena.backend(),
            "crates/cuarena-testkit/kernels/graph_test.cu",
            GRAPH_TEST_CU,
        )
        .unwrap_or_else(|e| panic!("crates/cuarena-testkit/kernels/graph_test.cu: {e}"));
        let f = |name: &str| module.load_function(name).expect(name);
        Kernels {
            raw_add: f("raw_add"),
            raw_mul: f("raw_mul"),
            raw_accumulate: f("raw_accumulate"),
            h_add: f("h_add"),
            h_mul: f("h_mul"),
            h_accumulate: f("h_accumulate_checked"),
            _module: module,
        }
    }
}

fn cfg() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (64, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The graph's tensors: t1 = a + b; t2 = t1 * c; acc += t2 (err counts
/// handles the checked kernel refused).
#[derive(Clone, Copy)]
pub(crate) struct Tensors {
    pub(crate) a: Handle,
    pub(crate) b: Handle,
    pub(crate) c: Handle,
    pub(crate) t1: Handle,
    pub(crate) t2: Handle,
    pub(crate) acc: Handle,
    pub(crate) err: Handle,
}

impl Tensors {
    pub(crate) fn all(&self) -> [Handle; 7] {
        [self.a, self.b, self.c, self.t1, self.t2, self.acc, self.err]
    }
}

/// What the host expects the tensors to hold.
pub(crate) struct Model {
    pub(crate) a: Vec<f32>,
    pub(crate) b: Vec<f32>,
    pub(crate) c: Vec<f32>,
    pub(crate) t1: Vec<f32>,
    pub(crate) t2: Vec<f32>,
    pub(crate) acc: Vec<f32>,
}

impl Model {
    pub(crate) fn new() -> Model {
        // Small integers and halves: every sum and product is exact in f32,
        // so the device's results must match bit for bit.
        Model {
            a: (0..N).map(|i| (i % 97) as f32 + 1.0).collect(),
            b: (0..N).map(|i| (i % 13) as f32 * 0.5).collect(),
            c: (0..N).map(|i| (i % 7) as f32 + 1.0).collect(),
            t1: vec![0.0; N],
            t2: vec![0.0; N],
            acc: vec![0.0; N],
        }
    }

    /// One replay of the graph.
    pub(crate) fn step(&mut self) {
        for i in 0..N {
            self.t1[i] = self.a[i] + self.b[i];
            self.t2[i] = self.t1[i] * self.c[i];
            self.acc[i] += self.t2[i];
        }
    }
}

fn mismatches(got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).filter(|(g, w)| g != w).count()
}

/// Mismatching elements of (t1, t2, acc), and the error counter.
fn compare(arena: &mut Arena<CudaBackend>, t: &Tensors, m: &Model) -> (usize, usize, usize, u32) {
    let t1 = arena.read::<f32>(t.t1).expect("t1");
    let t2 = arena.read::<f32>(t.t2).expect("t2");
    let acc = arena.read::<f32>(t.acc).expect("acc");
    let err = arena.read::<u32>(t.err).expect("err")[0];
    (
        mismatches(&t1, &m.t1),
        mismatches(&t2, &m.t2),
        mismatches(&acc, &m.acc),
        err,
    )
}

pub(crate) fn assert_correct(arena: &mut Arena<CudaBackend>, t: &Tensors, m: &Model, when: &str) {
    let (t1, t2, acc, err) = compare(arena, t, m);
    println!("{when}: mismatches t1 {t1}, t2 {t2}, acc {acc}; refused handles {err}");
    assert_eq!((t1, t2, acc, err), (0, 0, 0, 0), "{when}");
}

/// A full compaction that must move every tensor of `t`.
fn compact_moving_all(arena: &mut Arena<CudaBackend>, t: &Tensors, when: &str) {
    let before = offsets(arena, t);
    arena.compact().expect("compact");
    let after = offsets(arena, t);
    println!("{when}: offsets {before:?} -> {after:?}");
    assert_eq!(moved(&before, &after), 7, "{when}: every tensor moved");
}

/// Replays `g` `times` times (the model steps along), then checks.
fn replay_and_check(
    arena: &mut Arena<CudaBackend>,
    g: &ArenaGraph,
    (t, m): (&Tensors, &mut Model),
    times: usize,
    when: &str,
) {
    for _ in 0..times {
        g.launch(arena).expect("replay");
        m.step();
    }
    let s = if times == 1 { "" } else { "s" };
    assert_correct(arena, t, m, &format!("{when}, {times} replay{s}"));
}

pub(crate) fn offsets(arena: &Arena<CudaBackend>, t: &Tensors) -> Vec<u64> {
    t.all()
        .iter()
        .map(|&h| arena.info(h).expect("info").offset)
        .collect()
}

/// How many of the graph's tensors moved between two `offsets` snapshots.
pub(crate) fn moved(before: &[u64], after: &[u64]) -> usize {
    before.iter().zip(after).filter(|(b, a)| b != a).count()
}

/// The layout of the tests: four 64 KiB blocks at the bottom (`low`, freed
/// one per round so the tensors above slide down), then the tensors with a
/// 64 KiB filler before each.
pub(crate) fn setup(
    arena: &mut Arena<CudaBackend>,
    m: &Model,
) -> (Tensors, Vec<Handle>, Vec<Handle>) {
    let low: Vec<Handle> = (0..4)
        .map(|_| arena.alloc(64 * KIB).expect("low"))
        .collect();
    let mut fillers = Vec::new();
    let mut tensor = |arena: &mut Arena<CudaBackend>| {
        fillers.push(arena.alloc(64 * KIB).expect("filler"));
        arena.alloc_dtype(DType::F32, N as u64).expect("tensor")
    };
    let (a, b, c) = (tensor(arena), tensor(arena), tensor(arena));
    let (t1, t2, acc) = (tensor(arena), tensor(arena), tensor(arena));
    fillers.push(arena.alloc(64 * KIB).expect("filler"));
    let err = arena.alloc_dtype(DType::U32, 1).expect("err");
    let t = Tensors {
        a,
        b,
        c,
        t1,
        t2,
        acc,
        err,
    };
    arena.write(a, &m.a).expect("a");
    arena.write(b, &m.b).expect("b");
    arena.write(c, &m.c).expect("c");
    for h in [t1, t2, acc] {
        arena.write(h, &vec![0.0f32; N]).expect("zeros");
    }
    arena.write(err, &[0u32]).expect("err");
    (t, low, fillers)
}

/// The three kernels through handles, captured once.
pub(crate) fn capture_handles(
    arena: &mut Arena<CudaBackend>,
    k: &Kernels,
    t: &Tensors,
) -> ArenaGraph {
    let n = N as u32;
    ArenaGraph::capture(arena, |cap| {
        // SAFETY: h_add(CuarenaTable, out, x, y, u32 n) and h_mul write n
        // floats of `out` and read n of x and y; h_accumulate_checked reads
        // and writes n floats of acc, reads n of t2 and one u32 of err.
        // Every block holds n floats (err one u32).
        unsafe {
            cap.prepare([t.t1, t.a, t.b])?.launch(&k.h_add, cfg(), &n)?;
            cap.prepare([t.t2, t.t1, t.c])?
                .launch(&k.h_mul, cfg(), &n)?;
            cap.prepare([t.acc, t.t2, t.err])?
                .launch(&k.h_accumulate, cfg(), &n)
        }
    })
    .expect("capture through handles")
}

/// The same kernels with the addresses the blocks have now.
pub(crate) fn capture_raw(arena: &mut Arena<CudaBackend>, k: &Kernels, t: &Tensors) -> ArenaGraph {
    let base = arena.backend().region_ptr();
    let at = |h: Handle| base + arena.resolve(h).expect("resolve");
    let (a, b, c) = (at(t.a), at(t.b), at(t.c));
    let (t1, t2, acc) = (at(t.t1), at(t.t2), at(t.acc));
    let n = N as u32;
    ArenaGraph::capture(arena, |cap| {
        let s = cap.stream();
        let mut add = s.launch_builder(&k.raw_add);
        add.arg(&t1).arg(&a).arg(&b).arg(&n);
        let mut mul = s.launch_builder(&k.raw_mul);
        mul.arg(&t2).arg(&t1).arg(&c).arg(&n);
        let mut acc_k = s.launch_builder(&k.raw_accumulate);
        acc_k.arg(&acc).arg(&t2).arg(&n);
        // SAFETY: every address lies in the region, and n floats from it
        // too (they were blocks of n floats when taken; after a compaction
        // they point at whatever moved there, still inside the region).
        unsafe {
            add.launch(cfg()).expect("raw_add");
            mul.launch(cfg()).expect("raw_mul");
            acc_k.launch(cfg()).expect("raw_accumulate");
        }
        Ok(())
    })
    .expect("capture with raw addresses")
}

/// An arena of `config` with the tensors of [`setup`] holding the
/// model's inputs, the kernels, and the graph captured through handles.
pub(crate) struct Fixture {
    pub(crate) arena: Arena<CudaBackend>,
    pub(crate) m: Model,
    pub(crate) t: Tensors,
    pub(crate) low: Vec<Handle>,
    pub(crate) fillers: Vec<Handle>,
    pub(crate) k: Kernels,
    pub(crate) g: ArenaGraph,
}

/// The [`Fixture`] on a CUDA arena of `config`, or `None` where no GPU is
/// usable (see [`gpu_arena`]).
pub(crate) fn fixture(config: ArenaConfig) -> Option<Fixture> {
    let mut arena = gpu_arena(config)?;
    let m = Model::new();
    let (t, low, fillers) = setup(&mut arena, &m);
    let k = Kernels::load(&arena);
    let g = capture_handles(&mut arena, &k, &t);
    Some(Fixture {
        arena,
        m,
        t,
        low,
        fillers,
        k,
        g,
    })
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn graph_through_handles_survives_compactions() {
    let Some(Fixture {
        mut arena,
        mut m,
        t,
        low,
        fillers,
        k,
        g,
    }) = fixture(ArenaConfig::new(16 * MIB))
    else {
        return;
    };
    assert_eq!(g.handles().len(), 7);
    let table = g.table().table;

    // Round 0: as captured, replayed twice.
    replay_and_check(
        &mut arena,
        &g,
        (&t, &mut m),
        2,
        "round 0 (before any compaction)",
    );

    // Round 1: free the fillers and the lowest block, compact fully: every
    // tensor slides down. New input data.
    for h in fillers.iter().chain(&low[..1]) {
        arena.free(*h).expect("free");
    }
    compact_moving_all(&mut arena, &t, "round 1");
    m.a = (0..N).map(|i| (i % 31) as f32 + 2.0).collect();
    arena.write(t.a, &m.a).expect("a");
    replay_and_check(&mut arena, &g, (&t, &mut m), 1, "round 1 (full compaction)");

    // Round 2: the rest of the arena taken by one unrelated block, a 64 KiB
    // hole left after the tensors and another below them (the last low
    // block); with everything else pinned, an allocation of 128 KiB fits
    // in no hole and compacts on its own, sliding the tensors.
    let spacer = arena.alloc(64 * KIB).expect("spacer");
    let rest = arena.stats().largest_free_bytes;
    let wall = arena.alloc(rest).expect("wall");
    arena.free(spacer).expect("free");
    arena.free(low[3]).expect("free");
    for h in [low[1], low[2], wall] {
        arena.pin(h).expect("pin");
    }
    let count = |a: &Arena<CudaBackend>| {
        let s = a.stats();
        s.targeted_compactions + s.full_compactions
    };
    let compactions = count(&arena);
    let before = offsets(&arena, &t);
    let req = arena.alloc(128 * KIB).expect("alloc by compacting");
    let after = offsets(&arena, &t);
    println!("round 2: offsets {before:?} -> {after:?}");
    // Targeted or full, as the compaction policy chooses: one compaction.
    assert_eq!(count(&arena), compactions + 1);
    assert_eq!(moved(&before, &after), 7, "every tensor moved");
    for h in [low[1], low[2], wall] {
        arena.unpin(h).expect("unpin");
    }
    replay_and_check(
        &mut arena,
        &g,
        (&t, &mut m),
        3,
        "round 2 (targeted compaction)",
    );

    // Round 3: free the wall and a low block, a few fresh allocations of
    // 4-64 KiB, new c, full compaction.
    arena.free(low[2]).expect("free");
    arena.free(wall).expect("free");
    let fresh: Vec<Handle> = (0..16)
        .map(|i| arena.alloc((i + 1) * 4 * KIB).expect("fresh"))
        .collect();
    m.c = (0..N).map(|i| (i % 5) as f32 + 0.5).collect();
    arena.write(t.c, &m.c).expect("c");
    compact_moving_all(&mut arena, &t, "round 3");
    replay_and_check(&mut arena, &g, (&t, &mut m), 1, "round 3 (full compaction)");

    // Round 4: the last low block, the 128 KiB block and every other fresh
    // block freed; full compaction.
    arena.free(low[1]).expect("free");
    arena.free(req).expect("free");
    for h in fresh.iter().step_by(2) {
        arena.free(*h).expect("free");
    }
    compact_moving_all(&mut arena, &t, "round 4");
    replay_and_check(&mut arena, &g, (&t, &mut m), 2, "round 4 (full compaction)");
    assert_eq!(g.table().table, table);
    assert_eq!(
        arena.backend().table_ptr(),
        table,
        "the table kept its address"
    );

    // The same kernel launched from Rust outside a graph.
    // SAFETY: as in capture_handles.
    let prepared = graph::launch_args(&mut arena, [t.t1, t.b, t.c]).expect("launch_args");
    // SAFETY: as in capture_handles.
    unsafe { prepared.launch(&k.h_add, cfg(), &(N as u32)) }.expect("launch");
    let want: Vec<f32> = m.b.iter().zip(&m.c).map(|(b, c)| b + c).collect();
    assert_eq!(mismatches(&arena.read::<f32>(t.t1).expect("t1"), &want), 0);
    println!(
        "{} compactions ({} targeted), {} blocks moved; the graph was captured once",
        arena.stats().full_compactions + arena.stats().targeted_compactions,
        arena.stats().targeted_compactions,
        arena.stats().moves
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn graph_with_raw_addresses_is_wrong_after_a_compaction() {
    let Some(Fixture {
        mut arena,
        mut m,
        t,
        fillers,
        k,
        g: by_handle,
        ..
    }) = fixture(ArenaConfig::new(16 * MIB))
    else {
        return;
    };
    let raw = capture_raw(&mut arena, &k, &t);

    // Before any compaction both are right.
    raw.launch(&mut arena).expect("raw replay");
    m.step();
    assert_correct(&mut arena, &t, &m, "raw addresses, before compaction");
    by_handle.launch(&mut arena).expect("replay");
    m.step();
    assert_correct(&mut arena, &t, &m, "handles, before compaction");

    // One compaction moves every tensor.
    for h in &fillers {
        arena.free(*h).expect("free");
    }
    compact_moving_all(&mut arena, &t, "one compaction");

    by_handle.launch(&mut arena).expect("replay");
    m.step();
    assert_correct(&mut arena, &t, &m, "handles, after compaction");

    // The raw graph still reads and writes where the blocks were: inside
    // the region (so it is safe to run), at whatever moved there.
    raw.launch(&mut arena).expect("raw replay");
    m.step();
    let (t1, t2, acc, _) = compare(&mut arena, &t, &m);
    println!(
        "raw addresses, after compaction: mismatches t1 {t1}, t2 {t2}, acc {acc} of {N} each \
         (expected: wrong)"
    );
    assert!(
        t2 > N / 2 && acc > N / 2,
        "the raw graph should be wrong after a compaction"
    );
}

/// `x`, `y` and `out` of `h_add`, `n` floats each, `x` and `y` filled.
fn add_operands(arena: &mut Arena<CudaBackend>, n: usize, x: f32, y: f32) -> [Handle; 3] {
    let [hx, hy, out] =
        ["x", "y", "out"].map(|what| arena.alloc_dtype(DType::F32, n as u64).expect(what));
    arena.write(hx, &vec![x; n]).expect("x");
    arena.write(hy, &vec![y; n]).expect("y");
    [hx, hy, out]
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn replay_refuses_a_moved_table_and_reserving_prevents_it() {
    let Some(mut arena) = gpu_arena(ArenaConfig::new(64 * MIB)) else {
        return;
    };
    let k = Kernels::load(&arena);
    let n = 1024usize;
    let [x, y, out] = add_operands(&mut arena, n, 1.5, 2.0);
    let nu = n as u32;
    let capture = |arena: &mut Arena<CudaBackend>, slots: usize| {
        ArenaGraph::capture_reserving(arena, slots, |cap| {
            // SAFETY: h_add writes n floats of out, reads n of x and y.
            unsafe { cap.prepare([out, x, y])?.launch(&k.h_add, cfg(), &nu) }
        })
        .expect("capture")
    };

    // No reserve: more live blocks than the table holds make it grow.
    let g = capture(&mut arena, 0);
    g.launch(&mut arena).expect("replay");
    assert_eq!(arena.read::<f32>(out).expect("out"), vec![3.5f32; n]);
    let cap0 = graph::handle_table_capacity(&arena);
    let extra: Vec<Handle> = (0..cap0 + 1)
        .map(|_| arena.alloc(256).expect("small"))
        .collect();
    match g.launch(&mut arena) {
        Err(e @ Error::TableMoved { .. }) => println!("refused as expected: {e}"),
        other => panic!("a replay after the table moved must be refused, got {other:?}"),
    }
    assert_ne!(arena.backend().table_ptr(), g.table().table);

    // Reserved up front: the same growth leaves the graph valid.
    let reserved = 4 * (cap0 + extra.len()) + 4096;
    let g = capture(&mut arena, reserved);
    let more: Vec<Handle> = (0..2 * extra.len())
        .map(|_| arena.alloc(256).expect("small"))
        .collect();
    arena.write(x, &vec![4.0f32; n]).expect("x");
    g.launch(&mut arena)
        .expect("replay after growth within the reserve");
    assert_eq!(arena.read::<f32>(out).expect("out"), vec![6.0f32; n]);
    println!(
        "table: {cap0} slots at first, {} reserved, {} in use",
        graph::handle_table_capacity(&arena),
        graph::handle_args(&mut arena).expect("table").slots
    );
    assert!(graph::handle_table_capacity(&arena) >= reserved);
    assert_eq!(more.len(), 2 * extra.len());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored"]
fn replay_brings_spilled_handles_back() {
    let config = ArenaConfig::new(4 * MIB).with_spill_host_bytes(16 * MIB);
    let Some(mut arena) = gpu_arena(config) else {
        return;
    };
    let k = Kernels::load(&arena);
    let n = N;
    let [x, y, out] = add_operands(&mut arena, n, 1.0, 0.25);
    let nu = n as u32;
    let g = ArenaGraph::capture(&mut arena, |cap| {
        // SAFETY: h_add writes n floats of out, reads n of x and y.
        unsafe { cap.prepare([out, x, y])?.launch(&k.h_add, cfg(), &nu) }
    })
    .expect("capture");
    g.launch(&mut arena).expect("replay");
    assert_eq!(arena.read::<f32>(out).expect("out"), vec![1.25f32; n]);

    // Something large and newer pushes the graph's tensors out.
    let big = arena.alloc(3 * MIB + 512 * KIB).expect("spills");
    let spilled = [x, y, out]
        .iter()
        .filter(|&&h| !arena.info(h).expect("info").resident)
        .count();
    println!(
        "spilled {spilled} of the graph's 3 tensors ({} evictions)",
        arena.stats().evictions
    );
    assert!(spilled > 0);
    arena.write(y, &vec![0.5f32; n]).expect("y"); // brings y back
    g.launch(&mut arena).expect("replay brings the rest back");
    assert_eq!(arena.read::<f32>(out).expect("out"), vec![1.5f32; n]);
    assert!(arena.stats().restores > 0);
    assert!(!arena.info(big).expect("big").resident || arena.stats().evictions > 1);
}
