# `cmake --install` into a fresh prefix, then an out-of-tree consumer built against it twice: with
# find_package(kjit) and with pkg-config. Both must build and run, and so must the C API's consumer
# (find_package with kjit::kjit_c, and pkg-config kjit_c). Invoked by ctest:
#   cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DWORK_DIR=... -DCXX=... -DCXX_FLAGS=... -P install_test.cmake
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
set(ENV{KJIT_CACHE_DIR} ${WORK_DIR}/cache)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok ${out}")
endfunction()

run("install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
foreach(f bin/kjit bin/kjit-tune include/kjit/kjit.h include/kjit/kjit_c.h lib/libkjit_c.so
          lib/cmake/kjit/kjitConfig.cmake lib/pkgconfig/kjit.pc lib/pkgconfig/kjit_c.pc)
  file(GLOB found ${prefix}/${f} ${prefix}/*/${f} ${prefix}/lib/*/${f})
  if(NOT EXISTS ${prefix}/${f} AND NOT found)
    message(FATAL_ERROR "install: ${f} is missing under ${prefix}")
  endif()
endforeach()

# The installed include tree is exactly the public headers: nothing internal is reachable.
file(GLOB_RECURSE installed RELATIVE ${prefix}/include ${prefix}/include/*)
file(GLOB_RECURSE public RELATIVE ${SOURCE_DIR}/include ${SOURCE_DIR}/include/*)
list(SORT installed)
list(SORT public)
if(NOT installed STREQUAL public)
  message(FATAL_ERROR "install: the include tree holds ${installed}, expected only ${public}")
endif()
foreach(h IN LISTS installed)
  file(STRINGS ${prefix}/include/${h} bad REGEX "#include [<\"](jit|runtime|ops|autotune|templates|cuda|nvrtc)")
  if(bad)
    message(FATAL_ERROR "install: ${h} includes an internal or CUDA header: ${bad}")
  endif()
  # kjit's own helpers (jit/status_helpers.h, ops/common/tuning/random_values.h) are not for users.
  file(STRINGS ${prefix}/include/${h} internal REGEX "ToStd|ToAbsl|Annotate|KJIT_CONCAT|RandomValues")
  if(internal)
    message(FATAL_ERROR "install: ${h} holds an internal helper: ${internal}")
  endif()
endforeach()

run("configure consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer
    -B ${WORK_DIR}/consumer -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run("run consumer (find_package)" ${WORK_DIR}/consumer/consumer)
run("run the C API's consumer (find_package)" ${WORK_DIR}/consumer/c_api)

file(GLOB_RECURSE pc ${prefix}/kjit.pc)
get_filename_component(pc_dir "${pc}" DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pc_dir})
execute_process(COMMAND pkg-config --cflags --libs kjit RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kjit failed:\n${err}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
separate_arguments(cxx_flags UNIX_COMMAND "${CXX_FLAGS}")
run("build consumer (pkg-config)" ${CXX} ${cxx_flags} ${SOURCE_DIR}/tests/package/consumer/main.cc
    -o ${WORK_DIR}/consumer_pc ${flags})
run("run consumer (pkg-config)" ${WORK_DIR}/consumer_pc)

# The C API by pkg-config: a shared library, found at run time through the rpath given here.
execute_process(COMMAND pkg-config --cflags --libs kjit_c RESULT_VARIABLE rc OUTPUT_VARIABLE flags
                ERROR_VARIABLE err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config --cflags --libs kjit_c failed:\n${err}")
endif()
execute_process(COMMAND pkg-config --variable=libdir kjit_c OUTPUT_VARIABLE c_libdir
                OUTPUT_STRIP_TRAILING_WHITESPACE)
separate_arguments(flags UNIX_COMMAND "${flags}")
run("build the C API's consumer (pkg-config)" ${CXX} ${cxx_flags}
    ${SOURCE_DIR}/tests/package/consumer/c_api.cc -o ${WORK_DIR}/c_api_pc ${flags}
    -Wl,-rpath,${c_libdir})
run("run the C API's consumer (pkg-config)" ${WORK_DIR}/c_api_pc)
