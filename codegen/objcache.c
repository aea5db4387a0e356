/* objcache.c — the object cache: a compiled object (the step's, step.c;
 * --emulate's fused kernels, fused.cc) kept for the next build that
 * compiles the same source with the same compiler, and the cache folder it
 * shares with the kernel cache (cuda.c).
 *
 * An executable is two C files (exe.c): step.c, the step, its tables and
 * the model's description, which no initial weight value reaches, and
 * main.c, a few lines holding what ties the step to one init file (its id
 * and checksums) and main.  Compiling step.c is most of a small model's
 * build (the C compiler at -O2 over the kernels' inline headers), and
 * builds that differ only in the weights' values -- the same model trained
 * from other initial values, a test's perturbed copies of a model -- have
 * the same step.c; the builds of one model under other strategies often
 * have the same fused kernels.  So an object is kept in the cache folder
 * ($FSDPC_CACHE_DIR, else $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc) as
 * KEY.o, where KEY hashes everything the object depends on: the compiler's
 * command (its name and every flag), the source as that compiler
 * preprocesses it (`-E -P`: every header it includes) and the macros it
 * defines there (`-E -dM`: its __VERSION__, those -march and -fopenmp
 * define).  A build whose key is there copies the object instead of
 * compiling; step.c's hit leaves main.c to compile and the link, as every
 * build does.
 *
 * An entry is written atomically (afile.h) and checked when read (magic,
 * key, the preprocessed text's length, the object's length and checksum);
 * a bad or unreadable entry is a miss (compiled, and written again), and a
 * cache that cannot be written is only a warning.  Preprocessing twice
 * costs about 20 ms a build of C (more for --emulate's C++), against the
 * compile a hit saves.
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

#define OBJ_MAGIC "FSDPC-OBJECT-v1\n" /* 16 bytes, then key, text length, object length, object checksum */
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

/* the bytes of file path (*len of them); NULL with errno */
static unsigned char *read_file(const char *path, uint64_t *len)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(path, O_NOFOLLOW, &size, &why);
    if (fd < 0)
        return NULL;
    unsigned char *p = ir_alloc((size_t)size + 1);
    int rc = read_at(fd, p, (uint64_t)size, 0), e = errno;
    close(fd);
    errno = e;
    *len = (uint64_t)size;
    return rc == 0 ? p : NULL;
}

/* h continued with what cc writes into path (then removed) when run with args on src: NULL, or why not */
static const char *hash_output(uint64_t *h, char *const *cc, const char *const *args, const char *path, uint64_t *len)
{
    const char *why = cg_spawn_cc(with(cc, args));
    if (why)
        return why;
    unsigned char *text = read_file(path, len);
    int e = errno;
    unlink(path);
    if (!text)
        return ir_fmt("%s: cannot read what the C compiler wrote: %s", path, strerror(e));
    *h = cg_fnv(*h, text, *len);
    return NULL;
}

/* The cache key of compiling src with cc: its command (all but the file names, which are the build's own), src
 * preprocessed by it (*textlen bytes) and the macros it defines there (its version, the flags' macros).  NULL, or
 * why the compiler could not preprocess it (tmp: a file name beside the object for its output). */
static const char *object_key(const char *src, char *const *cc, const char *tmp, uint64_t *key, uint64_t *textlen)
{
    uint64_t h = cg_fnv(14695981039346656037ull, OBJ_MAGIC, 16), n;
    for (int i = 0; cc[i]; i++)
        h = cg_fnv(h, cc[i], strlen(cc[i]) + 1);
    const char *why = hash_output(&h, cc, (const char *[]){"-E", "-P", "-o", tmp, src, NULL}, tmp, textlen);
    if (!why)
        why = hash_output(&h, cc, (const char *[]){"-E", "-dM", "-o", tmp, src, NULL}, tmp, &n);
    *key = h;
    return why;
}

static const char *entry_path(const char *dir, uint64_t key)
{
    return ir_fmt("%s/%016llx.o", dir, (unsigned long long)key);
}

/* The entry of key (made from textlen bytes of preprocessed text) copied to obj: 1, or 0 (a miss: none there, a
 * bad one, or obj could not be written) */
static int cache_read(const char *dir, uint64_t key, uint64_t textlen, const char *obj)
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
    unsigned char *data = ok ? ir_alloc((size_t)hdr[2] + 1) : NULL;
    ok = ok && read_at(fd, data, hdr[2], 48) == 0 && cg_fnv(14695981039346656037ull, data, hdr[2]) == hdr[3];
    close(fd);
    if (!ok)
        return 0;
    int out = open(obj, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    ok = out >= 0 && rt_write_all(out, data, hdr[2]) == 0;
    if (out >= 0 && close(out) != 0)
        ok = 0;
    return ok;
}

/* obj into the cache as key's entry; a warning where it cannot be */
static void cache_write(const char *dir, uint64_t key, uint64_t textlen, const char *obj)
{
    uint64_t len = 0;
    unsigned char *data = read_file(obj, &len);
    if (data && len >= OBJ_MAX)
        return;
    cg_cache_mkdir(dir);
    RtAFile af; /* a shared cache folder: written beside the entry and renamed, never through a planted link */
    FILE *f = data ? rt_afile_fopen(&af, entry_path(dir, key), 0644) : NULL;
    uint64_t hdr[4] = {key, textlen, len, data ? cg_fnv(14695981039346656037ull, data, len) : 0};
    int ok = f && fwrite(OBJ_MAGIC, 1, 16, f) == 16 && fwrite(hdr, 8, 4, f) == 4 && fwrite(data, 1, len, f) == len;
    if (f && !ok)
        rt_afile_abort(&af);
    if (!f || !ok || rt_afile_commit(&af) != 0)
        fprintf(stderr, "fsdpc: warning: cannot write the object cache %s (%s); %s will be compiled again next "
                "time\n", dir, strerror(errno), obj);
}

const char *cg_object(const char *src, char *const *cc, const char *obj)
{
    const char *dir = cg_cache_dir(), *tmp = ir_fmt("%s.E", obj);
    uint64_t textlen = 0, key = 0;
    if (dir) {
        const char *why = object_key(src, cc, tmp, &key, &textlen);
        if (why)
            return why;
        if (cache_read(dir, key, textlen, obj))
            return NULL;
    }
    const char *why = cg_spawn_cc(with(cc, (const char *[]){"-c", "-o", obj, src, NULL}));
    if (!why && dir)
        cache_write(dir, key, textlen, obj);
    return why;
}
