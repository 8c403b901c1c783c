//! The streams registered with the backend: id 0 is the arena stream,
//! others are the caller's (a copy stream, a compute stream, NCCL's). They
//! are ordered with events and stream waits only, never on the host (see
//! [`StreamId`](crate::StreamId)).

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, CudaStream};

use super::{driver_err, CudaBackend};
use crate::backend::check_stream;
use crate::error::{BackendError, Error, Result};
use crate::stream::{StreamId, MAX_STREAMS};

/// One registered stream and the two events that order it with the arena
/// stream. An event is re-recorded at every wait: `cuStreamWaitEvent`
/// waits for the record that was current when it was called, so reusing
/// the event never weakens an earlier wait (and concurrent callers at worst
/// wait for a later record, which covers more).
#[derive(Debug)]
pub(super) struct Registered {
    pub(super) stream: Arc<CudaStream>,
    /// Recorded on `stream`, waited for by the arena stream.
    done: CudaEvent,
    /// Recorded on the arena stream, waited for by `stream`.
    arena_done: CudaEvent,
}

fn event_flags() -> Option<sys::CUevent_flags> {
    Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
}

impl Registered {
    /// `stream`, with events made in its context and in the arena's.
    pub(super) fn new(stream: Arc<CudaStream>, arena: &CudaStream) -> Result<Self> {
        Ok(Self {
            done: stream
                .context()
                .new_event(event_flags())
                .map_err(driver_err("cuEventCreate"))?,
            arena_done: arena
                .context()
                .new_event(event_flags())
                .map_err(driver_err("cuEventCreate"))?,
            stream,
        })
    }
}

impl CudaBackend {
    /// Registers `stream` with the backend and returns its id; the arena's
    /// `register_stream` is the way in for arena users (`Backend::register_stream`
    /// for the backend alone). The stream must
    /// belong to the backend's context (the device's primary context, as
    /// [`CudaContext::new`](cudarc::driver::CudaContext::new) makes it):
    /// events cannot order streams of different contexts, so another
    /// context's stream is refused with [`BackendError::ForeignStream`]. A stream
    /// registered already (the arena stream included) keeps its id.
    pub(super) fn register(&mut self, stream: Arc<CudaStream>) -> Result<StreamId> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::Backend(BackendError::ForeignStream {
                reason: format!(
                    "the stream belongs to context {:?} of device {}, the arena to context {:?} \
                     of device {}",
                    stream.context().cu_ctx(),
                    stream.context().ordinal(),
                    self.ctx.cu_ctx(),
                    self.ctx.ordinal()
                ),
            }));
        }
        if let Some(i) = self
            .streams
            .iter()
            .position(|r| r.stream.cu_stream() == stream.cu_stream())
        {
            return Ok(StreamId(i as u32, 0));
        }
        let id = u32::try_from(self.streams.len())
            .ok()
            .filter(|&n| n < MAX_STREAMS)
            .ok_or(Error::LimitReached {
                what: "streams registered with one arena (its own included)",
                requested: self.streams.len() as u64 + 1,
                limit: u64::from(MAX_STREAMS),
            })?;
        let r = Registered::new(stream, &self.stream)?;
        self.streams.push(r);
        Ok(StreamId(id, 0))
    }

    /// The stream registered as `id` (`StreamId::ARENA`: the arena stream).
    pub fn stream_of(&self, id: StreamId) -> Option<&Arc<CudaStream>> {
        self.streams.get(id.0 as usize).map(|r| &r.stream)
    }

    /// The registered stream `id`, or [`Error::UnknownStream`].
    pub(super) fn registered(&self, id: StreamId) -> Result<&Registered> {
        check_stream(id, self.registered_count())?;
        self.streams.get(id.0 as usize).ok_or(Error::UnknownStream {
            stream: id.0,
            registered: self.registered_count(),
        })
    }

    /// Streams registered, the arena's included.
    pub(super) fn registered_count(&self) -> u32 {
        u32::try_from(self.streams.len()).unwrap_or(u32::MAX)
    }

    /// The arena stream waits for everything enqueued on `id` so far.
    pub(super) fn arena_waits_for(&self, id: StreamId) -> Result<()> {
        let r = self.registered(id)?;
        if id == StreamId::ARENA {
            return Ok(());
        }
        r.done
            .record(&r.stream)
            .map_err(driver_err("cuEventRecord"))?;
        self.stream
            .wait(&r.done)
            .map_err(driver_err("cuStreamWaitEvent"))
    }

    /// Stream `id` waits for everything enqueued on the arena stream so far.
    pub(super) fn waits_for_arena(&self, id: StreamId) -> Result<()> {
        let r = self.registered(id)?;
        if id == StreamId::ARENA {
            return Ok(());
        }
        r.arena_done
            .record(&self.stream)
            .map_err(driver_err("cuEventRecord"))?;
        r.stream
            .wait(&r.arena_done)
            .map_err(driver_err("cuStreamWaitEvent"))
    }

    /// Stream `later` waits for everything enqueued on `earlier` so far.
    pub(crate) fn stream_waits_for(&self, later: StreamId, earlier: StreamId) -> Result<()> {
        if later == earlier {
            return Ok(());
        }
        if later == StreamId::ARENA {
            return self.arena_waits_for(earlier);
        }
        if earlier == StreamId::ARENA {
            return self.waits_for_arena(later);
        }
        let (e, l) = (self.registered(earlier)?, self.registered(later)?);
        e.done
            .record(&e.stream)
            .map_err(driver_err("cuEventRecord"))?;
        l.stream
            .wait(&e.done)
            .map_err(driver_err("cuStreamWaitEvent"))
    }
}
