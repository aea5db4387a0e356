/* init.c — OUT.init, the step-0 checkpoint: laid out first (offsets only),
 * then written in one pass that sums what it writes (runtime/isum.h): each
 * section — the model bytes, each constant, each unit's parameters, each
 * kept external initializer — gets its own checksum, kept in a table at the
 * file's end (its own checksum in the header), which the executable checks
 * as it reads.  The file's id, in its header (written last, with the
 * header's own checksum) and in the executable, is the graph's structure:
 * a hash of the step's text, the units' sizes and the file's, never of a
 * weight's value, so an init file written for other weights of the same
 * model (fsdpc --init-only) is one the executable takes.
 * A weight still in its external data file is copied from there IR_CHUNK
 * bytes at a time, so the compiler never holds more of the weights than one
 * chunk, and never reads the file back.  How the file replaces the old one:
 * exe.c ("installing the pair").
 */
#define _POSIX_C_SOURCE 200809L
#include "build.h"
#include "rt.h"
#include "isum.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>


static int64_t al(int64_t x) { return (x + 63) / 64 * 64; }

static int stored_const(const Graph *g, int v)
{
    const Value *x = &g->val[v];
    return x->role == R_CONST && x->alias_of < 0 && x->loc.kind == LOC_ARENA;
}

uint64_t cg_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

static int64_t value_bytes(const Graph *g, int v) { return value_numel(g, v) * (int64_t)dtype_size(g->val[v].dtype); }

/* the offset after n bytes at off, aligned; sizes come from the model, so the sum is checked */
static int64_t after_bytes(const Graph *g, int64_t off, int64_t n)
{
    if (n < 0 || n > (INT64_MAX >> 2) - off)
        fatal("%s: the init file would hold more than 2^61 bytes", g->opt->model);
    return al(off + n);
}

InitLayout cg_init_layout(const Graph *g)
{
    InitLayout L = {0};
    L.const_off = ir_alloc(sizeof(int64_t) * (size_t)g->nval);
    L.unit_off = ir_alloc(sizeof(int64_t) * (size_t)(g->nunit + 1));
    L.model_off = RT_INIT_HEADER;
    int64_t off = after_bytes(g, L.model_off, (int64_t)g->model_len);
    int nconst = 0;
    for (int v = 0; v < g->nval; v++) {
        L.const_off[v] = -1;
        if (!stored_const(g, v))
            continue;
        L.const_off[v] = off;
        nconst++;
        off = after_bytes(g, off, value_bytes(g, v));
    }
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        L.unit_off[u] = off;
        off = after_bytes(g, off, un->numel > (INT64_MAX >> 4) ? -1 : un->numel * (int64_t)dtype_size(un->dtype));
    }
    /* the untrained initializers the model keeps in external data files: an export writes them beside itself */
    L.ext_off = ir_alloc(sizeof(int64_t) * (size_t)(g->ninit + 1));
    L.ext_val = ir_alloc(sizeof(int) * (size_t)(g->ninit + 1));
    char *trained = ir_alloc((size_t)g->ninit + 1);
    for (int u = 0; u < g->nunit; u++)
        for (int i = 0; i < g->unit[u].nparams; i++) {
            int k = g->val[g->unit[u].params[i]].init_index;
            if (k >= 0 && k < g->ninit)
                trained[k] = 1;
        }
    for (int i = 0; i < g->ninit; i++)
        L.ext_val[i] = -1;
    for (int v = g->nval - 1; v >= 0; v--) /* the frontend's value of each initializer: the first */
        if (g->val[v].init_index >= 0 && g->val[v].init_index < g->ninit)
            L.ext_val[g->val[v].init_index] = v;
    for (int i = 0; i < g->ninit; i++) {
        L.ext_off[i] = -1;
        if (!g->ext[i].loc || trained[i] || L.ext_val[i] < 0)
            continue;
        L.ext_off[i] = off;
        L.next++;
        off = after_bytes(g, off, g->ext[i].len);
    }
    L.nsum = 1 + nconst + g->nunit + L.next;
    L.sum_off = off;
    after_bytes(g, off, (int64_t)sizeof(uint64_t) * L.nsum); /* checked; the table ends the file, unpadded */
    L.size = off + (int64_t)sizeof(uint64_t) * L.nsum;
    L.sum = ir_alloc(sizeof(uint64_t) * (size_t)L.nsum);
    return L;
}

