/* tensor.c — what the tensor family's files share (ir/rules/tensor.h): the
 * checked reading of attributes and constants, Slice / Gather / Pad geometry,
 * and the data movement of Slice, Split, Concat, Expand, Tile, Transpose, Pad
 * and ConstantOfShape as lists of strided copies (Move, one k_copy_strided
 * call each, any dtype).  fold runs those lists on constants at compile time
 * and codegen emits them, so both compute the same bytes.
 *
 * Pad's edge and reflect modes become copies too: every output dim is cut
 * into runs whose source index steps by -1, 0 or +1 (a reflection walks back,
 * an edge repeats), and each combination of runs across dims is one copy
 * from x.  Constant mode is a fill of the output, then one copy of what
 * survives of x.
 */
#include "tensor.h"
#include "kernels.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

enum { MAX_RUNS = 1024, MAX_BLOCKS = 1 << 16 };

/* ---- messages, axes, strides, attributes ---------------------------------- */


int tensor_axis(const Graph *g, const Node *n, int64_t a, int r, const char *what)
{
    if (a < -r || a >= r)
        node_fatal(g, n, "%s %lld is outside [%d, %d) for rank %d", what, (long long)a, -r, r, r);
    return (int)(a < 0 ? a + r : a);
}

void tensor_dense(const Shape *s, int64_t *st)
{
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        st[i] = acc;
        acc *= s->dim[i];
    }
}

void tensor_bcast(const Shape *s, const Shape *y, int64_t *st)
{
    int64_t d[MAX_RANK];
    tensor_dense(s, d);
    for (int i = 0; i < y->rank; i++) {
        int is = i - (y->rank - s->rank);
        st[i] = is < 0 || s->dim[is] == 1 ? 0 : d[is];
    }
}

const int64_t *tensor_ints(const Node *n, const char *name, int *count)
{
    return ir_attr_ints(n, name, count);
}

/* ---- dtypes -------------------------------------------------------------- */

DType tensor_from_onnx(int64_t code)
{
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) if (model && code == onnx) return DT_##name;
#include "dtypes.def"
    return DT_UNDEF;
}

int64_t tensor_to_onnx(DType t)
{
    static const int64_t code[DT_COUNT] = {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) [DT_##name] = onnx,
#include "dtypes.def"
    };
    return (unsigned)t < DT_COUNT ? code[t] : 0;
}

int tensor_kdt(DType t)
{
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) case DT_##name: return kdt;
#include "dtypes.def"
    default: die("no kernel dtype for %s", dtype_name(t));
    }
}

const char *tensor_onnx_name(int64_t code)
{
    static const char *name[] = {
        "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING",
        "BOOL", "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16"};
    return code >= 0 && code < (int64_t)(sizeof name / sizeof *name) ? name[code]
                                                                      : ir_fmt("%lld", (long long)code);
}


double tensor_const_f(const Value *v, int64_t i)
{
    double r = 0;
    k_cast(K_DT_F64, &r, tensor_kdt(v->dtype), (const char *)v->data + i * (int64_t)dtype_size(v->dtype), 1);
    return r;
}

int64_t tensor_const_i(const Value *v, int64_t i)
{
    int64_t r = 0;
    k_cast(K_DT_I64, &r, tensor_kdt(v->dtype), (const char *)v->data + i * (int64_t)dtype_size(v->dtype), 1);
    return r;
}

/* ---- geometry ------------------------------------------------------------ */

/* One sliced dim: ONNX clamping, element count for any step. */
static void slice_dim(int64_t dim, int64_t s, int64_t e, int64_t t, int64_t *start, int64_t *len)
{
    if (s < 0)
        s += dim;
    if (e < 0)
        e += dim;
    if (t > 0) {
        s = s < 0 ? 0 : s > dim ? dim : s;
        e = e < 0 ? 0 : e > dim ? dim : e;
        *len = e > s ? (e - s - 1) / t + 1 : 0;
    } else {
        s = s < 0 ? -1 : s > dim - 1 ? dim - 1 : s;
        e = e < -1 ? -1 : e > dim - 1 ? dim - 1 : e;
        uint64_t ut = (uint64_t)0 - (uint64_t)t;
        *len = s > e ? (int64_t)((uint64_t)(s - e - 1) / ut) + 1 : 0;
    }
    *start = *len ? s : 0;
}

