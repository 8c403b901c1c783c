//! GPT-2's shapes, where each parameter sits in the one flat parameter
//! buffer (gradients and AdamW's moments use the same offsets), and the
//! run's inputs: initial weights and token batches, read from the
//! safetensors file `scripts/gpt2_reference.py init` writes (`load.rs`) or
//! made here.

use safetensors::{Dtype, SafeTensors};

use crate::Res;

/// Model dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub vocab: usize,
    pub ctx: usize,
    pub c: usize,
    pub layers: usize,
    pub heads: usize,
}

impl Config {
    /// GPT-2 small: 124M parameters.
    pub const GPT2: Config = Config {
        vocab: 50257,
        ctx: 1024,
        c: 768,
        layers: 12,
        heads: 12,
    };
}

/// AdamW and clipping, as torch.optim.AdamW and clip_grad_norm_ take them.
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub grad_clip: f32,
}

impl Default for Hyper {
    fn default() -> Self {
        Self {
            lr: 3e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
        }
    }
}

/// Element offsets of one layer's parameters in the flat buffer.
#[derive(Debug, Clone, Copy)]
pub struct LayerAt {
    pub ln1w: usize,
    pub ln1b: usize,
    pub qkvw: usize,
    pub qkvb: usize,
    pub projw: usize,
    pub projb: usize,
    pub ln2w: usize,
    pub ln2b: usize,
    pub fcw: usize,
    pub fcb: usize,
    pub fcprojw: usize,
    pub fcprojb: usize,
}

/// Every parameter: its safetensors name (HF's, without "transformer."),
/// shape and element offset; weights of linear layers in HF's Conv1D
/// layout, (in, out) row-major.
#[derive(Debug, Clone)]
pub struct Layout {
    pub cfg: Config,
    pub params: Vec<(String, Vec<usize>, usize)>,
    pub total: usize,
    pub wte: usize,
    pub wpe: usize,
    pub layers: Vec<LayerAt>,
    pub lnfw: usize,
    pub lnfb: usize,
}

impl Layout {
    pub fn new(cfg: Config) -> Self {
        let (c, v) = (cfg.c, cfg.vocab);
        let mut params = Vec::new();
        let mut total = 0;
        let mut add = |name: String, shape: Vec<usize>| {
            let at = total;
            total += shape.iter().product::<usize>();
            params.push((name, shape, at));
            at
        };
        let wte = add("wte.weight".into(), vec![v, c]);
        let wpe = add("wpe.weight".into(), vec![cfg.ctx, c]);
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let mut p = |s: &str, shape: Vec<usize>| add(format!("h.{l}.{s}"), shape);
            layers.push(LayerAt {
                ln1w: p("ln_1.weight", vec![c]),
                ln1b: p("ln_1.bias", vec![c]),
                qkvw: p("attn.c_attn.weight", vec![c, 3 * c]),
                qkvb: p("attn.c_attn.bias", vec![3 * c]),
                projw: p("attn.c_proj.weight", vec![c, c]),
                projb: p("attn.c_proj.bias", vec![c]),
                ln2w: p("ln_2.weight", vec![c]),
                ln2b: p("ln_2.bias", vec![c]),
                fcw: p("mlp.c_fc.weight", vec![c, 4 * c]),
                fcb: p("mlp.c_fc.bias", vec![4 * c]),
                fcprojw: p("mlp.c_proj.weight", vec![4 * c, c]),
                fcprojb: p("mlp.c_proj.bias", vec![c]),
            });
        }
        let lnfw = add("ln_f.weight".into(), vec![c]);
        let lnfb = add("ln_f.bias".into(), vec![c]);
        Self {
            cfg,
            params,
            total,
            wte,
            wpe,
            layers,
            lnfw,
            lnfb,
        }
    }

    /// Reads a flat buffer of this layout from named tensors (`what` says
    /// which file, for errors).
    pub fn gather(&self, st: &SafeTensors, what: &str) -> Res<Vec<f32>> {
        // Every tensor is checked before the buffer is made: its size then
        // comes from bytes the file really holds, not from its metadata.
        let mut views = Vec::with_capacity(self.params.len());
        for (name, shape, _) in &self.params {
            let t = st
                .tensor(name)
                .map_err(|e| format!("{what}: tensor {name}: {e}"))?;
            if t.dtype() != Dtype::F32 || t.shape() != shape.as_slice() {
                return Err(format!(
                    "{what}: tensor {name} is {:?} {:?}, expected F32 {shape:?}",
                    t.dtype(),
                    t.shape()
                )
                .into());
            }
            views.push(t);
        }
        let mut flat = vec![0f32; self.total];
        for ((_, shape, at), t) in self.params.iter().zip(views) {
            let n: usize = shape.iter().product();
            for (dst, src) in flat[*at..at + n]
                .iter_mut()
                .zip(le_words(t.data(), f32::from_le_bytes))
            {
                *dst = src;
            }
        }
        Ok(flat)
    }
}

/// Gradient buckets for data parallel runs, each a contiguous (offset,
/// elements) range of the flat buffer, in the order the backward pass
/// completes them.
#[derive(Debug, Clone)]
pub struct Buckets {
    pub lnf: (usize, usize),
    /// One per layer, in layer order.
    pub layers: Vec<(usize, usize)>,
    /// wte and wpe (complete after the encoder's backward pass).
    pub embeddings: (usize, usize),
}

