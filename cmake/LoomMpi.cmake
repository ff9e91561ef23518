# Resolves the optional MPI backend (process_group/src/mpi): Debian's Open MPI (openmpi-bin,
# libopenmpi-dev). LOOM_WITH_MPI: AUTO (on when found), ON (missing is a configure error), OFF.
# Sets LOOM_HAVE_MPI and, when on, the imported target MPI::MPI_CXX (C bindings only are used)
# and MPIEXEC_EXECUTABLE for the tests that run under mpirun.
set(LOOM_WITH_MPI AUTO CACHE STRING "MPI backend (Open MPI): AUTO (on when found), ON, OFF")
set_property(CACHE LOOM_WITH_MPI PROPERTY STRINGS AUTO ON OFF)
if(NOT LOOM_WITH_MPI MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "LOOM_WITH_MPI must be AUTO, ON or OFF, got '${LOOM_WITH_MPI}'")
endif()

set(LOOM_HAVE_MPI OFF)
if(NOT LOOM_WITH_MPI STREQUAL "OFF")
  # Loom calls MPI's C API only; skip the deprecated C++ bindings.
  set(MPI_CXX_SKIP_MPICXX ON)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND AND MPIEXEC_EXECUTABLE)
    set(LOOM_HAVE_MPI ON)
    message(STATUS "loom: MPI backend ON (MPI ${MPI_CXX_VERSION}, ${MPI_CXX_LIB_NAMES}, "
                   "${MPIEXEC_EXECUTABLE})")
  elseif(LOOM_WITH_MPI STREQUAL "ON")
    message(FATAL_ERROR "loom: LOOM_WITH_MPI=ON but MPI was not found (MPI for C++: "
                        "${MPI_CXX_FOUND}, mpiexec: ${MPIEXEC_EXECUTABLE}); install openmpi-bin "
                        "and libopenmpi-dev")
  else()
    message(STATUS "loom: MPI backend OFF (MPI not found; install openmpi-bin and libopenmpi-dev)")
  endif()
else()
  message(STATUS "loom: MPI backend OFF (LOOM_WITH_MPI=OFF)")
endif()
