/* onnx.c — the frontend: an ONNX model file → a Graph.
 *
 * The file is untrusted, so everything here is a check followed by a copy:
 *
 *   read the bytes (kept in g->model_bytes: export rewrites the original)
 *   → check protobuf nesting depth (protobuf-c recurses without a limit)
 *   → unpack with protobuf-c code generated from the system's onnx.proto
 *   → opset of the default domain must be 7..28 (an op newer than it: refused)
 *   → model-local functions inlined: a flat list of nodes (each with its opset)
 *   → every op one the frontend accepts (ir/ops.def; docs/ops.md lists them)
 *   → initializers      → R_CONST values with host data (raw, typed or external;
 *                          external float ones only located: ir_data reads them)
 *   → graph signature   → Value.sig of the initializers PyTorch's exporter marks;
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
 * Everything one load knows is in its Fe (the model's path and bytes, the
 * name table, the opset, the inlined node list), made by onnx_load and passed
 * to every function here: nothing survives a load but the Graph and what the
 * arena holds, so loads share nothing (--report loads the model once per
 * strategy, the fuzzer many models in one process) and need no resets.
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
#include "ir.h"
#include "onnx.pb-c.h"
#include "opset_old.h"
#include "rules/tensor.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    OPSET_MIN = 7, OPSET_MAX = 28,   /* 28: the newest onnx 1.23 defines */
    OPSET_IR = 13,                   /* the versions the IR's nodes follow (older ones: opset_old.c) */
    MAX_DEPTH = 100,                 /* protobuf message nesting we accept */
    MAX_KINDS = 4,                   /* unsupported op types named in the message */
};
#define AT(t) ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__##t
#define MAX_MODEL_BYTES ((size_t)2 << 30)

enum { UNSEEN = -3, RESERVED = -2 };  /* name table ids besides value ids */

typedef struct { const char *key; int id; } Name;

/* One compile's reading of its model: every function of the frontend takes it, so that nothing outlives
 * onnx_load but the Graph (and what the arena holds), and two loads share nothing (fsdpc --report loads the
 * model once per strategy; tests/fuzz_compile.c many models in one process). */
typedef struct {
    Graph *g;
    const char *path;                 /* opt->model, prefix of every message */
    const char *dir, *dir_real;       /* the model's directory, as given and resolved */
    uint8_t *bytes;                   /* the file (in the arena), kept for export */
    Onnx__ModelProto *model;          /* in the arena */
    Name *names;                      /* the name table: ncap slots (a power of two), nused used */
    size_t ncap, nused;
    int64_t opset;                    /* of the default domain: the model's, then each node's as it is loaded */
    struct Func *funcs;               /* the model-local functions */
    size_t nfuncs;
    struct Flat *flat;                /* the graph's nodes, functions inlined: nflat of flatcap */
    size_t nflat, flatcap;
} Fe;

/* ---- messages ------------------------------------------------------------ */

__attribute__((format(printf, 2, 3)))
static _Noreturn void bad(Fe *fe, const char *fmt, ...)
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

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211u;
    return h;
}

static Name *probe(Name *tab, size_t cap, const char *key)
{
    size_t i = hash(key) & (cap - 1);
    while (tab[i].key && strcmp(tab[i].key, key))
        i = (i + 1) & (cap - 1);
    return &tab[i];
}

static int find(Fe *fe, const char *key)
{
    if (!fe->ncap)
        return UNSEEN;
    Name *e = probe(fe->names, fe->ncap, key);
    return e->key ? e->id : UNSEEN;
}

/* The entry for key, entered as RESERVED if new. */
static Name *slot(Fe *fe, const char *key)
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
static const char *fresh(Fe *fe, const char *base)
{
    const char *s = base;
    for (int k = 1; find(fe, s) != UNSEEN; k++)
        s = ir_fmt("%s_%d", base, k);
    return s;
}

static int use(Fe *fe, const char *name, const char *what, int required)
{
    if (!*name) {
        if (required)
            bad(fe, "%s leaves a required input empty", what);
        return -1;
    }
    int id = find(fe, name);
    if (id == RESERVED)
        bad(fe, "%s uses '%s' before the node that defines it (ONNX nodes must be topologically "
            "sorted)", what, ir_q(name));
    if (id < 0)
        bad(fe, "%s uses '%s', which no earlier node, input or initializer defines", what, ir_q(name));
    return id;
}

static void define(Fe *fe, const char *name, int v, const char *what)
{
    Name *e = slot(fe, name);
    if (e->id >= 0)
        bad(fe, "%s defines '%s', which is already defined (an ONNX value has one producer)", what,
            ir_q(name));
    e->id = v;
}

/* ---- reading and unpacking ------------------------------------------------ */

/* Opens file for reading (ir_open_regular: a FIFO, device or directory is refused, never waited on); its size
 * into *size.  what names the file in messages. */
static int open_regular(Fe *fe, const char *file, const char *what, int64_t *size)
{
    const char *why;
    int fd = ir_open_regular(file, 0, size, &why);
    if (fd < 0)
        bad(fe, "cannot open %s: %s", what, why);
    return fd;
}

/* the model file into the arena (fsdpc --report loads it once per strategy and releases all but the first) */
static size_t read_model(Fe *fe)
{
    int64_t size;
    int fd = open_regular(fe, fe->path, "the model", &size);
    if (size > (int64_t)MAX_MODEL_BYTES)
        bad(fe, "the model file is larger than 2 GiB, the protobuf limit: save the weights as "
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

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
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
static int next_field(const uint8_t **p, const uint8_t *end, uint64_t *tag, const uint8_t **data, uint64_t *len)
{
    uint64_t v;
    *data = NULL;
    *len = 0;
    if (varint(p, end, tag))
        return -1;
    switch (*tag & 7) {
    case 0: return varint(p, end, &v);
    case 1: if (end - *p < 8) return -1; *p += 8; return 0;
    case 5: if (end - *p < 4) return -1; *p += 4; return 0;
    case 2:
        if (varint(p, end, len) || *len > (uint64_t)(end - *p))
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
static int check_depth(const ProtobufCMessageDescriptor *d, const uint8_t *p, const uint8_t *end,
                       int depth)
{
    if (depth > MAX_DEPTH)
        return 1;
    while (p < end) {
        uint64_t tag, len;
        const uint8_t *data;
        if (next_field(&p, end, &tag, &data, &len))
            return -1;
        if (!data)
            continue;
        const ProtobufCFieldDescriptor *f =
            tag >> 3 <= UINT_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >> 3)) : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int r = check_depth(f->descriptor, data, data + len, depth + 1);
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

static Onnx__ModelProto *unpack(Fe *fe, const uint8_t *buf, size_t len)
{
    if (!len)
        bad(fe, "the file is empty (not an ONNX model)");
    int r = check_depth(&onnx__model_proto__descriptor, buf, buf + len, 0);
    if (r > 0)
        bad(fe, "messages nest more than %d deep (subgraphs inside subgraphs); fsdpc does not "
            "accept such a model", MAX_DEPTH);
    /* in the arena, as everything else: ir_reset releases it too */
    ProtobufCAllocator arena = {.alloc = pb_alloc, .free = pb_free};
    Onnx__ModelProto *m = r ? NULL : onnx__model_proto__unpack(&arena, len, buf);
    if (!m)
        bad(fe, "not an ONNX model (protobuf parse failed; is the file truncated?)");
    return m;
}

static int default_domain(const char *d)
{
    return !d || !*d || !strcmp(d, "ai.onnx");
}

static void check_opset(Fe *fe, const Onnx__ModelProto *m)
{
    int64_t v = -1;
    for (size_t i = 0; i < m->n_opset_import; i++)
        if (default_domain(m->opset_import[i]->domain))
            v = m->opset_import[i]->version;
    if (v < 0)
        bad(fe, "the model imports no opset of the default ONNX domain; fsdpc supports opsets %d to %d",
            OPSET_MIN, OPSET_MAX);
    if (v < OPSET_MIN)
        bad(fe, "the model uses ONNX opset %lld; fsdpc supports opsets %d to %d (convert it with "
            "onnx.version_converter.convert_version(model, %d), or export it again at a newer opset)",
            (long long)v, OPSET_MIN, OPSET_MAX, OPSET_MIN);
    if (v > OPSET_MAX)
        bad(fe, "the model uses ONNX opset %lld; fsdpc supports opsets %d to %d, and does not know what opset %lld "
            "changed (export it at opset %d or below, e.g. torch.onnx.export(..., opset_version=%d))",
            (long long)v, OPSET_MIN, OPSET_MAX, (long long)v, OPSET_MAX, OPSET_MAX);
    fe->opset = v;
}

/* ---- tensors --------------------------------------------------------------- */

static DType dtype_of(int32_t t) { return tensor_from_onnx(t); }

/* "has dtype FLOAT8E4M3FN, which fsdpc does not support (use float32 ...)" */
static _Noreturn void bad_dtype(Fe *fe, const char *what, int32_t t)
{
    const char *hint = t == 0 ? "the model must declare a dtype"
                     : (t >= 17 && t <= 20) || t == 23 ? "use float32, float16 or bfloat16"
                     : t == 21 || t == 22 ? "use int8, uint8 or a wider integer"
                     : "supported: float32, float64, float16, bfloat16, bool and the integers of 8 to 64 bits";
    bad(fe, "%s has dtype %s, which fsdpc does not support (%s)", what, tensor_onnx_name(t), hint);
}

static int64_t make_shape(Fe *fe, Shape *s, size_t n, const int64_t *dims, const char *what)
{
    if (n > MAX_RANK)
        bad(fe, "%s has rank %zu; fsdpc supports rank <= %d", what, n, MAX_RANK);
    s->rank = (int)n;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] < 0)
            bad(fe, "%s has negative dim %zu (%lld)", what, i, (long long)dims[i]);
        s->dim[i] = dims[i];
    }
    int64_t numel = shape_count(s);
    if (numel < 0)
        bad(fe, "%s has shape %s, beyond 2^40 elements; fsdpc cannot hold it", what, shape_str(s));
    return numel;
}

static int64_t parse_count(Fe *fe, const char *s, const char *key, const char *what)
{
    int64_t v = 0;
    if (!s || !*s)
        bad(fe, "%s external data has an empty '%s'", what, key);
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10)
            bad(fe, "%s external data '%s' is not a byte count", what, key);
        v = v * 10 + (*s - '0');
    }
    return v;
}

