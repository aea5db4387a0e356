/* emit.c — C text for one node of the step (the core op set), and the
 * helpers every codegen file shares (codegen/cg.h).
 *
 * Each node becomes one kernel or collective call with pointers from the
 * static plan, each a named tensor (below: t_ + its ONNX name, declared with
 * its shape at the top of the function using it); a GEMM's geometry is an
 * RtGemm descriptor (runtime/rt.h).  Model names reach the C text only
 * through cg_cstr (escaped string literals), cg_comment (sanitised comments)
 * and c_ident (identifiers of letters, digits and '_').
 */
#include "cg.h"

#include <stdarg.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>


void cg_put(Buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *nb = ir_alloc(cap);
        if (b->len)
            memcpy(nb, b->buf, b->len);
        b->buf = nb;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A C string literal for any bytes: only [A-Za-z0-9_ .,:/@-] pass through. */
const char *cg_cstr(const char *s)
{
    char *o = ir_alloc(strlen(s) * 4 + 3), *p = o;
    *p++ = '"';
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            strchr("_ .,:/@-", ch))
            *p++ = (char)ch;
        else
            p += sprintf(p, "\\%03o", ch);
    }
    *p++ = '"';
    *p = 0;
    return o;
}

/* Text safe inside a C comment: printable ASCII but '*' (so neither the comment's end nor a nested start can
 * form), '\\' and '?' (no line splice, no trigraph); anything else becomes '_'. */
const char *cg_comment(const char *s)
{
    char *o = ir_strdup(s);
    for (char *p = o; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (ch < 0x20 || ch > 0x7e || strchr("*\\?", ch))
            *p = '_';
    }
    return o;
}

const char *cg_ctype(DType t)
{
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) case DT_##name: return #ctype;
#include "dtypes.def"
    default: die("no C type for dtype %d", t);
    }
}

const char *cg_kdt(DType t)
{
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) case DT_##name: return #kdt;
#include "dtypes.def"
    default: die("no kernel dtype for %s", dtype_name(t));
    }
}

const char *cg_sfx(DType t) { return t == DT_F64 ? "f64" : "f32"; }

const char *cg_gemm_sfx(DType operand, DType result)
{
    return operand == DT_BF16 ? "bf16" : operand == DT_F16 ? "f16" : cg_sfx(result);
}

static void cg_check(Cg *cg, const char *msg)
{
    /* room for 16, then doubled when full: a function of the count alone (a Cg starts at 0) */
    if (!cg->ncheck || (cg->ncheck >= 16 && !(cg->ncheck & (cg->ncheck - 1)))) {
        int cap = cg->ncheck ? 2 * cg->ncheck : 16;
        const char **n = ir_alloc(sizeof(char *) * (size_t)cap);
        if (cg->ncheck)
            memcpy(n, cg->checks, sizeof(char *) * (size_t)cg->ncheck);
        cg->checks = n;
    }
    cg->checks[cg->ncheck++] = msg;
}

void cg_check_end(Cg *cg, Buf *b, const char *cpu_test, const char *device_msg)
{
    if (!cg->cuda) {
        cg_put(b, "%s", cpu_test);
        return;
    }
    cg_check(cg, device_msg); /* the launcher returned -1 and the kernel records the first bad position */
    cg_put(b, "      (void)bad; }\n");
}

Shape cg_attr_shape(const Node *n, const char *name)
{
    const Attr *a = ir_attr(n, name);
    Shape s = {a ? a->n : 0, {0}};
    for (int i = 0; a && i < a->n && i < MAX_RANK; i++)
        s.dim[i] = a->ints[i];
    return s;
}

/* ---- named tensors ---------------------------------------------------------------------------------------
 * Every value the emitted C touches has a name: t_ and its ONNX name made a C identifier (only [A-Za-z0-9_],
 * at most 60 characters, a _2, _3 ... suffix where two would be equal).  A function of the step declares the
 * values it uses at its top, each a constant pointer with its dtype, shape and ONNX name in a comment; cg_ptr
 * returns the name and records the use.  The t_ prefix keeps them apart from everything else in the text
 * (kernels, locals, C keywords). */

/* s made a C identifier: t_, then its letters and digits, runs of anything else as one '_' */
static char *c_ident(const char *s)
{
    char *o = ir_alloc(strlen(s) + 3 + 1), *p = o + 2;
    memcpy(o, "t_", 2);
    for (; *s && p - o < 62; s++) {
        unsigned char ch = (unsigned char)*s;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        if (ok)
            *p++ = (char)ch;
        else if (p[-1] != '_')
            *p++ = '_';
    }
    while (p > o + 2 && p[-1] == '_')
        p--;
    *p = 0;
    return o;
}

