/* rt_comm_ctl.c — test only: the step's collectives (rt.h) through the
 * control plane (rt_ctl.h), so that a cpu-target step links with the
 * target-neutral core, ctl_tcp.c and dev_host.c and runs at any world size
 * without MPI (tests/py/ctl_tcp_train.py).  Slow and simple: everything
 * goes through rank 0, which sums in rank order in double. */
#include <stdlib.h>
#include <string.h>

#include "rt_ctl.h"
#include "rt_priv.h"

/* x := the sum over ranks of x, divided by the world size when avg (n
 * float32 / float64 elements) */
static void reduce(RtCtx *c, void *x, int64_t n, int dtype, int avg)
{
    int64_t es = rt_elem_size(dtype), b = n * es;
    if (c->world == 1 || n == 0)
        return;
    if (dtype != RT_F32 && dtype != RT_F64)
        rt_step_fail(c, "rt_comm_ctl: dtype %d", dtype);
    char *all = c->rank == 0 ? malloc((size_t)(b * c->world)) : NULL;
    if (c->rank == 0 && !all)
        rt_step_fail(c, "rt_comm_ctl: out of memory");
    rt_ctl_gather(x, b, all, 0);
    for (int64_t i = 0; c->rank == 0 && i < n; i++) {
        double s = 0;
        for (int q = 0; q < c->world; q++) {
            const char *p = all + q * b + i * es;
            s += dtype == RT_F32 ? *(const float *)(const void *)p : *(const double *)(const void *)p;
        }
        if (avg)
            s /= c->world;
        if (dtype == RT_F32)
            ((float *)x)[i] = (float)s;
        else
            ((double *)x)[i] = s;
    }
    free(all);
    rt_ctl_bcast(x, b, 0);
}

/* the shard group is every rank (FULL_SHARD, SHARD_GRAD_OP): what this test comm serves */
static void full_shard_only(RtCtx *c)
{
    if (c->sf != c->world)
        rt_step_fail(c, "rt_comm_ctl: shard groups of %d of %d ranks (--shard none/hybrid) are not served here",
                     c->sf, c->world);
}

void rt_allgather(RtCtx *c, void *full, const void *shard, int64_t len, int dtype)
{
    full_shard_only(c);
    int64_t b = len * rt_elem_size(dtype);
    char *mine = malloc((size_t)b + 1); /* shard may lie inside full */
    if (!mine)
        rt_step_fail(c, "rt_comm_ctl: out of memory");
    memcpy(mine, shard, (size_t)b);
    rt_ctl_gather(mine, b, full, 0);
    rt_ctl_bcast(full, b * c->world, 0);
    free(mine);
}

void rt_allreduce_avg(RtCtx *c, void *x, int64_t n, int dtype) { reduce(c, x, n, dtype, 1); }

void rt_reduce_scatter_avg_bf16(RtCtx *c, void *shard, void *full, void *scratch, int64_t numel, int64_t len)
{
    (void)shard, (void)full, (void)scratch, (void)numel, (void)len;
    rt_step_fail(c, "rt_comm_ctl: --reduce-dtype bf16 is not served here");
}

void rt_allreduce_sum(RtCtx *c, void *x, int64_t n, int dtype) { reduce(c, x, n, dtype, 0); }

void rt_reduce_scatter_avg(RtCtx *c, void *shard, void *full, int64_t numel, int64_t len, int dtype)
{
    full_shard_only(c);
    int64_t es = rt_elem_size(dtype), total = len * c->world;
    memset((char *)full + numel * es, 0, (size_t)((total - numel) * es));
    reduce(c, full, total, dtype, 1);
    memmove(shard, (char *)full + c->rank * len * es, (size_t)(len * es));
}
