//! A transformer layer's forward and backward passes, and the layer norm
//! and attention they are made of, as methods of [`Trainer`].

use crate::dev::{Arg, Cfg, Dev, Kernel, Ptr, Tid};
use crate::model::LayerAt;
use crate::train::{ew, i, rows, Trainer};
use crate::Res;

/// What a layer's forward pass keeps for its backward pass.
pub(crate) struct Saved {
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

impl<D: Dev> Trainer<'_, D> {
    pub(crate) fn layernorm(
        &mut self,
        x: Tid,
        w: usize,
        b: usize,
        n: usize,
    ) -> Res<(Tid, Tid, Tid)> {
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
    pub(crate) fn layernorm_bwd(
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
            (Ptr::of(k), hs, t * hs),
            (Ptr::of(q), hs, t * hs),
            (Ptr::of(att), t, t * t),
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

    pub(crate) fn layer_fwd(
        &mut self,
        at: &LayerAt,
        res_in: Tid,
        b: usize,
        t: usize,
    ) -> Res<(Saved, Tid)> {
        let (c, nh) = (self.cfg.c, self.cfg.heads);
        let (hs, n) = (c / nh, b * t);
        let (ln1, m1, r1) = self.layernorm(res_in, at.ln1w, at.ln1b, n)?;
        let qkv = self.alloc(n * 3 * c)?;
        self.mm(
            false,
            false,
            (3 * c, n, c),
            (self.p(at.qkvw), 3 * c),
            (Ptr::of(ln1), c),
            (Ptr::of(qkv), 3 * c),
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
            (Ptr::of(v), hs, t * hs),
            (Ptr::of(att), t, t * t),
            (Ptr::of(yh), hs, t * hs),
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
            (self.p(at.fcw), 4 * c),
            (Ptr::of(ln2), c),
            (Ptr::of(fch), 4 * c),
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
            (self.p(w), c),
            (Ptr::of(x), k),
            (Ptr::of(y), c),
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

    pub(crate) fn layer_bwd(
        &mut self,
        at: &LayerAt,
        s: Saved,
        dres: Tid,
        b: usize,
        t: usize,
    ) -> Res<()> {
        let (c, nh) = (self.cfg.c, self.cfg.heads);
        let (hs, n) = (c / nh, b * t);
        // MLP: res_out = res_mid + gelu(ln2 W_fc + b_fc) W_proj + b_proj.
        let dfcg = self.alloc(n * 4 * c)?;
        self.mm(
            true,
            false,
            (4 * c, n, c),
            (self.p(at.fcprojw), c),
            (Ptr::of(dres), c),
            (Ptr::of(dfcg), 4 * c),
        )?;
        self.mm(
            false,
            true,
            (c, 4 * c, n),
            (Ptr::of(dres), c),
            (Ptr::of(s.fcg), 4 * c),
            (self.g(at.fcprojw), c),
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
            (self.p(at.fcw), 4 * c),
            (Ptr::of(dfcg), 4 * c),
            (Ptr::of(dln2), c),
        )?;
        self.mm(
            false,
            true,
            (4 * c, c, n),
            (Ptr::of(dfcg), 4 * c),
            (Ptr::of(s.ln2), c),
            (self.g(at.fcw), 4 * c),
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
            (self.p(at.projw), c),
            (Ptr::of(dres), c),
            (Ptr::of(datty), c),
        )?;
        self.mm(
            false,
            true,
            (c, c, n),
            (Ptr::of(dres), c),
            (Ptr::of(s.atty), c),
            (self.g(at.projw), c),
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
            (Ptr::of(v), hs, th),
            (Ptr::of(dyh), hs, th),
            (Ptr::of(datt), t, tt),
            bh,
        )?;
        let dv = self.alloc(n * c)?;
        self.bmm(
            false,
            true,
            (hs, t, t),
            (Ptr::of(dyh), hs, th),
            (Ptr::of(att), t, tt),
            (Ptr::of(dv), hs, th),
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
            (Ptr::of(k), hs, th),
            (Ptr::of(datt), t, tt),
            (Ptr::of(dq), hs, th),
            bh,
        )?;
        let dk = self.alloc(n * c)?;
        self.bmm(
            false,
            true,
            (hs, t, t),
            (Ptr::of(q), hs, th),
            (Ptr::of(datt), t, tt),
            (Ptr::of(dk), hs, th),
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
            (self.p(at.qkvw), 3 * c),
            (Ptr::of(dqkv), 3 * c),
            (Ptr::of(dln1), c),
        )?;
        self.mm(
            false,
            true,
            (3 * c, c, n),
            (Ptr::of(dqkv), 3 * c),
            (Ptr::of(s.ln1), c),
            (self.g(at.qkvw), 3 * c),
        )?;
        self.col_sum(self.g(at.qkvb), dqkv, n, 3 * c)?;
        self.free(&[dqkv, s.qkv, s.ln1])?;
        self.layernorm_bwd(dres, at.ln1w, at.ln1b, dln1, s.res_in, s.m1, s.r1, n)?;
        self.free(&[dln1, s.m1, s.r1, s.res_in])
    }
}
