/* Linear layers over a decode batch (up to MAX_ROWS rows of x): the same blocked weights as
   cpu_linear.c (float32, 16 columns to a block row) and cpu_linear16.c (bfloat16 widened by
   shifts, float16; 32 columns), the same arithmetic, another order of the work.

   Their tiles keep 8 output rows x 1-2 rows of x in registers: right for one row, where the
   weights' stream is all the time, but past two rows each block is read again from the cache,
   and each 16-bit weight widened again, once per pair of rows; on AVX2 the 16 accumulators of
   a pair (two registers each) do not fit its 16 registers (a batch of 8 cost 3.6x one row at
   float32, and float16, spilling its conversions, 21x). Here a tile is R output rows x TB rows
   of x: each weight vector is loaded (and widened) once into a register and meets TB rows of
   x, read from L1 as the multiply-adds' memory operands.

   Bit for bit the 8-row tiles' results: each accumulator is their 16 lanes (in 16 / W registers
   of W lanes), takes the same multiply-adds in the same order, and is summed in their order
   (sum_parts), so a row of y does not depend on how many rows ride with it (the logit lens's
   rows beside the model's own; a sequence alone or in a batch). cpu.py's ROW_TILES_FROM says
   from how many rows these tiles run, by the build's vector width.

   The first pass over a block also asks for the block's other rows, so the block comes from
   memory as one stream; the later passes ask for the next block's lines, a share each, as
   cpu_linear.c's do. Built into the float kernels' library (cpu.py). */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cpu_vec.h"
#define RB 8  /* output rows per block, the layouts' */
#if defined(__AVX512F__)  /* 32 registers: 4 x 6 accumulators, 4 weight vectors */
#define W 16
#define R 4
#define TBMAX 6
#elif defined(__AVX2__)  /* 16: 6 accumulators of two halves, two weight halves */
#define W 8
#define R 1
#define TBMAX 6
#else  /* 16 of 4 floats */
#define W 4
#define R 1
#define TBMAX 2
#endif
#define NH (VL / W)  /* registers to a 16-lane accumulator of the 8-row tiles */

typedef float vw __attribute__((vector_size(W * 4), aligned(4)));
typedef unsigned short u16;
typedef u16 vwh __attribute__((vector_size(W * 2), aligned(2)));
typedef unsigned int vwu __attribute__((vector_size(W * 4)));

static inline vw load_f32(const float *p) { return *(const vw *)p; }
static inline vw load_bf16(const u16 *p) { return (vw)(__builtin_convertvector(*(const vwh *)p, vwu) << 16); }
static inline vw load_f16(const u16 *p) {  /* cpu_linear16.c's f16_to_f32, W lanes */
#if W == 16
    return (vw)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#elif W == 8 && defined(__F16C__)
    return (vw)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#else
    vwu u = __builtin_convertvector(*(const vwh *)p, vwu);
    vwu sign = (u & 0x8000u) << 16, em = (u & 0x7fffu) << 13;
    vwu scaled = (vwu)((vw)em * 0x1p112f);
    vwu special = (vwu)((u & 0x7c00u) == 0x7c00u);
    return (vw)(sign | (scaled & ~special) | ((em | 0x7f800000u) & special));
#endif
}

/* A 16-lane accumulator held as NH parts of W lanes, summed in the order of the 8-row tiles'
   sum8 (lane i + lane i + 8, then 4 apart, then 2, then 1): each row of y gets the same bits
   whichever tiles ran, so a row's result never depends on the batch around it. */
static inline float sum_parts(const vw *a) {
#if W == 16
    v8 u = __builtin_shufflevector(a[0], a[0], 0, 1, 2, 3, 4, 5, 6, 7)
         + __builtin_shufflevector(a[0], a[0], 8, 9, 10, 11, 12, 13, 14, 15);
    v4 s = __builtin_shufflevector(u, u, 0, 1, 2, 3) + __builtin_shufflevector(u, u, 4, 5, 6, 7);
#elif W == 8
    v8 u = a[0] + a[1];
    v4 s = __builtin_shufflevector(u, u, 0, 1, 2, 3) + __builtin_shufflevector(u, u, 4, 5, 6, 7);
#else
    v4 s = (a[0] + a[2]) + (a[1] + a[3]);
#endif
    return (s[0] + s[2]) + (s[1] + s[3]);
}

/* The pass's prefetches: lines [pf_first, pf_first + pf_lines) of block row kc of pf. */
#define PREFETCH(pf, kc, CB)                                                                      \
    if (pf) {                                                                                     \
        const char *nk = (const char *)(pf + (kc) * RB * (CB)) + pf_first * 64;                   \
        for (int l = 0; l < pf_lines; l++) __builtin_prefetch(nk + l * 64, 0, 2);                  \
    }

