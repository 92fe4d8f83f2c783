# overlap_find_cublaslt(): sets CUBLASLT_INCLUDE_DIR and CUBLASLT_LIBRARY.
#
# Search order:
#   1. OVERLAP_CUBLAS_ROOT (cache variable or environment variable of the same name);
#   2. the `nvidia-cublas` pip package of the build's Python (nvidia/cu13, nvidia/cublas), which
#      is the cuBLAS that PyTorch loads on the GPU machines;
#   3. the CUDA toolkit next to nvcc.
function(overlap_find_cublaslt)
  set(_hints "")
  if(OVERLAP_CUBLAS_ROOT)
    list(APPEND _hints "${OVERLAP_CUBLAS_ROOT}")
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import importlib.util as u; s = u.find_spec('nvidia'); print(';'.join(s.submodule_search_locations) if s else '')"
    OUTPUT_VARIABLE _nvidia_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(_d IN LISTS _nvidia_dirs)
    list(APPEND _hints "${_d}/cu13" "${_d}/cublas")
  endforeach()
  get_filename_component(_nvcc_dir "${CMAKE_CUDA_COMPILER}" REALPATH)
  get_filename_component(_nvcc_dir "${_nvcc_dir}" DIRECTORY)
  list(APPEND _hints "${_nvcc_dir}/.." "/usr/local/cuda")

  find_path(CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
  # NAMES_PER_DIR: the first hint directory holding any of the names wins (pip before toolkit).
  find_library(CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12 NAMES_PER_DIR
    HINTS ${_hints} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  set(CUBLASLT_INCLUDE_DIR "${CUBLASLT_INCLUDE_DIR}" PARENT_SCOPE)
  set(CUBLASLT_LIBRARY "${CUBLASLT_LIBRARY}" PARENT_SCOPE)
endfunction()
