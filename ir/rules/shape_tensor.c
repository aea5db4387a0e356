/* shape_tensor.c — shape rules of the tensor family (shapes, indexing, data
 * movement, comparisons).
 *
 * Every rule reads attributes only: fold has already turned the inputs that
 * decide a shape (Slice's starts, Unsqueeze's axes, ...) into attributes, and
 * rejected them when they were not constants.  A node whose shapes don't fit
 * is a user error naming the node.  ONNX semantics are those of opsets
 * 13-17: negative axes count from the end, Slice clamps its bounds, Expand
 * broadcasts both ways, Split without sizes cuts equal parts.  The shared
 * readers (tensor_slice, tensor_ints, ...) are in ir/rules/tensor.c.
 */
#include "tensor.h"
#include "kernels.h"

#include <string.h>


/* numpy broadcasting of a and b into o; 0 if incompatible */
static int broadcast(const Shape *a, const Shape *b, Shape *o)
{
    Shape r = {.rank = a->rank > b->rank ? a->rank : b->rank};
    for (int i = 0; i < r.rank; i++) {
        int ia = i - (r.rank - a->rank), ib = i - (r.rank - b->rank);
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return 0;
        r.dim[i] = da == 1 ? db : da;
    }
    *o = r;
    return 1;
}

static const Value *in(const Graph *g, const Node *n, int i) { return &g->val[n->in[i]]; }

static void set_out(Graph *g, const Node *n, int k, DType dt, const Shape *s)
{
    g->val[n->out[k]].dtype = dt;
    g->val[n->out[k]].shape = *s;
}

/* ---- shape rules --------------------------------------------------------- */
/* Every output shape is checked after its rule (shape.c: no negative dim, at
 * most MAX_NUMEL elements); a rule guards only its own arithmetic. */

static void shape_op(Graph *g, const Node *n)
{
    int r = in(g, n, 0)->shape.rank;
    int64_t s = ir_attr_i(n, "start", 0), e = ir_attr_i(n, "end", r);
    s = s < 0 ? s + r : s;
    e = e < 0 ? e + r : e;
    s = s < 0 ? 0 : s > r ? r : s;
    e = e < 0 ? 0 : e > r ? r : e;
    Shape o = {1, {e > s ? e - s : 0}};
    set_out(g, n, 0, DT_I64, &o);
}

static void constant_of_shape(Graph *g, const Node *n)
{
    int k;
    const int64_t *d = tensor_ints(n, "shape", &k);
    if (!ir_attr(n, "shape"))
        node_fatal(g, n, "needs its shape input");
    if (k > MAX_RANK)
        node_fatal(g, n, "output rank %d; fsdpc supports rank <= %d", k, MAX_RANK);
    Shape s = {k, {0}};
    for (int i = 0; i < k; i++)
        s.dim[i] = d[i];
    const Value *v = tensor_value_attr(g, n);
    set_out(g, n, 0, v ? v->dtype : DT_F32, &s);
}

static void squeeze(Graph *g, const Node *n)
{
    const Shape *x = &in(g, n, 0)->shape;
    int k;
    const int64_t *ax = tensor_ints(n, "axes", &k);
    char drop[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        int d = tensor_axis(g, n, ax[i], x->rank, "axes entry");
        if (x->dim[d] != 1)
            node_fatal(g, n, "cannot squeeze dim %d of size %lld (shape %s)", d, (long long)x->dim[d],
                       shape_str(x));
        drop[d] = 1;
    }
    Shape s = {0};
    for (int d = 0; d < x->rank; d++)
        if (!(k ? drop[d] : x->dim[d] == 1)) /* no (or empty) axes: every 1 */
            s.dim[s.rank++] = x->dim[d];
    set_out(g, n, 0, in(g, n, 0)->dtype, &s);
}

static void unsqueeze(Graph *g, const Node *n)
{
    const Shape *x = &in(g, n, 0)->shape;
    int k;
    const int64_t *ax = tensor_ints(n, "axes", &k);
    if (!ax)
        node_fatal(g, n, "needs its axes input");
    int r = x->rank + k;
    if (r > MAX_RANK)
        node_fatal(g, n, "output rank %d; fsdpc supports rank <= %d", r, MAX_RANK);
    char ins[MAX_RANK] = {0};
    for (int i = 0; i < k; i++) {
        int d = tensor_axis(g, n, ax[i], r, "axes entry");
        if (ins[d]++)
            node_fatal(g, n, "axis %d is listed twice", d);
    }
    Shape s = {r, {0}};
    for (int d = 0, j = 0; d < r; d++)
        s.dim[d] = ins[d] ? 1 : x->dim[j++];
    set_out(g, n, 0, in(g, n, 0)->dtype, &s);
}

