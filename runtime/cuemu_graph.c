/* cuemu_graph.c — the CUDA emulation's stream capture, events and graphs
 * (see cuemu_rt.c for the whole): a capture records what is enqueued on its
 * streams, in call order, as graph nodes (tasks by reference, event records
 * and waits by the capture's event numbers); a stream waiting for an event
 * recorded in a capture joins it as a lane; CUDA's refusals during a
 * capture invalidate it; cudaStreamEndCapture demands every lane joined
 * back; an instantiated graph owns a stream per extra lane and an event per
 * captured one, and cudaGraphLaunch enqueues the nodes in capture order.
 * Also cuemu_enqueue (capture or queue), the events' API and the
 * synchronising calls (refused on a capturing stream).
 */
#define _GNU_SOURCE

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cuemu_priv.h"

/* ----------------------------------------------------------------- capture */

typedef struct {
    OpKind kind;
    int lane;
    Task *task;          /* OP_TASK (a reference) */
    int event;           /* OP_RECORD / OP_WAIT: the capture's event number */
} Node;

struct CUgraph_st {
    Node *node;
    int nnode, nevent, nlane;
    int *lane_priority;  /* nlane */
};

struct Capture {
    cudaStream_t origin;
    enum cudaStreamCaptureMode mode;
    pthread_t thread;
    int invalid;
    cudaStream_t *lane;  /* nlane; lane[0] = origin */
    int nlane;
    cudaEvent_t *events; /* recorded in it, by number */
    struct CUgraph_st g;
    Capture *next;       /* the list of live captures */
};

/* the live captures; a thread's own global/thread-local one */
static pthread_mutex_t g_cap_mu = PTHREAD_MUTEX_INITIALIZER;
static Capture *g_caps;
static _Thread_local Capture *tl_cap;

static int grow_array(void **p, int n, size_t esize)
{
    if (n & (n - 1) && n > 0)
        return 0; /* room until the next power of two */
    void *q = realloc(*p, (size_t)(n ? 2 * n : 1) * esize);
    if (!q)
        return -1;
    *p = q;
    return 0;
}

static int add_node(Capture *c, Node n)
{
    if (grow_array((void **)&c->g.node, c->g.nnode, sizeof n) != 0)
        return -1;
    c->g.node[c->g.nnode++] = n;
    return 0;
}

static void invalidate(Capture *c, const char *call)
{
    if (!c->invalid)
        cuemu_complain(call, "not permitted during stream capture (cudaErrorStreamCaptureUnsupported): the "
                             "capture is invalidated");
    c->invalid = 1;
}

/* the calling thread may not make call now (a capture in the global mode
 * anywhere, or in the thread-local mode on this thread): invalidates it */
int capture_refuses(const char *call)
{
    pthread_mutex_lock(&g_cap_mu);
    Capture *hit = tl_cap;
    for (Capture *c = g_caps; c && !hit; c = c->next)
        if (c->mode == cudaStreamCaptureModeGlobal)
            hit = c;
    if (hit)
        invalidate(hit, call);
    pthread_mutex_unlock(&g_cap_mu);
    return hit != NULL;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return fail(cudaErrorStreamCaptureUnsupported);
    Capture *c = calloc(1, sizeof *c);
    if (!c)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_cap_mu);
    cudaError_t e = cudaSuccess;
    if (s->cap)
        e = cudaErrorIllegalState;
    else if (grow_array((void **)&c->lane, 0, sizeof *c->lane) != 0 ||
             grow_array((void **)&c->g.lane_priority, 0, sizeof(int)) != 0)
        e = cudaErrorMemoryAllocation;
    if (e == cudaSuccess) {
        c->origin = s, c->mode = mode, c->thread = pthread_self();
        c->lane[0] = s, c->g.lane_priority[0] = s->priority, c->nlane = c->g.nlane = 1;
        s->cap = c, s->lane = 0;
        c->next = g_caps, g_caps = c;
        if (mode != cudaStreamCaptureModeRelaxed)
            tl_cap = c;
    }
    pthread_mutex_unlock(&g_cap_mu);
    if (e != cudaSuccess) {
        free(c->lane);
        free(c->g.lane_priority);
        free(c);
    }
    return fail(e);
}

