/* afile.c — atomic, link-safe file writes and folder removal (see afile.h).
 *
 * The temporary's name is .BASE.XXXXXX with six random characters from
 * getrandom (64^6 names): O_EXCL makes a planted name a collision, not a
 * redirection, and the next name is tried (64 tries, then EEXIST).  A
 * stream (rt_afile_fopen) owns the fd: release closes the one or the other.
 *
 * What is at PATH already decides how it is written: nothing, a regular file
 * or a link: the temporary, renamed over it (a link is replaced, never
 * followed); a FIFO or a character device: written in place, opened
 * O_NOFOLLOW without O_CREAT — a stream has nothing to replace atomically
 * (--metrics into a pipe, an export to /dev/null, which a rename would
 * replace by a file when run as root); a folder (EISDIR), a socket or a block
 * device (EEXIST): refused before anything is written.
 */
#define _GNU_SOURCE

#include "afile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int rt_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        size_t k = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t r = write(fd, p, k);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int rt_parent_open(const char *path, char **base)
{
    const char *slash = strrchr(path, '/');
    const char *b = slash ? slash + 1 : path;
    if (!*b || !strcmp(b, ".") || !strcmp(b, "..")) {
        errno = EISDIR;
        return -1;
    }
    if (strlen(b) > 255 - 16) { /* room for .BASE.XXXXXX */
        errno = ENAMETOOLONG;
        return -1;
    }
    int dfd;
    if (!slash)
        dfd = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    else {
        size_t dl = slash == path ? 1 : (size_t)(slash - path);
        char *dir = strndup(path, dl);
        if (!dir)
            return -1;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        free(dir);
    }
    if (dfd < 0)
        return -1;
    if (!(*base = strdup(b))) {
        close(dfd);
        return -1;
    }
    return dfd;
}

static void random_suffix(char out[7])
{
    static const char abc[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";
    unsigned char r[6];
    if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) { /* no entropy yet: still unique by O_EXCL */
        static unsigned n;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec * 2654435761u ^ (uint64_t)getpid() << 20 ^ ++n;
        for (int i = 0; i < 6; i++, x >>= 6)
            r[i] = (unsigned char)x;
    }
    for (int i = 0; i < 6; i++)
        out[i] = abc[r[i] & 63];
    out[6] = 0;
}

/* close what f holds (the stream or the temporary, the folder), free its name, reset it; keeps errno */
static void release(RtAFile *f)
{
    int e = errno;
    if (f->fp)
        fclose(f->fp);
    else if (f->fd >= 0)
        close(f->fd);
    if (f->dirfd >= 0)
        close(f->dirfd);
    free(f->base);
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    errno = e;
}

/* f->dirfd and f->base set (owned by f): create the temporary; 0, or -1 with errno and f released */
static int create_tmp(RtAFile *f, mode_t mode)
{
    struct stat st;
    if (fstatat(f->dirfd, f->base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) { /* a stream: written in place, never replaced */
            f->fd = openat(f->dirfd, f->base, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
            f->stream = f->published = f->fd >= 0;
            if (f->fd >= 0)
                return 0;
        } else
            errno = S_ISDIR(st.st_mode) ? EISDIR : EEXIST; /* a folder, socket or block device */
        release(f);
        return -1;
    }
    f->fd = -1;
    for (int tries = 0; tries < 64; tries++) {
        char sfx[7];
        random_suffix(sfx);
        snprintf(f->tmp, sizeof f->tmp, ".%s.%s", f->base, sfx);
        f->fd = openat(f->dirfd, f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (f->fd >= 0)
            return 0;
        if (errno != EEXIST)
            break;
    }
    release(f);
    return -1;
}

int rt_afile_open(RtAFile *f, const char *path, mode_t mode)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if ((f->dirfd = rt_parent_open(path, &f->base)) < 0)
        return -1;
    return create_tmp(f, mode);
}

int rt_afile_openat(RtAFile *f, int dirfd, const char *name, mode_t mode)
{
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
        errno = EISDIR;
        return -1;
    }
    if (strlen(name) > 255 - 16) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (!(f->base = strdup(name)))
        return -1;
    if ((f->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0)) < 0) {
        release(f);
        return -1;
    }
    return create_tmp(f, mode);
}

FILE *rt_afile_fopen(RtAFile *f, const char *path, mode_t mode)
{
    if (rt_afile_open(f, path, mode) != 0)
        return NULL;
    if (!(f->fp = fdopen(f->fd, "w")))
        rt_afile_abort(f);
    return f->fp;
}

int rt_afile_publish(RtAFile *f)
{
    if (f->stream)
        return 0;
    if (f->dirfd < 0 || f->published) {
        errno = EBADF;
        return -1;
    }
    if (renameat(f->dirfd, f->tmp, f->dirfd, f->base) != 0)
        return -1;
    f->published = 1;
    return 0;
}

void rt_afile_abort(RtAFile *f)
{
    int e = errno;
    if (f->dirfd >= 0 && !f->published)
        unlinkat(f->dirfd, f->tmp, 0);
    errno = e;
    release(f);
}