#define SINK_BUF ((size_t)1 << 20) /* bytes gathered before a write(2) */

/* where the init file's bytes go (b NULL: nowhere, only summed) */
typedef struct {
    Build *b;             /* the build writing OUT.init: b->init.fd */
    unsigned char *buf;   /* bytes not yet written, nbuf of SINK_BUF */
    size_t nbuf;
    int64_t at;           /* bytes so far */
    uint64_t sum;         /* the open section's checksum so far */
    unsigned char part[8]; /* its last word, while incomplete (npart = at % 8 bytes) */
    int npart;
} Sink;

static _Noreturn void sink_fail(Sink *s, const char *msg)
{
    if (s->b)
        cg_build_fail(s->b, msg);
    fatal("%s", msg);
}

static void sink_flush(Sink *s)
{
    if (s->nbuf && rt_write_all(s->b->init.fd, s->buf, s->nbuf) != 0)
        sink_fail(s, ir_fmt("%s.init: write failed: %s", s->b->out, strerror(errno)));
    s->nbuf = 0;
}

/* n bytes at the end of the file, not summed */
static void sink_write(Sink *s, const void *p, size_t n)
{
    s->at += (int64_t)n;
    if (!s->b || !n)
        return;
    if (s->nbuf + n > SINK_BUF)
        sink_flush(s);
    if (n >= SINK_BUF) {
        if (rt_write_all(s->b->init.fd, p, n) != 0)
            sink_fail(s, ir_fmt("%s.init: write failed: %s", s->b->out, strerror(errno)));
        return;
    }
    memcpy(s->buf + s->nbuf, p, n);
    s->nbuf += n;
}

/* n bytes at file offset s->at added to the open section's checksum: whole words, the rest kept in s->part */
static void sink_sum(Sink *s, const unsigned char *p, size_t n)
{
    uint64_t at = (uint64_t)s->at;
    if (s->npart != (int)(at % 8))
        die("init file: a section starts off a word");
    if (s->npart) {
        size_t k = n < (size_t)(8 - s->npart) ? n : (size_t)(8 - s->npart);
        memcpy(s->part + s->npart, p, k);
        s->npart += (int)k, p += k, n -= k, at += k;
        if (s->npart < 8)
            return;
        s->sum += rt_isum(s->part, 1, at / 8 - 1);
        s->npart = 0;
    }
    s->sum += rt_isum(p, n / 8, at / 8);
    s->npart = (int)(n % 8);
    memcpy(s->part, p + n / 8 * 8, n % 8);
}

/* bytes of the open section (the callback of ir_ext_stream) */
static void sink_put(void *ctx, const void *p, size_t n)
{
    Sink *s = ctx;
    sink_sum(s, p, n);
    sink_write(s, p, n);
}

/* the open section's checksum (its last word zero-padded, as the file is); the next one opens */
static uint64_t sink_end(Sink *s)
{
    if (s->npart) {
        memset(s->part + s->npart, 0, (size_t)(8 - s->npart));
        s->sum += rt_isum(s->part, 1, (uint64_t)s->at / 8);
        s->npart = 0;
    }
    uint64_t sum = s->sum;
    s->sum = 0;
    return sum;
}

static void sink_pad(Sink *s, int64_t off)
{
    static const char zero[64];
    if (s->at > off || off - s->at > 64)
        die("init file layout");
    sink_write(s, zero, (size_t)(off - s->at));
}

/* value v's n bytes: its host data, or its initializer's external data file streamed */
static void sink_value(Sink *s, const Graph *g, int v, int64_t n)
{
    const Value *x = &g->val[v];
    if (x->data) {
        sink_put(s, x->data, (size_t)n);
        return;
    }
    if (x->init_index < 0 || x->init_index >= g->ninit || !g->ext[x->init_index].loc ||
        g->ext[x->init_index].len != n)
        die("value %d has no bytes to write", v);
    int64_t end = s->at + n;
    const char *err = ir_ext_stream(&g->ext[x->init_index], sink_put, s);
    if (err)
        sink_fail(s, ir_fmt("%s: %s", g->opt->model, err));
    if (s->at != end)
        die("external data of value %d: %lld bytes streamed, %lld expected", v, (long long)(s->at - end + n),
            (long long)n);
}

