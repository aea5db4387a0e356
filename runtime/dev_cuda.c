/* dev_cuda.c — rt_dev.h for the cuda target: the device, the step's memory
 * on it, and the step itself (eager, or replayed as a CUDA Graph).
 * CUDA runtime API only (libcudart_static.a); never the driver API, so the
 * executable links and starts without libcuda and says why it cannot run.
 *
 * rt_dev_init   device = local rank % visible devices; checks that the
 *               planned bytes fit; picks the embedded image of each part
 *               (exact cubin, else a cubin of the same major with a lower
 *               minor, else PTX of an arch <= the GPU's) and loads it as a
 *               library of its own: kernels/cuda's (every kernel of
 *               kc_names) and the model's (its fused kernels, when it has
 *               any); creates the streams, events, cuBLASLt handle and
 *               workspace, the step parameters and the check slots.
 *               Streams: compute (lowest priority) and one per lane of
 *               collectives (rt.h: the gathers', the reductions'; highest).
 * rt_dev_attach one cudaMalloc with the host carving's layout (device
 *               pointer = dev_base + (host pointer - host base)); uploads
 *               it.  Local: no collective, since a rank whose carving or
 *               loading failed does not call it.
 * rt_dev_step   world > 1, the first call: the NCCL communicator (every
 *               rank gets there after the agreed start-up; a failure is
 *               fatal on all ranks; comm_nccl.c: one set per lane).  Then on cu.compute: the step
 *               parameters (pinned host -> device) and the check reset
 *               (0xff bytes = -1); step 1 eagerly (warm-up: cuBLASLt plans,
 *               NCCL connections), step 2 captured (thread-local mode) and
 *               launched, later steps replayed.  Both copies are issued
 *               before the step or graph on the same stream, never
 *               captured, so a replay reads this step's values.  Then a
 *               watched wait and the checks; the caller downloads the loss.
 *
 * Environment: FSDPC_STEP_TIMEOUT (seconds a wait may take, default 600),
 * FSDPC_CUDA_SYNC=1 (synchronise after every launch and name a failing
 * kernel; implies eager steps), FSDPC_NO_TF32=1 (exact fp32 GEMMs),
 * FSDPC_CUDA_MEMINFO=1 (each rank prints its peak device memory at the end),
 * FSDPC_NCCL_ALWAYS=1 (NCCL even at world 1: tests its path on one GPU).
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "rt_ctl.h"
#include "rt_dev.h"
#include "rt_priv.h"

CuRt cu;

#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)
#define WORKSPACE_BYTES ((size_t)32 << 20)
#define RESERVE_BYTES ((int64_t)64 << 20)      /* CUDA Graph, cuBLASLt and stream internals */
#define NCCL_RESERVE_BYTES ((int64_t)256 << 20) /* NCCL buffers of one lane's communicators, world > 1 */

static int g_use_graph = 1;
static int64_t g_nstep;              /* training rt_dev_step calls so far (not validation) */
/* the captured step; [1]: a micro-step of --accum-mode local that only sums its gradients (the step's host
 * code branches on it: no reduce-scatter) */
static cudaGraphExec_t g_graphs[2];
static int g_phase;                  /* which one this step runs */
static char **g_dev_slot, **g_dev_shard, **g_dev_acc; /* the arrays behind c->dev_slot / dev_shard / dev_acc */
static size_t g_mem_total, g_mem_base_used, g_mem_peak_used; /* cudaMemGetInfo samples */

/* ------------------------------------------------------------------ errors */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const char *cuda_hint(cudaError_t e)
{
    switch (e) {
    case cudaErrorMemoryAllocation:
        return " (the GPU is out of memory: use more ranks or a smaller --dim batch)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorIllegalInstruction:
    case cudaErrorHardwareStackError:
        return " (a kernel faulted: this is a bug in fsdpc; FSDPC_CUDA_SYNC=1 names the kernel)";
    case cudaErrorLaunchOutOfResources:
    case cudaErrorInvalidConfiguration:
        return " (a bug in fsdpc's launch geometry; FSDPC_CUDA_SYNC=1 names the kernel)";
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent:
        return " (the step could not be recorded as a CUDA Graph: --no-cuda-graph steps eagerly; please "
               "report it)";
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
        return " (a hardware error: check the GPU with nvidia-smi)";
    case cudaErrorLaunchTimeout:
        return " (a kernel ran into the display watchdog)";
    case cudaErrorDevicesUnavailable:
        return " (the GPU is busy or in exclusive-process mode with another process on it)";
    default:
        return "";
    }
}

