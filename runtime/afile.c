/* afile.c — atomic, link-safe file writes and folder removal (see afile.h).
 *
 * The temporary's name is .BASE.XXXXXX with six random characters from
 * getrandom (64^6 names): O_EXCL makes a planted name a collision, not a
 * redirection, and the next name is tried (64 tries, then EEXIST).
 */
#define _GNU_SOURCE

#include "afile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
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

/* PATH's folder ("." for a bare name) opened O_DIRECTORY, and a copy of its last component in *base */
static int open_parent(const char *path, char **base)
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

int rt_afile_open(RtAFile *f, const char *path, mode_t mode)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if ((f->dirfd = open_parent(path, &f->base)) < 0)
        return -1;
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
    int e = errno;
    close(f->dirfd);
    free(f->base);
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    errno = e;
    return -1;
}

void rt_afile_abort(RtAFile *f)
{
    int e = errno;
    if (f->fd >= 0)
        close(f->fd);
    if (f->dirfd >= 0) {
        unlinkat(f->dirfd, f->tmp, 0);
        close(f->dirfd);
    }
    free(f->base);
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    errno = e;
}

int rt_afile_commit(RtAFile *f)
{
    if (f->dirfd < 0) {
        errno = EBADF;
        return -1;
    }
    int fd = f->fd;
    f->fd = -1;
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        rt_afile_abort(f);
        return -1;
    }
    if (close(fd) != 0 || renameat(f->dirfd, f->tmp, f->dirfd, f->base) != 0) {
        rt_afile_abort(f);
        return -1;
    }
    int rc = fsync(f->dirfd), e = errno;
    close(f->dirfd);
    free(f->base);
    memset(f, 0, sizeof *f);
    f->fd = f->dirfd = -1;
    errno = e;
    return rc;
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
