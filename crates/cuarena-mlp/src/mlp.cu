// Kernels of the train_mlp example (gpu.rs): forward and backward of a small MLP
// (row-major f32 matrices), compiled at run time with NVRTC.
//
// Every pointer argument is an address inside the arena's region, resolved
// by the host right before the launch; the kernels keep none of them.
//
// Shapes: a batch of `rows` samples is a [rows x features] matrix; a
// layer's weight is [fan_in x fan_out], its bias [fan_out].

#define MM_BM 64      // rows of C per block
#define MM_BN 64      // columns of C per block
#define MM_BK 16      // depth of one shared-memory tile
#define MM_THREADS 256 // 16 x 16 threads, each 4 x 4 outputs

// Loads the [MM_BK x W] tile at (k0, l0) of an operand X with L rows and K
// columns into tile[k][l] (zeros outside X). X is stored [K x L] where
// KMAJOR (consecutive threads read along l), else [L x K] (along k).
template <int W, bool KMAJOR>
__device__ __forceinline__ void load_tile(float (*tile)[W + 1], const float* __restrict__ X, int L,
                                          int K, int l0, int k0, int tid) {
#pragma unroll
    for (int r = 0; r < (W * MM_BK) / MM_THREADS; ++r) {
        const int i = tid + r * MM_THREADS;
        int kl, ll;
        if (KMAJOR) { ll = i % W; kl = i / W; }
        else        { kl = i % MM_BK; ll = i / MM_BK; }
        const int l = l0 + ll, k = k0 + kl;
        float v = 0.0f;
        if (l < L && k < K) v = KMAJOR ? X[(size_t)k * L + l] : X[(size_t)l * K + k];
        tile[kl][ll] = v;
    }
}

// C[M x N] = op(A) * op(B), with op(A) [M x K] and op(B) [K x N].
// TA: A is stored [K x M] (C = A^T B); TB: B is stored [N x K] (C = A B^T).
// Tiles are loaded so that consecutive threads read consecutive addresses
// whichever way the operand is stored.
template <bool TA, bool TB>
__device__ __forceinline__ void gemm_tile(const float* __restrict__ A, const float* __restrict__ B,
                                          float* __restrict__ C, int M, int N, int K) {
    // +1: the non-transposed loads store along k, which would otherwise
    // hit one bank for a whole warp.
    __shared__ float As[MM_BK][MM_BM + 1];
    __shared__ float Bs[MM_BK][MM_BN + 1];
    const int tid = threadIdx.x;
    const int tx = tid % 16;
    const int ty = tid / 16;
    const int m0 = blockIdx.y * MM_BM;
    const int n0 = blockIdx.x * MM_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += MM_BK) {
        load_tile<MM_BM, TA>(As, A, M, K, m0, k0, tid);
        load_tile<MM_BN, !TB>(Bs, B, N, K, n0, k0, tid);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int m = m0 + ty + 16 * i;
        if (m >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n < N) C[(size_t)m * N + n] = acc[i][j];
        }
    }
}

// C = A * B: A [M x K], B [K x N].
extern "C" __global__ void __launch_bounds__(MM_THREADS)
mlp_matmul_nn(const float* A, const float* B, float* C, int M, int N, int K) {
    gemm_tile<false, false>(A, B, C, M, N, K);
}

// C = A^T * B: A [K x M], B [K x N] (weight gradients: X^T dZ).
extern "C" __global__ void __launch_bounds__(MM_THREADS)
mlp_matmul_tn(const float* A, const float* B, float* C, int M, int N, int K) {
    gemm_tile<true, false>(A, B, C, M, N, K);
}

// C = A * B^T: A [M x K], B [N x K] (input gradients: dZ W^T).
extern "C" __global__ void __launch_bounds__(MM_THREADS)
mlp_matmul_nt(const float* A, const float* B, float* C, int M, int N, int K) {
    gemm_tile<false, true>(A, B, C, M, N, K);
}

// z[r, c] += b[c] for a [rows x cols] matrix.
extern "C" __global__ void mlp_bias_add(float* __restrict__ z, const float* __restrict__ b, int rows,
                                        int cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        z[i] += b[i % cols];
}