static uint64_t str_hash(const char *s)
{
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* insert s into the open-addressed set tab (size mask + 1); 0 if it was there */
static int set_add(const char **tab, uint64_t mask, const char *s)
{
    for (uint64_t i = str_hash(s) & mask;; i = (i + 1) & mask) {
        if (!tab[i]) {
            tab[i] = s;
            return 1;
        }
        if (!strcmp(tab[i], s))
            return 0;
    }
}

void cg_name_tensors(Cg *cg)
{
    const Graph *g = cg->g;
    uint64_t size = 16;
    while (size < 2 * (uint64_t)g->nval + 2)
        size *= 2;
    const char **tab = ir_alloc(sizeof(char *) * size);
    const char **tname = ir_alloc(sizeof(char *) * ((size_t)g->nval + 1));
    for (int v = 0; v < g->nval; v++) {
        const char *base = c_ident(g->val[v].name), *n = base;
        for (int k = 2; !set_add(tab, size - 1, n); k++)
            n = ir_fmt("%s_%d", base, k);
        tname[v] = n;
    }
    cg->tname = tname;
    CgUses *u[] = {&cg->fn, &cg->job};
    for (int i = 0; i < 2; i++)
        *u[i] = (CgUses){.mark = ir_alloc(sizeof(int) * ((size_t)g->nval + 1)), .stamp = 0};
    cg->cur = &cg->fn;
}

/* the pointer expression of value v's place, typed */
static const char *place(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    const Loc *l = &x->loc;
    const char *t = cg_ctype(x->dtype);
    switch (l->kind) {
    case LOC_ARENA: return ir_fmt("(%s *)(A + %lld)", t, (long long)l->off);
    case LOC_SLOT:
        if (l->alias) /* the shard itself when the executable decided so (c->slot_alias: a group of one rank) */
            return ir_fmt("(%s *)((c->slot_alias & %d) ? c->dev_shard[%d * RT_NSTATE + %d] + %lld : c->dev_slot[%d] + "
                          "%lld)", t, l->alias, l->unit, l->state, (long long)l->off, l->slot, (long long)l->off);
        return ir_fmt("(%s *)(c->dev_slot[%d] + %lld)", t, l->slot, (long long)l->off);
    case LOC_SHARD: /* off: a parameter view of a NO_SHARD shard */
        return ir_fmt("(%s *)(c->dev_shard[%d * RT_NSTATE + %d] + %lld)", t, l->unit, l->state, (long long)l->off);
    default: die("value '%s' has no place in memory", x->name);
    }
}

/* value v's name, used by the function being emitted */
const char *cg_ptr(Cg *cg, int v)
{
    CgUses *cur = cg->cur;
    if (cg->g->val[v].loc.kind == LOC_NONE)
        die("value '%s' has no place in memory", cg->g->val[v].name);
    if (cur->mark[v] != cur->stamp) {
        cur->mark[v] = cur->stamp;
        if (cur->n == cur->cap) {
            cur->cap = cur->cap ? 2 * cur->cap : 64;
            int *l = ir_alloc(sizeof(int) * (size_t)cur->cap);
            if (cur->n)
                memcpy(l, cur->list, sizeof(int) * (size_t)cur->n);
            cur->list = l;
        }
        cur->list[cur->n++] = v;
    }
    return cg->tname[v];
}

/* a function's body begins: job 1 for a collective's job (emitted while a step function is) */
void cg_fn_begin(Cg *cg, int job)
{
    cg->cur = job ? &cg->job : &cg->fn;
    cg->cur->stamp++;
    cg->cur->n = 0;
}

static int by_id(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* the declarations of the values the function's body used (cg_fn_begin), in value order, into b; then back to
 * the step's function */
void cg_fn_decls(Cg *cg, Buf *b)
{
    const Graph *g = cg->g;
    const CgUses *cur = cg->cur;
    int arena = 0;
    if (cur->n > 1) /* (a function may use no value: qsort takes no NULL) */
        qsort(cur->list, (size_t)cur->n, sizeof(int), by_id);
    for (int i = 0; i < cur->n; i++)
        arena |= g->val[cur->list[i]].loc.kind == LOC_ARENA;
    if (arena)
        cg_put(b, "    char *const A = c->dev_arena;\n");
    for (int i = 0; i < cur->n; i++) {
        const Value *x = &g->val[cur->list[i]];
        Buf sh = {0};
        for (int d = 0; d < x->shape.rank; d++)
            cg_put(&sh, "%s%lld", d ? ", " : "", (long long)x->shape.dim[d]);
        cg_put(b, "    %s *const %s = %s; /* %s [%s] %s */\n", cg_ctype(x->dtype), cg->tname[cur->list[i]],
               place(g, cur->list[i]), dtype_name(x->dtype), sh.buf ? sh.buf : "", cg_comment(x->name));
    }
    cg->cur = &cg->fn;
}

int cg_same_place(const Graph *g, int a, int b)
{
    const Loc *x = &g->val[a].loc, *y = &g->val[b].loc;
    return x->kind == y->kind && x->slot == y->slot && x->unit == y->unit && x->state == y->state &&
           x->off == y->off;
}

const char *cg_ints(const int64_t *v, int n)
{
    Buf b = {0};
    cg_put(&b, "{");
    for (int i = 0; i < n; i++)
        cg_put(&b, i ? ", %lld" : "%lld", (long long)v[i]);
    cg_put(&b, n ? "}" : "0}");
    return b.buf;
}

/* A MatMul's batch, split where its operands broadcast: the output's batch
 * dims [0, p) are looped over (outer[] their sizes, oa[] / ob[] each
 * operand's matrix stride per dim, 0 where it broadcasts) and dims [p, nb)
 * are one strided batch of `inner` GEMMs in which each operand is either
 * every matrix or one (stride 0).  No partial broadcast: p = 0, one call. */
typedef struct {
    int p;
    int64_t outer[MAX_RANK], oa[MAX_RANK], ob[MAX_RANK], inner, nouter;
    int a_inner, b_inner; /* the operand varies over the inner dims */
} MatBatch;

/* Operand x's matrix strides over the output's nb batch dims (0: broadcast). */
static void batch_strides(const Shape *x, const Shape *y, int nb, int64_t *st)
{
    int64_t acc = 1;
    for (int d = nb - 1; d >= 0; d--) {
        int k = d - (nb - (x->rank - 2));
        int64_t xd = k >= 0 ? x->dim[k] : 1;
        st[d] = xd == 1 && y->dim[d] != 1 ? 0 : acc;
        acc *= xd;
    }
}

static MatBatch mat_batch(const Shape *sa, const Shape *sb, const Shape *sy)
{
    MatBatch mb = {.inner = 1, .nouter = 1};
    int nb = sy->rank - 2;
    int64_t sta[MAX_RANK], stb[MAX_RANK];
    batch_strides(sa, sy, nb, sta);
    batch_strides(sb, sy, nb, stb);
    /* the inner dims: the longest suffix over which each operand is all there or all broadcast */
    int p = nb, a_in = -1, b_in = -1;
    for (; p > 0; p--) {
        int d = p - 1, av = sta[d] != 0, bv = stb[d] != 0;
        if (sy->dim[d] == 1)
            continue; /* a size-1 dim goes either way */
        if ((a_in >= 0 && av != a_in) || (b_in >= 0 && bv != b_in))
            break;
        a_in = av, b_in = bv;
    }
    mb.p = p;
    mb.a_inner = a_in > 0, mb.b_inner = b_in > 0;
    for (int d = p; d < nb; d++)
        mb.inner *= sy->dim[d];
    for (int d = 0; d < p; d++) {
        mb.outer[d] = sy->dim[d], mb.oa[d] = sta[d], mb.ob[d] = stb[d];
        mb.nouter *= sy->dim[d];
    }
    return mb;
}

/* a GEMM's descriptor (RtGemm, runtime/rt.h) as a static of the block it opens */
static void gemm_desc(Buf *b, int64_t batch, int64_t sa, int64_t sb, int64_t m, int64_t n, int64_t k, int ta, int tb,
                      double alpha, double beta)
{
    cg_put(b, "    { static const RtGemm gm = {.batch = %lld, .stride_a = %lld, .stride_b = %lld, .m = %lld, .n = %lld, "
              ".k = %lld, .trans_a = %d, .trans_b = %d, .alpha = %.17g, .beta = %.17g};\n", (long long)batch,
           (long long)sa, (long long)sb, (long long)m, (long long)n, (long long)k, ta, tb, alpha, beta);
}

/* A MatMulAdd with a 16-bit output and a float32 scratch (fuse.c's gemm_low_out): the output's rows in
 * blocks of the scratch's (the descriptor's m), each a GEMM into the scratch and a rounding into place (cpu:
 * k_matmul_add_rows_bf16 / _f16, which loop so themselves) */
static void emit_matmul_rows(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    const Shape *sy = &g->val[n->out[0]].shape, *ss = &g->val[n->out[1]].shape;
    int64_t cols = sy->dim[sy->rank - 1], rows = value_numel(g, n->out[0]) / cols, block = ss->dim[0];
    int64_t k = g->val[n->in[0]].shape.dim[g->val[n->in[0]].shape.rank - 1];
    int tb = (int)ir_attr_i(n, "transB", 0);
    const Value *yv = &g->val[n->out[0]];
    const char *s = cg_gemm_sfx(g->val[n->in[0]].dtype, DT_F32), *w = cg_ptr(cg, n->out[1]);
    gemm_desc(b, 1, 0, 0, block, cols, k, 0, tb, ir_attr_f(n, "alpha", 1.0), 0);
    DType dt = g->val[n->in[0]].dtype;
    if (!cg->cuda && (dt == DT_BF16 || dt == DT_F16) && yv->dtype == dt && g->val[n->in[1]].dtype == dt) {
        /* the loop below inside the kernel: one parallel region where it is widened */
        cg_put(b, "      k_matmul_add_rows_%s(%s, %s, gm.m, %s, %s, %s, %s, gm.alpha, %lldLL, gm.n, gm.k, gm.trans_b); }\n",
               s, cg_ptr(cg, n->out[0]), w, cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]),
               n->in[2] >= 0 ? cg_ptr(cg, n->in[2]) : "NULL", n->in[3] >= 0 ? cg_ptr(cg, n->in[3]) : "NULL",
               (long long)rows);
        return;
    }
    cg_put(b, "      for (int64_t r0 = 0; r0 < %lldLL; r0 += gm.m) {\n", (long long)rows);
    cg_put(b, "        RtGemm part = gm;\n        part.m = %lldLL - r0 < gm.m ? %lldLL - r0 : gm.m;\n",
           (long long)rows, (long long)rows);
    cg_put(b, "        k_matmul_add_%s(%s, %s + r0 * gm.k, %s, %s, ", s, w, cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]),
           n->in[2] >= 0 ? cg_ptr(cg, n->in[2]) : "NULL");
    if (n->in[3] >= 0)
        cg_put(b, "%s + r0 * gm.n, ", cg_ptr(cg, n->in[3]));
    else
        cg_put(b, "NULL, ");
    cg_put(b, "gm.alpha, RT_GEMM(part));\n");
    cg_put(b, "        k_cast(%s, %s + r0 * gm.n, %s, %s, part.m * gm.n);\n      } }\n", cg_kdt(yv->dtype),
           cg_ptr(cg, n->out[0]), cg_kdt(DT_F32), w);
}

