# FindCUDNN
# ---------
# Finds cuDNN's graph API (cudnn_graph.h, cuDNN 9 or later) and its library.
#
# Hints: CUDNN_ROOT (CMake or environment variable), CUDNN_INCLUDE_DIR, CUDNN_LIBRARY,
# CUDAToolkit_ROOT / CUDA_HOME. The pip wheel nvidia-cudnn-cu* is searched first, through the
# Python interpreter, because that is where a PyTorch install keeps the cuDNN that LibTorch loads.
#
# Defines CUDNN_FOUND, CUDNN_VERSION and the imported target CUDNN::cudnn.

include(MyriadFindHelpers)
set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} $ENV{CUDNN_PATH} ${CUDAToolkit_ROOT}
    $ENV{CUDA_HOME} $ENV{CUDA_PATH} /usr/local/cuda)
# LibTorch loads the wheel's library: the same one, whatever else is installed.
myriad_wheel_dir(nvidia.cudnn _cudnn_wheel_dir)
list(PREPEND _cudnn_hints ${_cudnn_wheel_dir})

find_path(CUDNN_INCLUDE_DIR cudnn_graph.h HINTS ${_cudnn_hints} PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_cudnn_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
if(CUDNN_INCLUDE_DIR)
  myriad_header_version("${CUDNN_INCLUDE_DIR}/cudnn_version.h" CUDNN CUDNN_VERSION
                        MAJOR MINOR PATCHLEVEL)
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::cudnn)
  add_library(CUDNN::cudnn UNKNOWN IMPORTED)
  set_target_properties(CUDNN::cudnn PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
