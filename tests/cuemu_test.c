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
 * that a replay runs the payload copied at capture.  The kernels of
 * kernels.def load from the emulated image and run (two grids at once on
 * two streams; a captured launch replays its arguments of capture time; a
 * host pointer argument is refused); a model's table loads as a second
 * library, each library finds its own kernels alone, and a kernel of an
 * unloaded library is refused.  A forked child writing past an
 * allocation dies with cuemu's one line naming it.  Each failing check
 * prints its line; the exit status is 1 if any failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cublasLt.h>
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

/* k_range_i64(y, start, delta, n) on stream s */
static cudaError_t range(cudaKernel_t k, int64_t *y, int64_t start, int64_t delta, int64_t n, cudaStream_t s)
{
    void *args[] = {&y, &start, &delta, &n};
    dim3 g = {3, 1, 1}, b = {128, 1, 1};
    return cudaLaunchKernel((const void *)k, g, b, args, 0, s);
}

/* a model's table of one kernel, "fsdpc_fused0", as fsdpc --emulate registers the generated ones */
static int g_fused_runs;
static void run_fused(void *const *args, unsigned grid, unsigned block, unsigned smem)
{
    (void)args, (void)grid, (void)block, (void)smem;
    g_fused_runs++;
}
static const size_t fused_size[] = {sizeof(int64_t)};
static const unsigned char fused_is_ptr[] = {0};
static const CuemuKernel fused_table[] = {{"fsdpc_fused0", 1, fused_size, fused_is_ptr, run_fused}};

/* kernels.def's kernels: loading, attributes, launches (concurrent ones
 * on two streams, captured ones with their arguments of capture time); a
 * model's table as a second library: each library finds its own kernels
 * alone (fsdpc's two images), and a kernel of an unloaded library is
 * refused */