_Noreturn void cu_fail_cuda(const char *file, int line, const char *call, cudaError_t e)
{
    rt_fatal(1, "rank %d: CUDA call %s failed at %s:%d: %s%s", cu.rank, call, base_name(file), line,
             cudaGetErrorString(e), cuda_hint(e));
}

_Noreturn void cu_fail_lt(const char *file, int line, const char *call, cublasStatus_t s)
{
    const char *hint = s == CUBLAS_STATUS_ALLOC_FAILED ? " (the GPU is out of memory)"
                       : s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE
                           ? " (a bug in fsdpc's GEMM shapes; please report it)"
                           : "";
    rt_fatal(1, "rank %d: cuBLASLt call %s failed at %s:%d: %s%s", cu.rank, call, base_name(file), line,
             cublasLtGetStatusString(s), hint);
}

_Noreturn void cu_fail_nccl(const char *file, int line, const char *call, ncclResult_t r)
{
    const char *last = cu.nccl ? ncclGetLastError(cu.nccl) : ncclGetLastError(NULL);
    rt_fatal(1, "rank %d: NCCL call %s failed at %s:%d: %s%s%s (NCCL_DEBUG=WARN tells more)", cu.rank, call,
             base_name(file), line, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

_Noreturn void cu_internal(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rt_fatal(1, "rank %d: internal error (a bug in fsdpc, please report it): %s", cu.rank, msg);
}

/* start-up failures are returned, not fatal: one line into err, -1 */
static int reason(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int reason(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* "CALL failed: <reason>" for start-up calls */
#define TRY(call, what)                                                                             \
    do {                                                                                            \
        cudaError_t try_e_ = (call);                                                                \
        if (try_e_ != cudaSuccess)                                                                  \
            return reason(err, errlen, "%s on GPU %d (%s): %s failed: %s%s", what, cu.device, cu.name, \
                          #call, cudaGetErrorString(try_e_), cuda_hint(try_e_));                    \
    } while (0)

/* -------------------------------------------------------------- environment */

static int env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------ waiting */

void cu_debug_sync(const char *what)
{
    if (!cu.sync_debug)
        return;
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        char call[200];
        snprintf(call, sizeof call, "cudaGetLastError after %s", what);
        cu_fail_cuda(__FILE__, __LINE__, call, e);
    }
    cu_wait(cu.compute, what);
}

void cu_wait(cudaStream_t s, const char *what)
{
    double t0 = now_s(), next_nccl = t0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady) {
            char call[160];
            snprintf(call, sizeof call, "cudaStreamQuery (%s)", what);
            cu_fail_cuda(__FILE__, __LINE__, call, e);
        }
        double t = now_s();
        if (cu.nccl && t >= next_nccl) {
            ncclResult_t r = cu_nccl_async_error();
            if (r != ncclSuccess) {
                const char *last = ncclGetLastError(cu.nccl);
                cu_nccl_abort();
                rt_fatal(1, "rank %d: NCCL failed during %s: %s%s%s (another rank may have died; NCCL_DEBUG=WARN "
                            "tells more)", cu.rank, what, ncclGetErrorString(r), last && *last ? ": " : "",
                         last ? last : "");
            }
            next_nccl = t + 1e-3;
        }
        if (t - t0 > cu.timeout_s) {
            cu_nccl_abort();
            rt_fatal(1, "rank %d: %s did not finish within %g s (FSDPC_STEP_TIMEOUT): a rank may be stuck or "
                        "dead in a collective, or the GPU hung", cu.rank, what, cu.timeout_s);
        }
        if (t - t0 > 2e-3) { /* spin for the first 2 ms (short steps), then sleep between polls */
            struct timespec nap = {0, 50 * 1000};
            nanosleep(&nap, NULL);
        }
    }
}

static void sample_memory(void)
{
    size_t fr = 0, total = 0;
    CU_CHECK(cudaMemGetInfo(&fr, &total));
    if (total - fr > g_mem_peak_used)
        g_mem_peak_used = total - fr;
}

/* --------------------------------------------------------------- rt_dev_init */

/* cudaGetDeviceCount failed or found none: the one-line reason */
static int no_device(cudaError_t e, char *err, size_t errlen)
{
    int drv = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess)
        drv = 0;
    if (drv == 0)
        return reason(err, errlen, "no CUDA driver found (libcuda.so.1): this executable was built with --target "
                                   "cuda and needs an NVIDIA GPU; rebuild with --target cpu to train on CPUs");
    if (e == cudaErrorInsufficientDriver || e == cudaErrorSystemDriverMismatch)
        return reason(err, errlen, "the NVIDIA driver (CUDA %d.%d) is older than this executable's CUDA runtime "
                                   "(%d.%d): update the driver: %s", drv / 1000, drv % 1000 / 10,
                      CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10, cudaGetErrorString(e));
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (e == cudaSuccess || e == cudaErrorNoDevice)
        return reason(err, errlen, "no CUDA device visible (driver CUDA %d.%d%s%s%s): this executable needs an "
                                   "NVIDIA GPU; rebuild with --target cpu to train on CPUs", drv / 1000,
                      drv % 1000 / 10, vis ? ", CUDA_VISIBLE_DEVICES='" : "", vis ? vis : "", vis ? "'" : "");
    return reason(err, errlen, "cannot use the GPU: cudaGetDeviceCount failed: %s%s", cudaGetErrorString(e),
                  cuda_hint(e));
}

/* "sm_90" -> 90 (ptx 0), "compute_80" -> 80 (ptx 1), "sm_90a" -> 90 (exact 1); -1 if neither */
static int arch_of(const char *s, int *ptx, int *exact)
{
    *ptx = *exact = 0;
    if (!s)
        return -1;
    if (!strncmp(s, "sm_", 3))
        s += 3;
    else if (!strncmp(s, "compute_", 8))
        s += 8, *ptx = 1;
    else
        return -1;
    int v = 0, digits = 0;
    for (; *s >= '0' && *s <= '9' && digits < 4; s++, digits++)
        v = v * 10 + (*s - '0');
    if (*s == 'a' || *s == 'f')
        s++, *exact = 1; /* arch-specific code runs on that arch alone */
    return digits && !*s ? v : -1;
}

/* the image of part (rt.h) for compute capability cc: exact cubin > same
 * major, lower minor cubin > PTX of the highest arch <= cc; -1 if none */
static int pick_image(const RtModel *m, int part, int cc)
{
    int best = -1, best_rank = 0, best_arch = 0;
    for (int i = 0; i < m->nimage; i++) {
        int ptx, exact, a = arch_of(m->image[i].arch, &ptx, &exact);
        if (m->image[i].part != part || a < 0 || a > cc || (exact && a != cc) || !m->image[i].data ||
            m->image[i].len <= 0)
            continue;
        int rank = ptx ? 1 : a == cc ? 3 : a / 10 == cc / 10 ? 2 : 0;
        if (rank > best_rank || (rank == best_rank && rank && a > best_arch))
            best = i, best_rank = rank, best_arch = a;
    }
    return best;
}

const char *cu_kernel_name(int k)
{
    return k < KC_COUNT ? kc_names[k] : cu.m->fused[k - KC_COUNT];
}

/* the part's words in messages */
static const char *const part_said[] = {"kernels/cuda", "the model's fused kernels"};

/* the best image of part for this GPU into cu.lib[part]; *im: the image; 0, else -1 after reason */
static int load_part(const RtModel *m, int part, const RtImage **im, char *err, size_t errlen)
{
    int i = pick_image(m, part, cu.cc);
    if (i < 0) {
        char have[512] = "";
        size_t n = 0;
        for (int k = 0; k < m->nimage && n < sizeof have; k++)
            if (m->image[k].part == part)
                n += (size_t)snprintf(have + n, sizeof have - n, "%s%s", n ? "," : "", m->image[k].arch);
        return reason(err, errlen, "this executable was built for %s (--arch; %s); this GPU (%s) is sm_%d: rebuild "
                                   "with --arch sm_%d", n ? have : "no GPU", part_said[part], cu.name, cu.cc, cu.cc);
    }
    *im = &m->image[i];
    int ptx, exact;
    arch_of((*im)->arch, &ptx, &exact);
    unsigned char *copy = NULL; /* PTX must end in a NUL */
    const void *code = (*im)->data;
    if (ptx && (*im)->data[(*im)->len - 1] != 0) {
        if (!(copy = malloc((size_t)(*im)->len + 1)))
            return reason(err, errlen, "out of memory loading the GPU code");
        memcpy(copy, (*im)->data, (size_t)(*im)->len);
        copy[(*im)->len] = 0;
        code = copy;
    }
    cudaError_t e = cudaLibraryLoadData(&cu.lib[part], code, NULL, NULL, 0, NULL, NULL, 0);
    free(copy);
    if (e != cudaSuccess) {
        cu.lib[part] = NULL;
        const char *why = e == cudaErrorUnsupportedPtxVersion
                              ? "the driver is older than the CUDA that built the PTX: update it, or rebuild"
                              : "rebuild";
        return reason(err, errlen, "cannot load the embedded GPU code (%s, %s) on GPU %d (%s, sm_%d): %s: %s with "
                                   "--arch sm_%d", part_said[part], (*im)->arch, cu.device, cu.name, cu.cc,
                      cudaGetErrorString(e), why, cu.cc);
    }
    return 0;
}

/* kernels/cuda's library and, when the model has fused kernels, the model's; every kernel id's handle from its
 * part's library (ids < KC_COUNT: kc_names; the rest: m->fused) */
static int load_kernels(const RtModel *m, char *err, size_t errlen)
{
    if (m->nfused < 0 || (m->nfused > 0 && !m->fused))
        return reason(err, errlen, "corrupt model tables: %d fused kernels without names", m->nfused);
    const RtImage *im[2] = {NULL, NULL};
    for (int part = RT_IMAGE_KERNELS; part <= (m->nfused > 0 ? RT_IMAGE_MODEL : RT_IMAGE_KERNELS); part++)
        if (load_part(m, part, &im[part], err, errlen) != 0)
            return -1;
    cu.nkernel = KC_COUNT + m->nfused;
    cu.kernel = calloc((size_t)cu.nkernel, sizeof *cu.kernel);
    cu.smem_limit = calloc((size_t)cu.nkernel, sizeof *cu.smem_limit);
    if (!cu.kernel || !cu.smem_limit)
        return reason(err, errlen, "out of memory loading the GPU code");
    for (int k = 0; k < cu.nkernel; k++) {
        int part = k < KC_COUNT ? RT_IMAGE_KERNELS : RT_IMAGE_MODEL;
        cudaError_t e = cudaLibraryGetKernel(&cu.kernel[k], cu.lib[part], cu_kernel_name(k));
        if (e != cudaSuccess)
            return reason(err, errlen, "internal error (a bug in fsdpc, please report it): kernel %s is missing "
                                       "from the embedded GPU code (%s, %s): %s", cu_kernel_name(k),
                          part_said[part], im[part]->arch, cudaGetErrorString(e));
        /* loads the module now (lazy loading would defer an arch mismatch to the first launch) */
        struct cudaFuncAttributes fa;
        e = cudaFuncGetAttributes(&fa, (const void *)cu.kernel[k]);
        if (e != cudaSuccess)
            return reason(err, errlen, "cannot load kernel %s from the embedded GPU code (%s, %s) on GPU %d (%s, "
                                       "sm_%d): %s: rebuild with --arch sm_%d", cu_kernel_name(k), part_said[part],
                          im[part]->arch, cu.device, cu.name, cu.cc, cudaGetErrorString(e), cu.cc);
        cu.smem_limit[k] = 48 * 1024;
    }
    return 0;
}

/* the streams, events, cuBLASLt, step parameters and check slots */
static int create_handles(const RtModel *m, char *err, size_t errlen)
{
    int least = 0, greatest = 0;
    TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest), "creating streams");
    TRY(cudaStreamCreateWithPriority(&cu.compute, cudaStreamNonBlocking, least), "creating streams");
    /* collectives first when streams have work ready: they gate the next unit.  One stream per lane (the
     * gathers', the reductions'), as PyTorch FSDP's all-gather and reduce-scatter streams */
    for (int l = 0; l < RT_NLANE; l++)
        TRY(cudaStreamCreateWithPriority(&cu.lane[l], cudaStreamNonBlocking, greatest), "creating streams");
    TRY(cudaEventCreateWithFlags(&cu.ev_fork, cudaEventDisableTiming), "creating events");
    TRY(cudaEventCreateWithFlags(&cu.ev_join, cudaEventDisableTiming), "creating events");
    cu.cur = cu.compute;
    cu.ev_coll = calloc((size_t)m->ncoll + 1, sizeof *cu.ev_coll);
    cu.coll_forked = calloc((size_t)m->ncoll + 1, 1);
    if (!cu.ev_coll || !cu.coll_forked)
        return reason(err, errlen, "out of host memory for %d collective events", m->ncoll);
    for (int k = 0; k < m->ncoll; k++)
        TRY(cudaEventCreateWithFlags(&cu.ev_coll[k], cudaEventDisableTiming), "creating events");
    cublasStatus_t s = cublasLtCreate(&cu.lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cu.lt = NULL;
        return reason(err, errlen, "cuBLASLt on GPU %d (%s): cublasLtCreate failed: %s", cu.device, cu.name,
                      cublasLtGetStatusString(s));
    }
    cu.ws_bytes = WORKSPACE_BYTES;
    TRY(cudaMalloc(&cu.ws, cu.ws_bytes), "allocating the cuBLASLt workspace");
    TRY(cudaMallocHost((void **)&cu.params_host, sizeof *cu.params_host), "allocating pinned memory");
    memset(cu.params_host, 0, sizeof *cu.params_host);
    TRY(cudaMalloc((void **)&cu.params_dev, sizeof *cu.params_dev), "allocating the step parameters");
    TRY(cudaMemset(cu.params_dev, 0, sizeof *cu.params_dev), "allocating the step parameters");
    cu.ncheck = m->ncheck > 0 ? m->ncheck : 0;
    size_t nc = (size_t)(cu.ncheck ? cu.ncheck : 1);
    TRY(cudaMallocHost((void **)&cu.check_host, nc * sizeof(int64_t)), "allocating pinned memory");
    TRY(cudaMalloc((void **)&cu.check_dev, nc * sizeof(int64_t)), "allocating the check slots");
    TRY(cudaMemset(cu.check_dev, 0xff, nc * sizeof(int64_t)), "allocating the check slots");
    return 0;
}