void tensor_slice(const Graph *g, const Node *n, const Shape *x, int64_t *start, int64_t *step,
                  int64_t *len)
{
    int ns, ne, na, nt;
    const int64_t *st = tensor_ints(n, "starts", &ns), *en = tensor_ints(n, "ends", &ne);
    const int64_t *ax = tensor_ints(n, "axes", &na), *sp = tensor_ints(n, "steps", &nt);
    if (!st || !en)
        node_fatal(g, n, "needs starts and ends");
    if (ne != ns || (ax && na != ns) || (sp && nt != ns))
        node_fatal(g, n, "starts, ends, axes and steps must have the same length");
    char seen[MAX_RANK] = {0};
    for (int d = 0; d < x->rank; d++) {
        start[d] = 0;
        step[d] = 1;
        len[d] = x->dim[d];
    }
    for (int i = 0; i < ns; i++) {
        if (!ax && i >= x->rank)
            node_fatal(g, n, "%d starts for an input of rank %d", ns, x->rank);
        int d = ax ? tensor_axis(g, n, ax[i], x->rank, "axes entry") : i;
        if (seen[d]++)
            node_fatal(g, n, "axis %d is sliced twice", d);
        int64_t t = sp ? sp[i] : 1;
        if (t == 0)
            node_fatal(g, n, "steps must not be 0");
        slice_dim(x->dim[d], st[i], en[i], t, &start[d], &len[d]);
        step[d] = len[d] > 1 ? t : 1; /* a huge step never multiplies a stride */
    }
}

void tensor_gather_dims(const Shape *data, int axis, int64_t *outer, int64_t *axdim, int64_t *inner)
{
    *outer = *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= data->dim[i];
    for (int i = axis + 1; i < data->rank; i++)
        *inner *= data->dim[i];
    *axdim = data->dim[axis];
}

int tensor_pad_mode(const Graph *g, const Node *n)
{
    const char *m = ir_attr_s(n, "mode", "constant");
    if (!strcmp(m, "constant"))
        return K_PAD_CONSTANT;
    if (!strcmp(m, "reflect"))
        return K_PAD_REFLECT;
    if (!strcmp(m, "edge"))
        return K_PAD_EDGE;
    node_fatal(g, n, "mode '%s' is not supported (constant, reflect or edge)", ir_q(m));
}

/* the tensor attribute `value`, or NULL */
const Value *tensor_value_attr(const Graph *g, const Node *n)
{
    const Attr *a = ir_attr(n, "value");
    if (!a)
        return NULL;
    if (a->kind != A_TENSOR || shape_numel(&g->val[a->t].shape) != 1)
        node_fatal(g, n, "value must be a tensor of one element");
    return &g->val[a->t];
}

uint64_t tensor_fill(const Graph *g, const Node *n)
{
    const Value *v = tensor_value_attr(g, n);
    uint64_t bits = 0;
    if (v)
        k_cast(tensor_kdt(g->val[n->out[0]].dtype), &bits, tensor_kdt(v->dtype), v->data, 1);
    return bits;
}

double tensor_value(const Graph *g, const Node *n)
{
    const Value *v = tensor_value_attr(g, n);
    return v ? tensor_const_f(v, 0) : 0.0;
}

