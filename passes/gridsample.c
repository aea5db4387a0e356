/* gridsample.c — fold's expansion of GridSample (2-D: X [N, C, H, W], grid
 * [N, Ho, Wo, 2] of (x, y) in [-1, 1]; 3-D: X [N, C, D, H, W], grid
 * [N, Do, Ho, Wo, 3] of (x, y, z)) into ops fsdpc computes and
 * differentiates, as ONNX's reference computes it:
 *
 *   each coordinate is denormalised (align_corners: (g + 1) (d - 1) / 2,
 *   else ((g + 1) d - 1) / 2); mode nearest rounds it (halves to even);
 *   outside [lo, hi] (align_corners: [0, d - 1], else [-0.5, d - 0.5])
 *   padding_mode border clamps it to [0, d - 1] and reflection reflects it
 *   back (lo + the distance folded into [0, span] over a period of 2 span);
 *   mode linear takes the taps floor(x) and floor(x) + 1 per axis, weighted
 *   1 - frac and frac; cubic the taps floor(x) - 1 .. floor(x) + 2 weighted
 *   by Keys' cubic (A = -0.75) of their distances (nearest: the one tap,
 *   weight 1); every combination of one tap per axis (cubic 3-D: 64) is
 *   weighted by the product of its axes' weights;
 *   each tap's pixel is X at the tap (zeros: 0 outside the image, its weight
 *   masked; border: the index clamped; reflection: the index reflected), a
 *   GatherElements of X flattened to [N, C, (D) H W] at (z H +) y W + x.
 *
 * The gradient follows: X's through GatherElements, the grid's through the
 * weights (Floor and Round have none, as torch's).
 */
#include "fold.h"
#include "rules/tensor.h"

#include <string.h>

static void visit(Sweep *s, int id) { fold_visit(s, id); }

typedef struct {
    Sweep *s;
    int id;
    DType t;
} Gs;

static int op2(Gs *c, Op op, int a, int b, const char *suffix)
{
    return fold_expand(c->s, c->id, op, a, b, suffix, -1);
}

static int where(Gs *c, int cond, int a, int b, const char *suffix, int out)
{
    Graph *g = c->s->g;
    const char *name = ir_fmt("%s/%s", g->node[c->id].name, suffix);
    if (out < 0)
        out = ir_value(g, ir_fmt("%s.%d", name, c->s->nnew++), DT_UNDEF, NULL, R_ACT);
    int k = ir_node(g, OP_Where, name, 3, (int[]){cond, a, b}, 1, &out);
    visit(c->s, k);
    return out;
}

static int num(Gs *c, double v, const char *suffix) { return fold_scalar(c->s, c->id, c->t, v, suffix); }

static int clip(Gs *c, int x, double lo, double hi, const char *suffix)
{
    Graph *g = c->s->g;
    const char *name = ir_fmt("%s/%s", g->node[c->id].name, suffix);
    int out = ir_value(g, ir_fmt("%s.%d", name, c->s->nnew++), DT_UNDEF, NULL, R_ACT);
    int k = ir_node1(g, OP_Clip, name, x, -1, out);
    ir_attr_add(g, k, "min", A_FLOAT)->f = lo;
    ir_attr_add(g, k, "max", A_FLOAT)->f = hi;
    visit(c->s, k);
    return out;
}

static int cast(Gs *c, int x, DType to, const char *suffix) { return fold_cast(c->s, c->id, x, to, suffix, -1); }

static int reshape(Gs *c, int x, const int64_t *dims, int n, const char *suffix)
{
    Shape cs = {1, {n}};
    Graph *g = c->s->g;
    int sv = ir_const(g, ir_fmt("%s/%s.shape.%d", g->node[c->id].name, suffix, c->s->nnew++), DT_I64, &cs, dims);
    return op2(c, OP_Reshape, x, sv, suffix);
}

