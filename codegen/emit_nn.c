/* emit_nn.c — the step code of the nn family (conv, pooling, normalisation,
 * softmax, reductions, dropout, losses) and of its backward ops.
 *
 * Each node is one or two kernel calls (kernels/c/kernels.h) with its
 * geometry as a static KConv2d / KPool2d or shape arrays; the step never
 * touches tensor data itself (on the cuda target it lives on the device).
 * SoftmaxCrossEntropyLoss is k_softmax (the log-probabilities) then
 * k_nll_loss (the label pick, ignore_index, class weights, the reduction);
 * its backward is k_nll_loss_grad (the scatter into dlog_prob) then
 * k_softmax_grad.  NegativeLogLikelihoodLoss is k_nll_loss alone on given
 * log-probabilities, and its backward k_nll_loss_grad alone.
 *
 * Dropout draws its mask from (c->seed: NN_DROPOUT_SEED unless the run gives --seed, the node's `stream` attribute
 * (a hash of its ONNX name, see shape_nn.c), the step, the element index): not from the rank, as PyTorch DDP ranks
 * seeded alike draw the same masks.  Assign is a memcpy into a constant's
 * bytes in the arena, which the runtime loads once, so the value persists
 * from step to step (BatchNormalization's running statistics).
 */
#include "cg.h"
#include "../ir/rules/nn.h"

#include <stdint.h>
#include <string.h>

static const char *P(Cg *cg, int v) { return cg_ptr(cg, v); }
static const char *opt(Cg *cg, int v) { return v >= 0 ? cg_ptr(cg, v) : "NULL"; }
static int input(const Node *n, int i) { return i < n->nin ? n->in[i] : -1; }

/* the pointer of result i of a backward op with attribute need, or NULL */
static const char *wanted(Cg *cg, const Node *n, int i)
{
    return ir_attr_i(n, "need", 0) >> i & 1 ? cg_ptr(cg, n->out[i]) : "NULL";
}

static const char *conv_lit(const KConv2d *p)
{
    return ir_fmt("{.n = %lld, .c = %lld, .h = %lld, .w = %lld, .m = %lld, .kh = %lld, .kw = %lld, "
                  ".oh = %lld, .ow = %lld, .sh = %lld, .sw = %lld, .dh = %lld, .dw = %lld, .pt = %lld, "
                  ".pl = %lld, .pb = %lld, .pr = %lld, .groups = %lld}",
                  (long long)p->n, (long long)p->c, (long long)p->h, (long long)p->w, (long long)p->m,
                  (long long)p->kh, (long long)p->kw, (long long)p->oh, (long long)p->ow, (long long)p->sh,
                  (long long)p->sw, (long long)p->dh, (long long)p->dw, (long long)p->pt, (long long)p->pl,
                  (long long)p->pb, (long long)p->pr, (long long)p->groups);
}

static const char *pool_lit(const KPool2d *p)
{
    return ir_fmt("{.n = %lld, .c = %lld, .h = %lld, .w = %lld, .kh = %lld, .kw = %lld, .oh = %lld, "
                  ".ow = %lld, .sh = %lld, .sw = %lld, .dh = %lld, .dw = %lld, .pt = %lld, .pl = %lld, "
                  ".pb = %lld, .pr = %lld, .count_include_pad = %d}",
                  (long long)p->n, (long long)p->c, (long long)p->h, (long long)p->w, (long long)p->kh,
                  (long long)p->kw, (long long)p->oh, (long long)p->ow, (long long)p->sh, (long long)p->sw,
                  (long long)p->dh, (long long)p->dw, (long long)p->pt, (long long)p->pl, (long long)p->pb,
                  (long long)p->pr, p->count_include_pad);
}

/* ---- broadcasting binary ops (ops.def's EW2), their derivative rows ------- */

/* strides of operand shape s broadcast to y (0 on broadcast dims) */
static const char *bstrides(const Shape *s, const Shape *y)
{
    int64_t st[MAX_RANK], acc = 1;
    for (int i = y->rank - 1; i >= 0; i--) {
        int k = i - (y->rank - s->rank);
        int64_t d = k >= 0 ? s->dim[k] : 1;
        st[i] = d == 1 ? 0 : acc;
        acc *= d;
    }
    return cg_ints(st, y->rank);
}

