/* cpu.c — the CPU target: C source for the step, the init file, the build.
 *
 * requires: memplan (every value placed; node order final).
 * ensures:  OUT (an executable linked with runtime/ and kernels/c) and
 *           OUT.init (the step-0 checkpoint: original model bytes, constants,
 *           each unit's unpadded flat initial parameters), both written
 *           atomically (temporary name, then rename).
 *
 * The emitted C is straight-line: one kernel or collective call per node in
 * schedule order, pointers computed from the static plan.  Names from the
 * model never reach the C text except through cstr() (escaped string
 * literals) and ccomment() (sanitised comments): a model cannot inject code.
 */
#define _POSIX_C_SOURCE 200809L
#include "ir.h"
#include "rt.h"
#include "fsdpc_config.h"

#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static const char *g_cc; /* --cc override of the configured compiler */

typedef struct {
    char *buf;
    size_t len, cap;
} Buf;

static void put(Buf *b, const char *fmt, ...)
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
static const char *cstr(const char *s)
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

/* Text safe inside a C comment (no "*" "/" pairs, no control bytes). */
static const char *ccomment(const char *s)
{
    char *o = ir_strdup(s);
    for (char *p = o; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("_.,:@-[]()#", ch)))
            *p = '_';
    }
    return o;
}

static const char *ctype(DType t)
{
    switch (t) {
    case DT_F32: return "float";
    case DT_F64: return "double";
    case DT_I64: return "int64_t";
    case DT_I32: return "int32_t";
    case DT_BOOL: return "uint8_t";
    default: die("no C type for dtype %d", t);
    }
}

static const char *sfx(DType t) { return t == DT_F64 ? "f64" : "f32"; }

/* pointer expression for value v, typed */
static const char *P(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    const Loc *l = &x->loc;
    const char *t = ctype(x->dtype);
    switch (l->kind) {
    case LOC_ARENA: return ir_fmt("((%s *)(A + %lld))", t, (long long)l->off);
    case LOC_SLOT: return ir_fmt("((%s *)(c->slot[%d] + %lld))", t, l->slot, (long long)l->off);
    case LOC_SHARD:
        return ir_fmt("((%s *)c->shard[%d * RT_NSTATE + %d])", t, l->unit, l->state);
    default: die("value '%s' has no place in memory", x->name);
    }
}

static int same_place(const Graph *g, int a, int b)
{
    const Loc *x = &g->val[a].loc, *y = &g->val[b].loc;
    return x->kind == y->kind && x->slot == y->slot && x->unit == y->unit && x->state == y->state &&
           x->off == y->off;
}

static const char *ints(const int64_t *v, int n)
{
    Buf b = {0};
    put(&b, "{");
    for (int i = 0; i < n; i++)
        put(&b, i ? ", %lld" : "%lld", (long long)v[i]);
    put(&b, n ? "}" : "0}");
    return b.buf;
}

static void emit_binary(Buf *b, const Graph *g, const Node *n, int kop)
{
    const Value *y = &g->val[n->out[0]];
    int r = y->shape.rank;
    int64_t sa[MAX_RANK], sb[MAX_RANK];
    for (int k = 0; k < 2; k++) {
        const Shape *s = &g->val[n->in[k]].shape;
        int64_t *st = k ? sb : sa, acc = 1;
        for (int i = r - 1; i >= 0; i--) {
            int ia = i - (r - s->rank);
            int64_t d = ia >= 0 ? s->dim[ia] : 1;
            st[i] = d == 1 ? 0 : acc;
            acc *= d;
        }
    }
    put(b, "    { static const int64_t sh[] = %s, sa[] = %s, sb[] = %s;\n", ints(y->shape.dim, r),
        ints(sa, r), ints(sb, r));
    put(b, "      k_binary_%s(%d, %s, %s, %s, %d, sh, sa, sb); }\n", sfx(y->dtype), kop,
        P(g, n->out[0]), P(g, n->in[0]), P(g, n->in[1]), r);
}

