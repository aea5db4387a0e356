/* cuda_check.h — private to the cuda runtime (dev_cuda.c, kc_rt.c,
 * comm_nccl.c): the one process-wide device state they share, and the
 * checks every CUDA, cuBLASLt and NCCL call goes through.
 *
 * A failed check prints one line
 *   NAME: error: rank R: CUDA call X failed at FILE:LINE: <reason> (hint)
 * and brings every rank down (rt_fatal -> rt_ctl_abort(1)).  Start-up code
 * that must return a reason instead (rt_dev_init, rt_dev_attach) does not
 * use these macros.
 *
 * Streams: every kernel, cuBLASLt call, copy and fill of the step goes on
 * cu.cur: cu.compute, except inside a collective's job (rt_coll_start,
 * comm_nccl.c), where it is its lane's stream: cu.lane[RT_LANE_GATHER] for
 * all-gathers, cu.lane[RT_LANE_REDUCE] for reduce-scatters and all-reduces.
 * A job forks its lane from cu.compute (ev_fork) and records its own event
 * (ev_coll[tag]), which cu.compute waits for at the job's Wait
 * (rt_coll_wait); a collective outside a job joins back at once (ev_join).
 * The lanes never wait for each other directly: whatever one lane's job
 * needs from the other's reached cu.compute at an earlier Wait (the
 * schedule pass waits for a collective before any node that conflicts with
 * it, another collective included), and the fork carries it over.  Each
 * lane has its own NCCL communicators (comm_nccl.c), so every communicator
 * sees its collectives in program order, on one stream.  Nothing else is
 * ever enqueued, and a captured step has the same dependencies.
 */
#ifndef FSDPC_CUDA_CHECK_H
#define FSDPC_CUDA_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "kc.h"
#include "rt.h"

typedef struct {
    int up;                    /* rt_dev_init succeeded: the fields below are valid */
    const RtModel *m;
    int rank, world;
    int device;                /* CUDA ordinal */
    int sm_count, cc;          /* multiprocessors; compute capability major*10+minor */
    char name[256];            /* the GPU's name */
    cudaLibrary_t lib[2];      /* the embedded kernels, by part (rt.h): kernels/cuda's, the model's (NULL: none) */
    cudaKernel_t *kernel;      /* nkernel handles, by kernel id: kc_names, then the model's fused kernels */
    int nkernel;               /* KC_COUNT + m->nfused */
    int *smem_limit;           /* KC_COUNT: dynamic shared memory limit raised so far */
    cudaStream_t compute;      /* the step */
    cudaStream_t lane[RT_NLANE]; /* the collectives: the gathers', the reductions' (rt.h's lanes) */
    cudaEvent_t ev_fork, ev_join;
    cudaStream_t cur;          /* where the step's work goes now: compute, or a lane inside a job */
    cudaEvent_t *ev_coll;      /* m->ncoll: each collective's end (rt_coll_start / rt_coll_wait) */
    unsigned char *coll_forked; /* m->ncoll: its job enqueued work on comm */
    cublasLtHandle_t lt;
    void *ws;                  /* cuBLASLt workspace */
    size_t ws_bytes;
    int tf32;                  /* 0: FSDPC_NO_TF32=1 */
    int sync_debug;            /* FSDPC_CUDA_SYNC=1: synchronise and check after every launch */
    KcStepParams *params_host; /* pinned */
    KcStepParams *params_dev;
    int64_t *check_host;       /* pinned, m->ncheck (at least 1) */
    int64_t *check_dev;
    int ncheck, next_check;    /* next_check: slots handed out in the step being recorded */
    char *host_base, *dev_base; /* the carved host allocation and its device twin */
    int64_t bytes;
    ncclComm_t nccl;           /* every rank; NULL at world 1 (unless nccl_always) */
    ncclComm_t group, repl;    /* the shard group's and its replicas' (--shard): nccl itself when it is every
                                * rank, split off it otherwise, NULL for one rank; with nccl, the reduction
                                * lane's */
    ncclComm_t gather;         /* the gather lane's: the shard group again, always split off nccl (its own
                                * NCCL resources and order), NULL when group is */
    int nccl_always;           /* FSDPC_NCCL_ALWAYS=1: NCCL at world 1 too (tests the NCCL path on one GPU) */
    double timeout_s;          /* FSDPC_STEP_TIMEOUT */
} CuRt;

extern CuRt cu;

/* fatal reports (one line, then every rank exits 1) */
_Noreturn void cu_fail_cuda(const char *file, int line, const char *call, cudaError_t e);
_Noreturn void cu_fail_lt(const char *file, int line, const char *call, cublasStatus_t s);
_Noreturn void cu_fail_nccl(const char *file, int line, const char *call, ncclResult_t r);
/* "internal error (a bug in fsdpc, please report it): ..." */
_Noreturn void cu_internal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define CU_CHECK(call)                                                 \
    do {                                                               \
        cudaError_t cu_e_ = (call);                                    \
        if (cu_e_ != cudaSuccess)                                      \
            cu_fail_cuda(__FILE__, __LINE__, #call, cu_e_);            \
    } while (0)

#define LT_CHECK(call)                                                 \
    do {                                                               \
        cublasStatus_t cu_s_ = (call);                                 \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS)                            \
            cu_fail_lt(__FILE__, __LINE__, #call, cu_s_);              \
    } while (0)

/* The communicator is non-blocking: a call may answer ncclInProgress, and
 * is then finished by polling (cu_nccl_settle, bounded by the timeout). */
#define NCCL_CHECK(call)                                               \
    do {                                                               \
        ncclResult_t cu_r_ = (call);                                   \
        if (cu_r_ == ncclInProgress)                                   \
            cu_r_ = cu_nccl_settle(#call);                             \
        if (cu_r_ != ncclSuccess)                                      \
            cu_fail_nccl(__FILE__, __LINE__, #call, cu_r_);            \
    } while (0)

/* ---- comm_nccl.c ---- */
/* Poll the communicators until none is in ncclInProgress (at most the step
 * timeout); returns the first one's other state. */
ncclResult_t cu_nccl_settle(const char *what);
/* 0, or a communicator's asynchronous error (ncclInProgress counts as none) */
ncclResult_t cu_nccl_async_error(void);
/* world > 1: create the communicators (collective over the control plane:
 * every rank calls it at the same point, the first rt_dev_step): every
 * rank's, then, for shard groups of sf ranks (this rank sf's srank-th),
 * the group's and the replicas', and the gather lane's own group.  0, or -1 with a one-line reason in err. */
int cu_nccl_init(int sf, int srank, char *err, size_t errlen);
/* abort (after a failure) or destroy (normal end) the communicators */
void cu_nccl_abort(void);
void cu_nccl_destroy(void);

/* ---- dev_cuda.c ---- */
/* Wait until stream s is idle, polling; meanwhile watch the communicator's
 * asynchronous errors and the step timeout (what names the wait in the
 * message). */
void cu_wait(cudaStream_t s, const char *what);
/* FSDPC_CUDA_SYNC=1: wait for cu.compute after the work named what, so that
 * a failure is reported there (no-op otherwise) */
void cu_debug_sync(const char *what);

/* ---- kc_rt.c ---- */
/* release the cached cuBLASLt descriptors */
void cu_gemm_cache_free(void);

/* the name of kernel id k (kernels.def, or the model's generated fused kernels) */
const char *cu_kernel_name(int k);

#endif
