/* emit_tensor.c — the step code of the tensor family (shapes, indexing, data
 * movement, comparisons) and of its backward ops.
 *
 * Pure data movement (Slice, Split, Concat, Expand, Tile, integer Pad and
 * ConstantOfShape, SliceGrad's scatter) is the Move list of ir/rules/tensor.h:
 * one k_copy_strided call per entry, any dtype, the same list fold ran on
 * constants.  Views (Squeeze, Unsqueeze, Flatten) share their input's bytes
 * (memplan) and emit nothing unless the planner had to place them apart.
 * Everything else is one kernel call with shapes and broadcast strides as
 * static arrays.  Gather and GatherElements check their indices at run
 * time: the kernel reports the first bad one, and the step fails naming the
 * node and the indices.
 * Shape, Size and CastLike never get here: fold evaluates or rewrites them.
 */
#include "cg.h"
#include "kernels.h"
#include "../ir/rules/tensor.h"

#include <math.h>
#include <string.h>

static const char *sfx(DType t)
{
    return t == DT_F64 ? "f64" : t == DT_I64 ? "i64" : "f32";
}


/* a double as C text (infinities and NaN spelled so the compiler takes them) */
static const char *num(double v)
{
    if (v != v)
        return "NAN";
    if (isinf(v))
        return v > 0 ? "INFINITY" : "-INFINITY";
    return ir_fmt("%.17g", v);
}

static const Value *val(const Graph *g, int v) { return &g->val[v]; }

static void emit_zero(Cg *cg, Buf *b, int y);

static void emit_moves(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    Move *m;
    int k = tensor_moves(g, n, &m);
    int es = (int)dtype_size(val(g, n->out[0])->dtype);
    uint64_t fill = n->op == OP_Pad || n->op == OP_ConstantOfShape ? tensor_fill(g, n) : 0;
    int fills = 0;
    for (int i = 0; i < k; i++)
        fills |= m[i].src < 0;
    if (cg->cuda && fills && fill == 0) /* the device cannot read a host constant: zero all of y, copy x over it */
        emit_zero(cg, b, n->out[0]);
    else if (cg->cuda && fills) { /* the same with a float32 fill */
        const Value *y = val(g, n->out[0]);
        if (y->dtype != DT_F32)
            fatal("node '%s' (%s): a %s fill computed at run time is not supported by --target cuda yet; use "
                  "--target cpu", ir_q(n->name), op_info[n->op].name, dtype_name(y->dtype));
        float f;
        uint32_t bits = (uint32_t)fill;
        memcpy(&f, &bits, sizeof f);
        cg_put(b, "    k_fill_f32(%s, %.9g, %lld);\n", cg_ptr(cg, n->out[0]), (double)f,
            (long long)value_numel(g, n->out[0]));
    }
    for (int i = 0; i < k; i++) {
        const Move *v = &m[i];
        if (cg->cuda && v->src < 0)
            continue;
        int64_t cnt = 1;
        for (int d = 0; d < v->rank; d++)
            cnt *= v->shape[d];
        if (!cnt)
            continue;
        cg_put(b, "    { static const int64_t sh[] = %s, ys[] = %s, xs[] = %s;\n", cg_ints(v->shape, v->rank),
            cg_ints(v->ys, v->rank), cg_ints(v->xs, v->rank));
        if (v->src < 0)
            cg_put(b, "      static const uint64_t fill = 0x%016llxull;\n", (unsigned long long)fill);
        cg_put(b, "      k_copy_strided(%d, %d, sh, %s, %lld, ys, %s, %lld, xs); }\n", es, v->rank,
            cg_ptr(cg, n->out[v->dst]), (long long)v->yoff, v->src < 0 ? "&fill" : cg_ptr(cg, n->in[v->src]),
            (long long)v->xoff);
    }
}

static void emit_view(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int x = n->in[0], y = n->out[0];
    if (cg_same_place(g, x, y))
        cg_put(b, "    /* a view: no data moves */\n");
    else
        cg_put(b, "    rt_memcpy(%s, %s, %lld);\n", cg_ptr(cg, y), cg_ptr(cg, x),
            (long long)(value_numel(g, y) * (int64_t)dtype_size(val(g, y)->dtype)));
}

