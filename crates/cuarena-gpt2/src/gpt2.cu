// GPT-2's kernels other than its GEMMs (those go to cuBLAS), compiled at run
// time with NVRTC. fp32 throughout; the bf16 path casts GEMM operands only.
//
// Shapes: B batch, T sequence, C channels, NH heads, HS = C / NH, V vocab,
// N = B * T rows. Row-major everywhere. Tokens arrive as one (B, T + 1) int
// buffer: inputs are tok[b * (T + 1) + t], targets tok[b * (T + 1) + t + 1].
// Sizes that can pass 2^31 elements (logits at N * V) are indexed in size_t.

#define WARP 32

// Every index i in [0, n) once, spread over the whole grid (size_t: n can
// pass 2^31).
#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)
#define NEG_INF __int_as_float(0xff800000)

// The reductions: an associative operation and its identity.
struct Sum {
    __device__ static float apply(float a, float b) { return a + b; }
    __device__ static float identity() { return 0.0f; }
};

struct Max {
    __device__ static float apply(float a, float b) { return fmaxf(a, b); }
    __device__ static float identity() { return NEG_INF; }
};

// Over a warp; every lane gets the result.
template <class Op>
__device__ __forceinline__ float warp_reduce(float v) {
    for (int o = 16; o > 0; o >>= 1) v = Op::apply(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// Over a block of up to 1024 threads (a multiple of 32); every thread gets
// the result. `sh` holds 32 floats.
template <class Op>
__device__ float block_reduce(float v, float* sh) {
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    v = warp_reduce<Op>(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : Op::identity();
    return warp_reduce<Op>(v);
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce<Sum>(v); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce<Max>(v); }
__device__ float block_sum(float v, float* sh) { return block_reduce<Sum>(v, sh); }
__device__ float block_max(float v, float* sh) { return block_reduce<Max>(v, sh); }

extern "C" __global__ void fill_zero(float* p, unsigned long long n) {
    GRID_STRIDE(i, n)
        p[i] = 0.0f;
}

// Element i of the (B, T, C) embeddings: its offsets in wte (its token's
// row) and in wpe (its position's row).
struct Embed {
    size_t wte, wpe;
};

__device__ __forceinline__ Embed embed_of(size_t i, const int* tok, int T, int C) {
    int c = i % C;
    size_t bt = i / C;
    int t = bt % T, b = bt / T;
    int id = tok[(size_t)b * (T + 1) + t];
    return {(size_t)id * C + c, (size_t)t * C + c};
}

// out[b, t, :] = wte[tok] + wpe[t]
extern "C" __global__ void encoder_fwd(float* out, const int* tok, const float* wte,
                                       const float* wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n) {
        Embed e = embed_of(i, tok, T, C);
        out[i] = wte[e.wte] + wpe[e.wpe];
    }
}

// dwte[tok] += dout, dwpe[t] += dout (both zeroed before the backward pass;
// atomics: tokens repeat, so rows of dwte are shared).
extern "C" __global__ void encoder_bwd(float* dwte, float* dwpe, const float* dout, const int* tok,
                                       int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    GRID_STRIDE(i, n) {
        Embed e = embed_of(i, tok, T, C);
        float d = dout[i];
        atomicAdd(&dwte[e.wte], d);
        atomicAdd(&dwpe[e.wpe], d);
    }
}

// One warp per row: out = (x - mean) * rstd * w + b, eps 1e-5 (PyTorch's).
extern "C" __global__ void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp,
                                         const float* w, const float* b, int N, int C) {
    int row = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= N) return;
    const float* x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += WARP) s += x[i];
    float m = warp_sum(s) / C;
    float v = 0.0f;
    for (int i = lane; i < C; i += WARP) {
        float d = x[i] - m;
        v += d * d;
    }
    float r = rsqrtf(warp_sum(v) / C + 1e-5f);
    float* o = out + (size_t)row * C;
    for (int i = lane; i < C; i += WARP) o[i] = (x[i] - m) * r * w[i] + b[i];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// One warp per row, rows grid-strided over the block's warps; dw and db are
