//! Plain host memory, strict enough to catch a wrong plan.
//!
//! Every access is bounds-checked. A wave runs as a randomly interleaved
//! schedule of small chunk loads and stores, where a store waits only for
//! what the CUDA kernel waits for: the loads of earlier chunks whose sources
//! its destination covers. A plan that breaks the wave rule therefore
//! corrupts data here just as it would on the GPU, and the model-based
//! tests see it. By default plans are also validated up front
//! ([`HostBackend::with_validation`] turns that off, to watch the corruption).

use super::mapping::{Chunks, ManualClock};
use super::{check_disjoint, check_pattern, check_range, Backend};
use crate::error::{Error, Result};
use crate::handle::TableEntry;
use crate::plan::{Plan, Wave};
use crate::stream::{StreamId, MAX_STREAMS};

/// The host backend's mapping granularity in elastic mode: a host page
/// group small enough for tests of small arenas.
pub(crate) const HOST_GRANULARITY: u64 = 64 << 10;

/// Host-memory backend for tests, docs, CI and the demo's fallback.
#[derive(Debug, Clone)]
pub struct HostBackend {
    /// The mapped prefix's bytes: `mem.len()` is the mapped end, and every
    /// access above it is refused (what a GPU faults on).
    mem: Vec<u8>,
    /// The reserve and its mapped chunks.
    chunks: Chunks,
    clock: ManualClock,
    rng: u64,
    chunk_bytes: u64,
    validate: bool,
    table: Vec<TableEntry>,
    /// The host tier (a second Vec standing in for page-locked memory).
    tier: Vec<u8>,
    /// Streams registered, the arena stream included. Host operations are
    /// synchronous, so streams are ids only.
    streams: u32,
}

