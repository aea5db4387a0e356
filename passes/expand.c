/* expand.c — fold's expansions of composite ops: opset 23's RMSNormalization,
 * RotaryEmbedding and Attention, the logical and NaN tests, ArgMax / ArgMin,
 * CumSum, TopK, GatherND / ScatterND / ScatterElements, Resize and Einsum, each
 * written with ops fsdpc computes (and differentiates), so no later pass
 * sees a composite.  Each expansion replaces node id by new nodes, named
 * NODE/suffix, which it visits (fold.c: shaped or folded) in order; the
 * last writes node id's outputs.
 */
#include "fold.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <math.h>
#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

/* ---- opset 23's composite ops --------------------------------------------- */

/* Node op(in[0..nin)) named NODE/suffix writing out (a new value if -1),
 * not yet visited: the caller adds attributes, then visits it. */
static int expand_node_n(Sweep *s, int id, Op op, const int *in, int nin, const char *suffix, int out)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return ir_node(g, op, name, nin, in, 1, &out);
}

/* As expand_node_n, of op(a[, b]) */
static int expand_node(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
{
    int in[2] = {a, b};
    return expand_node_n(s, id, op, in, b < 0 ? 1 : 2, suffix, out);
}

/* As expand_node, visited; its output. */
static int expand(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
{
    int c = expand_node(s, id, op, a, b, suffix, out);
    visit(s, c);
    return s->g->node[c].out[0];
}

int fold_expand(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
{
    return expand(s, id, op, a, b, suffix, out);
}

/* As expand, of op(a, b, c) */
static int expand3(Sweep *s, int id, Op op, int a, int b, int c, const char *suffix, int out)
{
    int in[3] = {a, b, c}, k = expand_node_n(s, id, op, in, 3, suffix, out);
    visit(s, k);
    return s->g->node[k].out[0];
}

/* A scalar constant v of dtype dt (float32/64, int32/64 or bool). */
static int new_scalar(Sweep *s, int id, DType dt, double v, const char *suffix)
{
    Graph *g = s->g;
    return ir_scalar(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), dt, v);
}

/* x reshaped to dims[0..n) (x itself when it has them); its output */
static int expand_reshape(Sweep *s, int id, int x, const int64_t *dims, int n)
{
    Graph *g = s->g;
    const Shape *xs = &g->val[x].shape;
    if (xs->rank == n && !memcmp(xs->dim, dims, sizeof(int64_t) * (size_t)n))
        return x;
    Shape cs = {.rank = 1};
    cs.dim[0] = n;
    int sv = ir_const(g, ir_fmt("%s/shape.%d", g->node[id].name, s->nnew++), DT_I64, &cs, dims);
    return expand(s, id, OP_Reshape, x, sv, "reshape", -1);
}

/* x transposed by perm (rank n) named NODE/suffix, visited; its output */
static int expand_perm(Sweep *s, int id, int x, const int64_t *perm, int n, const char *suffix)
{
    int c = expand_node(s, id, OP_Transpose, x, -1, suffix, -1);
    ir_attr_ints_add(s->g, c, "perm", perm, n);
    visit(s, c);
    return s->g->node[c].out[0];
}

/* RMSNormalization: Y = X / sqrt(mean(X^2 over axes axis..r-1) + epsilon) * scale */
void expand_rmsnorm(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    if (!dtype_is_float(x->dtype))
        node_fatal(g, &n, "X must be float32 or float64, not %s", dtype_name(x->dtype));
    int r = x->shape.rank, ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", -1), r, "axis");
    int x2 = expand(s, id, OP_Mul, n.in[0], n.in[0], "square", -1);
    int c = expand_node(s, id, OP_ReduceMean, x2, -1, "mean", -1);
    int64_t axes[MAX_RANK];
    for (int i = ax; i < r; i++)
        axes[i - ax] = i;
    ir_attr_ints_add(g, c, "axes", axes, r - ax);
    ir_attr_add(g, c, "keepdims", A_INT)->i = 1;
    visit(s, c);
    int e = expand(s, id, OP_Add, g->node[c].out[0],
                   new_scalar(s, id, x->dtype, ir_attr_f(&n, "epsilon", 1e-5f), "epsilon"), "add_eps", -1);
    int d = expand(s, id, OP_Sqrt, e, -1, "rms", -1);
    int y = expand(s, id, OP_Div, n.in[0], d, "normalized", -1);
    expand(s, id, OP_Mul, y, n.in[1], "scaled", n.out[0]);
}

/* IsNaN, IsInf, And, Or, Xor in the comparison ops, Not and Where.  Every
 * input must be there (optional ones none) and of the op's dtype class. */
void expand_logical(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int fl = n.op == OP_IsNaN || n.op == OP_IsInf, y = n.out[0], a = n.in[0], b = n.nin > 1 ? n.in[1] : -1;
    for (int i = 0; i < n.nin; i++) {
        DType t = n.in[i] < 0 ? DT_UNDEF : g->val[n.in[i]].dtype;
        if (fl ? !dtype_is_float(t) : t != DT_BOOL)
            node_fatal(g, &n, "input %d is %s; %s takes %s", i, n.in[i] < 0 ? "empty" : dtype_name(t),
                       op_info[n.op].name, fl ? "float32 or float64" : "bool");
    }
    switch (n.op) {
    case OP_IsNaN: expand(s, id, OP_Not, expand(s, id, OP_Equal, a, a, "self_equal", -1), -1, "not", y); return;
    case OP_IsInf: {
        DType t = g->val[a].dtype;
        int pos = ir_attr_i(&n, "detect_positive", 1) != 0, neg = ir_attr_i(&n, "detect_negative", 1) != 0;
        if (pos && neg)
            expand(s, id, OP_Equal, expand(s, id, OP_Abs, a, -1, "abs", -1),
                   new_scalar(s, id, t, INFINITY, "inf"), "equal_inf", y);
        else if (pos || neg)
            expand(s, id, OP_Equal, a, new_scalar(s, id, t, pos ? INFINITY : -INFINITY, "inf"), "equal_inf", y);
        else /* nothing detected: false everywhere */
            expand(s, id, OP_Less, a, new_scalar(s, id, t, -INFINITY, "inf"), "none", y);
        return;
    }
    default: { /* And: a ? b : false; Or: a ? true : b; Xor: a ? !b : b */
        int k = n.op == OP_Xor ? expand(s, id, OP_Not, b, -1, "not", -1)
                               : new_scalar(s, id, DT_BOOL, n.op == OP_Or, n.op == OP_Or ? "true" : "false");
        expand3(s, id, OP_Where, a, n.op == OP_And ? b : k, n.op == OP_And ? k : b, "where", y);
    }
    }
}

/* A reduction (ReduceMax, ReduceMin, ReduceProd) of x over axis (keepdims) named NODE/suffix, visited;
 * its output. */
static int expand_reduce(Sweep *s, int id, Op op, int x, int axis, int keepdims, const char *suffix, int out)
{
    Graph *g = s->g;
    int m = expand_node(s, id, op, x, -1, suffix, out);
    ir_attr_ints_add(g, m, "axes", &(int64_t){axis}, 1);
    ir_attr_add(g, m, "keepdims", A_INT)->i = keepdims;
    visit(s, m);
    return g->node[m].out[0];
}

/* ArgMax / ArgMin as reductions: v = x (ArgMin: -x); the hits are where v
 * equals its maximum along the axis, or is NaN (ReduceMax propagates NaN, so
 * a group holding a NaN picks a NaN, as torch.argmax does); the index is the
 * maximum over the hits of the position (select_last_index) or of the
 * distance to the end (then subtracted from len - 1: the first hit), cast to
 * int64.  Positions are exact in float32 to 2^24, the longest axis taken. */
void expand_argmax(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    DType t = x->dtype;
    const char *op = op_info[n.op].name;
    if (!dtype_is_float(t))
        node_fatal(g, &n, "data is %s: not supported (float32 or float64 only)", dtype_name(t));
    int r = x->shape.rank, ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", 0), r, "axis");
    int64_t len = x->shape.dim[ax];
    if (len < 1 || len > (1 << 24))
        node_fatal(g, &n, "axis %d has %lld elements; fsdpc supports %s over 1 to 2^24", ax, (long long)len, op);
    int last = ir_attr_i(&n, "select_last_index", 0) != 0, keep = ir_attr_i(&n, "keepdims", 1) != 0;
    int v = n.op == OP_ArgMin ? expand(s, id, OP_Neg, n.in[0], -1, "neg", -1) : n.in[0];
    int m = expand_reduce(s, id, OP_ReduceMax, v, ax, 1, "max", -1);
    int nan = expand(s, id, OP_Not, expand(s, id, OP_Equal, v, v, "self_equal", -1), -1, "nan", -1);
    int hit = expand3(s, id, OP_Where, expand(s, id, OP_Equal, v, m, "equal_max", -1),
                      new_scalar(s, id, DT_BOOL, 1, "true"), nan, "hit", -1);
    Shape ps = {.rank = r - ax}; /* the positions along the axis, broadcasting over the dims after it */
    ps.dim[0] = len;
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    void *p = ir_alloc(dtype_size(t) * (size_t)len);
    for (int64_t i = 0; i < len; i++)
        dtype_set_f(p, i, t, last ? (double)i : (double)(len - 1 - i));
    int pv = ir_const(g, ir_fmt("%s/positions.%d", n.name, s->nnew++), t, &ps, p);
    int sel = expand3(s, id, OP_Where, hit, pv, new_scalar(s, id, t, -1, "none"), "select", -1);
    int idx = expand_reduce(s, id, OP_ReduceMax, sel, ax, keep, "index", -1);
    if (!last)
        idx = expand(s, id, OP_Sub, new_scalar(s, id, t, (double)(len - 1), "last"), idx, "first", -1);
    int c = expand_node(s, id, OP_Cast, idx, -1, "int64", n.out[0]);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(DT_I64);
    visit(s, c);
}

/* x shifted by k along axis ax (a Pad adding k fill values (fill -1: zeros)
 * at the front and cropping k at the back; sign -1: the other way),
 * visited; its output. */
static int expand_shift(Sweep *s, int id, int x, int ax, int64_t k, int sign, int fill, int out)
{
    Graph *g = s->g;
    int r = g->val[x].shape.rank, c = expand_node(s, id, OP_Pad, x, -1, ir_fmt("shift%lld", (long long)k), out);
    int64_t pads[2 * MAX_RANK] = {0};
    pads[ax] = sign * k;
    pads[r + ax] = -sign * k;
    ir_attr_ints_add(g, c, "pads", pads, 2 * r);
    if (fill >= 0)
        ir_attr_add(g, c, "value", A_TENSOR)->t = fill;
    visit(s, c);
    return g->node[c].out[0];
}

/* CumSum as log2(len) shifted adds (Hillis-Steele): y += y shifted by k
 * along the axis for k = 1, 2, 4, ... < len (reverse: shifted the other
 * way); exclusive shifts x by one first.  CumProd the same with Mul and
 * ones shifted in.  Gradients follow from Add's / Mul's and Pad's (a
 * product's at zeros too); on int64 (position ids) they are the integer
 * forms. */
void expand_cumsum(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    int prod = n.op == OP_CumProd;
    if (!dtype_is_float(x->dtype) && x->dtype != DT_I64) /* int32: intarith.c widened it */
        node_fatal(g, &n, "x is %s: not supported (float32, float64, int32 or int64)", dtype_name(x->dtype));
    int r = x->shape.rank, ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", 0), r, "axis");
    int64_t len = x->shape.dim[ax];
    int sign = ir_attr_i(&n, "reverse", 0) ? -1 : 1, y = n.in[0];
    int one = prod ? new_scalar(s, id, DT_F64, 1.0, "one") : -1; /* Pad casts its value to x's dtype */
    if (ir_attr_i(&n, "exclusive", 0))
        y = expand_shift(s, id, y, ax, 1, sign, one, len > 1 ? -1 : n.out[0]);
    else if (len <= 1)
        expand(s, id, OP_Identity, y, -1, "identity", n.out[0]);
    for (int64_t k = 1; k < len; k *= 2)
        y = expand(s, id, prod ? OP_Mul : OP_Add, y, expand_shift(s, id, y, ax, k, sign, one, -1),
                   ir_fmt("%s%lld", prod ? "mul" : "add", (long long)k), 2 * k >= len ? n.out[0] : -1);
}

/* ---- TopK ---------------------------------------------------------------------- */

/* ctx[0] = the axis' length: element [i][j] is 1 where j comes before i */
static double earlier(int64_t i, const int64_t *ctx) { return i % ctx[0] < i / ctx[0]; }

/* TopK(x) with k (an attribute after fold), axis, largest (sorted: the output is always sorted) as ranks: the
 * rank of x[i] along the axis is how many x[j] beat it (larger; smaller if not largest; equal and j < i: ties go
 * to the lower index, as ONNX asks; a NaN ranks as +inf, so it leads a largest TopK and trails a smallest one);
 * the r-th index is the position whose rank is r; the values are GatherElements(x, indices), whose gradient
 * scatters dy back.  The ranks compare every pair along the axis ([.., len, len, ..] intermediates), so the
 * pairs are bounded: router-sized axes (experts, beams), not vocabularies. */
void expand_topk(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    DType xt = x->dtype, t = dtype_is_float(xt) ? xt : DT_F64; /* t: the counts' and positions' */
    if (!dtype_is_float(xt) && xt != DT_I64 && xt != DT_I32)
        node_fatal(g, &n, "input '%s' is %s: not supported (float32, float64, int32 or int64)", ir_q(x->name),
                   dtype_name(xt));
    if (!ir_attr(&n, "k"))
        node_fatal(g, &n, "needs its K input (a constant)");
    int r = x->shape.rank, ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", -1), r, "axis");
    int64_t len = x->shape.dim[ax], k = ir_attr_i(&n, "k", 0), numel = shape_numel(&x->shape);
    if (k < 1 || k > len)
        node_fatal(g, &n, "K = %lld is outside [1, %lld] (the axis' length; an empty TopK is not supported)",
                   (long long)k, (long long)len);
    const int64_t pairs = (int64_t)1 << 26;
    if (!numel)
        node_fatal(g, &n, "input %s is empty: an empty TopK is not supported", shape_str(&x->shape));
    if (len > pairs / numel)
        node_fatal(g, &n, "TopK over %lld elements along an axis of %lld: fsdpc ranks them by comparing every pair "
                   "(%lld x %lld), which it supports up to 2^26 comparisons", (long long)numel, (long long)len,
                   (long long)numel, (long long)len);
    int largest = ir_attr_i(&n, "largest", 1) != 0;
    int64_t a1 = ax + 1, a0 = ax;
    int key = n.in[0];
    if (xt == DT_I32) { /* compared in int64, as fold's canon compares int32 */
        int c = expand_node(s, id, OP_Cast, key, -1, "key64", -1);
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(DT_I64);
        visit(s, c);
        key = g->node[c].out[0];
    }
    if (dtype_is_float(xt)) {
        int nan = expand(s, id, OP_Not, expand(s, id, OP_Equal, key, key, "self_equal", -1), -1, "nan", -1);
        key = expand3(s, id, OP_Where, nan, new_scalar(s, id, t, INFINITY, "nan_key"), key, "key", -1);
    }
    int ki = expand_node(s, id, OP_Unsqueeze, key, -1, "key_i", -1); /* [.., i, 1, ..] */
    ir_attr_ints_add(g, ki, "axes", &a1, 1);
    visit(s, ki);
    int kj = expand_node(s, id, OP_Unsqueeze, key, -1, "key_j", -1); /* [.., 1, j, ..] */
    ir_attr_ints_add(g, kj, "axes", &a0, 1);
    visit(s, kj);
    int vi = g->node[ki].out[0], vj = g->node[kj].out[0];
    Shape ps = {.rank = r + 1 - ax}; /* [len, len, 1...]: j before i, broadcasting over the dims after the axis */
    ps.dim[0] = ps.dim[1] = len;
    for (int i = 2; i < ps.rank; i++)
        ps.dim[i] = 1;
    int before = fold_const_fill(s, id, DT_BOOL, &ps, earlier, &len, "earlier");
    int tie = expand3(s, id, OP_Where, expand(s, id, OP_Equal, vj, vi, "tie", -1), before,
                      new_scalar(s, id, DT_BOOL, 0, "false"), "tie_before", -1);
    int beats = expand3(s, id, OP_Where, expand(s, id, largest ? OP_Greater : OP_Less, vj, vi, "beyond", -1),
                        new_scalar(s, id, DT_BOOL, 1, "true"), tie, "beats", -1);
    int c = expand_node(s, id, OP_Cast, beats, -1, "count", -1);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(t);
    visit(s, c);
    int rank = expand_reduce(s, id, OP_ReduceSum, g->node[c].out[0], (int)a1, 1, "rank", -1); /* [.., i, 1, ..] */
    ps.dim[0] = k, ps.dim[1] = 1;
    ps.rank = r - ax; /* [k, 1...] at the new axis a1 */
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    int want = fold_const_fill(s, id, t, &ps, fold_index_of, NULL, "ranks");
    ps.rank = r + 1 - ax; /* [len, 1, 1...] at the axis */
    ps.dim[0] = len;
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    int pos = fold_const_fill(s, id, t, &ps, fold_index_of, NULL, "positions");
    int pick = expand3(s, id, OP_Where, expand(s, id, OP_Equal, rank, want, "ranked", -1), pos,
                       new_scalar(s, id, t, 0, "zero"), "pick", -1); /* [.., len, k, ..] */
    int idx = expand_reduce(s, id, OP_ReduceSum, pick, (int)a0, 0, "index", -1); /* [.., k, ..] */
    int out1 = n.nout > 1 && n.out[1] >= 0 ? n.out[1] : -1;
    c = expand_node(s, id, OP_Cast, idx, -1, "indices", out1);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(DT_I64);
    visit(s, c);
    int ge = expand_node(s, id, OP_GatherElements, n.in[0], g->node[c].out[0], "values", n.out[0]);
    ir_attr_add(g, ge, "axis", A_INT)->i = ax;
    visit(s, ge);
}

/* ---- GatherND, ScatterND, ScatterElements ------------------------------------ */

/* NDIndex(idx) over k dims with b batch dims, named NODE/suffix, visited; its output */
static int nd_index(Sweep *s, int id, int idx, const int64_t *dims, int k, int b, const char *suffix)
{
    Graph *g = s->g;
    int c = expand_node(s, id, OP_NDIndex, idx, -1, suffix, -1);
    ir_attr_ints_add(g, c, "dims", dims, k);
    ir_attr_add(g, c, "batch", A_INT)->i = b;
    visit(s, c);
    return g->node[c].out[0];
}

/* NDIndex of node n's indices (input 1, int64 after cast_input) into data
 * (input 0) with b batch dims, after checking the shapes ONNX requires and,
 * when the indices are a constant, every component; visited, its output.
 * *k: the tuple length. */
static int nd_positions(Sweep *s, int id, int b, int *k)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]], *ix = &g->val[n.in[1]];
    int r = x->shape.rank, q = ix->shape.rank;
    tensor_index_dtype(g, &n, ix);
    if (q < 1 || b < 0 || b >= q || b >= r)
        node_fatal(g, &n, "indices '%s' have rank %d, data '%s' rank %d: batch_dims %d must be below both", ir_q(ix->name),
                   q, ir_q(x->name), r, b);
    if (ix->shape.dim[q - 1] < 1 || ix->shape.dim[q - 1] > r - b)
        node_fatal(g, &n, "indices '%s' end in tuples of %lld; %s needs 1 to %d (data's rank less batch_dims)",
                   ir_q(ix->name), (long long)ix->shape.dim[q - 1], op_info[n.op].name, r - b);
    *k = (int)ix->shape.dim[q - 1];
    for (int i = 0; i < b; i++)
        if (ix->shape.dim[i] != x->shape.dim[i])
            node_fatal(g, &n, "batch dim %d is %lld in indices '%s' and %lld in data '%s'", i,
                       (long long)ix->shape.dim[i], ir_q(ix->name), (long long)x->shape.dim[i], ir_q(x->name));
    const int64_t *dims = x->shape.dim + b;
    tensor_const_indices(g, &n, ix, dims, *k);
    return nd_index(s, id, n.in[1], dims, *k, b, "positions");
}

