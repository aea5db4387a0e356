/* seq.c — fold's resolution of ONNX sequences at compile time.  A sequence
 * value is resolved into the tensor values it holds: its ops are taken out
 * of the program as the sweep meets them (fold.c's canon_op asks seq_resolve
 * first), their lengths and positions known here (constants, and shapes,
 * which are static), and SplitToSequence becomes a Split [+ Squeeze],
 * SequenceAt an Identity, ConcatFromSequence [Unsqueezes +] a Concat,
 * SequenceLength a constant; SequenceConstruct, SequenceEmpty,
 * SequenceInsert, SequenceErase and an Identity of a sequence only define a
 * new sequence (Sweep's seq table, fold.h).  No other op may read a
 * sequence: one line naming the node.  A sequence holds at most SEQ_MAX
 * tensors.
 */
#include "fold.h"
#include "rules/tensor.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

enum { SEQ_MAX = 1 << 16 };   /* tensors in one sequence */

const Seq *seq_of(const Sweep *s, int v)
{
    for (int i = 0; i < s->nseq; i++)
        if (s->seq[i].v == v)
            return &s->seq[i];
    return NULL;
}

static void seq_define(Sweep *s, int v, const int *el, int n)
{
    if (s->nseq == s->seqcap) {
        Seq *t = ir_alloc(sizeof *t * (size_t)(2 * s->seqcap + 8));
        if (s->nseq)
            memcpy(t, s->seq, sizeof *t * (size_t)s->nseq);
        s->seq = t;
        s->seqcap = 2 * s->seqcap + 8;
    }
    int *e = ir_alloc(sizeof(int) * (size_t)(n + 1));
    if (n)
        memcpy(e, el, sizeof(int) * (size_t)n);
    s->seq[s->nseq++] = (Seq){v, n, e};
}

static int is_seq_op(Op op)
{
    switch (op) {
    case OP_SequenceConstruct: case OP_SequenceEmpty: case OP_SequenceAt: case OP_SequenceInsert:
    case OP_SequenceErase: case OP_SequenceLength: case OP_SplitToSequence: case OP_ConcatFromSequence:
        return 1;
    default:
        return 0;
    }
}

/* Input k of node n, which must be a sequence. */
static const Seq *seq_in(const Sweep *s, const Node *n, int k)
{
    const Seq *q = seq_of(s, n->in[k]);
    if (!q)
        node_fatal(s->g, n, "input '%s' is a tensor; %s takes a sequence", ir_q(s->g->val[n->in[k]].name),
                   op_info[n->op].name);
    return q;
}

/* Optional position input k of node n as an index into a sequence of len
 * (or len + 1 places when insert), dflt when absent; constant or refused. */
static int seq_pos(const Sweep *s, const Node *n, int k, int len, int insert, int dflt)
{
    if (k >= n->nin || n->in[k] < 0)
        return dflt;
    const Value *x = &s->g->val[n->in[k]];
    if (x->role != R_CONST || !x->data || shape_numel(&x->shape) != 1 || (x->dtype != DT_I64 && x->dtype != DT_I32))
        node_fatal(s->g, n, "the position '%s' must be a constant int64 scalar; fsdpc resolves sequences at "
                   "compile time", ir_q(x->name));
    int64_t p = tensor_const_i(x, 0), hi = len + insert;
    if (p < -(int64_t)len || p >= hi)
        node_fatal(s->g, n, "position %lld is outside [%d, %lld) for a sequence of %d tensors", (long long)p, -len,
                   (long long)hi, len);
    return (int)(p < 0 ? p + len : p);
}

int seq_part(Sweep *s, int id, Op op, int in, const char *suffix, const char *attr, int64_t axis)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    int y = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    int c = ir_node1(g, op, name, in, -1, y);
    ir_attr_ints_add(g, c, attr, &axis, 1);
    visit(s, c);
    return y;
}