static void emit_matmul(Buf *b, const Graph *g, const Node *n)
{
    const Shape *sa = &g->val[n->in[0]].shape, *sb = &g->val[n->in[1]].shape;
    const Shape *sy = &g->val[n->out[0]].shape;
    int ta = (int)ir_attr_i(n, "transA", 0), tb = (int)ir_attr_i(n, "transB", 0);
    int64_t m = sy->dim[sy->rank - 2], nn = sy->dim[sy->rank - 1];
    int64_t k = sa->dim[sa->rank - (ta ? 2 : 1)];
    int64_t batch = shape_numel(sy) / (m * nn);
    int64_t strA = shape_numel(sa) == m * k ? 0 : m * k, strB = shape_numel(sb) == k * nn ? 0 : k * nn;
    put(b, "    k_matmul_%s(%s, %s, %s, %lld, %lld, %lld, %lld, %lld, %lld, %d, %d, 0.0);\n",
        sfx(g->val[n->out[0]].dtype), P(g, n->out[0]), P(g, n->in[0]), P(g, n->in[1]),
        (long long)batch, (long long)strA, (long long)strB, (long long)m, (long long)nn,
        (long long)k, ta, tb);
}

/* The kernels' code and parameters of a unary op (kernels/c/kernels.h). */
static const char *unary_op(Op op)
{
    switch (op) {
    case OP_Relu: return "K_RELU";
    case OP_Tanh: return "K_TANH";
    case OP_Sigmoid: return "K_SIGMOID";
    case OP_Sqrt: return "K_SQRT";
    case OP_Reciprocal: return "K_RECIPROCAL";
    case OP_Exp: return "K_EXP";
    case OP_Log: return "K_LOG";
    case OP_Neg: return "K_NEG";
    case OP_Abs: return "K_ABS";
    case OP_Erf: return "K_ERF";
    case OP_LeakyRelu: return "K_LEAKY_RELU";
    case OP_Softplus: return "K_SOFTPLUS";
    case OP_Clip: return "K_CLIP";
    default: die("%s is not a unary op", op_info[op].name);
    }
}

/* p0, p1 as C text (infinities spelled so the C compiler takes them) */
static const char *unary_params(Op op, const Node *n)
{
    double p0 = 0, p1 = 0;
    if (op == OP_LeakyRelu)
        p0 = ir_attr_f(n, "alpha", 0.01);
    if (op == OP_Softplus)
        p0 = 1, p1 = 20;
    if (op == OP_Clip) {
        const char *lo = ir_attr(n, "min") ? ir_fmt("%.17g", ir_attr_f(n, "min", 0)) : "-INFINITY";
        const char *hi = ir_attr(n, "max") ? ir_fmt("%.17g", ir_attr_f(n, "max", 0)) : "INFINITY";
        return ir_fmt("%s, %s", lo, hi);
    }
    return ir_fmt("%.17g, %.17g", p0, p1);
}

