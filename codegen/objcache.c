/* objcache.c — the object cache: a compiled object (the step's, step.c;
 * --emulate's fused kernels, fused.cc) kept for the next build that
 * compiles the same source with the same compiler, and the cache folder it
 * shares with the kernel cache (cuda.c).
 *
 * An executable is two C files (exe.c): step.c, the step, its tables and
 * the model's description, which no initial weight value reaches, and
 * main.c, a few lines holding what ties the step to one init file (its id
 * and checksums) and main.  Builds that differ only in the weights' values
 * -- the same model trained from other initial values, a test's perturbed
 * copies of a model -- have the same step.c; the builds of one model under
 * other strategies often have the same fused kernels.  So an object is
 * kept in the cache folder ($FSDPC_CACHE_DIR, else $XDG_CACHE_HOME/fsdpc,
 * else ~/.cache/fsdpc) as KEY.o, where KEY hashes the compiler's command
 * (its name and every flag), the compiler program's identity (size, time,
 * inode, as found on $PATH) and the source's text; the entry also records
 * every header the compiler read (its -MD list) with a checksum of each, and
 * is used only while every one of them holds what it held (ccache's direct
 * mode: no extra run of the compiler, a hit reads the headers, about 1 ms).
 * A build whose entry is there copies the object instead of compiling; a
 * step.c hit leaves main.c to compile and the link, as every build does.
 *
 * The folder must be this user's (or root's) and writable by no one else
 * (cg_cache_dir): anyone who can write into it could plant an object.
 * An entry is written atomically (afile.h) and checked when read (magic,
 * key, lengths, a checksum over the header list and the object); a bad or
 * stale entry is a miss (compiled, and written again), and a cache that
 * cannot be written is only a warning.  A wrapper script given as --cc is
 * known by its own identity, not by the compiler it runs.
 */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* pread */
#include "build.h"
#include "afile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OBJ_MAGIC "FSDPC-OBJECT-v2\n" /* 16 bytes, then key, header list length, object length, checksum */
#define OBJ_MAX ((uint64_t)1 << 31)   /* a larger object is compiled every time, never kept */

/* The folder named by the environment, made and checked (rt_cache_dir:
 * this user's or root's, writable by no one else, since whoever can write
 * into it can plant an object that the next build links into its
 * executable).  Else NULL, after a warning where one is set but refused (one
 * per folder and process): the build compiles everything, as with no cache. */
const char *cg_cache_dir(void)
{
    char dir[4096], why[160];
    if (rt_cache_dir(dir, sizeof dir, why, sizeof why))
        return ir_strdup(dir);
    static char warned[4096]; /* one warning per folder and process (a compile asks more than once) */
    if (why[0] && strcmp(warned, dir)) {
        fprintf(stderr, "fsdpc: warning: not using the cache folder %s: %s, so another user could plant code in "
                "it; everything is compiled (make it yours with mode 0755 or 0700, or set $FSDPC_CACHE_DIR)\n",
                dir, why);
        snprintf(warned, sizeof warned, "%s", dir);
    }
    return NULL;
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

/* the bytes of file path (*len of them), opened with more flags (O_NOFOLLOW: the build's own files); NULL with
 * errno */
static unsigned char *read_file(const char *path, int flags, uint64_t *len)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(path, flags, &size, &why);
    if (fd < 0)
        return NULL;
    unsigned char *p = ir_alloc((size_t)size + 1);
    int rc = read_at(fd, p, (uint64_t)size, 0), e = errno;
    close(fd);
    errno = e;
    *len = (uint64_t)size;
    return rc == 0 ? p : NULL;
}

/* the compiler's program, found as posix_spawnp finds it (a name without '/' on $PATH): its stat into *st; 0, or
 * -1 (not found: nothing is cached) */
static int compiler_stat(const char *cc, struct stat *st)
{
    if (strchr(cc, '/'))
        return stat(cc, st);
    const char *path = getenv("PATH");
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && stat(ir_fmt("%.*s/%s", (int)n, p, cc), st) == 0 && S_ISREG(st->st_mode))
            return 0;
        p += n + (e != NULL);
    }
    return -1;
}

/* The entry's name: the command (all but the file names, which are the build's own), the compiler program's
 * identity (size, time, inode) and src's text.  0, or -1 where src or the compiler cannot be read. */
static int object_key(const char *src, char *const *cc, uint64_t *key)
{
    struct stat st;
    uint64_t len, h = cg_fnv(14695981039346656037ull, OBJ_MAGIC, 16);
    unsigned char *text = read_file(src, O_NOFOLLOW, &len);
    if (!text || compiler_stat(cc[0], &st) != 0)
        return -1;
    for (int i = 0; cc[i]; i++)
        h = cg_fnv(h, cc[i], strlen(cc[i]) + 1);
    int64_t id[4] = {(int64_t)st.st_size, (int64_t)st.st_mtime, (int64_t)st.st_ino, (int64_t)st.st_dev};
    h = cg_fnv(h, id, sizeof id);
    *key = cg_fnv(h, text, len);
    return 0;
}

/* the checksum of file path's bytes (an unreadable file: 0, which no entry records) */
static uint64_t file_sum(const char *path)
{
    uint64_t len;
    unsigned char *p = read_file(path, 0, &len); /* a header: links followed, as the compiler did */
    return p ? cg_fnv(14695981039346656037ull ^ len, p, len) | 2 : 0; /* never 0 or 1 */
}

