/* fuse.c — elementwise nodes into one loop each.
 *
 * requires: shard (the step's final node list; Free and the collectives in
 *           place), shapes of every value.
 * ensures:  every group of two or more fusable nodes (below) is replaced by
 *           one Fused node at the place of the group's last node (its root):
 *           inputs = the values the group reads from outside, output = the
 *           root's output; g->fusion[attr group] keeps the member nodes in
 *           program order.  The members' other outputs are no longer
 *           produced or read by any node, so memplan gives them no memory:
 *           that, and one pass over memory instead of one per node, is the
 *           point.  --no-fuse leaves the graph as it is.
 *
 * Fusable: Add Sub Mul Div Pow, the unary ops, UnaryGrad, Scale, on float32
 * or float64, every input of the node's dtype; a ReduceSum's or ReduceMean's
 * gradient (ReduceGrad: its dy, of the kept shape, broadcast like an
 * outside input; an RMSNorm's mean of squares); and the Casts between float32
 * and bfloat16 / float16 that passes/precision.c puts around such ops (so a
 * loop loads 16-bit values widened and stores its result rounded, and the
 * float32 copies between are never written).  A group grows from its root
 * backwards through inputs whose value
 *   - is produced by a fusable node of the same phase (forward/backward),
 *   - has exactly one use (inside the group), is an activation (not a view,
 *     not a graph output) and has the root's shape (so it is one element
 *     per loop iteration; outside inputs may broadcast),
 *   - and no Free, collective, optimizer update or Assign stands between its
 *     producer and the root (moving a read later never crosses the end of a
 *     gathered buffer or a write of state).
 * A group reads at most FUSE_MAX_IN outside values (kernel arguments).
 * Then, on cpu, a bias gradient (ReduceSumTo over every dim but the last) of
 * a Fused node's output or of a lone fusable node's becomes that loop's
 * second output (column_sums).
 *
 * Before that, GEMM epilogues: an Add of a MatMul's output and
 *   - a bias, a vector over the output's last axis (every other dim 1), or
 *   - an addend of the output's shape (a residual, a gradient sum),
 * becomes one MatMulAdd node: the GEMM adds them as it writes its result
 * (cuBLASLt's bias epilogue and C input; CBLAS's beta 1 onto C preset to
 * them), so the product is never written and read back.  The product must
 * have that one use, in the same phase.  The node takes the MatMul's place
 * when the other input can be read there (it exists and nothing writes it
 * in place: an activation, an input or a gathered parameter), else the
 * Add's, with no barrier between.  A second Add may join the same node
 * when the first filled the other slot.  Before any Add joins, a scaling
 * of the product by a constant (Mul or Div by a scalar constant, Scale:
 * attention's 1/sqrt(d)) becomes the GEMM's alpha.  Then a Cast to 16
 * bits of a GEMM's float32 result becomes the GEMM's own 16-bit output, a
 * block of rows at a time (gemm_low_out).
 */
#include "ir.h"
#include "rules/tensor.h"

#include <string.h>

#define FUSE_MAX_IN 12
#define FUSE_MAX_MEMBERS 64


static int is_low(DType t) { return t == DT_BF16 || t == DT_F16; }

/* what a fused loop computes a value of dtype t in: float64, or float32 (float32 and the 16-bit floats, which
 * the loop loads widened and stores rounded) */
static DType compute_type(DType t) { return t == DT_F64 ? DT_F64 : DT_F32; }

/* a ReduceSum's or ReduceMean's gradient whose dy has the kept shape (keepdims): dy broadcast into x's shape, as
 * the loop broadcasts an outside input, times 1/n for a mean */
static int reduce_grad_fusable(const Graph *g, const Node *n)
{
    Op of = (Op)ir_attr_i(n, "of", -1);
    const Attr *ys = ir_attr(n, "yshape");
    const Shape *dy = &g->val[n->in[0]].shape;
    if ((of != OP_ReduceSum && of != OP_ReduceMean) || !ys || ys->n != dy->rank ||
        g->val[n->in[0]].dtype != g->val[n->out[0]].dtype || !dtype_is_float(g->val[n->out[0]].dtype))
        return 0;
    for (int i = 0; i < dy->rank; i++)
        if (ys->ints[i] != dy->dim[i])
            return 0;
    return 1;
}

