// cuarena compaction kernels: one wave of moves in one launch.
//
// The wave rule (src/plan/mod.rs) lets a move's destination overlap the
// sources of moves listed before it, and its own source when sliding down.
// Each move is cut into tiles of CUARENA_TILE_BYTES (a tile never spans two
// moves). Persistent CTAs take tiles in list order with an atomic ticket.
// A CTA loads its whole tile into registers, publishes the tile's flag, waits
// for the flags of the earlier tiles whose source overlaps its destination
// (a contiguous range, computed per tile by the prep kernel), and then
// stores. A tile waits only for tiles with smaller tickets, which were
// handed to CTAs that are already running, so there is no deadlock whatever
// the grid size and whatever else runs on the GPU.
//
// Only the warps that store bytes over an earlier tile's source wait for
// it, each on its own; the rest of the CTA goes on to its next tile.
//
// A tile whose waiting part is small (a block sliding down by less than a
// tile: every tile's first `shift` bytes cover the previous tile's source)
// does not wait at all when the launch has a side buffer: it stores that
// part into the side buffer, and cuarena_settle, the next launch on the
// stream, copies it to its destination once every tile is loaded. Waiting
// there costs a flag round trip per tile on the CTA's critical path (a
// 4 GiB slide ran at 0.89 of memcpy on an H200 against 0.95 for the same
// copy with no overlap); the detour costs two passes over 1/32 of a tile
// at most. A tile
// whose source or destination is not 16-byte aligned still moves 16-byte
// vectors: it loads the source at aligned addresses, stores the destination
// at aligned addresses, and shifts each vector across lanes by the
// difference (a funnel shift); the few bytes before the destination's
// first aligned address and after its last go byte by byte.
#include "moves.h"

#define CUARENA_WARPS (CUARENA_THREADS / 32)
#define FULL_MASK 0xFFFFFFFFu
// The thread that moves a shifted tile's tail bytes (the head's is thread 0):
// another warp, when there is one, so that both byte loops run side by side.
#define TAIL_THREAD (CUARENA_THREADS > 32 ? 32u : 0u)

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_relaxed(u32* p, u32 v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}


// 16 aligned bytes, through L2 only (.cg): the data is used once, and L1
// is not coherent.
__device__ __forceinline__ uint4 ld16(const unsigned char* p) {
    return __ldcg(reinterpret_cast<const uint4*>(p));
}

__device__ __forceinline__ void st16(unsigned char* p, uint4 v) {
    __stcg(reinterpret_cast<uint4*>(p), v);
}

// Stores that may land on a line loaded with evict_last (CUARENA_KEEP, see
// bulk_load in bulk.cu: the bulk kernel's stores and cuarena_settle's) say
// evict_normal to the L2 explicitly: the PTX ISA does not say what a store
// without a hint does to a line's priority. (Before sm_80, plain stores:
// nothing is loaded with evict_last there.)
__device__ __forceinline__ u64 normal_policy() {
    u64 p = 0;
#if __CUDA_ARCH__ >= 800
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
#endif
    return p;
}

__device__ __forceinline__ void st16n(unsigned char* p, uint4 v) {
#if __CUDA_ARCH__ < 800
    st16(p, v);
#else
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x),
                 "r"(v.y), "r"(v.z), "r"(v.w), "l"(normal_policy())
                 : "memory");
#endif
}

__device__ __forceinline__ void st1n(unsigned char* p, unsigned char v) {
#if __CUDA_ARCH__ < 800
    *p = v;
#else
    asm volatile("st.global.L2::cache_hint.u8 [%0], %1, %2;" ::"l"(p), "r"((u32)v),
                 "l"(normal_policy())
                 : "memory");
#endif
}

