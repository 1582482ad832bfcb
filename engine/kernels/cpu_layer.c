/* A decoder layer of a CPU pass over a few rows (Llama-style: RMSNorm, attention with RoPE over the
   paged KV pool, residual, RMSNorm, SwiGLU MLP, residual) in two calls, one per half: a
   MoE layer takes the attention half here and its experts in PyTorch. Optional parts
   cover Qwen3 and Gemma 3: an RMSNorm on each query and key head before RoPE, Gemma's
   "sandwich" norms on the attention's and the MLP's outputs before their residual adds,
   and GeGLU (tanh GELU) for SwiGLU's SiLU.

   The layer's parts are this library's own kernels (cpu_norm.c, cpu_linear.c,
   cpu_attention.c); what this file adds is the glue that PyTorch ran as ~15 small ops a
   layer (RoPE's roll and products, the two index_copy_ into the pool, splits, the SiLU
   and its product, the residual adds), each with its dispatch and Python around it:
   ~150 us a layer, 4-5 ms of a SmolLM2 step, more than its attention. Here they are a few
   loops over a handful of rows. engine/layers/fused.py decides when a layer takes it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vec.h"
#include "cpu_layer.h"

void tt_rms_norm(const float *x, long T, long H, long ldx, const float *w, float offset, float eps, float *y);
void tt_linear_f32(const float *x, long T, long ldx, const float *Wb, long N, long K, const float *bias,
                   float *y, long ldy, int nthreads);
int tt_linear_bf16(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                   float *y, long ldy, int nthreads);
int tt_linear_f16(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                  float *y, long ldy, int nthreads);
void tt_decode_attention(const float *q, const float *k_cache, const float *v_cache, const long *tables,
                         long W, const int *ctx, long B, long H, long KVH, long D, long BS, float scale,
                         long window, float *out, int nthreads, const tt_probs *pr);

/* y [T, N] = x [T, K] (row stride ldx) @ W.T + bias, through the kernel for p's kind.
   Returns 0, or non-zero when the int4 or 16-bit kernel could not allocate its scratch. */
static int project(const tt_layer *L, const tt_proj *p, const float *x, long T, long ldx, long N, long K,
                   float *y, int nthreads) {
    if (p->kind == 1) {
        L->linear_q8(x, T, ldx, p->w, N, K, p->bias, y, N, nthreads);
        return 0;
    }
    if (p->kind == 2) return L->linear_q4(x, T, ldx, p->w, N, K, p->bias, y, N, nthreads);
    if (p->kind == 3) return tt_linear_bf16(x, T, ldx, p->w, N, K, p->bias, y, N, nthreads);
    if (p->kind == 4) return tt_linear_f16(x, T, ldx, p->w, N, K, p->bias, y, N, nthreads);
    tt_linear_f32(x, T, ldx, p->w, N, K, p->bias, y, N, nthreads);
    return 0;
}

/* Between the qkv projection and attention: each row's q/k head norms (where the layer has
   them) and RoPE, in place in qkv [T, QS + 2 KS]; the queries copied to q [T, QS], the new K/V
   into the pool at the rows' slots. */
void tt_rope_store(const tt_layer *L, float *qkv, long T, const float *cos, const float *sin, const long *slots,
                   float *q) {
    long D = L->head_dim, QS = L->heads * D, KS = L->kv_heads * D, QKV = QS + 2 * KS;
    for (long t = 0; t < T; t++) {
        float *row = qkv + t * QKV;
        const float *c = cos + t * D, *s = sin + t * D;
        if (L->q_norm) {  /* each head's D values on their own, in place (q heads, then k heads) */
            tt_rms_norm(row, L->heads, D, D, L->q_norm, L->norm_offset, L->eps, row);
            tt_rms_norm(row + QS, L->kv_heads, D, D, L->k_norm, L->norm_offset, L->eps, row + QS);
        }
        for (long hh = 0; hh < L->heads + L->kv_heads; hh++) rope(row + hh * D, c, s, D);
        memcpy(q + t * QS, row, sizeof(float) * QS);
        if (slots[t] < 0) continue;  /* a padding row (engine/cuda_graph.py's convention): not stored */
        long at = slots[t] * KS;  /* slot s of the pool: block s / BS, row s % BS, contiguous */
        memcpy(L->k_cache + at, row + QS, sizeof(float) * KS);
        memcpy(L->v_cache + at, row + QS + KS, sizeof(float) * KS);
    }
}

