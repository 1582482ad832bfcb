/* Weight-only int8 / int4 linear layers for a CPU decode step, float32 activations:
   y[t, n] = sum_k x[t, k] * W[n, k] (+ bias[n]), W stored as codes in groups of 32 inputs.

     int8: w = q * d        (q in -128..127; GGUF's Q8_0 exactly)
     int4: w = q * d + m    (q in 0..15;     GGUF's Q4_1 exactly, Q4_0 with m = -8d)

   As in cpu_linear.c a decode step is bound by how fast the weight streams from memory,
   so the weight is one contiguous stream per block of 8 output rows: for each group of 32
   inputs, one record holding the 8 rows' codes, then their 8 scales d (and for int4 their
   8 offsets m), float32:

     int8 record (288 bytes): int8  codes[8][32], float d[8]
     int4 record (192 bytes): uint8 codes[8][16], float d[8], float m[8]
                              (byte j: input j in its low nibble, input j + 16 in its high
                              nibble: GGUF's own order)

   Per group and row the codes become floats (16 at a time), meet x's 32 floats in two
   multiply-adds and the sum is scaled by d into the row's accumulator: no horizontal sums
   until the end. int4's offsets add m * sum(x over the group), with the sums of x taken
   once per call and the term done for 8 rows at once. Built and loaded by
   engine/kernels/cpu_quant.py (with cpu.py's build). */
#include <stdint.h>
#include <stdlib.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int8_t i8x16 __attribute__((vector_size(16), aligned(1)));
typedef uint8_t u8x16 __attribute__((vector_size(16), aligned(1)));

/* 16 bytes -> 16 floats. GCC 12 compiles __builtin_convertvector from bytes into 16
   scalar conversions, so the widening is spelt out with the ISA's own instructions. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline v16 i8_to_float(i8x16 c) { return (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32((__m128i)c)); }
static inline v16 u8_to_float(u8x16 c) { return (v16)_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32((__m128i)c)); }
/* 16 bytes of int4 codes -> inputs 0-15 (low nibbles) and 16-31 (high): the bytes widened
   once, the nibbles split in 32-bit lanes (one shuffle fewer than splitting bytes first:
   7% faster on Zen 4) */
static inline void nibbles_to_float(const uint8_t *p, v16 *lo, v16 *hi) {
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = (v16)_mm512_cvtepi32_ps(_mm512_and_si512(c, _mm512_set1_epi32(15)));
    *hi = (v16)_mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
}
#elif defined(__AVX2__)
#include <immintrin.h>
#include <string.h>
static inline v16 join(__m256 lo, __m256 hi) {
    v16 r;
    memcpy(&r, &lo, 32);
    memcpy((char *)&r + 32, &hi, 32);
    return r;
}
static inline v16 i8_to_float(i8x16 c) {
    __m128i v = (__m128i)c;
    return join(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
}
static inline v16 u8_to_float(u8x16 c) {
    __m128i v = (__m128i)c;
    return join(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))));
}
#else
static inline v16 i8_to_float(i8x16 c) { v16 r; for (int i = 0; i < 16; i++) r[i] = c[i]; return r; }
static inline v16 u8_to_float(u8x16 c) { v16 r; for (int i = 0; i < 16; i++) r[i] = c[i]; return r; }
#endif
#if !defined(__AVX512F__)
static inline void nibbles_to_float(const uint8_t *p, v16 *lo, v16 *hi) {
    u8x16 c = *(const u8x16 *)p;
    *lo = u8_to_float(c & 0x0F);
    *hi = u8_to_float(c >> 4);
}
#endif
#define RB 8   /* output rows per block */
#define G 32   /* inputs per group */
#define Q8_REC (RB * G + RB * 4)
#define Q4_REC (RB * G / 2 + 2 * RB * 4)
/* two-row tiles do enough arithmetic that the next records must be asked for ahead */
#define PREFETCH_BYTES 4096