// The first n <= 16 bytes at p, byte by byte.
__device__ __forceinline__ uint4 ld_tail(const unsigned char* p, u32 n) {
    u32 x[4] = {0, 0, 0, 0};
#pragma unroll
    for (int b = 0; b < 16; ++b)
        if ((u32)b < n) x[b >> 2] |= (u32)p[b] << ((b & 3) * 8);
    return make_uint4(x[0], x[1], x[2], x[3]);
}

__device__ __forceinline__ void st_tail(unsigned char* p, uint4 v, u32 n) {
    u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int b = 0; b < 16; ++b)
        if ((u32)b < n) p[b] = (unsigned char)(x[b >> 2] >> ((b & 3) * 8));
}

__device__ __forceinline__ u32 fs(u32 lo, u32 hi, u32 s) { return __funnelshift_r(lo, hi, s); }

// Bytes m..m+15 (m < 16) of the 32 bytes a, b (little-endian). The word
// offset is a switch, not an index, so that nothing goes to local memory.
__device__ __forceinline__ uint4 shift16(uint4 a, uint4 b, u32 m) {
    const u32 s = (m & 3u) * 8u;
    switch (m >> 2) {
        case 0: return make_uint4(fs(a.x, a.y, s), fs(a.y, a.z, s), fs(a.z, a.w, s), fs(a.w, b.x, s));
        case 1: return make_uint4(fs(a.y, a.z, s), fs(a.z, a.w, s), fs(a.w, b.x, s), fs(b.x, b.y, s));
        case 2: return make_uint4(fs(a.z, a.w, s), fs(a.w, b.x, s), fs(b.x, b.y, s), fs(b.y, b.z, s));
        default: return make_uint4(fs(a.w, b.x, s), fs(b.x, b.y, s), fs(b.y, b.z, s), fs(b.z, b.w, s));
    }
}

__device__ __forceinline__ uint4 shfl_down1(uint4 v) {
    return make_uint4(__shfl_down_sync(FULL_MASK, v.x, 1), __shfl_down_sync(FULL_MASK, v.y, 1),
                      __shfl_down_sync(FULL_MASK, v.z, 1), __shfl_down_sync(FULL_MASK, v.w, 1));
}

// The geometry of a shifted tile: `h` head bytes up to the destination's
// first 16-byte boundary, `b` whole aligned destination vectors, `t` tail
// bytes; the source of vector k starts `m` bytes into the aligned source
// vector k (counted from `s0`).
struct Shape {
    u32 h, b, t, m;
    u64 s0;   // aligned address of source vector 0
    u64 a;    // aligned address of destination vector 0
};

__device__ __forceinline__ Shape shape_of(const TileDesc& d) {
    Shape g;
    g.h = (u32)((16u - (u32)(d.dst & 15u)) & 15u);
    if (g.h > d.n) g.h = d.n;
    g.b = (d.n - g.h) >> 4;
    g.t = d.n - g.h - 16u * g.b;
    const u64 src = d.src + g.h;
    g.m = (u32)(src & 15u);
    g.s0 = src - g.m;
    g.a = d.dst + g.h;
    return g;
}

// Thread `tid` owns the 16-byte vectors k = c * THREADS + tid of the tile,
// so a warp's accesses are contiguous. Aligned tile: vector k is bytes
// 16k.. of source and destination (the last one may be short).
__device__ __forceinline__ void load_aligned(uint4 (&r)[CUARENA_VPT], const unsigned char* sp,
                                             u32 n, u32 tid) {
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        const u32 o = (c * CUARENA_THREADS + tid) * 16u;
        if (o + 16u <= n) r[c] = ld16(sp + o);
        else if (o < n) r[c] = ld_tail(sp + o, n - o);
        else r[c] = make_uint4(0, 0, 0, 0);
    }
}

// Stores the vectors that start at or after byte `from` when `upper`, the
// others when not.
__device__ __forceinline__ void store_aligned(const uint4 (&r)[CUARENA_VPT], unsigned char* dp,
                                              u32 n, u32 tid, u32 from, bool upper) {
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        const u32 o = (c * CUARENA_THREADS + tid) * 16u;
        if ((o >= from) != upper) continue;
        if (o + 16u <= n) st16(dp + o, r[c]);
        else if (o < n) st_tail(dp + o, r[c], n - o);
    }
}

