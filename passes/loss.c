/* loss.c — the training loss, the value every rank reports, and the state
 * the forward pass writes back.
 *
 * requires: shape.
 * ensures:  g->loss is a scalar: from --loss KIND:PRED,TARGET, where TARGET
 *           is a new graph input (R_INPUT, fed from data): same dtype and
 *           shape as PRED for mse, l1, huber, smooth_l1 and bce, int64
 *           labels of PRED's shape minus its last axis for cross_entropy
 *           (mse and cross_entropy are fsdpc's loss ops; the others, and
 *           --label-smoothing, composites of the model's ops that autodiff
 *           differentiates like the rest); or, without --loss, the model's own
 *           loss: a scalar float graph output of a SoftmaxCrossEntropyLoss
 *           or NegativeLogLikelihoodLoss (reduction mean or sum), whose
 *           labels are a graph input already.
 *           g->loss_avg = AllReduce(loss): the mean over ranks, each holding
 *           an equal batch.
 *           Each training-mode BatchNormalization whose running mean / var
 *           are initializers is followed by Assign nodes that copy its
 *           running-statistics outputs into those constants, so they persist
 *           from step to step and are exported (a training-only write, so it
 *           lives in this first training-only pass).
 */
#include "ir.h"

#include <string.h>

static int find_pred(const Graph *g, const char *name)
{
    int v = ir_find_value(g, name);
    if (v >= 0 && g->val[v].producer >= 0)
        return v;
    char list[512] = "";
    for (int i = 0; i < g->noutput && strlen(list) < 400; i++) {
        strcat(list, i ? ", " : "");
        strncat(list, ir_q(g->val[g->output[i]].name), 64);
    }
    fatal("--loss: the model computes no value named '%s' (its outputs: %s)", ir_q(name), list);
}

/* a scalar float graph output made by SoftmaxCrossEntropyLoss or
 * NegativeLogLikelihoodLoss, or -1 */
static int own_loss(const Graph *g)
{
    for (int i = 0; i < g->noutput; i++) {
        const Value *v = &g->val[g->output[i]];
        int p = v->producer;
        Op op = p >= 0 ? g->node[p].op : OP_COUNT;
        if ((op == OP_SoftmaxCrossEntropyLoss || op == OP_NegativeLogLikelihoodLoss) && g->node[p].out[0] == g->output[i] &&
            v->shape.rank == 0 && (v->dtype == DT_F32 || v->dtype == DT_F64))
            return g->output[i];
    }
    return -1;
}

/* node op(x) named name, writing a value named outname (NULL: name.out), with LogSoftmax's axis -1 or
 * ReduceMean's every axis (ad_emit shapes a node before attributes could be added), shaped; its output */
static int emit_attr(Graph *g, Op op, const char *name, int x, const char *outname)
{
    int y = ir_value(g, outname ? outname : ir_fmt("%s.out", name), DT_UNDEF, NULL, R_ACT);
    int n = ir_node1(g, op, name, x, -1, y);
    if (op == OP_LogSoftmax)
        ir_attr_add(g, n, "axis", A_INT)->i = -1;
    if (op == OP_ReduceMean) {
        int64_t axes[MAX_RANK];
        for (int i = 0; i < g->val[x].shape.rank; i++)
            axes[i] = i;
        ir_attr_ints_add(g, n, "axes", axes, g->val[x].shape.rank);
        ir_attr_add(g, n, "keepdims", A_INT)->i = 0;
    }
    shape_node(g, n);
    return y;
}

/* l1, huber, smooth_l1, bce: PyTorch's losses (reduction mean) written with the model's own ops, so that
 * autodiff differentiates them as any graph:
 *   l1         mean |p - t|
 *   huber      with a = |p - t|, q = min(a, delta): mean(q^2 / 2 + delta (a - q)) — q^2/2 below delta,
 *              delta (a - delta/2) above, torch.nn.HuberLoss; its gradient q' splits a tie as Min does
 *   smooth_l1  huber with delta = beta, divided by beta (torch.nn.SmoothL1Loss)
 *   bce        mean(softplus(p) - p t) = BCEWithLogitsLoss: softplus's gradient is sigmoid(p) at every p
 *              (its threshold 20 is torch.nn.Softplus's, exact to float32) */
static int composite_loss(Graph *g, LossKind kind, int p, int t)
{
    DType dt = g->val[p].dtype;
    double delta = g->opt->loss_param;
    if (kind == LOSS_BCE) {
        int sp = ad_emit(g, OP_Softplus, "loss.softplus", p, -1);
        int pt = ad_emit(g, OP_Mul, "loss.pt", p, t);
        return emit_attr(g, OP_ReduceMean, "loss.mean", ad_emit(g, OP_Sub, "loss.terms", sp, pt), "loss");
    }
    int a = ad_emit(g, OP_Abs, "loss.abs", ad_emit(g, OP_Sub, "loss.diff", p, t), -1);
    if (kind == LOSS_L1)
        return emit_attr(g, OP_ReduceMean, "loss.mean", a, "loss");
    int q = ad_emit(g, OP_Min, "loss.q", a, ir_scalar(g, "loss.delta", dt, delta));
    int sq = ad_scale(g, "loss.half_q2", ad_emit(g, OP_Mul, "loss.q2", q, q), 0.5);
    int lin = ad_scale(g, "loss.linear", ad_emit(g, OP_Sub, "loss.over", a, q), delta);
    int h = ad_emit(g, OP_Add, "loss.terms", sq, lin);
    if (kind == LOSS_HUBER)
        return emit_attr(g, OP_ReduceMean, "loss.mean", h, "loss");
    int m = emit_attr(g, OP_ReduceMean, "loss.mean", h, NULL);
    int y = ir_value(g, "loss", dt, &g->val[m].shape, R_ACT);
    ir_attr_add(g, ir_node1(g, OP_Scale, "loss.per_beta", m, -1, y), "alpha", A_FLOAT)->f = 1 / delta;
    return y;
}

