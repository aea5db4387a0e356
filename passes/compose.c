/* compose.c — fold's rewrites of ONNX ops that are compositions of others,
 * each into nodes fsdpc computes and differentiates (both targets follow):
 *
 *   Sum, Mean         a chain of Adds (compose_variadic); Mean then
 *                     scales by 1/n;  Min, Max  a chain of two-input ones;
 *   Gemm              MatMul(transA, transB) [-> Scale alpha] [-> Add
 *                     (Scale beta) C], the MatMul reading through a
 *                     Transpose of its operand as fold.c's MatMuls do;
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
 *   Hardmax           Cast(position == ArgMax(x, axis)): the first maximum;
 *   LpNormalization   x / (sum over axis of |x|^p)^(1/p), p 1 or 2 (a zero norm: 0);
 *   Swish             x sigmoid(alpha x);      PRelu  Where(x < 0, x slope, x);
 *   Shrink            Where(x < -lambd, x + bias, Where(x > lambd, x - bias, 0));
 *   GlobalMaxPool     ReduceMax over the spatial axes;
 *   EyeLike           a constant: ones on diagonal k;
 *   SpaceToDepth, DepthToSpace (DCR, CRD)   Reshape, Transpose, Reshape;
 *   InstanceNormalization, GroupNormalization   the mean and variance of
 *                     ReduceMeans over each (sample, channel or group),
 *                     then scale and bias per channel (GroupNormalization-18's
 *                     per group);
 *   CenterCropPad     a centred Slice of the longer axes, a centred zero Pad
 *                     of the shorter;
 *   AffineGrid        the base grid (a constant, align_corners as ONNX) times
 *                     theta^T: [N, H W, 3] x [N, 3, 2] (3-D: 4 x 3);
 *   SwiGLU            A sigmoid(alpha A) B;
 *   HannWindow, HammingWindow, BlackmanWindow   constants;
 *   LRN               x / (bias + alpha / size sum of x^2 over the channel
 *                     window)^beta, the sum an AveragePool (padded, counting
 *                     the pads) over [N, 1, C, spatial] times size;
 *   ReverseSequence   GatherElements at constant indices (sequence_lens a
 *                     constant).
 *
 * A rewrite keeps node id as the node writing a ReduceSum (so fold's axes,
 * keepdims and noop_with_empty_axes handling stays ReduceSum's own) or
 * replaces it; compose_reduce returns the output its epilogue (compose_
 * reduce_end) must write.
 */
#include "fold.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <math.h>
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

/* Min / Max of n inputs: a chain of n - 1 two-input nodes (1 when it did
 * the work); of one input, an Identity. */
int compose_variadic(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    if (n.nin == 1) {
        g->node[id].op = OP_Identity;
        return 0;
    }
    for (int i = 0; i < n.nin; i++)
        if (n.in[i] < 0)
            node_fatal(g, &n, "input %d is empty; %s takes no optional inputs", i, op_info[n.op].name);
    if (n.nin == 2)
        return 0;
    int acc = n.in[0];
    for (int i = 1; i < n.nin; i++)
        acc = fold_expand(s, id, n.op, acc, n.in[i], ir_fmt("%s%d", op_info[n.op].name, i),
                     i == n.nin - 1 ? n.out[0] : -1);
    return 1;
}

/* Append node op(a[, b]) named GEMM/suffix and visit it; its output is `out`,
 * or a new value. */
static int gemm_part(Sweep *s, int gemm, Op op, int a, int b, const char *suffix, int out, double alpha)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[gemm].name, suffix);
    if (out < 0)
        out = ir_value(g, name, DT_UNDEF, NULL, R_ACT);
    int id = ir_node1(g, op, name, a, b, out);
    if (op == OP_Scale)
        ir_attr_add(g, id, "alpha", A_FLOAT)->f = alpha;
    if (op == OP_MatMul) {
        ir_attr_add(g, id, "transA", A_INT)->i = ir_attr_i(&g->node[gemm], "transA", 0);
        ir_attr_add(g, id, "transB", A_INT)->i = ir_attr_i(&g->node[gemm], "transB", 0);
        fold_matmul_operands(s, id);
    }
    visit(s, id);
    return out;
}

