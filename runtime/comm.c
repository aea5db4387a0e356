/* comm.c — the step's collectives on the CPU target, over MPI (the cuda
 * target's are comm_nccl.c): gathers inside the shard group, gradients
 * averaged over the group and then the replicas (--shard), the loss over
 * every rank.
 *
 * Lengths are elements of the given dtype.  MPI counts are int: transfers
 * beyond RT_MPI_CHUNK elements are cut into several calls (the allgather is
 * rt_mpi_gather, shared with the control plane in ctl_mpi.c).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <string.h>

#include "kernels.h"
#include "rt_mpi.h"
#include "rt_priv.h"

static MPI_Datatype float_type(RtCtx *c, int dtype, const char *what)
{
    if (dtype == RT_F32)
        return MPI_FLOAT;
    if (dtype == RT_F64)
        return MPI_DOUBLE;
    rt_step_fail(c, "%s: unsupported dtype code %d (float32 or float64 expected)", what, dtype);
}

/* do [a, a+na) and [b, b+nb) share a byte? (compared as integers: they may be different objects) */
static int overlap(const void *a, int64_t na, const void *b, int64_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na > 0 && nb > 0 && x < y + (uintptr_t)nb && y < x + (uintptr_t)na;
}

/* The communicators of this rank's shard group (F consecutive ranks) and of
 * its replicas (the ranks at the same place in the other groups), split off
 * MPI_COMM_WORLD at the step's first collective, which every rank reaches
 * in the same order. */
static MPI_Comm g_group = MPI_COMM_NULL, g_repl = MPI_COMM_NULL;

static void comms(RtCtx *c)
{
    if (g_group != MPI_COMM_NULL)
        return;
    if (c->sf == c->world) {
        g_group = MPI_COMM_WORLD;
        g_repl = MPI_COMM_SELF;
        return;
    }
    RT_MPI(MPI_Comm_split(MPI_COMM_WORLD, c->rank / c->sf, c->srank, &g_group));
    RT_MPI(MPI_Comm_split(MPI_COMM_WORLD, c->srank, c->rank / c->sf, &g_repl));
}

void rt_allgather(RtCtx *c, void *full, const void *shard, int64_t shard_len, int dtype)
{
    static const MPI_Datatype types[] = {[RT_F32] = MPI_FLOAT, [RT_F64] = MPI_DOUBLE, [RT_I64] = MPI_INT64_T,
                                         [RT_I32] = MPI_INT32_T, [RT_BOOL] = MPI_UINT8_T,
                                         [RT_BF16] = MPI_UINT16_T, [RT_F16] = MPI_UINT16_T}; /* moved, never summed */
    int64_t es = rt_elem_size(dtype);
    if (es == 0)
        rt_step_fail(c, "rt_allgather: unsupported dtype code %d", dtype);
    if (shard_len < 0)
        rt_step_fail(c, "rt_allgather: negative length %lld", (long long)shard_len);
    comms(c);
    /* this rank's own piece may already sit in place */
    const char *mine = (const char *)full + (int64_t)c->srank * shard_len * es;
    if (shard != mine && overlap(shard, shard_len * es, full, (int64_t)c->sf * shard_len * es))
        rt_step_fail(c, "rt_allgather: shard and full buffers overlap");
    rt_mpi_gather(g_group, full, shard == mine ? MPI_IN_PLACE : shard, shard_len, types[dtype], es, -1);
}

/* in-place MPI_Allreduce(SUM) of n elements over comm, in int-sized pieces */
static void allreduce_sum(MPI_Comm comm, void *x, int64_t n, MPI_Datatype t, int64_t es)
{
    char *p = x;
    for (int64_t off = 0; off < n; off += RT_MPI_CHUNK) {
        int k = (int)(n - off < RT_MPI_CHUNK ? n - off : RT_MPI_CHUNK);
        RT_MPI(MPI_Allreduce(MPI_IN_PLACE, p + off * es, k, t, MPI_SUM, comm));
    }
}

/* dst[i] = src[i] / world; dst may equal src */
static void scale_avg(void *dst, const void *src, int64_t n, int dtype, int world)
{
    if (dtype == RT_F32) {
        float *d = dst;
        const float *s = src;
        float w = (float)world;
        for (int64_t i = 0; i < n; i++)
            d[i] = s[i] / w;
    } else {
        double *d = dst;
        const double *s = src;
        double w = (double)world;
        for (int64_t i = 0; i < n; i++)
            d[i] = s[i] / w;
    }
}

