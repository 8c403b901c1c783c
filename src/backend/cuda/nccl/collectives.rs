//! The collectives of a [`Communicator`]: all-reduce, reduce-scatter,
//! all-gather, broadcast, send and receive, on anything that implements
//! cudarc's `DevicePtr` / `DevicePtrMut` (arena views from kernel
//! arguments taken for the communicator's stream, or cudarc buffers).

use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::sys;

use super::{Communicator, NcclType, ReduceOp};
use crate::error::{Error, Result};

impl Communicator {
    /// Sum (or another reduction) of every rank's `send` into every rank's
    /// `recv` (same length). In place: pass the same view as `recv` only
    /// through [`all_reduce_in_place`](Communicator::all_reduce_in_place).
    pub fn all_reduce<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_live()?;
        expect_len("all_reduce", recv.len(), send.len())?;
        let (src, _rs) = send.device_ptr(&self.stream);
        let (dst, _rd) = recv.device_ptr_mut(&self.stream);
        // SAFETY: both buffers hold `len` elements of `T` on this
        // communicator's device (the DevicePtr contract), ordered on its
        // stream by their SyncOnDrop guards.
        let r = unsafe {
            sys::ncclAllReduce(
                src as _,
                dst as _,
                send.len(),
                T::as_nccl_type(),
                op.raw(),
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclAllReduce", r)
    }

    /// All-reduce of `buf` in place.
    pub fn all_reduce_in_place<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_live()?;
        let n = buf.len();
        let (p, _r) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `buf` holds `n` elements of `T` on this device; NCCL
        // allows the same buffer as source and destination.
        let r = unsafe {
            sys::ncclAllReduce(
                p as _,
                p as _,
                n,
                T::as_nccl_type(),
                op.raw(),
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclAllReduce", r)
    }

    /// Each rank gets the reduction of its `recv.len()`-element share:
    /// `send` holds `world_size * recv.len()` elements.
    pub fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_live()?;
        expect_len(
            "reduce_scatter",
            send.len(),
            recv.len().saturating_mul(self.world_size),
        )?;
        let n = recv.len();
        let (src, _rs) = send.device_ptr(&self.stream);
        let (dst, _rd) = recv.device_ptr_mut(&self.stream);
        // SAFETY: sizes checked above; buffers valid per DevicePtr.
        let r = unsafe {
            sys::ncclReduceScatter(
                src as _,
                dst as _,
                n,
                T::as_nccl_type(),
                op.raw(),
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclReduceScatter", r)
    }

    /// Every rank's `send` concatenated, in rank order, into every rank's
    /// `recv` (`world_size * send.len()` elements).
    pub fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        self.check_live()?;
        expect_len(
            "all_gather",
            recv.len(),
            send.len().saturating_mul(self.world_size),
        )?;
        let (src, _rs) = send.device_ptr(&self.stream);
        let (dst, _rd) = recv.device_ptr_mut(&self.stream);
        // SAFETY: sizes checked above; buffers valid per DevicePtr.
        let r = unsafe {
            sys::ncclAllGather(
                src as _,
                dst as _,
                send.len(),
                T::as_nccl_type(),
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclAllGather", r)
    }

    /// `root`'s `buf` into every rank's `buf`, in place.
    pub fn broadcast<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        buf: &mut R,
        root: usize,
    ) -> Result<()> {
        self.check_live()?;
        let root = self.peer(root)?;
        let n = buf.len();
        let (p, _r) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `buf` holds `n` elements of `T` on this device.
        let r = unsafe {
            sys::ncclBroadcast(
                p as _,
                p as _,
                n,
                T::as_nccl_type(),
                root,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclBroadcast", r)
    }

    /// Sends `buf` to rank `peer` (which must post a matching
    /// [`recv`](Communicator::recv)); pair them inside
    /// [`group`](Communicator::group) when both directions are in flight.
    pub fn send<T: NcclType, S: DevicePtr<T>>(&self, buf: &S, peer: usize) -> Result<()> {
        self.check_live()?;
        let peer = self.peer(peer)?;
        let (p, _r) = buf.device_ptr(&self.stream);
        // SAFETY: `buf` holds `len` elements of `T` on this device.
        let r = unsafe {
            sys::ncclSend(
                p as _,
                buf.len(),
                T::as_nccl_type(),
                peer,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclSend", r)
    }

    /// Receives `buf.len()` elements from rank `peer`.
    pub fn recv<T: NcclType, R: DevicePtrMut<T>>(&self, buf: &mut R, peer: usize) -> Result<()> {
        self.check_live()?;
        let peer = self.peer(peer)?;
        let n = buf.len();
        let (p, _r) = buf.device_ptr_mut(&self.stream);
        // SAFETY: `buf` holds `n` elements of `T` on this device.
        let r = unsafe {
            sys::ncclRecv(
                p as _,
                n,
                T::as_nccl_type(),
                peer,
                self.comm,
                self.stream.cu_stream() as _,
            )
        };
        self.done("ncclRecv", r)
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
fn expect_len(_call: &'static str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            range_bytes: want as u64,
            given_bytes: got as u64,
        })
    }
}
