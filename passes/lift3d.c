/* lift3d.c — fold's composition of 3-D convolutions and pooling from 2-D ones.
 *
 * The kernels are 2-D (NCHW).  A 3-D Conv, ConvTranspose, MaxPool,
 * AveragePool or LpPool over X [N, C, D, H, W] (video models, volumetric
 * U-Nets) is written with the 2-D ops over the depth slices, the output
 * depth folded into the batch, so both targets and every gradient follow
 * with no kernel of its own.  X is first read depth-major: Transpose to
 * [N, D, C, H, W], its depth padded (pads zeros, a MaxPool's the lowest
 * finite value; ceil_mode's last partial window more of it at the end).
 * With od the output depth, kd the depth tap, sd the stride and dd the
 * dilation, the tap kd reads depths od sd + kd dd: a Slice of step sd,
 * [N, Dout, C, H, W], reshaped to [N Dout, C, H, W].  Then:
 *
 *   Conv         y = sum over kd of Conv2d(slice kd, W[:, :, kd]) (groups,
 *                strides, dilations, pads of H and W as given; the bias on
 *                tap 0 only);
 *   MaxPool      MaxPool2d(elementwise Max over kd of the slices): the max
 *                over a box is the max over its depth, then its plane;
 *   AveragePool  the window sums (compose_sum_pool's depthwise Conv2d of
 *                ones over the sum of the slices) over a constant count
 *                [Dout, Ho, Wo], each element the product of the taps of
 *                its window inside the input (count_include_pad: inside the
 *                padded input) along each axis, as the 2-D kernel counts;
 *   LpPool       compose.c's root of the window sums of |x|^p;
 *
 * and [N Dout, M, Ho, Wo] goes back to [N, M, Dout, Ho, Wo] (Reshape,
 * Transpose).  A ConvTranspose is the arrangement transposed: X read as
 * [N D, C, H, W], each depth tap kd a ConvTranspose2d with W[:, :, kd]
 * (compose.c's ConvGrad), whose input depth id lands on output depth
 * id sd + kd dd - pad: reshaped to [N, D, 1, F] (F = M Ho Wo), padded with
 * sd - 1 zeros on that axis and reshaped to [N, D sd, F] (the stride's
 * interleave), then padded (a negative pad crops) by kd dd - pad before and
 * what is left of Dout after; the taps summed, reshaped and transposed back,
 * the bias added over channels.  output_shape and output_padding are
 * resolved per axis by the 2-D rule's nn_convt_dim.
 *
 * Each depth tap costs about eight nodes; more than MAX_TAPS depth taps are
 * refused in one line, as is a 3-D MaxPool's Indices output.  auto_pad is
 * already explicit pads (lift1d.c's explicit_pads).
 */
#include "fold.h"

#include <float.h>
#include <string.h>

#define MAX_TAPS 256 /* depth taps of one 3-D op: about 8 nodes each */

static void visit(Sweep *s, int id) { fold_visit(s, id); }

typedef struct {
    Sweep *s;
    int id;              /* the 3-D node (left unvisited: fold drops it) */
    Node n;              /* a copy of it */
    DType t;
    int64_t x[5];        /* X's dims N, C, D, H, W */
    int64_t k[3], st[3], dl[3], pb[3], pe[3], op[3], os[3]; /* per spatial axis; os 0: no output_shape */
    int64_t group;
    int ceil;
} L3;

/* ---- attributes ------------------------------------------------------------- */

/* ints attribute name of exactly len values in [lo, 2^40] into v (def where absent) */
static void ints(L3 *c, const char *name, int len, int64_t lo, int64_t def, int64_t *v)
{
    const Attr *a = ir_attr(&c->n, name);
    for (int i = 0; i < len; i++)
        v[i] = def;
    if (!a)
        return;
    if (a->kind != A_INTS || a->n != len)
        node_fatal(c->s->g, &c->n, "attribute %s must list %d integers for a 3-D %s", name, len,
                   op_info[c->n.op].name);
    for (int i = 0; i < len; i++) {
        if (a->ints[i] < lo || a->ints[i] > MAX_NUMEL)
            node_fatal(c->s->g, &c->n, "attribute %s: %lld is outside [%lld, 2^40]", name, (long long)a->ints[i],
                       (long long)lo);
        v[i] = a->ints[i];
    }
}