// Shared state of the shifting path, double-buffered by tile parity (a warp
// may load its next tile while its left neighbour still stores this one).
struct ShiftShared {
    uint4 first[2][CUARENA_VPT][CUARENA_WARPS];  // lane 0's vector c of each warp
    uint4 extra;                                 // source vector VPT*THREADS (thread THREADS-1)
    uint4 head, tail;                            // bytes of threads 0 and TAIL_THREAD
};

// Shifted tile: thread tid loads aligned source vector k (for the destination
// vector k it stores); the vector after it comes from the next lane, or
// through shared memory across warps.
__device__ __forceinline__ void load_shifted(uint4 (&r)[CUARENA_VPT], const TileDesc& d,
                                             const Shape& g, u32 tid, u32 buf, ShiftShared& sh) {
    const u32 need = g.b == 0 ? 0u : g.b + (g.m != 0 ? 1u : 0u);  // source vectors read
    const unsigned char* s0 = reinterpret_cast<const unsigned char*>(g.s0);
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        const u32 k = c * CUARENA_THREADS + tid;
        r[c] = k < need ? ld16(s0 + 16u * k) : make_uint4(0, 0, 0, 0);
    }
    if ((tid & 31u) == 0) {
#pragma unroll
        for (int c = 0; c < CUARENA_VPT; ++c) sh.first[buf][c][tid >> 5] = r[c];
    }
    if (tid == CUARENA_THREADS - 1 && need > CUARENA_VPT * CUARENA_THREADS)
        sh.extra = ld16(s0 + 16u * (CUARENA_VPT * CUARENA_THREADS));
    if (tid == 0 && g.h) sh.head = ld_tail(reinterpret_cast<const unsigned char*>(d.src), g.h);
    if (tid == TAIL_THREAD && g.t)
        sh.tail = ld_tail(reinterpret_cast<const unsigned char*>(g.s0 + g.m + 16ull * g.b), g.t);
}

// Stores the pieces of a shifted tile that start at or after destination
// byte `from` when `upper`, the others when not. Every lane of the warp
// must call it (the vectors cross lanes).
__device__ __forceinline__ void store_shifted(const uint4 (&r)[CUARENA_VPT], const TileDesc& d,
                                              const Shape& g, u32 tid, u32 buf,
                                              const ShiftShared& sh, u32 from, bool upper) {
    const u32 lane = tid & 31u, warp = tid >> 5;
    unsigned char* a = reinterpret_cast<unsigned char*>(g.a);
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        uint4 next = shfl_down1(r[c]);
        if (lane == 31) {
            next = warp + 1 < CUARENA_WARPS ? sh.first[buf][c][warp + 1]
                   : c + 1 < CUARENA_VPT   ? sh.first[buf][c + 1][0]
                                           : sh.extra;
        }
        const u32 k = c * CUARENA_THREADS + tid;
        if (k < g.b && ((g.h + 16u * k >= from) == upper)) st16(a + 16u * k, shift16(r[c], next, g.m));
    }
    if (tid == 0 && g.h && ((from == 0u) == upper))
        st_tail(reinterpret_cast<unsigned char*>(d.dst), sh.head, g.h);
    if (tid == TAIL_THREAD && g.t && ((g.h + 16u * g.b >= from) == upper))
        st_tail(a + 16ull * g.b, sh.tail, g.t);
}

// Whether thread tid stores anything below destination byte `wait`.
__device__ __forceinline__ bool has_lower(const TileDesc& d, bool shifted, const Shape& g,
                                          u32 tid, u32 wait) {
    if (!shifted) return 16u * tid < wait && 16u * tid < d.n;
    return (tid < g.b && g.h + 16u * tid < wait) || (tid == 0 && g.h) ||
           (tid == TAIL_THREAD && g.t && g.h + 16u * g.b < wait);
}

