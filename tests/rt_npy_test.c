/* rt_npy_test.c — standalone test of the runtime's .npy reader (runtime/npy.c).
 *
 * Writes its own files (every supported dtype, format versions 1.0/2.0/3.0,
 * scalar and 1-tuple shapes) and a set of broken ones (truncated, bad magic,
 * Fortran order, malformed headers, overflowing shapes, ...), then checks
 * that good files parse to the right dtype/shape/values and bad ones are
 * rejected with a sensible message and without crashing.  Also runtime/afile.c
 * (atomic, link-safe writes; the staged pair fsdpc installs) and
 * runtime/isum.c (the init file's checksum: it splits at any word).
 * Build: cc -std=c11 -Iruntime tests/rt_npy_test.c runtime/npy.c runtime/afile.c runtime/isum.c
 * Exit status 0 on success, 1 (with messages) on failure.
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "isum.h"
#include "npy.h"

static int failures;
static char tmpdir[] = "/tmp/rt_npy_test.XXXXXX";

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    failures++;
}

/* an .npy image: magic, version, header length, header (padded like numpy
 * to a multiple of 64 with spaces and '\n' unless pad == 0), then data */
typedef struct {
    unsigned char *b;
    size_t n;
} Buf;

static Buf make_npy(int major, int minor, const char *header, int pad, const void *data, size_t ndata)
{
    size_t pre = major == 1 ? 10 : 12;
    size_t hl = strlen(header);
    size_t total_h = hl;
    if (pad) {
        total_h = hl + 1; /* '\n' */
        while ((pre + total_h) % 64)
            total_h++;
    }
    Buf o;
    o.n = pre + total_h + ndata;
    o.b = malloc(o.n ? o.n : 1);
    if (!o.b) {
        perror("malloc");
        exit(1);
    }
    memcpy(o.b, "\x93NUMPY", 6);
    o.b[6] = (unsigned char)major;
    o.b[7] = (unsigned char)minor;
    if (major == 1) {
        o.b[8] = (unsigned char)(total_h & 0xff);
        o.b[9] = (unsigned char)(total_h >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            o.b[8 + i] = (unsigned char)(total_h >> (8 * i));
    }
    memcpy(o.b + pre, header, hl);
    if (pad) {
        memset(o.b + pre + hl, ' ', total_h - hl);
        o.b[pre + total_h - 1] = '\n';
    }
    if (ndata)
        memcpy(o.b + pre + total_h, data, ndata);
    return o;
}

static void write_file(const char *path, const Buf *b)
{
    FILE *f = fopen(path, "wb");
    if (!f || (b->n && fwrite(b->b, 1, b->n, f) != b->n) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* parse from memory AND through a file; both must agree */
static int parse_both(const char *name, const Buf *b, NpyArray *a, char *err, size_t errlen)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.npy", tmpdir, name);
    write_file(path, b);
    NpyArray m;
    char merr[512] = "";
    int rm = npy_parse(b->b, b->n, &m, merr, sizeof merr);
    int rf = npy_open(path, a, err, errlen);
    unlink(path); /* a mapping outlives the name */
    if (rm != rf)
        failf("%s: npy_parse returned %d but npy_open %d (%s | %s)", name, rm, rf, merr, err);
    if (rf == 0 && rm == 0) {
        if (m.dtype != a->dtype || m.rank != a->rank || m.numel != a->numel || m.nbytes != a->nbytes ||
            memcmp(m.data, a->data, a->nbytes) != 0)
            failf("%s: npy_parse and npy_open disagree", name);
    }
    if (rf != 0 && strstr(err, path) == NULL)
        failf("%s: npy_open's message does not name the file: %s", name, err);
    return rf;
}

static void expect_ok(const char *name, int major, const char *header, int pad, const void *data, size_t ndata,
                      int dtype, int rank, const int64_t *shape)
{
    Buf b = make_npy(major, 0, header, pad, data, ndata);
    NpyArray a;
    char err[512] = "";
    if (parse_both(name, &b, &a, err, sizeof err) != 0) {
        failf("%s: rejected a good file: %s", name, err);
        free(b.b);
        return;
    }
    if (a.dtype != dtype)
        failf("%s: dtype %d, expected %d", name, a.dtype, dtype);
    if (a.rank != rank)
        failf("%s: rank %d, expected %d", name, a.rank, rank);
    int64_t numel = 1;
    for (int i = 0; i < rank && i < a.rank; i++) {
        if (a.shape[i] != shape[i])
            failf("%s: shape[%d] = %lld, expected %lld", name, i, (long long)a.shape[i], (long long)shape[i]);
        numel *= shape[i];
    }
    if (a.numel != numel)
        failf("%s: numel %lld, expected %lld", name, (long long)a.numel, (long long)numel);
    if (a.nbytes != (size_t)numel * npy_elem_size(dtype))
        failf("%s: nbytes %zu", name, a.nbytes);
    if (a.major != major || a.minor != 0)
        failf("%s: version %d.%d", name, a.major, a.minor);
    if (a.nbytes && (a.nbytes > ndata || memcmp(a.data, data, a.nbytes) != 0))
        failf("%s: data differs", name);
    npy_close(&a);
    free(b.b);
}

/* must be rejected; the message must contain `want` */
static void expect_bad_buf(const char *name, const Buf *b, const char *want)
{
    NpyArray a;
    char err[512] = "";
    if (parse_both(name, b, &a, err, sizeof err) == 0) {
        failf("%s: accepted a bad file", name);
        npy_close(&a);
        return;
    }
    if (want && strstr(err, want) == NULL)
        failf("%s: message '%s' lacks '%s'", name, err, want);
    if (strchr(err, '\n'))
        failf("%s: message is not one line: '%s'", name, err);
}

static void expect_bad(const char *name, int major, int minor, const char *header, const void *data, size_t ndata,
                       const char *want)
{
    Buf b = make_npy(major, minor, header, 1, data, ndata);
    expect_bad_buf(name, &b, want);
    free(b.b);
}

/* the folder's entries but . and .. */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

static void read_back(const char *path, const char *want, const char *what)
{
    char got[64] = "";
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(got, 1, sizeof got - 1, f) : 0;
    if (f)
        fclose(f);
    got[n] = 0;
    if (strcmp(got, want))
        failf("%s: %s holds '%s', expected '%s'", what, path, got, want);
}

/* afile.c: atomic writes replace a planted link instead of following it; folder removal never follows one */
static void afile_tests(void)
{
    char dir[64], victim[400], out[400], p[400];
    snprintf(dir, sizeof dir, "%s/out", tmpdir);
    snprintf(victim, sizeof victim, "%s/victim", tmpdir);
    snprintf(out, sizeof out, "%s/t.st", dir);
    mkdir(dir, 0755);
    write_file(victim, &(Buf){(unsigned char *)"precious", 8});
    if (symlink(victim, out) != 0)
        failf("symlink: %s", strerror(errno));
    if (rt_afile_write(out, "new", 3, 0644) != 0)
        failf("rt_afile_write through a link's name: %s", strerror(errno));
    struct stat st;
    if (lstat(out, &st) != 0 || !S_ISREG(st.st_mode))
        failf("rt_afile_write: %s is not a regular file after the write", out);
    read_back(out, "new", "written");
    read_back(victim, "precious", "the link's target");
    if (count_entries(dir) != 1)
        failf("rt_afile_write left %d entries in %s (a temporary?)", count_entries(dir), dir);
    RtAFile f;
    if (rt_afile_open(&f, out, 0644) != 0 || rt_write_all(f.fd, "half", 4) != 0)
        failf("rt_afile_open: %s", strerror(errno));
    rt_afile_abort(&f);
    read_back(out, "new", "after an aborted write");
    if (count_entries(dir) != 1)
        failf("rt_afile_abort left %d entries in %s", count_entries(dir), dir);
    snprintf(p, sizeof p, "%s/", dir);
    if (rt_afile_write(p, "x", 1, 0644) == 0 || errno != EISDIR)
        failf("rt_afile_write of a folder's path: %s", strerror(errno));
    if (rt_afile_write(dir, "x", 1, 0644) == 0 || errno != EISDIR)
        failf("rt_afile_write over a folder: %s", strerror(errno));
    /* a stream is written in place: /dev/null stays the device (a rename would make it a file, as root) */
    struct stat before;
    if (stat("/dev/null", &before) != 0 || rt_afile_write("/dev/null", "x", 1, 0644) != 0 ||
        lstat("/dev/null", &st) != 0 || !S_ISCHR(st.st_mode) || st.st_ino != before.st_ino)
        failf("rt_afile_write to /dev/null: %s, or it is no longer the device", strerror(errno));
    char fifo[400];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    int rfd = mkfifo(fifo, 0600) == 0 ? open(fifo, O_RDONLY | O_NONBLOCK) : -1; /* a reader: the write's open returns */
    char got[8] = "";
    if (rfd < 0 || rt_afile_write(fifo, "pipe", 4, 0644) != 0 || read(rfd, got, sizeof got - 1) != 4 ||
        strcmp(got, "pipe") || lstat(fifo, &st) != 0 || !S_ISFIFO(st.st_mode))
        failf("rt_afile_write to a FIFO: %s; read '%s'", strerror(errno), got);
    if (rfd >= 0)
        close(rfd);
    unlink(fifo);
    /* a link planted in a folder's place: removing the folder removes the link, not the target's files */
    char important[64];
    snprintf(important, sizeof important, "%s/important", tmpdir);
    mkdir(important, 0755);
    snprintf(p, sizeof p, "%s/keep", important);
    write_file(p, &(Buf){(unsigned char *)"k", 1});
    snprintf(p, sizeof p, "%s/.step.tmp", dir);
    if (symlink(important, p) != 0)
        failf("symlink: %s", strerror(errno));
    int dfd = rt_dir_open(dir);
    if (dfd < 0 || rt_dir_remove(dfd, ".step.tmp") != 0)
        failf("rt_dir_remove of a link: %s", strerror(errno));
    if (lstat(p, &st) == 0 || count_entries(important) != 1)
        failf("rt_dir_remove followed a link: %s has %d entries", important, count_entries(important));
    /* a real folder is removed with its files */
    mkdir(p, 0755);
    snprintf(victim, sizeof victim, "%s/.step.tmp/rank-0", dir);
    write_file(victim, &(Buf){(unsigned char *)"r", 1});
    if (rt_dir_remove(dfd, ".step.tmp") != 0 || lstat(p, &st) == 0)
        failf("rt_dir_remove of a folder: %s", strerror(errno));
    if (rt_dir_open(out) >= 0 || rt_dir_openat(dfd, "t.st") >= 0)
        failf("rt_dir_open opened a file");
    /* a stream over a link's name; rt_afile_openat; a published file is there before the commit */
    unlink(out);
    snprintf(victim, sizeof victim, "%s/victim", tmpdir);
    if (symlink(victim, out) != 0)
        failf("symlink: %s", strerror(errno));
    FILE *fp = rt_afile_fopen(&f, out, 0644);
    if (!fp || fprintf(fp, "stream") < 0 || rt_afile_commit(&f) != 0)
        failf("rt_afile_fopen through a link's name: %s", strerror(errno));
    read_back(out, "stream", "rt_afile_fopen");
    read_back(victim, "precious", "the link's target (stream)");
    unlink(out);
    if (symlink(victim, out) != 0)
        failf("symlink: %s", strerror(errno));
    if (rt_afile_openat(&f, dfd, "t.st", 0644) != 0 || rt_afile_openat(&(RtAFile){0}, dfd, "a/b", 0644) == 0)
        failf("rt_afile_openat: %s (or it took a name with a slash)", strerror(errno));
    if (!(f.fp = fdopen(f.fd, "w")) || fputs("line 1\n", f.fp) < 0 || fflush(f.fp) != 0 || rt_afile_publish(&f) != 0)
        failf("rt_afile_publish: %s", strerror(errno));
    read_back(out, "line 1\n", "published before the commit");
    if (fputs("line 2\n", f.fp) < 0 || rt_afile_commit(&f) != 0)
        failf("rt_afile_commit of a published file: %s", strerror(errno));
    read_back(out, "line 1\nline 2\n", "published, then committed");
    read_back(victim, "precious", "the link's target (published)");
    if (count_entries(dir) != 1)
        failf("rt_afile_openat/publish left %d entries in %s", count_entries(dir), dir);
    /* identity: ./x and x, a hard link, a file not there */
    char dot[420], hard[420];
    snprintf(dot, sizeof dot, "%s/./t.st", dir);
    snprintf(hard, sizeof hard, "%s/hard", dir);
    if (link(out, hard) != 0 || !rt_same_file(out, dot) || !rt_same_file(hard, out) || rt_same_file(out, victim) ||
        rt_same_file(out, p))
        failf("rt_same_file: wrong answer (%s)", strerror(errno));
    unlink(hard);
    close(dfd);
    snprintf(p, sizeof p, "%s/keep", important);
    unlink(p), rmdir(important), unlink(out), rmdir(dir);
    snprintf(p, sizeof p, "%s/victim", tmpdir);
    unlink(p);
}

/* afile.c's two-step replacement (what fsdpc does with OUT.init): staged under a name a reader finds, PATH
 * untouched until the commit; a planted link at that name replaced, not followed; an abort after the stage
 * removes it.  rt_dir_mktemp's folder is private; rt_afile_install moves a file in. */
static void afile_stage_tests(void)
{
    char dir[64], out[400], name[400], victim[400];
    snprintf(dir, sizeof dir, "%s/stage", tmpdir);
    snprintf(out, sizeof out, "%s/t.init", dir);
    snprintf(name, sizeof name, "%s/.t.init.id", dir);
    snprintf(victim, sizeof victim, "%s/victim2", tmpdir);
    mkdir(dir, 0755);
    write_file(out, &(Buf){(unsigned char *)"old", 3});
    write_file(victim, &(Buf){(unsigned char *)"precious", 8});
    if (symlink(victim, name) != 0)
        failf("symlink: %s", strerror(errno));
    RtAFile f;
    if (rt_afile_open(&f, out, 0644) != 0 || rt_write_all(f.fd, "new", 3) != 0 || rt_afile_stage(&f, ".t.init.id"))
        failf("rt_afile_stage: %s", strerror(errno));
    read_back(out, "old", "PATH before the commit");
    read_back(name, "new", "the staged name");
    read_back(victim, "precious", "a link planted at the staged name: its target");
    if (rt_afile_commit(&f) != 0)
        failf("rt_afile_commit after a stage: %s", strerror(errno));
    read_back(out, "new", "PATH after the commit");
    if (count_entries(dir) != 1)
        failf("stage + commit left %d entries in %s", count_entries(dir), dir);
    if (rt_afile_open(&f, out, 0644) != 0 || rt_afile_stage(&f, ".t.init.id") != 0)
        failf("rt_afile_stage: %s", strerror(errno));
    rt_afile_abort(&f);
    if (count_entries(dir) != 1)
        failf("stage + abort left %d entries in %s", count_entries(dir), dir);
    /* a private folder, and a file made in it moved over PATH */
    char *base = NULL, priv[300], priv2[300];
    int dfd = rt_parent_open(out, &base);
    if (dfd < 0 || strcmp(base, "t.init"))
        failf("rt_parent_open(%s): %s, base %s", out, strerror(errno), base ? base : "(none)");
    struct stat st;
    if (rt_dir_mktemp(dfd, ".t.build", priv, sizeof priv) != 0 || rt_dir_mktemp(dfd, ".t.build", priv2, sizeof priv2) ||
        !strcmp(priv, priv2) || fstatat(dfd, priv, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        (st.st_mode & 0777) != 0700)
        failf("rt_dir_mktemp: %s (%s, %s, mode %o)", strerror(errno), priv, priv2, (unsigned)st.st_mode & 0777);
    int pfd = rt_dir_openat(dfd, priv);
    int fd = pfd >= 0 ? openat(pfd, "exe", O_WRONLY | O_CREAT | O_EXCL, 0755) : -1;
    if (fd < 0 || rt_write_all(fd, "exe", 3) != 0 || close(fd) != 0 || rt_afile_install(pfd, "exe", dfd, "t.init"))
        failf("rt_afile_install: %s", strerror(errno));
    read_back(out, "exe", "after rt_afile_install");
    close(pfd);
    if (rt_dir_remove(dfd, priv) != 0 || rt_dir_remove(dfd, priv2) != 0 || count_entries(dir) != 1)
        failf("private folders left: %d entries in %s", count_entries(dir), dir);
    free(base);
    close(dfd);
    unlink(out), rmdir(dir), unlink(victim);
}

/* isum.c: one flipped bit anywhere changes the checksum; the sum of shares split at any word is the whole's */
static void isum_tests(void)
{
    enum { N = 1000 };
    static unsigned char buf[8 * N];
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < sizeof buf; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        buf[i] = (unsigned char)x;
    }
    uint64_t whole = rt_isum(buf, N, 5);
    for (int cut = 0; cut <= N; cut += 37)
        if (rt_isum(buf, (uint64_t)cut, 5) + rt_isum(buf + 8 * cut, (uint64_t)(N - cut), 5 + (uint64_t)cut) != whole)
            failf("isum: the shares split at word %d do not add up to the whole", cut);
    for (size_t bit = 0; bit < 8 * sizeof buf; bit += 61) {
        buf[bit / 8] ^= (unsigned char)(1u << bit % 8);
        if (rt_isum(buf, N, 5) == whole)
            failf("isum: flipping bit %zu leaves the checksum unchanged", bit);
        buf[bit / 8] ^= (unsigned char)(1u << bit % 8);
    }
    if (rt_isum(buf, N, 6) == whole)
        failf("isum: the words' position does not count");
    unsigned char two[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    if (rt_isum(two, 2, 0) != 0x44dd9603019163c7ull) /* the file format: fsdpc and every executable agree */
        failf("isum: the checksum of 1..16 is %#llx", (unsigned long long)rt_isum(two, 2, 0));
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }

    /* ---- good files ---- */
    float f32[6] = {1.5f, -2, 3, 4.25f, 5, -6};
    double f64[6] = {1.5, -2, 3e100, 4.25, 5, -6};
    int64_t i64[6] = {1, -2, INT64_MAX, INT64_MIN, 5, 6};
    int32_t i32[6] = {1, -2, 3, 2147483647, 5, -6};
    unsigned char b1[6] = {1, 0, 1, 1, 0, 0};
    int64_t s23[2] = {2, 3}, s6[1] = {6}, s5[1] = {5}, s0[1] = {0};
    static const int versions[3] = {1, 2, 3};
    for (int v = 0; v < 3; v++) {
        int mj = versions[v];
        char name[64];
        snprintf(name, sizeof name, "f32_v%d", mj);
        expect_ok(name, mj, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 1, f32, sizeof f32,
                  RT_F32, 2, s23);
        snprintf(name, sizeof name, "f64_v%d", mj);
        expect_ok(name, mj, "{'descr': '<f8', 'fortran_order': False, 'shape': (6,), }", 1, f64, sizeof f64,
                  RT_F64, 1, s6);
        snprintf(name, sizeof name, "i64_v%d", mj);
        expect_ok(name, mj, "{'descr': '<i8', 'fortran_order': False, 'shape': (3, 2), }", 1, i64, sizeof i64,
                  RT_I64, 2, (const int64_t[]){3, 2});
        snprintf(name, sizeof name, "i32_v%d", mj);
        expect_ok(name, mj, "{'descr': '<i4', 'fortran_order': False, 'shape': (6,), }", 1, i32, sizeof i32,
                  RT_I32, 1, s6);
        snprintf(name, sizeof name, "b1_v%d", mj);
        expect_ok(name, mj, "{'descr': '|b1', 'fortran_order': False, 'shape': (1, 6), }", 1, b1, sizeof b1,
                  RT_BOOL, 2, (const int64_t[]){1, 6});
    }
    expect_ok("scalar", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 1, f32, 4, RT_F32, 0, s6);
    expect_ok("one_tuple", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, f32, 20, RT_F32, 1,
              s5);
    expect_ok("empty", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (0,), }", 1, NULL, 0, RT_F64, 1, s0);
    expect_ok("reordered_dquotes_nopad", 2,
              "{\"shape\": (2,3), \"fortran_order\": False, \"descr\": \"<f4\"}", 0, f32, sizeof f32, RT_F32, 2,
              s23);
    expect_ok("py2_long", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 1, f32,
              sizeof f32, RT_F32, 2, s23);
    expect_ok("trailing_bytes", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 1, f32,
              sizeof f32, RT_F32, 1, s5);
    expect_ok("eight_dims", 1,
              "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 2, 3), }", 1, f32,
              sizeof f32, RT_F32, 8, (const int64_t[]){1, 1, 1, 1, 1, 1, 2, 3});

    /* ---- bad files ---- */
    const char *okh = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    expect_bad("truncated_data", 1, 0, okh, f32, sizeof f32 - 1, "truncated");
    expect_bad("no_data", 3, 0, okh, NULL, 0, "truncated");
    {
        Buf b = make_npy(1, 0, okh, 1, f32, sizeof f32);
        b.b[0] = 'X';
        expect_bad_buf("bad_magic", &b, "magic");
        b.n = 40; /* cut inside the header */
        b.b[0] = 0x93;
        expect_bad_buf("truncated_header", &b, "truncated");
        b.n = 9;
        expect_bad_buf("too_short", &b, "not a .npy");
        b.n = 0;
        expect_bad_buf("empty_file", &b, "not a .npy");
        free(b.b);
    }
    {
        /* header length field pointing far beyond the file (v2: 32-bit length) */
        Buf b = make_npy(2, 0, okh, 1, f32, sizeof f32);
        b.b[8] = 0xff;
        b.b[9] = 0xff;
        b.b[10] = 0xff;
        b.b[11] = 0xff;
        expect_bad_buf("huge_header_len", &b, "truncated");
        free(b.b);
    }
    expect_bad("version_4", 4, 0, okh, f32, sizeof f32, "version");
    expect_bad("version_1_1", 1, 1, okh, f32, sizeof f32, "version");
    expect_bad("fortran", 1, 0, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f32, sizeof f32,
               "Fortran");
    expect_ok("uint8", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (6,), }", 1, b1, sizeof b1, RT_U8, 1,
              s6);
    expect_ok("uint16", 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (6,), }", 1, f32, 12, RT_U16, 1, s6);
    expect_ok("uint64", 1, "{'descr': '<u8', 'fortran_order': False, 'shape': (3,), }", 1, f32, 24, RT_U64, 1,
              (const int64_t[]){3});
    expect_ok("float16", 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (6,), }", 1, f32, 12, RT_F16, 1, s6);
    expect_bad("complex", 1, 0, "{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", f32, 24,
               "unsupported dtype");
    expect_bad("big_endian", 1, 0, "{'descr': '>f4', 'fortran_order': False, 'shape': (6,), }", f32, 24,
               "big-endian");
    expect_bad("void", 1, 0, "{'descr': '<V2', 'fortran_order': False, 'shape': (6,), }", f32, 24,
               "unsupported dtype");
    expect_bad("structured", 1, 0, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", f32,
               24, "structured");
    expect_bad("missing_shape", 1, 0, "{'descr': '<f4', 'fortran_order': False, }", f32, 24, "shape");
    expect_bad("missing_descr", 1, 0, "{'fortran_order': False, 'shape': (6,), }", f32, 24, "descr");
    expect_bad("missing_fortran", 1, 0, "{'descr': '<f4', 'shape': (6,), }", f32, 24, "fortran_order");
    expect_bad("unknown_key", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", f32, 24,
               "unknown key");
    expect_bad("duplicate_key", 1, 0, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}",
               f32, 24, "duplicate");
    expect_bad("not_a_dict", 1, 0, "['descr', '<f4']", f32, 24, "bad header");
    expect_bad("unclosed_dict", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", f32, 24,
               "bad header");
    expect_bad("unterminated_str", 1, 0, "{'fortran_order': False, 'shape': (6,), 'descr': '<f4", f32, 24,
               "bad header");
    expect_bad("shape_not_tuple", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': 6}", f32, 24,
               "shape");
    expect_bad("shape_no_comma", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", f32, 24,
               "shape");
    expect_bad("shape_lone_comma", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", f32, 24,
               "shape");
    expect_bad("shape_negative", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", f32, 24,
               "shape");
    expect_bad("shape_float", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6.0,)}", f32, 24,
               "shape");
    expect_bad("shape_unclosed", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,", f32, 24,
               "shape");
    expect_bad("fortran_garbage", 1, 0, "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (6,)}", f32, 24,
               "fortran_order");
    expect_bad("dim_overflow", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
               f32, 24, "overflow");
    expect_bad("numel_overflow", 1, 0,
               "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", f32, 24,
               "too large");
    expect_bad("bytes_overflow", 1, 0,
               "{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952,)}", f32, 24, "too large");
    expect_bad("huge_but_fits", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000)}",
               f32, 24, "truncated");
    expect_bad("nine_dims", 1, 0,
               "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 6)}", f32, 24,
               "dimensions");
    expect_bad("trailing_text", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} junk", f32, 24,
               "after the dict");
    expect_bad("non_ascii", 1, 0, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,)}\x01", f32, 24,
               "unexpected byte");
    expect_bad("escape_in_str", 1, 0, "{'descr': '<\\x66', 'fortran_order': False, 'shape': (6,)}", f32, 24,
               "descr");
    {
        Buf b = make_npy(1, 0, okh, 1, f32, sizeof f32);
        b.b[20] = 0; /* NUL inside the header */
        expect_bad_buf("nul_in_header", &b, "unexpected byte");
        free(b.b);
    }

    /* ---- npy_open on things that are not files ---- */
    NpyArray a;
    char err[512];
    char path[256];
    snprintf(path, sizeof path, "%s/does_not_exist.npy", tmpdir);
    if (npy_open(path, &a, err, sizeof err) == 0 || !strstr(err, "No such file"))
        failf("missing file: '%s'", err);
    if (npy_open(tmpdir, &a, err, sizeof err) == 0 || !strstr(err, "not a regular file"))
        failf("directory: '%s'", err);

    /* every byte-prefix of a good file must be rejected cleanly (never read past the buffer) */
    {
        Buf b = make_npy(1, 0, okh, 1, f32, sizeof f32);
        for (size_t n = 0; n < b.n; n++) {
            unsigned char *copy = malloc(n ? n : 1); /* exact size: ASan catches overreads */
            if (!copy)
                return 1;
            memcpy(copy, b.b, n);
            NpyArray x;
            char e[512];
            if (npy_parse(copy, n, &x, e, sizeof e) == 0)
                failf("prefix of %zu bytes accepted", n);
            free(copy);
        }
        free(b.b);
    }

    afile_tests();
    afile_stage_tests();
    isum_tests();

    if (rmdir(tmpdir) != 0)
        perror(tmpdir);

    if (failures) {
        fprintf(stderr, "rt_npy_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("rt_npy_test: all passed\n");
    return 0;
}