/* node id's geometry read and checked into c (w: the weight's shape, NULL for a pool) */
static void read_geom(L3 *c, const Shape *w)
{
    Graph *g = c->s->g;
    const Node *n = &c->n;
    int64_t pads[6];
    ints(c, "kernel_shape", 3, 1, 1, c->k);
    if (!w && !ir_attr(n, "kernel_shape"))
        node_fatal(g, n, "attribute kernel_shape is required");
    for (int i = 0; w && i < 3; i++) {
        if (ir_attr(n, "kernel_shape") && c->k[i] != w->dim[2 + i])
            node_fatal(g, n, "attribute kernel_shape differs from the weight's spatial dims");
        c->k[i] = w->dim[2 + i];
    }
    ints(c, "strides", 3, 1, 1, c->st);
    ints(c, "dilations", 3, 1, 1, c->dl);
    ints(c, "pads", 6, 0, 0, pads);
    ints(c, "output_padding", 3, 0, 0, c->op);
    ints(c, "output_shape", 3, 1, 0, c->os);
    for (int i = 0; i < 3; i++) {
        c->pb[i] = pads[i], c->pe[i] = pads[3 + i];
        if (c->k[i] > 1 && c->dl[i] > (MAX_NUMEL - 1) / (c->k[i] - 1))
            node_fatal(g, n, "attributes kernel_shape and dilations: the dilated window is beyond 2^40");
    }
    if (strcmp(ir_attr_s(n, "auto_pad", "NOTSET"), "NOTSET"))
        node_fatal(g, n, "attribute auto_pad = %s is not supported here (export with explicit pads)",
                   ir_q(ir_attr_s(n, "auto_pad", "")));
    if (ir_attr_i(n, "storage_order", 0) != 0)
        node_fatal(g, n, "attribute storage_order = 1 (column-major indices) is not supported");
    c->group = ir_attr_i(n, "group", 1);
    c->ceil = ir_attr_i(n, "ceil_mode", 0) != 0;
    if (c->k[0] > MAX_TAPS)
        node_fatal(g, n, "kernel depth %lld: a 3-D %s is composed of one 2-D op per depth tap, and more than %d "
                   "taps is not supported", (long long)c->k[0], op_info[n->op].name, MAX_TAPS);
}

/* a * b, refused in one line beyond 2^40 (what names it) */
static int64_t times(L3 *c, int64_t a, int64_t b, const char *what)
{
    if (a > MAX_NUMEL / (b > 0 ? b : 1))
        node_fatal(c->s->g, &c->n, "%s: %lld x %lld is beyond 2^40 elements", what, (long long)a, (long long)b);
    return a * b;
}

/* ---- builders --------------------------------------------------------------- */

/* op(in[0..nin)) named NODE/suffix with nout outputs, the first out (-1: new), the rest new; not visited */
static int mk(L3 *c, Op op, const int *in, int nin, int nout, const char *suffix, int out)
{
    Graph *g = c->s->g;
    const char *name = ir_fmt("%s/%s", c->n.name, suffix);
    int o[3];
    for (int i = 0; i < nout; i++)
        o[i] = i == 0 && out >= 0 ? out : ir_value(g, ir_fmt("%s.%d", name, c->s->nnew++), DT_UNDEF, NULL, R_ACT);
    return ir_node(g, op, name, nin, in, nout, o);
}

/* visits node k; its output */
static int done(L3 *c, int k)
{
    visit(c->s, k);
    return c->s->g->node[k].out[0];
}

static int op2(L3 *c, Op op, int a, int b, const char *suffix, int out)
{
    return fold_expand(c->s, c->id, op, a, b, suffix, out);
}

static int reshape(L3 *c, int x, const int64_t *dims, int n, const char *suffix, int out)
{
    Graph *g = c->s->g;
    Shape cs = {1, {n}};
    int sv = ir_const(g, ir_fmt("%s/%s.shape.%d", c->n.name, suffix, c->s->nnew++), DT_I64, &cs, dims);
    return op2(c, OP_Reshape, x, sv, suffix, out);
}