static void flatten(Graph *g, const Node *n)
{
    const Shape *x = &in(g, n, 0)->shape;
    int64_t a = ir_attr_i(n, "axis", 1);
    if (a < -x->rank || a > x->rank)
        node_fatal(g, n, "axis %lld is outside [%d, %d]", (long long)a, -x->rank, x->rank);
    a = a < 0 ? a + x->rank : a;
    Shape s = {2, {1, 1}};
    for (int d = 0; d < x->rank; d++)
        s.dim[d >= a] *= x->dim[d];
    set_out(g, n, 0, in(g, n, 0)->dtype, &s);
}

static void concat(Graph *g, const Node *n)
{
    const Value *x0 = in(g, n, 0);
    if (!ir_attr(n, "axis"))
        node_fatal(g, n, "needs the attribute axis");
    if (x0->shape.rank == 0)
        node_fatal(g, n, "cannot concatenate scalars");
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x0->shape.rank, "axis");
    Shape s = x0->shape;
    s.dim[ax] = 0;
    for (int i = 0; i < n->nin; i++) {
        const Value *x = in(g, n, i);
        int ok = x->dtype == x0->dtype && x->shape.rank == s.rank;
        for (int d = 0; ok && d < s.rank; d++)
            ok = d == ax || x->shape.dim[d] == s.dim[d];
        if (!ok)
            node_fatal(g, n, "input '%s' (%s %s) does not fit '%s' (%s %s) along axis %d", ir_q(x->name),
                       dtype_name(x->dtype), shape_str(&x->shape), ir_q(x0->name), dtype_name(x0->dtype),
                       shape_str(&x0->shape), ax);
        s.dim[ax] += x->shape.dim[ax]; /* each <= MAX_NUMEL: no wrap before the check */
        if (s.dim[ax] > MAX_NUMEL)
            node_fatal(g, n, "the output would have more than 2^40 elements along axis %d", ax);
    }
    set_out(g, n, 0, x0->dtype, &s);
}

/* the size of every Split output along the axis */
static int64_t *split_sizes(const Graph *g, const Node *n, int ax)
{
    const Shape *x = &in(g, n, 0)->shape;
    int k;
    const int64_t *sp = tensor_ints(n, "split", &k);
    int64_t *out = ir_alloc(sizeof(int64_t) * (size_t)n->nout), sum = 0;
    int64_t parts = ir_attr_i(n, "num_outputs", 0); /* Split-18: the last part smaller when it must be */
    if (sp && k != n->nout)
        node_fatal(g, n, "split lists %d sizes for %d outputs", k, n->nout);
    if (!sp && parts && parts != n->nout)
        node_fatal(g, n, "num_outputs is %lld, but the node has %d outputs", (long long)parts, n->nout);
    int64_t chunk = (x->dim[ax] + n->nout - 1) / n->nout;
    if (!sp && parts)
        for (int i = 0; i < n->nout; i++) {
            int64_t left = x->dim[ax] - chunk * i;
            out[i] = left < 0 ? 0 : left < chunk ? left : chunk;
        }
    if (!sp && !parts && x->dim[ax] % n->nout)
        node_fatal(g, n, "dim %d of size %lld does not split into %d equal parts", ax,
                   (long long)x->dim[ax], n->nout);
    for (int i = 0; i < n->nout; i++) {
        out[i] = sp ? sp[i] : parts ? out[i] : x->dim[ax] / n->nout;
        if (out[i] < 0 || out[i] > x->dim[ax])
            node_fatal(g, n, "split size %lld is outside [0, %lld]", (long long)out[i], (long long)x->dim[ax]);
        sum += out[i];
    }
    if (sum != x->dim[ax])
        node_fatal(g, n, "split sizes add up to %lld, but dim %d has %lld", (long long)sum, ax,
                   (long long)x->dim[ax]);
    return out;
}

static int split_axis(const Graph *g, const Node *n)
{
    const Shape *x = &in(g, n, 0)->shape;
    if (x->rank == 0)
        node_fatal(g, n, "cannot split a scalar");
    return tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->rank, "axis");
}

static void split(Graph *g, const Node *n)
{
    int ax = split_axis(g, n);
    int64_t *sz = split_sizes(g, n, ax);
    for (int k = 0; k < n->nout; k++) {
        Shape s = in(g, n, 0)->shape;
        s.dim[ax] = sz[k];
        set_out(g, n, k, in(g, n, 0)->dtype, &s);
    }
}

static void slice(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0);
    int64_t start[MAX_RANK], step[MAX_RANK];
    Shape s = {x->shape.rank, {0}};
    tensor_slice(g, n, &x->shape, start, step, s.dim);
    set_out(g, n, 0, x->dtype, &s);
}

