/* attention.c — scaled-dot-product attention as one FusedAttention node.
 *
 * requires: shape (every value's dtype and shape), before autodiff.
 * ensures:  each chain
 *             s = MatMul(q, kt)                    q [L.., t, d], kt [L.., d, s] (or with
 *                                                  transB, k [L.., s, d]: krow)
 *             s = s * c  or  s / c                 (optional; c a scalar constant)
 *             s = Where(m, -inf, s) or Where(m, s, -inf)   (optional, m bool [.., t, s])
 *                 or s + bias                      (optional, bias float [.., t, s])
 *             p = Softmax(s, axis -1)               [Casts of p to its own dtype]
 *             y = MatMul(p, v)                     v [L.., s, dv]
 *           whose intermediate values have no other reader becomes
 *             y, lse, scratch = FusedAttention(q, kt, v, bias)
 *           at the place of the last MatMul (a Where mask becomes the bias
 *           Where(m, -inf, 0), one node before it), and the chain's other
 *           nodes are dropped.  So the step never holds the [L.., t, s]
 *           scores or probabilities: the kernel (kernels/c/attn.c) works
 *           through the query rows a tile at a time and keeps each row's
 *           log-sum-exp for the backward, which recomputes the tile's
 *           probabilities (grad_nn.c: FusedAttentionGrad).  On --target cuda
 *           the kernels are kernels/cuda/attn.cu's (a block per query row,
 *           or per key for dk and dv; no workspace).
 *
 * Conditions: float32 or float64 throughout; q, kt, v with the same leading
 * dims L (the problems; no broadcasting between them); a bias whose leading
 * dims, right-aligned against L, are 1s, then L's own, then 1s (so problem
 * b reads bias (b / brep) % nbias: a causal mask [1, 1, t, s], a padding
 * mask [B, 1, t, s] or a per-head bias), and which no parameter reaches
 * through a differentiable op (the fused op gives the bias no gradient);
 * MatMuls without transA (the second one without transB).  Anything else
 * stays as it was.
 *
 * Not applied (the chain stays unfused): under --precision bf16 / fp16
 * (their GEMMs take 16-bit operands; the fused kernel computes in the
 * model's dtype), with --no-fuse, and in --eval builds.
 */
#include "ir.h"
#include "kernels.h"
#include "rules/tensor.h"

#include <math.h>
#include <string.h>

/* may a gradient reach v from a parameter?  Initializers not yet chosen as parameters count when they could be
 * (float, more than one element, not a buffer by the graph signature): autodiff decides after this pass */
static char *param_reach(const Graph *g)
{
    char *r = ir_alloc((size_t)g->nval);
    for (int v = 0; v < g->nval; v++) {
        const Value *x = &g->val[v];
        r[v] = x->role == R_PARAM || (x->role == R_CONST && x->init_index >= 0 && shape_numel(&x->shape) > 1 &&
                                      (x->dtype == DT_F32 || x->dtype == DT_F64) && x->sig != SIG_OTHER);
    }
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        int reach = 0;
        for (int j = 0; j < n->nin; j++)
            reach |= n->in[j] >= 0 && (op_info[n->op].diff >> j & 1) && r[n->in[j]];
        for (int j = 0; j < n->nout && reach; j++)
            r[n->out[j]] = 1;
    }
    return r;
}

/* the single node reading v, or -1 (read twice, a graph output, or not at all) */
static int only_reader(const Graph *g, const int *reader, int v)
{
    if (g->val[v].nuses != 1)
        return -1;
    for (int i = 0; i < g->noutput; i++)
        if (g->output[i] == v)
            return -1;
    return reader[v];
}

static int is_neg_inf(const Graph *g, int v)
{
    const Value *c = &g->val[v];
    return c->role == R_CONST && shape_numel(&c->shape) == 1 && ir_data(g, v) && tensor_const_f(c, 0) == -INFINITY;
}

static int64_t numel_of(const Shape *s, int from, int to)
{
    int64_t n = 1;
    for (int d = from; d < to; d++)
        n *= s->dim[d];
    return n;
}

/* bias b over the problems' leading dims L (rank lr): its (nbias, brep), or 0 when it does not fit */
static int bias_layout(const Shape *bs, const Shape *ys, int lr, int64_t t, int64_t s, int64_t *nbias, int64_t *brep)
{
    if (bs->rank < 2 || bs->rank - 2 > lr || bs->dim[bs->rank - 2] != t || bs->dim[bs->rank - 1] != s)
        return 0;
    int64_t lead[MAX_RANK];
    for (int d = 0; d < lr; d++) /* right-aligned, 1 where the bias has no dim */
        lead[d] = d < lr - (bs->rank - 2) ? 1 : bs->dim[d - (lr - (bs->rank - 2))];
    int a = 0, e = lr;
    while (a < lr && lead[a] == 1)
        a++;
    while (e > a && lead[e - 1] == 1)
        e--;
    for (int d = a; d < e; d++)
        if (lead[d] != ys->dim[d])
            return 0;
    *nbias = numel_of(ys, a, e);
    *brep = numel_of(ys, e, lr);
    return 1;
}

