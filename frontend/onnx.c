/* onnx.c — the frontend: an ONNX model file → a Graph.
 *
 * The file is untrusted, so everything here is a check followed by a copy:
 *
 *   read the bytes (kept in g->model_bytes: export rewrites the original)
 *   → check protobuf nesting depth (protobuf-c recurses without a limit)
 *   → unpack with protobuf-c code generated from the system's onnx.proto
 *   → opset of the default domain must be 7..28 (an op newer than it: refused)
 *   → model-local functions inlined: a flat list of nodes (each with its opset;
 *                          frontend/inline.c)
 *   → every op one the frontend accepts (ir/ops.def; docs/ops.md lists them)
 *   → initializers      → R_CONST values with host data (raw, typed or external;
 *                          external float ones only located: ir_data reads them;
 *                          frontend/tensor.c)
 *   → graph signature   → Value.sig of the initializers PyTorch's exporter marks
 *                          (this and the next two: frontend/signature.c);
 *                          G->sig_lost: parameters the exported program lists
 *                          that the graph lacks (autodiff refuses those)
 *   → padding_idx       → Value.pad_row (export_torch.py's model metadata)
 *   → non-persistent buffers and tied aliases (the same metadata): checked to
 *                          name initializers (--export-safetensors reads them)
 *   → graph inputs      → R_INPUT values, symbolic dims bound by --dim
 *   → nodes, file order → IR nodes; Constant nodes become R_CONST values; a node
 *                          of opset 7-12 rewritten into its opset 13 form where
 *                          the versions differ (frontend/opset_old.c); FLOAT
 *                          attributes (float32 in ONNX) read as the shortest
 *                          decimal that rounds to them (attr_float)
 *   → graph outputs     → g->output
 *
 * Everything one load knows is in its Fe (frontend/fe.h: the model's path and
 * bytes, the name table, the opset, the inlined node list), made by onnx_load
 * and passed to every function of frontend/: nothing survives a load but the
 * Graph and what the arena holds, so loads share nothing (--report loads the
 * model once per strategy, the fuzzer many models in one process) and need no
 * resets.
 *
 * Every problem with the model is one fatal() line: "MODEL: what, where, and
 * what to do".  Names are kept byte-exact in the IR (export and later error
 * messages use them); in our own messages they pass through ir_q() (ir/ir.c), which
 * replaces control characters and truncates, so a message stays one line.
 *
 * ONNX values are looked up by name in a small open-addressing table.  Before
 * loading, every name the file defines is entered as RESERVED; a name gets its
 * value id when its definition is reached.  That tells "defined later" (not
 * topologically sorted) from "never defined", and lets derived names (tensor
 * attributes, omitted outputs) avoid every name of the file.
 *
 * Data is copied into the IR arena in host byte order; the raw_data and
 * external formats are little-endian, so fsdpc assumes a little-endian host.
 */
#define _XOPEN_SOURCE 700  /* realpath */
#include "fe.h"
#include "opset_old.h"
#include "rules/tensor.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- messages ------------------------------------------------------------ */

_Noreturn void fe_bad(Fe *fe, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *msg = ir_alloc((size_t)n + 1);
    vsnprintf(msg, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    va_end(ap);
    fatal("%s: %s", fe->path, msg);
}


/* ---- the name table -------------------------------------------------------- */

uint64_t fe_hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211u;
    return h;
}

static Name *probe(Name *tab, size_t cap, const char *key)
{
    size_t i = fe_hash(key) & (cap - 1);
    while (tab[i].key && strcmp(tab[i].key, key))
        i = (i + 1) & (cap - 1);
    return &tab[i];
}

int fe_find(Fe *fe, const char *key)
{
    if (!fe->ncap)
        return UNSEEN;
    Name *e = probe(fe->names, fe->ncap, key);
    return e->key ? e->id : UNSEEN;
}

/* The entry for key, entered as RESERVED if new. */
Name *fe_slot(Fe *fe, const char *key)
{
    if (2 * (fe->nused + 1) > fe->ncap) {
        size_t cap = fe->ncap ? 2 * fe->ncap : 1024;
        Name *tab = ir_alloc(cap * sizeof *tab);
        for (size_t i = 0; i < fe->ncap; i++)
            if (fe->names[i].key)
                *probe(tab, cap, fe->names[i].key) = fe->names[i];
        fe->names = tab;
        fe->ncap = cap;
    }
    Name *e = probe(fe->names, fe->ncap, key);
    if (!e->key) {
        e->key = key;
        e->id = RESERVED;
        fe->nused++;
    }
    return e;
}

