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

install(TARGETS ${kjit_python_targets} RUNTIME_DEPENDENCY_SET kjit_python_dependencies
  LIBRARY DESTINATION kjit/_native COMPONENT python
  RUNTIME DESTINATION kjit/_native COMPONENT python)
# Only what a GPU machine with a driver and NVRTC lacks; the C and C++ runtimes are the system's.
install(RUNTIME_DEPENDENCY_SET kjit_python_dependencies
  PRE_INCLUDE_REGEXES "^libabsl_" "^libfmt" "^libxxhash" "^libboost_"
  PRE_EXCLUDE_REGEXES ".*"
  LIBRARY DESTINATION kjit/_native COMPONENT python)
