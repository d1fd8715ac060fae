# FindNCCL
# --------
# Finds the NVIDIA Collective Communications Library.
#
# Hints: NCCL_ROOT (CMake or environment variable), NCCL_INCLUDE_DIR, NCCL_LIBRARY,
# CUDAToolkit_ROOT / CUDA_HOME. The pip wheel nvidia-nccl-cu* is searched through the Python
# interpreter when one is on the PATH, because that is where a PyTorch install keeps its NCCL.
#
# Defines NCCL_FOUND, NCCL_VERSION, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES and the imported
# target NCCL::NCCL.

include(MyriadFindHelpers)
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_ROOT} $ENV{CUDA_HOME}
    $ENV{CUDA_PATH} /usr/local/cuda)
myriad_wheel_dir(nvidia.nccl _nccl_wheel_dir)
list(APPEND _nccl_hints ${_nccl_wheel_dir})

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(NCCL_INCLUDE_DIR)
  myriad_header_version("${NCCL_INCLUDE_DIR}/nccl.h" NCCL NCCL_VERSION MAJOR MINOR PATCH)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS ${NCCL_INCLUDE_DIR})
  set(NCCL_LIBRARIES ${NCCL_LIBRARY})
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
