// gc_kernels_conv.h — the window ops of convolutional networks and the dropout generator, for both targets.
// Each function computes ONE output element by a gather, so the generated `map` kernels call it in their
// loop (a grid-stride loop on cuda, an OpenMP loop on the cpu): no atomics, a fixed summation order (window
// offsets kh, kw in row-major order, as the numpy reference sums), the same code on both targets.
// The index type I is the loop's: `int` when every tensor of the op has fewer than 2^30 elements (lower.py),
// which makes the divisions of the index arithmetic 32-bit (64-bit ones are several times slower on a GPU).
//   gc_im2col_at         patches (N, C*KH*KW, OH*OW) of images (N, C, H, W); zero padding
//   gc_col2im_at         its adjoint: a pixel is the sum of the patch entries that copied it
//   gc_pool_at           max (padding is -inf) or average (padding counts as 0) over a window
//   gc_pool_grad_at      the pools' gradient at one input pixel; max: the window's first maximum takes it
//   gc_pool_select_at    the max pool's second derivative: a window's value of h at x's first maximum
//   gc_philox4x32_10     counter-based random words (Salmon et al. 2011); gc_dropout_mask_at, dropout's mask
#if GC_KERNELS   // the kernels part (gc_runtime.h)

// Shape of one window op: images (n, c, h, w), kernel (kh, kw), output windows (oh, ow), stride, padding.
struct gc_window { int n, c, h, w, kh, kw, oh, ow, stride, pad; };

template <typename T, typename I>
GC_HD inline T gc_im2col_at(const T* __restrict__ x, gc_window s, I i) {
    const I windows = (I)s.oh * s.ow, rows = (I)s.c * s.kh * s.kw;
    const int q = (int)(i % windows), r = (int)(i / windows % rows);
    const I n = i / windows / rows;
    const int c = r / (s.kh * s.kw), kh = r / s.kw % s.kh, kw = r % s.kw;
    const int h = q / s.ow * s.stride - s.pad + kh, w = q % s.ow * s.stride - s.pad + kw;
    return (h >= 0 && h < s.h && w >= 0 && w < s.w) ? x[((n * s.c + c) * s.h + h) * s.w + w] : T(0);
}

// The output window (oh, ow) whose offset (kh, kw) lands on pixel (h, w), if there is one.
GC_HD inline bool gc_window_of(gc_window s, int h, int w, int kh, int kw, int* oh, int* ow) {
    const int y = h + s.pad - kh, z = w + s.pad - kw;
    if (y < 0 || z < 0 || y % s.stride || z % s.stride) return false;
    *oh = y / s.stride;
    *ow = z / s.stride;
    return *oh < s.oh && *ow < s.ow;
}

template <typename T, typename I>
GC_HD inline T gc_col2im_at(const T* __restrict__ cols, gc_window s, I i) {
    const int w = (int)(i % s.w), h = (int)(i / s.w % s.h);
    const I image = i / s.w / s.h;  // n * C + c: the rows of channel c are contiguous in the patches
    const I windows = (I)s.oh * s.ow;
    const T* rows = cols + image * s.kh * s.kw * windows;
    T acc = 0;
    for (int kh = 0; kh < s.kh; kh++)
        for (int kw = 0; kw < s.kw; kw++) {
            int oh, ow;
            if (gc_window_of(s, h, w, kh, kw, &oh, &ow)) acc += rows[(kh * s.kw + kw) * windows + oh * s.ow + ow];
        }
    return acc;
}

// Index kh * KW + kw of the first maximum of window (oh, ow) of one image (plane of h * w values).
template <typename T>
GC_HD inline int gc_window_argmax(const T* __restrict__ plane, gc_window s, int oh, int ow) {
    int best = -1;
    T best_value = -INFINITY;
    for (int kh = 0; kh < s.kh; kh++)
        for (int kw = 0; kw < s.kw; kw++) {
            const int h = oh * s.stride - s.pad + kh, w = ow * s.stride - s.pad + kw;
            if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
            const T v = plane[h * s.w + w];
            // the first maximum, a NaN above all (numpy's argmax); padding never (it is not in the image)
            if (best < 0 || (best_value == best_value && (v > best_value || v != v))) {
                best = kh * s.kw + kw;
                best_value = v;
            }
        }
    return best;
}