/* base, or base_1, base_2, ...: a name nothing in the file or the IR uses. */
const char *fe_fresh(Fe *fe, const char *base)
{
    const char *s = base;
    for (int k = 1; fe_find(fe, s) != UNSEEN; k++)
        s = ir_fmt("%s_%d", base, k);
    return s;
}

/* fe_fresh(base), reserved: no later derived name takes it. */
const char *fe_fresh_reserved(Fe *fe, const char *base)
{
    const char *s = fe_fresh(fe, base);
    fe_slot(fe, s);
    return s;
}

/* fe_fresh_reserved as opset_old.c calls it (OldNode.fresh) */
static const char *old_fresh(void *fe, const char *base) { return fe_fresh_reserved(fe, base); }

static int use(Fe *fe, const char *name, const char *what, int required)
{
    if (!*name) {
        if (required)
            fe_bad(fe, "%s leaves a required input empty", what);
        return -1;
    }
    int id = fe_find(fe, name);
    if (id == RESERVED)
        fe_bad(fe, "%s uses '%s' before the node that defines it (ONNX nodes must be topologically "
            "sorted)", what, ir_q(name));
    if (id < 0)
        fe_bad(fe, "%s uses '%s', which no earlier node, input or initializer defines", what, ir_q(name));
    return id;
}

static void define(Fe *fe, const char *name, int v, const char *what)
{
    Name *e = fe_slot(fe, name);
    if (e->id >= 0)
        fe_bad(fe, "%s defines '%s', which is already defined (an ONNX value has one producer)", what,
            ir_q(name));
    e->id = v;
}

/* ---- reading and unpacking ------------------------------------------------ */

/* Opens file for reading (ir_open_regular: a FIFO, device or directory is refused, never waited on); its size
 * into *size.  what names the file in messages. */
int fe_open_regular(Fe *fe, const char *file, const char *what, int64_t *size)
{
    const char *why;
    int fd = ir_open_regular(file, 0, size, &why);
    if (fd < 0)
        fe_bad(fe, "cannot open %s: %s", what, why);
    return fd;
}

/* the model file into the arena (fsdpc --report loads it once per strategy and releases all but the first) */
static size_t read_model(Fe *fe)
{
    int64_t size;
    int fd = fe_open_regular(fe, fe->path, "the model", &size);
    if (size > (int64_t)MAX_MODEL_BYTES)
        fe_bad(fe, "the model file is larger than 2 GiB, the protobuf limit: save the weights as "
            "external data (onnx.save_model(m, path, save_as_external_data=True))");
    size_t n = 0, cap = (size_t)size;
    fe->bytes = ir_alloc(cap + 1);
    while (n < cap) { /* a file that shrinks meanwhile is read as far as it goes */
        ssize_t r = read(fd, fe->bytes + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            fatal("%s: cannot read the model: %s", fe->path, strerror(errno));
        if (!r)
            break;
        n += (size_t)r;
    }
    close(fd);
    return n;
}

int fe_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int sh = 0; sh < 64 && *p < end; sh += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << sh;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

/* Reads the field at *p: its tag, and for a length-delimited one (wire type 2) its bytes, *len of them at
 * *data (NULL otherwise).  -1: malformed (a bad varint, a length past end, a group or unknown wire type). */
int fe_next_field(const uint8_t **p, const uint8_t *end, uint64_t *tag, const uint8_t **data, uint64_t *len)
{
    uint64_t v;
    *data = NULL;
    *len = 0;
    if (fe_varint(p, end, tag))
        return -1;
    switch (*tag & 7) {
    case 0: return fe_varint(p, end, &v);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
    case 2:
        if (fe_varint(p, end, len) || *len > (uint64_t)(end - *p))
            return -1;
        *data = *p;
        *p += *len;
        return 0;
    default: return -1;
    }
}

/* Walk the wire format with the generated descriptors, checking that messages
 * nest at most MAX_DEPTH deep (a 30 KB file of nested subgraphs overflows
 * protobuf-c's stack otherwise).  -1: malformed; 1: too deep; 0: fine. */
int fe_check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                       int depth)
{
    if (depth > MAX_DEPTH)
        return 1;
    while (p < end) {
        uint64_t tag, len;
        const uint8_t *data;
        if (fe_next_field(&p, end, &tag, &data, &len))
            return -1;
        if (!data)
            continue;
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int r = fe_check_depth(f->descriptor, data, data + len, depth + 1);
            if (r)
                return r;
        }
    }
    return 0;
}

static void *pb_alloc(void *data, size_t n)
{
    (void)data;
    return ir_alloc(n);
}

static void pb_free(void *data, void *p)
{
    (void)data, (void)p;
}