int rt_dev_init(const RtModel *m, int rank, int world, int64_t bytes, char *err, size_t errlen)
{
    cu.m = m;
    cu.rank = rank;
    cu.world = world;
    cu.device = -1;
    snprintf(cu.name, sizeof cu.name, "?");
    if (!m->target_cuda)
        return reason(err, errlen, "internal error (a bug in fsdpc): cpu model tables linked with the cuda runtime");
    if (m->ncheck > 0 && !m->check)
        return reason(err, errlen, "corrupt model tables: %d checks without messages", m->ncheck);
    if (rt_step_timeout(&cu.timeout_s, err, errlen) != 0)
        return -1;
    cu.sync_debug = env_flag("FSDPC_CUDA_SYNC");
    cu.tf32 = !env_flag("FSDPC_NO_TF32");
    cu.nccl_always = env_flag("FSDPC_NCCL_ALWAYS");

    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0)
        return no_device(e, err, errlen);
    /* one GPU per rank of a node; a launcher that gives each rank its own
     * CUDA_VISIBLE_DEVICES shows it one device (0).  Two ranks on one GPU
     * are refused by NCCL's set-up, with its message. */
    int local = rt_ctl_local_rank();
    cu.device = (local < 0 ? 0 : local) % n;
    struct cudaDeviceProp p;
    TRY(cudaGetDeviceProperties(&p, cu.device), "querying the GPU");
    snprintf(cu.name, sizeof cu.name, "%s", p.name);
    cu.cc = p.major * 10 + p.minor;
    cu.sm_count = p.multiProcessorCount;
    TRY(cudaSetDevice(cu.device), "selecting the GPU");
    size_t fr = 0, total = 0;
    TRY(cudaMemGetInfo(&fr, &total), "creating the CUDA context"); /* the context exists from here */
    g_mem_total = total;
    g_mem_base_used = g_mem_peak_used = total - fr;

    int64_t reserve = (int64_t)WORKSPACE_BYTES + RESERVE_BYTES + (world > 1 ? RT_NLANE * NCCL_RESERVE_BYTES : 0);
    if (bytes < 0 || (uint64_t)bytes + (uint64_t)reserve > (uint64_t)fr)
        return reason(err, errlen, "needs %.2f GiB of device memory (plan: %.2f GiB for parameters, gradients, "
                                   "optimizer state and activations + %.0f MiB reserved for the cuBLASLt "
                                   "workspace%s and CUDA), GPU %d (%s) has %.2f GiB free of %.2f GiB: use more "
                                   "ranks or a smaller --dim batch", (double)(bytes + reserve) / GIB,
                      (double)bytes / GIB, (double)reserve / MIB, world > 1 ? ", NCCL" : "", cu.device, cu.name,
                      (double)fr / GIB, (double)total / GIB);
    if (load_kernels(m, err, errlen) != 0 || create_handles(m, err, errlen) != 0)
        return -1;
    if (cu.sync_debug)
        g_use_graph = 0;
    cu.up = 1;
    return 0;
}