static void emit_node(Buf *b, const Graph *g, const Node *n)
{
    int y = n->nout ? n->out[0] : -1, x = n->nin ? n->in[0] : -1;
    DType dt = y >= 0 ? g->val[y].dtype : g->val[x].dtype;
    const char *s = sfx(dt);
    int64_t ny = y >= 0 ? value_numel(g, y) : 0;
    put(b, "    /* %s: %s */\n", ccomment(n->name), op_info[n->op].name);
    switch (n->op) {
    case OP_Add: emit_binary(b, g, n, 0); break;
    case OP_Sub: emit_binary(b, g, n, 1); break;
    case OP_Mul: emit_binary(b, g, n, 2); break;
    case OP_Div: emit_binary(b, g, n, 3); break;
    case OP_Relu: case OP_Tanh: case OP_Sigmoid: case OP_Sqrt: case OP_Reciprocal: case OP_Exp:
    case OP_Log: case OP_Neg: case OP_Abs: case OP_Erf: case OP_LeakyRelu: case OP_Softplus:
    case OP_Clip:
        put(b, "    k_unary_%s(%s, %s, %s, %lld, %s);\n", s, unary_op(n->op), P(g, y), P(g, x),
            (long long)ny, unary_params(n->op, n));
        break;
    case OP_UnaryGrad: {
        Op of = (Op)ir_attr_i(n, "of", -1);
        put(b, "    k_unary_grad_%s(%s, %s, %s, %s, %s, %lld, %s);\n", s, unary_op(of), P(g, y), P(g, x),
            n->in[1] >= 0 ? P(g, n->in[1]) : "NULL", n->in[2] >= 0 ? P(g, n->in[2]) : "NULL",
            (long long)ny, unary_params(of, n));
        break;
    }
    case OP_Scale:
        put(b, "    k_scale_%s(%s, %s, %.17g, %lld);\n", s, P(g, y), P(g, x), ir_attr_f(n, "alpha", 1),
            (long long)ny);
        break;
    case OP_Identity: case OP_Reshape: case OP_Copy:
        if (same_place(g, x, y))
            put(b, "    /* a view: no data moves */\n");
        else
            put(b, "    memcpy(%s, %s, %lld);\n", P(g, y), P(g, x),
                (long long)(ny * (int64_t)dtype_size(dt)));
        break;
    case OP_MatMul: emit_matmul(b, g, n); break;
    case OP_Transpose: {
        const Value *vx = &g->val[x];
        int64_t perm[MAX_RANK];
        const Attr *p = ir_attr(n, "perm");
        for (int i = 0; i < vx->shape.rank; i++)
            perm[i] = p ? p->ints[i] : vx->shape.rank - 1 - i;
        put(b, "    { static const int64_t xs[] = %s, pm[] = %s;\n", ints(vx->shape.dim, vx->shape.rank),
            ints(perm, vx->shape.rank));
        put(b, "      k_transpose_%s(%s, %s, %d, xs, pm); }\n", s, P(g, y), P(g, x), vx->shape.rank);
        break;
    }
    case OP_ReduceSumTo: {
        const Shape *xs = &g->val[x].shape, *ys = &g->val[y].shape;
        int64_t pad[MAX_RANK];
        for (int i = 0; i < xs->rank; i++) {
            int iy = i - (xs->rank - ys->rank);
            pad[i] = iy >= 0 ? ys->dim[iy] : 1;
        }
        put(b, "    { static const int64_t xs[] = %s, ys[] = %s;\n", ints(xs->dim, xs->rank),
            ints(pad, xs->rank));
        put(b, "      k_reduce_sum_to_%s(%s, %s, %d, xs, ys); }\n", s, P(g, y), P(g, x), xs->rank);
        break;
    }
    case OP_MseLoss:
        put(b, "    k_mse_%s(%s, %s, %s, %lld);\n", s, P(g, y), P(g, x), P(g, n->in[1]),
            (long long)value_numel(g, x));
        break;
    case OP_MseLossGrad:
        put(b, "    k_mse_grad_%s(%s, %s, %s, %s, %lld);\n", s, P(g, y), P(g, x), P(g, n->in[1]),
            P(g, n->in[2]), (long long)ny);
        break;
    case OP_CrossEntropyLoss: {
        const Shape *xs = &g->val[x].shape;
        int64_t cls = xs->dim[xs->rank - 1], rows = shape_numel(xs) / cls;
        put(b, "    { int64_t bad = k_cross_entropy_%s(%s, %s, %s, %lld, %lld);\n", s, P(g, y), P(g, x),
            P(g, n->in[1]), (long long)rows, (long long)cls);
        put(b, "      if (bad >= 0) rt_step_fail(c, \"%%s: label %%lld in row %%lld of this rank's batch is "
               "outside [0, %lld)\", %s, (long long)%s[bad], (long long)bad); }\n",
            (long long)cls, cstr(g->val[n->in[1]].name), P(g, n->in[1]));
        break;
    }
    case OP_CrossEntropyGrad: {
        const Shape *xs = &g->val[n->in[1]].shape;
        int64_t cls = xs->dim[xs->rank - 1], rows = shape_numel(xs) / cls;
        put(b, "    k_cross_entropy_grad_%s(%s, %s, %s, %s, %lld, %lld);\n", s, P(g, y), P(g, x),
            P(g, n->in[1]), P(g, n->in[2]), (long long)rows, (long long)cls);
        break;
    }
    case OP_Ones: put(b, "    k_fill_%s(%s, 1.0, %lld);\n", s, P(g, y), (long long)ny); break;
    case OP_AllGather:
        put(b, "    rt_allgather(c, %s, %s, c->shard_len[%d], %d);\n", P(g, y), P(g, x), n->unit, dt);
        break;
    case OP_ReduceScatter:
        put(b, "    rt_reduce_scatter_avg(c, %s, %s, %lld, c->shard_len[%d], %d);\n", P(g, y), P(g, x),
            (long long)g->unit[n->unit].numel, n->unit, dt);
        break;
    case OP_AllReduce:
        put(b, "    memcpy(%s, %s, %lld);\n", P(g, y), P(g, x), (long long)(ny * (int64_t)dtype_size(dt)));
        put(b, "    rt_allreduce_avg(c, %s, %lld, %d);\n", P(g, y), (long long)ny, dt);
        break;
    case OP_Free: put(b, "    /* slot %d free from here */\n", g->val[x].loc.slot); break;
    case OP_AdamW:
        put(b, "    k_adamw_%s(%s, %s, %s, %s, c->shard_len[%d], c->lr, c->beta1, c->beta2, c->eps, "
               "c->weight_decay, c->step);\n", s, P(g, n->in[0]), P(g, n->in[1]), P(g, n->in[2]),
            P(g, n->in[3]), n->unit);
        break;
    case OP_Sgd:
        put(b, "    k_sgd_%s(%s, %s, %s, c->shard_len[%d], c->lr, c->momentum, c->weight_decay, c->step);\n",
            s, P(g, n->in[0]), P(g, n->in[1]), P(g, n->in[2]), n->unit);
        break;
    default: die("the cpu target has no code for %s (node '%s')", op_info[n->op].name, n->name);
    }
}

