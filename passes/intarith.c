/* intarith.c — fold's rewrites that let integer arithmetic run at run time.
 *
 * The executable computes integer tensors with one family of kernels: the
 * broadcasting binary ops of ops.def's F_I64 rows (Add, Sub, Mul, Div, Min,
 * Max, Mod, FMod) on int64, plus data movement (Pad, Slice, Gather...),
 * comparisons, Where and Cast, which take any dtype.  Everything else an
 * exported model does with integers is written here in those terms, so no
 * kernel is added and both targets follow:
 *
 *   int32 arithmetic   (and Sum) the int32 inputs read through Casts to int64, the op
 *                      computes int64, a Cast back to int32 writes the
 *                      node's output (int_widen before the node's own
 *                      canonicalisation, int_narrow after it).  Exact while
 *                      the int32 result is in range (ONNX leaves overflow
 *                      undefined; ours saturates);
 *   Neg, Abs, Sign     of int64: 0 - x; Where(x < 0, 0 - x, x);
 *                      Cast(x > 0) - Cast(x < 0)   (int_unary);
 *   CumSum             of int64: expand.c's shifted adds, which are Pad and
 *                      Add (RoBERTa's and transformers 5's position ids);
 *   Pow                a float base with an exponent of another dtype reads
 *                      the exponent cast to the base's dtype (BLOOM's ALiBi
 *                      slopes: 2^-k with an int64 k); an integer base: both
 *                      cast to float64, Pow, a Cast back (exact while the
 *                      result is below 2^53)   (int_pow).
 *   narrow dtypes      a model's int8, uint8, int16, uint16, uint32, uint64,
 *                      float16 and bfloat16 tensors (image bytes, token ids,
 *                      half-precision inputs; dtypes.def's wide column):
 *                      only Cast (k_cast converts between any two), Shape
 *                      and Size read them.  Every other node reads its
 *                      narrow inputs through Casts to int64 / float32,
 *                      computes there, and a Cast back writes each output
 *                      the op computes in its input's dtype (narrow_begin
 *                      before the node's canonicalisation, narrow_end after
 *                      it, around everything else canon does).  Integers
 *                      are exact: every integer op's result is rounded back
 *                      to its dtype, so Add, Sub, Mul wrap as NumPy's and
 *                      Div, Mod, Min, Max and comparisons see the narrow
 *                      values themselves; uint64 is read as its int64 bits,
 *                      exact only for data movement, Add, Sub, Mul, Neg,
 *                      Sum, Equal and Where (the rest is refused: 2^63 and
 *                      above would order as negative).  16-bit floats are
 *                      computed in float32 and rounded to their dtype after
 *                      each op (ONNX's reference rounds its intermediates
 *                      inside an op too: results agree to a few units of
 *                      the 16-bit roundoff).
 *
 * With constant inputs the new nodes fold like any other, so shape
 * arithmetic is unchanged; integer values never carry a gradient.
 */
#include "fold.h"
#include "rules/tensor.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

static int is_int(DType t) { return t == DT_I64 || t == DT_I32; }

/* A new value named after node id (NODE/suffix.N), undefined until shaped. */
static int new_value(Sweep *s, int id, const char *suffix)
{
    Graph *g = s->g;
    return ir_value(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), DT_UNDEF, NULL, R_ACT);
}

/* Cast(x) to dt named NODE/suffix writing out (-1: a new value), visited; its output. */
static int cast_to(Sweep *s, int id, int x, DType dt, const char *suffix, int out)
{
    Graph *g = s->g;
    if (out < 0)
        out = new_value(s, id, suffix);
    int c = ir_node1(g, OP_Cast, ir_fmt("%s/%s", g->node[id].name, suffix), x, -1, out);
    ir_attr_add(g, c, "to", A_INT)->i = tensor_to_onnx(dt);
    visit(s, c);
    return out;
}

/* The inputs of node id that hold integer data (not shape-deciding constants). */
static int data_inputs(const Graph *g, int id)
{
    const Node *n = &g->node[id];
    if ((op_info[n->op].flags & F_BINARY) && (op_info[n->op].flags & F_I64))
        return 2;
    switch (n->op) {
    case OP_CumSum: case OP_CumProd: case OP_Neg: case OP_Abs: case OP_Sign: return 1;
    case OP_Sum: return n->nin;
    default: return 0;
    }
}

/* int32 arithmetic in int64: node id's int32 data inputs read through Casts
 * to int64 and its output becomes a new int64 value.  Returns the int32
 * value int_narrow must write once the node is canonicalised, or -1 when
 * the node is not int32 arithmetic. */
int int_widen(Sweep *s, int id)
{
    Graph *g = s->g;
    int k = data_inputs(g, id);
    if (k == 0 || g->node[id].nin < k)
        return -1;
    for (int i = 0; i < k; i++)
        if (g->node[id].in[i] < 0 || g->val[g->node[id].in[i]].dtype != DT_I32)
            return -1;
    for (int i = 0; i < k; i++) {
        int x = cast_to(s, id, g->node[id].in[i], DT_I64, ir_fmt("int64_%d", i), -1);
        g->node[id].in[i] = x;
    }
    int y32 = g->node[id].out[0];
    g->node[id].out[0] = new_value(s, id, "int64");
    return y32;
}