static int fusable(const Graph *g, const Node *n)
{
    if (n->op == OP_ReduceGrad)
        return reduce_grad_fusable(g, n);
    if (n->op == OP_Cast) { /* precision.c's casts between float32 and the low dtype */
        DType from = g->val[n->in[0]].dtype, to = g->val[n->out[0]].dtype;
        return (is_low(from) && to == DT_F32) || (from == DT_F32 && is_low(to));
    }
    if (!(op_info[n->op].flags & (F_UNARY | F_BINARY)) && n->op != OP_UnaryGrad && n->op != OP_Scale)
        return 0;
    if ((op_info[n->op].flags & F_UNARY) && n->nin > 1) /* Clip's bounds not (yet) attributes */
        for (int i = 1; i < n->nin; i++)
            if (n->in[i] >= 0)
                return 0;
    if (n->nout != 1)
        return 0;
    DType t = g->val[n->out[0]].dtype;
    if (!dtype_is_float(t))
        return 0;
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] >= 0 && g->val[n->in[i]].dtype != t)
            return 0;
    return 1;
}

static int is_barrier(const Node *n)
{
    int f = op_info[n->op].flags;
    return n->op == OP_Free || n->op == OP_Assign || (f & (F_COLL | F_OPT));
}

static int is_output(const Graph *g, int v)
{
    for (int k = 0; k < g->noutput; k++)
        if (g->output[k] == v)
            return 1;
    return v == g->loss || v == g->loss_avg;
}

/* Which MatMulAdd slot (2: bias, 3: addend) value o fills for output y, or -1. */
static int epilogue_slot(const Graph *g, int o, int y)
{
    const Shape *so = &g->val[o].shape, *sy = &g->val[y].shape;
    if (g->val[o].dtype != g->val[y].dtype)
        return -1;
    if (shape_eq(so, sy))
        return 3;
    if (so->rank < 1 || so->rank > sy->rank || so->dim[so->rank - 1] != sy->dim[sy->rank - 1])
        return -1;
    for (int i = 0; i < so->rank - 1; i++)
        if (so->dim[i] != 1)
            return -1;
    return 2;
}

/* Can the merged node of MatMul p and Add r read the Add's other input o at
 * p's place?  When o (and the buffer it views) already exists there and
 * nothing writes it in place (activations, inputs, gathered parameters). */
static int readable_at(const Graph *g, const int *producer, int o, int p)
{
    int root = ir_root(g, o);
    Role role = g->val[root].role;
    return producer[o] < p && producer[root] < p && (role == R_ACT || role == R_INPUT || role == R_FLAT);
}

static void set_alpha(Graph *g, int id, double alpha)
{
    Node *n = &g->node[id];
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attr[i].name, "alpha")) {
            Attr *a = ir_alloc(sizeof(Attr) * (size_t)n->nattr); /* the node's old copy keeps its array */
            memcpy(a, n->attr, sizeof(Attr) * (size_t)n->nattr);
            a[i].f = alpha;
            n->attr = a;
            return;
        }
    ir_attr_add(g, id, "alpha", A_FLOAT)->f = alpha;
}

/* the graph without the nodes marked in dropped (the forward's count kept) */
static void drop_nodes(Graph *g, const char *dropped)
{
    int nn = g->nnode, n = 0, nfwd = 0;
    Node *keep = ir_alloc(sizeof(Node) * (size_t)nn);
    for (int i = 0; i < nn; i++)
        if (!dropped[i]) {
            keep[n++] = g->node[i];
            nfwd += i < g->nfwd;
        }
    g->nfwd = nfwd;
    ir_set_nodes(g, keep, n);
}

