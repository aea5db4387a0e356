/* precision.c — mixed precision: bfloat16 or float16 parameters for all-gather and GEMMs.
 *
 * requires: shard.
 * ensures (--precision bf16; fp32 leaves the graph as it is; fp16 is the
 * same with float16, "the low dtype", in place of bfloat16 throughout, and
 * with loss scaling at run time: the seed, the gradient norm and the
 * updates of codegen/emit.c read the step's loss scale):
 *   - every unit's gathered flat buffers, forward and backward, and the
 *     parameter views into them are bfloat16; AllGather reads the float32
 *     shard and writes the bfloat16 flat buffer (codegen rounds this rank's
 *     piece into place, then gathers in place), so the collective moves half
 *     the bytes and the gathered units take half the memory;
 *   - every float32 MatMul reads bfloat16 operands (Cast nodes made once per
 *     value, before its first MatMul reader), accumulated in float32 — the
 *     GEMMs of forward and backward alike, as torch.autocast does; a cast
 *     activation kept for the backward is kept as bfloat16;
 *   - so do, on the cpu target, every Conv (x, w) and ConvGrad (dy, x, w;
 *     its gradients float32): k_conv2d_bf16 and its gradients, on oneDNN;
 *   - so does every FusedAttention (passes/attention.c) and its gradient:
 *     q, kt and v cast as MatMul operands are (the forward's casts are the
 *     backward's), and so do the gradient's dy and y (a float32 dy cast);
 *     lse and the bias float32; the kernels (k_attention_bf16) compute as
 *     flash attention does, every GEMM on bfloat16 operands, the softmax and
 *     every sum in float32, and write y (dq, dkt, dv) in bfloat16 themselves,
 *     rounded once from float32 (a Cast to float32 after them where the
 *     value may not be stored low);
 *   - activations are stored as torch.autocast stores them: the result of a
 *     MatMul is
 *     bfloat16 — the GEMM writes a float32 temporary and a Cast stores it,
 *     which fuse.c takes into the GEMM (a block of rows at a time) or
 *     into the fused loop that reads it — and an elementwise
 *     op (F_UNARY / F_BINARY, UnaryGrad, Scale) whose inputs are all
 *     bfloat16 (scalar constants aside, as torch's type promotion ignores a
 *     Python scalar) reads each through a Cast of its own to float32,
 *     computes in float32 and stores its result through a Cast to bfloat16
 *     (fuse.c's loops take those Casts in: 16-bit loads and stores, no
 *     float32 copy written); with a float32 input its result is float32.  A
 *     MatMul whose one reader is elementwise (a Linear's bias Add) stays
 *     float32 and counts as bfloat16 there, so the product and its bias
 *     round once, as addmm does, and the GEMM epilogue can add the bias.
 *     A result is stored low only when it is an activation some reader
 *     takes in low without a copy (a GEMM operand, an elementwise op, a move
 *     to such a reader, the cross-entropy's logits: readers_ahead), not a
 *     parameter's gradient on its way (moves and sums) to the flat gradient,
 *     the loss, or an --eval build's output;
 *   - the cross-entropy reads bfloat16 logits (k_cross_entropy_bf16) and
 *     writes their gradient in bfloat16;
 *   - data movement (Transpose, Gather of a table, Identity, Reshape, Split;
 *     Concat of bfloat16 values alone) of a bfloat16 value stays bfloat16,
 *     so a product that is split (attention's q, k, v of one GEMM) is
 *     stored bfloat16 and its parts need no cast;
 *   - a LayerNormalization of a bfloat16 x whose Y only GEMMs read (a
 *     pre-norm block's, between the residual stream and its projections)
 *     reads x and writes Y in bfloat16 (k_layernorm_bf16: float32 inside,
 *     Y rounded once); its statistics stay float32;
 *   - on the cpu target, a LayerNormGrad reads a bfloat16 x as it is
 *     (k_layernorm_grad_bf16: widened as loaded, the bits of a Cast), so the
 *     backward makes no float32 copy of the residual stream (dy, dx and the
 *     parameter gradients float32);
 *   - a ReduceSumTo (a bias gradient) sums a bfloat16 dY as it is
 *     (k_reduce_sum_to_bf16: each element widened as loaded, float32 y);
 *   - everything else reads float32: a bfloat16 input gets one Cast back per
 *     value and phase (LayerNorm, softmax, reductions, BatchNorm compute in
 *     float32 on the rounded values; the backward casts again rather than
 *     keep the forward's float32 copy alive);
 *   - gradients, the master shards and the optimizer state stay float32
 *     (FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)).
 * --reduce-dtype bf16 (with either --precision): every ReduceScatter gets a
 * second output, a bf16 buffer of the flat gradient's size that the runtime
 * reduces in (half the bytes on the wire), the result landing in the fp32
 * gradient shard.
 * The set of ops that may read bfloat16 is ir_reads_low (ir/ir.c); ir_verify
 * holds every later pass to it.
 */
