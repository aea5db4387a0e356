/* cuemu_test.c — the emulated CUDA runtime (runtime/cuemu_rt.c) behaves as
 * CUDA does where fsdpc depends on it (ctest cuemu_rt).
 *
 * How it works.  The program calls the CUDA runtime API of the toolkit's
 * headers, linked against the emulation.  Where an order between streams is
 * checked, a gate (a task that blocks its stream until the test opens it,
 * enqueued through cuemu.h) holds one stream back, so a missing or present
 * event wait shows deterministically: a stream that does not wait finishes
 * with the stale value while the gate is shut; one that waits is still not
 * ready.  Graph replay checks the order of three steps on two streams (the
 * second one slowed down by its priority) by the digits they append, and
 * that a replay runs the payload copied at capture.  Each failing check
 * prints its line; the exit status is 1 if any failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuemu.h"

static int g_failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "cuemu_test.c:%d: check failed: %s\n", __LINE__, #cond); \
            g_failed = 1;                                                      \
        }                                                                      \
    } while (0)

#define OK(call) CHECK((call) == cudaSuccess)

/* ------------------------------------------------------------- the gate */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} Gate;

static Gate g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void run_gate(void *p)
{
    Gate *g = *(Gate **)p;
    pthread_mutex_lock(&g->mu);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_shut(cudaStream_t s)
{
    g_gate.open = 0;
    Gate *g = &g_gate;
    OK(cuemu_enqueue(s, "gate", run_gate, &g, sizeof g));
}

static void gate_open(void)
{
    pthread_mutex_lock(&g_gate.mu);
    g_gate.open = 1;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

/* a step of the graph test: *x = *x * 10 + digit */
typedef struct {
    long *x;
    long digit;
} Digit;

static void run_digit(void *p)
{
    Digit *d = p;
    *d->x = *d->x * 10 + d->digit;
}

static void digit(cudaStream_t s, long *x, long *value)
{
    Digit d = {x, *value};
    OK(cuemu_enqueue(s, "digit", run_digit, &d, sizeof d));
}

/* ---------------------------------------------------------------- tests */

static void test_device(void)
{
    int n = 0, least = 1, greatest = 1;
    OK(cudaGetDeviceCount(&n));
    CHECK(n >= 1);
    struct cudaDeviceProp p;
    OK(cudaGetDeviceProperties(&p, 0));
    CHECK(p.major == 9 && p.minor == 0 && p.multiProcessorCount > 0 && p.warpSize == 32);
    CHECK(p.totalGlobalMem == (size_t)1024 << 20); /* FSDPC_CUEMU_MEM_MIB=1024, set by main */
    OK(cudaSetDevice(0));
    OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CHECK(greatest < least);
    size_t fr = 0, total = 0;
    OK(cudaMemGetInfo(&fr, &total));
    CHECK(total == (size_t)1024 << 20 && fr < total);
    void *big = NULL, *small = NULL;
    CHECK(cudaMalloc(&big, fr + 1) == cudaErrorMemoryAllocation && big == NULL);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaGetLastError() == cudaSuccess); /* read and cleared */
    OK(cudaMalloc(&small, 1000));
    size_t fr2;
    OK(cudaMemGetInfo(&fr2, &total));
    CHECK(fr2 < fr);
    OK(cudaFree(small));
    OK(cudaMemGetInfo(&fr2, &total));
    CHECK(fr2 == fr);
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
}

static void test_pointers(void)
{
    char host[64] = {0}, *dev = NULL, *pinned = NULL;
    OK(cudaMalloc((void **)&dev, 64));
    OK(cudaMallocHost((void **)&pinned, 64));
    OK(cudaMemcpy(dev, host, 64, cudaMemcpyHostToDevice));
    fprintf(stderr, "cuemu_test: the next 8 lines are expected:\n");
    CHECK(cudaMemcpy(host, dev, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* kinds swapped */
    CHECK(cudaMemcpy(dev + 1, host, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue); /* past the end */
    CHECK(cudaMemcpy(dev, dev, 64, cudaMemcpyHostToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemsetAsync(host, 0, 64, NULL) == cudaErrorInvalidValue);
    CHECK(cudaMemcpyAsync(pinned, dev, 65, cudaMemcpyDeviceToHost, NULL) == cudaErrorInvalidValue);
    CHECK(cudaFree(host) == cudaErrorInvalidValue);
    CHECK(cudaFreeHost(host) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(dev, pinned, 64, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue); /* pinned is host */
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    OK(cudaMemcpy(pinned, dev, 64, cudaMemcpyDefault)); /* where they are */
    OK(cudaFreeHost(pinned));
    OK(cudaFree(dev));
}

/* two streams; the second copies x to y, waiting for the first's fill of x or not */
static void test_order(int least, int greatest)
{
    cudaStream_t a, b;
    cudaEvent_t ev;
    OK(cudaStreamCreateWithPriority(&a, cudaStreamNonBlocking, greatest));
    OK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, least));
    OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int *x, *y, *host;
    OK(cudaMalloc((void **)&x, 4096));
    OK(cudaMalloc((void **)&y, 4096));
    OK(cudaMallocHost((void **)&host, 4096));
    OK(cudaMemset(x, 0, 4096));
    OK(cudaDeviceSynchronize());
    for (int wait = 0; wait < 2; wait++) {
        OK(cudaMemsetAsync(y, 0, 4096, b));
        gate_shut(a);
        OK(cudaMemsetAsync(x, 7, 4096, a));
        OK(cudaEventRecord(ev, a));
        CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
        if (wait)
            OK(cudaStreamWaitEvent(b, ev, 0));
        OK(cudaMemcpyAsync(y, x, 4096, cudaMemcpyDeviceToDevice, b));
        OK(cudaMemcpyAsync(host, y, 4096, cudaMemcpyDeviceToHost, b)); /* pinned: not waited for */
        if (!wait) { /* the race, observed: b read x before a wrote it */
            OK(cudaStreamSynchronize(b));
            CHECK(host[0] == 0 && host[1023] == 0);
        } else
            CHECK(cudaStreamQuery(b) == cudaErrorNotReady);
        gate_open();
        OK(cudaStreamSynchronize(b));
        OK(cudaEventSynchronize(ev));
        OK(cudaEventQuery(ev));
        if (wait)
            CHECK(host[0] == 0x07070707 && host[1023] == 0x07070707);
        OK(cudaStreamSynchronize(a));
        OK(cudaMemset(x, 0, 4096));
        OK(cudaDeviceSynchronize());
    }
    OK(cudaFreeHost(host));
    OK(cudaFree(x));
    OK(cudaFree(y));
    OK(cudaEventDestroy(ev));
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
}

/* the calls CUDA refuses during a thread-local capture of stream s */
static cudaError_t refused(int which, cudaStream_t s, void *dev, void *host)
{
    void *p = NULL;
    switch (which) {
    case 0: return cudaMemcpy(dev, host, 64, cudaMemcpyHostToDevice);
    case 1: return cudaMemset(dev, 0, 64);
    case 2: return cudaMalloc(&p, 64);
    case 3: return cudaStreamQuery(s);
    case 4: return cudaStreamSynchronize(s);
    default: return cudaDeviceSynchronize();
    }
}

static void test_capture_refusals(cudaStream_t s)
{
    char host[64] = {0}, *dev;
    OK(cudaMalloc((void **)&dev, 64));
    fprintf(stderr, "cuemu_test: the next 8 lines are expected:\n");
    for (int which = 0; which < 6; which++) {
        cudaGraph_t g = (cudaGraph_t)&g;
        OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        OK(cudaMemsetAsync(dev, 1, 64, s)); /* captured, never run */
        CHECK(refused(which, s, dev, host) == cudaErrorStreamCaptureUnsupported);
        CHECK(cudaMemsetAsync(dev, 1, 64, s) == cudaErrorStreamCaptureInvalidated);
        CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && g == NULL);
        OK(cudaStreamQuery(s)); /* no longer capturing, and nothing ran */
    }
    (void)cudaGetLastError();
    /* waiting for an event recorded outside the capture */
    cudaEvent_t ev;
    cudaGraph_t g;
    OK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    OK(cudaEventRecord(ev, s));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaStreamWaitEvent(s, ev, 0) == cudaErrorStreamCaptureIsolation);
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated);
    /* a stream forked into the capture and not joined back */
    cudaStream_t s2;
    OK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, 0));
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    OK(cudaEventRecord(ev, s));
    OK(cudaStreamWaitEvent(s2, ev, 0));
    OK(cudaMemsetAsync(dev, 2, 64, s2));
    CHECK(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureUnjoined && g == NULL);
    OK(cudaStreamQuery(s2)); /* it left the capture too */
    OK(cudaMemcpy(host, dev, 64, cudaMemcpyDeviceToHost));
    CHECK(host[0] == 0 && host[63] == 0); /* none of it ran */
    (void)cudaGetLastError();
    OK(cudaStreamDestroy(s2));
    OK(cudaEventDestroy(ev));
    OK(cudaFree(dev));
}

