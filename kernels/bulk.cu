// cuarena compaction kernel for Hopper (sm_90 and later): the same tiles,
// tickets, flags and waits as `cuarena_move` (kernels/moves.cu), but each
// tile travels through shared memory by the copy engine of the SM (bulk
// asynchronous copies, "TMA"), several tiles per CTA in flight.
//
// Warp-specialised, per CTA, with a ring of `stages` slots (a kernel
// argument, WaveArgs.bulk_stages), each with a "full" mbarrier (one
// arrival, the producer's, plus the load's bytes) and an "empty" one (one
// arrival per consumer thread):
//
// - Producer: lane 0 of warp 0. It takes tickets (two ahead, so that the
//   atomic's latency and the descriptor read overlap the wait for a slot),
//   loads each tile into the next slot as soon as every consumer has
//   released it, and between loads polls the slots in flight
//   (`mbarrier.test_wait`, which never suspends) and publishes each tile's
//   flag as soon as its load has landed: other CTAs' tiles may be waiting
//   for it.
// - Consumers: warps 1.. (the "leader" is lane 0 of warp 1). Step i takes
//   slot i % stages in ticket order and waits for its load; the leader
//   publishes the flag (if the producer has not yet).
//     Aligned tile (source and destination 16-byte aligned): the leader
//       stores the part that covers at most the tile's own source by one
//       bulk copy from shared memory at once; then frees the previous
//       step's slot once the copy engine has read it (`wait_group.read 1`:
//       this step's copy stays in flight); then warp 1 waits for the flags
//       of the earlier tiles whose source the rest of the destination
//       covers, and the leader stores the rest (and the last n % 16 bytes
//       by hand). The other consumers only read the descriptor and release
//       the slot: the leader's own release comes at the next step.
//     Shifted tile (source or destination not 16-byte aligned): every
//       consumer warp waits for the flags itself (no barrier between the
//       warps), then builds aligned 16-byte destination vectors from two
//       shared vectors with a funnel shift, and releases the slot.
//   So the flag wait of a step never holds back the next loads, and the
//   copies of two steps overlap. A deferred tile (see moves.cu) stores its
//   waiting part into the side buffer instead, with no wait.
//
// Deadlock: loads wait only for a free slot, a CTA takes tickets in
// increasing order and consumes them in that order, and a tile waits only
// for smaller tickets. So the smallest unstored tile has every dependency
// stored (hence published) and is its CTA's oldest step; its slot is
// released by steps before it (stages >= 2), so its load is issued, lands,
// and it stores.
//
// Each slot holds the 16-byte-aligned span around the tile's source
// [align_down(src), align_up(src + n)): at most TILE_BYTES + 30 bytes. The
// last aligned vector may read up to 15 bytes past the tile (the region
// has 16 bytes of slack for this; the bytes are never used).

#define CUARENA_MAX_STAGES 16
#define CUARENA_SLOT_BYTES (CUARENA_TILE_BYTES + 32)
// Consumer threads (warps 1..): the kernel needs at least two warps (the
// host runs the register kernel otherwise).
#define CUARENA_CONSUMERS (CUARENA_THREADS > 32 ? CUARENA_THREADS - 32 : 32)
#define CUARENA_NO_TICKET 0xFFFFFFFFu

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// Whether the phase of parity `parity` of the mbarrier has completed.
// SUSPEND (mbarrier.try_wait) may suspend the thread for a while, for
// threads that have nothing else to do; without (test_wait) it never does,
// for the producer, which polls several.
template <bool SUSPEND>
__device__ __forceinline__ bool mbar_done(u32 bar, u32 parity) {
    u32 ok = 0;
#if __CUDA_ARCH__ >= 900
#define CUARENA_MBAR_WAIT(op)                                                              \
    asm volatile("{ .reg .pred p; mbarrier." op ".parity.shared::cta.b64 p, [%1], %2; " \
                 "selp.u32 %0, 1, 0, p; }"                                                \
                 : "=r"(ok)                                                               \
                 : "r"(bar), "r"(parity)                                                  \
                 : "memory")
    if (SUSPEND)
        CUARENA_MBAR_WAIT("try_wait");
    else
        CUARENA_MBAR_WAIT("test_wait");
#undef CUARENA_MBAR_WAIT
#endif
    return ok != 0;
}

__device__ __forceinline__ void mbar_arrive(u32 bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}

