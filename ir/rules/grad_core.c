/* grad_core.c — gradient rules of the core ops: the elementwise rows of
 * ops.def, MatMul, Reshape, Transpose, the losses and fsdpc's Identity-like
 * ops.  Each is written with forward ops plus a few gradient ops of fsdpc's
 * own (UnaryGrad, MseLossGrad, CrossEntropyGrad); passes/autodiff.c applies
 * them in reverse and sums the contributions.
 */
#include "ir.h"
#include "fused.h"

#include <string.h>

/* dx = dy f'(.) of a unary op: UnaryGrad reads the forward input x and/or
 * output y as the op's kernel row says (kernels/c/fused.h), and carries the
 * forward node's attributes (alpha, min, max) plus `of`, the forward op. */
static int unary_grad(Graph *g, const Node *f, const char *name, int dy)
{
    int reads = kf_unary_reads(op_info[f->op].kernel);
    int in[3] = {dy, reads & KF_READS_X ? f->in[0] : -1, reads & KF_READS_Y ? f->out[0] : -1};
    int dx = ir_like(g, ir_fmt("%s.out", name), dy, R_ACT);
    int k = ir_node(g, OP_UnaryGrad, name, 3, in, 1, &dx);
    ir_attr_add(g, k, "of", A_INT)->i = f->op;
    for (int i = 0; i < f->nattr; i++)
        *ir_attr_add(g, k, f->attr[i].name, f->attr[i].kind) = f->attr[i];
    return dx;
}

/* Gradients of y = op(A) op(B).  Returns dA, dB in d[0], d[1] (-1 if not needed). */
static void matmul_grad(Graph *g, const Node *n, int dy, const int *need, int d[2])
{
    int a = n->in[0], b = n->in[1];
    int ta = (int)ir_attr_i(n, "transA", 0), tb = (int)ir_attr_i(n, "transB", 0);
    const char *nm = n->name;
    d[0] = d[1] = -1;
    if (need[0]) {
        const char *s = ir_fmt("%s.dA", nm);
        d[0] = ta ? ad_matmul(g, s, b, dy, tb, 1) : ad_matmul(g, s, dy, b, 0, !tb);
        d[0] = ad_sum_to(g, ir_fmt("%s.sum", s), d[0], a);
    }
    if (need[1]) {
        const char *s = ir_fmt("%s.dB", nm);
        int aa = a, dd = dy;
        if (g->val[b].shape.rank == 2 && g->val[a].shape.rank > 2 && !ta) {
            /* B is shared by every batch: fold the batch into rows so dB is one
             * GEMM instead of a batch of full-size partial products. */
            const Shape *sa = &g->val[a].shape, *sy = &g->val[dy].shape;
            Shape fa = {2, {shape_numel(sa) / sa->dim[sa->rank - 1], sa->dim[sa->rank - 1]}};
            Shape fy = {2, {shape_numel(sy) / sy->dim[sy->rank - 1], sy->dim[sy->rank - 1]}};
            aa = ad_reshape(g, ir_fmt("%s.flatA", s), a, &fa);
            dd = ad_reshape(g, ir_fmt("%s.flatdY", s), dy, &fy);
        }
        d[1] = tb ? ad_matmul(g, s, dd, aa, 1, ta) : ad_matmul(g, s, aa, dd, !ta, 0);
        d[1] = ad_sum_to(g, ir_fmt("%s.sum", s), d[1], b);
    }
}

/* An EW2D op (Pow, Min, Max, Mod): d input i = reduce(dy * D_i(a, b)) with
 * D_i the op's derivative row (BinaryGrad), or reduce(dy) where it is 1. */
static void binary_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    for (int i = 0; i < 2; i++) {
        if (!cx->need[i])
            continue;
        int t = cx->dys[0];
        if (op_info[n->op].dkernel[i] >= 0) {
            int in[3] = {cx->dys[0], n->in[0], n->in[1]};
            t = ir_like(cx->g, ir_fmt("%s.d%d.out", cx->name, i), cx->dys[0], R_ACT);
            int k = ir_node(cx->g, OP_BinaryGrad, ir_fmt("%s.d%d", cx->name, i), 3, in, 1, &t);
            ir_attr_add(cx->g, k, "of", A_INT)->i = n->op;
            ir_attr_add(cx->g, k, "wrt", A_INT)->i = i;
        }
        cx->d[i] = ad_sum_to(cx->g, ir_fmt("%s.sum%d", cx->name, i), t, n->in[i]);
    }
}

