//! What the training loop asks of a device: allocate and free buffers,
//! launch a kernel, run a GEMM, copy host data in and out. Three
//! implementations: the arena on CUDA and plain cudarc allocations on CUDA
//! (`cuda.rs`), and a metadata arena that only allocates and frees ([`Dry`]):
//! the run's own allocation sequence, replayed without a GPU, which gives
//! its peak of live bytes and the compactions the arena will make.

use cuarena::backend::MetaBackend;
use cuarena::{Arena, ArenaConfig, Handle, Stats};

use crate::Res;

/// cuBLAS's workspace, given to it from our own memory so that it allocates
/// none of its own during training (32 MiB: its default on Hopper). The
/// first buffer of every device, pinned in the arena (the dry run too, so
/// that it replays the GPU run's sequence exactly).
pub const WORKSPACE: u64 = 32 << 20;

/// A buffer of the loop's, named by its index in the device's table.
pub type Tid = usize;

/// A device address the loop passes: a buffer and a byte offset into it,
/// resolved only when the launch is enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr {
    pub t: Tid,
    pub off: u64,
}

impl Ptr {
    /// The start of buffer `t`.
    pub fn of(t: Tid) -> Self {
        Self { t, off: 0 }
    }

    /// `elems` f32 elements further in.
    pub fn at(self, elems: usize) -> Self {
        Self {
            t: self.t,
            off: self.off + 4 * elems as u64,
        }
    }
}

/// A kernel argument, in the kernel's C order: a buffer it reads or writes
/// (a pointer), or a scalar.
#[derive(Debug, Clone, Copy)]
pub enum Arg {
    R(Ptr),
    W(Ptr),
    I(i32),
    F(f32),
    U(u64),
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy)]
pub struct Cfg {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shmem: u32,
}

/// Element type of a GEMM's A and B operands (C and the accumulation are
/// always f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ab {
    F32,
    Bf16,
}

/// One column-major (cuBLAS) GEMM, batched with strides in elements:
/// C = alpha * op(A) op(B) + beta * C.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    pub ta: bool,
    pub tb: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Ptr,
    pub lda: usize,
    pub sa: usize,
    pub b: Ptr,
    pub ldb: usize,
    pub sb: usize,
    pub c: Ptr,
    pub ldc: usize,
    pub sc: usize,
    pub batch: usize,
    pub alpha: f32,
    pub beta: f32,
    pub ab: Ab,
}

/// The kernels of `gpt2.cu`, in [`Kernel::NAMES`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    FillZero,
    EncoderFwd,
    EncoderBwd,
    LayernormFwd,
    LayernormBwd,
    AddBias,
    BiasGelu,
    GeluBwd,
    ResidualBias,
    ColSum,
    SplitHeads,
    MergeHeads3,
    HeadsToRows,
    SoftmaxCausal,
    SoftmaxCausalBwd,
    CrossEntropy,
    MeanInto,
    SumSquares,
    StoreNorm,
    Adamw,
    ToBf16,
}

impl Kernel {
    pub const NAMES: [&'static str; 21] = [
        "fill_zero",
        "encoder_fwd",
        "encoder_bwd",
        "layernorm_fwd",
        "layernorm_bwd",
        "add_bias",
        "bias_gelu",
        "gelu_bwd",
        "residual_bias",
        "col_sum",
        "split_heads",
        "merge_heads3",
        "heads_to_rows",
        "softmax_causal",
        "softmax_causal_bwd",
        "cross_entropy",
        "mean_into",
        "sum_squares",
        "store_norm",
        "adamw",
        "to_bf16",
    ];
}

pub trait Dev {
    /// A buffer of `bytes` bytes (contents undefined).
    fn alloc(&mut self, bytes: u64) -> Res<Tid>;
    fn free(&mut self, t: Tid) -> Res<()>;
    fn launch(&mut self, k: Kernel, cfg: Cfg, args: &[Arg]) -> Res<()>;
    fn gemm(&mut self, g: &Gemm) -> Res<()>;
    /// Writes `data` at the start of buffer `t`.
    fn upload(&mut self, t: Tid, data: &[u8]) -> Res<()>;
    /// The whole of buffer `t`.
    fn download(&mut self, t: Tid) -> Res<Vec<u8>>;
    /// Waits for everything enqueued.
    fn sync(&mut self) -> Res<()>;
    /// The arena's statistics (None for plain allocations).
    fn stats(&self) -> Option<Stats>;
    /// Data parallel: starts summing `elems` f32 at `p` over every rank
    /// (a gradient bucket, once the backward pass has written it). One
    /// device alone has nothing to do.
    fn reduce(&mut self, _p: Ptr, _elems: usize) -> Res<()> {
        Ok(())
    }
    /// Data parallel: later work waits for every bucket started.
    fn reduce_wait(&mut self) -> Res<()> {
        Ok(())
    }
}

