/* comm_nccl.c — the step's collectives for the cuda target (rt.h), over
 * NCCL, with the same semantics as the cpu target's comm.c:
 *   rt_allgather           every shard of the group into the full padded
 *                          buffer (the own shard may already sit in place)
 *   rt_reduce_scatter_avg  zero the padding [numel, sf*shard_len), average
 *                          the full buffers over the group, keep this rank's
 *                          shard (which may sit in place in the full buffer),
 *                          average it over the replicas (HYBRID, NO_SHARD)
 *   rt_allreduce_avg       average in place over every rank (rt_allreduce_sum:
 *                          the sum over the group)
 * At world 1 no NCCL at all: the same results by device copies (unless
 * FSDPC_NCCL_ALWAYS=1 made a one-rank communicator, to test this path).
 *
 * Stream order (the paper's, and PyTorch FSDP's two streams): a gather
 * runs on the gather lane's stream, a reduce-scatter or all-reduce on the
 * reduction lane's (cu.lane[], rt.h's lanes), so the prefetched gather of
 * one unit overlaps the reduce-scatter of another as well as the compute.
 * An event recorded on cu.compute makes the lane wait for everything the
 * step has enqueued so far; after the NCCL call an event recorded on the
 * lane makes cu.compute wait for the collective.  Under stream capture the
 * same calls fork the lanes into the graph and join them back, so the
 * recorded graph has the same dependencies.  (Inside a job, the padding
 * fill, the casts and the world-1 copies go on the job's lane, in order.)
 *
 * The communicators.  NCCL runs one communicator's operations one after
 * another in the order they were issued, and the ranks must issue them in
 * one order; a communicator fed from two streams could see them in
 * different orders on different ranks (a deadlock).  So each lane has its
 * own: the gather lane cu.gather (the shard group, always split off the
 * world's with its own resources), the reduction lane cu.nccl (every rank),
 * cu.group and cu.repl (--shard hybrid: the shard group's and the replicas',
 * split off it) -- each communicator used by one stream only, and every
 * rank issues each lane's collectives in the step's order.  Kernels of two
 * communicators may then run at once; NCCL_LAUNCH_ORDER_IMPLICIT=1 (set
 * here unless the user set it; NCCL 2.26 and later) makes NCCL launch them
 * on the GPU in host order, which is the same on every rank, so the two
 * can never wait on each other across ranks.  The world's communicator:
 * rank 0's ncclGetUniqueId, shared with rt_ctl_bcast, then
 * ncclCommInitRankConfig in non-blocking mode, polled with the step
 * timeout so that a missing rank cannot hang start-up.  Non-blocking also
 * means any NCCL call may answer ncclInProgress: NCCL_CHECK then polls
 * ncclCommGetAsyncError until it settles.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "kc_map.h" /* kc_cast under kernels.h's name's contract */
#include "kernels.h"
#include "rt_ctl.h"
#include "rt_priv.h"

/* ----------------------------------------------------------- communicator */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define NCOMM 4 /* cu.nccl, cu.group, cu.repl, cu.gather */

/* the distinct live communicators into c[], each after the one it was split off; their count */
static int live(ncclComm_t c[NCOMM])
{
    int n = 0;
    ncclComm_t all[NCOMM] = {cu.nccl, cu.group, cu.repl, cu.gather};
    for (int i = 0; i < NCOMM; i++) {
        int dup = all[i] == NULL;
        for (int j = 0; j < n && !dup; j++)
            dup = c[j] == all[i];
        if (!dup)
            c[n++] = all[i];
    }
    return n;
}

/* poll until no communicator is in ncclInProgress or timeout_s pass;
 * *timed_out tells which */
static ncclResult_t settle(double timeout_s, int *timed_out)
{
    double t0 = now_s();
    *timed_out = 0;
    ncclComm_t c[NCOMM];
    int n = live(c);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < n; i++) {
            ncclResult_t st = ncclInProgress;
            ncclResult_t r = ncclCommGetAsyncError(c[i], &st);
            if (r != ncclSuccess)
                return r;
            if (st == ncclInProgress)
                busy = 1;
            else if (st != ncclSuccess)
                return st;
        }
        if (!busy)
            return ncclSuccess;
        if (now_s() - t0 > timeout_s) {
            *timed_out = 1;
            return ncclInProgress;
        }
        struct timespec nap = {0, 20 * 1000};
        nanosleep(&nap, NULL);
    }
}

ncclResult_t cu_nccl_settle(const char *what)
{
    int timed_out;
    ncclResult_t r = settle(cu.timeout_s, &timed_out);
    if (timed_out) {
        cu_nccl_abort();
        rt_fatal(1, "rank %d: NCCL call %s did not complete within %g s (FSDPC_STEP_TIMEOUT): another rank may be "
                    "stuck or dead", cu.rank, what, cu.timeout_s);
    }
    return r;
}