/* protobuf-c's allocations in the IR arena, as everything else: ir_reset releases them too */
ProtobufCAllocator fe_arena = {.alloc = pb_alloc, .free = pb_free};

static Onnx__ModelProto *unpack(Fe *fe, const uint8_t *buf, size_t len)
{
    if (!len)
        fe_bad(fe, "the file is empty (not an ONNX model)");
    int r = fe_check_depth(&onnx__model_proto__descriptor, buf, buf + len, 0);
    if (r > 0)
        fe_bad(fe, "messages nest more than %d deep (subgraphs inside subgraphs); fsdpc does not "
            "accept such a model", MAX_DEPTH);
    Onnx__ModelProto *m = r ? NULL : onnx__model_proto__unpack(&fe_arena, len, buf);
    if (!m)
        fe_bad(fe, "not an ONNX model (protobuf parse failed; is the file truncated?)");
    return m;
}

int fe_default_domain(const char *d)
{
    return !d || !*d || !strcmp(d, "ai.onnx");
}

static void check_opset(Fe *fe, const Onnx__ModelProto *m)
{
    int64_t v = -1;
    for (size_t i = 0; i < m->n_opset_import; i++)
        if (fe_default_domain(m->opset_import[i]->domain))
            v = m->opset_import[i]->version;
    if (v < 0)
        fe_bad(fe, "the model imports no opset of the default ONNX domain; fsdpc supports opsets %d to %d",
            OPSET_MIN, OPSET_MAX);
    if (v < OPSET_MIN)
        fe_bad(fe, "the model uses ONNX opset %lld; fsdpc supports opsets %d to %d (convert it with "
            "onnx.version_converter.convert_version(model, %d), or export it again at a newer opset)",
            (long long)v, OPSET_MIN, OPSET_MAX, OPSET_MIN);
    if (v > OPSET_MAX)
        fe_bad(fe, "the model uses ONNX opset %lld; fsdpc supports opsets %d to %d, and does not know what opset %lld "
            "changed (export it at opset %d or below, e.g. torch.onnx.export(..., opset_version=%d))",
            (long long)v, OPSET_MIN, OPSET_MAX, (long long)v, OPSET_MAX, OPSET_MAX);
    fe->opset = v;
}

/* ---- initializers and graph inputs ----------------------------------------- */

static void load_initializers(Fe *fe, const Onnx__GraphProto *gp)
{
    if (gp->n_sparse_initializer)
        fe_bad(fe, "the graph has sparse initializers, which fsdpc does not support (store them dense)");
    if (gp->n_initializer > INT_MAX / 2)
        fe_bad(fe, "the graph has too many initializers");
    fe->g->ninit = (int)gp->n_initializer;
    fe->g->ext = ir_alloc(sizeof *fe->g->ext * (gp->n_initializer + 1));
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        if (!t->name || !*t->name)
            fe_bad(fe, "initializer #%zu has no name", i);
        const char *what = ir_fmt("initializer '%s'", ir_q(t->name));
        if (fe_find(fe, t->name) >= 0)
            fe_bad(fe, "%s is defined twice (initializer names must be unique)", what);
        define(fe, t->name, fe_const_tensor(fe, t->name, t, what, (int)i), what);
    }
}

/* Calls fn(dim_param) for every symbolic dim of the graph's typed values. */
static void each_dim_param(const Onnx__GraphProto *gp, void (*fn)(const char *, void *), void *ctx)
{
    size_t n[3] = {gp->n_input, gp->n_output, gp->n_value_info};
    Onnx__ValueInfoProto **vi[3] = {gp->input, gp->output, gp->value_info};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < n[k]; i++) {
            const Onnx__TypeProto *tp = vi[k][i]->type;
            if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
                !tp->tensor_type->shape)
                continue;
            const Onnx__TensorShapeProto *sp = tp->tensor_type->shape;
            for (size_t d = 0; d < sp->n_dim; d++)
                if (sp->dim[d]->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM &&
                    sp->dim[d]->dim_param && *sp->dim[d]->dim_param)
                    fn(sp->dim[d]->dim_param, ctx);
        }
}

/* Looks for want; lists the first 10 distinct names for the message. */
typedef struct { const char *want; int found, n; const char *seen[10]; char *list; } DimScan;

static void scan_dim(const char *p, void *ctx)
{
    DimScan *d = ctx;
    d->found |= !strcmp(p, d->want);
    for (int i = 0; i < d->n && i < 10; i++)
        if (!strcmp(d->seen[i], p))
            return;
    if (d->n <= 10)
        d->list = d->n == 10 ? ir_fmt("%s, ...", d->list)
                             : ir_fmt("%s%s%s", d->list, d->n ? ", " : "", ir_q(d->seen[d->n] = p));
    d->n += d->n <= 10;
}

