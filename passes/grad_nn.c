/* grad_nn.c — gradient rules of the nn family (conv, pooling, normalisation, softmax, reductions, losses). */
#include "ir.h"

int grad_nn(GradCtx *cx)
{
    (void)cx;
    return 0;
}
