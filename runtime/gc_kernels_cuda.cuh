// gc_kernels_cuda.cuh — generic CUDA kernels the generated launchers instantiate with static shapes:
// tiled GEMM (all transpose cases), softmax / log-softmax along one axis, softmax cross-entropy, the
// batch gather (uint8 -> float on the device) and the accuracy count. Reductions use a fixed-shape tree
// in shared memory and no atomics on floats, so every run is bit-for-bit reproducible.

#define GC_BLOCK 256

// Sum (or max) of one value per thread over a block of GC_BLOCK threads, in a fixed order.
template <typename T, bool MAX>
__device__ T gc_block_reduce(T v, T* shared) {
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = GC_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            T o = shared[threadIdx.x + s];
            T mine = shared[threadIdx.x];   // a max keeps a NaN, as numpy's does
            shared[threadIdx.x] = MAX ? (o > mine || o != o ? o : mine) : mine + o;
        }
        __syncthreads();
    }
    T r = shared[0];
    __syncthreads();
    return r;
}

// C (M, N) = op(A) @ op(B); op(A) is (M, K): A is (M, K), or (K, M) when TA. op(B) is (K, N): B is (K, N),
// or (N, K) when TB. 64x64 tiles of C per block of 256 threads, 4x4 outputs per thread, K in steps of 16.
template <typename T, bool TA, bool TB>
__global__ void __launch_bounds__(256) gc_gemm_kernel(const T* __restrict__ A, const T* __restrict__ B,
                                                      T* __restrict__ C, int M, int N, int K) {
    __shared__ T As[16][64 + 1];
    __shared__ T Bs[16][64 + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    T acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            // A tile: rows m0..m0+63, cols k0..k0+15; consecutive threads walk the contiguous dimension.
            int mm, kk;
            if (TA) { mm = e % 64; kk = e / 64; } else { kk = e % 16; mm = e / 16; }
            int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? (TA ? A[(size_t)k * M + m] : A[(size_t)m * K + k]) : T(0);
            int nn, kb;
            if (TB) { kb = e % 16; nn = e / 16; } else { nn = e % 64; kb = e / 64; }
            int n = n0 + nn, kB = k0 + kb;
            Bs[kb][nn] = (n < N && kB < K) ? (TB ? B[(size_t)n * K + kB] : B[(size_t)kB * N + n]) : T(0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            T a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) { a[i] = As[kk][ty + 16 * i]; b[i] = Bs[kk][tx + 16 * i]; }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m < M && n < N) C[(size_t)m * N + n] = acc[i][j];
        }
}

template <typename T, bool TA, bool TB>
static int gc_gemm(const T* A, const T* B, T* C, int M, int N, int K) {
    dim3 grid((N + 63) / 64, (M + 63) / 64);
    gc_gemm_kernel<T, TA, TB><<<grid, 256>>>(A, B, C, M, N, K);
    GC_LAUNCH_CHECK();
    return GC_OK;
}

// softmax (or log-softmax) of x viewed as (outer, length, inner) along the middle axis; one block per row.
template <typename T, bool LOG>
__global__ void gc_softmax_kernel(const T* __restrict__ x, T* __restrict__ y, int length, int inner) {
    __shared__ T shared[GC_BLOCK];
    const size_t row = blockIdx.x, o = row / inner, in = row % inner;
    const T* xr = x + o * (size_t)length * inner + in;
    T* yr = y + o * (size_t)length * inner + in;
    T mx = -INFINITY;
    for (int j = threadIdx.x; j < length; j += GC_BLOCK) mx = fmax(mx, xr[(size_t)j * inner]);
    mx = gc_block_reduce<T, true>(mx, shared);
    T sum = 0;
    for (int j = threadIdx.x; j < length; j += GC_BLOCK) sum += exp(xr[(size_t)j * inner] - mx);
    sum = gc_block_reduce<T, false>(sum, shared);
    const T lse = log(sum);
    for (int j = threadIdx.x; j < length; j += GC_BLOCK) {
        T s = xr[(size_t)j * inner] - mx;
        yr[(size_t)j * inner] = LOG ? s - lse : exp(s) / sum;
    }
}

template <typename T, bool LOG>
static int gc_softmax(const T* x, T* y, int outer, int length, int inner) {
    gc_softmax_kernel<T, LOG><<<outer * inner, GC_BLOCK>>>(x, y, length, inner);
    GC_LAUNCH_CHECK();
    return GC_OK;
}