static void graph_free_nodes(struct CUgraph_st *g)
{
    for (int i = 0; i < g->nnode; i++)
        task_unref(g->node[i].task);
    free(g->node);
    free(g->lane_priority);
}

/* every lane but the origin ends in a record its origin... some lane waited for afterwards */
static int joined(const Capture *c)
{
    for (int l = 1; l < c->nlane; l++) {
        int last = -1, ok = 0;
        for (int i = 0; i < c->g.nnode; i++)
            if (c->g.node[i].lane == l)
                last = i;
        if (last < 0 || c->g.node[last].kind != OP_RECORD)
            return 0;
        for (int i = last + 1; i < c->g.nnode && !ok; i++)
            ok = c->g.node[i].kind == OP_WAIT && c->g.node[i].event == c->g.node[last].event &&
                 c->g.node[i].lane != l;
        if (!ok)
            return 0;
    }
    return 1;
}

/* ends capture c (g_cap_mu held): its streams and events leave it */
static void capture_end(Capture *c)
{
    for (int l = 0; l < c->nlane; l++)
        c->lane[l]->cap = NULL;
    for (int i = 0; i < c->g.nevent; i++) {
        if (c->events[i]->cap == c)
            c->events[i]->cap = NULL;
        event_unref(c->events[i]);
    }
    for (Capture **p = &g_caps; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    if (tl_cap == c)
        tl_cap = NULL;
    free(c->lane);
    free(c->events);
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    if (!graph)
        return fail(cudaErrorInvalidValue);
    *graph = NULL;
    pthread_mutex_lock(&g_cap_mu);
    Capture *c = s ? s->cap : NULL;
    cudaError_t e = !c                                                                      ? cudaErrorIllegalState
                    : c->origin != s                                                        ? cudaErrorStreamCaptureUnmatched
                    : c->mode == cudaStreamCaptureModeThreadLocal && !pthread_equal(c->thread, pthread_self())
                        ? cudaErrorStreamCaptureWrongThread
                    : c->invalid  ? cudaErrorStreamCaptureInvalidated
                    : !joined(c) ? cudaErrorStreamCaptureUnjoined
                                  : cudaSuccess;
    if (e == cudaErrorStreamCaptureUnjoined)
        cuemu_complain("cudaStreamEndCapture", "a stream that joined the capture was not joined back to its origin "
                                               "by an event wait");
    int end = c && e != cudaErrorStreamCaptureWrongThread && e != cudaErrorStreamCaptureUnmatched;
    struct CUgraph_st *g = NULL;
    if (end) {
        capture_end(c);
        if (e == cudaSuccess && (g = malloc(sizeof *g)) != NULL)
            *g = c->g;
        else
            graph_free_nodes(&c->g);
        if (e == cudaSuccess && !g)
            e = cudaErrorMemoryAllocation;
        free(c);
    }
    pthread_mutex_unlock(&g_cap_mu);
    *graph = g;
    return fail(e);
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    if (!g)
        return fail(cudaErrorInvalidValue);
    graph_free_nodes(g);
    free(g);
    return cudaSuccess;
}

/* records a task on capturing stream s (g_cap_mu held) */
static cudaError_t capture_task(cudaStream_t s, Task *t)
{
    Capture *c = s->cap;
    if (c->invalid) {
        task_unref(t);
        return cudaErrorStreamCaptureInvalidated;
    }
    if (add_node(c, (Node){OP_TASK, s->lane, t, -1}) != 0) {
        task_unref(t);
        return cudaErrorMemoryAllocation;
    }
    return cudaSuccess;
}

cudaError_t cuemu_enqueue(cudaStream_t s, const char *call, void (*run)(void *), const void *payload, size_t size)
{
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    Task *t = task_new(run, payload, size);
    if (!t) {
        cuemu_complain(call, "out of host memory for a %zu-byte operation", size);
        return fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_lock(&g_cap_mu);
    cudaError_t e = cudaSuccess;
    if (r->cap)
        e = capture_task(r, t);
    else if (push_op(r, OP_TASK, t, NULL, 0) != 0) {
        task_unref(t);
        e = cudaErrorMemoryAllocation;
    }
    pthread_mutex_unlock(&g_cap_mu);
    return fail(e);
}

/* ------------------------------------------------------------------ events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *pe, unsigned flags)
{
    if (!pe)
        return fail(cudaErrorInvalidValue);
    cudaEvent_t e = calloc(1, sizeof *e);
    if (!e)
        return fail(cudaErrorMemoryAllocation);
    atomic_init(&e->ref, 1);
    e->flags = flags;
    *pe = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *pe)
{
    return cudaEventCreateWithFlags(pe, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e)
        return fail(cudaErrorInvalidResourceHandle);
    event_unref(e); /* a pending record or wait holds its own reference */
    return cudaSuccess;
}

/* records ev into capture c on lane l (g_cap_mu held) */
static cudaError_t capture_record(Capture *c, int l, cudaEvent_t ev)
{
    if (c->invalid)
        return cudaErrorStreamCaptureInvalidated;
    if (grow_array((void **)&c->events, c->g.nevent, sizeof *c->events) != 0 ||
        add_node(c, (Node){OP_RECORD, l, NULL, c->g.nevent}) != 0)
        return cudaErrorMemoryAllocation;
    atomic_fetch_add(&ev->ref, 1);
    c->events[c->g.nevent] = ev;
    ev->cap = c;
    ev->cap_event = c->g.nevent++;
    return cudaSuccess;
}

/* *r := the stream s stands for (resolve) in a call on handle h: cudaSuccess, fail(bad) when h is NULL, or
 * fail(cudaErrorMemoryAllocation) when the legacy stream cannot be made */
static cudaError_t stream_for(const void *h, cudaError_t bad, cudaStream_t s, cudaStream_t *r)
{
    if (!h)
        return fail(bad);
    *r = resolve(s);
    return *r ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    cudaStream_t r;
    cudaError_t e = stream_for(ev, cudaErrorInvalidResourceHandle, s, &r);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&g_cap_mu);
    if (r->cap)
        e = capture_record(r->cap, r->lane, ev);
    else {
        ev->cap = NULL;
        if (push_record(r, ev) != 0)
            e = cudaErrorMemoryAllocation;
    }
    pthread_mutex_unlock(&g_cap_mu);
    return fail(e);
}

