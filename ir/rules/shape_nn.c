/* shape_nn.c — shape rules of the nn family (conv, pooling, normalisation,
 * softmax, reductions, dropout, losses), and the attribute readers that
 * gradients and codegen share with them (nn.h).
 *
 * Each rule checks its node once — dtypes, ranks, attributes — and types
 * every output, including the ones a forward node keeps for its backward
 * (BatchNormalization's saved mean and invstd, LayerNormalization's Mean
 * and InvStdDev, MaxPool's plane argmax, Dropout's mask, Conv's im2col
 * scratch).  Anything fsdpc cannot compile is one fatal() line naming the
 * model, the node, the op and the attribute, with "not supported" in it.
 *
 * Geometry: Conv and the pools are 2-D NCHW only, with explicit pads
 * (fold wrote auto_pad as pads: passes/lift1d.c); output sizes follow k_pool_out_dim (kernels.h), as the
 * kernels' own geometry checks do.  ConvTranspose has no rule here (fold
 * rewrites it, passes/compose.c): nn_convt_geom checks it and gives the
 * output shape and pads of the Conv whose data gradient it is.
 */
#include "nn.h"

#include <stdarg.h>
#include <string.h>



static const Value *in_val(const Graph *g, const Node *n, int i)
{
    return i < n->nin && n->in[i] >= 0 ? &g->val[n->in[i]] : NULL;
}

static void need_float(const Graph *g, const Node *n, const Value *x, const char *what)
{
    if (!dtype_is_float(x->dtype))
        node_fatal(g, n, "%s '%s' has dtype %s, which is not supported (float32 or float64 only)", what,
               ir_q(x->name), dtype_name(x->dtype));
}

/* input i: same dtype as x, numel elements (a per-channel vector; LayerNormalization's
 * scale and bias may have the normalised dims' shape) */
static void need_vec(const Graph *g, const Node *n, int i, const Value *x, int64_t numel, const char *what)
{
    const Value *v = in_val(g, n, i);
    if (!v)
        return;
    if (v->dtype != x->dtype)
        node_fatal(g, n, "input %s '%s' has dtype %s but the data is %s; mixed dtypes are not supported",
               what, ir_q(v->name), dtype_name(v->dtype), dtype_name(x->dtype));
    int rank_ok = n->op == OP_LayerNormalization || v->shape.rank == 1;
    if (shape_numel(&v->shape) != numel || !rank_ok)
        node_fatal(g, n, "input %s '%s' must be a vector of %lld elements, one per %s (other shapes are "
               "not supported)", what, ir_q(v->name),
               (long long)numel, n->op == OP_LayerNormalization ? "normalised element" : "channel");
}

static void set_out(Graph *g, const Node *n, int k, DType dt, const Shape *s)
{
    if (k >= n->nout)
        return;
    Value *o = &g->val[n->out[k]];
    o->dtype = dt;
    o->shape = *s;
}

static Shape shape1(int64_t d) { return (Shape){1, {d}}; }

/* ---- attribute readers (nn.h) -------------------------------------------- */

int nn_axis(const Graph *g, const Node *n, int64_t a, int r, const char *attr)
{
    if (a < -r || a >= r || r == 0)
        node_fatal(g, n, "attribute %s = %lld is outside [-%d, %d) for a rank-%d input", attr,
               (long long)a, r, r, r);
    return (int)(a < 0 ? a + r : a);
}

void nn_split(const Shape *s, int ax, int64_t *outer, int64_t *axis, int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < s->rank; i++) {
        if (i < ax)
            *outer *= s->dim[i];
        if (i > ax)
            *inner *= s->dim[i];
    }
    *axis = s->dim[ax];
}

/* ints attribute `name` of exactly len values in [lo, MAX_NUMEL], into v
 * (default def); the bound keeps the geometry's arithmetic from wrapping */
