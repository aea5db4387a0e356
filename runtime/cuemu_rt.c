/* cuemu_rt.c — the subset of the CUDA runtime that fsdpc's cuda runtime
 * calls (dev_cuda.c, kc_rt.c, comm_nccl.c), implemented on the host, so the
 * same object code runs without a GPU.  Compiled against the real toolkit
 * headers: the types, enums and constants are CUDA's own.
 *
 * Memory.  Device memory comes from one reserved mapping of the emulated
 * device's size (FSDPC_CUEMU_MEM_MIB, default 81559 MiB: an H100's; at
 * least 301, since the context is taken to hold 300), away from the heap; each cudaMalloc takes whole pages of it (made readable and
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
 * thread's last error (cudaGetLastError reads and clears it).  This file:
 * errors, memory, the device, copies and fills; streams and events are
 * cuemu_queue.c's, capture and graphs cuemu_graph.c's.  Kernels
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

#include "cuemu_priv.h"

#define PAGE ((size_t)4096)
#define GUARD ((size_t)64 << 10) /* inaccessible bytes after each allocation */
#define CONTEXT_BYTES ((size_t)300 << 20) /* what a CUDA context takes of the device memory */
#define NDEVICE 1


/* ------------------------------------------------------------------ errors */

static _Thread_local cudaError_t tl_last;

cudaError_t cuemu_fail(cudaError_t e)
{
    if (e != cudaSuccess)
        tl_last = e;
    return e;
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

/* the emulated device's memory, from FSDPC_CUEMU_MEM_MIB (0 if unusable: said in one line); more than the
 * context takes, so that a too small value is named here, not seen as a failing cudaGetDeviceProperties */
static size_t device_bytes(void)
{
    const char *v = getenv("FSDPC_CUEMU_MEM_MIB");
    unsigned long long mib = 81559, least = (CONTEXT_BYTES >> 20) + 1;
    if (v && *v) {
        char *end;
        errno = 0;
        mib = strtoull(v, &end, 10);
        if (errno || *end || mib < least || mib > ((unsigned long long)1 << 24)) {
            cuemu_complain("FSDPC_CUEMU_MEM_MIB", "'%s' is not a size in MiB between %llu (the emulated CUDA "
                           "context takes %llu) and 16777216", v, least, least - 1);
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
    if (total == 0)
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
    if (r && (stage || pageable_dst) && capture_refuse_stream(r, call)) {
        cuemu_complain(call, "%s with pageable host memory in a captured copy (use pinned memory)", kind_name(kind));
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

