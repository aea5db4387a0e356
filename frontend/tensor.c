/* tensor.c — the frontend's tensors: an ONNX TensorProto (an initializer, a Constant node's or a tensor
 * attribute's value) or a list attribute's scalars → an R_CONST value of the Graph, its data checked and
 * copied into the IR arena in host byte order (raw_data, the typed fields, or external data: located in the
 * model's folder, never outside it, and read when needed).  frontend/onnx.c calls fe_const_tensor and
 * fe_const_list; a dtype fsdpc does not support is fe_bad_dtype's one line. */
#define _XOPEN_SOURCE 700  /* realpath */
#include "fe.h"
#include "rules/tensor.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static DType dtype_of(int32_t t) { return tensor_from_onnx(t); }

/* "has dtype FLOAT8E4M3FN, which fsdpc does not support (use float32 ...)" */
_Noreturn void fe_bad_dtype(Fe *fe, const char *what, int32_t t)
{
    const char *hint = t == 0 ? "the model must declare a dtype"
                     : (t >= 17 && t <= 20) || t == 23 ? "use float32, float16 or bfloat16"
                     : t == 21 || t == 22 ? "use int8, uint8 or a wider integer"
                     : "supported: float32, float64, float16, bfloat16, bool and the integers of 8 to 64 bits";
    fe_bad(fe, "%s has dtype %s, which fsdpc does not support (%s)", what, tensor_onnx_name(t), hint);
}

static int64_t make_shape(Fe *fe, Shape *s, size_t n, const int64_t *dims, const char *what)
{
    if (n > MAX_RANK)
        fe_bad(fe, "%s has rank %zu; fsdpc supports rank <= %d", what, n, MAX_RANK);
    s->rank = (int)n;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] < 0)
            fe_bad(fe, "%s has negative dim %zu (%lld)", what, i, (long long)dims[i]);
        s->dim[i] = dims[i];
    }
    int64_t numel = shape_count(s);
    if (numel < 0)
        fe_bad(fe, "%s has shape %s, beyond 2^40 elements; fsdpc cannot hold it", what, shape_str(s));
    return numel;
}

static int64_t parse_count(Fe *fe, const char *s, const char *key, const char *what)
{
    int64_t v = 0;
    if (!s || !*s)
        fe_bad(fe, "%s external data has an empty '%s'", what, key);
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10)
            fe_bad(fe, "%s external data '%s' is not a byte count", what, key);
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
        fe_bad(fe, "%s is stored as external data but names no 'location'", what);
    *e = (ExtData){.what = what, .loc = loc, .len = (int64_t)bytes};
    e->off = off_s ? parse_count(fe, off_s, "offset", what) : 0;
    if (len_s && parse_count(fe, len_s, "length", what) != (int64_t)bytes)
        fe_bad(fe, "%s external data has length %s, but its dtype and shape need %zu bytes", what,
            ir_q(len_s), bytes);
    if (escapes(loc))
        fe_bad(fe, "%s external data path '%s' escapes the model directory (keep the data files "
            "beside the model, with relative paths)", what, ir_q(loc));
    char *r = realpath(ir_fmt("%s/%s", fe->dir, loc), NULL);
    if (!r) {
        const char *msg = ir_fmt("%s external data file '%s' (in %s): %s", what, ir_q(loc), ir_q(fe->dir),
                                 strerror(errno));
        if (errno != ENOENT || fe->g->opt->out)
            fe_bad(fe, "%s", msg);
        e->missing = msg;
        return;
    }
    e->file = ir_strdup(r);
    free(r);
    if (!inside(fe, e->file))
        fe_bad(fe, "%s external data path '%s' escapes the model directory (it resolves to %s)", what,
            ir_q(loc), ir_q(e->file));
    int64_t size;
    close(fe_open_regular(fe, e->file, ir_fmt("%s external data file '%s'", what, ir_q(loc)), &size));
    if (e->off > size || (int64_t)bytes > size - e->off)
        fe_bad(fe, "%s needs %zu bytes at offset %lld of '%s', which has %lld bytes (is it truncated?)",
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
        fe_bad(fe, "%s has %zu values in %s, but its shape needs %lld", what, have, field,
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
int fe_const_tensor(Fe *fe, const char *name, const Onnx__TensorProto *t, const char *what, int init)
{
    DType dt = dtype_of(t->data_type);
    if (dt == DT_UNDEF)
        fe_bad_dtype(fe, what, t->data_type);
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
            fe_bad(fe, "%s has %zu bytes of raw_data, but its dtype and shape %s need %zu", what,
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
int fe_const_list(Fe *fe, const char *name, DType dt, const void *src, size_t n, int scalar)
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