/* x reflected into [lo, hi]: lo + the distance from lo folded over a period of 2 (hi - lo) */
static int reflect(Gs *c, int x, double lo, double hi)
{
    double span = hi - lo;
    if (span <= 0) /* one pixel, align_corners: every coordinate is it */
        return op2(c, OP_Mul, x, num(c, 0, "zero"), "only");
    int m = op2(c, OP_Mod, op2(c, OP_Sub, x, num(c, lo, "lo"), "from_lo"), num(c, 2 * span, "period"), "folded");
    int back = op2(c, OP_Sub, num(c, 2 * span, "period"), m, "back");
    int r = where(c, op2(c, OP_LessOrEqual, m, num(c, span, "span"), "forward"), m, back, "reflected", -1);
    return op2(c, OP_Add, r, num(c, lo, "lo"), "coordinate");
}

typedef struct {
    int64_t d;       /* the axis' length */
    double lo, hi;   /* the reference's border */
    int pad;         /* 0 zeros, 1 border, 2 reflection */
} Axis;

/* the tap index i (float) of an axis made an index into it; *valid (zeros padding: 1 inside, 0 outside, a float
 * mask; else -1) */
static int tap_index(Gs *c, int i, const Axis *a, int *valid)
{
    *valid = -1;
    if (a->pad == 0) {
        int ge = cast(c, op2(c, OP_GreaterOrEqual, i, num(c, 0, "zero"), "inside_lo"), c->t, "inside_lo_f");
        int le = cast(c, op2(c, OP_LessOrEqual, i, num(c, (double)(a->d - 1), "last"), "inside_hi"), c->t,
                      "inside_hi_f");
        *valid = op2(c, OP_Mul, ge, le, "inside");
    } else if (a->pad == 2) {
        i = reflect(c, i, a->lo, a->hi);
    }
    return clip(c, i, 0, (double)(a->d - 1), "index");
}

/* p3 z^3 + p2 z^2 + p1 z + p0 (Horner) */
static int cubic_poly(Gs *c, int z, const double p[4])
{
    int v = op2(c, OP_Add, op2(c, OP_Mul, z, num(c, p[3], "p3"), "h3"), num(c, p[2], "p2"), "h2");
    v = op2(c, OP_Add, op2(c, OP_Mul, v, z, "h1"), num(c, p[1], "p1"), "h1s");
    return op2(c, OP_Add, op2(c, OP_Mul, v, z, "h0"), num(c, p[0], "p0"), "cubic");
}

/* Keys' cubic weights (A = -0.75, as ONNX's reference) of the taps floor - 1 .. floor + 2 at t = x - floor:
 * the outer taps at distances 1 + t and 2 - t, the inner at t and 1 - t */
static void cubic_weights(Gs *c, int t, int w[4])
{
    const double A = -0.75, inner[4] = {1, 0, -(A + 3), A + 2}, outer[4] = {-4 * A, 8 * A, -5 * A, A};
    int one = num(c, 1, "one"), two = num(c, 2, "two");
    w[0] = cubic_poly(c, op2(c, OP_Add, t, one, "dist0"), outer);
    w[1] = cubic_poly(c, t, inner);
    w[2] = cubic_poly(c, op2(c, OP_Sub, one, t, "dist2"), inner);
    w[3] = cubic_poly(c, op2(c, OP_Sub, two, t, "dist3"), outer);
}

/* the grid's coordinate k (0 x, 1 y, 2 z) of every output point, [N, out...], denormalised and moved inside
 * (border, reflection) as the head says; nearest: rounded */
