# Resolves the optional PyTorch backend (python/): the torch that LOOM_PYTHON imports, either
# Debian's (python3-torch and libtorch-dev: headers in /usr/include) or a wheel from PyPI in a
# virtual environment (headers, libraries and pybind11 inside its torch/ directory), plus
# pybind11-dev for pybind11_add_module. Sets LOOM_HAVE_TORCH, LOOM_PYTHON (the interpreter that
# imports torch), LOOM_TORCH_VERSION and the imported target loom_torch_deps.
#
# The interpreter is LOOM_PYTHON when given (a venv's bin/python works: -DLOOM_PYTHON=
# /work/venv-t215/bin/python builds against its torch 2.x), else, under scikit-build-core (pip
# install, docs/torch.md), the interpreter pip runs, else the first of /usr/bin/python3 (Debian's,
# which python3-torch installs into) and the python3 on PATH that imports torch. Switching
# LOOM_PYTHON in an existing build directory re-resolves everything below.
#
# A second torch: LOOM_TORCH2_PYTHON names another interpreter (scripts/test.sh passes the one
# scripts/setup_torch.sh installs torch 2.x into). Its module is built beside the first, from
# the same Loom libraries, into <build>/python-torch2 (target loom_torch2), and ctest runs the
# pytest suite under it (python_torch2_test). Sets LOOM_HAVE_TORCH2, LOOM_TORCH2_VERSION and
# loom_torch2_deps. Both interpreters must be the same Python version (one pybind11 module
# build). LOOM_TORCH2_SKIP_REASON, when set instead, is what python_torch2_test prints as
# skipped (scripts/test.sh: "PyPI unreachable"). LOOM_TORCH_MORE_PYTHONS adds more torches the
# same way, each in <build>/python-torch-<version> with its ctest python_torch_<version>_test
# (below, "More torches").