static void ints_attr(const Graph *g, const Node *n, const char *name, int len, int64_t lo,
                      int64_t def, int64_t *v)
{
    const Attr *a = ir_attr(n, name);
    for (int i = 0; i < len; i++)
        v[i] = def;
    if (!a)
        return;
    if (a->kind != A_INTS || a->n != len)
        node_fatal(g, n, "attribute %s must list %d integers for a 2-D %s", name, len, op_info[n->op].name);
    for (int i = 0; i < len; i++) {
        if (a->ints[i] < lo || a->ints[i] > MAX_NUMEL)
            node_fatal(g, n, "attribute %s: %lld is outside [%lld, 2^40]", name, (long long)a->ints[i],
                       (long long)lo);
        v[i] = a->ints[i];
    }
}

static void no_auto_pad(const Graph *g, const Node *n)
{
    const char *a = ir_attr_s(n, "auto_pad", "NOTSET");
    if (strcmp(a, "NOTSET"))
        node_fatal(g, n, "attribute auto_pad = %s is not supported here (export with explicit pads)", ir_q(a));
}

/* the dilated window d * (k - 1) + 1 of each spatial dim fits in 2^40 (k, d already <= 2^40) */
static void window_fits(const Graph *g, const Node *n, const int64_t *k, const int64_t *d)
{
    for (int i = 0; i < 2; i++)
        if (k[i] > 1 && d[i] > (MAX_NUMEL - 1) / (k[i] - 1))
            node_fatal(g, n, "attributes kernel_shape and dilations: the dilated window %lld x %lld is beyond "
                       "2^40", (long long)k[i], (long long)d[i]);
}

static void need_2d(const Graph *g, const Node *n, const Shape *x)
{
    if (x->rank < 3)
        node_fatal(g, n, "the input has rank %d; %s needs (N, C, H, W)", x->rank, op_info[n->op].name);
    if (x->rank != 4)
        node_fatal(g, n, "attribute kernel_shape: a %d-D %s is not supported (fsdpc supports 2-D, NCHW)",
               x->rank - 2, op_info[n->op].name);
}

void nn_conv_geom(const Graph *g, const Node *n, const Shape *x, const Shape *w, KConv2d *p)
{
    int64_t st[2], dl[2], pd[4], ks[2];
    need_2d(g, n, x);
    if (w->rank != 4)
        node_fatal(g, n, "the weight must have rank 4 (m, c/group, kh, kw)");
    ints_attr(g, n, "kernel_shape", 2, 1, 0, ks);
    if (ir_attr(n, "kernel_shape") && (ks[0] != w->dim[2] || ks[1] != w->dim[3]))
        node_fatal(g, n, "attribute kernel_shape differs from the weight's spatial dims");
    ints_attr(g, n, "strides", 2, 1, 1, st);
    ints_attr(g, n, "dilations", 2, 1, 1, dl);
    ints_attr(g, n, "pads", 4, 0, 0, pd);
    no_auto_pad(g, n);
    int64_t grp = ir_attr_i(n, "group", 1);
    if (!shape_numel(x) || !shape_numel(w))
        node_fatal(g, n, "input %s and weight %s: a Conv over a zero-sized dimension is not supported (fsdpc "
                   "refuses empty tensors here)", shape_str(x), shape_str(w));
    window_fits(g, n, &w->dim[2], dl);
    *p = (KConv2d){.n = x->dim[0], .c = x->dim[1], .h = x->dim[2], .w = x->dim[3], .m = w->dim[0],
                   .kh = w->dim[2], .kw = w->dim[3], .sh = st[0], .sw = st[1], .dh = dl[0], .dw = dl[1],
                   .pt = pd[0], .pl = pd[1], .pb = pd[2], .pr = pd[3], .groups = grp};
    if (grp < 1 || p->c % grp || p->m % grp || w->dim[1] * grp != p->c)
        node_fatal(g, n, "attribute group = %lld does not fit %lld input and %lld output channels "
               "(weight dim 1 must be channels / group)", (long long)grp, (long long)p->c, (long long)p->m);
    p->oh = k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, 0);
    p->ow = k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, 0);
    if (p->oh < 1 || p->ow < 1)
        node_fatal(g, n, "attribute kernel_shape: the (dilated) kernel is larger than the padded input");
}

