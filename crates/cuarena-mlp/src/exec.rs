//! Execution: the same loop on the GPU, the host, or no bytes at all.

use super::*;

// ---- execution: the same loop on the GPU, the host, or no bytes at all ----------

/// One kernel of the training loop: what it computes, on which blocks, at
/// which sizes (in elements of 4 bytes: f32, or i32 for labels). The
/// executors run the same values: the GPU launches them, the host
/// reference computes them with [`host`], the dry run only makes their
/// operands resident.
#[derive(Debug, Clone, Copy)]
pub enum Kernel {
    /// C[m×n] = op(A) · op(B) with inner dimension k.
    Matmul {
        op: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        m: usize,
        n: usize,
        k: usize,
    },
    /// Adds the bias `b` (`cols` elements) to every row of `z` (`rows × cols`).
    BiasAdd {
        z: Handle,
        b: Handle,
        rows: usize,
        cols: usize,
    },
    /// h = max(z, 0).
    Relu { z: Handle, h: Handle, len: usize },
    /// dz = dh where z > 0, else 0.
    ReluBwd {
        dh: Handle,
        z: Handle,
        dz: Handle,
        len: usize,
    },
    /// `out` (`cols` elements) = the sum of the rows of `x` (`rows × cols`).
    ColSum {
        x: Handle,
        out: Handle,
        rows: usize,
        cols: usize,
    },
    /// `stats` (`2 × rows`): per-row loss, then per-row hit; `dlogits` (the
    /// gradient of the mean loss) only where given.
    SoftmaxXent {
        logits: Handle,
        labels: Handle,
        dlogits: Option<Handle>,
        stats: Handle,
        rows: usize,
        cols: usize,
    },
    /// `labels[r]` = the index of the largest value of row `r` of `logits`.
    Argmax {
        logits: Handle,
        labels: Handle,
        rows: usize,
        cols: usize,
    },
    /// `out[0] += mean(stats[..n]); out[1] += mean(stats[n..2n])`.
    Mean2Acc {
        stats: Handle,
        out: Handle,
        n: usize,
    },
    /// SGD with momentum: v = mu·v + g, then w -= lr·v.
    Sgd {
        w: Handle,
        g: Handle,
        v: Handle,
        len: usize,
        lr: f32,
        mu: f32,
    },
    /// `x[..len] *= s` (train_ddp's gradient scaling).
    Scale { x: Handle, len: usize, s: f32 },
}

/// A pointer argument of a kernel: a block read (`In`) or written (`Out`),
/// as f32 or i32 (labels), with how many elements the kernel may touch in
/// it, or a null pointer.
#[derive(Debug, Clone, Copy)]
pub enum Operand {
    In(Handle, usize),
    Out(Handle, usize),
    InI32(Handle, usize),
    OutI32(Handle, usize),
    Null,
}

impl Operand {
    /// The block, if any.
    pub fn handle(self) -> Option<Handle> {
        match self {
            Operand::In(h, _)
            | Operand::Out(h, _)
            | Operand::InI32(h, _)
            | Operand::OutI32(h, _) => Some(h),
            Operand::Null => None,
        }
    }
}

impl Kernel {
    /// C = op(A) · op(B), C [m×n], inner dimension k.
    pub fn matmul(
        op: Op,
        a: Handle,
        b: Handle,
        c: Handle,
        (m, n, k): (usize, usize, usize),
    ) -> Self {
        Kernel::Matmul {
            op,
            a,
            b,
            c,
            m,
            n,
            k,
        }
    }

