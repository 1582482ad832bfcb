/* Float32 linear layers for a CPU decode step: y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]).

   A decode step multiplies a few rows (one per sequence) by every weight once, so its
   speed is how fast the weights stream from memory. The weight is stored once more in
   a blocked layout, Wb[N/8][K/16][8][16] (N padded to 8 rows, K to 16 columns, with
   zeros): each block of 8 output rows is then one contiguous stream, which the
   hardware prefetcher follows at close to the machine's read bandwidth, where eight
   row-major rows read side by side (or PyTorch's matmuls) reach about 60% of it.

   Written with GCC vector extensions, not intrinsics: v16 is one AVX-512 register on
   a CPU that has it (-march=native), two AVX2 registers on one that has not, and the
   same source builds on other ISAs. Built and loaded by engine/kernels/cpu.py. */
#include <stddef.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));  /* aligned(4): unaligned loads */
#define VL 16  /* floats per vector */
#define RB 8   /* output rows per block */
/* Multi-row tiles read each block again from the cache for every pair of rows, and do
   enough arithmetic that the next block's lines must be asked for in advance (8 KiB
   ahead, into L2) or the memory sits idle while they compute. */
#define PREFETCH_FLOATS 2048

static inline float hsum(v16 v) {
    float s = 0.f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}

/* One block of RB output rows for TB input rows: RB x TB accumulators in registers. */
#define TILE(TB)                                                                              \
static void tile_##TB(const float *x, long ldx, const float *wb, long KC, long K, float *y,   \
                      long ldy, const float *bias, long n0, long nvalid, long t0) {           \
    v16 acc[RB][TB];                                                                          \
    _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                      \
        _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) acc[r][t] = (v16){0};            \
    for (long kc = 0; kc < KC; kc++) {                                                        \
        const float *wk = wb + kc * RB * VL;                                                  \
        if (TB > 1) {                                                                         \
            __builtin_prefetch(wk + PREFETCH_FLOATS, 0, 1);                                   \
            __builtin_prefetch(wk + PREFETCH_FLOATS + VL, 0, 1);                              \
        }                                                                                     \
        long k = kc * VL;                                                                     \
        v16 xv[TB];                                                                           \
        _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                                \
            if (k + VL <= K) {                                                                \
                xv[t] = *(const v16 *)(x + (t0 + t) * ldx + k);                               \
            } else { /* K's tail: the padding columns of the block are zeros */              \
                xv[t] = (v16){0};                                                             \
                for (long i = 0; i < K - k; i++) xv[t][i] = x[(t0 + t) * ldx + k + i];        \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                \
            v16 w = *(const v16 *)(wk + r * VL);                                              \
            _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) acc[r][t] += w * xv[t];      \
        }                                                                                     \
    }                                                                                         \
    for (int r = 0; r < nvalid; r++)                                                          \
        for (int t = 0; t < TB; t++) {                                                        \
            float s = hsum(acc[r][t]);                                                        \
            if (bias) s += bias[n0 + r];                                                      \
            y[(t0 + t) * ldy + n0 + r] = s;                                                   \
        }                                                                                     \
}
TILE(1)
TILE(2)

/* x: [T, K] with row stride ldx; Wb: the blocked weight; y: [T, N] with row stride ldy.
   Output-row blocks are split between `nthreads` OpenMP threads (PyTorch's own pool:
   the same libgomp), one thread for a matrix too small to be worth waking the other. */
void tt_linear_f32(const float *x, long T, long ldx, const float *Wb, long N, long K,
                   const float *bias, float *y, long ldy, int nthreads) {
    long KC = (K + VL - 1) / VL, nblocks = (N + RB - 1) / RB;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && N * K >= 32768)
    for (long b = 0; b < nblocks; b++) {
        const float *wb = Wb + b * KC * RB * VL;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long t = 0;
        for (; t + 2 <= T; t += 2) tile_2(x, ldx, wb, KC, K, y, ldy, bias, n0, nvalid, t);
        if (t < T) tile_1(x, ldx, wb, KC, K, y, ldy, bias, n0, nvalid, t);
    }
}
