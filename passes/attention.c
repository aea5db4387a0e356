/* attention.c — scaled-dot-product attention as one FusedAttention node.
 *
 * requires: shape (every value's dtype and shape), before autodiff.
 * ensures:  each chain
 *             s = MatMul(q, kt)                    q [L.., t, d], kt [L.., d, s] (or with
 *                                                  transB, k [L.., s, d]: krow); q or
 *                                                  kt may be x * c (folded into scale);
 *                                                  kt may be k through 3-D views that
 *                                                  exchange its last two axes (krow:
 *                                                  swapped_view)
 *             s = s * c  or  s / c                 (optional; c a scalar constant)
 *             s = Where(m, -inf, s) or Where(m, s, -inf)   (optional, m bool [.., t, s])
 *                 or s + bias                      (optional, bias float [.., t, s])
 *             [s = Where(e, 0, s)]                 e = Equal(ReduceMax(bias, last axis,
 *                                                  keepdims), -inf): ONNX Attention's guard
 *             p = Softmax(s, axis -1)               [Casts of p to its own dtype]
 *             [p = Where(e, 0, p)]                  (the guard's other half)
 *             or [p = Where(IsNaN(p), 0, p)]       torch's dynamo export of
 *                                                  scaled_dot_product_attention
 *             [p = Dropout(p, ratio, training)]    its mask unread (GPT-2's attn_pdrop,
 *                                                  BERT's, T5's); not on --target cuda
 *             y = MatMul(p, v)                     v [L.., s, dv]
 *           whose intermediate values have no other reader becomes
 *             y, lse, scratch = FusedAttention(q, kt, v, bias)
 *           at the place of the last MatMul (a Where mask becomes the bias
 *           Where(m, -inf, 0), one node before it), and the chain's other
 *           nodes are dropped (the guard's ReduceMax and Equal too; the op's
 *           zero_rows then gives a row that attends nothing zeros, as the
 *           guard does, where plain Softmax gives NaN).  A bias that a
 *           parameter reaches gets its gradient from FusedAttentionGrad's
 *           dbias (T5's learned relative positions).  So the step never holds the [L.., t, s]
 *           scores or probabilities: the kernel (kernels/c/attn.c) works
 *           through the query rows a tile at a time and keeps each row's
 *           log-sum-exp for the backward, which recomputes the tile's
 *           probabilities (grad_nn.c: FusedAttentionGrad).  On --target cuda
 *           the kernels are kernels/cuda/attn.cu's (tiled flash attention:
 *           a block per 64 query rows with an online softmax, or per 64 keys
 *           for dk and dv; no workspace).
 *           A mask or bias the compiler can read that is the causal band
 *           (band_of: query i sees key j exactly where j <= i + s - t, and
 *           with a sliding window of w keys where also j > i + s - t - w) is
 *           no tensor at all: the node gets attrs causal (and window) and no
 *           bias, the kernels compute the pattern (K_ATTN_CAUSAL), and the
 *           nodes that made the mask (nanoGPT's Slice, Equal, Cast of its
 *           buffer) are dropped when nothing else reads them.  A float bias
 *           masks by -inf or by its dtype's lowest value (Hugging Face's
 *           finfo.min), and may hold the band once per leading index (its
 *           mask is one a batch row).  Readable: a
 *           bool constant, a float constant folding made, or Equal(buffer,
 *           c) of a float initializer that only Slices and Equals read (so
 *           autodiff cannot train it) through prefix Slices, its bytes in
 *           memory or in a data file that is there (without the file, as
 *           --report may run, the band stays a tensor and such a plan can
 *           be larger than a compile's).
 *
 * Grouped-query and multi-query attention (Llama 3, Mistral, Qwen2, Falcon:
 * fewer key/value heads than query heads) is fused without the repeated
 * K/V: where kt or v is Hugging Face's repeat_kv (unrepeat: Unsqueeze or
 * Reshape, Expand, Reshape; opset 23's Attention expands its kv_num_heads
 * so too) the node reads the un-repeated k, and where kt and v broadcast
 * over the heads (Falcon's [B, 1, T, D] against [B, H, T, D] in the
 * MatMuls) it reads them as they are: attr kvrep, query problem b reading
 * K/V problem b / kvrep (kv_layout).  The repeat's nodes are dropped when
 * nothing else reads them, so neither the [B, H, T, D] copies nor their
 * gradients exist; the backward sums each K/V problem's gradient over its
 * kvrep query problems (kernels/c/attn_impl.h, kernels/cuda/attn.cu).
 *
 * The heads where the projections put them: where q, k
 * (as rows) and v are Transpose(x, perm (0, 2, 1, 3)) of [B, t, H, d]
 * values (GPT-2's and BERT's Reshape of a projection's output: views) and
 * y is read by one such Transpose alone (back to [B, t, H, dv], then
 * Reshaped for the output projection), each Transpose read by the chain
 * alone (through Identities: GPT-2's one-input Concat of its past keys,
 * which fold makes one), the node reads x and writes the Transpose's
 * output, attr heads H
 * (heads_views): the kernels index problem b as head b % H of row b / H with
 * rows H d apart (kernels.h k_attention_at; the same GEMMs on other leading
 * dimensions, so the same bits), and autodiff's FusedAttentionGrad reads dy
 * and writes dq, dk, dv in that layout too: none of the 4 forward and 4
 * backward head copies is made, nor saved (both targets: kernels/cuda/attn.cu
 * indexes the rows alike).
 *
 * Conditions: float32 or float64 throughout; q's leading dims L (the
 * problems); kt's and v's (both alike) L, or L up to one dim that theirs
 * divides (a repeat_kv's heads, or 1), then 1s (no other broadcasting: the
 * MatMul's output has L); a bias whose leading
 * dims, right-aligned against L, are 1s, then L's own, then 1s (so problem
 * b reads bias (b / brep) % nbias: a causal mask [1, 1, t, s], a padding
 * mask [B, 1, t, s] or a per-head bias); MatMuls without transA (the second
 * one without transB); no softcap (a Tanh between the scores and the bias)
 * and no other reader of the scores (ONNX's qk_matmul_output).  Anything
 * else stays as it was.
 *
 * Under --precision bf16 / fp16 the chain is fused alike (the model is
 * float32 here); precision.c then gives FusedAttention and its gradient
 * 16-bit q, kt and v, as it gives MatMul 16-bit operands, and the kernels
 * (k_attention_bf16, k_attention_f16) compute as flash attention does:
 * every GEMM on 16-bit operands (P, dY and dS rounded to 16 bits before
 * their products), the scores, softmax statistics, y, lse and gradients in
 * float32: the points where the unfused chain's MatMuls round (with dS
 * rounded before the scale, the same where the scale is a power of 2, as
 * 1/sqrt(d) is for d 64 or 16).  The scratch is then sized for those kernels
 * (k_attention_workspace_16).
 *
 * Attention dropout: a Dropout between the probabilities and P V (mask
 * unread) is dropped, and a training one's ratio and Philox stream become
 * attrs dropout and stream: the kernels draw each probability's keep flag
 * as that Dropout would have (kernels/c/philox.h, from the same seed,
 * stream, step and flat index (b t + i) s + j of its [L.., t, s] input),
 * so the fused step computes what the unfused one did (to rounding) with
 * no mask stored, the backward drawing the flags again.  On --target cuda
 * such a chain stays unfused (attn.cu has no dropout yet).
 *
 * Not applied (the chain stays unfused): with --no-fuse, and in --eval
 * builds (whose pipeline has no attention pass).
 */
