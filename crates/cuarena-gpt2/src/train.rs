//! One training step of GPT-2 on a [`Dev`]: forward, cross-entropy,
//! backward, gradient clipping and AdamW, written once for the arena, plain
//! allocations and the metadata dry run. Every buffer is allocated at its
//! step's shape when first needed and freed as soon as it is dead, as a
//! framework's caching allocator would see it: weights, gradients and
//! moments live for the run; activations for their layer's backward pass;
//! attention matrices (B * heads * T * T) for one layer's forward or
//! backward (the backward pass recomputes them from q and k).

use crate::dev::{Ab, Arg, Cfg, Dev, Gemm, Kernel, Ptr, Tid};
use crate::model::{Batch, Config, Hyper, Layout};
use crate::Res;

pub(crate) const F: u64 = 4;

/// Grid-stride elementwise launch over `n` elements.
pub(crate) fn ew(n: usize) -> Cfg {
    Cfg {
        grid: (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block: (256, 1, 1),
        shmem: 0,
    }
}

/// A single block of `threads`.
fn one_block(threads: u32) -> Cfg {
    Cfg {
        grid: (1, 1, 1),
        block: (threads, 1, 1),
        shmem: 0,
    }
}

/// One warp per row, 8 rows a block.
pub(crate) fn rows(n: usize) -> Cfg {
    Cfg {
        grid: (n.div_ceil(8).max(1) as u32, 1, 1),
        block: (256, 1, 1),
        shmem: 0,
    }
}

pub(crate) fn i(x: usize) -> Res<Arg> {
    Ok(Arg::I(i32::try_from(x).map_err(|_| {
        format!("dimension {x} does not fit the kernels' int")
    })?))
}

/// Buffers that live for the run.
pub struct State {
    pub params: Tid,
    pub grads: Tid,
    pub m: Tid,
    pub v: Tid,
    /// Per-step mean loss and gradient norm (f32 each), read at the end.
    pub losses: Tid,
    pub norms: Tid,
    /// One f32: the sum of squared gradients of the current step.
    pub sumsq: Tid,
    /// bf16 copy of the parameters (mixed precision only).
    pub params16: Option<Tid>,
}

pub struct Trainer<'a, D: Dev> {
    pub(crate) d: &'a mut D,
    pub(crate) lay: &'a Layout,
    pub(crate) st: &'a State,
    pub(crate) bf16: bool,
    hyper: Hyper,
    pub(crate) cfg: Config,
    /// Mixed precision: a bf16 copy of an f32 buffer (source, copy,
    /// elements) that GEMMs read instead of casting the source again.
    shared16: Option<(Tid, Tid, usize)>,
}

impl<'a, D: Dev> Trainer<'a, D> {
    /// Allocates the run's buffers and uploads the weights (`None`: the
    /// dry run, which only allocates).
    pub fn setup(
        d: &mut D,
        lay: &Layout,
        weights: Option<&[f32]>,
        steps: usize,
        bf16: bool,
    ) -> Res<State> {
        let bytes = F * lay.total as u64;
        let params = d.alloc(bytes)?;
        let grads = d.alloc(bytes)?;
        let m = d.alloc(bytes)?;
        let v = d.alloc(bytes)?;
        let losses = d.alloc(F * steps.max(1) as u64)?;
        let norms = d.alloc(F * steps.max(1) as u64)?;
        let sumsq = d.alloc(F)?;
        let params16 = if bf16 {
            Some(d.alloc(2 * lay.total as u64)?)
        } else {
            None
        };
        if let Some(w) = weights {
            d.upload(params, cuarena::bytemuck::cast_slice(w))?;
        }
        for t in [m, v] {
            d.launch(
                Kernel::FillZero,
                ew(lay.total),
                &[Arg::W(Ptr::of(t)), Arg::U(lay.total as u64)],
            )?;
        }
        Ok(State {
            params,
            grads,
            m,
            v,
            losses,
            norms,
            sumsq,
            params16,
        })
    }

    pub fn new(d: &'a mut D, lay: &'a Layout, st: &'a State, hyper: Hyper, bf16: bool) -> Self {
        Self {
            d,
            lay,
            st,
            bf16,
            hyper,
            cfg: lay.cfg,
            shared16: None,
        }
    }