int grad_core(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node n = *cx->n;
    const int *need = cx->need;
    int *d = cx->d;
    int y = n.out[0], dy = cx->dys[0];
    int a = n.in[0], b = n.nin > 1 ? n.in[1] : -1;
    const char *nm = cx->name;
    switch (n.op) {
    case OP_Add:
    case OP_Sub:
        if (need[0]) d[0] = ad_sum_to(g, ir_fmt("%s.a", nm), dy, a);
        if (need[1]) {
            int t = n.op == OP_Sub ? ad_scale(g, ir_fmt("%s.neg", nm), dy, -1.0) : dy;
            d[1] = ad_sum_to(g, ir_fmt("%s.b", nm), t, b);
        }
        break;
    case OP_Mul:
        if (a == b && need[0] && need[1]) { /* x * x (fold's Pow(x, 2)): d x = 2 (dy x), one contribution */
            d[0] = ad_scale(g, ir_fmt("%s.sq", nm), ad_emit(g, OP_Mul, ir_fmt("%s.mula", nm), dy, a), 2.0);
            d[0] = ad_sum_to(g, ir_fmt("%s.a", nm), d[0], a);
            d[1] = GRAD_IN_OTHER;
            break;
        }
        if (need[0]) d[0] = ad_sum_to(g, ir_fmt("%s.a", nm), ad_emit(g, OP_Mul, ir_fmt("%s.mula", nm), dy, b), a);
        if (need[1]) d[1] = ad_sum_to(g, ir_fmt("%s.b", nm), ad_emit(g, OP_Mul, ir_fmt("%s.mulb", nm), dy, a), b);
        break;
    case OP_Div:
        if (need[0]) d[0] = ad_sum_to(g, ir_fmt("%s.a", nm), ad_emit(g, OP_Div, ir_fmt("%s.diva", nm), dy, b), a);
        if (need[1]) { /* d b = -dy * y / b */
            int t = ad_emit(g, OP_Mul, ir_fmt("%s.dyy", nm), dy, y);
            t = ad_emit(g, OP_Div, ir_fmt("%s.divb", nm), t, b);
            t = ad_scale(g, ir_fmt("%s.negb", nm), t, -1.0);
            d[1] = ad_sum_to(g, ir_fmt("%s.b", nm), t, b);
        }
        break;
    case OP_Identity: case OP_Copy: d[0] = dy; break;
    case OP_Scale: d[0] = ad_scale(g, nm, dy, ir_attr_f(&n, "alpha", 1.0)); break;
    case OP_Reshape: d[0] = ad_reshape(g, nm, dy, &g->val[a].shape); break;
    case OP_Transpose: {
        int r = g->val[a].shape.rank;
        int64_t inv[MAX_RANK];
        const Attr *p = ir_attr(&n, "perm");
        for (int i = 0; i < r; i++)
            inv[p ? p->ints[i] : r - 1 - i] = i;
        int t = ir_value(g, ir_fmt("%s.out", nm), DT_UNDEF, NULL, R_ACT);
        int k = ir_node1(g, OP_Transpose, nm, dy, -1, t);
        Attr *at = ir_attr_add(g, k, "perm", A_INTS);
        at->n = r;
        at->ints = ir_alloc(sizeof(int64_t) * (size_t)r);
        memcpy(at->ints, inv, sizeof(int64_t) * (size_t)r);
        shape_node(g, k);
        d[0] = t;
        break;
    }
    case OP_MatMul: matmul_grad(g, &n, dy, need, d); break;
    case OP_MseLoss: {
        int t = ir_like(g, ir_fmt("%s.out", nm), a, R_ACT);
        int in[3] = {dy, a, b};
        ir_node(g, OP_MseLossGrad, nm, 3, in, 1, &t);
        d[0] = t;
        break;
    }
    case OP_CrossEntropyLoss: {
        int t = ir_like(g, ir_fmt("%s.out", nm), a, R_ACT);
        int in[3] = {dy, a, b};
        ir_node(g, OP_CrossEntropyGrad, nm, 3, in, 1, &t);
        d[0] = t;
        break;
    }
    default:
        if (op_info[n.op].flags & F_BINARY) {
            binary_grad(cx);
            break;
        }
        if (!(op_info[n.op].flags & F_UNARY))
            return 0;
        d[0] = unary_grad(g, &n, nm, dy);
    }
    return 1;
}
