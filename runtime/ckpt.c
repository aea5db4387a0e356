/* ckpt.c — sharded checkpoints: --ckpt-dir DIR [--ckpt-every K], --resume PATH.
 *
 * A checkpoint is a directory DIR/step-NNNNNNNN:
 *   rank-RRRRR.bin  one per rank of the first shard group (the other groups
 *                   hold the same shards): per unit, in unit order, this
 *                   rank's parameter shard then its optimizer state shards,
 *                   shard_len elements each (padding included);
 *   consts.bin      the persistent state of the step (BatchNorm running
 *                   statistics: the RtConsts with a name), rank 0's;
 *   manifest        text, one record per line: the format, the step, the
 *                   data position, the world and shard group it was written
 *                   at, the optimizer, the optimizer's update count
 *                   ("updates"; fp16 skips steps) and, from fp16 builds, the
 *                   loss scale, its good-step count and the skipped steps
 *                   ("loss_scale"; older manifests lack both: updates =
 *                   step, the flags' scale), every unit's layout, every parameter
 *                   (unit, offset, numel, hex-encoded name), every constant,
 *                   and every file with its size and FNV-1a-64 checksum;
 *                   the last record, "end H", carries H, the FNV-1a-64 of
 *                   every byte before it (an edited step or data_pos is
 *                   refused, as a damaged shard is);
 *   run.toml        the run's options (opts.c, in runcfg.c's form): what
 *                   --resume restores unless a flag or --config overrides
 *                   them.  Not in the manifest: a file of options to read
 *                   (and edit), parsed as strictly as any --config file;
 *                   none in the checkpoints of an older fsdpc.
 * (The dropout RNG is counter-based on the step: the step is its state.)
 *
 * Saving is collective: rank 0 makes DIR/.step-N.tmp, the writers fill and
 * fsync their files, rank 0 gathers their sizes and checksums, writes the
 * rest, fsyncs, renames the directory into place and then points
 * DIR/latest at it (written beside and renamed).  A save that dies half way
 * leaves only the .tmp directory: the previous checkpoint and latest stay.
 * Links: DIR is the user's (it may be a link they made), but anything in it
 * may have been planted by whoever else can write there.  So DIR is opened
 * once (O_DIRECTORY) and every entry is made, renamed and removed through
 * its fd (mkdirat, renameat, rt_dir_remove: a link in the place of .tmp,
 * step-N or its .old is removed itself, never followed); the writers open
 * .tmp with O_NOFOLLOW and create their files O_EXCL|O_NOFOLLOW; latest is
 * written with rt_afile; a prune never follows a link.
 *
 * Resuming reads the manifest (every rank; nothing in it is trusted: every
 * number is range-checked), rank 0 verifies every file's size and checksum,
 * then each rank assembles its own shards from whatever layout the
 * checkpoint has: parameter by parameter (matched by name), element ranges
 * mapped from this run's flat layout to the checkpoint's pieces.  So a run
 * at another world size, --shard strategy, --wrap or per-rank batch of the
 * same model resumes from it; the same layout resumes bit for bit.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

#define FORMAT "fsdpc-checkpoint 1"
#define MAX_MANIFEST (64 << 20)
/* a path in a checkpoint directory: the directory (< PATH_MAX) and a file name */
#define PLEN (PATH_MAX + 64)

uint64_t rt_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* the shard pointer of state k of unit u (0 the parameter, 1.. optimizer states) */
static char *state_ptr(const RtCtx *c, int u, int k)
{
    return c->shard[u * RT_NSTATE + (k == 0 ? RT_S_PARAM : RT_S_M + k - 1)];
}

static int64_t unit_block(int64_t len, int dtype, int nstate) { return (1 + nstate) * len * rt_elem_size(dtype); }

/* ------------------------------------------------------------------- save */

typedef struct {
    int64_t bytes;
    uint64_t sum;
    int64_t failed;
} Written;

/* write n bytes to fd, adding them to the checksum; FSDPC_FAULT=ckpt:R kills rank R half way (tests) */
static int put(int fd, const void *buf, int64_t n, Written *w, int fault)
{
    if (fault) {
        (void)rt_write_all(fd, buf, (size_t)(n / 2));
        fprintf(stderr, "%s: rank fault injected by FSDPC_FAULT during a checkpoint save\n", rt_prog);
        _exit(1);
    }
    w->sum = rt_fnv(w->sum, buf, (size_t)n);
    w->bytes += n;
    return rt_write_all(fd, buf, (size_t)n);
}