static int escapes(const char *loc)
{
    if (loc[0] == '/')
        return 1;
    for (const char *c = loc;; c++) {      /* c: start of a path component */
        if (c[0] == '.' && c[1] == '.' && (c[2] == '/' || !c[2]))
            return 1;
        if (!(c = strchr(c, '/')))
            return 0;
    }
}

/* realpath real must be dir_real or below it */
static int inside(Fe *fe, const char *real)
{
    size_t n = strlen(fe->dir_real);
    if (!strcmp(fe->dir_real, "/"))
        return 1;
    return !strncmp(real, fe->dir_real, n) && (real[n] == '/' || !real[n]);
}

/* Where t's external data is (*e): the location checked (inside the model's directory; a regular file holding
 * the bytes), nothing read.  A file that does not exist is accepted when nothing is to be written (no -o:
 * --report, --dump-after): e->missing then holds the error a read of it gives. */
static void locate_external(Fe *fe, const Onnx__TensorProto *t, const char *what, size_t bytes, ExtData *e)
{
    const char *loc = NULL, *off_s = NULL, *len_s = NULL;
    for (size_t i = 0; i < t->n_external_data; i++) {
        const Onnx__StringStringEntryProto *x = t->external_data[i];
        if (!x->key)
            continue;
        if (!strcmp(x->key, "location")) loc = x->value;
        else if (!strcmp(x->key, "offset")) off_s = x->value;
        else if (!strcmp(x->key, "length")) len_s = x->value;
    }
    if (!loc || !*loc)
        bad(fe, "%s is stored as external data but names no 'location'", what);
    *e = (ExtData){.what = what, .loc = loc, .len = (int64_t)bytes};
    e->off = off_s ? parse_count(fe, off_s, "offset", what) : 0;
    if (len_s && parse_count(fe, len_s, "length", what) != (int64_t)bytes)
        bad(fe, "%s external data has length %s, but its dtype and shape need %zu bytes", what,
            ir_q(len_s), bytes);
    if (escapes(loc))
        bad(fe, "%s external data path '%s' escapes the model directory (keep the data files "
            "beside the model, with relative paths)", what, ir_q(loc));
    char *r = realpath(ir_fmt("%s/%s", fe->dir, loc), NULL);
    if (!r) {
        const char *msg = ir_fmt("%s external data file '%s' (in %s): %s", what, ir_q(loc), ir_q(fe->dir),
                                 strerror(errno));
        if (errno != ENOENT || fe->g->opt->out)
            bad(fe, "%s", msg);
        e->missing = msg;
        return;
    }
    e->file = ir_strdup(r);
    free(r);
    if (!inside(fe, e->file))
        bad(fe, "%s external data path '%s' escapes the model directory (it resolves to %s)", what,
            ir_q(loc), ir_q(e->file));
    int64_t size;
    close(open_regular(fe, e->file, ir_fmt("%s external data file '%s'", what, ir_q(loc)), &size));
    if (e->off > size || (int64_t)bytes > size - e->off)
        bad(fe, "%s needs %zu bytes at offset %lld of '%s', which has %lld bytes (is it truncated?)",
            what, bytes, (long long)e->off, ir_q(loc), (long long)size);
}

/* n int32_data / uint64_data values stored as elements of es bytes: their
 * low bytes (int8 .. uint16, float16 and bfloat16 bits, uint32, uint64) */
static void store_low(uint8_t *p, size_t es, const void *src, int wide, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint64_t v = wide ? ((const uint64_t *)src)[i] : (uint64_t)(uint32_t)((const int32_t *)src)[i];
        switch (es) {
        case 1: p[i] = (uint8_t)v; break;
        case 2: ((uint16_t *)p)[i] = (uint16_t)v; break;
        case 4: ((uint32_t *)p)[i] = (uint32_t)v; break;
        default: ((uint64_t *)p)[i] = v; break;
        }
    }
}

/* a tensor's values from its typed field (ONNX keeps every integer of 32 bits or less, bool and the 16-bit floats'
 * bits in int32_data, uint32 and uint64 in uint64_data) */
static void *typed_data(Fe *fe, const Onnx__TensorProto *t, const char *what, DType dt, int64_t numel)
{
    size_t have = 0, es = dtype_size(dt);
    const void *src = NULL;
    const char *field = "";
    switch (dt) {
    case DT_F32: have = t->n_float_data; src = t->float_data; field = "float_data"; break;
    case DT_F64: have = t->n_double_data; src = t->double_data; field = "double_data"; break;
    case DT_I64: have = t->n_int64_data; src = t->int64_data; field = "int64_data"; break;
    case DT_U32: case DT_U64: have = t->n_uint64_data; src = t->uint64_data; field = "uint64_data"; break;
    default: have = t->n_int32_data; src = t->int32_data; field = "int32_data"; break;
    }
    if ((int64_t)have != numel)
        bad(fe, "%s has %zu values in %s, but its shape needs %lld", what, have, field,
            (long long)numel);
    uint8_t *p = ir_alloc((size_t)numel * es);
    if (dt == DT_BOOL)
        for (int64_t i = 0; i < numel; i++)
            p[i] = t->int32_data[i] != 0;
    else if (src == t->int32_data || src == t->uint64_data)
        store_low(p, es, src, src == t->uint64_data, numel);
    else if (numel)
        memcpy(p, src, (size_t)numel * es);
    return p;
}

