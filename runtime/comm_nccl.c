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
 * Stream order (the paper's): the collective runs on cu.comm.  An event
 * recorded on cu.compute makes cu.comm wait for everything the step has
 * enqueued so far; after the NCCL call an event recorded on cu.comm makes
 * cu.compute wait for the collective.  Under stream capture the same calls
 * fork cu.comm into the graph and join it back, so the recorded graph has
 * the same dependencies.  (The padding fill and the world-1 copies go on
 * cu.compute, in order.)
 *
 * The communicator: rank 0's ncclGetUniqueId, shared with rt_ctl_bcast,
 * then ncclCommInitRankConfig in non-blocking mode, polled with the step
 * timeout so that a missing rank cannot hang start-up.  Non-blocking also
 * means any NCCL call may answer ncclInProgress: NCCL_CHECK then polls
 * ncclCommGetAsyncError until it settles.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
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

/* the distinct live communicators into c[]; their count */
static int live(ncclComm_t c[3])
{
    int n = 0;
    ncclComm_t all[3] = {cu.nccl, cu.group, cu.repl};
    for (int i = 0; i < 3; i++) {
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
    ncclComm_t c[3];
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
    ncclComm_t c[3];
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

/* the shard group's and the replicas' communicators (after the world's):
 * ncclCommSplit where they are neither every rank nor one rank */
static int split(int sf, int srank, char *err, size_t errlen)
{
    cu.group = sf == cu.world ? cu.nccl : NULL;
    cu.repl = sf == 1 ? cu.nccl : NULL;
    if (sf == cu.world || sf == 1)
        return 0;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommSplit(cu.nccl, cu.rank / sf, srank, &cu.group, &cfg);
    if (r == ncclSuccess || r == ncclInProgress)
        r = ncclCommSplit(cu.nccl, srank, cu.rank / sf, &cu.repl, &cfg);
    int timed_out = 0;
    if (r == ncclInProgress)
        r = settle(cu.timeout_s, &timed_out);
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
    if (r == ncclInProgress && cu.nccl)
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
    ncclComm_t c[3];
    int n = live(c);
    cu.nccl = cu.group = cu.repl = NULL;
    for (int i = 0; i < n; i++)
        (void)ncclCommAbort(c[i]); /* on the way out: nothing to do about a failure */
}

void cu_nccl_destroy(void)
{
    ncclComm_t c[3];
    int n = live(c);
    for (int i = n - 1; i >= 0; i--) /* the split ones before the one they came from */
        NCCL_CHECK(ncclCommFinalize(c[i])); /* flushes outstanding work; settles by polling */
    cu.nccl = cu.group = cu.repl = NULL;
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

/* cu.comm waits for the work enqueued on cu.compute so far (inside a job: it did already) */
static void fork_comm(void)
{
    if (cu.cur == cu.comm)
        return;
    CU_CHECK(cudaEventRecord(cu.ev_fork, cu.compute));
    CU_CHECK(cudaStreamWaitEvent(cu.comm, cu.ev_fork, 0));
}

/* cu.compute waits for the collective */
static void join_comm(void)
{
    if (cu.cur == cu.comm)
        return; /* inside a job: at its Wait */
    CU_CHECK(cudaEventRecord(cu.ev_join, cu.comm));
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
    if (!cu.group) { /* a group of one */
        if (!in_place)
            kc_memcpy(f, shard, shard_len * es);
        return;
    }
    fork_comm();
    /* in place: NCCL reads this rank's piece from full + srank * shard_len */
    NCCL_CHECK(ncclAllGather(shard, full, (size_t)shard_len, t, cu.group, cu.comm));
    join_comm();
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
    fork_comm();
    /* the group's average (in place when shard == full + srank * shard_len,
     * as NCCL allows), then the average of that over the replicas: every rank's */
    if (cu.group)
        NCCL_CHECK(ncclReduceScatter(full, shard, (size_t)shard_len, t, ncclAvg, cu.group, cu.comm));
    if (cu.repl)
        NCCL_CHECK(ncclAllReduce(shard, shard, (size_t)shard_len, t, ncclAvg, cu.repl, cu.comm));
    join_comm();
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
        fork_comm();
        /* the group's average in place, then the replicas': every rank's, in bfloat16 */
        if (cu.group)
            NCCL_CHECK(ncclReduceScatter(h, mine, (size_t)shard_len, ncclBfloat16, ncclAvg, cu.group, cu.comm));
        if (cu.repl)
            NCCL_CHECK(ncclAllReduce(mine, mine, (size_t)shard_len, ncclBfloat16, ncclAvg, cu.repl, cu.comm));
        join_comm();
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
    fork_comm();
    NCCL_CHECK(ncclAllReduce(x, x, (size_t)n, t, op, comm, cu.comm));
    join_comm();
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
 * cu.comm after everything cu.compute holds so far; cu.compute waits for its
 * end at rt_coll_wait.  Jobs run in start order on the one stream. */
void rt_coll_start(RtCtx *c, int tag, int node, void (*job)(RtCtx *))
{
    (void)node;
    if (tag < 0 || tag >= c->m->ncoll || cu.cur != cu.compute)
        rt_step_fail(c, "rt_coll_start: internal error: tag %d of %d (nested: %d)", tag, c->m->ncoll,
                     cu.cur != cu.compute);
    fork_comm();
    cu.cur = cu.comm;
    job(c);
    cu.cur = cu.compute;
    CU_CHECK(cudaEventRecord(cu.ev_coll[tag], cu.comm));
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
