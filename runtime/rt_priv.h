/* rt_priv.h — private to runtime/ (rt.c, comm.c, export.c); never seen by
 * generated code.  Needs <mpi.h>. */
#ifndef FSDPC_RT_PRIV_H
#define FSDPC_RT_PRIV_H

#include <mpi.h>
#include <stdint.h>

#include "rt.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the fsdpc runtime assumes a little-endian host (init file, .npy and ONNX raw_data are little-endian)"
#endif

/* The program name used as the prefix of every message ("NAME: error: ..."). */
extern const char *rt_prog;

/* Report a failed MPI call and bring every rank down (MPI_Abort when the
 * world has more than one rank).  Used through RT_MPI. */
_Noreturn void rt_mpi_fail(const char *file, int line, const char *call, int rc);

#define RT_MPI(call)                                              \
    do {                                                          \
        int rt_rc_ = (call);                                      \
        if (rt_rc_ != MPI_SUCCESS)                                \
            rt_mpi_fail(__FILE__, __LINE__, #call, rt_rc_);       \
    } while (0)

/* bytes per element of an RT_* dtype (0 if unknown) */
int64_t rt_elem_size(int dtype);
/* MPI datatype of an RT_* dtype, MPI_DATATYPE_NULL if none */
MPI_Datatype rt_mpi_type(int dtype);

/* Gather every rank's shard of shard_len elements into full (world*shard_len
 * elements, rank-major) on root, or on every rank when root < 0 (allgather).
 * Handles counts beyond INT_MAX.  full is only written on root. */
void rt_gather_shards(RtCtx *c, void *full, const void *shard, int64_t shard_len, int dtype, int root);

/* --export-onnx: collective over all ranks.  init_fd is the open init file.
 * Returns 0 on every rank if FILE was written, 1 on every rank otherwise
 * (the message has been printed by rank 0). */
int rt_export_onnx(RtCtx *c, const char *path, int init_fd, const char *init_path);

/* Start-up check on rank 0, so that a run does not train for hours and then
 * fail to export: the model is embedded and FILE's directory is writable.
 * Returns 0, or -1 with a one-line reason in err. */
int rt_export_check(const RtModel *m, const char *path, char *err, size_t errlen);

#endif
