/* A sparse mixture-of-experts block over a few rows in one call: the router (softmax,
   top-k, renormalised where the model says so) and each chosen expert's SwiGLU
   (down(silu(gate(x)) * up(x))), weighted and summed per row.

   Why one call: at batch 1 on a small model the matrices take microseconds, and what
   PyTorch ran around them (the router's softmax and top-k, reading the choice back to
   Python, per expert a slice, two linears, SiLU, a product, a scale and an add: ~15
   small ops with their dispatch and Python a layer) cost more than the products
   themselves. Each expert's weights are blocked (cpu_linear.c / cpu_linear16.c) and
   stored one expert after another: the only copy of them. The experts are visited in
   index order, each over the rows that chose it, and their weighted outputs added in
   that order, as transformers' Mixtral does. engine/layers/moe_cpu.py calls it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vec.h"

void tt_linear_f32(const float *x, long T, long ldx, const float *Wb, long N, long K, const float *bias,
                   float *y, long ldy, int nthreads);
int tt_linear_bf16(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                   float *y, long ldy, int nthreads);
int tt_linear_f16(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                  float *y, long ldy, int nthreads);

typedef struct {
    long hidden, inter, experts, top_k, norm_topk;
    long kind;                  /* the experts' weights: 0 float32, 3 bfloat16, 4 float16 (cpu_layer.c's kinds) */
    const void *router;         /* the router's blocked weight [experts, hidden], or NULL: routing given */
    long router_kind;
    const char *gate_up;        /* expert e's [2 inter, hidden] at gate_up + e * gate_up_stride (bytes) */
    const char *down;           /* expert e's [hidden, inter] at down + e * down_stride */
    long gate_up_stride, down_stride;
} tt_moe;

static int project(long kind, const void *w, const float *x, long T, long N, long K, float *y, int nthreads) {
    if (kind == 3) return tt_linear_bf16(x, T, K, w, N, K, 0, y, N, nthreads);
    if (kind == 4) return tt_linear_f16(x, T, K, w, N, K, 0, y, N, nthreads);
    tt_linear_f32(x, T, K, w, N, K, 0, y, N, nthreads);
    return 0;
}

/* Each row's top_k experts by router probability, largest first (torch.topk's order; a
   tie keeps the lower index first), and their probabilities (renormalised to sum 1
   where norm_topk). logits [T, E] -> experts [T, k], weights [T, k]. */
static void route(const tt_moe *M, const float *logits, long T, long *experts, float *weights) {
    long E = M->experts, k = M->top_k;
    for (long t = 0; t < T; t++) {
        const float *l = logits + t * E;
        float max = l[0], sum = 0.f;
        for (long e = 1; e < E; e++) max = l[e] > max ? l[e] : max;
        float p[E];
        for (long e = 0; e < E; e++) sum += p[e] = expf(l[e] - max);
        long *ex = experts + t * k;
        float *w = weights + t * k, chosen = 0.f;
        for (long j = 0; j < k; j++) {
            long best = -1;
            for (long e = 0; e < E; e++) {
                int taken = 0;
                for (long i = 0; i < j; i++) taken |= ex[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ex[j] = best;
            chosen += w[j] = p[best] / sum;
        }
        if (M->norm_topk)
            for (long j = 0; j < k; j++) w[j] /= chosen;
    }
}

/* out [T, hidden] = the routed experts' weighted sum for rows x [T, hidden]. route: 1 to
   run the router and write experts / weights [T, top_k], 0 to read them as given.
   Returns 0, or -1 when scratch memory could not be allocated. */
int tt_moe_forward(const tt_moe *M, const float *x, long T, long *experts, float *weights, int route_rows,
                   float *out, int nthreads) {
    long H = M->hidden, I = M->inter, E = M->experts, k = M->top_k;
    float *buf = malloc(sizeof(float) * T * (H + 3 * I + H + E) + sizeof(long) * T + sizeof(float) * T);
    if (!buf) return -1;
    float *xs = buf, *gu = xs + T * H, *act = gu + T * 2 * I, *y = act + T * I, *logits = y + T * H;
    float *w_of = logits + T * E;
    long *rows = (long *)(w_of + T);
    int rc = 0;
    if (route_rows) {
        rc |= project(M->router_kind, M->router, x, T, E, H, logits, nthreads);
        route(M, logits, T, experts, weights);
    }
    memset(out, 0, sizeof(float) * T * H);
    for (long e = 0; e < E && !rc; e++) {
        long n = 0;
        for (long t = 0; t < T; t++)
            for (long j = 0; j < k; j++)
                if (experts[t * k + j] == e) {
                    rows[n] = t;
                    w_of[n++] = weights[t * k + j];
                }
        if (!n) continue;
        const float *in = x;
        if (n != T) {  /* the rows that chose e, gathered; all of them are read in place */
            for (long i = 0; i < n; i++) memcpy(xs + i * H, x + rows[i] * H, sizeof(float) * H);
            in = xs;
        }
        rc |= project(M->kind, M->gate_up + e * M->gate_up_stride, in, n, 2 * I, H, gu, nthreads);
        for (long i = 0; i < n; i++) act_mul(gu + i * 2 * I, gu + i * 2 * I + I, act + i * I, I, 0);
        rc |= project(M->kind, M->down + e * M->down_stride, act, n, H, I, y, nthreads);
        for (long i = 0; i < n; i++) {
            float *o = out + rows[i] * H;
            const float *yi = y + i * H, w = w_of[i];
            for (long c = 0; c < H; c++) o[c] += yi[c] * w;
        }
    }
    free(buf);
    return rc ? -1 : 0;
}

void tt_rms_norm(const float *x, long T, long H, long ldx, const float *w, float offset, float eps, float *y);

/* A decoder layer's whole MoE half, in place: x += moe(rms_norm(x)), routed here; experts /
   weights [T, top_k] receive the routing (for a trace). x [T, hidden]. */
int tt_moe_block(const tt_moe *M, const float *norm, float offset, float eps, float *x, long T, long *experts,
                 float *weights, int nthreads) {
    long H = M->hidden;
    float *buf = malloc(sizeof(float) * 2 * T * H);
    if (!buf) return -1;
    float *h = buf, *out = buf + T * H;
    tt_rms_norm(x, T, H, H, norm, offset, eps, h);
    int rc = tt_moe_forward(M, h, T, experts, weights, 1, out, nthreads);
    if (!rc)
        for (long i = 0; i < T * H; i++) x[i] += out[i];
    free(buf);
    return rc;
}
