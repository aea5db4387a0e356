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

int64_t k_pool_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pb, int64_t pe,
                       int64_t dilation, int ceil_mode)
{
    int64_t num = in + pb + pe - dilation * (k - 1) - 1, out;
    if (num < 0 || stride <= 0)
        return 0;
    out = (ceil_mode ? (num + stride - 1) / stride : num / stride) + 1;
    /* the last window must start inside the input or the begin padding */
    if (ceil_mode && (out - 1) * stride >= in + pb)
        out--;
    return out;
}

static int conv_is_1x1(const KConv2d *p)
{
    return p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->pt == 0 &&
           p->pl == 0 && p->pb == 0 && p->pr == 0;
}

int64_t k_conv2d_workspace(const KConv2d *p)
{
    if (conv_is_1x1(p) || p->groups <= 0)
        return 0;
    return p->c / p->groups * p->kh * p->kw * p->oh * p->ow;
}

/* Aborts on geometry no caller should produce. */
static void conv_check(const KConv2d *p)
{
    if (p->groups <= 0 || p->c % p->groups || p->m % p->groups)
        die("k_conv2d: groups must divide c and m");
    if (p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->pt < 0 || p->pl < 0 ||
        p->pb < 0 || p->pr < 0)
        die("k_conv2d: strides and dilations must be >= 1, pads >= 0");
    if (p->oh != k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 0) ||
        p->ow != k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 0))
        die("k_conv2d: oh / ow do not match the geometry");
}

static void pool_check(const KPool2d *p)
{
    if (p->sh < 1 || p->sw < 1 || p->dh < 1 || p->dw < 1 || p->pt < 0 || p->pl < 0 ||
        p->pb < 0 || p->pr < 0)
        die("k_pool2d: strides and dilations must be >= 1, pads >= 0");
    if (p->oh < k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 0) ||
        p->oh > k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 1) ||
        p->ow < k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 0) ||
        p->ow > k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 1))
        die("k_pool2d: oh / ow do not match the geometry");
}

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
