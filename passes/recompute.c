/* recompute.c — activation recompute per FSDP unit (--recompute units, selective).
 *
 * requires: shard, precision (the step's collectives, Frees and casts in
 *           place; g->nfwd marks the forward nodes).
 * ensures (--recompute units; none leaves the graph as it is):
 *   - the forward pass is cut into one segment per unit: unit u's segment
 *     runs from the first forward node that reads one of u's parameters up
 *     to the next unit's first such node (the nodes before the first unit
 *     belong to none); a parameter-free lead-in that only u's segment reads
 *     and that reads only what crosses into u's segment anyway (an RMSNorm
 *     written as Mul, ReduceMean, Add, Sqrt, Div before its weight's Mul)
 *     joins u's segment, so the boundary is the block's input alone;
 *   - an activation produced in u's segment and read by the backward is no
 *     longer kept from forward to backward: its producer, and what the
 *     producer needs from the segment, are cloned ("NAME@recompute") into
 *     the backward just before the first node that reads a clone's output,
 *     and the backward reads the clones;
 *   - clones read u's backward parameter views (--shard full/hybrid: the
 *     `@bwd` views of the backward gathered buffer; grad_op, none: the
 *     forward's views), so no AllGather is added: the backward's gather is
 *     reused.  That gather may move up to the first clone that needs it,
 *     but past no Free, so the gathered buffers in flight (the slots) stay
 *     as they were; a clone that would read parameters before that point or
 *     after the buffer's Free is not made (what it makes stays saved);
 *   - what a segment reads from outside it (the block's input activation,
 *     the previous unit's output) stays saved: the checkpoint boundary;
 *   - never cloned (outputs kept): collectives, Free, optimizer updates,
 *     Assign (BatchNorm running statistics: a side effect), nodes that read
 *     another unit's parameters or parameters the backward never gathers
 *     (a third gather would be needed);
 *   - a value stays saved where its recompute would need another value
 *     saved that was not saved before, and where another unit's clones read
 *     it (they keep it saved anyway);
 *   - only where it pays: every unit is recomputed, then each unit whose
 *     recompute does not lower the estimated peak of live activation bytes
 *     (the sum over the new order, views counted once as memplan places
 *     them) is left out again, until none is: the last unit, whose backward
 *     follows its forward at once, typically gains nothing;
 *   - every clone computes bit for bit what its original did: the same
 *     kernel on the same bytes (the backward gather of an unchanged shard
 *     equals the forward's).  Dropout draws its mask from a counter-based
 *     RNG keyed by the node's `stream` attribute and the step, which the
 *     clone copies: the same mask, so the forward's mask is not kept either.
 * --recompute selective (torchtitan's default "selective" policy in spirit:
 * keep what is expensive to recompute, recompute what is cheap) is the same
 * with MatMul, MatMulAdd, Conv and FusedAttention never cloned: their
 * outputs stay saved, and only the nodes between them (elementwise ops,
 * norms, softmax, casts, views) run again, from those outputs and the
 * segment's input.  It saves less memory than units but adds almost no
 * FLOPs: the recomputed work is bandwidth, not GEMMs.
 * The IR stays single-assignment and topologically ordered; the clones all
 * lie after g->nfwd, so the forward pass is unchanged.
 */
#include "ir.h"

#include <string.h>

typedef struct {
    Graph *g;
    int nn, nfwd;
    int *seg;          /* node -> unit whose segment holds it, -1 */
    char *clonable;    /* node */
    char *cloned;      /* node: a clone of it goes into the backward */
    int *pos;          /* node: the clone is inserted before this node */
    int *first_bwd;    /* value: first backward node reading it, nn if none */
    char *status;      /* value: 1 its recompute needs nothing new saved, 0 not */
    char *reads_param; /* value: its recompute reads parameters (status 1 only) */
    char *recomp;      /* value: the backward reads its clone */
    char *pinned;      /* value: another clone reads it saved */
    char *need;        /* value: its producer is cloned */
    int *bview;        /* value: the backward view of a forward parameter view, -1 */
    int *bfree, *bgather; /* unit: Free / AllGather of the backward buffer, -1 */
    int *glo;          /* unit: how far up its backward AllGather may move: past no Free */
    char *avail;       /* unit: the backward can read its parameters */
    char *base;        /* node: clonable when its unit is recomputed */
    char *on;          /* unit: recomputed */
} Rc;

