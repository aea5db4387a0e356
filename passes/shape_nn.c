/* shape_nn.c — shape rules of the nn family (conv, pooling, normalisation, softmax, reductions, losses). */
#include "ir.h"

int shape_nn(Graph *g, int node)
{
    (void)g;
    (void)node;
    return 0;
}
