/* fold.c — canonicalise the imported graph and compute at compile time
 * everything that does not depend on data.
 *
 * requires: the frontend's graph (Constant nodes already turned into values).
 * ensures:  the nodes are in program order and each was shaped (shape_node)
 *           when the sweep reached it;
 *           no Gemm remains: Y = alpha op(A) op(B) + beta C becomes
 *           MatMul(transA, transB) [→ Scale alpha] [→ Add (Scale beta) C]
 *           (compose.c); no sequence remains: each is resolved into the
 *           tensors it holds (seq.c);
 *           no MatMul reads a Transpose of the last two axes (it reads the
 *           Transpose's input with its transA/transB flipped), nor, as its
 *           sole reader, a Transpose sending the last axis to the
 *           second-to-last place (it reads a Transpose keeping the last
 *           axis, flag flipped), and no such Transpose is left unread; no
 *           Dropout that drops nothing (ratio 0 or not training, mask
 *           unread) remains: its readers read its input;
 *           Clip's min/max and the tensor family's shape-deciding inputs are
 *           attributes (ir/rules/tensor.h); CastLike is a Cast; comparisons
 *           and Gather's / GatherElements' indices read float32, float64 or int64 (int32 and
 *           bool inputs get a Cast to int64); no Concat has more than
 *           GRAD_MAX_IN inputs (longer ones nest), nor one (an Identity); composite ops are
 *           expanded (RMSNormalization; IsNaN, IsInf, And, Or, Xor into
 *           comparisons, Not and Where); Min / Max take two inputs (longer
 *           ones chain, compose.c); Mod with fmod 1 is FMod; integer arithmetic
 *           runs on int64 (intarith.c: int32 through Casts, Neg/Abs/Sign
 *           as comparisons, an integer Pow in float64, a float Pow's
 *           exponent in the base's dtype); no node but Cast, Shape and
 *           Size reads a narrow dtype (int8 .. uint64, float16, bfloat16:
 *           others read it cast to int64 / float32 and their outputs are
 *           cast back, intarith.c); a 1-D Conv, ConvTranspose or
 *           pooling is the 2-D one over a height of 1 (lift1d.c); Sum,
 *           Mean, ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum,
 *           ReduceLogSumExp and OneHot are written with Add, Scale,
 *           ReduceSum, Where..., ConvTranspose as a ConvGrad computing dx
 *           (compose.c);
 *           every node whose inputs are all constants — Shape and Size
 *           always, since shapes are static — is evaluated and its outputs
 *           become constants, unless an input is a float initializer (a
 *           parameter, which training changes) or an output would hold more
 *           than FOLD_MAX elements.
 *
 * One sweep in program order: each node is first canonicalised (which may
 * put new nodes before it), then either evaluated or shaped.  Shaping as we
 * go is what lets torch.onnx's shape arithmetic vanish: with dims bound by
 * --dim, Shape(x) is a constant, so the Gather → Unsqueeze → Concat feeding
 * x.view(B, T, nh, hs)'s Reshape are too.
 *
 * This file is the sweep and the canonicalisation of single nodes (canon_op's
 * dispatch), and the evaluation.  The rewrites into other ops live beside
 * it, all through fold.h: the expansions of composite ops
 * (RMSNormalization .. RotaryEmbedding, the scatters, Resize, Einsum,
 * Attention) in expand.c, recurrent.c and gridsample.c; the compositions
 * (Gemm, the variadic chains, the reductions, OneHot, ConvTranspose ...) in
 * compose.c; sequences in seq.c; integer and narrow dtypes in intarith.c;
 * 1-D and 3-D convolutions and pooling in lift1d.c and lift3d.c.
 *
 * Evaluation runs the reference kernels (kernels/c) that the executable
 * calls, through the plans codegen emits (Move lists of ir/rules/tensor.h),
 * so a folded constant holds the bytes the step would have computed.
 */
#include "ir.h"
#include "fold.h"
#include "kernels.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <math.h>
#include <string.h>

enum { FOLD_MAX = 1 << 20 };   /* elements of the largest folded output */

static void visit(Sweep *s, int id) { fold_visit(s, id); }

/* ---- attributes --------------------------------------------------------- */

Attr *fold_set_attr(Graph *g, int id, const char *name, AttrKind k)
{
    Node *n = &g->node[id];
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attr[i].name, name)) {
            n->attr[i].kind = k;
            return &n->attr[i];
        }
    return ir_attr_add(g, id, name, k);
}

/* ---- MatMul of a transposed operand ---------------------------------------- */

/* The node of the sweep so far that writes value v, or -1. */
static int sweep_producer(const Sweep *s, int v)
{
    for (int i = s->n - 1; i >= 0; i--) {
        const Node *n = &s->g->node[s->order[i]];
        for (int k = 0; k < n->nout; k++)
            if (n->out[k] == v)
                return s->order[i];
    }
    return -1;
}

/* Transpose t's perm into p (ONNX's default: the axes reversed); its rank, or 0 when the perm is malformed. */
static int transpose_perm(const Graph *g, const Node *t, int64_t p[MAX_RANK])
{
    int r = g->val[t->in[0]].shape.rank;
    const Attr *a = ir_attr(t, "perm");
    if (r < 2 || r > MAX_RANK || (a && a->n != r))
        return 0;
    for (int i = 0; i < r; i++)
        p[i] = a ? a->ints[i] : r - 1 - i;
    return r;
}

/* Is node id the only reader of value v (and v no output)? */
static int sole_reader(const Graph *g, int v, int id)
{
    if (ir_wanted(g, v))
        return 0;
    for (int i = 0; i < g->nnode; i++)
        for (int k = 0; k < g->node[i].nin; k++)
            if (g->node[i].in[k] == v && i != id)
                return 0;
    return 1;
}

