# The optional CUDA backend (common/backend/cuda/*.cu). FERRY_CUDA=AUTO builds it when
# nvcc, the CUDA toolkit (cudart, cuBLAS) and cuDNN are all found; ON fails without
# them; OFF keeps the CPU-only build. The kernels form one object library whose
# objects join libferry; only common/tensor/backend.c sees FERRY_CUDA. One GPU
# architecture (CMAKE_CUDA_ARCHITECTURES, default 90) keeps the compile to ~a minute.
set(FERRY_CUDA AUTO CACHE STRING "CUDA backend: AUTO, ON or OFF")
set_property(CACHE FERRY_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${FERRY_CUDA}" _ferry_cuda)
if(NOT _ferry_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FERRY_CUDA must be AUTO, ON or OFF (got '${FERRY_CUDA}')")
endif()

set(FERRY_HAVE_CUDA OFF)
if(NOT _ferry_cuda STREQUAL "OFF")
  # nvcc lives in $CUDA_HOME/bin, often not on PATH; point check_language at it.
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER)
    foreach(_dir "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
      if(_dir AND EXISTS "${_dir}/bin/nvcc")
        set(ENV{CUDACXX} "${_dir}/bin/nvcc")
        break()
      endif()
    endforeach()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(_ferry_cuda_missing "")
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90) # H100/H200; "native" needs a GPU at configure time
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared) # the same libcudart.so that CUDA::cudart names
    enable_language(CUDA)
    set(CMAKE_CUDA_FLAGS_RELEASE "-O2 -DNDEBUG")
    find_package(CUDAToolkit)
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(NOT CUDAToolkit_FOUND)
      set(_ferry_cuda_missing "the CUDA toolkit")
    elseif(NOT CUDNN_LIBRARY OR NOT CUDNN_INCLUDE_DIR)
      set(_ferry_cuda_missing "cuDNN (libcudnn, cudnn.h)")
    endif()
  else()
    set(_ferry_cuda_missing "nvcc")
  endif()
  if(_ferry_cuda_missing STREQUAL "")
    set(FERRY_HAVE_CUDA ON)
  elseif(_ferry_cuda STREQUAL "ON")
    message(FATAL_ERROR "FERRY_CUDA=ON but ${_ferry_cuda_missing} was not found")
  else()
    message(STATUS "CUDA backend: off (${_ferry_cuda_missing} not found)")
  endif()
endif()

# Adds the CUDA backend to the libferry target `lib` (called from common/).
function(ferry_add_cuda_backend lib)
  if(NOT FERRY_HAVE_CUDA)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/common/backend/cuda/*.cu)
  add_library(ferry_cuda OBJECT ${_cu})
  # The project's C flags (-fno-math-errno, sanitizers, -march) are not nvcc flags.
  set_target_properties(ferry_cuda PROPERTIES COMPILE_OPTIONS "" CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
  # --fmad=false: no contraction of a*b+c, so elementwise kernels (the optimizer
  # updates above all) round exactly like the CPU oracle.
  target_compile_options(ferry_cuda PRIVATE --fmad=false -Xcompiler=-Wall,-Wextra)
  if(FERRY_WERROR)
    target_compile_options(ferry_cuda PRIVATE -Werror=all-warnings)
  endif()
  target_include_directories(ferry_cuda PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/common ${PROJECT_SOURCE_DIR}/common/core
    ${PROJECT_SOURCE_DIR}/common/tensor ${CUDNN_INCLUDE_DIR})
  target_link_libraries(ferry_cuda PRIVATE CUDA::cudart CUDA::cublas)
  target_sources(${lib} PRIVATE $<TARGET_OBJECTS:ferry_cuda>)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/common/tensor/backend.c
    TARGET_DIRECTORY ${lib} PROPERTIES COMPILE_DEFINITIONS FERRY_CUDA=1)
  target_link_libraries(${lib} PUBLIC CUDA::cudart CUDA::cublas ${CUDNN_LIBRARY})
  message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${CUDNN_LIBRARY})")
endfunction()
