# What the find modules of libraries that a PyTorch install carries (NCCL, cuDNN) share.

# Sets `dir_var` to the folder of the pip wheel that holds Python module `module` (nvidia.nccl,
# nvidia.cudnn), where a Python interpreter on the PATH can import it; else to nothing.
function(myriad_wheel_dir module dir_var)
  set(${dir_var} "" PARENT_SCOPE)
  find_program(MYRIAD_PYTHON NAMES python3 python)
  mark_as_advanced(MYRIAD_PYTHON)
  if(NOT MYRIAD_PYTHON)
    return()
  endif()
  execute_process(
    COMMAND ${MYRIAD_PYTHON} -c "import ${module} as m; print(list(m.__path__)[0])"
    OUTPUT_VARIABLE _wheel_dir
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(${dir_var} "${_wheel_dir}" PARENT_SCOPE)
endfunction()

# Sets `version_var` to "A.B.C" from a header's "#define <prefix>_<part> N" lines, one for each
# of the three `parts` (MAJOR MINOR PATCH), where the header exists and defines them.
function(myriad_header_version header prefix version_var)
  if(NOT EXISTS "${header}")
    return()
  endif()
  string(REPLACE ";" "|" _alternatives "${ARGN}")
  file(STRINGS "${header}" _lines REGEX "^#define ${prefix}_(${_alternatives})[ \t]+[0-9]+")
  set(_numbers)
  foreach(_part ${ARGN})
    string(REGEX MATCH "${prefix}_${_part}[ \t]+([0-9]+)" _m "${_lines}")
    if("${CMAKE_MATCH_1}" STREQUAL "")
      return()
    endif()
    list(APPEND _numbers ${CMAKE_MATCH_1})
  endforeach()
  string(JOIN "." _version ${_numbers})
  set(${version_var} ${_version} PARENT_SCOPE)
endfunction()
