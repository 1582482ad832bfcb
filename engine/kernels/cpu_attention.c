/* Decode attention on the CPU: one new query token per sequence, its keys and values read
   straight from the paged KV pool through the sequence's block table.

   PyTorch's path gathers every sequence's blocks into a padded copy (index_select) and
   calls scaled_dot_product_attention, a fixed cost of ~30-80 us per layer that at batch 1
   on a small model is a fifth of the step. Here each (sequence, KV head) pair is one
   task: the query heads that share the KV head are scored together against each key,
   in chunks of CHUNK keys with a running max and sum (flash attention's online softmax),
   so nothing is copied and the softmax's exponentials are computed 16 at a time. Each key's
   and value's lines are prefetched a few keys ahead (see PF).
   Built with cpu_linear.c into one library (engine/kernels/cpu.py). */
#include <math.h>
#include <stddef.h>

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
#define VL 16
#define CHUNK 128
#define MAX_GROUP 16   /* query heads per KV head handled in one task */
#define MAX_DIM 512

/* e^x for 16 lanes, x <= 0 (scores minus their max): 2^n * p(r) with x = n ln2 + r,
   |r| <= ln2 / 2, p a degree-6 polynomial (Cephes' expf): within 2 ulp of expf. */
static inline v16 exp16(v16 x) {
    for (int t = 0; t < VL; t++) x[t] = x[t] < -87.3f ? -87.3f : x[t];  /* below: 0 in float32 anyway */
    /* n = round(x / ln2); x <= 0, so subtracting 0.5 and truncating toward zero rounds */
    v16 n = __builtin_convertvector(__builtin_convertvector(x * 1.44269504088896341f - 0.5f, v16i), v16);
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = (v16){0} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;  /* 2^n as a float's bits */
    return p * (v16)bits;
}

static inline float hsum(v16 v) {  /* a tree of halves: 4 adds, not 15 in a chain */
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static inline float dot(const float *a, const float *b, long D) {
    v16 acc = {0};
    long d = 0;
    for (; d + VL <= D; d += VL) acc += *(const v16 *)(a + d) * *(const v16 *)(b + d);
    float s = hsum(acc);
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* Keys ahead whose lines are asked for. A decode step streams every weight between two
   visits to a layer's keys, so they come from memory, and the hardware's prefetcher does
   not see them coming: one head's rows lie KVH * D floats apart in a page and the pages
   anywhere. At batch 8 and 64 keys this makes the call ~1.4x faster. */
#define PF 8
static inline void prefetch_row(const float *p, long D) {
    for (long i = 0; i < D; i += 16) __builtin_prefetch(p + i, 0, 3);
}

/* q [B, H, D]; k_cache, v_cache [num_blocks, BS, KVH, D]; tables [B, W] block ids (int64);
   ctx [B] keys per sequence (int32, the new token's included); window: a sliding window
   of that many keys (0: none). out [B, H, D]. Query head h reads KV head h / (H / KVH). */
void tt_decode_attention(const float *q, const float *k_cache, const float *v_cache, const long *tables,
                         long W, const int *ctx, long B, long H, long KVH, long D, long BS, float scale,
                         long window, float *out, int nthreads) {
    long G = H / KVH;
    long work = 0;
    for (long b = 0; b < B; b++) work += ctx[b];
    work *= H * D;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads) if (nthreads > 1 && work >= (1 << 18))
    for (long b = 0; b < B; b++) {
        for (long g = 0; g < KVH; g++) {
            long end = ctx[b], start = window > 0 && end > window ? end - window : 0;
            const float *qg = q + (b * H + g * G) * D;
            float m[MAX_GROUP], l[MAX_GROUP], acc[MAX_GROUP][MAX_DIM] __attribute__((aligned(64)));
            float s[MAX_GROUP][CHUNK] __attribute__((aligned(64)));
            for (long i = 0; i < G; i++) {
                m[i] = -INFINITY, l[i] = 0.f;
                for (long d = 0; d < D; d++) acc[i][d] = 0.f;
            }
            for (long c0 = start; c0 < end; c0 += CHUNK) {
                long n = end - c0 < CHUNK ? end - c0 : CHUNK;
                long blk0 = c0 / BS, off0 = c0 % BS;  /* a key's place: one division a chunk, not a key */
                long pblk = blk0, poff = off0;  /* the key PF ahead, whose lines are asked for now */
                for (long j = 0; j < PF && j < n; j++) {
                    prefetch_row(k_cache + ((tables[b * W + pblk] * BS + poff) * KVH + g) * D, D);
                    if (++poff == BS) poff = 0, pblk++;
                }
                for (long j = 0, blk = blk0, off = off0; j < n; j++) {  /* scores of this chunk's keys */
                    long row = (tables[b * W + blk] * BS + off) * KVH + g;
                    if (j + PF < n) {
                        prefetch_row(k_cache + ((tables[b * W + pblk] * BS + poff) * KVH + g) * D, D);
                        if (++poff == BS) poff = 0, pblk++;
                    }
                    prefetch_row(v_cache + row * D, D);  /* read by the weighted values below */
                    const float *k = k_cache + row * D;
                    for (long i = 0; i < G; i++) s[i][j] = dot(qg + i * D, k, D) * scale;
                    if (++off == BS) off = 0, blk++;
                }
                for (long i = 0; i < G; i++) {  /* online softmax: rescale what came before */
                    float mx = m[i];
                    for (long j = 0; j < n; j++) mx = s[i][j] > mx ? s[i][j] : mx;
                    float shrink = m[i] == -INFINITY ? 0.f : expf(m[i] - mx), sum = 0.f;
                    long j = 0;
                    for (; j + VL <= n; j += VL) {
                        v16 p = exp16(*(v16 *)(s[i] + j) - mx);
                        *(v16 *)(s[i] + j) = p;
                        for (int t = 0; t < VL; t++) sum += p[t];
                    }
                    for (; j < n; j++) sum += (s[i][j] = expf(s[i][j] - mx));
                    l[i] = l[i] * shrink + sum;
                    m[i] = mx;
                    for (long d = 0; d < D; d++) acc[i][d] *= shrink;
                }
                for (long j = 0, blk = blk0, off = off0; j < n; j++) {  /* weighted values */
                    const float *v = v_cache + ((tables[b * W + blk] * BS + off) * KVH + g) * D;
                    if (++off == BS) off = 0, blk++;
                    for (long i = 0; i < G; i++) {
                        float p = s[i][j];
                        long d = 0;
                        for (; d + VL <= D; d += VL) *(v16 *)(acc[i] + d) += p * *(const v16 *)(v + d);
                        for (; d < D; d++) acc[i][d] += p * v[d];
                    }
                }
            }
            for (long i = 0; i < G; i++) {
                float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;  /* no keys (a padding row): zeros */
                for (long d = 0; d < D; d++) out[(b * H + g * G + i) * D + d] = acc[i][d] * inv;
            }
        }
    }
}
