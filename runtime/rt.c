/* rt.c — rt_main: everything of a training executable that does not depend
 * on the model: flags, MPI, the one allocation per rank, the init file
 * (constants and this rank's parameter shards), the data, the step loop,
 * progress lines, metrics, export, and failures inside the step.
 *
 * Start-up errors: every rank runs the same checks; local failures (a file
 * only one node misses, an allocation) are agreed on collectively, so that
 * no rank is left waiting in a collective.  Exactly one line is printed, by
 * the lowest failing rank, and every rank exits with the same status after
 * MPI_Finalize (1, or 2 for command-line errors).
 */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "npy.h"
#include "rt_priv.h"

const char *rt_prog = "fsdpc-train";

#define ALIGN 64
#define HEADER_BYTES 32 /* magic[16], id u64 LE, file size u64 LE */

/* ------------------------------------------------------------------ errors */

static int g_rank, g_world = 1;
static pthread_t g_main_thread;
static int g_mpi_up;

static char g_err[2048];
static int g_code; /* 0: no error on this rank; else the exit status */

static void err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void err_set(int code, const char *fmt, ...)
{
    if (g_code)
        return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    g_code = code;
}

/* Collective: did any rank fail?  The lowest failing rank prints its one
 * line; returns its exit status on every rank (0 if none failed). */
