/* grad_tensor.c — gradient rules of the tensor family (shapes, indexing,
 * data movement, comparisons).
 *
 * Data movement runs backwards as data movement: a view's gradient is a
 * view (Reshape), Concat's is a Slice of dy per input, Split's a Concat of
 * the outputs' gradients (Zeros for an unused output), Expand's a
 * ReduceSumTo.  Where a forward op drops or repeats elements, one of fsdpc's
 * own ops does the scatter (ops.def): SliceGrad writes dy into a zeroed dx,
 * GatherGrad adds rows (repeated indices sum), GatherElementsGrad elements, PadGrad and TileGrad sum the
 * copies, WhereGrad routes dy by the condition.  Those carry the forward
 * node's attributes and are created with dx typed like the forward input.
 *
 * An embedding's padding_idx (Value.pad_row, from the export's metadata):
 * the lookup's scatter-add is multiplied by a [rows, 1] mask with 0 at that
 * row, so the lookup never trains it, as in PyTorch.
 *
 * GatherGrad and GatherElementsGrad are also the scatters of ScatterND and
 * ScatterElements (passes/expand.c): their gradient gathers dy back.
 *
 * Indices, conditions, shapes and comparisons carry no gradient (diff bits 0
 * in ops.def), so these rules never see them.
 */
#include "tensor.h"

#include <string.h>

/* A node op(in) named NAME.suffix whose output is typed like value `like`
 * (or by its shape rule when like < 0); with the forward node's attributes
 * if copy.  Returns the output. */
static int node(GradCtx *cx, Op op, const char *suffix, int nin, const int *in, int like, int copy)
{
    Graph *g = cx->g;
    const char *nm = ir_fmt("%s.%s", cx->name, suffix);
    int y = like >= 0 ? ir_like(g, ir_fmt("%s.out", nm), like, R_ACT)
                      : ir_value(g, ir_fmt("%s.out", nm), DT_UNDEF, NULL, R_ACT);
    int k = ir_node(g, op, nm, nin, in, 1, &y);
    for (int i = 0; copy && i < cx->n->nattr; i++)
        *ir_attr_add(g, k, cx->n->attr[i].name, cx->n->attr[i].kind) = cx->n->attr[i];
    if (like < 0)
        shape_node(g, k);
    return y;
}

/* dy[lo:hi] along axis ax */
static int slice_of(GradCtx *cx, int dy, int ax, int64_t lo, int64_t hi, int i)
{
    Graph *g = cx->g;
    const char *nm = ir_fmt("%s.in%d", cx->name, i);
    int y = ir_value(g, ir_fmt("%s.out", nm), DT_UNDEF, NULL, R_ACT);
    int k = ir_node1(g, OP_Slice, nm, dy, -1, y);
    ir_attr_ints_add(g, k, "starts", &(int64_t){lo}, 1);
    ir_attr_ints_add(g, k, "ends", &(int64_t){hi}, 1);
    ir_attr_ints_add(g, k, "axes", &(int64_t){ax}, 1);
    shape_node(g, k);
    return y;
}

static void concat_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    Graph *g = cx->g;
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), g->val[n->out[0]].shape.rank, "axis");
    int64_t off = 0;
    for (int i = 0; i < n->nin; i++) {
        int64_t len = g->val[n->in[i]].shape.dim[ax];
        if (cx->need[i])
            cx->d[i] = slice_of(cx, cx->dys[0], ax, off, off + len, i);
        off += len;
    }
}

static void split_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    Graph *g = cx->g;
    int *in = ir_alloc(sizeof(int) * (size_t)(n->nout + 1));
    for (int k = 0; k < n->nout; k++) {
        in[k] = cx->dys[k];
        if (in[k] < 0) { /* an output nothing differentiable reads */
            in[k] = ir_like(g, ir_fmt("%s.zero%d", cx->name, k), n->out[k], R_ACT);
            ir_node(g, OP_Zeros, ir_fmt("%s.zero%d", cx->name, k), 0, NULL, 1, &in[k]);
        }
    }
    int y = ir_value(g, ir_fmt("%s.out", cx->name), DT_UNDEF, NULL, R_ACT);
    int k = ir_node(g, OP_Concat, cx->name, n->nout, in, 1, &y);
    ir_attr_add(g, k, "axis", A_INT)->i = ir_attr_i(n, "axis", 0);
    shape_node(g, k);
    cx->d[0] = y;
}