/* The headers in the compiler's dependency file d (-MD -MF d: "obj: src h1 h2 \ ..."), as the entry records
 * them: a line "SUM PATH" each, SUM the file's checksum in 16 hex digits.  NULL: one could not be read. */
static char *deps_record(const char *d, uint64_t *n)
{
    uint64_t len;
    char *text = (char *)read_file(d, O_NOFOLLOW, &len);
    char *colon = text ? memchr(text, ':', len) : NULL;
    if (!colon)
        return NULL;
    text[len] = 0;
    Buf b = {0};
    cg_put(&b, "%s", "");
    /* the first is the source, whose text is in the key (named as the compiler writes it, not as src) */
    for (char *t = strtok(colon + 1, " \t\r\n\\"); t && (t = strtok(NULL, " \t\r\n\\"));) {
        uint64_t sum = file_sum(t);
        if (!sum)
            return NULL;
        cg_put(&b, "%016llx %s\n", (unsigned long long)sum, t);
    }
    *n = b.len;
    return b.buf;
}

/* Do the recorded headers (deps_record's n bytes) hold what they held? */
static int deps_unchanged(const char *rec, uint64_t n)
{
    for (const char *l = rec, *end = rec + n; l < end;) {
        const char *nl = memchr(l, '\n', (size_t)(end - l));
        char *after;
        if (!nl || nl - l < 18 || l[16] != ' ')
            return 0;
        unsigned long long want = strtoull(ir_fmt("%.16s", l), &after, 16);
        if (*after || file_sum(ir_fmt("%.*s", (int)(nl - l - 17), l + 17)) != want)
            return 0;
        l = nl + 1;
    }
    return 1;
}

static const char *entry_path(const char *dir, uint64_t key)
{
    return ir_fmt("%s/%016llx.o", dir, (unsigned long long)key);
}

/* The entry of key copied to obj where the headers it records are unchanged: 1, or 0 (a miss: none there, a bad
 * one, a header changed, or obj could not be written) */
static int cache_read(const char *dir, uint64_t key, const char *obj)
{
    int64_t size;
    const char *why;
    int fd = ir_open_regular(entry_path(dir, key), 0, &size, &why);
    if (fd < 0)
        return 0;
    char magic[16];
    uint64_t hdr[4]; /* key, the headers' record length, object length, checksum of both */
    int ok = size > 48 && read_at(fd, magic, 16, 0) == 0 && !memcmp(magic, OBJ_MAGIC, 16) &&
             read_at(fd, hdr, sizeof hdr, 16) == 0 && hdr[0] == key && hdr[1] < OBJ_MAX && hdr[2] < OBJ_MAX &&
             hdr[1] + hdr[2] == (uint64_t)size - 48;
    unsigned char *data = ok ? ir_alloc((size_t)(hdr[1] + hdr[2]) + 1) : NULL;
    ok = ok && read_at(fd, data, hdr[1] + hdr[2], 48) == 0 &&
         cg_fnv(14695981039346656037ull, data, hdr[1] + hdr[2]) == hdr[3] &&
         deps_unchanged((const char *)data, hdr[1]);
    close(fd);
    if (!ok)
        return 0;
    int out = open(obj, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    ok = out >= 0 && rt_write_all(out, data + hdr[1], hdr[2]) == 0;
    if (out >= 0 && close(out) != 0)
        ok = 0;
    return ok;
}

/* obj, made with dependency file d, into the cache as key's entry; a warning where it cannot be */
static void cache_write(const char *dir, uint64_t key, const char *d, const char *obj)
{
    uint64_t len = 0, nrec = 0;
    char *rec = deps_record(d, &nrec);
    unsigned char *data = rec ? read_file(obj, O_NOFOLLOW, &len) : NULL;
    unlink(d);
    if (!data || len >= OBJ_MAX)
        return; /* (a header that cannot be read back: the object is not kept) */
    RtAFile af; /* a shared cache folder: written beside the entry and renamed, never through a planted link */
    FILE *f = rt_afile_fopen(&af, entry_path(dir, key), 0644);
    uint64_t hdr[4] = {key, nrec, len, cg_fnv(cg_fnv(14695981039346656037ull, rec, nrec), data, len)};
    int ok = f && fwrite(OBJ_MAGIC, 1, 16, f) == 16 && fwrite(hdr, 8, 4, f) == 4 && fwrite(rec, 1, nrec, f) == nrec &&
             fwrite(data, 1, len, f) == len;
    if (f && !ok)
        rt_afile_abort(&af);
    if (!f || !ok || rt_afile_commit(&af) != 0)
        fprintf(stderr, "fsdpc: warning: cannot write the object cache %s (%s); %s will be compiled again next "
                "time\n", dir, strerror(errno), obj);
}

const char *cg_object(const char *src, char *const *cc, const char *obj)
{
    const char *dir = cg_cache_dir(), *d = ir_fmt("%s.d", obj);
    uint64_t key = 0;
    int cached = dir && object_key(src, cc, &key) == 0;
    if (cached && cache_read(dir, key, obj))
        return NULL;
    const char *why = cached ? cg_spawn_cc(with(cc, (const char *[]){"-MD", "-MF", d, "-c", "-o", obj, src, NULL}))
                             : cg_spawn_cc(with(cc, (const char *[]){"-c", "-o", obj, src, NULL}));
    if (!why && cached)
        cache_write(dir, key, d, obj);
    unlink(d);
    return why;
}
