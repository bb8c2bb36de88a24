# Installs kiln in two components:
#   sdk   the plugin API headers and the CMake package `kiln` (target kiln::plugin_api and the
#         kiln_add_plugin function), everything a third party needs to build a backend;
#   tool  the `kiln` command, libkiln with its public headers and target kiln::kiln, and the
#         in-tree backends in <prefix>/lib/kiln/plugins, where the loader looks relative to the
#         executable and to libkiln.
# `cmake --install build --prefix P` installs both; `--component sdk` only the SDK.
# The build tree is a package too (find_package(kiln) with kiln_DIR=<build>): see the end.
include(CMakePackageConfigHelpers)

set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
# Fixed, not CMAKE_INSTALL_LIBDIR: the loader finds it as <dir of bin/kiln>/../lib/kiln/plugins.
set(KILN_INSTALL_PLUGINDIR lib/kiln/plugins)

# ---- sdk ----
install(FILES
  ${PROJECT_SOURCE_DIR}/plugin_api/include/kiln/plugin_api.h
  ${PROJECT_SOURCE_DIR}/plugin_api/include/kiln/plugin_api.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln COMPONENT sdk)
set_target_properties(kiln_plugin_api PROPERTIES EXPORT_NAME plugin_api)
install(TARGETS kiln_plugin_api EXPORT kilnTargets COMPONENT sdk)
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR} COMPONENT sdk)
# The ABI version comes from the header's macros, so the package cannot say another one.
file(STRINGS ${PROJECT_SOURCE_DIR}/plugin_api/include/kiln/plugin_api.h _kiln_abi_lines
  REGEX "^#define KILN_ABI_VERSION_(MAJOR|MINOR) [0-9]+$")
foreach(_line ${_kiln_abi_lines})
  if(_line MATCHES "^#define KILN_ABI_VERSION_(MAJOR|MINOR) ([0-9]+)$")
    set(KILN_PLUGIN_ABI_VERSION_${CMAKE_MATCH_1} ${CMAKE_MATCH_2})
  endif()
endforeach()
if(NOT DEFINED KILN_PLUGIN_ABI_VERSION_MAJOR OR NOT DEFINED KILN_PLUGIN_ABI_VERSION_MINOR)
  message(FATAL_ERROR "cannot read KILN_ABI_VERSION_MAJOR/MINOR from plugin_api/include/kiln/plugin_api.h")
endif()
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/plugin_api/include/kiln/plugin_api.h)
# The LibTorch kiln::kiln needs when the user's project names none: the one kiln was built with.
set(KILN_TORCH_DIR ${Torch_DIR})
# One file for both the install and the build tree: it finds its targets next to itself.
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/kilnConfig.cmake
  ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
  ${PROJECT_SOURCE_DIR}/cmake/KilnPlugin.cmake
  DESTINATION ${KILN_INSTALL_CMAKEDIR} COMPONENT sdk)

# ---- tool ----
# The installed tool finds libkiln next to it and LibTorch where it was linked from.
set_target_properties(kiln_cli kiln PROPERTIES
  INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}"
  INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS kiln_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tool)
install(TARGETS kiln EXPORT kilnLibraryTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT tool)
install(EXPORT kilnLibraryTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR} COMPONENT tool)
# What a program using kiln includes; never core/src/include (kiln/internal/), never
# kiln/workloads.h (kiln_workloads is the tool's and the tests', not installed).
set(KILN_PUBLIC_HEADERS compile.h config.h data.h distributed.h group_outcome.h ir.h kiln.h log.h memory.h precision.h
  trainer.h)
list(TRANSFORM KILN_PUBLIC_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/core/include/kiln/)
install(FILES ${KILN_PUBLIC_HEADERS} ${PROJECT_BINARY_DIR}/core/include/kiln/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln COMPONENT tool)
# The conformance suite `kiln conformance` runs (tests/conformance), when the tests are built.
if(TARGET kiln_conformance)
  install(TARGETS kiln_conformance RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tool)
endif()
get_property(_kiln_in_tree_plugins GLOBAL PROPERTY KILN_IN_TREE_PLUGINS)
if(_kiln_in_tree_plugins)
  install(TARGETS ${_kiln_in_tree_plugins} LIBRARY DESTINATION ${KILN_INSTALL_PLUGINDIR} COMPONENT tool)
endif()

# ---- the build tree as a package ----
# find_package(kiln) with kiln_DIR=<build>: the same kilnConfig.cmake, kiln::plugin_api exported
# from the tree, KilnPlugin.cmake copied next to it, and kiln::kiln written by hand
# (kilnLibraryTargets-build.cmake.in says why).
export(EXPORT kilnTargets NAMESPACE kiln:: FILE ${PROJECT_BINARY_DIR}/kilnTargets.cmake)
configure_file(${PROJECT_SOURCE_DIR}/cmake/KilnPlugin.cmake ${PROJECT_BINARY_DIR}/KilnPlugin.cmake COPYONLY)
set(KILN_BUILD_LIBRARY_SONAME ${CMAKE_SHARED_LIBRARY_PREFIX}kiln${CMAKE_SHARED_LIBRARY_SUFFIX})
set(KILN_BUILD_LIBRARY ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/${KILN_BUILD_LIBRARY_SONAME})
configure_file(${PROJECT_SOURCE_DIR}/cmake/kilnLibraryTargets-build.cmake.in
  ${PROJECT_BINARY_DIR}/kilnLibraryTargets.cmake @ONLY)
