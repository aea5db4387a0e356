/* grad_nn.c — gradient rules of the nn family (conv, pooling, normalisation,
 * softmax, reductions, dropout, losses).
 *
 * Most rules are one backward op of fsdpc's own (ops.def: ConvGrad,
 * BatchNormGrad, ...) that carries the forward node's attributes and reads
 * what the forward kept for it as extra outputs: saved mean / invstd,
 * MaxPool's argmax, Dropout's mask, the softmax or log-softmax output.  A
 * backward op with several results (ConvGrad: dx, dw, db) has an attribute
 * `need` (bit i: result i is wanted); unwanted results are empty values, and
 * inputs only they would read are left out (-1), so nothing is kept alive for
 * them.  Conv's backward has its own im2col scratch output: scratch lives for
 * one node and is never kept from forward to backward.  ConvGrad computing
 * dx alone is ConvTranspose's forward (passes/compose.c), so it has a rule
 * too: a Conv for its dy input and another ConvGrad's dw for its weight.
 *
 *
 * inference-mode BatchNormalization's rule is written with forward ops.
 */
#include "nn.h"

/* a new backward node NAME.sfx with the forward node's attributes */
static int mk(GradCtx *cx, Op op, const char *sfx, int nin, const int *in, int nout, const int *out)
{
    int k = ir_node(cx->g, op, ir_fmt("%s.%s", cx->name, sfx), nin, in, nout, out);
    for (int i = 0; i < cx->n->nattr; i++)
        *ir_attr_add(cx->g, k, cx->n->attr[i].name, cx->n->attr[i].kind) = cx->n->attr[i];
    return k;
}

static int need_bits(const GradCtx *cx, int n)
{
    int bits = 0;
    for (int i = 0; i < n; i++)
        bits |= cx->need[i] ? 1 << i : 0;
    return bits;
}

/* result `like`-shaped when wanted, else an empty value of its dtype */
static int result(GradCtx *cx, const char *sfx, int like, int wanted)
{
    Graph *g = cx->g;
    if (wanted)
        return ir_like(g, ir_fmt("%s.%s", cx->name, sfx), like, R_ACT);
    Shape empty = {1, {0}};
    return ir_value(g, ir_fmt("%s.%s", cx->name, sfx), g->val[cx->n->in[0]].dtype, &empty, R_ACT);
}

/* A ConvGrad node (named NAME.sfx) computing the results need asks for (bit
 * 0: dx like xl, 1: dw like wl, 2: db like bl) of a Conv with the forward
 * node's attributes whose input is shaped like xl and weight like wl, from
 * its output gradient dy, input x and weight w; the results into d[0..3) */
static void conv_grad_node(GradCtx *cx, const char *sfx, const int io[3], const int like[3], int need, int *d)
{
    Graph *g = cx->g;
    Shape xs = g->val[like[0]].shape, wsh = g->val[like[1]].shape; /* copies: values are made below */
    KConv2d p;
    nn_conv_geom(g, cx->n, &xs, &wsh, &p);
    int in[3] = {io[0], need & 2 ? io[1] : -1, need & 1 ? io[2] : -1};
    Shape ws = {1, {need & 3 ? nn_conv_ws(&p) : 0}};
    int out[4] = {result(cx, ir_fmt("%s.dx", sfx), like[0], need & 1),
                  result(cx, ir_fmt("%s.dw", sfx), like[1], need & 2),
                  result(cx, ir_fmt("%s.db", sfx), like[2], need & 4),
                  ir_value(g, ir_fmt("%s.%s.scratch", cx->name, sfx), g->val[like[0]].dtype, &ws, R_ACT)};
    int k = ir_node(g, OP_ConvGrad, ir_fmt("%s.%s", cx->name, sfx), 3, in, 4, out);
    nn_conv_attrs(g, k, cx->n, NULL);
    ir_attr_add(g, k, "need", A_INT)->i = need;
    ir_attr_ints_add(g, k, "xshape", xs.dim, 4);
    ir_attr_ints_add(g, k, "wshape", wsh.dim, 4);
    for (int i = 0; i < 3; i++)
        d[i] = need >> i & 1 ? out[i] : -1;
}

static void conv_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    int x = n->in[0], w = n->in[1], b = n->nin > 2 ? n->in[2] : -1;
    int io[3] = {cx->dys[0], x, w}, like[3] = {x, w, b >= 0 ? b : x};
    conv_grad_node(cx, "conv", io, like, need_bits(cx, 3), cx->d);
}

/* ConvGrad's dx (need 1; ConvTranspose's form, compose.c): y = dx(x, w) is
 * linear in both, the adjoint of a Conv over y-shaped input with output
 * gradient x.  So dL/dx = Conv(dy, w) and dL/dw is that Conv's dw with dy as
 * its input and x as its output gradient. */