#include "ir.h"
#include "kernels.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* the single node reading v, or -1 (read twice, a graph output, or not at all) */
static int only_reader(const Graph *g, const int *reader, int v)
{
    if (g->val[v].nuses != 1)
        return -1;
    for (int i = 0; i < g->noutput; i++)
        if (g->output[i] == v)
            return -1;
    return reader[v];
}

static int is_neg_inf(const Graph *g, int v)
{
    const Value *c = &g->val[v];
    return c->role == R_CONST && shape_numel(&c->shape) == 1 && ir_data(g, v) && tensor_const_f(c, 0) == -INFINITY;
}

static int64_t numel_of(const Shape *s, int from, int to)
{
    int64_t n = 1;
    for (int d = from; d < to; d++)
        n *= s->dim[d];
    return n;
}

/* bias b over the problems' leading dims L (rank lr): its (nbias, brep), or 0 when it does not fit */
static int bias_layout(const Shape *bs, const Shape *ys, int lr, int64_t t, int64_t s, int64_t *nbias, int64_t *brep)
{
    if (bs->rank < 2 || bs->rank - 2 > lr || bs->dim[bs->rank - 2] != t || bs->dim[bs->rank - 1] != s)
        return 0;
    int64_t lead[MAX_RANK];
    for (int d = 0; d < lr; d++) /* right-aligned, 1 where the bias has no dim */
        lead[d] = d < lr - (bs->rank - 2) ? 1 : bs->dim[d - (lr - (bs->rank - 2))];
    int a = 0, e = lr;
    while (a < lr && lead[a] == 1)
        a++;
    while (e > a && lead[e - 1] == 1)
        e--;
    for (int d = a; d < e; d++)
        if (lead[d] != ys->dim[d])
            return 0;
    *nbias = numel_of(ys, a, e);
    *brep = numel_of(ys, e, lr);
    return 1;
}

enum { REP_NODES = 8 }; /* a repeat_kv's Reshape, Expand, Unsqueeze (or Reshape) and Identities between them */

typedef struct {
    int softmax, scale_node, mask_node, first, last; /* node ids (-1: absent) */
    int guard[4];                                    /* Where (pre, post), ReduceMax, Equal of the guard */
    int qscale, kscale;                              /* Muls scaling q or kt, folded into scale */
    int add2, bias2;                                 /* (s + bias2) + bias: the inner Add, its bias */
    Shape bshape;                                    /* the bias's shape (bias + bias2 broadcast) */
    int q, kt, v, bias, mask, mask_true_masks;       /* value ids; mask: Where's condition */
    int krow;                                        /* the first MatMul's transB: kt is k [L.., s, d] */
    int64_t ws;                                      /* k_attention_workspace elements */
    int cast[4], ncast;                              /* Casts to the same dtype after the Softmax */
    double scale;
    int64_t nbias, brep;
    int64_t kvrep;     /* query problem b reads K/V problem b / kvrep */
    int rep[2][REP_NODES]; /* kt's and v's repeat_kv nodes, outermost first (-1 after the last) */
    int view[3];       /* kt as k's last two axes exchanged through 3-D views (swapped_view), outermost first */
    int zero_rows;     /* the guard matched */
    int dropout;       /* the Dropout between the probabilities and P V (-1: none) */
    double drop;       /* its ratio when it trains (0: the identity) */
} Chain;

static int is_zero(const Graph *g, int v)
{
    const Value *c = &g->val[v];
    return c->role == R_CONST && shape_numel(&c->shape) == 1 && ir_data(g, v) && tensor_const_f(c, 0) == 0;
}

/* is node w Where(e, 0, x) for x?  Then its e */
static int guard_where(const Graph *g, int w, int x)
{
    const Node *n = w >= 0 ? &g->node[w] : NULL;
    return n && n->op == OP_Where && n->in[2] == x && is_zero(g, n->in[1]) ? n->in[0] : -1;
}

/* torch's decomposition of scaled_dot_product_attention (its dynamo export): p = Where(IsNaN(p), 0, p), a row
 * that attends nothing giving zeros (fold has made IsNaN Not(Equal(p, p))).  p read by those alone: the Where
 * (the last of its readers), with the Equal and Not in c->guard[2..3]; else -1 */
static int nan_guard(const Graph *g, const int *reader, int p, Chain *c)
{
    const int w = reader[p];
    if (g->val[p].nuses != 3 || guard_where(g, w, p) < 0)
        return -1;
    const int e = g->node[w].in[0], no = g->val[e].producer;
    if (no < 0 || g->node[no].op != OP_Not || only_reader(g, reader, e) != w)
        return -1;
    const int q = g->node[no].in[0], eq = g->val[q].producer;
    if (eq < 0 || g->node[eq].op != OP_Equal || g->node[eq].in[0] != p || g->node[eq].in[1] != p ||
        only_reader(g, reader, q) != no)
        return -1;
    c->guard[2] = eq, c->guard[3] = no;
    return w;
}

