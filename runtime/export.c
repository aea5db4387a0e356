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
 * atomically:
 * FILE.tmp.<pid>, fsync, rename to FILE, fsync of the directory.  The
 * safetensors file is the patched initializers in name order: an 8-byte
 * little-endian header length, the JSON header (dtype, shape, data_offsets;
 * names JSON-escaped; padded with spaces to 8 bytes), then the data.
 *
 * protobuf-c ownership: the unpacked message owns every array and string it
 * points to.  Each modified TensorProto is saved by value before it is
 * pointed at our buffers and restored after packing, so that
 * onnx__model_proto__free_unpacked frees exactly what it allocated.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

/* ONNX TensorProto.DataType */
enum { ONNX_FLOAT = 1, ONNX_DOUBLE = 11 };

typedef struct {
    const char *name;
    Onnx__TensorProto *t;
} InitRef;

typedef struct {
    Onnx__TensorProto *t;
    Onnx__TensorProto saved;  /* the unpacked state, restored before free */
    void *conv;               /* owned conversion buffer (dtype differs), or NULL */
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
    Patch *patch;
    int npatch;
    uint8_t *out;
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
    x->nrefs = g->n_initializer;
    x->refs = calloc(x->nrefs ? x->nrefs : 1, sizeof *x->refs);
    if (!x->refs)
        return xfail(x, "out of memory");
    for (size_t i = 0; i < x->nrefs; i++) {
        x->refs[i].t = g->initializer[i];
        x->refs[i].name = g->initializer[i]->name ? g->initializer[i]->name : "";
    }
    qsort(x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
    x->full = calloc(m->nunit ? (size_t)m->nunit : 1, sizeof *x->full);
    x->patch = calloc((size_t)m->nparam + (size_t)m->nconst + 1, sizeof *x->patch);
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

/* rank 0: point every parameter's initializer at its trained values */
static int patch_params(Export *x, RtCtx *c)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        const char *pname = p->name ? p->name : "";
        InitRef key = {pname, NULL};
        InitRef *r = bsearch(&key, x->refs, x->nrefs, sizeof *x->refs, cmp_ref);
        if (!r)
            return xfail(x, "parameter '%s' is not an initializer of the embedded ONNX model", pname);
        Onnx__TensorProto *t = r->t;
        for (int j = 0; j < x->npatch; j++)
            if (x->patch[j].t == t)
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
        Patch *pt = &x->patch[x->npatch++];
        pt->t = t;
        pt->saved = *t;
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
        InitRef key = {k->name, NULL};
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
        for (int j = 0; j < x->npatch; j++)
            if (x->patch[j].t == t)
                return xfail(x, "initializer '%s' is written twice", k->name);
        Patch *pt = &x->patch[x->npatch++];
        pt->t = t;
        pt->saved = *t;
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

static int fsync_dir_of(const char *path)
{
    char *dir = dir_of(path);
    if (!dir) {
        errno = ENOMEM;
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static int write_atomic(Export *x, const uint8_t *buf, size_t len)
{
    size_t tl = strlen(x->path) + 32;
    char *tmp = malloc(tl);
    if (!tmp)
        return xfail(x, "out of memory");
    snprintf(tmp, tl, "%s.tmp.%ld", x->path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        xfail(x, "cannot create %s: %s", tmp, strerror(e));
        free(tmp);
        return -1;
    }
    const char *stage = "writing";
    if (rt_write_all(fd, buf, len) != 0 || (stage = "syncing", fsync(fd) != 0)) {
        int e = errno;
        close(fd);
        unlink(tmp);
        xfail(x, "%s %s: %s", stage, tmp, strerror(e));
        free(tmp);
        return -1;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        xfail(x, "closing %s: %s", tmp, strerror(e));
        free(tmp);
        return -1;
    }
    if (rename(tmp, x->path) != 0) {
        int e = errno;
        unlink(tmp);
        xfail(x, "cannot rename %s to %s: %s", tmp, x->path, strerror(e));
        free(tmp);
        return -1;
    }
    free(tmp);
    if (fsync_dir_of(x->path) != 0)
        return xfail(x, "syncing the directory of %s: %s", x->path, strerror(errno));
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

/* rank 0, after patching: the patched initializers as a safetensors file */
static int write_safetensors(Export *x, const char *path)
{
    Str h = {0};
    size_t off = 0;
    put(&h, "{\"__metadata__\":{\"format\":\"pt\",\"producer\":\"fsdpc\"}");
    for (size_t i = 0; i < x->nrefs; i++) { /* refs are in name order */
        const Onnx__TensorProto *t = x->refs[i].t;
        int j = 0;
        while (j < x->npatch && x->patch[j].t != t)
            j++;
        if (j == x->npatch)
            continue; /* not trained and not written back: a constant of the model */
        put(&h, ",\"");
        for (const unsigned char *p = (const unsigned char *)x->refs[i].name; *p; p++)
            if (*p == '"' || *p == '\\')
                put(&h, "\\%c", *p);
            else if (*p < 0x20 || *p == 0x7f)
                put(&h, "\\u%04x", *p);
            else
                put(&h, "%c", *p);
        put(&h, "\":{\"dtype\":\"%s\",\"shape\":[", t->data_type == ONNX_FLOAT ? "F32" : "F64");
        for (size_t d = 0; d < t->n_dims; d++)
            put(&h, "%s%lld", d ? "," : "", (long long)t->dims[d]);
        put(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->raw_data.len);
        off += t->raw_data.len;
    }
    put(&h, "}");
    while (!h.oom && h.n % 8)
        put(&h, " ");
    size_t total = 8 + h.n + off;
    uint8_t *buf = h.oom ? NULL : malloc(total);
    if (!buf) {
        free(h.b);
        return xfail(x, "out of memory writing the safetensors file (%zu bytes)", total);
    }
    for (int k = 0; k < 8; k++)
        buf[k] = (uint8_t)((uint64_t)h.n >> (8 * k));
    memcpy(buf + 8, h.b, h.n);
    size_t at = 8 + h.n;
    for (size_t i = 0; i < x->nrefs; i++)
        for (int j = 0; j < x->npatch; j++)
            if (x->patch[j].t == x->refs[i].t) {
                memcpy(buf + at, x->refs[i].t->raw_data.data, x->refs[i].t->raw_data.len);
                at += x->refs[i].t->raw_data.len;
            }
    x->path = path;
    x->flag = "--export-safetensors";
    int rc = write_atomic(x, buf, total);
    free(buf);
    free(h.b);
    return rc;
}

static int finish(Export *x, RtCtx *c, const char *onnx_path, const char *st_path)
{
    if (patch_params(x, c) != 0 || patch_state(x, c) != 0)
        return -1;
    if (st_path && write_safetensors(x, st_path) != 0)
        return -1;
    if (!onnx_path)
        return 0;
    x->path = onnx_path;
    x->flag = "--export-onnx";
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
}

int rt_export(RtCtx *c, const char *onnx_path, const char *st_path, int init_fd, const char *init_path)
{
    const RtModel *m = c->m;
    Export x;
    memset(&x, 0, sizeof x);
    x.path = onnx_path ? onnx_path : st_path;
    x.flag = onnx_path ? "--export-onnx" : "--export-safetensors";
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
            ok = finish(&x, c, onnx_path, st_path) == 0;
    }
    if (c->rank == 0 && !ok) {
        fprintf(stderr, "%s: error: %s %s: %s\n", rt_prog, x.flag, x.path, x.err);
        fflush(stderr);
    }
    cleanup(&x, m);
    rt_ctl_bcast(&ok, sizeof ok, 0);
    return ok ? 0 : 1;
}
