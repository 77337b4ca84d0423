# Embeds the device templates into the library as string constants, so an installed kjit needs no
# source tree. A generated .cc defines kjit::jit::EmbeddedTemplates(); it is rebuilt when any .cuh
# changes.
function(kjit_embed_templates target)
  set(out ${CMAKE_BINARY_DIR}/generated/embedded_templates.cc)
  string(REPLACE ";" "|" files "${ARGN}")  # a list would split the command line
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} "-DFILES=${files}"
            -P ${CMAKE_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    DEPENDS ${ARGN} ${CMAKE_SOURCE_DIR}/cmake/EmbedTemplatesScript.cmake
    COMMENT "Embedding kernel templates"
    VERBATIM)
  add_library(${target} OBJECT ${out})
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR})
endfunction()