int64_t tensor_range_len(const Graph *g, const Node *n)
{
    const Value *v[3];
    for (int i = 0; i < 3; i++) {
        v[i] = &g->val[n->in[i]];
        if (v[i]->role != R_CONST || shape_numel(&v[i]->shape) != 1 || !ir_data(g, n->in[i]))
            node_fatal(g, n, "input '%s' must be a constant scalar; fsdpc has static shapes",
                       ir_q(v[i]->name));
        if (v[i]->dtype != v[0]->dtype || v[i]->dtype == DT_BOOL)
            node_fatal(g, n, "start, limit and delta need one numeric dtype");
    }
    double cnt;
    if (dtype_is_float(v[0]->dtype)) {
        double s = tensor_const_f(v[0], 0), l = tensor_const_f(v[1], 0), d = tensor_const_f(v[2], 0);
        cnt = ceil((l - s) / d);
        if (d == 0 || cnt != cnt)
            node_fatal(g, n, "delta must be non-zero and the bounds finite");
    } else {
        int64_t s = tensor_const_i(v[0], 0), l = tensor_const_i(v[1], 0), d = tensor_const_i(v[2], 0);
        if (d == 0)
            node_fatal(g, n, "delta must not be 0");
        /* unsigned: the distance between any two int64 fits, and -INT64_MIN too */
        uint64_t dist = d > 0 ? (l > s ? (uint64_t)l - (uint64_t)s : 0) : (s > l ? (uint64_t)s - (uint64_t)l : 0);
        uint64_t step = d > 0 ? (uint64_t)d : (uint64_t)0 - (uint64_t)d;
        cnt = dist ? (double)((dist - 1) / step + 1) : 0;
    }
    if (cnt > (double)MAX_NUMEL)
        node_fatal(g, n, "the output would have more than 2^40 elements");
    return cnt > 0 ? (int64_t)cnt : 0;
}

/* ---- data movement as strided copies ------------------------------------- */

static Move *moves_alloc(int k) { return ir_alloc(sizeof(Move) * (size_t)(k + 1)); }

/* x -> y with x read at strides xs from xoff, y dense */
static void dense_move(Move *m, int src, int dst, const Shape *y)
{
    m->src = src;
    m->dst = dst;
    m->rank = y->rank;
    memcpy(m->shape, y->dim, sizeof(int64_t) * (size_t)y->rank);
    tensor_dense(y, m->ys);
}

static int slice_moves(const Graph *g, const Node *n, Move **out)
{
    int grad = n->op == OP_SliceGrad;
    const Shape *x = &g->val[grad ? n->out[0] : n->in[0]].shape; /* the sliced tensor */
    int64_t start[MAX_RANK], step[MAX_RANK], xd[MAX_RANK], sl[MAX_RANK], dn[MAX_RANK];
    int64_t soff = 0, doff = 0;
    Shape part = {x->rank, {0}};
    tensor_slice(g, n, x, start, step, part.dim);
    tensor_dense(x, xd);
    tensor_dense(&part, dn);
    for (int d = 0; d < x->rank; d++) {
        sl[d] = step[d] * xd[d];
        soff += start[d] * xd[d];
        if (grad && sl[d] < 0 && part.dim[d] > 0) { /* SliceGrad writes x: keep its strides positive */
            soff += (part.dim[d] - 1) * sl[d];
            doff += (part.dim[d] - 1) * dn[d];
            sl[d] = -sl[d];
            dn[d] = -dn[d];
        }
    }
    Move *m = moves_alloc(1);
    m->rank = x->rank;
    memcpy(m->shape, part.dim, sizeof part.dim);
    memcpy(grad ? m->ys : m->xs, sl, sizeof sl);
    memcpy(grad ? m->xs : m->ys, dn, sizeof dn);
    m->yoff = grad ? soff : doff;
    m->xoff = grad ? doff : soff;
    *out = m;
    return 1;
}

static int split_moves(const Graph *g, const Node *n, Move **out)
{
    const Shape *x = &g->val[n->in[0]].shape;
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->rank, "axis");
    int64_t xd[MAX_RANK], off = 0;
    tensor_dense(x, xd);
    Move *m = moves_alloc(n->nout);
    for (int k = 0; k < n->nout; k++) {
        const Shape *y = &g->val[n->out[k]].shape;
        dense_move(&m[k], 0, k, y);
        memcpy(m[k].xs, xd, sizeof xd);
        m[k].xoff = off * xd[ax];
        off += y->dim[ax];
    }
    *out = m;
    return n->nout;
}