static void conv_dx_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    if (ir_attr_i(n, "need", 0) != 1)
        node_fatal(g, n, "only a ConvGrad computing dx alone is differentiable");
    int x = n->in[0], w = n->in[2], dy = cx->dys[0];
    if (cx->need[0]) {
        int out[2] = {ir_value(g, ir_fmt("%s.dx", cx->name), DT_UNDEF, NULL, R_ACT),
                      ir_value(g, ir_fmt("%s.dx.scratch", cx->name), DT_UNDEF, NULL, R_ACT)};
        int k = ir_node(g, OP_Conv, ir_fmt("%s.conv", cx->name), 2, (int[]){dy, w}, 2, out);
        nn_conv_attrs(g, k, n, NULL);
        shape_node(g, k);
        cx->d[0] = out[0];
    }
    if (cx->need[2]) {
        int d[3];
        conv_grad_node(cx, "dw", (int[]){x, dy, -1}, (int[]){dy, w, w}, 2, d);
        cx->d[2] = d[1];
    }
}

/* FusedAttentionGrad: dq, dkt, dv from y and the rows' log-sum-exp (the forward's outputs 0, 1), with a
 * scratch of its own; all three are computed (the kernel writes them together); dbias, a fifth output, only
 * when the bias wants a gradient (a learned bias, as T5's relative positions) */
static void attention_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    int in[7] = {cx->dys[0], n->in[0], n->in[1], n->in[2], n->out[0], n->out[1], n->nin > 3 ? n->in[3] : -1};
    int out[5] = {ir_like(g, ir_fmt("%s.dq", cx->name), n->in[0], R_ACT),
                  ir_like(g, ir_fmt("%s.dkt", cx->name), n->in[1], R_ACT),
                  ir_like(g, ir_fmt("%s.dv", cx->name), n->in[2], R_ACT),
                  ir_like(g, ir_fmt("%s.scratch", cx->name), n->out[2], R_ACT),
                  n->nin > 3 && n->in[3] >= 0 && cx->need[3] ? ir_like(g, ir_fmt("%s.dbias", cx->name), n->in[3], R_ACT)
                                                               : -1};
    mk(cx, OP_FusedAttentionGrad, "attention", 7, in, out[4] >= 0 ? 5 : 4, out);
    for (int i = 0; i < 3; i++)
        cx->d[i] = cx->need[i] ? out[i] : -1;
    if (n->nin > 3)
        cx->d[3] = out[4];
}

/* BatchNormGrad / LayerNormGrad: dx, dscale, dbias from the saved statistics
 * (forward outputs s0, s1) */
static void norm_grad(GradCtx *cx, Op op, int s0, int s1)
{
    const Node *n = cx->n;
    int x = n->in[0], sc = n->nin > 1 ? n->in[1] : -1, b = n->nin > 2 ? n->in[2] : -1;
    int in[5] = {cx->dys[0], x, n->out[s0], n->out[s1], sc};
    int out[3] = {result(cx, "dx", x, cx->need[0]), result(cx, "dscale", sc >= 0 ? sc : x, cx->need[1]),
                  result(cx, "dbias", b >= 0 ? b : x, cx->need[2])};
    int k = mk(cx, op, "norm", 5, in, 3, out);
    ir_attr_add(cx->g, k, "need", A_INT)->i = need_bits(cx, 3);
    for (int i = 0; i < 3; i++)
        cx->d[i] = cx->need[i] ? out[i] : -1;
}

/* y = (x - mean) s + bias per channel, s = scale / sqrt(var + eps), with the
 * running statistics (constants): dx = dy s, dscale = sum dy (x - mean) /
 * sqrt(var + eps), dbias = sum dy; channel vectors viewed as c x 1 x .. 1 */
static void bn_infer_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    const char *nm = cx->name;
    int x = n->in[0], dy = cx->dys[0], r = g->val[x].shape.rank;
    Shape cs = {r - 1, {g->val[x].shape.dim[1]}}, vs = {1, {cs.dim[0]}};
    for (int i = 1; i < r - 1; i++)
        cs.dim[i] = 1;
    int eps = ir_scalar(g, ir_fmt("%s.eps", nm), g->val[x].dtype, ir_attr_f(n, "epsilon", 1e-5));
    int sd = ad_emit(g, OP_Sqrt, ir_fmt("%s.sd", nm), ad_emit(g, OP_Add, ir_fmt("%s.ve", nm), n->in[4], eps), -1);
    int sdc = ad_reshape(g, ir_fmt("%s.sdc", nm), sd, &cs);
    if (cx->need[0]) {
        int s = ad_reshape(g, ir_fmt("%s.sc", nm), ad_emit(g, OP_Div, ir_fmt("%s.s", nm), n->in[1], sd), &cs);
        cx->d[0] = ad_emit(g, OP_Mul, ir_fmt("%s.dx", nm), dy, s);
    }
    if (cx->need[1]) {
        int mc = ad_reshape(g, ir_fmt("%s.mc", nm), n->in[3], &cs);
        int xh = ad_emit(g, OP_Div, ir_fmt("%s.xh", nm), ad_emit(g, OP_Sub, ir_fmt("%s.xc", nm), x, mc), sdc);
        int t = ad_sum_to(g, ir_fmt("%s.dsc", nm), ad_emit(g, OP_Mul, ir_fmt("%s.dyxh", nm), dy, xh), sdc);
        cx->d[1] = ad_reshape(g, ir_fmt("%s.dscale", nm), t, &vs);
    }
    if (cx->need[2])
        cx->d[2] = ad_reshape(g, ir_fmt("%s.dbias", nm), ad_sum_to(g, ir_fmt("%s.db", nm), dy, sdc), &vs);
}