# loom_torch_probe(PYTHON TARGET): resolves the torch that PYTHON imports. On success creates the
# INTERFACE target TARGET (torch's headers, libraries and libstdc++ ABI) and sets, in the
# caller's scope, TARGET_VERSION, TARGET_ABI and TARGET_WHY (empty); else only TARGET_WHY.
function(loom_torch_probe py tgt)
  set(${tgt}_WHY "" PARENT_SCOPE)
  execute_process(
    COMMAND "${py}" -c "import os, sys, torch; print(torch.__version__.split('+')[0], int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.distributed.is_available(), os.path.dirname(torch.__file__), '%d.%d' % sys.version_info[:2], *(getattr(torch._C, '_PYBIND11_' + k, None) or '-' for k in ('COMPILER_TYPE', 'STDLIB', 'BUILD_ABI')), sep=';')"
    OUTPUT_VARIABLE out ERROR_QUIET RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    set(${tgt}_WHY "${py} does not import torch" PARENT_SCOPE)
    return()
  endif()
  list(GET out 0 version)
  list(GET out 1 abi)
  list(GET out 2 dist)
  list(GET out 3 dir)
  list(GET out 4 pyver)
  list(GET out 5 pybind_compiler)
  list(GET out 6 pybind_stdlib)
  list(GET out 7 pybind_abi)
  set(${tgt}_PY_VERSION "${pyver}" PARENT_SCOPE)
  if(NOT dist STREQUAL "True")
    set(${tgt}_WHY "torch ${version} was built without torch.distributed" PARENT_SCOPE)
    return()
  endif()
  # A wheel carries its headers and libraries in torch/include and torch/lib (and its own
  # pybind11, which must be the one the module is compiled with: pybind11 shares types between
  # modules only within one ABI version); Debian's torch has them in the system's paths.
  # NO_CACHE: the answer follows the interpreter, also when it changes in an existing build.
  set(wheel OFF)
  if(EXISTS "${dir}/include/torch/csrc/distributed/c10d/ProcessGroup.hpp")
    set(wheel ON)
    set(hints HINTS "${dir}/include" NO_DEFAULT_PATH)
    set(lib_hints HINTS "${dir}/lib" NO_DEFAULT_PATH)
  else()
    set(hints "")
    set(lib_hints "")
  endif()
  find_path(inc torch/csrc/distributed/c10d/ProcessGroup.hpp ${hints} NO_CACHE)
  find_path(api_inc torch/all.h PATHS ${inc}/torch/csrc/api/include NO_DEFAULT_PATH NO_CACHE)
  if(NOT inc OR NOT api_inc)
    set(${tgt}_WHY "torch headers not found (install libtorch-dev)" PARENT_SCOPE)
    return()
  endif()
  set(libs "")
  foreach(name torch torch_cpu c10 torch_python)
    find_library(lib_${name} ${name} ${lib_hints} NO_CACHE)
    if(NOT lib_${name})
      set(${tgt}_WHY "lib${name} not found (install libtorch-dev)" PARENT_SCOPE)
      return()
    endif()
    list(APPEND libs ${lib_${name}})
  endforeach()
  # Debian's torch reports 1.13.0a0 for its 1.13.1 package: name the package too when it is
  # the torch in use (a venv's wheel reports its own version).
  if(dir MATCHES "^/usr/lib/python3/dist-packages")
    execute_process(COMMAND dpkg-query -W -f=\${Version} python3-torch
      OUTPUT_VARIABLE deb ERROR_QUIET RESULT_VARIABLE deb_rc)
    if(deb_rc EQUAL 0 AND deb MATCHES "^([0-9.]+)")
      set(version "${CMAKE_MATCH_1}")
    endif()
  endif()
  if(NOT TARGET ${tgt})
    add_library(${tgt} INTERFACE)
  endif()
  set_target_properties(${tgt} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ""
    INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "" INTERFACE_COMPILE_DEFINITIONS ""
    INTERFACE_LINK_LIBRARIES "")
  target_include_directories(${tgt} SYSTEM INTERFACE ${inc} ${api_inc})
  # torch is built with the libstdc++ ABI torch._C._GLIBCXX_USE_CXX11_ABI reports (1 for
  # Debian's 1.13 and for PyPI's 2.x wheels, 0 for older pre-cxx11 wheels); std::string
  # crosses the boundary (store keys, error messages), so the module must match it.
  target_compile_definitions(${tgt} INTERFACE _GLIBCXX_USE_CXX11_ABI=${abi})
  # pybind11 shares types between modules only when their internals ids agree, and before
  # pybind11 3 the id carries the compiler's C++ ABI version (__GXX_ABI_VERSION: 1017 for GCC
  # 12, while torch 2.1-2.8 wheels say 1011 or 1018), so torch's own Store and Backend types
  # would not convert. Those torches publish their id's parts (torch._C._PYBIND11_*, which
  # torch.utils.cpp_extension passes the same way); newer ones do not need them.
  if(NOT pybind_abi STREQUAL "-")
    target_compile_definitions(${tgt} INTERFACE "PYBIND11_COMPILER_TYPE=\"${pybind_compiler}\""
      "PYBIND11_STDLIB=\"${pybind_stdlib}\"" "PYBIND11_BUILD_ABI=\"${pybind_abi}\"")
  endif()
  target_link_libraries(${tgt} INTERFACE ${libs})
  # python/CMakeLists.txt puts a wheel's headers before every other include directory (its
  # pybind11 before any other pybind11 on the system).
  set_property(TARGET ${tgt} PROPERTY LOOM_TORCH_WHEEL_INCLUDE "")
  if(wheel)
    set_property(TARGET ${tgt} PROPERTY LOOM_TORCH_WHEEL_INCLUDE ${inc} ${api_inc})
  endif()
  set(${tgt}_VERSION "${version}" PARENT_SCOPE)
  set(${tgt}_ABI "${abi}" PARENT_SCOPE)
endfunction()

# loom_torch_skipped_more(): a skipped ctest python_torch_<VERSION>_test, printing REASON, for
# each VERSION:REASON of LOOM_TORCH_MORE_SKIPPED.
function(loom_torch_skipped_more)
  foreach(entry IN LISTS LOOM_TORCH_MORE_SKIPPED)
    if(NOT entry MATCHES "^([0-9]+\\.[0-9]+(\\.[0-9]+)?):(.*)$")
      message(FATAL_ERROR "loom: LOOM_TORCH_MORE_SKIPPED: '${entry}' is not VERSION:REASON")
    endif()
    loom_add_skipped_test(python_torch_${CMAKE_MATCH_1}_test python
                          "torch ${CMAKE_MATCH_1}: ${CMAKE_MATCH_3}")
  endforeach()
endfunction()

set(LOOM_HAVE_TORCH OFF)
set(LOOM_HAVE_TORCH2 OFF)
if(LOOM_WITH_TORCH STREQUAL "OFF")
  message(STATUS "loom: torch backend OFF (LOOM_WITH_TORCH=OFF)")
  return()
endif()

set(_loom_candidates ${LOOM_PYTHON})
if(NOT LOOM_PYTHON AND SKBUILD AND Python_EXECUTABLE)
  set(_loom_candidates ${Python_EXECUTABLE})
elseif(NOT LOOM_PYTHON)
  find_program(_loom_path_python3 python3)
  set(_loom_candidates /usr/bin/python3 ${_loom_path_python3})
endif()
set(_loom_torch_why "no python3 that imports torch (tried ${_loom_candidates})")
foreach(_py IN LISTS _loom_candidates)
  if(NOT EXISTS "${_py}")
    continue()
  endif()
  loom_torch_probe("${_py}" loom_torch_deps)
  if(loom_torch_deps_WHY STREQUAL "")
    set(LOOM_PYTHON "${_py}" CACHE FILEPATH "Python interpreter for the torch backend" FORCE)
    set(LOOM_TORCH_VERSION "${loom_torch_deps_VERSION}")
    set(_loom_torch_why "")
    break()
  elseif(NOT loom_torch_deps_WHY MATCHES "does not import torch$")
    set(_loom_torch_why "${loom_torch_deps_WHY}")
    break()
  endif()
endforeach()

if(_loom_torch_why STREQUAL "")
  # pybind11_add_module, for this interpreter's Python.
  set(Python_EXECUTABLE "${LOOM_PYTHON}")
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    set(_loom_torch_why "pybind11 not found (install pybind11-dev, or pip install pybind11)")
  endif()
endif()

if(_loom_torch_why STREQUAL "")
  set(LOOM_HAVE_TORCH ON)
  # ... and so must the Loom libraries the module links (they pass std::string and
  # std::function through their interfaces): for a torch of the old ABI the whole build uses
  # it. This runs before the libraries' directories are added, so it reaches all of them.
  # Debian's compiled C++ libraries use the new ABI and cannot be linked from such a build:
  # spdlog and fmt are used header-only instead, and the GoogleTest and Google Benchmark suites
  # are left out (the python tests, ctest's python_torch_test, still run).
  if(loom_torch_deps_ABI STREQUAL "0")
    add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=0)
    find_package(fmt REQUIRED)
    set(LOOM_SPDLOG_TARGETS spdlog::spdlog_header_only fmt::fmt-header-only)
    set(LOOM_OLD_CXX_ABI ON)
    set(LOOM_BUILD_BENCH_SUITES OFF)
    message(STATUS "loom: torch uses the pre-C++11 libstdc++ ABI: building Loom with "
                   "_GLIBCXX_USE_CXX11_ABI=0, spdlog and fmt header-only, without the GoogleTest "
                   "and Google Benchmark suites (Debian builds them with the new ABI); use a "
                   "separate build directory")
  endif()
  message(STATUS "loom: torch backend ON (torch ${LOOM_TORCH_VERSION}, ${LOOM_PYTHON})")