// summed in shared memory (2 * C floats) and added to global once per block.
// dinp is accumulated (+=): it is the residual stream's gradient.
extern "C" __global__ void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout,
                                         const float* inp, const float* w, const float* mean,
                                         const float* rstd, int N, int C) {
    extern __shared__ float sh[];
    float* sdw = sh;
    float* sdb = sh + C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) sh[i] = 0.0f;
    __syncthreads();
    int warps = blockDim.x / WARP, lane = threadIdx.x % WARP;
    for (int row = blockIdx.x * warps + threadIdx.x / WARP; row < N; row += gridDim.x * warps) {
        const float* x = inp + (size_t)row * C;
        const float* g = dout + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float a = 0.0f, bsum = 0.0f;
        for (int i = lane; i < C; i += WARP) {
            float xh = (x[i] - m) * r;
            float dn = g[i] * w[i];
            a += dn;
            bsum += dn * xh;
        }
        a = warp_sum(a) / C;
        bsum = warp_sum(bsum) / C;
        float* d = dinp + (size_t)row * C;
        for (int i = lane; i < C; i += WARP) {
            float xh = (x[i] - m) * r;
            float dn = g[i] * w[i];
            d[i] += (dn - a - xh * bsum) * r;
            atomicAdd(&sdb[i], g[i]);
            atomicAdd(&sdw[i], g[i] * xh);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(&dw[i], sdw[i]);
        atomicAdd(&db[i], sdb[i]);
    }
}

// out[r, c] += b[c]
extern "C" __global__ void add_bias(float* out, const float* b, int N, int OC) {
    size_t n = (size_t)N * OC;
    GRID_STRIDE(i, n)
        out[i] += b[i % OC];
}

// GPT-2's GELU ("gelu_new", the tanh form).
#define GELU_K 0.7978845608028654f  // sqrt(2 / pi)

// pre += b (in place, kept for the backward pass); out = gelu(pre).
extern "C" __global__ void bias_gelu(float* pre, float* out, const float* b, int N, int OC) {
    size_t n = (size_t)N * OC;
    GRID_STRIDE(i, n) {
        float x = pre[i] + b[i % OC];
        pre[i] = x;
        float u = GELU_K * (x + 0.044715f * x * x * x);
        out[i] = 0.5f * x * (1.0f + tanhf(u));
    }
}

// d *= gelu'(pre), in place.
extern "C" __global__ void gelu_bwd(float* d, const float* pre, unsigned long long n) {
    GRID_STRIDE(i, n) {
        float x = pre[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float du = GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        d[i] *= 0.5f * (1.0f + th) + 0.5f * x * sech2 * du;
    }
}

// out = res + y + b[c]: a projection's output (without bias) added to the
// residual stream.
extern "C" __global__ void residual_bias(float* out, const float* res, const float* y,
                                         const float* b, int N, int C) {
    size_t n = (size_t)N * C;
    GRID_STRIDE(i, n)
        out[i] = res[i] + y[i] + b[i % C];
}

// out[c] += sum over rows of x[r, c]; grid (ceil(C / 32), row chunks),
// block (32, 8). out is zeroed before.
extern "C" __global__ void col_sum(float* out, const float* x, int N, int C) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int per = (N + gridDim.y - 1) / gridDim.y;
    int r0 = blockIdx.y * per, r1 = r0 + per < N ? r0 + per : N;
    float s = 0.0f;
    if (c < C)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) s += x[(size_t)r * C + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += part[k][threadIdx.x];
        atomicAdd(&out[c], t);
    }
}

// Element i of a (B, NH, T, HS) tensor -> its offset in (B, T) rows of
// `stride` floats whose heads sit at nh * HS (the layout of qkv and y).
__device__ __forceinline__ size_t head_row(size_t i, int T, int NH, int HS, size_t stride) {
    size_t h = i % HS;
    size_t r = i / HS;
    size_t t = r % T;
    r /= T;
    size_t nh = r % NH;
    size_t b = r / NH;
    return (b * T + t) * stride + nh * HS + h;
}

// qkv (B, T, 3, NH, HS) -> q, k, v (B, NH, T, HS).
extern "C" __global__ void split_heads(float* q, float* k, float* v, const float* qkv, int B,
                                       int T, int NH, int HS) {
    size_t n = (size_t)B * NH * T * HS;
    int C = NH * HS;
    GRID_STRIDE(i, n) {
        size_t src = head_row(i, T, NH, HS, 3 * (size_t)C);
        q[i] = qkv[src];
        k[i] = qkv[src + C];
        v[i] = qkv[src + 2 * C];
    }
}

// The inverse: dq, dk, dv (B, NH, T, HS) -> dqkv (B, T, 3, NH, HS).
extern "C" __global__ void merge_heads3(float* dqkv, const float* dq, const float* dk,
                                        const float* dv, int B, int T, int NH, int HS) {
    size_t n = (size_t)B * NH * T * HS;
    int C = NH * HS;
    GRID_STRIDE(i, n) {
        size_t dst = head_row(i, T, NH, HS, 3 * (size_t)C);
        dqkv[dst] = dq[i];
        dqkv[dst + C] = dk[i];
        dqkv[dst + 2 * C] = dv[i];
    }
}