/* x [a, b, c, d, e] as [a, c, b, d, e] (depth-major and back) */
static int swap12(L3 *c, int x, const char *suffix, int out)
{
    static const int64_t perm[5] = {0, 2, 1, 3, 4};
    int k = mk(c, OP_Transpose, &x, 1, 1, suffix, out);
    ir_attr_ints_add(c->s->g, k, "perm", perm, 5);
    return done(c, k);
}

/* x[..., start:end:step, ...] on axis */
static int slice(L3 *c, int x, int64_t axis, int64_t start, int64_t end, int64_t step, const char *suffix)
{
    Graph *g = c->s->g;
    int k = mk(c, OP_Slice, &x, 1, 1, suffix, -1);
    ir_attr_ints_add(g, k, "starts", &start, 1);
    ir_attr_ints_add(g, k, "ends", &end, 1);
    ir_attr_ints_add(g, k, "axes", &axis, 1);
    ir_attr_ints_add(g, k, "steps", &step, 1);
    return done(c, k);
}

/* x padded on axis by before and after (negative: cropped) with fill (-1: zeros); x itself when both are 0 */
static int pad(L3 *c, int x, int axis, int64_t before, int64_t after, int fill, const char *suffix)
{
    if (!before && !after)
        return x;
    Graph *g = c->s->g;
    int r = g->val[x].shape.rank, k = mk(c, OP_Pad, &x, 1, 1, suffix, -1);
    int64_t pads[2 * MAX_RANK] = {0};
    pads[axis] = before, pads[r + axis] = after;
    ir_attr_ints_add(g, k, "pads", pads, 2 * r);
    if (fill >= 0)
        ir_attr_add(g, k, "value", A_TENSOR)->t = fill;
    return done(c, k);
}

/* the 2-D attributes of node k: axes 1, 2 (H, W) of c's; conv: the group, else ceil_mode */
static void attrs2d(L3 *c, int k, int conv)
{
    Graph *g = c->s->g;
    int64_t pads[4] = {c->pb[1], c->pb[2], c->pe[1], c->pe[2]};
    ir_attr_ints_add(g, k, "kernel_shape", &c->k[1], 2);
    ir_attr_ints_add(g, k, "strides", &c->st[1], 2);
    ir_attr_ints_add(g, k, "dilations", &c->dl[1], 2);
    ir_attr_ints_add(g, k, "pads", pads, 4);
    if (conv)
        ir_attr_add(g, k, "group", A_INT)->i = c->group;
    else
        ir_attr_add(g, k, "ceil_mode", A_INT)->i = c->ceil;
}

/* the weight's depth tap kd: W[:, :, kd] as [a, b, kh, kw] */
static int weight_tap(L3 *c, int64_t kd)
{
    const Shape *w = &c->s->g->val[c->n.in[1]].shape;
    int64_t d[4] = {w->dim[0], w->dim[1], w->dim[3], w->dim[4]};
    return reshape(c, slice(c, c->n.in[1], 2, kd, kd + 1, 1, "w_tap"), d, 4, "w_tap2d", -1);
}

/* y [N dout, m, ho, wo] back to [N, m, dout, ho, wo], written into out (-1: new) */
static int back(L3 *c, int y, int64_t dout, int out)
{
    const Shape *ys = &c->s->g->val[y].shape;
    int64_t d[5] = {c->x[0], dout, ys->dim[1], ys->dim[2], ys->dim[3]};
    return swap12(c, reshape(c, y, d, 5, "unfold_depth", -1), "as3d", out);
}

/* X depth-major [N, D', C, H, W], its depth padded by before and after with fill (-1: zeros); refused in one line
 * beyond 2^40 elements */
static int depth_major(L3 *c, int64_t before, int64_t after, int fill)
{
    Shape ps = {5, {c->x[0], c->x[2] + before + after, c->x[1], c->x[3], c->x[4]}}; /* each term <= 2^41 */
    node_check_shape(c->s->g, &c->n, &ps, "the input padded in depth");
    return pad(c, swap12(c, c->n.in[0], "depth_major", -1), 1, before, after, fill, "pad_depth");
}

/* the depth tap kd of the padded depth-major xp: its depths od sd + kd dd for od < dout, [N, dout, C, H, W] */
static int depth_tap(L3 *c, int xp, int64_t kd, int64_t dout)
{
    int64_t start = kd * c->dl[0], len = c->s->g->val[xp].shape.dim[1];
    if (start == 0 && c->st[0] == 1 && dout == len)
        return xp;
    return slice(c, xp, 1, start, start + (dout - 1) * c->st[0] + 1, c->st[0], "depth_tap");
}

