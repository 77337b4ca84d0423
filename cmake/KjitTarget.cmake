# What every target built from this project compiles with, scoped to the target: its warnings, and
# the source root on the include path for internal headers ("jit/...", "ops/..."). Internal headers
# are never on an installed target's include path; the public ones are include/kjit, reached as
# <kjit/...> through kjit_jit's public include directory.
function(kjit_target_defaults target)
  # Designated initializers that leave fields to their defaults are the API's intended use.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-missing-field-initializers)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
endfunction()