static void where_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    for (int i = 1; i <= 2; i++) {
        if (!cx->need[i])
            continue;
        int in[2] = {cx->dys[0], cx->n->in[0]};
        int t = node(cx, OP_WhereGrad, i == 1 ? "x" : "y", 2, in, cx->dys[0], 0);
        ir_attr_add(g, g->val[t].producer, "side", A_INT)->i = i - 1;
        cx->d[i] = ad_sum_to(g, ir_fmt("%s.%s.sum", cx->name, i == 1 ? "x" : "y"), t, cx->n->in[i]);
    }
}

static int cast_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    int dy = cx->dys[0], x = cx->n->in[0];
    if (g->val[dy].dtype == g->val[x].dtype)
        return dy;
    int y = ir_value(g, ir_fmt("%s.out", cx->name), DT_UNDEF, NULL, R_ACT);
    int k = ir_node1(g, OP_Cast, cx->name, dy, -1, y);
    ir_attr_add(g, k, "to", A_INT)->i = tensor_to_onnx(g->val[x].dtype);
    shape_node(g, k);
    return y;
}

/* Gather's scatter-add dx, times a [rows, 1] mask with a 0 at the data's pad_row when the data is an
 * embedding weight whose padding_idx the export recorded and the lookup is along axis 0: PyTorch's
 * nn.Embedding gives that row no gradient from its lookups (other uses of a tied weight still do). */
static int pad_masked(GradCtx *cx, int dx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    const Value *w = &g->val[n->in[0]];
    if (n->op != OP_Gather || w->pad_row < 0 || tensor_axis(g, n, ir_attr_i(n, "axis", 0), w->shape.rank, "axis"))
        return dx;
    int64_t rows = w->shape.dim[0];
    void *m = ir_alloc((size_t)rows * dtype_size(w->dtype));
    for (int64_t r = 0; r < rows; r++)
        dtype_set_f(m, r, w->dtype, r != w->pad_row);
    Shape s = {2, {rows, 1}};
    int mask = ir_const(g, ir_fmt("%s.pad_mask", cx->name), w->dtype, &s, m);
    return ad_emit(g, OP_Mul, ir_fmt("%s.pad", cx->name), dx, mask);
}

int grad_tensor(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    int dy = cx->dys[0], x = n->in[0];
    switch (n->op) {
    case OP_Squeeze: case OP_Unsqueeze: case OP_Flatten:
        cx->d[0] = ad_reshape(g, cx->name, dy, &g->val[x].shape);
        return 1;
    case OP_Concat: concat_grad(cx); return 1;
    case OP_Split: split_grad(cx); return 1;
    case OP_Slice: cx->d[0] = node(cx, OP_SliceGrad, "scatter", 1, &dy, x, 1); return 1;
    case OP_Gather: case OP_GatherElements: {
        int in[2] = {dy, n->in[1]};
        cx->d[0] = pad_masked(cx, node(cx, n->op == OP_Gather ? OP_GatherGrad : OP_GatherElementsGrad, "scatter", 2,
                                       in, x, 1));
        return 1;
    }
    case OP_GatherGrad: case OP_GatherElementsGrad: { /* a scatter-add (ScatterND, ScatterElements): gather dy back */
        int in[2] = {dy, n->in[1]};
        cx->d[0] = node(cx, n->op == OP_GatherGrad ? OP_Gather : OP_GatherElements, "gather", 2, in, -1, 1);
        return 1;
    }
    case OP_Expand: cx->d[0] = ad_sum_to(g, cx->name, dy, x); return 1;
    case OP_Tile: cx->d[0] = node(cx, OP_TileGrad, "sum", 1, &dy, x, 1); return 1;
    case OP_Pad: cx->d[0] = node(cx, OP_PadGrad, "sum", 1, &dy, x, 1); return 1;
    case OP_Where: where_grad(cx); return 1;
    case OP_Cast: cx->d[0] = cast_grad(cx); return 1;
    case OP_Trilu: cx->d[0] = node(cx, OP_Trilu, "mask", 1, &dy, dy, 1); return 1;
    default: return 0;
    }
}
