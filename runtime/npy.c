/* npy.c — strict, bounded reader of NumPy .npy files, and an atomic writer
 * of format 1.0 files (see npy.h); the SIGBUS guard of reads out of a
 * mapped data file that shrinks under the run (.npy and token files).
 *
 * Format (numpy.lib.format): "\x93NUMPY", major, minor, then the header
 * length (uint16 LE for 1.0, uint32 LE for 2.0 and 3.0), then the header: a
 * Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and ended by '\n', then the raw C-order data.
 */
#define _POSIX_C_SOURCE 200809L

#include "npy.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* every dtype code's .npy descr (NULL: none: numpy has no bfloat16), name
 * and element size: ir/dtypes.def's columns, indexed by rt.h's codes, which
 * must be the compiler's DType numbering (checked here, row by row) */
enum {
    NPY_UNDEF_,
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) NPY_##name,
#include "../ir/dtypes.def"
    NDTYPES
};
#define DTYPE(name, ctype, size, onnx, kdt, text, model, wide, kind, npy, numpy) \
    _Static_assert((int)NPY_##name == (int)RT_##name, "rt.h's RT_" #name " is not dtypes.def's row");
#include "../ir/dtypes.def"
static const struct {
    const char *descr, *name;
    size_t size;
} dtypes[NDTYPES] = {
#define DTYPE(name, ctype, sz, onnx, kdt, text, model, wide, kind, npy, numpy) [NPY_##name] = {npy, numpy, sz},
#include "../ir/dtypes.def"
};

const char *npy_dtype_name(int dtype) { return dtype > 0 && dtype < NDTYPES ? dtypes[dtype].name : "?"; }

/* a dtype's .npy element size (0: not a .npy dtype) */
size_t npy_elem_size(int dtype) { return dtype > 0 && dtype < NDTYPES && dtypes[dtype].descr ? dtypes[dtype].size : 0; }

/* bfloat16 is a step dtype (--precision bf16, a model's inputs) but no .npy dtype */
int64_t rt_elem_size(int dtype) { return dtype > 0 && dtype < NDTYPES ? (int64_t)dtypes[dtype].size : 0; }

/* ---- header dict parser: a cursor over [p, end) that never reads past end ---- */

typedef struct {
    const char *p, *end;
} Cur;

static void skip_ws(Cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int peek(Cur *c) { return c->p < c->end ? (unsigned char)*c->p : -1; }

static int accept(Cur *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* a quoted Python string without escapes; -1 if malformed or longer than cap-1 */
static int parse_str(Cur *c, char *out, size_t cap)
{
    skip_ws(c);
    int q = peek(c);
    if (q != '\'' && q != '"')
        return -1;
    c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= cap)
            return -1;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return -1; /* unterminated */
    c->p++;
    out[n] = 0;
    return 0;
}

static int match_word(Cur *c, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0)
        return 0;
    /* the word must end here (no "Falsey") */
    if ((size_t)(c->end - c->p) > n) {
        char nx = c->p[n];
        if ((nx >= 'a' && nx <= 'z') || (nx >= 'A' && nx <= 'Z') || (nx >= '0' && nx <= '9') || nx == '_')
            return 0;
    }
    c->p += n;
    return 1;
}

/* non-negative decimal integer (optional Python 2 'L' suffix); -1 bad, -2 overflow */
static int parse_dim(Cur *c, int64_t *out)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9')
        return -1;
    int64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        int d = *c->p - '0';
        if (v > (INT64_MAX - d) / 10)
            return -2;
        v = v * 10 + d;
        c->p++;
    }
    if (c->p < c->end && (*c->p == 'L' || *c->p == 'l'))
        c->p++;
    *out = v;
    return 0;
}

