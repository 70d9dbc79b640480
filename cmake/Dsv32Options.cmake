# Compile options shared by every target of ours, through one interface target.
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(CMAKE_CXX_EXTENSIONS OFF)  # -std=c++20: GCC then does not contract a*b+c into FMA on its own.
set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()

# dsv32_options_common: everything but the instruction set; dsv32::options adds -march=native.
# The oracle's bits do not depend on the instruction set (docs/DETERMINISM.md): the tests build
# the oracle again for other x86-64 levels (tests/CMakeLists.txt) on top of the common options.
add_library(dsv32_options_common INTERFACE)
target_compile_options(dsv32_options_common INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>
  # No compiler-formed FMAs: results must not depend on the optimisation level (goldens).
  # -fno-trapping-math changes no value (nothing here reads the FP exception flags) and lets
  # loops that narrow to fp32 vectorize (the emulated mode's bf16 stores; docs/DETERMINISM.md).
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off -fno-trapping-math>
  # GCC 12 false positives: std::string concatenation (PR 105651), and AVX-512 intrinsics
  # inlined from Eigen (maybe-uninitialized inside avx512fintrin.h).
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-restrict -Wno-maybe-uninitialized>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DSV32_WARNINGS_AS_ERRORS}>>:-Werror>)
if(DSV32_SANITIZE)
  target_compile_options(dsv32_options_common INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DSV32_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all>
    # GCC 12's own `__m512d __Y = __Y;` in avx512fintrin.h trips -Wuninitialized under ASan.
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-uninitialized>)
  target_link_options(dsv32_options_common INTERFACE -fsanitize=${DSV32_SANITIZE})
endif()

add_library(dsv32_options INTERFACE)
add_library(dsv32::options ALIAS dsv32_options)
target_link_libraries(dsv32_options INTERFACE dsv32_options_common)
target_compile_options(dsv32_options INTERFACE
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DSV32_NATIVE_ARCH}>>:-march=native>)
