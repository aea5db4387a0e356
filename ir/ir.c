/* ir.c — building and querying the Graph.
 *
 * Values and nodes live in growable arrays inside the Graph and are named by
 * their index.  Everything is allocated from one bump arena that lives until
 * the compiler exits: passes create freely and never free (fsdpc --report
 * compiles once per strategy and releases each of those graphs: ir_release).
 */
#define _XOPEN_SOURCE 700 /* pread */
#include "ir.h"
#include "fused.h" /* the elementwise kernels' rows (ops.def's EW1, EW2) */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { KF_NONE = -1 }; /* an EW2D derivative that is 1 */
#define NO_PARAMS {{NULL, 0, NULL}, {NULL, 0, NULL}}
const OpInfo op_info[OP_COUNT] = {
#define OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags) \
    {#name, since, types, inmin, inmax, outmin, outmax, diff, flags, -1, NULL, NO_PARAMS, {-1, -1}, {NULL, NULL}},
#define A(attr, value) {#attr, value, NULL}
#define V(value) {NULL, value, NULL}
#define S(attr, choices) {#attr, 0, choices}
#define EW1(name, since, types, inmax, kernel, p0, p1) \
    {#name, since, types, 1, inmax, 1, 1, 0x1, F_EW | F_UNARY, KF_##kernel, #kernel, {p0, p1}, {-1, -1}, {NULL, NULL}},
#define EW2(name, kernel) \
    {#name, 7, T_NUMBER, 2, 2, 1, 1, 0x3, F_EW | F_BINARY | F_I64, KF_##kernel, #kernel, NO_PARAMS, {-1, -1}, \
     {NULL, NULL}},
#define EW2D(name, since, types, inmax, kernel, da, db, i64) \
    {#name, since, types, (inmax) < 0 ? 1 : (inmax), inmax, 1, 1, 0x3, \
     F_EW | F_BINARY | ((i64) ? F_I64 : 0), KF_##kernel, \
     #kernel, NO_PARAMS, \
     {KF_##da, KF_##db}, {#da, #db}},
#include "ops.def"
#undef OP
#undef A
#undef V
#undef S
};

/* ops.def's LOW rows */
int ir_reads_low(const Node *n, int input)
{
    switch (n->op) {
#define ALL_INPUTS 0xffffffffu
#define OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags)
#define LOW(name, inputs) \
    case OP_##name: return input >= 32 ? (inputs) == ALL_INPUTS : (int)((inputs) >> input & 1u);
#include "ops.def"
#undef OP
#undef ALL_INPUTS
    default: return 0;
    }
}

/* ops.def's TAB16 rows */
int ir_tab16(Op op)
{
    switch (op) {
#define OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags)
#define TAB16(name) case OP_##name: return 1;
#include "ops.def"
#undef OP
    default: return 0;
    }
}

/* ops.def's SINCE_IN, WAS_ATTR, SINCE_ATTR and SINCE_VALUE rows, in its order */
const OpSince op_since[] = {
#define OP(name, since, types, inmin, inmax, outmin, outmax, diff, flags)
#define SINCE_IN(name, input, text, opset) {OP_##name, opset, input, #text, NULL, 0},
#define WAS_ATTR(name, input, attr, opset) {OP_##name, opset, input, #attr, NULL, 1},
#define SINCE_ATTR(name, attr, opset) {OP_##name, opset, -1, #attr, NULL, 0},
#define SINCE_VALUE(name, attr, value, opset) {OP_##name, opset, -1, #attr, #value, 0},
#include "ops.def"
#undef OP
    {OP_COUNT, 0, -1, NULL, NULL, 0},
};

/* ---- memory: a chain of big blocks, released by the OS at exit ----------
 * Each block starts with a pointer to the previous one, so everything stays
 * reachable (LeakSanitizer reports nothing) though fsdpc never frees;
 * ir_reset walks the chain for drivers that compile many models. */
enum { BLOCK = 1 << 20, HEAD = 16 };
static char *blk;
static size_t blk_used, blk_cap;

void *ir_alloc(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n > blk_cap - blk_used) {
        size_t cap = n + HEAD > BLOCK ? n + HEAD : BLOCK;
        char *b = calloc(1, cap);
        if (!b)
            fatal("out of memory (%zu bytes)", cap);
        memcpy(b, &blk, sizeof blk);
        blk = b;
        blk_used = HEAD;
        blk_cap = cap;
    }
    void *p = blk + blk_used;
    blk_used += n;
    return p;
}

IrMark ir_mark(void)
{
    return (IrMark){blk, blk_used, blk_cap};
}

void ir_release(IrMark m)
{
    size_t end = blk_used; /* of the mark's block: how far it was used */
    while (blk && blk != m.blk) {
        char *prev;
        memcpy(&prev, blk, sizeof prev);
        free(blk);
        blk = prev;
        end = m.cap;
    }
    if (blk != m.blk)
        die("ir_release: a mark of another arena");
    if (blk) /* what was allocated after the mark in its block: zeroed again, as ir_alloc promises */
        memset(blk + m.used, 0, end - m.used);
    blk_used = m.used;
    blk_cap = m.cap;
}

void ir_reset(void)
{
    ir_release((IrMark){0});
}

char *ir_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(ir_alloc(n), s, n);
}

char *ir_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = ir_alloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* Grow an array of elements of size sz to hold at least need; new part zeroed. */
static void *grow(void *p, int *cap, int need, size_t sz)
{
    if (need <= *cap)
        return p;
    int ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    void *q = ir_alloc((size_t)ncap * sz);
    if (p)
        memcpy(q, p, (size_t)*cap * sz);
    *cap = ncap;
    return q;
}

/* ---- errors ------------------------------------------------------------ */
const char *ir_q(const char *s)
{
    if (!s)
        return "";
    size_t n = 0;
    while (n < 81 && s[n])
        n++;
    char *r = ir_alloc(n + 4);
    for (size_t i = 0; i < n && i < 80; i++)
        r[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (n > 80)
        strcpy(r + 80, "...");
    return r;
}

/* prefix and the formatted message as one line: callers pass names through
 * ir_q; any control character left (a path, a flag's value) is shown as '?'
 * here, so an error is always one line. */
static const char *line(const char *prefix, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    size_t np = strlen(prefix), n = (size_t)vsnprintf(NULL, 0, fmt, ap);
    char *msg = ir_alloc(np + n + 1);
    memcpy(msg, prefix, np);
    vsnprintf(msg + np, n + 1, fmt, ap2);
    va_end(ap2);
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return msg;
}

jmp_buf *ir_fatal_jump;

static _Noreturn void vfatal(const char *prefix, const char *fmt, va_list ap)
{
    fprintf(stderr, "fsdpc: error: %s\n", line(prefix, fmt, ap));
    if (ir_fatal_jump)
        longjmp(*ir_fatal_jump, 1);
    exit(1);
}

_Noreturn void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfatal("", fmt, ap);
}

/* the model of the compile (ir_new), for the attribute readers, which have no Graph */
static const char *model_path = "";

static const char *node_prefix(const char *model, const Node *n)
{
    return ir_fmt("%s: node '%s' (%s): ", model, ir_q(n->name), op_info[n->op].name);
}

_Noreturn void node_fatal(const Graph *g, const Node *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfatal(node_prefix(g->opt->model, n), fmt, ap);
}

void node_check_shape(const Graph *g, const Node *n, const Shape *s, const char *what)
{
    if (shape_count(s) >= 0)
        return;
    for (int i = 0; i < s->rank; i++)
        if (s->dim[i] < 0)
            node_fatal(g, n, "%s would have shape %s, with a negative dimension", what, shape_str(s));
    node_fatal(g, n, "%s would have shape %s, beyond 2^40 elements (zero-sized dims counted as 1); fsdpc cannot hold it", what, shape_str(s));
}

_Noreturn void die_at(const char *file, int at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fsdpc: internal error at %s:%d: %s (this is a bug in fsdpc; please report it with the model)\n",
            file, at, line("", fmt, ap));
    va_end(ap);
    abort();
}

/* ---- graph --------------------------------------------------------------- */
Graph *ir_new(const Options *opt)
{
    Graph *g = ir_alloc(sizeof *g);
    g->opt = opt;
    model_path = opt->model ? opt->model : "";
    g->loss = g->loss_avg = g->grad_norm_sq = -1;
    return g;
}

int ir_value(Graph *g, const char *name, DType dt, const Shape *s, Role role)
{
    g->val = grow(g->val, &g->capval, g->nval + 1, sizeof(Value));
    int id = g->nval++;
    Value *v = &g->val[id];
    memset(v, 0, sizeof *v);
    v->name = ir_strdup(name);
    v->dtype = dt;
    if (s)
        v->shape = *s;
    v->role = role;
    v->unit = -1;
    v->producer = -1;
    v->init_index = -1;
    v->pad_row = -1;
    v->grad = -1;
    v->alias_of = -1;
    return id;
}

int ir_node(Graph *g, Op op, const char *name, int nin, const int *in, int nout, const int *out)
{
    g->node = grow(g->node, &g->capnode, g->nnode + 1, sizeof(Node));
    int id = g->nnode++;
    Node *n = &g->node[id];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->name = ir_strdup(name && *name ? name : ir_fmt("%s_%d", op_info[op].name, id));
    n->nin = nin;
    n->nout = nout;
    n->in = ir_alloc(sizeof(int) * (size_t)(nin + 1));
    n->out = ir_alloc(sizeof(int) * (size_t)(nout + 1));
    if (nin)
        memcpy(n->in, in, sizeof(int) * (size_t)nin);
    if (nout)
        memcpy(n->out, out, sizeof(int) * (size_t)nout);
    n->unit = -1;
    for (int i = 0; i < nout; i++) {
        if (out[i] < 0 || out[i] >= g->nval)
            die("node '%s' (%s): output %d is value %d, not a value of the graph", n->name, op_info[op].name, i,
                out[i]);
        g->val[out[i]].producer = id;
    }
    return id;
}

int ir_scalar(Graph *g, const char *name, DType dt, double v)
{
    Shape sc = {.rank = 0};
    int c = ir_value(g, name, dt, &sc, R_CONST);
    g->val[c].data = ir_alloc(sizeof(double));
    dtype_set_f(g->val[c].data, 0, dt, v);
    g->val[c].persistent = 1;
    return c;
}

int ir_node1(Graph *g, Op op, const char *name, int a, int b, int out)
{
    int in[2] = {a, b};
    return ir_node(g, op, name, b < 0 ? 1 : 2, in, 1, &out);
}

Attr *ir_attr_add(Graph *g, int node, const char *name, AttrKind k)
{
    Node *n = &g->node[node];
    Attr *a = ir_alloc(sizeof(Attr) * (size_t)(n->nattr + 1));
    if (n->nattr)
        memcpy(a, n->attr, sizeof(Attr) * (size_t)n->nattr);
    n->attr = a;
    Attr *r = &a[n->nattr++];
    r->name = ir_strdup(name);
    r->kind = k;
    r->t = -1;
    return r;
}

void ir_attr_ints_add(Graph *g, int node, const char *name, const int64_t *v, int n)
{
    Attr *a = ir_attr_add(g, node, name, A_INTS);
    a->n = n;
    a->ints = ir_alloc(sizeof(int64_t) * (size_t)(n + 1));
    if (n)
        memcpy(a->ints, v, sizeof(int64_t) * (size_t)n);
}

int ir_is_read(const Graph *g, int v)
{
    for (int i = 0; i < g->noutput; i++)
        if (g->output[i] == v)
            return 1;
    for (int i = 0; i < g->nnode; i++)
        for (int j = 0; j < g->node[i].nin; j++)
            if (g->node[i].in[j] == v)
                return 1;
    return 0;
}

const Attr *ir_attr(const Node *n, const char *name)
{
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attr[i].name, name))
            return &n->attr[i];
    return NULL;
}