#include "ir.h"
#include "rules/tensor.h"

#include <string.h>

/* ops whose input 0 is only moved: a bfloat16 input gives bfloat16 outputs (Split: each part) */
static int moves_input0(Op op)
{
    return op == OP_Transpose || op == OP_Gather || op == OP_Identity || op == OP_Reshape || op == OP_Split;
}

/* does node n only move its input j (a Concat every input) into its outputs? */
static int moves(const Node *n, int j)
{
    return (j == 0 && moves_input0(n->op)) || n->op == OP_Concat;
}

DType precision_low(Precision p) { return p == PREC_FP16 ? DT_F16 : DT_BF16; }

static int is_low(DType t) { return t == DT_BF16 || t == DT_F16; }

static int is_conv(Op op) { return op == OP_Conv || op == OP_ConvGrad; }

/* ops that read the low dtype on the cpu target only (the cuda target's convolutions and LayerNorm backward are
 * float32 kernels) */
static int cpu_low(Op op) { return is_conv(op) || op == OP_LayerNormGrad; }

static int on_cpu(const Graph *g) { return !g->opt->target || !strcmp(g->opt->target, "cpu"); }

/* may input j of n read the low dtype here (ir_reads_low's inputs; cpu_low ops' on the cpu target)? */
static int reads_low(const Graph *g, const Node *n, int j)
{
    return ir_reads_low(n, j) && (!cpu_low(n->op) || on_cpu(g));
}

/* ops whose operands (reads_low's inputs) a float32 result reads in the low dtype */
static int is_gemm(const Graph *g, Op op)
{
    return op == OP_MatMul || op == OP_FusedAttention || op == OP_FusedAttentionGrad || (is_conv(op) && on_cpu(g));
}

typedef struct {
    Graph *g;
    Node *out;
    int n;
    DType low;        /* DT_BF16 or DT_F16 */
    int *as16, *as32; /* per value: its Cast to the low dtype / float32, -1 if none yet */
    int *view;        /* per value: the Reshape / Identity (index in out) that made it of a float32 value */
} Rewrite;

/* a Cast of value v to dtype `to` (w->low or float32) into the new value c, appended to w->out */
static void push_cast(Rewrite *w, int v, int c, DType to)
{
    Graph *g = w->g;
    Attr *a = ir_alloc(sizeof(Attr));
    *a = (Attr){.name = "to", .kind = A_INT, .i = tensor_to_onnx(to)};
    Node n = {.op = OP_Cast, .name = ir_fmt("%s.to_%s", g->val[v].name, dtype_name(to)), .nin = 1, .nout = 1,
              .in = ir_alloc(sizeof(int)), .out = ir_alloc(sizeof(int)), .nattr = 1, .attr = a, .unit = -1};
    n.in[0] = v;
    n.out[0] = c;
    w->out[w->n++] = n;
}

/* a new activation of v's shape and dtype `to`, named after v */
static int new_like(Graph *g, int v, DType to, const char *suffix)
{
    Shape s = g->val[v].shape; /* ir_value may move g->val */
    return ir_value(g, ir_fmt("%s.%s", g->val[v].name, suffix), to, &s, R_ACT);
}