/* [N, dout, C, H, W] as [N dout, C, H, W] */
static int fold_batch(L3 *c, int v, int64_t dout)
{
    int64_t d[4] = {times(c, c->x[0], dout, "the batch of the depth slices"), c->x[1], c->x[3], c->x[4]};
    return reshape(c, v, d, 4, "depth_batch", -1);
}

/* ---- the ops ------------------------------------------------------------------ */

/* output depth of the conv or pool (ceil: ceil_mode) with m output channels, refused in one line when the window
 * is larger than the padded input or the output [N, m, D, H, W] beyond 2^40 elements */
static int64_t out_depth(L3 *c, int ceil, int64_t m)
{
    Shape ys = {5, {c->x[0], m}};
    for (int i = 0; i < 3; i++)
        if ((ys.dim[2 + i] = k_pool_out_dim(c->x[2 + i], c->k[i], c->st[i], c->pb[i], c->pe[i], c->dl[i], ceil)) < 1)
            node_fatal(c->s->g, &c->n, "attribute kernel_shape: the (dilated) window is larger than the padded "
                       "input");
    node_check_shape(c->s->g, &c->n, &ys, "the output");
    return ys.dim[2];
}

static void conv3d(L3 *c)
{
    Graph *g = c->s->g;
    const Shape *w = &g->val[c->n.in[1]].shape;
    if (w->dim[1] * c->group != c->x[1] || c->group < 1 || w->dim[0] % c->group)
        node_fatal(g, &c->n, "attribute group = %lld does not fit %lld input and %lld output channels (weight dim 1 "
                   "must be channels / group)", (long long)c->group, (long long)c->x[1], (long long)w->dim[0]);
    int64_t dout = out_depth(c, 0, w->dim[0]);
    int xp = depth_major(c, c->pb[0], c->pe[0], -1), b = c->n.nin > 2 ? c->n.in[2] : -1, y = -1;
    for (int64_t kd = 0; kd < c->k[0]; kd++) {
        int in[3] = {fold_batch(c, depth_tap(c, xp, kd, dout), dout), weight_tap(c, kd), b};
        int k = mk(c, OP_Conv, in, kd == 0 && b >= 0 ? 3 : 2, 2, "conv_tap", -1);
        attrs2d(c, k, 1);
        int yk = done(c, k);
        y = y < 0 ? yk : op2(c, OP_Add, y, yk, "sum_taps", -1);
    }
    back(c, y, dout, c->n.out[0]);
}

/* the constant count of AveragePool's windows, element i of [dout, ho, wo]: ctx[0..3) the output sizes, then per
 * axis a (ctx + 3 + 7 a): in, k, st, pb, pe, dl, count_include_pad */
static double avg_count(int64_t i, const int64_t *ctx)
{
    int64_t o[3] = {i / (ctx[1] * ctx[2]), i / ctx[2] % ctx[1], i % ctx[2]}, count = 1;
    for (int a = 0; a < 3; a++) {
        const int64_t *q = ctx + 3 + 7 * a, in = q[0], lo = q[6] ? -q[3] : 0, hi = q[6] ? in + q[4] : in;
        int64_t taps = 0;
        for (int64_t t = 0; t < q[1]; t++) {
            int64_t pos = o[a] * q[2] - q[3] + t * q[5];
            taps += pos >= lo && pos < hi;
        }
        count *= taps;
    }
    return (double)count;
}

/* y [N, C, dout, ho, wo] window sums divided by their counts into out */
static void average(L3 *c, int y, int out)
{
    const Shape *ys = &c->s->g->val[y].shape;
    Shape cs = {3, {ys->dim[2], ys->dim[3], ys->dim[4]}};
    int64_t ctx[3 + 21] = {cs.dim[0], cs.dim[1], cs.dim[2]}, cip = ir_attr_i(&c->n, "count_include_pad", 0) != 0;
    for (int a = 0; a < 3; a++) {
        int64_t q[7] = {c->x[2 + a], c->k[a], c->st[a], c->pb[a], c->pe[a], c->dl[a], cip};
        memcpy(ctx + 3 + 7 * a, q, sizeof q);
    }
    int count = fold_const_fill(c->s, c->id, c->t, &cs, avg_count, ctx, "count");
    op2(c, OP_Div, y, count, "average", out);
}