#define STORE(TB)                                                                                 \
    for (int r = 0; r < R && r0 + r < nvalid; r++)                                                \
        for (int t = 0; t < TB; t++) {                                                            \
            float s = sum_parts(acc[r][t]);                                                       \
            y[(t0 + t) * ldy + n0 + r0 + r] = bias ? s + bias[n0 + r0 + r] : s;                   \
        }

/* Rows r0 .. r0 + R - 1 of a float32 block (cpu_linear.c's layout) for rows t0 .. t0 + TB - 1
   of x (row stride ldx, K columns: the last block row's x zero padded, as cpu_linear.c's tiles
   pad it), with their arithmetic: acc += w * x a lane, 16 columns a block row. */
#define TILE32(TB)                                                                                \
static void f32_##TB(const float *x, long ldx, long K, const float *wb, long KC, long r0, long t0,   \
                     float *y, long ldy, const float *bias, long n0, long nvalid,                  \
                     const float *pf, int pf_first, int pf_lines) {                               \
    vw acc[R][TB][NH];                                                                            \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                          \
        _Pragma("GCC unroll 16") for (int t = 0; t < TB; t++)                                     \
            _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) acc[r][t][h] = (vw){0};          \
    for (long kc = 0; kc < KC; kc++) {                                                            \
        PREFETCH(pf, kc, VL)                                                                      \
        long k = kc * VL, ld = ldx;                                                               \
        const float *wk = wb + (kc * RB + r0) * VL, *xk = x + t0 * ldx + k;                       \
        float xt[TB][VL];                                                                         \
        if (k + VL > K) { /* x's last columns, zero padded as the weights are */                 \
            for (int t = 0; t < TB; t++)                                                          \
                for (long i = 0; i < VL; i++) xt[t][i] = k + i < K ? x[(t0 + t) * ldx + k + i] : 0.f; \
            xk = &xt[0][0], ld = VL;                                                              \
        }                                                                                         \
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {                                    \
            vw w[R];                                                                              \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) w[r] = load_f32(wk + r * VL + h * W); \
            _Pragma("GCC unroll 16") for (int t = 0; t < TB; t++) {                               \
                vw xv = load_f32(xk + t * ld + h * W);                                            \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) acc[r][t][h] += w[r] * xv;   \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    STORE(TB)                                                                                     \
}

/* The same for a 16-bit block (cpu_linear16.c's layout, 32 columns a block row; x padded to
   them), widened by LOAD, with its tiles' arithmetic: acc += wl * lo + wh * hi a lane (wl, lo:
   the first 16 columns). */
#define TILE16(NAME, LOAD, TB)                                                                    \
static void NAME##_##TB(const float *x, long ldx, long K, const u16 *wb, long KC, long r0, long t0,  \
                        float *y, long ldy, const float *bias, long n0, long nvalid,              \
                        const u16 *pf, int pf_first, int pf_lines) {                              \
    (void)K;                                                                                      \
    vw acc[R][TB][NH];                                                                            \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                          \
        _Pragma("GCC unroll 16") for (int t = 0; t < TB; t++)                                     \
            _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) acc[r][t][h] = (vw){0};          \
    for (long kc = 0; kc < KC; kc++) {                                                            \
        PREFETCH(pf, kc, 2 * VL)                                                                  \
        const u16 *wk = wb + (kc * RB + r0) * 2 * VL;                                             \
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {                                    \
            vw wl[R], wh[R];                                                                      \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                \
                wl[r] = LOAD(wk + r * 2 * VL + h * W), wh[r] = LOAD(wk + r * 2 * VL + VL + h * W);  \
            }                                                                                     \
            _Pragma("GCC unroll 16") for (int t = 0; t < TB; t++) {                               \
                const float *xk = x + (t0 + t) * ldx + kc * 2 * VL + h * W;                       \
                vw lo = load_f32(xk), hi = load_f32(xk + VL);                                     \
                _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) acc[r][t][h] += wl[r] * lo + wh[r] * hi; \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    STORE(TB)                                                                                     \
}
#define TILES(TILE)                                                                              \
    TILE(1) TILE(2) TILES_WIDE(TILE)
#if TBMAX == 6
#define TILES_WIDE(TILE) TILE(3) TILE(4) TILE(5) TILE(6)
#define TILE_LIST(NAME) {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6}
#else
#define TILES_WIDE(TILE)
#define TILE_LIST(NAME) {NAME##_1, NAME##_2}
#endif
#define TILE_BF16(TB) TILE16(bf16, load_bf16, TB)
#define TILE_F16(TB) TILE16(f16, load_f16, TB)
TILES(TILE32)
TILES(TILE_BF16)
TILES(TILE_F16)