static int is_param(const Graph *g, int v) { return v >= 0 && g->val[v].role == R_PARAM; }

static int producer_in(const Rc *r, int v) /* forward producer of v, -1 */
{
    int p = v >= 0 ? r->g->val[v].producer : -1;
    return p >= 0 && p < r->nfwd ? p : -1;
}

/* may forward node n move into the segment its readers are in? (it reads no
 * parameter and is a plain computation) */
static int movable(const Graph *g, const Node *n)
{
    if (n->nout == 0 || (op_info[n->op].flags & (F_COLL | F_OPT)) || n->op == OP_Assign || n->op == OP_Free ||
        n->op == OP_Wait)
        return 0;
    for (int j = 0; j < n->nin; j++)
        if (is_param(g, n->in[j]))
            return 0;
    return 1;
}

/* the forward readers of every value, as CSR: value v's readers are
 * rd[off[v]] .. rd[off[v + 1] - 1] */
static void forward_readers(const Rc *r, int **off_out, int **rd_out)
{
    const Graph *g = r->g;
    int *off = ir_alloc(sizeof(int) * (size_t)(g->nval + 1)), *fill = ir_alloc(sizeof(int) * (size_t)g->nval);
    for (int i = 0; i < r->nfwd; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] >= 0)
                off[g->node[i].in[j] + 1]++;
    for (int v = 0; v < g->nval; v++)
        off[v + 1] += off[v];
    int *rd = ir_alloc(sizeof(int) * (size_t)(off[g->nval] + 1));
    for (int i = 0; i < r->nfwd; i++)
        for (int j = 0; j < g->node[i].nin; j++) {
            int v = g->node[i].in[j];
            if (v >= 0)
                rd[off[v] + fill[v]++] = i;
        }
    *off_out = off;
    *rd_out = rd;
}

/* may candidate node i (moving into segment s = to[i]) move? every forward reader of its outputs is in s after
 * the move, and every input it reads is a parameter or constant, made by a candidate moving into s too, or read
 * by a node that is in s without moving (it crosses into s anyway) */
static int lead_in_ok(const Rc *r, int i, const int *to, const int *off, const int *rd)
{
    const Graph *g = r->g;
    const Node *n = &g->node[i];
    int s = to[i];
    for (int k = 0; k < n->nout; k++)
        for (int e = n->out[k] < 0 ? 0 : off[n->out[k]]; n->out[k] >= 0 && e < off[n->out[k] + 1]; e++)
            if ((to[rd[e]] >= 0 ? to[rd[e]] : r->seg[rd[e]]) != s)
                return 0;
    for (int j = 0; j < n->nin; j++) {
        int v = n->in[j], p = producer_in(r, v), crosses = p < 0 || to[p] == s;
        for (int e = v < 0 ? 0 : off[v]; v >= 0 && !crosses && e < off[v + 1]; e++)
            crosses = to[rd[e]] < 0 && r->seg[rd[e]] == s;
        if (!crosses)
            return 0;
    }
    return 1;
}

/* a unit's lead-in: the parameter-free nodes before its first parameter read
 * that only its own segment reads in the forward (an RMSNorm written as Mul,
 * ReduceMean, Add, Sqrt, Div before its weight's Mul) join that segment when
 * what they read crosses into it anyway: the checkpoint boundary is then the
 * block's input, as PyTorch's checkpoint of the block has it, not the
 * chain's output saved beside that input (one more [B, T, D] kept per
 * block).  Candidates are found walking back from the forward's end, so that
 * chains move whole; a candidate whose move would save something new (its
 * inputs would cross) is dropped, until none is. */