static void put_le64(unsigned char *p, uint64_t x)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(x >> (8 * i));
}

/* the sections, each summed into L->sum (the order of the table at the file's end) */
static void sink_sections(Sink *s, const Graph *g, InitLayout *L)
{
    int k = 0;
    sink_pad(s, L->model_off);
    sink_put(s, g->model_bytes, g->model_len);
    L->sum[k++] = sink_end(s);
    for (int v = 0; v < g->nval; v++)
        if (L->const_off[v] >= 0) {
            sink_pad(s, L->const_off[v]);
            sink_value(s, g, v, value_bytes(g, v));
            L->sum[k++] = sink_end(s);
        }
    for (int u = 0; u < g->nunit; u++) {
        const Unit *un = &g->unit[u];
        sink_pad(s, L->unit_off[u]);
        for (int i = 0; i < un->nparams; i++) /* the host bytes: the unit's dtype (bf16 params keep f32 masters) */
            sink_value(s, g, un->params[i], value_numel(g, un->params[i]) * (int64_t)dtype_size(un->dtype));
        L->sum[k++] = sink_end(s);
    }
    for (int i = 0; i < g->ninit; i++)
        if (L->ext_off[i] >= 0) {
            sink_pad(s, L->ext_off[i]);
            sink_value(s, g, L->ext_val[i], g->ext[i].len);
            L->sum[k++] = sink_end(s);
        }
    if (k != L->nsum)
        die("init file layout: %d sections, %d laid out", k, L->nsum);
    sink_pad(s, L->sum_off);
}

uint64_t cg_init_id(const Graph *g, const InitLayout *L, const char *step, size_t len)
{
    uint64_t id = cg_fnv(14695981039346656037ull, &L->size, sizeof L->size);
    id = cg_fnv(id, &L->nsum, sizeof L->nsum);
    for (int u = 0; u < g->nunit; u++)
        id = cg_fnv(id, &g->unit[u].numel, sizeof g->unit[u].numel);
    return cg_fnv(id, step, len);
}

void cg_write_init(const Graph *g, InitLayout *L, uint64_t id, Build *b)
{
    Sink s = {.b = b};
    if (b) {
        if (rt_afile_openat(&b->init, b->dirfd, ir_fmt("%s.init", b->base), 0644) != 0) /* OUT's folder, once opened */
            cg_build_fail(b, ir_fmt("%s.init: cannot create: %s", b->out, strerror(errno)));
        s.buf = ir_alloc(SINK_BUF);
    }
    unsigned char hdr[RT_INIT_HEADER] = {0};
    memcpy(hdr, RT_INIT_MAGIC, 16);
    put_le64(hdr + 16, id);
    put_le64(hdr + 24, (uint64_t)L->size); /* the table's checksum, at 40, and the header's, at 32, once known */
    sink_write(&s, hdr, sizeof hdr);
    sink_sections(&s, g, L);
    unsigned char *table = ir_alloc(sizeof(uint64_t) * (size_t)L->nsum);
    for (int k = 0; k < L->nsum; k++)
        put_le64(table + 8 * k, L->sum[k]);
    sink_write(&s, table, sizeof(uint64_t) * (size_t)L->nsum);
    if (s.at != L->size)
        die("init file layout: %lld bytes written, %lld laid out", (long long)s.at, (long long)L->size);
    if (!b)
        return;
    sink_flush(&s);
    put_le64(hdr + 40, rt_isum(table, (size_t)L->nsum, (uint64_t)L->sum_off / 8));
    put_le64(hdr + 32, rt_isum(hdr, RT_INIT_HEADER / 8, 0));
    if (pwrite(b->init.fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        cg_build_fail(b, ir_fmt("%s.init: write failed: %s", b->out, strerror(errno ? errno : EIO)));
}
