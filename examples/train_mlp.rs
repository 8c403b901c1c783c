//! A real training loop on the arena: an MLP (64 → 256 → 256 → 10, ReLU,
//! softmax cross-entropy, SGD with momentum) learns to imitate a fixed
//! random "teacher" MLP on Gaussian inputs.
//!
//! `cargo run --release --example train_mlp` (needs a CUDA GPU; without one
//! it says so and exits 0). `-- --cpu` runs the same loop on the host
//! backend with host implementations of the kernels (slow, smaller
//! batches): the reference the GPU is checked against. `-- --dry` replays
//! the GPU run's allocation sequence on a metadata arena and prints the
//! compactions it will make (placement depends only on that sequence).
//! Also `--steps N`, `--max-batch N`, `--every N`, `--seed N`, `--lr X`.
//!
//! `--oversubscribe R` (R >= 1, e.g. 1.5) gives the arena only peak live / R
//! bytes and a host tier of 2 x peak live (page-locked memory on the GPU):
//! the working set no longer fits, and the arena spills least recently used
//! tensors to the tier and brings them back when a kernel needs them. Every
//! launch first calls `make_resident(&[operands...])`, so a tensor in use by
//! the current launch is never the victim. On the GPU, the run that fits
//! (1.05 x peak, no tier) is made first with the same seed, and the two loss
//! curves are compared: the math is identical, so they should match
//! exactly. Spill and restore copies are timed with CUDA events.
//! `--data-pool` draws batches from one pool of inputs made up front (a
//! cheap data loader: the host's Gaussian sampling otherwise dominates the
//! step time); `benches/spill.rs` times the loop that way.
//!
//! Every tensor lives in one arena: weights, momentum, gradients,
//! activations, the batch's inputs and labels, and the loss accumulators.
//! Batch sizes are drawn uniformly from 16..4096 every step, batches are
//! prefetched three ahead in the middle of steps (as a data loader would),
//! and activations and gradients are freed in an order that leaves holes.
//! The arena is sized to 1.05 × the peak of live bytes, measured by a dry
//! run of the very same allocation sequence on a metadata-only arena, so
//! allocations regularly fit in the free bytes but in no hole: the arena
//! compacts (moving live tensors with its own kernels) and training goes on.
//!
//! The kernels (`kernels/mlp.cu`) are compiled at run time with NVRTC for
//! the device's architecture and launched on the arena's stream with
//! addresses resolved from handles right before each launch.
//!
//! Before the real run, a short run is made twice with the same seeds and
//! the same tight capacity, once on the GPU and once on the host reference,
//! and the weights' updates are compared. After it, the eval inputs (moved
//! by compactions or not) are compared bit for bit with what was uploaded,
//! and the trained weights are evaluated on the host.

use std::collections::VecDeque;
use std::error::Error;
use std::time::Instant;

use cuarena::backend::{Backend, HostBackend, MetaBackend};
use cuarena::{fmt_bytes, Arena, ArenaConfig, Handle, Stats};

type Res<T> = Result<T, Box<dyn Error>>;

const IN: usize = 64;
const HIDDEN: usize = 256;
const CLASSES: usize = 10;
const TEACHER_HIDDEN: usize = 16;
const EVAL_ROWS: usize = 2048;
/// The run fails unless the final eval loss is below this.
const TARGET_LOSS: f32 = 0.5;
/// Batches the data loader keeps ready (each allocated in the middle of an
/// earlier step).
const PREFETCH: usize = 3;
/// Arena capacity over the dry run's peak of live bytes.
const HEADROOM: f64 = 1.05;
/// Host tier over the dry run's peak of live bytes, when oversubscribed.
const HOST_TIER: f64 = 2.0;

// ---- settings ---------------------------------------------------------------

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) steps: usize,
    min_batch: usize,
    max_batch: usize,
    /// Print (and evaluate) every this many steps.
    pub(crate) every: usize,
    lr: f32,
    momentum: f32,
    seed: u64,
    /// Peak live bytes over the arena's capacity (spilling on), or `None`
    /// for an arena that fits (1.05 x peak, no host tier).
    pub(crate) oversubscribe: Option<f64>,
    /// Batches are windows of one pool of inputs made before the loop (a
    /// cheap data loader, so that timings show the device's work) instead
    /// of fresh Gaussian inputs for every batch.
    pub(crate) data_pool: bool,
    /// Time every spill and restore copy with CUDA events (two event
    /// records per copy; off for throughput measurements).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) time_copies: bool,
}

impl Settings {
    pub(crate) fn gpu() -> Self {
        Self {
            steps: 3000,
            min_batch: 16,
            max_batch: 4096,
            every: 250,
            lr: 0.05,
            momentum: 0.9,
            seed: 0x5eed_c0de,
            oversubscribe: None,
            data_pool: false,
            time_copies: true,
        }
    }

    fn cpu() -> Self {
        Self {
            steps: 400,
            max_batch: 512,
            every: 50,
            ..Self::gpu()
        }
    }

    /// The short run the GPU is checked against the host reference with.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn check() -> Self {
        Self {
            steps: 4,
            min_batch: 16,
            max_batch: 700,
            every: 4,
            ..Self::gpu()
        }
    }

    /// Cosine decay from `lr` to 0 over the run.
    fn lr_at(&self, step: usize) -> f32 {
        let t = step as f32 / self.steps.max(1) as f32;
        self.lr * 0.5 * (1.0 + (std::f32::consts::PI * t).cos())
    }

    fn parse(mut self, args: &[String]) -> Res<Self> {
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| -> Res<usize> {
                let v = it.next().ok_or_else(|| format!("{name} needs a value"))?;
                Ok(v.parse::<usize>().map_err(|e| format!("{name} {v}: {e}"))?)
            };
            match a.as_str() {
                "--cpu" | "--dry" => {}
                "--data-pool" => self.data_pool = true,
                "--steps" => self.steps = value("--steps")?.max(1),
                "--max-batch" => self.max_batch = value("--max-batch")?.max(self.min_batch),
                "--every" => self.every = value("--every")?.max(1),
                "--seed" => self.seed = value("--seed")? as u64,
                "--lr" => {
                    let v = it.next().ok_or("--lr needs a value")?;
                    self.lr = v.parse::<f32>().map_err(|e| format!("--lr {v}: {e}"))?;
                }
                "--oversubscribe" => {
                    let v = it.next().ok_or("--oversubscribe needs a value")?;
                    let r = v
                        .parse::<f64>()
                        .map_err(|e| format!("--oversubscribe {v}: {e}"))?;
                    if !(r >= 1.0 && r.is_finite()) {
                        return Err(format!("--oversubscribe {v}: must be a ratio >= 1").into());
                    }
                    self.oversubscribe = Some(r);
                }
                other => {
                    return Err(format!(
                        "unknown argument {other} (expected --cpu, --dry, --steps N, --max-batch N, --every N, --seed N, --lr X, --oversubscribe R, --data-pool)"
                    )
                    .into())
                }
            }
        }
        Ok(self)
    }
}

// ---- random numbers -----------------------------------------------------------

/// SplitMix64 with Box–Muller normals: small, seedable, no dependency.
struct Rng {
    state: u64,
    spare: Option<f32>,
}