/* s joins capture c as a new lane (g_cap_mu held) */
static cudaError_t join_capture(Capture *c, cudaStream_t s)
{
    if (grow_array((void **)&c->lane, c->nlane, sizeof *c->lane) != 0 ||
        grow_array((void **)&c->g.lane_priority, c->nlane, sizeof(int)) != 0)
        return cudaErrorMemoryAllocation;
    c->lane[c->nlane] = s;
    c->g.lane_priority[c->nlane] = s->priority;
    s->cap = c;
    s->lane = c->nlane++;
    c->g.nlane = c->nlane;
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags)
{
    (void)flags;
    cudaStream_t r;
    cudaError_t e = stream_for(ev, cudaErrorInvalidResourceHandle, s, &r);
    if (e != cudaSuccess)
        return e;
    pthread_mutex_lock(&g_cap_mu);
    Capture *c = ev->cap;
    if (c && r->cap && r->cap != c)
        e = cudaErrorStreamCaptureMerge;
    else if (c && c->invalid)
        e = cudaErrorStreamCaptureInvalidated;
    else if (c) {
        if (!r->cap)
            e = join_capture(c, r);
        if (e == cudaSuccess && add_node(c, (Node){OP_WAIT, r->lane, NULL, ev->cap_event}) != 0)
            e = cudaErrorMemoryAllocation;
    } else if (r->cap) {
        cuemu_complain("cudaStreamWaitEvent", "a capturing stream waits for an event recorded outside the capture");
        r->cap->invalid = 1;
        e = cudaErrorStreamCaptureIsolation;
    } else if (push_wait(r, ev) != 0)
        e = cudaErrorMemoryAllocation;
    pthread_mutex_unlock(&g_cap_mu);
    return fail(e);
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (ev->cap)
        return fail(cudaErrorCapturedEvent);
    return event_done(ev) ? cudaSuccess : cudaErrorNotReady; /* not an error: the last error stays */
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (ev->cap)
        return fail(cudaErrorCapturedEvent);
    event_wait(ev);
    return cudaSuccess;
}

/* ------------------------------------------------------- synchronisation */