typedef struct {
    int softmax, scale_node, mask_node, first, last; /* node ids (-1: absent) */
    int q, kt, v, bias, mask, mask_true_masks;       /* value ids; mask: Where's condition */
    int krow;                                        /* the first MatMul's transB: kt is k [L.., s, d] */
    int64_t ws;                                      /* k_attention_workspace elements */
    int cast[4], ncast;                              /* Casts to the same dtype after the Softmax */
    double scale;
    int64_t nbias, brep;
} Chain;

/* the chain around Softmax node i, or 0 */
static int match(const Graph *g, const int *reader, const char *reach, int i, Chain *c)
{
    const Node *sm = &g->node[i];
    const Value *sv = &g->val[sm->in[0]];
    memset(c, -1, sizeof *c);
    c->scale = 1;
    if (sm->op != OP_Softmax || sv->shape.rank < 3 || (sv->dtype != DT_F32 && sv->dtype != DT_F64))
        return 0;
    int64_t axis = ir_attr_i(sm, "axis", -1);
    if (axis != -1 && axis != sv->shape.rank - 1)
        return 0;
    c->softmax = i;
    int pv = sm->out[0], last = only_reader(g, reader, pv);
    c->ncast = 0;
    while (last >= 0 && g->node[last].op == OP_Cast && c->ncast < 4 &&
           g->val[g->node[last].out[0]].dtype == sv->dtype) {
        c->cast[c->ncast++] = last; /* torch's softmax(x, dtype=float32) on a float32 x: no change */
        pv = g->node[last].out[0];
        last = only_reader(g, reader, pv);
    }
    if (last < 0 || g->node[last].op != OP_MatMul || g->node[last].in[0] != pv ||
        ir_attr_i(&g->node[last], "transA", 0) || ir_attr_i(&g->node[last], "transB", 0))
        return 0;
    c->last = last;
    c->v = g->node[last].in[1];
    int x = sm->in[0], p = sv->producer;
    if (p < 0 || only_reader(g, reader, x) != i)
        return 0;
    const Node *pn = &g->node[p];
    if (pn->op == OP_Where && (is_neg_inf(g, pn->in[1]) || is_neg_inf(g, pn->in[2]))) {
        c->mask_node = p, c->mask = pn->in[0], c->mask_true_masks = is_neg_inf(g, pn->in[1]);
        x = pn->in[c->mask_true_masks ? 2 : 1];
    } else if (pn->op == OP_Add) {
        for (int side = 0; side < 2 && c->mask_node < 0; side++) {
            int o = pn->in[!side];
            const Value *ov = &g->val[o];
            if (ov->dtype != sv->dtype || reach[o] || g->val[pn->in[side]].producer < 0)
                continue;
            const Node *q = &g->node[g->val[pn->in[side]].producer];
            if (q->op == OP_MatMul || q->op == OP_Mul || q->op == OP_Div || q->op == OP_Scale)
                c->mask_node = p, c->bias = o, x = pn->in[side];
        }
        if (c->mask_node < 0)
            return 0;
    }
    if (c->mask_node >= 0 && only_reader(g, reader, x) != c->mask_node)
        return 0;
    p = g->val[x].producer;
    if (p < 0)
        return 0;
    int y;
    if (tensor_scaling(g, &g->node[p], &y, &c->scale)) {
        c->scale_node = p;
        if (only_reader(g, reader, y) != p || (p = g->val[y].producer) < 0)
            return 0;
        x = y;
    }
    const Node *mm = &g->node[p];
    if (mm->op != OP_MatMul || ir_attr_i(mm, "transA", 0) || mm->out[0] != x)
        return 0;
    c->first = p, c->q = mm->in[0], c->kt = mm->in[1], c->krow = (int)ir_attr_i(mm, "transB", 0);
    /* shapes: q [L, t, d], kt [L, d, s] (krow: k [L, s, d]), v [L, s, dv], one dtype, the same L */
    const Shape *qs = &g->val[c->q].shape, *vs = &g->val[c->v].shape;
    Shape kts = g->val[c->kt].shape, *ks = &kts;
    if (c->krow && kts.rank >= 2) { /* as the transposed keys it stands for */
        int64_t tmp = kts.dim[kts.rank - 1];
        kts.dim[kts.rank - 1] = kts.dim[kts.rank - 2], kts.dim[kts.rank - 2] = tmp;
    }
    const Shape *ys = &g->val[g->node[last].out[0]].shape;
    int r = qs->rank;
    if (r < 3 || ks->rank != r || vs->rank != r || ys->rank != r)
        return 0;
    for (int d = 0; d < r - 2; d++)
        if (ks->dim[d] != qs->dim[d] || vs->dim[d] != qs->dim[d] || ys->dim[d] != qs->dim[d])
            return 0;
    if (ks->dim[r - 2] != qs->dim[r - 1] || vs->dim[r - 2] != ks->dim[r - 1])
        return 0;
    DType dt = sv->dtype;
    if (g->val[c->q].dtype != dt || g->val[c->kt].dtype != dt || g->val[c->v].dtype != dt)
        return 0;
    const int64_t t = qs->dim[r - 2], s = ks->dim[r - 1];
    c->ws = k_attention_workspace(numel_of(qs, 0, r - 2), t, s);
    if (c->ws > MAX_NUMEL)
        return 0;
    c->nbias = c->brep = 1;
    if (c->mask >= 0)
        return g->val[c->mask].dtype == DT_BOOL &&
               bias_layout(&g->val[c->mask].shape, qs, r - 2, t, s, &c->nbias, &c->brep);
    if (c->bias >= 0)
        return bias_layout(&g->val[c->bias].shape, qs, r - 2, t, s, &c->nbias, &c->brep);
    return 1;
}

