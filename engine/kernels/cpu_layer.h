/* The structs a pass's layers are described by (filled by engine/layers/fused.py, field for
   field) and the helpers cpu_layer.c and cpu_team.c share. */
#ifndef TT_CPU_LAYER_H
#define TT_CPU_LAYER_H

/* A projection's weight as one of the kernels reads it: kind 0 float32 blocked
   (cpu_linear.c), 1 int8 or 2 int4 records (cpu_quant.c, a library of its own: its
   functions arrive as pointers in tt_layer), 3 bfloat16 or 4 float16 blocked
   (cpu_linear16.c). */
typedef struct {
    const void *w;
    const float *bias;  /* or NULL */
    long kind;
} tt_proj;

typedef void (*linear_q8_fn)(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                             float *y, long ldy, int nthreads);
typedef int (*linear_q4_fn)(const float *x, long T, long ldx, const void *Wb, long N, long K, const float *bias,
                            float *y, long ldy, int nthreads);

/* What does not change from step to step: sizes, weights, this layer's part of the KV
   pool. Filled once per layer by engine/layers/fused.py (gate_up and down unused for a
   layer whose MLP half is not fused). */
typedef struct {
    long hidden, heads, kv_heads, head_dim, inter, block_size, window;  /* window 0: none */
    float eps, norm_offset, scale;
    const float *norm1, *norm2;                                /* [hidden] */
    tt_proj qkv, o, gate_up, down;
    float *k_cache, *v_cache;                                  /* [blocks, block_size, kv_heads, head_dim] */
    linear_q8_fn linear_q8;                                    /* NULL where no projection is quantized */
    linear_q4_fn linear_q4;
    const float *q_norm, *k_norm;                              /* [head_dim] per-head norms, or NULL */
    const float *post_attn_norm, *post_mlp_norm;               /* [hidden] sandwich norms, or NULL */
    long gelu;                                                 /* 1: GeGLU (tanh GELU), 0: SwiGLU (SiLU) */
} tt_layer;

/* One layer of a stack (tt_decode_stack): its fused attention half, then its MLP half, dense
   (in `layer`) or a MoE's (cpu_moe.c's tt_moe_block) where `moe` is set. */
typedef struct {
    const tt_layer *layer;
    const void *moe;         /* cpu_moe.c's tt_moe, or NULL */
    const float *moe_norm;   /* the RMSNorm before the MoE half [hidden] */
    float moe_offset, moe_eps;
    long rope;               /* which of the cos/sin tables the layer rotates by (Gemma: local or global) */
} tt_stack_layer;

/* Where a pass's attention writes a `full` trace's attention probabilities (engine/trace/capture.py's
   AttentionCapture: [layers, heads, rows, C] per sequence): rows[t * PROBS_FIELDS ...] says, for row t of
   the pass, where its layer-0 head-0 row starts in `out` (-1: the row is not captured), the floats between
   its captured layers and between its heads, its C columns, and which keys they are: 0 .. k_head - 1, then
   k_start on. `layer`: the captured layer's index in the call at hand. Each head's softmax is over every
   key its row sees (as cpu_probs.c computes it after a pass); a key it does not see reads 0. */
#define PROBS_FIELDS 6
typedef struct {
    float *out;
    const long *rows;
    long layer;
} tt_probs;

/* What a `full` trace keeps of a stack's pass (engine/layers/fused.py stack_forward), each part
   NULL where nobody reads it: q[i] layer i's rotated queries [T, heads * head_dim] (q itself
   NULL, or an entry NULL: none kept); experts / weights [L, T, top_k] each MoE layer's routing
   (layer i's at i * T * top_k; a dense layer's left as it was); resid [L, T, hidden] each
   layer's input, the residual stream the logit lens reads. */
typedef struct {
    float *const *q;
    long *experts;
    float *weights;
    long top_k;
    float *resid;
    tt_probs probs;        /* the attention probabilities, written by the pass's own attention (probs.out NULL: none) */
    const long *probs_at;  /* [L]: layer i's index among the captured layers, -1: not captured */
} tt_stack_capture;

/* RoPE on one head in place, the engine's rotate-half layout (engine/layers/rotary.py):
   v * cos + roll(v, D/2) * sin, where sin carries rotate-half's minus sign in its first half. */
static inline void rope(float *v, const float *cos, const float *sin, long D) {
    long half = D / 2;
    for (long i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        v[i] = a * cos[i] + b * sin[i];
        v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

#endif
