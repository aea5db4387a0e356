/* compose.c — fold's rewrites of ONNX ops that are compositions of others,
 * each into nodes fsdpc computes and differentiates (both targets follow):
 *
 *   Sum, Mean         a chain of Adds (fold.c's variadic chain); Mean then
 *                     scales by 1/n;
 *   ReduceSumSquare   ReduceSum(x * x);       ReduceL1  ReduceSum(|x|);
 *   ReduceL2          sqrt(ReduceSum(x * x)); ReduceLogSum  log(ReduceSum(x));
 *   ReduceLogSumExp   m + log(ReduceSum(exp(x - m))), m = ReduceMax(x) kept
 *                     as a constant of the shift (finite for large x; its
 *                     gradient paths cancel: d/dx is softmax(x));
 *   OneHot            Where(Equal(indices as int64, wrapped when negative,
 *                     unsqueezed at axis; [0, depth) along axis), on, off);
 *   ConvTranspose     the data gradient of the Conv over its output: with
 *                     y = ConvTranspose(x, w), Conv(y-shaped input, w) has
 *                     x's shape (same strides, pads, dilations, group; w
 *                     [c, m/group, kh, kw] is that Conv's weight), and y is
 *                     its dx for the output gradient x: a ConvGrad node
 *                     computing dx only (need 1), whose gradient rule
 *                     (grad_nn.c) makes training work; output_shape's pads
 *                     computed and output padding folded into xshape by
 *                     nn_convt_geom; the bias an Add over channels.
 *   LpPool            (sum over each window of |x|^p)^(1/p): the sum a
 *                     depthwise Conv (group = channels) of |x|^p with a
 *                     constant window of ones, its pads zeros as ONNX's
 *                     cases pad; ceil_mode's last partial window is more
 *                     zero padding at the end; p 1 is |x| and no root, p 2
 *                     x * x and Sqrt, else Pow both ways.
 *
 * A rewrite keeps node id as the node writing a ReduceSum (so fold's axes,
 * keepdims and noop_with_empty_axes handling stays ReduceSum's own) or
 * replaces it; compose_reduce returns the output its epilogue (compose_
 * reduce_end) must write.
 */
#include "fold.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

/* op(in[0..nin)) named NODE/suffix writing out (-1: a new value), visited; its output */
static int node_n(Sweep *s, int id, Op op, const int *in, int nin, const char *suffix, int out)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node(g, op, name, nin, in, 1, &out);
    visit(s, c);
    return out;
}