impl Rng {
    fn new(seed: u64) -> Self {
        Self {
            state: seed,
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f32 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let r = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.unit();
        self.spare = Some((r * theta.sin()) as f32);
        (r * theta.cos()) as f32
    }

    fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    fn batch(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

// ---- host math: the reference of every kernel -----------------------------------

/// Which operand of a matrix product is stored transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// C[m×n] = A[m×k] · B[k×n]
    NN,
    /// C[m×n] = Aᵀ · B with A stored [k×m]
    TN,
    /// C[m×n] = A · Bᵀ with B stored [n×k]
    NT,
}

mod host {
    use super::Op;

    pub fn matmul(op: Op, a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        match op {
            Op::NN => {
                for (crow, arow) in c.chunks_exact_mut(n).zip(a.chunks_exact(k)) {
                    for (&av, brow) in arow.iter().zip(b.chunks_exact(n)) {
                        for (cv, &bv) in crow.iter_mut().zip(brow) {
                            *cv += av * bv;
                        }
                    }
                }
            }
            Op::TN => {
                for (arow, brow) in a.chunks_exact(m).zip(b.chunks_exact(n)) {
                    for (&av, crow) in arow.iter().zip(c.chunks_exact_mut(n)) {
                        for (cv, &bv) in crow.iter_mut().zip(brow) {
                            *cv += av * bv;
                        }
                    }
                }
            }
            Op::NT => {
                for (crow, arow) in c.chunks_exact_mut(n).zip(a.chunks_exact(k)) {
                    for (cv, brow) in crow.iter_mut().zip(b.chunks_exact(k)) {
                        *cv = arow.iter().zip(brow).map(|(x, y)| x * y).sum();
                    }
                }
            }
        }
        c
    }

    pub fn bias_add(z: &mut [f32], b: &[f32]) {
        for row in z.chunks_exact_mut(b.len()) {
            for (v, &bv) in row.iter_mut().zip(b) {
                *v += bv;
            }
        }
    }

    pub fn relu(z: &[f32]) -> Vec<f32> {
        z.iter().map(|&v| v.max(0.0)).collect()
    }

    pub fn relu_bwd(dh: &[f32], z: &[f32]) -> Vec<f32> {
        dh.iter()
            .zip(z)
            .map(|(&d, &v)| if v > 0.0 { d } else { 0.0 })
            .collect()
    }

    pub fn col_sum(x: &[f32], cols: usize) -> Vec<f32> {
        let mut out = vec![0.0f32; cols];
        for row in x.chunks_exact(cols) {
            for (o, &v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
        out
    }

    /// Index of the largest value (the first of equals).
    pub fn argmax(row: &[f32]) -> usize {
        let mut best = 0;
        for (c, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = c;
            }
        }
        best
    }

    /// (dlogits of the mean loss, stats: per-row loss then per-row hit).
    pub fn softmax_xent(logits: &[f32], labels: &[i32], cols: usize) -> (Vec<f32>, Vec<f32>) {
        let rows = labels.len();
        let mut d = vec![0.0f32; rows * cols];
        let mut stats = vec![0.0f32; 2 * rows];
        for (r, (z, &y)) in logits.chunks_exact(cols).zip(labels).enumerate() {
            let y = y as usize;
            let arg = argmax(z);
            let mx = z[arg];
            let lse = mx + z.iter().map(|v| (v - mx).exp()).sum::<f32>().ln();
            stats[r] = lse - z[y];
            stats[rows + r] = if arg == y { 1.0 } else { 0.0 };
            for (c, dv) in d[r * cols..(r + 1) * cols].iter_mut().enumerate() {
                let onehot = if c == y { 1.0 } else { 0.0 };
                *dv = ((z[c] - lse).exp() - onehot) / rows as f32;
            }
        }
        (d, stats)
    }
}

/// A network's parameters on the host: per layer, weight [fan_in × fan_out]
/// and bias [fan_out].
#[derive(Debug, Clone)]
struct HostNet {
    layers: Vec<HostLayer>,
}

#[derive(Debug, Clone)]
struct HostLayer {
    w: Vec<f32>,
    b: Vec<f32>,
    fan_in: usize,
    fan_out: usize,
}

impl HostNet {
    /// He-initialised hidden layers; the last layer is scaled down so the
    /// initial loss is close to ln(classes).
    fn random(widths: &[usize], last_scale: f32, rng: &mut Rng) -> Self {
        let n = widths.len() - 1;
        let layers = (0..n)
            .map(|i| {
                let (fan_in, fan_out) = (widths[i], widths[i + 1]);
                let scale =
                    (2.0 / fan_in as f32).sqrt() * if i + 1 == n { last_scale } else { 1.0 };
                HostLayer {
                    w: (0..fan_in * fan_out)
                        .map(|_| rng.normal() * scale)
                        .collect(),
                    b: vec![0.0; fan_out],
                    fan_in,
                    fan_out,
                }
            })
            .collect();
        Self { layers }
    }

    fn logits(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut a = x.to_vec();
        for (i, l) in self.layers.iter().enumerate() {
            let mut z = host::matmul(Op::NN, &a, &l.w, rows, l.fan_out, l.fan_in);
            host::bias_add(&mut z, &l.b);
            a = if i + 1 == self.layers.len() {
                z
            } else {
                host::relu(&z)
            };
        }
        a
    }

    fn labels(&self, x: &[f32], rows: usize) -> Vec<i32> {
        self.logits(x, rows)
            .chunks_exact(CLASSES)
            .map(|r| host::argmax(r) as i32)
            .collect()
    }
}

/// The teacher: a random 64 → 16 → 10 MLP whose output biases are tuned
/// on a sample so that its classes are roughly balanced.
fn make_teacher(rng: &mut Rng) -> HostNet {
    let mut t = HostNet::random(&[IN, TEACHER_HIDDEN, CLASSES], 1.0, rng);
    let rows = 4096;
    let x: Vec<f32> = (0..rows * IN).map(|_| rng.normal()).collect();
    for _ in 0..50 {
        let mut counts = [0usize; CLASSES];
        for y in t.labels(&x, rows) {
            counts[y as usize] += 1;
        }
        let expected = rows as f32 / CLASSES as f32;
        if let Some(out) = t.layers.last_mut() {
            for (b, &c) in out.b.iter_mut().zip(&counts) {
                *b -= 0.25 * ((c as f32 + 1.0) / expected).ln();
            }
        }
    }
    t
}

// ---- execution: the same loop on the GPU, the host, or no bytes at all ----------

/// The operations of the training loop over arena handles. All sizes are
/// in elements of 4 bytes (f32, or i32 for labels).
trait Exec {
    type B: Backend;
    fn arena(&mut self) -> &mut Arena<Self::B>;
    /// Brings an operation's operands onto the device together (spilling
    /// others, never these) and counts them as used, in this order. Every
    /// executor calls it with the same operands in the same order before
    /// each operation, so the spill decisions of the GPU, the host
    /// reference and the dry run are the same.
    fn resident(&mut self, ops: &[Option<Handle>]) -> Res<()> {
        let hs: Vec<Handle> = ops.iter().flatten().copied().collect();
        Ok(self.arena().make_resident(&hs)?)
    }
    /// C[m×n] = op(A) · op(B) with inner dimension k.
    fn matmul(
        &mut self,
        op: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        mnk: (usize, usize, usize),
    ) -> Res<()>;
    fn bias_add(&mut self, z: Handle, b: Handle, rows: usize, cols: usize) -> Res<()>;
    fn relu(&mut self, z: Handle, h: Handle, len: usize) -> Res<()>;
    fn relu_bwd(&mut self, dh: Handle, z: Handle, dz: Handle, len: usize) -> Res<()>;
    fn col_sum(&mut self, x: Handle, out: Handle, rows: usize, cols: usize) -> Res<()>;
    /// stats: [2·rows] per-row loss, then per-row hit; dlogits optional.
    fn softmax_xent(
        &mut self,
        logits: Handle,
        labels: Handle,
        dlogits: Option<Handle>,
        stats: Handle,
        rows: usize,
        cols: usize,
    ) -> Res<()>;
    fn argmax(&mut self, logits: Handle, labels: Handle, rows: usize, cols: usize) -> Res<()>;
    /// out[0] += mean(stats[..n]); out[1] += mean(stats[n..2n]).
    fn mean2_acc(&mut self, stats: Handle, out: Handle, n: usize) -> Res<()>;
    fn sgd(&mut self, w: Handle, g: Handle, v: Handle, len: usize, lr: f32, mu: f32) -> Res<()>;
}

/// Allocation sequence only: a metadata arena, every operation a no-op.
struct Dry {
    arena: Arena<MetaBackend>,
    /// Largest sum of the reserved bytes of one operation's operands: the
    /// least an oversubscribed arena must hold.
    max_operands: u64,
}

impl Dry {
    fn new(config: ArenaConfig) -> Res<Self> {
        Ok(Self {
            arena: Arena::metadata(config)?,
            max_operands: 0,
        })
    }
}

impl Exec for Dry {
    type B = MetaBackend;
    fn arena(&mut self) -> &mut Arena<MetaBackend> {
        &mut self.arena
    }
    fn resident(&mut self, ops: &[Option<Handle>]) -> Res<()> {
        let mut hs = Vec::with_capacity(ops.len());
        let mut bytes = 0;
        for &h in ops.iter().flatten() {
            bytes += self.arena.info(h)?.reserved_bytes;
            hs.push(h);
        }
        self.max_operands = self.max_operands.max(bytes);
        Ok(self.arena.make_resident(&hs)?)
    }
    fn matmul(
        &mut self,
        _: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        _: (usize, usize, usize),
    ) -> Res<()> {
        self.resident(&[Some(a), Some(b), Some(c)])
    }
    fn bias_add(&mut self, z: Handle, b: Handle, _: usize, _: usize) -> Res<()> {
        self.resident(&[Some(z), Some(b)])
    }
    fn relu(&mut self, z: Handle, h: Handle, _: usize) -> Res<()> {
        self.resident(&[Some(z), Some(h)])
    }
    fn relu_bwd(&mut self, dh: Handle, z: Handle, dz: Handle, _: usize) -> Res<()> {
        self.resident(&[Some(dh), Some(z), Some(dz)])
    }
    fn col_sum(&mut self, x: Handle, out: Handle, _: usize, _: usize) -> Res<()> {
        self.resident(&[Some(x), Some(out)])
    }
    fn softmax_xent(
        &mut self,
        logits: Handle,
        labels: Handle,
        dlogits: Option<Handle>,
        stats: Handle,
        _: usize,
        _: usize,
    ) -> Res<()> {
        self.resident(&[Some(logits), Some(labels), dlogits, Some(stats)])
    }
    fn argmax(&mut self, logits: Handle, labels: Handle, _: usize, _: usize) -> Res<()> {
        self.resident(&[Some(logits), Some(labels)])
    }
    fn mean2_acc(&mut self, stats: Handle, out: Handle, _: usize) -> Res<()> {
        self.resident(&[Some(stats), Some(out)])
    }
    fn sgd(&mut self, w: Handle, g: Handle, v: Handle, _: usize, _: f32, _: f32) -> Res<()> {
        self.resident(&[Some(w), Some(g), Some(v)])
    }
}

/// The host reference: every operation reads its operands from a host
/// arena, computes with `host::*`, and writes the result back.
struct Cpu {
    arena: Arena<HostBackend>,
}

impl Cpu {
    fn f(&mut self, h: Handle) -> Res<Vec<f32>> {
        Ok(self.arena.read::<f32>(h)?)
    }

    /// Runs `f` with `ops` resident; afterwards counts them as used again,
    /// in the same order, so that the reads and writes in between (which
    /// touch them in another order) leave the LRU as a kernel launch does.
    fn op(&mut self, ops: &[Option<Handle>], f: impl FnOnce(&mut Self) -> Res<()>) -> Res<()> {
        self.resident(ops)?;
        f(self)?;
        self.resident(ops)
    }
}

impl Exec for Cpu {
    type B = HostBackend;
    fn arena(&mut self) -> &mut Arena<HostBackend> {
        &mut self.arena
    }
    fn matmul(
        &mut self,
        op: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        (m, n, k): (usize, usize, usize),
    ) -> Res<()> {
        self.op(&[Some(a), Some(b), Some(c)], |e| {
            let (a, b) = (e.f(a)?, e.f(b)?);
            Ok(e.arena.write(c, &host::matmul(op, &a, &b, m, n, k))?)
        })
    }
    fn bias_add(&mut self, z: Handle, b: Handle, _rows: usize, _cols: usize) -> Res<()> {
        self.op(&[Some(z), Some(b)], |e| {
            let (mut zv, b) = (e.f(z)?, e.f(b)?);
            host::bias_add(&mut zv, &b);
            Ok(e.arena.write(z, &zv)?)
        })
    }
    fn relu(&mut self, z: Handle, h: Handle, _len: usize) -> Res<()> {
        self.op(&[Some(z), Some(h)], |e| {
            let z = e.f(z)?;
            Ok(e.arena.write(h, &host::relu(&z))?)
        })
    }
    fn relu_bwd(&mut self, dh: Handle, z: Handle, dz: Handle, _len: usize) -> Res<()> {
        self.op(&[Some(dh), Some(z), Some(dz)], |e| {
            let (dh, z) = (e.f(dh)?, e.f(z)?);
            Ok(e.arena.write(dz, &host::relu_bwd(&dh, &z))?)
        })
    }
    fn col_sum(&mut self, x: Handle, out: Handle, _rows: usize, cols: usize) -> Res<()> {
        self.op(&[Some(x), Some(out)], |e| {
            let x = e.f(x)?;
            Ok(e.arena.write(out, &host::col_sum(&x, cols))?)
        })
    }
    fn softmax_xent(
        &mut self,
        logits: Handle,
        labels: Handle,
        dlogits: Option<Handle>,
        stats: Handle,
        _rows: usize,
        cols: usize,
    ) -> Res<()> {
        self.op(&[Some(logits), Some(labels), dlogits, Some(stats)], |e| {
            let z = e.f(logits)?;
            let y = e.arena.read::<i32>(labels)?;
            let (d, s) = host::softmax_xent(&z, &y, cols);
            if let Some(dl) = dlogits {
                e.arena.write(dl, &d)?;
            }
            Ok(e.arena.write(stats, &s)?)
        })
    }
    fn argmax(&mut self, logits: Handle, labels: Handle, _rows: usize, cols: usize) -> Res<()> {
        self.op(&[Some(logits), Some(labels)], |e| {
            let z = e.f(logits)?;
            let y: Vec<i32> = z
                .chunks_exact(cols)
                .map(|r| host::argmax(r) as i32)
                .collect();
            Ok(e.arena.write(labels, &y)?)
        })
    }
    fn mean2_acc(&mut self, stats: Handle, out: Handle, n: usize) -> Res<()> {
        self.op(&[Some(stats), Some(out)], |e| {
            let s = e.f(stats)?;
            let mut o = e.f(out)?;
            o[0] += s[..n].iter().sum::<f32>() / n as f32;
            o[1] += s[n..2 * n].iter().sum::<f32>() / n as f32;
            Ok(e.arena.write(out, &o)?)
        })
    }
    fn sgd(&mut self, w: Handle, g: Handle, v: Handle, _len: usize, lr: f32, mu: f32) -> Res<()> {
        self.op(&[Some(w), Some(g), Some(v)], |e| {
            let (mut wv, gv, mut vv) = (e.f(w)?, e.f(g)?, e.f(v)?);
            for ((wi, &gi), vi) in wv.iter_mut().zip(&gv).zip(vv.iter_mut()) {
                *vi = mu * *vi + gi;
                *wi -= lr * *vi;
            }
            e.arena.write(v, &vv)?;
            Ok(e.arena.write(w, &wv)?)
        })
    }
}

#[cfg(feature = "cuda")]
pub(crate) mod gpu {
    //! The CUDA executor: `kernels/mlp.cu` compiled with NVRTC, launched on
    //! the arena stream; and the CUDA backend with its spills and restores
    //! timed by CUDA events.

    use std::cell::RefCell;
    use std::sync::Arc;

    use cuarena::backend::cuda::cudarc::driver::{
        sys, CudaEvent, CudaFunction, CudaModule, DriverError, LaunchConfig, PushKernelArg,
    };
    use cuarena::backend::cuda::cudarc::nvrtc::{
        compile_ptx_with_opts, CompileError, CompileOptions, Ptx,
    };
    use cuarena::backend::cuda::CudaBackend;
    use cuarena::backend::Backend;
    use cuarena::plan::Plan;
    use cuarena::{Arena, ArenaConfig, Handle, TableEntry};

    use super::{Exec, Op, Res};

    /// Which way a host-tier copy went.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Dir {
        /// Device to host (a spill).
        Out,
        /// Host to device (a restore).
        In,
    }

    /// Time spent in spills and restores (CUDA events around each copy on
    /// the arena stream), and every copy in order.
    #[derive(Debug, Clone, Default)]
    pub struct SpillTiming {
        /// Milliseconds in device-to-host spill copies.
        pub out_ms: f64,
        /// Milliseconds in host-to-device restore copies.
        pub in_ms: f64,
        /// Direction and bytes of every copy.
        pub copies: Vec<(Dir, u64)>,
    }

    impl SpillTiming {
        /// Bytes copied in direction `d`.
        pub fn bytes(&self, d: Dir) -> u64 {
            self.copies.iter().filter(|c| c.0 == d).map(|c| c.1).sum()
        }
    }

    /// Event pairs recorded and not yet read.
    #[derive(Debug, Default)]
    struct Events {
        start: Vec<CudaEvent>,
        end: Vec<CudaEvent>,
        pending: usize,
        timing: SpillTiming,
    }

    /// Copies timed at most before the host waits for them.
    const MAX_PENDING: usize = 4096;

    fn drv(call: &'static str) -> impl Fn(DriverError) -> cuarena::Error {
        move |e| cuarena::Error::Driver {
            call,
            source: cuarena::error::DriverError::from(e),
        }
    }

    /// The CUDA backend with a CUDA event recorded before and after each
    /// spill and restore copy when `enabled` (the arena decides; this only
    /// measures).
    #[derive(Debug)]
    pub struct Timed {
        inner: CudaBackend,
        enabled: bool,
        events: RefCell<Events>,
    }

    impl Timed {
        pub fn new(inner: CudaBackend, enabled: bool) -> Self {
            Self {
                inner,
                enabled,
                events: RefCell::new(Events::default()),
            }
        }

        pub fn inner(&self) -> &CudaBackend {
            &self.inner
        }

        /// Spill timing so far (waits for the copies still in flight).
        pub fn timing(&self) -> cuarena::Result<SpillTiming> {
            self.harvest()?;
            Ok(self.events.borrow().timing.clone())
        }

        /// Makes sure there are `pairs` pairs of timing events.
        fn create_events(&mut self, pairs: usize) -> cuarena::Result<()> {
            let ev = self.events.get_mut();
            let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
            let ctx = self.inner.context();
            while ev.start.len() < pairs {
                ev.start
                    .push(ctx.new_event(flags).map_err(drv("cuEventCreate"))?);
                ev.end
                    .push(ctx.new_event(flags).map_err(drv("cuEventCreate"))?);
            }
            Ok(())
        }

        /// Reads the pending event pairs (waiting for the last one).
        fn harvest(&self) -> cuarena::Result<()> {
            let mut guard = self.events.borrow_mut();
            let ev = &mut *guard;
            if ev.pending == 0 {
                return Ok(());
            }
            ev.end[ev.pending - 1]
                .synchronize()
                .map_err(drv("cuEventSynchronize"))?;
            let first = ev.timing.copies.len() - ev.pending;
            for i in 0..ev.pending {
                let ms = f64::from(
                    ev.start[i]
                        .elapsed_ms(&ev.end[i])
                        .map_err(drv("cuEventElapsedTime"))?,
                );
                match ev.timing.copies[first + i].0 {
                    Dir::Out => ev.timing.out_ms += ms,
                    Dir::In => ev.timing.in_ms += ms,
                }
            }
            ev.pending = 0;
            Ok(())
        }

        fn timed(
            &mut self,
            dir: Dir,
            len: u64,
            copy: impl FnOnce(&mut CudaBackend) -> cuarena::Result<()>,
        ) -> cuarena::Result<()> {
            if !self.enabled {
                return copy(&mut self.inner);
            }
            if self.events.borrow().pending >= MAX_PENDING {
                self.harvest()?;
            }
            let i = self.events.get_mut().pending;
            self.create_events(i + 1)?;
            let ev = self.events.get_mut();
            let stream = self.inner.stream().clone();
            ev.start[i].record(&stream).map_err(drv("cuEventRecord"))?;
            copy(&mut self.inner)?;
            let ev = self.events.get_mut();
            ev.end[i].record(&stream).map_err(drv("cuEventRecord"))?;
            ev.pending += 1;
            ev.timing.copies.push((dir, len));
            Ok(())
        }
    }

    impl Backend for Timed {
        fn capacity_bytes(&self) -> u64 {
            self.inner.capacity_bytes()
        }
        fn write(&mut self, offset: u64, bytes: &[u8]) -> cuarena::Result<()> {
            self.inner.write(offset, bytes)
        }
        fn read(&mut self, offset: u64, out: &mut [u8]) -> cuarena::Result<()> {
            self.inner.read(offset, out)?;
            // The stream is idle now: reading the events costs nothing.
            self.harvest()
        }
        fn execute(&mut self, plan: &Plan) -> cuarena::Result<()> {
            self.inner.execute(plan)
        }
        fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> cuarena::Result<()> {
            self.inner.sync_table(entries, first)
        }
        fn reserve_host_tier(&mut self, bytes: u64) -> cuarena::Result<()> {
            if self.enabled {
                // Up front, not in the training loop.
                self.create_events(MAX_PENDING)?;
            }
            self.inner.reserve_host_tier(bytes)
        }
        fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> cuarena::Result<()> {
            self.timed(Dir::Out, len, |b| b.spill(offset, host_offset, len))
        }
        fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> cuarena::Result<()> {
            self.timed(Dir::In, len, |b| b.restore(host_offset, offset, len))
        }
    }

    const SOURCE: &str = include_str!("../kernels/mlp.cu");

    /// Compiles `kernels/mlp.cu` for `arch` (`sm_90` on a Hopper GPU).
    pub fn compile(arch: &str) -> Res<Ptx> {
        let opts = CompileOptions {
            options: vec![
                format!("--gpu-architecture={arch}"),
                "--std=c++17".to_string(),
            ],
            name: Some("mlp.cu".to_string()),
            ..Default::default()
        };
        compile_ptx_with_opts(SOURCE, opts).map_err(|e| match e {
            CompileError::CompileError { log, .. } => format!(
                "NVRTC could not compile kernels/mlp.cu:\n{}",
                log.to_string_lossy()
            )
            .into(),
            other => format!("NVRTC: {other:?}").into(),
        })
    }

    struct Kernels {
        _module: Arc<CudaModule>,
        mm_nn: CudaFunction,
        mm_tn: CudaFunction,
        mm_nt: CudaFunction,
        bias_add: CudaFunction,
        relu_fwd: CudaFunction,
        relu_bwd: CudaFunction,
        col_sum: CudaFunction,
        softmax_xent: CudaFunction,
        argmax: CudaFunction,
        mean2_acc: CudaFunction,
        sgd: CudaFunction,
    }

    /// An operand of a launch: a block and how many 4-byte elements the
    /// kernel may touch in it (checked against the block's size).
    type Operand = (Option<Handle>, usize);

    pub struct Gpu {
        pub arena: Arena<Timed>,
        k: Kernels,
    }

    /// Picks a kernel of [`Kernels`].
    type Pick = fn(&Kernels) -> &CudaFunction;

    fn dim(n: usize) -> Res<i32> {
        Ok(i32::try_from(n).map_err(|_| format!("dimension {n} does not fit the kernels' int"))?)
    }

    /// Grid-stride elementwise launch.
    fn cfg_1d(n: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (n.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    impl Gpu {
        /// An arena of `config` on device 0; compiles the kernels into
        /// `ptx` the first time (the device's architecture is known once a
        /// backend exists).
        pub fn new(config: ArenaConfig, ptx: &mut Option<Ptx>, time_copies: bool) -> Res<Self> {
            let backend = CudaBackend::new(0, config.capacity_bytes)?;
            let code = match ptx {
                Some(p) => p.clone(),
                None => {
                    let p = compile(backend.arch())?;
                    *ptx = Some(p.clone());
                    p
                }
            };
            let module = backend.context().load_module(code)?;
            let f = |name: &str| module.load_function(name);
            let k = Kernels {
                mm_nn: f("mlp_matmul_nn")?,
                mm_tn: f("mlp_matmul_tn")?,
                mm_nt: f("mlp_matmul_nt")?,
                bias_add: f("mlp_bias_add")?,
                relu_fwd: f("mlp_relu_fwd")?,
                relu_bwd: f("mlp_relu_bwd")?,
                col_sum: f("mlp_col_sum")?,
                softmax_xent: f("mlp_softmax_xent")?,
                argmax: f("mlp_argmax")?,
                mean2_acc: f("mlp_mean2_acc")?,
                sgd: f("mlp_sgd_momentum")?,
                _module: module,
            };
            let arena = Arena::with_backend(config, Timed::new(backend, time_copies))?;
            Ok(Self { arena, k })
        }

        /// Launches the kernel `pick` names with the operands' device
        /// addresses, then `ints`, then `floats` (the argument order of
        /// every kernel in mlp.cu).
        ///
        /// Why the addresses cannot go stale: first `make_resident` brings
        /// every operand onto the device together (with spilling on, it may
        /// spill other blocks, restore these and compact, all enqueued on
        /// the arena stream before this launch; it never spills one of
        /// these). Then the addresses are resolved, after the last call
        /// that could move anything (every `alloc` happens before the
        /// launch that uses the block), and used only to enqueue this one
        /// launch; from there on only `&self.arena` is used, so nothing
        /// moves until we return, and no address outlives this function.
        /// The kernel runs on the arena stream, so it executes before any
        /// compaction, spill, transfer or reuse of a freed block enqueued
        /// later on that stream: on the GPU it sees exactly the layout
        /// these addresses describe.
        fn launch(
            &mut self,
            pick: Pick,
            cfg: LaunchConfig,
            operands: &[Operand],
            ints: &[i32],
            floats: &[f32],
        ) -> Res<()> {
            let mut ptrs = [0u64; 4];
            if operands.len() > ptrs.len() {
                return Err("too many operands".into());
            }
            let handles: Vec<Option<Handle>> = operands.iter().map(|o| o.0).collect();
            self.resident(&handles)?;
            let f = pick(&self.k);
            let base = self.arena.backend().inner().region_ptr();
            for (p, &(h, elems)) in ptrs.iter_mut().zip(operands) {
                if let Some(h) = h {
                    let size = self.arena.size_bytes(h)?;
                    if size < 4 * elems as u64 {
                        return Err(
                            format!("block of {size} B too small for {elems} elements").into()
                        );
                    }
                    *p = base + self.arena.resolve(h)?;
                }
            }
            let mut b = self.arena.backend().inner().stream().launch_builder(f);
            for p in &ptrs[..operands.len()] {
                b.arg(p);
            }
            for i in ints {
                b.arg(i);
            }
            for x in floats {
                b.arg(x);
            }
            // SAFETY: every call below passes the pointers, ints and floats
            // of the kernel's C signature in order and type (pointers as
            // u64, `int` as i32, `float` as f32). Each pointer is the
            // current address of a live block of this arena, resident with
            // all the others (or null where the kernel accepts null), at
            // least as large as the
            // elements the kernel touches for the given dimensions (checked
            // above), and the launch is ordered on the arena stream (see
            // the comment on this function).
            unsafe { b.launch(cfg) }?;
            Ok(())
        }
    }

    impl Exec for Gpu {
        type B = Timed;
        fn arena(&mut self) -> &mut Arena<Timed> {
            &mut self.arena
        }
        fn matmul(
            &mut self,
            op: Op,
            a: Handle,
            b: Handle,
            c: Handle,
            (m, n, k): (usize, usize, usize),
        ) -> Res<()> {
            let f: Pick = match op {
                Op::NN => |k| &k.mm_nn,
                Op::TN => |k| &k.mm_tn,
                Op::NT => |k| &k.mm_nt,
            };
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(64) as u32, m.div_ceil(64) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let ops = [(Some(a), m * k), (Some(b), k * n), (Some(c), m * n)];
            self.launch(f, cfg, &ops, &[dim(m)?, dim(n)?, dim(k)?], &[])
        }
        fn bias_add(&mut self, z: Handle, b: Handle, rows: usize, cols: usize) -> Res<()> {
            let ops = [(Some(z), rows * cols), (Some(b), cols)];
            self.launch(
                |k| &k.bias_add,
                cfg_1d(rows * cols),
                &ops,
                &[dim(rows)?, dim(cols)?],
                &[],
            )
        }
        fn relu(&mut self, z: Handle, h: Handle, len: usize) -> Res<()> {
            let ops = [(Some(z), len), (Some(h), len)];
            self.launch(|k| &k.relu_fwd, cfg_1d(len), &ops, &[dim(len)?], &[])
        }
        fn relu_bwd(&mut self, dh: Handle, z: Handle, dz: Handle, len: usize) -> Res<()> {
            let ops = [(Some(dh), len), (Some(z), len), (Some(dz), len)];
            self.launch(|k| &k.relu_bwd, cfg_1d(len), &ops, &[dim(len)?], &[])
        }
        fn col_sum(&mut self, x: Handle, out: Handle, rows: usize, cols: usize) -> Res<()> {
            let cfg = LaunchConfig {
                grid_dim: (cols.div_ceil(32) as u32, 1, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            let ops = [(Some(x), rows * cols), (Some(out), cols)];
            self.launch(|k| &k.col_sum, cfg, &ops, &[dim(rows)?, dim(cols)?], &[])
        }
        fn softmax_xent(
            &mut self,
            logits: Handle,
            labels: Handle,
            dlogits: Option<Handle>,
            stats: Handle,
            rows: usize,
            cols: usize,
        ) -> Res<()> {
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(128).max(1) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let ops = [
                (Some(logits), rows * cols),
                (Some(labels), rows),
                (dlogits, rows * cols),
                (Some(stats), 2 * rows),
            ];
            self.launch(
                |k| &k.softmax_xent,
                cfg,
                &ops,
                &[dim(rows)?, dim(cols)?],
                &[],
            )
        }
        fn argmax(&mut self, logits: Handle, labels: Handle, rows: usize, cols: usize) -> Res<()> {
            let cfg = LaunchConfig {
                grid_dim: (rows.div_ceil(128).max(1) as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let ops = [(Some(logits), rows * cols), (Some(labels), rows)];
            self.launch(|k| &k.argmax, cfg, &ops, &[dim(rows)?, dim(cols)?], &[])
        }
        fn mean2_acc(&mut self, stats: Handle, out: Handle, n: usize) -> Res<()> {
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let ops = [(Some(stats), 2 * n), (Some(out), 2)];
            self.launch(|k| &k.mean2_acc, cfg, &ops, &[dim(n)?], &[])
        }
        fn sgd(
            &mut self,
            w: Handle,
            g: Handle,
            v: Handle,
            len: usize,
            lr: f32,
            mu: f32,
        ) -> Res<()> {
            let ops = [(Some(w), len), (Some(g), len), (Some(v), len)];
            self.launch(|k| &k.sgd, cfg_1d(len), &ops, &[dim(len)?], &[lr, mu])
        }
    }
}

// ---- the model on the arena -------------------------------------------------------

fn alloc_f32<E: Exec>(e: &mut E, n: usize) -> Res<Handle> {
    Ok(e.arena().alloc_elems::<f32>(n)?)
}

fn free<E: Exec>(e: &mut E, h: Handle) -> Res<()> {
    Ok(e.arena().free(h)?)
}

/// A layer's parameters (and momentum, for the student) in the arena.
#[derive(Debug, Clone, Copy)]
struct Layer {
    w: Handle,
    b: Handle,
    momentum: Option<(Handle, Handle)>,
    fan_in: usize,
    fan_out: usize,
}

#[derive(Debug, Clone)]
struct Net {
    layers: Vec<Layer>,
}

impl Net {
    fn upload<E: Exec>(e: &mut E, host: &HostNet, momentum: bool) -> Res<Self> {
        let mut layers = Vec::new();
        for l in &host.layers {
            let w = alloc_f32(e, l.w.len())?;
            e.arena().write(w, &l.w)?;
            let b = alloc_f32(e, l.b.len())?;
            e.arena().write(b, &l.b)?;
            let momentum = if momentum {
                let vw = alloc_f32(e, l.w.len())?;
                e.arena().write(vw, &vec![0.0f32; l.w.len()])?;
                let vb = alloc_f32(e, l.b.len())?;
                e.arena().write(vb, &vec![0.0f32; l.b.len()])?;
                Some((vw, vb))
            } else {
                None
            };
            layers.push(Layer {
                w,
                b,
                momentum,
                fan_in: l.fan_in,
                fan_out: l.fan_out,
            });
        }
        Ok(Self { layers })
    }

    fn download<E: Exec>(&self, e: &mut E) -> Res<HostNet> {
        let mut layers = Vec::new();
        for l in &self.layers {
            layers.push(HostLayer {
                w: e.arena().read::<f32>(l.w)?,
                b: e.arena().read::<f32>(l.b)?,
                fan_in: l.fan_in,
                fan_out: l.fan_out,
            });
        }
        Ok(HostNet { layers })
    }
}

/// Activations of a forward pass: `z[i]` before and `h[i]` after the ReLU
/// of hidden layer i; the last `z` is the logits.
struct Fwd {
    z: Vec<Handle>,
    h: Vec<Handle>,
}

/// Forward pass of `n` rows of `x`. With `keep` every activation is kept
/// for the backward pass; without, each is freed as soon as it is used and
/// only the logits are returned.
fn forward<E: Exec>(e: &mut E, net: &Net, x: Handle, n: usize, keep: bool) -> Res<Fwd> {
    let (mut z_all, mut h_all) = (Vec::new(), Vec::new());
    let mut input = x;
    let last = net.layers.len() - 1;
    for (i, l) in net.layers.iter().enumerate() {
        let z = alloc_f32(e, n * l.fan_out)?;
        e.matmul(Op::NN, input, l.w, z, (n, l.fan_out, l.fan_in))?;
        e.bias_add(z, l.b, n, l.fan_out)?;
        if !keep && i > 0 {
            free(e, input)?;
        }
        if i == last {
            z_all.push(z);
            break;
        }
        let h = alloc_f32(e, n * l.fan_out)?;
        e.relu(z, h, n * l.fan_out)?;
        if keep {
            z_all.push(z);
            h_all.push(h);
        } else {
            free(e, z)?;
        }
        input = h;
    }
    Ok(Fwd { z: z_all, h: h_all })
}

/// Loss of `logits` against `labels`, accumulated into `metrics`; returns
/// the gradient of the mean loss when `grad`.
fn loss<E: Exec>(
    e: &mut E,
    logits: Handle,
    labels: Handle,
    n: usize,
    metrics: Handle,
    grad: bool,
) -> Res<Option<Handle>> {
    let stats = alloc_f32(e, 2 * n)?;
    let dlogits = if grad {
        Some(alloc_f32(e, n * CLASSES)?)
    } else {
        None
    };
    e.softmax_xent(logits, labels, dlogits, stats, n, CLASSES)?;
    e.mean2_acc(stats, metrics, n)?;
    free(e, stats)?;
    Ok(dlogits)
}

/// Backward pass; frees the activations as soon as they are used and
/// returns the gradients `(dW, db)` per layer.
fn backward<E: Exec>(
    e: &mut E,
    net: &Net,
    x: Handle,
    n: usize,
    fwd: &Fwd,
    dlogits: Handle,
) -> Res<Vec<(Handle, Handle)>> {
    let mut grads = Vec::with_capacity(net.layers.len());
    let mut dz = dlogits;
    for (i, l) in net.layers.iter().enumerate().rev() {
        let input = if i == 0 { x } else { fwd.h[i - 1] };
        let gw = alloc_f32(e, l.fan_in * l.fan_out)?;
        e.matmul(Op::TN, input, dz, gw, (l.fan_in, l.fan_out, n))?;
        let gb = alloc_f32(e, l.fan_out)?;
        e.col_sum(dz, gb, n, l.fan_out)?;
        grads.push((gw, gb));
        if i == 0 {
            free(e, dz)?;
            break;
        }
        let dh = alloc_f32(e, n * l.fan_in)?;
        e.matmul(Op::NT, dz, l.w, dh, (n, l.fan_in, l.fan_out))?;
        free(e, dz)?;
        free(e, fwd.h[i - 1])?;
        let dz_prev = alloc_f32(e, n * l.fan_in)?;
        e.relu_bwd(dh, fwd.z[i - 1], dz_prev, n * l.fan_in)?;
        free(e, dh)?;
        free(e, fwd.z[i - 1])?;
        dz = dz_prev;
    }
    grads.reverse();
    Ok(grads)
}

/// SGD with momentum on every layer, then frees the gradients in a random
/// order (more holes).
fn update<E: Exec>(
    e: &mut E,
    net: &Net,
    grads: &[(Handle, Handle)],
    lr: f32,
    mu: f32,
    sched: &mut Rng,
) -> Res<()> {
    for (l, &(gw, gb)) in net.layers.iter().zip(grads) {
        let (vw, vb) = l.momentum.ok_or("the student has momentum buffers")?;
        e.sgd(l.w, gw, vw, l.fan_in * l.fan_out, lr, mu)?;
        e.sgd(l.b, gb, vb, l.fan_out, lr, mu)?;
    }
    let mut all: Vec<Handle> = grads.iter().flat_map(|&(w, b)| [w, b]).collect();
    sched.shuffle(&mut all);
    for h in all {
        free(e, h)?;
    }
    Ok(())
}

/// Labels of `n` rows of `x`: the teacher's argmax, computed on the device.
fn label<E: Exec>(e: &mut E, teacher: &Net, x: Handle, y: Handle, n: usize) -> Res<()> {
    let fwd = forward(e, teacher, x, n, false)?;
    let logits = fwd.z[0];
    e.argmax(logits, y, n, CLASSES)?;
    free(e, logits)
}

struct Batch {
    x: Handle,
    y: Handle,
    n: usize,
}

/// The data loader: a batch of random size, Gaussian inputs uploaded from
/// the host, labels from the teacher on the device.
fn make_batch<E: Exec>(
    e: &mut E,
    teacher: &Net,
    s: &Settings,
    sched: &mut Rng,
    data: &mut Rng,
    buf: &mut Vec<f32>,
    pool: &[f32],
) -> Res<Batch> {
    let n = sched.batch(s.min_batch, s.max_batch);
    let x = alloc_f32(e, n * IN)?;
    let y = e.arena().alloc_elems::<i32>(n)?;
    if e.arena().backend().stores_bytes() {
        if pool.len() >= n * IN {
            let start = data.below(pool.len() - n * IN + 1);
            e.arena().write(x, &pool[start..start + n * IN])?;
        } else {
            buf.clear();
            buf.extend((0..n * IN).map(|_| data.normal()));
            e.arena().write(x, buf)?;
        }
    } else {
        // What the write does to the spill policy: x is used.
        e.arena().make_resident(&[x])?;
    }
    label(e, teacher, x, y, n)?;
    Ok(Batch { x, y, n })
}

/// Reads an accumulator `[loss, accuracy]` divided by `count`, and zeroes it.
fn take_metrics<E: Exec>(e: &mut E, m: Handle, count: usize) -> Res<(f32, f32)> {
    let v = e.arena().read::<f32>(m)?;
    e.arena().write(m, &[0.0f32, 0.0])?;
    let c = count.max(1) as f32;
    Ok((v[0] / c, v[1] / c))
}

/// One line of the learning curve.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Point {
    pub(crate) step: usize,
    batch: usize,
    /// Mean loss and accuracy of the training batches since the last point.
    pub(crate) train: Option<(f32, f32)>,
    pub(crate) eval_loss: f32,
    eval_acc: f32,
}

impl Point {
    fn print<B: Backend>(&self, arena: &Arena<B>) {
        let st = arena.stats();
        let train = match self.train {
            Some((l, a)) => format!("train loss {l:.4} acc {a:.3}"),
            None => format!("{:<24}", "(before training)"),
        };
        println!(
            "step {:>5}  batch {:>4}  {train}  eval loss {:.4} acc {:.3}  | compactions {:>4} ({} targeted, {} full), moved {}",
            self.step,
            self.batch,
            self.eval_loss,
            self.eval_acc,
            st.targeted_compactions + st.full_compactions,
            st.targeted_compactions,
            st.full_compactions,
            fmt_bytes(st.bytes_moved)
        );
    }
}

/// Loss and accuracy of `net` on the eval batch (activations allocated and
/// freed as it goes).
fn evaluate<E: Exec>(
    e: &mut E,
    net: &Net,
    x: Handle,
    y: Handle,
    metrics: Handle,
) -> Res<(f32, f32)> {
    let f = forward(e, net, x, EVAL_ROWS, false)?;
    loss(e, f.z[0], y, EVAL_ROWS, metrics, false)?;
    free(e, f.z[0])?;
    take_metrics(e, metrics, 1)
}

pub(crate) struct Outcome {
    pub(crate) curve: Vec<Point>,
    net: Net,
    eval_x: Handle,
    eval_y: Handle,
    /// Wall time of the training loop (evaluations included).
    pub(crate) seconds: f64,
}

/// The whole run: set-up, `s.steps` training steps, an evaluation every
/// `s.every`. The allocation sequence depends only on `s` (the dry run
/// reproduces it exactly).
fn train<E: Exec>(
    e: &mut E,
    teacher: &HostNet,
    student: &HostNet,
    eval_inputs: &[f32],
    s: &Settings,
    log: bool,
) -> Res<Outcome> {
    let mut sched = Rng::new(s.seed ^ 0x5c4e_d01e);
    let mut data = Rng::new(s.seed ^ 0xda7a);
    let mut buf = Vec::new();
    let pool: Vec<f32> = if s.data_pool && e.arena().backend().stores_bytes() {
        (0..4 * s.max_batch * IN).map(|_| data.normal()).collect()
    } else {
        Vec::new()
    };
    let teacher_dev = Net::upload(e, teacher, false)?;
    let eval_x = alloc_f32(e, EVAL_ROWS * IN)?;
    e.arena().write(eval_x, eval_inputs)?;
    let eval_y = e.arena().alloc_elems::<i32>(EVAL_ROWS)?;
    label(e, &teacher_dev, eval_x, eval_y, EVAL_ROWS)?;
    let net = Net::upload(e, student, true)?;
    let train_metrics = alloc_f32(e, 2)?;
    e.arena().write(train_metrics, &[0.0f32, 0.0])?;
    let eval_metrics = alloc_f32(e, 2)?;
    e.arena().write(eval_metrics, &[0.0f32, 0.0])?;

    let (eval_loss, eval_acc) = evaluate(e, &net, eval_x, eval_y, eval_metrics)?;
    let p0 = Point {
        step: 0,
        batch: 0,
        train: None,
        eval_loss,
        eval_acc,
    };
    if log {
        p0.print(e.arena());
    }
    let mut curve = vec![p0];
    let started = Instant::now();
    let mut since = 0;
    let mut queue = VecDeque::new();
    for _ in 0..PREFETCH {
        queue.push_back(make_batch(
            e,
            &teacher_dev,
            s,
            &mut sched,
            &mut data,
            &mut buf,
            &pool,
        )?);
    }
    for step in 1..=s.steps {
        let batch = queue.pop_front().ok_or("empty prefetch queue")?;
        let n = batch.n;
        let fwd = forward(e, &net, batch.x, n, true)?;
        let logits = fwd.z[fwd.z.len() - 1];
        let dlogits = loss(e, logits, batch.y, n, train_metrics, true)?.ok_or("no gradient")?;
        free(e, logits)?;
        // The data loader prepares a batch now: it lands among this step's
        // activations and outlives them.
        queue.push_back(make_batch(
            e,
            &teacher_dev,
            s,
            &mut sched,
            &mut data,
            &mut buf,
            &pool,
        )?);
        let grads = backward(e, &net, batch.x, n, &fwd, dlogits)?;
        free(e, batch.y)?;
        free(e, batch.x)?;
        update(e, &net, &grads, s.lr_at(step - 1), s.momentum, &mut sched)?;
        since += 1;

        if step % s.every == 0 || step == s.steps {
            let train = take_metrics(e, train_metrics, since)?;
            since = 0;
            let (eval_loss, eval_acc) = evaluate(e, &net, eval_x, eval_y, eval_metrics)?;
            let p = Point {
                step,
                batch: n,
                train: Some(train),
                eval_loss,
                eval_acc,
            };
            if log {
                p.print(e.arena());
            }
            curve.push(p);
        }
    }
    for b in queue {
        free(e, b.y)?;
        free(e, b.x)?;
    }
    Ok(Outcome {
        curve,
        net,
        eval_x,
        eval_y,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs the allocation sequence of `train(s)` on a metadata arena and
/// returns (peak live bytes, the configuration to give a real arena).
fn capacity_for(p: &Problem, s: &Settings) -> Res<(u64, ArenaConfig)> {
    let (peak, max_operands, align) = dry_peak(p, s)?;
    let config = arena_config(peak, align, s.oversubscribe);
    if config.capacity_bytes < max_operands {
        return Err(format!(
            "--oversubscribe {}: an arena of {} cannot hold the operands of one kernel together \
             (up to {}, the eval batch or the largest batch's activations); the most these settings allow is {:.2}",
            s.oversubscribe.unwrap_or(1.0),
            fmt_bytes(config.capacity_bytes),
            fmt_bytes(max_operands),
            peak as f64 / max_operands as f64
        )
        .into());
    }
    Ok((peak, config))
}

/// The allocation sequence of `train(s)` on an unbounded metadata arena:
/// (peak live bytes, most bytes one operation needs resident together,
/// the arena's alignment).
fn dry_peak(p: &Problem, s: &Settings) -> Res<(u64, u64, u64)> {
    let mut dry = Dry::new(ArenaConfig::new(1 << 40))?;
    train(&mut dry, &p.teacher, &p.student, &p.eval_x, s, false)?;
    let peak = dry.arena.stats().peak_allocated_bytes;
    Ok((peak, dry.max_operands, dry.arena.config().alignment_bytes))
}

/// The arena for a run whose peak of live bytes is `peak`: 1.05 x peak and
/// no host tier, or (oversubscribed by `ratio`) peak / ratio and a host
/// tier of 2 x peak.
fn arena_config(peak: u64, align: u64, ratio: Option<f64>) -> ArenaConfig {
    let round = |bytes: f64| (bytes as u64).div_ceil(align) * align;
    match ratio {
        None => ArenaConfig::new(round(peak as f64 * HEADROOM)),
        Some(r) => ArenaConfig::new(round(peak as f64 / r))
            .with_spill_host_bytes(round(peak as f64 * HOST_TIER)),
    }
}

/// Largest difference of two parameter sets' updates from `init`,
/// relative to the largest update.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn update_error(init: &HostNet, a: &HostNet, b: &HostNet) -> (f32, f32) {
    let (mut max_diff, mut max_update) = (0.0f32, 0.0f32);
    for ((l0, la), lb) in init.layers.iter().zip(&a.layers).zip(&b.layers) {
        for ((p0, pa), pb) in [(&l0.w, &la.w, &lb.w), (&l0.b, &la.b, &lb.b)]
            .into_iter()
            .flat_map(|(x, y, z)| x.iter().zip(y).zip(z))
        {
            max_diff = max_diff.max((pa - pb).abs());
            max_update = max_update.max((pb - p0).abs());
        }
    }
    (max_diff / max_update.max(f32::MIN_POSITIVE), max_update)
}

/// Mean loss and accuracy of `net` on the host.
fn host_eval(net: &HostNet, x: &[f32], labels: &[i32]) -> (f32, f32) {
    let logits = net.logits(x, labels.len());
    let (_, stats) = host::softmax_xent(&logits, labels, CLASSES);
    let n = labels.len() as f32;
    (
        stats[..labels.len()].iter().sum::<f32>() / n,
        stats[labels.len()..].iter().sum::<f32>() / n,
    )
}

fn summary_of_run<B: Backend>(
    arena: &Arena<B>,
    peak: u64,
    predicted: &Stats,
    out: &Outcome,
    s: &Settings,
) -> Res<()> {
    let st = arena.stats();
    let first = out.curve.first().ok_or("no evaluation")?;
    let last = out.curve.last().ok_or("no evaluation")?;
    let (first_train, last_train) = (
        out.curve
            .iter()
            .find_map(|p| p.train)
            .unwrap_or((f32::NAN, f32::NAN)),
        last.train.unwrap_or((f32::NAN, f32::NAN)),
    );
    println!();
    println!(
        "loss: eval {:.4} (step 0) -> {:.4} (step {}), accuracy {:.3} -> {:.3}; train {:.4} (first {} steps) -> {:.4} (last {}); target: eval loss < {TARGET_LOSS}",
        first.eval_loss,
        last.eval_loss,
        last.step,
        first.eval_acc,
        last.eval_acc,
        first_train.0,
        s.every.min(s.steps),
        last_train.0,
        s.every.min(s.steps)
    );
    println!(
        "steps: {} in {:.2} s ({:.2} ms/step, batches {}..{})",
        s.steps,
        out.seconds,
        1e3 * out.seconds / s.steps as f64,
        s.min_batch,
        s.max_batch
    );
    println!(
        "compactions: {} ({} targeted, {} full), {} moves, {} moved; host time in compacting calls {:.1} ms (planning {:.1} ms)",
        st.targeted_compactions + st.full_compactions,
        st.targeted_compactions,
        st.full_compactions,
        st.moves,
        fmt_bytes(st.bytes_moved),
        st.compaction_time.as_secs_f64() * 1e3,
        st.planning_time.as_secs_f64() * 1e3
    );
    let decisions = |st: &Stats| {
        [
            st.targeted_compactions,
            st.full_compactions,
            st.moves,
            st.bytes_moved,
            st.evictions,
            st.restores,
            st.bytes_evicted,
            st.bytes_restored,
        ]
    };
    let same = decisions(predicted) == decisions(&st);
    println!(
        "a metadata arena of the same capacity fed the same sequence predicted {} compactions, {} moves, {} moved, {} evictions, {} restores: {}",
        predicted.targeted_compactions + predicted.full_compactions,
        predicted.moves,
        fmt_bytes(predicted.bytes_moved),
        predicted.evictions,
        predicted.restores,
        if same { "identical" } else { "DIFFERENT" }
    );
    let tier = arena.config().spill_host_bytes;
    if tier > 0 {
        println!(
            "spilling: capacity {:.3} x peak live ({} x oversubscribed), host tier {}; {} evictions ({} out), {} restores ({} in), {:.1} copies per step",
            st.capacity_bytes as f64 / peak as f64,
            s.oversubscribe.unwrap_or(1.0),
            fmt_bytes(tier),
            st.evictions,
            fmt_bytes(st.bytes_evicted),
            st.restores,
            fmt_bytes(st.bytes_restored),
            (st.evictions + st.restores) as f64 / s.steps as f64
        );
    }
    println!(
        "arena: capacity {} = {:.3} x peak live {} (dry run); peak reached {}; {} allocations, {} failed",
        fmt_bytes(st.capacity_bytes),
        st.capacity_bytes as f64 / peak as f64,
        fmt_bytes(peak),
        fmt_bytes(st.peak_allocated_bytes),
        st.allocs,
        st.failed_allocs
    );
    println!("\n{}", arena.summary());
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--cpu") {
        return run_cpu(Settings::cpu().parse(&args)?);
    }
    if args.iter().any(|a| a == "--dry") {
        return run_dry(Settings::gpu().parse(&args)?);
    }
    #[cfg(feature = "cuda")]
    {
        use cuarena::backend::cuda::CudaBackend;
        match CudaBackend::available() {
            Ok(()) => run_gpu(Settings::gpu().parse(&args)?),
            Err(reason) => {
                println!(
                    "train_mlp needs a CUDA GPU (its kernels run on the device): {reason}; skipping (--cpu runs the slow host reference)"
                );
                Ok(())
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        println!(
            "train_mlp needs a CUDA GPU: cuarena was built without the `cuda` feature; skipping"
        );
        Ok(())
    }
}

/// Teacher, initial student and eval inputs.
pub(crate) struct Problem {
    teacher: HostNet,
    student: HostNet,
    eval_x: Vec<f32>,
}

/// The problem of a seed.
pub(crate) fn problem(s: &Settings) -> Problem {
    let mut rng = Rng::new(s.seed);
    let teacher = make_teacher(&mut rng);
    let student = HostNet::random(&[IN, HIDDEN, HIDDEN, CLASSES], 0.25, &mut rng);
    let eval_x = (0..EVAL_ROWS * IN).map(|_| rng.normal()).collect();
    Problem {
        teacher,
        student,
        eval_x,
    }
}

fn describe(s: &Settings, teacher: &HostNet, eval_x: &[f32]) {
    let mut counts = [0usize; CLASSES];
    for y in teacher.labels(eval_x, EVAL_ROWS) {
        counts[y as usize] += 1;
    }
    println!(
        "model {IN} -> {HIDDEN} -> {HIDDEN} -> {CLASSES} (ReLU, softmax cross-entropy), SGD lr {} (cosine) momentum {}; teacher {IN} -> {TEACHER_HIDDEN} -> {CLASSES}",
        s.lr, s.momentum
    );
    println!(
        "{} steps, batch sizes uniform in {}..{} (prefetched {PREFETCH} ahead), eval batch {EVAL_ROWS} (classes {:?})",
        s.steps, s.min_batch, s.max_batch, counts
    );
}

/// Final checks shared by both runs: eval inputs unchanged after every
/// compaction, labels equal to the host teacher's, and the trained
/// weights' loss on the host.
fn verify<E: Exec>(e: &mut E, out: &Outcome, teacher: &HostNet, eval_inputs: &[f32]) -> Res<()> {
    let x_back = e.arena().read::<f32>(out.eval_x)?;
    let same = x_back
        .iter()
        .zip(eval_inputs)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let y_dev = e.arena().read::<i32>(out.eval_y)?;
    let y_host = teacher.labels(eval_inputs, EVAL_ROWS);
    let agree = y_dev.iter().zip(&y_host).filter(|(a, b)| a == b).count();
    let trained = out.net.download(e)?;
    let (hl, ha) = host_eval(&trained, eval_inputs, &y_dev);
    let last = out.curve.last().ok_or("no evaluation")?;
    println!(
        "integrity: eval inputs {} after all compactions; device labels agree with the host teacher on {agree}/{EVAL_ROWS}; \
         trained weights on the host: eval loss {hl:.4} acc {ha:.3} (device said {:.4} / {:.3})",
        if same { "bit-exact" } else { "CHANGED" },
        last.eval_loss,
        last.eval_acc
    );
    if !same {
        return Err("the eval inputs changed while the arena compacted".into());
    }
    if (hl - last.eval_loss).abs() > 1e-3 * hl.max(1.0) {
        return Err("the device's eval loss disagrees with the host's on the same weights".into());
    }
    if agree + 4 < EVAL_ROWS {
        return Err("device and host teacher labels disagree on more than a few rows".into());
    }
    let last_loss = last.eval_loss;
    if last_loss < TARGET_LOSS {
        println!("target reached: final eval loss {last_loss:.4} < {TARGET_LOSS}");
        Ok(())
    } else {
        Err(format!("target missed: final eval loss {last_loss:.4} >= {TARGET_LOSS}").into())
    }
}

/// The GPU run's allocation sequence on a metadata arena of the same
/// capacity: the same placements and compactions, no bytes, no GPU.
/// The statistics of `train(s)` on an arena of `capacity`, as predicted by
/// a metadata arena: placement and compaction depend only on the sequence
/// of allocations and frees, not on the bytes.
fn predict(p: &Problem, s: &Settings, config: &ArenaConfig) -> Res<Stats> {
    let mut dry = Dry::new(config.clone())?;
    train(&mut dry, &p.teacher, &p.student, &p.eval_x, s, false)?;
    Ok(dry.arena.stats())
}

/// "peak live …; arena capacity … (… x peak)[, host tier …]".
fn arena_line(peak: u64, config: &ArenaConfig) -> String {
    let mut line = format!(
        "peak live {}; arena capacity {} ({:.3} x peak)",
        fmt_bytes(peak),
        fmt_bytes(config.capacity_bytes),
        config.capacity_bytes as f64 / peak.max(1) as f64
    );
    if config.spill_host_bytes > 0 {
        line += &format!(", host tier {}", fmt_bytes(config.spill_host_bytes));
    }
    line
}

fn run_dry(s: Settings) -> Res<()> {
    let p = problem(&s);
    let (peak, config) = capacity_for(&p, &s)?;
    let t0 = Instant::now();
    let st = predict(&p, &s, &config)?;
    println!(
        "dry run of {} steps (batches {}..{}) in {:.1} ms: {}; {} compactions ({} targeted, {} full), {} moves, {} moved, {} allocations; {} evictions ({}), {} restores ({})",
        s.steps,
        s.min_batch,
        s.max_batch,
        t0.elapsed().as_secs_f64() * 1e3,
        arena_line(peak, &config),
        st.targeted_compactions + st.full_compactions,
        st.targeted_compactions,
        st.full_compactions,
        st.moves,
        fmt_bytes(st.bytes_moved),
        st.allocs,
        st.evictions,
        fmt_bytes(st.bytes_evicted),
        st.restores,
        fmt_bytes(st.bytes_restored)
    );
    Ok(())
}

fn run_cpu(s: Settings) -> Res<()> {
    println!("train_mlp on the host reference (no GPU used)");
    let p = problem(&s);
    describe(&s, &p.teacher, &p.eval_x);
    let (peak, config) = capacity_for(&p, &s)?;
    println!("dry run: {}", arena_line(peak, &config));
    let mut cpu = Cpu {
        arena: Arena::host(config.clone())?,
    };
    let out = train(&mut cpu, &p.teacher, &p.student, &p.eval_x, &s, true)?;
    let predicted = predict(&p, &s, &config)?;
    summary_of_run(&cpu.arena, peak, &predicted, &out, &s)?;
    verify(&mut cpu, &out, &p.teacher, &p.eval_x)
}

/// A finished GPU training run and what it needs to be checked.
#[cfg(feature = "cuda")]
pub(crate) struct GpuRun {
    /// The executor, with the arena as the run left it.
    pub(crate) gpu: gpu::Gpu,
    pub(crate) out: Outcome,
    /// Peak live bytes of the dry run.
    pub(crate) peak: u64,
    /// The metadata arena's statistics for the same sequence.
    pub(crate) predicted: Stats,
}

/// One training run on the GPU, the arena sized from the dry run's peak
/// by `s.oversubscribe` (see [`arena_config`]).
#[cfg(feature = "cuda")]
pub(crate) fn gpu_train(
    s: &Settings,
    p: &Problem,
    ptx: &mut Option<cuarena::backend::cuda::cudarc::nvrtc::Ptx>,
    log: bool,
) -> Res<GpuRun> {
    let (peak, config) = capacity_for(p, s)?;
    if log {
        println!("dry run (metadata arena): {}\n", arena_line(peak, &config));
    }
    let mut gpu = gpu::Gpu::new(config.clone(), ptx, s.time_copies)?;
    let out = train(&mut gpu, &p.teacher, &p.student, &p.eval_x, s, log)?;
    let predicted = predict(p, s, &config)?;
    Ok(GpuRun {
        gpu,
        out,
        peak,
        predicted,
    })
}

/// "N out, X in Y ms (Z GB/s)" for the copies of direction `d`.
#[cfg(feature = "cuda")]
fn copies_line(t: &gpu::SpillTiming, d: gpu::Dir) -> String {
    let (n, ms) = match d {
        gpu::Dir::Out => (t.copies.iter().filter(|c| c.0 == d).count(), t.out_ms),
        gpu::Dir::In => (t.copies.iter().filter(|c| c.0 == d).count(), t.in_ms),
    };
    let bytes = t.bytes(d);
    format!(
        "{n} copies, {} in {ms:.2} ms ({:.1} GB/s)",
        fmt_bytes(bytes),
        bytes as f64 / (ms * 1e6).max(f64::MIN_POSITIVE)
    )
}

#[cfg(feature = "cuda")]
fn run_gpu(s: Settings) -> Res<()> {
    use gpu::Gpu;

    let p = problem(&s);
    describe(&s, &p.teacher, &p.eval_x);
    let mut ptx = None;

    // 1. The GPU against the host reference: a short run with the same
    //    seeds and the same tight capacity (and host tier) on both;
    //    oversubscribed as asked, or as much as its smaller batches allow.
    let mut c = Settings::check();
    if let Some(r) = s.oversubscribe {
        let (peak, max_operands, _) = dry_peak(&p, &c)?;
        c.oversubscribe = Some(r.min(0.999 * peak as f64 / max_operands as f64).max(1.0));
    }
    let (check_peak, config) = capacity_for(&p, &c)?;
    let check_capacity = config.capacity_bytes as f64 / check_peak as f64;
    let t0 = Instant::now();
    let mut g = Gpu::new(config.clone(), &mut ptx, true)?;
    println!(
        "device: {} ({}), NVRTC + context {:.2} s",
        g.arena.backend().inner().device_name(),
        g.arena.backend().inner().arch(),
        t0.elapsed().as_secs_f64()
    );
    let go = train(&mut g, &p.teacher, &p.student, &p.eval_x, &c, false)?;
    let gw = go.net.download(&mut g)?;
    let gstats = g.arena.stats();
    drop(g);
    let mut h = Cpu {
        arena: Arena::host(config)?,
    };
    let ho = train(&mut h, &p.teacher, &p.student, &p.eval_x, &c, false)?;
    let hw = ho.net.download(&mut h)?;
    let (rel, upd) = update_error(&p.student, &gw, &hw);
    let (gp, hp) = (
        go.curve.last().ok_or("no evaluation")?,
        ho.curve.last().ok_or("no evaluation")?,
    );
    println!(
        "check vs host reference ({} steps, capacity {:.3} x peak, {} compactions, {} evictions, {} restores on each): weight updates differ by {:.2e} of the largest ({:.2e}); \
         train loss {:.5} vs {:.5}, eval loss {:.5} vs {:.5}",
        c.steps,
        check_capacity,
        gstats.targeted_compactions + gstats.full_compactions,
        gstats.evictions,
        gstats.restores,
        rel,
        upd,
        gp.train.map_or(f32::NAN, |t| t.0),
        hp.train.map_or(f32::NAN, |t| t.0),
        gp.eval_loss,
        hp.eval_loss
    );
    let hstats = h.arena.stats();
    if (gstats.evictions, gstats.restores) != (hstats.evictions, hstats.restores) {
        return Err("the GPU and host runs spilled differently".into());
    }
    if rel.is_nan() || rel >= 1e-3 {
        return Err("the GPU kernels disagree with the host reference".into());
    }

    // 2. Oversubscribed: first the run that fits, same seed, for its curve.
    let reference = match s.oversubscribe {
        Some(_) => {
            let fit = Settings {
                oversubscribe: None,
                ..s.clone()
            };
            let r = gpu_train(&fit, &p, &mut ptx, false)?;
            println!(
                "the run that fits ({}): {} steps in {:.2} s",
                arena_line(r.peak, r.gpu.arena.config()),
                fit.steps,
                r.out.seconds
            );
            Some(r.out)
        }
        None => None,
    };

    // 3. The real run.
    let mut r = gpu_train(&s, &p, &mut ptx, true)?;
    summary_of_run(&r.gpu.arena, r.peak, &r.predicted, &r.out, &s)?;
    if s.oversubscribe.is_some() {
        let t = r.gpu.arena.backend().timing()?;
        println!(
            "spill copies timed with CUDA events: out {}; in {}; together {:.1} GB/s",
            copies_line(&t, gpu::Dir::Out),
            copies_line(&t, gpu::Dir::In),
            (t.bytes(gpu::Dir::Out) + t.bytes(gpu::Dir::In)) as f64
                / ((t.out_ms + t.in_ms) * 1e6).max(f64::MIN_POSITIVE)
        );
    }
    if let Some(fit) = reference {
        compare_curves(&fit, &r.out, s.oversubscribe.unwrap_or(1.0))?;
    }
    verify(&mut r.gpu, &r.out, &p.teacher, &p.eval_x)
}

/// The oversubscribed run's loss curve against the run that fits: the same
/// kernels on the same data in the same order, so the same numbers.
#[cfg(feature = "cuda")]
fn compare_curves(fit: &Outcome, over: &Outcome, ratio: f64) -> Res<()> {
    if fit.curve.len() != over.curve.len() {
        return Err("the two runs evaluated at different steps".into());
    }
    let (mut max_diff, mut bit_exact) = (0.0f32, true);
    for (a, b) in fit.curve.iter().zip(&over.curve) {
        let pairs = [
            (a.eval_loss, b.eval_loss),
            (a.train.map_or(0.0, |t| t.0), b.train.map_or(0.0, |t| t.0)),
        ];
        for (x, y) in pairs {
            max_diff = max_diff.max((x - y).abs());
            bit_exact &= x.to_bits() == y.to_bits();
        }
    }
    let (fa, oa) = (
        fit.curve.last().ok_or("no evaluation")?,
        over.curve.last().ok_or("no evaluation")?,
    );
    println!(
        "loss curve at {ratio} x oversubscribed vs the run that fits (same seed), {} points: final train loss {:.6} vs {:.6}, \
         final eval loss {:.6} vs {:.6}; largest difference {max_diff:.2e} ({}); time {:.2} s vs {:.2} s ({:.2} x)",
        fit.curve.len(),
        oa.train.map_or(f32::NAN, |t| t.0),
        fa.train.map_or(f32::NAN, |t| t.0),
        oa.eval_loss,
        fa.eval_loss,
        if bit_exact { "bit-identical" } else { "not bit-identical" },
        over.seconds,
        fit.seconds,
        over.seconds / fit.seconds.max(f64::MIN_POSITIVE)
    );
    if max_diff.is_nan() || max_diff > 1e-4 {
        return Err("the oversubscribed run's loss curve differs from the run that fits".into());
    }
    Ok(())
}