/* A MatMul operand that is a Transpose sending X's last axis to the
 * second-to-last place, Transpose(X, p) with p[r-2] = r-1, is Transpose(X, p')
 * with its last two axes exchanged, p' = p with p[r-2] and p[r-1] swapped:
 * the MatMul reads Transpose(X, p') with the operand's transpose flag flipped.
 * When p' is the identity (the Transpose exchanged the last two axes and
 * nothing else) it reads X itself.  This saves a copy, and it matters for
 * parameters: training exports keep nn.Linear's W.t() as Transpose(W), whose
 * output the backward reads too, so the copy of the gathered W would live
 * from the forward to the backward and keep the unit unsharded in between.
 * Otherwise Transpose(X, p') keeps X's last axis last, so it copies whole
 * rows where Transpose(X, p) moved elements one at a time: attention's keys,
 * k^T = Transpose(k [B, T, H, D], (0, 2, 3, 1)), become Transpose(k,
 * (0, 2, 1, 3)) read with transB (fused attention's krow), and the
 * gradient's transpose back is a copy of rows too.  A Transpose left without
 * readers is dropped at the end of the sweep. */
void fold_matmul_operands(Sweep *s, int id)
{
    Graph *g = s->g;
    for (int k = 0; k < 2; k++) {
        int p = sweep_producer(s, g->node[id].in[k]);
        int64_t perm[MAX_RANK];
        int r = p >= 0 && g->node[p].op == OP_Transpose ? transpose_perm(g, &g->node[p], perm) : 0;
        if (!r || perm[r - 2] != r - 1)
            continue;
        perm[r - 2] = perm[r - 1];
        perm[r - 1] = r - 1;
        int identity = 1, x = g->node[p].in[0];
        for (int i = 0; i < r; i++)
            identity &= perm[i] == i;
        if (!identity && !sole_reader(g, g->node[p].out[0], id))
            continue; /* Transpose(X, p) stays for its other readers: a second copy would cost more */
        if (!identity) { /* Transpose(X, p'), visited before node id */
            const int n = s->nnew++;
            int y = ir_value(g, ir_fmt("%s.rows.%d", g->val[g->node[p].out[0]].name, n), DT_UNDEF, NULL, R_ACT);
            int t = ir_node1(g, OP_Transpose, ir_fmt("%s.rows.%d", g->node[p].name, n), x, -1, y);
            ir_attr_ints_add(g, t, "perm", perm, r);
            fold_visit(s, t);
            x = y;
        }
        const char *flag = k ? "transB" : "transA";
        int64_t f = ir_attr_i(&g->node[id], flag, 0);
        g->node[id].in[k] = x;
        fold_set_attr(g, id, flag, A_INT)->i = !f;
    }
}

/* ---- inputs that must be constants -------------------------------------- */

const Value *fold_const_in(Graph *g, const Node *n, int i, const char *what)
{
    const Value *x = &g->val[n->in[i]];
    if (x->role != R_CONST || !ir_data(g, n->in[i]))
        node_fatal(g, n, "the %s input '%s' must be a constant; fsdpc has static shapes (it may "
                   "depend only on constants, integer initializers and the shapes of values)",
                   what, ir_q(x->name));
    return x;
}

/* A scalar constant input as a double, for attributes. */
static double const_scalar(Graph *g, const Node *n, int v, const char *what)
{
    const Value *x = &g->val[v];
    if (x->role != R_CONST || shape_numel(&x->shape) != 1 || !ir_data(g, v))
        node_fatal(g, n, "%s '%s' must be a constant scalar", what, ir_q(x->name));
    return tensor_const_f(x, 0);
}

static void clip_attrs(Graph *g, int id)
{
    Node n = g->node[id];
    for (int i = 1; i < n.nin && i < 3; i++)
        if (n.in[i] >= 0)
            ir_attr_add(g, id, i == 1 ? "min" : "max", A_FLOAT)->f =
                const_scalar(g, &n, n.in[i], i == 1 ? "min" : "max");
    g->node[id].nin = 1;
}

/* Which trailing inputs of an op become attributes, and how many of them ONNX requires. */
typedef struct {
    Op op;
    int from, required;
    const char *name[4];
} ConstInputs;

static const ConstInputs const_inputs[] = {
    {OP_Squeeze, 1, 0, {"axes"}},
    {OP_Unsqueeze, 1, 1, {"axes"}},
    {OP_Slice, 1, 2, {"starts", "ends", "axes", "steps"}},
    {OP_Split, 1, 0, {"split"}},
    {OP_Expand, 1, 1, {"shape"}},
    {OP_Tile, 1, 1, {"repeats"}},
    {OP_Pad, 1, 1, {"pads", "value", "axes"}},
    {OP_ReduceMean, 1, 0, {"axes"}},
    {OP_ReduceSum, 1, 0, {"axes"}},
    {OP_ReduceMax, 1, 0, {"axes"}},
    {OP_ReduceMin, 1, 0, {"axes"}},
    {OP_ReduceProd, 1, 0, {"axes"}},
    {OP_ReduceL1, 1, 0, {"axes"}},
    {OP_ReduceL2, 1, 0, {"axes"}},
    {OP_ReduceSumSquare, 1, 0, {"axes"}},
    {OP_ReduceLogSum, 1, 0, {"axes"}},
    {OP_ReduceLogSumExp, 1, 0, {"axes"}},
    {OP_Trilu, 1, 0, {"k"}},
    {OP_CumSum, 1, 1, {"axis"}},
    {OP_CumProd, 1, 1, {"axis"}},
    {OP_TopK, 1, 1, {"k"}},
    {OP_CenterCropPad, 1, 1, {"shape"}},
    {OP_AffineGrid, 1, 1, {"size"}},
    {OP_HannWindow, 0, 1, {"size"}},
    {OP_HammingWindow, 0, 1, {"size"}},
    {OP_BlackmanWindow, 0, 1, {"size"}},
    {OP_ConstantOfShape, 0, 1, {"shape"}},
};