ncclResult_t cu_nccl_async_error(void)
{
    ncclComm_t c[NCOMM];
    int n = live(c);
    for (int i = 0; i < n; i++) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c[i], &st);
        if (r != ncclSuccess)
            return r;
        if (st != ncclSuccess && st != ncclInProgress)
            return st;
    }
    return ncclSuccess;
}

/* one split off the world's communicator, settled before anything else uses either, even where it answered
 * ncclSuccess: the parent (and the child) can still read ncclInProgress then, and NCCL refuses the next call on
 * it ("Attempt to use communicator before the previous operation returned ncclSuccess": seen on an H200 with the
 * gather lane split off a one-rank world; the emulation is as strict).  r: the previous split's result (a failed
 * one is passed on) */
static ncclResult_t split1(ncclResult_t r, int color, int key, ncclComm_t *out, int *timed_out)
{
    if (r != ncclSuccess)
        return r;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.splitShare = 0;
    r = ncclCommSplit(cu.nccl, color, key, out, &cfg);
    return r == ncclSuccess || r == ncclInProgress ? settle(cu.timeout_s, timed_out) : r;
}

/* the shard group's and the replicas' communicators (after the world's):
 * ncclCommSplit where they are neither every rank nor one rank; then the
 * gather lane's, the shard group once more, split whenever the group has
 * a communicator (its own resources: splitShare 0) */
static int split(int sf, int srank, char *err, size_t errlen)
{
    cu.group = sf == cu.world ? cu.nccl : NULL;
    cu.repl = sf == 1 ? cu.nccl : NULL;
    ncclResult_t r = ncclSuccess;
    int timed_out = 0;
    if (sf != cu.world && sf != 1) {
        r = split1(r, cu.rank / sf, srank, &cu.group, &timed_out);
        r = split1(r, srank, cu.rank / sf, &cu.repl, &timed_out);
    }
    if (sf > 1 || cu.world == 1)
        r = split1(r, cu.rank / sf, srank, &cu.gather, &timed_out);
    if (r == ncclSuccess)
        return 0;
    snprintf(err, errlen, "NCCL set-up on GPU %d (%s): splitting the shard groups of %d ranks%s: %s (NCCL_DEBUG=WARN "
             "tells more)", cu.device, cu.name, sf, timed_out ? " did not finish within FSDPC_STEP_TIMEOUT" : "",
             ncclGetErrorString(r));
    cu_nccl_abort();
    return -1;
}

