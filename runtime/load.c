/* load.c — what a rank reads at start-up from the init file: open and
 * validate it, carve the one allocation, load the constants and this rank's
 * own parameter shards, each checked against fsdpc's checksums, and hand it
 * to the device layer.  (The training data: data.c.)
 * Errors go through rt_err_set; err.c agrees on them across ranks.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "isum.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

#define ALIGN 64

/* ---------------------------------------------------------------- init file
 *
 * Checked as it is read (runtime/isum.h's checksums; the compiler's sums of
 * the sections are a table that ends the file, checked against the header's
 * sum of it).  Every rank checks the header (its own checksum, then the id:
 * an init file of this build's structure, whatever its weights' values:
 * fsdpc --init-only writes one for other weights), the table and the
 * constants, which it reads whole.
 * A unit's parameters are read in shards, a rank only its own (deferred
 * init): its share of the unit's checksum is the words that start in its
 * shard, the last one completed from the file (up to 7 bytes past the
 * shard, never more), and one all-reduce adds the shares of every rank.  The
 * ranks of a shard group read each word of the unit once, so the total is
 * the unit's checksum times the number of shard groups (world / F; the
 * first group counted twice where that is even, so that the multiplier is
 * odd and the same bad word in every copy cannot cancel out): a bad word in
 * any rank's copy of the file changes it.  Rank 0 reads the model
 * bytes and the untrained external initializers only to export them (or,
 * the model, for --dump-grads), so it checks those sections at start-up of
 * a run that will: a run never starts from, or ends by exporting, bytes
 * other than the compiler's.
 *
 * Where OUT.init is another build's, the executable looks for its own init
 * file under the name that holds its id, .OUT.init.<id>: fsdpc moves a new
 * init file there before it replaces OUT, and over OUT.init after
 * (codegen/exe.c), so the executable in place always finds its weights. */

#define SUM_CHUNK ((uint64_t)1 << 20) /* bytes read, then summed while still in the cache */

static uint64_t le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

/* The checksum share of file bytes [off, off+n), which buf holds: the words that start among them, the last one
 * completed from the file (fd) where the range ends inside it.  0, or -1 with errno. */
static int range_sum(int fd, const unsigned char *buf, uint64_t off, uint64_t n, uint64_t *sum)
{
    uint64_t first = (off + 7) / 8, end = off + n; /* the first word that starts in the range */
    if (first * 8 >= end)
        return 0;
    uint64_t whole = (end - first * 8) / 8, at = (first + whole) * 8;
    *sum += rt_isum(buf + (first * 8 - off), whole, first);
    if (at == end)
        return 0;
    unsigned char w[8];
    memcpy(w, buf + (at - off), (size_t)(end - at));
    if (rt_pread_all(fd, w + (end - at), 8 - (end - at), end) != 0)
        return -1;
    *sum += rt_isum(w, 1, at / 8);
    return 0;
}

/* n bytes at file offset off into dst, their checksum share added to *sum (range_sum), read in chunks that end
 * on a word (each summed while in the cache).  0, or -1 with errno. */
static int pread_summed(int fd, void *dst, uint64_t n, uint64_t off, uint64_t *sum)
{
    unsigned char *p = dst;
    while (n > 0) {
        uint64_t k = n > SUM_CHUNK ? ((off + SUM_CHUNK) & ~(uint64_t)7) - off : n;
        if (rt_pread_all(fd, p, k, off) != 0 || range_sum(fd, p, off, k, sum) != 0)
            return -1;
        p += k, off += k, n -= k;
    }
    return 0;
}

/* the one line on a section whose bytes are not the compiler's */
static void corrupt(const char *path, const char *what)
{
    rt_err_set(1, "init file %s is corrupt: checksum mismatch in %s (not the bytes fsdpc wrote: a damaged copy or "
                  "disk?); copy it again or compile the model again with fsdpc", path, what);
}

