/* lstm.c - the LSTM cell on the CPU: activations and state update for one time
 * step, and their backward. The GEMMs around it live in common/nn/lstm.c.
 * Each row is processed in blocks of FERRY_VLANES hidden units with the
 * vectorisable exp/sigmoid/tanh of vmath.h, then a scalar tail; both paths call
 * the same per-unit functions below, which are the plain reference formulas. */
#include "common/backend/cpu/cpu.h"
#include "common/backend/cpu/vmath.h"
#include "common/core/simd.h"

/* One hidden unit forward: z holds the four pre-activations (i, f, g, o) on entry
 * and the activations on return; returns c and h through the pointers. */
static inline void cell_unit_forward(float *zi, float *zf, float *zg, float *zo, float cp, float *c,
                                     float *h) {
    float i = ferry__vsigmoidf(*zi);
    float f = ferry__vsigmoidf(*zf);
    float g = ferry__vtanhf(*zg);
    float o = ferry__vsigmoidf(*zo);
    float cc = f * cp + i * g;
    *zi = i;
    *zf = f;
    *zg = g;
    *zo = o;
    *c = cc;
    *h = o * ferry__vtanhf(cc);
}

FERRY_HOT_LOOP ferry_status ferry__cpu_lstm_cell_forward(ferry_backend *be, int64_t N, int64_t H,
                                                         float *gates, const float *c_prev,
                                                         float *c, float *h) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        float *z = gates + n * 4 * H; /* (4H): i, f, g, o pre-activations */
        const float *cp = c_prev + n * H;
        float *cn = c + n * H, *hn = h + n * H;
        int64_t j = 0;
        for (; j + FERRY_VLANES <= H; j += FERRY_VLANES) {
            /* (4, VLANES) activations and (VLANES) c, h staged locally. */
            float a[4][FERRY_VLANES], cv[FERRY_VLANES], hv[FERRY_VLANES];
            for (int k = 0; k < FERRY_VLANES; k++) {
                a[0][k] = z[j + k];
                a[1][k] = z[H + j + k];
                a[2][k] = z[2 * H + j + k];
                a[3][k] = z[3 * H + j + k];
            }
            for (int k = 0; k < FERRY_VLANES; k++)
                cell_unit_forward(&a[0][k], &a[1][k], &a[2][k], &a[3][k], cp[j + k], &cv[k],
                                  &hv[k]);
            for (int k = 0; k < FERRY_VLANES; k++) {
                z[j + k] = a[0][k];
                z[H + j + k] = a[1][k];
                z[2 * H + j + k] = a[2][k];
                z[3 * H + j + k] = a[3][k];
                cn[j + k] = cv[k];
                hn[j + k] = hv[k];
            }
        }
        for (; j < H; j++)
            cell_unit_forward(&z[j], &z[H + j], &z[2 * H + j], &z[3 * H + j], cp[j], &cn[j],
                              &hn[j]);
    }
    return FERRY_OK;
}

/* One hidden unit backward from the saved activations i, f, g, o, c_prev, c, the
 * incoming dh and dc (for c_t); writes the four pre-activation gradients and
 * returns the gradient for c_{t-1}. */
static inline float cell_unit_backward(float i, float f, float g, float o, float cp, float c,
                                       float dh, float dc, float *di, float *df, float *dg,
                                       float *d_o) {
    float tc = ferry__vtanhf(c);
    float dct = dc + dh * o * (1.0f - tc * tc);
    *di = dct * g * i * (1.0f - i);
    *df = dct * cp * f * (1.0f - f);
    *dg = dct * i * (1.0f - g * g);
    *d_o = dh * tc * o * (1.0f - o);
    return dct * f;
}

FERRY_HOT_LOOP ferry_status ferry__cpu_lstm_cell_backward(ferry_backend *be, int64_t N, int64_t H,
                                                          const float *gates, const float *c_prev,
                                                          const float *c, const float *dh,
                                                          float *dc, float *dgates) {
    (void)be;
    for (int64_t n = 0; n < N; n++) {
        const float *a = gates + n * 4 * H; /* (4H): i, f, g, o activations */
        const float *cp = c_prev + n * H, *cn = c + n * H, *dhn = dh + n * H;
        float *dcn = dc + n * H, *dz = dgates + n * 4 * H;
        int64_t j = 0;
        for (; j + FERRY_VLANES <= H; j += FERRY_VLANES) {
            float d[4][FERRY_VLANES], dcv[FERRY_VLANES]; /* staged outputs */
            for (int k = 0; k < FERRY_VLANES; k++)
                dcv[k] = cell_unit_backward(a[j + k], a[H + j + k], a[2 * H + j + k],
                                            a[3 * H + j + k], cp[j + k], cn[j + k], dhn[j + k],
                                            dcn[j + k], &d[0][k], &d[1][k], &d[2][k], &d[3][k]);
            for (int k = 0; k < FERRY_VLANES; k++) {
                dz[j + k] = d[0][k];
                dz[H + j + k] = d[1][k];
                dz[2 * H + j + k] = d[2][k];
                dz[3 * H + j + k] = d[3][k];
                dcn[j + k] = dcv[k];
            }
        }
        for (; j < H; j++)
            dcn[j] =
                cell_unit_backward(a[j], a[H + j], a[2 * H + j], a[3 * H + j], cp[j], cn[j], dhn[j],
                                   dcn[j], &dz[j], &dz[H + j], &dz[2 * H + j], &dz[3 * H + j]);
    }
    return FERRY_OK;
}
