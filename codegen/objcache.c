/* objcache.c — the step cache: the compiled step (step.c's object) kept
 * for the next build of the same step, and the cache folder it shares with
 * the kernel cache (cuda.c).
 *
 * An executable is two C files (exe.c): step.c, the step, its tables and
 * the model's description, which no initial weight value reaches, and
 * main.c, a few lines holding what ties the step to one init file (its id
 * and checksums) and main.  Compiling step.c is most of a small model's
 * build (the C compiler at -O2 over the kernels' inline headers), and
 * builds that differ only in the weights' values -- the same model trained
 * from other initial values, a test's perturbed copies of a model -- have
 * the same step.c.  So its object is kept in the cache folder
 * ($FSDPC_CACHE_DIR, else $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc) under
 * a key that hashes everything the object depends on: the compiler's
 * command (its name and every flag) and step.c as that compiler
 * preprocesses it (`-E -P`: every header it includes, the macros -march
 * and -fopenmp define, and the compiler's __VERSION__, which step.c
 * names).  A build whose key is there copies the object instead of
 * compiling step.c; it then compiles main.c and links, as every build does.
 *
 * An entry is written atomically (afile.h) and checked when read (magic,
 * key, the preprocessed text's length, the object's length and checksum);
 * a bad or unreadable entry is a miss (compiled, and written again), and a
 * cache that cannot be written is only a warning.  Preprocessing costs a
 * few tens of milliseconds per build, against the seconds a hit saves.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* pread */
#include "build.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OBJ_MAGIC "FSDPC-STEP-O-v1\n" /* 16 bytes, then key, text length, object length, object checksum */
#define OBJ_MAX ((uint64_t)1 << 31)   /* a larger object is compiled every time, never kept */

const char *cg_cache_dir(void)
{
    const char *d = getenv("FSDPC_CACHE_DIR");
    if (d && *d)
        return d;
    d = getenv("XDG_CACHE_HOME");
    if (d && *d)
        return ir_fmt("%s/fsdpc", d);
    d = getenv("HOME");
    return d && *d ? ir_fmt("%s/.cache/fsdpc", d) : NULL;
}

