/* pack.c — the fused attention reads q, k, v out of their packed projection and writes dq, dk, dv into its
 * packed gradient.
 *
 * requires: schedule (the final node order: the views made here hide the Split's reads from passes that order
 *           by producers), before memplan (which places the views).
 * ensures:  on --target cpu, GPT-2's c_attn chain
 *             x = MatMulAdd(..)                       [B, t, 3 C]
 *             xq, xk, xv = Split(x, axis 2)           [B, t, C] each (any widths, in any order)
 *             q = Reshape(xq) ..                      [B, t, H, d]: the heads layout
 *             .. = FusedAttention(q, k, v) heads=H    (and FusedAttentionGrad reading them too)
 *           loses its Split: xq, xk, xv (and the Reshapes' outputs) become views of x at its row's offsets 0, C,
 *           2 C with rows 3 C apart (Value.alias_ld), and every attention node reading them gets attrs ldq, ldk,
 *           ldv (the kernels' KAttnLd, kernels.h) of 3 C; and its gradient
 *             dq, dk, dv, .. = FusedAttentionGrad(..) heads=H
 *             dq' = Reshape(dq) ..                    [B, t, C] each
 *             dx = Concat(dq', dk', dv', axis 2)      [B, t, 3 C]
 *           loses its Concat (and those Reshapes): dq, dk, dv become views of dx, the node gets attrs lddq,
 *           lddk, lddv.  So neither the three copies out of x nor the three into dx are made (~1.2 ms of a
 *           ~187 ms bf16 GPT 256/6/256/8 step at 1 thread), and the Split's outputs take no arena of their own.
 *           Only where every reader of each part is such an attention operand (a strided view is not a tensor
 *           any other kernel can read) and each Concat input is read by the Concat alone; anything else stays.
 *           Not on --target cuda: kernels/cuda/attn.cu indexes the heads layout with its own rows' stride
 *           (the launchers refuse a KAttnLd), so there the copies stay.
 */
#include "ir.h"

#include <string.h>

enum { MAX_PARTS = 16 }; /* a Split's parts or a Concat's inputs packed (3: q, k, v) */

static int is_output(const Graph *g, int v)
{
    for (int i = 0; i < g->noutput; i++)
        if (g->output[i] == v)
            return 1;
    return 0;
}

/* the single node reading v, or -1 (read twice or not at all, or a graph output) */
static int sole_reader(const Graph *g, int v)
{
    if (g->val[v].nuses != 1 || is_output(g, v))
        return -1;
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] == v)
                return i;
    return -1;
}

/* q, k, v's slot (0, 1, 2) of node n's input j if n is a heads-layout attention, else -1 */
static int attention_slot(const Node *n, int j)
{
    const int first = n->op == OP_FusedAttentionGrad ? 1 : n->op == OP_FusedAttention ? 0 : -1;
    return first >= 0 && j >= first && j < first + 3 && ir_attr_i(n, "heads", 0) ? j - first : -1;
}

/* is every read of v (at least one) an attention's q, k or v?  With set, give each reader attr ld<q|k|v> = ld */
static int attention_operand(Graph *g, int v, int64_t ld, int set)
{
    static const char *const attr[3] = {"ldq", "ldk", "ldv"};
    int reads = 0;
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; j < g->node[i].nin; j++) {
            if (g->node[i].in[j] != v)
                continue;
            const int k = attention_slot(&g->node[i], j);
            if (k < 0)
                return 0;
            if (set)
                ir_attr_add(g, i, attr[k], A_INT)->i = ld;
            reads++;
        }
    return reads > 0 && !is_output(g, v);
}

/* does a [B, t, w] part and its [B, t, H, d] heads view (either way round) keep x's B and t, dtype, dense? */
static int heads_of(const Graph *g, int part, int heads, const Value *x)
{
    const Value *p = &g->val[part], *h = &g->val[heads];
    return p->shape.rank == 3 && h->shape.rank == 4 && p->alias_of < 0 && h->alias_of < 0 && p->dtype == x->dtype &&
           h->dtype == x->dtype && p->shape.dim[0] == x->shape.dim[0] && p->shape.dim[1] == x->shape.dim[1] &&
           h->shape.dim[0] == x->shape.dim[0] && h->shape.dim[1] == x->shape.dim[1] &&
           h->shape.dim[2] * h->shape.dim[3] == p->shape.dim[2];
}

/* v a view of packed x: its rows at element offset off of x's, x's rows apart */
static void view_into(Graph *g, int v, int x, int64_t off)
{
    g->val[v].alias_of = x;
    g->val[v].alias_off = off * (int64_t)dtype_size(g->val[x].dtype);
    g->val[v].alias_ld = g->val[x].shape.dim[2];
}