/* The attention half: out = x + o(attention(rope(qkv(norm1(x))))) (with q/k head norms
   before RoPE, and the sandwich norm on o's output, where the layer has them), the new K/V written
   into the pool. x [T, hidden] -> out [T, hidden]. Each row is a query of its own (a
   decode step's sequences, or the rows of a verify pass or short prefill chunk): its
   position's cos/sin [T, head_dim], its K/V slot, its sequence's block table row [T, W]
   and the keys it sees (its position + 1). Every row's K/V is stored before any row
   attends, so the rows of one sequence see each other causally. q_out [T, heads *
   head_dim] or NULL: the rotated queries, for a trace that computes attention
   probabilities after the pass; pr: where the pass's attention writes them itself, or NULL.
   Returns 0, or -1 when scratch memory could not be allocated. */
int tt_decode_attention_block(const tt_layer *L, const float *x, long T, const float *cos, const float *sin,
                              const long *slots, const long *tables, long W, const int *ctx, float *out,
                              float *q_out, int nthreads, const tt_probs *pr) {
    long Hd = L->hidden, D = L->head_dim, QS = L->heads * D, KS = L->kv_heads * D, QKV = QS + 2 * KS;
    float *buf = malloc(sizeof(float) * T * (Hd + QKV + 2 * QS + Hd));
    if (!buf) return -1;
    float *h = buf, *qkv = h + T * Hd, *q = qkv + T * QKV, *att = q + T * QS, *tmp = att + T * QS;
    tt_rms_norm(x, T, Hd, Hd, L->norm1, L->norm_offset, L->eps, h);
    if (project(L, &L->qkv, h, T, Hd, QKV, Hd, qkv, nthreads)) {
        free(buf);
        return -1;
    }
    tt_rope_store(L, qkv, T, cos, sin, slots, q);
    if (q_out) memcpy(q_out, q, sizeof(float) * T * QS);
    tt_decode_attention(q, L->k_cache, L->v_cache, tables, W, ctx, T, L->heads, L->kv_heads, D, L->block_size,
                        L->scale, L->window, att, nthreads, pr);
    int rc = project(L, &L->o, att, T, QS, Hd, QS, tmp, nthreads);
    if (L->post_attn_norm) tt_rms_norm(tmp, T, Hd, Hd, L->post_attn_norm, L->norm_offset, L->eps, tmp);
    for (long i = 0; i < T * Hd; i++) out[i] = x[i] + tmp[i];
    free(buf);
    return rc ? -1 : 0;
}

/* The MLP half, in place: x += down(act(gate(norm2(x))) * up(norm2(x))), act SiLU or tanh
   GELU, the sandwich norm on down's output where the layer has it. x [T, hidden]. */
int tt_decode_mlp_block(const tt_layer *L, float *x, long T, int nthreads) {
    long Hd = L->hidden, I = L->inter;
    float *buf = malloc(sizeof(float) * T * (Hd + 3 * I + Hd));
    if (!buf) return -1;
    float *h = buf, *gu = h + T * Hd, *act = gu + T * 2 * I, *tmp = act + T * I;
    tt_rms_norm(x, T, Hd, Hd, L->norm2, L->norm_offset, L->eps, h);
    if (project(L, &L->gate_up, h, T, Hd, 2 * I, Hd, gu, nthreads)) {
        free(buf);
        return -1;
    }
    for (long t = 0; t < T; t++) act_mul(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I, (int)L->gelu);
    int rc = project(L, &L->down, act, T, I, Hd, I, tmp, nthreads);
    if (L->post_mlp_norm) tt_rms_norm(tmp, T, Hd, Hd, L->post_mlp_norm, L->norm_offset, L->eps, tmp);
    for (long i = 0; i < T * Hd; i++) x[i] += tmp[i];
    free(buf);
    return rc ? -1 : 0;
}