/* A tensor → a new R_CONST value named name (init: initializer index or -1). */
static int const_tensor(Fe *fe, const char *name, const Onnx__TensorProto *t, const char *what, int init)
{
    DType dt = dtype_of(t->data_type);
    if (dt == DT_UNDEF)
        bad_dtype(fe, what, t->data_type);
    Shape s;
    int64_t numel = make_shape(fe, &s, t->n_dims, t->dims, what);
    size_t bytes = (size_t)numel * dtype_size(dt);
    void *data;
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        /* a float initializer's bytes stay in the file until needed (ir_data, OUT.init); the rest may be shapes,
         * indices or masks the passes read */
        ExtData here, *e = init >= 0 ? &fe->g->ext[init] : &here;
        locate_external(fe, t, what, bytes, e);
        data = init >= 0 && (dt == DT_F32 || dt == DT_F64) ? NULL : ir_ext_load(fe->g, e);
    } else if (t->has_raw_data) {
        if (t->raw_data.len != bytes)
            bad(fe, "%s has %zu bytes of raw_data, but its dtype and shape %s need %zu", what,
                t->raw_data.len, shape_str(&s), bytes);
        data = ir_alloc(bytes);
        if (bytes)
            memcpy(data, t->raw_data.data, bytes);
    } else {
        data = typed_data(fe, t, what, dt, numel);
    }
    if (dt == DT_BOOL)
        for (size_t i = 0; i < bytes; i++)
            ((uint8_t *)data)[i] = ((uint8_t *)data)[i] != 0;
    int v = ir_value(fe->g, name, dt, &s, R_CONST);
    fe->g->val[v].data = data;
    fe->g->val[v].init_index = init;
    fe->g->val[v].persistent = 1;
    return v;
}

/* A list of n scalars → an R_CONST of shape [n] (or [] when scalar). */
static int const_list(Fe *fe, const char *name, DType dt, const void *src, size_t n, int scalar)
{
    Shape s = {.rank = !scalar, .dim = {(int64_t)n}};
    int v = ir_value(fe->g, name, dt, &s, R_CONST);
    void *p = ir_alloc(n * dtype_size(dt) + 1);
    for (size_t i = 0; i < n; i++) {
        if (dt == DT_F32) ((float *)p)[i] = ((const float *)src)[i];
        else ((int64_t *)p)[i] = ((const int64_t *)src)[i];
    }
    fe->g->val[v].data = p;
    fe->g->val[v].persistent = 1;
    return v;
}

/* ---- initializers and graph inputs ----------------------------------------- */

static void load_initializers(Fe *fe, const Onnx__GraphProto *gp)
{
    if (gp->n_sparse_initializer)
        bad(fe, "the graph has sparse initializers, which fsdpc does not support (store them dense)");
    if (gp->n_initializer > INT_MAX / 2)
        bad(fe, "the graph has too many initializers");
    fe->g->ninit = (int)gp->n_initializer;
    fe->g->ext = ir_alloc(sizeof *fe->g->ext * (gp->n_initializer + 1));
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        if (!t->name || !*t->name)
            bad(fe, "initializer #%zu has no name", i);
        const char *what = ir_fmt("initializer '%s'", ir_q(t->name));
        if (find(fe, t->name) >= 0)
            bad(fe, "%s is defined twice (initializer names must be unique)", what);
        define(fe, t->name, const_tensor(fe, t->name, t, what, (int)i), what);
    }
}

/* ---- PyTorch's graph signature ---------------------------------------------
 *
 * torch.onnx.export(..., dynamo=True) says what each lifted input of the
 * module is: a metadata_props entry SIG_KEY = PARAMETER, BUFFER,
 * CONSTANT_TENSOR, USER_INPUT... on the ValueInfoProto naming it (it writes
 * them on graph inputs and value_info; newer ONNX allows them on the
 * TensorProto too).  metadata_props is newer than the onnx.proto our code is
 * generated from (ValueInfoProto field 4, TensorProto field 16), so
 * protobuf-c leaves it among the message's unknown fields: its wire bytes,
 * read here, every length checked. */
#define SIG_KEY "pkg.torch.export.graph_signature.InputSpec.kind"
#define PROGRAM_SIG_KEY "pkg.torch.export.ExportedProgram.graph_signature"
#define FX_KEY "pkg.torch.onnx.fx_node"
#define PADDING_KEY "fsdpc.padding_idx."
#define NON_PERSISTENT_KEY "fsdpc.non_persistent." /* runtime/export.c reads it */
#define TIED_KEY "fsdpc.tied."                       /* + ALIAS = INIT: so does it */
enum { VI_METADATA = 4, NODE_METADATA = 9, TENSOR_METADATA = 16, GRAPH_METADATA = 16 };

typedef struct { const uint8_t *p; uint64_t n; } Bytes;

static int bytes_is(Bytes b, const char *s)
{
    return b.n == strlen(s) && !memcmp(b.p, s, b.n);
}

/* A StringStringEntryProto's key (field 1) and value (field 2); -1: malformed. */
static int string_entry(const uint8_t *p, const uint8_t *end, Bytes *key, Bytes *val)
{
    *key = *val = (Bytes){0};
    while (p < end) {
        uint64_t tag, len;
        const uint8_t *data;
        if (next_field(&p, end, &tag, &data, &len))
            return -1;
        if (data && tag >> 3 == 1)
            *key = (Bytes){data, len};
        else if (data && tag >> 3 == 2)
            *val = (Bytes){data, len};
    }
    return 0;
}

/* The value of message m's metadata_props entry (its unknown field `field`) whose key is key; the last one
 * when several are, {NULL, 0} when none is.  A malformed entry is refused, naming what. */
static Bytes metadata(Fe *fe, const ProtobufCMessage *m, uint32_t field, const char *key_want, const char *what)
{
    Bytes found = {0};
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        if (u->tag != field)
            continue;
        /* protobuf-c keeps a length-delimited field's bytes with their length prefix */
        const uint8_t *p = u->data, *end = u->data + u->len;
        uint64_t len;
        Bytes key, val;
        if (u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED || varint(&p, end, &len) ||
            len != (uint64_t)(end - p) || string_entry(p, end, &key, &val))
            bad(fe, "%s has a malformed metadata_props entry (field %u is no well-formed key/value entry: a bad "
                "length, tag or wire type); export the model again", what, (unsigned)field);
        if (bytes_is(key, key_want))
            found = val.p ? val : (Bytes){(const uint8_t *)"", 0};
    }
    return found;
}

/* What message m's metadata_props (its unknown field `field`) say of the value: SIG_NONE when no entry
 * has SIG_KEY. */
static SigKind sig_kind(Fe *fe, const ProtobufCMessage *m, uint32_t field, const char *what)
{
    Bytes val = metadata(fe, m, field, SIG_KEY, what);
    return !val.p ? SIG_NONE : bytes_is(val, "PARAMETER") ? SIG_PARAMETER : SIG_OTHER;
}

/* Records kind k for the initializer called name, if one is (a user input's kind is not kept). */
static void note_sig(Fe *fe, const char *name, SigKind k, const char *what)
{
    if (k == SIG_NONE)
        return;
    fe->g->signature = 1;
    int v = name ? find(fe, name) : UNSEEN;
    if (v < 0 || fe->g->val[v].init_index < 0)
        return;
    if (fe->g->val[v].sig != SIG_NONE && fe->g->val[v].sig != k)
        bad(fe, "%s: the graph signature (%s) calls it a PARAMETER in one place and another kind in another; "
            "export the model again", what, SIG_KEY);
    fe->g->val[v].sig = k;
}

/* The graph signature's kind of every initializer it names (after load_initializers). */
static void load_signature(Fe *fe, const Onnx__GraphProto *gp)
{
    for (size_t i = 0; i < gp->n_initializer; i++) {
        const Onnx__TensorProto *t = gp->initializer[i];
        const char *what = ir_fmt("initializer '%s'", ir_q(t->name));
        note_sig(fe, t->name, sig_kind(fe, &t->base, TENSOR_METADATA, what), what);
    }
    size_t n[2] = {gp->n_input, gp->n_value_info};
    Onnx__ValueInfoProto **vi[2] = {gp->input, gp->value_info};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n[k]; i++) {
            const char *name = vi[k][i]->name;
            const char *what = ir_fmt("%s '%s'", k ? "value_info" : "graph input", name ? ir_q(name) : "");
            note_sig(fe, name, sig_kind(fe, &vi[k][i]->base, VI_METADATA, what), what);
        }
}