int64_t nn_conv_ws(const KConv2d *p)
{
    if (p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && !p->pt && !p->pl && !p->pb && !p->pr)
        return 0;
    return p->c / p->groups * p->kh * p->kw * p->oh * p->ow;
}

void nn_conv_attrs(Graph *g, int dst, const Node *src, const int64_t *pads)
{
    static const char *const keep[] = {"kernel_shape", "strides", "dilations", "group", "pads"};
    for (int i = 0; i < src->nattr; i++)
        for (int k = 0; k < (pads ? 4 : 5); k++)
            if (!strcmp(src->attr[i].name, keep[k]))
                *ir_attr_add(g, dst, keep[k], src->attr[i].kind) = src->attr[i];
    if (pads)
        ir_attr_ints_add(g, dst, "pads", pads, 4);
}

/* One spatial dim of a ConvTranspose: its output size from input size in,
 * kernel k, stride st, dilation dl, output padding op and pads pd[0] (begin),
 * pd[1] (end); os > 0: output_shape asks for that size and the pads are
 * computed as ONNX specifies (total = natural size - os, begin = total -
 * floor(total / 2), end = floor(total / 2)), a negative end pad being more
 * output padding.  Returns the size; pd and *op hold what the Conv over that
 * output, whose data gradient the ConvTranspose is, uses. */
int64_t nn_convt_dim(const Graph *g, const Node *n, int64_t in, int64_t k, int64_t st, int64_t dl, int64_t *op,
                         int64_t pd[2], int64_t os)
{
    if (in - 1 > MAX_NUMEL / st)
        node_fatal(g, n, "attribute strides: %lld x %lld input elements is beyond 2^40", (long long)st,
                   (long long)in);
    int64_t full = st * (in - 1) + *op + dl * (k - 1) + 1; /* each term <= 2^40: no wrap */
    if (os > 0) {
        int64_t total = full - os, half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor */
        pd[0] = total - half;
        pd[1] = half;
        if (pd[0] < 0)
            node_fatal(g, n, "attribute output_shape: %lld is more than one beyond the natural output size %lld "
                       "(its begin pad would be negative), which is not supported", (long long)os, (long long)full);
        if (pd[1] < 0) /* more output padding */
            *op -= pd[1], full -= pd[1], pd[1] = 0;
    }
    int64_t out = full - pd[0] - pd[1];
    if (out < 1)
        node_fatal(g, n, "attribute pads: they leave no output (the natural output size is %lld)", (long long)full);
    if (k_pool_out_dim(out, k, st, pd[0], pd[1], dl, 0) != in) /* the Conv over the output gives x back */
        node_fatal(g, n, "attributes output_padding / output_shape: %lld extra output is not supported (fsdpc "
                   "needs it below the stride %lld)", (long long)*op, (long long)st);
    return out;
}

