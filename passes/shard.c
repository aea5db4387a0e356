/* shard.c — flat parameters, shards and the collectives of FULL_SHARD.
 *
 * requires: units, optim.
 * ensures:  for each unit u:
 *   - a flat buffer (R_FLAT) whose views are u's parameters, gathered from
 *     this rank's shard (R_SHARD) by AllGather just before the first forward
 *     node that reads one of them, and released by Free after the last;
 *   - the same again for the backward pass: a second gathered buffer and a
 *     second set of parameter views, so the IR stays single-assignment;
 *   - a flat gradient (R_FLATGRAD) whose views are the parameters' gradients
 *     (a Copy is inserted where a gradient cannot be written in place), and
 *     a ReduceScatter that averages it into this rank's R_GRADSHARD as soon
 *     as the unit's last gradient is produced;
 *   - one optimizer update on the flat shards replacing the per-parameter ones;
 *     before the updates, GradNormSq of every gradient shard and its AllReduce
 *     (sum): g->grad_norm_sq, the global squared norm that the updates read to
 *     clip by, and skip on when it is not finite (a shard's padding is zero,
 *     so nothing is counted twice).  GradNormSq's last input is the reported
 *     loss g->loss_avg (the same on every rank): a non-finite loss makes the
 *     norm NaN, so no update runs on a step whose loss is not finite.
 * Shard lengths are ceil(numel / F), F the ranks of a shard group (the
 * world, 1 for NO_SHARD, --shard hybrid:F): the world size is a run-time
 * fact, so shapes here are nominal ([numel]) and the runtime sizes them.
 * The strategies (--shard) change the gathers:
 *   full, hybrid  as above (hybrid: the runtime's collectives span a group,
 *                 and the gradient is all-reduced across the groups), but
 *                 the root unit (the parameters outside every wrapped unit:
 *                 units.c) is gathered once, as grad_op's: PyTorch's FSDP
 *                 (FullyShardedDataParallel and fully_shard alike) never
 *                 reshards its root after forward, whose backward would
 *                 gather it again at once;
 *   grad_op       one gather per step: the forward's buffer stays gathered
 *                 until the last backward use (no reshard after forward);
 *   none          no gather at all: the parameters are views of the shard,
 *                 which holds the whole flat parameter (F = 1); the
 *                 ReduceScatter then averages over every rank.  With
 *                 --precision bf16 one "gather" per step (of one rank: the
 *                 bf16 copy of the shard) as grad_op.
 */
#include "ir.h"

#include <string.h>

/* A small per-position list of inserted nodes. */
typedef struct {
    Node *n;
    int len, cap;
} List;

static void push(List *l, Node n)
{
    if (l->len == l->cap) {
        int cap = l->cap ? l->cap * 2 : 4;
        Node *q = ir_alloc(sizeof(Node) * (size_t)cap);
        if (l->len)
            memcpy(q, l->n, sizeof(Node) * (size_t)l->len);
        l->n = q;
        l->cap = cap;
    }
    l->n[l->len++] = n;
}

static Node mk(Op op, const char *name, int nin, const int *in, int out, int unit)
{
    Node n = {0};
    n.op = op;
    n.name = ir_strdup(name);
    n.nin = nin;
    n.in = ir_alloc(sizeof(int) * (size_t)(nin + 1));
    memcpy(n.in, in, sizeof(int) * (size_t)nin);
    n.nout = out >= 0;
    n.out = ir_alloc(sizeof(int));
    n.out[0] = out;
    n.unit = unit;
    return n;
}

static int flat_value(Graph *g, int u, const char *suffix, Role role)
{
    Unit *un = &g->unit[u];
    Shape s = {1, {un->numel}};
    int v = ir_value(g, ir_fmt("%s.%s", un->name, suffix), un->dtype, &s, role);
    g->val[v].unit = u;
    return v;
}

static int is_update(Op op) { return (op_info[op].flags & F_OPT) != 0; }

/* Make every backward node read parameters through backward views.
 * bview[p] = the view of p in the backward gathered buffer. */
static void rewrite_backward(Graph *g, const int *bview)
{
    for (int i = g->nfwd; i < g->nnode; i++) {
        Node *n = &g->node[i];
        if (is_update(n->op))
            continue;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && bview[n->in[j]] >= 0)
                n->in[j] = bview[n->in[j]];
    }
}