    pub(crate) fn p(&self, at: usize) -> Ptr {
        Ptr::of(self.st.params).at(at)
    }

    pub(crate) fn g(&self, at: usize) -> Ptr {
        Ptr::of(self.st.grads).at(at)
    }

    pub(crate) fn alloc(&mut self, elems: usize) -> Res<Tid> {
        self.d.alloc(F * elems as u64)
    }

    pub(crate) fn free(&mut self, ts: &[Tid]) -> Res<()> {
        ts.iter().try_for_each(|&t| self.d.free(t))
    }

    pub(crate) fn run(&mut self, k: Kernel, cfg: Cfg, args: &[Arg]) -> Res<()> {
        self.d.launch(k, cfg, args)
    }

    pub(crate) fn zero(&mut self, p: Ptr, n: usize) -> Res<()> {
        self.run(Kernel::FillZero, ew(n), &[Arg::W(p), Arg::U(n as u64)])
    }

    /// Column-major C (m x n) = op(A) op(B), one matrix; each operand is
    /// its address and its leading dimension; `a`, `b` are f32. In mixed
    /// precision A and B are rounded to bf16 first (parameters come from
    /// the bf16 copy made after each update), as autocast does.
    pub(crate) fn mm(
        &mut self,
        ta: bool,
        tb: bool,
        mnk: (usize, usize, usize),
        (a, lda): (Ptr, usize),
        (b, ldb): (Ptr, usize),
        (c, ldc): (Ptr, usize),
    ) -> Res<()> {
        self.bmm(ta, tb, mnk, (a, lda, 0), (b, ldb, 0), (c, ldc, 0), 1)
    }

