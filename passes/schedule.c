/* schedule.c — when each collective starts and when the step waits for it.
 *
 * requires: shard (its collectives sit where they are needed: a gather just
 *           before the unit's first use, a reduce-scatter just after the
 *           unit's last gradient), fuse (the final node set).
 * ensures:  every collective is asynchronous: the node is its start (attr
 *   tag = k, 0 <= k < g->ncoll), and one Wait node (same tag, inputs: the
 *   collective's inputs and outputs, so that memplan keeps them alive until
 *   it) is where the step waits for it.  Between a start and its Wait no
 *   node reads or writes what the collective writes, or writes what it
 *   reads (ir_verify checks this); another collective is such a node too,
 *   so two collectives in flight at once never touch each other's buffers
 *   and need no order between them.  The runtime runs the collectives in
 *   start order on their lanes (rt.h: gathers on one, reductions on the
 *   other; one communication thread for both on cpu, a stream each on
 *   cuda), so every rank issues each lane's in the same order.
 *   Starts (the prefetch, decided here, statically):
 *     - a reduce-scatter or all-reduce starts where shard put it;
 *     - --forward-prefetch: a forward gather starts right after the wait of
 *       the gather before it (while that unit computes); else where shard
 *       put it;
 *     - --prefetch backward_pre (the default): a backward gather starts right
 *       after the wait of the backward gather before it (before that unit's
 *       gradients are computed); backward_post: right after that unit's
 *       reduce-scatter starts; none: where shard put it;
 *     - no prefetch ever makes more than --max-inflight K (default 2)
 *       gathered buffers live at once: a start that would is delayed to the
 *       first point where one fewer is live.  A buffer gathered in the
 *       forward and freed in the backward (grad_op's, the root's: shard.c)
 *       is not counted: it stays whatever the prefetch does (PyTorch's
 *       limit on all-gathers likewise waits only on frees).
 *   Waits: just before the first node that conflicts with the collective,
 *   and a reduce-scatter's before the next reduce-scatter starts (one in
 *   flight: its flat gradient's slot is released in order); the rest at the
 *   end of the step.
 */
#include "ir.h"

#include <string.h>

static int is_coll(const Node *n) { return (op_info[n->op].flags & F_COLL) != 0; }

static int reads(const Graph *g, const Node *n, int r)
{
    for (int j = 0; j < n->nin; j++)
        if (n->in[j] >= 0 && ir_root(g, n->in[j]) == r)
            return 1;
    return 0;
}

/* may node n run while collective c is in flight? */
static int conflicts(const Graph *g, const Node *c, const Node *n)
{
    for (int j = 0; j < c->nout; j++) {
        int r = ir_root(g, c->out[j]);
        if (reads(g, n, r) || ir_writes(g, n, r))
            return 1;
    }
    for (int j = 0; j < c->nin; j++)
        if (c->in[j] >= 0 && ir_writes(g, n, ir_root(g, c->in[j])))
            return 1;
    if (c->op == OP_ReduceScatter) /* written in place */
        return reads(g, n, ir_root(g, c->in[0]));
    return 0;
}

/* is gather i's buffer gathered in the forward and freed in the backward (fin: each gather's Free)? */
static int kept(const Graph *g, int i, const int *fin) { return i < g->nfwd && fin[i] >= g->nfwd; }

