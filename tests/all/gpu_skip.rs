//! Whether the GPU tests can run here, shared by the `gpu*` modules (and
//! by the trace crate's GPU replay test, which includes this file).

use std::io::Write as _;
use std::sync::Once;

use cuarena::backend::cuda::CudaBackend;

/// True when a CUDA driver, NVRTC and a device are present. The GPU tests
/// are `#[ignore]`d (a plain `cargo test` lists them as ignored); run with
/// `--include-ignored` where there is no device, each prints `skipped:
/// <reason>` (shown with `--nocapture`) and returns; the first skip also
/// writes one line straight to the process's stderr, which libtest does not
/// capture (it captures only `print!`/`eprint!`).
pub fn gpu_available() -> bool {
    match CudaBackend::available() {
        Ok(()) => true,
        Err(reason) => {
            println!("skipped: {reason}");
            static ONCE: Once = Once::new();
            ONCE.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "cuarena: GPU tests skipped (no device): {reason}"
                );
            });
            false
        }
    }
}
