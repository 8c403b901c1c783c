//! NVRTC: the one way CUDA C is compiled here, for the crate's own move
//! kernels and for users' kernels that take handles ([`compile`],
//! [`CUARENA_CUH`]).
//!
//! A source is compiled for one architecture straight to machine code
//! (CUBIN, so the driver has no PTX to JIT when a module loads), with its
//! headers handed to NVRTC by name: `#include "moves.h"` finds the text
//! embedded in the crate, and nothing is read from disk. Each image is
//! compiled once per process for its source, headers and options: later
//! backends (tests and benches make many) only load the cached image.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::nvrtc::{result as nvrtc, sys, Ptx};

use crate::error::{BackendError, Error, Result};

/// The device header of kernels that take handles, `cuarena.cuh`: the
/// handle table's entry and argument (`CuarenaEntry`, `CuarenaTable`, the
/// layout of [`HandleArgs`](crate::graph::HandleArgs)), the decoding of a
/// handle's bits and the resolves (`cuarena_at`, `cuarena_at_checked`).
///
/// Sources compiled with [`compile`] `#include "cuarena.cuh"` as it is;
/// for another compiler, write this text next to your sources.
pub const CUARENA_CUH: &str = include_str!("../../../kernels/cuarena.cuh");

/// A header NVRTC resolves by name: `(include name, text)`.
pub(crate) type Header = (&'static str, &'static str);

/// The headers every source given to [`compile`] may include.
const PUBLIC_HEADERS: &[Header] = &[("cuarena.cuh", CUARENA_CUH)];

/// What makes an image: a source, its headers and the compiler's options
/// (the architecture among them).
#[derive(PartialEq, Eq, Hash)]
struct Key {
    name: &'static str,
    source: String,
    headers: &'static [Header],
    options: Vec<String>,
}

type Cache = Mutex<HashMap<Key, Vec<u8>>>;

/// The images compiled so far in this process. A panic elsewhere cannot
/// leave it half-written (entries are inserted whole), so a poisoned lock
/// is taken as it is.
fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles `source` (called `name` in errors and in NVRTC's log) with
/// `headers` and `options`, which must name a real architecture
/// (`--gpu-architecture=sm_90`), to a CUBIN image, or takes it from the
/// process's cache.
pub(crate) fn build(
    name: &'static str,
    source: &str,
    headers: &'static [Header],
    options: &[String],
) -> Result<Vec<u8>> {
    let key = Key {
        name,
        source: source.to_owned(),
        headers,
        options: options.to_vec(),
    };
    if let Some(image) = cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(image.clone());
    }
    // Compiled outside the lock: other sources need not wait for this one.
    let image = compile_cubin(name, source, headers, options)?;
    cache()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, image.clone());
    Ok(image)
}

/// Compiles `source`, CUDA C that may `#include "cuarena.cuh"`
/// ([`CUARENA_CUH`]), with NVRTC for `arch` and `options`, to machine code
/// for that architecture. `arch` is a real architecture, `sm_90` say: the
/// backend's own is [`CudaBackend::arch`](super::CudaBackend::arch).
/// `options` are NVRTC's (`--std=c++17`, `-DTILE=64`, `-lineinfo`); `name`
/// names the source in NVRTC's log and in [`BackendError::Nvrtc`](crate::BackendError::Nvrtc).
///
/// Needs NVRTC ([`BackendError::Nvrtc`](crate::BackendError::Nvrtc) says so when it cannot be loaded), no
/// device. Each image is compiled once per process (for
/// its source, options and architecture); later calls return a copy. Load
/// it with `context.load_module(image)`, then launch its kernels with
/// [`launch_with_handles`](crate::graph::launch_with_handles) or a
/// [`PreparedLaunch`](crate::graph::PreparedLaunch).
///
/// ```no_run
/// use cuarena::backend::cuda::{compile, CudaBackend};
///
/// let backend = CudaBackend::new(0, 1 << 30)?;
/// let source = r#"
///     #include "cuarena.cuh"
///     extern "C" __global__ void zero(CuarenaTable t, unsigned long long h, unsigned n) {
///         float* x = (float*)cuarena_at(t, h);
///         for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
///             x[i] = 0.0f;
///     }
/// "#;
/// let image = compile("zero.cu", source, backend.arch(), &["--std=c++17"])?;
/// let module = backend.context().load_module(image).expect("module loads");
/// let zero = module.load_function("zero").expect("kernel");
/// # Ok::<(), cuarena::Error>(())
/// ```
pub fn compile(name: &'static str, source: &str, arch: &str, options: &[&str]) -> Result<Ptx> {
    let mut flags = Vec::with_capacity(options.len() + 1);
    flags.push(format!("--gpu-architecture={arch}"));
    flags.extend(options.iter().map(|o| (*o).to_owned()));
    build(name, source, PUBLIC_HEADERS, &flags).map(Ptx::from_binary)
}

