# runtime/cuda.cmake — the cuda target's device layer (included by the top
# CMakeLists after find_package(CUDAToolkit)):
#
#   fsdpc_rt_cuda_dev  dev_cuda.c (rt_dev.h on a GPU), kc_rt.c (the runtime
#                      half of kernels/cuda/kc.h: launches, cuBLASLt GEMM),
#                      comm_nccl.c (rt.h's collectives over NCCL)
#   FSDPC_CUDA_LINK    what a cuda executable links after the runtime core
#                      and kernels/cuda, as one string for the C compiler
#                      line (FSDPC_CUDA_LINK_LIST: the same as a CMake list):
#                      the static CUDA runtime (no libcudart.so needed at run
#                      time), cuBLASLt, NCCL and the system libraries.  Never
#                      libcuda (the driver) and never MPI: the executable
#                      starts anywhere and says why it cannot run.
#   fsdpc_cuemu        the emulation: the same subset of the CUDA runtime
#                      (cuemu_rt.c, cuemu_launch.c, the kernels in
#                      cuemu_kc.cc), cuBLASLt (cuemu_lt.c) and NCCL
#                      (cuemu_nccl.c) on the host, linked in place of the
#                      three libraries; nothing in the device layer knows.
#   tests              cuda_rt_nodriver: the device layer links on its own
#                      (control plane stubbed) and, without a driver, fails
#                      with its one-line reason.  On a GPU the same program
#                      checks GEMMs, collectives at world 1, CUDA Graph
#                      replay and device checks (tests/gpu/run.sh runs it);
#                      cuemu_rt_dev_{graph,eager,check,nccl,nomem} run it here,
#                      linked against fsdpc_cuemu (cuemu_rt_dev_world2/3:
#                      under mpirun, through the emulated NCCL).  cuemu_rt and cuemu_nccl
#                      test the emulation itself.
#                      Not made with -DBUILD_TESTING=OFF.

find_library(FSDPC_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
  PATH_SUFFIXES lib lib64)
