/* A prefill chunk's bfloat16 GEMM on the AMX tiles: y[M, N] (float32) = x[M, K] @ W.T, with x
 * bfloat16 and W bfloat16 in cpu_linear16.c's blocked layout [N/8, K/32, 8, 32], sums in float32.
 *
 * Why our own and not oneDNN through torch: torch reaches oneDNN's bfloat16 products for float32
 * tensors only through a process-wide setting (mkldnn fp32_precision), which would also send any
 * other thread's float32 matmul to bfloat16 while it is set; bfloat16 tensors in give a bfloat16
 * result, rounding away the float32 sums. This takes bfloat16 in, gives float32 out, and touches
 * no setting but this thread's tile configuration.
 *
 * Tiles: C 0-3 (2x2 blocks of 16x16 float32), A 4-5 (16 rows x 32 bfloat16), B 6-7 (16 pairs of
 * K x 16 columns, the VNNI layout TDPBF16PS reads: a 32-bit transpose of the blocked rows).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Linux hands out the tiles' state only to a process that asks: 0 when granted. */
int tt_amx_init(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
}

static void configure(void) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
}

/* Columns n0..n0+15 of W (blocks nb0 and nb0+1 of 8 rows) into VNNI tiles, one per 32 of K:
 * packed[kk][p][n] = the pair (W[n][32kk+2p], W[n][32kk+2p+1]) as one 32-bit word, gathered 16
 * at a time (a scalar copy took ~1 ms a SmolLM2 layer, more than the products at 37 rows). */
static void pack16(const uint32_t *w, long nb, long kb, long nb0, uint32_t *packed) {
    int two = nb0 + 1 < nb;
    __m512i idx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 0, 0, 0, 0, 0, 0, 0, 0);
    if (two) idx = _mm512_mask_add_epi32(idx, 0xff00, _mm512_set1_epi32((int)(kb * 128)),
                                         _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 32, 48, 64, 80, 96, 112));
    __mmask16 valid = two ? 0xffff : 0x00ff;
    for (long kk = 0; kk < kb; kk++) {
        const uint32_t *src = w + (nb0 * kb + kk) * 128;
        for (int p = 0; p < 16; p++)
            _mm512_store_si512(packed + kk * 256 + p * 16,
                               _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx, src + p, 4));
    }
}

/* One 32x32 (or smaller, by two_m / two_n) block of y at rows m0, packed columns b0 / b1. */
static void block(const uint16_t *x, long lda, const uint32_t *b0, const uint32_t *b1, long kb,
                  float *y, long ldy, int two_m, int two_n) {
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long kk = 0; kk < kb; kk++) {
        _tile_loadd(4, x + kk * 32, lda * 2);
        _tile_loadd(6, b0 + kk * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
            _tile_loadd(7, b1 + kk * 256, 64);
            _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
            _tile_loadd(5, x + 16 * lda + kk * 32, lda * 2);
            _tile_dpbf16ps(2, 5, 6);
            if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, y, ldy * 4);
    if (two_n) _tile_stored(1, y + 16, ldy * 4);
    if (two_m) {
        _tile_stored(2, y + 16 * ldy, ldy * 4);
        if (two_n) _tile_stored(3, y + 16 * ldy + 16, ldy * 4);
    }
}

/* Rows m0..m1 of x against column pairs j of the packed weight (b: pair 0's tiles, `stride` apart). */
static void rows(const uint16_t *x, long m0, long m1, long kb, const uint32_t *b0, long nt, long j, float *y,
                 long ldy) {
    for (long m = m0; m < m1; m += 32)
        block(x + m * kb * 32, kb * 32, b0, b0 + kb * 256, kb, y + m * ldy + 32 * j, ldy, m + 16 < m1,
              2 * j + 1 < nt);
}

/* x: bfloat16 [M, 32 kb] row-major, M a multiple of 16, zero past the real K. w: the blocked
 * weight [nb, kb, 8, 32]. y: float32 [M, 16 ceil(nb / 2)], the columns past N padding.
 * Up to CHUNK rows (a prefill chunk) each thread packs a column pair into its own buffer and runs
 * every row on it while it is in L1 / L2: the weight is read once, as the C kernels read it. Past
 * that the whole weight is packed first (one copy, half the float32 one the GEMM had), then x is
 * run in chunks of CHUNK rows, each kept in L2 while every pair runs over it.
 * Returns 0, or -1 where a packing buffer could not be had. */
#define CHUNK 256
int tt_amx_bf16_gemm(const void *x, long M, const void *w, long nb, long kb, float *y, int threads) {
    long nt = (nb + 1) / 2, ldy = nt * 16, pairs = (nt + 1) / 2, chunks = (M + CHUNK - 1) / CHUNK;
    const uint32_t *wu = w;
    const uint16_t *xs = x;
    int few = M <= CHUNK, failed = 0;
    uint32_t *packed = few ? 0 : aligned_alloc(64, (size_t)nt * kb * 1024);
    if (!few && !packed) return -1;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        uint32_t *own = few ? aligned_alloc(64, (size_t)kb * 2 * 1024) : 0;
        if (few && !own) failed = 1;
        else if (few) {
            configure();
#pragma omp for schedule(static)
            for (long j = 0; j < pairs; j++) {
                pack16(wu, nb, kb, 4 * j, own);
                if (2 * j + 1 < nt) pack16(wu, nb, kb, 4 * j + 2, own + kb * 256);
                rows(xs, 0, M, kb, own, nt, j, y, ldy);
            }
            _tile_release();
        } else {
#pragma omp for schedule(static)
            for (long t = 0; t < nt; t++) pack16(wu, nb, kb, 2 * t, packed + t * kb * 256);
            configure();
#pragma omp for collapse(2) schedule(static)
            for (long c = 0; c < chunks; c++)
                for (long j = 0; j < pairs; j++)
                    rows(xs, c * CHUNK, (c + 1) * CHUNK < M ? (c + 1) * CHUNK : M, kb, packed + 2 * j * kb * 256,
                         nt, j, y, ldy);
            _tile_release();
        }
        free(own);
    }
    free(packed);
    return failed ? -1 : 0;
}
