/* cuemu_rt.c — the subset of the CUDA runtime that fsdpc's cuda runtime
 * calls (dev_cuda.c, kc_rt.c, comm_nccl.c), implemented on the host, so the
 * same object code runs without a GPU.  Compiled against the real toolkit
 * headers: the types, enums and constants are CUDA's own.
 *
 * Memory.  Device memory comes from one reserved mapping of the emulated
 * device's size (FSDPC_CUEMU_MEM_MIB, default 81559 MiB: an H100's), away
 * from the heap; each cudaMalloc takes whole pages of it (made readable and
 * writable, made inaccessible again by cudaFree) followed by 64 KiB that
 * stay inaccessible, and is registered; a fault there (past an allocation,
 * after cudaFree) is named in one line instead of a bare SIGSEGV.  cudaMallocHost registers pinned host memory.
 * Every copy and fill checks its pointers against the registry: a device
 * range must lie inside one allocation, a host range must not be device
 * memory, and the cudaMemcpyKind must say where each is; otherwise the call
 * fails (cudaErrorInvalidValue) with one line naming it.
 *
 * Streams.  Each stream (and the legacy stream, created on first use) is a
 * worker thread running its queue of operations in order, asynchronously
 * to the host and to the other streams.  Streams of a priority other than
 * 0 sleep FSDPC_CUEMU_DELAY_US (default 100) before each operation, so that
 * a missing event wait between streams shows as a wrong result instead of
 * passing by luck.  Copies: from pageable host memory the source is copied
 * when the call is made (CUDA stages it), into pageable host memory the
 * call waits for the copy (CUDA returns when it is done); pinned memory is
 * read and written when the stream gets there.  cudaMemcpy and cudaMemset
 * go on the legacy stream; cudaMemcpy then waits as CUDA's does (a pageable
 * source: only staged; the write may still be pending, as on a GPU).
 *
 * Events.  An event counts its records: cudaEventRecord takes the next
 * number and enqueues an operation that marks it done; cudaStreamWaitEvent
 * makes the stream wait for the number recorded at the time of the call
 * (CUDA's "most recent record"), and nothing for an event never recorded.
 *
 * Capture.  cudaStreamBeginCapture puts a stream in capture: what is
 * enqueued on it is recorded, in call order, as nodes of a graph (each
 * task's payload copied then), and a stream that waits for an event
 * recorded in the capture joins it as another lane.  cudaStreamEndCapture
 * demands every joined lane to end in an event its origin waited for
 * (cudaErrorStreamCaptureUnjoined).  What CUDA refuses during a capture in
 * the global or thread-local mode (a synchronous cudaMemcpy / cudaMemset,
 * cudaMalloc, cudaDeviceSynchronize, and cudaStreamQuery /
 * cudaStreamSynchronize of a capturing stream) returns
 * cudaErrorStreamCaptureUnsupported and invalidates the capture, whose end
 * then returns cudaErrorStreamCaptureInvalidated and no graph; waiting for
 * an event recorded outside the capture is cudaErrorStreamCaptureIsolation;
 * a pageable host pointer in a captured copy is refused too.
 * cudaGraphInstantiate makes the lanes other than the origin streams of
 * their own (of the captured priority); cudaGraphLaunch enqueues the nodes
 * in capture order, lane 0 on the launching stream, the others forked from
 * it and joined back at the end.
 *
 * Errors: each failing call returns its cudaError_t and sets the calling
 * thread's last error (cudaGetLastError reads and clears it).  Kernels
 * (cudaLibrary*, cudaFunc*, cudaLaunchKernel) are cuemu_launch.c's,
 * cuBLASLt cuemu_lt.c's, NCCL cuemu_nccl.c's; all enqueue through
 * cuemu_enqueue.
 *
 * Differences from CUDA that are on purpose: cudaStreamDestroy, cudaFree
 * and cudaGraphExecDestroy wait for the work before them (CUDA defers the
 * release); one device per process (every rank of a job has its own
 * emulated GPU); streams never synchronise with the legacy stream (fsdpc
 * makes non-blocking streams only).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuemu.h"

#define PAGE ((size_t)4096)
#define GUARD ((size_t)64 << 10) /* inaccessible bytes after each allocation */
#define CONTEXT_BYTES ((size_t)300 << 20) /* what a CUDA context takes of the device memory */
#define LEAST_PRIORITY 0
#define GREATEST_PRIORITY (-5)
#define NDEVICE 1

