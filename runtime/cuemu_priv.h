/* cuemu_priv.h — private to the CUDA runtime emulation's C files
 * (cuemu_rt.c: errors, memory, the device, copies and fills; cuemu_queue.c:
 * tasks, streams and their workers, event records and waits; cuemu_graph.c:
 * stream capture, events, synchronisation, graphs): the objects behind
 * CUDA's handles and the calls between the three files.  Lock order:
 * g_cap_mu (cuemu_graph.c), then a stream's mutex or the events' mutex;
 * a worker takes only its stream's and the events'.
 */
#ifndef FSDPC_CUEMU_PRIV_H
#define FSDPC_CUEMU_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cuemu.h"

#define LEAST_PRIORITY 0
#define GREATEST_PRIORITY (-5)

/* ---- cuemu_rt.c ---- */
/* cuemu_fail under its short name */
static inline cudaError_t fail(cudaError_t e) { return cuemu_fail(e); }

/* ---- cuemu_queue.c ---- */
/* a payload shared by the queue entries and graph nodes that run it */
typedef struct {
    atomic_int ref;
    void (*run)(void *);
    size_t size;
    _Alignas(max_align_t) unsigned char data[];
} Task;

Task *task_new(void (*run)(void *), const void *payload, size_t size);
Task *task_ref(Task *t);
void task_unref(Task *t);

typedef enum { OP_TASK, OP_RECORD, OP_WAIT } OpKind;

typedef struct Op {
    OpKind kind;
    Task *task;          /* OP_TASK */
    cudaEvent_t ev;      /* OP_RECORD, OP_WAIT (a reference held) */
    uint64_t gen;        /* the record's number, or the one waited for */
    struct Op *next;
} Op;

typedef struct Capture Capture;

struct CUstream_st {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    Op *head, *tail;
    int busy, stop;
    int priority;
    unsigned delay_us;
    Capture *cap;        /* the capture it is part of, or NULL (g_cap_mu) */
    int lane;            /* its lane in cap */
};

struct CUevent_st {
    atomic_int ref;
    uint64_t recorded;   /* records enqueued (the events' mutex) */
    uint64_t done;       /* the highest record completed (the events' mutex) */
    unsigned flags;
    Capture *cap;        /* last recorded in this capture, or NULL (g_cap_mu) */
    int cap_event;       /* its number there */
};

void event_unref(cudaEvent_t e);
/* has ev's latest record completed?  wait until it has */
int event_done(cudaEvent_t ev);
void event_wait(cudaEvent_t ev);
/* a stream of this priority with its worker; NULL if out of memory */
cudaStream_t stream_new(int priority);
/* its worker runs what is queued, then ends; the stream is freed */
void stream_free(cudaStream_t s);
/* the stream a handle names (the legacy stream for NULL, cudaStreamLegacy, cudaStreamPerThread) */
cudaStream_t resolve(cudaStream_t s);
/* enqueue an operation (a reference to ev taken); 0 or -1 */
int push_op(cudaStream_t s, OpKind kind, Task *t, cudaEvent_t ev, uint64_t gen);
/* record ev on s now / make s wait for ev's latest record (nothing if none); 0 or -1 */
int push_record(cudaStream_t s, cudaEvent_t ev);
int push_wait(cudaStream_t s, cudaEvent_t ev);
int stream_idle(cudaStream_t s);
void stream_drain(cudaStream_t s);
/* every stream idle */
void sync_all(void);

/* ---- cuemu_graph.c ---- */
/* the calling thread may not make call now (a capture in the global mode
 * anywhere, or in the thread-local mode on this thread): invalidates it */
int capture_refuses(const char *call);
/* s is capturing: the capture is invalidated (call named) and 1 returned */
int capture_refuse_stream(cudaStream_t s, const char *call);

#endif