/* file bytes [off, off+n) checked against sum, through a buffer (sections this rank does not keep) */
static int check_section(int fd, const char *path, uint64_t off, uint64_t n, uint64_t want, const char *what)
{
    unsigned char *buf = malloc(n < SUM_CHUNK ? n + 1 : SUM_CHUNK);
    uint64_t sum = 0;
    int rc = buf ? 0 : (errno = ENOMEM, -1);
    for (uint64_t k; rc == 0 && n > 0; off += k, n -= k) {
        k = n > SUM_CHUNK ? ((off + SUM_CHUNK) & ~(uint64_t)7) - off : n;
        rc = rt_pread_all(fd, buf, k, off) != 0 || range_sum(fd, buf, off, k, &sum) != 0 ? -1 : 0;
    }
    int e = errno;
    free(buf);
    if (rc != 0)
        rt_err_set(1, "reading init file %s: %s", path, strerror(e));
    else if (sum != want)
        corrupt(path, what);
    return rc == 0 && sum == want ? 0 : -1;
}

/* OUT.init beside the executable (from /proc/self/exe, else argv0); malloc'd */
static char *default_init_path(const char *argv0)
{
    char exe[PATH_MAX + 1];
    ssize_t n = readlink("/proc/self/exe", exe, PATH_MAX);
    const char *base = argv0;
    if (n > 0) {
        exe[n] = 0;
        base = exe;
    }
    size_t l = strlen(base);
    char *p = malloc(l + 6);
    if (p) {
        memcpy(p, base, l);
        memcpy(p + l, ".init", 6);
    }
    return p;
}

/* a regular file of at least RT_INIT_HEADER bytes; its size into *size */
static int check_file(int fd, const char *path, uint64_t *size)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rt_err_set(1, "init file %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        rt_err_set(1, "init file %s is not a regular file", path);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    if (*size < RT_INIT_HEADER) {
        rt_err_set(1, "%s is not an fsdpc init file (too short)", path);
        return -1;
    }
    return 0;
}

/* magic, the header's checksum, build id and recorded size (the checksum of the table of sums into *tsum): 0, 1
 * for another build's file (nothing said), or -1 (rt_err_set called) */
static int check_header(int fd, const char *path, const RtModel *m, uint64_t size, uint64_t *tsum)
{
    unsigned char h[RT_INIT_HEADER];
    if (rt_pread_all(fd, h, RT_INIT_HEADER, 0) != 0) {
        rt_err_set(1, "reading init file %s: %s", path, strerror(errno));
        return -1;
    }
    if (memcmp(h, RT_INIT_MAGIC, 12) != 0) { /* "FSDPC-INIT-v" */
        rt_err_set(1, "%s is not an fsdpc init file (bad magic)", path);
        return -1;
    }
    if (memcmp(h, RT_INIT_MAGIC, 16) != 0) /* another version: another fsdpc's build */
        return 1;
    uint64_t hsum = le64(h + 32);
    memset(h + 32, 0, 8);
    if (rt_isum(h, RT_INIT_HEADER / 8, 0) != hsum) {
        corrupt(path, "its header");
        return -1;
    }
    if (le64(h + 16) != m->id)
        return 1;
    if (le64(h + 24) != size) {
        rt_err_set(1, "init file %s is truncated or corrupt (its header says %" PRIu64 " bytes, the file has %" PRIu64 ")",
                   path, le64(h + 24), size);
        return -1;
    }
    *tsum = le64(h + 40);
    return 0;
}

/* the number of the init file's sections: the model, each constant, each unit, each external initializer */
static uint64_t nsum_of(const RtModel *m)
{
    return 1 + (uint64_t)m->nconst + (uint64_t)m->nunit + (uint64_t)m->nextern;
}

/* the sections' checksums, the last 8 * nsum_of(m) bytes of the file, into *sums (malloc'd), checked against
 * tsum: 0, or -1 (rt_err_set called) */
