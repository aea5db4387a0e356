/* gridsample.c — fold's expansion of GridSample (2-D: X [N, C, H, W], grid
 * [N, Ho, Wo, 2] of (x, y) in [-1, 1]) into ops fsdpc computes and
 * differentiates, as ONNX's reference computes it:
 *
 *   each coordinate is denormalised (align_corners: (g + 1) (d - 1) / 2,
 *   else ((g + 1) d - 1) / 2); mode nearest rounds it (halves to even);
 *   outside [lo, hi] (align_corners: [0, d - 1], else [-0.5, d - 0.5])
 *   padding_mode border clamps it to [0, d - 1] and reflection reflects it
 *   back (lo + the distance folded into [0, span] over a period of 2 span);
 *   mode linear takes the taps floor(x) and floor(x) + 1 per axis, weighted
 *   1 - frac and frac (nearest: the one tap, weight 1);
 *   each tap's pixel is X at the tap (zeros: 0 outside the image, its weight
 *   masked; border: the index clamped; reflection: the index reflected), a
 *   GatherElements of X flattened to [N, C, H W] at y W + x.
 *
 * The gradient follows: X's through GatherElements, the grid's through the
 * weights (Floor and Round have none, as torch's).  Mode cubic and 3-D grids
 * are refused in one line.
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
    if (xv->shape.rank != 4)
        node_fatal(g, &n, "X has rank %d: a %d-D GridSample is not supported (fsdpc supports 2-D: X (N, C, H, W))",
                   xv->shape.rank, xv->shape.rank - 2);
    const Shape *gs = &gv->shape;
    int64_t N = xv->shape.dim[0], C = xv->shape.dim[1], H = xv->shape.dim[2], W = xv->shape.dim[3];
    if (gs->rank != 4 || gs->dim[0] != N || gs->dim[3] != 2)
        node_fatal(g, &n, "grid %s must be [N %lld, H_out, W_out, 2]", shape_str(gs), (long long)N);
    int64_t Ho = gs->dim[1], Wo = gs->dim[2];
    if (!shape_numel(&xv->shape) || !shape_numel(gs))
        node_fatal(g, &n, "X %s or the grid %s is empty: not supported", shape_str(&xv->shape), shape_str(gs));
    const char *mode = ir_attr_s(&n, "mode", "linear"), *pm = ir_attr_s(&n, "padding_mode", "zeros");
    int nearest = !strcmp(mode, "nearest");
    if (!nearest && strcmp(mode, "linear") && strcmp(mode, "bilinear"))
        node_fatal(g, &n, "mode %s is not supported (fsdpc supports linear and nearest)", ir_q(mode));
    int pad = !strcmp(pm, "zeros") ? 0 : !strcmp(pm, "border") ? 1 : !strcmp(pm, "reflection") ? 2 : -1;
    if (pad < 0)
        node_fatal(g, &n, "padding_mode %s: ONNX knows zeros, border and reflection", ir_q(pm));
    int align = ir_attr_i(&n, "align_corners", 0) != 0;
    Axis ax[2] = {{W, align ? 0 : -0.5, align ? (double)W - 1 : (double)W - 0.5, pad},
                  {H, align ? 0 : -0.5, align ? (double)H - 1 : (double)H - 0.5, pad}};
    int co[2]; /* x, y: [N, Ho, Wo] */
    for (int k = 0; k < 2; k++) {
        Shape sc = {0, {0}};
        int64_t kk = k;
        int kv = ir_const(g, ir_fmt("%s/axis%d.%d", n.name, k, s->nnew++), DT_I64, &sc, &kk);
        int gk = ir_value(g, ir_fmt("%s/g%d.%d", n.name, k, s->nnew++), DT_UNDEF, NULL, R_ACT);
        int gn = ir_node1(g, OP_Gather, ir_fmt("%s/g%d", n.name, k), n.in[1], kv, gk);
        ir_attr_add(g, gn, "axis", A_INT)->i = 3;
        visit(s, gn);
        double d = (double)ax[k].d, a = align ? (d - 1) / 2 : d / 2;
        int x = op2(&c, OP_Add, op2(&c, OP_Mul, gk, num(&c, a, "scale"), "scaled"), num(&c, (d - 1) / 2, "shift"),
                    "denorm");
        if (nearest)
            x = op2(&c, OP_Round, x, -1, "nearest");
        if (pad == 1)
            x = clip(&c, x, 0, d - 1, "border");
        else if (pad == 2)
            x = reflect(&c, x, ax[k].lo, ax[k].hi);
        co[k] = x;
    }
    int64_t flat[3] = {N, C, H * W}, row[3] = {N, 1, Ho * Wo}, wide[3] = {N, C, Ho * Wo}, out4[4] = {N, C, Ho, Wo};
    int64_t w4[4] = {N, 1, Ho, Wo};
    int xf = reshape(&c, n.in[0], flat, 3, "flat");
    int taps[2][2], wts[2][2]; /* per axis: the tap coordinates and weights */
    for (int k = 0; k < 2; k++) {
        if (nearest) {
            taps[k][0] = co[k], wts[k][0] = -1;
            continue;
        }
        int f = op2(&c, OP_Floor, co[k], -1, "floor"), frac = op2(&c, OP_Sub, co[k], f, "frac");
        taps[k][0] = f, taps[k][1] = op2(&c, OP_Add, f, num(&c, 1, "one"), "next");
        wts[k][0] = op2(&c, OP_Sub, num(&c, 1, "one"), frac, "w0"), wts[k][1] = frac;
    }
    int acc = -1, nt = nearest ? 1 : 2;
    for (int j = 0; j < nt; j++)        /* y tap */
        for (int i = 0; i < nt; i++) {  /* x tap */
            int vx, vy;
            int ix = tap_index(&c, taps[0][i], &ax[0], &vx), iy = tap_index(&c, taps[1][j], &ax[1], &vy);
            int w = nearest ? -1 : op2(&c, OP_Mul, wts[0][i], wts[1][j], "weight");
            if (vx >= 0) {
                int v = op2(&c, OP_Mul, vx, vy, "valid");
                w = w < 0 ? v : op2(&c, OP_Mul, w, v, "masked");
            }
            int at = op2(&c, OP_Add, op2(&c, OP_Mul, iy, num(&c, (double)W, "width"), "row_at"), ix, "at");
            int idx = ir_value(g, ir_fmt("%s/at_all.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
            int en = ir_node1(g, OP_Expand, ir_fmt("%s/at_all", n.name),
                              reshape(&c, cast(&c, at, DT_I64, "at64"), row, 3, "at_row"), -1, idx);
            ir_attr_ints_add(g, en, "shape", wide, 3);
            visit(s, en);
            int ge = ir_value(g, ir_fmt("%s/pixels.%d", n.name, s->nnew++), DT_UNDEF, NULL, R_ACT);
            int gn = ir_node1(g, OP_GatherElements, ir_fmt("%s/pixels", n.name), xf, idx, ge);
            ir_attr_add(g, gn, "axis", A_INT)->i = 2;
            visit(s, gn);
            int px = reshape(&c, ge, out4, 4, "pixels4");
            if (w >= 0)
                px = op2(&c, OP_Mul, px, reshape(&c, w, w4, 4, "weight4"), "weighted");
            acc = acc < 0 ? px : op2(&c, OP_Add, acc, px, "sum");
        }
    int in1[1] = {acc};
    int k = ir_node(g, OP_Identity, ir_fmt("%s/out", n.name), 1, in1, 1, &n.out[0]);
    visit(s, k);
}