/* flush and sync the temporary, then close it (f->fd = -1, f->fp = NULL; nothing if it is closed already):
 * 0, or -1 with errno */
static int sync_close(RtAFile *f)
{
    if (!f->fp && f->fd < 0)
        return 0;
    int rc = 0;
    if (f->fp && (fflush(f->fp) != 0 || ferror(f->fp)))
        rc = -1;
    if (rc == 0 && !f->stream && fsync(f->fd) != 0)
        rc = -1;
    int e = errno, c = f->fp ? fclose(f->fp) : close(f->fd);
    f->fp = NULL;
    f->fd = -1;
    if (rc != 0) {
        errno = e ? e : EIO;
        return -1;
    }
    return c;
}

int rt_afile_commit(RtAFile *f)
{
    if (f->dirfd < 0) {
        errno = EBADF;
        return -1;
    }
    if (sync_close(f) != 0 || (!f->published && renameat(f->dirfd, f->tmp, f->dirfd, f->base) != 0)) {
        if (f->staged) /* complete under the name stage gave it: a reader may be using it */
            release(f);
        else
            rt_afile_abort(f);
        return -1;
    }
    int rc = f->stream ? 0 : fsync(f->dirfd);
    release(f);
    return rc;
}

int rt_afile_stage(RtAFile *f, const char *name)
{
    if (f->dirfd < 0 || f->published) {
        errno = EBADF;
        return -1;
    }
    if (strlen(name) >= sizeof f->tmp) {
        errno = ENAMETOOLONG;
        rt_afile_abort(f);
        return -1;
    }
    if (sync_close(f) != 0 || renameat(f->dirfd, f->tmp, f->dirfd, name) != 0) {
        rt_afile_abort(f);
        return -1;
    }
    snprintf(f->tmp, sizeof f->tmp, "%s", name);
    f->staged = 1;
    if (fsync(f->dirfd) != 0) {
        rt_afile_abort(f);
        return -1;
    }
    return 0;
}

int rt_afile_install(int fromdir, const char *name, int todir, const char *to)
{
    int fd = openat(fromdir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc != 0) {
        errno = e;
        return -1;
    }
    if (renameat(fromdir, name, todir, to) != 0)
        return -1;
    return fsync(todir);
}

int rt_afile_write(const char *path, const void *buf, size_t n, mode_t mode)
{
    RtAFile f;
    if (rt_afile_open(&f, path, mode) != 0)
        return -1;
    if (rt_write_all(f.fd, buf, n) != 0) {
        rt_afile_abort(&f);
        return -1;
    }
    return rt_afile_commit(&f);
}

int rt_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int rt_dir_open(const char *path)
{
    return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int rt_dir_openat(int dirfd, const char *name)
{
    return openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

int rt_dir_remove(int dirfd, const char *name)
{
    int fd = rt_dir_openat(dirfd, name);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        if (errno == ENOTDIR || errno == ELOOP) /* a link or a file in its place: remove that, nothing behind it */
            return unlinkat(dirfd, name, 0);
        return -1;
    }
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(fd, e->d_name, 0); /* a file or a link: the entry itself, never what it points to */
    closedir(d);
    return unlinkat(dirfd, name, AT_REMOVEDIR);
}

int rt_dir_mktemp(int dirfd, const char *prefix, char *name, size_t cap)
{
    size_t pl = strlen(prefix);
    if (pl + 8 > cap) { /* PREFIX.XXXXXX and its NUL */
        errno = ENAMETOOLONG;
        return -1;
    }
    for (int tries = 0; tries < 64; tries++) {
        memcpy(name, prefix, pl);
        name[pl] = '.';
        random_suffix(name + pl + 1);
        if (mkdirat(dirfd, name, 0700) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
    }
    return -1;
}

const char *rt_cache_dir(char *buf, size_t n, char *why, size_t wn)
{
    const char *d = getenv("FSDPC_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int len = d && *d ? snprintf(buf, n, "%s", d)
              : x && *x ? snprintf(buf, n, "%s/fsdpc", x)
              : h && *h ? snprintf(buf, n, "%s/.cache/fsdpc", h)
                        : -1;
    if (len < 0) {
        snprintf(why, wn, "%s", "");
        return NULL;
    }
    if ((size_t)len >= n) {
        snprintf(why, wn, "its name is longer than %zu bytes", n - 1);
        return NULL;
    }
    for (char *p = buf + 1; *p; p++) /* mkdir -p: the parents of the default folder may not exist yet */
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
    struct stat st;
    if (stat(buf, &st) != 0)
        snprintf(why, wn, "cannot use it: %s", strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, wn, "it is not a folder");
    else if (st.st_uid != geteuid() && st.st_uid != 0)
        snprintf(why, wn, "it belongs to another user (uid %u)", (unsigned)st.st_uid);
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        snprintf(why, wn, "others can write into it (mode %04o)", (unsigned)(st.st_mode & 07777));
    else
        return buf;
    return NULL;
}
