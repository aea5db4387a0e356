/* einsum.c — fold's expansion of Einsum, written with ops fsdpc computes (and differentiates), as expand.c's
 * others, through its builders (fold.h). */
#include "fold.h"
#include "rules/nn.h"
#include "rules/tensor.h"

#include <string.h>

/* An operand of an Einsum: value v and the label of each of its n dims
 * (letters as themselves; the dims an ellipsis covers EIN_ELL + k, k counted
 * from the right, so ellipses broadcast right-aligned). */
typedef struct {
    int v, n, lab[MAX_RANK];
} ETerm;

#define EIN_ELL 200
#define EIN_NLAB (EIN_ELL + MAX_RANK)

static int ein_has(const ETerm *t, int l)
{
    for (int i = 0; i < t->n; i++)
        if (t->lab[i] == l)
            return 1;
    return 0;
}


/* t's dims put in the order of labels want (a permutation of t's) */
static void ein_transpose(Sweep *s, int id, ETerm *t, const int *want)
{
    int64_t perm[MAX_RANK];
    int same = 1;
    for (int i = 0; i < t->n; i++) {
        for (int j = 0; j < t->n; j++)
            if (t->lab[j] == want[i])
                perm[i] = j;
        same &= perm[i] == i;
    }
    if (same)
        return;
    t->v = expand_perm(s, id, t->v, perm, t->n, "transpose");
    memcpy(t->lab, want, sizeof(int) * (size_t)t->n);
}

/* t summed over its labels that keep does not hold */
static void ein_reduce(Sweep *s, int id, ETerm *t, const char *keep)
{
    int64_t ax[MAX_RANK];
    int na = 0, nl = 0;
    for (int i = 0; i < t->n; i++)
        if (keep[t->lab[i]])
            t->lab[nl++] = t->lab[i];
        else
            ax[na++] = i;
    if (!na)
        return;
    int c = expand_node(s, id, OP_ReduceSum, t->v, -1, "sum", -1);
    ir_attr_ints_add(s->g, c, "axes", ax, na);
    ir_attr_add(s->g, c, "keepdims", A_INT)->i = 0;
    fold_visit(s, c);
    t->v = s->g->node[c].out[0];
    t->n = nl;
}

/* t expanded so that each of its labels has dim ldim[label] (a 1 broadcast) */
static void ein_expand(Sweep *s, int id, ETerm *t, const int64_t *ldim)
{
    const Shape *xs = &s->g->val[t->v].shape;
    int64_t want[MAX_RANK];
    int same = 1;
    for (int i = 0; i < t->n; i++) {
        want[i] = ldim[t->lab[i]];
        same &= xs->dim[i] == want[i];
    }
    if (same)
        return;
    int c = expand_node(s, id, OP_Expand, t->v, -1, "expand", -1);
    ir_attr_ints_add(s->g, c, "shape", want, t->n);
    fold_visit(s, c);
    t->v = s->g->node[c].out[0];
}

/* a times b summed over their shared labels that keep does not hold: a Mul
 * (broadcasting) when there are none, else a MatMul of [batch, a's own,
 * summed] by [batch, summed, b's own]; the result's labels batch, a's own,
 * b's own */
