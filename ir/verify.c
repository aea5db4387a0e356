/* verify.c — structural checks run after every pass (fsdpc --verify, on in tests).
 *
 * Checks: ids in range; op arity as in ops.def; single assignment (one
 * producer per value); topological order (a value is produced before it is
 * read, or needs no producer: inputs, constants, parameters, shards); after
 * the shape pass every value a node touches has a dtype; after schedule
 * every asynchronous collective has one later Wait, and no node between
 * the two touches what it writes or writes what it reads.  A failure is a bug
 * in the pass named, never a user error: it aborts through die().
 */
#include "ir.h"

#include <string.h>

static int needs_producer(const Value *v)
{
    switch (v->role) {
    case R_INPUT: case R_CONST: case R_PARAM: case R_OPTSTATE:
    case R_SHARD: case R_GRADSHARD: case R_STATESHARD:
        return 0;
    default:
        return 1;
    }
}

static void check_value_id(const Graph *g, const Node *n, int v, const char *after)
{
    if (v < 0 || v >= g->nval)
        die("after %s: node '%s' (%s) refers to value %d of %d", after, n->name,
            op_info[n->op].name, v, g->nval);
}

/* does b write a buffer that a touches? */
static int clobbers(const Graph *g, const Node *a, const Node *b)
{
    for (int j = 0; j < a->nin + a->nout; j++) {
        int v = j < a->nin ? a->in[j] : a->out[j - a->nin];
        if (v >= 0 && ir_writes(g, b, ir_root(g, v)))
            return 1;
    }
    return 0;
}

static int race(const Graph *g, const Node *a, const Node *b) { return clobbers(g, a, b) || clobbers(g, b, a); }

/* the asynchronous collectives (attr tag) against the nodes until their Wait */
static void check_waits(const Graph *g, const char *after)
{
    for (int i = 0; i < g->nnode; i++) {
        const Node *c = &g->node[i];
        if (!(op_info[c->op].flags & F_COLL) || !ir_attr(c, "tag"))
            continue;
        int64_t tag = ir_attr_i(c, "tag", -1);
        int j = i + 1;
        for (; j < g->nnode; j++) {
            const Node *n = &g->node[j];
            if (n->op == OP_Wait && ir_attr_i(n, "tag", -1) == tag)
                break;
            if (race(g, c, n))
                die("after %s: node '%s' (%s) runs while collective '%s' is in flight and touches its buffers", after,
                    n->name, op_info[n->op].name, c->name);
        }
        if (j == g->nnode)
            die("after %s: collective '%s' (tag %lld) is never waited for", after, c->name, (long long)tag);
    }
}

/* FusedAttention's problems (passes/attention.c): q holds kvrep times as many (its leading dims' product) as kt and
 * v, which hold the same number (grouped-query attention reads K/V problem b / kvrep in place) */
static void check_attention_problems(const Graph *g, const Node *n, const int *qkv, const char *after)
{
    int64_t p[3];
    for (int i = 0; i < 3; i++) /* the leading dims' product (rank 3 or more, 4 with heads: the pass's) */
        p[i] = ir_attn_problems(n, &g->val[qkv[i]].shape);
    const int64_t kvrep = ir_attr_i(n, "kvrep", 1), heads = ir_attr_i(n, "heads", 0);
    if (heads && (g->val[qkv[0]].shape.rank < 4 || !ir_attr_i(n, "krow", 0) || heads % kvrep ||
                  g->val[qkv[0]].shape.dim[g->val[qkv[0]].shape.rank - 2] != heads))
        die("after %s: %s '%s' has heads %lld but not q [.., t, %lld, d] with krow and kvrep dividing it", after,
            op_info[n->op].name, n->name, (long long)heads, (long long)heads);
    if (kvrep < 1 || p[1] != p[2] || p[1] * kvrep != p[0])
        die("after %s: %s '%s' has %lld query problems against %lld and %lld K/V ones (kvrep %lld)", after,
            op_info[n->op].name, n->name, (long long)p[0], (long long)p[1], (long long)p[2], (long long)kvrep);
}