static int parse_shape(Cur *c, NpyArray *a, char *err, size_t errlen)
{
    if (!accept(c, '('))
        return fail(err, errlen, "bad header: 'shape' is not a tuple");
    int n = 0;
    int trailing_comma = 0;
    for (;;) {
        if (accept(c, ')'))
            break;
        if (n > 0 && !trailing_comma)
            return fail(err, errlen, "bad header: malformed 'shape' tuple");
        int64_t d;
        int rc = parse_dim(c, &d);
        if (rc == -2)
            return fail(err, errlen, "bad header: a dimension of 'shape' overflows int64");
        if (rc < 0)
            return fail(err, errlen, "bad header: malformed 'shape' tuple");
        if (n >= RT_MAX_RANK)
            return fail(err, errlen, "arrays of more than %d dimensions are not supported", RT_MAX_RANK);
        a->shape[n++] = d;
        trailing_comma = accept(c, ',');
    }
    /* Python: "(5)" is the int 5, not a tuple */
    if (n == 1 && !trailing_comma)
        return fail(err, errlen, "bad header: malformed 'shape' tuple (a 1-tuple needs a comma)");
    a->rank = n;
    return 0;
}

static int parse_descr(const char *d, NpyArray *a, char *err, size_t errlen)
{
    for (int i = 1; i < NDTYPES; i++)
        if (dtypes[i].descr && strcmp(d, dtypes[i].descr) == 0) {
            a->dtype = i;
            return 0;
        }
    if (d[0] == '>')
        return fail(err, errlen,
                    "big-endian dtype '%s' is not supported; save it as little-endian "
                    "(arr.astype(arr.dtype.newbyteorder('<')))", d);
    return fail(err, errlen,
                "unsupported dtype '%s' (supported: float32 '<f4', float64 '<f8', float16 '<f2', bool '|b1' and "
                "the integers '|i1', '|u1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8')", d);
}

static int parse_header(const char *h, size_t hl, NpyArray *a, char *err, size_t errlen)
{
    for (size_t i = 0; i < hl; i++) {
        unsigned char ch = (unsigned char)h[i];
        if (ch >= 0x7f || (ch < 0x20 && ch != '\n' && ch != '\t' && ch != '\r'))
            return fail(err, errlen, "bad header: unexpected byte 0x%02x at header offset %zu", ch, i);
    }
    Cur c = {h, h + hl};
    if (!accept(&c, '{'))
        return fail(err, errlen, "bad header: not a dict");
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    int first = 1;
    for (;;) {
        if (accept(&c, '}'))
            break;
        if (!first && !accept(&c, ','))
            return fail(err, errlen, "bad header: expected ',' or '}' in the dict");
        if (!first && accept(&c, '}'))
            break; /* trailing comma */
        first = 0;
        char key[32];
        if (parse_str(&c, key, sizeof key) != 0)
            return fail(err, errlen, "bad header: malformed dict key");
        if (!accept(&c, ':'))
            return fail(err, errlen, "bad header: expected ':' after '%s'", key);
        skip_ws(&c);
        if (strcmp(key, "descr") == 0) {
            if (have_descr++)
                return fail(err, errlen, "bad header: duplicate key 'descr'");
            char d[32];
            if (peek(&c) == '[')
                return fail(err, errlen, "structured dtypes are not supported");
            if (parse_str(&c, d, sizeof d) != 0)
                return fail(err, errlen, "bad header: malformed 'descr'");
            if (parse_descr(d, a, err, errlen) != 0)
                return -1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (have_fortran++)
                return fail(err, errlen, "bad header: duplicate key 'fortran_order'");
            if (match_word(&c, "True"))
                return fail(err, errlen,
                            "Fortran-order arrays are not supported; save numpy.ascontiguousarray(arr)");
            if (!match_word(&c, "False"))
                return fail(err, errlen, "bad header: 'fortran_order' is not True or False");
        } else if (strcmp(key, "shape") == 0) {
            if (have_shape++)
                return fail(err, errlen, "bad header: duplicate key 'shape'");
            if (parse_shape(&c, a, err, errlen) != 0)
                return -1;
        } else {
            return fail(err, errlen, "bad header: unknown key '%s'", key);
        }
    }
    skip_ws(&c);
    if (c.p != c.end)
        return fail(err, errlen, "bad header: unexpected text after the dict");
    if (!have_descr)
        return fail(err, errlen, "bad header: missing key 'descr'");
    if (!have_fortran)
        return fail(err, errlen, "bad header: missing key 'fortran_order'");
    if (!have_shape)
        return fail(err, errlen, "bad header: missing key 'shape'");
    return 0;
}

