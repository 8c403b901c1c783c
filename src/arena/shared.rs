//! An arena many threads share.

use std::cell::RefCell;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::stats_cell::StatsCell;
use super::{Arena, Stats};
use crate::backend::{Backend, HostBackend};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::storage::{AsRange, Storage};
use crate::stream::StreamId;

/// A thread-safe arena: `Clone`, `Send + Sync` (for a `Send + Sync`
/// backend), shared by every thread of a framework.
///
/// Calls that only read or take kernel arguments (`read`, `read_into`,
/// `read_bytes`, `record_stream`, `wait_on_arena`, [`with`](Self::with),
/// `with_kernel_args` on CUDA) share the lock, so several threads read and
/// launch at once; everything that can allocate, move, spill or write
/// (`alloc_*`, `write*`, `copy`, `fill`, `make_resident`, `reclaim`,
/// [`with_mut`](Self::with_mut)) takes it exclusively. The whole [`Arena`]
/// API is reached through closures, [`with`](Self::with) and
/// [`with_mut`](Self::with_mut), never through a guard that could outlive
/// the call, and [`stats`](Self::stats) needs no lock at all.
///
/// **No call deadlocks its thread.** A thread takes the lock at most once:
/// calling this arena's methods from inside its own `with`/`with_mut`
/// closure (through a clone, say) returns [`Error::Reentrant`] rather than
/// waiting on itself, and so does taking an arena of lower (or equal) id
/// than one the thread holds, so two threads nesting two arenas cannot
/// wait on each other. Inside a closure, use the `Arena` it was given (a
/// closure that waits for another thread calling this arena still waits
/// forever, as with any lock).
///
/// [`Storage`]s it hands out are freed when their last owner drops, on any
/// thread, without taking the lock: the handle waits in the reclaim queue
/// for the arena's next allocation, compaction or
/// [`reclaim`](SharedArena::reclaim). A spilled storage is brought back by
/// the calls that read or write it here, or by
/// [`make_resident`](SharedArena::make_resident).
#[derive(Debug)]
pub struct SharedArena<B: Backend = HostBackend> {
    inner: Arc<Shared<B>>,
}

#[derive(Debug)]
struct Shared<B: Backend> {
    /// The arena's id, readable without the lock.
    id: u64,
    lock: RwLock<Arena<B>>,
    /// Published after every exclusive call, read by `stats`.
    stats: StatsCell,
}

impl<B: Backend> Clone for SharedArena<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

thread_local! {
    /// Ids of the shared arenas whose lock this thread holds, in the order
    /// taken (so increasing: see `Hold::enter`).
    static HELD: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// This thread's mark on arena `id` while it holds the lock; dropping it
/// (after the guard, on return or unwind) removes the mark.
struct Hold {
    id: u64,
    marked: bool,
}

impl Hold {
    /// Marks arena `id` as held by this thread, or refuses `call` when that
    /// could deadlock: the thread holds it already, or holds one of higher
    /// id (threads take arenas in increasing id order, so none waits on a
    /// thread that waits on it).
    fn enter(call: &'static str, id: u64) -> Result<Self> {
        let marked = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(&top) = held.last() {
                if top >= id {
                    return Err(Error::Reentrant {
                        call,
                        arena: id,
                        held: top,
                    });
                }
            }
            held.push(id);
            Ok(())
        });
        match marked {
            Ok(r) => r.map(|()| Hold { id, marked: true }),
            // The thread is exiting (a destructor of another thread-local
            // calls in): nothing of its own can be held any more.
            Err(_) => Ok(Hold { id, marked: false }),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.marked {
            let _ = HELD.try_with(|held| {
                let mut held = held.borrow_mut();
                if let Some(i) = held.iter().rposition(|&h| h == self.id) {
                    held.remove(i);
                }
            });
        }
    }
}

/// A lock guard with this thread's mark, dropped after it.
struct Guard<G> {
    guard: G,
    _hold: Hold,
}

/// A thread panicked while holding the lock: the arena may be part-way
/// through an operation.
fn lock_poisoned() -> Error {
    Error::Poisoned {
        reason: "a thread panicked while it held the shared arena's lock".to_string(),
    }
}

