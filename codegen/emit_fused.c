/* emit_fused.c — the code of a Fused node (passes/fuse.c): one loop over
 * the output's elements that loads each outside input once (broadcast by
 * index arithmetic on compile-time constants), computes every member node
 * into a local with kernels/c/fused.h, and stores the root's value.  On
 * cpu, where an input broadcasts, the loop is a nest: an outer loop over
 * the output's leading dims, each input's base computed there once, and an
 * inner loop over the trailing dims that every input reads as the output
 * does or not at all (inner_dim), so that it indexes each by j or by
 * nothing and GCC vectorises it (per-element index arithmetic was a gather
 * an element: the Llama 256/4/256/8's 128 fused loops of a bf16 step 31.3
 * -> 12.2 ms, its 49 float32 ones 12.8 -> 4.8 ms; the same bits).  A cpu
 * loop that also sums its output's columns (a bias gradient) splits over
 * column tiles instead, walking the rows (emit_column_sums).  Under
 * --precision bf16 / fp16 a loop may load 16-bit inputs (widened), round at
 * a member Cast to 16 bits, and store a 16-bit result: every local is of the
 * compute type, float32 (float64 for float64 loops).
 *
 * cpu: a member of ops.def's TAB16 rows (erf, exp, tanh, ...) whose operand
 * is a 16-bit number (a bfloat16 or float16 value, or its Cast to float32)
 * takes its result from a table of the op at all 65536 values of that type
 * (cg_fused_tables: filled once, at the first step, by the same row in the
 * same file, so the bits are those the loop would compute; GCC vectorises
 * the lookup as a gather: GELU's erf loop 0.70 -> 0.25 ms at 524288
 * bfloat16 elements on Zen 5).  So does the gradient of one whose row reads
 * x alone, at a 16-bit x: dy times a table of its derivative (the row at
 * dy = 1).  That is the same derivative, but one product where the row may
 * multiply in another order (erf's (dy * 2/sqrt(pi)) * exp(-x^2)): within an
 * ulp of float32, so the 16-bit value it is rounded to may differ, rarely (1
 * of 524288 in GELU's bfloat16 backward loop; 0.59 -> 0.37 ms).  A bfloat16 result,
 * rounded by its Cast (k_bf16_round), is stored as its top half
 * (k_bf16_bits: the same bits as k_bf16_from_f32, without a second
 * rounding: that loop 0.37 -> 0.31 ms).
 *
 * cpu: the loop is inline in the step.  cuda: the same body becomes a
 * generated kernel `fsdpc_fused<K>` (a grid-stride loop) appended to the
 * program NVRTC compiles, and the step launches it through kc_launch with
 * id KC_COUNT + K; the executable's RtModel lists the names.
 */
#include "cg.h"
#include "kernels.h"
#include "fused.h"

#include <string.h>

/* input v's element strides over output shape y's dims (0 where v broadcasts), and the output's own */
static void strides(const Graph *g, int v, const Shape *y, int64_t *st, int64_t *ost)
{
    const Shape *s = &g->val[v].shape;
    int64_t acc = 1, oacc = 1;
    for (int d = y->rank - 1; d >= 0; d--) {
        int ia = d - (y->rank - s->rank);
        int64_t dim = ia >= 0 ? s->dim[ia] : 1;
        st[d] = dim == 1 ? 0 : acc;
        acc *= dim;
        ost[d] = oacc;
        oacc *= y->dim[d];
    }
}

/* how input v reads output dims [c, rank) of y: 1 as the output (its elements there contiguous, in order), 0 not
 * at all (broadcast: one element for them all), -1 otherwise */
static int inner_mode(const Graph *g, int v, const Shape *y, int c)
{
    int64_t st[MAX_RANK], ost[MAX_RANK];
    strides(g, v, y, st, ost);
    int dense = 1, zero = 1;
    for (int d = c; d < y->rank; d++) {
        dense &= st[d] == ost[d] || y->dim[d] == 1;
        zero &= st[d] == 0 || y->dim[d] == 1;
    }
    return zero ? 0 : dense ? 1 : -1;
}