/* Every --dim NAME must name a symbolic dim of the model (catches typos). */
static void check_dim_options(const Options *opt, const Onnx__GraphProto *gp)
{
    for (int i = 0; i < opt->ndims; i++) {
        DimScan d = {.want = opt->dim_name[i], .list = ""};
        each_dim_param(gp, scan_dim, &d);
        if (!d.found)
            fatal("--dim %s: the model has no dimension named '%s' (%s%s)", ir_q(d.want), ir_q(d.want),
                  d.n ? "its symbolic dims: " : "it has no symbolic dims", d.list);
    }
}

static void load_input(Fe *fe, const Options *opt, const Onnx__ValueInfoProto *in)
{
    const char *what = ir_fmt("input '%s'", ir_q(in->name));
    const Onnx__TypeProto *tp = in->type;
    if (!tp || tp->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
        fe_bad(fe, "%s is not a tensor (fsdpc needs a tensor type with dtype and shape)", what);
    DType dt = tensor_from_onnx(tp->tensor_type->elem_type);
    if (dt == DT_UNDEF)
        fe_bad_dtype(fe, what, tp->tensor_type->elem_type);
    const Onnx__TensorShapeProto *sp = tp->tensor_type->shape;
    if (!sp)
        fe_bad(fe, "%s has no shape; the model must declare it (fsdpc compiles static shapes)", what);
    if (sp->n_dim > MAX_RANK)
        fe_bad(fe, "%s has rank %zu; fsdpc supports rank <= %d", what, sp->n_dim, MAX_RANK);
    Shape s = {.rank = (int)sp->n_dim};
    for (size_t i = 0; i < sp->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = sp->dim[i];
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            if (d->dim_value < 0)   /* 0 is a legal (empty) ONNX size */
                fe_bad(fe, "%s dim %zu is %lld; sizes cannot be negative", what, i, (long long)d->dim_value);
            s.dim[i] = d->dim_value;
            continue;
        }
        if (d->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM || !d->dim_param ||
            !*d->dim_param)
            fe_bad(fe, "%s dim %zu has neither a size nor a name; the model must declare it (re-export "
                "with a fixed or named dim, then bind names with --dim NAME=N)", what, i);
        int k = 0;
        while (k < opt->ndims && strcmp(opt->dim_name[k], d->dim_param))
            k++;
        if (k == opt->ndims && opt->dim_default > 0) {
            s.dim[i] = opt->dim_default;
            continue;
        }
        if (k == opt->ndims)
            fe_bad(fe, "%s dim %zu is symbolic ('%s'): bind it with --dim %s=N", what, i,
                ir_q(d->dim_param), ir_q(d->dim_param));
        if (opt->dim_value[k] <= 0)
            fatal("--dim %s=%lld: a dimension must be positive", ir_q(d->dim_param),
                  (long long)opt->dim_value[k]);
        s.dim[i] = opt->dim_value[k];
    }
    if (shape_count(&s) < 0)
        fe_bad(fe, "%s has shape %s, beyond 2^40 elements; fsdpc cannot hold it", what, shape_str(&s));
    int v = ir_value(fe->g, in->name, dt, &s, R_INPUT);
    fe_slot(fe, fe->g->val[v].name)->id = v;
    fe->g->input[fe->g->ninput++] = v;
}

static void load_inputs(Fe *fe, const Options *opt, const Onnx__GraphProto *gp)
{
    if (gp->n_input > INT_MAX / 2)
        fe_bad(fe, "the graph has too many inputs");
    fe->g->input = ir_alloc(sizeof(int) * (gp->n_input + 1));
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *in = gp->input[i];
        if (!in->name || !*in->name)
            fe_bad(fe, "graph input #%zu has no name", i);
        int id = fe_find(fe, in->name);
        if (id >= 0 && fe->g->val[id].init_index >= 0)
            continue;                 /* old-style ONNX: initializers listed as inputs */
        if (id >= 0)
            fe_bad(fe, "input '%s' is listed twice among the graph inputs", ir_q(in->name));
        load_input(fe, opt, in);
    }
}

/* ---- nodes --------------------------------------------------------------- */

/* Old ops ONNX deprecated in favour of another, read as that op at the opsets
 * before `until`: Upsample (7 to 9) as the Resize it equals (opset_old.c
 * rewrites its inputs), Scatter (9, 10) as ScatterElements (the same op). */
static const struct { const char *name; Op op; int until; } renamed[] = {
    {"Upsample", OP_Resize, 10},
    {"Scatter", OP_ScatterElements, 11},
};