/* Reduce-scatter as MPI_Allreduce of the whole flat buffer followed by
 * taking this rank's slice.  Why not MPI_Reduce_scatter_block: Open MPI
 * 4.1's reduce_scatter_block on shared memory is slower than its Allreduce
 * of the whole buffer (64 MiB float, 2 ranks, on these machines: ~52 ms vs
 * ~25 ms for the bare calls; ~62 ms vs ~45 ms for this function, scaling
 * included), although it moves half the data.  The step only reads its own
 * slice afterwards, and each element is the same sum either way.  Revisit
 * for multi-node runs, where reduce-scatter's smaller traffic should win. */
void rt_reduce_scatter_avg(RtCtx *c, void *shard, void *full, int64_t numel,
                           int64_t shard_len, int dtype)
{
    MPI_Datatype t = float_type(c, dtype, "rt_reduce_scatter_avg");
    int64_t es = rt_elem_size(dtype);
    int64_t total = rt_rs_prepare(c, "rt_reduce_scatter_avg", full, numel, shard_len, es);
    comms(c);
    char *f = full;
    if (c->sf > 1)
        allreduce_sum(g_group, f, total, t, es);
    char *mine = f + (int64_t)c->srank * shard_len * es;
    if (c->world > c->sf) /* HYBRID, NO_SHARD: and over the replicas of this shard */
        allreduce_sum(g_repl, mine, shard_len, t, es);
    char *d = shard;
    if (d != mine && overlap(d, shard_len * es, f, total * es))
        rt_step_fail(c, "rt_reduce_scatter_avg: shard and full buffers overlap");
    if (c->world == 1) {
        if (d != mine)
            memcpy(d, mine, (size_t)(shard_len * es));
        return;
    }
    scale_avg(d, mine, shard_len, dtype, c->world);
}

/* MPI_Op: inout[i] = bf16(float(in[i]) + float(inout[i])), on MPI_UINT16_T
 * carrying bfloat16 bits (MPI has no bfloat16 type) */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = k_bf16_from_f32(k_bf16_to_f32(a[i]) + k_bf16_to_f32(b[i]));
}

/* in-place sum of n bfloat16 over comm, in int-sized pieces */
static void allreduce_bf16(MPI_Comm comm, uint16_t *x, int64_t n)
{
    static MPI_Op op = MPI_OP_NULL;
    if (op == MPI_OP_NULL)
        RT_MPI(MPI_Op_create(bf16_sum, 1, &op));
    for (int64_t off = 0; off < n; off += RT_MPI_CHUNK) {
        int k = (int)(n - off < RT_MPI_CHUNK ? n - off : RT_MPI_CHUNK);
        RT_MPI(MPI_Allreduce(MPI_IN_PLACE, x + off, k, MPI_UINT16_T, op, comm));
    }
}

void rt_reduce_scatter_avg_bf16(RtCtx *c, void *shard, void *full, void *scratch, int64_t numel,
                                int64_t shard_len)
{
    int64_t total = rt_rs_prepare(c, "rt_reduce_scatter_avg_bf16", full, numel, shard_len, 4);
    comms(c);
    float *f = full;
    uint16_t *h = scratch;
    k_cast(K_DT_BF16, h, K_DT_F32, f, total);
    if (c->sf > 1)
        allreduce_bf16(g_group, h, total);
    uint16_t *mine = h + (int64_t)c->srank * shard_len;
    if (c->world > c->sf)
        allreduce_bf16(g_repl, mine, shard_len);
    float *d = shard, w = (float)c->world;
    for (int64_t i = 0; i < shard_len; i++)
        d[i] = k_bf16_to_f32(mine[i]) / w;
}

/* in place: the average over every rank (avg), or the sum over the group */
static void allreduce(RtCtx *c, void *x, int64_t n, int dtype, int avg, const char *what)
{
    MPI_Datatype t = float_type(c, dtype, what);
    if (n < 0)
        rt_step_fail(c, "%s: negative length %lld", what, (long long)n);
    comms(c);
    if ((avg ? c->world : c->sf) == 1 || n == 0)
        return;
    allreduce_sum(avg ? MPI_COMM_WORLD : g_group, x, n, t, rt_elem_size(dtype));
    if (avg)
        scale_avg(x, x, n, dtype, c->world);
}

void rt_allreduce_avg(RtCtx *c, void *x, int64_t n, int dtype)
{
    allreduce(c, x, n, dtype, 1, "rt_allreduce_avg");
}

void rt_allreduce_sum(RtCtx *c, void *x, int64_t n, int dtype)
{
    allreduce(c, x, n, dtype, 0, "rt_allreduce_sum");
}