/* s: digit 1, fork to s2 (slowed) for digit 2, join, digit 3; replayed twice */
static void test_graph(cudaStream_t s, int greatest)
{
    cudaStream_t s2;
    cudaEvent_t fork, join;
    OK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, greatest));
    OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    long *x, value;
    OK(cudaMalloc((void **)&x, sizeof *x));
    OK(cudaMemset(x, 0, sizeof *x));
    OK(cudaDeviceSynchronize());
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    value = 1, digit(s, x, &value);
    OK(cudaEventRecord(fork, s));
    OK(cudaStreamWaitEvent(s2, fork, 0));
    value = 2, digit(s2, x, &value);
    OK(cudaEventRecord(join, s2));
    OK(cudaStreamWaitEvent(s, join, 0));
    value = 3, digit(s, x, &value);
    value = 9; /* the graph holds the values of capture time */
    OK(cudaStreamEndCapture(s, &g));
    CHECK(g != NULL);
    OK(cudaGraphInstantiate(&ge, g, 0));
    OK(cudaGraphDestroy(g));
    long got = -1;
    OK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 0); /* capture runs nothing */
    OK(cudaGraphLaunch(ge, s));
    OK(cudaGraphLaunch(ge, s));
    OK(cudaStreamSynchronize(s));
    OK(cudaMemcpy(&got, x, sizeof got, cudaMemcpyDeviceToHost));
    CHECK(got == 123123);
    OK(cudaGraphExecDestroy(ge));
    OK(cudaFree(x));
    OK(cudaEventDestroy(fork));
    OK(cudaEventDestroy(join));
    OK(cudaStreamDestroy(s2));
}

int main(void)
{
    setenv("FSDPC_CUEMU_MEM_MIB", "1024", 1);
    setenv("FSDPC_CUEMU_DELAY_US", "200", 1);
    int least, greatest;
    test_device();
    OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    test_pointers();
    test_order(least, greatest);
    cudaStream_t s;
    OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least));
    test_capture_refusals(s);
    test_graph(s, greatest);
    OK(cudaStreamDestroy(s));
    OK(cudaDeviceSynchronize());
    if (!g_failed)
        printf("cuemu_test: all checks passed\n");
    return g_failed;
}