static void test_kernels(int least, int greatest)
{
    cudaLibrary_t lib, model;
    cudaKernel_t k, none, fk;
    fprintf(stderr, "cuemu_test: the next 4 lines are expected:\n");
    CHECK(cudaLibraryLoadData(&lib, ".version 7.0\n.target sm_80\n", NULL, NULL, 0, NULL, NULL, 0) ==
          cudaErrorInvalidKernelImage);
    CHECK(cudaLibraryLoadData(&lib, "cuemu:kernels/cuda,no/such", NULL, NULL, 0, NULL, NULL, 0) ==
          cudaErrorInvalidKernelImage);
    OK(cudaLibraryLoadData(&lib, "cuemu:kernels/cuda", NULL, NULL, 0, NULL, NULL, 0));
    OK(cudaLibraryGetKernel(&k, lib, "k_range_i64"));
    CHECK(cudaLibraryGetKernel(&none, lib, "k_no_such_kernel") == cudaErrorSymbolNotFound);
    CHECK(cuemu_kernels_add("cuemu_test_model", fused_table, 1) == 0);
    OK(cudaLibraryLoadData(&model, "cuemu:cuemu_test_model", NULL, NULL, 0, NULL, NULL, 0));
    OK(cudaLibraryGetKernel(&fk, model, "fsdpc_fused0"));
    CHECK(cudaLibraryGetKernel(&none, lib, "fsdpc_fused0") == cudaErrorSymbolNotFound);
    CHECK(cudaLibraryGetKernel(&none, model, "k_range_i64") == cudaErrorSymbolNotFound);
    {
        int64_t n = 5;
        void *fa_args[] = {&n};
        dim3 g1 = {1, 1, 1}, b1 = {32, 1, 1};
        OK(cudaLaunchKernel((const void *)fk, g1, b1, fa_args, 0, 0));
        OK(cudaDeviceSynchronize());
        CHECK(g_fused_runs == 1);
    }
    OK(cudaLibraryUnload(model));
    struct cudaFuncAttributes fa;
    OK(cudaFuncGetAttributes(&fa, (const void *)k));
    CHECK(fa.maxThreadsPerBlock == 1024 && fa.maxDynamicSharedSizeBytes == 48 << 10);
    OK(cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
    OK(cudaFuncGetAttributes(&fa, (const void *)k));
    CHECK(fa.maxDynamicSharedSizeBytes == 64 << 10);

    enum { N = 100000 };
    int64_t *y, *z, host = 0;
    cudaStream_t a, b;
    OK(cudaMalloc((void **)&y, N * sizeof *y));
    OK(cudaMalloc((void **)&z, N * sizeof *z));
    OK(cudaStreamCreateWithPriority(&a, cudaStreamNonBlocking, least));
    OK(cudaStreamCreateWithPriority(&b, cudaStreamNonBlocking, greatest));
    CHECK(range(k, &host, 0, 1, 1, a) == cudaErrorInvalidValue); /* a host pointer */
    /* two grids at once, one per stream: the emulation's state is per thread */
    OK(range(k, y, 5, 3, N, a));
    OK(range(k, z, -7, 2, N, b));
    OK(cudaDeviceSynchronize());
    int64_t *h = malloc(N * sizeof *h);
    CHECK(h != NULL);
    OK(cudaMemcpy(h, y, N * sizeof *h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 5 && h[N - 1] == 5 + 3 * (int64_t)(N - 1) && h[N / 2] == 5 + 3 * (int64_t)(N / 2));
    OK(cudaMemcpy(h, z, N * sizeof *h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == -7 && h[N - 1] == -7 + 2 * (int64_t)(N - 1));
    /* captured: the arguments are those of capture time */
    cudaGraph_t g;
    cudaGraphExec_t ge;
    int64_t start = 11;
    void *args[] = {&y, &start, &start, &(int64_t){N}};
    dim3 g1 = {2, 1, 1}, b1 = {64, 1, 1};
    OK(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal));
    OK(cudaLaunchKernel((const void *)k, g1, b1, args, 0, a));
    start = 1000;
    OK(cudaStreamEndCapture(a, &g));
    OK(cudaGraphInstantiate(&ge, g, 0));
    OK(cudaGraphDestroy(g));
    OK(cudaMemset(y, 0, N * sizeof *y));
    OK(cudaDeviceSynchronize());
    OK(cudaGraphLaunch(ge, a));
    OK(cudaStreamSynchronize(a));
    OK(cudaMemcpy(h, y, N * sizeof *h, cudaMemcpyDeviceToHost));
    CHECK(h[0] == 11 && h[3] == 11 + 3 * 11);
    OK(cudaGraphExecDestroy(ge));
    free(h);
    OK(cudaStreamDestroy(a));
    OK(cudaStreamDestroy(b));
    OK(cudaFree(y));
    OK(cudaFree(z));
    OK(cudaLibraryUnload(lib));
    CHECK(cudaFuncGetAttributes(&fa, (const void *)k) == cudaErrorInvalidDeviceFunction); /* unloaded */
    (void)cudaGetLastError();
}

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
    int drv = 0;
    OK(cudaDriverGetVersion(&drv));
    CHECK(drv >= 13000); /* "a driver as new as the runtime": dev_cuda.c's start-up accepts it */
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

/* one column-major GEMM D = alpha op(A) op(B) + beta C through cuBLASLt,
 * float32 (exact, or TF32) or float64, against a loop in double */
static void test_gemm(void)
{
    enum { M = 5, N = 3, K = 7 };
    cublasLtHandle_t h;
    OK(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown);
    float a[K * M], b[K * N], c[M * N], d[M * N], bias[M];
    double want[M * N];
    for (int i = 0; i < K * M; i++)
        a[i] = 1.0f + (float)i / 3.0f; /* stored k x m: used transposed */
    for (int i = 0; i < K * N; i++)
        b[i] = 0.5f - (float)i / 7.0f;  /* stored k x n */
    for (int i = 0; i < M * N; i++)
        c[i] = (float)i;
    for (int i = 0; i < M; i++)
        bias[i] = (float)(i * i);
    float alpha = 0.75f, beta = 2.0f;
    for (int col = 0; col < N; col++)
        for (int row = 0; row < M; row++) {
            double s = 0;
            for (int l = 0; l < K; l++)
                s += (double)a[l + row * K] * b[l + col * K];
            want[row + col * M] = alpha * s + beta * c[row + col * M] + bias[row];
        }
    float *da, *db, *dc, *dbias;
    OK(cudaMalloc((void **)&da, sizeof a));
    OK(cudaMalloc((void **)&db, sizeof b));
    OK(cudaMalloc((void **)&dc, sizeof c));
    OK(cudaMalloc((void **)&dbias, sizeof bias));
    OK(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(dbias, bias, sizeof bias, cudaMemcpyHostToDevice));
    for (int tf32 = 0; tf32 < 2; tf32++) {
        cublasLtMatmulDesc_t op;
        cublasLtMatrixLayout_t la, lb, lc;
        int32_t t = CUBLAS_OP_T, epi = CUBLASLT_EPILOGUE_BIAS;
        int ok = cublasLtMatmulDescCreate(&op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                          CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                 cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t) == 0 &&
                 cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) == 0 &&
                 cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof dbias) == 0 &&
                 cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, K, M, K) == 0 &&
                 cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, K, N, K) == 0 &&
                 cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, M, N, M) == 0;
        CHECK(ok);
        OK(cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice));
        CHECK(cublasLtMatmul(h, op, &alpha, da, la, db, lb, &beta, dc, lc, dc, lc, NULL, NULL, 0, NULL) ==
              CUBLAS_STATUS_SUCCESS);
        OK(cudaMemcpy(d, dc, sizeof d, cudaMemcpyDeviceToHost));
        double worst = 0;
        for (int i = 0; i < M * N; i++)
            worst = fmax(worst, fabs(d[i] - want[i]) / (1 + fabs(want[i])));
        if (tf32)
            CHECK(worst > 1e-5 && worst < 1e-2); /* operands rounded to 10 mantissa bits */
        else
            CHECK(worst < 1e-6);                 /* exact float32: one rounding of the double sum */
        fprintf(stderr, "cuemu_test: the next line is expected:\n");
        CHECK(cublasLtMatmul(h, op, &alpha, a, la, db, lb, &beta, dc, lc, dc, lc, NULL, NULL, 0, NULL) ==
              CUBLAS_STATUS_INVALID_VALUE); /* a host A */
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(op);
    }
    OK(cudaFree(da));
    OK(cudaFree(db));
    OK(cudaFree(dc));
    OK(cudaFree(dbias));
    cublasLtDestroy(h);
    CHECK(strstr(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), "not supported") != NULL);
}