int npy_parse(const void *buf, size_t len, NpyArray *a, char *err, size_t errlen)
{
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    const unsigned char *b = buf;
    memset(a, 0, sizeof *a);
    if (len < 10)
        return fail(err, errlen, "not a .npy file (only %zu bytes)", len);
    if (memcmp(b, magic, 6) != 0)
        return fail(err, errlen, "not a .npy file (bad magic)");
    int major = b[6], minor = b[7];
    size_t pre, hl;
    if (major == 1 && minor == 0) {
        pre = 10;
        hl = (size_t)b[8] | (size_t)b[9] << 8;
    } else if ((major == 2 || major == 3) && minor == 0) {
        pre = 12;
        if (len < pre)
            return fail(err, errlen, "truncated .npy header");
        hl = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
    } else {
        return fail(err, errlen, "unsupported .npy format version %d.%d (supported: 1.0, 2.0, 3.0)",
                    major, minor);
    }
    if (hl > len - pre)
        return fail(err, errlen, "truncated .npy header (header length %zu, file has %zu bytes)",
                    hl, len);
    a->major = major;
    a->minor = minor;
    if (parse_header((const char *)b + pre, hl, a, err, errlen) != 0)
        return -1;
    size_t es = npy_elem_size(a->dtype);
    uint64_t numel = 1;
    for (int i = 0; i < a->rank; i++)
        if (__builtin_mul_overflow(numel, (uint64_t)a->shape[i], &numel) || numel > (uint64_t)INT64_MAX)
            return fail(err, errlen, "bad header: shape is too large (element count overflows)");
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)es, &nbytes) || nbytes > (uint64_t)INT64_MAX ||
        nbytes > (uint64_t)SIZE_MAX)
        return fail(err, errlen, "bad header: shape is too large (byte count overflows)");
    size_t off = pre + hl;
    if (nbytes > len - off)
        return fail(err, errlen, "truncated: the header promises %llu data bytes, the file holds %zu",
                    (unsigned long long)nbytes, len - off);
    a->numel = (int64_t)numel;
    a->nbytes = (size_t)nbytes;
    a->data = (const char *)b + off;
    return 0;
}

int npy_open(const char *path, NpyArray *a, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    struct stat st;
    int fd = rt_open_regular(path, &st);
    if (fd < 0)
        return fail(err, errlen, "%s: %s", path, rt_open_why(fd));
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return fail(err, errlen, "%s: file too large to map", path);
    }
    size_t len = (size_t)st.st_size;
    void *map = NULL;
    if (len > 0) {
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fail(err, errlen, "%s: mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    static const char empty[1];
    char why[512];
    if (npy_parse(map ? map : empty, len, a, why, sizeof why) != 0) {
        if (map)
            munmap(map, len);
        memset(a, 0, sizeof *a);
        return fail(err, errlen, "%s: %s", path, why);
    }
    a->map = map;
    a->map_len = len;
    a->path = strdup(path);
    if (!a->path) {
        npy_close(a);
        return fail(err, errlen, "%s: out of memory", path);
    }
    return 0;
}

void npy_close(NpyArray *a)
{
    if (a->map)
        munmap(a->map, a->map_len);
    free(a->path);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------- reads of a file that shrinks
 * Why a handler and not pread: the data is read where it lies, a row or a
 * token window at a time; a guard costs one sigsetjmp (no mask saved: a few
 * ns) per batch, a pread one system call per row or window (--shuffle reads
 * rows one by one).  Measured on this machine (AMD EPYC, 2026-11-26), a batch of
 * 32 rows of 64 B at random places of a cached file: 0.1-0.2 us by memcpy
 * from the map under the guard (as without it), 31-37 us by pread, against
 * 25 us for a whole step of examples/mlp.onnx at batch 32. */

static struct sigaction g_old_bus;      /* the handler before ours */
static _Thread_local sigjmp_buf *t_jb;  /* this thread's guarded read, or NULL */
static _Thread_local const void *t_at;  /* where the last caught fault read */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    sigjmp_buf *jb = t_jb;
    if (jb && si->si_code == BUS_ADRERR) { /* a guarded read past a mapped file's end */
        t_jb = NULL;
        t_at = si->si_addr;
        siglongjmp(*jb, 1);
    }
    if (g_old_bus.sa_flags & SA_SIGINFO) {
        g_old_bus.sa_sigaction(sig, si, uc);
    } else if (g_old_bus.sa_handler != SIG_DFL && g_old_bus.sa_handler != SIG_IGN) {
        g_old_bus.sa_handler(sig);
    } else { /* as if we were not here: the signal ends the process */
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
    }
}

int rt_map_guard_install(void)
{
    static int done;
    if (done++)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER; /* not blocked in the handler: siglongjmp needs no mask restored */
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &g_old_bus);
}