/* ------------------------------------------------------------------ errors */

static _Thread_local cudaError_t tl_last;

cudaError_t cuemu_fail(cudaError_t e)
{
    if (e != cudaSuccess)
        tl_last = e;
    return e;
}

static cudaError_t fail(cudaError_t e)
{
    return cuemu_fail(e);
}

void cuemu_complain(const char *call, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cuemu: %s: %s\n", call, msg);
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalState: return "operation not permitted in this state";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidKernelImage: return "device kernel image is invalid";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing "
                                                "blocking stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from "
                                                   "another thread";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unrecognized error code (cuemu)";
    }
}

const char *cudaGetErrorName(cudaError_t e)
{
    (void)e;
    return "cudaError (cuemu)";
}

/* ------------------------------------------------------------------ memory */

typedef struct {
    char *base;
    size_t size; /* as asked */
    size_t span; /* whole pages taken, the guard after them included */
} Alloc;

static struct {
    pthread_mutex_t mu;
    char *region;           /* the device memory, reserved */
    size_t total;           /* its size */
    size_t used;            /* pages taken */
    Alloc *dev, *pinned;    /* sorted by base */
    size_t ndev, npinned, capdev, cappinned;
} g_mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* the emulated device's memory, from FSDPC_CUEMU_MEM_MIB (0 if unusable) */
static size_t device_bytes(void)
{
    const char *v = getenv("FSDPC_CUEMU_MEM_MIB");
    unsigned long long mib = 81559;
    if (v && *v) {
        char *end;
        errno = 0;
        mib = strtoull(v, &end, 10);
        if (errno || *end || mib == 0 || mib > ((unsigned long long)1 << 24)) {
            cuemu_complain("FSDPC_CUEMU_MEM_MIB", "'%s' is not a size in MiB between 1 and 16777216", v);
            return 0;
        }
    }
    return (size_t)mib << 20;
}

/* ---- a fault in device memory: named, not a bare SIGSEGV ----
 * Each allocation is followed by GUARD inaccessible bytes and freed memory
 * is made inaccessible, so a kernel (or any host code) reading or writing
 * past an allocation, or after cudaFree, faults; the handler says so in one
 * line and ends the process.  A fault elsewhere goes to the handler that
 * was there before (ASan's, or the default). */
static struct sigaction g_old_segv;
static size_t upper(const Alloc *t, size_t n, const char *p); /* below */

static char *put_hex(char *p, uintptr_t v)
{
    char d[2 * sizeof v];
    int n = 0;
    do
        d[n++] = "0123456789abcdef"[v & 15];
    while ((v >>= 4) && n < (int)sizeof d);
    *p++ = '0', *p++ = 'x';
    while (n)
        *p++ = d[--n];
    return p;
}

static char *put_str(char *p, const char *s)
{
    while (*s)
        *p++ = *s++;
    return p;
}

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    const char *a = si->si_addr;
    if (!g_mem.region || a < g_mem.region || a >= g_mem.region + g_mem.total) {
        sigaction(SIGSEGV, &g_old_segv, NULL); /* not ours: fault again under the old handler */
        (void)sig, (void)ctx;
        return;
    }
    /* async-signal-safe: no locks, no stdio; the table is read as it is */
    char msg[256], *p = put_str(msg, "cuemu: a kernel or copy touched device memory at ");
    p = put_hex(p, (uintptr_t)a);
    size_t i = upper(g_mem.dev, g_mem.ndev, a);
    if (i > 0 && a >= g_mem.dev[i - 1].base) {
        p = put_str(p, ", past the end of the allocation at ");
        p = put_hex(p, (uintptr_t)g_mem.dev[i - 1].base);
        p = put_str(p, " of ");
        p = put_hex(p, (uintptr_t)g_mem.dev[i - 1].size);
        p = put_str(p, " bytes");
    } else
        p = put_str(p, ", outside any allocation (freed, or never allocated)");
    p = put_str(p, " (on a GPU: an illegal address)\n");
    if (write(2, msg, (size_t)(p - msg)) < 0)
        p = msg;
    signal(SIGABRT, SIG_DFL);
    abort();
}