/* is e Equal(ReduceMax(bias, the last axis, keepdims 1), -inf), read by the guard's two Wheres only?  Then
 * the ReduceMax and Equal nodes in c->guard[2..3] */
static int guard_of(const Graph *g, const int *reader, int e, int bias, Chain *c)
{
    const int eq = g->val[e].producer;
    if (eq < 0 || g->val[e].nuses != 2 || g->node[eq].op != OP_Equal)
        return 0;
    const Node *en = &g->node[eq];
    const int side = is_neg_inf(g, en->in[1]) ? 0 : is_neg_inf(g, en->in[0]) ? 1 : -1;
    if (side < 0 || g->val[en->in[side]].producer < 0 || only_reader(g, reader, en->in[side]) != eq)
        return 0;
    const int rm = g->val[en->in[side]].producer;
    const Node *rn = &g->node[rm];
    const int rank = g->val[bias].shape.rank;
    int na = 0;
    const int64_t *ax = ir_attr_ints(rn, "axes", &na);
    if (rn->op != OP_ReduceMax || rn->in[0] != bias || rn->nin > 1 || !ir_attr_i(rn, "keepdims", 1) || na != 1 ||
        (ax[0] != -1 && ax[0] != rank - 1))
        return 0;
    c->guard[2] = rm, c->guard[3] = eq;
    return 1;
}

/* A mask or bias whose values the compiler knows: element (i, j) is x's element i cols + j (x may be larger
 * than the [t, s] it stands for: the top-left corner that prefix Slices took); masked where b (a bool) is
 * true_masks's truth; where x (a float) is -inf, kept where 0 (a bias); or with eq set where (x == z) is
 * true_masks's truth (nanoGPT's `bias[:, :, :T, :T] == 0` of a float buffer). */
typedef struct {
    const Value *x;
    const uint8_t *b;
    int64_t cols;
    int true_masks, eq;
    double z;
    double lowest; /* a float bias's finite "masked": its dtype's lowest value (Hugging Face's finfo.min) */
} Known;

/* is element (i, j) masked (1), kept (0), or neither (-1: a bias of another value)? */
static int masked_at(const Known *m, int64_t i, int64_t j)
{
    const int64_t k = i * m->cols + j;
    if (m->b)
        return m->b[k] ? m->true_masks : !m->true_masks;
    const double f = tensor_const_f(m->x, k);
    if (m->eq)
        return (f == m->z) ? m->true_masks : !m->true_masks;
    return f == 0 ? 0 : f == -INFINITY || f == m->lowest ? 1 : -1;
}

/* can the compiler read v's values: a constant whose bytes are in memory or in a data file that is there
 * (without it, as --report may run, the pattern stays a tensor: such a plan can be larger than a compile's) */
static int readable(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    const int i = x->init_index;
    return x->role == R_CONST && (x->data || i < 0 || i >= g->ninit || !g->ext[i].loc || !g->ext[i].missing) &&
           ir_data(g, v);
}

/* v through Slices that keep every axis's start (0, step 1) and only shorten the last two: the value sliced
 * (whose leading dims must be 1s, like v's) */
static int prefix_source(const Graph *g, int v)
{
    for (int p; (p = g->val[v].producer) >= 0 && g->node[p].op == OP_Slice;) {
        const Node *n = &g->node[p];
        int ns = 0, na = 0, nt = 0;
        const int64_t *st = ir_attr_ints(n, "starts", &ns), *ax = ir_attr_ints(n, "axes", &na),
                      *sp = ir_attr_ints(n, "steps", &nt);
        const int r = g->val[n->in[0]].shape.rank;
        for (int k = 0; k < ns; k++) {
            const int64_t a = k < na ? (ax[k] < 0 ? ax[k] + r : ax[k]) : k;
            if (st[k] != 0 || (k < nt && sp[k] != 1) || a < r - 2)
                return -1;
        }
        v = n->in[0];
    }
    const Shape *s = &g->val[v].shape;
    for (int d = 0; d + 2 < s->rank; d++)
        if (s->dim[d] != 1)
            return -1;
    return s->rank >= 2 ? v : -1;
}

/* m for value v: a bool constant; a float constant that folding made (not an initializer, which autodiff
 * could train); or Equal of a scalar constant and a float initializer (through prefix Slices) that only
 * Slices and Equals read, so that nothing trains it.  0 when its values are not known. */
static int known_of(const Graph *g, int v, int true_masks, Known *m)
{
    memset(m, 0, sizeof *m);
    m->true_masks = true_masks;
    const Value *x = &g->val[v];
    m->cols = x->shape.dim[x->shape.rank - 1];
    if (x->dtype == DT_BOOL && readable(g, v)) {
        m->x = x, m->b = ir_data(g, v);
        return 1;
    }
    if ((x->dtype == DT_F32 || x->dtype == DT_F64) && x->init_index < 0 && readable(g, v)) {
        m->x = x, m->lowest = x->dtype == DT_F32 ? -FLT_MAX : -DBL_MAX;
        return 1;
    }
    int p = x->producer;
    while (p >= 0 && g->node[p].op == OP_Cast && g->val[g->node[p].in[0]].dtype == DT_BOOL)
        p = g->val[g->node[p].in[0]].producer; /* a bool cast to bool */
    if (x->dtype != DT_BOOL || p < 0 || g->node[p].op != OP_Equal)
        return 0;
    const Node *e = &g->node[p];
    for (int side = 0; side < 2; side++) {
        const int f = prefix_source(g, e->in[side]), c = e->in[!side];
        if (f < 0 || !shape_eq(&g->val[e->in[side]].shape, &x->shape))
            continue;
        const Value *fv = &g->val[f], *cv = &g->val[c];
        if ((fv->dtype != DT_F32 && fv->dtype != DT_F64) || cv->role != R_CONST || shape_numel(&cv->shape) != 1 ||
            !readable(g, c) || !readable(g, f))
            continue;
        int only_compared = 1;
        for (int i = 0; i < g->nnode && only_compared; i++)
            for (int j = 0; j < g->node[i].nin; j++)
                if (g->node[i].in[j] == f && g->node[i].op != OP_Equal && g->node[i].op != OP_Slice)
                    only_compared = 0;
        if (!only_compared)
            continue;
        m->x = fv, m->eq = 1, m->z = tensor_const_f(cv, 0), m->cols = fv->shape.dim[fv->shape.rank - 1];
        return 1;
    }
    return 0;
}