/* a write past an allocation (as a kernel's overrun would be) ends the
 * process with one line naming the allocation; forked, before any stream
 * thread exists */
static void test_fault(void)
{
    int fd[2];
    CHECK(pipe(fd) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        char *p = NULL;
        if (cudaMalloc((void **)&p, 100) != cudaSuccess)
            _exit(3);
        p[99] = 1;                 /* inside: fine */
        ((volatile char *)p)[5000] = 1; /* past the allocation's page: the guard */
        _exit(4);
    }
    close(fd[1]);
    char buf[512] = "";
    size_t n = 0;
    for (ssize_t r; n + 1 < sizeof buf && (r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0;)
        n += (size_t)r;
    buf[n] = 0;
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st));
    CHECK(strstr(buf, "cuemu: a kernel or copy touched device memory at ") &&
          strstr(buf, "past the end of the allocation at ") && strstr(buf, " of 0x64 bytes"));
}

int main(void)
{
    setenv("FSDPC_CUEMU_MEM_MIB", "1024", 1);
    setenv("FSDPC_CUEMU_DELAY_US", "200", 1);
    int least, greatest;
    test_fault();
    test_device();
    OK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    test_pointers();
    test_order(least, greatest);
    cudaStream_t s;
    OK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least));
    test_capture_refusals(s);
    test_graph(s, greatest);
    test_kernels(least, greatest);
    test_gemm();
    OK(cudaStreamDestroy(s));
    OK(cudaDeviceSynchronize());
    if (!g_failed)
        printf("cuemu_test: all checks passed\n");
    return g_failed;
}
