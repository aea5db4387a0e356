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
 *     value, before its first MatMul reader) and writes float32, accumulated
 *     in float32 — the GEMMs of forward and backward alike, as torch.autocast
 *     does; a cast activation kept for the backward is kept as bfloat16;
 *   - so does every FusedAttention (passes/attention.c) and its gradient:
 *     q, kt and v cast as MatMul operands are (the forward's casts are the
 *     backward's), y, lse, the bias, dy and the gradients float32; the
 *     kernels (k_attention_bf16) compute as flash attention does, every GEMM
 *     on bfloat16 operands, the softmax in float32;
 *   - data movement (Transpose, Gather of a table, Identity, Reshape) of a
 *     bfloat16 value stays bfloat16;
 *   - everything else reads float32: a bfloat16 input gets one Cast back per
 *     value (so LayerNorm scales, biases, Conv weights compute in float32 on
 *     the rounded values);
 *   - gradients, the master shards and the optimizer state stay float32
 *     (FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)).
 * --reduce-dtype bf16 (with either --precision): every ReduceScatter gets a
 * second output, a bf16 buffer of the flat gradient's size that the runtime
 * reduces in (half the bytes on the wire), the result landing in the fp32
 * gradient shard.
 * The set of ops that may read bfloat16 is precision_reads_bf16; ir_verify
 * holds every later pass to it.
 */
#include "ir.h"

#include <string.h>

enum { ONNX_FLOAT = 1, ONNX_FLOAT16 = 10, ONNX_BFLOAT16 = 16 };

/* ops whose input 0 is only moved: a bfloat16 input gives a bfloat16 output */
static int moves_input0(Op op)
{
    return op == OP_Transpose || op == OP_Gather || op == OP_Identity || op == OP_Reshape;
}

int precision_reads_bf16(const Node *n, int input)
{
    switch (n->op) {
    case OP_MatMul: case OP_Free: case OP_Wait: return 1;
    case OP_MatMulAdd: return input < 2; /* the operands; the bias and addend have the float32 result's dtype */
    case OP_FusedAttention: return input < 3; /* q, kt, v; the bias is float32 */
    case OP_FusedAttentionGrad: return input >= 1 && input <= 3; /* q, kt, v; dy, y, lse, bias are float32 */
    case OP_Cast: return input == 0;
    default: return input == 0 && moves_input0(n->op);
    }
}

DType precision_low(Precision p) { return p == PREC_FP16 ? DT_F16 : DT_BF16; }

static int is_low(DType t) { return t == DT_BF16 || t == DT_F16; }

/* ops whose operands (precision_reads_bf16's inputs) a float32 result reads in the low dtype */
static int is_gemm(Op op) { return op == OP_MatMul || op == OP_FusedAttention || op == OP_FusedAttentionGrad; }

typedef struct {
    Graph *g;
    Node *out;
    int n;
    DType low;        /* DT_BF16 or DT_F16 */
    int *as16, *as32; /* per value: its Cast to the low dtype / float32, -1 if none yet */
    int *view;        /* per value: the Reshape / Identity (index in out) that made it of a float32 value */
} Rewrite;

/* the value v cast to dtype `to` (w->low or float32), made once, before the node being emitted.
 * A view (Reshape, Identity) of a value already cast to the low dtype becomes the
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
        Shape s = g->val[v].shape; /* ir_value may move g->val */
        int *in = ir_alloc(sizeof(int) * (size_t)(n.nin + 1)), *out = ir_alloc(sizeof(int));
        memcpy(in, n.in, sizeof(int) * (size_t)n.nin);
        in[0] = w->as16[n.in[0]];
        out[0] = ir_value(g, ir_fmt("%s.%s", g->val[v].name, dtype_name(to)), to, &s, R_ACT);
        n.in = in;
        n.out = out;
        n.nout = 1;
        n.name = ir_fmt("%s.%s", n.name, dtype_name(to));
        w->out[w->n++] = n;
        return cache[v] = out[0];
    }
    Shape s = g->val[v].shape; /* ir_value may move g->val */
    int c = ir_value(g, ir_fmt("%s.%s", g->val[v].name, dtype_name(to)), to, &s, R_ACT);
    Attr *a = ir_alloc(sizeof(Attr));
    *a = (Attr){.name = "to", .kind = A_INT, .i = to == DT_BF16 ? ONNX_BFLOAT16 : to == DT_F16 ? ONNX_FLOAT16 : ONNX_FLOAT};
    Node n = {.op = OP_Cast, .name = ir_fmt("%s.to_%s", g->val[v].name, dtype_name(to)), .nin = 1, .nout = 1,
              .in = ir_alloc(sizeof(int)), .out = ir_alloc(sizeof(int)), .nattr = 1, .attr = a, .unit = -1};
    n.in[0] = v;
    n.out[0] = c;
    w->out[w->n++] = n;
    return cache[v] = c;
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

void pass_precision(Graph *g)
{
    if (g->opt->reduce_dtype == PREC_BF16)
        reduce_in_bf16(g);
    if (g->opt->precision == PREC_FP32)
        return;
    DType low = precision_low(g->opt->precision);
    gather_in_low(g, low);
    int nn = g->nnode, nval = g->nval;
    Rewrite w = {.g = g, .low = low};
    /* at most one cast per input of every node, plus the node itself */
    int room = nn;
    for (int i = 0; i < nn; i++)
        room += g->node[i].nin;
    w.out = ir_alloc(sizeof(Node) * (size_t)(room + 1));
    w.as16 = ir_alloc(sizeof(int) * (size_t)(nval + room));
    w.as32 = ir_alloc(sizeof(int) * (size_t)(nval + room));
    w.view = ir_alloc(sizeof(int) * (size_t)(nval + room));
    for (int v = 0; v < nval + room; v++)
        w.as16[v] = w.as32[v] = w.view[v] = -1;
    int nfwd = 0;
    for (int i = 0; i < nn; i++) {
        Node n = g->node[i];
        int *in = ir_alloc(sizeof(int) * (size_t)(n.nin + 1));
        memcpy(in, n.in, sizeof(int) * (size_t)n.nin);
        n.in = in;
        if (is_gemm(n.op) && g->val[n.out[0]].dtype == DT_F32) {
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && precision_reads_bf16(&n, j) && g->val[in[j]].dtype == DT_F32)
                    in[j] = cast_of(&w, in[j], low);
                else if (in[j] >= 0 && !precision_reads_bf16(&n, j) && is_low(g->val[in[j]].dtype))
                    in[j] = cast_of(&w, in[j], DT_F32);
        } else if (moves_input0(n.op) && g->val[in[0]].dtype == low) {
            g->val[n.out[0]].dtype = low;
        } else if ((n.op == OP_Reshape || n.op == OP_Identity) && g->val[in[0]].dtype == DT_F32) {
            w.view[n.out[0]] = w.n; /* a later bfloat16 cast of its output may view in[0]'s instead */
        } else {
            for (int j = 0; j < n.nin; j++)
                if (in[j] >= 0 && is_low(g->val[in[j]].dtype) && !precision_reads_bf16(&n, j))
                    in[j] = cast_of(&w, in[j], DT_F32);
        }
        w.out[w.n++] = n;
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