/* Is mask or bias v, over [.., t, s], the causal band in every [t, s] of it (Hugging Face's mask is one a
 * batch row): row i sees the keys j with j <= i + s - t (the last query sees every key) and, with a sliding
 * window of w keys, j > i + s - t - w?  Then 1 and *w (0: no window).  A float bias masks by -inf or by its
 * dtype's lowest value (Hugging Face's finfo.min): in a row that sees a key either gives a masked key the
 * probability 0 exactly, as the kernel's band does. */
static int band_of(const Graph *g, int v, int true_masks, int64_t t, int64_t s, int64_t *w)
{
    const Value *x = &g->val[v];
    const int r = x->shape.rank;
    Known m;
    if (r < 2 || x->shape.dim[r - 2] != t || x->shape.dim[r - 1] != s || t < 1 || s < 1 ||
        !known_of(g, v, true_masks, &m))
        return 0;
    const int64_t n = shape_numel(&x->shape) / (t * s); /* the [t, s] in it */
    if (m.eq && n != 1)
        return 0;
    if (t > s) /* the first rows see no key: masked by -inf they give NaN (zero_rows: 0), by a finite lowest value
                * the mean of v (the kernel's band computes neither): only -inf counts then */
        m.lowest = -INFINITY;
    int64_t win = 0; /* the last row's kept keys: s, or the window */
    for (int64_t j = 0; j < s; j++)
        win += masked_at(&m, t - 1, j) == 0;
    if (win == 0)
        return 0;
    for (int64_t i = 0; i < n * t; i++)
        for (int64_t j = 0; j < s; j++) {
            const int64_t hi = i % t + s - t;
            if (masked_at(&m, i, j) != (j > hi || j <= hi - win))
                return 0;
        }
    *w = win == s ? 0 : win;
    return *w < K_ATTN_WINDOW_MAX; /* what the kernels' flags carry */
}

/* v's producer is dropped when its one reader is (and so on up the chain: the Slice, Equal and Cast that made a
 * mask the kernel now computes) */
static void drop_unread(const Graph *g, const int *reader, char *drop, int v)
{
    const int p = v >= 0 ? g->val[v].producer : -1, r = v >= 0 ? only_reader(g, reader, v) : -1;
    if (p < 0 || r < 0 || !drop[r] || drop[p] || g->node[p].nout != 1)
        return;
    drop[p] = 1;
    for (int j = 0; j < g->node[p].nin; j++)
        drop_unread(g, reader, drop, g->node[p].in[j]);
}

/* a and b broadcast (numpy) into *y, or 0 */
static int broadcast(const Shape *a, const Shape *b, Shape *y)
{
    y->rank = a->rank > b->rank ? a->rank : b->rank;
    for (int d = 0; d < y->rank; d++) {
        int64_t x = d < y->rank - a->rank ? 1 : a->dim[d - (y->rank - a->rank)];
        int64_t z = d < y->rank - b->rank ? 1 : b->dim[d - (y->rank - b->rank)];
        if (x != z && x != 1 && z != 1)
            return 0;
        y->dim[d] = x == 1 ? z : x;
    }
    return 1;
}

/* may v be the scores: a MatMul's product, or one scaled by a constant? */
static int is_product(const Graph *g, int v)
{
    int p = g->val[v].producer, x;
    double f;
    if (p >= 0 && tensor_scaling(g, &g->node[p], &x, &f))
        p = g->val[x].producer;
    return p >= 0 && g->node[p].op == OP_MatMul;
}

/* is node p x * c with c a scalar constant, read only by node r?  Then x, and c folded into *scale */
static int scaled_operand(const Graph *g, const int *reader, int v, int r, double *scale)
{
    const int p = g->val[v].producer;
    int x;
    double f;
    if (p < 0 || only_reader(g, reader, v) != r || !tensor_scaling(g, &g->node[p], &x, &f) ||
        !shape_eq(&g->val[x].shape, &g->val[v].shape) || g->val[x].dtype != g->val[v].dtype)
        return -1;
    *scale *= f;
    return x;
}

/* v's producer after any Identities (a dynamo export's clone), when it is op or alt: its id, appended to rn
 * (holding *n of REP_NODES) after the Identities'; else -1 */
static int producer_through(const Graph *g, int v, Op op, Op alt, int *rn, int *n)
{
    int p;
    while ((p = g->val[v].producer) >= 0 && g->node[p].op == OP_Identity && *n < REP_NODES - 1)
        rn[(*n)++] = p, v = g->node[p].in[0];
    if (p < 0 || (g->node[p].op != op && g->node[p].op != alt) || *n >= REP_NODES - 1)
        return -1;
    rn[(*n)++] = p;
    return p;
}

/* Is x k with its last two axes exchanged through 3-D views, as torch's decomposition of
 * scaled_dot_product_attention writes k^T (its dynamo export):
 *   x = Reshape(Transpose(Reshape(k, [P, s, d]), perm (0, 2, 1)), [L.., d, s])    k [L.., s, d], P = L's product
 * each node read by the next alone?  Then k, the nodes in view (x's Reshape first); else -1. */
static int swapped_view(const Graph *g, const int *reader, int x, int view[3])
{
    const int p0 = g->val[x].producer, t = p0 >= 0 ? g->node[p0].in[0] : -1, p1 = t >= 0 ? g->val[t].producer : -1;
    const int y = p1 >= 0 ? g->node[p1].in[0] : -1, p2 = y >= 0 ? g->val[y].producer : -1;
    if (p2 < 0 || g->node[p0].op != OP_Reshape || g->node[p1].op != OP_Transpose || g->node[p2].op != OP_Reshape ||
        only_reader(g, reader, t) != p0 || only_reader(g, reader, y) != p1)
        return -1;
    int na = 0;
    const int64_t *perm = ir_attr_ints(&g->node[p1], "perm", &na);
    const int k = g->node[p2].in[0];
    const Shape *xs = &g->val[x].shape, *ys = &g->val[y].shape, *ks = &g->val[k].shape;
    const int r = xs->rank;
    if (na != 3 || perm[0] != 0 || perm[1] != 2 || perm[2] != 1 || ys->rank != 3 || ks->rank != r || r < 3 ||
        g->val[k].dtype != g->val[x].dtype)
        return -1;
    const int64_t s = ks->dim[r - 2], d = ks->dim[r - 1];
    if (ys->dim[0] != numel_of(ks, 0, r - 2) || ys->dim[1] != s || ys->dim[2] != d || xs->dim[r - 2] != d ||
        xs->dim[r - 1] != s)
        return -1;
    for (int a = 0; a < r - 2; a++)
        if (xs->dim[a] != ks->dim[a])
            return -1;
    view[0] = p0, view[1] = p1, view[2] = p2;
    return k;
}