/* The int64 result of node id (canonicalised: its output may now be written
 * by the nodes it expanded into) cast to y32. */
void int_narrow(Sweep *s, int id, int y32)
{
    cast_to(s, id, s->g->node[id].out[0], DT_I32, "int32", y32);
}

/* An int64 scalar constant v named after node id. */
static int int_scalar(Sweep *s, int id, int64_t v, const char *suffix)
{
    Graph *g = s->g;
    Shape sc = {.rank = 0};
    return ir_const(g, ir_fmt("%s/%s.%d", g->node[id].name, suffix, s->nnew++), DT_I64, &sc, &v);
}

/* op(a, b[, c]) named NODE/suffix writing out (-1: a new value), visited; its output. */
static int node3(Sweep *s, int id, Op op, int a, int b, int c, const char *suffix, int out)
{
    Graph *g = s->g;
    int in[3] = {a, b, c};
    if (out < 0)
        out = new_value(s, id, suffix);
    int k = ir_node(g, op, ir_fmt("%s/%s", g->node[id].name, suffix), c >= 0 ? 3 : b >= 0 ? 2 : 1, in, 1, &out);
    visit(s, k);
    return out;
}

/* Neg, Abs and Sign of an int64 x as comparisons, Where and int64 Sub; 1 if
 * node id was one (and is replaced), 0 otherwise. */
int int_unary(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    if (g->val[n.in[0]].dtype != DT_I64)
        return 0;
    int x = n.in[0], zero = int_scalar(s, id, 0, "zero");
    switch (n.op) {
    case OP_Neg:
        node3(s, id, OP_Sub, zero, x, -1, "neg", n.out[0]);
        return 1;
    case OP_Abs: {
        int neg = node3(s, id, OP_Less, x, zero, -1, "negative", -1);
        int minus = node3(s, id, OP_Sub, zero, x, -1, "neg", -1);
        node3(s, id, OP_Where, neg, minus, x, "abs", n.out[0]);
        return 1;
    }
    case OP_Sign: {
        int pos = cast_to(s, id, node3(s, id, OP_Greater, x, zero, -1, "positive", -1), DT_I64, "pos", -1);
        int neg = cast_to(s, id, node3(s, id, OP_Less, x, zero, -1, "negative", -1), DT_I64, "neg", -1);
        node3(s, id, OP_Sub, pos, neg, -1, "sign", n.out[0]);
        return 1;
    }
    default:
        return 0;
    }
}

/* Pow's operands: a float base reads its exponent in its own dtype; an
 * integer base is computed in float64 and cast back.  1 if node id was
 * replaced (an integer base), 0 if it stays a Pow (perhaps with a cast
 * exponent). */
int int_pow(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    if (n.nin < 2 || n.in[0] < 0 || n.in[1] < 0)
        return 0;
    DType bt = g->val[n.in[0]].dtype, et = g->val[n.in[1]].dtype;
    if (dtype_is_float(bt)) {
        if (et != bt && (dtype_is_float(et) || is_int(et)))
            g->node[id].in[1] = cast_to(s, id, n.in[1], bt, "exponent", -1);
        return 0;
    }
    if (!is_int(bt) || !(dtype_is_float(et) || is_int(et)))
        return 0; /* the shape rule names what is wrong */
    int b = cast_to(s, id, n.in[0], DT_F64, "base", -1);
    int e = et == DT_F64 ? n.in[1] : cast_to(s, id, n.in[1], DT_F64, "exponent", -1);
    int p = node3(s, id, OP_Pow, b, e, -1, "pow", -1);
    cast_to(s, id, p, bt, "int", n.out[0]);
    return 1;
}

/* ---- narrow dtypes: int8 .. uint64, float16, bfloat16 ----------------------- */

/* Is t a dtype the step only moves and casts (dtypes.def's wide column)? */
static int is_narrow(DType t) { return t != DT_UNDEF && dtype_wide(t) != t; }

/* Ops that read a narrow dtype as it is: Cast converts between any two
 * (k_cast), Shape and Size read the shape only. */
static int reads_narrow(Op op) { return op == OP_Cast || op == OP_CastLike || op == OP_Shape || op == OP_Size; }

/* Ops exact on uint64 computed in int64 (their int64 bits): data movement,
 * Where, Equal and the wrapping Add, Sub, Mul, Neg.  The others (order, Div,
 * Mod, reductions...) would read a value of 2^63 or more as negative. */
static int u64_exact(Op op)
{
    switch (op) {
    case OP_Add: case OP_Sub: case OP_Mul: case OP_Neg: case OP_Sum: case OP_Equal: case OP_Where:
    case OP_Identity: case OP_Reshape: case OP_Flatten: case OP_Squeeze: case OP_Unsqueeze: case OP_Transpose:
    case OP_Expand: case OP_Concat: case OP_Split: case OP_Slice: case OP_Gather: case OP_GatherElements:
    case OP_Tile: case OP_Pad: case OP_Trilu: case OP_ReverseSequence:
        return 1;
    default:
        return 0;
    }
}

