/* RMSNorm on the CPU: y = x / sqrt(mean(x^2) + eps) * (w + offset), float32, row by row.
   PyTorch runs it as five small ops (~10 us a call at a decode step's one row of 576
   floats); a model calls it twice a layer, so that is most of a millisecond per step. */
#include "cpu_vec.h"

void tt_rms_norm(const float *x, long T, long H, long ldx, const float *w, float offset, float eps,
                 float *y) {
    for (long t = 0; t < T; t++) {
        const float *xt = x + t * ldx;
        float *yt = y + t * H;
        v16 acc = {0};
        long i = 0;
        for (; i + VL <= H; i += VL) {
            v16 v = *(const v16 *)(xt + i);
            acc += v * v;
        }
        float ss = 0.f;
        for (int l = 0; l < VL; l++) ss += acc[l];
        for (; i < H; i++) ss += xt[i] * xt[i];
        float inv = 1.f / __builtin_sqrtf(ss / (float)H + eps);
        for (i = 0; i < H; i++) yt[i] = xt[i] * inv * (w[i] + offset);
    }
}
