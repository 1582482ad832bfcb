/* Linear layers with 16-bit weights (bfloat16 or float16) and float32 sums:
   y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]), W read as stored.

   A decode step is bound by how fast the weights stream from memory, so half the bytes is
   up to twice the speed. The layout is cpu_linear.c's with 32 columns to a block row, so
   that one row of a block is one 64-byte cache line: Wb[N/8][K/32][8][32] (uint16 bits,
   zero padded). Which path runs is chosen at build time by what the compiler is told the
   CPU has (-march, see cpu.py):

   - bfloat16 multiplies bfloat16 by bfloat16, as a bfloat16 matmul does everywhere (oneDNN,
     vLLM's CPU build): x is rounded once per call to bfloat16 (nearest even), each product
     of two bfloat16 is exact in float32, and the sums are float32. Where the CPU has AVX-512
     BF16 (__AVX512BF16__) that is VDPBF16PS, 32 products a instruction summed in pairs into
     float32; elsewhere the rounded x and the weights (a bfloat16 is a float32's upper half:
     widened by a shift) meet in float32 multiply-adds: the same products. Rounding x costs
     nothing measurable in agreement (SmolLM2: top-1 = float32's at 98.6% of a fixed text's
     positions either way, KL 0.24 against 0.08 millinats with x kept to 16 mantissa bits as
     two bfloat16 parts) and halves the arithmetic at 8 rows, where that, not the bytes,
     bounds a step on this machine.
   - float16 keeps x in float32: it is widened by F16C's VCVTPH2PS where the CPU has it,
     else by the bit arithmetic in f16_to_f32; then float32 multiply-adds as in cpu_linear.c
     (no CPU here has a float16 dot product).
   Built and loaded by engine/kernels/cpu.py with the other float kernels. */
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu_vec.h"
#define RB 8    /* output rows per block */
#define CB 32   /* columns per block row: 64 bytes */
#define LINES_PER_STEP (RB * CB * 2 / 64)  /* cache lines of one block per 32 columns */

typedef unsigned short u16;
typedef u16 v16h __attribute__((vector_size(32), aligned(2)));
typedef unsigned int v16u __attribute__((vector_size(64)));

static inline v16 bf16_to_f32(v16h h) { return (v16)(__builtin_convertvector(h, v16u) << 16); }

#if defined(__F16C__) || defined(__AVX512F__)
typedef u16 v8h __attribute__((vector_size(16)));
static inline v16 f16_to_f32(v16h h) {  /* VCVTPH2PS: one AVX-512 instruction, or two of F16C's */
#ifdef __AVX512F__
    return (v16)_mm512_cvtph_ps((__m256i)h);
#else
    v8 a = (v8)_mm256_cvtph_ps((__m128i)__builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7));
    v8 b = (v8)_mm256_cvtph_ps((__m128i)__builtin_shufflevector(h, h, 8, 9, 10, 11, 12, 13, 14, 15));
    return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
}
#else
/* float16 bits -> float32 without F16C: the exponent and mantissa moved into float32's
   places and scaled by 2^(127 - 15), which also gets subnormals right (they arrive as
   float32 subnormals and the product normalises them); infinities and NaNs (exponent 31)
   get float32's all-ones exponent. */
static inline v16 f16_to_f32(v16h h) {
    v16u u = __builtin_convertvector(h, v16u);
    v16u sign = (u & 0x8000u) << 16, em = (u & 0x7fffu) << 13;
    v16u scaled = (v16u)((v16)em * 0x1p112f);
    v16u special = (v16u)((u & 0x7c00u) == 0x7c00u);  /* all ones where exponent 31 */
    return (v16)(sign | (scaled & ~special) | ((em | 0x7f800000u) & special));
}
#endif