void cg_cache_mkdir(const char *dir)
{
    char *p = ir_strdup(dir); /* mkdir -p: the parents of the default folder may not exist yet */
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

_Noreturn void cg_cc_fail(Build *b, const char *why)
{
    cg_build_fail(b, ir_fmt("%s: building the executable failed: %s: fix that (disk space, --cc, the fsdpc "
                            "install) and compile again", b->out, why));
}

/* cc (NULL-terminated: the compiler and its flags) followed by the NULL-terminated more */
static char **with(char *const *cc, const char *const *more)
{
    int n = 0, k = 0;
    while (cc[n])
        n++;
    while (more[k])
        k++;
    char **argv = ir_alloc(sizeof(char *) * (size_t)(n + k + 1));
    memcpy(argv, cc, sizeof(char *) * (size_t)n);
    memcpy(argv + n, more, sizeof(char *) * (size_t)(k + 1));
    return argv;
}

/* n bytes at off of fd into p: 0, or -1 (errno EIO: the file ended first) */
static int read_at(int fd, void *p, uint64_t n, uint64_t off)
{
    for (uint64_t got = 0; got < n;) {
        ssize_t r = pread(fd, (char *)p + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return errno = r == 0 ? EIO : errno, -1;
        got += (uint64_t)r;
    }
    return 0;
}

/* the bytes of the private folder's file name (*len of them); NULL with errno */
static unsigned char *read_private(Build *b, const char *name, uint64_t *len)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(ir_fmt("%s/%s", b->priv_path, name), O_NOFOLLOW, &size, &why);
    if (fd < 0)
        return NULL;
    unsigned char *p = ir_alloc((size_t)size + 1);
    int rc = read_at(fd, p, (uint64_t)size, 0), e = errno;
    close(fd);
    errno = e;
    *len = (uint64_t)size;
    return rc == 0 ? p : NULL;
}

/* The cache key of compiling src with cc: its command (all but the file names, which are the build's own) and
 * src preprocessed by it; its length into *textlen.  A compiler that fails to preprocess fails the build. */
static uint64_t step_key(Build *b, const char *src, char *const *cc, uint64_t *textlen)
{
    const char *pre = ir_fmt("%s/step.i", b->priv_path);
    const char *why = cg_spawn_cc(with(cc, (const char *[]){"-E", "-P", "-o", pre, src, NULL}));
    if (why)
        cg_cc_fail(b, why);
    unsigned char *text = read_private(b, "step.i", textlen);
    if (!text)
        cg_cc_fail(b, ir_fmt("%s: cannot read what the C compiler wrote: %s", pre, strerror(errno)));
    unlinkat(b->privfd, "step.i", 0);
    uint64_t h = cg_fnv(14695981039346656037ull, OBJ_MAGIC, 16);
    for (int i = 0; cc[i]; i++)
        h = cg_fnv(h, cc[i], strlen(cc[i]) + 1);
    return cg_fnv(h, text, *textlen);
}

static const char *entry_path(const char *dir, uint64_t key)
{
    return ir_fmt("%s/%016llx.step.o", dir, (unsigned long long)key);
}

/* The entry of key (made from textlen bytes of preprocessed text) written to the private folder as step.o:
 * 1, or 0 (a miss: none there, a bad one, or nothing could be written) */
static int cache_read(Build *b, const char *dir, uint64_t key, uint64_t textlen)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(entry_path(dir, key), 0, &size, &why);
    if (fd < 0)
        return 0;
    char magic[16];
    uint64_t hdr[4]; /* key, text length, object length, object checksum */
    int ok = size > 48 && read_at(fd, magic, 16, 0) == 0 && !memcmp(magic, OBJ_MAGIC, 16) &&
             read_at(fd, hdr, sizeof hdr, 16) == 0 && hdr[0] == key && hdr[1] == textlen &&
             hdr[2] == (uint64_t)size - 48 && hdr[2] < OBJ_MAX;
    unsigned char *obj = ok ? ir_alloc((size_t)hdr[2] + 1) : NULL;
    ok = ok && read_at(fd, obj, hdr[2], 48) == 0 && cg_fnv(14695981039346656037ull, obj, hdr[2]) == hdr[3];
    close(fd);
    if (!ok)
        return 0;
    int out = openat(b->privfd, "step.o", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    ok = out >= 0 && rt_write_all(out, obj, hdr[2]) == 0;
    if (out >= 0 && close(out) != 0)
        ok = 0;
    return ok;
}

/* the private folder's step.o into the cache as key's entry; a warning where it cannot be */
static void cache_write(Build *b, const char *dir, uint64_t key, uint64_t textlen)
{
    uint64_t len = 0;
    unsigned char *obj = read_private(b, "step.o", &len);
    if (obj && len >= OBJ_MAX)
        return;
    cg_cache_mkdir(dir);
    RtAFile af; /* a shared cache folder: written beside the entry and renamed, never through a planted link */
    FILE *f = obj ? rt_afile_fopen(&af, entry_path(dir, key), 0644) : NULL;
    uint64_t hdr[4] = {key, textlen, len, obj ? cg_fnv(14695981039346656037ull, obj, len) : 0};
    int ok = f && fwrite(OBJ_MAGIC, 1, 16, f) == 16 && fwrite(hdr, 8, 4, f) == 4 && fwrite(obj, 1, len, f) == len;
    if (f && !ok)
        rt_afile_abort(&af);
    if (!f || !ok || rt_afile_commit(&af) != 0)
        fprintf(stderr, "fsdpc: warning: cannot write the step cache %s (%s); the step will be compiled again "
                "next time\n", dir, strerror(errno));
}

const char *cg_step_object(Build *b, const char *src, char *const *cc)
{
    const char *dir = cg_cache_dir(), *obj = ir_fmt("%s/step.o", b->priv_path);
    uint64_t textlen = 0, key = dir ? step_key(b, src, cc, &textlen) : 0;
    if (dir && cache_read(b, dir, key, textlen))
        return obj;
    const char *why = cg_spawn_cc(with(cc, (const char *[]){"-c", "-o", obj, src, NULL}));
    if (why)
        cg_cc_fail(b, why);
    if (dir)
        cache_write(b, dir, key, textlen);
    return obj;
}
