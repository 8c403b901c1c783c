//! The collectives of a [`Communicator`]: all-reduce, reduce-scatter,
//! all-gather, broadcast, send and receive, on anything that implements
//! cudarc's `DevicePtr` / `DevicePtrMut` (arena views from kernel
//! arguments taken for the communicator's stream, or cudarc buffers).

use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::sys;

use super::{Communicator, NcclType, ReduceOp};
use crate::error::{Error, Result};

/// Which NCCL call a collective makes, with what it takes besides its
/// buffers (ranks as the caller gave them, checked on the way).
#[derive(Debug, Clone, Copy)]
enum Call {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast { root: usize },
    Send { peer: usize },
    Recv { peer: usize },
}

/// The buffers of a collective: one read and one written, or a single one
/// (read, written, or both in place).
enum Buffers<'b, T> {
    Two(&'b dyn DevicePtr<T>, &'b mut dyn DevicePtrMut<T>),
    Read(&'b dyn DevicePtr<T>),
    Write(&'b mut dyn DevicePtrMut<T>),
}

impl Communicator {
    /// Sum (or another reduction) of every rank's `send` into every rank's
    /// `recv` (same length). In place: pass the same view as `recv` only
    /// through [`all_reduce_in_place`](Communicator::all_reduce_in_place).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn communicator(_: std::sync::Arc<cuarena::backend::cuda::cudarc::driver::CudaStream>) -> Communicator { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let comm_stream = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(comm_stream.clone())?;
    /// let comm = communicator(comm_stream); // `Communicator::init` on that stream
    /// let grads = arena.alloc_storage_dtype(DType::F32, 1 << 20)?;
    /// let summed = arena.alloc_storage_dtype(DType::F32, 1 << 20)?;
    /// {
    ///     let mut args = arena.kernel_args(s)?;
    ///     let (g, mut out) = (args.input::<f32>(&grads)?, args.output::<f32>(&summed)?);
    ///     comm.all_reduce(&g, &mut out, ReduceOp::Sum)?;
    /// }
    /// arena.compact()?; // waits (on the device) for the all-reduce before moving its tensors
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn all_reduce<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        let n = send.len();
        let lens = (recv.len(), n);
        self.enqueue(Call::AllReduce(op), n, lens, Buffers::Two(send, recv))
    }

    /// All-reduce of `buf` in place.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    /// use cuarena::{Arena, ArenaConfig, DType};
    /// # fn communicator(_: std::sync::Arc<cuarena::backend::cuda::cudarc::driver::CudaStream>) -> Communicator { unimplemented!() }
    ///
    /// let mut arena = Arena::cuda(ArenaConfig::new(1 << 30), 0)?;
    /// let comm_stream = arena.backend().context().new_stream().expect("stream");
    /// let s = arena.register_stream(comm_stream.clone())?;
    /// let comm = communicator(comm_stream); // `Communicator::init` on that stream
    /// let grads = arena.alloc_storage_dtype(DType::F32, 1 << 20)?;
    /// {
    ///     let mut args = arena.kernel_args(s)?;
    ///     let mut g = args.output::<f32>(&grads)?;
    ///     comm.all_reduce_in_place(&mut g, ReduceOp::Avg)?; // every rank's mean
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn all_reduce_in_place<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        let n = buf.len();
        self.enqueue(Call::AllReduce(op), n, (n, n), Buffers::Write(buf))
    }

    /// Each rank gets the reduction of its `recv.len()`-element share:
    /// `send` holds `world_size * recv.len()` elements.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::{Communicator, ReduceOp};
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank
    /// let share = 1 << 16;
    /// let grads = comm.stream().alloc_zeros::<f32>(share * comm.world_size()).expect("alloc");
    /// let mut mine = comm.stream().alloc_zeros::<f32>(share).expect("alloc");
    /// comm.reduce_scatter(&grads, &mut mine, ReduceOp::Sum)?; // share `rank` of the sum
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        let n = recv.len();
        let lens = (send.len(), n.saturating_mul(self.world_size));
        self.enqueue(Call::ReduceScatter(op), n, lens, Buffers::Two(send, recv))
    }

    /// Every rank's `send` concatenated, in rank order, into every rank's
    /// `recv` (`world_size * send.len()` elements).
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank
    /// let share = 1 << 16;
    /// let mine = comm.stream().alloc_zeros::<f32>(share).expect("alloc");
    /// let mut all = comm.stream().alloc_zeros::<f32>(share * comm.world_size()).expect("alloc");
    /// comm.all_gather(&mine, &mut all)?; // rank r's share at r * share
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let n = send.len();
        let lens = (recv.len(), n.saturating_mul(self.world_size));
        self.enqueue(Call::AllGather, n, lens, Buffers::Two(send, recv))
    }

    /// `root`'s `buf` into every rank's `buf`, in place.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank
    /// let host = vec![0.5f32; 1 << 16]; // rank 0's initial weights
    /// let mut weights = comm.stream().clone_htod(&host).expect("upload");
    /// comm.broadcast(&mut weights, 0)?; // every rank starts from rank 0's
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn broadcast<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        root: usize,
    ) -> Result<()> {
        let n = buf.len();
        self.enqueue(Call::Broadcast { root }, n, (n, n), Buffers::Write(buf))
    }

    /// Sends `buf` to rank `peer` (which must post a matching
    /// [`recv`](Communicator::recv)); pair them inside
    /// [`group`](Communicator::group) when both directions are in flight.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank
    /// let n = comm.world_size();
    /// let (next, prev) = ((comm.rank() + 1) % n, (comm.rank() + n - 1) % n);
    /// let out = comm.stream().alloc_zeros::<f32>(1024).expect("alloc");
    /// let mut incoming = comm.stream().alloc_zeros::<f32>(1024).expect("alloc");
    /// // Both directions in flight: one group, or the ring deadlocks.
    /// Communicator::group([&comm], || {
    ///     comm.send(&out, next)?;
    ///     comm.recv(&mut incoming, prev)
    /// })?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn send<T: NcclType, S: DevicePtr<T>>(&self, buf: &S, peer: usize) -> Result<()> {
        let n = buf.len();
        self.enqueue(Call::Send { peer }, n, (n, n), Buffers::Read(buf))
    }

    /// Receives `buf.len()` elements from rank `peer`.
    ///
    /// ```no_run
    /// use cuarena::backend::cuda::nccl::Communicator;
    /// # fn communicator() -> Communicator { unimplemented!() }
    ///
    /// let comm: Communicator = communicator(); // this process's rank
    /// let mut activations = comm.stream().alloc_zeros::<f32>(1 << 16).expect("alloc");
    /// if comm.rank() == 1 {
    ///     comm.recv(&mut activations, 0)?; // what rank 0 `send`s
    /// }
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn recv<T: NcclType, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: usize) -> Result<()> {
        let n = buf.len();
        self.enqueue(Call::Recv { peer }, n, (n, n), Buffers::Write(buf))
    }

    /// The one path of every collective: fails on an aborted communicator,
    /// on a buffer of `got` elements where the call needs `want`
    /// ([`Error::LengthMismatch`]) and on a rank outside the world; then
    /// orders the buffers on the communicator's stream (cudarc's events:
    /// a buffer read after its last writer, one written after its last
    /// reader and writer), makes the NCCL call on `count` elements, settles
    /// the communicator ([`done`](Communicator::done)), and only then
    /// records the buffers' use on the stream: a non-blocking communicator
    /// may enqueue its work as late as the settling.
    fn enqueue<T: NcclType>(
        &self,
        call: Call,
        count: usize,
        (got, want): (usize, usize),
        buffers: Buffers<'_, T>,
    ) -> Result<()> {
        self.check_live()?;
        expect_len(got, want)?;
        let peer = match call {
            Call::Broadcast { root: rank }
            | Call::Send { peer: rank }
            | Call::Recv { peer: rank } => self.peer(rank)?,
            Call::AllReduce(_) | Call::ReduceScatter(_) | Call::AllGather => 0,
        };
        let stream = &self.stream;
        // The guards record each buffer's use on the stream when dropped.
        let (src, dst, guards) = match buffers {
            Buffers::Two(send, recv) => {
                let (src, read) = send.device_ptr(stream);
                let (dst, write) = recv.device_ptr_mut(stream);
                (src, dst, [Some(read), Some(write)])
            }
            Buffers::Read(buf) => {
                let (p, read) = buf.device_ptr(stream);
                (p, p, [Some(read), None])
            }
            Buffers::Write(buf) => {
                let (p, write) = buf.device_ptr_mut(stream);
                (p, p, [Some(write), None])
            }
        };
        let (src, dst) = (src as *const c_void, dst as *mut c_void);
        let (ty, comm, cu) = (T::as_nccl_type(), self.comm, stream.cu_stream() as _);
        // SAFETY: `src` and `dst` address buffers of at least `count`
        // elements of `T` on this communicator's device (the
        // DevicePtr/DevicePtrMut contract; the calls that read or write
        // `world_size * count` elements had those lengths checked above);
        // NCCL allows the same buffer as source and destination. The
        // communicator is live and `peer` one of its ranks; the guards keep
        // the buffers ordered on `stream` until the call has enqueued its
        // work there.
        let (name, r) = unsafe {
            match call {
                Call::AllReduce(op) => (
                    "ncclAllReduce",
                    sys::ncclAllReduce(src, dst, count, ty, op.raw(), comm, cu),
                ),
                Call::ReduceScatter(op) => (
                    "ncclReduceScatter",
                    sys::ncclReduceScatter(src, dst, count, ty, op.raw(), comm, cu),
                ),
                Call::AllGather => (
                    "ncclAllGather",
                    sys::ncclAllGather(src, dst, count, ty, comm, cu),
                ),
                Call::Broadcast { .. } => (
                    "ncclBroadcast",
                    sys::ncclBroadcast(src, dst, count, ty, peer, comm, cu),
                ),
                Call::Send { .. } => ("ncclSend", sys::ncclSend(src, count, ty, peer, comm, cu)),
                Call::Recv { .. } => ("ncclRecv", sys::ncclRecv(dst, count, ty, peer, comm, cu)),
            }
        };
        let settled = self.done(name, r);
        drop(guards);
        settled
    }

    fn peer(&self, rank: usize) -> Result<i32> {
        if rank >= self.world_size {
            return Err(Error::InvalidInput {
                input: "config",
                reason: format!("rank {rank} in a world of {}", self.world_size),
            });
        }
        i32::try_from(rank).map_err(|_| Error::InvalidInput {
            input: "config",
            reason: format!("rank {rank} does not fit NCCL's int"),
        })
    }
}

/// [`Error::LengthMismatch`] unless `got == want` (elements).
fn expect_len(got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            range_bytes: want as u64,
            given_bytes: got as u64,
        })
    }
}