static int node2(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
{
    int in[2] = {a, b};
    return node_n(s, id, op, in, b < 0 ? 1 : 2, suffix, out);
}

/* The reductions written as a ReduceSum: node id becomes ReduceSum over a
 * new input (x * x, |x|, exp(x - m)) and writes a new value; returns the
 * node's own output, which compose_reduce_end writes from it (-1: node id
 * is not one of them). */
int compose_reduce(Sweep *s, int id, int *shift)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int x = n.in[0];
    *shift = -1;
    switch (n.op) {
    case OP_ReduceSumSquare: case OP_ReduceL2: x = node2(s, id, OP_Mul, x, x, "square", -1); break;
    case OP_ReduceL1: x = node2(s, id, OP_Abs, x, -1, "abs", -1); break;
    case OP_ReduceLogSum: break;
    case OP_ReduceLogSumExp: { /* m = max over the axes, kept: x - m broadcasts */
        int c = ir_node1(g, OP_ReduceMax, ir_fmt("%s/max", n.name), x, -1,
                         ir_value(g, ir_fmt("%s/max.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT));
        for (int i = 0; i < g->node[id].nattr; i++) {
            const Attr a = g->node[id].attr[i];
            if (!strcmp(a.name, "axes"))
                ir_attr_ints_add(g, c, "axes", a.ints, a.n);
            else if (!strcmp(a.name, "noop_with_empty_axes"))
                ir_attr_add(g, c, a.name, A_INT)->i = a.i;
        }
        ir_attr_add(g, c, "keepdims", A_INT)->i = 1;
        visit(s, c);
        *shift = g->node[c].out[0];
        x = node2(s, id, OP_Exp, node2(s, id, OP_Sub, x, *shift, "shifted", -1), -1, "exp", -1);
        break;
    }
    default:
        return -1;
    }
    int y = g->node[id].out[0];
    g->node[id].op = OP_ReduceSum;
    g->node[id].in[0] = x;
    g->node[id].out[0] = ir_value(g, ir_fmt("%s/sum.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return y;
}

/* After the ReduceSum (node id, op of the original node `of`): its output
 * turned into the original's y. */
void compose_reduce_end(Sweep *s, int id, Op of, int y, int shift)
{
    Graph *g = s->g;
    int sum = g->node[id].out[0];
    switch (of) {
    case OP_ReduceSumSquare: case OP_ReduceL1: node2(s, id, OP_Identity, sum, -1, "out", y); break;
    case OP_ReduceL2: node2(s, id, OP_Sqrt, sum, -1, "sqrt", y); break;
    case OP_ReduceLogSum: node2(s, id, OP_Log, sum, -1, "log", y); break;
    case OP_ReduceLogSumExp: {
        int lse = node2(s, id, OP_Log, sum, -1, "log", -1);
        /* m in the output's shape: without keepdims, the kept max reshaped like the sum */
        const Shape *ys = &g->val[sum].shape;
        int m = shift;
        if (g->val[shift].shape.rank != ys->rank) {
            Shape cs = {.rank = 1, .dim = {ys->rank}};
            int sv = ir_const(g, ir_fmt("%s/shape.%d", g->node[id].name, s->nnew++), DT_I64, &cs, ys->dim);
            m = node2(s, id, OP_Reshape, shift, sv, "max_out", -1);
        }
        node2(s, id, OP_Add, lse, m, "lse", y);
        break;
    }
    default: break;
    }
}

/* Mean of n inputs: their Add chain (node id, made an Add by the caller)
 * writes a new value, scaled by 1/n into y.  Returns y, or -1 for n = 1. */
int compose_mean(Sweep *s, int id)
{
    Graph *g = s->g;
    if (g->node[id].nin < 2)
        return -1;
    int y = g->node[id].out[0];
    g->node[id].out[0] = ir_value(g, ir_fmt("%s/sum.%d", g->node[id].name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return y;
}

void compose_mean_end(Sweep *s, int id, int n, int y)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/mean", g->node[id].name);
    int c = ir_node1(g, OP_Scale, name, g->node[id].out[0], -1, y);
    ir_attr_add(g, c, "alpha", A_FLOAT)->f = 1.0 / n;
    visit(s, c);
}

/* OneHot(indices, depth, values) with attr axis: see the head. */
void compose_onehot(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *dv = fold_const_in(g, &n, 1, "depth");
    if (shape_numel(&dv->shape) != 1)
        node_fatal(g, &n, "depth must be a scalar (or a 1-element tensor), not of shape %s", shape_str(&dv->shape));
    double dd = tensor_const_f(dv, 0);
    if (!(dd >= 1 && dd <= (double)(1 << 24)))
        node_fatal(g, &n, "depth %g: fsdpc takes 1 to 2^24 classes", dd);
    int64_t depth = (int64_t)dd;
    const Value *iv = &g->val[n.in[0]], *vv = &g->val[n.in[2]];
    if (vv->shape.rank != 1 || vv->shape.dim[0] != 2)
        node_fatal(g, &n, "values must hold 2 elements [off, on], not of shape %s", shape_str(&vv->shape));
    int r = iv->shape.rank + 1;
    int64_t ax = ir_attr_i(&n, "axis", -1);
    if (ax < -r || ax >= r)
        node_fatal(g, &n, "axis %lld is out of range for an output of rank %d", (long long)ax, r);
    if (ax < 0)
        ax += r;
    int idx = n.in[0];
    if (iv->dtype != DT_I64) {
        int c = ir_node1(g, OP_Cast, ir_fmt("%s/int64", n.name), idx, -1,
                         ir_value(g, ir_fmt("%s/int64.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT));
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(DT_I64);
        visit(s, c);
        idx = g->node[c].out[0];
    }
    Shape sc = {.rank = 0};
    int64_t zero = 0;
    int z = ir_const(g, ir_fmt("%s/zero.%d", n.name, s->nnew++), DT_I64, &sc, &zero);
    int dpt = ir_const(g, ir_fmt("%s/depth.%d", n.name, s->nnew++), DT_I64, &sc, &depth);
    int neg = node2(s, id, OP_Less, idx, z, "negative", -1);
    int in3[3] = {neg, node2(s, id, OP_Add, idx, dpt, "wrapped", -1), idx};
    idx = node_n(s, id, OP_Where, in3, 3, "index", -1);
    int c = ir_node1(g, OP_Unsqueeze, ir_fmt("%s/at_axis", n.name), idx, -1,
                     ir_value(g, ir_fmt("%s/at_axis.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT));
    ir_attr_ints_add(g, c, "axes", &ax, 1);
    visit(s, c);
    idx = g->node[c].out[0];
    /* [0, depth) along axis, 1 elsewhere */
    Shape ps = {.rank = (int)(r - ax)};
    ps.dim[0] = depth;
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    int64_t *pos = ir_alloc(sizeof(int64_t) * (size_t)depth);
    for (int64_t i = 0; i < depth; i++)
        pos[i] = i;
    int pv = ir_const(g, ir_fmt("%s/classes.%d", n.name, s->nnew++), DT_I64, &ps, pos);
    int hit = node2(s, id, OP_Equal, idx, pv, "hit", -1);
    int64_t k0 = 0, k1 = 1;
    int i0 = ir_const(g, ir_fmt("%s/k0.%d", n.name, s->nnew++), DT_I64, &sc, &k0);
    int i1 = ir_const(g, ir_fmt("%s/k1.%d", n.name, s->nnew++), DT_I64, &sc, &k1);
    int off = node2(s, id, OP_Gather, n.in[2], i0, "off", -1), on = node2(s, id, OP_Gather, n.in[2], i1, "on", -1);
    int in4[3] = {hit, on, off};
    node_n(s, id, OP_Where, in4, 3, "onehot", n.out[0]);
}

/* ConvTranspose(x, w, b) with its Conv attributes: see the head.  Node id is
 * left unvisited (fold drops it); its output is written by the new nodes. */
void compose_convt(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int b = n.nin > 2 ? n.in[2] : -1;
    const Value *xv = &g->val[n.in[0]], *wv = &g->val[n.in[1]];
    Shape ys;
    int64_t pads[4];
    nn_convt_geom(g, &n, xv, wv, &ys, pads);
    DType dt = xv->dtype;
    int y = n.out[0];
    if (b >= 0)
        y = ir_value(g, ir_fmt("%s/convt.%d", n.name, s->nnew++), dt, &ys, R_ACT);
    g->val[y].dtype = dt;
    g->val[y].shape = ys;
    Shape empty = {1, {0}};
    int in[3] = {n.in[0], -1, n.in[1]};
    int out[4] = {y, ir_value(g, ir_fmt("%s/dw.%d", n.name, s->nnew++), dt, &empty, R_ACT),
                  ir_value(g, ir_fmt("%s/db.%d", n.name, s->nnew++), dt, &empty, R_ACT),
                  ir_value(g, ir_fmt("%s/scratch.%d", n.name, s->nnew++), dt, &empty, R_ACT)}; /* sized below */
    int c = ir_node(g, OP_ConvGrad, ir_fmt("%s/convt", n.name), 3, in, 4, out);
    nn_conv_attrs(g, c, &n, pads);
    ir_attr_add(g, c, "need", A_INT)->i = 1;
    ir_attr_ints_add(g, c, "xshape", ys.dim, 4);
    ir_attr_ints_add(g, c, "wshape", g->val[n.in[1]].shape.dim, 4);
    KConv2d p;
    nn_conv_geom(g, &g->node[c], &ys, &g->val[n.in[1]].shape, &p);
    g->val[out[3]].shape.dim[0] = nn_conv_ws(&p);
    visit(s, c);
    if (b < 0)
        return;
    int64_t ax[2] = {1, 2};
    int u = ir_node1(g, OP_Unsqueeze, ir_fmt("%s/bias", n.name), b, -1,
                     ir_value(g, ir_fmt("%s/bias.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT));
    ir_attr_ints_add(g, u, "axes", ax, 2);
    visit(s, u);
    node2(s, id, OP_Add, y, g->node[u].out[0], "add_bias", n.out[0]);
}

/* a scalar constant of dtype dt (float32 or float64) holding v */
static int scalar(Sweep *s, int id, DType dt, double v, const char *what)
{
    Shape sc = {0, {0}};
    float f = (float)v;
    return ir_const(s->g, ir_fmt("%s/%s.%d", s->g->node[id].name, what, s->nnew++), dt, &sc,
                    dt == DT_F64 ? (const void *)&v : (const void *)&f);
}

/* LpPool(x) with its pooling attributes (2-D after lift_1d, pads explicit): see the head.  Node id is left
 * unvisited (fold drops it); its output is written by the new nodes. */
void compose_lppool(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *xv = &g->val[n.in[0]];
    DType dt = xv->dtype;
    if (dt != DT_F32 && dt != DT_F64)
        node_fatal(g, &n, "input '%s' is %s; LpPool takes float32 or float64", ir_q(xv->name), dtype_name(dt));
    KPool2d q;
    nn_pool_geom(g, &n, &xv->shape, &q);
    int64_t p = ir_attr_i(&n, "p", 2);
    if (p < 1 || p > 64)
        node_fatal(g, &n, "attribute p = %lld is not supported (fsdpc supports 1 to 64)", (long long)p);
    const int64_t lim = (int64_t)1 << 28; /* the window of ones: channels x kh x kw elements */
    if (q.kh > lim / q.kw || q.c > lim / (q.kh * q.kw))
        node_fatal(g, &n, "%lld channels of a %lld x %lld window: more than 2^28 window elements is not supported",
                   (long long)q.c, (long long)q.kh, (long long)q.kw);
    /* ceil_mode: the padded input extended so that the floor of the Conv's count is the pool's ceil */
    int64_t eh = (q.oh - 1) * q.sh + q.dh * (q.kh - 1) + 1 - (q.h + q.pt + q.pb);
    int64_t ew = (q.ow - 1) * q.sw + q.dw * (q.kw - 1) + 1 - (q.w + q.pl + q.pr);
    int64_t pads[4] = {q.pt, q.pl, q.pb + (eh > 0 ? eh : 0), q.pr + (ew > 0 ? ew : 0)};
    int64_t numel = q.c * q.kh * q.kw, ks[2] = {q.kh, q.kw}, st[2] = {q.sh, q.sw}, dl[2] = {q.dh, q.dw};
    void *ones = ir_alloc((size_t)numel * dtype_size(dt));
    for (int64_t i = 0; i < numel; i++)
        if (dt == DT_F64)
            ((double *)ones)[i] = 1;
        else
            ((float *)ones)[i] = 1;
    Shape ws = {4, {q.c, 1, q.kh, q.kw}};
    int w = ir_const(g, ir_fmt("%s/window.%d", n.name, s->nnew++), dt, &ws, ones);
    int x = n.in[0];
    int xp = p == 2 ? node2(s, id, OP_Mul, x, x, "square", -1) : node2(s, id, OP_Abs, x, -1, "abs", -1);
    if (p > 2)
        xp = node2(s, id, OP_Pow, xp, scalar(s, id, dt, (double)p, "p"), "pow", -1);
    int y = p == 1 ? n.out[0] : ir_value(g, ir_fmt("%s/sum.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int out[2] = {y, ir_value(g, ir_fmt("%s/scratch.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT)};
    int c = ir_node(g, OP_Conv, ir_fmt("%s/sum", n.name), 2, (int[]){xp, w}, 2, out);
    ir_attr_ints_add(g, c, "kernel_shape", ks, 2);
    ir_attr_ints_add(g, c, "strides", st, 2);
    ir_attr_ints_add(g, c, "dilations", dl, 2);
    ir_attr_ints_add(g, c, "pads", pads, 4);
    ir_attr_add(g, c, "group", A_INT)->i = q.c;
    visit(s, c);
    if (p == 2)
        node2(s, id, OP_Sqrt, y, -1, "root", n.out[0]);
    else if (p > 2)
        node2(s, id, OP_Pow, y, scalar(s, id, dt, 1.0 / (double)p, "inv_p"), "root", n.out[0]);
}