static int coordinate(Gs *c, int grid, int k, const Axis *a, int align, int nearest)
{
    Graph *g = c->s->g;
    const Node *n = &g->node[c->id];
    Shape sc = {0, {0}};
    int64_t kk = k;
    int kv = ir_const(g, ir_fmt("%s/axis%d.%d", n->name, k, c->s->nnew++), DT_I64, &sc, &kk);
    int gk = ir_value(g, ir_fmt("%s/g%d.%d", n->name, k, c->s->nnew++), DT_UNDEF, NULL, R_ACT);
    int gn = ir_node1(g, OP_Gather, ir_fmt("%s/g%d", n->name, k), grid, kv, gk);
    ir_attr_add(g, gn, "axis", A_INT)->i = g->val[grid].shape.rank - 1;
    visit(c->s, gn);
    double d = (double)a->d, sc2 = align ? (d - 1) / 2 : d / 2;
    int x = op2(c, OP_Add, op2(c, OP_Mul, gk, num(c, sc2, "scale"), "scaled"), num(c, (d - 1) / 2, "shift"), "denorm");
    if (nearest)
        x = op2(c, OP_Round, x, -1, "nearest");
    if (a->pad == 1) /* outside [lo, hi] only: cubic's taps see the difference inside [lo, 0) */
        x = where(c, op2(c, OP_Less, x, num(c, a->lo, "lo"), "before"), num(c, 0, "zero"),
                  where(c, op2(c, OP_Greater, x, num(c, a->hi, "hi"), "after"), num(c, d - 1, "last"), x, "clamp_hi",
                        -1), "border", -1);
    else if (a->pad == 2)
        x = reflect(c, x, a->lo, a->hi);
    return x;
}