static void lead_in(Rc *r)
{
    Graph *g = r->g;
    enum { NONE = -2, MIXED = -3 };
    int *rseg = ir_alloc(sizeof(int) * (size_t)g->nval); /* value: the segment of its forward readers */
    int *to = ir_alloc(sizeof(int) * (size_t)(r->nfwd + 1)); /* node: the segment it moves into, -1 */
    for (int v = 0; v < g->nval; v++)
        rseg[v] = NONE;
    for (int i = r->nfwd - 1; i >= 0; i--) {
        const Node *n = &g->node[i];
        int s = NONE;
        for (int k = 0; k < n->nout && s != MIXED; k++) {
            int o = n->out[k];
            s = o < 0 || rseg[o] == NONE ? s : s == NONE || s == rseg[o] ? rseg[o] : MIXED;
        }
        to[i] = s >= 0 && s != r->seg[i] && movable(g, n) ? s : -1;
        int si = to[i] >= 0 ? to[i] : r->seg[i];
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (v >= 0)
                rseg[v] = rseg[v] == NONE || rseg[v] == si ? si : MIXED;
        }
    }
    int *off, *rd;
    forward_readers(r, &off, &rd);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < r->nfwd; i++)
            if (to[i] >= 0 && !lead_in_ok(r, i, to, off, rd)) {
                to[i] = -1;
                changed = 1;
            }
    }
    for (int i = 0; i < r->nfwd; i++)
        if (to[i] >= 0)
            r->seg[i] = to[i];
}

/* the unit segments: each forward node belongs to the unit whose first
 * parameter read is the last one at or before it */
static void find_segments(Rc *r)
{
    Graph *g = r->g;
    int *first = ir_alloc(sizeof(int) * (size_t)(g->nunit + 1));
    for (int u = 0; u < g->nunit; u++)
        first[u] = r->nn;
    for (int i = 0; i < r->nfwd; i++)
        for (int j = 0; j < g->node[i].nin; j++) {
            int v = g->node[i].in[j];
            if (!is_param(g, v) || op_info[g->node[i].op].flags & F_OPT)
                continue;
            int u = g->val[v].unit;
            first[u] = first[u] < i ? first[u] : i;
        }
    for (int i = 0; i < r->nfwd; i++) {
        r->seg[i] = -1;
        for (int u = 0, best = -1; u < g->nunit; u++)
            if (first[u] <= i && first[u] > best) {
                best = first[u];
                r->seg[i] = u;
            }
    }
    lead_in(r);
}

/* per unit: the buffer the backward reads its parameters from, that
 * buffer's AllGather and Free, and the forward view -> backward view map */
static void find_buffers(Rc *r)
{
    Graph *g = r->g;
    for (int u = 0; u < g->nunit; u++) {
        r->bfree[u] = r->bgather[u] = -1;
        r->avail[u] = g->unit[u].flat < 0; /* NO_SHARD in fp32: views of the shard, always there */
    }
    for (int i = r->nfwd; i < r->nn; i++) {
        const Node *n = &g->node[i];
        if (n->op == OP_AllGather && n->out[0] != g->unit[n->unit].flat)
            r->bgather[n->unit] = i; /* full, hybrid: the backward's own gather */
    }
    for (int u = 0; u < g->nunit; u++) {
        r->glo[u] = -1;
        for (int i = r->bgather[u] - 1; r->bgather[u] >= 0 && i >= 0 && r->glo[u] < 0; i--)
            if (g->node[i].op == OP_Free)
                r->glo[u] = i + 1;
    }
    for (int i = r->nfwd; i < r->nn; i++) {
        const Node *n = &g->node[i];
        if (n->op != OP_Free)
            continue;
        int u = n->unit, b = r->bgather[u] >= 0 ? g->node[r->bgather[u]].out[0] : g->unit[u].flat;
        if (n->in[0] == b) {
            r->bfree[u] = i;
            r->avail[u] = 1;
        }
    }
    for (int v = 0; v < g->nval; v++)
        r->bview[v] = -1;
    for (int v = 0; v < g->nval; v++) {
        int u = g->val[v].unit;
        if (!is_param(g, v) || u < 0 || r->bgather[u] < 0 || g->val[v].alias_of != g->node[r->bgather[u]].out[0])
            continue;
        for (int k = 0; k < g->unit[u].nparams; k++) {
            int p = g->unit[u].params[k];
            if (g->val[p].alias_off == g->val[v].alias_off)
                r->bview[p] = v;
        }
    }
}