/* one-input rules: dx = OP(ins...) shaped like the forward input */
static void simple(GradCtx *cx, Op op, int nin, const int *in)
{
    int dx = ir_like(cx->g, ir_fmt("%s.dx", cx->name), cx->n->in[0], R_ACT);
    mk(cx, op, "dx", nin, in, 1, &dx);
    cx->d[0] = dx;
}

static void softmax_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    int in[2] = {cx->dys[0], n->out[0]};
    int dx = ir_like(cx->g, ir_fmt("%s.dx", cx->name), n->in[0], R_ACT);
    int k = ir_node(cx->g, OP_SoftmaxGrad, cx->name, 2, in, 1, &dx);
    int ax = nn_axis(cx->g, n, ir_attr_i(n, "axis", -1), cx->g->val[n->in[0]].shape.rank, "axis");
    ir_attr_add(cx->g, k, "axis", A_INT)->i = ax;
    ir_attr_add(cx->g, k, "log", A_INT)->i = n->op == OP_LogSoftmax;
    cx->d[0] = dx;
}

static void reduce_grad(GradCtx *cx)
{
    Graph *g = cx->g;
    const Node *n = cx->n;
    Shape kept;
    char red[MAX_RANK];
    if (!nn_reduce_dims(g, n, &g->val[n->in[0]].shape, &kept, red)) {
        cx->d[0] = cx->dys[0]; /* a no-op ReduceSum */
        return;
    }
    /* Max / Min read x and y (the elements equal to y share dy), Prod x */
    int mx = n->op == OP_ReduceMax || n->op == OP_ReduceMin;
    int in[3] = {cx->dys[0], mx || n->op == OP_ReduceProd ? n->in[0] : -1, mx ? n->out[0] : -1};
    int dx = ir_like(g, ir_fmt("%s.dx", cx->name), n->in[0], R_ACT);
    int k = ir_node(g, OP_ReduceGrad, cx->name, 3, in, 1, &dx);
    ir_attr_add(g, k, "of", A_INT)->i = n->op;
    ir_attr_ints_add(g, k, "yshape", kept.dim, kept.rank);
    cx->d[0] = dx;
}

static void dropout_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    if (!nn_dropout_training(cx->g, n)) {
        cx->d[0] = cx->dys[0];
        return;
    }
    int in[2] = {cx->dys[0], n->out[1]};
    int dx = ir_like(cx->g, ir_fmt("%s.dx", cx->name), n->in[0], R_ACT);
    int k = ir_node(cx->g, OP_DropoutGrad, cx->name, 2, in, 1, &dx);
    ir_attr_add(cx->g, k, "ratio", A_FLOAT)->f = nn_dropout_ratio(cx->g, n);
    cx->d[0] = dx;
}

/* SoftmaxCrossEntropyLoss's backward reads its log_prob output;
 * NegativeLogLikelihoodLoss's (nll 1) reads no data, only labels and weights */
static void sce_grad(GradCtx *cx)
{
    const Node *n = cx->n;
    int nll = n->op == OP_NegativeLogLikelihoodLoss;
    int in[5] = {nll ? n->in[0] : n->out[1], n->in[1], cx->dys[0], n->nin > 2 ? n->in[2] : -1, nll ? -1 : cx->dys[1]};
    simple(cx, OP_SoftmaxCrossEntropyGrad, 5, in);
    ir_attr_add(cx->g, cx->g->val[cx->d[0]].producer, "nll", A_INT)->i = nll;
}

int grad_nn(GradCtx *cx)
{
    const Node *n = cx->n;
    int dy = cx->dys[0];
    if (op_info[n->op].flags & F_REDUCE) {
        reduce_grad(cx);
        return 1;
    }
    switch (n->op) {
    case OP_Conv: conv_grad(cx); return 1;
    case OP_ConvGrad: conv_dx_grad(cx); return 1;
    case OP_BatchNormalization:
        if (nn_bn_training(n))
            norm_grad(cx, OP_BatchNormGrad, 3, 4);
        else
            bn_infer_grad(cx);
        return 1;
    case OP_LayerNormalization: norm_grad(cx, OP_LayerNormGrad, 1, 2); return 1;
    case OP_Softmax: case OP_LogSoftmax: softmax_grad(cx); return 1;
    case OP_FusedAttention: attention_grad(cx); return 1;
    case OP_MaxPool: simple(cx, OP_MaxPoolGrad, 2, (int[]){dy, n->out[2]}); return 1;
    case OP_AveragePool: simple(cx, OP_AveragePoolGrad, 1, &dy); return 1;
    case OP_GlobalAveragePool: simple(cx, OP_GlobalAveragePoolGrad, 1, &dy); return 1;
    case OP_Dropout: dropout_grad(cx); return 1;
    case OP_SoftmaxCrossEntropyLoss: case OP_NegativeLogLikelihoodLoss: sce_grad(cx); return 1;
    default: return 0;
    }
}
