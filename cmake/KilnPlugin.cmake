# kiln_add_plugin(NAME <name> SOURCES <src>... [LINK <lib>...] [OUTPUT_DIRECTORY <dir>])
#
# Builds a kiln backend plugin as a MODULE library named libkiln_<name>.so. Every symbol is
# hidden except the one entry point, kiln_plugin_init, which a linker version script exports.
# Plugins link the plugin API (a header-only C contract) and their own toolchain, never LibTorch.
# This file is installed with the SDK, so third-party backends use the same function.
include_guard(GLOBAL)

if(PROJECT_NAME STREQUAL "kiln" AND NOT DEFINED KILN_SOURCE_DIR)
  set(KILN_SOURCE_DIR ${PROJECT_SOURCE_DIR})
endif()

function(kiln_add_plugin)
  cmake_parse_arguments(KP "" "NAME;OUTPUT_DIRECTORY" "SOURCES;LINK" ${ARGN})
  if(NOT KP_NAME)
    message(FATAL_ERROR "kiln_add_plugin: NAME is required")
  endif()
  if(NOT KP_SOURCES)
    message(FATAL_ERROR "kiln_add_plugin(${KP_NAME}): SOURCES is required")
  endif()
  set(target kiln_${KP_NAME})
  add_library(${target} MODULE ${KP_SOURCES})
  set(vscript ${CMAKE_CURRENT_BINARY_DIR}/${target}.map)
  file(WRITE ${vscript} "{\n  global: kiln_plugin_init;\n  local: *;\n};\n")
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS ${vscript})
  if(KP_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${KP_OUTPUT_DIRECTORY})
  elseif(DEFINED KILN_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${KILN_PLUGIN_OUTPUT_DIR})
  endif()
  target_link_options(${target} PRIVATE "LINKER:--version-script=${vscript}" "LINKER:--no-undefined")
  if(TARGET kiln::plugin_api)
    target_link_libraries(${target} PRIVATE kiln::plugin_api)
  else()
    message(FATAL_ERROR "kiln_add_plugin(${KP_NAME}): target kiln::plugin_api not found; "
                        "use find_package(kiln) or build inside the kiln tree")
  endif()
  if(KP_LINK)
    target_link_libraries(${target} PRIVATE ${KP_LINK})
  endif()
  # The in-tree backends (plugins/<name>/) are installed with the kiln tool; see KilnInstall.cmake.
  if(DEFINED KILN_SOURCE_DIR AND CMAKE_CURRENT_SOURCE_DIR MATCHES "^${KILN_SOURCE_DIR}/plugins/")
    set_property(GLOBAL APPEND PROPERTY KILN_IN_TREE_PLUGINS ${target})
  endif()
endfunction()