/* attribute name of n, which must be of kind k (or also k2; -1: none), or NULL */
static const Attr *attr_of(const Node *n, const char *name, AttrKind k, int k2)
{
    static const char *kn[] = {"INT", "FLOAT", "INTS", "FLOATS", "STRING", "TENSOR", "STRINGS"};
    const Attr *a = ir_attr(n, name);
    if (a && a->kind != k && (int)a->kind != k2)
        fatal("%sattribute '%s' must be %s %s, found %s", node_prefix(model_path, n), name,
              k == A_INT ? "an" : "a", kn[k], kn[a->kind]);
    return a;
}

int64_t ir_attr_i(const Node *n, const char *name, int64_t def)
{
    const Attr *a = attr_of(n, name, A_INT, -1);
    return a ? a->i : def;
}

double ir_attr_f(const Node *n, const char *name, double def)
{
    const Attr *a = attr_of(n, name, A_FLOAT, A_INT);
    return !a ? def : a->kind == A_FLOAT ? a->f : (double)a->i;
}

const char *ir_attr_s(const Node *n, const char *name, const char *def)
{
    const Attr *a = attr_of(n, name, A_STRING, -1);
    return a ? a->s : def;
}

const int64_t *ir_attr_ints(const Node *n, const char *name, int *count)
{
    const Attr *a = attr_of(n, name, A_INTS, -1);
    *count = a ? a->n : 0;
    return a ? a->ints : NULL;
}