static void gather(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0), *ix = in(g, n, 1);
    tensor_index_dtype(g, n, ix);
    if (x->shape.rank == 0)
        node_fatal(g, n, "cannot gather from a scalar");
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis");
    int r = x->shape.rank - 1 + ix->shape.rank;
    if (r > MAX_RANK)
        node_fatal(g, n, "output rank %d; fsdpc supports rank <= %d", r, MAX_RANK);
    Shape s = {0};
    for (int d = 0; d < ax; d++)
        s.dim[s.rank++] = x->shape.dim[d];
    for (int d = 0; d < ix->shape.rank; d++)
        s.dim[s.rank++] = ix->shape.dim[d];
    for (int d = ax + 1; d < x->shape.rank; d++)
        s.dim[s.rank++] = x->shape.dim[d];
    tensor_const_indices(g, n, ix, &x->shape.dim[ax], 1);
    set_out(g, n, 0, x->dtype, &s);
}

/* fsdpc's NDIndex (made by fold, which checked the shapes against the
 * user's node): int64 tuples [.., k] -> int64 positions [..] */
static void nd_index(Graph *g, const Node *n)
{
    const Value *ix = in(g, n, 0);
    int k;
    tensor_ints(n, "dims", &k);
    if (ix->dtype != DT_I64 || ix->shape.rank < 1 || k < 1 || ix->shape.dim[ix->shape.rank - 1] != k)
        die("NDIndex %s: indices are not int64 tuples of its %d dims", n->name, k);
    Shape s = ix->shape;
    s.rank--;
    set_out(g, n, 0, DT_I64, &s);
}

static void gather_elements(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0), *ix = in(g, n, 1);
    tensor_elements_axis(g, n, x, ix);
    set_out(g, n, 0, x->dtype, &ix->shape);
}

static void expand(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0);
    int k;
    const int64_t *d = tensor_ints(n, "shape", &k);
    if (!d && !ir_attr(n, "shape"))
        node_fatal(g, n, "needs its shape input");
    if (k > MAX_RANK)
        node_fatal(g, n, "shape has %d entries; fsdpc supports rank <= %d", k, MAX_RANK);
    Shape t = {k, {0}}, s;
    for (int i = 0; i < k; i++)
        t.dim[i] = d[i];
    if (!broadcast(&x->shape, &t, &s))
        node_fatal(g, n, "cannot expand %s to %s", shape_str(&x->shape), shape_str(&t));
    set_out(g, n, 0, x->dtype, &s);
}

static void tile(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0);
    int k;
    const int64_t *rep = tensor_ints(n, "repeats", &k);
    if (k != x->shape.rank || (!rep && k))
        node_fatal(g, n, "repeats has %d entries for an input of rank %d", k, x->shape.rank);
    Shape s = x->shape;
    for (int i = 0; i < k; i++) {
        if (rep[i] < 0)
            node_fatal(g, n, "repeats must not be negative");
        if (rep[i] && s.dim[i] > MAX_NUMEL / rep[i]) /* before the product can wrap */
            node_fatal(g, n, "the output would have more than 2^40 elements");
        s.dim[i] *= rep[i];
    }
    set_out(g, n, 0, x->dtype, &s);
}

static void pad(Graph *g, const Node *n)
{
    const Value *x = in(g, n, 0);
    int k, r = x->shape.rank, mode = tensor_pad_mode(g, n);
    const int64_t *p = tensor_ints(n, "pads", &k);
    if (!p || k != 2 * r)
        node_fatal(g, n, "pads needs %d entries (begin and end of each dim), not %d", 2 * r, k);
    Shape s = x->shape;
    for (int d = 0; d < r; d++) {
        if (p[d] < -MAX_NUMEL || p[d] > MAX_NUMEL || p[r + d] < -MAX_NUMEL || p[r + d] > MAX_NUMEL)
            node_fatal(g, n, "pads of dim %d are beyond 2^40", d);
        s.dim[d] = x->shape.dim[d] + p[d] + p[r + d];
        if (s.dim[d] < 0)
            node_fatal(g, n, "pads crop dim %d of size %lld below zero", d, (long long)x->shape.dim[d]);
        if (mode != K_PAD_CONSTANT && x->shape.dim[d] == 0 && s.dim[d] > 0)
            node_fatal(g, n, "edge and reflect padding need a non-empty dim %d", d);
    }
    tensor_value_attr(g, n);
    set_out(g, n, 0, x->dtype, &s);
}