/* the ops --recompute selective keeps: the products (their outputs stay saved); a ConvGrad in the forward is a
 * ConvTranspose (compose.c) */
static int kept_product(Op op)
{
    return op == OP_MatMul || op == OP_MatMulAdd || op == OP_Conv || op == OP_ConvGrad || op == OP_FusedAttention;
}

/* may node i be cloned into the backward? (before the window check) */
static int clonable(const Rc *r, int i)
{
    const Graph *g = r->g;
    const Node *n = &g->node[i];
    int f = op_info[n->op].flags;
    if (r->seg[i] < 0 || n->nout == 0 || (f & (F_COLL | F_OPT)) || n->op == OP_Assign || n->op == OP_Fused)
        return 0;
    if (g->opt->recompute == RECOMPUTE_SELECTIVE && kept_product(n->op))
        return 0;
    /* nor the Cast that stores a product in 16 bits (precision.c): the 16-bit value is the product kept */
    if (g->opt->recompute == RECOMPUTE_SELECTIVE && n->op == OP_Cast && g->val[n->in[0]].producer >= 0 &&
        kept_product(g->node[g->val[n->in[0]].producer].op))
        return 0;
    for (int j = 0; j < n->nin; j++) {
        int v = n->in[j];
        if (!is_param(g, v))
            continue;
        int u = g->val[v].unit;
        if (u != r->seg[i] || !r->avail[u] || (r->bgather[u] >= 0 && r->bview[v] < 0))
            return 0;
    }
    return 1;
}

/* is x (read by a node of segment s) cloned along with it? (not when its own recompute would need
 * something new saved: then the clone reads x saved, where find_status allows it) */
static int cloned_with(const Rc *r, int x, int s)
{
    int p = producer_in(r, x);
    return p >= 0 && r->seg[p] == s && r->clonable[p] && r->status[x];
}

/* status of every forward value, in program order: its recompute reads, from
 * its own segment, only values that stay saved anyway or can be recomputed
 * in turn (under --recompute selective the chain from a GEMM's output stops
 * at the first value the backward keeps anyway: a bias Add's output, say,
 * whose MatMul output the backward does not keep) */
static void find_status(Rc *r)
{
    Graph *g = r->g;
    memset(r->status, 0, (size_t)g->nval);
    for (int i = 0; i < r->nfwd; i++) {
        const Node *n = &g->node[i];
        int ok = r->clonable[i], rp = 0;
        for (int j = 0; ok && j < n->nin; j++) {
            int x = n->in[j], p = producer_in(r, x);
            rp |= is_param(g, x);
            if (p < 0 || r->seg[p] != r->seg[i])
                continue; /* from outside the segment: the checkpoint boundary */
            int again = r->clonable[p] && r->status[x]; /* x recomputed too */
            ok = again || r->first_bwd[x] < r->nn;
            rp |= again && r->reads_param[x];
        }
        for (int k = 0; k < n->nout; k++) {
            r->status[n->out[k]] = (char)ok;
            r->reads_param[n->out[k]] = (char)rp;
        }
    }
}

/* the values whose backward readers will read a clone, and the clones */
static void choose(Rc *r)
{
    Graph *g = r->g;
    memset(r->recomp, 0, (size_t)g->nval);
    memset(r->pinned, 0, (size_t)g->nval);
    for (int i = 0; i < r->nfwd; i++) {
        const Node *n = &g->node[i];
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k];
            int u = r->seg[i], b = r->first_bwd[v];
            int window = !r->reads_param[v] || (b >= r->glo[u] && (r->bfree[u] < 0 || b <= r->bfree[u]));
            r->recomp[v] = (char)(r->clonable[i] && r->status[v] && b < r->nn && window);
        }
    }
    for (int pass = 0; pass < 2; pass++) { /* 0: find the pinned values; 1: the clones of what is left */
        memset(r->need, 0, (size_t)g->nval);
        for (int i = r->nfwd - 1; i >= 0; i--) {
            const Node *n = &g->node[i];
            int c = 0;
            for (int k = 0; k < n->nout; k++)
                c |= r->recomp[n->out[k]] || r->need[n->out[k]];
            r->cloned[i] = (char)c;
            for (int j = 0; c && j < n->nin; j++) {
                int x = n->in[j];
                if (cloned_with(r, x, r->seg[i]))
                    r->need[x] = 1;
                else if (producer_in(r, x) >= 0)
                    r->pinned[x] = 1;
            }
        }
        for (int v = 0; v < g->nval; v++)
            if (r->pinned[v])
                r->recomp[v] = 0;
    }
}

