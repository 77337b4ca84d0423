# `cmake --install`: the library (kjit and the static libraries it is made of, kjit_launch_tuner,
# KJIT_AUTOTUNE's default tuner, included), the C API's shared library (libkjit_c.so), the public
# headers (include/kjit only, included as <kjit/kjit.h> and <kjit/kjit_c.h>; no internal header is
# installed), the `kjit` and `kjit-tune` CLIs, a CMake package (find_package(kjit) gives kjit::kjit
# and kjit::kjit_c) and pkg-config files (kjit for the C++ library, kjit_c for the C API). What
# only the tuner needs (kjit_tuning: the registry, trials, fp64 references) is not installed.
include(CMakePackageConfigHelpers)

install(TARGETS kjit kjit_launch_tuner kjit_runtime kjit_jit kjit_c EXPORT kjitTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kjit_cli kjit_tune RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kjit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(kjit_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kjit)
install(EXPORT kjitTargets NAMESPACE kjit:: DESTINATION ${kjit_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kjitConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kjitConfig.cmake INSTALL_DESTINATION ${kjit_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kjitConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kjitConfig.cmake ${CMAKE_BINARY_DIR}/kjitConfigVersion.cmake
  DESTINATION ${kjit_cmake_dir})

# Relative to the .pc file, so that `cmake --install --prefix` anywhere gives a working file.
file(RELATIVE_PATH KJIT_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
foreach(pc kjit kjit_c)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