/* MaxPool, AveragePool, LpPool: see the head */
static void pool3d(L3 *c)
{
    Graph *g = c->s->g;
    Op op = c->n.op;
    if (op == OP_MaxPool && c->n.nout > 1 && ir_is_read(g, c->n.out[1]))
        node_fatal(g, &c->n, "output Indices of a 3-D MaxPool is not supported (only its values)");
    int64_t p = op == OP_LpPool ? compose_lp_p(c->s, c->id) : 1, dout = out_depth(c, c->ceil, c->x[1]);
    int64_t ext = (dout - 1) * c->st[0] + c->dl[0] * (c->k[0] - 1) + 1 - (c->x[2] + c->pb[0] + c->pe[0]);
    int fill = op == OP_MaxPool ? fold_scalar(c->s, c->id, c->t, c->t == DT_F64 ? -DBL_MAX : -FLT_MAX, "lowest") : -1;
    if (op == OP_LpPool)
        c->n.in[0] = compose_lp_power(c->s, c->id, c->n.in[0], p);
    int xp = depth_major(c, c->pb[0], c->pe[0] + (ext > 0 ? ext : 0), fill), acc = -1;
    for (int64_t kd = 0; kd < c->k[0]; kd++) {
        int v = depth_tap(c, xp, kd, dout);
        acc = acc < 0 ? v : op2(c, op == OP_MaxPool ? OP_Max : OP_Add, acc, v, "combine_taps", -1);
    }
    acc = fold_batch(c, acc, dout);
    int y, last = op == OP_MaxPool ? c->n.out[0] : -1;
    if (op == OP_MaxPool) {
        int k = mk(c, OP_MaxPool, &acc, 1, 3, "plane_max", -1);
        attrs2d(c, k, 0);
        y = done(c, k);
    } else {
        KPool2d q = {.n = c->x[0] * dout, .c = c->x[1], .h = c->x[3], .w = c->x[4], .kh = c->k[1], .kw = c->k[2],
                     .sh = c->st[1], .sw = c->st[2], .dh = c->dl[1], .dw = c->dl[2], .pt = c->pb[1],
                     .pl = c->pb[2], .pb = c->pe[1], .pr = c->pe[2]};
        q.oh = k_pool_out_dim(q.h, q.kh, q.sh, q.pt, q.pb, q.dh, c->ceil);
        q.ow = k_pool_out_dim(q.w, q.kw, q.sw, q.pl, q.pr, q.dw, c->ceil);
        if (q.oh < 1 || q.ow < 1)
            node_fatal(g, &c->n, "attribute kernel_shape: the (dilated) window is larger than the padded input");
        y = compose_sum_pool(c->s, c->id, acc, &q, -1);
    }
    y = back(c, y, dout, last);
    if (op == OP_AveragePool)
        average(c, y, c->n.out[0]);
    else if (op == OP_LpPool)
        compose_lp_root(c->s, c->id, y, p, c->n.out[0]);
}