static void emit_matmul(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    if (n->nout > 1 && n->out[1] >= 0) {
        emit_matmul_rows(cg, b, n);
        return;
    }
    const Shape *sa = &g->val[n->in[0]].shape, *sb = &g->val[n->in[1]].shape;
    const Shape *sy = &g->val[n->out[0]].shape;
    int ta = (int)ir_attr_i(n, "transA", 0), tb = (int)ir_attr_i(n, "transB", 0);
    int64_t m = sy->dim[sy->rank - 2], nn = sy->dim[sy->rank - 1];
    int64_t k = sa->dim[sa->rank - (ta ? 2 : 1)];
    MatBatch mb = mat_batch(sa, sb, sy);
    int64_t strA = mb.a_inner ? m * k : 0, strB = mb.b_inner ? k * nn : 0;
    /* --precision bf16 / fp16: 16-bit operands, float32 result */
    const char *s = cg_gemm_sfx(g->val[n->in[0]].dtype, g->val[n->out[0]].dtype);
    const char *y = cg_ptr(cg, n->out[0]), *a = cg_ptr(cg, n->in[0]), *bb = cg_ptr(cg, n->in[1]);
    const char *add = n->op == OP_MatMulAdd && n->in[3] >= 0 ? cg_ptr(cg, n->in[3]) : "NULL";
    gemm_desc(b, mb.inner, strA, strB, m, nn, k, ta, tb, n->op == OP_MatMulAdd ? ir_attr_f(n, "alpha", 1.0) : 1, 0);
    const char *ind = "      ";
    if (mb.p > 0) { /* partially broadcast: a loop over the outer batch dims (offsets in matrices) */
        cg_put(b, "      static const int64_t osh[] = %s, oa[] = %s, ob[] = %s;\n", cg_ints(mb.outer, mb.p),
               cg_ints(mb.oa, mb.p), cg_ints(mb.ob, mb.p));
        cg_put(b, "      for (int64_t o = 0; o < %lld; o++) {\n        int64_t r = o, ia = 0, ib = 0;\n"
                  "        for (int d = %d; d >= 0; d--) { ia += r %% osh[d] * oa[d]; ib += r %% osh[d] * ob[d]; "
                  "r /= osh[d]; }\n", (long long)mb.nouter, mb.p - 1);
        const char *yo = ir_fmt("o * %lld", (long long)(mb.inner * m * nn));
        y = ir_fmt("%s + %s", y, yo);
        a = ir_fmt("%s + ia * %lld", a, (long long)(m * k));
        bb = ir_fmt("%s + ib * %lld", bb, (long long)(k * nn));
        if (strcmp(add, "NULL"))
            add = ir_fmt("%s + %s", add, yo);
        ind = "        ";
    }
    if (n->op == OP_MatMulAdd) /* the epilogue's bias and addend, or NULL */
        cg_put(b, "%sk_matmul_add_%s(%s, %s, %s, %s, %s, gm.alpha, RT_GEMM(gm));\n", ind, s, y, a, bb,
               n->in[2] >= 0 ? cg_ptr(cg, n->in[2]) : "NULL", add);
    else
        cg_put(b, "%sk_matmul_%s(%s, %s, %s, RT_GEMM(gm), gm.beta);\n", ind, s, y, a, bb);
    cg_put(b, mb.p > 0 ? "      } }\n" : "    }\n");
}