static int fault_here(int rank)
{
    const char *f = getenv("FSDPC_FAULT");
    char *end;
    if (!f || strncmp(f, "ckpt:", 5))
        return 0;
    long r = strtol(f + 5, &end, 10);
    return *end == 0 && r == rank;
}

/* a new file NAME of the .tmp folder tfd: created, never opened through a link or over a file someone else
 * made there (O_EXCL|O_NOFOLLOW); an fd, or -1 with errno */
static int create_in(int tfd, const char *name)
{
    return openat(tfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

/* this rank's shards (first group) or rank 0's constants into a new file of the .tmp folder tfd (tmp: its path,
 * for messages) */
static Written write_part(RtCtx *c, int tfd, const char *tmp, int consts)
{
    const RtModel *m = c->m;
    Written w = {0, RT_FNV0, 0};
    char name[32], path[PLEN + 32];
    if (consts)
        snprintf(name, sizeof name, "consts.bin");
    else
        snprintf(name, sizeof name, "rank-%05d.bin", c->rank);
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    int fd = create_in(tfd, name);
    int rc = fd < 0 ? -1 : 0, fault = !consts && fault_here(c->rank);
    for (int i = 0; rc == 0 && consts && i < m->nconst; i++)
        if (m->cnst[i].name) {
            char *p = c->arena + m->cnst[i].arena_off;
            rt_dev_download(c, p, m->cnst[i].nbytes);
            rc = put(fd, p, m->cnst[i].nbytes, &w, 0);
        }
    for (int u = 0; rc == 0 && !consts && u < m->nunit; u++)
        for (int k = 0; rc == 0 && k <= m->unit[u].nstate; k++) {
            int64_t n = c->shard_len[u] * rt_elem_size(m->unit[u].dtype);
            rt_dev_download(c, state_ptr(c, u, k), n);
            rc = put(fd, state_ptr(c, u, k), n, &w, fault && u == m->nunit - 1 && k == m->unit[u].nstate);
        }
    if (rc != 0 || fsync(fd) != 0 || close(fd) != 0) {
        rt_err_set(1, "checkpoint: writing %s: %s", path, strerror(errno));
        w.failed = 1;
        if (fd >= 0)
            close(fd);
    }
    return w;
}

static void hex(char *out, const char *s)
{
    static const char digits[] = "0123456789abcdef";
    for (; *s; s++) {
        *out++ = digits[(unsigned char)*s >> 4];
        *out++ = digits[(unsigned char)*s & 15];
    }
    *out = 0;
}

/* the manifest being written: every byte also hashed, for the end record */
typedef struct {
    FILE *f;
    uint64_t h;
    int bad;
} Out;

static void mput(Out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mput(Out *o, const char *fmt, ...)
{
    char small[512], *s = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof small && (s = malloc((size_t)n + 1)) != NULL) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    if (n < 0 || !s) {
        o->bad = 1;
        return;
    }
    o->bad |= fwrite(s, 1, (size_t)n, o->f) != (size_t)n;
    o->h = rt_fnv(o->h, s, (size_t)n);
    if (s != small)
        free(s);
}

/* rank 0: the manifest into the .tmp folder tfd; its last record, "end H", carries H, the
 * FNV-1a-64 of every byte before it */
static int write_manifest(const RtCtx *c, int tfd, int64_t step, int64_t pos, const Written *ranks,
                          const Written *consts)
{
    const RtModel *m = c->m;
    int fd = create_in(tfd, "manifest");
    Out o = {fd >= 0 ? fdopen(fd, "w") : NULL, RT_FNV0, 0};
    if (!o.f) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    mput(&o, FORMAT "\nstep %" PRId64 "\ndata_pos %" PRId64 "\nworld %d\nshard_group %d\noptimizer %d\n", step, pos,
        c->world, c->sf, m->optimizer);
    mput(&o, "updates %" PRId64 "\n", c->updates);
    if (m->loss_scaling) /* %.17g: the double back exactly */
        mput(&o, "loss_scale %.17g %" PRId64 " %" PRId64 "\n", c->loss_scale, c->scale_good, c->skipped);
    int64_t off = 0;
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        mput(&o, "unit %d %" PRId64 " %d %d %" PRId64 " %" PRId64 "\n", u, un->numel, un->dtype, un->nstate,
            c->shard_len[u], off);
        off += unit_block(c->shard_len[u], un->dtype, un->nstate);
    }
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        char *h = malloc(2 * strlen(p->name ? p->name : "") + 1);
        if (!h) {
            fclose(o.f);
            return -1;
        }
        hex(h, p->name ? p->name : "");
        mput(&o, "param %d %" PRId64 " %" PRId64 " %s\n", p->unit, p->offset, p->numel, h);
        free(h);
    }
    int64_t coff = 0;
    for (int i = 0; i < m->nconst; i++)
        if (m->cnst[i].name) {
            char *h = malloc(2 * strlen(m->cnst[i].name) + 1);
            if (!h) {
                fclose(o.f);
                return -1;
            }
            hex(h, m->cnst[i].name);
            mput(&o, "const %" PRId64 " %" PRId64 " %s\n", m->cnst[i].nbytes, coff, h);
            coff += m->cnst[i].nbytes;
            free(h);
        }
    for (int r = 0; r < c->sf; r++)
        mput(&o, "file rank-%05d.bin %" PRId64 " %016" PRIx64 "\n", r, ranks[r].bytes, ranks[r].sum);
    mput(&o, "file consts.bin %" PRId64 " %016" PRIx64 "\n", consts->bytes, consts->sum);
    mput(&o, "end %016" PRIx64 "\n", o.h);
    int bad = o.bad || ferror(o.f) || fflush(o.f) != 0 || fsync(fileno(o.f)) != 0;
    return fclose(o.f) != 0 || bad ? -1 : 0;
}

