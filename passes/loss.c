/* loss.c — append the training loss and the value every rank reports.
 *
 * requires: shape.
 * ensures:  g->loss is a scalar computed from --loss KIND:PRED,TARGET; TARGET
 *           is a new graph input (R_INPUT, fed from data): same dtype and
 *           shape as PRED for mse, int64 labels of PRED's shape minus its last
 *           axis for cross_entropy.  g->loss_avg = AllReduce(loss): the mean
 *           over the global batch, since every rank holds an equal batch.
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
        strncat(list, g->val[g->output[i]].name, 64);
    }
    fatal("--loss: the model computes no value named '%s' (its outputs: %s)", name, list);
}

void pass_loss(Graph *g)
{
    const Options *o = g->opt;
    if (o->loss == LOSS_NONE)
        fatal("%s: no loss given: pass --loss mse:PRED,TARGET or --loss cross_entropy:LOGITS,LABELS",
              o->model);
    ir_link(g);
    int pred = find_pred(g, o->loss_pred);
    Value *p = &g->val[pred];
    if (p->dtype != DT_F32 && p->dtype != DT_F64)
        fatal("--loss: '%s' has dtype %s; the loss needs float32 or float64", p->name,
              dtype_name(p->dtype));
    if (p->shape.rank < 1)
        fatal("--loss: '%s' is a scalar; it needs a batch axis", p->name);
    if (ir_find_value(g, o->loss_target) >= 0)
        fatal("--loss: target name '%s' is already used in the model; choose another", o->loss_target);

    Shape ts = p->shape;
    DType tdt = p->dtype;
    Op op = OP_MseLoss;
    if (o->loss == LOSS_CE) {
        if (p->shape.rank < 2)
            fatal("--loss cross_entropy: logits '%s' need shape [..., classes]", p->name);
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

    Shape scalar = {0};
    DType dt = g->val[pred].dtype;
    g->loss = ir_value(g, "loss", dt, &scalar, R_ACT);
    ir_node1(g, op, "loss", pred, t, g->loss);
    g->loss_avg = ir_value(g, "loss.avg", dt, &scalar, R_ACT);
    ir_node1(g, OP_AllReduce, "loss.avg", g->loss, -1, g->loss_avg);
}