/* The kernels' code of an elementwise op ("K_RELU": its row in kernels/c/fused.h, ops.def's EW1 / EW2). */
const char *cg_kernel_op(Op op)
{
    if (!(op_info[op].flags & (F_UNARY | F_BINARY)))
        die("%s is not an elementwise op", op_info[op].name);
    return ir_fmt("K_%s", op_info[op].kname);
}

/* After the reduce-scatter of flat gradient x into this rank's piece of it: the gradient shard y is that
 * piece (micro-step 0) or the sum of the micro-steps' (--accum-mode comm: k_grad_accum, which on the cuda target
 * reads the micro-step from the step parameters, a captured graph being replayed at every micro-step); with
 * --accum-mode local (c->dev_acc) a copy of the piece of the unit's summed gradient, after the last micro-step
 * only */
static void emit_grad_accum(Cg *cg, Buf *b, int x, int y, int unit)
{
    const Graph *g = cg->g;
    DType dt = g->val[x].dtype;
    int sz = (int)dtype_size(dt);
    if (g->val[x].loc.alias) /* the flat gradient reduced in the gradient shard itself */
        cg_put(b, "    if (!(c->slot_alias & %d))\n", g->val[x].loc.alias);
    const char *mine = ir_fmt("(int64_t)c->srank * c->shard_len[%d] * %d", unit, sz); /* the piece's offset */
    cg_put(b, "    {\n      if (!c->dev_acc)\n        k_grad_accum_%s(%s, (%s *)((char *)%s + %s), c->shard_len[%d], "
           "c->micro);\n", cg_sfx(dt), cg_ptr(cg, y), cg_ctype(dt), cg_ptr(cg, x), mine, unit);
    /* in a team (cg->team) every thread adds its share (k_grad_accum shares), the first copies */
    cg_put(b, "      else if (c->micro + 1 == c->accum)%s\n        rt_memcpy(%s, c->dev_acc[%d] + %s, c->shard_len[%d] * "
           "%d);%s\n    }\n", cg->team ? " {\n        _Pragma(\"omp master\")" : "", cg_ptr(cg, y), unit, mine, unit, sz,
           cg->team ? " }" : "");
}

