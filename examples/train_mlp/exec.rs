//! Execution: the same loop on the GPU, the host, or no bytes at all.

use super::*;

// ---- execution: the same loop on the GPU, the host, or no bytes at all ----------

/// The operations of the training loop over arena handles. All sizes are
/// in elements of 4 bytes (f32, or i32 for labels).
pub(crate) trait Exec {
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
    /// x[..len] *= s (train_ddp's gradient scaling; train_mlp does not use it).
    #[allow(dead_code)]
    fn scale(&mut self, x: Handle, len: usize, s: f32) -> Res<()>;
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
pub(crate) struct Dry {
    pub(crate) arena: Arena<MetaBackend>,
    /// Largest sum of the reserved bytes of one operation's operands: the
    /// least an oversubscribed arena must hold.
    pub(crate) max_operands: u64,
}

impl Dry {
    pub(crate) fn new(config: ArenaConfig) -> Res<Self> {
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
    fn scale(&mut self, x: Handle, _: usize, _: f32) -> Res<()> {
        self.resident(&[Some(x)])
    }
    fn upload(&mut self, x: &Storage, _: &[f32]) -> Res<()> {
        // What the copy does to the spill policy: x is used.
        Ok(self.arena.make_resident(&[h(x)])?)
    }
}

/// The host reference: every operation reads its operands from a host
/// arena, computes with `host::*`, and writes the result back.
pub(crate) struct Cpu {
    pub(crate) arena: Arena<HostBackend>,
    /// The data loader's stream (an id only: host work is synchronous, but
    /// the uses are recorded as on the GPU).
    upload: StreamId,
}

impl Cpu {
    pub(crate) fn new(config: ArenaConfig) -> Res<Self> {
        let mut arena = Arena::host(config)?;
        let upload = arena.register_stream(())?;
        Ok(Self { arena, upload })
    }

    pub(crate) fn f(&mut self, h: Handle) -> Res<Vec<f32>> {
        // Reads need the block resident (a spilled one comes back).
        self.arena.make_resident(&[h])?;
        Ok(self.arena.read::<f32>(h)?)
    }

    /// Runs `f` with `ops` resident; afterwards counts them as used again,
    /// in the same order, so that the reads and writes in between (which
    /// touch them in another order) leave the LRU as a kernel launch does.
    pub(crate) fn op(
        &mut self,
        ops: &[Option<Handle>],
        f: impl FnOnce(&mut Self) -> Res<()>,
    ) -> Res<()> {
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
            e.arena.make_resident(&[labels])?;
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
    fn scale(&mut self, x: Handle, _len: usize, s: f32) -> Res<()> {
        self.op(&[Some(x)], |e| {
            let v: Vec<f32> = e.f(x)?.iter().map(|a| a * s).collect();
            Ok(e.arena.write(x, &v)?)
        })
    }
    fn upload(&mut self, x: &Storage, data: &[f32]) -> Res<()> {
        self.arena.write(x, data)?;
        Ok(self.arena.record_stream(x, self.upload)?)
    }
}