/* ---- the init file ------------------------------------------------------ */
typedef struct {
    int64_t model_off, size;
    int64_t *const_off;  /* per value id, -1 if not stored */
    int64_t *unit_off;
    uint64_t id;
} InitLayout;

static int64_t al(int64_t x) { return (x + 63) / 64 * 64; }

static int stored_const(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    return x->role == R_CONST && x->alias_of < 0 && x->loc.kind == LOC_ARENA;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static InitLayout layout_init(const Graph *g)
{
    InitLayout L = {0};
    L.const_off = ir_alloc(sizeof(int64_t) * (size_t)g->nval);
    L.unit_off = ir_alloc(sizeof(int64_t) * (size_t)(g->nunit + 1));
    int64_t off = 64;
    L.model_off = off;
    off = al(off + (int64_t)g->model_len);
    uint64_t h = fnv(14695981039346656037ull, g->model_bytes, g->model_len);
    for (int v = 0; v < g->nval; v++) {
        L.const_off[v] = -1;
        if (!stored_const(g, v))
            continue;
        int64_t n = value_numel(g, v) * (int64_t)dtype_size(g->val[v].dtype);
        L.const_off[v] = off;
        off = al(off + n);
        h = fnv(h, g->val[v].data, (size_t)n);
    }
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        L.unit_off[u] = off;
        off = al(off + un->numel * (int64_t)dtype_size(un->dtype));
        for (int i = 0; i < un->nparams; i++)
            h = fnv(h, g->val[un->params[i]].data,
                    (size_t)(value_numel(g, un->params[i]) * (int64_t)dtype_size(un->dtype)));
        h = fnv(h, &un->numel, sizeof un->numel);
    }
    L.size = off;
    L.id = h;
    return L;
}

static void write_all(FILE *f, const void *p, size_t n, const char *path)
{
    if (n && fwrite(p, 1, n, f) != n)
        fatal("%s: write failed: %s", path, strerror(errno));
}

static void pad_to(FILE *f, int64_t off, const char *path)
{
    static const char zero[64];
    long cur = ftell(f);
    if (cur < 0 || cur > off)
        die("init file layout");
    write_all(f, zero, (size_t)(off - cur), path);
}

