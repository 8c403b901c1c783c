//! The move kernels of `kernels/`, compiled at run time with NVRTC
//! ([`nvrtc::build`]) for the device's own architecture (`sm_XY` from its
//! compute capability) and the tile shape of the options, loaded into a
//! backend's context, and how they launch there.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::nvrtc::{self, Header};
use super::{driver_err, CudaOptions, MoveKernelInfo};
use crate::error::Result;

/// Name of the move kernels' program, in NVRTC's log and in
/// [`BackendError::Nvrtc`](crate::BackendError::Nvrtc)(crate::Error::Nvrtc) (no directory: NVRTC finds the
/// files it includes among the headers it is given).
const MOVES_NAME: &str = "cuarena_moves.cu";

/// The move kernels' translation unit: the register kernel, then the bulk
/// kernel, which uses its helpers.
const MOVES_UNIT: &str = "#include \"moves.cu\"\n#include \"bulk.cu\"\n";

/// The kernels' shared definitions (the records and arguments the host
/// mirrors).
pub(super) const MOVES_H: &str = include_str!("../../../kernels/moves.h");

/// What [`MOVES_UNIT`] includes, by name.
const MOVES_HEADERS: &[Header] = &[
    ("moves.h", MOVES_H),
    ("moves.cu", include_str!("../../../kernels/moves.cu")),
    ("bulk.cu", include_str!("../../../kernels/bulk.cu")),
];

/// Loaded move kernels of one backend.
#[derive(Debug)]
pub(crate) struct MoveKernels {
    /// Keeps the module loaded.
    _module: Arc<CudaModule>,
    /// Per-tile descriptors and wait ranges.
    pub(crate) prep: CudaFunction,
    /// The tiled, persistent move kernel (registers).
    pub(crate) moves: CudaFunction,
    /// The same through shared memory by bulk copies (sm_90 and later).
    pub(crate) bulk: CudaFunction,
    /// Rule 3 over a wave that ran in several chunks.
    pub(crate) check: CudaFunction,
    /// Deferred lower parts from the side buffer to their destinations.
    pub(crate) settle: CudaFunction,
}

/// Compiles (or takes from the cache) the move kernels for `arch` (`sm_90`)
/// with `options`, and loads them into `ctx`.
pub(crate) fn load_move_kernels(
    ctx: &Arc<CudaContext>,
    arch: &str,
    options: &CudaOptions,
) -> Result<MoveKernels> {
    let flags = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-lineinfo".to_string(),
        format!("-DCUARENA_THREADS={}", options.threads_per_cta),
        format!("-DCUARENA_VPT={}", options.vectors_per_thread),
    ];
    let image = nvrtc::build(MOVES_NAME, MOVES_UNIT, MOVES_HEADERS, &flags)?;
    let module = ctx
        .load_module(Ptx::from_binary(image))
        .map_err(driver_err("cuModuleLoadData"))?;
    let function = |name: &str| {
        module
            .load_function(name)
            .map_err(driver_err("cuModuleGetFunction"))
    };
    Ok(MoveKernels {
        prep: function("cuarena_prep")?,
        moves: function("cuarena_move")?,
        bulk: function("cuarena_move_bulk")?,
        check: function("cuarena_check")?,
        settle: function("cuarena_settle")?,
        _module: module,
    })
}

/// How the move kernel of a backend is launched.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MoveLaunch {
    /// Tiles in flight per CTA of the bulk kernel; 0: the register kernel.
    pub(crate) stages: u32,
    /// Dynamic shared memory per CTA.
    pub(crate) shared_bytes: u32,
    /// CTAs resident per multiprocessor.
    pub(crate) ctas_per_sm: u32,
}

/// Picks the kernel (bulk on compute capability 9.0 and later when the
/// options ask for it) and the stages that fit in a CTA's shared memory,
/// sets the bulk kernel's dynamic shared memory limit, and asks the
/// driver for the occupancy.
pub(crate) fn move_launch(
    ctx: &Arc<CudaContext>,
    kernels: &MoveKernels,
    options: &CudaOptions,
    major: i32,
) -> Result<MoveLaunch> {
    // A slot holds a tile and the bytes around it up to 16-byte boundaries
    // (`CUARENA_SLOT_BYTES` in kernels/bulk.cu).
    let slot = options.tile_bytes() + 32;
    // The bulk kernel gives warp 0 to its producer: it needs a second warp.
    let mut stages = if major >= 9 && options.threads_per_cta >= 64 {
        options.bulk_stages
    } else {
        0
    };
    if stages > 0 {
        let optin = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(driver_err("cuDeviceGetAttribute"))?;
        let fixed = kernels
            .bulk
            .shared_size_bytes()
            .map_err(driver_err("cuFuncGetAttribute"))?;
        let room = u64::try_from(optin.saturating_sub(fixed)).unwrap_or(0);
        stages = stages.min(u32::try_from(room / slot).unwrap_or(u32::MAX));
        if stages < 2 {
            stages = 0; // tiles too big for two slots: registers
        }
    }
    let shared_bytes = u32::try_from(u64::from(stages) * slot).unwrap_or(0);
    let function = if stages > 0 {
        kernels
            .bulk
            .set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes as i32,
            )
            .map_err(driver_err("cuFuncSetAttribute"))?;
        &kernels.bulk
    } else {
        &kernels.moves
    };
    let ctas_per_sm = match options.ctas_per_sm {
        Some(c) => c,
        None => function
            .occupancy_max_active_blocks_per_multiprocessor(
                options.threads_per_cta,
                shared_bytes as usize,
                None,
            )
            .map_err(driver_err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?
            .max(1),
    };
    Ok(MoveLaunch {
        stages,
        shared_bytes,
        ctas_per_sm,
    })
}

/// The move kernels compiled for one tile shape, and how they launch.
#[derive(Debug)]
pub(crate) struct KernelSet {
    pub(crate) kernels: MoveKernels,
    pub(crate) info: MoveKernelInfo,
    pub(crate) threads_per_cta: u32,
}

impl KernelSet {
    /// The kernels of a chunk: those for large moves when `large` and the
    /// options name them, else the primary ones.
    pub(crate) fn pick<'a>(
        primary: &'a KernelSet,
        large_moves: &'a Option<KernelSet>,
        large: bool,
    ) -> &'a KernelSet {
        match large_moves {
            Some(l) if large => l,
            _ => primary,
        }
    }

    /// Compiles (or takes from the cache) and loads the kernels of
    /// `shape` (its threads, vectors, CTAs per SM and bulk stages).
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        arch: &str,
        major: i32,
        sm_count: u32,
        shape: &CudaOptions,
    ) -> Result<Self> {
        let kernels = load_move_kernels(ctx, arch, shape)?;
        let launch = move_launch(ctx, &kernels, shape, major)?;
        let function = if launch.stages > 0 {
            &kernels.bulk
        } else {
            &kernels.moves
        };
        let info = MoveKernelInfo {
            registers: function
                .num_regs()
                .map_err(driver_err("cuFuncGetAttribute"))?,
            local_bytes: function
                .local_size_bytes()
                .map_err(driver_err("cuFuncGetAttribute"))?,
            ctas_per_sm: launch.ctas_per_sm,
            grid: sm_count.saturating_mul(launch.ctas_per_sm),
            tile_bytes: shape.tile_bytes(),
            bulk_stages: launch.stages,
            shared_bytes: launch.shared_bytes,
        };
        Ok(Self {
            kernels,
            info,
            threads_per_cta: shape.threads_per_cta,
        })
    }
}
