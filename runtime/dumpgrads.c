/* dumpgrads.c — --dump-grads DIR: after step 1, every unit's averaged
 * gradient shards (left untouched by the optimizer) are gathered to rank 0,
 * which writes one DIR/<parameter name>.npy per parameter, of the
 * parameter's shape (read from the ONNX model embedded in the init file at
 * start-up) and the unit's dtype, divided by the loss scale step 1 ran with.
 *
 * At start-up (rank 0, rt_dump_prepare): the file names (rt_output_file_name's
 * mapping), refused when two parameters map to one name, a name is too long
 * for the temporary rt_afile makes beside it, or a file is one of the run's
 * inputs; DIR made and checked (rt_prepare_dir); the shapes.  A parameter
 * whose shape the embedded model does not give is written flat, with one
 * warning.  After step 1 (collective, rt_dump_grads): the gather, the files
 * (npy_save: atomic), DIR synced, one line on stdout unless --quiet.  Errors
 * are start-up errors, agreed on by all ranks (err.c).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "onnx.pb-c.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

#ifndef NAME_MAX
#define NAME_MAX 255
#endif

void rt_dump_free(const RtModel *m, RtDump *d)
{
    for (int i = 0; d->path && i < m->nparam; i++)
        free(d->path[i]);
    free(d->path);
    free(d->rank);
    free(d->shape);
    memset(d, 0, sizeof *d);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* rank 0: the parameters' shapes from the ONNX model embedded in the init
 * file (d->rank[i] stays -1 where it cannot tell; those are written flat) */
