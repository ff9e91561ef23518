# Resolves the optional PyTorch backend (python/): the torch that LOOM_PYTHON imports, either
# Debian's (python3-torch and libtorch-dev: headers in /usr/include) or a wheel from PyPI in a
# virtual environment (headers, libraries and pybind11 inside its torch/ directory), plus
# pybind11-dev for pybind11_add_module. Sets LOOM_HAVE_TORCH, LOOM_PYTHON (the interpreter that
# imports torch), LOOM_TORCH_VERSION and the imported target loom_torch_deps.
#
# The interpreter is LOOM_PYTHON when given (a venv's bin/python works: -DLOOM_PYTHON=
# /work/venv-t215/bin/python builds against its torch 2.x), else the first of /usr/bin/python3
# (Debian's, which python3-torch installs into) and the python3 on PATH that imports torch.
# Switching LOOM_PYTHON in an existing build directory re-resolves everything below.
set(LOOM_HAVE_TORCH OFF)
if(LOOM_WITH_TORCH STREQUAL "OFF")
  message(STATUS "loom: torch backend OFF (LOOM_WITH_TORCH=OFF)")
  return()
endif()

set(_loom_torch_why "")
set(_loom_candidates ${LOOM_PYTHON})
if(NOT LOOM_PYTHON)
  find_program(_loom_path_python3 python3)
  set(_loom_candidates /usr/bin/python3 ${_loom_path_python3})
endif()
foreach(_py IN LISTS _loom_candidates)
  if(NOT EXISTS "${_py}")
    continue()
  endif()
  execute_process(
    COMMAND "${_py}" -c "import os, torch; print(torch.__version__.split('+')[0], int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.distributed.is_available(), os.path.dirname(torch.__file__), sep=';')"
    OUTPUT_VARIABLE _loom_torch_out ERROR_QUIET RESULT_VARIABLE _loom_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_loom_torch_rc EQUAL 0)
    set(LOOM_PYTHON "${_py}" CACHE FILEPATH "Python interpreter for the torch backend" FORCE)
    break()
  endif()
endforeach()

if(NOT _loom_torch_rc EQUAL 0)
  set(_loom_torch_why "no python3 that imports torch (tried ${_loom_candidates})")
else()
  list(GET _loom_torch_out 0 LOOM_TORCH_VERSION)
  list(GET _loom_torch_out 1 _loom_torch_abi)
  list(GET _loom_torch_out 2 _loom_torch_dist)
  if(NOT _loom_torch_dist STREQUAL "True")
    set(_loom_torch_why "torch ${LOOM_TORCH_VERSION} was built without torch.distributed")
  endif()
  list(GET _loom_torch_out 3 _loom_torch_dir)
  # A wheel carries its headers and libraries in torch/include and torch/lib (and its own
  # pybind11, which must be the one the module is compiled with: pybind11 shares types between
  # modules only within one ABI version); Debian's torch has them in the system's paths.
  # NO_CACHE: the answer follows LOOM_PYTHON, also when it changes in an existing build tree.
  if(EXISTS "${_loom_torch_dir}/include/torch/csrc/distributed/c10d/ProcessGroup.hpp")
    set(_loom_torch_hints HINTS "${_loom_torch_dir}/include" NO_DEFAULT_PATH)
    set(_loom_torch_lib_hints HINTS "${_loom_torch_dir}/lib" NO_DEFAULT_PATH)
  else()
    set(_loom_torch_hints "")
    set(_loom_torch_lib_hints "")
  endif()
  unset(LOOM_TORCH_INCLUDE_DIR CACHE)
  unset(LOOM_TORCH_API_INCLUDE_DIR CACHE)
  find_path(LOOM_TORCH_INCLUDE_DIR torch/csrc/distributed/c10d/ProcessGroup.hpp
            ${_loom_torch_hints} NO_CACHE)
  find_path(LOOM_TORCH_API_INCLUDE_DIR torch/all.h PATHS ${LOOM_TORCH_INCLUDE_DIR}/torch/csrc/api/include
            NO_DEFAULT_PATH NO_CACHE)
  foreach(_lib torch torch_cpu c10 torch_python)
    unset(LOOM_TORCH_LIB_${_lib} CACHE)
    find_library(LOOM_TORCH_LIB_${_lib} ${_lib} ${_loom_torch_lib_hints} NO_CACHE)
    if(NOT LOOM_TORCH_LIB_${_lib})
      set(_loom_torch_why "lib${_lib} not found (install libtorch-dev)")
    endif()
  endforeach()
  if(NOT LOOM_TORCH_INCLUDE_DIR OR NOT LOOM_TORCH_API_INCLUDE_DIR)
    set(_loom_torch_why "torch headers not found (install libtorch-dev)")
  endif()
  set(Python_EXECUTABLE "${LOOM_PYTHON}")
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    set(_loom_torch_why "pybind11 not found (install pybind11-dev)")
  endif()
