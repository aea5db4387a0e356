/* norm.c — LayerNormalization and BatchNormalization, forward and backward.
 *
 * How it works.  Both normalise x by statistics of a group of elements:
 * LayerNorm by row (x viewed as outer x inner, one group per row),
 * BatchNorm by channel (x viewed as n x c x l, group = the n l elements of a
 * channel).  LayerNorm's statistics take one pass over the row: Welford's
 * running mean and sum of squared deviations in 16 lanes of the tensor's
 * type (a vector register of float), the lanes combined in double, two rows'
 * updates interleaved (each row's is a latency chain); BatchNorm's
 * take two passes in double (the mean, then the mean of squared deviations).
 * Neither forms E[x^2] - E[x]^2, which cancels for groups far from 0.  The
 * forward saves mean and invstd = 1/sqrt(var + eps) in the
 * tensor dtype for the backward.
 *
 * The backward is the usual closed form, per group of m elements with
 * xhat = (x - mean) invstd and g = dy scale:
 *   dx = invstd (g - mean(g) - xhat mean(g xhat))
 * plus dscale = sum dy xhat, dbias = sum dy.  For BatchNorm those sums are
 * per channel, the same groups as the statistics.  For LayerNorm they run
 * down the columns, across rows, so a first pass accumulates them K_TILE
 * columns at a time in double on the stack and a second pass writes dx row
 * by row (on one thread, rows of at most K_LN_SWEEP: one sweep doing both, the
 * same sums in the same order); every read of dy happens before dx is
 * written at that place, so dx may alias dy.  k_bn_running_var gives an --eval build's BatchNorm the
 * ONNX spec's running variance (biased) from the saved invstd.  Typed bodies
 * are in norm_impl.h; k_layernorm_bf16 / _f16 (--precision's LayerNorm of a
 * 16-bit residual feeding GEMMs only) are its forward with x widened as
 * loaded and y rounded as stored, k_layernorm_grad_bf16 / _f16 its backward
 * with x widened as loaded (dy, dx float32).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

#define T float
#define S f32
#include "norm_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "norm_impl.h"
#undef T
#undef S

/* k_layernorm of 16-bit x into 16-bit y (--precision's LayerNorm between a 16-bit residual and a GEMM), and
 * k_layernorm_grad of 16-bit x (that LayerNorm's backward) */
#define K_LN16
#define T float
#define X uint16_t
#define S bf16
#define XW(v) k_bf16_to_f32(v)
#define XR(v) k_bf16_from_f32(v)
#include "norm_impl.h"
#undef S
#define X uint16_t
#define S f16
#define XW(v) k_f16_to_f32(v)
#define XR(v) k_f16_from_f32(v)
#include "norm_impl.h"
#undef T
#undef S
#undef K_LN16
