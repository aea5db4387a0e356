/* export.c — --export-onnx: the trained parameters written back into the
 * original ONNX model; --export-safetensors: the same tensors (every
 * parameter and written-back state, by initializer name) as safetensors.
 *
 * Rank 0 reads the original model bytes from the init file, every rank sends
 * its parameter shard of every unit to rank 0 (rt_ctl_gather; from the
 * device first: rt_dev_download), rank 0 replaces
 * the data of each parameter's initializer by the trained values (raw_data,
 * little-endian; typed fields and external data cleared; name, dims and
 * data_type kept), does the same for each initializer the step writes back
 * (RtConst.name: BatchNormalization running statistics, rank 0's values,
 * as PyTorch DDP broadcasts rank 0's buffers), packs the model and writes it
 * atomically
 * (afile.h: a temporary of an unpredictable name made beside FILE, never
 * through a link, fsync'ed and renamed over FILE).  The
 * safetensors file is every float initializer in name order (trained,
 * written back, or kept fixed: --freeze, or no gradient reaches it, with its
 * original values): an 8-byte little-endian header length, the JSON header
 * (dtype, shape, data_offsets; names JSON-escaped; padded with spaces to 8
 * bytes), then the data.  It is the module's state_dict: an initializer the
 * model's metadata_props names under NON_PERSISTENT_KEY (scripts/
 * export_torch.py's record of a non-persistent buffer, a rotary embedding's
 * inv_freq, which no state_dict holds) is left out, so that a strict
 * load_state_dict takes the file; the header's __metadata__ "left_out" and
 * a line on stdout (unless --quiet) name them.  A tied parameter is one
 * initializer under one of its names; each other name the metadata records
 * (TIED_KEY + ALIAS = INIT) is a tensor of the file too, INIT's data again
 * (safetensors has no shared entries), as the module's state_dict holds
 * every name.
 *
 * External data: when the original model kept any initializer in an
 * external data file, or the export would pack to more than 1 GiB, the
 * tensor data goes to one file beside the export, FILE.data, named in the
 * model by its bare file name (location; offset and length, 64-byte aligned):
 * every initializer of 1 KiB or more (ONNX's default threshold) that was
 * external or is trained or written back; the others are inline.
 * The untrained external ones are copied from OUT.init (RtModel.ext: fsdpc
 * stores them there), so the export needs no file of the original model.
 * FILE.data is written (atomically) before the FILE that refers to it.
 *
 * protobuf-c ownership: the unpacked message owns every array and string it
 * points to.  Each modified TensorProto is saved by value before it is
 * pointed at our buffers and restored after packing, so that
 * onnx__model_proto__free_unpacked frees exactly what it allocated.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "afile.h"
#include "onnx.pb-c.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

/* scripts/export_torch.py's model metadata_props key prefix: + INIT = a non-persistent buffer */
#define NON_PERSISTENT_KEY "fsdpc.non_persistent."
/* + ALIAS = INIT: a tied parameter's other name (no initializer), written with INIT's data */
#define TIED_KEY "fsdpc.tied."

/* ONNX TensorProto.DataType */
enum { ONNX_FLOAT = 1, ONNX_DOUBLE = 11 };

typedef struct {
    const char *name;
    Onnx__TensorProto *t;
    size_t index;             /* among the graph's initializers */
    int external;             /* its data was in an external file of the original model */
} InitRef;

typedef struct {
    Onnx__TensorProto *t;
    Onnx__TensorProto saved;  /* the unpacked state, restored before free */
    void *conv;               /* owned conversion buffer (dtype differs), or NULL */
    /* the export's external data entries (location, offset, length) */
    Onnx__StringStringEntryProto kv[3], *kvp[3];
    char num[2][24];
} Patch;