template <typename T, bool MAX, typename I>
GC_HD inline T gc_pool_at(const T* __restrict__ x, gc_window s, I i) {
    const int ow = (int)(i % s.ow), oh = (int)(i / s.ow % s.oh);
    const T* plane = x + i / s.ow / s.oh * s.h * s.w;
    T acc = MAX ? T(-INFINITY) : T(0);
    for (int kh = 0; kh < s.kh; kh++)
        for (int kw = 0; kw < s.kw; kw++) {
            const int h = oh * s.stride - s.pad + kh, w = ow * s.stride - s.pad + kw;
            if (h < 0 || h >= s.h || w < 0 || w >= s.w) continue;
            const T v = plane[h * s.w + w];
            acc = MAX ? (v > acc || v != v ? v : acc) : acc + v;   // a max keeps a NaN, as numpy's does
        }
    return MAX ? acc : acc / T(s.kh * s.kw);
}

// d(pool)/d(pixel i) given g (N, C, OH, OW); x is the pooled input (read by max only).
template <typename T, bool MAX, typename I>
GC_HD inline T gc_pool_grad_at(const T* __restrict__ x, const T* __restrict__ g, gc_window s, I i) {
    const int w = (int)(i % s.w), h = (int)(i / s.w % s.h);
    const I image = i / s.w / s.h;
    const T* grad = g + image * s.oh * s.ow;
    T acc = 0;
    for (int kh = 0; kh < s.kh; kh++)
        for (int kw = 0; kw < s.kw; kw++) {
            int oh, ow;
            if (!gc_window_of(s, h, w, kh, kw, &oh, &ow)) continue;
            if (!MAX || gc_window_argmax(x + image * s.h * s.w, s, oh, ow) == kh * s.kw + kw)
                acc += grad[oh * s.ow + ow];
        }
    return MAX ? acc : acc / T(s.kh * s.kw);
}

// Window i (N, C, OH, OW) of h (N, C, H, W): h's pixel where x has the window's first maximum (the gradient
// of gc_pool_grad_at's max in g: second derivatives through max pooling).
template <typename T, typename I>
GC_HD inline T gc_pool_select_at(const T* __restrict__ x, const T* __restrict__ h, gc_window s, I i) {
    const int ow = (int)(i % s.ow), oh = (int)(i / s.ow % s.oh);
    const I plane = i / s.ow / s.oh * s.h * s.w;
    const int best = gc_window_argmax(x + plane, s, oh, ow);   // a pixel of the image (the window has one)
    return h[plane + (oh * s.stride - s.pad + best / s.kw) * s.w + ow * s.stride - s.pad + best % s.kw];
}

// Philox4x32-10: the counter c[4] becomes four random words under key (k0, k1).
GC_HD inline void gc_philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
        const uint32_t c0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, c2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = c0; c[1] = (uint32_t)p1; c[2] = c2; c[3] = (uint32_t)p0;
    }
}

// Element i of the dropout mask of step `step`: keep (value `keep`) when the top 24 bits of the first word of
// philox((i, step), seed) reach `threshold` = round(rate * 2^24), else 0 (gcompile/ops/random.py).
template <typename T>
GC_HD inline T gc_dropout_mask_at(int64_t i, int32_t step, uint64_t seed, uint32_t threshold, T keep) {
    uint32_t c[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), (uint32_t)step, 0u};
    gc_philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return (c[0] >> 8) >= threshold ? keep : T(0);
}
#endif   // GC_KERNELS
