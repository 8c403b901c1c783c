//! The CUDA C sources of `kernels/`, compiled at run time with NVRTC.
//!
//! The sources are embedded in the crate with `include_str!`; they are
//! compiled for the device's own architecture (`sm_XY` from its compute
//! capability) straight to machine code (CUBIN, so the driver has no PTX to
//! JIT when a module loads), once per process and set of options: every
//! later backend (tests and benches make many) only loads the cached image.

use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};

use super::{driver_err, CudaOptions, MoveKernelInfo};
use crate::error::{BackendError, Error, Result};

/// Name used in [`BackendError::Nvrtc`] for the move kernels.
pub(crate) const MOVES_SOURCE_NAME: &str = "kernels/moves.cu";
const MOVES_HEADER: &str = include_str!("../../../kernels/moves.h");
const MOVES_SOURCE: &str = include_str!("../../../kernels/moves.cu");
const BULK_SOURCE: &str = include_str!("../../../kernels/bulk.cu");

/// The move kernels' source with `moves.h` pasted in (NVRTC sees no
/// files), followed by the bulk kernel (which uses moves.cu's helpers).
pub(crate) fn moves_source() -> String {
    let mut s = MOVES_SOURCE.replacen("#include \"moves.h\"", MOVES_HEADER, 1);
    s.push('\n');
    s.push_str(BULK_SOURCE);
    s
}

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

type ImageCache = Mutex<Vec<(String, Vec<u8>)>>;

fn image_cache() -> &'static ImageCache {
    static CACHE: OnceLock<ImageCache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(Vec::new()))
}

fn nvrtc_error(log: String) -> Error {
    Error::Backend(BackendError::Nvrtc {
        source_name: MOVES_SOURCE_NAME,
        log,
    })
}

/// Compiles `source` with `options` to a CUBIN image.
fn compile_cubin(source: &str, options: &[String]) -> Result<Vec<u8>> {
    let src =
        CString::new(source).map_err(|_| nvrtc_error("source holds a NUL byte".to_string()))?;
    let prog = nvrtc::create_program(&src, Some(c"moves.cu"))
        .map_err(|e| nvrtc_error(format!("nvrtcCreateProgram: {e:?}")))?;
    // SAFETY: `prog` is a live program (created above, destroyed below,
    // once); `src` outlives it. The size and buffer calls follow NVRTC's
    // protocol: ask the size, then fill a buffer of exactly that size.
    let out = unsafe {
        let compiled = nvrtc::compile_program(prog, options);
        let result = match compiled {
            Err(e) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
                    .unwrap_or_default();
                Err(nvrtc_error(format!(
                    "{e:?} with options {options:?}:\n{log}"
                )))
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(nvrtc_error(format!("nvrtcGetCUBINSize: {r:?}")))
                } else {
                    let mut image = vec![0u8; size];
                    let r = nvrtc_sys::nvrtcGetCUBIN(prog, image.as_mut_ptr().cast::<c_char>());
                    if r == nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                        Ok(image)
                    } else {
                        Err(nvrtc_error(format!("nvrtcGetCUBIN: {r:?}")))
                    }
                }
            }
        };
        let _ = nvrtc::destroy_program(prog);
        result
    };
    out
}

/// Compiles (or takes from the cache) the move kernels for `arch` (`sm_90`)
/// with `options`, and loads them into `ctx`.
pub(crate) fn load_move_kernels(
    ctx: &Arc<CudaContext>,
    arch: &str,
    options: &CudaOptions,
) -> Result<MoveKernels> {
    let flags = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "-lineinfo".to_string(),
        format!("-DCUARENA_THREADS={}", options.threads_per_cta),
        format!("-DCUARENA_VPT={}", options.vectors_per_thread),
    ];
    let key = flags.join(" ");
    let cached = {
        let cache = image_cache().lock().map_err(|_| {
            nvrtc_error("kernel cache lock poisoned by a panic elsewhere".to_string())
        })?;
        cache
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, p)| p.clone())
    };
    let image = match cached {
        Some(image) => image,
        None => {
            let image = compile_cubin(&moves_source(), &flags)?;
            if let Ok(mut cache) = image_cache().lock() {
                cache.push((key, image.clone()));
            }
            image
        }
    };
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