void rt_dev_set_graph(int use_graph)
{
    g_use_graph = use_graph && !cu.sync_debug;
}

/* ------------------------------------------------------------- rt_dev_attach */

/* the device twin of host pointer p inside the carved allocation (NULL stays NULL) */
static char *twin(const void *p)
{
    if (!p)
        return NULL;
    const char *h = p;
    if (h < cu.host_base || h > cu.host_base + cu.bytes)
        cu_internal("host pointer %p outside the carved allocation [%p, +%" PRId64 ")", p, (void *)cu.host_base,
                    cu.bytes);
    return cu.dev_base + (h - cu.host_base);
}

int rt_dev_attach(RtCtx *c, char *base, int64_t bytes, char *err, size_t errlen)
{
    const RtModel *m = c->m;
    int ok = 0;
    char why[512] = "";
    if (!cu.up)
        snprintf(why, sizeof why, "internal error (a bug in fsdpc): rt_dev_attach before rt_dev_init");
    else if (bytes < 0 || !base)
        snprintf(why, sizeof why, "internal error (a bug in fsdpc): bad allocation (%" PRId64 " bytes)", bytes);
    else {
        cu.host_base = base;
        cu.bytes = bytes;
        cudaError_t e = cudaMalloc((void **)&cu.dev_base, (size_t)(bytes > 0 ? bytes : 256));
        if (e != cudaSuccess) {
            size_t fr = 0, total = 0;
            if (cudaMemGetInfo(&fr, &total) != cudaSuccess)
                fr = total = 0;
            snprintf(why, sizeof why, "cannot allocate the %.2f GiB device arena on GPU %d (%s, %.2f GiB free): %s",
                     (double)bytes / GIB, cu.device, cu.name, (double)fr / GIB, cudaGetErrorString(e));
            cu.dev_base = NULL;
        } else if ((g_dev_slot = calloc((size_t)(m->nslot > 0 ? m->nslot : 1), sizeof *g_dev_slot)) == NULL ||
                   (g_dev_shard = calloc((size_t)(m->nunit > 0 ? m->nunit : 1) * RT_NSTATE, sizeof *g_dev_shard)) ==
                       NULL ||
                   (c->acc && (g_dev_acc = calloc((size_t)m->nunit + 1, sizeof *g_dev_acc)) == NULL)) {
            snprintf(why, sizeof why, "out of memory");
        } else if ((e = cudaMemcpy(cu.dev_base, base, (size_t)bytes, cudaMemcpyHostToDevice)) != cudaSuccess ||
                   /* from pageable memory cudaMemcpy returns once the bytes are staged, its DMA maybe still
                    * in flight on the legacy stream, which cu.compute (non-blocking) does not wait for; so do
                    * create_handles' cudaMemsets.  Finish all of it before any step work is queued. */
                   (e = cudaDeviceSynchronize()) != cudaSuccess) {
            snprintf(why, sizeof why, "uploading the initial state to GPU %d (%s): %s", cu.device, cu.name,
                     cudaGetErrorString(e));
        } else {
            c->dev_arena = twin(c->arena);
            for (int i = 0; i < m->nslot; i++)
                g_dev_slot[i] = twin(c->slot[i]);
            for (int i = 0; i < m->nunit * RT_NSTATE; i++)
                g_dev_shard[i] = twin(c->shard[i]);
            for (int u = 0; c->acc && u < m->nunit; u++)
                g_dev_acc[u] = twin(c->acc[u]);
            c->dev_slot = g_dev_slot;
            c->dev_shard = g_dev_shard;
            c->dev_acc = g_dev_acc;
            ok = 1;
        }
    }
    if (!ok)
        return reason(err, errlen, "%s", why);
    sample_memory();
    return 0;
}

