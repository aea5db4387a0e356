/* lift1d.c — fold's rewrite of 1-D convolutions and pooling into 2-D ones.
 *
 * The kernels are 2-D (NCHW).  A 1-D Conv, ConvTranspose, MaxPool,
 * AveragePool, LpPool or GlobalAveragePool over [N, C, L] (audio models' conv stems,
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
 *
 * explicit_pads then writes auto_pad (SAME_UPPER, SAME_LOWER, VALID) as the
 * pads it stands for (2-D, and 3-D before lift3d.c composes those), from
 * the input's spatial size, so the rules, the gradients and the kernels
 * know explicit pads only.  As ONNX specifies:
 * SAME keeps ceil(in / stride) outputs (a ConvTranspose: in x stride, or
 * its output_shape), padding by the total the dilated window needs beyond
 * the input, half before and half after, the odd one after (SAME_UPPER) or
 * before (SAME_LOWER); a ConvTranspose's negative end pad is more output
 * padding.  VALID pads nothing.
 */
#include "fold.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

static int lifts(Op op)
{
    return op == OP_Conv || op == OP_ConvTranspose || op == OP_MaxPool || op == OP_AveragePool ||
           op == OP_LpPool || op == OP_GlobalAveragePool;
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

/* ---- auto_pad ------------------------------------------------------------- */

/* attribute name of node id set to the ints v[0..n) (replaced if there, else added) */
static void set_ints(Graph *g, int id, const char *name, const int64_t *v, int n)
{
    Node *nd = &g->node[id];
    for (int i = 0; i < nd->nattr; i++)
        if (!strcmp(nd->attr[i].name, name)) {
            Attr *a = &nd->attr[i];
            a->kind = A_INTS, a->n = n;
            a->ints = ir_alloc(sizeof(int64_t) * (size_t)n);
            memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
            return;
        }
    ir_attr_ints_add(g, id, name, v, n);
}

/* attribute name (ns ints, one per spatial dim) of n into v, def where absent; 0 when it is not ns ints within
 * [1, 2^40] (the node's rule then says what is wrong with it) */
static int spatial_ints(const Node *n, const char *name, int ns, int64_t def, int64_t v[3])
{
    const Attr *a = ir_attr(n, name);
    for (int i = 0; i < ns; i++)
        v[i] = def;
    if (!a)
        return 1;
    if (a->kind != A_INTS || a->n != ns)
        return 0;
    for (int i = 0; i < ns; i++)
        if ((v[i] = a->ints[i]) < 1 || v[i] > MAX_NUMEL)
            return 0;
    return 1;
}

static int64_t floor_half(int64_t t) { return t >= 0 ? t / 2 : -((-t + 1) / 2); }

/* Conv, ConvTranspose, MaxPool, AveragePool, LpPool (2-D after lift_1d, or 3-D) with auto_pad other than NOTSET:
 * its pads written out (see the head) and auto_pad NOTSET.  Nodes whose shapes or attributes are not readable yet
 * are left to their rules, which refuse them in one line. */
void explicit_pads(Sweep *s, int id)
{
    Graph *g = s->g;
    Node *n = &g->node[id];
    Op op = n->op;
    int convt = op == OP_ConvTranspose, conv = op == OP_Conv || convt;
    if ((!conv && op != OP_MaxPool && op != OP_AveragePool && op != OP_LpPool) || n->nin < 1 || n->in[0] < 0)
        return;
    const Attr *ap = ir_attr(n, "auto_pad");
    if (!ap || ap->kind != A_STRING || !ap->s || !strcmp(ap->s, "NOTSET"))
        return;
    int upper = !strcmp(ap->s, "SAME_UPPER"), lower = !strcmp(ap->s, "SAME_LOWER");
    if (!upper && !lower && strcmp(ap->s, "VALID"))
        node_fatal(g, n, "attribute auto_pad = %s: ONNX knows NOTSET, SAME_UPPER, SAME_LOWER and VALID",
                   ir_q(ap->s));
    const Shape *x = &g->val[n->in[0]].shape;
    const Shape *w = conv && n->nin > 1 && n->in[1] >= 0 ? &g->val[n->in[1]].shape : NULL;
    int ns = x->rank - 2; /* spatial dims: 2 or 3 */
    int64_t k[3], st[3], dl[3], os[3], opad[3] = {0, 0, 0}, pads[6] = {0};
    if ((ns != 2 && ns != 3) || (conv && (!w || w->rank != x->rank)))
        return;
    if (!spatial_ints(n, "strides", ns, 1, st) || !spatial_ints(n, "dilations", ns, 1, dl) ||
        !spatial_ints(n, "kernel_shape", ns, conv ? 1 : 0, k))
        return;
    for (int i = 0; i < ns && conv; i++)
        k[i] = w->dim[2 + i];
    const Attr *oa = ir_attr(n, "output_padding");
    if (convt && oa && (oa->kind != A_INTS || oa->n != ns))
        return;
    for (int i = 0; i < ns && convt && oa; i++)
        opad[i] = oa->ints[i];
    int has_os = convt && ir_attr(n, "output_shape");
    if (has_os && !spatial_ints(n, "output_shape", ns, 1, os))
        return;
    for (int i = 0; i < ns && (upper || lower); i++) {
        int64_t in = x->dim[2 + i];
        if (k[i] < 1 || in < 1 || (k[i] > 1 && dl[i] > (MAX_NUMEL - 1) / (k[i] - 1)) || opad[i] < 0 ||
            opad[i] > MAX_NUMEL || in > MAX_NUMEL / st[i])
            return; /* the rule's checks say what is wrong */
        int64_t win = dl[i] * (k[i] - 1) + 1, total, before;
        if (convt) { /* the output: output_shape, else in x stride; the total may be negative */
            int64_t out = has_os ? os[i] : in * st[i];
            total = st[i] * (in - 1) + opad[i] + win - out;
            before = upper ? floor_half(total) : total - floor_half(total);
        } else {
            int64_t out = (in + st[i] - 1) / st[i];
            total = (out - 1) * st[i] + win - in;
            total = total > 0 ? total : 0;
            before = upper ? total / 2 : total - total / 2;
        }
        int64_t after = total - before;
        if (before < 0)
            node_fatal(g, n, "attribute auto_pad = %s: the output asks for a negative pad before dim %d, which is "
                       "not supported (export with explicit pads)", ap->s, 2 + i);
        if (after < 0) /* a ConvTranspose's: more output padding */
            opad[i] -= after, after = 0;
        pads[i] = before, pads[ns + i] = after;
    }
    set_ints(g, id, "pads", pads, 2 * ns);
    if (convt && (opad[0] || opad[1] || opad[2]))
        set_ints(g, id, "output_padding", opad, ns);
    if (convt && has_os && (upper || lower)) { /* the pads now give that size: the rule's own split must not */
        Node *nd = &g->node[id];
        for (int i = 0; i < nd->nattr; i++)
            if (!strcmp(nd->attr[i].name, "output_shape"))
                nd->attr[i] = nd->attr[--nd->nattr];
    }
    for (int i = 0; i < g->node[id].nattr; i++)
        if (!strcmp(g->node[id].attr[i].name, "auto_pad"))
            g->node[id].attr[i].s = ir_strdup("NOTSET");
}