static inline float hsum(v16 v) {
    float s = 0.f;
    for (int i = 0; i < 16; i++) s += v[i];
    return s;
}

static inline void store(v16 acc[RB][2], const float *moff, int TB, float *y, long ldy,
                         const float *bias, long n0, long nvalid, long t0) {
    for (int r = 0; r < nvalid; r++)
        for (int t = 0; t < TB; t++) {
            float s = hsum(acc[r][t]) + (moff ? moff[t * RB + r] : 0.f);
            if (bias) s += bias[n0 + r];
            y[(t0 + t) * ldy + n0 + r] = s;
        }
}

/* One block of RB output rows for TB input rows (TB = 1 or 2). */
#define Q8_TILE(TB)                                                                           \
static void q8_tile_##TB(const float *x, long ldx, const uint8_t *wb, long NG, float *y,     \
                         long ldy, const float *bias, long n0, long nvalid, long t0) {       \
    v16 acc[RB][2];                                                                           \
    _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                      \
        _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++) acc[r][t] = (v16){0};            \
    for (long g = 0; g < NG; g++) {                                                           \
        const uint8_t *rec = wb + g * Q8_REC;                                                 \
        if (TB > 1) __builtin_prefetch(rec + PREFETCH_BYTES, 0, 1);                           \
        const float *d = (const float *)(rec + RB * G);                                       \
        v16 xl[TB], xh[TB];                                                                   \
        _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++) {                                \
            xl[t] = *(const v16 *)(x + (t0 + t) * ldx + g * G);                               \
            xh[t] = *(const v16 *)(x + (t0 + t) * ldx + g * G + 16);                          \
        }                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                \
            v16 w0 = i8_to_float(*(const i8x16 *)(rec + r * G));          \
            v16 w1 = i8_to_float(*(const i8x16 *)(rec + r * G + 16));     \
            _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++)                              \
                acc[r][t] += (w0 * xl[t] + w1 * xh[t]) * d[r];                                \
        }                                                                                     \
    }                                                                                         \
    store(acc, 0, TB, y, ldy, bias, n0, nvalid, t0);                                          \
}
Q8_TILE(1)
Q8_TILE(2)

/* xs: the sums of x over each group, [T][NG]. */
#define Q4_TILE(TB)                                                                           \
static void q4_tile_##TB(const float *x, long ldx, const float *xs, const uint8_t *wb,       \
                         long NG, float *y, long ldy, const float *bias, long n0,             \
                         long nvalid, long t0) {                                              \
    v16 acc[RB][2];                                                                           \
    v8 macc[2];                                                                               \
    _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++)                                      \
        _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++) acc[r][t] = (v16){0};            \
    _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++) macc[t] = (v8){0};                   \
    for (long g = 0; g < NG; g++) {                                                           \
        const uint8_t *rec = wb + g * Q4_REC;                                                 \
        if (TB > 1) __builtin_prefetch(rec + PREFETCH_BYTES, 0, 1);                           \
        const float *d = (const float *)(rec + RB * G / 2);                                   \
        v8 m = *(const v8 *)(rec + RB * G / 2 + RB * 4);                                      \
        v16 xl[TB], xh[TB];                                                                   \
        _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++) {                                \
            xl[t] = *(const v16 *)(x + (t0 + t) * ldx + g * G);                               \
            xh[t] = *(const v16 *)(x + (t0 + t) * ldx + g * G + 16);                          \
            macc[t] += m * xs[(t0 + t) * NG + g];                                             \
        }                                                                                     \
        _Pragma("GCC unroll 8") for (int r = 0; r < RB; r++) {                                \
            v16 w0, w1;                                                                       \
            nibbles_to_float(rec + r * (G / 2), &w0, &w1);                                    \
            _Pragma("GCC unroll 2") for (int t = 0; t < TB; t++)                              \
                acc[r][t] += (w0 * xl[t] + w1 * xh[t]) * d[r];                                \
        }                                                                                     \
    }                                                                                         \
    float moff[2 * RB];                                                                       \
    for (int t = 0; t < TB; t++)                                                              \
        for (int r = 0; r < RB; r++) moff[t * RB + r] = macc[t][r];                           \
    store(acc, moff, TB, y, ldy, bias, n0, nvalid, t0);                                       \
}
Q4_TILE(1)
Q4_TILE(2)

