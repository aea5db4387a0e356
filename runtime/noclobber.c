/* noclobber.c — no output of a run overwrites one of its inputs.
 *
 * Rank 0, before anything is written, collects the run's input files (the
 * --data/--input, --val-data, --tokens, --val-tokens and --config files, the init
 * file, the executable itself and every file of the --resume checkpoint)
 * with their identity (st_dev, st_ino: ./x.npy, x.npy and a hard link are
 * one file), then checks each output against them: a file output that
 * exists and is one of them is refused in one line naming both.  An output
 * that does not exist yet is no input.
 *
 * --ckpt-dir DIR is a folder whose entries a run replaces and prunes: it is
 * refused when DIR is an input file, when an input is DIR/latest, or when an
 * input lies in a folder of DIR that a save replaces or a prune removes
 * (step-N, .step-N.tmp, best).  The --resume checkpoint's own files are
 * exempt: they are read whole before the first save (--resume DIR
 * --ckpt-dir DIR is how a run goes on).
 */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rt_priv.h"

/* input i of in, for messages: "the --data file x.npy" */
static const char *input_name(const RtInputs *in, int i, char *buf, size_t cap)
{
    const RtInFile *f = &in->f[i];
    if (!f->flag)
        return f->path;
    snprintf(buf, cap, "the %s file %s", f->flag, f->path);
    return buf;
}

/* add PATH (copied) as an input named by flag (NULL: PATH is a description, e.g. "the executable (...)"),
 * identified by file (stat'ed); an input that cannot be stat'ed is left out (its reader reports it) */
static int add(RtInputs *in, const char *flag, const char *path, const char *file, int resume)
{
    struct stat st;
    if (stat(file, &st) != 0)
        return 0;
    if (in->n % 16 == 0) {
        RtInFile *g = realloc(in->f, (size_t)(in->n + 16) * sizeof *g);
        if (!g)
            return -1;
        in->f = g;
    }
    char *p = strdup(path);
    if (!p)
        return -1;
    in->f[in->n++] = (RtInFile){flag, p, st.st_dev, st.st_ino, resume};
    return 0;
}

/* every file of the --resume checkpoint (its folder's entries) */
static int add_resume(RtInputs *in, const char *resume)
{
    char dir[PATH_MAX], path[PATH_MAX + 256];
    if (rt_ckpt_resolve(resume, dir, sizeof dir, 1) != 0)
        return 0; /* the resume reports it */
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;
    while (d && rc == 0 && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            rc = add(in, "--resume", path, path, 1);
    if (d)
        closedir(d);
    return rc;
}

int rt_inputs_collect(RtInputs *in, const RtOpts *o, const char *init_path)
{
    memset(in, 0, sizeof *in);
    int rc = 0;
    for (int i = 0; rc == 0 && i < o->ndata; i++)
        rc = add(in, o->data_flag ? o->data_flag : "--data", o->data[i].file, o->data[i].file, 0);
    for (int i = 0; rc == 0 && i < o->nval_data; i++)
        rc = add(in, "--val-data", o->val_data[i].file, o->val_data[i].file, 0);
    if (rc == 0 && o->tokens)
        rc = add(in, "--tokens", o->tokens, o->tokens, 0);
    if (rc == 0 && o->val_tokens)
        rc = add(in, "--val-tokens", o->val_tokens, o->val_tokens, 0);
    if (rc == 0 && o->config)
        rc = add(in, "--config", o->config, o->config, 0);
    if (rc == 0 && init_path)
        rc = add(in, "init", init_path, init_path, 0);
    if (rc == 0)
        rc = add(in, NULL, "this executable (/proc/self/exe)", "/proc/self/exe", 0);
    if (rc == 0 && o->resume)
        rc = add_resume(in, o->resume);
    if (rc != 0)
        rt_err_set(1, "out of memory");
    return rc;
}

void rt_inputs_free(RtInputs *in)
{
    for (int i = 0; i < in->n; i++)
        free(in->f[i].path);
    free(in->f);
    memset(in, 0, sizeof *in);
}

/* the input that st is, or -1 */
static int find(const RtInputs *in, const struct stat *st)
{
    for (int i = 0; i < in->n; i++)
        if (in->f[i].dev == st->st_dev && in->f[i].ino == st->st_ino)
            return i;
    return -1;
}

int rt_inputs_refuse(const RtInputs *in, const char *flag, const char *out)
{
    struct stat st;
    int i = stat(out, &st) == 0 ? find(in, &st) : -1;
    if (i < 0)
        return 0;
    char name[PATH_MAX + 64];
    rt_err_set(2, "%s %s is %s: the run would overwrite its input; write it elsewhere", flag, out,
               input_name(in, i, name, sizeof name));
    return -1;
}

/* name is a folder of a --ckpt-dir that a save replaces or a prune removes */
static int ckpt_entry(const char *name)
{
    return !strncmp(name, "step-", 5) || !strncmp(name, ".step-", 6) || !strcmp(name, "best");
}

/* dir of path (path's folder, "." for a bare name) into buf, and a pointer to path's last component */
static const char *split(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, cap, ".");
    else
        snprintf(buf, cap, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return slash ? slash + 1 : path;
}

/* input f lies where a save or prune of a --ckpt-dir whose identity is ck replaces or removes files */
static int under_ckpt(const RtInFile *f, const struct stat *ck)
{
    char dir[PATH_MAX], up[PATH_MAX];
    struct stat st;
    const char *base = split(f->path, dir, sizeof dir);
    if (!strcmp(base, "latest") && stat(dir, &st) == 0 && st.st_dev == ck->st_dev && st.st_ino == ck->st_ino)
        return 1;
    base = split(dir, up, sizeof up);
    return ckpt_entry(base) && stat(up, &st) == 0 && st.st_dev == ck->st_dev && st.st_ino == ck->st_ino;
}

int rt_inputs_refuse_ckpt(const RtInputs *in, const char *dir)
{
    struct stat ck;
    if (stat(dir, &ck) != 0)
        return 0; /* not there yet: nothing in it */
    char name[PATH_MAX + 64];
    for (int i = 0; i < in->n; i++) {
        const RtInFile *f = &in->f[i];
        int same = f->dev == ck.st_dev && f->ino == ck.st_ino;
        if (same || (!f->resume && f->flag && under_ckpt(f, &ck))) {
            rt_err_set(2, "--ckpt-dir %s %s %s: the checkpoints would overwrite or remove it; save them elsewhere",
                       dir, same ? "is" : "holds", input_name(in, i, name, sizeof name));
            return -1;
        }
    }
    return 0;
}
