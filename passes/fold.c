/* fold.c — canonicalise the imported graph.
 *
 * requires: the frontend's graph (Constant nodes already turned into values).
 * ensures:  no Gemm remains: Y = alpha op(A) op(B) + beta C becomes
 *           MatMul(transA, transB) [→ Scale alpha] [→ Add (Scale beta) C],
 *           so autodiff and codegen know one GEMM op;
 *           Clip's optional min/max inputs (constants) become attributes.
 *
 * New nodes are appended to the graph with ir_node, then the node array is
 * rebuilt in program order from a list of ids.
 * Folding of shape arithmetic (Shape → Gather → Concat → Reshape chains)
 * belongs here too; the skeleton's op set has none, see the "Real models" issue.
 */
#include "ir.h"

/* Append node op(a[, b]) named NODE/suffix; its output is `out`, or a new value. */
static int part(Graph *g, int gemm, Op op, int a, int b, const char *suffix, int out, int *order, int *n)
{
    const char *name = ir_fmt("%s/%s", g->node[gemm].name, suffix);
    if (out < 0)
        out = ir_value(g, name, DT_UNDEF, NULL, R_ACT);
    order[(*n)++] = ir_node1(g, op, name, a, b, out);
    return out;
}

static void expand_gemm(Graph *g, int id, int *order, int *n)
{
    Node gm = g->node[id]; /* copy: appending nodes moves g->node */
    double alpha = ir_attr_f(&gm, "alpha", 1.0), beta = ir_attr_f(&gm, "beta", 1.0);
    int c = gm.nin > 2 ? gm.in[2] : -1, y = gm.out[0];
    int scaled = alpha != 1.0, biased = c >= 0 && beta != 0.0;
    int t = part(g, id, OP_MatMul, gm.in[0], gm.in[1], "MatMul", scaled || biased ? -1 : y, order, n);
    int mm = order[*n - 1];
    ir_attr_add(g, mm, "transA", A_INT)->i = ir_attr_i(&gm, "transA", 0);
    ir_attr_add(g, mm, "transB", A_INT)->i = ir_attr_i(&gm, "transB", 0);
    if (scaled) {
        t = part(g, id, OP_Scale, t, -1, "alpha", biased ? -1 : y, order, n);
        ir_attr_add(g, order[*n - 1], "alpha", A_FLOAT)->f = alpha;
    }
    if (biased) {
        if (beta != 1.0) {
            c = part(g, id, OP_Scale, c, -1, "beta", -1, order, n);
            ir_attr_add(g, order[*n - 1], "alpha", A_FLOAT)->f = beta;
        }
        part(g, id, OP_Add, t, c, "Add", y, order, n);
    }
}

/* A scalar constant input as a double, for attributes. */
static double const_scalar(Graph *g, const Node *n, int v, const char *what)
{
    const Value *x = &g->val[v];
    if (x->role != R_CONST || !x->data || shape_numel(&x->shape) != 1)
        fatal("%s: node '%s' (%s): %s '%s' must be a constant scalar", g->opt->model, n->name,
              op_info[n->op].name, what, x->name);
    switch (x->dtype) {
    case DT_F32: return *(const float *)x->data;
    case DT_F64: return *(const double *)x->data;
    case DT_I64: return (double)*(const int64_t *)x->data;
    case DT_I32: return *(const int32_t *)x->data;
    default: fatal("%s: node '%s': %s has an unsupported dtype", g->opt->model, n->name, what);
    }
}

static void clip_attrs(Graph *g, int id)
{
    Node n = g->node[id];
    for (int i = 1; i < n.nin && i < 3; i++)
        if (n.in[i] >= 0)
            ir_attr_add(g, id, i == 1 ? "min" : "max", A_FLOAT)->f =
                const_scalar(g, &n, n.in[i], i == 1 ? "min" : "max");
    g->node[id].nin = 1;
}

void pass_fold(Graph *g)
{
    int nn = g->nnode;
    int *order = ir_alloc(sizeof(int) * (size_t)(nn * 4 + 1));
    int n = 0;
    for (int i = 0; i < nn; i++) {
        if (g->node[i].op == OP_Clip)
            clip_attrs(g, i);
        if (g->node[i].op == OP_Gemm)
            expand_gemm(g, i, order, &n);
        else
            order[n++] = i;
    }
    Node *out = ir_alloc(sizeof(Node) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        out[i] = g->node[order[i]];
    ir_set_nodes(g, out, n);
}