static int err_sync(void)
{
    int key = g_code ? g_rank : g_world, low;
    RT_MPI(MPI_Allreduce(&key, &low, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (low >= g_world)
        return 0;
    int code = g_code;
    RT_MPI(MPI_Bcast(&code, 1, MPI_INT, low, MPI_COMM_WORLD));
    if (g_rank == low) {
        for (char *p = g_err; *p; p++) /* one line, whatever the user typed */
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        if (low != 0)
            fprintf(stderr, "%s: error: rank %d: %s\n", rt_prog, low, g_err);
        else
            fprintf(stderr, "%s: error: %s\n", rt_prog, g_err);
        fflush(stderr);
    }
    return code;
}

static void warn0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn0(const char *fmt, ...)
{
    if (g_rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: warning: ", rt_prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
}

static int on_main_thread(void) { return pthread_equal(pthread_self(), g_main_thread); }

static atomic_flag g_dying = ATOMIC_FLAG_INIT;

static _Noreturn void die_now(int world)
{
    if (world > 1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (g_mpi_up && on_main_thread())
        MPI_Finalize();
    exit(1);
}

static _Noreturn void hang(void)
{
    for (;;)
        pause(); /* another thread is bringing the process down */
}

_Noreturn void rt_mpi_fail(const char *file, int line, const char *call, int rc)
{
    if (atomic_flag_test_and_set(&g_dying))
        hang();
    char es[MPI_MAX_ERROR_STRING + 1];
    int n = 0;
    if (MPI_Error_string(rc, es, &n) != MPI_SUCCESS)
        n = snprintf(es, sizeof es, "MPI error %d", rc);
    es[n < 0 ? 0 : n > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : n] = 0;
    fprintf(stderr, "%s: error: rank %d: %s:%d: %s failed: %s\n", rt_prog, g_rank, file, line, call, es);
    fflush(stderr);
    die_now(g_world);
}

_Noreturn void rt_step_fail(RtCtx *c, const char *fmt, ...)
{
    if (atomic_flag_test_and_set(&g_dying))
        hang();
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    long long step = c ? (long long)c->step : 0;
    int rank = c ? c->rank : g_rank;
    fprintf(stderr, "%s: error: step %lld, rank %d: %s\n", rt_prog, step, rank, msg);
    fflush(stdout);
    fflush(stderr);
    die_now(c ? c->world : g_world);
}

/* -------------------------------------------------------------------- flags */

typedef struct {
    const char *name, *file;
} DataArg;

typedef struct {
    DataArg *data;
    int ndata;
    int64_t steps;
    double lr, wd, momentum, beta1, beta2, eps;
    int set_wd, set_momentum, set_beta1, set_beta2, set_eps;
    const char *metrics, *export_path, *init;
    int quiet, help;
} Opts;

static const char *opt_name(int optimizer) { return optimizer == RT_SGD ? "sgd" : "adamw"; }

static void usage(const RtModel *m)
{
    printf("usage: %s [options]            (one rank)\n"
           "       mpirun -np N %s [options]   (N ranks; or srun)\n"
           "Trains %s (built by fsdpc; optimizer %s).\n"
           "\n"
           "  --data NAME=FILE.npy    training data of model input NAME (one per input)\n"
           "  --steps N               optimizer steps (default 10)\n"
           "  --lr X                  learning rate (default 1e-3)\n"
           "  --weight-decay X        weight decay (default 0.01 for adamw, 0 for sgd)\n"
           "  --momentum X            sgd momentum (default 0)\n"
           "  --beta1 X, --beta2 X    adamw betas (default 0.9, 0.999)\n"
           "  --eps X                 adamw epsilon (default 1e-8)\n"
           "  --metrics FILE.jsonl    rank 0 writes one JSON object per step\n"
           "  --export-onnx FILE.onnx write the trained model as ONNX at the end\n"
           "  --init FILE             initial weights (default: this executable's path + .init)\n"
           "  --quiet                 no per-step lines\n"
           "  --help                  this text\n",
           rt_prog, rt_prog, m->name ? m->name : "the model", opt_name(m->optimizer));
    printf("\nModel inputs (one .npy each, N rows; b = rows per rank and step, so the global batch\n"
           "is b * ranks; at step s = 0, 1, ... rank r reads rows (s*b*ranks + r*b + i) mod N, i < b):\n");
    if (m->ninput == 0)
        printf("  (none)\n");
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        printf("  %-16s %s [", in->name, npy_dtype_name(in->dtype));
        for (int d = 0; d < in->rank && d < RT_MAX_RANK; d++) {
            if (d == 0)
                printf("N");
            else
                printf(", %" PRId64, in->shape[d]);
        }
        printf("]  (b = %" PRId64 ")\n", in->rank > 0 ? in->shape[0] : 0);
    }
    fflush(stdout);
}

static int parse_double(const char *flag, const char *s, double lo, double hi, int hi_open, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != 0 || isspace((unsigned char)*s) || errno == ERANGE || !isfinite(v)) {
        err_set(2, "%s: invalid number '%s' (see --help)", flag, s);
        return -1;
    }
    if (v < lo || v > hi || (hi_open && v == hi)) {
        if (hi_open)
            err_set(2, "%s: %s is out of range [%g, %g)", flag, s, lo, hi);
        else
            err_set(2, "%s: %s must be >= %g", flag, s, lo);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_steps(const char *flag, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != 0 || isspace((unsigned char)*s) || *s == '+' || errno == ERANGE) {
        err_set(2, "%s: invalid integer '%s' (see --help)", flag, s);
        return -1;
    }
    if (v < 0) {
        err_set(2, "%s: %s must be >= 0", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* 0: run; 1: --help; -1: error (g_err set, status 2) */
static int parse_flags(int argc, char **argv, const RtModel *m, Opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 10;
    o->lr = 1e-3;
    o->wd = m->optimizer == RT_SGD ? 0.0 : 0.01;
    o->momentum = 0;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->eps = 1e-8;
    o->data = calloc((size_t)argc + 1, sizeof *o->data);
    if (!o->data) {
        err_set(1, "out of memory");
        return -1;
    }
    static const char *const with_value[] = {"--data", "--steps", "--lr", "--weight-decay", "--momentum",
                                             "--beta1", "--beta2", "--eps", "--metrics", "--export-onnx",
                                             "--init"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 1;
        if (strncmp(a, "--", 2) != 0 || a[2] == 0) {
            err_set(2, "unexpected argument '%s' (see --help)", a);
            return -1;
        }
        /* --flag=value or --flag value */
        char flag[64];
        const char *eq = strchr(a, '='), *val = NULL;
        size_t fl = eq ? (size_t)(eq - a) : strlen(a);
        if (fl >= sizeof flag) {
            err_set(2, "unknown flag '%.40s...' (see --help)", a);
            return -1;
        }
        memcpy(flag, a, fl);
        flag[fl] = 0;
        if (strcmp(flag, "--quiet") == 0) {
            if (eq) {
                err_set(2, "--quiet takes no value (see --help)");
                return -1;
            }
            o->quiet = 1;
            continue;
        }
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            known |= strcmp(flag, with_value[k]) == 0;
        if (!known) {
            err_set(2, "unknown flag '%s' (see --help)", flag);
            return -1;
        }
        if (eq)
            val = eq + 1;
        else if (i + 1 < argc)
            val = argv[++i];
        else {
            err_set(2, "missing value for '%s' (see --help)", flag);
            return -1;
        }
        int rc = 0;
        if (strcmp(flag, "--data") == 0) {
            const char *e = strchr(val, '=');
            if (!e || e == val || e[1] == 0) {
                err_set(2, "--data expects NAME=FILE.npy, got '%s' (see --help)", val);
                return -1;
            }
            char *name = strndup(val, (size_t)(e - val));
            if (!name) {
                err_set(1, "out of memory");
                return -1;
            }
            for (int k = 0; k < o->ndata; k++)
                if (strcmp(o->data[k].name, name) == 0) {
                    err_set(2, "--data %s is given twice", name);
                    free(name);
                    return -1;
                }
            o->data[o->ndata].name = name;
            o->data[o->ndata].file = e + 1;
            o->ndata++;
        } else if (strcmp(flag, "--steps") == 0) {
            rc = parse_steps(flag, val, &o->steps);
        } else if (strcmp(flag, "--lr") == 0) {
            rc = parse_double(flag, val, 0, INFINITY, 0, &o->lr);
        } else if (strcmp(flag, "--weight-decay") == 0) {
            rc = parse_double(flag, val, 0, INFINITY, 0, &o->wd);
            o->set_wd = 1;
        } else if (strcmp(flag, "--momentum") == 0) {
            rc = parse_double(flag, val, 0, INFINITY, 0, &o->momentum);
            o->set_momentum = 1;
        } else if (strcmp(flag, "--beta1") == 0) {
            rc = parse_double(flag, val, 0, 1, 1, &o->beta1);
            o->set_beta1 = 1;
        } else if (strcmp(flag, "--beta2") == 0) {
            rc = parse_double(flag, val, 0, 1, 1, &o->beta2);
            o->set_beta2 = 1;
        } else if (strcmp(flag, "--eps") == 0) {
            rc = parse_double(flag, val, 0, INFINITY, 0, &o->eps);
            o->set_eps = 1;
        } else if (strcmp(flag, "--metrics") == 0) {
            o->metrics = val;
        } else if (strcmp(flag, "--export-onnx") == 0) {
            o->export_path = val;
        } else if (strcmp(flag, "--init") == 0) {
            o->init = val;
        }
        if (rc != 0)
            return -1;
        if (*val == 0 && (!strcmp(flag, "--metrics") || !strcmp(flag, "--export-onnx") || !strcmp(flag, "--init"))) {
            err_set(2, "%s: empty file name", flag);
            return -1;
        }
    }
    return 0;
}

/* --------------------------------------------------------------- model tables */

static int dims_str(char *buf, size_t cap, int rank, const int64_t *shape, int first_any)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, cap - n, "[");
    for (int d = 0; d < rank && n < cap; d++) {
        if (d == 0 && first_any)
            n += (size_t)snprintf(buf + n, cap - n, "N");
        else
            n += (size_t)snprintf(buf + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return 0;
}

/* internal consistency of what the compiler emitted: never trust, never crash */
static int check_model(const RtModel *m)
{
#define BAD(...) do { err_set(1, "corrupt model tables: " __VA_ARGS__); return -1; } while (0)
    if (m->nunit < 0 || m->nparam < 0 || m->ninput < 0 || m->nconst < 0 || m->nslot < 0 || m->arena_bytes < 0)
        BAD("negative count");
    if ((m->nunit && !m->unit) || (m->nparam && !m->param) || (m->ninput && !m->input) ||
        (m->nconst && !m->cnst) || !m->step)
        BAD("missing table");
    if (m->optimizer != RT_ADAMW && m->optimizer != RT_SGD)
        BAD("unknown optimizer %d", m->optimizer);
    if (m->loss_dtype != RT_F32 && m->loss_dtype != RT_F64)
        BAD("loss dtype %d", m->loss_dtype);
    if (m->loss_off < 0 || m->loss_off > m->arena_bytes - rt_elem_size(m->loss_dtype))
        BAD("loss offset %" PRId64 " outside the arena", m->loss_off);
    if (m->model_off < 0 || m->model_len < 0)
        BAD("model range");
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        if (un->dtype != RT_F32 && un->dtype != RT_F64)
            BAD("unit %d dtype %d", u, un->dtype);
        if (un->numel < 0 || un->numel > INT64_MAX / 16 || un->file_off < 0)
            BAD("unit %d size", u);
        if (un->nstate < 0 || un->nstate > RT_NSTATE - 2)
            BAD("unit %d nstate %d", u, un->nstate);
    }
    for (int i = 0; i < m->nparam; i++) {
        const RtParam *p = &m->param[i];
        if (p->unit < 0 || p->unit >= m->nunit || p->offset < 0 || p->numel < 0 ||
            p->offset > m->unit[p->unit].numel - p->numel)
            BAD("parameter %d outside its unit", i);
    }
    for (int i = 0; i < m->nconst; i++) {
        const RtConst *k = &m->cnst[i];
        if (k->nbytes < 0 || k->file_off < 0 || k->arena_off < 0 || k->arena_off > m->arena_bytes - k->nbytes)
            BAD("constant %d outside the arena", i);
    }
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        if (!in->name || rt_elem_size(in->dtype) == 0 || in->rank < 1 || in->rank > RT_MAX_RANK)
            BAD("input %d", i);
        uint64_t bytes = (uint64_t)rt_elem_size(in->dtype);
        for (int d = 0; d < in->rank; d++)
            if (in->shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)in->shape[d], &bytes))
                BAD("input '%s' shape", in->name);
        if (in->shape[0] < 1)
            BAD("input '%s' has batch %" PRId64, in->name, in->shape[0]);
        if (in->shape[0] != m->input[0].shape[0])
            BAD("inputs '%s' and '%s' disagree on the batch size", m->input[0].name, in->name);
        if (in->arena_off < 0 || bytes > (uint64_t)m->arena_bytes ||
            in->arena_off > m->arena_bytes - (int64_t)bytes)
            BAD("input '%s' outside the arena", in->name);
    }
    return 0;
#undef BAD
}

/* ---------------------------------------------------------------------- I/O */

static int pread_all(int fd, void *buf, uint64_t n, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        size_t k = n > ((uint64_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
        ssize_t r = pread(fd, p, k, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (r == 0) {
            errno = EIO; /* file shrank under us */
            return -1;
        }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static uint64_t le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

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

/* open and validate the init file; returns the fd or -1 (g_err set) */
static int open_init(const RtModel *m, const char *path, int is_default, uint64_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(1, "cannot open init file %s: %s%s", path, strerror(errno),
                is_default ? " (it is written by fsdpc beside the executable; or pass --init FILE)" : "");
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_set(1, "init file %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        err_set(1, "init file %s is not a regular file", path);
        close(fd);
        return -1;
    }
    unsigned char h[HEADER_BYTES];
    uint64_t size = (uint64_t)st.st_size;
    if (size < HEADER_BYTES) {
        err_set(1, "%s is not an fsdpc init file (too short)", path);
        close(fd);
        return -1;
    }
    if (pread_all(fd, h, HEADER_BYTES, 0) != 0) {
        err_set(1, "reading init file %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (memcmp(h, RT_INIT_MAGIC, 16) != 0) {
        err_set(1, "%s is not an fsdpc init file (bad magic)", path);
        close(fd);
        return -1;
    }
    if (le64(h + 16) != m->id) {
        err_set(1, "init file %s belongs to another build of the model; rebuild with fsdpc or pass --init", path);
        close(fd);
        return -1;
    }
    if (le64(h + 24) != size) {
        err_set(1, "init file %s is truncated or corrupt (its header says %" PRIu64 " bytes, the file has %" PRIu64 ")",
                path, le64(h + 24), size);
        close(fd);
        return -1;
    }
    /* every range the tables point at must lie inside the file */
    for (int u = 0; u < m->nunit; u++) {
        uint64_t end = (uint64_t)m->unit[u].file_off + (uint64_t)m->unit[u].numel * (uint64_t)rt_elem_size(m->unit[u].dtype);
        if (end > size) {
            err_set(1, "init file %s is corrupt: unit '%s' lies beyond its end", path, m->unit[u].name);
            close(fd);
            return -1;
        }
    }
    for (int i = 0; i < m->nconst; i++)
        if ((uint64_t)m->cnst[i].file_off + (uint64_t)m->cnst[i].nbytes > size) {
            err_set(1, "init file %s is corrupt: constant %d lies beyond its end", path, i);
            close(fd);
            return -1;
        }
    if (m->model_len > 0 && (uint64_t)m->model_off + (uint64_t)m->model_len > size) {
        err_set(1, "init file %s is corrupt: the embedded model lies beyond its end", path);
        close(fd);
        return -1;
    }
    *size_out = size;
    return fd;
}

/* ------------------------------------------------------------------- layout */

typedef struct {
    uint64_t param, grad, optim, model_state, slots, arena, total;
} Mem;

static uint64_t round64(uint64_t x) { return (x + (ALIGN - 1)) & ~(uint64_t)(ALIGN - 1); }

/* add with overflow detection into *acc; returns -1 on overflow */
static int acc_add(uint64_t *acc, uint64_t x)
{
    return __builtin_add_overflow(*acc, x, acc) ? -1 : 0;
}

/* compute shard lengths and sizes; allocate and carve; returns 0 or -1 (g_err set) */
static int carve(RtCtx *c, Mem *mem, char **base_out)
{
    const RtModel *m = c->m;
    int W = c->world;
    c->shard_len = calloc((size_t)m->nunit + 1, sizeof *c->shard_len);
    c->shard = calloc((size_t)m->nunit * RT_NSTATE + 1, sizeof *c->shard);
    c->slot = calloc((size_t)m->nslot + 1, sizeof *c->slot);
    if (!c->shard_len || !c->shard || !c->slot) {
        err_set(1, "out of memory");
        return -1;
    }
    int64_t slot_elems = 0, slot_es = 0;
    uint64_t shard_bytes = 0;
    memset(mem, 0, sizeof *mem);
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        int64_t es = rt_elem_size(un->dtype);
        int64_t L = (un->numel + W - 1) / W; /* numel <= INT64_MAX/16: no overflow */
        c->shard_len[u] = L;
        if ((int64_t)W * L > slot_elems)
            slot_elems = (int64_t)W * L;
        if (es > slot_es)
            slot_es = es;
        uint64_t sb = (uint64_t)L * (uint64_t)es;
        mem->param += sb;
        mem->grad += sb;
        mem->optim += sb * (uint64_t)un->nstate;
        mem->model_state += (uint64_t)un->numel * (uint64_t)es * (uint64_t)(2 + un->nstate);
        uint64_t all;
        if (__builtin_mul_overflow(round64(sb), (uint64_t)(2 + un->nstate), &all) || acc_add(&shard_bytes, all))
            goto too_big;
    }
    c->slot_elems = slot_elems;
    uint64_t slot_bytes = round64((uint64_t)slot_elems * (uint64_t)slot_es);
    uint64_t total = round64((uint64_t)m->arena_bytes);
    mem->arena = (uint64_t)m->arena_bytes;
    if (__builtin_mul_overflow(slot_bytes, (uint64_t)m->nslot, &mem->slots) || acc_add(&total, mem->slots) ||
        acc_add(&total, shard_bytes))
        goto too_big;
    if (total == 0)
        total = ALIGN;
    if (total > (uint64_t)SIZE_MAX)
        goto too_big;
    mem->total = total;
    char *base = aligned_alloc(ALIGN, (size_t)total);
    if (!base) {
        err_set(1, "cannot allocate %" PRIu64 " bytes for this rank (%d ranks): %s", total, W, strerror(ENOMEM));
        return -1;
    }
    memset(base, 0, (size_t)total);
    *base_out = base;
    char *p = base;
    c->arena = p;
    p += round64((uint64_t)m->arena_bytes);
    for (int s = 0; s < m->nslot; s++) {
        c->slot[s] = p;
        p += slot_bytes;
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
    return 0;
too_big:
    err_set(1, "the model does not fit the address space of one rank at %d ranks", W);
    return -1;
}

/* constants and this rank's parameter shards from the init file */
static int load_init(RtCtx *c, int fd, const char *path)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->nconst; i++) {
        const RtConst *k = &m->cnst[i];
        if (k->nbytes > 0 && pread_all(fd, c->arena + k->arena_off, (uint64_t)k->nbytes, (uint64_t)k->file_off) != 0) {
            err_set(1, "reading init file %s: %s", path, strerror(errno));
            return -1;
        }
    }
    for (int u = 0; u < m->nunit; u++) {
        const RtUnit *un = &m->unit[u];
        int64_t es = rt_elem_size(un->dtype), L = c->shard_len[u];
        int64_t start = (int64_t)c->rank * L, end = start + L;
        if (end > un->numel)
            end = un->numel;
        if (start >= end)
            continue; /* all padding */
        if (pread_all(fd, c->shard[u * RT_NSTATE + RT_S_PARAM], (uint64_t)((end - start) * es),
                      (uint64_t)(un->file_off + start * es)) != 0) {
            err_set(1, "reading init file %s: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* --------------------------------------------------------------------- data */

typedef struct {
    NpyArray a;
    const char *file;
    int64_t rows;
    uint64_t row_bytes;
} Feed;

static int open_data(const RtModel *m, const Opts *o, Feed *feed)
{
    /* names: every --data must name an input, every input needs one */
    for (int k = 0; k < o->ndata; k++) {
        int found = 0;
        for (int i = 0; i < m->ninput; i++)
            found |= strcmp(m->input[i].name, o->data[k].name) == 0;
        if (!found) {
            char list[1024];
            size_t n = 0;
            list[0] = 0;
            for (int i = 0; i < m->ninput && n < sizeof list; i++)
                n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", m->input[i].name);
            err_set(1, "--data %s: the model has no input '%s' (model inputs: %s)", o->data[k].name,
                    o->data[k].name, m->ninput ? list : "none");
            return -1;
        }
    }
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        int k;
        for (k = 0; k < o->ndata; k++)
            if (strcmp(in->name, o->data[k].name) == 0)
                break;
        if (k == o->ndata) {
            char want[256];
            dims_str(want, sizeof want, in->rank, in->shape, 1);
            err_set(1, "no data for model input '%s' (%s %s): pass --data %s=FILE.npy", in->name,
                    npy_dtype_name(in->dtype), want, in->name);
            return -1;
        }
        feed[i].file = o->data[k].file;
    }
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        Feed *f = &feed[i];
        char why[1024];
        if (npy_open(f->file, &f->a, why, sizeof why) != 0) {
            err_set(1, "--data %s: %s", in->name, why);
            return -1;
        }
        int same = f->a.dtype == in->dtype && f->a.rank == in->rank;
        for (int d = 1; same && d < in->rank; d++)
            same = f->a.shape[d] == in->shape[d];
        if (!same) {
            char want[256], got[256];
            dims_str(want, sizeof want, in->rank, in->shape, 1);
            dims_str(got, sizeof got, f->a.rank, f->a.shape, 0);
            err_set(1, "--data %s: %s holds %s %s; input '%s' needs %s %s", in->name, f->file,
                    npy_dtype_name(f->a.dtype), got, in->name, npy_dtype_name(in->dtype), want);
            return -1;
        }
        f->rows = f->a.shape[0];
        if (f->rows < 1) {
            err_set(1, "--data %s: %s has no rows", in->name, f->file);
            return -1;
        }
        f->row_bytes = (uint64_t)f->a.nbytes / (uint64_t)f->rows;
        if (i > 0 && f->rows != feed[0].rows) {
            err_set(1, "data files disagree on the number of rows: %s has %" PRId64 ", %s has %" PRId64,
                    feed[0].file, feed[0].rows, f->file, f->rows);
            return -1;
        }
    }
    return 0;
}

/* (a + b) mod n for a, b in [0, n) without overflow */
static int64_t addmod(int64_t a, int64_t b, int64_t n) { return a >= n - b ? a - (n - b) : a + b; }

/* (a * k) mod n for a >= 0, k >= 0, n >= 1, without overflow */
static int64_t mulmod(int64_t a, int64_t k, int64_t n)
{
    int64_t r = 0;
    a %= n;
    while (k > 0) {
        if (k & 1)
            r = addmod(r, a, n);
        a = addmod(a, a, n);
        k >>= 1;
    }
    return r;
}

/* rows (pos + rank*b + i) mod N, i < b, of every input into the arena */
static void feed_batch(RtCtx *c, Feed *feed, int64_t pos)
{
    const RtModel *m = c->m;
    for (int i = 0; i < m->ninput; i++) {
        const RtInput *in = &m->input[i];
        Feed *f = &feed[i];
        int64_t b = in->shape[0], N = f->rows;
        int64_t r = addmod(pos, mulmod(b, c->rank, N), N);
        char *dst = c->arena + in->arena_off;
        int64_t left = b;
        while (left > 0) {
            int64_t run = N - r < left ? N - r : left;
            memcpy(dst, f->a.data + (uint64_t)r * f->row_bytes, (size_t)((uint64_t)run * f->row_bytes));
            dst += (uint64_t)run * f->row_bytes;
            left -= run;
            r = 0;
        }
    }
}

/* ------------------------------------------------------------------- output */

static void print_memory(const RtCtx *c, const Mem *mem, FILE *mf)
{
    uint64_t state = mem->param + mem->grad + mem->optim;
    printf("memory per rank: params %" PRIu64 " B, grads %" PRIu64 " B, optimizer %" PRIu64
           " B (state total %" PRIu64 " B of the whole model's %" PRIu64 " B), slots %" PRIu64
           " B, arena %" PRIu64 " B, total %" PRIu64 " B\n",
           mem->param, mem->grad, mem->optim, state, mem->model_state, mem->slots, mem->arena, mem->total);
    fflush(stdout);
    if (mf)
        fprintf(mf,
                "{\"memory\":{\"rank\":%d,\"world\":%d,\"param_bytes\":%" PRIu64 ",\"grad_bytes\":%" PRIu64
                ",\"optim_bytes\":%" PRIu64 ",\"state_bytes\":%" PRIu64 ",\"model_state_bytes\":%" PRIu64
                ",\"slot_bytes\":%" PRIu64 ",\"arena_bytes\":%" PRIu64 ",\"total_bytes\":%" PRIu64 "}}\n",
                c->rank, c->world, mem->param, mem->grad, mem->optim, state, mem->model_state, mem->slots,
                mem->arena, mem->total);
}

/* The shortest decimal that reads back as exactly v (v rounded to float
 * first when is_f32: then at most 9 digits, i.e. %.9g); "null" for NaN and
 * Inf, which JSON lacks. */
static void json_num(char *buf, size_t cap, double v, int is_f32)
{
    if (!isfinite(v)) {
        snprintf(buf, cap, "null");
        return;
    }
    for (int prec = is_f32 ? 6 : 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        double back = strtod(buf, NULL);
        if (is_f32 ? (float)back == (float)v : back == v)
            return;
    }
}

static int metrics_flush(FILE **mf, const char *path)
{
    if (*mf && (fflush(*mf) != 0 || ferror(*mf))) {
        fprintf(stderr, "%s: error: writing metrics file %s: %s (metrics stop here)\n", rt_prog, path,
                strerror(errno ? errno : EIO));
        fflush(stderr);
        fclose(*mf);
        *mf = NULL;
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------------- main */

int rt_main(int argc, char **argv, const RtModel *m)
{
    if (argc > 0 && argv[0] && argv[0][0])
        rt_prog = argv[0];
    g_main_thread = pthread_self();
    int provided = 0;
    /* FUNNELED: kernels may run OpenMP threads; only this thread calls MPI */
    int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "%s: error: MPI_Init failed (error %d)\n", rt_prog, rc);
        return 1;
    }
    g_mpi_up = 1;
    RT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    RT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    RT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &g_world));

    RtCtx ctx;
    memset(&ctx, 0, sizeof ctx);
    RtCtx *c = &ctx;
    c->m = m;
    c->rank = g_rank;
    c->world = g_world;

    Opts o;
    char *init_path = NULL, *base = NULL;
    int init_fd = -1;
    Feed *feed = NULL;
    FILE *mf = NULL;
    int status = 0, metrics_failed = 0;
    Mem mem;
    uint64_t init_size = 0;
    int64_t pos = 0, gstep = 0;

    int pf = parse_flags(argc, argv, m, &o);
    if ((status = err_sync()) != 0)
        goto out;
    if (pf == 1) {
        if (g_rank == 0)
            usage(m);
        goto out;
    }
    check_model(m);
    if ((status = err_sync()) != 0)
        goto out;

    /* optimizer hyper-parameters */
    if (m->optimizer == RT_ADAMW && o.set_momentum)
        warn0("--momentum has no effect: this model was built with --optimizer adamw");
    if (m->optimizer == RT_SGD && (o.set_beta1 || o.set_beta2 || o.set_eps))
        warn0("--beta1/--beta2/--eps have no effect: this model was built with --optimizer sgd");
    if (m->optimizer == RT_SGD && o.momentum != 0)
        for (int u = 0; u < m->nunit; u++)
            if (m->unit[u].nstate < 1) {
                err_set(1, "--momentum %g needs momentum buffers, which this build has none of "
                           "(unit '%s'); rebuild with momentum or drop --momentum", o.momentum, m->unit[u].name);
                break;
            }
    c->lr = o.lr;
    c->weight_decay = o.wd;
    c->momentum = o.momentum;
    c->beta1 = o.beta1;
    c->beta2 = o.beta2;
    c->eps = o.eps;
    if ((status = err_sync()) != 0)
        goto out;

    /* init file */
    init_path = o.init ? strdup(o.init) : default_init_path(argv[0] ? argv[0] : "");
    if (!init_path)
        err_set(1, "out of memory");
    else
        init_fd = open_init(m, init_path, o.init == NULL, &init_size);
    if ((status = err_sync()) != 0)
        goto out;

    /* memory */
    if (carve(c, &mem, &base) == 0)
        load_init(c, init_fd, init_path);
    if ((status = err_sync()) != 0)
        goto out;

    /* data */
    feed = calloc((size_t)m->ninput + 1, sizeof *feed);
    if (!feed)
        err_set(1, "out of memory");
    else
        open_data(m, &o, feed);
    if ((status = err_sync()) != 0)
        goto out;

    if (g_rank == 0 && o.export_path) {
        char why[1024];
        if (rt_export_check(m, o.export_path, why, sizeof why) != 0)
            err_set(1, "%s", why);
    }
    if (g_rank == 0 && o.metrics && !g_code) {
        mf = fopen(o.metrics, "w");
        if (!mf)
            err_set(1, "cannot open metrics file %s: %s", o.metrics, strerror(errno));
    }
    if ((status = err_sync()) != 0)
        goto out;

    if (g_rank == 0) {
        print_memory(c, &mem, mf);
        if (metrics_flush(&mf, o.metrics) != 0)
            metrics_failed = 1;
    }

    /* the step loop */
    /* step s starts at row (s * b * world) mod N */
    if (m->ninput > 0)
        gstep = mulmod(m->input[0].shape[0], g_world, feed[0].rows);
    for (int64_t s = 0; s < o.steps; s++) {
        c->step = s + 1;
        if (m->ninput > 0)
            feed_batch(c, feed, pos);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        m->step(c);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        double loss;
        if (m->loss_dtype == RT_F32) {
            float f;
            memcpy(&f, c->arena + m->loss_off, sizeof f);
            loss = f;
        } else {
            memcpy(&loss, c->arena + m->loss_off, sizeof loss);
        }
        if (g_rank == 0) {
            if (!o.quiet) {
                printf("step %lld/%lld  loss %.6f  %.2f ms\n", (long long)(s + 1), (long long)o.steps, loss, ms);
                fflush(stdout);
            }
            if (mf) {
                char lb[64], lrb[64];
                json_num(lb, sizeof lb, loss, m->loss_dtype == RT_F32);
                json_num(lrb, sizeof lrb, c->lr, 0);
                fprintf(mf, "{\"step\":%lld,\"loss\":%s,\"time_ms\":%.3f,\"lr\":%s}\n", (long long)(s + 1), lb, ms,
                        lrb);
                if (metrics_flush(&mf, o.metrics) != 0)
                    metrics_failed = 1;
            }
        }
        if (m->ninput > 0)
            pos = addmod(pos, gstep, feed[0].rows);
    }

    if (o.export_path && rt_export_onnx(c, o.export_path, init_fd, init_path) != 0)
        status = 1;
    if (g_rank == 0 && mf) {
        if (fclose(mf) != 0) {
            fprintf(stderr, "%s: error: writing metrics file %s: %s\n", rt_prog, o.metrics, strerror(errno));
            metrics_failed = 1;
        }
        mf = NULL;
    }
    RT_MPI(MPI_Bcast(&metrics_failed, 1, MPI_INT, 0, MPI_COMM_WORLD));
    if (metrics_failed)
        status = 1;

out:
    if (mf)
        fclose(mf);
    if (feed) {
        for (int i = 0; i < m->ninput; i++)
            npy_close(&feed[i].a);
        free(feed);
    }
    if (init_fd >= 0)
        close(init_fd);
    free(init_path);
    free(base);
    free(c->slot);
    free(c->shard);
    free(c->shard_len);
    if (o.data) {
        for (int k = 0; k < o.ndata; k++)
            free((char *)o.data[k].name);
        free(o.data);
    }
    fflush(stdout);
    MPI_Finalize();
    g_mpi_up = 0;
    return status;
}