/* x: [T, K] with row stride ldx, K a multiple of 32; Wb: the records, N padded to 8 rows;
   y: [T, N] with row stride ldy. Row blocks split between `nthreads` OpenMP threads as in
   cpu_linear.c. */
void tt_linear_q8(const float *x, long T, long ldx, const uint8_t *Wb, long N, long K,
                  const float *bias, float *y, long ldy, int nthreads) {
    long NG = K / G, nblocks = (N + RB - 1) / RB;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && N * K >= 32768)
    for (long b = 0; b < nblocks; b++) {
        const uint8_t *wb = Wb + b * NG * Q8_REC;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long t = 0;
        for (; t + 2 <= T; t += 2) q8_tile_2(x, ldx, wb, NG, y, ldy, bias, n0, nvalid, t);
        if (t < T) q8_tile_1(x, ldx, wb, NG, y, ldy, bias, n0, nvalid, t);
    }
}

/* Returns 0, or -1 where the group sums could not be allocated. */
int tt_linear_q4(const float *x, long T, long ldx, const uint8_t *Wb, long N, long K,
                 const float *bias, float *y, long ldy, int nthreads) {
    long NG = K / G, nblocks = (N + RB - 1) / RB;
    float *xs = malloc(sizeof(float) * (size_t)(T * NG > 0 ? T * NG : 1));
    if (!xs) return -1;
    for (long t = 0; t < T; t++)
        for (long g = 0; g < NG; g++) {
            v16 s = *(const v16 *)(x + t * ldx + g * G) + *(const v16 *)(x + t * ldx + g * G + 16);
            xs[t * NG + g] = hsum(s);
        }
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && N * K >= 32768)
    for (long b = 0; b < nblocks; b++) {
        const uint8_t *wb = Wb + b * NG * Q4_REC;
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        long t = 0;
        for (; t + 2 <= T; t += 2) q4_tile_2(x, ldx, xs, wb, NG, y, ldy, bias, n0, nvalid, t);
        if (t < T) q4_tile_1(x, ldx, xs, wb, NG, y, ldy, bias, n0, nvalid, t);
    }
    free(xs);
    return 0;
}

/* The float weight [N, K] (row-major) that the records stand for: a prefill chunk of many
   rows is a compute-bound GEMM, done by PyTorch's on this copy (made per call). */
void tt_dequantize(const uint8_t *Wb, int int4, long N, long K, float *out, int nthreads) {
    long NG = K / G, nblocks = (N + RB - 1) / RB, rec_bytes = int4 ? Q4_REC : Q8_REC;
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && N * K >= 32768)
    for (long b = 0; b < nblocks; b++) {
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB;
        for (long g = 0; g < NG; g++) {
            const uint8_t *rec = Wb + (b * NG + g) * rec_bytes;
            for (int r = 0; r < nvalid; r++) {
                float *o = out + (n0 + r) * K + g * G;
                if (int4) {
                    const float *d = (const float *)(rec + RB * G / 2), *m = d + RB;
                    u8x16 c = *(const u8x16 *)(rec + r * (G / 2));
                    *(v16 *)o = u8_to_float(c & 0x0F) * d[r] + m[r];
                    *(v16 *)(o + 16) = u8_to_float(c >> 4) * d[r] + m[r];
                } else {
                    const float *d = (const float *)(rec + RB * G);
                    *(v16 *)o = i8_to_float(*(const i8x16 *)(rec + r * G)) * d[r];
                    *(v16 *)(o + 16) = i8_to_float(*(const i8x16 *)(rec + r * G + 16)) * d[r];
                }
            }
        }
    }
}