/* ------------------------------------------------------- uploads, downloads */

static int64_t offset_of(const void *p, int64_t n, const char *what)
{
    const char *h = p;
    if (!cu.dev_base || n < 0 || !p || h < cu.host_base || n > cu.bytes || h - cu.host_base > cu.bytes - n)
        cu_internal("%s of [%p, +%" PRId64 ") outside the carved allocation [%p, +%" PRId64 ")", what, p, n,
                    (void *)cu.host_base, cu.bytes);
    return h - cu.host_base;
}

void rt_dev_upload(RtCtx *c, const void *p, int64_t n)
{
    (void)c;
    if (n == 0)
        return;
    int64_t off = offset_of(p, n, "rt_dev_upload");
    /* pageable source: the call returns once the bytes are staged, so the
     * host may overwrite them; stream order puts it before the next step */
    CU_CHECK(cudaMemcpyAsync(cu.dev_base + off, p, (size_t)n, cudaMemcpyHostToDevice, cu.compute));
}

void rt_dev_download(RtCtx *c, void *p, int64_t n)
{
    (void)c;
    if (n == 0)
        return;
    int64_t off = offset_of(p, n, "rt_dev_download");
    CU_CHECK(cudaMemcpyAsync(p, cu.dev_base + off, (size_t)n, cudaMemcpyDeviceToHost, cu.compute));
    cu_wait(cu.compute, "a copy from the GPU");
}

