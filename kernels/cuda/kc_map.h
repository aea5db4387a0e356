/* kc_map.h — the kernels.h API on the cuda target.
 *
 * Every kernels.h function marked K_TWIN (every one the generated step
 * calls, with float32, float64, bfloat16, float16 or dtype-generic
 * arguments) has a twin in kernels/cuda/launch.c named kc_ instead of k_,
 * with the same parameters and contract (pointers are device pointers).
 * This header defines K_TWIN and includes kernels.h, so that for each
 * marked f kernels.h's own declaration of k_f also declares
 *   kc_f  with k_f's type (launch.c's definition must match it), and
 *   k_f   again, with kc_f's symbol as its assembler name (GCC's and
 *         Clang's asm label), so a call of k_f links to kc_f.
 * The generated step (codegen/exe.c on the cuda target), launch.c and
 * runtime/comm_nccl.c include it before anything else includes kernels.h;
 * the step's k_ calls then launch, and the list of twins is kernels.h's
 * K_TWIN marks alone: the two APIs cannot drift apart.
 *
 * Not twinned (no K_TWIN): k_accum_strided (no emitter calls it), the
 * host helpers kernels.h defines inline or the step never calls
 * (k_pool_out_dim, k_conv2d_workspace, k_philox4x32_10, ...), the scalar
 * 16-bit conversions (tensors convert with k_cast) and the single GEMMs
 * k_gemm_bf16 / k_gemm_widened_16 (the cpu attention's; cuBLASLt has its
 * own).  The cuda executable does not link kernels/c: a step that calls
 * one of those fails to link.
 */
#ifndef FSDPC_KC_MAP_H
#define FSDPC_KC_MAP_H

#ifdef FSDPC_KERNELS_H
#error "include kc_map.h before kernels.h: its K_TWIN marks declare the twins"
#endif

#define K_TWIN(f) extern __typeof__(k_##f) kc_##f; extern __typeof__(k_##f) k_##f __asm__("kc_" #f);

#include "kernels.h"
#include "kc.h"

#endif