void cg_binary(Cg *cg, Buf *b, const char *op, int y, const char *py, int a, const char *pa, int bb,
               const char *pb)
{
    const Graph *g = cg->g;
    const Shape *ys = &g->val[y].shape;
    cg_put(b, "    { static const int64_t sh[] = %s, sa[] = %s, sb[] = %s;\n", cg_ints(ys->dim, ys->rank),
           bstrides(&g->val[a].shape, ys), bstrides(&g->val[bb].shape, ys));
    cg_put(b, "      k_binary_%s(%s, %s, %s, %s, %d, sh, sa, sb); }\n", cg_sfx(g->val[y].dtype), op, py, pa, pb,
           ys->rank);
}

/* int64 index arithmetic: a division by zero fails the step naming the node */
void cg_binary_i64(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int y = n->out[0];
    const Shape *ys = &g->val[y].shape;
    cg_put(b, "    { static const int64_t sh[] = %s, sa[] = %s, sb[] = %s;\n", cg_ints(ys->dim, ys->rank),
           bstrides(&g->val[n->in[0]].shape, ys), bstrides(&g->val[n->in[1]].shape, ys));
    cg_put(b, "      int64_t bad = k_binary_i64(%s, %s, %s, %s, %d, sh, sa, sb);\n", cg_kernel_op(n->op), P(cg, y),
           P(cg, n->in[0]), P(cg, n->in[1]), ys->rank);
    cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"node %%s (%s): integer division by zero at position "
                           "%%lld of its output\", %s, (long long)bad); }\n", op_info[n->op].name, cg_cstr(n->name)),
                 ir_fmt("node %s (%s): integer division by zero", n->name, op_info[n->op].name));
}

/* t = the forward op's derivative row (POW_DA, MIN_DB, ...) of (a, b) at dy's
 * shape, then t *= dy */
static void emit_binary_grad(Cg *cg, Buf *b, const Node *n)
{
    int t = n->out[0], dy = n->in[0];
    const char *op = ir_fmt("K_%s", op_info[ir_attr_i(n, "of", 0)].dkname[ir_attr_i(n, "wrt", 0) != 0]);
    cg_binary(cg, b, op, t, P(cg, t), n->in[1], P(cg, n->in[1]), n->in[2], P(cg, n->in[2]));
    cg_binary(cg, b, "K_MUL", t, P(cg, t), t, P(cg, t), dy, P(cg, dy));
}

/* ---- Conv -------------------------------------------------------------- */

static void emit_conv(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    KConv2d p;
    nn_conv_geom(g, n, &g->val[n->in[0]].shape, &g->val[n->in[1]].shape, &p);
    int ws = n->out[1];
    cg_put(b, "    { static const KConv2d p = %s;\n", conv_lit(&p));
    cg_put(b, "      k_conv2d_%s(&p, %s, %s, %s, %s, %s); }\n",
           cg_gemm_sfx(g->val[n->in[0]].dtype, g->val[n->in[0]].dtype), P(cg, n->out[0]),
           P(cg, n->in[0]), P(cg, n->in[1]), opt(cg, input(n, 2)), value_numel(g, ws) ? P(cg, ws) : "NULL");
}

static void emit_conv_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    Shape xs = cg_attr_shape(n, "xshape"), wsh = cg_attr_shape(n, "wshape");
    KConv2d p;
    nn_conv_geom(g, n, &xs, &wsh, &p);
    int need = (int)ir_attr_i(n, "need", 0), ws = n->out[3];
    const DType t = g->val[n->in[0]].dtype; /* a 16-bit dy: the _bf16 / _f16 kernels, float32 results */
    const char *s = cg_gemm_sfx(t, t), *scr = value_numel(g, ws) ? P(cg, ws) : "NULL";
    cg_put(b, "    { static const KConv2d p = %s;\n", conv_lit(&p));
    if (need & 1)
        cg_put(b, "      k_conv2d_grad_x_%s(&p, %s, %s, %s, %s);\n", s, P(cg, n->out[0]), P(cg, n->in[0]),
               P(cg, n->in[2]), scr);
    if (need & 2)
        cg_put(b, "      k_conv2d_grad_w_%s(&p, %s, %s, %s, %s);\n", s, P(cg, n->out[1]), P(cg, n->in[0]),
               P(cg, n->in[1]), scr);
    if (need & 4)
        cg_put(b, "      k_conv2d_grad_b_%s(&p, %s, %s);\n", s, P(cg, n->out[2]), P(cg, n->in[0]));
    cg_put(b, "    }\n");
}