/* where each clone goes: before the first node that reads one of its outputs */
static void place(Rc *r)
{
    Graph *g = r->g;
    int *cpos = ir_alloc(sizeof(int) * (size_t)g->nval); /* value: first clone reading it */
    for (int v = 0; v < g->nval; v++)
        cpos[v] = r->nn;
    for (int i = r->nfwd - 1; i >= 0; i--) {
        if (!r->cloned[i])
            continue;
        const Node *n = &g->node[i];
        int p = r->nn;
        for (int k = 0; k < n->nout; k++) {
            int v = n->out[k];
            p = cpos[v] < p ? cpos[v] : p;
            if (r->recomp[v] && r->first_bwd[v] < p)
                p = r->first_bwd[v];
        }
        if (p >= r->nn)
            die("recompute: the clone of '%s' has no reader", n->name);
        r->pos[i] = p;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0 && cloned_with(r, n->in[j], r->seg[i]) && p < cpos[n->in[j]])
                cpos[n->in[j]] = p;
    }
}

/* clones that would read parameters after the backward buffer's Free are
 * not made (the values they make stay saved); returns whether any was dropped */
static int drop_late(Rc *r)
{
    Graph *g = r->g;
    int dropped = 0;
    for (int i = 0; i < r->nfwd; i++) {
        if (!r->cloned[i])
            continue;
        const Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++) {
            int u = is_param(g, n->in[j]) ? g->val[n->in[j]].unit : -1;
            if (u >= 0 && ((r->bfree[u] >= 0 && r->pos[i] > r->bfree[u]) || r->pos[i] < r->glo[u])) {
                r->clonable[i] = 0;
                dropped = 1;
                break;
            }
        }
    }
    return dropped;
}

/* the clones by place: head[i], then next[k], in forward order (one array) */
static int *by_pos(const Rc *r)
{
    int *head = ir_alloc(sizeof(int) * (size_t)(r->nn + 1 + r->nfwd + 1)), *next = head + r->nn + 1;
    for (int i = 0; i <= r->nn; i++)
        head[i] = -1;
    for (int k = r->nfwd - 1; k >= 0; k--)
        if (r->cloned[k]) {
            next[k] = head[r->pos[k]];
            head[r->pos[k]] = k;
        }
    return head;
}

/* ---- the estimate: peak of live activation bytes in the new order ----
 * Values are numbered v (the original) and nv + v (its clone); a view
 * (Reshape, Identity, ...) counts as its input's bytes, as memplan places it. */
typedef struct {
    const Rc *r;
    int nv;
    int *root;         /* 2 nv: the value whose bytes it is */
    int64_t *def, *last;
} Live;

static int counted(const Graph *g, int v)
{
    Role k = g->val[v].role;
    return g->val[v].alias_of < 0 && (k == R_ACT || k == R_INPUT || k == R_GRAD);
}

static void touch(Live *l, int id, int64_t t)
{
    int x = l->root[id];
    if (l->def[x] < 0)
        l->def[x] = t;
    l->last[x] = l->last[x] > t ? l->last[x] : t;
}

/* node n at time t: a clone of segment seg (seg >= 0), or an original
 * node, of the backward (bwd: its recomputed inputs are the clones) or not */
static void live_node(Live *l, const Node *n, int seg, int bwd, int64_t t)
{
    const Rc *r = l->r;
    const Graph *g = r->g;
    int first = -1;
    for (int j = 0; j < n->nin; j++) {
        int x = n->in[j];
        if (x < 0)
            continue;
        if (seg >= 0 ? cloned_with(r, x, seg) : bwd && r->recomp[x])
            x += l->nv;
        else if (seg >= 0 && r->bview[x] >= 0)
            x = r->bview[x];
        if (j == 0)
            first = x;
        touch(l, x, t);
    }
    for (int k = 0; k < n->nout; k++) {
        int y = n->out[k] + (seg >= 0 ? l->nv : 0);
        int fr = first >= 0 ? l->root[first] % l->nv : -1; /* memplan's make_views */
        if (k == 0 && (op_info[n->op].flags & F_VIEW) && fr >= 0 && g->val[n->out[0]].alias_of < 0 &&
            g->val[fr].role != R_FLAT && g->val[fr].alias_of < 0)
            l->root[y] = l->root[first];
        touch(l, y, t);
    }
}

