// cuarena compaction kernel for Hopper (sm_90 and later): the same tiles,
// tickets, flags and waits as `cuarena_move` (kernels/moves.cu), but each
// tile travels through shared memory by the copy engine of the SM (bulk
// asynchronous copies, "TMA"), several tiles per CTA in flight.
//
// Why: the register kernel keeps one tile per CTA in flight and pays a
// load-to-store turnaround per tile, which leaves it below the copy limit
// on many small blocks (100,000 blocks of 4-64 KiB: 0.86-0.89 of memcpy on
// an H100, 0.80 on an H200). Here thread 0 keeps STAGES-1 tiles loading
// while the CTA stores the oldest, so a tile's waits overlap later loads.
//
// Per CTA, a ring of `stages` slots (a kernel argument, carried in
// WaveArgs.pad). Step i consumes slot i % stages, in ticket order:
//   1. wait for the slot's load (its mbarrier), publish the tile's flag;
//   2. warp 0 waits for the flags of the earlier tiles whose source the
//      tile's destination covers (the whole tile waits, not just the
//      covering part: later loads are in flight meanwhile);
//   3. store: an aligned tile by one bulk copy from shared memory (and its
//      last n % 16 bytes by thread 0); a shifted tile (source or
//      destination not 16-byte aligned) by every thread, each building
//      aligned 16-byte destination vectors from two shared vectors with a
//      funnel shift;
//   4. thread 0 refills the slot the previous step stored from, once that
//      bulk store has read it, with the next ticket.
// Deadlock: loads never wait, a CTA takes tickets in increasing order and
// consumes them in that order, and a tile waits only for smaller tickets;
// so the smallest unstored tile always has every dependency stored (hence
// published) and is the oldest slot of its CTA: it progresses.
//
// Each slot holds the 16-byte-aligned span around the tile's source
// [align_down(src), align_up(src + n)): at most TILE_BYTES + 30 bytes. The
// last aligned vector may read up to 15 bytes past the tile (the region
// has 16 bytes of slack for this; the bytes are never used).

#define CUARENA_MAX_STAGES 16
#define CUARENA_SLOT_BYTES (CUARENA_TILE_BYTES + 32)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ bool mbar_try_wait(u32 bar, u32 parity) {
    u32 ok = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
        "selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
#endif
    return ok != 0;
}

// Issues the load of ticket `t` into `slot` (thread 0 only).
__device__ __forceinline__ void bulk_issue(const WaveArgs& a, u32 t, unsigned char* slot, u32 bar,
                                           TileDesc* desc) {
#if __CUDA_ARCH__ >= 900
    const TileDesc d = a.tiles[t];
    *desc = d;
    const u64 lo = d.src & ~15ull;
    const u32 bytes = (u32)(((d.src + d.n + 15ull) & ~15ull) - lo);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"(smem_addr(slot)),
        "l"(lo), "r"(bytes), "r"(bar)
        : "memory");
#endif
}

// Takes the next ticket and loads it into `slot` when there is one left.
__device__ __forceinline__ void bulk_refill(const WaveArgs& a, unsigned char* slot, u32 bar,
                                            TileDesc* desc, u32* ticket) {
    const u32 t = atomicAdd(&a.ctl[0], 1u);
    *ticket = t;
    if (t < a.n_tiles) bulk_issue(a, t, slot, bar, desc);
}

// A shifted tile from its slot to global memory, by every thread: aligned
// destination vectors, built from the two aligned shared vectors that hold
// their source bytes; the head (up to the destination's first 16-byte
// boundary) and the tail byte by byte.
__device__ __forceinline__ void store_shifted_from(const TileDesc& d, const unsigned char* slot,
                                                   u32 tid) {
    const u32 o = (u32)(d.src & 15u);  // source byte j is slot[o + j]
    u32 h = (16u - (u32)(d.dst & 15u)) & 15u;
    if (h > d.n) h = d.n;
    const u32 b = (d.n - h) >> 4, t = d.n - h - 16u * b;
    const u32 q0 = o + h, m = q0 & 15u;
    unsigned char* a = reinterpret_cast<unsigned char*>(d.dst + h);
    for (u32 k = tid; k < b; k += CUARENA_THREADS) {
        const u32 q = (q0 & ~15u) + 16u * k;
        const uint4 lo = *reinterpret_cast<const uint4*>(slot + q);
        const uint4 v = m == 0 ? lo : shift16(lo, *reinterpret_cast<const uint4*>(slot + q + 16u), m);
        st16(a + 16u * k, v);
    }
    if (tid == 0)
        for (u32 j = 0; j < h; ++j) reinterpret_cast<unsigned char*>(d.dst)[j] = slot[o + j];
    if (tid == TAIL_THREAD)
        for (u32 j = 0; j < t; ++j) a[16u * b + j] = slot[q0 + 16u * b + j];
}

// Destination bytes [from, to) of an aligned tile (`to` <= n; 16-byte
// multiples except `to` == n): the whole vectors by one bulk copy from the
// slot, the bytes past the last whole vector by this thread.
__device__ __forceinline__ void bulk_store(const TileDesc& d, const unsigned char* slot, u32 from,
                                           u32 to) {
#if __CUDA_ARCH__ >= 900
    const u32 body = to & ~15u;
    if (body > from) {
        // The flags were read by the generic proxy; order the copy engine's
        // stores after them.
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(d.dst + from),
                     "r"(smem_addr(slot + from)), "r"(body - from)
                     : "memory");
    }
    for (u32 j = body > from ? body : from; j < to; ++j)
        reinterpret_cast<unsigned char*>(d.dst)[j] = slot[j];