void nn_convt_geom(const Graph *g, const Node *n, const Value *x, const Value *w, Shape *y, int64_t pads[4])
{
    int64_t st[2], dl[2], op[2], os[2], ks[2];
    need_float(g, n, x, "input");
    if (w->dtype != x->dtype)
        node_fatal(g, n, "weight '%s' is %s but the input is %s; mixed dtypes are not supported", ir_q(w->name),
                   dtype_name(w->dtype), dtype_name(x->dtype));
    need_2d(g, n, &x->shape);
    if (w->shape.rank != 4)
        node_fatal(g, n, "the weight must have rank 4 (c, m/group, kh, kw)");
    ints_attr(g, n, "kernel_shape", 2, 1, 0, ks);
    if (ir_attr(n, "kernel_shape") && (ks[0] != w->shape.dim[2] || ks[1] != w->shape.dim[3]))
        node_fatal(g, n, "attribute kernel_shape differs from the weight's spatial dims");
    ints_attr(g, n, "strides", 2, 1, 1, st);
    ints_attr(g, n, "dilations", 2, 1, 1, dl);
    ints_attr(g, n, "pads", 4, 0, 0, pads);
    ints_attr(g, n, "output_padding", 2, 0, 0, op);
    ints_attr(g, n, "output_shape", 2, 1, 0, os);
    no_auto_pad(g, n);
    int64_t grp = ir_attr_i(n, "group", 1), c = x->shape.dim[1];
    if (!shape_numel(&x->shape) || !shape_numel(&w->shape))
        node_fatal(g, n, "input %s and weight %s: a ConvTranspose over a zero-sized dimension is not supported "
                   "(fsdpc refuses empty tensors here)", shape_str(&x->shape), shape_str(&w->shape));
    if (w->shape.dim[0] != c)
        node_fatal(g, n, "weight %s: its dim 0 must be the %lld input channels (the weight is (channels, out "
                   "channels / group, kh, kw))", shape_str(&w->shape), (long long)c);
    if (grp < 1 || c % grp || w->shape.dim[1] > MAX_NUMEL / grp)
        node_fatal(g, n, "attribute group = %lld does not fit %lld input channels (the weight must be "
                   "(channels, out channels / group, kh, kw))", (long long)grp, (long long)c);
    window_fits(g, n, &w->shape.dim[2], dl);
    *y = (Shape){4, {x->shape.dim[0], w->shape.dim[1] * grp}};
    for (int i = 0; i < 2; i++) {
        int64_t pd[2] = {pads[i], pads[i + 2]};
        y->dim[2 + i] =
            nn_convt_dim(g, n, x->shape.dim[2 + i], w->shape.dim[2 + i], st[i], dl[i], &op[i], pd, os[i]);
        pads[i] = pd[0], pads[i + 2] = pd[1];
    }
    need_vec(g, n, 2, x, y->dim[1], "B");
    node_check_shape(g, n, y, "the output");
}

void nn_pool_geom(const Graph *g, const Node *n, const Shape *x, KPool2d *p)
{
    int64_t st[2], dl[2], pd[4], ks[2];
    need_2d(g, n, x);
    if (!ir_attr(n, "kernel_shape"))
        node_fatal(g, n, "attribute kernel_shape is required");
    ints_attr(g, n, "kernel_shape", 2, 1, 1, ks);
    ints_attr(g, n, "strides", 2, 1, 1, st);
    ints_attr(g, n, "dilations", 2, 1, 1, dl);
    ints_attr(g, n, "pads", 4, 0, 0, pd);
    no_auto_pad(g, n);
    window_fits(g, n, ks, dl);
    if (ir_attr_i(n, "storage_order", 0) != 0)
        node_fatal(g, n, "attribute storage_order = 1 (column-major indices) is not supported");
    int ceil = ir_attr_i(n, "ceil_mode", 0) != 0;
    *p = (KPool2d){.n = x->dim[0], .c = x->dim[1], .h = x->dim[2], .w = x->dim[3], .kh = ks[0], .kw = ks[1],
                   .sh = st[0], .sw = st[1], .dh = dl[0], .dw = dl[1], .pt = pd[0], .pl = pd[1], .pb = pd[2],
                   .pr = pd[3], .count_include_pad = ir_attr_i(n, "count_include_pad", 0) != 0};
    p->oh = k_pool_out_dim(p->h, p->kh, p->sh, p->pt, p->pb, p->dh, ceil);
    p->ow = k_pool_out_dim(p->w, p->kw, p->sw, p->pl, p->pr, p->dw, ceil);
    if (p->oh < 1 || p->ow < 1)
        node_fatal(g, n, "attribute kernel_shape: the (dilated) window is larger than the padded input");
}