static ETerm ein_pair(Sweep *s, int id, ETerm a, ETerm b, const char *keep, const int64_t *ldim)
{
    Graph *g = s->g;
    const Node *n = &g->node[id];
    int bat[MAX_RANK], ao[MAX_RANK], bo[MAX_RANK], con[MAX_RANK], nb = 0, na = 0, nbo = 0, nc = 0;
    for (int i = 0; i < a.n; i++)
        if (!ein_has(&b, a.lab[i]))
            ao[na++] = a.lab[i];
        else if (keep[a.lab[i]])
            bat[nb++] = a.lab[i];
        else
            con[nc++] = a.lab[i];
    for (int i = 0; i < b.n; i++)
        if (!ein_has(&a, b.lab[i]))
            bo[nbo++] = b.lab[i];
    if (nb + na + nbo > MAX_RANK)
        node_fatal(g, n, "a product of rank %d; fsdpc's tensors have rank up to %d", nb + na + nbo, MAX_RANK);
    ETerm r = {.n = nb + na + nbo};
    memcpy(r.lab, bat, sizeof(int) * (size_t)nb);
    memcpy(r.lab + nb, ao, sizeof(int) * (size_t)na);
    memcpy(r.lab + nb + na, bo, sizeof(int) * (size_t)nbo);
    int64_t da[MAX_RANK], db[MAX_RANK], dr[MAX_RANK];
    for (int i = 0; i < r.n; i++)
        dr[i] = ldim[r.lab[i]];
    if (!nc) { /* a as [batch, a's own, 1...], b as [batch, 1..., b's own] */
        int wa[MAX_RANK], wb[MAX_RANK];
        memcpy(wa, bat, sizeof(int) * (size_t)nb);
        memcpy(wa + nb, ao, sizeof(int) * (size_t)na);
        memcpy(wb, bat, sizeof(int) * (size_t)nb);
        memcpy(wb + nb, bo, sizeof(int) * (size_t)nbo);
        ein_transpose(s, id, &a, wa);
        ein_transpose(s, id, &b, wb);
        const Shape *sa = &g->val[a.v].shape, *sb = &g->val[b.v].shape;
        for (int i = 0; i < r.n; i++) {
            da[i] = i < nb + na ? sa->dim[i] : 1;
            db[i] = i < nb ? sb->dim[i] : i < nb + na ? 1 : sb->dim[i - na];
        }
        r.v = fold_expand(s, id, OP_Mul, expand_reshape(s, id, a.v, da, r.n), expand_reshape(s, id, b.v, db, r.n), "mul",
                     -1);
        return r;
    }
    ein_expand(s, id, &a, ldim);
    ein_expand(s, id, &b, ldim);
    int wa[MAX_RANK], wb[MAX_RANK];
    int64_t bt = 1, m = 1, k = 1, nn = 1;
    for (int i = 0; i < nb; i++)
        bt *= ldim[bat[i]];
    for (int i = 0; i < na; i++)
        m *= ldim[ao[i]];
    for (int i = 0; i < nc; i++)
        k *= ldim[con[i]];
    for (int i = 0; i < nbo; i++)
        nn *= ldim[bo[i]];
    memcpy(wa, bat, sizeof(int) * (size_t)nb);
    memcpy(wa + nb, ao, sizeof(int) * (size_t)na);
    memcpy(wa + nb + na, con, sizeof(int) * (size_t)nc);
    memcpy(wb, bat, sizeof(int) * (size_t)nb);
    memcpy(wb + nb, con, sizeof(int) * (size_t)nc);
    memcpy(wb + nb + nc, bo, sizeof(int) * (size_t)nbo);
    ein_transpose(s, id, &a, wa);
    ein_transpose(s, id, &b, wb);
    int64_t ma[3] = {bt, m, k}, mb[3] = {bt, k, nn};
    int lo = nb ? 0 : 1; /* no batch: plain matrices */
    int p = fold_expand(s, id, OP_MatMul, expand_reshape(s, id, a.v, ma + lo, 3 - lo),
                   expand_reshape(s, id, b.v, mb + lo, 3 - lo), "matmul", -1);
    r.v = expand_reshape(s, id, p, dr, r.n);
    return r;
}

/* Einsum of float operands as ReduceSum, Transpose, Reshape, Expand, Mul and
 * MatMul: each operand first sums the labels no other operand nor the
 * output has, then the operands are multiplied left to right (ein_pair),
 * summing each label once no later operand nor the output needs it, and
 * the result is transposed to the output's order.  Explicit (->) and
 * implicit output, ellipses broadcasting right-aligned, spaces ignored; a
 * label repeated within one operand (a diagonal) is refused. */