int capture_refuse_stream(cudaStream_t s, const char *call)
{
    pthread_mutex_lock(&g_cap_mu);
    Capture *c = s->cap;
    if (c)
        invalidate(c, call);
    pthread_mutex_unlock(&g_cap_mu);
    return c != NULL;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    if (capture_refuse_stream(r, "cudaStreamQuery"))
        return fail(cudaErrorStreamCaptureUnsupported);
    return stream_idle(r) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    if (capture_refuse_stream(r, "cudaStreamSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    stream_drain(r);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (capture_refuses("cudaDeviceSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    sync_all();
    return cudaSuccess;
}

/* ------------------------------------------------------------------ graphs */

struct CUgraphExec_st {
    struct CUgraph_st g;  /* its own copy: the graph may be destroyed */
    cudaStream_t *lane;   /* nlane; [0] unused (the launching stream) */
    cudaEvent_t *ev;      /* nevent, then the fork event, then one join event per lane */
};

static void exec_free(cudaGraphExec_t x)
{
    for (int l = 1; x->lane && l < x->g.nlane; l++)
        if (x->lane[l])
            stream_free(x->lane[l]);
    for (int i = 0; x->ev && i < x->g.nevent + 1 + x->g.nlane; i++)
        event_unref(x->ev[i]);
    free(x->lane);
    free(x->ev);
    graph_free_nodes(&x->g);
    free(x);
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *px, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    if (!px || !g)
        return fail(cudaErrorInvalidValue);
    *px = NULL;
    cudaGraphExec_t x = calloc(1, sizeof *x);
    if (!x)
        return fail(cudaErrorMemoryAllocation);
    x->g = *g;
    int nev = g->nevent + 1 + g->nlane;
    x->g.node = malloc((size_t)(g->nnode ? g->nnode : 1) * sizeof *x->g.node);
    x->g.lane_priority = malloc((size_t)g->nlane * sizeof(int));
    x->lane = calloc((size_t)g->nlane, sizeof *x->lane);
    x->ev = calloc((size_t)nev, sizeof *x->ev);
    int ok = x->g.node && x->g.lane_priority && x->lane && x->ev;
    if (ok) {
        memcpy(x->g.node, g->node, (size_t)g->nnode * sizeof *g->node);
        memcpy(x->g.lane_priority, g->lane_priority, (size_t)g->nlane * sizeof(int));
        for (int i = 0; i < g->nnode; i++)
            if (x->g.node[i].task)
                task_ref(x->g.node[i].task);
    } else
        x->g.nnode = 0;
    for (int l = 1; ok && l < g->nlane; l++)
        ok = (x->lane[l] = stream_new(g->lane_priority[l])) != NULL;
    for (int i = 0; ok && i < nev; i++)
        ok = cudaEventCreateWithFlags(&x->ev[i], cudaEventDisableTiming) == cudaSuccess;
    if (!ok) {
        exec_free(x);
        return fail(cudaErrorMemoryAllocation);
    }
    *px = x;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    cudaStream_t r;
    cudaError_t e = stream_for(x, cudaErrorInvalidValue, s, &r);
    if (e != cudaSuccess)
        return e;
    if (r->cap) {
        cuemu_complain("cudaGraphLaunch", "launching a graph into a capture is not emulated");
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    const struct CUgraph_st *g = &x->g;
    cudaEvent_t fork = x->ev[g->nevent];
    int bad = 0;
    if (g->nlane > 1)
        bad |= push_record(r, fork);
    for (int l = 1; l < g->nlane; l++)
        bad |= push_wait(x->lane[l], fork);
    for (int i = 0; i < g->nnode; i++) { /* capture order: each wait comes after its record */
        const Node *n = &g->node[i];
        cudaStream_t ls = n->lane ? x->lane[n->lane] : r;
        if (n->kind == OP_TASK)
            bad |= push_op(ls, OP_TASK, task_ref(n->task), NULL, 0);
        else if (n->kind == OP_RECORD)
            bad |= push_record(ls, x->ev[n->event]);
        else
            bad |= push_wait(ls, x->ev[n->event]);
    }
    for (int l = 1; l < g->nlane; l++) {
        cudaEvent_t join = x->ev[g->nevent + 1 + l];
        bad |= push_record(x->lane[l], join);
        bad |= push_wait(r, join);
    }
    return bad ? fail(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    if (!x)
        return fail(cudaErrorInvalidValue);
    exec_free(x); /* its streams finish their work first */
    return cudaSuccess;
}