void expand_gridsample(Sweep *s, int id)
{
    Graph *g = s->g;
    Node n = g->node[id];
    const Value *xv = &g->val[n.in[0]], *gv = &g->val[n.in[1]];
    Gs c = {s, id, xv->dtype};
    if (c.t != DT_F32 && c.t != DT_F64)
        node_fatal(g, &n, "X is %s: not supported (float32 or float64)", dtype_name(c.t));
    if (gv->dtype != c.t)
        node_fatal(g, &n, "the grid is %s but X is %s; give both one float dtype", dtype_name(gv->dtype),
                   dtype_name(c.t));
    int r = xv->shape.rank, ns = r - 2;
    if (r != 4 && r != 5)
        node_fatal(g, &n, "X has rank %d: a %d-D GridSample is not supported (fsdpc supports 2-D and 3-D: X (N, C, "
                   "H, W) or (N, C, D, H, W))", r, r - 2);
    const Shape *gs = &gv->shape;
    int64_t N = xv->shape.dim[0], C = xv->shape.dim[1];
    if (gs->rank != r || gs->dim[0] != N || gs->dim[r - 1] != ns)
        node_fatal(g, &n, "grid %s must be [N %lld, %s, %d]", shape_str(gs), (long long)N,
                   ns == 2 ? "H_out, W_out" : "D_out, H_out, W_out", ns);
    if (!shape_numel(&xv->shape) || !shape_numel(gs))
        node_fatal(g, &n, "X %s or the grid %s is empty: not supported", shape_str(&xv->shape), shape_str(gs));
    const char *mode = ir_attr_s(&n, "mode", "linear"), *pm = ir_attr_s(&n, "padding_mode", "zeros");
    int nearest = !strcmp(mode, "nearest"), cubic = !strcmp(mode, "cubic") || !strcmp(mode, "bicubic");
    if (!nearest && !cubic && strcmp(mode, "linear") && strcmp(mode, "bilinear"))
        node_fatal(g, &n, "mode %s: ONNX knows linear, nearest and cubic", ir_q(mode));
    int pad = !strcmp(pm, "zeros") ? 0 : !strcmp(pm, "border") ? 1 : !strcmp(pm, "reflection") ? 2 : -1;
    if (pad < 0)
        node_fatal(g, &n, "padding_mode %s: ONNX knows zeros, border and reflection", ir_q(pm));
    int align = ir_attr_i(&n, "align_corners", 0) != 0, nt = nearest ? 1 : cubic ? 4 : 2;
    Axis ax[3];
    int64_t stride[3], in = 1, out = 1; /* stride: of axis k's index in X flattened over its spatial dims */
    for (int k = 0; k < ns; k++) {
        double d = (double)xv->shape.dim[r - 1 - k];
        ax[k] = (Axis){xv->shape.dim[r - 1 - k], align ? 0 : -0.5, align ? d - 1 : d - 0.5, pad};
        stride[k] = in;
        in *= ax[k].d;
        out *= gs->dim[1 + k];
    }
    int taps[3][4], wts[3][4]; /* per axis: the tap coordinates and weights (nearest: -1) */
    for (int k = 0; k < ns; k++) {
        int co = coordinate(&c, n.in[1], k, &ax[k], align, nearest);
        if (nearest) {
            taps[k][0] = co, wts[k][0] = -1;
            continue;
        }
        int f = op2(&c, OP_Floor, co, -1, "floor"), frac = op2(&c, OP_Sub, co, f, "frac");
        for (int i = 0; i < nt; i++) { /* floor (- 1 .. + 2 in cubic) */
            int off = cubic ? i - 1 : i;
            taps[k][i] = off ? op2(&c, OP_Add, f, num(&c, off, "offset"), "tap") : f;
        }
        if (cubic)
            cubic_weights(&c, frac, wts[k]);
        else
            wts[k][0] = op2(&c, OP_Sub, num(&c, 1, "one"), frac, "w0"), wts[k][1] = frac;
    }
    int64_t flat[3] = {N, C, in}, row[3] = {N, 1, out}, wide[3] = {N, C, out}, yshape[5] = {N, C}, wshape[5] = {N, 1};
    for (int k = 0; k < ns; k++)
        yshape[2 + k] = wshape[2 + k] = gs->dim[1 + k];
    int xf = reshape(&c, n.in[0], flat, 3, "flat"), acc = -1, combos = nt * nt * (ns == 3 ? nt : 1);
    for (int t = 0; t < combos; t++) { /* one tap per axis: axis k's is t / nt^k % nt */
        int w = -1, valid = -1, at = -1;
        for (int k = 0, q = t; k < ns; k++, q /= nt) {
            int v, ix = tap_index(&c, taps[k][q % nt], &ax[k], &v);
            if (!nearest)
                w = w < 0 ? wts[k][q % nt] : op2(&c, OP_Mul, w, wts[k][q % nt], "weight");
            if (v >= 0)
                valid = valid < 0 ? v : op2(&c, OP_Mul, valid, v, "valid");
            if (stride[k] > 1)
                ix = op2(&c, OP_Mul, ix, num(&c, (double)stride[k], "stride"), "row_at");
            at = at < 0 ? ix : op2(&c, OP_Add, at, ix, "at");
        }
        if (valid >= 0)
            w = w < 0 ? valid : op2(&c, OP_Mul, w, valid, "masked");
        int idx = ir_value(g, ir_fmt("%s/at_all.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int en = ir_node1(g, OP_Expand, ir_fmt("%s/at_all", n.name),
                          reshape(&c, cast(&c, at, DT_I64, "at64"), row, 3, "at_row"), -1, idx);
        ir_attr_ints_add(g, en, "shape", wide, 3);
        visit(s, en);
        int ge = ir_value(g, ir_fmt("%s/pixels.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int gn = ir_node1(g, OP_GatherElements, ir_fmt("%s/pixels", n.name), xf, idx, ge);
        ir_attr_add(g, gn, "axis", A_INT)->i = 2;
        visit(s, gn);
        int px = reshape(&c, ge, yshape, r, "pixels_nd");
        if (w >= 0)
            px = op2(&c, OP_Mul, px, reshape(&c, w, wshape, r, "weight_nd"), "weighted");
        acc = acc < 0 ? px : op2(&c, OP_Add, acc, px, "sum");
    }
    int in1[1] = {acc};
    int k = ir_node(g, OP_Identity, ir_fmt("%s/out", n.name), 1, in1, 1, &n.out[0]);
    visit(s, k);
}
