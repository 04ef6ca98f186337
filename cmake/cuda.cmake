# The optional CUDA backend (common/backend/cuda/*.cu). FERRY_CUDA=AUTO builds it when
# nvcc, the CUDA toolkit (cudart, cuBLAS) and cuDNN are all found; ON fails without
# them; OFF keeps the CPU-only build. The kernels form one object library whose
# objects form libferry-cuda, a library of its own (see ferry_add_cuda_backend). One GPU
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

# libferry-cuda: the kernels, cuBLAS/cuDNN glue and ferry_cuda_register (include/ferry/cuda.h)
# as a library of its own, so that libferry itself never links a CUDA library. Programs
# that want GPUs link it besides libferry (ferry_link_cuda below for in-tree ones).
function(ferry_add_cuda_backend)
  if(NOT FERRY_HAVE_CUDA)
    return()
  endif()
  file(GLOB _cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/common/backend/cuda/*.cu)
  add_library(ferry_cuda_kernels OBJECT ${_cu})
  # The project's C flags (-fno-math-errno, sanitizers, -march) are not nvcc flags.
  set_target_properties(ferry_cuda_kernels PROPERTIES COMPILE_OPTIONS "" CUDA_STANDARD 17
    CUDA_STANDARD_REQUIRED ON POSITION_INDEPENDENT_CODE ON)
  # --fmad=false: no contraction of a*b+c, so elementwise kernels (the optimizer
  # updates above all) round exactly like the CPU oracle.
  target_compile_options(ferry_cuda_kernels PRIVATE --fmad=false -Xcompiler=-Wall,-Wextra)
  if(FERRY_WERROR)
    target_compile_options(ferry_cuda_kernels PRIVATE -Werror=all-warnings)
  endif()
  target_include_directories(ferry_cuda_kernels PRIVATE
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR} ${CUDNN_INCLUDE_DIR})
  add_library(ferry_cuda STATIC $<TARGET_OBJECTS:ferry_cuda_kernels>
    ${PROJECT_SOURCE_DIR}/common/backend/cuda/register.c)
  set_target_properties(ferry_cuda PROPERTIES OUTPUT_NAME ferry-cuda EXPORT_NAME ferry-cuda
    POSITION_INDEPENDENT_CODE ON)
  target_include_directories(ferry_cuda PRIVATE ${PROJECT_SOURCE_DIR}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # It calls into libferry (the registry, errors): whoever links it links libferry too.
  target_link_libraries(ferry_cuda PUBLIC ferry_static CUDA::cudart CUDA::cublas ${CUDNN_LIBRARY}
    PRIVATE $<BUILD_INTERFACE:ferry_warnings>)
  add_library(ferry::ferry-cuda ALIAS ferry_cuda)
  message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm_${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${CUDNN_LIBRARY})")
endfunction()

# Links libferry-cuda into an in-tree program and defines FERRY_WITH_CUDA for it (its
# main then calls ferry_cuda_register); a no-op in a CPU-only build.
function(ferry_link_cuda target)
  if(TARGET ferry_cuda)
    target_link_libraries(${target} PRIVATE ferry_cuda)
    target_compile_definitions(${target} PRIVATE FERRY_WITH_CUDA=1)
  endif()
endfunction()
