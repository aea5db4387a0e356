/* recurrent.c — fold's expansion of RNN, GRU and LSTM into the time steps
 * they stand for, with ops fsdpc computes and differentiates (both targets
 * follow; backpropagation through time is autodiff's ordinary reverse sweep).
 *
 * fsdpc's shapes are static, so the sequence is unrolled: for each direction
 * d (forward, reverse, or both), the input projection of every step at once
 * (X [T, B, I] times W[d]^T: one GEMM, plus the biases where they simply
 * add), then per step t (reverse: from the last) the recurrence on H (and
 * LSTM's C) as ONNX writes it, gates in ONNX's order:
 *   RNN   H = f(x_t + H R^T)                          (f: Tanh)
 *   GRU   z, r = f(x_z + H R_z^T), f(x_r + H R_r^T)   (f: Sigmoid, g: Tanh)
 *         h~ = g(x_h + (r H) R_h^T + Rb_h), or with linear_before_reset
 *              g(x_h + r (H R_h^T + Rb_h));
 *         H = (1 - z) h~ + z H
 *   LSTM  i, o, f, c = the four gates of x_t + H R^T; peepholes P add
 *         P_i C, P_f C (the old C) and P_o C (the new); i, f = f(.),
 *         C = f C + i g(c), H = f(o) h(C)             (f: Sigmoid, g, h: Tanh)
 * Each step's H is unsqueezed and concatenated into Y [T, dirs, B, H]; Y_h
 * and Y_c are the last step's.  layout 1 ([B, T, ...]) transposes in and out.
 * Activations Sigmoid, Tanh, Relu, Softsign, Softplus; clip bounds each
 * gate's input.  A sequence_lens that is not every sequence's full length,
 * input_forget and parameterised activations are refused in one line.
 */
#include "fold.h"
#include "rules/tensor.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

/* op(in[0..nin)) named NODE/suffix writing out (-1: a new value); the node, not yet visited */
static int mk(Sweep *s, int id, Op op, const int *in, int nin, const char *suffix, int out)
{
    Graph *g = s->g;
    const char *name = ir_fmt("%s/%s", g->node[id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, s->nnew++), DT_UNDEF, NULL, R_ACT);
    return ir_node(g, op, name, nin, in, 1, &out);
}

/* op(a[, b]) visited; its output */
static int op2(Sweep *s, int id, Op op, int a, int b, const char *suffix, int out)
{
    return fold_expand(s, id, op, a, b, suffix, out);
}

/* op(x) with the ints attribute name = v[0..n), visited; its output */
static int op_ints(Sweep *s, int id, Op op, int x, const char *attr, const int64_t *v, int n, const char *suffix,
                   int out)
{
    int c = mk(s, id, op, &x, 1, suffix, out);
    ir_attr_ints_add(s->g, c, attr, v, n);
    visit(s, c);
    return s->g->node[c].out[0];
}

/* x[i] along axis 0 (the axis dropped) */
static int take(Sweep *s, int id, int x, int64_t i, const char *suffix)
{
    Shape sc = {0, {0}};
    int iv = ir_const(s->g, ir_fmt("%s/%s.i.%d", s->g->node[id].name, suffix, s->nnew++), DT_I64, &sc, &i);
    return op2(s, id, OP_Gather, x, iv, suffix, -1);
}

/* x[.., lo:hi] along the last axis of a rank-r x */
static int cols(Sweep *s, int id, int x, int64_t lo, int64_t hi, const char *suffix)
{
    Graph *g = s->g;
    int c = mk(s, id, OP_Slice, &x, 1, suffix, -1);
    int64_t ax = g->val[x].shape.rank - 1;
    ir_attr_ints_add(g, c, "starts", &lo, 1);
    ir_attr_ints_add(g, c, "ends", &hi, 1);
    ir_attr_ints_add(g, c, "axes", &ax, 1);
    visit(s, c);
    return g->node[c].out[0];
}

static int transpose(Sweep *s, int id, int x, const int64_t *perm, int n, const char *suffix)
{
    return op_ints(s, id, OP_Transpose, x, "perm", perm, n, suffix, -1);
}