/* ---- normalisation ------------------------------------------------------ */

/* n, c, l of a BatchNormalization input */
static void bn_dims(const Shape *x, int64_t d[3])
{
    d[0] = x->dim[0];
    d[1] = x->dim[1];
    d[2] = 1;
    for (int i = 2; i < x->rank; i++)
        d[2] *= x->dim[i];
}

/* An --eval build follows the ONNX spec, whose running var mixes in the
 * biased batch variance; training follows torch.nn.BatchNorm (unbiased, as
 * k_batchnorm_train).  k_bn_running_var recovers the biased variance from
 * the saved invstd (1 / invstd^2 - eps). */
static void emit_onnx_running_var(Cg *cg, Buf *b, const Node *n, int64_t c, double eps, double mom)
{
    const Graph *g = cg->g;
    cg_put(b, "    k_bn_running_var_%s(%s, %s, %s, %lld, %.17g, %.17g);\n", cg_sfx(g->val[n->out[2]].dtype),
           P(cg, n->out[2]), P(cg, n->in[4]), P(cg, n->out[4]), (long long)c, eps, mom);
}

static void emit_batchnorm(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int64_t d[3];
    bn_dims(&g->val[n->in[0]].shape, d);
    const char *s = cg_sfx(g->val[n->out[0]].dtype);
    double eps = ir_attr_f(n, "epsilon", 1e-5), mom = ir_attr_f(n, "momentum", 0.9);
    const int *in = n->in, *o = n->out;
    int onnx_var = g->opt->eval; /* see emit_onnx_running_var */
    if (nn_bn_training(n)) { /* a validation pass uses the running statistics, as torch's eval mode */
        if (!g->opt->eval)
            cg_put(b, "    if (c->validating)\n        k_batchnorm_infer_%s(%s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %.17g);\n"
                      "    else\n", s, P(cg, o[0]), P(cg, in[0]), P(cg, in[1]), P(cg, in[2]), P(cg, in[3]), P(cg, in[4]),
                   (long long)d[0], (long long)d[1], (long long)d[2], eps);
        cg_put(b, "    k_batchnorm_train_%s(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %.17g, %.17g);\n",
               s, P(cg, o[0]), P(cg, o[3]), P(cg, o[4]), P(cg, o[1]), onnx_var ? "NULL" : P(cg, o[2]), P(cg, in[0]),
               P(cg, in[1]), P(cg, in[2]), P(cg, in[3]), P(cg, in[4]), (long long)d[0], (long long)d[1], (long long)d[2],
               eps, mom);
        if (onnx_var)
            emit_onnx_running_var(cg, b, n, d[1], eps, mom);
    } else
        cg_put(b, "    k_batchnorm_infer_%s(%s, %s, %s, %s, %s, %s, %lld, %lld, %lld, %.17g);\n", s, P(cg, o[0]),
               P(cg, in[0]), P(cg, in[1]), P(cg, in[2]), P(cg, in[3]), P(cg, in[4]), (long long)d[0], (long long)d[1],
               (long long)d[2], eps);
}

static void emit_batchnorm_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int64_t d[3];
    bn_dims(&g->val[n->in[0]].shape, d);
    cg_put(b, "    k_batchnorm_grad_%s(%s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld, %lld);\n",
           cg_sfx(g->val[n->in[0]].dtype), wanted(cg, n, 0), wanted(cg, n, 1), wanted(cg, n, 2), P(cg, n->in[0]),
           P(cg, n->in[1]), P(cg, n->in[2]), P(cg, n->in[3]), P(cg, n->in[4]), (long long)d[0], (long long)d[1],
           (long long)d[2]);
}

/* outer x inner of LayerNormalization's input (inner: the dims from axis) */
static void ln_dims(const Graph *g, const Node *n, const Shape *x, int64_t *outer, int64_t *inner)
{
    int ax = nn_axis(g, n, ir_attr_i(n, "axis", -1), x->rank, "axis");
    int64_t a;
    nn_split(x, ax, outer, &a, inner);
    *inner *= a;
}