/* Is x (rank r) Hugging Face's repeat_kv of a k:
 *   u = Unsqueeze(k, axes [a + 1]) or Reshape(k)   [L.., h, 1, X, Y]   (k [L.., h, X, Y])
 *   e = Expand(u)                                  [L.., h, rep, X, Y]
 *   x = Reshape(e)                                 [L.., h rep, X, Y]
 * (Identities between them: a dynamo export's clone; opset 23's Attention expands its kv_num_heads so too:
 * passes/expand.c attn_repeat), so that x's element [.., i, ..] on axis a is k's [.., i / rep, ..]?  Then k, and
 * its nodes in rn (outermost first, then -1); else x. */
static int unrepeat(const Graph *g, int x, int r, int rn[REP_NODES])
{
    int n = 0, nodes[REP_NODES];
    const int p1 = producer_through(g, x, OP_Reshape, OP_Reshape, nodes, &n);
    const int p2 = p1 >= 0 ? producer_through(g, g->node[p1].in[0], OP_Expand, OP_Expand, nodes, &n) : -1;
    const int e = p2 >= 0 ? g->node[p2].out[0] : -1, u = p2 >= 0 ? g->node[p2].in[0] : -1;
    const int p3 = u >= 0 ? producer_through(g, u, OP_Unsqueeze, OP_Reshape, nodes, &n) : -1;
    if (p3 < 0)
        return x;
    const int k = g->node[p3].in[0];
    const Shape *xs = &g->val[x].shape, *es = &g->val[e].shape, *us = &g->val[u].shape, *ks = &g->val[k].shape;
    if (es->rank != r + 1 || us->rank != r + 1 || ks->rank != r || g->val[k].dtype != g->val[x].dtype)
        return x;
    for (int a = 0; a + 2 < r; a++) { /* the axis repeated: a of x and k, a, a + 1 of e and u */
        int fits = us->dim[a + 1] == 1 && es->dim[a] * es->dim[a + 1] == xs->dim[a];
        for (int d = 0; d < r && fits; d++) {
            const int de = d + (d > a); /* e's and u's axis of x's d */
            fits = ks->dim[d] == es->dim[de] && us->dim[de] == es->dim[de] && (d == a || es->dim[de] == xs->dim[d]);
        }
        if (fits) {
            memcpy(rn, nodes, sizeof(int) * (size_t)n);
            return k;
        }
    }
    return x;
}

/* kvs's leading dims (the K/V problems) against L, q's (rank lr): equal up to an axis a where L[a] is a multiple
 * of kvs's (a broadcast 1, or repeat_kv's heads), 1s after it, so that query problem b reads K/V problem b /
 * kvrep.  Its kvrep (1: the same problems), or 0 when kvs does not fit so. */
static int64_t kv_layout(const Shape *kvs, const Shape *qs, int lr)
{
    int a = 0;
    while (a < lr && kvs->dim[a] == qs->dim[a])
        a++;
    if (a == lr)
        return 1;
    if (kvs->dim[a] < 1 || qs->dim[a] % kvs->dim[a])
        return 0;
    for (int d = a + 1; d < lr; d++)
        if (kvs->dim[d] != 1)
            return 0;
    return qs->dim[a] / kvs->dim[a] * numel_of(qs, a + 1, lr);
}

/* kvrep of keys kt and values v (rank of q, one kv_layout) against q's shape qs, or 0 */
static int64_t kv_of(const Graph *g, int kt, int v, const Shape *qs)
{
    const Shape *ks = &g->val[kt].shape, *vs = &g->val[v].shape;
    if (qs->rank < 3 || ks->rank != qs->rank || vs->rank != qs->rank)
        return 0;
    const int64_t kvrep = kv_layout(ks, qs, qs->rank - 2);
    return kv_layout(vs, qs, qs->rank - 2) == kvrep ? kvrep : 0;
}

/* is node p Transpose(x, perm (0, 2, 1, 3)): [B, t, H, d] and [B, H, t, d] either way? */
static int heads_perm(const Graph *g, int p)
{
    int na = 0;
    const int64_t *perm = p >= 0 && g->node[p].op == OP_Transpose ? ir_attr_ints(&g->node[p], "perm", &na) : NULL;
    return perm && na == 4 && perm[0] == 0 && perm[1] == 2 && perm[2] == 1 && perm[3] == 3;
}

/* is v such a Transpose's output read by node r alone, through up to 2 Identities (GPT-2's one-input Concat of
 * its past keys: fold) each read by the next alone?  Then the Transpose's node id and the Identities' in id (-1
 * after the last); else -1 */
static int heads_transpose(const Graph *g, const int *reader, int v, int r, int id[2])
{
    id[0] = id[1] = -1;
    for (int k = 0; r >= 0 && only_reader(g, reader, v) == r; k++) {
        const int p = g->val[v].producer;
        if (heads_perm(g, p))
            return p;
        if (k == 2 || p < 0 || g->node[p].op != OP_Identity)
            return -1;
        id[k] = r = p, v = g->node[p].in[0];
    }
    return -1;
}

/* The chain's q, k (krow), v and y in the projections' layout: q = Transpose(xq, perm (0, 2, 1, 3)), likewise k
 * and v (through Identities: heads_transpose), and y read by one such Transpose alone, each Transpose read by the
 * chain alone (a repeat_kv's keys stay as they are), k and v of q's batch with heads dividing q's.  Then 1, the
 * four Transposes in tr (q, k, v, y) and the Identities in id (q's, k's, v's):
 * the node reads xq, xk, xv and writes y's Transpose's output, attr heads (kernels.h k_attention_at), so that
 * none of the four copies (nor, in the backward, their gradients') is made; else 0. */