/* cpu_linear.c's sum8: the lane sums of 8 vectors, [sum(a), ..., sum(h)] */
static inline v16 fold(v16 a, v16 b, int half) {
    if (half == 8) return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
                        + __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    if (half == 4) return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
                        + __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    return __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
         + __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
static inline v8 sum8(v16 a, v16 b, v16 c, v16 d, v16 e, v16 f, v16 g, v16 h) {
    v16 abcd = fold(fold(a, b, 8), fold(c, d, 8), 4), efgh = fold(fold(e, f, 8), fold(g, h, 8), 4);
    v16 pairs = fold(abcd, efgh, 2);
    return __builtin_shufflevector(pairs, pairs, 0, 2, 4, 6, 8, 10, 12, 14)
         + __builtin_shufflevector(pairs, pairs, 1, 3, 5, 7, 9, 11, 13, 15);
}

static inline void store(const v16 acc[RB], float *y, long n0, long nvalid, const float *bias) {
    v8 s = sum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
    for (int r = 0; r < nvalid; r++) y[n0 + r] = bias ? s[r] + bias[n0 + r] : s[r];
}

/* x's rows padded with zeros to whole blocks of 32 columns (so no tile reads a tail),
   [T][KC * 32] float32: NULL when out of memory. */
static void pad_rows(const float *x, long T, long ldx, long K, long KC, float *xp) {
    for (long t = 0; t < T; t++)
        for (long k = 0; k < KC * CB; k++) xp[t * KC * CB + k] = k < K ? x[t * ldx + k] : 0.f;
}
static float *padded_rows(const float *x, long T, long ldx, long K, long KC) {
    float *xp = malloc(sizeof(float) * T * KC * CB);
    if (xp) pad_rows(x, T, ldx, K, KC, xp);
    return xp;
}

/* One block of RB output rows for TB rows of x (padded, row stride ldx), widening each
   weight vector with CONVERT; prefetching as tt_linear_f32 does. */
#define TILE(NAME, CONVERT, TB)                                                               \
static void NAME##_##TB(const float *x, long ldx, const u16 *wb, long KC, float *y, long ldy, \
                        const float *bias, long n0, long nvalid, long t0,                     \
                        const u16 *next, int pf_first, int pf_lines) {                        \
    v16 acc[TB][RB];                                                                          \
    _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++)                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[t][r] = (v16){0};            \
    for (long kc = 0; kc < KC; kc++) {                                                        \
        const u16 *wk = wb + kc * RB * CB;                                                    \
        if (next) {                                                                           \
            const char *nk = (const char *)(next + kc * RB * CB) + pf_first * 64;             \
            for (int l = 0; l < pf_lines; l++) __builtin_prefetch(nk + l * 64, 0, 1);          \
        }                                                                                     \
        v16 lo[TB], hi[TB];                                                                   \
        _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                                \
            lo[t] = *(const v16 *)(x + (t0 + t) * ldx + kc * CB);                             \
            hi[t] = *(const v16 *)(x + (t0 + t) * ldx + kc * CB + VL);                        \
        }                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                \
            v16 wl = CONVERT(*(const v16h *)(wk + r * CB));                                   \
            v16 wh = CONVERT(*(const v16h *)(wk + r * CB + VL));                              \
            _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++)                              \
                acc[t][r] += wl * lo[t] + wh * hi[t];                                         \
        }                                                                                     \
    }                                                                                         \
    _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++)                                      \
        store(acc[t], y + (t0 + t) * ldy, n0, nvalid, bias);                                  \
}
#ifndef __AVX512BF16__
/* x's values rounded to the nearest bfloat16 (ties to even), in place: what VCVTNE2PS2BF16
   gives, so both builds multiply the same numbers (a NaN stays a NaN). */
static void round_bf16(float *x, long n) {
    unsigned *u = (unsigned *)x;
    for (long i = 0; i < n; i++)
        if ((u[i] & 0x7fffffffu) <= 0x7f800000u)
            u[i] = (u[i] + 0x7fffu + ((u[i] >> 16) & 1u)) & 0xffff0000u;
}

