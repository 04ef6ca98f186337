# ggml's GGML_ALL_WARNINGS set, applied to every ferry target through ferry_warnings.
add_library(ferry_warnings INTERFACE)
target_compile_options(ferry_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes
  -Wpointer-arith -Wcast-qual -Wdouble-promotion -Werror=implicit-function-declaration)
if(FERRY_WERROR)
  target_compile_options(ferry_warnings INTERFACE -Werror)
endif()
if(FERRY_NATIVE AND NOT FERRY_SANITIZE)
  target_compile_options(ferry_warnings INTERFACE -march=native)
else()
  # Portable: the hot loops in two versions, AVX2+FMA and baseline (common/core/simd.h).
  target_compile_definitions(ferry_warnings INTERFACE FERRY_SIMD_CLONES)
endif()