/* a collective's start or wait (node n's) on the first thread of a run's team (cg->team, codegen/team.c), the
 * step's own thread, not sharing (a job that runs at once on it calls kernels whole), the other threads going on,
 * with --trace's mark of n at once (exe.c adds it after the plain text); after a wait, a barrier, so that every
 * thread sees what it brought */
static void team_coll(Cg *cg, Buf *b, const Node *n, const char *call, int wait)
{
    if (cg->team)
        cg_put(b, "    _Pragma(\"omp master\")\n    { k_share(0);\n    %s\n      RT_TRACE(c, %d);\n      k_share(1); }\n%s",
               call, (int)(n - cg->g->node), wait ? "    _Pragma(\"omp barrier\")\n" : "");
    else
        cg_put(b, "    %s\n", call);
}

/* the collective's own code: the calls its job runs */
static void emit_collective_body(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int x = n->in[0], y = n->out[0];
    DType dt = g->val[y].dtype;
    int64_t ny = value_numel(g, y);
    switch (n->op) {
    case OP_AllGather:
        if (g->val[x].dtype != dt) { /* --precision: round this rank's piece into place, gather in place */
            cg_put(b, "    { char *mine = (char *)%s + (int64_t)c->srank * c->shard_len[%d] * %d;\n", cg_ptr(cg, y),
                n->unit, (int)dtype_size(dt));
            cg_put(b, "      k_cast(%s, mine, %s, %s, c->shard_len[%d]);\n", cg_kdt(dt), cg_kdt(g->val[x].dtype),
                cg_ptr(cg, x), n->unit);
            cg_put(b, "      rt_allgather(c, %s, mine, c->shard_len[%d], %d); }\n", cg_ptr(cg, y), n->unit, dt);
            break;
        }
        if (g->val[y].loc.alias) /* a group of one rank: the gathered parameters are the shard */
            cg_put(b, "    if (c->slot_alias & %d)\n        return;\n", g->val[y].loc.alias);
        cg_put(b, "    rt_allgather(c, %s, %s, c->shard_len[%d], %d);\n", cg_ptr(cg, y), cg_ptr(cg, x), n->unit, dt);
        break;
    case OP_ReduceScatter: {
        /* in place, into this rank's piece of the flat gradient (accumulated into the shard after it);
         * --accum-mode local: summed into the unit's unsharded gradient, which is reduced after the last
         * micro-step */
        dt = g->val[x].dtype;
        const char *T = cg_ctype(dt);
        int64_t numel = g->unit[n->unit].numel;
        cg_put(b, "    %s *full = %s;\n", T, cg_ptr(cg, x));
        cg_put(b, "    if (c->dev_acc) {\n      k_grad_accum_%s((%s *)c->dev_acc[%d], full, %lld, c->micro);\n"
               "      if (c->micro + 1 < c->accum)\n        return;\n      full = (%s *)c->dev_acc[%d];\n    }\n",
               cg_sfx(dt), T, n->unit, (long long)numel, T, n->unit);
        cg_put(b, "    %s *mine = (%s *)((char *)full + (int64_t)c->srank * c->shard_len[%d] * %d);\n", T, T, n->unit,
            (int)dtype_size(dt));
        if (n->nout == 2) /* --reduce-dtype bf16: reduced in the bf16 buffer */
            cg_put(b, "    rt_reduce_scatter_avg_bf16(c, mine, full, %s, %lld, c->shard_len[%d]);\n",
                cg_ptr(cg, n->out[1]), (long long)numel, n->unit);
        else
            cg_put(b, "    rt_reduce_scatter_avg(c, mine, full, %lld, c->shard_len[%d], %d);\n", (long long)numel,
                n->unit, dt);
        break;
    }
    default: /* AllReduce: the mean, or the sum (the gradient norm's) */
        cg_put(b, "    rt_memcpy(%s, %s, %lld);\n", cg_ptr(cg, y), cg_ptr(cg, x), (long long)(ny * (int64_t)dtype_size(dt)));
        cg_put(b, "    rt_allreduce_%s(c, %s, %lld, %d);\n", ir_attr_i(n, "sum", 0) ? "sum" : "avg", cg_ptr(cg, y),
            (long long)ny, dt);
    }
}