/* GatherND: data with its batch dims and the k indexed dims flattened into
 * one, Gathered along it at the tuples' positions (NDIndex): the output
 * [B.., Q.., rest] directly; the gradient is Gather's scatter-add. */
void expand_gather_nd(Sweep *s, int id)
{
    Graph *g = s->g;
    int b = (int)ir_attr_i(&g->node[id], "batch_dims", 0), k;
    int pos = nd_positions(s, id, b, &k);
    Node n = g->node[id];
    const Shape xs = g->val[n.in[0]].shape;
    int64_t d[MAX_RANK] = {1};
    for (int i = 0; i < b + k; i++)
        d[0] *= xs.dim[i];
    for (int i = b + k; i < xs.rank; i++)
        d[i - b - k + 1] = xs.dim[i];
    int c = expand_node(s, id, OP_Gather, expand_reshape(s, id, n.in[0], d, xs.rank - b - k + 1), pos, "gather",
                        n.out[0]);
    ir_attr_add(g, c, "axis", A_INT)->i = 0;
    visit(s, c);
}

/* A scatter-add (GatherGrad along axis 0, or GatherElementsGrad along axis)
 * of u at indices into a new value of dtype dt and shape like; visited, its
 * output. */
static int scatter_add(Sweep *s, int id, Op op, int u, int indices, int axis, DType dt, const Shape *like,
                       const char *suffix)
{
    Graph *g = s->g;
    int y = ir_value(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), dt, like, R_ACT);
    int c = expand_node(s, id, op, u, indices, suffix, y);
    ir_attr_add(g, c, "axis", A_INT)->i = axis;
    visit(s, c);
    return y;
}

