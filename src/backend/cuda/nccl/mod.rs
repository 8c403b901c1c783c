//! NCCL communicators (feature `nccl`), through cudarc's NCCL bindings.
//!
//! Why not cudarc's safe `Comm` as it is: its communicators are blocking,
//! so a rank whose peer died hangs in the driver forever, and its `Drop`
//! panics when `ncclCommAbort` fails. A [`Communicator`] is created
//! *non-blocking* (`ncclConfig_t::blocking = 0`): every call returns at
//! once, and the host polls `ncclCommGetAsyncError` against a deadline;
//! past it the communicator is aborted (`ncclCommAbort`, which also ends
//! its kernels, so the streams that waited on them run again) and the call
//! returns [`BackendError::Nccl`] saying so. Collectives take anything that
//! implements cudarc's `DevicePtr` / `DevicePtrMut` — arena views and
//! sub-ranges from the arena's kernel arguments, or plain cudarc buffers —
//! and run on the communicator's stream.
//!
//! # Which NCCL
//!
//! cudarc loads `libnccl.so` at run time from the library path (then
//! `libnccl.so.<CUDA major>` and other usual names); no NCCL is needed to
//! build. The feature binds NCCL 2.28's API (cudarc's `nccl-02028`), the
//! version on our GPU machines; it works with libnccl 2.28 and later, since
//! the functions called here and the config struct are versioned by NCCL
//! itself. cudarc's plain `nccl` feature selects 2.30 bindings, which need
//! libnccl 2.30 or later.
//!
//! Keep NVLink multicast off on the machines this crate is tested on
//! (`NCCL_NVLS_ENABLE=0` in the environment).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
pub use cudarc::nccl::NcclType;
use cudarc::nccl::{result, sys};

mod collectives;

use super::driver_err;
use crate::error::{BackendError, Error, Result};

thread_local! {
    /// True between `ncclGroupStart` and `ncclGroupEnd` on this thread:
    /// calls are deferred to the group's end, so they are not settled one
    /// by one.
    static IN_GROUP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How long a call may wait for its peers before the communicator is
/// aborted, unless set with [`Communicator::with_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Mean (NCCL's `ncclAvg`).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }
}

/// The id every rank of one communicator is created with: made by one
/// rank ([`UniqueId::new`]) and passed to the others, as 256 hex digits
/// ([`to_hex`](UniqueId::to_hex) / [`from_hex`](UniqueId::from_hex)) in a
/// file or an environment variable, say.
#[derive(Debug, Clone, Copy)]
pub struct UniqueId {
    raw: sys::ncclUniqueId,
}

impl UniqueId {
    /// A new id (rank 0 makes it; the call talks to no peer).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::UniqueId;
    ///
    /// // On rank 0, before starting the other ranks: where they will read it.
    /// let id = UniqueId::new()?;
    /// std::fs::write("/tmp/nccl-id", id.to_hex()).expect("write the id");
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn new() -> Result<Self> {
        available().map_err(|reason| Error::Backend(BackendError::NoDevice { reason }))?;
        let raw = result::get_uniqueid().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(Self { raw })
    }

    /// The id as 256 lowercase hex digits.
    ///
    /// ```
    /// use cuarena::backend::cuda::nccl::UniqueId;
    ///
    /// # let id = UniqueId::from_hex(&"5a".repeat(128))?;
    /// // `id` from `UniqueId::new()` on rank 0: passed to the others as text.
    /// let hex = id.to_hex();
    /// assert_eq!(hex.len(), 256);
    /// assert_eq!(UniqueId::from_hex(&hex)?.to_hex(), hex);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn to_hex(&self) -> String {
        self.raw
            .internal
            .iter()
            .map(|&c| format!("{:02x}", c as u8))
            .collect()
    }

    /// The id written by [`to_hex`](UniqueId::to_hex). Surrounding
    /// whitespace is ignored; anything else than 256 hex digits is
    /// [`Error::InvalidInput`].
    ///
    /// ```
    /// use cuarena::backend::cuda::nccl::UniqueId;
    /// use cuarena::Error;
    ///
    /// # let text = format!("{}\n", "5a".repeat(128));
    /// // `text` as rank 0 wrote it (`std::fs::read_to_string` of its id file, say).
    /// let id = UniqueId::from_hex(&text)?;
    /// assert_eq!(id.to_hex(), text.trim());
    /// assert!(matches!(UniqueId::from_hex("not an id"), Err(Error::InvalidInput { .. })));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn from_hex(text: &str) -> Result<Self> {
        let text = text.trim();
        let bad = || Error::InvalidInput {
            input: "config",
            reason: format!(
                "an NCCL unique id is 256 hex digits; got {} characters",
                text.len()
            ),
        };
        if text.len() != 256 || !text.is_ascii() {
            return Err(bad());
        }
        let mut internal = [0 as std::ffi::c_char; 128];
        for (i, c) in internal.iter_mut().enumerate() {
            let byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
            *c = byte as std::ffi::c_char;
        }
        Ok(Self {
            raw: sys::ncclUniqueId { internal },
        })
    }
}