static int heads_views(const Graph *g, const int *reader, const Chain *c, int tr[4], int id[3][2])
{
    const Shape *qs = &g->val[c->q].shape, *ks = &g->val[c->kt].shape;
    if (qs->rank != 4 || !c->krow || c->rep[0][0] >= 0 || c->rep[1][0] >= 0 || ks->dim[0] != qs->dim[0] ||
        ks->dim[1] * c->kvrep != qs->dim[1])
        return 0;
    const int kr = c->view[2] >= 0 ? c->view[2] : c->kscale >= 0 ? c->kscale : c->first;
    tr[0] = heads_transpose(g, reader, c->q, c->qscale >= 0 ? c->qscale : c->first, id[0]);
    tr[1] = heads_transpose(g, reader, c->kt, kr, id[1]);
    tr[2] = heads_transpose(g, reader, c->v, c->last, id[2]);
    const int yr = only_reader(g, reader, g->node[c->last].out[0]);
    tr[3] = heads_perm(g, yr) ? yr : -1;
    return tr[0] >= 0 && tr[1] >= 0 && tr[2] >= 0 && tr[3] >= 0;
}

/* is n (a Dropout of x) one the kernel can draw: its mask unread, on the cpu target (kernels/cuda/attn.cu has no
 * dropout yet)?  Then its ratio in *drop when it trains (0: it is the identity) */
static int dropout_of(const Graph *g, const Node *n, int x, double *drop)
{
    if (n->in[0] != x || (n->nout > 1 && n->out[1] >= 0 && ir_is_read(g, n->out[1])) || !strcmp(g->opt->target, "cuda"))
        return 0;
    *drop = nn_dropout_training(g, n) ? nn_dropout_ratio(g, n) : 0;
    return 1;
}

