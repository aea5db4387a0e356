/* grad_tensor.c — gradient rules of the tensor family (shapes, indexing, data movement, comparisons). */
#include "ir.h"

int grad_tensor(GradCtx *cx)
{
    (void)cx;
    return 0;
}
