//! The host side: random numbers, the host math every kernel is checked
//! against, host copies of the networks, and the teacher.

use super::*;

// ---- random numbers -----------------------------------------------------------

/// The test kit's SplitMix64 with Box–Muller normals: seedable, no
/// dependency of the library.
pub struct Rng {
    bits: cuarena_testkit::Rng,
    spare: Option<f32>,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self {
            bits: cuarena_testkit::Rng::new(seed),
            spare: None,
        }
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.bits.unit()
    }

    pub fn normal(&mut self) -> f32 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let r = (-2.0 * (1.0 - self.unit()).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * self.unit();
        self.spare = Some((r * theta.sin()) as f32);
        (r * theta.cos()) as f32
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.unit() * n as f64) as usize % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn batch(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

// ---- host math: the reference of every kernel -----------------------------------

/// Which operand of a matrix product is stored transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// C[m×n] = A[m×k] · B[k×n]
    NN,
    /// C[m×n] = Aᵀ · B with A stored [k×m]
    TN,
    /// C[m×n] = A · Bᵀ with B stored [n×k]
    NT,
}

pub mod host {
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

/// A network's parameters on the host: per layer, weight (`fan_in ×
/// fan_out`) and bias (`fan_out`).
#[derive(Debug, Clone)]
pub struct HostNet {
    pub layers: Vec<HostLayer>,
}

#[derive(Debug, Clone)]
pub struct HostLayer {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub fan_in: usize,
    pub fan_out: usize,
}

impl HostNet {
    /// He-initialised hidden layers; the last layer is scaled down so the
    /// initial loss is close to ln(classes).
    pub fn random(widths: &[usize], last_scale: f32, rng: &mut Rng) -> Self {
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

    pub fn logits(&self, x: &[f32], rows: usize) -> Vec<f32> {
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

    pub fn labels(&self, x: &[f32], rows: usize) -> Vec<i32> {
        self.logits(x, rows)
            .chunks_exact(CLASSES)
            .map(|r| host::argmax(r) as i32)
            .collect()
    }
}

/// The teacher: a random 64 → 16 → 10 MLP whose output biases are tuned
/// on a sample so that its classes are roughly balanced.
pub fn make_teacher(rng: &mut Rng) -> HostNet {
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