static void emit_layernorm(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int64_t outer, inner;
    ln_dims(g, n, &g->val[n->in[0]].shape, &outer, &inner);
    /* 16-bit x and y under --precision (passes/precision.c): k_layernorm_bf16 / _f16 */
    cg_put(b, "    k_layernorm_%s(%s, %s, %s, %s, %s, %s, %lld, %lld, %.17g);\n",
           cg_gemm_sfx(g->val[n->in[0]].dtype, g->val[n->out[0]].dtype),
           P(cg, n->out[0]), P(cg, n->out[1]), P(cg, n->out[2]), P(cg, n->in[0]), P(cg, n->in[1]), opt(cg, input(n, 2)),
           (long long)outer, (long long)inner, ir_attr_f(n, "epsilon", 1e-5));
}

static void emit_layernorm_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int64_t outer, inner;
    ln_dims(g, n, &g->val[n->in[0]].shape, &outer, &inner);
    /* a 16-bit x on the cpu target under --precision (passes/precision.c): k_layernorm_grad_bf16 / _f16 */
    cg_put(b, "    k_layernorm_grad_%s(%s, %s, %s, %s, %s, %s, %s, %s, %lld, %lld);\n",
           cg_gemm_sfx(g->val[n->in[1]].dtype, g->val[n->in[0]].dtype), wanted(cg, n, 0), wanted(cg, n, 1),
           wanted(cg, n, 2), P(cg, n->in[0]), P(cg, n->in[1]), P(cg, n->in[2]), P(cg, n->in[3]),
           opt(cg, input(n, 4)), (long long)outer, (long long)inner);
}

/* ---- fused attention ------------------------------------------------------ */

/* the attention's row strides: attrs ldq .. lddv (passes/pack.c: q, k, v read out of their packed projection,
 * dq, dk, dv written into its packed gradient) as a KAttnLd, or NULL where it has none (the heads layout's) */
static const char *attention_ld(const Node *n)
{
    static const char *const attr[7] = {"ldq", "ldk", "ldv", "ldy", "lddq", "lddk", "lddv"};
    int64_t ld[7], any = 0;
    for (int k = 0; k < 7; k++)
        any |= ld[k] = ir_attr_i(n, attr[k], 0);
    if (!any)
        return "NULL";
    return ir_fmt("&(const KAttnLd){%lld, %lld, %lld, %lld, %lld, %lld, %lld}", (long long)ld[0], (long long)ld[1],
                  (long long)ld[2], (long long)ld[3], (long long)ld[4], (long long)ld[5], (long long)ld[6]);
}

/* FusedAttention and its gradient: the problems (q's leading dims, with heads its heads too: ir_attn_problems;
 * kt and v hold batch / kvrep) and t, s, d, dv from the shapes; the kernel of q's dtype (bf16 / f16: 16-bit q, kt,
 * v under --precision, everything else float32) */
