/* Decode attention on the CPU: one new query token per sequence, its keys and values read
   straight from the paged KV pool through the sequence's block table.

   PyTorch's path gathers every sequence's blocks into a padded copy (index_select) and
   calls scaled_dot_product_attention, a fixed cost of ~30-80 us per layer that at batch 1
   on a small model is a fifth of the step. Here each (sequence, KV head) pair is one
   task: the query heads that share the KV head are scored together against each key,
   in chunks of CHUNK keys with a running max and sum (flash attention's online softmax),
   so nothing is copied and the softmax's exponentials are computed 16 at a time. Each key's
   and value's lines are prefetched a few keys ahead (see PF). A `full` trace's probabilities
   (tt_probs) are the same scores, kept as they are computed and normalised at the end: the
   keys are read once, while they are in cache, instead of again after the pass.
   Built with cpu_linear.c into one library (engine/kernels/cpu.py). */
#include <math.h>
#include <stddef.h>

#include "cpu_vec.h"
#include "cpu_layer.h"
#define CHUNK 128
#define MAX_GROUP 16   /* query heads per KV head handled in one task */
#define MAX_DIM 512

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

/* n kept columns o, keys key0 .. key0 + n - 1, holding their scores: each key the row sees
   (start .. end - 1) its probability e^(score - mx) * inv, 16 at a time; the others 0. */
static void finish_probs(float *o, long n, long key0, long start, long end, float mx, float inv) {
    long lo = start - key0, hi = end - key0;
    lo = lo < 0 ? 0 : lo > n ? n : lo;
    hi = hi < lo ? lo : hi > n ? n : hi;
    for (long c = 0; c < lo; c++) o[c] = 0.f;
    long c = lo;
    for (; c + VL <= hi; c += VL) *(v16 *)(o + c) = exp16(*(v16 *)(o + c) - mx) * inv;
    for (; c < hi; c++) o[c] = expf(o[c] - mx) * inv;
    for (c = hi; c < n; c++) o[c] = 0.f;
}

/* One task of tt_decode_attention: sequence b's query heads that share KV head g. */
static void attend(long b, long g, const float *q, const float *k_cache, const float *v_cache, const long *tables,
                   long W, const int *ctx, long H, long KVH, long D, long BS, float scale, long window,
                   float *out, const tt_probs *pr) {
    long G = H / KVH;
    long end = ctx[b], start = window > 0 && end > window ? end - window : 0;
    const float *qg = q + (b * H + g * G) * D;
    const long *kept = pr && pr->out ? pr->rows + b * PROBS_FIELDS : NULL;
    float *po = NULL;  /* this task's first head's probabilities, or NULL: the row is not captured */
    long head_stride = 0, C = 0, k_head = 0, k_start = 0;
    if (kept && kept[0] >= 0) {
        po = pr->out + kept[0] + pr->layer * kept[1] + g * G * kept[2];
        head_stride = kept[2], C = kept[3], k_head = kept[4], k_start = kept[5];
    }
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
            if (po) {  /* a kept key's score, normalised once the row's max and sum are known */
                long key = c0 + j, col = key < k_head ? key : key >= k_start ? k_head + key - k_start : -1;
                if (col >= 0 && col < C)
                    for (long i = 0; i < G; i++) po[i * head_stride + col] = s[i][j];
            }
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
        if (po) {  /* the two runs of kept columns: keys 0 .. k_head - 1, then k_start on */
            finish_probs(po + i * head_stride, k_head, 0, start, end, m[i], inv);
            finish_probs(po + i * head_stride + k_head, C - k_head, k_start, start, end, m[i], inv);
        }
    }
}

/* Work below which the second thread costs more than it brings. */
long tt_attention_work(const int *ctx, long B, long H, long D) {
    long work = 0;
    for (long b = 0; b < B; b++) work += ctx[b];
    return work * H * D;
}

/* tt_decode_attention's tasks [first, last) of B * KVH, one thread (a team's masked part). */
void tt_attention_tasks(long first, long last, const float *q, const float *k_cache, const float *v_cache,
                        const long *tables, long W, const int *ctx, long H, long KVH, long D, long BS,
                        float scale, long window, float *out, const tt_probs *pr) {
    for (long it = first; it < last; it++)
        attend(it / KVH, it % KVH, q, k_cache, v_cache, tables, W, ctx, H, KVH, D, BS, scale, window, out, pr);
}

/* Its tasks shared by the threads of the enclosing parallel region (an orphaned `omp for`:
   run by one thread outside a region): cpu_team.c calls it from inside its own. */
void tt_attention_shared(const float *q, const float *k_cache, const float *v_cache, const long *tables, long W,
                         const int *ctx, long B, long H, long KVH, long D, long BS, float scale, long window,
                         float *out, const tt_probs *pr) {
    #pragma omp for schedule(static)
    for (long it = 0; it < B * KVH; it++)
        attend(it / KVH, it % KVH, q, k_cache, v_cache, tables, W, ctx, H, KVH, D, BS, scale, window, out, pr);
}

/* q [B, H, D]; k_cache, v_cache [num_blocks, BS, KVH, D]; tables [B, W] block ids (int64);
   ctx [B] keys per sequence (int32, the new token's included); window: a sliding window
   of that many keys (0: none). out [B, H, D]. Query head h reads KV head h / (H / KVH). pr: where
   a `full` trace's probabilities go, or NULL. */
void tt_decode_attention(const float *q, const float *k_cache, const float *v_cache, const long *tables,
                         long W, const int *ctx, long B, long H, long KVH, long D, long BS, float scale,
                         long window, float *out, int nthreads, const tt_probs *pr) {
    long work = tt_attention_work(ctx, B, H, D);
    #pragma omp parallel num_threads(nthreads) if (nthreads > 1 && work >= (1 << 18))
    tt_attention_shared(q, k_cache, v_cache, tables, W, ctx, B, H, KVH, D, BS, scale, window, out, pr);
}
