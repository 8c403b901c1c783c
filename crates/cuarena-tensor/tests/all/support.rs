//! What the tests share: a naive dense reference of the view operations,
//! and arenas (the seeded generator is the test kit's).

use cuarena::{Arena, ArenaConfig, SharedArena};
pub use cuarena_testkit::Rng;

/// A row-major array and the view operations written the obvious way, by
/// multi-index, with no strides: the reference the tensors are checked
/// against.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub shape: Vec<usize>,
    pub data: Vec<u32>,
}

fn unravel(shape: &[usize], mut flat: usize) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

impl Dense {
    /// Distinct values `base, base + 1, …` in `shape`.
    pub fn iota(shape: &[usize], base: u32) -> Dense {
        let n: usize = shape.iter().product();
        Dense {
            shape: shape.to_vec(),
            data: (0..n as u32).map(|i| base.wrapping_add(i)).collect(),
        }
    }

    fn at(&self, idx: &[usize]) -> u32 {
        let flat = idx
            .iter()
            .zip(&self.shape)
            .fold(0, |acc, (&i, &n)| acc * n + i);
        self.data[flat]
    }

    fn map(&self, shape: Vec<usize>, source: impl Fn(&mut Vec<usize>)) -> Dense {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|flat| {
                let mut idx = unravel(&shape, flat);
                source(&mut idx);
                self.at(&idx)
            })
            .collect();
        Dense { shape, data }
    }

    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Dense {
        let mut shape = self.shape.clone();
        shape[dim] = len;
        self.map(shape, |idx| idx[dim] += start)
    }

    pub fn transpose(&self, d0: usize, d1: usize) -> Dense {
        let mut shape = self.shape.clone();
        shape.swap(d0, d1);
        self.map(shape, |idx| idx.swap(d0, d1))
    }

    pub fn reshape(&self, shape: &[usize]) -> Dense {
        Dense {
            shape: shape.to_vec(),
            data: self.data.clone(),
        }
    }
}

pub fn host_arena(capacity: u64) -> SharedArena {
    SharedArena::new(Arena::host(ArenaConfig::new(capacity)).expect("host arena"))
}