static void emit_attention(Cg *cg, Buf *b, const Node *n, int grad)
{
    const Graph *g = cg->g;
    const int q = n->in[grad], kt = n->in[grad + 1], v = n->in[grad + 2], bias = input(n, grad ? 6 : 3);
    const Shape *qs = &g->val[q].shape, *vs = &g->val[v].shape;
    const int r = qs->rank, flags = (ir_attr_i(n, "krow", 0) ? K_ATTN_KROW : 0) |
                                    (ir_attr_i(n, "zero_rows", 0) ? K_ATTN_ZERO : 0) |
                                    (ir_attr_i(n, "causal", 0) ? K_ATTN_CAUSAL : 0) |
                                    (int)ir_attr_i(n, "window", 0) << K_ATTN_WINDOW_SHIFT;
    const char *sfx = cg_gemm_sfx(g->val[q].dtype, g->val[n->out[0]].dtype);
    const int rows = ir_attn_rows_axis(n, qs);
    /* the attention dropout (passes/attention.c): drawn as emit_dropout's Dropout would, ratio 0 in validation */
    const double drop = ir_attr_f(n, "dropout", 0);
    const char *dr = drop > 0 ? ir_fmt("c->validating ? 0.0 : %.17g, c->seed, %#xu, (uint32_t)c->step", drop,
                                       (unsigned)ir_attr_i(n, "stream", 0))
                              : "0.0, 0, 0u, 0u";
    const char *dims = ir_fmt("%lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %lld, %.17g, %s, %s, %s",
                              (long long)ir_attn_problems(n, qs), (long long)qs->dim[rows], (long long)vs->dim[rows],
                              (long long)qs->dim[r - 1], (long long)vs->dim[r - 1], (long long)ir_attr_i(n, "nbias", 1),
                              (long long)ir_attr_i(n, "brep", 1), (long long)ir_attr_i(n, "kvrep", 1),
                              (long long)ir_attr_i(n, "heads", 0), ir_attr_f(n, "scale", 1.0), dr,
                              P(cg, n->out[grad ? 3 : 2]), attention_ld(n));
    if (!grad)
        cg_put(b, "    k_attention_%s(%s, %s, %s, %s, %d, %s, %s, %s);\n", sfx, P(cg, n->out[0]),
               P(cg, n->out[1]), P(cg, q), P(cg, kt), flags, P(cg, v), opt(cg, bias), dims);
    else
        cg_put(b, "    k_attention_grad_%s(%s, %s, %s, %s, %s, %s, %s, %d, %s, %s, %s, %s, %s);\n",
               sfx, P(cg, n->out[0]), P(cg, n->out[1]), P(cg, n->out[2]),
               opt(cg, n->nout > 4 ? n->out[4] : -1), P(cg, n->in[0]), P(cg, q), P(cg, kt), flags, P(cg, v), opt(cg, bias),
               P(cg, n->in[4]), P(cg, n->in[5]), dims);
}

/* ---- softmax ------------------------------------------------------------ */

static void emit_softmax(Cg *cg, Buf *b, const Node *n, int grad)
{
    const Graph *g = cg->g;
    const Shape *x = &g->val[n->out[0]].shape;
    int64_t o, a, i;
    nn_split(x, nn_axis(g, n, ir_attr_i(n, "axis", -1), x->rank, "axis"), &o, &a, &i);
    const char *s = cg_sfx(g->val[n->out[0]].dtype);
    if (grad)
        cg_put(b, "    k_softmax_grad_%s(%d, %s, %s, %s, %lld, %lld, %lld);\n", s, (int)ir_attr_i(n, "log", 0),
               P(cg, n->out[0]), P(cg, n->in[0]), P(cg, n->in[1]), (long long)o, (long long)a, (long long)i);
    else
        cg_put(b, "    k_softmax_%s(%d, %s, %s, %lld, %lld, %lld);\n", s, n->op == OP_LogSoftmax,
               P(cg, n->out[0]), P(cg, n->in[0]), (long long)o, (long long)a, (long long)i);
}

/* ---- pooling ------------------------------------------------------------ */

static void emit_pool(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    KPool2d p;
    int grad = n->op == OP_MaxPoolGrad || n->op == OP_AveragePoolGrad;
    nn_pool_geom(g, n, &g->val[grad ? n->out[0] : n->in[0]].shape, &p);
    const char *s = cg_sfx(g->val[n->out[0]].dtype), *y = P(cg, n->out[0]), *x = P(cg, n->in[0]);
    cg_put(b, "    { static const KPool2d p = %s;\n", pool_lit(&p));
    switch (n->op) {
    case OP_MaxPool:
        cg_put(b, "      k_maxpool2d_%s(&p, %s, %s, %s);\n", s, y, P(cg, n->out[2]), x);
        if (ir_is_read(g, n->out[1]) && cg->cuda)
            fatal("node '%s' (MaxPool): its Indices output is not supported by --target cuda yet; use --target cpu",
                  ir_q(n->name));
        if (ir_is_read(g, n->out[1])) /* ONNX Indices: flat over the whole tensor */
            cg_put(b, "      for (int64_t i = 0; i < %lld; i++) %s[i] = i / %lld * %lld + %s[i];\n",
                   (long long)(p.n * p.c * p.oh * p.ow), P(cg, n->out[1]), (long long)(p.oh * p.ow),
                   (long long)(p.h * p.w), P(cg, n->out[2]));
        break;
    case OP_MaxPoolGrad: cg_put(b, "      k_maxpool2d_grad_%s(&p, %s, %s, %s);\n", s, y, x, P(cg, n->in[1])); break;
    case OP_AveragePool: cg_put(b, "      k_avgpool2d_%s(&p, %s, %s);\n", s, y, x); break;
    default: cg_put(b, "      k_avgpool2d_grad_%s(&p, %s, %s);\n", s, y, x); break;
    }
    cg_put(b, "    }\n");
}