/// A table of buffers: index -> handle, with free slots reused.
#[derive(Debug)]
pub struct Table<T> {
    slots: Vec<Option<T>>,
    free: Vec<Tid>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Table<T> {
    pub fn insert(&mut self, v: T) -> Tid {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(v);
                i
            }
            None => {
                self.slots.push(Some(v));
                self.slots.len() - 1
            }
        }
    }

    pub fn get(&self, t: Tid) -> Res<&T> {
        self.slots
            .get(t)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("buffer {t} is not allocated").into())
    }

    pub fn get_mut(&mut self, t: Tid) -> Res<&mut T> {
        self.slots
            .get_mut(t)
            .and_then(Option::as_mut)
            .ok_or_else(|| format!("buffer {t} is not allocated").into())
    }

    pub fn take(&mut self, t: Tid) -> Res<T> {
        let v = self
            .slots
            .get_mut(t)
            .and_then(Option::take)
            .ok_or_else(|| format!("buffer {t} freed twice or never allocated"))?;
        self.free.push(t);
        Ok(v)
    }
}

/// The loop's allocation sequence on a metadata arena: no bytes, no GPU.
pub struct Dry {
    pub arena: Arena<MetaBackend>,
    bufs: Table<Handle>,
}

impl Dry {
    pub fn new(capacity: u64) -> Res<Self> {
        let mut arena = Arena::metadata(ArenaConfig::new(capacity))?;
        let mut bufs = Table::default();
        let ws = arena.alloc(WORKSPACE)?;
        arena.pin(ws)?;
        bufs.insert(ws);
        Ok(Self { arena, bufs })
    }
}

impl Dev for Dry {
    fn alloc(&mut self, bytes: u64) -> Res<Tid> {
        let h = self.arena.alloc(bytes)?;
        Ok(self.bufs.insert(h))
    }
    fn free(&mut self, t: Tid) -> Res<()> {
        let h = self.bufs.take(t)?;
        Ok(self.arena.free(h)?)
    }
    fn launch(&mut self, _: Kernel, _: Cfg, _: &[Arg]) -> Res<()> {
        Ok(())
    }
    fn gemm(&mut self, _: &Gemm) -> Res<()> {
        Ok(())
    }
    fn upload(&mut self, _: Tid, _: &[u8]) -> Res<()> {
        Ok(())
    }
    fn download(&mut self, t: Tid) -> Res<Vec<u8>> {
        let h = *self.bufs.get(t)?;
        let n = self.arena.info(h)?.size_bytes;
        Ok(vec![0; usize::try_from(n)?])
    }
    fn sync(&mut self) -> Res<()> {
        Ok(())
    }
    fn stats(&self) -> Option<Stats> {
        Some(self.arena.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::Kernel::{self, *};

    /// Every kernel's index names its function in `gpt2.cu`.
    #[test]
    fn kernel_indices_match_their_names() {
        let all = [
            (FillZero, "fill_zero"),
            (EncoderFwd, "encoder_fwd"),
            (EncoderBwd, "encoder_bwd"),
            (LayernormFwd, "layernorm_fwd"),
            (LayernormBwd, "layernorm_bwd"),
            (AddBias, "add_bias"),
            (BiasGelu, "bias_gelu"),
            (GeluBwd, "gelu_bwd"),
            (ResidualBias, "residual_bias"),
            (ColSum, "col_sum"),
            (SplitHeads, "split_heads"),
            (MergeHeads3, "merge_heads3"),
            (HeadsToRows, "heads_to_rows"),
            (SoftmaxCausal, "softmax_causal"),
            (SoftmaxCausalBwd, "softmax_causal_bwd"),
            (CrossEntropy, "cross_entropy"),
            (MeanInto, "mean_into"),
            (SumSquares, "sum_squares"),
            (StoreNorm, "store_norm"),
            (Adamw, "adamw"),
            (ToBf16, "to_bf16"),
        ];
        assert_eq!(all.len(), Kernel::NAMES.len());
        let source = include_str!("gpt2.cu");
        for (k, name) in all {
            assert_eq!(Kernel::NAMES[k as usize], name);
            assert!(
                source.contains(&format!("void {name}(")),
                "{name} not in gpt2.cu"
            );
        }
    }
}