/* Gemm, Y = alpha op(A) op(B) + beta C: see the head. */
void compose_gemm(Sweep *s, int id)
{
    Node gm = s->g->node[id]; /* copy: appending nodes moves g->node */
    double alpha = ir_attr_f(&gm, "alpha", 1.0), beta = ir_attr_f(&gm, "beta", 1.0);
    int c = gm.nin > 2 ? gm.in[2] : -1, y = gm.out[0];
    int scaled = alpha != 1.0, biased = c >= 0 && beta != 0.0;
    int t = gemm_part(s, id, OP_MatMul, gm.in[0], gm.in[1], "MatMul", scaled || biased ? -1 : y, 0);
    if (scaled)
        t = gemm_part(s, id, OP_Scale, t, -1, "alpha", biased ? -1 : y, alpha);
    if (biased) {
        if (beta != 1.0)
            c = gemm_part(s, id, OP_Scale, c, -1, "beta", -1, beta);
        gemm_part(s, id, OP_Add, t, c, "Add", y, 0);
    }
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
    return ir_scalar(s->g, ir_fmt("%s/%s.%d", s->g->node[id].name, what, s->nnew++), dt, v);
}

/* The window sums of x [N, C, H, W] over q's windows (pads zeros; ceil_mode's last partial window more zero
 * padding at the end): a depthwise Conv with a constant window of ones, writing out (-1: a new value); its
 * output.  Shared by LpPool and the 3-D pools (lift3d.c). */
int compose_sum_pool(Sweep *s, int id, int x, const KPool2d *q, int out)
{
    Graph *g = s->g;
    const Node *n = &g->node[id];
    DType dt = g->val[x].dtype;
    const int64_t lim = (int64_t)1 << 28; /* the window of ones: channels x kh x kw elements */
    if (q->kh > lim / q->kw || q->c > lim / (q->kh * q->kw))
        node_fatal(g, n, "%lld channels of a %lld x %lld window: more than 2^28 window elements is not supported",
                   (long long)q->c, (long long)q->kh, (long long)q->kw);
    /* ceil_mode: the padded input extended so that the floor of the Conv's count is the pool's ceil */
    int64_t eh = (q->oh - 1) * q->sh + q->dh * (q->kh - 1) + 1 - (q->h + q->pt + q->pb);
    int64_t ew = (q->ow - 1) * q->sw + q->dw * (q->kw - 1) + 1 - (q->w + q->pl + q->pr);
    int64_t pads[4] = {q->pt, q->pl, q->pb + (eh > 0 ? eh : 0), q->pr + (ew > 0 ? ew : 0)};
    int64_t numel = q->c * q->kh * q->kw, ks[2] = {q->kh, q->kw}, st[2] = {q->sh, q->sw}, dl[2] = {q->dh, q->dw};
    void *ones = ir_alloc((size_t)numel * dtype_size(dt));
    for (int64_t i = 0; i < numel; i++)
        if (dt == DT_F64)
            ((double *)ones)[i] = 1;
        else
            ((float *)ones)[i] = 1;
    Shape ws = {4, {q->c, 1, q->kh, q->kw}};
    int w = ir_const(g, ir_fmt("%s/window.%d", n->name, s->nnew++), dt, &ws, ones);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s/sum.%d", n->name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int outs[2] = {out, ir_value(g, ir_fmt("%s/scratch.%d", n->name, s->nnew++), DT_UNDEF, NULL, R_ACT)};
    int c = ir_node(g, OP_Conv, ir_fmt("%s/sum", n->name), 2, (int[]){x, w}, 2, outs);
    ir_attr_ints_add(g, c, "kernel_shape", ks, 2);
    ir_attr_ints_add(g, c, "strides", st, 2);
    ir_attr_ints_add(g, c, "dilations", dl, 2);
    ir_attr_ints_add(g, c, "pads", pads, 4);
    ir_attr_add(g, c, "group", A_INT)->i = q->c;
    visit(s, c);
    return out;
}

/* LpPool's p (attribute p of node id) checked: 1 to 64 */
int64_t compose_lp_p(Sweep *s, int id)
{
    const Node *n = &s->g->node[id];
    int64_t p = ir_attr_i(n, "p", 2);
    if (p < 1 || p > 64)
        node_fatal(s->g, n, "attribute p = %lld is not supported (fsdpc supports 1 to 64)", (long long)p);
    return p;
}

/* |x|^p (p 2: x * x), the summand of LpPool; its output */
int compose_lp_power(Sweep *s, int id, int x, int64_t p)
{
    DType dt = s->g->val[x].dtype;
    int xp = p == 2 ? node2(s, id, OP_Mul, x, x, "square", -1) : node2(s, id, OP_Abs, x, -1, "abs", -1);
    if (p > 2)
        xp = node2(s, id, OP_Pow, xp, scalar(s, id, dt, (double)p, "p"), "pow", -1);
    return xp;
}