TILE(tile_bf16, bf16_to_f32, 1)
TILE(tile_bf16, bf16_to_f32, 2)
#endif
TILE(tile_f16, f16_to_f32, 1)
TILE(tile_f16, f16_to_f32, 2)

extern int tt_rows_from[5];  /* cpu_rows.c */
/* Up to a prefill chunk's most rows in C (cpu.py's PREFILL_KERNEL_ROWS): at float16 the row tiles
   widen each weight vector once for 6 rows, not once a pair, and give the same bits (2026-12-06,
   AVX-512, SmolLM2's matrices, one thread: 37 rows 2.90 -> 2.34 ms, 100 rows 7.46 -> 6.22 ms). */
#define TT_ROWS_MAX 128
void tt_rows16_shared(long kind, const float *xp, long T, const u16 *Wb, long N, long KC, const float *bias,
                      float *y, long ldy);

typedef void (*tile_fn)(const float *, long, const u16 *, long, float *, long, const float *, long, long, long,
                        const u16 *, int, int);

/* The loop of tt_linear_f32 over blocks and pairs of rows, with the tiles given, its blocks
   shared by the threads of the enclosing parallel region (an orphaned `omp for`: one thread
   runs it whole outside a region). */
static void run_shared(long kind, tile_fn one, tile_fn two, const float *x, long T, long ldx, const u16 *Wb,
                       long N, long KC, const float *bias, float *y, long ldy) {
    if (T >= tt_rows_from[kind] && T <= TT_ROWS_MAX) {  /* a decode batch: cpu_rows.c's tiles, each weight widened once */
        tt_rows16_shared(kind, x, T, Wb, N, KC, bias, y, ldy);
        return;
    }
    long nblocks = (N + RB - 1) / RB;
    #pragma omp for schedule(static)
    for (long b = 0; b < nblocks; b++) {
        const u16 *wb = Wb + b * KC * RB * CB;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long passes = (T + 1) / 2;
        const u16 *next = passes > 1 && b + 1 < nblocks ? wb + KC * RB * CB : 0;
        int share = (int)((LINES_PER_STEP + passes - 1) / passes);
        for (long t = 0, p = 0; t < T; t += 2, p++) {
            int first = (int)(p * share), lines = first >= LINES_PER_STEP ? 0
                : (first + share > LINES_PER_STEP ? LINES_PER_STEP - first : share);
            const u16 *pf = lines ? next : 0;
            if (t + 2 <= T) two(x, ldx, wb, KC, y, ldy, bias, n0, nvalid, t, pf, first, lines);
            else one(x, ldx, wb, KC, y, ldy, bias, n0, nvalid, t, pf, first, lines);
        }
    }
}

static void run(long kind, tile_fn one, tile_fn two, const float *x, long T, long ldx, const u16 *Wb, long N,
                long KC, const float *bias, float *y, long ldy, int nthreads, long work) {
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1 && work >= 32768)
    run_shared(kind, one, two, x, T, ldx, Wb, N, KC, bias, y, ldy);
}

#ifdef __AVX512BF16__
/* x's rows (padded) rounded to bfloat16, 32 columns to a vector: hi [T][KC] (nearest even, as
   VCVTNE2PS2BF16 rounds); and for the first `exact` rows (rounded up to a pair, the rest
   zero) the remainder lo = bfloat16(x - hi) [exact][KC]: hi + lo is within 2^-16 of x, so a
   row that meets the weight through both keeps 16 of x's 24 mantissa bits (the logit lens's
   rows: see tt_linear_bf16_exact). NULL when out of memory. */