/* the axes of a Reduce node: the attribute (fold made an axes input one) */
static const int64_t *reduce_axes(const Graph *g, const Node *n, int *na)
{
    const Attr *a = ir_attr(n, "axes");
    if (a && a->kind != A_INTS)
        node_fatal(g, n, "attribute axes must be a list of integers");
    *na = a ? a->n : 0;
    return a ? a->ints : NULL;
}

int nn_reduce_dims(const Graph *g, const Node *n, const Shape *x, Shape *kept, char *red)
{
    int na, r = x->rank;
    const int64_t *ax = reduce_axes(g, n, &na);
    *kept = *x;
    memset(red, 0, MAX_RANK);
    if (!na && ir_attr_i(n, "noop_with_empty_axes", 0))
        return 0;
    for (int i = 0; i < r && !na; i++)
        red[i] = 1;
    for (int i = 0; i < na; i++) {
        int d = nn_axis(g, n, ax[i], r, "axes");
        if (red[d])
            node_fatal(g, n, "attribute axes lists axis %lld twice", (long long)ax[i]);
        red[d] = 1;
    }
    for (int i = 0; i < r; i++)
        if (red[i])
            kept->dim[i] = 1;
    return 1;
}

/* a scalar constant input as a double; def when omitted */
static double const_scalar(const Graph *g, const Node *n, int i, const char *what, double def)
{
    const Value *v = in_val(g, n, i);
    if (!v)
        return def;
    if (v->role != R_CONST || shape_numel(&v->shape) != 1 || !ir_data(g, n->in[i]))
        node_fatal(g, n, "input %s '%s' must be a constant scalar; a computed %s is not supported", what,
               ir_q(v->name), what);
    char kind = dtype_kind(v->dtype);
    if (!dtype_is_float(v->dtype) && kind != 'b')
        node_fatal(g, n, "input %s '%s' has dtype %s, which is not supported", what, ir_q(v->name),
                   dtype_name(v->dtype));
    double x = dtype_get_f(v->data, 0, v->dtype);
    return kind == 'b' ? x != 0 : x;
}

double nn_dropout_ratio(const Graph *g, const Node *n)
{
    double r = const_scalar(g, n, 1, "ratio", 0.5);
    if (!(r >= 0 && r < 1))
        node_fatal(g, n, "input ratio = %g must be in [0, 1)", r);
    return r;
}

int nn_dropout_training(const Graph *g, const Node *n)
{
    return in_val(g, n, 2) ? const_scalar(g, n, 2, "training_mode", 0) != 0 : !g->opt->eval;
}

int nn_sce_reduction(const Graph *g, const Node *n)
{
    const char *s = ir_attr_s(n, "reduction", "mean");
    if (!strcmp(s, "none"))
        return NN_NONE;
    if (!strcmp(s, "sum"))
        return NN_SUM;
    if (!strcmp(s, "mean"))
        return NN_MEAN;
    node_fatal(g, n, "attribute reduction = '%s' is not supported (none, sum or mean)", ir_q(s));
}

int nn_bn_training(const Node *n) { return ir_attr_i(n, "training_mode", 0) != 0; }

/* ---- the rules ------------------------------------------------------------ */

static void pow_rule(Graph *g, const Node *n)
{
    const Value *a = in_val(g, n, 0), *b = in_val(g, n, 1);
    need_float(g, n, a, "base");
    if (b->dtype != a->dtype)
        node_fatal(g, n, "exponent '%s' has dtype %s and base %s: mixed-dtype Pow is not supported",
               ir_q(b->name), dtype_name(b->dtype), dtype_name(a->dtype));
    Shape o = {a->shape.rank > b->shape.rank ? a->shape.rank : b->shape.rank, {0}};
    for (int i = 0; i < o.rank; i++) {
        int ia = i - (o.rank - a->shape.rank), ib = i - (o.rank - b->shape.rank);
        int64_t da = ia >= 0 ? a->shape.dim[ia] : 1, db = ib >= 0 ? b->shape.dim[ib] : 1;
        if (da != db && da != 1 && db != 1)
            node_fatal(g, n, "the shapes of base and exponent do not broadcast (dim %d: %lld vs %lld)", i,
                   (long long)da, (long long)db);
        o.dim[i] = da == 1 ? db : da;
    }
    set_out(g, n, 0, a->dtype, &o);
}

