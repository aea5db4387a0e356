/* afile.h — files written whole or not at all, never through a link someone
 * else planted.  Used by the executables (runtime/) and by the compiler.
 *
 * A file PATH is written as a temporary in PATH's folder, created with
 * O_CREAT|O_EXCL|O_NOFOLLOW under an unpredictable name (.BASE.XXXXXX), so a
 * symlink or file planted under any name we could choose is never opened;
 * it is fsync'ed, renamed over PATH (rename replaces a link, never follows
 * it) and the folder is fsync'ed.  The folder is opened once (O_DIRECTORY)
 * and every step works through its fd (openat, renameat, unlinkat), so a
 * folder swapped for a link half way cannot redirect the rename or the
 * clean-up.  rt_dir_open gives the same for folders whose entries we delete
 * (checkpoints): O_NOFOLLOW|O_DIRECTORY, worked on with unlinkat.
 *
 * A text file is written through rt_afile_fopen's stream; a file read while
 * it grows (the metrics JSONL) is rt_afile_publish'ed at once: the temporary
 * takes PATH's name before the first line, and commit then only syncs it.
 * rt_same_file says whether an output would overwrite an input (by identity:
 * st_dev and st_ino, so ./m.onnx, m.onnx and a hard link are one file).
 *
 * Files that must change together (fsdpc's executable and its OUT.init) are
 * written aside first and renamed in an order their reader tolerates:
 * rt_afile_stage gives a finished temporary a name a reader can find before
 * rt_afile_commit renames it over PATH; rt_afile_install moves a file made
 * by another program (the linker's output, in an rt_dir_mktemp folder) into
 * place durably.
 *
 * No MPI, no compiler headers: tested standalone (tests/rt_npy_test.c).
 */
#ifndef FSDPC_AFILE_H
#define FSDPC_AFILE_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct {
    int dirfd;        /* PATH's folder */
    int fd;           /* the temporary, open for writing; -1 once closed */
    char *base;       /* PATH's last component (malloc'd) */
    char tmp[300];    /* the temporary's name in the folder */
    FILE *fp;         /* rt_afile_fopen's stream over fd, or NULL */
    int published;    /* rt_afile_publish: the temporary is PATH already */
    int stream;       /* PATH is a FIFO or character device, written in place (fd is PATH itself) */
    int staged;       /* tmp is the name rt_afile_stage gave it */
} RtAFile;

/* Create PATH's temporary (mode as for open(2), before the umask).  0, or -1
 * with errno set (nothing left behind).  PATH must name a file: "" or one
 * ending in '/' is EISDIR, an existing folder too, a socket or block device
 * EEXIST; an existing FIFO or character device is opened itself (f->stream:
 * no temporary, commit only closes it; the open waits for a FIFO's reader). */
int rt_afile_open(RtAFile *f, const char *path, mode_t mode);
/* the same for NAME in folder dirfd (dup'ed: the caller keeps dirfd) */
int rt_afile_openat(RtAFile *f, int dirfd, const char *name, mode_t mode);
/* rt_afile_open with a stream ("w") over the temporary, kept in f->fp (the
 * caller writes to it, never fcloses it): the stream, or NULL with errno */
FILE *rt_afile_fopen(RtAFile *f, const char *path, mode_t mode);
/* rename the temporary over PATH now, before it is complete (a log read as
 * it grows); commit then flushes, syncs and closes it.  0, or -1 with errno
 * (f untouched: still a temporary) */
int rt_afile_publish(RtAFile *f);
/* flush f->fp (if any), fsync and close the temporary, rename it over PATH
 * (unless published), fsync the folder.  0, or -1 with errno set; either way
 * f is released and, on failure, the temporary removed (a published file is
 * kept: it is PATH). */
int rt_afile_commit(RtAFile *f);
/* fsync and close the temporary and rename it to NAME in PATH's folder (a
 * planted link at NAME is replaced, not followed), then fsync the folder:
 * the file is complete on disk under a name a reader can look for, not yet
 * PATH.  f stays held: rt_afile_commit renames NAME over PATH (and, should
 * that fail, leaves it under NAME for its readers), rt_afile_abort removes
 * NAME.  0, or -1 with errno (f released, the temporary removed). */
int rt_afile_stage(RtAFile *f, const char *name);
/* Give up: close and remove the temporary (unless published), release f (keeps errno). */
void rt_afile_abort(RtAFile *f);
/* PATH written atomically with the n bytes of buf: 0, or -1 with errno */
int rt_afile_write(const char *path, const void *buf, size_t n, mode_t mode);

/* The cache folder fsdpc and its executables share: $FSDPC_CACHE_DIR, else
 * $XDG_CACHE_HOME/fsdpc, else ~/.cache/fsdpc, made if missing (mkdir -p,
 * 0755), into buf (n bytes).  It must be a folder owned by this user (or
 * root) that no one else can write, as ssh asks of ~/.ssh: whoever can
 * write into it could plant what the next build links in.  buf, or NULL
 * with why (wn bytes) saying why it is not used: "" where none of the
 * three is set, else the reason (buf then holds the folder's name). */
const char *rt_cache_dir(char *buf, size_t n, char *why, size_t wn);

/* File NAME of folder fromdir (made by another program: not a link) fsync'ed
 * and renamed to TO in folder todir (the same file system), then todir
 * fsync'ed.  0, or -1 with errno (NAME left where it was). */
int rt_afile_install(int fromdir, const char *name, int todir, const char *to);

/* PATH's folder ("." for a bare name) opened O_DIRECTORY (following links:
 * the folder the user named), and a malloc'd copy of PATH's last component
 * in *base: an fd, or -1 with errno (EISDIR for "", "x/", "." or "..";
 * ENAMETOOLONG where .BASE.XXXXXX would not fit a name). */
int rt_parent_open(const char *path, char **base);

/* write n bytes to fd, retrying EINTR and short writes (chunks of 1 GiB): 0, or -1 with errno */
int rt_write_all(int fd, const void *buf, size_t n);

/* 1 when A and B both exist and are one file (or folder): the same st_dev
 * and st_ino, following links; else 0 (a file not there yet is no other) */
int rt_same_file(const char *a, const char *b);

/* Open folder PATH without following a link in its last component
 * (O_DIRECTORY|O_NOFOLLOW): an fd, or -1 with errno (ELOOP / ENOTDIR for a
 * link).  Entries under it are then made and removed with *at calls. */
int rt_dir_open(const char *path);
/* openat(dirfd, name) the same way: a folder that is not a link */
int rt_dir_openat(int dirfd, const char *name);
/* Remove folder NAME of dirfd and the files in it (one level: what fsdpc
 * writes there), never following a link: a link in NAME's place is itself
 * removed, its target untouched.  0, or -1 with errno (ENOENT is success). */
int rt_dir_remove(int dirfd, const char *name);
/* A new folder PREFIX.XXXXXX (random, mode 0700: no one else can plant
 * anything in it) in dirfd; its name into name[cap].  0, or -1 with errno. */
int rt_dir_mktemp(int dirfd, const char *prefix, char *name, size_t cap);

#endif