// y (B, NH, T, HS) -> out (B, T, NH, HS), or back with `back` != 0.
extern "C" __global__ void heads_to_rows(float* out, const float* y, int B, int T, int NH, int HS,
                                         int back) {
    size_t n = (size_t)B * NH * T * HS;
    GRID_STRIDE(i, n) {
        size_t row = head_row(i, T, NH, HS, (size_t)NH * HS);
        if (back)
            out[i] = y[row];
        else
            out[row] = y[i];
    }
}

// Causal softmax of scale * att, in place, one warp per row of (BNH * T)
// rows of T; row i of a head keeps columns 0..=i, the rest become 0.
extern "C" __global__ void softmax_causal(float* att, float scale, int BNH, int T) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)BNH * T) return;
    int i = row % T;
    float* a = att + row * T;
    float m = NEG_INF;
    for (int j = lane; j <= i; j += WARP) m = fmaxf(m, a[j] * scale);
    m = warp_max(m);
    float s = 0.0f;
    for (int j = lane; j <= i; j += WARP) s += expf(a[j] * scale - m);
    s = warp_sum(s);
    float inv = 1.0f / s;
    for (int j = lane; j < T; j += WARP) a[j] = j <= i ? expf(a[j] * scale - m) * inv : 0.0f;
}

// d (in: d att, out: d preatt) = scale * att * (d - sum(att * d)), causal.
extern "C" __global__ void softmax_causal_bwd(float* d, const float* att, float scale, int BNH,
                                              int T) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)BNH * T) return;
    int i = row % T;
    const float* a = att + row * T;
    float* g = d + row * T;
    float dot = 0.0f;
    for (int j = lane; j <= i; j += WARP) dot += a[j] * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP) g[j] = j <= i ? scale * a[j] * (g[j] - dot) : 0.0f;
}

// One block per row of logits (N rows of V): the row's loss
// (log-sum-exp minus the target's logit) into losses[row], and in place
// the gradient of the mean loss: (softmax - onehot) * dscale.
extern "C" __global__ void cross_entropy(float* logits, float* losses, const int* tok, int B,
                                         int T, int V, float dscale) {
    __shared__ float sh[32];
    int row = blockIdx.x;
    int b = row / T, t = row % T;
    int target = tok[(size_t)b * (T + 1) + t + 1];
    float* x = logits + (size_t)row * V;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, x[j]);
    m = block_max(m, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - m);
    s = block_sum(s, sh);
    float lse = m + logf(s);
    if (threadIdx.x == 0) losses[row] = lse - x[target];
    __syncthreads();
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = expf(x[j] - m) * inv;
        x[j] = (p - (j == target ? 1.0f : 0.0f)) * dscale;
    }
}

// out[0] = sum of x[0..n] / denom (one block): the mean loss with denom =
// n, or a rank's share of the global batch's mean (denom = the global
// batch's tokens).
extern "C" __global__ void mean_into(float* out, const float* x, int n, float denom) {
    __shared__ float sh[32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s / denom;
}

// acc[0] += sum of x[i]^2 (acc zeroed before).
extern "C" __global__ void sum_squares(float* acc, const float* x, unsigned long long n) {
    __shared__ float sh[32];
    float s = 0.0f;
    GRID_STRIDE(i, n)
        s += x[i] * x[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) atomicAdd(acc, s);
}

// norms[0] = sqrt(sumsq[0]): the step's gradient norm, kept for the report.
extern "C" __global__ void store_norm(float* norm, const float* sumsq) {
    if (threadIdx.x == 0 && blockIdx.x == 0) norm[0] = sqrtf(sumsq[0]);
}

// AdamW as torch.optim.AdamW computes it, after clipping the gradient as
// torch.nn.utils.clip_grad_norm_ does: g *= min(1, max_norm / (norm + 1e-6)).
extern "C" __global__ void adamw(float* p, float* m, float* v, const float* g, const float* sumsq,
                                 unsigned long long n, float lr, float b1, float b2, float eps,
                                 float wd, float bc1, float bc2_sqrt, float max_norm) {
    float clip = fminf(1.0f, max_norm / (sqrtf(sumsq[0]) + 1e-6f));
    float step = lr / bc1;
    GRID_STRIDE(i, n) {
        float gi = g[i] * clip;
        float mi = m[i] + (1.0f - b1) * (gi - m[i]);
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float pi = p[i] * (1.0f - lr * wd);
        p[i] = pi - step * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

// bf16 copies of GEMM operands, rounded to nearest even (as bits: NVRTC
// needs no header for it). Inputs are finite.
extern "C" __global__ void to_bf16(unsigned short* out, const float* x, unsigned long long n) {
    GRID_STRIDE(i, n) {
        unsigned int u = __float_as_uint(x[i]);
        u += 0x7fffu + ((u >> 16) & 1u);
        out[i] = (unsigned short)(u >> 16);
    }
}
