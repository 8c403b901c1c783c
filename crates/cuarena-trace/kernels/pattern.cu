// Pattern kernels for the GPU trace replay (src/trace/gpu.rs): fill a
// tensor with words derived from its id and its own word index, check them
// later, and a delay kernel that keeps the stream busy for a fixed time.
//
// A tensor's 32-bit word w (bytes 4w..4w+4, little-endian) holds
// word(seed_of(id), w). The pattern depends on the position *inside* the
// tensor, not on its address, so a correct move preserves it, and on the
// id, so a block copied over another tensor, or a stale one, does not pass.
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ u32 seed_of(u32 id) { return mix32(id * 0x9E3779B9u + 0x632BE5ABu); }

__device__ __forceinline__ u32 word(u32 seed, u64 w) {
    return mix32(seed ^ (u32)w ^ mix32((u32)(w >> 32) + 0x5BD1E995u));
}

__device__ __forceinline__ unsigned char byte_at(u32 seed, u64 b) {
    return (unsigned char)(word(seed, b >> 2) >> ((b & 3u) * 8u));
}

// Fills [p, p + len). 16-byte stores when p is 16-byte aligned, bytes for
// the tail (and for everything when it is not).
extern "C" __global__ void pattern_fill(unsigned char* p, u64 len, u32 id) {
    const u32 seed = seed_of(id);
    const u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 nvec = ((u64)p & 15u) ? 0 : len / 16u;
    uint4* v = reinterpret_cast<uint4*>(p);
    for (u64 i = tid; i < nvec; i += stride) {
        const u64 w = i * 4u;
        v[i] = make_uint4(word(seed, w), word(seed, w + 1), word(seed, w + 2), word(seed, w + 3));
    }
    for (u64 b = nvec * 16u + tid; b < len; b += stride) p[b] = byte_at(seed, b);
}

// Checks the 16-byte vectors of [p, p + len) that start below `head` or end
// above `tail` (head >= tail: all of them), and every byte of the unaligned
// tail. Adds the mismatching 32-bit words (bytes in the tail) to *bad and
// lowers *first_tag to `tag` when any mismatches.
extern "C" __global__ void pattern_check(const unsigned char* p, u64 len, u32 id, u64 head,
                                         u64 tail, u32 tag, u64* bad, u32* first_tag) {
    const u32 seed = seed_of(id);
    const u64 tid = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 nvec = ((u64)p & 15u) ? 0 : len / 16u;
    // Vectors [0, hv) and [tv, nvec).
    u64 hv = (head + 15u) / 16u;
    u64 tv = tail / 16u;
    if (hv >= tv || hv >= nvec) {
        hv = nvec;
        tv = nvec;
    }
    const u64 n = hv + (nvec - tv);
    const uint4* v = reinterpret_cast<const uint4*>(p);
    u64 mine = 0;
    for (u64 j = tid; j < n; j += stride) {
        const u64 i = j < hv ? j : tv + (j - hv);
        const uint4 x = __ldcs(v + i);
        const u64 w = i * 4u;
        mine += (x.x != word(seed, w)) + (x.y != word(seed, w + 1)) + (x.z != word(seed, w + 2)) +
                (x.w != word(seed, w + 3));
    }
    for (u64 b = nvec * 16u + tid; b < len; b += stride) mine += (p[b] != byte_at(seed, b));
    if (mine) {
        atomicAdd(bad, mine);
        atomicMin(first_tag, tag);
    }
}

// One thread spins for `ns` nanoseconds of the global timer: the stream
// stays busy while the host plans and enqueues what follows.
extern "C" __global__ void pattern_delay(u64 ns) {
    u64 t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    u64 t = t0;
    while (t - t0 < ns) {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    }
}