enum { TABLE_MAX = 1 << 26 }; /* elements of scatter mul / max / min's candidate table */

/* ScatterND / ScatterElements with reduction mul, max or min: a table of candidates, one row per update
 * over every position it could land on (the reduction's identity, 1 or -inf or +inf, where it does not),
 * reduced over the updates by ReduceProd (ReduceMax, ReduceMin) and combined with the data by Mul (Max,
 * Min).  The gradients follow: ReduceProd's is the product of the others (zeros included), ReduceMax /
 * Min split ties evenly, Max / Min between data and updates in halves.  ScatterND: pos, the tuples'
 * positions (NDIndex, checked); ScatterElements (pos -1): the indices along axis ax, checked and made
 * non-negative by an NDIndex of 1-tuples.  red: 2 mul, 3 max, 4 min (the reduction attribute's order). */
static void scatter_table(Sweep *s, int id, int red, int pos, int ax)
{
    static const char *const name[] = {[2] = "mul", [3] = "max", [4] = "min"};
    static const Op reduce[] = {[2] = OP_ReduceProd, [3] = OP_ReduceMax, [4] = OP_ReduceMin},
                    combine[] = {[2] = OP_Mul, [3] = OP_Max, [4] = OP_Min};
    static const double identity[] = {[2] = 1, [3] = -INFINITY, [4] = INFINITY};
    Graph *g = s->g;
    Node n = g->node[id];
    const Shape xs = g->val[n.in[0]].shape, us = g->val[n.in[2]].shape;
    DType dt = g->val[n.in[0]].dtype;
    int64_t len = pos >= 0 ? 1 : xs.dim[ax], nq = 1, rest = 1;
    if (pos >= 0) {
        const Shape ps = g->val[pos].shape;
        nq = shape_numel(&ps);
        for (int i = 0; i < xs.rank; i++)
            len *= i < xs.rank - (us.rank - ps.rank) ? xs.dim[i] : 1;
        rest = nq ? shape_numel(&us) / nq : 0;
    }
    int64_t table = pos >= 0 ? nq * len * rest : shape_numel(&us) * len;
    if (table > TABLE_MAX)
        node_fatal(g, &n, "reduction '%s' sets every update against every place it may land: %lld elements, fsdpc "
                   "allows 2^26", name[red], (long long)table);
    int u = n.in[2], fill = new_scalar(s, id, dt, identity[red], "identity");
    int64_t *ramp = ir_alloc(sizeof(int64_t) * (size_t)(len + 1));
    for (int64_t i = 0; i < len; i++)
        ramp[i] = i;
    int r;
    if (pos >= 0) { /* [nq, len, rest] over positions of the indexed dims flattened */
        Shape rs = {.rank = 2, .dim = {1, len}};
        int hit = expand(s, id, OP_Equal, expand_reshape(s, id, pos, (int64_t[]){nq, 1}, 2),
                         ir_const(g, ir_fmt("%s/places.%d", n.name, s->nnew++), DT_I64, &rs, ramp), "hit", -1);
        int c = expand3(s, id, OP_Where, expand_reshape(s, id, hit, (int64_t[]){nq, len, 1}, 3),
                        expand_reshape(s, id, u, (int64_t[]){nq, 1, rest}, 3), fill, "candidates", -1);
        r = expand_reshape(s, id, expand_reduce(s, id, reduce[red], c, 0, 0, "reduce", -1), xs.dim, xs.rank);
    } else { /* [updates' shape.., len] over the axis; the positions' dim then moved to the axis */
        int rk = us.rank;
        int64_t one[MAX_RANK + 1];
        for (int i = 0; i <= rk; i++)
            one[i] = i < rk ? us.dim[i] : 1;
        int t = nd_index(s, id, expand_reshape(s, id, n.in[1], one, rk + 1), &len, 1, 0, "checked");
        Shape rs = {.rank = rk + 1};
        for (int i = 0; i < rk; i++)
            rs.dim[i] = 1;
        rs.dim[rk] = len;
        int hit = expand(s, id, OP_Equal, expand_reshape(s, id, t, one, rk + 1),
                         ir_const(g, ir_fmt("%s/places.%d", n.name, s->nnew++), DT_I64, &rs, ramp), "hit", -1);
        int c = expand3(s, id, OP_Where, hit, expand_reshape(s, id, u, one, rk + 1), fill, "candidates", -1);
        int m = expand_reduce(s, id, reduce[red], c, ax, 0, "reduce", -1); /* [us without ax.., len] */
        int64_t perm[MAX_RANK], pads[2 * MAX_RANK] = {0};
        for (int i = 0; i < rk; i++) {
            perm[i] = i < ax ? i : i == ax ? rk - 1 : i - 1;
            pads[rk + i] = i == ax ? 0 : xs.dim[i] - us.dim[i];
        }
        r = expand_perm(s, id, m, perm, rk, "to_axis");
        int p = expand_node(s, id, OP_Pad, r, -1, "pad", -1);
        ir_attr_ints_add(g, p, "pads", pads, 2 * rk);
        ir_attr_add(g, p, "value", A_TENSOR)->t = fill;
        visit(s, p);
        r = g->node[p].out[0];
    }
    expand(s, id, combine[red], n.in[0], r, name[red], n.out[0]);
}

/* ScatterND and ScatterElements, reduction add: data + the scatter-add of
 * updates; none: where some update landed (a scatter-add of ones is
 * positive), the scatter-add of updates, elsewhere data.  ONNX leaves
 * duplicate indices undefined under none; here they sum.  ScatterND
 * scatters rows of data viewed as [indexed dims flattened, rest] at the
 * tuples' positions (NDIndex); ScatterElements uses GatherElements'
 * backward, which checks its indices.  Gradients: data's through Add or
 * Where, updates' a gather of dy (GatherGrad's rule). */
void expand_scatter(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int nd = n.op == OP_ScatterND;
    int red = ir_attr_choice(g, &n, "reduction", "none|add|mul|max|min");
    for (int i = 0; i < 3; i += 2)
        if (!dtype_is_float(g->val[n.in[i]].dtype))
            node_fatal(g, &n, "%s '%s' is %s: fsdpc scatters float32 or float64 only", i ? "updates" : "data",
                       ir_q(g->val[n.in[i]].name), dtype_name(g->val[n.in[i]].dtype));
    if (g->val[n.in[0]].dtype != g->val[n.in[2]].dtype)
        node_fatal(g, &n, "data is %s and updates %s; they must have one dtype", dtype_name(g->val[n.in[0]].dtype),
                   dtype_name(g->val[n.in[2]].dtype));
    int k = 0, ax = 0, pos = n.in[1];
    if (nd)
        pos = nd_positions(s, id, 0, &k);
    n = g->node[id];
    const Value *x = &g->val[n.in[0]], *ix = &g->val[n.in[1]], *u = &g->val[n.in[2]];
    Shape xs = x->shape, want = {0}, flat = {.rank = 1, .dim = {1}}, cnt = {0};
    DType dt = x->dtype;
    if (nd) { /* updates: [Q.., rest]; data as [P, rest]; where an update landed: [P] */
        if (ix->shape.rank - 1 + xs.rank - k > MAX_RANK)
            node_fatal(g, &n, "updates would have rank %d; fsdpc supports rank <= %d", ix->shape.rank - 1 + xs.rank - k,
                       MAX_RANK);
        for (int i = 0; i < ix->shape.rank - 1; i++)
            want.dim[want.rank++] = ix->shape.dim[i];
        for (int i = 0; i < xs.rank; i++) {
            if (i < k)
                flat.dim[0] *= xs.dim[i];
            else
                want.dim[want.rank++] = flat.dim[flat.rank++] = xs.dim[i];
            cnt.dim[cnt.rank++] = i < k ? xs.dim[i] : 1;
        }
    } else {
        ax = tensor_elements_axis(g, &n, x, ix);
        want = ix->shape, flat = cnt = xs;
    }
    if (u->shape.rank != want.rank || memcmp(u->shape.dim, want.dim, sizeof(int64_t) * (size_t)want.rank))
        node_fatal(g, &n, "updates '%s' have shape %s; %s needs %s", ir_q(u->name), shape_str(&u->shape),
                   op_info[n.op].name, shape_str(&want));
    if (red >= 2) {
        scatter_table(s, id, red, nd ? pos : -1, ax);
        return;
    }
    Op op = nd ? OP_GatherGrad : OP_GatherElementsGrad;
    int sc = expand_reshape(s, id, scatter_add(s, id, op, n.in[2], pos, ax, dt, &flat, "scatter"), xs.dim, xs.rank);
    if (red == 1) {
        expand(s, id, OP_Add, n.in[0], sc, "add", n.out[0]);
        return;
    }
    Shape os = nd ? g->val[pos].shape : want; /* ones where the updates are: rows (ND) or elements */
    int e = expand_node(s, id, OP_Expand, new_scalar(s, id, dt, 1, "one"), -1, "ones", -1);
    ir_attr_ints_add(g, e, "shape", os.dim, os.rank);
    visit(s, e);
    Shape ls = nd ? (Shape){.rank = 1, .dim = {flat.dim[0]}} : flat;
    int hits = expand_reshape(s, id, scatter_add(s, id, op, g->node[e].out[0], pos, ax, dt, &ls, "hits"), cnt.dim,
                              cnt.rank);
    int landed = expand(s, id, OP_Greater, hits, new_scalar(s, id, dt, 0, "zero"), "landed", -1);
    expand3(s, id, OP_Where, landed, sc, n.in[0], "where", n.out[0]);
}