/* Where, comparisons: y dense over its shape, inputs by broadcast strides */
static void emit_bcast(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Shape *y = &val(g, n->out[0])->shape;
    int64_t st[3][MAX_RANK];
    for (int i = 0; i < n->nin; i++)
        tensor_bcast(&val(g, n->in[i])->shape, y, st[i]);
    cg_put(b, "    { static const int64_t sh[] = %s, s0[] = %s, s1[] = %s", cg_ints(y->dim, y->rank),
        cg_ints(st[0], y->rank), cg_ints(st[1], y->rank));
    if (n->op == OP_Where) {
        cg_put(b, ", s2[] = %s;\n", cg_ints(st[2], y->rank));
        cg_put(b, "      k_where(%d, %s, %s, %s, %s, %d, sh, s0, s1, s2); }\n",
            (int)dtype_size(val(g, n->out[0])->dtype), cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]),
            cg_ptr(cg, n->in[1]), cg_ptr(cg, n->in[2]), y->rank);
        return;
    }
    const char *op = n->op == OP_Equal ? "K_EQ" : n->op == OP_Less ? "K_LT" : n->op == OP_Greater ? "K_GT"
                   : n->op == OP_LessOrEqual ? "K_LE" : "K_GE";
    cg_put(b, ";\n      k_compare_%s(%s, %s, %s, %s, %d, sh, s0, s1); }\n", sfx(val(g, n->in[0])->dtype), op,
        cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), y->rank);
}

static void emit_gather(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int grad = n->op == OP_GatherGrad;
    const Value *x = val(g, grad ? n->out[0] : n->in[0]), *ix = val(g, n->in[1]);
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis");
    int64_t outer, axdim, inner, nidx = shape_numel(&ix->shape);
    tensor_gather_dims(&x->shape, ax, &outer, &axdim, &inner);
    if (grad) {
        cg_put(b, "    k_gather_grad_%s(%s, %s, %s, %lld, %lld, %lld, %lld);\n", sfx(x->dtype),
            cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), (long long)outer,
            (long long)axdim, (long long)inner, (long long)nidx);
        return;
    }
    cg_put(b, "    { int64_t bad = k_gather(%d, %s, %s, %s, %lld, %lld, %lld, %lld);\n", (int)dtype_size(x->dtype),
        cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), (long long)outer, (long long)axdim,
        (long long)inner, (long long)nidx);
    cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"node %%s (Gather): index %%lld at position %%lld of "
                           "%%s is outside [-%lld, %lld)\", %s, (long long)%s[bad], (long long)bad, %s); }\n",
                           (long long)axdim, (long long)axdim, cg_cstr(n->name), cg_ptr(cg, n->in[1]),
                           cg_cstr(ix->name)),
                 ir_fmt("node %s (Gather): an index of %s is outside [-%lld, %lld)", n->name, ix->name,
                        (long long)axdim, (long long)axdim));
}

static void emit_gather_elements(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int grad = n->op == OP_GatherElementsGrad;
    const Value *x = val(g, grad ? n->out[0] : n->in[0]), *ix = val(g, n->in[1]);
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis"), r = x->shape.rank;
    int64_t axdim = x->shape.dim[ax];
    cg_put(b, "    { static const int64_t sh[] = %s, xs[] = %s;\n", cg_ints(ix->shape.dim, r), cg_ints(x->shape.dim, r));
    if (grad) /* ScatterElements' scatter as well: its indices are checked here */
        cg_put(b, "      int64_t bad = k_gather_elements_grad_%s(%s, %s, %s, %d, sh, xs, %d);\n", sfx(x->dtype),
            cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), r, ax);
    else
        cg_put(b, "      int64_t bad = k_gather_elements(%d, %s, %s, %s, %d, sh, xs, %d);\n",
            (int)dtype_size(x->dtype), cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), r, ax);
    const char *op = grad ? "ScatterElements" : "GatherElements";
    cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"node %%s (%s): index %%lld at position "
                           "%%lld of %%s is outside [-%lld, %lld)\", %s, (long long)%s[bad], (long long)bad, %s); }\n",
                           op, (long long)axdim, (long long)axdim, cg_cstr(n->name), cg_ptr(cg, n->in[1]),
                           cg_cstr(ix->name)),
                 ir_fmt("node %s (%s): an index of %s is outside [-%lld, %lld)", n->name, op, ix->name,
                        (long long)axdim, (long long)axdim));
}