void pass_schedule(Graph *g)
{
    const Options *o = g->opt;
    int nn = g->nnode, K = o->max_inflight > 0 ? o->max_inflight : 2;
    int *start = ir_alloc(sizeof(int) * (size_t)(nn + 1)); /* per collective: inserted before node start[i] */
    int *fin = ir_alloc(sizeof(int) * (size_t)(nn + 1));   /* per gather: index of its Free */
    int *use = ir_alloc(sizeof(int) * (size_t)(nn + 1));   /* per gather: its first use (where it is waited for) */
    int *gathers = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    int *freed_at = ir_alloc(sizeof(int) * (size_t)(g->nval + 1)); /* per gathered buffer: its Free */
    int ngather = 0;
    for (int v = 0; v < g->nval; v++)
        freed_at[v] = nn;
    for (int i = 0; i < nn; i++)
        if (g->node[i].op == OP_Free)
            freed_at[ir_root(g, g->node[i].in[0])] = i;
    for (int i = 0; i < nn; i++) {
        start[i] = i;
        if (g->node[i].op == OP_AllGather) {
            fin[i] = freed_at[ir_root(g, g->node[i].out[0])];
            gathers[ngather++] = i;
        }
    }

    /* 1. the starts of the gathers: the prefetch target, then the hazards and the in-flight cap */
    int prev_f = -1, prev_b = -1;
    for (int k = 0; k < ngather; k++) {
        int i = gathers[k], t = i, fwd = i < g->nfwd;
        int prev = fwd ? prev_f : prev_b;
        if (prev >= 0 && fwd && o->forward_prefetch)
            t = use[prev];
        else if (prev >= 0 && !fwd && o->prefetch == PREFETCH_PRE)
            t = use[prev];
        else if (prev >= 0 && !fwd && o->prefetch == PREFETCH_POST)
            for (int j = prev + 1; j < nn; j++)
                if (g->node[j].op == OP_ReduceScatter && g->node[j].unit == g->node[prev].unit) {
                    t = j + 1;
                    break;
                }
        if (k > 0 && t < start[gathers[k - 1]]) /* gathers start in their order */
            t = start[gathers[k - 1]];
        if (t > i)
            t = i;
        for (int j = i - 1; j >= t; j--) /* never across a node it conflicts with */
            if (conflicts(g, &g->node[i], &g->node[j])) {
                t = j + 1;
                break;
            }
        for (; t < i; t++) { /* the cap: gathered buffers live at t (before node t runs) */
            int live = 0;
            for (int q = 0; q < k; q++)
                live += start[gathers[q]] <= t && fin[gathers[q]] >= t && !kept(g, gathers[q], fin);
            if (live < K)
                break;
        }
        start[i] = t;
        /* where the next gather's prefetch may go: after this one's first use */
        int w = i + 1;
        while (w < nn && !conflicts(g, &g->node[i], &g->node[w]))
            w++;
        use[i] = w;
        if (fwd)
            prev_f = i;
        else
            prev_b = i;
    }

    /* 2. the order: every node at its place, each collective at its start (moved[p]: the starts moved up to
     * before node p, linked through next[] in their order) */
    int *item = ir_alloc(sizeof(int) * (size_t)(nn + 1)), nitem = 0;
    int *moved = ir_alloc(sizeof(int) * (size_t)(nn + 1)), *next = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    for (int p = 0; p <= nn; p++)
        moved[p] = -1;
    for (int i = nn - 1; i >= 0; i--)
        if (is_coll(&g->node[i]) && start[i] != i) {
            next[i] = moved[start[i]];
            moved[start[i]] = i;
        }
    for (int p = 0; p < nn; p++) {
        for (int i = moved[p]; i >= 0; i = next[i])
            item[nitem++] = i;
        if (!is_coll(&g->node[p]) || start[p] == p)
            item[nitem++] = p;
    }

    /* 3. the waits: before the first item that conflicts (a reduce-scatter's: or the next one); due[k]: the
     * collectives waited for before item k, linked through next[] in start order */
    int tags = 0;
    int *due = ir_alloc(sizeof(int) * (size_t)(nitem + 1)), *last = ir_alloc(sizeof(int) * (size_t)(nitem + 1));
    for (int k = 0; k <= nitem; k++)
        due[k] = last[k] = -1;
    for (int k = 0; k < nitem; k++) {
        const Node *c = &g->node[item[k]];
        if (!is_coll(c))
            continue;
        int w = k + 1;
        while (w < nitem && !conflicts(g, c, &g->node[item[w]]) &&
               !(c->op == OP_ReduceScatter && g->node[item[w]].op == OP_ReduceScatter))
            w++;
        next[item[k]] = -1;
        if (last[w] >= 0)
            next[last[w]] = item[k];
        else
            due[w] = item[k];
        last[w] = item[k];
        tags++;
    }

    /* 4. emit: at each item, the waits due there, then the item */
    Node *out = ir_alloc(sizeof(Node) * (size_t)(nitem + tags + 1));
    int n = 0, tag = 0, nfwd = -1;
    int *tag_of = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    for (int k = 0; k <= nitem; k++) {
        for (int i = due[k]; i >= 0; i = next[i]) {
            const Node *c = &g->node[i];
            Node w = {0};
            w.op = OP_Wait;
            w.name = ir_fmt("%s.wait", c->name);
            w.nin = c->nin + c->nout;
            w.in = ir_alloc(sizeof(int) * (size_t)(w.nin + 1));
            memcpy(w.in, c->in, sizeof(int) * (size_t)c->nin);
            memcpy(w.in + c->nin, c->out, sizeof(int) * (size_t)c->nout);
            w.out = ir_alloc(sizeof(int));
            w.unit = c->unit;
            w.attr = ir_alloc(sizeof(Attr) * 2);
            w.attr[0] = (Attr){.name = "tag", .kind = A_INT, .i = tag_of[i]};
            w.attr[1] = (Attr){.name = "of", .kind = A_INT, .i = c->op};
            w.nattr = 2;
            out[n++] = w;
        }
        if (k == nitem)
            break;
        int i = item[k];
        if (i >= g->nfwd && nfwd < 0)
            nfwd = n;
        Node x = g->node[i];
        if (is_coll(&x)) {
            Attr *a = ir_alloc(sizeof(Attr) * (size_t)(x.nattr + 1));
            if (x.nattr)
                memcpy(a, x.attr, sizeof(Attr) * (size_t)x.nattr);
            tag_of[i] = tag;
            a[x.nattr++] = (Attr){.name = "tag", .kind = A_INT, .i = tag++};
            x.attr = a;
        }
        out[n++] = x;
    }
    ir_set_nodes(g, out, n);
    g->nfwd = nfwd < 0 ? n : nfwd;
    g->ncoll = tag;
}