impl<B: Backend> SharedArena<B> {
    /// Shares `arena`.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let other = dev.clone(); // the same arena, for another thread
    /// std::thread::spawn(move || other.alloc_storage(256).map(drop)).join().unwrap()?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn new(arena: Arena<B>) -> Self {
        Self {
            inner: Arc::new(Shared {
                id: arena.id(),
                stats: StatsCell::new(&arena.stats()),
                lock: RwLock::new(arena),
            }),
        }
    }

    /// The arena's id (no lock).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(256)?;
    /// assert_eq!(s.arena_id(), dev.id());
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The statistics as of the last call that changed the arena, without
    /// taking the lock: never waits for other threads' work, and may be
    /// called anywhere, inside [`with`](Self::with) and
    /// [`with_mut`](Self::with_mut) closures included.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let _s = dev.alloc_storage(256)?;
    /// assert_eq!(dev.stats().live_blocks, 1);
    /// dev.with(|_| assert_eq!(dev.stats().allocs, 1))?; // no lock: fine inside `with`
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.stats.read()
    }

    fn read_lock(&self, call: &'static str) -> Result<Guard<RwLockReadGuard<'_, Arena<B>>>> {
        let hold = Hold::enter(call, self.inner.id)?;
        let guard = self.inner.lock.read().map_err(|_| lock_poisoned())?;
        Ok(Guard { guard, _hold: hold })
    }

    fn write_lock(&self, call: &'static str) -> Result<Guard<RwLockWriteGuard<'_, Arena<B>>>> {
        let hold = Hold::enter(call, self.inner.id)?;
        let guard = self.inner.lock.write().map_err(|_| lock_poisoned())?;
        Ok(Guard { guard, _hold: hold })
    }

    /// Runs `f` under the exclusive lock, then publishes the statistics
    /// (failed calls count too).
    fn exclusive<R>(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut Arena<B>) -> Result<R>,
    ) -> Result<R> {
        let mut g = self.write_lock(call)?;
        let r = f(&mut g.guard);
        self.inner.stats.publish(&g.guard.stats());
        r
    }

    /// Runs `f` with the arena under the shared lock: other threads read,
    /// take kernel arguments and run their own `with` at the same time.
    /// Inside `f`, use the `&Arena` given; a call on this `SharedArena`
    /// there is [`Error::Reentrant`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(256)?;
    /// let h = s.handle().unwrap();
    /// let offset = dev.with(|a| a.resolve(h))??; // nothing moves while `f` runs
    /// assert_eq!(offset, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn with<R>(&self, f: impl FnOnce(&Arena<B>) -> R) -> Result<R> {
        let g = self.read_lock("with")?;
        Ok(f(&g.guard))
    }

    /// Runs `f` with the arena under the exclusive lock: the whole
    /// [`Arena`] API (pins, handles, compaction, streams). Inside `f`, use
    /// the `&mut Arena` given; a call on this `SharedArena` there is
    /// [`Error::Reentrant`]. The statistics are published when it returns.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(256)?;
    /// let h = s.handle().unwrap();
    /// let pins = dev.with_mut(|a| a.pin(h))??; // the whole Arena API
    /// assert_eq!(pins, 1);
    /// dev.with_mut(|a| a.unpin(h))??;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn with_mut<R>(&self, f: impl FnOnce(&mut Arena<B>) -> R) -> Result<R> {
        self.exclusive("with_mut", |a| Ok(f(a)))
    }

    /// Runs `f` under the shared lock; if it finds a spilled block
    /// ([`Error::NotResident`]), brings the blocks `r` names back and runs
    /// `g` under the exclusive lock instead.
    fn shared_or_resident<R>(
        &self,
        call: &'static str,
        r: &impl AsRange,
        f: impl FnOnce(&Arena<B>) -> Result<R>,
        g: impl FnOnce(&Arena<B>) -> Result<R>,
    ) -> Result<R> {
        {
            let a = self.read_lock(call)?;
            match f(&a.guard) {
                Err(Error::NotResident) => {}
                done => return done,
            }
        }
        self.exclusive(call, |a| {
            a.make_resident(&[r])?;
            g(a)
        })
    }

    /// [`Arena::alloc_storage`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(1024)?;
    /// assert_eq!((s.len_bytes(), s.dtype()), (1024, None));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_storage(&self, bytes: u64) -> Result<Storage> {
        self.exclusive("alloc_storage", |a| a.alloc_storage(bytes))
    }

    /// [`Arena::alloc_storage_dtype`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage_dtype(DType::I64, 4)?;
    /// assert_eq!((s.len_bytes(), s.numel()), (32, 4));
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn alloc_storage_dtype(&self, dtype: DType, numel: u64) -> Result<Storage> {
        self.exclusive("alloc_storage_dtype", |a| {
            a.alloc_storage_dtype(dtype, numel)
        })
    }

    /// [`Arena::write`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage_dtype(DType::F32, 2)?;
    /// dev.write(&s, &[1.5f32, 2.5])?;
    /// assert_eq!(dev.read::<f32>(&s)?, [1.5, 2.5]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn write<T: Element>(&self, dst: impl AsRange, data: &[T]) -> Result<()> {
        self.exclusive("write", |a| a.write(dst, data))
    }

    /// [`Arena::write_bytes`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(4)?;
    /// dev.write_bytes(&s, b"abcd")?;
    /// assert_eq!(dev.read_bytes(&s)?, b"abcd");
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn write_bytes(&self, dst: impl AsRange, data: &[u8]) -> Result<()> {
        self.exclusive("write_bytes", |a| a.write_bytes(dst, data))
    }

    /// [`Arena::read`], under the shared lock; a spilled block is brought
    /// back first (under the exclusive lock).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage_dtype(DType::U8, 3)?;
    /// dev.write(&s, &[1u8, 2, 3])?;
    /// assert_eq!(dev.read::<u8>(s.slice(1..3)?)?, [2, 3]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read<T: Element>(&self, src: impl AsRange) -> Result<Vec<T>> {
        self.shared_or_resident("read", &src, |a| a.read(&src), |a| a.read(&src))
    }

    /// [`Arena::read_into`], under the shared lock; a spilled block is
    /// brought back first (under the exclusive lock).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage_dtype(DType::U32, 2)?;
    /// dev.fill(&s, 9u32)?;
    /// let mut out = [0u32; 2];
    /// dev.read_into(&s, &mut out)?;
    /// assert_eq!(out, [9, 9]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read_into<T: Element>(&self, src: impl AsRange, out: &mut [T]) -> Result<()> {
        let call = "read_into";
        {
            let a = self.read_lock(call)?;
            match a.guard.read_into(&src, out) {
                Err(Error::NotResident) => {}
                done => return done,
            }
        }
        self.exclusive(call, |a| {
            a.make_resident(&[&src])?;
            a.read_into(&src, out)
        })
    }

    /// [`Arena::read_bytes`], under the shared lock; a spilled block is
    /// brought back first (under the exclusive lock).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(2)?;
    /// dev.write_bytes(&s, &[7, 8])?;
    /// assert_eq!(dev.read_bytes(&s)?, [7, 8]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn read_bytes(&self, src: impl AsRange) -> Result<Vec<u8>> {
        self.shared_or_resident(
            "read_bytes",
            &src,
            |a| a.read_bytes(&src),
            |a| a.read_bytes(&src),
        )
    }

    /// [`Arena::copy`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let (a, b) = (dev.alloc_storage(8)?, dev.alloc_storage(8)?);
    /// dev.write_bytes(&a, &[5; 8])?;
    /// dev.copy(&a, &b)?;
    /// assert_eq!(dev.read_bytes(&b)?, [5; 8]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn copy(&self, src: impl AsRange, dst: impl AsRange) -> Result<()> {
        self.exclusive("copy", |a| a.copy(src, dst))
    }

    /// [`Arena::fill`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, DType, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage_dtype(DType::I16, 3)?;
    /// dev.fill(&s, -1i16)?;
    /// assert_eq!(dev.read::<i16>(&s)?, [-1; 3]);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn fill<T: Element>(&self, dst: impl AsRange, value: T) -> Result<()> {
        self.exclusive("fill", |a| a.fill(dst, value))
    }

    /// [`Arena::make_resident`]: brings spilled blocks back (exclusive).
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let config = ArenaConfig::new(16 << 10).with_spill_host_bytes(32 << 10);
    /// let dev = SharedArena::new(Arena::host(config)?);
    /// let x = dev.alloc_storage(12 << 10)?;
    /// let _y = dev.alloc_storage(12 << 10)?; // x is spilled to make room
    /// dev.make_resident(&[&x])?;
    /// assert!(dev.with(|a| a.info(x.handle().unwrap()))??.resident);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn make_resident<R: AsRange>(&self, ranges: &[R]) -> Result<()> {
        self.exclusive("make_resident", |a| a.make_resident(ranges))
    }

    /// [`Arena::record_stream`], under the shared lock.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let side = dev.with_mut(|a| a.register_stream(()))??;
    /// let s = dev.alloc_storage(256)?;
    /// dev.record_stream(&s, side)?; // freed only after side's work
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn record_stream(&self, r: impl AsRange, stream: StreamId) -> Result<()> {
        let a = self.read_lock("record_stream")?;
        a.guard.record_stream(r, stream)
    }

    /// [`Arena::wait_on_arena`], under the shared lock.
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let side = dev.with_mut(|a| a.register_stream(()))??;
    /// let s = dev.alloc_storage(256)?;
    /// dev.fill(&s, 0u8)?;
    /// dev.wait_on_arena(side)?; // side's later work runs after the fill
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn wait_on_arena(&self, stream: StreamId) -> Result<()> {
        let a = self.read_lock("wait_on_arena")?;
        a.guard.wait_on_arena(stream)
    }

    /// [`Arena::reclaim`].
    ///
    /// ```
    /// use cuarena::{Arena, ArenaConfig, SharedArena};
    /// let dev = SharedArena::new(Arena::host(ArenaConfig::new(1 << 20))?);
    /// let s = dev.alloc_storage(256)?;
    /// drop(s);
    /// assert_eq!(dev.reclaim()?, 1);
    /// assert_eq!(dev.stats().live_blocks, 0);
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn reclaim(&self) -> Result<u64> {
        self.exclusive("reclaim", Arena::reclaim)
    }
}

