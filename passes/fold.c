/* fold.c — canonicalise the imported graph.
 *
 * requires: the frontend's graph (Constant nodes already turned into values).
 * ensures:  no Gemm remains: Y = alpha op(A) op(B) + beta C becomes
 *           MatMul(transA, transB) [→ Scale alpha] [→ Add (Scale beta) C],
 *           so autodiff and codegen know one GEMM op.  Identity nodes are kept
 *           (they are views and cost nothing).
 *
 * Folding of shape arithmetic (Shape → Gather → Concat → Reshape chains)
 * belongs here too; the skeleton's op set has none, see the "Real models" issue.
 */
#include "ir.h"

static int gemm_part(Graph *g, Node *n, Op op, int a, int b, const char *suffix, Node **out,
                     int *nout)
{
    int y = ir_value(g, ir_fmt("%s/%s", n->name, suffix), DT_UNDEF, NULL, R_ACT);
    Node m = {0};
    m.op = op;
    m.name = ir_fmt("%s/%s", n->name, suffix);
    m.nin = b < 0 ? 1 : 2;
    m.in = ir_alloc(sizeof(int) * 2);
    m.in[0] = a;
    m.in[1] = b;
    m.nout = 1;
    m.out = ir_alloc(sizeof(int));
    m.out[0] = y;
    m.unit = -1;
    (*out)[(*nout)++] = m;
    return y;
}

static Attr float_attr(const char *name, double f)
{
    Attr a = {0};
    a.name = ir_strdup(name);
    a.kind = A_FLOAT;
    a.f = f;
    a.t = -1;
    return a;
}

static Attr int_attr(const char *name, int64_t i)
{
    Attr a = {0};
    a.name = ir_strdup(name);
    a.kind = A_INT;
    a.i = i;
    a.t = -1;
    return a;
}

/* Expand one Gemm into up to four nodes appended to out; the last writes n's output. */
static void expand_gemm(Graph *g, Node *n, Node *out, int *nout)
{
    double alpha = ir_attr_f(n, "alpha", 1.0), beta = ir_attr_f(n, "beta", 1.0);
    int c = n->nin > 2 ? n->in[2] : -1;
    int first = *nout;
    int y = gemm_part(g, n, OP_MatMul, n->in[0], n->in[1], "MatMul", &out, nout);
    out[first].nattr = 2;
    out[first].attr = ir_alloc(sizeof(Attr) * 2);
    out[first].attr[0] = int_attr("transA", ir_attr_i(n, "transA", 0));
    out[first].attr[1] = int_attr("transB", ir_attr_i(n, "transB", 0));
    if (alpha != 1.0) {
        int k = *nout;
        y = gemm_part(g, n, OP_Scale, y, -1, "alpha", &out, nout);
        out[k].nattr = 1;
        out[k].attr = ir_alloc(sizeof(Attr));
        out[k].attr[0] = float_attr("alpha", alpha);
    }
    if (c >= 0 && beta != 0.0) {
        if (beta != 1.0) {
            int k = *nout;
            c = gemm_part(g, n, OP_Scale, c, -1, "beta", &out, nout);
            out[k].nattr = 1;
            out[k].attr = ir_alloc(sizeof(Attr));
            out[k].attr[0] = float_attr("alpha", beta);
        }
        y = gemm_part(g, n, OP_Add, y, c, "Add", &out, nout);
    }
    /* the last part writes the Gemm's own output value */
    Node *last = &out[*nout - 1];
    g->val[n->out[0]].dtype = DT_UNDEF;
    last->out[0] = n->out[0];
    (void)y;
}

void pass_fold(Graph *g)
{
    Node *out = ir_alloc(sizeof(Node) * (size_t)(g->nnode * 4 + 1));
    int nout = 0;
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        if (n->op == OP_Gemm)
            expand_gemm(g, n, out, &nout);
        else
            out[nout++] = *n;
    }
    ir_set_nodes(g, out, nout);
}