void rt_map_guard_begin(void *jb) { t_jb = jb; }

void rt_map_guard_end(void) { t_jb = NULL; }

const void *rt_map_fault(void) { return t_at; }

/* ------------------------------------------------------------------ writer */

static const char *descr_of(int dtype) { return dtype > 0 && dtype < NDTYPES ? dtypes[dtype].descr : NULL; }

size_t npy_header(char *buf, size_t cap, int dtype, int rank, const int64_t *shape)
{
    const char *descr = descr_of(dtype);
    if (!descr || rank < 0 || rank > RT_MAX_RANK || cap < 16)
        return 0;
    char dict[320]; /* at most ~230: 8 dims of 19 digits */
    size_t n = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < rank; d++) {
        if (shape[d] < 0)
            return 0;
        n += (size_t)snprintf(dict + n, sizeof dict - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    }
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", rank == 1 ? "," : "");
    if (n >= sizeof dict)
        return 0;
    size_t total = (10 + n + 1 + 63) / 64 * 64; /* magic+version+len, dict, '\n' */
    if (total > cap)
        return 0;
    size_t hl = total - 10;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (char)(hl & 0xff);
    buf[9] = (char)(hl >> 8);
    memcpy(buf + 10, dict, n);
    memset(buf + 10 + n, ' ', total - 10 - n - 1);
    buf[total - 1] = '\n';
    return total;
}

int rt_open_regular(const char *path, struct stat *st)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    int flags;
    if (fstat(fd, st) != 0 || (flags = fcntl(fd, F_GETFL)) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return -2;
    }
    if (fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

const char *rt_open_why(int rc)
{
    return rc == -2 ? "not a regular file (a FIFO, device or directory is never read: pass a file)" : strerror(errno);
}

int rt_pread_all(int fd, void *buf, uint64_t n, uint64_t off)
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
            errno = EIO; /* shorter than promised: the file shrank under us */
            return -1;
        }
        p += r;
        n -= (uint64_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

int npy_save(const char *path, int dtype, int rank, const int64_t *shape, const void *data,
             char *err, size_t errlen)
{
    char hdr[256];
    size_t hn = npy_header(hdr, sizeof hdr, dtype, rank, shape);
    if (hn == 0)
        return fail(err, errlen, "%s: cannot describe dtype code %d, rank %d as .npy", path, dtype, rank);
    uint64_t nbytes = npy_elem_size(dtype);
    for (int d = 0; d < rank; d++)
        if (__builtin_mul_overflow(nbytes, (uint64_t)shape[d], &nbytes) || nbytes > (uint64_t)SIZE_MAX)
            return fail(err, errlen, "%s: array too large", path);
    RtAFile f;
    if (rt_afile_open(&f, path, 0666) != 0)
        return fail(err, errlen, "cannot create %s: %s", path, strerror(errno));
    if (rt_write_all(f.fd, hdr, hn) != 0 || rt_write_all(f.fd, data, (size_t)nbytes) != 0) {
        int e = errno;
        rt_afile_abort(&f);
        return fail(err, errlen, "writing %s: %s", path, strerror(e));
    }
    if (rt_afile_commit(&f) != 0)
        return fail(err, errlen, "writing %s: %s", path, strerror(errno));
    return 0;
}

int npy_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}
