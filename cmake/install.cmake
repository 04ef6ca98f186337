# cmake --install: libferry (shared with a soname, and static), the public headers,
# the daemons, ferry.pc and the CMake package (find_package(ferry) gives ferry::ferry
# and ferry::ferry_static, and ferry::ferry-cuda in a CUDA build).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(FERRY_NATIVE AND NOT FERRY_SANITIZE)
  message(STATUS "libferry is tuned for this CPU (-march=native); configure with "
                 "-DFERRY_NATIVE=OFF to install a library for other machines")
endif()
set(_ferry_targets ferry ferry_static)
if(TARGET ferry_cuda)
  list(APPEND _ferry_targets ferry_cuda)
endif()
install(TARGETS ${_ferry_targets} EXPORT ferryTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ferry-ps ferry-trainer ferry-ctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ferry DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")

set(_cmakedir ${CMAKE_INSTALL_LIBDIR}/cmake/ferry)
install(EXPORT ferryTargets NAMESPACE ferry:: DESTINATION ${_cmakedir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ferryConfig.cmake.in
  ${PROJECT_BINARY_DIR}/ferryConfig.cmake INSTALL_DESTINATION ${_cmakedir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ferryConfig.cmake ${PROJECT_BINARY_DIR}/ferryConfigVersion.cmake
  DESTINATION ${_cmakedir})

# ferry.pc names its prefix relative to its own directory, so `cmake --install --prefix`
# anywhere (and a moved tree) still works.
file(RELATIVE_PATH FERRY_PC_TO_PREFIX /root/${CMAKE_INSTALL_LIBDIR}/pkgconfig /root)
configure_file(${PROJECT_SOURCE_DIR}/cmake/ferry.pc.in ${PROJECT_BINARY_DIR}/ferry.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/ferry.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