elseif(LOOM_WITH_TORCH STREQUAL "ON")
  message(FATAL_ERROR "loom: LOOM_WITH_TORCH=ON but ${_loom_torch_why}; scripts/setup.sh installs "
                      "python3-torch, libtorch-dev and pybind11-dev")
else()
  message(STATUS "loom: torch backend OFF (${_loom_torch_why})")
endif()

# loom_torch_beside(PYTHON TARGET): probes another interpreter's torch (loom_torch_probe) for a
# module built beside the first one from the same Loom libraries, and sets TARGET_WHY to why it
# cannot be (empty when it can): the same Python version (one pybind11 module build) and the same
# libstdc++ ABI as the Loom libraries.
function(loom_torch_beside py tgt)
  loom_torch_probe("${py}" ${tgt})
  set(why "${${tgt}_WHY}")
  if(NOT why STREQUAL "")
  elseif(NOT ${tgt}_PY_VERSION STREQUAL loom_torch_deps_PY_VERSION)
    string(CONCAT why "${py} is Python ${${tgt}_PY_VERSION}, ${LOOM_PYTHON} "
           "${loom_torch_deps_PY_VERSION}: use a separate build directory with -DLOOM_PYTHON=${py}")
  elseif(NOT ${tgt}_ABI STREQUAL loom_torch_deps_ABI)
    string(CONCAT why "the torch of ${py} uses another libstdc++ ABI (${${tgt}_ABI}) than the "
           "Loom libraries: use a separate build directory with -DLOOM_PYTHON=${py}")
  endif()
  set(${tgt}_WHY "${why}" PARENT_SCOPE)
  set(${tgt}_VERSION "${${tgt}_VERSION}" PARENT_SCOPE)