/* n's row of renamed[], or -1. */
static int renamed_op(const Onnx__NodeProto *n)
{
    for (int k = 0; k < (int)(sizeof renamed / sizeof *renamed); k++)
        if (fe_default_domain(n->domain) && n->op_type && !strcmp(n->op_type, renamed[k].name))
            return k;
    return -1;
}

static int op_lookup(const Onnx__NodeProto *n)
{
    if (!fe_default_domain(n->domain) || !n->op_type)
        return -1;
    if (renamed_op(n) >= 0)
        return renamed[renamed_op(n)].op;
    for (int op = 0; op < OP_COUNT; op++)
        if (op_info[op].since && !strcmp(op_info[op].name, n->op_type))
            return op;
    return -1;
}

const char *fe_node_label(size_t i, const Onnx__NodeProto *n)
{
    const char *op = ir_q(n->op_type);
    return n->name && *n->name ? ir_fmt("node '%s' (%s)", ir_q(n->name), op)
                               : ir_fmt("node #%zu (%s)", i, op);
}

typedef struct { const char *op, *dom, *node; int n; } Unsup;

/* The unsupported ops in one short line: each op type (the first MAX_KINDS)
 * with its first node and how many nodes use it, then where the accepted ops
 * are listed (docs/ops.md, generated from ir/ops.def). */
static void check_ops(Fe *fe)
{
    Unsup u[MAX_KINDS];
    int nu = 0, other = 0;
    for (size_t i = 0; i < fe->nflat; i++) {
        const Onnx__NodeProto *n = fe->flat[i].n;
        if (op_lookup(n) >= 0)
            continue;
        const char *op = n->op_type ? n->op_type : "", *dom = n->domain ? n->domain : "";
        int k = 0;
        while (k < nu && (strcmp(u[k].op, op) || strcmp(u[k].dom, dom)))
            k++;
        if (k == nu && nu == MAX_KINDS) {
            other++;
            continue;
        }
        if (k == nu)
            u[nu++] = (Unsup){.op = op, .dom = dom,
                              .node = n->name && *n->name ? ir_fmt("'%s'", ir_q(n->name))
                                                          : ir_fmt("#%zu", fe->flat[i].idx)};
        u[k].n++;
    }
    if (!nu)
        return;
    char *s = "";
    for (int k = 0; k < nu; k++)
        s = ir_fmt("%s%s%s%s%s%s (node %s%s)", s, k ? ", " : "", ir_q(u[k].op), *u[k].dom ? " [domain " : "",
                   ir_q(u[k].dom), *u[k].dom ? "]" : "", u[k].node,
                   u[k].n > 1 ? ir_fmt(" and %d more", u[k].n - 1) : "");
    if (other)
        s = ir_fmt("%s and %d more node%s of other ops", s, other, other > 1 ? "s" : "");
    fe_bad(fe, "unsupported op%s %s; docs/ops.md lists the ops fsdpc accepts", nu > 1 || other ? "s" : "", s);
}

/* A FLOAT attribute as the double its writer meant: ONNX stores float32, so an exporter's epsilon 1e-5 arrives
 * as 9.99999974737875e-06.  The shortest decimal that rounds to the same float32 (1e-05) is taken instead:
 * float32 kernels round it back to the very same float, and float64 ones compute with PyTorch's own double
 * (a float64 ResNet-50's step-1 gradients differed from PyTorch's by 2e-9 through BatchNorm's epsilon alone,
 * 1e-11 without it).  Nine significant digits always round-trip a float32. */
static double attr_float(float f)
{
    char buf[32];
    for (int p = 1; p <= 9 && isfinite(f); p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        double d = strtod(buf, NULL);
        if ((float)d == f)
            return d;
    }
    return f;
}