static void conv_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0), *w = in_val(g, n, 1);
    need_float(g, n, x, "input");
    if (w->dtype != x->dtype)
        node_fatal(g, n, "weight '%s' is %s but the input is %s; mixed dtypes are not supported", ir_q(w->name),
               dtype_name(w->dtype), dtype_name(x->dtype));
    KConv2d p;
    nn_conv_geom(g, n, &x->shape, &w->shape, &p);
    need_vec(g, n, 2, x, p.m, "B");
    /* the im2col scratch: c/group x kh x kw x oh x ow, checked before nn_conv_ws multiplies */
    Shape y = {4, {p.n, p.m, p.oh, p.ow}}, col = {5, {p.c / p.groups, p.kh, p.kw, p.oh, p.ow}};
    node_check_shape(g, n, &y, "the output");
    node_check_shape(g, n, &col, "the im2col workspace");
    Shape ws = shape1(nn_conv_ws(&p));
    set_out(g, n, 0, x->dtype, &y);
    set_out(g, n, 1, x->dtype, &ws);
}

static void batchnorm_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    if (x->shape.rank < 2)
        node_fatal(g, n, "input '%s' needs rank >= 2 (N, C, ...)", ir_q(x->name));
    int64_t c = x->shape.dim[1];
    static const char *what[] = {"", "scale", "B", "input_mean", "input_var"};
    for (int i = 1; i < 5; i++)
        need_vec(g, n, i, x, c, what[i]);
    Shape sc = shape1(c);
    set_out(g, n, 0, x->dtype, &x->shape);
    for (int k = 1; k < 5; k++)
        set_out(g, n, k, x->dtype, &sc);
}

static void layernorm_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    int ax = nn_axis(g, n, ir_attr_i(n, "axis", -1), x->shape.rank, "axis");
    if (ir_attr_i(n, "stash_type", 1) != 1)
        node_fatal(g, n, "attribute stash_type = %lld is not supported (statistics are computed in double)",
               (long long)ir_attr_i(n, "stash_type", 1));
    Shape st = x->shape;
    int64_t inner = 1;
    for (int i = ax; i < st.rank; i++) {
        inner *= st.dim[i];
        st.dim[i] = 1;
    }
    need_vec(g, n, 1, x, inner, "scale");
    need_vec(g, n, 2, x, inner, "B");
    set_out(g, n, 0, x->dtype, &x->shape);
    set_out(g, n, 1, x->dtype, &st);
    set_out(g, n, 2, x->dtype, &st);
}

static void pool_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    if (n->op == OP_GlobalAveragePool) {
        if (x->shape.rank < 3)
            node_fatal(g, n, "input '%s' needs rank >= 3 (N, C, spatial...)", ir_q(x->name));
        Shape y = x->shape;
        for (int i = 2; i < y.rank; i++)
            y.dim[i] = 1;
        set_out(g, n, 0, x->dtype, &y);
        return;
    }
    KPool2d p;
    nn_pool_geom(g, n, &x->shape, &p);
    Shape y = {4, {p.n, p.c, p.oh, p.ow}};
    node_check_shape(g, n, &y, "the output");
    set_out(g, n, 0, x->dtype, &y);
    set_out(g, n, 1, DT_I64, &y);
    set_out(g, n, 2, DT_I64, &y);
}