/* ---- Resize ------------------------------------------------------------------ */

enum { CT_HALF, CT_HALF_SYM, CT_PYTORCH, CT_ALIGN, CT_ASYM };
enum { NM_ROUND_FLOOR, NM_ROUND_CEIL, NM_FLOOR, NM_CEIL };

/* Output position o of an axis resized from lin to lout by scale sc, in
 * input coordinates.  lres: the resized length align_corners and
 * pytorch_half_pixel read, as ONNX's reference (and its node tests) do: the
 * size given, else sc * lin unrounded. */
static double resize_coord(int ct, int64_t o, int64_t lin, int64_t lout, double sc, double lres)
{
    switch (ct) {
    case CT_HALF_SYM: {
        double adj = (double)lout / (sc * (double)lin), off = (double)lin / 2 * (1 - adj);
        return off + ((double)o + 0.5) / sc - 0.5;
    }
    case CT_PYTORCH: return lres != 1 ? ((double)o + 0.5) / sc - 0.5 : 0;
    case CT_ALIGN: return lres != 1 ? (double)o * (double)(lin - 1) / (lres - 1) : 0;
    case CT_ASYM: return (double)o / sc;
    default: return ((double)o + 0.5) / sc - 0.5;
    }
}

/* Cubic convolution weights of the taps at base - 1 .. base + 2 for t in (0, 1] (coefficient a). */
static void cubic_weights(double t, double a, double *w)
{
    double d[4] = {1 + t, t, 1 - t, 2 - t};
    for (int j = 0; j < 4; j++)
        w[j] = d[j] <= 1 ? ((a + 2) * d[j] - (a + 3)) * d[j] * d[j] + 1
                         : ((a * d[j] - 5 * a) * d[j] + 8 * a) * d[j] - 4 * a;
}

/* Resize as separable per-axis gathers, ONNX's reference arithmetic: each
 * output position o of a resized axis maps to x in input coordinates
 * (coordinate_transformation_mode); nearest takes one tap (nearest_mode),
 * linear two (ceil(x) - 1 and ceil(x), weights 1 - t and t, t in (0, 1]),
 * cubic four (cubic_coeff_a; exclude_outside renormalizes); taps outside the
 * axis take its edge.  Each tap is a Gather of constant indices times its
 * constant weights; the gradient follows from Gather's (a scatter-add). */
void expand_resize(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *x = &g->val[n.in[0]];
    DType t = x->dtype;
    Shape xs = x->shape;
    int r = xs.rank;
    if (!strcmp(ir_attr_s(&n, "coordinate_transformation_mode", ""), "tf_crop_and_resize"))
        node_fatal(g, &n, "%s", "coordinate_transformation_mode 'tf_crop_and_resize' is not supported");
    int mode = ir_attr_choice(g, &n, "mode", "nearest|linear|cubic");
    int ct = ir_attr_choice(g, &n, "coordinate_transformation_mode",
                            "half_pixel|half_pixel_symmetric|pytorch_half_pixel|align_corners|asymmetric");
    int nm = ir_attr_choice(g, &n, "nearest_mode", "round_prefer_floor|round_prefer_ceil|floor|ceil");
    int keep = ir_attr_choice(g, &n, "keep_aspect_ratio_policy", "stretch|not_larger|not_smaller");
    int excl = ir_attr_i(&n, "exclude_outside", 0) != 0;
    double ca = ir_attr_f(&n, "cubic_coeff_a", -0.75);
    if (mode && !dtype_is_float(t))
        node_fatal(g, &n, "%s resize of %s is not supported (float32 or float64 only)", mode == 1 ? "linear" : "cubic",
                   dtype_name(t));
    /* the axes resized, and for each the scale or the size */
    int na, ax[MAX_RANK];
    const int64_t *axl = ir_attr_ints(&n, "axes", &na);
    if (!axl)
        na = r;
    if (na > r)
        node_fatal(g, &n, "axes lists %d axes; X has rank %d", na, r);
    char seen[MAX_RANK] = {0};
    for (int i = 0; i < na; i++) {
        ax[i] = axl ? tensor_axis(g, &n, axl[i], r, "axes entry") : i;
        if (seen[ax[i]]++)
            node_fatal(g, &n, "axes lists axis %d twice", ax[i]);
    }
    const Value *sv[2] = {NULL, NULL}; /* scales, sizes: present and not empty */
    for (int k = 0; k < 2; k++)
        if (n.nin > 2 + k && n.in[2 + k] >= 0 && shape_numel(&g->val[n.in[2 + k]].shape) > 0) {
            sv[k] = fold_const_in(g, &n, 2 + k, k ? "sizes" : "scales");
            if (shape_numel(&sv[k]->shape) != na)
                node_fatal(g, &n, "%s '%s' has %lld entries; it needs one per resized axis (%d)", k ? "sizes" : "scales",
                           ir_q(sv[k]->name), (long long)shape_numel(&sv[k]->shape), na);
        }
    if (!sv[0] == !sv[1])
        node_fatal(g, &n, "%s", sv[0] ? "has both scales and sizes; give one" : "needs scales or sizes");
    if (sv[0] && !dtype_is_float(sv[0]->dtype))
        node_fatal(g, &n, "scales '%s' must be float, not %s", ir_q(sv[0]->name), dtype_name(sv[0]->dtype));
    if (sv[1] && sv[1]->dtype != DT_I64)
        node_fatal(g, &n, "sizes '%s' must be int64, not %s", ir_q(sv[1]->name), dtype_name(sv[1]->dtype));
    double sc[MAX_RANK], kept = keep == 1 ? INFINITY : 0;
    int64_t lout[MAX_RANK];
    for (int i = 0; i < na; i++) {
        int64_t lin = xs.dim[ax[i]];
        if (lin < 1)
            node_fatal(g, &n, "resizes dim %d of size %lld; it must be at least 1", ax[i], (long long)lin);
        double v = sv[0] ? tensor_const_f(sv[0], i) : (double)tensor_const_i(sv[1], i);
        if (!(v > 0) || !((sv[0] ? v * (double)lin : v) <= (double)(1 << 20)))
            node_fatal(g, &n, "%s entry %d is %g for dim %d of size %lld; fsdpc takes outputs of 1 to 2^20 per axis",
                       sv[0] ? "scales" : "sizes", i, v, ax[i], (long long)lin);
        sc[i] = sv[0] ? v : v / (double)lin;
        lout[i] = sv[0] ? (int64_t)floor(v * (double)lin) : (int64_t)v;
        kept = keep == 1 ? fmin(kept, sc[i]) : fmax(kept, sc[i]);
    }
    if (sv[1] && keep) /* one scale for every axis, the sizes rounded from it */
        for (int i = 0; i < na; i++) {
            sc[i] = kept;
            lout[i] = (int64_t)floor(kept * (double)xs.dim[ax[i]] + 0.5);
        }
    int64_t total = 0; /* the taps' tables: one entry per output position of each resized axis */
    for (int i = 0; i < na; i++)
        total += lout[i];
    if (total > (1 << 21))
        node_fatal(g, &n, "resizes its axes to %lld output positions in all; fsdpc takes up to 2^21", (long long)total);
    for (int i = 0; i < na; i++)
        if (lout[i] < 1 || lout[i] > (1 << 20))
            node_fatal(g, &n, "resizes dim %d of size %lld to %lld; fsdpc takes outputs of 1 to 2^20 per axis", ax[i],
                       (long long)xs.dim[ax[i]], (long long)lout[i]);
        else if (ir_attr_i(&n, "antialias", 0) && mode && sc[i] < 1)
            node_fatal(g, &n, "%s", "antialias when downscaling is not supported");
        else
            total += lout[i];
    if (total > (1 << 21))
        node_fatal(g, &n, "resizes its axes to %lld output positions in all; fsdpc takes up to 2^21", (long long)total);
    /* the taps of each axis; an axis whose every output is its own input position is left alone */
    int ntap = mode == 0 ? 1 : mode == 1 ? 2 : 4, last = -1, cur = n.in[0];
    int64_t *idx[MAX_RANK][4];
    double *wt[MAX_RANK][4];
    for (int i = 0; i < na; i++) {
        int64_t lin = xs.dim[ax[i]], L = lout[i];
        int ident = L == lin;
        for (int j = 0; j < ntap; j++) {
            idx[i][j] = ir_alloc(sizeof(int64_t) * (size_t)L);
            wt[i][j] = ir_alloc(sizeof(double) * (size_t)L);
        }
        for (int64_t o = 0; o < L; o++) {
            double c = resize_coord(ct, o, lin, L, sc[i], sv[1] && !keep ? (double)L : sc[i] * (double)lin);
            double w[4] = {1, 0, 0, 0};
            ident &= c == (double)o;
            double base = ceil(c) - 1, tt = c - base; /* tt in (0, 1] */
            int64_t b;
            if (mode == 0) {
                double fr = c - floor(c);
                b = nm == NM_FLOOR ? (int64_t)floor(c) : nm == NM_CEIL ? (int64_t)ceil(c)
                    : fr == 0.5 ? (int64_t)(nm == NM_ROUND_FLOOR ? floor(c) : ceil(c)) : (int64_t)floor(c + 0.5);
            } else if (mode == 1) {
                b = (int64_t)base;
                w[0] = 1 - tt, w[1] = tt;
            } else {
                b = (int64_t)base - 1;
                cubic_weights(tt, ca, w);
                if (excl) {
                    double sum = 0;
                    for (int j = 0; j < 4; j++)
                        sum += (w[j] *= b + j >= 0 && b + j < lin);
                    for (int j = 0; j < 4 && sum != 0; j++)
                        w[j] /= sum;
                }
            }
            for (int j = 0; j < ntap; j++) {
                int64_t p = b + j;
                idx[i][j][o] = p < 0 ? 0 : p >= lin ? lin - 1 : p;
                wt[i][j][o] = w[j];
            }
        }
        if (ident)
            lout[i] = -1; /* skipped */
        else
            last = i;
    }
    if (last < 0) {
        expand(s, id, OP_Identity, cur, -1, "identity", n.out[0]);
        return;
    }
    for (int i = 0; i <= last; i++) {
        if (lout[i] < 0)
            continue;
        int64_t L = lout[i];
        Shape is = {.rank = 1}, ws = {.rank = r - ax[i]};
        is.dim[0] = ws.dim[0] = L;
        for (int d = 1; d < ws.rank; d++)
            ws.dim[d] = 1;
        int sum = -1;
        for (int j = 0; j < ntap; j++) {
            int fin = i == last && j == ntap - 1, iv = ir_const(g, ir_fmt("%s/index%d.%d", n.name, ax[i], s->nnew++), DT_I64, &is, idx[i][j]);
            int gn = expand_node(s, id, OP_Gather, cur, iv, ir_fmt("gather%d_%d", ax[i], j), fin && !mode ? n.out[0] : -1);
            ir_attr_add(g, gn, "axis", A_INT)->i = ax[i];
            visit(s, gn);
            int tap = g->node[gn].out[0];
            if (mode) {
                void *wd = ir_alloc(dtype_size(t) * (size_t)L);
                for (int64_t o = 0; o < L; o++)
                    dtype_set_f(wd, o, t, wt[i][j][o]);
                int wv = ir_const(g, ir_fmt("%s/weight%d.%d", n.name, ax[i], s->nnew++), t, &ws, wd);
                tap = expand(s, id, OP_Mul, tap, wv, ir_fmt("weigh%d_%d", ax[i], j), -1);
                tap = sum < 0 ? tap : expand(s, id, OP_Add, sum, tap, ir_fmt("sum%d_%d", ax[i], j), fin ? n.out[0] : -1);
            }
            sum = tap;
        }
        cur = sum;
    }
}

