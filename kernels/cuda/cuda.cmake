# kernels/cuda: the cuda target's kernels (see kc.h).
#
# FSDPC_CUDA_SOURCES: the device sources in the order fsdpc hands them to
# NVRTC (common.cuh, the header, then fused.h, then the .cu files alphabetically, then
# kc_args.h, stamp.cu and kernels.def, which stamp the typed kernels' instances); the
# compiler embeds them (tests/nvrtc_compile, a developer's tool, compiles them as it does).
# fsdpc_kernels_cuda: the host launchers (launch.c), linked into cuda
# executables; kc_launch, kc_gemm_f32 and the rest of kc.h's runtime side
# come from the cuda runtime (or, in tests, the emulator), so no CUDA
# library is linked here.
set(_kc ${CMAKE_CURRENT_LIST_DIR})
set(FSDPC_CUDA_SOURCES
  ${_kc}/common.cuh
  # second: the elementwise math (shared with the cpu kernels and the fused loops of both targets)
  ${_kc}/../c/fused.h
  ${_kc}/attn.cu ${_kc}/conv.cu ${_kc}/copy.cu ${_kc}/ew.cu ${_kc}/gather.cu ${_kc}/loss.cu
  ${_kc}/norm.cu ${_kc}/optim.cu ${_kc}/random.cu ${_kc}/reduce.cu
  ${_kc}/kc_args.h ${_kc}/stamp.cu ${_kc}/kernels.def)
add_library(fsdpc_kernels_cuda STATIC ${_kc}/launch.c)
target_include_directories(fsdpc_kernels_cuda PUBLIC ${_kc} ${CMAKE_CURRENT_LIST_DIR}/../c)
target_compile_options(fsdpc_kernels_cuda PRIVATE ${FSDPC_WARN})
set_target_properties(fsdpc_kernels_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON)
# fsdpc_cuemu_kc: kernels.def's kernels compiled for the host (runtime/cuemu_kc.cc, on emu.h), one object for the
# two that run them without a GPU: the emulated runtime (fsdpc_cuemu, runtime/cuda.cmake) and kernels_cuda_test
# (compiled once, not once in each: ~12 CPU s of the Release build, twice that under the sanitizers; that test's
# file was the last object of both builds).  No CUDA header needed.  Built only for a target that links it
# (EXCLUDE_FROM_ALL): without the toolkit and with -DBUILD_TESTING=OFF nothing does.
enable_language(CXX)
add_library(fsdpc_cuemu_kc OBJECT EXCLUDE_FROM_ALL ${_kc}/../../runtime/cuemu_kc.cc)
target_include_directories(fsdpc_cuemu_kc PRIVATE ${_kc} ${_kc}/../c ${_kc}/../../runtime)
target_compile_options(fsdpc_cuemu_kc PRIVATE ${FSDPC_WARN} -Wno-unknown-pragmas)
set_target_properties(fsdpc_cuemu_kc PROPERTIES CXX_STANDARD 20 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
  POSITION_INDEPENDENT_CODE ON)
