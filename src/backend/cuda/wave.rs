//! One chunk of a wave on the device: the kernels' argument block, the
//! epoch that tells this launch's flags from older ones, and the launches.

use cudarc::driver::{result, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};

use super::kernels::KernelSet;
use super::{driver_err, CudaBackend};
use crate::error::Result;

/// The kernel arguments of one wave; mirrors `struct WaveArgs` in
/// `kernels/moves.h` field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct WaveArgs {
    pub(super) base: u64,
    pub(super) moves: u64,
    pub(super) tiles: u64,
    pub(super) flags: u64,
    pub(super) ctl: u64,
    pub(super) n_moves: u32,
    pub(super) n_tiles: u32,
    pub(super) epoch: u32,
    /// Tiles in flight per CTA of `cuarena_move_bulk` (0 for the others).
    pub(super) bulk_stages: u32,
    pub(super) side: u64,
    pub(super) side_cap: u32,
    pub(super) pad: u32,
}

// SAFETY: `WaveArgs` is `#[repr(C)]`, made of u64/u32 only, with the same
// layout as the C struct the kernels take by value.
unsafe impl DeviceRepr for WaveArgs {}

impl CudaBackend {
    pub(super) fn next_epoch(&mut self) -> Result<u32> {
        let s = &mut self.scratch;
        if s.epoch == u32::MAX {
            // SAFETY: flags holds `bytes` bytes; stream ordered after every
            // launch that used the old epochs.
            unsafe {
                result::memset_d8_async(s.flags.ptr, 0, s.flags.bytes, self.stream.cu_stream())
            }
            .map_err(driver_err("cuMemsetD8Async"))?;
            s.epoch = 0;
        }
        s.epoch += 1;
        Ok(s.epoch)
    }