/* ---- Einsum ------------------------------------------------------------------ */

/* An operand of an Einsum: value v and the label of each of its n dims
 * (letters as themselves; the dims an ellipsis covers EIN_ELL + k, k counted
 * from the right, so ellipses broadcast right-aligned). */
typedef struct {
    int v, n, lab[MAX_RANK];
} ETerm;

#define EIN_ELL 200
#define EIN_NLAB (EIN_ELL + MAX_RANK)

static int ein_has(const ETerm *t, int l)
{
    for (int i = 0; i < t->n; i++)
        if (t->lab[i] == l)
            return 1;
    return 0;
}


/* t's dims put in the order of labels want (a permutation of t's) */
static void ein_transpose(Sweep *s, int id, ETerm *t, const int *want)
{
    int64_t perm[MAX_RANK];
    int same = 1;
    for (int i = 0; i < t->n; i++) {
        for (int j = 0; j < t->n; j++)
            if (t->lab[j] == want[i])
                perm[i] = j;
        same &= perm[i] == i;
    }
    if (same)
        return;
    t->v = expand_perm(s, id, t->v, perm, t->n, "transpose");
    memcpy(t->lab, want, sizeof(int) * (size_t)t->n);
}

/* t summed over its labels that keep does not hold */
static void ein_reduce(Sweep *s, int id, ETerm *t, const char *keep)
{
    int64_t ax[MAX_RANK];
    int na = 0, nl = 0;
    for (int i = 0; i < t->n; i++)
        if (keep[t->lab[i]])
            t->lab[nl++] = t->lab[i];
        else
            ax[na++] = i;
    if (!na)
        return;
    int c = expand_node(s, id, OP_ReduceSum, t->v, -1, "sum", -1);
    ir_attr_ints_add(s->g, c, "axes", ax, na);
    ir_attr_add(s->g, c, "keepdims", A_INT)->i = 0;
    visit(s, c);
    t->v = s->g->node[c].out[0];
    t->n = nl;
}

/* t expanded so that each of its labels has dim ldim[label] (a 1 broadcast) */
static void ein_expand(Sweep *s, int id, ETerm *t, const int64_t *ldim)
{
    const Shape *xs = &s->g->val[t->v].shape;
    int64_t want[MAX_RANK];
    int same = 1;
    for (int i = 0; i < t->n; i++) {
        want[i] = ldim[t->lab[i]];
        same &= xs->dim[i] == want[i];
    }
    if (same)
        return;
    int c = expand_node(s, id, OP_Expand, t->v, -1, "expand", -1);
    ir_attr_ints_add(s->g, c, "shape", want, t->n);
    visit(s, c);
    t->v = s->g->node[c].out[0];
}

/* a times b summed over their shared labels that keep does not hold: a Mul
 * (broadcasting) when there are none, else a MatMul of [batch, a's own,
 * summed] by [batch, summed, b's own]; the result's labels batch, a's own,
 * b's own */
static ETerm ein_pair(Sweep *s, int id, ETerm a, ETerm b, const char *keep, const int64_t *ldim)
{
    Graph *g = s->g;
    const Node *n = &g->node[id];
    int bat[MAX_RANK], ao[MAX_RANK], bo[MAX_RANK], con[MAX_RANK], nb = 0, na = 0, nbo = 0, nc = 0;
    for (int i = 0; i < a.n; i++)
        if (!ein_has(&b, a.lab[i]))
            ao[na++] = a.lab[i];
        else if (keep[a.lab[i]])
            bat[nb++] = a.lab[i];
        else
            con[nc++] = a.lab[i];
    for (int i = 0; i < b.n; i++)
        if (!ein_has(&a, b.lab[i]))
            bo[nbo++] = b.lab[i];
    if (nb + na + nbo > MAX_RANK)
        node_fatal(g, n, "a product of rank %d; fsdpc's tensors have rank up to %d", nb + na + nbo, MAX_RANK);
    ETerm r = {.n = nb + na + nbo};
    memcpy(r.lab, bat, sizeof(int) * (size_t)nb);
    memcpy(r.lab + nb, ao, sizeof(int) * (size_t)na);
    memcpy(r.lab + nb + na, bo, sizeof(int) * (size_t)nbo);
    int64_t da[MAX_RANK], db[MAX_RANK], dr[MAX_RANK];
    for (int i = 0; i < r.n; i++)
        dr[i] = ldim[r.lab[i]];
    if (!nc) { /* a as [batch, a's own, 1...], b as [batch, 1..., b's own] */
        int wa[MAX_RANK], wb[MAX_RANK];
        memcpy(wa, bat, sizeof(int) * (size_t)nb);
        memcpy(wa + nb, ao, sizeof(int) * (size_t)na);
        memcpy(wb, bat, sizeof(int) * (size_t)nb);
        memcpy(wb + nb, bo, sizeof(int) * (size_t)nbo);
        ein_transpose(s, id, &a, wa);
        ein_transpose(s, id, &b, wb);
        const Shape *sa = &g->val[a.v].shape, *sb = &g->val[b.v].shape;
        for (int i = 0; i < r.n; i++) {
            da[i] = i < nb + na ? sa->dim[i] : 1;
            db[i] = i < nb ? sb->dim[i] : i < nb + na ? 1 : sb->dim[i - na];
        }
        r.v = expand(s, id, OP_Mul, expand_reshape(s, id, a.v, da, r.n), expand_reshape(s, id, b.v, db, r.n), "mul",
                     -1);
        return r;
    }
    ein_expand(s, id, &a, ldim);
    ein_expand(s, id, &b, ldim);
    int wa[MAX_RANK], wb[MAX_RANK];
    int64_t bt = 1, m = 1, k = 1, nn = 1;
    for (int i = 0; i < nb; i++)
        bt *= ldim[bat[i]];
    for (int i = 0; i < na; i++)
        m *= ldim[ao[i]];
    for (int i = 0; i < nc; i++)
        k *= ldim[con[i]];
    for (int i = 0; i < nbo; i++)
        nn *= ldim[bo[i]];
    memcpy(wa, bat, sizeof(int) * (size_t)nb);
    memcpy(wa + nb, ao, sizeof(int) * (size_t)na);
    memcpy(wa + nb + na, con, sizeof(int) * (size_t)nc);
    memcpy(wb, bat, sizeof(int) * (size_t)nb);
    memcpy(wb + nb, con, sizeof(int) * (size_t)nc);
    memcpy(wb + nb + nc, bo, sizeof(int) * (size_t)nbo);
    ein_transpose(s, id, &a, wa);
    ein_transpose(s, id, &b, wb);
    int64_t ma[3] = {bt, m, k}, mb[3] = {bt, k, nn};
    int lo = nb ? 0 : 1; /* no batch: plain matrices */
    int p = expand(s, id, OP_MatMul, expand_reshape(s, id, a.v, ma + lo, 3 - lo),
                   expand_reshape(s, id, b.v, mb + lo, 3 - lo), "matmul", -1);
    r.v = expand_reshape(s, id, p, dr, r.n);
    return r;
}