/* the offset of input v (broadcast into shape y) at the first element of position `var` of y's dims [0, c), the
 * elements of dims [c, rank) `inner` (c == rank: position var of the whole output, inner 1) */
static const char *index_expr(const Graph *g, int v, const Shape *y, int c, int64_t inner, const char *var)
{
    int64_t st[MAX_RANK], ost[MAX_RANK];
    strides(g, v, y, st, ost);
    const int whole = inner_mode(g, v, y, 0);
    if (whole == 0)
        return "0";
    if (whole == 1)
        return inner == 1 ? var : ir_fmt("%s * %lldLL", var, (long long)inner);
    Buf b = {0};
    for (int d = 0; d < c; d++) {
        if (st[d] == 0 || y->dim[d] == 1)
            continue;
        const int64_t o = ost[d] / inner; /* position var's stride over dim d (ost[d] is a multiple of inner) */
        const char *pos = d == 0 ? ir_fmt("%s / %lldLL", var, (long long)o)
                                 : o == 1 ? ir_fmt("%s %% %lldLL", var, (long long)y->dim[d])
                                          : ir_fmt("%s / %lldLL %% %lldLL", var, (long long)o, (long long)y->dim[d]);
        cg_put(&b, "%s(%s) * %lldLL", b.len ? " + " : "", pos, (long long)st[d]);
    }
    return b.len ? b.buf : "0";
}

/* the first dim c of the loop nest's inner loop over y's dims [c, rank): the smallest one that every input reads
 * as the output or not at all (inner_mode), so the inner loop indexes each input by j or by nothing (GCC
 * vectorises it: a bias or a per-row scale read by `i / 256 % 256` index arithmetic was a gather per element, a
 * 524288-element RMSNorm scale 1.1 ns an element); y->rank where no such dim is (or every input is as the
 * output: one flat loop) */
static int inner_dim(const Graph *g, const Node *n, const Shape *y)
{
    int all_dense = 1;
    for (int i = 0; i < n->nin; i++)
        all_dense &= inner_mode(g, n->in[i], y, 0) >= 0;
    if (all_dense)
        return y->rank;
    int c = y->rank;
    for (int d = y->rank - 1; d >= 0; d--) {
        int ok = 1;
        for (int i = 0; i < n->nin && ok; i++)
            ok = inner_mode(g, n->in[i], y, d) >= 0;
        if (!ok)
            break;
        c = d;
    }
    return c;
}

/* operand v of a member: a local of an earlier member, or outside input */
static const char *operand(const Fusion *f, int k, const Node *n, int v)
{
    if (v < 0)
        return NULL;
    for (int j = 0; j < k; j++)
        if (f->member[j].out[0] == v)
            return ir_fmt("t%d", j);
    for (int i = 0; i < n->nin; i++)
        if (n->in[i] == v)
            return ir_fmt("x%d", i);
    die("fused operand '%s' is neither inside nor an input", "?");
}

/* the 16-bit conversions of the target (kernels.h's on cpu, common.cuh's on cuda), bit for bit alike */
static const char *conv(const Cg *cg, int from16, DType low)
{
    return ir_fmt("%s_%s_%s", cg->cuda ? "kc" : "k", dtype_name(low), from16 ? "to_f32" : "from_f32");
}

static int is_low(DType t) { return t == DT_BF16 || t == DT_F16; }

/* value v of dtype t as the loop's compute type (a 16-bit float widened) */
static const char *load(const Cg *cg, DType t, const char *v)
{
    return is_low(t) ? ir_fmt("%s(%s)", conv(cg, 1, t), v) : v;
}

/* The 16-bit type (bfloat16 or float16) value v, operand of member k, is exactly a number of: its own dtype (an
 * input, or a member's Cast to it), or that of the value a member's Cast to float32 read; else DT_F32 (none). */