typedef struct {
    const char *path;         /* the file being written, for messages */
    const char *flag;         /* --export-onnx / --export-safetensors */
    char err[1024];
    uint8_t *model;           /* original bytes */
    Onnx__ModelProto *mp;
    char **full;              /* per unit: world*shard_len gathered elements */
    InitRef *refs;
    size_t nrefs;
    int had_external;         /* some initializer of the original was external */
    Patch *patch;
    int npatch, cap_patch;
    uint8_t *out;
    char *data_path;          /* FILE.data (external data) */
    int init_fd;
    const char *init_path;
    const RtModel *m;
} Export;

static int xfail(Export *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int xfail(Export *x, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->err, sizeof x->err, fmt, ap);
    va_end(ap);
    return -1;
}

static int cmp_ref(const void *a, const void *b)
{
    return strcmp(((const InitRef *)a)->name, ((const InitRef *)b)->name);
}

/* rank 0: read and unpack the model, index the initializers, allocate the gather buffers */
static int prepare(Export *x, RtCtx *c, int init_fd, const char *init_path)
{
    const RtModel *m = c->m;
    if (m->model_len <= 0)
        return xfail(x, "this build does not embed the original ONNX model; cannot export");
    if ((uint64_t)m->model_len > (uint64_t)SIZE_MAX)
        return xfail(x, "embedded ONNX model too large");
    size_t len = (size_t)m->model_len;
    x->model = malloc(len);
    if (!x->model)
        return xfail(x, "out of memory reading the ONNX model (%zu bytes)", len);
    if (rt_pread_all(init_fd, x->model, len, (uint64_t)m->model_off) != 0)
        return xfail(x, "reading the ONNX model from %s: %s", init_path, strerror(errno));
    x->mp = onnx__model_proto__unpack(NULL, len, x->model);
    if (!x->mp)
        return xfail(x, "the ONNX model embedded in %s cannot be parsed (corrupt init file?)", init_path);
    Onnx__GraphProto *g = x->mp->graph;
    if (!g)
        return xfail(x, "the embedded ONNX model has no graph");
    if (g->n_initializer > (size_t)INT_MAX / 2)
        return xfail(x, "the embedded ONNX model has too many initializers");
    x->nrefs = g->n_initializer;
    x->refs = calloc(x->nrefs ? x->nrefs : 1, sizeof *x->refs);
    if (!x->refs)
        return xfail(x, "out of memory");
    for (size_t i = 0; i < x->nrefs; i++) {
        Onnx__TensorProto *t = g->initializer[i];
        x->refs[i] = (InitRef){t->name ? t->name : "", t, i,
                               t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL};
        x->had_external |= x->refs[i].external;
    }
    qsort(x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
    x->full = calloc(m->nunit ? (size_t)m->nunit : 1, sizeof *x->full);
    x->cap_patch = (int)x->nrefs + m->nparam + m->nconst + 1;
    x->patch = calloc((size_t)x->cap_patch, sizeof *x->patch);
    if (!x->full || !x->patch)
        return xfail(x, "out of memory");
    for (int u = 0; u < m->nunit; u++) {
        size_t n = (size_t)c->world * (size_t)c->shard_len[u] * (size_t)rt_elem_size(m->unit[u].dtype);
        x->full[u] = malloc(n ? n : 1);
        if (!x->full[u])
            return xfail(x, "out of memory gathering unit '%s' (%zu bytes)", m->unit[u].name, n);
    }
    return 0;
}

/* t's data := len raw bytes (little-endian), every other data field cleared */
static void point_at(Onnx__TensorProto *t, uint8_t *bytes, size_t len)
{
    t->has_raw_data = 1;
    t->raw_data.data = bytes;
    t->raw_data.len = len;
    t->n_float_data = 0;
    t->float_data = NULL;
    t->n_double_data = 0;
    t->double_data = NULL;
    t->n_int32_data = 0;
    t->int32_data = NULL;
    t->n_int64_data = 0;
    t->int64_data = NULL;
    t->n_uint64_data = 0;
    t->uint64_data = NULL;
    t->n_string_data = 0;
    t->string_data = NULL;
    t->n_external_data = 0;
    t->external_data = NULL;
    t->has_data_location = 1;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__DEFAULT;
}

/* t's patch: the state to restore saved on the first call */
static Patch *add_patch(Export *x, Onnx__TensorProto *t)
{
    for (int j = 0; j < x->npatch; j++)
        if (x->patch[j].t == t)
            return &x->patch[j];
    Patch *pt = &x->patch[x->npatch++]; /* cap_patch: one per initializer, parameter and constant */
    pt->t = t;
    pt->saved = *t;
    return pt;
}

static int patched(const Export *x, const Onnx__TensorProto *t)
{
    for (int j = 0; j < x->npatch; j++)
        if (x->patch[j].t == t)
            return 1;
    return 0;
}

/* rank 0: point every parameter's initializer at its trained values */
static int patch_params(Export *x, RtCtx *c)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        const char *pname = p->name ? p->name : "";
        InitRef key = {.name = pname};
        InitRef *r = bsearch(&key, x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
        if (!r)
            return xfail(x, "parameter '%s' is not an initializer of the embedded ONNX model", pname);
        Onnx__TensorProto *t = r->t;
        if (patched(x, t))
            return xfail(x, "parameter '%s' is listed twice", pname);
        if (p->unit < 0 || p->unit >= m->nunit || p->offset < 0 || p->numel < 0 ||
            p->offset > m->unit[p->unit].numel - p->numel)
            return xfail(x, "parameter '%s' lies outside its unit (corrupt model tables)", pname);
        int64_t n = 1;
        for (size_t d = 0; d < t->n_dims; d++)
            if (t->dims[d] < 0 || __builtin_mul_overflow(n, t->dims[d], &n))
                return xfail(x, "initializer '%s' has an invalid shape", pname);
        if (n != p->numel)
            return xfail(x, "initializer '%s' has %lld elements in the ONNX model but %lld were trained",
                         pname, (long long)n, (long long)p->numel);
        int udt = m->unit[p->unit].dtype;
        int64_t ues = rt_elem_size(udt);
        const char *src = x->full[p->unit] + p->offset * ues;
        int tdt = t->has_data_type ? t->data_type : 0;
        if (tdt != ONNX_FLOAT && tdt != ONNX_DOUBLE)
            return xfail(x, "initializer '%s' has ONNX data type %d; only float and double parameters "
                         "can be exported", pname, tdt);
        if (udt != RT_F32 && udt != RT_F64)
            return xfail(x, "parameter '%s' has unsupported dtype code %d", pname, udt);
        Patch *pt = add_patch(x, t);
        size_t tes = tdt == ONNX_FLOAT ? 4 : 8;
        uint8_t *bytes;
        if ((tdt == ONNX_FLOAT) == (udt == RT_F32)) {
            bytes = (uint8_t *)src;
        } else {
            pt->conv = malloc(n ? (size_t)n * tes : 1);
            if (!pt->conv)
                return xfail(x, "out of memory converting '%s'", pname);
            if (tdt == ONNX_FLOAT) {
                const double *s = (const double *)(const void *)src;
                float *d = pt->conv;
                for (int64_t k = 0; k < n; k++)
                    d[k] = (float)s[k];
            } else {
                const float *s = (const float *)(const void *)src;
                double *d = pt->conv;
                for (int64_t k = 0; k < n; k++)
                    d[k] = s[k];
            }
            bytes = pt->conv;
        }
        point_at(t, bytes, (size_t)n * tes);
    }
    return 0;
}