static int concat_moves(const Graph *g, const Node *n, Move **out)
{
    const Shape *y = &g->val[n->out[0]].shape;
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), y->rank, "axis");
    int64_t yd[MAX_RANK], off = 0;
    tensor_dense(y, yd);
    Move *m = moves_alloc(n->nin);
    for (int i = 0; i < n->nin; i++) {
        const Shape *x = &g->val[n->in[i]].shape;
        dense_move(&m[i], i, 0, x);
        memcpy(m[i].xs, m[i].ys, sizeof m[i].xs);
        memcpy(m[i].ys, yd, sizeof yd);
        m[i].yoff = off * yd[ax];
        off += x->dim[ax];
    }
    *out = m;
    return n->nin;
}

static int tile_moves(const Graph *g, const Node *n, Move **out)
{
    const Shape *x = &g->val[n->in[0]].shape, *y = &g->val[n->out[0]].shape;
    int k;
    const int64_t *rep = tensor_ints(n, "repeats", &k);
    int64_t xd[MAX_RANK], yd[MAX_RANK];
    tensor_dense(x, xd);
    tensor_dense(y, yd);
    Move *m = moves_alloc(1);
    m->rank = 2 * x->rank;
    for (int d = 0; d < x->rank; d++) { /* y viewed as [rep0, x0, rep1, x1, ...] */
        m->shape[2 * d] = rep[d];
        m->shape[2 * d + 1] = x->dim[d];
        m->ys[2 * d] = x->dim[d] * yd[d];
        m->ys[2 * d + 1] = yd[d];
        m->xs[2 * d + 1] = xd[d];
    }
    *out = m;
    return 1;
}

static int transpose_moves(const Graph *g, const Node *n, Move **out)
{
    const Shape *x = &g->val[n->in[0]].shape, *y = &g->val[n->out[0]].shape;
    int k;
    const int64_t *perm = tensor_ints(n, "perm", &k);
    int64_t xd[MAX_RANK];
    tensor_dense(x, xd);
    Move *m = moves_alloc(1);
    dense_move(m, 0, 0, y);
    for (int d = 0; d < y->rank; d++)
        m->xs[d] = xd[perm ? perm[d] : y->rank - 1 - d];
    *out = m;
    return 1;
}

/* Pad's source index along a dim of length len for y position j - begin pad
 * (as kernels/c/copy.c); -1 where a constant pad covers it. */
static int64_t pad_src(int mode, int64_t j, int64_t len)
{
    if (j >= 0 && j < len)
        return j;
    if (mode == K_PAD_CONSTANT)
        return -1;
    if (mode == K_PAD_EDGE)
        return j < 0 ? 0 : len - 1;
    int64_t p = 2 * (len - 1);
    if (p == 0)
        return 0;
    j %= p;
    j += j < 0 ? p : 0;
    return j < len ? j : p - j;
}

typedef struct { int64_t y0, len, src, step; } Run;

/* The next position after j where pad_src's slope may change (INT64_MAX: none): edge (and
 * constant) at 0 and len, reflect at every multiple of len - 1. */
static int64_t pad_piece_end(int mode, int64_t j, int64_t len)
{
    if (mode != K_PAD_REFLECT)
        return j < 0 ? 0 : j < len ? len : INT64_MAX;
    int64_t h = len - 1;
    if (h < 1)
        return h ? j + 1 : INT64_MAX; /* len 1: always 0 */
    int64_t q = j >= 0 ? j / h : -((h - 1 - j) / h);
    return (q + 1) * h;
}

/* A dim of Pad's output cut into runs whose sources step by -1, 0 or 1.  pad_src is linear on each
 * piece (pad_piece_end): its first two positions go through the merge below, the rest of the piece
 * only lengthens the run the second one ended in, so the work is per piece, not per position. */
