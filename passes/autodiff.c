/* autodiff.c — reverse mode: d loss / d every trainable initializer.
 *
 * requires: loss.
 * ensures:  float initializers (not scalars: rank >= 1) on a differentiable
 *           path to the loss become R_PARAM (the rest stay constants/buffers, and so do those that
 *           match a --freeze pattern: no gradient, no optimizer state, their
 *           values unchanged and exported as given); each parameter's
 *           .grad names the value holding its full gradient; the backward
 *           nodes follow the forward ones (g->nfwd marks the boundary).
 *
 * Two sweeps over the node list mark what matters: `fwd` = depends on a
 * float initializer, `bwd` = reaches the loss; a value on both is active.
 * The reverse sweep then applies one rule per op (the op layer's,
 * ir/rules/grad_*.c, built with the ad_* helpers below) and sums
 * contributions when a value feeds several nodes.  Broadcasting is undone by
 * ad_sum_to().
 */
#include "ir.h"

#include <fnmatch.h>

/* Does input i of op carry a gradient? (ops.def's diff column) */
static int diff_input(Op op, int i) { return i < 32 && (op_info[op].diff >> i & 1u); }

static int is_float(DType t) { return t == DT_F32 || t == DT_F64; }

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

static void accumulate(Graph *g, int *grad, int v, int contrib, const char *name)
{
    grad[v] = grad[v] < 0 ? contrib : ad_emit(g, OP_Add, ir_fmt("%s.acc", name), grad[v], contrib);
}

/* Apply node n's rule: add the contributions of its outputs' gradients to
 * the gradients of its inputs. */
static void node_grad(Graph *g, int id, int *grad, const char *active)
{
    Node n = g->node[id]; /* copy: emitting nodes moves g->node */
    int need[GRAD_MAX_IN] = {0}, d[GRAD_MAX_IN], any = 0;
    int *dys = ir_alloc(sizeof(int) * (size_t)(n.nout + 1));
    for (int k = 0; k < n.nout; k++)
        dys[k] = grad[n.out[k]];
    for (int i = 0; i < n.nin; i++) {
        d[i < GRAD_MAX_IN ? i : 0] = -1;
        int nd = n.in[i] >= 0 && active[n.in[i]] && diff_input(n.op, i);
        if (nd && i >= GRAD_MAX_IN)
            die("node '%s' (%s): gradient for input %d", n.name, op_info[n.op].name, i);
        if (i < GRAD_MAX_IN)
            any |= need[i] = nd;
    }
    if (!any)
        return;
    const char *nm = ir_fmt("%s.bwd", n.name);
    GradCtx cx = {g, &n, nm, dys, need, d};
    if (!grad_core(&cx) && !grad_tensor(&cx) && !grad_nn(&cx))
        die("no gradient rule for %s (node '%s')", op_info[n.op].name, n.name);
    for (int i = 0; i < n.nin && i < GRAD_MAX_IN; i++)
        if (need[i]) {
            if (d[i] < 0)
                die("node '%s' (%s): no gradient made for input %d", n.name, op_info[n.op].name, i);
            accumulate(g, grad, n.in[i], d[i], nm);
        }
}

/* an initializer --freeze keeps fixed; used[k]: pattern k matched one */
static int frozen(const Graph *g, const Value *x, char *used)
{
    int hit = 0;
    for (int k = 0; k < g->opt->nfreeze; k++)
        if (fnmatch(g->opt->freeze[k], x->name, 0) == 0)
            hit = used[k] = 1;
    return hit;
}

/* fwd: depends on a float initializer (not frozen); bwd: reaches the loss. */
static char *mark_active(Graph *g)
{
    int nv = g->nval;
    char *fwd = ir_alloc((size_t)nv), *bwd = ir_alloc((size_t)nv), *act = ir_alloc((size_t)nv);
    char *used = ir_alloc((size_t)g->opt->nfreeze + 1);
    for (int v = 0; v < nv; v++) {
        const Value *x = &g->val[v];
        /* a scalar (rank 0) initializer is a constant of the export (an attention scale, a Pow
         * exponent, GELU's sqrt(2)), never a parameter to train */
        fwd[v] = x->role == R_CONST && x->init_index >= 0 && is_float(x->dtype) && !frozen(g, x, used) &&
                 x->shape.rank > 0;
    }
    for (int k = 0; k < g->opt->nfreeze; k++)
        if (!used[k])
            fatal("--freeze '%s' matches no float initializer of %s", g->opt->freeze[k], g->opt->model);
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && fwd[n->in[j]] && diff_input(n->op, j))
                for (int k = 0; k < n->nout; k++)
                    fwd[n->out[k]] = is_float(g->val[n->out[k]].dtype);
    }
    bwd[g->loss] = 1;
    for (int i = g->nnode - 1; i >= 0; i--) {
        Node *n = &g->node[i];
        int live = 0;
        for (int k = 0; k < n->nout; k++)
            live |= bwd[n->out[k]];
        for (int j = 0; live && j < n->nin; j++)
            if (n->in[j] >= 0 && diff_input(n->op, j))
                bwd[n->in[j]] = 1;
    }
    for (int v = 0; v < nv; v++)
        act[v] = fwd[v] && bwd[v];
    return act;
}

void pass_autodiff(Graph *g)
{
    char *active = mark_active(g);
    int nparam = 0;
    for (int v = 0; v < g->nval; v++)
        if (active[v] && g->val[v].role == R_CONST) {
            g->val[v].role = R_PARAM;
            g->val[v].persistent = 0;
            nparam++;
        }
    if (!nparam)
        fatal("%s: the loss depends on no float initializer: nothing to train", g->opt->model);

    int nfwd = g->nfwd = g->nnode;
    int *grad = ir_alloc(sizeof(int) * (size_t)g->nval * 2 + 16);
    for (int v = 0; v < g->nval; v++)
        grad[v] = -1;
    Shape scalar = {0};
    grad[g->loss] = ir_value(g, "loss.grad", g->val[g->loss].dtype, &scalar, R_ACT);
    ir_node(g, OP_Ones, "loss.grad", 0, NULL, 1, &grad[g->loss]);

    int nval0 = g->nval; /* values made below are never differentiated */
    for (int i = nfwd - 1; i >= 0; i--) {
        Node *n = &g->node[i];
        int flows = 0;
        for (int k = 0; k < n->nout; k++)
            flows |= n->out[k] < nval0 && active[n->out[k]] && grad[n->out[k]] >= 0;
        if (flows)
            node_grad(g, i, grad, active);
    }
    for (int v = 0; v < nval0; v++)
        if (g->val[v].role == R_PARAM) {
            if (grad[v] < 0)
                die("parameter '%s' got no gradient", g->val[v].name);
            g->val[v].grad = grad[v];
        }
    ir_link(g);
}