static void catch_faults(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
}

/* reserves the device memory once (g_mem.mu held); 0 or an error */
static cudaError_t reserve(void)
{
    if (g_mem.region)
        return cudaSuccess;
    size_t total = device_bytes();
    if (total <= CONTEXT_BYTES)
        return cudaErrorInitializationError;
    void *p = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        cuemu_complain("cuemu", "cannot reserve %zu MiB of address space for the device memory", total >> 20);
        return cudaErrorInitializationError;
    }
    g_mem.region = p;
    catch_faults();
    g_mem.total = total;
    return cudaSuccess;
}

/* the index of the first allocation of t[0, n) whose base is above p */
static size_t upper(const Alloc *t, size_t n, const char *p)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the allocation of t holding [p, p + n), or NULL */
static const Alloc *find(const Alloc *t, size_t cnt, const void *p, size_t n)
{
    const char *c = p;
    size_t i = upper(t, cnt, c);
    if (i == 0)
        return NULL;
    const Alloc *a = &t[i - 1];
    if (c < a->base || n > a->size || (size_t)(c - a->base) > a->size - n)
        return NULL;
    return a;
}

/* inserts a into the sorted table *t (g_mem.mu held); 0 or -1 */
static int insert(Alloc **t, size_t *cnt, size_t *cap, Alloc a)
{
    if (*cnt == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        Alloc *b = realloc(*t, nc * sizeof *b);
        if (!b)
            return -1;
        *t = b, *cap = nc;
    }
    size_t i = upper(*t, *cnt, a.base);
    memmove(*t + i + 1, *t + i, (*cnt - i) * sizeof **t);
    (*t)[i] = a;
    (*cnt)++;
    return 0;
}

static void erase(Alloc *t, size_t *cnt, size_t i)
{
    memmove(t + i, t + i + 1, (*cnt - i - 1) * sizeof *t);
    (*cnt)--;
}

int cuemu_is_device(const void *p, size_t n)
{
    pthread_mutex_lock(&g_mem.mu);
    int r = find(g_mem.dev, g_mem.ndev, p, n) != NULL;
    pthread_mutex_unlock(&g_mem.mu);
    return r;
}

/* does [p, p + n) touch the device region at all? */
static int in_region(const void *p, size_t n)
{
    const char *c = p;
    return g_mem.region && c < g_mem.region + g_mem.total && c + n > g_mem.region;
}

/* is [p, p + n) pinned host memory? */
static int is_pinned(const void *p, size_t n)
{
    pthread_mutex_lock(&g_mem.mu);
    int r = find(g_mem.pinned, g_mem.npinned, p, n) != NULL;
    pthread_mutex_unlock(&g_mem.mu);
    return r;
}

/* first fit among the gaps of the sorted device table (g_mem.mu held) */
static char *first_fit(size_t span)
{
    char *at = g_mem.region, *end = g_mem.region + g_mem.total - CONTEXT_BYTES;
    for (size_t i = 0; i <= g_mem.ndev; i++) {
        char *next = i < g_mem.ndev ? g_mem.dev[i].base : end;
        if ((size_t)(next - at) >= span)
            return at;
        if (i < g_mem.ndev)
            at = g_mem.dev[i].base + g_mem.dev[i].span;
    }
    return NULL;
}

static int capture_refuses(const char *call); /* below */