static void write_init(const Graph *g, const InitLayout *L, const char *path)
{
    char *tmp = ir_fmt("%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        fatal("%s: cannot create: %s", tmp, strerror(errno));
    unsigned char hdr[32] = {0};
    memcpy(hdr, RT_INIT_MAGIC, 16);
    for (int i = 0; i < 8; i++) {
        hdr[16 + i] = (unsigned char)(L->id >> (8 * i));
        hdr[24 + i] = (unsigned char)((uint64_t)L->size >> (8 * i));
    }
    write_all(f, hdr, sizeof hdr, tmp);
    pad_to(f, L->model_off, tmp);
    write_all(f, g->model_bytes, g->model_len, tmp);
    for (int v = 0; v < g->nval; v++)
        if (L->const_off[v] >= 0) {
            pad_to(f, L->const_off[v], tmp);
            write_all(f, g->val[v].data, (size_t)(value_numel(g, v) * (int64_t)dtype_size(g->val[v].dtype)), tmp);
        }
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        pad_to(f, L->unit_off[u], tmp);
        for (int i = 0; i < un->nparams; i++)
            write_all(f, g->val[un->params[i]].data,
                      (size_t)(value_numel(g, un->params[i]) * (int64_t)dtype_size(un->dtype)), tmp);
    }
    pad_to(f, L->size, tmp);
    if (fflush(f) || fsync(fileno(f)) || fclose(f))
        fatal("%s: write failed: %s", tmp, strerror(errno));
    if (rename(tmp, path))
        fatal("%s: cannot rename to %s: %s", tmp, path, strerror(errno));
}

