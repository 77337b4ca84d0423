# The `python` install component: what the kjit wheel's kjit/_native folder holds. scikit-build-core
# installs only this component (pyproject.toml). The C API library and the CLIs find the libraries
# bundled beside them through an RPATH of $ORIGIN, written as DT_RPATH (--disable-new-dtags) rather
# than DT_RUNPATH because glibc applies an RPATH to the dependencies of dependencies too: libabsl_x
# finds libabsl_y in the wheel without LD_LIBRARY_PATH.
set(kjit_python_targets kjit_c kjit_cli kjit_tune)
set_target_properties(${kjit_python_targets} PROPERTIES INSTALL_RPATH "$ORIGIN")
foreach(target IN LISTS kjit_python_targets)
  target_link_options(${target} PRIVATE -Wl,--disable-new-dtags)
endforeach()

install(TARGETS ${kjit_python_targets}
  LIBRARY DESTINATION kjit/_native COMPONENT python
  RUNTIME DESTINATION kjit/_native COMPONENT python)
# Only what a GPU machine with a driver and NVRTC lacks; the C and C++ runtimes are the system's.
# Each once, under the name the loader asks for (its soname): install(RUNTIME_DEPENDENCY_SET)
# follows the symlink chain, and a wheel (a zip) holds each link as a second copy of the library.
# scripts/package/build-wheel.sh turns this off and lets `auditwheel repair` bundle them instead
# (into kjit.libs/, each with an RPATH to the others): auditwheel resolves each library's dependencies
# through that library's own RPATH, which the copies made here lack (they find each other through
# the RPATH of the program that loads them), so it would bundle every one a second time.
option(KJIT_BUNDLE_DEPENDENCIES "Copy the shared libraries kjit needs into the wheel" ON)
if(KJIT_BUNDLE_DEPENDENCIES)
install(CODE [[
  file(GET_RUNTIME_DEPENDENCIES
    LIBRARIES "$<TARGET_FILE:kjit_c>"
    EXECUTABLES "$<TARGET_FILE:kjit_cli>" "$<TARGET_FILE:kjit_tune>"
    RESOLVED_DEPENDENCIES_VAR kjit_dependencies
    PRE_INCLUDE_REGEXES "^libabsl_" "^libfmt" "^libxxhash" "^libboost_"
    PRE_EXCLUDE_REGEXES ".*")
  foreach(dependency IN LISTS kjit_dependencies)
    get_filename_component(soname "${dependency}" NAME)
    file(REAL_PATH "${dependency}" library)
    file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/kjit/_native" TYPE FILE FILES "${library}"
      RENAME "${soname}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
      GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  endforeach()
]] COMPONENT python)
endif()
