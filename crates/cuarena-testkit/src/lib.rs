//! What cuarena's tests, benches and examples share, in one place: a
//! deterministic generator ([`Rng`]), [`median`], plan builders, the GPU
//! check that skips or fails ([`usable`], `gpu_available`), the
//! multi-thread stress harness ([`stress`]), and, with features, the test
//! kernels, the gate kernel and the event timer (`cuda`) and trace inputs
//! (`trace`). A dev-dependency of the
//! workspace's crates; never published.

use cuarena::plan::{Move, Plan, PlanKind};

#[cfg(feature = "cuda")]
mod cuda_tools;
mod gpu;
pub mod stress;
#[cfg(feature = "trace")]
pub mod trace;

#[cfg(feature = "cuda")]
pub use cuda_tools::*;
#[cfg(feature = "cuda")]
pub use gpu::cuda::*;
pub use gpu::{forced, usable};

/// splitmix64: small, deterministic, no dependency; any seed will do.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The sequence of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)] // not an iterator: never ends
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Uniform in `0..n` as an index (0 when `n` is 0).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// Uniform in `lo..=hi`, as an index.
    pub fn index_range(&mut self, lo: usize, hi: usize) -> usize {
        self.range(lo as u64, hi as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// `len` bytes that depend on `seed` only.
pub fn bytes(seed: u64, len: u64) -> Vec<u8> {
    Rng::new(seed).bytes(len as usize)
}

/// A move of `len` bytes from `src` to `dst`, keyed by its source.
pub fn mv(src: u64, dst: u64, len: u64) -> Move {
    Move {
        key: src,
        src,
        dst,
        len,
    }
}

/// Blocks of 1 MiB, 2 MiB, ... 1 GiB, four times over (8 GiB in 44
/// blocks) from offset 0, each moved up by `shift` bytes: the large moves
/// of the GPU move benches. Returns the moves and their bytes.
pub fn ladder_moves(shift: u64) -> (Vec<Move>, u64) {
    let mut moves = Vec::new();
    let mut off = 0;
    for _ in 0..4 {
        let mut size = 1 << 20;
        while size <= 1 << 30 {
            moves.push(mv(off, off + shift, size));
            off += size;
            size *= 2;
        }
    }
    (moves, off)
}

/// A full plan of `waves` in order, empty ones left out.
pub fn plan_of(waves: Vec<Vec<Move>>) -> Plan {
    Plan::new(PlanKind::Full, waves)
}

/// `name`'s value as a number, if set to one.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The median of `times` (sorted in place; the mean of the two middle
/// values of an even count). Panics on an empty slice.
pub fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    let m = times.len() / 2;
    if times.len() % 2 == 1 {
        times[m]
    } else {
        (times[m - 1] + times[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_gpu_skips_by_default_and_fails_when_asked_for() {
        assert!(usable(Ok(())));
        if !forced() {
            assert!(!usable(Err("no driver".into())));
        }
        std::env::set_var("CUARENA_REQUIRE_GPU", "1");
        let r = std::panic::catch_unwind(|| usable(Err("no driver".into())));
        std::env::remove_var("CUARENA_REQUIRE_GPU");
        let msg = *r
            .expect_err("asked for: fails")
            .downcast::<String>()
            .expect("a message");
        assert!(msg.starts_with("no CUDA GPU: no driver"), "{msg}");
    }

    #[test]
    fn the_generator_is_splitmix64() {
        // The first outputs of splitmix64 from seed 0.
        let mut r = Rng::new(0);
        assert_eq!(r.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next(), 0x6E78_9E6A_A1B9_65F4);
        assert!((0..1000).all(|_| r.range(3, 5) <= 5 && r.index(7) < 7 && r.unit() < 1.0));
        assert_eq!(bytes(9, 16), bytes(9, 16));
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