static int read_sums(int fd, const char *path, const RtModel *m, uint64_t size, uint64_t tsum, uint64_t **sums)
{
    uint64_t nsum = nsum_of(m);
    if (size - RT_INIT_HEADER < 8 * nsum) {
        rt_err_set(1, "init file %s is corrupt: too short for its table of checksums", path);
        return -1;
    }
    unsigned char *t = malloc(8 * nsum);
    uint64_t *v = malloc(8 * nsum);
    int rc = -1;
    if (!t || !v)
        rt_err_set(1, "out of memory");
    else if (rt_pread_all(fd, t, 8 * nsum, size - 8 * nsum) != 0)
        rt_err_set(1, "reading init file %s: %s", path, strerror(errno));
    else if (rt_isum(t, nsum, (size - 8 * nsum) / 8) != tsum)
        corrupt(path, "its table of checksums");
    else {
        for (uint64_t i = 0; i < nsum; i++)
            v[i] = le64(t + 8 * i);
        rc = 0;
    }
    free(t);
    if (rc == 0)
        *sums = v;
    else
        free(v);
    return rc;
}

/* every range the tables point at must lie inside the file's first size bytes (before the table of checksums) */
static int check_ranges(const char *path, const RtModel *m, uint64_t size)
{
    for (int u = 0; u < m->nunit; u++) {
        uint64_t end = (uint64_t)m->unit[u].file_off + (uint64_t)m->unit[u].numel * (uint64_t)rt_elem_size(m->unit[u].dtype);
        if (end > size) {
            rt_err_set(1, "init file %s is corrupt: unit '%s' lies beyond its end", path, m->unit[u].name);
            return -1;
        }
    }
    for (int i = 0; i < m->nconst; i++)
        if ((uint64_t)m->cnst[i].file_off + (uint64_t)m->cnst[i].nbytes > size) {
            rt_err_set(1, "init file %s is corrupt: constant %d lies beyond its end", path, i);
            return -1;
        }
    for (int i = 0; i < m->nextern; i++)
        if (m->ext[i].file_off < 0 || m->ext[i].nbytes < 0 ||
            (uint64_t)m->ext[i].file_off + (uint64_t)m->ext[i].nbytes > size) {
            rt_err_set(1, "init file %s is corrupt: external initializer %d lies beyond its end", path, i);
            return -1;
        }
    if (m->model_len > 0 && (uint64_t)m->model_off + (uint64_t)m->model_len > size) {
        rt_err_set(1, "init file %s is corrupt: the embedded model lies beyond its end", path);
        return -1;
    }
    return 0;
}

/* open and validate the init file at path (its sections' checksums into *sums): the fd, or -1 (rt_err_set
 * called), or -2: it is another build's (nothing said) */
static int open_checked(const RtModel *m, const char *path, int is_default, uint64_t *size_out, uint64_t **sums)
{
    struct stat st;
    int fd = rt_open_regular(path, &st);
    if (fd < 0) {
        rt_err_set(1, "%s %s: %s%s", is_default ? "the init file" : "--init", path, rt_open_why(fd),
                   is_default ? " (it is written by fsdpc beside the executable; or pass --init FILE)" : "");
        return -1;
    }
    uint64_t size = 0, tsum = 0;
    int rc = check_file(fd, path, &size);
    if (rc == 0)
        rc = check_header(fd, path, m, size, &tsum);
    if (rc == 0)
        rc = read_sums(fd, path, m, size, tsum, sums);
    if (rc == 0 && (rc = check_ranges(path, m, size - 8 * nsum_of(m))) != 0) { /* the sections lie before the table */
        free(*sums);
        *sums = NULL;
    }
    if (rc != 0) {
        close(fd);
        return rc > 0 ? -2 : -1;
    }
    *size_out = size;
    return fd;
}

/* path's .BASE.<id> beside it (malloc'd): where fsdpc puts a new init file while it replaces the executable */
static char *id_path(const char *path, uint64_t id)
{
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash + 1 - path) : 0, n = strlen(path) + 20;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%.*s.%s.%016" PRIx64, (int)dl, path, path + dl, id);
    return p;
}

/* open and validate the init file *path; the default one, when another build's, may be found under its id's
 * name (then *path is that).  The fd, or -1 (rt_err_set called). */