/* rank 0: the run's options as run.toml into the .tmp folder tfd (runcfg.c's form; opts.c wrote them) */
static int write_options(int tfd, const char *run_toml)
{
    int fd = create_in(tfd, "run.toml");
    if (fd < 0)
        return -1;
    if (rt_write_all(fd, run_toml, strlen(run_toml)) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

/* name is what publish names a checkpoint: step-NNNNNNNN */
static int is_step_name(const char *name)
{
    return strlen(name) == 13 && strncmp(name, "step-", 5) == 0 && strspn(name + 5, "0123456789") == 8;
}

/* The folder checkpoints go to: DIR (made if missing; the user's own, so it may be a link they made) or, with
 * sub, DIR/SUB (made if missing; never a link: it is inside DIR).  An fd, or -1 with errno. */
static int open_ckpt_dir(const char *dir, const char *sub, int create)
{
    if (create && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || !sub)
        return fd;
    int sfd = create && mkdirat(fd, sub, 0755) != 0 && errno != EEXIST ? -1 : rt_dir_openat(fd, sub);
    int e = errno;
    close(fd);
    errno = e;
    return sfd;
}

/* rank 0: the .tmp folder tmp of dfd becomes step-N (replacing one of that step: a folder, or a link, which is
 * removed, never followed), then latest (written with rt_afile) names it */
static int publish(int dfd, int tfd, const char *tmp, int64_t step)
{
    char name[32], old[40], line[40];
    snprintf(name, sizeof name, "step-%08" PRId64, step);
    snprintf(old, sizeof old, ".%s.old", name);
    if (fsync(tfd) != 0)
        return -1;
    struct stat st;
    int replace = fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (rt_dir_remove(dfd, old) != 0 || (replace && renameat(dfd, name, dfd, old) != 0) ||
        renameat(dfd, tmp, dfd, name) != 0)
        return -1;
    if (replace)
        rt_dir_remove(dfd, old);
    int n = snprintf(line, sizeof line, "%s\n", name);
    RtAFile f;
    if (rt_afile_openat(&f, dfd, "latest", 0644) != 0)
        return -1;
    if (rt_write_all(f.fd, line, (size_t)n) != 0) {
        rt_afile_abort(&f);
        return -1;
    }
    return rt_afile_commit(&f); /* syncs dfd too */
}

/* rank 0: the checkpoint folder and a fresh, empty .tmp folder tmp in it (a stale one, or a link in its place,
 * removed first); the folder's fd, or -1 (rt_err_set) */
static int make_tmp(const char *dir, const char *sub, const char *shown, const char *tmp)
{
    int dfd = open_ckpt_dir(dir, sub, 1);
    if (dfd < 0) {
        rt_err_set(1, "--ckpt-dir %s: cannot open %s: %s", dir, shown, strerror(errno));
        return -1;
    }
    if (rt_dir_remove(dfd, tmp) != 0 || mkdirat(dfd, tmp, 0755) != 0) { /* a save that died before */
        rt_err_set(1, "--ckpt-dir %s: cannot create %s/%s: %s", dir, shown, tmp, strerror(errno));
        close(dfd);
        return -1;
    }
    return dfd;
}

/* a writer: the .tmp folder rank 0 made, opened without following a link (another process may have put one in
 * its place); the folder's fd in *tfd and the checkpoint folder's in *dfd, or -1 (rt_err_set) */
static int open_tmp(const char *dir, const char *sub, const char *shown, const char *tmp, int *dfd, int *tfd)
{
    if (*dfd < 0 && (*dfd = open_ckpt_dir(dir, sub, 0)) < 0) {
        rt_err_set(1, "--ckpt-dir %s: cannot open %s: %s", dir, shown, strerror(errno));
        return -1;
    }
    if ((*tfd = rt_dir_openat(*dfd, tmp)) < 0) {
        rt_err_set(1, "--ckpt-dir %s: cannot open %s/%s (not the folder rank 0 made: a link?): %s", dir, shown,
                   tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int rt_ckpt_save(RtCtx *c, const char *dir, const char *sub, int64_t step, int64_t pos, const char *run_toml)
{
    char tmp[40], shown[PLEN];
    snprintf(tmp, sizeof tmp, ".step-%08" PRId64 ".tmp", step);
    snprintf(shown, sizeof shown, "%s%s%s", dir, sub ? "/" : "", sub ? sub : "");
    int dfd = c->rank == 0 ? make_tmp(dir, sub, shown, tmp) : -1, tfd = -1;
    int status = rt_err_sync();
    if (status != 0)
        return status;
    char tpath[PLEN + 64];
    snprintf(tpath, sizeof tpath, "%s/%s", shown, tmp);
    Written mine = {0, RT_FNV0, 0}, *all = c->rank == 0 ? calloc((size_t)c->world, sizeof *all) : NULL;
    if (c->rank < c->sf && open_tmp(dir, sub, shown, tmp, &dfd, &tfd) != 0)
        mine.failed = 1;
    else if (c->rank < c->sf)
        mine = write_part(c, tfd, tpath, 0);
    rt_ctl_gather(&mine, sizeof mine, all, 0);
    if (c->rank == 0) {
        int failed = !all || mine.failed;
        for (int r = 0; all && r < c->sf; r++)
            failed |= all[r].failed != 0;
        Written consts = failed ? (Written){0, RT_FNV0, 1} : write_part(c, tfd, tpath, 1);
        if (!failed && !consts.failed &&
            (write_manifest(c, tfd, step, pos, all, &consts) != 0 ||
             (run_toml && write_options(tfd, run_toml) != 0) || publish(dfd, tfd, tmp, step) != 0))
            rt_err_set(1, "checkpoint: writing step %" PRId64 " into %s: %s", step, shown, strerror(errno));
        else if (failed && !all)
            rt_err_set(1, "checkpoint: out of memory");
    }
    free(all);
    if (tfd >= 0)
        close(tfd);
    if (dfd >= 0)
        close(dfd);
    return rt_err_sync();
}

void rt_ckpt_prune(const char *dir, const char *sub, int64_t keep)
{
    char name[32];
    snprintf(name, sizeof name, "step-%08" PRId64, keep);
    int dfd = open_ckpt_dir(dir, sub, 0), lfd = dfd >= 0 ? fcntl(dfd, F_DUPFD_CLOEXEC, 0) : -1;
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (is_step_name(e->d_name) && strcmp(e->d_name, name) != 0) /* checkpoints only (never latest), and not
                                                                       * the one kept */
            rt_dir_remove(dfd, e->d_name);
    if (d)
        closedir(d);
    else if (lfd >= 0)
        close(lfd);
    if (dfd >= 0)
        close(dfd);
}

/* ----------------------------------------------------------------- resume */

typedef struct {
    int64_t numel, len, off;
    int dtype, nstate;
} CUnit;

typedef struct {
    int unit;
    int64_t offset, numel;
    char *name;
} CNamed; /* a parameter (unit, offset, numel) or a constant (offset: in consts.bin, numel: bytes) */

typedef struct {
    char name[32];
    int64_t bytes;
    uint64_t sum;
} CFile;

typedef struct {
    char dir[PATH_MAX];
    int64_t step, pos;
    int world, sf, optimizer;
    int64_t updates;            /* -1: not recorded (then the step) */
    int has_scale;              /* a loss_scale record: */
    double scale;
    int64_t scale_good, skipped;
    int nunit, nparam, nconst, nfile;
    CUnit *unit;
    CNamed *param, *cnst;
    CFile *file;
    int *fd;          /* per rank file, opened on demand; -1 */
} Ckpt;

static void ckpt_free(Ckpt *k)
{
    for (int i = 0; k->param && i < k->nparam; i++)
        free(k->param[i].name);
    for (int i = 0; k->cnst && i < k->nconst; i++)
        free(k->cnst[i].name);
    for (int r = 0; k->fd && r < k->sf; r++)
        if (k->fd[r] >= 0)
            close(k->fd[r]);
    free(k->unit), free(k->param), free(k->cnst), free(k->file), free(k->fd);
    memset(k, 0, sizeof *k);
}

int rt_ckpt_resolve(const char *path, char *dir, size_t cap, int quiet)
{
    char p[PLEN];
    struct stat st;
    if (strlen(path) >= cap - 32) {
        if (!quiet)
            rt_err_set(1, "--resume %.200s...: the path is too long", path);
        return -1;
    }
    snprintf(p, sizeof p, "%s/manifest", path);
    if (stat(p, &st) == 0) {
        snprintf(dir, cap, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    int fd = rt_open_regular(p, &st);
    char name[64] = "";
    if (fd == -2) {
        if (!quiet)
            rt_err_set(1, "--resume %s: %s: %s", path, p, rt_open_why(fd));
        return -1;
    }
    if (fd < 0) {
        if (!quiet)
            rt_err_set(1, "--resume %s: neither a checkpoint (no manifest) nor a --ckpt-dir (no latest)", path);
        return -1;
    }
    ssize_t got = read(fd, name, sizeof name - 1);
    close(fd);
    int ok = got > 0;
    name[ok ? got : 0] = 0;
    size_t n = strlen(name);
    if (ok && n && name[n - 1] == '\n')
        name[--n] = 0;
    ok = ok && is_step_name(name);
    if (!ok) {
        if (!quiet)
            rt_err_set(1, "--resume %s: %s does not name a checkpoint (step-NNNNNNNN)", path, p);
        return -1;
    }
    snprintf(dir, cap, "%s/%s", path, name);
    return 0;
}

static char *unhex(const char *h)
{
    size_t n = strlen(h);
    if (n % 2)
        return NULL;
    char *s = malloc(n / 2 + 1);
    for (size_t i = 0; s && i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1 || !v) {
            free(s);
            return NULL;
        }
        s[i] = (char)v;
    }
    if (s)
        s[n / 2] = 0;
    return s;
}

/* x appended to (*arr)[*n]; -1 (x's name freed) when out of memory */
static int add_named(CNamed **arr, int *n, CNamed x)
{
    CNamed *q = realloc(*arr, sizeof *q * (size_t)(*n + 1));
    if (!q) {
        free(x.name);
        return -1;
    }
    *arr = q;
    q[(*n)++] = x;
    return 0;
}

/* every record of the manifest into k; -1 (rt_err_set) on anything malformed */
static int parse(Ckpt *k, const char *text, const char *path)
{
    int line = 0;
#define BAD(...) do { rt_err_set(1, "--resume: %s line %d: " __VA_ARGS__); return -1; } while (0)
    const char *p = text;
    int ended = 0;
    while (*p && !ended) {
        const char *nl = strchr(p, '\n');
        if (!nl)
            BAD("%s", path, line + 1, "no newline (truncated?)");
        char rec[16384];
        size_t len = (size_t)(nl - p);
        line++;
        if (len >= sizeof rec)
            BAD("%s", path, line, "too long");
        memcpy(rec, p, len);
        rec[len] = 0;
        p = nl + 1;
        char word[16], name[8192 + 1];
        int r;
        int64_t a, b, c2, e, du, nu;
        uint64_t sum;
        if (line == 1) {
            if (strcmp(rec, FORMAT))
                BAD("%s", path, line, "not an fsdpc checkpoint manifest (" FORMAT ")");
        } else if (sscanf(rec, "step %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 1) {
            k->step = a;
        } else if (sscanf(rec, "data_pos %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 0) {
            k->pos = a;
        } else if (sscanf(rec, "world %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 1 && a <= (1 << 20)) {
            k->world = (int)a; /* read as int64 and checked: "%d" of 2^32 + 2 would be 2 */
        } else if (sscanf(rec, "shard_group %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 1 && a <= (1 << 20)) {
            k->sf = (int)a;
        } else if (sscanf(rec, "optimizer %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 0 && a < 64) {
            k->optimizer = (int)a;
        } else if (sscanf(rec, "updates %" SCNd64 "%n", &a, &r) == 1 && !rec[r] && a >= 0) {
            k->updates = a;
        } else if (sscanf(rec, "loss_scale %lf %" SCNd64 " %" SCNd64 "%n", &k->scale, &a, &b, &r) == 3 && !rec[r] &&
                   k->scale > 0 && k->scale <= 0x1p126 && a >= 0 && b >= 0) {
            k->has_scale = 1;
            k->scale_good = a;
            k->skipped = b;
        } else if (sscanf(rec, "unit %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 "%n", &e,
                          &a, &du, &nu, &b, &c2, &r) == 6 && !rec[r]) {
            if (e != k->nunit || a < 0 || a > INT64_MAX / 64 || du < 0 || du > 64 || rt_elem_size((int)du) == 0 ||
                nu < 0 || nu > 2 || b < 0 || c2 < 0 || k->sf < 1 || b != (a + k->sf - 1) / k->sf)
                BAD("%s", path, line, "a unit out of order or of impossible sizes");
            int d = (int)du, ns = (int)nu;
            CUnit *q = realloc(k->unit, sizeof *q * (size_t)(k->nunit + 1));
            if (!q)
                BAD("%s", path, line, "out of memory");
            k->unit = q;
            q[k->nunit++] = (CUnit){a, b, c2, d, ns};
        } else if (sscanf(rec, "%15s %" SCNd64 " %" SCNd64 " %" SCNd64 " %8192s%n", word, &a, &b, &c2, name, &r) == 5 &&
                   !rec[r] && !strcmp(word, "param")) {
            char *nm = unhex(name);
            if (!nm)
                BAD("%s", path, line, "a parameter name that is not hex-encoded");
            if (a < 0 || a >= k->nunit || b < 0 || c2 < 0 || b > k->unit[a].numel - c2) {
                free(nm);
                BAD("%s", path, line, "a parameter outside its unit");
            }
            if (add_named(&k->param, &k->nparam, (CNamed){(int)a, b, c2, nm}) != 0)
                BAD("%s", path, line, "out of memory");
        } else if (sscanf(rec, "%15s %" SCNd64 " %" SCNd64 " %8192s%n", word, &a, &b, name, &r) == 4 && !rec[r] &&
                   !strcmp(word, "const")) {
            char *nm = unhex(name);
            if (!nm || a < 0 || b < 0) {
                free(nm);
                BAD("%s", path, line, "a malformed constant");
            }
            if (add_named(&k->cnst, &k->nconst, (CNamed){-1, b, a, nm}) != 0)
                BAD("%s", path, line, "out of memory");
        } else if (sscanf(rec, "%15s %31s %" SCNd64 " %16" SCNx64 "%n", word, name, &e, &sum, &r) == 4 && !rec[r] &&
                   !strcmp(word, "file")) {
            int rank = -1, pos = 0;
            int ok = e >= 0 && ((sscanf(name, "rank-%5d.bin%n", &rank, &pos) == 1 && !name[pos] && strlen(name) == 14 &&
                                 rank == k->nfile) || !strcmp(name, "consts.bin"));
            if (!ok)
                BAD("%s", path, line, "an unexpected file");
            CFile *q = realloc(k->file, sizeof *q * (size_t)(k->nfile + 1));
            if (!q)
                BAD("%s", path, line, "out of memory");
            k->file = q;
            snprintf(q[k->nfile].name, sizeof q[k->nfile].name, "%.31s", name); /* read by %31s */
            q[k->nfile].bytes = e;
            q[k->nfile++].sum = sum;
        } else if (sscanf(rec, "end %16" SCNx64 "%n", &sum, &r) == 1 && !rec[r] && r == 20) {
            if (sum != rt_fnv(RT_FNV0, text, (size_t)(nl - len - text)))
                BAD("%s", path, line, "the checksum does not match the manifest's content: it was edited or damaged "
                    "(resume from another checkpoint)");
            ended = 1;
        } else if (!strcmp(rec, "end")) {
            BAD("%s", path, line, "no checksum on the end record (a manifest of an older fsdpc, or edited): "
                "resume from a checkpoint this fsdpc wrote");
        } else {
            BAD("%s", path, line, "an unknown record");
        }
    }
    if (ended && *p)
        BAD("%s", path, line + 1, "content after the end record");
    if (!ended || k->step < 1 || k->sf < 1 || k->world < 1 || k->world % k->sf || k->nunit < 1 ||
        k->nfile != k->sf + 1 || strcmp(k->file[k->sf].name, "consts.bin"))
        BAD("%s", path, line, "incomplete (no end, step, shard group, units or files)");
    if (k->updates > k->step)
        BAD("%s", path, line, "more optimizer updates than steps");
    int64_t off = 0;
    for (int u = 0; u < k->nunit; u++) {
        if (k->unit[u].off != off)
            BAD("%s", path, line, "the units' file offsets do not add up");
        off += unit_block(k->unit[u].len, k->unit[u].dtype, k->unit[u].nstate);
    }
    for (int r = 0; r < k->sf; r++)
        if (k->file[r].bytes != off)
            BAD("%s", path, line, "a rank file's size does not match the units");
#undef BAD
    return 0;
}

/* rank 0: every file's size and checksum.  0, or -1 (rt_err_set) */
static int verify(const Ckpt *k)
{
    char path[PLEN];
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        rt_err_set(1, "out of memory");
        return -1;
    }
    int rc = 0;
    for (int i = 0; rc == 0 && i < k->nfile; i++) {
        snprintf(path, sizeof path, "%s/%s", k->dir, k->file[i].name);
        struct stat st;
        int fd = rt_open_regular(path, &st);
        if (fd < 0) {
            rt_err_set(1, "--resume: %s: %s", path, rt_open_why(fd));
            rc = -1;
        } else if (st.st_size != k->file[i].bytes) {
            rt_err_set(1, "--resume: %s holds %lld bytes, the manifest says %lld: the checkpoint is damaged", path,
                       (long long)st.st_size, (long long)k->file[i].bytes);
            rc = -1;
        } else {
            uint64_t h = RT_FNV0;
            for (int64_t off = 0; rc == 0 && off < k->file[i].bytes; off += (int64_t)cap) {
                size_t n = (size_t)(k->file[i].bytes - off < (int64_t)cap ? k->file[i].bytes - off : (int64_t)cap);
                if (rt_pread_all(fd, buf, n, (uint64_t)off) != 0) {
                    rt_err_set(1, "--resume: reading %s: %s", path, strerror(errno));
                    rc = -1;
                }
                h = rt_fnv(h, buf, n);
            }
            if (rc == 0 && h != k->file[i].sum) {
                rt_err_set(1, "--resume: %s: the checksum does not match the manifest's: the checkpoint is damaged "
                              "(resume from an earlier one)", path);
                rc = -1;
            }
        }
        if (fd >= 0)
            close(fd);
    }
    free(buf);
    return rc;
}

/* n bytes at off of the checkpoint's rank-r file into dst */
static int read_piece(Ckpt *k, int r, void *dst, int64_t n, int64_t off)
{
    if (k->fd[r] < 0) {
        char path[PLEN];
        snprintf(path, sizeof path, "%s/%s", k->dir, k->file[r].name);
        struct stat st;
        k->fd[r] = rt_open_regular(path, &st);
        if (k->fd[r] < 0) {
            rt_err_set(1, "--resume: %s: %s", path, rt_open_why(k->fd[r]));
            k->fd[r] = -1;
            return -1;
        }
    }
    if (rt_pread_all(k->fd[r], dst, (uint64_t)n, (uint64_t)off) != 0) {
        rt_err_set(1, "--resume: reading %s/%s: %s", k->dir, k->file[r].name, strerror(errno));
        return -1;
    }
    return 0;
}

/* this rank's shards (param and optimizer states) from the checkpoint, by parameter name */
static int assemble(RtCtx *c, Ckpt *k)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        const RtUnit *un = &m->unit[p->unit];
        const CNamed *q = NULL;
        for (int j = 0; j < k->nparam && !q; j++)
            if (p->name && !strcmp(k->param[j].name, p->name))
                q = &k->param[j];
        if (!q) {
            rt_err_set(1, "--resume %s: the checkpoint has no parameter '%s' (another model?)", k->dir,
                       p->name ? p->name : "?");
            return -1;
        }
        const CUnit *cu = &k->unit[q->unit];
        if (q->numel != p->numel || cu->dtype != un->dtype) {
            rt_err_set(1, "--resume %s: parameter '%s' has %lld elements of dtype %d there, %lld of dtype %d here",
                       k->dir, p->name, (long long)q->numel, cu->dtype, (long long)p->numel, un->dtype);
            return -1;
        }
        int64_t L = c->shard_len[p->unit], es = rt_elem_size(un->dtype);
        int64_t lo = (int64_t)c->srank * L, hi = lo + L; /* this rank's flat range */
        int64_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        for (int s = 0; s <= un->nstate; s++)
            for (int64_t x = a; x < b;) {
                int64_t idx = q->offset + (x - p->offset); /* in the checkpoint's flat */
                int r = (int)(idx / cu->len);
                int64_t within = idx - (int64_t)r * cu->len, run = cu->len - within;
                if (run > b - x)
                    run = b - x;
                char *dst = state_ptr(c, p->unit, s) + (x - lo) * es;
                if (read_piece(k, r, dst, run * es, cu->off + (s * cu->len + within) * es) != 0)
                    return -1;
                x += run;
            }
    }
    return 0;
}

int rt_ckpt_resume(RtCtx *c, const char *path, int64_t *step, int64_t *pos)
{
    const RtModel *m = c->m;
    Ckpt k;
    memset(&k, 0, sizeof k);
    k.updates = -1;
    char mpath[PLEN], *text = NULL;
    int rc = rt_ckpt_resolve(path, k.dir, sizeof k.dir, 0);
    if (rc == 0) {
        snprintf(mpath, sizeof mpath, "%s/manifest", k.dir);
        struct stat st;
        int fd = rt_open_regular(mpath, &st);
        if (fd < 0 || st.st_size > MAX_MANIFEST || !(text = calloc(1, (size_t)st.st_size + 1)) ||
            rt_pread_all(fd, text, (uint64_t)st.st_size, 0) != 0) {
            rt_err_set(1, "--resume: cannot read %s: %s", mpath, fd < 0 ? rt_open_why(fd) : "too large or unreadable");
            rc = -1;
        }
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0)
        rc = parse(&k, text, mpath);
    free(text);
    if (rc == 0 && k.optimizer != m->optimizer) {
        rt_err_set(1, "--resume %s: the checkpoint holds %s state, this executable uses %s", k.dir,
                   rt_opt_name(k.optimizer), rt_opt_name(m->optimizer));
        rc = -1;
    }
    for (int u = 0; rc == 0 && u < m->nunit; u++)
        for (int j = 0; rc == 0 && j < k.nunit; j++)
            if (k.unit[j].nstate != m->unit[u].nstate) {
                rt_err_set(1, "--resume %s: optimizer state shards differ (%d there, %d here: sgd momentum?)", k.dir,
                           k.unit[j].nstate, m->unit[u].nstate);
                rc = -1;
            }
    int status = rt_err_sync();
    if (status == 0 && c->rank == 0)
        verify(&k);
    status = status ? status : rt_err_sync();
    if (status == 0) {
        k.fd = malloc(sizeof *k.fd * (size_t)k.sf);
        for (int r = 0; k.fd && r < k.sf; r++)
            k.fd[r] = -1;
        if (!k.fd)
            rt_err_set(1, "out of memory");
        else if (assemble(c, &k) == 0) {
            /* the persistent constants, by name */
            for (int i = 0; i < m->nconst; i++) {
                const RtConst *cn = &m->cnst[i];
                const CNamed *q = NULL;
                for (int j = 0; cn->name && j < k.nconst && !q; j++)
                    if (!strcmp(k.cnst[j].name, cn->name))
                        q = &k.cnst[j];
                if (!cn->name)
                    continue;
                if (!q || q->numel != cn->nbytes) {
                    rt_err_set(1, "--resume %s: state '%s' is missing or of another size there", k.dir, cn->name);
                    break;
                }
                char cpath[PLEN];
                snprintf(cpath, sizeof cpath, "%s/consts.bin", k.dir);
                struct stat st;
                int fd = rt_open_regular(cpath, &st);
                if (fd < 0 || rt_pread_all(fd, c->arena + cn->arena_off, (uint64_t)cn->nbytes, (uint64_t)q->offset)) {
                    rt_err_set(1, "--resume: reading %s: %s", cpath, fd < 0 ? rt_open_why(fd) : strerror(errno));
                    if (fd >= 0)
                        close(fd);
                    break;
                }
                close(fd);
                rt_dev_upload(c, c->arena + cn->arena_off, cn->nbytes);
            }
            for (int u = 0; u < m->nunit; u++)
                for (int s = 0; s <= m->unit[u].nstate; s++)
                    rt_dev_upload(c, state_ptr(c, u, s), c->shard_len[u] * rt_elem_size(m->unit[u].dtype));
        }
        status = rt_err_sync();
    }
    if (status == 0) {
        *step = k.step;
        *pos = k.pos;
        c->updates = k.updates >= 0 ? k.updates : k.step;
        if (m->loss_scaling && k.has_scale) { /* else the flags' scale: a checkpoint of an fp32 / bf16 run */
            c->loss_scale = k.scale;
            c->scale_good = k.scale_good;
            c->skipped = k.skipped;
        } else {
            c->skipped = k.step - c->updates; /* --on-nonfinite skip */
        }
    }
    ckpt_free(&k);
    return status;
}
