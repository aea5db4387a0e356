/* emit_fused.c — the code of a Fused node (passes/fuse.c): one loop over
 * the output's elements that loads each outside input once (broadcast by
 * index arithmetic on compile-time constants), computes every member node
 * into a local with kernels/c/fused.h, and stores the root's value.  Under
 * --precision bf16 / fp16 a loop may load 16-bit inputs (widened), round at
 * a member Cast to 16 bits, and store a 16-bit result: every local is of the
 * compute type, float32 (float64 for float64 loops).
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
            e = ir_fmt("kf_unary_grad_%s(KF_%s, %s, %s, %s, %s)", S, op_info[of].kname, a,
                       x ? x : ir_fmt("(%s)0", T), y ? y : ir_fmt("(%s)0", T), cg_unary_params(of, m));
            break;
        }
        default:
            if (op_info[m->op].flags & F_BINARY)
                e = ir_fmt("kf_binary_%s(KF_%s, %s, %s)", S, op_info[m->op].kname, a, operand(f, k, n, m->in[1]));
            else
                e = ir_fmt("kf_unary_%s(KF_%s, %s, %s)", S, op_info[m->op].kname, a, cg_unary_params(m->op, m));
        }
        cg_put(b, "%sconst %s t%d = %s; /* %s */\n", ind, T, k, e, cg_comment(m->name));
    }
    const char *t = ir_fmt("t%d", f->n - 1);
    cg_put(b, "%sy[i] = %s;\n", ind, is_low(yv->dtype) ? ir_fmt("%s(%s)", conv(cg, 0, yv->dtype), t) : t);
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