static void gemm_epilogues(Graph *g)
{
    ir_link(g);
    int nn = g->nnode, merged = 0;
    int *barrier_before = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    char *dropped = ir_alloc((size_t)nn + 1);
    for (int i = 0; i < nn; i++)
        barrier_before[i + 1] = barrier_before[i] + is_barrier(&g->node[i]);
    int *producer = ir_alloc(sizeof(int) * (size_t)(g->nval + 1));
    for (int v = 0; v < g->nval; v++)
        producer[v] = g->val[v].producer;
    for (int r = 0; r < nn; r++) {
        const Node *post = &g->node[r]; /* an Add or a scaling after the GEMM */
        int xs;
        double f = 1;
        if (dropped[r] || (post->op != OP_Add && !tensor_scaling(g, post, &xs, &f)) ||
            !dtype_is_float(g->val[post->out[0]].dtype))
            continue;
        int scale = post->op != OP_Add;
        for (int side = 0; side < (scale ? 1 : 2); side++) {
            int x = scale ? xs : post->in[side], o = scale ? -1 : post->in[!side], p = producer[x];
            if (p < 0 || (g->node[p].op != OP_MatMul && g->node[p].op != OP_MatMulAdd))
                continue;
            const Value *xv = &g->val[x];
            int slot = scale ? 0 : epilogue_slot(g, o, x);
            if (xv->nuses != 1 || xv->role != R_ACT || xv->alias_of >= 0 || is_output(g, x) || slot < 0 ||
                !shape_eq(&xv->shape, &g->val[post->out[0]].shape) || (p >= g->nfwd) != (r >= g->nfwd))
                continue;
            Node mm = g->node[p];
            /* a scale before any addition (it would scale those too), an addition into a free slot */
            if (mm.op == OP_MatMulAdd && (scale ? mm.in[2] >= 0 || mm.in[3] >= 0 : mm.in[slot] >= 0))
                continue;
            /* at p's place (the Add moves up: o is read earlier, never later), else at r's (the GEMM's reads
             * move down: no barrier may stand between) */
            int at = scale || readable_at(g, producer, o, p) ? p
                     : barrier_before[r] == barrier_before[p + 1] ? r : -1;
            if (at < 0)
                continue;
            int *in = ir_alloc(sizeof(int) * 4);
            in[0] = mm.in[0], in[1] = mm.in[1], in[2] = -1, in[3] = -1;
            if (mm.op == OP_MatMulAdd)
                in[2] = mm.in[2], in[3] = mm.in[3];
            if (!scale)
                in[slot] = o;
            mm.op = OP_MatMulAdd;
            mm.in = in;
            mm.nin = 4;
            mm.out = ir_alloc(sizeof(int));
            mm.out[0] = post->out[0];
            mm.name = ir_fmt("%s+%s", mm.name, post->name);
            dropped[at == p ? r : p] = 1;
            g->node[at] = mm;
            if (scale)
                set_alpha(g, at, f * ir_attr_f(&mm, "alpha", 1.0));
            producer[mm.out[0]] = at;
            merged++;
            break;
        }
    }
    if (merged)
        drop_nodes(g, dropped);
}

/* Rows of a GEMM's scratch block: its float32 results of at most GEMM_LOW_BLOCK bytes (a core's L2: the
 * rounding reads them from there), yet GEMM_LOW_ROWS rows or more (a GEMM of fewer is slow); a result of more
 * than GEMM_LOW_LARGE bytes always goes so (the step never holds it in float32) */
#define GEMM_LOW_BLOCK ((int64_t)1 << 20)
#define GEMM_LOW_ROWS 128
#define GEMM_LOW_LARGE ((int64_t)32 << 20)

/* Is value v's one reader an op a fused loop takes in (so a Cast of it is rounded in that loop's registers)? */
static int read_by_loop(const Graph *g, int v)
{
    if (g->val[v].nuses != 1)
        return 0;
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] == v)
                return fusable(g, &g->node[i]);
    return 0;
}

/* The rows of GEMM p's output as one matrix: the output's rows when the GEMM is one matrix product, or its
 * batch's rows together when the second operand is one matrix every batch shares and the first is not
 * transposed (x [B, T, D] @ W [D, N]); else 0 (the rows are not one contiguous block of A and Y). */
static int64_t gemm_rows(const Graph *g, const Node *p)
{
    const Shape *sa = &g->val[p->in[0]].shape, *sb = &g->val[p->in[1]].shape, *sy = &g->val[p->out[0]].shape;
    if (ir_attr_i(p, "transA", 0) || sa->rank != sy->rank)
        return 0;
    for (int d = 0; d < sb->rank - 2; d++)
        if (sb->dim[d] != 1)
            return 0;
    return shape_numel(sy) / sy->dim[sy->rank - 1];
}