int cu_nccl_init(int sf, int srank, char *err, size_t errlen)
{
    struct {
        int64_t status;
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0); /* the lanes' kernels reach the GPU in host order (see above) */
    if (cu.rank == 0)
        msg.status = (int64_t)ncclGetUniqueId(&msg.id);
    rt_ctl_bcast(&msg, (int64_t)sizeof msg, 0);
    if (msg.status != ncclSuccess) {
        snprintf(err, errlen, "NCCL set-up: ncclGetUniqueId failed on rank 0: %s (NCCL_DEBUG=WARN tells more)",
                 ncclGetErrorString((ncclResult_t)msg.status));
        return -1;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "fsdpc";
    ncclResult_t r = ncclCommInitRankConfig(&cu.nccl, cu.world, msg.id, cu.rank, &cfg);
    int timed_out = 0;
    if ((r == ncclSuccess || r == ncclInProgress) && cu.nccl) /* as after the splits: settled either way */
        r = settle(cu.timeout_s, &timed_out);
    if (r == ncclSuccess)
        return split(sf, srank, err, errlen);
    const char *last = ncclGetLastError(cu.nccl);
    if (timed_out)
        snprintf(err, errlen, "NCCL set-up on GPU %d (%s) did not finish within %g s (FSDPC_STEP_TIMEOUT): a rank "
                              "did not join, or the ranks cannot reach each other (NCCL_DEBUG=INFO tells more)",
                 cu.device, cu.name, cu.timeout_s);
    else
        snprintf(err, errlen, "NCCL set-up on GPU %d (%s): ncclCommInitRankConfig failed: %s%s%s (%s)", cu.device,
                 cu.name, ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "",
                 r == ncclInvalidUsage ? "two ranks on one GPU? start one rank per GPU"
                                       : "NCCL_DEBUG=WARN tells more");
    cu_nccl_abort();
    return -1;
}

void cu_nccl_abort(void)
{
    ncclComm_t c[NCOMM];
    int n = live(c);
    cu.nccl = cu.group = cu.repl = cu.gather = NULL;
    for (int i = 0; i < n; i++)
        (void)ncclCommAbort(c[i]); /* on the way out: nothing to do about a failure */
}

void cu_nccl_destroy(void)
{
    ncclComm_t c[NCOMM];
    int n = live(c);
    for (int i = n - 1; i >= 0; i--) /* the split ones before the one they came from */
        NCCL_CHECK(ncclCommFinalize(c[i])); /* flushes outstanding work; settles by polling */
    cu.nccl = cu.group = cu.repl = cu.gather = NULL;
    for (int i = n - 1; i >= 0; i--) {
        ncclResult_t r = ncclCommDestroy(c[i]);
        if (r != ncclSuccess && r != ncclInProgress)
            cu_fail_nccl(__FILE__, __LINE__, "ncclCommDestroy", r);
    }
}

/* ------------------------------------------------------------- collectives */

static ncclDataType_t nccl_type(RtCtx *c, int dtype, const char *what)
{
    switch (dtype) {
    case RT_F32: return ncclFloat32;
    case RT_F64: return ncclFloat64;
    case RT_BF16: return ncclBfloat16;
    case RT_F16: return ncclFloat16;
    default: rt_step_fail(c, "%s: internal error: dtype code %d (float32, float64, bfloat16 or float16 expected)", what,
                          dtype);
    }
}

/* do [a, a+na) and [b, b+nb) share a byte? */
static int overlap(const void *a, int64_t na, const void *b, int64_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na > 0 && nb > 0 && x < y + (uintptr_t)nb && y < x + (uintptr_t)na;
}

/* lane's stream, after the work enqueued on cu.compute so far (inside a job: it waited at the start) */
static cudaStream_t fork_comm(int lane)
{
    cudaStream_t s = cu.lane[lane];
    if (cu.cur == s)
        return s;
    if (cu.cur != cu.compute)
        cu_internal("a collective of lane %d inside a job of the other lane", lane);
    CU_CHECK(cudaEventRecord(cu.ev_fork, cu.compute));
    CU_CHECK(cudaStreamWaitEvent(s, cu.ev_fork, 0));
    return s;
}

/* cu.compute waits for the collective on s */
static void join_comm(cudaStream_t s)
{
    if (cu.cur == s)
        return; /* inside a job: at its Wait */
    CU_CHECK(cudaEventRecord(cu.ev_join, s));
    CU_CHECK(cudaStreamWaitEvent(cu.compute, cu.ev_join, 0));
    cu_debug_sync("a collective");
}

static void need_comm(RtCtx *c, const char *what)
{
    if (!cu.up || !cu.compute)
        rt_step_fail(c, "%s: internal error: the GPU is not set up", what);
    if (c->world > 1 && !cu.nccl)
        rt_step_fail(c, "%s: internal error: no NCCL communicator at world %d", what, c->world);
}

void rt_allgather(RtCtx *c, void *full, const void *shard, int64_t shard_len, int dtype)
{
    const char *what = "rt_allgather";
    ncclDataType_t t = nccl_type(c, dtype, what);
    int64_t es = rt_elem_size(dtype);
    if (shard_len < 0)
        rt_step_fail(c, "%s: negative length %lld", what, (long long)shard_len);
    if (shard_len == 0)
        return;
    need_comm(c, what);
    char *f = full;
    const char *mine = f + (int64_t)c->srank * shard_len * es;
    int in_place = (const char *)shard == mine;
    if (!in_place && overlap(shard, shard_len * es, f, (int64_t)c->sf * shard_len * es))
        rt_step_fail(c, "%s: shard and full buffers overlap", what);
    if (!cu.gather) { /* a group of one */
        if (!in_place)
            kc_memcpy(f, shard, shard_len * es);
        return;
    }
    cudaStream_t s = fork_comm(RT_LANE_GATHER);
    /* in place: NCCL reads this rank's piece from full + srank * shard_len */
    NCCL_CHECK(ncclAllGather(shard, full, (size_t)shard_len, t, cu.gather, s));
    join_comm(s);
}

void rt_reduce_scatter_avg(RtCtx *c, void *shard, void *full, int64_t numel, int64_t shard_len, int dtype)
{
    const char *what = "rt_reduce_scatter_avg";
    ncclDataType_t t = nccl_type(c, dtype, what);
    int64_t es = rt_elem_size(dtype);
    if (shard_len == 0)
        return;
    need_comm(c, what);
    int64_t total = rt_rs_prepare(c, what, full, numel, shard_len, es);
    char *f = full;
    char *mine = f + (int64_t)c->srank * shard_len * es;
    if ((char *)shard != mine && overlap(shard, shard_len * es, f, total * es))
        rt_step_fail(c, "%s: shard and full buffers overlap", what);
    if (!cu.group && (char *)shard != mine) /* a group of one */
        kc_memcpy(shard, mine, shard_len * es);
    if (!cu.group && !cu.repl)
        return;
    cudaStream_t s = fork_comm(RT_LANE_REDUCE);
    /* the group's average (in place when shard == full + srank * shard_len,
     * as NCCL allows), then the average of that over the replicas: every rank's */
    if (cu.group)
        NCCL_CHECK(ncclReduceScatter(full, shard, (size_t)shard_len, t, ncclAvg, cu.group, s));
    if (cu.repl)
        NCCL_CHECK(ncclAllReduce(shard, shard, (size_t)shard_len, t, ncclAvg, cu.repl, s));
    join_comm(s);
}

void rt_reduce_scatter_avg_bf16(RtCtx *c, void *shard, void *full, void *scratch, int64_t numel,
                                int64_t shard_len)
{
    const char *what = "rt_reduce_scatter_avg_bf16";
    if (shard_len == 0)
        return;
    need_comm(c, what);
    int64_t total = rt_rs_prepare(c, what, full, numel, shard_len, 4);
    float *f = full;
    uint16_t *h = scratch, *mine = h + (int64_t)c->srank * shard_len;
    k_cast(K_DT_BF16, h, K_DT_F32, f, total);
    if (cu.group || cu.repl) {
        cudaStream_t s = fork_comm(RT_LANE_REDUCE);
        /* the group's average in place, then the replicas': every rank's, in bfloat16 */
        if (cu.group)
            NCCL_CHECK(ncclReduceScatter(h, mine, (size_t)shard_len, ncclBfloat16, ncclAvg, cu.group, s));
        if (cu.repl)
            NCCL_CHECK(ncclAllReduce(mine, mine, (size_t)shard_len, ncclBfloat16, ncclAvg, cu.repl, s));
        join_comm(s);
    }
    k_cast(K_DT_F32, shard, K_DT_BF16, mine, shard_len);
}

/* in place, op ncclAvg over every rank or ncclSum over the shard group */
static void allreduce(RtCtx *c, void *x, int64_t n, int dtype, ncclRedOp_t op, const char *what)
{
    ncclComm_t comm = op == ncclAvg ? cu.nccl : cu.group;
    ncclDataType_t t = nccl_type(c, dtype, what);
    if (n < 0)
        rt_step_fail(c, "%s: negative length %lld", what, (long long)n);
    if (n == 0)
        return;
    need_comm(c, what);
    if (!comm) /* one rank */
        return;
    cudaStream_t s = fork_comm(RT_LANE_REDUCE);
    NCCL_CHECK(ncclAllReduce(x, x, (size_t)n, t, op, comm, s));
    join_comm(s);
}

void rt_allreduce_avg(RtCtx *c, void *x, int64_t n, int dtype)
{
    allreduce(c, x, n, dtype, ncclAvg, "rt_allreduce_avg");
}

void rt_allreduce_sum(RtCtx *c, void *x, int64_t n, int dtype)
{
    allreduce(c, x, n, dtype, ncclSum, "rt_allreduce_sum");
}

/* A scheduled collective: its job's kernels, copies and NCCL calls go on
 * its lane's stream after everything cu.compute holds so far; cu.compute
 * waits for its end at rt_coll_wait.  A lane runs its jobs in start order;
 * the two lanes run beside each other. */
void rt_coll_start(RtCtx *c, int tag, int node, int lane, void (*job)(RtCtx *))
{
    (void)node;
    if (tag < 0 || tag >= c->m->ncoll || lane < 0 || lane >= RT_NLANE || cu.cur != cu.compute)
        rt_step_fail(c, "rt_coll_start: internal error: tag %d of %d, lane %d (nested: %d)", tag, c->m->ncoll, lane,
                     cu.cur != cu.compute);
    cu.cur = fork_comm(lane);
    job(c);
    cu.cur = cu.compute;
    CU_CHECK(cudaEventRecord(cu.ev_coll[tag], cu.lane[lane]));
    cu.coll_forked[tag] = 1;
}

void rt_coll_wait(RtCtx *c, int tag)
{
    if (tag < 0 || tag >= c->m->ncoll || !cu.coll_forked[tag])
        rt_step_fail(c, "rt_coll_wait: internal error: tag %d was not started", tag);
    CU_CHECK(cudaStreamWaitEvent(cu.compute, cu.ev_coll[tag], 0));
    cu.coll_forked[tag] = 0;
    cu_debug_sync("a collective");
}