void expand_einsum(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const char *eq = ir_attr_s(&n, "equation", NULL);
    if (!eq)
        node_fatal(g, &n, "%s", "needs its equation attribute");
    size_t len = strlen(eq);
    if (len > 256)
        node_fatal(g, &n, "%s", "equation longer than 256 characters");
    char *e = ir_alloc(len + 1), *q = e;
    for (const char *c = eq; *c; c++)
        if (*c != ' ')
            *q++ = *c;
    *q = 0;
    ETerm t[MAX_RANK];
    int64_t ldim[EIN_NLAB];
    int count[EIN_NLAB] = {0}, ell_max = 0, nt = 0;
    for (int i = 0; i < EIN_NLAB; i++)
        ldim[i] = -1;
    const char *p = e;
    for (;;) {
        if (nt >= n.nin || n.in[nt] < 0)
            node_fatal(g, &n, "equation '%s' names more operands than the node's %d inputs", ir_q(eq), n.nin);
        if (nt >= MAX_RANK)
            node_fatal(g, &n, "equation '%s': fsdpc takes up to %d operands", ir_q(eq), MAX_RANK);
        const Value *x = &g->val[n.in[nt]];
        if (!dtype_is_float(x->dtype))
            node_fatal(g, &n, "input %d is %s: not supported (float32 or float64 only)", nt, dtype_name(x->dtype));
        int r = x->shape.rank, labs[MAX_RANK], nl = 0, ell = -1;
        while (*p && *p != ',' && *p != '-') {
            if (!strncmp(p, "...", 3) && ell < 0) {
                ell = nl;
                p += 3;
                continue;
            }
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) || nl >= MAX_RANK)
                node_fatal(g, &n, "equation '%s': operand %d's subscripts must be up to %d letters and one '...'",
                           ir_q(eq), nt, MAX_RANK);
            labs[nl++] = *p++;
        }
        int ne = ell >= 0 ? r - nl : 0;
        if (ne < 0 || (ell < 0 && nl != r))
            node_fatal(g, &n, "equation '%s': operand %d has rank %d, its subscripts name %d dims%s", ir_q(eq), nt, r,
                       nl, ell >= 0 ? " and an ellipsis" : "");
        ETerm *tt = &t[nt];
        tt->v = n.in[nt];
        tt->n = 0;
        for (int j = 0; j <= nl; j++) {
            if (j == ell)
                for (int k = 0; k < ne; k++)
                    tt->lab[tt->n++] = EIN_ELL + ne - 1 - k;
            if (j < nl)
                tt->lab[tt->n++] = labs[j];
        }
        ell_max = ne > ell_max ? ne : ell_max;
        for (int d = 0; d < r; d++) {
            int l = tt->lab[d];
            int64_t dim = x->shape.dim[d];
            for (int j = 0; j < d; j++)
                if (tt->lab[j] == l)
                    node_fatal(g, &n, "equation '%s': operand %d repeats subscript '%c' (a diagonal): not supported",
                               ir_q(eq), nt, l);
            if (ldim[l] < 0 || ldim[l] == 1)
                ldim[l] = dim;
            else if (dim != 1 && dim != ldim[l])
                node_fatal(g, &n, "equation '%s': %s%c has dims %lld and %lld", ir_q(eq), l >= EIN_ELL ? "an ellipsis dim" : "subscript ",
                           l >= EIN_ELL ? ' ' : l, (long long)ldim[l], (long long)dim);
            count[l]++;
        }
        nt++;
        if (*p != ',')
            break;
        p++;
    }
    if (nt != n.nin)
        node_fatal(g, &n, "equation '%s' names %d operands; the node has %d inputs", ir_q(eq), nt, n.nin);
    int out[MAX_RANK], no = 0;
    char keep[EIN_NLAB];
    memset(keep, 0, sizeof keep);
    if (*p == '-') {
        if (p[1] != '>')
            node_fatal(g, &n, "equation '%s': '-' must begin '->'", ir_q(eq));
        int ell = 0;
        for (p += 2; *p; ) {
            if (!strncmp(p, "...", 3) && !ell) {
                ell = 1;
                p += 3;
                for (int k = ell_max - 1; k >= 0 && no < MAX_RANK; k--)
                    out[no++] = EIN_ELL + k;
                continue;
            }
            int l = *p++;
            if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')) || !count[l] || keep[l] || no >= MAX_RANK)
                node_fatal(g, &n, "equation '%s': the output's subscripts must be up to %d distinct letters of the "
                           "inputs and one '...'", ir_q(eq), MAX_RANK);
            keep[l] = 1;
            out[no++] = l;
        }
    } else { /* implicit: the ellipsis, then the letters that occur once, in order */
        for (int k = ell_max - 1; k >= 0; k--)
            out[no++] = EIN_ELL + k;
        for (int l = 'A'; l <= 'z'; l++)
            if (count[l] == 1 && no < MAX_RANK)
                out[no++] = l;
    }
    for (int i = 0; i < nt; i++) { /* sum what only this operand has */
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < no; j++)
            keep[out[j]] = 1;
        for (int j = 0; j < nt; j++)
            for (int d = 0; j != i && d < t[j].n; d++)
                keep[t[j].lab[d]] = 1;
        ein_reduce(s, id, &t[i], keep);
    }
    ETerm acc = t[0];
    for (int i = 1; i < nt; i++) {
        memset(keep, 0, sizeof keep);
        for (int j = 0; j < no; j++)
            keep[out[j]] = 1;
        for (int j = i + 1; j < nt; j++)
            for (int d = 0; d < t[j].n; d++)
                keep[t[j].lab[d]] = 1;
        acc = ein_pair(s, id, acc, t[i], keep, ldim);
    }
    if (acc.n != no)
        node_fatal(g, &n, "equation '%s': the output's subscripts are not those the inputs leave", ir_q(eq));
    ein_transpose(s, id, &acc, out);
    fold_expand(s, id, OP_Identity, acc.v, -1, "out", n.out[0]);
}