/* The exported program's whole signature, a text on the graph (GraphProto metadata_props PROGRAM_SIG_KEY),
 * lists every parameter of the module, one line each: "p_c_bias: PARAMETER target='c.bias'".  One the graph
 * has no initializer of was removed by the exporter's optimizer (a zero bias: onnxscript's
 * RemoveOptionalBiasFromConv) or folded into another constant -- or is tied to one the graph has under its
 * other name (GPT-2's wte is lm_head.weight), or the forward pass never reads it (every export drops it, and
 * PyTorch's training leaves it as it is).  The nodes' fx_node metadata (NODE_METADATA FX_KEY, the same text on
 * every ONNX node one torch operation became: "%conv2d : ... = call_function[...](args = (%x, %p_c_weight,
 * %p_c_bias), ...)") tells which: where the nodes of one operation name k parameters of the signature, a lost
 * one among them, but read fewer than k distinct parameter initializers, the lost ones it names are in
 * G->sig_lost, which autodiff refuses.  A tied weight is read under its other name (k read), an unused one is
 * named by no operation.  Without fx_node metadata (stripped) nothing is concluded.  Signature lines quoted
 * otherwise (names with a quote) are skipped. */
typedef struct {
    const char *ph, *target;  /* the placeholder ("p_c_bias") and the parameter ("c.bias") */
    int lost;                 /* the graph has no initializer named target */
    int listed;               /* in G->sig_lost */
    int stamp;                /* each_named's mark: named already by this text */
} SigParam;

static int ph_cmp(const void *a, const void *b)
{
    return strcmp(((const SigParam *)a)->ph, ((const SigParam *)b)->ph);
}

/* The signature's PARAMETER lines, sorted by placeholder; lost: the graph has no initializer of the target. */
static SigParam *sig_parameters(Fe *fe, Bytes t, int *np)
{
    static const char tag[] = ": PARAMETER target='";
    if (t.n > INT_MAX)  /* no lines to read as "%.*s" (a 2 GB signature is no torch export's) */
        t = (Bytes){0};
    if (!t.p || !t.n) { /* none (t.p may be NULL: no pointer arithmetic on it) */
        *np = 0;
        return ir_alloc(sizeof(SigParam));
    }
    size_t lines = 1;
    for (uint64_t i = 0; i < t.n; i++)
        lines += t.p[i] == '\n';
    SigParam *l = ir_alloc(lines * sizeof *l);
    int n = 0;
    for (const uint8_t *p = t.p, *end = t.p + t.n; p && p < end;) {
        const uint8_t *eol = memchr(p, '\n', (size_t)(end - p));
        eol = eol ? eol : end;
        const uint8_t *at = NULL;
        for (const uint8_t *q = p; !at && q + sizeof tag - 1 < eol; q++)
            if (!memcmp(q, tag, sizeof tag - 1))
                at = q + sizeof tag - 1;
        if (at && eol[-1] == '\'' && eol - 1 > at && !memchr(at, '\\', (size_t)(eol - 1 - at))) {
            const char *name = ir_fmt("%.*s", (int)(eol - 1 - at), (const char *)at);
            int v = find(fe, name);
            l[n++] = (SigParam){ir_fmt("%.*s", (int)(at - (sizeof tag - 1) - p), (const char *)p), name,
                                v < 0 || fe->g->val[v].init_index < 0, 0, -1};
        }
        p = eol + 1;
    }
    qsort(l, (size_t)n, sizeof *l, ph_cmp);
    *np = n;
    return l;
}

/* Calls fn(the signature parameter) for each distinct one text names ("%p_c_bias"); stamp: this text's mark. */
static void each_named(const char *text, SigParam *l, int n, int stamp, void (*fn)(SigParam *, void *), void *ctx)
{
    for (const char *p = strchr(text, '%'); p; p = strchr(p, '%')) {
        const char *q = ++p;
        while (*q == '_' || (*q >= '0' && *q <= '9') || ((*q | 32) >= 'a' && (*q | 32) <= 'z'))
            q++;
        SigParam key = {ir_fmt("%.*s", (int)(q - p), p), NULL, 0, 0, 0};
        SigParam *hit = bsearch(&key, l, (size_t)n, sizeof *l, ph_cmp);
        if (hit && hit->stamp != stamp) {
            hit->stamp = stamp;
            fn(hit, ctx);
        }
        p = q;
    }
}

typedef struct { int named, lost; } Named;

static void count_named(SigParam *s, void *ctx)
{
    ((Named *)ctx)->named++;
    ((Named *)ctx)->lost += s->lost;
}

static void keep_lost(SigParam *s, void *ctx)
{
    Fe *fe = ctx;
    if (s->lost && !s->listed) {
        s->listed = 1;
        fe->g->sig_lost[fe->g->nsig_lost++] = s->target;
    }
}

typedef struct { const char *fx; int node; } FxNode;

static int fx_cmp(const void *a, const void *b)
{
    return strcmp(((const FxNode *)a)->fx, ((const FxNode *)b)->fx);
}

/* The distinct parameter initializers (graph signature PARAMETERs) nodes f[0..k) read; seen: per value. */
static int params_read(Fe *fe, const Onnx__GraphProto *gp, const FxNode *f, int k, int *seen, int stamp)
{
    int r = 0;
    for (int i = 0; i < k; i++) {
        const Onnx__NodeProto *np = gp->node[f[i].node];
        for (size_t j = 0; j < np->n_input; j++) {
            int v = np->input[j] && *np->input[j] ? find(fe, np->input[j]) : -1;
            if (v >= 0 && fe->g->val[v].init_index >= 0 && fe->g->val[v].sig == SIG_PARAMETER && seen[v] != stamp) {
                seen[v] = stamp;
                r++;
            }
        }
    }
    return r;
}

/* G->sig_lost: the signature's parameters an operation reads but the graph lacks (see above). */
static void load_program_signature(Fe *fe, const Onnx__GraphProto *gp)
{
    int n, nlost = 0, nfx = 0;
    SigParam *l = sig_parameters(fe, metadata(fe, &gp->base, GRAPH_METADATA, PROGRAM_SIG_KEY, "the graph"), &n);
    for (int i = 0; i < n; i++)
        nlost += l[i].lost;
    if (!nlost)
        return;
    FxNode *f = ir_alloc(gp->n_node * sizeof *f + 1);
    for (size_t i = 0; i < gp->n_node; i++) {
        Bytes t = metadata(fe, &gp->node[i]->base, NODE_METADATA, FX_KEY,
                           ir_fmt("node '%s'", gp->node[i]->name ? ir_q(gp->node[i]->name) : ""));
        if (t.p && t.n <= INT_MAX)
            f[nfx++] = (FxNode){ir_fmt("%.*s", (int)t.n, (const char *)t.p), (int)i};
    }
    qsort(f, (size_t)nfx, sizeof *f, fx_cmp);
    int *seen = ir_alloc((size_t)fe->g->nval * sizeof *seen + 1);
    fe->g->sig_lost = ir_alloc((size_t)nlost * sizeof *fe->g->sig_lost);
    for (int a = 0, b, stamp = 1; a < nfx; a = b, stamp += 2) {
        for (b = a + 1; b < nfx && !strcmp(f[a].fx, f[b].fx); b++) {}
        Named c = {0, 0};
        each_named(f[a].fx, l, n, stamp, count_named, &c);
        if (c.lost && params_read(fe, gp, f + a, b - a, seen, stamp) < c.named)
            each_named(f[a].fx, l, n, stamp + 1, keep_lost, fe);
    }
}

