/* Every layer of a dense pass over a few rows in ONE OpenMP parallel region (the team path of
   cpu_layer.c's tt_decode_stack).

   At batch 1 a step is the weights streaming from memory, four matrices a layer. Called one
   by one, each matrix is a parallel region of its own: the team forks, splits the blocks,
   joins, and between two matrices one thread does the layer's small serial work (norms,
   RoPE, the KV store, attention over a short context, the activation) while the other waits
   and the memory bus idles. Here the threads stay together for the whole pass: a matrix is an
   orphaned `omp for` (cpu_linear.c, cpu_linear16.c) ending in a barrier, the serial parts run
   on thread 0, and meanwhile every other thread asks for the first lines of its own share of
   the next matrix, so its stream has started when the matrix does. Each output value is
   computed by the same code as on the per-matrix path (bit-identical; tests compare them).

   Dense layers with float32, bfloat16 or float16 projections only (tt_team_fits): a MoE's
   experts and the quantized kernels (another library) keep the per-matrix path. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vec.h"
#include "cpu_layer.h"

void tt_rms_norm(const float *x, long T, long H, long ldx, const float *w, float offset, float eps, float *y);
void tt_rope_store(const tt_layer *L, float *qkv, long T, const float *cos, const float *sin, const long *slots,
                   float *q);
void tt_linear_f32_shared(const float *x, long T, long ldx, const float *Wb, long N, long K, const float *bias,
                          float *y, long ldy);
long tt_linear16_scratch(long T, long K);
void tt_linear16_prepare(long kind, const float *x, long T, long ldx, long K, void *scratch);
void tt_linear16_shared(long kind, const void *scratch, long T, const unsigned short *Wb, long N, long K,
                        const float *bias, float *y, long ldy);
long tt_attention_work(const int *ctx, long B, long H, long D);
void tt_attention_tasks(long first, long last, const float *q, const float *k_cache, const float *v_cache,
                        const long *tables, long W, const int *ctx, long H, long KVH, long D, long BS,
                        float scale, long window, float *out, const tt_probs *pr);
void tt_attention_shared(const float *q, const float *k_cache, const float *v_cache, const long *tables, long W,
                         const int *ctx, long B, long H, long KVH, long D, long BS, float scale, long window,
                         float *out, const tt_probs *pr);

#define PREFETCH_BYTES (32 << 10)  /* of each thread's share, asked for while thread 0 works alone */

/* 1 where every layer is dense and every projection float32 or 16-bit. */
int tt_team_fits(const tt_stack_layer *layers, long L) {
    for (long i = 0; i < L; i++) {
        const tt_layer *l = layers[i].layer;
        if (layers[i].moe) return 0;
        const tt_proj *p[4] = {&l->qkv, &l->o, &l->gate_up, &l->down};
        for (int j = 0; j < 4; j++)
            if (p[j]->kind != 0 && p[j]->kind != 3 && p[j]->kind != 4) return 0;
    }
    return 1;
}

/* One matrix of the pass: its weight, size, and where its input and output live. */
typedef struct {
    const tt_proj *p;
    long N, K;
} matrix;

/* x [T, K] as the matrix's blocks read it: float32 as it is, 16-bit prepared in scratch. */
static const void *prepared(matrix m, const float *x, long T, void *scratch) {
    if (m.p->kind == 0) return x;
    tt_linear16_prepare(m.p->kind, x, T, m.K, m.K, scratch);
    return scratch;
}

/* The blocks of y [T, N] shared by the team (ends in the `omp for`'s barrier). */
static void multiply(matrix m, const void *x, long T, float *y) {
    if (m.p->kind == 0) tt_linear_f32_shared(x, T, m.K, m.p->w, m.N, m.K, m.p->bias, y, m.N);
    else tt_linear16_shared(m.p->kind, x, T, m.p->w, m.N, m.K, m.p->bias, y, m.N);
}

/* This thread's share of m's blocks under schedule(static) (libgomp's split: the first
   nblocks % nt threads one block more), its first PREFETCH_BYTES asked for into L2. */
static void prefetch_share(matrix m, int tid, int nt) {
    long nblocks = (m.N + 7) / 8;  /* 8 output rows a block in both layouts */
    long block = m.p->kind == 0 ? 8 * ((m.K + 15) / 16 * 16) * 4 : 8 * ((m.K + 31) / 32 * 32) * 2;
    long q = nblocks / nt, r = nblocks % nt, first = tid * q + (tid < r ? tid : r), n = q + (tid < r);
    long bytes = n * block < PREFETCH_BYTES ? n * block : PREFETCH_BYTES;
    const char *w = (const char *)m.p->w + first * block;
    for (long at = 0; at < bytes; at += 64) __builtin_prefetch(w + at, 0, 2);
}

/* The scratch rows of the widest layer, carved from one allocation. */
typedef struct {
    float *h, *qkv, *q, *att, *tmp, *gu, *act;
    void *prep;  /* a 16-bit matrix's prepared input */
    void *base;
} rows;

static int carve(rows *s, const tt_stack_layer *layers, long L, long T) {
    long hd = 0, qkv = 0, qs = 0, inter = 0, prep = 0;
    for (long i = 0; i < L; i++) {
        const tt_layer *l = layers[i].layer;
        long d = l->head_dim, q = l->heads * d, k = l->kv_heads * d;
        hd = hd > l->hidden ? hd : l->hidden, qs = qs > q ? qs : q, inter = inter > l->inter ? inter : l->inter;
        qkv = qkv > q + 2 * k ? qkv : q + 2 * k;
        long widest = l->hidden > q ? l->hidden : q;
        widest = widest > l->inter ? widest : l->inter;
        long need = tt_linear16_scratch(T, widest);
        prep = prep > need ? prep : need;
    }
    long floats = T * (2 * hd + qkv + 2 * qs + 3 * inter);
    long bytes = (floats * (long)sizeof(float) + 63) / 64 * 64 + prep;
    s->base = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!s->base) return -1;
    s->prep = s->base;
    float *f = (float *)((char *)s->base + prep);
    s->h = f, s->tmp = f + T * hd, s->qkv = s->tmp + T * hd, s->q = s->qkv + T * qkv;
    s->att = s->q + T * qs, s->gu = s->att + T * qs, s->act = s->gu + 2 * T * inter;
    return 0;
}