static DType low_exact(const Graph *g, const Fusion *f, int k, int v)
{
    if (is_low(g->val[v].dtype))
        return g->val[v].dtype;
    for (int j = 0; j < k; j++)
        if (f->member[j].out[0] == v)
            return f->member[j].op == OP_Cast && is_low(g->val[f->member[j].in[0]].dtype)
                       ? g->val[f->member[j].in[0]].dtype
                       : DT_F32;
    return DT_F32;
}

/* The lookup of unary op `of` of member m at operand a, a number of 16-bit type low (grad: its derivative, the
 * gradient at dy = 1) in its table of every value of that type, the table made when it is the first of its kind,
 * type and parameters.  The index: a bfloat16's top half; a float16's bits (k_f16_from_f32: exact, a signalling
 * NaN made quiet). */
static const char *table(Cg *cg, const Node *m, Op of, int grad, DType low, const char *a)
{
    const char *params = cg_unary_params(of, m), *ty = dtype_name(low);
    const char *key = ir_fmt("%s %s KF_%s, %s", grad ? "grad" : "", ty, op_info[of].kname, params);
    int t = 0;
    while (t < cg->ntable && strcmp(cg->table_key[t], key))
        t++;
    if (t == cg->ntable) {
        const char **keys = ir_alloc(sizeof *keys * (size_t)(t + 1));
        if (t)
            memcpy(keys, cg->table_key, sizeof *keys * (size_t)t);
        keys[cg->ntable++] = key;
        cg->table_key = keys;
        cg_put(&cg->tables, "static float kt%d[65536]; /* %s%s at every %s value */\n", t, op_info[of].name,
               grad ? "'s derivative" : "", ty);
        const char *x = ir_fmt("k_%s_to_f32((uint16_t)h)", ty);
        cg_put(&cg->tables_fill, "    for (int h = 0; h < 65536; h++)\n        kt%d[h] = %s;\n", t,
               grad ? ir_fmt("kf_unary_grad_f32(KF_%s, 1, %s, 0, %s)", op_info[of].kname, x, params)
                    : ir_fmt("kf_unary_f32(KF_%s, %s, %s)", op_info[of].kname, x, params));
    }
    return ir_fmt("kt%d[%s(%s)]", t, low == DT_BF16 ? "k_bf16_bits" : "k_f16_from_f32", a);
}

const char *cg_fused_tables(const Cg *cg)
{
    if (!cg->ntable)
        return "";
    return ir_fmt("%s\n/* the tables above, filled at the first step */\nstatic void tables(void)\n{\n"
                  "    static int filled;\n    if (filled)\n        return;\n%s    filled = 1;\n}\n\n",
                  cg->tables.buf, cg->tables_fill.buf);
}

/* the loop body for one element: loads (input i's element: at[i]), members, the store into y (yat).  Every
 * local is of the compute type (float64, or float32 for float32 and 16-bit values); a Cast to 16 bits rounds
 * there. */