/* scripts/export_torch.py's record of an nn.Embedding's padding_idx: model metadata_props PADDING_KEY + the
 * weight's initializer name = the row, which PyTorch's lookup gives no gradient (Value.pad_row; autodiff's
 * Gather rule keeps that row of the lookup's gradient zero). */
static void load_padding(Fe *fe)
{
    for (size_t i = 0; i < fe->model->n_metadata_props; i++) {
        const Onnx__StringStringEntryProto *e = fe->model->metadata_props[i];
        if (!e->key || strncmp(e->key, PADDING_KEY, strlen(PADDING_KEY)))
            continue;
        const char *name = e->key + strlen(PADDING_KEY), *what = ir_fmt("metadata_props '%s'", ir_q(e->key));
        int v = find(fe, name);
        const Value *x = v >= 0 ? &fe->g->val[v] : NULL;
        if (!x || x->init_index < 0 || (x->dtype != DT_F32 && x->dtype != DT_F64) || x->shape.rank != 2)
            bad(fe, "%s: '%s' is no float initializer of rank 2 (an embedding's weight); export the model again "
                "with scripts/export_torch.py", what, ir_q(name));
        char *endp = NULL;
        errno = 0;
        long long row = e->value ? strtoll(e->value, &endp, 10) : -1;
        if (!e->value || !*e->value || *endp || errno || row < 0 || row >= x->shape.dim[0])
            bad(fe, "%s: padding_idx '%s' is no row of '%s' (0..%lld); export the model again with "
                "scripts/export_torch.py", what, e->value ? ir_q(e->value) : "", ir_q(name),
                (long long)x->shape.dim[0] - 1);
        fe->g->val[v].pad_row = row;
    }
}

/* scripts/export_torch.py's records for runtime/export.c's --export-safetensors: model metadata_props
 * NON_PERSISTENT_KEY + an initializer's name (a non-persistent buffer, which no state_dict holds: left out) and
 * TIED_KEY + ALIAS = an initializer's name (a tied parameter's other name: written with its data).  The names
 * must be initializers' (an alias must not be one: the file would hold the name twice). */
static void check_state_records(Fe *fe)
{
    size_t kn = strlen(NON_PERSISTENT_KEY), kt = strlen(TIED_KEY);
    for (size_t i = 0; i < fe->model->n_metadata_props; i++) {
        const char *key = fe->model->metadata_props[i]->key, *val = fe->model->metadata_props[i]->value;
        int v;
        if (key && !strncmp(key, NON_PERSISTENT_KEY, kn) &&
            ((v = find(fe, key + kn)) < 0 || fe->g->val[v].init_index < 0))
            bad(fe, "metadata_props '%s': '%s' is no initializer (a non-persistent buffer's); export the model again "
                "with scripts/export_torch.py", ir_q(key), ir_q(key + kn));
        if (key && !strncmp(key, TIED_KEY, kt) &&
            (!val || (v = find(fe, val)) < 0 || fe->g->val[v].init_index < 0 ||
             ((v = find(fe, key + kt)) >= 0 && fe->g->val[v].init_index >= 0)))
            bad(fe, "metadata_props '%s' = '%s': a tied parameter's other name and the initializer holding it (the "
                "name no initializer's); export the model again with scripts/export_torch.py", ir_q(key),
                val ? ir_q(val) : "");
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
        bad(fe, "%s is not a tensor (fsdpc needs a tensor type with dtype and shape)", what);
    DType dt = dtype_of(tp->tensor_type->elem_type);
    if (dt == DT_UNDEF)
        bad_dtype(fe, what, tp->tensor_type->elem_type);
    const Onnx__TensorShapeProto *sp = tp->tensor_type->shape;
    if (!sp)
        bad(fe, "%s has no shape; the model must declare it (fsdpc compiles static shapes)", what);
    if (sp->n_dim > MAX_RANK)
        bad(fe, "%s has rank %zu; fsdpc supports rank <= %d", what, sp->n_dim, MAX_RANK);
    Shape s = {.rank = (int)sp->n_dim};
    for (size_t i = 0; i < sp->n_dim; i++) {
        const Onnx__TensorShapeProto__Dimension *d = sp->dim[i];
        if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE) {
            if (d->dim_value < 0)   /* 0 is a legal (empty) ONNX size */
                bad(fe, "%s dim %zu is %lld; sizes cannot be negative", what, i, (long long)d->dim_value);
            s.dim[i] = d->dim_value;
            continue;
        }
        if (d->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM || !d->dim_param ||
            !*d->dim_param)
            bad(fe, "%s dim %zu has neither a size nor a name; the model must declare it (re-export "
                "with a fixed or named dim, then bind names with --dim NAME=N)", what, i);
        int k = 0;
        while (k < opt->ndims && strcmp(opt->dim_name[k], d->dim_param))
            k++;
        if (k == opt->ndims && opt->dim_default > 0) {
            s.dim[i] = opt->dim_default;
            continue;
        }
        if (k == opt->ndims)
            bad(fe, "%s dim %zu is symbolic ('%s'): bind it with --dim %s=N", what, i,
                ir_q(d->dim_param), ir_q(d->dim_param));
        if (opt->dim_value[k] <= 0)
            fatal("--dim %s=%lld: a dimension must be positive", ir_q(d->dim_param),
                  (long long)opt->dim_value[k]);
        s.dim[i] = opt->dim_value[k];
    }
    if (shape_count(&s) < 0)
        bad(fe, "%s has shape %s, beyond 2^40 elements; fsdpc cannot hold it", what, shape_str(&s));
    int v = ir_value(fe->g, in->name, dt, &s, R_INPUT);
    slot(fe, fe->g->val[v].name)->id = v;
    fe->g->input[fe->g->ninput++] = v;
}