static int pad_runs(const Graph *g, const Node *n, int mode, int64_t xlen, int64_t ylen, int64_t b,
                    Run *run)
{
    int k = 0;
    for (int64_t i0 = 0; i0 < ylen;) {
        int64_t je = pad_piece_end(mode, i0 - b, xlen);
        int64_t e = je == INT64_MAX || je + b > ylen ? ylen : je + b;
        for (int64_t i = i0; i < e && i < i0 + 2; i++) {
            int64_t s = pad_src(mode, i - b, xlen);
            Run *r = k ? &run[k - 1] : NULL;
            int64_t diff = r ? s - (r->src + (r->len - 1) * r->step) : 2;
            if (r && (r->len == 1 ? diff >= -1 && diff <= 1 : diff == r->step)) {
                r->step = r->len == 1 ? diff : r->step;
                r->len++;
                continue;
            }
            if (k == MAX_RUNS)
                node_fatal(g, n, "reflect padding wraps around too often (more than %d pieces)", MAX_RUNS);
            run[k++] = (Run){i, 1, s, 1};
        }
        if (e - i0 > 2) {
            Run *r = &run[k - 1];
            if (r->len == 1)
                r->step = pad_src(mode, i0 + 1 - b, xlen) - pad_src(mode, i0 - b, xlen);
            r->len += e - i0 - 2;
        }
        i0 = e;
    }
    return k;
}

/* Edge / reflect: every combination of runs across dims is one copy. */
static int pad_border_moves(const Graph *g, const Node *n, int mode, Move **out)
{
    const Shape *x = &g->val[n->in[0]].shape, *y = &g->val[n->out[0]].shape;
    int k, r = x->rank, nrun[MAX_RANK];
    const int64_t *p = tensor_ints(n, "pads", &k);
    Run *run[MAX_RANK];
    int64_t total = 1, xd[MAX_RANK], yd[MAX_RANK];
    tensor_dense(x, xd);
    tensor_dense(y, yd);
    for (int d = 0; d < r; d++) {
        run[d] = ir_alloc(sizeof(Run) * MAX_RUNS);
        nrun[d] = pad_runs(g, n, mode, x->dim[d], y->dim[d], p[d], run[d]);
        total *= nrun[d];
        if (total > MAX_BLOCKS)
            node_fatal(g, n, "padding is cut into more than %d pieces", MAX_BLOCKS);
    }
    Move *m = moves_alloc((int)total);
    for (int64_t b = 0; b < total; b++) {
        Move *v = &m[b];
        v->rank = r;
        for (int d = r - 1, rest = (int)b; d >= 0; rest /= nrun[d], d--) {
            const Run *u = &run[d][rest % nrun[d]];
            v->shape[d] = u->len;
            v->ys[d] = yd[d];
            v->xs[d] = u->step * xd[d];
            v->yoff += u->y0 * yd[d];
            v->xoff += u->src * xd[d];
        }
    }
    *out = m;
    return (int)total;
}

/* Constant: fill y, then copy the part of x that survives cropping. */
static int pad_moves(const Graph *g, const Node *n, Move **out)
{
    int mode = tensor_pad_mode(g, n);
    if (mode != K_PAD_CONSTANT && shape_numel(&g->val[n->out[0]].shape) > 0)
        return pad_border_moves(g, n, mode, out);
    const Shape *x = &g->val[n->in[0]].shape, *y = &g->val[n->out[0]].shape;
    int k, r = x->rank;
    const int64_t *p = tensor_ints(n, "pads", &k);
    int64_t xd[MAX_RANK], yd[MAX_RANK];
    tensor_dense(x, xd);
    tensor_dense(y, yd);
    Move *m = moves_alloc(2);
    dense_move(&m[0], -1, 0, y); /* xs all 0: the fill element everywhere */
    m[1].src = 0;
    m[1].rank = r;
    for (int d = 0; d < r; d++) {
        int64_t b = p[d], e = p[r + d];
        int64_t cut0 = b < 0 ? -b : 0, cut1 = e < 0 ? -e : 0;
        m[1].shape[d] = x->dim[d] - cut0 - cut1 > 0 ? x->dim[d] - cut0 - cut1 : 0;
        m[1].ys[d] = yd[d];
        m[1].xs[d] = xd[d];
        m[1].yoff += (b > 0 ? b : 0) * yd[d];
        m[1].xoff += cut0 * xd[d];
    }
    *out = m;
    return 2;
}