static void dump_shapes(const RtModel *m, RtDump *d, int init_fd)
{
    if (m->model_len <= 0 || (uint64_t)m->model_len > (uint64_t)SIZE_MAX)
        return;
    uint8_t *buf = malloc((size_t)m->model_len);
    if (!buf)
        return;
    Onnx__ModelProto *mp = NULL;
    size_t got = 0;
    while (got < (size_t)m->model_len) {
        ssize_t k = pread(init_fd, buf + got, (size_t)m->model_len - got, (off_t)((size_t)m->model_off + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    if (got == (size_t)m->model_len)
        mp = onnx__model_proto__unpack(NULL, got, buf);
    if (mp && mp->graph) {
        Onnx__GraphProto *g = mp->graph;
        for (int i = 0; i < m->nparam; i++) {
            const RtParam *p = &m->param[i];
            for (size_t k = 0; p->name && k < g->n_initializer; k++) {
                const Onnx__TensorProto *t = g->initializer[k];
                if (!t->name || strcmp(t->name, p->name) != 0 || t->n_dims > RT_MAX_RANK)
                    continue;
                int64_t n = 1;
                for (size_t j = 0; j < t->n_dims; j++) {
                    d->shape[i][j] = t->dims[j];
                    n = t->dims[j] < 0 || (n && t->dims[j] > INT64_MAX / n) ? -1 : n * t->dims[j];
                    if (n < 0)
                        break;
                }
                if (n == p->numel)
                    d->rank[i] = (int)t->n_dims;
                break;
            }
        }
    }
    if (mp)
        onnx__model_proto__free_unpacked(mp, NULL);
    free(buf);
}

/* rank 0, at start-up: DIR, distinct file names that fit, the shapes */
int rt_dump_prepare(const RtModel *m, const char *dir, int init_fd, const RtInputs *in, RtDump *d)
{
    size_t np = m->nparam ? (size_t)m->nparam : 1, dl = strlen(dir);
    int slash = dl > 0 && dir[dl - 1] == '/';
    d->path = calloc(np, sizeof *d->path);
    d->rank = malloc(np * sizeof *d->rank);
    d->shape = calloc(np, sizeof *d->shape);
    char **names = calloc(np, sizeof *names);
    if (!d->path || !d->rank || !d->shape || !names) {
        free(names);
        rt_err_set(1, "out of memory");
        return -1;
    }
    int rc = 0;
    for (int i = 0; rc == 0 && i < m->nparam; i++) {
        const char *name = m->param[i].name ? m->param[i].name : "";
        d->rank[i] = -1;
        char *f = rt_output_file_name(name);
        if (!f || !(d->path[i] = malloc(dl + strlen(f) + 2))) {
            free(f);
            rt_err_set(1, "out of memory");
            rc = -1;
            break;
        }
        sprintf(d->path[i], "%s%s%s", dir, slash ? "" : "/", f);
        names[i] = d->path[i] + dl + !slash;
        free(f);
        if (strlen(names[i]) > NAME_MAX - 24) { /* room for the temporary .NAME.XXXXXX */
            rt_err_set(1, "--dump-grads: parameter '%.60s...': the name is too long for a file name", name);
            rc = -1;
        } else {
            rc = rt_inputs_refuse(in, "--dump-grads", d->path[i]);
        }
    }
    if (rc == 0 && m->nparam > 1) {
        qsort(names, (size_t)m->nparam, sizeof *names, cmp_str);
        for (int i = 1; i < m->nparam; i++)
            if (strcmp(names[i - 1], names[i]) == 0) {
                rt_err_set(1, "--dump-grads: two parameters would both be written to %s%s%s", dir,
                           slash ? "" : "/", names[i]);
                rc = -1;
                break;
            }
    }
    free(names);
    if (rc == 0)
        rc = rt_prepare_dir("--dump-grads", dir);
    if (rc == 0) {
        dump_shapes(m, d, init_fd);
        for (int i = 0; i < m->nparam; i++)
            if (d->rank[i] < 0) {
                rt_warn0("--dump-grads: no shape known for parameter '%s' (no embedded model?): its gradient is "
                      "written flat", m->param[i].name ? m->param[i].name : "?");
                break;
            }
    }
    return rc;
}

/* Collective, after step 1: every unit's gradient shards to rank 0, which
 * writes one file per parameter, divided by the loss scale step 1 ran with
 * (scale; 0: none).  Returns the exit status (0: go on). */
int rt_dump_grads(RtCtx *c, const RtDump *d, const char *dir, int quiet, double scale)
{
    const RtModel *m = c->m;
    char *full = NULL;
    if (c->rank == 0) {
        size_t most = 1;
        for (int u = 0; u < m->nunit; u++) {
            size_t n = (size_t)c->world * (size_t)c->shard_len[u] * (size_t)rt_elem_size(m->unit[u].dtype);
            if (n > most)
                most = n;
        }
        if (!(full = malloc(most)))
            rt_err_set(1, "--dump-grads: out of memory gathering the gradients (%zu bytes)", most);
    }
    int status = rt_err_sync();
    if (status != 0)
        return status;
    int failed = 0, nwritten = 0;
    for (int u = 0; u < m->nunit; u++) {
        int dt = m->unit[u].dtype;
        int64_t es = rt_elem_size(dt), bytes = c->shard_len[u] * es;
        char *grad = c->shard[u * RT_NSTATE + RT_S_GRAD];
        rt_dev_download(c, grad, bytes);
        rt_ctl_gather(grad, bytes, full, 0);
        if (c->rank == 0 && scale > 0 && dt == RT_F32) { /* fp16: the shards hold S times the gradient */
            const float inv = (float)(1.0 / scale);
            for (int64_t i = 0; i < (int64_t)c->world * c->shard_len[u]; i++) {
                float f;
                memcpy(&f, full + i * 4, 4);
                f *= inv;
                memcpy(full + i * 4, &f, 4);
            }
        }
        for (int i = 0; c->rank == 0 && !failed && i < m->nparam; i++) {
            const RtParam *p = &m->param[i];
            if (p->unit != u)
                continue;
            char why[1024];
            int64_t flat = p->numel;
            int rank = d->rank[i] < 0 ? 1 : d->rank[i];
            const int64_t *shape = d->rank[i] < 0 ? &flat : d->shape[i];
            if (npy_save(d->path[i], dt, rank, shape, full + p->offset * es, why, sizeof why) != 0) {
                rt_err_set(1, "--dump-grads: parameter '%s': %s", p->name ? p->name : "?", why);
                failed = 1;
            }
            nwritten++;
        }
    }
    if (c->rank == 0 && !failed && npy_sync_dir(dir) != 0)
        rt_err_set(1, "--dump-grads %s: syncing the directory: %s", dir, strerror(errno));
    free(full);
    if (c->rank == 0 && !failed && !quiet) {
        printf("step 1: wrote the gradients of %d parameters to %s\n", nwritten, dir);
        fflush(stdout);
    }
    return rt_err_sync();
}

