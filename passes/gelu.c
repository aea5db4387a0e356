/* gelu.c — the GELU an exporter writes as a composition, as one Gelu node.
 *
 * requires: shape (every value's dtype and shape), before autodiff.
 * ensures:  each chain computing, from x (float32 or float64),
 *             erf form   x * 0.5 * (1 + erf(x / sqrt 2))
 *                        the argument x / c (c = sqrt 2) or x * c (c = 1/sqrt 2)
 *             tanh form  x * 0.5 * (1 + tanh(c * (x + 0.044715 * x^3)))
 *                        c = sqrt(2/pi); x^3 as Pow(x, 3) or x * (x * x)
 *           (TorchScript's F.gelu and nn.GELU, both forms; Hugging Face's
 *           gelu_new / NewGELUActivation) becomes
 *             y = Gelu(x)   approximate none (erf) or tanh
 *           at the place of its last node, the chain's other nodes dropped.
 *           The product x * 0.5 * (1 + ...) is two Muls associated either way
 *           (0.5 applied first or last); Mul's and Add's operands are read in
 *           either order.  A chain is rewritten only where every constant is
 *           a scalar equal to the form's within float32 rounding (relative
 *           REL_TOL; Pow's exponent exactly 3) that autodiff will not train,
 *           every intermediate value has the chain's next node as its only
 *           reader (and is no graph output), and y has x's dtype and shape;
 *           anything else stays as it was.
 *
 * Why: the composition is three to five elementwise loops forward (fuse.c
 * joins some), more in the backward, and autodiff saves its intermediates;
 * under --precision bf16 each of them is a Cast pair.  Gelu is one loop
 * each way (kernels/c/fused.h's GELU, its cuda twin), saves nothing but x,
 * and reads a 16-bit x through its table (ops.def's TAB16).  Measured on
 * the benchmark GPT 256/6/256/8 (2026-11-28, 1 thread): activations 31 %
 * (fp32) and 28 % (bf16) smaller, the bf16 step 0.95x the CPU time; the
 * fp32 step 1.04x, as its backward computes erf again where the
 * composition's read the saved 1 + erf (docs/internals.md, "GELU").
 *
 * Not applied (the chain stays composed): with --no-fuse, and in --eval
 * builds (whose pipeline has neither this pass nor attention's).
 */
#include "ir.h"
#include "rules/tensor.h"

#include <float.h>
#include <math.h>

#define REL_TOL (4 * (double)FLT_EPSILON) /* a float32 constant rounded from the exact one, with room */

/* the forms' constants (kernels/c/fused.h's GELU computes with them) */
#define SQRT_2 1.41421356237309504880
#define SQRT_HALF 0.70710678118654752440
#define SQRT_2_PI 0.79788456080286535588 /* sqrt(2/pi) */
#define KAPPA 0.044715

enum { MAX_CHAIN = 12 }; /* nodes of the longest form: tanh with x * (x * x) */

typedef struct {
    const Graph *g;
    const int *reader; /* the node reading each value (its only reader where it has one) */
    int node[MAX_CHAIN], n;
} Chain;

/* the chain's link into node `by`: the node producing v where it is an op node, v is read once (by `by`) and is
 * no graph output; else -1 */
static int link_of(const Chain *c, int v, Op op, int by)
{
    const Graph *g = c->g;
    if (v < 0 || g->val[v].nuses != 1 || c->reader[v] != by)
        return -1;
    for (int i = 0; i < g->noutput; i++)
        if (g->output[i] == v)
            return -1;
    int p = g->val[v].producer;
    return p >= 0 && g->node[p].op == op && g->node[p].nout == 1 ? p : -1;
}

static void add(Chain *c, int node) { c->node[c->n++] = node; }

/* v is a scalar float constant equal to want within REL_TOL (exact when exact), and one autodiff will not
 * train (its trainable(): an initializer --params names, a signature's PARAMETER, or one of rank 1 or more):
 * with a learned constant the chain is no GELU */
static int is_const(const Graph *g, int v, double want, int exact)
{
    const Value *c = &g->val[v];
    if (c->role != R_CONST || !dtype_is_float(c->dtype) || shape_numel(&c->shape) != 1 || !ir_data(g, v))
        return 0;
    if (c->init_index >= 0 && (g->opt->nparams || c->sig == SIG_PARAMETER || c->shape.rank > 0))
        return 0;
    double f = tensor_const_f(c, 0);
    return exact ? f == want : fabs(f - want) <= REL_TOL * fabs(want);
}

/* node n's inputs are {a constant equal to want, something else}: the something else, or -1 */
static int other_than_const(const Graph *g, const Node *n, double want)
{
    if (n->nin != 2)
        return -1;
    for (int k = 0; k < 2; k++)
        if (is_const(g, n->in[k], want, 0) && !is_const(g, n->in[1 - k], want, 0))
            return n->in[1 - k];
    return -1;
}

/* cube (read by node `by`) is x^3: Pow(x, 3) or x * (x * x), either order */
static int is_cube(Chain *c, int cube, int x, int by)
{
    const Graph *g = c->g;
    int p = link_of(c, cube, OP_Pow, by);
    if (p >= 0) {
        add(c, p);
        return g->node[p].in[0] == x && is_const(g, g->node[p].in[1], 3, 1);
    }
    if ((p = link_of(c, cube, OP_Mul, by)) < 0)
        return 0;
    add(c, p);
    const Node *n = &g->node[p];
    for (int k = 0; k < 2; k++) {
        int sq = link_of(c, n->in[1 - k], OP_Mul, p);
        if (n->in[k] == x && sq >= 0 && g->node[sq].in[0] == x && g->node[sq].in[1] == x) {
            add(c, sq);
            return 1;
        }
    }
    return 0;
}

