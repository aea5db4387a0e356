/* conv.c — 2-D convolution (NCHW, strides, pads, dilations, groups) and
 * 2-D pooling (max, average, global average), forward and backward.
 *
 * How it works.  Convolution is im2col + GEMM, one image and group at a
 * time.  im2col unrolls the group's input x_ng (cg x h x w, cg = c/groups)
 * into col, a (cg kh kw) x (oh ow) matrix whose row (ci, i, j) holds, for
 * every output position, the input pixel that kernel tap (i, j) of channel
 * ci sees there (0 in the padding).  Then
 *   forward:  y_ng  [mg x oh ow]    = w_g [mg x cg kh kw] . col
 *   dx:       col   [cg kh kw x oh ow] = w_g^T . dy_ng, then col2im adds each
 *             entry back onto the pixel it came from (dx zeroed first)
 *   dw:       dw_g  += dy_ng . col^T, summed over the images (GEMM beta 1)
 * with mg = m/groups.  col lives in the caller's workspace (k_conv2d_workspace
 * elements), reused for every image and group, so nothing is allocated.  A
 * 1x1 stride-1 unpadded convolution needs no col: x_ng itself is that matrix,
 * and dx comes straight out of the GEMM.  GEMMs go through k_matmul (CBLAS,
 * which threads); im2col / col2im split their rows across OpenMP threads by
 * channel, so col2im's += never races.
 *
 * float32 convolutions run on oneDNN's primitives instead (conv_dnnl.c)
 * where k_conv2d_dnnl_layout's measured rule says they are faster (3x3 and
 * larger kernels, depthwise; FSDPC_CONV forces either path): on_dnnl_f32 is
 * the first thing each float32 kernel asks, and the im2col path stays for
 * the rest, for float64 and for CPUs where oneDNN does not jit.  Inputs in
 * bfloat16 or float16 (k_conv2d_bf16, ...: --precision bf16 / fp16) always
 * run on oneDNN, whose reorders widen them where it does not compute in
 * bfloat16 itself.
 *
 * Pooling walks each (image, channel) plane on its own (planes in parallel).
 * A window's taps are oy sh - pt + i dh (columns alike); taps outside the
 * image are skipped, which is how padding never wins a max and how windows
 * that ceil_mode hangs over the edge are clipped.  MaxPool records the first
 * maximal tap's plane index for the backward, which scatters dy there.
 * Typed bodies are in conv_impl.h.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* Aborts on geometry no caller should produce. */
static void geometry_check(const char *kernel, const char *bad)
{
    char msg[160];
    if (bad) {
        snprintf(msg, sizeof msg, "%s: %s", kernel, bad);
        die(msg);
    }
}
#define conv_check(p) geometry_check("k_conv2d", k_conv2d_bad(p))
#define pool_check(p) geometry_check("k_pool2d", k_pool2d_bad(p))

/* Output columns [*lo, *hi) whose tap ix = ox s - a lands in [0, w). */
static void tap_range(int64_t a, int64_t s, int64_t w, int64_t ow, int64_t *lo,
                      int64_t *hi)
{
    int64_t b = w - 1 + a;  /* ox s <= b */
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    *hi = b < 0 ? 0 : b / s + 1;
    *lo = min64(*lo, ow);
    *hi = max64(*lo, min64(*hi, ow));
}

/* Runs direction dir of p on oneDNN where k_conv2d_dnnl_layout chooses it
 * (operands as k_conv2d_dnnl_f32's); 0: the caller takes the im2col path.
 * float64 always does. */
static int on_dnnl_f32(const KConv2d *p, int dir, float *out, const float *a, const float *b, const float *bias,
                       float *db)
{
    const int layout = k_conv2d_dnnl_layout(p, dir);
    if (layout < 0)
        return 0;
    k_conv2d_dnnl_f32(p, dir, layout, out, a, b, bias, db);
    return 1;
}

static int on_dnnl_f64(const KConv2d *p, int dir, double *out, const double *a, const double *b,
                       const double *bias, double *db)
{
    (void)p, (void)dir, (void)out, (void)a, (void)b, (void)bias, (void)db;
    return 0;
}

/* ---- 16-bit inputs (--precision bf16 / fp16) ------------------------------
 * Always on oneDNN, which takes 16-bit operands where no im2col does, on its
 * blocked layouts in every direction and shape.  Widened (no native bf16:
 * float32 primitives), the float32 rule's choice instead (plain gemm:jit where
 * the rule says im2col) made ResNet-18's step (112^2, batch 8, 1 thread,
 * DNNL_MAX_CPU_ISA=AVX512_CORE) 1.07x slower than blocked everywhere. */
static int layout_16(const KConv2d *p)
{
    conv_check(p);
    return K_CONV_DNNL_BLOCKED;
}

static void grad_b_16(const KConv2d *p, float *db, const uint16_t *dy, int f16)
{
    const int64_t nout = p->oh * p->ow;
    for (int64_t mo = 0; mo < p->m; mo++) {
        double s = 0;
        for (int64_t nb = 0; nb < p->n; nb++) {
            const uint16_t *d = dy + (nb * p->m + mo) * nout;
            for (int64_t i = 0; i < nout; i++)
                s += f16 ? k_f16_to_f32(d[i]) : k_bf16_to_f32(d[i]);
        }
        db[mo] = (float)s;
    }
}

#define CONV_16(S, DT, F16)                                                                                          \
    void k_conv2d_##S(const KConv2d *p, float *y, const uint16_t *x, const uint16_t *w, const float *b, float *ws) \
    {                                                                                                                \
        (void)ws;                                                                                                    \
        k_conv2d_dnnl(p, K_CONV_FWD, layout_16(p), DT, y, x, w, b, NULL);                         \
    }                                                                                                                \
    void k_conv2d_grad_x_##S(const KConv2d *p, float *dx, const uint16_t *dy, const uint16_t *w, float *ws)        \
    {                                                                                                                \
        (void)ws;                                                                                                    \
        k_conv2d_dnnl(p, K_CONV_BWD_X, layout_16(p), DT, dx, dy, w, NULL, NULL);                \
    }                                                                                                                \
    void k_conv2d_grad_w_##S(const KConv2d *p, float *dw, const uint16_t *dy, const uint16_t *x, float *ws)        \
    {                                                                                                                \
        (void)ws;                                                                                                    \
        k_conv2d_dnnl(p, K_CONV_BWD_W, layout_16(p), DT, dw, x, dy, NULL, NULL);                \
    }                                                                                                                \
    void k_conv2d_grad_b_##S(const KConv2d *p, float *db, const uint16_t *dy) { grad_b_16(p, db, dy, F16); }
CONV_16(bf16, K_DT_BF16, 0)
CONV_16(f16, K_DT_F16, 1)
#undef CONV_16

#define T float
#define S f32
#include "conv_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "conv_impl.h"
#undef T
#undef S