#endif
}

// Publishes the tiles of the slots other than `current` whose loads have
// landed and that are not published yet; returns their bits.
__device__ __forceinline__ u32 publish_landed(const WaveArgs& a, u32 stages, u32 current,
                                              u32 pubmask, u32 phase, const u64* bars,
                                              const u32* tickets) {
    u32 done = 0;
    for (u32 s = 0; s < stages; ++s) {
        if (s == current || (pubmask >> s & 1u)) continue;
        const u32 t = tickets[s];
        if (t >= a.n_tiles) continue;
        if (mbar_try_wait(smem_addr(&bars[s]), phase >> s & 1u)) {
            st_relaxed(&a.flags[t], a.epoch);
            done |= 1u << s;
        }
    }
    return done;
}

extern "C" __global__ void __launch_bounds__(CUARENA_THREADS) cuarena_move_bulk(WaveArgs a) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char s_slots[];
    __shared__ __align__(8) u64 s_bar[CUARENA_MAX_STAGES];
    __shared__ TileDesc s_desc[CUARENA_MAX_STAGES];
    __shared__ u32 s_ticket[CUARENA_MAX_STAGES];
    __shared__ u32 s_go;     // this step stores
    __shared__ u32 s_abort;  // a wait of this CTA timed out: store nothing more
    const u32 tid = threadIdx.x, lane = tid & 31u;
    const u32 stages = a.pad;
    // Thread 0's view of the slots: bit s of `pubmask` is set once slot s's
    // tile is published, bit s of `phase` is the parity of its pending load.
    u32 pubmask = 0, phase = 0;
    if (tid == 0) {
        s_abort = 0;
        for (u32 s = 0; s < stages; ++s)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s_bar[s]))
                         : "memory");
        // The barriers' initialisation must be visible to the copy engine.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        for (u32 s = 0; s + 1 < stages; ++s)
            bulk_refill(a, s_slots + (u64)s * CUARENA_SLOT_BYTES, smem_addr(&s_bar[s]), &s_desc[s],
                        &s_ticket[s]);
        s_ticket[stages - 1] = 0xFFFFFFFFu;  // filled at step 0
    }
    __syncthreads();
    for (u32 step = 0;; ++step) {
        const u32 slot = step % stages;
        const u32 t = s_ticket[slot];
        if (t >= a.n_tiles) break;  // later slots hold later tickets
        const TileDesc d = s_desc[slot];
        unsigned char* buf = s_slots + (u64)slot * CUARENA_SLOT_BYTES;
        const u32 bar = smem_addr(&s_bar[slot]);
        const u32 parity = (step / stages) & 1u;
        while (!mbar_try_wait(bar, parity)) {
        }
        const bool shifted = (d.wait & CUARENA_SHIFTED) != 0;
        // Destination bytes [0, w) may cover earlier tiles' sources and wait
        // for them; the rest covers at most this tile's own source, which is
        // loaded. An aligned tile stores the rest at once (one bulk copy,
        // and its last n % 16 bytes by thread 0); a shifted tile waits whole.
        u32 w = d.n;
        if (!shifted) {
            w = d.lo <= d.hi ? ((d.wait & CUARENA_WAIT_MASK) + 15u) & ~15u : 0u;
            if (w > (d.n & ~15u)) w = d.n;
        }
        if (tid < 32) {
            if (tid == 0) {
                if (!(pubmask >> slot & 1u)) st_relaxed(&a.flags[t], a.epoch);
                phase ^= 1u << slot;
                if (!shifted && s_abort == 0) bulk_store(d, buf, w, d.n);
            }
            // While waiting, thread 0 publishes the later slots that have
            // landed: other CTAs' tiles may be waiting for them.
            const bool gave_up = wait_tiles(a, d.lo, d.hi, lane, [&] {
                if (tid == 0) pubmask |= publish_landed(a, stages, slot, pubmask, phase, s_bar, s_ticket);
            });
            // The lanes' acquires come before every store of the CTA (warp
            // barrier, then the CTA barrier below).
            __syncwarp();
            const bool fail = __any_sync(FULL_MASK, gave_up);
            if (tid == 0) {
                if (fail) s_abort = 1;
                s_go = s_abort == 0;
            }
        }
        __syncthreads();
        if (s_go && w) {
            if (shifted) store_shifted_from(d, buf, tid);
            else if (tid == 0) bulk_store(d, buf, 0, w);
        }
        // Every step commits one bulk group (maybe empty), so "all but the
        // newest group have read their shared memory" means exactly "the
        // previous step's slot is free".
        if (tid == 0) asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        __syncthreads();  // shifted stores have read the slot
        if (tid == 0) {
            const u32 prev = (step + stages - 1) % stages;
            pubmask &= ~(1u << prev);
            asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
            // Generic reads of the slot (shifted tiles, tails) come before
            // the copy engine writes it again.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_refill(a, s_slots + (u64)prev * CUARENA_SLOT_BYTES, smem_addr(&s_bar[prev]),
                        &s_desc[prev], &s_ticket[prev]);
        }
        __syncthreads();
    }
    // Shared memory must outlive the bulk stores that read it, and the
    // stores must land before the kernel ends.
    if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