static void split_to_sequence(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id]; /* copy: appending nodes moves g->node */
    const Value *x = &g->val[n.in[0]];
    if (x->dtype == DT_UNDEF)
        node_fatal(g, &n, "its input's shape is not known here; fsdpc resolves sequences at compile time");
    int ax = tensor_axis(g, &n, ir_attr_i(&n, "axis", 0), x->shape.rank, "axis");
    int64_t d = x->shape.dim[ax], cnt, *sz;
    int keep = ir_attr_i(&n, "keepdims", 1) != 0, has = n.nin > 1 && n.in[1] >= 0;
    if (has) {
        const Value *sp = fold_const_in(g, &n, 1, "split");
        if (sp->dtype != DT_I64 && sp->dtype != DT_I32)
            node_fatal(g, &n, "the split input '%s' must be int64", ir_q(sp->name));
        if (sp->shape.rank == 0) {
            int64_t c = tensor_const_i(sp, 0);
            if (c <= 0)
                node_fatal(g, &n, "split %lld must be positive", (long long)c);
            cnt = d / c + (d % c != 0);
            if (cnt > SEQ_MAX)
                node_fatal(g, &n, "splits into %lld tensors; fsdpc resolves sequences of at most %d", (long long)cnt, SEQ_MAX);
            sz = ir_alloc(sizeof(int64_t) * (size_t)(cnt + 1));
            for (int64_t i = 0; i < cnt; i++)
                sz[i] = i < cnt - 1 || d % c == 0 ? c : d % c;
        } else {
            cnt = shape_numel(&sp->shape);
            if (sp->shape.rank != 1 || cnt > SEQ_MAX)
                node_fatal(g, &n, "the split input '%s' must be a scalar or a 1-D list of at most %d sizes",
                           ir_q(sp->name), SEQ_MAX);
            sz = ir_alloc(sizeof(int64_t) * (size_t)(cnt + 1));
            int64_t sum = 0;
            for (int64_t i = 0; i < cnt; i++) {
                sz[i] = tensor_const_i(sp, i);
                if (sz[i] < 0 || sz[i] > d - sum)
                    node_fatal(g, &n, "split sizes must be non-negative and sum to dim %d's %lld", ax, (long long)d);
                sum += sz[i];
            }
            if (sum != d)
                node_fatal(g, &n, "split sizes sum to %lld, not dim %d's %lld", (long long)sum, ax, (long long)d);
        }
    } else {
        cnt = d;
        if (cnt > SEQ_MAX)
            node_fatal(g, &n, "splits into %lld tensors; fsdpc resolves sequences of at most %d", (long long)cnt, SEQ_MAX);
        sz = ir_alloc(sizeof(int64_t) * (size_t)(cnt + 1));
        for (int64_t i = 0; i < cnt; i++)
            sz[i] = 1;
    }
    int *el = ir_alloc(sizeof(int) * (size_t)(cnt + 1));
    if (cnt) {
        const char *name = ir_fmt("%s/Split", n.name);
        for (int64_t i = 0; i < cnt; i++)
            el[i] = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int c = ir_node(g, OP_Split, name, 1, n.in, (int)cnt, el);
        ir_attr_add(g, c, "axis", A_INT)->i = ax;
        Attr *a = ir_attr_add(g, c, "split", A_INTS);
        a->n = (int)cnt;
        a->ints = sz;
        visit(s, c);
        if (!has && !keep)
            for (int64_t i = 0; i < cnt; i++)
                el[i] = seq_part(s, id, OP_Squeeze, el[i], ir_fmt("Squeeze%lld", (long long)i), "axes", ax);
    }
    seq_define(s, n.out[0], el, (int)cnt);
}

/* Rewrite sequence op node id: 1 if it is gone from the program (its
 * output a sequence or a constant), 0 if it became a tensor op to canonicalise. */
