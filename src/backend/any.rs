//! [`AnyBackend`]: the backend chosen at run time.

use super::{Backend, HostBackend, TableEntry};
use crate::error::Result;
use crate::plan::Plan;
use crate::stream::StreamId;

#[cfg(feature = "cuda")]
use super::cuda::CudaBackend;

/// Whichever backend a framework got at run time, as one type: an
/// `Arena<AnyBackend>` has the generic arena's methods whether its bytes
/// are in host memory or on a GPU. Every call is forwarded to the backend
/// inside (one `match`; the hot path of `alloc`, `free` and `resolve`
/// calls no backend at all). Calls that only a CUDA arena has (kernel
/// arguments, graphs) take an `Arena<CudaBackend>`.
///
/// ```
/// use cuarena::backend::AnyBackend;
/// use cuarena::{Arena, ArenaConfig};
///
/// let gpu = false; // say, from the command line or a probe
/// let config = ArenaConfig::new(1 << 20);
/// let mut arena: Arena<AnyBackend> = if gpu {
///     Arena::with_backend(config.clone(), AnyBackend::new(&config, Some(0))?)? // CUDA device 0
/// } else {
///     Arena::with_backend(config.clone(), AnyBackend::new(&config, None)?)? // host memory
/// };
/// let h = arena.alloc(256)?;
/// arena.write(h, &[7u8; 256])?;
/// assert_eq!(arena.read::<u8>(h)?[0], 7);
/// assert!(matches!(arena.backend(), AnyBackend::Host(_)));
/// # Ok::<(), cuarena::Error>(())
/// ```
#[derive(Debug)]
// One per arena, held in place: the host variant's unused bytes cost
// nothing, and a box would add a load to every backend call.
#[allow(clippy::large_enum_variant)]
pub enum AnyBackend {
    /// Host memory ([`HostBackend`]).
    Host(HostBackend),
    /// A CUDA device (`CudaBackend`, feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(CudaBackend),
}

/// A stream of an [`AnyBackend`]: [`AnyStream::Host`] (an id only) for a
/// host backend, a CUDA stream of the device's context for a CUDA one;
/// the other kind is refused
/// ([`BackendError::ForeignStream`](crate::error::BackendError::ForeignStream)).
#[derive(Debug, Clone)]
pub enum AnyStream {
    /// A stream of a host backend (work is synchronous: an id only).
    Host,
    /// A CUDA stream (feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda(std::sync::Arc<cudarc::driver::CudaStream>),
}

/// `$call` on the backend inside `$b`.
macro_rules! each {
    ($b:expr, $inner:ident => $call:expr) => {
        match $b {
            AnyBackend::Host($inner) => $call,
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda($inner) => $call,
        }
    };
}

impl Backend for AnyBackend {
    type Stream = AnyStream;

    fn capacity_bytes(&self) -> u64 {
        each!(self, b => b.capacity_bytes())
    }
    fn stores_bytes(&self) -> bool {
        each!(self, b => b.stores_bytes())
    }
    fn mapped_bytes(&self) -> u64 {
        each!(self, b => b.mapped_bytes())
    }
    fn granularity_bytes(&self) -> u64 {
        each!(self, b => b.granularity_bytes())
    }
    fn map_to(&mut self, end: u64) -> Result<()> {
        each!(self, b => b.map_to(end))
    }
    fn unmap_to(&mut self, end: u64) -> Result<u64> {
        each!(self, b => b.unmap_to(end))
    }
    fn now_us(&self) -> u64 {
        each!(self, b => b.now_us())
    }
    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        each!(self, b => b.write(offset, bytes))
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        each!(self, b => b.read(offset, out))
    }
    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        each!(self, b => b.copy(src, dst, len))
    }
    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        each!(self, b => b.fill(offset, len, pattern))
    }
    fn stream_count(&self) -> u32 {
        each!(self, b => b.stream_count())
    }
    fn register_stream(&mut self, stream: AnyStream) -> Result<StreamId> {
        match (self, stream) {
            (AnyBackend::Host(b), AnyStream::Host) => b.register_stream(()),
            #[cfg(feature = "cuda")]
            (AnyBackend::Cuda(b), AnyStream::Cuda(s)) => b.register_stream(s),
            #[cfg(feature = "cuda")]
            (b, _) => Err(crate::error::BackendError::ForeignStream {
                reason: format!(
                    "a {} stream for a {} backend",
                    if matches!(b, AnyBackend::Host(_)) {
                        "CUDA"
                    } else {
                        "host"
                    },
                    if matches!(b, AnyBackend::Host(_)) {
                        "host"
                    } else {
                        "CUDA"
                    },
                ),
            }
            .into()),
        }
    }
    fn synchronize(&mut self) -> Result<()> {
        each!(self, b => b.synchronize())
    }
    fn wait_stream(&self, stream: StreamId) -> Result<()> {
        each!(self, b => b.wait_stream(stream))
    }
    fn join_arena(&self, stream: StreamId) -> Result<()> {
        each!(self, b => b.join_arena(stream))
    }
    fn execute(&mut self, plan: &Plan) -> Result<()> {
        each!(self, b => b.execute(plan))
    }
    fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        each!(self, b => b.sync_table(entries, first))
    }
    fn reserve_host_tier(&mut self, bytes: u64) -> Result<()> {
        each!(self, b => b.reserve_host_tier(bytes))
    }
    fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> Result<()> {
        each!(self, b => b.spill(offset, host_offset, len))
    }
    fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> Result<()> {
        each!(self, b => b.restore(host_offset, offset, len))
    }
}

impl AnyBackend {
    /// The backend for an arena of `config` chosen at run time: host memory
    /// for `cuda_device` `None` (as [`Arena::host`](crate::Arena::host)
    /// makes it), that CUDA device for `Some(ordinal)` (as
    /// [`Arena::cuda`](crate::Arena::cuda), default kernel options); give
    /// it to [`Arena::with_backend`](crate::Arena::with_backend) with the
    /// same config. A CUDA device without the `cuda` feature, or where none
    /// is present, is [`BackendError::NoDevice`](crate::error::BackendError::NoDevice).
    pub fn new(config: &crate::config::ArenaConfig, cuda_device: Option<usize>) -> Result<Self> {
        config.validate()?;
        let backend = match cuda_device {
            None if config.elastic => AnyBackend::Host(HostBackend::elastic(
                config.elastic_limit(),
                super::host::HOST_GRANULARITY,
            )),
            None => AnyBackend::Host(HostBackend::new(config.capacity_bytes)?),
            #[cfg(feature = "cuda")]
            Some(ordinal) => {
                use super::cuda::{CudaCapacity, CudaOptions};
                let options = CudaOptions::default();
                AnyBackend::Cuda(if config.elastic {
                    let limit = (config.capacity_bytes > 0).then_some(config.capacity_bytes);
                    CudaBackend::elastic(ordinal, limit, options)?
                } else {
                    let capacity = CudaCapacity::Bytes(config.capacity_bytes);
                    CudaBackend::with_options(ordinal, capacity, options)?
                })
            }
            #[cfg(not(feature = "cuda"))]
            Some(_) => {
                return Err(crate::error::BackendError::NoDevice {
                    reason: "cuarena was built without the `cuda` feature".into(),
                }
                .into())
            }
        };
        Ok(backend)
    }
}