/* A GEMM result that only a Cast to 16 bits reads (passes/precision.c stores products low) is never written
 * in float32: the GEMM (as MatMulAdd) writes the 16-bit value itself, computing a block of rows at a time into
 * a float32 scratch (its output 1, about GEMM_LOW_BLOCK bytes) and rounding it into place while the block is
 * in cache, so the step never holds the whole float32 result (a language model's logits: 1.6 GB at GPT-2's
 * vocabulary and 8192 tokens) and makes no pass of its own over it.  A result up to GEMM_LOW_LARGE whose Cast
 * a fused loop takes in (its one reader is elementwise: a residual Add) keeps it there, rounded in the loop's
 * registers. */
static void gemm_low_out(Graph *g)
{
    ir_link(g);
    int nn = g->nnode, merged = 0;
    char *dropped = ir_alloc((size_t)nn + 1);
    int *barrier_before = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    for (int i = 0; i < nn; i++)
        barrier_before[i + 1] = barrier_before[i] + is_barrier(&g->node[i]);
    for (int c = 0; c < nn; c++) {
        const Node *cast = &g->node[c];
        if (cast->op != OP_Cast || !is_low(g->val[cast->out[0]].dtype))
            continue;
        int x = cast->in[0], p = g->val[x].producer;
        const Value *xv = &g->val[x];
        if (p < 0 || (g->node[p].op != OP_MatMul && g->node[p].op != OP_MatMulAdd) || xv->dtype != DT_F32 ||
            xv->nuses != 1 || xv->role != R_ACT || xv->alias_of >= 0 || is_output(g, x) ||
            (p >= g->nfwd) != (c >= g->nfwd) || barrier_before[c] != barrier_before[p + 1] ||
            (value_numel(g, x) * 4 <= GEMM_LOW_LARGE && read_by_loop(g, cast->out[0])))
            continue;
        int64_t rows = gemm_rows(g, &g->node[p]), cols = xv->shape.dim[xv->shape.rank - 1];
        if (rows <= 0)
            continue;
        int64_t block = GEMM_LOW_BLOCK / 4 / cols;
        block = block < GEMM_LOW_ROWS ? GEMM_LOW_ROWS : block;
        block = block > rows ? rows : block;
        Node mm = g->node[p];
        int *in = ir_alloc(sizeof(int) * 4), *out = ir_alloc(sizeof(int) * 2);
        in[0] = mm.in[0], in[1] = mm.in[1], in[2] = -1, in[3] = -1;
        if (mm.op == OP_MatMulAdd)
            in[2] = mm.in[2], in[3] = mm.in[3];
        Shape ss = {2, {block, cols}};
        out[0] = cast->out[0];
        out[1] = ir_value(g, ir_fmt("%s.rows", g->val[x].name), DT_F32, &ss, R_ACT);
        mm.op = OP_MatMulAdd;
        mm.in = in, mm.nin = 4, mm.out = out, mm.nout = 2;
        g->node[p] = mm;
        dropped[c] = 1;
        merged++;
    }
    if (merged)
        drop_nodes(g, dropped);
}

/* The Fused node of group f (number id): inputs the values its members read from outside (a Clip's bounds
 * aside), output the last member's; 0 where it would read more than FUSE_MAX_IN. */