void pass_attention(Graph *g)
{
    const Options *o = g->opt;
    if (o->precision != PREC_FP32 || o->no_fuse)
        return;
    const int cuda = !strcmp(o->target, "cuda");
    ir_link(g);
    int nn = g->nnode, *reader = ir_alloc(sizeof(int) * (size_t)g->nval);
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] >= 0)
                reader[g->node[i].in[j]] = i;
    char *reach = param_reach(g), *drop = ir_alloc((size_t)nn);
    int *before = ir_alloc(sizeof(int) * (size_t)nn), *repl = ir_alloc(sizeof(int) * (size_t)nn), fused = 0;
    for (int i = 0; i < nn; i++)
        before[i] = repl[i] = -1;
    for (int i = 0; i < nn; i++) {
        Chain c;
        if (!match(g, reader, reach, i, &c))
            continue;
        const char *name = ir_fmt("%s.attention", g->node[c.softmax].name);
        const int y = g->node[c.last].out[0];
        const DType dt = g->val[c.q].dtype;
        int r = g->val[c.q].shape.rank, bias = c.bias;
        if (c.mask >= 0) { /* the mask as a bias of 0 and -inf */
            int ninf = ir_scalar(g, ir_fmt("%s.neg_inf", name), dt, -INFINITY);
            int zero = ir_scalar(g, ir_fmt("%s.zero", name), dt, 0);
            Shape bs = g->val[c.mask].shape;
            bias = ir_value(g, ir_fmt("%s.bias", name), dt, &bs, R_ACT);
            int in[3] = {c.mask, c.mask_true_masks ? ninf : zero, c.mask_true_masks ? zero : ninf};
            before[c.last] = ir_node(g, OP_Where, ir_fmt("%s.bias", name), 3, in, 1, &bias);
        }
        /* the cpu kernel's workspace (checked in match); the cuda kernels need none */
        Shape ls = g->val[c.q].shape, ws = {1, {cuda ? 0 : c.ws}};
        ls.rank = r - 1;
        int out[3] = {y, ir_value(g, ir_fmt("%s.lse", name), dt, &ls, R_ACT),
                      ir_value(g, ir_fmt("%s.scratch", name), dt, &ws, R_ACT)};
        int in[4] = {c.q, c.kt, c.v, bias};
        int k = ir_node(g, OP_FusedAttention, name, bias >= 0 ? 4 : 3, in, 3, out);
        ir_attr_add(g, k, "scale", A_FLOAT)->f = c.scale;
        ir_attr_add(g, k, "nbias", A_INT)->i = c.nbias;
        ir_attr_add(g, k, "brep", A_INT)->i = c.brep;
        ir_attr_add(g, k, "krow", A_INT)->i = c.krow;
        repl[c.last] = k;
        drop[c.first] = drop[c.softmax] = 1;
        if (c.scale_node >= 0)
            drop[c.scale_node] = 1;
        if (c.mask_node >= 0)
            drop[c.mask_node] = 1;
        for (int j = 0; j < c.ncast; j++)
            drop[c.cast[j]] = 1;
        fused++;
    }
    if (!fused)
        return;
    Node *keep = ir_alloc(sizeof(Node) * (size_t)(nn + fused));
    int n = 0;
    for (int i = 0; i < nn; i++) {
        if (before[i] >= 0)
            keep[n++] = g->node[before[i]];
        if (repl[i] >= 0)
            keep[n++] = g->node[repl[i]];
        else if (!drop[i])
            keep[n++] = g->node[i];
    }
    ir_set_nodes(g, keep, n);
    ir_link(g);
}