/* is x [B, t, n] an activation a pack can be a view of (on the last axis, not a view yet; where memplan then
 * makes it a Reshape's view, it rebases the pack's views onto the root) */
static int packable(const Graph *g, const Node *n, int x)
{
    const Value *v = &g->val[x];
    const int64_t axis = ir_attr_i(n, "axis", 0);
    return v->shape.rank == 3 && (axis == 2 || axis == -1) && v->alias_of < 0 && !is_output(g, x) &&
           (v->role == R_ACT || v->role == R_GRAD);
}

/* node i a Split whose parts only heads-layout attentions read (through a Reshape each): its parts views of x;
 * 1 where so (the Split then dropped) */
static int pack_split(Graph *g, int i)
{
    const Node *s = &g->node[i];
    const int x = s->in[0];
    int rs[MAX_PARTS];
    if (s->nout > (int)(sizeof rs / sizeof *rs) || !packable(g, s, x))
        return 0;
    for (int j = 0; j < s->nout; j++) {
        const int p = s->out[j];
        if (p < 0 || (rs[j] = sole_reader(g, p)) < 0 || g->node[rs[j]].op != OP_Reshape ||
            !heads_of(g, p, g->node[rs[j]].out[0], &g->val[x]) || !attention_operand(g, g->node[rs[j]].out[0], 0, 0))
            return 0;
    }
    const int64_t ld = g->val[x].shape.dim[2];
    int64_t off = 0;
    for (int j = 0; j < s->nout; j++) {
        const int p = g->node[i].out[j], h = g->node[rs[j]].out[0];
        view_into(g, p, x, off);
        view_into(g, h, x, off);
        attention_operand(g, h, ld, 1);
        off += g->val[p].shape.dim[2];
    }
    return 1;
}

/* node i a Concat of Reshapes (each read by it alone) of an attention gradient's dq, dk or dv (each read by its
 * Reshape alone): those views of its output; 1 where so (the Concat and the Reshapes then dropped, in drop) */
static int pack_concat(Graph *g, int i, char *drop)
{
    static const char *const attr[3] = {"lddq", "lddk", "lddv"};
    const Node *c = &g->node[i];
    const int y = c->out[0];
    int rs[MAX_PARTS], gs[MAX_PARTS], slot[MAX_PARTS];
    if (c->nin > (int)(sizeof rs / sizeof *rs) || !packable(g, c, y))
        return 0;
    for (int j = 0; j < c->nin; j++) {
        const int p = c->in[j], r = p >= 0 ? g->val[p].producer : -1;
        if (r < 0 || g->node[r].op != OP_Reshape || sole_reader(g, p) != i)
            return 0;
        const int h = g->node[r].in[0], a = g->val[h].producer;
        if (a < 0 || g->node[a].op != OP_FusedAttentionGrad || !ir_attr_i(&g->node[a], "heads", 0) ||
            sole_reader(g, h) != r || !heads_of(g, p, h, &g->val[y]))
            return 0;
        rs[j] = r, gs[j] = a, slot[j] = -1;
        for (int k = 0; k < 3; k++)
            slot[j] = g->node[a].out[k] == h ? k : slot[j];
        if (slot[j] < 0)
            return 0;
    }
    int64_t off = 0;
    for (int j = 0; j < g->node[i].nin; j++) {
        const int p = g->node[i].in[j];
        view_into(g, g->node[rs[j]].in[0], y, off);
        ir_attr_add(g, gs[j], attr[slot[j]], A_INT)->i = g->val[y].shape.dim[2];
        drop[rs[j]] = 1;
        off += g->val[p].shape.dim[2];
    }
    return 1;
}

void pass_pack(Graph *g)
{
    if (strcmp(g->opt->target, "cpu"))
        return; /* attn.cu's kernels index the dense heads layout only (see above) */
    ir_link(g);
    const int nn = g->nnode;
    char *drop = ir_alloc((size_t)nn + 1);
    int packed = 0;
    for (int i = 0; i < nn; i++) {
        if (g->node[i].op == OP_Split && pack_split(g, i))
            drop[i] = 1, packed++;
        else if (g->node[i].op == OP_Concat && pack_concat(g, i, drop))
            drop[i] = 1, packed++;
    }
    if (!packed)
        return;
    Node *keep = ir_alloc(sizeof(Node) * (size_t)nn);
    int n = 0, nfwd = 0;
    for (int i = 0; i < nn; i++)
        if (!drop[i]) {
            keep[n++] = g->node[i];
            nfwd += i < g->nfwd; /* the forward shrinks by its dropped Splits */
        }
    g->nfwd = nfwd;
    ir_set_nodes(g, keep, n);
    ir_link(g);
}