/* ----------------------------------------------------------------- the step */

/* m->step with fresh check slots: eagerly, or recorded into g_graphs[g_phase] */
static void run_step(RtCtx *c, int capture)
{
    cu.next_check = 0;
    if (!capture) {
        c->m->step(c);
        return;
    }
    cudaGraph_t graph = NULL;
    /* thread-local: other threads' CUDA calls (NCCL's proxy) stay legal */
    CU_CHECK(cudaStreamBeginCapture(cu.compute, cudaStreamCaptureModeThreadLocal));
    c->m->step(c);
    CU_CHECK(cudaStreamEndCapture(cu.compute, &graph));
    cudaError_t e = cudaGraphInstantiate(&g_graphs[g_phase], graph, 0);
    cudaError_t d = cudaGraphDestroy(graph); /* the executable graph is independent of it */
    if (e != cudaSuccess) {
        g_graphs[g_phase] = NULL;
        cu_fail_cuda(__FILE__, __LINE__, "cudaGraphInstantiate", e);
    }
    CU_CHECK(d);
}

/* after the step (its copy of the check slots included): the first failed
 * device check ends the run */
static void read_checks(RtCtx *c)
{
    for (int i = 0; i < cu.ncheck; i++)
        if (cu.check_host[i] >= 0)
            rt_step_fail(c, "%s (first bad position %lld)", c->m->check[i] ? c->m->check[i] : "device check failed",
                         (long long)cu.check_host[i]);
}