/* t (the Erf's or Tanh's output, read by node `by`) is erf(x / sqrt 2) (*approx 0) or
 * tanh(sqrt(2/pi) (x + 0.044715 x^3)) (*approx 1) */
static int is_inner(Chain *c, int t, int x, int by, int *approx)
{
    const Graph *g = c->g;
    int e = link_of(c, t, OP_Erf, by);
    if (e >= 0) {
        add(c, e);
        *approx = 0;
        int d = link_of(c, g->node[e].in[0], OP_Div, e);
        if (d >= 0) {
            add(c, d);
            return g->node[d].in[0] == x && is_const(g, g->node[d].in[1], SQRT_2, 0);
        }
        if ((d = link_of(c, g->node[e].in[0], OP_Mul, e)) < 0)
            return 0;
        add(c, d);
        return other_than_const(g, &g->node[d], SQRT_HALF) == x;
    }
    int th = link_of(c, t, OP_Tanh, by);
    if (th < 0)
        return 0;
    add(c, th);
    *approx = 1;
    int u = link_of(c, g->node[th].in[0], OP_Mul, th); /* sqrt(2/pi) * (x + 0.044715 x^3) */
    if (u < 0)
        return 0;
    add(c, u);
    int s = link_of(c, other_than_const(g, &g->node[u], SQRT_2_PI), OP_Add, u); /* x + 0.044715 x^3 */
    if (s < 0)
        return 0;
    add(c, s);
    for (int k = 0; k < 2; k++) {
        int w = g->node[s].in[k] == x ? link_of(c, g->node[s].in[1 - k], OP_Mul, s) : -1; /* 0.044715 x^3 */
        if (w >= 0) {
            add(c, w);
            return is_cube(c, other_than_const(g, &g->node[w], KAPPA), x, w);
        }
    }
    return 0;
}

/* node i is the last Mul of a GELU chain: its x, its form in *approx, the chain's nodes in c; else -1 */
static int match(Chain *c, int i, int *approx)
{
    const Graph *g = c->g;
    const Node *last = &g->node[i];
    c->n = 0;
    if (last->op != OP_Mul || last->nin != 2)
        return -1;
    /* the product's three factors: the inputs of the last Mul, one of them a Mul only it reads */
    for (int side = 0; side < 2; side++) {
        int m = link_of(c, last->in[side], OP_Mul, i);
        if (m < 0)
            continue;
        int f[3] = {last->in[1 - side], g->node[m].in[0], g->node[m].in[1]};
        int half = -1, sum = -1, x = -1;
        for (int k = 0; k < 3; k++) {
            int by = k ? m : i;
            if (half < 0 && is_const(g, f[k], 0.5, 0))
                half = f[k];
            else if (sum < 0 && link_of(c, f[k], OP_Add, by) >= 0)
                sum = link_of(c, f[k], OP_Add, by);
            else if (x < 0)
                x = f[k];
        }
        const Value *xv = x >= 0 ? &g->val[x] : NULL, *yv = &g->val[last->out[0]];
        if (half < 0 || sum < 0 || !xv || (xv->dtype != DT_F32 && xv->dtype != DT_F64) ||
            yv->dtype != xv->dtype || !shape_eq(&yv->shape, &xv->shape))
            continue;
        c->n = 0;
        add(c, i), add(c, m), add(c, sum);
        int t = other_than_const(g, &g->node[sum], 1.0); /* 1 + erf(..) or 1 + tanh(..) */
        if (t >= 0 && is_inner(c, t, x, sum, approx))
            return x;
        c->n = 0;
    }
    return -1;
}

void pass_gelu(Graph *g)
{
    if (g->opt->no_fuse)
        return;
    ir_link(g);
    const int nn = g->nnode;
    int *reader = ir_alloc(sizeof(int) * (size_t)g->nval), *repl = ir_alloc(sizeof(int) * (size_t)nn), found = 0;
    char *drop = ir_alloc((size_t)nn);
    for (int i = 0; i < nn; i++) {
        repl[i] = -1;
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] >= 0)
                reader[g->node[i].in[j]] = i;
    }
    Chain c = {.g = g, .reader = reader};
    for (int i = 0; i < nn; i++) {
        int approx = 0, x = match(&c, i, &approx);
        if (x < 0)
            continue;
        int y = g->node[i].out[0];
        /* named after the chain's Erf / Tanh (its fourth node, match's order): "/h.0/mlp/gelu/Erf.gelu" */
        int k = ir_node(g, OP_Gelu, ir_fmt("%s.gelu", g->node[c.node[3]].name), 1, &x, 1, &y);
        if (approx)
            ir_attr_add(g, k, "approximate", A_STRING)->s = ir_strdup("tanh");
        repl[i] = k;
        for (int j = 0; j < c.n; j++)
            drop[c.node[j]] = 1;
        found++;
    }
    if (!found)
        return;
    Node *keep = ir_alloc(sizeof(Node) * (size_t)nn);
    int n = 0;
    for (int i = 0; i < nn; i++)
        if (repl[i] >= 0)
            keep[n++] = g->node[repl[i]];
        else if (!drop[i])
            keep[n++] = g->node[i];
    ir_set_nodes(g, keep, n);
    ir_link(g);
}