/* ConvTranspose: see the head */
static void convt3d(L3 *c)
{
    Graph *g = c->s->g;
    const Shape *w = &g->val[c->n.in[1]].shape; /* [C, M/group, kd, kh, kw] */
    if (w->dim[0] != c->x[1] || c->group < 1 || c->x[1] % c->group)
        node_fatal(g, &c->n, "weight %s and attribute group = %lld do not fit %lld input channels (the weight is "
                   "(channels, out channels / group, kd, kh, kw))", shape_str(w), (long long)c->group,
                   (long long)c->x[1]);
    int64_t size[3];
    for (int i = 0; i < 3; i++) {
        int64_t pd[2] = {c->pb[i], c->pe[i]};
        size[i] = nn_convt_dim(g, &c->n, c->x[2 + i], c->k[i], c->st[i], c->dl[i], &c->op[i], pd, c->os[i]);
        c->pb[i] = pd[0], c->pe[i] = pd[1];
    }
    int64_t n = c->x[0], d = c->x[2], sd = c->st[0], dout = size[0];
    int64_t xd[4] = {times(c, n, d, "the batch of the depth slices"), c->x[1], c->x[3], c->x[4]};
    int xr = reshape(c, swap12(c, c->n.in[0], "depth_major", -1), xd, 4, "depth_batch", -1), y = -1;
    int64_t f = times(c, times(c, w->dim[1] * c->group, size[1], "the output"), size[2], "the output");
    for (int64_t kd = 0; kd < c->k[0]; kd++) {
        int64_t before = kd * c->dl[0] - c->pb[0], after = dout - before - times(c, d, sd, "the output depth");
        if (before <= -d * sd || before >= dout)
            continue; /* the pads crop this tap away */
        int in[2] = {xr, weight_tap(c, kd)};
        int k = mk(c, OP_ConvTranspose, in, 2, 1, "convt_tap", -1);
        attrs2d(c, k, 1);
        ir_attr_ints_add(g, k, "output_padding", &c->op[1], 2);
        compose_convt(c->s, k);
        int64_t rows[3] = {n, d, f}, spread[4] = {n, d, 1, f}, interleaved[3] = {n, d * sd, f};
        int t = reshape(c, g->node[k].out[0], sd > 1 ? spread : rows, sd > 1 ? 4 : 3, "tap_rows", -1);
        if (sd > 1)
            t = reshape(c, pad(c, t, 2, 0, sd - 1, -1, "stride_zeros"), interleaved, 3, "interleaved", -1);
        t = pad(c, t, 1, before, after, -1, "place_tap");
        y = y < 0 ? t : op2(c, OP_Add, y, t, "sum_taps", -1);
    }
    if (y < 0)
        node_fatal(g, &c->n, "attribute pads: they crop away every depth tap, which is not supported");
    int b = c->n.nin > 2 ? c->n.in[2] : -1;
    int64_t d5[5] = {n, dout, w->dim[1] * c->group, size[1], size[2]};
    y = swap12(c, reshape(c, y, d5, 5, "unfold_depth", -1), "as3d", b < 0 ? c->n.out[0] : -1);
    if (b < 0)
        return;
    int64_t ax[3] = {1, 2, 3};
    int k = mk(c, OP_Unsqueeze, &b, 1, 1, "bias", -1);
    ir_attr_ints_add(g, k, "axes", ax, 3);
    op2(c, OP_Add, y, done(c, k), "add_bias", c->n.out[0]);
}

/* A 3-D Conv, ConvTranspose, MaxPool, AveragePool or LpPool (rank-5 input; pads explicit) replaced by the nodes
 * of the head, which write its outputs; 0 when node id is not one. */
int lift_3d(Sweep *s, int id)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    Op op = n->op;
    int conv = op == OP_Conv || op == OP_ConvTranspose;
    if ((!conv && op != OP_MaxPool && op != OP_AveragePool && op != OP_LpPool) || n->nin < 1 || n->in[0] < 0 ||
        g->val[n->in[0]].shape.rank != 5)
        return 0;
    L3 c = {.s = s, .id = id, .n = *n, .t = g->val[n->in[0]].dtype};
    const Value *x = &g->val[n->in[0]], *w = conv && n->nin > 1 && n->in[1] >= 0 ? &g->val[n->in[1]] : NULL;
    if (!dtype_is_float(c.t))
        node_fatal(g, n, "input '%s' has dtype %s, which is not supported (float32 or float64 only)", ir_q(x->name),
                   dtype_name(c.t));
    if (conv && (!w || w->shape.rank != 5 || w->dtype != c.t))
        node_fatal(g, n, "the weight of a 3-D %s must be a rank-5 tensor of the input's dtype %s", op_info[op].name,
                   dtype_name(c.t));
    if (!shape_numel(&x->shape) || (w && !shape_numel(&w->shape)))
        node_fatal(g, n, "input %s: a 3-D %s over a zero-sized dimension is not supported", shape_str(&x->shape),
                   op_info[op].name);
    memcpy(c.x, x->shape.dim, sizeof c.x);
    read_geom(&c, w ? &w->shape : NULL);
    if (op == OP_Conv)
        conv3d(&c);
    else if (op == OP_ConvTranspose)
        convt3d(&c);
    else
        pool3d(&c);
    return 1;
}