static void load_inputs(Fe *fe, const Options *opt, const Onnx__GraphProto *gp)
{
    if (gp->n_input > INT_MAX / 2)
        bad(fe, "the graph has too many inputs");
    fe->g->input = ir_alloc(sizeof(int) * (gp->n_input + 1));
    for (size_t i = 0; i < gp->n_input; i++) {
        const Onnx__ValueInfoProto *in = gp->input[i];
        if (!in->name || !*in->name)
            bad(fe, "graph input #%zu has no name", i);
        int id = find(fe, in->name);
        if (id >= 0 && fe->g->val[id].init_index >= 0)
            continue;                 /* old-style ONNX: initializers listed as inputs */
        if (id >= 0)
            bad(fe, "input '%s' is listed twice among the graph inputs", ir_q(in->name));
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
        if (default_domain(n->domain) && n->op_type && !strcmp(n->op_type, renamed[k].name))
            return k;
    return -1;
}

static int op_lookup(const Onnx__NodeProto *n)
{
    if (!default_domain(n->domain) || !n->op_type)
        return -1;
    if (renamed_op(n) >= 0)
        return renamed[renamed_op(n)].op;
    for (int op = 0; op < OP_COUNT; op++)
        if (op_info[op].since && !strcmp(op_info[op].name, n->op_type))
            return op;
    return -1;
}

static const char *node_label(size_t i, const Onnx__NodeProto *n)
{
    const char *op = ir_q(n->op_type);
    return n->name && *n->name ? ir_fmt("node '%s' (%s)", ir_q(n->name), op)
                               : ir_fmt("node #%zu (%s)", i, op);
}

/* ---- model-local functions ------------------------------------------------ */

/* ModelProto.functions are inlined before anything is loaded: a node whose
 * (domain, op_type, overload) names a function is replaced by the function's
 * body, each body node a copy whose inputs and outputs are renamed — formal
 * inputs and outputs to the caller's values, internal values to fresh names
 * (reserved like every name of the file, so they clash with none) — and whose
 * attributes that refer to the caller's (ref_attr_name) take the caller's
 * value, or the function's default (attribute_proto), or are left out.  A
 * body node calling a function is inlined in turn: at most MAX_INLINE deep,
 * never recursively.  What comes out is a flat list of nodes, each with the
 * default-domain opset it was written at (its function's opset_import).
 *
 * The system's onnx.proto may predate FunctionProto.attribute_proto (field 11,
 * onnx 1.13) and the overload fields (NodeProto 8, FunctionProto 13, onnx
 * 1.16): those are read from the fields protobuf-c kept unparsed. */

enum { MAX_INLINE = 32, MAX_FLAT = 1 << 20 };  /* bounds the memory a hostile model can take */

typedef struct Func {
    const Onnx__FunctionProto *f;
    const char *domain, *overload, *label;
    Onnx__AttributeProto **dflt; /* attribute_proto: defaults */
    size_t ndflt;
    int64_t opset;               /* of the default domain; -1: the caller's */
    int active;                  /* being inlined (recursion check) */
} Func;

typedef struct Flat {
    const Onnx__NodeProto *n;
    const char *what;            /* its label in messages */
    int64_t opset;
    size_t idx;                  /* the graph's node it comes from */
} Flat;


/* The payload of unknown field u of m if it is length-delimited with this
 * tag (protobuf-c keeps the length prefix in u->data), checked; else NULL. */
static const uint8_t *unknown_bytes(Fe *fe, const ProtobufCMessageUnknownField *u, uint32_t tag, size_t *len,
                                    const char *what)
{
    if (u->tag != tag || u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
        return NULL;
    const uint8_t *p = u->data, *end = u->data + u->len;
    uint64_t n;
    if (varint(&p, end, &n) || n != (uint64_t)(end - p))
        bad(fe, "%s has a malformed field %u", what, (unsigned)tag);
    *len = (size_t)n;
    return p;
}

/* The last length-delimited unknown field `tag` of m as a string, or "". */
static const char *unknown_string(Fe *fe, const ProtobufCMessage *m, uint32_t tag, const char *what)
{
    const char *s = "";
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        size_t len;
        const uint8_t *p = unknown_bytes(fe, &m->unknown_fields[i], tag, &len, what);
        if (!p)
            continue;
        if (len && memchr(p, 0, len))
            bad(fe, "%s has a NUL byte in a name", what);
        char *c = ir_alloc(len + 1);
        if (len)
            memcpy(c, p, len);
        s = c;
    }
    return s;
}

static const char *str(const char *s) { return s ? s : ""; }

static void load_function(Fe *fe, Func *fn, const Onnx__FunctionProto *f, size_t i)
{
    fn->f = f;
    fn->domain = default_domain(f->domain) ? "" : f->domain;
    const char *w = ir_fmt("model-local function #%zu", i);
    if (!f->name || !*f->name)
        bad(fe, "%s has no name", w);
    fn->overload = unknown_string(fe, &f->base, 13, w);
    fn->label = ir_fmt("function '%s'%s%s%s%s%s", ir_q(f->name), *fn->domain ? " [domain " : "",
                       ir_q(fn->domain), *fn->domain ? "]" : "", *fn->overload ? " overload " : "",
                       *fn->overload ? ir_q(fn->overload) : "");
    fn->opset = -1;
    for (size_t k = 0; k < f->n_opset_import; k++)
        if (default_domain(f->opset_import[k]->domain)) {
            int64_t v = f->opset_import[k]->version;
            if (v < OPSET_MIN || v > OPSET_MAX)
                bad(fe, "%s imports ONNX opset %lld; fsdpc supports opsets %d to %d (export it again at one of those)",
                    fn->label, (long long)v, OPSET_MIN, OPSET_MAX);
            fn->opset = v;
        }
    for (unsigned k = 0; k < f->base.n_unknown_fields; k++) {
        size_t len;
        const uint8_t *p = unknown_bytes(fe, &f->base.unknown_fields[k], 11, &len, fn->label);
        if (!p)
            continue;
        /* ModelProto > FunctionProto > AttributeProto: depth 2 */
        ProtobufCAllocator arena = {.alloc = pb_alloc, .free = pb_free};
        Onnx__AttributeProto *a = check_depth(&onnx__attribute_proto__descriptor, p, p + len, 2)
                                      ? NULL : onnx__attribute_proto__unpack(&arena, len, p);
        if (!a || !a->name || !*a->name)
            bad(fe, "%s has a malformed default attribute (attribute_proto)", fn->label);
        Onnx__AttributeProto **d = ir_alloc(sizeof *d * (fn->ndflt + 1));
        if (fn->ndflt)
            memcpy(d, fn->dflt, sizeof *d * fn->ndflt);
        d[fn->ndflt++] = a;
        fn->dflt = d;
    }
}

static void load_functions(Fe *fe, const Onnx__ModelProto *m)
{
    fe->nfuncs = m->n_functions;
    fe->funcs = ir_alloc(sizeof *fe->funcs * (fe->nfuncs + 1));
    for (size_t i = 0; i < fe->nfuncs; i++) {
        const Func *f = &fe->funcs[i];
        load_function(fe, &fe->funcs[i], m->functions[i], i);
        for (const Func *o = fe->funcs; o < f; o++)
            if (!strcmp(o->f->name, f->f->name) && !strcmp(o->domain, f->domain) && !strcmp(o->overload, f->overload))
                bad(fe, "%s is defined twice among the model's functions", f->label);
    }
}

/* The function node n calls, or NULL. */
static Func *func_of(Fe *fe, const Onnx__NodeProto *n)
{
    if (!fe->nfuncs || !n->op_type)
        return NULL;
    const char *dom = default_domain(n->domain) ? "" : n->domain, *ov = NULL;
    for (size_t i = 0; i < fe->nfuncs; i++)
        if (!strcmp(fe->funcs[i].f->name, n->op_type) && !strcmp(fe->funcs[i].domain, dom)) {
            if (!ov)
                ov = unknown_string(fe, &n->base, 8, ir_fmt("node '%s'", ir_q(str(n->name))));
            if (!strcmp(fe->funcs[i].overload, ov))
                return &fe->funcs[i];
        }
    return NULL;
}

static void flat_add(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, size_t idx)
{
    if (fe->nflat == MAX_FLAT)
        bad(fe, "inlining the model's functions gives more than %d nodes; fsdpc does not compile such a model",
            MAX_FLAT);
    if (fe->nflat == fe->flatcap) {
        size_t cap = fe->flatcap ? 2 * fe->flatcap : 256;
        Flat *f = ir_alloc(sizeof *f * cap);
        if (fe->nflat)
            memcpy(f, fe->flat, sizeof *f * fe->nflat);
        fe->flat = f;
        fe->flatcap = cap;
    }
    fe->flat[fe->nflat++] = (Flat){n, what, ops, idx};
}

/* A function call's renaming: formal name -> the caller's or a fresh name. */
typedef struct { const char *key, *val; int defined; } Pair;

static Pair *pair(Pair *t, size_t cap, const char *key)
{
    size_t i = hash(key) & (cap - 1);
    while (t[i].key && strcmp(t[i].key, key))
        i = (i + 1) & (cap - 1);
    return &t[i];
}

/* fresh(base), reserved: no later derived name takes it. */
static const char *fresh_reserved(Fe *fe, const char *base)
{
    const char *s = fresh(fe, base);
    slot(fe, s);
    return s;
}

/* fresh_reserved as opset_old.c calls it (OldNode.fresh) */
static const char *old_fresh(void *fe, const char *base) { return fresh_reserved(fe, base); }

/* A name no value of the file or of earlier inlining has, reserved. */
static const char *fresh_internal(Fe *fe, const char *prefix, const char *name)
{
    return fresh_reserved(fe, ir_fmt("%s/%s", prefix, name));
}

static const Onnx__AttributeProto *attr_named(Onnx__AttributeProto *const *a, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (a[i]->name && !strcmp(a[i]->name, name))
            return a[i];
    return NULL;
}

/* Body node b's attributes, references to the call's resolved. */
static void bind_attrs(Fe *fe, Onnx__NodeProto *c, const Onnx__NodeProto *call, const Func *fn, const char *bw)
{
    const Onnx__NodeProto *b = c;
    Onnx__AttributeProto **out = ir_alloc(sizeof *out * (b->n_attribute + 1));
    size_t n = 0;
    for (size_t i = 0; i < b->n_attribute; i++) {
        Onnx__AttributeProto *a = b->attribute[i];
        const char *ref = a->ref_attr_name;
        if (!ref || !*ref) {
            out[n++] = a;
            continue;
        }
        const Onnx__AttributeProto *v = attr_named(call->attribute, call->n_attribute, ref);
        if (!v)
            v = attr_named(fn->dflt, fn->ndflt, ref);
        if (!v) {
            int declared = 0;
            for (size_t k = 0; k < fn->f->n_attribute; k++)
                declared |= fn->f->attribute[k] && !strcmp(fn->f->attribute[k], ref);
            if (!declared)
                bad(fe, "%s refers to attribute '%s', which %s does not declare", bw, ir_q(ref), fn->label);
            continue; /* not given, no default: the attribute is absent */
        }
        if (a->type && v->type != a->type)
            bad(fe, "%s: attribute '%s' of the call has type %d, but %s uses it as type %d", bw, ir_q(ref),
                (int)v->type, fn->label, (int)a->type);
        Onnx__AttributeProto *r = ir_alloc(sizeof *r);
        *r = *v;
        r->name = a->name;
        r->ref_attr_name = NULL;
        out[n++] = r;
    }
    c->attribute = out;
    c->n_attribute = n;
}

static void flatten(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, int depth, size_t idx);

static void inline_call(Fe *fe, const Onnx__NodeProto *call, const char *what, Func *fn, int64_t ops, int depth,
                        size_t idx)
{
    const Onnx__FunctionProto *f = fn->f;
    if (fn->active)
        bad(fe, "%s calls %s, which is being inlined already: a recursive function; fsdpc inlines functions "
            "and cannot inline recursion", what, fn->label);
    if (depth >= MAX_INLINE)
        bad(fe, "%s: functions call functions more than %d deep; fsdpc does not inline deeper", what, MAX_INLINE);
    if (call->n_input > f->n_input || call->n_output > f->n_output)
        bad(fe, "%s has %zu inputs and %zu outputs; %s takes %zu and %zu", what, call->n_input,
            call->n_output, fn->label, f->n_input, f->n_output);
    size_t cnt = f->n_input + f->n_output + 1;
    for (size_t i = 0; i < f->n_node; i++) {
        if (f->node[i]->n_output > MAX_FLAT)
            bad(fe, "%s has a node with too many outputs", fn->label);
        cnt += f->node[i]->n_output;
        if (cnt > MAX_FLAT)
            bad(fe, "%s is too large", fn->label);
    }
    size_t cap = 16;
    while (cap < 2 * cnt)
        cap *= 2;
    Pair *t = ir_alloc(sizeof *t * cap);
    const char *prefix = call->name && *call->name ? call->name : what;
    for (size_t i = 0; i < f->n_input + f->n_output; i++) {
        int isin = i < f->n_input;
        size_t k = isin ? i : i - f->n_input;
        const char *formal = isin ? f->input[k] : f->output[k];
        if (!formal || !*formal)
            bad(fe, "%s has an empty %s name", fn->label, isin ? "input" : "output");
        Pair *p = pair(t, cap, formal);
        if (p->key)
            bad(fe, "%s names '%s' twice among its inputs and outputs (fsdpc does not inline a function "
                "that returns an input)", fn->label, ir_q(formal));
        p->key = formal;
        if (isin) {
            p->val = k < call->n_input ? call->input[k] : "";
            p->defined = 1;
        } else {
            p->val = k < call->n_output && *call->output[k] ? call->output[k] : NULL;
        }
    }
    fn->active = 1;
    for (size_t j = 0; j < f->n_node; j++) {
        const Onnx__NodeProto *b = f->node[j];
        Onnx__NodeProto *c = ir_alloc(sizeof *c);
        *c = *b;
        const char *bn = b->name && *b->name ? b->name : ir_fmt("%s_%zu", str(b->op_type), j);
        c->name = (char *)ir_fmt("%s/%s", prefix, bn);
        const char *bw = node_label(0, c);
        c->input = ir_alloc(sizeof(char *) * (b->n_input + 1));
        for (size_t i = 0; i < b->n_input; i++) {
            const char *x = str(b->input[i]);
            Pair *p = *x ? pair(t, cap, x) : NULL;
            if (p && (!p->key || !p->defined))
                bad(fe, "%s (in %s) uses '%s', which neither the function's inputs nor an earlier node of "
                    "its body define", bw, fn->label, ir_q(x));
            c->input[i] = (char *)(p ? p->val : "");
        }
        c->output = ir_alloc(sizeof(char *) * (b->n_output + 1));
        for (size_t i = 0; i < b->n_output; i++) {
            const char *y = str(b->output[i]);
            if (!*y) {
                c->output[i] = "";
                continue;
            }
            Pair *p = pair(t, cap, y);
            if (p->key && p->defined)
                bad(fe, "%s (in %s) defines '%s', which is already defined", bw, fn->label, ir_q(y));
            p->key = y;
            if (!p->val)
                p->val = fresh_internal(fe, prefix, y);
            p->defined = 1;
            c->output[i] = (char *)p->val;
        }
        bind_attrs(fe, c, call, fn, bw);
        flatten(fe, c, bw, fn->opset >= 0 ? fn->opset : ops, depth + 1, idx);
    }
    fn->active = 0;
    for (size_t k = 0; k < f->n_output; k++)
        if (!pair(t, cap, f->output[k])->defined)
            bad(fe, "%s: output '%s' of %s is not defined by any node of its body", what, ir_q(f->output[k]),
                fn->label);
}

static void flatten(Fe *fe, const Onnx__NodeProto *n, const char *what, int64_t ops, int depth, size_t idx)
{
    Func *fn = func_of(fe, n);
    if (fn)
        inline_call(fe, n, what, fn, ops, depth, idx);
    else
        flat_add(fe, n, what, ops, idx);
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
    bad(fe, "unsupported op%s %s; docs/ops.md lists the ops fsdpc accepts", nu > 1 || other ? "s" : "", s);
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
        bad(fe, "%s has an attribute without a name", what);
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
            bad(fe, "%s is too long", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_INTS);
        r->n = (int)a->n_ints;
        r->ints = ir_alloc(sizeof(int64_t) * (a->n_ints + 1));
        if (a->n_ints)
            memcpy(r->ints, a->ints, sizeof(int64_t) * a->n_ints);
        break;
    case AT(FLOATS):
        if (a->n_floats > INT_MAX)
            bad(fe, "%s is too long", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_FLOATS);
        r->n = (int)a->n_floats;
        r->floats = ir_alloc(sizeof(double) * (a->n_floats + 1));
        for (size_t i = 0; i < a->n_floats; i++)
            r->floats[i] = attr_float(a->floats[i]);
        break;
    case AT(STRING):
        if (a->s.len && memchr(a->s.data, 0, a->s.len))
            bad(fe, "%s contains a NUL byte", aw);
        r = ir_attr_add(fe->g, nid, a->name, A_STRING);
        r->s = ir_alloc(a->s.len + 1);
        if (a->s.len)
            memcpy(r->s, a->s.data, a->s.len);
        break;
    case AT(STRINGS):
        if (a->n_strings > 64)
            bad(fe, "%s lists %zu strings; fsdpc reads at most 64", aw, a->n_strings);
        r = ir_attr_add(fe->g, nid, a->name, A_STRINGS);
        r->n = (int)a->n_strings;
        r->strs = ir_alloc(sizeof(char *) * (a->n_strings + 1));
        for (size_t i = 0; i < a->n_strings; i++) {
            const ProtobufCBinaryData *b = &a->strings[i];
            if (b->len > 256 || (b->len && memchr(b->data, 0, b->len)))
                bad(fe, "%s: string %zu is longer than 256 bytes or holds a NUL byte", aw, i);
            r->strs[i] = ir_alloc(b->len + 1);
            if (b->len)
                memcpy(r->strs[i], b->data, b->len);
        }
        break;
    case AT(TENSOR): {
        if (!a->t)
            bad(fe, "%s has no tensor", aw);
        int t = const_tensor(fe, fresh(fe, ir_fmt("%s.%s", fe->g->node[nid].name, a->name)), a->t, aw, -1);
        define(fe, fe->g->val[t].name, t, aw);
        ir_attr_add(fe->g, nid, a->name, A_TENSOR)->t = t;
        break;
    }
    default: {
        static const char *tn[] = {"UNDEFINED", "FLOAT", "INT", "STRING", "TENSOR", "GRAPH",
                                   "FLOATS", "INTS", "STRINGS", "TENSORS", "GRAPHS",
                                   "SPARSE_TENSOR", "SPARSE_TENSORS", "TYPE_PROTO", "TYPE_PROTOS"};
        int k = (int)a->type;
        bad(fe, "%s has type %s, which fsdpc does not support in attributes", aw,
            k >= 0 && k < (int)(sizeof tn / sizeof *tn) ? tn[k] : ir_fmt("%d", k));
    }
    }
}