/* Where gradient gv cannot simply be placed in the flat gradient, copy it. */
static int needs_copy(const Graph *g, int gv, const char *is_grad_of_other)
{
    const Value *v = &g->val[gv];
    if (v->producer < 0 || v->alias_of >= 0 || is_grad_of_other[gv])
        return 1;
    if (op_info[g->node[v->producer].op].flags & F_VIEW)
        return 1;
    return v->nuses > 1; /* read by something other than its optimizer update */
}

void pass_shard(Graph *g)
{
    int nn = g->nnode, nval0 = g->nval;
    List *before = ir_alloc(sizeof(List) * (size_t)(nn + 1));
    List *after = ir_alloc(sizeof(List) * (size_t)(nn + 1));
    List tail = {0};
    int *bview = ir_alloc(sizeof(int) * (size_t)nval0);
    for (int v = 0; v < nval0; v++)
        bview[v] = -1;

    ShardMode mode = g->opt->shard;
    /* parameters live in a gathered buffer; NO_SHARD too with --precision bf16, where the "gather" of one
     * rank is the bf16 copy of the shard (made once per step, kept until the last backward use) */
    int gather = mode != SHARD_NONE || g->opt->precision != PREC_FP32;
    int full = mode == SHARD_FULL || mode == SHARD_HYBRID;
    for (int u = 0; u < g->nunit; u++) {
        Unit *un = &g->unit[u];
        int reshard = gather && full && strcmp(un->name, "root"); /* freed after forward, gathered again */
        int flat = un->flat = gather ? flat_value(g, u, "flat", R_FLAT) : -1;
        int bflat = reshard ? flat_value(g, u, "flat.bwd", R_FLAT) : -1;
        un->flatgrad = flat_value(g, u, "flatgrad", R_FLATGRAD);
        un->shard = flat_value(g, u, "shard", R_SHARD);
        un->gradshard = flat_value(g, u, "gradshard", R_GRADSHARD);
        int nstate = g->opt->optimizer == OPT_SGD ? 1 : 2;
        for (int k = 0; k < nstate; k++) {
            un->state[k] = flat_value(g, u, k ? "v" : (nstate == 2 ? "m" : "momentum"), R_STATESHARD);
            g->val[un->state[k]].state = 2 + k;
        }
        for (int i = 0; i < un->nparams; i++) {
            int p = un->params[i];
            int64_t off = un->offset[i] * (int64_t)dtype_size(un->dtype);
            g->val[p].alias_of = gather ? flat : un->shard;
            g->val[p].alias_off = off;
            if (!reshard)
                continue; /* the backward reads the same views */
            int b = ir_like(g, ir_fmt("%s@bwd", g->val[p].name), p, R_PARAM);
            g->val[b].alias_of = bflat;
            g->val[b].alias_off = off;
            g->val[b].unit = u;
            bview[p] = b;
        }
        if (bflat >= 0)
            g->val[bflat].unit = u;
    }
    rewrite_backward(g, bview);
    ir_link(g);
    int nparams = 0;
    for (int u = 0; u < g->nunit; u++)
        nparams += g->unit[u].nparams;
    char *gradseen = ir_alloc((size_t)(g->nval + nparams + 1)); /* copies add <= nparams */

    for (int u = 0; u < g->nunit; u++) {
        Unit *un = &g->unit[u];
        int ffirst = nn, flast = -1, bfirst = nn, blast = -1, gdone = -1;
        for (int i = 0; i < nn; i++) {
            const Node *n = &g->node[i];
            if (is_update(n->op))
                continue;
            for (int j = 0; j < n->nin; j++) {
                int v = n->in[j];
                if (v < 0 || g->val[v].role != R_PARAM || g->val[v].unit != u)
                    continue;
                if (i < g->nfwd) {
                    ffirst = ffirst < i ? ffirst : i;
                    flast = i;
                } else {
                    bfirst = bfirst < i ? bfirst : i;
                    blast = i;
                }
            }
        }
        if (flast < 0)
            die("unit %s is never read by the forward pass", un->name);
        if (bview[un->params[0]] >= 0) { /* resharded after forward (the views made above) */
            int bflat = g->val[bview[un->params[0]]].alias_of;
            push(&before[ffirst], mk(OP_AllGather, ir_fmt("%s.gather", un->name), 1, &un->shard, un->flat, u));
            push(&after[flast], mk(OP_Free, ir_fmt("%s.free", un->name), 1, &un->flat, -1, u));
            if (blast >= 0) {
                push(&before[bfirst], mk(OP_AllGather, ir_fmt("%s.gather.bwd", un->name), 1, &un->shard, bflat, u));
                push(&after[blast], mk(OP_Free, ir_fmt("%s.free.bwd", un->name), 1, &bflat, -1, u));
            }
        } else if (gather) { /* grad_op, the root: gathered from the first forward use to the last backward one */
            push(&before[ffirst], mk(OP_AllGather, ir_fmt("%s.gather", un->name), 1, &un->shard, un->flat, u));
            push(&after[blast >= 0 ? blast : flast], mk(OP_Free, ir_fmt("%s.free", un->name), 1, &un->flat, -1, u));
        }
        /* gradients into the flat gradient, copying where needed */
        for (int i = 0; i < un->nparams; i++) {
            int p = un->params[i], gv = g->val[p].grad;
            int at = g->val[gv].producer;
            if (needs_copy(g, gv, gradseen)) {
                int c = ir_like(g, ir_fmt("%s.grad", g->val[p].name), p, R_GRAD);
                if (at < 0)
                    at = g->nfwd; /* produced by no node: copy at the start of backward */
                push(&after[at], mk(OP_Copy, ir_fmt("%s.grad.copy", g->val[p].name), 1, &gv, c, -1));
                g->val[p].grad = gv = c;
            }
            gradseen[gv] = 1;
            g->val[gv].role = R_GRAD;
            g->val[gv].alias_of = un->flatgrad;
            g->val[gv].alias_off = un->offset[i] * (int64_t)dtype_size(un->dtype);
            g->val[gv].unit = u;
            gdone = gdone > at ? gdone : at;
        }
        push(&after[gdone], mk(OP_ReduceScatter, ir_fmt("%s.reduce_scatter", un->name), 1,
                               &un->flatgrad, un->gradshard, u));
        Op op = g->opt->optimizer == OPT_SGD ? OP_Sgd : OP_AdamW;
        int in[5] = {un->shard, un->gradshard, un->state[0], op == OP_AdamW ? un->state[1] : -1, -1};
        push(&tail, mk(op, ir_fmt("%s.%s", un->name, op == OP_AdamW ? "adamw" : "sgd"),
                       op == OP_AdamW ? 5 : 4, in, -1, u));
    }
    if (g->nunit > 0) { /* the global squared gradient norm, read by every update */
        Shape scalar = {0};
        DType dt = g->unit[0].dtype;
        int *shards = ir_alloc(sizeof(int) * (size_t)(g->nunit + 1));
        for (int u = 0; u < g->nunit; u++)
            shards[u] = g->unit[u].gradshard;
        shards[g->nunit] = g->loss_avg;
        int local = ir_value(g, "grad_norm_sq.local", dt, &scalar, R_ACT);
        g->grad_norm_sq = ir_value(g, "grad_norm_sq", dt, &scalar, R_ACT);
        Node sum = mk(OP_AllReduce, "grad_norm_sq", 1, &local, g->grad_norm_sq, -1);
        sum.attr = ir_alloc(sizeof(Attr));
        sum.attr[0] = (Attr){.name = "sum", .kind = A_INT, .i = 1};
        sum.nattr = 1;
        List head = {0};
        push(&head, mk(OP_GradNormSq, "grad_norm_sq.local", g->nunit + 1, shards, local, -1));
        push(&head, sum);
        for (int k = 0; k < tail.len; k++) {
            Node *n = &tail.n[k];
            n->in[n->nin - 1] = g->grad_norm_sq;
            push(&head, *n);
        }
        tail = head;
    }

    int total = nn + tail.len;
    for (int i = 0; i < nn; i++)
        total += before[i].len + after[i].len;
    Node *out = ir_alloc(sizeof(Node) * (size_t)(total + 1));
    int n = 0, nfwd = 0;
    for (int i = 0; i < nn; i++) {
        for (int k = 0; k < before[i].len; k++)
            out[n++] = before[i].n[k];
        if (!is_update(g->node[i].op))
            out[n++] = g->node[i];
        for (int k = 0; k < after[i].len; k++)
            out[n++] = after[i].n[k];
        if (i + 1 == g->nfwd)
            nfwd = n;
    }
    for (int k = 0; k < tail.len; k++)
        out[n++] = tail.n[k];
    ir_set_nodes(g, out, n);
    g->nfwd = nfwd;
}