/* NDIndex: GatherND's / ScatterND's tuples checked and made positions */
static void emit_nd_index(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Value *ix = val(g, n->in[0]);
    int k;
    const int64_t *dims = tensor_ints(n, "dims", &k);
    int64_t nb, nq;
    tensor_nd_counts(n, &ix->shape, &nb, &nq);
    cg_put(b, "    { static const int64_t dims[] = %s;\n", cg_ints(dims, k));
    cg_put(b, "      int64_t bad = k_nd_index(%s, %s, %lld, %lld, %d, dims);\n", cg_ptr(cg, n->out[0]),
        cg_ptr(cg, n->in[0]), (long long)nb, (long long)nq, k);
    cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"node %%s: index %%lld at position %%lld of %%s is "
                           "outside its dim (component %%lld of tuples indexing dims %s)\", %s, (long long)%s[bad], "
                           "(long long)bad, %s, (long long)(bad %% %d)); }\n",
                           cg_ints(dims, k), cg_cstr(n->name), cg_ptr(cg, n->in[0]), cg_cstr(ix->name), k),
                 ir_fmt("node %s: an index of %s is outside the dims %s it indexes", n->name, ix->name,
                        cg_ints(dims, k)));
}

static void emit_pad(Cg *cg, Buf *b, const Node *n, int grad)
{
    const Graph *g = cg->g;
    const Value *x = val(g, grad ? n->out[0] : n->in[0]);
    int k;
    const int64_t *pads = tensor_ints(n, "pads", &k);
    static const char *mode[] = {"K_PAD_CONSTANT", "K_PAD_REFLECT", "K_PAD_EDGE"};
    int md = tensor_pad_mode(g, n);
    cg_put(b, "    { static const int64_t xs[] = %s, pads[] = %s;\n", cg_ints(x->shape.dim, x->shape.rank),
        cg_ints(pads, k));
    if (grad)
        cg_put(b, "      k_pad_grad_%s(%s, %s, %s, %d, xs, pads); }\n", sfx(x->dtype),
            mode[md], cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), x->shape.rank);
    else
        cg_put(b, "      k_pad_%s(%s, %s, %s, %d, xs, pads, %s); }\n", sfx(x->dtype), mode[md],
            cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]), x->shape.rank, num(tensor_value(g, n)));
}

/* dx = dy summed over the tiles: dy viewed as [rep0, x0, rep1, x1, ...] */
static void emit_tile_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Value *x = val(g, n->out[0]);
    int k, r = x->shape.rank;
    const int64_t *rep = tensor_ints(n, "repeats", &k);
    int64_t from[2 * MAX_RANK], to[2 * MAX_RANK];
    for (int d = 0; d < r; d++) {
        from[2 * d] = rep[d];
        to[2 * d] = 1;
        from[2 * d + 1] = to[2 * d + 1] = x->shape.dim[d];
    }
    cg_put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", cg_ints(from, 2 * r), cg_ints(to, 2 * r));
    cg_put(b, "      k_reduce_sum_to_%s(%s, %s, %d, xs, ys); }\n", sfx(x->dtype), cg_ptr(cg, n->out[0]),
        cg_ptr(cg, n->in[0]), 2 * r);
}

static void emit_where_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Shape *y = &val(g, n->in[0])->shape;
    int64_t sc[MAX_RANK];
    tensor_bcast(&val(g, n->in[1])->shape, y, sc);
    int side = (int)ir_attr_i(n, "side", 0);
    const char *dx = cg_ptr(cg, n->out[0]);
    cg_put(b, "    { static const int64_t sh[] = %s, sc[] = %s;\n", cg_ints(y->dim, y->rank), cg_ints(sc, y->rank));
    cg_put(b, "      k_where_grad_%s(%s, %s, %s, %s, %d, sh, sc); }\n", sfx(val(g, n->out[0])->dtype),
        side ? "NULL" : dx, side ? dx : "NULL", cg_ptr(cg, n->in[1]), cg_ptr(cg, n->in[0]), y->rank);
}

/* y = 0 everywhere */
static void emit_zero(Cg *cg, Buf *b, int y)
{
    const Graph *g = cg->g;
    const Value *v = val(g, y);
    if (dtype_is_float(v->dtype))
        cg_put(b, "    k_fill_%s(%s, 0.0, %lld);\n", sfx(v->dtype), cg_ptr(cg, y), (long long)value_numel(g, y));
    else
        cg_put(b, "    rt_memset(%s, 0, %lld);\n", cg_ptr(cg, y),
            (long long)(value_numel(g, y) * (int64_t)dtype_size(v->dtype)));
}