endfunction()

# The second torch.
set(LOOM_TORCH2_PYTHON "" CACHE FILEPATH
    "A second interpreter whose torch gets its own loom_torch module (build/python-torch2)")
set(LOOM_TORCH2_SKIP_REASON "" CACHE STRING
    "Why there is no second torch (printed by the skipped python_torch2_test)")
set(LOOM_TORCH2_WHY "${LOOM_TORCH2_SKIP_REASON}")
if(LOOM_TORCH2_WHY STREQUAL "")
  string(CONCAT LOOM_TORCH2_WHY "no second torch configured (-DLOOM_TORCH2_PYTHON=<venv "
         "python>; scripts/test.sh installs torch 2.x with scripts/setup_torch.sh)")
endif()
if(LOOM_HAVE_TORCH AND LOOM_TORCH2_PYTHON)
  loom_torch_beside("${LOOM_TORCH2_PYTHON}" loom_torch2_deps)
  if(NOT loom_torch2_deps_WHY STREQUAL "")
    set(LOOM_TORCH2_WHY "${loom_torch2_deps_WHY}")
  else()
    set(LOOM_HAVE_TORCH2 ON)
    set(LOOM_TORCH2_VERSION "${loom_torch2_deps_VERSION}")
    message(STATUS "loom: second torch backend ON (torch ${LOOM_TORCH2_VERSION}, "
                   "${LOOM_TORCH2_PYTHON}, build/python-torch2)")
  endif()
  if(NOT LOOM_HAVE_TORCH2)
    message(WARNING "loom: second torch OFF: ${LOOM_TORCH2_WHY}")
  endif()
endif()

# More torches, each like the second: its module in <build>/python-torch-<version> (target
# loom_torch_more<i>) and its pytest run, the ctest python_torch_<version>_test. scripts/test.sh
# passes the interpreters scripts/setup_torch.sh installed (LOOM_TORCH_MORE_VERSIONS), and as
# LOOM_TORCH_MORE_SKIPPED the versions it could not install, each VERSION:REASON, which become
# skipped tests of the same names that print the reason. An interpreter that cannot serve is a
# configure error: it was asked for by name. Sets LOOM_TORCH_MORE (the indices i) and
# loom_torch_more<i>_deps (with its _VERSION).
set(LOOM_TORCH_MORE_PYTHONS "" CACHE STRING
    "More interpreters (a ;-list) whose torch each gets a loom_torch module (build/python-torch-<version>) and a ctest python_torch_<version>_test")
set(LOOM_TORCH_MORE_SKIPPED "" CACHE STRING
    "Torches asked for and not installed, each VERSION:REASON (a ;-list): skipped python_torch_<VERSION>_test")
set(LOOM_TORCH_MORE "")
if(LOOM_HAVE_TORCH)
  set(_i 0)
  set(_seen "${LOOM_TORCH_VERSION}")
  foreach(_py IN LISTS LOOM_TORCH_MORE_PYTHONS)
    loom_torch_beside("${_py}" loom_torch_more${_i}_deps)
    set(_v "${loom_torch_more${_i}_deps_VERSION}")
    if(NOT loom_torch_more${_i}_deps_WHY STREQUAL "")
      message(FATAL_ERROR "loom: LOOM_TORCH_MORE_PYTHONS: ${loom_torch_more${_i}_deps_WHY}")
    endif()
    if(_v IN_LIST _seen OR (LOOM_HAVE_TORCH2 AND _v STREQUAL LOOM_TORCH2_VERSION))
      message(FATAL_ERROR "loom: LOOM_TORCH_MORE_PYTHONS: torch ${_v} (${_py}) already has a "
                          "module in this build directory")
    endif()
    list(APPEND _seen "${_v}")
    list(APPEND LOOM_TORCH_MORE ${_i})
    message(STATUS "loom: torch backend also for torch ${_v} (${_py}, build/python-torch-${_v})")
    math(EXPR _i "${_i} + 1")
  endforeach()
endif()