/* the index of s in choices ("a|b|c"), -1 if absent */
static int choice_index(const char *choices, const char *s)
{
    size_t len = strlen(s);
    for (int k = 0; *choices; k++) {
        size_t m = strcspn(choices, "|");
        if (m == len && !strncmp(choices, s, len))
            return k;
        choices += m + (choices[m] == '|');
    }
    return -1;
}

double ir_kernel_param(const Node *n, Op op, int i)
{
    const OpParam *p = &op_info[op].param[i];
    if (p->choices) {
        const char *s = ir_attr_s(n, p->attr, NULL);
        return s ? choice_index(p->choices, s) : 0;
    }
    return p->attr ? ir_attr_f(n, p->attr, p->value) : p->value;
}

int ir_attr_choice(const Graph *g, const Node *n, const char *name, const char *choices)
{
    const char *s = ir_attr_s(n, name, NULL);
    int k = s ? choice_index(choices, s) : 0;
    if (k < 0)
        node_fatal(g, n, "attribute %s '%s' is not supported (fsdpc knows %s)", name, ir_q(s), choices);
    return k;
}

void ir_kernel_param_check(const Graph *g, const Node *n)
{
    for (int i = 0; i < 2; i++) {
        const OpParam *p = &op_info[n->op].param[i];
        if (p->choices)
            ir_attr_choice(g, n, p->attr, p->choices);
    }
}