/* (called once per unit and round: all it allocates is released, not left in the arena) */
static int64_t estimate(const Rc *r)
{
    const Graph *g = r->g;
    int nv = g->nval;
    IrMark m = ir_mark();
    Live l = {.r = r, .nv = nv};
    l.root = ir_alloc(sizeof(int) * (size_t)(2 * nv));
    l.def = ir_alloc(sizeof(int64_t) * (size_t)(2 * nv));
    l.last = ir_alloc(sizeof(int64_t) * (size_t)(2 * nv));
    for (int v = 0; v < 2 * nv; v++) {
        l.root[v] = v;
        l.def[v] = -1;
        l.last[v] = -1;
    }
    for (int k = 0; k < g->ninput; k++)
        touch(&l, g->input[k], 0);
    int64_t t = 1;
    int *head = by_pos(r), *next = head + r->nn + 1;
    for (int i = 0; i < r->nn; i++) {
        for (int k = head[i]; k >= 0; k = next[k])
            live_node(&l, &g->node[k], r->seg[k], 0, t++);
        live_node(&l, &g->node[i], -1, i >= r->nfwd, t++);
    }
    int64_t *delta = ir_alloc(sizeof(int64_t) * (size_t)(t + 2)), cur = 0, peak = 0;
    for (int v = 0; v < 2 * nv; v++) {
        if (l.def[v] < 0 || l.root[v] != v || !counted(g, v % nv))
            continue;
        int64_t size = (value_numel(g, v % nv) * (int64_t)dtype_size(g->val[v % nv].dtype) + 63) / 64 * 64;
        delta[l.def[v]] += size;
        delta[l.last[v] + 1] -= size;
    }
    for (int64_t k = 0; k <= t; k++) {
        cur += delta[k];
        peak = peak > cur ? peak : cur;
    }
    ir_release(m);
    return peak;
}

/* the clones for the units switched on, and where they go */
static void plan(Rc *r)
{
    for (int i = 0; i < r->nfwd; i++)
        r->clonable[i] = (char)(r->base[i] && r->on[r->seg[i]]);
    do { /* each round drops at least one clone: it ends */
        find_status(r);
        choose(r);
        place(r);
    } while (drop_late(r));
}

/* the clone of node n, reading clones, backward views and saved values */
static Node clone(Rc *r, int k, const int *copy)
{
    Graph *g = r->g;
    const Node *n = &g->node[k];
    Node c = *n;
    c.name = ir_fmt("%s@recompute", n->name);
    c.in = ir_alloc(sizeof(int) * (size_t)(n->nin + 1));
    c.out = ir_alloc(sizeof(int) * (size_t)(n->nout + 1));
    for (int j = 0; j < n->nin; j++) {
        int x = n->in[j];
        if (x >= 0 && cloned_with(r, x, r->seg[k]))
            x = copy[x];
        else if (x >= 0 && r->bview[x] >= 0)
            x = r->bview[x];
        c.in[j] = x;
    }
    for (int o = 0; o < n->nout; o++)
        c.out[o] = ir_like(g, ir_fmt("%s@recompute", g->val[n->out[o]].name), n->out[o], g->val[n->out[o]].role);
    return c;
}

/* the new node list: at each position the moved gathers, the clones in
 * forward order, then the node; backward readers of recomputed values
 * read the clones */