endif()

if(_loom_torch_why STREQUAL "")
  set(LOOM_HAVE_TORCH ON)
  if(NOT TARGET loom_torch_deps)
    add_library(loom_torch_deps INTERFACE)
    target_include_directories(loom_torch_deps SYSTEM INTERFACE
      ${LOOM_TORCH_INCLUDE_DIR} ${LOOM_TORCH_API_INCLUDE_DIR})
    # torch is built with the libstdc++ ABI torch._C._GLIBCXX_USE_CXX11_ABI reports (1 for
    # Debian's 1.13 and for PyPI's 2.x wheels, 0 for older pre-cxx11 wheels); std::string
    # crosses the boundary (store keys, error messages), so the module must match it.
    target_compile_definitions(loom_torch_deps INTERFACE _GLIBCXX_USE_CXX11_ABI=${_loom_torch_abi})
    target_link_libraries(loom_torch_deps INTERFACE
      ${LOOM_TORCH_LIB_torch} ${LOOM_TORCH_LIB_torch_cpu} ${LOOM_TORCH_LIB_c10}
      ${LOOM_TORCH_LIB_torch_python})
  endif()
  # ... and so must the Loom libraries the module links (they pass std::string and
  # std::function through their interfaces): for a torch of the old ABI the whole build uses
  # it. This runs before the libraries' directories are added, so it reaches all of them.
  if(_loom_torch_abi STREQUAL "0")
    add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=0)
    message(STATUS "loom: torch uses the pre-C++11 libstdc++ ABI: building Loom with "
                   "_GLIBCXX_USE_CXX11_ABI=0 (use a separate build directory)")
  endif()
  # Debian's torch reports 1.13.0a0 for its 1.13.1 package: name the package too when it is
  # the torch in use (a venv's wheel reports its own version).
  if(_loom_torch_dir MATCHES "^/usr/lib/python3/dist-packages")
    execute_process(COMMAND dpkg-query -W -f=\${Version} python3-torch
      OUTPUT_VARIABLE _loom_torch_deb ERROR_QUIET RESULT_VARIABLE _loom_deb_rc)
    if(_loom_deb_rc EQUAL 0 AND _loom_torch_deb MATCHES "^([0-9.]+)")
      set(LOOM_TORCH_VERSION "${CMAKE_MATCH_1}")
    endif()
  endif()
  message(STATUS "loom: torch backend ON (torch ${LOOM_TORCH_VERSION}, ${LOOM_PYTHON})")
elseif(LOOM_WITH_TORCH STREQUAL "ON")
  message(FATAL_ERROR "loom: LOOM_WITH_TORCH=ON but ${_loom_torch_why}; scripts/setup.sh installs "
                      "python3-torch, libtorch-dev and pybind11-dev")
else()
  message(STATUS "loom: torch backend OFF (${_loom_torch_why})")
endif()
