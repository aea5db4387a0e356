/* shape.c — static dtype and shape of every value.
 *
 * requires: fold (no Gemm); every graph input and constant has a static shape
 *           (the frontend bound symbolic dims from --dim).
 * ensures:  every node output has a dtype and a static shape.
 *
 * shape_node() (ir/build.c) infers one node and is also used by later passes
 * (autodiff) for the nodes they create, so each rule is written once.  The
 * rules are the op layer's (ir/rules/shape_*.c); shape_node checks what they
 * infer.  A model whose shapes don't fit is a user error naming the node.
 */
#include "ir.h"

void pass_shape(Graph *g)
{
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && g->val[n->in[j]].dtype == DT_UNDEF)
                node_fatal(g, n, "%s", ir_fmt("input '%s' has no known dtype", ir_q(g->val[n->in[j]].name)));
        shape_node(g, i);
    }
}