static void body(Cg *cg, Buf *b, const Node *n, const char *ind, const char *const *at, const char *yat,
                 const char *sum)
{
    const Graph *g = cg->g;
    const Fusion *f = &g->fusion[ir_attr_i(n, "group", -1)];
    const Value *yv = &g->val[n->out[0]];
    DType ct = yv->dtype == DT_F64 ? DT_F64 : DT_F32;
    const char *T = cg_ctype(ct), *S = cg_sfx(ct);
    for (int i = 0; i < n->nin; i++)
        cg_put(b, "%sconst %s x%d = %s;\n", ind, T, i, load(cg, g->val[n->in[i]].dtype, at[i]));
    for (int k = 0; k < f->n; k++) {
        const Node *m = &f->member[k];
        const char *a = operand(f, k, n, m->in[0]), *e;
        switch (m->op) {
        case OP_Cast: {
            DType to = g->val[m->out[0]].dtype;
            if (to == DT_BF16 && !cg->cuda) /* (kernels.h's k_bf16_round: the same bits in 32-bit lanes) */
                e = ir_fmt("k_bf16_round(%s)", a);
            else
                e = is_low(to) ? ir_fmt("%s(%s(%s))", conv(cg, 1, to), conv(cg, 0, to), a) : a;
            break;
        }
        case OP_Scale: e = ir_fmt("(%s)%.17g * %s", T, ir_attr_f(m, "alpha", 1), a); break;
        case OP_ReduceGrad: { /* dy (an outside input: broadcast by its index), over n for a mean (k_scale's product) */
            int64_t kept = 1;
            const Attr *ys = ir_attr(m, "yshape");
            for (int d = 0; ys && d < ys->n; d++)
                kept *= ys->ints[d];
            const int64_t cnt = value_numel(g, m->out[0]) / (kept ? kept : 1);
            e = ir_attr_i(m, "of", -1) == OP_ReduceMean ? ir_fmt("(%s)%.17g * %s", T, 1.0 / (double)cnt, a) : a;
            break;
        }
        case OP_UnaryGrad: {
            Op of = (Op)ir_attr_i(m, "of", -1);
            const char *x = m->nin > 1 ? operand(f, k, n, m->in[1]) : NULL;
            const char *y = m->nin > 2 ? operand(f, k, n, m->in[2]) : NULL;
            DType xlow = x ? low_exact(g, f, k, m->in[1]) : DT_F32;
            if (!cg->cuda && ct == DT_F32 && ir_tab16(of) && kf_unary_reads(op_info[of].kernel) == KF_READS_X &&
                xlow != DT_F32)
                e = ir_fmt("%s * %s", a, table(cg, m, of, 1, xlow, x));
            else
                e = ir_fmt("kf_unary_grad_%s(KF_%s, %s, %s, %s, %s)", S, op_info[of].kname, a,
                           x ? x : ir_fmt("(%s)0", T), y ? y : ir_fmt("(%s)0", T), cg_unary_params(of, m));
            break;
        }
        default:
            if (!cg->cuda && ct == DT_F32 && ir_tab16(m->op) && low_exact(g, f, k, m->in[0]) != DT_F32)
                e = table(cg, m, m->op, 0, low_exact(g, f, k, m->in[0]), a);
            else if (op_info[m->op].flags & F_BINARY)
                e = ir_fmt("kf_binary_%s(KF_%s, %s, %s)", S, op_info[m->op].kname, a, operand(f, k, n, m->in[1]));
            else
                e = ir_fmt("kf_unary_%s(KF_%s, %s, %s)", S, op_info[m->op].kname, a, cg_unary_params(m->op, m));
        }
        cg_put(b, "%sconst %s t%d = %s; /* %s */\n", ind, T, k, e, cg_comment(m->name));
    }
    /* the root, a Cast to bfloat16, has rounded its value (k_bf16_round above): its bits are stored as they are */
    const char *t = ir_fmt("t%d", f->n - 1);
    if (yv->dtype == DT_BF16 && !cg->cuda && f->member[f->n - 1].op == OP_Cast)
        t = ir_fmt("k_bf16_bits(%s)", t);
    else if (is_low(yv->dtype))
        t = ir_fmt("%s(%s)", conv(cg, 0, yv->dtype), t);
    if (!sum) {
        cg_put(b, "%s%s = %s;\n", ind, yat, t);
        return;
    }
    /* and the stored value, widened, into the column's sum */
    cg_put(b, "%sconst %s s = %s;\n%s%s = s;\n%s%s += %s;\n", ind, cg_ctype(yv->dtype), t, ind, yat, ind, sum,
           load(cg, yv->dtype, "s"));
}

/* the elements of every input at flat output position i (the flat loop's loads) */
static const char *const *flat_at(const Graph *g, const Node *n, const Shape *y)
{
    const char **at = ir_alloc(sizeof *at * (size_t)(n->nin + 1));
    for (int i = 0; i < n->nin; i++)
        at[i] = ir_fmt("in%d[%s]", i, index_expr(g, n->in[i], y, y->rank, 1, "i"));
    return at;
}

