/* shape_core.c — shape rules of the core ops: elementwise rows of ops.def
 * (F_UNARY, F_BINARY), MatMul, Reshape, Transpose, the losses, and fsdpc's
 * own Identity-like ops.  passes/shape.c runs these and the families' rules
 * (shape_tensor.c, shape_nn.c) for one node at a time.
 */
#include "ir.h"

#include <string.h>

/* numpy broadcasting of a and b into o; 0 if incompatible */
static int broadcast(const Shape *a, const Shape *b, Shape *o)
{
    o->rank = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < o->rank; i++) {
        int ia = i - (o->rank - a->rank), ib = i - (o->rank - b->rank);
        int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return 0;
        o->dim[i] = da == 1 ? db : da;
    }
    return 1;
}



static void ew(Graph *g, const Node *n, DType *dt, Shape *s)
{
    const Value *a = &g->val[n->in[0]];
    *dt = a->dtype;
    *s = a->shape;
    for (int i = 1; i < n->nin; i++) {
        if (n->in[i] < 0)
            continue; /* an unread optional input */
        const Value *b = &g->val[n->in[i]];
        if (b->dtype != a->dtype)
            node_fatal(g, n, "%s", ir_fmt("input dtypes differ (%s and %s)", dtype_name(a->dtype),
                             dtype_name(b->dtype)));
        Shape o;
        if (!broadcast(s, &b->shape, &o))
            node_fatal(g, n, "%s", ir_fmt("shapes %s and %s do not broadcast", shape_str(s),
                             shape_str(&b->shape)));
        *s = o;
    }
    if (*dt == DT_I64 && (op_info[n->op].flags & F_I64))
        return; /* index arithmetic */
    if (!dtype_is_float(*dt) && n->op != OP_Identity)
        node_fatal(g, n, "%s", ir_fmt("dtype %s is not supported (float32 or float64%s)", dtype_name(*dt),
                                      op_info[n->op].flags & F_I64 ? ", and int64 at run time" : " only"));
}

/* MatMul with fsdpc's transA/transB; both operands rank >= 2 with batch
 * dims that broadcast, partially too ([B,1,M,K] x [B,H,K,N]: multi-query
 * attention; codegen loops over the dims where an operand broadcasts). */
static void matmul(Graph *g, const Node *n, DType *dt, Shape *s)
{
    const Value *a = &g->val[n->in[0]], *b = &g->val[n->in[1]];
    int ta = (int)ir_attr_i(n, "transA", 0), tb = (int)ir_attr_i(n, "transB", 0);
    if (a->shape.rank < 2 || b->shape.rank < 2)
        node_fatal(g, n, "%s", ir_fmt("operands %s and %s: a scalar operand is not supported (MatMul "
                                      "takes rank 1 or more)",
                         shape_str(&a->shape), shape_str(&b->shape)));
    if (a->dtype != b->dtype || !dtype_is_float(a->dtype))
        node_fatal(g, n, "%s", ir_fmt("dtypes %s and %s: need equal float dtypes", dtype_name(a->dtype),
                         dtype_name(b->dtype)));
    if (!shape_numel(&a->shape) || !shape_numel(&b->shape))
        node_fatal(g, n, "%s", ir_fmt("operands %s and %s: a MatMul over a zero-sized dimension is not supported "
                         "(fsdpc refuses empty matrices)", shape_str(&a->shape), shape_str(&b->shape)));
    int ra = a->shape.rank, rb = b->shape.rank;
    int64_t m = a->shape.dim[ra - (ta ? 1 : 2)], ka = a->shape.dim[ra - (ta ? 2 : 1)];
    int64_t kb = b->shape.dim[rb - (tb ? 1 : 2)], nn = b->shape.dim[rb - (tb ? 2 : 1)];
    if (ka != kb)
        node_fatal(g, n, "%s", ir_fmt("inner dimensions differ: %s x %s", shape_str(&a->shape),
                         shape_str(&b->shape)));
    Shape ba = a->shape, bb = b->shape, bo;
    ba.rank -= 2;
    bb.rank -= 2;
    if (!broadcast(&ba, &bb, &bo))
        node_fatal(g, n, "%s", ir_fmt("batch dims of %s and %s do not broadcast", shape_str(&a->shape),
                         shape_str(&b->shape)));
    *dt = a->dtype;
    *s = bo;
    s->dim[s->rank++] = m;
    s->dim[s->rank++] = nn;
}

static const Value *const_input(Graph *g, const Node *n, int i, const char *what)
{
    if (i >= n->nin || n->in[i] < 0)
        node_fatal(g, n, "%s", ir_fmt("missing %s input", what));
    const Value *v = &g->val[n->in[i]];
    if (v->role != R_CONST || !ir_data(g, n->in[i]))
        node_fatal(g, n, "%s", ir_fmt("the %s input '%s' must be a constant", what, ir_q(v->name)));
    return v;
}