/// Ok when the NCCL library can be loaded; otherwise why not.
///
/// ```
/// use cuarena::backend::cuda::nccl;
///
/// match nccl::available() {
///     Ok(()) => println!("libnccl loads: collectives can run"),
///     Err(why) => println!("single-GPU training: {why}"),
/// }
/// ```
pub fn available() -> std::result::Result<(), String> {
    // SAFETY: only tries to open the library.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err("no NCCL library (libnccl.so) on the library path".to_string())
    }
}

/// Maps a cudarc NCCL error to [`BackendError::Nccl`] naming `call`.
fn nccl_err(call: &'static str) -> impl Fn(result::NcclError) -> Error {
    move |e| {
        Error::Backend(BackendError::Nccl {
            call,
            reason: format!("{:?}", e.0),
        })
    }
}

/// One rank of an NCCL communicator, on one stream. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct Communicator {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    aborted: AtomicBool,
}

// SAFETY: an NCCL communicator may be used from any thread, one thread at
// a time. `Communicator` is `Send` but not `Sync`: NCCL's calls on one
// communicator are not thread-safe, and every method takes `&self`, so
// sharing one between threads is refused by the compiler (use one
// communicator per thread, as `init_all` makes them). The raw pointer is
// owned by this value and released once, in `Drop`.
unsafe impl Send for Communicator {}