/* The widest column tile of a loop with column sums (its double accumulators on the stack: 16 KB) */
#define COLSUM_TILE 2048

/* cpu, a loop that also writes its output's column sums (out 1: passes/fuse.c column_sums, a bias gradient):
 * split into a column tile per thread of the team (at least a vector of 16 columns, at most COLSUM_TILE), each
 * walking the rows in order and adding each stored element, widened, into its column's double, as k_reduce's
 * reduce_outer does: the sums have k_reduce_sum_to's bits whatever the split or the tile.  The inner loop runs
 * along a row of the tile, indexing each input by j or by nothing (every input reads the last dim as the output
 * does or not at all).  (Tiles of a fixed 16-32 columns, walked row by row, ran 2.5x slower: a GPT's residual
 * gradient with its bias gradient 478 us against 186 for the Add and the reduction apart.) */
static void emit_column_sums(Cg *cg, Buf *b, const Node *n, const char *T)
{
    const Graph *g = cg->g;
    const Value *yv = &g->val[n->out[0]];
    const Shape *ys = &yv->shape;
    const int64_t cols = ys->dim[ys->rank - 1], rows = value_numel(g, n->out[0]) / cols;
    const int64_t cap = (cols + 15) / 16 * 16 < COLSUM_TILE ? (cols + 15) / 16 * 16 : COLSUM_TILE;
    cg_put(b, "      %s *cs = %s;\n", cg_ctype(g->val[n->out[1]].dtype), cg_ptr(cg, n->out[1]));
    if (!cg->team && rows * cols >= K_PAR_MIN)
        cg_put(b, "      _Pragma(\"omp parallel\")\n");
    cg_put(b, "      { const long long per = (%lldLL + k_team_threads() - 1) / k_team_threads(),\n"
              "                      tile = per <= 16 ? 16 : per >= %lldLL ? %lldLL : (per + 15) / 16 * 16;\n",
           (long long)cols, (long long)cap, (long long)cap);
    cg_put(b, "      _Pragma(\"omp for schedule(static) nowait\")\n"); /* each tile alike however they are split */
    cg_put(b, "      for (long long c0 = 0; c0 < %lldLL; c0 += tile) {\n", (long long)cols);
    cg_put(b, "        const long long w = c0 + tile <= %lldLL ? tile : %lldLL - c0;\n", (long long)cols,
           (long long)cols);
    cg_put(b, "        double acc[%lld];\n        for (long long j = 0; j < w; j++)\n          acc[j] = 0;\n",
           (long long)cap);
    cg_put(b, "        for (long long o = 0; o < %lldLL; o++) {\n", (long long)rows);
    const char **at = ir_alloc(sizeof *at * (size_t)(n->nin + 1));
    for (int i = 0; i < n->nin; i++) {
        const int dense = inner_mode(g, n->in[i], ys, ys->rank - 1) == 1;
        cg_put(b, "          const %s *p%d = in%d + %s%s;\n", cg_ctype(g->val[n->in[i]].dtype), i, i,
               index_expr(g, n->in[i], ys, ys->rank - 1, cols, "o"), dense ? " + c0" : "");
        at[i] = ir_fmt(dense ? "p%d[j]" : "p%d[0]", i);
    }
    cg_put(b, "          %s *yo = y + o * %lldLL + c0;\n", T, (long long)cols);
    cg_put(b, "          for (long long j = 0; j < w; j++) {\n");
    body(cg, b, n, "            ", at, "yo[j]", "acc[j]");
    cg_put(b, "          }\n        }\n");
    cg_put(b, "        for (long long j = 0; j < w; j++)\n          cs[c0 + j] = (%s)acc[j];\n      } } }\n",
           cg_ctype(g->val[n->out[1]].dtype));
}