/* y^(1/p) (p 1: y itself, p 2: Sqrt) written into out */
void compose_lp_root(Sweep *s, int id, int y, int64_t p, int out)
{
    DType dt = s->g->val[y].dtype;
    if (p == 1)
        node2(s, id, OP_Identity, y, -1, "root", out);
    else if (p == 2)
        node2(s, id, OP_Sqrt, y, -1, "root", out);
    else
        node2(s, id, OP_Pow, y, scalar(s, id, dt, 1.0 / (double)p, "inv_p"), "root", out);
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
    if (!shape_numel(&xv->shape))
        node_fatal(g, &n, "input %s is empty: not supported", shape_str(&xv->shape));
    int64_t p = compose_lp_p(s, id);
    int xp = compose_lp_power(s, id, n.in[0], p);
    int y = compose_sum_pool(s, id, xp, &q, p == 1 ? n.out[0] : -1);
    if (p > 1)
        compose_lp_root(s, id, y, p, n.out[0]);
}

/* ---- small compositions ------------------------------------------------------ */

/* op(x) with the ints attribute name = v[0..n) (and keepdims when keep >= 0), writing out; its output */
static int node_ints(Sweep *s, int id, Op op, int x, const char *name, const int64_t *v, int n, int keep,
                     const char *suffix, int out)
{
    Graph *g = s->g;
    if (out < 0)
        out = ir_value(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, op, ir_fmt("%s/%s", g->node[id].name, suffix), x, -1, out);
    ir_attr_ints_add(g, c, name, v, n);
    if (keep >= 0)
        ir_attr_add(g, c, "keepdims", A_INT)->i = keep;
    visit(s, c);
    return out;
}

/* x reshaped to dims[0..n) */
static int reshape(Sweep *s, int id, int x, const int64_t *dims, int n, const char *suffix, int out)
{
    Shape cs = {1, {n}};
    int sv = ir_const(s->g, ir_fmt("%s/%s.shape.%d", s->g->node[id].name, suffix, s->nnew++), DT_I64, &cs, dims);
    return node2(s, id, OP_Reshape, x, sv, suffix, out);
}

int fold_cast(Sweep *s, int id, int x, DType to, const char *suffix, int out)
{
    Graph *g = s->g;
    if (out < 0)
        out = ir_value(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, OP_Cast, ir_fmt("%s/%s", g->node[id].name, suffix), x, -1, out);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(to);
    visit(s, c);
    return out;
}

int fold_scalar(Sweep *s, int id, DType dt, double v, const char *suffix)
{
    return ir_scalar(s->g, ir_fmt("%s/%s.%d", s->g->node[id].name, suffix, s->nnew++), dt, v);
}

/* the input 0 of node n: float32 or float64, else one line */
static DType float_in(const Graph *g, const Node *n)
{
    DType t = g->val[n->in[0]].dtype;
    if (t != DT_F32 && t != DT_F64)
        node_fatal(g, n, "input '%s' is %s: not supported (float32 or float64)", ir_q(g->val[n->in[0]].name),
                   dtype_name(t));
    return t;
}