// Issues the load of tile `d` into `slot`, completing on `bar`. A source
// that its move overwrites later (CUARENA_KEEP) is loaded with the L2
// policy `keep` (evict_last): a 4 GiB block sliding down by 256 B then ran
// at 0.98-0.99 of memcpy on an H200 instead of 0.95, where a copy with no
// overlap runs at 0.97 (why is not known: the overwrite follows the load
// within microseconds). The overwrite stores with evict_normal (st16n in
// moves.cu), so no line should keep evict_last after the move; sources
// that are not overwritten (a copy elsewhere) are loaded as usual, since
// lines kept there would crowd the L2 long after the compaction.
__device__ __forceinline__ void bulk_load(const TileDesc& d, unsigned char* slot, u32 bar,
                                          u64 keep) {
#if __CUDA_ARCH__ >= 900
    const u64 lo = d.src & ~15ull;
    const u32 bytes = (u32)(((d.src + d.n + 15ull) & ~15ull) - lo);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
    if (d.wait & CUARENA_KEEP) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
            "[%0], [%1], %2, [%3], %4;" ::"r"(smem_addr(slot)),
            "l"(lo), "r"(bytes), "r"(bar), "l"(keep)
            : "memory");
    } else {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                "r"(smem_addr(slot)),
            "l"(lo), "r"(bytes), "r"(bar)
            : "memory");
    }
#endif
}

// A shifted tile from its slot to global memory, by consumer thread `c`:
// aligned destination vectors, built from the two aligned shared vectors
// that hold their source bytes; the head (up to the destination's first
// 16-byte boundary) and the tail byte by byte. Pieces that start below
// destination byte `split` go to `lower` (an address equal to d.dst modulo
// 16: the side buffer of a deferred tile) instead.
__device__ __forceinline__ void store_shifted_from(const TileDesc& d, const unsigned char* slot,
                                                   u32 c, u32 split, u64 lower) {
    const u32 tail_thread = CUARENA_CONSUMERS > 32 ? 32u : 0u;
    const u32 o = (u32)(d.src & 15u);  // source byte j is slot[o + j]
    u32 h = (16u - (u32)(d.dst & 15u)) & 15u;
    if (h > d.n) h = d.n;
    const u32 b = (d.n - h) >> 4, t = d.n - h - 16u * b;
    const u32 q0 = o + h, m = q0 & 15u;
    // Destination of the piece starting at byte j of the tile.
    auto at = [&](u32 j) { return reinterpret_cast<unsigned char*>((j < split ? lower : d.dst) + j); };
    for (u32 k = c; k < b; k += CUARENA_CONSUMERS) {
        const u32 q = (q0 & ~15u) + 16u * k;
        const uint4 lo = *reinterpret_cast<const uint4*>(slot + q);
        const uint4 v = m == 0 ? lo : shift16(lo, *reinterpret_cast<const uint4*>(slot + q + 16u), m);
        st16n(at(h + 16u * k), v);
    }
    if (c == 0) {
        unsigned char* p = at(0);
        for (u32 j = 0; j < h; ++j) st1n(p + j, slot[o + j]);
    }
    if (c == tail_thread) {
        unsigned char* p = at(h + 16u * b);
        for (u32 j = 0; j < t; ++j) st1n(p + j, slot[q0 + 16u * b + j]);
    }
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
        asm volatile(
            "cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;" ::"l"(
                d.dst + from),
            "r"(smem_addr(slot + from)), "r"(body - from), "l"(normal_policy())
            : "memory");
    }
    for (u32 j = body > from ? body : from; j < to; ++j)
        st1n(reinterpret_cast<unsigned char*>(d.dst) + j, slot[j]);
#endif
}

// The producer (one thread): tickets, loads, and flags as loads land.
__device__ __forceinline__ void bulk_produce(const WaveArgs& a, u32 stages, unsigned char* slots,
                                             u64* full, u64* empty, TileDesc* desc, u32* ticket) {
    // Tickets two ahead: t0 is the next to load (its descriptor d0 read),
    // t1 the one after (the atomic in flight).
    u32 t0 = atomicAdd(&a.ctl[0], 1u);
    u32 t1 = atomicAdd(&a.ctl[0], 1u);
    u64 keep = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(keep));