void cg_emit_fused(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Value *yv = &g->val[n->out[0]];
    const char *T = cg_ctype(yv->dtype);
    int64_t total = value_numel(g, n->out[0]);
    cg_put(b, "    /* fused: %s */\n", cg_comment(ir_attr(n, "ops")->s));
    if (!total)
        return;
    if (!cg->cuda) {
        cg_put(b, "    { %s *y = %s;\n", T, cg_ptr(cg, n->out[0]));
        for (int i = 0; i < n->nin; i++)
            cg_put(b, "      const %s *in%d = %s;\n", cg_ctype(g->val[n->in[i]].dtype), i, cg_ptr(cg, n->in[i]));
        if (n->nout > 1) {
            emit_column_sums(cg, b, n, T);
            return;
        }
        if (cg->team) /* elementwise: each element alike however the range is split */
            cg_put(b, "      _Pragma(\"omp for schedule(static) nowait\")\n");
        else if (total >= K_PAR_MIN)
            cg_put(b, "      _Pragma(\"omp parallel for schedule(static)\")\n");
        const Shape *ys = &yv->shape;
        const int c = inner_dim(g, n, ys);
        int64_t inner = 1;
        for (int d = c; d < ys->rank; d++)
            inner *= ys->dim[d];
        if (c == ys->rank || inner < 8) { /* one flat loop */
            cg_put(b, "      for (long long i = 0; i < %lldLL; i++) {\n", (long long)total);
            body(cg, b, n, "        ", flat_at(g, n, ys), "y[i]", NULL);
            cg_put(b, "      } }\n");
            return;
        }
        /* a nest: position o of dims [0, c), then its inner elements j, each input at a base per o */
        const char **at = ir_alloc(sizeof *at * (size_t)(n->nin + 1));
        cg_put(b, "      for (long long o = 0; o < %lldLL; o++) {\n", (long long)(total / inner));
        for (int i = 0; i < n->nin; i++) {
            cg_put(b, "        const %s *p%d = in%d + %s;\n", cg_ctype(g->val[n->in[i]].dtype), i, i,
                   index_expr(g, n->in[i], ys, c, inner, "o"));
            at[i] = ir_fmt(inner_mode(g, n->in[i], ys, c) ? "p%d[j]" : "p%d[0]", i);
        }
        cg_put(b, "        %s *yo = y + o * %lldLL;\n", T, (long long)inner);
        cg_put(b, "        for (long long j = 0; j < %lldLL; j++) {\n", (long long)inner);
        body(cg, b, n, "          ", at, "yo[j]", NULL);
        cg_put(b, "        } } }\n");
        return;
    }
    /* cuda: the kernel, then its launch (no column sums: passes/fuse.c leaves cuda's bias gradients alone) */
    if (n->nout > 1)
        die("fused loop '%s' with column sums on cuda", cg_comment(n->name));
    int k = cg->nfused++;
    Buf *s = &cg->fused_src;
    cg_put(s, "extern \"C\" __global__ void fsdpc_fused%d(%s *y", k, T);
    for (int i = 0; i < n->nin; i++)
        cg_put(s, ", const %s *in%d", cg_ctype(g->val[n->in[i]].dtype), i);
    cg_put(s, ", long long n)\n{\n    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
              "         i += (long long)gridDim.x * blockDim.x) {\n");
    body(cg, s, n, "        ", flat_at(g, n, &yv->shape), "y[i]", NULL);
    cg_put(s, "    }\n}\n\n");
    int64_t grid = (total + 255) / 256;
    grid = grid > 8192 ? 8192 : grid;
    cg_put(b, "    { %s *y = %s;\n", T, cg_ptr(cg, n->out[0]));
    for (int i = 0; i < n->nin; i++)
        cg_put(b, "      const %s *in%d = %s;\n", cg_ctype(g->val[n->in[i]].dtype), i, cg_ptr(cg, n->in[i]));
    cg_put(b, "      long long n = %lldLL;\n      void *args[] = {&y", (long long)total);
    for (int i = 0; i < n->nin; i++)
        cg_put(b, ", &in%d", i);
    cg_put(b, ", &n};\n      kc_launch(KC_COUNT + %d, %lld, 256, 0, args); }\n", k, (long long)grid);
}
