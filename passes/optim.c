/* optim.c — optimizer update ops, one per parameter.
 *
 * requires: autodiff (every R_PARAM has .grad).
 * ensures:  after the backward pass, AdamW(p, grad, m, v) or Sgd(p, grad, buf)
 *           for every parameter, with its state as R_OPTSTATE values of the
 *           parameter's shape.  Hyper-parameters (lr, betas, eps, weight decay,
 *           momentum, step) are run options read by the kernel at run time.
 *           The shard pass turns these into one update per unit on flat shards.
 */
#include "ir.h"

void pass_optim(Graph *g)
{
    int nval = g->nval;
    for (int p = 0; p < nval; p++) {
        if (g->val[p].role != R_PARAM)
            continue;
        const char *name = g->val[p].name;
        int in[4] = {p, g->val[p].grad, -1, -1};
        if (g->opt->optimizer != OPT_SGD) { /* adamw, adam: the same state */
            in[2] = ir_like(g, ir_fmt("%s.m", name), p, R_OPTSTATE);
            in[3] = ir_like(g, ir_fmt("%s.v", name), p, R_OPTSTATE);
            ir_node(g, OP_AdamW, ir_fmt("%s.adamw", name), 4, in, 0, NULL);
        } else {
            in[2] = ir_like(g, ir_fmt("%s.momentum", name), p, R_OPTSTATE);
            ir_node(g, OP_Sgd, ir_fmt("%s.sgd", name), 3, in, 0, NULL);
        }
    }
    ir_link(g);
}