/* rank 0: point the initializer of every constant the step writes back
 * (BatchNormalization running statistics) at its current bytes in the arena */
static int patch_state(Export *x, RtCtx *c)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nconst; i++) {
        const RtConst *k = &m->cnst[i];
        if (!k->name)
            continue;
        rt_dev_download(c, c->arena + k->arena_off, k->nbytes);
        InitRef key = {.name = k->name};
        InitRef *r = bsearch(&key, x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
        if (!r)
            return xfail(x, "state '%s' is not an initializer of the embedded ONNX model", k->name);
        Onnx__TensorProto *t = r->t;
        int tdt = t->has_data_type ? t->data_type : 0;
        int64_t n = 1;
        for (size_t d = 0; d < t->n_dims; d++)
            if (t->dims[d] < 0 || __builtin_mul_overflow(n, t->dims[d], &n))
                return xfail(x, "initializer '%s' has an invalid shape", k->name);
        if ((tdt != ONNX_FLOAT && tdt != ONNX_DOUBLE) || n * (tdt == ONNX_FLOAT ? 4 : 8) != k->nbytes)
            return xfail(x, "initializer '%s' does not match the %lld bytes of its state", k->name,
                         (long long)k->nbytes);
        if (patched(x, t))
            return xfail(x, "initializer '%s' is written twice", k->name);
        add_patch(x, t);
        point_at(t, (uint8_t *)c->arena + k->arena_off, (size_t)k->nbytes);
    }
    return 0;
}