static void reduce_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    Shape kept, y = {0};
    char red[MAX_RANK];
    if (!nn_reduce_dims(g, n, &x->shape, &kept, red) || ir_attr_i(n, "keepdims", 1)) {
        set_out(g, n, 0, x->dtype, &kept);
        return;
    }
    for (int i = 0; i < x->shape.rank; i++)
        if (!red[i])
            y.dim[y.rank++] = x->shape.dim[i];
    set_out(g, n, 0, x->dtype, &y);
}

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The mask's RNG stream is fixed here as attribute `stream` (a hash of the
 * ONNX node name), so a copy of the node (recompute) draws the same mask. */
static void dropout_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    double ratio = nn_dropout_ratio(g, n);
    if (g->opt->eval && nn_dropout_training(g, n) && ratio > 0)
        node_fatal(g, n, "input training_mode: dropping (ratio %g) is not supported in an --eval build, "
               "which is deterministic", ratio);
    set_out(g, n, 0, x->dtype, &x->shape);
    set_out(g, n, 1, DT_BOOL, &x->shape);
    if (!ir_attr(n, "stream"))
        ir_attr_add(g, (int)(n - g->node), "stream", A_INT)->i = name_hash(n->name);
}

static void softmax_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0);
    need_float(g, n, x, "input");
    nn_axis(g, n, ir_attr_i(n, "axis", -1), x->shape.rank, "axis");
    set_out(g, n, 0, x->dtype, &x->shape);
}

/* scores (NegativeLogLikelihoodLoss: log-probabilities) n c d1.. dk, labels
 * n d1.. dk (int64), weights c */
static void sce_rule(Graph *g, const Node *n)
{
    const Value *x = in_val(g, n, 0), *l = in_val(g, n, 1);
    need_float(g, n, x, "scores");
    if (x->shape.rank < 2)
        node_fatal(g, n, "scores '%s' need rank >= 2 (N, C, ...)", ir_q(x->name));
    if (l->dtype != DT_I64)
        node_fatal(g, n, "labels '%s' have dtype %s, which is not supported (int64 only)", ir_q(l->name),
               dtype_name(l->dtype));
    Shape ls = x->shape;
    ls.rank--;
    for (int i = 1; i < ls.rank; i++)
        ls.dim[i] = x->shape.dim[i + 1];
    if (!shape_eq(&ls, &l->shape))
        node_fatal(g, n, "labels '%s' must have the scores' shape without dim 1 (classes)", ir_q(l->name));
    if (!shape_numel(&x->shape))
        node_fatal(g, n, "scores '%s' %s have no elements (an empty batch or 0 classes); fsdpc refuses "
                   "zero-sized loss inputs", ir_q(x->name), shape_str(&x->shape));
    need_vec(g, n, 2, x, x->shape.dim[1], "weights");
    Shape scalar = {0};
    set_out(g, n, 0, x->dtype, nn_sce_reduction(g, n) == NN_NONE ? &ls : &scalar);
    set_out(g, n, 1, x->dtype, &x->shape);
}

int shape_nn(Graph *g, int node)
{
    const Node *n = &g->node[node];
    if (op_info[n->op].flags & F_REDUCE) {
        reduce_rule(g, n);
        return 1;
    }
    switch (n->op) {
    case OP_Pow: pow_rule(g, n); return 1;
    case OP_Conv: conv_rule(g, n); return 1;
    case OP_BatchNormalization: batchnorm_rule(g, n); return 1;
    case OP_LayerNormalization: layernorm_rule(g, n); return 1;
    case OP_Softmax: case OP_LogSoftmax: softmax_rule(g, n); return 1;
    case OP_MaxPool: case OP_AveragePool: case OP_GlobalAveragePool: pool_rule(g, n); return 1;
    case OP_Dropout: dropout_rule(g, n); return 1;
    case OP_SoftmaxCrossEntropyLoss: case OP_NegativeLogLikelihoodLoss: sce_rule(g, n); return 1;
    default: return 0; /* the family's gradient ops are typed when made */
    }
}