/* the chain around Softmax node i, or 0 */
static int match(const Graph *g, const int *reader, int i, Chain *c)
{
    const Node *sm = &g->node[i];
    const Value *sv = &g->val[sm->in[0]];
    memset(c, -1, sizeof *c);
    c->scale = 1;
    if (sm->op != OP_Softmax || sv->shape.rank < 3 || (sv->dtype != DT_F32 && sv->dtype != DT_F64))
        return 0;
    int64_t axis = ir_attr_i(sm, "axis", -1);
    if (axis != -1 && axis != sv->shape.rank - 1)
        return 0;
    c->softmax = i;
    int pv = sm->out[0], last = only_reader(g, reader, pv);
    c->ncast = 0;
    while (last >= 0 && g->node[last].op == OP_Cast && c->ncast < 4 &&
           g->val[g->node[last].out[0]].dtype == sv->dtype) {
        c->cast[c->ncast++] = last; /* torch's softmax(x, dtype=float32) on a float32 x: no change */
        pv = g->node[last].out[0];
        last = only_reader(g, reader, pv);
    }
    int e = guard_where(g, last, pv), nan = last < 0 ? nan_guard(g, reader, pv, c) : -1; /* the guard after it */
    if (e >= 0 || nan >= 0) {
        c->guard[1] = e >= 0 ? last : nan, pv = g->node[c->guard[1]].out[0];
        last = only_reader(g, reader, pv);
    }
    c->drop = 0;
    if (last >= 0 && g->node[last].op == OP_Dropout && !dropout_of(g, &g->node[last], pv, &c->drop))
        return 0;
    if (last >= 0 && g->node[last].op == OP_Dropout) /* the attention dropout (GPT-2's attn_pdrop, BERT's, T5's) */
        c->dropout = last, pv = g->node[last].out[0], last = only_reader(g, reader, pv);
    if (last < 0 || g->node[last].op != OP_MatMul || g->node[last].in[0] != pv ||
        ir_attr_i(&g->node[last], "transA", 0) || ir_attr_i(&g->node[last], "transB", 0))
        return 0;
    c->last = last;
    c->v = g->node[last].in[1];
    int x = sm->in[0], p = sv->producer;
    if (p < 0 || only_reader(g, reader, x) != i)
        return 0;
    if (e >= 0) { /* and before it */
        if (g->node[p].op != OP_Where || g->node[p].in[0] != e || !is_zero(g, g->node[p].in[1]))
            return 0;
        c->guard[0] = p, x = g->node[p].in[2];
        if ((p = g->val[x].producer) < 0 || only_reader(g, reader, x) != c->guard[0])
            return 0;
    }
    const Node *pn = &g->node[p];
    if (pn->op == OP_Where && (is_neg_inf(g, pn->in[1]) || is_neg_inf(g, pn->in[2]))) {
        c->mask_node = p, c->mask = pn->in[0], c->mask_true_masks = is_neg_inf(g, pn->in[1]);
        x = pn->in[c->mask_true_masks ? 2 : 1];
    } else if (pn->op == OP_Add) { /* the scores' side: a product, or one scaled */
        /* in this order: s + bias (bias no product), (s + bias2) + bias, s + bias (bias a product too) */
        for (int side = 0; side < 2 && c->mask_node < 0; side++) {
            int o = pn->in[!side];
            if (g->val[o].dtype == sv->dtype && is_product(g, pn->in[side]) && !is_product(g, o))
                c->mask_node = p, c->bias = o, x = pn->in[side];
        }
        for (int side = 0; side < 2 && c->mask_node < 0; side++) { /* T5's positions + mask */
            const int in = pn->in[side], a2 = g->val[in].producer;
            if (a2 < 0 || g->node[a2].op != OP_Add || only_reader(g, reader, in) != p ||
                g->val[pn->in[!side]].dtype != sv->dtype)
                continue;
            for (int k = 0; k < 4 && c->mask_node < 0; k++) { /* k / 2: a product bias too, k % 2: the side */
                const int o = g->node[a2].in[!(k % 2)], sc = g->node[a2].in[k % 2];
                if (g->val[o].dtype == sv->dtype && is_product(g, sc) && (k / 2 || !is_product(g, o)))
                    c->mask_node = p, c->add2 = a2, c->bias = pn->in[!side], c->bias2 = o, x = sc;
            }
        }
        for (int side = 0; side < 2 && c->mask_node < 0; side++) {
            int o = pn->in[!side];
            if (g->val[o].dtype == sv->dtype && is_product(g, pn->in[side]))
                c->mask_node = p, c->bias = o, x = pn->in[side];
        }
        if (c->mask_node < 0)
            return 0;
    }
    if (c->add2 >= 0 && (e >= 0 || !broadcast(&g->val[c->bias].shape, &g->val[c->bias2].shape, &c->bshape)))
        return 0;
    if (c->bias >= 0 && c->add2 < 0)
        c->bshape = g->val[c->bias].shape;
    if (e >= 0 && (c->bias < 0 || !guard_of(g, reader, e, c->bias, c)))
        return 0;
    c->zero_rows = e >= 0 || nan >= 0;
    if (c->mask_node >= 0 && only_reader(g, reader, x) != (c->add2 >= 0 ? c->add2 : c->mask_node))
        return 0;
    p = g->val[x].producer;
    if (p < 0)
        return 0;
    int y;
    if (tensor_scaling(g, &g->node[p], &y, &c->scale)) {
        c->scale_node = p;
        if (only_reader(g, reader, y) != p || (p = g->val[y].producer) < 0)
            return 0;
        x = y;
    }
    const Node *mm = &g->node[p];
    if (mm->op != OP_MatMul || ir_attr_i(mm, "transA", 0) || mm->out[0] != x)
        return 0;
    c->first = p, c->q = mm->in[0], c->kt = mm->in[1], c->krow = (int)ir_attr_i(mm, "transB", 0);
    int sq = scaled_operand(g, reader, c->q, p, &c->scale), sk = scaled_operand(g, reader, c->kt, p, &c->scale);
    if (sq >= 0)
        c->qscale = g->val[c->q].producer, c->q = sq;
    if (sk >= 0)
        c->kscale = g->val[c->kt].producer, c->kt = sk;
    int kv = c->krow ? -1 : swapped_view(g, reader, c->kt, c->view);
    if (kv >= 0 && only_reader(g, reader, c->kt) == (c->kscale >= 0 ? c->kscale : p))
        c->kt = kv, c->krow = 1; /* read as k with transB */
    else
        c->view[0] = c->view[1] = c->view[2] = -1;
    /* shapes: q [L, t, d], kt [Lkv, d, s] (krow: k [Lkv, s, d]), v [Lkv, s, dv], one dtype; Lkv L's problems or
     * fewer read in place (kv_layout: repeat_kv's heads, or MatMul's broadcast over a head dim of 1) */
    const Shape *qs = &g->val[c->q].shape;
    const int kt0 = c->kt, v0 = c->v;
    c->kt = unrepeat(g, c->kt, qs->rank, c->rep[0]);
    c->v = unrepeat(g, c->v, qs->rank, c->rep[1]);
    if ((c->kvrep = kv_of(g, c->kt, c->v, qs)) < 1) { /* as they are, then */
        c->kt = kt0, c->v = v0;
        memset(c->rep, -1, sizeof c->rep);
        if ((c->kvrep = kv_of(g, kt0, v0, qs)) < 1)
            return 0;
    }
    const Shape *vs = &g->val[c->v].shape;
    Shape kts = g->val[c->kt].shape, *ks = &kts;
    if (c->krow && kts.rank >= 2) { /* as the transposed keys it stands for */
        int64_t tmp = kts.dim[kts.rank - 1];
        kts.dim[kts.rank - 1] = kts.dim[kts.rank - 2], kts.dim[kts.rank - 2] = tmp;
    }
    const Shape *ys = &g->val[g->node[last].out[0]].shape;
    int r = qs->rank;
    if (r < 3 || ks->rank != r || vs->rank != r || ys->rank != r)
        return 0;
    for (int d = 0; d < r - 2; d++)
        if (ys->dim[d] != qs->dim[d])
            return 0;
    if (ks->dim[r - 2] != qs->dim[r - 1] || vs->dim[r - 2] != ks->dim[r - 1])
        return 0;
    DType dt = sv->dtype;
    if (g->val[c->q].dtype != dt || g->val[c->kt].dtype != dt || g->val[c->v].dtype != dt)
        return 0;
    const int64_t t = qs->dim[r - 2], s = ks->dim[r - 1], batch = numel_of(qs, 0, r - 2);
    if (c->dropout >= 0 && shape_numel(&g->val[g->node[c->dropout].in[0]].shape) != batch * t * s)
        return 0; /* the kernel's flat index (b t + i) s + j must be the Dropout's */
    /* --precision bf16 / fp16 will give a float32 chain 16-bit operands (precision.c), and its kernels a
     * workspace of their own; dims are at most MAX_NUMEL, so neither size overflows */
    c->ws = g->opt->precision != PREC_FP32 && dt == DT_F32
                ? k_attention_workspace_16(batch, t, s, qs->dim[r - 1], vs->dim[r - 1])
                : k_attention_workspace(batch, t, s);
    if (c->ws > MAX_NUMEL)
        return 0;
    c->nbias = c->brep = 1;
    if (c->mask >= 0)
        return g->val[c->mask].dtype == DT_BOOL &&
               bias_layout(&g->val[c->mask].shape, qs, r - 2, t, s, &c->nbias, &c->brep);
    if (c->bias >= 0)
        return bias_layout(&c->bshape, qs, r - 2, t, s, &c->nbias, &c->brep);
    return 1;
}