cudaError_t cudaMalloc(void **p, size_t size)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = NULL;
    if (capture_refuses("cudaMalloc"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (size == 0)
        return cudaSuccess;
    if (size > ((size_t)1 << 50))
        return fail(cudaErrorMemoryAllocation);
    size_t pages = (size + PAGE - 1) / PAGE * PAGE, span = pages + GUARD;
    pthread_mutex_lock(&g_mem.mu);
    cudaError_t e = reserve();
    char *at = e == cudaSuccess ? first_fit(span) : NULL;
    if (e == cudaSuccess && !at)
        e = cudaErrorMemoryAllocation;
    if (at && (mprotect(at, pages, PROT_READ | PROT_WRITE) != 0 ||
               insert(&g_mem.dev, &g_mem.ndev, &g_mem.capdev, (Alloc){at, size, span}) != 0)) {
        mprotect(at, pages, PROT_NONE);
        e = cudaErrorMemoryAllocation;
    }
    if (e == cudaSuccess) {
        g_mem.used += span;
        *p = at;
    }
    pthread_mutex_unlock(&g_mem.mu);
    return fail(e);
}

cudaError_t cudaDeviceSynchronize(void);
static void sync_all(void); /* below */

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    sync_all(); /* CUDA's cudaFree synchronises too */
    pthread_mutex_lock(&g_mem.mu);
    size_t i = upper(g_mem.dev, g_mem.ndev, p);
    int ok = i > 0 && g_mem.dev[i - 1].base == (char *)p;
    if (ok) {
        Alloc a = g_mem.dev[i - 1];
        madvise(a.base, a.span, MADV_DONTNEED); /* zero pages next time, as fresh device memory need not be */
        mprotect(a.base, a.span, PROT_NONE);
        g_mem.used -= a.span;
        erase(g_mem.dev, &g_mem.ndev, i - 1);
    }
    pthread_mutex_unlock(&g_mem.mu);
    if (!ok) {
        cuemu_complain("cudaFree", "%p is not the start of a device allocation", p);
        return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t size)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = NULL;
    if (size == 0)
        return cudaSuccess;
    void *h = NULL;
    if (size > ((size_t)1 << 50) || posix_memalign(&h, PAGE, size) != 0)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_mem.mu);
    int r = insert(&g_mem.pinned, &g_mem.npinned, &g_mem.cappinned, (Alloc){h, size, size});
    pthread_mutex_unlock(&g_mem.mu);
    if (r != 0) {
        free(h);
        return fail(cudaErrorMemoryAllocation);
    }
    *p = h;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p)
        return cudaSuccess;
    sync_all();
    pthread_mutex_lock(&g_mem.mu);
    size_t i = upper(g_mem.pinned, g_mem.npinned, p);
    int ok = i > 0 && g_mem.pinned[i - 1].base == (char *)p;
    if (ok)
        erase(g_mem.pinned, &g_mem.npinned, i - 1);
    pthread_mutex_unlock(&g_mem.mu);
    if (!ok) {
        cuemu_complain("cudaFreeHost", "%p is not pinned memory from cudaMallocHost", p);
        return fail(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *total)
{
    pthread_mutex_lock(&g_mem.mu);
    cudaError_t e = reserve();
    if (e == cudaSuccess) {
        *total = g_mem.total;
        *fr = g_mem.total - CONTEXT_BYTES - g_mem.used;
    }
    pthread_mutex_unlock(&g_mem.mu);
    return fail(e);
}

/* ------------------------------------------------------------------ device */

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = NDEVICE;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *v)
{
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    return d >= 0 && d < NDEVICE ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d)
{
    if (d < 0 || d >= NDEVICE)
        return fail(cudaErrorInvalidDevice);
    size_t fr, total;
    cudaError_t e = cudaMemGetInfo(&fr, &total);
    if (e != cudaSuccess)
        return e;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cuemu (an emulated NVIDIA H100, sm_90)");
    p->totalGlobalMem = total;
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = 227 << 10;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024, p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff, p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->totalConstMem = 64 << 10;
    p->major = 9, p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    p->l2CacheSize = 50 << 20;
    p->memoryBusWidth = 5120;
    p->concurrentKernels = p->unifiedAddressing = p->streamPrioritiesSupported = 1;
    p->asyncEngineCount = 2;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = LEAST_PRIORITY;
    if (greatest)
        *greatest = GREATEST_PRIORITY;
    return cudaSuccess;
}

/* ------------------------------------------------------------------- tasks */

/* a payload shared by the queue entries and graph nodes that run it */
typedef struct {
    atomic_int ref;
    void (*run)(void *);
    size_t size;
    _Alignas(max_align_t) unsigned char data[];
} Task;

static Task *task_new(void (*run)(void *), const void *payload, size_t size)
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

static Task *task_ref(Task *t)
{
    atomic_fetch_add(&t->ref, 1);
    return t;
}

static void task_unref(Task *t)
{
    if (t && atomic_fetch_sub(&t->ref, 1) == 1)
        free(t);
}

/* ---------------------------------------------------------------- streams */

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
    Capture *cap;        /* the capture it is part of, or NULL */
    int lane;            /* its lane in cap */
};

