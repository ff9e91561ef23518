# Shared CMake helpers for Loom targets.

# Warnings and sanitizer flags every Loom target gets.
function(loom_target_defaults target)
  target_compile_options(${target} PRIVATE -Wall -Wextra)
  if(LOOM_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# Debug information in optimised builds (RelWithDebInfo, the default): "lines" (-g1: function
# names and file:line, what backtraces, profilers and sanitizer reports need), "full" (-g:
# variables and types too, for a debugger), or "default" (whatever CMAKE_CXX_FLAGS_RELWITHDEBINFO
# says). Full debug info is a third of the compile time: on the 2-core VM loom-trace's main.cc
# takes 29 s with -g, 24 s with -g1 and 19 s with none, and the whole build is most of CI's time.
set(LOOM_DEBUG_INFO lines CACHE STRING "Debug info in RelWithDebInfo builds: lines (-g1), full (-g), default")
set_property(CACHE LOOM_DEBUG_INFO PROPERTY STRINGS lines full default)
if(LOOM_DEBUG_INFO STREQUAL "lines")
  add_compile_options($<$<CONFIG:RelWithDebInfo>:-g1>)
elseif(LOOM_DEBUG_INFO STREQUAL "full")
  add_compile_options($<$<CONFIG:RelWithDebInfo>:-g>)
elseif(NOT LOOM_DEBUG_INFO STREQUAL "default")
  message(FATAL_ERROR "LOOM_DEBUG_INFO must be lines, full or default, got '${LOOM_DEBUG_INFO}'")
endif()

if(LOOM_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address)
elseif(LOOM_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread)
  add_link_options(-fsanitize=thread)
elseif(LOOM_SANITIZE STREQUAL "undefined")
  add_compile_options(-fsanitize=undefined -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=undefined)
elseif(LOOM_SANITIZE STREQUAL "fuzzer")
  # The libFuzzer build (tests/fuzz, docs/fuzz.md; tests/fuzz/run.sh makes it in build-fuzz):
  # clang only; every object is instrumented for coverage, AddressSanitizer and
  # UndefinedBehaviorSanitizer (any undefined behaviour aborts, so the fuzzer reports it).
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "LOOM_SANITIZE=fuzzer needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
elseif(NOT LOOM_SANITIZE STREQUAL "")
  message(FATAL_ERROR "LOOM_SANITIZE must be address, thread, undefined, fuzzer or empty, got '${LOOM_SANITIZE}'")
endif()

# Test code (the test files, not the libraries they test) in optimised builds compiles at
# LOOM_TEST_OPT_FLAGS, -O1 by default: test bodies are assertions and setup, and -O1 takes a
# third off their compile time against -O2 (transport_test.cc: 2.3 s -> 1.55 s) while the code
# under test keeps the build type's flags. Empty keeps the build type's flags for tests too.
set(LOOM_TEST_OPT_FLAGS "-O1" CACHE STRING "Extra flags for test files in Release/RelWithDebInfo builds (empty: none)")
function(loom_test_compile_defaults target)
  loom_target_defaults(${target})
  if(LOOM_TEST_OPT_FLAGS)
    target_compile_options(${target} PRIVATE
      "$<$<CONFIG:Release,RelWithDebInfo>:${LOOM_TEST_OPT_FLAGS}>")
  endif()
endfunction()

# What every test binary gets (loom_add_test, and the MPI tests' own function): the test files'
# flags, the shared precompiled header (LOOM_TEST_PCH) and, under TSan, the suppressions.
function(loom_test_binary_defaults target)
  if(LOOM_SANITIZE STREQUAL "thread")
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/tsan_suppressions.cc)
  elseif(LOOM_SANITIZE STREQUAL "address")
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/asan_options.cc)
  endif()
  loom_test_compile_defaults(${target})
  if(LOOM_TEST_PCH)
    target_precompile_headers(${target} REUSE_FROM loom_test_pch)
  endif()
endfunction()

# ctest's time limits in sanitizer builds: every TIMEOUT a test sets is multiplied by
# LOOM_TEST_TIMEOUT_SCALE, which defaults to 4 under ThreadSanitizer and 2 under AddressSanitizer
# and UndefinedBehaviorSanitizer (the code under test runs 2-15x slower there; under TSan the
# reproducible-sum sweep takes 180 s against its 120 s). The limits are outer guards: every test
# has its own deadlines inside, which do not scale.
if(NOT DEFINED LOOM_TEST_TIMEOUT_SCALE)
  if(LOOM_SANITIZE STREQUAL "thread")
    set(LOOM_TEST_TIMEOUT_SCALE 4)
  elseif(LOOM_SANITIZE STREQUAL "address" OR LOOM_SANITIZE STREQUAL "undefined")
    set(LOOM_TEST_TIMEOUT_SCALE 2)
  else()
    set(LOOM_TEST_TIMEOUT_SCALE 1)
  endif()
endif()
if(NOT LOOM_TEST_TIMEOUT_SCALE MATCHES "^[1-9][0-9]*$")
  message(FATAL_ERROR "LOOM_TEST_TIMEOUT_SCALE must be a positive integer, got '${LOOM_TEST_TIMEOUT_SCALE}'")