impl Communicator {
    /// Rank `rank` of `world_size`, on `stream`, joining the communicator
    /// named by `id`. Returns when every rank has joined, or fails with
    /// [`BackendError::Nccl`] after [`DEFAULT_TIMEOUT`] (the communicator is
    /// aborted). Use [`init_with_timeout`](Communicator::init_with_timeout)
    /// for another bound.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::cudarc::driver::CudaContext;
    /// use cuarena::backend::cuda::nccl::{Communicator, UniqueId};
    ///
    /// // One process per GPU; the launcher sets RANK and wrote rank 0's id.
    /// let rank: usize = std::env::var("RANK").expect("RANK").parse().expect("a rank");
    /// let id = UniqueId::from_hex(&std::fs::read_to_string("/tmp/nccl-id").expect("the id"))?;
    /// let stream = CudaContext::new(rank).expect("GPU").new_stream().expect("stream");
    /// let comm = Communicator::init(stream, id, rank, 2)?; // returns once both ranks joined
    /// assert_eq!((comm.rank(), comm.world_size()), (rank, 2));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn init(
        stream: Arc<CudaStream>,
        id: UniqueId,
        rank: usize,
        world_size: usize,
    ) -> Result<Self> {
        Self::init_with_timeout(stream, id, rank, world_size, DEFAULT_TIMEOUT)
    }

    /// [`init`](Communicator::init) with `timeout` as the bound of this call
    /// and of every later wait.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuarena::backend::cuda::cudarc::driver::CudaContext;
    /// use cuarena::backend::cuda::nccl::{Communicator, UniqueId};
    /// use cuarena::{BackendError, Error};
    ///
    /// # let (rank, id) = (1, UniqueId::new()?);
    /// let stream = CudaContext::new(rank).expect("GPU").new_stream().expect("stream");
    /// match Communicator::init_with_timeout(stream, id, rank, 2, Duration::from_secs(10)) {
    ///     Ok(comm) => assert_eq!(comm.timeout(), Duration::from_secs(10)),
    ///     Err(Error::Backend(BackendError::Nccl { reason, .. })) => eprintln!("no peer: {reason}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn init_with_timeout(
        stream: Arc<CudaStream>,
        id: UniqueId,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<Self> {
        let comm = Self::start(&stream, id, rank, world_size)?;
        let c = Self::started(comm, stream, rank, world_size, timeout);
        c.settle("ncclCommInitRankConfig")?;
        Ok(c)
    }

    /// One communicator of `streams.len()` ranks in this process (a stream
    /// per GPU, rank = position), created together in one NCCL group.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuarena::backend::cuda::cudarc::driver::CudaContext;
    /// use cuarena::backend::cuda::nccl::Communicator;
    ///
    /// // Every visible GPU, from one process: rank i on GPU i.
    /// let n = CudaContext::device_count().expect("GPUs") as usize;
    /// let streams = (0..n)
    ///     .map(|i| CudaContext::new(i).and_then(|ctx| ctx.new_stream()).expect("stream"))
    ///     .collect();
    /// let comms = Communicator::init_all(streams, Duration::from_secs(60))?;
    /// assert!(comms.iter().enumerate().all(|(i, c)| c.rank() == i && c.world_size() == n));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn init_all(streams: Vec<Arc<CudaStream>>, timeout: Duration) -> Result<Vec<Self>> {
        let id = UniqueId::new()?;
        let world_size = streams.len();
        result::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let mut comms = Vec::with_capacity(world_size);
        let mut started = Ok(());
        for (rank, stream) in streams.into_iter().enumerate() {
            match Self::start(&stream, id, rank, world_size) {
                Ok(comm) => comms.push(Self::started(comm, stream, rank, world_size, timeout)),
                Err(e) => {
                    started = Err(e);
                    break;
                }
            }
        }
        let ended = result::group_end().map_err(nccl_err("ncclGroupEnd"));
        started?;
        ended?;
        for c in &comms {
            c.settle("ncclCommInitRankConfig")?;
        }
        Ok(comms)
    }

    /// The communicator of a started init (owning `comm` from here on, so
    /// that a failure to settle aborts it).
    fn started(
        comm: sys::ncclComm_t,
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Self {
        Self {
            comm,
            stream,
            rank,
            world_size,
            timeout,
            aborted: AtomicBool::new(false),
        }
    }

    /// Starts a non-blocking init; the caller settles it.
    fn start(
        stream: &CudaStream,
        id: UniqueId,
        rank: usize,
        world_size: usize,
    ) -> Result<sys::ncclComm_t> {
        available().map_err(|reason| Error::Backend(BackendError::NoDevice { reason }))?;
        let bad = || Error::InvalidInput {
            input: "config",
            reason: format!("rank {rank} of a world of {world_size}"),
        };
        let n = i32::try_from(world_size).map_err(|_| bad())?;
        let r = i32::try_from(rank).map_err(|_| bad())?;
        if rank >= world_size {
            return Err(bad());
        }
        stream
            .context()
            .bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let mut config = config_initializer();
        config.blocking = 0;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid for the call; `config` is
        // initialised as NCCL_CONFIG_INITIALIZER does, for the bound 2.28
        // struct. A non-blocking init may return ncclInProgress; the caller
        // polls it to completion.
        let r = unsafe { sys::ncclCommInitRankConfig(&mut comm, n, id.raw, r, &mut config) };
        match r {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(comm),
            e => Err(Error::Backend(BackendError::Nccl {
                call: "ncclCommInitRankConfig",
                reason: format!("{e:?}"),
            })),
        }
    }

    /// This rank.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// if comm.rank() == 0 {
    ///     println!("step done on {} ranks", comm.world_size()); // logged once, by rank 0
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// let share = (1 << 20) / comm.world_size(); // elements of each rank's share
    /// let mut gathered = comm.stream().alloc_zeros::<f32>(share * comm.world_size()).expect("alloc");
    /// let mine = comm.stream().alloc_zeros::<f32>(share).expect("alloc");
    /// comm.all_gather(&mine, &mut gathered)?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The stream collectives run on.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// let host = vec![1.0f32; 1024];
    /// let mut buf = comm.stream().clone_htod(&host).expect("upload"); // on the stream collectives run on
    /// comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    /// comm.synchronize()?;
    /// assert_eq!(comm.stream().clone_dtoh(&buf).expect("download")[0], comm.world_size() as f32);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The bound on every wait.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, DEFAULT_TIMEOUT};
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// assert_eq!(comm.timeout(), DEFAULT_TIMEOUT); // made by `Communicator::init`
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the bound on every later wait.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// // Joining waited for every rank to start; a training step gets a shorter bound.
    /// let comm = comm.with_timeout(Duration::from_secs(5));
    /// assert_eq!(comm.timeout(), Duration::from_secs(5));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// True once the communicator was aborted (by a timeout, an error, or
    /// [`abort`](Communicator::abort)); every later call fails.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// let mut grads = comm.stream().alloc_zeros::<f32>(1 << 20).expect("alloc");
    /// let step = comm
    ///     .all_reduce_in_place(&mut grads, ReduceOp::Avg)
    ///     .and_then(|()| comm.synchronize());
    /// if step.is_err() && comm.is_aborted() {
    ///     // A peer died or stopped: make a new communicator (a new id) to go on.
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Aborts the communicator: pending collectives end, on this rank, and
    /// the streams waiting for them run again. Peers see their own calls
    /// fail or time out.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// // A watchdog decided this job is over: end the pending collectives now.
    /// comm.abort();
    /// assert!(comm.is_aborted());
    /// assert!(comm.synchronize().is_err()); // every later call fails
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn abort(&self) {
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: the handle is live (not aborted before, swap above).
            let _ = unsafe { sys::ncclCommAbort(self.comm) };
        }
    }

    fn check_live(&self) -> Result<()> {
        if self.is_aborted() {
            return Err(Error::Backend(BackendError::Nccl {
                call: "communicator",
                reason: "it was aborted after an earlier error or timeout".to_string(),
            }));
        }
        Ok(())
    }

    /// Polls the communicator's asynchronous state until it leaves
    /// `ncclInProgress`; aborts on an error or past the timeout.
    fn settle(&self, call: &'static str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let mut state = sys::ncclResult_t::ncclSuccess;
            // SAFETY: the handle is live; `state` is valid for the call.
            let r = unsafe { sys::ncclCommGetAsyncError(self.comm, &mut state) };
            if r != sys::ncclResult_t::ncclSuccess {
                self.abort();
                return Err(Error::Backend(BackendError::Nccl {
                    call: "ncclCommGetAsyncError",
                    reason: format!("{r:?}"),
                }));
            }
            match state {
                sys::ncclResult_t::ncclSuccess => return Ok(()),
                sys::ncclResult_t::ncclInProgress if Instant::now() < deadline => {
                    std::thread::yield_now();
                }
                sys::ncclResult_t::ncclInProgress => {
                    self.abort();
                    return Err(Error::Backend(BackendError::Nccl {
                        call,
                        reason: format!(
                            "no progress within {:?}: a peer did not join or died; \
                             the communicator was aborted",
                            self.timeout
                        ),
                    }));
                }
                e => {
                    self.abort();
                    return Err(Error::Backend(BackendError::Nccl {
                        call,
                        reason: format!("{e:?}; the communicator was aborted"),
                    }));
                }
            }
        }
    }

    /// Checks a call's immediate result, then settles the communicator
    /// (inside a group, [`group`](Communicator::group) settles at its end).
    fn done(&self, call: &'static str, r: sys::ncclResult_t) -> Result<()> {
        match r {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
                if IN_GROUP.with(|g| g.get()) =>
            {
                Ok(())
            }
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => self.settle(call),
            e => {
                self.abort();
                Err(Error::Backend(BackendError::Nccl {
                    call,
                    reason: format!("{e:?}; the communicator was aborted"),
                }))
            }
        }
    }

    /// Waits, on the host, until every collective enqueued so far has
    /// finished, or the timeout passes (then the communicator is aborted and
    /// the error says so). The one place this module blocks the host on
    /// device work: for tests, shutdown and failure detection; the training
    /// path orders work with stream waits instead.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank, from `Communicator::init`
    /// let mut buf = comm.stream().alloc_zeros::<f32>(1024).expect("alloc");
    /// comm.broadcast(&mut buf, 0)?;
    /// comm.synchronize()?; // finished on this rank, or an error within the timeout
    /// drop(comm); // nothing in flight: dropping ends nothing
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn synchronize(&self) -> Result<()> {
        self.check_live()?;
        let event = self
            .stream
            .record_event(None)
            .map_err(driver_err("cuEventRecord"))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if event
                .try_is_complete()
                .map_err(driver_err("cuEventQuery"))?
            {
                return self.settle("synchronize");
            }
            self.settle("synchronize")?;
            if Instant::now() >= deadline {
                self.abort();
                return Err(Error::Backend(BackendError::Nccl {
                    call: "synchronize",
                    reason: format!(
                        "collectives did not finish within {:?}: a peer stopped; the \
                         communicator was aborted",
                        self.timeout
                    ),
                }));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Runs `calls` as one NCCL group (`ncclGroupStart` / `ncclGroupEnd`)
    /// over `comms`: point-to-point pairs, or one call per communicator of
    /// [`init_all`](Communicator::init_all) from one thread. After the group
    /// ends, every communicator in `comms` is settled: a non-blocking
    /// group enqueues its work on the streams only then, so stream waits
    /// recorded after this returns order after the collectives.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use cuarena::backend::cuda::cudarc::driver::CudaContext;
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    ///
    /// let streams = (0..2)
    ///     .map(|i| CudaContext::new(i).and_then(|ctx| ctx.new_stream()).expect("stream"))
    ///     .collect();
    /// let comms = Communicator::init_all(streams, Duration::from_secs(60))?;
    /// let mut bufs: Vec<_> = comms
    ///     .iter()
    ///     .map(|c| c.stream().alloc_zeros::<f32>(1 << 20).expect("alloc"))
    ///     .collect();
    /// // One thread drives both ranks: their calls must be one group.
    /// Communicator::group(&comms, || {
    ///     for (c, b) in comms.iter().zip(bufs.iter_mut()) {
    ///         c.all_reduce_in_place(b, ReduceOp::Sum)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn group<'c, F>(comms: impl IntoIterator<Item = &'c Communicator>, calls: F) -> Result<()>
    where
        F: FnOnce() -> Result<()>,
    {
        result::group_start().map_err(nccl_err("ncclGroupStart"))?;
        IN_GROUP.with(|g| g.set(true));
        let r = calls();
        IN_GROUP.with(|g| g.set(false));
        let ended = result::group_end().map_err(nccl_err("ncclGroupEnd"));
        let mut settled = Ok(());
        for c in comms {
            if let Err(e) = c.settle("ncclGroupEnd") {
                settled = settled.and(Err(e));
            }
        }
        r?;
        ended?;
        settled
    }
}

impl Drop for Communicator {
    /// Aborts the communicator: collectives still in flight on this rank
    /// are **ended, not finished** (their outputs are undefined), and peers
    /// see their calls fail or time out. Call
    /// [`synchronize`](Communicator::synchronize) before dropping to let
    /// them finish. Not a finalize: finalizing waits for every peer, and a
    /// drop must not hang. Errors are ignored: nothing can be done about
    /// them here.
    fn drop(&mut self) {
        self.abort();
    }
}

/// `NCCL_CONFIG_INITIALIZER` for the bound NCCL 2.28 struct: every field
/// "undefined" (NCCL picks its default), as `nccl.h` writes it.
fn config_initializer() -> sys::ncclConfig_t {
    const UNDEF_INT: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        version: 22800, // NCCL_VERSION(2, 28, 0)
        blocking: UNDEF_INT,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_round_trip_through_hex_and_bad_text_is_an_error() {
        let mut internal = [0 as std::ffi::c_char; 128];
        for (i, c) in internal.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37) as std::ffi::c_char;
        }
        let id = UniqueId {
            raw: sys::ncclUniqueId { internal },
        };
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        let back = UniqueId::from_hex(&format!("  {hex}\n")).unwrap();
        assert_eq!(back.raw.internal, internal);
        for bad in ["", "zz", &hex[..254], &format!("{}g", &hex[..255])] {
            assert!(
                matches!(
                    UniqueId::from_hex(bad),
                    Err(Error::InvalidInput {
                        input: "config",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_config_initializer_matches_nccl_h() {
        let c = config_initializer();
        assert_eq!(c.magic, 0xcafe_beef);
        assert_eq!(c.size, std::mem::size_of::<sys::ncclConfig_t>());
        assert_eq!(c.blocking, i32::MIN);
    }
}