#endif
    TileDesc d0 = {};
    if (t0 < a.n_tiles) d0 = a.tiles[t0];
    u32 unpub = 0;  // bit s: slot s's load is in flight, its flag not stored
    u32 par = 0;    // bit s: parity of the load in flight in slot s
    u32 s = 0, round = 0;  // the next load goes to slot s in its round `round`
    for (;;) {
        // A slot is free in round 0, later once its consumers released it
        // in the round before (phase round - 1 of its empty barrier).
        if (round == 0 || mbar_done<false>(smem_addr(&empty[s]), (round - 1u) & 1u)) {
            if (t0 >= a.n_tiles) {
                // No tiles left: the consumers stop at this slot.
                ticket[s] = CUARENA_NO_TICKET;
                mbar_arrive(smem_addr(&full[s]));
                break;
            }
            ticket[s] = t0;
            desc[s] = d0;
            // The consumers' generic reads of the slot (shifted stores,
            // tails) come before the copy engine writes it again.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            bulk_load(d0, slots + (u64)s * CUARENA_SLOT_BYTES, smem_addr(&full[s]), keep);
            unpub |= 1u << s;
            par = (par & ~(1u << s)) | ((round & 1u) << s);
            t0 = t1;
            if (t0 < a.n_tiles) d0 = a.tiles[t0];
            t1 = atomicAdd(&a.ctl[0], 1u);
            if (++s == stages) {
                s = 0;
                ++round;
            }
            continue;
        }
        // Publish the loads that have landed.
        for (u32 m = unpub; m != 0; m &= m - 1u) {
            const u32 x = __ffs(m) - 1u;
            if (mbar_done<false>(smem_addr(&full[x]), par >> x & 1u)) {
                st_relaxed(&a.flags[ticket[x]], a.epoch);
                unpub &= ~(1u << x);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(CUARENA_THREADS) cuarena_move_bulk(WaveArgs a) {
#if __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char s_slots[];
    __shared__ __align__(8) u64 s_full[CUARENA_MAX_STAGES];
    __shared__ __align__(8) u64 s_empty[CUARENA_MAX_STAGES];
    __shared__ TileDesc s_desc[CUARENA_MAX_STAGES];
    __shared__ u32 s_ticket[CUARENA_MAX_STAGES];
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 stages = a.bulk_stages;
    if (tid == 0) {
        for (u32 s = 0; s < stages; ++s) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&s_full[s]))
                         : "memory");
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&s_empty[s])),
                         "n"(CUARENA_CONSUMERS)
                         : "memory");
        }
        // The barriers' initialisation must be visible to the copy engine.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0) bulk_produce(a, stages, s_slots, s_full, s_empty, s_desc, s_ticket);
        return;
    }
    const u32 c = tid - 32u;  // consumer index
    const bool leader = c == 0;
    // Set, per warp, when a wait of the warp timed out (the watchdog fired:
    // the error word says so and the arena poisons itself): from then on
    // the warp stores nothing, since the part it skipped could overwrite a
    // source that an earlier tile has not loaded. (Other warps store only
    // after their own waits succeed, which makes their stores safe.)
    bool abort = false;
    // The leader's aligned slot whose copies may still be reading it (its
    // release comes at the next step).
    u32 pending = CUARENA_NO_TICKET;
    u32 s = 0, round = 0;
    for (;;) {
        const u32 full = smem_addr(&s_full[s]), empty = smem_addr(&s_empty[s]);
        while (!mbar_done<true>(full, round & 1u)) {
        }
        const u32 t = s_ticket[s];
        if (t == CUARENA_NO_TICKET) break;
        const TileDesc d = s_desc[s];
        const unsigned char* buf = s_slots + (u64)s * CUARENA_SLOT_BYTES;
        if ((d.wait & CUARENA_SHIFTED) == 0) {
            if (warp == 1) {
                // Destination bytes [0, w) may cover earlier tiles' sources
                // and wait for them (or go to the side buffer: deferred);
                // the rest covers at most this tile's own source, which is
                // loaded.
                const bool deferred = (d.wait & CUARENA_DEFERRED) != 0;
                u32 w = deferred || d.lo <= d.hi ? ((d.wait & CUARENA_WAIT_MASK) + 15u) & ~15u : 0u;
                if (w > (d.n & ~15u)) w = d.n;
                if (leader) {
                    st_relaxed(&a.flags[t], a.epoch);
                    if (!abort) bulk_store(d, buf, w, d.n);
                    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                    // Every copy but this one has read its slot: release the
                    // previous aligned one.
                    asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
                    if (pending != CUARENA_NO_TICKET) mbar_arrive(smem_addr(&s_empty[pending]));
                    pending = s;
                }
                const bool gave_up = !deferred && wait_tiles(a, d.lo, d.hi, lane, [] {});
                // The lanes' acquires come before the leader's copy (warp
                // barrier).
                __syncwarp();
                abort = abort || __any_sync(FULL_MASK, gave_up);
                if (leader) {
                    TileDesc ds = d;
                    if (deferred) ds.dst = a.side + d.lo;
                    if (!abort && w) bulk_store(ds, buf, 0, w);
                    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
                } else {
                    mbar_arrive(empty);
                }
            } else {
                mbar_arrive(empty);
            }
        } else {
            if (warp == 1) {
                if (leader) {
                    st_relaxed(&a.flags[t], a.epoch);
                    if (pending != CUARENA_NO_TICKET) {
                        // No copy follows to keep the engine busy: wait
                        // for all of them to have read their slots.
                        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                        mbar_arrive(smem_addr(&s_empty[pending]));
                        pending = CUARENA_NO_TICKET;
                    }
                }
            }
            // Every consumer warp waits for the flags itself (no barrier
            // between warps): the lanes' acquires come before the warp's
            // stores (warp barrier).
            const bool deferred = (d.wait & CUARENA_DEFERRED) != 0;
            const bool gave_up = !deferred && wait_tiles(a, d.lo, d.hi, lane, [] {});
            __syncwarp();
            abort = abort || __any_sync(FULL_MASK, gave_up);
            if (!abort)
                store_shifted_from(d, buf, c, deferred ? d.wait & CUARENA_WAIT_MASK : 0u,
                                   a.side + d.lo);
            mbar_arrive(empty);
        }
        if (++s == stages) {
            s = 0;
            ++round;
        }
    }
    // Shared memory must outlive the bulk stores that read it, and the
    // stores must land before the kernel ends.
    if (leader) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
}
