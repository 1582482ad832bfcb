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

#include "cpu_vec.h"
#define RB 8   /* output rows per block */
#define LINES_PER_STEP (RB * VL * 4 / 64)  /* 64-byte cache lines of one block per 16 columns */

/* The lane sums of 8 vectors at once, [sum(a), sum(b), ..., sum(h)]: a transposing tree of
   halves, 24 operations where 8 separate sums take ~60. Each block and row of x ends in
   these sums, so they count where x has many rows: SmolLM2's LM head at 16-31 rows (the
   logit lens) 5-10% faster than with one sum at a time. */
static inline v16 fold(v16 a, v16 b, int half) {  /* lanes of a and b, folded in pairs `half` apart */
    if (half == 8) return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
                        + __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    if (half == 4) return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
                        + __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    return __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
         + __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
static inline v8 sum8(v16 a, v16 b, v16 c, v16 d, v16 e, v16 f, v16 g, v16 h) {
    v16 abcd = fold(fold(a, b, 8), fold(c, d, 8), 4), efgh = fold(fold(e, f, 8), fold(g, h, 8), 4);
    v16 pairs = fold(abcd, efgh, 2);  /* lanes 2r, 2r + 1: two partial sums of vector r */
    return __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6, 8, 10, 12, 14)
         + __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7, 9, 11, 13, 15);
}

/* One block of RB output rows for TB input rows: RB x TB accumulators in registers.
   next, pf_first, pf_lines: while it computes, ask for lines [pf_first, pf_first +
   pf_lines) of every 16-column step of the next block (into L2): see tt_linear_f32. */
#define TILE(TB)                                                                              \
static void tile_##TB(const float *x, long ldx, const float *wb, long KC, long K, float *y,   \
                      long ldy, const float *bias, long n0, long nvalid, long t0,             \
                      const float *next, int pf_first, int pf_lines) {                        \
    v16 acc[RB][TB];                                                                          \
    _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                      \
        _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) acc[r][t] = (v16){0};            \
    for (long kc = 0; kc < KC; kc++) {                                                        \
        const float *wk = wb + kc * RB * VL;                                                  \
        if (next) {                                                                           \
            const char *nk = (const char *)(next + kc * RB * VL) + pf_first * 64;             \
            for (int l = 0; l < pf_lines; l++) __builtin_prefetch(nk + l * 64, 0, 1);          \
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
    _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                                    \
        v8 s = sum8(acc[0][t], acc[1][t], acc[2][t], acc[3][t],                               \
                    acc[4][t], acc[5][t], acc[6][t], acc[7][t]);                              \
        for (int r = 0; r < nvalid; r++)                                                      \
            y[(t0 + t) * ldy + n0 + r] = bias ? s[r] + bias[n0 + r] : s[r];                   \
    }                                                                                         \
}
TILE(1)
TILE(2)

/* x: [T, K] with row stride ldx; Wb: the blocked weight; y: [T, N] with row stride ldy.
   Output-row blocks are split between `nthreads` OpenMP threads (PyTorch's own pool:
   the same libgomp), one thread for a matrix too small to be worth waking the other.

   Each block is read once from memory and then from the cache by one pass per pair of
   x's rows. Past one pass the arithmetic is long enough that memory would sit idle
   while it runs, so each pass also asks for its share of the next block's lines: the
   next block arrives spread over this block's passes (at 8 rows of x: 1.5x faster on
   one thread than without). */
void tt_linear_f32_shared(const float *x, long T, long ldx, const float *Wb, long N, long K,
                          const float *bias, float *y, long ldy);
void tt_rows_f32_shared(const float *x, long T, long ldx, const float *Wb, long N, long K, const float *bias,
                        float *y, long ldy);
extern int tt_rows_from[5];  /* cpu_rows.c */
#define TT_ROWS_MAX 32  /* cpu.py's MAX_ROWS: a prefill chunk keeps the 8-row tiles */

void tt_linear_f32(const float *x, long T, long ldx, const float *Wb, long N, long K,
                   const float *bias, float *y, long ldy, int nthreads) {
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1 && N * K >= 32768)
    tt_linear_f32_shared(x, T, ldx, Wb, N, K, bias, y, ldy);
}

/* tt_linear_f32's blocks shared by the threads of the enclosing parallel region (an orphaned
   `omp for`, which one thread runs whole outside a region): cpu_team.c runs a pass's every
   layer in one region, with no fork and join a matrix. */
void tt_linear_f32_shared(const float *x, long T, long ldx, const float *Wb, long N, long K,
                          const float *bias, float *y, long ldy) {
    if (T >= tt_rows_from[0] && T <= TT_ROWS_MAX) {  /* a decode batch: cpu_rows.c's tiles, each block read once */
        tt_rows_f32_shared(x, T, ldx, Wb, N, K, bias, y, ldy);
        return;
    }
    long KC = (K + VL - 1) / VL, nblocks = (N + RB - 1) / RB;
    #pragma omp for schedule(static)
    for (long b = 0; b < nblocks; b++) {
        const float *wb = Wb + b * KC * RB * VL;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long passes = (T + 1) / 2;
        const float *next = passes > 1 && b + 1 < nblocks ? wb + KC * RB * VL : 0;
        int share = (int)((LINES_PER_STEP + passes - 1) / passes);
        for (long t = 0, p = 0; t < T; t += 2, p++) {
            int first = (int)(p * share), lines = first >= LINES_PER_STEP ? 0
                : (first + share > LINES_PER_STEP ? LINES_PER_STEP - first : share);
            const float *pf = lines ? next : 0;
            if (t + 2 <= T) tile_2(x, ldx, wb, KC, K, y, ldy, bias, n0, nvalid, t, pf, first, lines);
            else tile_1(x, ldx, wb, KC, K, y, ldy, bias, n0, nvalid, t, pf, first, lines);
        }
    }
}

/* The vector width this build's kernels run at: 512 where AVX-512 builds, else 256 (AVX2) or
   less. Past a decode batch the Python side picks the C kernel or PyTorch's GEMM by it. */
int tt_vector_bits(void) {
#if defined(__AVX512F__)
    return 512;
#elif defined(__AVX2__)
    return 256;
#else
    return 128;
#endif
}

/* W [N, K] row-major -> Wb (see the top of this file), zero padding included: at load, so
   a model's weights are copied at memory speed rather than by a strided tensor copy. */
void tt_block_f32(const float *W, long N, long K, float *Wb, int nthreads) {
    long KC = (K + VL - 1) / VL, nblocks = (N + RB - 1) / RB;
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long b = 0; b < nblocks; b++)
        for (long kc = 0; kc < KC; kc++)
            for (long r = 0; r < RB; r++) {
                float *dst = Wb + ((b * KC + kc) * RB + r) * VL;
                long n = b * RB + r, k = kc * VL, len = n < N ? (K - k < VL ? K - k : VL) : 0;
                for (long i = 0; i < len; i++) dst[i] = W[n * K + k + i];
                for (long i = len; i < VL; i++) dst[i] = 0.f;
            }
}
