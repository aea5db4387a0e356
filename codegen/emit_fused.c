/* emit_fused.c — the code of a Fused node (passes/fuse.c): one loop over
 * the output's elements that loads each outside input once (broadcast by
 * index arithmetic on compile-time constants), computes every member node
 * into a local with kernels/c/fused.h, and stores the root's value.  Under
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

/* index of input v (broadcast into shape y) at flat output position i */
static const char *index_expr(const Graph *g, int v, const Shape *y)
{
    const Shape *s = &g->val[v].shape;
    int r = y->rank;
    int64_t st[MAX_RANK], ost[MAX_RANK], acc = 1, oacc = 1;
    for (int d = r - 1; d >= 0; d--) {
        int ia = d - (r - s->rank);
        int64_t dim = ia >= 0 ? s->dim[ia] : 1;
        st[d] = dim == 1 ? 0 : acc;
        acc *= dim;
        ost[d] = oacc;
        oacc *= y->dim[d];
    }
    int dense = 1, zero = 1;
    for (int d = 0; d < r; d++) {
        dense &= st[d] == ost[d] || y->dim[d] == 1;
        zero &= st[d] == 0 || y->dim[d] == 1;
    }
    if (zero)
        return "0";
    if (dense)
        return "i";
    Buf b = {0};
    for (int d = 0; d < r; d++) {
        if (st[d] == 0 || y->dim[d] == 1)
            continue;
        const char *pos = d == 0 ? ir_fmt("i / %lldLL", (long long)ost[d])
                                 : ost[d] == 1 ? ir_fmt("i %% %lldLL", (long long)y->dim[d])
                                               : ir_fmt("i / %lldLL %% %lldLL", (long long)ost[d], (long long)y->dim[d]);
        cg_put(&b, "%s(%s) * %lldLL", b.len ? " + " : "", pos, (long long)st[d]);
    }
    return b.buf;
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

/* the loop body for element i: loads, members, the store into y.  Every local is of the compute type
 * (float64, or float32 for float32 and 16-bit values); a Cast to 16 bits rounds there. */
static void body(Cg *cg, Buf *b, const Node *n, const char *ind)
{
    const Graph *g = cg->g;
    const Fusion *f = &g->fusion[ir_attr_i(n, "group", -1)];
    const Value *yv = &g->val[n->out[0]];
    DType ct = yv->dtype == DT_F64 ? DT_F64 : DT_F32;
    const char *T = cg_ctype(ct), *S = cg_sfx(ct);
    for (int i = 0; i < n->nin; i++) {
        DType t = g->val[n->in[i]].dtype;
        cg_put(b, "%sconst %s x%d = %s;\n", ind, T, i,
               load(cg, t, ir_fmt("in%d[%s]", i, index_expr(g, n->in[i], &yv->shape))));
    }
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
    cg_put(b, "%sy[i] = %s;\n", ind, t);
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
        if (cg->team) /* elementwise: each i alike however the range is split */
            cg_put(b, "      _Pragma(\"omp for schedule(static) nowait\")\n");
        else if (total >= K_PAR_MIN)
            cg_put(b, "      _Pragma(\"omp parallel for schedule(static)\")\n");
        cg_put(b, "      for (long long i = 0; i < %lldLL; i++) {\n", (long long)total);
        body(cg, b, n, "        ");
        cg_put(b, "      } }\n");
        return;
    }
    /* cuda: the kernel, then its launch */
    int k = cg->nfused++;
    Buf *s = &cg->fused_src;
    cg_put(s, "extern \"C\" __global__ void fsdpc_fused%d(%s *y", k, T);
    for (int i = 0; i < n->nin; i++)
        cg_put(s, ", const %s *in%d", cg_ctype(g->val[n->in[i]].dtype), i);
    cg_put(s, ", long long n)\n{\n    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
              "         i += (long long)gridDim.x * blockDim.x) {\n");
    body(cg, s, n, "        ");
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
