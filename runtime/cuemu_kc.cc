/* cuemu_kc.cc — kernels.def's kernels compiled for the host, as the CUDA
 * emulation's kernel table "kernels/cuda" (cuemu_kernel.h): the same
 * sources NVRTC compiles for a GPU (kernels/cuda/emu_kernels.h), run by
 * kernels/cuda/emu.h (a block's threads as fibers; barriers, shuffles,
 * atomics and wmma emulated).
 *
 * Per kernels.def row, a trampoline takes the argument block that
 * cudaLaunchKernel copied (one pointer per parameter), copies each into a
 * value of the parameter's type and runs the grid on the calling thread: a
 * stream's worker.  emu.h's state (threadIdx..., the fiber scheduler,
 * __shared__) is thread_local, so kernels on two streams run at once, as
 * on a GPU, and a missing event wait between them is a real race.  The
 * table's sizes and pointer flags come from the row's types; taking each
 * kernel's address as `void params` stops the build if a row and its
 * definition disagree.
 *
 * The same object is kernels_cuda_test's kernels (tests/kernels_cuda_test.cc:
 * each kc_ launcher against its kernels/c twin).
 *
 * The model's generated fused kernels (codegen/emit_fused.c) join the same
 * way: a table of their own under another name, added with
 * cuemu_kernels_add and named in an image of its own ("cuemu:fsdpc_model":
 * the executable loads it as a second library, as the model's own program on
 * a GPU).
 */
#include "emu.h"

#include "emu_kernels.h"

#include "cuemu_kernel.h"
extern "C" {
#include "kernels.h" /* K_ATTN_*: the flags attn.cu mirrors */
}

namespace dev {

using emu::Params;

#define KC(name, params)                                                                           \
    static void run_##name(void *const *args, unsigned grid, unsigned block, unsigned smem)       \
    {                                                                                              \
        (void)smem; /* no kernel declares dynamic shared memory */                                 \
        using Fn = void params;                                                                    \
        Fn *fn = &name;                                                                            \
        emu::run_args(#name, fn, grid, block, args);                                               \
    }
#include "kernels.def"
#undef KC
#undef KC_TYPED

static_assert(sizeof(void *) == 8, "the emulation assumes a 64-bit host");
/* attn.cu's flag bits are kernels/c's (kernels.h, as the launchers pass them) */
static_assert(KC_ATTN_KROW_BIT == K_ATTN_KROW && KC_ATTN_ZERO_BIT == K_ATTN_ZERO && KC_ATTN_CAUSAL_BIT == K_ATTN_CAUSAL &&
                  KC_ATTN_WINDOW_SHIFT == K_ATTN_WINDOW_SHIFT,
              "attention flags");

/* kernels.def's types are the device namespace's (KDims and the mirrors of common.cuh) */
extern "C" const CuemuKernel cuemu_kc_kernels[] = {
#define KC(name, params) {#name, Params<void params>::n, Params<void params>::size, Params<void params>::is_ptr, run_##name},
#include "kernels.def"
#undef KC
#undef KC_TYPED
};
extern "C" const int cuemu_kc_nkernels = (int)(sizeof cuemu_kc_kernels / sizeof cuemu_kc_kernels[0]);

} // namespace dev