    /// The pointer arguments in the order of the kernel's C signature in
    /// `mlp.cu`. Every executor makes them resident in this order before
    /// the kernel runs, so the spill decisions of the GPU, the host
    /// reference and the dry run are the same.
    pub fn operands(&self) -> Vec<Operand> {
        use Operand::{In, InI32, Null, Out, OutI32};
        match *self {
            Kernel::Matmul {
                a, b, c, m, n, k, ..
            } => vec![In(a, m * k), In(b, k * n), Out(c, m * n)],
            Kernel::BiasAdd { z, b, rows, cols } => vec![Out(z, rows * cols), In(b, cols)],
            Kernel::Relu { z, h, len } => vec![In(z, len), Out(h, len)],
            Kernel::ReluBwd { dh, z, dz, len } => vec![In(dh, len), In(z, len), Out(dz, len)],
            Kernel::ColSum { x, out, rows, cols } => vec![In(x, rows * cols), Out(out, cols)],
            Kernel::SoftmaxXent {
                logits,
                labels,
                dlogits,
                stats,
                rows,
                cols,
            } => vec![
                In(logits, rows * cols),
                InI32(labels, rows),
                dlogits.map_or(Null, |d| Out(d, rows * cols)),
                Out(stats, 2 * rows),
            ],
            Kernel::Argmax {
                logits,
                labels,
                rows,
                cols,
            } => vec![In(logits, rows * cols), OutI32(labels, rows)],
            Kernel::Mean2Acc { stats, out, n } => vec![In(stats, 2 * n), Out(out, 2)],
            Kernel::Sgd { w, g, v, len, .. } => vec![Out(w, len), In(g, len), Out(v, len)],
            Kernel::Scale { x, len, .. } => vec![Out(x, len)],
        }
    }

    /// The blocks of [`operands`](Kernel::operands), in order.
    pub fn handles(&self) -> Vec<Option<Handle>> {
        self.operands().into_iter().map(Operand::handle).collect()
    }
}

/// An executor of the training loop: an arena, the kernels run on its
/// blocks, and the data loader's uploads.
pub trait Exec {
    type B: Backend;
    fn arena(&mut self) -> &mut Arena<Self::B>;
    /// Brings an operation's operands onto the device together (spilling
    /// others, never these) and counts them as used, in this order.
    fn resident(&mut self, ops: &[Option<Handle>]) -> Res<()> {
        let hs: Vec<Handle> = ops.iter().flatten().copied().collect();
        Ok(self.arena().make_resident(&hs)?)
    }
    /// Runs `k`, its operands made resident first (in the order of
    /// [`Kernel::operands`]).
    fn run(&mut self, k: Kernel) -> Res<()>;
    /// Starts copying a prefetched batch's inputs `data` into `x` on the
    /// executor's upload stream (a stream registered with the arena, the
    /// use recorded), overlapping the step in progress. Counts `x` as used
    /// once (as a write would).
    fn upload(&mut self, x: &Storage, data: &[f32]) -> Res<()>;
    /// Makes the compute wait for the upload of `x` before its first use.
    fn await_upload(&mut self, _x: &Storage) -> Res<()> {
        Ok(())
    }
}

/// Allocation sequence only: a metadata arena, every operation a no-op.
pub struct Dry {
    pub arena: Arena<MetaBackend>,
    /// Largest sum of the reserved bytes of one operation's operands: the
    /// least an oversubscribed arena must hold.
    pub max_operands: u64,
}

impl Dry {
    pub fn new(config: ArenaConfig) -> Res<Self> {
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
    fn run(&mut self, k: Kernel) -> Res<()> {
        self.resident(&k.handles())
    }
    fn upload(&mut self, x: &Storage, _: &[f32]) -> Res<()> {
        // What the copy does to the spill policy: x is used.
        Ok(self.arena.make_resident(&[h(x)])?)
    }
}

/// The host reference: every operation reads its operands from a host
/// arena, computes with `host::*`, and writes the result back.
pub struct Cpu {
    pub arena: Arena<HostBackend>,
    /// The data loader's stream (an id only: host work is synchronous, but
    /// the uses are recorded as on the GPU).
    upload: StreamId,
}

impl Cpu {
    pub fn new(config: ArenaConfig) -> Res<Self> {
        let mut arena = Arena::host(config)?;
        let upload = arena.register_stream(())?;
        Ok(Self { arena, upload })
    }

    pub fn f(&mut self, h: Handle) -> Res<Vec<f32>> {
        // Reads need the block resident (a spilled one comes back).
        self.arena.make_resident(&[h])?;
        Ok(self.arena.read::<f32>(h)?)
    }