struct CUevent_st {
    atomic_int ref;
    uint64_t recorded;   /* records enqueued (g_ev.mu) */
    uint64_t done;       /* the highest record completed (g_ev.mu) */
    unsigned flags;
    Capture *cap;        /* last recorded in this capture, or NULL */
    int cap_event;       /* its number there */
};

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

static void event_unref(cudaEvent_t e)
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

static cudaStream_t stream_new(int priority)
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
static cudaStream_t resolve(cudaStream_t s)
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

static int push_op(cudaStream_t s, OpKind kind, Task *t, cudaEvent_t ev, uint64_t gen)
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
static int push_record(cudaStream_t s, cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    uint64_t gen = ++ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return push_op(s, OP_RECORD, NULL, ev, gen);
}

/* s waits for ev's latest record (nothing if never recorded) */
static int push_wait(cudaStream_t s, cudaEvent_t ev)
{
    pthread_mutex_lock(&g_ev.mu);
    uint64_t gen = ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return gen ? push_op(s, OP_WAIT, NULL, ev, gen) : 0;
}

static int stream_idle(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    int idle = !s->head && !s->busy;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

static void stream_drain(cudaStream_t s)
{
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void sync_all(void)
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

static void stream_free(cudaStream_t s)
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
static int capture_refuses(const char *call)
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

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_cap_mu);
    cudaError_t e = cudaSuccess;
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
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_cap_mu);
    cudaError_t e = cudaSuccess;
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
    pthread_mutex_lock(&g_ev.mu);
    int done = ev->done >= ev->recorded;
    pthread_mutex_unlock(&g_ev.mu);
    return done ? cudaSuccess : cudaErrorNotReady; /* not an error: the last error stays */
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
    if (!ev)
        return fail(cudaErrorInvalidResourceHandle);
    if (ev->cap)
        return fail(cudaErrorCapturedEvent);
    pthread_mutex_lock(&g_ev.mu);
    uint64_t want = ev->recorded;
    while (ev->done < want)
        pthread_cond_wait(&g_ev.cv, &g_ev.mu);
    pthread_mutex_unlock(&g_ev.mu);
    return cudaSuccess;
}

/* ------------------------------------------------------- synchronisation */

/* a query or synchronize of stream s: refused while s captures */
static int capturing(cudaStream_t s, const char *call)
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
    if (capturing(r, "cudaStreamQuery"))
        return fail(cudaErrorStreamCaptureUnsupported);
    return stream_idle(r) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
    if (capturing(r, "cudaStreamSynchronize"))
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

/* ------------------------------------------------------- copies and fills */

typedef struct {
    void *dst;
    const void *src;     /* NULL: the bytes follow (staged) */
    size_t n;
    unsigned char staged[];
} CopyArgs;

static void run_copy(void *p)
{
    CopyArgs *a = p;
    memmove(a->dst, a->src ? a->src : a->staged, a->n);
}

typedef struct {
    void *dst;
    int byte;
    size_t n;
} FillArgs;

static void run_fill(void *p)
{
    FillArgs *a = p;
    memset(a->dst, a->byte, a->n);
}

static const char *kind_name(enum cudaMemcpyKind k)
{
    static const char *names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                  "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    return (unsigned)k < 5 ? names[k] : "an unknown cudaMemcpyKind";
}

/* is one side of a copy where its kind says (dev: device memory expected)? */
static int side_ok(const char *call, enum cudaMemcpyKind kind, const char *which, const void *p, size_t n, int dev)
{
    if (dev && !cuemu_is_device(p, n)) {
        cuemu_complain(call, "%s: the %s [%p, +%zu bytes) is not inside a device allocation%s", kind_name(kind), which,
                       p, n, in_region(p, n) ? " (it runs past one, or into freed memory)" : " (it is host memory)");
        return 0;
    }
    if (!dev && in_region(p, n)) {
        cuemu_complain(call, "%s: the %s [%p, +%zu bytes) is device memory, not host memory", kind_name(kind), which, p,
                       n);
        return 0;
    }
    return 1;
}