/* Concat of xs[0..n) along axis, into out; nested 8 inputs at a time, as fold nests an ONNX Concat (a gradient
 * rule takes at most 8) */
static int concat(Sweep *s, int id, const int *xs, int n, int64_t axis, const char *suffix, int out)
{
    if (n > 8) {
        int m = (n + 7) / 8, *part = ir_alloc(sizeof(int) * (size_t)m);
        for (int i = 0; i < m; i++)
            part[i] = concat(s, id, xs + 8 * i, n - 8 * i < 8 ? n - 8 * i : 8, axis, suffix, -1);
        return concat(s, id, part, m, axis, suffix, out);
    }
    int c = mk(s, id, OP_Concat, xs, n, suffix, out);
    ir_attr_add(s->g, c, "axis", A_INT)->i = axis;
    visit(s, c);
    return s->g->node[c].out[0];
}

/* xs[0..n) stacked along a new axis 0, into out */
static int stack(Sweep *s, int id, const int *xs, int n, const char *suffix, int out)
{
    int64_t zero = 0;
    int *u = ir_alloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++)
        u[i] = op_ints(s, id, OP_Unsqueeze, xs[i], "axes", &zero, 1, suffix, -1);
    return concat(s, id, u, n, 0, suffix, out);
}

typedef struct {
    Op act[3];     /* f, g, h of this direction */
    double clip;   /* > 0: each gate's input within [-clip, clip] */
} Cell;

/* act(x) after the clip, visited */
static int gate(Sweep *s, int id, const Cell *c, int k, int x, const char *suffix)
{
    if (c->clip > 0) {
        int n = mk(s, id, OP_Clip, &x, 1, "clip", -1);
        ir_attr_add(s->g, n, "min", A_FLOAT)->f = -c->clip;
        ir_attr_add(s->g, n, "max", A_FLOAT)->f = c->clip;
        visit(s, n);
        x = s->g->node[n].out[0];
    }
    return op2(s, id, c->act[k], x, -1, suffix, -1);
}

static Op activation(const Graph *g, const Node *n, const char *name)
{
    static const struct { const char *name; Op op; } known[] = {
        {"Sigmoid", OP_Sigmoid}, {"Tanh", OP_Tanh}, {"Relu", OP_Relu}, {"Softsign", OP_Softsign},
        {"Softplus", OP_Softplus},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(name, known[i].name))
            return known[i].op;
    node_fatal(g, n, "activation %s is not supported (fsdpc supports Sigmoid, Tanh, Relu, Softsign, Softplus)",
               ir_q(name));
}

/* the optional input k of node n, or -1 */
static int opt_in(const Node *n, int k) { return k < n->nin ? n->in[k] : -1; }