// Waits, spread over the lanes of a warp, until tiles lo..=hi are
// published (acquire), calling `poll` between spins; returns true when this
// lane gave up (the watchdog: the error word then says so).
template <class Poll>
__device__ __forceinline__ bool wait_tiles(const WaveArgs& a, u32 lo, u32 hi, u32 lane, Poll poll) {
    for (u32 x = lo + lane; x <= hi; x += 32u) {
        u32 spins = 0;
        while (ld_acquire(&a.flags[x]) != a.epoch) {
            if (++spins > CUARENA_SPIN_LIMIT) {
                atomicOr(&a.ctl[1], CUARENA_ERR_TIMEOUT);
                return true;
            }
            poll();
            if (spins > 16) __nanosleep(64);
        }
    }
    return false;
}

// Bytes of the lower part of tile `d` when it waits for `wait` bytes: up
// to the end of the last piece (head bytes, 16-byte vector, tail bytes; see
// Shape) that starts below `wait`, which is what both kernels store late.
__device__ __forceinline__ u32 lower_bytes(const TileDesc& d, u32 wait) {
    u32 h = (16u - (u32)(d.dst & 15u)) & 15u;
    if (h > d.n) h = d.n;
    if (wait <= h) return h;
    const u32 q = (wait - h + 15u) >> 4, b = (d.n - h) >> 4;
    return q > b ? d.n : h + 16u * q;
}

// Tile t's descriptor: where it is, whether it takes the shifting path, and
// the range of earlier tiles whose source overlaps its destination (a
// contiguous range, since sources ascend and are disjoint).
__device__ __forceinline__ TileDesc describe(const WaveArgs& a, u32 t) {
    // The move: the last one whose first tile is <= t.
    u32 l = 0, h = a.n_moves;
    while (l < h) {
        const u32 m = (l + h) >> 1;
        if (a.moves[m].tile_base <= t) l = m + 1; else h = m;
    }
    const u32 i = l - 1;
    const u64 src = a.moves[i].src, dst = a.moves[i].dst, len = a.moves[i].len;
    const u64 off = (u64)(t - a.moves[i].tile_base) * CUARENA_TILE_BYTES;
    const u64 rest = len - off;
    const u32 n = (u32)(rest < CUARENA_TILE_BYTES ? rest : CUARENA_TILE_BYTES);
    const u64 d0 = dst + off, d1 = d0 + n;
    // Moves whose source overlaps [d0, d1): jlo .. l-1. Source ends
    // ascend too, so both searches are plain binary searches.
    l = 0;
    h = a.n_moves;
    while (l < h) {
        const u32 m = (l + h) >> 1;
        if (a.moves[m].src + a.moves[m].len > d0) h = m; else l = m + 1;
    }
    const u32 jlo = l;
    h = a.n_moves;
    while (l < h) {
        const u32 m = (l + h) >> 1;
        if (a.moves[m].src >= d1) h = m; else l = m + 1;
    }
    u32 wlo = 1, whi = 0;  // empty
    u32 wait = 0;
    if (jlo < l) {
        const u32 jhi = l - 1;
        const u64 slo = a.moves[jlo].src, shi = a.moves[jhi].src;
        const u64 ehi = shi + a.moves[jhi].len;
        wlo = a.moves[jlo].tile_base + (u32)(((d0 > slo ? d0 : slo) - slo) / CUARENA_TILE_BYTES);
        whi = a.moves[jhi].tile_base + (u32)(((d1 < ehi ? d1 : ehi) - 1 - shi) / CUARENA_TILE_BYTES);
        if (whi > t) {
            // Writes over a later tile's source (rule 3): waiting could
            // deadlock. Never wait; report.
            atomicOr(&a.ctl[1], CUARENA_ERR_ORDER);
            wlo = 1;
            whi = 0;
        } else if (whi == t) {
            // My own source is in my registers before I store.
            if (t == 0) { wlo = 1; whi = 0; } else { whi = t - 1; }
        }
        if (wlo <= whi) {
            // Earlier tiles' sources all lie below my own source, so only
            // destination bytes below it can cover them.
            const u64 s0 = src + off;
            wait = (u32)(d0 < s0 ? ((d1 < s0 ? d1 : s0) - d0) : 0);
            if (wait == 0) { wlo = 1; whi = 0; }
        }
    }
    const bool shifted = (((a.base + src) | (a.base + dst)) & 15u) != 0;
    TileDesc d;
    d.src = a.base + src + off;
    d.dst = a.base + dst + off;
    d.n = n;
    d.lo = wlo;
    d.hi = whi;
    // Sliding down onto itself, and this tile's source below the move's
    // destination end: the move overwrites every byte of it.
    const bool keep = src > dst && src + off + n <= dst + len;
    d.wait = wait | (shifted ? CUARENA_SHIFTED : 0u) | (keep ? CUARENA_KEEP : 0u);
    return d;
}

