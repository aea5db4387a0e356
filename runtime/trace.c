/* trace.c — --trace FILE.json: a Chrome-trace timeline of the first steps.
 *
 * The cpu step calls rt_trace after every node (and at its start) while
 * c->trace is set; each call stamps CLOCK_MONOTONIC, so node i ran between
 * the previous stamp and its own (a collective's node: handing it over; its
 * Wait node: the time the step waited for it).  The communication thread
 * records each collective's own run (rt_trace_coll).  At the end every rank's
 * events go to rank 0, which writes one JSON file (atomically): one process
 * per rank, the step on thread 0 and the collectives on thread 1 (where
 * they overlap the step), in microseconds since
 * rank 0's first stamp (the ranks' clocks are the host's: on one machine they
 * agree; across machines each rank is shifted by its clock's offset).  The
 * cuda step is asynchronous, so it has no host stamps: the executable refuses
 * --trace there (an Nsight Systems capture shows its streams).
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <pthread.h>
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
    int64_t t0, t1;      /* ns */
    int32_t node, step;  /* node -2: padding */
    int32_t tid, pad;    /* 0 the step, 1 the collectives */
} Ev;

typedef struct {
    Ev *ev;
    int64_t n, cap;
    int64_t last;        /* the step's previous stamp */
    pthread_mutex_t lock; /* two threads append */
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
    int64_t cap, per; /* events: per step, in all */
    int wraps = __builtin_mul_overflow((int64_t)c->m->nnode + c->m->ncoll, c->accum > 0 ? c->accum : 1, &per) ||
                __builtin_mul_overflow(steps, per, &cap) || (uint64_t)cap > SIZE_MAX / sizeof(Ev);
    Ev *ev = !wraps && cap > 0 ? malloc(sizeof *ev * (size_t)cap) : NULL;
    if (!t || wraps || (cap > 0 && !ev)) {
        free(t);
        free(ev);
        rt_err_set(1, "--trace-steps %lld: out of memory for the events of so many steps (trace fewer)",
                   (long long)steps);
        return -1;
    }
    t->ev = ev;
    t->cap = cap;
    pthread_mutex_init(&t->lock, NULL);
    c->trace = t;
    return 0;
}

static void add(Trace *t, Ev e)
{
    pthread_mutex_lock(&t->lock);
    if (t->n < t->cap)
        t->ev[t->n++] = e;
    pthread_mutex_unlock(&t->lock);
}

void rt_trace(RtCtx *c, int node)
{
    Trace *t = c->trace;
    int64_t now = now_ns();
    if (node >= 0)
        add(t, (Ev){.t0 = t->last, .t1 = now, .node = node, .step = (int32_t)c->step});
    t->last = now;
}

void rt_trace_coll(RtCtx *c, int node, int64_t t0, int64_t t1)
{
    add(c->trace, (Ev){.t0 = t0, .t1 = t1, .node = node, .step = (int32_t)c->step, .tid = 1});
}

int64_t rt_now_ns(void) { return now_ns(); }

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
            RtAFile af;
            FILE *f = rt_afile_fopen(&af, path, 0666);
            int64_t t0 = INT64_MAX;
            for (int64_t i = 0; i < most * c->world; i++)
                if (all[i].node >= 0 && all[i].t0 < t0)
                    t0 = all[i].t0;
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
                    for (int64_t i = 0; i < most; i++) {
                        if (e[i].node < 0 || e[i].node >= m->nnode)
                            continue; /* padding */
                        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
                                "\"args\": {\"step\": %d}, \"name\": \"", r, e[i].tid ? 1 : 0,
                                (double)(e[i].t0 - t0) / 1e3, (double)(e[i].t1 - e[i].t0) / 1e3, e[i].step);
                        json_str(f, m->trace_name[e[i].node]);
                        fprintf(f, "\"}");
                    }
                }
                fprintf(f, "\n]}\n");
            }
            if (!f || rt_afile_commit(&af) != 0)
                rt_err_set(1, "--trace %s: cannot write: %s", path, strerror(errno));
        }
        status = rt_err_sync();
    }
    free(mine);
    free(all);
    free(t->ev);
    pthread_mutex_destroy(&t->lock);
    free(t);
    c->trace = NULL;
    return status;
}