static void to_bf16_rows(const float *xp, long T, long KC, long exact, __m512bh *xs) {
    long ex = (exact + 1) / 2 * 2;
    __m512bh *lo = xs + T * KC;
    for (long i = 0; i < T * KC; i++) {  /* lanes 0-15 from the first 16 columns, 16-31 from the next */
        __m512 a = _mm512_loadu_ps(xp + i * CB), b = _mm512_loadu_ps(xp + i * CB + VL);
        xs[i] = _mm512_cvtne2ps_pbh(b, a);
        if (i >= exact * KC) continue;
        __m512i bits = (__m512i)xs[i];  /* the parts' float32 values: a bfloat16 is a float32's upper half */
        __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(bits)), 16));
        __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(bits, 1)),
                                                          16));
        lo[i] = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
    }
    for (long i = exact * KC; i < ex * KC; i++) lo[i] = (__m512bh)_mm512_setzero_si512();
}
static __m512bh *bf16_rows(const float *xp, long T, long KC, long exact) {
    long ex = (exact + 1) / 2 * 2;
    __m512bh *xs = aligned_alloc(64, sizeof(__m512bh) * (T + ex) * KC);
    if (xs) to_bf16_rows(xp, T, KC, exact, xs);
    return xs;
}

/* A weight row's 32 bfloat16 against x's 32 columns in the same order: lane i of the
   float32 sum gets columns 2i and 2i + 1; the lane sums at the end are the dot product.
   SPLIT: the rows' remainders too (lo, row t0 + t at lo[(t0 + t) * KC]). */
#define DP_TILE(NAME, TB, SPLIT)                                                              \
static void NAME##_##TB(const __m512bh *xs, const __m512bh *lo, const u16 *wb, long KC,      \
                        float *y, long ldy, const float *bias, long n0, long nvalid, long t0, \
                        const u16 *next, int pf_first, int pf_lines) {                        \
    __m512 acc[TB][RB];                                                                       \
    _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++)                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) acc[t][r] = _mm512_setzero_ps(); \
    for (long kc = 0; kc < KC; kc++) {                                                        \
        const u16 *wk = wb + kc * RB * CB;                                                    \
        if (next) {                                                                           \
            const char *nk = (const char *)(next + kc * RB * CB) + pf_first * 64;             \
            for (int l = 0; l < pf_lines; l++) __builtin_prefetch(nk + l * 64, 0, 1);          \
        }                                                                                     \
        __m512bh xk[TB], xl[TB];                                                              \
        _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                                \
            xk[t] = xs[(t0 + t) * KC + kc];                                                   \
            if (SPLIT) xl[t] = lo[(t0 + t) * KC + kc];                                        \
        }                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                \
            __m512bh w = (__m512bh)_mm512_loadu_si512(wk + r * CB);                           \
            _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                            \
                if (SPLIT) acc[t][r] = _mm512_dpbf16_ps(acc[t][r], w, xl[t]);                 \
                acc[t][r] = _mm512_dpbf16_ps(acc[t][r], w, xk[t]);                            \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    _Pragma("GCC unroll 8") for (int t = 0; t < TB; t++) {                                    \
        v16 a[RB];                                                                            \
        for (int r = 0; r < RB; r++) a[r] = (v16)acc[t][r];                                   \
        store(a, y + (t0 + t) * ldy, n0, nvalid, bias);                                       \
    }                                                                                         \
}
DP_TILE(dp, 1, 0)
DP_TILE(dp, 2, 0)
DP_TILE(dpx, 1, 1)
DP_TILE(dpx, 2, 1)

static void run_dp_shared(const __m512bh *xs, long T, long exact, const u16 *Wb, long N, long KC,
                          const float *bias, float *y, long ldy) {  /* as run_shared */
    long nblocks = (N + RB - 1) / RB;
    const __m512bh *lo = xs + T * KC;
    #pragma omp for schedule(static)
    for (long b = 0; b < nblocks; b++) {
        const u16 *wb = Wb + b * KC * RB * CB;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long passes = (T + 1) / 2;
        const u16 *next = passes > 1 && b + 1 < nblocks ? wb + KC * RB * CB : 0;
        int share = (int)((LINES_PER_STEP + passes - 1) / passes);
        for (long t = 0, p = 0; t < T; t += 2, p++) {
            int first = (int)(p * share), lines = first >= LINES_PER_STEP ? 0
                : (first + share > LINES_PER_STEP ? LINES_PER_STEP - first : share);
            const u16 *pf = lines ? next : 0;
            int two = t + 2 <= T;
            if (t < exact) (two ? dpx_2 : dpx_1)(xs, lo, wb, KC, y, ldy, bias, n0, nvalid, t, pf, first, lines);
            else (two ? dp_2 : dp_1)(xs, lo, wb, KC, y, ldy, bias, n0, nvalid, t, pf, first, lines);
        }
    }
}