int tt_team_fits(const tt_stack_layer *layers, long L);
int tt_team_stack(const tt_stack_layer *layers, long L, float *x, float *out, long T, const float *rope_rows,
                  long D, const long *slots, const long *tables, long W, const int *ctx,
                  const tt_stack_capture *cap, int nthreads, float **result);
int tt_moe_block(const void *M, const float *norm, float offset, float eps, float *x, long T, long *experts,
                 float *weights, int nthreads);

/* Every layer of a pass in one call: out [T, hidden] = the final RMSNorm (final_norm [hidden],
   offset, eps) of the layers over x [T, hidden] (x is overwritten: the two take turns as a
   layer's input and output). At batch 1 on the embedded MoE, the Python around each layer's
   two calls (plan checks, argument packing, the outputs' tensors) cost about what the layer's
   arithmetic did; the RoPE rows and the final norm were three more calls a step. cos / sin:
   each RoPE table [rows][D] whole, read at the tokens' positions pos [T]. experts / weights:
   [T, top_k] scratch for the MoE layers' routing. cap: what a `full` trace keeps of each
   layer (NULL: nothing), the same arithmetic either way. Returns 0; -1 when a layer's scratch
   could not be allocated; -2 for a position outside the tables (nothing computed). */
int tt_decode_stack(const tt_stack_layer *layers, long L, float *x, float *out, long T, const float *const *cos,
                    const float *const *sin, long ntables, long rows, long D, const long *pos, const long *slots,
                    const long *tables, long W, const int *ctx, long *experts, float *weights,
                    const tt_stack_capture *cap, const float *final_norm, float offset, float eps, int nthreads,
                    int team) {
    for (long t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= rows) return -2;
    const long Hd = layers[0].layer->hidden;
    float *rope = malloc(sizeof(float) * 2 * ntables * T * D);  /* each table's rows at pos: [table][cos|sin][T][D] */
    if (!rope) return -1;
    for (long r = 0; r < ntables; r++)
        for (long t = 0; t < T; t++) {
            memcpy(rope + ((2 * r) * T + t) * D, cos[r] + pos[t] * D, sizeof(float) * D);
            memcpy(rope + ((2 * r + 1) * T + t) * D, sin[r] + pos[t] * D, sizeof(float) * D);
        }
    float *cur = x, *nxt = out;
    int rc = 0;
    if (team && nthreads > 1 && tt_team_fits(layers, L)) {  /* one parallel region for the pass (cpu_team.c) */
        rc = tt_team_stack(layers, L, x, out, T, rope, D, slots, tables, W, ctx, cap, nthreads, &cur);
        L = 0;
    }
    for (long i = 0; i < L && !rc; i++) {
        const tt_stack_layer *s = &layers[i];
        const float *c = rope + (2 * s->rope) * T * D, *sn = rope + (2 * s->rope + 1) * T * D;
        float *q = cap && cap->q ? cap->q[i] : NULL;
        long *e = cap && cap->experts ? cap->experts + i * T * cap->top_k : experts;
        float *w = cap && cap->weights ? cap->weights + i * T * cap->top_k : weights;
        if (cap && cap->resid) memcpy(cap->resid + i * T * Hd, cur, sizeof(float) * T * Hd);
        tt_probs pr = {0};
        if (cap && cap->probs.out && cap->probs_at[i] >= 0) pr = cap->probs, pr.layer = cap->probs_at[i];
        rc = tt_decode_attention_block(s->layer, cur, T, c, sn, slots, tables, W, ctx, nxt, q, nthreads,
                                       pr.out ? &pr : NULL);
        if (!rc) rc = s->moe ? tt_moe_block(s->moe, s->moe_norm, s->moe_offset, s->moe_eps, nxt, T, e, w, nthreads)
                             : tt_decode_mlp_block(s->layer, nxt, T, nthreads);
        float *t = cur;
        cur = nxt;
        nxt = t;
    }
    free(rope);
    if (rc) return -1;
    tt_rms_norm(cur, T, Hd, Hd, final_norm, offset, eps, out);  /* row by row: in place where cur is out */
    return 0;
}