/* A collective becomes a job, a function of its own that rt_coll_start
 * runs beside the step on its lane (the communication thread; on cuda the
 * gathers' stream or the reductions' stream); its Wait node (the schedule
 * pass's) waits for it. */
static void emit_collective(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    if (!ir_attr(n, "tag"))
        die("collective '%s' was not scheduled", n->name);
    int tag = (int)ir_attr_i(n, "tag", -1);
    if (!cg->team) { /* (its text for a team follows its plain text: exe.c; the job written once) */
        Buf body = {0};
        cg_fn_begin(cg, 1);
        emit_collective_body(cg, &body, n);
        cg_put(&cg->jobs, "/* %s */\nstatic void coll%d(RtCtx *c)\n{\n", cg_comment(n->name), tag);
        cg_fn_decls(cg, &cg->jobs);
        cg_put(&cg->jobs, "%s}\n\n", body.buf);
    }
    team_coll(cg, b, n, ir_fmt("rt_coll_start(c, %d, %d, %s, coll%d);", tag, (int)(n - g->node),
                            n->op == OP_AllGather ? "RT_LANE_GATHER" : "RT_LANE_REDUCE", tag), 0);
}

/* a double as C text (infinities spelled so the C compiler takes them) */
static const char *c_double(double v)
{
    return isinf(v) ? (v < 0 ? "-INFINITY" : "INFINITY") : ir_fmt("%.17g", v);
}

/* p0, p1 of unary op's kernel for node n (n: of op, or its UnaryGrad) as C text */
const char *cg_unary_params(Op op, const Node *n)
{
    return ir_fmt("%s, %s", c_double(ir_kernel_param(n, op, 0)), c_double(ir_kernel_param(n, op, 1)));
}