static void add_attr(Fe *fe, int nid, const Onnx__AttributeProto *a, const char *what)
{
    if (!a->name || !*a->name)
        fe_bad(fe, "%s has an attribute without a name", what);
    const char *aw = ir_fmt("%s attribute '%s'", what, ir_q(a->name));
    Attr *r;
    switch (a->type) {
    case AT(INT):
        ir_attr_add(fe->g, nid, a->name, A_INT)->i = a->i;
        break;
    case AT(FLOAT):
        ir_attr_add(fe->g, nid, a->name, A_FLOAT)->f = attr_float(a->f);
        break;
    case AT(INTS):
        if (a->n_ints > INT_MAX)
            fe_bad(fe, "%s is too long", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_INTS);
        r->n = (int)a->n_ints;
        r->ints = ir_alloc(sizeof(int64_t) * (a->n_ints + 1));
        if (a->n_ints)
            memcpy(r->ints, a->ints, sizeof(int64_t) * a->n_ints);
        break;
    case AT(FLOATS):
        if (a->n_floats > INT_MAX)
            fe_bad(fe, "%s is too long", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_FLOATS);
        r->n = (int)a->n_floats;
        r->floats = ir_alloc(sizeof(double) * (a->n_floats + 1));
        for (size_t i = 0; i < a->n_floats; i++)
            r->floats[i] = attr_float(a->floats[i]);
        break;
    case AT(STRING):
        if (a->s.len && memchr(a->s.data, 0, a->s.len))
            fe_bad(fe, "%s contains a NUL byte", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_STRING);
        r->s = ir_alloc(a->s.len + 1);
        if (a->s.len)
            memcpy(r->s, a->s.data, a->s.len);
        break;
    case AT(STRINGS):
        if (a->n_strings > 64)
            fe_bad(fe, "%s lists %zu strings; fsdpc reads at most 64", aw, a->n_strings);
        r = ir_attr_add(fe->g, nid, a->name, A_STRINGS);
        r->n = (int)a->n_strings;
        r->strs = ir_alloc(sizeof(char *) * (a->n_strings + 1));
        for (size_t i = 0; i < a->n_strings; i++) {
            const ProtobufCBinaryData *b = &a->strings[i];
            if (b->len > 256 || (b->len && memchr(b->data, 0, b->len)))
                fe_bad(fe, "%s: string %zu is longer than 256 bytes or holds a NUL byte", aw, i);
            r->strs[i] = ir_alloc(b->len + 1);
            if (b->len)
                memcpy(r->strs[i], b->data, b->len);
        }
        break;
    case AT(TENSOR): {
        if (!a->t)
            fe_bad(fe, "%s has no tensor", aw);
        int t = fe_const_tensor(fe, fe_fresh(fe, ir_fmt("%s.%s", fe->g->node[nid].name, a->name)), a->t, aw, -1);
        define(fe, fe->g->val[t].name, t, aw);
        ir_attr_add(fe->g, nid, a->name, A_TENSOR)->t = t;
        break;
    }
    default: {
        static const char *tn[] = {"UNDEFINED", "FLOAT", "INT", "STRING", "TENSOR", "GRAPH",
                                   "FLOATS", "INTS", "STRINGS", "TENSORS", "GRAPHS",
                                   "SPARSE_TENSOR", "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
        int k = (int)a->type;
        fe_bad(fe, "%s has type %s, which fsdpc does not support in attributes", aw,
            k >= 0 && k < (int)(sizeof tn / sizeof *tn) ? tn[k] : ir_fmt("%d", k));
    }
    }
}

/* Constant: no node; its output becomes an R_CONST value. */
static void constant_node(Fe *fe, const Onnx__NodeProto *n, const char *what)
{
    if (n->n_input || n->n_output != 1 || !*n->output[0])
        fe_bad(fe, "%s must have no inputs and one output", what);
    if (n->n_attribute != 1 || !n->attribute[0]->name)
        fe_bad(fe, "%s must have exactly one attribute (value, value_float, value_floats, value_int or "
            "value_ints)", what);
    const Onnx__AttributeProto *a = n->attribute[0];
    const char *out = n->output[0], *an = a->name;
    const char *aw = ir_fmt("%s attribute '%s'", what, ir_q(an));
    int v;
    if (!strcmp(an, "value") && a->type == AT(TENSOR) && a->t)
        v = fe_const_tensor(fe, out, a->t, aw, -1);
    else if (!strcmp(an, "value_float") && a->type == AT(FLOAT))
        v = fe_const_list(fe, out, DT_F32, &a->f, 1, 1);
    else if (!strcmp(an, "value_floats") && a->type == AT(FLOATS))
        v = fe_const_list(fe, out, DT_F32, a->floats, a->n_floats, 0);
    else if (!strcmp(an, "value_int") && a->type == AT(INT))
        v = fe_const_list(fe, out, DT_I64, &a->i, 1, 1);
    else if (!strcmp(an, "value_ints") && a->type == AT(INTS))
        v = fe_const_list(fe, out, DT_I64, a->ints, a->n_ints, 0);
    else
        fe_bad(fe, "%s is not supported (fsdpc accepts value, value_float(s) and value_int(s); not "
            "sparse_value or strings)", aw);
    define(fe, out, v, what);
}

/* A part of node n newer than opset (ops.def's SINCE_IN, WAS_ATTR, SINCE_ATTR, SINCE_VALUE rows): refused. */
static void newer_parts(Fe *fe, const Node *n, const char *what, int64_t opset)
{
    const char *op = op_info[n->op].name;
    for (const OpSince *f = op_since; f->op != OP_COUNT; f++) {
        if (f->op != n->op || opset >= f->opset)
            continue;
        if (f->input >= 0 && n->nin > f->input && f->was_attr)
            fe_bad(fe, "%s: %s takes %s as an attribute before opset %d; this node gives it as input %d (at opset %lld; "
                "or convert the model with onnx.version_converter.convert_version(model, %d))", what, op, f->name,
                f->opset, f->input + 1, (long long)opset, OPSET_IR);
        if (f->input >= 0 && n->nin > f->input)
            fe_bad(fe, "%s: input %d (%s) is opset %d's; at opset %lld %s takes at most %d inputs", what, f->input,
                f->name, f->opset, (long long)opset, op, f->input);
        if (f->input < 0 && !f->value && ir_attr(n, f->name))
            fe_bad(fe, "%s: %s is opset %d's; at opset %lld %s has none", what, f->name, f->opset, (long long)opset, op);
        const char *v = f->value ? ir_attr_s(n, f->name, NULL) : NULL;
        if (v && !strcmp(v, f->value))
            fe_bad(fe, "%s: %s '%s' is opset %d's (the model says opset %lld)", what, f->name, f->value, f->opset,
                (long long)opset);
    }
}

/* A node is read as the version its opset gives it.  An op newer than that
 * opset (ops.def's since column) is refused; so is, for the ops whose inputs
 * or attributes changed between opsets 13 and 28 in a way fsdpc reads (the
 * other version bumps of its ops add types only, which shape inference
 * checks), the form of another version: a part newer than the opset
 * (ops.def's SINCE_* rows), or the reductions' axes in the other place than
 * the opset has them: never misread.  A node of opsets 7 to 12 is then
 * rewritten into its opset 13 form (opset_old.c).  rename: the node's row of
 * renamed[] (an old op read as its successor; its since is renamed[].until's
 * rule instead), or -1. */
static void version_rules(Fe *fe, int id, const char *what, int rename)
{
    const Node *n = &fe->g->node[id];
    const int64_t opset = fe->opset;
    int has_axes = ir_attr(n, "axes") != NULL, nin = n->nin, since = op_info[n->op].since;
    const char *op = op_info[n->op].name;
    if (rename >= 0 && opset >= renamed[rename].until)
        fe_bad(fe, "%s: %s is deprecated from opset %d (the model says opset %lld): use %s", what, renamed[rename].name,
            renamed[rename].until, (long long)opset, op);
    if (opset < since && rename < 0) /* an op newer than the model (ops.def's since) */
        fe_bad(fe, "%s: %s is an opset %d op; the model says opset %lld (export at opset %d or later)", what, op, since,
            (long long)opset, since);
    if ((op_info[n->op].flags & F_REDUCE) && n->op != OP_ReduceSum) { /* axes: an attribute before opset 18,
                                                                         an input from 18 (ReduceSum's: 13) */
        if (opset >= 18 && has_axes)
            fe_bad(fe, "%s: at opset %lld, %s takes axes as its second input, not an attribute (export the model "
                "again, or convert it with onnx.version_converter)", what, (long long)opset, op);
        if (opset < 18 && nin > 1)
            fe_bad(fe, "%s: at opset %lld, %s takes axes as an attribute; an axes input is opset 18's (the model "
                "says opset %lld: fix its opset_import)", what, (long long)opset, op, (long long)opset);
    }
    newer_parts(fe, n, what, opset);
}

static void load_node(Fe *fe, const Flat *fl)
{
    const Onnx__NodeProto *n = fl->n;
    Op op = (Op)op_lookup(n);
    const OpInfo *oi = &op_info[op];
    const char *what = fl->what;
    fe->opset = fl->opset;
    if (op == OP_Constant) {
        constant_node(fe, n, what);
        return;
    }
    /* inputs [inmin, inmax) are optional (ops.def) */
    int lo = oi->inmin, hi = oi->inmax >= 0 ? oi->inmax : INT_MAX / 2;
    if ((int64_t)n->n_input < lo || (int64_t)n->n_input > hi)
        fe_bad(fe, "%s has %zu input%s; %s takes %s", what, n->n_input, n->n_input == 1 ? "" : "s", oi->name,
            lo == hi ? ir_fmt("%d", lo) : hi < INT_MAX / 2 ? ir_fmt("%d to %d", lo, hi)
                                                         : ir_fmt("at least %d", lo));
    int nout = oi->outmax >= 0 ? oi->outmax : (int)n->n_output;
    if ((int)n->n_output < oi->outmin || (int)n->n_output > nout || (oi->outmin > 0 && !*n->output[0]))
        fe_bad(fe, "%s has %zu output%s; %s has %d to %d", what, n->n_output, n->n_output == 1 ? "" : "s",
            oi->name, oi->outmin, nout);
    int *in = ir_alloc(sizeof(int) * (n->n_input + 1));
    for (size_t i = 0; i < n->n_input; i++)
        in[i] = use(fe, n->input[i], what, (int)i < lo);
    const char *nname = n->name && *n->name ? n->name : ir_fmt("%s_%d", oi->name, fe->g->nnode);
    int *out = ir_alloc(sizeof(int) * (size_t)(nout + 1));
    for (int k = 0; k < nout; k++) {
        int named = k < (int)n->n_output && *n->output[k];
        const char *on = named ? n->output[k] : fe_fresh(fe, ir_fmt("%s.out%d", nname, k));
        out[k] = ir_value(fe->g, on, DT_UNDEF, NULL, R_ACT);
        define(fe, fe->g->val[out[k]].name, out[k], what);
    }
    int id = ir_node(fe->g, op, nname, (int)n->n_input, in, nout, out);
    for (size_t i = 0; i < n->n_attribute; i++)
        add_attr(fe, id, n->attribute[i], what);
    int rename = renamed_op(n);
    version_rules(fe, id, what, rename);
    OldNode old = {fe->g, fe->path, what, fe->opset, fe, old_fresh};
    if (rename >= 0 && op == OP_Resize)
        onnx_upsample(&old, id);
    else if (fe->opset < OPSET_IR)
        onnx_old_node(&old, id);
}

/* Enter every name the file defines, so derived names avoid them all. */
static void reserve_names(Fe *fe, const Onnx__GraphProto *gp)
{
    for (size_t i = 0; i < gp->n_initializer; i++)
        if (gp->initializer[i]->name)
            fe_slot(fe, gp->initializer[i]->name);
    for (size_t i = 0; i < gp->n_input; i++)
        if (gp->input[i]->name)
            fe_slot(fe, gp->input[i]->name);
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t k = 0; k < gp->node[i]->n_output; k++)
            if (*gp->node[i]->output[k])
                fe_slot(fe, gp->node[i]->output[k]);
}