/* a constant of dtype t and shape sh, element i = f(i, ctx) (f32, f64, i64, i32, bool) */
int fold_const_fill(Sweep *s, int id, DType t, const Shape *sh, double (*f)(int64_t, const int64_t *),
                    const int64_t *ctx, const char *suffix)
{
    int64_t n = shape_numel(sh);
    size_t es = dtype_size(t);
    void *p = ir_alloc(es * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        dtype_set_f(p, i, t, f(i, ctx));
    return ir_const(s->g, ir_fmt("%s/%s.%d", s->g->node[id].name, suffix, s->nnew++), t, sh, p);
}

double fold_index_of(int64_t i, const int64_t *ctx) { (void)ctx; return (double)i; }

/* ctx: {cols, k}: 1 where column - row = k */
static double eye_at(int64_t i, const int64_t *ctx) { return i % ctx[0] - i / ctx[0] == ctx[1]; }

void compose_hardmax(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    int r = g->val[n.in[0]].shape.rank, ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", -1), r, "axis");
    int am = ir_value(g, ir_fmt("%s/argmax.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, OP_ArgMax, ir_fmt("%s/argmax", n.name), n.in[0], -1, am);
    ir_attr_add(g, c, "axis", A_INT)->i = ax;
    ir_attr_add(g, c, "keepdims", A_INT)->i = 1;
    expand_argmax(s, c); /* writes am; node c itself is dropped */
    Shape ps = {r - ax, {g->val[n.in[0]].shape.dim[ax]}}; /* [len, 1...]: positions along the axis */
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    int pos = fold_const_fill(s, id, DT_I64, &ps, fold_index_of, NULL, "positions");
    fold_cast(s, id, node2(s, id, OP_Equal, pos, am, "is_max", -1), t, "onehot", n.out[0]);
}

void compose_lpnorm(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    float_in(g, &n);
    int r = g->val[n.in[0]].shape.rank;
    int64_t ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", -1), r, "axis"), p = ir_attr_i(&n, "p", 2);
    if (p != 1 && p != 2)
        node_fatal(g, &n, "attribute p = %lld: ONNX allows 1 or 2", (long long)p);
    int x = n.in[0], a = p == 1 ? node2(s, id, OP_Abs, x, -1, "abs", -1) : node2(s, id, OP_Mul, x, x, "square", -1);
    int sum = node_ints(s, id, OP_ReduceSum, a, "axes", &ax, 1, 1, "sum", -1);
    /* a zero sum (every x of it 0) is taken as 1 before the root: y 0 there, as ONNX's cases ask, and a finite
     * gradient (the root's at 0 is not) */
    DType t = g->val[x].dtype;
    int in[3] = {node2(s, id, OP_Equal, sum, fold_scalar(s, id, t, 0, "zero"), "zero_sum", -1),
                 fold_scalar(s, id, t, 1, "one"), sum};
    int safe = node_n(s, id, OP_Where, in, 3, "safe_sum", -1);
    int norm = p == 1 ? safe : node2(s, id, OP_Sqrt, safe, -1, "norm", -1);
    node2(s, id, OP_Div, x, norm, "normalized", n.out[0]);
}

void compose_swish(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    int ax = node2(s, id, OP_Mul, n.in[0], fold_scalar(s, id, t, ir_attr_f(&n, "alpha", 1.0), "alpha"), "scaled", -1);
    node2(s, id, OP_Mul, n.in[0], node2(s, id, OP_Sigmoid, ax, -1, "gate", -1), "swish", n.out[0]);
}

void compose_prelu(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    int x = n.in[0], neg = node2(s, id, OP_Less, x, fold_scalar(s, id, t, 0, "zero"), "negative", -1);
    int in[3] = {neg, node2(s, id, OP_Mul, x, n.in[1], "sloped", -1), x};
    node_n(s, id, OP_Where, in, 3, "prelu", n.out[0]);
}

void compose_shrink(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    double l = ir_attr_f(&n, "lambd", 0.5), b = ir_attr_f(&n, "bias", 0.0);
    int x = n.in[0];
    int hi[3] = {node2(s, id, OP_Greater, x, fold_scalar(s, id, t, l, "lambd"), "above", -1),
                 node2(s, id, OP_Sub, x, fold_scalar(s, id, t, b, "bias"), "down", -1), fold_scalar(s, id, t, 0, "zero")};
    int lo[3] = {node2(s, id, OP_Less, x, fold_scalar(s, id, t, -l, "neg_lambd"), "below", -1),
                 node2(s, id, OP_Add, x, fold_scalar(s, id, t, b, "bias"), "up", -1),
                 node_n(s, id, OP_Where, hi, 3, "upper", -1)};
    node_n(s, id, OP_Where, lo, 3, "shrink", n.out[0]);
}

void compose_global_max(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    float_in(g, &n);
    int r = g->val[n.in[0]].shape.rank;
    if (r < 3)
        node_fatal(g, &n, "the input has rank %d; GlobalMaxPool needs (N, C, spatial...)", r);
    int64_t axes[MAX_RANK];
    for (int i = 2; i < r; i++)
        axes[i - 2] = i;
    node_ints(s, id, OP_ReduceMax, n.in[0], "axes", axes, r - 2, 1, "max", n.out[0]);
}

void compose_eyelike(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    if (x->shape.rank != 2)
        node_fatal(g, &n, "the input has rank %d; EyeLike takes a 2-D tensor", x->shape.rank);
    DType t = ir_attr(&n, "dtype") ? tensor_from_onnx(ir_attr_i(&n, "dtype", 1)) : x->dtype;
    if (t != DT_F32 && t != DT_F64 && t != DT_I64 && t != DT_I32 && t != DT_BOOL)
        node_fatal(g, &n, "attribute dtype = %lld: fsdpc makes float32, float64, int64, int32 or bool",
                   (long long)ir_attr_i(&n, "dtype", 1));
    if (shape_numel(&x->shape) > ((int64_t)1 << 26) || !shape_numel(&x->shape))
        node_fatal(g, &n, "input %s: fsdpc makes EyeLike's constant of 1 to 2^26 elements", shape_str(&x->shape));
    int64_t ctx[2] = {x->shape.dim[1], ir_attr_i(&n, "k", 0)};
    int c = fold_const_fill(s, id, t, &x->shape, eye_at, ctx, "eye");
    node2(s, id, OP_Identity, c, -1, "eye", n.out[0]);
}

/* SpaceToDepth, DepthToSpace (DCR, CRD): Reshape, Transpose, Reshape */
void compose_space_depth(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Shape *x = &g->val[n.in[0]].shape;
    int64_t b = ir_attr_i(&n, "blocksize", 0);
    if (x->rank != 4)
        node_fatal(g, &n, "the input has rank %d; %s takes (N, C, H, W)", x->rank, op_info[n.op].name);
    int64_t N = x->dim[0], C = x->dim[1], H = x->dim[2], W = x->dim[3];
    if (b < 1 || b > 4096)
        node_fatal(g, &n, "attribute blocksize = %lld is outside [1, 4096]", (long long)b);
    int y;
    const char *mode = ir_attr_s(&n, "mode", "DCR");
    int crd = !strcmp(mode, "CRD");
    if (!crd && strcmp(mode, "DCR"))
        node_fatal(g, &n, "mode %s: ONNX knows DCR and CRD", ir_q(mode));
    if (n.op == OP_SpaceToDepth) { /* channel (bh b + bw) C + c (DCR) or c b b + bh b + bw (CRD) */
        if (H % b || W % b)
            node_fatal(g, &n, "H %lld and W %lld must be multiples of blocksize %lld", (long long)H, (long long)W,
                       (long long)b);
        int64_t d6[6] = {N, C, H / b, b, W / b, b}, d4[4] = {N, C * b * b, H / b, W / b};
        int64_t pd[6] = {0, 3, 5, 1, 2, 4}, pc[6] = {0, 1, 3, 5, 2, 4};
        y = node_ints(s, id, OP_Transpose, reshape(s, id, n.in[0], d6, 6, "blocks", -1), "perm", crd ? pc : pd, 6,
                      -1, "moved", -1);
        reshape(s, id, y, d4, 4, "depth", n.out[0]);
        return;
    }
    if (C % (b * b))
        node_fatal(g, &n, "C %lld must be a multiple of blocksize^2 %lld", (long long)C, (long long)(b * b));
    int64_t c = C / (b * b), dcr[6] = {N, b, b, c, H, W}, crd6[6] = {N, c, b, b, H, W};
    int64_t pd[6] = {0, 3, 4, 1, 5, 2}, pc[6] = {0, 1, 4, 2, 5, 3}, d4[4] = {N, c, H * b, W * b};
    y = node_ints(s, id, OP_Transpose, reshape(s, id, n.in[0], crd ? crd6 : dcr, 6, "blocks", -1), "perm",
                  crd ? pc : pd, 6, -1, "moved", -1);
    reshape(s, id, y, d4, 4, "space", n.out[0]);
}

/* (x - mean) / sqrt(var + eps) over the axes [from, r) of x, keepdims */
static int normalize(Sweep *s, int id, int x, int from, DType t, double eps)
{
    int64_t axes[MAX_RANK];
    int r = s->g->val[x].shape.rank;
    for (int i = from; i < r; i++)
        axes[i - from] = i;
    int mean = node_ints(s, id, OP_ReduceMean, x, "axes", axes, r - from, 1, "mean", -1);
    int d = node2(s, id, OP_Sub, x, mean, "centred", -1);
    int var = node_ints(s, id, OP_ReduceMean, node2(s, id, OP_Mul, d, d, "square", -1), "axes", axes, r - from, 1,
                        "var", -1);
    int sd = node2(s, id, OP_Sqrt, node2(s, id, OP_Add, var, fold_scalar(s, id, t, eps, "epsilon"), "var_eps", -1), -1,
                   "std", -1);
    return node2(s, id, OP_Div, d, sd, "normalized", -1);
}

/* v [c] reshaped to [c, 1 x (rank - 2)] for a rank-`rank` tensor's channels */
static int per_channel(Sweep *s, int id, int v, int rank, const char *suffix)
{
    int64_t d[MAX_RANK];
    d[0] = shape_numel(&s->g->val[v].shape);
    for (int i = 1; i < rank - 1; i++)
        d[i] = 1;
    return reshape(s, id, v, d, rank - 1, suffix, -1);
}

void compose_instance_norm(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    const Shape *x = &g->val[n.in[0]].shape;
    if (x->rank < 3)
        node_fatal(g, &n, "the input has rank %d; %s needs (N, C, spatial...)", x->rank, op_info[n.op].name);
    for (int k = 1; k < 3; k++)
        if (shape_numel(&g->val[n.in[k]].shape) != x->dim[1])
            node_fatal(g, &n, "%s %s must hold the %lld channels", k == 1 ? "scale" : "B",
                       shape_str(&g->val[n.in[k]].shape), (long long)x->dim[1]);
    int y = normalize(s, id, n.in[0], 2, t, ir_attr_f(&n, "epsilon", 1e-5));
    y = node2(s, id, OP_Mul, y, per_channel(s, id, n.in[1], x->rank, "scale"), "scaled", -1);
    node2(s, id, OP_Add, y, per_channel(s, id, n.in[2], x->rank, "bias"), "shifted", n.out[0]);
}

void compose_group_norm(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    const Shape *x = &g->val[n.in[0]].shape;
    int64_t G = ir_attr_i(&n, "num_groups", 0);
    if (x->rank < 2)
        node_fatal(g, &n, "the input has rank %d; GroupNormalization needs (N, C, ...)", x->rank);
    int64_t N = x->dim[0], C = x->dim[1], rest = shape_numel(x) / (N > 0 && C > 0 ? N * C : 1);
    if (G < 1 || C % G)
        node_fatal(g, &n, "num_groups = %lld does not divide the %lld channels", (long long)G, (long long)C);
    int64_t ns = shape_numel(&g->val[n.in[1]].shape), nb = shape_numel(&g->val[n.in[2]].shape);
    int grouped = ns == G && ns != C; /* GroupNormalization-18: scale and bias per group */
    if ((ns != C && !grouped) || nb != ns)
        node_fatal(g, &n, "scale %s and bias %s must hold the %lld channels (or, opset 18, the %lld groups)",
                   shape_str(&g->val[n.in[1]].shape), shape_str(&g->val[n.in[2]].shape), (long long)C,
                   (long long)G);
    int64_t d3[3] = {N, G, C / G * rest};
    int y = normalize(s, id, reshape(s, id, n.in[0], d3, 3, "groups", -1), 2, t, ir_attr_f(&n, "epsilon", 1e-5));
    if (grouped) {
        y = node2(s, id, OP_Mul, y, per_channel(s, id, n.in[1], 3, "scale"), "scaled", -1);
        y = node2(s, id, OP_Add, y, per_channel(s, id, n.in[2], 3, "bias"), "shifted", -1);
        reshape(s, id, y, x->dim, x->rank, "channels", n.out[0]);
        return;
    }
    y = reshape(s, id, y, x->dim, x->rank, "channels", -1);
    y = node2(s, id, OP_Mul, y, per_channel(s, id, n.in[1], x->rank, "scale"), "scaled", -1);
    node2(s, id, OP_Add, y, per_channel(s, id, n.in[2], x->rank, "bias"), "shifted", n.out[0]);
}

void compose_center_crop_pad(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Shape *x = &g->val[n.in[0]].shape;
    int r = x->rank, ns;
    const int64_t *sh = ir_attr_ints(&n, "shape", &ns);
    int na = 0;
    const int64_t *ax = ir_attr_ints(&n, "axes", &na);
    if (!ax)
        na = r;
    if (!sh || ns != na)
        node_fatal(g, &n, "shape lists %d sizes for %d axes", sh ? ns : 0, na);
    int64_t starts[MAX_RANK], ends[MAX_RANK], axes[MAX_RANK], pads[2 * MAX_RANK] = {0};
    int ncut = 0, npad = 0;
    char seen[MAX_RANK] = {0};
    for (int i = 0; i < na; i++) {
        int a = ax ? tensor_axis(g, &n, ax[i], r, "axes") : i;
        if (seen[a]++)
            node_fatal(g, &n, "axes lists axis %d twice", a);
        int64_t dim = x->dim[a], want = sh[i];
        if (want < 1 || want > MAX_NUMEL)
            node_fatal(g, &n, "shape %lld for axis %d is outside [1, 2^40]", (long long)want, a);
        if (want < dim)
            starts[ncut] = (dim - want) / 2, ends[ncut] = starts[ncut] + want, axes[ncut++] = a;
        else if (want > dim)
            pads[a] = (want - dim) / 2, pads[r + a] = want - dim - (want - dim) / 2, npad++;
    }
    int y = n.in[0];
    if (ncut) {
        int c = ir_node1(g, OP_Slice, ir_fmt("%s/crop", n.name), y, -1,
                         npad ? ir_value(g, ir_fmt("%s/crop.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT)
                              : n.out[0]);
        ir_attr_ints_add(g, c, "starts", starts, ncut);
        ir_attr_ints_add(g, c, "ends", ends, ncut);
        ir_attr_ints_add(g, c, "axes", axes, ncut);
        visit(s, c);
        y = g->node[c].out[0];
    }
    if (npad)
        node_ints(s, id, OP_Pad, y, "pads", pads, 2 * r, -1, "pad", n.out[0]);
    else if (!ncut)
        node2(s, id, OP_Identity, y, -1, "same", n.out[0]);
}

/* ctx: {dims..., ndims, align}: the base grid's row i: [x, y(, z), 1], x along the last dim */
static double base_at(int64_t i, const int64_t *ctx)
{
    int nd = (int)ctx[3], k = (int)(i % (nd + 1));
    int64_t cell = i / (nd + 1);
    if (k == nd)
        return 1;
    int64_t stride = 1; /* the coordinate k counts along dim nd - 1 - k (x: the last) */
    for (int j = nd - 1; j > nd - 1 - k; j--)
        stride *= ctx[j];
    int64_t len = ctx[nd - 1 - k], at = cell / stride % len;
    if (ctx[4])
        return len > 1 ? -1 + 2.0 * (double)at / (double)(len - 1) : 0;
    return (2.0 * (double)at + 1) / (double)len - 1;
}

void compose_affine_grid(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    int ns;
    const int64_t *size = ir_attr_ints(&n, "size", &ns);
    const Shape *th = &g->val[n.in[0]].shape;
    int nd = ns - 2;
    if (!size || (nd != 2 && nd != 3) || th->rank != 3 || th->dim[1] != nd || th->dim[2] != nd + 1 ||
        size[0] != th->dim[0])
        node_fatal(g, &n, "theta %s and size (%d values) must be [N, 2, 3] and (N, C, H, W), or [N, 3, 4] and "
                   "(N, C, D, H, W)", shape_str(th), size ? ns : 0);
    int64_t cells = 1, ctx[5] = {0, 0, 0, nd, ir_attr_i(&n, "align_corners", 0) != 0};
    for (int i = 0; i < nd; i++) {
        if (size[2 + i] < 1 || size[2 + i] > ((int64_t)1 << 24) / cells)
            node_fatal(g, &n, "size %lld of spatial dim %d: fsdpc makes grids of up to 2^24 points",
                       (long long)size[2 + i], i);
        cells *= size[2 + i], ctx[i] = size[2 + i];
    }
    Shape bs = {2, {cells, nd + 1}};
    int base = fold_const_fill(s, id, t, &bs, base_at, ctx, "base_grid");           /* [cells, nd + 1] */
    int64_t p[3] = {0, 2, 1};
    int tt = node_ints(s, id, OP_Transpose, n.in[0], "perm", p, 3, -1, "theta_t", -1); /* [N, nd + 1, nd] */
    int y = node2(s, id, OP_MatMul, base, tt, "grid", -1);                   /* [N, cells, nd] */
    int64_t d[5] = {size[0]};
    for (int i = 0; i < nd; i++)
        d[1 + i] = size[2 + i];
    d[1 + nd] = nd;
    reshape(s, id, y, d, nd + 2, "grid_shaped", n.out[0]);
}

void compose_swiglu(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    if (!shape_eq(&g->val[n.in[0]].shape, &g->val[n.in[1]].shape))
        node_fatal(g, &n, "A %s and B %s must have one shape (SwiGLU does not broadcast)",
                   shape_str(&g->val[n.in[0]].shape), shape_str(&g->val[n.in[1]].shape));
    int a = n.in[0], ax = node2(s, id, OP_Mul, a, fold_scalar(s, id, t, ir_attr_f(&n, "alpha", 1.0), "alpha"), "scaled", -1);
    int sw = node2(s, id, OP_Mul, a, node2(s, id, OP_Sigmoid, ax, -1, "gate", -1), "swish", -1);
    node2(s, id, OP_Mul, sw, n.in[1], "swiglu", n.out[0]);
}

/* ctx: {op, denominator}: the window's element i */
static double window_at(int64_t i, const int64_t *ctx)
{
    const double pi = 3.14159265358979323846, x = 2 * pi * (double)i / (double)ctx[1];
    switch (ctx[0]) {
    case OP_HannWindow: return 0.5 - 0.5 * cos(x);
    case OP_HammingWindow: return 25.0 / 46 - (1 - 25.0 / 46) * cos(x);
    default: return 0.42 - 0.5 * cos(x) + 0.08 * cos(2 * x);
    }
}

void compose_window(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int cnt = 0;
    const int64_t *sz = ir_attr_ints(&n, "size", &cnt);
    if (!sz || cnt != 1)
        node_fatal(g, &n, "needs its size input: a constant scalar");
    int64_t size = sz[0], periodic = ir_attr_i(&n, "periodic", 1) != 0;
    if (size < 1 || size > (1 << 24))
        node_fatal(g, &n, "size %lld is outside [1, 2^24]", (long long)size);
    DType t = tensor_from_onnx(ir_attr_i(&n, "output_datatype", 1));
    if (t != DT_F32 && t != DT_F64 && t != DT_I64 && t != DT_I32)
        node_fatal(g, &n, "output_datatype %lld: fsdpc makes float32, float64, int64 or int32",
                   (long long)ir_attr_i(&n, "output_datatype", 1));
    int64_t ctx[2] = {n.op, periodic ? size : size - 1 ? size - 1 : 1};
    Shape ws = {1, {size}};
    node2(s, id, OP_Identity, fold_const_fill(s, id, t, &ws, window_at, ctx, "window"), -1, "window", n.out[0]);
}

void compose_lrn(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = float_in(g, &n);
    const Shape *x = &g->val[n.in[0]].shape;
    int64_t size = ir_attr_i(&n, "size", 0);
    if (x->rank < 3)
        node_fatal(g, &n, "the input has rank %d; LRN needs (N, C, spatial...)", x->rank);
    if (size < 1 || size > x->dim[1] * 2 + 1)
        node_fatal(g, &n, "attribute size = %lld is outside [1, 2 C + 1]", (long long)size);
    if (!shape_numel(x))
        node_fatal(g, &n, "input %s is empty: not supported", shape_str(x));
    int64_t sp = shape_numel(x) / (x->dim[0] * x->dim[1]), d4[4] = {x->dim[0], 1, x->dim[1], sp};
    int sq = reshape(s, id, node2(s, id, OP_Mul, n.in[0], n.in[0], "square", -1), d4, 4, "channels", -1);
    int64_t k[2] = {size, 1}, pads[4] = {(size - 1) / 2, 0, size / 2, 0};
    int c = ir_node1(g, OP_AveragePool, ir_fmt("%s/window", n.name), sq, -1,
                     ir_value(g, ir_fmt("%s/window.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT));
    ir_attr_ints_add(g, c, "kernel_shape", k, 2);
    ir_attr_ints_add(g, c, "pads", pads, 4);
    ir_attr_add(g, c, "count_include_pad", A_INT)->i = 1;
    visit(s, c);
    int mean = reshape(s, id, g->node[c].out[0], x->dim, x->rank, "mean", -1); /* sum / size */
    double alpha = ir_attr_f(&n, "alpha", 1e-4), beta = ir_attr_f(&n, "beta", 0.75), bias = ir_attr_f(&n, "bias", 1);
    int den = node2(s, id, OP_Add, node2(s, id, OP_Mul, mean, fold_scalar(s, id, t, alpha, "alpha"), "scaled", -1),
                    fold_scalar(s, id, t, bias, "bias"), "base", -1);
    den = node2(s, id, OP_Pow, den, fold_scalar(s, id, t, beta, "beta"), "den", -1);
    node2(s, id, OP_Div, n.in[0], den, "lrn", n.out[0]);
}

void compose_reverse_sequence(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    int r = x->shape.rank;
    int64_t ba = ir_attr_i(&n, "batch_axis", 1), ta = ir_attr_i(&n, "time_axis", 0);
    if (r < 2 || (ba != 0 && ba != 1) || (ta != 0 && ta != 1) || ba == ta)
        node_fatal(g, &n, "batch_axis %lld and time_axis %lld must be 0 and 1 in some order over a rank >= 2 input",
                   (long long)ba, (long long)ta);
    const Value *lv = n.nin > 1 && n.in[1] >= 0 ? &g->val[n.in[1]] : NULL;
    int64_t B = x->shape.dim[ba], T = x->shape.dim[ta], numel = shape_numel(&x->shape);
    if (!lv || lv->role != R_CONST || !lv->data || shape_numel(&lv->shape) != B)
        node_fatal(g, &n, "sequence_lens must be a constant of the %lld batch entries (fsdpc has static shapes)",
                   (long long)B);
    if (numel > ((int64_t)1 << 26) || !numel)
        node_fatal(g, &n, "an input of %lld elements: fsdpc reverses through an index of every element, 1 to 2^26",
                   (long long)numel);
    int64_t *idx = ir_alloc(sizeof(int64_t) * (size_t)(numel ? numel : 1)), inner = numel / (B * T);
    for (int64_t b = 0; b < B; b++) {
        int64_t len = tensor_const_i(lv, b);
        if (len < 0 || len > T)
            node_fatal(g, &n, "sequence_lens[%lld] = %lld is outside [0, %lld]", (long long)b, (long long)len,
                       (long long)T);
        for (int64_t t = 0; t < T; t++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t at = ta == 0 ? (t * B + b) * inner + i : (b * T + t) * inner + i;
                idx[at] = t < len ? len - 1 - t : t;
            }
    }
    int iv = ir_const(g, ir_fmt("%s/index.%d", n.name, s->nnew++), DT_I64, &x->shape, idx);
    int c = ir_node1(g, OP_GatherElements, ir_fmt("%s/reversed", n.name), n.in[0], iv, n.out[0]);
    ir_attr_add(g, c, "axis", A_INT)->i = ta;
    visit(s, c);
}