static int open_init(const RtModel *m, char **path, int is_default, uint64_t *size_out, uint64_t **sums)
{
    int fd = open_checked(m, *path, is_default, size_out, sums);
    if (fd != -2)
        return fd;
    char *alt = is_default ? id_path(*path, m->id) : NULL;
    struct stat st;
    if (alt && lstat(alt, &st) == 0) {
        fd = open_checked(m, alt, 1, size_out, sums);
        if (fd >= 0) {
            free(*path);
            *path = alt;
            return fd;
        }
    }
    free(alt);
    if (fd == -2)
        rt_err_set(1, "init file %s belongs to another build of the model; rebuild with fsdpc or pass --init", *path);
    return -1;
}

/* ------------------------------------------------------------------- layout */

static uint64_t round64(uint64_t x) { return (x + (ALIGN - 1)) & ~(uint64_t)(ALIGN - 1); }

/* add with overflow detection into *acc; returns -1 on overflow */
static int acc_add(uint64_t *acc, uint64_t x)
{
    return __builtin_add_overflow(*acc, x, acc) ? -1 : 0;
}

/* Is slot s allocated?  Not when every value in it is its unit's shard itself
 * (c->slot_alias). */
static int slot_needed(const RtCtx *c, int s)
{
    return (c->m->slot_alias[s] & ~c->slot_alias) != 0;
}

/* elements of slot s: its largest unit's shard group's gather (c->shard_len set) */
static int64_t slot_elems(const RtCtx *c, int s)
{
    return (int64_t)c->sf * c->shard_len[c->m->slot_unit[s]];
}

/* shard lengths into c, sizes into mem and the allocation's total into
 * mem->total; -1 on overflow */
static int plan_sizes(RtCtx *c, RtMem *mem)
{
    const RtModel *m = c->m;
    int W = c->sf;
    uint64_t shard_bytes = 0;
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        int64_t es = rt_elem_size(un->dtype);
        int64_t L = (un->numel + W - 1) / W; /* numel <= INT64_MAX/16: no overflow */
        c->shard_len[u] = L;
        uint64_t sb = (uint64_t)L * (uint64_t)es;
        mem->param += sb;
        mem->grad += sb;
        mem->optim += sb * (uint64_t)un->nstate;
        mem->model_state += (uint64_t)un->numel * (uint64_t)es * (uint64_t)(2 + un->nstate);
        uint64_t all;
        if (__builtin_mul_overflow(round64(sb), (uint64_t)(2 + un->nstate), &all) || acc_add(&shard_bytes, all))
            return -1;
        if (c->acc && acc_add(&mem->accum, round64(sb * (uint64_t)W)))
            return -1;
    }
    for (int s = 0; s < m->nslot; s++) {
        uint64_t sb;
        if (!slot_needed(c, s))
            continue;
        if (__builtin_mul_overflow((uint64_t)slot_elems(c, s), (uint64_t)m->slot_esize[s], &sb) ||
            acc_add(&mem->slots, round64(sb)))
            return -1;
    }
    uint64_t total = round64((uint64_t)m->arena_bytes);
    mem->arena = (uint64_t)m->arena_bytes;
    if (acc_add(&total, mem->slots) || acc_add(&total, shard_bytes) || acc_add(&total, mem->accum))
        return -1;
    if (total == 0)
        total = ALIGN;
    if (total > (uint64_t)SIZE_MAX || total > (uint64_t)INT64_MAX)
        return -1;
    mem->total = total;
    return 0;
}

/* arena, slots, then per unit its param, grad and optimizer shards; then
 * (--accum-mode local) per unit its summed flat gradient */
static void lay_out(RtCtx *c, char *base)
{
    const RtModel *m = c->m;
    char *p = base;
    c->arena = p;
    p += round64((uint64_t)m->arena_bytes);
    for (int s = 0; s < m->nslot; s++) {
        c->slot[s] = p;
        if (slot_needed(c, s))
            p += round64((uint64_t)slot_elems(c, s) * (uint64_t)m->slot_esize[s]);
    }
    for (int u = 0; u < m->nunit; u++) {
        uint64_t sb = round64((uint64_t)c->shard_len[u] * (uint64_t)rt_elem_size(m->unit[u].dtype));
        c->shard[u * RT_NSTATE + RT_S_PARAM] = p;
        p += sb;
        c->shard[u * RT_NSTATE + RT_S_GRAD] = p;
        p += sb;
        for (int k = 0; k < m->unit[u].nstate; k++) {
            c->shard[u * RT_NSTATE + RT_S_M + k] = p;
            p += sb;
        }
    }
    for (int u = 0; c->acc && u < m->nunit; u++) {
        c->acc[u] = p;
        p += round64((uint64_t)c->sf * (uint64_t)c->shard_len[u] * (uint64_t)rt_elem_size(m->unit[u].dtype));
    }
}

