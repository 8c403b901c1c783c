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
#include "moves.h"

__device__ __forceinline__ u32 ld_acquire(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(u32* p, u32 v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// 16 bytes at p, read with accesses of W bytes (p is W-aligned).
template <int W>
__device__ __forceinline__ uint4 ld16(const unsigned char* p) {
    uint4 v;
    if (W == 16) {
        // L2 only (.cg): the data is used once, and L1 is not coherent.
        v = __ldcg(reinterpret_cast<const uint4*>(p));
    } else if (W == 8) {
        const u64* q = reinterpret_cast<const u64*>(p);
        u64 a = q[0], b = q[1];
        v = make_uint4((u32)a, (u32)(a >> 32), (u32)b, (u32)(b >> 32));
    } else if (W == 4) {
        const u32* q = reinterpret_cast<const u32*>(p);
        v = make_uint4(q[0], q[1], q[2], q[3]);
    } else if (W == 2) {
        const unsigned short* q = reinterpret_cast<const unsigned short*>(p);
        v = make_uint4(q[0] | ((u32)q[1] << 16), q[2] | ((u32)q[3] << 16),
                       q[4] | ((u32)q[5] << 16), q[6] | ((u32)q[7] << 16));
    } else {
        u32 x[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
            x[k] = p[4 * k] | ((u32)p[4 * k + 1] << 8) | ((u32)p[4 * k + 2] << 16) |
                   ((u32)p[4 * k + 3] << 24);
        v = make_uint4(x[0], x[1], x[2], x[3]);
    }
    return v;
}

template <int W>
__device__ __forceinline__ void st16(unsigned char* p, uint4 v) {
    if (W == 16) {
        __stcg(reinterpret_cast<uint4*>(p), v);
    } else if (W == 8) {
        u64* q = reinterpret_cast<u64*>(p);
        q[0] = (u64)v.x | ((u64)v.y << 32);
        q[1] = (u64)v.z | ((u64)v.w << 32);
    } else if (W == 4) {
        u32* q = reinterpret_cast<u32*>(p);
        q[0] = v.x; q[1] = v.y; q[2] = v.z; q[3] = v.w;
    } else if (W == 2) {
        unsigned short* q = reinterpret_cast<unsigned short*>(p);
        q[0] = (unsigned short)v.x; q[1] = (unsigned short)(v.x >> 16);
        q[2] = (unsigned short)v.y; q[3] = (unsigned short)(v.y >> 16);
        q[4] = (unsigned short)v.z; q[5] = (unsigned short)(v.z >> 16);
        q[6] = (unsigned short)v.w; q[7] = (unsigned short)(v.w >> 16);
    } else {
        u32 x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int b = 0; b < 16; ++b) p[b] = (unsigned char)(x[b >> 2] >> ((b & 3) * 8));
    }
}

// The first n < 16 bytes at p, byte by byte.
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

// Thread `tid` owns the 16-byte chunks c * THREADS + tid of the tile, so a
// warp's accesses are contiguous.
template <int W>
__device__ __forceinline__ void load_tile(uint4 (&r)[CUARENA_VPT], const unsigned char* sp, u32 n,
                                          u32 tid) {
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        u32 o = (c * CUARENA_THREADS + tid) * 16u;
        if (o + 16u <= n) r[c] = ld16<W>(sp + o);
        else if (o < n) r[c] = ld_tail(sp + o, n - o);
    }
}

// Stores the chunks that start at or after byte `from` when `upper`, the
// others when not.
template <int W>
__device__ __forceinline__ void store_tile(const uint4 (&r)[CUARENA_VPT], unsigned char* dp, u32 n,
                                           u32 tid, u32 from, bool upper) {
#pragma unroll
    for (int c = 0; c < CUARENA_VPT; ++c) {
        u32 o = (c * CUARENA_THREADS + tid) * 16u;
        if ((o >= from) != upper) continue;
        if (o + 16u <= n) st16<W>(dp + o, r[c]);
        else if (o < n) st_tail(dp + o, r[c], n - o);
    }
}

__device__ __forceinline__ void store_any(const uint4 (&r)[CUARENA_VPT], unsigned char* dp, u32 n,
                                          u32 tid, u32 w, u32 from, bool upper) {
    switch (w) {
        case 16: store_tile<16>(r, dp, n, tid, from, upper); break;
        case 8: store_tile<8>(r, dp, n, tid, from, upper); break;
        case 4: store_tile<4>(r, dp, n, tid, from, upper); break;
        case 2: store_tile<2>(r, dp, n, tid, from, upper); break;
        default: store_tile<1>(r, dp, n, tid, from, upper); break;
    }
}

// Per tile: where it is, how wide its accesses can be, and the range of
// earlier tiles whose source overlaps its destination (a contiguous range,
// since sources ascend and are disjoint). One thread per tile, all
// independent, so the move kernel's critical path holds no searches. Also
// resets the ticket counter for the move kernel that follows on the stream.
extern "C" __global__ void cuarena_prep(WaveArgs a) {
    if (blockIdx.x == 0 && threadIdx.x == 0) a.ctl[0] = 0;
    for (u32 t = blockIdx.x * blockDim.x + threadIdx.x; t < a.n_tiles;
         t += gridDim.x * blockDim.x) {
        // The move: the last one whose first tile is <= t.
        u32 l = 0, h = a.n_moves;
        while (l < h) {
            const u32 m = (l + h) >> 1;
            if (a.tile_base[m] <= t) l = m + 1; else h = m;
        }
        const u32 i = l - 1;
        const u64 src = a.src[i], dst = a.dst[i], len = a.len[i];
        const u64 off = (u64)(t - a.tile_base[i]) * CUARENA_TILE_BYTES;
        const u64 rest = len - off;
        const u32 n = (u32)(rest < CUARENA_TILE_BYTES ? rest : CUARENA_TILE_BYTES);
        const u64 d0 = dst + off, d1 = d0 + n;
        // Moves whose source overlaps [d0, d1): jlo .. l-1. Source ends
        // ascend too, so both searches are plain binary searches.
        l = 0;
        h = a.n_moves;
        while (l < h) {
            const u32 m = (l + h) >> 1;
            if (a.src[m] + a.len[m] > d0) h = m; else l = m + 1;
        }
        const u32 jlo = l;
        h = a.n_moves;
        while (l < h) {
            const u32 m = (l + h) >> 1;
            if (a.src[m] >= d1) h = m; else l = m + 1;
        }
        u32 wlo = 1, whi = 0;  // empty
        u32 wait = 0;
        if (jlo < l) {
            const u32 jhi = l - 1;
            const u64 slo = a.src[jlo], shi = a.src[jhi];
            const u64 ehi = shi + a.len[jhi];
            wlo = a.tile_base[jlo] + (u32)(((d0 > slo ? d0 : slo) - slo) / CUARENA_TILE_BYTES);
            whi = a.tile_base[jhi] + (u32)(((d1 < ehi ? d1 : ehi) - 1 - shi) / CUARENA_TILE_BYTES);
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
        const u64 mis = (a.base + src) | (a.base + dst) | 16u;
        const u32 w = (u32)(mis & (~mis + 1));  // lowest set bit: 1, 2, 4, 8 or 16
        TileDesc d;
        d.src = a.base + src + off;
        d.dst = a.base + dst + off;
        d.n = n;
        d.lo = wlo;
        d.hi = whi;
        d.wait = wait | ((u32)__ffs(w) - 1u) << 24;
        a.tiles[t] = d;
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
        const u64 d0 = a.dst[i], d1 = d0 + a.len[i];
        // Last move whose source starts below d1; sources ascend and are
        // disjoint, so it is the last that can overlap [d0, d1).
        u32 l = 0, h = a.n_moves;
        while (l < h) {
            const u32 m = (l + h) >> 1;
            if (a.src[m] < d1) l = m + 1; else h = m;
        }
        if (l == 0) continue;
        const u32 j = l - 1;
        if (a.src[j] + a.len[j] <= d0) continue;  // touches no source
        if (j > i || (j == i && d0 > a.src[i])) atomicOr(&a.ctl[1], CUARENA_ERR_ORDER);
    }
}

// Persistent CTAs: take a ticket, load the tile into registers, take the
// next ticket, publish the tile, store the part that covers at most the
// tile's own source, wait for the earlier tiles the rest writes over, store
// the rest. The ticket for the next tile is taken before this tile stores;
// that is safe: the smallest unstored tile is either loaded (and waits only
// for smaller tiles, all stored) or not yet loaded by a CTA whose current
// tile is stored, so something always progresses.
extern "C" __global__ void __launch_bounds__(CUARENA_THREADS) cuarena_move(WaveArgs a) {
    // Double-buffered by iteration parity: thread 0 writes the next ticket
    // of iteration k+1 while slow threads may still read that of k.
    __shared__ u32 s_ticket[2];
    // Set when a wait of this CTA timed out (the watchdog fired): from then
    // on the CTA stores nothing, since storing could overwrite a source that
    // an earlier tile has not loaded. Written only on the timeout path.
    __shared__ u32 s_abort;
    const u32 tid = threadIdx.x;
    if (tid == 0) {
        s_ticket[0] = atomicAdd(&a.ctl[0], 1u);
        s_abort = 0;
    }
    __syncthreads();
    u32 t = s_ticket[0];
    u32 parity = 1;
    while (t < a.n_tiles) {
        const TileDesc d = a.tiles[t];
        const unsigned char* sp = reinterpret_cast<const unsigned char*>(d.src);
        unsigned char* dp = reinterpret_cast<unsigned char*>(d.dst);
        uint4 r[CUARENA_VPT];
        switch (d.wait >> 24) {
            case 4: load_tile<16>(r, sp, d.n, tid); break;
            case 3: load_tile<8>(r, sp, d.n, tid); break;
            case 2: load_tile<4>(r, sp, d.n, tid); break;
            case 1: load_tile<2>(r, sp, d.n, tid); break;
            default: load_tile<1>(r, sp, d.n, tid); break;
        }
        if (tid == 0) s_ticket[parity] = atomicAdd(&a.ctl[0], 1u);
        // Every thread's loads have completed before the tile is published.
        __threadfence();
        __syncthreads();
        if (tid == 0) st_release(&a.flags[t], a.epoch);
        const u32 next = s_ticket[parity];
        parity ^= 1u;
        const u32 w = 1u << (d.wait >> 24);
        const u32 wait = d.wait & 0xFFFFFFu;
        // Bytes past `wait` cover at most my own source, which is loaded.
        // (`s_abort` was last written before the barrier above.)
        if (!s_abort) store_any(r, dp, d.n, tid, w, wait, true);
        if (d.lo <= d.hi) {
            for (u32 x = d.lo + tid; x <= d.hi; x += CUARENA_THREADS) {
                u32 spins = 0;
                while (ld_acquire(&a.flags[x]) != a.epoch) {
                    if (++spins > CUARENA_SPIN_LIMIT) {
                        atomicOr(&a.ctl[1], CUARENA_ERR_TIMEOUT);
                        s_abort = 1;
                        break;
                    }
                    if (spins > 16) __nanosleep(64);
                }
            }
            __syncthreads();
            // Every wait is over; if one gave up, the earlier tile may not
            // have loaded the bytes this part would overwrite: store nothing.
            if (!s_abort) store_any(r, dp, d.n, tid, w, wait, false);
        }
        t = next;
    }
}