static void emit_global_pool(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int grad = n->op == OP_GlobalAveragePoolGrad;
    const Shape *x = &g->val[grad ? n->out[0] : n->in[0]].shape;
    int64_t nc = x->dim[0] * x->dim[1], hw = shape_numel(x) / (nc ? nc : 1);
    cg_put(b, "    k_global_avgpool%s_%s(%s, %s, %lld, %lld);\n", grad ? "_grad" : "", cg_sfx(g->val[n->out[0]].dtype),
           P(cg, n->out[0]), P(cg, n->in[0]), (long long)nc, (long long)hw);
}

/* ---- reductions --------------------------------------------------------- */

static const char *reduce_op(Op op)
{
    switch (op) {
    case OP_ReduceSum: return "K_RSUM";
    case OP_ReduceMean: return "K_RMEAN";
    case OP_ReduceMax: return "K_RMAX";
    case OP_ReduceMin: return "K_RMIN";
    case OP_ReduceProd: return "K_RPROD";
    default: die("reduce_op: %s is no reduction", op_info[op].name);
    }
}

static void copy_or_view(Cg *cg, Buf *b, int y, int x)
{
    const Graph *g = cg->g;
    if (cg_same_place(g, y, x))
        cg_put(b, "    /* a view: no data moves */\n");
    else
        cg_put(b, "    rt_memcpy(%s, %s, %lld);\n", P(cg, y), P(cg, x),
               (long long)(value_numel(g, x) * (int64_t)dtype_size(g->val[x].dtype)));
}

static void emit_reduce(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Shape *x = &g->val[n->in[0]].shape;
    Shape kept;
    char red[MAX_RANK];
    if (!nn_reduce_dims(g, n, x, &kept, red)) {
        copy_or_view(cg, b, n->out[0], n->in[0]);
        return;
    }
    cg_put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", cg_ints(x->dim, x->rank),
           cg_ints(kept.dim, kept.rank));
    cg_put(b, "      k_reduce_%s(%s, %s, %s, %d, xs, ys); }\n", cg_sfx(g->val[n->out[0]].dtype), reduce_op(n->op),
           P(cg, n->out[0]), P(cg, n->in[0]), x->rank);
}

/* Sum / Mean: dx = dy broadcast (k_copy_strided, stride 0 on reduced dims),
 * scaled by 1 / count for Mean; Max: split among the maxima */
static void emit_reduce_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Shape *x = &g->val[n->out[0]].shape;
    Shape y = cg_attr_shape(n, "yshape");
    Op of = (Op)ir_attr_i(n, "of", 0);
    const char *s = cg_sfx(g->val[n->out[0]].dtype);
    int64_t dense[MAX_RANK], ys[MAX_RANK], acc = 1, yacc = 1;
    for (int i = x->rank - 1; i >= 0; i--) {
        dense[i] = acc;
        ys[i] = y.dim[i] == 1 ? 0 : yacc;
        acc *= x->dim[i];
        yacc *= y.dim[i];
    }
    if (of == OP_ReduceProd) {
        cg_put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", cg_ints(x->dim, x->rank), cg_ints(y.dim, y.rank));
        cg_put(b, "      k_reduce_prod_grad_%s(%s, %s, %s, %d, xs, ys); }\n", s, P(cg, n->out[0]), P(cg, n->in[0]),
               P(cg, n->in[1]), x->rank);
        return;
    }
    if (of == OP_ReduceMax || of == OP_ReduceMin) {
        cg_put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", cg_ints(x->dim, x->rank), cg_ints(y.dim, y.rank));
        cg_put(b, "      k_reduce_max_grad_%s(%s, %s, %s, %s, %d, xs, ys); }\n", s, P(cg, n->out[0]), P(cg, n->in[0]),
               P(cg, n->in[1]), P(cg, n->in[2]), x->rank);
        return;
    }
    cg_put(b, "    { static const int64_t xs[] = %s, xst[] = %s, yst[] = %s;\n", cg_ints(x->dim, x->rank),
           cg_ints(dense, x->rank), cg_ints(ys, x->rank));
    cg_put(b, "      k_copy_strided(%d, %d, xs, %s, 0, xst, %s, 0, yst); }\n", (int)dtype_size(g->val[n->out[0]].dtype),
           x->rank, P(cg, n->out[0]), P(cg, n->in[0]));
    if (of == OP_ReduceMean)
        cg_put(b, "    k_scale_%s(%s, %s, 1.0 / %lld, %lld);\n", s, P(cg, n->out[0]), P(cg, n->out[0]),
               (long long)(acc / (yacc ? yacc : 1)), (long long)acc);
}

