/* dev_host.c — the device layer of the cpu target (rt_dev.h): the step runs
 * on the host allocation itself, so there is nothing to pick, copy or free;
 * the step's byte copies and fills (rt.h) are memcpy and memset; and its
 * collectives run on the communication thread.
 *
 * The communication thread (rt_coll_start / rt_coll_wait) is the cpu's
 * collective stream: a FIFO of jobs, run one at a time in start order while
 * the step computes, so every rank issues its collectives in the step's
 * order and they overlap the compute the schedule put between a start and
 * its Wait.  It starts with the first job of a multi-rank run and stops in
 * rt_dev_finish.  At world 1, where the control plane cannot call from
 * another thread (rt_ctl_threads), or with FSDPC_COMM_THREAD=0, a job runs
 * at once on the step's thread (the same results, no overlap).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

int rt_dev_init(const RtModel *m, int rank, int world, int64_t bytes, char *err, size_t errlen)
{
    (void)m, (void)rank, (void)world, (void)bytes, (void)err, (void)errlen;
    return 0;
}

void rt_dev_set_graph(int use_graph) { (void)use_graph; }

int rt_dev_attach(RtCtx *c, char *base, int64_t bytes, char *err, size_t errlen)
{
    (void)base, (void)bytes, (void)err, (void)errlen;
    c->dev_arena = c->arena;
    c->dev_slot = c->slot;
    c->dev_shard = c->shard;
    c->dev_acc = c->acc;
    return 0;
}

void rt_dev_upload(RtCtx *c, const void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_download(RtCtx *c, void *p, int64_t n) { (void)c, (void)p, (void)n; }

void rt_dev_step(RtCtx *c) { c->m->step(c); }

void rt_memcpy(void *dst, const void *src, int64_t bytes)
{
    if (bytes > 0)
        memcpy(dst, src, (size_t)bytes);
}

void rt_memset(void *dst, int byte, int64_t bytes)
{
    if (bytes > 0)
        memset(dst, byte, (size_t)bytes);
}

/* ------------------------------------------------- the communication thread */

typedef struct {
    void (*job)(RtCtx *);
    RtCtx *c;
    int node;
} Job;

static struct {
    int state;             /* 0 not decided, 1 the thread runs, -1 jobs run in place */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t more, done_cv;
    Job *q;                /* ring of cap jobs: [head, tail) queued */
    int64_t cap, head, tail;
    int64_t done;          /* jobs finished (job numbers 1 .. done) */
    int64_t *ticket;       /* per tag: the number of its last job */
    int stop;
} ct = {.lock = PTHREAD_MUTEX_INITIALIZER, .more = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER};

static void run_job(const Job *j)
{
    int64_t t0 = j->c->trace ? rt_now_ns() : 0;
    j->job(j->c);
    if (j->c->trace)
        rt_trace_coll(j->c, j->node, t0, rt_now_ns());
}

static void *comm_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&ct.lock);
    for (;;) {
        while (ct.head == ct.tail && !ct.stop)
            pthread_cond_wait(&ct.more, &ct.lock);
        if (ct.head == ct.tail)
            break;
        Job j = ct.q[ct.head % ct.cap];
        pthread_mutex_unlock(&ct.lock);
        run_job(&j);
        pthread_mutex_lock(&ct.lock);
        ct.head++;
        ct.done++;
        pthread_cond_broadcast(&ct.done_cv);
    }
    pthread_mutex_unlock(&ct.lock);
    return NULL;
}

/* the first job decides: a thread, or in place */
static void decide(RtCtx *c)
{
    const char *env = getenv("FSDPC_COMM_THREAD");
    ct.state = -1;
    if (c->world == 1 || (env && !strcmp(env, "0")))
        return;
    if (!rt_ctl_threads()) {
        if (c->rank == 0)
            fprintf(stderr, "%s: warning: the MPI library cannot take calls from a second thread "
                            "(MPI_THREAD_SERIALIZED): collectives run inside the step, without overlap\n", rt_prog);
        return;
    }
    ct.cap = c->m->ncoll + 1;
    ct.q = calloc((size_t)ct.cap, sizeof *ct.q);
    ct.ticket = calloc((size_t)ct.cap, sizeof *ct.ticket);
    if (!ct.q || !ct.ticket || pthread_create(&ct.thread, NULL, comm_thread, NULL) != 0)
        rt_step_fail(c, "cannot start the communication thread");
    ct.state = 1;
}

void rt_coll_start(RtCtx *c, int tag, int node, void (*job)(RtCtx *))
{
    if (tag < 0 || tag >= c->m->ncoll)
        rt_step_fail(c, "rt_coll_start: internal error: tag %d of %d", tag, c->m->ncoll);
    if (ct.state == 0)
        decide(c);
    Job j = {job, c, node};
    if (ct.state < 0) {
        run_job(&j);
        return;
    }
    pthread_mutex_lock(&ct.lock);
    if (ct.tail - ct.head == ct.cap) {
        pthread_mutex_unlock(&ct.lock);
        rt_step_fail(c, "rt_coll_start: internal error: more than %lld collectives in flight", (long long)ct.cap);
    }
    ct.q[ct.tail % ct.cap] = j;
    ct.ticket[tag] = ++ct.tail; /* job numbers count from 1: done >= ticket once it ran */
    pthread_cond_signal(&ct.more);
    pthread_mutex_unlock(&ct.lock);
}

void rt_coll_wait(RtCtx *c, int tag)
{
    if (tag < 0 || tag >= c->m->ncoll)
        rt_step_fail(c, "rt_coll_wait: internal error: tag %d of %d", tag, c->m->ncoll);
    if (ct.state < 0)
        return;
    pthread_mutex_lock(&ct.lock);
    while (ct.done < ct.ticket[tag])
        pthread_cond_wait(&ct.done_cv, &ct.lock);
    pthread_mutex_unlock(&ct.lock);
}

void rt_dev_finish(RtCtx *c)
{
    (void)c;
    if (ct.state == 1) {
        pthread_mutex_lock(&ct.lock);
        ct.stop = 1;
        pthread_cond_signal(&ct.more);
        pthread_mutex_unlock(&ct.lock);
        pthread_join(ct.thread, NULL);
    }
    free(ct.q);
    free(ct.ticket);
    ct.q = NULL;
    ct.ticket = NULL;
    ct.state = 0;
}