// Per tile, one thread each, all independent (so the move kernel's
// critical path holds no searches): the descriptor, and for a tile that
// defers (small lower part, room left in the side buffer) its place there,
// taken with one atomic per warp. Also resets the ticket counter for the
// move kernel that follows on the stream. Every thread of a warp runs the
// same iterations (the shuffles need the whole warp).
extern "C" __global__ void cuarena_prep(WaveArgs a) {
    if (blockIdx.x == 0 && threadIdx.x == 0) a.ctl[0] = 0;
    const u32 lane = threadIdx.x & 31u;
    for (u32 first = blockIdx.x * blockDim.x; first < a.n_tiles; first += gridDim.x * blockDim.x) {
        const u32 t = first + threadIdx.x;
        TileDesc d = {};
        u32 need = 0, low = 0;
        if (t < a.n_tiles) {
            d = describe(a, t);
            const u32 wait = d.wait & CUARENA_WAIT_MASK;
            if (a.side_cap != 0 && d.lo <= d.hi && wait <= CUARENA_DEFER_MAX &&
                wait * CUARENA_DEFER_RATIO <= d.n) {
                low = lower_bytes(d, wait);
                // Placed at the destination's offset modulo 16, so that
                // both kernels store it as they would at the destination.
                need = ((u32)(d.dst & 15u) + low + 15u) & ~15u;
            }
        }
        u32 incl = need;  // inclusive prefix sum over the warp
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(FULL_MASK, incl, o);
            if (lane >= o) incl += v;
        }
        const u32 total = __shfl_sync(FULL_MASK, incl, 31);
        u64 start = 0;
        // 64-bit, so that many launches' worth of failed requests cannot
        // wrap it back into the buffer.
        if (lane == 31 && total != 0)
            start = atomicAdd(reinterpret_cast<unsigned long long*>(a.ctl + 2), (u64)total);
        start = __shfl_sync(FULL_MASK, start, 31);
        if (t < a.n_tiles) {
            const u64 at = start + incl - need;
            if (need != 0 && at + need <= a.side_cap) {
                d.lo = (u32)at + (u32)(d.dst & 15u);
                d.hi = low;
                d.wait |= CUARENA_DEFERRED;
            }
            a.tiles[t] = d;
        }
    }
}

