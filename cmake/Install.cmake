# `cmake --install`: the library (kjit and the static libraries it is made of), the public headers
# under include/kjit (included as "runtime/kjit.h"), the `kjit` and `kjit-tune` CLIs, a CMake
# package (find_package(kjit) gives kjit::kjit) and a pkg-config file (kjit.pc).
include(CMakePackageConfigHelpers)

install(TARGETS kjit kjit_autotune kjit_jit EXPORT kjitTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kjit_cli kjit_tune RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
foreach(dir jit autotune runtime)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${dir}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kjit/${dir}
    FILES_MATCHING PATTERN "*.h")
endforeach()
# The kernel parameter structs the host headers share with the device templates.
install(FILES ${CMAKE_SOURCE_DIR}/templates/cross_entropy_params.h
              ${CMAKE_SOURCE_DIR}/templates/rms_norm_params.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kjit/templates)

set(kjit_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kjit)
install(EXPORT kjitTargets NAMESPACE kjit:: DESTINATION ${kjit_cmake_dir})
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kjitConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kjitConfig.cmake INSTALL_DESTINATION ${kjit_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kjitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kjitConfig.cmake ${CMAKE_BINARY_DIR}/kjitConfigVersion.cmake
  DESTINATION ${kjit_cmake_dir})

# Relative to the .pc file, so that `cmake --install --prefix` anywhere gives a working file.
file(RELATIVE_PATH KJIT_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
configure_file(${CMAKE_SOURCE_DIR}/cmake/kjit.pc.in ${CMAKE_BINARY_DIR}/kjit.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/kjit.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
