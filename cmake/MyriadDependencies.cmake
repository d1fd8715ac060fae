# Finds every dependency and decides which optional parts (CUDA kernels, NCCL) are built.

# LibTorch: Debian's CPU libtorch-dev, or the CUDA build inside an installed PyTorch
# (Torch_DIR from torch.utils.cmake_prefix_path; scripts/setup.sh passes it).
if(NOT CMAKE_CUDA_ARCHITECTURES)
  # Torch's CUDA config otherwise probes the GPUs of the build machine.
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
find_package(Torch REQUIRED)

# LibTorch 2.13 and later refuse to compile below C++20.
if(Torch_VERSION VERSION_GREATER_EQUAL 2.13)
  set(MYRIAD_CXX_STANDARD 20)
else()
  set(MYRIAD_CXX_STANDARD 17)
endif()

find_package(HDF5 REQUIRED COMPONENTS C)
find_package(nlohmann_json 3.9 REQUIRED)
find_package(TurboJPEG REQUIRED)
find_package(PNG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(Threads REQUIRED)

# Every myriad target compiles with the same flags, so that all of them can share one
# precompiled <torch/torch.h>. Without it (MYRIAD_PCH=OFF, a CI build) every file must include
# what it uses: the header hides missing includes that other LibTorch versions do not provide.
# LibTorch, MPI and HDF5 come in as imported targets, whose include directories are SYSTEM, so
# MYRIAD_WERROR applies to myriad's own code only.
function(myriad_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter
      -fmacro-prefix-map=${PROJECT_SOURCE_DIR}/=>)
  if(MYRIAD_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(MYRIAD_PCH)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Winvalid-pch>)
    if(NOT target STREQUAL "myriad_pch")
      target_precompile_headers(${target} REUSE_FROM myriad_pch)
    endif()
  endif()
endfunction()

if(MYRIAD_FUZZ)
  # The harnesses need the readers of outside files only (src/CMakeLists.txt, myriad_formats),
  # instrumented with clang's fuzzer, address and undefined-behaviour sanitizers.
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "MYRIAD_FUZZ needs clang (CXX=clang++); scripts/fuzz.sh sets it")
  endif()
  set(MYRIAD_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g)
  set(MYRIAD_WITH_CUDA OFF)
  set(MYRIAD_CUDNN_GRAPH OFF)
  set(MYRIAD_NCCL_ENABLED OFF)
  set(MYRIAD_PCH OFF)
else()
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI REQUIRED COMPONENTS CXX)
  find_package(Boost 1.71 REQUIRED COMPONENTS program_options)

  set(MYRIAD_WITH_CUDA OFF)
  set(MYRIAD_CUDNN_GRAPH OFF)
  if(TARGET torch_cuda)
    set(MYRIAD_WITH_CUDA ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # cuDNN's graph API forms batch norm's statistics in the convolutions' epilogues; without it
    # the batch norms read their inputs once more for them.
    find_package(CUDNN 9)
    set(MYRIAD_CUDNN_GRAPH ${CUDNN_FOUND})
  endif()

  set(MYRIAD_NCCL_ENABLED OFF)
  if(MYRIAD_WITH_NCCL STREQUAL "ON" OR (MYRIAD_WITH_NCCL STREQUAL "AUTO" AND MYRIAD_WITH_CUDA))
    if(NOT MYRIAD_WITH_CUDA)
      message(FATAL_ERROR "MYRIAD_WITH_NCCL=ON needs a LibTorch built with CUDA; this one is CPU-only")
    endif()
    if(MYRIAD_WITH_NCCL STREQUAL "ON")
      find_package(NCCL 2.12 REQUIRED)
    else()
      find_package(NCCL 2.12)
    endif()
    set(MYRIAD_NCCL_ENABLED ${NCCL_FOUND})
  endif()

  if(MYRIAD_BUILD_TESTS)
    find_package(GTest REQUIRED)
  endif()
endif()