endif()
# The environment of tests that run Open MPI (the mpi tests, bench_programs_test): under
# AddressSanitizer, LeakSanitizer suppresses Open MPI's own allocations by library, which needs
# whole stacks and Open MPI's components kept loaded (tests/support/lsan_open_mpi.supp). ASan
# reads ASAN_OPTIONS after the binary's own defaults (asan_options.cc), which stay in force.
set(LOOM_TEST_OPEN_MPI_ENV "")
if(LOOM_SANITIZE STREQUAL "address")
  set(LOOM_TEST_OPEN_MPI_ENV
      "ASAN_OPTIONS=fast_unwind_on_malloc=0"
      "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan_open_mpi.supp"
      "OMPI_MCA_mca_base_component_disable_dlclose=1"
      "PMIX_MCA_mca_base_component_disable_dlclose=1")
endif()
# loom_add_noise_test(TEST shm_roots_test TIMEOUT 120): TEST's binary again, under schedule noise
# (LOOM_SCHEDULE_NOISE_US=10000: random sleeps of up to 10 ms where ranks and threads race,
# docs/architecture.md), as TEST_noise with the label "noise".
function(loom_add_noise_test)
  cmake_parse_arguments(ARG "" "TEST;TIMEOUT" "" ${ARGN})
  add_test(NAME ${ARG_TEST}_noise COMMAND ${ARG_TEST})
  loom_test_timeout(timeout ${ARG_TIMEOUT})
  set_tests_properties(${ARG_TEST}_noise PROPERTIES LABELS noise TIMEOUT ${timeout}
    ENVIRONMENT LOOM_SCHEDULE_NOISE_US=10000)
endfunction()

# loom_add_skipped_test(NAME LABEL REASON): a ctest NAME that only prints "skipped: REASON" and
# counts as skipped (a suite that cannot run here, and why: scripts/lib/skip_reasons.sh prints it).
function(loom_add_skipped_test name label reason)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -E echo "skipped: ${reason}")
  set_tests_properties(${name} PROPERTIES LABELS ${label} TIMEOUT 10
                       SKIP_REGULAR_EXPRESSION "skipped:")
endfunction()

# loom_test_timeout(OUT SECONDS): SECONDS scaled for this build, in OUT.
function(loom_test_timeout out seconds)
  math(EXPR scaled "${seconds} * ${LOOM_TEST_TIMEOUT_SCALE}")
  set(${out} ${scaled} PARENT_SCOPE)
endfunction()

# loom_add_library(NAME loom_store FOLDER store SOURCES ... DEPS ... [PRIVATE_DEPS ...])
# A layer library with public headers in FOLDER/include and an exported loom:: alias.
function(loom_add_library)
  cmake_parse_arguments(ARG "" "NAME;EXPORT_NAME" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${ARG_NAME} ${ARG_SOURCES})
  if(NOT ARG_EXPORT_NAME)
    string(REPLACE "loom_" "" ARG_EXPORT_NAME ${ARG_NAME})
  endif()
  add_library(loom::${ARG_EXPORT_NAME} ALIAS ${ARG_NAME})
  set_target_properties(${ARG_NAME} PROPERTIES EXPORT_NAME ${ARG_EXPORT_NAME})
  target_include_directories(${ARG_NAME} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  loom_target_defaults(${ARG_NAME})
  install(TARGETS ${ARG_NAME} EXPORT loomTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endfunction()

# loom_add_program(NAME loom-store SOURCES ... DEPS ...): a program in build/bin, installed.
function(loom_add_program)
  cmake_parse_arguments(ARG "NO_INSTALL" "NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  loom_target_defaults(${ARG_NAME})
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${ARG_NAME} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endfunction()

# loom_add_test(NAME store_test SOURCES ... DEPS ... LABELS unit TIMEOUT 60)
# A GoogleTest binary registered with ctest as one test per binary (so forked ranks never run
# inside a gtest_discover_tests listing step), with its own label and timeout.
function(loom_add_test)
  cmake_parse_arguments(ARG "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} loom_test_support GTest::gtest GTest::gmock)
  loom_test_binary_defaults(${ARG_NAME})
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  loom_test_timeout(ARG_TIMEOUT ${ARG_TIMEOUT})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME} ${ARG_ARGS})
  set_tests_properties(${ARG_NAME} PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()

# Adds every direct sub-folder of DIR that has a CMakeLists.txt, so that independent units
# (one program, one test group) never edit a shared list.
function(loom_add_subdirs dir)
  if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    return()
  endif()
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir}/CMakeLists.txt)
    add_subdirectory(${PROJECT_SOURCE_DIR}/${dir})
    return()
  endif()
  file(GLOB children RELATIVE ${PROJECT_SOURCE_DIR}/${dir} ${PROJECT_SOURCE_DIR}/${dir}/*)
  list(SORT children)
  foreach(child ${children})
    if(EXISTS ${PROJECT_SOURCE_DIR}/${dir}/${child}/CMakeLists.txt)
      add_subdirectory(${PROJECT_SOURCE_DIR}/${dir}/${child})
    endif()
  endforeach()
endfunction()