void rt_dev_step(RtCtx *c)
{
    if (!cu.up || !cu.dev_base)
        cu_internal("rt_dev_step before rt_dev_attach");
    const RtModel *m = c->m;
    if ((c->world > 1 || cu.nccl_always) && !cu.nccl) {
        /* the first step: every rank is here, start-up having been agreed */
        char err[768];
        if (cu_nccl_init(c->sf, c->srank, err, sizeof err) != 0)
            rt_fatal(1, "rank %d: %s", cu.rank, err);
    }
    KcStepParams *hp = cu.params_host;
    /* the previous step's copy has completed: every step ends in a wait */
    hp->lr = c->lr;
    hp->beta1 = c->beta1;
    hp->beta2 = c->beta2;
    hp->eps = c->eps;
    hp->weight_decay = c->weight_decay;
    hp->momentum = c->momentum;
    hp->clip_norm = c->clip_norm;
    hp->step = c->step;
    hp->micro = c->micro;
    hp->accum = c->accum;
    hp->loss_scale = c->loss_scale;
    hp->opt_step = c->opt_step;
    CU_CHECK(cudaMemcpyAsync(cu.params_dev, hp, sizeof *hp, cudaMemcpyHostToDevice, cu.compute));
    if (cu.ncheck)
        CU_CHECK(cudaMemsetAsync(cu.check_dev, 0xff, (size_t)cu.ncheck * sizeof(int64_t), cu.compute));

    /* a validation pass (c->validating) runs eagerly: the graphs hold the training step */
    int graph = g_use_graph && !m->eval && !c->validating;
    g_phase = c->acc && c->micro + 1 < c->accum;
    if (!graph || g_nstep == 0)
        run_step(c, 0);
    else if (!g_graphs[g_phase])
        run_step(c, 1);
    if (graph && g_graphs[g_phase])
        CU_CHECK(cudaGraphLaunch(g_graphs[g_phase], cu.compute));
    if (cu.ncheck) /* pinned: done when the stream is */
        CU_CHECK(cudaMemcpyAsync(cu.check_host, cu.check_dev, (size_t)cu.ncheck * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, cu.compute));
    g_nstep += !c->validating;
    cu_wait(cu.compute, "the step");
    read_checks(c);
    if (g_nstep <= 3) /* every allocation is made by the first replay */
        sample_memory();
}

/* ---------------------------------------------------------------- the end */