/* the tables of c (shard lengths, slot and shard pointers) and the sizes:
 * mem.  0, or -1 (rt_err_set called). */
static int plan(RtCtx *c, RtMem *mem, int local_accum)
{
    const RtModel *m = c->m;
    c->shard_len = calloc((size_t)m->nunit + 1, sizeof *c->shard_len);
    c->shard = calloc((size_t)m->nunit * RT_NSTATE + 1, sizeof *c->shard);
    c->slot = calloc((size_t)m->nslot + 1, sizeof *c->slot);
    if (local_accum && c->accum > 1 && !(c->acc = calloc((size_t)m->nunit + 1, sizeof *c->acc))) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    if (!c->shard_len || !c->shard || !c->slot) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    memset(mem, 0, sizeof *mem);
    /* a shard group of one rank: a gather would copy the shard whole into its slot, and a flat gradient be
     * copied whole into its shard after the reduction (with --accum 1: else the shard sums the micro-steps'
     * gradients): the values memplan marked are their shards instead */
    c->slot_alias = c->sf == 1 ? RT_SLOT_PARAM | (c->accum == 1 ? RT_SLOT_GRAD : 0) : 0;
    if (plan_sizes(c, mem) != 0) {
        rt_err_set(1, "the model does not fit the address space of one rank at %d ranks", c->world);
        return -1;
    }
    return 0;
}

/* the one allocation of the planned mem->total bytes, zeroed, carved into c */
static int carve(RtCtx *c, const RtMem *mem, char **base_out)
{
    char *base = aligned_alloc(ALIGN, (size_t)mem->total);
    if (!base) {
        rt_err_set(1, "cannot allocate %" PRIu64 " bytes for this rank (%d ranks): %s", mem->total, c->world,
                   strerror(ENOMEM));
        return -1;
    }
    memset(base, 0, (size_t)mem->total);
    *base_out = base;
    lay_out(c, base);
    return 0;
}

/* Constants (each checked) and this rank's parameter shards from the init file, each unit's checksum share into
 * part[u]; adds the parameter bytes read to mem->init_param_read.  Returns 0 or -1. */
static int load_init(RtCtx *c, int fd, const char *path, RtMem *mem, uint64_t *part, const uint64_t *sum)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nconst; i++) {
        const RtConst *k = &m->cnst[i];
        uint64_t s = 0;
        if (pread_summed(fd, c->arena + k->arena_off, (uint64_t)k->nbytes, (uint64_t)k->file_off, &s) != 0) {
            rt_err_set(1, "reading init file %s: %s", path, strerror(errno));
            return -1;
        }
        if (s != sum[1 + i]) {
            char what[64];
            snprintf(what, sizeof what, "constant %d", i);
            corrupt(path, what);
            return -1;
        }
    }
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        int64_t es = rt_elem_size(un->dtype), L = c->shard_len[u];
        int64_t start = (int64_t)c->srank * L, end = start + L;
        if (end > un->numel)
            end = un->numel;
        if (start >= end)
            continue; /* all padding */
        uint64_t n = (uint64_t)((end - start) * es);
        if (pread_summed(fd, c->shard[u * RT_NSTATE + RT_S_PARAM], n, (uint64_t)(un->file_off + start * es),
                         &part[u]) != 0) {
            rt_err_set(1, "reading init file %s: %s", path, strerror(errno));
            return -1;
        }
        mem->init_param_read += n;
    }
    return 0;
}

/* Collective: every rank's checksum shares of the units added up (in 32-bit halves, so that the int64 sum
 * cannot overflow) and checked against the compiler's sums times the shard groups, which each read every unit
 * once.  With an even number of groups the first one counts twice: the multiplier stays odd, so the same
 * change in every group's copy cannot cancel mod 2^64.  Every rank sees the same totals and says the same.
 * 0, or -1 (rt_err_set called). */