impl HostBackend {
    /// A zeroed region of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Result<Self> {
        Ok(Self {
            mem: zeroed(capacity_bytes, "region")?,
            chunks: Chunks::fixed(capacity_bytes),
            clock: ManualClock::default(),
            rng: 0x9E37_79B9_7F4A_7C15,
            chunk_bytes: 64,
            validate: true,
            table: Vec::new(),
            tier: Vec::new(),
            streams: 1,
        })
    }

    /// An elastic region: `reserved_bytes` reserved, nothing mapped, mapped
    /// and unmapped in chunks of multiples of `granularity_bytes` (a power
    /// of two; rounded up to one). Bytes newly mapped hold a poison pattern,
    /// as fresh device memory holds whatever it held; bytes unmapped are
    /// gone.
    pub fn elastic(reserved_bytes: u64, granularity_bytes: u64) -> Self {
        let mut b = Self::new(0).unwrap_or_else(|_| unreachable!("an empty region"));
        b.chunks = Chunks::new(reserved_bytes, granularity_bytes);
        b
    }

    /// Sets the backend's clock ([`Backend::now_us`]) to `time_us`; it
    /// stays there until set again (the default is a monotonic clock).
    pub fn set_time_us(&self, time_us: u64) {
        self.clock.set(time_us);
    }

    /// Chunks mapped now (1 for a fixed region).
    pub fn mapped_chunks(&self) -> usize {
        self.chunks.count()
    }

    /// Seeds the schedule shuffler (runs are reproducible per seed).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = seed | 1;
        self
    }

    /// Whether [`Backend::execute`] validates plans before running them.
    pub fn with_validation(mut self, validate: bool) -> Self {
        self.validate = validate;
        self
    }

    /// The backend's copy of the handle table (what a kernel would see).
    pub fn table(&self) -> &[TableEntry] {
        &self.table
    }

    /// The region's bytes (for tests).
    pub fn bytes(&self) -> &[u8] {
        &self.mem
    }

    fn next(&mut self) -> u64 {
        // splitmix64: small, good enough to shuffle a schedule.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    fn run_wave(&mut self, wave: &Wave) -> Result<()> {
        // Only the mapped bytes.
        let cap = self.mem.len() as u64;
        for m in &wave.moves {
            check_range(m.src, m.len, cap)?;
            check_range(m.dst, m.len, cap)?;
        }
        let total: u64 = wave.moves.iter().map(|m| m.len).sum();
        // Keep the schedule at most ~1M chunks for big waves.
        let chunk = self.chunk_bytes.max(total.div_ceil(1 << 20));
        // (src, dst, len, staging offset) in wave order.
        let mut chunks: Vec<(u64, u64, u64, usize)> = Vec::new();
        let mut staged = 0usize;
        for m in &wave.moves {
            let mut done = 0;
            while done < m.len {
                let len = chunk.min(m.len - done);
                chunks.push((m.src + done, m.dst + done, len, staged));
                staged += len as usize;
                done += len;
            }
        }
        // A store waits for the loads of the earlier chunks its destination
        // covers (sources ascend, so they are a contiguous run).
        let n = chunks.len();
        let mut pending = vec![0u32; n];
        let mut waiters: Vec<Vec<u32>> = vec![Vec::new(); n];
        for i in 0..n {
            let (_, dst, len, _) = chunks[i];
            let lo = chunks.partition_point(|c| c.0 + c.2 <= dst);
            let hi = chunks.partition_point(|c| c.0 < dst + len).min(i);
            for w in waiters.iter_mut().take(hi).skip(lo) {
                pending[i] += 1;
                w.push(i as u32);
            }
        }
        let mut staging: Vec<u8> = zeroed_vec(staged as u64, 1, "a wave's staging buffer")?;
        let mut loaded = vec![false; n];
        let mut reads: Vec<u32> = (0..n as u32).collect();
        let mut writes: Vec<u32> = Vec::new();
        while !reads.is_empty() || !writes.is_empty() {
            // Store as early as allowed half the time: that is what exposes a
            // plan whose store overtakes a load it did not wait for.
            let store = !writes.is_empty() && (reads.is_empty() || self.next() & 1 == 0);
            if store {
                let k = self.pick(writes.len());
                let i = writes.swap_remove(k) as usize;
                let (_, dst, len, st) = chunks[i];
                self.mem[dst as usize..(dst + len) as usize]
                    .copy_from_slice(&staging[st..st + len as usize]);
            } else {
                let k = self.pick(reads.len());
                let j = reads.swap_remove(k) as usize;
                let (src, _, len, st) = chunks[j];
                staging[st..st + len as usize]
                    .copy_from_slice(&self.mem[src as usize..(src + len) as usize]);
                loaded[j] = true;
                if pending[j] == 0 {
                    writes.push(j as u32);
                }
                for &w in &waiters[j] {
                    let w = w as usize;
                    pending[w] -= 1;
                    if pending[w] == 0 && loaded[w] {
                        writes.push(w as u32);
                    }
                }
            }
        }
        Ok(())
    }
}

/// `bytes` zeroed host bytes, or an error (not an abort) when the host
/// cannot provide them.
pub(crate) fn zeroed(bytes: u64, what: &'static str) -> Result<Vec<u8>> {
    zeroed_vec(bytes, 1, what)
}

/// `n` zeroed values of `T` (`n * elem_bytes` bytes, for the error), or
/// [`crate::error::Error::HostMemory`] (not an abort) when the host cannot
/// provide them.
pub(crate) fn zeroed_vec<T: Clone + Default>(
    n: u64,
    elem_bytes: u64,
    what: &'static str,
) -> Result<Vec<T>> {
    let cannot = || crate::error::Error::HostMemory {
        requested_bytes: n.saturating_mul(elem_bytes),
        what,
    };
    let len = usize::try_from(n).map_err(|_| cannot())?;
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| cannot())?;
    v.resize(len, T::default());
    Ok(v)
}

impl Backend for HostBackend {
    /// Host work is synchronous: a stream is an id only.
    type Stream = ();

    fn register_stream(&mut self, (): ()) -> Result<StreamId> {
        next_stream(&mut self.streams)
    }

    fn capacity_bytes(&self) -> u64 {
        self.chunks.reserved_bytes()
    }

    fn mapped_bytes(&self) -> u64 {
        self.mem.len() as u64
    }

    fn granularity_bytes(&self) -> u64 {
        self.chunks.granularity_bytes()
    }