/* ---- the C source ------------------------------------------------------- */
static void emit_tables(Buf *b, const Graph *g, const InitLayout *L)
{
    int nstate = g->opt->optimizer == OPT_ADAMW ? 2 : 1;
    put(b, "static const RtUnit units[] = {\n");
    for (int u = 0; u < g->nunit; u++)
        put(b, "    {%s, %lld, %d, %d, %lld},\n", cstr(g->unit[u].name), (long long)g->unit[u].numel,
            g->unit[u].dtype, nstate, (long long)L->unit_off[u]);
    if (!g->nunit)
        put(b, "    {0, 0, 0, 0, 0},\n"); /* C has no empty arrays; the count says 0 */
    put(b, "};\nstatic const RtParam params[] = {\n");
    for (int u = 0; u < g->nunit; u++)
        for (int i = 0; i < g->unit[u].nparams; i++) {
            int p = g->unit[u].params[i];
            put(b, "    {%s, %d, %lld, %lld},\n", cstr(g->val[p].name), u, (long long)g->unit[u].offset[i],
                (long long)value_numel(g, p));
        }
    if (!g->nunit)
        put(b, "    {0, 0, 0, 0},\n");
    put(b, "};\nstatic const RtInput inputs[] = {\n");
    int64_t batch = -1;
    for (int k = 0; k < g->ninput; k++) {
        const Value *x = &g->val[g->input[k]];
        if (!g->opt->eval && (x->shape.rank < 1 || (batch >= 0 && x->shape.dim[0] != batch)))
            fatal("%s: input '%s' %s: every input needs the same leading batch dimension", g->opt->model,
                  x->name, x->shape.rank < 1 ? "is a scalar" : "has another batch size");
        batch = x->shape.dim[0];
        put(b, "    {%s, %d, %d, %s, %lld},\n", cstr(x->name), x->dtype, x->shape.rank,
            ints(x->shape.dim, x->shape.rank), (long long)x->loc.off);
    }
    if (!g->ninput)
        put(b, "    {0, 0, 0, {0}, 0},\n");
    put(b, "};\nstatic const RtConst consts[] = {\n");
    int nconst = 0;
    for (int v = 0; v < g->nval; v++)
        if (L->const_off[v] >= 0) {
            put(b, "    {%lld, %lld, %lld}, /* %s */\n", (long long)L->const_off[v],
                (long long)g->val[v].loc.off,
                (long long)(value_numel(g, v) * (int64_t)dtype_size(g->val[v].dtype)),
                ccomment(g->val[v].name));
            nconst++;
        }
    if (!nconst)
        put(b, "    {0, 0, 0},\n");
    put(b, "};\nstatic const RtOutput outputs[] = {\n");
    for (int k = 0; k < g->noutput; k++) {
        const Value *x = &g->val[g->output[k]];
        put(b, "    {%s, %d, %d, %s, %lld},\n", cstr(x->name), x->dtype, x->shape.rank,
            ints(x->shape.dim, x->shape.rank), (long long)x->loc.off);
    }
    if (!g->noutput)
        put(b, "    {0, 0, 0, {0}, 0},\n");
    put(b, "};\n\n");
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static Buf emit_source(const Graph *g, const InitLayout *L)
{
    Buf b = {0};
    put(&b, "/* generated by fsdpc from %s: the training step, target cpu. Do not edit. */\n",
        ccomment(base_name(g->opt->model)));
    put(&b, "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n#include \"rt.h\"\n#include \"kernels.h\"\n\n");
    emit_tables(&b, g, L);
    put(&b, "static void step(RtCtx *c)\n{\n    char *A = c->arena;\n");
    for (int i = 0; i < g->nnode; i++)
        emit_node(&b, g, &g->node[i]);
    put(&b, "}\n\n");
    int nconst = 0;
    for (int v = 0; v < g->nval; v++)
        nconst += L->const_off[v] >= 0;
    int nparam = 0;
    for (int u = 0; u < g->nunit; u++)
        nparam += g->unit[u].nparams;
    put(&b, "static const RtModel model = {\n");
    put(&b, "    .id = 0x%016llxull, .name = %s,\n", (unsigned long long)L->id,
        cstr(base_name(g->opt->model)));
    put(&b, "    .nunit = %d, .unit = units, .nparam = %d, .param = params,\n", g->nunit, nparam);
    put(&b, "    .ninput = %d, .input = inputs, .nconst = %d, .cnst = consts,\n", g->ninput, nconst);
    put(&b, "    .arena_bytes = %lld, .nslot = %d,\n", (long long)g->arena_bytes, g->nslot);
    int la = g->loss_avg;
    put(&b, "    .loss_off = %lld, .loss_dtype = %d, .optimizer = %d,\n",
        la >= 0 ? (long long)g->val[la].loc.off : -1LL, la >= 0 ? (int)g->val[la].dtype : 0,
        g->opt->optimizer == OPT_ADAMW ? RT_ADAMW : RT_SGD);
    put(&b, "    .model_off = %lld, .model_len = %lld, .step = step,\n", (long long)L->model_off,
        (long long)g->model_len);
    put(&b, "    .eval = %d, .noutput = %d, .output = outputs,\n};\n\n", g->opt->eval, g->noutput);
    put(&b, "int main(int argc, char **argv) { return rt_main(argc, argv, &model); }\n");
    return b;
}

/* ---- building ----------------------------------------------------------- */
/* Split a configure-time flag string on spaces (CMake's paths have none). */
static int split(const char *s, char **argv, int max)
{
    char *c = ir_strdup(s);
    int n = 0;
    for (char *t = strtok(c, " "); t && n < max; t = strtok(NULL, " "))
        argv[n++] = t;
    return n;
}

static void run_cc(const char *src, const char *exe)
{
    char *argv[256];
    int n = 0;
    argv[n++] = (char *)(g_cc ? g_cc : FSDPC_CC);
    n += split(FSDPC_CFLAGS, argv + n, 100);
    argv[n++] = "-o";
    argv[n++] = (char *)exe;
    argv[n++] = (char *)src;
    n += split(FSDPC_LIBS, argv + n, 100);
    argv[n] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc)
        fatal("cannot run the C compiler '%s': %s", argv[0], strerror(rc));
    int st;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        die("the C compiler failed on the generated step (%s)", src);
}

void cg_cpu(const Graph *g)
{
    const char *out = g->opt->out;
    g_cc = g->opt->cc;
    InitLayout L = layout_init(g);
    Buf src = emit_source(g, &L);
    const char *cpath = g->opt->keep_c ? ir_fmt("%s.c", out) : ir_fmt("%s.tmp.%ld.c", out, (long)getpid());
    FILE *f = fopen(cpath, "w");
    if (!f)
        fatal("%s: cannot create: %s", cpath, strerror(errno));
    write_all(f, src.buf, src.len, cpath);
    if (fclose(f))
        fatal("%s: write failed: %s", cpath, strerror(errno));
    write_init(g, &L, ir_fmt("%s.init", out));
    const char *tmp = ir_fmt("%s.tmp.%ld", out, (long)getpid());
    run_cc(cpath, tmp);
    if (!g->opt->keep_c)
        unlink(cpath);
    if (rename(tmp, out))
        fatal("%s: cannot rename to %s: %s", tmp, out, strerror(errno));
}