static void reshape(Graph *g, const Node *n, DType *dt, Shape *s)
{
    const Value *x = &g->val[n->in[0]];
    const Value *sh = const_input(g, n, 1, "shape");
    if (sh->dtype != DT_I64 || sh->shape.rank != 1 || sh->shape.dim[0] > MAX_RANK)
        node_fatal(g, n, "%s", "shape input must be a 1-D int64 constant of at most 8 elements");
    const int64_t *d = sh->data;
    int allowzero = (int)ir_attr_i(n, "allowzero", 0);
    int neg = -1;
    s->rank = (int)sh->shape.dim[0];
    for (int i = 0; i < s->rank; i++) {
        int64_t v = d[i];
        if (v == 0 && !allowzero) {
            if (i >= x->shape.rank)
                node_fatal(g, n, "%s", "shape has 0 past the input's rank");
            v = x->shape.dim[i];
        }
        if (v == -1) {
            if (neg >= 0)
                node_fatal(g, n, "%s", "shape has more than one -1");
            neg = i;
            v = 1;
        } else if (v < 0) {
            node_fatal(g, n, "%s", ir_fmt("negative dimension %lld in shape", (long long)v));
        }
        s->dim[i] = v;
    }
    node_check_shape(g, n, s, "the output");     /* with -1 as 1: the product cannot wrap below */
    int64_t known = shape_numel(s), total = shape_numel(&x->shape);
    if (neg >= 0) {
        if (known == 0 || total % known)
            node_fatal(g, n, "%s", ir_fmt("cannot reshape %s to the requested shape", shape_str(&x->shape)));
        s->dim[neg] = total / known;
    }
    if (shape_numel(s) != total)
        node_fatal(g, n, "%s", ir_fmt("cannot reshape %s (%lld elements) to %s", shape_str(&x->shape),
                         (long long)total, shape_str(s)));
    *dt = x->dtype;
}

static void transpose(Graph *g, const Node *n, DType *dt, Shape *s)
{
    const Value *x = &g->val[n->in[0]];
    const Attr *p = ir_attr(n, "perm");
    int r = x->shape.rank, seen[MAX_RANK] = {0};
    if (p && (p->kind != A_INTS || p->n != r))
        node_fatal(g, n, "%s", ir_fmt("perm must list %d axes", r));
    s->rank = r;
    for (int i = 0; i < r; i++) {
        int64_t ax = p ? p->ints[i] : r - 1 - i;
        if (ax < 0 || ax >= r || seen[ax]++)
            node_fatal(g, n, "%s", "perm is not a permutation of the input's axes");
        s->dim[i] = x->shape.dim[ax];
    }
    *dt = x->dtype;
}

/* MseLoss(pred, target), CrossEntropyLoss(logits, labels): a mean over a
 * batch and, for cross-entropy, a softmax over the last dim (classes) */
static void loss_rule(Graph *g, const Node *n)
{
    const Shape *x = &g->val[n->in[0]].shape;
    if (shape_numel(x) == 0)
        node_fatal(g, n, "the loss input '%s' %s has no elements (an empty batch or 0 classes); fsdpc "
                   "refuses zero-sized loss inputs", ir_q(g->val[n->in[0]].name), shape_str(x));
}

static void set_out(Graph *g, const Node *n, DType dt, const Shape *s)
{
    Value *o = &g->val[n->out[0]];
    o->dtype = dt;
    o->shape = *s;
}

int shape_core(Graph *g, int id)
{
    const Node *n = &g->node[id];
    DType dt = DT_UNDEF;
    Shape s = {0};
    const Value *in0 = n->nin > 0 && n->in[0] >= 0 ? &g->val[n->in[0]] : NULL;
    switch (n->op) {
    case OP_Identity: case OP_Scale: case OP_UnaryGrad: ew(g, n, &dt, &s); break;
    case OP_MatMul: matmul(g, n, &dt, &s); break;
    case OP_Reshape: reshape(g, n, &dt, &s); break;
    case OP_Transpose: transpose(g, n, &dt, &s); break;
    case OP_Copy: dt = in0->dtype; s = in0->shape; break;
    case OP_MseLoss: case OP_CrossEntropyLoss: loss_rule(g, n); dt = in0->dtype; break; /* scalar */
    case OP_MseLossGrad: case OP_CrossEntropyGrad:
        dt = g->val[n->in[1]].dtype;
        s = g->val[n->in[1]].shape;
        break;
    default: return 0;
    }
    set_out(g, n, dt, &s);
    return 1;
}

int shape_elementwise(Graph *g, int id)
{
    const Node *n = &g->node[id];
    if (!(op_info[n->op].flags & (F_UNARY | F_BINARY)))
        return 0;
    DType dt;
    Shape s;
    ir_kernel_param_check(g, n);
    ew(g, n, &dt, &s);
    set_out(g, n, dt, &s);
    return 1;
}