static int fused_node(const Fusion *f, int id, Node *fz)
{
    int in[FUSE_MAX_IN], nin = 0;
    for (int k = 0; k < f->n; k++) {
        const Node *m = &f->member[k];
        int ninput = m->op == OP_Clip ? 1 : m->nin;
        for (int i = 0; i < ninput; i++) {
            int v = m->in[i], inside = 0, seen = 0;
            if (v < 0)
                continue;
            for (int j = 0; j < k; j++)
                inside |= f->member[j].out[0] == v;
            for (int j = 0; j < nin; j++)
                seen |= in[j] == v;
            if (inside || seen)
                continue;
            if (nin == FUSE_MAX_IN)
                return 0;
            in[nin++] = v;
        }
    }
    const Node *root = &f->member[f->n - 1];
    *fz = (Node){.op = OP_Fused, .name = ir_fmt("%s.fused", root->name), .nin = nin, .nout = 1, .unit = -1};
    fz->in = ir_alloc(sizeof(int) * (size_t)nin);
    memcpy(fz->in, in, sizeof(int) * (size_t)nin);
    fz->out = ir_alloc(sizeof(int) * 2);
    fz->out[0] = root->out[0];
    fz->nattr = 2;
    fz->attr = ir_alloc(sizeof(Attr) * 2);
    fz->attr[0] = (Attr){.name = "group", .kind = A_INT, .i = id};
    char *ops = ir_alloc((size_t)f->n * 24 + 1);
    for (int k = 0; k < f->n; k++) {
        strcat(ops, k ? "," : "");
        strcat(ops, op_info[f->member[k].op].name);
    }
    fz->attr[1] = (Attr){.name = "ops", .kind = A_STRING, .s = ops};
    return 1;
}

/* May a loop that writes x (elementwise) also write y = ReduceSumTo(x), x summed over every dim but its last (a
 * bias gradient), as k_reduce_sum_to would: y of x's last dim (any leading dims 1), in float32 of a float32 or
 * 16-bit x (k_reduce_sum_to_f32 / _bf16 / _f16), in float64 of a float64 one? */
static int column_sum_of(const Graph *g, int x, int y)
{
    const Value *xv = &g->val[x], *yv = &g->val[y];
    const Shape *xs = &xv->shape, *ys = &yv->shape;
    if (xv->alias_of >= 0 || xs->rank < 1 || ys->rank < 1 || shape_numel(xs) <= 0 ||
        yv->dtype != compute_type(xv->dtype) || !(dtype_is_float(xv->dtype) || is_low(xv->dtype)) ||
        ys->dim[ys->rank - 1] != xs->dim[xs->rank - 1])
        return 0;
    for (int i = 0; i < ys->rank - 1; i++)
        if (ys->dim[i] != 1)
            return 0;
    return 1;
}

static int on_cpu(const Graph *g) { return !g->opt->target || !strcmp(g->opt->target, "cpu"); }

/* Column sums (cpu): a ReduceSumTo of a loop's result x over every dim but the last (column_sum_of) becomes the
 * loop's second output, so x is summed as it is written instead of read again (a GPT's GELU gradient, the
 * residual stream's gradient: a lone Add becomes a loop of one member).  The loop then splits over column tiles
 * (codegen/emit_fused.c), each walking the rows in order with a double accumulator per column, which is
 * k_reduce's order: the same bits.  Between the loop and the ReduceSumTo no barrier may stand (the sum is written
 * earlier).  cuda keeps the separate reduction (its kernel sums a column's rows in another order). */
static void column_sums(Graph *g)
{
    if (!on_cpu(g))
        return;
    ir_link(g);
    int nn = g->nnode, merged = 0, nfu = g->nfusion;
    char *dropped = ir_alloc((size_t)nn + 1);
    int *barrier_before = ir_alloc(sizeof(int) * (size_t)(nn + 1));
    for (int i = 0; i < nn; i++)
        barrier_before[i + 1] = barrier_before[i] + is_barrier(&g->node[i]);
    Fusion *fu = ir_alloc(sizeof(Fusion) * (size_t)(nfu + nn + 1));
    if (nfu)
        memcpy(fu, g->fusion, sizeof(Fusion) * (size_t)nfu);
    for (int s = 0; s < nn; s++) {
        const Node *rs = &g->node[s];
        if (rs->op != OP_ReduceSumTo)
            continue;
        int x = rs->in[0], y = rs->out[0], p = g->val[x].producer;
        if (p < 0 || p >= s || !column_sum_of(g, x, y) || (p >= g->nfwd) != (s >= g->nfwd) ||
            barrier_before[s] != barrier_before[p + 1])
            continue;
        Node *pn = &g->node[p];
        if (pn->op == OP_Fused ? pn->nout != 1 : !fusable(g, pn) || pn->out[0] != x)
            continue;
        if (pn->op != OP_Fused) { /* a loop of one member */
            Fusion *f = &fu[nfu];
            f->n = 1;
            f->member = ir_alloc(sizeof(Node));
            f->member[0] = *pn;
            Node fz;
            if (!fused_node(f, nfu, &fz))
                continue;
            *pn = fz;
            nfu++;
        }
        pn->nout = 2;
        pn->out[1] = y;
        dropped[s] = 1;
        merged++;
    }
    g->fusion = fu;
    g->nfusion = nfu;
    if (merged)
        drop_nodes(g, dropped);
}

