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
 * Kernels: a cudaKernel_t is a CuemuKernel, a row of a table handed to
 * cuemu_kernels_add: its name (cudaLibraryGetKernel looks it up), its
 * parameters' sizes (cudaLaunchKernel copies each args[i] into one block),
 * and a trampoline that runs the grid on the host with the arguments of
 * that block.
 */
#ifndef FSDPC_CUEMU_H
#define FSDPC_CUEMU_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* payload: the copied arguments of one launch, each at its own offset */
struct CUkern_st {
    const char *name;
    int nargs;
    const size_t *size;  /* nargs sizes, in bytes */
    void (*run)(void *const *args, unsigned grid, unsigned block, unsigned smem);
};
typedef struct CUkern_st CuemuKernel;

/* Adds n kernels to the registry that cudaLibraryGetKernel searches (the
 * table must outlive the process's use of it). */
void cuemu_kernels_add(const CuemuKernel *table, int n);

/* Enqueue run(payload) on stream s (NULL: the legacy stream), payload a
 * copy of size bytes made now; on a capturing stream it is recorded into
 * the graph.  call names the API function for messages. */
cudaError_t cuemu_enqueue(cudaStream_t s, const char *call, void (*run)(void *payload), const void *payload,
                          size_t size);

/* 1 if [p, p + n) lies inside one live device allocation */
int cuemu_is_device(const void *p, size_t n);

/* one line on stderr: "cuemu: CALL: <message>" */
void cuemu_complain(const char *call, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif
