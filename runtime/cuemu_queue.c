/* cuemu_queue.c — the CUDA emulation's streams (see cuemu_rt.c for the
 * whole): a task (a function and its copied payload, shared by reference
 * between queue entries and graph nodes), a stream as a worker thread
 * running its queue in order, event records and waits by record number
 * (a wait enqueued for the number recorded at the time of the call), the
 * legacy stream made on first use, and draining one stream or all.
 * Streams of a priority other than 0 sleep FSDPC_CUEMU_DELAY_US (default
 * 100) before each operation so that a missing wait shows.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuemu_priv.h"

/* ------------------------------------------------------------------- tasks */

Task *task_new(void (*run)(void *), const void *payload, size_t size)
{
    if (size > ((size_t)1 << 48))
        return NULL;
    Task *t = malloc(sizeof *t + size);
    if (!t)
        return NULL;
    atomic_init(&t->ref, 1);
    t->run = run;
    t->size = size;
    if (size)
        memcpy(t->data, payload, size);
    return t;
}

Task *task_ref(Task *t)
{
    atomic_fetch_add(&t->ref, 1);
    return t;
}

void task_unref(Task *t)
{
    if (t && atomic_fetch_sub(&t->ref, 1) == 1)
        free(t);
}

/* ---------------------------------------------------------------- streams */

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
} g_ev = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

/* every stream, for cudaDeviceSynchronize (g_streams.mu) */
static struct {
    pthread_mutex_t mu;
    cudaStream_t *s;
    size_t n, cap;
    cudaStream_t legacy;
} g_streams = {.mu = PTHREAD_MUTEX_INITIALIZER};

void event_unref(cudaEvent_t e)
{
    if (e && atomic_fetch_sub(&e->ref, 1) == 1)
        free(e);
}

static void nap_us(unsigned us)
{
    struct timespec t = {us / 1000000, (long)(us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static void exec_op(Op *op)
{
    switch (op->kind) {
    case OP_TASK:
        op->task->run(op->task->data);
        task_unref(op->task);
        break;
    case OP_RECORD:
        pthread_mutex_lock(&g_ev.mu);
        if (op->ev->done < op->gen)
            op->ev->done = op->gen;
        pthread_cond_broadcast(&g_ev.cv);
        pthread_mutex_unlock(&g_ev.mu);
        event_unref(op->ev);
        break;
    case OP_WAIT:
        pthread_mutex_lock(&g_ev.mu);
        while (op->ev->done < op->gen)
            pthread_cond_wait(&g_ev.cv, &g_ev.mu);
        pthread_mutex_unlock(&g_ev.mu);
        event_unref(op->ev);
        break;
    }
}

static void *worker(void *arg)
{
    cudaStream_t s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work, &s->mu);
        Op *op = s->head;
        if (!op)
            break;
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (s->delay_us)
            nap_us(s->delay_us);
        exec_op(op);
        free(op);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        if (!s->head)
            pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static unsigned slow_us(int priority)
{
    if (priority == 0)
        return 0;
    const char *v = getenv("FSDPC_CUEMU_DELAY_US");
    long us = v && *v ? strtol(v, NULL, 10) : 100;
    return us < 0 ? 0 : us > 1000000 ? 1000000 : (unsigned)us;
}

cudaStream_t stream_new(int priority)
{
    cudaStream_t s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->priority = priority;
    s->delay_us = slow_us(priority);
    pthread_mutex_lock(&g_streams.mu);
    int ok = 1;
    if (g_streams.n == g_streams.cap) {
        size_t nc = g_streams.cap ? g_streams.cap * 2 : 16;
        cudaStream_t *t = realloc(g_streams.s, nc * sizeof *t);
        if (t)
            g_streams.s = t, g_streams.cap = nc;
        else
            ok = 0;
    }
    if (ok && pthread_create(&s->thread, NULL, worker, s) != 0)
        ok = 0;
    if (ok)
        g_streams.s[g_streams.n++] = s;
    pthread_mutex_unlock(&g_streams.mu);
    if (!ok) {
        free(s);
        return NULL;
    }
    return s;
}

/* the stream a handle names: NULL, cudaStreamLegacy and cudaStreamPerThread are the legacy stream */
cudaStream_t resolve(cudaStream_t s)
{
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread)
        return s;
    pthread_mutex_lock(&g_streams.mu);
    cudaStream_t l = g_streams.legacy;
    pthread_mutex_unlock(&g_streams.mu);
    if (l)
        return l;
    l = stream_new(0);
    pthread_mutex_lock(&g_streams.mu);
    if (!g_streams.legacy)
        g_streams.legacy = l; /* a race lost leaves an idle stream: harmless */
    l = g_streams.legacy;
    pthread_mutex_unlock(&g_streams.mu);
    return l;
}

static void push(cudaStream_t s, Op *op)
{
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

int push_op(cudaStream_t s, OpKind kind, Task *t, cudaEvent_t ev, uint64_t gen)
{
    Op *op = calloc(1, sizeof *op);
    if (!op)
        return -1;
    op->kind = kind, op->task = t, op->ev = ev, op->gen = gen;
    if (ev)
        atomic_fetch_add(&ev->ref, 1);
    push(s, op);
    return 0;
}

/* records ev on s now (not captured) */
int push_record(cudaStream_t s, cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    uint64_t gen = ++ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return push_op(s, OP_RECORD, NULL, ev, gen);
}

/* s waits for ev's latest record (nothing if never recorded) */
int push_wait(cudaStream_t s, cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    uint64_t gen = ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return gen ? push_op(s, OP_WAIT, NULL, ev, gen) : 0;
}

int stream_idle(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    int idle = !s->head && !s->busy;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void stream_drain(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void sync_all(void)
{
    pthread_mutex_lock(&g_streams.mu);
    size_t n = g_streams.n;
    cudaStream_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy && n)
        memcpy(copy, g_streams.s, n * sizeof *copy);
    pthread_mutex_unlock(&g_streams.mu);
    /* one pass: a stream waiting for another's event drains as that one's worker gets there on its own */
    for (size_t i = 0; copy && i < n; i++)
        stream_drain(copy[i]);
    free(copy);
}

void stream_free(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* runs what was queued first */
    pthread_mutex_lock(&g_streams.mu);
    for (size_t i = 0; i < g_streams.n; i++)
        if (g_streams.s[i] == s) {
            g_streams.s[i] = g_streams.s[--g_streams.n];
            break;
        }
    pthread_mutex_unlock(&g_streams.mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *ps, unsigned flags, int priority)
{
    (void)flags; /* no stream here synchronises with the legacy one: fsdpc makes non-blocking ones only */
    if (!ps)
        return fail(cudaErrorInvalidValue);
    int p = priority > LEAST_PRIORITY ? LEAST_PRIORITY : priority < GREATEST_PRIORITY ? GREATEST_PRIORITY : priority;
    *ps = stream_new(p);
    return *ps ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaStreamCreate(cudaStream_t *ps)
{
    return cudaStreamCreateWithPriority(ps, cudaStreamDefault, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return fail(cudaErrorInvalidResourceHandle);
    if (s->cap) {
        cuemu_complain("cudaStreamDestroy", "the stream is capturing");
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    stream_free(s);
    return cudaSuccess;
}


int event_done(cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    int done = ev->done >= ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return done;
}

void event_wait(cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    uint64_t want = ev->recorded;
    while (ev->done < want)
        pthread_cond_wait(&g_ev.cv, &g_ev.mu);
    pthread_mutex_unlock(&g_ev.mu);
}

