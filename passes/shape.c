/* shape.c — static dtype and shape of every value.
 *
 * requires: fold (no Gemm); every graph input and constant has a static shape
 *           (the frontend bound symbolic dims from --dim).
 * ensures:  every node output has a dtype and a static shape.
 *
 * shape_node() infers one node and is also used by later passes (autodiff)
 * for the nodes they create, so each rule is written once.  The rules are
 * the op layer's (ir/rules/shape_*.c); this pass checks what they infer.  A
 * model whose shapes don't fit is a user error naming the node.
 */
#include "ir.h"

/* Every output shape a rule infers is one a tensor may have: no negative
 * dim, at most MAX_NUMEL elements (rules whose own arithmetic could wrap
 * check their operands first). */
static void check_outputs(Graph *g, int id)
{
    const Node *n = &g->node[id];
    for (int k = 0; k < n->nout; k++)
        if (n->out[k] >= 0)
            node_check_shape(g, n, &g->val[n->out[k]].shape, n->nout > 1 ? ir_fmt("output %d", k) : "the output");
}

void shape_node(Graph *g, int id)
{
    /* the core rules, then the families' (which also claim some elementwise
     * ops), then the elementwise rows of ops.def; the rest are created with
     * their output already typed (ReduceSumTo, Ones, collectives, Free,
     * optimizer updates) */
    if (!shape_core(g, id) && !shape_tensor(g, id) && !shape_nn(g, id))
        shape_elementwise(g, id);
    check_outputs(g, id);
}

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