int ir_find_value(const Graph *g, const char *name)
{
    for (int i = 0; i < g->nval; i++)
        if (!strcmp(g->val[i].name, name))
            return i;
    return -1;
}

int ir_open_regular(const char *path, int flags, int64_t *size, const char **why)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | flags), fl = -1;
    if (fd < 0 || fstat(fd, &st) || (S_ISREG(st.st_mode) && ((fl = fcntl(fd, F_GETFL)) < 0 ||
                                                             fcntl(fd, F_SETFL, fl & ~O_NONBLOCK)))) {
        *why = strerror(errno);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = S_ISFIFO(st.st_mode)  ? "not a regular file (a FIFO): give a file"
               : S_ISDIR(st.st_mode) ? "not a regular file (a directory): give a file"
                                     : "not a regular file (a device or socket): give a file";
        close(fd);
        return -1;
    }
    *size = (int64_t)st.st_size;
    return fd;
}

/* ---- weights left in external data files ------------------------------------
 * The frontend reads an external float initializer's bytes only when asked:
 * passes read data of shapes, indices and scalars, and OUT.init is written
 * from the file a chunk at a time, so a compile never holds the weights. */

const char *ir_ext_stream(const ExtData *e, void (*put)(void *ctx, const void *p, size_t n), void *ctx)
{
    if (e->missing)
        return e->missing;
    int64_t size = 0;
    const char *why;
    /* a real path (no symbolic link to follow) */
    int fd = ir_open_regular(e->file, O_NOFOLLOW, &size, &why);
    if (fd < 0)
        return ir_fmt("%s: cannot open its external data file '%s': %s", e->what, ir_q(e->loc), why);
    const char *err = NULL;
    if (e->off > size || e->len > size - e->off)
        err = ir_fmt("%s needs %lld bytes at offset %lld of '%s', which has %lld bytes (is it truncated?)", e->what,
                     (long long)e->len, (long long)e->off, ir_q(e->loc), (long long)size);
    size_t cap = e->len < (int64_t)IR_CHUNK ? (size_t)e->len + 1 : IR_CHUNK;
    char *buf = err ? NULL : malloc(cap);
    if (!err && !buf)
        err = ir_fmt("%s: out of memory (%zu bytes) reading its external data", e->what, cap);
    for (int64_t got = 0; !err && got < e->len;) { /* got < len <= size - off: off + got never wraps */
        size_t want = e->len - got < (int64_t)cap ? (size_t)(e->len - got) : cap;
        ssize_t r = pread(fd, buf, want, (off_t)(e->off + got));
        if (r <= 0)
            err = ir_fmt("%s: reading its external data file '%s' failed: %s", e->what, ir_q(e->loc),
                         r ? strerror(errno) : "unexpected end of file");
        else
            put(ctx, buf, (size_t)r), got += r;
    }
    free(buf);
    close(fd);
    return err;
}

static void put_mem(void *ctx, const void *p, size_t n)
{
    char **at = ctx;
    memcpy(*at, p, n);
    *at += n;
}

