# All of Keel's build options, in one place.
option(KEEL_BUILD_TESTS "Build the test suite (GoogleTest)" ON)
option(KEEL_BUILD_BENCHMARKS "Build the Google Benchmark microbenchmarks" OFF)
option(KEEL_BUILD_FUZZERS "Build libFuzzer targets (needs clang)" OFF)
# KEEL_SANITIZE: OFF; ON or address (AddressSanitizer + UndefinedBehaviorSanitizer); thread (ThreadSanitizer).
set(KEEL_SANITIZE OFF CACHE STRING "Sanitizers for the whole build: OFF, ON (= address), address, thread")
set_property(CACHE KEEL_SANITIZE PROPERTY STRINGS OFF ON address thread)
option(KEEL_WERROR "Treat warnings as errors" OFF)
set(KEEL_CUDA "AUTO" CACHE STRING "Build the CUDA plugin: AUTO (when /usr/local/cuda exists), ON, OFF")
set_property(CACHE KEEL_CUDA PROPERTY STRINGS AUTO ON OFF)
set(KEEL_CUDA_ARCHITECTURES "90" CACHE STRING "CUDA architectures to build for (sm_90 only keeps CI fast)")

if(NOT KEEL_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "KEEL_CUDA must be AUTO, ON or OFF (got '${KEEL_CUDA}')")
endif()
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "Build type" FORCE)
endif()

find_program(KEEL_CCACHE ccache)
if(KEEL_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${KEEL_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KEEL_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${KEEL_CCACHE})
endif()

add_compile_options(-Wall -Wextra -Wno-unused-parameter)
if(KEEL_WERROR)
  add_compile_options(-Werror)
endif()
string(TOLOWER "${KEEL_SANITIZE}" _keel_sanitize)
if(_keel_sanitize MATCHES "^(on|address)$")
  # One sanitizer per flag: the CUDA plugin hands these to nvcc as -Xcompiler=FLAG, and nvcc splits a FLAG at commas.
  add_compile_options(-fsanitize=address -fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address -fsanitize=undefined)
  # Tests run with UBSAN_OPTIONS=suppressions=tests/ubsan.supp (third-party code only, each entry says why), which
  # keel_add_test and add_test set for every test of this build (cmake/helpers.cmake), as for the TSan build below.
  # Leak checks stay off here (README: LeakSanitizer's tracer was seen to crash in processes running oneDNN's OpenMP threads;
  # leaks are checked by valgrind's c_api_valgrind test of the normal build).
  set(KEEL_SANITIZER_TEST_ENV
      "ASAN_OPTIONS=detect_leaks=0:exitcode=66"
      "UBSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/ubsan.supp:print_stacktrace=1:halt_on_error=1")
elseif(_keel_sanitize STREQUAL "thread")
  # Third-party libraries are not instrumented: tests run with TSAN_OPTIONS=suppressions=tests/tsan.supp (each entry
  # says why), which keel_add_test and add_test set for every test of this build (cmake/helpers.cmake).
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
  # OMP_THREAD_LIMIT=1: GNU OpenMP's barriers are futexes TSan cannot see, so every parallel region (oneDNN's, and
  # the oneDNN plugin's own steps) reads as racing with the code around it; one OpenMP thread removes those false
  # reports (and most of TSan's cost on compute) while Keel's own threads (its pool, concurrent runs, the
  # collectives' and servers' threads) still run concurrently and are checked.
  set(KEEL_SANITIZER_TEST_ENV
      "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/tsan.supp:halt_on_error=0:exitcode=66:second_deadlock_stack=1"
      "OMP_THREAD_LIMIT=1")
elseif(NOT _keel_sanitize MATCHES "^(off|)$")
  message(FATAL_ERROR "KEEL_SANITIZE must be OFF, ON, address or thread (got '${KEEL_SANITIZE}')")
endif()