/* Einsum of float operands as ReduceSum, Transpose, Reshape, Expand, Mul and
 * MatMul: each operand first sums the labels no other operand nor the
 * output has, then the operands are multiplied left to right (ein_pair),
 * summing each label once no later operand nor the output needs it, and
 * the result is transposed to the output's order.  Explicit (->) and
 * implicit output, ellipses broadcasting right-aligned, spaces ignored; a
 * label repeated within one operand (a diagonal) is refused. */
void expand_einsum(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const char *eq = ir_attr_s(&n, "equation", NULL);
    if (!eq)
        node_fatal(g, &n, "%s", "needs its equation attribute");
    size_t len = strlen(eq);
    if (len > 256)
        node_fatal(g, &n, "%s", "equation longer than 256 characters");
    char *e = ir_alloc(len + 1), *q = e;
    for (const char *c = eq; *c; c++)
        if (*c != ' ')
            *q++ = *c;
    *q = 0;
    ETerm t[MAX_RANK];
    int64_t ldim[EIN_NLAB];
    int count[EIN_NLAB] = {0}, ell_max = 0, nt = 0;
    for (int i = 0; i < EIN_NLAB; i++)
        ldim[i] = -1;
    const char *p = e;
    for (;;) {
        if (nt >= n.nin || n.in[nt] < 0)
            node_fatal(g, &n, "equation '%s' names more operands than the node's %d inputs", ir_q(eq), n.nin);
        if (nt >= MAX_RANK)
            node_fatal(g, &n, "equation '%s': fsdpc takes up to %d operands", ir_q(eq), MAX_RANK);
        const Value *x = &g->val[n.in[nt]];
        if (!dtype_is_float(x->dtype))
            node_fatal(g, &n, "input %d is %s: not supported (float32 or float64 only)", nt, dtype_name(x->dtype));
        int r = x->shape.rank, labs[MAX_RANK], nl = 0, ell = -1;
        while (*p && *p != ',' && *p != '-') {
            if (!strncmp(p, "...", 3) && ell < 0) {
                ell = nl;
                p += 3;
                continue;
            }
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) || nl >= MAX_RANK)
                node_fatal(g, &n, "equation '%s': operand %d's subscripts must be up to %d letters and one '...'",
                           ir_q(eq), nt, MAX_RANK);
            labs[nl++] = *p++;
        }
        int ne = ell >= 0 ? r - nl : 0;
        if (ne < 0 || (ell < 0 && nl != r))
            node_fatal(g, &n, "equation '%s': operand %d has rank %d, its subscripts name %d dims%s", ir_q(eq), nt, r,
                       nl, ell >= 0 ? " and an ellipsis" : "");
        ETerm *tt = &t[nt];
        tt->v = n.in[nt];
        tt->n = 0;
        for (int j = 0; j <= nl; j++) {
            if (j == ell)
                for (int k = 0; k < ne; k++)
                    tt->lab[tt->n++] = EIN_ELL + ne - 1 - k;
            if (j < nl)
                tt->lab[tt->n++] = labs[j];
        }
        ell_max = ne > ell_max ? ne : ell_max;
        for (int d = 0; d < r; d++) {
            int l = tt->lab[d];
            int64_t dim = x->shape.dim[d];
            for (int j = 0; j < d; j++)
                if (tt->lab[j] == l)
                    node_fatal(g, &n, "equation '%s': operand %d repeats subscript '%c' (a diagonal): not supported",
                               ir_q(eq), nt, l);
            if (ldim[l] < 0 || ldim[l] == 1)
                ldim[l] = dim;
            else if (dim != 1 && dim != ldim[l])
                node_fatal(g, &n, "equation '%s': %s%c has dims %lld and %lld", ir_q(eq), l >= EIN_ELL ? "an ellipsis dim" : "subscript ",
                           l >= EIN_ELL ? ' ' : l, (long long)ldim[l], (long long)dim);
            count[l]++;
        }
        nt++;
        if (*p != ',')
            break;
        p++;
    }
    if (nt != n.nin)
        node_fatal(g, &n, "equation '%s' names %d operands; the node has %d inputs", ir_q(eq), nt, n.nin);
    int out[MAX_RANK], no = 0;
    char keep[EIN_NLAB];
    memset(keep, 0, sizeof keep);
    if (*p == '-') {
        if (p[1] != '>')
            node_fatal(g, &n, "equation '%s': '-' must begin '->'", ir_q(eq));
        int ell = 0;
        for (p += 2; *p; ) {
            if (!strncmp(p, "...", 3) && !ell) {
                ell = 1;
                p += 3;
                for (int k = ell_max - 1; k >= 0 && no < MAX_RANK; k--)
                    out[no++] = EIN_ELL + k;
                continue;
            }
            int l = *p++;
            if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')) || !count[l] || keep[l] || no >= MAX_RANK)
                node_fatal(g, &n, "equation '%s': the output's subscripts must be up to %d distinct letters of the "
                           "inputs and one '...'", ir_q(eq), MAX_RANK);
            keep[l] = 1;
            out[no++] = l;
        }
    } else { /* implicit: the ellipsis, then the letters that occur once, in order */
        for (int k = ell_max - 1; k >= 0; k--)
            out[no++] = EIN_ELL + k;
        for (int l = 'A'; l <= 'z'; l++)
            if (count[l] == 1 && no < MAX_RANK)
                out[no++] = l;
    }
    for (int i = 0; i < nt; i++) { /* sum what only this operand has */
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < no; j++)
            keep[out[j]] = 1;
        for (int j = 0; j < nt; j++)
            for (int d = 0; j != i && d < t[j].n; d++)
                keep[t[j].lab[d]] = 1;
        ein_reduce(s, id, &t[i], keep);
    }
    ETerm acc = t[0];
    for (int i = 1; i < nt; i++) {
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < no; j++)
            keep[out[j]] = 1;
        for (int j = i + 1; j < nt; j++)
            for (int d = 0; d < t[j].n; d++)
                keep[t[j].lab[d]] = 1;
        acc = ein_pair(s, id, acc, t[i], keep, ldim);
    }
    if (acc.n != no)
        node_fatal(g, &n, "equation '%s': the output's subscripts are not those the inputs leave", ir_q(eq));
    ein_transpose(s, id, &acc, out);
    expand(s, id, OP_Identity, acc.v, -1, "out", n.out[0]);
}

/* ---- Attention (opsets 23-25) ------------------------------------------------ */

/* x [B, S, H * Dh] as [B, H, S, Dh] */
static int attn_heads(Sweep *s, int id, int x, int64_t h)
{
    Shape xs = s->g->val[x].shape;
    int64_t d[4] = {xs.dim[0], xs.dim[1], h, xs.dim[2] / h};
    static const int64_t perm[4] = {0, 2, 1, 3};
    return expand_perm(s, id, expand_reshape(s, id, x, d, 4), perm, 4, "heads");
}

/* x [B, Hkv, S, D] with each head repeated reps times in place: [B, Hkv * reps, S, D] */
static int attn_repeat(Sweep *s, int id, int x, int64_t reps)
{
    Shape xs = s->g->val[x].shape;
    int64_t d5[5] = {xs.dim[0], xs.dim[1], 1, xs.dim[2], xs.dim[3]};
    int64_t e5[5] = {xs.dim[0], xs.dim[1], reps, xs.dim[2], xs.dim[3]};
    int64_t d4[4] = {xs.dim[0], xs.dim[1] * reps, xs.dim[2], xs.dim[3]};
    int c = expand_node(s, id, OP_Expand, expand_reshape(s, id, x, d5, 5), -1, "repeat", -1);
    ir_attr_ints_add(s->g, c, "shape", e5, 5);
    visit(s, c);
    return expand_reshape(s, id, s->g->node[c].out[0], d4, 4);
}

/* 0 where bool ok holds, -inf elsewhere, of dtype t; its output */
static int attn_allow(Sweep *s, int id, DType t, int ok)
{
    return expand3(s, id, OP_Where, ok, new_scalar(s, id, t, 0, "zero"), new_scalar(s, id, t, -INFINITY, "ninf"),
                   "allowed", -1);
}

/* nonpad_kv_seqlen's bias (opset 24: an external cache of len[b] valid keys
 * per batch), built at run time from the int64 lengths: 0 where key j is
 * allowed, -inf elsewhere, [B, 1, sq, skv].  Key j is a key (j < len[b]) and,
 * with the query block at the end of the valid keys (offset len[b] - sq,
 * d = i + offset - j), causal keeps d >= 0 and the windows d <= left,
 * -d <= right.  Its output. */