static void to_attr(Graph *g, int id, const char *name, int v)
{
    const Node *n = &g->node[id];
    const Value *x = &g->val[v];
    int64_t cnt = shape_numel(&x->shape);
    if (!strcmp(name, "value")) { /* Pad's constant_value: empty means absent */
        if (cnt)
            fold_set_attr(g, id, name, A_TENSOR)->t = v;
        return;
    }
    if (x->dtype != DT_I64 && x->dtype != DT_I32)
        node_fatal(g, n, "the %s input '%s' must be int64, not %s", name, ir_q(x->name), dtype_name(x->dtype));
    if (!strcmp(name, "k") || !strcmp(name, "axis")) {
        if (cnt != 1)
            node_fatal(g, n, "the %s input '%s' must hold one value", name, ir_q(x->name));
        fold_set_attr(g, id, name, A_INT)->i = tensor_const_i(x, 0);
        return;
    }
    if (x->shape.rank > 1 || cnt > (1 << 20))
        node_fatal(g, n, "the %s input '%s' must be a 1-D list", name, ir_q(x->name));
    Attr *a = fold_set_attr(g, id, name, A_INTS);
    a->n = (int)cnt;
    a->ints = ir_alloc(sizeof(int64_t) * (size_t)(cnt + 1));
    for (int64_t i = 0; i < cnt; i++)
        a->ints[i] = tensor_const_i(x, i);
}

static void inputs_to_attrs(Graph *g, int id, const ConstInputs *c)
{
    for (int i = 0; i < 4 && c->name[i]; i++) {
        const Node *n = &g->node[id];
        int k = c->from + i, present = k < n->nin && n->in[k] >= 0;
        if (!present && i < c->required && !ir_attr(n, c->name[i]))
            node_fatal(g, n, "needs its %s input", c->name[i]);
        if (present) {
            fold_const_in(g, n, k, c->name[i]);
            to_attr(g, id, c->name[i], n->in[k]);
        }
    }
    if (g->node[id].nin > c->from)
        g->node[id].nin = c->from;
}

/* Pad-18's axes: pads lists begins then ends for those axes only; make it
 * the pads of every axis (0 for the others), as codegen reads them */
static void pad_axes(Graph *g, int id)
{
    const Node *n = &g->node[id];
    const Attr *ax = ir_attr(n, "axes"), *p = ir_attr(n, "pads");
    if (!ax)
        return;
    const Value *x = &g->val[n->in[0]];
    if (x->dtype == DT_UNDEF)
        node_fatal(g, n, "Pad with axes needs its input's rank, which is not known here");
    int r = x->shape.rank, na = ax->n;
    if (!p || p->kind != A_INTS || p->n != 2 * na)
        node_fatal(g, n, "pads must list 2 values per axis of axes (%d), found %d", 2 * na, p ? p->n : 0);
    int64_t full[2 * MAX_RANK] = {0};
    char seen[MAX_RANK] = {0};
    for (int i = 0; i < na; i++) {
        int64_t a = ax->ints[i] < 0 ? ax->ints[i] + r : ax->ints[i];
        if (a < 0 || a >= r || seen[a]++)
            node_fatal(g, n, "axes lists axis %lld, outside the input's rank %d or twice", (long long)ax->ints[i], r);
        full[a] = p->ints[i];
        full[r + a] = p->ints[na + i];
    }
    Attr *np = fold_set_attr(g, id, "pads", A_INTS);
    np->n = 2 * r;
    np->ints = ir_alloc(sizeof(int64_t) * (size_t)(2 * r));
    memcpy(np->ints, full, sizeof(int64_t) * (size_t)(2 * r));
    Node *m = &g->node[id]; /* axes is spent: drop it */
    for (int i = 0; i < m->nattr; i++)
        if (!strcmp(m->attr[i].name, "axes")) {
            memmove(&m->attr[i], &m->attr[i + 1], sizeof *m->attr * (size_t)(m->nattr - i - 1));
            m->nattr--;
            break;
        }
}

/* ---- inserted nodes ------------------------------------------------------- */

