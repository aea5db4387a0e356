/* cuemu_kernel.h — a kernel of the CUDA emulation (cuemu.h), without the
 * CUDA headers: the emulated kernels are compiled on top of
 * kernels/cuda/emu.h, whose dim3 and friends would clash with them.
 *
 * A CuemuKernel is one row of a named table (cuemu_kernels_add): its name
 * (cudaLibraryGetKernel looks it up), its parameters' sizes (cudaLaunchKernel
 * copies each args[i], size[i] bytes, into one block, as CUDA copies the
 * arguments at launch), which parameters are pointers (each must point
 * into device memory, or be NULL), and a trampoline that runs the grid on
 * the host with pointers into that block.
 */
#ifndef FSDPC_CUEMU_KERNEL_H
#define FSDPC_CUEMU_KERNEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUEMU_MAX_ARGS 32

struct CUkern_st {
    const char *name;
    int nargs;                  /* at most CUEMU_MAX_ARGS */
    const size_t *size;         /* nargs sizes, in bytes */
    const unsigned char *is_ptr; /* nargs flags */
    void (*run)(void *const *args, unsigned grid, unsigned block, unsigned smem);
};
typedef struct CUkern_st CuemuKernel;

/* Adds the n kernels of table (named name, as in an image "cuemu:name")
 * to the registry; the table must stay alive.  0, or -1 if the registry is
 * full. */
int cuemu_kernels_add(const char *name, const CuemuKernel *table, int n);

/* kernels.def's kernels, compiled for the host (cuemu_kc.cc): table "kernels/cuda" */
extern const CuemuKernel cuemu_kc_kernels[];
extern const int cuemu_kc_nkernels;

#ifdef __cplusplus
}
#endif

#endif
