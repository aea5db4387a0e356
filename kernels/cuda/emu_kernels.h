/* emu_kernels.h — kernels/cuda's device program as host C++, inside
 * namespace dev, on top of emu.h (include that first): the one list of the
 * sources for runtime/cuemu_kc.cc, the one object that runs the kernels
 * without a GPU (the emulated runtime's kernels, and those
 * tests/kernels_cuda_test.cc checks).  The order is fsdpc's (common.cuh, fused.h, the .cu
 * files alphabetically, the typed kernels' float and double instances
 * stamped last), as in the device program NVRTC compiles.
 */
#ifndef FSDPC_KC_EMU_KERNELS_H
#define FSDPC_KC_EMU_KERNELS_H

/* the elementwise math (kernels/c), outside the namespace as the cpu kernels see it */
#include "fused.h"

namespace dev {
#include "common.cuh"
#include "attn.cu"
#include "conv.cu"
#include "copy.cu"
#include "ew.cu"
#include "gather.cu"
#include "loss.cu"
#include "norm.cu"
#include "optim.cu"
#include "random.cu"
#include "reduce.cu"
#include "kc_args.h"
#include "stamp.cu"
#include "kernels.def"
#undef KC
#undef KC_TYPED
} // namespace dev

#endif