/* ---- dropout ------------------------------------------------------------ */

static void emit_dropout(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int y = n->out[0], x = n->in[0];
    int64_t ny = value_numel(g, y);
    if (!nn_dropout_training(g, n)) {
        copy_or_view(cg, b, y, x);
        cg_put(b, "    rt_memset(%s, 1, %lld);\n", P(cg, n->out[1]), (long long)ny);
        return;
    }
    /* a validation pass (c->validating) runs it as ratio 0: the identity, as torch's eval mode */
    cg_put(b, "    k_dropout_%s(%s, %s, %s, %lld, c->validating ? 0.0 : %.17g, c->seed, %#xu, (uint32_t)c->step);\n",
           cg_sfx(g->val[y].dtype), P(cg, y), P(cg, n->out[1]), P(cg, x), (long long)ny, nn_dropout_ratio(g, n),
           (unsigned)ir_attr_i(n, "stream", 0));
}

static void emit_dropout_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    cg_put(b, "    k_dropout_grad_%s(%s, %s, %s, %lld, %.17g);\n", cg_sfx(g->val[n->out[0]].dtype), P(cg, n->out[0]),
           P(cg, n->in[0]), P(cg, n->in[1]), (long long)value_numel(g, n->out[0]), ir_attr_f(n, "ratio", 0));
}

/* ---- SoftmaxCrossEntropyLoss ------------------------------------------- */

typedef struct {
    int64_t n, c, d;     /* scores n x c x d (d: product of the trailing dims) */
    int red, has_ii;
    int64_t ii;
    const char *s;       /* kernel suffix */
} Sce;

static Sce sce_dims(const Graph *g, const Node *n, int scores)
{
    const Shape *x = &g->val[scores].shape;
    int64_t nc = x->dim[0] * x->dim[1];
    Sce q = {x->dim[0], x->dim[1], nc ? shape_numel(x) / nc : 0,
             nn_sce_reduction(g, n), ir_attr(n, "ignore_index") != NULL, ir_attr_i(n, "ignore_index", 0),
             cg_sfx(g->val[scores].dtype)};
    return q;
}

/* the k_nll_loss(_grad) arguments after the labels: weights, n, c, d, the
 * reduction and ignore_index */
static const char *nll_args(const Sce *q, const char *wt)
{
    static const char *const red[] = {[NN_NONE] = "K_LOSS_NONE", [NN_SUM] = "K_LOSS_SUM",
                                      [NN_MEAN] = "K_LOSS_MEAN"};
    const char *ii = q->ii == INT64_MIN ? "INT64_MIN" : ir_fmt("%lldLL", (long long)q->ii);
    return ir_fmt("%s, %lld, %lld, %lld, %s, %d, %s", wt ? wt : "NULL", (long long)q->n, (long long)q->c,
                  (long long)q->d, red[q->red], q->has_ii, ii);
}

