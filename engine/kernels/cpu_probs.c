/* A `full` trace's attention probabilities (engine/trace/capture.py), read from the paged
   KV pool in place.

   The trace shows, for a sequence's last `rows` query positions in each captured layer,
   each head's softmax over every key it sees, of which it keeps some columns: keys
   [0, k_head) and [k_start, ctx). PyTorch's way gathers the sequence's keys in every layer
   into one copy (index_select over its blocks: layers x context x KV heads x head dim
   floats, a step), then scores and normalises them all; here each (layer, row, KV head)
   is one task that scores its keys where the pool holds them, normalises over all of them
   and writes only the kept columns. Masked keys (after the row's position, or before a
   sliding window) are 0, as HF's masked softmax gives. Built with the float kernels
   (engine/kernels/cpu.py SOURCES). */
#include <math.h>
#include <stdlib.h>

#include "cpu_vec.h"

static inline float dot_probs(const float *a, const float *b, long D) {
    v16 acc = {0};
    long d = 0;
    for (; d + VL <= D; d += VL) acc += *(const v16 *)(a + d) * *(const v16 *)(b + d);
    float s = 0.f;
    for (int t = 0; t < VL; t++) s += acc[t];
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* One task: captured layer l (the pool's layer layers[l]), row r, the query heads sharing KV
   head g. Returns -1 without memory. */
static int probs_task(long l, long r, long g, const float *q, long q_layer, long q_row, const float *k_cache,
                      long k_layer, const long *layers, const long *table, long ctx, long rows, long H, long KVH, long D, long BS,
                      float scale, const long *windows, long k_head, long k_start, long C, float *out) {
    long G = H / KVH, pos = ctx - rows + r;  /* the row's position: it sees keys lo .. pos */
    long w = windows[l], lo = w > 0 && pos + 1 > w ? pos + 1 - w : 0;
    long n = pos + 1 - lo;
    float *s = malloc(sizeof(float) * (size_t)(G * n));
    if (!s) return -1;
    const float *kl = k_cache + layers[l] * k_layer;
    const float *qr = q + l * q_layer + r * q_row + g * G * D;
    for (long j = 0; j < n; j++) {
        long key = lo + j;
        const float *k = kl + ((table[key / BS] * BS + key % BS) * KVH + g) * D;
        for (long i = 0; i < G; i++) s[i * n + j] = dot_probs(qr + i * D, k, D) * scale;
    }
    for (long i = 0; i < G; i++) {
        float *si = s + i * n, mx = -INFINITY, sum = 0.f;
        for (long j = 0; j < n; j++) mx = si[j] > mx ? si[j] : mx;
        long j = 0;
        for (; j + VL <= n; j += VL) {
            v16 e = exp16(*(v16 *)(si + j) - mx);
            *(v16 *)(si + j) = e;
            for (int t = 0; t < VL; t++) sum += e[t];
        }
        for (; j < n; j++) sum += (si[j] = expf(si[j] - mx));
        float inv = 1.f / sum;
        float *o = out + ((l * H + g * G + i) * rows + r) * C;
        for (long c = 0; c < C; c++) {
            long key = c < k_head ? c : k_start + c - k_head;
            o[c] = key >= lo && key <= pos ? si[key - lo] * inv : 0.f;
        }
    }
    free(s);
    return 0;
}

/* q: the captured queries, row r of captured layer l at q + l * q_layer + r * q_row, [H, D]
   each; layers [L]: the pool's layer of each; k_cache: pool layer i's keys at k_cache + i *
   k_layer, [num_blocks, BS, KVH, D]; table: the sequence's block ids (int64); the rows are
   the last `rows` positions of a context of ctx keys; windows [L]: each layer's sliding
   window (0: none). out [L, H, rows, C], C = k_head + ctx - k_start. Query head h reads KV
   head h / (H / KVH). Returns 0, or -1 when a task had no memory for its scores. A second
   thread only past ~1 M multiply-adds: below, waking it costs about what it saves (and on a
   busy machine, waiting for it far more). */
int tt_attention_probs(const float *q, long L, long q_layer, long q_row, const float *k_cache, long k_layer,
                       const long *layers, const long *table, long ctx, long rows, long H, long KVH, long D,
                       long BS, float scale, const long *windows, long k_head, long k_start, float *out,
                       int nthreads) {
    long C = k_head + ctx - k_start, tasks = L * rows * KVH;
    int failed = 0;
    #pragma omp parallel for num_threads(nthreads) schedule(static) reduction(|:failed) \
        if (nthreads > 1 && tasks > 1 && L * rows * ctx * H * D >= (1 << 20))
    for (long it = 0; it < tasks; it++) {
        long l = it / (rows * KVH), r = it / KVH % rows, g = it % KVH;
        failed |= probs_task(l, r, g, q, q_layer, q_row, k_cache, k_layer, layers, table, ctx, rows, H, KVH, D,
                             BS, scale, windows, k_head, k_start, C, out) != 0;
    }
    return failed ? -1 : 0;
}