/* the directory part of path (malloc'd), "." if none */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash)
        dir = strdup(".");
    else if (slash == path)
        dir = strdup("/");
    else {
        dir = malloc((size_t)(slash - path) + 1);
        if (dir) {
            memcpy(dir, path, (size_t)(slash - path));
            dir[slash - path] = 0;
        }
    }
    return dir;
}

int rt_export_check(const RtModel *m, const char *flag, const char *path, char *err, size_t errlen)
{
    if (m->model_len <= 0) {
        snprintf(err, errlen, "%s %s: this build does not embed the original ONNX model", flag, path);
        return -1;
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s %s: is a directory", flag, path);
        return -1;
    }
    char *dir = dir_of(path);
    if (!dir) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = 0;
    if (stat(dir, &st) != 0) {
        snprintf(err, errlen, "%s %s: directory %s: %s", flag, path, dir, strerror(errno));
        rc = -1;
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s %s: %s is not a directory", flag, path, dir);
        rc = -1;
    } else if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "%s %s: directory %s is not writable: %s", flag, path, dir, strerror(errno));
        rc = -1;
    }
    free(dir);
    return rc;
}

/* path's temporary (rt_afile: made beside it, never through a link), created for writing; 0, or -1 (x->err) */
static int open_tmp(Export *x, const char *path, RtAFile *f)
{
    if (rt_afile_open(f, path, 0666) != 0)
        return xfail(x, "cannot create a temporary beside %s: %s", path, strerror(errno));
    return 0;
}

/* f's temporary renamed over path (synced); on failure (rc != 0 on entry: a write failed, errno) it is removed */
static int commit_tmp(Export *x, RtAFile *f, const char *path, int rc)
{
    if (rc != 0) {
        int e = errno;
        rt_afile_abort(f);
        return xfail(x, "writing %s: %s", path, strerror(e));
    }
    if (rt_afile_commit(f) != 0)
        return xfail(x, "writing %s: %s", path, strerror(errno));
    return 0;
}

static int write_atomic(Export *x, const uint8_t *buf, size_t len)
{
    RtAFile f;
    if (open_tmp(x, x->path, &f) != 0)
        return -1;
    return commit_tmp(x, &f, x->path, rt_write_all(f.fd, buf, len));
}

/* the elements of t (-1: a bad shape) */
static int64_t numel_of(const Onnx__TensorProto *t)
{
    int64_t n = 1;
    for (size_t d = 0; d < t->n_dims; d++)
        if (t->dims[d] < 0 || __builtin_mul_overflow(n, t->dims[d], &n))
            return -1;
    return n;
}

/* the current data of initializer r (trained, written back, or the original's: raw, typed float/double, or
 * external, read from OUT.init into *owned, which the caller frees); 0, or -1 (x->err) */