/* Input k of node id read through a Cast to int64 (comparisons, indices). */
static void cast_input(Sweep *s, int id, int k)
{
    Graph *g = s->g;
    int x = g->node[id].in[k];
    if (x < 0 || (g->val[x].dtype != DT_I32 && g->val[x].dtype != DT_BOOL))
        return;
    const char *nm = ir_fmt("%s/cast%d", g->node[id].name, k);
    int y = ir_value(g, ir_fmt("%s.%d", nm, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, OP_Cast, nm, x, -1, y);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(DT_I64);
    g->node[id].in[k] = y;
    visit(s, c);
}

/* A Concat of more than GRAD_MAX_IN inputs (autodiff's limit) becomes nested
 * Concats of at most GRAD_MAX_IN. */
static void nest_concat(Sweep *s, int id)
{
    Graph *g = s->g;
    while (g->node[id].nin > GRAD_MAX_IN) {
        Node n = g->node[id];
        const char *nm = ir_fmt("%s/nest%d", n.name, s->nnew);
        int y = ir_value(g, ir_fmt("%s.%d", nm, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int c = ir_node(g, OP_Concat, nm, GRAD_MAX_IN, n.in, 1, &y);
        if (ir_attr(&n, "axis"))
            ir_attr_add(g, c, "axis", A_INT)->i = ir_attr_i(&n, "axis", 0);
        visit(s, c);
        int *in = ir_alloc(sizeof(int) * (size_t)(n.nin - GRAD_MAX_IN + 2));
        in[0] = y;
        memcpy(in + 1, n.in + GRAD_MAX_IN, sizeof(int) * (size_t)(n.nin - GRAD_MAX_IN));
        g->node[id].in = in;
        g->node[id].nin = n.nin - GRAD_MAX_IN + 1;
    }
}

static void castlike(Graph *g, int id)
{
    Node *n = &g->node[id];
    if (g->val[n->in[1]].dtype == DT_UNDEF)
        return; /* reported by the shape pass */
    int64_t to = tensor_to_onnx(g->val[n->in[1]].dtype);
    n->op = OP_Cast;
    n->nin = 1;
    fold_set_attr(g, id, "to", A_INT)->i = to;
}

/* Rewrite node id into the form later passes expect, then visit it. */
/* Pow(x, 2) of a float x becomes Mul(x, x): the same bits (x * x is the one rounding of x's square, as a
 * correctly rounded pow's) and the same gradient, 2 x dy, without pow's cost per element (a Hugging Face
 * Llama's RMSNorm squares its input: the Pow's gradient took 15 % of its bf16 step's traced time). */
static void pow_square(Graph *g, int id)
{
    Node *n = &g->node[id];
    const Value *x = &g->val[n->in[0]], *e = &g->val[n->in[1]];
    if (n->nin != 2 || !dtype_is_float(x->dtype) || e->role != R_CONST || shape_numel(&e->shape) != 1 ||
        e->shape.rank > x->shape.rank || !ir_data(g, n->in[1]) || tensor_const_f(e, 0) != 2)
        return;
    n->op = OP_Mul, n->in[1] = n->in[0];
}

static void canon_op(Sweep *s, int id)
{
    Graph *g = s->g;
    if (seq_resolve(s, id))
        return;
    Op op = g->node[id].op;
    for (size_t i = 0; i < sizeof const_inputs / sizeof *const_inputs; i++)
        if (const_inputs[i].op == op)
            inputs_to_attrs(g, id, &const_inputs[i]);
    switch (op) {
    case OP_Gemm: compose_gemm(s, id); return;
    case OP_RMSNormalization: expand_rmsnorm(s, id); return;
    case OP_IsNaN: case OP_IsInf: case OP_And: case OP_Or: case OP_Xor: expand_logical(s, id); return;
    case OP_ArgMax: case OP_ArgMin: expand_argmax(s, id); return;
    case OP_TopK: expand_topk(s, id); return;
    case OP_RNN: case OP_GRU: case OP_LSTM: expand_recurrent(s, id); return;
    case OP_GridSample: expand_gridsample(s, id); return;
    case OP_CumSum: case OP_CumProd: expand_cumsum(s, id); return;
    case OP_GatherND: cast_input(s, id, 1); expand_gather_nd(s, id); return;
    case OP_ScatterND: case OP_ScatterElements: cast_input(s, id, 1); expand_scatter(s, id); return;
    case OP_Resize: expand_resize(s, id); return;
    case OP_Einsum: expand_einsum(s, id); return;
    case OP_Attention: expand_attention(s, id); return;
    case OP_RotaryEmbedding: expand_rope(s, id); return;
    case OP_Sum: case OP_Mean: /* Mean: canon scales the sum */
        g->node[id].op = OP_Add;
        if (compose_variadic(s, id))
            return;
        break;
    case OP_Min: case OP_Max:
        if (compose_variadic(s, id))
            return;
        break;
    case OP_ReduceL1: case OP_ReduceL2: case OP_ReduceSumSquare: case OP_ReduceLogSum: case OP_ReduceLogSumExp: {
        int shift, y = compose_reduce(s, id, &shift);
        visit(s, id);
        compose_reduce_end(s, id, op, y, shift);
        return;
    }
    case OP_OneHot: compose_onehot(s, id); return;
    case OP_ConvTranspose: compose_convt(s, id); return;
    case OP_LpPool: compose_lppool(s, id); return;
    case OP_Hardmax: compose_hardmax(s, id); return;
    case OP_LpNormalization: compose_lpnorm(s, id); return;
    case OP_Swish: compose_swish(s, id); return;
    case OP_PRelu: compose_prelu(s, id); return;
    case OP_Shrink: compose_shrink(s, id); return;
    case OP_GlobalMaxPool: compose_global_max(s, id); return;
    case OP_EyeLike: compose_eyelike(s, id); return;
    case OP_SpaceToDepth: case OP_DepthToSpace: compose_space_depth(s, id); return;
    case OP_InstanceNormalization: compose_instance_norm(s, id); return;
    case OP_GroupNormalization: compose_group_norm(s, id); return;
    case OP_CenterCropPad: compose_center_crop_pad(s, id); return;
    case OP_AffineGrid: compose_affine_grid(s, id); return;
    case OP_SwiGLU: compose_swiglu(s, id); return;
    case OP_HannWindow: case OP_HammingWindow: case OP_BlackmanWindow: compose_window(s, id); return;
    case OP_LRN: compose_lrn(s, id); return;
    case OP_ReverseSequence: compose_reverse_sequence(s, id); return;
    case OP_Mod:
        if (ir_attr_i(&g->node[id], "fmod", 0))
            g->node[id].op = OP_FMod;
        break;
    case OP_MatMul: fold_matmul_operands(s, id); break;
    case OP_Neg: case OP_Abs: case OP_Sign:
        if (int_unary(s, id))
            return;
        break;
    case OP_Pow:
        if (int_pow(s, id))
            return;
        pow_square(g, id);
        break;
    case OP_Clip: clip_attrs(g, id); break;
    case OP_Pad: pad_axes(g, id); break;
    case OP_CastLike: castlike(g, id); break;
    case OP_Gather: case OP_GatherElements: cast_input(s, id, 1); break;
    case OP_Concat: /* of one input (GPT-2's past keys and values, none in training): that input, a view */
        if (g->node[id].nin == 1)
            g->node[id].op = OP_Identity, g->node[id].nattr = 0;
        else
            nest_concat(s, id);
        break;
    case OP_Equal: case OP_Less: case OP_Greater: case OP_LessOrEqual: case OP_GreaterOrEqual:
        cast_input(s, id, 0);
        cast_input(s, id, 1);
        break;
    default: break;
    }
    visit(s, id);
}

/* A MatMul with a 1-D operand, as numpy: a [K] first operand is [1, K], a [K] second one [K, 1], and the dim
 * added is squeezed from the result.  Before the node's canonicalisation: the operands unsqueezed, the node
 * writing a new value; returns the node's own output (-1: no 1-D operand), *sq the result's dims to squeeze. */
static int matmul_vec(Sweep *s, int id, int64_t sq[2], int *nsq)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    *nsq = 0;
    if (n->op != OP_MatMul || n->nin != 2 || n->in[0] < 0 || n->in[1] < 0)
        return -1;
    int ra = g->val[n->in[0]].shape.rank, rb = g->val[n->in[1]].shape.rank;
    if (g->val[n->in[0]].dtype == DT_UNDEF || g->val[n->in[1]].dtype == DT_UNDEF || (ra != 1 && rb != 1) || !ra ||
        !rb)
        return -1;
    int pa = ra == 1 ? 2 : ra, pb = rb == 1 ? 2 : rb, r = pa > pb ? pa : pb; /* the promoted result's rank */
    for (int k = 0; k < 2; k++) {
        if ((k ? rb : ra) != 1)
            continue;
        int64_t ax = k; /* [1, K] or [K, 1] */
        const char *name = ir_fmt("%s/%s", g->node[id].name, k ? "column" : "row");
        int v = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int c = ir_node1(g, OP_Unsqueeze, name, g->node[id].in[k], -1, v);
        ir_attr_ints_add(g, c, "axes", &ax, 1);
        visit(s, c);
        g->node[id].in[k] = v;
        sq[(*nsq)++] = k ? r - 1 : r - 2;
    }
    int y = g->node[id].out[0];
    g->node[id].out[0] = ir_value(g, ir_fmt("%s/2d.%d", g->node[id].name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return y;
}

/* As canon_op, with narrow dtypes computed in wide ones and int32
 * arithmetic in int64 (intarith.c),
 * 1-D convolutions and pooling as 2-D ones with explicit pads (lift1d.c),
 * 3-D ones composed of 2-D ones (lift3d.c)
 * and 1-D MatMul operands as matrices (matmul_vec). */
static void canon(Sweep *s, int id)
{
    int64_t sq[2];
    Narrowing nw;
    int narrow = narrow_begin(s, id, &nw);
    int nsq, vec = matmul_vec(s, id, sq, &nsq);
    int orig[2], nout = 0, lifted = lift_1d(s, id, orig, &nout);
    explicit_pads(s, id);
    if (lift_3d(s, id)) { /* its nodes replace it */
        if (narrow)
            narrow_end(s, id, &nw);
        return;
    }
    int y32 = int_widen(s, id), nin = s->g->node[id].nin;
    int mean = s->g->node[id].op == OP_Mean ? compose_mean(s, id) : -1;
    canon_op(s, id);
    if (mean >= 0)
        compose_mean_end(s, id, nin, mean);
    if (y32 >= 0)
        int_narrow(s, id, y32);
    if (lifted)
        lower_1d(s, id, orig, nout);
    if (vec >= 0) {
        Graph *g = s->g;
        const char *name = ir_fmt("%s/vector", g->node[id].name);
        int c = ir_node1(g, OP_Squeeze, name, g->node[id].out[0], -1, vec);
        ir_attr_ints_add(g, c, "axes", sq, nsq);
        visit(s, c);
    }
    if (narrow)
        narrow_end(s, id, &nw);
}

/* ---- evaluation ------------------------------------------------------------ */

static int is_binary(Op op) { return (op_info[op].flags & F_BINARY) != 0; }
/* binary ops that are also integer (shape) arithmetic on constants */
static int int_binary(Op op)
{
    return op == OP_Add || op == OP_Sub || op == OP_Mul || op == OP_Div || op == OP_Min || op == OP_Max ||
           op == OP_Mod || op == OP_FMod;
}

/* the k_unary code of a unary op (its row in fused.h), or -1 */
static int unary_kop(Op op) { return op_info[op].flags & F_UNARY ? op_info[op].kernel : -1; }

static int foldable_op(Op op)
{
    switch (op) {
    case OP_Shape: case OP_Size: case OP_Identity: case OP_Reshape: case OP_Squeeze:
    case OP_Unsqueeze: case OP_Flatten: case OP_Concat: case OP_Split: case OP_Slice:
    case OP_Gather: case OP_GatherElements: case OP_Expand: case OP_Tile: case OP_Pad: case OP_Transpose:
    case OP_Where: case OP_Equal: case OP_Less: case OP_Greater: case OP_LessOrEqual: case OP_GreaterOrEqual:
    case OP_Not: case OP_Cast: case OP_Trilu: case OP_ConstantOfShape: case OP_Range: case OP_NDIndex:
    case OP_GatherGrad: case OP_GatherElementsGrad:
        return 1;
    default:
        return unary_kop(op) >= 0 || is_binary(op);
    }
}

/* Are all inputs constants the step could not change? */
static int inputs_known(const Graph *g, const Node *n)
{
    if (n->op == OP_Shape || n->op == OP_Size)
        return 1; /* shapes are static */
    for (int i = 0; i < n->nin; i++) {
        const Value *x = n->in[i] >= 0 ? &g->val[n->in[i]] : NULL;
        if (x && (x->role != R_CONST || (x->init_index >= 0 && dtype_is_float(x->dtype)) || !ir_data(g, n->in[i])))
            return 0; /* float initializers may be trained: never folded (nor read) */
    }
    return 1;
}

/* Arithmetic on constants, typed here: shape.c types float arithmetic only,
 * and integer Add/Sub/Mul/Div/Neg/Abs are shape arithmetic.  0: not foldable. */
static int arith_type(Graph *g, const Node *n)
{
    const Value *a = &g->val[n->in[0]], *b = is_binary(n->op) ? &g->val[n->in[1]] : a;
    if (a->dtype != b->dtype || a->dtype == DT_BOOL)
        return 0;
    if (!dtype_is_float(a->dtype) && !int_binary(n->op) && n->op != OP_Neg && n->op != OP_Abs)
        return 0;
    Shape s = {.rank = a->shape.rank > b->shape.rank ? a->shape.rank : b->shape.rank};
    for (int i = 0; i < s.rank; i++) {
        int ia = i - (s.rank - a->shape.rank), ib = i - (s.rank - b->shape.rank);
        int64_t da = ia >= 0 ? a->shape.dim[ia] : 1, db = ib >= 0 ? b->shape.dim[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return 0;
        s.dim[i] = da == 1 ? db : da;
    }
    g->val[n->out[0]].dtype = a->dtype;
    g->val[n->out[0]].shape = s;
    return 1;
}

static void *data(const Graph *g, int v) { return g->val[v].data; }

static void eval_unary(const Graph *g, const Node *n)
{
    const Value *x = &g->val[n->in[0]], *y = &g->val[n->out[0]];
    int64_t cnt = shape_numel(&y->shape);
    double p0 = ir_kernel_param(n, n->op, 0), p1 = ir_kernel_param(n, n->op, 1);
    if (x->dtype == DT_F32)
        k_unary_f32(unary_kop(n->op), y->data, x->data, cnt, p0, p1);
    else if (x->dtype == DT_F64)
        k_unary_f64(unary_kop(n->op), y->data, x->data, cnt, p0, p1);
    else
        for (int64_t i = 0; i < cnt; i++) { /* Neg, Abs of integers, wrapping */
            int64_t v = tensor_const_i(x, i);
            v = n->op == OP_Neg || v < 0 ? (int64_t)((uint64_t)0 - (uint64_t)v) : v;
            k_cast(tensor_kdt(y->dtype), (char *)y->data + (size_t)i * dtype_size(y->dtype), K_DT_I64, &v, 1);
        }
}

/* integer a OP b elementwise with broadcasting; int64 arithmetic, wrapping */

/* Broadcast strides of inputs 0..nin-1 into the output's shape. */
static const Shape *bstrides(const Graph *g, const Node *n, int64_t (*st)[MAX_RANK])
{
    const Shape *y = &g->val[n->out[0]].shape;
    for (int i = 0; i < n->nin; i++)
        tensor_bcast(&g->val[n->in[i]].shape, y, st[i]);
    return y;
}

static void int_arith(Graph *g, const Node *n)
{
    /* any integer dtype: through int64 and the kernel the step would run (k_binary_i64) */
    const Value *a = &g->val[n->in[0]], *b = &g->val[n->in[1]], *y = &g->val[n->out[0]];
    int64_t st[3][MAX_RANK], na = shape_numel(&a->shape), nb = shape_numel(&b->shape), ny = shape_numel(&y->shape);
    const Shape *ys = bstrides(g, n, st);
    int64_t *ia = ir_alloc(sizeof(int64_t) * (size_t)(na + 1)), *ib = ir_alloc(sizeof(int64_t) * (size_t)(nb + 1));
    int64_t *iy = ir_alloc(sizeof(int64_t) * (size_t)(ny + 1));
    k_cast(K_DT_I64, ia, tensor_kdt(a->dtype), a->data, na);
    k_cast(K_DT_I64, ib, tensor_kdt(b->dtype), b->data, nb);
    if (k_binary_i64(op_info[n->op].kernel, iy, ia, ib, ys->rank, ys->dim, st[0], st[1]) >= 0)
        node_fatal(g, n, "integer division by zero in constant arithmetic");
    k_cast(tensor_kdt(y->dtype), y->data, K_DT_I64, iy, ny);
}

static void eval_binary(const Graph *g, const Node *n)
{
    int64_t st[3][MAX_RANK];
    const Shape *y = bstrides(g, n, st);
    void *o = data(g, n->out[0]), *a = data(g, n->in[0]), *b = data(g, n->in[1]);
    DType dt = g->val[n->in[0]].dtype;
    int kop;
    switch (n->op) {
    case OP_Equal: kop = K_EQ; break;
    case OP_Less: kop = K_LT; break;
    case OP_Greater: kop = K_GT; break;
    case OP_LessOrEqual: kop = K_LE; break;
    case OP_GreaterOrEqual: kop = K_GE; break;
    default: kop = op_info[n->op].kernel; break; /* an EW2 / EW2D row */
    }
    int cmp = g->val[n->out[0]].dtype == DT_BOOL;
    if (cmp && dt == DT_F32) k_compare_f32(kop, o, a, b, y->rank, y->dim, st[0], st[1]);
    else if (cmp && dt == DT_F64) k_compare_f64(kop, o, a, b, y->rank, y->dim, st[0], st[1]);
    else if (cmp) k_compare_i64(kop, o, a, b, y->rank, y->dim, st[0], st[1]);
    else if (dt == DT_F32) k_binary_f32(kop, o, a, b, y->rank, y->dim, st[0], st[1]);
    else if (dt == DT_F64) k_binary_f64(kop, o, a, b, y->rank, y->dim, st[0], st[1]);
    else int_arith((Graph *)g, n);
}

static void eval_moves(const Graph *g, const Node *n)
{
    Move *m;
    int k = tensor_moves(g, n, &m);
    uint64_t fill = n->op == OP_Pad || n->op == OP_ConstantOfShape ? tensor_fill(g, n) : 0;
    int es = (int)dtype_size(g->val[n->out[0]].dtype);
    for (int i = 0; i < k; i++)
        k_copy_strided(es, m[i].rank, m[i].shape, data(g, n->out[m[i].dst]), m[i].yoff, m[i].ys,
                       m[i].src < 0 ? (const void *)&fill : data(g, n->in[m[i].src]), m[i].xoff, m[i].xs);
}

static void eval_range(const Graph *g, const Node *n)
{
    const Value *s = &g->val[n->in[0]], *d = &g->val[n->in[2]];
    int64_t len = tensor_range_len(g, n);
    void *y = data(g, n->out[0]);
    switch (s->dtype) {
    case DT_F32: k_range_f32(y, tensor_const_f(s, 0), tensor_const_f(d, 0), len); break;
    case DT_F64: k_range_f64(y, tensor_const_f(s, 0), tensor_const_f(d, 0), len); break;
    case DT_I64: k_range_i64(y, tensor_const_i(s, 0), tensor_const_i(d, 0), len); break;
    default: {
        int64_t *t = ir_alloc(sizeof(int64_t) * (size_t)(len + 1));
        k_range_i64(t, tensor_const_i(s, 0), tensor_const_i(d, 0), len);
        k_cast(tensor_kdt(s->dtype), y, K_DT_I64, t, len);
    }
    }
}

static void eval_gather(const Graph *g, const Node *n)
{
    const Value *x = &g->val[n->in[0]], *ix = &g->val[n->in[1]];
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis");
    int64_t outer, axdim, inner;
    tensor_gather_dims(&x->shape, ax, &outer, &axdim, &inner);
    if (k_gather((int)dtype_size(x->dtype), data(g, n->out[0]), x->data, ix->data, outer, axdim, inner,
                 shape_numel(&ix->shape)) >= 0)
        die("constant Gather indices passed the shape rule's check");
}

/* GatherGrad, GatherElementsGrad: the scatters of ScatterND and
 * ScatterElements (where an update lands, for constant indices) */
static void eval_scatter(const Graph *g, const Node *n)
{
    const Value *y = &g->val[n->out[0]], *u = &g->val[n->in[0]], *ix = &g->val[n->in[1]];
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), y->shape.rank, "axis"), f32 = y->dtype == DT_F32;
    int64_t bad;
    if (n->op == OP_GatherGrad) {
        int64_t outer, axdim, inner;
        tensor_gather_dims(&y->shape, ax, &outer, &axdim, &inner);
        if (f32)
            k_gather_grad_f32(y->data, u->data, ix->data, outer, axdim, inner, shape_numel(&ix->shape));
        else
            k_gather_grad_f64(y->data, u->data, ix->data, outer, axdim, inner, shape_numel(&ix->shape));
        bad = -1;
    } else if (f32)
        bad = k_gather_elements_grad_f32(y->data, u->data, ix->data, ix->shape.rank, ix->shape.dim, y->shape.dim, ax);
    else
        bad = k_gather_elements_grad_f64(y->data, u->data, ix->data, ix->shape.rank, ix->shape.dim, y->shape.dim, ax);
    if (bad >= 0)
        die("constant ScatterElements indices passed fold's check");
}

static void eval_gather_elements(const Graph *g, const Node *n)
{
    const Value *x = &g->val[n->in[0]], *ix = &g->val[n->in[1]];
    int ax = tensor_axis(g, n, ir_attr_i(n, "axis", 0), x->shape.rank, "axis");
    if (k_gather_elements((int)dtype_size(x->dtype), data(g, n->out[0]), x->data, ix->data, ix->shape.rank,
                          ix->shape.dim, x->shape.dim, ax) >= 0)
        die("constant GatherElements indices passed the shape rule's check");
}

static void eval_shape(const Graph *g, const Node *n)
{
    const Shape *x = &g->val[n->in[0]].shape;
    int64_t *y = data(g, n->out[0]);
    if (n->op == OP_Size) {
        y[0] = shape_numel(x);
        return;
    }
    int r = x->rank;
    int64_t s = ir_attr_i(n, "start", 0);
    s = s < 0 ? s + r : s;
    s = s < 0 ? 0 : s;
    for (int64_t i = 0; i < value_numel(g, n->out[0]); i++)
        y[i] = x->dim[s + i];
}

/* Compute node n's outputs (already typed, data allocated) on the host. */
static void eval(const Graph *g, const Node *n)
{
    const Value *x = n->nin ? &g->val[n->in[0]] : NULL;
    const Value *y = &g->val[n->out[0]];
    int64_t cnt = shape_numel(&y->shape);
    switch (n->op) {
    case OP_Shape: case OP_Size: eval_shape(g, n); break;
    case OP_Identity: case OP_Reshape: case OP_Squeeze: case OP_Unsqueeze: case OP_Flatten:
        memcpy(y->data, x->data, (size_t)cnt * dtype_size(y->dtype));
        break;
    case OP_Concat: case OP_Split: case OP_Slice: case OP_Expand: case OP_Tile: case OP_Pad:
    case OP_Transpose: case OP_ConstantOfShape:
        eval_moves(g, n);
        break;
    case OP_Gather: eval_gather(g, n); break;
    case OP_GatherElements: eval_gather_elements(g, n); break;
    case OP_GatherGrad: case OP_GatherElementsGrad: eval_scatter(g, n); break;
    case OP_NDIndex: {
        int k;
        const int64_t *dims = tensor_ints(n, "dims", &k);
        int64_t nb, nq;
        tensor_nd_counts(n, &x->shape, &nb, &nq);
        if (k_nd_index(y->data, x->data, nb, nq, k, dims) >= 0)
            die("constant GatherND / ScatterND indices passed fold's check");
        break;
    }
    case OP_Where: {
        int64_t st[3][MAX_RANK];
        const Shape *s = bstrides(g, n, st);
        k_where((int)dtype_size(y->dtype), y->data, x->data, data(g, n->in[1]), data(g, n->in[2]),
                s->rank, s->dim, st[0], st[1], st[2]);
        break;
    }
    case OP_Not: k_not(y->data, x->data, cnt); break;
    case OP_Cast: k_cast(tensor_kdt(y->dtype), y->data, tensor_kdt(x->dtype), x->data, cnt); break;
    case OP_Trilu: {
        int64_t rows = x->shape.dim[x->shape.rank - 2], cols = x->shape.dim[x->shape.rank - 1];
        k_trilu((int)dtype_size(x->dtype), (int)ir_attr_i(n, "upper", 1), y->data, x->data,
                rows && cols ? cnt / (rows * cols) : 0, rows, cols, ir_attr_i(n, "k", 0));
        break;
    }
    case OP_Range: eval_range(g, n); break;
    default:
        if (unary_kop(n->op) >= 0)
            eval_unary(g, n);
        else
            eval_binary(g, n);
    }
}

/* Evaluate node id if it can be; 1 if its outputs are constants now. */
static int fold_node(Graph *g, int id)
{
    const Node *n = &g->node[id];
    if (!foldable_op(n->op) || !inputs_known(g, n))
        return 0;
    int arith = is_binary(n->op) || unary_kop(n->op) >= 0;
    if (arith && !arith_type(g, n))
        return 0;
    if (!arith)
        shape_node(g, id);
    n = &g->node[id];
    for (int k = 0; k < n->nout; k++)
        if (value_numel(g, n->out[k]) > FOLD_MAX) {
            if (n->op == OP_Range && g->val[n->out[0]].dtype == DT_I32)
                node_fatal(g, n, "an int32 Range of more than %d elements is not supported (use int64)",
                           FOLD_MAX);
            return 0;
        }
    for (int k = 0; k < n->nout; k++) {
        Value *y = &g->val[n->out[k]];
        y->data = ir_alloc((size_t)value_numel(g, n->out[k]) * dtype_size(y->dtype) + 1);
    }
    eval(g, n);
    for (int k = 0; k < n->nout; k++) {
        Value *y = &g->val[n->out[k]];
        y->role = R_CONST;
        y->persistent = 1;
    }
    return 1;
}

static int typed_inputs(const Graph *g, const Node *n)
{
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] >= 0 && g->val[n->in[i]].dtype == DT_UNDEF)
            return 0; /* an input the shape pass will report */
    return 1;
}

void fold_visit(Sweep *s, int id)
{
    Graph *g = s->g;
    int typed = typed_inputs(g, &g->node[id]);
    if (typed && fold_node(g, id))
        return;
    if (typed)
        shape_node(g, id);
    if (s->n == s->cap) {
        int *o = ir_alloc(sizeof(int) * (size_t)(2 * s->cap + 16));
        if (s->n)
            memcpy(o, s->order, sizeof(int) * (size_t)s->n);
        s->order = o;
        s->cap = 2 * s->cap + 16;
    }
    s->order[s->n++] = id;
}

/* ---- nodes that compute nothing --------------------------------------------- */

/* Is value v a graph output or named by --loss (so it must keep its node)? */

/* Drops the Transposes fold_matmul_operands left unread, and Dropout that drops
 * nothing: ratio 0 (nanoGPT's default) or not training, its mask unread.
 * Its readers read its input instead, so it costs no copy, no mask kept
 * for the backward and no DropoutGrad, and a MatMul before it can take the
 * Add after it as its epilogue (passes/fuse.c). */
static void drop_identities(Graph *g)
{
    int *uses = ir_alloc(sizeof(int) * (size_t)(g->nval + 1)), *repl = ir_alloc(sizeof(int) * (size_t)(g->nval + 1));
    for (int i = 0; i < g->nnode; i++)
        for (int k = 0; k < g->node[i].nin; k++)
            if (g->node[i].in[k] >= 0)
                uses[g->node[i].in[k]]++;
    for (int v = 0; v < g->nval; v++)
        repl[v] = v;
    int n = 0;
    for (int i = 0; i < g->nnode; i++) {
        Node *x = &g->node[i];
        for (int k = 0; k < x->nin; k++)
            if (x->in[k] >= 0)
                x->in[k] = repl[x->in[k]];
        int y = x->out[0];
        if (x->op == OP_Transpose && !uses[y] && !ir_wanted(g, y))
            continue; /* left by fold_matmul_operands */
        if (x->op == OP_Dropout && (nn_dropout_ratio(g, x) == 0 || !nn_dropout_training(g, x)) && !ir_wanted(g, y) &&
            (x->nout < 2 || x->out[1] < 0 || (!uses[x->out[1]] && !ir_wanted(g, x->out[1])))) {
            repl[y] = x->in[0];
            continue;
        }
        g->node[n++] = *x;
    }
    g->nnode = n;
    ir_link(g);
}

void pass_fold(Graph *g)
{
    Sweep s = {g, NULL, 0, 0, 0, NULL, 0, 0};
    int nn = g->nnode;
    for (int i = 0; i < nn; i++)
        canon(&s, i);
    for (int k = 0; k < g->noutput; k++)
        if (seq_of(&s, g->output[k]))
            fatal("graph output '%s' is a sequence; fsdpc's outputs are tensors (return its elements, or "
                  "ConcatFromSequence)", ir_q(g->val[g->output[k]].name));
    Node *out = ir_alloc(sizeof(Node) * (size_t)(s.n + 1));
    int n = 0;
    for (int i = 0; i < s.n; i++)
        out[n++] = g->node[s.order[i]];
    ir_set_nodes(g, out, n);
    drop_identities(g);
}
