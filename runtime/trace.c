/* trace.c — --trace FILE.json: a Chrome-trace timeline of the first steps.
 *
 * The cpu step calls rt_trace after every node (and at its start) while
 * c->trace is set; each call stamps CLOCK_MONOTONIC, so node i ran between
 * the previous stamp and its own.  At the end every rank's events go to
 * rank 0, which writes one JSON file (atomically): one process per rank,
 * compute on thread 0 and collectives on thread 1, in microseconds since
 * rank 0's first stamp (the ranks' clocks are the host's: on one machine they
 * agree; across machines each rank is shifted by its clock's offset).  The
 * cuda step is asynchronous, so it has no host stamps: the executable refuses
 * --trace there (an Nsight Systems capture shows its streams).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "npy.h"
#include "rt_ctl.h"
#include "rt_priv.h"

typedef struct {
    int64_t ns;
    int32_t node, step;
} Ev;

typedef struct {
    Ev *ev;
    int64_t n, cap;
} Trace;

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int rt_trace_start(RtCtx *c, int64_t steps)
{
    Trace *t = calloc(1, sizeof *t);
    int64_t cap = steps * ((int64_t)c->m->nnode + 1);
    Ev *ev = cap > 0 ? malloc(sizeof *ev * (size_t)cap) : NULL;
    if (!t || (cap > 0 && !ev)) {
        free(t);
        free(ev);
        rt_err_set(1, "--trace: out of memory for %lld events", (long long)(steps * (c->m->nnode + 1)));
        return -1;
    }
    t->ev = ev;
    t->cap = cap;
    c->trace = t;
    return 0;
}

void rt_trace(RtCtx *c, int node)
{
    Trace *t = c->trace;
    if (t->n < t->cap)
        t->ev[t->n++] = (Ev){now_ns(), node, (int32_t)c->step};
}

/* s as a JSON string body (names come from the model: untrusted) */
static void json_str(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

int rt_trace_write(RtCtx *c, const char *path)
{
    Trace *t = c->trace;
    const RtModel *m = c->m;
    int64_t n = t->n, most = n;
    rt_ctl_allreduce_i64(&most, 1, RT_CTL_MAX);
    /* every rank's events, padded to the longest, to rank 0 */
    Ev *mine = calloc((size_t)most + 1, sizeof *mine), *all = NULL;
    if (mine)
        memcpy(mine, t->ev, sizeof *mine * (size_t)n);
    for (int64_t i = n; mine && i < most; i++)
        mine[i].node = -2; /* padding */
    if (c->rank == 0)
        all = calloc((size_t)(most * c->world) + 1, sizeof *all);
    if (!mine || (c->rank == 0 && !all))
        rt_err_set(1, "--trace: out of memory");
    int status = rt_err_sync();
    if (status == 0) {
        rt_ctl_gather(mine, most * (int64_t)sizeof *mine, all, 0);
        if (c->rank == 0) {
            char tmp[4096];
            snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
            FILE *f = fopen(tmp, "w");
            int64_t t0 = all[0].ns;
            for (int64_t i = 0; i < most * c->world; i++)
                if (all[i].node >= -1 && all[i].ns < t0)
                    t0 = all[i].ns;
            if (f) {
                fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
                int first = 1;
                for (int r = 0; r < c->world; r++) {
                    fprintf(f, "%s{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": "
                            "\"rank %d\"}}", first ? "" : ",\n", r, r);
                    first = 0;
                    fprintf(f, ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": 0, \"args\": "
                            "{\"name\": \"compute\"}},\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": "
                            "1, \"args\": {\"name\": \"collectives\"}}", r, r);
                    const Ev *e = all + (int64_t)r * most;
                    for (int64_t i = 1; i < most && e[i].node >= -1; i++) {
                        if (e[i].node < 0 || e[i].node >= m->nnode)
                            continue; /* a step's start: the next stamps measure from it */
                        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                                "\"args\": {\"step\": %d}, \"name\": \"", r, m->trace_coll[e[i].node] ? 1 : 0,
                                (double)(e[i - 1].ns - t0) / 1e3, (double)(e[i].ns - e[i - 1].ns) / 1e3, e[i].step);
                        json_str(f, m->trace_name[e[i].node]);
                        fprintf(f, "\"}");
                    }
                }
                fprintf(f, "\n]}\n");
            }
            int bad = !f || ferror(f) || fflush(f) != 0 || fsync(fileno(f)) != 0;
            if (f && fclose(f) != 0)
                bad = 1;
            if (bad || rename(tmp, path) != 0) {
                rt_err_set(1, "--trace %s: cannot write: %s", path, strerror(errno));
                unlink(tmp);
            }
        }
        status = rt_err_sync();
    }
    free(mine);
    free(all);
    free(t->ev);
    free(t);
    c->trace = NULL;
    return status;
}