void expand_recurrent(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    Op op = n.op;
    const int G = op == OP_LSTM ? 4 : op == OP_GRU ? 3 : 1, nact = op == OP_LSTM ? 3 : op == OP_GRU ? 2 : 1;
    const Value *xv = &g->val[n.in[0]], *wv = &g->val[n.in[1]], *rv = &g->val[n.in[2]];
    DType dt = xv->dtype;
    if (dt != DT_F32 && dt != DT_F64)
        node_fatal(g, &n, "input X is %s: not supported (float32 or float64)", dtype_name(dt));
    if (xv->shape.rank != 3 || wv->shape.rank != 3 || rv->shape.rank != 3)
        node_fatal(g, &n, "X, W and R must have rank 3 (found %d, %d, %d)", xv->shape.rank, wv->shape.rank,
                   rv->shape.rank);
    const char *dir = ir_attr_s(&n, "direction", "forward");
    int both = !strcmp(dir, "bidirectional"), rev = !strcmp(dir, "reverse"), D = both ? 2 : 1;
    if (!both && !rev && strcmp(dir, "forward"))
        node_fatal(g, &n, "direction %s: ONNX knows forward, reverse and bidirectional", ir_q(dir));
    int layout = (int)ir_attr_i(&n, "layout", 0);
    if (layout != 0 && layout != 1)
        node_fatal(g, &n, "layout = %d: ONNX knows 0 and 1", layout);
    if (ir_attr_i(&n, "input_forget", 0))
        node_fatal(g, &n, "input_forget = 1 (coupled input and forget gates) is not supported");
    if (ir_attr(&n, "activation_alpha") || ir_attr(&n, "activation_beta"))
        node_fatal(g, &n, "activation_alpha / activation_beta (parameterised activations) are not supported");
    int x = n.in[0];
    if (layout) { /* [B, T, I] -> [T, B, I] */
        int64_t p[3] = {1, 0, 2};
        x = transpose(s, id, x, p, 3, "time_major");
    }
    const Shape *xs = &g->val[x].shape;
    int64_t T = xs->dim[0], B = xs->dim[1], I = xs->dim[2];
    int64_t H = ir_attr_i(&n, "hidden_size", rv->shape.dim[2]);
    if (H < 1 || H > MAX_NUMEL || H != rv->shape.dim[2] || rv->shape.dim[0] != D || rv->shape.dim[1] != G * H ||
        wv->shape.dim[0] != D || wv->shape.dim[1] != G * H || wv->shape.dim[2] != I)
        node_fatal(g, &n, "W %s and R %s do not fit %d direction(s) of %d gates of hidden_size %lld over %lld "
                   "inputs (W: [dirs, gates x hidden, input], R: [dirs, gates x hidden, hidden])",
                   shape_str(&wv->shape), shape_str(&rv->shape), D, G, (long long)H, (long long)I);
    if (T < 1 || T > 4096 || B < 1)
        node_fatal(g, &n, "a sequence of %lld steps over a batch of %lld: fsdpc unrolls 1 to 4096 steps over a "
                   "non-empty batch", (long long)T, (long long)B);
    if (B > ((int64_t)1 << 26) / H)
        node_fatal(g, &n, "a state of %lld x %lld: fsdpc supports recurrent states of up to 2^26 elements",
                   (long long)B, (long long)H);
    int sl = opt_in(&n, 4);
    if (sl >= 0) {
        const Value *lv = &g->val[sl];
        int full = lv->role == R_CONST && lv->data && shape_numel(&lv->shape) == B;
        for (int64_t b = 0; full && b < B; b++)
            full = tensor_const_i(lv, b) == T;
        if (!full)
            node_fatal(g, &n, "sequence_lens given at run time or shorter than the sequence is not supported: fsdpc "
                       "unrolls every sequence to its full %lld steps (leave sequence_lens out, or make it a constant "
                       "of all %lld; pad the batch and mask the loss)", (long long)T, (long long)T);
    }
    const Attr *acts = ir_attr(&n, "activations");
    if (acts && acts->kind != A_STRINGS)
        node_fatal(g, &n, "attribute activations must be a list of strings");
    Cell cell[2];
    for (int d = 0; d < D; d++) {
        static const Op def[3][3] = {{OP_Tanh}, {OP_Sigmoid, OP_Tanh}, {OP_Sigmoid, OP_Tanh, OP_Tanh}};
        for (int k = 0; k < nact; k++)
            cell[d].act[k] = def[G == 4 ? 2 : G == 3 ? 1 : 0][k];
        cell[d].clip = ir_attr(&n, "clip") ? ir_attr_f(&n, "clip", 0) : 0;
        if (ir_attr(&n, "clip") && !(cell[d].clip > 0))
            node_fatal(g, &n, "clip must be positive");
    }
    if (acts) {
        if (acts->n != nact * D)
            node_fatal(g, &n, "activations lists %d names; %s with %d direction(s) takes %d", acts->n,
                       op_info[op].name, D, nact * D);
        for (int d = 0; d < D; d++)
            for (int k = 0; k < nact; k++)
                cell[d].act[k] = activation(g, &n, acts->strs[d * nact + k]);
    }
    int bias = opt_in(&n, 3), h0 = opt_in(&n, 5), c0 = G == 4 ? opt_in(&n, 6) : -1, peep = G == 4 ? opt_in(&n, 7) : -1;
    if (layout) {
        int64_t p[3] = {1, 0, 2};
        if (h0 >= 0)
            h0 = transpose(s, id, h0, p, 3, "h0_dirs");
        if (c0 >= 0)
            c0 = transpose(s, id, c0, p, 3, "c0_dirs");
    }
    Shape zs = {2, {B, H}};
    void *zero = ir_alloc((size_t)(B * H) * dtype_size(dt));
    int zeros = ir_const(g, ir_fmt("%s/zeros.%d", n.name, s->nnew++), dt, &zs, zero);
    int ys[2], hs[2], cs[2];
    int *steps = ir_alloc(sizeof(int) * (size_t)T);
    int lbr = (int)ir_attr_i(&n, "linear_before_reset", 0);
    for (int d = 0; d < D; d++) {
        int64_t t2[2] = {1, 0};
        int wt = transpose(s, id, take(s, id, n.in[1], d, "W"), t2, 2, "Wt");  /* [I, G H] */
        int rt = transpose(s, id, take(s, id, n.in[2], d, "R"), t2, 2, "Rt");  /* [H, G H] */
        int xw = op2(s, id, OP_MatMul, x, wt, "x_proj", -1);                  /* [T, B, G H] */
        int rb = -1;
        if (bias >= 0) {
            int bd = take(s, id, bias, d, "B");
            int wb = cols(s, id, bd, 0, G * H, "Wb");
            rb = cols(s, id, bd, G * H, 2 * G * H, "Rb");
            xw = op2(s, id, OP_Add, xw, wb, "x_bias", -1);
            if (G != 3) { /* GRU adds R's bias inside the recurrence (linear_before_reset) */
                xw = op2(s, id, OP_Add, xw, rb, "r_bias", -1);
                rb = -1;
            }
        }
        int h = h0 >= 0 ? take(s, id, h0, d, "h0") : zeros, c = c0 >= 0 ? take(s, id, c0, d, "c0") : zeros;
        int pd = peep >= 0 ? take(s, id, peep, d, "P") : -1;
        int pi = pd >= 0 ? cols(s, id, pd, 0, H, "Pi") : -1, po = pd >= 0 ? cols(s, id, pd, H, 2 * H, "Po") : -1;
        int pf = pd >= 0 ? cols(s, id, pd, 2 * H, 3 * H, "Pf") : -1;
        int rh = G == 3 && !lbr ? cols(s, id, rt, 2 * H, 3 * H, "Rt_h") : -1;
        int rzr = G == 3 && !lbr ? cols(s, id, rt, 0, 2 * H, "Rt_zr") : -1;
        const Cell *k = &cell[d];
        for (int64_t i = 0; i < T; i++) {
            int64_t t = (rev || d == 1) ? T - 1 - i : i;
            int xt = take(s, id, xw, t, "x_t");                              /* [B, G H] */
            if (G == 1) {
                h = gate(s, id, k, 0, op2(s, id, OP_Add, xt, op2(s, id, OP_MatMul, h, rt, "h_proj", -1), "pre", -1),
                         "h");
            } else if (G == 4) {
                int pre = op2(s, id, OP_Add, xt, op2(s, id, OP_MatMul, h, rt, "h_proj", -1), "pre", -1);
                int gi = cols(s, id, pre, 0, H, "i"), go = cols(s, id, pre, H, 2 * H, "o");
                int gf = cols(s, id, pre, 2 * H, 3 * H, "f"), gc = cols(s, id, pre, 3 * H, 4 * H, "c");
                if (pd >= 0) {
                    gi = op2(s, id, OP_Add, gi, op2(s, id, OP_Mul, pi, c, "peep_i", -1), "i_peep", -1);
                    gf = op2(s, id, OP_Add, gf, op2(s, id, OP_Mul, pf, c, "peep_f", -1), "f_peep", -1);
                }
                int ig = gate(s, id, k, 0, gi, "i_gate"), fg = gate(s, id, k, 0, gf, "f_gate");
                c = op2(s, id, OP_Add, op2(s, id, OP_Mul, fg, c, "keep", -1),
                        op2(s, id, OP_Mul, ig, gate(s, id, k, 1, gc, "cand"), "write", -1), "C", -1);
                if (pd >= 0)
                    go = op2(s, id, OP_Add, go, op2(s, id, OP_Mul, po, c, "peep_o", -1), "o_peep", -1);
                h = op2(s, id, OP_Mul, gate(s, id, k, 0, go, "o_gate"), gate(s, id, k, 2, c, "C_act"), "H", -1);
            } else { /* GRU */
                int hr = op2(s, id, OP_MatMul, h, lbr ? rt : rzr, "h_proj", -1); /* [B, 3H] or [B, 2H] */
                if (rb >= 0 && lbr)
                    hr = op2(s, id, OP_Add, hr, rb, "h_bias", -1);
                else if (rb >= 0)
                    hr = op2(s, id, OP_Add, hr, cols(s, id, rb, 0, 2 * H, "Rb_zr"), "h_bias", -1);
                int z = gate(s, id, k, 0, op2(s, id, OP_Add, cols(s, id, xt, 0, H, "xz"), cols(s, id, hr, 0, H, "hz"),
                                              "z_pre", -1), "z");
                int r = gate(s, id, k, 0, op2(s, id, OP_Add, cols(s, id, xt, H, 2 * H, "xr"),
                                              cols(s, id, hr, H, 2 * H, "hr"), "r_pre", -1), "r");
                int hh;
                if (lbr) {
                    hh = op2(s, id, OP_Mul, r, cols(s, id, hr, 2 * H, 3 * H, "hh"), "reset", -1);
                } else {
                    hh = op2(s, id, OP_MatMul, op2(s, id, OP_Mul, r, h, "reset", -1), rh, "hh", -1);
                    if (rb >= 0)
                        hh = op2(s, id, OP_Add, hh, cols(s, id, rb, 2 * H, 3 * H, "Rb_h"), "hh_bias", -1);
                }
                int cand = gate(s, id, k, 1, op2(s, id, OP_Add, cols(s, id, xt, 2 * H, 3 * H, "xh"), hh, "h_pre", -1),
                                "cand");
                /* H = (1 - z) cand + z H = cand + z (H - cand) */
                h = op2(s, id, OP_Add, cand, op2(s, id, OP_Mul, z, op2(s, id, OP_Sub, h, cand, "delta", -1), "zd", -1),
                        "H", -1);
            }
            steps[t] = h;
        }
        ys[d] = stack(s, id, steps, (int)T, "Y_dir", -1);  /* [T, B, H] */
        hs[d] = h, cs[d] = c;
    }
    /* Y [T, dirs, B, H] (layout 1: [B, T, dirs, H]); Y_h, Y_c [dirs, B, H] (layout 1: [B, dirs, H]) */
    int y = n.nout > 0 ? n.out[0] : -1, yh = n.nout > 1 ? n.out[1] : -1, yc = n.nout > 2 ? n.out[2] : -1;
    if (y >= 0) {
        int64_t one = 1;
        int u[2];
        for (int d = 0; d < D; d++)
            u[d] = op_ints(s, id, OP_Unsqueeze, ys[d], "axes", &one, 1, "Y_unsq", -1);
        int yy = concat(s, id, u, D, 1, "Y", layout ? -1 : y);
        if (layout) {
            int64_t p[4] = {2, 0, 1, 3};
            op_ints(s, id, OP_Transpose, yy, "perm", p, 4, "Y_batch_major", y);
        }
    }
    for (int k = 0; k < 2; k++) {
        int out = k ? yc : yh;
        if (out < 0)
            continue;
        int last = stack(s, id, k ? cs : hs, D, k ? "Y_c" : "Y_h", layout ? -1 : out);
        if (layout) {
            int64_t p[3] = {1, 0, 2};
            op_ints(s, id, OP_Transpose, last, "perm", p, 3, k ? "Y_c_batch_major" : "Y_h_batch_major", out);
        }
    }
}