static int data_of(Export *x, const InitRef *r, const uint8_t **p, size_t *len, void **owned)
{
    const Onnx__TensorProto *t = r->t;
    *owned = NULL;
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        const RtExtern *e = NULL;
        for (int i = 0; i < x->m->nextern && !e; i++)
            if (x->m->ext[i].init >= 0 && (size_t)x->m->ext[i].init == r->index)
                e = &x->m->ext[i];
        if (!e)
            return xfail(x, "initializer '%s' is external data that the init file does not hold (rebuild the "
                         "executable with this fsdpc)", r->name);
        if ((uint64_t)e->nbytes > (uint64_t)SIZE_MAX)
            return xfail(x, "initializer '%s' is too large", r->name);
        *len = (size_t)e->nbytes;
        *owned = malloc(*len ? *len : 1);
        if (!*owned)
            return xfail(x, "out of memory reading initializer '%s' (%zu bytes)", r->name, *len);
        if (rt_pread_all(x->init_fd, *owned, *len, (uint64_t)e->file_off) != 0)
            return xfail(x, "reading initializer '%s' from %s: %s", r->name, x->init_path, strerror(errno));
        *p = *owned;
    } else if (t->has_raw_data) {
        *p = t->raw_data.data;
        *len = t->raw_data.len;
    } else if (t->data_type == ONNX_FLOAT) {
        *p = (const uint8_t *)t->float_data;
        *len = t->n_float_data * sizeof(float);
    } else if (t->data_type == ONNX_DOUBLE) {
        *p = (const uint8_t *)t->double_data;
        *len = t->n_double_data * sizeof(double);
    } else {
        return xfail(x, "initializer '%s': internal error: data of ONNX type %d asked for", r->name,
                     (int)t->data_type);
    }
    return 0;
}

/* a growing byte buffer for the safetensors header */
typedef struct {
    char *b;
    size_t n, cap;
    int oom;
} Str;

