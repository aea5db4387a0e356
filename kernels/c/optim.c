/* optim.c — optimizer updates on a (shard of a) flat parameter.
 *
 * How it works.  Each kernel is one pass over n elements that mirrors
 * PyTorch's single-tensor (foreach=False) path line for line, so a run can be
 * compared with torch.optim step by step.  PyTorch evaluates the scalar
 * hyper-parameter arithmetic (bias corrections, 1 - lr*wd, lr/bc1) in Python
 * doubles and rounds each result to the tensor dtype when a tensor op takes
 * it; the per-element arithmetic then runs in the tensor dtype, one rounding
 * per tensor op.  The kernels do exactly that, in the same operation order.
 * (PyTorch's vectorised CPU path may fuse a + alpha*b into an FMA; this plain
 * C does not, so f32 results can differ from it in the last bit.)
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"
#include "walk.h"

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

#define T float
#define S f32
#define KM_SQRT sqrtf
#include "optim_impl.h"
#undef T
#undef S
#undef KM_SQRT

#define T double
#define S f64
#define KM_SQRT sqrt
#include "optim_impl.h"
#undef T
#undef S
#undef KM_SQRT

/* ---- loss scaling (--precision fp16) ---- */

void k_loss_seed_f32(float *y, int64_t n, double scale, int64_t accum)
{
    const float v = (float)(scale / (double)accum);
    for (int64_t i = 0; i < n; i++)
        y[i] = v;
}

void k_unscale_sq_f32(float *y, double scale)
{
    if (team_writer()) /* inside a team that shares, its first thread (the barriers around it: codegen/team.c) */
        y[0] = (float)((double)y[0] / (scale * scale));
}

/* ---- non-finite steps ---- */

void k_nan_unless_finite(int ydt, void *y, int xdt, const void *x)
{
    const double v = xdt == K_DT_F64 ? *(const double *)x : (double)*(const float *)x;
    if (isfinite(v) || !team_writer()) /* inside a team that shares, its first thread writes */
        return;
    if (ydt == K_DT_F64)
        *(double *)y = NAN;
    else
        *(float *)y = NAN;
}