void cg_emit_node(Cg *cg, Buf *b, const Node *n)
{
    const Graph *g = cg->g;
    int y = n->nout ? n->out[0] : -1, x = n->nin ? n->in[0] : -1;
    DType dt = y >= 0 ? g->val[y].dtype : g->val[x].dtype;
    const char *s = cg_sfx(dt);
    int64_t ny = y >= 0 ? value_numel(g, y) : 0;
    cg_put(b, "    /* %s: %s */\n", cg_comment(n->name), op_info[n->op].name);
    switch (n->op) {
    case OP_UnaryGrad: {
        Op of = (Op)ir_attr_i(n, "of", -1);
        cg_put(b, "    k_unary_grad_%s(%s, %s, %s, %s, %s, %lld, %s);\n", s, cg_kernel_op(of), cg_ptr(cg, y), cg_ptr(cg, x),
            n->in[1] >= 0 ? cg_ptr(cg, n->in[1]) : "NULL", n->in[2] >= 0 ? cg_ptr(cg, n->in[2]) : "NULL",
            (long long)ny, cg_unary_params(of, n));
        break;
    }
    case OP_Scale:
        cg_put(b, "    k_scale_%s(%s, %s, %.17g, %lld);\n", s, cg_ptr(cg, y), cg_ptr(cg, x), ir_attr_f(n, "alpha", 1),
            (long long)ny);
        break;
    case OP_Identity: case OP_Reshape: case OP_Copy:
        if (cg_same_place(g, x, y))
            cg_put(b, "    /* a view: no data moves */\n");
        else
            cg_put(b, "    rt_memcpy(%s, %s, %lld);\n", cg_ptr(cg, y), cg_ptr(cg, x),
                (long long)(ny * (int64_t)dtype_size(dt)));
        break;
    case OP_MatMul: case OP_MatMulAdd: emit_matmul(cg, b, n); break;
    case OP_Transpose: {
        const Value *vx = &g->val[x];
        int64_t perm[MAX_RANK];
        const Attr *p = ir_attr(n, "perm");
        for (int i = 0; i < vx->shape.rank; i++)
            perm[i] = p ? p->ints[i] : vx->shape.rank - 1 - i;
        if (dt != DT_F32 && dt != DT_F64) { /* integers, bool, bf16 / f16: a strided copy of their elements: y
                                               * dense, x read along perm (k_transpose_f32 moves 4-byte floats) */
            int r = vx->shape.rank;
            int64_t xst[MAX_RANK], yst[MAX_RANK], xs[MAX_RANK], st = 1;
            for (int i = r - 1; i >= 0; i--)
                xst[i] = st, st *= vx->shape.dim[i];
            st = 1;
            for (int i = r - 1; i >= 0; i--)
                yst[i] = st, st *= g->val[y].shape.dim[i];
            for (int i = 0; i < r; i++)
                xs[i] = xst[perm[i]];
            cg_put(b, "    { static const int64_t sh[] = %s, ys[] = %s, xs[] = %s;\n", cg_ints(g->val[y].shape.dim, r),
                cg_ints(yst, r), cg_ints(xs, r));
            cg_put(b, "      k_copy_strided(%d, %d, sh, %s, 0, ys, %s, 0, xs); }\n", (int)dtype_size(dt), r, cg_ptr(cg, y),
                cg_ptr(cg, x));
            break;
        }
        cg_put(b, "    { static const int64_t xs[] = %s, pm[] = %s;\n", cg_ints(vx->shape.dim, vx->shape.rank),
            cg_ints(perm, vx->shape.rank));
        cg_put(b, "      k_transpose_%s(%s, %s, %d, xs, pm); }\n", s, cg_ptr(cg, y), cg_ptr(cg, x), vx->shape.rank);
        break;
    }
    case OP_ReduceSumTo: {
        const Shape *xs = &g->val[x].shape, *ys = &g->val[y].shape;
        int64_t pad[MAX_RANK];
        for (int i = 0; i < xs->rank; i++) {
            int iy = i - (xs->rank - ys->rank);
            pad[i] = iy >= 0 ? ys->dim[iy] : 1;
        }
        cg_put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", cg_ints(xs->dim, xs->rank),
            cg_ints(pad, xs->rank));
        cg_put(b, "      k_reduce_sum_to_%s(%s, %s, %d, xs, ys); }\n", cg_gemm_sfx(g->val[x].dtype, dt), cg_ptr(cg, y),
            cg_ptr(cg, x), xs->rank); /* 16-bit x (a bias gradient under --precision): _bf16 / _f16 */
        break;
    }
    case OP_MseLoss:
        cg_put(b, "    k_mse_%s(%s, %s, %s, %lld);\n", s, cg_ptr(cg, y), cg_ptr(cg, x), cg_ptr(cg, n->in[1]),
            (long long)value_numel(g, x));
        break;
    case OP_MseLossGrad:
        cg_put(b, "    k_mse_grad_%s(%s, %s, %s, %s, %lld);\n", s, cg_ptr(cg, y), cg_ptr(cg, x), cg_ptr(cg, n->in[1]),
            cg_ptr(cg, n->in[2]), (long long)ny);
        break;
    case OP_CrossEntropyLoss: {
        const Shape *xs = &g->val[x].shape;
        int64_t cls = xs->dim[xs->rank - 1], rows = shape_numel(xs) / cls;
        cg_put(b, "    { int64_t bad = k_cross_entropy_%s(%s, %s, %s, %lld, %lld);\n",
            cg_gemm_sfx(g->val[x].dtype, g->val[y].dtype), cg_ptr(cg, y), cg_ptr(cg, x),
            cg_ptr(cg, n->in[1]), (long long)rows, (long long)cls);
        cg_check_end(cg, b, ir_fmt("      if (bad >= 0) rt_step_fail(c, \"%%s: label %%lld in row %%lld of this rank's "
                               "batch is outside [0, %lld)\", %s, (long long)%s[bad], (long long)bad); }\n",
                               (long long)cls, cg_cstr(g->val[n->in[1]].name), cg_ptr(cg, n->in[1])),
                     ir_fmt("%s: a label of this rank's batch is outside [0, %lld)", g->val[n->in[1]].name,
                            (long long)cls));
        break;
    }
    case OP_CrossEntropyGrad: {
        const Shape *xs = &g->val[n->in[1]].shape;
        int64_t cls = xs->dim[xs->rank - 1], rows = shape_numel(xs) / cls;
        cg_put(b, "    k_cross_entropy_grad_%s(%s, %s, %s, %s, %lld, %lld);\n",
            cg_gemm_sfx(g->val[n->in[1]].dtype, g->val[x].dtype), cg_ptr(cg, y), cg_ptr(cg, x),
            cg_ptr(cg, n->in[1]), cg_ptr(cg, n->in[2]), (long long)rows, (long long)cls);
        break;
    }
    case OP_Ones: /* the seed: --accum averages the micro-steps, as the ranks are averaged */
        if (g->opt->precision == PREC_FP16) /* times the loss scale, which changes between steps */
            cg_put(b, "    k_loss_seed_f32(%s, %lld, c->loss_scale, c->accum);\n", cg_ptr(cg, y), (long long)ny);
        else
            cg_put(b, "    k_fill_%s(%s, 1.0 / (double)c->accum, %lld);\n", s, cg_ptr(cg, y), (long long)ny);
        break;
    case OP_AllGather: case OP_ReduceScatter: case OP_AllReduce:
        emit_collective(cg, b, n);
        break;
    case OP_Wait:
        team_coll(cg, b, n, ir_fmt("rt_coll_wait(c, %lld);", (long long)ir_attr_i(n, "tag", -1)), 1);
        if (ir_attr_i(n, "of", -1) == OP_ReduceScatter) /* in: flat gradient, gradient shard[, bf16 copy] */
            emit_grad_accum(cg, b, n->in[0], n->in[1], n->unit);
        break;
    case OP_GradNormSq: { /* in: the gradient shards, then the loss */
        const int loss = n->in[n->nin - 1];
        for (int i = 0; i < n->nin - 1; i++)
            cg_put(b, "    k_sum_squares_%s(%s, %s, c->shard_len[%d], %d);\n", s, cg_ptr(cg, y), cg_ptr(cg, n->in[i]),
                g->val[n->in[i]].unit, i > 0);
        if (g->opt->precision == PREC_FP16) /* the shards hold S times the gradient */
            cg_put(b, "    k_unscale_sq_f32(%s, c->loss_scale);\n", cg_ptr(cg, y));
        cg_put(b, "    k_nan_unless_finite(%s, %s, %s, %s);\n", cg_kdt(dt), cg_ptr(cg, y), cg_kdt(g->val[loss].dtype),
            cg_ptr(cg, loss));
        break;
    }
    case OP_Free: cg_put(b, "    /* slot %d free from here */\n", g->val[x].loc.slot); break;
    case OP_Fused: cg_emit_fused(cg, b, n); break;
    case OP_AdamW: case OP_Sgd: {
        /* per run of the unit's optimizer layout (c->opt_run: --no-decay, --lr-mult) inside this rank's shard:
         * the update of that part, with the run's decay and learning-rate factor */
        /* cpu: the runs in one team (one fork instead of one a run), each thread its static share of every run
         * (k_team_share): the runs write apart, so no barrier between them; the update is elementwise, so the
         * same bits however it is split */
        int u = n->unit, adam = n->op == OP_AdamW;
        if (!cg->cuda && !cg->team) /* in a run's team (cg->team, codegen/team.c) the loop is the team's */
            cg_put(b, "    _Pragma(\"omp parallel if (c->shard_len[%d] >= K_PAR_MIN)\")\n", u);
        cg_put(b, "    for (int k = 0; k < c->opt_nrun[%d]; k++) {\n"
                  "        const RtOptRun *r = c->opt_run[%d] + k;\n"
                  "        const int64_t off = (int64_t)c->srank * c->shard_len[%d], end = off + c->shard_len[%d];\n"
                  "        int64_t lo = r->lo > off ? r->lo : off, hi = r->hi < end ? r->hi : end;\n"
                  "        if (lo >= hi)\n            continue;\n", u, u, u, u);
        if (!cg->cuda)
            cg_put(b, "        k_team_share(&lo, &hi);\n        if (lo >= hi)\n            continue;\n");
        cg_put(b, "        const int64_t at = lo - off;\n");
        if (adam)
            cg_put(b, "        k_adamw_%s(%s + at, %s + at, %s + at, %s + at, hi - lo, c->lr, c->beta1, c->beta2, c->eps, "
                      "r->decay ? c->weight_decay : 0.0, %d, r->lr_mult, c->opt_step, %s, c->clip_norm, c->loss_scale, "
                      "c->micro, c->accum);\n", s, cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]), cg_ptr(cg, n->in[2]),
                   cg_ptr(cg, n->in[3]), g->opt->optimizer == OPT_ADAM, cg_ptr(cg, n->in[4]));
        else /* no momentum: no buffer (NULL) */
            cg_put(b, "        k_sgd_%s(%s + at, %s + at, %s ? %s + at : 0, hi - lo, c->lr, c->momentum, "
                      "r->decay ? c->weight_decay : 0.0, c->nesterov, r->lr_mult, c->opt_step, %s, c->clip_norm, "
                      "c->loss_scale, c->micro, c->accum);\n", s, cg_ptr(cg, n->in[0]), cg_ptr(cg, n->in[1]),
                   cg_ptr(cg, n->in[2]), cg_ptr(cg, n->in[2]), cg_ptr(cg, n->in[3]));
        cg_put(b, "    }\n");
        break;
    }
    default:
        if ((op_info[n->op].flags & F_BINARY) && g->val[y].dtype == DT_I64)
            cg_binary_i64(cg, b, n);
        else if (op_info[n->op].flags & F_BINARY)
            cg_binary(cg, b, cg_kernel_op(n->op), y, cg_ptr(cg, y), n->in[0], cg_ptr(cg, n->in[0]), n->in[1],
                      cg_ptr(cg, n->in[1]));
        else if (op_info[n->op].flags & F_UNARY)
            cg_put(b, "    k_unary_%s(%s, %s, %s, %lld, %s);\n", s, cg_kernel_op(n->op), cg_ptr(cg, y), cg_ptr(cg, x),
                   (long long)ny, cg_unary_params(n->op, n));
        else if (!cg_tensor(cg, b, n) && !cg_nn(cg, b, n))
            die("the cpu target has no code for %s (node '%s')", op_info[n->op].name, n->name);
    }
}