/* cross_entropy with --label-smoothing e (torch.nn.CrossEntropyLoss's): (1 - e) CE(z, labels) - e mean(log
 * softmax(z)) over every row and class */
static int smoothed_ce(Graph *g, int z, int labels, double e)
{
    int ce = ad_emit(g, OP_CrossEntropyLoss, "loss.ce", z, labels);
    int m = emit_attr(g, OP_ReduceMean, "loss.mean_log_prob", emit_attr(g, OP_LogSoftmax, "loss.log_prob", z, NULL),
                      NULL);
    int y = ir_value(g, "loss", g->val[ce].dtype, &g->val[ce].shape, R_ACT);
    shape_node(g, ir_node1(g, OP_Sub, "loss.smoothed", ad_scale(g, "loss.ce_part", ce, 1 - e),
                           ad_scale(g, "loss.uniform_part", m, e), y));
    return y;
}

/* the loss node of --loss KIND:PRED,TARGET; TARGET becomes a graph input */
static int appended_loss(Graph *g)
{
    const Options *o = g->opt;
    int pred = find_pred(g, o->loss_pred);
    Value *p = &g->val[pred];
    if (p->dtype != DT_F32 && p->dtype != DT_F64)
        fatal("--loss: '%s' has dtype %s; the loss needs float32 or float64", ir_q(p->name),
              dtype_name(p->dtype));
    if (p->shape.rank < 1)
        fatal("--loss: '%s' is a scalar; it needs a batch axis", ir_q(p->name));
    if (ir_find_value(g, o->loss_target) >= 0)
        fatal("--loss: target name '%s' is already used in the model; choose another", o->loss_target);

    Shape ts = p->shape;
    DType tdt = p->dtype;
    Op op = OP_MseLoss;
    if (o->loss == LOSS_CE) {
        if (p->shape.rank < 2)
            fatal("--loss cross_entropy: logits '%s' need shape [..., classes]", ir_q(p->name));
        ts.rank--;
        tdt = DT_I64;
        op = OP_CrossEntropyLoss;
    }
    int t = ir_value(g, o->loss_target, tdt, &ts, R_INPUT);
    int *in = ir_alloc(sizeof(int) * (size_t)(g->ninput + 1));
    for (int i = 0; i < g->ninput; i++)
        in[i] = g->input[i];
    in[g->ninput++] = t;
    g->input = in;

    if (o->loss == LOSS_CE && o->label_smoothing > 0)
        return smoothed_ce(g, pred, t, o->label_smoothing);
    if (o->loss != LOSS_CE && o->loss != LOSS_MSE)
        return composite_loss(g, o->loss, pred, t);
    Shape s0 = {0};
    int loss = ir_value(g, "loss", g->val[pred].dtype, &s0, R_ACT);
    shape_node(g, ir_node1(g, op, "loss", pred, t, loss)); /* its rule checks pred (shape.c) */
    return loss;
}

/* Assign running mean / var (inputs 3, 4) := the node's outputs 1, 2, right
 * after each training-mode BatchNormalization: a later node sharing the
 * statistics (a module applied twice) then sees them updated, as in torch. */
static void write_back_stats(Graph *g)
{
    int nn = g->nnode, n = 0;
    int *order = ir_alloc(sizeof(int) * (size_t)(3 * nn + 1));
    for (int i = 0; i < nn; i++) {
        order[n++] = i;
        Node bn = g->node[i]; /* copy: ir_node moves g->node */
        if (bn.op != OP_BatchNormalization || !ir_attr_i(&bn, "training_mode", 0))
            continue;
        for (int k = 1; k <= 2; k++) {
            int dst = bn.in[k + 2];
            if (g->val[dst].role != R_CONST || g->val[dst].init_index < 0)
                continue; /* not an initializer: nothing persists */
            int in[2] = {dst, bn.out[k]};
            order[n++] = ir_node(g, OP_Assign, ir_fmt("%s.%s.update", bn.name, k == 1 ? "mean" : "var"), 2, in,
                                 0, NULL);
        }
    }
    Node *out = ir_alloc(sizeof(Node) * (size_t)(n + 1));
    for (int i = 0; i < n; i++)
        out[i] = g->node[order[i]];
    ir_set_nodes(g, out, n);
}

void pass_loss(Graph *g)
{
    const Options *o = g->opt;
    ir_link(g);
    write_back_stats(g);
    g->loss = o->loss != LOSS_NONE ? appended_loss(g) : own_loss(g);
    if (g->loss < 0)
        fatal("%s: no loss given: pass --loss mse:PRED,TARGET or --loss cross_entropy:LOGITS,LABELS "
              "(or end the model in a SoftmaxCrossEntropyLoss with reduction mean or sum)", o->model);
    Shape s0 = {0};
    DType dt = g->val[g->loss].dtype;
    g->loss_avg = ir_value(g, "loss.avg", dt, &s0, R_ACT);
    ir_node1(g, OP_AllReduce, "loss.avg", g->loss, -1, g->loss_avg);
}