static void load_outputs(Fe *fe, const Onnx__GraphProto *gp)
{
    if (gp->n_output > INT_MAX / 2)
        fe_bad(fe, "the graph has too many outputs");
    fe->g->output = ir_alloc(sizeof(int) * (gp->n_output + 1));
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name;
        int id = name ? fe_find(fe, name) : UNSEEN;
        if (id < 0)
            fe_bad(fe, "graph output '%s' is not defined by any node, input or initializer", ir_q(name));
        fe->g->output[fe->g->noutput++] = id;
    }
}

static void model_dir(Fe *fe)
{
    const char *slash = strrchr(fe->path, '/');
    fe->dir = !slash ? "." : slash == fe->path ? "/" : ir_fmt("%.*s", (int)(slash - fe->path), fe->path);
    char *r = realpath(fe->dir, NULL);
    if (!r)
        fatal("%s: cannot resolve the model's directory: %s", fe->path, strerror(errno));
    fe->dir_real = ir_strdup(r);
    free(r);
}

Graph *onnx_load(const Options *opt)
{
    Fe c = {.path = opt->model, .g = ir_new(opt)}, *fe = &c;
    size_t len = opt->model_data ? opt->model_size : read_model(fe);
    fe->g->model_bytes = opt->model_data ? opt->model_data : fe->bytes;
    fe->g->model_len = len;
    fe->model = unpack(fe, fe->g->model_bytes, len);
    if (!fe->model->graph)
        fe_bad(fe, "the model has no graph");
    check_opset(fe, fe->model);
    model_dir(fe);
    const Onnx__GraphProto *gp = fe->model->graph;
    if (gp->n_node > INT_MAX / 4)
        fe_bad(fe, "the graph has too many nodes");
    check_dim_options(opt, gp);
    reserve_names(fe, gp);
    fe_load_functions(fe, fe->model);
    for (size_t i = 0; i < gp->n_node; i++)
        fe_flatten(fe, gp->node[i], fe_node_label(i, gp->node[i]), fe->opset, 0, i);
    check_ops(fe);
    load_initializers(fe, gp);
    fe_load_signature(fe, gp);
    fe_load_program_signature(fe, gp);
    fe_load_padding(fe);
    fe_check_state_records(fe);
    load_inputs(fe, opt, gp);
    for (size_t i = 0; i < fe->nflat; i++)
        load_node(fe, &fe->flat[i]);
    load_outputs(fe, gp);
    return fe->g;
}