find_path(FSDPC_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
if(NOT FSDPC_NCCL_LIBRARY OR NOT FSDPC_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "NCCL (nccl.h and libnccl.so) not found next to the CUDA toolkit "
    "(${CUDAToolkit_LIBRARY_DIR}); set FSDPC_NCCL_LIBRARY and FSDPC_NCCL_INCLUDE_DIR")
endif()
if(NOT CUDA_cudart_static_LIBRARY OR NOT CUDA_cublasLt_LIBRARY)
  message(FATAL_ERROR "the CUDA toolkit in ${CUDAToolkit_LIBRARY_DIR} lacks libcudart_static.a or libcublasLt")
endif()
get_filename_component(_fsdpc_nccl_dir ${FSDPC_NCCL_LIBRARY} DIRECTORY)
get_filename_component(_fsdpc_lt_dir ${CUDA_cublasLt_LIBRARY} DIRECTORY)

set(FSDPC_CUDA_LINK_LIST
  ${CUDA_cudart_static_LIBRARY}
  -L${_fsdpc_lt_dir} -L${_fsdpc_nccl_dir} -lcublasLt -lnccl
  # found there on machines laid out like this one; elsewhere LD_LIBRARY_PATH
  -Wl,-rpath,${_fsdpc_lt_dir} -Wl,-rpath,${_fsdpc_nccl_dir}
  -ldl -lrt -lpthread -lm)
list(REMOVE_DUPLICATES FSDPC_CUDA_LINK_LIST)
string(JOIN " " FSDPC_CUDA_LINK ${FSDPC_CUDA_LINK_LIST})

add_library(fsdpc_rt_cuda_dev STATIC
  ${CMAKE_CURRENT_LIST_DIR}/dev_cuda.c
  ${CMAKE_CURRENT_LIST_DIR}/kc_rt.c
  ${CMAKE_CURRENT_LIST_DIR}/comm_nccl.c)
target_include_directories(fsdpc_rt_cuda_dev PRIVATE
  ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/kernels/cuda ${CMAKE_SOURCE_DIR}/kernels/c
  ${CUDAToolkit_INCLUDE_DIRS} ${FSDPC_NCCL_INCLUDE_DIR})
target_compile_options(fsdpc_rt_cuda_dev PRIVATE ${FSDPC_WARN})
set_target_properties(fsdpc_rt_cuda_dev PROPERTIES POSITION_INDEPENDENT_CODE ON)

# the device layer against a stubbed control plane (tests/gpu/rt_dev_test.c); not with -DBUILD_TESTING=OFF
if(BUILD_TESTING)
  add_executable(cuda_rt_dev_test ${CMAKE_SOURCE_DIR}/tests/gpu/rt_dev_test.c)
  target_include_directories(cuda_rt_dev_test PRIVATE
    ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/kernels/cuda ${CMAKE_SOURCE_DIR}/kernels/c
    ${CUDAToolkit_INCLUDE_DIRS} ${FSDPC_NCCL_INCLUDE_DIR})
  target_compile_options(cuda_rt_dev_test PRIVATE ${FSDPC_WARN})
  target_link_libraries(cuda_rt_dev_test PRIVATE fsdpc_rt_cuda_dev fsdpc_kernels_cuda ${FSDPC_CUDA_LINK_LIST})
  # exit 77: a GPU is present, so the no-driver path cannot be checked here
  add_test(NAME cuda_rt_nodriver COMMAND cuda_rt_dev_test nodriver)
  set_tests_properties(cuda_rt_nodriver PROPERTIES SKIP_RETURN_CODE 77)
endif()

# fsdpc_cuemu: the same subset of the CUDA runtime on the host (runtime/cuemu_rt.c; kernels: cuemu_launch.c
# and cuemu_kc.cc, kernels/cuda compiled as C++ on kernels/cuda/emu.h), of cuBLASLt (cuemu_lt.c) and of NCCL
# (cuemu_nccl.c), compiled against the toolkit's headers and linked in place of libcudart_static, libcublasLt
# and libnccl, so the device layer's object code runs without a GPU
find_package(Threads REQUIRED)
enable_language(CXX)
add_library(fsdpc_cuemu STATIC ${CMAKE_CURRENT_LIST_DIR}/cuemu_rt.c ${CMAKE_CURRENT_LIST_DIR}/cuemu_queue.c
  ${CMAKE_CURRENT_LIST_DIR}/cuemu_graph.c ${CMAKE_CURRENT_LIST_DIR}/cuemu_launch.c
  $<TARGET_OBJECTS:fsdpc_cuemu_kc> ${CMAKE_CURRENT_LIST_DIR}/cuemu_lt.c ${CMAKE_CURRENT_LIST_DIR}/cuemu_nccl.c)
target_include_directories(fsdpc_cuemu PUBLIC ${CMAKE_CURRENT_LIST_DIR} ${CUDAToolkit_INCLUDE_DIRS}
  ${FSDPC_NCCL_INCLUDE_DIR})
# the kernels (cuemu_kc.cc): the object library fsdpc_cuemu_kc (kernels/cuda/cuda.cmake), on kernels/cuda's sources
# and emu.h, not the CUDA headers (emu.h has its own dim3)
target_compile_options(fsdpc_cuemu PRIVATE ${FSDPC_WARN})
target_link_libraries(fsdpc_cuemu PUBLIC Threads::Threads m rt)
set_target_properties(fsdpc_cuemu PROPERTIES POSITION_INDEPENDENT_CODE ON)
if(BUILD_TESTING)
  add_executable(cuemu_test ${CMAKE_SOURCE_DIR}/tests/cuemu_test.c)
  target_compile_options(cuemu_test PRIVATE ${FSDPC_WARN})
  target_link_libraries(cuemu_test PRIVATE fsdpc_cuemu)
  add_test(NAME cuemu_rt COMMAND cuemu_test)
  set_tests_properties(cuemu_rt PROPERTIES LABELS san TIMEOUT 120)
  add_executable(cuemu_nccl_test ${CMAKE_SOURCE_DIR}/tests/cuemu_nccl_test.c)
  target_compile_options(cuemu_nccl_test PRIVATE ${FSDPC_WARN})
  target_link_libraries(cuemu_nccl_test PRIVATE fsdpc_cuemu)
  add_test(NAME cuemu_nccl COMMAND cuemu_nccl_test)
  set_tests_properties(cuemu_nccl PROPERTIES LABELS san TIMEOUT 300)
  # the device layer's own test (the same libfsdpc_rt_cuda_dev.a objects) against the emulation: GEMMs against a
  # double reference, world-1 collectives (and through a one-rank communicator), graph replay, eager, checks
  add_executable(cuemu_rt_dev_test ${CMAKE_SOURCE_DIR}/tests/gpu/rt_dev_test.c)
  target_compile_definitions(cuemu_rt_dev_test PRIVATE FSDPC_CUEMU)
  target_include_directories(cuemu_rt_dev_test PRIVATE
    ${CMAKE_SOURCE_DIR}/runtime ${CMAKE_SOURCE_DIR}/kernels/cuda ${CMAKE_SOURCE_DIR}/kernels/c)
  target_compile_options(cuemu_rt_dev_test PRIVATE ${FSDPC_WARN})
  target_link_libraries(cuemu_rt_dev_test PRIVATE fsdpc_rt_cuda_dev fsdpc_kernels_cuda fsdpc_cuemu)
  foreach(mode graph eager check)
    add_test(NAME cuemu_rt_dev_${mode} COMMAND cuemu_rt_dev_test ${mode})
    set_tests_properties(cuemu_rt_dev_${mode} PROPERTIES LABELS san TIMEOUT 300)
  endforeach()
  add_test(NAME cuemu_rt_dev_nccl COMMAND cuemu_rt_dev_test graph)
  set_tests_properties(cuemu_rt_dev_nccl PROPERTIES LABELS san TIMEOUT 300 ENVIRONMENT "FSDPC_NCCL_ALWAYS=1")
  # the same at world 2 and 3 under mpirun (separate processes, FULL_SHARD through the emulated NCCL)
  find_program(FSDPC_MPIRUN mpirun)
  if(FSDPC_MPIRUN)
    foreach(n 2 3)
      add_test(NAME cuemu_rt_dev_world${n} COMMAND ${FSDPC_MPIRUN} --oversubscribe -np ${n} $<TARGET_FILE:cuemu_rt_dev_test>
        world)
      set_tests_properties(cuemu_rt_dev_world${n} PROPERTIES LABELS san TIMEOUT 300
        ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;ASAN_OPTIONS=detect_leaks=0")
    endforeach()
  endif()
  # too little device memory: rt_dev_init's one line (400 MiB, 300 of them the emulated context's)
  add_test(NAME cuemu_rt_dev_nomem COMMAND cuemu_rt_dev_test graph)
  set_tests_properties(cuemu_rt_dev_nomem PROPERTIES LABELS san TIMEOUT 60 ENVIRONMENT "FSDPC_CUEMU_MEM_MIB=400"
    PASS_REGULAR_EXPRESSION "rt_dev_init: needs [0-9.]+ GiB of device memory .* has [0-9.]+ GiB free of 0.39 GiB: use more ranks or a smaller --dim batch")
endif()