/* v cast to dtype `to`, a cast of its own (one reader: the fused loops take it in) */
static int cast_fresh(Rewrite *w, int v, DType to)
{
    int c = new_like(w->g, v, to, dtype_name(to));
    push_cast(w, v, c, to);
    return c;
}

/* the value v cast to dtype `to` (w->low or float32), made once (per phase for float32), before the node
 * being emitted.  A view (Reshape, Identity) of a value already cast to the low dtype becomes the
 * same view of that cast instead of a second cast (the backward's flattened
 * operands of a Linear's weight gradient, say). */
static int cast_of(Rewrite *w, int v, DType to)
{
    int *cache = to == w->low ? w->as16 : w->as32;
    if (cache[v] >= 0)
        return cache[v];
    Graph *g = w->g;
    if (to == w->low && w->view[v] >= 0 && w->as16[w->out[w->view[v]].in[0]] >= 0) {
        Node n = w->out[w->view[v]];
        int *in = ir_alloc(sizeof(int) * (size_t)(n.nin + 1)), *out = ir_alloc(sizeof(int));
        memcpy(in, n.in, sizeof(int) * (size_t)n.nin);
        in[0] = w->as16[n.in[0]];
        out[0] = new_like(g, v, to, dtype_name(to));
        n.in = in;
        n.out = out;
        n.nout = 1;
        n.name = ir_fmt("%s.%s", n.name, dtype_name(to));
        w->out[w->n++] = n;
        return cache[v] = out[0];
    }
    return cache[v] = cast_fresh(w, v, to);
}

/* the gathered buffers of every unit and the parameter views into them, in the low dtype */
static void gather_in_low(Graph *g, DType low)
{
    int nval = g->nval;
    for (int u = 0; u < g->nunit; u++)
        if (g->unit[u].dtype != DT_F32)
            fatal("--precision %s needs a float32 model: unit %s holds %s parameters (use --precision fp32)",
                  low == DT_F16 ? "fp16" : "bf16", ir_q(g->unit[u].name), dtype_name(g->unit[u].dtype));
    for (int v = 0; v < nval; v++)
        if (g->val[v].role == R_FLAT)
            g->val[v].dtype = low;
    for (int v = 0; v < nval; v++) {
        Value *x = &g->val[v];
        if (x->role != R_PARAM || x->alias_of < 0 || g->val[x->alias_of].role != R_FLAT)
            continue;
        x->dtype = low;
        x->alias_off = x->alias_off / (int64_t)dtype_size(DT_F32) * (int64_t)dtype_size(low);
    }
}

/* --reduce-dtype bf16: the bf16 reduction buffer of every ReduceScatter */
static void reduce_in_bf16(Graph *g)
{
    for (int i = 0; i < g->nnode; i++) {
        if (g->node[i].op != OP_ReduceScatter)
            continue;
        const Unit *un = &g->unit[g->node[i].unit];
        if (un->dtype != DT_F32)
            fatal("--reduce-dtype bf16 needs a float32 model: unit %s holds %s parameters", ir_q(un->name),
                  dtype_name(un->dtype));
        Shape s = {1, {un->numel}};
        int v = ir_value(g, ir_fmt("%s.flatgrad.bf16", un->name), DT_BF16, &s, R_FLATGRAD);
        g->val[v].unit = g->node[i].unit;
        Node *n = &g->node[i];
        int *out = ir_alloc(sizeof(int) * 2);
        out[0] = n->out[0];
        out[1] = v;
        n->out = out;
        n->nout = 2;
    }
}

/* elementwise ops: computed one element at a time in float32 by the fused loops (fuse.c), which take in the
 * casts around them */
static int is_elementwise(const Node *n)
{
    return (op_info[n->op].flags & (F_UNARY | F_BINARY)) || n->op == OP_UnaryGrad || n->op == OP_Scale;
}

/* a constant of one element: a scalar in the model's code, which (as in torch's type promotion) does not
 * make a low result float32 */
static int is_scalar_const(const Graph *g, int v)
{
    return g->val[v].role == R_CONST && value_numel(g, v) == 1;
}

