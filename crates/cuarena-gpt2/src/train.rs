//! One training step of GPT-2 on a [`Dev`]: forward, cross-entropy,
//! backward, gradient clipping and AdamW, written once for the arena, plain
//! allocations and the metadata dry run. Every buffer is allocated at its
//! step's shape when first needed and freed as soon as it is dead, as a
//! framework's caching allocator would see it: weights, gradients and
//! moments live for the run; activations for their layer's backward pass;
//! attention matrices (B * heads * T * T) for one layer's forward or
//! backward (the backward pass recomputes them from q and k).

use crate::dev::{Ab, Arg, Cfg, Dev, Gemm, Kernel, Ptr, Tid};
use crate::model::{Batch, Config, Hyper, LayerAt, Layout};
use crate::Res;

const F: u64 = 4;

/// Grid-stride elementwise launch over `n` elements.
fn ew(n: usize) -> Cfg {
    Cfg {
        grid: (n.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
        block: (256, 1, 1),
        shmem: 0,
    }
}

/// One warp per row, 8 rows a block.
fn rows(n: usize) -> Cfg {
    Cfg {
        grid: (n.div_ceil(8).max(1) as u32, 1, 1),
        block: (256, 1, 1),
        shmem: 0,
    }
}

fn i(x: usize) -> Res<Arg> {
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

/// What a layer's forward pass keeps for its backward pass.
struct Saved {
    res_in: Tid,
    ln1: Tid,
    m1: Tid,
    r1: Tid,
    qkv: Tid,
    atty: Tid,
    res_mid: Tid,
    ln2: Tid,
    m2: Tid,
    r2: Tid,
    fch: Tid,
    fcg: Tid,
}

pub struct Trainer<'a, D: Dev> {
    pub d: &'a mut D,
    pub lay: &'a Layout,
    pub st: &'a State,
    pub bf16: bool,
    hyper: Hyper,
    cfg: Config,
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
            d.upload(params, bytemuck_f32(w))?;
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
        }
    }

    fn p(&self, at: usize) -> Ptr {
        Ptr::of(self.st.params).at(at)
    }

    fn g(&self, at: usize) -> Ptr {
        Ptr::of(self.st.grads).at(at)
    }

    fn alloc(&mut self, elems: usize) -> Res<Tid> {
        self.d.alloc(F * elems as u64)
    }

    fn free(&mut self, ts: &[Tid]) -> Res<()> {
        ts.iter().try_for_each(|&t| self.d.free(t))
    }

    fn run(&mut self, k: Kernel, cfg: Cfg, args: &[Arg]) -> Res<()> {
        self.d.launch(k, cfg, args)
    }

    fn zero(&mut self, p: Ptr, n: usize) -> Res<()> {
        self.run(Kernel::FillZero, ew(n), &[Arg::W(p), Arg::U(n as u64)])
    }

    /// Column-major C (m x n) = op(A) op(B), one matrix; `a`, `b` are f32.
    /// In mixed precision A and B are rounded to bf16 first (parameters
    /// come from the bf16 copy made after each update), as autocast does.
    #[allow(clippy::too_many_arguments)]
    fn mm(
        &mut self,
        ta: bool,
        tb: bool,
        (m, n, k): (usize, usize, usize),
        a: Ptr,
        lda: usize,
        b: Ptr,
        ldb: usize,
        c: Ptr,
        ldc: usize,
    ) -> Res<()> {
        let g = Gemm {
            ta,
            tb,
            m,
            n,
            k,
            a,
            lda,
            sa: 0,
            b,
            ldb,
            sb: 0,
            c,
            ldc,
            sc: 0,
            batch: 1,
            alpha: 1.0,
            beta: 0.0,
            ab: Ab::F32,
        };
        let (a_n, b_n) = (m * k, k * n);
        self.gemm(g, a_n, b_n)
    }

    /// Batched: `batch` matrices at strides (in elements) `sa`, `sb`, `sc`.
    #[allow(clippy::too_many_arguments)]
    fn bmm(
        &mut self,
        ta: bool,
        tb: bool,
        (m, n, k): (usize, usize, usize),
        a: Ptr,
        lda: usize,
        sa: usize,
        b: Ptr,
        ldb: usize,
        sb: usize,
        c: Ptr,
        ldc: usize,
        sc: usize,
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
        self.gemm(g, sa * batch, sb * batch)
    }

    /// Runs `g`; in mixed precision through bf16 copies of A and B
    /// (`a_n`, `b_n` elements), or the bf16 parameter copy for parameters.
    fn gemm(&mut self, mut g: Gemm, a_n: usize, b_n: usize) -> Res<()> {
        if !self.bf16 {
            return self.d.gemm(&g);
        }
        let mut temps = Vec::new();
        for (p, n) in [(&mut g.a, a_n), (&mut g.b, b_n)] {
            if p.t == self.st.params {
                let p16 = self.st.params16.ok_or("no bf16 parameters")?;
                *p = Ptr {
                    t: p16,
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

    fn layernorm(&mut self, x: Tid, w: usize, b: usize, n: usize) -> Res<(Tid, Tid, Tid)> {
        let c = self.cfg.c;
        let (out, mean, rstd) = (self.alloc(n * c)?, self.alloc(n)?, self.alloc(n)?);
        let args = [
            Arg::W(Ptr::of(out)),
            Arg::W(Ptr::of(mean)),
            Arg::W(Ptr::of(rstd)),
            Arg::R(Ptr::of(x)),
            Arg::R(self.p(w)),
            Arg::R(self.p(b)),
            i(n)?,
            i(c)?,
        ];
        self.run(Kernel::LayernormFwd, rows(n), &args)?;
        Ok((out, mean, rstd))
    }

    #[allow(clippy::too_many_arguments)]
    fn layernorm_bwd(
        &mut self,
        dres: Tid,
        w: usize,
        b: usize,
        dout: Tid,
        x: Tid,
        mean: Tid,
        rstd: Tid,
        n: usize,
    ) -> Res<()> {
        let c = self.cfg.c;
        let cfg = Cfg {
            grid: (n.div_ceil(16).clamp(1, 264) as u32, 1, 1),
            block: (512, 1, 1),
            shmem: (2 * c * 4) as u32,
        };
        let args = [
            Arg::W(Ptr::of(dres)),
            Arg::W(self.g(w)),
            Arg::W(self.g(b)),
            Arg::R(Ptr::of(dout)),
            Arg::R(Ptr::of(x)),
            Arg::R(self.p(w)),
            Arg::R(Ptr::of(mean)),
            Arg::R(Ptr::of(rstd)),
            i(n)?,
            i(c)?,
        ];
        self.run(Kernel::LayernormBwd, cfg, &args)
    }

    fn col_sum(&mut self, out: Ptr, x: Tid, n: usize, c: usize) -> Res<()> {
        let cfg = Cfg {
            grid: (c.div_ceil(32) as u32, (n / 256).clamp(1, 64) as u32, 1),
            block: (32, 8, 1),
            shmem: 0,
        };
        self.run(
            Kernel::ColSum,
            cfg,
            &[Arg::W(out), Arg::R(Ptr::of(x)), i(n)?, i(c)?],
        )
    }

    /// q, k, v (B, NH, T, HS) from qkv, and the causal softmax of q k^T.
    fn attention_probs(&mut self, qkv: Tid, b: usize, t: usize) -> Res<[Tid; 4]> {
        let (c, nh) = (self.cfg.c, self.cfg.heads);
        let hs = c / nh;
        let n = b * t;
        let (q, k, v) = (self.alloc(n * c)?, self.alloc(n * c)?, self.alloc(n * c)?);
        let args = [
            Arg::W(Ptr::of(q)),
            Arg::W(Ptr::of(k)),
            Arg::W(Ptr::of(v)),
            Arg::R(Ptr::of(qkv)),
            i(b)?,
            i(t)?,
            i(nh)?,
            i(hs)?,
        ];
        self.run(Kernel::SplitHeads, ew(n * c), &args)?;
        let att = self.alloc(b * nh * t * t)?;
        // att (row-major T x T per head) = q k^T: column-major att^T = k q^T.
        self.bmm(
            true,
            false,
            (t, t, hs),
            Ptr::of(k),
            hs,
            t * hs,
            Ptr::of(q),
            hs,
            t * hs,
            Ptr::of(att),
            t,
            t * t,
            b * nh,
        )?;
        let scale = 1.0 / (hs as f32).sqrt();
        self.run(
            Kernel::SoftmaxCausal,
            rows(b * nh * t),
            &[Arg::W(Ptr::of(att)), Arg::F(scale), i(b * nh)?, i(t)?],
        )?;
        Ok([q, k, v, att])
    }

    fn layer_fwd(&mut self, at: &LayerAt, res_in: Tid, b: usize, t: usize) -> Res<(Saved, Tid)> {
        let (c, nh) = (self.cfg.c, self.cfg.heads);
        let (hs, n) = (c / nh, b * t);
        let (ln1, m1, r1) = self.layernorm(res_in, at.ln1w, at.ln1b, n)?;
        let qkv = self.alloc(n * 3 * c)?;
        self.mm(
            false,
            false,
            (3 * c, n, c),
            self.p(at.qkvw),
            3 * c,
            Ptr::of(ln1),
            c,
            Ptr::of(qkv),
            3 * c,
        )?;
        self.run(
            Kernel::AddBias,
            ew(n * 3 * c),
            &[
                Arg::W(Ptr::of(qkv)),
                Arg::R(self.p(at.qkvb)),
                i(n)?,
                i(3 * c)?,
            ],
        )?;
        let [q, k, v, att] = self.attention_probs(qkv, b, t)?;
        let yh = self.alloc(n * c)?;
        // y = att v: column-major y^T = v^T att^T.
        self.bmm(
            false,
            false,
            (hs, t, t),
            Ptr::of(v),
            hs,
            t * hs,
            Ptr::of(att),
            t,
            t * t,
            Ptr::of(yh),
            hs,
            t * hs,
            b * nh,
        )?;
        self.free(&[att, q, k, v])?;
        let atty = self.alloc(n * c)?;
        self.run(
            Kernel::HeadsToRows,
            ew(n * c),
            &[
                Arg::W(Ptr::of(atty)),
                Arg::R(Ptr::of(yh)),
                i(b)?,
                i(t)?,
                i(nh)?,
                i(hs)?,
                i(0)?,
            ],
        )?;
        self.free(&[yh])?;
        let res_mid = self.proj_residual(res_in, atty, at.projw, at.projb, c, n)?;
        let (ln2, m2, r2) = self.layernorm(res_mid, at.ln2w, at.ln2b, n)?;
        let fch = self.alloc(n * 4 * c)?;
        self.mm(
            false,
            false,
            (4 * c, n, c),
            self.p(at.fcw),
            4 * c,
            Ptr::of(ln2),
            c,
            Ptr::of(fch),
            4 * c,
        )?;
        let fcg = self.alloc(n * 4 * c)?;
        self.run(
            Kernel::BiasGelu,
            ew(n * 4 * c),
            &[
                Arg::W(Ptr::of(fch)),
                Arg::W(Ptr::of(fcg)),
                Arg::R(self.p(at.fcb)),
                i(n)?,
                i(4 * c)?,
            ],
        )?;
        let res_out = self.proj_residual(res_mid, fcg, at.fcprojw, at.fcprojb, 4 * c, n)?;
        let saved = Saved {
            res_in,
            ln1,
            m1,
            r1,
            qkv,
            atty,
            res_mid,
            ln2,
            m2,
            r2,
            fch,
            fcg,
        };
        Ok((saved, res_out))
    }

    /// res + x W + bias, x of `k` columns.
    fn proj_residual(
        &mut self,
        res: Tid,
        x: Tid,
        w: usize,
        bias: usize,
        k: usize,
        n: usize,
    ) -> Res<Tid> {
        let c = self.cfg.c;
        let y = self.alloc(n * c)?;
        self.mm(
            false,
            false,
            (c, n, k),
            self.p(w),
            c,
            Ptr::of(x),
            k,
            Ptr::of(y),
            c,
        )?;
        let out = self.alloc(n * c)?;
        let args = [
            Arg::W(Ptr::of(out)),
            Arg::R(Ptr::of(res)),
            Arg::R(Ptr::of(y)),
            Arg::R(self.p(bias)),
            i(n)?,
            i(c)?,
        ];
        self.run(Kernel::ResidualBias, ew(n * c), &args)?;
        self.free(&[y])?;
        Ok(out)
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
        self.d.upload(tok, bytemuck_i32(&batch.tokens))?;
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
            self.p(self.lay.wte),
            c,
            Ptr::of(lnf),
            c,
            Ptr::of(logits),
            v,
        )?;
        let row_loss = self.alloc(n)?;
        let ce = Cfg {
            grid: (n as u32, 1, 1),
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
        let one = Cfg {
            grid: (1, 1, 1),
            block: (1024, 1, 1),
            shmem: 0,
        };
        self.run(
            Kernel::MeanInto,
            one,
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
        self.mm(
            false,
            false,
            (c, n, v),
            self.p(self.lay.wte),
            c,
            Ptr::of(logits),
            v,
            Ptr::of(dlnf),
            c,
        )?;
        self.mm(
            false,
            true,
            (c, v, n),
            Ptr::of(lnf),
            c,
            Ptr::of(logits),
            v,
            self.g(self.lay.wte),
            c,
        )?;
        self.free(&[logits])?;
        let dres = self.alloc(n * c)?;
        self.zero(Ptr::of(dres), n * c)?;
        self.layernorm_bwd(dres, self.lay.lnfw, self.lay.lnfb, dlnf, res, mf, rf, n)?;
        self.free(&[dlnf, lnf, mf, rf, res])?;
        // Gradient buckets, summed over ranks as soon as they are complete:
        // ln_f, each layer (last first: its parameters are contiguous), and
        // the embeddings after the encoder's backward pass.
        self.d.reduce(self.g(self.lay.lnfw), 2 * c)?;
        for (l, s) in saved.into_iter().enumerate().rev() {
            let at = self.lay.layers[l];
            self.layer_bwd(&at, s, dres, b, t)?;
            self.d.reduce(self.g(at.ln1w), at.fcprojb + c - at.ln1w)?;
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
        self.d.reduce(
            self.g(self.lay.wte),
            self.lay.wpe + self.cfg.ctx * c - self.lay.wte,
        )?;
        self.d.reduce_wait()?;
        check(&mut *self.d, self.st)?;
        self.update(step)
    }

    fn layer_bwd(&mut self, at: &LayerAt, s: Saved, dres: Tid, b: usize, t: usize) -> Res<()> {
        let (c, nh) = (self.cfg.c, self.cfg.heads);
        let (hs, n) = (c / nh, b * t);
        // MLP: res_out = res_mid + gelu(ln2 W_fc + b_fc) W_proj + b_proj.
        let dfcg = self.alloc(n * 4 * c)?;
        self.mm(
            true,
            false,
            (4 * c, n, c),
            self.p(at.fcprojw),
            c,
            Ptr::of(dres),
            c,
            Ptr::of(dfcg),
            4 * c,
        )?;
        self.mm(
            false,
            true,
            (c, 4 * c, n),
            Ptr::of(dres),
            c,
            Ptr::of(s.fcg),
            4 * c,
            self.g(at.fcprojw),
            c,
        )?;
        self.col_sum(self.g(at.fcprojb), dres, n, c)?;
        self.free(&[s.fcg])?;
        self.run(
            Kernel::GeluBwd,
            ew(n * 4 * c),
            &[
                Arg::W(Ptr::of(dfcg)),
                Arg::R(Ptr::of(s.fch)),
                Arg::U((n * 4 * c) as u64),
            ],
        )?;
        self.free(&[s.fch])?;
        let dln2 = self.alloc(n * c)?;
        self.mm(
            true,
            false,
            (c, n, 4 * c),
            self.p(at.fcw),
            4 * c,
            Ptr::of(dfcg),
            4 * c,
            Ptr::of(dln2),
            c,
        )?;
        self.mm(
            false,
            true,
            (4 * c, c, n),
            Ptr::of(dfcg),
            4 * c,
            Ptr::of(s.ln2),
            c,
            self.g(at.fcw),
            4 * c,
        )?;
        self.col_sum(self.g(at.fcb), dfcg, n, 4 * c)?;
        self.free(&[dfcg, s.ln2])?;
        self.layernorm_bwd(dres, at.ln2w, at.ln2b, dln2, s.res_mid, s.m2, s.r2, n)?;
        self.free(&[dln2, s.m2, s.r2, s.res_mid])?;
        // Attention: res_mid = res_in + attn(ln1) W_proj + b_proj.
        let datty = self.alloc(n * c)?;
        self.mm(
            true,
            false,
            (c, n, c),
            self.p(at.projw),
            c,
            Ptr::of(dres),
            c,
            Ptr::of(datty),
            c,
        )?;
        self.mm(
            false,
            true,
            (c, c, n),
            Ptr::of(dres),
            c,
            Ptr::of(s.atty),
            c,
            self.g(at.projw),
            c,
        )?;
        self.col_sum(self.g(at.projb), dres, n, c)?;
        self.free(&[s.atty])?;
        let [q, k, v, att] = self.attention_probs(s.qkv, b, t)?;
        let dyh = self.alloc(n * c)?;
        self.run(
            Kernel::HeadsToRows,
            ew(n * c),
            &[
                Arg::W(Ptr::of(dyh)),
                Arg::R(Ptr::of(datty)),
                i(b)?,
                i(t)?,
                i(nh)?,
                i(hs)?,
                i(1)?,
            ],
        )?;
        self.free(&[datty])?;
        let (bh, tt, th) = (b * nh, t * t, t * hs);
        let datt = self.alloc(bh * tt)?;
        // datt = dy v^T (as q k^T); dv = att^T dy.
        self.bmm(
            true,
            false,
            (t, t, hs),
            Ptr::of(v),
            hs,
            th,
            Ptr::of(dyh),
            hs,
            th,
            Ptr::of(datt),
            t,
            tt,
            bh,
        )?;
        let dv = self.alloc(n * c)?;
        self.bmm(
            false,
            true,
            (hs, t, t),
            Ptr::of(dyh),
            hs,
            th,
            Ptr::of(att),
            t,
            tt,
            Ptr::of(dv),
            hs,
            th,
            bh,
        )?;
        let scale = 1.0 / (hs as f32).sqrt();
        self.run(
            Kernel::SoftmaxCausalBwd,
            rows(bh * t),
            &[
                Arg::W(Ptr::of(datt)),
                Arg::R(Ptr::of(att)),
                Arg::F(scale),
                i(bh)?,
                i(t)?,
            ],
        )?;
        self.free(&[att])?;
        // dq = dpre k; dk = dpre^T q.
        let dq = self.alloc(n * c)?;
        self.bmm(
            false,
            false,
            (hs, t, t),
            Ptr::of(k),
            hs,
            th,
            Ptr::of(datt),
            t,
            tt,
            Ptr::of(dq),
            hs,
            th,
            bh,
        )?;
        let dk = self.alloc(n * c)?;
        self.bmm(
            false,
            true,
            (hs, t, t),
            Ptr::of(q),
            hs,
            th,
            Ptr::of(datt),
            t,
            tt,
            Ptr::of(dk),
            hs,
            th,
            bh,
        )?;
        self.free(&[datt, q, k, v, dyh])?;
        let dqkv = self.alloc(n * 3 * c)?;
        self.run(
            Kernel::MergeHeads3,
            ew(n * c),
            &[
                Arg::W(Ptr::of(dqkv)),
                Arg::R(Ptr::of(dq)),
                Arg::R(Ptr::of(dk)),
                Arg::R(Ptr::of(dv)),
                i(b)?,
                i(t)?,
                i(nh)?,
                i(hs)?,
            ],
        )?;
        self.free(&[dq, dk, dv])?;
        let dln1 = self.alloc(n * c)?;
        self.mm(
            true,
            false,
            (c, n, 3 * c),
            self.p(at.qkvw),
            3 * c,
            Ptr::of(dqkv),
            3 * c,
            Ptr::of(dln1),
            c,
        )?;
        self.mm(
            false,
            true,
            (3 * c, c, n),
            Ptr::of(dqkv),
            3 * c,
            Ptr::of(s.ln1),
            c,
            self.g(at.qkvw),
            3 * c,
        )?;
        self.col_sum(self.g(at.qkvb), dqkv, n, 3 * c)?;
        self.free(&[dqkv, s.qkv, s.ln1])?;
        self.layernorm_bwd(dres, at.ln1w, at.ln1b, dln1, s.res_in, s.m1, s.r1, n)?;
        self.free(&[dln1, s.m1, s.r1, s.res_in])
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
        let one = Cfg {
            grid: (1, 1, 1),
            block: (32, 1, 1),
            shmem: 0,
        };
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

pub fn bytemuck_f32(x: &[f32]) -> &[u8] {
    cuarena::bytemuck::cast_slice(x)
}

pub fn bytemuck_i32(x: &[i32]) -> &[u8] {
    cuarena::bytemuck::cast_slice(x)
}