static int sequence(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Seq *q;
    switch (n.op) {
    case OP_SequenceConstruct:
        for (int i = 0; i < n.nin; i++)
            if (seq_of(s, n.in[i]))
                node_fatal(g, &n, "input '%s' is a sequence; fsdpc's sequences hold tensors", ir_q(g->val[n.in[i]].name));
        seq_define(s, n.out[0], n.in, n.nin);
        return 1;
    case OP_SequenceEmpty:
        seq_define(s, n.out[0], NULL, 0);
        return 1;
    case OP_SequenceInsert: case OP_SequenceErase: {
        q = seq_in(s, &n, 0);
        int ins = n.op == OP_SequenceInsert, len = q->n;
        if (ins && (n.in[1] < 0 || seq_of(s, n.in[1])))
            node_fatal(g, &n, "the inserted value must be a tensor");
        if (ins && len == SEQ_MAX)
            node_fatal(g, &n, "fsdpc resolves sequences of at most %d tensors", SEQ_MAX);
        if (!ins && !len)
            node_fatal(g, &n, "erases from an empty sequence");
        int p = seq_pos(s, &n, ins ? 2 : 1, len, ins, ins ? len : len - 1);
        int *el = ir_alloc(sizeof(int) * (size_t)(len + 2)), m = 0;
        for (int i = 0; i <= len; i++) {
            if (ins && i == p)
                el[m++] = n.in[1];
            if (i < len && (ins || i != p))
                el[m++] = q->el[i];
        }
        seq_define(s, n.out[0], el, m);
        return 1;
    }
    case OP_SequenceLength: {
        q = seq_in(s, &n, 0);
        Value *y = &g->val[n.out[0]];
        y->dtype = DT_I64;
        y->shape = (Shape){.rank = 0};
        y->data = ir_alloc(sizeof(int64_t));
        *(int64_t *)y->data = q->n;
        y->role = R_CONST;
        y->persistent = 1;
        return 1;
    }
    case OP_SplitToSequence:
        if (seq_of(s, n.in[0]))
            node_fatal(g, &n, "its input is a sequence; SplitToSequence splits a tensor");
        split_to_sequence(s, id);
        return 1;
    case OP_SequenceAt:
        q = seq_in(s, &n, 0);
        if (!q->n)
            node_fatal(g, &n, "reads from an empty sequence");
        g->node[id].in[0] = q->el[seq_pos(s, &n, 1, q->n, 0, 0)];
        g->node[id].nin = 1;
        g->node[id].op = OP_Identity;
        return 0;
    case OP_ConcatFromSequence: {
        q = seq_in(s, &n, 0);
        if (!q->n)
            node_fatal(g, &n, "concatenates an empty sequence; fsdpc needs at least one tensor");
        int64_t ax = ir_attr_i(&n, "axis", 0);
        int *in = ir_alloc(sizeof(int) * (size_t)(q->n + 1));
        for (int i = 0; i < q->n; i++)
            in[i] = ir_attr_i(&n, "new_axis", 0) ? seq_part(s, id, OP_Unsqueeze, q->el[i], ir_fmt("Unsqueeze%d", i), "axes", ax)
                                                 : q->el[i];
        Node *c = &g->node[id];
        c->op = OP_Concat;
        c->in = in;
        c->nin = q->n;
        fold_set_attr(g, id, "axis", A_INT)->i = ax;
        return 0;
    }
    default: /* Identity of a sequence: the same sequence */
        q = seq_in(s, &n, 0);
        seq_define(s, n.out[0], q->el, q->n);
        return 1;
    }
}

/* No other op reads a sequence. */
static void tensor_inputs(const Sweep *s, const Node *n)
{
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] >= 0 && seq_of(s, n->in[i]))
            node_fatal(s->g, n, "reads the sequence '%s'; fsdpc resolves sequences only through SequenceAt, "
                       "ConcatFromSequence, SequenceLength, SequenceInsert/Erase and Identity", ir_q(s->g->val[n->in[i]].name));
}

int seq_resolve(Sweep *s, int id)
{
    Graph *g = s->g;
    if (s->nseq && g->node[id].op == OP_Identity && seq_of(s, g->node[id].in[0]) && sequence(s, id))
        return 1;
    if (is_seq_op(g->node[id].op) && sequence(s, id))
        return 1;
    if (s->nseq)
        tensor_inputs(s, &g->node[id]);
    return 0;
}