/* What the rewrite needs to know of each value ahead of its readers (the graph is in program order, so one
 * sweep from the end):
 *   low_reader[v]: some reader takes v in the low dtype without a copy of it (a GEMM operand, an elementwise
 *                  op, or a move whose result has such a reader), so storing v low saves memory;
 *   grad_bound[v]: v becomes a parameter's gradient through moves and sums (it stays float32, as the
 *                  gradients do);
 *   reads[v], ew_reader[v]: how many times v is read, and whether by an elementwise op of the same phase;
 *   f32_reader[v]: some reader is no GEMM operand (nor a move to GEMM operands alone), or v is an output. */
static void readers_ahead(const Graph *g, char *low_reader, char *grad_bound, int *reads, char *ew_reader,
                          char *f32_reader)
{
    for (int v = 0; v < g->nval; v++)
        grad_bound[v] = g->val[v].role == R_GRAD || g->val[v].role == R_FLATGRAD;
    for (int k = 0; k < g->noutput; k++)
        f32_reader[g->output[k]] = 1;
    for (int i = g->nnode - 1; i >= 0; i--) {
        const Node *n = &g->node[i];
        int bound = 0;
        for (int k = 0; k < n->nout; k++)
            bound |= n->out[k] >= 0 && grad_bound[n->out[k]];
        int passes_grad = moves_input0(n->op) || n->op == OP_Concat || n->op == OP_Add || n->op == OP_Sum;
        int out_low = 0, out_f32 = 0; /* some output is read low; some output has a float32 reader */
        for (int k = 0; k < n->nout; k++) {
            out_low |= n->out[k] >= 0 && low_reader[n->out[k]];
            out_f32 |= n->out[k] >= 0 && f32_reader[n->out[k]];
        }
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (v < 0)
                continue;
            if (bound && passes_grad)
                grad_bound[v] = 1;
            reads[v]++;
            if (is_elementwise(n) && g->val[v].producer >= 0 && (g->val[v].producer >= g->nfwd) == (i >= g->nfwd))
                ew_reader[v] = 1;
            /* (a LayerNorm and its backward take x low where it is low already: no reason to store it low) */
            if ((reads_low(g, n, j) && n->op != OP_Free && n->op != OP_Wait && n->op != OP_Cast &&
                 n->op != OP_Split && n->op != OP_Concat && n->op != OP_LayerNormalization &&
                 n->op != OP_LayerNormGrad) ||
                is_elementwise(n) || (moves(n, j) && out_low))
                low_reader[v] = 1;
            if (!(is_gemm(g, n->op) && reads_low(g, n, j)) && n->op != OP_Free && n->op != OP_Wait &&
                !(moves(n, j) && !out_f32))
                f32_reader[v] = 1;
        }
    }
}

/* Is output v of a GEMM or an elementwise op stored in the low dtype (torch.autocast's rule: a product and
 * what is computed from low values alone are low)?  Only an activation of the step that a reader takes in
 * low and that is no gradient, loss, or output of an --eval build. */
static int stored_low(const Graph *g, const char *low_reader, const char *grad_bound, int v)
{
    const Value *x = &g->val[v];
    if (x->role != R_ACT || x->alias_of >= 0 || x->dtype != DT_F32 || !low_reader[v] || grad_bound[v] ||
        v == g->loss || v == g->loss_avg)
        return 0;
    for (int k = 0; k < g->noutput && g->opt->eval; k++) /* (a training step's outputs are not read after it) */
        if (g->output[k] == v)
            return 0;
    return 1;
}

/* ops whose kernels write their low outputs in the low dtype themselves (the fused attention's y; dq, dkt, dv) */
static int writes_low(Op op) { return op == OP_FusedAttention || op == OP_FusedAttentionGrad; }

/* node n (already in w->out, writes_low) writes output k in the low dtype: the output becomes low where it may
 * be stored so, else n writes a low temporary that a Cast widens into it */
static void written_low(Rewrite *w, Node *n, int k, int stored)
{
    Graph *g = w->g;
    int v = n->out[k];
    if (stored) {
        g->val[v].dtype = w->low;
        return;
    }
    int t = new_like(g, v, w->low, dtype_name(w->low));
    int *out = ir_alloc(sizeof(int) * (size_t)n->nout);
    memcpy(out, n->out, sizeof(int) * (size_t)n->nout);
    out[k] = t;
    n->out = out;
    push_cast(w, t, v, DT_F32);
}

