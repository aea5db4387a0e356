/* loss.c — mean-squared-error, softmax cross-entropy and the negative
 * log-likelihood (ONNX NegativeLogLikelihoodLoss, and SoftmaxCrossEntropyLoss
 * after a log-softmax), forward and grad.
 *
 * How it works.  MSE and cross-entropy are means, reduced in double for
 * either dtype so the loss a run prints does not depend on the element
 * count's rounding.
 * Cross-entropy (ce_impl.h; also on bfloat16 / float16 logits, whose
 * gradient is then 16-bit too: --precision bf16 / fp16) works row by row on logits x[rows][classes]: it subtracts the
 * row max before exponentiating (logsumexp(x) = max + log sum exp(x - max)),
 * so logits of 1000 are as safe as logits of 1.  The forward checks every
 * label before touching the loss and reports the first bad row; the grad
 * trusts the labels the forward accepted (and ignores an out-of-range one
 * rather than write outside the row).
 *
 * The negative log-likelihood has ONNX's extras: an ignore_index, class
 * weights, the reductions none / sum / mean (a weighted mean: divided by the
 * sum of the counted weights), and trailing dims (lp n x c x d).  Its grad
 * is a scatter onto a copy of dx_in (or zeros), one element per counted
 * position, so positions never collide.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "walk.h"

/* The cross-entropy sums exp(x - max) in double: libmvec's vector exp for it (fused.h's KF_SIMD),
 * declared in this file only, so that no fused row's double exp is libmvec's (fused.h says why) */
#ifdef KF_SIMD
KF_SIMD(double, exp)
#endif

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

/* k_nll_loss: is label l of a position ignored? */
static int nll_ignored(int64_t l, int has_ignore, int64_t ignore_index)
{
    return has_ignore && l == ignore_index;
}

/* index in lp (n x c x d) of class l at label position i (labels n x d) */
static int64_t nll_at(int64_t i, int64_t l, int64_t c, int64_t d)
{
    return (i / d * c + l) * d + i % d;
}

#define T float
#define S f32
#include "loss_impl.h"
#define X T
#define XL(v) (double)(v)
#define CE_E_IN_DX 1
#include "ce_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "loss_impl.h"
#include "ce_impl.h"
#undef T
#undef S
#undef X
#undef XL
#undef CE_E_IN_DX

/* cross-entropy of 16-bit logits (--precision bf16 / fp16): the loss float32 */
#define T float
#define X uint16_t
#define CE_E_IN_DX 0
#define S bf16
#define XL(v) (double)k_bf16_to_f32(v)
#define XS(d) k_bf16_from_f32((float)(d))
#include "ce_impl.h"
#undef S
#undef XL
#undef XS
#define S f16
#define XL(v) (double)k_f16_to_f32(v)
#define XS(d) k_f16_from_f32((float)(d))
#include "ce_impl.h"
#undef S
#undef XL
#undef XS
#undef T
#undef X
#undef CE_E_IN_DX