static void run_dp(const __m512bh *xs, long T, long exact, const u16 *Wb, long N, long KC, const float *bias,
                   float *y, long ldy, int nthreads, long work) {
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1 && work >= 32768)
    run_dp_shared(xs, T, exact, Wb, N, KC, bias, y, ldy);
}
#endif

/* Which path tt_linear_bf16 takes in this build: 1 VDPBF16PS, 0 widening by shifts (same products). */
int tt_linear16_path(void) {
#ifdef __AVX512BF16__
    return 1;
#else
    return 0;
#endif
}

/* For cpu_team.c, which runs a pass's every layer in one parallel region: x's rows prepared
   once (by one thread) in scratch as the blocks read them, then the blocks shared by the
   region's threads. Bytes of scratch for T rows of K columns: */
long tt_linear16_scratch(long T, long K) {
    long KC = (K + CB - 1) / CB;
    return (long)sizeof(float) * T * KC * CB + 64 * T * KC;
}

/* kind 3 bfloat16 (x rounded as tt_linear_bf16 rounds it), 4 float16; scratch 64-byte aligned. */
void tt_linear16_prepare(long kind, const float *x, long T, long ldx, long K, void *scratch) {
    long KC = (K + CB - 1) / CB;
    float *xp = scratch;
    pad_rows(x, T, ldx, K, KC, xp);
#ifdef __AVX512BF16__
    if (kind == 3) to_bf16_rows(xp, T, KC, 0, (__m512bh *)(xp + T * KC * CB));
#else
    if (kind == 3) round_bf16(xp, T * KC * CB);
#endif
}

/* y [T, N] (row stride ldy) from x prepared by tt_linear16_prepare: the same arithmetic as
   tt_linear_bf16 / tt_linear_f16, an orphaned `omp for` over the blocks. */
void tt_linear16_shared(long kind, const void *scratch, long T, const u16 *Wb, long N, long K, const float *bias,
                        float *y, long ldy) {
    long KC = (K + CB - 1) / CB;
    const float *xp = scratch;
    if (kind == 4) {
        run_shared(4, tile_f16_1, tile_f16_2, xp, T, KC * CB, Wb, N, KC, bias, y, ldy);
        return;
    }
#ifdef __AVX512BF16__
    run_dp_shared((const __m512bh *)(xp + T * KC * CB), T, 0, Wb, N, KC, bias, y, ldy);
#else
    run_shared(3, tile_bf16_1, tile_bf16_2, xp, T, KC * CB, Wb, N, KC, bias, y, ldy);
#endif
}

/* x: [T, K] float32, row stride ldx; Wb: the blocked bfloat16 weight; y: [T, N], row
   stride ldy. The first `exact` rows keep x to 16 mantissa bits (x = hi + lo, two dot
   products a weight where the CPU has them, x as it is where it widens), the rest multiply x
   rounded to bfloat16: the logit lens's rows ride in the same pass over the LM head as the
   model's own, which must be the untraced pass's. Returns 0, or -1 when the padded rows
   could not be allocated. */