static void put(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(Str *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0 || s->oom)
        return;
    if (s->n + (size_t)k + 1 > s->cap) {
        size_t cap = (s->n + (size_t)k + 1) * 2;
        char *q = realloc(s->b, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        s->b = q;
        s->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(s->b + s->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    s->n += (size_t)k;
}

/* whether the model's metadata_props record initializer name as a non-persistent buffer (NON_PERSISTENT_KEY) */
static int non_persistent(const Export *x, const char *name)
{
    size_t k = strlen(NON_PERSISTENT_KEY);
    for (size_t i = 0; i < x->mp->n_metadata_props; i++) {
        const char *key = x->mp->metadata_props[i]->key;
        if (key && !strncmp(key, NON_PERSISTENT_KEY, k) && !strcmp(key + k, name))
            return 1;
    }
    return 0;
}

/* s gets name as a JSON string's contents (quotes and backslashes escaped, control characters as \uXXXX) */
static void put_json(Str *s, const char *name)
{
    for (const unsigned char *q = (const unsigned char *)name; *q; q++)
        if (*q == '"' || *q == '\\')
            put(s, "\\%c", *q);
        else if (*q < 0x20 || *q == 0x7f)
            put(s, "\\u%04x", *q);
        else
            put(s, "%c", *q);
}

/* the safetensors header's __metadata__: format and producer, and "left_out": the non-persistent buffers'
 * names, comma-separated (none: no key); the names also in *left (its n counts them) */
static void put_metadata(const Export *x, Str *h, Str *left)
{
    put(h, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"fsdpc\"");
    for (size_t i = 0; i < x->nrefs; i++)
        if (non_persistent(x, x->refs[i].name)) {
            put(h, left->n ? "," : ",\"left_out\":\"");
            put_json(h, x->refs[i].name);
            put(left, "%s%s", left->n ? ", " : "", x->refs[i].name);
        }
    put(h, "%s}", left->n ? "\"" : "");
}

/* one tensor of the safetensors file: an initializer (x->refs[ref]) under its name or a tied alias */
typedef struct {
    size_t ref;
    const char *name;
    size_t len;               /* bytes */
} StEntry;

/* the index in x->refs of the initializer named name, or x->nrefs */
static size_t find_ref(const Export *x, const char *name)
{
    InitRef key = {.name = name};
    const InitRef *r = bsearch(&key, x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
    return r ? (size_t)(r - x->refs) : x->nrefs;
}

/* e[] gets the file's tensors: every float initializer that is no non-persistent buffer, in name order, then
 * each tied alias the metadata names (TIED_KEY + ALIAS = an initializer among them) with its initializer's
 * data; returns their count, or -1 (x->err says why).  e has room for nrefs + n_metadata_props entries. */
static long select_st(Export *x, StEntry *e)
{
    size_t n = 0;
    for (size_t i = 0; i < x->nrefs; i++) { /* refs are in name order */
        const InitRef *r = &x->refs[i];
        const Onnx__TensorProto *t = r->t;
        if (!t->has_data_type || (t->data_type != ONNX_FLOAT && t->data_type != ONNX_DOUBLE))
            continue; /* an integer or boolean constant of the model: no state */
        if (non_persistent(x, r->name))
            continue; /* no state_dict entry */
        const uint8_t *p;
        size_t len;
        void *owned;
        int64_t numel = numel_of(t);
        int rc = data_of(x, r, &p, &len, &owned);
        free(owned);
        if (rc != 0)
            return -1;
        if (numel < 0 || len != (size_t)numel * (t->data_type == ONNX_FLOAT ? 4 : 8))
            return xfail(x, "initializer '%s' has %zu bytes of data, which do not match its shape", r->name, len);
        e[n++] = (StEntry){i, r->name, len};
    }
    size_t kept = n, k = strlen(TIED_KEY);
    for (size_t m = 0; m < x->mp->n_metadata_props; m++) {
        const Onnx__StringStringEntryProto *kv = x->mp->metadata_props[m];
        if (!kv->key || strncmp(kv->key, TIED_KEY, k) || !kv->value)
            continue;
        size_t i = find_ref(x, kv->value);
        for (size_t j = 0; j < kept; j++)
            if (e[j].ref == i && find_ref(x, kv->key + k) == x->nrefs) { /* an alias that is no initializer */
                e[n++] = (StEntry){i, kv->key + k, e[j].len};
                break;
            }
    }
    return (long)n;
}

/* rank 0, after patching: every float initializer but the non-persistent buffers, and the tied aliases, as a
 * safetensors file; the non-persistent buffers' names into *left */
static int write_st(Export *x, const char *path, Str *left)
{
    Str h = {0};
    size_t off = 0;
    x->path = path;
    x->flag = "--export-safetensors";
    StEntry *e = calloc(x->nrefs + x->mp->n_metadata_props + 1, sizeof *e);
    if (!e)
        return xfail(x, "out of memory");
    long n = select_st(x, e);
    put_metadata(x, &h, left);
    for (long i = 0; i < n; i++) {
        const Onnx__TensorProto *t = x->refs[e[i].ref].t;
        put(&h, ",\"");
        put_json(&h, e[i].name);
        put(&h, "\":{\"dtype\":\"%s\",\"shape\":[", t->data_type == ONNX_FLOAT ? "F32" : "F64");
        for (size_t d = 0; d < t->n_dims; d++)
            put(&h, "%s%lld", d ? "," : "", (long long)t->dims[d]);
        put(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + e[i].len);
        off += e[i].len;
    }
    put(&h, "}");
    while (!h.oom && h.n % 8)
        put(&h, " ");
    RtAFile f;
    if (n < 0 || (h.oom ? xfail(x, "out of memory writing the safetensors header") : open_tmp(x, path, &f))) {
        free(e);
        free(h.b);
        return -1;
    }
    uint8_t len8[8];
    for (int k = 0; k < 8; k++)
        len8[k] = (uint8_t)((uint64_t)h.n >> (8 * k));
    int rc = rt_write_all(f.fd, len8, 8) != 0 || rt_write_all(f.fd, h.b, h.n) != 0 ? -1 : 0;
    for (long i = 0; i < n && rc == 0; i++) {
        const uint8_t *p;
        size_t len;
        void *owned;
        if (data_of(x, &x->refs[e[i].ref], &p, &len, &owned) != 0) {
            free(owned);
            rt_afile_abort(&f);
            free(e);
            free(h.b);
            return -1;
        }
        rc = rt_write_all(f.fd, p, len);
        free(owned);
    }
    free(e);
    free(h.b);
    return commit_tmp(x, &f, path, rc);
}

/* write_st, and a line naming the buffers it left out (unless quiet) */
static int write_safetensors(Export *x, const char *path, int quiet)
{
    Str left = {0};
    int rc = write_st(x, path, &left);
    if (rc == 0 && left.n && !left.oom && !quiet)
        printf("%s: --export-safetensors %s: left out the non-persistent buffers (no state_dict entry, the "
               "export's metadata): %s\n", rt_prog, path, left.b);
    free(left.b);
    return rc;
}

/* t's data in the export's external file, at off */
static void make_external(Export *x, Onnx__TensorProto *t, const char *location, uint64_t off, uint64_t len)
{
    Patch *pt = add_patch(x, t);
    snprintf(pt->num[0], sizeof pt->num[0], "%llu", (unsigned long long)off);
    snprintf(pt->num[1], sizeof pt->num[1], "%llu", (unsigned long long)len);
    const char *key[3] = {"location", "offset", "length"}, *val[3] = {location, pt->num[0], pt->num[1]};
    for (int k = 0; k < 3; k++) {
        onnx__string_string_entry_proto__init(&pt->kv[k]);
        pt->kv[k].key = (char *)key[k];
        pt->kv[k].value = (char *)val[k];
        pt->kvp[k] = &pt->kv[k];
    }
    point_at(t, NULL, 0);
    t->has_raw_data = 0;
    t->data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    t->n_external_data = 3;
    t->external_data = pt->kvp;
}

/* FILE.data beside the export, written atomically: the initializers of 1 KiB or more that were external (copied
 * from OUT.init unless trained) or are patched (smaller ones inline); each tensor then points at its bytes */
static int write_external(Export *x, const char *onnx_path)
{
    const char *slash = strrchr(onnx_path, '/');
    size_t pl = strlen(onnx_path);
    char *path = x->data_path = malloc(pl + 6); /* kept until packed: location points into it */
    if (!path)
        return xfail(x, "out of memory");
    snprintf(path, pl + 6, "%s.data", onnx_path);
    const char *location = path + (slash ? (size_t)(slash - onnx_path) + 1 : 0); /* a bare file name */
    RtAFile f;
    if (open_tmp(x, path, &f) != 0)
        return -1;
    Onnx__GraphProto *g = x->mp->graph;
    InitRef **by_index = calloc(x->nrefs + 1, sizeof *by_index);
    uint64_t off = 0;
    int rc = by_index ? 0 : -1;
    for (size_t i = 0; by_index && i < x->nrefs; i++)
        by_index[x->refs[i].index] = &x->refs[i];
    for (size_t i = 0; rc == 0 && i < g->n_initializer; i++) { /* in the model's order */
        const InitRef *r = by_index[i];
        Onnx__TensorProto *t = r->t;
        int trained = patched(x, t);
        if (!r->external && !(trained && t->has_raw_data && t->raw_data.len >= 1024))
            continue;
        const uint8_t *p;
        size_t len;
        void *owned;
        static const uint8_t zero[64];
        uint64_t pad = (64 - off % 64) % 64;
        if (data_of(x, r, &p, &len, &owned) != 0) {
            free(owned);
            rc = 1;
            break;
        }
        if (len < 1024) { /* small: inline, as onnx.save's default threshold (onnxruntime's shape
                           * inference must read such tensors, e.g. a Reshape's shape, inline) */
            if (owned) { /* an untrained external one, read from OUT.init; the trained are inline already */
                Patch *pt = add_patch(x, t);
                pt->conv = owned;
                point_at(t, owned, len);
            }
            continue;
        }
        rc = rt_write_all(f.fd, zero, (size_t)pad) != 0 || rt_write_all(f.fd, p, len) != 0 ? -1 : 0;
        free(owned);
        off += pad;
        make_external(x, t, location, off, len);
        off += len;
    }
    free(by_index);
    if (rc > 0) { /* x->err says why */
        rt_afile_abort(&f);
        return -1;
    }
    if (rc < 0 && !by_index)
        errno = ENOMEM;
    x->path = path;
    rc = commit_tmp(x, &f, path, rc);
    x->path = onnx_path;
    if (rc != 0) { /* the message names the data file: keep it */
        char e[sizeof x->err];
        snprintf(e, sizeof e, "%s", x->err);
        xfail(x, "%s (the external data file of the export)", e);
    }
    return rc;
}

static int finish(Export *x, RtCtx *c, const char *onnx_path, const char *st_path, int quiet)
{
    if (patch_params(x, c) != 0 || patch_state(x, c) != 0)
        return -1;
    if (st_path && write_safetensors(x, st_path, quiet) != 0)
        return -1;
    if (!onnx_path)
        return 0;
    x->path = onnx_path;
    x->flag = "--export-onnx";
    if ((x->had_external || onnx__model_proto__get_packed_size(x->mp) > ((size_t)1 << 30)) &&
        write_external(x, onnx_path) != 0)
        return -1;
    size_t len = onnx__model_proto__get_packed_size(x->mp);
    x->out = malloc(len ? len : 1);
    if (!x->out)
        return xfail(x, "out of memory packing the ONNX model (%zu bytes)", len);
    size_t got = onnx__model_proto__pack(x->mp, x->out);
    if (got != len)
        return xfail(x, "internal error: packed %zu bytes, expected %zu", got, len);
    return write_atomic(x, x->out, len);
}

static void cleanup(Export *x, const RtModel *m)
{
    for (int i = x->npatch - 1; i >= 0; i--) {
        *x->patch[i].t = x->patch[i].saved;
        free(x->patch[i].conv);
    }
    if (x->mp)
        onnx__model_proto__free_unpacked(x->mp, NULL);
    if (x->full)
        for (int u = 0; u < m->nunit; u++)
            free(x->full[u]);
    free(x->full);
    free(x->patch);
    free(x->refs);
    free(x->model);
    free(x->out);
    free(x->data_path);
}

int rt_export(RtCtx *c, const char *onnx_path, const char *st_path, int init_fd, const char *init_path, int quiet)
{
    const RtModel *m = c->m;
    Export x;
    memset(&x, 0, sizeof x);
    x.path = onnx_path ? onnx_path : st_path;
    x.flag = onnx_path ? "--export-onnx" : "--export-safetensors";
    x.init_fd = init_fd;
    x.init_path = init_path;
    x.m = m;
    int ok = 1;
    if (c->rank == 0)
        ok = prepare(&x, c, init_fd, init_path) == 0;
    rt_ctl_bcast(&ok, sizeof ok, 0);
    if (ok) {
        for (int u = 0; u < m->nunit; u++) {
            char *param = c->shard[u * RT_NSTATE + RT_S_PARAM];
            int64_t bytes = c->shard_len[u] * rt_elem_size(m->unit[u].dtype);
            rt_dev_download(c, param, bytes);
            rt_ctl_gather(param, bytes, c->rank == 0 ? x.full[u] : NULL, 0);
        }
        if (c->rank == 0)
            ok = finish(&x, c, onnx_path, st_path, quiet) == 0;
    }
    if (c->rank == 0 && !ok) {
        fprintf(stderr, "%s: error: %s %s: %s\n", rt_prog, x.flag, x.path, x.err);
        fflush(stderr);
    }
    cleanup(&x, m);
    rt_ctl_bcast(&ok, sizeof ok, 0);
    return ok ? 0 : 1;
}
