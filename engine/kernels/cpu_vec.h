/* The vector types and helpers the float kernels share (cpu_linear.c, cpu_attention.c,
   cpu_norm.c, cpu_stats.c). GCC vector extensions, not intrinsics: v16 is one AVX-512
   register on a CPU that has it (-march=native), two AVX2 registers on one that has not,
   and the same source builds on other ISAs. aligned(4): loads through a v16 pointer may
   be unaligned. */
#ifndef TT_CPU_VEC_H
#define TT_CPU_VEC_H

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int v16i __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
#define VL 16  /* floats per vector */

/* e^x for 16 lanes, x <= 0 (values minus their max): 2^n * p(r) with x = n ln2 + r,
   |r| <= ln2 / 2, p a degree-6 polynomial (Cephes' expf): within 2 ulp of expf. */
static inline v16 exp16(v16 x) {
    v16i low = x < -87.3f;  /* below: 0 in float32 anyway */
    x = (v16)(((v16i)x & ~low) | ((v16i)((v16){0} - 87.3f) & low));
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

/* 1 / (1 + e^-z), 16 lanes: e = e^-|z| from exp16 (its argument <= 0 whatever z's sign),
   then 1 / (1 + e) for z >= 0 and e / (1 + e) below (no 1 - tiny cancellation). */
static inline v16 sigmoid16(v16 z) {
    v16i neg = z < 0, sign = (v16i){0} + (-2147483647 - 1);
    v16 e = exp16((v16)((v16i)z | sign));  /* -|z|: the sign bit set */
    v16 d = 1.0f + e;
    return (v16)(((v16i)(1.0f / d) & ~neg) | ((v16i)(e / d) & neg));
}

/* act = act_fn(g) * u over n values: SiLU g * sigmoid(g), or (gelu) PyTorch's tanh GELU
   0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) = g * sigmoid(2 sqrt(2 / pi) (...)).
   16 lanes at a time; the scalar expf / tanhf took ~15 cycles a value (SiLU: ~2 ms of a
   SmolLM2 step at 8 rows, one thread). */
static inline v16 act16(v16 g, int gelu) {
    return g * sigmoid16(gelu ? 1.5957691216057308f * (g + 0.044715f * g * g * g) : g);
}

static inline void act_mul(const float *g, const float *u, float *act, long n, int gelu) {
    long i = 0;
    for (; i + VL <= n; i += VL)
        *(v16 *)(act + i) = act16(*(const v16 *)(g + i), gelu) * *(const v16 *)(u + i);
    if (i < n) {  /* the tail through a zero-padded vector */
        v16 gt = {0}, ut = {0};
        for (long j = i; j < n; j++) gt[j - i] = g[j], ut[j - i] = u[j];
        v16 a = act16(gt, gelu) * ut;
        for (long j = i; j < n; j++) act[j] = a[j - i];
    }
}

static inline float hsum(v16 v) {  /* a tree of halves: 4 adds, not 15 in a chain */
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

#endif