void *ir_ext_load(const Graph *g, const ExtData *e)
{
    char *p = ir_alloc((size_t)e->len + 1), *at = p;
    const char *err = ir_ext_stream(e, put_mem, &at);
    if (err)
        fatal("%s: %s", g->opt->model, err);
    return p;
}

const void *ir_data(const Graph *g, int v)
{
    Value *x = &g->val[v];
    int i = x->init_index;
    if (!x->data && x->digest)
        fatal("%s: value %%%d '%s': its bytes are not in the IR text (data=%s), and this pass reads them: write "
              "them inline (data=[...])", g->opt->model, v, ir_q(x->name), x->digest);
    if (x->data || i < 0 || i >= g->ninit || !g->ext[i].loc)
        return x->data;
    return x->data = ir_ext_load(g, &g->ext[i]);
}

int64_t shape_numel(const Shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++)
        n *= s->dim[i];
    return n;
}

int64_t shape_count(const Shape *s)
{
    if (s->rank < 0 || s->rank > MAX_RANK)
        return -1;
    /* the bound is on the product of the non-zero dims, so that a zero-sized
     * tensor's strides (products of trailing dims) cannot wrap either */
    int64_t span = 1, n = 1;
    for (int i = 0; i < s->rank; i++) {
        if (s->dim[i] < 0 || s->dim[i] > MAX_NUMEL)
            return -1;
        if (s->dim[i] && span > MAX_NUMEL / s->dim[i])
            return -1;
        span *= s->dim[i] ? s->dim[i] : 1;
        n *= s->dim[i];
    }
    return n;
}

const char *shape_str(const Shape *s)
{
    char *buf = ir_alloc(24 * MAX_RANK + 4), *p = buf;
    *p++ = '[';
    for (int i = 0; i < s->rank && i < MAX_RANK; i++)
        p += sprintf(p, i ? ",%lld" : "%lld", (long long)s->dim[i]);
    strcpy(p, "]");
    return buf;
}

int ir_wanted(const Graph *g, int v)
{
    for (int k = 0; k < g->noutput; k++)
        if (g->output[k] == v)
            return 1;
    const char *name = g->val[v].name, *pred = g->opt->loss_pred, *target = g->opt->loss_target;
    return (pred && !strcmp(name, pred)) || (target && !strcmp(name, target));
}

int shape_eq(const Shape *a, const Shape *b)
{
    if (a->rank != b->rank)
        return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->dim[i] != b->dim[i])
            return 0;
    return 1;
}

size_t dtype_size(DType t)
{
    static const size_t size[DT_COUNT] = {
#define DTYPE(name, ctype, sz, onnx, kdt, text, model, wide, kind, npy, numpy) [DT_##name] = sz,
#include "dtypes.def"
    };
    return (unsigned)t < DT_COUNT ? size[t] : 0;
}

const char *dtype_name(DType t)
{
    static const char *names[DT_COUNT] = {
        [DT_UNDEF] = "undef",
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) [DT_##name] = text,
#include "dtypes.def"
    };
    return (unsigned)t < DT_COUNT ? names[t] : "?";
}

DType dtype_wide(DType t)
{
    static const DType wide[DT_COUNT] = {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) [DT_##name] = DT_##wide,
#include "dtypes.def"
    };
    return (unsigned)t < DT_COUNT ? wide[t] : DT_UNDEF;
}

char dtype_kind(DType t)
{
    static const char kind[DT_COUNT] = {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, k, npy, numpy) [DT_##name] = k,
#include "dtypes.def"
    };
    return (unsigned)t < DT_COUNT ? kind[t] : 0;
}

int dtype_is_float(DType t) { return dtype_kind(t) == 'f' && dtype_wide(t) == t; }

/* The element accessors: one case per dtypes.def row, through its ctype.  A 16-bit float's ctype is its bits,
 * which no arithmetic conversion may touch: those rows die. */
#define IS_BITS_(t) (dtype_kind(t) == 'f' && dtype_size(t) == 2)

int64_t dtype_get_int(const void *d, int64_t i, DType t)
{
    if (dtype_kind(t) == 'f')
        die("dtype_get_int: %s is not an integer", dtype_name(t));
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) \
    case DT_##name: return (int64_t)((const ctype *)d)[i];
#include "dtypes.def"
    default: die("dtype_get_int: dtype %d", (int)t);
    }
}

void dtype_set_int(void *d, int64_t i, DType t, int64_t v)
{
    if (dtype_kind(t) == 'f')
        die("dtype_set_int: %s is not an integer", dtype_name(t));
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) \
    case DT_##name: ((ctype *)d)[i] = (ctype)v; break;