static int attn_nonpad(Sweep *s, int id, int len, DType t, int64_t b, int64_t sq, int64_t skv, int causal,
                       int64_t lw, int64_t rw)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    Shape ls = g->val[len].shape;
    if (ls.rank != 1 || ls.dim[0] != b || (g->val[len].dtype != DT_I64 && g->val[len].dtype != DT_I32))
        node_fatal(g, n, "nonpad_kv_seqlen must be int64 or int32 of shape [%lld] (the batch), not %s %s",
                   (long long)b, dtype_name(g->val[len].dtype), shape_str(&ls));
    if (sq * skv > ((int64_t)1 << 24))
        node_fatal(g, n, "a %lld x %lld nonpad_kv_seqlen mask is beyond 2^24 elements per batch", (long long)sq,
                   (long long)skv);
    if (g->val[len].dtype != DT_I64)
        len = fold_cast(s, id, len, DT_I64, "nonpad_i64", -1);
    int lb = expand_reshape(s, id, len, (int64_t[4]){b, 1, 1, 1}, 4);
    int64_t *j = ir_alloc(sizeof(int64_t) * (size_t)skv);
    for (int64_t k = 0; k < skv; k++)
        j[k] = k;
    Shape js = {.rank = 1, .dim = {skv}};
    int keys = ir_const(g, ir_fmt("%s/key_index.%d", g->node[id].name, s->nnew++), DT_I64, &js, j);
    int bias = attn_allow(s, id, t, expand(s, id, OP_Less, keys, lb, "is_key", -1));
    if (causal || lw >= 0 || rw >= 0) {
        int64_t *ij = ir_alloc(sizeof(int64_t) * (size_t)(sq * skv)); /* i - sq - j: d without len[b] */
        for (int64_t i = 0; i < sq; i++)
            for (int64_t k = 0; k < skv; k++)
                ij[i * skv + k] = i - sq - k;
        Shape ds = {.rank = 2, .dim = {sq, skv}};
        int d = expand(s, id, OP_Add, ir_const(g, ir_fmt("%s/diag.%d", g->node[id].name, s->nnew++), DT_I64, &ds, ij),
                       lb, "offset_diag", -1);
        struct { int on; Op op; double at; } cond[3] = {
            {causal, OP_GreaterOrEqual, 0}, {lw >= 0, OP_LessOrEqual, (double)lw}, {rw >= 0, OP_GreaterOrEqual, -(double)rw}};
        for (int c = 0; c < 3; c++)
            if (cond[c].on) {
                int at = new_scalar(s, id, DT_I64, cond[c].at, "frontier");
                int ok = attn_allow(s, id, t, expand(s, id, cond[c].op, d, at, "frontier_ok", -1));
                bias = expand(s, id, OP_Add, bias, ok, "nonpad_bias", -1);
            }
    }
    return bias;
}

/* Attention as the ops of its definition: 3-D Q, K, V split into heads;
 * past_key / past_value concatenated before K, V (present_key /
 * present_value); grouped heads of K, V repeated; scores Q * scale x K^T,
 * softcap; the bias: attn_mask (bool: 0 / -inf; float; a shorter last axis
 * padded with -inf) plus is_causal's j <= i + past and opset 25's windows,
 * computed at compile time; Softmax over the keys, a row whose bias is all
 * -inf giving zeros (its scores replaced before the Softmax, so no NaN
 * reaches the gradient); times V, merged back to 3-D.  qk_matmul_output
 * takes the scores of its mode.  nonpad_kv_seqlen (not with a past) masks
 * each batch's keys beyond its length and moves causal and window frontiers
 * to its end (attn_nonpad). */
void expand_attention(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    int in[7];
    for (int i = 0; i < 7; i++)
        in[i] = i < n.nin ? n.in[i] : -1;
    DType t = g->val[in[0]].dtype;
    int r = g->val[in[0]].shape.rank;
    for (int i = 0; i < 3; i++)
        if (g->val[in[i]].dtype != t || !dtype_is_float(t) || g->val[in[i]].shape.rank != r || (r != 3 && r != 4))
            node_fatal(g, &n, "Q, K and V must be float32 or float64 of one dtype and all of rank 3 or 4 (%c is %s, "
                       "rank %d)", "QKV"[i], dtype_name(g->val[in[i]].dtype), g->val[in[i]].shape.rank);
    if (in[6] >= 0 && in[4] >= 0)
        node_fatal(g, &n, "%s", "nonpad_kv_seqlen cannot be combined with past_key and past_value (ONNX forbids it)");
    if ((in[4] >= 0) != (in[5] >= 0))
        node_fatal(g, &n, "%s", "past_key and past_value go together");
    int64_t mode = ir_attr_i(&n, "qk_matmul_output_mode", 0), sp = ir_attr_i(&n, "softmax_precision", 0);
    if (mode < 0 || mode > 3)
        node_fatal(g, &n, "qk_matmul_output_mode %lld is not one of 0-3", (long long)mode);
    if (sp && sp != tensor_to_onnx(DT_F32) && sp != tensor_to_onnx(DT_F64))
        node_fatal(g, &n, "softmax_precision %lld is not supported (1: float, 11: double)", (long long)sp);
    int Q = in[0], K = in[1], V = in[2];
    if (r == 3) {
        int64_t hq = ir_attr_i(&n, "q_num_heads", 0), hkv = ir_attr_i(&n, "kv_num_heads", 0);
        if (hq < 1 || hkv < 1 || g->val[Q].shape.dim[2] % hq || g->val[K].shape.dim[2] % hkv ||
            g->val[V].shape.dim[2] % hkv)
            node_fatal(g, &n, "3-D Q, K and V need q_num_heads and kv_num_heads that divide their last dims "
                       "(%lld, %lld, %lld)", (long long)g->val[Q].shape.dim[2], (long long)g->val[K].shape.dim[2],
                       (long long)g->val[V].shape.dim[2]);
        Q = attn_heads(s, id, Q, hq);
        K = attn_heads(s, id, K, hkv);
        V = attn_heads(s, id, V, hkv);
    }
    int64_t past = 0;
    if (in[4] >= 0) {
        past = g->val[in[4]].shape.rank == 4 ? g->val[in[4]].shape.dim[2] : 0;
        for (int j = 0; j < 2; j++) {
            int c = expand_node(s, id, OP_Concat, in[4 + j], j ? V : K, j ? "present_value" : "present_key", -1);
            ir_attr_add(g, c, "axis", A_INT)->i = 2;
            visit(s, c);
            *(j ? &V : &K) = g->node[c].out[0];
        }
    }
    Shape qs = g->val[Q].shape, ks = g->val[K].shape, vs = g->val[V].shape;
    if (ks.dim[0] != qs.dim[0] || vs.dim[0] != qs.dim[0] || ks.dim[3] != qs.dim[3] || vs.dim[1] != ks.dim[1] ||
        vs.dim[2] != ks.dim[2] || ks.dim[1] < 1 || qs.dim[1] % ks.dim[1])
        node_fatal(g, &n, "Q %s, K %s and V %s (as batch, heads, sequence, head size) do not fit", shape_str(&qs),
                   shape_str(&ks), shape_str(&vs));
    for (int j = 1; j < 3; j++) /* present_key, present_value */
        if (n.nout > j && n.out[j] >= 0 && ir_is_read(g, n.out[j]))
            expand(s, id, OP_Identity, j == 1 ? K : V, -1, j == 1 ? "present_key_out" : "present_value_out", n.out[j]);
    int64_t sq = qs.dim[2], skv = ks.dim[2];
    if (qs.dim[1] != ks.dim[1]) {
        K = attn_repeat(s, id, K, qs.dim[1] / ks.dim[1]);
        V = attn_repeat(s, id, V, qs.dim[1] / ks.dim[1]);
    }
    double scale = ir_attr_f(&n, "scale", 1 / sqrt((double)qs.dim[3]));
    if (scale != 1)
        Q = expand(s, id, OP_Mul, Q, new_scalar(s, id, t, scale, "scale"), "scaled_q", -1);
    int mm = expand_node(s, id, OP_MatMul, Q, K, "scores", -1);
    ir_attr_add(g, mm, "transB", A_INT)->i = 1;
    visit(s, mm);
    int sc = g->node[mm].out[0], raw = sc;
    double cap = ir_attr_f(&n, "softcap", 0);
    if (cap > 0)
        sc = expand(s, id, OP_Mul, expand(s, id, OP_Tanh, expand(s, id, OP_Mul, sc, new_scalar(s, id, t, 1 / cap, "cap"),
                    "capped_in", -1), -1, "tanh", -1), new_scalar(s, id, t, cap, "cap"), "capped", -1);
    int capped = sc;
    /* the bias known at compile time: causal and windows; with
     * nonpad_kv_seqlen, a run-time one (attn_nonpad) */
    int causal = ir_attr_i(&n, "is_causal", 0) != 0, full = 0, bias = -1;
    int64_t lw = ir_attr_i(&n, "left_window_size", -1), rw = ir_attr_i(&n, "right_window_size", -1);
    if (in[6] >= 0) {
        bias = attn_nonpad(s, id, in[6], t, qs.dim[0], sq, skv, causal, lw, rw);
        full = 1; /* a short sequence masks whole rows */
    } else if (causal || lw >= 0 || rw >= 0) {
        if (sq * skv > ((int64_t)1 << 24)) /* the bias is a constant of the executable */
            node_fatal(g, &n, "a %lld x %lld causal or window mask is beyond 2^24 elements (fsdpc builds it as a "
                       "constant): give the mask as attn_mask instead", (long long)sq, (long long)skv);
        void *m = ir_alloc(dtype_size(t) * (size_t)(sq * skv));
        for (int64_t i = 0; i < sq; i++) {
            int any = 0;
            for (int64_t j = 0; j < skv; j++) {
                int64_t dij = i + past - j;
                int ok = (!causal || dij >= 0) && (lw < 0 || dij <= lw) && (rw < 0 || -dij <= rw);
                any |= ok;
                dtype_set_f(m, i * skv + j, t, ok ? 0.0 : -INFINITY);
            }
            full |= !any;
        }
        Shape bs = {.rank = 2, .dim = {sq, skv}};
        bias = ir_const(g, ir_fmt("%s/causal.%d", n.name, s->nnew++), t, &bs, m);
    }
    if (in[3] >= 0) {
        int mv = in[3];
        Shape ms = g->val[mv].shape;
        DType mt = g->val[mv].dtype;
        if (mt == DT_BOOL)
            mv = expand3(s, id, OP_Where, mv, new_scalar(s, id, t, 0, "zero"), new_scalar(s, id, t, -INFINITY, "ninf"),
                         "mask_bias", -1);
        else if (mt != t)
            node_fatal(g, &n, "attn_mask is %s; it must be bool or Q's dtype %s", dtype_name(mt), dtype_name(t));
        if (ms.rank < 1 || ms.dim[ms.rank - 1] > skv)
            node_fatal(g, &n, "attn_mask %s: its last dim must be at most the %lld keys", shape_str(&ms), (long long)skv);
        if (ms.dim[ms.rank - 1] < skv) { /* the missing keys are masked */
            int c = expand_node(s, id, OP_Pad, mv, -1, "mask_pad", -1);
            int64_t pads[2 * MAX_RANK] = {0};
            pads[2 * ms.rank - 1] = skv - ms.dim[ms.rank - 1];
            ir_attr_ints_add(g, c, "pads", pads, 2 * ms.rank);
            ir_attr_add(g, c, "value", A_TENSOR)->t = new_scalar(s, id, t, -INFINITY, "ninf");
            visit(s, c);
            mv = g->node[c].out[0];
        }
        bias = bias < 0 ? mv : expand(s, id, OP_Add, mv, bias, "bias", -1);
        full = 1; /* a run-time mask may mask whole rows */
    }
    if (bias >= 0)
        sc = expand(s, id, OP_Add, sc, bias, "biased", -1);
    int biased = sc, whole = -1;
    if (full) {
        int brank = g->val[bias].shape.rank;
        int bm = expand_reduce(s, id, OP_ReduceMax, bias, brank - 1, 1, "bias_max", -1);
        whole = expand(s, id, OP_Equal, bm, new_scalar(s, id, t, -INFINITY, "ninf"), "masked_row", -1);
        sc = expand3(s, id, OP_Where, whole, new_scalar(s, id, t, 0, "zero"), sc, "safe_scores", -1);
    }
    DType st = sp == tensor_to_onnx(DT_F64) ? DT_F64 : sp == tensor_to_onnx(DT_F32) ? DT_F32 : t;
    if (st != t) {
        int c = expand_node(s, id, OP_Cast, sc, -1, "softmax_cast", -1);
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(st);
        visit(s, c);
        sc = g->node[c].out[0];
    }
    int sm = expand_node(s, id, OP_Softmax, sc, -1, "softmax", -1);
    ir_attr_add(g, sm, "axis", A_INT)->i = -1;
    visit(s, sm);
    int p = g->node[sm].out[0];
    if (st != t) {
        int c = expand_node(s, id, OP_Cast, p, -1, "softmax_back", -1);
        ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(t);
        visit(s, c);
        p = g->node[c].out[0];
    }
    if (full)
        p = expand3(s, id, OP_Where, whole, new_scalar(s, id, t, 0, "zero"), p, "probs", -1);
    if (n.nout > 3 && n.out[3] >= 0 && ir_is_read(g, n.out[3]))
        expand(s, id, OP_Identity, mode == 0 ? raw : mode == 1 ? capped : mode == 2 ? biased : p, -1, "qk_out", n.out[3]);
    int y = expand(s, id, OP_MatMul, p, V, "output", r == 4 ? n.out[0] : -1);
    if (r == 3) {
        static const int64_t perm[4] = {0, 2, 1, 3};
        int64_t d[3] = {qs.dim[0], sq, qs.dim[1] * vs.dim[3]};
        y = expand_perm(s, id, y, perm, 4, "merge");
        Shape cs = {.rank = 1, .dim = {3}};
        expand(s, id, OP_Reshape, y, ir_const(g, ir_fmt("%s/shape.%d", n.name, s->nnew++), DT_I64, &cs, d), "merged",
               n.out[0]);
    }
}