/* checks a copy's pointers against its kind (Default: whatever they are); -1 after a message */
static int check_copy(const char *call, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                      int *dst_dev, int *src_dev)
{
    if ((unsigned)kind > cudaMemcpyDefault || !dst || !src) {
        cuemu_complain(call, "%s from %p to %p", kind_name(kind), src, dst);
        return -1;
    }
    *dst_dev = kind == cudaMemcpyDefault ? in_region(dst, n) : kind == cudaMemcpyHostToDevice ||
                                                                   kind == cudaMemcpyDeviceToDevice;
    *src_dev = kind == cudaMemcpyDefault ? in_region(src, n) : kind == cudaMemcpyDeviceToHost ||
                                                                   kind == cudaMemcpyDeviceToDevice;
    if (!side_ok(call, kind, "destination", dst, n, *dst_dev) || !side_ok(call, kind, "source", src, n, *src_dev))
        return -1;
    return 0;
}

/* the asynchronous copy both cudaMemcpyAsync and cudaMemcpy make; *wait: the destination is pageable (CUDA
 * returns when the copy is done), *staged: the source was (copied now) */
static cudaError_t copy_async(const char *call, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                              cudaStream_t s, int *wait, int *staged)
{
    int dd, sd;
    *wait = *staged = 0;
    if (n == 0)
        return cudaSuccess;
    if (check_copy(call, dst, src, n, kind, &dd, &sd) != 0)
        return fail(cudaErrorInvalidValue);
    int stage = !sd && !is_pinned(src, n), pageable_dst = !dd && !is_pinned(dst, n);
    cudaStream_t r = resolve(s);
    if (r && r->cap && (stage || pageable_dst)) {
        cuemu_complain(call, "%s with pageable host memory in a captured copy (use pinned memory)", kind_name(kind));
        pthread_mutex_lock(&g_cap_mu);
        if (r->cap)
            r->cap->invalid = 1;
        pthread_mutex_unlock(&g_cap_mu);
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    size_t extra = stage ? n : 0;
    CopyArgs *a = malloc(sizeof *a + extra);
    if (!a)
        return fail(cudaErrorMemoryAllocation);
    a->dst = dst, a->src = stage ? NULL : src, a->n = n;
    if (stage)
        memcpy(a->staged, src, n); /* CUDA stages a pageable source before returning */
    cudaError_t e = cuemu_enqueue(s, call, run_copy, a, sizeof *a + extra);
    free(a);
    *wait = e == cudaSuccess && pageable_dst;
    *staged = stage;
    return e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s)
{
    int wait, staged;
    cudaError_t e = copy_async("cudaMemcpyAsync", dst, src, n, kind, s, &wait, &staged);
    if (wait) /* into pageable memory the call returns when the copy is done */
        stream_drain(resolve(s));
    return e;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (capture_refuses("cudaMemcpy"))
        return fail(cudaErrorStreamCaptureUnsupported);
    int wait, staged;
    cudaError_t e = copy_async("cudaMemcpy", dst, src, n, kind, NULL, &wait, &staged);
    /* synchronous, but from a pageable source it returns once staged (the
     * write may still be pending on the legacy stream, as on a GPU) */
    if (e == cudaSuccess && n && !staged)
        stream_drain(resolve(NULL));
    return e;
}

static cudaError_t fill(const char *call, void *dst, int byte, size_t n, cudaStream_t s)
{
    if (n == 0)
        return cudaSuccess;
    if (!cuemu_is_device(dst, n)) {
        cuemu_complain(call, "[%p, +%zu bytes) is not inside a device allocation", dst, n);
        return fail(cudaErrorInvalidValue);
    }
    FillArgs a = {dst, byte, n};
    return cuemu_enqueue(s, call, run_fill, &a, sizeof a);
}

cudaError_t cudaMemsetAsync(void *dst, int byte, size_t n, cudaStream_t s)
{
    return fill("cudaMemsetAsync", dst, byte, n, s);
}

cudaError_t cudaMemset(void *dst, int byte, size_t n)
{
    if (capture_refuses("cudaMemset"))
        return fail(cudaErrorStreamCaptureUnsupported);
    return fill("cudaMemset", dst, byte, n, NULL); /* asynchronous for device memory, as CUDA's */
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
    if (!x)
        return fail(cudaErrorInvalidValue);
    cudaStream_t r = resolve(s);
    if (!r)
        return fail(cudaErrorMemoryAllocation);
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