static int check_units(const RtCtx *c, const char *path, const uint64_t *part, const uint64_t *sum)
{
    enum { B = 256 };
    const RtModel *m = c->m;
    uint64_t groups = (uint64_t)(c->world / c->sf), twice = groups % 2 == 0;
    const uint64_t *want = sum + 1 + m->nconst, copies = groups + twice;
    const uint64_t weight = twice && c->rank < c->sf ? 2 : 1; /* groups are sf consecutive ranks */
    int64_t x[2 * B];
    int rc = 0;
    for (int u0 = 0; u0 < m->nunit; u0 += B) {
        int n = m->nunit - u0 < B ? m->nunit - u0 : B;
        for (int i = 0; i < n; i++) {
            uint64_t share = part[u0 + i] * weight;
            x[2 * i] = (int64_t)(share & 0xffffffffu);
            x[2 * i + 1] = (int64_t)(share >> 32);
        }
        rt_ctl_allreduce_i64(x, 2 * n, RT_CTL_SUM);
        for (int i = 0; rc == 0 && i < n; i++)
            if (((uint64_t)x[2 * i + 1] << 32) + (uint64_t)x[2 * i] != want[u0 + i] * copies) {
                char what[300];
                snprintf(what, sizeof what, "the parameters of unit '%s'%s", m->unit[u0 + i].name,
                         c->world > 1 ? " (as one of the ranks read them)" : "");
                corrupt(path, what);
                rc = -1;
            }
    }
    return rc;
}

/* rank 0 of a run that will read them (--export-onnx, --export-safetensors: the model and the untrained external
 * initializers; --dump-grads: the model): those sections checked now, before the run.  0, or -1. */
static int check_exported(const RtModel *m, const RtOpts *o, int fd, const char *path, const uint64_t *sum)
{
    if (!o->export_path && !o->export_st && !o->dump_grads)
        return 0;
    if (check_section(fd, path, (uint64_t)m->model_off, (uint64_t)m->model_len, sum[0],
                      "the embedded model") != 0)
        return -1;
    for (int i = 0; i < m->nextern; i++) {
        char what[64];
        snprintf(what, sizeof what, "external initializer %d", m->ext[i].init);
        if (check_section(fd, path, (uint64_t)m->ext[i].file_off, (uint64_t)m->ext[i].nbytes,
                          sum[1 + m->nconst + m->nunit + i], what) != 0)
            return -1;
    }
    return 0;
}

int rt_start_init(RtCtx *c, RtMem *mem, char **base, const RtOpts *o, const char *argv0, char **path,
                  int *fd)
{
    char why[1024];
    uint64_t init_size = 0;
    if (plan(c, mem, o->accum_local) == 0 &&
        rt_dev_init(c->m, c->rank, c->world, (int64_t)mem->total, why, sizeof why) != 0)
        rt_err_set(1, "%s", why);
    int status = rt_err_sync();
    if (status != 0)
        return status;
    rt_dev_agree(c);
    rt_dev_set_graph(!o->no_cuda_graph);
    *path = o->init ? strdup(o->init) : default_init_path(argv0);
    uint64_t *sum = NULL;
    if (!*path)
        rt_err_set(1, "out of memory");
    else
        *fd = open_init(c->m, path, o->init == NULL, &init_size, &sum);
    if ((status = rt_err_sync()) != 0) {
        free(sum);
        return status;
    }
    uint64_t *part = calloc((size_t)c->m->nunit + 1, sizeof *part);
    if (!part)
        rt_err_set(1, "out of memory");
    else if (carve(c, mem, base) == 0 && load_init(c, *fd, *path, mem, part, sum) == 0 && c->rank == 0)
        check_exported(c->m, o, *fd, *path, sum);
    if ((status = rt_err_sync()) == 0 && check_units(c, *path, part, sum) == 0 &&
        rt_dev_attach(c, *base, (int64_t)mem->total, why, sizeof why) != 0)
        rt_err_set(1, "%s", why);
    free(part);
    free(sum);
    return status ? status : rt_err_sync();
}