    /// Batched: `batch` matrices, each operand's at a stride (in elements)
    /// after its leading dimension.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bmm(
        &mut self,
        ta: bool,
        tb: bool,
        (m, n, k): (usize, usize, usize),
        (a, lda, sa): (Ptr, usize, usize),
        (b, ldb, sb): (Ptr, usize, usize),
        (c, ldc, sc): (Ptr, usize, usize),
        batch: usize,
    ) -> Res<()> {
        let g = Gemm {
            ta,
            tb,
            m,
            n,
            k,
            a,
            lda,
            sa,
            b,
            ldb,
            sb,
            c,
            ldc,
            sc,
            batch,
            alpha: 1.0,
            beta: 0.0,
            ab: Ab::F32,
        };
        // Elements of A and B the GEMM reads (what a bf16 copy must hold).
        let (a_n, b_n) = if batch == 1 {
            (m * k, k * n)
        } else {
            (sa * batch, sb * batch)
        };
        self.gemm(g, a_n, b_n)
    }

    /// Runs `g`; in mixed precision through bf16 copies of A and B
    /// (`a_n`, `b_n` elements), or the bf16 parameter copy for parameters.
    fn gemm(&mut self, mut g: Gemm, a_n: usize, b_n: usize) -> Res<()> {
        if !self.bf16 {
            return self.d.gemm(&g);
        }
        let mut temps = Vec::new();
        // bf16 copies the GEMMs read in place of their f32 sources: the
        // parameters' (refreshed after each update) and a shared one.
        let params16 = self
            .st
            .params16
            .map(|c| (self.st.params, c, self.lay.total));
        for (p, n) in [(&mut g.a, a_n), (&mut g.b, b_n)] {
            let copy = params16
                .into_iter()
                .chain(self.shared16)
                .find(|&(src, _, len)| p.t == src && p.off / F + n as u64 <= len as u64);
            if let Some((_, copy, _)) = copy {
                *p = Ptr {
                    t: copy,
                    off: p.off / 2,
                };
                continue;
            }
            let t = self.d.alloc(2 * n as u64)?;
            self.d.launch(
                Kernel::ToBf16,
                ew(n),
                &[Arg::W(Ptr::of(t)), Arg::R(*p), Arg::U(n as u64)],
            )?;
            temps.push(t);
            *p = Ptr::of(t);
        }
        g.ab = Ab::Bf16;
        self.d.gemm(&g)?;
        self.free(&temps)
    }

    /// Mixed precision: one bf16 copy of `t` (`n` f32 elements) for the
    /// GEMMs until [`Self::unshare16`], instead of one cast per GEMM.
    fn share16(&mut self, t: Tid, n: usize) -> Res<()> {
        if !self.bf16 {
            return Ok(());
        }
        self.unshare16()?;
        let copy = self.d.alloc(2 * n as u64)?;
        self.d.launch(
            Kernel::ToBf16,
            ew(n),
            &[Arg::W(Ptr::of(copy)), Arg::R(Ptr::of(t)), Arg::U(n as u64)],
        )?;
        self.shared16 = Some((t, copy, n));
        Ok(())
    }

    fn unshare16(&mut self) -> Res<()> {
        match self.shared16.take() {
            Some((_, copy, _)) => self.d.free(copy),
            None => Ok(()),
        }
    }

    /// Forward and backward of one batch, then the update: the step's mean
    /// loss and gradient norm land in `losses[step]`, `norms[step]`.
    /// `check` runs between the backward pass and the update (the
    /// gradients are complete there). Data parallel: `batch` is this
    /// rank's rows of a global batch of `global_rows` rows (the loss and its
    /// gradient are means over the global batch; the gradient buckets are
    /// summed over the ranks).
    pub fn step(
        &mut self,
        step: usize,
        batch: &Batch,
        global_rows: usize,
        check: &mut dyn FnMut(&mut D, &State) -> Res<()>,
    ) -> Res<()> {
        let (b, t) = (batch.b, batch.t);
        let global = (global_rows * t) as f32;
        let inv = 1.0 / global;
        let Config { vocab: v, c, .. } = self.cfg;
        let n = b * t;
        let tok = self.d.alloc(4 * batch.tokens.len() as u64)?;
        self.d
            .upload(tok, cuarena::bytemuck::cast_slice(&batch.tokens))?;
        if self.bf16 {
            let p16 = self.st.params16.ok_or("no bf16 parameters")?;
            let total = self.lay.total;
            self.run(
                Kernel::ToBf16,
                ew(total),
                &[
                    Arg::W(Ptr::of(p16)),
                    Arg::R(self.p(0)),
                    Arg::U(total as u64),
                ],
            )?;
        }
        // Forward.
        let x0 = self.alloc(n * c)?;
        self.run(
            Kernel::EncoderFwd,
            ew(n * c),
            &[
                Arg::W(Ptr::of(x0)),
                Arg::R(Ptr::of(tok)),
                Arg::R(self.p(self.lay.wte)),
                Arg::R(self.p(self.lay.wpe)),
                i(b)?,
                i(t)?,
                i(c)?,
            ],
        )?;
        let mut saved = Vec::with_capacity(self.lay.layers.len());
        let mut res = x0;
        for at in self.lay.layers.clone().iter() {
            let (s, out) = self.layer_fwd(at, res, b, t)?;
            saved.push(s);
            res = out;
        }
        let (lnf, mf, rf) = self.layernorm(res, self.lay.lnfw, self.lay.lnfb, n)?;
        let logits = self.alloc(n * v)?;
        // logits (n x V) = lnf wte^T: column-major logits^T = wte lnf^T.
        self.mm(
            true,
            false,
            (v, n, c),
            (self.p(self.lay.wte), c),
            (Ptr::of(lnf), c),
            (Ptr::of(logits), v),
        )?;
        let row_loss = self.alloc(n)?;
        let ce = Cfg {
            grid: (u32::try_from(n)?, 1, 1),
            block: (512, 1, 1),
            shmem: 0,
        };
        self.run(
            Kernel::CrossEntropy,
            ce,
            &[
                Arg::W(Ptr::of(logits)),
                Arg::W(Ptr::of(row_loss)),
                Arg::R(Ptr::of(tok)),
                i(b)?,
                i(t)?,
                i(v)?,
                Arg::F(inv),
            ],
        )?;
        self.run(
            Kernel::MeanInto,
            one_block(1024),
            &[
                Arg::W(Ptr::of(self.st.losses).at(step)),
                Arg::R(Ptr::of(row_loss)),
                i(n)?,
                Arg::F(global),
            ],
        )?;
        self.free(&[row_loss])?;

        // Backward: logits now hold d loss / d logits.
        self.zero(self.g(0), self.lay.total)?;
        let dlnf = self.alloc(n * c)?;
        // Both GEMMs below read d logits (the largest operand of the step).
        self.share16(logits, n * v)?;
        self.mm(
            false,
            false,
            (c, n, v),
            (self.p(self.lay.wte), c),
            (Ptr::of(logits), v),
            (Ptr::of(dlnf), c),
        )?;
        self.mm(
            false,
            true,
            (c, v, n),
            (Ptr::of(lnf), c),
            (Ptr::of(logits), v),
            (self.g(self.lay.wte), c),
        )?;
        self.unshare16()?;
        self.free(&[logits])?;
        let dres = self.alloc(n * c)?;
        self.zero(Ptr::of(dres), n * c)?;
        self.layernorm_bwd(dres, self.lay.lnfw, self.lay.lnfb, dlnf, res, mf, rf, n)?;
        self.free(&[dlnf, lnf, mf, rf, res])?;
        // Gradient buckets, summed over ranks as soon as they are complete:
        // ln_f, each layer (last first: its parameters are contiguous), and
        // the embeddings after the encoder's backward pass.
        let buckets = self.lay.buckets();
        let (at, len) = buckets.lnf;
        self.d.reduce(self.g(at), len)?;
        for (l, s) in saved.into_iter().enumerate().rev() {
            let lat = self.lay.layers[l];
            self.layer_bwd(&lat, s, dres, b, t)?;
            let (at, len) = buckets.layers[l];
            self.d.reduce(self.g(at), len)?;
        }
        self.run(
            Kernel::EncoderBwd,
            ew(n * c),
            &[
                Arg::W(self.g(self.lay.wte)),
                Arg::W(self.g(self.lay.wpe)),
                Arg::R(Ptr::of(dres)),
                Arg::R(Ptr::of(tok)),
                i(b)?,
                i(t)?,
                i(c)?,
            ],
        )?;
        self.free(&[dres, tok])?;
        let (at, len) = buckets.embeddings;
        self.d.reduce(self.g(at), len)?;
        self.d.reduce_wait()?;
        check(&mut *self.d, self.st)?;
        self.update(step)
    }

    /// clip_grad_norm_ and AdamW, on the device (no host round trip).
    fn update(&mut self, step: usize) -> Res<()> {
        let total = self.lay.total;
        self.zero(Ptr::of(self.st.sumsq), 1)?;
        let red = Cfg {
            grid: (1024, 1, 1),
            block: (512, 1, 1),
            shmem: 0,
        };
        self.run(
            Kernel::SumSquares,
            red,
            &[
                Arg::W(Ptr::of(self.st.sumsq)),
                Arg::R(self.g(0)),
                Arg::U(total as u64),
            ],
        )?;
        let one = one_block(32);
        self.run(
            Kernel::StoreNorm,
            one,
            &[
                Arg::W(Ptr::of(self.st.norms).at(step)),
                Arg::R(Ptr::of(self.st.sumsq)),
            ],
        )?;
        let Hyper {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            grad_clip,
        } = self.hyper;
        let k = (step + 1) as i32;
        let bc1 = 1.0 - (beta1 as f64).powi(k);
        let bc2 = 1.0 - (beta2 as f64).powi(k);
        let args = [
            Arg::W(self.p(0)),
            Arg::W(Ptr::of(self.st.m)),
            Arg::W(Ptr::of(self.st.v)),
            Arg::R(self.g(0)),
            Arg::R(Ptr::of(self.st.sumsq)),
            Arg::U(total as u64),
            Arg::F(lr),
            Arg::F(beta1),
            Arg::F(beta2),
            Arg::F(eps),
            Arg::F(weight_decay),
            Arg::F(bc1 as f32),
            Arg::F(bc2.sqrt() as f32),
            Arg::F(grad_clip),
        ];
        self.run(Kernel::Adamw, ew(total), &args)
    }
}