// loss = mean over rows of logsumexp(logits[b]) - logits[b, label[b]]; one block, fixed-order sum.
// A label outside [0, classes) makes the loss NaN (the trainer validates labels when it loads them).
template <typename T, typename L>
__global__ void gc_softmax_xent_kernel(const T* __restrict__ logits, const L* __restrict__ labels, T* out,
                                       int batch, int classes) {
    __shared__ T shared[GC_BLOCK];
    T total = 0;
    for (int b = threadIdx.x; b < batch; b += GC_BLOCK) {
        const T* row = logits + (size_t)b * classes;
        T mx = -INFINITY;
        for (int c = 0; c < classes; c++) mx = fmax(mx, row[c]);
        T sum = 0;
        for (int c = 0; c < classes; c++) sum += exp(row[c] - mx);
        int label = (int)labels[b];
        total += (label >= 0 && label < classes) ? log(sum) + mx - row[label] : T(NAN);
    }
    total = gc_block_reduce<T, false>(total, shared);
    if (threadIdx.x == 0) *out = total / batch;
}

template <typename T, typename L>
static int gc_softmax_xent(const T* logits, const L* labels, T* out, int batch, int classes) {
    gc_softmax_xent_kernel<T, L><<<1, GC_BLOCK>>>(logits, labels, out, batch, classes);
    GC_LAUNCH_CHECK();
    return GC_OK;
}

// ---- the trainer's kernels -------------------------------------------------------------------------
// x[b, :] = images[index[first + b], :] * scale (uint8 images) or a copy (float images); y[b] likewise.
// Rows past `count` (the last partial batch) repeat the last valid example and are ignored by the caller.
template <typename IMG>
__global__ void gc_gather_kernel(const IMG* __restrict__ images, const int32_t* __restrict__ labels,
                                 const int32_t* __restrict__ index, int64_t first, int count, int64_t row,
                                 float scale, float* __restrict__ x, int32_t* __restrict__ y, int batch) {
    const int64_t total = (int64_t)batch * row;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
        int b = (int)(e / row);
        int src = index[first + (b < count ? b : count - 1)];
        float v = (float)images[(int64_t)src * row + e % row];
        x[e] = sizeof(IMG) == 1 ? v * scale : v;
        if (e % row == 0) y[b] = labels[src];
    }
}

template <typename IMG>
static int gc_gather(const IMG* images, const int32_t* labels, const int32_t* index, int64_t first, int count,
                     int64_t row, float scale, float* x, int32_t* y, int batch) {
    int64_t total = (int64_t)batch * row;
    int blocks = (int)((total + 255) / 256 < 2048 ? (total + 255) / 256 : 2048);
    gc_gather_kernel<IMG><<<blocks, 256>>>(images, labels, index, first, count, row, scale, x, y, batch);
    GC_LAUNCH_CHECK();
    return GC_OK;
}

// correct += number of rows b < count whose argmax(logits[b]) equals y[b] (first maximum wins, as numpy).
__global__ void gc_count_correct_kernel(const float* __restrict__ logits, const int32_t* __restrict__ y,
                                        int count, int classes, int64_t* correct) {
    __shared__ int64_t shared[GC_BLOCK];
    int64_t hits = 0;
    for (int b = threadIdx.x; b < count; b += GC_BLOCK) {
        const float* row = logits + (size_t)b * classes;
        int best = 0;
        for (int c = 1; c < classes; c++) if (row[c] > row[best]) best = c;
        hits += best == y[b];
    }
    hits = gc_block_reduce<int64_t, false>(hits, shared);
    if (threadIdx.x == 0) *correct += hits;
}

static int gc_count_correct(const float* logits, const int32_t* y, int count, int classes, int64_t* correct) {
    gc_count_correct_kernel<<<1, GC_BLOCK>>>(logits, y, count, classes, correct);
    GC_LAUNCH_CHECK();
    return GC_OK;
}

// sums[0] += *loss when it is finite (a step the guard skipped adds nothing); sums[1] = *loss: the epoch's
// running total and its last value, kept on the device.
__global__ void gc_track_loss_kernel(const float* loss, double* sums) {
    if (isfinite(*loss)) sums[0] += *loss;
    sums[1] = *loss;
}

static int gc_track_loss(const float* loss, double* sums) {
    gc_track_loss_kernel<<<1, 1>>>(loss, sums);
    GC_LAUNCH_CHECK();
    return GC_OK;
}
