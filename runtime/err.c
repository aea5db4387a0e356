/* err.c — the start-up error agreement of every executable (training and
 * forward-only, cpu's MPI and cuda's TCP control planes alike): each rank
 * records its first start-up error (rt_err_set, with rt_err_where's
 * prefix); rt_err_sync agrees on them in one reduction, so that no rank is
 * left waiting in a collective: exactly one line is printed, by the lowest
 * failing rank, and every rank gets the same exit status (1, or 2 for
 * command-line errors).  Before the control plane is up there is nothing to
 * agree with: rt_main prints this rank's error itself (rt_err_code,
 * rt_err_print).  Also here, as they go with it: rank 0's one-line warnings
 * and notes, and rt_prepare_dir, the check of an output directory that
 * records its failure as a start-up error.
 *
 * The files that only need the agreement (opts.c, args.c, data.c, load.c,
 * ckpt.c, eval.c, ...) depend on this file and rt_ctl.h, not on rt.c.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_ctl.h"
#include "rt_priv.h"

/* ------------------------------------------------------------------ errors */

static int g_rank; /* rt_err_rank's */

static char g_err[2048];
static int g_code; /* 0: no error on this rank; else the exit status */
static char g_where[512]; /* rt_err_where's prefix */

void rt_err_set(int code, const char *fmt, ...)
{
    if (g_code)
        return; /* keep the first */
    int n = g_where[0] ? snprintf(g_err, sizeof g_err, "%s: ", g_where) : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err + n, sizeof g_err - (size_t)n, fmt, ap);
    va_end(ap);
    g_code = code;
}

void rt_err_where(const char *where)
{
    snprintf(g_where, sizeof g_where, "%s", where ? where : "");
}

void rt_err_rank(int rank) { g_rank = rank; }

int rt_err_code(void) { return g_code; }

void rt_err_print(void)
{
    for (char *p = g_err; *p; p++) /* one line, whatever the user typed */
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    if (g_rank != 0)
        fprintf(stderr, "%s: error: rank %d: %s\n", rt_prog, g_rank, g_err);
    else
        fprintf(stderr, "%s: error: %s\n", rt_prog, g_err);
    fflush(stderr);
}

int rt_err_sync(void)
{
    /* the lowest failing rank and its status, in one reduction */
    int64_t key = g_code ? (int64_t)g_rank << 8 | (g_code > 0 && g_code < 256 ? g_code : 1) : INT64_MAX;
    rt_ctl_allreduce_i64(&key, 1, RT_CTL_MIN);
    if (key == INT64_MAX)
        return 0;
    if (g_rank == (int)(key >> 8))
        rt_err_print();
    return (int)(key & 0xff);
}

/* rank 0's one line "PROG: KIND: ..." on stderr (the other ranks say nothing) */
static void say0(const char *kind, const char *fmt, va_list ap)
{
    if (g_rank != 0)
        return;
    fprintf(stderr, "%s: %s: ", rt_prog, kind);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

void rt_warn0(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say0("warning", fmt, ap);
    va_end(ap);
}

void rt_note0(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say0("note", fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------- output directories */

/* DIR (--dump-grads, --out-dir) made if missing and usable.  DIR is the user's: it may be a link they made.
 * Its files are written with npy_save (rt_afile: a temporary made O_EXCL|O_NOFOLLOW in DIR, renamed over the
 * name), so a link planted at a file's name in DIR is replaced, never written through; nothing in DIR is removed. */
int rt_prepare_dir(const char *flag, const char *dir)
{
    struct stat st;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        rt_err_set(1, "%s %s: cannot create: %s", flag, dir, strerror(errno));
    else if (stat(dir, &st) != 0)
        rt_err_set(1, "%s %s: %s", flag, dir, strerror(errno));
    else if (!S_ISDIR(st.st_mode))
        rt_err_set(1, "%s %s: not a directory", flag, dir);
    else if (access(dir, W_OK | X_OK) != 0)
        rt_err_set(1, "%s %s: not writable: %s", flag, dir, strerror(errno));
    else
        return 0;
    return -1;
}