/* Constant: no node; its output becomes an R_CONST value. */
static void constant_node(Fe *fe, const Onnx__NodeProto *n, const char *what)
{
    if (n->n_input || n->n_output != 1 || !*n->output[0])
        bad(fe, "%s must have no inputs and one output", what);
    if (n->n_attribute != 1 || !n->attribute[0]->name)
        bad(fe, "%s must have exactly one attribute (value, value_float, value_floats, value_int or "
            "value_ints)", what);
    const Onnx__AttributeProto *a = n->attribute[0];
    const char *out = n->output[0], *an = a->name;
    const char *aw = ir_fmt("%s attribute '%s'", what, ir_q(an));
    int v;
    if (!strcmp(an, "value") && a->type == AT(TENSOR) && a->t)
        v = const_tensor(fe, out, a->t, aw, -1);
    else if (!strcmp(an, "value_float") && a->type == AT(FLOAT))
        v = const_list(fe, out, DT_F32, &a->f, 1, 1);
    else if (!strcmp(an, "value_floats") && a->type == AT(FLOATS))
        v = const_list(fe, out, DT_F32, a->floats, a->n_floats, 0);
    else if (!strcmp(an, "value_int") && a->type == AT(INT))
        v = const_list(fe, out, DT_I64, &a->i, 1, 1);
    else if (!strcmp(an, "value_ints") && a->type == AT(INTS))
        v = const_list(fe, out, DT_I64, a->ints, a->n_ints, 0);
    else
        bad(fe, "%s is not supported (fsdpc accepts value, value_float(s) and value_int(s); not "
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
            bad(fe, "%s: %s takes %s as an attribute before opset %d; this node gives it as input %d (at opset %lld; "
                "or convert the model with onnx.version_converter.convert_version(model, %d))", what, op, f->name,
                f->opset, f->input + 1, (long long)opset, OPSET_IR);
        if (f->input >= 0 && n->nin > f->input)
            bad(fe, "%s: input %d (%s) is opset %d's; at opset %lld %s takes at most %d inputs", what, f->input,
                f->name, f->opset, (long long)opset, op, f->input);
        if (f->input < 0 && !f->value && ir_attr(n, f->name))
            bad(fe, "%s: %s is opset %d's; at opset %lld %s has none", what, f->name, f->opset, (long long)opset, op);
        const char *v = f->value ? ir_attr_s(n, f->name, NULL) : NULL;
        if (v && !strcmp(v, f->value))
            bad(fe, "%s: %s '%s' is opset %d's (the model says opset %lld)", what, f->name, f->value, f->opset,
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
        bad(fe, "%s: %s is deprecated from opset %d (the model says opset %lld): use %s", what, renamed[rename].name,
            renamed[rename].until, (long long)opset, op);
    if (opset < since && rename < 0) /* an op newer than the model (ops.def's since) */
        bad(fe, "%s: %s is an opset %d op; the model says opset %lld (export at opset %d or later)", what, op, since,
            (long long)opset, since);
    if ((op_info[n->op].flags & F_REDUCE) && n->op != OP_ReduceSum) { /* axes: an attribute before opset 18,
                                                                         an input from 18 (ReduceSum's: 13) */
        if (opset >= 18 && has_axes)
            bad(fe, "%s: at opset %lld, %s takes axes as its second input, not an attribute (export the model "
                "again, or convert it with onnx.version_converter)", what, (long long)opset, op);
        if (opset < 18 && nin > 1)
            bad(fe, "%s: at opset %lld, %s takes axes as an attribute; an axes input is opset 18's (the model "
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
        bad(fe, "%s has %zu input%s; %s takes %s", what, n->n_input, n->n_input == 1 ? "" : "s", oi->name,
            lo == hi ? ir_fmt("%d", lo) : hi < INT_MAX / 2 ? ir_fmt("%d to %d", lo, hi)
                                                         : ir_fmt("at least %d", lo));
    int nout = oi->outmax >= 0 ? oi->outmax : (int)n->n_output;
    if ((int)n->n_output < oi->outmin || (int)n->n_output > nout || (oi->outmin > 0 && !*n->output[0]))
        bad(fe, "%s has %zu output%s; %s has %d to %d", what, n->n_output, n->n_output == 1 ? "" : "s",
            oi->name, oi->outmin, nout);
    int *in = ir_alloc(sizeof(int) * (n->n_input + 1));
    for (size_t i = 0; i < n->n_input; i++)
        in[i] = use(fe, n->input[i], what, (int)i < lo);
    const char *nname = n->name && *n->name ? n->name : ir_fmt("%s_%d", oi->name, fe->g->nnode);
    int *out = ir_alloc(sizeof(int) * (size_t)(nout + 1));
    for (int k = 0; k < nout; k++) {
        int named = k < (int)n->n_output && *n->output[k];
        const char *on = named ? n->output[k] : fresh(fe, ir_fmt("%s.out%d", nname, k));
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
            slot(fe, gp->initializer[i]->name);
    for (size_t i = 0; i < gp->n_input; i++)
        if (gp->input[i]->name)
            slot(fe, gp->input[i]->name);
    for (size_t i = 0; i < gp->n_node; i++)
        for (size_t k = 0; k < gp->node[i]->n_output; k++)
            if (*gp->node[i]->output[k])
                slot(fe, gp->node[i]->output[k]);
}

static void load_outputs(Fe *fe, const Onnx__GraphProto *gp)
{
    if (gp->n_output > INT_MAX / 2)
        bad(fe, "the graph has too many outputs");
    fe->g->output = ir_alloc(sizeof(int) * (gp->n_output + 1));
    for (size_t i = 0; i < gp->n_output; i++) {
        const char *name = gp->output[i]->name;
        int id = name ? find(fe, name) : UNSEEN;
        if (id < 0)
            bad(fe, "graph output '%s' is not defined by any node, input or initializer", ir_q(name));
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
        bad(fe, "the model has no graph");
    check_opset(fe, fe->model);
    model_dir(fe);
    const Onnx__GraphProto *gp = fe->model->graph;
    if (gp->n_node > INT_MAX / 4)
        bad(fe, "the graph has too many nodes");
    check_dim_options(opt, gp);
    reserve_names(fe, gp);
    load_functions(fe, fe->model);
    for (size_t i = 0; i < gp->n_node; i++)
        flatten(fe, gp->node[i], node_label(i, gp->node[i]), fe->opset, 0, i);
    check_ops(fe);
    load_initializers(fe, gp);
    load_signature(fe, gp);
    load_program_signature(fe, gp);
    load_padding(fe);
    check_state_records(fe);
    load_inputs(fe, opt, gp);
    for (size_t i = 0; i < fe->nflat; i++)
        load_node(fe, &fe->flat[i]);
    load_outputs(fe, gp);
    return fe->g;
}