/// A live NVRTC program, destroyed when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `nvrtcCreateProgram` and is
        // destroyed once, here; nothing uses it afterwards.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// One NVRTC compilation of `source` with `headers` to a CUBIN image.
fn compile_cubin(
    name: &'static str,
    source: &str,
    headers: &[Header],
    options: &[String],
) -> Result<Vec<u8>> {
    let fail = |log: String| {
        Error::Backend(BackendError::Nvrtc {
            source_name: name,
            log,
        })
    };
    let c = |text: &str, what: &str| {
        CString::new(text).map_err(|_| fail(format!("{what} holds a NUL byte")))
    };
    // SAFETY: only tries to open the library (cudarc panics on the first
    // call into one that is not there).
    if !unsafe { sys::is_culib_present() } {
        return Err(fail(
            "no NVRTC library (libnvrtc.so) on the library path".into(),
        ));
    }
    if let Some(o) = options.iter().find(|o| o.contains('\0')) {
        return Err(fail(format!("option {o:?} holds a NUL byte")));
    }
    let src = c(source, "the source")?;
    let program_name = c(name, "the source's name")?;
    let texts = headers
        .iter()
        .map(|(n, t)| c(t, n))
        .collect::<Result<Vec<_>>>()?;
    let names = headers
        .iter()
        .map(|(n, _)| c(n, "a header's name"))
        .collect::<Result<Vec<_>>>()?;
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let count = c_int::try_from(headers.len()).map_err(|_| fail("too many headers".into()))?;
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer is to a NUL-terminated string owned by this
    // function, alive until it returns (after the program is destroyed);
    // both arrays hold `count` pointers.
    unsafe {
        sys::nvrtcCreateProgram(
            &mut raw,
            src.as_ptr(),
            program_name.as_ptr(),
            count,
            text_ptrs.as_ptr(),
            name_ptrs.as_ptr(),
        )
    }
    .result()
    .map_err(|e| fail(format!("nvrtcCreateProgram: {e:?}")))?;
    let program = Program(raw);
    // SAFETY: `program` is live; the options are copied into C strings by
    // the call.
    if let Err(e) = unsafe { nvrtc::compile_program(program.0, options) } {
        // SAFETY: as above; the log is NUL-terminated (NVRTC's protocol,
        // which `get_program_log` follows: ask the size, fill that much).
        let log = unsafe { nvrtc::get_program_log(program.0) }
            .map(|l| {
                // SAFETY: `l` is a NUL-terminated buffer (see above).
                unsafe { CStr::from_ptr(l.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        return Err(fail(format!("{e:?} with options {options:?}:\n{log}")));
    }
    let mut size = 0usize;
    // SAFETY: `program` is live and compiled; `size` is valid for the call.
    unsafe { sys::nvrtcGetCUBINSize(program.0, &mut size) }
        .result()
        .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}")))?;
    let mut image = vec![0u8; size];
    // SAFETY: `image` holds exactly the size NVRTC gave for this program.
    unsafe { sys::nvrtcGetCUBIN(program.0, image.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}")))?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compiles a source that includes the public header, twice (the
    /// second from the cache), where NVRTC can be loaded (no device
    /// needed); elsewhere, says so in an error.
    #[test]
    fn sources_include_the_public_header() {
        // SAFETY: only tries to open the NVRTC library.
        if !unsafe { sys::is_culib_present() } {
            match compile("k.cu", "", "sm_80", &[]) {
                Err(Error::Backend(BackendError::Nvrtc { log, .. })) => {
                    assert!(log.contains("no NVRTC"), "{log}")
                }
                other => panic!("{other:?}"),
            }
            return;
        }
        let source = "#include \"cuarena.cuh\"\n\
                      extern \"C\" __global__ void k(CuarenaTable t, unsigned long long h) {\n\
                      *(float*)cuarena_at(t, h) = 1.0f;\n}\n";
        let first = build("k.cu", source, PUBLIC_HEADERS, &["-arch=sm_80".into()]);
        let first = first.unwrap_or_else(|e| panic!("{e}"));
        assert!(!first.is_empty());
        let again = build("k.cu", source, PUBLIC_HEADERS, &["-arch=sm_80".into()]);
        assert_eq!(again.expect("cached"), first);
        // A missing header is NVRTC's error, with its log.
        let missing = build(
            "m.cu",
            "#include \"nope.cuh\"\n",
            &[],
            &["-arch=sm_80".into()],
        );
        match missing {
            Err(Error::Backend(BackendError::Nvrtc { source_name, log })) => {
                assert_eq!(source_name, "m.cu");
                assert!(log.contains("nope.cuh"), "{log}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_public_header_is_the_kernels_file() {
        assert!(CUARENA_CUH.contains("struct CuarenaTable {"));
        assert_eq!(PUBLIC_HEADERS[0].0, "cuarena.cuh");
    }
}