    fn map_to(&mut self, end: u64) -> Result<()> {
        let len = self.chunks.check_map(end)?;
        let mut fresh = zeroed(len, "a mapped chunk")?;
        fresh.fill(0xA5);
        self.mem.extend_from_slice(&fresh);
        self.chunks.push(end);
        Ok(())
    }

    fn unmap_to(&mut self, end: u64) -> Result<u64> {
        let (n, new_end) = self.chunks.above(end);
        self.chunks.pop(n);
        self.mem.truncate(new_end as usize);
        self.mem.shrink_to(new_end as usize);
        Ok(new_end)
    }

    fn now_us(&self) -> u64 {
        match self.clock.get() {
            Some(t) => t,
            None => super::wall_clock_us(),
        }
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        check_range(offset, bytes.len() as u64, self.mapped_bytes())?;
        let o = offset as usize;
        self.mem[o..o + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len() as u64, self.mapped_bytes())?;
        let o = offset as usize;
        out.copy_from_slice(&self.mem[o..o + out.len()]);
        Ok(())
    }

    fn copy(&mut self, src: u64, dst: u64, len: u64) -> Result<()> {
        check_range(src, len, self.mapped_bytes())?;
        check_range(dst, len, self.mapped_bytes())?;
        check_disjoint(src, dst, len)?;
        let (s, d, n) = (src as usize, dst as usize, len as usize);
        self.mem.copy_within(s..s + n, d);
        Ok(())
    }

    fn fill(&mut self, offset: u64, len: u64, pattern: &[u8]) -> Result<()> {
        check_range(offset, len, self.mapped_bytes())?;
        check_pattern(offset, len, pattern)?;
        let o = offset as usize;
        for chunk in self.mem[o..o + len as usize].chunks_exact_mut(pattern.len()) {
            chunk.copy_from_slice(pattern);
        }
        Ok(())
    }

    fn stream_count(&self) -> u32 {
        self.streams
    }

    fn execute(&mut self, plan: &Plan) -> Result<()> {
        if self.validate {
            plan.validate(self.mapped_bytes())?;
        }
        for wave in &plan.waves {
            self.run_wave(wave)?;
        }
        Ok(())
    }

    fn reserve_host_tier(&mut self, bytes: u64) -> Result<()> {
        self.tier = zeroed(bytes, "host tier")?;
        Ok(())
    }

    fn spill(&mut self, offset: u64, host_offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.mapped_bytes())?;
        check_range(host_offset, len, self.tier.len() as u64)?;
        let (o, h, l) = (offset as usize, host_offset as usize, len as usize);
        self.tier[h..h + l].copy_from_slice(&self.mem[o..o + l]);
        // Poison the vacated bytes so a read of a spilled block's old
        // place cannot pass for its data.
        self.mem[o..o + l].fill(0xA5);
        Ok(())
    }

    fn restore(&mut self, host_offset: u64, offset: u64, len: u64) -> Result<()> {
        check_range(offset, len, self.mapped_bytes())?;
        check_range(host_offset, len, self.tier.len() as u64)?;
        let (o, h, l) = (offset as usize, host_offset as usize, len as usize);
        self.mem[o..o + l].copy_from_slice(&self.tier[h..h + l]);
        Ok(())
    }

    fn sync_table(&mut self, entries: &[TableEntry], first: usize) -> Result<()> {
        let end = first + entries.len();
        if self.table.len() < end {
            self.table.resize(end, TableEntry::default());
        }
        self.table[first..end].copy_from_slice(entries);
        Ok(())
    }
}

/// The next stream id of a backend whose streams are ids only, `streams`
/// being those registered so far (the arena's included).
pub(super) fn next_stream(streams: &mut u32) -> Result<StreamId> {
    if *streams >= MAX_STREAMS {
        return Err(Error::LimitReached {
            what: "streams registered with one arena (its own included)",
            requested: u64::from(*streams) + 1,
            limit: u64::from(MAX_STREAMS),
        });
    }
    let id = StreamId(*streams, 0);
    *streams += 1;
    Ok(id)
}