// Rule 3 over a whole wave that ran in several chunks (the prep kernel sees
// one chunk): no move's destination overlaps the source of a later move, or
// its own source sliding up. Runs after the wave, so it reports a bad plan
// (the arena then poisons itself) rather than preventing damage; a bad plan
// can never make a tile wait for a later one (prep sees to that).
extern "C" __global__ void cuarena_check(WaveArgs a) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n_moves;
         i += gridDim.x * blockDim.x) {
        const u64 d0 = a.moves[i].dst, d1 = d0 + a.moves[i].len;
        // Last move whose source starts below d1; sources ascend and are
        // disjoint, so it is the last that can overlap [d0, d1).
        u32 l = 0, h = a.n_moves;
        while (l < h) {
            const u32 m = (l + h) >> 1;
            if (a.moves[m].src < d1) l = m + 1; else h = m;
        }
        if (l == 0) continue;
        const u32 j = l - 1;
        if (a.moves[j].src + a.moves[j].len <= d0) continue;  // touches no source
        if (j > i || (j == i && d0 > a.moves[i].src)) atomicOr(&a.ctl[1], CUARENA_ERR_ORDER);
    }
}

// Persistent CTAs: take a ticket, load the tile into registers, take the
// next ticket, publish the tile, store the part that covers at most the
// tile's own source; then the warps that store over earlier tiles' sources
// wait for those tiles (each warp on its own) and store the rest. The ticket
// for the next tile is taken before this tile stores; that is safe: the
// smallest unstored tile is either loaded (and waits only for smaller tiles,
// all stored) or not yet loaded by a CTA whose current tile is stored, so
// something always progresses.
extern "C" __global__ void __launch_bounds__(CUARENA_THREADS) cuarena_move(WaveArgs a) {
    // Double-buffered by iteration parity: thread 0 writes the next ticket
    // of iteration k+1 while slow threads may still read that of k.
    __shared__ u32 s_ticket[2];
    // Set when a wait of this CTA timed out (the watchdog fired): from then
    // on the CTA stores nothing, since storing could overwrite a source that
    // an earlier tile has not loaded. Written only on the timeout path.
    __shared__ u32 s_abort;
    __shared__ ShiftShared s_shift;
    const u32 tid = threadIdx.x, lane = tid & 31u;
    if (tid == 0) {
        s_ticket[0] = atomicAdd(&a.ctl[0], 1u);
        s_abort = 0;
    }
    __syncthreads();
    u32 t = s_ticket[0];
    u32 parity = 1;
    while (t < a.n_tiles) {
        const TileDesc d = a.tiles[t];
        const bool shifted = (d.wait & CUARENA_SHIFTED) != 0;
        const u32 wait = d.wait & CUARENA_WAIT_MASK;
        const u32 buf = parity ^ 1u;
        const Shape g = shape_of(d);
        uint4 r[CUARENA_VPT];
        if (shifted) load_shifted(r, d, g, tid, buf, s_shift);
        else load_aligned(r, reinterpret_cast<const unsigned char*>(d.src), d.n, tid);
        if (tid == 0) s_ticket[parity] = atomicAdd(&a.ctl[0], 1u);

        // The tile is published only once every thread's loads have returned
        // their data: the barrier's predicate reads a word of each vector
        // (shared-memory copies were stored from registers, which waited
        // too), so by the time thread 0 stores the flag, every load of the
        // tile has its value and no later store, by any CTA, can change it.
        // A relaxed store suffices for that; a release (or a fence) would
        // also wait for this warp's stores of the previous tile to reach L2,
        // which cost 2-3% on slides (BENCHMARKS.md, the moves sweep).
        u32 dep = 0;
#pragma unroll
        for (int c = 0; c < CUARENA_VPT; ++c) dep |= r[c].x;
        __syncthreads_or(dep);
        if (tid == 0) st_relaxed(&a.flags[t], a.epoch);
        const u32 next = s_ticket[parity];
        parity ^= 1u;
        // Bytes past `wait` cover at most my own source, which is loaded.
        // (`s_abort` is read as one value per warp: the shifting path
        // needs every lane.)
        const bool stop = __any_sync(FULL_MASK, s_abort != 0);
        if (!stop) {
            if (shifted) store_shifted(r, d, g, tid, buf, s_shift, wait, true);
            else store_aligned(r, reinterpret_cast<unsigned char*>(d.dst), d.n, tid, wait, true);
        }
        const bool deferred = (d.wait & CUARENA_DEFERRED) != 0;
        if (deferred) {
            // The lower part to the side buffer, at the same offsets modulo
            // 16 (cuarena_settle puts it in place): no wait.
            if (!stop && __any_sync(FULL_MASK, has_lower(d, shifted, g, tid, wait))) {
                TileDesc ds = d;
                ds.dst = a.side + d.lo;
                if (shifted) {
                    Shape gs = g;
                    gs.a = ds.dst + g.h;
                    store_shifted(r, ds, gs, tid, buf, s_shift, wait, false);
                } else {
                    store_aligned(r, reinterpret_cast<unsigned char*>(ds.dst), d.n, tid, wait, false);
                }
            }
        } else if (d.lo <= d.hi && __any_sync(FULL_MASK, has_lower(d, shifted, g, tid, wait))) {
            const bool gave_up = wait_tiles(a, d.lo, d.hi, lane, [] {});
            // Every lane's wait is over, and the warp barrier orders the
            // lanes' acquires before every lane's stores. If one gave up,
            // the earlier tile may not have loaded the bytes this part would
            // overwrite: store nothing, now or later.
            __syncwarp();
            if (__any_sync(FULL_MASK, gave_up)) {
                if (lane == 0) s_abort = 1;
            } else if (stop) {
                // An earlier tile of this CTA gave up: store nothing.
            } else if (shifted) {
                store_shifted(r, d, g, tid, buf, s_shift, wait, false);
            } else {
                store_aligned(r, reinterpret_cast<unsigned char*>(d.dst), d.n, tid, wait, false);
            }
        }
        t = next;
    }
}