static void emit_sce(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    Sce q = sce_dims(g, n, n->in[0]);
    int nll = n->op == OP_NegativeLogLikelihoodLoss;
    const char *lp = P(cg, nll ? n->in[0] : n->out[1]), *lab = P(cg, n->in[1]);
    const char *wt = input(n, 2) >= 0 ? P(cg, n->in[2]) : NULL, *lname = g->val[n->in[1]].name;
    if (!nll)
        cg_put(b, "    k_softmax_%s(1, %s, %s, %lld, %lld, %lld);\n", q.s, lp, P(cg, n->in[0]), (long long)q.n,
               (long long)q.c, (long long)q.d);
    cg_put(b, "    { int64_t bad = k_nll_loss_%s(%s, %s, %s, %s);\n", q.s, P(cg, n->out[0]), lp, lab, nll_args(&q, wt));
    cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"%%s: label %%lld at position %%lld of this rank's "
                           "batch is outside [0, %lld)\", %s, (long long)%s[bad], (long long)bad); }\n",
                           (long long)q.c, cg_cstr(lname), lab),
                 ir_fmt("%s: a label of this rank's batch is outside [0, %lld)", lname, (long long)q.c));
}

/* in: log_prob, labels, dloss, weights, dlog_prob (the other consumers' part) */
static void emit_sce_grad(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    Sce q = sce_dims(g, n, n->out[0]);
    const char *dx = P(cg, n->out[0]), *lp = P(cg, n->in[0]);
    const char *wt = input(n, 3) >= 0 ? P(cg, n->in[3]) : NULL;
    cg_put(b, "    k_nll_loss_grad_%s(%s, %s, %s, %s, %s);\n", q.s, dx, opt(cg, input(n, 4)), opt(cg, input(n, 2)),
           P(cg, n->in[1]), nll_args(&q, wt));
    if (!ir_attr_i(n, "nll", 0))
        cg_put(b, "    k_softmax_grad_%s(1, %s, %s, %s, %lld, %lld, %lld);\n", q.s, dx, dx, lp, (long long)q.n,
               (long long)q.c, (long long)q.d);
}

/* ---- the family --------------------------------------------------------- */

const char *cg_nn_state_name(const Graph *g, int v)
{
    for (int i = 0; i < g->nnode; i++)
        if (g->node[i].op == OP_Assign && g->node[i].in[0] == v && g->val[v].init_index >= 0)
            return cg_cstr(g->val[v].name);
    return "0";
}

int cg_nn(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    if (op_info[n->op].flags & F_REDUCE) {
        emit_reduce(cg, b, n);
        return 1;
    }
    switch (n->op) {
    case OP_BinaryGrad: emit_binary_grad(cg, b, n); break;
    case OP_Conv: emit_conv(cg, b, n); break;
    case OP_ConvGrad: emit_conv_grad(cg, b, n); break;
    case OP_BatchNormalization: emit_batchnorm(cg, b, n); break;
    case OP_BatchNormGrad: emit_batchnorm_grad(cg, b, n); break;
    case OP_LayerNormalization: emit_layernorm(cg, b, n); break;
    case OP_LayerNormGrad: emit_layernorm_grad(cg, b, n); break;
    case OP_Softmax: case OP_LogSoftmax: emit_softmax(cg, b, n, 0); break;
    case OP_SoftmaxGrad: emit_softmax(cg, b, n, 1); break;
    case OP_FusedAttention: emit_attention(cg, b, n, 0); break;
    case OP_FusedAttentionGrad: emit_attention(cg, b, n, 1); break;
    case OP_MaxPool: case OP_MaxPoolGrad: case OP_AveragePool: case OP_AveragePoolGrad: emit_pool(cg, b, n); break;
    case OP_GlobalAveragePool: case OP_GlobalAveragePoolGrad: emit_global_pool(cg, b, n); break;
    case OP_ReduceGrad: emit_reduce_grad(cg, b, n); break;
    case OP_Dropout: emit_dropout(cg, b, n); break;
    case OP_DropoutGrad: emit_dropout_grad(cg, b, n); break;
    case OP_SoftmaxCrossEntropyLoss: case OP_NegativeLogLikelihoodLoss: emit_sce(cg, b, n); break;
    case OP_SoftmaxCrossEntropyGrad: emit_sce_grad(cg, b, n); break;
    case OP_Assign:
        cg_put(b, "    rt_memcpy(%s, %s, %lld);\n", P(cg, n->in[0]), P(cg, n->in[1]),
               (long long)(value_numel(g, n->in[1]) * (int64_t)dtype_size(g->val[n->in[1]].dtype)));
        break;
    default: return 0;
    }
    return 1;
}