    /// Runs `f` with `ops` resident; afterwards counts them as used again,
    /// in the same order, so that the reads and writes in between (which
    /// touch them in another order) leave the LRU as a kernel launch does.
    pub fn op(&mut self, ops: &[Option<Handle>], f: impl FnOnce(&mut Self) -> Res<()>) -> Res<()> {
        self.resident(ops)?;
        f(self)?;
        self.resident(ops)
    }

    /// `k` with the host math: its inputs read, its outputs written.
    fn compute(&mut self, k: Kernel) -> Res<()> {
        match k {
            Kernel::Matmul {
                op,
                a,
                b,
                c,
                m,
                n,
                k,
            } => {
                let (a, b) = (self.f(a)?, self.f(b)?);
                Ok(self.arena.write(c, &host::matmul(op, &a, &b, m, n, k))?)
            }
            Kernel::BiasAdd { z, b, .. } => {
                let (mut zv, b) = (self.f(z)?, self.f(b)?);
                host::bias_add(&mut zv, &b);
                Ok(self.arena.write(z, &zv)?)
            }
            Kernel::Relu { z, h, .. } => {
                let z = self.f(z)?;
                Ok(self.arena.write(h, &host::relu(&z))?)
            }
            Kernel::ReluBwd { dh, z, dz, .. } => {
                let (dh, z) = (self.f(dh)?, self.f(z)?);
                Ok(self.arena.write(dz, &host::relu_bwd(&dh, &z))?)
            }
            Kernel::ColSum { x, out, cols, .. } => {
                let x = self.f(x)?;
                Ok(self.arena.write(out, &host::col_sum(&x, cols))?)
            }
            Kernel::SoftmaxXent {
                logits,
                labels,
                dlogits,
                stats,
                cols,
                ..
            } => {
                let z = self.f(logits)?;
                self.arena.make_resident(&[labels])?;
                let y = self.arena.read::<i32>(labels)?;
                let (d, s) = host::softmax_xent(&z, &y, cols);
                if let Some(dl) = dlogits {
                    self.arena.write(dl, &d)?;
                }
                Ok(self.arena.write(stats, &s)?)
            }
            Kernel::Argmax {
                logits,
                labels,
                cols,
                ..
            } => {
                let z = self.f(logits)?;
                let y: Vec<i32> = z
                    .chunks_exact(cols)
                    .map(|r| host::argmax(r) as i32)
                    .collect();
                Ok(self.arena.write(labels, &y)?)
            }
            Kernel::Mean2Acc { stats, out, n } => {
                let s = self.f(stats)?;
                let mut o = self.f(out)?;
                o[0] += s[..n].iter().sum::<f32>() / n as f32;
                o[1] += s[n..2 * n].iter().sum::<f32>() / n as f32;
                Ok(self.arena.write(out, &o)?)
            }
            Kernel::Sgd {
                w, g, v, lr, mu, ..
            } => {
                let (mut wv, gv, mut vv) = (self.f(w)?, self.f(g)?, self.f(v)?);
                for ((wi, &gi), vi) in wv.iter_mut().zip(&gv).zip(vv.iter_mut()) {
                    *vi = mu * *vi + gi;
                    *wi -= lr * *vi;
                }
                self.arena.write(v, &vv)?;
                Ok(self.arena.write(w, &wv)?)
            }
            Kernel::Scale { x, s, .. } => {
                let v: Vec<f32> = self.f(x)?.iter().map(|a| a * s).collect();
                Ok(self.arena.write(x, &v)?)
            }
        }
    }
}

impl Exec for Cpu {
    type B = HostBackend;
    fn arena(&mut self) -> &mut Arena<HostBackend> {
        &mut self.arena
    }
    fn run(&mut self, k: Kernel) -> Res<()> {
        self.op(&k.handles(), |e| e.compute(k))
    }
    fn upload(&mut self, x: &Storage, data: &[f32]) -> Res<()> {
        self.arena.write(x, data)?;
        Ok(self.arena.record_stream(x, self.upload)?)
    }
}