static void report_memory(void)
{
    if (!env_flag("FSDPC_CUDA_MEMINFO") || !cu.up)
        return;
    /* key=value, the free-form name last */
    printf("fsdpc-cuda-mem: rank=%d device=%d total=%zu context_used=%zu peak_used=%zu arena=%" PRId64
           " workspace=%zu name=%s\n", cu.rank, cu.device, g_mem_total, g_mem_base_used, g_mem_peak_used, cu.bytes,
           cu.ws_bytes, cu.name);
    fflush(stdout);
}

/* Release in reverse order of creation, whatever part of start-up ran.
 * After a complete start-up every call is checked; after a failed one the
 * run is already ending with its own message, so errors are ignored. */
#define RELEASE(call)                                                  \
    do {                                                               \
        cudaError_t rel_e_ = (call);                                   \
        if (rel_e_ != cudaSuccess && strict)                           \
            cu_fail_cuda(__FILE__, __LINE__, #call, rel_e_);           \
    } while (0)

const char *rt_dev_overlap(RtCtx *c)
{
    (void)c;
    return "on two collective streams (NCCL), gathers on one and reductions on the other, each with its own "
           "communicators, forked from the compute stream and joined at each one's wait";
}

void rt_dev_preinit(char **argv) { (void)argv; } /* the host threads wait on streams, not spinning */

const char *rt_dev_threads(void) { return ""; }

void rt_dev_agree(RtCtx *c) { (void)c; }

double rt_dev_peak_flops(int bf16, double *share)
{
    (void)bf16;
    *share = -1;
    return 0; /* not measured on cuda: --peak-tflops gives it */
}

void rt_dev_finish(RtCtx *c)
{
    int strict = cu.up;
    if (cu.up)
        RELEASE(cudaDeviceSynchronize());
    report_memory();
    for (int k = 0; k < 2; k++) {
        if (g_graphs[k])
            RELEASE(cudaGraphExecDestroy(g_graphs[k]));
        g_graphs[k] = NULL;
    }
    g_phase = 0;
    if (strict)
        cu_nccl_destroy();
    else
        cu_nccl_abort();
    cu_gemm_cache_free();
    if (cu.dev_base)
        RELEASE(cudaFree(cu.dev_base));
    if (cu.check_dev)
        RELEASE(cudaFree(cu.check_dev));
    if (cu.check_host)
        RELEASE(cudaFreeHost(cu.check_host));
    if (cu.params_dev)
        RELEASE(cudaFree(cu.params_dev));
    if (cu.params_host)
        RELEASE(cudaFreeHost(cu.params_host));
    if (cu.ws)
        RELEASE(cudaFree(cu.ws));
    if (cu.lt) {
        cublasStatus_t s = cublasLtDestroy(cu.lt);
        if (s != CUBLAS_STATUS_SUCCESS && strict)
            cu_fail_lt(__FILE__, __LINE__, "cublasLtDestroy", s);
    }
    if (cu.ev_join)
        RELEASE(cudaEventDestroy(cu.ev_join));
    for (int k = 0; cu.ev_coll && cu.m && k < cu.m->ncoll; k++)
        if (cu.ev_coll[k])
            RELEASE(cudaEventDestroy(cu.ev_coll[k]));
    free(cu.ev_coll);
    free(cu.coll_forked);
    cu.ev_coll = NULL;
    cu.coll_forked = NULL;
    if (cu.ev_fork)
        RELEASE(cudaEventDestroy(cu.ev_fork));
    for (int l = RT_NLANE - 1; l >= 0; l--)
        if (cu.lane[l])
            RELEASE(cudaStreamDestroy(cu.lane[l]));
    if (cu.compute)
        RELEASE(cudaStreamDestroy(cu.compute));
    for (int part = RT_IMAGE_MODEL; part >= RT_IMAGE_KERNELS; part--)
        if (cu.lib[part])
            RELEASE(cudaLibraryUnload(cu.lib[part]));
    free(cu.kernel);
    free(cu.smem_limit);
    free(g_dev_slot);
    free(g_dev_shard);
    free(g_dev_acc);
    g_dev_slot = g_dev_shard = g_dev_acc = NULL;
    if (c) {
        c->dev_arena = NULL;
        c->dev_slot = NULL;
        c->dev_shard = NULL;
    }
    int rank = cu.rank, world = cu.world;
    memset(&cu, 0, sizeof cu);
    cu.rank = rank;
    cu.world = world;
    cu.device = -1;
    g_nstep = 0;
}
