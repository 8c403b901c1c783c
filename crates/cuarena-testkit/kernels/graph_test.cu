// Kernels of tests/all/gpu_graph.rs and benches/handles.rs (not used by the
// library): the same elementwise operations taking either handles, resolved
// through the arena's device table (`cuarena.cuh`), or raw addresses.
//
// Handle kernels follow the convention of `graph::launch_with_handles`:
// (CuarenaTable, one u64 per handle, one by-value parameter).
typedef unsigned int u32;
typedef unsigned long long u64;

#include "cuarena.cuh"

#define GRID_STRIDE(i, n) \
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += gridDim.x * blockDim.x)

// ---- raw addresses ---------------------------------------------------------

// out = x + y
extern "C" __global__ void raw_add(float* out, const float* x, const float* y, u32 n) {
    GRID_STRIDE(i, n) out[i] = x[i] + y[i];
}

// out = x * y
extern "C" __global__ void raw_mul(float* out, const float* x, const float* y, u32 n) {
    GRID_STRIDE(i, n) out[i] = x[i] * y[i];
}

// acc += x
extern "C" __global__ void raw_accumulate(float* acc, const float* x, u32 n) {
    GRID_STRIDE(i, n) acc[i] = acc[i] + x[i];
}

// ---- handles -----------------------------------------------------------------

// out = x + y (unchecked resolve)
extern "C" __global__ void h_add(CuarenaTable t, u64 out, u64 x, u64 y, u32 n) {
    float* o = (float*)cuarena_at(t, out);
    const float* a = (const float*)cuarena_at(t, x);
    const float* b = (const float*)cuarena_at(t, y);
    GRID_STRIDE(i, n) o[i] = a[i] + b[i];
}

// out = x * y (unchecked resolve)
extern "C" __global__ void h_mul(CuarenaTable t, u64 out, u64 x, u64 y, u32 n) {
    float* o = (float*)cuarena_at(t, out);
    const float* a = (const float*)cuarena_at(t, x);
    const float* b = (const float*)cuarena_at(t, y);
    GRID_STRIDE(i, n) o[i] = a[i] * b[i];
}

// acc += x, every handle checked: when one does not resolve (stale, freed,
// spilled, or too small), nothing is written and *err (itself a block of
// one u32, resolved the same way) counts the refusal.
extern "C" __global__ void h_accumulate_checked(CuarenaTable t, u64 acc, u64 x, u64 err, u32 n) {
    u32* e = (u32*)cuarena_at_checked(t, err, 4);
    float* o = (float*)cuarena_at_checked(t, acc, (u64)n * 4);
    const float* a = (const float*)cuarena_at_checked(t, x, (u64)n * 4);
    if (o == nullptr || a == nullptr) {
        if (e != nullptr && blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(e, 1u);
        return;
    }
    GRID_STRIDE(i, n) o[i] = o[i] + a[i];
}

// ---- benchmark: c = a + b over float4s -------------------------------------

// Grid-stride loop (a fixed grid of a few CTAs per SM).
extern "C" __global__ void bench_add_raw(float4* __restrict__ c, const float4* __restrict__ a,
                                         const float4* __restrict__ b, u64 n4) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n4;
         i += (u64)gridDim.x * blockDim.x) {
        const float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

extern "C" __global__ void bench_add_handles(CuarenaTable t, u64 hc, u64 ha, u64 hb, u64 n4) {
    float4* __restrict__ c = (float4*)cuarena_at(t, hc);
    const float4* __restrict__ a = (const float4*)cuarena_at(t, ha);
    const float4* __restrict__ b = (const float4*)cuarena_at(t, hb);
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n4;
         i += (u64)gridDim.x * blockDim.x) {
        const float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

extern "C" __global__ void bench_add_checked(CuarenaTable t, u64 hc, u64 ha, u64 hb, u64 n4) {
    float4* __restrict__ c = (float4*)cuarena_at_checked(t, hc, n4 * 16);
    const float4* __restrict__ a = (const float4*)cuarena_at_checked(t, ha, n4 * 16);
    const float4* __restrict__ b = (const float4*)cuarena_at_checked(t, hb, n4 * 16);
    if (c == nullptr || a == nullptr || b == nullptr) return;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n4;
         i += (u64)gridDim.x * blockDim.x) {
        const float4 x = a[i], y = b[i];
        c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

// One float4 per thread (a grid as large as the data, as most frameworks
// launch elementwise kernels): every thread resolves.
extern "C" __global__ void bench_add1_raw(float4* __restrict__ c, const float4* __restrict__ a,
                                          const float4* __restrict__ b, u64 n4) {
    const u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

extern "C" __global__ void bench_add1_handles(CuarenaTable t, u64 hc, u64 ha, u64 hb, u64 n4) {
    const u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4* __restrict__ c = (float4*)cuarena_at(t, hc);
    const float4* __restrict__ a = (const float4*)cuarena_at(t, ha);
    const float4* __restrict__ b = (const float4*)cuarena_at(t, hb);
    const float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

extern "C" __global__ void bench_add1_checked(CuarenaTable t, u64 hc, u64 ha, u64 hb, u64 n4) {
    const u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4* __restrict__ c = (float4*)cuarena_at_checked(t, hc, n4 * 16);
    const float4* __restrict__ a = (const float4*)cuarena_at_checked(t, ha, n4 * 16);
    const float4* __restrict__ b = (const float4*)cuarena_at_checked(t, hb, n4 * 16);
    if (c == nullptr || a == nullptr || b == nullptr) return;
    const float4 x = a[i], y = b[i];
    c[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}

// Counts the elements of c (n4 float4s) that are not `want` into *bad.
extern "C" __global__ void bench_count_ne(const float4* c, u64 n4, float want, u32* bad) {
    u32 mine = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n4;
         i += (u64)gridDim.x * blockDim.x) {
        const float4 v = c[i];
        mine += (v.x != want) + (v.y != want) + (v.z != want) + (v.w != want);
    }
    if (mine) atomicAdd(bad, mine);
}