int tensor_moves(const Graph *g, const Node *n, Move **m)
{
    switch (n->op) {
    case OP_Slice: case OP_SliceGrad: return slice_moves(g, n, m);
    case OP_Split: return split_moves(g, n, m);
    case OP_Concat: return concat_moves(g, n, m);
    case OP_Tile: return tile_moves(g, n, m);
    case OP_Transpose: return transpose_moves(g, n, m);
    case OP_Pad: return pad_moves(g, n, m);
    case OP_Expand: case OP_ConstantOfShape: {
        const Shape *y = &g->val[n->out[0]].shape;
        *m = moves_alloc(1);
        dense_move(*m, n->op == OP_Expand ? 0 : -1, 0, y);
        if (n->op == OP_Expand)
            tensor_bcast(&g->val[n->in[0]].shape, y, (*m)->xs);
        return 1;
    }
    default: die("no data movement plan for %s", op_info[n->op].name);
    }
}

void tensor_index_dtype(const Graph *g, const Node *n, const Value *ix)
{
    if (ix->dtype != DT_I64)
        node_fatal(g, n, "indices '%s' are %s; %s takes int64 or int32 indices", ir_q(ix->name),
                   dtype_name(ix->dtype), op_info[n->op].name);
}

int tensor_elements_axis(const Graph *g, const Node *n, const Value *x, const Value *ix)
{
    const char *op = op_info[n->op].name;
    tensor_index_dtype(g, n, ix);
    if (x->shape.rank == 0)
        node_fatal(g, n, "data '%s' is a scalar; %s indexes along an axis", ir_q(x->name), op);
    if (ix->shape.rank != x->shape.rank)
        node_fatal(g, n, "indices '%s' have rank %d and data '%s' rank %d; %s needs the same rank",
                   ir_q(ix->name), ix->shape.rank, ir_q(x->name), x->shape.rank, op);
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis");
    for (int d = 0; d < x->shape.rank; d++)
        if (d != ax && ix->shape.dim[d] > x->shape.dim[d])
            node_fatal(g, n, "indices '%s' have %lld along dim %d, data '%s' %lld; off the axis they can "
                       "be no longer", ir_q(ix->name), (long long)ix->shape.dim[d], d, ir_q(x->name),
                       (long long)x->shape.dim[d]);
    tensor_const_indices(g, n, ix, &x->shape.dim[ax], 1);
    return ax;
}

void tensor_const_indices(const Graph *g, const Node *n, const Value *ix, const int64_t *lim, int k)
{
    if (ix->role != R_CONST || !ix->data)
        return;
    const int64_t *v = ix->data;
    for (int64_t i = 0, count = shape_numel(&ix->shape); i < count; i++) /* counted once: tables of 2^20 */
        if (v[i] < -lim[i % k] || v[i] >= lim[i % k])
            node_fatal(g, n, "index %lld (entry %lld of '%s') is outside [%lld, %lld)", (long long)v[i], (long long)i,
                       ir_q(ix->name), (long long)-lim[i % k], (long long)lim[i % k]);
}

void tensor_nd_counts(const Node *n, const Shape *ix, int64_t *nb, int64_t *nq)
{
    int64_t b = ir_attr_i(n, "batch", 0);
    *nb = *nq = 1;
    for (int d = 0; d < ix->rank - 1; d++)
        *(d < b ? nb : nq) *= ix->dim[d];
}

/* Is node r x * f (Mul or Div by a constant scalar, Scale) for an input x?  Then *x, *f. */
int tensor_scaling(const Graph *g, const Node *r, int *x, double *f)
{
    if (r->op == OP_Scale) {
        *x = r->in[0], *f = ir_attr_f(r, "alpha", 1.0);
        return 1;
    }
    if (r->op != OP_Mul && r->op != OP_Div)
        return 0;
    for (int side = 0; side < 2; side++) {
        const Value *c = &g->val[r->in[!side]];
        if ((r->op == OP_Div && side) || c->role != R_CONST || shape_numel(&c->shape) != 1 ||
            c->dtype != g->val[r->out[0]].dtype || !ir_data(g, r->in[!side]))
            continue;
        double v = tensor_const_f(c, 0);
        if (r->op == OP_Div && v == 0)
            return 0;
        *x = r->in[side], *f = r->op == OP_Div ? 1 / v : v;
        return 1;
    }
    return 0;
}