/* x [T, hidden] through the layers (x and out take turns; *result: the one holding the last
   layer's output). rope: each table's rows at the tokens' positions, [table][cos|sin][T][D].
   Returns 0, or -1 when the scratch rows could not be allocated. */
int tt_team_stack(const tt_stack_layer *layers, long L, float *x, float *out, long T, const float *rope_rows,
                  long D, const long *slots, const long *tables, long W, const int *ctx,
                  const tt_stack_capture *cap, int nthreads, float **result) {
    rows s;
    if (carve(&s, layers, L, T)) return -1;
    #pragma omp parallel num_threads(nthreads)
    {
        int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        float *cur = x, *nxt = out;
        for (long i = 0; i < L; i++) {
            const tt_layer *l = layers[i].layer;
            long hd = l->hidden, qs = l->heads * l->head_dim, qkv = qs + 2 * l->kv_heads * l->head_dim;
            matrix mq = {&l->qkv, qkv, hd}, mo = {&l->o, hd, qs};
            matrix mg = {&l->gate_up, 2 * l->inter, hd}, md = {&l->down, hd, l->inter};
            const float *c = rope_rows + (2 * layers[i].rope) * T * D, *sn = c + T * D;
            if (tid == 0) {
                if (cap && cap->resid) memcpy(cap->resid + i * T * hd, cur, sizeof(float) * T * hd);
                tt_rms_norm(cur, T, hd, hd, l->norm1, l->norm_offset, l->eps, s.h);
                prepared(mq, s.h, T, s.prep);
            } else prefetch_share(mq, tid, nt);
            #pragma omp barrier
            multiply(mq, mq.p->kind == 0 ? (const void *)s.h : s.prep, T, s.qkv);
            long work = tt_attention_work(ctx, T, l->heads, l->head_dim);
            tt_probs pr = {0};  /* a `full` trace's probabilities, written by the attention itself */
            if (cap && cap->probs.out && cap->probs_at[i] >= 0) pr = cap->probs, pr.layer = cap->probs_at[i];
            int shared = nt > 1 && work >= (1 << 18);  /* as tt_decode_attention decides */
            if (tid == 0) {
                tt_rope_store(l, s.qkv, T, c, sn, slots, s.q);
                if (cap && cap->q && cap->q[i]) memcpy(cap->q[i], s.q, sizeof(float) * T * qs);
                if (!shared) {  /* a short context: attention alone, then o's input */
                    tt_attention_tasks(0, T * l->kv_heads, s.q, l->k_cache, l->v_cache, tables, W, ctx, l->heads,
                                       l->kv_heads, l->head_dim, l->block_size, l->scale, l->window, s.att,
                                       pr.out ? &pr : NULL);
                    prepared(mo, s.att, T, s.prep);
                }
            } else if (!shared) prefetch_share(mo, tid, nt);
            #pragma omp barrier
            if (shared) {  /* a long one: its tasks shared, as tt_decode_attention shares them */
                tt_attention_shared(s.q, l->k_cache, l->v_cache, tables, W, ctx, T, l->heads, l->kv_heads,
                                    l->head_dim, l->block_size, l->scale, l->window, s.att, pr.out ? &pr : NULL);
                if (mo.p->kind != 0) {
                    if (tid == 0) prepared(mo, s.att, T, s.prep);
                    #pragma omp barrier
                }
            }
            multiply(mo, mo.p->kind == 0 ? (const void *)s.att : s.prep, T, s.tmp);
            if (tid == 0) {
                if (l->post_attn_norm) tt_rms_norm(s.tmp, T, hd, hd, l->post_attn_norm, l->norm_offset, l->eps, s.tmp);
                for (long j = 0; j < T * hd; j++) nxt[j] = cur[j] + s.tmp[j];
                tt_rms_norm(nxt, T, hd, hd, l->norm2, l->norm_offset, l->eps, s.h);
                prepared(mg, s.h, T, s.prep);
            } else prefetch_share(mg, tid, nt);
            #pragma omp barrier
            multiply(mg, mg.p->kind == 0 ? (const void *)s.h : s.prep, T, s.gu);
            if (tid == 0) {
                long I = l->inter;
                for (long t = 0; t < T; t++)
                    act_mul(s.gu + t * 2 * I, s.gu + t * 2 * I + I, s.act + t * I, I, (int)l->gelu);
                prepared(md, s.act, T, s.prep);
            } else prefetch_share(md, tid, nt);
            #pragma omp barrier
            multiply(md, md.p->kind == 0 ? (const void *)s.act : s.prep, T, s.tmp);
            if (tid == 0) {
                if (l->post_mlp_norm) tt_rms_norm(s.tmp, T, hd, hd, l->post_mlp_norm, l->norm_offset, l->eps, s.tmp);
                for (long j = 0; j < T * hd; j++) nxt[j] += s.tmp[j];
            }
            /* the next layer's first serial part is thread 0's too: no barrier needed before it */
            float *t = cur;
            cur = nxt;
            nxt = t;
        }
        if (tid == 0) *result = cur;
    }
    free(s.base);
    return 0;
}
