/* cuemu.h — private to the CUDA emulation (runtime/cuemu_*.c, the emulated
 * kernels and the tests that reach inside it): the emulated runtime's
 * work queue and kernel registry.  The runtime under emulation
 * (dev_cuda.c, kc_rt.c, comm_nccl.c) never includes it: it sees only the
 * real toolkit headers, and the emulation library implements their
 * functions (cuemu_rt.c: the CUDA runtime subset).
 *
 * Work: everything a stream runs (a copy, a fill, a kernel, a cuBLASLt
 * matmul, an NCCL collective) is a task: a function and a payload that
 * cuemu_enqueue copies when the call is made, as CUDA copies a kernel's
 * arguments at launch.  On a capturing stream the task is recorded into the
 * graph instead, and every replay runs the same payload.
 *
 * Kernels: a cudaKernel_t is a CuemuKernel (cuemu_kernel.h), a row of a
 * named table handed to cuemu_kernels_add.  An emulated "image" is the text
 * "cuemu:" followed by the name of one table ("cuemu:kernels/cuda" is
 * kernels.def's kernels, cuemu_kc.cc; "cuemu:fsdpc_model" a model's fused
 * kernels): that is what cudaLibraryLoadData accepts in place of PTX or a
 * cubin, and cudaLibraryGetKernel looks a name up in that table alone.
 */
#ifndef FSDPC_CUEMU_H
#define FSDPC_CUEMU_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "cuemu_kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue run(payload) on stream s (NULL: the legacy stream), payload a
 * copy of size bytes made now; on a capturing stream it is recorded into
 * the graph.  call names the API function for messages. */
cudaError_t cuemu_enqueue(cudaStream_t s, const char *call, void (*run)(void *payload), const void *payload,
                          size_t size);

/* e, which becomes the calling thread's last error unless cudaSuccess */
cudaError_t cuemu_fail(cudaError_t e);

/* 1 if [p, p + n) lies inside one live device allocation */
int cuemu_is_device(const void *p, size_t n);

/* one line on stderr: "cuemu: CALL: <message>" */
void cuemu_complain(const char *call, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