// h = max(z, 0).
extern "C" __global__ void mlp_relu_fwd(const float* __restrict__ z, float* __restrict__ h, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        h[i] = fmaxf(z[i], 0.0f);
}

// dz = dh where z > 0, else 0.
extern "C" __global__ void mlp_relu_bwd(const float* __restrict__ dh, const float* __restrict__ z,
                                        float* __restrict__ dz, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dz[i] = z[i] > 0.0f ? dh[i] : 0.0f;
}

// out[c] = sum over r of x[r, c] (bias gradients). Block (32, 8): x picks
// the column, y strides the rows; a shared-memory tree sums the 8 lanes.
extern "C" __global__ void mlp_col_sum(const float* __restrict__ x, float* __restrict__ out, int rows,
                                       int cols) {
    __shared__ float part[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < cols)
        for (int r = threadIdx.y; r < rows; r += 8) s += x[(size_t)r * cols + c];
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
#pragma unroll
        for (int y = 0; y < 8; ++y) t += part[y][threadIdx.x];
        out[c] = t;
    }
}

// Softmax cross-entropy, one thread per row (cols is small: the classes).
// stats[r] = -log softmax(logits[r])[label], stats[rows + r] = 1 if the
// argmax is the label, else 0. dlogits (may be null: no gradient) =
// (softmax - onehot) / rows, the gradient of the mean loss.
extern "C" __global__ void mlp_softmax_xent(const float* __restrict__ logits, const int* __restrict__ labels,
                                            float* __restrict__ dlogits, float* __restrict__ stats, int rows,
                                            int cols) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* z = logits + (size_t)r * cols;
    const int y = labels[r];
    float mx = z[0];
    int arg = 0;
    for (int c = 1; c < cols; ++c)
        if (z[c] > mx) { mx = z[c]; arg = c; }
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) sum += expf(z[c] - mx);
    const float lse = mx + logf(sum);
    stats[r] = lse - z[y];
    stats[rows + r] = arg == y ? 1.0f : 0.0f;
    if (dlogits) {
        const float inv = 1.0f / (float)rows;
        float* d = dlogits + (size_t)r * cols;
        for (int c = 0; c < cols; ++c) d[c] = (expf(z[c] - lse) - (c == y ? 1.0f : 0.0f)) * inv;
    }
}

// labels[r] = argmax over c of logits[r, c] (the teacher's classes; ties
// go to the lowest class).
extern "C" __global__ void mlp_argmax(const float* __restrict__ logits, int* __restrict__ labels, int rows,
                                      int cols) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* z = logits + (size_t)r * cols;
    float mx = z[0];
    int arg = 0;
    for (int c = 1; c < cols; ++c)
        if (z[c] > mx) { mx = z[c]; arg = c; }
    labels[r] = arg;
}

// The loss reduction, one block of 256 threads:
// out[0] += mean(stats[0..n]) (loss), out[1] += mean(stats[n..2n]) (accuracy).
// Accumulating lets the host read the mean over many steps with one copy.
extern "C" __global__ void __launch_bounds__(256)
mlp_mean2_acc(const float* __restrict__ stats, float* __restrict__ out, int n) {
    __shared__ float s0[256];
    __shared__ float s1[256];
    float a = 0.0f, b = 0.0f;
    for (int i = threadIdx.x; i < n; i += 256) {
        a += stats[i];
        b += stats[n + i];
    }
    s0[threadIdx.x] = a;
    s1[threadIdx.x] = b;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            s0[threadIdx.x] += s0[threadIdx.x + w];
            s1[threadIdx.x] += s1[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[0] += s0[0] / (float)n;
        out[1] += s1[0] / (float)n;
    }
}

// SGD with momentum: v = mu * v + g; w -= lr * v.
extern "C" __global__ void mlp_sgd_momentum(float* __restrict__ w, const float* __restrict__ g,
                                            float* __restrict__ v, int n, float lr, float mu) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float vi = mu * v[i] + g[i];
        v[i] = vi;
        w[i] -= lr * vi;
    }
}

// x[i] *= s (data-parallel training: per-rank gradient sums, then the
// all-reduced sum divided by the global batch size).
extern "C" __global__ void mlp_scale(float* __restrict__ x, int n, float s) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] *= s;
}
