/* What the trace shows of a softmax over the vocabulary, from the logits, without
   computing the softmax: per row its top candidates, its maximum and log normaliser
   (so any token's probability is exp(z - lse)), its entropy, how many tokens keep a
   nonzero float32 probability, and how many logits exceed a chosen token's (its rank).

   PyTorch needs ~8 vocabulary-sized ops for these (softmax, topk, a comparison and its
   sum, log, a product, nansum), each a pass over the row and a fresh tensor: ~90 us a
   row at 4k tokens, ~0.5 ms at 49k, and the logit lens has 31 rows per token. Here a
   row is read three times while it sits in L2: max, top-k and the rank; the
   exponentials' sums; the count of nonzero probabilities. */
#include <math.h>

#include "cpu_vec.h"

/* Insert (value, id) into the top list (vals descending; among equal values the lower id
   first, as it arrives first) of length `filled` <= k; returns the new length. */
static inline int insert(double *vals, double *ids, int filled, int k, float v, long id) {
    int at = filled < k ? filled : k - 1;
    while (at > 0 && vals[at - 1] < v) {
        if (at < k) vals[at] = vals[at - 1], ids[at] = ids[at - 1];
        at--;
    }
    vals[at] = v, ids[at] = (double)id;
    return filled < k ? filled + 1 : k;
}

static inline v16 vmax(v16 a, v16 b) {  /* lane-wise */
    v16i keep_a = a > b;
    return (v16)(((v16i)a & keep_a) | ((v16i)b & ~keep_a));
}

static inline float hmax(v16 v) {
    v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) m = a[l] > m ? a[l] : m, m = b[l] > m ? b[l] : m;
    return m;
}

static void row_stats(const float *z, long V, int k, long chosen, double *out) {
    double *top_ids = out + 6, *top_z = out + 6 + k;  /* filled in place: k may be the whole vocabulary */
    /* pass 1: maximum, top k, logits above the chosen token's.
       A block of 4 vectors is looked at lane by lane only when its maximum beats the k-th
       largest so far: rarely, after the first blocks. */
    float zc = chosen >= 0 ? z[chosen] : INFINITY;
    float th = -INFINITY;  /* the k-th largest so far: only larger values enter the list */
    int filled = 0;
    v16 mx = (v16){0} - INFINITY;
    v16i above = {0};
    long i = 0;
    for (; i + 4 * VL <= V; i += 4 * VL) {
        const float *p = z + i;
        v16 a = *(const v16 *)p, b = *(const v16 *)(p + VL), c = *(const v16 *)(p + 2 * VL),
            d = *(const v16 *)(p + 3 * VL);
        above -= (a > zc) + (b > zc) + (c > zc) + (d > zc);  /* a true lane is -1 */
        v16 bm = vmax(vmax(a, b), vmax(c, d));
        mx = vmax(mx, bm);
        if (filled < k || hmax(bm) > th)
            for (int l = 0; l < 4 * VL; l++)
                if (filled < k ? p[l] == p[l] : p[l] > th) {
                    filled = insert(top_z, top_ids, filled, k, p[l], i + l);
                    if (filled == k) th = (float)top_z[k - 1];
                }
    }
    float m = -INFINITY;
    long n_above = 0;
    for (int l = 0; l < VL; l++) m = mx[l] > m ? mx[l] : m, n_above += above[l];
    for (; i < V; i++) {
        float v = z[i];
        m = v > m ? v : m;
        n_above += v > zc;
        if (filled < k ? v == v : v > th) {
            filled = insert(top_z, top_ids, filled, k, v, i);
            if (filled == k) th = (float)top_z[k - 1];
        }
    }
    for (int j = filled; j < k; j++) top_ids[j] = -1, top_z[j] = -INFINITY;  /* fewer than k that are not NaN */
    out[4] = (double)n_above, out[5] = chosen >= 0 ? zc : NAN;
    if (m == -INFINITY) {  /* every token masked: nothing to normalise */
        out[0] = out[1] = -INFINITY, out[2] = 0.0, out[3] = 0.0;
        return;
    }
    /* pass 2: s = sum e^(z - m), sx = sum e^(z - m) (z - m); entropy = log s - sx / s */
    v16 s = {0}, sx = {0};
    for (i = 0; i + VL <= V; i += VL) {
        v16 x = *(const v16 *)(z + i) - m;
        v16 e = exp16(x);
        v16i live = x > -87.3f;  /* e of a masked (-inf) token is 0, and 0 * -inf must not count */
        e = (v16)((v16i)e & live);
        s += e;
        sx += (v16)((v16i)(e * x) & live);
    }
    double S = hsum(s), SX = hsum(sx);
    for (; i < V; i++) {
        float x = z[i] - m;
        if (x > -87.3f) S += expf(x), SX += expf(x) * x;
    }
    double lse = m + log(S);
    /* pass 3: probabilities that float32 keeps above zero: p >= half the smallest denormal */
    float cut = (float)(lse - m) - 103.972f;
    v16i kept = {0};
    for (i = 0; i + VL <= V; i += VL) kept -= *(const v16 *)(z + i) - m > cut;
    long n_kept = 0;
    for (int l = 0; l < VL; l++) n_kept += kept[l];
    for (; i < V; i++) n_kept += z[i] - m > cut;
    out[0] = m, out[1] = lse, out[2] = log(S) - SX / S, out[3] = (double)n_kept;
}

/* z: R rows of V logits, row r at z + r * ldz (-inf for a masked token); k <= V candidates
   a row; chosen: a token per row whose rank is counted (NULL: none). Out: one row of
   6 + 2k doubles per row of z (one buffer, one conversion to Python): max, log-sum-exp,
   entropy in nats, nonzero probabilities, logits above the chosen one's (1 + it is the
   rank), the chosen token's logit, then the top k ids and their logits, descending. */
void tt_dist_stats(const float *z, long R, long V, long ldz, int k, const long *chosen, double *out,
                   int nthreads) {
    #pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1 && R > 1 && R * V >= 65536)
    for (long r = 0; r < R; r++)
        row_stats(z + r * ldz, V, k, chosen ? chosen[r] : -1, out + r * (6 + 2 * k));
}