#[cfg(feature = "cuda")]
impl SharedArena<crate::backend::cuda::CudaBackend> {
    /// Runs `f` with [`KernelArgs`](crate::KernelArgs) for `stream` under
    /// the shared lock: threads take their views and launch at once, while
    /// allocation, compaction and spilling wait for `f` to return (and for
    /// no kernel: the arguments order the arena stream after the work on
    /// the device). Launch inside `f`, on `args.stream()`.
    ///
    /// `resident` names the blocks the work uses that may be spilled (pass
    /// `&[] as &[Handle]` for none): if one is, it is brought back first
    /// and `f` runs under the exclusive lock, which keeps it resident.
    ///
    /// ```no_run
    /// use cuarena::{Arena, ArenaConfig, DType, Handle, SharedArena, StreamId};
    /// let dev = SharedArena::new(Arena::cuda(ArenaConfig::new(1 << 30), 0)?);
    /// let (x, y) = (dev.alloc_storage_dtype(DType::F32, 256)?, dev.alloc_storage_dtype(DType::F32, 256)?);
    /// dev.with_kernel_args(StreamId::ARENA, &[] as &[Handle], |args| {
    ///     let (input, output) = (args.input::<f32>(&x)?, args.output::<f32>(&y)?);
    ///     Ok(()) // launch a kernel on `args.stream()` with `input` and `output`
    /// })?;
    /// # Ok::<(), cuarena::Error>(())
    /// ```
    pub fn with_kernel_args<A: AsRange, R>(
        &self,
        stream: StreamId,
        resident: &[A],
        f: impl FnOnce(&mut super::cuda::args::KernelArgs<'_>) -> Result<R>,
    ) -> Result<R> {
        const CALL: &str = "with_kernel_args";
        {
            let a = self.read_lock(CALL)?;
            if all_resident(&a.guard, resident)? {
                let mut args = a.guard.kernel_args(stream)?;
                return f(&mut args);
            }
        }
        self.exclusive(CALL, |a| {
            a.make_resident(resident)?;
            let mut args = a.kernel_args(stream)?;
            f(&mut args)
        })
    }
}

/// Whether every block `ranges` name is resident (under a lock held).
#[cfg(feature = "cuda")]
fn all_resident<B: Backend, R: AsRange>(a: &Arena<B>, ranges: &[R]) -> Result<bool> {
    for r in ranges {
        if let Some(h) = r.block_range().handle {
            if !a.info(h)?.resident {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::StorageSlice;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn shared_arenas_and_storages_cross_threads() {
        send_sync::<SharedArena<HostBackend>>();
        send_sync::<SharedArena<crate::backend::MetaBackend>>();
        #[cfg(feature = "cuda")]
        send_sync::<SharedArena<crate::backend::cuda::CudaBackend>>();
        send_sync::<Storage>();
        send_sync::<StorageSlice>();
    }
}