void pass_fuse(Graph *g)
{
    if (g->opt->no_fuse)
        return;
    gemm_epilogues(g);
    gemm_low_out(g);
    ir_link(g);
    int nn = g->nnode;
    int *group = ir_alloc(sizeof(int) * (size_t)nn);   /* node -> group, -1 */
    int *barrier_before = ir_alloc(sizeof(int) * (size_t)(nn + 1)); /* barriers in [0, i) */
    for (int i = 0; i < nn; i++) {
        group[i] = -1;
        barrier_before[i + 1] = barrier_before[i] + is_barrier(&g->node[i]);
    }
    Fusion *fu = ir_alloc(sizeof(Fusion) * (size_t)(nn / 2 + 1));
    int nfu = 0;
    int *members = ir_alloc(sizeof(int) * FUSE_MAX_MEMBERS);
    for (int r = nn - 1; r >= 0; r--) {
        const Node *root = &g->node[r];
        if (group[r] >= 0 || !fusable(g, root))
            continue;
        const Value *ro = &g->val[root->out[0]];
        int phase = r >= g->nfwd, nm = 1;
        members[0] = r;
        /* grow backwards: members[k]'s inputs, breadth-first */
        for (int k = 0; k < nm; k++) {
            const Node *m = &g->node[members[k]];
            int ninput = m->op == OP_Clip ? 1 : m->nin;
            for (int i = 0; i < ninput && nm < FUSE_MAX_MEMBERS; i++) {
                int v = m->in[i];
                if (v < 0)
                    continue;
                const Value *x = &g->val[v];
                int p = x->producer;
                if (p < 0 || group[p] >= 0 || !fusable(g, &g->node[p]) || (p >= g->nfwd) != phase ||
                    x->nuses != 1 || x->role != R_ACT || x->alias_of >= 0 || is_output(g, v) ||
                    compute_type(x->dtype) != compute_type(ro->dtype) || !shape_eq(&x->shape, &ro->shape) ||
                    barrier_before[r] != barrier_before[p + 1])
                    continue;
                int dup = 0;
                for (int j = 0; j < nm; j++)
                    dup |= members[j] == p;
                if (!dup)
                    members[nm++] = p;
            }
        }
        if (nm < 2)
            continue;
        /* program order; count the outside inputs */
        for (int a = 1; a < nm; a++)
            for (int b = a; b > 0 && members[b - 1] > members[b]; b--) {
                int t = members[b];
                members[b] = members[b - 1];
                members[b - 1] = t;
            }
        Fusion *f = &fu[nfu];
        f->n = nm;
        f->member = ir_alloc(sizeof(Node) * (size_t)nm);
        for (int k = 0; k < nm; k++)
            f->member[k] = g->node[members[k]];
        Node fz;
        if (!fused_node(f, nfu, &fz))
            continue;
        for (int k = 0; k < nm; k++)
            group[members[k]] = nfu;
        /* the root becomes the Fused node; the others are dropped below */
        g->node[r] = fz;
        nfu++;
    }
    if (nfu) {
        Node *keep = ir_alloc(sizeof(Node) * (size_t)nn);
        int n = 0;
        for (int i = 0; i < nn; i++)
            if (group[i] < 0 || g->node[i].op == OP_Fused)
                keep[n++] = g->node[i];
        /* nfwd: the forward pass shrank by its fused members */
        int nfwd = 0;
        for (int i = 0; i < g->nfwd && i < nn; i++)
            nfwd += group[i] < 0 || g->node[i].op == OP_Fused;
        g->nfwd = nfwd;
        g->fusion = fu;
        g->nfusion = nfu;
        ir_set_nodes(g, keep, n);
    }
    column_sums(g);
    ir_link(g);
}