static void where(Graph *g, const Node *n)
{
    const Value *c = in(g, n, 0), *a = in(g, n, 1), *b = in(g, n, 2);
    Shape s;
    if (c->dtype != DT_BOOL)
        node_fatal(g, n, "condition '%s' must be bool, not %s", ir_q(c->name), dtype_name(c->dtype));
    if (a->dtype != b->dtype)
        node_fatal(g, n, "x and y dtypes differ (%s and %s)", dtype_name(a->dtype), dtype_name(b->dtype));
    if (!broadcast(&c->shape, &a->shape, &s) || !broadcast(&s, &b->shape, &s))
        node_fatal(g, n, "shapes %s, %s and %s do not broadcast", shape_str(&c->shape),
                   shape_str(&a->shape), shape_str(&b->shape));
    set_out(g, n, 0, a->dtype, &s);
}

static void compare(Graph *g, const Node *n)
{
    const Value *a = in(g, n, 0), *b = in(g, n, 1);
    Shape s;
    if (a->dtype != b->dtype || !(dtype_is_float(a->dtype) || a->dtype == DT_I64))
        node_fatal(g, n, "input dtypes %s and %s: need one dtype of float32, float64, int64, "
                   "int32 or bool", dtype_name(a->dtype), dtype_name(b->dtype));
    if (!broadcast(&a->shape, &b->shape, &s))
        node_fatal(g, n, "shapes %s and %s do not broadcast", shape_str(&a->shape), shape_str(&b->shape));
    set_out(g, n, 0, DT_BOOL, &s);
}

static void cast(Graph *g, const Node *n)
{
    int64_t to = n->op == OP_CastLike ? tensor_to_onnx(in(g, n, 1)->dtype) : ir_attr_i(n, "to", 0);
    DType dt = tensor_from_onnx(to);
    if (dt == DT_UNDEF)
        node_fatal(g, n, "a cast to %s is not supported (fsdpc supports float32, float64, float16, bfloat16, "
                   "bool and the integers of 8 to 64 bits)", tensor_onnx_name(to));
    set_out(g, n, 0, dt, &in(g, n, 0)->shape);
}

static void same_as_input(Graph *g, const Node *n, DType need)
{
    const Value *x = in(g, n, 0);
    if (need != DT_UNDEF && x->dtype != need)
        node_fatal(g, n, "input '%s' is %s; it must be %s", ir_q(x->name), dtype_name(x->dtype), dtype_name(need));
    if (n->op == OP_Trilu && x->shape.rank < 2)
        node_fatal(g, n, "needs rank >= 2, not %d", x->shape.rank);
    set_out(g, n, 0, x->dtype, &x->shape);
}

static void range(Graph *g, const Node *n)
{
    Shape s = {1, {tensor_range_len(g, n)}};
    set_out(g, n, 0, in(g, n, 0)->dtype, &s);
}

int shape_tensor(Graph *g, int node)
{
    const Node *n = &g->node[node];
    switch (n->op) {
    case OP_Shape: shape_op(g, n); return 1;
    case OP_Size: set_out(g, n, 0, DT_I64, &(Shape){0}); return 1;
    case OP_ConstantOfShape: constant_of_shape(g, n); return 1;
    case OP_Range: range(g, n); return 1;
    case OP_Squeeze: squeeze(g, n); return 1;
    case OP_Unsqueeze: unsqueeze(g, n); return 1;
    case OP_Flatten: flatten(g, n); return 1;
    case OP_Concat: concat(g, n); return 1;
    case OP_Split: split(g, n); return 1;
    case OP_Slice: slice(g, n); return 1;
    case OP_Gather: gather(g, n); return 1;
    case OP_GatherElements: gather_elements(g, n); return 1;
    case OP_NDIndex: nd_index(g, n); return 1;
    case OP_Expand: expand(g, n); return 1;
    case OP_Tile: tile(g, n); return 1;
    case OP_Pad: pad(g, n); return 1;
    case OP_Where: where(g, n); return 1;
    case OP_Equal: case OP_Less: case OP_Greater: case OP_LessOrEqual: case OP_GreaterOrEqual:
        compare(g, n);
        return 1;
    case OP_Not: same_as_input(g, n, DT_BOOL); return 1;
    case OP_Cast: case OP_CastLike: cast(g, n); return 1;
    case OP_Trilu: same_as_input(g, n, DT_UNDEF); return 1;
    case OP_WhereGrad: same_as_input(g, n, DT_UNDEF); return 1;
    case OP_Zeros: case OP_SliceGrad: case OP_GatherGrad: case OP_GatherElementsGrad: case OP_PadGrad:
    case OP_TileGrad:
        return 1; /* created with their output typed (like the forward input) */
    default: return 0;
    }
}
