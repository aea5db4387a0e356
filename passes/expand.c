/* expand.c — fold's expansions of composite ops: opset 23's RMSNormalization,
 * RotaryEmbedding and Attention (those two in expand_attn.c), the logical and NaN tests, ArgMax / ArgMin,
 * CumSum, TopK, GatherND / ScatterND / ScatterElements, Resize and Einsum (einsum.c), each
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
int expand_node_n(Sweep *s, int id, Op op, const int *in, int nin, const char *suffix, int out)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return ir_node(g, op, name, nin, in, 1, &out);
}

/* As expand_node_n, of op(a[, b]) */
int expand_node(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
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
int expand3(Sweep *s, int id, Op op, int a, int b, int c, const char *suffix, int out)
{
    int in[3] = {a, b, c}, k = expand_node_n(s, id, op, in, 3, suffix, out);
    visit(s, k);
    return s->g->node[k].out[0];
}

/* A scalar constant v of dtype dt (float32/64, int32/64 or bool). */
int expand_scalar(Sweep *s, int id, DType dt, double v, const char *suffix)
{
    Graph *g = s->g;
    return ir_scalar(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), dt, v);
}

/* x reshaped to dims[0..n) (x itself when it has them); its output */
int expand_reshape(Sweep *s, int id, int x, const int64_t *dims, int n)
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
int expand_perm(Sweep *s, int id, int x, const int64_t *perm, int n, const char *suffix)
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
                   expand_scalar(s, id, x->dtype, ir_attr_f(&n, "epsilon", 1e-5f), "epsilon"), "add_eps", -1);
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
                   expand_scalar(s, id, t, INFINITY, "inf"), "equal_inf", y);
        else if (pos || neg)
            expand(s, id, OP_Equal, a, expand_scalar(s, id, t, pos ? INFINITY : -INFINITY, "inf"), "equal_inf", y);
        else /* nothing detected: false everywhere */
            expand(s, id, OP_Less, a, expand_scalar(s, id, t, -INFINITY, "inf"), "none", y);
        return;
    }
    default: { /* And: a ? b : false; Or: a ? true : b; Xor: a ? !b : b */
        int k = n.op == OP_Xor ? expand(s, id, OP_Not, b, -1, "not", -1)
                               : expand_scalar(s, id, DT_BOOL, n.op == OP_Or, n.op == OP_Or ? "true" : "false");
        expand3(s, id, OP_Where, a, n.op == OP_And ? b : k, n.op == OP_And ? k : b, "where", y);
    }
    }
}

/* A reduction (ReduceMax, ReduceMin, ReduceProd) of x over axis (keepdims) named NODE/suffix, visited;
 * its output. */
int expand_reduce(Sweep *s, int id, Op op, int x, int axis, int keepdims, const char *suffix, int out)
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
                      expand_scalar(s, id, DT_BOOL, 1, "true"), nan, "hit", -1);
    Shape ps = {.rank = r - ax}; /* the positions along the axis, broadcasting over the dims after it */
    ps.dim[0] = len;
    for (int i = 1; i < ps.rank; i++)
        ps.dim[i] = 1;
    void *p = ir_alloc(dtype_size(t) * (size_t)len);
    for (int64_t i = 0; i < len; i++)
        dtype_set_f(p, i, t, last ? (double)i : (double)(len - 1 - i));
    int pv = ir_const(g, ir_fmt("%s/positions.%d", n.name, s->nnew++), t, &ps, p);
    int sel = expand3(s, id, OP_Where, hit, pv, expand_scalar(s, id, t, -1, "none"), "select", -1);
    int idx = expand_reduce(s, id, OP_ReduceMax, sel, ax, keep, "index", -1);
    if (!last)
        idx = expand(s, id, OP_Sub, expand_scalar(s, id, t, (double)(len - 1), "last"), idx, "first", -1);
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
    int one = prod ? expand_scalar(s, id, DT_F64, 1.0, "one") : -1; /* Pad casts its value to x's dtype */
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
        key = expand3(s, id, OP_Where, nan, expand_scalar(s, id, t, INFINITY, "nan_key"), key, "key", -1);
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
                      expand_scalar(s, id, DT_BOOL, 0, "false"), "tie_before", -1);
    int beats = expand3(s, id, OP_Where, expand(s, id, largest ? OP_Greater : OP_Less, vj, vi, "beyond", -1),
                        expand_scalar(s, id, DT_BOOL, 1, "true"), tie, "beats", -1);
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
                       expand_scalar(s, id, t, 0, "zero"), "pick", -1); /* [.., len, k, ..] */
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
    int u = n.in[2], fill = expand_scalar(s, id, dt, identity[red], "identity");
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
    int e = expand_node(s, id, OP_Expand, expand_scalar(s, id, dt, 1, "one"), -1, "ones", -1);
    ir_attr_ints_add(g, e, "shape", os.dim, os.rank);
    visit(s, e);
    Shape ls = nd ? (Shape){.rank = 1, .dim = {flat.dim[0]}} : flat;
    int hits = expand_reshape(s, id, scatter_add(s, id, op, g->node[e].out[0], pos, ax, dt, &ls, "hits"), cnt.dim,
                              cnt.rank);
    int landed = expand(s, id, OP_Greater, hits, expand_scalar(s, id, dt, 0, "zero"), "landed", -1);
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