    /// Enqueues the kernels of one chunk (those of `large_moves` when
    /// `large` and the options name them), whose descriptors and control
    /// words are half `q` of each: the prep kernel on the upload stream,
    /// after the chunk's uploads, so that it overlaps the move kernel of
    /// the chunk before (on the arena stream it added device time to every
    /// chunk, a twentieth of a 100,000-move compaction); then,
    /// on the arena stream, the move kernel and, when tiles may have
    /// deferred, the settle kernel.
    pub(super) fn launch_chunk(
        &mut self,
        args: &WaveArgs,
        large: bool,
        prep_cap: u32,
        q: usize,
    ) -> Result<()> {
        if args.n_tiles == 0 {
            return Ok(());
        }
        // Through the fields, not `&self`: the region is borrowed mutably
        // below while `set` lives.
        let set = KernelSet::pick(&self.primary, &self.large, large);
        let prep_cfg = LaunchConfig {
            grid_dim: (args.n_tiles.div_ceil(256).clamp(1, prep_cap), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let info = &set.info;
        let move_cfg = LaunchConfig {
            grid_dim: (info.grid.min(args.n_tiles).max(1), 1, 1),
            block_dim: (set.threads_per_cta, 1, 1),
            shared_mem_bytes: info.shared_bytes,
        };
        let args = &WaveArgs {
            bulk_stages: info.bulk_stages,
            ..*args
        };
        let kernels = &set.kernels;
        let function = if info.bulk_stages > 0 {
            &kernels.bulk
        } else {
            &kernels.moves
        };
        // Half q was last used by the chunk before the last one.
        let upload = &self.scratch.upload_stream;
        upload
            .wait(&self.scratch.chunk_done[q])
            .map_err(driver_err("cuStreamWaitEvent"))?;
        let mut prep = upload.launch_builder(&kernels.prep);
        prep.arg(args);
        // SAFETY: `args` matches `cuarena_prep(WaveArgs)`; `moves` addresses
        // the chunk's n_moves records, uploaded earlier on this stream,
        // `tiles` holds n_tiles descriptors (reserved by the caller) and
        // `ctl` one block of control words. The kernel touches only those
        // (not the region, nor `side`, whose offsets it only hands out),
        // and the kernels that used them last, the chunk before last's, are
        // done (waited for above).
        unsafe { prep.launch(prep_cfg) }.map_err(driver_err("cuLaunchKernel(cuarena_prep)"))?;
        self.arena_waits_for_uploads()?;
        // The region's cudarc events (used by the backend's own transfers
        // only; views carry none): wait for them, record us.
        let (_base, _record) = self.region.device_ptr_mut(&self.stream);
        let mut mv = self.stream.launch_builder(function);
        mv.arg(args);
        // SAFETY: as above for `cuarena_move(WaveArgs)` and
        // `cuarena_move_bulk(WaveArgs)`. `stage_chunk` checked that every
        // move's source and destination lie in the region, so the kernel
        // writes only inside it (the bulk kernel's aligned loads read at
        // most 15 bytes past a source, inside the allocation's slack), and
        // the prep kernel disabled waiting for any tile that breaks rule 3
        // (no hang). The bulk kernel's dynamic shared memory is what
        // `move_launch` allowed it (`shared_bytes`), `bulk_stages` its stages.
        unsafe { mv.launch(move_cfg) }.map_err(driver_err("cuLaunchKernel(cuarena_move)"))?;
        if args.side_cap > 0 {
            // 16 threads per tile (`CUARENA_SETTLE_LANES`), 256 per CTA,
            // up to 8x the prep's CTAs (the kernel strides past that).
            let settle_cfg = LaunchConfig {
                grid_dim: (
                    args.n_tiles
                        .div_ceil(16)
                        .clamp(1, prep_cap.saturating_mul(8)),
                    1,
                    1,
                ),
                ..prep_cfg
            };
            let mut settle = self.stream.launch_builder(&kernels.settle);
            settle.arg(args);
            // SAFETY: `cuarena_settle(WaveArgs)` reads the n_tiles
            // descriptors the prep kernel wrote; for each deferred one it
            // copies `hi` bytes from `side + lo` (inside the side buffer of
            // `side_cap` bytes, which the prep kernel's allocation keeps
            // to) to the tile's destination (inside the region, as above),
            // and zeroes ctl[2..4].
            unsafe { settle.launch(settle_cfg) }
                .map_err(driver_err("cuLaunchKernel(cuarena_settle)"))?;
        }
        self.scratch.chunk_done[q]
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The fields of C struct `name` in `header` as `(field, offset)`,
    /// laid out as the CUDA compiler does for the types the kernels' structs
    /// use: `u32` of 4 bytes, `u64` and pointers of 8, each aligned to its
    /// size.
    pub(in crate::backend::cuda) fn c_fields(header: &str, name: &str) -> Vec<(String, usize)> {
        let body = header
            .split(&format!("struct {name} {{"))
            .nth(1)
            .and_then(|rest| rest.split("};").next())
            .unwrap_or_else(|| panic!("the header defines struct {name}"));
        let mut end = 0usize;
        body.lines()
            .map(|l| l.split("//").next().unwrap_or_default().trim())
            .filter(|decl| !decl.is_empty())
            .map(|decl| {
                let (ty, field) = decl
                    .trim_end_matches(';')
                    .rsplit_once(' ')
                    .unwrap_or_else(|| panic!("{name}: '{decl}' is not `type field;`"));
                let size = match ty.trim() {
                    "u32" => 4,
                    "u64" => 8,
                    t if t.ends_with('*') => 8,
                    t => panic!("{name}: no size for type {t}"),
                };
                let offset = end.next_multiple_of(size);
                end = offset + size;
                (field.to_string(), offset)
            })
            .collect()
    }

    /// `(field, offset)` of each named field of a Rust struct.
    macro_rules! rust_fields {
        ($ty:ty: $($field:ident),*) => {
            vec![$((stringify!($field).to_string(), std::mem::offset_of!($ty, $field))),*]
        };
    }
    pub(in crate::backend::cuda) use rust_fields;

    #[test]
    fn wave_args_match_the_c_layout() {
        let rust = rust_fields!(WaveArgs: base, moves, tiles, flags, ctl, n_moves, n_tiles,
            epoch, bulk_stages, side, side_cap, pad);
        assert_eq!(c_fields(super::super::kernels::MOVES_H, "WaveArgs"), rust);
        assert_eq!(std::mem::size_of::<WaveArgs>(), 72);
        assert_eq!(std::mem::align_of::<WaveArgs>(), 8);
    }
}