static void emit(Rc *r)
{
    Graph *g = r->g;
    int nclone = 0, nval0 = g->nval;
    int *copy = ir_alloc(sizeof(int) * (size_t)(nval0 + 1));
    int *gpos = ir_alloc(sizeof(int) * (size_t)(g->nunit + 1)); /* unit: new place of its backward gather */
    for (int v = 0; v < nval0; v++)
        copy[v] = -1;
    for (int u = 0; u < g->nunit; u++)
        gpos[u] = r->bgather[u];
    for (int i = 0; i < r->nfwd; i++) {
        if (!r->cloned[i])
            continue;
        nclone++;
        const Node *n = &g->node[i];
        for (int j = 0; j < n->nin; j++) {
            int u = is_param(g, n->in[j]) ? g->val[n->in[j]].unit : -1;
            if (u >= 0 && gpos[u] > r->pos[i])
                gpos[u] = r->pos[i];
        }
    }
    Node *out = ir_alloc(sizeof(Node) * (size_t)(r->nn + nclone + 1));
    int *head = by_pos(r), *next = head + r->nn + 1;
    int m = 0;
    for (int i = 0; i < r->nn; i++) {
        for (int u = 0; u < g->nunit; u++)
            if (gpos[u] == i && r->bgather[u] != i)
                out[m++] = g->node[r->bgather[u]];
        for (int k = head[i]; k >= 0; k = next[k]) {
            Node c = clone(r, k, copy);
            for (int o = 0; o < c.nout; o++)
                copy[g->node[k].out[o]] = c.out[o];
            out[m++] = c;
        }
        Node n = g->node[i];
        if (n.op == OP_AllGather && i >= r->nfwd && gpos[n.unit] != i)
            continue; /* moved up */
        if (i >= r->nfwd) {
            int *in = ir_alloc(sizeof(int) * (size_t)(n.nin + 1));
            for (int j = 0; j < n.nin; j++)
                in[j] = n.in[j] >= 0 && n.in[j] < nval0 && r->recomp[n.in[j]] ? copy[n.in[j]] : n.in[j];
            n.in = in;
        }
        out[m++] = n;
    }
    ir_set_nodes(g, out, m);
}

void pass_recompute(Graph *g)
{
    if (!g->opt->recompute || g->nunit == 0)
        return;
    ir_link(g);
    Rc r = {.g = g, .nn = g->nnode, .nfwd = g->nfwd};
    int nn = r.nn, nv = g->nval, nu = g->nunit + 1;
    r.seg = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    r.clonable = ir_alloc((size_t)nn + 1);
    r.cloned = ir_alloc((size_t)nn + 1);
    r.pos = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    r.first_bwd = ir_alloc(sizeof(int) * (size_t)nv);
    r.status = ir_alloc((size_t)nv);
    r.reads_param = ir_alloc((size_t)nv);
    r.recomp = ir_alloc((size_t)nv);
    r.pinned = ir_alloc((size_t)nv);
    r.need = ir_alloc((size_t)nv);
    r.bview = ir_alloc(sizeof(int) * (size_t)nv);
    r.bfree = ir_alloc(sizeof(int) * (size_t)nu);
    r.bgather = ir_alloc(sizeof(int) * (size_t)nu);
    r.glo = ir_alloc(sizeof(int) * (size_t)nu);
    r.avail = ir_alloc((size_t)nu);
    for (int v = 0; v < nv; v++)
        r.first_bwd[v] = nn;
    for (int i = nn - 1; i >= r.nfwd; i--)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] >= 0)
                r.first_bwd[g->node[i].in[j]] = i;
    find_segments(&r);
    find_buffers(&r);
    r.base = ir_alloc((size_t)nn + 1);
    r.on = ir_alloc((size_t)nu);
    for (int i = 0; i < r.nfwd; i++)
        r.base[i] = (char)clonable(&r, i);
    /* every unit, then without each one whose recompute does not lower the
     * estimated peak (it would only cost time); again until none is dropped */
    for (int u = 0; u < g->nunit; u++)
        r.on[u] = 1;
    plan(&r);
    int64_t best = estimate(&r);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int u = 0; u < g->nunit; u++) {
            if (!r.on[u])
                continue;
            r.on[u] = 0;
            plan(&r);
            int64_t e = estimate(&r);
            if (e <= best) {
                best = e;
                changed = 1;
            } else {
                r.on[u] = 1;
            }
        }
    }
    plan(&r);
    emit(&r);
}
