//! Whether the GPU tests can run here, shared by the `gpu*` modules (and
//! by the trace crate's GPU replay test, which includes this file).

use std::io::Write as _;
use std::sync::Once;

use cuarena::backend::cuda::CudaBackend;

/// True when a CUDA driver, NVRTC and a device are present. Otherwise the
/// calling test prints `skipped: <reason>` (shown with `--nocapture`) and
/// should return, passing; the first skip also writes one line straight to
/// the process's stderr, which libtest does not capture (it captures only
/// `print!`/`eprint!`), so a plain `cargo test` shows why GPU tests pass
/// without running.
pub fn gpu_available() -> bool {
    match CudaBackend::available() {
        Ok(()) => true,
        Err(reason) => {
            println!("skipped: {reason}");
            static ONCE: Once = Once::new();
            ONCE.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "cuarena: GPU tests skipped (they pass without running): {reason}"
                );
            });
            false
        }
    }
}
