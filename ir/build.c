/* build.c — what the op rules and the passes build nodes with.
 *
 * shape_node() types one node by the op layer's shape rules (ir/rules/shape_*.c)
 * and checks what they inferred; the shape pass runs it over the model, and
 * every pass that makes a node (fold, loss, autodiff) runs it on its own, so
 * each rule is written once.  The ad_* builders make one node each, its output
 * shaped: the gradient rules (ir/rules/grad_*.c) are written with them, and
 * passes/loss.c and passes/autodiff.c use them too.  Living here, below the
 * passes, they let ir/ stand alone: nothing in ir/ calls into passes/ (the
 * ir_alone target of CMakeLists.txt links ir/ without passes/ and fails to
 * build otherwise).
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

int ad_emit(Graph *g, Op op, const char *name, int a, int b)
{
    int y = ir_value(g, ir_fmt("%s.out", name), DT_UNDEF, NULL, R_ACT);
    int n = ir_node1(g, op, name, a, b, y);
    shape_node(g, n);
    return y;
}

int ad_matmul(Graph *g, const char *name, int a, int b, int ta, int tb)
{
    int y = ir_value(g, ir_fmt("%s.out", name), DT_UNDEF, NULL, R_ACT);
    int n = ir_node1(g, OP_MatMul, name, a, b, y);
    ir_attr_add(g, n, "transA", A_INT)->i = ta;
    ir_attr_add(g, n, "transB", A_INT)->i = tb;
    shape_node(g, n);
    return y;
}

int ad_scale(Graph *g, const char *name, int x, double alpha)
{
    int y = ir_like(g, ir_fmt("%s.out", name), x, R_ACT);
    int n = ir_node1(g, OP_Scale, name, x, -1, y);
    ir_attr_add(g, n, "alpha", A_FLOAT)->f = alpha;
    return y;
}

int ad_reshape(Graph *g, const char *name, int x, const Shape *to)
{
    Shape s1 = {1, {to->rank}};
    int sh = ir_const(g, ir_fmt("%s.shape", name), DT_I64, &s1, to->dim);
    return ad_emit(g, OP_Reshape, name, x, sh);
}

/* dy summed down to the shape of value `like` (undoes numpy broadcasting) */
int ad_sum_to(Graph *g, const char *name, int dy, int like)
{
    Shape from = g->val[dy].shape, to = g->val[like].shape;
    if (shape_eq(&from, &to))
        return dy;
    if (shape_numel(&from) == shape_numel(&to))
        return ad_reshape(g, name, dy, &to);
    int y = ir_like(g, ir_fmt("%s.out", name), like, R_ACT);
    g->val[y].dtype = g->val[dy].dtype;
    ir_node1(g, OP_ReduceSumTo, name, dy, -1, y);
    return y;
}