// Threads of cuarena_settle per deferred tile.
#define CUARENA_SETTLE_LANES 16u

// After the move kernel, in stream order (so every tile's source has been
// loaded): copies each deferred tile's lower part from the side buffer to
// its destination (the two addresses agree modulo 16), CUARENA_SETTLE_LANES
// threads per tile, each a 16-byte vector at a time. The parts are small
// (256 B for a slide by 256 B), so the kernel's time is latency: one
// vector per thread keeps the most loads in flight (a warp per tile took
// 19.5 us for 65,536 tiles on an H200, a thread per tile 28 us). Also
// resets the side buffer's counter for the next prep.
extern "C" __global__ void cuarena_settle(WaveArgs a) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        *reinterpret_cast<unsigned long long*>(a.ctl + 2) = 0;
    const u32 sub = threadIdx.x % CUARENA_SETTLE_LANES;
    const u32 per_cta = blockDim.x / CUARENA_SETTLE_LANES;
    for (u32 t = blockIdx.x * per_cta + threadIdx.x / CUARENA_SETTLE_LANES; t < a.n_tiles;
         t += gridDim.x * per_cta) {
        const TileDesc d = a.tiles[t];
        if ((d.wait & CUARENA_DEFERRED) == 0) continue;
        const unsigned char* s = reinterpret_cast<const unsigned char*>(a.side + d.lo);
        unsigned char* p = reinterpret_cast<unsigned char*>(d.dst);
        const u32 n = d.hi;
        u32 h = (16u - (u32)(d.dst & 15u)) & 15u;
        if (h > n) h = n;
        const u32 b = (n - h) >> 4, e = h + 16u * b;
        for (u32 k = sub; k < b; k += CUARENA_SETTLE_LANES)
            st16n(p + h + 16u * k, ld16(s + h + 16u * k));
        if (sub == 0)
            for (u32 j = 0; j < h; ++j) st1n(p + j, s[j]);
        if (sub == 1 % CUARENA_SETTLE_LANES)
            for (u32 j = e; j < n; ++j) st1n(p + j, s[j]);
    }
}
