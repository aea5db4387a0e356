/* loss.c — mean-squared-error and softmax cross-entropy, forward and grad.
 *
 * How it works.  Both losses are means, reduced in double for either dtype
 * so the loss a run prints does not depend on the element count's rounding.
 * Cross-entropy works row by row on logits x[rows][classes]: it subtracts the
 * row max before exponentiating (logsumexp(x) = max + log sum exp(x - max)),
 * so logits of 1000 are as safe as logits of 1.  The forward checks every
 * label before touching the loss and reports the first bad row; the grad
 * trusts the labels the forward accepted (and ignores an out-of-range one
 * rather than write outside the row).
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

#define KCAT_(a, b) a##_##b
#define KCAT(a, b) KCAT_(a, b)
#define KFN(name) KCAT(name, S)

#define T float
#define S f32
#include "loss_impl.h"
#undef T
#undef S

#define T double
#define S f64
#include "loss_impl.h"
#undef T
#undef S