static void emit_range(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Value *s = val(g, n->in[0]), *d = val(g, n->in[2]);
    int64_t len = tensor_range_len(g, n);
    if (s->dtype == DT_I64)
        cg_put(b, "    k_range_i64(%s, %lld, %lld, %lld);\n", cg_ptr(cg, n->out[0]),
            (long long)tensor_const_i(s, 0), (long long)tensor_const_i(d, 0), (long long)len);
    else if (dtype_is_float(s->dtype))
        cg_put(b, "    k_range_%s(%s, %s, %s, %lld);\n", sfx(s->dtype), cg_ptr(cg, n->out[0]),
            num(tensor_const_f(s, 0)), num(tensor_const_f(d, 0)), (long long)len);
    else
        die("Range of %s reached codegen (fold evaluates it)", dtype_name(s->dtype));
}

static void emit_trilu(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Value *x = val(g, n->in[0]);
    int r = x->shape.rank;
    int64_t rows = x->shape.dim[r - 2], cols = x->shape.dim[r - 1], cnt = shape_numel(&x->shape);
    cg_put(b, "    k_trilu(%d, %d, %s, %s, %lld, %lld, %lld, %lld);\n", (int)dtype_size(x->dtype),
        (int)ir_attr_i(n, "upper", 1), cg_ptr(cg, n->out[0]), cg_ptr(cg, n->in[0]),
        (long long)(rows && cols ? cnt / (rows * cols) : 0), (long long)rows, (long long)cols,
        (long long)ir_attr_i(n, "k", 0));
}

int cg_tensor(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int y = n->nout ? n->out[0] : -1;
    const Value *vy = y >= 0 ? val(g, y) : NULL;
    switch (n->op) {
    case OP_Squeeze: case OP_Unsqueeze: case OP_Flatten: emit_view(cg, b, n); return 1;
    case OP_Concat: case OP_Split: case OP_Slice: case OP_Expand: case OP_Tile:
        emit_moves(cg, b, n);
        return 1;
    case OP_Pad:
        if (dtype_is_float(vy->dtype))
            emit_pad(cg, b, n, 0);
        else
            emit_moves(cg, b, n);
        return 1;
    case OP_ConstantOfShape:
        if (dtype_is_float(vy->dtype))
            cg_put(b, "    k_fill_%s(%s, %s, %lld);\n", sfx(vy->dtype), cg_ptr(cg, y), num(tensor_value(g, n)),
                (long long)value_numel(g, y));
        else
            emit_moves(cg, b, n);
        return 1;
    case OP_Range: emit_range(cg, b, n); return 1;
    case OP_Gather: case OP_GatherGrad: emit_gather(cg, b, n); return 1;
    case OP_GatherElements: case OP_GatherElementsGrad: emit_gather_elements(cg, b, n); return 1;
    case OP_NDIndex: emit_nd_index(cg, b, n); return 1;
    case OP_Where: case OP_Equal: case OP_Less: case OP_Greater: case OP_LessOrEqual:
    case OP_GreaterOrEqual:
        emit_bcast(cg, b, n);
        return 1;
    case OP_Not:
        cg_put(b, "    k_not(%s, %s, %lld);\n", cg_ptr(cg, y), cg_ptr(cg, n->in[0]), (long long)value_numel(g, y));
        return 1;
    case OP_Cast:
        cg_put(b, "    k_cast(%s, %s, %s, %s, %lld);\n", cg_kdt(vy->dtype), cg_ptr(cg, y),
            cg_kdt(val(g, n->in[0])->dtype), cg_ptr(cg, n->in[0]), (long long)value_numel(g, y));
        return 1;
    case OP_Trilu: emit_trilu(cg, b, n); return 1;
    case OP_Zeros: emit_zero(cg, b, y); return 1;
    case OP_SliceGrad:
        emit_zero(cg, b, y);
        emit_moves(cg, b, n);
        return 1;
    case OP_PadGrad: emit_pad(cg, b, n, 1); return 1;
    case OP_TileGrad: emit_tile_grad(cg, b, n); return 1;
    case OP_WhereGrad: emit_where_grad(cg, b, n); return 1;
    case OP_Shape: case OP_Size: case OP_CastLike:
        die("%s node '%s' reached codegen (fold evaluates or rewrites it)", op_info[n->op].name, n->name);
    default: return 0;
    }
}
