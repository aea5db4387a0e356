/* lift1d.c — fold's rewrite of 1-D convolutions and pooling into 2-D ones.
 *
 * The kernels are 2-D (NCHW).  A 1-D Conv, ConvTranspose, MaxPool,
 * AveragePool or GlobalAveragePool over [N, C, L] (audio models' conv stems,
 * Whisper's, wav2vec's; vocoders' upsampling) is the 2-D op over [N, C, 1, L]
 * with a height-1 window: lift_1d reads its input (and Conv's weight
 * [Co, Ci/g, K], ConvTranspose's [Ci, Co/g, K]) through an Unsqueeze of
 * axis 2 — a view, no copy; the gradient flows back through it — and turns
 * its attributes into their 2-D forms (kernel_shape k -> [1, k], strides and
 * dilations s -> [1, s], pads [b, e] -> [0, b, 0, e], output_padding p ->
 * [0, p], output_shape l -> [1, l]); the node then
 * computes a 4-D output (a ConvTranspose: the nodes compose.c makes of it
 * write that value), which lower_1d Squeezes back into the node's own
 * 3-D outputs (MaxPool's Indices too: with a height of 1 the flat positions
 * are the 1-D ones).  Nothing else in fsdpc sees a 1-D op.
 */
#include "fold.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

static int lifts(Op op)
{
    return op == OP_Conv || op == OP_ConvTranspose || op == OP_MaxPool || op == OP_AveragePool ||
           op == OP_GlobalAveragePool;
}

/* op(x) with the ints attribute axes = {2}, named NODE/suffix writing out (-1: a new value), visited; its output */
static int axis2(Sweep *s, int id, Op op, int x, const char *suffix, int out)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, op, name, x, -1, out);
    int64_t ax = 2;
    ir_attr_ints_add(g, c, "axes", &ax, 1);
    visit(s, c);
    return out;
}

/* Attribute name of node id, a list of one integer per spatial dim (pads:
 * two), in its 2-D form: the new height dim's entry is h (pads: 0 before
 * and after).  Absent: left absent (the 2-D defaults are the 1-D ones). */
static void lift_ints(Graph *g, int id, const char *name, int64_t h)
{
    Node *n = &g->node[id];
    for (int i = 0; i < n->nattr; i++) {
        Attr *a = &n->attr[i];
        if (strcmp(a->name, name) || a->kind != A_INTS)
            continue;
        int pads = !strcmp(name, "pads");
        if (a->n != (pads ? 2 : 1))
            node_fatal(g, n, "attribute %s must list %d integers for a 1-D %s", name, pads ? 2 : 1,
                       op_info[n->op].name);
        int64_t *v = ir_alloc(sizeof(int64_t) * 4);
        if (pads)
            v[0] = 0, v[1] = a->ints[0], v[2] = 0, v[3] = a->ints[1];
        else
            v[0] = h, v[1] = a->ints[0];
        a->ints = v;
        a->n = pads ? 4 : 2;
    }
}

/* A 1-D op read as a 2-D one (see the head): its outputs [0, *nout) are now
 * new 4-D values, and orig[] the 3-D ones lower_1d must write.  0 when node
 * id is not a 1-D convolution or pooling. */
int lift_1d(Sweep *s, int id, int orig[2], int *nout)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    if (!lifts(n->op) || n->nin < 1 || n->in[0] < 0 || g->val[n->in[0]].shape.rank != 3)
        return 0;
    int x = axis2(s, id, OP_Unsqueeze, g->node[id].in[0], "as2d", -1);
    g->node[id].in[0] = x;
    Op op = g->node[id].op;
    if ((op == OP_Conv || op == OP_ConvTranspose) && g->node[id].nin > 1 && g->node[id].in[1] >= 0 &&
        g->val[g->node[id].in[1]].shape.rank == 3) {
        int w = axis2(s, id, OP_Unsqueeze, g->node[id].in[1], "weight2d", -1);
        g->node[id].in[1] = w;
    }
    lift_ints(g, id, "kernel_shape", 1);
    lift_ints(g, id, "strides", 1);
    lift_ints(g, id, "dilations", 1);
    lift_ints(g, id, "pads", 0);
    lift_ints(g, id, "output_padding", 0);
    lift_ints(g, id, "output_shape", 1);
    /* the ONNX outputs: Y, and MaxPool's Indices (the rest are fsdpc's own, shaped by the 2-D rule) */
    n = &g->node[id];
    *nout = n->op == OP_MaxPool && n->nout > 1 && ir_is_read(g, n->out[1]) ? 2 : 1;
    for (int i = 0; i < *nout; i++) {
        orig[i] = g->node[id].out[i];
        g->node[id].out[i] = ir_value(g, ir_fmt("%s/2d.%d", g->node[id].name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    }
    return 1;
}

/* The lifted node's 4-D outputs squeezed into its own 3-D ones. */
void lower_1d(Sweep *s, int id, const int orig[2], int nout)
{
    for (int i = 0; i < nout; i++)
        axis2(s, id, OP_Squeeze, s->g->node[id].out[i], i ? "indices1d" : "as1d", orig[i]);
}
