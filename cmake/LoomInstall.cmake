# Install + export so that an outside project can find_package(loom) and link loom::loom.
include(CMakePackageConfigHelpers)
set(LOOM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/loom)
install(EXPORT loomTargets NAMESPACE loom:: DESTINATION ${LOOM_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/loomConfig.cmake.in
  ${PROJECT_BINARY_DIR}/loomConfig.cmake INSTALL_DESTINATION ${LOOM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/loomConfig.cmake ${PROJECT_BINARY_DIR}/loomConfigVersion.cmake
  DESTINATION ${LOOM_CMAKE_DIR})