/* ---- RotaryEmbedding (opset 23) ---------------------------------------------- */

/* x[..., lo:hi:step] on the last axis, visited; its output */
static int expand_slice_last(Sweep *s, int id, int x, int64_t lo, int64_t hi, int64_t step, const char *suffix)
{
    Graph *g = s->g;
    int c = expand_node(s, id, OP_Slice, x, -1, suffix, -1);
    ir_attr_ints_add(g, c, "starts", &lo, 1);
    ir_attr_ints_add(g, c, "ends", &hi, 1);
    ir_attr_ints_add(g, c, "axes", &(int64_t){-1}, 1);
    ir_attr_ints_add(g, c, "steps", &step, 1);
    visit(s, c);
    return g->node[c].out[0];
}

/* Concat of in[0..n) on axis, named NODE/suffix, writing out (new if -1); its output */
static int expand_concat(Sweep *s, int id, const int *in, int n, int64_t axis, const char *suffix, int out)
{
    Graph *g = s->g;
    int c = expand_node_n(s, id, OP_Concat, in, n, suffix, out);
    ir_attr_add(g, c, "axis", A_INT)->i = axis;
    visit(s, c);
    return g->node[c].out[0];
}

/* RotaryEmbedding as its definition: X ([B, H, S, D], or [B, S, H * D] as
 * [B, S, H, D]), its first rotary_embedding_dim R of D rotated by the angles
 * of cos_cache / sin_cache ([B, S, R/2], or rows of them picked by
 * position_ids: a Gather), the pairs being the halves or (interleaved)
 * neighbours: real = cos x1 - sin x2, imag = sin x1 + cos x2. */
void expand_rope(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    DType t = g->val[n.in[0]].dtype;
    Shape xs = g->val[n.in[0]].shape;
    int r = xs.rank, pos = n.nin > 3 ? n.in[3] : -1;
    for (int i = 0; i < 3; i++)
        if (g->val[n.in[i]].dtype != t || !dtype_is_float(t))
            node_fatal(g, &n, "X, cos_cache and sin_cache must be float32 or float64 of one dtype (input %d is %s)", i,
                       dtype_name(g->val[n.in[i]].dtype));
    if (r != 3 && r != 4)
        node_fatal(g, &n, "X has rank %d; it must be 3 or 4", r);
    int x = n.in[0];
    if (r == 3) {
        int64_t h = ir_attr_i(&n, "num_heads", 0);
        if (h < 1 || xs.dim[2] % h)
            node_fatal(g, &n, "3-D X needs num_heads dividing its last dim %lld", (long long)xs.dim[2]);
        int64_t d[4] = {xs.dim[0], xs.dim[1], h, xs.dim[2] / h};
        x = expand_reshape(s, id, x, d, 4);
    }
    Shape s4 = g->val[x].shape; /* [B, H, S, D] or [B, S, H, D] */
    int64_t hd = s4.dim[3], rd = ir_attr_i(&n, "rotary_embedding_dim", 0);
    rd = rd ? rd : hd;
    if (rd < 2 || rd > hd || rd % 2)
        node_fatal(g, &n, "rotary_embedding_dim %lld must be even and at most the head size %lld", (long long)rd,
                   (long long)hd);
    int cs[2] = {n.in[1], n.in[2]};
    for (int j = 0; j < 2; j++) {
        if (pos >= 0) {
            int c = expand_node(s, id, OP_Gather, cs[j], pos, j ? "sin_rows" : "cos_rows", -1);
            ir_attr_add(g, c, "axis", A_INT)->i = 0;
            visit(s, c);
            cs[j] = g->node[c].out[0];
        }
        Shape c3 = g->val[cs[j]].shape; /* [B, S, R/2] */
        if (c3.rank != 3 || (c3.dim[0] != xs.dim[0] && c3.dim[0] != 1) || c3.dim[1] != s4.dim[r == 4 ? 2 : 1] ||
            c3.dim[2] != rd / 2)
            node_fatal(g, &n, "%s %s must be [batch %lld, sequence %lld, %lld]%s", j ? "sin" : "cos", shape_str(&c3),
                       (long long)xs.dim[0], (long long)s4.dim[r == 4 ? 2 : 1], (long long)(rd / 2),
                       pos >= 0 ? " once position_ids pick its rows" : "");
        int64_t d[4] = {c3.dim[0], 1, c3.dim[1], rd / 2}; /* broadcast over the heads */
        if (r == 3)
            d[1] = c3.dim[1], d[2] = 1;
        cs[j] = expand_reshape(s, id, cs[j], d, 4);
    }
    int il = ir_attr_i(&n, "interleaved", 0) != 0;
    int x1 = expand_slice_last(s, id, x, 0, il ? rd : rd / 2, il ? 2 : 1, "x1");
    int x2 = expand_slice_last(s, id, x, il ? 1 : rd / 2, rd, il ? 2 : 1, "x2");
    int re = expand(s, id, OP_Sub, expand(s, id, OP_Mul, cs[0], x1, "cos_x1", -1),
                    expand(s, id, OP_Mul, cs[1], x2, "sin_x2", -1), "real", -1);
    int im = expand(s, id, OP_Add, expand(s, id, OP_Mul, cs[1], x1, "sin_x1", -1),
                    expand(s, id, OP_Mul, cs[0], x2, "cos_x2", -1), "imag", -1);
    int parts[3], np = 0;
    if (il) { /* [..., R/2, 2] -> [..., R] */
        int ri[2] = {seq_part(s, id, OP_Unsqueeze, re, "real_pair", "axes", 4),
                     seq_part(s, id, OP_Unsqueeze, im, "imag_pair", "axes", 4)};
        int64_t d[4] = {s4.dim[0], s4.dim[1], s4.dim[2], rd};
        parts[np++] = expand_reshape(s, id, expand_concat(s, id, ri, 2, -1, "pairs", -1), d, 4);
    } else {
        parts[np++] = re;
        parts[np++] = im;
    }
    if (rd < hd)
        parts[np++] = expand_slice_last(s, id, x, rd, hd, 1, "pass");
    int y = np > 1 ? expand_concat(s, id, parts, np, -1, "rotated", r == 4 ? n.out[0] : -1) : parts[0];
    if (r == 3) {
        Shape os = {.rank = 1, .dim = {3}};
        expand(s, id, OP_Reshape, y, ir_const(g, ir_fmt("%s/shape.%d", n.name, s->nnew++), DT_I64, &os, xs.dim),
               "merged", n.out[0]);
    } else if (np == 1)
        expand(s, id, OP_Identity, y, -1, "out", n.out[0]);
}

