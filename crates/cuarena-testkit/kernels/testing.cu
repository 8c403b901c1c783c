// Test helpers for tests/all/gpu.rs (not used by the library): a byte
// pattern that depends on the byte's address, and a checker that compares a
// region against "each destination holds its origin's pattern, every other
// byte its own".
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ unsigned char pattern(u64 p, u64 seed) {
    u64 z = (p ^ seed) * 0x9E3779B97F4A7C15ull;
    z ^= z >> 29;
    return (unsigned char)(z >> 24);
}

// region[p] = pattern(p) for p in [lo, hi).
extern "C" __global__ void test_fill(unsigned char* region, u64 lo, u64 hi, u64 seed) {
    for (u64 p = lo + blockIdx.x * (u64)blockDim.x + threadIdx.x; p < hi;
         p += (u64)gridDim.x * blockDim.x)
        region[p] = pattern(p, seed);
}

// Segments sorted by dst, disjoint: bytes [dst, dst + len) must hold the
// pattern of [origin, origin + len); bytes of [lo, hi) outside every segment
// their own pattern. Each thread checks a run of `chunk` bytes.
struct Seg { u64 dst, origin, len; };

extern "C" __global__ void test_check(const unsigned char* region, const Seg* segs, u32 nsegs,
                                      u64 lo, u64 hi, u64 chunk, u64 seed,
                                      unsigned long long* bad, unsigned long long* first_bad) {
    const u64 start = lo + (blockIdx.x * (u64)blockDim.x + threadIdx.x) * chunk;
    if (start >= hi) return;
    const u64 end = start + chunk < hi ? start + chunk : hi;
    // First segment that ends after `start`.
    u32 l = 0, h = nsegs;
    while (l < h) {
        u32 m = (l + h) >> 1;
        if (segs[m].dst + segs[m].len > start) h = m; else l = m + 1;
    }
    u32 s = l;
    unsigned long long mine = 0, first = ~0ull;
    for (u64 p = start; p < end; ++p) {
        while (s < nsegs && segs[s].dst + segs[s].len <= p) ++s;
        u64 origin = p;
        if (s < nsegs && segs[s].dst <= p) origin = segs[s].origin + (p - segs[s].dst);
        if (region[p] != pattern(origin, seed)) {
            ++mine;
            if (p < first) first = p;
        }
    }
    if (mine) {
        atomicAdd(bad, mine);
        atomicMin(first_bad, first);
    }
}

// ---- user-kernel stand-ins for the arena tests --------------------------

// out[i] = start + i.
extern "C" __global__ void test_iota_f32(float* out, u32 n, float start) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = start + (float)i;
}

// The same after spinning `spin` clock cycles first (a kernel slow enough
// that a compaction enqueued without waiting for it would overtake it).
extern "C" __global__ void test_slow_iota_f32(float* out, u32 n, float start, long long spin) {
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = start + (float)i;
}

// Holds the stream until the host sets *gate (page-locked host memory
// mapped for the device), or `timeout_ns` of the global timer passed: work
// queued behind it cannot start before the host says so.
extern "C" __global__ void test_gate(const volatile unsigned int* gate, u64 timeout_ns) {
    u64 t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    u64 t = t0;
    while (*gate == 0u && t - t0 < timeout_ns) {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
}

#include "cuarena.cuh"

// Resolves `handle` through the device handle table and writes iota into
// its block; sets *stale when the checked resolve refuses the handle.
extern "C" __global__ void test_iota_by_handle(unsigned long long base, const CuarenaEntry* table,
                                               u32 slots, unsigned long long handle, u32 n,
                                               float start, int* stale) {
    float* out = (float*)cuarena_resolve_checked(base, table, slots, handle, (u64)n * 4);
    if (out == nullptr) {
        if (blockIdx.x == 0 && threadIdx.x == 0) *stale = 1;
        return;
    }
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = start + (float)i;
}