/* node n (already in w->out) wrote output k into float32: it now writes a float32 temporary that a Cast
 * stores into the output, whose dtype becomes the low one */
static void store_low(Rewrite *w, Node *n, int k)
{
    Graph *g = w->g;
    int v = n->out[k], t = new_like(g, v, DT_F32, "f32");
    int *out = ir_alloc(sizeof(int) * (size_t)n->nout);
    memcpy(out, n->out, sizeof(int) * (size_t)n->nout);
    out[k] = t;
    n->out = out;
    g->val[v].dtype = w->low;
    push_cast(w, t, v, w->low);
}

void pass_precision(Graph *g)
{
    if (g->opt->reduce_dtype == PREC_BF16)
        reduce_in_bf16(g);
    if (g->opt->precision == PREC_FP32)
        return;
    DType low = precision_low(g->opt->precision);
    gather_in_low(g, low);
    int nn = g->nnode, nval = g->nval;
    char *low_reader = ir_alloc((size_t)nval + 1), *grad_bound = ir_alloc((size_t)nval + 1);
    char *ew_reader = ir_alloc((size_t)nval + 1), *f32_reader = ir_alloc((size_t)nval + 1);
    int *reads = ir_alloc(sizeof(int) * ((size_t)nval + 1));
    readers_ahead(g, low_reader, grad_bound, reads, ew_reader, f32_reader);
    Rewrite w = {.g = g, .low = low};
    /* at most one cast per input and per output of every node, plus the node itself */
    int room = nn;
    for (int i = 0; i < nn; i++)
        room += g->node[i].nin + g->node[i].nout;
    w.out = ir_alloc(sizeof(Node) * (size_t)(room + 1));
    w.as16 = ir_alloc(sizeof(int) * (size_t)(nval + room));
    w.as32 = ir_alloc(sizeof(int) * (size_t)(nval + room));
    w.view = ir_alloc(sizeof(int) * (size_t)(nval + room));
    for (int v = 0; v < nval + room; v++)
        w.as16[v] = w.as32[v] = w.view[v] = -1;
    /* a product whose one reader is elementwise (a Linear's bias Add) stays float32 and counts as low
     * there: rounded once, after the addition, as torch's addmm does, and the GEMM's epilogue can add it */
    char *lowish = ir_alloc((size_t)(nval + room) + 1);
    int nfwd = 0;
    for (int i = 0; i < nn; i++) {
        Node n = g->node[i];
        int *in = ir_alloc(sizeof(int) * (size_t)(n.nin + 1));
        memcpy(in, n.in, sizeof(int) * (size_t)n.nin);
        n.in = in;
        if (i == g->nfwd) /* the backward casts what it reads to float32 itself: the forward's casts die there */
            for (int v = 0; v < nval + room; v++)
                w.as32[v] = -1;
        int nlow = 0; /* outputs [0, nlow) stored low */
        if (is_gemm(g, n.op) && g->val[n.out[0]].dtype == DT_F32) {
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && reads_low(g, &n, j) && g->val[in[j]].dtype == DT_F32)
                    in[j] = cast_of(&w, in[j], low);
                else if (in[j] >= 0 && !reads_low(g, &n, j) && is_low(g->val[in[j]].dtype))
                    in[j] = cast_of(&w, in[j], DT_F32);
            /* y; dq, dkt, dv; a convolution's gradients stay float32 */
            nlow = n.op == OP_FusedAttentionGrad ? 3 : n.op == OP_ConvGrad ? 0 : 1;
        } else if (n.op == OP_CrossEntropyGrad && is_low(g->val[in[1]].dtype)) {
            /* 16-bit logits give a 16-bit gradient (k_cross_entropy_grad_bf16), if it may be stored so */
            if (stored_low(g, low_reader, grad_bound, n.out[0]))
                g->val[n.out[0]].dtype = low;
            else
                in[1] = cast_of(&w, in[1], DT_F32);
        } else if (moves_input0(n.op) && g->val[in[0]].dtype == low) {
            for (int k = 0; k < n.nout; k++)
                if (n.out[k] >= 0)
                    g->val[n.out[k]].dtype = low;
        } else if (n.op == OP_Concat) {
            /* moved as it is when every input is low (the backward of a low Split); else the low ones widened */
            int all_low = 1;
            for (int j = 0; j < n.nin; j++)
                all_low &= in[j] >= 0 && g->val[in[j]].dtype == low;
            if (all_low)
                g->val[n.out[0]].dtype = low;
            else
                for (int j = 0; j < n.nin; j++)
                    if (in[j] >= 0 && is_low(g->val[in[j]].dtype))
                        in[j] = cast_of(&w, in[j], DT_F32);
        } else if (n.op == OP_LayerNormalization) {
            /* a 16-bit x and Y (k_layernorm_bf16) where x is low and GEMMs alone read Y (a pre-norm block's
             * LayerNorm between the 16-bit residual stream and its projections); else float32 throughout, so a
             * Y that a residual Add reads stays float32, as autocast keeps it */
            const int io = is_low(g->val[in[0]].dtype) && !f32_reader[n.out[0]] &&
                           stored_low(g, low_reader, grad_bound, n.out[0]);
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && is_low(g->val[in[j]].dtype) && !(io && j == 0))
                    in[j] = cast_of(&w, in[j], DT_F32);
            if (io)
                g->val[n.out[0]].dtype = low;
        } else if ((n.op == OP_Reshape || n.op == OP_Identity) && g->val[in[0]].dtype == DT_F32) {
            w.view[n.out[0]] = w.n; /* a later bfloat16 cast of its output may view in[0]'s instead */
        } else if (is_elementwise(&n) && g->val[n.out[0]].dtype == DT_F32) {
            /* low when every input but scalar constants is low: each low input read through a cast of its
             * own, the fused loop's load */
            int all_low = 1, any_low = 0;
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && !is_scalar_const(g, in[j])) {
                    int l = is_low(g->val[in[j]].dtype) || lowish[in[j]];
                    all_low &= l;
                    any_low |= l;
                }
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && is_low(g->val[in[j]].dtype))
                    in[j] = cast_fresh(&w, in[j], DT_F32);
            nlow = all_low && any_low;
        } else {
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && is_low(g->val[in[j]].dtype) && !reads_low(g, &n, j))
                    in[j] = cast_of(&w, in[j], DT_F32);
        }
        int at = w.n;
        w.out[w.n++] = n;
        for (int k = 0; k < nlow && k < n.nout; k++) {
            int v = n.out[k];
            if (v >= 0 && writes_low(n.op)) {
                written_low(&w, &w.out[at], k, stored_low(g, low_reader, grad_bound, v));
                continue;
            }
            if (v < 0 || !stored_low(g, low_reader, grad_bound, v))
                continue;
            if (n.op == OP_MatMul && reads[v] == 1 && ew_reader[v])
                lowish[v] = 1;
            else
                store_low(&w, &w.out[at], k);
        }
        if (i + 1 == g->nfwd)
            nfwd = w.n;
    }
    /* a float32 view whose only reader now reads the view of the cast is dead: drop it, so that what it
     * viewed is not kept alive for it */
    int *uses = ir_alloc(sizeof(int) * (size_t)(g->nval + 1));
    for (int i = 0; i < w.n; i++)
        for (int j = 0; j < w.out[i].nin; j++)
            if (w.out[i].in[j] >= 0)
                uses[w.out[i].in[j]]++;
    for (int k = 0; k < g->noutput; k++)
        uses[g->output[k]]++;
    int m = 0;
    for (int i = 0; i < w.n; i++) {
        const Node *n = &w.out[i];
        int dead = (n->op == OP_Reshape || n->op == OP_Identity) && w.view[n->out[0]] == i && !uses[n->out[0]];
        if (!dead)
            w.out[m++] = w.out[i];
        if (i + 1 == nfwd)
            nfwd = m;
    }
    ir_set_nodes(g, w.out, m);
    g->nfwd = nfwd;
}