void ir_verify(const Graph *g, const char *after)
{
    static const char *untyped[] = {"frontend", "fold", NULL};
    int typed = 1;
    for (int i = 0; untyped[i]; i++)
        if (!strcmp(after, untyped[i]))
            typed = 0;

    char *made = ir_alloc((size_t)g->nval + 1), *freed = ir_alloc((size_t)g->nval + 1);
    for (int i = 0; i < g->nnode; i++) {
        const Node *n = &g->node[i];
        const OpInfo *oi = &op_info[n->op];
        if (n->nin < oi->inmin || (oi->inmax >= 0 && n->nin > oi->inmax))
            die("after %s: node '%s' (%s) has %d inputs", after, n->name, oi->name, n->nin);
        if (n->nout < oi->outmin || (oi->outmax >= 0 && n->nout > oi->outmax))
            die("after %s: node '%s' (%s) has %d outputs", after, n->name, oi->name, n->nout);
        for (int j = 0; j < n->nin; j++) {
            int v = n->in[j];
            if (v == -1 && j >= oi->inmin)
                continue; /* omitted optional input */
            check_value_id(g, n, v, after);
            const Value *x = &g->val[v];
            int root = ir_root(g, v);
            if (freed[root])
                die("after %s: node '%s' (%s) reads '%s' after its buffer was freed", after, n->name,
                    oi->name, x->name);
            if (needs_producer(&g->val[root]) && !made[root])
                die("after %s: node '%s' (%s) reads '%s' before it is produced", after, n->name,
                    oi->name, x->name);
            if (typed && x->dtype == DT_UNDEF)
                die("after %s: value '%s' has no dtype", after, x->name);
            /* the narrow dtypes (bfloat16, float16, int8 .. uint64) are cast to their wide ones by fold (a
             * model's) or read by the precision pass's ops */
            if (x->dtype != DT_UNDEF && dtype_wide(x->dtype) != x->dtype && strcmp(after, "frontend") &&
                !ir_reads_low(n, j))
                die("after %s: node '%s' (%s) reads the %s value '%s'", after, n->name, oi->name,
                    dtype_name(x->dtype), x->name);
        }
        /* once shaped (shape refuses such a model with its own message: before, it is the user's error) */
        if (typed && (n->op == OP_MatMul || n->op == OP_MatMulAdd) && g->val[n->in[0]].dtype != g->val[n->in[1]].dtype)
            die("after %s: %s '%s' has operands of two dtypes", after, oi->name, n->name);
        if (typed && (n->op == OP_FusedAttention || n->op == OP_FusedAttentionGrad)) { /* q, kt, v: one dtype */
            const int *qkv = n->in + (n->op == OP_FusedAttentionGrad);
            if (g->val[qkv[1]].dtype != g->val[qkv[0]].dtype || g->val[qkv[2]].dtype != g->val[qkv[0]].dtype)
                die("after %s: %s '%s' has q, kt, v of two dtypes", after, oi->name, n->name);
            check_attention_problems(g, n, qkv, after);
        }
        for (int j = 2; n->op == OP_MatMulAdd && j < 4; j++)
            if (n->in[j] >= 0 && g->val[n->in[j]].dtype != g->val[n->out[n->nout - 1]].dtype) /* (its scratch's) */
                die("after %s: MatMulAdd '%s' adds a %s value to its %s result", after, n->name,
                    dtype_name(g->val[n->in[j]].dtype), dtype_name(g->val[n->out[0]].dtype));
        if (n->op == OP_Free)
            freed[n->in[0]] = 1;
        for (int j = 0; j < n->nout; j++) {
            int v = n->out[j];
            check_value_id(g, n, v, after);
            if (made[v])
                die("after %s: value '%s' produced twice", after, g->val[v].name);
            made[v] = 1;
            if (g->val[v].alias_of >= 0)
                made[g->val[v].alias_of] = 1; /* a view written: its buffer is live */
            if (typed && g->val[v].dtype == DT_UNDEF)
                die("after %s: value '%s' has no dtype", after, g->val[v].name);
        }
    }
    check_waits(g, after);
    if (g->loss >= 0 && !made[g->loss])
        die("after %s: the loss '%s' is never produced", after, g->val[g->loss].name);
    for (int v = 0; v < g->nval; v++) {
        const Value *x = &g->val[v];
        if (x->alias_of >= g->nval || (x->alias_of >= 0 && g->val[x->alias_of].alias_of >= 0))
            die("after %s: value '%s' is a view of a view", after, x->name);
    }
}