typedef void (*tile_f32)(const float *, long, long, const float *, long, long, long, float *, long, const float *,
                         long, long, const float *, int, int);
typedef void (*tile_16)(const float *, long, long, const u16 *, long, long, long, float *, long, const float *, long,
                        long, const u16 *, int, int);
static const tile_f32 F32[TBMAX] = TILE_LIST(f32);
static const tile_16 BF16[TBMAX] = TILE_LIST(bf16), F16[TBMAX] = TILE_LIST(f16);

/* Rows of x split into passes of at most TBMAX, as even as they go (8 rows: 4 + 4, not 6 + 2). */
static long chunk(long T) {
    long n = (T + TBMAX - 1) / TBMAX;
    return (T + n - 1) / n;
}

/* The loop over blocks, an orphaned `omp for` (see cpu_linear.c): for each block, each group of R
   output rows, each chunk of x's rows. WT: the weight's type; CB its columns a block row. */
#define RUN(NAME, WT, TILES, CB)                                                                  \
static void NAME(const float *x, long T, long ldx, long K, const WT *Wb, long N, long KC,        \
                 const float *bias, float *y, long ldy) {                                         \
    long nblocks = (N + RB - 1) / RB, step = chunk(T), lines = RB * (CB) * (long)sizeof(WT) / 64; \
    long passes = (RB / R) * ((T + step - 1) / step);                                             \
    int share = (int)((lines + passes - 2) / (passes > 1 ? passes - 1 : 1));                      \
    _Pragma("omp for schedule(static)")                                                           \
    for (long b = 0; b < nblocks; b++) {                                                          \
        const WT *wb = Wb + b * KC * RB * (CB);                                                   \
        const WT *next = b + 1 < nblocks ? wb + KC * RB * (CB) : 0;                               \
        long n0 = b * RB, nvalid = N - n0 < RB ? N - n0 : RB, p = 0;                              \
        for (long r0 = 0; r0 < RB && r0 < nvalid; r0 += R)                                        \
            for (long t0 = 0; t0 < T; t0 += step, p++) {                                          \
                long tb = T - t0 < step ? T - t0 : step;                                          \
                /* pass 0: this block's every line; then the next block's, a share a pass */     \
                int first = p ? (int)((p - 1) * share) : 0, n = p ? share : (int)lines;           \
                if (first + n > lines) n = first >= lines ? 0 : (int)(lines - first);             \
                TILES[tb - 1](x, ldx, K, wb, KC, r0, t0, y, ldy, bias, n0, nvalid,                \
                              n ? (p ? next : wb) : 0, first, n);                                 \
            }                                                                                     \
    }                                                                                             \
}
RUN(rows_f32, float, F32, 16)
RUN(rows_bf16, u16, BF16, 32)
RUN(rows_f16, u16, F16, 32)

/* y [T, N] = x [T, K] (row stride ldx) times a float32 blocked weight (cpu_linear.c's layout). */
void tt_rows_f32_shared(const float *x, long T, long ldx, const float *Wb, long N, long K, const float *bias,
                        float *y, long ldy) {
    rows_f32(x, T, ldx, K, Wb, N, (K + 15) / 16, bias, y, ldy);
}

/* The same for a 16-bit blocked weight (cpu_linear16.c's layout), x padded to KC * 32 columns
   (and, for bfloat16, already rounded to bfloat16): kind 3 bfloat16, 4 float16. */
void tt_rows16_shared(long kind, const float *xp, long T, const u16 *Wb, long N, long KC, const float *bias,
                      float *y, long ldy) {
    if (kind == 3) rows_bf16(xp, T, KC * 32, KC * 32, Wb, N, KC, bias, y, ldy);
    else rows_f16(xp, T, KC * 32, KC * 32, Wb, N, KC, bias, y, ldy);
}

/* By the weight's kind (0 float32, 3 bfloat16, 4 float16), the fewest rows of x that take these
   tiles, up to TT_ROWS_MAX (a prefill chunk keeps the 8-row tiles); below, the 8-row tiles. Set
   at load by cpu.py from its measured table (ROW_TILES_FROM), by tests and benchmarks to run
   both orders of the work in one process. */
int tt_rows_from[5] = {1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30};  /* off until cpu.py sets them */

int tt_rows_set(long kind, int from) {  /* returns the one before */
    if (kind < 0 || kind > 4) return -1;
    int before = tt_rows_from[kind];
    tt_rows_from[kind] = from;
    return before;
}