void pass_attention(Graph *g)
{
    const Options *o = g->opt;
    if (o->no_fuse)
        return;
    const int cuda = !strcmp(o->target, "cuda");
    ir_link(g);
    int nn = g->nnode, nv = g->nval, *reader = ir_alloc(sizeof(int) * (size_t)g->nval);
    /* band_of's answer per (mask value, true_masks), when asked: layers reading one mask scan it once */
    signed char *seen = ir_alloc((size_t)nv * 2);
    int64_t *seen_w = ir_alloc(sizeof(int64_t) * (size_t)nv * 2);
    for (int i = 0; i < nn; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] >= 0)
                reader[g->node[i].in[j]] = i;
    char *drop = ir_alloc((size_t)nn);
    int *before = ir_alloc(sizeof(int) * (size_t)nn), *repl = ir_alloc(sizeof(int) * (size_t)nn), fused = 0;
    for (int i = 0; i < nn; i++)
        before[i] = repl[i] = -1;
    for (int i = 0; i < nn; i++) {
        Chain c;
        if (!match(g, reader, i, &c))
            continue;
        const char *name = ir_fmt("%s.attention", g->node[c.softmax].name);
        const int y = g->node[c.last].out[0];
        const DType dt = g->val[c.q].dtype;
        int r = g->val[c.q].shape.rank, bias = c.bias;
        const int64_t t = g->val[c.q].shape.dim[r - 1 - 1], s = g->val[c.v].shape.dim[r - 2];
        int64_t window = 0;
        const int mv = c.mask >= 0 ? c.mask : c.add2 < 0 ? c.bias : -1, tm = c.mask >= 0 ? c.mask_true_masks : 1;
        int band = 0;
        if (mv >= 0 && mv < nv) {
            const int k = mv * 2 + tm;
            if (!seen[k])
                seen[k] = band_of(g, mv, tm, t, s, &seen_w[k]) ? 1 : -1;
            band = seen[k] > 0, window = band ? seen_w[k] : 0;
        }
        if (band) { /* the kernel computes the pattern: no tensor */
            bias = -1, c.nbias = c.brep = 1;
        } else if (c.mask >= 0) { /* the mask as a bias of 0 and -inf */
            int ninf = ir_scalar(g, ir_fmt("%s.neg_inf", name), dt, -INFINITY);
            int zero = ir_scalar(g, ir_fmt("%s.zero", name), dt, 0);
            Shape bs = g->val[c.mask].shape;
            bias = ir_value(g, ir_fmt("%s.bias", name), dt, &bs, R_ACT);
            int in[3] = {c.mask, c.mask_true_masks ? ninf : zero, c.mask_true_masks ? zero : ninf};
            before[c.last] = ir_node(g, OP_Where, ir_fmt("%s.bias", name), 3, in, 1, &bias);
        } else if (c.add2 >= 0) { /* the two biases as one */
            bias = ir_value(g, ir_fmt("%s.bias", name), dt, &c.bshape, R_ACT);
            int in[2] = {c.bias2, c.bias};
            before[c.last] = ir_node(g, OP_Add, ir_fmt("%s.bias", name), 2, in, 1, &bias);
            drop[c.add2] = 1;
        }
        /* the cpu kernel's workspace (checked in match); the cuda kernels need none */
        Shape ls = g->val[c.q].shape, ws = {1, {cuda ? 0 : c.ws}};
        ls.rank = r - 1;
        int out[3] = {y, ir_value(g, ir_fmt("%s.lse", name), dt, &ls, R_ACT),
                      ir_value(g, ir_fmt("%s.scratch", name), dt, &ws, R_ACT)};
        int in[4] = {c.q, c.kt, c.v, bias}, tr[4], id[3][2];
        /* the heads read and written where the projections put them */
        const int heads = heads_views(g, reader, &c, tr, id);
        for (int j = 0; j < 4 && heads; j++) {
            drop[tr[j]] = 1;
            for (int k = 0; j < 3 && k < 2 && id[j][k] >= 0; k++)
                drop[id[j][k]] = 1;
            if (j < 3)
                in[j] = g->node[tr[j]].in[0];
            else
                out[0] = g->node[tr[j]].out[0];
        }
        int k = ir_node(g, OP_FusedAttention, name, bias >= 0 ? 4 : 3, in, 3, out);
        if (heads)
            ir_attr_add(g, k, "heads", A_INT)->i = g->val[c.q].shape.dim[1];
        ir_attr_add(g, k, "scale", A_FLOAT)->f = c.scale;
        ir_attr_add(g, k, "nbias", A_INT)->i = c.nbias;
        ir_attr_add(g, k, "brep", A_INT)->i = c.brep;
        ir_attr_add(g, k, "krow", A_INT)->i = c.krow;
        if (c.kvrep > 1)
            ir_attr_add(g, k, "kvrep", A_INT)->i = c.kvrep;
        if (c.zero_rows)
            ir_attr_add(g, k, "zero_rows", A_INT)->i = 1;
        if (band)
            ir_attr_add(g, k, "causal", A_INT)->i = 1;
        if (window)
            ir_attr_add(g, k, "window", A_INT)->i = window;
        if (c.drop > 0) { /* the Dropout's draw: its ratio and Philox stream (the kernels draw its flags) */
            ir_attr_add(g, k, "dropout", A_FLOAT)->f = c.drop;
            ir_attr_add(g, k, "stream", A_INT)->i = ir_attr_i(&g->node[c.dropout], "stream", 0);
        }
        if (c.dropout >= 0)
            drop[c.dropout] = 1;
        repl[c.last] = k;
        drop[c.first] = drop[c.softmax] = 1;
        if (c.scale_node >= 0)
            drop[c.scale_node] = 1;
        if (c.mask_node >= 0)
            drop[c.mask_node] = 1;
        for (int j = 0; j < c.ncast; j++)
            drop[c.cast[j]] = 1;
        for (int j = 0; j < 4; j++)
            if (c.guard[j] >= 0)
                drop[c.guard[j]] = 1;
        if (c.qscale >= 0)
            drop[c.qscale] = 1;
        if (c.kscale >= 0)
            drop[c.kscale] = 1;
        if (band)
            drop_unread(g, reader, drop, c.mask >= 0 ? c.mask : c.bias);
        drop[c.last] = 1; /* replaced: v's repeat below is unread then */
        for (int j = 0; j < 3; j++) /* kt's views (each read by the next alone: swapped_view) */
            if (c.view[j] >= 0)
                drop[c.view[j]] = 1;
        for (int a = 0; a < 2; a++) /* repeat_kv's nodes, when only the chain read them */
            for (int j = 0; j < REP_NODES && c.rep[a][j] >= 0; j++) {
                const int rd = only_reader(g, reader, g->node[c.rep[a][j]].out[0]);
                if (rd < 0 || !drop[rd])
                    break;
                drop[c.rep[a][j]] = 1;
            }
        fused++;
    }
    if (!fused)
        return;
    Node *keep = ir_alloc(sizeof(Node) * (size_t)(nn + fused));
    int n = 0;
    for (int i = 0; i < nn; i++) {
        if (before[i] >= 0)
            keep[n++] = g->node[before[i]];
        if (repl[i] >= 0)
            keep[n++] = g->node[repl[i]];
        else if (!drop[i])
            keep[n++] = g->node[i];
    }
    ir_set_nodes(g, keep, n);
    ir_link(g);
}