#include "dtypes.def"
    default: die("dtype_set_int: dtype %d", (int)t);
    }
}

void dtype_int_range(DType t, int64_t *lo, int64_t *hi)
{
    int bits = 8 * (int)dtype_size(t);
    switch (dtype_kind(t)) {
    case 'b': *lo = 0, *hi = 1; break;
    case 'i': *hi = bits == 64 ? INT64_MAX : ((int64_t)1 << (bits - 1)) - 1, *lo = -*hi - 1; break;
    case 'u': *lo = 0, *hi = bits == 64 ? INT64_MAX : ((int64_t)1 << bits) - 1; break;
    default: die("dtype_int_range: %s is not an integer", dtype_name(t));
    }
}

double dtype_get_f(const void *d, int64_t i, DType t)
{
    if (IS_BITS_(t))
        die("dtype_get_f: %s holds bits", dtype_name(t));
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) \
    case DT_##name: return (double)((const ctype *)d)[i];
#include "dtypes.def"
    default: die("dtype_get_f: dtype %d", (int)t);
    }
}

void dtype_set_f(void *d, int64_t i, DType t, double v)
{
    if (IS_BITS_(t))
        die("dtype_set_f: %s holds bits", dtype_name(t));
    if (dtype_kind(t) == 'b')
        v = v != 0;
    switch (t) {
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) \
    case DT_##name: ((ctype *)d)[i] = (ctype)v; break;
#include "dtypes.def"
    default: die("dtype_set_f: dtype %d", (int)t);
    }
}
#undef IS_BITS_

const char *role_name(Role r)
{
    static const char *names[R_COUNT] = {"act", "input", "param", "const", "grad", "optstate",
                                         "flat", "flatgrad", "shard", "gradshard", "stateshard"};
    return r < R_COUNT ? names[r] : "?";
}

int64_t value_numel(const Graph *g, int v)
{
    return shape_numel(&g->val[v].shape);
}

void ir_link(Graph *g)
{
    for (int i = 0; i < g->nval; i++) {
        g->val[i].producer = -1;
        g->val[i].nuses = 0;
    }
    for (int i = 0; i < g->nnode; i++) {
        Node *n = &g->node[i];
        for (int j = 0; j < n->nout; j++)
            g->val[n->out[j]].producer = i;
        for (int j = 0; j < n->nin; j++)
            if (n->in[j] >= 0)
                g->val[n->in[j]].nuses++;
    }
}

int ir_root(const Graph *g, int v) { return g->val[v].alias_of >= 0 ? g->val[v].alias_of : v; }

int ir_attn_rows_axis(const Node *n, const Shape *x) { return x->rank - (ir_attr_i(n, "heads", 0) ? 3 : 2); }

int64_t ir_attn_problems(const Node *n, const Shape *x)
{
    const int rows = ir_attn_rows_axis(n, x);
    int64_t p = 1;
    for (int d = 0; d < rows; d++) /* the dims before the rows, and heads' H after them */
        p *= x->dim[d];
    return rows == x->rank - 3 ? p * x->dim[x->rank - 2] : p;
}

int ir_writes(const Graph *g, const Node *n, int r)
{
    for (int j = 0; j < n->nout; j++)
        if (n->out[j] >= 0 && ir_root(g, n->out[j]) == r)
            return 1;
    int inplace = (op_info[n->op].flags & F_OPT) ? n->nin : n->op == OP_Assign || n->op == OP_ReduceScatter;
    for (int j = 0; j < inplace && j < n->nin; j++)
        if (n->in[j] >= 0 && ir_root(g, n->in[j]) == r)
            return 1;
    return 0;
}

void ir_set_nodes(Graph *g, Node *nodes, int n)
{
    g->node = nodes;
    g->nnode = g->capnode = n;
    ir_link(g);
}

int ir_const(Graph *g, const char *name, DType dt, const Shape *s, const void *data)
{
    int v = ir_value(g, name, dt, s, R_CONST);
    size_t n = (size_t)shape_numel(s) * dtype_size(dt);
    g->val[v].data = memcpy(ir_alloc(n ? n : 1), data, n);
    g->val[v].persistent = 1;
    return v;
}

int ir_like(Graph *g, const char *name, int like, Role role)
{
    Shape s = g->val[like].shape; /* copy: ir_value may move g->val */
    return ir_value(g, name, g->val[like].dtype, &s, role);
}