/* The input of node id whose dtype the output takes (OneHot's values,
 * else the first input of a narrow dtype); -1 if none is narrow or an
 * attribute gives the output's dtype (EyeLike's dtype). */
static int narrow_source(const Graph *g, const Node *n)
{
    if (ir_attr(n, "dtype"))
        return -1;
    if (n->op == OP_OneHot)
        return n->nin > 2 && n->in[2] >= 0 && is_narrow(g->val[n->in[2]].dtype) ? n->in[2] : -1;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] >= 0 && is_narrow(g->val[n->in[i]].dtype))
            return n->in[i];
    return -1;
}

/* One line naming node id and its input x when the op cannot take x's
 * narrow dtype computed in the wide one. */
static void narrow_check(const Graph *g, const Node *n, const Value *x)
{
    OpTypes t = op_info[n->op].types;
    int integer = dtype_wide(x->dtype) == DT_I64;
    if (integer && (t == T_FLOAT || t == T_TEST || t == T_INDEX))
        node_fatal(g, n, "input '%s' is %s, which is not supported here (float32, float64, float16 or bfloat16)",
                   ir_q(x->name), dtype_name(x->dtype));
    if (x->dtype == DT_U64 && !u64_exact(n->op))
        node_fatal(g, n, "input '%s' is u64, which is not supported here: fsdpc computes it in int64, where values "
                   "of 2^63 or more read as negative (cast it to int64 first)", ir_q(x->name));
}

/* Every output of node id becomes a new value written instead (nw->wide,
 * the old ones in nw->orig); those of outputs 1.. that are read count as
 * graph outputs until narrow_end, so that an expansion computes them. */
static void redirect_outputs(Sweep *s, int id, Narrowing *nw)
{
    Graph *g = s->g;
    int k = nw->k = g->node[id].nout, *out = ir_alloc((size_t)(g->noutput + k) * sizeof *out);
    nw->noutput = g->noutput;
    nw->orig = ir_alloc((size_t)k * sizeof *nw->orig);
    nw->wide = ir_alloc((size_t)k * sizeof *nw->wide);
    memcpy(out, g->output, (size_t)g->noutput * sizeof *out);
    for (int j = 0; j < k; j++) {
        nw->orig[j] = g->node[id].out[j];
        nw->wide[j] = g->node[id].out[j] = new_value(s, id, "wide");
        if (j > 0 && ir_is_read(g, nw->orig[j]))
            out[g->noutput++] = nw->wide[j];
    }
    g->output = out;
}

/* Narrow dtypes in wide ones: every input of node id of a narrow dtype reads
 * through a Cast to its wide dtype (int64 or float32), and its outputs are
 * redirected.  Returns nw->k, how many (0: node id reads no narrow dtype
 * or takes it as it is), and fills *nw for narrow_end. */
int narrow_begin(Sweep *s, int id, Narrowing *nw)
{
    Graph *g = s->g;
    const Node *n = &g->node[id];
    int any = 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] >= 0 && is_narrow(g->val[n->in[i]].dtype)) {
            narrow_check(g, n, &g->val[n->in[i]]);
            any = 1;
        }
    if (!any || reads_narrow(n->op))
        return nw->k = 0;
    int src = narrow_source(g, n);
    nw->nt = src >= 0 ? g->val[src].dtype : DT_UNDEF;
    for (int i = 0; i < g->node[id].nin; i++) {
        int x = g->node[id].in[i];
        if (x >= 0 && is_narrow(g->val[x].dtype))
            g->node[id].in[i] = cast_to(s, id, x, dtype_wide(g->val[x].dtype), ir_fmt("wide_%d", i), -1);
    }
    redirect_outputs(s, id, nw);
    return nw->k;
}

/* After node id was canonicalised (its outputs are now written by whatever
 * it became): each output narrow_begin made new is cast into its old value:
 * to nt where it holds nt's wide dtype and is data (an integer op's output
 * 0, every output of Split; every float32 output of a 16-bit float op), else
 * to its own dtype (TopK's int64 indices, OneHot's float values, a
 * comparison's bool).  An optional output nothing computed stays unwritten. */
void narrow_end(Sweep *s, int id, const Narrowing *nw)
{
    Graph *g = s->g;
    DType wide = dtype_wide(nw->nt);
    g->noutput = nw->noutput;
    for (int j = 0; j < nw->k; j++) {
        DType d = g->val[nw->wide[j]].dtype;
        int data = j == 0 || g->node[id].op == OP_Split || wide != DT_I64;
        if (d != DT_UNDEF)
            cast_to(s, id, nw->wide[j], nw->nt != DT_UNDEF && d == wide && data ? nw->nt : d, "narrow", nw->orig[j]);
    }
}
