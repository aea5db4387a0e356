/* notes.c — what the compiler tells its user about the machine it runs on
 * before building OUT: a note (stderr, one line, "fsdpc: note: ...") where
 * OUT would not run here as the user may expect.  Once per build (cg_build
 * asks once), before the slow part (NVRTC, cc), whatever --quiet says: a
 * note is not progress.
 *
 *   --target cuda (the default, not --emulate) where no NVIDIA driver loads: OUT needs a
 *     driver and a GPU, and --target cpu is what trains here.  The test is
 *     the CUDA runtime's own, dlopen("libcuda.so.1") (runtime/dev_cuda.c's
 *     executable reports the same library missing when started), then
 *     /dev/nvidiactl, the driver's control device, without which a loaded
 *     libcuda finds no GPU.  Nothing is initialised: about a millisecond.
 *   --target cpu --precision bf16 where this CPU has no native bfloat16 GEMM
 *     (AVX512-BF16): OUT's bf16 GEMMs run widened to float32
 *     (kernels/c/matmul_bf16.c), which costs time instead of saving it.
 *     Asked of oneDNN itself, loaded only here (dlopen: every other compile
 *     would pay ~10 ms to load its 40 MB), by kernels.h's k_bf16_isa_native,
 *     the rule the executable follows (it says the same at start,
 *     runtime/rt.c), so DNNL_MAX_CPU_ISA=AVX512_CORE forces the note as it
 *     forces the widened path.
 */
#define _POSIX_C_SOURCE 200809L
#include "cg.h"
#include "fsdpc_config.h"
#include "kernels.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* why a cuda executable could not run here ("no NVIDIA driver ..."), or NULL where it may */
static const char *no_gpu_here(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return "no NVIDIA driver on this machine (libcuda.so.1 does not load)";
    dlclose(h);
    if (access("/dev/nvidiactl", F_OK))
        return "no NVIDIA GPU on this machine (libcuda.so.1 loads, but there is no /dev/nvidiactl)";
    return NULL;
}

/* 1: bf16 GEMMs run natively on this CPU (oneDNN's effective ISA by k_bf16_isa_native), 0: widened, -1: unknown
 * (oneDNN does not load).  The library stays loaded: unloading a library that started threads is not safe. */
static int bf16_native_here(void)
{
    void *h = dlopen(FSDPC_DNNL_LIBRARY, RTLD_LAZY | RTLD_LOCAL);
    if (!h)
        return -1;
    int (*isa)(void); /* dnnl_get_effective_cpu_isa: a dnnl_cpu_isa_t, an int-sized enum */
    *(void **)&isa = dlsym(h, "dnnl_get_effective_cpu_isa");
    return isa ? k_bf16_isa_native((unsigned)isa()) : -1;
}

void cg_notes(const Graph *g)
{
    const Options *o = g->opt;
    const char *why;
    if (!strcmp(o->target, "cuda") && !o->emulate && (why = no_gpu_here()) != NULL) /* --emulate needs none */
        fprintf(stderr, "fsdpc: note: %s: %s will need an NVIDIA driver and GPU to run; --target cpu builds an "
                "executable that trains here\n", why, o->out);
    if (!strcmp(o->target, "cpu") && o->precision == PREC_BF16 && bf16_native_here() == 0)
        fprintf(stderr, "fsdpc: note: --precision bf16: no native bfloat16 GEMM on this CPU (AVX512-BF16): %s's "
                "bf16 GEMMs run widened to float32 here, a step taking 0.9-1.0x the time of --precision fp32's\n",
                o->out);
}