int tt_linear_bf16_exact(const float *x, long T, long ldx, const u16 *Wb, long N, long K, const float *bias,
                         float *y, long ldy, long exact, int nthreads) {
    long KC = (K + CB - 1) / CB;
    exact = exact < 0 ? 0 : (exact > T ? T : exact);
    float *xp = padded_rows(x, T, ldx, K, KC);
    if (!xp) return -1;
#ifdef __AVX512BF16__
    __m512bh *xs = bf16_rows(xp, T, KC, exact);
    free(xp);
    if (!xs) return -1;
    run_dp(xs, T, exact, Wb, N, KC, bias, y, ldy, nthreads, N * K);
    free(xs);
#else
    round_bf16(xp + exact * KC * CB, (T - exact) * KC * CB);
    run(3, tile_bf16_1, tile_bf16_2, xp, T, KC * CB, Wb, N, KC, bias, y, ldy, nthreads, N * K);
    free(xp);
#endif
    return 0;
}

/* Every row x rounded to bfloat16 (see the top of this file). */
int tt_linear_bf16(const float *x, long T, long ldx, const u16 *Wb, long N, long K, const float *bias,
                   float *y, long ldy, int nthreads) {
    return tt_linear_bf16_exact(x, T, ldx, Wb, N, K, bias, y, ldy, 0, nthreads);
}

int tt_linear_f16(const float *x, long T, long ldx, const u16 *Wb, long N, long K, const float *bias,
                  float *y, long ldy, int nthreads) {
    long KC = (K + CB - 1) / CB;
    float *xp = padded_rows(x, T, ldx, K, KC);
    if (!xp) return -1;
    run(4, tile_f16_1, tile_f16_2, xp, T, KC * CB, Wb, N, KC, bias, y, ldy, nthreads, N * K);
    free(xp);
    return 0;
}

/* W [N, K] 16-bit row-major -> Wb (see the top of this file), zero padding included. */
void tt_block_16(const u16 *W, long N, long K, u16 *Wb, int nthreads) {
    long KC = (K + CB - 1) / CB, nblocks = (N + RB - 1) / RB;
    #pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long b = 0; b < nblocks; b++)
        for (long kc = 0; kc < KC; kc++)
            for (long r = 0; r < RB; r++) {
                u16 *dst = Wb + ((b * KC + kc) * RB + r) * CB;
                long n = b * RB + r, k = kc * CB, len = n < N ? (K - k < CB ? K - k : CB) : 0;
                for (long i = 0; i < len; i++) dst[i] = W[n * K + k + i];
                for (long i = len; i < CB; i++) dst[i] = 0;
            }
}

/* Rows ids[0..n) of a blocked weight [N, K] as float32 out [n][K]: an embedding's lookup where a
   tied LM head's blocked copy is its only one, in one call (PyTorch's index, reshape, slice and
   widening were ~6 dispatched ops a decode step). kind 0: float32, cpu_linear.c's 16 columns
   to a block row; 3 bfloat16, 4 float16: this file's 32. Returns 0, or -1 for an id outside
   [0, N) (nothing read). */
int tt_blocked_rows(const void *Wb, long kind, long N, long K, const long *ids, long n, float *out) {
    for (long i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= N) return -1;
    long cb = kind == 0 ? VL : CB, KC = (K + cb - 1) / cb;
    for (long i = 0; i < n; i++) {
        long b = ids[i] / RB, r = ids[i] % RB;
        float *o = out + i * K;
        for (long kc = 0; kc < KC; kc++) {
            long at = ((b * KC + kc) * RB + r) * cb, len = K - kc * cb < cb ? K - kc * cb : cb;
            float row[CB];
            if (kind == 0) {
                for (long j = 0; j < len; j++) row[j] = ((const float *)Wb)[at + j];
            } else {
                const u16 *w = (const u16 *)Wb + at;
                v16 lo = kind == 3 ? bf16_to_f32(*(const v16h *)w) : f16_to_f32(*(const v16h *)w);
                v16 hi = kind == 3 ? bf16_to_f32(*(const v16h *)(w + VL)) : f16_to_f32(*(const v16h *)(w + VL));
                for (int j = 0; j < VL; j++) row[j] = lo[j], row[VL + j] = hi[j];
            }
            for (long j = 0; j < len; j++) o[kc * cb + j] = row[j];
        }
    }
    return 0;
}