impl Layout {
    pub fn buckets(&self) -> Buckets {
        let c = self.cfg.c;
        Buckets {
            lnf: (self.lnfw, self.lnfb + c - self.lnfw),
            layers: self
                .layers
                .iter()
                .map(|l| (l.ln1w, l.fcprojb + c - l.ln1w))
                .collect(),
            embeddings: (self.wte, self.wpe + self.cfg.ctx * c - self.wte),
        }
    }
}

/// Little-endian 4-byte words (safetensors' byte order, and the device's)
/// read with `f` (`f32::from_le_bytes`, `i32::from_le_bytes`): file data
/// need not be aligned for a cast.
pub fn le_words<T: 'static>(bytes: &[u8], f: fn([u8; 4]) -> T) -> impl Iterator<Item = T> + '_ {
    bytes
        .chunks_exact(4)
        .map(move |x| f([x[0], x[1], x[2], x[3]]))
}

/// One step's tokens: (b, t + 1) row-major; inputs are the first t of a
/// row, targets the last t.
#[derive(Debug, Clone)]
pub struct Batch {
    pub b: usize,
    pub t: usize,
    pub tokens: Vec<i32>,
}

/// What a run starts from.
pub struct Start {
    pub cfg: Config,
    pub hyper: Hyper,
    pub weights: Vec<f32>,
    pub batches: Vec<Batch>,
}

/// A small deterministic generator for synthetic runs: the test kit's
/// SplitMix64, with normals of its own.
pub struct Rng(cuarena_testkit::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(cuarena_testkit::Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15))
    }
    pub fn next(&mut self) -> u64 {
        self.0.next()
    }
    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0.index_range(lo, hi)
    }
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// A run with no file: GPT-2's initialisation (normal 0.02, projections
/// into the residual stream scaled by 1/sqrt(2 * layers), layer norms 1
/// and 0, biases 0) and text from a fixed random Markov chain where each
/// token has four likely successors, so the loss falls.
pub fn synthetic(
    cfg: Config,
    steps: usize,
    lens: (usize, usize),
    batch: (usize, usize),
    seed: u64,
) -> Start {
    let lay = Layout::new(cfg);
    let mut rng = Rng::new(seed);
    let mut w = vec![0f32; lay.total];
    let proj = 0.02 / (2.0 * cfg.layers as f32).sqrt();
    for (name, shape, at) in &lay.params {
        let n: usize = shape.iter().product();
        let std = if name.ends_with("c_proj.weight") {
            proj
        } else {
            0.02
        };
        if name.contains("ln_") {
            let one = name.ends_with("weight");
            w[*at..at + n].fill(if one { 1.0 } else { 0.0 });
        } else if shape.len() == 2 {
            w[*at..at + n]
                .iter_mut()
                .for_each(|x| *x = std * rng.normal());
        }
    }
    let succ: Vec<[i32; 4]> = (0..cfg.vocab)
        .map(|_| std::array::from_fn(|_| (rng.next() % cfg.vocab as u64) as i32))
        .collect();
    let batches = (0..steps)
        .map(|_| {
            let b = rng.range(batch.0, batch.1);
            let t = rng.range(lens.0, lens.1.min(cfg.ctx));
            let mut tokens = Vec::with_capacity(b * (t + 1));
            for _ in 0..b {
                let mut x = (rng.next() % cfg.vocab as u64) as i32;
                for _ in 0..=t {
                    tokens.push(x);
                    x = if rng.next() % 8 == 0 {
                        (rng.next() % cfg.vocab as u64) as i32
                    } else {
                        succ[x as usize][(rng.next() % 4) as usize]
                    };
                }
            }
            Batch { b, t, tokens }
        })
        .collect();
    Start {
        cfg,
        hyper: Hyper::default(),
        weights: w,
        batches,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets cover every parameter exactly once: after all of them
    /// are summed, every gradient is.
    #[test]
    fn buckets_partition_the_parameters() {
        for cfg in [
            Config::GPT2,
            Config {
                vocab: 97,
                ctx: 48,
                c: 32,
                layers: 3,
                heads: 4,
            },
        ] {
            let lay = Layout::new(cfg);
            let b = lay.buckets();
            let mut ranges: Vec<(usize, usize)> = b.layers.clone();
            ranges.push(b.lnf);
            ranges.push(b.embeddings);
            ranges.sort();
            let mut next = 0;
            for (at, len) in ranges {
                assert_eq!(at, next, "{cfg:?}: a gap or an overlap at {at}");
                assert!(len > 0);
                next = at + len;
            }
            assert_eq!(next, lay.total);
            // Each parameter falls in one bucket.
            for (name, shape, at) in &lay.params {
                let n: usize = shape.iter().product();
                let inside = |r: &(usize, usize)| r.0 <= *at && at + n <= r.0 + r.1;
                let hits = b.layers.iter().filter(|r| inside(r)).count()
                    + usize::from(inside(&b.lnf))
                    + usize::from(inside(&b.embeddings));
                assert_eq!(hits, 1, "{name}");
            }
        }
    }
}
